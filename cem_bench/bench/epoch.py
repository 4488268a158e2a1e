"""Row group ``epoch``: whole training epochs, and what one paper trial costs.

An epoch is what ``Trainer.fit`` runs per epoch: the shuffled, augmented on-device batches, every step (the
graphed one on CUDA), the gmm refit where the surrogate has one, and the evaluation of the test split. It is
timed for lambda = 0, gmm (the paper's estimator) and slot_cross (an attention surrogate; on CUDA also on its
own stream, ``train.surrogate_stream``) at the paper's model and batch, on ``sizes.epoch_images`` training
images (50,000 on CUDA, CIFAR-10's size) and ``sizes.epoch_test`` test images; a smaller split is scaled to
50,000 training and 10,000 test images (the training and the evaluation timed apart) and says so. The first
epoch is untimed (graph capture, cuDNN autotuning, the gmm's first fit); the configurations are then timed
alternately (``harness.round_robin``), as every other comparison. Targets on CUDA: lambda = 0 <= 1.0 s per
50k-image epoch.

From these and the ``attack`` group's per-image times (``harness.MEASURED``): one paper trial = 240 epochs
of gmm + a 50-epoch decoder attack on 50,000 images + rmle on 1,000 evaluation images (target on CUDA: <= 6
minutes alone).
"""

from __future__ import annotations

import statistics

import torch

from .harness import MEASURED, Sizes, error_row, make_row, round_robin, row, step_config, synthetic_splits

PAPER_EPOCHS = 240
PAPER_IMAGES = 50000
PAPER_EVAL_IMAGES = 1000       # the inference protocol scores the attacks on the last 10 % of 10,000
PAPER_TEST_IMAGES = 10000      # CIFAR-10's test split, evaluated after every epoch
TARGET_EPOCH_S = ("le", 1.0)   # lambda = 0, 50k images, on an H100/H200
TARGET_TRIAL_MIN = ("le", 6.0)
CONFIGS = {"lambda=0": {"cem.lambd": 0.0}, "gmm": {"cem.surrogate": "gmm", "cem.lambd": 16.0},
           "slot_cross": {"cem.surrogate": "slot_cross", "cem.lambd": 16.0}}
# CUDA only: slot_cross without the graphed step's defaults (one stream, the eager surrogate), beside the
# default slot_cross row (its own stream, compiled)
CUDA_CONFIGS = {"slot_cross (one stream, eager surrogate)": {"cem.surrogate": "slot_cross", "cem.lambd": 16.0,
                                                             "train.surrogate_stream": "off",
                                                             "train.compile_surrogate": "off"}}


@row("epoch", "epoch", order=45)
def bench_epoch(device: torch.device, sizes: Sizes) -> list[dict]:
    from ..core.trial import build, build_config

    splits = synthetic_splits(sizes.epoch_images, sizes.epoch_test, device)
    scale = PAPER_IMAGES / sizes.epoch_images
    eval_scale = PAPER_TEST_IMAGES / sizes.epoch_test   # the evaluation of CIFAR-10's 10,000 test images
    rows, per_epoch = [], {}
    configs = {**CONFIGS, **(CUDA_CONFIGS if device.type == "cuda" else {})}
    trainers, failed = {}, {}
    for name, extra in configs.items():   # every trainer built and warmed up first: then timed alternately
        try:
            flat = step_config(sizes, device, **{"data.train_size": sizes.epoch_images,
                                                 "data.test_size": sizes.epoch_test, "train.epochs": 10,
                                                 "cem.warmup_epochs": 0, "train.augment": "crop_flip_rotate",
                                                 **extra})
            _, tr = build(build_config(flat), device, splits)
            epochs = iter(range(1, 100))
            tr.train_epoch(next(epochs))          # untimed: capture, autotuning, first fit
            tr.evaluate()
            trainers[name] = (tr, epochs)
        except Exception as e:  # noqa: BLE001 - one configuration must not hide the others
            failed[name] = e
    # a, b, c, a, b, c, ...: a load that comes and goes falls on every configuration alike, so their ratios
    # hold on a shared machine (docs/performance.md); each epoch's training and evaluation timed apart, the
    # evaluation scaled to 10,000 test images, the training to 50,000 images
    fns = {}
    for name, (tr, epochs) in trainers.items():
        fns[f"{name} train"] = lambda tr=tr, epochs=epochs: tr.train_epoch(next(epochs))
        fns[f"{name} eval"] = lambda tr=tr: tr.evaluate()
    times = round_robin(fns, device, repeats=max(2, sizes.repeats - 1), warmup=0) if fns else {}
    for name in configs:
        if name in failed:
            rows.append(error_row(f"epoch: {name}", failed[name]))
            continue
        tr = trainers[name][0]
        per = [t * scale + v * eval_scale for t, v in zip(times[f"{name} train"], times[f"{name} eval"])]
        med = statistics.median(per)
        per_epoch[name] = med
        graph = tr.graph_step
        how = ("CUDA graph" + (f" (capture FAILED: {graph.failed})" if graph.failed else "")
               if graph is not None else "eager step")
        cuda = device.type == "cuda" and name == "lambda=0"
        rows.append(make_row(f"epoch of {PAPER_IMAGES:,} images: {name}", med, "s/epoch",
                             per_epoch.get("lambda=0") if name != "lambda=0" else None,
                             "lambda=0 epoch" if name != "lambda=0" else "",
                             med / per_epoch["lambda=0"] if name != "lambda=0" and "lambda=0" in per_epoch else
                             (med if cuda else None),
                             "x lambda=0" if name != "lambda=0" else ("s" if cuda else ""),
                             TARGET_EPOCH_S if cuda else None,
                             note=f"{sizes.epoch_images:,} training images"
                                  f"{f' scaled x{scale:.3g}' if scale != 1 else ''}, {sizes.epoch_test:,} test "
                                  f"images evaluated{f' scaled x{eval_scale:.3g}' if eval_scale != 1 else ''}; "
                                  f"timed alternately with the other configurations; width {sizes.width:g}, batch "
                                  f"{sizes.batch_size}, {how}", samples=per))
    if "gmm" in per_epoch and "decoder_epoch_s_per_image" in MEASURED and "rmle_s_per_image" not in MEASURED:
        rows.append(make_row("epoch-based estimate: one paper trial", error="the attack group measured no rmle "
                             "time (it failed or did not run): a trial without its rmle would be estimated short"))
    elif "gmm" in per_epoch and "decoder_epoch_s_per_image" in MEASURED:
        train_s = PAPER_EPOCHS * per_epoch["gmm"]
        decoder_s = 50 * PAPER_IMAGES * MEASURED["decoder_epoch_s_per_image"]
        rmle_s = PAPER_EVAL_IMAGES * MEASURED["rmle_s_per_image"]
        total_min = (train_s + decoder_s + rmle_s) / 60
        cuda = device.type == "cuda"
        rows.append(make_row("epoch-based estimate: one paper trial", total_min, "min", ratio=total_min if cuda else None,
                             ratio_name="min" if cuda else "", target=TARGET_TRIAL_MIN if cuda else None,
                             note=f"{PAPER_EPOCHS} gmm epochs {train_s:.0f} s + decoder attack 50 x 50k images "
                                  f"{decoder_s:.0f} s + rmle on {PAPER_EVAL_IMAGES:,} images {rmle_s:.0f} s; "
                                  f"alone on the device, no packing; {60 / total_min:.1f} trials per GPU-hour"))
    return rows
