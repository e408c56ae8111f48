"""``disagg-profile-handler``: llm-d-router's prefill/decode (and encode) disaggregation.

Decode-first (default): run the decode profile; no decode pick ends the request (``failed to
find available decode workers``, 429 as any scheduling failure); then the encode decider and
the prefill decider, each given the decode pick; before the prefill profile runs, the decode
pick is published in the cycle state under ``PEER_ENDPOINT`` (``peer-endpoint``).
Prefill-first: the prefill profile always runs when configured, then encode, then decode with
the prefill pick as the peer endpoint.  The decode result is primary.

Fail closed (llm-d-router PR #2521; its 08-22 snapshot ran such requests decode-only): when
the prefill stage was chosen but its profile found no endpoint, the request fails with 503
and the dropped reason ``prefill_unavailable``, counted as decision ``prefill-unavailable``;
a decider that declined is counted ``decode-only``.

``declinedProfile`` (this project's extension, not llm-d-router's): a scheduling profile that
serves a request whole when the prefill decider declined it, instead of the decode pick.  On a
fleet of dedicated prefill and decode pods it lets a declined request run on any pod able to
serve a whole request (a prefill vLLM with ``kv_role: kv_both`` on the pool port is one), not
only on the decode pods while the prefill pods idle.  The decider still sees the decode pick;
the declined profile's pick becomes the primary (and only) result, so load and prefix
accounting follow the pod that really serves it.  It is not llm-d-router PR #2638's
``profiles.fallback`` (an availability fallback when no decode or required prefill endpoint
exists, which a declined prefill stage does not trigger); the fail-closed 503 is unchanged.

PreRequest writes ``x-prefiller-host-port: <ip>:<port>`` (IPv6 bracketed) of the prefill pick
for the decode-side proxy, and ``x-encoder-hosts-ports`` for encode picks; a client's value of
either header is always stripped first, so a client can never choose a prefiller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import structlog
from pydantic import Field, ValidationInfo, field_validator, model_validator

from epp.datalayer.api import Endpoint
from epp.errors import ServiceUnavailable
from epp.metrics import disagg as metrics
from epp.plugin.base import Handle, Plugin, PluginBase, PluginParams
from epp.plugin.keys import StateKey
from epp.plugin.state import CycleState
from epp.request import HeaderMutation, InferenceRequest
from epp.scheduling.api import DisaggDecision, ProfileRunResult, SchedulerProfileView, SchedulingResult
from epp.scheduling.profiles.deciders import Decider

log = structlog.get_logger(__name__)

PREFILLER_HOST_PORT_HEADER: Final = "x-prefiller-host-port"
ENCODER_HOSTS_PORTS_HEADER: Final = "x-encoder-hosts-ports"
PEER_ENDPOINT: Final[StateKey[Endpoint]] = StateKey("peer-endpoint")
PREFILL_UNAVAILABLE_REASON: Final = "prefill_unavailable"

DECODE_FIRST: Final = "decode-first"
PREFILL_FIRST: Final = "prefill-first"
DEFAULT_DECODE: Final = "decode"
DEFAULT_PREFILL: Final = "prefill"
DEFAULT_ENCODE: Final = "encode"

# reasons (span attribute llm_d.epp.pd.reason and DisaggDecision.reason)
DISAGGREGATED: Final = "disaggregated"
DECIDER_DECLINED: Final = "decider_declined"
NO_PREFILL_DECIDER: Final = "no_prefill_decider"
NO_PREFILL_PROFILE: Final = "no_prefill_profile"
DECLINED_PROFILE_EMPTY: Final = "declined_profile_empty"  # declinedProfile found nothing: decode pick serves

# legacy flat name -> (nested section, key), in llm-d's order of precedence
_LEGACY: Final = {
    "decodeProfile": ("profiles", "decode"),
    "prefillProfile": ("profiles", "prefill"),
    "encodeProfile": ("profiles", "encode"),
    "prefillDeciderPluginName": ("deciders", "prefill"),
    "encodeDeciderPluginName": ("deciders", "encode"),
    "deciderPluginName": ("deciders", "prefill"),  # pd-profile-handler's name; loses to the one above
}


def parse_stage_order(value: str) -> str:
    """llm-d's ParseStageOrder: case, ``-`` and ``_`` ignored; ``decode``/``prefill`` accepted."""
    key = value.replace("-", "").replace("_", "").lower()
    if key in ("", "decodefirst", "decode"):
        return DECODE_FIRST
    if key in ("prefillfirst", "prefill"):
        return PREFILL_FIRST
    raise ValueError(f"invalid stage order {value!r}, must be {DECODE_FIRST!r} or {PREFILL_FIRST!r}")


