"""cem-bench replay: a recorded search through the scheduler's rule in simulated time (cem_bench.search.replay)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from cem_bench.search.replay import correlations, replay, simulate, trial_records
from cem_bench.search.rungs import RungRanker

OBJECTIVES = [{"metric": "test_acc", "mode": "max", "ref": 0.1}, {"metric": "attack_ssim", "mode": "min", "ref": 1.0}]


def recorded(n: int = 12, epochs: int = 8, seed: int = 0):
    """``n`` trials that ran ``epochs`` epochs: trial i's accuracy and probe move towards its final values, so
    that every epoch ranks the trials as the end does; trial 0 dominates every other at every epoch."""
    rng = np.random.default_rng(seed)
    acc = np.sort(rng.uniform(0.5, 0.9, n))[::-1]
    ssim = np.sort(rng.uniform(0.3, 0.8, n))
    acc[0], ssim[0] = 0.95, 0.2
    trials = pd.DataFrame({"trial_id": [f"t{i}" for i in range(n)], "status": "ok", "role": "search",
                           "test_acc": acc, "attack_ssim": ssim})
    rows = [{"trial_id": f"t{i}", "epoch": e, "test_acc": acc[i] * e / epochs, "probe_ssim": ssim[i] + 0.1 / e}
            for i in range(n) for e in range(1, epochs + 1)]
    return trials, pd.DataFrame(rows)


def test_no_rung_runs_every_epoch_and_keeps_the_whole_front():
    trials, epochs = recorded()
    r = replay(trials, epochs, OBJECTIVES, grace_epochs=8, reduction_factor=2, orders=5)
    assert r.rungs == () and r.epochs_share == 1.0 and r.hv_share == pytest.approx(1.0) and r.stopped == 0


def test_a_schedule_saves_epochs_and_never_stops_the_trial_that_dominates_all():
    trials, epochs = recorded()
    ids, by_trial, finals, length = trial_records(trials, epochs, OBJECTIVES)
    assert length == 8 and len(ids) == 12
    rng = np.random.default_rng(1)
    for _ in range(30):
        ranker = RungRanker(length, 2, 2, [("test_acc", "max", 0.1), ("probe_ssim", "min", 1.0)])
        ran = simulate(ids, by_trial, length, ranker, list(rng.permutation(len(ids))), workers=3)
        assert ran["t0"] == length and sum(ran.values()) < length * len(ids)
    r = replay(trials, epochs, OBJECTIVES, grace_epochs=2, reduction_factor=2, orders=20, workers=3)
    assert r.rungs == (2, 4) and 0 < r.epochs_share < 1 and r.front_stopped == 0 and r.hv_share == pytest.approx(1)


def test_a_front_with_no_hypervolume_has_no_share_and_no_warning():
    """Every trial at chance accuracy (the refs' 0.1): the front dominates nothing, so the kept share is NaN,
    without numpy's "Mean of empty slice" (it printed above `replay`'s table)."""
    import warnings
    trials, epochs = recorded()
    trials["test_acc"] = 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = replay(trials, epochs, OBJECTIVES, grace_epochs=2, reduction_factor=2, orders=5)
    assert math.isnan(r.hv_share) and math.isnan(r.hv_share_std) and 0 < r.epochs_share < 1

def test_correlations_are_spearmans_and_need_three_trials():
    trials, epochs = recorded()
    c = correlations(trials, epochs, OBJECTIVES)
    assert list(c["epoch"]) == list(range(1, 9))
    assert np.allclose(c["probe_ssim vs final attack_ssim"], 1.0)
    assert np.allclose(c["test_acc vs final test_acc"], 1.0)
    few = correlations(trials.head(2), epochs, OBJECTIVES)
    assert few.drop(columns=["epoch", "trials"]).map(math.isnan).all().all()


def test_trials_that_did_not_finish_are_left_out():
    trials, epochs = recorded()
    trials.loc[3, "status"] = "stopped"
    trials.loc[4, "role"] = "baseline"
    ids, *_ = trial_records(trials, epochs, OBJECTIVES)
    assert "t3" not in ids and "t4" not in ids and len(ids) == 10


# ---------------------------------------------------------------- the command fails in one paragraph (issue 39)
def _main(monkeypatch, trials, epochs, argv, capsys):
    from cem_bench import cli
    from cem_bench.search import replay as mod
    monkeypatch.setattr(mod, "load", lambda d: (trials, epochs, OBJECTIVES))
    rc = cli.main(["replay", "R", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_a_search_without_probe_records_has_nothing_to_replay(monkeypatch, capsys):
    trials, epochs = recorded()
    rc, out, err = _main(monkeypatch, trials, epochs.drop(columns="probe_ssim"), [], capsys)
    assert rc == 2 and "nothing to replay" in err and "probe_ssim" in err and "attack.probe_epochs" in err
    assert out == ""   # no hypervolume shares printed for a replay that cannot judge anything


def test_the_default_grace_on_a_short_search_skips_what_does_not_fit(monkeypatch, capsys):
    trials, epochs = recorded(epochs=2)
    rc, out, err = _main(monkeypatch, trials, epochs, ["--orders", "2"], capsys)
    assert rc == 0, err
    assert "--grace 2 skipped" in out and "--grace 3 skipped" in out
    rc, out, err = _main(monkeypatch, trials, epochs, ["--grace", "2", "3"], capsys)
    assert rc == 2 and "give --grace below 2" in err
    assert "skipped" not in out   # the error alone says it (a note per --grace on stdout said it again, 2026-12-07)


def test_a_search_its_scheduler_stopped_is_refused_and_rungs_without_probe_are_skipped(monkeypatch, capsys):
    """A MOASHA search's survivors were replayed as if they were the whole search (a sample its scheduler chose),
    and a setting whose rungs had no probe ranked there on accuracy alone (NaN as the worst): both silently."""
    trials, epochs = recorded()
    stopped = trials.copy()
    stopped.loc[[5, 6], "status"] = "stopped"
    rc, out, err = _main(monkeypatch, stopped, epochs, ["--orders", "2"], capsys)
    assert rc == 2 and "2 of its 12 search trials were stopped early" in err and out == ""
    sparse = epochs.copy()
    sparse.loc[~sparse["epoch"].isin([2, 4, 6]), "probe_ssim"] = np.nan      # probed at 2, 4 and 6 only
    rc, out, err = _main(monkeypatch, trials, sparse, ["--orders", "2", "--grace", "1", "2", "--eta", "2"], capsys)
    assert rc == 0, err
    assert "--grace 1 --eta 2 skipped: no trial recorded probe_ssim at epoch 1 (a rung" in out, out
    table = out.split("Scheduler replayed")[1]
    assert "[2, 4]" in table and "[1, 2, 4]" not in table
    rc, out, err = _main(monkeypatch, trials, sparse, ["--orders", "2", "--grace", "1", "3", "--eta", "2"], capsys)
    assert rc == 2 and "every setting has a rung at an epoch no trial probed (probed: 2, 4, 6)" in err, err


@pytest.mark.parametrize("argv, says", [(["--workers", "0"], "--workers 0"), (["--eta", "1"], "--eta 1"),
                                        (["--grace", "0"], "--grace 0"), (["--orders", "0"], "--orders 0"),
                                        # 10^8 ran for days without a word (2026-12-07)
                                        (["--orders", "10001"], "--orders 10001: give how many random arrival "
                                                                "orders to replay, 1 to 10,000"),
                                        # a traceback from numpy, and rows printed twice (2026-12-07 audit)
                                        (["--seed", "-1"], "--seed -1: the arrival orders' seed is an integer"),
                                        (["--grace", "1", "1"], "--grace 1 given more than once"),
                                        (["--eta", "2", "3", "2"], "--eta 2 given more than once")])
def test_settings_no_replay_can_run_are_refused_first(monkeypatch, capsys, argv, says):
    trials, epochs = recorded()
    rc, out, err = _main(monkeypatch, trials, epochs, argv, capsys)
    assert rc == 2 and says in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("folder", ["missing", "empty", "garbage"])
def test_folders_that_hold_no_search_are_one_paragraph(tmp_path, capsys, folder):
    from cem_bench import cli
    d = tmp_path / folder
    if folder != "missing":
        d.mkdir()
    if folder == "garbage":
        (d / "trial_1").mkdir()
        (d / "trial_1" / "trial_result.json").write_text("{not json" + "[" * 5000)
    rc = cli.main(["replay", str(d)])
    err = capsys.readouterr().err
    assert rc == 2 and str(d) in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("edit, says", [
    (lambda t, e: (t.drop(columns="test_acc"), e), "has no test_acc column, an objective of the search"),
    (lambda t, e: (t, e.assign(epoch=e["epoch"].astype(str) + "x")), "its epoch column holds 1x"),
    (lambda t, e: (t, e.assign(epoch=e["epoch"].where(e["epoch"] != 3))), "its epoch column holds nan"),
    (lambda t, e: (t, e.assign(epoch=e["epoch"] - 2)), "its epoch column holds -1, 0, not whole epochs from 1"),
    # values no trial holds shifted the kept front's hypervolume without a word (2026-12-07 probe)
    (lambda t, e: (t.assign(test_acc=t["test_acc"].where(t.index != t.index[-1], float("inf"))), e),
     "trials.parquet: test_acc holds inf, outside the values it can take (0 to 1)"),
    (lambda t, e: (t.assign(attack_ssim=t["attack_ssim"].where(t.index != t.index[-1], -5.0)), e),
     "attack_ssim holds -5, outside the values it can take (-1 to 1)"),
    (lambda t, e: (t, e.assign(probe_ssim=e["probe_ssim"].where(e.index != e.index[-1], float("inf")))),
     "epochs.parquet: probe_ssim holds inf, outside the values it can take (-1 to 1)"),
])
def test_a_hand_edited_folder_is_named_not_a_traceback(tmp_path, capsys, edit, says):
    """2026-12-07 probe: a trials table without an objective, an epoch of text or NaN were tracebacks; negative
    epochs were "the trials ran -1 epochs". Each is one line naming the file, exit 2."""
    from cem_bench import cli
    trials, epochs = edit(*recorded())
    trials.to_parquet(tmp_path / "trials.parquet")
    epochs.to_parquet(tmp_path / "epochs.parquet")
    rc = cli.main(["replay", str(tmp_path), "--orders", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err


def test_a_table_without_roles_is_replayed_with_a_note(tmp_path, capsys):
    from cem_bench import cli
    trials, epochs = recorded()
    trials.drop(columns="role").to_parquet(tmp_path / "trials.parquet")
    epochs.to_parquet(tmp_path / "epochs.parquet")
    assert cli.main(["replay", str(tmp_path), "--orders", "2", "--grace", "1", "--eta", "2"]) == 0
    assert "has no role column: every trial is replayed as a search trial" in capsys.readouterr().out


def test_a_long_replay_says_each_setting_as_it_starts(monkeypatch, capsys):
    from cem_bench.search import replay as mod
    monkeypatch.setattr(mod, "PROGRESS_ORDERS", 2)   # the threshold's thousand orders, at a test's size
    trials, epochs = recorded()
    rc, out, err = _main(monkeypatch, trials, epochs, ["--orders", "2", "--grace", "1", "2", "--eta", "2"], capsys)
    assert rc == 0, err
    assert err.splitlines() == ["replaying --grace 1 --eta 2 over 2 orders (1 of 2)",
                                "replaying --grace 2 --eta 2 over 2 orders (2 of 2)"]
    rc, out, err = _main(monkeypatch, trials, epochs, ["--orders", "1", "--grace", "1", "--eta", "2"], capsys)
    assert rc == 0 and err == ""   # below the threshold: the table alone
