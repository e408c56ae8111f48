"""Kubernetes ``Status`` errors: the one error shape every apiserver failure takes.

Clients branch on ``code`` and ``reason`` (a Lease race is a 409 ``Conflict``, a
compacted watch a 410 ``Expired``), so the fake raises these and the HTTP layer turns
them into the exact JSON body a real apiserver sends.
"""

from __future__ import annotations

from typing import Any

from .resources import Resource

REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """A failure the apiserver reports as a ``Status`` object with an HTTP code."""

    def __init__(self, code: int, message: str, reason: str = "", details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        """The ``Status`` body, as the apiserver serialises it."""
        return failure(self.code, self.message, self.reason, self.details)


class NotFound(ApiError):
    """404: the object (or the API) does not exist."""

    def __init__(self, resource: Resource, name: str):
        super().__init__(404, f'{resource.qualified} "{name}" not found', details=_details(resource, name))


class AlreadyExists(ApiError):
    """409 AlreadyExists: a create collided with an existing name."""

    def __init__(self, resource: Resource, name: str):
        super().__init__(
            409, f'{resource.qualified} "{name}" already exists', "AlreadyExists", _details(resource, name)
        )


class Conflict(ApiError):
    """409 Conflict: a write carried a stale resourceVersion (how leader election detects races)."""

    def __init__(self, resource: Resource, name: str):
        super().__init__(
            409,
            f'Operation cannot be fulfilled on {resource.qualified} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            "Conflict",
            _details(resource, name),
        )


class Expired(ApiError):
    """410 Expired: the requested resourceVersion is older than the compaction point."""

    def __init__(self, requested: int, oldest: int):
        super().__init__(410, f"too old resource version: {requested} ({oldest})", "Expired")


def failure(
    code: int, message: str, reason: str = "", details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``Status`` with ``status: Failure``."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def success(resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
    """The ``Status`` a DELETE answers with for resources that do not return the deleted object."""
    details = _details(resource, obj["metadata"]["name"])
    details["uid"] = obj["metadata"].get("uid", "")
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}


def _details(resource: Resource, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": resource.plural}
    if resource.group:
        details["group"] = resource.group
    return details
