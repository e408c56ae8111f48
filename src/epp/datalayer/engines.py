"""Metric specs (``name{label=value}``) and the built-in engine tables of gie-inventory §6.5."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from epp.datalayer.api import Metrics
from epp.datalayer.exposition import MetricFamilies, Sample
from epp.plugin.base import PluginParams

DEFAULT_ENGINE_LABEL_KEY: Final = "inference.networking.k8s.io/engine-type"
LLMD_ENGINE_LABEL_KEY: Final = "llm-d.ai/engine-type"  # llm-d-router's name for the same pod label
DEFAULT_ENGINE: Final = "vllm"
RESERVED_ENGINE: Final = "default"  # the fallback mapping's key; no engine may take the name
DEFAULT_CACHE_BLOCK_SIZE_LABEL: Final = "block_size"
DEFAULT_CACHE_NUM_BLOCKS_LABEL: Final = "num_gpu_blocks"


class SpecError(ValueError):
    """A metric specification string cannot be parsed."""


class ExtractionError(ValueError):
    """A spec found no usable series (or a label did not parse); the message says which."""


class CustomMetricParams(PluginParams):
    """One ``customMetrics`` entry: a scalar metric published as an endpoint attribute."""

    attribute_key: str = ""
    metric_spec: str = ""


class EngineTable(PluginParams):
    """One engine's spec strings, as written in ``engineConfigs`` (empty string = disabled).

    The one declaration of an engine table: the built-ins below, ``core-metrics-extractor``'s
    ``engineConfigs`` entries, the legacy poller's vLLM specs and the defaults of the
    deprecated ``--*-metric`` flags are all this model or read from it.
    """

    name: str = ""
    queued_requests_spec: str = ""
    running_requests_spec: str = ""
    kv_usage_spec: str = ""
    lora_spec: str = ""
    cache_info_spec: str = ""
    cache_block_size_label_name: str = ""
    cache_num_blocks_label_name: str = ""
    cache_block_size_spec: str = ""
    cache_num_blocks_spec: str = ""
    custom_metrics: tuple[CustomMetricParams, ...] = ()


BUILTIN_ENGINES: Final = (
    EngineTable(
        name="vllm",
        queued_requests_spec="vllm:num_requests_waiting",
        running_requests_spec="vllm:num_requests_running",
        kv_usage_spec="vllm:kv_cache_usage_perc",
        lora_spec="vllm:lora_requests_info",
        cache_info_spec="vllm:cache_config_info",
    ),
    EngineTable(
        name="sglang",
        queued_requests_spec="sglang:num_queue_reqs",
        running_requests_spec="sglang:num_running_reqs",
        kv_usage_spec="sglang:token_usage",
        cache_info_spec="sglang:cache_config_info",
        cache_block_size_label_name="page_size",
        cache_num_blocks_label_name="num_pages",
    ),
    EngineTable(
        name="trtllm-serve",
        queued_requests_spec="trtllm_num_requests_waiting",
        running_requests_spec="trtllm_num_requests_running",
        kv_usage_spec="trtllm_kv_cache_utilization",
        cache_block_size_spec="trtllm_kv_cache_tokens_per_block",
        cache_num_blocks_spec="trtllm_kv_cache_max_blocks",
    ),
    EngineTable(
        name="triton-tensorrt-llm",
        queued_requests_spec="nv_trt_llm_request_metrics{request_type=waiting}",
        running_requests_spec="nv_trt_llm_request_metrics{request_type=scheduled}",
        kv_usage_spec="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
        cache_block_size_spec="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}",
        cache_num_blocks_spec="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
    ),
)


def builtin_engine(name: str) -> EngineTable:
    """The built-in table of engine ``name``; KeyError if there is none."""
    for table in BUILTIN_ENGINES:
        if table.name == name:
            return table
    raise KeyError(name)


def go_map(labels: Mapping[str, str]) -> str:
    """Labels as Go's ``%v`` prints a map (keys sorted), for error texts that match GIE's."""
    return "map[" + " ".join(f"{k}:{v}" for k, v in sorted(labels.items())) + "]"


_ATOI_RE: Final = re.compile(r"[+-]?[0-9]+\Z")


def atoi(text: str) -> int:
    """Go's ``strconv.Atoi``: optional sign and ASCII digits only, with Go's error text."""
    if (text.isascii() and text.isdecimal()) or _ATOI_RE.match(text):
        return int(text)
    raise ExtractionError(f'strconv.Atoi: parsing "{text}": invalid syntax')


@dataclass(frozen=True, slots=True)
class Spec:
    """A PromQL instant selector reduced to a name and equality matchers (``__`` labels dropped)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        return self.name + "{" + ",".join(f'{k}="{v}"' for k, v in self.labels) + "}"

    def _samples(self, families: MetricFamilies) -> list[Sample]:
        samples = families.family(self.name)
        if samples is None:
            raise ExtractionError(f"metric family {self.name!r} not found")
        if not samples:
            raise ExtractionError(f"no metrics found for {self.name!r}")
        return samples

    def _matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.labels:  # noqa: SIM110 - a loop is cheaper than all() over a generator
            if labels.get(k) != v:
                return False
        return True

    def latest(self, families: MetricFamilies) -> Sample:
        """The matching series with the largest timestamp (no timestamp counts as 0; ties: first)."""
        samples = self._samples(families)
        if not self.labels and len(samples) == 1 and (samples[0].timestamp_ms or 0) >= 0:
            return samples[0]  # the common case: one unlabeled-spec series
        best: Sample | None = None
        recent = -1
        for s in samples:
            ts = s.timestamp_ms or 0
            if ts > recent and self._matches(s.labels):
                recent, best = ts, s
        if best is None:
            raise ExtractionError(
                f"no matching metric found for {self.name!r} with labels {go_map(dict(self.labels))}"
            )
        return best

    def largest_value(self, families: MetricFamilies) -> Sample:
        """The matching series with the largest value: a LoRA info series' value is its creation time."""
        best: Sample | None = None
        recent = -1.0
        for s in self._samples(families):
            if s.value > recent and self._matches(s.labels):
                recent, best = s.value, s
        if best is None:
            raise ExtractionError(
                f"no matching lora metric found for {self.name!r} with labels {go_map(dict(self.labels))}"
            )
        return best


