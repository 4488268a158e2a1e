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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import torch

OUT = os.environ.get("OUT") or "/tmp/cem_gpu_check"
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
T0 = time.perf_counter()
BENCH_GROUPS: list[str] | None = None


def write(name: str, obj) -> None:
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj, indent=2, default=str))
    print(f"[gpu_check {time.perf_counter() - T0:6.1f} s] wrote {path}", flush=True)


def stage(name: str, fn, budget_left: float) -> None:
    if budget_left < 20:
        write(f"{name}.skipped.txt", f"skipped: {budget_left:.0f} s of the budget left")
        return
    t = time.perf_counter()
    try:
        fn(budget_left)
    except Exception:  # noqa: BLE001 - the next stage still runs
        write(f"{name}.error.txt", traceback.format_exc())
    print(f"[gpu_check] {name}: {time.perf_counter() - t:.1f} s", flush=True)


def run_cli(args: list[str], timeout: float, log: str) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
    try:
        p = subprocess.run([sys.executable, "-m", "cem_bench.cli", *args], capture_output=True, text=True,
                           timeout=timeout, env=env)
        write(log, p.stdout[-20000:] + "\n--- stderr ---\n" + p.stderr[-8000:])
        return p.returncode
    except subprocess.TimeoutExpired as e:
        write(log, f"TIMEOUT after {timeout:.0f} s\n{(e.stdout or b'')[-20000:]!r}")
        return 124


def env(_):
    info = {"torch": torch.__version__, "cuda": CUDA, "python": sys.version.split()[0],
            "cpus": os.cpu_count(), "has_register_generator_state":
            hasattr(torch.cuda, "CUDAGraph") and hasattr(torch.cuda.CUDAGraph, "register_generator_state")}
    if CUDA:
        info["device"] = torch.cuda.get_device_name(0)
        info["mps_control"] = subprocess.run(["which", "nvidia-cuda-mps-control"], capture_output=True,
                                             text=True).stdout.strip()
    write("env.json", info)


EQUIVALENCE_CAP_S = 210   # the equivalence stage starts no new configuration after this (--equivalence-cap-s)


EQUIVALENCE_ONLY: list[str] | None = None   # --equivalence-configs: only these configurations


def _equivalence_key(name: str, random: bool, stream: bool, comp: bool, determ: bool) -> str:
    return f"{name}{' (noise+dropout)' if random else ''}{' (stream)' if stream else ''}" \
           f"{' (compiled)' if comp else ''}{' (deterministic)' if determ else ''}"


