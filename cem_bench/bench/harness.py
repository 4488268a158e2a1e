"""The harness of ``cem-bench bench``: sizes, header, timing, rows, the registry of row groups, the output.

What it measures is in the row modules (``data``, ``step``, ``refit``, ``attack``, ``ray``), each of which
registers its group here with ``@row(group, label, order=...)``; ``run_bench`` runs the registered groups
in their ``order`` and turns a group that raises into an error row, so that the rest of the table is still
measured. Against what: every figure is the median of several timed repeats after warm-up, and every
comparison is a ratio of two figures of the same run, timed alternately (``round_robin``), so that load
from other processes falls on both sides (docs/performance.md).

Timing: ``timed`` times one call with ``time.perf_counter`` (``torch.cuda.synchronize`` of the device before
and after on CUDA); it is used for the long figures (seconds), where one call is one repeat.
``time_short`` uses ``torch.utils.benchmark.Timer`` for the short, repeatable ones (milliseconds): the same
synchronised clock, torch's current thread count (the Timer's default is 1), and the Timer's own two untimed
calls before each timed one.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import torch

ENV_KEYS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
BUSY_LOAD = 0.75  # 1-min load average per CPU above which the header warns


# ------------------------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class Sizes:
    """How much work each row does; ``quick`` and ``tiny`` shrink the data and the repeats, ``tiny`` (tests
    only) also the model."""

    label: str
    repeats: int             # timed repeats per figure (the median is reported)
    step_repeats: int        # timed steps per training-step configuration (the noisiest, cheapest figure)
    warmup: int              # untimed repeats first
    width: float             # VGG width of the step/refit/attack rows (1.0 = the paper)
    batch_size: int          # training batch (128 = the paper)
    data_images: int         # images per timed data-path pass
    step_images: int         # training split of the step rows (only a few batches are used)
    refit_images: int        # training split whose features the refit clusters
    attack_test: int         # test split; the attacker trains on 90 % of it (inference protocol)
    attack_blocks: int
    attack_channels: int
    ray_trial: dict          # the trial config (flat keys) of the Ray row
    ray_kind: str            # "tiny" or "demo-size": the Ray target is only checked on a demo-size trial
    ray_trials: int          # direct runs and Tune trials (each)
    epoch_images: int = 512  # training split of the epoch rows (a whole epoch: augmentation, steps, evaluation)
    epoch_test: int = 200    # its test split (evaluated every epoch)
    results_trials: tuple[int, ...] = (1_000, 10_000, 100_000)   # synthetic results tables of the results row
    sampler_trials: tuple[int, ...] = (1_000, 10_000)            # completed trials before the sampler's ask


TINY_TRIAL = {"data.train_size": 256, "data.test_size": 100, "model.width": 0.125, "train.epochs": 2,
              "train.batch_size": 64, "attack.epochs": 1, "attack.blocks": 1, "attack.channels": 8,
              "attack.batch_size": 64, "attack.min_accuracy_margin": -1}   # at chance, but the attack is timed too
# A demo-size trial: search_spaces/demo.yaml's fixed keys (read at run time, so the bench follows the demo)
# with its lambda/surrogate draw pinned to the paper's estimator. The copy below is used where the file is
# not there (an installed package without the repository).
DEMO_SPACE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "search_spaces", "demo.yaml")
DEMO_PINNED = {"cem.surrogate": "gmm", "cem.lambd": 16.0}
DEMO_FALLBACK = {"data.dataset": "digits", "model.width": 0.125,
                 "train.epochs": 8, "train.milestones": [0.75], "train.warmup_lr_epochs": 1, "train.batch_size": 64,
                 "train.augment": "none", "cem.warmup_epochs": 1, "attack.epochs": 4, "attack.blocks": 2,
                 "attack.channels": 32, "attack.batch_size": 32, "defense.noise_std": 0.05}


def positive_seconds(text: str) -> float:
    """argparse type of a script's budget or limit: a finite number of seconds > 0 (NaN ran without a limit, a
    negative budget measured nothing and exited 0)."""
    from ..parsing import positive_number
    return positive_number(text, "number of seconds")


def demo_trial() -> dict:
    try:
        from ..spaces import load_space
        fixed = dict(load_space(DEMO_SPACE).fixed)
    except Exception:  # noqa: BLE001 - no repository checkout, or a space being edited
        fixed = dict(DEMO_FALLBACK)
    fixed.pop("train.device", None)
    return {**fixed, **DEMO_PINNED}


def sizes_for(device: torch.device, quick: bool, tiny: bool) -> Sizes:
    if tiny:
        return Sizes("tiny (test only: numbers not comparable)", repeats=3, step_repeats=3, warmup=1, width=0.125,
                     batch_size=64, data_images=512, step_images=256, refit_images=256, attack_test=160,
                     attack_blocks=1, attack_channels=8,
                     ray_trial=dict(TINY_TRIAL, **{"train.epochs": 1, "cem.warmup_epochs": 0}),
                     ray_kind="tiny", ray_trials=1, epoch_images=256, epoch_test=100, results_trials=(300,),
                     sampler_trials=(50,))
    cuda = device.type == "cuda"
    if quick:
        return Sizes("quick", repeats=3, step_repeats=5, warmup=1, width=1.0, batch_size=128,
                     data_images=8192 if cuda else 2048, step_images=1024, refit_images=16384 if cuda else 1024,
                     attack_test=2560 if cuda else 285, attack_blocks=8, attack_channels=64,
                     ray_trial=dict(TINY_TRIAL), ray_kind="tiny", ray_trials=3,
                     epoch_images=50000 if cuda else 512, epoch_test=10000 if cuda else 200,
                     results_trials=(1_000, 10_000), sampler_trials=(1_000,))
    return Sizes("full", repeats=7 if cuda else 5, step_repeats=10 if cuda else 7, warmup=2 if cuda else 1,
                 width=1.0, batch_size=128, data_images=50000 if cuda else 8192, step_images=1024,
                 refit_images=50000 if cuda else 4096,
                 attack_test=10000 if cuda else 1138, attack_blocks=8, attack_channels=64,
                 ray_trial=demo_trial(), ray_kind="demo-size", ray_trials=3,
                 epoch_images=50000 if cuda else 2048, epoch_test=10000 if cuda else 1000)


# ------------------------------------------------------------------------------------------- timing
def clock(device: torch.device) -> Callable[[], float]:
    """``time.perf_counter``, after ``torch.cuda.synchronize(device)`` when the device is CUDA."""
    if device.type != "cuda":
        return time.perf_counter

    def synced() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return synced


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call of ``fn`` (device synchronised before and after)."""
    now = clock(device)
    t0 = now()
    fn()
    return now() - t0


