"""A fleet of simulated replicas in one process, with a programmatic API and an admin HTTP server."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

import orjson
import zmq
from aiohttp import web

from epp_sim.config import FleetConfig, ReplicaConfig, SimConfigError
from epp_sim.lora import LoraRegistry
from epp_sim.rank import Rank, listen_socket


class Replica:
    """One simulated pod: `dp_size` ranks sharing a LoRA registry (like vLLM DP ranks share a server)."""

    def __init__(self, config: ReplicaConfig, ranks: list[Rank], registry: LoraRegistry) -> None:
        self.config = config
        self.name = config.name
        self.index = config.index
        self.ranks = ranks
        self.registry = registry

    @property
    def url(self) -> str:
        return self.ranks[0].url

    @property
    def port(self) -> int:
        return self.ranks[0].port


class Fleet:
    """`async with Fleet(FleetConfig(replicas=3)) as fleet:` serves until the block exits.

    `fleet.replicas[i].ranks[r]` gives each rank's port, URL, engine (queue, KV cache) and faults;
    `fleet.set_faults(...)` flips fault knobs at run time, as POST /sim/faults does over HTTP.
    """

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.replicas: list[Replica] = []
        self.admin_port: int | None = None
        self._zmq: zmq.Context[zmq.Socket[bytes]] | None = None
        self._admin_runner: web.AppRunner | None = None

    async def __aenter__(self) -> Fleet:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def ranks(self) -> list[Rank]:
        return [rank for replica in self.replicas for rank in replica.ranks]

    async def start(self) -> None:
        config = self.config
        replica_configs = config.replica_configs()
        if any(rc.engine.kv_events for rc in replica_configs):
            self._zmq = zmq.Context()
        global_rank = 0
        for rc in replica_configs:
            registry = LoraRegistry(rc.engine.lora_modules)
            ranks = []
            for r in range(rc.dp_size):
                port = 0 if config.base_port == 0 else config.base_port + global_rank
                grpc_port = None
                if config.grpc_base_port is not None:
                    grpc_port = 0 if config.grpc_base_port == 0 else config.grpc_base_port + global_rank
                rank = Rank(
                    rc,
                    r,
                    host=config.host,
                    port=port,
                    grpc_port=grpc_port,
                    registry=registry,
                    zmq_context=self._zmq,
                    kv_offset=global_rank,
                )
                ranks.append(rank)
                global_rank += 1
            replica = Replica(rc, ranks, registry)
            self.replicas.append(replica)
            for rank in ranks:
                await rank.start()
        if config.admin_port is not None:
            await self._start_admin(config.admin_port)

    async def stop(self) -> None:
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
            self._admin_runner = None
        for rank in self.ranks:
            await rank.stop()
        if self._zmq is not None:
            self._zmq.term()
            self._zmq = None

    def rank(self, replica: int, rank: int = 0) -> Rank:
        return self.replicas[replica].ranks[rank]

    def targets(self, replica: int | None = None, rank: int | None = None) -> list[Rank]:
        """The ranks a fault change addresses: all, one replica's, or one."""
        if replica is not None and not 0 <= replica < len(self.replicas):
            raise SimConfigError(f"replica {replica} out of range [0, {len(self.replicas)})")
        replicas = self.replicas if replica is None else [self.replicas[replica]]
        ranks = [r for rep in replicas for r in rep.ranks if rank is None or r.rank == rank]
        if not ranks:
            raise SimConfigError(f"no rank {rank} in replica {replica}")
        return ranks

    async def set_faults(self, replica: int | None = None, rank: int | None = None, **changes: Any) -> None:
        for target in self.targets(replica, rank):
            await target.set_faults(changes)

    def endpoints(self) -> list[dict[str, Any]]:
        """One record per listening port, as the CLI prints them."""
        records: list[dict[str, Any]] = []
        for replica in self.replicas:
            for rank in replica.ranks:
                base = {"name": replica.name, "replica": replica.index, "rank": rank.rank, "host": rank.host}
                records.append(
                    {
                        **base,
                        "port": rank.port,
                        "protocol": "http",
                        "model": rank.engine.config.model,
                        "kv_events": rank.publisher.endpoint if rank.publisher is not None else None,
                        "kv_topic": rank.publisher.topic if rank.publisher is not None else None,
                        "kv_replay": rank.publisher.replay_endpoint if rank.publisher is not None else None,
                    }
                )
                if rank.grpc_port is not None:
                    records.append({**base, "port": rank.grpc_port, "protocol": "grpc"})
        if self.admin_port is not None:
            records.append(
                {"name": "admin", "host": self.config.host, "port": self.admin_port, "protocol": "admin"}
            )
        return records

    # ---- fleet admin server -------------------------------------------------------------------

    async def _start_admin(self, port: int) -> None:
        app = web.Application()
        app.router.add_get("/sim/state", self._admin_state)
        app.router.add_get("/sim/faults", self._admin_faults)
        app.router.add_post("/sim/faults", self._admin_faults)
        self._admin_runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._admin_runner.setup()
        sock = listen_socket(self.config.host, port)
        self.admin_port = sock.getsockname()[1]
        await web.SockSite(self._admin_runner, sock).start()

    async def _admin_state(self, request: web.Request) -> web.Response:
        return _json([rank.state() for rank in self.ranks])

    async def _admin_faults(self, request: web.Request) -> web.Response:
        """POST {"replica": i?, "rank": r?, <fault>: value, ...}; GET lists every rank's faults."""
        if request.method == "POST":
            try:
                changes = _object(orjson.loads(await request.read()))
                replica = changes.pop("replica", None)
                rank = changes.pop("rank", None)
                await self.set_faults(replica, rank, **changes)
            except (orjson.JSONDecodeError, SimConfigError, TypeError) as exc:
                return _json({"error": str(exc)}, status=400)
        return _json(
            [{"name": r.name, "rank": r.rank, "port": r.port, **r.faults.as_dict()} for r in self.ranks]
        )


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise SimConfigError("body must be a JSON object")
    return dict(value)


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(value), content_type="application/json")
