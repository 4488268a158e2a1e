"""Where a result came from: the project's git commit, the device, the time. Recorded in every result."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone


def _read_git_sha() -> str:
    """HEAD's commit, with ``-dirty`` (git describe's mark) when the package's own files differ from it: a
    tracked one changed or deleted, or an untracked one added (a new estimator not yet committed runs too).
    Only the package: a changed doc, space or test does not change what a trial runs. ``unknown`` without git,
    outside a repository, or in a repository that does not track the package (another project's, holding an
    installed copy)."""
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        if not sha:
            return "unknown"
        # The repository must hold this file: a package installed into a .venv inside some other repository
        # (ignored or untracked there) would otherwise be labelled with that repository's HEAD.
        tracked = subprocess.run(["git", "ls-files", "--", os.path.basename(__file__)], cwd=here,
                                 capture_output=True, text=True, timeout=5)
        if tracked.returncode != 0 or not tracked.stdout.strip():
            return "unknown"
        status = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here, capture_output=True,
                                text=True, timeout=5)
        return sha + ("-dirty" if status.returncode == 0 and status.stdout.strip() else "")
    except Exception:
        return "unknown"


# Read when the process imports the project, not when a result is written: a trial runs the code its process
# imported, and a commit made while it trains (a search of hours beside a working tree) would otherwise label
# its result with code it never ran.
_GIT_SHA = _read_git_sha()


def git_sha() -> str:
    """The commit (12 characters) of the tree this process imported the project from, ``-dirty`` after it when
    the package's files were not that commit's, or ``unknown``."""
    return _GIT_SHA


def _cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform says of it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device) -> str:
    """The GPU's name; or the CPU's model, architecture, core count and the instruction set torch's kernels use
    there (``torch.backends.cpu.get_cpu_capability``: AVX512, AVX2, ...). A run at one thread is deterministic on
    one machine, but two CPUs' kernels sum in their own order: a rerun that differs from its first run (2026-12-06,
    findings/README.md) can then tell whether it ran on the same kind of machine."""
    import torch
    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.get_device_name(device)
    get_isa = getattr(torch.backends.cpu, "get_cpu_capability", None)
    isa = f", torch kernels {get_isa()}" if get_isa is not None else ""
    return f"cpu ({_cpu_model()}, {platform.machine()}, {os.cpu_count()} cores{isa})"


# the libraries besides torch whose versions change a number: image decoding and resampling (Pillow,
# scikit-image: `photos`), the digits file (scikit-learn's wheel), the arithmetic of the data path (numpy)
LIBRARIES = ("numpy", "pillow", "scikit-image", "scikit-learn", "torchvision")


def library_versions() -> str:
    """``numpy 2.4.6, pillow 13.0.0, ...`` of ``LIBRARIES`` as installed here (``?`` for one that is not)."""
    from importlib import metadata
    out = []
    for name in LIBRARIES:
        try:
            out.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name} ?")
    return ", ".join(out)


def run_info(device, package_version: str) -> dict:
    """What ran a measurement, as every result records it: the device (``device_name``), torch, the other
    libraries that shape the numbers (``library_versions``: nodes of a cluster set up on different days could
    differ there), the package and the commit (a trial's result, a re-attack's attack.json, calibrate's files)."""
    import torch
    return {"device": device_name(device), "torch_version": torch.__version__, "libraries": library_versions(),
            "package_version": package_version, "git_sha": git_sha()}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
