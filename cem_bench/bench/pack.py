"""Row group ``pack`` (CUDA): trials per GPU-hour when k trials share one card, with and without CUDA MPS.

``PACK_WORKERS`` worker processes start together, each a trial of the paper's model (gmm, λ = 16, graphed step,
the grid's batch 128) on ``PACK_IMAGES`` synthetic training images, with ``OMP_NUM_THREADS`` = CPUs //
``PACK_WORKERS`` (2 on a 16-CPU card: the paper grid's ``resources: {cpu: 2}``). Each builds its trainer and
runs one untimed epoch (capture, autotuning, the first refit), says it is ready and waits. For each k the
first k workers are released together (a barrier on their stdin) and each trains whole epochs (steps and the
gmm refit; evaluation aside) for ``PACK_SECONDS``, recording when each epoch started and ended on the host's
monotonic clock (an epoch ends with a host read of its logs: the device has finished it); the other workers
hold their CUDA contexts and run nothing. Reusing the workers across k and repeats keeps their start-up (tens
of seconds each) out of the device time, which a lent card has little of.

The throughput is measured only where all k ran at once (``window``): from the last worker's first timed
epoch start to the first worker's last epoch end, the images every worker trained inside that window (an epoch
that straddles an edge counted pro rata) divided by its length. Summing each worker's own rate instead counts
a worker that started late or finished early as if it had shared the card the whole time, and can report more
than the card gives (docs/performance.md). Each k runs ``PACK_REPEATS`` windows (the median and the range are
reported), every figure is printed as a fraction of the ceiling (``ceiling.py``: one model at the best batch size in the same
precision), and a packed figure above the ceiling is reported as an error of the measurement. "Paper trials
per GPU-hour" divides the throughput into 240 epochs of 50,000 images (training only; ``measure_attacks``
measures the attacks of two packed trials, and ``whole_trials_per_hour`` joins the two). Both precisions
(``train.amp`` off: the grid's fp32 with TF32 convolutions, and bf16), without MPS first, then under MPS where
``nvidia-cuda-mps-control`` can start (stopped again if this row started it).

``python -m cem_bench.bench.pack FLAT_JSON FD`` is the worker: its replies are JSON lines on the pipe ``FD``, not
on stdout, where libraries print (a graph capture or a compile that falls back under ``auto`` says so there);
its stdout and stderr go to a file, which no amount of output fills, read back when it dies. On stdin one
command a line, ``{"train": seconds, "min_epochs": n}`` or ``{"attack": true}``; end of input stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from .harness import Sizes, error_row, make_row, row

PACK_K = (1, 2, 4, 8)
PACK_WORKERS = max(PACK_K)
PACK_IMAGES = 10000
PACK_SECONDS = 6.0          # each worker's timed training per window (whole epochs, at least PACK_MIN_EPOCHS)
PACK_MIN_EPOCHS = 2
PACK_REPEATS = 2
PRECISIONS = ("off", "on")     # train.amp: the grid's fp32 (TF32 convolutions), bf16 autocast
PAPER_EPOCHS, PAPER_IMAGES = 240, 50000
# the target is a share of the card's ceiling, not trials per GPU-hour: the ceiling bounds those on each card
# (the measured shares: docs/performance.md "Packing trials on one GPU")
TARGET_CEILING_FRACTION = ("ge", 0.75)


def worker_flat(images: int, amp: str = "off", device: str = "cuda") -> dict:
    """A worker's trial, on ``device`` (the card whose ceiling the rows compare with: ``cuda`` alone would be
    ``cuda:0`` in every worker, whatever ``--device cuda:N`` asked for). ``train.epochs`` is only a horizon for
    the schedule (the workers train as many epochs as their windows take, all at the first learning rate)."""
    return {"data.dataset": "synthetic", "data.train_size": images, "data.test_size": 1000, "model.width": 1.0,
            "train.batch_size": 128, "train.epochs": 100000, "train.amp": amp, "cem.surrogate": "gmm",
            "cem.lambd": 16.0, "cem.warmup_epochs": 0, "train.device": device, "seed": 0,
            # the attacks as the paper grid runs them (cifar10_paper.yaml: its decoder on the training images),
            # for ``Workers.attack``; a scaled-down decoder run, measured as a ratio (``attack_packing``)
            "data.attack_split": "training", "attack.epochs": 20, "attack.blocks": 8, "attack.channels": 64,
            "attack.batch_size": 256}   # CIFAR's, set: the synthetic set's own default need not stay CIFAR's


class Workers:
    """``n`` pack workers of one trial config, started and warmed up together; ``train(k, ...)`` and
    ``attack(k)`` release the first k at once and return what each reports. ``timeout``: the longest any one
    reply may take (a worker silent for longer is killed and reported). A context manager: leaving it ends
    their input, and kills any that does not exit."""

    def __init__(self, n: int, flat: dict, timeout: float = 600.0):
        cpus = os.cpu_count() or 1
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cpus // n)),
               "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self.timeout = timeout
        self.procs: list[subprocess.Popen] = []
        self.replies: list[int] = []          # the read end of each worker's reply pipe
        self.logs: list = []                  # each worker's stdout and stderr
        self.pending: list[bytes] = []        # bytes read from a reply pipe after its last whole line
        try:
            for _ in range(n):
                r, w = os.pipe()
                log = tempfile.TemporaryFile()
                try:
                    p = subprocess.Popen([sys.executable, "-m", "cem_bench.bench.pack", json.dumps(flat), str(w)],
                                         env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                         pass_fds=(w,), text=True)
                except BaseException:
                    os.close(r)
                    log.close()
                    raise
                finally:
                    os.close(w)
                self.procs.append(p)
                self.replies.append(r)
                self.logs.append(log)
                self.pending.append(b"")
            for i in range(n):                 # every worker has built, captured and warmed up
                if self._read(i).get("ready") is not True:
                    raise RuntimeError("pack worker said something other than ready")
        except BaseException:
            self.close()
            raise

    def _tail(self, i: int) -> list[str]:
        log = self.logs[i]
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - 4096))
        return log.read().decode(errors="replace").strip().splitlines()[-3:]

    def _read(self, i: int) -> dict:
        """Worker ``i``'s next reply, waiting at most ``timeout`` seconds for it."""
        p, fd = self.procs[i], self.replies[i]
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self.pending[i]:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                p.kill()
                p.wait()
                raise RuntimeError(f"pack worker {i} sent no reply in {self.timeout:.0f} s: {self._tail(i)}")
            chunk = os.read(fd, 65536)
            if not chunk:                      # the pipe closed: the worker is gone
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                raise RuntimeError(f"pack worker exited with {p.returncode}: {self._tail(i)}")
            self.pending[i] += chunk
        line, _, self.pending[i] = self.pending[i].partition(b"\n")
        return json.loads(line)

    def _release(self, k: int, command: dict) -> list[dict]:
        if not 1 <= k <= len(self.procs):
            raise ValueError(f"k = {k}: between 1 and the {len(self.procs)} workers started")
        for p in self.procs[:k]:
            p.stdin.write(json.dumps(command) + "\n")
        for p in self.procs[:k]:               # after every write: the k start as close together as the pipes allow
            p.stdin.flush()
        return [self._read(i) for i in range(k)]

    def train(self, k: int, seconds: float = PACK_SECONDS, min_epochs: int = PACK_MIN_EPOCHS) -> list[dict]:
        """Each of the first k: ``{"epochs": [[start, end, images], ...], "threads": n, "graphed": bool}``."""
        return self._release(k, {"train": seconds, "min_epochs": min_epochs})

    def attack(self, k: int) -> list[dict]:
        """Each of the first k runs its trial's attacks (``attacks.run_all``): ``{"attack": [start, end]}``."""
        return self._release(k, {"attack": True})

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError, ValueError):
                p.stdin.close()
        deadline = time.monotonic() + 30
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for fd in self.replies:
            with contextlib.suppress(OSError):
                os.close(fd)
        for log in self.logs:
            log.close()
        self.replies, self.logs = [], []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def window(results: list[dict]) -> dict:
    """Throughput inside the window in which every worker was training: ``images_per_s`` (all workers),
    ``per_worker`` (each one's images/s inside the window), ``seconds`` (the window's length), ``own_sum`` (the
    sum of each worker's rate over its own epochs: what the old method reported, an over-count when workers
    did not run together throughout)."""
    start = max(r["epochs"][0][0] for r in results)
    end = min(r["epochs"][-1][1] for r in results)
    if end <= start:
        raise RuntimeError("the workers never all ran at once (one finished before the last started): no "
                           "common window to measure; give them more epochs")
    per = []
    for r in results:
        images = 0.0
        for t0, t1, n in r["epochs"]:
            overlap = min(t1, end) - max(t0, start)
            if overlap > 0:
                images += n * overlap / (t1 - t0)
        per.append(images / (end - start))
    own = sum(sum(n for *_, n in r["epochs"]) / sum(t1 - t0 for t0, t1, _ in r["epochs"]) for r in results)
    return {"images_per_s": sum(per), "per_worker": per, "seconds": end - start, "own_sum": own}


