"""Typed trial configuration: nested frozen dataclasses addressed by flat dotted keys.

The dataclasses are the source of truth. YAML files, ``--set key=value`` and search spaces only set
values. ``TrialConfig.from_flat`` validates every key and value and raises ``ConfigError`` naming the bad
key or value and listing what is allowed. Every field carries a ``help`` string (shown by
``cem-bench keys``) and optionally ``choices`` or a numeric range.

Surrogate-specific keys default to ``None``: "use the chosen surrogate's own default" (docs/surrogates.md).
``surrogates.resolve(cfg)`` fills them in; the resolved config is what goes into every result row.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import ConfigError  # noqa: F401  (re-exported: config errors are raised from here)
from .keys import KeySpec, coerce_value, key, plugin_specs, registered_names, spec_of_field, specs_of, unknown_key_message  # noqa: F401

_f = key


# the most images a split may ask for: 100x CIFAR-10, 4x ImageNet's training set. A typo of a few zeros
# (10^9) would otherwise try to allocate terabytes before anything said a word (data.check_memory below it).
MAX_IMAGES = 5_000_000
# The data sets with fixed splits and their sizes (train, test): data.train_size / data.test_size draw seeded
# subsets of them (core.data.seeded_subsets), so they can ask for at most these (tests check them against the
# loaders)
FIXED_SPLITS = {"digits": {"train": 1437, "test": 360}, "cifar10": {"train": 50_000, "test": 10_000},
                "cifar100": {"train": 50_000, "test": 10_000}}
# the largest trial seed: numpy's range. Generators are seeded with multiples of it (gmm's k-means stream
# 1000003 x (seed + 1), a graphed trainer's evaluation noise), which torch refuses past 64 bits, so a larger
# seed passed validation and then stopped the trial at its first CEM epoch.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class DataConfig:
    dataset: str = _f("synthetic", "dataset: synthetic (built in, no download), cifar10, cifar100, digits "
                      "(scikit-learn's 8x8 handwritten digits at 32x32, a fixed stratified 1437/360 split), photos "
                      "(32x32 patches of the 10 colour photographs in the scikit-image and scikit-learn wheels, a "
                      "class per photograph, train and test from disjoint regions); digits and photos are read "
                      "from the installed packages, never downloaded (docs/datasets.md)",
                      choices=("synthetic", "cifar10", "cifar100", "digits", "photos"))
    seed: int = _f(0, "seed of the synthetic images, of the photos' patch positions and of cifar and digits "
                   "subsets; separate from the trial seed so every trial of a search sees the same data")
    root: str = _f("~/.cache/cem-bench/data", "where CIFAR-10/100 live (downloaded if missing and online); the "
                   "other data sets never read it")
    train_size: Optional[int] = _f(None, "client training images (synthetic: how many to generate; photos: "
                                   "how many patches to cut; cifar, digits: a seeded subset; empty = all / "
                                   "4096 for synthetic and photos)", lo=1, hi=MAX_IMAGES)
    test_size: Optional[int] = _f(None, "test images (synthetic: how many to generate; photos: how many "
                                  "patches to cut from the held-out regions; cifar, digits: a seeded subset; "
                                  "empty = all / 2560 for synthetic and photos)", lo=20, hi=MAX_IMAGES)
    attack_split: str = _f("inference", "attacker protocol: 'inference' = attacker trains on test[:90%] and is "
                           "evaluated on test[90%:]; 'training' = attacker trains on the client's training set "
                           "and is evaluated on the whole test set (the paper's headline protocol)",
                           choices=("inference", "training"))


@dataclass(frozen=True)
class ModelConfig:
    width: float = _f(1.0, "channel multiplier of the VGG11-bn (1.0 = paper; the demo and the digits findings 0.125)",
                      lo=0.0, hi=4.0, lo_open=True)
    cut_layer: int = _f(4, "number of VGG config entries on the client (4 = conv64,pool,conv128,pool)", lo=1, hi=12)
    bottleneck_channels: int = _f(8, "conv to C channels at the cut (0 = no bottleneck)", lo=0, hi=512)
    sigmoid: bool = _f(True, "sigmoid on the smashed data (the paper's 'sgm')")


@dataclass(frozen=True)
class DefenseConfig:
    noise_std: float = _f(0.025, "std of Gaussian noise added to the smashed data in training, evaluation and "
                          "attacker queries", lo=0.0, hi=10.0)


def _plugin_key(section, name: str):
    """Read a plug-in key (``cfg.cem.num_slots``) from the section's ``params``."""
    params = section.__dict__.get("params")
    if params is not None and name in params:
        return params[name]
    raise AttributeError(f"{type(section).__name__} has no key {name!r}; plug-in keys are filled in by "
                         f"surrogates.resolve / attacks.resolve")


