"""``cem-bench bench``: the performance harness behind every speed claim (DESIGN.md, Performance habits).

A header (device, CPU count, torch version, date, git commit, load average) and one table. Every figure is
the median of several timed repeats (``time.perf_counter``; ``torch.cuda.synchronize`` around each repeat
on CUDA) after warm-up, and every comparison is a ratio of two figures measured in the same run:

1. ``data``: images/s of cem-bench's on-device batches with augmentation (``data.BatchIterator``) against a
   torchvision ``DataLoader`` applying the same augmentation as PIL transforms (RandomCrop(32, padding=4),
   RandomHorizontalFlip, RandomRotation(15), ToTensor, Normalize), ``num_workers`` = the reference's 8
   capped at this machine's CPU count, persistent workers (their start-up is not timed).
2. ``step``: ``Trainer.step`` at the paper's setting (width 1, batch 128, 8-channel bottleneck) with
   lambda = 0, then with each registered surrogate at its defaults (``gmm`` refitted first, untimed);
   seconds per step and the ratio to lambda = 0. The configurations are timed round-robin, so that load
   from other processes falls on all of them alike.
3. ``refit``: the ``gmm`` refit (cold: k-means++ and Lloyd, then the cluster statistics) on the clean
   training-split features against scikit-learn's ``KMeans`` per class (same K, same features, same
   iteration cap, ``tol=0`` = the same "no assignment changed" stop, one init).
4. ``attack``: one decoder-attack epoch on cached encoder features, against the same epoch plus the
   encoder pass the reference repeated every attack epoch.
5. ``ray``: a trial run by ``run_trial`` directly against the same trial through the search's trainable
   under Ray Tune (``search.run_search``); Ray's start-up is its own row.
6. ``flops`` (CUDA): achieved TFLOP/s of the lambda = 0 step against the model's counted FLOPs
   (3 x forward FLOPs per image: forward plus the two backward products).

``run_bench(device, quick, only=..., tiny=...)`` returns ``{"header": {...}, "rows": [...]}``;
``format_table`` prints it; a row that fails is an error row, the rest of the table is still measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import torch

GROUPS = ("data", "step", "refit", "attack", "ray", "flops")
REFERENCE_NUM_WORKERS = 8  # cem_reference.md §4: the reference's CIFAR loaders use num_workers=8

# Targets (the issue's): (comparison, bound). "ge": ratio >= bound; "le": ratio <= bound.
TARGET_DATA = ("ge", 5.0)
TARGET_STEP = ("le", 1.3)
TARGET_STEP_GMM = ("le", 1.15)
TARGET_REFIT = ("ge", 3.0)
TARGET_RAY = ("le", 1.15)  # trial wall under Tune / direct wall, i.e. overhead <= 15 %
ENV_KEYS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
BUSY_LOAD = 0.75  # 1-min load average per CPU above which the header warns


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


TINY_TRIAL = {"data.train_size": 256, "data.test_size": 100, "model.width": 0.125, "train.epochs": 2,
              "train.batch_size": 64, "attack.epochs": 1, "attack.blocks": 1, "attack.channels": 8,
              "attack.batch_size": 64}
# A demo-size trial: search_spaces/demo.yaml's fixed keys (read at run time, so the bench follows the demo)
# with its lambda/surrogate draw pinned to the paper's estimator. The copy below is used where the file is
# not there (an installed package without the repository).
DEMO_SPACE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "search_spaces",
                          "demo.yaml")
DEMO_PINNED = {"cem.surrogate": "gmm", "cem.lambd": 16.0}
DEMO_FALLBACK = {"data.dataset": "synthetic", "data.train_size": 4096, "data.test_size": 1280, "model.width": 0.125,
                 "train.epochs": 8, "train.milestones": [0.75], "cem.warmup_epochs": 1, "attack.epochs": 4,
                 "attack.blocks": 2, "attack.channels": 32}


def demo_trial() -> dict:
    try:
        from .spaces import load_space
        fixed = dict(load_space(DEMO_SPACE).fixed)
    except Exception:  # noqa: BLE001 - no repository checkout, or a space being edited
        fixed = dict(DEMO_FALLBACK)
    fixed.pop("train.device", None)
    return {**fixed, **DEMO_PINNED}


def sizes_for(device: torch.device, quick: bool, tiny: bool) -> Sizes:
    if tiny:
        return Sizes("tiny (test only: numbers not comparable)", repeats=3, step_repeats=3, warmup=1, width=0.125,
                     batch_size=64, data_images=512, step_images=256, refit_images=256, attack_test=160,
                     attack_blocks=1, attack_channels=8, ray_trial=dict(TINY_TRIAL, **{"train.epochs": 1}),
                     ray_kind="tiny", ray_trials=1)
    cuda = device.type == "cuda"
    if quick:
        return Sizes("quick", repeats=3, step_repeats=5, warmup=1, width=1.0, batch_size=128,
                     data_images=8192 if cuda else 2048, step_images=1024, refit_images=16384 if cuda else 1024,
                     attack_test=2560 if cuda else 285, attack_blocks=8, attack_channels=64,
                     ray_trial=dict(TINY_TRIAL), ray_kind="tiny", ray_trials=3)
    return Sizes("full", repeats=7 if cuda else 5, step_repeats=10 if cuda else 7, warmup=2 if cuda else 1,
                 width=1.0, batch_size=128, data_images=50000 if cuda else 8192, step_images=1024,
                 refit_images=50000 if cuda else 4096,
                 attack_test=10000 if cuda else 1138, attack_blocks=8, attack_channels=64,
                 ray_trial=demo_trial(), ray_kind="demo-size", ray_trials=3)


# ------------------------------------------------------------------------------------------- helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _median_time(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    return [_timed(fn, device) for _ in range(repeats)]


def _round_robin(fns: dict[str, Callable[[], Any]], device: torch.device, repeats: int,
                 warmup: int, settle_s: float = 0.0) -> dict[str, list[float]]:
    """Time several functions alternately (a, b, a, b, ...): load from other processes then falls on all
    of them alike, so their ratio stays meaningful on a shared machine. ``settle_s``: an untimed pause
    before each call, for functions that run on different OpenMP runtimes (torch's and scikit-learn's
    bundled libgomp): the threads one runtime leaves spinning after its last parallel region otherwise
    take the cores from the other's first milliseconds. Returns the timed repeats."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(warmup + repeats):
        for k, fn in fns.items():
            if settle_s:
                time.sleep(settle_s)
            t = _timed(fn, device)
            if r >= warmup:
                times[k].append(t)
    return times


