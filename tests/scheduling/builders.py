"""Shorthands of the scheduling, producer and detector tests over the kit's builders (epp.testing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.datalayer.api import Endpoint
from epp.plugin.base import PluginBase
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, RequestBody
from epp.scheduling.api import Picker, ProfileRunResult
from epp.testing.builders import make_endpoint


def endpoint(
    i: int,
    *,
    queue: int = 0,
    kv: float = 0.0,
    running: int = 0,
    active: Sequence[str] = (),
    waiting: Sequence[str] = (),
    max_active: int = 0,
    block_size: int = 0,
    num_blocks: int = 0,
    address: str = "",
    port: int = 8000,
    fresh: bool = True,
) -> Endpoint:
    """``pod-<i>`` at 192.168.1.<i+1>:8000 with the given metrics (fresh unless told otherwise)."""
    return make_endpoint(
        i,
        queue=queue,
        kv=kv,
        running=running,
        active=active,
        waiting=waiting,
        max_loras=max_active,
        address=address or None,
        port=port,
        fresh=fresh,
        cache_block_size=block_size,
        cache_num_blocks=num_blocks,
    )


def request(
    *,
    model: str = "my-model",
    headers: dict[str, str] | None = None,
    body: RequestBody | None = None,
    request_id: str = "test-request-id",
) -> InferenceRequest:
    """A request as the scheduler sees it: no parsed body unless given."""
    return InferenceRequest(request_id=request_id, headers=headers or {}, body=body, target_model=model)


class DropFilter(PluginBase):
    """Drops the endpoints whose pod name, a number, is in ``drop`` (a new list: the profile's
    score cache cannot be keyed on it)."""

    TYPE: ClassVar[str] = "test-drop-filter"

    def __init__(self, drop: frozenset[int]) -> None:
        super().__init__("drop", None, None)  # type: ignore[arg-type]
        self.drop = drop

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        return [e for e in endpoints if int(e.metadata.pod_name) not in self.drop]


class Recording(PluginBase):
    """A picker that keeps a copy of the totals it is handed (``seen``), then asks ``inner``."""

    TYPE: ClassVar[str] = "test-recording-picker"

    def __init__(self, inner: Picker) -> None:
        super().__init__("rec", None, None)  # type: ignore[arg-type]
        self.inner = inner
        self.seen: list[float] = []

    def pick(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        scores: Sequence[float],
    ) -> ProfileRunResult:
        self.seen = list(scores)  # before the picker, which may reorder its list
        return self.inner.pick(state, request, endpoints, scores)