def equivalence(left):
    """Graphed vs eager, as whole-run trails (``compare_with_eager``) and step by step (``compare_step_by_step``),
    for lambda = 0 and every surrogate under every combination of noise/dropout, own stream and compile, and
    (without noise) plain and both keys under deterministic algorithms. The configurations run in order of what
    they decide: the candidate default (noise, own stream, compiled) and the plain step for every surrogate
    first, so that a time cap (``EQUIVALENCE_CAP_S``) drops the least telling ones."""
    from cem_bench import surrogates
    from cem_bench.graphs import WARMUP_STEPS
    from cem_bench.bench.equivalence import compare_step_by_step, compare_with_eager
    # the surrogate's shapes as in the bench's step rows (batch 128, 8 channels at the cut): a compiled
    # surrogate (train.compile_surrogate) reuses the bench's compiled kernels from the on-disk cache
    tiny = {"model.width": 0.125, "model.bottleneck_channels": 8, "data.train_size": 512, "data.test_size": 100,
            "train.batch_size": 128, "train.amp": "off", "attack.names": ["decoder"]}
    # (noise+dropout, own stream, compiled, deterministic), most telling first
    variants = [(True, True, True, False), (False, False, False, False), (False, True, True, False),
                (True, False, False, False), (False, True, False, False), (False, False, True, False),
                (True, True, False, False), (True, False, True, False), (False, False, False, True),
                (False, True, True, True)]
    todo = [(v, name) for v in variants for name in surrogates.names()]
    todo[:0] = [((False, False, False, False), "lambda=0"), ((True, False, False, False), "lambda=0")]
    if EQUIVALENCE_ONLY:
        todo = [(v, name) for v, name in todo if _equivalence_key(name, *v) in EQUIVALENCE_ONLY]
    cap = min(EQUIVALENCE_CAP_S, left - 60)
    t0 = time.perf_counter()
    out = {}
    for (random, stream, comp, determ), name in todo:
        key = _equivalence_key(name, random, stream, comp, determ)
        if not CUDA:
            out[key] = "no CUDA: the graphed trainer needs a GPU"
            break
        if time.perf_counter() - t0 > cap:
            out[key] = f"skipped: the stage's {cap:.0f} s were used"
            continue
        flat = {**tiny, **({"cem.lambd": 0} if name == "lambda=0" else {"cem.surrogate": name, "cem.lambd": 4.0})}
        t = time.perf_counter()
        try:
            # own stream: graphed two-stream vs one-stream eager steps; compiled: against compiled eager steps
            args = dict(flat={**flat, "train.surrogate_stream": stream, "train.compile_surrogate": comp},
                        steps=WARMUP_STEPS + 5, device=DEV, random=random,
                        eager_flat={"train.surrogate_stream": False}, deterministic=determ)
            # the trails of whole runs (where a difference grows), and each step from a common state
            # (whether any one step differs by more than rounding: compare_step_by_step)
            out[key] = {**compare_with_eager(**args), "step_by_step": compare_step_by_step(**args),
                        "seconds": time.perf_counter() - t}
        except Exception as e:  # noqa: BLE001
            out[key] = f"{type(e).__name__}: {e}"
        write("equivalence.json", out)   # after each: a killed run keeps what it measured
    write("equivalence.json", out)


def decoder(_):
    """The decoder attack graphed vs eager on one encoder: per-epoch training MSE, metrics and seconds."""
    from cem_bench import attacks, models
    from cem_bench.trial import build, build_config
    out = {}
    for mode in ("on", "off"):
        cfg = build_config({"data.dataset": "synthetic", "data.train_size": 256, "data.test_size": 2560,
                            "model.width": 1.0, "attack.names": ["decoder"], "attack.epochs": 4,
                            "attack.blocks": 8, "attack.channels": 64, "train.device": DEV,
                            "train.cuda_graph": mode if CUDA else "off", "defense.noise_std": 0.05})
        splits, tr = build(cfg, torch.device(DEV))
        t = time.perf_counter()
        res = attacks.build(cfg, "decoder").run(tr.client, splits, 0.05, DEV)
        out[mode] = {"seconds": time.perf_counter() - t, "metrics": res.metrics, "history": res.history,
                     "client_params": models.count_params(tr.client)}
    write("decoder.json", out)


def _one_batch():
    """``(device, sizes, splits, x, y)`` of the profiled stages: the bench's quick sizes (tiny on the CPU), a
    512-image synthetic split and its first training batch, normalised."""
    from cem_bench.bench import harness
    dev = torch.device(DEV)
    sizes = harness.sizes_for(dev, quick=True, tiny=not CUDA)
    splits = harness.synthetic_splits(512, 20, dev)
    return dev, sizes, splits, splits.normalize(splits.train.images[:sizes.batch_size]), \
        splits.train.labels[:sizes.batch_size]


def _profiled_steps(tr, lr: float, x, y, warm: int, steps: int):
    """``warm`` untimed steps of trainer ``tr`` (compile, graph warm-up and capture), then ``steps`` under
    ``torch.profiler`` (CPU, and CUDA where there is one); returns the profile."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cem_on, acc = tr.surrogate is not None, tr.epoch_acc()
    for _ in range(warm):
        tr.step(x, y, cem_on, lr, acc)
    if CUDA:
        torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])) as prof:
        for _ in range(steps):
            tr.step(x, y, cem_on, lr, acc)
        if CUDA:
            torch.cuda.synchronize()
    return prof


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(u: list[tuple[float, float]], v: list[tuple[float, float]]) -> float:
    """Length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(u) and j < len(v):
        lo, hi = max(u[i][0], v[j][0]), min(u[i][1], v[j][1])
        total += max(0.0, hi - lo)
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return total


