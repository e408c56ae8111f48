"""``make test``'s xdist schedule: one worker runs the e2e and ``serial`` tests one after another
from the start, the other workers share the unit tests.

The e2e tests start real processes (Envoy, the EPP, simulators) with wall-clock bounds: two at
once on two cores would fight over the CPU; beside one unit-test worker they have what they had
serially, and the unit tests (about half as long in all) end behind them.  xdist's own
``--dist loadgroup`` cannot do this with pytest 9.2: it renames ``item._nodeid``, which pytest no
longer reads, so its groups are silently ignored.

The controller does not collect, so it cannot read markers: each worker writes the node ids of
its serial tests to a file the controller named (``pytest_configure_node``), and the scheduler
reads it once every worker has collected.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Sequence
from typing import Any

from xdist.scheduler import LoadScheduling  # type: ignore[import-untyped]


def serial_file() -> pathlib.Path:
    """A fresh path for one run's list (the directory is the caller's to remove)."""
    return pathlib.Path(tempfile.mkdtemp(prefix="epp-serial-")) / "nodeids"


def write_serial(path: pathlib.Path, nodeids: Sequence[str]) -> None:
    """Every worker writes the same list: each one whole (a rename), whichever lands last."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text("".join(f"{n}\n" for n in nodeids))
    tmp.replace(path)


class SerialTail(LoadScheduling):  # type: ignore[misc]  # xdist ships no type information
    """xdist's ``load`` scheduling, but the serial tests all go to the first worker at once, in
    collection order, and that worker gets unit tests only once it has (almost) none left."""

    collection: list[str] | None  # xdist's, typed here
    maxschedchunk: int | None

    def __init__(self, config: Any, log: Any, path: pathlib.Path) -> None:
        super().__init__(config, log)
        self._path = path
        self._serial_node: Any = None

    def schedule(self) -> None:
        if self.collection is not None:  # a node added later: xdist's handling
            super().schedule()
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        serial_ids = set(self._path.read_text().splitlines()) if self._path.exists() else set()
        collection: list[str] = next(iter(self.node2collection.values()))
        serial = [i for i, nodeid in enumerate(collection) if nodeid in serial_ids]
        if not serial:
            super().schedule()
            return
        self.collection = collection
        taken = set(serial)
        self.pending[:] = [i for i in range(len(collection)) if i not in taken]
        if self.maxschedchunk is None:
            self.maxschedchunk = len(collection)
        node, *others = self.nodes
        self._serial_node = node
        self.node2pending[node].extend(serial)
        node.send_runtest_some(serial)
        if others and self.pending:
            chunk = max(2, min(len(self.pending) // len(others) // 4, self.maxschedchunk))
            for other in others:
                self._send_tests(other, chunk)
        if not self.pending:
            for n in self.nodes:
                n.shutdown()

    def check_schedule(self, node: Any, duration: float = 0) -> None:
        if node is self._serial_node and self.pending and len(self.node2pending[node]) >= 2:
            return  # still on the serial tests: the unit tests go to the others
        super().check_schedule(node, duration)
