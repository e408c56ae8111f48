"""core-metrics-extractor: engine tables, engine choice, LoRA, cache info, partial updates, errors."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from epp.datalayer.api import Endpoint, Metrics
from epp.datalayer.builtin import BUILTINS
from epp.datalayer.engines import ExtractionError
from epp.datalayer.exposition import ExpositionParser, MetricFamilies
from epp.errors import ConfigError
from epp.plugin.registry import Registry
from tests.datalayer.conftest import HANDLE, VLLM_SMALL, make_endpoint, make_extractor

ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
LLMD_ENGINE_LABEL = "llm-d.ai/engine-type"

SGLANG = b"""# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 4
sglang:num_running_reqs{model_name="m"} 9
sglang:token_usage{model_name="m"} 0.25
sglang:cache_config_info{page_size="32",num_pages="1000"} 1
"""
TRTLLM = b"""trtllm_num_requests_waiting 2
trtllm_num_requests_running 5
trtllm_kv_cache_utilization 0.5
trtllm_kv_cache_tokens_per_block 64
trtllm_kv_cache_max_blocks 4096
"""
TRITON = b"""nv_trt_llm_request_metrics{model="m",request_type="waiting"} 6
nv_trt_llm_request_metrics{model="m",request_type="scheduled"} 8
nv_trt_llm_request_metrics{model="m",request_type="context"} 99
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"} 0.75
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"} 128
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"} 2048
"""


def run(text: bytes, endpoint: Endpoint | None = None, **params: Any) -> tuple[Endpoint, str | None]:
    ext = make_extractor(**params)
    ep = endpoint or make_endpoint()
    data: MetricFamilies = ExpositionParser(ext.wanted_families()).parse(text)
    try:
        ext.extract(data, ep)
    except ExtractionError as e:
        return ep, str(e)
    return ep, None


def fields(m: Metrics) -> tuple[Any, ...]:
    return (
        m.waiting_queue_size,
        m.running_requests_size,
        m.kv_cache_usage_percent,
        m.cache_block_size,
        m.cache_num_blocks,
    )


@pytest.mark.parametrize(
    ("engine", "text", "expected"),
    [
        pytest.param("vllm", VLLM_SMALL, (3, 7, 0.4217, 16, 27548), id="vllm"),
        pytest.param("sglang", SGLANG, (4, 9, 0.25, 32, 1000), id="sglang"),
        pytest.param("trtllm-serve", TRTLLM, (2, 5, 0.5, 64, 4096), id="trtllm-serve"),
        pytest.param("triton-tensorrt-llm", TRITON, (6, 8, 0.75, 128, 2048), id="triton-tensorrt-llm"),
    ],
)
def test_engine_tables(engine: str, text: bytes, expected: tuple[Any, ...]) -> None:
    """Each built-in engine's metrics map onto Metrics, chosen by the endpoint's engine label."""
    ep, err = run(text, make_endpoint(labels={ENGINE_LABEL: engine}))
    assert fields(ep.metrics) == expected
    assert ep.metrics.update_time > 0
    if engine == "vllm":
        assert err is None
    else:
        assert err is None or "lora" not in err


def test_vllm_lora() -> None:
    """LoRA info: the newest series (largest value) gives running/waiting adapters and max_lora."""
    ep, err = run(VLLM_SMALL)
    assert err is None
    assert ep.metrics.active_models == frozenset({"sql-lora"})
    assert ep.metrics.waiting_models == frozenset({"tweet-lora"})
    assert ep.metrics.max_active_models == 4


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        pytest.param({}, 3, id="unlabeled-default-vllm"),
        pytest.param({ENGINE_LABEL: "no-such-engine"}, 3, id="unknown-engine-default"),
        pytest.param({ENGINE_LABEL: "sglang"}, 0, id="labeled-sglang-reads-sglang-names"),
        pytest.param({LLMD_ENGINE_LABEL: "sglang"}, 0, id="llm-d-label-picks-the-table"),
        pytest.param({ENGINE_LABEL: "vllm", LLMD_ENGINE_LABEL: "sglang"}, 3, id="gie-label-wins-over-llm-d"),
    ],
)
def test_engine_choice(labels: dict[str, str], expected: int) -> None:
    """The engine label picks the table; missing or unknown engines fall back to the default."""
    ep, _ = run(VLLM_SMALL, make_endpoint(labels=labels))
    assert ep.metrics.waiting_queue_size == expected


def test_custom_label_key_and_default_engine() -> None:
    """engineLabelKey and defaultEngine are honoured."""
    ep, _ = run(SGLANG, make_endpoint(labels={"x/engine": "sglang"}), engineLabelKey="x/engine")
    assert ep.metrics.waiting_queue_size == 4
    ep, _ = run(SGLANG, defaultEngine="sglang")
    assert ep.metrics.waiting_queue_size == 4
    # A custom key still falls back to the well-known keys, as llm-d-router does for GIE's.
    ep, _ = run(SGLANG, make_endpoint(labels={LLMD_ENGINE_LABEL: "sglang"}), engineLabelKey="x/engine")
    assert ep.metrics.waiting_queue_size == 4


def test_user_engine_replaces_builtin_entirely() -> None:
    """A user engineConfigs entry named like a built-in replaces it (unset specs are disabled)."""
    text = b"my_queue 11\nvllm:num_requests_running 5\n"
    ep, err = run(text, engineConfigs=[{"name": "vllm", "queuedRequestsSpec": "my_queue"}])
    assert ep.metrics.waiting_queue_size == 11
    assert ep.metrics.running_requests_size == 0  # running spec not given: disabled
    assert err is None


def test_user_engine_with_labels_and_total_counter() -> None:
    """A custom spec with label matchers, reading a counter exposed with _total."""
    text = b'reqs_total{state="waiting"} 3\nreqs_total{state="running"} 4\n'
    ep, err = run(
        text,
        make_endpoint(labels={ENGINE_LABEL: "mine"}),
        engineConfigs=[
            {
                "name": "mine",
                "queuedRequestsSpec": "reqs{state=waiting}",
                "runningRequestsSpec": 'reqs{state="running"}',
            }
        ],
    )
    assert (ep.metrics.waiting_queue_size, ep.metrics.running_requests_size, err) == (3, 4, None)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param(
            {"defaultEngine": "nope"}, 'defaultEngine "nope" not found in engineConfigs', id="no-default"
        ),
        pytest.param(
            {"engineConfigs": [{"name": "default"}]}, r'cannot be "default" \(reserved\)', id="reserved"
        ),
        pytest.param(
            {"engineConfigs": [{"queuedRequestsSpec": "x"}]}, "name cannot be empty", id="empty-name"
        ),
        pytest.param(
            {"engineConfigs": [{"name": "e", "kvUsageSpec": "m{"}]},
            'failed to create mapping for engine "e": invalid metric specification',
            id="bad-spec",
        ),
        pytest.param(
            {"engineConfigs": [{"name": "e"}, {"name": "e"}]},
            'mapping for engine type "e" already exists',
            id="duplicate",
        ),
    ],
)
def test_config_errors(params: dict[str, Any], message: str) -> None:
    """Bad parameters fail at build time with GIE's messages."""
    with pytest.raises(ConfigError, match=message):
        make_extractor(**params)


