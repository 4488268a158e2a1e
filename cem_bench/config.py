"""Typed trial configuration: nested frozen dataclasses addressed by flat dotted keys.

The dataclasses are the source of truth. YAML files, ``--set key=value`` and search spaces only set
values. ``TrialConfig.from_flat`` validates every key and value and raises ``ConfigError`` naming the bad
key or value and listing what is allowed. Every field carries a ``help`` string (shown by
``cem-bench keys``) and optionally ``choices`` or a numeric range.

Surrogate-specific keys default to ``None``: "use the chosen surrogate's own default" (SURROGATES.md).
``surrogates.resolve(cfg)`` fills them in; the resolved config is what goes into every result row.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Optional


from .errors import ConfigError  # noqa: F401  (re-exported: config errors are raised from here)


def _f(default: Any, help: str, *, choices: tuple | None = None, lo: float | None = None,
       hi: float | None = None, lo_open: bool = False, hi_open: bool = False):
    meta = {"help": help, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class DataConfig:
    dataset: str = _f("synthetic", "dataset: synthetic (built in, no download), cifar10, cifar100",
                      choices=("synthetic", "cifar10", "cifar100"))
    seed: int = _f(0, "seed of the synthetic images and of cifar subsets; separate from the trial seed so "
                   "every trial of a search sees the same data")
    root: str = _f("~/.cache/cem-bench/data", "where torchvision datasets live (downloaded if missing and online)")
    train_size: Optional[int] = _f(None, "client training images (synthetic: how many to generate; "
                                   "cifar: a seeded subset; empty = all / 4096 for synthetic)", lo=1)
    test_size: Optional[int] = _f(None, "test images (synthetic: how many to generate; cifar: a seeded "
                                  "subset; empty = all / 2560 for synthetic)", lo=20)
    attack_split: str = _f("inference", "attacker protocol: 'inference' = attacker trains on test[:90%] and is "
                           "evaluated on test[90%:]; 'training' = attacker trains on the client's training set "
                           "and is evaluated on the whole test set (the paper's headline protocol)",
                           choices=("inference", "training"))


@dataclass(frozen=True)
class ModelConfig:
    width: float = _f(1.0, "channel multiplier of the VGG11-bn (1.0 = paper, 0.25 for CPU demos)",
                      lo=0.0, hi=4.0, lo_open=True)
    cut_layer: int = _f(4, "number of VGG config entries on the client (4 = conv64,pool,conv128,pool)", lo=1, hi=12)
    bottleneck_channels: int = _f(8, "conv to C channels at the cut (0 = no bottleneck)", lo=0, hi=512)
    sigmoid: bool = _f(True, "sigmoid on the smashed data (the paper's 'sgm')")


@dataclass(frozen=True)
class DefenseConfig:
    noise_std: float = _f(0.025, "std of Gaussian noise added to the smashed data in training, evaluation and "
                          "attacker queries", lo=0.0, hi=10.0)


@dataclass(frozen=True)
class CemConfig:
    lambd: float = _f(16.0, "lambda, weight of the CEM loss; 0 disables CEM (no surrogate is built)", lo=0.0)
    surrogate: str = _f("gmm", "conditional-entropy surrogate (see SURROGATES.md)")
    grad_mode: Optional[str] = _f(None, "inject: the paper's two-backward gradient injection; fused: CE + "
                                  "lambda*L in one backward (empty = surrogate default)", choices=("inject", "fused"))
    warmup_epochs: Optional[int] = _f(None, "epochs without the CEM loss (empty = surrogate default)", lo=0)
    var_threshold: float = _f(0.125, "tau: the hinge sits at log(tau*sigma^2 + gamma)", lo=0.0)
    var_eps: float = _f(0.01, "gamma: added to variances inside the log", lo=0.0, lo_open=True)
    loss_scale: Optional[float] = _f(None, "multiplies the surrogate loss (seed name attention_loss_scale; "
                                     "empty = surrogate default)", lo=0.0)
    surrogate_lr: float = _f(1e-3, "Adam learning rate of the surrogate's own parameters", lo=0.0)
    estimator_fit: Optional[str] = _f(None, "how the surrogate's own parameters are trained (docs/estimators.md): "
                                      "adversarial = to maximise the estimate the encoder minimises; joint = to "
                                      "minimise it too (the seeds' literal design, which lets the estimate switch "
                                      "itself off); refit = no trained parameters, refitted by clustering (gmm) "
                                      "(empty = surrogate default)", choices=("adversarial", "joint", "refit"))
    # gmm
    num_clusters: int = _f(5, "gmm: clusters per class", lo=1, hi=256)
    gmm_fit: str = _f("kmeans", "gmm: refit by hard k-means (the paper's code) or diagonal EM started from it",
                      choices=("kmeans", "em"))
    entropy: str = _f("isotropic", "gmm: hinge on the scalar variance (paper's code) or per dimension",
                      choices=("isotropic", "diag"))
    shrink: float = _f(10.0, "gmm: s in alpha = min(0.99, s*n/(pi*N_c)), batch-vs-prior shrinkage", lo=0.0)
    # attention surrogates
    stats_on: Optional[str] = _f(None, "statistics on raw encoder features (default) or on the surrogate's "
                                 "normalized/enhanced features", choices=("raw", "normalized", "enhanced"))
    hidden_dim: int = _f(128, "width of the attention layers' projected space", lo=1, hi=4096)
    num_slots: Optional[int] = _f(None, "slots of SlotAttention (empty = surrogate default)", lo=1, hi=256)
    num_iterations: Optional[int] = _f(None, "SlotAttention iterations (empty = surrogate default)", lo=1, hi=32)
    num_heads: Optional[int] = _f(None, "cross-attention heads (must divide hidden_dim; empty = surrogate default)",
                                  lo=1, hi=64)
    slot_temp: Optional[float] = _f(None, "extra damping of slot logits (empty = hidden_dim**0.25)",
                                    lo=0.0, lo_open=True)
    snr_thresh: float = _f(0.3, "SNR gate threshold on var/(mean^2+eps)", lo=0.0)
    snr_sharp: float = _f(10.0, "SNR gate sharpness", lo=0.0)
    softplus_beta: float = _f(1.0, "beta of the softplus hinge", lo=0.0, lo_open=True)
    margin: float = _f(0.1, "margin m of the softplus hinge (in log-variance units)")
    slot_power: float = _f(2.0, "exponent of slot/class weights", lo=0.0)
    class_gate_a: float = _f(10.0, "class gate sharpness a in sigmoid(a*(M_c/B - b))", lo=0.0)
    class_gate_b: float = _f(0.05, "class gate offset b in sigmoid(a*(M_c/B - b))", lo=0.0, hi=1.0)
    reg_strength: float = _f(0.025, "attention_centroid: rho in log(var + rho^2)", lo=0.0, lo_open=True)
    dropout: float = _f(0.1, "serial_enhanced: dropout in the FFN", lo=0.0, hi=1.0, hi_open=True)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = _f(240, "training epochs", lo=1)
    batch_size: int = _f(128, "training batch size", lo=2)
    lr: float = _f(0.05, "SGD learning rate (client and server)", lo=0.0, lo_open=True)
    momentum: float = _f(0.9, "SGD momentum", lo=0.0, hi=1.0, hi_open=True)
    weight_decay: float = _f(5e-4, "SGD weight decay", lo=0.0)
    milestones: list = _f([0.25, 0.5, 0.75, 0.875], "lr milestones as fractions of the run (x gamma each)")
    gamma: float = _f(0.2, "lr decay factor at each milestone", lo=0.0, hi=1.0, lo_open=True)
    augment: str = _f("crop_flip_rotate", "on-device augmentation: crop_flip_rotate (pad-4 crop, flip, "
                      "+-15 deg rotation), crop_flip, none", choices=("crop_flip_rotate", "crop_flip", "none"))
    amp: str = _f("auto", "bf16 autocast: auto (on for CUDA), on, off; surrogates always run in fp32",
                  choices=("auto", "on", "off"))
    compile: bool = _f(False, "torch.compile the client and server")
    device: str = _f("auto", "auto (cuda if available), cpu, cuda, cuda:N")
    eval_batch_size: int = _f(1024, "batch size of evaluation passes", lo=1)


@dataclass(frozen=True)
class AttackConfig:
    kind: str = _f("decoder", "model-inversion attack")
    epochs: Optional[int] = _f(None, "attack decoder epochs (empty = 50 as the paper on CIFAR, 10 on synthetic)",
                               lo=0)
    blocks: Optional[int] = _f(None, "residual blocks of the decoder (empty = 8 as the paper's res_normN8C64 "
                               "on CIFAR, 2 on synthetic)", lo=0, hi=64)
    channels: Optional[int] = _f(None, "channels of the decoder (empty = 64 as the paper on CIFAR, 32 on "
                                 "synthetic)", lo=1, hi=1024)
    lr: float = _f(1e-3, "Adam learning rate (cosine to 1e-5)", lo=0.0, lo_open=True)
    weight_decay: float = _f(1e-4, "Adam weight decay", lo=0.0)
    batch_size: int = _f(256, "attack batch size", lo=1)
    seed: int = _f(200, "seed of the attacker (the paper's main_test_MIA uses 200)")


# The paper's decoder attack (50 epochs, res_normN8C64) on CIFAR; a CPU-sized one on the synthetic demo data
# so that `cem-bench train` on it takes a minute or two, not twenty. Set the keys to override either.
DATASET_ATTACK_DEFAULTS = {
    "cifar10": {"epochs": 50, "blocks": 8, "channels": 64},
    "cifar100": {"epochs": 50, "blocks": 8, "channels": 64},
    "synthetic": {"epochs": 10, "blocks": 2, "channels": 32},
}


def resolve_attack(cfg: "TrialConfig") -> "TrialConfig":
    """Fill the attack keys left empty with the dataset's defaults."""
    defaults = DATASET_ATTACK_DEFAULTS[cfg.data.dataset]
    updates = {k: v for k, v in defaults.items() if getattr(cfg.attack, k) is None}
    if not updates:
        return cfg
    return dataclasses.replace(cfg, attack=dataclasses.replace(cfg.attack, **updates))


