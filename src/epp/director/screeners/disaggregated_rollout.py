"""``disaggregatedset-rollout-screener`` (llm-d-router): one ``DisaggregatedSet`` revision per request.

Why: during a ``DisaggregatedSet`` rollout the prefill and decode pods of the old and the new
revision serve side by side, and a prefill pod of one revision must never hand its KV cache to
a decode pod of another (the cache format, the transfer protocol or the driver may differ).  A
filter in each profile cannot promise that: P/D's prefill and decode profiles pick
independently.  So this plugin is a *screener*: it cuts the candidate set once, before every
profile, down to one revision, and no filter, scorer or picker can undo it.

Per request, when no strict header pins the revision (``revisionGating.mode`` ``sum`` or
``max-role``):

1. revisions without a Ready pod for every role of ``requireRoles.values`` are dropped (they
   cannot serve a disaggregated request; an empty pool fails closed with 503);
2. each remaining revision gets a weight: ``sum``, its Ready pods over all required roles;
   ``max-role``, its Ready pods of the one role with the most Ready pods over all covered
   revisions (ties: the first listed role), so a 2P:10D rollout is shaped by decode capacity;
3. one revision is drawn at random by weight and only its endpoints go on.

``headerSelectors`` map a request header to a pod label: a ``strict`` one keeps only the
endpoints whose label equals the header (none: 503, never another revision), and a request
with a strict header is not re-drawn (a second EPP honours the revision the first chose).
``prefer`` selectors only stamp (``header-label-affinity-scorer`` does the preference).
Every selector stamps the serving endpoint's label value on the response header, whatever
the gating mode, so a coordinator can forward the chosen revision.

Difference from upstream: llm-d-router counts Ready pods from a Pod watch of its own on
``scope.labelSelector``; here the counts come from the pool's endpoints (the datastore holds
the pool's Ready pods), filtered by the same selector, so pods outside the InferencePool are
not seen.  A pod with several ranks counts once, as a pod does upstream.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final, Literal

from pydantic import field_validator, model_validator

from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.labels import LabelSelector, parse_label_selector
from epp.metrics.rollout import REVISION_GATING_SHARE, STRICT_HEADER_NO_MATCH
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo

PLUGIN_TYPE: Final = "disaggregatedset-rollout-screener"
DEFAULT_REVISION_LABEL: Final = "disaggregatedset.x-k8s.io/revision"
DEFAULT_ROLE_LABEL: Final = "disaggregatedset.x-k8s.io/role"

SelectorMode = Literal["strict", "prefer"]
GatingMode = Literal["sum", "max-role", "disabled"]


class Scope(PluginParams):
    # Which pool endpoints count towards revision coverage (a Kubernetes label selector).
    label_selector: str = ""


class HeaderSelector(PluginParams):
    name: str = ""  # stable id; the ``selector`` label of the no-match counter
    header_name: str = ""  # lower-cased: request header keys are
    label_key: str = ""
    mode: SelectorMode

    @field_validator("header_name")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


class RequireRoles(PluginParams):
    values: tuple[str, ...] = ()


class RevisionGating(PluginParams):
    revision_label_key: str = DEFAULT_REVISION_LABEL
    role_label_key: str = DEFAULT_ROLE_LABEL
    mode: GatingMode
    require_roles: RequireRoles | None = None

    @field_validator("revision_label_key")
    @classmethod
    def _revision_default(cls, value: str) -> str:
        return value or DEFAULT_REVISION_LABEL  # upstream: empty means the default

    @field_validator("role_label_key")
    @classmethod
    def _role_default(cls, value: str) -> str:
        return value or DEFAULT_ROLE_LABEL

    @property
    def active(self) -> bool:
        """Upstream's ``Active``: ``sum`` / ``max-role`` with roles; ``disabled`` keeps only selectors."""
        return self.mode != "disabled" and self.require_roles is not None


