"""`cem-bench calibrate` measures where a trial matches (each surrogate's own warm-up), writes entries that configure
the surrogate they were measured for with the configuration they were measured on, and refuses what would waste or
destroy its work before the reference run trains."""

import json

import pytest
import yaml
from conftest import TINY

from cem_bench import calibrate
from cem_bench.cli import main
from cem_bench.config import load_yaml_config
from cem_bench.core.trial import build_config, run_trial

# a tiny measurement: 4 batches an epoch, a match of 4 batches; 6 epochs, so that gated_attention's own warm-up (5)
# leaves it a CEM epoch
FLAT = {"model.width": 0.0625, "data.train_size": 256, "train.batch_size": 64, "train.device": "cpu",
        "cem.strength_batches": 4, "train.epochs": 6}


def _sets(flat):
    return [a for k, v in flat.items() for a in ("--set", f"{k}={v}")]


def _never(*a, **k):
    raise AssertionError("the measurement started")


def test_calibrate_measures_each_surrogate_where_its_matched_trial_matches(tmp_path, capsys):
    """Without --warmup every surrogate is measured after its own cem.warmup_epochs (gated_attention 5,
    slot_cross 3), so the scale calibrate reports is the one a default matched trial measures at its first CEM
    epoch; at --warmup 2 (the default until now) neither matched its trial."""
    out_json = tmp_path / "cal.json"
    rc = main(["calibrate", *_sets(FLAT), "--surrogates", "gated_attention", "slot_cross", "--batches", "2",
               "--json", str(out_json)])
    assert rc == 0, capsys.readouterr().err
    banner = capsys.readouterr().out.splitlines()[0]
    assert "own warm-up" in banner and "gated_attention 5" in banner and "slot_cross 3" in banner, banner
    doc = json.loads(out_json.read_text())
    rows = {r["surrogate"]: r for r in doc["records"] if r["surrogate"] != "gmm"}
    assert {n: (r["warmup"], r["own_warmup"]) for n, r in rows.items()} == {"gated_attention": (5, 5),
                                                                            "slot_cross": (3, 3)}
    for name, row in rows.items():
        trial = run_trial({**TINY, **FLAT, "cem.surrogate": name, "cem.lambd": 16.0,
                           "attack.min_accuracy_margin": 1.0})      # the gate skips the attack: only the match
        assert trial["cem_strength_epoch"] == row["warmup"] + 1
        assert trial["cem_loss_scale"] == pytest.approx(row["matched_loss_scale"], rel=1e-5), name


def test_a_set_warmup_is_each_surrogate_s_own_and_an_explicit_one_says_where_it_differs(monkeypatch, capsys):
    """`--set cem.warmup_epochs=1` moves every trial's first CEM epoch, so calibrate measures there; an explicit
    --warmup keeps its meaning (every surrogate after it) and says which surrogates' trials match elsewhere."""
    rows = calibrate.measure({**FLAT, "cem.warmup_epochs": 1}, ["slot_cross"], batches=1)
    assert {(r.surrogate, r.warmup) for r in rows} == {("gmm", 1), ("slot_cross", 1)}
    monkeypatch.setattr(calibrate, "measure", _never)
    with pytest.raises(AssertionError, match="the measurement started"):
        main(["calibrate", *_sets(FLAT), "--warmup", "1", "--surrogates", "slot_cross", "gated_attention"])
    out = capsys.readouterr().out
    assert "after 1 epoch(s) (--warmup)" in out
    assert "does not include the own warm-up (cem.warmup_epochs) of slot_cross (3), gated_attention (5)" in out


