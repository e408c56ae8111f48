"""bench/extproc_load.c driven from Python: the closed loop of bench/extproc_client in C.

Why a second client: on this 2-core machine every core the load client burns is one the EPP
cannot have.  The Python client costs ~9 µs a request (0.18 of a core at the ~21k requests a
second two workers route), so the workers cell of bench/scaleout measured the client beside
the workers.  The C client sends the same frames (built here by the Python client's own
``variants`` and ``header_block``) in the same order (``ClosedLoop``'s seeded draw) for a small
fraction of that.

``NativeClosedLoop`` keeps one process for several runs, so a cell can warm up, start its CPU
account on the client's pid, then run the measured window::

    async with NativeClosedLoop(host, port, vs, connections=8, concurrency=64) as load:
        await load.run(1.0)
        acct = CoreAccount({"client": load.pid, ...}); acct.start()
        stats = await load.run(5.0)
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import shutil
import struct
import subprocess
import tempfile
from array import array
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

from bench.extproc_client import Stats, Variant, header_block
from bench.setup import CACHE

SOURCE: Final = Path(__file__).with_name("extproc_load.c")
ORDER_LENGTH: Final = 4096  # ``ClosedLoop``'s cycle
MAX_FRAME: Final = 16384  # the client sends each phase as one DATA frame (HTTP/2's default maximum)


def binary() -> Path:
    """The compiled client, built once per source version into ``bench/.cache``.

    ``$CC`` or ``cc``; the project's own C extensions need the same compiler (hatch_build.py)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = CACHE / f"extproc_load-{digest}"
    if out.exists():
        return out
    CACHE.mkdir(exist_ok=True)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("bench/extproc_load.c needs a C compiler: set CC or install cc")
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    subprocess.run([cc, "-O2", "-Wall", "-o", str(tmp), str(SOURCE)], check=True)
    tmp.replace(out)  # atomic: a concurrent build's result is the same file
    return out


def order(count: int, seed: int = 1) -> list[int]:
    """The variants' order: ``ClosedLoop``'s draw with the same seed, as indices."""
    rng = random.Random(seed)
    return [rng.randrange(count) for _ in range(ORDER_LENGTH)]


def spec(block: bytes, vs: Sequence[Variant], seed: int = 1) -> bytes:
    """The file extproc_load.c reads: variants, header block, each variant's phases, the order."""
    u32 = struct.Struct("<I").pack
    parts = [u32(len(vs)), u32(len(block)), block]
    for v in vs:
        for phase in (v.phase1, v.phase2):
            if len(phase) > MAX_FRAME:
                raise ValueError(f"a phase of {len(phase)} bytes needs more than one DATA frame")
            parts += (u32(len(phase)), phase)
    idx = order(len(vs), seed)
    parts.append(u32(len(idx)))
    parts.append(struct.pack(f"<{len(idx)}I", *idx))
    return b"".join(parts)


class NativeClosedLoop:
    """One extproc_load process: ``run(seconds)`` is ``extproc_client.closed_loop`` in C."""

    def __init__(
        self,
        host: str,
        port: int,
        vs: Sequence[Variant],
        *,
        connections: int,
        concurrency: int,
        seed: int = 1,
    ) -> None:
        self._args = (host, str(port), str(connections), str(concurrency))
        self._spec = spec(header_block(f"{host}:{port}"), vs, seed)
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._lat = Path()  # the latencies file, in ``_dir`` once started
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("NativeClosedLoop: not started")
        return self._proc.pid

    async def __aenter__(self) -> NativeClosedLoop:
        exe = await asyncio.to_thread(binary)
        self._dir = tempfile.TemporaryDirectory(prefix="extproc_load-")
        spec_path = Path(self._dir.name) / "spec"
        spec_path.write_bytes(self._spec)
        self._lat = Path(self._dir.name) / "latencies"
        self._proc = await asyncio.create_subprocess_exec(
            str(exe),
            *self._args,
            str(spec_path),
            str(self._lat),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return self

    async def run(self, seconds: float) -> Stats:
        """Keep the streams open for ``seconds``; the ones open then finish and count."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise RuntimeError("NativeClosedLoop: not started")
        proc.stdin.write(f"run {seconds}\n".encode())
        await proc.stdin.drain()
        async with asyncio.timeout(seconds + 60):
            line = await proc.stdout.readline()
        words = line.split()
        if len(words) != 4 or words[0] != b"done":
            rc = await proc.wait()
            raise RuntimeError(f"extproc_load exited {rc} without its counts: {line!r}")
        lat = array("d")
        lat.frombytes(self._lat.read_bytes())
        return Stats(
            latencies=lat.tolist(), routed=int(words[1]), refused=int(words[2]), failed=int(words[3])
        )

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