class DisaggregatedSetRolloutParams(PluginParams):
    scope: Scope = Scope()
    header_selectors: tuple[HeaderSelector, ...] = ()
    revision_gating: RevisionGating | None = None

    @model_validator(mode="after")
    def _validate(self) -> DisaggregatedSetRolloutParams:
        """Upstream's ``Config.Validate``, its messages."""
        if not self.scope.label_selector:
            raise ValueError("scope.labelSelector is required")
        try:
            parse_label_selector(self.scope.label_selector)
        except ValueError as e:
            raise ValueError(f"scope.labelSelector is not a valid label selector: {e}") from None
        names: set[str] = set()
        headers: set[str] = set()
        for i, selector in enumerate(self.header_selectors):
            for field, value in (
                ("name", selector.name),
                ("headerName", selector.header_name),
                ("labelKey", selector.label_key),
            ):
                if not value:
                    raise ValueError(f"headerSelectors[{i}].{field} is required")
            if selector.name in names:
                raise ValueError(f"headerSelectors: duplicate name {selector.name!r}")
            names.add(selector.name)
            if selector.header_name in headers:
                raise ValueError(f"headerSelectors: duplicate headerName {selector.header_name!r}")
            headers.add(selector.header_name)
        gating = self.revision_gating
        if gating is None:
            raise ValueError("revisionGating is required")
        if gating.mode != "disabled":
            if gating.require_roles is None:
                raise ValueError(
                    f"revisionGating.requireRoles is required when revisionGating.mode={gating.mode}"
                )
            roles = gating.require_roles.values
            if not roles:
                raise ValueError("revisionGating.requireRoles.values must contain at least one role")
            for i, role in enumerate(roles):
                if not role:
                    raise ValueError(f"revisionGating.requireRoles.values[{i}] must not be empty")
                if role in roles[:i]:
                    raise ValueError(f"revisionGating.requireRoles.values contains duplicate role {role!r}")
        return self


@dataclass(frozen=True, slots=True)
class Distribution:
    """Ready pods per revision and role, and each covered revision's share (absent: 0)."""

    role_counts: Mapping[str, Mapping[str, int]]
    shares: Mapping[str, float]


EMPTY: Final = Distribution({}, {})


def revision_sum_weight(per_role: Mapping[str, int], required: Sequence[str]) -> int | None:
    """Ready pods over the required roles; None when one of them has none (not covered)."""
    weight = 0
    for role in required:
        count = per_role.get(role, 0)
        if count == 0:
            return None
        weight += count
    return weight


def dominant_role(covered: Mapping[str, Mapping[str, int]], required: Sequence[str]) -> str:
    """The required role with the most Ready pods over all covered revisions; ties: listed first."""
    best, best_total = "", -1
    for role in required:
        total = sum(per_role.get(role, 0) for per_role in covered.values())
        if total > best_total:
            best, best_total = role, total
    return best


def distribution(
    role_counts: Mapping[str, Mapping[str, int]], required: Sequence[str], mode: GatingMode
) -> Distribution:
    """The shares of the covered revisions under ``mode`` (``sum`` or ``max-role``)."""
    covered = {rev: c for rev, c in role_counts.items() if revision_sum_weight(c, required) is not None}
    if mode == "max-role":
        role = dominant_role(covered, required)
        weights = {rev: c.get(role, 0) for rev, c in covered.items()}
    else:
        weights = {rev: revision_sum_weight(c, required) or 0 for rev, c in covered.items()}
    total = sum(weights.values())
    shares = {rev: w / total for rev, w in weights.items()} if total > 0 else {}
    return Distribution(role_counts, shares)


def pick_weighted_revision(shares: Mapping[str, float], draw: float) -> str:
    """The revision ``draw`` (in [0, 1)) falls on, revisions in sorted order; "" when none has weight."""
    total = sum(shares.values())
    if total == 0:
        return ""
    revisions = sorted(shares)
    x = draw * total
    cumulative = 0.0
    for revision in revisions:
        cumulative += shares[revision]
        if x < cumulative:
            return revision
    return revisions[-1]


