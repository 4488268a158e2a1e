"""The reference of every configuration key that ``cem-bench keys`` prints: its default, and where the default
belongs to the plug-in (surrogate, attack) or to the dataset, each one's value; its allowed values; the plug-ins
it applies to; the registered surrogate and attack names.

Nothing here is written per key or per plug-in: the defaults are what ``surrogates.resolve`` and
``attacks.resolve`` give for each registered plug-in on each dataset, so a new surrogate file shows up here as
it does in a trial.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from typing import Any

from . import attacks, surrogates
from .config import TrialConfig, key_specs
from .errors import ConfigError
from .keys import KeySpec, number_text, specs_of


@dataclass(frozen=True)
class PluginKind:
    """A registry of plug-ins and the function that fills in a config's keys for the chosen ones."""
    registry: Any            # registry.Registry: kind, key (the selecting key), section, names(), get()
    resolve: Any             # TrialConfig -> TrialConfig

    @property
    def kind(self) -> str:
        return self.registry.kind

    def select(self, cfg: TrialConfig, name: str) -> TrialConfig:
        """``cfg`` with ``name`` as the only chosen plug-in (``cem.surrogate: name``, ``attack.names: [name]``).
        Set directly, without ``from_flat``'s validation: the defaults are read, not a trial built."""
        sec, field_name = self.registry.key.split(".", 1)
        section = getattr(cfg, sec)
        value = [name] if isinstance(getattr(section, field_name), list) else name
        return dataclasses.replace(cfg, **{sec: dataclasses.replace(section, **{field_name: value})})


PLUGIN_KINDS = (PluginKind(surrogates.REGISTRY, surrogates.resolve), PluginKind(attacks.REGISTRY, attacks.resolve))
DATASET_KEY = "data.dataset"


@dataclass
class KeyRef:
    """One key as the reference shows it."""
    name: str
    spec: KeySpec
    help: str
    kind: str | None = None                  # "surrogate" / "attack" when a registry owns the key's section
    applies_to: list[str] | None = None      # the plug-ins that read it; None = every trial
    default: Any = None                      # the value when nothing depends on the plug-in or dataset
    defaults_by: dict | None = None          # plug-in -> value, or plug-in -> {dataset: value}
    depends_on: list[str] = dataclasses.field(default_factory=list)   # the keys that choose the default
    choices: list | None = None
    choices_by: dict | None = None           # plug-in -> its own allowed values, where plug-ins differ
    note: str = ""                           # why there is no default, or how a derived one comes about

    def to_json(self) -> dict:
        s = self.spec
        rng = None
        if s.lo is not None or s.hi is not None:
            rng = {"lo": s.lo, "hi": s.hi, "lo_open": s.lo_open, "hi_open": s.hi_open}
        return {"name": self.name, "type": type_name(s.type), "default": self.default,
                "defaults_by": self.defaults_by, "depends_on": self.depends_on, "choices": self.choices,
                "choices_by": self.choices_by, "range": rng, "optional": s.optional, "kind": self.kind,
                "applies_to": self.applies_to, "allowed": self.allowed(), "help": self.help, "note": self.note}

    def allowed(self) -> str:
        text = self.spec.describe()
        if self.choices and not self.spec.choices:      # a key whose values are the registered plug-ins
            text += f"{' of' if text == 'list' else ' one of'} {', '.join(self.choices)} (the registered {self.kind}s)"
        if self.choices_by:
            text += f"; per {self.kind}: " + "; ".join(f"{p} {', '.join(map(fmt, c))}"
                                                        for p, c in self.choices_by.items())
        return text


def type_name(tp) -> str:
    """``int``, ``list``, ``list[int]``."""
    return str(tp) if typing.get_args(tp) else tp.__name__


def fmt(v: Any) -> str:
    """A value as one writes it in a config file or ``--set``."""
    if v is None:
        return "empty"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return number_text(v)
    if isinstance(v, list):
        return "[" + ", ".join(map(fmt, v)) + "]"
    return str(v)


def _empty_means(help_: str) -> str:
    """What an empty value stands for, as the key's help says it ("empty = ..."), else that it is unset."""
    m = re.search(r"empty = ([^;)]+)", help_)
    return f"empty = {m.group(1).strip()}" if m else "no value unless set"


