"""Engine counters and histograms, recorded in modelled seconds, rendered by `metrics`."""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from typing import Final

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_BUCKETS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS: Final = ("stop", "length", "abort")
_LORA_INFO_SERIES: Final = 16  # label sets kept, like prometheus_client keeps every set it ever saw


class Histogram:
    """Prometheus histogram: `counts[i]` observations in (bounds[i-1], bounds[i]], the last one +Inf."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[int]:
        total = 0
        result = []
        for c in self.counts:
            total += c
            result.append(total)
        return result


class EngineStats:
    """Everything the engine counts; times are modelled seconds (Engine.model_time)."""

    __slots__ = (
        "e2e",
        "generation_tokens",
        "itl",
        "kv_transfer_failures",
        "kv_transfers",
        "lora_info",
        "preemptions",
        "prefill_legs",
        "prefix_hits",
        "prefix_queries",
        "prompt_tokens",
        "queue_time",
        "steps",
        "success",
        "ttft",
    )

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preemptions = 0
        self.steps = 0
        self.prefill_legs = 0  # P/D prefill legs served (kv_transfer_params.do_remote_decode)
        self.kv_transfers = 0  # P/D decode legs whose KV arrived
        self.kv_transfer_failures = 0  # ... and those that timed out waiting for it
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_BUCKETS)
        self.queue_time = Histogram(REQUEST_BUCKETS)
        # (running adapters, waiting adapters) → unix time last seen, as vLLM's set_to_current_time()
        self.lora_info: OrderedDict[tuple[str, str], float] = OrderedDict()

    def record_lora(self, running: str, waiting: str, now: float) -> None:
        key = (running, waiting)
        self.lora_info[key] = now
        self.lora_info.move_to_end(key)
        if len(self.lora_info) > _LORA_INFO_SERIES:
            self.lora_info.popitem(last=False)