def _row(name: str, value=None, unit: str = "", baseline=None, baseline_name: str = "", ratio=None,
         ratio_name: str = "", target: tuple | None = None, note: str = "", samples=None, error: str | None = None,
         **extra) -> dict:
    met = None
    if target is not None and ratio is not None and error is None:
        op, bound = target
        met = bool(ratio >= bound) if op == "ge" else bool(ratio <= bound)
    return {"name": name, "value": value, "unit": unit, "baseline": baseline, "baseline_name": baseline_name,
            "ratio": ratio, "ratio_name": ratio_name,
            "target": None if target is None else {"op": target[0], "value": target[1]},
            "met": met, "note": note, "samples": list(samples) if samples is not None else None, "error": error,
            **extra}


def _error_row(name: str, exc: BaseException) -> dict:
    msg = f"{type(exc).__name__}: {exc}".strip()
    return _row(name, error=msg.splitlines()[0][:300] if msg else type(exc).__name__)


def _step_config(sizes: Sizes, device: torch.device, **extra) -> dict:
    return {"data.dataset": "synthetic", "model.width": sizes.width, "model.bottleneck_channels": 8,
            "train.batch_size": sizes.batch_size, "train.device": device.type, "seed": 0, **extra}


def _splits(train_images: int, test_images: int, device: torch.device):
    """Synthetic splits on ``device``; large training splits are generated in chunks (memory)."""
    from . import data
    from .config import DataConfig
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


