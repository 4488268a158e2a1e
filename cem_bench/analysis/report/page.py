"""``build_report``: the figures, galleries, ``frontier.csv`` (and, with replicates, ``frontier_configs.csv``)
and ``index.html`` (templates/index.html.j2) of a results folder."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from urllib.parse import quote

import jinja2
import matplotlib
import pandas as pd

from cem_bench.analysis.hypotheses import COLUMNS as HYPOTHESIS_COLUMNS
from cem_bench.analysis.hypotheses import UNVERIFIED as HYPOTHESES_UNVERIFIED
from cem_bench.analysis.hypotheses import evaluate as evaluate_hypotheses
from cem_bench.analysis.table import NOT_ERRORS
from cem_bench.errors import ResultsError
from cem_bench.parsing import loads_json
from cem_bench.schema import (
    GALLERY_FILE,
    INTERRUPTED_FILE,
    PRIVACY_MODES,
    REPORT_DIR,
    REPORT_RECORD,
    privacy_mode,
    strongest_column,
)
from cem_bench.storage import (
    UnsafePath,
    holder_text,
    is_uri,
    local,
    open_dir,
    publish,
    read_regular,
    relative_inside,
    write_bytes,
    write_probe,
)

from .facts import metric_columns, run_facts, searched_columns, status_counts
from .formatting import format_value, plural, safe_name, short, tail
from .frontier_plot import plot_frontier, replicate_caption
from .hypervolume_plot import plot_hypervolume
from .lambda_plot import lambda_curves_note, plot_lambda_curves
from .load import (
    BASELINE_LABEL,
    REPORTED_METRICS,
    SURROGATE_COL,
    Results,
    best_baseline,
    fetch_remote,
    front_of,
    load_results,
)
from .param_plot import param_columns, plot_param_effects
from .summary import summary_sentence
from .tables import (
    comparison_note,
    config_front_table,
    facts_table,
    html_table,
    hypotheses_html,
    paper_tables,
    skipped_table,
    surrogate_bests,
    surrogate_config_fronts,
)
from .training_plot import plot_training_curves

MAX_GALLERY = 24  # front trials shown in the gallery (best first objective first)

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("cem_bench.analysis.report", "templates"),
                          autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


# ================================================================= galleries
def _trial_paths(res: Results, row: pd.Series):
    """Where the trial's folder would be inside the results folder: its ``trial_dir``, then its id. ``trial_dir``
    comes from a table that may come from anyone: a path that leaves the folder is not given."""
    for name in (row.get("trial_dir"), str(row["trial_id"])):
        rel = relative_inside(res.results_dir, name) if isinstance(name, str) else None
        if rel is not None:
            yield res.results_dir / rel


def _recon_path(res: Results, row: pd.Series) -> Path | None:
    """The trial's recon.png inside the results folder, or None (read without following a link: copy_galleries)."""
    return next((p / GALLERY_FILE for p in _trial_paths(res, row) if os.path.isfile(p / GALLERY_FILE)), None)


def copy_galleries(res: Results, out_dir: Path) -> list[dict]:
    """Copy recon.png of the front's trials (``Results.front_trials``: with confirmation, the confirmed front's
    runs) and of the best baseline to out_dir/galleries/.

    Returns one dict per shown trial: ``row`` and ``src`` (relative path, or None when recon.png is missing,
    or is a link, a pipe or a device: only the results folder's own regular files are copied)."""
    gallery_dir = out_dir / "galleries"
    rows = [r for _, r in res.front_trials.head(MAX_GALLERY).iterrows()]
    base = best_baseline(res)
    if base is not None and base["trial_id"] not in {r["trial_id"] for r in rows}:
        rows.append(base)
    shown = []
    for row in rows:
        src = _recon_path(res, row)
        rel, why = None, None
        if src is None:
            why = (f"{GALLERY_FILE} missing from the trial's folder" if _trial_folder(res, row) else
                   f"no reconstructions: the results folder holds no folder of this trial (its tables alone, as "
                   f"findings/ ships them; the trial folders hold {GALLERY_FILE})")
        else:
            try:
                data = read_regular(src, within=res.results_dir, limit=64 << 20)
            except (OSError, ResultsError) as e:
                data, why = None, f"{GALLERY_FILE} not read ({type(e).__name__}: a link, a pipe or a device is not)"
            if data is not None:
                gallery_dir.mkdir(parents=True, exist_ok=True)
                dest = gallery_dir / f"{safe_name(str(row['trial_id']))}.png"
                write_bytes(str(dest), data)
                rel = f"galleries/{dest.name}"
        shown.append({"row": row, "src": rel, "why": why})
    return shown


