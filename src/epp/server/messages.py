"""Envoy's ext_proc request messages, decoded for the session: ``decode`` (a gRPC deserializer).

In C when ``epp.server.incoming``'s extension is built, for the shapes Envoy sends on every
request; everything else, and every message when it is not built, through upb here
(``from_message``).  Both give the same ``Incoming``.
"""

from __future__ import annotations

from typing import Any, Final

from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.server import incoming
from epp.server.incoming import Incoming, ProtocolConfig
from epp.server.responses import struct_to_python


def headers_to_dict(hm: Any) -> dict[str, str]:
    """Envoy header map → dict with lower-cased keys; ``raw_value`` wins over ``value``.

    Invalid UTF-8 in a raw value becomes U+FFFD.  ``decode()`` without arguments is the strict
    fast path, and a header is almost never invalid, so only a map that holds one is decoded
    again with replacement.
    """
    out: dict[str, str] = {}
    try:
        for h in hm.headers:
            raw = h.raw_value
            out[h.key.lower()] = raw.decode() if raw else h.value
    except UnicodeDecodeError:
        for h in hm.headers:
            raw = h.raw_value
            out[h.key.lower()] = raw.decode("utf-8", "replace") if raw else h.value
    return out


_KINDS: Final = {name: kind for kind, name in incoming.KIND_NAMES.items()}


def from_message(msg: pb.ProcessingRequest) -> Incoming:
    """A upb message as the session reads it (the reference for the C decoding)."""
    name = msg.WhichOneof("request")
    kind = _KINDS[name] if name is not None else incoming.NONE
    headers: dict[str, str] | None = None
    body, eos = b"", False
    if kind in (incoming.REQUEST_HEADERS, incoming.RESPONSE_HEADERS):
        http_headers = msg.request_headers if kind == incoming.REQUEST_HEADERS else msg.response_headers
        headers, eos = headers_to_dict(http_headers.headers), http_headers.end_of_stream
    elif kind in (incoming.REQUEST_BODY, incoming.RESPONSE_BODY):
        http_body = msg.request_body if kind == incoming.REQUEST_BODY else msg.response_body
        body, eos = http_body.body, http_body.end_of_stream
    config = None
    if msg.HasField("protocol_config"):
        c = msg.protocol_config
        config = ProtocolConfig(
            c.request_body_mode, c.response_body_mode, c.send_body_without_waiting_for_header_response
        )
    metadata = None
    if msg.HasField("metadata_context"):
        fm = msg.metadata_context.filter_metadata
        metadata = {ns: struct_to_python(s) for ns, s in fm.items()}
    return Incoming(kind, headers, body, eos, config, metadata)


def _from_bytes(data: bytes | bytearray | memoryview) -> Incoming:
    return from_message(pb.ProcessingRequest.FromString(bytes(data)))  # bytes(b) is b: no copy


decode: Final = incoming.decoder(_from_bytes)
