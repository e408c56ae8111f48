"""How many cores the pod may use: the default for ``--workers``."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Final

CPU_MAX: Final = Path("/sys/fs/cgroup/cpu.max")


def available_cores(cpu_max: Path = CPU_MAX) -> int:
    """The CPUs this process may run on, capped by the cgroup v2 CPU quota when one is set.

    Affinity alone overcounts in a container: a pod limited to 2 CPUs still sees every core of
    the node, and more workers than the quota only adds context switches and memory.  The quota
    rounds up (1.5 CPUs → 2 workers) so a fractional limit still uses its last partial core.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_quota(cpu_max)
    return max(1, min(cores, quota) if quota is not None else cores)


def cgroup_quota(cpu_max: Path = CPU_MAX) -> int | None:
    """``cpu.max`` is ``"<quota> <period>"`` or ``"max <period>"`` (no limit); None when absent."""
    try:
        fields = cpu_max.read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))