def _progress(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- 1. data
def bench_data(device: torch.device, sizes: Sizes) -> list[dict]:
    """On-device batches with augmentation vs a DataLoader with the same augmentation in PIL."""
    import numpy as np
    import torchvision.transforms as T

    from . import data

    splits = _splits(sizes.data_images, 20, device)
    split = splits.train
    n_batches = len(split) // sizes.batch_size
    images_per_pass = n_batches * sizes.batch_size
    gen = torch.Generator(device=device).manual_seed(0)

    def ours() -> None:
        last = None
        for x, y in data.BatchIterator(split, splits, sizes.batch_size, "crop_flip_rotate", gen):
            last = x
        assert last is not None

    # the conventional pipeline: uint8 HWC arrays -> PIL per image (as torchvision's CIFAR10 does)
    arr = split.images.permute(0, 2, 3, 1).contiguous().cpu().numpy()
    labels = split.labels.cpu().numpy().astype(np.int64)
    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.RandomRotation(15),
                           T.ToTensor(), T.Normalize(data.SYNTHETIC_MEAN, data.SYNTHETIC_STD)])
    dataset = _PILDataset(arr, labels, transform)
    workers = min(REFERENCE_NUM_WORKERS, os.cpu_count() or 1)
    cuda = device.type == "cuda"
    loader = torch.utils.data.DataLoader(dataset, batch_size=sizes.batch_size, shuffle=True, drop_last=True,
                                         num_workers=workers, persistent_workers=workers > 0, pin_memory=cuda)

    def baseline() -> None:
        for x, y in loader:
            x = x.to(device, non_blocking=cuda)
            y = y.to(device, non_blocking=cuda)

    try:
        times = _round_robin({"ours": ours, "baseline": baseline}, device, sizes.repeats, max(1, sizes.warmup))
    finally:
        del loader  # stops the persistent workers
    ours_s, base_s = times["ours"], times["baseline"]
    ours_ips = images_per_pass / statistics.median(ours_s)
    base_ips = images_per_pass / statistics.median(base_s)
    return [_row("data path: on-device batches + augmentation", ours_ips, "img/s", base_ips,
                 f"DataLoader + PIL transforms, {workers} workers", ours_ips / base_ips, "speed-up", TARGET_DATA,
                 note=f"{images_per_pass} images/pass, batch {sizes.batch_size}; baseline: RandomCrop(32, pad 4), "
                      f"HFlip, RandomRotation(15), ToTensor, Normalize, num_workers={workers} (the reference's 8 "
                      f"capped at {os.cpu_count()} CPUs), persistent workers"
                      + (", pin_memory + non_blocking copy" if cuda else ""),
                 samples=[images_per_pass / t for t in ours_s],
                 baseline_samples=[images_per_pass / t for t in base_s])]


class _PILDataset(torch.utils.data.Dataset):
    def __init__(self, arr, labels, transform):
        self.arr, self.labels, self.transform = arr, labels, transform

    def __len__(self) -> int:
        return len(self.arr)

    def __getitem__(self, i: int):
        from PIL import Image
        return self.transform(Image.fromarray(self.arr[i])), int(self.labels[i])


# ------------------------------------------------------------------------------------------- 2. step
def _zero_acc(device: torch.device) -> dict:
    return {k: torch.zeros((), device=device)
            for k in ("ce_sum", "correct", "seen", "ce_nonfinite", "rob_loss", "rob_nonfinite")}


