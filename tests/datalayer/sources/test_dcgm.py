"""dcgm-data-source: parameters, where it scrapes, its interval, and a DCGM exporter page end to end.

The exporter is a real HTTP server serving ``data/dcgm_exporter.txt``: a node of four H100s in
dcgm-exporter's format and default counters, as a DaemonSet with ``DCGM_EXPORTER_KUBERNETES``
reports it (GPUs 0-1 serve pod vllm-0 at 73 % and 81 %, GPU 2 pod vllm-1 at 40 %, GPU 3 is
free and carries no pod labels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import build as build_components
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import EndpointMetadata, SourceBinding
from epp.datalayer.extractors.dcgm import GPU_UTIL_METRIC, GPU_UTILIZATION_KEY, DCGMExtractor
from epp.datalayer.runtime import DataLayerRuntime, period_ticks
from epp.datalayer.sources.dcgm import DCGMDataSource, DCGMDataSourceParams
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.health import Status
from epp.plugin.state import CycleState
from epp.scheduling.filters.endpoint_attribute import EndpointAttributeFilter
from epp.scheduling.scorers.endpoint_attribute import EndpointAttributeScorer
from epp.testing.builders import make_request
from epp.testing.plugins import FakeHandle, build
from epp.testing.waiting import until
from tests.config.test_real_configs import CORPUS
from tests.datalayer.conftest import DATA, make_endpoint, make_extractor, make_source

DCGM_PAGE = (DATA / "dcgm_exporter.txt").read_bytes()
UNROUTABLE = "10.255.255.1"  # a pod IP nothing answers on: a scrape that went there would fail


@pytest.mark.parametrize(
    ("params", "field", "value"),
    [
        pytest.param({}, "scheme", "http", id="default-scheme"),
        pytest.param({}, "path", "/metrics", id="default-path"),
        pytest.param({}, "port", 9400, id="default-port"),
        pytest.param({}, "insecure_skip_verify", True, id="default-insecure"),
        pytest.param({}, "use_node_address", False, id="default-sidecar"),
        pytest.param({}, "interval", None, id="default-every-tick"),
        pytest.param({"interval": ""}, "interval", None, id="empty-interval"),
        pytest.param({"interval": "1s"}, "interval", 1.0, id="interval"),
        pytest.param(
            {
                "scheme": "https",
                "path": "/gpu",
                "port": 9500,
                "insecureSkipVerify": False,
                "useNodeAddress": True,
            },
            "port",
            9500,
            id="custom",
        ),
    ],
)
def test_params(params: dict[str, Any], field: str, value: Any) -> None:
    """Upstream's parameters and defaults (datasource.go, datasource_test.go)."""
    assert getattr(DCGMDataSourceParams.model_validate(params), field) == value


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"scheme": "grpc"}, "unsupported scheme: grpc", id="scheme"),
        pytest.param({"scheme": "http", "bogus": "value"}, "bogus\n  Extra inputs", id="unknown-field"),
        pytest.param(
            {"interval": "soon"}, 'interval\n  Value error, time: invalid duration "soon"', id="interval"
        ),
        pytest.param({"port": 70000}, "port\n", id="port"),
    ],
)
def test_param_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DCGMDataSourceParams.model_validate(params)


@pytest.mark.parametrize(
    ("interval", "base", "ticks"),
    [
        (None, 0.05, 1),
        (-1.0, 0.05, 1),
        (0.05, 0.05, 1),
        (1.0, 0.05, 20),
        (5.0, 0.05, 100),
        (0.075, 0.05, 2),
        (0.13, 0.05, 3),
        (0.12, 0.05, 2),
        (0.025, 0.05, 1),
        (0.125, 0.05, 3),  # half away from zero, as Go's math.Round
    ],
)
def test_period_ticks(interval: float | None, base: float, ticks: int) -> None:
    """llm-d-router's TestPeriodTicks (interval_dispatcher_test.go)."""
    assert period_ticks(interval, base) == ticks


def test_period_ticks_needs_a_base() -> None:
    with pytest.raises(ValueError, match="base tick must be positive"):
        period_ticks(1.0, 0)


