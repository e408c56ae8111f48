"""``openai-parser``: OpenAI-compatible JSON bodies (and Anthropic ``/v1/messages``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import orjson

from epp.errors import BadRequest
from epp.parsers import gojson
from epp.parsers.api import UsageParser
from epp.parsers.json_rewrite import replace_model
from epp.parsers.sse import SseUsageParser
from epp.parsers.usage import JsonUsageParser
from epp.plugin.base import PluginBase
from epp.request import ApiKind, RequestBody

_BODYMAP: Final = "error unmarshaling request bodyMap: "
_DEFAULT_PATH: Final = "/v1/completions"
_PATH_HEADERS: Final = (":path", "x-original-path", "x-forwarded-path")
# Longest suffix first: "/chat/completions" also ends with "/completions".
_SUFFIXES: Final = (
    ("/messages/count_tokens", ApiKind.MESSAGES),
    # vLLM's render endpoints take their parent's body (llm-d-router's determineAPITypeFromPath).
    ("/chat/completions/render", ApiKind.CHAT_COMPLETIONS),
    ("/completions/render", ApiKind.COMPLETIONS),
    ("/chat/completions", ApiKind.CHAT_COMPLETIONS),
    ("/completions", ApiKind.COMPLETIONS),
    ("/embeddings", ApiKind.EMBEDDINGS),
    ("/responses", ApiKind.RESPONSES),
    ("/conversations", ApiKind.CONVERSATIONS),
    ("/messages", ApiKind.MESSAGES),
)
_UINT32: Final = 1 << 32
_new: Final = object.__new__  # a bare instance for ``JsonRequestBody.parsed``
_INT_ONLY: Final = {int}
_STR_ONLY: Final = {str}


@dataclass(slots=True, kw_only=True)
class JsonRequestBody(RequestBody):
    """A RequestBody that remembers what was parsed, so an unchanged body is forwarded as sent."""

    parsed_json: dict[str, Any] | None = None
    parsed_model: object = None

    @classmethod
    def parsed(
        cls,
        api: ApiKind,
        raw: bytes,
        obj: dict[str, Any],
        prompt_text: str | None,
        token_ids: Sequence[int] | None,
        stream: bool,
        cache_salt: str,
        model: object,
    ) -> JsonRequestBody:
        """A body as a parser makes it: ``obj`` decoded from ``raw``, ``model`` its model field as sent.

        Each slot set once on a bare object, as ``InferenceRequest.received``: calling the class
        with nine keywords passes them to the dataclass ``__init__`` as a dict (~5k instructions
        more, every request).  tests/parsers/plugins/test_openai.py holds it equal to the keyword
        constructor, every field set.
        """
        b: JsonRequestBody = _new(cls)
        b.api = api
        b.raw = raw
        b.json = obj
        b.prompt_text = prompt_text
        b.token_ids = token_ids
        b.stream = stream
        b.cache_salt = cache_salt
        b.parsed_json = obj
        b.parsed_model = model
        return b


def request_path(headers: Mapping[str, str]) -> str:
    """GIE's path lookup order, without the query string."""
    for key in _PATH_HEADERS:
        path = headers.get(key)
        if path:
            return path.split("?", 1)[0]
    return _DEFAULT_PATH


@functools.lru_cache(maxsize=256)  # pure, and a deployment's paths are few: one C-level lookup a request
def api_kind(path: str) -> ApiKind:
    """The API a path speaks, by suffix; anything unknown is completions, as in GIE."""
    path = path.rstrip("/")
    for suffix, kind in _SUFFIXES:
        if path.endswith(suffix):
            return kind
    if "/conversations/" in path and path.endswith("/items"):
        return ApiKind.CONVERSATIONS
    return ApiKind.COMPLETIONS


def _decode_error(body: bytes, err: orjson.JSONDecodeError) -> str:
    """Go's message when Go would refuse the body too, else orjson's in the same slot."""
    go = gojson.syntax_error(body)
    if go is not None:
        return go
    msg = err.msg
    if msg == "unexpected end of data":  # a body too large to replay, cut short
        return gojson.END_OF_INPUT
    if "UTF-8" in msg:
        return "invalid UTF-8 in JSON input"
    if "depth" in msg or "recursion" in msg.lower():
        return "exceeded max depth"
    return msg