def _resolved(kinds, datasets) -> dict[tuple[str, str, str], dict]:
    """(kind, plug-in, dataset) -> the flat config that plug-in resolves to on that dataset."""
    base = TrialConfig()
    out = {}
    for pk in kinds:
        for name in pk.registry.names():
            for ds in datasets:
                cfg = dataclasses.replace(base, data=dataclasses.replace(base.data, dataset=ds))
                out[(pk.kind, name, ds)] = pk.resolve(pk.select(cfg, name)).to_flat()
    return out


_MIXED = object()   # _common's answer when the values differ


def _common(values) -> Any:
    """The value every one of ``values`` has (a per-dataset dict is never common), else ``_MIXED``."""
    values = list(values)
    if not values or isinstance(values[0], dict) or any(v != values[0] for v in values):
        return _MIXED
    return values[0]


def _collapse(by_dataset: dict) -> Any:
    """One value when every dataset gives it, else the dict by dataset."""
    one = _common(by_dataset.values())
    return dict(by_dataset) if one is _MIXED else one


def reference(kinds=PLUGIN_KINDS) -> dict:
    """``{"surrogates": [...], "attacks": [...], "datasets": [...], "keys": [KeyRef, ...]}``, in
    ``key_specs()`` order."""
    specs = key_specs()
    datasets = list(specs[DATASET_KEY].choices)
    resolved = _resolved(kinds, datasets)
    by_section = {pk.registry.section: pk for pk in kinds}
    refs = []
    for name, spec in specs.items():
        pk = by_section.get(name.split(".")[0])
        ref = KeyRef(name, spec, spec.help, choices=list(spec.choices) if spec.choices else None)
        if pk is None:
            ref.default = spec.default
        elif name == pk.registry.key:                      # the key that chooses the plug-in
            ref.kind, ref.default, ref.choices = pk.kind, spec.default, pk.registry.names()
        else:
            _plugin_defaults(ref, pk, resolved, datasets)
        if ref.default is None and ref.defaults_by is None:
            ref.note = _empty_means(ref.help)
        refs.append(ref)
    return {"surrogates": surrogates.names(), "attacks": attacks.names(), "datasets": datasets, "keys": refs}


def _plugin_defaults(ref: KeyRef, pk: PluginKind, resolved, datasets) -> None:
    """Fill in a key of a plug-in section: its own key (``cem.num_slots``) or a section key whose default the
    plug-in sets (``cem.loss_scale``)."""
    spec, reg = ref.spec, pk.registry
    own = bool(spec.owners)
    names = [n for n in reg.names() if not own or ref.name in reg.get(n).keys]
    by = {n: _collapse({ds: resolved[(pk.kind, n, ds)][ref.name] for ds in datasets}) for n in names}
    ref.kind = pk.kind
    if not own and all(v == spec.default for v in by.values()):
        ref.default = spec.default                          # the section's own default, whatever the plug-in
        return
    ref.applies_to = names
    ref.defaults_by = by
    if any(v is None for v in by.values()):    # a plug-in leaves it empty: say what empty means there
        ref.note = _empty_means(spec.help)
    ref.depends_on = [reg.key]
    if any(isinstance(v, dict) for v in by.values()):
        ref.depends_on.append(DATASET_KEY)
    one = _common(by.values())
    if one is not _MIXED:
        ref.default = one
    if own:
        fields = {n: specs_of(reg.section, reg.get(n).Keys)[ref.name] for n in names}
        ref.help = fields[next(o for o in spec.owners if o in fields)].help if fields else spec.help
        choices = {n: list(f.choices) for n, f in fields.items() if f.choices}
        if len({tuple(c) for c in choices.values()}) > 1:
            ref.choices_by = choices
        if any(f.default is None and not isinstance(by[n], dict) for n, f in fields.items()):
            # the plug-in computes it from other keys (``complete``): the value at their defaults, the rule in the help
            srcs = list(dict.fromkeys(k for f in fields.values() for k in f.derived_from))
            ref.depends_on += [k for k in srcs if k not in ref.depends_on]
            ref.note = f"derived from {', '.join(srcs) or 'other keys'}, here at their defaults: the help says how"


