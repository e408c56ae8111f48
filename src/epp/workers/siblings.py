"""Worker 0's view of its siblings: their /metrics for the pod's aggregate, their readiness for its health.

Each worker serves /metrics and /ready on a Unix socket in the run directory (``role.py``), the
cheapest choice for the request path: a worker's counters stay the plain in-process ones, and
only a scrape (or the readiness poll) crosses a process boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
import structlog
from prometheus_client import Metric

from epp.workers.aggregate import aggregate
from epp.workers.balance import ConnectionBalance
from epp.workers.role import WorkerRole
from epp.workers.supervisor import RESTARTS_FILE

log = structlog.get_logger(__name__)

POLL_INTERVAL: Final = 0.25  # how soon the pod's health notices a sibling (not) ready
FETCH_TIMEOUT: Final = 2.0


def quorum(count: int) -> int:
    """Workers that must be ready for the pod to say SERVING: at least half of them.

    Not all: SO_REUSEPORT hands new connections only to listening workers, so one worker
    restarting costs capacity, not requests, and taking the whole pod out of rotation for it
    (with 2 workers, a majority is both) would cost more.  Not one: a pod whose workers mostly
    crash-loop should leave the rotation.
    """
    return (count + 1) // 2


class WorkerSeries:
    """This worker's own identity series, read at scrape time (nothing is counted per request)."""

    def __init__(
        self, role: WorkerRole, opened: Callable[[], int], balance: ConnectionBalance | None = None
    ) -> None:
        self._role = role
        self._opened = opened
        self._balance = balance

    def collect(self) -> Iterator[Metric]:
        worker = {"worker": str(self._role.index)}
        m = Metric("epp_worker_ext_proc_streams", "ext_proc streams this worker accepted.", "counter")
        m.add_sample("epp_worker_ext_proc_streams_total", worker, self._opened())
        yield m
        balance = self._balance
        if balance is None:
            return
        m = Metric("epp_worker_connections", "The proxy's ext_proc connections this worker serves.", "gauge")
        m.add_sample("epp_worker_connections", worker, max(0, balance.holding))
        yield m
        moves = Metric(
            "epp_worker_connections_moved",
            "Connections moved between workers: handed (accepted here, served by a sibling), received "
            "(the reverse), retired (asked to reconnect, to even the workers out), failed (a handover "
            "that did not go through: served here).",
            "counter",
        )
        for how, n in (
            ("handed", balance.handed),
            ("received", balance.received),
            ("retired", balance.retired),
            ("failed", balance.handover_failed),
        ):
            moves.add_sample("epp_worker_connections_moved_total", {**worker, "how": how}, n)
        yield moves


class Siblings:
    """``async with Siblings(role):`` polls the other workers' readiness; ``metrics`` merges their series."""

    def __init__(
        self,
        role: WorkerRole,
        *,
        interval: float = POLL_INTERVAL,
        own_ready: Callable[[], bool] = lambda: True,
        synced: bool = False,
    ) -> None:
        self._role = role
        self._synced = synced  # the workers sync routing state: their prefix indexes are copies
        self._own_ready = own_ready
        self._interval = interval
        self._sessions: dict[int, aiohttp.ClientSession] = {}
        self._ready: dict[int, bool] = dict.fromkeys(role.siblings, False)
        self._poll: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Siblings:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT)
        for i in self._role.siblings:
            connector = aiohttp.UnixConnector(path=str(self._role.metrics_socket(i)))
            self._sessions[i] = aiohttp.ClientSession(connector=connector, timeout=timeout)
        self._poll = asyncio.create_task(self._poll_ready(), name="workers-ready-poll")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
        for s in self._sessions.values():
            await s.close()

    @property
    def ready(self) -> int:
        """Siblings ready at the last poll (this worker not included)."""
        return sum(self._ready.values())

    def quorate(self, self_ready: bool) -> bool:
        return int(self_ready) + self.ready >= quorum(self._role.count)

    async def _get(self, i: int, path: str) -> tuple[int, bytes] | None:
        try:
            async with self._sessions[i].get(f"http://worker{i}{path}") as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None  # not started yet, restarting, or wedged: not ready, no series

    async def _poll_ready(self) -> None:
        while True:
            answers = await asyncio.gather(*(self._get(i, "/ready") for i in self._role.siblings))
            for i, answer in zip(self._role.siblings, answers, strict=True):
                ready = answer is not None and answer[0] == 200
                if ready != self._ready[i]:
                    log.info("worker_readiness", worker=i, ready=ready)
                self._ready[i] = ready
            await asyncio.sleep(self._interval)  # a poll period, not a wait for a condition

    async def metrics(self, own: bytes) -> bytes:
        """The pod's /metrics: this worker's body merged with every sibling's that answers."""
        answers = await asyncio.gather(*(self._get(i, "/metrics") for i in self._role.siblings))
        bodies = [own, *(a[1] for a in answers if a is not None and a[0] == 200)]
        bodies.append(self.pod_series(len(bodies)).encode())
        return await asyncio.to_thread(aggregate, bodies, synced=self._synced)

    async def decisions(self, own: dict[str, Any], request_id: str, limit: int) -> dict[str, Any]:
        """The pod's /debug/decisions: every worker's ring, newest first, ``limit`` of them."""
        query = urlencode({"request_id": request_id, "limit": limit})
        answers = await asyncio.gather(
            *(self._get(i, f"/debug/decisions?{query}") for i in self._role.siblings)
        )
        merged = list(own.get("decisions", []))
        for a in answers:
            if a is not None and a[0] == 200:
                merged.extend(json.loads(a[1]).get("decisions", []))
        merged.sort(key=lambda d: float(d.get("time") or 0), reverse=True)
        return {**own, "decisions": merged if request_id else merged[:limit]}

    def pod_series(self, reporting: int) -> str:
        """The series worker 0 adds for the pod (the supervisor's view): workers, those reporting to
        this scrape, those ready, and each worker's restarts."""
        lines = [
            "# HELP epp_workers Worker processes this pod runs (--workers).",
            "# TYPE epp_workers gauge",
            f"epp_workers {self._role.count}",
            "# HELP epp_workers_reporting Workers whose series this scrape merged.",
            "# TYPE epp_workers_reporting gauge",
            f"epp_workers_reporting {reporting}",
            "# HELP epp_workers_ready Workers ready to route (listening on the ext_proc port) at the last "
            "readiness poll, worker 0 included; the pod says SERVING from half of them.",
            "# TYPE epp_workers_ready gauge",
            f"epp_workers_ready {self.ready + int(self._own_ready())}",
            "# HELP epp_worker_restarts_total Times the supervisor restarted each worker.",
            "# TYPE epp_worker_restarts_total counter",
        ]
        try:
            restarts = json.loads((self._role.run_dir / RESTARTS_FILE).read_text())
        except (OSError, ValueError):
            restarts = {}
        lines.extend(
            f'epp_worker_restarts_total{{worker="{i}"}} {int(restarts.get(str(i), 0))}'
            for i in range(self._role.count)
        )
        return "\n".join(lines) + "\n"