def time_short(fn: Callable[[], Any], device: torch.device, settle_s: float = 0.0) -> float:
    """Seconds of one call of a short, repeatable ``fn`` by ``torch.utils.benchmark.Timer``: ``timeit(1)``
    makes two untimed calls, then times one, on the synchronised clock with torch's current thread count.
    ``settle_s``: an untimed pause (the Timer's ``setup``) before the untimed calls and again right before
    the timed one."""
    from torch.utils.benchmark import Timer
    t = Timer(stmt="fn()", setup=f"sleep({settle_s!r})" if settle_s else "pass",
              globals={"fn": fn, "sleep": time.sleep}, timer=clock(device), num_threads=torch.get_num_threads())
    return t.timeit(1).mean


def median_time(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int,
                short: bool = False) -> list[float]:
    """``warmup`` untimed calls, then ``repeats`` timed ones (``time_short`` if ``short``); their median is
    the figure."""
    for _ in range(warmup):
        fn()
    once = time_short if short else timed
    return [once(fn, device) for _ in range(repeats)]


def round_robin(fns: dict[str, Callable[[], Any]], device: torch.device, repeats: int,
                warmup: int, settle_s: float = 0.0, short: bool = False) -> dict[str, list[float]]:
    """Time several functions alternately (a, b, a, b, ...): load from other processes then falls on all
    of them alike, so their ratio stays meaningful on a shared machine. ``settle_s``: an untimed pause
    before each call, for functions that run on different OpenMP runtimes (torch's and scikit-learn's
    bundled libgomp): the threads one runtime leaves spinning after its last parallel region otherwise
    take the cores from the other's first milliseconds. ``short``: each call is timed by ``time_short``,
    which pauses right before its timed call. Returns the timed repeats."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(warmup + repeats):
        for k, fn in fns.items():
            if short:
                t = time_short(fn, device, settle_s)
            else:
                if settle_s:
                    time.sleep(settle_s)
                t = timed(fn, device)
            if r >= warmup:
                times[k].append(t)
    return times


# ------------------------------------------------------------------------------------------- rows
def make_row(name: str, value=None, unit: str = "", baseline=None, baseline_name: str = "", ratio=None,
             ratio_name: str = "", target: tuple | None = None, note: str = "", samples=None,
             error: str | None = None, **extra) -> dict:
    """One table row; ``target`` = (``"ge"`` or ``"le"``, bound) on ``ratio`` decides ``met``."""
    met = None
    if target is not None and ratio is not None and error is None:
        op, bound = target
        met = bool(ratio >= bound) if op == "ge" else bool(ratio <= bound)
    return {"name": name, "value": value, "unit": unit, "baseline": baseline, "baseline_name": baseline_name,
            "ratio": ratio, "ratio_name": ratio_name,
            "target": None if target is None else {"op": target[0], "value": target[1]},
            "met": met, "note": note, "samples": list(samples) if samples is not None else None, "error": error,
            **extra}


def error_row(name: str, exc: BaseException) -> dict:
    msg = f"{type(exc).__name__}: {exc}".strip()
    return make_row(name, error=msg.splitlines()[0][:300] if msg else type(exc).__name__)


def step_config(sizes: Sizes, device: torch.device, **extra) -> dict:
    """The flat trial config of the step, refit and attack rows: the paper's model at ``sizes``."""
    return {"data.dataset": "synthetic", "model.width": sizes.width, "model.bottleneck_channels": 8,
            "train.batch_size": sizes.batch_size, "train.device": device.type, "seed": 0, **extra}


