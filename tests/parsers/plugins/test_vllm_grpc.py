"""vllmgrpc-parser: gRPC frames of vLLM engine requests, GIE's errors, usage from response frames."""

from __future__ import annotations

import itertools
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from epp.errors import BadRequest
from epp.parsers.api import Parser
from epp.parsers.plugins import vllm_grpc
from epp.parsers.plugins.vllm_grpc import EMBED_PATH, GENERATE_PATH, GrpcUsageParser, VllmGrpcParser
from epp.plugin.base import Handle, NoParams
from epp.request import ApiKind, Usage

GENERATE = {":path": GENERATE_PATH, "hi": "mom"}
EMBED = {":path": EMBED_PATH}


def frame(message: Any, compressed: bool = False) -> bytes:
    payload: bytes = message.SerializeToString()
    return bytes([1 if compressed else 0]) + len(payload).to_bytes(4, "big") + payload


@pytest.fixture
def parser() -> VllmGrpcParser:
    return VllmGrpcParser("vllmgrpc-parser", NoParams(), cast(Handle, None))


def test_is_a_parser(parser: VllmGrpcParser) -> None:
    """The plugin satisfies the Parser protocol with GIE's type and the h2c app protocol."""
    assert isinstance(parser, Parser)
    assert parser.TYPE == "vllmgrpc-parser"
    assert frozenset({"kubernetes.io/h2c"}) == parser.APP_PROTOCOLS


@pytest.mark.parametrize(
    ("headers", "body", "api", "prompt_text", "token_ids", "stream"),
    [
        pytest.param(
            GENERATE,
            frame(pb.GenerateRequest(text="test1")),
            ApiKind.GRPC_GENERATE,
            "test1",
            None,
            False,
            id="generate-text",
        ),
        pytest.param(
            GENERATE,
            frame(pb.GenerateRequest(text="s", stream=True)),
            ApiKind.GRPC_GENERATE,
            "s",
            None,
            True,
            id="generate-stream",
        ),
        pytest.param(
            GENERATE,
            frame(pb.GenerateRequest(tokenized=pb.TokenizedInput(original_text="ab", input_ids=[1, 2]))),
            ApiKind.GRPC_GENERATE,
            "ab",
            [1, 2],
            False,
            id="generate-tokenized",
        ),
        pytest.param(
            EMBED,
            frame(pb.EmbedRequest(tokenized=pb.TokenizedInput(original_text="test1"))),
            ApiKind.GRPC_EMBED,
            "test1",
            [],
            False,
            id="embed",
        ),
        pytest.param(
            GENERATE,
            frame(pb.GenerateRequest(text="x")) + b"trailing",
            ApiKind.GRPC_GENERATE,
            "x",
            None,
            False,
            id="trailing-bytes-ignored",
        ),
    ],
)
def test_parse_valid(
    parser: VllmGrpcParser,
    headers: dict[str, str],
    body: bytes,
    api: ApiKind,
    prompt_text: str,
    token_ids: list[int] | None,
    stream: bool,
) -> None:
    """Generate and Embed frames give the prompt, token ids and stream flag; the body is kept as sent."""
    parsed = parser.parse_request(body, headers)
    assert parsed.api == api
    assert parsed.prompt_text == prompt_text
    assert (None if parsed.token_ids is None else list(parsed.token_ids)) == token_ids
    assert parsed.stream is stream
    assert parsed.json is None
    assert parsed.model == ""
    assert parser.serialize_request(parsed) is body


@pytest.mark.parametrize(
    ("headers", "body", "message"),
    [
        pytest.param(
            GENERATE,
            b"plain text not grpc payload style",
            "parsing gRPC payload for Generate: not able to parse payload",
            id="gie-grpc-case-5",
        ),
        pytest.param(
            {":path": "unsupportedMethod"},
            frame(pb.GenerateRequest(text="x")),
            "unsupported gRPC path: unsupportedMethod",
            id="gie-grpc-case-6",
        ),
        pytest.param({}, frame(pb.GenerateRequest(text="x")), "unsupported gRPC path: ", id="no-path"),
        pytest.param(
            EMBED, b"\x00\x00", "parsing gRPC payload for Embed: not able to parse payload", id="short-header"
        ),
        pytest.param(
            GENERATE,
            frame(pb.GenerateRequest(text="abc"))[:-1],
            "parsing gRPC payload for Generate: not able to parse payload",
            id="truncated-frame",
        ),
        pytest.param(
            GENERATE,
            frame(pb.GenerateRequest(text="x"), compressed=True),
            "parsing gRPC payload for Generate: compressed vllmgrpc payload is not supported",
            id="compressed",
        ),
        pytest.param(
            GENERATE,
            b"\x00\x00\x00\x00\x03\xff\xff\xff",
            "parsing gRPC payload for Generate: proto: cannot parse invalid wire-format data",
            id="corrupt-proto",
        ),
        pytest.param(
            GENERATE,
            frame(pb.GenerateRequest(stream=True)),
            "parsing gRPC payload for Generate: not supported request inputType",
            id="no-input",
        ),
        pytest.param(
            EMBED,
            frame(pb.EmbedRequest(request_id="r")),
            "parsing gRPC payload for Embed: missing tokenized input in EmbedRequest",
            id="embed-no-input",
        ),
    ],
)
def test_parse_invalid(parser: VllmGrpcParser, headers: dict[str, str], body: bytes, message: str) -> None:
    """Bad paths and payloads raise BadRequest with GIE's messages."""
    with pytest.raises(BadRequest) as info:
        parser.parse_request(body, headers)
    assert info.value.msg == message