@dataclass(frozen=True)
class CemConfig:
    """The keys every surrogate has. Each surrogate declares its own keys beside its ``@register``
    (cem_bench/surrogates/); their values live in ``params`` and read as attributes."""
    lambd: float = _f(16.0, "lambda, weight of the CEM loss; 0 disables CEM (no surrogate is built)", lo=0.0)
    surrogate: str = _f("gmm", "conditional-entropy surrogate (see docs/surrogates.md)")
    grad_mode: Optional[str] = _f(None, "inject: the paper's two-backward gradient injection; fused: CE + "
                                  "lambda*L in one backward (empty = surrogate default)", choices=("inject", "fused"))
    warmup_epochs: Optional[int] = _f(None, "epochs without the CEM loss (empty = surrogate default)", lo=0)
    var_threshold: float = _f(0.125, "tau: the hinge sits at log(tau*sigma^2 + gamma)", lo=0.0)
    var_eps: float = _f(0.01, "gamma: added to variances inside the log", lo=0.0, lo_open=True)
    loss_scale: Optional[float] = _f(None, "multiplies the surrogate loss (seed name attention_loss_scale; "
                                     "empty = surrogate default, or measured under cem.strength=matched)", lo=0.0)
    strength: Optional[str] = _f(None, "what one unit of lambda means (docs/estimators.md, 'One lambda scale'): "
                                 "matched = gmm's pull on this trial's own encoder, measured at its first CEM epoch "
                                 "(the loss scale the trial used is recorded as cem_loss_scale; a fused term also "
                                 "follows the lr schedule as the injected ones do); fixed = cem.loss_scale as given "
                                 "(empty = surrogate default: matched for the attention surrogates, fixed for gmm, "
                                 "the reference; fixed whenever cem.loss_scale is set; gmm at its own keys is "
                                 "fixed even when matched is asked, any other gmm is matched to it)",
                                 choices=("matched", "fixed"))
    strength_every: int = _f(0, "cem.strength=matched: match again every N epochs after the first match, on the "
                             "encoder as it is then (0 = once, at the first CEM epoch; docs/estimators.md, 'One "
                             "lambda scale': how far a match drifts as training goes on)", lo=0)
    strength_batches: int = _f(64, "cem.strength=matched: training batches a match averages (gmm's and the "
                               "surrogate's pull on each; 64: slot_cross's per-batch pull on photos is heavy-tailed "
                               "and 32 left a match 1.6x off on held-out batches). Each costs a client forward, a "
                               "server forward-backward and one of gmm and of the surrogate: on a CPU trial of a few "
                               "batches an epoch, lower it",
                               lo=1, hi=100000)
    surrogate_lr: float = _f(1e-3, "Adam learning rate of the surrogate's own parameters", lo=0.0)
    estimator_fit: Optional[str] = _f(None, "how the surrogate's own parameters are trained (docs/estimators.md): "
                                      "adversarial = to maximise the estimate the encoder minimises; joint = to "
                                      "minimise it too (the seeds' literal design, which lets the estimate switch "
                                      "itself off); refit = no trained parameters, refitted by clustering (gmm) "
                                      "(empty = surrogate default)", choices=("adversarial", "joint", "refit"))
    params: dict = field(default_factory=dict, metadata={"internal": True})   # the surrogate's own keys

    def __getattr__(self, name: str):
        return _plugin_key(self, name)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = _f(240, "training epochs", lo=1)
    batch_size: int = _f(128, "training batch size (one larger than the training set trains one batch of the "
                              "whole set an epoch)", lo=2)
    lr: float = _f(0.05, "SGD learning rate (client and server)", lo=0.0, lo_open=True)
    momentum: float = _f(0.9, "SGD momentum", lo=0.0, hi=1.0, hi_open=True)
    weight_decay: float = _f(5e-4, "SGD weight decay", lo=0.0)
    milestones: list = _f([0.25, 0.5, 0.75, 0.875], "lr milestones as fractions of the run (x gamma each)")
    milestones_epochs: list[int] = _f([], "lr milestones as 1-based epochs with the reference's MultiStepLR "
                                      "meaning: the lr is multiplied by gamma from each listed epoch on (the "
                                      "reference: [60, 120, 180, 210] at 240 epochs, so epoch 60 already runs at "
                                      "0.01); strictly increasing positive integers, may lie beyond the run; when "
                                      "set it replaces train.milestones (empty = use train.milestones; "
                                      "docs/reference.md §2, §11.7)")
    gamma: float = _f(0.2, "lr decay factor at each milestone", lo=0.0, hi=1.0, lo_open=True)
    warmup_lr_epochs: float = _f(0.0, "linear learning-rate warm-up over the first N epochs, per step from lr/steps "
                                 "to the scheduled lr (what the reference's WarmUpLR was meant to do over its "
                                 "first epoch; 0 = none; at most train.epochs); the injection scale s(eta) keeps "
                                 "the scheduled lr",
                                 lo=0.0)
    augment: str = _f("crop_flip_rotate", "on-device augmentation: crop_flip_rotate (pad-4 crop, flip, "
                      "+-15 deg rotation), crop_flip, none", choices=("crop_flip_rotate", "crop_flip", "none"))
    amp: str = _f("auto", "bf16 autocast: auto (on for CUDA), on, off; surrogates always run in fp32",
                  choices=("auto", "on", "off"))
    tf32: str = _f("auto", "TensorFloat-32 for fp32 work on CUDA (Ampere and later; the CPU ignores it): auto = "
                   "PyTorch's defaults (convolutions may use TF32, matrix products stay fp32), on = both TF32, off = "
                   "both strict fp32. Matters with train.amp=off (the paper grid) and for the surrogates, which "
                   "always run in fp32 (docs/reference.md, 'Precision')", choices=("auto", "on", "off"))
    compile: bool = _f(False, "torch.compile the client and server")
    cuda_graph: str = _f("auto", "capture the training step (forward, noise, CE, CEM loss, backward, optimizer "
                         "steps) as one CUDA graph and replay it: auto (on for CUDA without train.compile), "
                         "on, off; the CPU always runs the eager step (docs/performance.md)",
                         choices=("auto", "on", "off"))
    surrogate_stream: str = _f("auto", "run the surrogate's forward and backward on a second CUDA stream, "
                               "concurrently with the server's (a parallel branch of the step's graph): auto = on "
                               "for graphed CUDA steps (train.cuda_graph), on, off; the CPU ignores it (measured: "
                               "docs/performance.md)", choices=("auto", "on", "off"))
    compile_surrogate: str = _f("auto", "torch.compile the surrogate's training forward (and so its backward): "
                                "fewer, fused kernels, also inside train.cuda_graph; compiled before the first epoch. "
                                "auto = on for graphed CUDA steps, falling back to the eager surrogate (said once, "
                                "recorded as surrogate_compile_failed) when the toolchain cannot compile; on = a "
                                "trial that cannot compile stops there; off. Its random draws stay eager "
                                "(docs/performance.md)", choices=("auto", "on", "off"))
    device: str = _f("auto", "auto (cuda if available), cpu, cuda, cuda:N")
    eval_batch_size: int = _f(1024, "batch size of evaluation passes", lo=1)
    reference_warmup_lr0: bool = _f(False, "reproduce the reference's WarmUpLR misuse: epoch 1 runs at lr 0 for "
                                    "client and server; the optimizers still step, so only the momentum buffers "
                                    "and the BatchNorm running statistics move (docs/reference.md §2, §11.6)")
    select_best_last: int = _f(0, "TEST-SET model selection as the reference does: attack and report the epoch "
                               "with the best noisy test accuracy among the last N epochs (the reference: the "
                               "last 40 of 240); the result records selected_epoch; 0 = off, the last epoch "
                               "(docs/reference.md §2, §11.9)", lo=0)


