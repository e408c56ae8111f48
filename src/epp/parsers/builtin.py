"""The plugin classes this concept contributes to the registry."""

from __future__ import annotations

from typing import Final

from epp.parsers.plugins.openai import OpenAIParser
from epp.parsers.plugins.passthrough import PassthroughParser
from epp.parsers.plugins.vllm_grpc import VllmGrpcParser
from epp.plugin.base import Plugin

BUILTINS: Final[tuple[type[Plugin], ...]] = (OpenAIParser, VllmGrpcParser, PassthroughParser)
