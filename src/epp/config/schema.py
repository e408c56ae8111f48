"""The EndpointPickerConfig file format (GIE ``apix/config/v1alpha1``) as strict pydantic models."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from epp.units import parse_go_duration

API_VERSION: Final = "inference.networking.x-k8s.io/v1alpha1"
# llm-d-router's group (config/llmd.py maps its layout onto this model and keeps its apiVersion).
LLMD_API_VERSION: Final = "llm-d.ai/v1alpha1"
KIND: Final = "EndpointPickerConfig"

# Names GIE falls back to when a reference is omitted (gie-inventory §5.2, §5.5, §5.6, §8.2).
DEFAULT_PARSER: Final = "openai-parser"
DEFAULT_SATURATION_DETECTOR: Final = "utilization-detector"
DEFAULT_ORDERING_POLICY: Final = "fcfs-ordering-policy"
DEFAULT_FAIRNESS_POLICY: Final = "global-strict-fairness-policy"
DEFAULT_USAGE_LIMIT_POLICY: Final = "static-usage-limit-policy"
DEFAULT_BAND_MAX_BYTES: Final = 1_000_000_000


# --- Kubernetes resource.Quantity and Go durations ----------------------------------------------

_QUANTITY = re.compile(
    r"(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?\d+)|(?P<dec>[mkMGTPE]?))"
)
_BINARY_SI: Final = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL_SI: Final = {"": 0, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: object) -> int:
    """A k8s Quantity ("1Gi", "500M", "1e9", 1024) as a non-negative int, rounded up like ``Value()``."""
    if isinstance(value, bool):
        raise PydanticCustomError("quantity", "quantity must be an integer or a string like '1Gi' or '500M'")
    if isinstance(value, int):
        amount = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PydanticCustomError("quantity", "quantity must be finite")
        amount = Decimal(repr(value))
    elif isinstance(value, str):
        m = _QUANTITY.fullmatch(value.strip())
        if m is None:
            raise PydanticCustomError(
                "quantity",
                "invalid quantity '{value}': expected a number with an optional suffix "
                "(Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E, m or an exponent like e9)",
                {"value": value},
            )
        try:
            amount = Decimal(m["num"])
        except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
            raise PydanticCustomError("quantity", "invalid quantity '{value}'", {"value": value}) from None
        if m["bin"]:
            amount *= _BINARY_SI[m["bin"]]
        elif m["exp"]:
            amount = amount.scaleb(int(m["exp"][1:]))
        else:
            amount = amount.scaleb(_DECIMAL_SI[m["dec"] or ""])
    else:
        raise PydanticCustomError("quantity", "quantity must be an integer or a string like '1Gi' or '500M'")
    if amount < 0:
        raise PydanticCustomError(
            "quantity", "quantity must not be negative, got '{value}'", {"value": value}
        )
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def _duration(value: object) -> float:
    if not isinstance(value, str):
        raise PydanticCustomError("duration", "duration must be a string like '30s', '1m30s' or '250ms'")
    try:
        seconds = parse_go_duration(value)
    except ValueError as e:
        raise PydanticCustomError("duration", "{msg}", {"msg": str(e)}) from None
    if seconds < 0:
        raise PydanticCustomError(
            "duration", "duration must not be negative, got '{value}'", {"value": value}
        )
    return seconds


def _none_as_empty(value: object) -> object:
    # ``plugins:`` with nothing after it is null in YAML; Go decodes it as an empty list.
    return () if value is None else value


Quantity = Annotated[int, BeforeValidator(parse_quantity)]
Duration = Annotated[float, BeforeValidator(_duration)]
T = TypeVar("T")
# Lists in the file, tuples in the model (frozen); null means empty.
Seq = Annotated[tuple[T, ...], Field(strict=False), BeforeValidator(_none_as_empty)]


# --- models ----------------------------------------------------------------------------------


class _Model(BaseModel):
    """Strict like GIE's decoder: unknown fields and wrong scalar types are errors; camelCase keys."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


