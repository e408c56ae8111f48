"""Lease leader election against an API server: one leader, conflicts, release, loss on outage."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epp.k8s.client import Kube
from epp.k8s.leader import LeaderElector, Timings, lease_name
from epp.testing.waiting import until
from epp_kubeapi import KubeApiServer

FAST = Timings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.1)
NAME = lease_name("default", "pool")


@contextlib.asynccontextmanager
async def electing(kube: Kube, identity: str, timings: Timings = FAST) -> AsyncIterator[LeaderElector]:
    e = LeaderElector(kube, "default", NAME, identity, timings=timings)
    task = asyncio.create_task(e.run())
    try:
        yield e
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def lease_spec(api: KubeApiServer) -> dict[str, Any]:
    lease = api.get("coordination.k8s.io/v1", "Lease", "default", NAME)
    assert lease is not None
    spec: dict[str, Any] = lease["spec"]
    return spec


def test_lease_name_is_gies() -> None:
    assert NAME == "epp-default-pool.gateway-api-inference-extension.sigs.k8s.io"


def test_timings_are_validated() -> None:
    with pytest.raises(ValueError, match="lease-duration > renew-deadline"):
        Timings(lease_duration=10, renew_deadline=10, retry_period=2).validate()


async def test_exactly_one_leader_and_the_lease_says_who(api: KubeApiServer, kube: Kube) -> None:
    async with electing(kube, "a") as a, electing(kube, "b") as b:
        await until(lambda: a.is_leader or b.is_leader)
        leader, follower = (a, b) if a.is_leader else (b, a)
        # the follower keeps trying for more than a lease duration and never wins a live lease
        lease = api.get("coordination.k8s.io/v1", "Lease", "default", NAME)
        assert lease is not None and lease["spec"]["holderIdentity"] == leader.identity
        assert lease["spec"]["leaseDurationSeconds"] == 2  # 1.5 s rounded, as the field is whole seconds
        await until(lambda: follower.holder == leader.identity)
        renew = lease["spec"]["renewTime"]
        await until(lambda: lease_spec(api)["renewTime"] != renew)
        assert leader.is_leader and not follower.is_leader


async def test_release_hands_over_within_a_retry_period(api: KubeApiServer, kube: Kube) -> None:
    async with electing(kube, "a") as a:
        await until(lambda: a.is_leader)
        async with electing(kube, "b") as b:
            await until(lambda: b.holder == "a")
            await a.release()
            assert not a.is_leader
            lease = api.get("coordination.k8s.io/v1", "Lease", "default", NAME)
            assert lease is not None and lease["spec"]["holderIdentity"] == ""
            await until(lambda: b.is_leader, timeout=FAST.lease_duration)  # far sooner than expiry
            assert lease_spec(api)["leaseTransitions"] == 1


async def test_dead_leader_is_replaced_after_the_lease_expires(api: KubeApiServer, kube: Kube) -> None:
    async with electing(kube, "b") as b:
        async with electing(kube, "a") as a:
            await until(lambda: a.is_leader or b.is_leader)
            first = a if a.is_leader else b
        if first is a:  # a vanished without releasing (SIGKILL): b waits out the lease
            assert not b.is_leader
            await until(lambda: b.is_leader, timeout=5)


async def test_leader_steps_down_when_it_cannot_renew(api: KubeApiServer, kube: Kube) -> None:
    async with electing(kube, "a") as a:
        await until(lambda: a.is_leader)
        api.down = True
        await until(lambda: not a.is_leader, timeout=5)  # renew deadline passed
        api.down = False
        await until(lambda: a.is_leader, timeout=5)  # and it competes again


async def test_conflicting_update_loses_the_race(api: KubeApiServer, kube: Kube) -> None:
    api.create(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": NAME, "namespace": "default"},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 1},
        }
    )
    api.fail_next(count=1, status=409, path_contains=f"/leases/{NAME}")
    async with electing(kube, "a") as a:
        await until(lambda: a.is_leader)
    conflicts = [r for r in api.requests if r.method in ("GET", "PUT") and NAME in r.path]
    assert len(conflicts) >= 3  # the 409'd attempt, then GET + PUT that won