def trials_per_hour(images_per_s: float) -> float:
    return images_per_s * 3600 / (PAPER_EPOCHS * PAPER_IMAGES)


def measure_attacks(workers: Workers, repeats: int = 2) -> dict:
    """The attacks of two packed trials against one alone: each worker attacks once untimed first (its first
    attack also builds and autotunes its models, which a comparison must not count), then ``repeats`` times one
    alone and both together; the medians and ``attack_packing``'s factor."""
    workers.attack(2)
    alone, together = [], []
    for _ in range(repeats):
        a = workers.attack(1)[0]["attack"]
        alone.append(a[1] - a[0])
        spans = [r["attack"] for r in workers.attack(2)]
        together.append(max(e for _, e in spans) - min(s for s, _ in spans))
    a_s, t_s = statistics.median(alone), statistics.median(together)
    return {"alone_s": a_s, "together_s": t_s, "alone_all": alone, "together_all": together,
            "factor_k2": 2 * a_s / t_s}


def attack_packing(spans: list[list[float]], alone_s: float) -> float:
    """How many times one trial's attacks the card gets through when k trials attack at once: k × the time of
    one alone / the time from the first start to the last end (1 = packing gains nothing)."""
    together = max(e for _, e in spans) - min(s for s, _ in spans)
    return len(spans) * alone_s / together