def bench_steps(device: torch.device, sizes: Sizes, flops: bool = False) -> list[dict]:
    """``Trainer.step`` with lambda = 0 and each surrogate, round-robin, seconds per step."""
    from . import data, surrogates
    from .trainer import flops_per_image, lr_at
    from .trial import build, build_config

    base_flat = _step_config(sizes, device, **{"data.train_size": sizes.step_images, "data.test_size": 20})
    splits = _splits(sizes.step_images, 20, device)
    names = ["lambda=0"] + surrogates.names()
    runs: dict[str, dict] = {}
    rows: list[dict] = []
    for name in names:
        try:
            flat = dict(base_flat, **({"cem.lambd": 0.0} if name == "lambda=0" else {"cem.surrogate": name}))
            cfg = build_config(flat)
            _, tr = build(cfg, device, splits)
            if tr.surrogate is not None and tr.surrogate.needs_refit:
                tr.refit_surrogate()  # the epoch-end refit (row 3), not part of the step
            tr.client.train()
            tr.server.train()
            if tr.surrogate is not None:
                tr.surrogate.train()
            runs[name] = {"trainer": tr, "cfg": cfg, "lr": lr_at(cfg, 1), "acc": _zero_acc(device),
                          "times": [], "cem_on": tr.surrogate is not None}
        except Exception as e:  # noqa: BLE001 - one broken surrogate must not hide the others
            rows.append(_error_row(f"train step: {name}", e))
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
                t = _timed(one(run), device) / steps_per_repeat
            except Exception as e:  # noqa: BLE001
                rows.append(_error_row(f"train step: {name}", e))
                del runs[name]
                continue
            if r >= sizes.warmup:
                run["times"].append(t)
    if "lambda=0" not in runs:
        return rows
    base = statistics.median(runs["lambda=0"]["times"])
    tr0 = runs["lambda=0"]["trainer"]
    fpi = flops_per_image(tr0.client, tr0.server, splits.image_shape)
    train_flops = 3.0 * fpi * sizes.batch_size  # forward + input-gradient + weight-gradient products
    setting = f"width {sizes.width:g}, batch {sizes.batch_size}, C=8"
    for name in names:
        if name not in runs:
            continue
        run = runs[name]
        med = statistics.median(run["times"])
        bad = int(float(run["acc"]["ce_nonfinite"]))
        cfg = run["cfg"]
        if name == "lambda=0":
            note = (f"{setting}; no surrogate; {train_flops / 1e9:.0f} GFLOP/step counted "
                    f"-> {train_flops / med / 1e9:.1f} GFLOP/s achieved")
            rows.append(_row(f"train step: lambda=0", med, "s/step", note=note, samples=run["times"]))
        else:
            note = f"lambda={cfg.cem.lambd:g}, grad_mode={cfg.cem.grad_mode}" + \
                (", refit before timing" if run["trainer"].surrogate.needs_refit else "")
            if bad:
                note += f"; {bad} non-finite CE step(s)"
            rows.append(_row(f"train step: {name}", med, "s/step", base, "lambda=0 step", med / base,
                             "x lambda=0", TARGET_STEP_GMM if name == "gmm" else TARGET_STEP, note=note,
                             samples=run["times"]))
    if flops:
        tflops = train_flops / base / 1e12
        rows.append(_row("achieved TFLOP/s (lambda=0 step)", tflops, "TFLOP/s",
                         note=f"{fpi / 1e6:.1f} MFLOP forward/image x 3 x batch {sizes.batch_size} "
                              f"/ {base * 1e3:.2f} ms; bf16 autocast={tr0.amp is not None}, channels_last"))
    return rows


