"""The config watcher sees content changes however they are written: in place, by rename, by a
ConfigMap's ``..data`` symlink swap; it debounces, survives a missing file, and re-reads on demand."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from epp.app.watcher import ConfigWatcher, digest
from epp.testing import waiting


class Seen:
    def __init__(self) -> None:
        self.calls: list[tuple[bytes, str, str]] = []

    async def __call__(self, data: bytes, content_digest: str, trigger: str) -> None:
        self.calls.append((data, content_digest, trigger))


def watcher_for(path: Path, seen: Seen, interval: float = 0.0) -> ConfigWatcher:
    w = ConfigWatcher(str(path), seen, interval=interval)
    w.seen(digest(path.read_bytes()))
    return w


async def settle(w: ConfigWatcher) -> bool:
    """Two polls: the first sees a new version, the second hands it over."""
    first = await w.check()
    return not first and await w.check()


async def test_an_unchanged_file_is_not_reported(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    seen = Seen()
    w = watcher_for(path, seen)
    os.utime(path, (1, 1))  # a touch changes the mtime, not the content
    assert not await w.check()
    assert not await w.check()
    assert seen.calls == []


async def test_a_change_is_handed_over_once_it_was_seen_twice(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    seen = Seen()
    w = watcher_for(path, seen)
    path.write_text("a: 2\n")
    assert not await w.check()  # debounce
    assert seen.calls == []
    assert await w.check()
    assert seen.calls == [(b"a: 2\n", digest(b"a: 2\n"), "file")]
    assert not await w.check()  # reported once


async def test_a_version_replaced_before_it_settles_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    seen = Seen()
    w = watcher_for(path, seen)
    path.write_text("a: 2\n")
    assert not await w.check()
    path.write_text("a: 3\n")
    assert not await w.check()  # a different new version: the debounce starts over
    assert await w.check()
    assert [c[0] for c in seen.calls] == [b"a: 3\n"]


async def test_an_editor_writing_by_rename_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    st = path.stat()
    seen = Seen()
    w = watcher_for(path, seen)
    tmp = tmp_path / ".c.yaml.swp"
    tmp.write_text("a: 9\n")
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime and size: only the content differs
    os.replace(tmp, path)
    assert await settle(w)
    assert seen.calls[0][0] == b"a: 9\n"


async def test_a_configmap_symlink_swap_is_seen(tmp_path: Path) -> None:
    """Kubelet's layout: config.yaml -> ..data/config.yaml, ..data -> ..2026_v1; an update
    writes a new timestamped directory and renames a new ``..data`` link over the old one."""
    v1, v2 = tmp_path / "..2026_v1", tmp_path / "..2026_v2"
    v1.mkdir()
    (v1 / "config.yaml").write_text("a: 1\n")
    (tmp_path / "..data").symlink_to(v1.name)
    path = tmp_path / "config.yaml"
    path.symlink_to("..data/config.yaml")
    seen = Seen()
    w = watcher_for(path, seen)

    v2.mkdir()
    (v2 / "config.yaml").write_text("a: 2\n")
    (tmp_path / "..data_tmp").symlink_to(v2.name)
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert await settle(w)
    assert seen.calls[0][0] == b"a: 2\n"


async def test_a_missing_file_is_no_change(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    seen = Seen()
    w = watcher_for(path, seen)
    path.unlink()
    assert not await w.check()
    assert not await w.check()
    path.write_text("a: 1\n")  # back as it was
    assert not await w.check()
    assert seen.calls == []


async def test_a_forced_check_hands_over_even_unchanged_content(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    seen = Seen()
    w = watcher_for(path, seen)
    assert await w.check(force=True)
    assert seen.calls == [(b"a: 1\n", digest(b"a: 1\n"), "sighup")]


@pytest.mark.parametrize("interval", [0.0, 0.01])
async def test_hup_wakes_the_poll_loop(tmp_path: Path, interval: float) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    seen = Seen()
    w = watcher_for(path, seen, interval=interval)
    w.start()
    try:
        w.hup()
        await waiting.until(lambda: any(c[2] == "sighup" for c in seen.calls), what="re-read on hup")
    finally:
        await w.stop()


async def test_the_poll_loop_applies_a_change(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    seen = Seen()
    w = watcher_for(path, seen, interval=0.01)
    w.start()
    try:
        path.write_text("a: 2\n")
        await waiting.until(lambda: bool(seen.calls), what="change applied by polling")
    finally:
        await w.stop()
    assert seen.calls[0][1:] == (digest(b"a: 2\n"), "file")


class CountingWatcher(ConfigWatcher):
    """Counts the reads (each one a worker thread's job) a poll makes."""

    reads = 0

    def _read(self) -> bytes | None:
        self.reads += 1
        return super()._read()


async def test_a_poll_reads_only_when_the_stat_says_the_file_may_have_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A settled file costs a poll one stat, no read in a thread; any write, rename or touch
    (ctime moves even when ``cp -p`` puts the mtime back) makes the next poll read."""
    monkeypatch.setattr("epp.datalayer.watch.RECENT", 0.0)  # the files here were all written just now
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    seen = Seen()
    w = CountingWatcher(str(path), seen, interval=0.0)
    w.seen(digest(path.read_bytes()))
    assert not await w.check() and w.reads == 1  # the first poll reads
    assert not await w.check() and not await w.check()
    assert w.reads == 1
    before = path.stat()
    path.write_text("a: 2\n")  # same size; the mtime put back as cp -p would
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    while path.stat().st_ctime_ns == before.st_ctime_ns:  # the same coarse tick: touch again
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_size == before.st_size
    assert not await w.check() and w.reads == 2  # seen once: debounce
    assert await w.check() and w.reads == 3  # a digest waiting for its second sighting reads
    assert seen.calls == [(b"a: 2\n", digest(b"a: 2\n"), "file")]
    assert not await w.check() and w.reads == 3


async def test_a_file_changed_recently_is_read_whatever_its_stat(tmp_path: Path) -> None:
    """A write in the same timestamp tick as the poll's stat leaves the stat as it was: a file
    whose change time is within ``RECENT`` is read on every poll."""
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    w = CountingWatcher(str(path), Seen(), interval=0.0)
    w.seen(digest(path.read_bytes()))
    for n in range(1, 4):
        assert not await w.check()
        assert w.reads == n
