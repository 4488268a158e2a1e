"""Every CUDA measurement of the GPU-throughput work in one run (docs/performance.md "Measured on a GPU").

Run on a GPU machine from the repository root, without installing (no Ray or Optuna needed):

    OUT=/some/folder PYTHONPATH=. python3 scripts/gpu_check.py [--budget-s 480]

Stages, each time-boxed, each writing ``$OUT/<stage>.json`` (or ``.txt``) as soon as it ends, so that a run
cut short still returns what it measured: ``env``; ``equivalence`` (graphed vs eager trainer, every surrogate,
every combination of noise and dropout, its own stream and compiled, with the difference after each step);
``profile`` (CUDA kernels and busy time of one eager step, plain and compiled); ``bench`` (``cem-bench bench
--device cuda --quick`` rows data, step (graphed, eager, on the surrogate's own stream, compiled, both), flops,
kernels (counted on CUDA, against the CPU count), refit, attack, epoch; ``--bench-groups`` picks); ``trial``
(a 50k-image gmm trial with both attacks, graphed, and its epochs eager); ``pack`` (k trials on one card,
with and without MPS); ``summary`` (``summary.md``: every target met or not, the surrogates' steps in each
variant beside their kernel counts, the equivalence checks, the overlap, the options, the profile). Not in the
default list: ``options`` (settings of the surrogate's own stream: priority, compile, Inductor flags) and
``overlap`` (how much of the compiled surrogate's kernels run beside the server's, from a profiler trace of
graph replays). On a machine without CUDA it runs the same stages on the CPU at tiny sizes (a dry run of the
script itself). A GPU machine that returns few files: tar ``$OUT`` at the end of the command.

Every stage is a function ``stage(run: Run) -> None`` of one frozen ``Run`` (the output folder, the budget
and the run's start, the device and the options of the command line); each takes its time left from ``run``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

# the checkout, as gpu_pack.py does: a lent GPU machine has cem_bench in no site-packages, and a caller that
# forgets PYTHONPATH=. would find every cem_bench import of the stages failing one by one
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cem_bench.bench.harness import positive_seconds  # noqa: E402

DEFAULT_OUT = "/tmp/cem_gpu_check"
DEFAULT_STAGES = ("env", "equivalence", "profile", "decoder", "bench", "trial", "pack", "summary")
EQUIVALENCE_CAP_S = 210.0   # default of --equivalence-cap-s: the equivalence stage starts no new configuration after
PAPER_EPOCHS = 240          # the paper trial's epochs, to which each slice is extrapolated


@dataclass(frozen=True)
class PaperVariant:
    """One slice of the paper trial: its name (the key of paper.json, a --paper-variants choice), the keys it
    sets over ``paper_keys()`` and its epochs on CUDA."""
    name: str
    keys: dict[str, Any] = field(hash=False)
    epochs: int


# the grid's precision first (train.amp off, PyTorch's TF32 defaults), then bf16, then strict fp32 (no TF32
# anywhere), each a whole slice of the paper trial: every epoch of a shorter run, its refits and evaluation, and
# both attacks at full size (50 decoder epochs on the 50k training images, rmle)
PAPER_VARIANTS = (PaperVariant("fp32 (tf32 auto)", {"train.amp": "off", "train.tf32": "auto"}, 20),
                  PaperVariant("bf16", {"train.amp": "on"}, 20),
                  PaperVariant("strict fp32 (tf32 off)", {"train.amp": "off", "train.tf32": "off"}, 20),
                  PaperVariant("tf32 on", {"train.amp": "off", "train.tf32": "on"}, 20))


@dataclass(frozen=True)
class EquivalenceVariant:
    """How the graphed step is run against the eager one: with noise and dropout, the surrogate on its own
    stream, the surrogate compiled, under deterministic algorithms."""
    noise_dropout: bool = False
    stream: bool = False
    compiled: bool = False
    deterministic: bool = False

    def key(self, name: str) -> str:
        """The configuration's key in equivalence.json (and for --equivalence-configs), e.g.
        ``slot_cross (noise+dropout) (stream) (compiled)``."""
        return f"{name}{' (noise+dropout)' if self.noise_dropout else ''}{' (stream)' if self.stream else ''}" \
               f"{' (compiled)' if self.compiled else ''}{' (deterministic)' if self.deterministic else ''}"


# most telling first: the candidate default (noise, own stream, compiled) and the plain step
EQUIVALENCE_VARIANTS = (EquivalenceVariant(noise_dropout=True, stream=True, compiled=True), EquivalenceVariant(),
                        EquivalenceVariant(stream=True, compiled=True), EquivalenceVariant(noise_dropout=True),
                        EquivalenceVariant(stream=True), EquivalenceVariant(compiled=True),
                        EquivalenceVariant(noise_dropout=True, stream=True),
                        EquivalenceVariant(noise_dropout=True, compiled=True),
                        EquivalenceVariant(deterministic=True),
                        EquivalenceVariant(stream=True, compiled=True, deterministic=True))


@dataclass(frozen=True)
class EquivalenceConfig:
    """One configuration of the equivalence stage: a surrogate (or ``lambda=0``) under one variant."""
    surrogate: str
    variant: EquivalenceVariant

    @property
    def key(self) -> str:
        return self.variant.key(self.surrogate)


@dataclass(frozen=True)
class Run:
    """One run of the script: where it writes, its budget from its start, the device, and the stages' options
    from the command line. Every stage reads its time left from here."""
    out: str
    budget_s: float
    t0: float
    device: str                                   # "cuda" or "cpu" (the dry run)
    bench_groups: tuple[str, ...] | None = None   # --bench-groups; None: the device's default
    equivalence_cap_s: float = EQUIVALENCE_CAP_S  # --equivalence-cap-s
    # --equivalence-reserve-s: what the equivalence stage leaves of the budget to the stages after it (the default
    # stages' bench and paper need a minute; `summary` alone, as gpu_grid_cost.sh runs it, a second or two)
    equivalence_reserve_s: float = 60.0
    equivalence_configs: tuple[str, ...] | None = None   # --equivalence-configs; None: all
    paper_variants: tuple[PaperVariant, ...] = PAPER_VARIANTS   # --paper-variants
    option_settings: tuple[str, ...] = ("default", "high_priority_stream", "tf32 matmuls",
                                        "tf32 matmuls, high_priority_stream")   # --options-settings

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        """Seconds of the budget left."""
        return self.budget_s - self.elapsed()

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)

    def write(self, name: str, obj) -> None:
        os.makedirs(self.out, exist_ok=True)
        path = self.path(name)
        with open(path, "w") as f:
            f.write(obj if isinstance(obj, str) else json.dumps(obj, indent=2, default=str))
        print(f"[gpu_check {self.elapsed():6.1f} s] wrote {path}", flush=True)

    def load(self, name: str):
        """A JSON file an earlier stage (or run) wrote, or None."""
        path = self.path(name)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def cli(self, args: list[str], timeout: float, log: str) -> int:
        """``cem-bench ARGS`` in a subprocess, its output tails written to ``log``; its return code (124: timed out)."""
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
        try:
            p = subprocess.run([sys.executable, "-m", "cem_bench.cli", *args], capture_output=True, text=True,
                               timeout=timeout, env=env)
            self.write(log, p.stdout[-20000:] + "\n--- stderr ---\n" + p.stderr[-8000:])
            return p.returncode
        except subprocess.TimeoutExpired as e:
            self.write(log, f"TIMEOUT after {timeout:.0f} s\n{(e.stdout or b'')[-20000:]!r}")
            return 124


def run_stage(run: Run, name: str, fn: Callable[[Run], None]) -> None:
    """Stage ``fn`` unless less than 20 s of the budget are left (the summary reads what the others wrote and
    takes no time: it runs whatever is left); an exception is written to ``<name>.error.txt``."""
    left = run.left() if name != "summary" else run.budget_s
    if left < 20:
        run.write(f"{name}.skipped.txt", f"skipped: {left:.0f} s of the budget left")
        return
    t = time.perf_counter()
    try:
        fn(run)
    except Exception:  # noqa: BLE001 - the next stage still runs
        run.write(f"{name}.error.txt", traceback.format_exc())
    print(f"[gpu_check] {name}: {time.perf_counter() - t:.1f} s", flush=True)


def env(run: Run) -> None:
    info = {"torch": torch.__version__, "cuda": run.cuda, "python": sys.version.split()[0],
            "cpus": os.cpu_count(), "has_register_generator_state":
            hasattr(torch.cuda, "CUDAGraph") and hasattr(torch.cuda.CUDAGraph, "register_generator_state")}
    if run.cuda:
        info["device"] = torch.cuda.get_device_name(0)
        info["mps_control"] = subprocess.run(["which", "nvidia-cuda-mps-control"], capture_output=True,
                                             text=True).stdout.strip()
    run.write("env.json", info)


def equivalence_configs(names: list[str]) -> list[EquivalenceConfig]:
    """The equivalence stage's configurations in the order it runs them: lambda = 0 plain and with noise and
    dropout, then every surrogate under each variant, most telling variant first."""
    return [EquivalenceConfig("lambda=0", EquivalenceVariant()),
            EquivalenceConfig("lambda=0", EquivalenceVariant(noise_dropout=True)),
            *(EquivalenceConfig(name, v) for v in EQUIVALENCE_VARIANTS for name in names)]


def equivalence(run: Run) -> None:
    """Graphed vs eager, as whole-run trails (``compare_with_eager``) and step by step (``compare_step_by_step``),
    for lambda = 0 and every surrogate under every combination of noise/dropout, own stream and compile, and
    (without noise) plain and both keys under deterministic algorithms. The configurations run in order of what
    they decide: the candidate default (noise, own stream, compiled) and the plain step for every surrogate
    first, so that a time cap (``run.equivalence_cap_s``) drops the least telling ones."""
    from cem_bench import surrogates
    from cem_bench.bench.equivalence import compare_step_by_step, compare_with_eager
    from cem_bench.core.graphs import WARMUP_STEPS
    # the surrogate's shapes as in the bench's step rows (batch 128, 8 channels at the cut): a compiled
    # surrogate (train.compile_surrogate) reuses the bench's compiled kernels from the on-disk cache
    tiny = {"model.width": 0.125, "model.bottleneck_channels": 8, "data.train_size": 512, "data.test_size": 100,
            "train.batch_size": 128, "train.amp": "off", "attack.names": ["decoder"]}
    todo = equivalence_configs(surrogates.names())
    if run.equivalence_configs:
        todo = [c for c in todo if c.key in run.equivalence_configs]
    cap = min(run.equivalence_cap_s, run.left() - run.equivalence_reserve_s)
    t0 = time.perf_counter()
    out = {}
    for c in todo:
        if not run.cuda:
            out[c.key] = "no CUDA: the graphed trainer needs a GPU"
            break
        if time.perf_counter() - t0 > cap:
            out[c.key] = f"skipped: the stage's {cap:.0f} s were used"
            continue
        flat = {**tiny, **({"cem.lambd": 0} if c.surrogate == "lambda=0" else
                           {"cem.surrogate": c.surrogate, "cem.lambd": 4.0})}
        v = c.variant
        t = time.perf_counter()
        try:
            # own stream: graphed two-stream vs one-stream eager steps; compiled: against compiled eager steps
            args = dict(flat={**flat, "train.surrogate_stream": v.stream, "train.compile_surrogate": v.compiled},
                        steps=WARMUP_STEPS + 5, device=run.device, random=v.noise_dropout,
                        eager_flat={"train.surrogate_stream": False}, deterministic=v.deterministic)
            # the trails of whole runs (where a difference grows), and each step from a common state
            # (whether any one step differs by more than rounding: compare_step_by_step)
            out[c.key] = {**compare_with_eager(**args), "step_by_step": compare_step_by_step(**args),
                          "seconds": time.perf_counter() - t}
        except Exception as e:  # noqa: BLE001
            out[c.key] = f"{type(e).__name__}: {e}"
        run.write("equivalence.json", out)   # after each: a killed run keeps what it measured
    run.write("equivalence.json", out)


def decoder(run: Run) -> None:
    """The decoder attack graphed vs eager on one encoder: per-epoch training MSE, metrics and seconds."""
    from cem_bench import attacks
    from cem_bench.core import models
    from cem_bench.core.trial import build, build_config
    out = {}
    for mode in ("on", "off"):
        cfg = build_config({"data.dataset": "synthetic", "data.train_size": 256, "data.test_size": 2560,
                            "model.width": 1.0, "attack.names": ["decoder"], "attack.epochs": 4,
                            "attack.blocks": 8, "attack.channels": 64, "attack.batch_size": 256,
                            "train.device": run.device,
                            "train.cuda_graph": mode if run.cuda else "off", "defense.noise_std": 0.05})
        splits, tr = build(cfg, torch.device(run.device))
        t = time.perf_counter()
        res = attacks.build(cfg, "decoder").run(tr.client, splits, 0.05, run.device)
        out[mode] = {"seconds": time.perf_counter() - t, "metrics": res.metrics, "history": res.history,
                     "client_params": models.count_params(tr.client)}
    run.write("decoder.json", out)


class OneBatch(NamedTuple):
    """What the profiled stages share: the device, the bench's quick sizes (tiny on the CPU), a 512-image
    synthetic split and its first training batch (``x`` normalised, ``y``)."""
    device: torch.device
    sizes: Any
    splits: Any
    x: torch.Tensor
    y: torch.Tensor


def one_batch(run: Run) -> OneBatch:
    from cem_bench.bench import harness
    dev = torch.device(run.device)
    sizes = harness.sizes_for(dev, quick=True, tiny=not run.cuda)
    splits = harness.synthetic_splits(512, 20, dev)
    return OneBatch(dev, sizes, splits, splits.normalize(splits.train.images[:sizes.batch_size]),
                    splits.train.labels[:sizes.batch_size])


def profiled_steps(tr, lr: float, x, y, warm: int, steps: int, cuda: bool):
    """``warm`` untimed steps of trainer ``tr`` (compile, graph warm-up and capture), then ``steps`` under
    ``torch.profiler`` (CPU, and CUDA where there is one); returns the profile."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cem_on, acc = tr.surrogate is not None, tr.epoch_acc()
    for _ in range(warm):
        tr.step(x, y, cem_on, lr, acc)
    if cuda:
        torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(steps):
            tr.step(x, y, cem_on, lr, acc)
        if cuda:
            torch.cuda.synchronize()
    return prof


