"""The paper-style table of a search: rows σ, columns λ × surrogate, cells mean ± std over the replicates.

``cem-bench table RESULTS_DIR [--csv | --latex] [--metrics ...]`` prints one table per metric (noisy test
accuracy, attack SSIM, PSNR, MSE by default) as Markdown, as CSV, or as LaTeX (booktabs floats, the legend in the
caption). The numbers come from ``configs.parquet`` (built from ``trials.parquet`` when missing, older than the
adjusted verdicts or about other trials than those beside it, as the report does). A configuration's cell is
``mean ± std (n)``, ``(n confirmed)`` when its statistics are confirmation runs (new seeds after the search's
choice); a cell several configurations fall in (they differ in a key that is not a row or column, e.g.
``cem.num_slots``) shows each, separated by " / ", so nothing is averaged away silently. A cell ends in
``[+]`` (better) or ``[−]`` (worse) where it differs from the λ = 0 baseline of its row beyond the noise
(``noise.compare``) and the difference survives Benjamini-Hochberg's correction over the metric's comparisons
(``<m>_q`` <= 0.05; the confirmed configurations are corrected among themselves); an unmarked cell claims
nothing. Under each compared metric's table, a second one gives each comparison's single-test p and its q.
The legend under each table says so.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from ..errors import ResultsError
from ..integrity import MANIFEST_FILE, listed_but_missing, read_table, vouched
from ..schema import CONFIGS_FILE, STATUSES, TRIALS_FILE, base_metric, load_objectives, out_of_range
from ..storage import Dir
from .aggregate import CONFIG_ID, CONFIRMED, build_configs, config_ids
from .noise import ALPHA, BETTER, MIN_RUNS, P_MIN, WORSE
from .results import live_tables, running_driver, running_text

# a trial that is not ok, by its status (results.py), in the words of the report's run facts; every status but
# "error" is not a failure (the scheduler stopped it, a signal interrupted it, or it has not finished yet)
NOT_OK_WORDS = {"stopped": "stopped early", "interrupted": "interrupted", "running": "still running",
                "error": "errored"}
NOT_ERRORS = tuple(s for s in NOT_OK_WORDS if s != "error")
DEFAULT_METRICS = ("test_acc", "attack_ssim", "attack_psnr", "attack_mse")
SIGMA, LAMBDA, SURROGATE = "config.defense.noise_std", "config.cem.lambd", "config.cem.surrogate"


def check_cells(trials: pd.DataFrame, where: str) -> None:
    """ResultsError when the trials that finished ok cannot be told apart into λ = 0 baselines and CEM cells: no
    `config.cem.lambd` column, a λ that is not a number, a λ > 0 without `config.cem.surrogate`, a metric
    outside the values it can take (``schema.METRIC_RANGES``), or a status no search writes. A trials table
    edited by hand (or rewritten by pandas) put every run in one λ=0 column of the table while the report said
    no baseline ran, or stopped the report with a traceback (2026-12-07 probe). An experiment none of whose trials
    finished (they record no config) passes: the readers say that themselves."""
    if "status" in trials:
        odd = sorted({str(v) for v in trials["status"].dropna().unique()} - set(STATUSES))   # NaN reads as error
        if odd:   # "weird" read as "no final result yet" in the table and "errored" in the report (2026-12-07)
            raise ResultsError(f"{where}: its status column holds {', '.join(map(repr, odd[:5]))}, which no search "
                               f"writes; a trial's status is one of {', '.join(STATUSES)} (this table was edited)")
    ok = trials[trials["status"] == "ok"] if "status" in trials else trials
    if ok.empty:
        return
    if LAMBDA not in ok:
        raise ResultsError(f"{where}: its {len(ok)} ok trial(s) have no {LAMBDA} column, so the λ = 0 baselines "
                           f"cannot be told from the CEM runs; a trials table of `cem-bench search` has it (this "
                           f"one was written or edited by another tool)")
    lam = pd.to_numeric(ok[LAMBDA], errors="coerce")
    bad = sorted({str(v) for v, n in zip(ok[LAMBDA], lam) if pd.notna(v) and not math.isfinite(n)})
    if bad or lam.lt(0).any():
        shown = ", ".join(bad[:5]) or ", ".join(f"{v:g}" for v in sorted(set(lam[lam < 0])))
        raise ResultsError(f"{where}: {LAMBDA} holds {shown}, which is not a λ (a number >= 0) in its ok trials; "
                           f"a trials table of `cem-bench search` holds numbers (this one was edited)")
    bad = out_of_range(ok)
    if bad is not None:   # a test_acc of 7.0 (a percentage?) was printed, ranked and compared as a result
        col, value, row, n, low, high = bad
        at = ok.loc[row, "trial_id"] if "trial_id" in ok else row
        raise ResultsError(f"{where}: {col} holds {value:g} (trial {at}), outside the values it can take ({low:g} to "
                           f"{high:g}){' in ' + str(n) + ' ok trials' if n > 1 else ''}; a trials table of "
                           f"`cem-bench search` holds none (this one was edited)")
    cem = lam.fillna(0) > 0
    if cem.any() and (SURROGATE not in ok or ok.loc[cem, SURROGATE].isna().any()):
        n = int(cem.sum()) if SURROGATE not in ok else int(ok.loc[cem, SURROGATE].isna().sum())
        raise ResultsError(f"{where}: {n} ok trial(s) with λ > 0 name no {SURROGATE}, so their cells cannot be "
                           f"labelled; a trials table of `cem-bench search` names it (this one was edited)")


def load_configs(results_dir: str | Path) -> pd.DataFrame:
    """``configs.parquet`` when it is this code's and describes the trials beside it (``describes``: the
    report's rule, so that the table and the page print the same numbers), else built from
    ``trials.parquet``. While a search runs on the folder, built from its trial folders as they are
    (``results.live_tables``; its tables are not written yet, or are those of before a ``--resume``), with
    ``attrs["running"]`` the driver's lock record."""
    d = Dir(results_dir)
    driver = running_driver(results_dir) if d.is_dir() else None
    if driver is not None:
        trials, _ = live_tables(results_dir)
        configs = build_configs(trials, load_objectives(d)[0])
        configs.attrs.update(source=TRIALS_FILE, running=driver, statuses=trials["status"].value_counts().to_dict())
        return configs
    configs = read_table(d, CONFIGS_FILE, "configs")
    trials = read_table(d, TRIALS_FILE, "trials")
    if configs is not None and "role" in configs and adjusted(configs) and (
            trials is None or stored_describes(d, configs, trial_config_ids(trials))):
        return configs
    # missing, written before the comparison with the baseline or before its adjustment for many comparisons,
    # or about other trials (a search that went on, a filtered trials.parquet): built from the trials
    if trials is None and configs is not None:   # nothing to rebuild from: shown, but its verdicts not marked
        if listed_but_missing(d, TRIALS_FILE):
            # the trials were written and are gone: the table would say the results predate the correction and
            # have no trials to rebuild it from (2026-12-07 probe), and drop its p and q without the reason
            raise ResultsError(f"{d.url(TRIALS_FILE)} is missing, though the folder's {MANIFEST_FILE} lists it "
                               f"(an incomplete copy, or a file deleted since): the table's tests are rebuilt "
                               f"from it. Restore the file from the experiment it came from; to read the "
                               f"folder without it anyway, delete {MANIFEST_FILE} there (the folder is then "
                               f"read unverified)")
        return configs.drop(columns=[c for c in configs.columns if c.endswith("_q")])
    if trials is None and not d.is_dir():
        what = " is a file, not a folder" if d.kind() == "file" else ": no such folder"
        raise ResultsError(f"{d.display}{what}; give the experiment folder of a `cem-bench search`")
    if trials is None:
        raise ResultsError(f"{d.display}: neither {CONFIGS_FILE} nor {TRIALS_FILE}; run `cem-bench report` on an "
                           f"experiment folder of `cem-bench search` first, or point at one")
    check_cells(trials, d.url(TRIALS_FILE))
    objectives, _ = load_objectives(d)
    configs = build_configs(trials, objectives)
    configs.attrs["source"] = TRIALS_FILE      # what an error about the table must name (``main``)
    return configs


