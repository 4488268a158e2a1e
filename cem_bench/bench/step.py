"""Row group ``step`` (and ``flops`` on CUDA): the training step.

Seconds per ``Trainer.step`` at the paper's setting (VGG11-bn width 1, batch 128, 8-channel bottleneck)
with lambda = 0, then with each registered surrogate at its defaults (``gmm`` refitted first, untimed),
against the lambda = 0 step of the same run. The configurations are timed round-robin, so that load from
other processes falls on all of them alike; targets: attention surrogates <= 1.5x, ``gmm`` <= 1.15x. On CUDA
the step is the graphed one (``train.cuda_graph`` auto; its warm-up and capture fall in the untimed repeats),
and every configuration is timed a second time eagerly (``train step (eager): ...``, with the graph's
speed-up); the lambda = 0 row has the absolute target <= 2.0 ms (an H100/H200 at batch 128). Each surrogate
is also timed graphed with ``train.surrogate_stream`` (``(stream)``), ``train.compile_surrogate``
(``(compiled)``; compiled in the untimed warm-up) and both (``(stream, compiled)``), against the same lambda = 0
step and the surrogate's plain graphed step (``VARIANTS``).

FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` counts one forward and backward of client and server
(cross-entropy on the server's logits) on one training batch, as the lambda = 0 step runs them (its
autocast and memory format). It counts what the counter knows: convolutions, their backward products and
matrix multiplications; batch norm, activations, pooling, the noise and the optimizer update are not
counted. On CUDA the row ``achieved TFLOP/s`` divides that count by the lambda = 0 step's median time.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from .harness import (
    Sizes,
    error_row,
    make_row,
    named_config,
    row,
    step_config,
    step_trainer,
    synthetic_splits,
    timed,
)

TARGET_STEP = ("le", 1.5)           # attention surrogates: <= 1.5x the lambda = 0 step, graphed
TARGET_STEP_GMM = ("le", 1.15)
TARGET_STEP_MS = ("le", 2.0)        # lambda = 0 step at batch 128 on an H100/H200, graphed (ms)
EAGER = "(eager)"
STREAM = "(stream)"      # graphed, with train.surrogate_stream: the surrogate beside the server (CUDA only)
COMPILED = "(compiled)"  # graphed, with train.compile_surrogate: the surrogate's kernels fused (CUDA only)
STREAM_COMPILED = "(stream, compiled)"
# the CUDA variants of a configuration: the suffix of its row name and the keys it sets; each surrogate variant
# is compared with the lambda = 0 step (its target) and with the plain graphed step of the same surrogate
VARIANTS = {EAGER: {"train.cuda_graph": "off"}, STREAM: {"train.surrogate_stream": "on"},
            COMPILED: {"train.compile_surrogate": "on"},
            STREAM_COMPILED: {"train.surrogate_stream": "on", "train.compile_surrogate": "on"}}
# the plain graphed row: one stream, the eager surrogate (on CUDA the defaults are the (stream, compiled) row)
PLAIN = {"train.surrogate_stream": "off", "train.compile_surrogate": "off"}
VARIANT_NOTES = {STREAM: "train.surrogate_stream (its own CUDA stream)",
                 COMPILED: "train.compile_surrogate (torch.compile; compiled in the untimed warm-up)",
                 STREAM_COMPILED: "train.surrogate_stream and train.compile_surrogate"}


def split_variant(name: str) -> tuple[str, str | None]:
    """``"slot_cross (stream)"`` -> ``("slot_cross", "(stream)")``; a plain name -> ``(name, None)``."""
    for suffix in VARIANTS:
        if name.endswith(f" {suffix}"):
            return name.removesuffix(f" {suffix}"), suffix
    return name, None


def count_step_flops(trainer, x: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """(forward, forward + backward) FLOPs of the trainer's client and server on the batch ``(x, y)``, as its
    step runs them (``models.count_train_flops``, the count every CUDA epoch record's ``tflops`` uses)."""
    from ..core.models import count_train_flops
    return count_train_flops(trainer.client, trainer.server, x, y, trainer.amp)


@row("step", "train step", order=20, options={"flops": "cuda"})
def bench_steps(device: torch.device, sizes: Sizes, flops: bool = False) -> list[dict]:
    """``Trainer.step`` with lambda = 0 and each surrogate, round-robin, seconds per step."""
    from .. import surrogates
    from ..core import data
    from ..core.schedule import lr_at

    flops = flops and device.type == "cuda"
    base_flat = step_config(sizes, device, **{"data.train_size": sizes.step_images, "data.test_size": 20}, **PLAIN)
    splits = synthetic_splits(sizes.step_images, 20, device)
    plain = ["lambda=0"] + surrogates.names()
    # on CUDA every configuration twice, the graphed step (train.cuda_graph auto) and the eager one, and each
    # surrogate graphed again on its own stream, compiled, and both (VARIANTS)
    names = plain + ([f"{n} {EAGER}" for n in plain] + [f"{n} {v}" for v in (STREAM, COMPILED, STREAM_COMPILED)
                                                        for n in plain[1:]]
                     if device.type == "cuda" else [])
    runs: dict[str, dict] = {}
    rows: list[dict] = []
    for name in names:
        try:
            base_name, variant = split_variant(name)
            flat = dict(base_flat, **named_config(base_name), **VARIANTS.get(variant, {}))
            cfg, tr = step_trainer(flat, device, splits)
            runs[name] = {"trainer": tr, "cfg": cfg, "lr": lr_at(cfg, 1), "acc": tr.epoch_acc(),
                          "times": [], "cem_on": tr.surrogate is not None}
        except Exception as e:  # noqa: BLE001 - one broken surrogate must not hide the others
            rows.append(error_row(f"train step: {name}", e))
    if "lambda=0" not in runs:
        return rows

    # a few fixed augmented batches, shared by every configuration
    gen = torch.Generator(device=device).manual_seed(0)
    batches = []
    for x, y in data.BatchIterator(splits.train, splits, sizes.batch_size, "crop_flip_rotate", gen):
        batches.append((x, y))
        if len(batches) == 4:
            break
    steps_per_repeat = 10 if device.type == "cuda" else 1  # on CUDA several steps between two syncs
    counter = [0]

    def one(run: dict) -> Callable[[], None]:
        def fn() -> None:
            for _ in range(steps_per_repeat):
                x, y = batches[counter[0] % len(batches)]
                counter[0] += 1
                run["trainer"].step(x, y, run["cem_on"], run["lr"], run["acc"])
        return fn

    for r in range(sizes.warmup + sizes.step_repeats):
        for name, run in list(runs.items()):
            try:
                t = timed(one(run), device) / steps_per_repeat
            except Exception as e:  # noqa: BLE001
                rows.append(error_row(f"train step: {name}", e))
                del runs[name]
                continue
            if r >= sizes.warmup:
                run["times"].append(t)
    if "lambda=0" not in runs:
        return rows
    base = statistics.median(runs["lambda=0"]["times"])
    eager_base = statistics.median(runs[f"lambda=0 {EAGER}"]["times"]) if f"lambda=0 {EAGER}" in runs else None
    tr0 = runs["lambda=0"]["trainer"]
    fwd_flops, train_flops = count_step_flops(tr0, *batches[0])  # after the timing: not part of it
    counted = (f"forward + backward of client and server on one batch, counted by FlopCounterMode "
               f"(convolutions and matmuls; {fwd_flops / 1e9:.1f} GFLOP of it forward)")
    setting = f"width {sizes.width:g}, batch {sizes.batch_size}, C=8"
    for name in names:
        if name not in runs:
            continue
        run = runs[name]
        base_name, variant = split_variant(name)
        med = statistics.median(run["times"])
        bad = int(float(run["acc"]["ce_nonfinite"]))
        cfg = run["cfg"]
        graph = run["trainer"].graph_step
        if graph is not None:
            setting_g = f"{setting}; CUDA graph ({graph.captures} capture(s), {graph.replays} replays" + \
                (f"; capture FAILED: {graph.failed}" if graph.failed else "") + ")"
        else:
            setting_g = setting + ("; eager" if device.type == "cuda" else "")
        if variant == EAGER:
            ref = eager_base if base_name != "lambda=0" else None
            graphed = runs.get(base_name)
            speed = (f"; graphed step {med / statistics.median(graphed['times']):.2f}x faster"
                     if graphed is not None else "")
            rows.append(make_row(f"train step (eager): {base_name}", med, "s/step", ref,
                                 "eager lambda=0 step" if ref else None, med / ref if ref else None,
                                 "x lambda=0" if ref else "", note=setting_g + speed, samples=run["times"]))
        elif variant is not None:
            plain_run = runs.get(base_name)
            vs = (f"; the plain graphed step takes {statistics.median(plain_run['times']) / med:.2f}x as long"
                  if plain_run is not None else "")
            rows.append(make_row(f"train step {variant}: {base_name}", med, "s/step", base, "lambda=0 step",
                                 med / base, "x lambda=0", TARGET_STEP_GMM if base_name == "gmm" else TARGET_STEP,
                                 note=f"{setting_g}; {VARIANT_NOTES[variant]}{vs}", samples=run["times"]))
        elif name == "lambda=0":
            note = (f"{setting_g}; no surrogate; {train_flops / 1e9:.0f} GFLOP/step counted ({counted}) "
                    f"-> {train_flops / med / 1e9:.1f} GFLOP/s achieved")
            cuda = device.type == "cuda"     # on CUDA: the absolute target, in ms
            rows.append(make_row("train step: lambda=0", med, "s/step", ratio=med * 1e3 if cuda else None,
                                 ratio_name="ms" if cuda else "", target=TARGET_STEP_MS if cuda else None,
                                 note=note, samples=run["times"]))
        else:
            note = f"{setting_g}; lambda={cfg.cem.lambd:g}, grad_mode={cfg.cem.grad_mode}" + \
                (", refit before timing" if run["trainer"].surrogate.needs_refit else "")
            if bad:
                note += f"; {bad} non-finite CE step(s)"
            rows.append(make_row(f"train step: {name}", med, "s/step", base, "lambda=0 step", med / base,
                                 "x lambda=0", TARGET_STEP_GMM if name == "gmm" else TARGET_STEP, note=note,
                                 samples=run["times"]))
    if flops:
        tflops = train_flops / base / 1e12
        rows.append(make_row("achieved TFLOP/s (lambda=0 step)", tflops, "TFLOP/s",
                             note=f"{train_flops / 1e9:.1f} GFLOP/step ({counted}) / {base * 1e3:.2f} ms; "
                                  f"bf16 autocast={tr0.amp is not None}, channels_last"))
    return rows
