"""Configuration keys: the dataclass field helper (help, choices, range), ``KeySpec``, value coercion, and the
table of keys that plug-ins (surrogates, attacks) declare beside their ``@register``.

A plug-in declares its keys as a frozen dataclass of ``key(...)`` fields; ``declare("cem", "slot_cross",
SlotCrossKeys)`` adds them to the flat namespace (``cem.num_slots``, ...). Several plug-ins may declare the
same name (``cem.num_slots`` for three surrogates): the flat key then accepts the union of their choices and
its default is "the plug-in's own". Imports nothing of the project but ``errors``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError


def key(default: Any, help: str, *, choices: tuple | None = None, lo: float | None = None,
        hi: float | None = None, lo_open: bool = False, hi_open: bool = False, derived_from: tuple = ()):
    """A dataclass field carrying the key's help text and allowed values (shown by ``cem-bench keys``);
    ``derived_from``: the other keys an empty value is computed from (a plug-in's ``complete``)."""
    meta = {"help": help, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open,
            "derived_from": tuple(derived_from)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


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
    owners: tuple = ()          # the plug-ins that declared it (empty for the core keys)
    derived_from: tuple = ()    # the keys an empty value is computed from

    def describe(self) -> str:
        t = "bool (true or false)" if self.type is bool else getattr(self.type, "__name__", str(self.type))
        extra = ""
        if self.choices:
            extra = f" one of {', '.join(map(str, self.choices))}"
        elif self.lo is not None or self.hi is not None:
            lo = "-inf" if self.lo is None else number_text(self.lo)
            hi = "inf" if self.hi is None else number_text(self.hi)
            extra = f" in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open or self.hi is None else ']'}"
        opt = " or empty" if self.optional else ""
        return f"{t}{extra}{opt}"


def number_text(v: float) -> str:
    """``v`` as short as ``:g`` writes it where that reads back as ``v``, else in full: a bound or default
    shown rounded (4.29497e+09, 3.36359) is not the value the code uses."""
    short = f"{v:g}"
    return short if float(short) == v else repr(v)


def spec_of_field(name: str, f: dataclasses.Field, hint: Any) -> KeySpec:
    tp, optional = hint, False
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp, optional = args[0], True
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    m = f.metadata
    return KeySpec(name, tp, default, m.get("help", ""), m.get("choices"), m.get("lo"), m.get("hi"),
                   m.get("lo_open", False), m.get("hi_open", False), optional,
                   derived_from=tuple(m.get("derived_from", ())))


def specs_of(prefix: str, klass) -> dict[str, KeySpec]:
    """``{"prefix.field": KeySpec}`` of a dataclass of ``key(...)`` fields."""
    hints = typing.get_type_hints(klass)
    return {f"{prefix}.{f.name}": spec_of_field(f"{prefix}.{f.name}", f, hints[f.name])
            for f in dataclasses.fields(klass) if not f.metadata.get("internal")}


# ------------------------------------------------------------------------------------------ plug-in keys
_PLUGIN_SPECS: dict[str, KeySpec] = {}


def declare(prefix: str, owner: str, klass) -> tuple[str, ...]:
    """Add the keys of plug-in ``owner`` (a dataclass of ``key`` fields) under ``prefix``; return their flat
    names. A name another plug-in declared already must have the same type and range; choices are united."""
    names = []
    for name, spec in specs_of(prefix, klass).items():
        old = _PLUGIN_SPECS.get(name)
        if old is None:
            merged = dataclasses.replace(spec, default=None, optional=True, owners=(owner,))
        else:
            if (old.type, old.lo, old.hi, old.lo_open, old.hi_open) != (spec.type, spec.lo, spec.hi, spec.lo_open,
                                                                       spec.hi_open):
                raise ValueError(f"{name}: {owner} declares it as {spec.describe()}, but {', '.join(old.owners)} "
                                 f"as {old.describe()}; one key, one type and range")
            choices = old.choices
            if spec.choices:
                choices = tuple(dict.fromkeys((old.choices or ()) + spec.choices))
            merged = dataclasses.replace(old, choices=choices, owners=old.owners + (owner,),
                                         derived_from=tuple(dict.fromkeys(old.derived_from + spec.derived_from)))
        _PLUGIN_SPECS[name] = merged
        names.append(name)
    return tuple(names)


_NAMES: dict[str, tuple[str, list[str]]] = {}   # "cem.surrogate" -> ("surrogate", registered names)


def declare_name(key_: str, kind: str, name: str) -> None:
    """A plug-in registered as a value of ``key_`` (``cem.surrogate: slot_cross``)."""
    _NAMES.setdefault(key_, (kind, []))[1].append(name)


def registered_names(key_: str) -> tuple[str, list[str]]:
    """(kind, sorted registered names) of a key whose values are plug-ins."""
    kind, names = _NAMES.get(key_, (key_, []))
    return kind, sorted(names)


def plugin_specs() -> dict[str, KeySpec]:
    """The declared plug-in keys, each with "(used by: ...)" in its help."""
    return {k: dataclasses.replace(s, help=f"{s.help} (used by: {', '.join(s.owners)}; empty = its own default)")
            for k, s in sorted(_PLUGIN_SPECS.items())}


def unknown_key_message(key_: str, specs: dict[str, KeySpec], sections) -> str:
    import difflib
    close = difflib.get_close_matches(key_, specs.keys(), n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    sec = key_.split(".")[0]
    same = [k for k in specs if k.startswith(sec + ".")]
    known = ", ".join(same) if same else "sections " + ", ".join(["seed", *sections])
    return f"unknown config key {key_!r}{hint}; known keys here: {known}"


# the largest integer a key takes: exact in a float64 and in every JSON reader
MAX_INT = 2**53


def _bounded_repr(value: Any) -> str:
    """``repr(value)`` cut to a line, without walking all of it: a value from a file may be a structure of
    10⁹ shared references (a YAML alias bomb, a checkpoint's stored config) that a plain repr would expand."""
    import reprlib
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 2, 4, 4, 4, 4
    r.maxstring, r.maxlong, r.maxother = 120, 60, 120
    return r.repr(value)


def coerce_value(key: str, value: Any, spec: KeySpec) -> Any:
    """Convert ``value`` (possibly a string from ``--set``) to the key's type and check its range."""
    shown = _bounded_repr(value)
    bad = lambda why: ConfigError(f"{key}: {shown} {why}; allowed: {spec.describe()}")  # noqa: E731
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
            if abs(v) > MAX_INT:
                raise bad("is larger than any count or size cem-bench takes (|n| <= 2^53)")
        elif isinstance(value, float) and value.is_integer():
            v = int(value)
        elif isinstance(value, str):
            text = value.strip()
            if len(text.lstrip("+-")) > 20:
                raise bad("is larger than any count or size cem-bench takes (|n| <= 2^53)")
            try:
                v = int(text)
            except ValueError:
                raise bad("is not an integer") from None
            if abs(v) > MAX_INT:
                raise bad("is larger than any count or size cem-bench takes (|n| <= 2^53)")
        else:
            raise bad("is not an integer")
    elif tp is float:
        if isinstance(value, bool):
            raise bad("is a boolean, not a number")
        try:
            v = float(value)
        except OverflowError:
            raise bad("is too large for a number") from None
        except (TypeError, ValueError):
            raise bad("is not a number") from None
        if not math.isfinite(v):
            raise bad("is not finite")
    elif tp is str:
        if isinstance(value, bool) and spec.choices is not None and {"on", "off"} <= set(spec.choices):
            value = "on" if value else "off"    # YAML 1.1 reads an unquoted on/off (and true/false) as a boolean
        if not isinstance(value, str):
            raise bad("is not a string")
        v = value.strip()
    elif tp is list or typing.get_origin(tp) is list:
        if isinstance(value, str):
            import yaml

            from .parsing import ParseError, load_yaml
            try:
                value = load_yaml(value)
            except ParseError as e:
                raise bad(f"is refused: {e}") from None
            except yaml.YAMLError:
                raise bad("is not a list") from None
        if typing.get_args(tp) == (str,):           # list[str]: a bare name is a list of one
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) and x.strip() for x in value):
                raise bad("is not a list of names")
            v = [x.strip() for x in value]
        else:
            if not isinstance(value, (list, tuple)):
                raise bad("is not a list")
            if any(isinstance(x, bool) for x in value):   # YAML reads yes/on/true as True, which float() makes 1.0
                raise bad("holds a boolean, not a number")
            try:
                v = [float(x) for x in value]
            except OverflowError:
                raise bad("holds a number too large for a float") from None
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
