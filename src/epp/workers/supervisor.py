"""The supervisor of ``--workers N``: start N copies of ``epp``, restart the ones that die, drain on SIGTERM.

It is deliberately thin — no event loop, no application, no port of its own but a reservation:
everything a pod serves once (health, /metrics, leader election) is worker 0's (``role.py``), so
the supervisor's only state is its children.  It waits on each child's pidfd and on a self-pipe
for signals in one ``select``, so it costs nothing between events.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import structlog

from epp.datalayer.kvevents.subscriber import RELAY_ENV
from epp.datalayer.shared_scrapes import SHARE_ENV
from epp.workers.balance import CLOSED, SLOTS_FILE, Slots
from epp.workers.role import ENV, WorkerRole

log = structlog.get_logger(__name__)

CONFIG_ERROR: Final = 1  # ``epp`` exits 1 on a bad flag or config: restarting cannot fix it
CRASH_LOOP: Final = 2
BACKOFF_FIRST: Final = 0.5
BACKOFF_MAX: Final = 10.0
STABLE_AFTER: Final = 30.0  # a worker that lived this long starts its backoff afresh
RESTARTS_FILE: Final = "restarts.json"  # worker 0 exports these as epp_worker_restarts_total

_PR_SET_PDEATHSIG: Final = 1

# Flags one worker gets beyond the shared command line (its sync identity and peers).
ExtraArgs = Callable[[WorkerRole], list[str]]


@dataclass(frozen=True, slots=True)
class Limits:
    """A worker that dies more than ``max_restarts`` times within ``window`` seconds is crash-looping:
    give up.  Restarts back off from ``backoff_first`` doubling to ``backoff_max``."""

    max_restarts: int = 5
    window: float = 60.0
    backoff_first: float = BACKOFF_FIRST
    backoff_max: float = BACKOFF_MAX


@dataclass(slots=True)
class _Child:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    pidfd: int = -1
    started: float = 0.0
    failures: int = 0  # consecutive short-lived exits: the backoff's exponent
    restarts: int = 0
    deaths: list[float] = field(default_factory=list)
    due: float | None = None  # when to restart it


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) ``host:port`` with SO_REUSEPORT so ``--grpc-port 0`` becomes one port every
    worker shares; the socket stays open so nothing else takes the port between worker restarts."""
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host or "0.0.0.0", port))
    return sock


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """A SIGKILLed supervisor must not leave workers holding the port."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    """Run ``argv`` (an ``epp`` command line) as workers ``0..count-1`` until SIGTERM or a crash loop."""

    def __init__(
        self,
        argv: Sequence[str],
        count: int,
        *,
        env: Mapping[str, str],
        replica: str,
        run_dir: Path | None = None,
        limits: Limits | None = None,
        extra_args: ExtraArgs | None = None,
    ) -> None:
        self._argv = list(argv)
        self._env = dict(env)
        self._replica = replica
        self._run_dir = run_dir
        self._limits = limits or Limits()
        self._extra_args = extra_args
        self._children = [_Child(i) for i in range(count)]
        self._sel = selectors.DefaultSelector()
        self._stopping = False
        self._slots: Slots | None = None

    def run(self) -> int:
        """Exit code: 0 after a drained SIGTERM, 1 if a worker rejected its config, 2 on a crash loop."""
        with contextlib.ExitStack() as stack:
            run_dir = self._run_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="epp-")))
            self._run_dir = run_dir
            self._slots = Slots.create(run_dir / SLOTS_FILE, len(self._children))  # connections each serves
            stack.callback(self._slots.close)
            rfd, wfd = os.pipe()
            stack.callback(os.close, rfd)
            stack.callback(os.close, wfd)
            os.set_blocking(wfd, False)
            previous = signal.set_wakeup_fd(wfd)
            stack.callback(signal.set_wakeup_fd, previous)
            for sig in (signal.SIGTERM, signal.SIGINT):
                old = signal.signal(sig, lambda *_: None)  # delivered through the wakeup fd
                stack.callback(signal.signal, sig, old)
            self._sel.register(rfd, selectors.EVENT_READ, None)
            log.info("workers_starting", workers=len(self._children), run_dir=str(run_dir))
            for child in self._children:
                self._spawn(child)
            try:
                return self._loop(rfd)
            finally:
                self._kill_all()

    def _loop(self, rfd: int) -> int:
        code = 0
        while any(c.proc is not None or (c.due is not None and not self._stopping) for c in self._children):
            dues = [c.due for c in self._children if c.due is not None]
            timeout = max(0.0, min(dues) - time.monotonic()) if dues and not self._stopping else None
            for key, _ in self._sel.select(timeout):
                if key.data is None:
                    for signum in os.read(rfd, 64):
                        self._on_signal(signum)
                else:
                    result = self._on_exit(key.data)  # always: it reaps the child
                    code = code or result  # the first failure names the exit
                    if code and not self._stopping:  # config error or crash loop: take the rest down
                        self._stop_all(signal.SIGTERM)
            now = time.monotonic()
            for child in self._children:
                if child.due is not None and child.due <= now and not self._stopping:
                    self._spawn(child)
        return code

    def _on_signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            log.info("workers_draining", signal=signal.Signals(signum).name)
            self._stop_all(signal.SIGTERM)  # each worker drains as a single EPP would

    def _stop_all(self, sig: int) -> None:
        self._stopping = True
        for child in self._children:
            child.due = None
            if child.proc is not None and child.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(sig)

    def _on_exit(self, child: _Child) -> int:
        """Reap ``child``; schedule its restart, or return the supervisor's exit code if it must stop."""
        assert child.proc is not None
        rc = child.proc.wait()
        self._sel.unregister(child.pidfd)
        os.close(child.pidfd)
        child.proc, child.pidfd = None, -1
        if self._slots is not None:  # its connections died with it: siblings hand it none until it is back
            self._slots.write(child.index, CLOSED)
        now = time.monotonic()
        if self._stopping:
            log.info("worker_stopped", worker=child.index, exit_code=rc)
            if rc == CONFIG_ERROR:
                return CONFIG_ERROR
            return 0 if rc in (0, -signal.SIGTERM) else CRASH_LOOP
        if rc == CONFIG_ERROR:
            log.error("worker_rejected_config", worker=child.index, exit_code=rc)
            return CONFIG_ERROR
        child.deaths = [t for t in child.deaths if now - t < self._limits.window] + [now]
        if len(child.deaths) > self._limits.max_restarts:
            log.error(
                "workers_crash_loop",
                worker=child.index,
                exit_code=rc,
                deaths=len(child.deaths),
                window_seconds=self._limits.window,
            )
            return CRASH_LOOP
        child.failures = 0 if now - child.started >= STABLE_AFTER else child.failures + 1
        lim = self._limits
        backoff = (
            0.0
            if child.failures == 0
            else min(lim.backoff_max, lim.backoff_first * 2 ** (child.failures - 1))
        )
        child.due = now + backoff
        child.restarts += 1
        self._write_restarts()
        log.warning(
            "worker_died",
            worker=child.index,
            exit_code=rc,
            restart_in_seconds=backoff,
            restarts=child.restarts,
        )
        return 0

    def _spawn(self, child: _Child) -> None:
        assert self._run_dir is not None
        role = WorkerRole(child.index, len(self._children), self._run_dir, self._replica)
        with contextlib.suppress(FileNotFoundError):
            role.metrics_socket().unlink()  # a dead worker's socket file
        env = {
            **self._env,
            ENV: role.to_env(),
            RELAY_ENV: role.kv_events_relay,
            SHARE_ENV: role.scrape_share,
        }
        argv = self._argv + (self._extra_args(role) if self._extra_args is not None else [])
        child.proc = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)
        child.pidfd = os.pidfd_open(child.proc.pid)
        self._sel.register(child.pidfd, selectors.EVENT_READ, child)
        child.started, child.due = time.monotonic(), None
        log.info("worker_started", worker=child.index, pid=child.proc.pid)

    def _write_restarts(self) -> None:
        assert self._run_dir is not None
        path = self._run_dir / RESTARTS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(c.index): c.restarts for c in self._children}))
        tmp.replace(path)  # worker 0 reads it whole at scrape time

    def _kill_all(self) -> None:
        """On the way out (also after an exception): no worker outlives its supervisor."""
        for child in self._children:
            if child.proc is not None and child.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
                child.proc.wait()


def worker_argv(args: Sequence[str], grpc_port: int) -> list[str]:
    """The same ``epp`` command line for every worker, with the (reserved) ext_proc port made explicit."""
    return [sys.executable, "-m", "epp", *args, f"--grpc-port={grpc_port}"]