def test_registry_builds_with_camel_case_params() -> None:
    """The registered type builds from YAML-style parameters; unknown keys are rejected."""
    reg = Registry(BUILTINS)
    ext = reg.build(
        name="x",
        type_name="core-metrics-extractor",
        parameters={"defaultEngine": "sglang", "engineConfigs": [{"name": "n", "queuedRequestsSpec": "q"}]},
        handle=HANDLE,
        path="plugins[0]",
    )
    assert "q" in ext.wanted_families()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"plugins\[0\]\.parameters\.bogus"):
        reg.build(
            name="x",
            type_name="core-metrics-extractor",
            parameters={"bogus": 1},
            handle=HANDLE,
            path="plugins[0]",
        )


def test_partial_update_keeps_old_values_and_reports() -> None:
    """Specs that fail keep their last value; the rest update along with update_time; errors are joined."""
    ep = make_endpoint()
    ep.metrics = Metrics(waiting_queue_size=50, running_requests_size=60, cache_num_blocks=7)
    before = time.monotonic()
    ep, err = run(b"vllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc NaN\n", ep)
    m = ep.metrics
    assert (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent) == (2, 60, 0.0)
    assert m.update_time >= before
    assert err is not None
    assert "metric family 'vllm:num_requests_running' not found" in err
    assert "non-finite value nan" in err
    assert "vllm:lora_requests_info" in err


def test_nothing_extracted_leaves_metrics_untouched() -> None:
    """A page with none of the engine's families does not refresh update_time (the endpoint goes stale)."""
    ep = make_endpoint()
    old = ep.metrics
    ep, err = run(b"some_other_metric 1\n", ep)
    assert ep.metrics is old
    assert err is not None


def test_lora_rules() -> None:
    """Adapter lists are trimmed and empty names dropped; a bad max_lora is an error but the rest applies."""
    text = (
        b'vllm:lora_requests_info{max_lora="x",running_lora_adapters=" a , ,b ",waiting_lora_adapters=""} 5\n'
    )
    ep, err = run(text)
    assert ep.metrics.active_models == frozenset({"a", "b"})
    assert ep.metrics.waiting_models == frozenset()
    assert err is not None
    assert 'strconv.Atoi: parsing "x"' in err


def test_cache_info_rules() -> None:
    """Cache info labels parse as ints; the block size is reset first, the block count kept (as GIE)."""
    ep = make_endpoint()
    ep.metrics = Metrics(cache_block_size=99, cache_num_blocks=77)
    ep, err = run(b'vllm:cache_config_info{block_size="",num_gpu_blocks=""} 1\n', ep)
    assert (ep.metrics.cache_block_size, ep.metrics.cache_num_blocks) == (0, 77)
    ep, err = run(b'vllm:cache_config_info{block_size="1.5",num_gpu_blocks="8"} 1\n', ep)
    assert (ep.metrics.cache_block_size, ep.metrics.cache_num_blocks) == (0, 8)
    assert err is not None
    assert 'parsing "1.5"' in err


def test_wanted_families_cover_every_engine() -> None:
    """The source is asked for every engine's families, with _total aliases."""
    wanted = make_extractor().wanted_families()
    for name in (
        "vllm:num_requests_waiting",
        "sglang:token_usage",
        "trtllm_kv_cache_max_blocks",
        "nv_trt_llm_request_metrics",
        "vllm:num_requests_waiting_total",
    ):
        assert name in wanted
    assert not any(n.startswith("vllm:time_to_first_token") for n in wanted)


def test_infinite_queue_is_rejected() -> None:
    """+Inf is not a queue length: the field keeps its value and the error says why."""
    ep, err = run(b"vllm:num_requests_waiting +Inf\n")
    assert ep.metrics.waiting_queue_size == 0
    assert err is not None
    assert "non-finite value inf" in err
    assert not math.isinf(ep.metrics.waiting_queue_size)
