"""How strongly one unit of λ pulls on the encoder, per surrogate: the measure behind one λ scale for all five.

The CEM strength of a configuration at a state of the encoder is the ratio of the norm of the gradient that
the CEM term sends into the client's features z to the norm of the cross-entropy's gradient there, per unit
λ, exactly as the trainer applies it (``Trainer.cem_scales``): the encoder descends CE + λ·c·loss_scale·L
with c = s(η) (``inject``, η the scheduled rate of the first CEM epoch) or 1 (``fused``); the adversarial
sign only turns the estimator's own update around, not the encoder's. So

    strength = c · loss_scale · ‖∂L/∂z‖ / ‖∂CE/∂z‖,   averaged over a few batches,

measured on the states of one λ = 0 reference run: the encoder (and server) after a number of warm-up epochs,
the surrogate's own parameters at their initial values (gmm: refitted on that encoder's clean training
features, as the trainer does before its first CEM epoch). By default each surrogate is measured after its own
resolved ``cem.warmup_epochs`` (gated_attention 5, slot_cross 3, the others 1 unless set): the state at which a
matched trial of it measures its scale, at its first CEM epoch; gmm, the reference, at every state used.
``gmm`` is the reference: the paper's λ keeps its meaning. The others' fixed ``cem.loss_scale`` defaults (used
under ``cem.strength: fixed``) were set so that their strength is within a factor of 1.5 of gmm's at one
reference state on the synthetic data (width 0.25, σ 0.1, warm-up 3); elsewhere they drift (0.23-35× over the
states docs/estimators.md, "One λ scale", measured), which is why ``matched``, the attention surrogates'
default, measures the ratio in every trial and is what this command's held-out match checks.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from dataclasses import dataclass

import torch

from . import surrogates
from .config import CemConfig, ConfigError, TrialConfig
from .core import strength
from .core.runtime import resolve_device
from .core.schedule import inject_scale, lr_at
from .core.trial import build, build_config
from .surrogates import names as surrogate_names

REFERENCE = strength.REFERENCE
MATCH_LAMBDA = 16.0      # the paper's λ that the table translates
# --batches: every held-out batch is built up front and kept in memory (on the run's device) for all the states
# measured, so the count has a cap. 256 is 4x the match's own default (cem.strength_batches 64): the check's
# error (falling with 1/√n) is then half the match's it checks, and more batches only cost memory and time.
MAX_BATCHES = 256
# cem.* keys that calibrate itself reads or that the reference (gmm at its own defaults) takes: any other cem.*
# key set is not applied to the gmm row, and the output says so
_REFERENCE_READS = ("cem.surrogate", "cem.lambd", "cem.strength", "cem.var_threshold", "cem.var_eps",
                    "cem.warmup_epochs", "cem.strength_batches", "cem.strength_every")


@dataclass
class Strength:
    surrogate: str
    strength: float            # per unit λ at the fixed loss_scale; over several seeds, their geometric mean
    loss_scale: float          # the surrogate's fixed cem.loss_scale (its default, or the one set)
    grad_mode: str
    spread: float              # between batches: std of the per-batch strengths, relative to their mean
    per_seed: tuple[float, ...] = ()   # the strength at each reference state (one per seed)
    warmup: int = 2            # epochs of the λ = 0 reference run
    # cem.strength=matched, per seed: the ratio to gmm, on held-out batches, of the scale a trial matches here
    matched: tuple[float, ...] = ()
    # per seed: the ratio to gmm here of the scale matched at the surrogate's first warm-up measured (the drift
    # of a match made at the first CEM epoch as training goes on, the fused term following s(η) as the trainer
    # applies it)
    drift: tuple[float, ...] = ()
    matched_scale: tuple[float, ...] = ()   # per seed: the loss_scale a matched trial would use here
    mode: str = "fixed"        # cem.strength of a trial of this configuration: what its λ means
    # the surrogate's own resolved cem.warmup_epochs: where a trial of this configuration has its first CEM epoch
    own_warmup: int | None = None

    def ratio(self, reference: Strength) -> float:
        return self.strength / reference.strength

    def matching_lambda(self, reference: Strength, lambd: float = MATCH_LAMBDA) -> float:
        return lambd * reference.strength / self.strength

    def matching_loss_scale(self, reference: Strength) -> float:
        return self.loss_scale * reference.strength / self.strength


def geo(values) -> float:
    """The geometric mean (0 when a value is 0; NaN when one is negative or not finite, or none is given)."""
    values = list(values)
    if not values or not all(v >= 0 and math.isfinite(v) for v in values):
        return math.nan
    if any(v == 0 for v in values):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def median(values) -> float:
    """The median (NaN when none is given or one is NaN, which has no place in the order; an infinite ratio,
    a surrogate with no pull at one seed, is one more outlier). Beside the geometric mean because one seed's
    state can move that by a factor: gmm's hinge can cut gmm's own strength at one seed's λ = 0 encoder, and
    the inject surrogates' ratio there was 5.4 where the other seeds gave 0.9-1.1 (docs/estimators.md)."""
    values = list(values)
    if not values or any(math.isnan(v) for v in values):
        return math.nan
    return statistics.median(values)


