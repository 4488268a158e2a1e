import pytest

from cem_bench.cli import main
from cem_bench.config import ConfigError, TrialConfig, key_specs, load_yaml_config


def test_defaults_follow_the_paper():
    c = TrialConfig()
    assert (c.cem.lambd, c.cem.var_threshold, c.defense.noise_std, c.train.lr, c.train.epochs) == (16, 0.125, 0.025, 0.05, 240)
    assert c.model.cut_layer == 4 and c.model.bottleneck_channels == 8 and c.model.sigmoid
    from cem_bench.attacks import resolve as resolve_attack
    a = resolve_attack(c.replace(**{"data.dataset": "cifar10"})).attack
    assert a.blocks == 8 and a.channels == 64 and a.epochs == 50
    assert a.batch_size == 256


@pytest.mark.parametrize("dataset, epochs", [("synthetic", 48), ("digits", 96), ("photos", 48)])
def test_the_small_sets_default_to_a_decoder_that_has_steps_to_learn(dataset, epochs):
    """digits' 324 and photos' and the shapes' 2,304 attacker images at batch 256 were 2 and 9 Adam steps an
    epoch: the old default (10 such epochs) drew a flat image on digits. Their defaults are batch 32 and the epochs
    at which the decoder stopped improving (docs/attacks.md section 3); a key that is set still wins."""
    from cem_bench.attacks import resolve as resolve_attack
    c = TrialConfig().replace(**{"data.dataset": dataset})
    a = resolve_attack(c).attack
    assert (a.epochs, a.batch_size, a.blocks, a.channels) == (epochs, 32, 2, 32)
    set_ = resolve_attack(c.replace(**{"attack.batch_size": 64, "attack.epochs": 4})).attack
    assert (set_.epochs, set_.batch_size) == (4, 64)


def test_flat_round_trip():
    c = TrialConfig.from_flat({"cem.lambd": "8", "train.milestones": "[0.5, 0.75]", "model.sigmoid": "false",
                               "cem.num_slots": 4})
    assert c.cem.lambd == 8.0 and c.train.milestones == [0.5, 0.75] and c.model.sigmoid is False
    assert TrialConfig.from_flat(c.to_flat()) == c
    # every key of the sections, plus the plug-in keys that were set; once resolved, every key of the chosen
    # surrogate and attack (and only theirs: another surrogate's keys do not apply and are not recorded)
    from cem_bench import attacks, surrogates
    from cem_bench.config import core_key_specs
    from cem_bench.core.trial import build_config
    assert set(c.to_flat()) == set(core_key_specs()) | {"cem.num_slots"}
    for name in surrogates.names():
        r = build_config(c.replace(**{"cem.surrogate": name}))
        own = set(surrogates.get(name).keys) | {k for a in c.attack.names for k in attacks.get(a).keys}
        assert set(r.to_flat()) == set(core_key_specs()) | own
        assert own <= set(key_specs())
        assert TrialConfig.from_flat(r.to_flat()) == r


@pytest.mark.parametrize("flat, fragments", [
    ({"cem.lamda": 8}, ["unknown config key 'cem.lamda'", "did you mean cem.lambd"]),
    ({"cem.lambd": "lots"}, ["cem.lambd", "not a number", "float"]),
    ({"cem.lambd": -1}, ["cem.lambd", "out of range"]),
    ({"train.epochs": 2.5}, ["train.epochs", "not an integer"]),
    ({"data.dataset": "mnist"}, ["data.dataset", "synthetic, cifar10, cifar100"]),
    ({"cem.surrogate": "slotcross"}, ["unknown surrogate 'slotcross'", "gmm", "slot_cross"]),
    ({"attack.names": "[decoder, rmel]"}, ["attack.names", "unknown attack 'rmel'", "a list of decoder, rmle"]),
    ({"attack.names": "[]"}, ["attack.names", "is empty", "a list of decoder, rmle"]),
    ({"attack.names": "[rmle, rmle]"}, ["attack.names", "names an attack twice"]),
    ({"attack.names": "[1, 2]"}, ["attack.names", "not a list of names"]),
    ({"cem.grad_mode": "both"}, ["cem.grad_mode", "inject, fused"]),
    ({"train.milestones": "[0.9, 0.1]"}, ["train.milestones", "increasing"]),
    ({"train.milestones": "[0.5, 0.5]"}, ["train.milestones", "strictly increasing"]),   # was accepted
    ({"model.sigmoid": "maybe"}, ["model.sigmoid", "not a boolean", "true or false"]),
    ({"bogus": 1}, ["unknown config key 'bogus'"]),
    # both were taken silently until 2026-12-07: a warm-up still climbing when the run ends, a probe that never runs
    ({"train.epochs": 4, "train.warmup_lr_epochs": 5}, ["train.warmup_lr_epochs: 5 is longer than the run",
                                                        "allowed: 0 (no warm-up) to 4"]),
    ({"train.epochs": 4, "attack.probe_epochs": "[5, 9]"}, ["attack.probe_epochs: [5, 9] all lie beyond the run",
                                                           "allowed: epochs 1 to 4, or [] for no probe"]),
])
def test_errors_name_the_key_and_the_allowed_values(flat, fragments):
    with pytest.raises(ConfigError) as e:
        TrialConfig.from_flat(flat)
    for f in fragments:
        assert f in str(e.value)


