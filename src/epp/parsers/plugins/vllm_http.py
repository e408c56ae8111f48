"""``vllmhttp-parser`` (llm-d-router): vLLM's HTTP ``/inference/v1/generate``, token ids in.

vLLM's generate endpoint takes a pre-tokenised prompt (``token_ids``) and ``sampling_params``
rather than an OpenAI body; a router in front of disaggregated or custom front-ends sends it.
The token ids feed the prefix-aware plugins directly.  Forwarding (the model spliced into the
original bytes) and response usage (OpenAI's shape) are the OpenAI parser's, shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final

import orjson

from epp.errors import BadRequest
from epp.parsers import gojson
from epp.parsers.plugins.openai import JsonRequestBody, OpenAIParser, decode_error, is_token_ids, request_path
from epp.request import ApiKind, RequestBody

GENERATE_SUFFIX: Final = "inference/v1/generate"
_INVALID: Final = "invalid generate request: "


def _bad_token_ids(value: object) -> str:
    """Which part of ``token_ids`` is not a uint32 (upstream: ``token_ids[2]: invalid value``)."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            if type(item) is not int or not 0 <= item < 1 << 32:
                return f"token_ids[{i}]: invalid value {item!r} (a uint32 token id)"
    return "token_ids must be a list of uint32 token ids"


class VllmHttpParser(OpenAIParser):
    """Type ``vllmhttp-parser``; app protocols ``http``, ``kubernetes.io/h2c``.  No parameters.

    Request (upstream's ``parseGenerateRequest``): the path must end ``inference/v1/generate``
    (else ``unsupported path: <path>``); the body a JSON object whose ``token_ids`` is a
    non-empty list of uint32 (``invalid generate request: must have non-empty token_ids
    field``); ``cache_salt`` a string.  ``model`` and ``stream`` are read when of their type.

    Response usage: the OpenAI parser's (generate responses carry OpenAI's ``usage``).
    """

    TYPE: ClassVar[str] = "vllmhttp-parser"
    PATHS: ClassVar[tuple[str, ...]] = (GENERATE_SUFFIX,)

    def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
        path = request_path(headers)
        if not path.endswith(GENERATE_SUFFIX):
            raise BadRequest(f"unsupported path: {path}")
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise BadRequest(decode_error(body, err)) from None
        if obj is None:
            obj = {}
        elif not isinstance(obj, dict):
            raise BadRequest(gojson.type_error(obj))
        token_ids = obj.get("token_ids")
        if token_ids is not None and not (
            isinstance(token_ids, list) and (not token_ids or is_token_ids(token_ids))
        ):
            raise BadRequest(_INVALID + _bad_token_ids(token_ids))
        if not token_ids:
            raise BadRequest(_INVALID + "must have non-empty token_ids field")
        salt = obj.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise BadRequest(_INVALID + "cache_salt must be a string")
        stream = obj.get("stream") is True
        return JsonRequestBody.parsed(
            ApiKind.GENERATE, body, obj, None, token_ids, stream, salt or "", obj.get("model")
        )