def finite_value(spec: Spec, sample: Sample) -> float:
    """The sample's value; NaN/±Inf are valid exposition but not a queue length or a ratio."""
    if not math.isfinite(sample.value):
        raise ExtractionError(f"metric {str(spec)!r} has non-finite value {sample.value}")
    return sample.value


# --- spec parsing ----------------------------------------------------------------------
_SPEC_NAME_RE: Final = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*")
_LABEL_RE: Final = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*")
_QUOTED_RE: Final = re.compile(r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'|`([^`]*)`', re.DOTALL)
# GIE quotes bare values for the user: label=value means label="value".
_BARE_RE: Final = re.compile(r'[^",}\s]+')
_SEP_RE: Final = re.compile(r"\s*(,|\})\s*")
_SPEC_ESCAPES: Final = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r", "`": "`"}


def _unquote(text: str, spec: str) -> str:
    out: list[str] = []
    i = 0
    while True:
        j = text.find("\\", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        ch = text[j + 1 : j + 2]
        if ch not in _SPEC_ESCAPES:
            raise SpecError(f"invalid metric specification {spec!r}: unknown escape sequence '\\{ch}'")
        out.append(_SPEC_ESCAPES[ch])
        i = j + 2


def parse_spec(text: str) -> Spec | None:
    """Parse ``name`` or ``name{l1=v1,l2="v2"}``; the empty string disables the metric (None).

    Accepts PromQL instant-selector syntax: quoted (``"``, ``'``, backtick) or bare values,
    and ``!=``, ``=~``, ``!~`` matchers, which are parsed and then ignored as in GIE.
    """
    if text == "":
        return None
    m = _SPEC_NAME_RE.match(text)
    if m is None:
        if text.lstrip().startswith("{"):
            raise SpecError(f"empty metric name in specification: {text!r}")
        raise SpecError(f"invalid metric specification {text!r}: expected a metric name")
    name = m.group(1)
    pos = m.end()
    labels: dict[str, str] = {}
    if pos < len(text) and text[pos] == "{":
        pos += 1
        closed = False
        while pos < len(text):
            end = _SEP_RE.match(text, pos)
            if end is not None and end.group(1) == "}":
                pos, closed = end.end(), True
                break
            lm = _LABEL_RE.match(text, pos)
            if lm is None:
                raise SpecError(
                    f"invalid metric specification {text!r}: expected a label matcher at offset {pos}"
                )
            label, op = lm.group(1), lm.group(2)
            pos = lm.end()
            qm = _QUOTED_RE.match(text, pos)
            if qm is not None:
                raw = qm.group(1) if qm.group(1) is not None else qm.group(2)
                value = _unquote(raw, text) if raw is not None else qm.group(3)
                pos = qm.end()
            else:
                bm = _BARE_RE.match(text, pos)
                if bm is None:
                    raise SpecError(
                        f"invalid metric specification {text!r}: expected a value for label {label!r}"
                    )
                value = bm.group(0)
                pos = bm.end()
            if op == "=" and not label.startswith("__"):
                labels[label] = value
            sep = _SEP_RE.match(text, pos)
            if sep is None:
                raise SpecError(
                    f"invalid metric specification {text!r}: expected ',' or '}}' at offset {pos}"
                )
            pos = sep.end()
            if sep.group(1) == "}":
                closed = True
                break
        if not closed:
            raise SpecError(f"invalid metric specification {text!r}: missing '}}'")
    if text[pos:].strip():
        raise SpecError(f"not a valid metric specification: {text!r}")
    return Spec(name, tuple(labels.items()))


@dataclass(frozen=True, slots=True)
class EngineMapping:
    """One engine's parsed specs (None = disabled) and the cache-info label names."""

    queued: Spec | None = None
    running: Spec | None = None
    kv_usage: Spec | None = None
    lora: Spec | None = None
    cache_info: Spec | None = None
    cache_block_size_label: str = DEFAULT_CACHE_BLOCK_SIZE_LABEL
    cache_num_blocks_label: str = DEFAULT_CACHE_NUM_BLOCKS_LABEL
    cache_block_size: Spec | None = None
    cache_num_blocks: Spec | None = None
    custom: tuple[tuple[str, Spec], ...] = ()  # (attributeKey, spec) of each customMetrics entry

    @classmethod
    def from_table(cls, table: EngineTable) -> EngineMapping:
        """Parse every spec of ``table``; all errors are reported together."""
        errors: list[str] = []

        def parse(text: str) -> Spec | None:
            try:
                return parse_spec(text)
            except SpecError as e:
                errors.append(str(e))
                return None

        mapping = cls(
            queued=parse(table.queued_requests_spec),
            running=parse(table.running_requests_spec),
            kv_usage=parse(table.kv_usage_spec),
            lora=parse(table.lora_spec),
            cache_info=parse(table.cache_info_spec),
            cache_block_size_label=table.cache_block_size_label_name or DEFAULT_CACHE_BLOCK_SIZE_LABEL,
            cache_num_blocks_label=table.cache_num_blocks_label_name or DEFAULT_CACHE_NUM_BLOCKS_LABEL,
            cache_block_size=parse(table.cache_block_size_spec),
            cache_num_blocks=parse(table.cache_num_blocks_spec),
            custom=_custom_metrics(table.custom_metrics, errors),
        )
        if errors:
            raise SpecError("; ".join(errors))
        return mapping

    def specs(self) -> tuple[Spec, ...]:
        return tuple(
            s
            for s in (
                self.queued,
                self.running,
                self.kv_usage,
                self.lora,
                self.cache_info,
                self.cache_block_size,
                self.cache_num_blocks,
                *(spec for _, spec in self.custom),
            )
            if s is not None
        )


def _custom_metrics(
    entries: tuple[CustomMetricParams, ...], errors: list[str]
) -> tuple[tuple[str, Spec], ...]:
    """The parsed ``customMetrics`` of one table, with llm-d-router's checks and messages."""
    out: list[tuple[str, Spec]] = []
    seen: set[str] = set()
    for entry in entries:
        key = entry.attribute_key
        if not key:
            errors.append("custom metric attributeKey cannot be empty")
            continue
        if key in seen:
            errors.append(f'custom metric attributeKey "{key}" is duplicated')
            continue
        seen.add(key)
        try:
            spec = parse_spec(entry.metric_spec)
        except SpecError as e:
            errors.append(f'custom metric "{key}": {e}')
            continue
        if spec is None:
            errors.append(f'custom metric "{key}" spec cannot be empty')
            continue
        out.append((key, spec))
    return tuple(out)


# --- building Metrics fast ---------------------------------------------------------------
_METRICS_FIELDS: Final = (
    "waiting_queue_size",
    "running_requests_size",
    "kv_cache_usage_percent",
    "active_models",
    "waiting_models",
    "max_active_models",
    "kv_cache_max_token_capacity",
    "cache_block_size",
    "cache_num_blocks",
    "update_time",
)


def _metrics_builder() -> Callable[..., Metrics]:
    """A positional ``Metrics`` constructor that sets the slots directly.

    The frozen dataclass ``__init__`` costs ~2.5x more (one ``object.__setattr__`` per
    field) and runs on every scrape of every endpoint.  If ``Metrics`` ever gains or
    reorders fields, this falls back to the real constructor rather than guess.
    """
    if tuple(f.name for f in dataclasses.fields(Metrics)) != _METRICS_FIELDS:
        return lambda *values: Metrics(**dict(zip(_METRICS_FIELDS, values, strict=True)))
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9 = (Metrics.__dict__[n].__set__ for n in _METRICS_FIELDS)
    new = object.__new__

    def build(a: Any, b: Any, c: Any, d: Any, e: Any, f: Any, g: Any, h: Any, i: Any, j: Any) -> Metrics:
        m = new(Metrics)
        s0(m, a), s1(m, b), s2(m, c), s3(m, d), s4(m, e), s5(m, f), s6(m, g), s7(m, h), s8(m, i), s9(m, j)
        return m

    return build


# (waiting, running, kv, active, waiting_models, max_active, capacity, block_size, num_blocks, update_time)
build_metrics: Final = _metrics_builder()
