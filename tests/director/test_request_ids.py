"""Generated request ids: the ``uuid`` module's version-4 strings, one random read per block."""

from __future__ import annotations

import os
import uuid

from epp.director.request_ids import BLOCK, RequestIds


class Source:
    """``os.urandom`` with a record of each read."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []

    def __call__(self, n: int) -> bytes:
        data = os.urandom(n)
        self.reads.append(data)
        return data


def test_ids_are_what_uuid_makes_of_the_same_bytes() -> None:
    source = Source()
    ids = RequestIds(source)
    made = [ids.new() for _ in range(BLOCK)]
    (block,) = source.reads
    for i, rid in enumerate(made):
        expected = uuid.UUID(bytes=block[16 * i : 16 * i + 16], version=4)
        assert rid == str(expected)
        parsed = uuid.UUID(rid)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_one_read_serves_a_block_then_the_next_read_comes() -> None:
    source = Source()
    ids = RequestIds(source)
    for _ in range(BLOCK):
        ids.new()
    assert len(source.reads) == 1 and len(source.reads[0]) == 16 * BLOCK
    ids.new()
    assert len(source.reads) == 2


def test_ids_do_not_repeat() -> None:
    ids = RequestIds()
    made = [ids.new() for _ in range(10 * BLOCK + 3)]
    assert len(set(made)) == len(made)


def test_a_forked_child_reads_a_fresh_block() -> None:
    """The parent's unread ids are not the child's: it would hand out the same ones."""
    source = Source()
    ids = RequestIds(source)
    ids.new()  # a block is read; BLOCK - 1 ids remain unread in it
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(w, f"{ids.new()} {len(source.reads)}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child_id, child_reads = f.read().split()
    os.waitpid(pid, 0)
    assert child_reads == "2"  # it read a block of its own
    assert child_id != ids.new()  # the id the parent hands out next