def surrogate_kernel(name: str) -> bool:
    """A kernel of the compiled surrogate: Inductor's Triton kernels, or an fp32 matrix product (the surrogate
    runs in fp32; the client and server run bf16 convolutions and batch norm)."""
    n = name.lower()
    return n.startswith("triton_") or "sgemm" in n or "f32f32" in n or "gemv" in n


def overlap(_):
    """How much of the surrogate's GPU work runs beside the server's, graphed, compiled, on its own stream (and
    with the side stream at the highest priority): per configuration, 5 replays under the profiler with CUDA
    activity, the kernels split into the surrogate's (``surrogate_kernel``) and the rest, and per step: the
    time either side has a kernel running, the time both do, and the step's span. If the two overlap only for
    about the server's forward, the backward branches run one after the other."""
    from cem_bench.bench import harness
    from cem_bench.trainer import lr_at

    dev, sizes, splits, x, y = _one_batch()
    out = {}
    configs = [("lambda=0", None)] + [(n, p) for n in ("slot_cross", "serial_enhanced", "attention_centroid")
                                      for p in (None, -100)]
    for name, priority in configs:
        if BUDGET - (time.perf_counter() - T0) < 30:
            break
        key = name + (" (high priority)" if priority is not None else "")
        try:
            flat = harness.step_config(sizes, dev, **{"data.train_size": 512, "data.test_size": 20},
                                       **harness.named_config(name),
                                       **({} if name == "lambda=0" else
                                          {"train.surrogate_stream": True, "train.compile_surrogate": True}))
            cfg, tr = harness.step_trainer(flat, dev, splits)
            if priority is not None:
                tr.set_surrogate_stream_priority(priority)
            steps = 5
            prof = _profiled_steps(tr, lr_at(cfg, 1), x, y, warm=10, steps=steps)
            trace = os.path.join("/tmp", f"cem_overlap_{os.getpid()}.json")
            prof.export_chrome_trace(trace)
            with open(trace) as f:
                events = json.load(f).get("traceEvents", [])
            os.remove(trace)
            kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
            sur = _union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if surrogate_kernel(e.get("name", ""))])
            rest = _union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if not surrogate_kernel(e.get("name", ""))])
            span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)) if kernels else 0.0
            out[key] = {"us_per_step": {"span": span / steps, "surrogate_busy": _length(sur) / steps,
                                        "rest_busy": _length(rest) / steps,
                                        "both_busy": _intersection(sur, rest) / steps},
                        "kernels_per_step": {"surrogate": sum(surrogate_kernel(e.get("name", "")) for e in kernels)
                                             / steps, "all": len(kernels) / steps},
                        "streams": sorted({str(e.get("args", {}).get("stream")) for e in kernels}),
                        "graph": tr.graph_step.stats() if tr.graph_step is not None else None}
        except Exception as e:  # noqa: BLE001 - the next configuration still runs
            out[key] = f"{type(e).__name__}: {e}"
        write("overlap.json", out)
    write("overlap.json", out)


def profile(_):
    """Where a surrogate's step spends GPU time: one eager step per configuration under ``torch.profiler``
    (after 3 warm-up steps), kernels per step, the sum of their durations (busy time; a graphed step's time
    minus this is latency between kernels), and the operators with the most GPU time."""
    from cem_bench.bench import harness, kernels
    from cem_bench.trainer import lr_at

    dev, sizes, splits, x, y = _one_batch()
    out = {}
    for name in ("lambda=0", "slot_cross", "serial_enhanced", "attention_centroid", "gmm", "slot_cross (compiled)",
                 "serial_enhanced (compiled)", "attention_centroid (compiled)"):
        base_name = name.removesuffix(" (compiled)")
        flat = harness.step_config(sizes, dev, **{"data.train_size": 512, "data.test_size": 20,
                                                  "train.cuda_graph": "off",
                                                  "train.compile_surrogate": name != base_name},
                                   **harness.named_config(base_name))
        cfg, tr = harness.step_trainer(flat, dev, splits)
        cem_on, lr = tr.surrogate is not None, lr_at(cfg, 1)
        steps = 5
        prof = _profiled_steps(tr, lr, x, y, warm=3, steps=steps)
        events = prof.key_averages()
        on_gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy_us = sum(e.device_time_total for e in on_gpu)     # a kernel event: its own duration
        out[name] = {
            "kernels_per_step": len(on_gpu) / steps,
            # the counter's dispatch mode runs a compiled surrogate eagerly: the count is the uncompiled one
            "ops_counted_per_step": sum(kernels.count_step(tr, x, y, cem_on, lr).values()),
            "kernel_busy_us_per_step": busy_us / steps,
            "top": events.table(sort_by="cuda_time_total" if CUDA else "cpu_time_total", row_limit=25),
        }
        # one file for every configuration's table (a GPU machine returns few files)
        write("profile_top.txt", "\n\n".join(f"== {k}\n{v['top']}" for k, v in out.items()))
    write("profile.json", {k: {kk: vv for kk, vv in v.items() if kk != "top"} for k, v in out.items()})


