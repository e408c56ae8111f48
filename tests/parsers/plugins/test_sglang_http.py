"""sglanghttp-parser: SGLang's /generate (vectors from llm-d-router's sglanghttp_test.go at ebab687)."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.api import EndpointMetadata
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.errors import BadRequest
from epp.parsers.api import Parser
from epp.parsers.plugins.sglang_http import SglangHttpParser
from epp.parsers.registry import ParserRegistry
from epp.plugin.base import Handle, NoParams
from epp.request import ApiKind, Usage

GENERATE = {":path": "/generate"}


@pytest.fixture
def parser() -> SglangHttpParser:
    return SglangHttpParser("sglanghttp-parser", NoParams(), cast(Handle, None))


def test_is_a_parser_claiming_generate(parser: SglangHttpParser) -> None:
    assert isinstance(parser, Parser)
    assert parser.typed_name.type == "sglanghttp-parser"
    assert frozenset({"http", "kubernetes.io/h2c"}) == parser.APP_PROTOCOLS
    assert parser.PATHS == ("generate",)
    assert "sglanghttp-parser" in default_registry()


@pytest.mark.parametrize(
    ("headers", "body", "ids", "salt", "stream"),
    [
        pytest.param(GENERATE, {"input_ids": [1, 2, 3]}, [1, 2, 3], "", False, id="basic"),
        pytest.param(
            GENERATE, {"input_ids": [10, 20], "extra_key": "salt-abc"}, [10, 20], "salt-abc", False, id="salt"
        ),
        pytest.param(
            GENERATE,
            {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 256}},
            [1, 2, 3],
            "",
            False,
            id="sampling-params",
        ),
        pytest.param(GENERATE, {"input_ids": [1, 2, 3], "stream": True}, [1, 2, 3], "", True, id="stream"),
        pytest.param(
            GENERATE, {"text": "ignored by the parser", "input_ids": [7, 8]}, [7, 8], "", False, id="text"
        ),
        pytest.param(
            {"x-original-path": "/generate"}, {"input_ids": [5, 6, 7]}, [5, 6, 7], "", False, id="x-orig"
        ),
        pytest.param({":path": "/generate/"}, {"input_ids": [1]}, [1], "", False, id="trailing-slash"),
        pytest.param(
            {":path": "/generate?x=1"}, {"input_ids": [4294967295]}, [4294967295], "", False, id="max"
        ),
    ],
)
def test_parse(
    parser: SglangHttpParser,
    headers: dict[str, str],
    body: dict[str, Any],
    ids: list[int],
    salt: str,
    stream: bool,
) -> None:
    raw = orjson.dumps(body)
    got = parser.parse_request(raw, headers)
    assert got.api is ApiKind.GENERATE
    assert list(got.token_ids or ()) == ids
    assert (got.cache_salt, got.stream) == (salt, stream)
    assert got.json is None and got.model == ""  # no model: nothing to rewrite, not required
    assert parser.serialize_request(got) == raw


@pytest.mark.parametrize(
    ("headers", "body", "message"),
    [
        (
            GENERATE,
            b'{"input_ids":[1,2,-1]}',
            "invalid generate request: input_ids must be an array of uint32 integers",
        ),
        (
            GENERATE,
            b'{"input_ids":[1,2.5]}',
            "invalid generate request: input_ids must be an array of uint32 integers",
        ),
        (
            GENERATE,
            b'{"input_ids":[4294967296]}',
            "invalid generate request: input_ids must be an array of uint32",
        ),
        (
            GENERATE,
            b'{"input_ids":[true]}',
            "invalid generate request: input_ids must be an array of uint32 integers",
        ),
        (GENERATE, b'{"input_ids":[]}', "invalid generate request: input_ids cannot be empty"),
        (GENERATE, b'{"input_embeds":[[0.1,0.2]]}', "invalid generate request: input_ids must be provided"),
        (GENERATE, b'{"text":"hello"}', "invalid generate request: input_ids must be provided"),
        (GENERATE, b'{"input_ids":null}', "invalid generate request: input_ids must be provided"),
        (GENERATE, b"null", "invalid generate request: input_ids must be provided"),
        (
            GENERATE,
            b'{"input_ids":[[1,2],[3,4]]}',
            "invalid generate request: input_ids must be an array of uint32",
        ),
        (
            GENERATE,
            b'{"input_ids":[1,2],"extra_key":["a","b"]}',
            "unsupported generate request: extra_key must be a string",
        ),
        (GENERATE, b'{"sampling_params":{"temperature":0.8}}', "input_ids must be provided"),
        ({":path": "/v1/completions"}, b'{"input_ids":[1]}', "unsupported path: /v1/completions"),
        (
            GENERATE,
            b"[1]",
            "invalid generate request: json: cannot unmarshal array into Go value of type sglanghttp.sgLangGenerateWire",
        ),
        (
            GENERATE,
            b'{"input_ids":[1],"stream":"yes"}',
            "invalid generate request: json: cannot unmarshal string into Go struct field "
            "sgLangGenerateWire.stream of type bool",
        ),
        (GENERATE, b'{"input_ids":[1]', "invalid generate request: unexpected end of JSON input"),
    ],
)
def test_refused(parser: SglangHttpParser, headers: dict[str, str], body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as e:
        parser.parse_request(body, headers)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "path",
    ["/regenerate", "/health_generate", "/vertex_generate", "/inference/v1/generate", "/prefix/generate"],
)
def test_path_needs_the_segment_boundary(parser: SglangHttpParser, path: str) -> None:
    with pytest.raises(BadRequest, match="unsupported path"):
        parser.parse_request(b'{"input_ids":[1]}', {":path": path})


def usage(parser: SglangHttpParser, headers: dict[str, str], body: bytes, chunk: int = 0) -> Usage | None:
    up = parser.usage_parser(headers)
    assert up is not None
    if not chunk:
        return up.feed(body, True)
    got = None
    for i in range(0, len(body), chunk):
        got = up.feed(body[i : i + chunk], False)
    return up.feed(b"", True) or got


SSE = {"content-type": "text/event-stream"}
STREAM = (
    b'data: {"text":"he","meta_info":{"prompt_tokens":10,"completion_tokens":2,"finish_reason":null}}\n\n'
    b'data: {"text":"hello","meta_info":{"prompt_tokens":10,"completion_tokens":5,'
    b'"finish_reason":{"type":"stop"}}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize(
    ("headers", "body", "want"),
    [
        pytest.param(
            {},
            b'{"text":"hello","meta_info":{"prompt_tokens":10,"completion_tokens":5}}',
            Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15),
            id="json",
        ),
        pytest.param(
            {},
            b'{"text":"hi","output_ids":[1,2],"meta_info":{"id":"req-1","prompt_tokens":8,'
            b'"completion_tokens":3,"cached_tokens":2}}',
            Usage(prompt_tokens=8, completion_tokens=3, total_tokens=11, cached_tokens=2),
            id="json-cached",
        ),
        pytest.param(
            SSE, STREAM, Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15), id="sse-final"
        ),
        pytest.param(
            SSE,
            b'data: {"text":"he","meta_info":{"prompt_tokens":10,"completion_tokens":2}}\n\n',
            None,
            id="sse-intermediate-only",
        ),
        pytest.param(
            {"content-type": "text/event-stream; charset=utf-8"},
            b'event: generation\ndata: {"text":"hello","meta_info":{"prompt_tokens":10,"completion_tokens":5,'
            b'"finish_reason":{"type":"stop"}}}\n\n',
            Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15),
            id="sse-charset",
        ),
        pytest.param(SSE, b"data: [DONE]\n\n", None, id="sse-done-only"),
        pytest.param({}, b"", None, id="empty"),
        pytest.param(
            {},
            b'{"text":"","meta_info":{"prompt_tokens":0,"completion_tokens":0}}',
            Usage(),
            id="explicit-zero",
        ),
        pytest.param({}, b'{"meta_info":', None, id="invalid-json"),  # upstream: an error; no usage here
        pytest.param(
            {},
            b'{"usage":{"prompt_tokens":3,"completion_tokens":1}}',
            None,
            id="openai-usage-is-not-sglangs",
        ),
    ],
)
def test_usage(parser: SglangHttpParser, headers: dict[str, str], body: bytes, want: Usage | None) -> None:
    assert usage(parser, headers, body) == want


@pytest.mark.parametrize("chunk", [1, 7, 50])
def test_stream_usage_across_chunk_boundaries(parser: SglangHttpParser, chunk: int) -> None:
    assert usage(parser, SSE, STREAM, chunk) == Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15)


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: sglanghttp-parser
- type: vllmhttp-parser
- type: openai-parser
- type: prefix-cache-scorer
requestHandler:
  parsers:
  - pluginRef: sglanghttp-parser
  - pluginRef: vllmhttp-parser
  - pluginRef: openai-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
"""


