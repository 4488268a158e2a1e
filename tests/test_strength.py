"""cem.strength=matched (cem_bench/core/strength.py): a trial matches gmm's pull on its own encoder, leaves no other
trace, keeps the scale through a resume, records it; calibrate reports the same scale; fused terms follow s(η)."""

import math

import pytest
import torch
from conftest import TINY, make_trainer

from cem_bench import calibrate
from cem_bench.config import ConfigError, TrialConfig
from cem_bench.core.schedule import inject_scale, lr_at
from cem_bench.core.trial import run_trial
from cem_bench.surrogates import resolve

SMALL = {**TINY, "model.width": 0.0625, "train.epochs": 3, "attack.names": ["rmle"]}


def test_strength_resolves_matched_fixed_and_the_reference():
    cem = lambda **flat: resolve(TrialConfig.from_flat(flat)).cem  # noqa: E731
    assert (cem(**{"cem.surrogate": "slot_cross"}).strength, cem(**{"cem.surrogate": "slot_cross"}).loss_scale) \
        == ("matched", None)
    by_hand = cem(**{"cem.surrogate": "slot_cross", "cem.loss_scale": 2.0})      # a scale set by hand is fixed
    assert (by_hand.strength, by_hand.loss_scale) == ("fixed", 2.0)
    ref = cem(**{"cem.surrogate": "gmm", "cem.strength": "matched"})     # the reference: matched to itself
    assert (ref.strength, ref.loss_scale) == ("fixed", 1.0)
    # another gmm pulls otherwise per unit λ: matched to the reference, as an attention surrogate is
    for keys in ({"cem.num_clusters": 1}, {"cem.grad_mode": "fused"}, {"cem.entropy": "diag"}):
        other = cem(**{"cem.surrogate": "gmm", "cem.strength": "matched", **keys})
        assert (other.strength, other.loss_scale) == ("matched", None), keys
    assert cem(**{"cem.surrogate": "gmm", "cem.num_clusters": 1}).strength == "fixed"   # gmm's default: fixed
    same = cem(**{"cem.surrogate": "gmm", "cem.strength": "matched", "cem.num_clusters": 5, "cem.grad_mode": "inject"})
    assert (same.strength, same.loss_scale) == ("fixed", 1.0)         # its defaults spelled out: the reference
    with pytest.raises(ConfigError, match="cem.strength=fixed to use your scale"):
        cem(**{"cem.surrogate": "slot_cross", "cem.strength": "matched", "cem.loss_scale": 2.0})
    again = resolve(resolve(TrialConfig.from_flat({"cem.surrogate": "attention_centroid"})))   # resolved twice
    assert (again.cem.strength, again.cem.loss_scale) == ("matched", None)


def test_a_matched_trial_equals_the_fixed_trial_at_the_scale_it_measured():
    """The match leaves no trace (BatchNorm statistics, modes, the trainer's and the surrogate's streams): a
    matched trial and a fixed one at the scale it measured train identically, epoch by epoch."""
    flat = {**SMALL, "cem.surrogate": "slot_cross", "cem.warmup_epochs": 1}
    matched = run_trial(flat)
    assert matched["cem_strength"] == "matched" and matched["cem_strength_epoch"] == 2
    scale = matched["cem_loss_scale"]
    assert scale == pytest.approx(matched["cem_strength_gmm"] / matched["cem_strength_own"])
    fixed = run_trial({**flat, "cem.strength": "fixed", "cem.loss_scale": scale})
    assert fixed["cem_strength"] == "fixed" and fixed["cem_loss_scale"] == scale
    keys = ("train_loss", "train_acc", "rob_loss", "test_acc", "feature_spread")
    for a, b in zip(matched["info"]["history"], fixed["info"]["history"]):
        for k in keys:
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), (a["epoch"], k)


@pytest.mark.parametrize("name, keys", [("slot_cross", {}), ("attention_centroid", {"cem.grad_mode": "fused"})])
def test_calibrate_reports_the_scale_a_matched_trial_uses(name, keys):
    """At warm-up w, calibrate's matched_loss_scale is the scale a trial with cem.warmup_epochs = w measures
    (the λ = 0 encoder after w epochs is the CEM trial's before its first CEM epoch), whatever cem.* keys are
    set: a trial matches gmm at its own defaults, and so does calibrate (a fused grad_mode was also given to
    its gmm until 2026-12-06, and the scale it reported was 10x the trial's)."""
    flat = {k: v for k, v in SMALL.items() if not k.startswith("attack.")}
    rows = calibrate.table(calibrate.measure({**flat, **keys}, [name], warmup=[1], batches=2))
    row = next(r for r in rows if r["surrogate"] == name)
    trial = run_trial({**SMALL, **keys, "cem.surrogate": name, "cem.warmup_epochs": 1})
    assert trial["cem_loss_scale"] == pytest.approx(row["matched_loss_scale"], rel=1e-5)
    assert 0.5 < row["matched_ratio"] < 2          # on held-out batches, not the ones it was matched on