# ------------------------------------------------------------------------------------------- 3. refit
def bench_refit(device: torch.device, sizes: Sizes) -> list[dict]:
    """The gmm refit (cold) against scikit-learn's KMeans per class, on the same features."""
    from .surrogates.gmm import MAX_LLOYD_ITERS
    from .trial import build, build_config

    flat = _step_config(sizes, device, **{"data.train_size": sizes.refit_images, "data.test_size": 20,
                                          "cem.surrogate": "gmm"})
    cfg = build_config(flat)
    splits = _splits(sizes.refit_images, 20, device)
    _, tr = build(cfg, device, splits)
    sur = tr.surrogate
    feats = None

    def encode() -> None:
        nonlocal feats
        feats = tr.encode(splits.train)

    feat_s = _median_time(encode, device, 1, 1)
    labels = splits.train.labels
    k = sur.k

    def ours() -> None:
        sur._fitted.fill_(False)  # cold: k-means++ seeding and Lloyd from scratch every repeat
        sur.refit(feats, labels)

    def warm() -> None:
        sur.refit(feats, labels)  # as at every later epoch end: started from the previous centroids

    from sklearn.cluster import KMeans  # dev extra; a missing package becomes an error row
    import numpy as np
    x = feats.flatten(1).float().cpu().numpy()
    y = labels.cpu().numpy()
    per_class = [np.ascontiguousarray(x[y == c]) for c in range(splits.num_classes)]
    sk_iters: list[int] = []
    seed = [0]

    def sklearn_fit() -> None:
        sk_iters.clear()
        for xc in per_class:
            if len(xc) < k:
                continue
            km = KMeans(n_clusters=k, init="k-means++", n_init=1, max_iter=MAX_LLOYD_ITERS, tol=0.0,
                        algorithm="lloyd", random_state=seed[0]).fit(xc)
            sk_iters.append(int(km.n_iter_))
        seed[0] += 1

    # measured here: back to back, ours ran at 0.12-0.15 s with scikit-learn's threads still spinning,
    # 0.07-0.09 s after a 0.2 s pause (4096 features); scikit-learn's own times vary 0.08-0.33 s either way
    times = _round_robin({"ours": ours, "sklearn": sklearn_fit}, device, sizes.repeats, sizes.warmup, settle_s=0.2)
    ours_s, sk_s = times["ours"], times["sklearn"]
    ours_iters, ours_class_iters = sur.last_fit_iters, sur.last_fit_class_iters
    warm_s = _median_time(warm, device, sizes.repeats, 0)
    med, sk = statistics.median(ours_s), statistics.median(sk_s)
    d = x.shape[1]
    return [_row("gmm refit (cold k-means, all classes)", med, "s", sk, "sklearn KMeans per class", sk / med,
                 "speed-up", TARGET_REFIT,
                 note=f"{len(x)} features x {d} dims, {splits.num_classes} classes, K={k}, <= {MAX_LLOYD_ITERS} "
                      f"iterations, tol=0 (stop when no assignment changes); Lloyd iterations per class: ours mean "
                      f"{ours_class_iters:.1f} (slowest {ours_iters}; all classes batched, a converged class "
                      f"drops out), sklearn mean {statistics.mean(sk_iters) if sk_iters else 0:.1f}; "
                      f"warm refit (later epochs) {statistics.median(warm_s) * 1e3:.1f} ms; feature pass "
                      f"{feat_s[0]:.2f} s (not included; sklearn gets numpy features for free)",
                 samples=ours_s, baseline_samples=sk_s)]


