"""How the report writes a value: numbers (``format_value``; ``round_to`` the precision a spread allows), a
configuration's ``mean ± std`` (``ms``) and its difference from the baseline (``interval``), p-values
(``p_text``), counts with their noun (``plural``), axis labels (``better``), config columns without their
prefix (``short``), file names (``safe_name``) and the end of an error (``tail``)."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from cem_bench.schema import privacy_mode


def is_missing(value) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def varies(series: pd.Series) -> bool:
    """Does a column hold two or more distinct values (missing ones aside)? Lists and arrays (milestones,
    attack.names) compared by their items: ``astype(str)`` printed every array of a 100,000-row column, most
    of a report's time on a search's wide table."""
    s = series.dropna()
    try:
        return s.nunique() >= 2
    except TypeError:   # unhashable cells: lists, arrays
        return s.map(lambda v: tuple(np.ravel(v).tolist()) if isinstance(v, (list, tuple, np.ndarray)) else v
                     ).nunique() >= 2


def format_value(value, column: str = "") -> str:
    """Human formatting: seconds with one decimal, counts as ints, other floats with 4 significant digits."""
    if is_missing(value):
        return "—"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, pd.Timestamp):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        if column.endswith("_s"):
            return f"{v:,.1f}"
        if v.is_integer() and abs(v) < 1e6 and not column.startswith(("test_acc", "attack_", "feature_")):
            return f"{int(v):,}"
        if abs(v) >= 1e4:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(value)


def short(column: str) -> str:
    """A config column without its ``config.`` prefix."""
    return column[len("config.") :] if column.startswith("config.") else column


def better(metric: str, mode: str) -> str:
    """An axis label that says which direction is better (or more private)."""
    if privacy_mode(metric) is not None:
        return f"{metric} ({'lower' if mode == 'min' else 'higher'} = more private)"
    return f"{metric} ({'higher' if mode == 'max' else 'lower'} is better)"


def safe_name(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 configuration``, ``2 configurations``, ``1 ok trial``: a count with its noun in agreement."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def round_to(value, scale, signed: bool = False) -> str:
    """``value`` at the precision ``scale`` (a spread, a half-width) allows: two significant digits of the
    scale, so "0.905 ± 0.019", not "0.9054 ± 0.01851"; three significant digits without a scale."""
    if is_missing(value):
        return "—"
    v, s = float(value), abs(float(scale)) if not is_missing(scale) else float("nan")
    sign = "+" if signed else ""
    if not math.isfinite(v):
        return format_value(v)
    if not (math.isfinite(s) and s > 0):
        return f"{v:{sign}.3g}"
    decimals = max(0, 1 - math.floor(math.log10(s)))
    if decimals > 8:   # a spread below 1e-7 (float32 rounding): fixed decimals would print a difference as 0.00000000
        return f"{v:{sign}.3g}"
    return f"{v:{sign},.{decimals}f}"


def ms(row: pd.Series, metric: str) -> str:
    """``0.905 ± 0.019`` of a configuration row, rounded to its spread (the mean alone for a single run)."""
    mean, std = row.get(metric), row.get(f"{metric}_std")
    if is_missing(mean):
        return "—"
    if is_missing(std):
        return round_to(mean, None)
    return f"{round_to(mean, std)} ± {round_to(std, std)}"


def interval(row: pd.Series, metric: str) -> str:
    """``Δ -0.062 (95 % interval -0.090 to -0.030, P(improvement) 0.89)`` of a configuration row, rounded to the
    interval's half-width."""
    d, lo, hi, pb = (row.get(f"{metric}_{k}") for k in ("delta", "delta_lo", "delta_hi", "p_better"))
    if is_missing(d):
        return "Δ —"
    half = (float(hi) - float(lo)) / 2 if not (is_missing(lo) or is_missing(hi)) else None
    text = f"Δ {round_to(d, half, signed=True)}"
    if not is_missing(lo):
        text += f" (95 % interval {round_to(lo, half, signed=True)} to {round_to(hi, half, signed=True)}"
        text += f", P(improvement) {float(pb):.2f})" if not is_missing(pb) else ")"
    return text


def flag(value) -> bool:
    """A boolean cell: True only for a true boolean (a missing cell, NaN, is truthy to ``bool``)."""
    return isinstance(value, (bool, np.bool_)) and bool(value)


def few_on(row, metric: str) -> bool:
    """Whether ``row``'s configuration had too few runs with a value of ``metric`` for a comparison: its
    ``<metric>_few``; a table written before 2026-12-06 has only ``few_runs`` (any compared metric)."""
    own = row.get(f"{metric}_few")
    return flag(own) if own is not None and not is_missing(own) else flag(row.get("few_runs"))


def p_text(value) -> str:
    """A p- or q-value: two significant digits, "< 0.0001" below that."""
    if is_missing(value):
        return "—"
    v = float(value)
    from ..noise import p_digits
    return "< 0.0001" if v < 1e-4 else p_digits(v)


def tail(text, limit: int = 3000):
    """The last ``limit`` characters of an error (tracebacks end with the useful line)."""
    if is_missing(text):
        return None
    text = str(text)
    return text if len(text) <= limit else "…" + text[-limit:]
