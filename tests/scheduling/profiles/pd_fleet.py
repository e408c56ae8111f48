"""A labelled P/D fleet and a real scheduler over the role filters, for the P/D tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.datalayer.api import Endpoint
from epp.datalayer.roles import ROLE_LABEL
from epp.scheduling.filters.by_label import DecodeFilter, PrefillFilter
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.scheduler import Scheduler, SchedulerProfile
from epp.scheduling.scorers.queue import QueueScorer
from epp.testing.builders import make_endpoint
from epp.testing.plugins import FakeHandle, build


def fleet(*roles: str | None, queues: Sequence[int] = ()) -> list[Endpoint]:
    """One endpoint per role (None: no label), ``pod-<i>`` at 192.168.1.<i+1>; queues default to i."""
    return [
        make_endpoint(
            i,
            queue=queues[i] if queues else i,
            labels={} if role is None else {ROLE_LABEL: role},
        )
        for i, role in enumerate(roles)
    ]


def pd_scheduler(handler_cls: Any, plugins: Sequence[Any] = (), **params: Any) -> Scheduler:
    """``handler_cls`` over a ``decode`` and a ``prefill`` profile (role filter, queue scorer, max score)."""
    handler = build(handler_cls, handle=FakeHandle(plugins), **params)
    handler.bind_plugins({d.typed_name.name: d for d in plugins}.get)
    picker = build(MaxScorePicker)
    queue = build(QueueScorer)
    profiles = [
        SchedulerProfile("decode", filters=[build(DecodeFilter)], scorers=[(queue, 1.0)], picker=picker),
        SchedulerProfile("prefill", filters=[build(PrefillFilter)], scorers=[(queue, 1.0)], picker=picker),
    ]
    return Scheduler(handler, profiles)