@dataclass(frozen=True)
class AttackConfig:
    """The keys every attack has. Each attack declares its own keys beside its ``@register``
    (cem_bench/attacks/); their values live in ``params`` and read as attributes."""
    names: list[str] = _f(["decoder", "rmle"], "the model-inversion attacks run on every trained encoder (a list: "
                          "`cem-bench keys` shows the registered ones). Each one's metrics are recorded under "
                          "its name (attack_ssim__rmle, ...); attack_ssim/attack_psnr/attack_mse are the "
                          "worst case for privacy over them, and attack_ssim_by/... name the attack that set it")
    seed: int = _f(200, "seed of the attacker (the paper's main_test_MIA uses 200)")
    min_accuracy_margin: float = _f(0.05, "utility gate: a trial whose final noisy test accuracy is below chance "
                                    "(1/classes) + this margin skips the attack: its attack metrics are NaN and "
                                    "attack_skipped says why (an encoder that carries no class information is "
                                    "private for free, and attacking it only costs time); negative = always "
                                    "attack", hi=1.0)
    probe_epochs: list[int] = _f([], "privacy probe during training: the 1-based epochs after which a cheap rmle "
                                 "attack (attack.probe_images images, attack.probe_iterations steps, the noise "
                                 "seeded by attack.seed) scores the current encoder; recorded as probe_ssim, "
                                 "probe_psnr, probe_s in that epoch's record (epochs.parquet, every intermediate "
                                 "result: NaN at the other epochs), so an early-stopping scheduler sees a privacy "
                                 "estimate at its rungs. Positive integers, each once; epochs beyond train.epochs "
                                 "never come (at least one must lie within the run); empty = no probe")
    probe_images: int = _f(64, "privacy probe: how many images it attacks, the first N of the attacker's "
                           "evaluation split (the same images at every probe)", lo=1)
    probe_iterations: int = _f(30, "privacy probe: Adam steps of its rmle optimisation (rmle's own lr and TV "
                               "weight, one start)", lo=1)
    params: dict = field(default_factory=dict, metadata={"internal": True})   # the attack's own keys

    def probe_problems(self) -> list[str]:
        """What is wrong with ``probe_epochs`` (the per-key checks cannot look inside a list)."""
        pe = self.probe_epochs
        if any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in pe) or len(set(pe)) != len(pe):
            return [f"attack.probe_epochs: {pe!r} must be positive integers, each listed once (1-based epochs "
                    f"after which the privacy probe runs), e.g. [10, 30, 90]; empty = no probe"]
        return []

    def __getattr__(self, name: str):
        return _plugin_key(self, name)


