"""The supervisor (epp.workers.supervisor) over tiny worker programs: restarts, crash loops, drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# A worker: records "<index> <pid>" in the run dir, then does what its mode says.
WORKER = """
import json, os, signal, sys, time
role = json.loads(os.environ["EPP_WORKER"])
run = role["run_dir"]
with open(os.path.join(run, "pids"), "a") as f:
    f.write(f"{role['index']} {os.getpid()}\\n")
mode = sys.argv[1]
if mode == "crash":
    sys.exit(3)
if mode == "config" and role["index"] == 1 or mode == "config-all":
    sys.exit(1)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
"""

# The supervisor under test, in its own process (it owns SIGTERM handling, as `epp` does).
DRIVER = """
import sys
from pathlib import Path
from epp.workers.supervisor import Limits, Supervisor
worker, mode, run = sys.argv[1:4]
sup = Supervisor([sys.executable, worker, mode], 2, env={}, replica="pod", run_dir=Path(run),
                 limits=Limits(max_restarts=2, window=60, backoff_first=0.01, backoff_max=0.02))
sys.exit(sup.run())
"""


def _until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)  # polling another process's state


def _pids(run: Path) -> list[tuple[int, int]]:
    path = run / "pids"
    if not path.exists():
        return []
    return [(int(a), int(b)) for a, b in (line.split() for line in path.read_text().splitlines())]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (already dead, parent not reaped yet) counts as gone
    return not Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "driver.py").write_text(DRIVER)
    run = tmp_path / "run"
    run.mkdir()
    procs: list[subprocess.Popen[bytes]] = []

    def start(mode: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "worker.py"), mode, str(run)]
        p = subprocess.Popen(argv)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_killed_worker_is_restarted_and_sigterm_drains_all(
    supervise: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    sup = supervise("serve")
    run = tmp_path / "run"
    _until(lambda: len(_pids(run)) == 2)
    (victim,) = [pid for i, pid in _pids(run) if i == 1]
    os.kill(victim, signal.SIGKILL)
    _until(lambda: len(_pids(run)) == 3)
    index, new = _pids(run)[2]
    assert index == 1 and new != victim
    assert json.loads((run / "restarts.json").read_text()) == {"0": 0, "1": 1}
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(20) == 0
    assert not any(_alive(pid) for _, pid in _pids(run))


def test_a_crash_loop_gives_up_with_exit_2(
    supervise: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    sup = supervise("crash")
    assert sup.wait(20) == 2
    deaths = [i for i, _ in _pids(tmp_path / "run")]
    assert (
        deaths.count(0) >= 3 or deaths.count(1) >= 3
    )  # started, restarted twice, then the loop was declared


def test_a_rejected_config_stops_everything_with_exit_1(
    supervise: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    sup = supervise("config")
    assert sup.wait(20) == 1
    run = tmp_path / "run"
    assert [i for i, _ in _pids(run)].count(1) == 1  # a config error is not retried
    assert not any(_alive(pid) for _, pid in _pids(run))


def test_every_worker_rejecting_the_config_is_still_exit_1(
    supervise: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    assert supervise("config-all").wait(20) == 1  # the second rejection, while stopping, is no crash


def test_workers_die_with_a_killed_supervisor(
    supervise: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    sup = supervise("serve")
    run = tmp_path / "run"
    _until(lambda: len(_pids(run)) == 2)
    sup.kill()
    sup.wait()
    _until(lambda: not any(_alive(pid) for _, pid in _pids(run)))