class PluginSpec(_Model):
    """One plugin instance; ``name`` defaults to ``type`` and is what references point at."""

    name: str = ""
    type: str = ""  # missing is reported with GIE's message by the structural check
    parameters: Any = None  # validated later against the plugin type's PARAMS

    @model_validator(mode="before")
    @classmethod
    def _name_defaults_to_type(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("name") in (None, "") and isinstance(data.get("type"), str):
            data = {**data, "name": data["type"]}
        return data


class SchedulingPlugin(_Model):
    """A plugin placed in a profile; ``weight`` matters for scorers only (default 1.0)."""

    plugin_ref: str = ""
    weight: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class SchedulingProfile(_Model):
    name: str = ""
    plugins: Seq[SchedulingPlugin] = ()


class PluginRef(_Model):
    plugin_ref: str = ""


class DataLayerSource(_Model):
    plugin_ref: str
    extractors: Seq[PluginRef] = ()


class DataLayerConfig(_Model):
    sources: Seq[DataLayerSource] = ()
    discovery: PluginRef | None = None  # llm-d-router: a plugin that finds the endpoints (file-discovery)
    # Cross-replica sync (llm-d's names; epp.sync reads them): the syncer plugin, how often
    # it may publish (absent or 0: once per event-loop tick) and where peers come from.
    cross_replica_syncer_plugin_ref: str = ""
    cross_replica_sync_interval: Duration | None = None
    peer_discovery: PluginRef | None = None

    @model_validator(mode="after")
    def _needs_a_source(self) -> DataLayerConfig:
        # GIE's loader accepts this and its runtime then refuses to start (Appendix A #8).
        if not self.sources:
            raise PydanticCustomError(
                "no_sources",
                "data layer enabled but no data sources configured: list at least one source under "
                "dataLayer.sources, or remove dataLayer to get the default metrics-data-source",
            )
        return self


class PriorityBandConfig(_Model):
    """A priority band's limits and policies; unset fields take the defaults of ``resolved()``."""

    priority: int = 0
    max_bytes: Quantity | None = None  # None or 0: DEFAULT_BAND_MAX_BYTES
    max_requests: Quantity | None = None  # None or 0: unlimited
    fairness_policy_ref: str = ""
    ordering_policy_ref: str = ""

    def resolved(self) -> PriorityBandConfig:
        return self.model_copy(
            update={
                "max_bytes": self.max_bytes or DEFAULT_BAND_MAX_BYTES,
                "max_requests": self.max_requests or 0,
                "fairness_policy_ref": self.fairness_policy_ref or DEFAULT_FAIRNESS_POLICY,
                "ordering_policy_ref": self.ordering_policy_ref or DEFAULT_ORDERING_POLICY,
            }
        )


class FlowControlConfig(_Model):
    """Queueing limits and policies; read only when the ``flowControl`` feature gate is on."""

    max_bytes: Quantity | None = None  # global; None or 0: unlimited
    max_requests: Quantity | None = None  # global; None or 0: unlimited
    default_request_ttl: Duration | None = Field(default=None, alias="defaultRequestTTL")  # seconds
    default_priority_band: PriorityBandConfig | None = None
    priority_bands: Seq[PriorityBandConfig] = ()
    usage_limit_policy_plugin_ref: str = ""
    enable_eviction: bool = False  # llm-d-router's in-flight eviction (epp.flowcontrol.eviction)

    def resolved(self) -> FlowControlConfig:
        """Every default made explicit, so the flow-control runtime reads plain values."""
        return self.model_copy(
            update={
                "max_bytes": self.max_bytes or 0,
                "max_requests": self.max_requests or 0,
                "default_request_ttl": self.default_request_ttl or 0.0,
                "default_priority_band": (self.default_priority_band or PriorityBandConfig()).resolved(),
                "priority_bands": tuple(band.resolved() for band in self.priority_bands),
                "usage_limit_policy_plugin_ref": self.usage_limit_policy_plugin_ref
                or DEFAULT_USAGE_LIMIT_POLICY,
            }
        )


class EndpointPickerConfig(_Model):
    """The whole file.  ``None`` sections are defaulted by the builder (gie-inventory §8.2)."""

    api_version: Literal["inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1", "llm-d.ai/v1"]
    kind: Literal["EndpointPickerConfig"]
    feature_gates: Seq[str] = ()
    plugins: Seq[PluginSpec] = ()
    scheduling_profiles: Seq[SchedulingProfile] = ()
    saturation_detector: PluginRef | None = None
    data_layer: DataLayerConfig | None = None
    flow_control: FlowControlConfig | None = None
    parser: PluginRef | None = None
    # llm-d-router's ``requestHandler.parsers`` when it lists several (set by llmd.py's
    # ``to_gie``; not a field of GIE's file, so never decoded from one).
    _parsers: tuple[PluginRef, ...] = PrivateAttr(default=())

    @property
    def parsers(self) -> tuple[PluginRef, ...]:
        return self._parsers

    def with_parsers(self, parsers: Sequence[PluginRef]) -> EndpointPickerConfig:
        """This config resolving requests over ``parsers`` (in order) instead of ``parser``."""
        self._parsers = tuple(parsers)
        return self
