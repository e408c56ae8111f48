"""The plugin classes this concept contributes to the registry."""

from __future__ import annotations

from typing import Final

from epp.parsers.plugins.anthropic import AnthropicParser
from epp.parsers.plugins.openai import OpenAIParser
from epp.parsers.plugins.passthrough import PassthroughParser
from epp.parsers.plugins.sglang_http import SglangHttpParser
from epp.parsers.plugins.vertexai import VertexAIParser
from epp.parsers.plugins.vllm_grpc import VllmGrpcParser
from epp.parsers.plugins.vllm_http import VllmHttpParser
from epp.plugin.base import Plugin

BUILTINS: Final[tuple[type[Plugin], ...]] = (
    OpenAIParser,
    VllmGrpcParser,
    PassthroughParser,
    # llm-d-router's narrower parsers (one API each), sharing the OpenAI parser's code.
    AnthropicParser,
    VllmHttpParser,
    VertexAIParser,
    SglangHttpParser,
)
