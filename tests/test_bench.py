"""``cem-bench bench`` in its quickest form: the real data-path, training-step and refit code paths at tiny
sizes. Checks the structure of the result and of the printed table, never the speeds."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from types import SimpleNamespace

import pytest
import torch

from cem_bench import bench, surrogates
from cem_bench.bench import attack as attack_mod
from cem_bench.bench import harness

HEADER_KEYS = ("device", "cpu_count", "torch_threads", "torch_version", "date", "git_commit", "mode", "repeats",
               "step_repeats", "warmup", "load_avg_start", "load_avg_end", "bench_s", "env")
ROW_KEYS = ("name", "value", "unit", "baseline", "ratio", "target", "met", "note", "error")


@pytest.fixture(scope="module")
def result():
    pytest.importorskip("sklearn")
    return bench.run_bench(device="cpu", quick=True, tiny=True, only=["data", "step", "refit"], progress=False)


def test_header(result):
    h = result["header"]
    for k in HEADER_KEYS:
        assert k in h, k
    assert h["device"].startswith("cpu")
    assert h["repeats"] >= 3 and h["step_repeats"] >= 3 and h["warmup"] >= 1
    assert h["torch_version"]


def test_rows(result):
    rows = result["rows"]
    errors = [r for r in rows if r["error"]]
    assert not errors, errors
    for r in rows:
        for k in ROW_KEYS:
            assert k in r, (r["name"], k)
    names = [r["name"] for r in rows]
    # data path, the lambda = 0 step and one step per registered surrogate, the refit
    assert sum(n.startswith("data path") for n in names) == 1
    steps = [r for r in rows if r["name"].startswith("train step: ")]
    assert [r["name"] for r in steps] == ["train step: lambda=0"] + [f"train step: {s}" for s in surrogates.names()]
    assert sum(n.startswith("gmm refit") for n in names) == 1
    for r in rows:
        assert isinstance(r["value"], float) and math.isfinite(r["value"]) and r["value"] > 0, r
        assert r["samples"] is not None and len(r["samples"]) >= 3
        if r["target"] is not None:
            assert r["target"]["op"] in ("ge", "le") and r["target"]["value"] > 0
            assert r["ratio"] > 0 and isinstance(r["met"], bool)
            assert r["met"] == (r["ratio"] >= r["target"]["value"] if r["target"]["op"] == "ge"
                                else r["ratio"] <= r["target"]["value"])
    gmm = next(r for r in steps if r["name"] == "train step: gmm")
    assert gmm["target"] == {"op": "le", "value": 1.15}
    base = steps[0]
    assert base["target"] is None and base["met"] is None
    for r in steps[1:]:
        assert r["baseline"] == base["value"]
        assert abs(r["ratio"] - r["value"] / base["value"]) < 1e-9
    data = next(r for r in rows if r["name"].startswith("data path"))
    assert data["unit"] == "img/s" and data["target"] == {"op": "ge", "value": 5.0}
    refit = next(r for r in rows if r["name"].startswith("gmm refit"))
    assert refit["target"] == {"op": "ge", "value": 3.0}


def test_table(result):
    text = bench.format_table(result)
    lines = text.splitlines()
    assert lines[0] == "cem-bench bench"
    for label in ("device:", "CPU count:", "torch:", "date:", "git commit:", "timing:"):
        assert any(line.startswith(label) for line in lines), label
    head = next(i for i, line in enumerate(lines) if line.startswith("row "))
    for col in ("value", "baseline", "ratio", "target", "met"):
        assert col in lines[head]
    assert set(lines[head + 1].replace(" ", "")) == {"-"}
    body = lines[head + 2: head + 2 + len(result["rows"])]
    for row, line in zip(result["rows"], body):
        assert line.startswith(row["name"])
        assert line.rstrip().endswith(("yes", "NO", "-", "n/a"))
    assert "notes:" in lines


def test_error_row_and_json(result, tmp_path, monkeypatch):
    # a failing group becomes an error row and the rest of the table is still printed
    def boom(device, sizes):
        raise RuntimeError("no Ray here")

    monkeypatch.setitem(harness.ROWS, "ray", dataclasses.replace(harness.ROWS["ray"], fn=boom))
    res = bench.run_bench(device="cpu", tiny=True, only=["ray"], progress=False)
    assert len(res["rows"]) == 1 and res["rows"][0]["error"].startswith("RuntimeError: no Ray here")
    assert res["rows"][0]["met"] is None
    merged = {"header": result["header"], "rows": result["rows"] + res["rows"]}
    text = bench.format_table(merged)
    assert "ERROR" in text and "no Ray here" in text

    # main(): --json writes the same structure (strict JSON), and the table goes to stdout
    monkeypatch.setattr(harness, "run_bench", lambda **kw: merged)
    out = tmp_path / "sub" / "bench.json"
    assert bench.main(SimpleNamespace(device="cpu", quick=True, json=str(out))) == 0
    saved = json.loads(out.read_text())
    assert set(saved) == {"header", "rows"} and len(saved["rows"]) == len(merged["rows"])
    assert not list(out.parent.glob("*.tmp*"))


def test_bad_arguments(capsys):
    with pytest.raises(ValueError, match="unknown bench rows"):
        bench.run_bench(only=["nope"])
    assert bench.main(SimpleNamespace(device="tpu", quick=True, json=None)) == 2
    assert "allowed: cpu, cuda" in capsys.readouterr().err
    # an empty --device (an unset variable?) ran the whole CPU bench (2026-12-07 probe)
    assert bench.main(SimpleNamespace(device="", quick=True, json=None)) == 2
    assert "--device ''; allowed: cpu, cuda" in capsys.readouterr().err


def test_bad_arguments_are_refused_before_any_measurement(monkeypatch, capsys):
    # a CUDA-only option named on the CPU measured nothing and printed an empty table with exit 0
    with pytest.raises(ValueError, match=r"flops \(cuda only\) cannot run on cpu"):
        bench.run_bench(device="cpu", only=["step", "flops"], progress=False)
    assert bench.main(SimpleNamespace(device="cpu", quick=True, json=None, only=["flops"])) == 2
    assert "cannot run on cpu" in capsys.readouterr().err

    # a card index the machine does not have, or no index at all: refused before any row runs
    def never(**kw):
        raise AssertionError("measured")
    monkeypatch.setattr(harness, "run_bench", never)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for dev in ("cuda:1", "cuda:x", "cuda:"):
        assert bench.main(SimpleNamespace(device=dev, quick=True, json=None)) == 2
        assert "CUDA devices cuda:0 to cuda:0" in capsys.readouterr().err


@pytest.mark.ray
def test_ray_row_times_a_real_search():
    # the real row at its tiniest: a local Ray session, one direct run_trial and a two-trial search
    res = bench.run_bench(device="cpu", quick=True, tiny=True, only=["ray"], progress=False)
    rows = {r["name"]: r for r in res["rows"]}
    assert not [r for r in res["rows"] if r["error"]], res["rows"]
    start = rows["Ray start-up (ray.init, local)"]
    trial = rows["Ray Tune trial vs direct (tiny)"]
    assert start["value"] > 0 and trial["value"] > 0 and trial["baseline"] > 0
    assert len(trial["inner_samples"]) == bench.RAY_TRIALS_PER_SEARCH and min(trial["inner_samples"]) > 0
    assert trial["ratio"] == pytest.approx(trial["value"] / trial["baseline"])
    assert trial["met"] is None  # a tiny trial is not checked against the demo-size target


# run for real, tiny (pack: CUDA only, one note row on the CPU); "ray" by its own test
CHEAP_GROUPS = ("data", "step", "kernels", "refit", "attack", "epoch", "results", "ceiling", "pack")


def test_every_registered_group_is_in_groups_and_run(monkeypatch):
    pytest.importorskip("sklearn")
    groups = harness.registered()
    names = [g.group for g in groups]
    assert names == ["data", "step", "kernels", "refit", "attack", "epoch", "ray", "results", "ceiling",
                     "pack"]  # the order
    assert bench.GROUPS == tuple(names) + ("flops",)
    assert set(CHEAP_GROUPS) | {"ray"} == set(names)
    calls = []

    def recorded(g):
        def fn(device, sizes, **options):
            calls.append(g.group)
            if g.group not in CHEAP_GROUPS:  # dispatched, not measured here
                return [harness.make_row(f"{g.label} (stub)", 1.0, "s", samples=[1.0])]
            return g.fn(device, sizes, **options)
        return fn

    for g in groups:
        monkeypatch.setitem(harness.ROWS, g.group, dataclasses.replace(g, fn=recorded(g)))
    res = bench.run_bench(device="cpu", quick=True, tiny=True, progress=False)
    assert calls == names
    rows = res["rows"]
    assert not [r for r in rows if r["error"]], rows
    # both precisions of the ceiling are measured, each through the config the trials use
    assert sorted(r["name"] for r in rows if r["name"].startswith("ceiling")) == [
        "ceiling (bf16): one model, best batch", "ceiling (grid fp32): one model, best batch"]
    for g in groups:
        # a group's rows (and its error row) are named after its label
        assert any(r["name"].startswith(g.label) for r in rows), g.group
    assert not any(r["name"].startswith("achieved TFLOP/s") for r in rows)  # "flops" is CUDA only
    attack = next(r for r in rows if r["name"].startswith("attack epoch"))
    # at CIFAR's decoder batch, whose 50 epochs the row estimates (the synthetic set's own is 32: until 2026-12-07
    # the estimate of the paper's attack was made at that batch)
    assert ", batch 256;" in attack["note"], attack["note"]
    # the speed-up of caching: the same epoch plus the encoder pass the reference repeated, over the cached epoch
    n, enc = int(attack["note"].split()[0]), float(re.search(r"takes ([0-9.]+) s here", attack["note"]).group(1))
    assert attack["value"] > 0 and attack["baseline"] == pytest.approx(attack["value"] + enc, abs=6e-4)
    assert attack["ratio"] == pytest.approx(attack["baseline"] / attack["value"])
    # the paper-scale estimate extrapolates the cached epoch, not the uncached one
    paper = next(r for r in rows if r["name"].startswith("attack epoch x "))
    assert harness.MEASURED["decoder_epoch_s_per_image"] == pytest.approx(attack["value"] / n)
    assert paper["value"] == pytest.approx(attack_mod.PAPER_ATTACK_EPOCHS * attack_mod.PAPER_TRAIN_IMAGES
                                           * attack["value"] / n)
    step0 = next(r for r in rows if r["name"] == "train step: lambda=0")
    assert "FlopCounterMode" in step0["note"]


def test_flop_count_of_one_step():
    from cem_bench.core.trial import build, build_config

    sizes = harness.sizes_for(torch.device("cpu"), quick=True, tiny=True)
    flat = harness.step_config(sizes, torch.device("cpu"), **{"data.train_size": 64, "data.test_size": 20,
                                                              "cem.lambd": 0.0})
    splits = harness.synthetic_splits(64, 20, torch.device("cpu"))
    _, tr = build(build_config(flat), torch.device("cpu"), splits)
    x = splits.normalize(splits.train.images[:16])
    y = splits.train.labels[:16]
    fwd, total = bench.count_step_flops(tr, x, y)
    # backward = the weight gradients plus the input gradients of every layer but the first: just under 2x
    assert fwd > 0 and 2.5 * fwd < total < 3.0 * fwd
    assert all(p.grad is None for p in tr.client.parameters())


@pytest.mark.slow
def test_packed_workers_pin_their_threads_start_together_and_are_reused_across_k():
    """The ``pack`` row's workers (run here on the CPU): each with OMP_NUM_THREADS = its share of the CPUs,
    released together by the barrier, the first k of them for each k (the others run nothing), each reporting
    every timed epoch; the window throughput counts only the time all of them ran; the same workers attack on
    command."""
    import os

    from cem_bench.bench.pack import Workers, attack_packing, measure_attacks, window, worker_flat
    flat = {**worker_flat(128), "train.device": "cpu", "model.width": 0.0625, "data.test_size": 40,
            "train.batch_size": 64, "attack.epochs": 1, "attack.blocks": 1, "attack.channels": 8,
            "attack.rmle_iterations": 2}
    with Workers(2, flat, timeout=300) as w:
        one = w.train(1, seconds=0.0, min_epochs=2)
        # 4 epochs, not 2: the common window needs worker 1 to start before worker 0 ends, and a loaded box can
        # hold a process back for a tiny epoch or two
        res = w.train(2, seconds=0.0, min_epochs=4)
        spans = [r["attack"] for r in w.attack(2)]
        att = measure_attacks(w, repeats=1)
    assert len(one) == 1 and len(one[0]["epochs"]) == 2
    assert [len(r["epochs"]) for r in res] == [4, 4] and not any(r["graphed"] for r in res)
    assert all(r["threads"] == max(1, (os.cpu_count() or 1) // 2) for r in res)
    assert all(n == 128 for r in res for *_, n in r["epochs"])
    # the first worker went on from where its first window ended: one trial, not a new one per window
    assert res[0]["epochs"][0][0] >= one[0]["epochs"][-1][1]
    w_ = window(res)
    assert w_["seconds"] > 0 and len(w_["per_worker"]) == 2
    assert all(rate * w_["seconds"] <= 4 * 128 * (1 + 1e-9) for rate in w_["per_worker"])
    assert w_["images_per_s"] == pytest.approx(sum(w_["per_worker"]))
    assert len(spans) == 2 and all(e > s for s, e in spans)
    assert att["alone_s"] > 0 and att["factor_k2"] == pytest.approx(2 * att["alone_s"] / att["together_s"])
    assert attack_packing([[0.0, 10.0], [0.0, 10.0]], 10.0) == pytest.approx(2.0)   # both in the time of one
    assert attack_packing([[0.0, 10.0], [10.0, 20.0]], 10.0) == pytest.approx(1.0)  # one after the other


@pytest.mark.slow
def test_pack_workers_keep_their_replies_apart_from_what_libraries_print(tmp_path, monkeypatch):
    """A worker's own prints (a graph capture or a compile that falls back under ``auto`` prints a line on
    stdout) and a chatty stderr (more than a pipe holds) neither corrupt its replies nor stall it."""
    import signal

    from cem_bench.bench.pack import Workers, worker_flat
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nprint('[cem-bench] a library line on stdout', flush=True)\n"
        "sys.stderr.write('w' * 200000 + '\\n')\nsys.stderr.flush()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    flat = {**worker_flat(64), "train.device": "cpu", "model.width": 0.0625, "data.test_size": 20,
            "train.batch_size": 64}

    def stalled(*_):
        raise TimeoutError("the pack worker stalled")
    old = signal.signal(signal.SIGALRM, stalled)
    signal.alarm(240)
    try:
        with Workers(1, flat, timeout=200) as w:
            res = w.train(1, seconds=0.0, min_epochs=1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert len(res) == 1 and len(res[0]["epochs"]) == 1


def test_a_worker_that_dies_before_it_is_ready_is_reported():
    from cem_bench.bench.pack import Workers
    with pytest.raises(RuntimeError, match="pack worker exited with"):
        Workers(1, {"data.dataset": "no-such-set", "train.device": "cpu"}, timeout=60)


def test_a_pack_phase_without_mps_refuses_to_run_under_a_running_daemon(monkeypatch):
    """A control daemon still running (one this process did not start, or one that has not quit yet after the
    previous phase) takes every CUDA process as its client: the no-MPS rows would hold MPS figures."""
    from cem_bench import mps
    from cem_bench.bench import pack

    def never(*a, **k):
        raise AssertionError("workers started")
    monkeypatch.setattr(pack, "Workers", never)
    monkeypatch.setattr(mps, "running", lambda: True)
    rows, after = pack.pack_phase(pack.worker_flat(64), (1, 2), {"images_per_s": 1.0}, False)
    assert after is None and len(rows) == 1 and "MPS control daemon is running" in rows[0]["error"]


def test_the_pack_workers_train_on_the_card_the_row_names(monkeypatch):
    """`bench --device cuda:1 --only pack` packed its workers on cuda:0 ("cuda" in each worker) and compared them
    with cuda:1's ceiling."""
    import torch

    from cem_bench.bench import pack
    from cem_bench.bench.harness import sizes_for
    got = []
    monkeypatch.setattr(pack, "pack_rows", lambda device, sizes, flat, ks: got.append((str(device), flat)) or [])
    pack.bench_pack(torch.device("cuda:1"), sizes_for(torch.device("cuda:1"), quick=True, tiny=False))
    assert got and all(d == "cuda:1" and f["train.device"] == "cuda:1" for d, f in got), got


