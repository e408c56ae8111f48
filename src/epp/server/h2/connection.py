"""One HTTP/2 connection: frames in, stream events out, frames out.

Every frame is checked as RFC 9113 says (lengths, stream states, windows) and every resource a
peer can make us hold is bounded (``H2Limits``): streams, header lists, buffered bytes, queued
control frames, resets, CONTINUATION chains, empty frames, the output buffer (reading pauses
while the transport's buffer is above its high-water mark) and time (handshake, idle,
keepalive).  A peer that breaks a limit gets GOAWAY ENHANCE_YOUR_CALM, as from nghttp2 or Envoy.

What a stream carries is not this module's business: a new stream's headers go to the
server's ``open_stream``, which returns the ``H2Stream`` that takes its DATA and its end
(``epp.server.h2.calls``: a gRPC call), or answers and refuses it.  What one read produces
leaves in one ``transport.write`` when the read is handled; other writes of one loop
iteration leave together at its end (``_flush``).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

import structlog

from epp.server.h2.frames import (
    ACK,
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
    WINDOW_UPDATE,
    Buffer,
    H2ConnectionError,
    StreamError,
    frame,
    server_settings,
    unpad,
)
from epp.server.h2.headers import HeaderDecoder, HeaderList

if TYPE_CHECKING:
    from epp.server.h2.limits import H2Limits
    from epp.server.h2.stream import H2Stream

log = structlog.get_logger(__name__)
RECENT_RESETS = 1000  # reset streams remembered (RFC 9113 §5.4.2: frames may still be in flight)
WRITE_HIGH_WATER = 4 << 20  # the transport's buffer above which reading and sending pause
WRITE_LOW_WATER = 1 << 20
KEEPALIVE_PING = b"epp-kapg"
RETIRE_PING = b"epp-rtir"  # its ACK shows the client has read the first GOAWAY of ``retire``
ANY_STREAM = 0x7FFFFFFF  # the largest stream id: a GOAWAY naming it refuses nothing in flight


# A read this long after the connection's previous one found the EPP idle (one request at a time):
# the after-reply queue may then let a process its replies woke go first (director.after_reply).
# At 200 req/s a response's read comes ~0.35 ms after its request's; at capacity reads are
# ~0.1 ms apart.
IDLE_BEFORE_READ: Final = 0.00025


class AfterReplyQueue(Protocol):
    """The work a read's replies do not wait for (``epp.director.after_reply.AfterReply``)."""

    reading: bool

    def finished_reading(self, idle: bool) -> None: ...


class StreamServer(Protocol):
    """What a connection needs of its server (``H2GrpcServer``): limits, and a taker per stream."""

    limits: H2Limits
    connections: set[Connection]
    awake: Callable[[], None] | None  # called after every read (the app wires the sync's ``ride``)

    @property
    def after_reply(self) -> AfterReplyQueue | None:
        """Run after every read, once its replies are written (None: nothing is deferred)."""
        ...

    def open_stream(
        self, conn: Connection, stream_id: int, headers: HeaderList, size: int
    ) -> H2Stream | None:
        """The stream a client's ``headers`` opened; None if the server answered it and it is over."""
        ...

    def forget(self, conn: Connection) -> None:
        """``conn`` is closed."""
        ...


