"""Lease-based leader election, as client-go's ``leaderelection`` does it (GIE §7.6).

A ``coordination.k8s.io/v1`` Lease named ``epp-<namespace>-<name>.gateway-api-inference-
extension.sigs.k8s.io``; controller-runtime's timings (15 s lease, 10 s renew deadline, 2 s
retry).  Updates carry the Lease's resourceVersion, so two candidates racing for it get one
200 and one 409.  A lease held by someone else counts as expired only once *this* process has
seen it unchanged for the lease duration (client-go's observedTime: no trust in other clocks).

Unlike controller-runtime, losing the lease does not exit the process: every replica watches
and scrapes all the time (hot standby), so a replica that lost the lease only stops saying
ready and competes again.  On shutdown the leader releases the lease (empty holder, 1 s
duration), so a successor takes over within one retry period instead of a lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import structlog

from epp.k8s.client import Kube, resource_path
from epp.k8s.errors import ApiError

log = structlog.get_logger(__name__)

LEASE_SUFFIX: Final = ".gateway-api-inference-extension.sigs.k8s.io"
JITTER: Final = 1.2  # client-go's JitterFactor for the acquire loop


def lease_name(namespace: str, name: str) -> str:
    return f"epp-{namespace}-{name}{LEASE_SUFFIX}"


@dataclass(frozen=True, slots=True)
class Timings:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def validate(self) -> None:
        if not self.lease_duration > self.renew_deadline > JITTER * self.retry_period > 0:
            raise ValueError(
                "leader election needs lease-duration > renew-deadline > 1.2 * retry-period > 0, got "
                f"{self.lease_duration}s, {self.renew_deadline}s, {self.retry_period}s"
            )


def _micro_time(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """``run()`` competes for the lease until cancelled; ``is_leader`` is safe to poll per probe."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        *,
        timings: Timings = Timings(),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        timings.validate()
        self._kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timings = timings
        self._clock = clock
        self._wall = wall
        self._on_change = on_change
        self._path = resource_path("coordination.k8s.io", "v1", "leases", namespace, name)
        self._observed: tuple[Any, ...] = ()
        self._observed_at = 0.0
        self._renewed_at = -float("inf")  # monotonic time of our last successful acquire/renew
        self._leader = False
        self.transitions = 0  # times this process became leader
        self.holder = ""  # last holder seen
        self._released = False  # after release() this process never competes again

    @property
    def is_leader(self) -> bool:
        return self._leader and self._clock() - self._renewed_at < self.timings.renew_deadline

    def is_released(self) -> bool:
        return self._released

    def _set_leader(self, value: bool) -> None:
        if value != self._leader:
            self._leader = value
            if value:
                self.transitions += 1
            log.info("leader_election", leader=value, identity=self.identity, lease=self.name)
            if self._on_change is not None:
                self._on_change(value)

    async def run(self) -> None:
        period = self.timings.retry_period
        while not self.is_released():
            ok = await self._try()
            if self.is_released():
                return
            now = self._clock()
            if ok:
                self._renewed_at = now
                self._set_leader(True)
            elif self._leader and now - self._renewed_at >= self.timings.renew_deadline:
                log.warning("leader_lost", identity=self.identity, lease=self.name)
                self._set_leader(False)
            delay = period if self._leader else period * (1 + random.random() * (JITTER - 1))
            await asyncio.sleep(delay)

    async def _try(self) -> bool:
        try:
            return await self._try_acquire_or_renew()
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            log.warning("lease_update_failed", lease=self.name, error=str(e) or type(e).__name__)
            return False

    async def _try_acquire_or_renew(self) -> bool:
        now_wall = self._wall()
        try:
            lease = await self._kube.json("GET", self._path)
        except ApiError as e:
            if e.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now_wall, acquire=now_wall, transitions=0),
            }
            try:
                await self._kube.json(
                    "POST", resource_path("coordination.k8s.io", "v1", "leases", self.namespace), body=body
                )
            except ApiError as e2:
                if e2.status == 409:
                    return False  # someone created it first
                raise
            self.holder = self.identity
            return True
        spec: Mapping[str, Any] = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        self.holder = holder
        record = (
            holder,
            spec.get("renewTime"),
            spec.get("leaseDurationSeconds"),
            spec.get("leaseTransitions"),
        )
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.timings.lease_duration)
        if holder and holder != self.identity and now < self._observed_at + duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquire = spec.get("acquireTime") or _micro_time(now_wall)
        else:
            transitions += 1
            acquire = _micro_time(now_wall)
        updated = dict(lease)
        updated["spec"] = self._spec(now_wall, acquire=acquire, transitions=transitions)
        try:
            await self._kube.json("PUT", self._path, body=updated)
        except ApiError as e:
            if e.status == 409:
                return False  # lost a race: someone updated the lease since our GET
            raise
        self.holder = self.identity
        return True

    def _spec(self, now_wall: float, *, acquire: float | str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.timings.lease_duration),
            "acquireTime": acquire if isinstance(acquire, str) else _micro_time(acquire),
            "renewTime": _micro_time(now_wall),
            "leaseTransitions": transitions,
        }

    async def release(self) -> None:
        """Give the lease up (on SIGTERM) so a successor need not wait for it to expire."""
        self._released = True
        if not self._leader:
            return
        self._set_leader(False)
        with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError, OSError):
            lease = await self._kube.json("GET", self._path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            now = _micro_time(self._wall())
            lease["spec"] = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": spec.get("leaseTransitions") or 0,
            }
            await self._kube.json("PUT", self._path, body=lease)
            log.info("lease_released", lease=self.name, identity=self.identity)