def test_a_warm_up_of_the_whole_run_and_a_probe_partly_past_it_are_taken():
    cfg = TrialConfig.from_flat({"train.epochs": 4, "train.warmup_lr_epochs": 4, "attack.probe_epochs": "[4, 9]"})
    assert cfg.train.warmup_lr_epochs == 4 and cfg.attack.probe_epochs == [4, 9]


def test_a_seed_past_what_the_generators_take_is_refused_before_the_trial():
    """seed took any integer up to 2^53, but gmm seeds its k-means stream with 1000003 x (seed + 1), which torch
    refuses past 64 bits: the trial stopped with a ValueError at its first CEM epoch, after its warm-up. Now the
    seed is numpy's range, and its largest value seeds every stream derived from it."""
    from cem_bench.config import MAX_SEED
    for bad in (2**53, MAX_SEED + 1, -1):
        with pytest.raises(ConfigError, match=r"seed: .* out of range"):
            TrialConfig.from_flat({"seed": bad})
    from conftest import make_trainer
    trainer = make_trainer(seed=MAX_SEED, **{"cem.warmup_epochs": 0, "data.train_size": 64, "data.test_size": 20})
    trainer.refit_surrogate()
    assert trainer.surrogate.fitted


def test_a_boolean_in_a_list_of_numbers_is_refused():
    """YAML reads yes, on and true as a boolean; in train.milestones it became 1.0 without a word."""
    with pytest.raises(ConfigError, match="train.milestones: .* holds a boolean"):
        TrialConfig.from_flat({"train.milestones": "[0.5, yes]"})
    assert TrialConfig.from_flat({"train.milestones": "[0.5, 1]"}).train.milestones == [0.5, 1.0]


def test_all_errors_reported_at_once():
    with pytest.raises(ConfigError) as e:
        TrialConfig.from_flat({"cem.lambd": -1, "train.epochs": "x", "nope.key": 1})
    msg = str(e.value)
    assert "cem.lambd" in msg and "train.epochs" in msg and "nope.key" in msg


def test_yaml_nested_and_flat(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("cem:\n  lambd: 4\ntrain.epochs: 3\nseed: 7\n")
    flat = load_yaml_config(str(p))
    c = TrialConfig.from_flat(flat)
    assert c.cem.lambd == 4 and c.train.epochs == 3 and c.seed == 7


@pytest.mark.parametrize("body, first, second", [
    ("train:\n  epochs: 3\ntrain.epochs: 4\n", "train: {epochs: 3}", "train.epochs: 4"),
    ("cem.surrogate: gmm\ncem:\n  lambd: 8\n  surrogate: slot_cross\n", "cem.surrogate: 'gmm'",
     "cem: {surrogate: 'slot_cross'}"),
])
def test_a_key_given_nested_and_flat_is_refused(tmp_path, capsys, body, first, second):
    """train: {epochs: 3} then train.epochs: 4 trained 4 epochs without a word (the later one won)."""
    p = tmp_path / "c.yaml"
    p.write_text(body)
    with pytest.raises(ConfigError) as e:
        load_yaml_config(str(p))
    assert f"is given twice, as {first} and as {second}" in str(e.value), str(e.value)
    assert main(["train", "--config", str(p), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "is given twice" in err and "Traceback" not in err and not (tmp_path / "run").exists()


def test_cli_config_error_exit_2_without_traceback(capsys):
    assert main(["train", "--set", "cem.lambd=-3", "--set", "cem.surrogate=nope"]) == 2
    err = capsys.readouterr().err
    assert "cem.lambd" in err and "unknown surrogate 'nope'" in err and "Traceback" not in err
    assert main(["train", "--set", "novalue"]) == 2
    assert main(["train", "--config", "/does/not/exist.yaml"]) == 2


def test_a_key_set_twice_to_two_values_is_refused_and_twice_to_one_is_one():
    """--set's last value won silently (2026-12-07 probe); a duplicate key of a --config file was refused."""
    from cem_bench.config import parse_set
    with pytest.raises(ConfigError, match=r"--set attack.epochs is given twice, as '1' and '2'; give each key once"):
        parse_set(["attack.epochs=1", "attack.epochs=2"])
    assert parse_set(["cem.lambd=8", "cem.lambd=8", "seed=1"]) == {"cem.lambd": "8", "seed": "1"}
