"""The searcher's plan of runs without Ray (cem_bench.search.queue): replicates queued per configuration and
the mean told to the sampler, the baseline first and the confirmation last, and the rejection of duplicate
proposals. A fake sampler stands in for Optuna; the Ray carrier is tested in tests/test_search.py."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from cem_bench.search.queue import FINISHED, MAX_DUPLICATE_ASKS, RunQueue, first_new, mean_result

METRICS, MODES = ["test_acc", "attack_ssim"], ["max", "min"]


class FakeSampler(RunQueue):
    """Proposes the given configs in order (then None) and records what it is told."""

    def __init__(self, proposals, **plan):
        self._metric, self._mode = list(METRICS), list(MODES)
        self._init_queue(**plan)
        self.proposals = list(proposals)
        self.asked: list[str] = []
        self.told: list[tuple[str, dict | None, bool]] = []

    def _propose(self, trial_id):
        self.asked.append(trial_id)
        return dict(self.proposals.pop(0)) if self.proposals else None

    def _tell(self, trial_id, result=None, error=False):
        self.told.append((trial_id, result, error))


def ok(acc, ssim=0.5):
    return {"test_acc": acc, "attack_ssim": ssim, "status": "ok"}


def test_the_module_imports_neither_ray_nor_optuna():
    code = ("import sys, cem_bench.search.queue; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'optuna')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------------------------------ replicates
def test_each_configuration_runs_once_per_seed_before_the_sampler_is_asked_again():
    q = FakeSampler([{"cem.lambd": 8.0}, {"cem.lambd": 16.0}], seeds=(5, 6, 7))
    handed = [q.next_run(f"t{i}") for i in range(4)]
    assert handed == [{"cem.lambd": 8.0, "seed": 5}, {"cem.lambd": 8.0, "seed": 6}, {"cem.lambd": 8.0, "seed": 7},
                      {"cem.lambd": 16.0, "seed": 5}]
    assert q.asked == ["t0", "t3"]          # the replicates are served from the queue, not asked for


def test_the_sampler_is_told_the_mean_once_every_replicate_finished():
    q = FakeSampler([{"cem.lambd": 8.0}], seeds=(0, 1, 2))
    for i in range(3):
        q.next_run(f"t{i}")
    q.run_finished("t1", ok(0.6, 0.2))      # replicates finish in any order
    q.run_finished("t0", ok(0.5, 0.4))
    assert q.told == []
    q.run_finished("t2", ok(0.7, 0.3))
    [(tid, result, error)] = q.told
    assert tid == "t0" and not error        # the leader holds the sampler's trial
    assert result["test_acc"] == pytest.approx(0.6) and result["attack_ssim"] == pytest.approx(0.3)


def test_failed_replicates_are_left_out_of_the_mean_and_all_failed_is_a_failure():
    q = FakeSampler([{"cem.lambd": 8.0}, {"cem.lambd": 16.0}], seeds=(0, 1))
    for i in range(4):
        q.next_run(f"t{i}")
    q.run_finished("t0", ok(0.4))
    q.run_finished("t1", None, error=True)
    q.run_finished("t2", {"status": "error"})
    q.run_finished("t3", None, error=True)
    assert [(t, e) for t, _, e in q.told] == [("t0", False), ("t2", True)]
    assert q.told[0][1]["test_acc"] == pytest.approx(0.4) and q.told[1][1] is None


def test_a_non_finite_replicate_is_left_out_of_that_metric_alone():
    """configs.parquet's rule: each metric over the runs with a value of it (a run whose attack the utility gate
    skipped still has its accuracy). Until 2026-12-06 one missing value made the metric NaN (Optuna told FAIL)."""
    mean = mean_result([ok(0.4, 0.2), ok(0.6, float("nan")), None], METRICS)
    assert mean["test_acc"] == pytest.approx(0.5) and mean["attack_ssim"] == pytest.approx(0.2)
    assert math.isnan(mean_result([ok(0.4, float("nan"))], METRICS)["attack_ssim"])   # none: NaN, told FAIL
    assert mean_result([None, None], METRICS) is None


def test_the_confirmation_chooses_on_the_means_the_tables_record():
    """λ 16's third seed collapsed (accuracy 0.12, its attack skipped): its accuracy mean is 0.673, and λ 4
    (0.80, 0.62) adds more hypervolume. Dropping the whole run ranked λ 16 at 0.95 and confirmed it."""
    q = FakeSampler([{"cem.lambd": 16.0}, {"cem.lambd": 4.0}], seeds=(0, 1, 2), search_runs=6, confirm_top=1,
                    confirm_seeds=(7,), refs=[0.1, 1.0])
    runs = [q.next_run(f"s{i}") for i in range(6)]
    assert [r["cem.lambd"] for r in runs] == [16.0] * 3 + [4.0] * 3
    for i, r in enumerate([ok(0.95, 0.60), ok(0.95, 0.60), ok(0.12, float("nan")), *[ok(0.80, 0.62)] * 3]):
        q.run_finished(f"s{i}", r)
    told = {t: v for t, v, _ in q.told}
    assert told["s0"]["test_acc"] == pytest.approx((0.95 + 0.95 + 0.12) / 3) and told["s0"]["attack_ssim"] == 0.60
    assert q.next_run("c0") == {"cem.lambd": 4.0, "seed": 7, "role": "confirm"}


def test_one_seed_or_none_tells_each_run_directly():
    q = FakeSampler([{"cem.lambd": 8.0}], seeds=(3,))
    assert q.next_run("t0") == {"cem.lambd": 8.0, "seed": 3}
    q.run_finished("t0", ok(0.5))
    assert q.told == [("t0", ok(0.5), False)]
    q = FakeSampler([{"cem.lambd": 8.0, "seed": 9}])
    assert q.next_run("t0") == {"cem.lambd": 8.0, "seed": 9}   # no replicate seeds: the config as proposed
    q.run_finished("t0", None, error=True)
    assert q.told == [("t0", None, True)]


# ------------------------------------------------------------------------- baseline and confirmation
def test_baseline_first_then_the_search_then_the_best_confirmed_then_finished(capsys):
    base = [{"cem.lambd": 0.0, "seed": s} for s in (0, 1)]
    proposals = [{"cem.lambd": 8.0}, {"cem.lambd": 16.0}, {"cem.lambd": 0.0}]
    q = FakeSampler(proposals, seeds=(0,), baseline=base, search_runs=3, confirm_top=1, confirm_seeds=(7, 8),
                    refs=[0.0, 1.0])
    assert [q.next_run(t) for t in ("b0", "b1")] == base
    q.run_finished("b0", ok(0.9, 0.9))
    q.run_finished("b1", ok(0.9, 0.9))
    assert q.told == [] and q.asked == []   # the baseline's runs are not the sampler's
    handed = [q.next_run(f"s{i}") for i in range(3)]
    assert [c["cem.lambd"] for c in handed] == [8.0, 16.0, 0.0]
    q.run_finished("s0", ok(0.8, 0.5))
    q.run_finished("s2", ok(0.9, 0.9))
    assert q.next_run("w") is None          # the confirmation waits for the search's last run
    q.run_finished("s1", ok(0.7, 0.2))      # lambda 16 adds the most hypervolume; lambda 0 is never confirmed
    confirm = [q.next_run(t) for t in ("c0", "c1")]
    assert confirm == [{"cem.lambd": 16.0, "seed": 7, "role": "confirm"},
                       {"cem.lambd": 16.0, "seed": 8, "role": "confirm"}]
    # the plan is said (an info log line was never shown): what was chosen, and why fewer than asked
    assert ("cem-bench: confirming 1 configuration(s) with seeds [7, 8] (the best by Pareto rank of their means, "
            "then exclusive hypervolume): cem.lambd=16.0") in capsys.readouterr().err
    q.run_finished("c0", ok(0.1))
    assert q.next_run("end") == FINISHED == RunQueue.FINISHED
    assert [t for t, _, _ in q.told] == ["s0", "s2", "s1"]


def test_without_reference_points_the_fronts_private_end_keeps_its_share():
    """No objective names a ``ref``: the stand-in is the worst mean moved out by a tenth of the range (the
    scheduler's rule), so λ 16, the front's private end (0.60, 0.20), adds 0.0177 and is confirmed before λ 8
    (0.89, 0.79), a step from the undefended end (0.0029). Just past the worst mean (until 2026-12-06) both ends
    of the front added ~0 and λ 8 was the one confirmed."""
    q = FakeSampler([{"cem.lambd": 4.0}, {"cem.lambd": 8.0}, {"cem.lambd": 16.0}], seeds=(0,), search_runs=3,
                    confirm_top=1, confirm_seeds=(5,))
    for i in range(3):
        q.next_run(f"s{i}")
    for i, r in enumerate([ok(0.90, 0.80), ok(0.89, 0.79), ok(0.60, 0.20)]):
        q.run_finished(f"s{i}", r)
    assert q.next_run("c0")["cem.lambd"] == 16.0


def test_a_confirmation_short_of_its_top_says_why(capsys):
    q = FakeSampler([{"cem.lambd": 8.0}, {"cem.lambd": 16.0}, {"cem.lambd": 32.0}], seeds=(0,), search_runs=3,
                    confirm_top=3, confirm_seeds=(5,), refs=[0.0, 1.0])
    for i in range(3):
        q.next_run(f"s{i}")
    q.run_finished("s0", ok(0.8, 0.5))
    q.run_finished("s1", ok(0.7, 0.2))
    q.run_finished("s2", None, error=True)
    assert q.next_run("c0")["role"] == "confirm"
    err = capsys.readouterr().err
    assert "confirming 2 configuration(s)" in err and "confirm.top is 3: only 2 of the search's 3 runs'" in err, err


def test_no_finished_search_run_confirms_nothing_and_says_so(capsys):
    q = FakeSampler([{"cem.lambd": 8.0}], seeds=(0,), search_runs=1, confirm_top=2, confirm_seeds=(5,))
    q.next_run("s0")
    q.run_finished("s0", None, error=True)
    assert q.next_run("x") == FINISHED
    assert "nothing to confirm: of the search's 1 runs, none with λ ≠ 0 finished" in capsys.readouterr().err
    assert q.next_run("y") == FINISHED and capsys.readouterr().err == ""     # said once


# ------------------------------------------------------------------------------------------ duplicates
class Proposals:
    """A sampler whose asks return the given keys in order; ``reject`` records the rejected ones."""

    def __init__(self, keys):
        self.keys, self.last, self.rejected = list(keys), None, []

    def ask(self):
        if not self.keys:
            return None
        self.last = self.keys.pop(0)
        return {"key": self.last}

    def key(self):
        return self.last

    def reject(self):
        self.rejected.append(self.last)


def test_a_duplicate_is_rejected_and_replaced_by_the_first_new_proposal():
    p = Proposals(["a", "b", "a", "c", "d"])
    config, skipped = first_new(p.ask, p.key, {"a", "b"}, p.reject)
    assert config == {"key": "c"} and skipped == 3 and p.rejected == ["a", "b", "a"]
    p = Proposals(["x"])
    assert first_new(p.ask, p.key, {"a"}, p.reject) == ({"key": "x"}, 0) and p.rejected == []


def test_with_nothing_new_left_the_copy_is_accepted_after_max_asks():
    p = Proposals(["a"] * (MAX_DUPLICATE_ASKS + 5))
    config, skipped = first_new(p.ask, p.key, {"a"}, p.reject)
    assert config == {"key": "a"} and skipped == MAX_DUPLICATE_ASKS
    assert len(p.keys) == 5 - 1             # MAX_DUPLICATE_ASKS rejections, one more ask, no hang
    p = Proposals(["a", "a", "a"])
    assert first_new(p.ask, p.key, {"a"}, p.reject, max_asks=1) == ({"key": "a"}, 1)


def test_an_exhausted_sampler_proposes_nothing():
    p = Proposals([])
    assert first_new(p.ask, p.key, {"a"}, p.reject) == (None, 0)
    p = Proposals(["a"])                    # a duplicate, then nothing
    assert first_new(p.ask, p.key, {"a"}, p.reject) == (None, 1)


def test_a_stopped_trial_is_told_as_stopped_and_never_confirmed():
    """A trial a scheduler stopped ends with an epoch's result (status "running"): the carrier tells the
    sampler PRUNED for it (queue.stopped), and the confirmation never picks it, however good its partial
    values look."""
    from cem_bench.search.queue import stopped
    assert stopped({"status": "running", "test_acc": 0.9}, False)
    assert not stopped({"status": "ok"}, False) and not stopped({"status": "running"}, True) and not stopped(None, False)
    q = FakeSampler([{"x": 1}, {"x": 2}], seeds=(0,), search_runs=2, confirm_top=1, confirm_seeds=(5,))
    a, b = q.next_run("a"), q.next_run("b")
    assert a["x"] == 1 and b["x"] == 2
    q.run_finished("a", {"status": "running", "test_acc": 0.99, "attack_ssim": 0.01}, False)   # stopped early
    q.run_finished("b", ok(0.5, 0.5), False)
    assert [t[0] for t in q.told] == ["a", "b"] and q.told[0][1]["status"] == "running"
    assert q.next_run("c") == {"x": 2, "seed": 5, "role": "confirm"}


def test_a_trial_clears_the_staging_folders_of_ended_workers_only(tmp_path):
    """A worker killed with its trial leaves its staging folders (nothing runs its clean-up); the next trial
    anywhere removes those of processes that have ended and keeps those of running ones (this one's)."""
    from cem_bench.search.trainable import clear_dead_staging, staging_dirs
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    for d in (*staging_dirs(dead_pid, str(tmp_path)), *staging_dirs(os.getpid(), str(tmp_path))):
        os.makedirs(d)
        (tmp_path / d / "state.pt").write_bytes(b"x")
    (tmp_path / f"cem-bench-trial-{dead_pid}-x1y2").mkdir()   # private_dir's fallback name: cleared too
    (tmp_path / "cem-bench-trial-notapid").mkdir()
    (tmp_path / "unrelated-123").mkdir()
    removed = clear_dead_staging(str(tmp_path))
    assert sorted(removed) == sorted([*(os.path.basename(d) for d in staging_dirs(dead_pid, str(tmp_path))),
                                      f"cem-bench-trial-{dead_pid}-x1y2"])
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*(os.path.basename(d) for d in staging_dirs(os.getpid(), str(tmp_path))),
                           "cem-bench-trial-notapid", "unrelated-123"])


def test_staging_folders_are_private_and_a_planted_name_is_stepped_around(tmp_path):
    """The staging folders sit in the shared temp folder under predictable names (the pid): each is made mode
    0o700 by this process, and where another user's link or file holds the name (one this user cannot remove), a
    new private folder beside it is used, never the planted one (the review of 2026-12-06)."""
    import stat

    from cem_bench.search.trainable import private_dir
    mine = private_dir(str(tmp_path / "cem-bench-trial-42"))
    assert mine == str(tmp_path / "cem-bench-trial-42")
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700 and not os.listdir(mine)
    (tmp_path / "cem-bench-trial-42" / "recon.png").write_bytes(b"old")
    assert private_dir(mine) == mine and not os.listdir(mine)          # emptied for the next trial
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "cem-bench-ckpt-42").symlink_to(outside)             # planted; rmtree does not remove a link
    got = private_dir(str(tmp_path / "cem-bench-ckpt-42"))
    assert got != str(tmp_path / "cem-bench-ckpt-42") and os.path.basename(got).startswith("cem-bench-ckpt-42-")
    assert not os.path.islink(got) and stat.S_IMODE(os.stat(got).st_mode) == 0o700 and outside.is_dir()
