"""API-server failures as one exception carrying the Status object's code, reason and message."""

from __future__ import annotations

import aiohttp
import orjson


class ApiError(Exception):
    """A non-2xx answer from the API server (or an ERROR watch event)."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


async def raise_for_status(resp: aiohttp.ClientResponse) -> None:
    """Raise ``ApiError`` from a Kubernetes ``Status`` body (or the bare HTTP status)."""
    if 200 <= resp.status <= 299:
        return
    body = await resp.read()
    reason, message = resp.reason or "", ""
    try:
        status = orjson.loads(body)
    except orjson.JSONDecodeError:
        message = body[:200].decode("utf-8", "replace")
    else:
        if isinstance(status, dict):
            reason = str(status.get("reason") or reason)
            message = str(status.get("message") or "")
    raise ApiError(resp.status, reason, message)
