"""Several parsers on one EPP (``requestHandler.parsers``): llm-d-router's ParserRegistry.

The resolution vectors are upstream's (pkg/epp/handlers/parsers_test.go at ebab687); the
routing tests load a config listing several real parsers and route real requests through the
real director and scheduler, response side included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, cast

import orjson
import pytest

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import build, parser_supports
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import EndpointMetadata
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.errors import BadRequest, ConfigError
from epp.parsers.api import Parser, UsageParser
from epp.parsers.plugins.anthropic import AnthropicParser
from epp.parsers.plugins.openai import OpenAIParser
from epp.parsers.plugins.passthrough import PassthroughParser
from epp.parsers.plugins.vertexai import VertexAIParser
from epp.parsers.plugins.vllm_grpc import VllmGrpcParser
from epp.parsers.plugins.vllm_http import VllmHttpParser
from epp.parsers.registry import ParserRegistry
from epp.plugin.base import Handle, NoParams, PluginBase
from epp.request import ApiKind, RequestBody

NONE = cast(Handle, None)


def fake(type_name: str, paths: tuple[str, ...], name: str = "") -> Parser:
    """upstream's testParser: a type and the paths it claims."""

    class Fake(PluginBase):
        TYPE: ClassVar[str] = type_name
        APP_PROTOCOLS: ClassVar[frozenset[str]] = frozenset()
        PATHS: ClassVar[tuple[str, ...]] = paths

        def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
            return RequestBody(api=ApiKind.RAW, raw=body)

        def serialize_request(self, body: RequestBody) -> bytes:
            return body.raw

        def usage_parser(self, headers: Mapping[str, str]) -> UsageParser | None:
            return None

    return Fake(name or type_name, NoParams(), NONE)


def resolved(registry: ParserRegistry, path: str) -> str:
    return registry.resolve_path(path).typed_name.name


def test_upstream_resolution_vectors() -> None:
    openai = fake("openai", ("v1/chat/completions", "v1/completions"))
    anthropic = fake("anthropic", ("v1/messages",))
    vertex = fake("vertex", ("PredictionService/ChatCompletions",))
    registry = ParserRegistry([openai, anthropic, vertex])
    assert resolved(registry, "/v1/chat/completions") == "openai"
    assert resolved(registry, "/v1/messages") == "anthropic"
    assert (
        resolved(registry, "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions") == "vertex"
    )
    assert resolved(registry, "/google.cloud.aiplatform.v1.PredictionService/ChatCompletions") == "vertex"
    assert resolved(registry, "/v1/messages/") == "anthropic"  # trailing slash trimmed
    with pytest.raises(
        BadRequest, match=r"BadRequest - no parser registered matching path suffix for: /unknown/path$"
    ):
        registry.resolve_path("/unknown/path")


def test_first_listed_wins_a_tie() -> None:
    openai = fake("openai", ("v1/chat/completions",))
    custom = fake("custom", ("v1/chat/completions",))
    assert resolved(ParserRegistry([openai, custom]), "/v1/chat/completions") == "openai"
    assert resolved(ParserRegistry([custom, openai]), "/v1/chat/completions") == "custom"


def test_a_parser_without_paths_is_the_fallback_and_ends_the_list() -> None:
    openai = fake("openai", ("v1/chat/completions", "v1/completions"))
    passthrough = fake("passthrough", ())
    after = fake("after", ("v1/after",))
    registry = ParserRegistry([openai, passthrough, after])
    assert resolved(registry, "/v1/completions") == "openai"
    assert resolved(registry, "/unknown/path") == "passthrough"
    assert resolved(registry, "/v1/after") == "passthrough"  # skipped: listed after the fallback
    assert [p.typed_name.name for p in registry.parsers] == ["openai", "passthrough"]


def test_longest_suffix_wins_regardless_of_order() -> None:
    sglang = fake("sglang", ("generate",))
    vllm = fake("vllm", ("inference/v1/generate",))
    registry = ParserRegistry([sglang, vllm])
    assert resolved(registry, "/inference/v1/generate") == "vllm"
    assert resolved(registry, "/generate") == "sglang"


