"""P/D disaggregation against aggregated serving, on the same simulated hardware, through Envoy + EPP.

    python -m bench.pd [--quick]      # writes bench/results/pd.json

Four simulated pods either way (one H100-class 8B engine each, docs/simulator.md): aggregated =
four ``--role both`` pods behind the EPP's default config; P/D = two prefill pods and two decode
pods, each decode pod behind its ``epp-pd-proxy`` (llm-d's sidecar protocol; the KV transfer is
modelled, docs/pd-disaggregation.md). Six modes: aggregated, always-disaggregate
(bench/configs/pd-always.yaml, llm-d's guide), the prefix-based decider on the same 2 + 2 fleet
(bench/configs/pd-prefix.yaml), the same with the handler's ``declinedProfile``
(bench/configs/pd-prefix-declined.yaml: a declined request is served whole by any of the four pods,
the prefill pods included), the prefix-based decider on a symmetric fleet of four
``prefill-decode`` pods, each behind the proxy (bench/configs/pd-prefix-symmetric.yaml: a declined
request is served whole by any pod, a disaggregated one is prefilled on another pod), and the same
with the decider's ``dedicatedDecodeOnly`` (bench/configs/pd-prefix-symmetric-dedicated.yaml: no
pod there is a dedicated decode pod, so nothing is disaggregated). Three
workloads, open-loop Poisson arrivals: llm-d's guide shape
(distinct 5,000-token prompts, 250 out; the guide's 45 QPS on 16 H200 scaled to 4 simulated pods
of 20k prefill tokens/s, which keeps the guide's per-pod prefill load), 200 in / 200 out, where the
guide advises against P/D, and the same long prompts sharing 4,500-token prefixes in 8
conversations (multi-turn-like: the decode pod may already hold most of the prompt). Reported
per workload x mode: TTFT, inter-token latency (per request), end-to-end latency (means and p90)
and output tokens/s, as ratios to aggregated; and, for each prefix-based mode, where it is worse
than both aggregated and always-disaggregate.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.common import CONFIGS, log, versions, write_result
from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.loadgen import Result, percentile, run_open_loop, shared_prefix_jobs
from epp_sim.demo.procs import EppProcess, PdFleet, SimFleet

MODEL = "mock-model"
SEEDS = {"sim": 1, "workload": 42, "arrivals": 7}
PODS = 4
PREFILL_PODS = 2
CHARS_PER_SIM_TOKEN = 4
TOLERANCE = 0.10  # run-to-run noise on the loaded machine: smaller margins are reported, not failed
PREFIX_THRESHOLD = 384  # bench/configs/pd-prefix.yaml; tuned from 1024, see docs/pd-simulator.md
SYMMETRIC_THRESHOLD = 1024  # bench/configs/pd-prefix-symmetric.yaml; why there, see that file
DECLINED_THRESHOLD = 1024  # bench/configs/pd-prefix-declined.yaml; why there, see that file
MODES = {
    "aggregated": "aggregated (4 pods, default EPP config)",
    "always": "always-disaggregate (2 prefill + 2 decode)",
    "prefix": f"prefix-based decider, nonCachedTokens {PREFIX_THRESHOLD} (2 + 2)",
    "declined": f"prefix-based decider + declinedProfile, nonCachedTokens {DECLINED_THRESHOLD} (2 + 2)",
    "symmetric": f"prefix-based decider, nonCachedTokens {SYMMETRIC_THRESHOLD} (4 prefill-decode)",
    "symmetric-dedicated": "prefix-based decider + dedicatedDecodeOnly, "
    f"nonCachedTokens {SYMMETRIC_THRESHOLD} (4 prefill-decode)",
}
# the decider's modes, each checked against the other two
PREFIX_MODES = ("prefix", "declined", "symmetric", "symmetric-dedicated")
SYMMETRIC_MODES = ("symmetric", "symmetric-dedicated")  # four prefill-decode pods
CONFIG_FILES = {
    "always": "pd-always.yaml",
    "prefix": "pd-prefix.yaml",
    "declined": "pd-prefix-declined.yaml",
    "symmetric": "pd-prefix-symmetric.yaml",
    "symmetric-dedicated": "pd-prefix-symmetric-dedicated.yaml",
}
METRICS = (  # (key, lower is better)
    ("ttft_mean_ms", True),
    ("ttft_p90_ms", True),
    ("itl_mean_ms", True),
    ("itl_p90_ms", True),
    ("e2e_mean_ms", True),
    ("e2e_p90_ms", True),
    ("output_tokens_per_s", False),
)


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    title: str
    prompt_tokens: int
    output_tokens: int
    rate: float  # requests per second, open loop
    shared_prefix_tokens: int = 0  # > 0: prompts of `groups` conversations share this much
    groups: int = 0


@dataclass(frozen=True, slots=True)
class Settings:
    duration_s: float
    workloads: tuple[Workload, ...]


LONG = Workload("long", "llm-d guide shape, 5,000 in / 250 out", 5000, 250, 6.5)
SHORT = Workload("short", "short prompts, 200 in / 200 out", 200, 200, 8.0)
SHARED = Workload(
    "shared",
    "long shared prefixes, 4,500 shared + 500 new in / 250 out, 8 conversations",
    5000,
    250,
    6.5,
    shared_prefix_tokens=4500,
    groups=8,
)
QUICK = Settings(duration_s=12.0, workloads=(LONG, SHORT, SHARED))
FULL = Settings(duration_s=40.0, workloads=(LONG, SHORT, SHARED))


def sim_args() -> list[str]:
    return ["--time-scale", "1", "--seed", str(SEEDS["sim"]), "--model", MODEL, "--max-model-len", "32768"]


def jobs(wl: Workload, n: int) -> list[Any]:
    """Distinct prompts (one group per request), or `groups` long shared prefixes each followed by
    a new part, interleaved (a multi-turn-like workload where the decode pod may hold the prefix)."""
    shared = wl.shared_prefix_tokens or wl.prompt_tokens - 30
    groups = wl.groups or n
    return shared_prefix_jobs(
        groups=groups,
        prompts_per_group=-(-n // groups),
        system_chars=shared * CHARS_PER_SIM_TOKEN,
        question_chars=(wl.prompt_tokens - shared) * CHARS_PER_SIM_TOKEN,
        max_tokens=wl.output_tokens,
        model=MODEL,
        seed=SEEDS["workload"],
    )[:n]


def _ms(x: float) -> float | None:
    return None if math.isnan(x) else round(x * 1000, 2)


def summarize(results: Sequence[Result], wall: float) -> dict[str, Any]:
    ok = [r for r in results if r.status == 200 and not r.error and r.output_tokens > 0]
    ttft = [r.ttft for r in ok if r.ttft]
    itl = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.ttft and r.output_tokens > 1]
    e2e = [r.latency for r in ok]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else math.nan

    errors = Counter(r.error or f"HTTP {r.status}" for r in results if r not in ok)
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": dict(errors),
        "wall_s": round(wall, 2),
        "ttft_mean_ms": _ms(mean(ttft)),
        "ttft_p90_ms": _ms(percentile(ttft, 90)),
        "itl_mean_ms": _ms(mean(itl)),
        "itl_p90_ms": _ms(percentile(itl, 90)),
        "e2e_mean_ms": _ms(mean(e2e)),
        "e2e_p90_ms": _ms(percentile(e2e, 90)),
        "output_tokens_per_s": round(sum(r.output_tokens for r in ok) / wall, 1) if wall else 0.0,
        "served_by": dict(Counter(r.served_by for r in ok)),
    }


async def _json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as r:
        return await r.json()


_DECISION = re.compile(
    r'^llm_d_epp_pd_decision_total\{[^}]*decision_type="([^"]+)"[^}]*\} ([0-9.eE+]+)$', re.M
)
_DECLINED = re.compile(r'^epp_pd_declined_total\{[^}]*profile="([^"]+)"[^}]*\} ([0-9.eE+]+)$', re.M)


async def pd_evidence(fleet: PdFleet, epp: EppProcess) -> dict[str, Any]:
    """What the data path did: prefill legs at the proxies, transfers at the decode engines, the
    EPP's decisions."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        proxies = {hp: await _json(http, f"http://{hp}/pdproxy/state") for hp in fleet.decode_hostports}
        engines = [(await _json(http, f"http://{hp}/sim/state"))["engine"] for hp in fleet.engines]
        async with http.get(f"http://127.0.0.1:{epp.metrics_port}/metrics") as r:
            metrics = await r.text()
    decisions: Counter[str] = Counter()
    for m in _DECISION.finditer(metrics):
        decisions[m.group(1)] += int(float(m.group(2)))
    declined: Counter[str] = Counter()  # declinedProfile configs: which profile served declined requests
    for m in _DECLINED.finditer(metrics):
        declined[m.group(1)] += int(float(m.group(2)))
    return {
        "proxy_prefill_legs": sum(p["prefill_legs"] for p in proxies.values()),
        "proxy_prefill_failures": sum(p["prefill_failures"] for p in proxies.values()),
        # declined requests, and (symmetric fleet) prefill legs passing through a pod's proxy
        "proxy_plain": sum(p["plain"] for p in proxies.values()),
        # a decode pod's proxy sending the prefill leg to itself (exclude-peer-filter prevents it)
        "self_paired": sum(p["prefillers"].get(hp, 0) for hp, p in proxies.items()),
        "decode_kv_transfers": sum(e["kv_transfers"] for e in engines),
        "decode_kv_transfer_failures": sum(e["kv_transfer_failures"] for e in engines),
        "prefill_pod_legs": sum(e["prefill_legs"] for e in engines),
        "epp_pd_decisions": dict(decisions),
        "epp_pd_declined_by_profile": dict(declined),
    }


