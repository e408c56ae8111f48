"""SSE usage parsing: any chunk boundaries, CRLF, Responses API and Anthropic event streams."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.parsers import sse
from epp.parsers.sse import SseUsageParser
from epp.request import Usage


def _chunk(content: str, finish: str | None = None) -> bytes:
    reason = "null" if finish is None else f'"{finish}"'
    return (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"'
        + content.encode()
        + b'"},"logprobs":null,"finish_reason":'
        + reason.encode()
        + b"}]}\n\n"
    )


VLLM_STREAM = (
    _chunk("")
    + _chunk("Hello")
    + _chunk(' \\"usage\\": {\\"prompt_tokens\\": 999}')  # text that mentions usage must not count
    + _chunk(" world", finish="stop")
    + b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":7,"total_tokens":17,"completion_tokens":10,'
    b'"prompt_tokens_details":{"cached_tokens":3}}}\n\n'
    b"data: [DONE]\n\n"
)
VLLM_USAGE = Usage(prompt_tokens=7, completion_tokens=10, total_tokens=17, cached_tokens=3)


def _run(chunks: Sequence[bytes]) -> list[Usage | None]:
    parser = SseUsageParser()
    results = [parser.feed(c, False) for c in chunks]
    results.append(parser.feed(b"", True))
    return results


def test_gie_case_19() -> None:
    """GIE's SSE token-counting case: usage then [DONE] in one chunk, then an empty EOS chunk."""
    results = _run(
        [
            b"data: {}",
            b'data: {"usage":{"prompt_tokens":7,"total_tokens":17,"completion_tokens":10}}\ndata: [DONE]',
        ]
    )
    assert results == [None, Usage(7, 10, 17), Usage(7, 10, 17)]


@pytest.mark.parametrize("newline", [pytest.param(b"\n", id="lf"), pytest.param(b"\r\n", id="crlf")])
def test_every_two_way_split(newline: bytes) -> None:
    """Splitting the stream at any single byte offset yields exactly the final usage."""
    stream = VLLM_STREAM.replace(b"\n", newline)
    for cut in range(len(stream) + 1):
        assert _run([stream[:cut], stream[cut:]])[-1] == VLLM_USAGE, cut


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.integers(0, len(VLLM_STREAM)), max_size=40), crlf=st.booleans())
def test_any_split(cuts: list[int], crlf: bool) -> None:
    """Any split of a realistic vLLM stream (LF or CRLF) yields exactly the usage of its last data chunk."""
    stream = VLLM_STREAM.replace(b"\n", b"\r\n") if crlf else VLLM_STREAM
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    results = _run(chunks)
    assert results[-1] == VLLM_USAGE
    assert all(r is None or r == VLLM_USAGE for r in results)


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        pytest.param(
            [b'data:{"usage":{"prompt_tokens":1,"completion_tokens":2}}\n'], Usage(1, 2, 3), id="no-space"
        ),
        pytest.param(
            [b'data: {"usage":{"prompt_tokens":1,"completion_tokens":2}}\r\n\r\n'], Usage(1, 2, 3), id="crlf"
        ),
        pytest.param(
            [b'data: {"usage" : {"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}'],
            Usage(1, 2, 3),
            id="unterminated-last-line",
        ),
        pytest.param([b'data: {"usage":null,"choices":[]}\n\n'] * 3, None, id="usage-null-chunks"),
        pytest.param(
            [
                b'data: {"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n',
                b'data: {"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n',
            ],
            Usage(5, 2, 7),
            id="continuous-usage-latest-wins",
        ),
        pytest.param(
            [
                b'data: {"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n',
                b'data: {"usage":{"prompt_tokens":9,"completion_tokens":9}\n\n',
            ],
            Usage(5, 2, 7),
            id="broken-json-ignored",
        ),
        pytest.param(
            [b'event: x\nid: 1\n: comment\nretry: 5\n\ndata: {"usage":{"prompt_tokens":1}}\n\n'],
            Usage(1, 0, 1),
            id="other-fields",
        ),
        pytest.param([b'data: [{"usage":{"prompt_tokens":1}}]\n\n'], None, id="not-an-object"),
        pytest.param([b'data: {"x":{"usage":{"prompt_tokens":1}}}\n\n'], None, id="nested-usage-ignored"),
        pytest.param([b'{"usage":{"prompt_tokens":1}}\n\n'], None, id="not-a-data-line"),
        pytest.param([b"data: [DONE]\n\n"], None, id="done-only"),
        pytest.param([], None, id="empty"),
    ],
)
def test_lines(chunks: list[bytes], expected: Usage | None) -> None:
    """Line-level SSE rules: data prefix with or without space, CRLF, null usage, last line at EOS."""
    assert _run(chunks)[-1] == expected


RESPONSES_STREAM = (
    b"event: response.created\n"
    b'data: {"type":"response.created","response":{"id":"r1","object":"response","usage":null}}\n\n'
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","delta":"hi"}\n\n'
    b"event: response.completed\n"
    b'data: {"type":"response.completed","response":{"id":"r1","object":"response","status":"completed",'
    b'"usage":{"input_tokens":31,"input_tokens_details":{"cached_tokens":16},"output_tokens":12,'
    b'"total_tokens":43}}}\n\n'
)

ANTHROPIC_STREAM = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
    b'"content":[],"usage":{"input_tokens":25,"cache_creation_input_tokens":2,"cache_read_input_tokens":5,'
    b'"output_tokens":1}}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}\n\n'
    b"event: message_stop\n"
    b'data: {"type":"message_stop"}\n\n'
)

VLLM_ANTHROPIC_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":7,'
    b'"output_tokens":0}}}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"input_tokens":7,"output_tokens":10}}\n\n'
)


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        pytest.param(RESPONSES_STREAM, Usage(31, 12, 43, 16), id="responses-api"),
        pytest.param(ANTHROPIC_STREAM, Usage(32, 15, 47, 5), id="anthropic"),
        pytest.param(VLLM_ANTHROPIC_STREAM, Usage(7, 10, 17, None), id="vllm-anthropic"),
        pytest.param(VLLM_STREAM, VLLM_USAGE, id="vllm-chat"),
    ],
)
def test_event_streams(stream: bytes, expected: Usage) -> None:
    """Responses API and Anthropic usage events map to prompt/completion/cached tokens, at any split."""
    assert _run([stream])[-1] == expected
    assert _run([stream[i : i + 7] for i in range(0, len(stream), 7)])[-1] == expected


def test_anthropic_start_alone() -> None:
    """After message_start only, the prompt side is known and output is what start reported."""
    start = ANTHROPIC_STREAM.split(b"event: content_block_delta")[0]
    assert _run([start])[-1] == Usage(32, 1, 33, 5)


def test_overlong_line_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line longer than the cap is not buffered, and usage on later lines is still found."""
    monkeypatch.setattr(sse, "MAX_LINE_BYTES", 64)
    big = b'data: {"usage":{"prompt_tokens":99},"pad":"' + b"x" * 200
    usage = b'data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
    parser = SseUsageParser()
    for i in range(0, len(big), 50):
        assert parser.feed(big[i : i + 50], False) is None
    assert parser._pending_size <= 64
    assert parser.feed(b'"}\n\n' + usage, True) == Usage(1, 1, 2)


def test_chunks_as_lines_like_gie() -> None:
    """Events sent in separate chunks without newlines are still read, as GIE reads them."""
    assert _run([b"data: {}", b'data: {"usage":{"prompt_tokens":7,"completion_tokens":10}}'])[-1] == Usage(
        7, 10, 17
    )
