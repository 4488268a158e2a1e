"""The paper-style table of a search: rows σ, columns λ × surrogate, cells mean ± std over the replicates.

``cem-bench table RESULTS_DIR [--csv] [--metrics ...]`` prints one table per metric (noisy test accuracy,
attack SSIM, PSNR, MSE by default) as Markdown, or as CSV. The numbers come from ``configs.parquet`` (built
from ``trials.parquet`` when missing). A configuration's cell is ``mean ± std (n)``; a cell several
configurations fall in (they differ in a key that is not a row or column, e.g. ``cem.num_slots``) shows each,
separated by " / ", so nothing is averaged away silently. A cell that differs from the λ = 0 baseline of its
row beyond the noise (``noise.compare``: the bootstrap interval of the difference excludes zero and the
probability of improvement is at least 0.75) ends in ``[+]`` (better) or ``[−]`` (worse); an unmarked cell
claims nothing. The legend under each table says so.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .aggregate import build_configs
from .errors import ResultsError
from .integrity import read_table
from .noise import BETTER, P_MIN, WORSE
from .schema import CONFIGS_FILE, TRIALS_FILE, load_objectives
from .storage import Dir

DEFAULT_METRICS = ("test_acc", "attack_ssim", "attack_psnr", "attack_mse")
SIGMA, LAMBDA, SURROGATE = "config.defense.noise_std", "config.cem.lambd", "config.cem.surrogate"


def load_configs(results_dir: str | Path) -> pd.DataFrame:
    d = Dir(results_dir)
    configs = read_table(d, CONFIGS_FILE, "configs")
    if configs is not None and "role" in configs:
        return configs
    # missing, or written before the comparison with the baseline: built from the trials when they are there
    trials = read_table(d, TRIALS_FILE, "trials")
    if trials is None and configs is not None:
        return configs
    if trials is None:
        raise ResultsError(f"{d.display}: neither {CONFIGS_FILE} nor {TRIALS_FILE}; run `cem-bench report` on an "
                           f"experiment folder of `cem-bench search` first, or point at one")
    objectives, _ = load_objectives(d)
    return build_configs(trials, objectives)


def _cell(row: pd.Series, metric: str) -> str:
    mean, std, n = row.get(f"{metric}_mean"), row.get(f"{metric}_std"), row.get(f"{metric}_n", 0)
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    digits = 2 if metric in ("attack_psnr",) else (4 if metric == "attack_mse" else 3)
    text = f"{mean:.{digits}f}"
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        text += f" ± {std:.{digits}f}"
    verdict = row.get(f"{metric}_verdict")
    mark = {BETTER: " [+]", WORSE: " [−]"}.get(verdict if isinstance(verdict, str) else "", "")
    return f"{text} ({int(n)}){mark}"


def legend(configs: pd.DataFrame, metric: str) -> str:
    """What the table claims about ``metric``: which cells differ from their baseline beyond the noise."""
    col = f"{metric}_verdict"
    verdicts = configs[col].fillna("").astype(str) if col in configs else pd.Series([], dtype=str)
    if not (verdicts != "").any():
        return ("No λ=0 baseline with two or more runs shares these keys: the table claims nothing about "
                "differences.")
    claims = int(verdicts.isin([BETTER, WORSE]).sum())
    head = (f"[+] / [−]: better / worse than the λ=0 baseline of the same row beyond its noise (the 95 % "
            f"interval of the difference, a percentile bootstrap widened to Welch's, excludes 0 and the probability "
            f"of improvement is ≥ {P_MIN:g} / ≤ {1 - P_MIN:g}); an unmarked cell is within the noise. A cell of one "
            f"run takes its spread from the baseline's.")
    return head + ("" if claims else " No cell differs from its baseline beyond the noise.")


def column_label(row: pd.Series) -> str:
    lam = row.get(LAMBDA)
    if lam is None or (isinstance(lam, float) and math.isnan(lam)) or lam == 0:
        return "λ=0"
    return f"λ={lam:g} {row.get(SURROGATE)}"


def paper_table(configs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows σ (ascending), columns "λ=0" then "λ=L surrogate" by λ and name; cells ``mean ± std (n)``."""
    if f"{metric}_mean" not in configs:
        raise ResultsError(f"metric {metric!r} is not in the results; known: "
                           f"{', '.join(c[:-5] for c in configs.columns if c.endswith('_mean'))}")
    if SIGMA not in configs:
        raise ResultsError(f"the results have no {SIGMA} column: not written by cem-bench search")
    df = configs.copy()
    df["_col"] = df.apply(column_label, axis=1)
    df["_lam"] = pd.to_numeric(df.get(LAMBDA), errors="coerce").fillna(0.0)
    df["_cell"] = df.apply(lambda r: _cell(r, metric), axis=1)
    order = (df.sort_values(["_lam", "_col"]).drop_duplicates("_col")["_col"]).tolist()
    cells = df.groupby([SIGMA, "_col"])["_cell"].agg(" / ".join).unstack("_col")
    cells = cells.reindex(columns=order).sort_index()
    cells.index = [f"σ={s:g}" for s in cells.index]
    cells.index.name = metric
    return cells.fillna("")


def to_markdown(table: pd.DataFrame) -> str:
    head = [table.index.name or ""] + [str(c) for c in table.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for idx, row in table.iterrows():
        lines.append("| " + " | ".join([str(idx)] + [str(v) for v in row]) + " |")
    return "\n".join(lines)


def main(args) -> int:
    configs = load_configs(args.results_dir)
    metrics = args.metrics or [m for m in DEFAULT_METRICS if f"{m}_mean" in configs]
    tables = [paper_table(configs, m) for m in metrics]   # every metric checked before anything is printed
    for m, t in zip(metrics, tables):
        if args.csv:
            print(f"# {m}")
            print(t.to_csv(), end="")
            print(f"# {legend(configs, m)}")
        else:
            print(f"\n**{m}** (mean ± std over replicates (n))\n")
            print(to_markdown(t))
            print(f"\n{legend(configs, m)}")
    return 0
