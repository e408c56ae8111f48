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
request, the EPP's against the floor's; ``--keep DIR`` keeps the dumps (part 1 a throwaway,
then the floor and each config in order) for ``callgrind_annotate DIR/callgrind.out.K-01``, the
split by C function.  Python's hash seed is fixed.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import inspect
import operator
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

from bench.hotpath import DEFAULT_CONFIG, Client, epp_server, request_messages
from bench.noop_extproc import NoopProcessor
from epp.app.serve import tune_gc
from epp.metrics.fast import fold_all
from epp.server.h2.server import H2GrpcServer

# Stages of one request, each counted inclusively (with what it calls) in its own window: the
# stage's callable is wrapped so that it runs inside ``operator.call``, the only caller of that C
# function here, and callgrind collects only there (``--toggle-collect=_operator_call``).
STAGES: dict[str, tuple[str, str, str]] = {
    "whole request (Connection.data_received)": ("epp.server.h2.connection", "Connection", "data_received"),
    "ext_proc session, every message": ("epp.server.session", "ExtProcSession", "handle"),
    "messages decoded (header maps to dicts)": ("epp.server.extproc", "ExtProcServicer", "decode"),
    "director start": ("epp.director.director", "Director", "start"),
    "routing (eager step of route)": ("epp.server.h2.eager", "", "start"),
    "parser": ("epp.parsers.plugins.openai", "OpenAIParser", "parse_request"),
    "prefix producer": (
        "epp.director.producers.approx_prefix",
        "ApproxPrefixCacheProducer",
        "prepare_request_data_now",
    ),
    "in-flight producer": (
        "epp.director.producers.inflight_load",
        "InFlightLoadProducer",
        "prepare_request_data_now",
    ),
    "scheduler": ("epp.scheduling.scheduler", "Scheduler", "schedule"),
    "- fused plan (scorers, picker, verdict)": ("epp.scheduling.fused", "FusedPlan", "schedule"),
    # The scoring alone: the score cache's refresh and the C kernel (epp.scheduling.kernel; with
    # EPP_PURE_PYTHON=1 the Python scorers), which now computes token-load and prefill-load.
    "  - scoring (cache refresh, kernel)": ("epp.scheduling.fused", "FusedPlan", "totals"),
    "  - score cache refresh": ("epp.scheduling.score_cache", "MetricsScoreCache", "refresh"),
    "in-flight pre-request": ("epp.director.producers.inflight_load", "InFlightLoadProducer", "pre_request"),
    "prefill-load pre-request": ("epp.scheduling.scorers.prefill_load", "PrefillLoadScorer", "pre_request"),
    "prefix pre-request": (
        "epp.director.producers.approx_prefix",
        "ApproxPrefixCacheProducer",
        "pre_request",
    ),
    "routing reply": ("epp.server.responses", "", "routing_headers_response"),
    "response headers": ("epp.director.lifecycle", "RequestLifecycle", "response_headers"),
    "- in-flight header hook": (
        "epp.director.producers.inflight_load",
        "InFlightLoadProducer",
        "response_header",
    ),
    "response chunks": ("epp.director.lifecycle", "RequestLifecycle", "response_chunk"),
    "- prefill-load body hook (per chunk)": (
        "epp.scheduling.scorers.prefill_load",
        "PrefillLoadScorer",
        "response_body",
    ),
    "completion (hooks, response metrics)": ("epp.director.response", "ResponseSide", "complete"),
    "close (completion, metrics)": ("epp.server.session", "ExtProcSession", "close"),
}
# Stages of plugins that only some configs have (prefix-heavy's load plugins): 0 elsewhere.
PLUGIN_STAGES: frozenset[str] = frozenset(
    {
        "in-flight producer",
        "in-flight pre-request",
        "prefill-load pre-request",
        "- in-flight header hook",
        "- prefill-load body hook (per chunk)",
    }
)
CONFIGS = {
    "default": DEFAULT_CONFIG,
    "prefix-heavy": Path(__file__).parent / "configs" / "prefix-heavy.yaml",
}
FLOOR = "floor"
WARMUP = 600
STAGE_WARMUP = 200


def _messages() -> list[tuple[bytes, bytes]]:
    return [request_messages(i) for i in range(64)]


async def run_inner(configs: list[str], requests: int) -> None:
    """Warm each server up, then ``requests`` requests between the two markers callgrind watches."""
    msgs = _messages()
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
    _throwaway_window()
    for client in clients:
        fold_all()  # nothing left from the other servers' requests for the fold thread
        gc.collect()  # each window starts from the same heap: no collection owed from before
        gc.freeze()
        os.getppid()  # marker: callgrind zeroes its counts here
        for _ in range(requests):
            await client.one()
        os.getpgrp()  # marker: callgrind dumps the measured requests here (one part per config)


