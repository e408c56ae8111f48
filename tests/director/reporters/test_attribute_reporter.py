"""request-attribute-reporter: parameters, when a value is written, and GIE's integration case (§10.4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from google.protobuf import json_format

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.admission.shedding import AlwaysAdmit
from epp.app.build import build as build_config
from epp.app.registry import default_registry
from epp.config.load import load_config_file
from epp.datalayer.api import EndpointMetadata
from epp.datastore.store import Datastore
from epp.director.api import ResponseCompleteProcessor
from epp.director.director import Director, Pipeline
from epp.director.reporters.attribute_reporter import RequestAttributeReporter
from epp.errors import ConfigError
from epp.plugin.registry import Registry
from epp.plugin.state import CycleState
from epp.request import ResponseInfo, Usage
from epp.server.session import ExtProcSession
from epp.testing.builders import make_request
from epp.testing.plugins import FakeHandle
from tests.server.harness import as_received

COST = "x-gateway-inference-request-cost"
EXAMPLE = Path(__file__).parents[3] / "config" / "examples" / "request-attribute-reporter.yaml"


def reporter(expression: str = "usage.completion_tokens", **attr: Any) -> RequestAttributeReporter:
    attribute: dict[str, Any] = {"key": {"namespace": "envoy.lb", "name": COST}, "expression": expression}
    attribute.update(attr)
    return _build({"attributes": [attribute]})


def _build(parameters: Any) -> RequestAttributeReporter:
    registry = Registry([RequestAttributeReporter])
    plugin = registry.build(
        name="cost",
        type_name=RequestAttributeReporter.TYPE,
        parameters=parameters,
        handle=FakeHandle(),
        path="plugins[1]",
    )
    assert isinstance(plugin, RequestAttributeReporter)
    return plugin


def complete(plugin: RequestAttributeReporter, usage: Usage | None, *, eos: bool = True) -> ResponseInfo:
    response = ResponseInfo(request_id="r", usage=usage, end_of_stream=eos)
    plugin.response_complete(CycleState(), make_request(), response, None)
    return response


USAGE = Usage(prompt_tokens=7, completion_tokens=10, total_tokens=17)


def test_is_a_completion_hook() -> None:
    """The plugin is bucketed as a completion processor (and only runs there)."""
    assert isinstance(reporter(), ResponseCompleteProcessor)


@pytest.mark.parametrize(
    ("attr", "usage", "eos", "expected"),
    [
        pytest.param(
            {"condition": "has(usage.completion_tokens)"},
            USAGE,
            True,
            {"envoy.lb": {COST: 10}},
            id="gie-example",
        ),
        pytest.param({}, USAGE, True, {"envoy.lb": {COST: 10}}, id="no-condition"),
        pytest.param({"condition": "usage.completion_tokens > 100"}, USAGE, True, {}, id="condition-false"),
        pytest.param({"condition": "usage.completion_tokens"}, USAGE, True, {}, id="condition-not-bool"),
        pytest.param({"condition": "usage.nope > 1"}, USAGE, True, {}, id="condition-error"),
        pytest.param({"expression": "'ten'"}, USAGE, True, {}, id="string-result"),
        pytest.param({"expression": "usage.completion_tokens > 1"}, USAGE, True, {}, id="bool-result"),
        pytest.param({"expression": "usage.nope"}, USAGE, True, {}, id="expression-error"),
        pytest.param({}, Usage(prompt_tokens=7), True, {}, id="zero-not-written"),
        pytest.param(
            {"expression": "usage.total_tokens / 4.0"}, USAGE, True, {"envoy.lb": {COST: 4}}, id="trunc"
        ),
        pytest.param(
            {"expression": "usage.prompt_tokens - usage.total_tokens"},
            USAGE,
            True,
            {"envoy.lb": {COST: -10}},
            id="negative-written",
        ),
        pytest.param(
            {"expression": "usage.prompt_token_details.cached_tokens"},
            Usage(prompt_tokens=7, completion_tokens=10, total_tokens=17, cached_tokens=5),
            True,
            {"envoy.lb": {COST: 5}},
            id="cached-tokens",
        ),
        pytest.param(
            {"condition": "has(usage.prompt_token_details)", "expression": "1"},
            USAGE,
            True,
            {},
            id="no-details",
        ),
        pytest.param({}, None, True, {}, id="no-usage"),
        pytest.param({}, USAGE, False, {}, id="abnormal-end"),
    ],
)
def test_reports(attr: dict[str, Any], usage: Usage | None, eos: bool, expected: dict[str, Any]) -> None:
    """A nonzero int or double result is written as int64 under namespace/name; nothing else is."""
    expression = attr.pop("expression", "usage.completion_tokens")
    response = complete(reporter(expression, **attr), usage, eos=eos)
    assert response.dynamic_metadata == expected
    for ns in response.dynamic_metadata.values():
        assert all(type(v) is int for v in ns.values())


def test_keeps_other_metadata() -> None:
    """The value joins what other plugins already wrote in the same namespace."""
    response = ResponseInfo(request_id="r", usage=USAGE, end_of_stream=True)
    response.dynamic_metadata["envoy.lb"] = {"other": 1}
    reporter().response_complete(CycleState(), make_request(), response, None)
    assert response.dynamic_metadata == {"envoy.lb": {"other": 1, COST: 10}}


def test_namespace_defaults_to_envoy_lb() -> None:
    """A key without a namespace (or an empty one) writes under ``envoy.lb``."""
    for key in ({"name": COST}, {"namespace": "", "name": COST}):
        plugin = _build({"attributes": [{"key": key, "expression": "usage.completion_tokens"}]})
        assert complete(plugin, USAGE).dynamic_metadata == {"envoy.lb": {COST: 10}}


def test_custom_namespace() -> None:
    """The namespace is configurable."""
    plugin = reporter(key={"namespace": "com.example.billing", "name": "tokens"})
    assert complete(plugin, USAGE).dynamic_metadata == {"com.example.billing": {"tokens": 10}}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        pytest.param(
            None,
            "plugins[1] (cost/request-attribute-reporter): parameters.attributes: "
            "attributes must contain exactly one entry, got 0",
            id="no-attributes",
        ),
        pytest.param(
            {"attributes": [{"key": {"name": "a"}, "expression": "1"}] * 2},
            "parameters.attributes: attributes must contain exactly one entry, got 2",
            id="two-attributes",
        ),
        pytest.param(
            {"attributes": [{"expression": "1"}]},
            "parameters.attributes[0].key.name: attributeKey.name cannot be empty",
            id="no-name",
        ),
        pytest.param(
            {"attributes": [{"key": {"name": "a"}}]},
            "parameters.attributes[0].expression: attributes[0].expression cannot be empty",
            id="no-expression",
        ),
        pytest.param(
            {"attributes": [{"key": {"name": "a"}, "expression": "usage.("}]},
            "plugins[1] (cost/request-attribute-reporter): parameters.attributes[0].expression: "
            "failed to compile expression: syntax error at line 1, column 7 of 'usage.('",
            id="expression-syntax",
        ),
        pytest.param(
            {"attributes": [{"key": {"name": "a"}, "expression": "1", "condition": "has(usage)"}]},
            "parameters.attributes[0].condition: failed to compile condition: "
            "invalid argument to has() macro",
            id="condition-has",
        ),
        pytest.param(
            {"attributes": [{"key": {"name": "a"}, "expression": "usgae.completion_tokens"}]},
            "parameters.attributes[0].expression: failed to compile expression: "
            "undeclared reference to 'usgae'",
            id="undeclared",
        ),
        pytest.param(
            {"attributes": [{"key": {"name": "a"}, "expression": "1", "extra": 2}]},
            "plugins[1].parameters.attributes[0].extra: Extra inputs are not permitted",
            id="unknown-field",
        ),
    ],
)
def test_config_errors(parameters: Any, message: str) -> None:
    """Bad parameters fail at startup with GIE's wording prefixed by the parameter path."""
    with pytest.raises(ConfigError) as info:
        _build(parameters)
    assert message in str(info.value)