def test_each_yaml_entry_configures_its_own_surrogate_and_the_files_say_what_was_measured(tmp_path, capsys):
    """An entry given as a --config set gmm at the other surrogate's scale (it named no surrogate); the files
    named neither the warm-ups, seeds nor keys measured."""
    out_json, out_yaml = tmp_path / "cal.json", tmp_path / "cal.yaml"
    rc = main(["calibrate", *_sets(FLAT), "--surrogates", "slot_cross", "--batches", "1", "--seeds", "0", "1",
               "--json", str(out_json), "--yaml", str(out_yaml)])
    assert rc == 0, capsys.readouterr().err
    text = out_yaml.read_text()
    entries = yaml.safe_load(text)
    entry = tmp_path / "slot_cross.yaml"
    entry.write_text(yaml.safe_dump(entries["slot_cross"]))
    cfg = build_config({**load_yaml_config(str(entry)), **FLAT})
    assert (cfg.cem.surrogate, cfg.cem.strength, cfg.cem.warmup_epochs) == ("slot_cross", "fixed", 3)
    measured = json.loads(out_json.read_text())["configuration"]
    assert cfg.cem.loss_scale == pytest.approx(
        next(r for r in json.loads(out_json.read_text())["records"] if r["surrogate"] == "slot_cross")
        ["matching_loss_scale"], rel=1e-3)
    assert entries["gmm"] == {"cem.surrogate": "gmm", "cem.strength": "fixed", "cem.loss_scale": 1,
                              "cem.warmup_epochs": 1}
    assert measured["seeds"] == [0, 1] and measured["warmups"] == {"gmm": [3], "slot_cross": [3]}
    assert measured["warmup_given"] is None and measured["batches"] == 1 and measured["strength_batches"] == 4
    assert measured["keys"]["model.width"] == "0.0625" and measured["config"]["model.width"] == 0.0625
    assert measured["git_sha"] and measured["package_version"]
    assert f"git {measured['git_sha']}" in text and "--set model.width=0.0625" in text and "# seeds 0 1;" in text


