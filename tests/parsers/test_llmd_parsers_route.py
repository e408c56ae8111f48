"""llm-d-router's anthropic-parser, vllmhttp-parser and vertexai-parser, configured as llm-d
configures them, route their requests through the real director and scheduler."""

from __future__ import annotations

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
from epp.request import ApiKind
from tests.parsers.plugins.test_vertexai import SERVICE, request

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: PARSER
- type: prefix-cache-scorer
requestHandler:
  parsers:
  - pluginRef: PARSER
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
"""


def director(parser: str) -> Director:
    components = build(load_config(CONFIG.replace("PARSER", parser)), default_registry())
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


CASES = [
    (
        "anthropic-parser",
        {":path": "/v1/messages"},
        orjson.dumps({"model": "claude", "messages": [{"role": "user", "content": "hi " * 50}]}),
        ApiKind.MESSAGES,
    ),
    (
        "vllmhttp-parser",
        {":path": "/inference/v1/generate"},
        orjson.dumps({"model": "m", "token_ids": list(range(200)), "sampling_params": {"max_tokens": 4}}),
        ApiKind.GENERATE,
    ),
    (
        "vertexai-parser",
        {":path": SERVICE + "ChatCompletions"},
        request(
            "ChatCompletionsRequest",
            orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        ),
        ApiKind.CHAT_COMPLETIONS,
    ),
]


@pytest.mark.parametrize(("parser", "headers", "body", "api"), CASES, ids=[c[0] for c in CASES])
async def test_routes(parser: str, headers: dict[str, str], body: bytes, api: ApiKind) -> None:
    lc = director(parser).start(dict(headers), {})
    decision = await lc.route(body)
    assert decision.destination.split(":")[0] in {"10.0.0.1", "10.0.0.2", "10.0.0.3"}
    assert lc.request.body is not None and lc.request.body.api is api


async def test_anthropic_parser_refuses_an_openai_path() -> None:
    with pytest.raises(BadRequest, match="unsupported API endpoint: /v1/chat/completions"):
        await director("anthropic-parser").start({":path": "/v1/chat/completions"}, {}).route(b"{}")