SECTIONS = {
    "data": DataConfig, "model": ModelConfig, "defense": DefenseConfig, "cem": CemConfig,
    "train": TrainConfig, "attack": AttackConfig,
}


@dataclass(frozen=True)
class TrialConfig:
    seed: int = _f(0, "seeds torch, numpy, data order and surrogate init", lo=0, hi=MAX_SEED)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    defense: DefenseConfig = field(default_factory=DefenseConfig)
    cem: CemConfig = field(default_factory=CemConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)

    # ------------------------------------------------------------------ flat keys
    @classmethod
    def from_flat(cls, flat: dict | None = None, base: TrialConfig | None = None) -> TrialConfig:
        """Build from ``{"cem.lambd": 8, ...}``. Unknown keys and bad values raise ``ConfigError``."""
        flat = dict(flat or {})
        if "attack.kind" in flat:      # before attack.names (results and checkpoints of older versions)
            kind = flat.pop("attack.kind")
            flat.setdefault("attack.names", [kind] if isinstance(kind, str) else kind)
        base = base or cls()
        specs = key_specs()
        errors = []
        updates: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for key_, value in flat.items():
            if key_ not in specs:
                errors.append(_unknown_key_message(key_, specs))
                continue
            try:
                value = coerce(key_, value, specs[key_])
            except ConfigError as e:
                errors.append(str(e))
                continue
            if specs[key_].owners:                     # a plug-in key: into the section's params
                sec, name = key_.split(".", 1)
                params = updates.setdefault(sec, {}).setdefault("params", dict(getattr(base, sec).params))
                if value is None:
                    params.pop(name, None)
                else:
                    params[name] = value
            elif "." in key_:
                sec, name = key_.split(".", 1)
                updates.setdefault(sec, {})[name] = value
            else:
                top[key_] = value
        kwargs = dict(top)
        for sec, vals in updates.items():
            kwargs[sec] = dataclasses.replace(getattr(base, sec), **vals)
        cfg = dataclasses.replace(base, **kwargs)
        try:  # cross-field checks on the valid part, so that every problem is reported at once
            cfg.validate()
        except ConfigError as e:
            errors.append(str(e))
        if errors:
            raise ConfigError("\n".join(errors))
        return cfg

    def to_flat(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seed": self.seed}
        for sec in SECTIONS:
            obj = getattr(self, sec)
            for f in dataclasses.fields(obj):
                v = getattr(obj, f.name)
                if f.name == "params":
                    out.update({f"{sec}.{k}": (list(p) if isinstance(p, list) else p) for k, p in sorted(v.items())})
                else:
                    out[f"{sec}.{f.name}"] = list(v) if isinstance(v, list) else v
        return out

    def replace(self, **flat) -> TrialConfig:
        """``cfg.replace(**{"cem.lambd": 0})``: a validated copy with some keys changed."""
        return TrialConfig.from_flat(flat, base=self)

    def validate(self) -> None:
        """Cross-field checks the per-key checks cannot do."""
        errors = []
        _load_plugins()
        kind, known = registered_names("cem.surrogate")
        if self.cem.surrogate not in known:
            errors.append(f"cem.surrogate: unknown {kind} {self.cem.surrogate!r}; known: {', '.join(known)}")
        kind, known = registered_names("attack.names")
        names = list(self.attack.names)
        bad = [n for n in names if n not in known]
        if not names or bad or len(set(names)) != len(names):
            why = (f"unknown {kind} {', '.join(map(repr, bad))}" if bad else
                   "is empty" if not names else "names an attack twice")
            errors.append(f"attack.names: {names!r} {why}; allowed: a list of {', '.join(known)}")
        ms = self.train.milestones
        if any((not isinstance(m, (int, float))) or not (0 < m <= 1) for m in ms) or \
                any(b <= a for a, b in zip(ms, ms[1:])):
            errors.append(f"train.milestones: {ms!r} must be strictly increasing fractions of the run in (0, 1]")
        me = self.train.milestones_epochs
        if any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in me) or \
                any(b <= a for a, b in zip(me, me[1:])):
            errors.append(f"train.milestones_epochs: {me!r} must be strictly increasing positive integers (1-based "
                          f"epochs from which the lr is multiplied by train.gamma), e.g. [60, 120, 180, 210]; "
                          f"empty = use train.milestones")
        errors.extend(self.attack.probe_problems())
        if self.train.warmup_lr_epochs > self.train.epochs:
            # the ramp would still be climbing when the run ends: every epoch trains below its scheduled lr
            # (2026-12-07: taken silently before)
            errors.append(f"train.warmup_lr_epochs: {self.train.warmup_lr_epochs:g} is longer than the run "
                          f"(train.epochs {self.train.epochs}): the learning rate would never reach its schedule; "
                          f"allowed: 0 (no warm-up) to {self.train.epochs}")
        pe = self.attack.probe_epochs
        if pe and not self.attack.probe_problems() and min(pe) > self.train.epochs:
            # one probe epoch past the run is allowed (a space's rungs may lie beyond a short trial); all of them
            # is a probe that never runs, and epochs.parquet's probe columns all NaN
            errors.append(f"attack.probe_epochs: {list(pe)} all lie beyond the run (train.epochs "
                          f"{self.train.epochs}): the privacy probe would never run; allowed: epochs 1 to "
                          f"{self.train.epochs}, or [] for no probe")
        dev = self.train.device
        if self.train.cuda_graph == "on" and dev == "cpu":
            errors.append("train.cuda_graph: 'on' needs a CUDA device but train.device is cpu; allowed here: auto "
                          "(graphs on CUDA only) or off")
        if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
            errors.append(f"train.device: {dev!r}; allowed: auto, cpu, cuda, cuda:N")
        # a URI as storage.is_uri tells one (a scheme first; config may not import storage): load_cifar took it as
        # a local folder named 's3:'
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", self.data.root):
            errors.append(f"data.root: {self.data.root!r} is a URI, but data.root is a folder on each machine that "
                          f"runs trials (CIFAR is read from and downloaded into it there); object storage is for a "
                          f"search's --storage only. Give a local path, e.g. ~/.cache/cem-bench/data (the default) "
                          f"or /data/cifar")
        for which, size in (("train", self.data.train_size), ("test", self.data.test_size)):
            have = FIXED_SPLITS.get(self.data.dataset, {}).get(which)
            if size is not None and have is not None and size > have:
                # a seeded subset cannot be larger than its split: the run would train on all of it while the
                # config, and so trials.parquet, kept the size asked (2026-12-07: taken silently before)
                errors.append(f"data.{which}_size: {size:,} is more than the {which} split of {self.data.dataset} "
                              f"holds ({have:,} images); allowed: 1 to {have:,}, or empty for all of it")
        if self.data.test_size is not None and self.data.attack_split == "inference" and self.data.test_size < 20:
            errors.append("data.test_size: the inference protocol needs at least 20 test images")
        if errors:
            raise ConfigError("\n".join(errors))