def director() -> Director:
    components = build(load_config(CONFIG), default_registry())
    assert isinstance(components.parser, ParserRegistry)
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


async def test_routes_beside_vllmhttp_and_openai_and_reads_its_own_usage() -> None:
    """upstream's longest-suffix case with real parsers: /generate is SGLang's, /inference/v1/generate vLLM's."""
    d = director()
    lc = d.start({":path": "/generate"}, {})
    decision = await lc.route(orjson.dumps({"input_ids": list(range(200)), "sampling_params": {}}))
    assert decision.destination.split(":")[0] in {"10.0.0.1", "10.0.0.2", "10.0.0.3"}
    assert not decision.body_changed
    assert lc.ctx.parser is not None and lc.ctx.parser.typed_name.type == "sglanghttp-parser"
    lc.response_headers({":status": "200", "content-type": "application/json"}, end_of_stream=False)
    lc.response_chunk(b'{"text":"x","meta_info":{"prompt_tokens":200,"completion_tokens":4}}', True)
    assert lc.ctx.response is not None
    assert lc.ctx.response.usage == Usage(prompt_tokens=200, completion_tokens=4, total_tokens=204)

    lc = d.start({":path": "/inference/v1/generate"}, {})
    await lc.route(orjson.dumps({"model": "m", "token_ids": [1, 2, 3]}))
    assert lc.ctx.parser is not None and lc.ctx.parser.typed_name.type == "vllmhttp-parser"

    lc = d.start({":path": "/v1/completions"}, {})
    await lc.route(orjson.dumps({"model": "m", "prompt": "hi"}))
    assert lc.ctx.parser is not None and lc.ctx.parser.typed_name.type == "openai-parser"