SECTIONS = {
    "data": DataConfig, "model": ModelConfig, "defense": DefenseConfig, "cem": CemConfig,
    "train": TrainConfig, "attack": AttackConfig,
}


@dataclass(frozen=True)
class TrialConfig:
    seed: int = _f(0, "seeds torch, numpy, data order and surrogate init")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    defense: DefenseConfig = field(default_factory=DefenseConfig)
    cem: CemConfig = field(default_factory=CemConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)

    # ------------------------------------------------------------------ flat keys
    @classmethod
    def from_flat(cls, flat: dict | None = None, base: "TrialConfig | None" = None) -> "TrialConfig":
        """Build from ``{"cem.lambd": 8, ...}``. Unknown keys and bad values raise ``ConfigError``."""
        flat = dict(flat or {})
        base = base or cls()
        specs = key_specs()
        errors = []
        updates: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for key, value in flat.items():
            if key not in specs:
                errors.append(_unknown_key_message(key, specs))
                continue
            try:
                value = coerce(key, value, specs[key])
            except ConfigError as e:
                errors.append(str(e))
                continue
            if "." in key:
                sec, name = key.split(".", 1)
                updates.setdefault(sec, {})[name] = value
            else:
                top[key] = value
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
                out[f"{sec}.{f.name}"] = list(v) if isinstance(v, list) else v
        return out

    def replace(self, **flat) -> "TrialConfig":
        """``cfg.replace(**{"cem.lambd": 0})``: a validated copy with some keys changed."""
        return TrialConfig.from_flat(flat, base=self)

    def validate(self) -> None:
        """Cross-field checks the per-key checks cannot do."""
        errors = []
        from .surrogates import names as surrogate_names
        from .attacks import names as attack_names
        if self.cem.surrogate not in surrogate_names():
            errors.append(f"cem.surrogate: unknown surrogate {self.cem.surrogate!r}; known: "
                          f"{', '.join(surrogate_names())}")
        if self.attack.kind not in attack_names():
            errors.append(f"attack.kind: unknown attack {self.attack.kind!r}; known: {', '.join(attack_names())}")
        ms = self.train.milestones
        if any((not isinstance(m, (int, float))) or not (0 < m <= 1) for m in ms) or list(ms) != sorted(ms):
            errors.append(f"train.milestones: {ms!r} must be increasing fractions of the run in (0, 1]")
        if self.cem.num_heads is not None and self.cem.hidden_dim % self.cem.num_heads:
            errors.append(f"cem.num_heads: {self.cem.num_heads} must divide cem.hidden_dim ({self.cem.hidden_dim})")
        dev = self.train.device
        if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
            errors.append(f"train.device: {dev!r}; allowed: auto, cpu, cuda, cuda:N")
        if self.data.test_size is not None and self.data.attack_split == "inference" and self.data.test_size < 20:
            errors.append("data.test_size: the inference protocol needs at least 20 test images")
        if errors:
            raise ConfigError("\n".join(errors))