# ------------------------------------------------------------------------------------------ selection
def select(ref: dict, patterns=(), plugins: dict[str, str] | None = None, dataset: str | None = None) -> dict:
    """The keys whose name contains one of ``patterns``; with ``plugins`` (kind -> name) only the keys that
    plug-in reads and its own default; with ``dataset`` that dataset's default."""
    plugins = plugins or {}
    known = {"surrogate": ref["surrogates"], "attack": ref["attacks"]}
    for kind, name in plugins.items():
        if name not in known[kind]:
            raise ConfigError(f"unknown {kind} {name!r}; known: {', '.join(known[kind])}")
    if dataset is not None and dataset not in ref["datasets"]:
        raise ConfigError(f"unknown dataset {dataset!r}; known: {', '.join(ref['datasets'])}")
    out = []
    others: dict[str, list[str]] = {}   # matched keys that only another plug-in reads: who reads them
    for r in ref["keys"]:
        if patterns and not any(p in r.name for p in patterns):
            continue
        r = dataclasses.replace(r)
        chosen = plugins.get(r.kind)
        if chosen is not None and r.defaults_by is not None:
            if chosen not in r.defaults_by:
                others[r.name] = list(r.defaults_by)       # another plug-in's key
                continue
            r.defaults_by = {chosen: r.defaults_by[chosen]}
            r.applies_to = [chosen]
            if r.choices_by:
                r.choices_by = {chosen: r.choices_by[chosen]} if chosen in r.choices_by else None
        if dataset is not None and r.defaults_by is not None:
            r.defaults_by = {p: v[dataset] if isinstance(v, dict) else v for p, v in r.defaults_by.items()}
        if r.defaults_by is not None:
            one = _common(r.defaults_by.values())
            r.default = None if one is _MIXED else one
        out.append(r)
    if patterns and not out and others:
        chosen = ", ".join(f"{kind} {name}" for kind, name in plugins.items())
        raise ConfigError(f"no key {chosen} reads contains {' or '.join(map(repr, patterns))}: "
                          + "; ".join(f"{k} is read by {', '.join(v)}" for k, v in others.items()))
    if patterns and not out:
        raise ConfigError(f"no configuration key contains {' or '.join(map(repr, patterns))}; "
                          f"`cem-bench keys` lists them all")
    empty = [p for p in patterns if not p.strip()]
    if empty:   # an empty pattern (an unset variable?) is in every name: it listed every key
        raise ConfigError("an empty key pattern matches every key; give part of a key's name, e.g. cem.lambd, or "
                          "no pattern for all of them")
    # one pattern of several that matched nothing was dropped without a word (`keys cem.lambd zzz`, 2026-12-07)
    unmatched = [p for p in patterns if not any(p in r.name for r in ref["keys"])]
    if unmatched:
        raise ConfigError(f"no configuration key contains {' or '.join(map(repr, unmatched))} (the other "
                          f"pattern{'s' * (len(patterns) - len(unmatched) > 1)} matched); `cem-bench keys` lists "
                          f"them all")
    # a pattern of several whose keys the chosen plug-in all leaves unread was dropped without a word too
    # (`keys --surrogate gmm cem.num_slots cem.lambd` listed cem.lambd alone)
    unread = [p for p in patterns if not any(p in r.name for r in out)]
    if unread:
        chosen = ", ".join(f"{kind} {name}" for kind, name in plugins.items())
        raise ConfigError(f"no key {chosen} reads contains {' or '.join(map(repr, unread))}: "
                          + "; ".join(f"{k} is read by {', '.join(v)}" for k, v in others.items()
                                      if any(p in k for p in unread)))
    return {**ref, "keys": out}


# ------------------------------------------------------------------------------------------ output
def to_json(ref: dict) -> dict:
    return {"surrogates": ref["surrogates"], "attacks": ref["attacks"], "datasets": ref["datasets"],
            "keys": [r.to_json() for r in ref["keys"]]}


def default_text(r: KeyRef) -> str:
    if r.defaults_by is None:
        return f"none ({r.note})" if r.default is None else fmt(r.default)

    def one(v):
        return "(" + ", ".join(f"{d} {fmt(x)}" for d, x in v.items()) + ")" if isinstance(v, dict) else fmt(v)
    text = ", ".join(f"{p} {one(v)}" for p, v in r.defaults_by.items())
    return f"{text} ({r.note})" if r.note else text