def modes(non_cached_tokens: int | None) -> dict[str, str]:
    if non_cached_tokens is None:
        return dict(MODES)
    new = f"nonCachedTokens {non_cached_tokens}"
    return {m: re.sub(r"nonCachedTokens \d+", new, t) if m in PREFIX_MODES else t for m, t in MODES.items()}


def epp_config(mode: str, tmp: Path, non_cached_tokens: int | None) -> Path:
    """The mode's config file; for the prefix decider optionally with another threshold."""
    path = CONFIGS / CONFIG_FILES[mode]
    if mode not in PREFIX_MODES or non_cached_tokens is None:
        return path
    doc = yaml.safe_load(path.read_text())
    for plugin in doc["plugins"]:
        if plugin["type"] == "prefix-based-pd-decider":
            plugin["parameters"]["nonCachedTokens"] = non_cached_tokens
    out = tmp / f"pd-{mode}-{non_cached_tokens}.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


async def run_cell(
    mode: str, wl: Workload, st: Settings, tmp: Path, non_cached_tokens: int | None = None
) -> dict[str, Any]:
    n = max(1, round(wl.rate * st.duration_s))
    seq = jobs(wl, n)
    cell: dict[str, Any] = {"mode": mode, "workload": wl.name}
    if mode == "aggregated":
        async with SimFleet(PODS, *sim_args()) as fleet:
            args = [f"--endpoints={','.join(fleet.hostports)}", "--bind-address=127.0.0.1"]
            async with EppProcess(*args) as epp, Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)) as envoy:
                results, wall = await run_open_loop(envoy.url, seq, rate=wl.rate, seed=SEEDS["arrivals"])
        cell.update(summarize(results, wall))
        return cell
    shape = (0, 0, PODS) if mode in SYMMETRIC_MODES else (PREFILL_PODS, PODS - PREFILL_PODS, 0)
    async with PdFleet(shape[0], shape[1], *sim_args(), prefill_decode=shape[2]) as fleet:
        endpoints = fleet.write_endpoints_file(tmp / f"endpoints-{mode}-{wl.name}.yaml")
        args = [
            f"--endpoints-file={endpoints}",
            f"--config-file={epp_config(mode, tmp, non_cached_tokens)}",
            "--bind-address=127.0.0.1",
        ]
        async with EppProcess(*args) as epp, Envoy(EnvoyConfig(ext_proc_port=epp.grpc_port)) as envoy:
            results, wall = await run_open_loop(envoy.url, seq, rate=wl.rate, seed=SEEDS["arrivals"])
            cell.update(summarize(results, wall))
            cell["evidence"] = await pd_evidence(fleet, epp)
    return cell


