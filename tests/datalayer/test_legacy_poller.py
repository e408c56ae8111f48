"""The legacy poller (enableLegacyMetrics): wiring from the deprecated flags and GIE's legacy rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epp.datalayer.api import Metrics
from epp.datalayer.engines import ExtractionError
from epp.datalayer.exposition import ExpositionParser
from epp.datalayer.legacy_poller import LEGACY_FETCH_TIMEOUT, LegacyMetricsExtractor, legacy_binding
from epp.datalayer.runtime import DataLayerRuntime
from epp.datalayer.sources.metrics_http import MetricsDataSource, ModelServerMetricsFlags
from epp.datastore.store import Datastore
from epp.plugin.base import NoParams
from epp.testing.waiting import until
from tests.datalayer.conftest import HANDLE, make_endpoint

Flags = ModelServerMetricsFlags  # the one schema of the deprecated flags


def extract(text: bytes, metrics: Metrics | None = None) -> tuple[Metrics, str | None]:
    ext = LegacyMetricsExtractor("legacy", NoParams(), HANDLE)
    ep = make_endpoint()
    if metrics is not None:
        ep.metrics = metrics
    try:
        ext.extract(ExpositionParser(ext.wanted_families()).parse(text), ep)
    except ExtractionError as e:
        return ep.metrics, str(e)
    return ep.metrics, None


def test_binding_from_flags() -> None:
    """The deprecated flags configure the source; the fetch timeout is GIE's 5 s."""
    binding = legacy_binding(Flags(scheme="https", path="/m", insecure_skip_verify=False))
    source = binding.source
    assert isinstance(source, MetricsDataSource)
    assert source.poll_timeout == LEGACY_FETCH_TIMEOUT == 5.0
    assert (source._params.scheme, source._params.path, source._params.insecure_skip_verify) == (
        "https",
        "/m",
        False,
    )
    assert [type(e) for e in binding.extractors] == [LegacyMetricsExtractor]


def test_partial_failure_still_refreshes_update_time() -> None:
    """Missing metrics are errors, yet what was read applies and update_time is refreshed."""
    m, err = extract(b"vllm:num_requests_waiting 4\n", Metrics(running_requests_size=9))
    assert (m.waiting_queue_size, m.running_requests_size) == (4, 9)
    assert m.update_time > 0
    assert err is not None
    assert "vllm:num_requests_running" in err
    assert "vllm:lora_requests_info" in err


def test_lora_rules() -> None:
    """Series with both adapter lists empty are ignored; the largest positive value wins; no trimming."""
    text = (
        b'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 99\n'
        b'vllm:lora_requests_info{max_lora="3",running_lora_adapters="a, b",waiting_lora_adapters=""} 10\n'
        b'vllm:lora_requests_info{max_lora="4",running_lora_adapters="c",waiting_lora_adapters="d"} 20\n'
    )
    m, _ = extract(text)
    assert (m.active_models, m.waiting_models, m.max_active_models) == (frozenset({"c"}), frozenset({"d"}), 4)
    m, _ = extract(text.replace(b"} 20\n", b"} 5\n"))
    assert m.active_models == frozenset({"a", " b"})  # legacy does not trim


def test_lora_absent_series_keeps_previous() -> None:
    """Only empty LoRA series: nothing is picked, no error, previous adapters stay (legacy rule)."""
    before = Metrics(active_models=frozenset({"x"}))
    text = b'vllm:lora_requests_info{running_lora_adapters="",waiting_lora_adapters=""} 9\n'
    m, err = extract(text, before)
    assert m.active_models == frozenset({"x"})
    assert err is not None
    assert "lora" not in err


async def test_legacy_poller_end_to_end(servers: Callable[[int], Any]) -> None:
    """The legacy binding scrapes a vLLM server through the runtime like the new path."""
    (srv,) = await servers(1)
    ds = Datastore()
    async with DataLayerRuntime(ds, [legacy_binding(Flags())], refresh_interval=0.02):
        ep = ds.upsert(srv.endpoint().metadata)
        await until(lambda: ep.metrics.update_time > 0)
    m = ep.metrics
    assert (m.waiting_queue_size, m.running_requests_size, m.cache_block_size, m.cache_num_blocks) == (
        3,
        7,
        16,
        27548,
    )
    assert m.active_models == frozenset({"sql-lora"})