def named_config(name: str) -> dict:
    """The keys of a configuration the step rows name: ``"lambda=0"`` (no CEM) or a surrogate at its defaults."""
    return {"cem.lambd": 0.0} if name == "lambda=0" else {"cem.surrogate": name}


def step_trainer(flat: dict, device: torch.device, splits):
    """``(cfg, trainer)`` of ``flat`` ready to step as in an epoch (``Trainer.prepare_steps``: a surrogate with a
    refit fitted, which is not part of a step; every module in train mode), built on ``splits``."""
    from ..core.trial import build, build_config
    cfg = build_config(flat)
    _, tr = build(cfg, device, splits)
    tr.prepare_steps(tr.surrogate is not None)
    return cfg, tr


def synthetic_splits(train_images: int, test_images: int, device: torch.device):
    """Synthetic splits on ``device``; large training splits are generated in chunks (memory)."""
    from ..config import DataConfig
    from ..core import data
    chunk = 8192
    splits = data.load(DataConfig(dataset="synthetic", train_size=min(train_images, chunk),
                                  test_size=test_images), device)
    if train_images > chunk:
        parts = [data.make_synthetic(min(chunk, train_images - i), seed=1000 + i // chunk)
                 for i in range(0, train_images, chunk)]
        train = data.Split(torch.cat([p.images for p in parts]).to(device),
                           torch.cat([p.labels for p in parts]).to(device))
        splits = dataclasses.replace(splits, train=train)
    return splits


# ------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class RowGroup:
    """A group of rows: ``fn(device, sizes, **options) -> list[dict]``; ``label`` names its error row.
    ``options``: further names of ``run_bench(only=...)`` that this group serves, each with the device type
    it applies on; the group gets ``option=True`` when asked for it there (and runs for it alone)."""

    group: str
    label: str
    order: int
    fn: Callable[..., list[dict]]
    options: dict[str, str] = field(default_factory=dict)


ROWS: dict[str, RowGroup] = {}
# figures one row group measures and a later one builds on (the paper-trial estimate of ``epoch`` uses the
# attack's per-image times); cleared by ``run_bench``
MEASURED: dict[str, float] = {}


def row(group: str, label: str, *, order: int, options: dict[str, str] | None = None):
    """Register the decorated function as the row group ``group`` (run in ascending ``order``)."""
    def deco(fn: Callable[..., list[dict]]) -> Callable[..., list[dict]]:
        if group in ROWS and ROWS[group].fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"bench row group {group!r} is registered twice")
        ROWS[group] = RowGroup(group, label, order, fn, dict(options or {}))
        return fn
    return deco


def registered() -> list[RowGroup]:
    return sorted(ROWS.values(), key=lambda g: g.order)