@pytest.mark.parametrize("warmup", [1, 0])
def test_a_gmm_variant_is_matched_to_the_reference_gmm(warmup):
    """gmm with one cluster, fused, under cem.strength=matched: its scale is the reference gmm's pull over its own
    on the same encoder (a fused term at c = 1, the reference injected at s(η)), measured on its first fit also
    where CEM starts at epoch 1 (no warm-up epoch's end refitted it: its pull measured on empty tables was 0)."""
    flat = {**SMALL, "cem.surrogate": "gmm", "cem.num_clusters": 1, "cem.grad_mode": "fused",
            "cem.strength": "matched", "cem.warmup_epochs": warmup}
    res = run_trial(flat)
    assert res["cem_strength"] == "matched" and res["cem_strength_epoch"] == warmup + 1
    assert res["cem_strength_own"] > 0 and res["cem_strength_gmm"] > 0
    assert res["cem_loss_scale"] == pytest.approx(res["cem_strength_gmm"] / res["cem_strength_own"])
    # a fused term at c = 1 against the reference's s(η) = 0.001/η: the scale is far from 1
    assert res["cem_loss_scale"] < 0.1


def test_the_matched_scale_survives_a_resume_unmeasured():
    tr = make_trainer(**{"cem.surrogate": "slot_cross", "cem.warmup_epochs": 1, "model.width": 0.0625})
    for epoch in (1, 2):
        tr.train_epoch(epoch)
        tr.epoch = epoch
    assert not tr.matcher.pending and tr.matcher.record["cem_strength_epoch"] == 2
    state = tr.state_dict()
    other = make_trainer(**{"cem.surrogate": "slot_cross", "cem.warmup_epochs": 1, "model.width": 0.0625})
    other.load_state_dict(state)
    assert other.matcher.scale == tr.matcher.scale and not other.matcher.pending
    assert other.matcher.record == tr.matcher.record
    assert other.matcher.scale_t.item() == pytest.approx(tr.matcher.scale)
    other.matcher.match = lambda *a: pytest.fail("a resumed trial re-measured its scale")
    other.train_epoch(3)


def test_a_matched_fused_term_follows_the_schedule_as_the_injected_ones_do():
    flat = {"cem.surrogate": "attention_centroid", "cem.warmup_epochs": 1, "train.epochs": 8,
            "train.milestones": [0.5], "model.width": 0.0625}
    matched, fixed = make_trainer(**flat), make_trainer(**{**flat, "cem.strength": "fixed"})
    cfg = matched.cfg
    first, late = lr_at(cfg, 2), lr_at(cfg, 8)
    assert late < first
    scale = lambda tr, lr: math.prod(tr.cem_scales(lr))  # noqa: E731  (weight · mult: the encoder's share)
    assert scale(matched, first) == pytest.approx(16.0)
    assert scale(matched, late) == pytest.approx(16.0 * inject_scale(late) / inject_scale(first))
    assert scale(fixed, late) == pytest.approx(16.0)        # the design notes' CE + λ·L


def test_the_trial_result_records_the_scale_and_where_it_came_from():
    res = run_trial({**SMALL, "cem.surrogate": "gated_attention", "cem.warmup_epochs": 1})
    assert res["cem_strength"] == "matched" and res["cem_strength_batches"] == SMALL["cem.strength_batches"]
    assert TrialConfig.from_flat({}).cem.strength_batches == 64    # the default (TINY lowers it for speed)
    assert res["cem_loss_scale"] > 0 and 0 <= res["cem_strength_spread"] < 1
    gmm = run_trial({**SMALL, "cem.surrogate": "gmm"})
    assert (gmm["cem_strength"], gmm["cem_loss_scale"]) == ("fixed", 1.0)
    base = run_trial({**SMALL, "cem.lambd": 0.0})
    assert "cem_loss_scale" not in base
    assert torch.isfinite(torch.tensor(res["cem_strength_gmm"]))


def test_strength_every_matches_again_on_the_encoder_as_it_is_then():
    """cem.strength_every = 1: a match at the start of every CEM epoch; each epoch's record carries the scale
    its steps used, and the result the first, the range and the count."""
    res = run_trial({**SMALL, "train.epochs": 4, "cem.surrogate": "slot_cross", "cem.warmup_epochs": 1,
                     "cem.strength_every": 1, "cem.strength_batches": 8})
    assert res["cem_strength_batches"] == 8                # cem.strength_batches: what a match averages
    hist = res["info"]["history"]
    used = [r["cem_loss_scale"] for r in hist if r["cem_active"]]
    assert len(used) == 3 and res["cem_strength_matches"] == 3 and res["cem_strength_epoch"] == 2
    assert res["cem_loss_scale_first"] == used[0] and res["cem_loss_scale"] == used[-1]
    assert res["cem_loss_scale_min"] == min(used) and res["cem_loss_scale_max"] == max(used)
    assert len(set(used)) == 3                    # measured on three different encoders
    assert "cem_loss_scale" not in hist[0]        # the warm-up epoch has no CEM term