# --- §10.4: through the ext_proc stream with the example config ----------------------------


def _headers(**pairs: str) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    )


def _director() -> Director:
    components = build_config(load_config_file(EXAMPLE), default_registry(entry_points=False))
    ds = Datastore()
    ds.upsert(EndpointMetadata(name="default/pod-0-rank-0", address="10.0.0.1", port=8000))
    pipeline = Pipeline(
        parser=components.parser,
        scheduler=components.scheduler,
        admission=AlwaysAdmit(),
        producers=components.producers,
        admitters=components.admitters,
        pre_request=components.pre_request,
        response_header=components.response_header,
        response_body=components.response_body,
        response_complete=components.response_complete,
    )
    return Director(ds, pipeline)


def _metadata(reply: pb.ProcessingResponse | bytes) -> dict[str, Any]:
    if isinstance(reply, bytes):  # hot-path replies are hand-encoded
        reply = pb.ProcessingResponse.FromString(reply)
    return json_format.MessageToDict(reply.dynamic_metadata) if reply.HasField("dynamic_metadata") else {}


USAGE_JSON = {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17}
BUFFERED = orjson.dumps({"object": "text_completion", "choices": [{"text": "hi"}], "usage": USAGE_JSON})
SSE = [
    b'data: {"object":"text_completion","choices":[{"text":"hi"}]}\n\n',
    b'data: {"object":"text_completion","choices":[],"usage":'
    + orjson.dumps(USAGE_JSON)
    + b"}\n\ndata: [DONE]\n\n",
]


