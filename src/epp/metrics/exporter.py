"""The ``/metrics`` HTTP endpoint (and, with ``--enable-pprof``, Python's answer to /debug/pprof)."""

from __future__ import annotations

import asyncio
import cProfile
import gc
import io
import pstats
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, Protocol

import orjson
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epp.metrics.llmd import FAMILY_SETS, FamilySetView
from epp.metrics.series import REGISTRY

log = structlog.get_logger(__name__)

MAX_PROFILE_SECONDS = 60.0

# (Authorization header, path) -> (HTTP status, reason); 200 lets the request through.
Authorize = Callable[[str, str], Awaitable[tuple[int, str]]]


class Siblings(Protocol):
    """``--workers``: worker 0 answers for the pod, merging in what the other workers answer."""

    async def metrics(self, own: bytes) -> bytes:
        """This process's /metrics body → the pod's."""
        ...

    async def decisions(self, own: dict[str, Any], request_id: str, limit: int) -> dict[str, Any]:
        """This process's /debug/decisions answer → the pod's."""
        ...


_EXPOSITION: Final = web.AppKey("exposition", FamilySetView)
_SIBLINGS: Final[web.AppKey[Siblings]] = web.AppKey("siblings")


async def _metrics(request: web.Request) -> web.Response:
    body = await asyncio.to_thread(generate_latest, request.app[_EXPOSITION])
    siblings = request.app.get(_SIBLINGS)
    if siblings is not None:
        body = await siblings.metrics(body)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _ready(ready: Callable[[], bool]) -> Any:
    """``/ready`` (``--workers``: on a worker's Unix socket, for worker 0's health): 200 or 503."""

    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=200 if ready() else 503)

    return handler


async def _tasks(request: web.Request) -> web.Response:
    """Every asyncio task with its stack: the goroutine dump of a Python EPP."""
    out = io.StringIO()
    tasks = asyncio.all_tasks()
    out.write(f"{len(tasks)} tasks\n\n")
    for t in sorted(tasks, key=lambda t: t.get_name()):
        out.write(f"--- {t.get_name()} ({'done' if t.done() else 'pending'})\n")
        t.print_stack(limit=20, file=out)
        out.write("\n")
    return web.Response(text=out.getvalue())


async def _profile(request: web.Request) -> web.Response:
    """Profile the event loop thread for ``seconds`` (default 10) and return the top functions."""
    try:
        seconds = min(float(request.query.get("seconds", "10")), MAX_PROFILE_SECONDS)
    except ValueError:
        return web.Response(status=400, text="seconds must be a number")
    prof = cProfile.Profile()
    prof.enable()
    try:
        await asyncio.sleep(seconds)
    finally:
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(60)
    return web.Response(text=out.getvalue())


async def _heap(request: web.Request) -> web.Response:
    """Live objects by type (gc-tracked), largest counts first."""
    counts = Counter(type(o).__qualname__ for o in gc.get_objects())
    lines = [f"{n:>10}  {name}" for name, n in counts.most_common(80)]
    return web.Response(text="\n".join(lines) + "\n")


def _auth_middleware(authorize: Authorize) -> Any:
    """Every path on this server (/metrics, /debug/pprof/*) needs an authorised bearer token."""

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        status, reason = await authorize(request.headers.get("Authorization", ""), request.path)
        if status != 200:
            return web.Response(status=status, text=f"{reason}\n")
        resp: web.StreamResponse = await handler(request)
        return resp

    return middleware


def _debug_state(state: Callable[[], dict[str, Any]]) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(
            body=orjson.dumps(state(), option=orjson.OPT_INDENT_2), content_type="application/json"
        )

    return handler


class DecisionsView(Protocol):
    """What ``/debug/decisions`` serves (``epp.explain.record.DecisionRing``)."""

    def query(self, request_id: str = "", limit: int = 20) -> dict[str, Any]: ...