def _source(**params: Any) -> DCGMDataSource:
    source = build(DCGMDataSource, "dcgm-source", **params)
    source.bind([build(DCGMExtractor)])
    return source


async def test_sidecar_scrapes_the_pod_ip_on_the_exporter_port(servers: Callable[[int], Any]) -> None:
    """Sidecar: pod IP and ``port``; only the GPU-utilization family is parsed."""
    (exporter,) = await servers(1)
    exporter.behaviour.body = DCGM_PAGE
    source = _source(port=exporter.port, interval="1s")
    assert source.poll_interval == 1.0
    await source.start()
    try:
        fams = await source.poll(make_endpoint(port=1, metrics_port=2))
        assert set(fams) == {GPU_UTIL_METRIC}
        assert [s.value for s in fams[GPU_UTIL_METRIC]] == [73.0, 81.0, 40.0, 0.0]
        port_zero = _source(port=0)  # 0: the endpoint's own metrics port
        await port_zero.start()
        try:
            assert GPU_UTIL_METRIC in await port_zero.poll(make_endpoint(port=1, metrics_port=exporter.port))
        finally:
            await port_zero.stop()
        assert exporter.behaviour.requests == 2
    finally:
        await source.stop()


async def test_node_address_scrapes_the_node(servers: Callable[[int], Any]) -> None:
    """DaemonSet: the node's IP, never the pod's; an endpoint without one is an error naming the field."""
    (exporter,) = await servers(1)
    exporter.behaviour.body = DCGM_PAGE
    source = _source(port=exporter.port, useNodeAddress=True, timeout="2s")
    await source.start()
    try:
        on_node = make_endpoint(address=UNROUTABLE, node_address="127.0.0.1", pod_name="vllm-0")
        assert GPU_UTIL_METRIC in await source.poll(on_node)
        with pytest.raises(ValueError, match=r"useNodeAddress: endpoint .* has no node address"):
            await source.poll(make_endpoint(address=UNROUTABLE))
    finally:
        await source.stop()


async def test_daemonset_page_routes_through_filter_and_scorer(servers: Callable[[int], Any]) -> None:
    """The runtime scrapes one node exporter for two pods every ``interval``; the filter and scorer read it.

    Base tick 10 ms, interval 50 ms: the exporter is asked once per five ticks per endpoint.
    """
    (exporter,) = await servers(1)
    exporter.behaviour.body = DCGM_PAGE
    source = build(DCGMDataSource, "dcgm-source", port=exporter.port, useNodeAddress=True, interval="50ms")
    extractor = build(DCGMExtractor)
    ds = Datastore()
    for pod in ("vllm-0", "vllm-1"):
        ds.upsert(
            EndpointMetadata(
                name=f"llm-d/{pod}-rank-0",
                address=UNROUTABLE,
                port=8000,
                pod_name=pod,
                node_address="127.0.0.1",
            )
        )
    eps = list(ds.endpoints())
    values = extractor.scalar_values(GPU_UTILIZATION_KEY)
    assert values is not None
    async with DataLayerRuntime(ds, [SourceBinding(source, (extractor,))], refresh_interval=0.01) as runtime:
        await until(lambda: all(ep in values for ep in eps), what="both pods' GPU utilization")
        await until(lambda: all((s := runtime.stats(ep)) is not None and s.ticks >= 40 for ep in eps))
        ticks = sum(s.ticks for ep in eps if (s := runtime.stats(ep)) is not None)
        asked = exporter.behaviour.requests
    assert [values[ep] for ep in eps] == [pytest.approx(0.81), pytest.approx(0.40)]
    assert ticks / 5 - 2 <= asked <= ticks / 5 + 2

    handle = FakeHandle([extractor])
    f = build(
        EndpointAttributeFilter,
        handle=handle,
        attribute=GPU_UTILIZATION_KEY,
        algorithm={"type": "threshold", "threshold": {"operator": "LessThanOrEqual", "value": 0.5}},
    )
    scorer = build(
        EndpointAttributeScorer,
        handle=handle,
        attributeKey=GPU_UTILIZATION_KEY,
        algorithm={
            "type": "linear_lower_is_better",
            "normalization": {"fixedRange": {"min": 0.0, "max": 1.0}},
        },
    )
    assert list(f.filter(CycleState(), make_request(), eps)) == [eps[1]]
    assert list(scorer.score(CycleState(), make_request(), eps)) == [pytest.approx(0.19), pytest.approx(0.60)]