def _margins(p: dict[str, Any], a: dict[str, Any], g: dict[str, Any]) -> dict[str, float]:
    """Per metric, prefix mode ``p`` against always ``a`` and aggregated ``g``: the margin over the
    worse of the two (> 0: worse than both; < 0: better than the worse one by that much)."""
    out = {}
    for key, lower in METRICS:
        vals = [p.get(key), a.get(key), g.get(key)]
        if any(v is None for v in vals):
            continue
        pv, av, gv = (float(v) for v in vals if v is not None)
        out[key] = round(pv / max(av, gv) - 1 if lower else 1 - pv / min(av, gv), 3)
    return out


def derive(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Ratios to aggregated per workload and metric; where each prefix-based mode is worse than both
    aggregated and always-disaggregate (every margin listed; beyond ``TOLERANCE`` counts)."""
    by = {(c["workload"], c["mode"]): c for c in cells if "failed" not in c}
    ratios: dict[str, dict[str, dict[str, float | None]]] = {}
    worse: list[dict[str, Any]] = []
    verdicts: dict[str, dict[str, dict[str, Any]]] = {}
    for wl in sorted({c["workload"] for c in cells}):
        base = by.get((wl, "aggregated"), {})
        ratios[wl] = {}
        for mode in MODES:
            c = by.get((wl, mode))
            if c is None:
                continue
            ratios[wl][mode] = {
                key: round(c[key] / base[key], 3) if c.get(key) and base.get(key) else None
                for key, _ in METRICS
            }
        a, g = by.get((wl, "always")), base
        for mode in PREFIX_MODES:
            p = by.get((wl, mode))
            if not (p and a and g):
                continue
            margins = _margins(p, a, g)
            for key, margin in margins.items():
                if margin > 0:
                    row = {"workload": wl, "mode": mode, "metric": key, "margin": margin}
                    row.update({"prefix": p[key], "always": a[key], "aggregated": g[key]})
                    worse.append(row)
            worst = max(margins, key=lambda k: margins[k]) if margins else ""
            verdicts.setdefault(mode, {})[wl] = {
                "never_worse_than_both": all(m <= TOLERANCE for m in margins.values()),
                "worst_metric": worst,
                "worst_margin": margins.get(worst),
                "margins": margins,
            }
    beyond = [w for w in worse if w["margin"] > TOLERANCE]
    never = {m: all(v["never_worse_than_both"] for v in wls.values()) for m, wls in verdicts.items()}
    return {
        "ratios_to_aggregated": ratios,
        "prefix_worse_than_both": worse,  # every prefix mode and metric, any margin
        "prefix_worse_than_both_beyond_tolerance": beyond,
        "prefix_never_worse_than_both": not [w for w in beyond if w["mode"] == "prefix"],
        "never_worse_than_both": never,  # per prefix mode, every workload
        "verdicts": verdicts,  # per prefix mode and workload: the margins over the worse of the other two
        "tolerance": TOLERANCE,
    }


def noise(first: dict[str, Any], again: dict[str, Any]) -> dict[str, float | None]:
    """Run-to-run difference of one cell repeated: |again / first - 1| per metric."""
    return {
        key: round(abs(again[key] / first[key] - 1), 3) if first.get(key) and again.get(key) else None
        for key, _ in METRICS
    }


def _log_cell(cell: dict[str, Any]) -> None:
    log(
        f"pd: {cell['workload']:<6} {cell['mode']:<10} "
        f"TTFT mean/p90 {cell['ttft_mean_ms']}/{cell['ttft_p90_ms']} ms  "
        f"ITL mean/p90 {cell['itl_mean_ms']}/{cell['itl_p90_ms']} ms  "
        f"E2E mean {cell['e2e_mean_ms']} ms  {cell['output_tokens_per_s']} tok/s  "
        f"ok {cell['ok']}/{cell['requests']}" + (f"  {cell['evidence']}" if "evidence" in cell else "")
    )


async def _cell(
    m: str, wl: Workload, st: Settings, tmp: Path, non_cached_tokens: int | None
) -> dict[str, Any]:
    log(f"pd: {wl.title}, {modes(non_cached_tokens)[m]}, {wl.rate:g} req/s for {st.duration_s:g} s ...")
    try:
        cell = await run_cell(m, wl, st, tmp, non_cached_tokens)
    except (RuntimeError, OSError, TimeoutError, AssertionError) as e:
        log(f"pd: {wl.name} {m} FAILED: {e}")
        return {"mode": m, "workload": wl.name, "failed": str(e)[-800:]}
    _log_cell(cell)
    return cell


async def run(
    mode: str,
    only: Sequence[str] = (),
    non_cached_tokens: int | None = None,
    only_modes: Sequence[str] = (),
    repeat: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """Every workload x mode once, then the ``repeat`` cells (workload, mode) again for the noise."""
    st = QUICK if mode == "quick" else FULL
    cells: list[dict[str, Any]] = []
    repeats: list[dict[str, Any]] = []
    workloads = {wl.name: wl for wl in st.workloads}
    with tempfile.TemporaryDirectory(prefix="bench-pd-") as d:
        for wl in st.workloads:
            if only and wl.name not in only:
                continue
            for m in MODES:
                if not only_modes or m in only_modes:
                    cells.append(await _cell(m, wl, st, Path(d), non_cached_tokens))
        by = {(c["workload"], c["mode"]): c for c in cells if "failed" not in c}
        for wl_name, m in repeat:
            again = await _cell(m, workloads[wl_name], st, Path(d), non_cached_tokens)
            first = by.get((wl_name, m))
            entry: dict[str, Any] = {"workload": wl_name, "mode": m, "cell": again}
            if first is not None and "failed" not in again:
                entry["noise"] = noise(first, again)
                log(f"pd: repeat {wl_name} {m}: |again/first - 1| = {entry['noise']}")
            repeats.append(entry)
    return {
        "settings": asdict(st),
        "pods": PODS,
        "prefill_pods": PREFILL_PODS,
        "modes": modes(non_cached_tokens),
        "sim_args": sim_args(),
        "cells": cells,
        "repeats": repeats,
        "derived": derive(cells),
        "note": "Measured on a shared 2-core machine under load; the simulator runs in real time "
        "(time_scale 1)",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pd", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workloads", default="", help="comma-separated subset: long, short, shared")
    ap.add_argument("--modes", default="", help=f"comma-separated subset of {', '.join(MODES)}")
    ap.add_argument(
        "--repeat",
        default="",
        help="cells run a second time to measure the noise, comma-separated workload:mode",
    )
    ap.add_argument(
        "--non-cached-tokens",
        type=int,
        default=None,
        help="the prefix deciders' threshold (default: the configs')",
    )
    ap.add_argument("--name", default="", help="result name (default pd, or pd-nct<N> with a threshold)")
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full"
    import uvloop

    only = [x.strip() for x in args.workloads.split(",") if x.strip()]
    only_modes = [x.strip() for x in args.modes.split(",") if x.strip()]
    repeat = [tuple(x.strip().split(":", 1)) for x in args.repeat.split(",") if x.strip()]
    pairs = [(w, m) for w, m in repeat]
    result = uvloop.run(run(mode, only, args.non_cached_tokens, only_modes, pairs))
    result["versions"] = versions()
    result["prefix_non_cached_tokens"] = args.non_cached_tokens or PREFIX_THRESHOLD
    result["symmetric_non_cached_tokens"] = args.non_cached_tokens or SYMMETRIC_THRESHOLD
    result["declined_non_cached_tokens"] = args.non_cached_tokens or DECLINED_THRESHOLD
    name = args.name or ("pd" if args.non_cached_tokens is None else f"pd-nct{args.non_cached_tokens}")
    log(f"pd: wrote {write_result(name, result, mode=mode, seeds=SEEDS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
