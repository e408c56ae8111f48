"""What each ext_proc phase costs the proxy: Envoy's CPU per request by processing mode.

    python -m bench.envoy_phases [--quick]      # writes bench/results/envoy_phases.json

The no-op ext_proc server on the EPP's own h2 transport (bench/noop_extproc.py) answers every
message at once, so differences between rows are Envoy's (and the server's) cost of the phases,
not of routing.  One row per Envoy ``processing_mode`` (static, or the lean config with the
server's per-request ``mode_override``), plus Envoy alone as the zero.  1 KB chat requests,
non-streamed 1-chunk answers from near-instant upstreams; closed loop at capacity, paths
interleaved per round, medians of rounds.  docs/envoy.md carries the table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import log, versions, write_result
from bench.httpload import closed_loop, summarize
from bench.overhead import chat_requests
from bench.paths import LEAN, Lab, Path, PathSpec, extproc_messages

SEED = 17
_FD = "FULL_DUPLEX_STREAMED"


def _mode(
    request: str, response: str, headers: str = "SEND", trailers: str = "SEND"
) -> tuple[tuple[str, object], ...]:
    cfg: dict[str, object] = {
        "request_body_mode": request,
        "response_body_mode": response,
        "response_header_mode": headers,
        "request_trailer_mode": "SEND",
        "response_trailer_mode": trailers,
    }
    if request == "BUFFERED":
        cfg["buffer_limit_bytes"] = 1 << 20
    return tuple(cfg.items())


SPECS = (
    PathSpec("envoy", "envoy", label="Envoy alone (no ext_proc)"),
    PathSpec("fd-all", "floor", transport="h2", envoy=_mode(_FD, _FD), label="GIE: FD request, FD response"),
    PathSpec(
        "fd-headers",
        "floor",
        transport="h2",
        envoy=_mode(_FD, "NONE", trailers="SKIP"),
        label="FD request, response headers only",
    ),
    PathSpec(
        "fd-none",
        "floor",
        transport="h2",
        envoy=_mode(_FD, "NONE", headers="SKIP", trailers="SKIP"),
        label="FD request, no response phase",
    ),
    PathSpec(
        "buf-streamed",
        "floor",
        transport="h2",
        envoy=_mode("BUFFERED", "STREAMED"),
        label="BUFFERED request, STREAMED response",
    ),
    PathSpec(
        "buf-headers",
        "floor",
        transport="h2",
        envoy=_mode("BUFFERED", "NONE", trailers="SKIP"),
        label="BUFFERED request, response headers only",
    ),
    PathSpec(
        "buf-none",
        "floor",
        transport="h2",
        envoy=_mode("BUFFERED", "NONE", headers="SKIP", trailers="SKIP"),
        label="BUFFERED request, no response phase",
    ),
    PathSpec(
        "lean-override",
        "floor",
        transport="h2",
        envoy=tuple(LEAN.items()),
        response_phases="none",
        label="lean.yaml + per-request override skipping the response",
    ),
)


@dataclass(frozen=True, slots=True)
class Settings:
    window_s: float
    rounds: int
    concurrency: int


QUICK = Settings(window_s=2.0, rounds=1, concurrency=32)
FULL = Settings(window_s=5.0, rounds=3, concurrency=32)


async def measure(path: Path, requests: list[bytes], st: Settings) -> dict[str, Any]:
    before = await extproc_messages(path)
    meter = path.meter()
    meter.start()
    run = await closed_loop(path.client(), requests, concurrency=st.concurrency, duration=st.window_s)
    cpu = meter.stop()
    after = await extproc_messages(path)
    s: dict[str, Any] = summarize(run)
    ok = max(1, s["ok"])
    s["cpu_us_per_req"] = {k: v / ok * 1e6 for k, v in cpu.items()}
    sent = after.get("stream_msgs_sent", 0) - before.get("stream_msgs_sent", 0)
    got = after.get("stream_msgs_received", 0) - before.get("stream_msgs_received", 0)
    s["msgs_per_req"] = (sent + got) / ok
    return s


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 1) if xs else None


def summarise(cells: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Medians of rounds per row; Envoy's cost over Envoy alone."""
    out: dict[str, dict[str, Any]] = {}
    for name, ws in cells.items():
        out[name] = {
            "req_per_s": _median([w["achieved_rps"] for w in ws]),
            "envoy_us_per_req": _median([w["cpu_us_per_req"].get("envoy", 0.0) for w in ws]),
            "extproc_us_per_req": _median(
                [w["cpu_us_per_req"]["extproc"] for w in ws if "extproc" in w["cpu_us_per_req"]]
            ),
            "msgs_per_req": _median([w["msgs_per_req"] for w in ws]),
            "errors": sum(w["errors"] for w in ws),
        }
    zero = out.get("envoy", {}).get("envoy_us_per_req")
    for row in out.values():
        e = row["envoy_us_per_req"]
        row["envoy_ext_proc_us_per_req"] = round(e - zero, 1) if e is not None and zero is not None else None
    return out


async def run(mode: str) -> dict[str, Any]:
    st = QUICK if mode == "quick" else FULL
    requests = chat_requests(64, 1024, SEED)
    cells: dict[str, list[dict[str, Any]]] = {s.name: [] for s in SPECS}
    async with Lab(SPECS) as lab:
        paths = list(lab.paths.values())
        for p in paths:
            await closed_loop(p.client(), requests, concurrency=8, duration=0.5)
        for rnd in range(st.rounds):
            for p in paths[rnd % len(paths) :] + paths[: rnd % len(paths)]:
                w = await measure(p, requests, st)
                cells[p.name].append(w)
                log(
                    f"envoy_phases: round {rnd + 1}/{st.rounds} {p.name:<14} {w['achieved_rps']} req/s "
                    f"envoy {w['cpu_us_per_req'].get('envoy', 0):.0f} us/req, "
                    f"{w['msgs_per_req']:.2f} msgs/req"
                )
    return {"settings": asdict(st), "paths": {s.name: s.title for s in SPECS}, "rows": summarise(cells)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.envoy_phases", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full"
    import uvloop

    result = uvloop.run(run(mode))
    result["versions"] = versions()
    log(f"envoy_phases: wrote {write_result('envoy_phases', result, mode=mode, seeds={'bodies': SEED})}")
    for name, row in result["rows"].items():
        print(f"{result['paths'][name]:<58} {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