async def test_a_down_exporter_is_no_endpoint_health_signal(servers: Callable[[int], Any]) -> None:
    """Refused DCGM polls are data errors only: the model server, scraped fine, stays healthy and reachable."""
    model_server, exporter = await servers(2)
    gone = exporter.port
    await exporter.stop()
    dcgm = build(DCGMDataSource, "dcgm-source", port=gone)
    bindings = [
        SourceBinding(make_source(), (make_extractor(),)),
        SourceBinding(dcgm, (build(DCGMExtractor),)),
    ]
    ds = Datastore()
    async with DataLayerRuntime(ds, bindings, refresh_interval=0.01) as runtime:
        ep = ds.upsert(EndpointMetadata(name="pod-0", address="127.0.0.1", port=model_server.port))
        await until(lambda: (s := runtime.stats(ep)) is not None and s.failures >= 5)
        stats = runtime.stats(ep)
        assert stats is not None
        assert "dcgm-source" in stats.last_error
        assert ep.metrics.update_time > 0
        assert not ep.health.unreachable
        assert ep.health.status is Status.HEALTHY
        assert ep.health.scrape_usual > 0  # the model server's scrapes are what health heard
    dcgm_only = build(DCGMDataSource, "dcgm-source", port=gone)
    ds = Datastore()
    async with DataLayerRuntime(
        ds, [SourceBinding(dcgm_only, (build(DCGMExtractor),))], refresh_interval=0.01
    ) as rt:
        ep = ds.upsert(EndpointMetadata(name="pod-1", address="127.0.0.1", port=model_server.port))
        await until(lambda: (s := rt.stats(ep)) is not None and s.failures >= 5)
        assert not ep.health.unreachable
        assert ep.health.scrape_usual == 0


async def test_llmd_gpu_config_routes_to_the_less_busy_gpu(servers: Callable[[int], Any]) -> None:
    """llm-d-router v0.10.0's sim-epp-gpu-config.yaml, unchanged but for the exporter's port: built,
    its data layer scraping the exporter page (and, for kv-cache-utilization-scorer, the model
    servers' equal vLLM pages), a request goes to the pod whose GPUs are less busy."""
    exporter, busy, idle = await servers(3)
    exporter.behaviour.body = DCGM_PAGE
    text = (CORPUS / "llmd-router-v0.10.0--sim-epp-gpu-config.yaml").read_text()
    assert "port: 9400" in text
    components = build_components(
        load_config(text.replace("port: 9400", f"port: {exporter.port}")), default_registry()
    )
    (binding,) = [b for b in components.data_sources if isinstance(b.source, DCGMDataSource)]
    assert isinstance(binding.source, DCGMDataSource) and binding.source.poll_interval == 1.0
    (extractor,) = binding.extractors
    assert isinstance(extractor, DCGMExtractor)
    values = extractor.scalar_values(GPU_UTILIZATION_KEY)
    assert values is not None
    ds = Datastore()
    eps = [
        ds.upsert(EndpointMetadata(name=f"llm-d/{pod}-rank-0", address="127.0.0.1", port=port, pod_name=pod))
        for pod, port in (("vllm-0", busy.port), ("vllm-1", idle.port))
    ]
    director = Director(
        ds, components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    )
    async with DataLayerRuntime(ds, components.data_sources, refresh_interval=0.02):
        await until(lambda: all(ep in values for ep in eps), what="both pods' GPU utilization")
        await until(lambda: all(ep.metrics.update_time > 0 for ep in eps), what="both pods' metrics")
        body = orjson.dumps({"model": "m", "prompt": "route me", "max_tokens": 5})
        decision = await director.start({}, {}).route(body)
    assert decision.destination.split(",")[0] == f"127.0.0.1:{idle.port}"  # vllm-1: 40 % against 81 %
    assert all(ep.metrics.update_time > 0 for ep in eps)
