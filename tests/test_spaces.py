"""Search spaces: the shipped YAML files validate, every mistake is reported at once, and the Optuna
define-by-run function produces valid, correctly conditioned configs. No Ray is started here."""

from __future__ import annotations

import copy
import glob
import json
import os
import re
import subprocess
import sys
import warnings

import optuna
import pytest

from cem_bench import surrogates
from cem_bench.config import ConfigError, TrialConfig
from cem_bench.spaces import (
    METRICS,
    SAMPLERS,
    Objective,
    Param,
    SearchSpec,
    SpaceError,
    define_by_run,
    load_space,
    make_sampler,
    parse_space,
    trial_config,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPACE_FILES = sorted(f for f in glob.glob(os.path.join(ROOT, "search_spaces", "*.yaml"))
                     if os.path.basename(f) != "demo_train.yaml")


def minimal(**changes) -> dict:
    doc = {
        "name": "t",
        "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.1},
                       {"metric": "attack_ssim", "mode": "min", "ref": 1.0}],
        "sampler": {"name": "random", "seed": 0},
        "num_samples": 4,
        "fixed": {"train.device": "cpu"},
        "params": {"cem.lambd": {"loguniform": [1, 64]}},
    }
    doc.update(changes)
    return doc


def errors_of(doc, **kw) -> list[str]:
    with pytest.raises(SpaceError) as info:
        parse_space(doc, **kw)
    assert isinstance(info.value, ConfigError)
    assert str(info.value).splitlines() == info.value.errors
    return info.value.errors


def sample(spec: SearchSpec, n: int, sampler=None, tell: bool = False) -> list[dict]:
    """``n`` define-by-run asks on an in-memory study; returns the sampled params of each."""
    study = optuna.create_study(directions=["maximize" if m == "max" else "minimize" for m in spec.modes],
                                sampler=sampler or optuna.samplers.RandomSampler(seed=0))
    space = define_by_run(spec)
    out = []
    for i in range(n):
        trial = study.ask()
        consts = space(trial)
        assert consts == spec.fixed
        out.append(dict(trial.params))
        if tell:
            study.tell(trial, [((i * 7919) % 13) / 13.0 for _ in spec.objectives])
    return out


# ------------------------------------------------------------------------------------- shipped files
def test_expected_files_exist():
    names = {os.path.basename(f) for f in SPACE_FILES}
    for want in ("demo.yaml", "cifar10_fast.yaml", "cifar10_paper.yaml", "gmm.yaml", "gated_attention.yaml",
                 "slot_cross.yaml", "attention_centroid.yaml", "serial_enhanced.yaml"):
        assert want in names


@pytest.mark.parametrize("path", SPACE_FILES, ids=os.path.basename)
def test_shipped_space_validates(path):
    spec = load_space(path)
    assert spec.path == path
    assert 2 <= len(spec.objectives) <= 3
    assert spec.objectives[0] == Objective("test_acc", "max", 0.1)
    assert spec.objectives[1] == Objective("attack_ssim", "min", 1.0)
    d = json.loads(json.dumps(spec.to_dict()))
    assert d["name"] == spec.name and d["objectives"][0] == {"metric": "test_acc", "mode": "max", "ref": 0.1}
    # a sampled config of every shipped space builds and resolves
    for params in sample(spec, 12):
        cfg = TrialConfig.from_flat(trial_config(spec, params))
        surrogates.resolve(cfg)


@pytest.mark.parametrize("path", SPACE_FILES, ids=os.path.basename)
def test_every_key_has_a_comment(path):
    """Each fixed and searched key says why its value or range is what it is (on its line or in the
    comment block just above it)."""
    lines = open(path).read().splitlines()
    section = None
    for i, line in enumerate(lines):
        if re.match(r"^\w", line):
            section = line.split(":")[0]
            continue
        m = re.match(r"^\s+([\w.]+):", line)
        if section not in ("fixed", "params") or not m:
            continue
        # on its own line, or a comment block above it shared with the keys in between (none of which
        # has a comment of its own)
        j, ok = i, "#" in line
        while not ok and j > 0 and lines[j - 1].strip() and not re.match(r"^\w", lines[j - 1]):
            j -= 1
            if lines[j].lstrip().startswith("#"):
                ok = True
            elif "#" in lines[j]:
                break
        assert ok, f"{os.path.basename(path)}:{i + 1}: {m.group(1)} has no comment"


def test_demo_is_small_and_covers_baseline_and_three_surrogates():
    spec = load_space(os.path.join(ROOT, "search_spaces", "demo.yaml"))
    assert spec.name == "demo" and spec.max_concurrent == 2
    assert spec.resources == {"cpu": 1.0, "gpu": 0.0}
    assert spec.fixed["data.dataset"] == "digits" and spec.fixed["train.device"] == "cpu"   # no download
    assert spec.sampler.get("seed") is not None
    # the noise floor (4 λ = 0 seeds) and a confirmation with enough seeds for an interval, within 12 trials
    assert spec.baseline_replicates == 4 and spec.baseline_seeds == (0, 1, 2, 3)
    assert spec.confirm_top >= 1 and spec.confirm_replicates >= 3 and spec.total_runs <= 12
    # the seeded sampler's start-up draws (independent of results) hold 3 surrogates, none at λ = 0
    startup = spec.sampler.get("n_startup_trials", 10)
    rows = sample(spec, min(startup, spec.num_samples), sampler=make_sampler(spec))
    assert all(trial_config(spec, r)["cem.lambd"] > 0 for r in rows)
    assert len({r["cem.surrogate"] for r in rows}) >= 3
    assert len({tuple(sorted(r.items())) for r in rows}) == len(rows), rows  # no trial spent on a copy


def test_paper_space_matches_the_paper():
    spec = load_space(os.path.join(ROOT, "search_spaces", "cifar10_paper.yaml"))
    by = {p.key: p for p in spec.params}
    assert spec.fixed["train.epochs"] == 240 and spec.fixed["attack.epochs"] == 50
    assert spec.fixed["data.attack_split"] == "training"
    assert set(by["defense.noise_std"].choices) == {0.01, 0.025, 0.05, 0.1, 0.15}
    assert set(by["cem.lambd"].choices) == {0, 8, 16}
    # exactly the paper's grid: 5 sigmas x (lambda 0, and lambda 8/16 x 5 surrogates), 3 seeds each, fp32
    assert spec.sampler["name"] == "grid" and spec.num_samples == 55 and spec.runs == 165
    assert by["cem.surrogate"].when == {"cem.lambd": (8.0, 16.0)} and spec.fixed["train.amp"] == "off"