def group_names() -> tuple[str, ...]:
    """Every name ``run_bench(only=...)`` accepts: the groups in order, then their options."""
    groups = registered()
    return tuple([g.group for g in groups] + [o for g in groups for o in g.options])


# ------------------------------------------------------------------------------------------- driver
def header(device: torch.device, sizes: Sizes) -> dict:
    from .. import __version__
    from ..provenance import device_name, git_sha
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "device": device_name(device),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if device.type == "cuda" else None,
        "python": platform.python_version(),
        "package_version": __version__,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "git_commit": git_sha(),
        "mode": sizes.label,
        "repeats": sizes.repeats,
        "step_repeats": sizes.step_repeats,
        "warmup": sizes.warmup,
        "load_avg_start": [round(v, 2) for v in load],
        # OpenMP settings change CPU timings a lot on a shared machine (docs/performance.md, 'Two settings')
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
    }


def _progress(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def run_bench(device: str = "cpu", quick: bool = False, only: list[str] | tuple[str, ...] | None = None,
              tiny: bool = False, progress: bool = True) -> dict:
    """Measure the rows of ``only`` (default: every registered group; ``flops`` only on CUDA) and return
    ``{"header": {...}, "rows": [{name, value, unit, baseline, ratio, target, met, note, error, ...}]}``."""
    from ..core.runtime import resolve_device
    dev = resolve_device(device)
    known = group_names()
    wanted = set(known if only is None else only)
    unknown = [g for g in (only or ()) if g not in known]
    if unknown:
        raise ValueError(f"unknown bench rows {unknown}; known: {', '.join(known)}")
    # an option asked for by name on a device it does not apply to would be left out in silence
    elsewhere = [f"{o} ({t} only)" for g in registered() for o, t in g.options.items()
                 if o in (only or ()) and dev.type != t]
    if elsewhere:
        raise ValueError(f"bench rows {', '.join(elsewhere)} cannot run on {dev.type}: leave them out or use "
                         f"--device cuda")
    sizes = sizes_for(dev, quick, tiny)
    MEASURED.clear()
    head = header(dev, sizes)
    t_all = time.perf_counter()
    rows: list[dict] = []
    for g in registered():
        opts = {o: o in wanted and dev.type == dev_type for o, dev_type in g.options.items()}
        if g.group not in wanted and not any(opts.values()):
            continue
        t0 = time.perf_counter()
        try:
            new = g.fn(dev, sizes, **opts)
        except Exception as e:  # noqa: BLE001 - an error row, the table goes on
            if progress:
                traceback.print_exc(file=sys.stderr)
            new = [error_row(g.label, e)]
        rows.extend(new)
        if progress:
            _progress(f"{g.label}: {time.perf_counter() - t0:.1f} s")
    head["bench_s"] = round(time.perf_counter() - t_all, 1)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    head["load_avg_end"] = [round(v, 2) for v in load]
    return {"header": head, "rows": rows}


# ------------------------------------------------------------------------------------------- output
def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit in ("img/s", "ops"):
        s = f"{v:,.0f}"
    elif unit in ("s", "s/step", "s/epoch", "s/trial"):
        # three significant digits below 0.1 s: a 1.73 ms step printed as 0.002
        s = f"{v:.3g}" if v < 0.1 else f"{v:.3f}" if v < 10 else f"{v:.1f}"
    else:
        s = f"{v:.3g}"
    return f"{s} {unit}".strip()


def _target_text(row: dict) -> str:
    t = row.get("target")
    if not t:
        return "-"
    sym = ">=" if t["op"] == "ge" else "<="
    return f"{sym} {t['value']:g}{_ratio_unit(row)}"


def _ratio_unit(row: dict) -> str:
    """What the ratio column is in: "x" for a ratio, else its unit (an absolute target's ms, s or min)."""
    name = row.get("ratio_name") or ""
    return f" {name}" if name else "x"


HEADER_LINES = (("device", "device"), ("CPU count", "cpu_count"), ("torch threads", "torch_threads"),
                ("torch", "torch_version"), ("date", "date"), ("git commit", "git_commit"), ("mode", "mode"))


def format_table(result: dict) -> str:
    """The header lines and the table as text (the notes under it, numbered)."""
    h = result["header"]
    lines = ["cem-bench bench"]
    for label, key in HEADER_LINES:
        lines.append(f"{label + ':':15s}{h.get(key)}")
    env = h.get("env") or {}
    lines.append(f"{'environment:':15s}" + (" ".join(f"{k}={v}" for k, v in env.items()) or "(no OMP_*/MKL_* set)"))
    if h.get("cuda_version"):
        lines.append(f"{'CUDA:':15s}{h['cuda_version']}")
    lines.append(f"{'timing:':15s}median of {h.get('repeats')} repeats ({h.get('step_repeats')} for the train "
                 f"steps) after {h.get('warmup')} warm-up "
                 f"(time.perf_counter{', cuda.synchronize' if h.get('cuda_version') else ''}; "
                 f"torch.utils.benchmark.Timer for the refit)")
    la, lb = h.get("load_avg_start"), h.get("load_avg_end")
    if la:
        lines.append(f"{'load average:':15s}{' '.join(f'{v:.2f}' for v in la)} at start"
                     + (f", {' '.join(f'{v:.2f}' for v in lb)} at end" if lb else "")
                     + f" (1/5/15 min; {h.get('cpu_count')} CPUs)")
    busy = [v for v in (la or [])[:1] + (lb or [])[:1] if v > BUSY_LOAD * (h.get("cpu_count") or 1)]
    if busy:
        lines.append(f"{'WARNING:':15s}the machine was busy (1-min load {max(busy):.2f} on {h.get('cpu_count')} "
                     f"CPUs): other processes share the cores, so the figures are slower and noisier than on "
                     f"an idle machine; rerun when the load is low")
    if h.get("bench_s") is not None:
        lines.append(f"{'bench time:':15s}{h['bench_s']:.1f} s")
    lines.append("")
    cols = ("row", "value", "baseline", "ratio", "target", "met")
    table = []
    notes = []
    for row in result["rows"]:
        if row.get("error"):
            table.append((row["name"], "ERROR", row["error"][:80], "-", _target_text(row), "error"))
            notes.append(f"{row['name']}: {row['error']}")
            continue
        ratio = "-" if row.get("ratio") is None else f"{row['ratio']:.2f}{_ratio_unit(row)}"
        if row.get("overhead") is not None:
            ratio += f" ({row['overhead']:+.0%})"
        met = {True: "yes", False: "NO", None: "-" if not row.get("target") else "n/a"}[row.get("met")]
        table.append((row["name"], _num(row.get("value"), row.get("unit", "")),
                      _num(row.get("baseline"), row.get("unit", "")), ratio, _target_text(row), met))
        if row.get("note"):
            base = f"baseline = {row['baseline_name']}; " if row.get("baseline_name") else ""
            notes.append(f"{row['name']}: {base}{row['note']}")
    widths = [max(len(str(r[i])) for r in [cols, *table]) for i in range(len(cols))]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    lines.append(fmt.format(*cols))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(fmt.format(*r) for r in table)
    if notes:
        lines.append("")
        lines.append("notes:")
        lines.extend(f"[{i}] {n}" for i, n in enumerate(notes, 1))
    return "\n".join(lines)


def main(args) -> int:
    """``cem-bench bench [--device cpu|cuda] [--quick] [--json FILE] [--only GROUP ...]``."""
    from ..storage import write_json
    device = getattr(args, "device", "cpu")   # an empty --device "" (an unset variable?) is refused, not cpu
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        print(f"cem-bench bench: --device {device!r}; allowed: cpu, cuda (or cuda:N)", file=sys.stderr)
        return 2
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"cem-bench bench: --device {device} but CUDA is not available here; use --device cpu",
              file=sys.stderr)
        return 2
    if device.startswith("cuda:"):
        index = device.removeprefix("cuda:")
        if not index.isdigit() or int(index) >= torch.cuda.device_count():
            print(f"cem-bench bench: --device {device}: this machine has CUDA devices cuda:0 to "
                  f"cuda:{torch.cuda.device_count() - 1}", file=sys.stderr)
            return 2
    try:
        result = run_bench(device=device, quick=bool(getattr(args, "quick", False)), only=getattr(args, "only", None))
    except ValueError as e:                      # an unknown --only group, named with the known ones
        print(f"cem-bench bench: {e}", file=sys.stderr)
        return 2
    print(format_table(result), flush=True)
    path = getattr(args, "json", None)
    if path:
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        write_json(path, result)  # temp file + os.replace
        print(f"json: {path}")
    return 0
