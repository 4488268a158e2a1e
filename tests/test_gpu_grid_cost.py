"""scripts/gpu_grid_cost.sh's check part where the check does not end by itself: a device call is made once, and
what it returns must say what happened (issue 40; docs/performance.md "The paper grid")."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import pytest


def run_script(tmp_path, total: int, summary_fails: bool = False, pack_hangs: bool = False,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """The script with `python3` standing in for both scripts: gpu_pack writes its arguments to pack_args.txt
    and ends at once (or, ``pack_hangs``, ignores SIGTERM for 90 s, as one held by a wedged MPS daemon),
    gpu_check's stages write equivalence.json and exit as `timeout` leaves them (124, no summary.md); the summary
    stage alone is the real one (or fails too, ``summary_fails``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f"""#!/bin/bash
case "$1" in
    scripts/gpu_pack.py)
        echo "$@" > "{tmp_path}/pack_args.txt"
        if [ -n "$FAKE_PACK_HANGS" ]; then
            trap '' TERM
            for _ in $(seq 90); do sleep 1; done    # bounded: where -k is missing it outlives the test
            echo done > "{tmp_path}/pack_outlived_its_kill.txt"   # never, where timeout -k kills it
        fi
        exit 0 ;;
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
    # the real summary stage alone gets 10 s on the device; on a CPU busy with other work Python's start alone took
    # longer (a clean-clone `make test` beside a search, 2026-12-07): what is tested is that it runs, not its speed
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": os.getcwd(), "GPU_GRID_SUMMARY_S": "120",
           "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
    if summary_fails:
        env["FAKE_SUMMARY_FAILS"] = "1"
    if pack_hangs:
        env["FAKE_PACK_HANGS"] = "1"
    return subprocess.run(["bash", "scripts/gpu_grid_cost.sh", str(total)], env=env, capture_output=True,
                          text=True, timeout=timeout)


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


def test_a_pack_that_ignores_sigterm_is_killed_within_the_call(tmp_path):
    """`timeout` without -k: a gpu_pack held on its way out (an MPS daemon that does not take 'quit', 60 s and 30
    more) ran past the device call's limit, and the call brought back nothing. Now it is killed 15 s after the
    SIGTERM that ends it at the hard deadline (TOTAL - 30 s), which gpu_pack is told, 20 s after its budget's
    end: the script still ends within its TOTAL, its files written."""
    total = 60   # the least the script takes is 51 (its pack's budget is TOTAL - 50)
    try:   # a guard only (without -k the fake pack holds the script 90 s): the records below are the test
        p = run_script(tmp_path, total, pack_hangs=True, timeout=total + 120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gpu_grid_cost.sh {total} was still running after {total + 120} s")
    assert p.returncode == 3, (p.stdout[-2000:], p.stderr[-2000:])
    assert not (tmp_path / "pack_outlived_its_kill.txt").exists(), "gpu_pack outlived timeout's SIGTERM"
    assert (tmp_path / "out" / "check_summary.md").exists()
    words = (tmp_path / "pack_args.txt").read_text().split()
    deadline, hard = (int(words[words.index(w) + 1]) for w in ("--deadline", "--hard-deadline"))
    assert hard - deadline == 20, words


@pytest.mark.parametrize("total", ["50", "1", "99999999999999999999"])
def test_a_total_the_pack_cannot_run_is_refused_before_the_last_results_are_removed(tmp_path, total):
    """TOTAL_SECONDS of 1 to 50 passed the argument check, the last call's pack and check files were removed, and
    gpu_pack then refused its budget of TOTAL - 50 <= 0 (2026-12-07 probe): refused first, nothing removed."""
    out = tmp_path / "out"
    (out / "pack").mkdir(parents=True)
    (out / "pack" / "pack.jsonl").write_text('{"row": 1}\n')
    r = subprocess.run(["bash", "scripts/gpu_grid_cost.sh", total], env={**os.environ, "OUT": str(out)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "TOTAL_SECONDS must be above 50" in r.stderr, r.stderr
    assert (out / "pack" / "pack.jsonl").read_text() == '{"row": 1}\n'
