"""The per-request ``mode_override``: only where Envoy honours it, and only modes lean.yaml lists.

What Envoy does with it is checked against the real Envoy in tests/e2e/test_envoy_phases.py;
here, that the EPP asks for exactly what the shipped config allows, and nothing where Envoy
would ignore it (docs/envoy.md).
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.server import messages
from epp.server import responses as r
from epp.server.session import (
    BUFFERED,
    FULL_DUPLEX,
    NONE,
    STREAMED,
    ExtProcSession,
    lean_override,
    overridable,
)
from tests.server.harness import HERMETIC_OBJECTS, Harness, as_received, pods, req_headers

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPARED = ("request_body_mode", "request_trailer_mode", "response_header_mode", "response_body_mode",
            "response_trailer_mode")  # fmt: skip  # Envoy does not compare request_header_mode
Mode = mode_pb.ProcessingMode


def decoded(field: bytes) -> Mode:
    return pb.ProcessingResponse.FromString(field).mode_override


def as_names(mode: Mode) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in COMPARED:
        value = getattr(mode, name)
        enum = Mode.BodySendMode if name.endswith("body_mode") else Mode.HeaderSendMode
        out[name] = enum.Name(value)
    return out


def lean_yaml_ext_proc() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "deploy" / "envoy" / "lean.yaml").read_text())
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (cfg,) = (f["typed_config"] for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")
    return dict(cfg)


def test_lean_yaml_lists_exactly_the_modes_the_epp_asks_for() -> None:
    cfg = lean_yaml_ext_proc()
    assert cfg["allow_mode_override"] is True
    assert not cfg.get("send_body_without_waiting_for_header_response", False)
    request_mode = Mode.BodySendMode.Value(cfg["processing_mode"]["request_body_mode"])
    asked = [as_names(decoded(lean_override(request_mode, headers=h))) for h in (False, True)]
    listed = [{k: m[k] for k in COMPARED} for m in cfg["allowed_override_modes"]]
    assert sorted(map(str, asked)) == sorted(map(str, listed))
    assert cfg["processing_mode"]["request_trailer_mode"] == "SEND"  # trailers may end a buffered body


def test_lean_override_skips_the_response_and_keeps_the_request_side() -> None:
    mode = decoded(lean_override(BUFFERED, headers=False))
    assert mode.request_body_mode == BUFFERED and mode.request_trailer_mode == Mode.SEND
    assert mode.response_header_mode == Mode.SKIP and mode.response_body_mode == NONE
    assert mode.response_trailer_mode == Mode.SKIP
    assert decoded(lean_override(STREAMED, headers=True)).response_header_mode == Mode.SEND
    assert lean_override(BUFFERED, headers=False) is lean_override(BUFFERED, headers=False)  # cached


@pytest.mark.parametrize(
    ("request_mode", "response_mode", "without_waiting", "honoured"),
    [
        (BUFFERED, STREAMED, False, True),
        (STREAMED, STREAMED, False, True),
        (BUFFERED, NONE, False, True),
        (FULL_DUPLEX, STREAMED, False, False),  # Envoy ignores overrides when either mode is full duplex
        (BUFFERED, FULL_DUPLEX, False, False),
        (FULL_DUPLEX, FULL_DUPLEX, False, False),
        (BUFFERED, STREAMED, True, False),  # and when bodies go out without waiting for the headers reply
    ],
)
def test_overridable_follows_envoys_rule(
    request_mode: int, response_mode: int, without_waiting: bool, honoured: bool
) -> None:
    config = pb.ProtocolConfiguration(
        request_body_mode=request_mode,  # type: ignore[arg-type]
        response_body_mode=response_mode,  # type: ignore[arg-type]
        send_body_without_waiting_for_header_response=without_waiting,
    )
    read = messages.from_message(pb.ProcessingRequest(protocol_config=config)).config
    assert read is not None
    assert overridable(read) is honoured


NO_REWRITES = "kind: InferenceObjective\nmetadata: {name: sql-lora}\nspec: {priority: 2}\n"


def headers_reply(*, without_waiting: bool, objects: str = NO_REWRITES) -> pb.ProcessingResponse:
    h = Harness(objects=objects)
    h.set_pods(pods((0, 0, 0.1), (1, 3, 0.2)))
    s = ExtProcSession(h.director)
    msg = req_headers({":method": "POST", ":path": "/v1/completions"})
    msg.protocol_config.CopyFrom(
        pb.ProtocolConfiguration(
            request_body_mode=BUFFERED,
            response_body_mode=STREAMED,
            send_body_without_waiting_for_header_response=without_waiting,
        )
    )
    (reply,) = s.handle(as_received(msg))
    return pb.ProcessingResponse.FromString(r.serialize(reply))


def test_buffered_headers_reply_asks_to_skip_the_response_only_where_envoy_honours_it() -> None:
    reply = headers_reply(without_waiting=False)
    assert reply.WhichOneof("response") == "request_headers"
    assert reply.HasField("mode_override") and reply.mode_override.response_body_mode == NONE
    assert not headers_reply(without_waiting=True).HasField("mode_override")


def test_a_model_rewrite_keeps_the_response_flowing() -> None:
    """InferenceModelRewrite rules: the client's model name must be restored in the response."""
    assert not headers_reply(without_waiting=False, objects=HERMETIC_OBJECTS).HasField("mode_override")
