"""Builders of ext_proc ProcessingResponse messages; the only place an EppError becomes HTTP.

Replies sent on every request or chunk are hand-encoded bytes (``wire``); rare ones are
upb messages.  Both travel through ``serialize``, the servicer's response serializer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeAlias

from google.protobuf import struct_pb2

from epp._pb.envoy.config.core.v3 import base_pb2
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._pb.envoy.type.v3 import http_status_pb2
from epp.errors import EppError
from epp.explain.record import BREAKDOWN_KEY, SCORES_KEY
from epp.server import wire

DESTINATION_HEADER: Final = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE: Final = "envoy.lb"
BODY_CHUNK_LIMIT: Final = 62000  # GIE's BodyByteLimit: max bytes per streamed body mutation
RESP_HEADERS_MARKER: Final = ("x-went-into-resp-headers", "true")

ProcessingRequest = pb.ProcessingRequest
ProcessingResponse = pb.ProcessingResponse
# bytes: a reply already serialised (see ``wire``).  Declared an alias: where the stubs are not
# read (mypyc's build skips epp._pb), ``pb.ProcessingResponse | bytes`` would be a variable.
Reply: TypeAlias = pb.ProcessingResponse | bytes

# Replies that never change; grpc serialises a message when it is written, so sharing is safe.
EMPTY_REQUEST_HEADERS: Final = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
EMPTY_REQUEST_TRAILERS: Final = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
EMPTY_RESPONSE_TRAILERS: Final = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
EMPTY_REQUEST_BODY: Final = pb.ProcessingResponse(request_body=pb.BodyResponse())
EMPTY_RESPONSE_BODY: Final = pb.ProcessingResponse(response_body=pb.BodyResponse())
_MARKER_OPTION: Final = wire.header_option(*RESP_HEADERS_MARKER)
_MARKER_ONLY_REPLY: Final = wire.headers_reply(_MARKER_OPTION, request=False, clear_route_cache=False)


def serialize(msg: Reply) -> bytes:
    """The gRPC response serializer: hand-encoded replies are already bytes."""
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


def to_struct(data: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


def _routing_options(
    destination: str, content_length: int | None, extra: Iterable[tuple[str, str]], remove: Sequence[str] = ()
) -> bytes:
    sets = wire.cached_header_option(DESTINATION_HEADER, destination)
    if content_length is not None:
        sets += wire.header_option("Content-Length", str(content_length))
    sets += wire.options(extra)
    return sets + wire.remove_options(remove) if remove else sets


Breakdown = Mapping[str, Mapping[str, float]]  # ip:port -> {scorer name: weighted score}


def _lb_fields(
    destination: str, scores: Mapping[str, float] | None, breakdown: Breakdown | None
) -> dict[str, Any]:
    lb: dict[str, Any] = {DESTINATION_HEADER: destination}
    if scores:
        lb[SCORES_KEY] = dict(scores)
    if breakdown:
        lb[BREAKDOWN_KEY] = {k: dict(v) for k, v in breakdown.items()}
    return lb


def _routing_metadata(
    destination: str, scores: Mapping[str, float] | None, breakdown: Breakdown | None
) -> bytes:
    """``envoy.lb``: the destination, and for an explained request every candidate's final score
    (``{"ip:port": score}``, llm-d-router's layout) and its per-scorer breakdown
    (``{"ip:port": {"scorer": weighted score}}``, docs/explain.md).  Otherwise the cached hand encoding."""
    if not scores and not breakdown:
        return wire.string_metadata(DESTINATION_NAMESPACE, DESTINATION_HEADER, destination)
    md = to_struct({DESTINATION_NAMESPACE: _lb_fields(destination, scores, breakdown)})
    return wire.field(b"\x42", md.SerializeToString())


def routing_headers_response(
    destination: str,
    content_length: int | None,
    extra: Iterable[tuple[str, str]],
    scores: Mapping[str, float] | None = None,
    remove: Sequence[str] = (),
    breakdown: Breakdown | None = None,
) -> bytes:
    """The RequestHeaders reply that routes the request (FULL_DUPLEX_STREAMED and header-only):
    destination header, Content-Length, extras, removed headers, clear_route_cache and
    ``envoy.lb`` metadata."""
    if content_length is not None and not extra and not remove and not scores and not breakdown:
        # The usual reply (no extra headers, not explained): from pieces kept per destination.
        pieces = _DESTINATION_PIECES.get(destination)  # a dict read: an lru_cache hit is ~0.7k
        if pieces is None:
            pieces = _destination_pieces(destination)
        return wire.routing_reply(pieces[0], pieces[1], content_length)
    md = _routing_metadata(destination, scores, breakdown)
    opts = _routing_options(destination, content_length, extra, remove)
    return wire.headers_reply(opts, request=True, clear_route_cache=True, metadata=md)


# destination -> its header option and ``envoy.lb`` metadata, encoded once (destinations repeat:
# one per endpoint or fallback list); starts again past ``_DESTINATIONS_MAX``.
_DESTINATION_PIECES: Final[dict[str, tuple[bytes, bytes]]] = {}
_DESTINATIONS_MAX: Final = 1024


def _destination_pieces(destination: str) -> tuple[bytes, bytes]:
    """The destination header option and the ``envoy.lb`` metadata for ``destination``, kept."""
    if len(_DESTINATION_PIECES) >= _DESTINATIONS_MAX:
        _DESTINATION_PIECES.clear()
    pieces = _DESTINATION_PIECES[destination] = (
        wire.header_option(DESTINATION_HEADER, destination),
        wire.string_metadata(DESTINATION_NAMESPACE, DESTINATION_HEADER, destination),
    )
    return pieces


def routing_body_response(
    destination: str,
    body: bytes | None,
    content_length: int | None,
    extra: Iterable[tuple[str, str]],
    scores: Mapping[str, float] | None = None,
    remove: Sequence[str] = (),
    breakdown: Breakdown | None = None,
) -> pb.ProcessingResponse:
    """The RequestBody reply that routes a BUFFERED request (headers were already answered).

    Not a hot path (BUFFERED mode); the header options are encoded once by ``wire`` and
    decoded into the message, so both routing replies share one encoding of the options.
    """
    common = pb.CommonResponse.FromString(
        wire.field(b"\x12", _routing_options(destination, content_length, extra, remove)) + b"\x28\x01"
    )
    if body is not None:
        common.body_mutation.body = body
    msg = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
    msg.dynamic_metadata.fields[DESTINATION_NAMESPACE].struct_value.update(
        _lb_fields(destination, scores, breakdown)
    )
    return msg


def streamed_body(body: bytes, *, request: bool, end_of_stream: bool) -> list[bytes]:
    """The body as streamed mutations of at most 62,000 bytes; only the last may carry end_of_stream."""
    n = len(body)
    if n <= BODY_CHUNK_LIMIT:
        return [wire.body_reply(body, end_of_stream, request)]
    view = memoryview(body)
    last = (n - 1) // BODY_CHUNK_LIMIT
    return [
        wire.body_reply(
            bytes(view[i * BODY_CHUNK_LIMIT : (i + 1) * BODY_CHUNK_LIMIT]),
            end_of_stream and i == last,
            request,
        )
        for i in range(last + 1)
    ]


def streamed_response_body(
    body: bytes, end_of_stream: bool, metadata: Mapping[str, Any] | None = None
) -> list[Reply]:
    """Response body as streamed mutations; ``metadata`` rides on the last message."""
    out = streamed_body(body, request=False, end_of_stream=end_of_stream)
    if metadata:  # protobuf fields concatenate: append ProcessingResponse.dynamic_metadata
        out[-1] += wire.field(b"\x42", to_struct(metadata).SerializeToString())
    return list(out)


def replaced_response_body(body: bytes | None, metadata: Mapping[str, Any] | None) -> pb.ProcessingResponse:
    """A BUFFERED/STREAMED response-body reply: replace the chunk only if it changed."""
    br = pb.BodyResponse()
    if body is not None:
        br.response.body_mutation.body = body
    msg = pb.ProcessingResponse(response_body=br)
    if metadata:
        msg.dynamic_metadata.CopyFrom(to_struct(metadata))
    return msg


def response_headers_reply(extra: Iterable[tuple[str, str]]) -> bytes:
    """The ResponseHeaders reply: GIE's marker header plus whatever hooks added."""
    if not extra:  # the usual case (no hook added one): no options to encode
        return _MARKER_ONLY_REPLY
    more = wire.options(extra)
    if not more:
        return _MARKER_ONLY_REPLY
    return wire.headers_reply(_MARKER_OPTION + more, request=False, clear_route_cache=False)


DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"  # llm-d-router's name (PR #2462)


def immediate_error(err: EppError) -> pb.ProcessingResponse:
    """GIE's error reply: the HTTP status of the error class and ``inference error: <Code> - <msg>``,
    plus llm-d-router's header saying why the request was dropped."""
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=err.http_status),  # type: ignore[arg-type]
            body=str(err).encode(),
            headers=pb.HeaderMutation(
                set_headers=[
                    base_pb2.HeaderValueOption(
                        header=base_pb2.HeaderValue(key=DROPPED_REASON_HEADER, raw_value=err.reason.encode())
                    )
                ]
            ),
        )
    )


def struct_to_python(s: struct_pb2.Struct) -> dict[str, Any]:
    """Struct → plain dict/list/str/float/bool/None (only for the rare metadata-carrying message)."""
    return {k: _value(v) for k, v in s.fields.items()}


def _value(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "struct_value":
        return struct_to_python(v.struct_value)
    if kind == "list_value":
        return [_value(x) for x in v.list_value.values]
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        return v.number_value
    if kind == "bool_value":
        return v.bool_value
    return None