def test_gpu_pack_summary_takes_a_phase_that_measured_no_k(tmp_path, monkeypatch):
    """scripts/gpu_pack.py's summary.md with a phase whose only row is the phase's own (MPS could not start, the
    workers failed): such a row has no k, and the summary, written last, must not lose the run's figures."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("gpu_pack_under_test", "scripts/gpu_pack.py")
    gpu_pack = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, gpu_pack)
    spec.loader.exec_module(gpu_pack)
    top = {"images_per_s": 1000.0, "batch": 32, "precision": "bf16", "by_batch": {32: 1000.0}}
    k1 = {**harness.make_row("packed k=1 (bf16)", 2.0, "trials/h", note="median of 2"), "k": 1, "mps": False}
    summary = {"pack bf16": {"rows": [k1, harness.error_row("packed (bf16): workers", RuntimeError("died"))],
                             "attack": None, "ceiling": top},
               "pack bf16 MPS": {"rows": [harness.make_row("packed (bf16, MPS)", note="not started: no daemon")],
                                 "attack": None, "ceiling": top},
               # the attacks' phase: its grid line looks for k=2 among rows, one of which has no k
               "pack fp32": {"rows": [harness.error_row("packed (grid fp32): k=4", RuntimeError("died")),
                                      {**k1, "k": 2, "images_per_s": 61_500.0}],
                             "attack": {"alone_s": 66.5, "together_s": 100.0, "factor_k2": 1.33}, "ceiling": top}}
    env = {"device": "cpu", "torch": torch.__version__, "commit": "0" * 40}
    gpu_pack.write_summary(str(tmp_path), env, summary)
    text = (tmp_path / "summary.md").read_text()
    assert "- k=1: 2.0 trials/h" in text and "packed (bf16): workers: None trials/h; RuntimeError: died" in text
    assert "packed (bf16, MPS): None trials/h;  not started: no daemon" in text
    # what the grid line counts is said: training and attacks, not a whole trial's evaluation and start-up
    assert "paper trials per GPU-hour of training and attacks (evaluation and start-up not included)" in text


def test_the_pack_window_counts_only_the_time_all_workers_ran():
    """Two workers that each train 100 images/s alone and 50 each together, one starting 5 s after the other:
    the sum of their own rates (the old method) reports 150 images/s for a card that never gave more than 100;
    the common window reports the 100 they trained together."""
    from cem_bench.bench.pack import window

    # worker a: alone 0-5 s (500 images), with b 5-10 s (250); b: with a 5-10 s (250), alone 10-15 s (500)
    a = {"epochs": [[0.0, 5.0, 500], [5.0, 10.0, 250]]}
    b = {"epochs": [[5.0, 10.0, 250], [10.0, 15.0, 500]]}
    w = window([a, b])
    assert w["own_sum"] == pytest.approx(150.0)
    assert w["images_per_s"] == pytest.approx(100.0) and w["seconds"] == pytest.approx(5.0)
    assert w["per_worker"] == pytest.approx([50.0, 50.0])
    # an epoch straddling the window's edge counts pro rata
    c = {"epochs": [[4.0, 8.0, 400], [8.0, 12.0, 400]]}
    assert window([a, c])["seconds"] == pytest.approx(6.0)          # 4 s to 10 s
    with pytest.raises(RuntimeError, match="never all ran at once"):
        window([{"epochs": [[0.0, 1.0, 10]]}, {"epochs": [[2.0, 3.0, 10]]}])


def test_a_packed_figure_above_the_ceiling_is_an_error_of_the_measurement():
    from cem_bench.bench import pack

    class Fake:                                                       # 3,000 images/s each, in one 1-s window
        def train(self, k):
            return [{"epochs": [[0.0, 1.0, 3000]]} for _ in range(k)]
    top = {"images_per_s": 10000.0, "batch": 2048, "precision": "bf16"}
    ok = pack.pack_row("k=2", 2, Fake(), top, 2)
    assert ok["error"] is None and ok["ceiling_fraction"] == pytest.approx(0.6) and ok["ratio"] == pytest.approx(0.6)
    assert ok["value"] == pytest.approx(pack.trials_per_hour(6000.0)) and len(ok["samples"]) == 2
    assert ok["met"] is False                                          # below the target share of the ceiling
    over = pack.pack_row("k=4", 4, Fake(), top, 2)
    assert over["error"].startswith("above the card's ceiling (120%)")


def test_whole_trials_per_hour_adds_the_attacks_at_their_packing():
    from cem_bench.bench import pack
    # 50,000 images/s trains a paper trial's 12M images in 240 s; 60 s of attacks packed 2x cost 30 s more
    assert pack.whole_trials_per_hour(50000.0, 60.0, 2.0) == pytest.approx(3600 / 270)


def test_the_demo_fallback_matches_the_demo_space():
    """The bench's copy of demo.yaml's fixed keys (used where the file is absent) is the file's."""
    from cem_bench.bench.harness import DEMO_FALLBACK, DEMO_SPACE
    from cem_bench.spaces import load_space
    fixed = dict(load_space(DEMO_SPACE).fixed)
    fixed.pop("train.device", None)
    assert fixed == DEMO_FALLBACK


