"""How often the report's claims are wrong, and how often they are found: the summary and the tables judged on
simulated searches whose truth is known (docs/protocol.md §9; tests/test_claims.py holds the rates).

A simulated search (``simulated_trials``) has one λ = 0 baseline of ``baseline_runs`` seeds and ``configs``
configurations of ``runs`` seeds each, every run drawn from N(0.90, 0.03) in test accuracy and N(0.75, 0.01)
in attack SSIM (the baseline's own distribution: pure noise), except the configurations given an ``effect``
(a true shift of both means). With ``confirm``, the ``confirm`` most private configurations of the search run
again with ``confirm_runs`` new seeds, as ``confirm:`` in a space does. ``judge`` builds the report's
``Results`` of such a table in memory (``load.results_of``: the same code as ``cem-bench report`` from the
table on) and returns what the summary claims (``summary.claim``) and what the tables mark
(``table.paper_table``), checked against each other.

``python -m cem_bench.analysis.report.claims [--tables N]`` prints the rates of docs/protocol.md §9.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cem_bench.analysis.table import paper_table

from .load import results_of
from .summary import TRADE_OFF, claim, summary_sentence

OBJECTIVES = [{"metric": "test_acc", "mode": "max", "ref": 0.1}, {"metric": "attack_ssim", "mode": "min", "ref": 1.0}]
ACC, SSIM = (0.90, 0.03), (0.75, 0.01)      # the runs' mean and spread: the baseline's distribution


def simulated_trials(rng: np.random.Generator, configs: int, effect: dict[int, tuple[float, float]] | None = None,
                     runs: int = 3, baseline_runs: int = 4, confirm: int = 0, confirm_runs: int = 4,
                     spread: float = 1.0, skewed: bool = False) -> pd.DataFrame:
    """A trials table of a simulated search (module docstring): configuration ``i`` is gmm at λ = i + 1;
    ``effect[i] = (Δ accuracy, Δ SSIM)`` shifts its means; ``spread`` scales the configurations' spread
    relative to the baseline's; ``skewed`` draws every run from a shifted exponential of the same mean and
    spread (a long tail towards higher values, as of a seed that failed to train) instead of a normal."""
    effect = effect or {}
    rows = []

    def draw(mean: float, sd: float) -> float:
        return mean + sd * (rng.exponential() - 1.0) if skewed else rng.normal(mean, sd)

    def run(i: int | None, seed: int, role: str) -> None:
        d_acc, d_ssim = effect.get(i, (0.0, 0.0)) if i is not None else (0.0, 0.0)
        k = 1.0 if i is None else spread
        rows.append({"trial_id": f"t{len(rows):05d}", "status": "ok", "role": role, "config.seed": seed,
                     "config.defense.noise_std": 0.1, "config.cem.lambd": 0.0 if i is None else float(i + 1),
                     "config.cem.surrogate": "gmm", "test_acc": draw(ACC[0] + d_acc, k * ACC[1]),
                     "attack_ssim": draw(SSIM[0] + d_ssim, k * SSIM[1]), "wall_s": 1.0})
    for s in range(baseline_runs):
        run(None, s, "baseline")
    for i in range(configs):
        for s in range(runs):
            run(i, s, "search")
    if confirm:
        searched = pd.DataFrame(rows[baseline_runs:])
        best = searched.groupby("config.cem.lambd")["attack_ssim"].mean().nsmallest(confirm).index
        for lam in best:
            for s in range(confirm_runs):
                run(int(lam) - 1, 1000 + s, "confirm")
    return pd.DataFrame(rows)


@dataclass
class Judgement:
    named: int | None      # the configuration (index) the summary calls more private, None for none
    utility: str           # its utility state (summary.utility_states)
    marks: int             # comparisons the attack_ssim and test_acc tables mark, of
    compared: int          # the comparisons they make
    consistent: bool       # the summary's claim is marked; nothing the summary calls within noise is marked
    sentence: str


def judge(trials: pd.DataFrame) -> Judgement:
    """What the report says about a simulated search (module docstring)."""
    res = results_of(trials, OBJECTIVES, name="simulated")
    cl = claim(res)
    sentence = summary_sentence(res)
    c = res.configs
    marks = compared = 0
    marked: dict[str, set[str]] = {}
    for m in ("test_acc", "attack_ssim"):
        table = paper_table(c, m)
        cells = table.to_numpy().ravel().astype(str)
        marked[m] = {col for col, cell in zip(table.columns, table.iloc[0].astype(str))
                     if cell.endswith(("[+]", "[−]"))}
        marks += sum(cell.endswith(("[+]", "[−]")) for cell in cells)
        compared += int(pd.to_numeric(c[f"{m}_p"], errors="coerce").notna().sum())
    named = None if cl is None or cl.named is None else int(round(float(cl.named["config.cem.lambd"]))) - 1
    consistent = True
    if named is not None:   # the claim is a mark in the table of its metric
        consistent = f"λ={named + 1:g} gmm" in marked["attack_ssim"]
    if "the differences the plots show are within the noise" in sentence:   # then no table marks anything
        consistent = consistent and not (marked["attack_ssim"] or marked["test_acc"])
    utility = cl.utility if cl is not None and cl.named is not None else ""
    return Judgement(named, utility, marks, compared, consistent, sentence)


def rates(design: str, tables: int, seed: int = 0) -> dict:
    """Run ``tables`` simulated searches of one design; the share of reports with a false claim, of reports
    that claim the true effect, of comparisons marked, and of inconsistent pages."""
    rng = np.random.default_rng(seed)
    designs = {
        "null 12": dict(configs=12),
        "null 100": dict(configs=100),
        "null 12, 3x spread": dict(configs=12, spread=3.0),
        "null 12, 3x spread, baseline 3 runs": dict(configs=12, spread=3.0, baseline_runs=3),
        "null 12, 8x spread, baseline 3 runs": dict(configs=12, spread=8.0, baseline_runs=3),
        "null 12, 8x spread": dict(configs=12, spread=8.0),
        "null 100, 8x spread": dict(configs=100, spread=8.0),
        "null 12, 2 runs, 3x spread": dict(configs=12, runs=2, spread=3.0),
        "null 12, 1 run, 8x spread": dict(configs=12, runs=1, spread=8.0),
        "null 12, 3x spread, skewed": dict(configs=12, spread=3.0, skewed=True),
        "null 12, 3x spread, skewed, top 3 confirmed": dict(configs=12, spread=3.0, skewed=True, confirm=3),
        "null 12, 3x spread, skewed, top 3 confirmed with 8 seeds": dict(configs=12, spread=3.0, skewed=True, confirm=3,
                                                                        confirm_runs=8),
        "null 12, top 3 confirmed": dict(configs=12, confirm=3),
        "null 100, top 3 confirmed": dict(configs=100, confirm=3),
        "SSIM -5 spreads, 11 null": dict(configs=12, effect={0: (0.0, -5 * SSIM[1])}),
        "SSIM -5 spreads, 11 null, top 3 confirmed": dict(configs=12, effect={0: (0.0, -5 * SSIM[1])}, confirm=3),
        "SSIM -5 spreads, 11 null, top 3 confirmed with 3 seeds": dict(configs=12, effect={0: (0.0, -5 * SSIM[1])},
                                                                      confirm=3, confirm_runs=3),
        "trade-off (SSIM -0.10, accuracy -0.10), 11 null": dict(configs=12, effect={0: (-0.10, -0.10)}),
        "trade-off, 11 null, top 3 confirmed": dict(configs=12, effect={0: (-0.10, -0.10)}, confirm=3),
    }
    kw = designs[design]
    true = set(kw.get("effect", {}))
    out = {"design": design, "tables": tables, "false claim": 0, "true claim": 0, "named trade-off": 0,
           "false trade-off": 0, "marks": 0, "compared": 0, "inconsistent": 0}
    for _ in range(tables):
        j = judge(simulated_trials(rng, **kw))
        out["false claim"] += j.named is not None and j.named not in true
        out["true claim"] += j.named is not None and j.named in true
        out["named trade-off"] += j.utility == TRADE_OFF
        out["false trade-off"] += j.utility == TRADE_OFF and kw.get("effect", {}).get(j.named, (0.0, 0.0))[0] >= 0
        out["marks"] += j.marks
        out["compared"] += j.compared
        out["inconsistent"] += not j.consistent
    return out


DESIGNS = ("null 12", "null 100", "null 12, 3x spread", "null 12, 3x spread, baseline 3 runs",
           "null 12, 8x spread, baseline 3 runs", "null 12, 8x spread", "null 100, 8x spread",
           "null 12, 2 runs, 3x spread", "null 12, 1 run, 8x spread",
           "null 12, 3x spread, skewed", "null 12, 3x spread, skewed, top 3 confirmed",
           "null 12, 3x spread, skewed, top 3 confirmed with 8 seeds",
           "null 12, top 3 confirmed", "null 100, top 3 confirmed",
           "SSIM -5 spreads, 11 null", "SSIM -5 spreads, 11 null, top 3 confirmed",
           "SSIM -5 spreads, 11 null, top 3 confirmed with 3 seeds", "trade-off (SSIM -0.10, accuracy -0.10), 11 null",
           "trade-off, 11 null, top 3 confirmed")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cem_bench.analysis.report.claims", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", type=int, default=200, help="simulated searches per design")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--designs", nargs="*", default=list(DESIGNS))
    args = ap.parse_args(argv)
    print("| design | reports | false claim | true claim | named a trade-off | false trade-off | comparisons "
          "marked | inconsistent pages |")
    print("|---|---|---|---|---|---|---|---|")
    for d in args.designs:
        r = rates(d, args.tables, args.seed)
        n = r["tables"]
        print(f"| {d} | {n} | {r['false claim'] / n:.1%} | {r['true claim'] / n:.1%} | "
              f"{r['named trade-off'] / n:.1%} | {r['false trade-off'] / n:.1%} | "
              f"{r['marks'] / max(1, r['compared']):.2%} | {r['inconsistent']} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

