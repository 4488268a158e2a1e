"""The CEM strength of a surrogate at a state of the encoder, and the match to gmm's (``cem.strength``).

The strength of a CEM term per unit λ is the ratio of the norm of the gradient it sends into the client's
features z to the norm of the cross-entropy's gradient there, exactly as the trainer applies it:

    strength = c · loss_scale · ‖∂L/∂z‖ / ‖∂CE/∂z‖,   c = s(η) (inject) or the fused factor (below)

gmm is the reference: the paper's λ keeps its meaning. Under ``cem.strength=matched`` (the attention
surrogates' default) a trial measures, at the start of its first CEM epoch and on its own encoder, gmm's
strength and its own on the same batches, and sets its ``loss_scale`` to their ratio: λ then means gmm's pull
wherever the trial runs (σ, width, warm-up, data set, seed), which a fixed default calibrated at one state
cannot (docs/estimators.md, "One λ scale": the fixed defaults' strength moved 0.23-35× over the 404 cells
measured there). Through the
schedule the inject surrogates keep their ratio to gmm by construction (both scale with s(η)); a fused
surrogate's weight is multiplied by s(η)/s(η₀) (η₀ the rate of its first CEM epoch) so that it does too
(``Trainer.cem_scales``). ``cem-bench calibrate`` measures both the fixed defaults and the match on held-out
batches (``cem_bench/calibrate.py``).
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
import torch.nn.functional as F

from .. import surrogates
from ..config import TrialConfig
from ..surrogates.base import REFERENCE_SURROGATE as REFERENCE
from . import data as data_mod
from .schedule import inject_scale, lr_at

# the batches a match averages: cem.strength_batches (config.py says why 64 by default)
BATCH_SEED = 104729        # the match's batches: a generator seeded from the trial seed plus this
CHECK_SEED = 15485863      # calibrate's held-out batches, to check a match on batches it did not see


class NoStrength(RuntimeError):
    """A match found no pull to match: gmm's (every class below its hinge) or the surrogate's is 0."""

    def __init__(self, gmm: float, own: float, message: str):
        super().__init__(message)
        self.gmm, self.own = gmm, own


def reference_config(cfg: TrialConfig) -> TrialConfig:
    """gmm at its own defaults on ``cfg``'s data, model, noise and training keys (and its hinge: cem.var_*)."""
    flat = {k: v for k, v in cfg.to_flat().items() if not k.startswith("cem.")}
    flat.update({"cem.surrogate": REFERENCE, "cem.lambd": 1.0, "cem.var_threshold": cfg.cem.var_threshold,
                 "cem.var_eps": cfg.cem.var_eps})
    return surrogates.resolve(TrialConfig.from_flat(flat))


