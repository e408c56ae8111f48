"""Who serves a connection the listener accepted: this process, or a sibling that holds fewer.

The server knows connections; which process should hold one is the pod's business
(``epp.workers.balance`` under ``--workers N``).  These two small interfaces are all the two
sides see of each other.
"""

from __future__ import annotations

import socket
from typing import Protocol


class Holder(Protocol):
    """The server side: serve a connection someone accepted, or move one of its clients away."""

    def adopt(self, sock: socket.socket) -> None:
        """Serve ``sock``, an accepted connection (this process's own, or handed over by a sibling)."""
        ...

    def retire_one(self) -> bool:
        """Ask one client to move to a new connection, losing no stream; False if none can."""
        ...


class Placement(Protocol):
    """The pod side: where each accepted connection goes, and what this process holds."""

    def start(self, holder: Holder) -> None:
        """Take connections handed over by siblings (to ``holder.adopt``) from now on."""
        ...

    def place(self, sock: socket.socket) -> bool:
        """True when ``sock`` was handed to a sibling (close this process's copy); False: serve it."""
        ...

    def held(self, connections: int) -> None:
        """This process now serves ``connections`` connections of the proxy's."""
        ...

    def stop(self) -> None:
        """Take no more connections (draining or stopped)."""
        ...