def test_a_second_parser_of_a_type_is_skipped() -> None:
    p1 = fake("openai", ("v1/chat/completions",), "first")
    p2 = fake("openai", ("v1/completions",), "second")
    registry = ParserRegistry([p1, p2])
    assert registry.parsers == (p1,)
    with pytest.raises(BadRequest):
        registry.resolve_path("/v1/completions")


def test_path_from_headers_query_ignored() -> None:
    registry = ParserRegistry([OpenAIParser("o", NoParams(), NONE), AnthropicParser("a", NoParams(), NONE)])
    assert registry.resolve({":path": "/v1/messages?beta=true"}).typed_name.name == "a"
    assert registry.resolve({"x-original-path": "/v1/chat/completions"}).typed_name.name == "o"
    assert registry.resolve({}).typed_name.name == "o"  # no path: /v1/completions, as upstream


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("/v1/chat/completions", "openai-parser"),
        ("/v1/completions", "openai-parser"),
        ("/v1/chat/completions/render", "openai-parser"),
        ("/v1/embeddings", "openai-parser"),
        ("/v1/responses", "openai-parser"),
        ("/v1/conversations", "openai-parser"),
        ("/v1/messages", "anthropic-parser"),
        ("/v1/messages/count_tokens", "anthropic-parser"),
        ("/inference/v1/generate", "vllmhttp-parser"),
        ("/vllm.grpc.engine.VllmEngine/Generate", "vllmgrpc-parser"),
        ("/vllm.grpc.engine.VllmEngine/Embed", "vllmgrpc-parser"),
        ("/google.cloud.aiplatform.v1.PredictionService/RawPredict", "vertexai-parser"),
        ("/google.cloud.aiplatform.v1.PredictionService/StreamRawPredict", "vertexai-parser"),
        ("/v1/models", "passthrough-parser"),
    ],
)
def test_real_parsers_claim_upstreams_paths(path: str, want: str) -> None:
    # upstream's default list, plus the gRPC parsers ahead of the fallback
    parsers: list[Parser] = [
        OpenAIParser("openai-parser", NoParams(), NONE),
        AnthropicParser("anthropic-parser", NoParams(), NONE),
        VllmHttpParser("vllmhttp-parser", NoParams(), NONE),
        VllmGrpcParser("vllmgrpc-parser", NoParams(), NONE),
        VertexAIParser("vertexai-parser", NoParams(), NONE),
        PassthroughParser("passthrough-parser", NoParams(), NONE),
    ]
    assert resolved(ParserRegistry(parsers), path) == want


def test_app_protocols_every_parser_must_serve() -> None:
    """llm-d's health check: each parser naming protocols must support the pool's."""
    mixed = ParserRegistry(
        [
            OpenAIParser("o", NoParams(), NONE),
            VllmGrpcParser("g", NoParams(), NONE),
            PassthroughParser("p", NoParams(), NONE),
        ]
    )
    assert {"kubernetes.io/h2c"} == mixed.APP_PROTOCOLS
    assert parser_supports(mixed, "kubernetes.io/h2c")
    assert not parser_supports(mixed, "http")
    assert {
        "http",
        "kubernetes.io/h2c",
    } == ParserRegistry(
        [OpenAIParser("o", NoParams(), NONE), AnthropicParser("a", NoParams(), NONE)]
    ).APP_PROTOCOLS

    class HttpOnly(OpenAIParser):
        TYPE: ClassVar[str] = "http-only"
        APP_PROTOCOLS: ClassVar[frozenset[str]] = frozenset({"http"})

    with pytest.raises(ConfigError, match="no appProtocol in common"):
        ParserRegistry([HttpOnly("h", NoParams(), NONE), VllmGrpcParser("g", NoParams(), NONE)])


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: openai-parser
- type: anthropic-parser
- type: prefix-cache-scorer
requestHandler:
  parsers:
  - pluginRef: openai-parser
  - pluginRef: anthropic-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
