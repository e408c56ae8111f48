"""A real stack per test: epp-sim replicas, the epp command, and Envoy configured like GIE's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from epp_sim.demo.envoy import Envoy, EnvoyConfig
from epp_sim.demo.procs import EppProcess, SimFleet

FAST_SIM = ("--time-scale", "0.02", "--seed", "7", "--max-model-len", "131072")
# For an EPP whose stop is only the test's teardown (Envoy already gone): close at once instead of
# waiting the drain's 0.5 s quiet gap for streams nobody will open.  Give it before the test's own
# flags, so a test of the drain that passes ``--shutdown-delay`` gets its own value (the last wins).
QUICK_STOP = "--shutdown-delay=0s"


@dataclass(slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def served_by(self) -> str:
        """``127.0.0.1:<port>`` of the replica that answered (the simulator says which)."""
        return f"127.0.0.1:{self.headers.get('x-inference-port', '?')}"

    @property
    def epp_choice(self) -> str:
        """The EPP's primary destination, as Envoy saw it on the request."""
        return self.headers.get("x-epp-destination", "").split(",")[0]

    def json(self) -> Any:
        import orjson

        return orjson.loads(self.body)


@dataclass(slots=True)
class Stack:
    fleet: SimFleet
    epp: EppProcess
    envoy: Envoy
    http: aiohttp.ClientSession
    tmp: pathlib.Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.envoy.url

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        async with self.http.request(method, self.url + path, json=json, data=data, headers=headers) as r:
            return Reply(r.status, dict(r.headers), await r.read())

    async def post(self, path: str, json: Any, headers: Mapping[str, str] | None = None) -> Reply:
        return await self.request("POST", path, json=json, headers=headers)

    async def sim_faults(self, replica: int, **faults: Any) -> None:
        url = f"http://127.0.0.1:{self.fleet.ports[replica]}/sim/faults"
        try:
            async with self.http.post(url, json=faults) as r:
                assert r.status == 200, await r.text()
        except aiohttp.ServerDisconnectedError:
            if not faults.get("crashed"):  # a crash drops every connection, this one included
                raise

    async def access_log_line(self, needle: str, timeout: float = 10.0) -> str:
        """The first Envoy access-log line containing ``needle`` (Envoy flushes the file lazily)."""
        path = self.tmp / "access.log"
        async with asyncio.timeout(timeout):
            while True:
                if path.exists():
                    for line in path.read_text().splitlines():
                        if needle in line:
                            return line
                await asyncio.sleep(0.1)  # poll interval (Envoy flushes the file lazily)

    async def epp_metrics(self) -> str:
        async with self.http.get(f"http://127.0.0.1:{self.epp.metrics_port}/metrics") as r:
            return await r.text()


@contextlib.asynccontextmanager
async def both_serving(a: EppProcess, b: EppProcess) -> AsyncIterator[None]:
    """Two EPP replicas started together (each may wait for the other as its peer) and serving;
    on a failure inside, both logs are printed; both are stopped and cleaned up after."""
    await asyncio.gather(a.start(wait=False), b.start(wait=False))
    try:
        await asyncio.gather(a.wait_serving(), b.wait_serving())
        yield
    except BaseException:
        print("---- epp a ----\n", a.log_tail(), "\n---- epp b ----\n", b.log_tail())
        raise
    finally:
        await asyncio.gather(a.stop(), b.stop())
        a.cleanup()
        b.cleanup()


async def open_loop(send: Callable[[int], Coroutine[Any, Any, None]], rate: float, seconds: float) -> None:
    """Call ``send(i)`` ``rate`` times a second for ``seconds``, whether or not earlier calls have
    finished (open-loop arrivals: a stuck replica cannot slow the load down), then await them all."""
    tasks = []
    start = time.monotonic()
    i = 0
    while (now := time.monotonic()) - start < seconds:
        tasks.append(asyncio.create_task(send(i)))
        i += 1
        await asyncio.sleep(max(0.0, start + i / rate - now))  # pacing: open-loop arrivals at `rate`
    await asyncio.gather(*tasks)


@contextlib.asynccontextmanager
async def make_stack(
    tmp: pathlib.Path,
    *,
    replicas: int = 3,
    sim_args: Sequence[str] = FAST_SIM,
    epp_args: Sequence[str] = (),
    config: str | None = None,
    objectives: str | None = None,
    envoy: Mapping[str, Any] | None = None,
    grpc: bool = False,
    labels: Sequence[Mapping[str, str]] | None = None,
) -> AsyncIterator[Stack]:
    """Start the fleet, the EPP (``--endpoints`` = the fleet) and Envoy; stop all three on exit.

    ``grpc``: route to the replicas' vLLM gRPC ports (h2c upstream), scraping metrics from
    their HTTP ports through an endpoints file.  ``labels``: one label map per replica (P/D
    roles), given to the EPP through an endpoints file.
    """
    args = list(epp_args)
    if grpc:
        sim_args = (*sim_args, "--grpc-base-port", "0")
    if config is not None:
        (tmp / "config.yaml").write_text(config)
        args.append(f"--config-file={tmp / 'config.yaml'}")
    if objectives is not None:
        (tmp / "objectives.yaml").write_text(objectives)
        args.append(f"--objectives-file={tmp / 'objectives.yaml'}")
    async with SimFleet(replicas, *sim_args) as fleet:
        if grpc:
            lines = [
                f"- {{address: 127.0.0.1, port: {g.split(':')[1]}, metricsPort: {h.split(':')[1]}}}"
                for g, h in zip(fleet.grpc_hostports, fleet.hostports, strict=True)
            ]
            (tmp / "endpoints.yaml").write_text("\n".join(lines) + "\n")
            discovery = f"--endpoints-file={tmp / 'endpoints.yaml'}"
        elif labels is not None:
            lines = [
                f"- {{address: 127.0.0.1, port: {h.split(':')[1]}, labels: {json.dumps(dict(lbl))}}}"
                for h, lbl in zip(fleet.hostports, labels, strict=True)
            ]
            (tmp / "endpoints.yaml").write_text("endpoints:\n" + "\n".join(lines) + "\n")
            discovery = f"--endpoints-file={tmp / 'endpoints.yaml'}"
        else:
            discovery = f"--endpoints={','.join(fleet.hostports)}"
        epp = EppProcess(discovery, "--bind-address=127.0.0.1", "--v=3", QUICK_STOP, *args)
        async with epp:
            envoy_args = dict(envoy or {})
            if envoy_args.pop("fallback_to_fleet", False):  # fail-open route: round robin over the fleet
                envoy_args["upstreams"] = fleet.hostports
            if grpc:
                envoy_args["upstream_http2"] = True
            envoy_args.setdefault("access_log", str(tmp / "access.log"))
            cfg = EnvoyConfig(ext_proc_port=epp.grpc_port, **envoy_args)
            async with Envoy(cfg) as proxy, aiohttp.ClientSession() as http:
                stack = Stack(fleet, epp, proxy, http, tmp)
                try:
                    yield stack
                except BaseException:
                    print("---- epp log ----\n", epp.log_tail(), "\n---- envoy log ----\n", proxy.log_tail())
                    raise


@pytest.fixture
async def stack(tmp_path: pathlib.Path) -> AsyncIterator[Stack]:
    """Three fast replicas behind the EPP with GIE's default config."""
    async with make_stack(tmp_path) as s:
        yield s
