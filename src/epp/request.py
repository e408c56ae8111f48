"""The nouns of one inference request as the director and plugins see it (no protobuf here)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from epp.plugin.keys import StateKey

# A bare instance for the hot constructors (``InferenceRequest.received``, ``ResponseInfo.started``).
_new: Final = object.__new__


class ApiKind(enum.StrEnum):
    """Which API a request body speaks; decides validation, prompt extraction and usage fields."""

    COMPLETIONS = "completions"
    CHAT_COMPLETIONS = "chat/completions"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    CONVERSATIONS = "conversations"
    MESSAGES = "messages"  # Anthropic /v1/messages
    GENERATE = "generate"  # token ids in: vLLM /inference/v1/generate, SGLang /generate
    GRPC_GENERATE = "grpc/generate"  # vLLM engine Generate
    GRPC_EMBED = "grpc/embed"  # vLLM engine Embed
    RAW = "raw"  # passthrough: body not parsed


@dataclass(slots=True, kw_only=True)
class RequestBody:
    """A parsed request body.  ``json`` is the decoded object for JSON APIs, else None."""

    api: ApiKind
    raw: bytes
    json: dict[str, Any] | None = None
    prompt_text: str | None = None  # plain-text prompt when the API has one (completions, gRPC text)
    token_ids: Sequence[int] | None = None  # pre-tokenized prompt (gRPC tokenized, completions ids)
    stream: bool = False
    cache_salt: str = ""

    @property
    def model(self) -> str:
        """The ``model`` field of a JSON body, or "" when absent or not a JSON API."""
        if self.json is None:
            return ""
        m = self.json.get("model")
        return m if isinstance(m, str) else ""


@dataclass(slots=True)
class HeaderMutation:
    """Request headers a pre-request plugin sets or removes on the way to the model server.

    Envoy applies ``remove`` before ``set``, so a header both removed and set carries exactly
    the value set here, whatever the client sent.
    """

    set: dict[str, str] = field(default_factory=dict)
    remove: list[str] = field(default_factory=list)


class Evictable(Protocol):
    """An edge able to end its request in the response phase (llm-d-router's eviction channel)."""

    def evict(self) -> None:
        """End the request at the next chance with 429 ``request evicted by flow control``."""
        ...


@dataclass(slots=True, kw_only=True)
class InferenceRequest:
    """One request, built by the ext_proc edge and enriched by the director."""

    request_id: str
    headers: dict[str, str]  # lower-cased keys; values as received
    body: RequestBody | None = None  # None for header-only requests (GET ...)
    incoming_model: str = ""  # model named by the client (empty for non-JSON parsers)
    target_model: str = ""  # model after header / InferenceModelRewrite rewriting
    objective: str = ""  # x-gateway-inference-objective
    priority: int = 0
    fairness_id: str = "default-flow"
    request_size_bytes: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)  # Envoy filter metadata by namespace
    received_at: float = 0.0  # time.monotonic() when the request headers arrived
    explain: bool = False  # keep every candidate's final score (--emit-endpoint-scores)
    # Upstream header changes asked for by pre-request plugins (P/D headers); None for most requests.
    header_mutation: HeaderMutation | None = None
    # In-flight eviction (flowControl.enableEviction): the edge that can end this request while its
    # response streams (the ext_proc session, FULL_DUPLEX_STREAMED response only; None otherwise),
    # and what flow control runs when the stream ends (set only for a request it tracks).
    edge: Evictable | None = None
    on_closed: Callable[[], None] | None = None
    # ``prompt_tokens(self)``, kept by its first call once the body size is known (the director
    # sets ``request_size_bytes`` once, before any plugin runs); -1 until then.  Three plugins
    # of one request read it (~2.2k instructions to compute, ~50 to read).
    prompt_token_count: int = -1

    @classmethod
    def received(
        cls,
        request_id: str,
        headers: dict[str, str],
        metadata: Mapping[str, Any],
        received_at: float,
        objective: str,
        fairness_id: str,
        target_model: str,
    ) -> InferenceRequest:
        """The request as its headers arrive (``Director.start``), every other field at its default.

        Each slot set once on a bare object: calling the class with keywords reaches the
        dataclass ``__init__`` through the type's ``__init__`` slot, which passes them as a dict
        (7.9k instructions a request, 2.8k this way).  tests/test_request.py holds it equal to
        the keyword constructor, every field set.
        """
        r: InferenceRequest = _new(cls)
        r.request_id = request_id
        r.headers = headers
        r.body = None
        r.incoming_model = ""
        r.target_model = target_model
        r.objective = objective
        r.priority = 0
        r.fairness_id = fairness_id
        r.request_size_bytes = 0
        r.metadata = metadata
        r.received_at = received_at
        r.explain = False
        r.header_mutation = None
        r.edge = None
        r.on_closed = None
        r.prompt_token_count = -1
        return r