def trial_config_ids(trials: pd.DataFrame) -> pd.Series:
    """Each trial's configuration id as text: the table's ``config_id``, computed where an older table has
    none."""
    if CONFIG_ID in trials and trials[CONFIG_ID].notna().all():
        return trials[CONFIG_ID].astype(str)
    return config_ids(trials).astype(str)


def describes(configs: pd.DataFrame, ids: pd.Series) -> bool:
    """Does a stored configurations table describe exactly the trials of configuration ``ids``: the same
    configurations, and as many runs and repeats (a seed run again: ``aggregate.build_configs``) as trials?
    Older tables count no repeats."""
    if not {CONFIG_ID, "runs"} <= set(configs.columns):
        return False
    counted = pd.to_numeric(configs["runs"], errors="coerce").sum()
    if "repeats" in configs:
        counted += pd.to_numeric(configs["repeats"], errors="coerce").sum()
    return set(configs[CONFIG_ID].astype(str)) == set(ids.astype(str)) and counted == len(ids)


def stored_describes(folder: Dir, configs: pd.DataFrame, ids: pd.Series) -> bool:
    """May a folder's stored configs.parquet stand for its trials (``table`` and the report ask alike)? It must
    ``describe`` them, and the folder's manifest must record it with trials.parquet: read unverified (no
    manifest), a hand-edited trials.parquet of the same runs kept the stored numbers while the report counted the
    edited statuses (2026-12-07 probe); there the configurations are built from the trials."""
    return describes(configs, ids) and vouched(folder, (TRIALS_FILE, CONFIGS_FILE))


