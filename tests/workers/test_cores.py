"""The default ``--workers``: CPU affinity capped by the cgroup v2 quota."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from epp.workers.cores import available_cores, cgroup_quota


@pytest.mark.parametrize(
    ("text", "quota"),
    [
        ("max 100000\n", None),
        ("200000 100000\n", 2),
        ("150000 100000", 2),
        ("50000 100000", 1),
        ("junk", None),
    ],
)
def test_cgroup_quota(tmp_path: Path, text: str, quota: int | None) -> None:
    (tmp_path / "cpu.max").write_text(text)
    assert cgroup_quota(tmp_path / "cpu.max") == quota


def test_no_cgroup_file_means_affinity(tmp_path: Path) -> None:
    assert available_cores(tmp_path / "absent") == len(os.sched_getaffinity(0))


def test_quota_caps_affinity(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert available_cores(tmp_path / "cpu.max") == 1
    (tmp_path / "cpu.max").write_text(f"{1000 * 100000} 100000\n")  # more than the node has
    assert available_cores(tmp_path / "cpu.max") == len(os.sched_getaffinity(0))
