"""Tests of the fleet: independent replicas, DP ranks, per-replica overrides, the admin API."""

from __future__ import annotations

import aiohttp
import pytest

from epp_sim.config import FleetConfig, SimConfigError, parse_override
from epp_sim.fleet import Fleet
from tests.epp_sim.helpers import engine_config, metric_value

LONG = "A long shared system prompt for the fleet tests. " * 40  # 1960 chars = 490 tokens


async def complete(http: aiohttp.ClientSession, url: str, **body: object) -> tuple[int, dict[str, str]]:
    async with http.post(url + "/v1/completions", json={"max_tokens": 2, **body}) as response:
        await response.read()
        return response.status, {
            k.lower(): v for k, v in response.headers.items() if k.lower().startswith("x-")
        }


async def test_replicas_are_independent(http: aiohttp.ClientSession) -> None:
    """Each replica has its own port, name and engine state: a prompt cached on one is not on another."""
    async with Fleet(FleetConfig(replicas=3, engine=engine_config())) as fleet:
        ports = [r.port for r in fleet.replicas]
        for replica in fleet.replicas:
            status, headers = await complete(http, replica.url, prompt="hello")
            assert (status, headers["x-inference-pod"], headers["x-inference-port"]) == (
                200,
                replica.name,
                str(replica.port),
            )
        await complete(http, fleet.replicas[0].url, prompt=LONG)
        cached = [r.ranks[0].engine.cache.cached_blocks for r in fleet.replicas]
    assert len(set(ports)) == 3
    assert [r.name for r in fleet.replicas] == ["sim-0", "sim-1", "sim-2"]
    assert cached[0] == 490 // 16
    assert cached[1:] == [0, 0]


async def test_dp_ranks_serve_on_their_own_ports(http: aiohttp.ClientSession) -> None:
    """With dp_size=2 a replica listens on two ports, one engine each, labelled engine="<rank>"."""
    async with Fleet(FleetConfig(replicas=2, dp_size=2, engine=engine_config())) as fleet:
        seen = set()
        for rank in fleet.ranks:
            status, headers = await complete(http, rank.url, prompt="dp")
            assert status == 200
            seen.add((headers["x-inference-pod"], int(headers["x-inference-port"])))
            async with http.get(rank.url + "/metrics") as response:
                text = await response.text()
            assert (
                metric_value(
                    text, "vllm:request_success_total", engine=str(rank.rank), finished_reason="length"
                )
                == 1
            )
        records = fleet.endpoints()
    assert seen == {(r.name, r.port) for r in fleet.ranks}
    assert len({port for _, port in seen}) == 4
    assert [(r["name"], r["rank"]) for r in records] == [
        ("sim-0", 0),
        ("sim-0", 1),
        ("sim-1", 0),
        ("sim-1", 1),
    ]
    assert {r["role"] for r in records} == {"both"}  # the P/D role each port reports (default)


async def test_override_makes_one_replica_slow(http: aiohttp.ClientSession) -> None:
    """A per-replica override changes only that replica's engine (here its step time)."""
    config = FleetConfig(
        replicas=2, engine=engine_config(), overrides=(parse_override("replica=1,step-base-ms=60"),)
    )
    async with Fleet(config) as fleet:
        for replica in fleet.replicas:
            await complete(http, replica.url, prompt="same prompt", max_tokens=4)
        itl = [r.ranks[0].engine.stats.itl for r in fleet.replicas]
    fast, slow = (h.sum / h.count for h in itl)
    assert fast == pytest.approx(0.00608, rel=0.01)
    assert slow == pytest.approx(0.06008, rel=0.01)


async def test_admin_api_flips_faults_per_replica(http: aiohttp.ClientSession) -> None:
    """POST /sim/faults on the admin port targets one replica; GET /sim/state reports every rank."""
    async with Fleet(FleetConfig(replicas=2, admin_port=0, engine=engine_config())) as fleet:
        admin = f"http://127.0.0.1:{fleet.admin_port}"
        async with http.post(admin + "/sim/faults", json={"replica": 1, "error_rate": 1.0}) as response:
            faults = await response.json()
        assert [f["error_rate"] for f in faults] == [0.0, 1.0]
        assert (await complete(http, fleet.replicas[0].url, prompt="x"))[0] == 200
        assert (await complete(http, fleet.replicas[1].url, prompt="x"))[0] == 500
        async with http.post(admin + "/sim/faults", json={"replica": 1, "explode": True}) as response:
            assert response.status == 400
            assert "unknown fault 'explode'" in (await response.json())["error"]
        async with http.get(admin + "/sim/state") as response:
            state = await response.json()
    assert [(s["name"], s["engine"]["steps"] > 0) for s in state] == [("sim-0", True), ("sim-1", False)]
    assert {r["protocol"] for r in fleet.endpoints()} == {"http", "admin"}


def test_targets_validate_indexes() -> None:
    """Fault changes addressed to a replica or rank that does not exist are refused."""
    fleet = Fleet(FleetConfig(replicas=1))
    with pytest.raises(SimConfigError, match="out of range"):
        fleet.targets(replica=3)
