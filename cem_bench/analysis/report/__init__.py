"""Plots (matplotlib) and the self-contained HTML report of a results folder.

``build_report(results_dir)`` reads ``trials.parquet`` (built from the Ray experiment when missing; and, when
present, ``configs.parquet``, ``epochs.parquet``, ``search_space.json`` and each trial's ``recon.png``) and
writes into ``results_dir/report``:

* ``frontier_<metric>.png``: the first objective (utility) against each privacy metric / objective
* ``hypervolume.png``: hypervolume after each completed trial, overall and per surrogate
* ``params_<key>.png``: each objective against each main searched parameter (the trials whose surrogate
  uses it; λ = 0 baselines only for λ and σ)
* ``training_curves.png``: per-epoch curves of the front's trials
* ``galleries/<trial>.png``: reconstruction galleries of the front and of the best λ=0 baseline
* ``frontier.csv``: the front's trials (all columns); with replicates also ``frontier_configs.csv``
* ``lambda_curves.png``: a replicated λ sweep's trade-off, a curve per surrogate whose other keys stay fixed, a
  row per λ=0 baseline (a σ grid: a row per σ)

With confirmation the front of all of these is the confirmed front (``Results.front_configs``, and its runs:
``Results.front_trials``), the one the page's table lists.
* ``configs.csv``: every configuration (``configs.parquet``, or the table the report built from a
  ``trials.parquet`` it was given without one: it writes no ``configs.parquet`` there, and its run facts say
  which it used)
* ``index.html``: everything above, relative links only, inline CSS, no external resources

With replicates (some configuration ran more than once: ``configs.parquet``, built from the trials when
missing) the frontier plots draw one point per configuration at its means with 95 % CI error bars, the front
table lists configurations (mean ± std), and a paper-style table (rows σ, columns λ × surrogate) follows it
whenever the results have a σ column. Trials whose attack the utility gate skipped (``attack_skipped``) are
listed apart and drawn on no privacy plot.

A folder that does not exist, or holds neither ``trials.parquet`` nor a Ray experiment of ``cem-bench
search``, raises ``cem_bench.errors.ResultsError`` before anything is written.

Modules: ``load`` (reading, the conventions); ``plots`` (what the figures share) and one module per family
of figures: ``frontier_plot``, ``hypervolume_plot``, ``param_plot``, ``lambda_plot``, ``training_plot``;
``formatting`` (numbers and words), ``summary`` (the claim and the summary sentence), ``tables`` (the HTML
tables), ``facts`` (the run facts and the tables' columns); ``page`` (``build_report`` and
``templates/index.html.j2``); ``claims`` (how often the summary's and the tables' claims are wrong, on
simulated searches).
"""

from cem_bench.schema import DEFAULT_OBJECTIVES, PRIVACY_MODES, load_objectives

from .formatting import format_value
from .frontier_plot import frontier_figure, plot_frontier
from .hypervolume_plot import plot_hypervolume
from .lambda_plot import plot_lambda_curves
from .load import MAIN_PARAMS, Results, add_pareto_ranks, best_baseline, front_of, load_results
from .page import build_report, copy_galleries, write_report
from .param_plot import plot_param_effects
from .plots import surrogate_keys
from .summary import summary_sentence
from .tables import html_table, paper_tables
from .training_plot import plot_training_curves

__all__ = [
    "DEFAULT_OBJECTIVES",
    "PRIVACY_MODES",
    "MAIN_PARAMS",
    "Results",
    "build_report",
    "write_report",
    "load_results",
    "load_objectives",
    "add_pareto_ranks",
    "best_baseline",
    "front_of",
    "frontier_figure",
    "plot_frontier",
    "plot_hypervolume",
    "plot_param_effects",
    "plot_lambda_curves",
    "plot_training_curves",
    "copy_galleries",
    "summary_sentence",
    "paper_tables",
    "surrogate_keys",
    "html_table",
    "format_value",
]