def _throwaway_window() -> None:
    """An empty first window: callgrind's first dump carries millions of instructions that belong
    to no request (seen with an empty loop in it), so no measured window comes first."""
    os.getppid()
    os.getpgrp()


def compiled(module_name: str) -> bool:
    """Whether mypyc compiled the module (hatch_build.py ``COMPILED_MODULES``): its methods call
    each other directly, so a stage there cannot be wrapped and is not split out."""
    path = importlib.import_module(module_name).__file__ or ""
    return not path.endswith(".py")


def _wrapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    call = operator.call

    @functools.wraps(fn)
    def stage(*args: Any, **kwargs: Any) -> Any:
        return call(fn, *args, **kwargs)

    return stage


async def run_stages(config: str, requests: int) -> None:
    """One window per stage (``STAGES``), ``requests`` requests each, only that stage wrapped.

    Each window gets a server built after its stage is wrapped (the director looks some
    callables up once, when it is built) and warmed up with ``STAGE_WARMUP`` requests.
    """
    text = CONFIGS.get(config, Path(config)).read_text()
    tune_gc()
    _throwaway_window()
    for module_name, owner_name, attr in STAGES.values():
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        original = inspect.getattr_static(owner, attr)
        if compiled(module_name):  # its window runs unwrapped: it counts nothing (``stages``)
            pass
        elif isinstance(original, staticmethod):  # e.g. ExtProcServicer.decode: wrapped, still static
            setattr(owner, attr, staticmethod(_wrapped(original.__func__)))
        else:
            setattr(owner, attr, _wrapped(original))
        try:
            client = Client(epp_server(text, 4), _messages())
            for _ in range(STAGE_WARMUP):
                await client.one()
            fold_all()
            gc.collect()
            gc.freeze()
            os.getppid()
            for _ in range(requests):
                await client.one()
            os.getpgrp()
        finally:
            setattr(owner, attr, original)


def total_ir(dump: Path) -> int:
    """The ``totals:`` (or ``summary:``) Ir of one callgrind dump."""
    for line in dump.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"{dump}: no totals line")


def _callgrind(args: list[str], out: Path, extra: tuple[str, ...] = ()) -> None:
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        "--zero-before=getppid",
        "--dump-before=getpgrp",
        "--separate-threads=yes",
        *extra,
        sys.executable,
        "-m",
        "bench.instructions",
        *args,
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def count(configs: list[str], requests: int, out_dir: Path) -> list[float]:
    """Ir per request of each config, in one callgrind process (start-up is most of its time)."""
    out = out_dir / "callgrind.out"
    _callgrind(["--requests", str(requests), "--inner", *configs], out)
    return [total_ir(Path(f"{out}.{i + 2}-01")) / requests for i in range(len(configs))]  # part 1: throwaway


def stages(config: str, requests: int, out_dir: Path) -> dict[str, float | None]:
    """Ir per request inside each stage of ``STAGES`` (inclusive), for ``config``; None for a stage
    in a compiled module (``compiled``)."""
    out = out_dir / f"stages.{Path(config).stem}.out"
    toggle = ("--collect-atstart=no", "--toggle-collect=_operator_call")
    _callgrind(["--requests", str(requests), "--stages", config], out, toggle)
    return {
        name: None if compiled(module) else total_ir(Path(f"{out}.{i + 2}-01")) / requests
        for i, (name, (module, _, _)) in enumerate(STAGES.items())
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--config", action="append", help="default, prefix-heavy, floor or a path (repeatable)")
    ap.add_argument("--keep", type=Path, help="keep the callgrind dumps in this directory")
    ap.add_argument("--by-stage", action="store_true", help="also count each stage of a request (STAGES)")
    ap.add_argument("--inner", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--stages", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner:
        uvloop.run(run_inner(args.inner, args.requests))
        return
    if args.stages:
        uvloop.run(run_stages(args.stages, args.requests))
        return
    configs = args.config or ["default", "prefix-heavy"]
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        if args.by_stage:
            for config in configs:
                print(f"{config}, by stage (inclusive: a stage counts what it calls):")
                for name, ir in stages(config, args.requests, out_dir).items():
                    shown = "compiled (mypyc)" if ir is None else f"{ir:>10,.0f} Ir/request"
                    print(f"  {name:42s} {shown}")
        floor, *irs = count([FLOOR, *configs], args.requests, out_dir)
        print(f"floor: {floor:,.0f} Ir/request")
        for config, ir in zip(configs, irs, strict=True):
            print(f"{config}: {ir:,.0f} Ir/request, added {ir - floor:,.0f}, ratio {ir / floor:.3f}")


if __name__ == "__main__":
    main()
