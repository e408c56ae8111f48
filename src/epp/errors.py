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

``str(err)`` is GIE's wire text, ``inference error: <Code> - <msg>``.
"""

from __future__ import annotations

from typing import ClassVar


class EppError(Exception):
    """A request-level failure with a stable code and an HTTP status."""

    code: ClassVar[str] = "Unknown"
    http_status: ClassVar[int] = 500

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg

    def __str__(self) -> str:
        return f"inference error: {self.code} - {self.msg}"


class BadRequest(EppError):
    code = "BadRequest"
    http_status = 400


class Unauthorized(EppError):
    code = "Unauthorized"
    http_status = 401


class Forbidden(EppError):
    code = "Forbidden"
    http_status = 403


class NotFound(EppError):
    code = "NotFound"
    http_status = 404


class PayloadTooLarge(EppError):
    code = "PayloadTooLarge"
    http_status = 413


class ResourceExhausted(EppError):
    code = "ResourceExhausted"
    http_status = 429


class Internal(EppError):
    code = "Internal"
    http_status = 500


class ServiceUnavailable(EppError):
    code = "ServiceUnavailable"
    http_status = 503


class ConfigError(Exception):
    """A startup error; the message names the flag, file or field path at fault."""
