"""HTTP/2 (RFC 9113) and gRPC framing constants and encoders: what the ext_proc transport sends.

Our replies never use the HPACK dynamic table: response headers and trailers are constant
literal blocks, so encoding costs nothing per call and the peer's table state never matters.
"""

from __future__ import annotations

import struct
from typing import Final
from urllib.parse import quote

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20
# settings
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 1, 2, 3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 4, 5, 6
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT = 0x0, 0x1, 0x2, 0x3, 0x4
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM: Final = 0xB
MAX_WINDOW: Final = 0x7FFFFFFF

# gRPC status codes used here
OK, UNKNOWN, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 0, 2, 8, 12, 13, 14
UNAUTHENTICATED = 16
INVALID_ARGUMENT = 3

RECV_WINDOW: Final = (
    1 << 24
)  # what we grant the connection (streams: H2Limits.stream_window); refilled at half
DEFAULT_WINDOW: Final = 65_535
MAX_FRAME: Final = 16_384  # SETTINGS_MAX_FRAME_SIZE we accept (the protocol default)
Buffer = bytes | bytearray | memoryview  # a frame's payload: a memoryview slice of the read
U32 = struct.Struct(">I")
TYPE_FLAGS_ID = struct.Struct(">BBI")
DATA_HEADER = struct.Struct(">IBIBI")  # frame length<<8|type, flags, stream; gRPC flag, message length


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return bytes((n >> 16, (n >> 8) & 0xFF, n & 0xFF)) + TYPE_FLAGS_ID.pack(kind, flags, stream_id) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """HPACK literal header field without indexing, new name, no Huffman (RFC 7541 §6.2.2)."""
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


def hpack_literal(value: bytes) -> bytes:
    """An HPACK string literal, no Huffman: its length (7-bit prefix) and its bytes."""
    return _hpack_int(len(value), 7) + value


def _hpack_int(n: int, prefix: int) -> bytes:
    limit = (1 << prefix) - 1
    if n < limit:
        return bytes((n,))
    out = bytearray((limit,))
    n -= limit
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# ":status: 200" is static entry 8; content-type (static 31) as a literal without indexing.
RESPONSE_HEADERS: Final = b"\x88" + b"\x0f\x10" + _hpack_int(16, 7) + b"application/grpc"


def trailers(status: int, message: str = "") -> bytes:
    block = _literal(b"grpc-status", str(status).encode())
    if message:
        block += _literal(b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode())
    return block


OK_TRAILERS: Final = trailers(OK)


def server_settings(max_streams: int, stream_window: int, max_header_list: int) -> bytes:
    """Our SETTINGS, and the connection window raised to ``RECV_WINDOW``."""
    entries = struct.pack(
        ">HIHIHIHI",
        S_MAX_CONCURRENT_STREAMS,
        max_streams,
        S_INITIAL_WINDOW_SIZE,
        stream_window,
        S_ENABLE_PUSH,
        0,
        S_MAX_HEADER_LIST_SIZE,
        max_header_list,
    )
    return frame(SETTINGS, 0, 0, entries) + frame(WINDOW_UPDATE, 0, 0, U32.pack(RECV_WINDOW - DEFAULT_WINDOW))


SETTINGS_ACK_FRAME: Final = frame(SETTINGS, ACK, 0)


class H2ConnectionError(Exception):
    """GOAWAY with ``code``: the peer broke the protocol or a limit; the connection is over."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


class StreamError(Exception):
    """RST_STREAM for one stream; the connection goes on."""

    def __init__(self, stream_id: int, code: int) -> None:
        super().__init__(stream_id, code)
        self.stream_id = stream_id
        self.code = code


def unpad(payload: Buffer) -> Buffer:
    if not payload:
        raise H2ConnectionError(PROTOCOL_ERROR)
    pad = payload[0]
    if pad >= len(payload):
        raise H2ConnectionError(PROTOCOL_ERROR)
    return payload[1 : len(payload) - pad]