# ---------------------------------------------------------------------- key registry
@dataclass(frozen=True)
class KeySpec:
    key: str
    type: Any
    default: Any
    help: str
    choices: tuple | None
    lo: float | None
    hi: float | None
    lo_open: bool
    hi_open: bool
    optional: bool

    def describe(self) -> str:
        t = getattr(self.type, "__name__", str(self.type))
        extra = ""
        if self.choices:
            extra = f" one of {', '.join(map(str, self.choices))}"
        elif self.lo is not None or self.hi is not None:
            lo = "-inf" if self.lo is None else f"{self.lo:g}"
            hi = "inf" if self.hi is None else f"{self.hi:g}"
            extra = f" in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open or self.hi is None else ']'}"
        opt = " or empty" if self.optional else ""
        return f"{t}{extra}{opt}"


_SPECS: dict[str, KeySpec] | None = None


def key_specs() -> dict[str, KeySpec]:
    """Every flat key with its type, default, help and allowed values."""
    global _SPECS
    if _SPECS is None:
        specs = {}

        def add(key, f, hints):
            tp = hints[f.name]
            optional = False
            if typing.get_origin(tp) is typing.Union:
                args = [a for a in typing.get_args(tp) if a is not type(None)]
                tp, optional = args[0], True
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            m = f.metadata
            specs[key] = KeySpec(key, tp, default, m.get("help", ""), m.get("choices"), m.get("lo"), m.get("hi"),
                                 m.get("lo_open", False), m.get("hi_open", False), optional)

        hints = typing.get_type_hints(TrialConfig)
        add("seed", next(f for f in dataclasses.fields(TrialConfig) if f.name == "seed"), hints)
        for sec, klass in SECTIONS.items():
            h = typing.get_type_hints(klass)
            for f in dataclasses.fields(klass):
                add(f"{sec}.{f.name}", f, h)
        _SPECS = specs
    return _SPECS


