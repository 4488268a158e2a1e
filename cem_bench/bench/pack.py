"""Row group ``pack`` (CUDA): trials per GPU-hour when k trials share one card, with and without CUDA MPS.

k = 1, 2, 4, 8 worker processes start together on the device, each a trial of the paper's model (gmm,
λ = 16, graphed step) on ``PACK_IMAGES`` synthetic training images for ``PACK_EPOCHS`` epochs, with its torch
threads pinned to its share of the CPUs (``OMP_NUM_THREADS`` = CPUs // k, as Ray's ``resources.cpu`` does);
each reports its epoch times. The first epoch (capture, autotuning, first refit) is dropped; the aggregate
throughput is the sum over workers of their epochs per second, scaled to 50,000-image epochs, and
"paper trials per GPU-hour" divides it into 240 epochs (training only: the attacks are in the ``epoch``
group's estimate). Without MPS first, then under MPS where ``nvidia-cuda-mps-control`` can start (and is
stopped again if this row started it). Target: >= 40 paper trials per GPU-hour at the best k (graphs + MPS).

``python -m cem_bench.bench.pack FLAT_JSON`` is the worker (prints one JSON line).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import torch

from .harness import Sizes, error_row, make_row, row

PACK_K = (1, 2, 4, 8)
PACK_IMAGES = 10000
PACK_EPOCHS = 4
PAPER_EPOCHS, PAPER_IMAGES = 240, 50000
TARGET_TRIALS_PER_HOUR = ("ge", 40.0)


def worker_flat(images: int, epochs: int) -> dict:
    return {"data.dataset": "synthetic", "data.train_size": images, "data.test_size": 1000, "model.width": 1.0,
            "train.batch_size": 128, "train.epochs": epochs, "cem.surrogate": "gmm", "cem.lambd": 16.0,
            "cem.warmup_epochs": 0, "train.device": "cuda", "seed": 0}


def run_workers(k: int, flat: dict, timeout: float = 600.0) -> list[dict]:
    """Start k workers at once; return each one's ``{"epoch_s": [...], "threads": n}``."""
    cpus = os.cpu_count() or 1
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cpus // k)), "PYTHONPATH": os.pathsep.join(
        p for p in (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    os.environ.get("PYTHONPATH")) if p)}
    procs = [subprocess.Popen([sys.executable, "-m", "cem_bench.bench.pack", json.dumps(flat)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(k)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"pack worker exited with {p.returncode}: {stderr.strip().splitlines()[-1:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def throughput(results: list[dict], images: int) -> float:
    """Aggregate 50k-image epochs per second over the workers, first epoch of each dropped."""
    return sum(len(r["epoch_s"][1:]) / sum(r["epoch_s"][1:]) for r in results) * images / PAPER_IMAGES


@row("pack", "packed", order=60)
def bench_pack(device: torch.device, sizes: Sizes, ks: tuple[int, ...] = PACK_K) -> list[dict]:
    if device.type != "cuda":
        return [make_row("packed trials per GPU-hour", note="CUDA only: k trial processes sharing one GPU")]
    from .. import mps
    images = PACK_IMAGES if sizes.label != "quick" else PACK_IMAGES // 2
    flat = worker_flat(images, PACK_EPOCHS)
    rows = []
    for use_mps in (False, True):
        session_cm = mps.Session("auto", 0.5, True, log=lambda *_: None) if use_mps else contextlib.nullcontext()
        with session_cm as session:
            if session is not None and session.state.startswith("not started"):
                rows.append(make_row("packed trials per GPU-hour under MPS", note=session.state))
                break
            for k in ks:
                label = f"packed k={k}{' MPS' if use_mps else ''}: paper trials per GPU-hour"
                try:
                    t0 = time.perf_counter()
                    res = run_workers(k, flat)
                    eps = throughput(res, images)
                    per_hour = eps * 3600 / PAPER_EPOCHS
                    each = [sum(r["epoch_s"][1:]) / len(r["epoch_s"][1:]) for r in res]
                    rows.append(make_row(label, per_hour, "trials/h",
                                         ratio=per_hour, ratio_name="trials/h", target=TARGET_TRIALS_PER_HOUR,
                                         note=f"{eps:.2f} epochs of 50k images per second in all; each worker's "
                                              f"epoch of {images:,} images {min(each):.2f}-{max(each):.2f} s; "
                                              f"{res[0]['threads']} torch threads each; gmm, graphed="
                                              f"{res[0]['graphed']}; {time.perf_counter() - t0:.0f} s wall"))
                except Exception as e:  # noqa: BLE001
                    rows.append(error_row(label, e))
    return rows


def _worker(flat: dict) -> None:
    from ..trial import build, build_config
    cfg = build_config(flat)
    dev = torch.device(cfg.train.device)
    _, tr = build(cfg, dev)
    tr.fit()           # each record's epoch_s ends with the evaluation's host read: the device has finished
    print(json.dumps({"epoch_s": [r["epoch_s"] for r in tr.history], "threads": torch.get_num_threads(),
                      "graphed": tr.graph_step is not None}))


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
