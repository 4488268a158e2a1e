"""What this machine offers a local Ray session: its GPUs and the CPUs this process may use.

``run_search`` starts a local session with these numbers, and ``cem-bench search``'s banner counts the trials
that fit with them, so the two agree. Only the standard library (and torch for the GPUs): no Ray.
"""

from __future__ import annotations

import os

CGROUP_ROOT = "/sys/fs/cgroup"   # where a container's cgroup files are (cpu.max, cpu/cpu.cfs_quota_us)


def detect_gpus() -> int:
    """The CUDA devices torch sees here (0 without CUDA or torch)."""
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def cpu_quota(cgroup_root: str = CGROUP_ROOT) -> int | None:
    """The whole CPUs a container's CPU quota allows (rounded down, at least 1), or None where no quota is set:
    cgroup v2 ``cpu.max`` ("max 100000": none; "200000 100000": 2 CPUs), else cgroup v1
    ``cpu/cpu.cfs_quota_us`` over ``cpu/cpu.cfs_period_us`` (a quota of -1: none)."""
    def read(*parts: str) -> str | None:
        try:
            with open(os.path.join(cgroup_root, *parts), encoding="ascii") as fh:
                return fh.read().strip()
        except (OSError, UnicodeDecodeError):
            return None

    v2 = read("cpu.max")
    if v2 is not None:
        fields = v2.split()
        quota, period = (fields + ["100000"])[:2] if fields else ("max", "100000")
    else:
        quota, period = read("cpu", "cpu.cfs_quota_us"), read("cpu", "cpu.cfs_period_us")
    try:
        q, p = int(quota), int(period)
    except (TypeError, ValueError):   # "max", a missing file, or something unreadable: no quota
        return None
    if q <= 0 or p <= 0:              # -1 (cgroup v1): no quota
        return None
    return max(1, q // p)


def detect_cpus(cgroup_root: str = CGROUP_ROOT) -> int:
    """The CPUs a local Ray session counts: those this process may use (its CPU affinity, else the machine's
    cores), capped by a container's CPU quota (not the host's cores). The local session is started with this
    number, so the banner and Ray agree."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota(cgroup_root)
    return max(1, min(cores, quota) if quota is not None else cores)
