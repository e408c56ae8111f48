"""``token-producer`` (llm-d-router), estimate backend only: accepted so llm-d configs load.

llm-d's P/D decider and prefix plugins read a token count that its ``token-producer`` writes;
the default ``estimate`` backend is about 4 bytes per token.  Here every consumer already
estimates prompt tokens as body bytes / 4 (GIE's estimator), so a configured estimate
producer has nothing to add and does nothing.  A real tokenizer backend (``vllm``,
``modelName``, ``udsTokenizerConfig``) is refused: silently estimating instead would
mislead whoever configured it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import model_validator

from epp.plugin.base import PluginBase, PluginParams

_TOKENIZER_BACKENDS = ("vllm", "modelName", "udsTokenizerConfig")


class TokenProducerParams(PluginParams):
    estimate: dict[str, Any] | None = None  # multimodal placeholder tuning; no effect here
    vllm: dict[str, Any] | None = None
    model_name: str = ""
    uds_tokenizer_config: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _estimate_only(self) -> TokenProducerParams:
        if self.vllm is not None or self.model_name or self.uds_tokenizer_config is not None:
            raise ValueError(
                "only the estimate backend is supported (prompt tokens = body bytes / 4); "
                f"remove {', '.join(_TOKENIZER_BACKENDS)}"
            )
        return self


class TokenProducer(PluginBase):
    """Type ``token-producer``: llm-d's estimate backend, a no-op here (see module docstring).

    Parameters: ``estimate`` (accepted, no effect); ``vllm``, ``modelName`` and
    ``udsTokenizerConfig`` are configuration errors.
    """

    TYPE: ClassVar[str] = "token-producer"
    PARAMS: ClassVar[type[PluginParams]] = TokenProducerParams
