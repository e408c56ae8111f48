"""llm-d's P/D example configs through the real loader, builder and director, on a labelled fleet."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import Components, build
from epp.app.registry import default_registry
from epp.config.load import load_config_file
from epp.datalayer.api import EndpointMetadata
from epp.datalayer.roles import ROLE_LABEL
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.director.producers.approx_prefix import ApproxPrefixCacheProducer
from epp.director.producers.inflight_load import InFlightLoadProducer
from epp.errors import ServiceUnavailable
from epp.scheduling.profiles.disagg import PREFILLER_HOST_PORT_HEADER
from epp.tracing import spans
from epp.tracing.stages import StageSpans

EXAMPLES = Path(__file__).resolve().parents[2] / "config" / "examples"
WELL_LIT = EXAMPLES / "pd-disaggregation.yaml"
SIM = EXAMPLES / "sim-pd-epp-config.yaml"
# pod-0 prefill, pod-1 decode, pod-2 prefill, pod-3 decode
ROLES = ("prefill", "decode", "prefill", "decode")


def _director(path: Path, roles: tuple[str, ...] = ROLES) -> tuple[Director, Components]:
    components = build(load_config_file(path), default_registry())
    ds = Datastore()
    for i, role in enumerate(roles):
        ds.upsert(
            EndpointMetadata(
                name=f"default/pod-{i}-rank-0",
                address=f"10.0.0.{i + 1}",
                port=8000,
                pod_name=f"pod-{i}",
                namespace="default",
                labels={ROLE_LABEL: role},
            )
        )
    for plugin in components.plugins.values():  # the datastore would tell the observers
        for ep in ds.endpoints():
            if hasattr(plugin, "endpoint_added"):
                plugin.endpoint_added(ep)
    pipeline = components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    return Director(ds, pipeline), components


def _body(prompt: str) -> bytes:
    return orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 5})


@pytest.mark.parametrize("path", [WELL_LIT, SIM], ids=["well-lit", "sim-pd-epp-config"])
async def test_example_config_routes_to_decode_and_names_a_prefiller(path: Path) -> None:
    d, _ = _director(path)
    lc = d.start({PREFILLER_HOST_PORT_HEADER: "6.6.6.6:666"}, {})
    decision = await lc.route(_body("a long and entirely new prompt " * 40))
    assert decision.destination in ("10.0.0.2:8000", "10.0.0.4:8000")  # a decode pod
    headers = dict(decision.headers)
    assert headers[PREFILLER_HOST_PORT_HEADER] in ("10.0.0.1:8000", "10.0.0.3:8000")  # a prefill pod
    assert PREFILLER_HOST_PORT_HEADER in decision.remove_headers  # the client's value never passes


async def test_prefix_decider_declines_a_cached_prompt_and_strips_the_client_header() -> None:
    """sim-pd-epp-config: once the decode pod holds the prompt, fewer than 16 tokens are new."""
    d, _ = _director(SIM)
    prompt = "the same prompt every time, long enough for many blocks " * 20
    first = await d.start({}, {}).route(_body(prompt))
    assert PREFILLER_HOST_PORT_HEADER in dict(first.headers)
    lc = d.start({PREFILLER_HOST_PORT_HEADER: "6.6.6.6:666"}, {})
    second = await lc.route(_body(prompt))
    assert second.destination == first.destination  # prefix affinity: same decode pod
    assert PREFILLER_HOST_PORT_HEADER not in dict(second.headers)
    assert PREFILLER_HOST_PORT_HEADER in second.remove_headers


async def test_no_prefill_pod_is_a_503_with_the_dropped_reason() -> None:
    d, _ = _director(WELL_LIT, roles=("decode", "decode"))
    with pytest.raises(ServiceUnavailable) as err:
        await d.start({}, {}).route(_body("hello " * 50))
    assert err.value.reason == "prefill_unavailable"


async def test_prefix_is_recorded_on_both_picks_and_loads_release_at_their_stage() -> None:
    d, components = _director(WELL_LIT)
    prefix = next(p for p in components.plugins.values() if isinstance(p, ApproxPrefixCacheProducer))
    inflight = next(p for p in components.plugins.values() if isinstance(p, InFlightLoadProducer))
    lc = d.start({}, {})
    decision = await lc.route(_body("remember me on both pods " * 40))
    prefill_hostport = dict(decision.headers)[PREFILLER_HOST_PORT_HEADER]
    by_hostport = {ep.hostport: ep for ep in d._datastore.endpoints()}
    decode_ep, prefill_ep = by_hostport[decision.destination], by_hostport[prefill_hostport]
    assert {decode_ep.name, prefill_ep.name} <= set(prefix.index.servers())
    assert inflight.load_of(decode_ep).requests == 1
    assert inflight.load_of(prefill_ep).requests == 1
    lc.response_headers({":status": "200"}, end_of_stream=False)  # the prefill leg is over
    assert inflight.load_of(prefill_ep).requests == 0
    assert inflight.load_of(decode_ep).requests == 1
    lc.response_chunk(b"{}", True)
    lc.close()
    assert inflight.load_of(decode_ep).requests == 0


async def test_sampled_request_carries_llm_ds_pd_span_attributes() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    d, _ = _director(WELL_LIT, roles=("prefill", "decode"))
    lc = d.start({}, {})
    lc.ctx.stages = StageSpans(provider.get_tracer("test"), Context())
    decision = await lc.route(_body("trace me " * 40))
    (pick,) = [s for s in exporter.get_finished_spans() if s.name == spans.STAGE_PICK]
    attrs = dict(pick.attributes or {})
    assert decision.destination == "10.0.0.2:8000"
    assert attrs[spans.ATTR_PD_USED] is True
    assert (attrs[spans.ATTR_PD_PREFILL_ADDRESS], attrs[spans.ATTR_PD_PREFILL_PORT]) == ("10.0.0.1", "8000")
    assert attrs[spans.ATTR_PD_REASON] == "disaggregated"
    assert attrs[spans.ATTR_PROFILE_HANDLER_DECISION] == "complete_prefill-decode"
