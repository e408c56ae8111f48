"""``epp``: parse flags, configure logging, build everything, then serve until told to stop."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import sys
from collections.abc import Mapping, Sequence

import structlog

from epp.app.compose import App, build_app
from epp.app.options import FLAGS, Options
from epp.app.serve import serve
from epp.cli.flags import HelpRequested, parse_flags
from epp.errors import ConfigError
from epp.log import bind_contextvars, configure_logging
from epp.workers.cores import available_cores
from epp.workers.role import WorkerRole, worker_peer_port
from epp.workers.supervisor import ExtraArgs, Supervisor, reserve_port, worker_argv

log = structlog.get_logger(__name__)


def _run(app: App) -> int:
    """Serve on uvloop when available (cheaper per message, tooling.md), else plain asyncio."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        return asyncio.run(serve(app))
    return uvloop.run(serve(app))


def main(argv: Sequence[str] | None = None) -> None:
    """Exit 0 after a clean shutdown, 1 on a bad flag or config (nothing was started), 2 on a crash."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] == "explain":  # subcommand: replay one request offline (docs/explain.md)
        from epp.cli.explain import main as explain

        sys.exit(explain(args[1:]))
    try:
        options = parse_flags(args, os.environ)
    except HelpRequested as h:
        print(h.text)
        sys.exit(0)
    except ConfigError as e:
        print(f"epp: {e}", file=sys.stderr)
        sys.exit(1)
    configure_logging(options)
    try:
        role = WorkerRole.from_env(os.environ)
    except ConfigError as e:
        print(f"epp: {e}", file=sys.stderr)
        sys.exit(1)
    if role is None:
        for notice in options.notices:
            log.warning("deprecated", notice=notice)
        count = options.workers or available_cores()
        if count > 1:
            try:
                check_peer_ports(options, count)
            except ConfigError as e:
                print(f"epp: {e}", file=sys.stderr)
                sys.exit(1)
            sys.exit(_supervise(options, args, count, os.environ))
    else:
        options = worker_options(options, role)
        bind_contextvars(worker=role.index)  # every line a worker logs says which worker
    try:
        app = build_app(options, os.environ)
    except ConfigError as e:
        log.error("startup_failed", error=str(e))  # noqa: TRY400 - the message is the diagnosis; no traceback
        print(f"epp: {e}", file=sys.stderr)
        sys.exit(1)
    try:
        code = _run(app)
    except ConfigError as e:  # raised while starting (e.g. a TLS certificate that cannot be read)
        log.error("startup_failed", error=str(e))  # noqa: TRY400 - the message is the diagnosis
        print(f"epp: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception:
        log.exception("epp_crashed")
        sys.exit(2)
    sys.exit(code)


def _supervise(options: Options, args: Sequence[str], count: int, env: Mapping[str, str]) -> int:
    """``--workers N`` (N > 1): this process only supervises; each worker is this command line again."""
    try:
        reservation = reserve_port(options.bind_address, options.grpc_port)  # --grpc-port 0: one for all
    except OSError as e:
        print(f"epp: --grpc-port {options.grpc_port}: cannot bind: {e}", file=sys.stderr)
        return 1
    with reservation:
        port = int(reservation.getsockname()[1])
        replica = env.get("POD_NAME") or socket.gethostname()
        supervisor = Supervisor(
            worker_argv(args, port), count, env=env, replica=replica, extra_args=sync_args(options)
        )
        return supervisor.run()


_FLAG_NAMES = frozenset(f.name for f in FLAGS)


def check_peer_ports(options: Options, count: int) -> None:
    """The workers' sync ports (``--peer-port`` + 2*i*, and the next with ZMQ) must stay below
    65536 and clear of the pod's other ports: otherwise one worker fails to bind long after the
    others started (44 workers from 9004 reach the metrics port 9090).  ConfigError naming the flags."""
    base = options.peer_port
    if base <= 0:
        return
    bound = 2 if options.peer_transport == "zmq" else 1  # ports a worker binds from its own
    taken = {worker_peer_port(base, i) + k for i in range(count) for k in range(bound)}
    last = max(taken)
    span = f"{count} workers use sync ports {base}-{last} (two apart from --peer-port)"
    if last > 65535:
        raise ConfigError(f"--peer-port: {span}, past 65535; lower --peer-port or --workers")
    for flag, port in (
        ("--grpc-port", options.grpc_port),
        ("--grpc-health-port", options.grpc_health_port),
        ("--metrics-port", options.metrics_port),
    ):
        if port in taken:
            raise ConfigError(
                f"--peer-port: {span}, one of them {flag} {port}; move --peer-port or lower --workers"
            )


def sync_args(options: Options, flag_names: frozenset[str] = _FLAG_NAMES) -> ExtraArgs:
    """Per worker: what makes the workers of one pod sync peers of each other (epp.sync).

    Worker *i* gets ``--replica-id <id>-w<i>`` (``<id>``: ``--replica-id``, else POD_NAME, else the
    host name), ``--peer-port <base + 2i>`` (worker 0 keeps the pod's port, the one other pods
    list) and ``--peers`` = the given peers plus every sibling's loopback address.  Only the flags
    the sync hub declares are passed, and none of the peer flags when sync is off
    (``--peer-port 0``) or peers come from ``--peers-file`` (it excludes ``--peers``).
    """
    base = options.peer_port
    given = options.peers
    own_id = options.replica_id
    host = options.bind_address if options.bind_address not in ("", "0.0.0.0", "::") else "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    peer_flags = {"peer-port", "peers"} <= flag_names and base > 0 and not options.peers_file

    def extra(role: WorkerRole) -> list[str]:
        out: list[str] = []
        if "replica-id" in flag_names:
            out.append(f"--replica-id={own_id or role.replica}-w{role.index}")
        if peer_flags:
            siblings = [f"{host}:{role.peer_port(base, j)}" for j in role.siblings]
            out.append(f"--peer-port={role.peer_port(base)}")
            out.append("--peers=" + ",".join([p for p in given.split(",") if p.strip()] + siblings))
        return out

    return extra


def worker_options(options: Options, role: WorkerRole) -> Options:
    """What only worker 0 does: leader election (the pod leads or not as one; the others follow its
    health).  The health and metrics ports are decided in ``serve`` from the same role."""
    if role.primary:
        return options
    return dataclasses.replace(options, ha_enable_leader_election=False)