def adjusted(configs: pd.DataFrame) -> bool:
    """Are a stored configurations table's verdicts this code's: each ``<m>_verdict`` with its family's
    adjustment (``<m>_q``, ``_holm``, ``_verdict_single``) and the degrees of freedom of its test (``<m>_dof``:
    a table without them tested the search's own comparisons on Welch's, which let pure noise through the
    correction, noise.py), and no ``spread_borrowed`` (written before a comparison needed 3 runs a side, when one
    run was judged by the baseline's spread)? Older tables are rebuilt from the trials (here and by the
    report); without the trials, shown without marks."""
    metrics = [c[: -len("_verdict")] for c in configs.columns if c.endswith("_verdict")]
    return "spread_borrowed" not in configs and all(
        {f"{m}_q", f"{m}_holm", f"{m}_verdict_single", f"{m}_dof"} <= set(configs.columns) for m in metrics)


def _mark(row: pd.Series, metric: str) -> str:
    verdict = row.get(f"{metric}_verdict")
    if f"{metric}_q" not in row:     # an older table's verdict: no mark it can stand behind
        return ""
    return {BETTER: " [+]", WORSE: " [−]"}.get(verdict if isinstance(verdict, str) else "", "")


def _digits(metric: str) -> int:
    """The paper's decimals of ``metric``: PSNR 2 (the batch-level PSNR of the paper's code too), MSE 4, the rest
    3; one attack's own column as its metric (``attack_psnr__decoder`` as ``attack_psnr``: until 2026-12-07 those
    printed 3, and the README's table "in the paper's conventions" did not print the paper's decimals)."""
    base = base_metric(metric)
    return 2 if base in ("attack_psnr", "attack_psnr_batch") else (4 if base == "attack_mse" else 3)


def _apart(a: float, b: float, digits: int) -> int:
    """The fewest decimals, from ``digits`` (at most 8), at which ``a`` and ``b`` print differently."""
    while digits < 8 and f"{a:.{digits}f}" == f"{b:.{digits}f}":
        digits += 1
    return digits


