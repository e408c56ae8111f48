"""llm-d-kv-cache's UDS tokenizer service: the wire codec against the protobuf library, and the
client against a gRPC server on a Unix socket that serves the same proto (tokenising as the
simulator does); an unreachable service fails start after upstream's attempts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from epp.datalayer.kvevents import tokenizer_pb as pb
from epp.datalayer.kvevents.tokenizers import UdsTokenizer
from epp.request import ApiKind
from epp.testing.builders import chat_body, make_request
from epp_sim.tokens import render_chat, token_ids

F = descriptor_pb2.FieldDescriptorProto
_KIND = {
    "str": F.TYPE_STRING,
    "bool": F.TYPE_BOOL,
    "u32s": F.TYPE_UINT32,
    "msg": F.TYPE_MESSAGE,
    "msgs": F.TYPE_MESSAGE,
}


def protobuf_classes() -> dict[str, Any]:
    """The tokenizer.proto messages built with the protobuf library from the schemas' field numbers
    and types, as an independent encoder/decoder to check ours against."""
    schemas = {
        "ImageUrl": pb.IMAGE_URL, "ContentPart": pb.CONTENT_PART, "ChatMessage": pb.CHAT_MESSAGE,
        "RenderChatCompletionRequest": pb.RENDER_CHAT_REQUEST, "RenderCompletionResponse": pb.RENDER_COMPLETION_RESPONSE,
    }  # fmt: skip
    names = {id(s): n for n, s in schemas.items()}
    file = descriptor_pb2.FileDescriptorProto(name="t.proto", package="tokenization", syntax="proto3")
    for name, schema in schemas.items():
        msg = file.message_type.add(name=name)
        for number, (field, kind, sub) in schema.items():
            repeated = kind in ("u32s", "msgs")
            f = msg.field.add(name=field, number=number, type=_KIND[kind])
            f.label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
            if sub is not None:
                f.type_name = ".tokenization." + names[id(sub)]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName("tokenization." + n)) for n in schemas
    }


def test_codec_matches_the_protobuf_library() -> None:
    classes = protobuf_classes()
    request = {
        "model_name": "Qwen/Qwen3",
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content_parts": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": "data:x"}},
                ],
            },
        ],
        "tools_json": "[]",
        "add_generation_prompt": True,
    }
    theirs = classes["RenderChatCompletionRequest"]()
    theirs.ParseFromString(pb.encode(pb.RENDER_CHAT_REQUEST, request))
    assert theirs.model_name == "Qwen/Qwen3" and theirs.tools_json == "[]" and theirs.add_generation_prompt
    assert [m.role for m in theirs.messages] == ["system", "user"]
    assert theirs.messages[1].content_parts[1].image_url.url == "data:x"
    reply = classes["RenderCompletionResponse"](request_id="r", token_ids=[1, 300, 70000], success=True)
    ours = pb.decode(pb.RENDER_COMPLETION_RESPONSE, reply.SerializeToString())
    assert ours == {"request_id": "r", "token_ids": [1, 300, 70000], "success": True, "error_message": ""}
    assert (
        pb.decode(pb.RENDER_CHAT_REQUEST, theirs.SerializeToString())["messages"][1]["content_parts"][0][
            "text"
        ]
        == "hi"
    )


class TokenizerService:
    """The TokenizationService methods the EPP calls, tokenising as the simulator's engines do."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.initialised: list[str] = []

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(fn)

        return grpc.method_handlers_generic_handler(
            "tokenization.TokenizationService",
            {
                "InitializeTokenizer": unary(self.initialise),
                "RenderCompletion": unary(self.render),
                "RenderChatCompletion": unary(self.render_chat),
            },
        )

    async def initialise(self, raw: bytes, context: Any) -> bytes:
        req = pb.decode(pb.INITIALIZE_REQUEST, raw)
        self.initialised.append(req["model_name"])
        ok = req["model_name"] == self.model
        return pb.encode(
            pb.INITIALIZE_RESPONSE, {"success": ok, "error_message": "" if ok else "unknown model"}
        )

    async def render(self, raw: bytes, context: Any) -> bytes:
        req = pb.decode(pb.RENDER_COMPLETION_REQUEST, raw)
        ids = token_ids(req["prompt"]).tolist()
        return pb.encode(
            pb.RENDER_COMPLETION_RESPONSE, {"request_id": "c", "token_ids": ids, "success": True}
        )

    async def render_chat(self, raw: bytes, context: Any) -> bytes:
        req = pb.decode(pb.RENDER_CHAT_REQUEST, raw)
        messages = [
            {
                "role": m["role"],
                "content": m["content"]
                or [{"type": p["type"], "text": p["text"]} for p in m["content_parts"]],
            }
            for m in req["messages"]
        ]
        ids = token_ids(render_chat(messages)).tolist()
        return pb.encode(pb.RENDER_CHAT_RESPONSE, {"request_id": "h", "token_ids": ids, "success": True})


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[str, TokenizerService]]:
    socket = str(tmp_path / "tokenizer-uds.socket")
    impl = TokenizerService("org/model")
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((impl.handler(),))
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    yield socket, impl
    await server.stop(None)


async def test_uds_tokenizer_renders_completions_and_chat(service: tuple[str, TokenizerService]) -> None:
    socket, impl = service
    tok = UdsTokenizer(socket, "org/model")
    await tok.start()
    try:
        assert impl.initialised == ["org/model"]
        completion = make_request(prompt="The quick brown fox")
        assert await tok.token_ids(completion, []) == token_ids("The quick brown fox").tolist()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
        chat = make_request(api=ApiKind.CHAT_COMPLETIONS)
        chat.body = chat_body(messages)
        assert await tok.token_ids(chat, []) == token_ids(render_chat(messages)).tolist()
        assert (tok.calls, tok.failures) == (2, 0)
    finally:
        await tok.close()


async def test_model_tokenizer_map_names_the_directory(service: tuple[str, TokenizerService]) -> None:
    socket, impl = service
    tok = UdsTokenizer(socket, "alias", model_tokenizer_map={"alias": "org/model/tokenizer.json"})
    await tok.start()  # an explicit tokenizer.json path initialises its directory, as upstream
    await tok.close()
    assert impl.initialised == ["org/model"]


async def test_refused_model_and_missing_socket_fail_start(
    service: tuple[str, TokenizerService], tmp_path: Path
) -> None:
    socket, impl = service
    refused = UdsTokenizer(socket, "other/model", retry_delay=0.01)
    with pytest.raises(
        RuntimeError, match="after 5 attempts: tokenizer initialization failed: unknown model"
    ):
        await refused.start()
    assert impl.initialised == ["other/model"] * 5
    missing = UdsTokenizer(str(tmp_path / "nothing.socket"), "org/model", timeout=0.2, retry_delay=0.01)
    with pytest.raises(RuntimeError, match="did not initialise model 'org/model'"):
        await missing.start()