def options(left):
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

    from cem_bench import data
    from cem_bench.bench import harness
    from cem_bench.trainer import lr_at

    dev = torch.device(DEV)
    sizes = harness.sizes_for(dev, quick=True, tiny=not CUDA)
    splits = harness.synthetic_splits(sizes.step_images, 20, dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    batches = []
    for xy in data.BatchIterator(splits.train, splits, sizes.batch_size, "crop_flip_rotate", gen):
        batches.append(xy)
        if len(batches) == 4:
            break
    keys = {"data.train_size": sizes.step_images, "data.test_size": 20}
    # max_autotune is left out: on the H100 its autotuning of the surrogates' many small matrix products took
    # more than 4 minutes for the first surrogate (docs/performance.md)
    # combo_kernels too, measured on the H100: within the noise of the default (1.38 / 1.46 / 1.70 vs 1.36 /
    # 1.51 / 1.69). TF32: the surrogates' matrix products are fp32 (their statistics are), cuBLAS's slowest kind
    settings = {"default": {}, "high_priority_stream": {"priority": -100},
                "high_priority_stream, not compiled": {"priority": -100, "compiled": False},
                "tf32 matmuls": {"tf32": True}, "tf32 matmuls, high_priority_stream": {"tf32": True, "priority": -100}}
    names = ["lambda=0", "slot_cross", "attention_centroid", "serial_enhanced"]
    steps = 10 if CUDA else 1
    out: dict = {}
    tf32_default = torch.backends.cuda.matmul.allow_tf32
    for setting, opt in settings.items():
        if BUDGET - (time.perf_counter() - T0) < 60:
            out[setting] = "skipped: budget"
            break
        priority, compiled = opt.get("priority"), opt.get("compiled", True)
        torch._dynamo.reset()
        torch.backends.cuda.matmul.allow_tf32 = opt.get("tf32", tf32_default)
        res: dict = {}
        try:
            with inductor_config.patch(opt.get("flags", {})):
                runs = {}
                for name in names:
                    flat = harness.step_config(sizes, dev, **keys, **harness.named_config(name),
                                               **({} if name == "lambda=0" else
                                                  {"train.surrogate_stream": True,
                                                   "train.compile_surrogate": compiled}))
                    cfg, tr = harness.step_trainer(flat, dev, splits)
                    if priority is not None:   # before the first step (and capture)
                        tr.set_surrogate_stream_priority(priority)
                    runs[name] = (tr, lr_at(cfg, 1), tr.epoch_acc(), [])
                    t = time.perf_counter()
                    for i in range(8):   # compile, graph warm-up and capture
                        tr.step(*batches[i % 4], tr.surrogate is not None, runs[name][1], runs[name][2])
                    if CUDA:
                        torch.cuda.synchronize()
                    res[f"{name} first steps s"] = time.perf_counter() - t

                def one(run):
                    def fn():
                        for i in range(steps):
                            run[0].step(*batches[i % 4], run[0].surrogate is not None, run[1], run[2])
                    return fn
                for r in range(8):
                    for run in runs.values():
                        t = harness.timed(one(run), dev) / steps
                        if r >= 2:
                            run[3].append(t)
                base = statistics.median(runs["lambda=0"][3])
                for name, run in runs.items():
                    med = statistics.median(run[3])
                    res[name] = {"ms": med * 1e3, "ratio": med / base,
                                 "graph": run[0].graph_step.stats() if run[0].graph_step is not None else None}
        except Exception as e:  # noqa: BLE001 - the next setting still runs
            res["error"] = f"{type(e).__name__}: {e}"
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32_default
        out[setting] = res
        write("options.json", out)
    write("options.json", out)


def bench(left):
    groups = BENCH_GROUPS or (["data", "step", "flops", "kernels", "refit", "attack", "epoch"] if CUDA
                              else ["step", "kernels"])
    run_cli(["bench", "--device", DEV, "--quick", "--json", os.path.join(OUT, "bench.json"), "--only", *groups],
            timeout=min(left - 10, 380), log="bench.txt")


def trial(left):
    n = 50000 if CUDA else 512
    base = ["--set", "data.dataset=synthetic", "--set", f"data.train_size={n}", "--set",
            f"data.test_size={10000 if CUDA else 200}", "--set", "model.width=" + ("1" if CUDA else "0.125"),
            "--set", "cem.surrogate=gmm", "--set", "cem.lambd=16", "--set", "cem.warmup_epochs=1",
            "--set", "train.epochs=4", "--set", f"train.device={DEV}"]
    # graphed, with both attacks (2 decoder epochs): the whole trial path, a recapture when CEM switches on
    run_cli(["train", *base, "--set", "attack.epochs=2", "--set", "attack.min_accuracy_margin=-1",
             "--out", os.path.join(OUT, "trial_graphed")],
            timeout=min(left - 10, 240), log="trial_graphed.txt")
    left = BUDGET - (time.perf_counter() - T0)
    if left > 60:   # the same epochs eager, attacks skipped by the utility gate (margin 1: always)
        run_cli(["train", *base, "--set", "train.cuda_graph=off", "--set", "attack.min_accuracy_margin=1",
                 "--out", os.path.join(OUT, "trial_eager")], timeout=min(left - 10, 200), log="trial_eager.txt")
    for d in ("trial_graphed", "trial_eager"):
        for junk in ("checkpoint.pt",):
            p = os.path.join(OUT, d, junk)
            if os.path.exists(p):
                os.remove(p)


PAPER_EPOCHS = 240
# (name, extra keys, epochs): the grid's precision first (train.amp off, PyTorch's TF32 defaults), then bf16,
# then strict fp32 (no TF32 anywhere), each a whole slice of the paper trial: every epoch of a shorter run, its
# refits and evaluation, and both attacks at full size (50 decoder epochs on the 50k training images, rmle)
PAPER_VARIANTS = [("fp32 (tf32 auto)", {"train.amp": "off", "train.tf32": "auto"}, 20),
                  ("bf16", {"train.amp": "on"}, 20),
                  ("strict fp32 (tf32 off)", {"train.amp": "off", "train.tf32": "off"}, 20),
                  ("tf32 on", {"train.amp": "off", "train.tf32": "on"}, 20)]


def paper_keys() -> dict:
    """The fixed keys of search_spaces/cifar10_paper.yaml on synthetic data of CIFAR-10's size (tiny on the
    CPU), gmm lambda = 16, sigma 0.05: the paper trial of issue 27."""
    import yaml
    with open(os.path.join("search_spaces", "cifar10_paper.yaml")) as f:
        keys = dict(yaml.safe_load(f)["fixed"])
    keys.update({"data.dataset": "synthetic", "data.train_size": 50000 if CUDA else 256,
                 "data.test_size": 10000 if CUDA else 64, "cem.surrogate": "gmm", "cem.lambd": 16,
                 "defense.noise_std": 0.05, "train.device": DEV, "attack.min_accuracy_margin": -1})
    if not CUDA:
        keys.update({"model.width": 0.125, "attack.epochs": 1, "attack.blocks": 1, "attack.channels": 8,
                     "attack.rmle_iterations": 3})
    return keys


def paper_slice(name: str, extra: dict, epochs: int, timeout: float) -> dict:
    """One slice of the paper trial run by ``cem-bench train``: its per-epoch seconds, train and attack seconds,
    wall time, metrics, and the whole 240-epoch trial extrapolated as the slice's wall time plus the missing
    epochs at the median of its epochs after the first two (capture, cuDNN's autotuning and CEM's start)."""
    import re
    import statistics
    keys = {**paper_keys(), **extra, "train.epochs": epochs if CUDA else 3}
    out_dir = os.path.join(OUT, "paper_" + re.sub(r"[^a-z0-9]+", "_", name).strip("_"))
    args = ["train", "--out", out_dir]
    for k, v in keys.items():
        args += ["--set", f"{k}={json.dumps(v) if isinstance(v, (list, bool)) else v}"]
    t = time.perf_counter()
    rc = run_cli(args, timeout=timeout, log=os.path.basename(out_dir) + ".txt")
    wall = time.perf_counter() - t
    with open(os.path.join(OUT, os.path.basename(out_dir) + ".txt")) as f:
        epoch_s = [float(m) for m in re.findall(r"epoch_s=([0-9.]+)", f.read())]
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


def _paper(variants, left):
    out = _load("paper.json") or {}
    for name, extra, epochs in variants:
        left_now = BUDGET - (time.perf_counter() - T0)
        if left_now < 60:
            out[name] = f"skipped: {left_now:.0f} s of the budget left"
            continue
        out[name] = paper_slice(name, extra, epochs, timeout=left_now - 20)
        write("paper.json", out)
    write("paper.json", out)


PAPER_RUN: list[str] | None = None   # --paper-variants: which of PAPER_VARIANTS the paper stage runs


def paper(left):
    """The paper trial in the grid's precision and in bf16, then (budget allowing, or as --paper-variants
    names) strict fp32 and TF32 everywhere: what TF32 changes, same seeds (issue 27 item 1)."""
    _paper([v for v in PAPER_VARIANTS if PAPER_RUN is None or v[0] in PAPER_RUN], left)


def pack(left):
    if not CUDA:
        write("pack.txt", "no CUDA: the pack row is CUDA only")
        return
    run_cli(["bench", "--device", "cuda", "--quick", "--json", os.path.join(OUT, "bench_pack.json"),
             "--only", "pack"], timeout=max(30, left - 10), log="bench_pack.txt")


def _load(name: str):
    path = os.path.join(OUT, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


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


def summary(_):
    """``summary.md`` from what the other stages wrote: every bench row that has a target (met or not), the
    surrogates' one-stream and two-stream graphed steps side by side with their kernel counts and the time per
    extra kernel (the count model of docs/performance.md), and the equivalence checks against their floor."""
    lines = [f"# gpu_check summary ({'CUDA' if CUDA else 'CPU dry run'}, torch {torch.__version__})", ""]
    rows = []
    for name in ("bench.json", "bench_pack.json"):
        rows += (_load(name) or {}).get("rows", [])
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
    lines += _table("Graphed vs eager", _load("equivalence.json"),
                    ["max diff", "eager floor", "within", "diff after each step", "floor after each step",
                     "each step agrees", "encoder diff ÷ update", "encoder grads", "surrogate grads (worst tensor)",
                     "surrogate entries moved differently"],
                    lambda r: [f"{r['max_abs_diff']:.3g}", f"{r['eager_floor']:.3g}", within_eager_floor(r),
                               steps(r.get("diff_by_step", [])), steps(r.get("floor_by_step", []))] + step_cells(r))
    equiv = _load("equivalence.json") or {}
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
    opts = _load("options.json") or {}
    if opts:
        lines += ["", "## The surrogate on its own stream: settings (graphed; `options` stage) ÷ λ=0", ""]
        for setting, res in opts.items():
            if not isinstance(res, dict) or "error" in res:
                lines.append(f"- {setting}: {res if not isinstance(res, dict) else res['error']}")
                continue
            lines.append(f"- {setting}: " + ", ".join(f"{k} {v['ratio']:.2f}× ({v['ms']:.2f} ms)"
                                                      for k, v in res.items() if isinstance(v, dict)))
    lines += _table("Overlap: the surrogate's kernels beside the rest (graphed, own stream, compiled; µs per step)",
                    _load("overlap.json"),
                    ["step span", "surrogate busy", "rest busy", "both busy", "surrogate kernels / all"],
                    lambda r: [f"{r['us_per_step'][k]:.0f}" for k in ("span", "surrogate_busy", "rest_busy",
                                                                       "both_busy")]
                    + [f"{r['kernels_per_step']['surrogate']:.0f} / {r['kernels_per_step']['all']:.0f}"])
    lines += _table(f"The paper trial, whole slices (gmm λ = 16, σ 0.05, 50k/10k synthetic; extrapolated to "
                    f"{PAPER_EPOCHS} epochs)", _load("paper.json"),
                    ["epochs", "steady epoch s", "train s", "decoder s", "rmle s", "wall s",
                     f"whole trial min ({PAPER_EPOCHS} epochs)", "test acc", "SSIM decoder / rmle", "rc"],
                    lambda r: [r["epochs"], _g(r.get("steady_epoch_s")), _g(r.get("train_s")),
                               _g(r.get("attack_s__decoder")), _g(r.get("attack_s__rmle")), _g(r.get("wall_s")),
                               _g(r["whole_trial_s_extrapolated"] / 60) if r.get("whole_trial_s_extrapolated")
                               else "", _g(r.get("test_acc")),
                               f"{_g(r.get('attack_ssim__decoder'))} / {_g(r.get('attack_ssim__rmle'))}", r["rc"]])
    lines += _table("Profile (one eager step)", _load("profile.json"), ["CUDA kernels", "busy µs", "ops counted"],
                    lambda r: [r["kernels_per_step"], f"{r['kernel_busy_us_per_step']:.0f}",
                               r["ops_counted_per_step"]])
    write("summary.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--equivalence-cap-s", type=float, default=EQUIVALENCE_CAP_S,
                    help="the equivalence stage starts no new configuration after this many seconds")
    ap.add_argument("--equivalence-configs", nargs="+", default=None,
                    help="only these equivalence configurations, named as in equivalence.json, e.g. "
                         "'slot_cross (stream) (compiled)'")
    ap.add_argument("--paper-variants", nargs="+", default=None,
                    help="which paper-trial variants the paper stage runs: " +
                         ", ".join(repr(v[0]) for v in PAPER_VARIANTS) + " (default: all, budget allowing)")
    ap.add_argument("--bench-groups", nargs="+", default=None,
                    help="the bench stage's groups (default: data step flops kernels refit attack epoch on CUDA)")
    ap.add_argument("--stages", nargs="+", default=["env", "equivalence", "profile", "decoder", "bench", "trial",
                                                    "pack", "summary"],
                    help="also: options (settings of the surrogate's own stream), overlap (how much of the "
                         "surrogate's GPU work runs beside the server's)")
    a = ap.parse_args()
    BUDGET = a.budget_s
    BENCH_GROUPS = a.bench_groups
    EQUIVALENCE_CAP_S = a.equivalence_cap_s
    EQUIVALENCE_ONLY = a.equivalence_configs
    PAPER_RUN = a.paper_variants
    unknown = [v for v in (PAPER_RUN or []) if v not in {p[0] for p in PAPER_VARIANTS}]
    if unknown:
        ap.error(f"unknown --paper-variants {unknown}: choose from {[p[0] for p in PAPER_VARIANTS]}")
    # train.compile_surrogate across many configurations in one process: more than Dynamo's default of 8
    # compiled variants of one function (each configuration's shapes are one), so none falls back to eager
    import torch._dynamo
    torch._dynamo.config.recompile_limit = 64
    for s in a.stages:
        # the summary reads what the others wrote and takes no time: it runs whatever budget is left
        stage(s, globals()[s], BUDGET - (time.perf_counter() - T0) if s != "summary" else BUDGET)
    print(f"[gpu_check] done in {time.perf_counter() - T0:.0f} s", flush=True)
