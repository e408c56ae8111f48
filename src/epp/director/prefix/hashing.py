"""Prompt → chained xxHash64 block hashes, as GIE's approximate prefix producer computes them."""

from __future__ import annotations

import functools
import sys
from array import array
from collections.abc import Sequence
from typing import Any, Final

import orjson
from xxhash import xxh64_intdigest

from epp.director.prefix import native
from epp.director.prefix.native import kept_messages
from epp.request import ApiKind, InferenceRequest, RequestBody

AVERAGE_CHARS_PER_TOKEN: Final = 4


def user_input_bytes(body: RequestBody) -> bytes:
    """The part of the body that a model server's prefix cache sees, as bytes.

    Per API, as GIE: chat → JSON of the messages keeping only ``role`` (when non-empty)
    and ``content``; completions → the prompt text (a list of strings joined by " ";
    token-id prompts → nothing); embeddings → JSON of ``input``; responses → JSON of
    ``[{"instructions"}?, {"tools"}?, {"input"}]``; conversations → JSON of ``items``.
    Ours: Anthropic messages → like chat, with the top-level ``system`` prompt first as a
    ``system`` message; vLLM gRPC → the prompt text, or the token ids as little-endian
    uint32 bytes (4 bytes per token, so one block of N tokens is N ids).  Raw bodies → nothing.
    JSON here is orjson's compact form: the bytes are an internal key, never compared with Go's.
    """
    api = body.api
    doc = body.json
    if api is ApiKind.CHAT_COMPLETIONS:
        return orjson.dumps(kept_messages(doc.get("messages") if doc else None, None))
    if api is ApiKind.COMPLETIONS:
        if doc is not None and "prompt" in doc:
            return _prompt_text(doc["prompt"]).encode()
        return (body.prompt_text or "").encode()
    if api is ApiKind.MESSAGES:
        return _messages_json(doc.get("messages") if doc else None, doc.get("system") if doc else None)
    if api is ApiKind.EMBEDDINGS:
        return orjson.dumps(doc.get("input") if doc else None)
    if api is ApiKind.RESPONSES:
        combined: list[dict[str, Any]] = []
        if doc is not None:
            if doc.get("instructions") is not None:
                combined.append({"instructions": doc["instructions"]})
            if doc.get("tools") is not None:
                combined.append({"tools": doc["tools"]})
        combined.append({"input": doc.get("input") if doc else None})
        return orjson.dumps(combined)
    if api is ApiKind.CONVERSATIONS:
        return orjson.dumps(doc.get("items") if doc else None)
    if api in (ApiKind.GRPC_GENERATE, ApiKind.GRPC_EMBED):
        if body.prompt_text:
            return body.prompt_text.encode()
        if body.token_ids:
            return _token_bytes(body.token_ids)
        return b""
    return b""


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    try:
        ids = array("I", token_ids)
    except (OverflowError, TypeError):
        return b""  # not uint32 token ids: nothing sensible to hash
    if sys.byteorder == "big":  # pragma: no cover - little-endian everywhere we run
        ids.byteswap()
    return ids.tobytes()


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return " ".join(prompt)
    return ""  # token ids (or lists of them): GIE hashes nothing


def _messages_json(messages: Any, system: Any) -> bytes:
    # the kept messages are built by ``native.kept_messages`` (in C when built: ~2.4k less a request)
    return orjson.dumps(kept_messages(messages, system))


def prefix_seed(request: InferenceRequest) -> int:
    """The chain's start: xxh64 of the target model followed by the cache salt."""
    return _seed(request.target_model + (request.body.cache_salt if request.body is not None else ""))


@functools.lru_cache(maxsize=4096)
def _seed(key: str) -> int:
    """A deployment has a few models and salts: their seeds are kept, not hashed again per request."""
    return xxh64_intdigest(key.encode())


# ``chain_hashes(data, block_bytes, max_blocks, seed)``: ``h_i = xxh64(block_i, seed=h_{i-1})``
# with ``h_{-1} = seed``.  Nothing when ``data`` is shorter than one block; ``data`` is cut to
# ``max_blocks`` blocks; a trailing partial block is hashed like a full one.  GIE appends the
# previous hash to the block's bytes instead (``xxh64(block ‖ LE64(prev))``); chaining through
# the seed gives each hash the same dependence on the whole prefix without building a new bytes
# object per block, which measured ~35% faster.  The values are internal keys of this index and
# of its peers' (sync), never compared with Go's; the C and Python implementations
# (epp.director.prefix.native) give the same.
chain_hashes = native.chain_hashes


def hash_request(request: InferenceRequest, block_tokens: int, max_blocks: int) -> list[int]:
    """The request's prefix block hashes; empty without a hashable body."""
    body = request.body
    if body is None:
        return []
    block_bytes = block_tokens * AVERAGE_CHARS_PER_TOKEN
    data = user_input_bytes(body)
    if len(data) < block_bytes or block_bytes <= 0:
        return []
    return chain_hashes(data, block_bytes, max_blocks, _seed(request.target_model + body.cache_salt))