class Interval(NamedTuple):
    start: float
    end: float


def union(intervals: list[Interval]) -> list[Interval]:
    """The union of ``intervals``, as sorted, disjoint intervals."""
    out: list[Interval] = []
    for iv in sorted(intervals):
        if out and iv.start <= out[-1].end:
            out[-1] = Interval(out[-1].start, max(out[-1].end, iv.end))
        else:
            out.append(iv)
    return out


def length(intervals: list[Interval]) -> float:
    return sum(iv.end - iv.start for iv in intervals)


def intersection(u: list[Interval], v: list[Interval]) -> float:
    """Length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(u) and j < len(v):
        lo, hi = max(u[i].start, v[j].start), min(u[i].end, v[j].end)
        total += max(0.0, hi - lo)
        if u[i].end < v[j].end:
            i += 1
        else:
            j += 1
    return total


def surrogate_kernel(name: str) -> bool:
    """A kernel of the compiled surrogate: Inductor's Triton kernels, or an fp32 matrix product (the surrogate
    runs in fp32; the client and server run bf16 convolutions and batch norm)."""
    n = name.lower()
    return n.startswith("triton_") or "sgemm" in n or "f32f32" in n or "gemv" in n


def replay_kernels(kernels: list[dict], steps: int) -> list[tuple[str, str, float, float]]:
    """The kernels of the middle one of ``steps`` replays that ``kernels`` (a trace's events) hold, as (name,
    stream, start, duration), times in µs from that replay's first kernel."""
    if not kernels or steps < 1:
        return []
    ks = sorted(kernels, key=lambda e: e["ts"])
    per = len(ks) // steps
    mid = ks[per * (steps // 2): per * (steps // 2 + 1)]
    t0 = mid[0]["ts"] if mid else 0.0
    return [(e.get("name", "")[:90], str(e.get("args", {}).get("stream")), round(e["ts"] - t0, 2), round(e["dur"], 2))
            for e in mid]


class OverlapConfig(NamedTuple):
    surrogate: str           # or "lambda=0"
    priority: int | None     # the side stream's priority; None: the default

    @property
    def key(self) -> str:
        return self.surrogate + (" (high priority)" if self.priority is not None else "")


def overlap(run: Run) -> None:
    """How much of the surrogate's GPU work runs beside the server's, graphed, compiled, on its own stream (and
    with the side stream at the highest priority): per configuration, 5 replays under the profiler with CUDA
    activity, the kernels split into the surrogate's (``surrogate_kernel``) and the rest, and per step: the
    time either side has a kernel running, the time both do, and the step's span. If the two overlap only for
    about the server's forward, the backward branches run one after the other."""
    from cem_bench.bench import harness
    from cem_bench.core.schedule import lr_at

    b = one_batch(run)
    out = {}
    configs = [OverlapConfig("lambda=0", None)] + [OverlapConfig(n, p) for n in ("slot_cross", "serial_enhanced",
                                                                                 "attention_centroid")
                                                   for p in (None, -100)]
    for c in configs:
        if run.left() < 30:
            break
        try:
            flat = harness.step_config(b.sizes, b.device, **{"data.train_size": 512, "data.test_size": 20},
                                       **harness.named_config(c.surrogate),
                                       **({} if c.surrogate == "lambda=0" else
                                          {"train.surrogate_stream": True, "train.compile_surrogate": True}))
            cfg, tr = harness.step_trainer(flat, b.device, b.splits)
            if c.priority is not None:
                tr.set_surrogate_stream_priority(c.priority)
            steps = 5
            prof = profiled_steps(tr, lr_at(cfg, 1), b.x, b.y, warm=10, steps=steps, cuda=run.cuda)
            trace = os.path.join("/tmp", f"cem_overlap_{os.getpid()}.json")
            prof.export_chrome_trace(trace)
            with open(trace) as f:
                events = json.load(f).get("traceEvents", [])
            os.remove(trace)
            kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
            sur = union([Interval(e["ts"], e["ts"] + e["dur"]) for e in kernels
                         if surrogate_kernel(e.get("name", ""))])
            rest = union([Interval(e["ts"], e["ts"] + e["dur"]) for e in kernels
                          if not surrogate_kernel(e.get("name", ""))])
            span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)) if kernels else 0.0
            out[c.key] = {"us_per_step": {"span": span / steps, "surrogate_busy": length(sur) / steps,
                                          "rest_busy": length(rest) / steps,
                                          "both_busy": intersection(sur, rest) / steps},
                          "kernels_per_step": {"surrogate": sum(surrogate_kernel(e.get("name", ""))
                                                                for e in kernels) / steps,
                                               "all": len(kernels) / steps},
                          "streams": sorted({str(e.get("args", {}).get("stream")) for e in kernels}),
                          # one replay's kernels in order (name, stream, start and duration in µs from the
                          # replay's first kernel): where the critical path runs, read offline
                          "replay": replay_kernels(kernels, steps),
                          "graph": tr.graph_step.stats() if tr.graph_step is not None else None}
        except Exception as e:  # noqa: BLE001 - the next configuration still runs
            out[c.key] = f"{type(e).__name__}: {e}"
        run.write("overlap.json", out)
    run.write("overlap.json", out)


