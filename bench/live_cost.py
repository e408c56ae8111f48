"""What a live ext_proc server process costs a request: the EPP against the no-op floor, driven
directly over loopback (bench/extproc_client, closed loop, no Envoy).

    python -m bench.live_cost [--config default|prefix-heavy ...] [--seconds S] [--callgrind]

``bench.instructions`` counts one request at a time on a fake transport; this runs the real
process: real sockets, concurrent streams on two connections, the histogram fold thread, the
data layer's scrapes.  Each server (the floor, ``bench.noop_extproc`` on the EPP's own HTTP/2
transport, then the EPP per config, against the same simulated fleet) is warmed up, then loaded
at capacity for ``--seconds``:

* CPU per request (user and system, every thread of the process, from /proc);
* with ``--callgrind``, the same process under valgrind (all threads counted; a slower server, so
  fewer requests a second, but the same closed loop), instructions per request: an idle window
  (no requests) is measured first and subtracted at its rate, so the scrapes do not count.

Their ratios to the floor's say where the EPP's cost beyond the floor is: when its CPU ratio is
well above its instruction ratio, its instructions cost more each (a larger working set, more
distinct code per request) and counting instructions understates the gap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

from bench import extproc_client as xc
from bench.common import Child, cpu_split, log, python_module, rnd, write_result
from bench.instructions import total_ir
from epp_sim.demo.procs import EppProcess, SimFleet

CONFIGS: Final = {
    "default": None,
    "prefix-heavy": Path(__file__).parent / "configs" / "prefix-heavy.yaml",
}
FLOOR: Final = "floor"
CONCURRENCY: Final = 16  # streams open at once, over two connections
WARMUP_S: Final = 3.0
IDLE_S: Final = 5.0  # part --callgrind: the idle window's length
T = TypeVar("T")


def callgrind_total(paths: Sequence[Path]) -> int:
    """The instructions of one dump: the sum of its threads' files (``--separate-threads``)."""
    return sum(map(total_ir, paths))


class Server:
    """One ext_proc server process (the floor or the EPP), optionally under callgrind."""

    def __init__(self, name: str, upstreams: Sequence[str], *, callgrind: Path | None) -> None:
        self.name = name
        self.callgrind = callgrind
        self.port = 0
        self._dumps = 0
        prefix = (
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={callgrind}/cg.%p",
            ]
            if callgrind is not None
            else []
        )
        if name == FLOOR:
            argv = python_module(
                "bench.noop_extproc", "--upstreams", ",".join(upstreams), "--transport", "h2"
            )
        else:
            config = CONFIGS[name]
            extra = [f"--config-file={config}"] if config is not None else []
            # the tests' and benches' EPP (its ports and flags), run here as ``python -m epp`` so
            # that valgrind can be put in front of the interpreter
            epp = EppProcess(f"--endpoints={','.join(upstreams)}", "--bind-address=127.0.0.1", *extra)
            epp.cleanup()  # its log directory: this process logs through ``Child``
            self.port = epp.grpc_port
            argv = [*python_module("epp"), *epp.argv()[1:]]
        self.child = Child(f"live-{name}", [*prefix, *argv])

    async def __aenter__(self) -> Server:
        slow = 20 if self.callgrind is not None else 1
        if self.name == FLOOR:
            await self.child.start(timeout=60.0 * slow)
            self.port = int(self.child.ready["port"])
        else:
            await self.child.start(wait_json=False)
            async with asyncio.timeout(60.0 * slow):
                while True:
                    with contextlib.suppress(OSError):
                        (await xc.connect("127.0.0.1", self.port)).close()
                        break
                    await asyncio.sleep(0.2)  # poll interval against another process
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.child.__aexit__(*exc)  # stops it (SIGTERM, then SIGKILL after 10 s) and removes its log

    async def instructions(self, load: Callable[[], Awaitable[T]]) -> tuple[int, float, T]:
        """Instructions the process ran while ``load`` ran, the wall time and what ``load`` returned."""
        assert self.callgrind is not None
        await _control("-z", self.child.pid)
        t0 = time.perf_counter()
        result = await load()
        await _control("-d", self.child.pid)
        wall = time.perf_counter() - t0
        self._dumps += 1
        files = sorted(self.callgrind.glob(f"cg.{self.child.pid}.{self._dumps}-*"))
        return callgrind_total(files), wall, result


