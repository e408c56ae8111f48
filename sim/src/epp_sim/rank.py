"""One DP rank of a replica: its engine task, HTTP site, optional gRPC server and fault transitions."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import Mapping
from typing import Any

import grpc
import zmq
from aiohttp import web

from epp_sim.config import ReplicaConfig
from epp_sim.engine import Engine
from epp_sim.grpc_api import GrpcApi
from epp_sim.http_api import HttpApi
from epp_sim.kv_events import KVEventPublisher, offset_endpoint
from epp_sim.lora import LoraRegistry
from epp_sim.metrics import MetricsRenderer

_CRASH_ERROR = "The engine crashed (simulated crash fault)."
_RESTART_ERROR = "The engine restarted (simulated restart under another hash algorithm or seed)."


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; SO_REUSEADDR so a port can be re-bound after a refuse/crash fault."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class Rank:
    """Engine + servers of one DP rank. Listening follows the faults: off when refusing or crashed."""

    def __init__(
        self,
        replica: ReplicaConfig,
        rank: int,
        *,
        host: str,
        port: int,
        grpc_port: int | None,
        registry: LoraRegistry,
        zmq_context: zmq.Context[zmq.Socket[bytes]] | None,
        kv_offset: int,
    ) -> None:
        self.replica = replica
        self.rank = rank
        self.name = replica.name
        self.dp_size = replica.dp_size
        self.host = host
        self.port = port
        self.port_text = str(port)
        self.grpc_port = grpc_port
        self.registry = registry
        self.faults = dataclasses.replace(replica.faults)
        self.busy_transports: set[asyncio.BaseTransport] = set()  # connections serving an inference request
        self._zmq_context = zmq_context
        self._kv_offset = kv_offset
        self.publisher: KVEventPublisher | None = None
        self.engine = Engine(replica.engine, faults=self.faults, rank=rank)
        self.renderer = MetricsRenderer(replica.engine.metrics_style, replica.engine.model, rank)
        self._http = HttpApi(self)
        self._grpc = GrpcApi(self)
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None
        self._grpc_server: grpc.aio.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def listening(self) -> bool:
        return self._site is not None

    async def start(self) -> None:
        sock = listen_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self.port_text = str(self.port)
        config = self.replica.engine
        if config.kv_events and self._zmq_context is not None:
            topic = config.kv_events_topic.format(
                host=self.host, port=self.port, model=config.model, rank=self.rank
            )
            endpoint = offset_endpoint(config.kv_events, self._kv_offset)
            replay = (
                offset_endpoint(config.kv_events_replay, self._kv_offset) if config.kv_events_replay else None
            )
            self.publisher = KVEventPublisher(
                self._zmq_context,
                endpoint,
                topic,
                self.rank,
                replay_endpoint=replay,
                buffer_steps=config.kv_events_buffer_steps,
            )
            self.engine.publisher = self.publisher
            self.publisher.silent = self.faults.kv_events_silent
            self.engine.cache.record_events = True
        self._runner = web.AppRunner(self._http.build_app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        if self.grpc_port is not None:
            await self._start_grpc()
        self._task = asyncio.create_task(self.engine.run(), name=f"engine-{self.name}-{self.rank}")
        if self._should_listen():
            await self._listen(sock)
        else:
            sock.close()
            await self._stop_grpc()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._stop_grpc()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._site = None
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None

    async def set_faults(self, changes: Mapping[str, Any]) -> None:
        """Apply fault changes and their side effects (crash, stop or resume listening, unpause)."""
        was_crashed = self.faults.crashed
        hashing = (self.faults.restart_hash_algo, self.faults.restart_hash_seed)
        self.faults.update(changes)
        if self.faults.crashed and not was_crashed:
            self._abort_connections()
            self.engine.reset(_CRASH_ERROR)
        elif (self.faults.restart_hash_algo, self.faults.restart_hash_seed) != hashing:
            # vLLM reads both at start: the engine restarts under them (the process is new); the
            # requests in flight fail, this admin request is answered
            for transport in list(self.busy_transports):
                if isinstance(transport, asyncio.Transport):
                    transport.abort()
            self.engine.reset(_RESTART_ERROR)
        if self.publisher is not None:
            self.publisher.silent = self.faults.kv_events_silent
        await self._sync_listening()
        self.engine.wake()

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rank": self.rank,
            "role": self.replica.role,
            "host": self.host,
            "port": self.port,
            "grpc_port": self.grpc_port,
            "listening": self.listening,
            "kv_events": self.publisher.endpoint if self.publisher is not None else None,
            "kv_events_replay": self.publisher.replay_endpoint if self.publisher is not None else None,
            "kv_events_seq": self.publisher.seq if self.publisher is not None else None,
            "faults": self.faults.as_dict(),
            "engine": self.engine.snapshot(),
        }

    # ---- listening ----------------------------------------------------------------------------

    def _should_listen(self) -> bool:
        return not (self.faults.refuse_connections or self.faults.crashed)

    async def _listen(self, sock: socket.socket) -> None:
        assert self._runner is not None
        self._site = web.SockSite(self._runner, sock)
        await self._site.start()

    async def _sync_listening(self) -> None:
        if self._runner is None:
            return
        if self._should_listen() and self._site is None:
            await self._listen(listen_socket(self.host, self.port))
            if self.grpc_port is not None and self._grpc_server is None:
                await self._start_grpc()
        elif not self._should_listen() and self._site is not None:
            await self._site.stop()
            self._site = None
            server = self._runner.server
            if server is not None:  # idle keep-alive connections close now, busy ones after their response
                for connection in list(server.connections):
                    if connection.transport in self.busy_transports:
                        connection.close()
                    else:
                        connection.force_close()
            await self._stop_grpc()

    def _abort_connections(self) -> None:
        """A crash: reset every connection of this rank, mid-response or not."""
        server = self._runner.server if self._runner is not None else None
        if server is not None:
            for connection in list(server.connections):
                transport = connection.transport
                if transport is not None:
                    transport.abort()

    async def _start_grpc(self) -> None:
        assert self.grpc_port is not None
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((self._grpc.handler(),))
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.grpc_port = server.add_insecure_port(f"{host}:{self.grpc_port}")
        await server.start()
        self._grpc_server = server

    async def _stop_grpc(self) -> None:
        if self._grpc_server is not None:
            await self._grpc_server.stop(0)
            self._grpc_server = None