# ------------------------------------------------------------------------------------------- 4. attack
def bench_attack(device: torch.device, sizes: Sizes) -> list[dict]:
    """One decoder-attack epoch on cached features vs the same epoch plus a fresh encoder pass."""
    from . import models
    from .attacks import build as build_attack
    from .attacks.decoder import InversionDecoder, _amp_enabled, encode
    from .trial import build_config

    flat = _step_config(sizes, device, **{"data.train_size": 20, "data.test_size": sizes.attack_test,
                                          "cem.lambd": 0.0, "attack.epochs": 1,
                                          "attack.blocks": sizes.attack_blocks,
                                          "attack.channels": sizes.attack_channels})
    cfg = build_config(flat)
    splits = _splits(20, sizes.attack_test, device)
    torch.manual_seed(0)
    client, _ = models.build(cfg.model, splits.num_classes, splits.image_shape)
    client.to(device).eval().requires_grad_(False)
    if device.type == "cuda":
        client.to(memory_format=torch.channels_last)
    amp = _amp_enabled(cfg, device)
    aux = splits.attack_aux
    ebs = cfg.train.eval_batch_size
    z_aux = None

    def feature_pass() -> None:
        nonlocal z_aux
        z_aux = encode(client, aux, splits, ebs, device, amp)

    feature_pass()
    decoder = InversionDecoder.for_features(tuple(z_aux.shape[1:]), splits.image_shape,
                                            blocks=cfg.attack.blocks, channels=cfg.attack.channels).to(device)
    if device.type == "cuda":
        decoder = decoder.to(memory_format=torch.channels_last)
    attack = build_attack(cfg)
    gen = torch.Generator(device=device).manual_seed(0)
    noise_std = cfg.defense.noise_std

    def noisy(z: torch.Tensor) -> torch.Tensor:
        z = z.float()
        return z + noise_std * torch.randn(z.shape, generator=gen, device=device) if noise_std > 0 else z

    def epoch() -> None:
        attack._train(decoder, z_aux, aux.images, noisy, gen, device, amp)

    times = _round_robin({"epoch": epoch, "encode": feature_pass}, device, sizes.repeats, sizes.warmup)
    ep_s, enc_s = times["epoch"], times["encode"]
    med, enc = statistics.median(ep_s), statistics.median(enc_s)
    n = len(aux)
    return [_row("attack epoch (cached features)", med, "s/epoch", med + enc, "epoch + encoder pass (reference)",
                 (med + enc) / med, "speed-up",
                 note=f"{n} aux images ({n / med:.0f} img/s), decoder res_normN{cfg.attack.blocks}"
                      f"C{cfg.attack.channels}, batch {cfg.attack.batch_size}; the encoder pass the reference "
                      f"repeats every epoch takes {enc:.3f} s here (features computed once per attack)",
                 samples=ep_s)]


# ------------------------------------------------------------------------------------------- 5. ray
RAY_TRIALS_PER_SEARCH = 2  # the first trial of a search starts the worker process, the next reuses it