class ProfileNames(PluginParams):
    decode: str = DEFAULT_DECODE
    prefill: str = DEFAULT_PREFILL
    encode: str = DEFAULT_ENCODE

    @field_validator("decode", "prefill", "encode", mode="before")
    @classmethod
    def _default_when_empty(cls, v: Any, info: ValidationInfo) -> Any:
        return (
            v
            or {"decode": DEFAULT_DECODE, "prefill": DEFAULT_PREFILL, "encode": DEFAULT_ENCODE}[
                str(info.field_name)
            ]
        )


class DeciderNames(PluginParams):
    prefill: str = ""
    encode: str = ""


class DisaggParams(PluginParams):
    """llm-d's nested parameters; the deprecated flat ones are accepted with a warning."""

    stage_order: str = DECODE_FIRST
    profiles: ProfileNames = Field(default_factory=ProfileNames)
    deciders: DeciderNames = Field(default_factory=DeciderNames)
    # ours: the profile that serves a declined request whole ("" = the decode pick serves it)
    declined_profile: str = ""

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or not any(k in _LEGACY for k in data):
            return data
        nested = [k for k in ("profiles", "deciders") if k in data]
        if nested:
            raise ValueError(
                f"use one format exclusively: either nested profiles/deciders or the deprecated flat "
                f"fields (got {nested[0]} with {next(k for k in data if k in _LEGACY)})"
            )
        out: dict[str, Any] = {k: v for k, v in data.items() if k not in _LEGACY}
        sections: dict[str, dict[str, Any]] = {"profiles": {}, "deciders": {}}
        for key, (section, field) in _LEGACY.items():
            value = data.get(key)
            if value and field not in sections[section]:
                log.warning("deprecated_parameter", parameter=key, use=f"{section}.{field}")
                sections[section][field] = value
        log.warning("deprecated_parameter_format", use="nested profiles/deciders")
        return {**out, **sections}

    @field_validator("stage_order", mode="before")
    @classmethod
    def _order(cls, v: Any) -> Any:
        return parse_stage_order(v) if isinstance(v, str) else v

    @field_validator("deciders")
    @classmethod
    def _no_prefill_decider_prefill_first(cls, v: DeciderNames, info: ValidationInfo) -> DeciderNames:
        if v.prefill and info.data.get("stage_order") == PREFILL_FIRST:
            raise ValueError(
                f"prefill decider is not supported in {PREFILL_FIRST} stage order (deciders.prefill)"
            )
        return v

    @model_validator(mode="after")
    def _declined_profile(self) -> DisaggParams:
        name = self.declined_profile
        if not name:
            return self
        if self.stage_order == PREFILL_FIRST:
            raise ValueError(
                f"declinedProfile is not supported in {PREFILL_FIRST} stage order (declinedProfile)"
            )
        if not self.deciders.prefill:
            raise ValueError("declinedProfile needs a prefill decider (deciders.prefill) (declinedProfile)")
        stages = {
            "decode": self.profiles.decode,
            "prefill": self.profiles.prefill,
            "encode": self.profiles.encode,
        }
        for stage, profile in stages.items():
            if name == profile:
                raise ValueError(
                    f"declinedProfile '{name}' is the {stage} profile; it must name a profile of its own "
                    "(declinedProfile)"
                )
        return self


@dataclass(slots=True)
class _Stages:
    """One request's progress through the stages (the scheduler's results are read-only here)."""

    encode: bool | None = None  # None: not decided yet; False: declined
    prefill: bool | None = None
    reason: str = ""
    declined_ran: bool = False  # the declined profile was scheduled