def _trial_folder(res: Results, row: pd.Series) -> bool:
    """Does the results folder hold a folder of this trial (``trial_dir`` or its id), not a link?"""
    return any(os.path.isdir(p) and not os.path.islink(p) for p in _trial_paths(res, row))


def _set_by(row: pd.Series, metric: str) -> str:
    """`` (rmle)``: the attack that set a worst-case metric of a trial, when recorded."""
    by = row.get(strongest_column(metric))
    return f" ({by})" if isinstance(by, str) and by else ""


def attack_rows(row: pd.Series) -> list[str]:
    """The attacks of a trial's gallery rows, in order (``config.attack.names``; older results: the one
    ``config.attack.kind``)."""
    names = row.get("config.attack.names")
    if isinstance(names, str):
        try:
            names = json.loads(names)
        except ValueError:
            names = [names]
    if names is None or (isinstance(names, float) and names != names):
        kind = row.get("config.attack.kind")
        return [kind] if isinstance(kind, str) and kind else []
    return [str(n) for n in list(names)]


# ================================================================= the report
def interrupted_note(res: Results) -> str | None:
    """What the page says first when a signal stopped the search (search/interrupt.py), else None; None too
    while a search runs on the folder (a --resume keeps the record until it ends, and removes it then unless a
    signal stops it too)."""
    if res.running_driver is not None:
        return None
    try:
        data = read_regular(res.results_dir / INTERRUPTED_FILE, within=res.results_dir, limit=1 << 20)
        record = loads_json(data)
    except (OSError, ValueError, ResultsError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("signal"), str):
        return None
    n = int((res.trials["status"] == "interrupted").sum())
    note = (f"This search was interrupted by {record['signal']}: {n} trial{'s' * (n != 1)} in flight or waiting "
            f"{'are' if n != 1 else 'is'} marked interrupted (not errors) and the results below are partial.")
    if isinstance(record.get("resume"), str):
        note += f" Continue it with: {record['resume']}"
    return note


def running_note(res: Results) -> str | None:
    """What the page says first when it was drawn while a search ran on the folder, else None."""
    if res.running_driver is None:
        return None
    t = res.trials
    if res.running_driver.get("unseen"):
        return (f"Drawn from a folder on object storage whose search has not written its tables: it is still "
                f"running, or it was stopped before it could (its --resume finishes it), which object storage has "
                f"no lock to tell. {plural(len(t), 'trial')} so far {status_counts(t)}, so everything below is "
                f"partial (a trial without a result is counted as running, not as an error).")
    return (f"Drawn while a cem-bench search was running on this folder{holder_text(res.running_driver)}: "
            f"{plural(len(t), 'trial')} so far {status_counts(t)}, so everything below is partial (a trial not "
            f"finished yet is still running, not an error). The search writes its tables and this report again "
            f"when it ends.")


def _figure(src: str, alt: str, caption: str | None = None) -> dict:
    return {"src": quote(src), "alt": alt, "caption": caption}


