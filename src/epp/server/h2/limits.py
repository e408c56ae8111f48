"""What one client may cost the HTTP/2 server: the bounds nghttp2, grpc-go and Envoy give the Go EPP.

Every figure here is a default of a flag (``epp --help``, docs/decisions.md "HTTP/2 limits").
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class H2Limits:
    # advertised in SETTINGS and enforced
    max_concurrent_streams: int = 1000  # SETTINGS_MAX_CONCURRENT_STREAMS; more: RST_STREAM REFUSED_STREAM
    max_header_list_bytes: int = 64 << 10  # SETTINGS_MAX_HEADER_LIST_SIZE (RFC 7541 sizes, 32 per field)
    # one gRPC message (the 5-byte prefix excluded): a longer prefix ends the call RESOURCE_EXHAUSTED at once.
    # Envoy's BUFFERED bodies arrive as one message bounded by its buffer limit (16 MiB in
    # deploy/envoy/fail-open.yaml); streamed bodies arrive in chunks of one read.
    max_message_bytes: int = 20 * MIB
    # everything one connection holds for its peer: partial messages and messages queued for a busy
    # call; above it GOAWAY ENHANCE_YOUR_CALM.  At least two whole messages.
    max_connection_buffer_bytes: int = 48 * MIB
    # floods (GOAWAY ENHANCE_YOUR_CALM)
    # streams the peer resets before any answer, or that we refuse: nghttp2's figures (a reset after
    # the reply began, as a proxy does when its client goes away mid-response, costs nothing)
    reset_burst: int = 1000
    reset_rate: float = 33.0  # ... refilled per second
    max_continuations: int = 8  # CONTINUATION frames in one header block (nghttp2 1.61)
    max_empty_frames: int = 100  # consecutive DATA/HEADERS/CONTINUATION frames carrying nothing
    max_settings_entries: int = 32  # entries in one SETTINGS frame (nghttp2)
    max_control_out: int = 1000  # PING/SETTINGS ACKs and RST_STREAMs queued unread (Envoy's 1000)
    # timeouts in seconds; 0 turns one off
    handshake_timeout: float = 10.0  # the preface and first SETTINGS in, our SETTINGS acknowledged
    idle_timeout: float = 3600.0  # no open stream and no frame for this long: GOAWAY NO_ERROR, close
    keepalive_time: float = 7200.0  # nothing read for this long: PING (grpc-go server's 2 h)
    keepalive_timeout: float = 20.0  # ... which must be answered in this long, else close (grpc-go's 20 s)

    @property
    def stream_window(self) -> int:
        """SETTINGS_INITIAL_WINDOW_SIZE: 16 MiB, and at least one whole message (credit follows reads)."""
        return min(max(1 << 24, self.max_message_bytes + 5), 0x7FFFFFFF)

    @property
    def buffer_bytes(self) -> int:
        return max(self.max_connection_buffer_bytes, 2 * (self.max_message_bytes + 5))


DEFAULT_LIMITS = H2Limits()