"""


def director(config: str) -> Director:
    components = build(load_config(config), default_registry())
    ds = Datastore()
    for i in range(3):
        ds.upsert(
            EndpointMetadata(
                name=f"default/pod-{i}", address=f"10.0.0.{i + 1}", port=8000, pod_name=f"pod-{i}"
            )
        )
    return Director(
        ds, components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    )


def test_the_config_builds_a_registry_and_one_parser_stays_direct() -> None:
    components = build(load_config(CONFIG), default_registry())
    assert isinstance(components.parser, ParserRegistry)
    assert [str(p.typed_name) for p in components.parser.parsers] == [
        "openai-parser/openai-parser",
        "anthropic-parser/anthropic-parser",
    ]
    one = build(load_config(CONFIG.replace("  - pluginRef: anthropic-parser\n", "")), default_registry())
    assert isinstance(one.parser, OpenAIParser)


async def test_each_request_goes_to_the_parser_claiming_its_path() -> None:
    d = director(CONFIG)
    # No max_tokens: anthropic-parser accepts it, openai-parser (which also reads /v1/messages) would not.
    lc = d.start({":path": "/v1/messages"}, {})
    await lc.route(orjson.dumps({"model": "claude", "messages": [{"role": "user", "content": "hi"}]}))
    assert lc.request.body is not None and lc.request.body.api is ApiKind.MESSAGES
    assert lc.ctx.parser is not None and lc.ctx.parser.typed_name.type == "anthropic-parser"

    lc = d.start({":path": "/v1/chat/completions"}, {})
    await lc.route(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    assert lc.request.body is not None and lc.request.body.api is ApiKind.CHAT_COMPLETIONS
    assert lc.ctx.parser is not None and lc.ctx.parser.typed_name.type == "openai-parser"


async def test_a_path_nobody_claims_is_refused_400_without_a_fallback() -> None:
    lc = director(CONFIG).start({":path": "/v1/models"}, {})
    with pytest.raises(
        BadRequest, match=r"BadRequest - no parser registered matching path suffix for: /v1/models$"
    ) as e:
        await lc.route(b"{}")
    assert e.value.http_status == 400


async def test_a_fallback_forwards_what_nobody_claims() -> None:
    config = CONFIG.replace(
        "- type: anthropic-parser\n", "- type: anthropic-parser\n- type: passthrough-parser\n"
    )
    config = config.replace(
        "  - pluginRef: anthropic-parser\n",
        "  - pluginRef: anthropic-parser\n  - pluginRef: passthrough-parser\n",
    )
    lc = director(config).start({":path": "/v1/models"}, {})
    decision = await lc.route(b"not json")
    assert lc.request.body is not None and lc.request.body.api is ApiKind.RAW
    assert not decision.body_changed


async def test_the_response_side_uses_the_requests_parser() -> None:
    """The usage parser comes from the parser that read the request, not the first listed."""
    d = director(CONFIG)
    lc = d.start({":path": "/v1/messages"}, {})
    await lc.route(orjson.dumps({"model": "claude", "messages": [{"role": "user", "content": "hi"}]}))
    used: list[str] = []
    parser = lc.ctx.parser
    assert parser is not None
    original = type(parser).usage_parser

    def spy(self: Parser, headers: Mapping[str, str]) -> UsageParser | None:
        used.append(self.typed_name.type)
        return original(self, headers)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AnthropicParser, "usage_parser", spy)
        lc.response_headers({":status": "200", "content-type": "application/json"}, end_of_stream=False)
    assert used == ["anthropic-parser"]
    body = {"type": "message", "usage": {"input_tokens": 7, "output_tokens": 3}}
    lc.response_chunk(orjson.dumps(body), True)
    assert lc.ctx.response is not None and lc.ctx.response.usage is not None
    assert (lc.ctx.response.usage.prompt_tokens, lc.ctx.response.usage.completion_tokens) == (7, 3)
