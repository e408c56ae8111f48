"""Sample a running EPP with py-spy and reduce the stacks to its top costs (self and inclusive)."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import log


def py_spy() -> str | None:
    exe = Path(sys.executable).parent / "py-spy"
    return str(exe) if exe.exists() else shutil.which("py-spy")


class Profiler:
    """``async with Profiler(pid, seconds)``: py-spy samples ``pid`` while the block runs."""

    def __init__(self, pid: int, seconds: float, *, rate: int = 200, native: bool = False) -> None:
        self.pid = pid
        self.native = native
        self.seconds = seconds
        self.rate = rate
        self._dir = tempfile.TemporaryDirectory(prefix="bench-pyspy-")
        self.out = Path(self._dir.name) / "stacks.txt"
        self._proc: asyncio.subprocess.Process | None = None
        self.error = ""

    async def __aenter__(self) -> Profiler:
        exe = py_spy()
        if exe is None:
            self.error = "py-spy not installed"
            return self
        # Python frames are sampled without pausing the process; native frames (C code of
        # uvloop, grpc, protobuf, syscalls) need py-spy to pause it for each sample.
        mode = "--native" if self.native else "--nonblocking"
        argv = [exe, "record", "--pid", str(self.pid), "--duration", str(max(1, int(self.seconds)))]
        argv += ["--rate", str(self.rate), "--format", "raw", mode, "--output", str(self.out)]
        self._proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        try:
            _, err = await asyncio.wait_for(self._proc.communicate(), self.seconds + 30)
        except TimeoutError:
            self._proc.kill()
            _, err = await self._proc.communicate()
        if self._proc.returncode != 0 and not self.out.exists():
            self.error = (err or b"").decode(errors="replace").strip()[
                -500:
            ] or f"py-spy exit {self._proc.returncode}"
            log(f"  py-spy failed: {self.error}")

    def summary(self, top: int = 15) -> dict[str, Any]:
        """Top functions by self samples (where CPU is burnt) and by inclusive samples."""
        try:
            if self.error or not self.out.exists():
                return {"error": self.error or "no profile written"}
            return summarize_stacks(self.out.read_text(errors="replace"), top)
        finally:
            self._dir.cleanup()


def _frame(raw: str) -> str:
    # py-spy raw frames look like "function (path/to/module.py:123)"; keep function and module.
    name, _, where = raw.partition(" (")
    where = where.rstrip(")")
    path, _, _line = where.rpartition(":")
    short = path
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in path:
            short = path.split(marker, 1)[1]
            break
    return f"{name} ({short})" if short else name


# Native leaves where a thread waits rather than works (py-spy --native samples them too).
IDLE_LEAVES = frozenset(
    {
        "epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "pselect6", "futex",
        "syscall", "nanosleep", "clock_nanosleep", "pthread_cond_wait", "pthread_cond_timedwait",
        "__futex_abstimed_wait_common", "__GI___poll", "sem_wait",
    }
)  # fmt: skip


def summarize_stacks(text: str, top: int = 15) -> dict[str, Any]:
    """Shares are of busy samples; samples whose leaf is a native wait count as idle."""
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    idle = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";") if f and not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread (")]
        if not frames:
            continue
        leaf = frames[-1]
        if leaf.split(" (", 1)[0] in IDLE_LEAVES:
            idle += n
            continue
        total += n
        self_c[leaf] += n
        for f in set(frames):
            incl[f] += n

    def table(c: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": k, "samples": v, "share": round(v / total, 4)} for k, v in c.most_common(top)]

    return {
        "samples": total,
        "idle_samples": idle,
        "self": table(self_c),
        "inclusive": table(incl),
    }
