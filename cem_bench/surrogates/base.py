"""The surrogate interface, the registry, and the shared vectorised helpers.

A surrogate estimates how spread out the client's features are within each class and returns a loss that
the encoder minimises (docs/surrogates.md, "Common contract"). Adding one is a single decorator::

    @register("my_estimator")
    class MyEstimator(Surrogate):
        defaults = {"cem.loss_scale": 0.5}      # seed defaults that differ from the global ones
        def forward(self, z, y) -> SurrogateOut: ...

Every test in ``tests/test_surrogates.py`` is parametrised over ``names()``, so a new surrogate is
checked without new test code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn as nn

from ..config import ConfigError, TrialConfig
from ..keys import key
from ..registry import Registry
from .layers import disable_marked

# Fallbacks of the keys every surrogate has whose default is "the surrogate's own" (None in config.py); a
# surrogate overrides them in its ``defaults``.
REFERENCE_SURROGATE = "gmm"   # the surrogate whose strength λ means (cem.strength, cem_bench/core/strength.py)
GLOBAL_DEFAULTS = {
    "cem.grad_mode": "inject",
    "cem.warmup_epochs": 1,
    "cem.loss_scale": 1.0,
}


@dataclass(frozen=True)
class SurrogateKeys:
    """The keys of a surrogate beyond CemConfig's; subclass it beside ``@register`` (docs/architecture.md)."""
    stats_on: str = key("raw", "statistics on the raw encoder features (raw) or on the surrogate's own "
                        "normalized/enhanced features", choices=("raw",))


@dataclass(frozen=True)
class AttentionKeys(SurrogateKeys):
    hidden_dim: int = key(128, "width of the attention layers' projected space", lo=1, hi=4096)


@dataclass(frozen=True)
class SlotKeys(AttentionKeys):
    num_slots: int = key(8, "slots of SlotAttention", lo=1, hi=256)
    num_iterations: int = key(3, "SlotAttention iterations", lo=1, hi=32)
    num_heads: int = key(4, "cross-attention heads (must divide hidden_dim)", lo=1, hi=64)


@dataclass
class SurrogateOut:
    loss: torch.Tensor                                   # 0-dim fp32
    logs: dict[str, torch.Tensor] = field(default_factory=dict)  # detached, at least rob_loss and intra_mse


