"""Deciders of the disaggregation profile handler: should this request get a prefill (or encode) leg?

A decider is a plugin the ``disagg-profile-handler`` names in ``deciders.prefill`` /
``deciders.encode``.  In decode-first order it sees the decode pick, so it can ask how much of
the prompt that endpoint already holds.  Types and parameters are llm-d-router's
(``profilehandler/disagg/*_decider.go``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Protocol, runtime_checkable

import structlog
from pydantic import field_validator

from epp.datalayer import roles
from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import PRECISE_PREFIX_MATCH, PREFIX_MATCH, prefix_matches
from epp.plugin.base import Handle, Plugin, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, prompt_tokens

log = structlog.get_logger(__name__)

MULTIMODAL_PARTS: Final = frozenset({"image_url", "video_url", "input_audio", "audio_url"})


@runtime_checkable
class Decider(Plugin, Protocol):
    """Says whether a request should run a separate stage.

    ``endpoint`` is the decode pick in decode-first order, None in prefill-first order.
    Plain ``def``: it runs inside scheduling, which never awaits.
    """

    def disaggregate(
        self, state: CycleState, request: InferenceRequest, endpoint: Endpoint | None
    ) -> bool: ...


class PrefixBasedPDParams(PluginParams):
    non_cached_tokens: int = 0
    prompt_tokens: int = 0
    # ours: disaggregate only when the decode pick is a dedicated decode pod (see the decider)
    dedicated_decode_only: bool = False

    @field_validator("non_cached_tokens")
    @classmethod
    def _non_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError("nonCachedTokens parameter of prefix disaggregation decider cannot be negative")
        return v

    @field_validator("prompt_tokens")
    @classmethod
    def _prompt_non_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError("promptTokens parameter of prefix disaggregation decider cannot be negative")
        return v


class PrefixBasedPDDecider(PluginBase):
    """Disaggregate when the decode pick would have to prefill many tokens.  Type ``prefix-based-pd-decider``.

    ``hit = match_blocks * block_size`` of the decode pick (what the engine reported holding
    where a precise-prefix-cache-scorer runs, else the approx-prefix producer's
    ``PREFIX_MATCH``: a prefix the approximate index remembers but the engine evicted must be
    prefilled again, so it counts as uncached); disaggregate iff
    ``prompt - hit ≥ nonCachedTokens``.  ``prompt`` is ``prompt_tokens(request)``; below
    ``promptTokens`` (when > 0) or below ``nonCachedTokens`` the request stays local.
    ``nonCachedTokens: 0`` (the default) never disaggregates.  No prefix information for the
    pick → local (logged), as llm-d.
    Parameters: ``nonCachedTokens`` (int ≥ 0, default 0), ``promptTokens`` (int ≥ 0, default 0);
    ours, not llm-d-router's: ``dedicatedDecodeOnly`` (bool, default false) — decline when the
    decode pick also takes prefill work (its ``llm-d.ai/role`` passes ``prefill-filter``:
    ``prefill-decode``, ``both``, ...).  Such a pod keeps mixing prefill chunks into its decode
    steps (other requests' prefill legs), so a prefill leg elsewhere removes no interference and
    only adds a KV transfer: on a fleet of four ``prefill-decode`` pods disaggregating distinct
    5,000-token prompts cost +20 to 22% ITL and E2E against aggregated serving (docs/pd-simulator.md).
    Consumes: ``PREFIX_MATCH`` (adds the ``approx-prefix-cache-producer`` when none is configured);
    reads ``PRECISE_PREFIX_MATCH``.
    """

    TYPE: ClassVar[str] = "prefix-based-pd-decider"
    PARAMS: ClassVar[type[PluginParams]] = PrefixBasedPDParams
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})
    READS: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PRECISE_PREFIX_MATCH})

    def __init__(self, name: str, params: PrefixBasedPDParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.non_cached_tokens = params.non_cached_tokens
        self.min_prompt_tokens = params.prompt_tokens
        self.dedicated_decode_only = params.dedicated_decode_only
        if self.non_cached_tokens == 0:
            log.info("prefix_based_pd_disabled", plugin=name, reason="nonCachedTokens=0")

    def disaggregate(self, state: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
        threshold = self.non_cached_tokens
        if threshold == 0:
            return False
        if endpoint is None:
            log.error("prefix_decider_no_endpoint", request_id=request.request_id)
            return False
        prompt = prompt_tokens(request)
        if self.min_prompt_tokens > 0 and prompt < self.min_prompt_tokens:
            return False
        if prompt < threshold:
            return False
        if self.dedicated_decode_only and roles.serves_prefill(endpoint):
            return False
        info = prefix_matches(state).get(endpoint)
        if info is None:
            log.error("prefix_decider_no_prefix_state", request_id=request.request_id, endpoint=endpoint.name)
            return False
        hit = info.match_blocks * info.block_size_tokens
        return prompt - hit >= threshold


class AlwaysDisaggPDDecider(PluginBase):
    """Every request gets a prefill leg.  Type ``always-disagg-pd-decider``.  Parameters: none."""

    TYPE: ClassVar[str] = "always-disagg-pd-decider"

    def disaggregate(self, state: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
        return True


class AlwaysDisaggMultimodalDecider(PluginBase):
    """Requests with image, video or audio parts get an encode leg.

    Type ``always-disagg-multimodal-decider``.

    True iff a chat message's content holds a part of type ``image_url``, ``video_url``,
    ``input_audio`` or ``audio_url``.  Parameters: none.
    """

    TYPE: ClassVar[str] = "always-disagg-multimodal-decider"

    def disaggregate(self, state: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
        body = request.body
        doc = None if body is None else body.json
        messages = None if doc is None else doc.get("messages")
        if not isinstance(messages, list):
            return False
        for msg in messages:
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and (
                        part.get("type") in MULTIMODAL_PARTS or any(k in part for k in MULTIMODAL_PARTS)
                    ):
                        return True
        return False