def _is_token_ids(items: list[Any]) -> bool:
    """Every item an int (not bool) in uint32 range; C-level passes, as prompts can be 100k ids."""
    if set(map(type, items)) != _INT_ONLY:
        return False
    return bool(min(items) >= 0 and max(items) < _UINT32)


def _prompt(value: Any) -> tuple[str | None, list[int] | None] | None:
    """(text, token ids) of a prompt: str | str[] | int[] | int[][]; None when empty or malformed."""
    if isinstance(value, str):
        return (value, None) if value else None
    if not isinstance(value, list) or not value:
        return None
    first = value[0]
    if isinstance(first, str):
        if set(map(type, value)) == _STR_ONLY:
            return " ".join(value), None
        return None
    if isinstance(first, list):
        if all(type(p) is list and p and _is_token_ids(p) for p in value):
            return None, [t for p in value for t in p]
        return None
    return (None, value) if _is_token_ids(value) else None


def _content_ok(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(isinstance(block, dict) for block in content)


def _messages_ok(messages: Any) -> bool:
    if not isinstance(messages, list) or not messages:
        return False
    for m in messages:
        if not isinstance(m, dict):
            return False
        role = m.get("role")
        if role is not None and not isinstance(role, str):
            return False
        content = m.get("content")
        if content is not None and content.__class__ is not str and not _content_ok(content):
            return False  # (a plain string, the usual content, needs no call)
    return True


Check = Callable[[dict[str, Any], str], tuple[str | None, list[int] | None]]


def _check_chat(obj: dict[str, Any], _: str) -> tuple[str | None, list[int] | None]:
    if not _messages_ok(obj.get("messages")):
        raise BadRequest("invalid chat completions request: must have valid messages field")
    return None, None


def _check_completions(obj: dict[str, Any], _: str) -> tuple[str | None, list[int] | None]:
    prompt = _prompt(obj.get("prompt"))
    if prompt is None:
        raise BadRequest("invalid completions request: must have prompt field")
    return prompt


def _check_embeddings(obj: dict[str, Any], _: str) -> tuple[str | None, list[int] | None]:
    given = _prompt(obj.get("input"))
    if given is None:
        raise BadRequest("invalid embeddings request: must have input field")
    return given


def _check_responses(obj: dict[str, Any], _: str) -> tuple[str | None, list[int] | None]:
    if obj.get("input") is None:
        raise BadRequest("invalid responses request: must have input field")
    return None, None


def _check_conversations(obj: dict[str, Any], _: str) -> tuple[str | None, list[int] | None]:
    items = obj.get("items")
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise BadRequest("invalid conversations request: must have items field")
    return None, None


def _check_messages(obj: dict[str, Any], path: str) -> tuple[str | None, list[int] | None]:
    if not _messages_ok(obj.get("messages")):
        raise BadRequest("invalid messages request: must have valid messages field")
    system = obj.get("system")
    if not _content_ok(system):
        raise BadRequest("invalid messages request: system must be a string or a list of content blocks")
    if not path.endswith("/count_tokens"):  # counting tokens needs no output budget
        max_tokens = obj.get("max_tokens")
        if max_tokens is None:
            raise BadRequest("invalid messages request: must have max_tokens field")
        if type(max_tokens) is not int:
            raise BadRequest("invalid messages request: max_tokens must be an integer")
    return None, None


_CHECKS: Final[dict[ApiKind, Check]] = {
    ApiKind.CHAT_COMPLETIONS: _check_chat,
    ApiKind.COMPLETIONS: _check_completions,
    ApiKind.EMBEDDINGS: _check_embeddings,
    ApiKind.RESPONSES: _check_responses,
    ApiKind.CONVERSATIONS: _check_conversations,
    ApiKind.MESSAGES: _check_messages,
}
_LABELS: Final = {
    ApiKind.CHAT_COMPLETIONS: "chat completions",
    ApiKind.COMPLETIONS: "completions",
    ApiKind.EMBEDDINGS: "embeddings",
    ApiKind.RESPONSES: "responses",
    ApiKind.CONVERSATIONS: "conversations",
    ApiKind.MESSAGES: "messages",
}


class OpenAIParser(PluginBase):
    """Parses OpenAI-compatible JSON requests and finds token usage in their responses.

    Type ``openai-parser`` (GIE's default parser); app protocols ``http`` and ``kubernetes.io/h2c``.

    Request: the body must be a JSON object. The API is chosen by the path suffix (``:path``,
    then ``x-original-path``, ``x-forwarded-path``, default ``/v1/completions``; query string
    ignored): ``/chat/completions`` needs a non-empty ``messages`` list whose contents are
    strings or block lists; ``/completions`` a non-empty ``prompt`` (string, strings, token ids
    or lists of token ids); ``/embeddings`` a non-empty ``input`` of the same shapes;
    ``/responses`` an ``input``; ``/conversations`` a non-empty ``items`` list; Anthropic
    ``/messages`` (not in GIE) a valid ``messages`` list, a string or block-list ``system`` and
    an integer ``max_tokens`` (not for ``/messages/count_tokens``). Unknown paths are
    completions. Errors use GIE's messages, including Go's JSON syntax errors; ``model``,
    ``stream`` and ``cache_salt`` of the wrong type are refused with a message naming the field
    (a missing ``model`` is left to the director, which answers GIE's ``model not found``).

    Forwarding: the body is sent as received; when the director changed ``json["model"]`` only
    that value is spliced into the original bytes; if it replaced ``json`` wholesale, or the
    model cannot be located, the object is re-encoded with orjson.

    Response usage: ``text/event-stream`` responses go through ``SseUsageParser``, others are
    buffered (up to 16 MiB) and decoded at end of stream. Parameters: none.
    """

    TYPE: ClassVar[str] = "openai-parser"
    APP_PROTOCOLS: ClassVar[frozenset[str]] = frozenset({"http", "kubernetes.io/h2c"})
    # Path suffixes claimed when several parsers are listed (llm-d-router's Claims; its
    # images/generations is left out: this parser does not read that API).
    PATHS: ClassVar[tuple[str, ...]] = (
        "chat/completions",
        "completions",
        "embeddings",
        "responses",
        "conversations",
        "chat/completions/render",
        "completions/render",
    )

    def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
        path = request_path(headers)
        api = api_kind(path)
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise BadRequest(_BODYMAP + _decode_error(body, err)) from None
        if not isinstance(obj, dict):
            if obj is not None:
                raise BadRequest(_BODYMAP + gojson.type_error(obj))
            obj = {}  # Go leaves the map empty for `null`; the API check below then fails
        prompt_text, token_ids = _CHECKS[api](obj, path)
        label = _LABELS[api]
        model = obj.get("model")
        if model is not None and not isinstance(model, str):
            raise BadRequest(f"invalid {label} request: model must be a string")
        stream = obj.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise BadRequest(f"invalid {label} request: stream must be a boolean")
        salt = obj.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise BadRequest(f"invalid {label} request: cache_salt must be a string")
        return JsonRequestBody.parsed(
            api, body, obj, prompt_text, token_ids, stream is True, salt or "", model
        )

    def serialize_request(self, body: RequestBody) -> bytes:
        obj = body.json
        if obj is None:
            return body.raw
        if isinstance(body, JsonRequestBody) and obj is body.parsed_json:
            model = obj.get("model")
            if model == body.parsed_model:
                return body.raw
            if isinstance(model, str) and isinstance(body.parsed_model, str):
                spliced = replace_model(body.raw, body.parsed_model, model)
                if spliced is not None:
                    return spliced
        return orjson.dumps(obj)

    def usage_parser(self, headers: Mapping[str, str]) -> UsageParser | None:
        if "text/event-stream" in headers.get("content-type", "").lower():
            return SseUsageParser()
        return JsonUsageParser()


# Shared with anthropic-parser and vllmhttp-parser (the same decoding, llm-d's narrower contracts).
content_ok, decode_error, is_token_ids, messages_ok = _content_ok, _decode_error, _is_token_ids, _messages_ok