# ---------------------------------------------------------------------- the key table
# Packages whose plug-ins declare their own keys beside their @register (keys.declare). They are imported by
# name the first time the full key table is needed, so this module imports none of them.
PLUGIN_PACKAGES = ("cem_bench.surrogates", "cem_bench.attacks")
_SPECS: dict[str, KeySpec] | None = None


def _load_plugins() -> None:
    import importlib
    for name in PLUGIN_PACKAGES:
        importlib.import_module(name)


def core_key_specs() -> dict[str, KeySpec]:
    """The keys of the sections themselves (no plug-in keys)."""
    specs = {"seed": spec_of_field("seed", next(f for f in dataclasses.fields(TrialConfig) if f.name == "seed"),
                                   int)}
    for sec, klass in SECTIONS.items():
        specs.update(specs_of(sec, klass))
    return specs


def key_specs() -> dict[str, KeySpec]:
    """Every flat key with its type, default, help and allowed values: the sections' and the plug-ins'."""
    global _SPECS
    if _SPECS is None:
        _load_plugins()
        core, plugins = core_key_specs(), plugin_specs()
        clash = sorted(set(core) & set(plugins))
        if clash:
            raise ValueError(f"plug-in keys {clash} are already keys of the sections")
        specs = {}
        for sec in ["seed", *SECTIONS]:          # each section's own keys, then its plug-ins'
            specs.update({k: v for k, v in core.items() if k.split(".")[0] == sec})
            specs.update({k: v for k, v in plugins.items() if k.split(".")[0] == sec})
        _SPECS = specs
    return _SPECS