def _surrogate_module(cfg, splits, device, features, labels):
    """The surrogate of ``cfg`` as ``trial.build`` makes it (its own seeded init), refitted on ``features``
    when it refits (gmm), as the trainer does before its first CEM epoch."""
    fshape = tuple(features.shape[1:])
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(int(cfg.seed) + 7919)
        module = surrogates.build(cfg, fshape, splits.num_classes).to(device)
    if module.needs_refit:
        module.refit(features, labels)
    return module


@dataclass
class Plan:
    """One seed's measurement, every configuration in it validated before any training."""
    keys: dict                    # the keys given (seed included)
    names: list[str]              # gmm first
    at: dict[str, list[int]]      # per surrogate: the warm-ups it is measured after (gmm: every one used)
    own: dict[str, int]           # per surrogate: its own resolved cem.warmup_epochs
    given: list[int] | None       # --warmup as given (None: each surrogate's own)
    cfgs: dict[str, TrialConfig]  # each at its fixed scale; gmm as a matched trial's reference
    modes: dict[str, str]         # cem.strength of a trial of each
    run_cfg: TrialConfig          # the λ = 0 reference run
    ref_cfg: TrialConfig          # gmm with the user's keys: schedule, seed, noise, the match's batches
    batches: int
    not_applied: dict[str, list[str]]   # cem.* keys set that gmm's row does not take -> the surrogates that do

    @property
    def states(self) -> list[int]:
        return sorted({w for ws in self.at.values() for w in ws})


def plan(flat: dict, surrogates_: list[str] | None = None, warmup: int | list[int] | None = None,
         batches: int = 32, seeds: list[int] | None = None) -> list[Plan]:
    """What ``measure`` does, one ``Plan`` per seed (``seeds``; default the config's seed alone), every seed's
    configuration validated here, before the first reference run trains. ``warmup`` None: each surrogate after
    its own resolved ``cem.warmup_epochs`` (gmm, the reference, after each of them), the state where a matched
    trial of it measures its scale; a number or a list: every surrogate after each of them."""
    plans = []
    for s in seeds or [None]:
        try:
            plans.append(_plan(flat if s is None else {**flat, "seed": s}, surrogates_, warmup, batches))
        except ConfigError as e:
            if s is None:
                raise
            raise ConfigError(f"--seeds {s}: {e}") from e
    return plans


# keys calibrate sets itself: given, they were taken silently and written into the --json file's keys as if
# measured (2026-12-07 probe: cem.lambd 7 beside a reference run at 0)
NOT_CALIBRATES = {"cem.lambd": "calibrate measures the strength per unit λ (a λ = 0 reference run, each surrogate "
                               "at λ 1): no λ of yours enters it",
                  "cem.surrogate": "give the surrogates to measure with --surrogates"}


