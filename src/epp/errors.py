"""The EPP's exception tree; translated to HTTP only at the ext_proc edge.

    EppError                 a request failed; ``code`` and ``http_status`` say how
     ├── BadRequest          400  the body or headers cannot be served as sent
     ├── Unauthorized        401  (mapped for parity; never raised by the core)
     ├── Forbidden           403  (mapped for parity; never raised by the core)
     ├── NotFound            404  (mapped for parity; never raised by the core)
     ├── PayloadTooLarge     413  the request body exceeds --max-request-body-bytes
     ├── ResourceExhausted   429  admission refused it, or no endpoint fits
     ├── Internal            500  a bug or an impossible state
     └── ServiceUnavailable  503  no endpoint can serve it right now
    ConfigError              startup only: a bad flag, config file or plugin parameter

``str(err)`` is GIE's wire text, ``inference error: <Code> - <msg>``.  ``reason`` is the
machine-readable why (llm-d-router's ``x-llm-d-request-dropped-reason`` values where it has one:
``rejected-saturated``, ``rejected-no-endpoints``, ``rejected-ttl-expired``, ...; ours beside
them for what it does not name), sent as that header on the ImmediateResponse, logged, and a
label of the request-error metric.
"""

from __future__ import annotations

from typing import ClassVar


class EppError(Exception):
    """A request-level failure with a stable code and an HTTP status."""

    code: ClassVar[str] = "Unknown"
    http_status: ClassVar[int] = 500
    default_reason: ClassVar[str] = "rejected-internal"

    def __init__(self, msg: str, *, reason: str = "") -> None:
        super().__init__(msg)
        self.msg = msg
        self.reason = reason or self.default_reason

    def __str__(self) -> str:
        return f"inference error: {self.code} - {self.msg}"


class BadRequest(EppError):
    code = "BadRequest"
    http_status = 400
    default_reason = "rejected-bad-request"


class Unauthorized(EppError):
    code = "Unauthorized"
    http_status = 401
    default_reason = "rejected-unauthorized"


class Forbidden(EppError):
    code = "Forbidden"
    http_status = 403
    default_reason = "rejected-forbidden"


class NotFound(EppError):
    code = "NotFound"
    http_status = 404
    default_reason = "rejected-not-found"


class PayloadTooLarge(EppError):
    code = "PayloadTooLarge"
    http_status = 413
    default_reason = "rejected-body-too-large"


class ResourceExhausted(EppError):
    code = "ResourceExhausted"
    http_status = 429
    default_reason = "rejected-saturated"


class Internal(EppError):
    code = "Internal"
    http_status = 500
    default_reason = "rejected-internal"


class ServiceUnavailable(EppError):
    code = "ServiceUnavailable"
    http_status = 503
    default_reason = "rejected-no-endpoints"


class ConfigError(Exception):
    """A startup error; the message names the flag, file or field path at fault."""