def fixed_batches(cfg: TrialConfig, splits: data_mod.Splits, n: int, seed_offset: int = BATCH_SEED,
                  device: torch.device | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` training batches (augmented as in training) from a generator of their own, seeded from the
    config's seed: the same batches for every surrogate measured, and the trainer's stream untouched."""
    dev = device or splits.train.images.device
    gen = torch.Generator(device=dev).manual_seed(int(cfg.seed) + seed_offset)
    out = []
    while len(out) < n:
        for x, y in data_mod.BatchIterator(splits.train, splits, cfg.train.batch_size, cfg.train.augment, gen):
            out.append((x, y))
            if len(out) == n:
                break
    return out


def cuda_devices(*modules: torch.nn.Module) -> list[int]:
    """The CUDA devices the modules' tensors live on: the random streams a measurement on them draws from (the
    current device is not necessarily the trial's, whose dropout masks come from its own device's stream)."""
    return sorted({t.device.index for m in modules for t in (*m.parameters(), *m.buffers())
                   if t.device.type == "cuda"})


@contextlib.contextmanager
def untouched(*modules: torch.nn.Module):
    """Run a measurement without leaving a trace: the modules' state (BatchNorm's running statistics move in a
    train-mode forward), their modes, their gradients and every random stream (dropout, a surrogate's slot
    initialisation) are as before afterwards."""
    saved = [({k: v.detach().clone() for k, v in m.state_dict().items()}, m.training) for m in modules]
    streams = [(m, m.rng_snapshot()) for m in modules if hasattr(m, "rng_snapshot")]   # Surrogate.rng
    with torch.random.fork_rng(devices=cuda_devices(*modules)):
        try:
            yield
        finally:
            for m, (state, training) in zip(modules, saved):
                m.load_state_dict(state)
                m.train(training)
                m.zero_grad(set_to_none=True)
            for m, snapshot in streams:
                m.rng_restore(snapshot)


def per_batch(client, server, surrogate, batches, noise_std: float, c: float = 1.0, scale: float = 1.0,
              noise_seed: int = 0) -> list[float]:
    """The strength on each batch: c · scale · ‖∂L/∂z‖ / ‖∂CE/∂z‖, in train mode as a step runs (call it
    inside ``untouched``). The CE sees the defense noise, drawn from a generator of its own."""
    return per_batch_many(client, server, [surrogate], batches, noise_std, [c], [scale], noise_seed)[0]


def per_batch_many(client, server, modules, batches, noise_std: float, cs, scales=None,
                   noise_seed: int = 0) -> list[list[float]]:
    """``per_batch`` of each of ``modules`` (``cs``, ``scales``: each one's c and scale), the values that
    separate calls from the same start give (each in an ``untouched`` of its own), with the client's forward and
    the cross-entropy's gradient computed once a batch instead of once a module: calibrate measures five
    surrogates on up to 68 batches a state, and those were most of its time. The same because the client and
    the server draw only from the global stream (dropout), which no surrogate touches (each draws from its own,
    ``Surrogate.rng``), and train-mode BatchNorm normalises by the batch's own statistics: z, the noise and ∂CE/∂z
    do not depend on which surrogate is measured. Call it inside ``untouched(client, server, *modules)``."""
    scales = [1.0] * len(modules) if scales is None else scales
    for m in (client, server, *modules):
        m.train()
    values: list[list[float]] = [[] for _ in modules]
    for i, (x, y) in enumerate(batches):
        z = client(x).float()
        gen = torch.Generator(device=z.device).manual_seed(noise_seed + i)
        noisy = z + noise_std * torch.randn(z.shape, generator=gen, device=z.device) if noise_std else z
        ce = F.cross_entropy(server(noisy).float(), y)
        g_ce, = torch.autograd.grad(ce, z)
        ce_norm = max(float(g_ce.norm()), 1e-30)
        z = z.detach().requires_grad_()
        for out, module, c, scale in zip(values, modules, cs, scales):
            g_l, = torch.autograd.grad(module(z, y).loss, z, allow_unused=True)
            g = 0.0 if g_l is None else float(g_l.norm())
            out.append(c * scale * g / ce_norm)
    return values


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def spread(values: list[float]) -> float:
    """std / mean of per-batch values (NaN when the mean is 0)."""
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values)) / m if m > 0 else math.nan


def build_reference(cfg: TrialConfig, feature_shape, num_classes: int, device: torch.device, features,
                    labels) -> torch.nn.Module:
    """gmm (``reference_config``), fitted on ``features`` as the trainer fits it before a CEM epoch."""
    ref_cfg = reference_config(cfg)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(int(cfg.seed) + 7919)
        ref = surrogates.build(ref_cfg, feature_shape, num_classes).to(device)
    ref.refit(features, labels)
    return ref


def match(cfg: TrialConfig, splits: data_mod.Splits, client, server, surrogate, reference, c_ref: float,
          c_own: float, batches: list | None = None) -> dict:
    """The loss_scale with which ``surrogate`` pulls as ``reference`` (gmm) does on this encoder, measured on
    ``cem.strength_batches`` fixed batches; a record of the measurement (``cem_strength_*``) for the trial's result."""
    batches = batches if batches is not None else fixed_batches(cfg, splits, cfg.cem.strength_batches)
    sigma = cfg.defense.noise_std
    # the two on the same batches, noise and dropout masks (per_batch_many)
    with untouched(client, server, surrogate, reference):
        ref, own = per_batch_many(client, server, [reference, surrogate], batches, sigma, [c_ref, c_own],
                                  noise_seed=cfg.seed)
    g, o = mean(ref), mean(own)
    if not (g > 0 and o > 0 and math.isfinite(g) and math.isfinite(o)):
        raise NoStrength(g, o, f"cem.strength=matched: the strengths measured are not positive (gmm {g:.3g}, "
                         f"{cfg.cem.surrogate} {o:.3g} per unit loss_scale): nothing to match at this state; "
                         f"set cem.strength=fixed and a cem.loss_scale")
    return {"cem_loss_scale": g / o, "cem_strength_gmm": g, "cem_strength_own": o,
            "cem_strength_spread": max(spread(ref), spread(own)), "cem_strength_batches": len(batches)}


def match_on(cfg: TrialConfig, splits: data_mod.Splits, client, server, surrogate, features, lr: float,
             first_lr: float, keep: float | None = None) -> dict:
    """``match`` at the start of a trial's CEM epoch at scheduled rate ``lr`` (``first_lr``: its first CEM
    epoch's): gmm fitted on the encoder's clean training ``features`` as the trainer fits it, each term scaled
    as the step applies it (inject: s(η); a fused term: s(η)/s(η₀), 1 at its first CEM epoch). ``keep``: a
    later match where gmm's pull is 0 keeps this scale (and says so) instead of failing."""
    ref = build_reference(cfg, surrogate.feature_shape, surrogate.num_classes, features.device, features,
                          splits.train.labels)
    c_own = inject_scale(lr) / inject_scale(first_lr) if cfg.cem.grad_mode == "fused" else inject_scale(lr)
    try:
        return match(cfg, splits, client, server, surrogate, ref, inject_scale(lr), c_own)
    except NoStrength as e:
        if keep is None:
            raise
        return {"cem_loss_scale": keep, "cem_strength_gmm": e.gmm, "cem_strength_own": e.own,
                "cem_strength_spread": float("nan"), "cem_strength_batches": cfg.cem.strength_batches}


class Matcher:
    """A trial's loss scale under ``cem.strength``: fixed (the config's, 1 for gmm), or matched to gmm's pull at
    the start of its first CEM epoch and, under ``cem.strength_every = N``, every N epochs after. The scale is
    also a device tensor, filled in place, that the step multiplies by (a captured step reads the new value at
    replay); ``record`` is what the trial's result says about it; the state goes into the checkpoint, so that a
    resumed trial keeps the scales it measured instead of measuring again on a later encoder."""

    def __init__(self, cfg: TrialConfig, device: torch.device, active: bool):
        self.cfg = cfg
        self.scale = float(cfg.cem.loss_scale if cfg.cem.loss_scale is not None else 1.0)
        self.scale_t = torch.tensor(self.scale, device=device)
        self.matched = active and cfg.cem.strength == "matched"
        self.pending = self.matched                # no match made yet
        self.first_lr = lr_at(cfg, (cfg.cem.warmup_epochs or 0) + 1)
        self.epochs: list[int] = []                # the epochs whose start a match was made at
        self.scales: list[float] = []              # and the scale each gave
        self.seconds = 0.0                         # spent matching (inside the epochs' train_s)
        self.record = {"cem_strength": cfg.cem.strength or "fixed", "cem_loss_scale": self.scale} if active else {}

    def fused_factor(self, lr: float) -> float:
        """A matched fused term's weight at scheduled rate ``lr``: s(η)/s(η₀), η₀ the first CEM epoch's rate, so
        that it keeps its ratio to the injected terms through the learning-rate drops; 1 when fixed."""
        return inject_scale(lr) / inject_scale(self.first_lr) if self.matched else 1.0

    def due(self, epoch: int) -> bool:
        """A match before this (CEM) epoch: the first, or ``cem.strength_every`` epochs after it."""
        every = self.cfg.cem.strength_every
        return self.pending or bool(self.matched and every and self.epochs and (epoch - self.epochs[0]) % every == 0)

    def match(self, epoch: int, lr: float, splits: data_mod.Splits, client, server, surrogate, features) -> None:
        """Set the scale so that ``surrogate`` pulls on this encoder as gmm does (``match_on``); a later match
        where gmm's own pull is 0 (every class below its hinge) keeps the scale."""
        t0 = time.perf_counter()
        rec = match_on(self.cfg, splits, client, server, surrogate, features, lr, self.first_lr,
                       keep=self.scale if self.epochs else None)
        self.seconds += time.perf_counter() - t0
        self.epochs.append(epoch)
        self.scales.append(rec["cem_loss_scale"])
        self.set(rec["cem_loss_scale"])
        self.record = {"cem_strength": "matched", **rec, "cem_strength_epoch": self.epochs[0],
                       "cem_strength_matches": len(self.scales), "cem_loss_scale_first": self.scales[0],
                       "cem_loss_scale_min": min(self.scales), "cem_loss_scale_max": max(self.scales),
                       "cem_strength_s": self.seconds}
        self.pending = False

    def set(self, value: float) -> None:
        self.scale = float(value)
        self.scale_t.fill_(self.scale)

    def state_dict(self) -> dict:
        return {"loss_scale": self.scale, "record": self.record, "pending": self.pending, "epochs": self.epochs,
                "scales": self.scales, "seconds": self.seconds}

    def load_state_dict(self, st: dict) -> None:
        self.set(st["loss_scale"])
        self.record, self.pending = dict(st["record"]), bool(st["pending"])
        self.epochs, self.scales = list(st.get("epochs", [])), [float(v) for v in st.get("scales", [])]
        self.seconds = float(st.get("seconds", 0.0))