def _plan(flat: dict, surrogates_, warmup, batches) -> Plan:
    ignored = [k for k in flat if k in NOT_CALIBRATES or k.startswith("attack.")]
    if ignored:
        k = ignored[0]
        raise ConfigError(f"calibrate does not take {k}: " + NOT_CALIBRATES.get(k, "calibrate runs no attack") +
                          (f" (also given: {', '.join(ignored[1:])})" if ignored[1:] else "") +
                          "; leave it out of --set and --config")
    names = list(surrogates_ or surrogate_names())
    known = surrogate_names()
    bad = [n for n in names if n not in known]
    if bad:
        raise ConfigError(f"unknown surrogate(s) {', '.join(map(repr, bad))}; known: {', '.join(known)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:   # each would be measured and written twice: one row, one entry a surrogate
        raise ConfigError(f"--surrogates: {', '.join(twice)} given more than once; give each surrogate once")
    names = [REFERENCE] + [n for n in names if n != REFERENCE]
    if not 1 <= batches <= MAX_BATCHES:
        raise ConfigError(f"calibrate: {batches} held-out batches; give 1 to {MAX_BATCHES} (every batch is kept in "
                          f"memory for the whole run, and {MAX_BATCHES}, 4x a match's default 64, already checks a "
                          f"match to half its own error)")
    given = None if warmup is None else sorted(set([warmup] if isinstance(warmup, int) else warmup))
    if given is not None and (not given or given[0] < 0):
        raise ConfigError(f"calibrate: warm-up epochs must be 0 or more (got {given})")
    base = {k: v for k, v in flat.items() if k not in ("cem.surrogate", "cem.lambd", "cem.strength")}
    # how a trial of this configuration runs (cem.strength and cem.warmup_epochs, as flat sets them or the
    # surrogate's defaults)
    trials = {n: build_config({**flat, "cem.surrogate": n, "cem.lambd": 1.0}) for n in names}
    modes = {n: c.cem.strength for n, c in trials.items()}
    # gmm's row is the reference (below), fixed at 1 whatever gmm keys are set: a gmm of other keys asked
    # cem.strength=matched is matched to that row, not measured in it (not_applied names its keys)
    modes[REFERENCE] = "fixed"
    own = {n: int(c.cem.warmup_epochs or 0) for n, c in trials.items()}
    # the fixed scale: the surrogate's default unless flat sets cem.loss_scale (validated before any training)
    cfgs = {n: build_config({**base, "cem.surrogate": n, "cem.lambd": 1.0, "cem.strength": "fixed"})
            for n in names}
    ref_cfg = cfgs[REFERENCE]
    # gmm as a matched trial measures it (strength.reference_config: its own defaults, the user's hinge): the
    # user's cem.grad_mode or cem.loss_scale had changed calibrate's reference and not a trial's (a fused run's
    # scale reported 10x the one its trial used; a set loss_scale moved gmm with the surrogate)
    cfgs[REFERENCE] = strength.reference_config(ref_cfg)
    fields = {f.name for f in dataclasses.fields(CemConfig)} - {"params"}
    not_applied = {k: [n for n in names[1:] if k[4:] in fields or k[4:] in cfgs[n].cem.params]
                   for k in flat if k.startswith("cem.") and k not in _REFERENCE_READS}
    if given is None:
        # gmm at the others' warm-ups (their ratios to it), and at its own only where it is all that is measured
        others = {own[n] for n in names[1:]}
        at = {n: [own[n]] for n in names[1:]}
        at = {REFERENCE: sorted(others or {own[REFERENCE]}), **at}
    else:
        at = {n: list(given) for n in names}
    epochs = ref_cfg.train.epochs
    # gmm last: it is measured at the others' warm-ups, and a too-long one is theirs to name
    for n in [*names[1:], names[0]]:
        if at[n][-1] >= epochs:
            if given is not None:
                raise ConfigError(f"calibrate: warm-up {given[-1]} leaves no CEM epoch of train.epochs={epochs}; "
                                  f"measure at fewer warm-up epochs or set a longer schedule")
            why = "as set" if "cem.warmup_epochs" in flat else "its default"
            raise ConfigError(f"calibrate: {n}'s own warm-up, cem.warmup_epochs {at[n][-1]} ({why}), leaves no CEM "
                              f"epoch of train.epochs={epochs}: a trial of it would never apply CEM. Set "
                              f"train.epochs above {at[n][-1]}, a smaller cem.warmup_epochs, leave {n} out "
                              f"(--surrogates) or give --warmup")
    run_cfg = build_config({**base, "cem.lambd": 0.0})
    return Plan(dict(flat), names, at, own, given, cfgs, modes, run_cfg, ref_cfg, batches, not_applied)


def describe(plans: list[Plan]) -> list[str]:
    """What ``plans`` measure, for the banner before the work: the warm-ups (whose and why), the seeds, the
    batches; where an explicit warm-up is not a surrogate's own, and which cem.* keys the gmm row does not take."""
    p = plans[0]
    seeds = ", ".join(str(q.run_cfg.seed) for q in plans)
    lines = []
    if p.given is None:
        own = ", ".join(f"{n} {p.own[n]}" for n in p.names[1:]) or "none besides gmm"
        lines.append(f"the λ = 0 encoder after each surrogate's own warm-up (cem.warmup_epochs: {own}), where a "
                     f"matched trial of it measures its scale; gmm, the reference, after each of "
                     f"{', '.join(map(str, p.at[REFERENCE]))} (its own: {p.own[REFERENCE]})")
    else:
        lines.append(f"the λ = 0 encoder after {', '.join(map(str, p.given))} epoch(s) (--warmup), every surrogate")
        differ = [f"{n} ({p.own[n]})" for n in p.names[1:] if p.own[n] not in p.given]
        if differ:
            lines.append(f"--warmup {' '.join(map(str, p.given))} does not include the own warm-up (cem.warmup_epochs) "
                         f"of {', '.join(differ)}: a trial of it at these keys has its first CEM epoch, and matches, "
                         f"after its own; leave --warmup out to measure each there")
    lines.append(f"one λ = 0 reference run of {p.states[-1]} epoch(s) per seed (seed {seeds}); a match of "
                 f"{p.ref_cfg.cem.strength_batches} batch(es) (cem.strength_batches), checked on {p.batches} "
                 f"held-out batch(es)")
    for k, takers in p.not_applied.items():
        lines.append(f"{k}={p.keys[k]} is not applied to the gmm row: it is the reference a matched trial "
                     f"measures against, gmm at its own defaults with your cem.var_threshold and cem.var_eps; "
                     f"{'applied to ' + ', '.join(takers) if takers else 'no surrogate measured takes it'}")
    return lines


def measured_config(plans: list[Plan], provenance: dict) -> dict:
    """What was measured, for the ``--json`` and ``--yaml`` files: where and with which code (``provenance``: the
    ``package_version``, ``git_sha``, ``time`` and ``device`` every trial result records, which the command
    line gathers), the keys given and the full configuration of the λ = 0 reference run (its seed the first of
    the seeds), seeds, warm-ups and batches."""
    p = plans[0]
    return {"command": "cem-bench calibrate", **provenance,
            "keys": {k: v for k, v in p.keys.items() if k != "seed"}, "config": p.run_cfg.to_flat(),
            "seeds": [q.run_cfg.seed for q in plans], "warmup_given": p.given, "warmups": p.at, "own_warmups": p.own,
            "batches": p.batches, "strength_batches": p.ref_cfg.cem.strength_batches,
            "reference": {"surrogate": REFERENCE, "cem.var_threshold": p.ref_cfg.cem.var_threshold,
                          "cem.var_eps": p.ref_cfg.cem.var_eps, "not_applied": sorted(p.not_applied)}}


def measure(flat: dict, surrogates_: list[str] | None = None, warmup: int | list[int] | None = None,
            batches: int = 32, device: str | None = None, seeds: list[int] | None = None) -> list[Strength]:
    """The strength of each surrogate (``surrogates_``: default all registered, gmm first) on ``flat``'s
    configuration (dataset, width, σ, batch, ...) after each of its warm-ups (``plan``: by default its own
    ``cem.warmup_epochs``; with ``warmup``, each of those epoch counts) of one λ = 0 reference run (rows in
    warm-up order, gmm first in each). ``strength`` is the fixed scale's (``cem.loss_scale``: the surrogate's
    default unless ``flat`` sets it); ``matched`` is the ratio to gmm of ``cem.strength=matched`` (the scale a
    trial would measure at this state on its own batches, checked on ``batches`` held-out ones); ``drift`` that
    of the scale matched at the surrogate's first warm-up measured, applied here. With ``seeds``, one reference
    run per seed (every seed validated first) and the geometric mean of the strengths (so the ratio to gmm is
    the geometric mean of the per-seed ratios): gmm's hinge makes its strength depend on the state by a factor
    of about 2 between seeds."""
    runs = [_measure_one(p, device) for p in plan(flat, surrogates_, warmup, batches, seeds)]
    if len(runs) == 1:
        return runs[0]
    out = []
    for rows in zip(*runs):
        out.append(Strength(rows[0].surrogate, geo(r.strength for r in rows), rows[0].loss_scale,
                            rows[0].grad_mode, max(r.spread for r in rows), tuple(r.strength for r in rows),
                            rows[0].warmup, tuple(r.matched[0] for r in rows), tuple(r.drift[0] for r in rows),
                            tuple(r.matched_scale[0] for r in rows), rows[0].mode, rows[0].own_warmup))
    return out


def _measure_one(p: Plan, device: str | None) -> list[Strength]:
    ref_cfg, cfgs = p.ref_cfg, p.cfgs
    dev = resolve_device(device or ref_cfg.train.device)
    splits, trainer = build(p.run_cfg, dev)
    # the batches a matched trial measures on (strength.match), and held-out ones to check its scale on
    match_batches = strength.fixed_batches(ref_cfg, splits, ref_cfg.cem.strength_batches)
    check = strength.fixed_batches(ref_cfg, splits, p.batches, strength.CHECK_SEED)
    sigma, seed = ref_cfg.defense.noise_std, int(ref_cfg.seed)
    first_scale: dict[str, float] = {}
    # the rate of each surrogate's first CEM epoch after its first warm-up measured: a fused match made there
    # follows s(η)/s(η₀) from it
    first_lr = {n: lr_at(ref_cfg, p.at[n][0] + 1) for n in p.names}
    states = p.states
    out = []
    for epoch in range(0, states[-1] + 1):
        if epoch:                                # warm-up 0: the encoder as built, before any step
            trainer.train_epoch(epoch)
        if epoch not in states:
            continue
        names = [n for n in p.names if epoch in p.at[n]]    # gmm is at every state
        lr = lr_at(ref_cfg, epoch + 1)           # the rate of the first CEM epoch after this warm-up
        feats, labels = trainer.encode(splits.train), splits.train.labels
        client, server = trainer.client, trainer.server
        g_check = g_match = math.nan
        modules = [_surrogate_module(cfgs[name], splits, dev, feats, labels) for name in names]
        fused = {name: cfgs[name].cem.grad_mode == "fused" for name in names}
        cs = [1.0 if fused[name] else inject_scale(lr) for name in names]
        # all on the same batches, noise and dropout masks, as strength.match measures (per_batch_many)
        with strength.untouched(client, server, *modules):
            matches = strength.per_batch_many(client, server, modules, match_batches, sigma, cs, noise_seed=seed)
        with strength.untouched(client, server, *modules):
            checks = strength.per_batch_many(client, server, modules, check, sigma, cs, noise_seed=seed)
        for name, c, own_match, own_check in zip(names, cs, matches, checks):
            cfg = cfgs[name]
            scale = float(cfg.cem.loss_scale)
            o_check, o_match = strength.mean(own_check), strength.mean(own_match)
            if name == REFERENCE:
                g_check, g_match = o_check, o_match
                if not all(math.isfinite(g) and g > 0 for g in (g_check, g_match)):
                    # strength.match's condition: a trial in this state stops with NoStrength
                    raise ConfigError(
                        f"calibrate: gmm's pull at warm-up {epoch} is {g_match:.3g} (held-out {g_check:.3g}): "
                        f"every class is below its hinge (cem.var_threshold, σ), so there is nothing to match; "
                        f"a matched trial in this state stops too. Measure at other warm-up epochs, σ or "
                        f"cem.var_threshold")
            # no finite positive pull of its own: no scale matches (NaN stays NaN; only a pull of 0 is inf)
            matched_scale = g_match / o_match if o_match > 0 else (math.inf if o_match == 0 else math.nan)
            first_scale.setdefault(name, matched_scale)
            # a match made at the first warm-up, applied here: a fused term has followed s(η) since
            c_now = inject_scale(lr) / inject_scale(first_lr[name]) if fused[name] else c
            values = [v * scale for v in own_check]
            out.append(Strength(name, strength.mean(values), scale, cfg.cem.grad_mode, strength.spread(values),
                                (strength.mean(values),), epoch, (matched_scale * o_check / g_check,),
                                (first_scale[name] * (c_now / c) * o_check / g_check,), (matched_scale,),
                                p.modes[name], p.own[name]))
    return out


def table(rows: list[Strength]) -> list[dict]:
    """One record per surrogate and warm-up: ``surrogate``, ``warmup``, ``own_warmup`` (the surrogate's own
    ``cem.warmup_epochs``, where a trial of this configuration matches), ``strength_mode`` (``cem.strength`` of
    a trial of this configuration) and ``ratio_to_gmm``, its strength over gmm's as that trial applies it
    (matched: on held-out batches; fixed: at its loss scale); ``fixed_ratio_to_gmm`` and ``strength`` of the
    fixed ``loss_scale`` (the surrogate's default unless set), with ``matching_lambda`` (the λ that matches gmm's
    λ = 16 at that scale) and ``matching_loss_scale``; ``grad_mode``, ``batch_spread``; ``matched_ratio`` and
    ``matched_loss_scale`` (the scale a matched trial measures at this state) and ``drift_ratio`` (the ratio
    here of the scale matched at the surrogate's first warm-up measured); per-seed values beside (geometric
    means over seeds), with ``fixed_ratio_median`` and ``matched_ratio_median``, the medians of the per-seed
    ratios, which one seed's state moves less than the geometric mean."""
    refs = {r.warmup: r for r in rows if r.surrogate == REFERENCE}
    out = []
    for r in rows:
        ref = refs[r.warmup]
        fixed = r.ratio(ref)
        matched = geo(r.matched)
        fixed_per_seed = [s / g for s, g in zip(r.per_seed, ref.per_seed)]
        none_matches = math.inf if r.strength == 0 else math.nan   # a pull of 0 (inf), or none measured (NaN)
        out.append({"surrogate": r.surrogate, "warmup": r.warmup, "own_warmup": r.own_warmup,
                    "strength_mode": r.mode, "ratio_to_gmm": matched if r.mode == "matched" else fixed,
                    "fixed_ratio_to_gmm": fixed, "strength": r.strength,
                    "fixed_ratio_per_seed": fixed_per_seed, "fixed_ratio_median": median(fixed_per_seed),
                    "matching_lambda": r.matching_lambda(ref) if r.strength > 0 else none_matches,
                    "matching_loss_scale": r.matching_loss_scale(ref) if r.strength > 0 else none_matches,
                    "loss_scale": r.loss_scale, "grad_mode": r.grad_mode, "batch_spread": r.spread,
                    "matched_ratio": matched, "matched_ratio_per_seed": list(r.matched),
                    "matched_ratio_median": median(r.matched),
                    "matched_loss_scale": geo(r.matched_scale), "drift_ratio": geo(r.drift),
                    "drift_per_seed": list(r.drift)})
    return out


def format_table(records: list[dict]) -> str:
    head = (f"{'surrogate':20s} {'warm-up':>7s} {'own':>3s} {'λ means':>8s} {'÷ gmm':>6s}  |  {'grad_mode':9s} "
            f"{'loss_scale':>10s} {'strength/λ':>11s} {'÷ gmm':>6s} {'λ ≙ gmm 16':>11s} {'spread':>7s}  |  "
            f"{'matched ÷ gmm':>13s} {'scale':>8s} {'drift':>6s}  ÷ gmm per seed (fixed | matched), "
            f"and their median (with 2 or more seeds)")
    lines = [head]
    for r in records:
        fixed, matched = r["fixed_ratio_per_seed"], r["matched_ratio_per_seed"]
        medians = (f"  median {r['fixed_ratio_median']:.3g} | {r['matched_ratio_median']:.3g}"
                   if len(fixed) > 1 else "")
        own = r.get("own_warmup")
        lines.append(f"{r['surrogate']:20s} {r['warmup']:7d} {'' if own is None else own:>3} "
                     f"{r['strength_mode']:>8s} {r['ratio_to_gmm']:6.3g}  |  "
                     f"{r['grad_mode']:9s} {r['loss_scale']:10.4g} {r['strength']:11.4g} "
                     f"{r['fixed_ratio_to_gmm']:6.3g} {r['matching_lambda']:11.4g} {r['batch_spread']:6.1%}  |  "
                     f"{r['matched_ratio']:13.3g} {r['matched_loss_scale']:8.3g} {r['drift_ratio']:6.3g}  "
                     f"{' '.join(f'{v:.3g}' for v in fixed)} | {' '.join(f'{v:.3g}' for v in matched)}{medians}")
    return "\n".join(lines)


def _entry_rows(records: list[dict]) -> list[dict]:
    """Per surrogate, the record its ``--yaml`` entry comes from: the one at its own warm-up where measured
    there (where a trial of it has its first CEM epoch), else the one at its first warm-up measured."""
    rows: dict[str, dict] = {}
    for r in sorted(records, key=lambda r: r["warmup"]):
        if r["surrogate"] not in rows or r["warmup"] == r.get("own_warmup"):
            rows[r["surrogate"]] = r
    return list(rows.values())


def yaml_fragment(records: list[dict], measured: dict | None = None) -> str:
    """Per surrogate, the fixed ``cem.loss_scale`` that matches gmm at the state of its entry's
    ``cem.warmup_epochs`` (``_entry_rows``): one YAML mapping ``surrogate: {cem.surrogate: surrogate,
    cem.strength: fixed, cem.loss_scale: v, cem.warmup_epochs: w}``, each entry a ``--config`` file's worth for
    that surrogate (``cem-bench train --config``, or the ``fixed`` keys of its family space), on the
    configuration measured: the header comments say which (``measured``: ``measured_config``)."""
    lines = ["# cem-bench calibrate: per surrogate, the fixed cem.loss_scale with which one unit of lambda pulls on the",
             "# encoder as gmm's does (gmm is the reference) after the entry's cem.warmup_epochs of a lambda = 0 run of",
             "# the configuration measured (below); with other keys it does not match. The default, cem.strength=matched,",
             "# measures this on each trial's own encoder instead. Use one entry, not the whole file: its keys as --set",
             "# (cem-bench train --set cem.surrogate=NAME --set cem.strength=fixed ...), or its mapping alone in a",
             "# --config file, beside the keys measured. The scale is matched on the held-out batches (--batches):",
             "# a matched trial's own (the table's scale column) is measured on its training batches and differs",
             "# from it by their noise, so a fixed run from an entry is not that trial to the bit."]
    if measured:
        keys = " ".join(f"--set {k}={v}" for k, v in measured["keys"].items()) or "none (every default)"
        lines += [f"# measured: cem-bench {measured['package_version']} (git {measured['git_sha']}), "
                  f"{measured['time']}, {measured['device']}",
                  f"# keys given: {keys}",
                  f"# seeds {' '.join(map(str, measured['seeds']))}; a match of {measured['strength_batches']} "
                  f"batches, checked on {measured['batches']} held-out; warm-ups "
                  + (", ".join(f"{n} {' '.join(map(str, w))}" for n, w in measured["warmups"].items()))
                  + (" (--warmup)" if measured["warmup_given"] is not None else " (each surrogate's own)")]
        if measured["reference"]["not_applied"]:
            lines.append(f"# not applied to gmm, the reference: {', '.join(measured['reference']['not_applied'])}")
    for r in _entry_rows(records):
        v = r["matching_loss_scale"]
        # gmm's scale is 1 at every state (the reference): its entry keeps its own warm-up, wherever measured
        warmup = r.get("own_warmup", r["warmup"]) if r["surrogate"] == REFERENCE else r["warmup"]
        if math.isfinite(v) and v > 0:
            lines.append(f"{r['surrogate']}: {{cem.surrogate: {r['surrogate']}, cem.strength: fixed, "
                         f"cem.loss_scale: {v:.4g}, cem.warmup_epochs: {warmup}}}")
        else:   # a loss_scale of inf or NaN is refused when the file is read: say why instead
            lines.append(f"# {r['surrogate']}: no scale matches (its pull was {r['strength']:.3g}: not finite "
                         f"and positive)")
    return "\n".join(lines) + "\n"


def calibrate_file(path: str) -> str | None:
    """Why ``path``, given as ``--config``, is a whole ``calibrate --yaml`` file (``config.calibrate_file_problem``);
    None when it is not one (or cannot be read: the config's own loading then says why)."""
    from .config import calibrate_file_problem, read_yaml
    try:
        doc = read_yaml(path, "config file")
    except ConfigError:
        return None
    return calibrate_file_problem(doc, path)


def check_files(config: str | None, json_path: str | None, yaml_path: str | None) -> None:
    """ConfigError, before any work, when two of ``--config``, ``--json`` and ``--yaml`` name one file: the
    later write would replace the earlier (or the configuration measured), or ``--config`` is a whole calibrate
    YAML file."""
    def same(a: str, b: str) -> bool:
        if "://" in a or "://" in b:
            return a == b
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)
    given = [(f, p) for f, p in (("--config", config), ("--json", json_path), ("--yaml", yaml_path)) if p]
    for i, (f1, p1) in enumerate(given):
        for f2, p2 in given[i + 1:]:
            if same(p1, p2):
                what = "the configuration it measures" if f1 == "--config" else "the table"
                raise ConfigError(f"{f1} and {f2} name one file, {p2}: writing {f2} would replace {what}; give "
                                  f"{f2} another file. Nothing was measured")
    problem = config and calibrate_file(config)
    if problem:
        raise ConfigError(f"{problem}. Nothing was measured")
