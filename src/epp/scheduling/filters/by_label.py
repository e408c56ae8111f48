"""Label filters from llm-d-router: the P/D role filters, ``label-selector-filter`` and ``by-label``.

Roles come from the ``llm-d.ai/role`` label (``epp.datalayer.roles``), which endpoints carry
from their pod in Kubernetes mode and from ``labels:`` in an ``--endpoints-file``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Literal

import structlog
from pydantic import Field, model_validator

from epp.datalayer import roles
from epp.datalayer.api import Endpoint
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

log = structlog.get_logger(__name__)


class _ValuesFilter(PluginBase):
    """Keep endpoints whose ``label`` is one of ``values``; unlabelled ones pass iff ``keep_unlabelled``."""

    label: str = roles.ROLE_LABEL
    values: frozenset[str] = frozenset()
    keep_unlabelled: bool = False

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        label, values, unlabelled = self.label, self.values, self.keep_unlabelled
        out = []
        for ep in endpoints:
            v = ep.metadata.labels.get(label)
            if unlabelled if v is None else v in values:
                out.append(ep)
        return out


class DecodeFilter(_ValuesFilter):
    """Decode-capable endpoints.  Type ``decode-filter``.

    Keeps ``llm-d.ai/role`` in {``decode``, ``prefill-decode``, ``both`` (deprecated),
    ``encode-prefill-decode``} and endpoints without the label (an unlabelled pool is an
    aggregated one: every pod decodes).  Parameters: none.
    """

    TYPE: ClassVar[str] = "decode-filter"
    values = roles.DECODE_VALUES
    keep_unlabelled = True


class PrefillFilter(_ValuesFilter):
    """Prefill-capable endpoints.  Type ``prefill-filter``.

    Keeps ``llm-d.ai/role`` in {``prefill``, ``encode-prefill``, ``prefill-decode``, ``both``,
    ``encode-prefill-decode``}; drops unlabelled endpoints.  Parameters: none.
    """

    TYPE: ClassVar[str] = "prefill-filter"
    values = roles.PREFILL_VALUES


class EncodeFilter(_ValuesFilter):
    """Encode-capable endpoints.  Type ``encode-filter``.

    Keeps ``llm-d.ai/role`` in {``encode``, ``encode-prefill``, ``encode-prefill-decode``};
    drops unlabelled endpoints.  Parameters: none.
    """

    TYPE: ClassVar[str] = "encode-filter"
    values = roles.ENCODE_VALUES


class ByLabelParams(PluginParams):
    label: str = ""
    valid_values: tuple[str, ...] = ()
    allows_no_label: bool = False

    @model_validator(mode="after")
    def _valid(self) -> ByLabelParams:
        if not self.label:
            raise ValueError("invalid configuration for 'by-label' filter: 'label' must be specified")
        if not self.valid_values and not self.allows_no_label:
            raise ValueError(
                "invalid configuration for 'by-label' filter: either 'validValues' must be non-empty "
                "or 'allowsNoLabel' must be true"
            )
        return self


class ByLabelFilter(_ValuesFilter):
    """Deprecated generic label filter.  Type ``by-label`` (use ``label-selector-filter``).

    Parameters: ``label`` (required), ``validValues`` (values kept), ``allowsNoLabel`` (keep
    endpoints without the label); at least one of the last two.
    """

    TYPE: ClassVar[str] = "by-label"
    PARAMS: ClassVar[type[PluginParams]] = ByLabelParams

    def __init__(self, name: str, params: ByLabelParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        log.warning(
            "deprecated_plugin_type",
            plugin=name,
            type=self.TYPE,
            use="label-selector-filter, or decode-filter/prefill-filter/encode-filter for roles",
        )
        self.label = params.label
        self.values = frozenset(params.valid_values)
        self.keep_unlabelled = params.allows_no_label


Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]


class MatchExpression(PluginParams):
    key: str = Field(min_length=1)
    operator: Operator
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values(self) -> MatchExpression:
        # Kubernetes' LabelSelectorAsSelector rules
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"values: must be specified when `operator` is '{self.operator}'")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"values: may not be specified when `operator` is '{self.operator}'")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "Exists":
            return self.key in labels
        if op == "DoesNotExist":
            return self.key not in labels
        v = labels.get(self.key)
        if op == "In":
            return v is not None and v in self.values
        return v is None or v not in self.values  # NotIn: Kubernetes keeps pods without the key


class LabelSelectorParams(PluginParams):
    """A Kubernetes ``metav1.LabelSelector``: every term must hold; empty selects everything."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: tuple[MatchExpression, ...] = ()


class LabelSelectorFilter(PluginBase):
    """Keep endpoints whose labels match a Kubernetes label selector.  Type ``label-selector-filter``.

    Parameters: ``matchLabels`` (``key: value``) and ``matchExpressions`` (``[{key, operator:
    In|NotIn|Exists|DoesNotExist, values}]``), ANDed; an empty selector keeps every endpoint.
    ``NotIn`` keeps endpoints without the key, as Kubernetes does.
    """

    TYPE: ClassVar[str] = "label-selector-filter"
    PARAMS: ClassVar[type[PluginParams]] = LabelSelectorParams

    def __init__(self, name: str, params: LabelSelectorParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self._labels = tuple(params.match_labels.items())
        self._exprs = params.match_expressions

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        pairs, exprs = self._labels, self._exprs
        out = []
        for ep in endpoints:
            labels = ep.metadata.labels
            if all(labels.get(k) == v for k, v in pairs) and all(e.matches(labels) for e in exprs):
                out.append(ep)
        return out


class ByLabelSelectorFilter(LabelSelectorFilter):
    """Deprecated name of ``label-selector-filter``.  Type ``by-label-selector``."""

    TYPE: ClassVar[str] = "by-label-selector"

    def __init__(self, name: str, params: LabelSelectorParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        log.warning("deprecated_plugin_type", plugin=name, type=self.TYPE, use="label-selector-filter")