def _unknown_key_message(key: str, specs: dict[str, KeySpec]) -> str:
    import difflib
    close = difflib.get_close_matches(key, specs.keys(), n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    sec = key.split(".")[0]
    same = [k for k in specs if k.startswith(sec + ".")]
    known = ", ".join(same) if same else "sections " + ", ".join(["seed", *SECTIONS])
    return f"unknown config key {key!r}{hint}; known keys here: {known}"


def coerce(key: str, value: Any, spec: KeySpec | None = None) -> Any:
    """Convert ``value`` (possibly a string from ``--set``) to the key's type and check its range."""
    spec = spec or key_specs().get(key)
    if spec is None:
        raise ConfigError(_unknown_key_message(key, key_specs()))
    bad = lambda why: ConfigError(f"{key}: {value!r} {why}; allowed: {spec.describe()}")  # noqa: E731
    empty = value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null"))
    if empty and spec.optional:
        return None
    if value is None or (isinstance(value, str) and not value.strip()):
        raise bad("is empty")
    tp = spec.type
    if tp is bool:
        if isinstance(value, bool):
            v = value
        elif isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on"):
            v = True
        elif isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off"):
            v = False
        elif isinstance(value, int) and value in (0, 1):
            v = bool(value)
        else:
            raise bad("is not a boolean")
    elif tp is int:
        if isinstance(value, bool):
            raise bad("is a boolean, not an integer")
        if isinstance(value, int):
            v = value
        elif isinstance(value, float) and value.is_integer():
            v = int(value)
        elif isinstance(value, str):
            try:
                v = int(value.strip())
            except ValueError:
                raise bad("is not an integer") from None
        else:
            raise bad("is not an integer")
    elif tp is float:
        if isinstance(value, bool):
            raise bad("is a boolean, not a number")
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise bad("is not a number") from None
        if not math.isfinite(v):
            raise bad("is not finite")
    elif tp is str:
        if not isinstance(value, str):
            raise bad("is not a string")
        v = value.strip()
    elif tp is list or typing.get_origin(tp) is list:
        if isinstance(value, str):
            import yaml
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                raise bad("is not a list") from None
        if not isinstance(value, (list, tuple)):
            raise bad("is not a list")
        try:
            v = [float(x) for x in value]
        except (TypeError, ValueError):
            raise bad("is not a list of numbers") from None
    else:  # pragma: no cover - every field uses one of the types above
        v = value
    if spec.choices is not None and v not in spec.choices:
        raise bad("is not allowed")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if spec.lo is not None and (v < spec.lo or (spec.lo_open and v == spec.lo)):
            raise bad("is out of range")
        if spec.hi is not None and (v > spec.hi or (spec.hi_open and v == spec.hi)):
            raise bad("is out of range")
    return v


def load_yaml_config(path: str) -> dict[str, Any]:
    """Read a YAML config file: either flat dotted keys or nested sections; returns flat keys."""
    import yaml
    try:
        with open(path) as fh:
            doc = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path!r} is not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of keys to values")
    return flatten(doc)


def flatten(doc: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key in SECTIONS:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def parse_set(items: list[str]) -> dict[str, Any]:
    """``["cem.lambd=8", ...]`` -> ``{"cem.lambd": "8"}`` (values are coerced later)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, for example cem.lambd=8")
        k, v = item.split("=", 1)
        out[k.strip()] = v
    return out
