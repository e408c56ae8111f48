"""ext_proc on the EPP's own HTTP/2 + gRPC framing, an asyncio ``Protocol`` on the event loop.

grpc.aio hands every message between gRPC core's threads and the loop (about 35 thread
switches per request, overhead-baseline.md), and grpclib (removed) parsed every frame with ``h2``.
An ext_proc stream needs little of HTTP/2: one header block in, length-prefixed protobuf
messages both ways, constant response headers and trailers.  Doing just that here costs a
fraction of either (docs/decisions.md "ext_proc transport"), and everything the server must
honour is still honoured: SETTINGS (frame size, initial window), flow control in both
directions, PING, RST_STREAM, GOAWAY, CONTINUATION, padding, HPACK (``hpack``), and every
defence nghttp2 and grpc-core give a Go or C server: frame validation, stream and message
limits, flood limits, bounded buffers, handshake/idle/keepalive timeouts (``H2Limits``).

Writes made in one loop iteration leave in one ``write`` call: under load one syscall carries
the replies of many streams.

One concept per module: ``connection`` (HTTP/2: frames, stream states, flow control, limits,
timers, the output buffer), ``stream`` (``H2Stream``, one HTTP/2 stream as the connection sees
it), ``headers`` (HPACK decoding), ``calls`` (``Call``, the gRPC call on a stream: messages,
status, routing by ``:path``), ``drivers`` (what answers a call: a coroutine handler, or an
ext_proc session), ``server`` (the listener and its routes), ``frames`` and ``limits``.
"""

from epp.server.h2.limits import DEFAULT_LIMITS, H2Limits
from epp.server.h2.server import H2GrpcServer

__all__ = ["DEFAULT_LIMITS", "H2GrpcServer", "H2Limits"]