def test_op_counter_counts_kernels_not_views():
    from cem_bench.bench.kernels import OpCounter

    x = torch.randn(4, 6, requires_grad=True)
    with OpCounter() as c:
        v = x.view(2, 12).t().unsqueeze(0)[0]          # views only
        torch.empty(3)
    assert c.total == 0, c.counts
    with OpCounter() as c:
        loss = (x.float() * 2 + 1).sum()               # float() of fp32 is not an operator
        loss.backward()
    # forward mul, add, sum; backward: the seed (ones_like), sum's backward is a view (expand), mul's a mul
    assert c.counts == {"mul": 2, "add": 1, "sum": 1, "ones_like": 1}, c.counts
    assert v.shape == (12, 2)


def test_kernel_count_of_each_step_is_exact_and_ordered():
    """The count is the same for the same code (it is what later changes are measured by), lambda = 0 runs the
    fewest, and every surrogate's row predicts a ratio above 1 from its extra operators."""
    from cem_bench.bench import kernels

    sizes = harness.sizes_for(torch.device("cpu"), quick=True, tiny=True)
    a = kernels.count_configs(torch.device("cpu"), sizes, ["lambda=0", "gmm", "slot_cross"])
    b = kernels.count_configs(torch.device("cpu"), sizes, ["lambda=0", "gmm", "slot_cross"])
    assert a == b
    total = {k: sum(v.values()) for k, v in a.items()}
    assert 0 < total["lambda=0"] < total["gmm"] < total["slot_cross"]
    assert a["lambda=0"]["convolution"] > 0 and a["lambda=0"]["convolution_backward"] > 0
    rows = kernels.bench_kernels(torch.device("cpu"), sizes)
    assert [r["name"] for r in rows] == ["kernels per step: lambda=0"] + [f"kernels per step: {s}"
                                                                        for s in surrogates.names()]
    for r in rows[1:]:
        assert r["ratio"] == pytest.approx(kernels.predicted_ratio(r["value"] - r["baseline"])) and r["ratio"] > 1