class Surrogate(nn.Module):
    """Base class: ``forward(z, y) -> SurrogateOut`` and optionally ``refit(features, labels)``."""

    name: ClassVar[str] = ""
    Keys: ClassVar[type] = SurrogateKeys     # the surrogate's own keys and their defaults
    keys: ClassVar[tuple] = ()               # their flat names, set by @register
    defaults: ClassVar[dict] = {}            # defaults of CemConfig's "surrogate's own" keys
    # cem.estimator_fit values that apply (docs/estimators.md); the first one is the default
    fit_modes: ClassVar[tuple] = ("adversarial", "joint")
    needs_refit: ClassVar[bool] = False

    def __init__(self, cfg: TrialConfig, feature_shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        self.cfg = cfg.cem
        self.noise_std = cfg.defense.noise_std
        self.feature_shape = tuple(feature_shape)
        self.dim = int(torch.tensor(feature_shape).prod())
        self.num_classes = num_classes
        self.seed = cfg.seed
        self._stream: torch.Generator | None = None

    @classmethod
    def check(cls, cem) -> None:
        """Cross-key checks of a resolved ``CemConfig`` that only this surrogate knows; raise ConfigError."""

    @classmethod
    def complete(cls, params: dict, cfg: TrialConfig) -> dict:
        """Derived defaults of the surrogate's own keys (``params`` holds every one of them), from them or from
        the trial's other keys (``cfg``), as the attacks' ``complete``."""
        return params

    @property
    def adversarial(self) -> bool:
        """True when the estimator's parameters maximise the estimate: every path by which they act on it
        must then be bounded (docs/estimators.md), which some surrogates arrange only in this mode."""
        return self.cfg.estimator_fit == "adversarial"

    def rng(self, device: torch.device) -> torch.Generator:
        """The surrogate's own random stream (slot initialisations, dropout), seeded from the trial seed.

        Drawing from the global RNG instead would shift the classifier's dropout masks, so a CEM run and its
        lambda = 0 baseline would differ by more than the CEM loss."""
        # "cuda" and "cuda:0" are one device: compared as given, a trainer asking with its torch.device("cuda")
        # and a forward asking with a tensor's cuda:0 replaced the stream with a freshly seeded one (every
        # checkpoint re-seeded it; inside a CUDA graph capture it is an error)
        if self._stream is None or not _same_device(self._stream.device, device):
            self._stream = torch.Generator(device=device).manual_seed(self.seed + RNG_OFFSET)
        return self._stream

    def compiled(self, options: dict):
        """``torch.compile`` of the training forward (``train.compile_surrogate``; static shapes: the step's batch
        is fixed), its random draws run eagerly (``layers.eager``, marked here: ``layers.disable_marked``)."""
        disable_marked(self)
        return torch.compile(self, dynamic=False, options=options)

    def probe_compiled(self, compiled, batch: int, device: torch.device, mode: str):
        """``(forward, why_not)``: run the compiled training forward and backward on a batch of zeros shaped as
        the step's, so that a toolchain that cannot compile (no C++ compiler for the CPU, no Triton for CUDA)
        shows before the first epoch, not at the first CEM step after the warm-up epochs; the step then reuses
        the compiled code (the same shapes and memory format). Under ``mode`` "auto" a failure gives the eager
        module back with the reason (and says so); under "on" it is a ``ConfigError`` that says what to set.
        Leaves no trace: the own random stream is restored, the gradients dropped, the mode kept."""
        z = torch.zeros((batch, *self.feature_shape), device=device)
        if device.type == "cuda" and z.dim() == 4:
            z = z.contiguous(memory_format=torch.channels_last)   # as the client's output arrives
        z.requires_grad_(True)
        y = torch.arange(batch, device=device) % self.num_classes
        gen = self.rng(device)
        state, was_training = gen.get_state(), self.training
        self.train()
        try:
            with torch.autocast(device.type, enabled=False):
                compiled(z, y).loss.backward()
            return compiled, None
        except Exception as e:  # noqa: BLE001 - whatever the compiler raised, the trial cannot use it
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            why = f"{type(e).__name__}: {first[:300]}"
            if mode == "auto":
                print(f"[cem-bench] train.compile_surrogate=auto: torch.compile could not compile surrogate "
                      f"{self.cfg.surrogate!r} on {device} ({why}); it runs eagerly (the same step to "
                      f"rounding)", flush=True)
                return self, why
            raise ConfigError(f"train.compile_surrogate=on, but torch.compile could not compile surrogate "
                              f"{self.cfg.surrogate!r} on {device}: {why}. Set "
                              f"train.compile_surrogate=off (the eager surrogate: the same step to "
                              f"rounding)") from e
        finally:
            gen.set_state(state)
            self.zero_grad(set_to_none=True)
            self.train(was_training)

    def rng_snapshot(self):
        """The own stream as it is now (``rng_restore`` puts it back): a measurement that runs the surrogate
        (``strength.untouched``) must not move a trial's stream."""
        return self._stream, (self._stream.get_state() if self._stream is not None else None)

    def rng_restore(self, snapshot) -> None:
        self._stream, state = snapshot
        if self._stream is not None:
            self._stream.set_state(state)

    @property
    def hinge_level(self) -> float:
        """t = log(tau * sigma^2 + gamma): variances below tau*sigma^2 are not penalised."""
        import math
        return math.log(self.cfg.var_threshold * self.noise_std ** 2 + self.cfg.var_eps)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> SurrogateOut:  # pragma: no cover - abstract
        raise NotImplementedError

    def refit(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Called at epoch ends with the clean training features (eval mode, no augmentation, no noise)."""

    @property
    def fitted(self) -> bool:
        return True


RNG_OFFSET = 7919   # the surrogate's stream is seed + this, apart from the trainer's (seed) and gmm's k-means


def _same_device(a, b) -> bool:
    def norm(d):
        d = torch.device(d)
        if d.type == "cuda" and d.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return d
    return norm(a) == norm(b)


REGISTRY: Registry[Surrogate] = Registry("surrogate", "cem_bench.surrogates", key="cem.surrogate",
                                         skip=("base", "layers", "clustering"))
register, names, get = REGISTRY.register, REGISTRY.names, REGISTRY.get


def resolve(cfg: TrialConfig) -> TrialConfig:
    """The config with every key of the chosen surrogate filled in: CemConfig's empty keys from the
    surrogate's ``defaults`` (then the global ones), its own ``Keys`` from their defaults where not set. Keys of
    other surrogates are dropped (they do not apply). Raises ``ConfigError`` for a value this surrogate does
    not allow."""
    klass = get(cfg.cem.surrogate)
    cem = cfg.cem
    updates = {}
    # cem.strength: a loss_scale set by hand is a fixed scale; matched leaves loss_scale empty (the trial
    # measures it at its first CEM epoch and records it)
    strength = cem.strength
    if strength is None:
        strength = "fixed" if cem.loss_scale is not None else klass.defaults.get("cem.strength", "fixed")
    elif strength == "matched" and cem.loss_scale is not None:
        raise ConfigError(f"cem.loss_scale={cem.loss_scale!r} is a fixed scale, but cem.strength=matched measures "
                          f"it on the trial's encoder: set cem.strength=fixed to use your scale, or drop "
                          f"cem.loss_scale")
    updates["strength"] = strength
    for key_, fallback in GLOBAL_DEFAULTS.items():
        name = key_.split(".", 1)[1]
        if getattr(cem, name) is None and not (name == "loss_scale" and strength == "matched"):
            updates[name] = klass.defaults.get(key_, fallback)
    if cem.estimator_fit is None:
        updates["estimator_fit"] = klass.defaults.get("cem.estimator_fit", klass.fit_modes[0])
    own = {f.name: getattr(klass.Keys(), f.name) for f in dataclasses.fields(klass.Keys)}
    params = klass.complete({**own, **{k: v for k, v in cem.params.items() if k in own}}, cfg)
    for f in dataclasses.fields(klass.Keys):
        choices = f.metadata.get("choices")
        if choices and params[f.name] not in choices:
            raise ConfigError(f"cem.{f.name}: {params[f.name]!r} does not apply to surrogate {cfg.cem.surrogate!r}; "
                              f"allowed: {', '.join(choices)}")
    fit = updates.get("estimator_fit", cem.estimator_fit)
    if fit not in klass.fit_modes:
        raise ConfigError(f"cem.estimator_fit: {fit!r} does not apply to surrogate {cfg.cem.surrogate!r}; "
                          f"allowed: {', '.join(klass.fit_modes)}")
    if "num_heads" in params and params["hidden_dim"] % params["num_heads"]:
        raise ConfigError(f"cem.num_heads: {params['num_heads']} must divide cem.hidden_dim ({params['hidden_dim']})")
    if strength == "matched" and cfg.cem.surrogate == REFERENCE_SURROGATE:
        # gmm is the reference: at its own keys, matched to itself is its own loss scale (1, fixed, nothing to
        # measure). Another gmm (one cluster, fused, a per-dimension hinge, ...) pulls otherwise per unit λ, and is
        # matched to the reference as an attention surrogate is: the way to ask which of their differences a lead
        # comes from at one strength (docs/estimators.md "One λ scale").
        own_defaults = klass.complete(dict(own), cfg)
        if updates.get("grad_mode", cem.grad_mode) == klass.defaults["cem.grad_mode"] and params == own_defaults:
            updates.update(strength="fixed", loss_scale=klass.defaults["cem.loss_scale"])
    resolved = dataclasses.replace(cem, **updates, params=params)
    klass.check(resolved)
    return dataclasses.replace(cfg, cem=resolved)


def never_active(cfg: TrialConfig) -> str | None:
    """Why CEM would never run in this resolved config, or None: λ > 0 but ``cem.warmup_epochs`` (the surrogate's
    own default where empty: gmm 1, slot_cross 3, gated_attention 5) is at least ``train.epochs``, so every epoch
    is a warm-up one, or a fixed strength whose ``cem.loss_scale`` is 0. Such a run was a λ = 0 run labelled
    "λ 16 gmm", its matched scale the unmeasured 1.0, and a hypothesis on it "held" at chance accuracy
    (2026-12-06 audit)."""
    warmup = cfg.cem.warmup_epochs or 0
    if cfg.cem.lambd > 0 and warmup >= cfg.train.epochs:
        return (f"cem.warmup_epochs: {warmup} (surrogate {cfg.cem.surrogate!r}) is not below train.epochs "
                f"{cfg.train.epochs}, so the CEM loss would never be applied (a λ = 0 run under another name): give "
                f"train.epochs above {warmup}, or a smaller cem.warmup_epochs")
    if cfg.cem.lambd > 0 and (cfg.cem.strength or "fixed") == "fixed" and cfg.cem.loss_scale == 0:
        # the same run under another name by another road (2026-12-07 audit: bit-identical to λ = 0, labelled λ 16)
        return (f"cem.loss_scale: 0 under cem.strength fixed (surrogate {cfg.cem.surrogate!r}) multiplies the CEM "
                f"loss by zero, so it would never pull (a λ = 0 run under another name): give cem.loss_scale above "
                f"0, leave it empty for the surrogate's default, or set cem.lambd 0 for the baseline")
    return None


def readers(key: str) -> list[str] | None:
    """The registered surrogates that read ``key``, when it is a surrogate's own key (``Surrogate.keys``: one
    that some surrogates read and others do not); None for a key every surrogate reads, or none declares."""
    who = [n for n in names() if key in get(n).keys]
    return who if who and len(who) < len(names()) else None


def build(cfg: TrialConfig, feature_shape, num_classes: int) -> Surrogate:
    """The surrogate of ``cfg`` (which must be resolved) for features of ``feature_shape``."""
    if cfg.cem.grad_mode is None:
        raise ValueError("build() needs a resolved config: call surrogates.resolve(cfg) first")
    return get(cfg.cem.surrogate)(cfg, feature_shape, num_classes)


# ------------------------------------------------------------------------------ vectorised helpers
def group_by_class(x: torch.Tensor, y: torch.Tensor, num_classes: int):
    """Lay a batch out per class without a host sync.

    Returns ``padded`` (G, B, D) with class c's members in rows [0, M_c) of ``padded[c]`` (in batch order),
    ``mask`` (G, B) bool, ``counts`` (G,) float and ``pos`` (B,), each sample's row in its class (sample j
    sits at ``padded[y[j], pos[j]]``, so ``rows(result, y, pos)`` maps a padded result back to the samples);
    G = ``num_classes``. The padded length is the batch size (the worst case), which costs memory but needs
    no ``.item()``.
    """
    b = x.shape[0]
    onehot = torch.nn.functional.one_hot(y, num_classes).to(x.dtype)        # (B, G)
    pos = (onehot.cumsum(0) - 1).gather(1, y.view(-1, 1)).squeeze(1).long()  # rank within its class
    counts = onehot.sum(0)
    padded = x.new_zeros(num_classes, b, *x.shape[1:]).index_put((y, pos), x)
    mask = torch.arange(b, device=x.device) < counts.unsqueeze(1)           # rows [0, M_c) of each class
    return padded, mask, counts, pos


def rows(t: torch.Tensor, idx: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
    """``t[idx]`` (or ``t[idx, pos]``) by ``index_select``, whose backward is a serial ``index_add_``.

    Advanced indexing back-propagates through ``index_put_(accumulate=True)``, which on a multi-threaded
    CPU adds floats with atomics in whatever order the threads run: the same step then gives gradients
    that differ in the last bits, and a trial diverges from its own rerun within a few epochs."""
    if pos is None:
        return t.index_select(0, idx)
    return t.flatten(0, 1).index_select(0, idx * t.shape[1] + pos)


def soft_cell_stats(x: torch.Tensor, y: torch.Tensor, r: torch.Tensor, num_classes: int, min_mass: float = 1e-12):
    """Statistics of soft cells: each sample j of class y_j belongs to cell k of its class with weight r_jk.

    ``x`` (B, S) rows, ``r`` (B, K) responsibilities (rows sum to 1). Returns ``mass`` (G, K) = sum_j r_jk,
    ``mean`` (G, K, S) and the per-dimension ``var`` (G, K, S) = sum_j r_jk (x_j - mean_k)^2 / mass_k (two
    passes: exact, differentiable in x and r). No host sync."""
    g, k = num_classes, r.shape[1]
    mass = x.new_zeros(g, k).index_add(0, y, r)
    inv = (1.0 / mass.clamp(min=min_mass)).unsqueeze(-1)
    rx = r.unsqueeze(-1) * x.unsqueeze(1)                                       # (B, K, S)
    mean = x.new_zeros(g, k, x.shape[1]).index_add(0, y, rx) * inv
    dev2 = r.unsqueeze(-1) * (x.unsqueeze(1) - rows(mean, y)).pow(2)
    var = x.new_zeros(g, k, x.shape[1]).index_add(0, y, dev2) * inv
    return mass, mean, var


def intra_class_mse(x: torch.Tensor, y: torch.Tensor, num_classes: int,
                    counts: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over samples (of classes with >= 2 members) of the per-dimension mean squared distance to
    the class mean. ``x`` is (B, D); ``counts`` (G,), the class sizes, where the caller has them already.
    Detached; no host sync."""
    with torch.no_grad():
        x = x.float()
        onehot = torch.nn.functional.one_hot(y, num_classes).to(x.dtype)
        if counts is None:
            counts = onehot.sum(0)
        means = (onehot.t() @ x) / counts.clamp(min=1).unsqueeze(1)
        sq = torch.nn.functional.mse_loss(x, means.index_select(0, y), reduction="none").mean(1)
        keep = (counts >= 2).to(x.dtype).index_select(0, y)
        return (sq * keep).sum() / keep.sum().clamp(min=1)