def _unknown_key_message(key_: str, specs: dict[str, KeySpec]) -> str:
    return unknown_key_message(key_, specs, SECTIONS)


def coerce(key_: str, value: Any, spec: KeySpec | None = None) -> Any:
    """Convert ``value`` (possibly a string from ``--set``) to the key's type and check its range."""
    if spec is None:
        spec = key_specs().get(key_)
        if spec is None:
            raise ConfigError(_unknown_key_message(key_, key_specs()))
    v = coerce_value(key_, value, spec)
    if v is not None and typing.get_args(spec.type) == (int,):     # list[int]: whole numbers only, no booleans
        raw = value
        if isinstance(raw, str):
            from .parsing import load_yaml
            raw = load_yaml(raw)
        if any(isinstance(x, bool) for x in raw) or any(not float(x).is_integer() for x in v):
            raise ConfigError(f"{key_}: {value!r} is not a list of integers; allowed: a list of integers")
        v = [int(x) for x in v]
    return v


def read_yaml(path: str, what: str, error: Callable[[str], ConfigError] = ConfigError) -> Any:
    """The document of a YAML file the user gave (``what``: "config file", "search space"); ``error`` (one
    message naming the file) when it is missing, a folder, a pipe or a device, unreadable, not UTF-8 text,
    not YAML, or past parsing.py's limits (an alias bomb, deep nesting, a huge integer, a key given twice).
    Plain values only, no Python objects."""
    import yaml

    from .parsing import MAX_BYTES, ParseError, load_yaml
    from .safefiles import is_remote, local
    if is_remote(path):   # read as a local name, it was "does not exist" (2026-12-07 probe)
        raise error(f"{what} {path!r} is in object storage; {what}s are read from this machine's files: copy it "
                    f"down first (for example `aws s3 cp {path} .`) and give that copy")
    path = local(path)    # file:///abs/x.yaml is /abs/x.yaml (it said "does not exist", as train --out takes it)
    try:
        # non-blocking: opening a named pipe for reading waits for a writer, before any check could say a word
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb", buffering=0) as fh:
            import stat
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode) and not os.path.isdir(path):
                raise error(f"{what} {path!r} is not a regular file (a pipe or a device): give a YAML file")
            data = fh.read(MAX_BYTES + 1)
        return load_yaml(data)
    except FileNotFoundError:
        raise error(f"{what} {path!r} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} {path!r} is a folder, not a YAML file") from None
    except OSError as e:
        raise error(f"{what} {path!r} cannot be read ({e.strerror or type(e).__name__})") from None
    except UnicodeDecodeError as e:
        raise error(f"{what} {path!r} is not UTF-8 text (byte {e.start}): a YAML file is text") from None
    except ParseError as e:
        raise error(f"{what} {path!r} is refused: {e}") from None
    except yaml.constructor.ConstructorError as e:   # a tag (!!python/…): refused by the safe loader, never run
        raise error(f"{what} {path!r} is refused: cem-bench reads plain YAML, without tags such as !!python/…; "
                    f"nothing in it was run ({e})") from None
    except yaml.YAMLError as e:
        raise error(f"{what} {path!r} is not valid YAML: {e}") from None


