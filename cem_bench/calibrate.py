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
paper's λ keeps its meaning, and the others' default ``cem.loss_scale`` is set so that their strength is
within a factor of 1.5 of gmm's on the synthetic data (docs/estimators.md, "One λ scale").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import data as data_mod
from .config import ConfigError
from .runtime import resolve_device
from .surrogates import names as surrogate_names
from .trainer import inject_scale, lr_at
from .trial import build, build_config

REFERENCE = "gmm"
MATCH_LAMBDA = 16.0      # the paper's λ that the table translates


@dataclass
class Strength:
    surrogate: str
    strength: float            # per unit λ; over several seeds, their geometric mean
    loss_scale: float          # the surrogate's cem.loss_scale as measured
    grad_mode: str
    spread: float              # between batches: std of the per-batch strengths, relative to their mean
    per_seed: tuple[float, ...] = ()   # the strength at each reference state (one per seed)

    def ratio(self, reference: Strength) -> float:
        return self.strength / reference.strength

    def matching_lambda(self, reference: Strength, lambd: float = MATCH_LAMBDA) -> float:
        return lambd * reference.strength / self.strength

    def matching_loss_scale(self, reference: Strength) -> float:
        return self.loss_scale * reference.strength / self.strength


def reference_state(flat: dict, warmup: int, device: torch.device):
    """(splits, client state, server state, the rate of epoch warmup + 1): a λ = 0 run of the config after
    ``warmup`` epochs (its learning-rate schedule is that of the config's ``train.epochs``)."""
    cfg = build_config({**flat, "cem.lambd": 0.0})
    splits, trainer = build(cfg, device)
    for epoch in range(1, warmup + 1):
        trainer.train_epoch(epoch)
    states = ({k: v.detach().clone() for k, v in trainer.client.state_dict().items()},
              {k: v.detach().clone() for k, v in trainer.server.state_dict().items()})
    return splits, states, lr_at(cfg, warmup + 1)


def measure(flat: dict, surrogates: list[str] | None = None, warmup: int = 2, batches: int = 4,
            device: str | None = None, seeds: list[int] | None = None) -> list[Strength]:
    """The strength of each surrogate (``surrogates``: default all registered, gmm first) on ``flat``'s
    configuration (dataset, width, σ, batch, ...). Keys a surrogate sets by default (``cem.loss_scale``,
    ``cem.grad_mode``, ...) take its default unless ``flat`` sets them. With ``seeds``, one reference state per
    seed and the geometric mean of the strengths (so the ratio to gmm is the geometric mean of the per-seed
    ratios): gmm's hinge makes its strength depend on the state by a factor of about 2 between seeds."""
    if seeds:
        runs = [measure({**flat, "seed": s}, surrogates, warmup, batches, device) for s in seeds]
        out = []
        for rows in zip(*runs):
            vals = [r.strength for r in rows]
            geo = math.exp(sum(math.log(v) for v in vals) / len(vals)) if all(v > 0 for v in vals) else 0.0
            out.append(Strength(rows[0].surrogate, geo, rows[0].loss_scale, rows[0].grad_mode,
                                max(r.spread for r in rows), tuple(vals)))
        return out
    names = list(surrogates or surrogate_names())
    known = surrogate_names()
    bad = [n for n in names if n not in known]
    if bad:
        raise ConfigError(f"unknown surrogate(s) {', '.join(bad)}; known: {', '.join(known)}")
    names = [REFERENCE] + [n for n in names if n != REFERENCE]
    if warmup < 1 or batches < 1:
        raise ConfigError(f"calibrate: warm-up epochs and batches must be at least 1 (got {warmup}, {batches})")
    base = {k: v for k, v in flat.items() if k not in ("cem.surrogate", "cem.lambd")}
    # validate every surrogate's config before the reference run trains anything
    cfgs = {n: build_config({**base, "cem.surrogate": n, "cem.lambd": 1.0}) for n in names}
    dev = resolve_device(device or cfgs[REFERENCE].train.device)
    splits, (client_state, server_state), lr = reference_state(base, warmup, dev)
    out = []
    for name in names:
        cfg = cfgs[name]
        _, trainer = build(cfg, dev, splits=splits)
        trainer.client.load_state_dict(client_state)
        trainer.server.load_state_dict(server_state)
        if trainer.surrogate.needs_refit:
            trainer.refit_surrogate()
        c = 1.0 if cfg.cem.grad_mode == "fused" else inject_scale(lr)
        scale = float(cfg.cem.loss_scale if cfg.cem.loss_scale is not None else 1.0)
        for m in (trainer.client, trainer.server, trainer.surrogate):
            m.train()
        # the same batches for every surrogate: a generator seeded from the config
        gen = torch.Generator(device=dev).manual_seed(int(cfg.seed) + 104729)
        it = data_mod.BatchIterator(splits.train, splits, cfg.train.batch_size, cfg.train.augment, gen)
        values = []
        for i, (x, y) in enumerate(it):
            if i >= batches:
                break
            z = trainer.client(x).float()
            ce = F.cross_entropy(trainer.server(trainer.add_noise(z)).float(), y)
            loss = trainer.surrogate(z, y).loss
            g_ce, = torch.autograd.grad(ce, z, retain_graph=True)
            g_l, = torch.autograd.grad(loss, z, allow_unused=True)
            g_l = torch.zeros_like(z) if g_l is None else g_l
            values.append(c * scale * float(g_l.norm()) / max(float(g_ce.norm()), 1e-30))
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        out.append(Strength(name, mean, scale, cfg.cem.grad_mode, std / mean if mean > 0 else math.nan, (mean,)))
    return out


