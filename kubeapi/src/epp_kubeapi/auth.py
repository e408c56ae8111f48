"""Bearer-token authentication and the policy behind SubjectAccessReview.

The fake authenticates every request (401 otherwise) but does not authorise ordinary
API calls; authorisation exists only as the answers TokenReview and SubjectAccessReview
give, which is what the EPP's metrics endpoint delegates to.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from .status import ApiError

MASTERS = "system:masters"


@dataclass(frozen=True, slots=True)
class UserInfo:
    """Who a token authenticates as (TokenReview's ``status.user``)."""

    username: str
    groups: tuple[str, ...] = ("system:authenticated",)
    uid: str = ""
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    def to_json(self) -> dict[str, Any]:
        user: dict[str, Any] = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            user["uid"] = self.uid
        if self.extra:
            user["extra"] = {k: list(v) for k, v in self.extra.items()}
        return user


@dataclass(frozen=True, slots=True)
class Rule:
    """Allows ``subject`` (a username or a group) ``verb`` on a path or on resources; ``*`` matches all.

    ``path`` ending in ``*`` is a prefix, as RBAC's nonResourceURLs.
    """

    subject: str
    verb: str = "*"
    path: str | None = None
    group: str = "*"
    resource: str = "*"
    namespace: str = "*"
    name: str = "*"

    def allows(self, user: str, groups: list[str], attrs: dict[str, Any], non_resource: bool) -> bool:
        if self.subject != user and self.subject not in groups:
            return False
        if not _match(self.verb, attrs.get("verb", "")):
            return False
        if non_resource:
            want = attrs.get("path", "")
            return self.path is not None and (
                self.path == want or (self.path.endswith("*") and want.startswith(self.path[:-1]))
            )
        if self.path is not None:
            return False
        resource = attrs.get("resource", "")
        if attrs.get("subresource"):
            resource = f"{resource}/{attrs['subresource']}"
        return (
            _match(self.group, attrs.get("group", ""))
            and _match(self.resource, resource)
            and _match(self.namespace, attrs.get("namespace", ""))
            and _match(self.name, attrs.get("name", ""))
        )


class Auth:
    """Known tokens and SAR rules; members of ``system:masters`` may do anything."""

    def __init__(self) -> None:
        self.tokens: dict[str, UserInfo] = {}
        self.rules: list[Rule] = []

    def user(self, header: str | None) -> UserInfo | None:
        """The user an ``Authorization: Bearer`` header authenticates, or None."""
        scheme, _, token = (header or "").partition(" ")
        return self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None

    def token_review(self, body: dict[str, Any]) -> dict[str, Any]:
        spec = body.get("spec") or {}
        user = self.tokens.get(spec.get("token", ""))
        status: dict[str, Any] = {"authenticated": user is not None, "user": {}}
        if user is not None:
            status["user"] = user.to_json()
            if spec.get("audiences"):
                status["audiences"] = spec["audiences"]
        else:
            status["error"] = "invalid bearer token"
        return _answer(body, "TokenReview", "authentication.k8s.io/v1", status)

    def subject_access_review(self, body: dict[str, Any]) -> dict[str, Any]:
        spec = body.get("spec") or {}
        res, non_res = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if (res is None) == (non_res is None):
            raise ApiError(
                422,
                "SubjectAccessReview.authorization.k8s.io is invalid: spec: Invalid value: exactly one of "
                "nonResourceAttributes or resourceAttributes must be specified",
            )
        user, groups = spec.get("user", ""), list(spec.get("groups") or [])
        attrs: dict[str, Any] = (non_res if non_res is not None else res) or {}
        non_resource = non_res is not None
        allowed = MASTERS in groups or any(r.allows(user, groups, attrs, non_resource) for r in self.rules)
        status: dict[str, Any] = {"allowed": allowed}
        if allowed:
            status["reason"] = "allowed by the fake apiserver's policy"
        return _answer(body, "SubjectAccessReview", "authorization.k8s.io/v1", status)


def _match(pattern: str, value: str) -> bool:
    return pattern in ("*", value)


def _answer(body: dict[str, Any], kind: str, api_version: str, status: dict[str, Any]) -> dict[str, Any]:
    answer = copy.deepcopy(body)
    answer.update(kind=kind, apiVersion=api_version, status=status)
    answer.setdefault("metadata", {}).setdefault("creationTimestamp", None)
    return answer