def text_lines(ref: dict, width: int = 28) -> list[str]:
    lines = [f"surrogates (cem.surrogate): {', '.join(ref['surrogates'])}",
             f"attacks (attack.names): {', '.join(ref['attacks'])}",
             f"datasets ({DATASET_KEY}): {', '.join(ref['datasets'])}",
             "A default listed per surrogate or attack is that plug-in's own (the key left empty takes it); "
             "a key of some plug-ins is read by those alone.", ""]
    pad = " " * width
    for r in ref["keys"]:
        allowed = r.allowed()
        if r.applies_to is not None and r.spec.owners:
            allowed += f"; read by {r.kind}{'s' if len(r.applies_to) > 1 else ''} {', '.join(r.applies_to)}"
        elif r.applies_to is not None:
            allowed += f"; every {r.kind} reads it, with its own default"
        lines += [f"{r.name:{width - 1}s} default: {default_text(r)}", f"{pad}{allowed}", f"{pad}{r.help}"]
    return lines


# ------------------------------------------------------------------------------------------ keys nothing reads
# attack.* keys only training reads (the privacy probe's): a re-attack would take them and change nothing
TRAINING_ONLY_ATTACK_KEYS = ("attack.probe_epochs", "attack.probe_images", "attack.probe_iterations",
                             "attack.min_accuracy_margin")   # the utility gate: a re-attack always attacks
# the data sets that open data.root: digits and photos come from the installed wheels, synthetic is generated
ROOT_DATASETS = ("cifar10", "cifar100")


def unread_keys(overrides: dict, cfg: TrialConfig, reattack: bool = False) -> dict[str, tuple[str, bool]]:
    """The keys of ``overrides`` (a command line's ``--set``) that the run of ``cfg`` never reads, each with why
    and whether adding an attack to ``attack.names`` would make it read: taken silently, each was recorded as if
    it had shaped the run (``--set cem.num_slots=4`` under gmm trained gmm; ``attack.rmle_iterations`` with
    ``attack.names=[decoder]`` let a user believe rmle was strengthened). ``reattack``: the run is ``cem-bench
    attack``'s, which never trains (the probe's keys are unread). At λ = 0 no surrogate runs, and the same keys
    with ``cem.lambd=0`` are the baseline of that configuration: not refused. ``train --set``, ``attack --set``
    and ``search --set`` (a key no cell of the space reads) refuse them alike."""
    out: dict[str, tuple[str, bool]] = {}
    if cfg.cem.lambd > 0:
        for key in overrides:
            who = surrogates.readers(key)
            if who is not None and cfg.cem.surrogate not in who:
                out[key] = (f"{key} is read by {', '.join(who)}, not by cem.surrogate={cfg.cem.surrogate}", False)
        if cfg.cem.strength != "matched":   # 2026-12-07 probe: taken, and nothing recorded of them
            out.update({k: (f"{k} is read by a matched strength (cem.strength=matched), and this run's is "
                            f"{cfg.cem.strength}", False)
                        for k in ("cem.strength_batches", "cem.strength_every") if k in overrides})
    if "data.root" in overrides and cfg.data.dataset not in ROOT_DATASETS:
        out["data.root"] = (f"data.root is read for {' and '.join(ROOT_DATASETS)} only, and this run's "
                            f"data.dataset is {cfg.data.dataset}", False)
    if "train.milestones" in overrides and cfg.train.milestones_epochs:
        out["train.milestones"] = ("train.milestones is replaced by train.milestones_epochs, which is set", False)
    common = {f.name for f in dataclasses.fields(type(cfg.attack))} - {"params"}
    for key in overrides:
        if key in TRAINING_ONLY_ATTACK_KEYS:
            if reattack:
                out[key] = (f"{key} is read only by a trial (the privacy probe, the utility gate); a re-attack "
                            f"always attacks", False)
            continue
        name = key.removeprefix("attack.")
        if not key.startswith("attack.") or name in common or name in cfg.attack.params:
            continue
        readers = [a for a in attacks.names() if attacks.get(a).Keys is not None
                   and name in {f.name for f in dataclasses.fields(attacks.get(a).Keys)}]
        out[key] = (f"{key} is read by {', '.join(readers) or 'no attack'}, which "
                    f"attack.names={cfg.attack.names} does not run", bool(readers))
    return out