def table(rows: list[Strength]) -> list[dict]:
    """One record per surrogate: ``surrogate``, ``strength``, ``ratio_to_gmm``, ``matching_lambda`` (the λ that
    matches gmm's λ = 16), ``matching_loss_scale``, ``loss_scale``, ``grad_mode``, ``batch_spread``."""
    ref = next(r for r in rows if r.surrogate == REFERENCE)
    return [{"surrogate": r.surrogate, "strength": r.strength, "ratio_to_gmm": r.ratio(ref),
             "ratio_per_seed": [s / g for s, g in zip(r.per_seed, ref.per_seed)],
             "matching_lambda": r.matching_lambda(ref) if r.strength > 0 else math.inf,
             "matching_loss_scale": r.matching_loss_scale(ref) if r.strength > 0 else math.inf,
             "loss_scale": r.loss_scale, "grad_mode": r.grad_mode, "batch_spread": r.spread} for r in rows]


def format_table(records: list[dict]) -> str:
    head = (f"{'surrogate':20s} {'grad_mode':9s} {'loss_scale':>10s} {'strength/λ':>11s} {'÷ gmm':>8s} "
            f"{'λ ≙ gmm 16':>11s} {'loss_scale ≙ gmm':>17s} {'batch spread':>12s}  ÷ gmm per seed")
    lines = [head]
    for r in records:
        lines.append(f"{r['surrogate']:20s} {r['grad_mode']:9s} {r['loss_scale']:10.4g} {r['strength']:11.4g} "
                     f"{r['ratio_to_gmm']:8.3g} {r['matching_lambda']:11.4g} {r['matching_loss_scale']:17.4g} "
                     f"{r['batch_spread']:11.1%}   {' '.join(f'{v:.3g}' for v in r['ratio_per_seed'])}")
    return "\n".join(lines)


def yaml_fragment(records: list[dict]) -> str:
    """The matching ``cem.loss_scale`` of each surrogate: one YAML mapping ``surrogate: {cem.loss_scale: v}``,
    each entry a ``--config`` file's worth for that surrogate (``cem-bench train --config``, or the ``fixed``
    keys of its family space, search_spaces/<surrogate>.yaml)."""
    lines = ["# cem-bench calibrate: the cem.loss_scale with which one unit of lambda pulls on the encoder as",
             "# gmm's does, on the configuration measured (per surrogate; gmm is the reference)"]
    for r in records:
        lines.append(f"{r['surrogate']}: {{cem.loss_scale: {r['matching_loss_scale']:.4g}}}")
    return "\n".join(lines) + "\n"