def whole_trials_per_hour(train_images_per_s: float, attack_alone_s: float, attack_factor: float) -> float:
    """Paper trials (240 × 50k training images, then their attacks) per GPU-hour: the GPU-seconds of one trial's
    training at the packed throughput plus its attacks (``attack_alone_s`` alone) at the packed factor."""
    return 3600 / (PAPER_EPOCHS * PAPER_IMAGES / train_images_per_s + attack_alone_s / attack_factor)


@row("pack", "packed", order=60)
def bench_pack(device: torch.device, sizes: Sizes, ks: tuple[int, ...] = PACK_K) -> list[dict]:
    if device.type != "cuda":
        return [make_row("packed trials per GPU-hour", note="CUDA only: k trial processes sharing one GPU")]
    images = PACK_IMAGES if sizes.label != "quick" else PACK_IMAGES // 2
    rows = []
    for amp in PRECISIONS:
        rows.extend(pack_rows(device, sizes, worker_flat(images, amp, str(device)), ks))
    return rows


def pack_rows(device: torch.device, sizes: Sizes, flat: dict, ks: tuple[int, ...] = PACK_K,
              log=lambda *_: None) -> list[dict]:
    """The rows of one precision: every k without MPS, then under MPS (where it starts)."""
    from .ceiling import ceiling
    top = ceiling(device, sizes, flat.get("train.amp", "off"))
    rows = []
    for use_mps in (False, True):
        rows.extend(pack_phase(flat, ks, top, use_mps, log)[0])
    return rows


def pack_phase(flat: dict, ks: tuple[int, ...], top: dict | None, use_mps: bool, log=lambda *_: None,
               then=None, workers_n: int | None = None, timeout: float = 600.0) -> tuple[list[dict], object]:
    """One precision with or without MPS: ``workers_n`` workers (``max(ks)`` by default), then a row per k
    (each also handed to ``log``);
    ``then(workers)``, if given, runs while the workers live and its result is returned beside the rows. A
    session where MPS cannot start gives one row saying why. ``timeout``: the longest a worker's reply may
    take (``Workers``), so that a hung worker ends the phase instead of the run."""
    from .. import mps
    precision = "grid fp32" if flat.get("train.amp", "off") == "off" else "bf16"
    where = f"{precision}{', MPS' if use_mps else ''}"
    rows, after = [], None
    if not use_mps and mps.running():
        # every CUDA process connects to a running control daemon: these workers would share the card
        # through MPS and their figures would stand in the no-MPS rows
        return [make_row(f"packed ({where})", error=f"an MPS control daemon is running (pipe directory "
                         f"{mps.pipe_dir()}): the workers would run under MPS; stop it to measure without")], None
    with (mps.Session("auto", 0.5, True, log=log) if use_mps else contextlib.nullcontext()) as session:
        if session is not None and session.state.startswith("not started"):
            return [make_row(f"packed ({where})", note=session.state)], None
        try:
            t0, n = time.monotonic(), workers_n or max(ks)
            with Workers(n, flat, timeout) as workers:
                log({"workers": n, "start_s": time.monotonic() - t0, "mps": use_mps,
                     "mps_daemons": mps.daemons(), "mps_servers": mps.servers() if use_mps else None})
                for k in ks:
                    label = f"packed k={k} ({where}): paper trials per GPU-hour"
                    try:
                        rows.append({**pack_row(label, k, workers, top, PACK_REPEATS), "k": k, "mps": use_mps})
                    except Exception as e:  # noqa: BLE001
                        rows.append({**error_row(label, e), "k": k, "mps": use_mps})
                    log(rows[-1])
                if then is not None:
                    after = then(workers)
        except Exception as e:  # noqa: BLE001
            rows.append(error_row(f"packed ({where}): workers", e))
    return rows, after


