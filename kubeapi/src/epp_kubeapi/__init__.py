"""A fake Kubernetes apiserver for tests: real REST, watch and auth-review protocol, in process.

The unmodified ``kubernetes_asyncio`` client works against it through ``write_kubeconfig``;
resourceVersions, 409/410 semantics, bookmarks and selectors behave like a real cluster's,
and faults (compaction, dropped watches, injected errors, an outage) are one call away.
"""

from .auth import UserInfo
from .resources import Resource, inference_crds
from .server import KubeApiServer, RecordedRequest
from .status import AlreadyExists, ApiError, Conflict, Expired, NotFound

__all__ = [
    "AlreadyExists",
    "ApiError",
    "Conflict",
    "Expired",
    "KubeApiServer",
    "NotFound",
    "RecordedRequest",
    "Resource",
    "UserInfo",
    "inference_crds",
]