def bench_ray(device: torch.device, sizes: Sizes) -> list[dict]:
    """``run_trial`` directly against the same trial through the search's trainable under Ray Tune.

    One local Ray session (its start-up is a row of its own); then, alternately, a direct ``run_trial`` and
    a search of two trials of the same config on that session, run as a search runs them (one at a time
    here: the second trial reuses the first one's worker process, as trials do in every search). The
    alternation makes load from other processes, and the speed drift of a shared machine, fall on both
    alike. A Tune trial's time is the search's ``Tuner.fit()`` wall time divided by two: Tune's set-up, the
    worker process (a fresh Python process: imports and first-run initialisation, paid once per two
    trials here, once per ``num_samples / max_concurrent`` trials in a real search), per-epoch checkpoints,
    result files and bookkeeping, and the trials themselves."""
    import ray

    from . import search, spaces
    from .trial import run_trial

    flat = dict(sizes.ray_trial, **{"train.device": device.type})
    n = sizes.ray_trials
    per = RAY_TRIALS_PER_SEARCH
    cpus = max(1, torch.get_num_threads())  # the worker gets as many threads as the direct runs
    cuda = device.type == "cuda"

    def spec_for(i: int):
        # every Tune trial runs ``flat`` with seed 0 (a one-value choice: a space needs a searched key)
        return spaces.parse_space({
            "name": f"bench-ray-{os.getpid()}-{i}",
            "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.0},
                           {"metric": "attack_ssim", "mode": "min", "ref": 1.0}],
            "sampler": {"name": "random", "seed": 0}, "num_samples": per, "max_concurrent": 1,
            "max_failures": 0, "resources": {"cpu": cpus, "gpu": 1 if cuda else 0}, "fixed": flat,
            "params": {"seed": {"choice": [0]}}})

    spec_for(0)  # before any work: a bad spec is an error row at once
    direct_flat = dict(flat, seed=0)
    # warm-up (a tiny trial: the same code paths): imports, allocator and kernel caches, so that the direct
    # figure is a trial in a warm process; the Tune worker is a fresh process and pays these itself
    run_trial(dict(TINY_TRIAL, **{"train.device": device.type, "train.epochs": 1}))

    if ray.is_initialized():
        raise RuntimeError("a Ray session is already initialised in this process; the bench starts its own")
    log = io.StringIO()
    direct: list[float] = []
    tune_s: list[float] = []
    inner: list[float] = []
    # Ray starts its workers at nice 15 (RAY_worker_niceness): on a machine shared with other busy processes
    # the trial then gets less CPU than the direct run, which is not Ray's overhead; run them at our priority
    nice_key = "RAY_worker_niceness"
    nice_env = os.environ.get(nice_key)
    worker_nice = nice_env if nice_env is not None else str(os.nice(0))
    os.environ[nice_key] = worker_nice
    t0 = time.perf_counter()
    try:
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                # as search.run_search starts a local session (address="local": a new instance on this machine)
                ray.init(address="local", num_gpus=torch.cuda.device_count() if cuda else 0,
                         include_dashboard=False, log_to_driver=True)
        finally:
            if nice_env is None:
                os.environ.pop(nice_key, None)
            else:
                os.environ[nice_key] = nice_env
        start_s = time.perf_counter() - t0
        with tempfile.TemporaryDirectory(prefix="cem-bench-ray-") as tmp:
            for i in range(n):
                t0 = time.perf_counter()
                run_trial(direct_flat)
                direct.append(time.perf_counter() - t0)
                stats: dict = {}
                try:
                    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                        exp = search.run_search(spec_for(i), storage=tmp, stats=stats)
                except Exception as e:
                    tail = " | ".join(log.getvalue().strip().splitlines()[-3:])
                    raise RuntimeError(f"{type(e).__name__}: {e}" + (f" (log: {tail})" if tail else "")) from e
                if stats.get("trials_ok", 0) != per:
                    tail = " | ".join(log.getvalue().strip().splitlines()[-3:])
                    raise RuntimeError(f"the Ray Tune trials did not all finish ok ({stats}; log: {tail})")
                tune_s.append(stats["trials_s"] / per)
                for root, _, files in os.walk(exp):
                    if search.RESULT_FILE in files:
                        with open(os.path.join(root, search.RESULT_FILE)) as fh:
                            res = json.load(fh)
                        if res.get("wall_s") is not None:
                            inner.append(float(res["wall_s"]))
    finally:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            ray.shutdown()
    per_trial, d = statistics.median(tune_s), statistics.median(direct)
    w = statistics.median(inner) if inner else float("nan")
    kind = sizes.ray_kind
    note = (f"{kind} trial ({_describe_trial(flat)}); {n} x (direct run_trial, then a search of {per} trials "
            f"on the same Ray session, the second reusing the first's worker process), {cpus} CPU(s) per "
            f"trial, workers at nice {worker_nice} (Ray's default 15 only matters against other busy "
            f"processes); overhead {per_trial - d:+.2f} s/trial = {w - d:+.2f} s for run_trial in the worker "
            f"(median {w:.2f} s there) and {per_trial - w:.2f} s outside run_trial (Tune and searcher set-up, "
            f"worker start and imports once per search, per-epoch checkpoints, result files)")
    row = _row(f"Ray Tune trial vs direct ({kind})", per_trial, "s/trial", d, "run_trial direct", per_trial / d,
               "Tune/direct", TARGET_RAY, note=note, samples=tune_s, baseline_samples=direct,
               overhead=per_trial / d - 1.0, overhead_s=per_trial - d, inner_samples=inner)
    if kind == "tiny":  # the target is a fraction of a demo-size trial; a tiny trial cannot be checked against it
        row["met"] = None
        row["note"] += ("; target not checked: it is stated for a demo-size trial, measured by "
                        "`cem-bench bench` without --quick")
    return [_row("Ray start-up (ray.init, local)", start_s, "s",
                 note="a local session, as `cem-bench search` starts it; paid once per search, not per trial"),
            row]