def test_usage_parser_is_fresh(parser: VllmGrpcParser) -> None:
    """Each response gets its own frame-reassembly state."""
    assert parser.usage_parser({}) is not parser.usage_parser({})


def _complete(prompt: int, completion: int, cached: int = 0) -> bytes:
    return frame(
        pb.GenerateResponse(
            complete=pb.GenerateComplete(
                prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached
            )
        )
    )


def _chunk(prompt: int, completion: int, cached: int = 0, ids: tuple[int, ...] = ()) -> bytes:
    return frame(
        pb.GenerateResponse(
            chunk=pb.GenerateStreamChunk(
                token_ids=list(ids), prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached
            )
        )
    )


def _feed(chunks: list[bytes]) -> list[Usage | None]:
    parser = GrpcUsageParser()
    return [parser.feed(c, i == len(chunks) - 1) for i, c in enumerate(chunks)]


COMPLETE = _complete(7, 10)
# vLLM streams per-chunk deltas, then repeats the last delta in the complete message.
VLLM_STREAM = _chunk(7, 1, 3, (5,)) + _chunk(7, 2, 3, (6, 7)) + _chunk(7, 1, 3, (8,)) + _complete(7, 1, 3)


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        pytest.param([COMPLETE[:6], COMPLETE[6:]], [None, Usage(7, 10, 17, 0)], id="gie-grpc-case-14-split"),
        pytest.param(
            [_chunk(0, 0, ids=(1, 2, 3)), COMPLETE], [None, Usage(7, 10, 17, 0)], id="gie-grpc-case-15-stream"
        ),
        pytest.param([VLLM_STREAM], [Usage(7, 4, 11, 3)], id="vllm-deltas-summed"),
        pytest.param(
            [_complete(5, 3), _complete(5, 4)],
            [Usage(5, 3, 8, 0), Usage(5, 7, 12, 0)],
            id="n2-non-stream-completes-summed",
        ),
        pytest.param(
            [frame(pb.EmbedResponse(embedding=[0.5] * 4, prompt_tokens=7, embedding_dim=4))],
            [Usage(7, 0, 7, None)],
            id="embed-response",
        ),
        pytest.param(
            [frame(pb.EmbedResponse(prompt_tokens=7))], [Usage(7, 0, 7, None)], id="embed-no-vector"
        ),
        pytest.param([b"no healthy upstream"], [None], id="gie-grpc-case-13-invalid"),
        pytest.param(
            [frame(pb.GenerateResponse(complete=pb.GenerateComplete(prompt_tokens=7)), compressed=True)],
            [None],
            id="compressed-skipped",
        ),
        pytest.param(
            [b"\x00\x00\x00\x00\x03\xff\xff\xff", COMPLETE],
            [None, Usage(7, 10, 17, 0)],
            id="corrupt-frame-skipped",
        ),
    ],
)
def test_usage(chunks: list[bytes], expected: list[Usage | None]) -> None:
    """Usage is read from complete frames however chunks cut them; deltas and choices add up."""
    assert _feed(chunks) == expected


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, len(VLLM_STREAM)), max_size=20))
def test_usage_any_split(cuts: list[int]) -> None:
    """Any split of a frame stream gives the same final usage as the unsplit stream."""
    bounds = sorted(set(cuts) | {0, len(VLLM_STREAM)})
    chunks = [VLLM_STREAM[a:b] for a, b in itertools.pairwise(bounds)] or [b""]
    assert _feed(chunks)[-1] == Usage(7, 4, 11, 3)


def test_oversized_frame_skipped_without_buffering(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame over the cap is dropped as it streams past; later frames are still read."""
    monkeypatch.setattr(vllm_grpc, "MAX_RESPONSE_FRAME_BYTES", 100)
    big = _chunk(9, 9, ids=tuple(range(200)))
    parser = GrpcUsageParser()
    for i in range(0, len(big), 64):
        assert parser.feed(big[i : i + 64], False) is None
        assert len(parser._buf) < 64
    assert parser.feed(COMPLETE, True) == Usage(7, 10, 17, 0)
