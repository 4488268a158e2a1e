"""scripts/compare_runs.py: whether a rerun repeats a shipped run, trial by trial and hypothesis by hypothesis."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from cem_bench import integrity

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "findings" / "decoder_tradeoff_digits"   # 16 trials, one hypothesis (G1): small and fast to read


def _script():
    spec = importlib.util.spec_from_file_location("compare_runs", ROOT / "scripts" / "compare_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rerun(tmp_path, change=None) -> Path:
    """A copy of the shipped run, its trials table changed by ``change`` and re-recorded as a search writes it."""
    b = tmp_path / "rerun"
    shutil.copytree(RUN, b)
    if change is not None:
        t = integrity.read_table(str(b), "trials.parquet", "trials")
        change(t)
        integrity.write_table(str(b), "trials.parquet", t, "trials")
    return b


@pytest.mark.skipif(not RUN.is_dir(), reason="findings/decoder_tradeoff_digits not shipped")
def test_an_identical_rerun_passes_and_a_changed_trial_or_verdict_is_named(tmp_path, capsys):
    cmp = _script()
    assert cmp.main([str(RUN), str(_rerun(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "| attack_ssim | 16 | 16 | 0 |" in out and "| G1 | holds, -0.007149, 0.012 | holds, -0.007149, 0.012 |" in out
    assert "every paired trial is identical" in out

    def one_trial(t):   # a trial summed in another order: one metric of one trial moves a little
        t.loc[t.index[3], "attack_ssim"] += 0.001
    shutil.rmtree(tmp_path / "rerun")
    assert cmp.main([str(RUN), str(_rerun(tmp_path, one_trial))]) == 1
    out = capsys.readouterr().out
    assert "| attack_ssim | 16 | 15 | 0 | 0.001 | +6.25e-05 |" in out and "| test_acc | 16 | 16 | 0 |" in out
    assert "the runs differ" in out

    def verdict(t):   # attention_centroid's SSIM 0.02 higher everywhere: G1 (it is lower than gmm's) not shown
        t.loc[t["config.cem.surrogate"] == "attention_centroid", "attack_ssim"] += 0.02
    shutil.rmtree(tmp_path / "rerun")
    assert cmp.main([str(RUN), str(_rerun(tmp_path, verdict))]) == 1
    out = capsys.readouterr().out
    assert "| G1 | holds, -0.007149, 0.012 | not shown, 0.01285," in out, out

    def lost(t):   # a trial that errored in the rerun is missing from the pairs
        t.loc[t.index[0], "status"] = "error"
    shutil.rmtree(tmp_path / "rerun")
    assert cmp.main([str(RUN), str(_rerun(tmp_path, lost))]) == 1
    assert "trials that ended ok in one run only (paired by configuration and seed): 1 in a, 0 in b" in \
        capsys.readouterr().out


@pytest.mark.skipif(not RUN.is_dir(), reason="findings/decoder_tradeoff_digits not shipped")
def test_pairs_survive_a_new_key_a_repeated_trial_and_name_what_one_run_lacks(tmp_path, capsys):
    """The review of 2026-12-06: a config key only one run has (a later commit's) gave every trial another id and
    no pair; two trials of one configuration and seed crashed the script (exit 1, read as "differs"); a metric
    only one run has, or one neither has, passed as "identical"."""
    cmp = _script()

    def new_key(t):   # a later code version's key, and a search that ran one trial twice
        t["config.cem.new_key"] = 7
        extra = t.iloc[[0]].assign(trial_id="again", started_at="2026-12-07T00:00:00+00:00")
        t.loc[len(t)] = extra.iloc[0]
    b = _rerun(tmp_path, new_key)
    assert cmp.main([str(RUN), str(b)]) == 1
    out = capsys.readouterr().out
    assert "config key config.cem.new_key only in b (7)" in out
    assert "| attack_ssim | 16 | 16 | 0 |" in out                       # every trial of a still paired
    assert "1 in a, 0 in b" not in out and "0 in a, 1 in b" in out       # the repeat is the one left over

    def no_rmle(t):
        del t["attack_ssim__rmle"]
    shutil.rmtree(b)
    assert cmp.main([str(RUN), str(_rerun(tmp_path, no_rmle))]) == 1
    assert "metrics only one run has: attack_ssim__rmle (a only)" in capsys.readouterr().out
    assert cmp.main([str(RUN), str(_rerun(tmp_path / "c")), "--metrics", "attack_sim"]) == 2   # a typo: not "identical"
    assert "neither run has the metric(s) attack_sim" in capsys.readouterr().err


@pytest.mark.skipif(not RUN.is_dir(), reason="findings/decoder_tradeoff_digits not shipped")
def test_a_value_on_one_side_only_and_hypotheses_of_one_space_are_differences(tmp_path, capsys):
    """A metric one run lacks came back from the loader as an all-NaN column and printed "largest difference 0";
    one NaN against a value likewise; hypotheses only one space states were dropped, and the runs "identical"."""
    import json

    import numpy as np
    cmp = _script()

    def no_psnr(t):
        t["attack_psnr"] = np.nan
    assert cmp.main([str(RUN), str(_rerun(tmp_path, no_psnr)), "--metrics", "attack_psnr"]) == 1
    out = capsys.readouterr().out
    assert "metrics only one run has: attack_psnr (a only)" in out and "| attack_psnr | 16 | 0 | 16 |" in out, out

    def one_nan(t):
        t.loc[t.index[2], "attack_psnr"] = np.nan
    shutil.rmtree(tmp_path / "rerun")
    assert cmp.main([str(RUN), str(_rerun(tmp_path, one_nan)), "--metrics", "attack_psnr"]) == 1
    assert "| attack_psnr | 16 | 15 | 1 |" in capsys.readouterr().out
    shutil.rmtree(tmp_path / "rerun")
    b = _rerun(tmp_path)
    space = json.loads((b / "search_space.json").read_text())
    space.pop("hypotheses")
    integrity.write_recorded_json(str(b), "search_space.json", space)
    assert cmp.main([str(RUN), str(b)]) == 1
    out = capsys.readouterr().out
    assert "the spaces state different hypotheses (a's only)" in out
    assert "| G1 | holds, -0.007149, 0.012 | holds, -0.007149, 0.012 |" in out   # b tested on a's


def test_a_folder_that_is_not_a_run_is_exit_2_and_nothing_is_written(tmp_path, capsys):
    assert _script().main([str(tmp_path / "nothing"), str(tmp_path)]) == 2
    assert "compare_runs:" in capsys.readouterr().err
    if RUN.is_dir():   # a folder without its trials table is refused, not given tables built and written into it
        b = _rerun(tmp_path)
        (b / "trials.parquet").unlink()
        before = sorted(p.name for p in b.iterdir())
        assert _script().main([str(RUN), str(b)]) == 2
        assert "no trials.parquet" in capsys.readouterr().err and sorted(p.name for p in b.iterdir()) == before


def test_metrics_before_the_folders_is_a_usage_error_that_says_why(capsys):
    with pytest.raises(SystemExit) as e:
        _script().main(["--metrics", "test_acc", str(RUN), str(RUN)])
    assert e.value.code == 2
    assert "--metrics takes every word after it" in capsys.readouterr().err


@pytest.mark.skipif(not RUN.is_dir(), reason="findings/decoder_tradeoff_digits not shipped")
@pytest.mark.parametrize("change, args, says", [
    (lambda t: t.drop(columns=["config.seed"], inplace=True), [], "has no config.seed column"),
    (None, ["--metrics", "trial_dir"], "trial_dir: not a metric with a number in either run"),
    (None, ["--metrics", "error"], "error: not a metric with a number in either run"),
])
def test_what_cannot_be_compared_exits_2_never_1(tmp_path, capsys, change, args, says):
    """2026-12-07 probe: a rerun's table without config.seed, or a text metric, ended in a traceback and exit 1,
    which reads as "the runs differ"; an all-empty column compared "identical". Each is now exit 2, one line."""
    cmp = _script()
    assert cmp.main([str(RUN), str(_rerun(tmp_path, change)), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif(not RUN.is_dir(), reason="findings/decoder_tradeoff_digits not shipped")
def test_a_table_given_for_a_folder_is_named_a_file(capsys):
    assert _script().main([str(RUN / "trials.parquet"), str(RUN)]) == 2
    assert "trials.parquet is a file, not a folder" in capsys.readouterr().err


@pytest.mark.skipif(not RUN.is_dir(), reason="findings/decoder_tradeoff_digits not shipped")
@pytest.mark.parametrize("argv, says", [
    (["{a}", "{a}"], "a and b are one folder"),                       # said "identical" (2026-12-07 probe)
    (["{a}", "{a}/."], "a and b are one folder"),
    (["{a}", "{a}", "--metrics", "test_acc", "test_acc"], "a and b are one folder"),
    (["{a}", "{b}", "--metrics", "test_acc", "attack_ssim", "test_acc"], "--metrics: test_acc given more than once"),
])
def test_a_folder_against_itself_or_a_metric_twice_is_refused(tmp_path, capsys, argv, says):
    b = _rerun(tmp_path)
    assert _script().main([x.format(a=RUN, b=b) for x in argv]) == 2
    assert says in capsys.readouterr().err
