"""``passthrough-parser``: forwards any body untouched, for protocols the EPP does not understand."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from epp.parsers.api import UsageParser
from epp.plugin.base import PluginBase
from epp.request import ApiKind, RequestBody


class PassthroughParser(PluginBase):
    """Treats the request body as opaque bytes. Type ``passthrough-parser``; any app protocol.

    The body is not parsed (``ApiKind.RAW``, no JSON, no prompt), so there is no model to
    rewrite, no prefix-aware routing and no usage in responses; routing uses load only.
    Parameters: none.
    """

    TYPE: ClassVar[str] = "passthrough-parser"
    APP_PROTOCOLS: ClassVar[frozenset[str]] = frozenset()
    PATHS: ClassVar[tuple[str, ...]] = ()  # claims nothing: the fallback among several parsers

    def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
        return RequestBody(api=ApiKind.RAW, raw=body)

    def serialize_request(self, body: RequestBody) -> bytes:
        return body.raw

    def usage_parser(self, headers: Mapping[str, str]) -> UsageParser | None:
        return None