class DisaggregatedSetRolloutScreener(PluginBase):
    """Type ``disaggregatedset-rollout-screener``: a Screener and a ResponseHeaderProcessor.

    Parameters (upstream's): ``scope.labelSelector`` (required), ``headerSelectors`` (``name``,
    ``headerName``, ``labelKey``, ``mode`` strict|prefer), ``revisionGating`` (required:
    ``mode`` sum|max-role|disabled, ``requireRoles.values`` unless disabled,
    ``revisionLabelKey`` / ``roleLabelKey`` defaulting to the ``disaggregatedset.x-k8s.io``
    labels).  Listed under ``plugins:`` only, never in a profile: the director runs it once.
    """

    TYPE: ClassVar[str] = PLUGIN_TYPE
    PARAMS: ClassVar[type[PluginParams]] = DisaggregatedSetRolloutParams

    def __init__(
        self,
        name: str,
        params: DisaggregatedSetRolloutParams,
        handle: Handle,
        *,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name, params, handle)
        gating = params.revision_gating
        assert gating is not None  # the params validator requires it
        self.params = params
        self._scope: LabelSelector = parse_label_selector(params.scope.label_selector)
        self._active = gating.active
        self._mode: GatingMode = gating.mode
        self._required: tuple[str, ...] = gating.require_roles.values if gating.require_roles else ()
        self._revision_key = gating.revision_label_key
        self._role_key = gating.role_label_key
        self._strict = tuple(s for s in params.header_selectors if s.mode == "strict")
        self._rng = rng or random.Random()
        # The pool's metadata objects the distribution was counted from (a label change
        # replaces an endpoint's metadata), so an unchanged pool is not counted again.
        self._counted: tuple[EndpointMetadata, ...] = ()
        self._distribution = EMPTY

    # --- revision coverage, from the pool ---------------------------------------------------
    def distribution_of(self, pool: Sequence[Endpoint]) -> Distribution:
        """The distribution of ``pool`` (counted again only when an endpoint's metadata changed)."""
        counted = self._counted
        if len(counted) == len(pool) and all(m is ep.metadata for m, ep in zip(counted, pool, strict=True)):
            return self._distribution
        pods: dict[tuple[str, str], tuple[str, str]] = {}  # one entry per pod, whatever its ranks
        for ep in pool:
            md = ep.metadata
            labels = md.labels
            revision = labels.get(self._revision_key, "")
            role = labels.get(self._role_key, "")
            if revision and role and self._scope.matches(labels):
                pods[(md.namespace, md.pod_name or md.name)] = (revision, role)
        counts: dict[str, dict[str, int]] = {}
        for revision, role in pods.values():
            per_role = counts.setdefault(revision, {})
            per_role[role] = per_role.get(role, 0) + 1
        new = distribution(counts, self._required, self._mode)
        self._record_shares(self._distribution, new)
        self._counted = tuple(ep.metadata for ep in pool)
        self._distribution = new
        return new

    def _record_shares(self, previous: Distribution, current: Distribution) -> None:
        type_name, name = self.typed_name.type, self.typed_name.name
        for revision in previous.role_counts:
            if revision not in current.role_counts:
                REVISION_GATING_SHARE.remove(type_name, name, self._mode, revision)
        for revision in current.role_counts:
            REVISION_GATING_SHARE.labels(type_name, name, self._mode, revision).set(
                current.shares.get(revision, 0.0)
            )

    # --- Screener ---------------------------------------------------------------------------
    def screen(
        self,
        state: CycleState,
        request: InferenceRequest,
        candidates: Sequence[Endpoint],
        pool: Sequence[Endpoint],
    ) -> Sequence[Endpoint]:
        current = candidates
        if self._active:
            shares = self.distribution_of(pool).shares
            key = self._revision_key
            # Revisions a required role is missing from (or not in the pool at all) have no share.
            allowed = {
                rev: shares[rev] for ep in candidates if (rev := ep.metadata.labels.get(key, "")) in shares
            }
            chosen = (
                ""
                if self._has_strict_header(request)
                else pick_weighted_revision(allowed, self._rng.random())
            )
            current = [
                ep
                for ep in current
                if (rev := ep.metadata.labels.get(key, "")) in allowed and (not chosen or rev == chosen)
            ]
            if not current:
                return ()
        return self._screen_strict(request, current)

    def _has_strict_header(self, request: InferenceRequest) -> bool:
        headers = request.headers
        return any(headers.get(s.header_name) for s in self._strict)

    def _screen_strict(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        current = endpoints
        headers = request.headers
        for selector in self._strict:
            requested = headers.get(selector.header_name)
            if not requested:
                continue
            current = [ep for ep in current if ep.metadata.labels.get(selector.label_key) == requested]
            if not current:
                STRICT_HEADER_NO_MATCH.labels(self.typed_name.type, self.typed_name.name, selector.name).inc()
                return ()
        return current

    # --- ResponseHeaderProcessor ------------------------------------------------------------
    def response_header(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        """Stamp every selector's label of the serving endpoint (prefer ones too, gating or not)."""
        if target is None:
            return
        labels = target.metadata.labels
        for selector in self.params.header_selectors:
            value = labels.get(selector.label_key)
            if value:
                response.headers[selector.header_name] = value