async def _control(flag: str, pid: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        "callgrind_control",
        flag,
        str(pid),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    if await proc.wait() != 0:
        raise RuntimeError(f"callgrind_control {flag} {pid} failed")


async def measure(name: str, upstreams: Sequence[str], seconds: float, *, callgrind: bool) -> dict[str, Any]:
    """One server's cell: CPU per request, or (``callgrind``) instructions per request."""
    vs = xc.variants(
        [f"You are helpful. Question {i}: " + "lorem ipsum " * 60 for i in range(32)], "mock-model"
    )
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
        async with Server(name, upstreams, callgrind=Path(tmp) if callgrind else None) as server:

            async def load() -> xc.Stats:
                return await xc.closed_loop(
                    "127.0.0.1", server.port, vs, connections=2, concurrency=CONCURRENCY, seconds=seconds
                )

            await xc.closed_loop(
                "127.0.0.1", server.port, vs, connections=2, concurrency=CONCURRENCY, seconds=WARMUP_S
            )
            if callgrind:
                idle, idle_wall, _ = await server.instructions(partial(asyncio.sleep, IDLE_S))
                busy, wall, stats = await server.instructions(load)
                n = stats.routed
                return {
                    "routed": n,
                    "failed": stats.failed + stats.refused,
                    "req_per_s": rnd(n / wall, 1),
                    "instructions_per_request": round((busy - idle / idle_wall * wall) / n) if n else None,
                    "idle_instructions_per_s": round(idle / idle_wall),
                }
            u0, s0 = cpu_split(server.child.pid)
            t0 = time.perf_counter()
            stats = await load()
            wall = time.perf_counter() - t0
            u1, s1 = cpu_split(server.child.pid)
            n = stats.routed
            return {
                "routed": n,
                "failed": stats.failed + stats.refused,
                "req_per_s": rnd(n / wall, 1),
                "user_us_per_request": rnd((u1 - u0) / n * 1e6, 1) if n else None,
                "system_us_per_request": rnd((s1 - s0) / n * 1e6, 1) if n else None,
                "cpu_us_per_request": rnd((u1 - u0 + s1 - s0) / n * 1e6, 1) if n else None,
            }


def ratios(cells: dict[str, dict[str, Any]], key: str) -> dict[str, float | None]:
    """Each config's ``key`` over the floor's."""
    floor = cells.get(FLOOR, {}).get(key)
    return {
        name: rnd(c[key] / floor, 3) if floor and c.get(key) else None
        for name, c in cells.items()
        if name != FLOOR
    }


async def run(configs: Sequence[str], seconds: float, callgrind: bool) -> dict[str, Any]:
    async with SimFleet(4, "--time-scale", "0.02") as fleet:
        cpu: dict[str, dict[str, Any]] = {}
        for name in (FLOOR, *configs):
            cpu[name] = await measure(name, fleet.hostports, seconds, callgrind=False)
            log(f"live cost, {name}: {cpu[name]}")
        out: dict[str, Any] = {"cpu": cpu, "cpu_ratio": ratios(cpu, "cpu_us_per_request")}
        if callgrind:
            ir: dict[str, dict[str, Any]] = {}
            for name in (FLOOR, *configs):
                ir[name] = await measure(name, fleet.hostports, seconds * 3, callgrind=True)
                log(f"live instructions, {name}: {ir[name]}")
            out["instructions"] = ir
            out["instruction_ratio"] = ratios(ir, "instructions_per_request")
            # CPU a request per instruction, over the floor's: above 1, the EPP's instructions cost more each
            out["cost_per_instruction_ratio"] = {
                name: rnd(c / i, 2) if c and i else None
                for name, c, i in (
                    (n, out["cpu_ratio"][n], out["instruction_ratio"][n]) for n in out["cpu_ratio"]
                )
            }
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", choices=sorted(CONFIGS), help="repeatable; default: both")
    ap.add_argument("--seconds", type=float, default=8.0, help="each CPU cell's load (callgrind's: 3x)")
    ap.add_argument("--callgrind", action="store_true", help="also count instructions under valgrind")
    args = ap.parse_args(argv)
    configs = args.config or list(CONFIGS)
    doc = asyncio.run(run(configs, args.seconds, args.callgrind))
    write_result("live_cost", doc, mode="callgrind" if args.callgrind else "cpu", seeds={})
    for key in ("cpu_ratio", "instruction_ratio", "cost_per_instruction_ratio"):
        if key in doc:
            print(f"{key}: {doc[key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