@pytest.mark.parametrize("gpu,says", [
    (2, "resources.gpu: 2: a trial trains on one GPU, so the other 1 would be reserved and idle; give 1, or a "
        "fraction"),
    (1.5, "resources.gpu: 1.5: a trial trains on one GPU, so the other 1 would be reserved and idle"),
])
def test_more_than_one_gpu_a_trial_is_refused_since_a_trial_uses_one(gpu, says):
    assert any(e.startswith(says) for e in errors_of(minimal(resources={"cpu": 1, "gpu": gpu}))), gpu
    for ok in (0, 0.25, 1):
        assert parse_space(minimal(resources={"cpu": 1, "gpu": ok})).resources["gpu"] == ok


# ----------------------------------------------------------------------------------- all errors at once
def test_many_mistakes_reported_together():
    doc = {
        "name": "bad/name",
        "objective": 1,                                              # typo of a top-level field
        "objectives": [{"metric": "accuracy", "mode": "maximize", "ref": "high"}],
        "sampler": {"name": "bayes"},
        "num_samples": 0,
        "max_concurrent": 0,
        "resources": {"cpu": 0, "gpu": -1, "tpu": 1},
        "fixed": {"cem.lamda": 3, "train.epochs": "many", "cem.surrogate": "gmm"},
        "params": {
            "cem.lambd": {"loguniform": [64, 1]},
            "cem.shrink": {"loguniform": [0, 10]},
            "cem.num_slots": {"int": [2.5, 8], "when": {"cem.surogate": ["slot_cross"]}},
            "cem.surrogate": {"choice": ["gmm", "slotcross"]},
            "defense.noise_std": {"uniform": [-1, 0.1]},
            "cem.margin": {"uniform": [0, 1], "choice": [0, 1]},
            "cem.snr_thresh": {"uniform": [0.1, 0.5], "when": {"cem.lambd": [100]}},
            "cem.hidden_dim": {"uniform": [8, 64]},
            "cem.not_a_key": {"choice": [1]},
        },
    }
    errors = errors_of(doc)
    text = "\n".join(errors)
    expected = [
        "objective: unknown field (did you mean objectives?)",
        "name: 'bad/name' is not a safe folder name",
        "objectives: 1 objective(s) given; a frontier search needs 2 or 3",
        "objectives[0].metric: unknown metric 'accuracy'",
        "objectives[0].mode: 'maximize'",
        "objectives[0].ref: 'high' is not a finite number",
        "sampler.name: unknown sampler 'bayes'; known: gp, grid, nsga2, nsga3, random, tpe",
        "num_samples: 0 must be an integer >= 1",
        "max_concurrent: 0 must be an integer >= 1",
        "resources.cpu: 0 must be > 0",
        "resources.gpu: -1 must be >= 0",
        "resources.tpu: unknown resource",
        "fixed.cem.lamda: unknown config key 'cem.lamda' (did you mean cem.lambd",
        "fixed.train.epochs: train.epochs: 'many' is not an integer",
        "params.cem.lambd.loguniform: empty range [64, 1]",
        "params.cem.shrink.loguniform: a log scale needs low > 0",
        "params.cem.num_slots.int: bounds must be integers",
        "params.cem.surrogate: is both fixed and searched",
        "params.cem.surrogate.choice: unknown surrogate 'slotcross'",
        "params.defense.noise_std.uniform: bound -1 is outside defense.noise_std's allowed values",
        "params.cem.margin: needs exactly one of uniform, loguniform, int, choice; got uniform, choice",
        "params.cem.hidden_dim: cem.hidden_dim is an integer key: use int",
        "params.cem.not_a_key: unknown config key 'cem.not_a_key'",
        "params.cem.num_slots.when.cem.surogate: refers to unknown parameter 'cem.surogate'",
    ]
    for frag in expected:
        assert frag in text, f"missing {frag!r} in:\n{text}"
    assert len(errors) >= len(expected)


