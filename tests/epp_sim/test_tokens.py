"""Tests of the deterministic text ↔ token model."""

from __future__ import annotations

import pytest

from epp_sim.tokens import VOCAB, VOCAB_IDS, OutputStream, count_tokens, render_chat, token_ids


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", 0, id="empty"),
        pytest.param("a", 1, id="one-char"),
        pytest.param("abcd", 1, id="exactly-four"),
        pytest.param("abcde", 2, id="five-starts-a-second-token"),
        pytest.param("x" * 4000, 1000, id="long"),
        pytest.param("héllo wörld", 3, id="non-ascii-counts-characters"),
    ],
)
def test_count_tokens(text: str, expected: int) -> None:
    """A token is four characters; a started group counts, and token_ids agrees with the count."""
    assert count_tokens(text) == expected
    assert len(token_ids(text)) == expected


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        pytest.param("The quick brown fox jumps", "The quick brown cat", 4, id="ascii-prefix"),
        pytest.param("über alles und mehr", "über alles oder", 2, id="non-ascii-prefix"),
        pytest.param("abcd", "bcda", 0, id="no-prefix"),
    ],
)
def test_token_ids_share_text_prefixes(a: str, b: str, shared: int) -> None:
    """Texts with a common prefix share exactly the ids of the whole 4-char chunks inside it."""
    ta, tb = token_ids(a), token_ids(b)
    common = 0
    while common < min(len(ta), len(tb)) and ta[common] == tb[common]:
        common += 1
    assert common == shared


def test_ascii_and_hashed_ids_never_collide() -> None:
    """ASCII chunk ids have bit 31 clear and hashed (non-ASCII) ones have it set."""
    assert all(t < 2**31 for t in token_ids("plain ascii text"))
    assert all(t >= 2**31 for t in token_ids("éééééééé"))


def test_vocab_words_are_single_tokens() -> None:
    """Every output word is exactly one token, so n generated tokens are 4n characters."""
    assert len(set(VOCAB)) == len(VOCAB) >= 32
    assert all(len(w) == 4 and count_tokens(w) == 1 for w in VOCAB)
    assert tuple(token_ids(w)[0] for w in VOCAB) == VOCAB_IDS


def test_render_chat_concatenates_messages_with_template() -> None:
    """Chat messages render as ChatML, including text content parts, ending with the assistant turn."""
    text = render_chat(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]},
        ]
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("seed_a", "seed_b", "same"),
    [
        pytest.param(0, 0, True, id="same-seed-same-words"),
        pytest.param(0, 1, False, id="other-seed-other-words"),
    ],
)
def test_output_stream_is_seeded(seed_a: int, seed_b: int, same: bool) -> None:
    """The reply depends only on prompt and seed."""
    a = OutputStream(b"prompt", seed_a, 0.0)
    b = OutputStream(b"prompt", seed_b, 0.0)
    words_a = [a.next()[0] for _ in range(32)]
    words_b = [b.next()[0] for _ in range(32)]
    assert (words_a == words_b) is same


@pytest.mark.parametrize(
    ("probability", "expect_eos"),
    [pytest.param(0.0, False, id="never"), pytest.param(1.0, True, id="always")],
)
def test_output_stream_eos_probability(probability: float, expect_eos: bool) -> None:
    """EOS is drawn with the configured probability (0 never, 1 on the first token)."""
    stream = OutputStream(b"p", 3, probability)
    assert all(stream.next()[1] is expect_eos for _ in range(100))
