"""Which worker this process is, as the supervisor told it through ``EPP_WORKER``.

The supervisor passes the role in the environment rather than as flags: it is how the processes
of one pod find each other, not a setting an operator chooses, so it stays out of ``--help``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from epp.errors import ConfigError

ENV: Final = "EPP_WORKER"
PEER_PORT_STRIDE: Final = 2  # --peer-port (deltas) and, with the ZMQ transport, the port after it (snapshots)


def worker_peer_port(base: int, index: int) -> int:
    """The sync port of worker ``index`` when the pod's is ``base`` (``--peer-port``): each replica
    binds up to two ports (deltas, and with ZMQ snapshots on the next), so worker *i* takes
    ``base + 2i``; worker 0 keeps the pod's own port.  The supervisor's port check
    (``cli.main.check_peer_ports``) and the workers' peer lists both come from here."""
    return base + PEER_PORT_STRIDE * index


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """Worker ``index`` of ``count``; ``run_dir`` holds the local sockets the workers share.

    Worker 0 is the *primary*: it alone owns what must happen once per pod — the health and
    metrics ports, leader election, binding the KV-events ``zmqEndpoint`` — and it serves the
    pod's /metrics by merging every worker's series.
    """

    index: int
    count: int
    run_dir: Path
    replica: str  # this pod's name; the worker's replica id is ``<replica>-w<index>``

    @property
    def primary(self) -> bool:
        return self.index == 0

    @property
    def replica_id(self) -> str:
        return f"{self.replica}-w{self.index}"

    def metrics_socket(self, index: int | None = None) -> Path:
        """The Unix socket where worker ``index`` (default: this one) serves /metrics and /ready."""
        return self.run_dir / f"w{self.index if index is None else index}.metrics.sock"

    def handoff_socket(self, index: int | None = None) -> Path:
        """The Unix datagram socket where worker ``index`` (default: this one) takes connections a
        sibling accepted (``balance.py``)."""
        return self.run_dir / f"w{self.index if index is None else index}.conns.sock"

    def peer_port(self, base: int, index: int | None = None) -> int:
        """The sync port of worker ``index`` (default: this one) when the pod's is ``base``
        (``worker_peer_port``)."""
        return worker_peer_port(base, self.index if index is None else index)

    @property
    def kv_events_relay(self) -> str:
        """Where worker 0 republishes the KV events of a centralised ``zmqEndpoint`` it alone can bind:
        ``bind:<ipc>`` for worker 0, ``connect:<ipc>`` for the others (``EPP_KV_EVENTS_RELAY``)."""
        return f"{'bind' if self.primary else 'connect'}:ipc://{self.run_dir / 'kv-events.pub'}"

    @property
    def scrape_share(self) -> str:
        """Where worker 0 republishes the model servers' pages it fetched, so the others need not
        scrape them (``EPP_SCRAPE_SHARE``, ``epp.datalayer.shared_scrapes``): ``bind:<ipc>`` for
        worker 0, ``connect:<ipc>`` for the others."""
        return f"{'bind' if self.primary else 'connect'}:ipc://{self.run_dir / 'scrapes.pub'}"

    def sibling_peer_ports(self, own: int) -> frozenset[int]:
        """The other workers' sync ports when this one's is ``own`` (the ``--peer-port`` the
        supervisor gave it), so the sync hub knows which peers are this pod's workers (it
        coalesces longer between them)."""
        base = own - PEER_PORT_STRIDE * self.index
        return frozenset(self.peer_port(base, j) for j in self.siblings)

    @property
    def siblings(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.count) if i != self.index)

    def to_env(self) -> str:
        return json.dumps(
            {"index": self.index, "count": self.count, "run_dir": str(self.run_dir), "replica": self.replica}
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerRole | None:
        """None when this process is not a supervised worker (``--workers 1``, or no supervisor)."""
        raw = env.get(ENV)
        if not raw:
            return None
        try:
            d = json.loads(raw)
            role = cls(int(d["index"]), int(d["count"]), Path(d["run_dir"]), str(d["replica"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{ENV}: not a worker role the supervisor writes: {raw!r} ({e})") from e
        if not 0 <= role.index < role.count:
            raise ConfigError(f"{ENV}: index {role.index} outside 0..{role.count - 1}")
        return role
