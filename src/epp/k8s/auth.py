"""Authenticate and authorise scrapers of /metrics the way controller-runtime's filter does.

``WithAuthenticationAndAuthorization``: the bearer token goes to a TokenReview (401 unless the
API server vouches for it), the user it names to a SubjectAccessReview for the non-resource
URL and verb (403 unless allowed).  Decisions are cached briefly (10 s allowed, 10 s denied,
as the delegating authenticator/authoriser caches them) so a scraper every few seconds costs
the API server almost nothing; an API-server error is a 500 and is not cached.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import structlog

from epp.k8s.client import Kube
from epp.k8s.errors import ApiError

log = structlog.get_logger(__name__)

CACHE_TTL: Final = 10.0
MAX_CACHE: Final = 4096


@dataclass(frozen=True, slots=True)
class Decision:
    status: int  # 200 allowed, 401 unauthenticated, 403 forbidden, 500 could not decide
    reason: str = ""


class MetricsAuthorizer:
    """``await check(authorization_header, path)`` → a ``Decision``."""

    def __init__(
        self, kube: Kube, *, ttl: float = CACHE_TTL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._kube = kube
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[tuple[str, str], tuple[float, Decision]] = {}
        self.reviews = 0  # TokenReviews sent (tests check the cache works)

    async def check(self, authorization: str, path: str, verb: str = "get") -> Decision:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Decision(401, "missing bearer token")
        key = (hashlib.sha256(token.strip().encode()).hexdigest(), f"{verb} {path}")
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            decision = await self._review(token.strip(), path, verb)
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            log.warning("metrics_auth_error", error=str(e) or type(e).__name__)
            return Decision(500, "authorization check failed")
        if len(self._cache) >= MAX_CACHE:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= MAX_CACHE:
                self._cache.clear()
        self._cache[key] = (now + self._ttl, decision)
        return decision

    async def _review(self, token: str, path: str, verb: str) -> Decision:
        self.reviews += 1
        review: Any = await self._kube.json(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Decision(401, str(status.get("error") or "token not authenticated"))
        user = status.get("user") or {}
        sar: Any = await self._kube.json(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.get("username", ""),
                    "uid": user.get("uid", ""),
                    "groups": user.get("groups") or [],
                    "extra": user.get("extra") or {},
                    "nonResourceAttributes": {"path": path, "verb": verb},
                },
            },
        )
        allowed = bool((sar.get("status") or {}).get("allowed"))
        if not allowed:
            return Decision(403, f"user {user.get('username', '')!r} may not {verb} {path}")
        return Decision(200)
