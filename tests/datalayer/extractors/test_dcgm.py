"""dcgm-extractor: llm-d-router's vectors (extractor_test.go) over parsed exposition text."""

from __future__ import annotations

import pytest

from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.datalayer.exposition import ExpositionParser, MetricFamilies
from epp.datalayer.extractors.dcgm import GPU_UTIL_METRIC, GPU_UTILIZATION_KEY, DCGMExtractor
from epp.testing.plugins import build

PARSER = ExpositionParser(None)


def page(*samples: tuple[str, float]) -> MetricFamilies:
    """A DCGM page with one GPU-utilization sample per (pod label, percent); pod "" is unlabeled."""
    lines = [f"# TYPE {GPU_UTIL_METRIC} gauge"]
    for gpu, (pod, value) in enumerate(samples):
        labels = f'gpu="{gpu}"' + (f',pod="{pod}"' if pod else "")
        lines.append(f"{GPU_UTIL_METRIC}{{{labels}}} {value}")
    return PARSER.parse("\n".join(lines).encode() + b"\n")


def endpoint(pod: str = "") -> Endpoint:
    return Endpoint(
        EndpointMetadata(name=f"llm-d/{pod or 'x'}-rank-0", address="10.0.0.1", port=8000, pod_name=pod)
    )


@pytest.mark.parametrize(
    ("pod", "data", "want"),
    [
        pytest.param("", page(("", 73)), 0.73, id="single-GPU"),
        pytest.param("", page(("", 73), ("", 81), ("", 65)), 0.81, id="multi-GPU-takes-max"),
        pytest.param(
            "vllm-pod-2",
            page(("vllm-pod-1", 25), ("vllm-pod-2", 80), ("vllm-pod-3", 10)),
            0.80,
            id="DaemonSet-filters-by-pod",
        ),
        pytest.param(
            "vllm-pod-1",
            page(("vllm-pod-1", 40), ("vllm-pod-1", 70), ("vllm-pod-2", 99)),
            0.70,
            id="DaemonSet-multi-GPU-max",
        ),
        pytest.param("vllm-pod-1", page(("", 55)), 0.55, id="unlabeled-kept-for-a-pod"),
    ],
)
def test_extract(pod: str, data: MetricFamilies, want: float) -> None:
    ext = build(DCGMExtractor)
    ep = endpoint(pod)
    ext.extract(data, ep)
    values = ext.scalar_values(GPU_UTILIZATION_KEY)
    assert values is not None
    assert values[ep] == pytest.approx(want, abs=1e-3)


@pytest.mark.parametrize(
    ("pod", "data", "message"),
    [
        pytest.param("", MetricFamilies(), GPU_UTIL_METRIC, id="missing-metric"),
        pytest.param("", MetricFamilies({GPU_UTIL_METRIC: []}), "no samples", id="empty-samples"),
        pytest.param("missing-pod", page(("vllm-pod-1", 50)), "missing-pod", id="no-matching-pod"),
    ],
)
def test_errors_keep_the_last_value(pod: str, data: MetricFamilies, message: str) -> None:
    """A bad page is an error for the poll and leaves the previous reading in place."""
    ext = build(DCGMExtractor)
    ep = endpoint(pod)
    values = ext.scalar_values(GPU_UTILIZATION_KEY)
    assert values is not None
    with pytest.raises(ValueError, match=message):
        ext.extract(data, ep)
    assert ep not in values
    ext.extract(page(("", 12)), ep)
    with pytest.raises(ValueError, match=message):
        ext.extract(data, ep)
    assert values[ep] == pytest.approx(0.12)


def test_key_type_and_endpoint_removal() -> None:
    """The key names the plugin type whatever the instance is called; a removed endpoint's value goes."""
    ext = build(DCGMExtractor, "my-dcgm")
    assert (ext.typed_name.type, ext.typed_name.name) == ("dcgm-extractor", "my-dcgm")
    assert GPU_UTILIZATION_KEY == "GPUUtilization/dcgm-extractor"
    assert ext.scalar_values("GPUUtilization/my-dcgm") is None
    assert ext.wanted_families() == {GPU_UTIL_METRIC}
    ep = endpoint()
    ext.extract(page(("", 50)), ep)
    ext.endpoint_removed(ep)
    assert ext.scalar_values(GPU_UTILIZATION_KEY) == {}