def marked_digits(df: pd.DataFrame, metric: str) -> pd.Series:
    """Per configuration, the decimals its cell needs so that a marked cell and its baseline's never read the
    same (means 0.7503 and 0.7498 over 40 seeds, spreads 0.0006: both "0.750 ± 0.001", one marked); a baseline
    takes the most any of its marked cells needs."""
    need = pd.Series(_digits(metric), index=df.index)
    if f"{metric}_verdict" not in df or "baseline_id" not in df:
        return need
    mean_of = dict(zip(df[CONFIG_ID].astype(str), pd.to_numeric(df[f"{metric}_mean"], errors="coerce")))
    row_of = {c: i for i, c in zip(df.index, df[CONFIG_ID].astype(str))}
    # only the marked rows (a few of a page's thousands) are looked at one by one
    marked = df[df[f"{metric}_verdict"].isin([BETTER, WORSE])] if f"{metric}_q" in df else df.iloc[:0]
    for i, r in marked.iterrows():
        base = r.get("baseline_id")
        if isinstance(base, str) and base in mean_of and math.isfinite(mean_of[base]):
            d = _apart(float(r[f"{metric}_mean"]), float(mean_of[base]), _digits(metric))
            need[i] = max(need[i], d)
            if base in row_of:
                need[row_of[base]] = max(need[row_of[base]], d)
    return need


def _cell(row: pd.Series, metric: str, digits: int | None = None) -> str:
    mean, std, n = row.get(f"{metric}_mean"), row.get(f"{metric}_std"), row.get(f"{metric}_n", 0)
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    n = "?" if n is None or (isinstance(n, float) and not math.isfinite(n)) else int(n)
    paper = _digits(metric)
    digits = paper if digits is None else digits   # more where a marked cell and its baseline need them
    has_std = std is not None and not (isinstance(std, float) and math.isnan(std))
    if has_std and 0 < float(std) and round(float(std), paper) == 0:
        # the paper's decimals, or where the spread would print as 0 at them, two significant digits of it: at a
        # spread of 0.0001 two marked cells both read "0.750 ± 0.000" (the summary beside them: 0.75008 and 0.74965)
        digits = min(8, max(digits, 1 - math.floor(math.log10(float(std)))))
    text = f"{mean:.{digits}f}"
    if has_std:
        text += f" ± {std:.{digits}f}"
    confirmed = " confirmed" if row.get("role") == CONFIRMED else ""
    return f"{text} ({n}{confirmed}){_mark(row, metric)}"


def _pq(row: pd.Series, metric: str) -> str:
    """``p 0.012 q 0.034`` of a configuration's comparison with its baseline; "" for none (a baseline)."""
    p, q = row.get(f"{metric}_p"), row.get(f"{metric}_q")
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return ""

    from .noise import p_digits

    def fmt(v) -> str:
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else (
            "<0.0001" if v < 1e-4 else p_digits(v))
    return f"p {fmt(p)} q {fmt(q)}"


