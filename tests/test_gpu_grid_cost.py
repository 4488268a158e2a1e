"""scripts/gpu_grid_cost.sh's check part where the check does not end by itself: a device call is made once, and
what it returns must say what happened (issue 40; docs/performance.md "The paper grid")."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import pytest


def run_script(tmp_path, total: int, summary_fails: bool = False) -> subprocess.CompletedProcess:
    """The script with `python3` standing in for both scripts: gpu_pack ends at once, gpu_check's stages write
    equivalence.json and exit as `timeout` leaves them (124, no summary.md); the summary stage alone is the real
    one (or fails too, ``summary_fails``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f"""#!/bin/bash
case "$1" in
    scripts/gpu_pack.py) exit 0 ;;
    scripts/gpu_check.py)
        if [[ " $* " == *" equivalence "* ]]; then
            mkdir -p "$OUT"
            echo '{{"lambda=0": "skipped: cut off"}}' > "$OUT/equivalence.json"
            exit 124
        fi
        [ -n "$FAKE_SUMMARY_FAILS" ] && exit 1 ;;
esac
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": os.getcwd(),
           "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
    if summary_fails:
        env["FAKE_SUMMARY_FAILS"] = "1"
    return subprocess.run(["bash", "scripts/gpu_grid_cost.sh", str(total)], env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_check_cut_off_at_its_timeout_still_leaves_its_summary(tmp_path):
    """The equivalence stage starts configurations until its cap, and one started just before it may outlast the
    check's `timeout`: the check ended with no summary.md, and the call returned no check_summary.md at all. Now
    the summary stage runs alone on what the check wrote, says so, and the script exits 3."""
    p = run_script(tmp_path, 70)
    assert p.returncode == 3, p.stdout[-2000:] + p.stderr[-2000:]
    text = (tmp_path / "out" / "check_summary.md").read_text()
    assert text.startswith("# gpu_check summary") and "written by the summary stage alone" in text, text
    with tarfile.open(tmp_path / "out" / "check.tgz") as t:
        assert {"check/equivalence.json", "check/summary.md"} <= set(t.getnames())


@pytest.mark.parametrize("total, why", [(70, "cut off at its"), (60, "no time was left for it after the trials")])
def test_without_any_summary_check_summary_md_says_why(tmp_path, total, why):
    """Where even the summary stage alone fails, or there was no time for the check, check_summary.md says so
    (and lists the check's files) instead of being missing."""
    p = run_script(tmp_path, total, summary_fails=True)
    assert p.returncode == 3, p.stdout[-2000:] + p.stderr[-2000:]
    text = (tmp_path / "out" / "check_summary.md").read_text()
    assert text.startswith("# gpu_check: no summary") and why in text, text
