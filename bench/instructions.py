"""Instructions per request of the EPP's in-process hot path, counted by callgrind: an A/B measure
that machine noise does not move.

    python -m bench.instructions [--requests N] [--config default|prefix-heavy|PATH ...] [--keep DIR]

Wall and CPU time on a shared 2-core machine vary by 10-20% between minutes; instruction counts
do not.  One ``valgrind --tool=callgrind`` process runs every config (and the floor): the same in-process
path as ``bench.hotpath`` (a fake transport feeding one ``Connection`` the bytes Envoy sends for
one FULL_DUPLEX_STREAMED request, 1 KB chat body, three streamed chunks), warmed up, then ``N``
requests between two markers: ``os.getppid()`` before (callgrind's ``--zero-before=getppid``
zeroes the counts there) and ``os.getpgrp()`` after (``--dump-before=getpgrp`` writes them), so
the dump holds exactly the measured requests, nothing of start-up or shutdown.  Only the loop's
thread is counted (as ``bench.hotpath`` counts its thread CPU): the histogram fold thread wakes
by wall time, which valgrind stretches, so it would land in whichever window ran then.  Before
each window pending observations are folded and the heap is collected and frozen, so a window
pays only for what its own requests do.  ``floor`` is
``bench.noop_extproc``'s session on the same transport.  Reports Ir (instructions executed) per
request, the EPP's against the floor's; ``--keep DIR`` keeps the dumps (part K: the floor, then
each config in order) for ``callgrind_annotate DIR/callgrind.out.K-01``, the split by C function.
Python's hash seed is fixed.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import uvloop

from bench.hotpath import DEFAULT_CONFIG, Client, epp_server, request_messages
from bench.noop_extproc import NoopProcessor
from epp.app.serve import tune_gc
from epp.metrics.fast import fold_all
from epp.server.h2.server import H2GrpcServer

CONFIGS = {
    "default": DEFAULT_CONFIG,
    "prefix-heavy": Path(__file__).parent / "configs" / "prefix-heavy.yaml",
}
FLOOR = "floor"
WARMUP = 600


async def run_inner(configs: list[str], requests: int) -> None:
    """Warm each server up, then ``requests`` requests between the two markers callgrind watches."""
    msgs = [request_messages(i) for i in range(64)]
    clients = []
    for config in configs:
        if config == FLOOR:
            server = H2GrpcServer(NoopProcessor(["10.0.0.1:8000", "10.0.0.2:8000"]))
        else:
            server = epp_server(CONFIGS.get(config, Path(config)).read_text(), 4)
        clients.append(Client(server, msgs))
    tune_gc()
    for client in clients:
        for _ in range(WARMUP):
            await client.one()
    for client in clients:
        fold_all()  # nothing left from the other servers' requests for the fold thread
        gc.collect()  # each window starts from the same heap: no collection owed from before
        gc.freeze()
        os.getppid()  # marker: callgrind zeroes its counts here
        for _ in range(requests):
            await client.one()
        os.getpgrp()  # marker: callgrind dumps the measured requests here (one part per config)


def total_ir(dump: Path) -> int:
    """The ``totals:`` (or ``summary:``) Ir of one callgrind dump."""
    for line in dump.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"{dump}: no totals line")


def count(configs: list[str], requests: int, out_dir: Path) -> list[float]:
    """Ir per request of each config, in one callgrind process (start-up is most of its time)."""
    out = out_dir / "callgrind.out"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        "--zero-before=getppid",
        "--dump-before=getpgrp",
        "--separate-threads=yes",
        sys.executable,
        "-m",
        "bench.instructions",
        "--requests",
        str(requests),
        "--inner",
        *configs,
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [total_ir(Path(f"{out}.{i + 1}-01")) / requests for i in range(len(configs))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--config", action="append", help="default, prefix-heavy, floor or a path (repeatable)")
    ap.add_argument("--keep", type=Path, help="keep the callgrind dumps in this directory")
    ap.add_argument("--inner", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner:
        uvloop.run(run_inner(args.inner, args.requests))
        return
    configs = args.config or ["default", "prefix-heavy"]
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        floor, *irs = count([FLOOR, *configs], args.requests, out_dir)
        print(f"floor: {floor:,.0f} Ir/request")
        for config, ir in zip(configs, irs, strict=True):
            print(f"{config}: {ir:,.0f} Ir/request, added {ir - floor:,.0f}, ratio {ir / floor:.3f}")


if __name__ == "__main__":
    main()
