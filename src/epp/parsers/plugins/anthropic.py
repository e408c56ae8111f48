"""``anthropic-parser`` (llm-d-router): Anthropic Messages API requests, and only those.

``openai-parser`` here already reads ``/v1/messages`` beside the OpenAI paths; this type is for
configs that name llm-d's parser, and keeps its narrower contract: it claims ``messages`` and
``messages/count_tokens`` and refuses every other path.  Decoding, forwarding (the model
spliced into the original bytes) and response usage are the OpenAI parser's, shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final

import orjson

from epp.errors import BadRequest
from epp.parsers import gojson
from epp.parsers.plugins.openai import (
    JsonRequestBody,
    OpenAIParser,
    content_ok,
    decode_error,
    messages_ok,
    request_path,
)
from epp.request import ApiKind, RequestBody

MESSAGES_SUFFIX: Final = "/messages"
COUNT_TOKENS_SUFFIX: Final = "/messages/count_tokens"
_UNMARSHAL: Final = "error unmarshaling request body: "
_PARSING: Final = "error parsing messages request: "


class AnthropicParser(OpenAIParser):
    """Type ``anthropic-parser``; app protocols ``http``, ``kubernetes.io/h2c``.  No parameters.

    Request (upstream's ``ParseRequest``): a path ending ``/messages/count_tokens`` is forwarded
    untouched, unparsed (it returns a token count, nothing to route on or read usage from);
    one ending ``/messages`` must be a JSON object with at least one message (each an object
    with a string ``role`` and string or block-list ``content``), a string or block-list
    ``system`` and a string ``cache_salt``; ``model`` and ``stream`` are read when of their
    type (not refused otherwise, as upstream).  Unlike ``openai-parser``, ``max_tokens`` is not
    required.  Any other path: ``unsupported API endpoint: <path>``.

    Response usage: the OpenAI parser's, which reads Anthropic's ``usage`` (``message_start``
    and ``message_delta`` events when streamed).  It counts the prompt as ``input_tokens`` plus
    cache reads and writes (Anthropic's ``input_tokens`` excludes them); upstream reports
    ``input_tokens`` alone.
    """

    TYPE: ClassVar[str] = "anthropic-parser"
    PATHS: ClassVar[tuple[str, ...]] = ("messages", "messages/count_tokens")

    def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
        path = request_path(headers).rstrip("/")
        if path.endswith(COUNT_TOKENS_SUFFIX):
            return RequestBody(api=ApiKind.RAW, raw=body)
        if not path.endswith(MESSAGES_SUFFIX):
            raise BadRequest(f"unsupported API endpoint: {path}")
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise BadRequest(_UNMARSHAL + decode_error(body, err)) from None
        if obj is None:
            obj = {}  # Go leaves the map empty for `null`: no messages, refused below
        elif not isinstance(obj, dict):
            raise BadRequest(_UNMARSHAL + gojson.type_error(obj))
        messages = obj.get("messages")
        if messages is None or messages == []:
            raise BadRequest("invalid messages request: must have at least one message")
        if not messages_ok(messages):
            raise BadRequest(
                _PARSING + "messages must be objects with a string role and string or block content"
            )
        if not content_ok(obj.get("system")):
            raise BadRequest(_PARSING + "system must be a string or a list of content blocks")
        salt = obj.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise BadRequest(_PARSING + "cache_salt must be a string")
        model = obj.get("model")
        stream = obj.get("stream") is True
        return JsonRequestBody.parsed(ApiKind.MESSAGES, body, obj, None, None, stream, salt or "", model)