def _describe_trial(flat: dict) -> str:
    keys = (("model.width", "width"), ("data.train_size", "train"), ("data.test_size", "test"),
            ("train.epochs", "epochs"), ("attack.epochs", "attack epochs"))
    return ", ".join(f"{label} {flat[k]:g}" for k, label in keys if k in flat)


# ------------------------------------------------------------------------------------------- driver
def header(device: torch.device, sizes: Sizes) -> dict:
    from . import __version__
    from .trial import device_name, git_sha
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
        # OpenMP settings change CPU timings a lot on a shared machine (docs/performance.md)
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
    }


def run_bench(device: str = "cpu", quick: bool = False, only: list[str] | tuple[str, ...] | None = None,
              tiny: bool = False, progress: bool = True) -> dict:
    """Measure the rows of ``only`` (default: all of ``GROUPS``; ``flops`` only on CUDA) and return
    ``{"header": {...}, "rows": [{name, value, unit, baseline, ratio, target, met, note, error, ...}]}``."""
    from .trainer import resolve_device
    dev = resolve_device(device)
    groups = list(GROUPS if only is None else only)
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown bench rows {unknown}; known: {', '.join(GROUPS)}")
    sizes = sizes_for(dev, quick, tiny)
    head = header(dev, sizes)
    t_all = time.perf_counter()
    rows: list[dict] = []
    flops = "flops" in groups and dev.type == "cuda"
    plan: list[tuple[str, str, Callable[[], list[dict]]]] = [
        ("data", "data path", lambda: bench_data(dev, sizes)),
        ("step", "train step", lambda: bench_steps(dev, sizes, flops=flops)),
        ("refit", "gmm refit", lambda: bench_refit(dev, sizes)),
        ("attack", "attack epoch", lambda: bench_attack(dev, sizes)),
        ("ray", "Ray Tune trial", lambda: bench_ray(dev, sizes)),
    ]
    if flops and "step" not in groups:
        groups.append("step")  # the TFLOP/s figure is the lambda = 0 step's
    for group, label, fn in plan:
        if group not in groups:
            continue
        t0 = time.perf_counter()
        try:
            new = fn()
        except Exception as e:  # noqa: BLE001 - an error row, the table goes on
            if progress:
                traceback.print_exc(file=sys.stderr)
            new = [_error_row(label, e)]
        rows.extend(new)
        if progress:
            _progress(f"{label}: {time.perf_counter() - t0:.1f} s")
    head["bench_s"] = round(time.perf_counter() - t_all, 1)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    head["load_avg_end"] = [round(v, 2) for v in load]
    return {"header": head, "rows": rows}


# ------------------------------------------------------------------------------------------- output
def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "img/s":
        s = f"{v:,.0f}"
    elif unit in ("s", "s/step", "s/epoch", "s/trial"):
        s = f"{v:.3f}" if v < 10 else f"{v:.1f}"
    else:
        s = f"{v:.3g}"
    return f"{s} {unit}".strip()


def _target_text(row: dict) -> str:
    t = row.get("target")
    if not t:
        return "-"
    sym = ">=" if t["op"] == "ge" else "<="
    return f"{sym} {t['value']:g}x"


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
                 f"(time.perf_counter{', cuda.synchronize' if h.get('cuda_version') else ''})")
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
        ratio = "-" if row.get("ratio") is None else f"{row['ratio']:.2f}x"
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
    """``cem-bench bench [--device cpu|cuda] [--quick] [--json FILE]``."""
    from .trial import write_json
    device = getattr(args, "device", "cpu") or "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        print(f"cem-bench bench: --device {device!r}; allowed: cpu, cuda (or cuda:N)", file=sys.stderr)
        return 2
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"cem-bench bench: --device {device} but CUDA is not available here; use --device cpu",
              file=sys.stderr)
        return 2
    result = run_bench(device=device, quick=bool(getattr(args, "quick", False)))
    print(format_table(result), flush=True)
    path = getattr(args, "json", None)
    if path:
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        write_json(result, path)  # temp file + os.replace
        print(f"json: {path}")
    return 0