def legend(configs: pd.DataFrame, metric: str) -> str:
    """What the table claims about ``metric``: which cells differ from their baseline beyond the noise, after
    the correction for the comparisons made, and which cells are confirmed."""
    col = f"{metric}_verdict"
    if col not in configs:   # only the search's objectives (and their per-attack columns) are compared
        compared = sorted(c[: -len("_verdict")] for c in configs.columns
                          if c.endswith("_verdict") and not c.endswith("_verdict_single"))
        return (f"{metric} is not compared with the λ=0 baseline; only the search's objectives are"
                + (f" ({', '.join(compared)})" if compared else "") + ". Its cells claim nothing about differences.")
    verdicts = configs[col].fillna("").astype(str)
    if f"{metric}_mean" in configs and pd.to_numeric(configs[f"{metric}_mean"], errors="coerce").isna().all():
        return f"No run has a value of {metric}: the table claims nothing about differences."
    if not (verdicts != "").any():
        return (f"No cell of {MIN_RUNS} or more runs has a λ=0 baseline of {MIN_RUNS} or more runs sharing its "
                f"keys (a comparison needs {MIN_RUNS} runs a side): the table claims nothing about differences.")
    if f"{metric}_q" not in configs:
        return ("These results predate the correction for many comparisons and have no trials to rebuild it "
                "from: the table marks nothing (its single tests are not corrected for the comparisons made).")
    claims = int(verdicts.isin([BETTER, WORSE]).sum())
    p = pd.to_numeric(configs.get(f"{metric}_p"), errors="coerce")
    confirmed = (configs["role"] == CONFIRMED) if "role" in configs else pd.Series(False, index=configs.index)
    n_conf, n_search = int((p.notna() & confirmed).sum()), int((p.notna() & ~confirmed).sum())
    families = " and ".join(x for x in (
        f"{n_search} on the search's own runs" if n_search else "",
        f"{n_conf} on confirmation runs, new seeds after the choice, corrected among themselves" if n_conf else "")
        if x)
    head = (f"[+] / [−]: better / worse than the λ=0 baseline of the same row beyond its noise — the 95 % "
            f"interval of the difference (a percentile bootstrap widened to Welch's t interval, on Hsu's degrees "
            f"of freedom for the search's own runs) excludes 0, the probability "
            f"of improvement is ≥ {P_MIN:g} / ≤ {1 - P_MIN:g}, and the difference survives Benjamini-Hochberg's "
            f"correction over the {int(p.notna().sum())} comparisons of this metric ({families}): q ≤ {ALPHA:g}. "
            f"p is a comparison's own p-value (Welch's statistic), q the adjusted one (the p / q table). An "
            f"unmarked cell "
            f"claims no difference. (n confirmed): the statistics of the confirmation runs; other cells are the "
            f"search's own runs, exploratory. A cell of fewer than {MIN_RUNS} runs is compared with nothing.")
    return head + ("" if claims else " No cell differs from its baseline beyond the noise.")


def column_label(row: pd.Series) -> str:
    lam = row.get(LAMBDA)
    if lam is None or (isinstance(lam, float) and math.isnan(lam)) or lam == 0:
        return "λ=0"
    return f"λ={lam:g} {row.get(SURROGATE)}"


def _numeric(configs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """A copy whose σ, λ and the metric's statistics are numbers (a hand-made or damaged table may hold them
    as text; what is not a number becomes NaN and prints as "–" or "σ=?"), with its row labels."""
    df = configs.copy()
    for c in (SIGMA, LAMBDA, *(f"{metric}_{s}" for s in ("mean", "std", "n", "p", "q"))):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    df["_row"] = df[SIGMA].map(lambda v: f"σ={v:g}" if math.isfinite(v) else "σ=?")
    df["_sigma"] = df[SIGMA].fillna(math.inf)
    df["_col"] = df.apply(column_label, axis=1)
    df["_lam"] = df[LAMBDA].fillna(0.0) if LAMBDA in df else 0.0
    return df


def _label_shared_cells(df: pd.DataFrame) -> pd.DataFrame:
    """Where several configurations fall in one cell, each part starts with the keys in which they differ
    (``cem.strength_every=1: 0.610 ± 0.033 (16)``): the parts alone could not be told apart, nor matched with
    the docs' rows."""
    keys = [c for c in df.columns if c.startswith("config.") and c != "config.seed"]
    for _, idx in df.groupby(["_row", "_col"]).groups.items():
        if len(idx) < 2:
            continue
        part = df.loc[idx, keys]
        differ = [c for c in keys if part[c].astype(str).nunique(dropna=False) > 1]

        def fmt(v) -> str:
            return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g}" \
                if isinstance(v, float) else str(v)
        for i in idx:
            label = ", ".join(f"{c[len('config.'):]}={fmt(df.at[i, c])}" for c in differ)
            if label:
                df.at[i, "_cell"] = f"{label}: {df.at[i, '_cell']}"
    return df


