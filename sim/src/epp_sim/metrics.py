"""Prometheus text exposition of an engine, with vLLM's names or SGLang / TRT-LLM / Triton ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from epp_sim.engine import Engine
from epp_sim.stats import Histogram

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    return repr(float(value))


class MetricsRenderer:
    """Renders one engine's /metrics body; histogram text is re-rendered only when it changed."""

    def __init__(self, style: str, model: str, rank: int) -> None:
        self.style = style
        self._model = _escape(model)
        self._rank = rank
        self._hist_cache: dict[str, tuple[Histogram, int, str]] = {}  # name → (histogram, count, text)
        renderers: dict[str, Callable[[Engine], list[str]]] = {
            "vllm": self._vllm,
            "sglang": self._sglang,
            "trtllm": self._trtllm,
            "triton": self._triton,
        }
        self._render = renderers[style]

    def render(self, engine: Engine) -> bytes:
        return "".join(self._render(engine)).encode()

    # ---- building blocks ----------------------------------------------------------------------

    @staticmethod
    def _family(out: list[str], name: str, kind: str, help_text: str) -> None:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")

    def _sample(self, out: list[str], name: str, labels: str, value: float) -> None:
        out.append(f"{name}{{{labels}}} {_num(value)}\n")

    def _histogram(self, out: list[str], name: str, help_text: str, labels: str, hist: Histogram) -> None:
        cached = self._hist_cache.get(name)
        if cached is None or cached[0] is not hist or cached[1] != hist.count:
            lines = [f"# HELP {name} {help_text}\n# TYPE {name} histogram\n"]
            for le, total in zip([*map(_num, hist.bounds), "+Inf"], hist.cumulative(), strict=True):
                lines.append(f'{name}_bucket{{{labels},le="{le}"}} {_num(total)}\n')
            lines.append(f"{name}_count{{{labels}}} {_num(hist.count)}\n")
            lines.append(f"{name}_sum{{{labels}}} {_num(hist.sum)}\n")
            cached = (hist, hist.count, "".join(lines))
            self._hist_cache[name] = cached
        out.append(cached[2])

    # ---- styles -------------------------------------------------------------------------------

    def _vllm(self, engine: Engine) -> list[str]:
        out: list[str] = []
        labels = f'model_name="{self._model}",engine="{self._rank}"'
        stats = engine.stats
        cache = engine.cache
        config = engine.config
        gauge, counter = "gauge", "counter"
        for name, kind, help_text, value in (
            (
                "vllm:num_requests_running",
                gauge,
                "Number of requests in model execution batches.",
                len(engine.running),
            ),
            (
                "vllm:num_requests_waiting",
                gauge,
                "Number of requests waiting to be processed.",
                engine.num_waiting,
            ),
            ("vllm:kv_cache_usage_perc", gauge, "KV-cache usage. 1 means 100 percent usage.", cache.usage),
            (
                "vllm:gpu_cache_usage_perc",
                gauge,
                "GPU KV-cache usage. 1 means 100 percent usage."
                "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                cache.usage,
            ),
        ):
            self._family(out, name, kind, help_text)
            self._sample(out, name, labels, value)
        for name, help_text, value in (
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                stats.prefix_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                stats.prefix_hits,
            ),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens),
        ):
            self._family(out, name, counter, help_text)
            self._sample(out, f"{name}_total", labels, value)
        self._family(out, "vllm:request_success", counter, "Count of successfully processed requests.")
        for reason, count in stats.success.items():
            self._sample(out, "vllm:request_success_total", f'{labels},finished_reason="{reason}"', count)
        self._histogram(
            out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            stats.ttft,
        )
        self._histogram(
            out,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            stats.itl,
        )
        self._histogram(
            out,
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            labels,
            stats.itl,
        )
        self._histogram(
            out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            stats.e2e,
        )
        self._histogram(
            out,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            labels,
            stats.queue_time,
        )
        if config.enable_lora:
            self._family(out, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
            for (running, waiting), ts in stats.lora_info.items() or {("", ""): 0.0}.items():
                lora_labels = (
                    f'max_lora="{config.max_loras}",waiting_lora_adapters="{_escape(waiting)}",'
                    f'running_lora_adapters="{_escape(running)}"'
                )
                self._sample(out, "vllm:lora_requests_info", lora_labels, ts)
        self._family(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
        self._sample(
            out,
            "vllm:cache_config_info",
            f'block_size="{config.block_size}",cache_dtype="auto",'
            f'enable_prefix_caching="{config.enable_prefix_caching}",engine="{self._rank}",'
            f'gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="{config.num_gpu_blocks}",'
            'prefix_caching_hash_algo="xxhash"',
            1,
        )
        return out

    def _sglang(self, engine: Engine) -> list[str]:
        out: list[str] = []
        labels = f'model_name="{self._model}"'
        stats = engine.stats
        config = engine.config
        hit_rate = stats.prefix_hits / stats.prefix_queries if stats.prefix_queries else 0.0
        for name, help_text, value in (
            ("sglang:num_running_reqs", "The number of running requests.", len(engine.running)),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", engine.num_waiting),
            ("sglang:token_usage", "The token usage.", engine.cache.usage),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.", hit_rate),
        ):
            self._family(out, name, "gauge", help_text)
            self._sample(out, name, labels, value)
        self._family(out, "sglang:cache_config_info", "gauge", "Information of the cache config.")
        self._sample(
            out,
            "sglang:cache_config_info",
            f'{labels},page_size="{config.block_size}",num_pages="{config.num_gpu_blocks}"',
            1,
        )
        for name, help_text, value in (
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
            ("sglang:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens),
        ):
            self._family(out, name, "counter", help_text)
            self._sample(out, f"{name}_total", labels, value)
        self._histogram(
            out,
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            stats.ttft,
        )
        self._histogram(
            out,
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            stats.itl,
        )
        self._histogram(
            out,
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            labels,
            stats.e2e,
        )
        return out

    def _trtllm(self, engine: Engine) -> list[str]:
        out: list[str] = []
        labels = f'model_name="{self._model}",engine_type="trtllm"'
        stats = engine.stats
        config = engine.config
        for name, help_text, value in (
            ("trtllm_num_requests_running", "Number of requests currently running.", len(engine.running)),
            (
                "trtllm_num_requests_waiting",
                "Number of requests waiting to be scheduled.",
                engine.num_waiting,
            ),
            ("trtllm_kv_cache_utilization", "KV cache utilization (0..1).", engine.cache.usage),
            ("trtllm_kv_cache_tokens_per_block", "Tokens per KV cache block.", config.block_size),
            ("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks.", config.num_gpu_blocks),
        ):
            self._family(out, name, "gauge", help_text)
            self._sample(out, name, labels, value)
        self._family(out, "trtllm_request_success", "counter", "Count of successfully processed requests.")
        for reason, count in stats.success.items():
            self._sample(out, "trtllm_request_success_total", f'{labels},finished_reason="{reason}"', count)
        self._histogram(
            out,
            "trtllm_time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            stats.ttft,
        )
        self._histogram(
            out,
            "trtllm_time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            labels,
            stats.itl,
        )
        self._histogram(
            out,
            "trtllm_e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            labels,
            stats.e2e,
        )
        return out

    def _triton(self, engine: Engine) -> list[str]:
        out: list[str] = []
        model = f'model="{self._model}",version="1"'
        config = engine.config
        cache = engine.cache
        self._family(out, "nv_trt_llm_request_metrics", "gauge", "TRT LLM request metrics")
        for request_type, value in (
            ("active", len(engine.running) + engine.num_waiting),
            ("context", sum(1 for s in engine.running if s.num_computed < s.prompt_len)),
            ("max", config.max_num_seqs),
            ("scheduled", len(engine.running)),
            ("waiting", engine.num_waiting),
        ):
            self._sample(out, "nv_trt_llm_request_metrics", f'{model},request_type="{request_type}"', value)
        self._family(out, "nv_trt_llm_kv_cache_block_metrics", "gauge", "TRT LLM KV cache block metrics")
        used = cache.num_blocks - cache.free_blocks
        block_metrics: tuple[tuple[str, float], ...] = (
            ("fraction", cache.usage),
            ("free", cache.free_blocks),
            ("max", cache.num_blocks),
            ("tokens_per", cache.block_size),
            ("used", used),
        )
        for block_type, amount in block_metrics:
            self._sample(
                out,
                "nv_trt_llm_kv_cache_block_metrics",
                f'{model},kv_cache_block_type="{block_type}"',
                amount,
            )
        return out
