"""Deterministic text ↔ token model: 4 characters per token, a chat template, seeded output words."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Mapping
from typing import Any, Final

import xxhash

CHARS_PER_TOKEN: Final = 4
_HASHED_BIT: Final = 0x8000_0000
_MASK64: Final = (1 << 64) - 1
_LCG_MUL: Final = 6364136223846793005
_LCG_INC: Final = 1442695040888963407

# Output vocabulary: every word is exactly one token (4 characters), so a reply of n tokens is 4n chars.
_WORDS: Final = (
    "the and for was one you all but not had has can out new now two may way day see use who its get set"
    " run big red sky sea sun map key box cat dog cup pen top end low far old hot own art air act add age"
    " ago aim arm ask bed bit car cut dry eye fit fun"
)
VOCAB: Final = tuple(" " + word for word in _WORDS.split())


def count_tokens(text: str) -> int:
    """Tokens in `text`: one per started group of four characters."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def token_ids(text: str) -> array[int]:
    """Token ids of `text`; equal text prefixes give equal id prefixes (so prefix caching can work).

    An ASCII chunk's id is its 4 bytes read little-endian (bit 31 clear); any other chunk's id is
    xxh32 of its UTF-8 bytes with bit 31 set, so the two spaces never collide.
    """
    if text.isascii():
        data = text.encode()
        pad = -len(data) % CHARS_PER_TOKEN
        ids = array("I", data + b"\0" * pad if pad else data)
        if sys.byteorder == "big":
            ids.byteswap()
        return ids
    return array(
        "I",
        (
            xxhash.xxh32_intdigest(text[i : i + CHARS_PER_TOKEN].encode()) | _HASHED_BIT
            for i in range(0, len(text), CHARS_PER_TOKEN)
        ),
    )


VOCAB_IDS: Final = tuple(token_ids(word)[0] for word in VOCAB)


def render_chat(messages: Iterable[Mapping[str, Any]]) -> str:
    """Concatenate chat messages as a ChatML template would, ending with the assistant's turn."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{content or ''}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class OutputStream:
    """Seeded word sampler for one request: the same prompt and seed always give the same reply."""

    __slots__ = ("_eos_threshold", "_state")

    def __init__(self, prompt_key: bytes, seed: int, eos_probability: float) -> None:
        self._state = xxhash.xxh3_64_intdigest(prompt_key, seed=seed & _MASK64) or 1
        self._eos_threshold = int(eos_probability * (1 << 20))

    def next(self) -> tuple[int, bool]:
        """The next word's vocabulary index, and whether the model drew end-of-sequence after it."""
        self._state = (self._state * _LCG_MUL + _LCG_INC) & _MASK64
        word = (self._state >> 33) % len(VOCAB)
        eos = ((self._state >> 8) & 0xFFFFF) < self._eos_threshold
        return word, eos