def pack_row(label: str, k: int, workers: Workers, top: dict, repeats: int) -> dict:
    """One k: ``repeats`` windows of the first k workers, as a fraction of the ceiling ``top``."""
    t0 = time.perf_counter()
    runs = [window(workers.train(k)) for _ in range(max(1, repeats))]
    rates = [trials_per_hour(w["images_per_s"]) for w in runs]
    per_hour = statistics.median(rates)
    images_per_s = statistics.median(w["images_per_s"] for w in runs)
    frac = images_per_s / top["images_per_s"]
    each = [v for w in runs for v in w["per_worker"]]
    note = (f"median of {len(runs)} ({min(rates):.1f}-{max(rates):.1f}); {images_per_s:,.0f} images/s, "
            f"{frac:.0%} of the ceiling ({top['images_per_s']:,.0f} images/s: one model at batch {top['batch']}, "
            f"{top['precision']}); each worker {min(each):,.0f}-{max(each):,.0f} images/s inside windows of "
            f"{min(w['seconds'] for w in runs):.1f}-{max(w['seconds'] for w in runs):.1f} s (the old sum of own "
            f"rates: {trials_per_hour(statistics.median(w['own_sum'] for w in runs)):.1f}); "
            f"{time.perf_counter() - t0:.0f} s wall")
    if frac > 1.0:
        return make_row(label, per_hour, "trials/h", error=f"above the card's ceiling ({frac:.0%}): the "
                        f"measurement is wrong, not the card fast; {note}")
    return make_row(label, per_hour, "trials/h", ratio=frac, ratio_name="of the ceiling",
                    target=TARGET_CEILING_FRACTION, note=note, samples=rates, ceiling_fraction=frac,
                    images_per_s=images_per_s, windows=runs)


def _train(tr, cfg, first_epoch: int, seconds: float, min_epochs: int) -> tuple[list, int]:
    n, bs = len(tr.splits.train), cfg.train.batch_size
    images = n // bs * bs if n >= bs else n      # the short last batch is dropped (data.BatchIterator)
    epochs, epoch, t_go = [], first_epoch, time.monotonic()
    while len(epochs) < min_epochs or time.monotonic() - t_go < seconds:
        t0 = time.monotonic()
        tr.train_epoch(epoch)                    # ends with a host read of the epoch's logs: the device is done
        epochs.append([t0, time.monotonic(), images])
        epoch += 1
    return epochs, epoch


def _worker(flat: dict, reply_fd: int) -> None:
    from .. import attacks
    from ..core.trial import build, build_config
    replies = os.fdopen(reply_fd, "w")

    def reply(obj: dict) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()
    cfg = build_config(flat)
    dev = torch.device(cfg.train.device)
    splits, tr = build(cfg, dev)
    if tr.surrogate is not None and tr.lambd > 0:
        tr.check_surrogate_compiles()
    tr.train_epoch(1)                            # capture, autotuning, the first refit: untimed
    reply({"ready": True})
    epoch = 2
    for line in sys.stdin:                       # end of input: the parent is done (or gone)
        cmd = json.loads(line)
        if "train" in cmd:
            epochs, epoch = _train(tr, cfg, epoch, float(cmd["train"]), int(cmd.get("min_epochs", 1)))
            out = {"epochs": epochs, "threads": torch.get_num_threads(), "graphed": tr.graph_step is not None}
        else:
            t0 = time.monotonic()
            attacks.run_all(cfg, tr.client, splits, cfg.defense.noise_std, dev)
            out = {"attack": [t0, time.monotonic()]}
        reply(out)


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]), int(sys.argv[2]))
