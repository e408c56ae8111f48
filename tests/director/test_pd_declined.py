"""``declinedProfile`` through the real loader, builder and director: a declined request is served
whole by the declined profile's pick (any pod, an idle prefill pod too), and everything that follows
the request — in-flight load, the prefix index, the explain record, the span — names that pod."""

from __future__ import annotations

from pathlib import Path

import orjson
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from epp.datalayer.api import Metrics
from epp.director.producers.approx_prefix import ApproxPrefixCacheProducer
from epp.explain.offline import Replay, load_snapshot, replay
from epp.scheduling.profiles.disagg import PREFILLER_HOST_PORT_HEADER
from epp.tracing import spans
from epp.tracing.stages import StageSpans
from tests.director.test_pd import _director

ROOT = Path(__file__).resolve().parents[2]
# The benchmark's config: 2 prefill + 2 decode pods, nonCachedTokens 1024, declinedProfile "whole"
# (no role filter, prefix/queue/kv scorers) — pod-0 and pod-2 prefill, pod-1 and pod-3 decode.
CONFIG = ROOT / "bench" / "configs" / "pd-prefix-declined.yaml"
PREFILL_PODS = {"10.0.0.1:8000", "10.0.0.3:8000"}


def _body(prompt: str) -> bytes:
    return orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 5})


async def test_a_declined_request_runs_on_an_idle_prefill_pod_and_is_recorded_there() -> None:
    """Short prompts, all declined.  The decode pods have queues, the prefill pods none: the
    ``whole`` profile's queue scorer sends the requests to the prefill pods, and the prefix index
    records each prompt on the pod that served it, never on the decode pick it replaced."""
    d, components = _director(CONFIG)
    prefix = next(p for p in components.plugins.values() if isinstance(p, ApproxPrefixCacheProducer))
    by_hostport = {ep.hostport: ep for ep in d._datastore.endpoints()}
    for hostport, ep in by_hostport.items():
        ep.metrics = Metrics(waiting_queue_size=0 if hostport in PREFILL_PODS else 3)
    served: list[str] = []
    for i in range(4):
        lc = d.start({PREFILLER_HOST_PORT_HEADER: "6.6.6.6:666"}, {})
        decision = await lc.route(_body(f"question {i}: " + "short and new " * 10))
        assert PREFILLER_HOST_PORT_HEADER not in dict(decision.headers)
        assert PREFILLER_HOST_PORT_HEADER in decision.remove_headers
        served.append(decision.destination)
    assert set(served) <= PREFILL_PODS, served
    assert set(prefix.index.servers()) == {by_hostport[hp].name for hp in served}


async def test_a_long_new_prompt_is_still_disaggregated() -> None:
    d, _ = _director(CONFIG)
    decision = await d.start({}, {}).route(_body("an entirely new and long prompt " * 200))
    assert decision.destination not in PREFILL_PODS
    assert dict(decision.headers)[PREFILLER_HOST_PORT_HEADER] in PREFILL_PODS


async def test_span_names_the_declined_profile() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    d, _ = _director(CONFIG)
    lc = d.start({}, {})
    lc.ctx.stages = StageSpans(provider.get_tracer("test"), Context())
    await lc.route(_body("trace me, short"))
    (pick,) = [s for s in exporter.get_finished_spans() if s.name == spans.STAGE_PICK]
    attrs = dict(pick.attributes or {})
    assert attrs[spans.ATTR_PD_USED] is False
    assert attrs[spans.ATTR_PD_REASON] == "decider_declined"
    assert attrs[spans.ATTR_PROFILE_HANDLER_DECISION] == "complete_decode-only"
    assert attrs[spans.ATTR_PD_DECLINED_PROFILE] == "whole"


async def test_explain_shows_the_decode_run_and_the_profile_that_served() -> None:
    """The explain record keeps the decode profile's run (what the decider looked at) and the
    ``whole`` run, whose pick is the destination; ``disagg.declinedProfile`` says why."""
    d = await replay(
        Replay(
            config_file=str(CONFIG),
            endpoints=load_snapshot((ROOT / "docs/examples/explain-endpoints-pd.yaml").read_text()),
            body=(ROOT / "docs/examples/explain-body.json").read_bytes(),
        )
    )
    runs = {run["profile"]: run for run in d["profiles"]}
    assert set(runs) == {"decode", "whole"} and d["primaryProfile"] == "whole"
    assert d["destination"] == runs["whole"]["picked"][0]
    assert d["disagg"] == {
        "decisionType": "decode-only",
        "reason": "decider_declined",
        "prefill": "",
        "declinedProfile": "whole",
    }