def test_the_plan_fields_are_reported_with_the_others():
    """baseline, confirm, utility_tolerance, the scheduler and the grid's kinds are checked in the same run as
    the fields above them: one run lists every problem, not a second round after the first is fixed."""
    doc = minimal(
        objectives=[{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssimm", "mode": "min"}],
        sampler={"name": "grid"}, baseline={"replicates": 1}, confirm={"replicates": 1},
        utility_tolerance=-1, scheduler={"name": "moasha", "grace": 2},
        params={"cem.lambd": {"loguniform": [0, 64]}, "defense.noise_std": {"uniform": [0.01, 0.1]}})
    text = "\n".join(errors_of(doc))
    for frag in ["objectives[1].metric: unknown metric 'attack_ssimm'",
                 "params.cem.lambd.loguniform: a log scale needs low > 0",
                 "params.defense.noise_std: sampler grid enumerates discrete values",
                 "baseline.replicates: 1 must be an integer >= 3",
                 "confirm.replicates: 1 must be an integer >= 3",
                 "utility_tolerance: -1 must be a number >= 0",
                 "scheduler.grace: unknown option of scheduler 'moasha'"]:
        assert frag in text, f"missing {frag!r} in:\n{text}"


@pytest.mark.parametrize("tolerance, ok", [(2, False), (1, False), (0.5, True), (0.02, True)])
def test_a_utility_tolerance_no_difference_of_accuracies_reaches_is_refused(tolerance, ok):
    """`utility_tolerance: 2` (2 points meant) was taken: every configuration was then "at the baseline's
    accuracy", whatever it measured (2026-12-07 probe). A difference of two accuracies is below 1."""
    if ok:
        assert parse_space(minimal(utility_tolerance=tolerance)).utility_tolerance == tolerance
        return
    text = "\n".join(errors_of(minimal(utility_tolerance=tolerance)))
    assert "utility_tolerance: " in text and "0.02 is 2 points of accuracy" in text, text
    assert "(the first objective's, test_acc)" in text, text


def test_when_value_must_be_possible_and_refer_to_a_param():
    doc = minimal(params={
        "cem.surrogate": {"choice": ["gmm", "slot_cross"]},
        "cem.lambd": {"loguniform": [1, 64]},
        "cem.num_slots": {"int": [2, 8], "when": {"cem.surrogate": ["gated_attention"]}},
        "cem.snr_thresh": {"uniform": [0.1, 0.5], "when": {"cem.lambd": [100]}},
        "cem.margin": {"uniform": [0, 1], "when": {"train.device": ["cpu"]}},
    })
    text = "\n".join(errors_of(doc))
    assert "params.cem.num_slots.when.cem.surrogate: 'gated_attention' is not a possible value" in text
    assert "params.cem.snr_thresh.when.cem.lambd: 100 is not a possible value of cem.lambd (its range [1, 64])" in text
    assert "params.cem.margin.when.train.device: refers to unknown parameter 'train.device' (it is fixed" in text


@pytest.mark.parametrize("objectives, fragment", [
    ([{"metric": "test_acc", "mode": "max"}], "need" + "s 2 or 3"),
    ([{"metric": m, "mode": "min"} for m in ("attack_mse", "attack_psnr", "attack_ssim", "test_acc")], "2 or 3"),
    ([{"metric": "test_acc", "mode": "max"}, {"metric": "test_acc", "mode": "min"}], "listed twice"),
    ([{"metric": "test_acc", "mode": "max", "weight": 1}, {"metric": "attack_ssim", "mode": "min"}],
     "objectives[0].weight: unknown field"),
])
def test_objective_errors(objectives, fragment):
    assert fragment in "\n".join(errors_of(minimal(objectives=objectives)))


def test_objective_ref_optional_and_three_objectives():
    objs = [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim", "mode": "min", "ref": 1},
            {"metric": "attack_mse", "mode": "max", "ref": 0}]
    spec = parse_space(minimal(objectives=objs))
    assert spec.metric_names == ["test_acc", "attack_ssim", "attack_mse"]
    assert spec.modes == ["max", "min", "max"]
    assert spec.objectives[0].ref is None and spec.objectives[2].ref == 0.0
    assert set(spec.metric_names) <= set(METRICS)


def test_cycle_and_required_fields():
    doc = minimal(params={"cem.surrogate": {"choice": ["gmm", "slot_cross"], "when": {"cem.lambd": [0]}},
                          "cem.lambd": {"choice": [0, 8], "when": {"cem.surrogate": ["gmm"]}}})
    assert any("cycle" in e for e in errors_of(doc))
    errs = errors_of({"name": "x"})
    for k in ("objectives", "num_samples", "params"):
        assert any(e.startswith(f"{k}: missing (required)") for e in errs), errs


def test_sampler_options_checked():
    text = "\n".join(errors_of(minimal(sampler={"name": "tpe", "seed": "zero", "population_size": 10})))
    assert "sampler.seed: 'zero' must be an integer from 0 to 2**32 - 1, or empty" in text
    assert "sampler.population_size: unknown option of sampler 'tpe'" in text


def test_cross_key_checks():
    # heads must divide hidden_dim; stats_on must suit every surrogate it can meet
    doc = minimal(params={"cem.surrogate": {"choice": ["gmm", "slot_cross"]},
                          "cem.num_heads": {"choice": [3, 4], "when": {"cem.surrogate": ["slot_cross"]}},
                          "cem.stats_on": {"choice": ["raw", "enhanced"]}})
    text = "\n".join(errors_of(doc))
    assert "cem.num_heads: 3 must divide cem.hidden_dim (128)" in text
    assert "'enhanced' does not apply to surrogate 'gmm'" in text
    # conditioned on the surrogate that has it, the same stats_on is fine
    # (and 'enhanced' statistics only with the joint estimator fit: docs/estimators.md)
    doc["params"]["cem.stats_on"]["when"] = {"cem.surrogate": ["slot_cross"]}
    doc["params"]["cem.estimator_fit"] = {"choice": ["joint"], "when": {"cem.surrogate": ["slot_cross"]}}
    doc["params"]["cem.num_heads"]["choice"] = [2, 4]
    parse_space(doc)
    # the fixed config as a whole goes through TrialConfig.from_flat
    text = "\n".join(errors_of(minimal(fixed={"train.device": "tpu"})))
    assert "fixed: train.device: 'tpu'" in text


def test_surrogate_specific_key_for_other_surrogate_is_allowed():
    """A key of another surrogate (cem.num_slots beside gmm) is accepted and kept: every trial's config
    carries it unchanged, so a space can switch surrogates without editing its fixed keys."""
    doc = minimal(fixed={"cem.surrogate": "gmm", "cem.num_slots": 4},
                  params={"cem.lambd": {"uniform": [1, 9]}})
    spec = parse_space(doc)
    assert spec.fixed == {"cem.surrogate": "gmm", "cem.num_slots": 4}
    for params in sample(spec, 2):
        flat = trial_config(spec, params)
        assert flat["cem.num_slots"] == 4 and flat["cem.lambd"] == params["cem.lambd"]
        assert TrialConfig.from_flat(flat).to_flat()["cem.num_slots"] == 4
        assert "cem.num_slots" not in surrogates.resolve(TrialConfig.from_flat(flat)).to_flat()   # gmm ignores it
        assert surrogates.resolve(TrialConfig.from_flat({**flat, "cem.surrogate": "slot_cross"})).cem.num_slots == 4


def test_yaml_number_strings_and_order():
    # YAML 1.1 reads 1e-3 as a string; a `when` may name a parameter defined later in the file
    doc = minimal(params={"cem.num_slots": {"int": [2, 8], "when": {"cem.surrogate": ["slot_cross"]}},
                          "cem.surrogate_lr": {"loguniform": ["1e-4", "1e-2"]},
                          "cem.surrogate": {"choice": ["gmm", "slot_cross"]},
                          "cem.num_iterations": {"int": [1, 4], "log": True},
                          "cem.margin": {"uniform": [0, 1], "step": 0.25}})
    spec = parse_space(doc)
    keys = [p.key for p in spec.params]
    assert keys.index("cem.surrogate") < keys.index("cem.num_slots")
    lr = next(p for p in spec.params if p.key == "cem.surrogate_lr")
    assert (lr.low, lr.high, lr.log) == (1e-4, 1e-2, True)
    it = next(p for p in spec.params if p.key == "cem.num_iterations")
    assert it.kind == "int" and it.log and (it.low, it.high) == (1, 4)
    for params in sample(spec, 10):
        assert params["cem.margin"] in (0.0, 0.25, 0.5, 0.75, 1.0)


# ----------------------------------------------------------------------------------- define-by-run
def _holds(p: Param, params: dict) -> bool:
    return all(ref in params and params[ref] in allowed for ref, allowed in p.when.items())


@pytest.mark.parametrize("name", ["demo.yaml", "cifar10_fast.yaml"])
def test_define_by_run_conditions(name):
    spec = load_space(os.path.join(ROOT, "search_spaces", name))
    assert any(p.when for p in spec.params)
    seen_on = set()
    for params in sample(spec, 30):
        for p in spec.params:
            assert (p.key in params) == _holds(p, params), (p.key, params)
            if p.when and p.key in params:
                seen_on.add(p.key)
        cfg = TrialConfig.from_flat(trial_config(spec, params))
        surrogates.resolve(cfg)
        for k, v in spec.fixed.items():
            assert cfg.to_flat()[k] == v
    assert seen_on == {p.key for p in spec.params if p.when}


def test_trial_config_merges_and_coerces():
    spec = load_space(os.path.join(ROOT, "search_spaces", "demo.yaml"))
    flat = trial_config(spec, {"cem.lambd": 4, "cem.surrogate": "gmm", "cem.num_clusters": 3})
    assert flat["cem.lambd"] == 4.0 and isinstance(flat["cem.lambd"], float)
    assert flat["data.dataset"] == "digits" and flat["cem.num_clusters"] == 3
    nested = trial_config(spec, {"cem": {"lambd": 8, "surrogate": "slot_cross"}})
    assert nested["cem.lambd"] == 8.0 and nested["cem.surrogate"] == "slot_cross"


@pytest.mark.parametrize("sampler", [s for s in SAMPLERS if s != "grid"])   # grid: tests/test_search.py
def test_each_sampler_constructs_and_samples(sampler):
    doc = minimal(sampler={"name": sampler, "seed": 1}, num_samples=8,
                  params={"cem.surrogate": {"choice": ["gmm", "slot_cross"]},
                          "cem.lambd": {"choice": [0, 8, 16]},
                          "cem.num_slots": {"int": [2, 8], "when": {"cem.surrogate": ["slot_cross"]}}})
    spec = parse_space(doc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = make_sampler(spec)
        assert isinstance(s, optuna.samplers.BaseSampler)
        rows = sample(spec, 4, sampler=s, tell=True)
    assert all(("cem.num_slots" in r) == (r["cem.surrogate"] == "slot_cross") for r in rows)


def test_tpe_is_multivariate_and_grouped_for_conditional_spaces():
    spec = load_space(os.path.join(ROOT, "search_spaces", "demo.yaml"))
    s = make_sampler(spec)
    assert isinstance(s, optuna.samplers.TPESampler)
    assert s._multivariate and s._group
    # past the start-up trials TPE keeps the same distribution per name across trials
    rows = sample(spec, 9, sampler=s, tell=True)
    assert len(rows) == 9


# ------------------------------------------------------------------------------------------ overrides
def test_overrides():
    path = os.path.join(ROOT, "search_spaces", "demo.yaml")
    spec = load_space(path, {"name": "demo_quick", "num_samples": "3", "max_concurrent": 1,
                             "resources.gpu": 0.5, "resources.cpu": None, "sampler.seed": 7,
                             "fixed": {"train.epochs": 4, "cem.surrogate": "slot_cross"}})
    assert spec.name == "demo_quick" and spec.num_samples == 3 and spec.max_concurrent == 1
    assert spec.resources == {"cpu": 1.0, "gpu": 0.5} and spec.sampler["seed"] == 7
    assert spec.fixed["train.epochs"] == 4 and spec.fixed["cem.surrogate"] == "slot_cross"
    keys = {p.key: p for p in spec.params}
    # the pinned key leaves the search; conditions on it are resolved against the fixed value
    assert "cem.surrogate" not in keys and "cem.num_clusters" not in keys
    assert keys["cem.num_slots"].when == {} and keys["cem.snr_thresh"].when == {}
    for params in sample(spec, 5):
        assert "cem.num_slots" in params and "cem.snr_thresh" in params


def test_bad_overrides_are_space_errors():
    path = os.path.join(ROOT, "search_spaces", "demo.yaml")
    errs = "\n".join(space_error_lines(path, {"name": "a b", "num_samples": 0, "bogus": 1,
                                             "fixed": {"train.epochs": -1}}))
    assert "name: 'a b' is not a safe folder name" in errs
    # "$" matched before a final newline: --name $'evil\n' made a folder whose name ends in one
    assert "is not a safe folder name" in "\n".join(space_error_lines(path, {"name": "evil\n"}))
    assert "num_samples: 0" in errs and "overrides.bogus: unknown override" in errs
    assert "fixed.train.epochs: train.epochs: -1 is out of range" in errs


def test_fixing_every_searched_key_leaves_one_configuration():
    """--set on every searched key left params empty, and the count of distinct configurations was skipped: 5
    identical trials with one seed ran, where 2 distinct configurations with num_samples 5 were refused. No
    parameter left is one configuration, refused the same way; num_samples 1 (replicates for seeds) runs."""
    pin = {"fixed": {"cem.lambd": "8"}}
    for params in ({"cem.lambd": {"choice": [0, 8]}}, {"cem.lambd": {"loguniform": [1, 64]}}):
        errs = errors_of(minimal(params=params, num_samples=5), overrides=pin)
        assert errs == ["num_samples: 5, but the space holds only 1 distinct configuration (every key it searches is "
                        "fixed by --set): a sampler cannot propose more, and a repeat is not a replicate (its runs "
                        "would share a seed). Set num_samples to 1 or fewer (sampler grid runs each once); for "
                        "several seeds of each, add replicates: N"], errs
    spec = parse_space(minimal(num_samples=1, replicates=3), overrides=pin)
    assert spec.params == () and spec.fixed["cem.lambd"] == 8.0 and spec.seeds == (0, 1, 2)


def test_a_fixed_key_given_nested_and_flat_is_refused():
    """fixed: {train: {epochs: 3}, train.epochs: 4} ran 4 epochs without a word; now refused, naming both."""
    doc = minimal(fixed={"train": {"epochs": 3}, "train.epochs": 4})
    for overrides in (None, {"fixed": {"cem.lambd": 8}}):
        assert errors_of(doc, overrides=overrides) == [
            "fixed: the key 'train.epochs' is given twice, as train: {epochs: 3} and as train.epochs: 4; the later "
            "one would win silently: give it once, nested under its section or flat"]


def test_a_key_given_twice_does_not_hide_the_other_problems_of_fixed():
    """Every problem at once: a duplicate in fixed used to be the only line, and a misspelt key beside it was
    reported only after the duplicate was gone."""
    errs = errors_of(minimal(fixed={"cem.lamda": 3, "train": {"epochs": 3}, "train.epochs": 4}))
    assert any("is given twice" in e for e in errs), errs
    assert any(e.startswith("fixed.cem.lamda") and "cem.lambd" in e for e in errs), errs


def test_seeds_a_trial_cannot_take_are_refused_with_the_space():
    """A seed past the key's range (0 to config.MAX_SEED) passed the space and stopped every trial at its start."""
    from cem_bench.config import MAX_SEED
    errs = errors_of(minimal(seeds=[1, MAX_SEED + 1, -2]))
    assert errs == [f"seeds: {[MAX_SEED + 1, -2]!r} outside the seeds a trial takes, 0 to {MAX_SEED} (the key seed)"], errs


def space_error_lines(path, overrides):
    with pytest.raises(SpaceError) as info:
        load_space(path, overrides)
    return info.value.errors


def test_file_errors(tmp_path):
    with pytest.raises(SpaceError, match="does not exist"):
        load_space(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpaceError, match="not valid YAML"):
        load_space(str(bad))
    bad.write_text("- just\n- a list\n")
    with pytest.raises(SpaceError, match="must be a mapping"):
        load_space(str(bad))


def test_parse_does_not_mutate_input():
    doc = minimal()
    before = copy.deepcopy(doc)
    parse_space(doc, overrides={"fixed": {"train.epochs": 2}})
    assert doc == before


def heavy_modules_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; return which of torch, optuna, ray it imported (this test process
    has imported some of them already, so only a subprocess can tell)."""
    probe = code + "\nimport sys\nprint(','.join(m for m in ('torch', 'optuna', 'ray') if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if out.returncode:  # a crash is not the answer either way
        raise RuntimeError(out.stderr)
    return [m for m in out.stdout.rstrip("\n").rsplit("\n", 1)[-1].split(",") if m]


def test_importing_spaces_imports_no_torch_optuna_or_ray():
    assert heavy_modules_after("import cem_bench.spaces") == []


# ----------------------------------------------------------------------- the noise floor and confirmation
def test_baseline_and_confirm_defaults():
    spec = parse_space(minimal())                                   # λ searched: both on
    assert (spec.baseline_replicates, spec.baseline_cells, spec.baseline_seeds) == (3, ({},), (0, 1, 2))
    assert (spec.confirm_top, spec.confirm_replicates, spec.confirm_seeds) == (3, 3, (3, 4, 5))
    assert spec.total_runs == 3 + 4 + 9
    assert spec.baseline_configs()[0] == {"cem.lambd": 0.0, "seed": 0, "role": "baseline"}
    # λ fixed at 0: the whole search is a baseline; a replicated grid with λ = 0 cells has its own
    assert parse_space(minimal(fixed={"cem.lambd": 0}, params={"defense.noise_std": {"choice": [0.1, 0.2]}},
                               num_samples=2)).baseline_replicates == 0   # 2 distinct configurations: at most 2
    grid = parse_space(minimal(sampler={"name": "grid"}, num_samples=None, replicates=2,
                               params={"cem.lambd": {"choice": [0, 8]}}))
    assert grid.baseline_replicates == 0
    # a searched σ: one baseline cell per value; the search's seeds lead the baseline's
    spec = parse_space(minimal(params={"cem.lambd": {"loguniform": [1, 64]},
                                       "defense.noise_std": {"choice": [0.05, 0.1]}},
                               seeds=[7, 9], baseline={"replicates": 3}, confirm={"top": 1, "replicates": 3}))
    assert spec.baseline_cells == ({"defense.noise_std": 0.05}, {"defense.noise_std": 0.1})
    assert spec.baseline_seeds == (7, 9, 10) and spec.confirm_seeds == (11, 12, 13)
    assert spec.baseline_runs == 6 and spec.runs == 8 and spec.confirm_runs == 3


@pytest.mark.parametrize("seed, confirm", [({"choice": [0, 1, 2, 3]}, (4, 5, 6)), ({"int": [2, 9]}, (10, 11, 12))])
def test_a_searched_seed_is_never_a_confirmation_seed(seed, confirm):
    """The confirmation's seeds start after a searched seed's values too: before 2026-12-06 they started after
    the fixed seed and the baseline's (3, 4, 5), and re-ran the very (configuration, seed) runs that chose the
    configuration, counted as new evidence."""
    spec = parse_space(minimal(params={"cem.lambd": {"choice": [4, 16]}, "seed": seed}, baseline=False,
                               confirm={"top": 1, "replicates": 3}))
    assert spec.confirm_seeds == confirm


def test_baseline_and_confirm_errors_name_the_problem():
    errs = errors_of(minimal(baseline={"replicates": 1}, confirm={"top": 2, "replicates": 1}))
    assert any(e.startswith("baseline.replicates: 1 must be an integer >= 3") for e in errs), errs
    assert any(e.startswith("confirm.replicates: 1 must be an integer >= 3") for e in errs), errs
    # two runs a side are refused too: such a baseline or confirmation is compared with nothing (noise.MIN_RUNS),
    # so its trials would run for no verdict
    errs = errors_of(minimal(baseline={"replicates": 2}, confirm={"top": 2, "replicates": 2}))
    assert any(e.startswith("baseline.replicates: 2 must be an integer >= 3 (a comparison needs 3 runs a side)")
               for e in errs), errs
    assert any(e.startswith("confirm.replicates: 2 must be an integer >= 3") for e in errs), errs
    spec = parse_space(minimal(baseline={"replicates": 0}, confirm={"top": 0, "replicates": 3}))
    assert spec.baseline_replicates == 0 and spec.confirm_top == 0
    errs = errors_of(minimal(baseline="yes", confirm={"best": 2}))
    assert any(e.startswith("baseline: 'yes' must be {replicates: N}") for e in errs), errs
    assert any(e.startswith("confirm: {'best': 2} must be {top: K, replicates: R}") for e in errs), errs
    # a continuous key outside cem.* changes the baseline, which then has no value to run at
    doc = minimal(params={"cem.lambd": {"loguniform": [1, 64]}, "defense.noise_std": {"uniform": [0.01, 0.1]}})
    errs = errors_of(doc)
    assert any(e.startswith("params.defense.noise_std: changes the λ = 0 baseline") for e in errs), errs
    assert parse_space({**doc, "baseline": False}).baseline_replicates == 0     # allowed without a baseline


# ------------------------------------------------------------------ multi-objective early stopping
def test_a_scheduler_sets_the_probe_at_its_rungs():
    """scheduler: moasha: the rungs (Ray's ASHA arithmetic) become attack.probe_epochs, so every rung has the
    probe to rank by; the attack's SSIM is ranked by the probe, accuracy by itself; fifo is no scheduler."""
    spec = parse_space(minimal(fixed={"train.device": "cpu", "train.epochs": 20},
                               scheduler={"name": "moasha", "grace_epochs": 2, "reduction_factor": 3},
                               baseline=False, confirm=False))
    assert spec.scheduler == {"name": "moasha", "grace_epochs": 2, "reduction_factor": 3}
    assert spec.rungs == [2, 6, 18] and spec.fixed["attack.probe_epochs"] == [2, 6, 18]
    assert spec.rung_objectives == [("test_acc", "max", 0.1), ("probe_ssim", "min", 1.0)]
    from cem_bench.spaces import trial_config
    assert trial_config(spec, sample(spec, 1)[0])["attack.probe_epochs"] == [2, 6, 18]
    assert spec.to_dict()["scheduler"]["grace_epochs"] == 2
    assert parse_space(minimal(scheduler={"name": "fifo"})).scheduler is None
    assert parse_space(minimal()).scheduler is None
    # defaults, and a space's own probe epochs that cover the rungs are kept
    spec = parse_space(minimal(fixed={"train.device": "cpu", "train.epochs": 12,
                                      "attack.probe_epochs": [1, 2, 4, 6, 8]}, scheduler={"name": "moasha"}))
    assert spec.rungs == [2, 6] and spec.fixed["attack.probe_epochs"] == [1, 2, 4, 6, 8]


@pytest.mark.parametrize("changes, fragment", [
    ({"sampler": {"name": "grid"}, "num_samples": None, "params": {"cem.lambd": {"choice": [0, 8]}}},
     "the grid sampler runs every cell to the end"),
    ({"replicates": 3}, "replicates: 3 with a scheduler"),
    ({"objectives": [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_psnr", "mode": "min"}]},
     "objective attack_psnr has no per-epoch value"),
    ({"params": {"cem.lambd": {"loguniform": [1, 64]}, "train.epochs": {"choice": [4, 8]}}}, "train.epochs is searched"),
    ({"fixed": {"train.epochs": 2}}, "must be below train.epochs (2)"),
    ({"fixed": {"train.epochs": 20, "attack.probe_epochs": [2, 5]}}, "misses the scheduler's rung epochs [6, 18]"),
    ({"scheduler": {"name": "hyperband"}}, "known: fifo, moasha"),
    ({"scheduler": {"name": "moasha", "reduction_factor": 1}}, "must be a finite number > 1"),
    ({"scheduler": {"name": "moasha", "grace_epochs": 0}}, "must be an integer >= 1"),
])
def test_a_scheduler_without_a_sound_meaning_is_refused(changes, fragment):
    doc = minimal(scheduler={"name": "moasha", "grace_epochs": 2, "reduction_factor": 3}, baseline=False,
                  confirm=False)
    fixed = {"train.device": "cpu", **({} if "train.epochs" in changes.get("params", {}) else {"train.epochs": 20}),
             **changes.pop("fixed", {})}
    doc.update(changes, fixed=fixed)
    if doc.get("num_samples") is None:
        doc.pop("num_samples")
    errors = errors_of(doc)
    assert any(fragment in e for e in errors), errors


def test_a_metric_of_an_attack_the_trials_do_not_run_is_refused():
    """An objective on attack_ssim__rmle with attack.names [decoder] ran a whole search with nothing ranked
    (hypervolume 0, no line saying why); a hypothesis on it was "not tested" but counted in the family."""
    objectives = [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim__rmle", "mode": "min"}]
    doc = {"name": "t", "num_samples": 2, "params": {"cem.lambd": {"choice": [8, 16]}}, "objectives": objectives}
    with pytest.raises(SpaceError, match=r"objectives\[1\]\.metric: 'attack_ssim__rmle' is measured by attack "
                                         r"'rmle', which the trials do not run \(attack.names \['decoder'\]\)"):
        parse_space({**doc, "fixed": {"attack.names": ["decoder"]}})
    parse_space(doc)                                                                 # the default runs both
    grid = {"name": "g", "sampler": {"name": "grid"}, "replicates": 3, "fixed": {"attack.names": ["decoder"]},
            "params": {"cem.lambd": {"choice": [8, 16]}}, "objectives": [objectives[0], {"metric": "attack_ssim",
                                                                                          "mode": "min"}],
            "hypotheses": {"tests": [{"name": "h1", "metric": "attack_ssim__rmle", "a": {"cem.lambd": 16},
                                      "b": {"cem.lambd": 8}, "a_is": "lower"}]}}
    with pytest.raises(SpaceError, match=r"hypotheses\.tests\[0\]\.metric: 'attack_ssim__rmle' is measured by attack"):
        parse_space(grid)


@pytest.mark.parametrize("extra, says", [
    ({"sampler": {"name": "tpe", "seed": -5}}, "sampler.seed: -5 must be an integer from 0 to 2**32 - 1"),
    ({"sampler": {"name": "nsga2", "seed": 2 ** 32}}, "sampler.seed: 4294967296 must be an integer from 0"),
    ({"sampler": {"name": "grid", "seed": 1}}, "unknown option of sampler 'grid'; it takes no options"),
    ({"scheduler": {"name": "moasha", "reduction_factor": float("inf")}}, "inf must be a finite number > 1"),
    ({"resources": {"cpu": 0.00001}}, "resources.cpu: 1e-05 must be > 0 (CPUs per trial, 0.0001 or more"),
    ({"objectives": [{"metric": "test_acc", "mode": "min"}, {"metric": "attack_ssim", "mode": "min"}]},
     "test_acc is better when higher: its mode is max, not min"),
    ({"fixed": {"train.epochs": 3, "cem.surrogate": "gated_attention"}},
     "cem.warmup_epochs: 5 (surrogate 'gated_attention') is not below train.epochs 3, so the CEM loss would never"),
    # a zero fixed scale: bit-identical to λ = 0, recorded as λ 16 gmm (2026-12-07 audit)
    ({"fixed": {"cem.loss_scale": 0}}, "cem.loss_scale: 0 under cem.strength fixed (surrogate 'gmm') multiplies"),
])
def test_space_values_that_failed_later_or_silently_are_refused(extra, says):
    """Each was a traceback after Ray started (a seed of -5, η = inf, 1e-05 CPUs), a search for the worst
    classifier, or λ > 0 runs whose every epoch was a warm-up one (a λ = 0 run labelled "λ 16"): 2026-12-06."""
    doc = {"name": "t", "num_samples": 2, "params": {"cem.lambd": {"choice": [8, 16]}},
           "objectives": [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_ssim", "mode": "min"}]}
    with pytest.raises(SpaceError) as e:
        parse_space({**doc, **extra})
    assert says in str(e.value), str(e.value)
    parse_space({**doc, "fixed": {"train.epochs": 3, "cem.surrogate": "gated_attention", "cem.warmup_epochs": 2}})


def test_a_fixed_seed_beside_a_list_of_seeds_is_refused():
    """The trials ran the listed seeds, while search_space.json recorded fixed.seed 5 (2026-12-06 audit)."""
    errs = errors_of(minimal(seeds=[1, 2, 3], fixed={"seed": 5}))
    assert any(e.startswith("fixed.seed: 5, but seeds: [1, 2, 3] sets each run's seed") for e in errs), errs


def test_a_baseline_beside_lambda_fixed_at_zero_is_refused():
    """`demo.yaml --set cem.lambd=0` ran every search trial as an exact repeat of baseline seed 0 (2026-12-06)."""
    errs = errors_of(minimal(baseline={"replicates": 3}, fixed={"cem.lambd": 0, "train.device": "cpu"},
                             params={"defense.noise_std": {"choice": [0.05, 0.1]}}, num_samples=2))
    assert any(e.startswith("baseline: {replicates: 3} with cem.lambd fixed at 0") for e in errs), errs
    parse_space(minimal(fixed={"cem.lambd": 0, "train.device": "cpu"}, num_samples=2,     # left out: off
                        params={"defense.noise_std": {"choice": [0.05, 0.1]}}))


@pytest.mark.parametrize("params, most", [
    ({"cem.lambd": {"uniform": [8, 16], "step": 8}}, 2),
    ({"cem.surrogate": {"choice": ["gmm", "slot_cross"]},
      "cem.num_slots": {"int": [2, 3], "when": {"cem.surrogate": ["slot_cross"]}}}, 3)])
def test_the_distinct_count_knows_stepped_uniforms_and_conditional_ints(params, most):
    """A stepped uniform was not counted (λ 8 ran twice on seed 0), a conditional int was counted in the cells
    where it is not sampled (2026-12-06 audit)."""
    errs = errors_of(minimal(params=params, num_samples=most + 1))
    assert any(f"only {most} distinct configurations" in e for e in errs), errs
    parse_space(minimal(params=params, num_samples=most))
    parse_space(minimal(params={"seed": {"int": [0, 10 ** 9]}}, num_samples=5))   # counted, not listed


def test_a_name_yaml_read_as_a_number_says_to_quote_it():
    errs = errors_of(minimal(name=123))
    assert any("YAML read it as a number: quote it, name: \"123\"" in e for e in errs), errs


def test_a_cem_key_searched_with_lambda_fixed_at_zero_is_refused():
    """No surrogate runs at λ = 0: `cem.num_clusters: {choice: [2, 4, 8]}` beside a fixed `cem.lambd: 0` made three
    "distinct" configurations of one model, each trained again (2026-12-06: left alone the session before)."""
    errs = errors_of(minimal(fixed={"cem.lambd": 0, "train.device": "cpu"}, baseline=False, num_samples=3,
                             params={"cem.num_clusters": {"choice": [2, 4, 8]}}))
    assert any(e.startswith("params.cem.num_clusters: is searched with cem.lambd fixed at 0") for e in errs), errs
    # the same key beside a λ above 0, or a searched λ, or a non-cem key at λ = 0, stands
    parse_space(minimal(fixed={"cem.lambd": 8, "train.device": "cpu"}, num_samples=3,
                        params={"cem.num_clusters": {"choice": [2, 4, 8]}}))
    parse_space(minimal(params={"cem.lambd": {"choice": [0, 8]}, "cem.num_clusters": {"choice": [2, 4]}}))
    parse_space(minimal(fixed={"cem.lambd": 0, "train.device": "cpu"}, baseline=False, num_samples=2,
                        params={"defense.noise_std": {"choice": [0.05, 0.1]}}))


def test_a_searched_key_fixed_by_set_is_checked_only_at_its_pinned_value():
    """`--set cem.surrogate=gmm --set train.epochs=4` on a space searching gmm and gated_attention was refused
    for gated_attention's warm-up of 5 epochs, a surrogate no trial of the pinned search could draw."""
    doc = minimal(num_samples=2, params={"cem.surrogate": {"choice": ["gmm", "gated_attention"]},
                          "cem.lambd": {"choice": [8, 16]}},
                  fixed={"train.device": "cpu", "train.epochs": 6})
    spec = parse_space(doc, overrides={"fixed": {"cem.surrogate": "gmm", "train.epochs": 4}})
    assert spec.fixed["cem.surrogate"] == "gmm" and [p.key for p in spec.params] == ["cem.lambd"]
    msg = errors_of(doc, overrides={"fixed": {"cem.surrogate": "gated_attention", "train.epochs": 4}})
    assert any("cem.warmup_epochs: 5 (surrogate 'gated_attention') is not below train.epochs 4" in m for m in msg), msg


def test_two_searched_keys_that_disagree_are_refused_naming_the_cells():
    """Each searched value was checked alone, the other searched keys at their defaults: a grid of
    train.epochs [3, 20] x cem.warmup_epochs [0, 5], or slot_cross's num_heads [3, 4] x hidden_dim [64, 96],
    passed, and its bad cells ended as error rows after Ray started."""
    doc = minimal(sampler={"name": "grid"}, num_samples=None,
                  params={"train.epochs": {"choice": [3, 20]}, "cem.warmup_epochs": {"choice": [0, 5]}})
    msg = errors_of(doc)
    assert len(msg) == 1 and msg[0].startswith("params: 1 of the 4 combinations of the searched values make no "
                                               "valid configuration"), msg
    assert "train.epochs=3, cem.warmup_epochs=5: cem.warmup_epochs: 5" in msg[0], msg
    heads = minimal(num_samples=3, fixed={"train.device": "cpu", "cem.surrogate": "slot_cross"},
                    params={"cem.num_heads": {"choice": [3, 4]}, "cem.hidden_dim": {"choice": [64, 96]}})
    msg = errors_of(heads)
    assert "1 of the 4 combinations" in msg[0] and "cem.num_heads=3, cem.hidden_dim=64" in msg[0], msg
    # told how: search the key only where the other agrees
    heads["params"] = {"cem.hidden_dim": {"choice": [64, 96]},
                       "cem.num_heads": {"choice": [3], "when": {"cem.hidden_dim": [96]}}}
    heads["num_samples"] = 2
    assert parse_space(heads).params


def test_a_reference_point_no_trial_can_beat_is_refused():
    """`ref: 10` for test_acc (a percentage where a fraction is meant) was accepted: every hypervolume was 0, the
    confirmation fell back to the most accurate configurations and the report drew 0 without a word."""
    for i, ref, said in ((0, 10, "10 is not below test_acc's best possible value 1"),
                         (0, 1.0, "1 is not below test_acc's best possible value 1"),
                         (1, -1.0, "-1 is not above attack_ssim's best possible value -1")):
        doc = minimal()
        doc["objectives"][i]["ref"] = ref
        msg = errors_of(doc)
        assert msg == [f"objectives[{i}].ref: {said}" + msg[0].split(said, 1)[1]], msg
    doc = minimal()
    doc["objectives"][0]["ref"], doc["objectives"][1]["ref"] = 0.0, 0.99
    assert parse_space(doc).objectives[0].ref == 0.0


def test_the_cells_are_counted_with_when_and_a_continuous_range_does_not_turn_the_check_off():
    """The cell check compared the product of every key's values with its limit: a space whose keys are searched
    only `when` a surrogate is drawn (19,200 nominal cells, 84 real ones) was not checked, and one continuous
    range anywhere turned the check off for the choices beside it."""
    params = {"cem.surrogate": {"choice": ["gmm", "attention_centroid", "slot_cross"]},
              "cem.num_clusters": {"int": [2, 41], "when": {"cem.surrogate": ["gmm"]}},
              "cem.num_slots": {"int": [2, 41], "when": {"cem.surrogate": ["slot_cross"]}},
              "cem.num_heads": {"choice": [4, 3], "when": {"cem.surrogate": ["attention_centroid"]}},
              "cem.hidden_dim": {"choice": [64, 96], "when": {"cem.surrogate": ["attention_centroid"]}}}
    msg = errors_of(minimal(num_samples=20, params=params))
    assert "of the 84 combinations" in msg[0] and "cem.num_heads=3, cem.hidden_dim=64" in msg[0], msg
    heads = minimal(num_samples=3, fixed={"train.device": "cpu", "cem.surrogate": "slot_cross"},
                    params={"cem.num_heads": {"choice": [3, 4]}, "cem.hidden_dim": {"choice": [64, 96]},
                            "cem.lambd": {"uniform": [4, 32]}})
    msg = errors_of(heads)
    assert "cem.num_heads=3, cem.hidden_dim=64" in msg[0], msg


def test_the_confirmation_is_what_the_search_can_run():
    """A grid of 8 λ ≠ 0 cells with confirm top 20 promised "the best 20 again" (86 trials at most; 50 could run);
    with λ fixed at 0 the default confirmation was promised and then "nothing to confirm: none with λ ≠ 0
    finished" blamed runs that had all finished ok."""
    grid = minimal(sampler={"name": "grid"}, num_samples=None, confirm={"top": 20, "replicates": 3},
                   params={"cem.lambd": {"choice": [0, 4, 8, 16, 32]}, "cem.surrogate": {"choice": ["gmm", "slot_cross"]}})
    spec = parse_space(grid)
    assert spec.confirm_top == 8 and spec.confirm_runs == 24
    zero = minimal(fixed={"train.device": "cpu", "cem.lambd": 0}, baseline=False, num_samples=2,
                   params={"defense.noise_std": {"choice": [0.05, 0.1]}})
    assert parse_space(zero).confirm_top == 0                      # the default: off, not promised
    msg = errors_of({**zero, "confirm": {"top": 1, "replicates": 3}})
    assert any(m.startswith("confirm: ") and "with cem.lambd fixed at 0" in m for m in msg), msg


def test_a_grids_lambda_zero_cells_and_its_baseline_share_no_seed():
    """A single-seed grid with λ = 0 cells and the default baseline ran (σ, λ = 0, seed 0) twice per σ: the
    baseline's seeds began with the search's. They now begin after them."""
    spec = parse_space(minimal(sampler={"name": "grid"}, num_samples=None, confirm=False,
                               params={"defense.noise_std": {"choice": [0.05, 0.1]}, "cem.lambd": {"choice": [0, 8]},
                                       "cem.surrogate": {"choice": ["gmm", "slot_cross"],
                                                         "when": {"cem.lambd": [8]}}}))
    assert spec.search_seeds == (0,) and spec.baseline_seeds == (1, 2, 3)
    plain = parse_space(minimal(num_samples=2, confirm=False, params={"cem.lambd": {"choice": [4, 8]}}))
    assert plain.baseline_seeds == (0, 1, 2)        # no λ = 0 cells: the search's seed first, as before


@pytest.mark.parametrize("param, says", [
    ({"int": [2, 8], "step": 9}, "params.cem.num_clusters.step: 9 is wider than the range [2, 8]: only 2 could be "
                                 "drawn"),
    ({"uniform": [2, 8], "step": 7.5}, "7.5 is wider than the range [2, 8]"),
])
def test_a_step_wider_than_its_range_is_refused(param, says):
    """Listed as "2 to 8" while only 2 could ever be drawn (2026-12-07 probe)."""
    key = "cem.num_clusters" if "int" in param else "cem.lambd"
    assert says in "\n".join(errors_of(minimal(params={key: param})))
    ok = {**param, "step": 6 if "int" in param else 6.0}     # a step of the range's width: both ends
    assert parse_space(minimal(num_samples=2, params={key: ok}))


def test_a_stepped_range_lists_the_values_a_sampler_draws():
    """0 + 7·0.1 is 0.7000000000000001: listed so, the last value of [0, 0.7] step 0.1 lay outside the range,
    and a valid space was refused for it (defense.noise_std=10.000000000000002 of [1.05, 10] step 0.05)."""
    from cem_bench.spaces.parse_plan import as_choice
    spec = parse_space(minimal(num_samples=4, baseline=False, params={"defense.noise_std": {"uniform": [1.05, 10], "step": 0.05},
                                                      "cem.lambd": {"choice": [4, 8]}}))
    values = as_choice(next(p for p in spec.params if p.key == "defense.noise_std")).choices
    assert max(values) == 10.0 and len(values) == 180


def test_a_resumed_search_runs_its_trials_with_the_driver_s_execution_keys():
    """Every proposed configuration carries the fixed keys it was proposed with (confirmation runs copy them); a
    --resume that moved the data (data.root) or the device accepted the change and said the trials would run
    with it, while the restored and the later trials still ran with the old values, which beat the spec's."""
    import dataclasses
    spec = parse_space({"name": "s", "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.1},
                                                   {"metric": "attack_ssim", "mode": "min", "ref": 1.0}],
                        "sampler": {"name": "random", "seed": 0}, "num_samples": 2,
                        "fixed": {"data.root": "/old/data", "train.device": "cuda", "train.epochs": 3},
                        "params": {"cem.lambd": {"loguniform": [1, 64]}}})
    proposed = {**spec.fixed, "cem.lambd": 4.0, "seed": 1}        # what the pickled searcher hands Ray
    moved = dataclasses.replace(spec, fixed={**spec.fixed, "data.root": "/new/data", "train.device": "cpu"})
    flat = trial_config(moved, proposed)
    assert (flat["data.root"], flat["train.device"]) == ("/new/data", "cpu")
    assert (flat["cem.lambd"], flat["seed"], flat["train.epochs"]) == (4.0, 1, 3)


def test_a_surrogate_key_no_surrogate_of_the_space_reads_is_refused():
    """gmm with a searched cem.num_slots (a slot key, no `when`) ran "2 configurations" that were one run twice,
    one config_id (2026-12-07 audit). Where a surrogate of the space reads it, or a `when` puts it with one, it
    stands; a fixed one stays allowed (test_surrogate_specific_key_for_other_surrogate_is_allowed: a space
    switched with `--set cem.surrogate=...` keeps its fixed keys)."""
    errs = errors_of(minimal(fixed={"train.device": "cpu", "cem.surrogate": "gmm"},
                             params={"cem.lambd": {"choice": [8]}, "cem.num_slots": {"int": [2, 4]}}))
    assert any(e.startswith("params.cem.num_slots: is read by attention_centroid, serial_enhanced, slot_cross, and "
                            "this space runs it with cem.surrogate gmm only") for e in errs), errs
    errs = errors_of(minimal(fixed={"train.device": "cpu", "cem.surrogate": "slot_cross"},
                             params={"cem.lambd": {"loguniform": [1, 64]}, "cem.num_clusters": {"int": [2, 4]}}))
    assert any(e.startswith("params.cem.num_clusters: is read by gmm, and this space runs it with cem.surrogate "
                            "slot_cross only") for e in errs), errs
    errs = errors_of(minimal(params={"cem.lambd": {"loguniform": [1, 64]},
                                     "cem.surrogate": {"choice": ["gmm", "slot_cross"]},
                                     "cem.num_clusters": {"int": [2, 4], "when": {"cem.surrogate": ["slot_cross"]}}}))
    assert any(e.startswith("params.cem.num_clusters: is read by gmm, and this space runs it with cem.surrogate "
                            "slot_cross only") for e in errs), errs
    # read by one of the space's surrogates: fine, fixed or searched
    parse_space(minimal(fixed={"train.device": "cpu", "cem.num_clusters": 3},
                        params={"cem.lambd": {"loguniform": [1, 64]}, "cem.surrogate": {"choice": ["gmm", "slot_cross"]},
                                "cem.num_slots": {"int": [2, 4], "when": {"cem.surrogate": ["slot_cross"]}}}))