class DisaggProfileHandler(PluginBase):
    """Prefill/decode (and encode) disaggregation.  Type ``disagg-profile-handler``.

    Parameters (llm-d-router's): ``stageOrder`` ``decode-first`` (default) or
    ``prefill-first``; ``profiles.decode|prefill|encode`` (profile names, defaults
    ``decode``/``prefill``/``encode``); ``deciders.prefill``, ``deciders.encode`` (names of
    decider plugins; none = that stage never runs).  The deprecated flat names
    (``decodeProfile``, ``prefillProfile``, ``encodeProfile``, ``prefillDeciderPluginName``,
    ``encodeDeciderPluginName``, ``deciderPluginName``) are read with a warning.  A profile
    that is not configured is a stage that never runs.  See the module docstring for the
    order, fail-closed rule and headers; docs/pd-disaggregation.md for the whole picture.
    Ours: ``declinedProfile`` (decode-first only, needs ``deciders.prefill``), the profile
    that serves a declined request whole; it must be one of the configured profiles.
    """

    TYPE: ClassVar[str] = "disagg-profile-handler"
    PARAMS: ClassVar[type[PluginParams]] = DisaggParams

    def __init__(self, name: str, params: DisaggParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.stage_order = params.stage_order
        self.decode_profile = params.profiles.decode
        self.prefill_profile = params.profiles.prefill
        self.encode_profile = params.profiles.encode
        self._decider_names = params.deciders
        self.declined_profile = params.declined_profile
        self.pd_decider: Decider | None = None
        self.encode_decider: Decider | None = None
        self._key: StateKey[_Stages] = StateKey(f"{name}/{self.TYPE}")

    def bind_plugins(self, lookup: Callable[[str], Plugin | None]) -> None:
        """Resolve the deciders once every plugin exists (llm-d lists them in any order)."""
        for field in ("prefill", "encode"):
            ref = getattr(self._decider_names, field)
            if not ref:
                log.info("disagg_stage_disabled", plugin=self.typed_name.name, stage=field)
                continue
            plugin = lookup(ref)
            if plugin is None:
                raise ValueError(f"deciders.{field} plugin not found: {ref}")
            if not isinstance(plugin, Decider):
                raise TypeError(f"deciders.{field}: plugin {ref} is not a decider")
            setattr(self, "pd_decider" if field == "prefill" else "encode_decider", plugin)

    def check_profiles(self, names: Sequence[str]) -> None:
        """A ``declinedProfile`` that names no configured profile is a typo, not a disabled stage."""
        if self.declined_profile and self.declined_profile not in names:
            raise ValueError(
                f"declinedProfile: scheduling profile '{self.declined_profile}' is not configured "
                f"(have {', '.join(names)})"
            )

    # ProfileHandler -------------------------------------------------------------------
    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileRunResult | None],
    ) -> Sequence[str]:
        st = state.get(self._key)
        if st is None:
            st = _Stages()
            state.put(self._key, st)
        if self.stage_order == PREFILL_FIRST:
            return self._prefill_first(st, state, request, profiles, results)
        return self._decode_first(st, state, request, profiles, results)

    def _decode_first(
        self,
        st: _Stages,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileRunResult | None],
    ) -> Sequence[str]:
        decode = self.decode_profile
        if decode not in results:
            return (decode,) if decode in profiles else ()
        decoded = results[decode]
        if decoded is None or not decoded.target_endpoints:
            return ()  # process_results fails the request
        pick = decoded.target_endpoints[0]
        enc = self.encode_profile
        if st.encode is None and enc in profiles:
            st.encode = self.encode_decider is not None and self.encode_decider.disaggregate(
                state, request, pick
            )
            if st.encode:
                return (enc,)
        pre = self.prefill_profile
        if st.prefill is None:
            if pre not in profiles:
                st.prefill, st.reason = False, NO_PREFILL_PROFILE
            elif self.pd_decider is None:
                st.prefill, st.reason = False, NO_PREFILL_DECIDER
            elif self.pd_decider.disaggregate(state, request, pick):
                st.prefill, st.reason = True, DISAGGREGATED
                state.put(PEER_ENDPOINT, pick)
                return (pre,)
            else:
                st.prefill, st.reason = False, DECIDER_DECLINED
        if self.declined_profile and st.reason == DECIDER_DECLINED and not st.declined_ran:
            st.declined_ran = True
            return (self.declined_profile,)
        return ()

    def _prefill_first(
        self,
        st: _Stages,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileRunResult | None],
    ) -> Sequence[str]:
        decode = self.decode_profile
        if decode in results:
            return ()
        pre = self.prefill_profile
        if st.prefill is None:
            if pre in profiles:
                st.prefill, st.reason = True, DISAGGREGATED
                return (pre,)
            st.prefill, st.reason = False, NO_PREFILL_PROFILE
        enc = self.encode_profile
        if st.encode is None and enc in profiles:
            st.encode = self.encode_decider is not None and self.encode_decider.disaggregate(
                state, request, None
            )
            if st.encode:
                return (enc,)
        if decode not in profiles:
            return ()
        prefilled = results.get(pre)
        if prefilled is not None and prefilled.target_endpoints:
            state.put(PEER_ENDPOINT, prefilled.target_endpoints[0])
        return (decode,)

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileRunResult | None],
    ) -> SchedulingResult:
        decoded = results.get(self.decode_profile)
        if decoded is None or not decoded.target_endpoints:
            raise ValueError("failed to find available decode workers")
        st = state.get(self._key) or _Stages()
        name, type_ = self.typed_name.name, self.TYPE
        pd = self.pd_decider is not None or self.stage_order == PREFILL_FIRST
        prefilled = results.get(self.prefill_profile) if st.prefill else None
        if st.prefill and (prefilled is None or not prefilled.target_endpoints):
            metrics.record_decision(name, type_, request.target_model, metrics.PREFILL_UNAVAILABLE, pd=pd)
            raise ServiceUnavailable(
                f"disaggregation chose a prefill stage but scheduling profile '{self.prefill_profile}' "
                "found no endpoint",
                reason=PREFILL_UNAVAILABLE_REASON,
            )
        encoded = results.get(self.encode_profile) if st.encode else None
        encode_used = encoded is not None and bool(encoded.target_endpoints)
        prefill_used = prefilled is not None
        out: dict[str, ProfileRunResult | None] = {self.decode_profile: decoded}
        if prefilled is not None:
            out[self.prefill_profile] = prefilled
        if encoded is not None and encode_used:
            out[self.encode_profile] = encoded
        decision = metrics.decision_type(encode_used, prefill_used)
        metrics.record_decision(name, type_, request.target_model, decision, pd=pd)
        primary, reason, served = self.decode_profile, st.reason or NO_PREFILL_PROFILE, ""
        if st.declined_ran:
            primary, reason, served = self._serve_declined(out, results, request)
        return SchedulingResult(
            profile_results=out,
            primary_profile_name=primary,
            disagg=DisaggDecision(
                decision_type=decision,
                reason=reason,
                prefill_profile=self.prefill_profile,
                encode_profile=self.encode_profile,
                prefill=prefilled.target_endpoints[0].hostport if prefilled is not None else "",
                declined_profile=served,
            ),
        )

    def _serve_declined(
        self,
        out: dict[str, ProfileRunResult | None],
        results: Mapping[str, ProfileRunResult | None],
        request: InferenceRequest,
    ) -> tuple[str, str, str]:
        """The declined profile's pick replaces the decode pick (the only result, so load and
        prefix accounting land on the pod that serves the request); if it found nothing the
        decode pick serves it, as without ``declinedProfile``."""
        whole = results.get(self.declined_profile)
        model = request.target_model
        if whole is None or not whole.target_endpoints:
            metrics.record_declined(self.typed_name.name, model, self.decode_profile)
            return self.decode_profile, DECLINED_PROFILE_EMPTY, ""
        del out[self.decode_profile]
        out[self.declined_profile] = whole
        metrics.record_declined(self.typed_name.name, model, self.declined_profile)
        return self.declined_profile, DECIDER_DECLINED, self.declined_profile

    # PreRequest -------------------------------------------------------------------------
    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        set_headers: dict[str, str] = {}
        d = result.disagg
        if d is not None and d.prefill:
            set_headers[PREFILLER_HOST_PORT_HEADER] = d.prefill
        encoded = result.profile_results.get(self.encode_profile)
        if encoded is not None and encoded.target_endpoints:
            set_headers[ENCODER_HOSTS_PORTS_HEADER] = ",".join(ep.hostport for ep in encoded.target_endpoints)
        apply_headers(request, set_headers)


def apply_headers(request: InferenceRequest, set_headers: Mapping[str, str]) -> None:
    """Strip both P/D headers from what the client sent, then set ours (Envoy removes before it sets)."""
    for key in (PREFILLER_HOST_PORT_HEADER, ENCODER_HOSTS_PORTS_HEADER):
        request.headers.pop(key, None)
    mutation = request.header_mutation
    if mutation is None:
        mutation = request.header_mutation = HeaderMutation()
    for key in (PREFILLER_HOST_PORT_HEADER, ENCODER_HOSTS_PORTS_HEADER):
        mutation.set.pop(key, None)
        if key not in mutation.remove:
            mutation.remove.append(key)
    mutation.set.update(set_headers)
