"""``token-producer`` (llm-d-router; the older type name ``tokenizer`` loads with a deprecation warning).

llm-d's prefix, context-length and P/D plugins read the prompt's tokens that this producer writes.
Here the tokens go on the request body (``RequestBody.token_ids``, as a pre-tokenised prompt
would): every reader of the prompt length (``request.prompt_tokens``) and the precise prefix
scorer (which then does not tokenise again) use them; without them they estimate, body bytes / 4.

Backends, as llm-d-router selects them (one at most, else a configuration error):

* ``estimate`` (the default): no tokenizer.  Writes nothing; the readers' own bytes/4 estimate
  is upstream's byte packing for text (the ``image`` / ``video`` placeholder tunables are
  validated and accepted, multimodal estimation is not done here).
* ``vllm`` (or ``modelName`` alone): vLLM's ``/v1/completions/render`` and
  ``/v1/chat/completions/render`` at ``vllm.url`` (default ``http://localhost:8000``, a render
  sidecar), ``vllm.timeout`` (5s) and ``vllm.mmTimeout`` (30s, requests with content parts).
  ``/tokenize`` on a server without the render API.  Unreachable: as upstream, each request is
  logged and goes on without tokens (the readers estimate); counted in ``/debug/plugins/state``,
  and a warning at start when the first render fails.  Ours: after 3 failures in a row the
  backend is skipped for 1 s (doubling to 30 s while it keeps failing), so a dead render service
  does not spend every request's producer budget waiting.
* ``udsTokenizerConfig`` (``socketFile``, ``useTCP``, ``modelTokenizerMap``; deprecated upstream,
  warned): llm-d-kv-cache's gRPC tokenizer sidecar.  It must answer ``InitializeTokenizer`` at
  start (5 attempts, as upstream), else the EPP does not start.  An empty ``socketFile`` does not
  select it (upstream's ``IsEnabled``).
* ``local`` (``autoDiscoveryDir``, ``autoDiscoveryTokenizerFileName``, ``modelTokenizerMap``) and
  ``hf`` (``enabled``, ``huggingFaceToken``, ``tokenizersCacheDir``): llm-d-kv-cache's tokenizer
  pool settings, a ``tokenizer.json`` for ``modelName`` loaded in process (the ``epp[tokenizers]``
  extra).  Not found: a configuration error naming the places searched (the EPP does not
  download from the Hub: put the tokenizer in the cache directory).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, ClassVar

import structlog
from pydantic import Field, model_validator

from epp.datalayer.api import Endpoint
from epp.datalayer.kvevents.tokenizers import (
    RenderTokenizer,
    UdsTokenizer,
    find_hf_cached,
    find_local,
    parse_duration,
)
from epp.datalayer.kvevents.tokens import TOKENIZED_PROMPT, LocalTokenizer, TokenSource
from epp.errors import ConfigError
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

log = structlog.get_logger(__name__)

_FAILURES_TO_BACK_OFF = 3  # consecutive failed calls before the backend is skipped for a while
_BACKOFF_FIRST = 1.0  # seconds; doubled on each further round of failures
_BACKOFF_MAX = 30.0

_MODES = {
    ("image", "mode"): ("dynamic", "static"),
    ("video", "tokensPerFrame", "mode"): ("dynamic", "static"),
    ("video", "frames", "mode"): ("sampled", "strided"),
}


class VllmConfig(PluginParams):
    url: str = "http://localhost:8000"
    timeout: str = "5s"  # Go duration
    mm_timeout: str = "30s"


class UdsTokenizerConfig(PluginParams):
    socket_file: str = ""  # "" leaves the backend off (upstream's IsEnabled)
    use_tcp: bool = Field(default=False, alias="useTCP")  # socketFile is host:port (tests)
    model_tokenizer_map: dict[str, str] = Field(default_factory=dict)


class LocalTokenizerConfig(PluginParams):
    auto_discovery_dir: str = ""  # "": $LOCAL_TOKENIZER_DIR, else /mnt/models
    auto_discovery_tokenizer_file_name: str = ""  # "": $LOCAL_TOKENIZER_FILENAME, else tokenizer.json
    model_tokenizer_map: dict[str, str] = Field(default_factory=dict)


class HFTokenizerConfig(PluginParams):
    enabled: bool = True
    hugging_face_token: str = ""  # accepted; the EPP does not download (see the module docstring)
    tokenizers_cache_dir: str = "./bin"


class TokenProducerParams(PluginParams):
    model_name: str = ""
    vllm: VllmConfig | None = None
    uds_tokenizer_config: UdsTokenizerConfig | None = None
    estimate: dict[str, Any] | None = None
    local: LocalTokenizerConfig | None = None
    hf: HFTokenizerConfig | None = None

    @model_validator(mode="after")
    def _one_backend(self) -> TokenProducerParams:
        uds = self.uds_tokenizer_config is not None and bool(self.uds_tokenizer_config.socket_file)
        files = self.local is not None or (self.hf is not None and self.hf.enabled)
        # modelName alone selects vllm; upstream's head also counts it beside udsTokenizerConfig, so
        # its factory refuses every UDS config (uds needs modelName): the releases that shipped UDS
        # configs took them, and so does this one
        vllm = self.vllm is not None or (bool(self.model_name) and not files and not uds)
        chosen = [n for n, on in (("estimate", self.estimate is not None), ("vllm", vllm),
                                  ("udsTokenizerConfig", uds), ("local/hf", files)) if on]  # fmt: skip
        if len(chosen) > 1:
            raise ValueError(
                "only one of 'estimate', 'vllm', 'udsTokenizerConfig' or 'local'/'hf' may be set, "
                f"got {chosen}"
            )
        if chosen and chosen[0] != "estimate" and not self.model_name:
            raise ValueError(f"'modelName' must be specified with {chosen[0]!r}")
        for path, allowed in _MODES.items():
            node: Any = self.estimate
            for key in path:
                node = node.get(key) if isinstance(node, dict) else None
            if node not in (None, "", *allowed):
                dotted = ".".join(("estimate", *path))
                raise ValueError(f"{dotted} must be {' or '.join(map(repr, allowed))}, got {node!r}")
        if self.vllm is not None:
            parse_duration(self.vllm.timeout, "vllm.timeout")
            parse_duration(self.vllm.mm_timeout, "vllm.mmTimeout")
        return self


class TokenProducer(PluginBase):
    """Type ``token-producer``: the prompt's token ids from the configured backend (module docstring).

    DataProducer (writes ``RequestBody.token_ids`` unless the request has them already), Lifecycle
    (connects the UDS service, probes the render URL) and DebugState (backend, calls, failures).
    """

    TYPE: ClassVar[str] = "token-producer"
    PARAMS: ClassVar[type[PluginParams]] = TokenProducerParams
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({TOKENIZED_PROMPT})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()

    def __init__(self, name: str, params: TokenProducerParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.backend = "estimate"
        self.own_timeout = 0.0  # the render backend's worst case (upstream's produceTimeout); 0 = default
        self.tokens: TokenSource | None = None
        self.tokenizer_path = ""
        model = params.model_name
        uds = params.uds_tokenizer_config
        try:
            if uds is not None and uds.socket_file:
                log.warning(
                    "deprecated_parameter",
                    plugin=str(self.typed_name),
                    parameter="udsTokenizerConfig",
                    replacement="vllm (the engine's or a `vllm launch render` sidecar's render API)",
                )
                self.backend = "uds"
                self.tokens = UdsTokenizer(
                    uds.socket_file, model, use_tcp=uds.use_tcp, model_tokenizer_map=uds.model_tokenizer_map
                )
            elif params.local is not None or (params.hf is not None and params.hf.enabled):
                self.backend = "local" if params.local is not None else "hf"
                self.tokenizer_path = self._find(params)
                self.tokens = LocalTokenizer(self.tokenizer_path)
            elif params.vllm is not None or model:
                cfg = params.vllm or VllmConfig()
                self.backend = "vllm"
                timeout = parse_duration(cfg.timeout, "vllm.timeout")
                mm_timeout = parse_duration(cfg.mm_timeout, "vllm.mmTimeout")
                self.tokens = RenderTokenizer(cfg.url, model, timeout=timeout, mm_timeout=mm_timeout)
                self.own_timeout = max(timeout, mm_timeout)
        except ValueError as e:
            raise ConfigError(f"{self.TYPE} {name!r}: {e}") from e
        self.produced = 0
        self.skipped = 0  # requests that came tokenised
        self.failed = 0
        self.failing = 0  # consecutive failures
        self.resume_at = 0.0  # monotonic time before which the backend is not called (backing off)
        self.backoff = _BACKOFF_FIRST
        self.bypassed = 0  # requests sent on untokenised while backing off

    def _find(self, params: TokenProducerParams) -> str:
        model = params.model_name
        searched: list[str] = []
        if params.local is not None:
            lc = params.local
            path, where = find_local(
                model,
                directory=lc.auto_discovery_dir,
                filename=lc.auto_discovery_tokenizer_file_name,
                model_tokenizer_map=lc.model_tokenizer_map,
            )
            searched += where
            if path:
                return path
        if params.hf is not None and params.hf.enabled:
            path, where = find_hf_cached(model, params.hf.tokenizers_cache_dir)
            searched += where
            if path:
                return path
        raise ValueError(
            f"no tokenizer.json for modelName {model!r} (searched: {'; '.join(searched)}); the EPP "
            "does not download tokenizers: place it there, or use the vllm backend"
        )

    async def start(self) -> None:
        if isinstance(self.tokens, UdsTokenizer):
            try:
                await self.tokens.start()
            except RuntimeError as e:
                raise ConfigError(f"{self.TYPE} {self.typed_name.name!r}: {e}") from e
        elif isinstance(self.tokens, RenderTokenizer):
            problem = await self.tokens.probe()
            if problem is not None:
                log.warning(
                    "token_producer_unreachable",
                    plugin=str(self.typed_name),
                    url=self.tokens.url,
                    error=problem,
                    fallback="requests go on untokenised: prompt lengths are estimated (bytes / 4)",
                )

    async def stop(self) -> None:
        if isinstance(self.tokens, (UdsTokenizer, RenderTokenizer)):
            await self.tokens.close()

    def produce_timeout(self) -> float:
        """The ``vllm`` backend's worst-case render timeout (``mmTimeout`` or ``timeout``), so the
        director waits for a render past its 0.4 s default, as upstream; 0 (the default) for the
        in-memory backends."""
        return self.own_timeout

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        body = request.body
        if self.tokens is None or body is None:
            return
        if body.token_ids:
            self.skipped += 1
            return
        now = time.monotonic()
        if now < self.resume_at:
            self.bypassed += 1
            return
        ids = await self.tokens.token_ids(request, endpoints)
        if ids:
            body.token_ids = ids
            self.produced += 1
            self.failing = 0
            self.backoff = _BACKOFF_FIRST
            return
        self.failed += 1
        self.failing += 1
        if self.failing >= _FAILURES_TO_BACK_OFF:
            # a backend that keeps failing (down, or slower than its timeout) would spend every
            # request's producer timeout on waiting: skip it for a while
            self.resume_at = time.monotonic() + self.backoff
            log.warning(
                "token_producer_backing_off",
                plugin=str(self.typed_name),
                failures=self.failing,
                seconds=self.backoff,
            )
            self.backoff = min(self.backoff * 2, _BACKOFF_MAX)
            self.failing = 0

    def debug_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "backend": self.backend,
            "tokenised": self.produced,
            "alreadyTokenised": self.skipped,
            "failed": self.failed,
            "bypassedWhileBackingOff": self.bypassed,
            "backingOffSeconds": round(max(self.resume_at - time.monotonic(), 0.0), 2),
        }
        if self.tokenizer_path:
            state["tokenizerPath"] = self.tokenizer_path
        debug = getattr(self.tokens, "debug_state", None)
        if debug is not None:
            state["client"] = debug()
        return state


class LegacyTokenizer(TokenProducer):
    """Type ``tokenizer``: llm-d-router's previous name for ``token-producer``; warns, then the same."""

    TYPE: ClassVar[str] = "tokenizer"

    def __init__(self, name: str, params: TokenProducerParams, handle: Handle) -> None:
        log.warning("deprecated_plugin_type", type=self.TYPE, replacement=TokenProducer.TYPE, plugin=name)
        super().__init__(name, params, handle)