def profile(run: Run) -> None:
    """Where a surrogate's step spends GPU time: one eager step per configuration under ``torch.profiler``
    (after 3 warm-up steps), kernels per step, the sum of their durations (busy time; a graphed step's time
    minus this is latency between kernels), and the operators with the most GPU time."""
    from cem_bench.bench import harness, kernels
    from cem_bench.core.schedule import lr_at

    b = one_batch(run)
    out = {}
    for name in ("lambda=0", "slot_cross", "serial_enhanced", "attention_centroid", "gmm", "slot_cross (compiled)",
                 "serial_enhanced (compiled)", "attention_centroid (compiled)"):
        base_name = name.removesuffix(" (compiled)")
        flat = harness.step_config(b.sizes, b.device, **{"data.train_size": 512, "data.test_size": 20,
                                                         "train.cuda_graph": "off",
                                                         "train.compile_surrogate": name != base_name},
                                   **harness.named_config(base_name))
        cfg, tr = harness.step_trainer(flat, b.device, b.splits)
        cem_on, lr = tr.surrogate is not None, lr_at(cfg, 1)
        steps = 5
        prof = profiled_steps(tr, lr, b.x, b.y, warm=3, steps=steps, cuda=run.cuda)
        events = prof.key_averages()
        on_gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy_us = sum(e.device_time_total for e in on_gpu)     # a kernel event: its own duration
        out[name] = {
            "kernels_per_step": len(on_gpu) / steps,
            # the counter's dispatch mode runs a compiled surrogate eagerly: the count is the uncompiled one
            "ops_counted_per_step": sum(kernels.count_step(tr, b.x, b.y, cem_on, lr).values()),
            "kernel_busy_us_per_step": busy_us / steps,
            "top": events.table(sort_by="cuda_time_total" if run.cuda else "cpu_time_total", row_limit=25),
        }
        # one file for every configuration's table (a GPU machine returns few files)
        run.write("profile_top.txt", "\n\n".join(f"== {k}\n{v['top']}" for k, v in out.items()))
    run.write("profile.json", {k: {kk: vv for kk, vv in v.items() if kk != "top"} for k, v in out.items()})


