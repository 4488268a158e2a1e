"""What a search driver hands the objects it runs, without Ray's privates: the CPUs a local session counts
(a container's quota from cgroup files), the registry of the driver's paths (``search/driver.py``) and the
storage guard that a restored experiment's pickled copy reports into. No Ray session is started."""

from __future__ import annotations

import os
import pickle

import pytest

from cem_bench.search import run


# ------------------------------------------------------------------------------ the CPUs
def _cgroup(root, files: dict[str, str]):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


@pytest.mark.parametrize(("files", "cpus"), [
    ({"cpu.max": "max 100000\n"}, None),                           # cgroup v2, no quota
    ({"cpu.max": "200000 100000\n"}, 2),                           # 2 CPUs
    ({"cpu.max": "150000 100000\n"}, 1),                           # 1.5: rounded down
    ({"cpu.max": "50000 100000\n"}, 1),                            # half a CPU: at least 1
    ({"cpu.max": "400000\n"}, 4),                                  # the period left out: its default, 100000
    ({"cpu.max": "garbage\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),   # cgroup v1, no quota
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),
    ({"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2),
    ({"cpu/cpu.cfs_quota_us": "300000\n"}, None),                  # no period: unreadable, no quota
    ({}, None),                                                    # no cgroup files at all
])
def test_cpu_quota_reads_cgroup_v2_and_v1(tmp_path, files, cpus):
    assert run.cpu_quota(_cgroup(tmp_path, files)) == cpus


def test_cgroup_v2_wins_over_v1(tmp_path):
    root = _cgroup(tmp_path, {"cpu.max": "100000 100000", "cpu/cpu.cfs_quota_us": "800000",
                              "cpu/cpu.cfs_period_us": "100000"})
    assert run.cpu_quota(root) == 1


def test_detected_cpus_are_the_usable_cores_capped_by_the_quota(tmp_path):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert run._detect_cpus(_cgroup(tmp_path / "none", {"cpu.max": "max 100000"})) == cores
    assert run._detect_cpus(_cgroup(tmp_path / "one", {"cpu.max": "100000 100000"})) == 1
    assert run._detect_cpus(_cgroup(tmp_path / "many", {"cpu.max": f"{(cores + 8) * 100000} 100000"})) == cores