def load_yaml_config(path: str) -> dict[str, Any]:
    """Read a YAML config file: either flat dotted keys or nested sections; returns flat keys."""
    doc = read_yaml(path, "config file")
    if doc is None or doc == {}:
        # a run with every default (240 epochs) from a file that was meant to say something
        raise ConfigError(f"config file {path!r} is empty; give keys (`cem-bench keys` lists them), e.g. "
                          f"train.epochs: 10, or leave --config out to run the defaults")
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of keys to values")
    space = sorted(k for k in ("objectives", "params", "fixed", "sampler", "num_samples") if k in doc)
    if len(space) >= 2:   # each of a search space's sections would be listed as an unknown key
        raise ConfigError(f"config file {path!r} is a search space ({', '.join(space)}), not config keys: run it "
                          f"with `cem-bench search {path}`, or give --config a file of keys (`cem-bench keys`)")
    why = calibrate_file_problem(doc, path)
    if why:   # each surrogate's entry would be listed as an unknown key
        raise ConfigError(why)
    return flatten(doc)


def calibrate_file_problem(doc: Any, path: str) -> str | None:
    """Why ``doc`` (a --config file's mapping) is a whole ``cem-bench calibrate --yaml`` file, one entry of
    ``cem.*`` keys per surrogate, with how to use one entry; None when it is not one."""
    if not (isinstance(doc, dict) and doc and all(isinstance(k, str) and "." not in k for k in doc)
            and all(isinstance(v, dict) and v and all(str(k).startswith("cem.") for k in v) for v in doc.values())
            and any("cem.loss_scale" in v or "cem.strength" in v for v in doc.values())):
        return None
    name = next((n for n in doc if n != "gmm"), next(iter(doc)))   # gmm: the reference, at its own scale
    sets = " ".join(f"--set {k}={v}" for k, v in {"cem.surrogate": name, **doc[name]}.items())
    return (f"--config {path} is a cem-bench calibrate file (one entry per surrogate: {', '.join(doc)}), not "
            f"config keys. Use one entry: its keys as --set ({sets}), or its mapping alone in a --config file")