@pytest.mark.parametrize(
    ("content_type", "chunks"),
    [
        pytest.param("application/json", [BUFFERED[:20], BUFFERED[20:]], id="buffered"),
        pytest.param("text/event-stream", SSE, id="sse"),
    ],
)
async def test_final_body_message_carries_cost(content_type: str, chunks: list[bytes]) -> None:
    """GIE's integration case: the last ResponseBody reply has envoy.lb cost = completion_tokens (10)."""
    stream = ExtProcSession(_director())
    full_duplex = mode_pb.ProcessingMode.FULL_DUPLEX_STREAMED
    stream.handle(
        as_received(
            pb.ProcessingRequest(
                request_headers=pb.HttpHeaders(
                    headers=_headers(**{":path": "/v1/completions", ":method": "POST"})
                ),
                protocol_config=pb.ProtocolConfiguration(
                    request_body_mode=full_duplex, response_body_mode=full_duplex
                ),
            )
        )
    )
    body = orjson.dumps({"model": "food-review", "prompt": "hello", "max_tokens": 20})
    assert not stream.handle(
        as_received(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
    )
    assert stream.route_pending
    routed = await stream.route()
    assert routed, "the request was routed"
    stream.handle(
        as_received(
            pb.ProcessingRequest(
                response_headers=pb.HttpHeaders(
                    headers=_headers(**{":status": "200", "content-type": content_type})
                )
            )
        )
    )
    replies: list[pb.ProcessingResponse | bytes] = []  # bytes: hand-encoded hot-path replies
    for i, chunk in enumerate(chunks):
        eos = i == len(chunks) - 1
        replies.extend(
            stream.handle(
                as_received(pb.ProcessingRequest(response_body=pb.HttpBody(body=chunk, end_of_stream=eos)))
            )
        )
    stream.close()
    assert replies
    assert [_metadata(r) for r in replies[:-1]] == [{}] * (len(replies) - 1)
    assert _metadata(replies[-1]) == {"envoy.lb": {COST: 10.0}}