def test_the_results_group_keeps_its_rows_without_optuna(monkeypatch):
    """A lent GPU machine has no Optuna: the samplers' rows become one error row, not an error that takes the
    report's and table's rows of the same group with it."""
    import importlib.util

    from cem_bench.bench import results as bench_results
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna" else real(name, *a))
    rows = bench_results.sampler_rows(type("Sizes", (), {"sampler_trials": (10,)})())
    assert len(rows) == 1 and "optuna is not installed" in rows[0]["error"]
    monkeypatch.undo()
    rows = bench_results.sampler_rows(type("Sizes", (), {"sampler_trials": (10,)})())
    assert [r["name"] for r in rows] == [f"results at scale: {s} ask+tell, 10 completed trials"
                                         for s in ("tpe", "nsga2", "gp")] and all(r["value"] > 0 for r in rows)


def test_absolute_targets_read_in_their_unit_and_the_report_target_is_the_rows_own():
    """The CUDA λ = 0 step's 1.73 ms printed as "0.002 s/step … 1.73x <= 2x", the paper trial's minutes as "x";
    the report's ≤ 10 s target lived only in a note, with target and met empty in the JSON."""
    from cem_bench.bench.harness import format_table, make_row
    rows = [make_row("train step: lambda=0", 0.00173, "s/step", ratio=1.73, ratio_name="ms", target=("le", 2.0)),
            make_row("results at scale: report, 10,000 trials", 12.0, "s", ratio=12.0, ratio_name="s",
                     target=("le", 10.0))]
    text = format_table({"header": {}, "rows": rows})
    assert "0.00173 s/step" in text and "1.73 ms" in text and "<= 2 ms" in text and "1.73x" not in text
    assert rows[1]["met"] is False and "12.00 s" in text and "<= 10 s" in text


def test_an_rmle_failure_keeps_the_decoder_rows_and_no_trial_is_estimated_without_it(monkeypatch):
    """rmle raising made the whole attack group one error row (the decoder rows measured before it lost), and
    the epoch group then estimated a paper trial with 0 s of rmle, without a word."""
    from cem_bench.attacks.rmle import RMLEAttack
    from cem_bench.bench import run_bench

    def broken(*a, **k):
        raise RuntimeError("rmle broke")
    monkeypatch.setattr(RMLEAttack, "invert", broken)
    rows = run_bench(device="cpu", tiny=True, only=["attack", "epoch"])["rows"]
    names = {r["name"]: r for r in rows}
    assert any(n.startswith("attack epoch (cached features)") and not r.get("error") for n, r in names.items())
    assert names["attack: rmle"]["error"].startswith("RuntimeError: rmle broke")
    assert "measured no rmle time" in names["epoch-based estimate: one paper trial"]["error"]
