"""One HTTP/2 connection carrying gRPC calls: frames in, calls to handlers, frames out.

Every frame is checked as RFC 9113 says (lengths, stream states, windows) and every resource a
peer can make us hold is bounded (``H2Limits``): streams, header lists, messages, buffered bytes,
queued control frames, resets, CONTINUATION chains, empty frames, the output buffer (reading
pauses while the transport's buffer is above its high-water mark) and time (handshake, idle,
keepalive).  A peer that breaks a limit gets GOAWAY ENHANCE_YOUR_CALM, as from nghttp2 or Envoy.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import TYPE_CHECKING

import hpack
import structlog

from epp.server.h2.calls import Call
from epp.server.h2.frames import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INTERNAL,
    MAX_FRAME,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RECV_WINDOW,
    REFUSED_STREAM,
    RESOURCE_EXHAUSTED,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    SETTINGS_ACK_FRAME,
    SETTINGS_TIMEOUT,
    STREAM_CLOSED,
    TYPE_FLAGS_ID,
    U32,
    UNAVAILABLE,
    UNIMPLEMENTED,
    WINDOW_UPDATE,
    ConnectionError_,
    StreamError,
    frame,
    server_settings,
    unpad,
)

if TYPE_CHECKING:
    from epp.server.h2.limits import H2Limits
    from epp.server.h2.server import H2GrpcServer

log = structlog.get_logger(__name__)
Buffer = bytes | bytearray | memoryview  # frames are memoryview slices of the read
RECENT_RESETS = 1000  # reset streams remembered (RFC 9113 §5.4.2: frames may still be in flight)
QUEUED_MESSAGE_COST = 256  # what a decoded message waiting for a busy call costs beyond its bytes
WRITE_HIGH_WATER = 4 << 20  # the transport's buffer above which reading and sending pause
WRITE_LOW_WATER = 1 << 20
KEEPALIVE_PING = b"epp-kapg"


class Connection(asyncio.Protocol):
    """One client connection: frames in, calls dispatched to handlers, frames out."""

    def __init__(self, server: H2GrpcServer) -> None:
        self._server = server
        limits: H2Limits = server.limits
        self._limits = limits
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._preface = False
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 4 * limits.max_header_list_bytes  # an HPACK bomb stops here
        self._header_cache: dict[bytes, tuple[list[tuple[bytes, bytes]], int]] = {}
        self._calls: dict[int, Call] = {}
        self._last_stream = 0
        self._reset_ids: dict[int, None] = {}  # streams we reset lately: what the peer still sends is ignored
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._eof_sent = False  # after write_eof the transport refuses writes though it is not closing
        self._loop = asyncio.get_running_loop()
        self._continuation: tuple[int, int, bytearray] | None = None  # (stream, flags, block)
        self._continuations = 0
        self._recv_window = RECV_WINDOW  # what the peer may still send on the connection
        self._recv_unacked = 0
        self.stream_window = limits.stream_window
        self.max_message = limits.max_message_bytes
        self._credit_at = self.stream_window // 2
        self.buffered = 0  # bytes held for the peer: partial messages, messages queued for busy calls
        self._goaway_sent = False
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16_384
        self.write_paused = False
        self._window_waiters: list[asyncio.Future[None]] = []
        # floods
        self._empty = 0
        self._control_out = 0
        now = self._loop.time()
        self._reset_tokens = float(limits.reset_burst)
        self._reset_stamp = now
        # time
        self._settings_seen = False  # the peer's first SETTINGS
        self._settings_acked = False  # our SETTINGS
        self._born = now
        self._last_read = now
        self._idle_since = now
        self._ping_deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        timeouts = [
            t
            for t in (
                limits.handshake_timeout,
                limits.idle_timeout,
                limits.keepalive_time,
                limits.keepalive_timeout,
            )
            if t > 0
        ]
        self._tick_every = max(0.01, min([1.0, *(t / 4 for t in timeouts)]))

    # -- transport callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass it
        with contextlib.suppress(AttributeError, NotImplementedError):
            self._transport.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)  # type: ignore[union-attr]
        self._server.connections.add(self)
        limits = self._limits
        self.write(
            server_settings(limits.max_concurrent_streams, self.stream_window, limits.max_header_list_bytes)
        )
        self._timer = self._loop.call_later(self._tick_every, self._tick)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.forget(self)
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        calls, self._calls = self._calls, {}
        for call in calls.values():
            self._forget_buffered(call)
            if call.driver is not None:
                call.driver.cancel()
        self._wake_window_waiters()

    def pause_writing(self) -> None:
        """The peer reads slower than we write: read nothing more, send no more DATA, until it catches up."""
        self.write_paused = True
        t = self._transport
        if t is not None and not t.is_closing():
            t.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        t = self._transport
        if t is not None and not t.is_closing():
            t.resume_reading()
        self._wake_window_waiters()

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        self._ping_deadline = 0.0  # anything read shows the peer alive
        if self._buf:  # the tail of a frame cut by the last read: at most one frame, so bounded
            data = bytes(self._buf) + data
            self._buf.clear()
        if not self._preface:
            n = min(len(data), len(PREFACE))
            if data[:n] != PREFACE[:n]:
                self._close_with(PROTOCOL_ERROR, "not the HTTP/2 client preface")
                return
            if n < len(PREFACE):
                self._buf += data
                return
            data = data[len(PREFACE) :]
            self._preface = True
        view = memoryview(data)  # frames are sliced out of the read without copying
        pos = 0
        end = len(data)
        try:
            while end - pos >= 9:
                length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
                if length > MAX_FRAME:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")  # noqa: TRY301
                if pos + 9 + length > end:
                    break
                kind, flags, sid = TYPE_FLAGS_ID.unpack_from(data, pos + 3)
                payload = view[pos + 9 : pos + 9 + length]
                pos += 9 + length
                try:
                    self._on_frame(kind, flags, sid & 0x7FFFFFFF, payload)
                except StreamError as e:
                    self._reset_stream(e.stream_id, e.code)
                if self._transport is None:
                    return
        except ConnectionError_ as e:
            self._close_with(e.code, e.reason)
            return
        if pos < end:
            self._buf += view[pos:]
        if self._recv_unacked >= RECV_WINDOW // 2:
            self.write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self._recv_unacked)))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0

    def eof_received(self) -> bool | None:
        return None

    # -- frames -------------------------------------------------------------------------------
    def _on_frame(self, kind: int, flags: int, sid: int, payload: Buffer) -> None:
        if self._continuation is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "a header block interrupted")
        if not self._settings_seen:
            if kind != SETTINGS or flags & ACK:
                raise ConnectionError_(PROTOCOL_ERROR, "the preface must be followed by SETTINGS")
            self._settings_seen = True
        if kind == DATA:
            self._on_data(flags, sid, payload)
        elif kind == HEADERS:
            self._on_headers_frame(flags, sid, payload)
        elif kind == CONTINUATION:
            self._on_continuation(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif kind == SETTINGS:
            if sid != 0:
                raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
            if flags & ACK:
                if payload:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
                self._settings_acked = True
            else:
                self._on_settings(payload)
        elif kind == PING:
            if sid != 0:
                raise ConnectionError_(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ConnectionError_(FRAME_SIZE_ERROR, "PING of other than 8 bytes")
            if not flags & ACK:
                self._control(frame(PING, ACK, 0, bytes(payload)))
        elif kind == RST_STREAM:
            self._on_rst_stream(sid, payload)
        elif kind == PRIORITY:
            if sid == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise StreamError(sid, FRAME_SIZE_ERROR)
            if U32.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
                raise StreamError(sid, PROTOCOL_ERROR)  # a stream cannot depend on itself
        elif kind == GOAWAY:
            if sid != 0:
                raise ConnectionError_(PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise ConnectionError_(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
            self._goaway_sent = True  # the client stops opening streams; let the open ones finish
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # unknown types are ignored (RFC 9113 §4.1)

    def _on_headers_frame(self, flags: int, sid: int, payload: Buffer) -> None:
        if sid == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & PADDED:
            payload = unpad(payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise ConnectionError_(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if U32.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
                self._decode_headers(bytes(payload[5:]))  # keep the HPACK state, then refuse the stream
                raise StreamError(sid, PROTOCOL_ERROR)
            payload = payload[5:]
        if not payload and not flags & END_STREAM:
            self._count_empty()
        if flags & END_HEADERS:
            self._on_headers(sid, flags, payload)
        else:
            if len(payload) > self._limits.max_header_list_bytes:
                raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
            self._continuation = (sid, flags, bytearray(payload))
            self._continuations = 0

    def _on_continuation(self, flags: int, sid: int, payload: Buffer) -> None:
        cont = self._continuation
        if cont is None or cont[0] != sid:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._continuations += 1
        if self._continuations > self._limits.max_continuations:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        cont[2].extend(payload)
        if len(cont[2]) > self._limits.max_header_list_bytes:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if not payload and not flags & END_HEADERS:
            self._count_empty()
        if flags & END_HEADERS:
            sid, first_flags, block = cont
            self._continuation = None
            self._on_headers(sid, first_flags, bytes(block))

    def _send_reset(self, sid: int, code: int, control: bool = True) -> None:
        """RST_STREAM ``sid``; ``control``: one the peer's frames made us send (bounded while unread)."""
        ids = self._reset_ids
        ids[sid] = None
        if len(ids) > RECENT_RESETS:
            del ids[next(iter(ids))]
        if control:
            self._control(frame(RST_STREAM, 0, sid, U32.pack(code)))
        else:
            self.write(frame(RST_STREAM, 0, sid, U32.pack(code)))

    def _count_empty(self) -> None:
        self._empty += 1
        if self._empty > self._limits.max_empty_frames:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "a flood of empty frames")

    def _on_rst_stream(self, sid: int, payload: Buffer) -> None:
        if sid == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "RST_STREAM of other than 4 bytes")
        if sid > self._last_stream:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        call = self._calls.pop(sid, None)
        if call is not None:
            if not call.headers_sent:
                self._spend_reset()  # reset before any answer: what a rapid-reset attack does
            self._forget_buffered(call)
            if call.driver is not None:
                call.driver.cancel()

    def _spend_reset(self) -> None:
        """A stream reset by the peer or refused by us: nghttp2's token bucket (CVE-2023-44487)."""
        limits = self._limits
        now = self._loop.time()
        tokens = min(
            float(limits.reset_burst), self._reset_tokens + (now - self._reset_stamp) * limits.reset_rate
        )
        self._reset_stamp = now
        if tokens < 1.0:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too many stream resets")
        self._reset_tokens = tokens - 1.0

    def _on_data(self, flags: int, sid: int, payload: Buffer) -> None:
        n = len(payload)
        if n > self._recv_window:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window exceeded")
        self._recv_window -= n
        self._recv_unacked += n
        call = self._calls.get(sid)
        if call is None:
            if sid == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
            if sid > self._last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            if not n and not flags & END_STREAM:
                self._count_empty()
            if sid not in self._reset_ids:
                raise StreamError(sid, STREAM_CLOSED)
            return  # a stream we reset: its bytes still count for the connection window
        if call.half_closed:
            raise StreamError(sid, STREAM_CLOSED)
        if n > call.recv_window:
            raise StreamError(sid, FLOW_CONTROL_ERROR)
        call.recv_window -= n
        if flags & PADDED:
            body = unpad(payload)
            call.recv_unacked += n - len(body)  # padding is consumed at once
            payload = body
        if not payload and not flags & END_STREAM:
            self._count_empty()
        buf = call.buf
        data: Buffer | None = payload
        if buf:  # a message spread over frames: gather it, decode it once it is whole
            buf += payload
            if not call.need and len(buf) >= 5 and self._check_prefix(call, buf, 0) < 0:
                return
            if call.need and len(buf) >= call.need:
                data = bytes(buf)
                buf.clear()
            else:
                data = None
        if data:
            self._empty = 0
            pos = self._messages(call, data)
            if pos < 0:
                return  # the call ended (an error, or a reply that finished it)
            if pos < len(data):
                buf += data[pos:]
        if buf or call.buffered:
            held = call.held_cost + len(buf)
            self.buffered += held - call.buffered
            call.buffered = held
            if self.buffered > self._limits.buffer_bytes:
                raise ConnectionError_(ENHANCE_YOUR_CALM, "too much buffered for one connection")
        unacked = call.recv_unacked
        if unacked >= self._credit_at or (buf and unacked and unacked + len(buf) >= self._credit_at):
            self._credit(call)
        if flags & END_STREAM:
            call.half_closed = True
            if buf:
                self._fail_call(call, INTERNAL, "the stream ended inside a message")
                return
            call.driver.on_end_stream()  # type: ignore[union-attr]

    def _credit(self, call: Call) -> None:
        self.write(frame(WINDOW_UPDATE, 0, call.id, U32.pack(call.recv_unacked)))
        call.recv_window += call.recv_unacked
        call.recv_unacked = 0

    def release(self, call: Call) -> None:
        """``call``'s driver consumed the messages it had queued: credit them to the peer."""
        if call.held and self._calls.get(call.id) is call:
            call.recv_unacked += call.held
            call.held = 0
            self.buffered -= call.held_cost
            call.buffered -= call.held_cost
            call.held_cost = 0
            if call.recv_unacked + len(call.buf) >= self._credit_at:
                self._credit(call)

    def _forget_buffered(self, call: Call) -> None:
        self.buffered -= call.buffered
        call.buffered = 0

    def _check_prefix(self, call: Call, data: Buffer, pos: int) -> int:
        """The length of the message whose prefix is at ``pos``; -1 (the call failed) if refused."""
        if data[pos] != 0:
            self._fail_call(call, UNIMPLEMENTED, "compressed messages are not supported")
            return -1
        n: int = U32.unpack_from(data, pos + 1)[0]
        if n > self.max_message:
            self._fail_call(
                call, RESOURCE_EXHAUSTED, f"received message larger than max ({n} vs. {self.max_message})"
            )
            return -1
        call.need = 5 + n
        return n

    def _messages(self, call: Call, data: Buffer) -> int:
        """Decode and deliver the whole gRPC messages in ``data``; how far it got, or -1 when the
        call is over.  Whole messages are credited to the peer unless the driver queued them."""
        pos, end = 0, len(data)
        decode, driver, calls = call.decode, call.driver, self._calls
        assert driver is not None
        limit = self.max_message
        held = call.held
        while end - pos >= 5:
            if data[pos] != 0:
                self._fail_call(call, UNIMPLEMENTED, "compressed messages are not supported")
                return -1
            n = U32.unpack_from(data, pos + 1)[0]
            if n > limit:
                self._check_prefix(call, data, pos)
                return -1
            if end - pos - 5 < n:
                call.need = 5 + n
                call.recv_unacked += pos - (call.held - held)
                return pos
            try:
                msg = decode(data[pos + 5 : pos + 5 + n])
            except Exception:
                self._fail_call(call, INTERNAL, "could not parse the request message")
                return -1
            pos += 5 + n
            if driver.on_message(msg):  # queued behind a busy call: credited when it is read
                call.held += 5 + n
                call.held_cost += 5 + n + QUEUED_MESSAGE_COST
            if call.id not in calls:
                return -1
        call.need = 0
        call.recv_unacked += pos - (call.held - held)
        return pos

    def _decode_headers(self, block: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
        """HPACK-decode ``block`` (and the header list's size), from a cache while the dynamic
        table stays as it was.

        A proxy opens every ext_proc stream with the same headers; Envoy sends them as the
        same bytes each time (indexed fields and literals without indexing), which leave
        the table untouched.  A block's meaning depends only on its bytes and the table, so
        a decode that did not change the table is cached until one that did; ``hpack`` in
        pure Python costs tens of µs per block, this is a dict lookup.
        """
        cache = self._header_cache
        hit = cache.get(block)
        if hit is not None:
            return hit
        table = self._decoder.header_table
        entries = table.dynamic_entries
        before = (entries[0] if entries else None, len(entries), table.maxsize)  # holds the front entry
        try:
            headers = [(bytes(k), bytes(v)) for k, v in self._decoder.decode(block, raw=True)]
        except Exception as e:
            raise ConnectionError_(COMPRESSION_ERROR, "HPACK") from e  # the HPACK state is lost
        decoded = (headers, sum(len(k) + len(v) + 32 for k, v in headers))
        front = entries[0] if entries else None
        if front is before[0] and len(entries) == before[1] and table.maxsize == before[2]:
            if len(cache) >= 64:
                cache.clear()
            cache[block] = decoded
        else:
            cache.clear()  # entries moved: cached blocks may mean something else now
        return decoded

    def _on_headers(self, sid: int, flags: int, block: Buffer) -> None:
        headers, size = self._decode_headers(bytes(block))
        if headers:
            self._empty = 0
        call = self._calls.get(sid)
        if call is not None:  # trailers from the client end its half of the stream
            if call.half_closed:
                raise StreamError(sid, STREAM_CLOSED)
            if not flags & END_STREAM:
                raise StreamError(sid, PROTOCOL_ERROR)  # trailers must end the stream
            call.half_closed = True
            if call.buf:
                self._fail_call(call, INTERNAL, "the stream ended inside a message")
                return
            call.driver.on_end_stream()  # type: ignore[union-attr]
            return
        if sid % 2 == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "an even stream id from a client")
        if sid <= self._last_stream:
            if sid in self._reset_ids:
                return  # trailers of a stream we reset: ignored, RFC 9113 §5.4.2
            raise ConnectionError_(
                PROTOCOL_ERROR, "HEADERS on a closed stream, or a stream id not increasing"
            )
        self._last_stream = sid
        limits = self._limits
        if len(self._calls) >= limits.max_concurrent_streams:
            self._spend_reset()
            self._send_reset(sid, REFUSED_STREAM)
            return
        path = b""
        for name, value in headers:
            if name == b":path":
                path = value
                break
        route = self._server.routes.get(path)
        if route is None or self._server.stopping or size > limits.max_header_list_bytes:
            call = Call(self, sid, _no_decode)
            if size > limits.max_header_list_bytes:
                call.finish(
                    RESOURCE_EXHAUSTED, f"header list of {size} bytes exceeds {limits.max_header_list_bytes}"
                )
            elif route is None:
                call.finish(UNIMPLEMENTED, f"Method not found: {path.decode('latin-1')}")
            else:
                call.finish(UNAVAILABLE, "the server is shutting down")
            if not flags & END_STREAM:
                self._send_reset(sid, NO_ERROR)
            return
        decode, make_driver = route
        call = Call(self, sid, decode)
        self._calls[sid] = call
        call.driver = make_driver(call)
        if flags & END_STREAM:
            call.half_closed = True
            call.driver.on_end_stream()

    def end_call(self, call: Call, status: int, message: str = "") -> None:
        """Trailers for ``call``, once; a client still sending is told to stop (RST_STREAM)."""
        if self._calls.pop(call.id, None) is None:
            return
        self._forget_buffered(call)
        if self._transport is None:
            return
        call.finish(status, message)
        if not call.half_closed:  # nobody reads the rest of the request any more
            self._send_reset(call.id, NO_ERROR, control=False)
        if self._goaway_sent and not self._calls:
            self._half_close()

    def _fail_call(self, call: Call, status: int, message: str) -> None:
        if call.driver is not None:
            call.driver.cancel()
        self.end_call(call, status, message)

    def _reset_stream(self, sid: int, code: int) -> None:
        """A stream error: RST_STREAM ``code``; the call, if any, is over."""
        call = self._calls.pop(sid, None)
        if call is not None:
            self._forget_buffered(call)
            if call.driver is not None:
                call.driver.cancel()
        if sid > self._last_stream:
            self._last_stream = sid
        self._send_reset(sid, code)

    def _on_window_update(self, sid: int, payload: Buffer) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE of other than 4 bytes")
        inc = U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if inc == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
        else:
            call = self._calls.get(sid)
            if call is None:
                if sid > self._last_stream:
                    raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
                return
            if inc == 0:
                raise StreamError(sid, PROTOCOL_ERROR)
            call.send_window += inc
            if call.send_window > MAX_WINDOW:
                raise StreamError(sid, FLOW_CONTROL_ERROR)
        self._wake_window_waiters()

    def _on_settings(self, payload: Buffer) -> None:
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        if len(payload) // 6 > self._limits.max_settings_entries:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too many SETTINGS entries")
        for off in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, off)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for call in self._calls.values():
                    call.send_window += delta
                    if call.send_window > MAX_WINDOW:
                        raise ConnectionError_(FLOW_CONTROL_ERROR, "a stream window above 2^31-1")
            elif key == S_MAX_FRAME_SIZE:
                if not 16_384 <= value <= 16_777_215:
                    raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
        self._control(SETTINGS_ACK_FRAME)
        self._wake_window_waiters()

    # -- output -------------------------------------------------------------------------------
    def _control(self, data: bytes) -> None:
        """A frame the peer's input makes us send (ACKs, resets): bounded while the peer does not read."""
        self._control_out += 1
        self.write(data)
        if self._control_out > self._limits.max_control_out:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "the peer does not read its control frames")

    def write(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def write2(self, head: bytes, body: bytes) -> None:
        out = self._out
        out.append(head)
        out.append(body)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        t = self._transport
        if t is not None and out and not t.is_closing() and not self._eof_sent:
            t.write(b"".join(out))
            if self._control_out and not t.get_write_buffer_size():
                self._control_out = 0  # all of it left: the peer reads

    async def wait_window(self) -> None:
        if self._transport is None:
            raise asyncio.CancelledError
        waiter = self._loop.create_future()
        self._window_waiters.append(waiter)
        await waiter

    def _wake_window_waiters(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    # -- time ---------------------------------------------------------------------------------
    def _tick(self) -> None:
        self._timer = None
        if self._transport is None:
            return
        limits = self._limits
        now = self._loop.time()
        handshaking = not (self._settings_seen and self._settings_acked)
        if handshaking and limits.handshake_timeout and now - self._born > limits.handshake_timeout:
            self._close_with(SETTINGS_TIMEOUT, "no preface or SETTINGS in time")
            return
        if self._calls:
            self._idle_since = now
        elif limits.idle_timeout and now - self._idle_since > limits.idle_timeout:
            self._close_with(NO_ERROR, "idle")
            return
        if limits.keepalive_time:
            if self._ping_deadline:
                if now > self._ping_deadline:
                    log.info("h2_keepalive_timeout", idle_seconds=round(now - self._last_read, 3))
                    self.abort()
                    return
            elif now - self._last_read > limits.keepalive_time:
                self._ping_deadline = now + (limits.keepalive_timeout or limits.keepalive_time)
                self.write(frame(PING, 0, 0, KEEPALIVE_PING))
        self._timer = self._loop.call_later(self._tick_every, self._tick)

    # -- closing ------------------------------------------------------------------------------
    def goaway(self) -> None:
        """Tell the client to open no new streams; close once the open ones are done."""
        if self._transport is None:
            return
        self._goaway_sent = True
        self.write(frame(GOAWAY, 0, 0, U32.pack(self._last_stream) + U32.pack(NO_ERROR)))
        if not self._calls:
            self._half_close()

    def _half_close(self) -> None:
        """Flush and send FIN; the peer closes once it has read everything (a close now could
        reset the connection and lose the replies still unread on the peer's side)."""
        self._flush()
        t = self._transport
        if t is not None and not t.is_closing() and t.can_write_eof():
            self._eof_sent = True  # what the peer still sends (a PING) is answered by nothing now
            with contextlib.suppress(OSError):  # the peer is already gone
                t.write_eof()

    def abort(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    def _close_with(self, code: int, reason: str = "") -> None:
        t = self._transport
        if t is None or t.is_closing():
            return
        if code != NO_ERROR:
            log.info("h2_connection_error", code=code, reason=reason, last_stream=self._last_stream)
        self.write(frame(GOAWAY, 0, 0, U32.pack(self._last_stream) + U32.pack(code) + reason.encode()))
        self._flush()
        t.close()  # nothing more is written: calls still running are cancelled now
        calls, self._calls = self._calls, {}
        for call in calls.values():
            self._forget_buffered(call)
            if call.driver is not None:
                call.driver.cancel()
        if t.get_write_buffer_size():  # a peer that does not read would hold the buffer forever
            self._loop.call_later(1.0, t.abort)


def _no_decode(data: bytes) -> None:
    return None  # a call refused at its headers reads nothing