def flatten(doc: dict, prefix: str = "", errors: list[str] | None = None) -> dict[str, Any]:
    """Nested sections (``train: {epochs: 3}``) and flat dotted keys (``train.epochs: 3``) -> flat keys.
    ConfigError for a key given both ways (the later one won silently), naming both spellings, and for a
    section that is not a mapping. With ``errors`` (a list) the problems are appended there instead and the rest
    is flattened (a duplicate keeps its first value), so that a caller that reports every problem at once
    (a search space) can go on checking the other keys."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    problems: list[str] = []
    _flatten_into(doc, prefix, out, spelled, problems)
    if problems and errors is None:
        raise ConfigError("\n".join(problems))
    if errors is not None:
        errors.extend(problems)
    return out


def _flatten_into(doc: dict, prefix: str, out: dict[str, Any], spelled: dict[str, str], problems: list[str]) -> None:
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key in SECTIONS:
            _flatten_into(v, key + ".", out, spelled, problems)
        elif key in SECTIONS:
            problems.append(f"{key}: {v!r} is not a mapping; {key} is a section: give its keys under it "
                            f"({key}: {{{next(iter(section_keys(key)))}: ...}}) or flat "
                            f"({key}.{next(iter(section_keys(key)))}: ...)")
        else:
            shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
            spelling = f"{prefix[:-1]}: {{{k}: {shown}}}" if prefix else f"{key}: {shown}"
            if key in out:
                problems.append(f"the key {key!r} is given twice, as {spelled[key]} and as {spelling}; the later "
                                f"one would win silently: give it once, nested under its section or flat")
                continue
            out[key] = v
            spelled[key] = spelling


def section_keys(section: str) -> list[str]:
    """The key names of ``section`` (without the section), for messages."""
    return [f.name for f in dataclasses.fields(SECTIONS[section])]


def parse_set(items: list[str]) -> dict[str, Any]:
    """``["cem.lambd=8", ...]`` -> ``{"cem.lambd": "8"}`` (values are coerced later). A key set twice to two
    values is refused, as a duplicate key of a --config file is: the last one won silently (2026-12-07 probe),
    and a command line built by a script that appends its own --set over the user's hid which one ran."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, for example cem.lambd=8")
        k, v = item.split("=", 1)
        k = k.strip()
        if k in out and out[k].strip() != v.strip():
            raise ConfigError(f"--set {k} is given twice, as {out[k]!r} and {v!r}; give each key once")
        out[k] = v
    return out