@dataclass
class TimedTrainer:
    """One trainer of the options stage, with its learning rate, accuracy accumulator and timed steps (s)."""
    trainer: Any
    lr: float
    acc: Any
    times: list[float] = field(default_factory=list)

    def step(self, x, y) -> None:
        self.trainer.step(x, y, self.trainer.surrogate is not None, self.lr, self.acc)


# The options stage's settings (``--options-settings`` picks): Inductor ``flags``, the side stream's
# ``priority`` (-100: the highest the device allows), whether the surrogate is ``compiled``, ``tf32`` matrix
# products, and the cuBLAS front end (``blas``: cuBLASLt launches one kernel per product with its bias in the
# epilogue, where plain cuBLAS may add a second). Left out: max_autotune (on the H100 its autotuning of the
# surrogates' many small products took more than 4 minutes for the first surrogate) and combo_kernels (within
# the noise of the default there: 1.38 / 1.46 / 1.70 vs 1.36 / 1.51 / 1.69); docs/performance.md.
OPTION_SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "high_priority_stream": {"priority": -100},
    "high_priority_stream, not compiled": {"priority": -100, "compiled": False},
    "tf32 matmuls": {"tf32": True},
    "tf32 matmuls, high_priority_stream": {"tf32": True, "priority": -100},
    "cublaslt": {"blas": "cublaslt"},
    "cublaslt, tf32 matmuls": {"blas": "cublaslt", "tf32": True},
}