def test_a_later_match_keeps_its_scale_where_gmm_pulls_no_more(monkeypatch):
    """Every class below gmm's hinge at a later match: no pull to match; the scale is kept (the first match
    would fail with a message that says what to set)."""
    from cem_bench.core import strength
    tr = make_trainer(**{"cem.surrogate": "slot_cross", "cem.warmup_epochs": 1, "model.width": 0.0625,
                         "cem.strength_every": 1, "train.epochs": 3})
    tr.train_epoch(1)
    tr.train_epoch(2)
    first = tr.matcher.scale
    real = strength.per_batch_many

    def gmm_pulls_nothing(client, server, modules, *a, **k):
        return [[0.0] * len(v) if m.cfg.surrogate == "gmm" else v
                for m, v in zip(modules, real(client, server, modules, *a, **k))]
    monkeypatch.setattr(strength, "per_batch_many", gmm_pulls_nothing)
    tr.train_epoch(3)
    assert tr.matcher.scale == first and tr.matcher.record["cem_strength_matches"] == 2
    assert tr.matcher.record["cem_strength_gmm"] == 0.0
    fresh = make_trainer(**{"cem.surrogate": "slot_cross", "cem.warmup_epochs": 1, "model.width": 0.0625})
    fresh.train_epoch(1)
    with pytest.raises(strength.NoStrength, match="set cem.strength=fixed and a cem.loss_scale"):
        fresh.train_epoch(2)


def test_one_pass_for_all_surrogates_gives_each_one_s_own_values():
    """calibrate measures every surrogate in one pass (``per_batch_many``: the client's forward and ∂CE/∂z once a
    batch): the values are those of one ``per_batch`` call a surrogate from the same start, to the last bit,
    with the server's dropout drawing masks and the attention surrogates drawing from their own streams."""
    from conftest import build_tiny

    from cem_bench.core import strength
    from cem_bench.core.trial import build_config
    from cem_bench.surrogates import names as surrogate_names
    cfg, splits, trainer = build_tiny(**{"model.width": 0.0625})
    trainer.train_epoch(1)
    assert any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in trainer.server.modules())
    feats = trainer.encode(splits.train)
    names = surrogate_names()
    modules = [calibrate._surrogate_module(build_config({**TINY, "model.width": 0.0625, "cem.surrogate": n,
                                                         "cem.lambd": 1.0, "cem.strength": "fixed"}),
                                           splits, torch.device("cpu"), feats, splits.train.labels) for n in names]
    batches = strength.fixed_batches(cfg, splits, 3)
    cs = [0.5 + i for i in range(len(names))]
    client, server = trainer.client, trainer.server
    one_by_one = []
    for module, c in zip(modules, cs):
        with strength.untouched(client, server, *modules):
            one_by_one.append(strength.per_batch(client, server, module, batches, 0.1, c, 1.0, 7))
    with strength.untouched(client, server, *modules):
        together = strength.per_batch_many(client, server, modules, batches, 0.1, cs, noise_seed=7)
    assert together == one_by_one and all(v > 0 for vs in together for v in vs), (names, together, one_by_one)


def test_a_set_loss_scale_moves_the_surrogate_not_the_reference():
    """calibrate with cem.loss_scale L: the surrogate's fixed ratio to gmm grows with L and the loss scale that
    matches gmm does not (until 2026-12-06 gmm took L too: the ratio stood still and --yaml wrote 4x the
    matching scale at L = 2 than at L = 0.5)."""
    flat = {k: v for k, v in SMALL.items() if not k.startswith("attack.")}
    rows = {L: next(r for r in calibrate.table(calibrate.measure({**flat, "cem.loss_scale": L}, ["gated_attention"],
                                                                 warmup=[1], batches=2))
                    if r["surrogate"] == "gated_attention") for L in (0.5, 2.0)}
    assert rows[2.0]["fixed_ratio_to_gmm"] == pytest.approx(4 * rows[0.5]["fixed_ratio_to_gmm"], rel=1e-6)
    assert rows[2.0]["matching_loss_scale"] == pytest.approx(rows[0.5]["matching_loss_scale"], rel=1e-6)


def test_calibrate_says_when_gmm_has_no_pull_and_writes_no_infinite_scale():
    flat = {k: v for k, v in SMALL.items() if not k.startswith("attack.")}
    with pytest.raises(ConfigError, match="gmm's pull at warm-up 1 is 0 .*nothing to match"):
        calibrate.measure({**flat, "cem.var_threshold": 1e6}, ["slot_cross"], warmup=[1], batches=2)
    rec = {"warmup": 1, "strength": 0.0, "matching_loss_scale": math.inf}
    text = calibrate.yaml_fragment([{**rec, "surrogate": "gmm", "strength": 1.0, "matching_loss_scale": 1.0},
                                    {**rec, "surrogate": "slot_cross"},
                                    {**rec, "surrogate": "gated_attention", "strength": math.nan,
                                     "matching_loss_scale": math.nan}])
    assert "gmm: {cem.surrogate: gmm, cem.strength: fixed, cem.loss_scale: 1, cem.warmup_epochs: 1}" in text
    assert "loss_scale: inf" not in text and "loss_scale: nan" not in text
    assert "# slot_cross: no scale matches" in text and "# gated_attention: no scale matches" in text
