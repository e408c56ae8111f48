"""A watched file (endpoints, peers): what one stat says, and when a new version is applied."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from epp.datalayer.watch import FileStamp, WatchedFile
from epp.errors import ConfigError


class Counting(WatchedFile[str]):
    """Counts the reads the polls make (each one a thread's work)."""

    reads = 0

    def _read_text(self) -> str:
        self.reads += 1
        return super()._read_text()


def _load(text: str) -> str:
    if "bad" in text:
        raise ConfigError(f"field 'x': bad value {text.strip()!r}")
    return text.strip()


def watched(path: Path) -> tuple[Counting, list[str]]:
    applied: list[str] = []
    w = Counting(str(path), _load, applied.append, what="test file")
    w.load_now()
    return w, applied


def test_the_stamp_tells_a_settled_file_from_a_changed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("epp.datalayer.watch.RECENT", 0.0)  # only the stat's own fields count
    path = tmp_path / "f"
    path.write_text("a\n")
    stamp = FileStamp(str(path))
    assert stamp.changed() is True  # the first look
    assert stamp.changed() is False
    os.replace(tmp_path / "f", tmp_path / "g")
    assert stamp.changed() is None  # nothing to stat
    (tmp_path / "g").rename(path)
    assert stamp.changed() is True  # the same file back, but a rename moves its ctime
    assert stamp.changed() is False


async def test_a_same_size_copy_with_the_old_mtime_is_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cp -p`` of a same-size file puts the mtime back; the ctime it cannot, and it is read."""
    monkeypatch.setattr("epp.datalayer.watch.RECENT", 0.0)
    path = tmp_path / "endpoints"
    path.write_text("one\n")
    w, applied = watched(path)
    assert not await w.check() and w.reads == 1  # settled: one stat, no read
    before = path.stat()
    path.write_text("two\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    while path.stat().st_ctime_ns == before.st_ctime_ns:  # the same coarse tick: touch again
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns, path.stat().st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )  # what the stamp used to compare, all as they were
    assert await w.check()
    assert applied == ["one", "two"] and w.reloads == 1


async def test_a_recent_change_is_read_at_every_poll_and_applied_once(tmp_path: Path) -> None:
    """A write in the same tick as the poll's stat changes nothing the stat shows: a file changed
    within ``RECENT`` is read at each poll, and applied only when its content is new."""
    path = tmp_path / "peers"
    path.write_text("a\n")
    w, applied = watched(path)
    for n in range(2, 5):
        assert not await w.check()
        assert w.reads == n  # read: it changed just now
    assert applied == ["a"] and w.reloads == 0


async def test_a_touch_rereads_without_reapplying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("epp.datalayer.watch.RECENT", 0.0)
    path = tmp_path / "peers"
    path.write_text("a\n")
    w, applied = watched(path)
    os.utime(path, ns=(1, 1))
    assert not await w.check()
    assert w.reads == 2 and applied == ["a"] and w.reloads == 0


async def test_a_bad_version_is_reported_once_and_the_next_good_one_applied(tmp_path: Path) -> None:
    path = tmp_path / "endpoints"
    path.write_text("good\n")
    w, applied = watched(path)
    path.write_text("bad\n")
    for _ in range(3):  # recent: read at every poll, the same bad content
        assert not await w.check()
    assert w.failures == 1 and applied == ["good"]
    path.write_text("better\n")
    assert await w.check()
    assert applied == ["good", "better"]


async def test_a_missing_file_keeps_the_last_version_silently(tmp_path: Path) -> None:
    path = tmp_path / "endpoints"
    path.write_text("good\n")
    w, applied = watched(path)
    path.unlink()
    assert not await w.check()
    assert w.failures == 0 and applied == ["good"]