class Connection(asyncio.Protocol):
    """One client connection: frames in, stream events to each ``H2Stream``, frames out."""

    def __init__(self, server: StreamServer) -> None:
        self._server = server
        self._awake = server.awake
        self._after_reply = server.after_reply
        limits: H2Limits = server.limits
        self.limits = limits
        self._transport: asyncio.Transport | None = None
        self._frame_tail = bytearray()  # a frame cut by the end of a read
        self._preface_seen = False
        self._decode_headers = HeaderDecoder(limits.max_header_list_bytes).decode
        self._streams: dict[int, H2Stream] = {}  # the open ones
        self._last_stream = 0
        self._reset_ids: dict[int, None] = {}  # streams we reset lately: what the peer still sends is ignored
        self._outbox: list[bytes] = []  # written this loop iteration, sent together by ``_flush``
        self._flush_scheduled = False
        self._reading = False  # in ``data_received``: it flushes what is written when it returns
        self._eof_sent = False  # after write_eof the transport refuses writes though it is not closing
        # Kept, and used by the streams' drivers: on 3.11 every ``asyncio.get_running_loop()`` is a
        # getpid() system call (its fork check), which the EPP made once a request.
        self._loop = self.loop = asyncio.get_running_loop()
        self._continuation: tuple[int, int, bytearray] | None = None  # (stream, flags, block)
        self._continuation_frames = 0
        self._recv_window = RECV_WINDOW  # what the peer may still send on the connection
        self._recv_unacked = 0
        self.stream_window = limits.stream_window
        self._credit_at = self.stream_window // 2
        self.buffered = 0  # bytes held for the peer: partial messages, messages queued for busy streams
        self._goaway_sent = False
        self.retiring = False  # ``retire``: the client is moving its new streams to a new connection
        self.health_only = False  # its first stream asked grpc.health.v1: a prober's, not the proxy's
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16_384
        self.write_paused = False
        self._window_waiters: list[asyncio.Future[None]] = []
        # floods
        self._empty_frames = 0  # consecutive frames that carried nothing
        self._control_out = 0
        now = self._loop.time()
        self._reset_tokens = float(limits.reset_burst)
        self._reset_stamp = now
        # time
        self._settings_seen = False  # the peer's first SETTINGS
        self._settings_acked = False  # our SETTINGS
        self._opened_at = now
        self._last_read = now
        self._idle_since = now
        self._ping_deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        timeouts = [
            seconds
            for seconds in (
                limits.handshake_timeout,
                limits.idle_timeout,
                limits.keepalive_time,
                limits.keepalive_timeout,
            )
            if seconds > 0
        ]
        self._timer_every = max(0.01, min([1.0, *(seconds / 4 for seconds in timeouts)]))

    # -- transport callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass it
        with contextlib.suppress(AttributeError, NotImplementedError):
            self._transport.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)  # type: ignore[union-attr]
        self._server.connections.add(self)
        limits = self.limits
        self.write(
            server_settings(limits.max_concurrent_streams, self.stream_window, limits.max_header_list_bytes)
        )
        self._timer = self._loop.call_later(self._timer_every, self._on_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.forget(self)
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._drop_all()
        self._wake_window_waiters()

    def pause_writing(self) -> None:
        """The peer reads slower than we write: read nothing more, send no more DATA, until it catches up."""
        self.write_paused = True
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()
        self._wake_window_waiters()

    def data_received(self, data: bytes) -> None:
        """Frames in; the replies they produced leave in one write before returning.

        Most replies are written from here (``SessionDriver`` answers in the read callback, and
        routes eagerly), so flushing now spares a loop callback per read and sends the reply
        an iteration earlier; writes from tasks still leave together at the iteration's end.
        Then the work the read's replies did not wait for runs (``after_reply``, the server's:
        director.after_reply), the replies already on their way.
        """
        after = self._after_reply
        if after is not None:
            after.reading = True
        previous = self._last_read  # ``_receive`` stamps this read's time: one clock read a read
        self._reading = True
        try:
            self._receive(data)
        finally:
            self._reading = False
            if self._outbox:  # also when a task's flush is pending: the replies go before the work
                self._flush()
            if after is not None:
                after.finished_reading(self._last_read - previous > IDLE_BEFORE_READ)
        if self._awake is not None:  # the loop is awake: peers' sync messages are read in this wake
            self._awake()

    def _receive(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        self._ping_deadline = 0.0  # anything read shows the peer alive
        if self._frame_tail:  # the tail of a frame cut by the last read: at most one frame, so bounded
            data = bytes(self._frame_tail) + data
            self._frame_tail.clear()
        if not self._preface_seen:
            n = min(len(data), len(PREFACE))
            if data[:n] != PREFACE[:n]:
                self._close_with(PROTOCOL_ERROR, "not the HTTP/2 client preface")
                return
            if n < len(PREFACE):
                self._frame_tail += data
                return
            data = data[len(PREFACE) :]
            self._preface_seen = True
        view = memoryview(data)  # frames are sliced out of the read without copying
        pos = 0
        end = len(data)
        try:
            while end - pos >= 9:
                length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
                if length > MAX_FRAME:
                    raise H2ConnectionError(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")  # noqa: TRY301
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
        except H2ConnectionError as e:
            self._close_with(e.code, e.reason)
            return
        if pos < end:
            self._frame_tail += view[pos:]
        if self._recv_unacked >= RECV_WINDOW // 2:
            self.write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self._recv_unacked)))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0

    def eof_received(self) -> bool | None:
        return None

    # -- frames -------------------------------------------------------------------------------
    def _on_frame(self, kind: int, flags: int, sid: int, payload: Buffer) -> None:
        if self._continuation is not None and kind != CONTINUATION:
            raise H2ConnectionError(PROTOCOL_ERROR, "a header block interrupted")
        if not self._settings_seen:
            if kind != SETTINGS or flags & ACK:
                raise H2ConnectionError(PROTOCOL_ERROR, "the preface must be followed by SETTINGS")
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
                raise H2ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
            if flags & ACK:
                if payload:
                    raise H2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
                self._settings_acked = True
            else:
                self._on_settings(payload)
        elif kind == PING:
            if sid != 0:
                raise H2ConnectionError(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "PING of other than 8 bytes")
            if not flags & ACK:
                self._control(frame(PING, ACK, 0, bytes(payload)))
            elif self.retiring and not self._goaway_sent and bytes(payload) == RETIRE_PING:
                self.goaway()  # the client has read the first GOAWAY: no stream past these is coming
        elif kind == RST_STREAM:
            self._on_rst_stream(sid, payload)
        elif kind == PRIORITY:
            if sid == 0:
                raise H2ConnectionError(PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise StreamError(sid, FRAME_SIZE_ERROR)
            if U32.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
                raise StreamError(sid, PROTOCOL_ERROR)  # a stream cannot depend on itself
        elif kind == GOAWAY:
            if sid != 0:
                raise H2ConnectionError(PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
            self._goaway_sent = True  # the client stops opening streams; let the open ones finish
        elif kind == PUSH_PROMISE:
            raise H2ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # unknown types are ignored (RFC 9113 §4.1)

    def _on_headers_frame(self, flags: int, sid: int, payload: Buffer) -> None:
        if sid == 0:
            raise H2ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & PADDED:
            payload = unpad(payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if U32.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
                self._decode_headers(bytes(payload[5:]))  # keep the HPACK state, then refuse the stream
                raise StreamError(sid, PROTOCOL_ERROR)
            payload = payload[5:]
        if not payload and not flags & END_STREAM:
            self._count_empty_frame()
        if flags & END_HEADERS:
            self._on_headers(sid, flags, payload)
        else:
            if len(payload) > self.limits.max_header_list_bytes:
                raise H2ConnectionError(ENHANCE_YOUR_CALM, "header block too large")
            self._continuation = (sid, flags, bytearray(payload))
            self._continuation_frames = 0

    def _on_continuation(self, flags: int, sid: int, payload: Buffer) -> None:
        cont = self._continuation
        if cont is None or cont[0] != sid:
            raise H2ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._continuation_frames += 1
        if self._continuation_frames > self.limits.max_continuations:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        cont[2].extend(payload)
        if len(cont[2]) > self.limits.max_header_list_bytes:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "header block too large")
        if not payload and not flags & END_HEADERS:
            self._count_empty_frame()
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

    def _count_empty_frame(self) -> None:
        self._empty_frames += 1
        if self._empty_frames > self.limits.max_empty_frames:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "a flood of empty frames")

    def _on_rst_stream(self, sid: int, payload: Buffer) -> None:
        if sid == 0:
            raise H2ConnectionError(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM of other than 4 bytes")
        if sid > self._last_stream:
            raise H2ConnectionError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self._streams.pop(sid, None)
        if stream is not None:
            self._drop(stream)
            if not stream.headers_sent:
                self._spend_reset()  # reset before any answer: what a rapid-reset attack does

    def _spend_reset(self) -> None:
        """A stream reset by the peer or refused by us: nghttp2's token bucket (CVE-2023-44487)."""
        limits = self.limits
        now = self._loop.time()
        tokens = min(
            float(limits.reset_burst), self._reset_tokens + (now - self._reset_stamp) * limits.reset_rate
        )
        self._reset_stamp = now
        if tokens < 1.0:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "too many stream resets")
        self._reset_tokens = tokens - 1.0

    def _on_data(self, flags: int, sid: int, payload: Buffer) -> None:
        n = len(payload)
        if n > self._recv_window:
            raise H2ConnectionError(FLOW_CONTROL_ERROR, "connection window exceeded")
        self._recv_window -= n
        self._recv_unacked += n
        stream = self._streams.get(sid)
        if stream is None:
            if sid == 0:
                raise H2ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
            if sid > self._last_stream:
                raise H2ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            if not n and not flags & END_STREAM:
                self._count_empty_frame()
            if sid not in self._reset_ids:
                raise StreamError(sid, STREAM_CLOSED)
            return  # a stream we reset: its bytes still count for the connection window
        if stream.half_closed:
            raise StreamError(sid, STREAM_CLOSED)
        if n > stream.recv_window:
            raise StreamError(sid, FLOW_CONTROL_ERROR)
        stream.recv_window -= n
        if flags & PADDED:
            body = unpad(payload)
            stream.recv_unacked += n - len(body)  # padding is consumed at once
            payload = body
        if not payload and not flags & END_STREAM:
            self._count_empty_frame()
        consumed = stream.receive(payload)
        if consumed < 0:
            return  # the stream ended (an error, or a reply that finished it)
        if consumed:
            self._empty_frames = 0
        pending = stream.pending
        if pending or stream.buffered:
            held = stream.held_cost + pending
            self.buffered += held - stream.buffered
            stream.buffered = held
            if self.buffered > self.limits.buffer_bytes:
                raise H2ConnectionError(ENHANCE_YOUR_CALM, "too much buffered for one connection")
        unacked = stream.recv_unacked
        if unacked >= self._credit_at or (pending and unacked and unacked + pending >= self._credit_at):
            self._credit(stream)
        if flags & END_STREAM:
            stream.half_closed = True
            stream.on_end_stream()

    def _credit(self, stream: H2Stream) -> None:
        self.write(frame(WINDOW_UPDATE, 0, stream.id, U32.pack(stream.recv_unacked)))
        stream.recv_window += stream.recv_unacked
        stream.recv_unacked = 0

    def release(self, stream: H2Stream) -> None:
        """``stream``'s application read the messages it had queued: credit them to the peer."""
        if stream.held and self._streams.get(stream.id) is stream:
            stream.recv_unacked += stream.held
            stream.held = 0
            self.buffered -= stream.held_cost
            stream.buffered -= stream.held_cost
            stream.held_cost = 0
            if stream.recv_unacked + stream.pending >= self._credit_at:
                self._credit(stream)

    def _on_headers(self, sid: int, flags: int, block: Buffer) -> None:
        headers, size = self._decode_headers(bytes(block))
        if headers:
            self._empty_frames = 0
        stream = self._streams.get(sid)
        if stream is not None:  # trailers from the client end its half of the stream
            if stream.half_closed:
                raise StreamError(sid, STREAM_CLOSED)
            if not flags & END_STREAM:
                raise StreamError(sid, PROTOCOL_ERROR)  # trailers must end the stream
            stream.half_closed = True
            stream.on_end_stream()
            return
        if sid % 2 == 0:
            raise H2ConnectionError(PROTOCOL_ERROR, "an even stream id from a client")
        if sid <= self._last_stream:
            if sid in self._reset_ids:
                return  # trailers of a stream we reset: ignored, RFC 9113 §5.4.2
            raise H2ConnectionError(
                PROTOCOL_ERROR, "HEADERS on a closed stream, or a stream id not increasing"
            )
        self._last_stream = sid
        if len(self._streams) >= self.limits.max_concurrent_streams:
            self._spend_reset()
            self._send_reset(sid, REFUSED_STREAM)
            return
        stream = self._server.open_stream(self, sid, headers, size)
        if stream is None:  # answered and ended at once (the server refused it)
            if not flags & END_STREAM:
                self._send_reset(sid, NO_ERROR)
            return
        self._streams[sid] = stream
        if flags & END_STREAM:
            stream.half_closed = True
            stream.on_end_stream()

    def end_stream(self, stream: H2Stream, block: bytes) -> None:
        """End ``stream`` with the header block ``block`` (trailers), once; a client still sending
        is told to stop (RST_STREAM NO_ERROR)."""
        if self._streams.pop(stream.id, None) is None:
            return
        stream.ended = True
        self._forget_buffered(stream)
        if self._transport is None:
            return
        stream.headers_sent = True
        self.write(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, block))
        if not stream.half_closed:  # nobody reads the rest of the request any more
            self._send_reset(stream.id, NO_ERROR, control=False)
        if self._goaway_sent and not self._streams:
            self._half_close()

    def _reset_stream(self, sid: int, code: int) -> None:
        """A stream error: RST_STREAM ``code``; the stream, if open, is dropped."""
        stream = self._streams.pop(sid, None)
        if stream is not None:
            self._drop(stream)
        if sid > self._last_stream:
            self._last_stream = sid
        self._send_reset(sid, code)

    def _drop(self, stream: H2Stream) -> None:
        """``stream``, already out of ``_streams``, ends unanswered (reset, or the connection is
        gone): what it held is freed and whatever works for it stops."""
        stream.ended = True
        self._forget_buffered(stream)
        stream.cancel()

    def _drop_all(self) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            self._drop(stream)

    def _forget_buffered(self, stream: H2Stream) -> None:
        self.buffered -= stream.buffered
        stream.buffered = 0

    def _on_window_update(self, sid: int, payload: Buffer) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of other than 4 bytes")
        inc = U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if inc == 0:
                raise H2ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise H2ConnectionError(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
        else:
            stream = self._streams.get(sid)
            if stream is None:
                if sid > self._last_stream:
                    raise H2ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
                return
            if inc == 0:
                raise StreamError(sid, PROTOCOL_ERROR)
            stream.send_window += inc
            if stream.send_window > MAX_WINDOW:
                raise StreamError(sid, FLOW_CONTROL_ERROR)
        self._wake_window_waiters()

    def _on_settings(self, payload: Buffer) -> None:
        if len(payload) % 6:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        if len(payload) // 6 > self.limits.max_settings_entries:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "too many SETTINGS entries")
        for off in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, off)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2ConnectionError(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise H2ConnectionError(FLOW_CONTROL_ERROR, "a stream window above 2^31-1")
            elif key == S_MAX_FRAME_SIZE:
                if not 16_384 <= value <= 16_777_215:
                    raise H2ConnectionError(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise H2ConnectionError(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
        self._control(SETTINGS_ACK_FRAME)
        self._wake_window_waiters()

    # -- output -------------------------------------------------------------------------------
    def _control(self, data: bytes) -> None:
        """A frame the peer's input makes us send (ACKs, resets): bounded while the peer does not read."""
        self._control_out += 1
        self.write(data)
        if self._control_out > self.limits.max_control_out:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, "the peer does not read its control frames")

    def write(self, data: bytes) -> None:
        """Queue ``data`` (whole frames); everything queued in this loop iteration leaves together."""
        self._outbox.append(data)
        if not self._flush_scheduled and not self._reading:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def write_frame(self, header: bytes, payload: bytes) -> None:
        """``write`` of one frame whose header and payload were built apart (a DATA frame and its
        gRPC message): the payload is not copied to join them."""
        outbox = self._outbox
        outbox.append(header)
        outbox.append(payload)
        if not self._flush_scheduled and not self._reading:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, []
        transport = self._transport
        if transport is not None and outbox and not transport.is_closing() and not self._eof_sent:
            transport.write(b"".join(outbox))
            if self._control_out and not transport.get_write_buffer_size():
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
    def _on_timer(self) -> None:
        """Every ``_timer_every`` seconds: the handshake, idle and keepalive deadlines."""
        self._timer = None
        if self._transport is None:
            return
        limits = self.limits
        now = self._loop.time()
        handshaking = not (self._settings_seen and self._settings_acked)
        if handshaking and limits.handshake_timeout and now - self._opened_at > limits.handshake_timeout:
            self._close_with(SETTINGS_TIMEOUT, "no preface or SETTINGS in time")
            return
        if self._streams:
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
        self._timer = self._loop.call_later(self._timer_every, self._on_timer)

    # -- closing ------------------------------------------------------------------------------
    def goaway(self) -> None:
        """Tell the client to open no new streams; close once the open ones are done."""
        if self._transport is None:
            return
        self._goaway_sent = True
        self.write(frame(GOAWAY, 0, 0, U32.pack(self._last_stream) + U32.pack(NO_ERROR)))
        if not self._streams:
            self._half_close()

    def retire(self) -> bool:
        """Move the client to a new connection without losing a stream (RFC 9113 §6.8).

        A GOAWAY naming the largest stream id first: the client opens no new stream here, and
        nothing it sent meanwhile is refused.  Then a PING: its ACK comes after the client read the
        GOAWAY, so the real GOAWAY (``goaway``) can name the last stream it opened, and the
        connection half-closes once that stream is done.  Envoy and grpc clients open their next
        streams on a new connection, which the pod's workers place anew (``epp.workers.balance``).
        False when the connection is already closing.
        """
        if self._transport is None or self.retiring or self._goaway_sent:
            return False
        self.retiring = True
        self.write(frame(GOAWAY, 0, 0, U32.pack(ANY_STREAM) + U32.pack(NO_ERROR)))
        self.write(frame(PING, 0, 0, RETIRE_PING))
        return True

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection's transport (None once lost)."""
        return self._transport

    @property
    def streams_open(self) -> int:
        return len(self._streams)

    @property
    def proxied(self) -> bool:
        """One of the proxy's routing connections: neither a prober's nor retiring."""
        return not (self.health_only or self.retiring)

    def _half_close(self) -> None:
        """Flush and send FIN; the peer closes once it has read everything (a close now could
        reset the connection and lose the replies still unread on the peer's side)."""
        self._flush()
        transport = self._transport
        if transport is not None and not transport.is_closing() and transport.can_write_eof():
            self._eof_sent = True  # what the peer still sends (a PING) is answered by nothing now
            with contextlib.suppress(OSError):  # the peer is already gone
                transport.write_eof()

    def abort(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    def _close_with(self, code: int, reason: str = "") -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if code != NO_ERROR:
            log.info("h2_connection_error", code=code, reason=reason, last_stream=self._last_stream)
        self.write(frame(GOAWAY, 0, 0, U32.pack(self._last_stream) + U32.pack(code) + reason.encode()))
        self._flush()
        transport.close()  # nothing more is written: streams still open are dropped now
        self._drop_all()
        if transport.get_write_buffer_size():  # a peer that does not read would hold the buffer forever
            self._loop.call_later(1.0, transport.abort)