def test_a_whole_calibrate_file_as_config_is_named_with_how_to_use_one_entry(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(calibrate, "measure", _never)
    whole = tmp_path / "cal.yaml"
    whole.write_text("gmm: {cem.strength: fixed, cem.loss_scale: 1}\n"
                     "slot_cross: {cem.strength: fixed, cem.loss_scale: 4.892}\n")
    assert main(["calibrate", "--config", str(whole)]) == 2
    err = capsys.readouterr().err
    assert "is a cem-bench calibrate file (one entry per surrogate: gmm, slot_cross)" in err, err
    assert "--set cem.surrogate=slot_cross --set cem.strength=fixed --set cem.loss_scale=4.892" in err


def test_a_whole_calibrate_file_given_to_train_is_named_too(tmp_path, capsys):
    """`train --config cal.yaml` (the file calibrate wrote) listed each surrogate as an unknown config key."""
    whole = tmp_path / "cal.yaml"
    whole.write_text("gmm: {cem.surrogate: gmm, cem.strength: fixed, cem.loss_scale: 1}\n"
                     "slot_cross: {cem.surrogate: slot_cross, cem.strength: fixed, cem.loss_scale: 4.892}\n")
    assert main(["train", "--config", str(whole), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "is a cem-bench calibrate file (one entry per surrogate: gmm, slot_cross)" in err, err
    assert "--set cem.surrogate=slot_cross" in err and "unknown config key" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, says", [
    (["--json", "{d}/x", "--yaml", "{d}/x"], "--json and --yaml name one file, {d}/x"),
    (["--json", "{d}/x", "--yaml", "{d}/./x"], "--json and --yaml name one file"),
    (["--config", "{d}/c.yaml", "--json", "{d}/c.yaml"], "--config and --json name one file"),
    (["--config", "{d}/c.yaml", "--yaml", "{d}/c.yaml"], "writing --yaml would replace the configuration"),
    (["--batches", "100000"], "100000 held-out batches; give 1 to 256"),
    (["--seeds", "0", "-1"], "--seeds -1: "),
    (["--surrogates", "slot_cross", "slot_cross"], "--surrogates: slot_cross given more than once"),
    (["--warmup", "2", "2"], "--warmup: 2 given more than once"),   # measured once, without a word (2026-12-07)
    # keys calibrate sets itself, or never reads, were taken and written into --json's keys (2026-12-07 probe)
    (["--set", "cem.lambd=7"], "calibrate does not take cem.lambd: calibrate measures the strength per unit λ"),
    (["--set", "cem.surrogate=gmm"], "give the surrogates to measure with --surrogates"),
    (["--set", "attack.epochs=3"], "calibrate does not take attack.epochs: calibrate runs no attack"),
    (["--surrogates", ""], "unknown surrogate(s) ''"),
    # --seeds replaced the --set seed without a word, and --json's keys left it out (2026-12-07 probe)
    (["--set", "seed=3", "--seeds", "1", "2"], "--set seed=3 beside --seeds 1 2: --seeds gives every seed measured"),
    (["--json", "-"], "--json -: a file is written, not stdout"),   # it wrote a file named "-"
    # gmm is measured at gated_attention's 5: the refusal names the surrogate whose warm-up it is
    (["--set", "train.epochs=4", "--surrogates", "gated_attention"],
     "gated_attention's own warm-up, cem.warmup_epochs 5"),
])
def test_what_would_waste_or_destroy_the_work_is_refused_before_it(argv, says, tmp_path, monkeypatch, capsys):
    """One path for two outputs (the YAML replaced the table, or the table the --config it measured), a
    --batches that would build 100,000 batches in memory, and a bad seed after the good ones had trained."""
    monkeypatch.setattr(calibrate, "build", _never)      # the reference run's data and trainer: nothing trains
    (tmp_path / "c.yaml").write_text("model.width: 0.0625\n")
    # a --set of the case overrides FLAT's key (a key set twice is refused: parse_set)
    own = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")
    rest = [a for i, a in enumerate(argv) if a != "--set" and (i == 0 or argv[i - 1] != "--set")]
    # slot_cross unless the case names its own (an option given twice is refused: cli.ArgParser)
    default = [] if "--surrogates" in rest else ["--surrogates", "slot_cross"]
    rc = main(["calibrate", *_sets({**FLAT, **own}), *default, *[a.format(d=tmp_path) for a in rest]])
    err = capsys.readouterr().err
    assert rc == 2 and says.format(d=tmp_path) in err, err
    assert (tmp_path / "c.yaml").read_text() == "model.width: 0.0625\n" and not (tmp_path / "x").exists()


def test_gmm_s_own_keys_are_said_not_to_reach_the_reference(monkeypatch, capsys):
    """`--set cem.num_clusters=2` left the gmm row at gmm's defaults (the reference a matched trial uses) without
    a word."""
    monkeypatch.setattr(calibrate, "measure", _never)
    with pytest.raises(AssertionError, match="the measurement started"):
        main(["calibrate", *_sets(FLAT), "--surrogates", "slot_cross", "--set", "cem.num_clusters=2",
              "--set", "cem.num_slots=4"])
    out = capsys.readouterr().out
    assert "cem.num_clusters=2 is not applied to the gmm row" in out and "no surrogate measured takes it" in out
    assert "cem.num_slots=4 is not applied to the gmm row" in out and "applied to slot_cross" in out


def test_the_gmm_row_is_the_fixed_reference_even_where_a_gmm_variant_is_matched():
    """`cem.strength=matched` with gmm keys of its own (one cluster) makes a gmm trial match the reference; calibrate's
    gmm row is that reference, so its strength mode stays fixed (it said matched, of a row it never matched)."""
    plan, = calibrate.plan({**FLAT, "cem.strength": "matched", "cem.num_clusters": 1}, ["slot_cross"], None, 4)
    assert plan.modes == {"gmm": "fixed", "slot_cross": "matched"}
    assert build_config({**FLAT, "cem.strength": "matched", "cem.num_clusters": 1}).cem.strength == "matched"