def _decisions(view: DecisionsView) -> Any:
    async def handler(request: web.Request) -> web.Response:
        q = request.query
        raw = q.get("limit", "20")
        if not raw.isdigit():
            return web.Response(status=400, text="limit must be a non-negative integer\n")
        limit = int(raw)
        request_id = q.get("request_id", "")
        body = view.query(request_id, limit)
        siblings = request.app.get(_SIBLINGS)
        if siblings is not None:
            body = await siblings.decisions(body, request_id, limit)
        return web.Response(
            body=orjson.dumps(body, option=orjson.OPT_INDENT_2), content_type="application/json"
        )

    return handler


def build_app(
    *,
    enable_pprof: bool,
    authorize: Authorize | None = None,
    families: Iterable[str] = FAMILY_SETS,
    debug_state: Callable[[], dict[str, Any]] | None = None,
    decisions: DecisionsView | None = None,
    siblings: Siblings | None = None,
    ready: Callable[[], bool] | None = None,
) -> web.Application:
    """``families``: which metric names /metrics serves, GIE's and/or llm-d-router's (metrics/llmd.py).
    ``debug_state``: what ``/debug/plugins/state`` shows (behind the same authorisation as /metrics).
    ``decisions``: the last routing decisions ``/debug/decisions`` shows (``?request_id=``, ``?limit=``).
    ``siblings``: worker 0 of ``--workers`` merges the other workers' /metrics and /debug/decisions in.
    ``ready``: serve ``/ready`` from it (each worker of ``--workers``, for worker 0's health).
    """
    app = web.Application(middlewares=[_auth_middleware(authorize)] if authorize is not None else [])
    app[_EXPOSITION] = FamilySetView(REGISTRY, families)
    if siblings is not None:
        app[_SIBLINGS] = siblings
    app.router.add_get("/metrics", _metrics)
    if ready is not None:
        app.router.add_get("/ready", _ready(ready))
    if debug_state is not None:
        app.router.add_get("/debug/plugins/state", _debug_state(debug_state))
    if decisions is not None:
        app.router.add_get("/debug/decisions", _decisions(decisions))
    if enable_pprof:
        app.router.add_get("/debug/pprof/goroutine", _tasks)
        app.router.add_get("/debug/pprof/profile", _profile)
        app.router.add_get("/debug/pprof/heap", _heap)
    return app


class MetricsServer:
    """``async with MetricsServer(host, port):`` serves /metrics until the block exits.

    ``unix_path``: listen on that Unix socket instead of ``host:port`` (a worker of ``--workers``
    other than worker 0: only its siblings read it).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        enable_pprof: bool = True,
        authorize: Authorize | None = None,
        families: Iterable[str] = FAMILY_SETS,
        debug_state: Callable[[], dict[str, Any]] | None = None,
        decisions: DecisionsView | None = None,
        siblings: Siblings | None = None,
        ready: Callable[[], bool] | None = None,
        unix_path: str = "",
    ) -> None:
        self._host = host
        self._unix_path = unix_path
        self._port = port
        self._pprof = enable_pprof
        self._families = frozenset(families)
        self._app = build_app(
            enable_pprof=enable_pprof,
            authorize=authorize,
            families=self._families,
            debug_state=debug_state,
            decisions=decisions,
            siblings=siblings,
            ready=ready,
        )
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def __aenter__(self) -> MetricsServer:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        if self._unix_path:
            await web.UnixSite(self._runner, self._unix_path).start()
            log.info("metrics_server_started", path=self._unix_path)
            return self
        site = web.TCPSite(self._runner, self._host or None, self._port)
        await site.start()
        server: Any = site._server  # aiohttp exposes no public accessor for the bound port
        self.port = server.sockets[0].getsockname()[1] if server and server.sockets else self._port
        log.info(
            "metrics_server_started",
            port=self.port,
            pprof=self._pprof,
            auth=bool(self._app.middlewares),
            families=",".join(sorted(self._families)),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
