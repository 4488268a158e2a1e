"""How strongly one unit of λ pulls on the encoder, per surrogate: the measure behind one λ scale for all five.

The CEM strength of a configuration at a state of the encoder is the ratio of the norm of the gradient that
the CEM term sends into the client's features z to the norm of the cross-entropy's gradient there, per unit
λ, exactly as the trainer applies it (``Trainer.cem_scales``): the encoder descends CE + λ·c·loss_scale·L
with c = s(η) (``inject``, η the scheduled rate of the first CEM epoch) or 1 (``fused``); the adversarial
sign only turns the estimator's own update around, not the encoder's. So

    strength = c · loss_scale · ‖∂L/∂z‖ / ‖∂CE/∂z‖,   averaged over a few batches,

measured on one reference state shared by every surrogate: the encoder (and server) after ``warmup`` epochs
of a λ = 0 run, the surrogate's own parameters at their initial values (gmm: refitted on that encoder's
clean training features, as the trainer does before its first CEM epoch). ``gmm`` is the reference: the
paper's λ keeps its meaning. The others' fixed ``cem.loss_scale`` defaults (used under ``cem.strength:
fixed``) were set so that their strength is within a factor of 1.5 of gmm's at this reference state on the
synthetic data (width 0.25, σ 0.1); elsewhere they drift (0.23-35× over the states docs/estimators.md, "One λ
scale", measured), which is why ``matched``, the attention surrogates' default, measures the ratio in every
trial and is what this command's held-out match checks.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from . import surrogates
from .config import ConfigError
from .core import strength
from .core.runtime import resolve_device
from .core.schedule import inject_scale, lr_at
from .core.trial import build, build_config
from .surrogates import names as surrogate_names

REFERENCE = strength.REFERENCE
MATCH_LAMBDA = 16.0      # the paper's λ that the table translates


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
    # per seed: the ratio to gmm here of the scale matched at the first warm-up measured (the drift of a match
    # made at the first CEM epoch as training goes on, the fused term following s(η) as the trainer applies it)
    drift: tuple[float, ...] = ()
    matched_scale: tuple[float, ...] = ()   # per seed: the loss_scale a matched trial would use here
    mode: str = "fixed"        # cem.strength of a trial of this configuration: what its λ means

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


def measure(flat: dict, surrogates_: list[str] | None = None, warmup: int | list[int] = 2, batches: int = 32,
            device: str | None = None, seeds: list[int] | None = None) -> list[Strength]:
    """The strength of each surrogate (``surrogates_``: default all registered, gmm first) on ``flat``'s
    configuration (dataset, width, σ, batch, ...), after each of the ``warmup`` epoch counts of one λ = 0
    reference run (rows in warm-up order, gmm first in each). ``strength`` is the fixed scale's
    (``cem.loss_scale``: the surrogate's default unless ``flat`` sets it); ``matched`` is the ratio to gmm of
    ``cem.strength=matched`` (the scale a trial would measure at this state on its own batches, checked on
    ``batches`` held-out ones); ``drift`` that of the scale matched at the first warm-up, applied here. With
    ``seeds``, one reference run per seed and the geometric mean of the strengths (so the ratio to gmm is the
    geometric mean of the per-seed ratios): gmm's hinge makes its strength depend on the state by a factor of
    about 2 between seeds."""
    warmups = sorted(set([warmup] if isinstance(warmup, int) else warmup))
    if seeds:
        runs = [measure({**flat, "seed": s}, surrogates_, warmups, batches, device) for s in seeds]
        out = []
        for rows in zip(*runs):
            out.append(Strength(rows[0].surrogate, geo(r.strength for r in rows), rows[0].loss_scale,
                                rows[0].grad_mode, max(r.spread for r in rows), tuple(r.strength for r in rows),
                                rows[0].warmup, tuple(r.matched[0] for r in rows), tuple(r.drift[0] for r in rows),
                                tuple(r.matched_scale[0] for r in rows), rows[0].mode))
        return out
    names = list(surrogates_ or surrogate_names())
    known = surrogate_names()
    bad = [n for n in names if n not in known]
    if bad:
        raise ConfigError(f"unknown surrogate(s) {', '.join(bad)}; known: {', '.join(known)}")
    names = [REFERENCE] + [n for n in names if n != REFERENCE]
    if not warmups or warmups[0] < 1 or batches < 1:
        raise ConfigError(f"calibrate: warm-up epochs and batches must be at least 1 (got {warmups}, {batches})")
    base = {k: v for k, v in flat.items() if k not in ("cem.surrogate", "cem.lambd", "cem.strength")}
    # how a trial of this configuration runs (cem.strength, as flat sets it or the surrogate's default)
    modes = {n: build_config({**flat, "cem.surrogate": n, "cem.lambd": 1.0}).cem.strength for n in names}
    # the fixed scale: the surrogate's default unless flat sets cem.loss_scale (validated before any training)
    cfgs = {n: build_config({**base, "cem.surrogate": n, "cem.lambd": 1.0, "cem.strength": "fixed"})
            for n in names}
    ref_cfg = cfgs[REFERENCE]   # the user's keys: schedule, seed, noise, the match's batches
    # gmm as a matched trial measures it (strength.reference_config: its own defaults, the user's hinge): the
    # user's cem.grad_mode or cem.loss_scale had changed calibrate's reference and not a trial's (a fused run's
    # scale reported 10x the one its trial used; a set loss_scale moved gmm with the surrogate)
    cfgs[REFERENCE] = strength.reference_config(ref_cfg)
    if warmups[-1] >= ref_cfg.train.epochs:
        raise ConfigError(f"calibrate: warm-up {warmups[-1]} leaves no CEM epoch of train.epochs="
                          f"{ref_cfg.train.epochs}; measure at fewer warm-up epochs or set a longer schedule")
    dev = resolve_device(device or ref_cfg.train.device)
    splits, trainer = build(build_config({**base, "cem.lambd": 0.0}), dev)
    # the batches a matched trial measures on (strength.match), and held-out ones to check its scale on
    match_batches = strength.fixed_batches(ref_cfg, splits, ref_cfg.cem.strength_batches)
    check = strength.fixed_batches(ref_cfg, splits, batches, strength.CHECK_SEED)
    sigma, seed = ref_cfg.defense.noise_std, int(ref_cfg.seed)
    first_scale: dict[str, float] = {}
    first_lr = lr_at(ref_cfg, warmups[0] + 1)
    out = []
    for epoch in range(1, warmups[-1] + 1):
        trainer.train_epoch(epoch)
        if epoch not in warmups:
            continue
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
            c_now = inject_scale(lr) / inject_scale(first_lr) if fused[name] else c
            values = [v * scale for v in own_check]
            out.append(Strength(name, strength.mean(values), scale, cfg.cem.grad_mode, strength.spread(values),
                                (strength.mean(values),), epoch, (matched_scale * o_check / g_check,),
                                (first_scale[name] * (c_now / c) * o_check / g_check,), (matched_scale,),
                                modes[name]))
    return out


def table(rows: list[Strength]) -> list[dict]:
    """One record per surrogate and warm-up: ``surrogate``, ``warmup``, ``strength_mode`` (``cem.strength`` of a
    trial of this configuration) and ``ratio_to_gmm``, its strength over gmm's as that trial applies it (matched:
    on held-out batches; fixed: at its loss scale); ``fixed_ratio_to_gmm`` and ``strength`` of the fixed
    ``loss_scale`` (the surrogate's default unless set), with ``matching_lambda`` (the λ that matches gmm's λ =
    16 at that scale) and ``matching_loss_scale``; ``grad_mode``, ``batch_spread``; ``matched_ratio`` and
    ``matched_loss_scale`` (the scale a matched trial measures at this state) and ``drift_ratio`` (the ratio
    here of the scale matched at the first warm-up); per-seed values beside (geometric means over seeds), with
    ``fixed_ratio_median`` and ``matched_ratio_median``, the medians of the per-seed ratios, which one seed's
    state moves less than the geometric mean."""
    refs = {r.warmup: r for r in rows if r.surrogate == REFERENCE}
    out = []
    for r in rows:
        ref = refs[r.warmup]
        fixed = r.ratio(ref)
        matched = geo(r.matched)
        fixed_per_seed = [s / g for s, g in zip(r.per_seed, ref.per_seed)]
        none_matches = math.inf if r.strength == 0 else math.nan   # a pull of 0 (inf), or none measured (NaN)
        out.append({"surrogate": r.surrogate, "warmup": r.warmup, "strength_mode": r.mode,
                    "ratio_to_gmm": matched if r.mode == "matched" else fixed,
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
    head = (f"{'surrogate':20s} {'warm-up':>7s} {'λ means':>8s} {'÷ gmm':>6s}  |  {'grad_mode':9s} "
            f"{'loss_scale':>10s} {'strength/λ':>11s} {'÷ gmm':>6s} {'λ ≙ gmm 16':>11s} {'spread':>7s}  |  "
            f"{'matched ÷ gmm':>13s} {'scale':>8s} {'drift':>6s}  ÷ gmm per seed (fixed | matched), "
            f"and their median (with 2 or more seeds)")
    lines = [head]
    for r in records:
        fixed, matched = r["fixed_ratio_per_seed"], r["matched_ratio_per_seed"]
        medians = (f"  median {r['fixed_ratio_median']:.3g} | {r['matched_ratio_median']:.3g}"
                   if len(fixed) > 1 else "")
        lines.append(f"{r['surrogate']:20s} {r['warmup']:7d} {r['strength_mode']:>8s} {r['ratio_to_gmm']:6.3g}  |  "
                     f"{r['grad_mode']:9s} {r['loss_scale']:10.4g} {r['strength']:11.4g} "
                     f"{r['fixed_ratio_to_gmm']:6.3g} {r['matching_lambda']:11.4g} {r['batch_spread']:6.1%}  |  "
                     f"{r['matched_ratio']:13.3g} {r['matched_loss_scale']:8.3g} {r['drift_ratio']:6.3g}  "
                     f"{' '.join(f'{v:.3g}' for v in fixed)} | {' '.join(f'{v:.3g}' for v in matched)}{medians}")
    return "\n".join(lines)


def yaml_fragment(records: list[dict]) -> str:
    """The fixed ``cem.loss_scale`` that matches gmm at the first warm-up measured, per surrogate: one YAML
    mapping ``surrogate: {cem.strength: fixed, cem.loss_scale: v}``, each entry a ``--config`` file's worth for
    that surrogate (``cem-bench train --config``, or the ``fixed`` keys of its family space)."""
    first = min(r["warmup"] for r in records)
    lines = ["# cem-bench calibrate: the fixed cem.loss_scale with which one unit of lambda pulls on the encoder",
             "# as gmm's does, on the configuration measured (per surrogate; gmm is the reference). The default,",
             "# cem.strength=matched, measures this on each trial's own encoder instead."]
    for r in records:
        if r["warmup"] == first:
            v = r["matching_loss_scale"]
            if math.isfinite(v) and v > 0:
                lines.append(f"{r['surrogate']}: {{cem.strength: fixed, cem.loss_scale: {v:.4g}}}")
            else:   # a loss_scale of inf or NaN is refused when the file is read: say why instead
                lines.append(f"# {r['surrogate']}: no scale matches (its pull was {r['strength']:.3g}: not finite "
                             f"and positive)")
    return "\n".join(lines) + "\n"