def options(run: Run) -> None:
    """Settings for the surrogate on its own stream (``train.surrogate_stream``, graphed, compiled unless the
    setting says not): the slot-attention surrogates' step time under each, against a lambda = 0 step timed
    round-robin with them, at the bench's quick sizes. A setting is Inductor ``flags``, the side stream's
    ``priority`` (None: the default; -100: the highest the device allows, so that the surrogate's chain of small
    kernels, the step's critical path, is scheduled before the server's blocks), whether the surrogate is
    ``compiled`` and whether fp32 matrix products may use ``tf32`` tensor cores. Each setting compiles afresh
    (``torch._dynamo.reset``)."""
    import statistics

    import torch._dynamo
    import torch._inductor.config as inductor_config

    from cem_bench.bench import harness
    from cem_bench.core import data
    from cem_bench.core.schedule import lr_at

    dev = torch.device(run.device)
    sizes = harness.sizes_for(dev, quick=True, tiny=not run.cuda)
    splits = harness.synthetic_splits(sizes.step_images, 20, dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    batches = []
    for xy in data.BatchIterator(splits.train, splits, sizes.batch_size, "crop_flip_rotate", gen):
        batches.append(xy)
        if len(batches) == 4:
            break
    keys = {"data.train_size": sizes.step_images, "data.test_size": 20}
    settings = {k: OPTION_SETTINGS[k] for k in run.option_settings}
    names = ["lambda=0", "slot_cross", "attention_centroid", "serial_enhanced"]
    steps = 10 if run.cuda else 1
    out: dict = {}
    # the trainers set the process's TF32 flags from train.tf32 (runtime.set_tf32); put back what they were
    tf32_default = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    blas_default = torch.backends.cuda.preferred_blas_library() if run.cuda else None
    for setting, opt in settings.items():
        if run.left() < 60:
            out[setting] = "skipped: budget"
            break
        priority, compiled = opt.get("priority"), opt.get("compiled", True)
        torch._dynamo.reset()
        if run.cuda:
            torch.backends.cuda.preferred_blas_library(opt.get("blas", blas_default))
        res: dict = {}
        try:
            with inductor_config.patch(opt.get("flags", {})):
                runs: dict[str, TimedTrainer] = {}
                for name in names:
                    if run.left() < 60:   # a compile can take minutes: stop between surrogates, not only settings
                        res[name] = "skipped: budget"
                        continue
                    # train.tf32, not the global flag: Trainer.__init__ sets the flags from it on CUDA, so a
                    # flag set here was put back to auto's fp32 products and "tf32 matmuls" measured plain fp32
                    flat = harness.step_config(sizes, dev, **keys, **harness.named_config(name),
                                               **({"train.tf32": "on"} if opt.get("tf32") else {}),
                                               **({} if name == "lambda=0" else
                                                  {"train.surrogate_stream": True,
                                                   "train.compile_surrogate": compiled}))
                    cfg, tr = harness.step_trainer(flat, dev, splits)
                    if priority is not None:   # before the first step (and capture)
                        tr.set_surrogate_stream_priority(priority)
                    timed = runs[name] = TimedTrainer(tr, lr_at(cfg, 1), tr.epoch_acc())
                    t = time.perf_counter()
                    for i in range(8):   # compile, graph warm-up and capture
                        timed.step(*batches[i % 4])
                    if run.cuda:
                        torch.cuda.synchronize()
                    res[f"{name} first steps s"] = time.perf_counter() - t

                def one(timed: TimedTrainer):
                    def fn():
                        for i in range(steps):
                            timed.step(*batches[i % 4])
                    return fn
                for r in range(8):
                    for timed in runs.values():
                        t = harness.timed(one(timed), dev) / steps
                        if r >= 2:
                            timed.times.append(t)
                # lambda = 0 is built first: any run built includes it (none when the budget ran out first)
                base = statistics.median(runs["lambda=0"].times) if runs else None
                for name, timed in runs.items():
                    med = statistics.median(timed.times)
                    graph = timed.trainer.graph_step
                    res[name] = {"ms": med * 1e3, "ratio": med / base,
                                 "graph": graph.stats() if graph is not None else None}
        except Exception as e:  # noqa: BLE001 - the next setting still runs
            res["error"] = f"{type(e).__name__}: {e}"
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32_default
            if run.cuda:
                torch.backends.cuda.preferred_blas_library(blas_default)
        out[setting] = res
        run.write("options.json", out)
    run.write("options.json", out)


def bench(run: Run) -> None:
    groups = list(run.bench_groups or (["data", "step", "flops", "kernels", "refit", "attack", "epoch"] if run.cuda
                                       else ["step", "kernels"]))
    rc = run.cli(["bench", "--device", run.device, "--quick", "--json", run.path("bench.json"), "--only", *groups],
                 timeout=min(run.left() - 10, 380), log="bench.txt")
    if rc != 0:   # bench.error.txt, which the summary shows (the Targets table alone stayed empty, without a word)
        raise RuntimeError(f"cem-bench bench exited {rc}; its output is in bench.txt")


def trial(run: Run) -> None:
    n = 50000 if run.cuda else 512
    base = ["--set", "data.dataset=synthetic", "--set", f"data.train_size={n}", "--set",
            f"data.test_size={10000 if run.cuda else 200}", "--set", "model.width=" + ("1" if run.cuda else "0.125"),
            "--set", "cem.surrogate=gmm", "--set", "cem.lambd=16", "--set", "cem.warmup_epochs=1",
            "--set", "train.epochs=4", "--set", f"train.device={run.device}"]
    # graphed, with both attacks (2 decoder epochs at CIFAR's batch: synthetic stands in for CIFAR): the whole
    # trial path, a recapture when CEM switches on
    run.cli(["train", *base, "--set", "attack.epochs=2", "--set", "attack.batch_size=256",
             "--set", "attack.min_accuracy_margin=-1",
             "--out", run.path("trial_graphed")],
            timeout=min(run.left() - 10, 240), log="trial_graphed.txt")
    left = run.left()
    if left > 60:   # the same epochs eager, attacks skipped by the utility gate (margin 1: always)
        run.cli(["train", *base, "--set", "train.cuda_graph=off", "--set", "attack.min_accuracy_margin=1",
                 "--out", run.path("trial_eager")], timeout=min(left - 10, 200), log="trial_eager.txt")
    for d in ("trial_graphed", "trial_eager"):
        for junk in ("checkpoint.pt",):
            p = os.path.join(run.out, d, junk)
            if os.path.exists(p):
                os.remove(p)


def paper_keys(run: Run) -> dict:
    """The paper trial of issue 27 (``cem_bench.bench.paper.paper_keys``): cifar10_paper.yaml's fixed keys on
    synthetic data of CIFAR-10's size (tiny on the CPU), gmm lambda = 16, sigma 0.05."""
    from cem_bench.bench.paper import paper_keys as keys
    return keys(run.cuda, run.device)


def paper_slice(run: Run, variant: PaperVariant, timeout: float) -> dict:
    """One slice of the paper trial run by ``cem-bench train``: its per-epoch seconds, train and attack seconds,
    wall time, metrics, and the whole 240-epoch trial extrapolated as the slice's wall time plus the missing
    epochs at the median of its epochs after the first two (capture, cuDNN's autotuning and CEM's start)."""
    import re
    import statistics

    from cem_bench.bench.paper import epoch_seconds, train_args
    keys = {**paper_keys(run), **variant.keys, "train.epochs": variant.epochs if run.cuda else 3}
    out_dir = run.path("paper_" + re.sub(r"[^a-z0-9]+", "_", variant.name).strip("_"))
    t = time.perf_counter()
    rc = run.cli(train_args(keys, out_dir), timeout=timeout, log=os.path.basename(out_dir) + ".txt")
    wall = time.perf_counter() - t
    with open(run.path(os.path.basename(out_dir) + ".txt")) as f:
        epoch_s = epoch_seconds(f.read())
    res = {"rc": rc, "epochs": keys["train.epochs"], "process_wall_s": wall, "epoch_s": epoch_s}
    metrics_path = os.path.join(out_dir, "metrics.json")
    if os.path.exists(metrics_path):
        with open(metrics_path) as f:
            m = json.load(f)
        res.update({k: m.get(k) for k in ("test_acc", "test_acc_clean", "attack_ssim", "attack_ssim__decoder",
                                          "attack_ssim__rmle", "attack_psnr", "train_s", "attack_s",
                                          "attack_s__decoder", "attack_s__rmle", "wall_s")})
    steady = epoch_s[2:] or epoch_s
    if steady and res.get("wall_s") is not None:
        per = statistics.median(steady)
        res["steady_epoch_s"] = per
        res["whole_trial_s_extrapolated"] = res["wall_s"] + (PAPER_EPOCHS - len(epoch_s)) * per
    for junk in ("checkpoint.pt", "recon.png"):
        if os.path.exists(os.path.join(out_dir, junk)):
            os.remove(os.path.join(out_dir, junk))
    return res


def paper(run: Run) -> None:
    """The paper trial in the grid's precision and in bf16, then (budget allowing, or as --paper-variants
    names) strict fp32 and TF32 everywhere: what TF32 changes, same seeds (issue 27 item 1). Adds to the
    paper.json an earlier run left in the same folder."""
    out = run.load("paper.json") or {}
    for variant in run.paper_variants:
        left = run.left()
        if left < 60:
            out[variant.name] = f"skipped: {left:.0f} s of the budget left"
            continue
        out[variant.name] = paper_slice(run, variant, timeout=left - 20)
        run.write("paper.json", out)
    run.write("paper.json", out)


def pack(run: Run) -> None:
    if not run.cuda:
        run.write("pack.txt", "no CUDA: the pack row is CUDA only")
        return
    run.cli(["bench", "--device", "cuda", "--quick", "--json", run.path("bench_pack.json"), "--only", "pack"],
            timeout=max(30, run.left() - 10), log="bench_pack.txt")


def _g(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _table(title: str, results: dict | None, headers: list[str], cells) -> list[str]:
    """A markdown section of one stage's results, a row per configuration: ``cells(result)`` gives a dict
    result's cells; a string result (an error) fills the row. Nothing when the stage wrote nothing."""
    if not results:
        return []
    lines = ["", f"## {title}", "", "| configuration | " + " | ".join(headers) + " |",
             "|---" * (len(headers) + 1) + "|"]
    for key, res in results.items():
        row = cells(res) if isinstance(res, dict) else [res] + [""] * (len(headers) - 1)
        lines.append(f"| {key} | " + " | ".join(str(c) for c in row) + " |")
    return lines


def summary(run: Run) -> None:
    """``summary.md`` from what the other stages wrote: every bench row that has a target (met or not), the
    surrogates' one-stream and two-stream graphed steps side by side with their kernel counts and the time per
    extra kernel (the count model of docs/performance.md), and the equivalence checks against their floor."""
    lines = [f"# gpu_check summary ({'CUDA' if run.cuda else 'CPU dry run'}, torch {torch.__version__})", ""]
    rows = []
    for name in ("bench.json", "bench_pack.json"):
        rows += (run.load(name) or {}).get("rows", [])
    by_name = {r["name"]: r for r in rows}
    lines += ["## Targets", "", "| row | value | ratio | target | met |", "|---|---|---|---|---|"]
    for r in rows:
        if r.get("target") or r.get("error"):
            t = r.get("target") or {}
            lines.append(f"| {r['name']} | {_g(r.get('value'))} {r.get('unit', '')} | {_g(r.get('ratio'))} "
                         f"{r.get('ratio_name', '')} | {t.get('op', '')} {t.get('value', '')} | "
                         f"{r.get('met') if not r.get('error') else 'ERROR ' + r['error']} |")
    base = by_name.get("train step: lambda=0")
    kbase = by_name.get("kernels per step: lambda=0")
    from cem_bench import surrogates
    from cem_bench.bench.step import COMPILED, STREAM, STREAM_COMPILED
    variants = (STREAM, COMPILED, STREAM_COMPILED)
    lines += ["", "## Surrogate steps: graphed, own stream, compiled, kernels", "",
              "| surrogate | graphed ÷ λ=0 | " + " | ".join(f"{v} ÷ λ=0" for v in variants) +
              " | kernels (this device's count) | µs per extra kernel |", "|---|---|---|---|---|---|---|"]
    for name in surrogates.names():
        one = by_name.get(f"train step: {name}")
        others = [by_name.get(f"train step {v}: {name}") for v in variants]
        kern = by_name.get(f"kernels per step: {name}")
        per = ""
        if base and one and kern and kbase and kern["value"] > kbase["value"]:
            per = f"{(one['value'] - base['value']) * 1e6 / (kern['value'] - kbase['value']):.2f}"
        lines.append(f"| {name} | {_g(one and one.get('ratio'))} | "
                     + "".join(f"{_g(o and o.get('ratio'))} | " for o in others) +
                     f"{kern and kern['value']} (λ=0: {kbase and kbase['value']}) | {per} |")
    from cem_bench.bench.equivalence import steps_agree, within_eager_floor
    steps = lambda v: " ".join(f"{d:.0e}" for d in v)  # noqa: E731

    def step_cells(r: dict) -> list:
        """compare_step_by_step's verdict and, worst over the steps, the encoder's difference over the step's
        update, the encoder's and the surrogate's gradient differences (relative) and the share of surrogate
        entries moved differently; the eager pair's own in brackets."""
        s = r.get("step_by_step")
        if not s:
            return [""] * 5
        upd = lambda diffs: max(d / max(z, 1e-30) for d, z in zip(diffs, s["size"]))  # noqa: E731
        pair = lambda k, f, fmt: f"{max(s[k]):{fmt}} ({max(s[f]):{fmt}})"  # noqa: E731
        worst = s["surrogate_grad_worst"][s["surrogate_grad_rel"].index(max(s["surrogate_grad_rel"]))]
        return [steps_agree(s), f"{upd(s['diff']):.1e} ({upd(s['floor']):.1e})",
                pair("grad_rel", "grad_floor", ".1e"),
                pair("surrogate_grad_rel", "surrogate_grad_floor", ".1e") + f" {worst}",
                pair("surrogate_moved", "surrogate_moved_floor", ".3f")]
    lines += _table("Graphed vs eager", run.load("equivalence.json"),
                    ["max diff", "eager floor", "within", "diff after each step", "floor after each step",
                     "each step agrees", "encoder diff ÷ update", "encoder grads", "surrogate grads (worst tensor)",
                     "surrogate entries moved differently"],
                    lambda r: [f"{r['max_abs_diff']:.3g}", f"{r['eager_floor']:.3g}", within_eager_floor(r),
                               steps(r.get("diff_by_step", [])), steps(r.get("floor_by_step", []))] + step_cells(r))
    equiv = run.load("equivalence.json") or {}
    checked = {k: r["step_by_step"] for k, r in equiv.items() if isinstance(r, dict) and r.get("step_by_step")}
    if checked:   # the question the four whole-run differences left open: may the two keys be on by default?
        keyed = [k for k in checked if "(stream)" in k or "(compiled)" in k]
        failed = [k for k, r in checked.items() if not steps_agree(r)]
        missing = len(equiv) - len(checked)
        lines += ["", f"**Verdict**: {len(checked) - len(failed)} of {len(checked)} configurations agree step by step "
                      f"({len(keyed)} with the own stream or the compiled surrogate; {missing} not measured: "
                      f"skipped or failed to run)"
                      + (f"; not: {', '.join(failed)}." if failed else
                         ": every configuration, so with these keys the graphed step is the eager step to rounding."
                         if keyed and not missing else ".")]
    opts = run.load("options.json") or {}
    if opts:
        lines += ["", "## The surrogate on its own stream: settings (graphed; `options` stage) ÷ λ=0", ""]
        for setting, res in opts.items():
            if not isinstance(res, dict) or "error" in res:
                lines.append(f"- {setting}: {res if not isinstance(res, dict) else res['error']}")
                continue
            lines.append(f"- {setting}: " + ", ".join(f"{k} {v['ratio']:.2f}× ({v['ms']:.2f} ms)"
                                                      for k, v in res.items() if isinstance(v, dict)))
    lines += _table("Overlap: the surrogate's kernels beside the rest (graphed, own stream, compiled; µs per step)",
                    run.load("overlap.json"),
                    ["step span", "surrogate busy", "rest busy", "both busy", "surrogate kernels / all"],
                    lambda r: [f"{r['us_per_step'][k]:.0f}" for k in ("span", "surrogate_busy", "rest_busy",
                                                                       "both_busy")]
                    + [f"{r['kernels_per_step']['surrogate']:.0f} / {r['kernels_per_step']['all']:.0f}"])
    lines += _table(f"The paper trial, whole slices (gmm λ = 16, σ 0.05, 50k/10k synthetic; extrapolated to "
                    f"{PAPER_EPOCHS} epochs)", run.load("paper.json"),
                    ["epochs", "steady epoch s", "train s", "decoder s", "rmle s", "wall s",
                     f"whole trial min ({PAPER_EPOCHS} epochs)", "test acc", "SSIM decoder / rmle", "rc"],
                    lambda r: [r["epochs"], _g(r.get("steady_epoch_s")), _g(r.get("train_s")),
                               _g(r.get("attack_s__decoder")), _g(r.get("attack_s__rmle")), _g(r.get("wall_s")),
                               _g(r["whole_trial_s_extrapolated"] / 60) if r.get("whole_trial_s_extrapolated")
                               else "", _g(r.get("test_acc")),
                               f"{_g(r.get('attack_ssim__decoder'))} / {_g(r.get('attack_ssim__rmle'))}", r["rc"]])
    lines += _table("Profile (one eager step)", run.load("profile.json"), ["CUDA kernels", "busy µs", "ops counted"],
                    lambda r: [r["kernels_per_step"], f"{r['kernel_busy_us_per_step']:.0f}",
                               r["ops_counted_per_step"]])
    # the stages that failed or were skipped, by name: an empty table above reads otherwise as nothing to report
    notes = sorted(f for f in os.listdir(run.out) if f.endswith((".error.txt", ".skipped.txt")))
    if notes:
        lines += ["", "## Stages that failed or were skipped", ""]
        for f in notes:
            with open(os.path.join(run.out, f)) as fh:
                text = fh.read().strip().splitlines()
            lines.append(f"- {f}: {text[-1] if text else ''}")
    run.write("summary.md", "\n".join(lines) + "\n")


STAGES: dict[str, Callable[[Run], None]] = {
    "env": env, "equivalence": equivalence, "profile": profile, "decoder": decoder, "bench": bench,
    "trial": trial, "pack": pack, "summary": summary, "options": options, "overlap": overlap, "paper": paper}


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=positive_seconds, default=480.0)
    ap.add_argument("--equivalence-reserve-s", type=positive_seconds, default=60.0,
                    help="seconds of the budget the equivalence stage leaves to the stages after it (default 60; "
                         "10 when only summary follows)")
    ap.add_argument("--equivalence-cap-s", type=positive_seconds, default=EQUIVALENCE_CAP_S,
                    help="the equivalence stage starts no new configuration after this many seconds")
    ap.add_argument("--equivalence-configs", nargs="+", default=None,
                    help="only these equivalence configurations, named as in equivalence.json, e.g. "
                         "'slot_cross (stream) (compiled)'")
    ap.add_argument("--paper-variants", nargs="+", default=None,
                    help="which paper-trial variants the paper stage runs: " +
                         ", ".join(repr(v.name) for v in PAPER_VARIANTS) + " (default: all, budget allowing)")
    ap.add_argument("--options-settings", nargs="+", default=None, choices=list(OPTION_SETTINGS), metavar="SETTING",
                    help="the options stage's settings, in order: " + ", ".join(map(repr, OPTION_SETTINGS)))
    ap.add_argument("--bench-groups", nargs="+", default=None,
                    help="the bench stage's groups (default: data step flops kernels refit attack epoch on CUDA)")
    ap.add_argument("--stages", nargs="+", default=list(DEFAULT_STAGES), choices=list(STAGES), metavar="STAGE",
                    help="also: options (settings of the surrogate's own stream), overlap (how much of the "
                         "surrogate's GPU work runs beside the server's), paper (slices of the paper trial)")
    a = ap.parse_args(argv)
    from cem_bench import surrogates
    known = {c.key for c in equivalence_configs(surrogates.names())}
    wrong = [c for c in (a.equivalence_configs or []) if c not in known]
    if wrong:          # a misspelt one would be dropped without a word, and its check never run
        ap.error(f"unknown --equivalence-configs {wrong}: choose from {sorted(known)}")
    if a.bench_groups:   # checked here, before the stages spend the budget (the bench found it at its turn)
        from cem_bench.bench.harness import group_names
        bad = [g for g in a.bench_groups if g not in group_names()]
        if bad:
            ap.error(f"unknown --bench-groups {bad}: choose from {list(group_names())}")
    by_name = {v.name: v for v in PAPER_VARIANTS}
    unknown = [v for v in (a.paper_variants or []) if v not in by_name]
    if unknown:
        ap.error(f"unknown --paper-variants {unknown}: choose from {list(by_name)}")
    run = Run(out=os.environ.get("OUT") or DEFAULT_OUT, budget_s=a.budget_s, t0=t0,
              device="cuda" if torch.cuda.is_available() else "cpu",
              bench_groups=tuple(a.bench_groups) if a.bench_groups else None,
              equivalence_cap_s=a.equivalence_cap_s, equivalence_reserve_s=a.equivalence_reserve_s,
              equivalence_configs=tuple(a.equivalence_configs) if a.equivalence_configs else None,
              paper_variants=PAPER_VARIANTS if a.paper_variants is None else
              tuple(v for v in PAPER_VARIANTS if v.name in a.paper_variants),
              **({"option_settings": tuple(a.options_settings)} if a.options_settings else {}))
    # train.compile_surrogate across many configurations in one process: more than Dynamo's default of 8
    # compiled variants of one function (each configuration's shapes are one), so none falls back to eager
    import torch._dynamo as dynamo
    dynamo.config.recompile_limit = 64
    for s in a.stages:
        run_stage(run, s, STAGES[s])
    print(f"[gpu_check] done in {run.elapsed():.0f} s", flush=True)


if __name__ == "__main__":
    main()