@dataclass(slots=True)
class Usage:
    """Token usage reported by the model server."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int | None = None


@dataclass(slots=True, kw_only=True)
class ResponseInfo:
    """What response hooks see of the model server's answer so far."""

    request_id: str
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 0
    streaming: bool = False
    usage: Usage | None = None
    end_of_stream: bool = False
    first_chunk_at: float = 0.0  # monotonic time of the first response body byte, 0 if none yet
    completed_at: float = 0.0
    body_bytes: int = 0
    # Dynamic metadata to attach to the final ext_proc message, by namespace.
    dynamic_metadata: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def started(cls, request_id: str, headers: dict[str, str]) -> ResponseInfo:
        """A response as it starts (``ResponseSide``), every other field at its default.

        Each slot set once on a bare object, as ``InferenceRequest.received`` (5.4k instructions
        a request with keywords, ~2k this way); tests/test_request.py holds it equal to the
        keyword constructor.
        """
        r: ResponseInfo = _new(cls)
        r.request_id = request_id
        r.headers = headers
        r.status = 0
        r.streaming = False
        r.usage = None
        r.end_of_stream = False
        r.first_chunk_at = 0.0
        r.completed_at = 0.0
        r.body_bytes = 0
        r.dynamic_metadata = {}
        return r


BYTES_PER_TOKEN: Final = 4  # GIE's SimpleTokenEstimator

# The agent session a request belongs to (llm-d-router's producer-agnostic ``agent-identity``
# request attribute).  Any request-header plugin able to resolve one may put it; the director
# makes it the fairness id when the client sent none, and the session-affinity plugins read it
# as a ``sessionIdConfig`` source.  Here, below both, so each reads the one key.
AGENT_IDENTITY: Final[StateKey[str]] = StateKey("agent-identity")
# The session id ``session-id-producer`` reads from a header or cookie (llm-d-router's
# ``SessionIDDataKey`` attribute), for the session-affinity plugins' ``sessionIdConfig`` too.
SESSION_ID: Final[StateKey[str]] = StateKey("SessionID")

# The request headers a client or gateway sets to steer the EPP.  llm-d-router renamed GIE's
# headers to ``x-llm-d-*`` and still reads the old names as deprecated aliases (its
# ``metadata.headerAliases``); the names here are llm-d's, ``control_header`` reads both.
FAIRNESS_HEADER: Final = "x-llm-d-inference-fairness-id"
OBJECTIVE_HEADER: Final = "x-llm-d-inference-objective"
MODEL_REWRITE_HEADER: Final = "x-llm-d-model-name-rewrite"
# The per-request latency SLO headers of the predictor family and the SLO-deadline ordering.
SLO_TTFT_HEADER: Final = "x-llm-d-slo-ttft-ms"
SLO_TPOT_HEADER: Final = "x-llm-d-slo-tpot-ms"
# Each current name, then its deprecated aliases (GIE's names), all lower case.
HEADER_ALIASES: Final[Mapping[str, tuple[str, ...]]] = {
    FAIRNESS_HEADER: (FAIRNESS_HEADER, "x-gateway-inference-fairness-id"),
    OBJECTIVE_HEADER: (OBJECTIVE_HEADER, "x-gateway-inference-objective"),
    MODEL_REWRITE_HEADER: (MODEL_REWRITE_HEADER, "x-gateway-model-name-rewrite"),
    SLO_TTFT_HEADER: (SLO_TTFT_HEADER, "x-slo-ttft-ms"),
    SLO_TPOT_HEADER: (SLO_TPOT_HEADER, "x-slo-tpot-ms"),
}


def header_names(key: str) -> tuple[str, ...]:
    """The names a control header is read under: the current one first, then its aliases."""
    key = key.lower()
    return HEADER_ALIASES.get(key, (key,))


def control_header(headers: Mapping[str, str], key: str) -> str | None:
    """A control header's value from lower-cased request headers, by any of its names.

    As upstream's ``GetLowerCaseHeaderValue``: the first name *present* wins, so a client
    sending both names gets llm-d's; None when no name is present.
    """
    for name in HEADER_ALIASES.get(key, (key,)):
        value = headers.get(name)
        if value is not None:
            return value
    return None


def prompt_tokens(request: InferenceRequest) -> int:
    """The prompt length estimate of GIE's SimpleTokenEstimator, the one every plugin uses.

    ``max(request_size_bytes // 4, 1)`` once the body size is known, else the token IDs of a
    pre-tokenized prompt, else ``max(1, round(prompt bytes / 4))`` (half away from zero, as Go's
    ``math.Round``); 0 without a body.  The size-based estimate is final (the size is set once)
    and kept on the request (``prompt_token_count``); hot callers read that field first.
    """
    n = request.prompt_token_count
    if n >= 0:
        return n
    size = request.request_size_bytes
    if size > 0:
        n = request.prompt_token_count = size // BYTES_PER_TOKEN or 1  # max(size // 4, 1)
        return n
    body = request.body
    if body is None:
        return 0
    if body.token_ids:
        return len(body.token_ids)
    size = len(body.prompt_text.encode()) if body.prompt_text else 0
    return max(1, (size + BYTES_PER_TOKEN // 2) // BYTES_PER_TOKEN)


def estimate_tokens(request: InferenceRequest) -> int:
    """GIE's SimpleTokenEstimator: input as ``prompt_tokens``, output ≈ 1.5 * input."""
    tokens_in = request.prompt_token_count
    if tokens_in < 0:
        tokens_in = prompt_tokens(request)
    return tokens_in + (3 * tokens_in + 1) // 2  # + round(1.5 * in), half up