def _layout(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """``df["_cell"]`` laid out: rows σ ascending, columns λ=0 then by λ and name; a cell several configurations
    share is their parts joined by " / ", each labelled (``_label_shared_cells``)."""
    df = _label_shared_cells(df)
    order = (df.sort_values(["_lam", "_col"]).drop_duplicates("_col")["_col"]).tolist()
    rows = df.sort_values("_sigma", kind="stable").drop_duplicates("_row")["_row"].tolist()
    cells = df.groupby(["_row", "_col"])["_cell"].agg(" / ".join).unstack("_col")
    cells = cells.reindex(index=rows, columns=order)
    cells.index.name = name
    return cells.fillna("")


def with_results(configs: pd.DataFrame) -> pd.DataFrame:
    """The configurations with a finished run: one whose every run was interrupted, failed or never started has
    nothing to show, and its sampled keys alone (no σ of its own) made a row "σ=?" of dashes."""
    if "runs_ok" not in configs:
        return configs
    return configs[pd.to_numeric(configs["runs_ok"], errors="coerce").fillna(0) > 0]


def paper_table(configs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows σ (ascending), columns "λ=0" then "λ=L surrogate" by λ and name; cells ``mean ± std (n)``: the
    configurations with a finished run (``with_results``)."""
    configs = with_results(configs)
    if f"{metric}_mean" not in configs:
        raise ResultsError(f"metric {metric!r} is not in the results; known: "
                           f"{', '.join(c[:-5] for c in configs.columns if c.endswith('_mean'))}")
    if SIGMA not in configs:
        raise ResultsError(f"the results have no {SIGMA} column: not written by cem-bench search")
    df = _numeric(configs, metric)
    digits = marked_digits(df, metric)
    df["_cell"] = [_cell(r, metric, int(digits[i])) for i, r in df.iterrows()]
    return _layout(df, metric)


def pq_table(configs: pd.DataFrame, metric: str) -> pd.DataFrame | None:
    """The comparisons behind ``paper_table``'s marks, in its layout: ``p … q …`` per configuration (empty
    for the baselines); None for a metric with no comparison (or a table older than the adjustment)."""
    if f"{metric}_p" not in configs or f"{metric}_q" not in configs or \
            not pd.to_numeric(configs[f"{metric}_p"], errors="coerce").notna().any():
        return None
    if SIGMA not in configs:
        return None
    df = _numeric(configs, metric)
    df["_cell"] = df.apply(lambda r: _pq(r, metric), axis=1)
    return _layout(df, f"{metric} p / q")


STRENGTH = "config.cem.strength"


def _strength_cell(row: pd.Series) -> str:
    """``0.93 fixed`` or ``2.6 ± 0.4 matched (3)``: the loss scale the cell's runs used and where it came from
    (``cem.strength``); "" for a λ = 0 cell (no CEM term)."""
    lam, mean = row.get(LAMBDA), row.get("cem_loss_scale_mean")
    if lam is None or not (isinstance(lam, (int, float)) and lam > 0) or mean is None or \
            (isinstance(mean, float) and math.isnan(mean)):
        return ""
    mode = row.get(STRENGTH) if isinstance(row.get(STRENGTH), str) else "fixed"
    std, n = row.get("cem_loss_scale_std"), row.get("cem_loss_scale_n")
    if mode != "matched":
        return f"{mean:.3g} fixed"
    spread = f" ± {std:.2g}" if isinstance(std, float) and math.isfinite(std) else ""
    count = f" ({int(n)})" if isinstance(n, (int, float)) and math.isfinite(n) else ""
    return f"{mean:.3g}{spread} matched{count}"


def strength_table(configs: pd.DataFrame) -> pd.DataFrame | None:
    """In ``paper_table``'s layout, the loss scale each CEM cell used: matched to gmm's pull on each run's own
    encoder (so λ is gmm's strength in every row) or fixed; None for results without the record (older)."""
    if "cem_loss_scale_mean" not in configs or SIGMA not in configs:
        return None
    df = _numeric(configs, "cem_loss_scale")
    df["_cell"] = df.apply(_strength_cell, axis=1)
    return _layout(df, "cem loss scale")


STRENGTH_LEGEND = ("cem loss scale: the scale of the surrogate's loss in each CEM cell. matched "
                   "(cem.strength=matched, the attention surrogates' default; a gmm of other keys than the "
                   "reference's where asked): measured at each run's first CEM "
                   "epoch so that one unit of λ pulls on its encoder as gmm's does there (mean ± std over the runs); "
                   "its ratio to gmm is 1 on the batches it was measured on (on others: docs/estimators.md, 'One λ "
                   "scale'). fixed: cem.loss_scale as set (gmm, the reference, is 1): its ratio to gmm "
                   "is what `cem-bench calibrate` reports for that state.")


# LaTeX's special characters, then the table's own symbols in math mode (after the escaping, whose backslashes
# and dollars they add). A paper's table is pasted, not retyped: the numbers are the ones the page prints.
_LATEX_SPECIAL = [("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                  ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\textasciicircum{}")]
_LATEX_SYMBOLS = [("±", r"$\pm$"), ("λ", r"$\lambda$"), ("σ", r"$\sigma$"), ("−", r"$-$"), ("–", "--"),
                  ("—", "---"), ("≤", r"$\le$"), ("≥", r"$\ge$"), ("×", r"$\times$")]


def latex_text(text: str) -> str:
    """``text`` as LaTeX source that prints it (the cells' ± λ σ − – in math mode or as dashes; nothing
    outside ASCII is left for an 8-bit LaTeX to choke on)."""
    parts = str(text).split("`")
    if len(parts) % 2 == 0:   # an unpaired backtick is a character, not code
        parts = ["`".join(parts)]
    out = ""
    for i, part in enumerate(parts):   # `cem-bench calibrate` in a legend: code, as the page shows it
        part = "".join(next((rep for ch, rep in _LATEX_SPECIAL if c == ch), c) for c in part)
        for ch, rep in _LATEX_SYMBOLS:
            part = part.replace(ch, rep)
        out += f"\\texttt{{{part}}}" if i % 2 else part.replace("`", r"\`{}")
    return out


def to_latex(table: pd.DataFrame, caption: str, label: str) -> str:
    """``table`` as a booktabs ``table`` float (``\\usepackage{booktabs}``): a left column of row labels, a
    centred one per λ × surrogate, the caption and a label to cite it by."""
    head = [table.index.name or ""] + [str(c) for c in table.columns]
    lines = [r"\begin{table}[t]", r"\centering", f"\\caption{{{latex_text(caption)}}}",
             f"\\label{{{label}}}", f"\\begin{{tabular}}{{l{'c' * len(table.columns)}}}", r"\toprule",
             " & ".join(latex_text(h) for h in head) + r" \\", r"\midrule"]
    for idx, row in table.iterrows():
        lines.append(" & ".join([latex_text(idx)] + [latex_text(v) for v in row]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)


def latex_label(results_dir, what: str) -> str:
    """``tab:<experiment>-<what>``: letters, digits and ``-:.`` only (what ``\\ref`` takes everywhere)."""
    import re
    name = str(results_dir).rstrip("/").rsplit("/", 1)[-1]
    return "tab:" + re.sub(r"[^A-Za-z0-9:.-]+", "-", f"{name}-{what}").strip("-")


def to_markdown(table: pd.DataFrame) -> str:
    head = [table.index.name or ""] + [str(c) for c in table.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for idx, row in table.iterrows():
        lines.append("| " + " | ".join([str(idx)] + [str(v) for v in row]) + " |")
    return "\n".join(lines)


def main(args) -> int:
    configs = load_configs(args.results_dir)
    if "running" in configs.attrs:   # on stderr: the tables on stdout stay as a script reads them
        n = configs.attrs["statuses"]
        others = ", ".join(f"{n[status]} {word}" for status, word in NOT_OK_WORDS.items() if n.get(status))
        print(f"cem-bench: {running_text(args.results_dir, configs.attrs['running'])}: the "
              f"table holds the {n.get('ok', 0)} trials that finished ok so far{f' ({others})' if others else ''}; "
              f"it is final when the search ends", file=sys.stderr)
    if "runs_ok" in configs and with_results(configs).empty:
        # before the checks below: an experiment none of whose trials finished lacks the keys its trials never
        # reported (σ among them), which would otherwise read as a table cem-bench did not write
        raise ResultsError(f"{args.results_dir}: no trial has a final result yet ({int(configs['runs'].sum())} "
                           f"run(s) of {len(configs)} configuration(s)), so there is nothing to tabulate; "
                           f"`cem-bench report {args.results_dir}` lists the trials and their errors")
    configs = with_results(configs)
    metrics = list(dict.fromkeys(args.metrics or [])) or [m for m in DEFAULT_METRICS if f"{m}_mean" in configs]
    unknown = [m for m in metrics if f"{m}_mean" not in configs]
    if unknown:     # the user's word, not the table's fault: said before the check of the table below
        raise ResultsError(f"--metrics {' '.join(unknown)}: not in the results of {args.results_dir}; known: "
                           f"{', '.join(c[:-5] for c in configs.columns if c.endswith('_mean'))}")
    source = configs.attrs.get("source", CONFIGS_FILE)
    try:
        tables = [paper_table(configs, m) for m in metrics]   # every metric checked before anything is printed
    except ResultsError as e:   # its own words say what is missing; the file named is the one read
        raise ResultsError(f"{args.results_dir}: {source}: {e}") from e
    except (TypeError, ValueError, KeyError, AttributeError) as e:   # a table cem-bench did not write
        advice = (f"delete it and run `cem-bench report {args.results_dir}` to rebuild it from the trials"
                  if source == CONFIGS_FILE else "it was not written by `cem-bench search`")
        raise ResultsError(f"{args.results_dir}: its {source} is not as cem-bench writes it ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]}); {advice}") from e
    latex = getattr(args, "latex", False)
    for m, t in zip(metrics, tables):
        pq = pq_table(configs, m)
        if latex:   # the legend is the caption's second sentence: a table in a paper must say what it claims
            print(to_latex(t, f"{m}: mean ± std over replicates (n). {legend(configs, m)}",
                           latex_label(args.results_dir, m)))
            if pq is not None:
                print(to_latex(pq, f"{m}: p (single test) and q (Benjamini-Hochberg) against the λ=0 baseline.",
                               latex_label(args.results_dir, f"{m}-pq")))
        elif args.csv:
            print(f"# {m}")
            print(t.to_csv(), end="")
            if pq is not None:
                print(f"# {m}: p (single test) and q (Benjamini-Hochberg) against the λ=0 baseline")
                print(pq.to_csv(), end="")
            print(f"# {legend(configs, m)}")
        else:
            print(f"\n**{m}** (mean ± std over replicates (n))\n")
            print(to_markdown(t))
            if pq is not None:
                print(f"\n{m}: p (single test) and q (Benjamini-Hochberg) against the λ=0 baseline\n")
                print(to_markdown(pq))
            print(f"\n{legend(configs, m)}")
    st = strength_table(configs)
    if st is not None:
        if latex:
            print(to_latex(st, STRENGTH_LEGEND,
                           latex_label(args.results_dir, "cem-loss-scale")))
        elif args.csv:
            print("# cem loss scale")
            print(st.to_csv(), end="")
            print(f"# {STRENGTH_LEGEND}")
        else:
            print("\n**cem loss scale** (what one unit of λ means in each cell)\n")
            print(to_markdown(st))
            print(f"\n{STRENGTH_LEGEND}")
    return 0