def build_report(results_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write plots, tables, galleries, frontier.csv and index.html; return the path of index.html
    (``write_report``, which also returns the results as the page read them)."""
    return write_report(results_dir, out_dir)[0]


def write_report(results_dir: str | Path, out_dir: str | Path | None = None) -> tuple[Path, Results]:
    """``build_report``'s work: the path of index.html and the ``Results`` the page was drawn from, so that a
    caller says what the page says (``Results.running_driver``: the search running on the folder as it was read;
    a second look at its lock could see a search that started or ended in between).

    Raises ResultsError (nothing written) when ``results_dir`` does not exist or holds neither
    ``trials.parquet`` nor a Ray experiment of ``cem-bench search``. A folder on object storage (``s3://``,
    ``gs://``) needs a local ``out_dir``: what the report reads is fetched into ``out_dir/source`` first.

    The page is drawn in a private temporary folder and then published into ``out_dir`` (default
    ``results_dir/report``) file by file, each renamed into place: no symbolic link under the folder the
    user named is followed, so a link planted in a shared results folder (``report/`` itself, or
    ``report/frontier.csv``) is refused or replaced, never written through (UnsafePath)."""
    results_dir = local(str(results_dir))   # file:// is a folder of this machine: read in place, its lock seen
    if is_uri(results_dir):
        if out_dir is None:
            raise ResultsError(f"{results_dir}: the report of a folder on object storage is written locally; "
                               f"give --out DIR")
        results_dir, remote_driver = fetch_remote(str(results_dir), Path(out_dir) / "source")
    else:
        remote_driver = None
    res = load_results(results_dir)  # first: it checks the folder before anything is written
    if remote_driver is not None:    # read from the storage, not from the fetched copy (which has no lock)
        res.running_driver = remote_driver
    results_dir = res.results_dir
    if out_dir is None:   # inside the results folder: nothing below it is trusted
        root, folders = results_dir, [REPORT_DIR]
    else:                 # the user's own folder (links in its path are the user's)
        root, folders = Path(os.path.abspath(out_dir)), []
        root.mkdir(parents=True, exist_ok=True)
    _check_writable(root, folders)   # a link in the way, or a folder nobody can write: refused before any drawing
    # names come from the user's files: a `$` in one (an experiment called "$x^$") is text, not mathtext,
    # which would mis-render it or stop the report with a parse error
    with tempfile.TemporaryDirectory(prefix="cem-bench-report-") as stage, \
            matplotlib.rc_context({"text.parse_math": False}):
        _draw(res, Path(stage))
        target = publish(stage, root, folders, record=REPORT_RECORD)
    return Path(target) / "index.html", res


def _check_writable(root: Path, folders: list[str]) -> None:
    """Open (making) the report's folder without following a link (UnsafePath), and make and remove a hidden
    file in it: a results folder that is read-only, immutable or on a read-only mount (root included) failed with
    a bare ``Operation not permitted (report)``, or, where ``report/`` existed, after the whole page was drawn."""
    where = os.path.join(root, *folders)
    try:
        fd = open_dir(str(root), folders, create=True)
    except UnsafePath:
        raise
    except OSError as e:
        raise ResultsError(f"the report's folder {where} cannot be made ({e.strerror or e}): give --out DIR, a "
                           f"folder you can write") from None
    try:
        write_probe(fd)
    except OSError as e:
        raise ResultsError(f"nothing can be written in the report's folder {where} ({e.strerror or e}): give "
                           f"--out DIR, a folder you can write") from None
    finally:
        os.close(fd)


def _draw(res: Results, out_dir: Path) -> None:
    """Every file of the report, into ``out_dir`` (a private staging folder)."""
    ok = res.ok
    # frontier plots: the search objectives after the first, then the other privacy metrics present
    pairs: list[tuple[str, str]] = [(o["metric"], o["mode"]) for o in res.objectives[1:]]
    for metric, mode in PRIVACY_MODES.items():
        if metric not in {m for m, _ in pairs} and metric in ok and ok[metric].notna().any():
            pairs.append((metric, mode))
    frontiers = [_figure(plot_frontier(res, m, mode, out_dir / f"frontier_{safe_name(m)}.png").name, f"frontier {m}",
                         replicate_caption(res, m) if res.replicated else None) for m, mode in pairs]  # fmt: skip
    hv_path, final_hv = plot_hypervolume(res, out_dir / "hypervolume.png")
    params = [_figure(plot_param_effects(res, c, out_dir / f"params_{safe_name(short(c))}.png").name,
                      f"effect of {short(c)}") for c in param_columns(res)]  # fmt: skip
    curves = plot_training_curves(res, out_dir / "training_curves.png")
    lam_curves = plot_lambda_curves(res, out_dir / "lambda_curves.png")
    if lam_curves is not None:   # a λ sweep with replicates: its curves lead the parameter effects
        params.insert(0, _figure(lam_curves.name, "trade-off over λ per surrogate (mean ± std over the seeds)",
                                 lambda_curves_note(res)))
    gallery = copy_galleries(res, out_dir)

    front = res.front_trials
    public_cols = [c for c in res.trials.columns if not c.startswith("_")]
    front[public_cols].to_csv(out_dir / "frontier.csv", index=False)
    aliases = set(REPORTED_METRICS) | set(res.metrics)
    if res.configs is not None:  # every configuration, as configs.parquet holds them (no helper columns)
        every = res.configs
        every[[c for c in every.columns if not c.startswith("_") and c not in aliases]].to_csv(
            out_dir / "configs.csv", index=False)
    if res.replicated:  # the front's configurations, as configs.parquet holds them (no helper columns)
        fronts = res.front_configs
        fronts[[c for c in fronts.columns if not c.startswith("_") and c not in aliases]].to_csv(
            out_dir / "frontier_configs.csv", index=False)

    searched = [c for c in searched_columns(res) if c != SURROGATE_COL]
    metrics = metric_columns(res)
    # which attack set each worst-case privacy objective (several attacks per trial: attack.names)
    by_metric = {m: strongest_column(m) for m in res.metrics if strongest_column(m) in res.trials
                 and res.trials[strongest_column(m)].fillna("").astype(str).str.len().gt(0).any()}
    role = ["role"] if res.confirmed and "role" in res.trials else []   # a search's run or a confirmation's
    table_cols = ["trial_id", "_label", *role, *searched, *metrics, *by_metric.values()]
    table_heads = ["trial", "surrogate", *role, *[short(c) for c in searched], *metrics,
                   *[f"strongest attack ({m})" for m in by_metric]]

    shown = []
    for g in gallery:
        row = g["row"]
        caption = f"{row['trial_id']} · {row['_label']} · " + ", ".join(
            f"{m} {format_value(row[m], m)}{_set_by(row, m)}" for m in metrics
            if privacy_mode(m) is not None or m in res.metrics
        )
        rows = attack_rows(row)
        if rows:
            caption += " · rows: original, " + ", ".join(rows)
        alt = f"reconstructions of {row['trial_id']}"
        skipped = row.get("attack_skipped")
        missing = (f"no reconstructions: the attack was skipped ({skipped})" if isinstance(skipped, str) and skipped
                   else g["why"] or f"{GALLERY_FILE} missing")
        shown.append(_figure(g["src"], alt, caption) if g["src"] else
                     {"src": None, "alt": alt, "caption": caption, "missing": missing})

    groups = []  # (heading, table) of each surrogate's own front, then the baseline's
    if res.replicated:   # on the means, as the page's front: on runs a lucky seed put its configuration there
        for name, own in surrogate_config_fronts(res):
            groups.append({"name": name, "n": plural(len(own), "configuration"),
                           "table": config_front_table(res, own)})
    else:
        cem_ok = ok[~ok["_baseline"]]
        for s in res.surrogates:
            own = front_of(cem_ok[cem_ok["_surrogate"] == s], res.metrics, res.modes)
            if own.empty:
                continue
            own = own.sort_values(res.metrics[0], ascending=res.modes[0] == "min", kind="stable")
            groups.append({"name": s, "n": plural(len(own), "trial"),
                           "table": html_table(own, table_cols, table_heads)})
        base = ok[ok["_baseline"]]
        if not base.empty:
            own = front_of(base, res.metrics, res.modes)
            groups.append({"name": BASELINE_LABEL, "n": plural(len(own), "trial"),
                           "table": html_table(own, table_cols, table_heads)})

    errored = res.trials[~res.trials["_ok"] & ~res.trials["status"].isin(NOT_ERRORS)]
    errors_table = None
    if not errored.empty:
        err = errored.copy()
        err["error"] = err["error"].map(tail) if "error" in err else "—"
        errors_table = html_table(err, ["trial_id", "_label", *searched, "error"],
                                  ["trial", "surrogate", *[short(c) for c in searched], "error"], pre=["error"])

    if res.replicated:
        n_front = len(res.front_configs)
        if res.confirmed:
            front_heading = f"The confirmed front ({plural(n_front, 'configuration')})"
            front_note = ("After the search, its best configurations ran again with new seeds; each objective is "
                          "the mean ± std over those confirmation runs only (the search's own run was chosen for "
                          "looking good), and the front is computed on these means, with the λ=0 baseline.")
        else:
            front_heading = f"Configurations on the front of the means ({n_front})"
            front_note = ("Each objective as mean ± std (sample standard deviation) over the ok runs of the "
                          "configuration; the front is computed on the means.")  # fmt: skip
        front_note += " " + comparison_note(res)
        front_table = config_front_table(res)
    else:
        front_heading = f"Trials on the front ({len(front)})"
        front_table, front_note = html_table(front, table_cols, table_heads), None
    skipped = res.skipped
    hypotheses = None
    tested = pd.DataFrame(columns=list(HYPOTHESIS_COLUMNS))   # written even when empty: replaces an earlier one
    if res.hypotheses:   # what the space planned leads the page; the summary's picks after the run follow
        tested = evaluate_hypotheses(res.trials, res.hypotheses)
        hypotheses = hypotheses_html(tested)
    tested.to_csv(out_dir / "hypotheses.csv", index=False)
    summary = summary_sentence(res, tested)

    page = _ENV.get_template("index.html.j2").render(
        experiment=res.experiment,
        frontier=frontiers[0] if frontiers else None,
        summary=summary,
        hypotheses=hypotheses,
        hypotheses_problem=res.hypotheses_problem,
        hypotheses_unverified=None if res.verified else HYPOTHESES_UNVERIFIED,
        bests=surrogate_bests(res),
        other_frontiers=frontiers[1:],
        hypervolume=_figure(hv_path.name, "hypervolume", f"final hypervolume {format_value(final_hv)}"),
        params=params,
        curves=_figure(curves.name, "training curves") if curves is not None else None,
        curves_missing=("No per-epoch records (epochs.parquet missing or empty)." if res.epochs is None or
                        res.epochs.empty else "No per-epoch records of the trials on the front (none is on it, or they "
                        "recorded no epochs)."),
        gallery=shown,
        front_heading=front_heading,
        front_table=front_table,
        front_note=front_note,
        paper_tables=paper_tables(res),
        groups=groups,
        n_skipped=len(skipped),
        skipped_table=skipped_table(res, searched),
        n_errored=len(errored),
        errors_table=errors_table,
        replicated=res.replicated,
        confirmed=res.confirmed,
        has_configs=res.configs is not None,
        facts_table=facts_table(run_facts(res, final_hv)),
        interrupted=interrupted_note(res),
        running=running_note(res),
    )
    write_bytes(str(out_dir / "index.html"), page.encode("utf-8"))
