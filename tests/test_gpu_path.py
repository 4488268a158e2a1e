"""The GPU path's device and process choices, checked without a GPU (torch.cuda replaced where needed): a trial on
cuda:N makes that card current and captures on its stream, strength's measurement saves the random streams of
the modules' card, bf16 only on cards that have it natively, a trial with no GPU share trains on the CPU, and a
reused worker's trials each compile afresh."""

from __future__ import annotations

import contextlib
import sys
import types

import pytest
import torch
from conftest import direct_trainable

from cem_bench.errors import ConfigError


# ------------------------------------------------------------------------------ cuda:N
def test_an_indexed_cuda_device_is_made_current(monkeypatch):
    """resolve_device('cuda:1') makes cuda:1 the current device (torch.cuda.graph's stream, is_bf16_supported and
    the RNG that fork_rng saves follow the current device); 'cuda' and 'cpu' leave it."""
    from cem_bench.core import runtime
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(torch.device(d)))
    assert runtime.resolve_device("cuda:1") == torch.device("cuda:1")
    assert calls == [torch.device("cuda:1")]
    runtime.resolve_device("cuda")
    runtime.resolve_device("cpu")
    assert calls == [torch.device("cuda:1")]


class _Stream:
    def __init__(self, device=None, priority=0):
        self.device = device


def test_a_capture_records_on_a_stream_of_its_own_device(monkeypatch):
    """graphs.capture hands torch.cuda.graph a stream on the graph's device (its default stream is one for the
    class, made on device 0 at its first use: the kernels of a step on cuda:1 were not captured)."""
    from cem_bench.core import graphs
    seen = []

    @contextlib.contextmanager
    def fake_graph(graph, stream=None, **kw):
        seen.append(stream)
        yield

    monkeypatch.setattr(graphs, "_CAPTURE_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: types.SimpleNamespace())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    ran = []
    graphs.capture(lambda: ran.append(1), torch.device("cuda:1"))
    graphs.capture(lambda: ran.append(2), torch.device("cuda:1"))
    graphs.capture(lambda: ran.append(3), torch.device("cuda"))
    assert ran == [1, 2, 3]
    assert [s.device for s in seen] == [1, 1, 0]
    assert seen[0] is seen[1]                 # one stream per device, reused


def test_a_measurement_saves_the_random_streams_of_the_modules_card(monkeypatch):
    """strength.untouched forks the RNG of the card the modules live on (it forked the current device's, or none
    when CUDA had not been initialised on the current device)."""
    from cem_bench.core import strength
    fake = types.SimpleNamespace(parameters=lambda: [types.SimpleNamespace(device=torch.device("cuda:1"))],
                                 buffers=lambda: [types.SimpleNamespace(device=torch.device("cpu"))])
    assert strength.cuda_devices(fake, torch.nn.Linear(2, 2)) == [1]
    forked = []
    real = torch.random.fork_rng

    def fork(devices=None, **kw):
        forked.append(devices)
        return real(devices=[], **kw)

    monkeypatch.setattr(torch.random, "fork_rng", fork)
    monkeypatch.setattr(strength, "cuda_devices", lambda *m: [1])
    with strength.untouched(torch.nn.Linear(2, 2)):
        pass
    assert forked == [[1]]


# ------------------------------------------------------------------------------ bf16
def _card(monkeypatch, capability):
    native = capability >= (8, 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native or
                        including_emulation)   # torch 2.14: True through emulation on older cards
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")


@pytest.mark.parametrize("capability", [(7, 5), (8, 0)])
def test_bf16_autocast_only_on_cards_with_native_bf16(monkeypatch, capability):
    from cem_bench.core.models import amp_dtype
    _card(monkeypatch, capability)
    cuda = torch.device("cuda:0")
    auto, on = types.SimpleNamespace(amp="auto"), types.SimpleNamespace(amp="on")
    if capability >= (8, 0):
        assert amp_dtype(auto, cuda) is torch.bfloat16 and amp_dtype(on, cuda) is torch.bfloat16
    else:
        assert amp_dtype(auto, cuda) is None       # fp32, not emulated bf16
        with pytest.raises(ConfigError, match=r"compute capability 7\.5.*train\.amp: off"):
            amp_dtype(on, cuda)
    assert amp_dtype(types.SimpleNamespace(amp="off"), cuda) is None
    assert amp_dtype(auto, torch.device("cpu")) is None


# ------------------------------------------------------------------------------ the search's trainable
@pytest.mark.parametrize("gpu, fixed, expected", [(0, {}, "cpu"), (0, {"train.device": "auto"}, "cpu"),
                                                  (1, {}, "cuda"), (0.5, {}, "cuda")])
def test_a_trial_given_no_gpu_trains_on_the_cpu(monkeypatch, tmp_path, gpu, fixed, expected):
    """resources.gpu 0 with train.device auto: the CPU, though the worker sees a card (Ray leaves
    CUDA_VISIBLE_DEVICES alone for a task with no GPU, and auto trained on cuda:0 outside Ray's accounting)."""
    from cem_bench.core.runtime import resolve_device
    from cem_bench.core.trial import build_config
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *a, **k: None)
    seen = []
    cem_trial = direct_trainable(monkeypatch, tmp_path, gpu, lambda flat: seen.append(
        resolve_device(build_config(flat).train.device)), fixed)
    cem_trial({"cem.lambd": 1.0})
    assert [d.type for d in seen] == [expected]


def test_each_trial_of_a_reused_worker_compiles_afresh(monkeypatch, tmp_path):
    """Ten trials in one process, each compiling a new module whose attribute differs (as a surrogate's noise_std
    does, with dynamic=False as the trainer compiles): every one is compiled. Without a reset the ninth and
    later ran eagerly (Dynamo's recompile_limit of 8 per function)."""
    import torch._dynamo

    class Scaled(torch.nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, x):
            return x * self.k

    compiled = []

    def backend(gm, example_inputs):
        compiled.append(1)
        return gm.forward

    def one_trial(flat):
        torch.compile(Scaled(float(flat["cem.lambd"])), backend=backend, dynamic=False)(torch.ones(2))

    torch._dynamo.reset()
    cem_trial = direct_trainable(monkeypatch, tmp_path, 0, one_trial)
    try:
        for k in range(10):
            cem_trial({"cem.lambd": float(k)})
    finally:
        torch._dynamo.reset()
    assert len(compiled) == 10


# ------------------------------------------------------------------------------ scripts/gpu_check.py
def load_gpu_check(monkeypatch):
    """scripts/gpu_check.py as a module (it is a script, not part of the package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", "scripts/gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, gpu_check)   # its dataclasses look their module up there
    spec.loader.exec_module(gpu_check)
    return gpu_check


def options_without_trainers(monkeypatch):
    """gpu_check, and the list of configurations its options stage asks to build: none is built (each
    request raises, which the stage records as the setting's error and goes on)."""
    from cem_bench.bench import harness
    asked = []

    def no_trainer(flat, device, splits):
        asked.append(flat)
        raise RuntimeError("not built here")

    monkeypatch.setattr(harness, "step_trainer", no_trainer)
    return load_gpu_check(monkeypatch), asked


def test_a_failed_bench_and_a_misspelt_group_are_said_not_left_empty(monkeypatch, tmp_path, capsys):
    """`--bench-groups stpe` ran every stage before it and exited 0 with an empty Targets table; a bench that
    exited non-zero left no error file. Now the group is refused at once, and a failed bench is named in the
    summary."""
    import time

    gpu_check = load_gpu_check(monkeypatch)
    with pytest.raises(SystemExit):
        gpu_check.main(["--stages", "env", "summary", "--bench-groups", "stpe"])
    assert "unknown --bench-groups ['stpe']" in capsys.readouterr().err
    run = gpu_check.Run(out=str(tmp_path), budget_s=600, t0=time.perf_counter(), device="cpu",
                        bench_groups=("step",))
    monkeypatch.setattr(gpu_check.Run, "cli", lambda self, args, timeout, log: 2)
    gpu_check.run_stage(run, "bench", gpu_check.bench)
    gpu_check.run_stage(run, "summary", gpu_check.summary)
    text = (tmp_path / "summary.md").read_text()
    assert "## Stages that failed or were skipped" in text and "bench.error.txt: RuntimeError: cem-bench bench " \
        "exited 2; its output is in bench.txt" in text, text


def test_the_tf32_option_rows_ask_the_trainer_for_tf32(monkeypatch, tmp_path):
    """The options stage's "tf32 matmuls" settings put train.tf32: on in the trainers' config: the trainer sets
    the process's TF32 flags from that key on CUDA, so the global flag the stage used to set was put back to
    fp32 products before any step was timed."""
    import time

    gpu_check, flats = options_without_trainers(monkeypatch)
    run = gpu_check.Run(out=str(tmp_path), budget_s=600, t0=time.perf_counter(), device="cpu",
                        option_settings=("tf32 matmuls", "default", "tf32 matmuls, high_priority_stream"))
    gpu_check.options(run)
    assert [f.get("train.tf32") for f in flats] == ["on", None, "on"]


def test_the_options_stage_stops_between_surrogates_when_the_budget_runs_out(monkeypatch, tmp_path):
    """A surrogate's compile can take minutes (a CPU dry run beside other work overran a 400 s budget by 10 min in
    its first setting): the stage looks at the budget before each trainer it builds, records the ones it skipped,
    and builds none once under a minute is left."""
    import dataclasses
    import json
    import time

    gpu_check, built = options_without_trainers(monkeypatch)
    lefts = iter([600.0] + [30.0] * 20)   # the setting's check passes, every later check finds 30 s left

    @dataclasses.dataclass(frozen=True)
    class Running(gpu_check.Run):
        def left(self) -> float:
            return next(lefts)

    run = Running(out=str(tmp_path), budget_s=600, t0=time.perf_counter(), device="cpu",
                  option_settings=("default", "tf32 matmuls"))
    gpu_check.options(run)
    assert built == []
    out = json.loads((tmp_path / "options.json").read_text())
    assert out["default"] == {name: "skipped: budget"
                              for name in ("lambda=0", "slot_cross", "attention_centroid", "serial_enhanced")}
    assert out["tf32 matmuls"] == "skipped: budget"


def test_an_unknown_equivalence_configuration_is_refused_before_any_stage(monkeypatch, tmp_path, capsys):
    """--equivalence-configs filters the stage's list by name: a misspelt name used to be dropped without a word
    (its check never ran). Now it stops the script with the names that exist, and every name the prepared device
    run (scripts/gpu_grid_cost.sh) asks for is one of them."""
    import shlex

    from cem_bench import surrogates
    gpu_check = load_gpu_check(monkeypatch)
    monkeypatch.setenv("OUT", str(tmp_path))
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--stages", "env", "--equivalence-configs", "gmm", "gmm (bogus)"])
    assert e.value.code == 2 and "unknown --equivalence-configs ['gmm (bogus)']" in capsys.readouterr().err
    assert not (tmp_path / "env.json").exists()                          # refused before the first stage
    known = {c.key for c in gpu_check.equivalence_configs(surrogates.names())}
    script = open("scripts/gpu_grid_cost.sh").read().replace("\\\n", " ")
    line = next(ln for ln in script.splitlines() if "--equivalence-configs" in ln and not ln.lstrip().startswith("#"))
    words = shlex.split(line.split("--equivalence-configs", 1)[1])
    asked = words[:words.index(">")] if ">" in words else words
    assert asked and set(asked) <= known, set(asked) - known


@pytest.mark.parametrize("arg", ["-h", "5m", "0", "300x"])
def test_the_prepared_device_run_checks_its_argument_before_removing_anything(tmp_path, arg):
    """`gpu_grid_cost.sh -h` (or 5m) removed the files of an earlier run under $OUT, then failed on its
    arithmetic: on a lent machine, the rows a cut-off call had brought back."""
    import os
    import subprocess
    (tmp_path / "pack").mkdir()
    (tmp_path / "pack" / "pack.jsonl").write_text("{}\n")
    (tmp_path / "check_summary.md").write_text("kept\n")
    p = subprocess.run(["bash", "scripts/gpu_grid_cost.sh", arg], env={**os.environ, "OUT": str(tmp_path)},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == (0 if arg == "-h" else 2) and "usage: OUT=" in p.stdout + p.stderr
    assert (tmp_path / "pack" / "pack.jsonl").read_text() == "{}\n" and (tmp_path / "check_summary.md").exists()


@pytest.mark.slow
def test_the_prepared_device_run_dry_runs_on_the_cpu(tmp_path):
    """scripts/gpu_grid_cost.sh on the CPU: the trials phase and the equivalence stage run, and what a device call
    brings back (at most 8 files, no deeper than $OUT/a/b) is there: the pack's rows and summary, written under
    $OUT as they are made (a call cut off at its limit returns them), the check's archive and its summary."""
    import os
    import subprocess
    import tarfile

    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": os.getcwd(),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    # the total is a cap, not a length: on the CPU the work is tiny and fixed (47 s alone here), but a busy CI box
    # took 100 s for it, and a 150-s total then left under 40 s for the check, which the script skips (CI failed
    # so on 2026-12-06); a cap no machine reaches makes the test about the files, not the box's speed
    p = subprocess.run(["bash", "scripts/gpu_grid_cost.sh", "1500"], env=env, capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    files = sorted(str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*") if f.is_file())
    assert files == ["check.tgz", "check_summary.md", "pack/pack.jsonl", "pack/summary.md"]
    with tarfile.open(tmp_path / "check.tgz") as t:
        names = set(t.getnames())
    assert {"check/equivalence.json", "check/env.json", "check/summary.md"} <= names
    summary = (tmp_path / "pack" / "summary.md").read_text()
    assert "- 2 at once, no MPS: slice span" in summary
    assert "- 2 at once, MPS, attention_centroid (MPS off): slice span" in summary   # the grid's other trials


@pytest.mark.slow
def test_the_device_run_needs_neither_ray_nor_optuna(tmp_path):
    """The lent GPU machine has torch, pandas, pyarrow, scikit-image, scikit-learn, scipy and pyyaml but not Ray or
    Optuna (/work/.library/device: its package list), and its minutes are few: the device scripts and the
    `cem-bench train` they run must start and finish without either. A `sitecustomize` on PYTHONPATH makes any
    import of them fail in this process and in every child."""
    import os
    import subprocess

    from conftest import TINY_TRAIN
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class _NoRayOptuna(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('ray', 'optuna'):\n"
        "            raise ImportError(f'{name} is not on the device machine')\n"
        "sys.meta_path.insert(0, _NoRayOptuna())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}

    def ok(*argv, timeout=300):
        p = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, (argv, p.stdout[-1500:], p.stderr[-1500:])
        return p.stdout
    assert "is not on the device machine" in subprocess.run(
        [sys.executable, "-c", "import optuna"], env=env, capture_output=True, text=True).stderr   # the guard holds
    assert "--trials-surrogates" in ok("scripts/gpu_pack.py", "--help")
    assert "--equivalence-configs" in ok("scripts/gpu_check.py", "--help")
    sets = [a for k, v in {**TINY_TRAIN, "train.epochs": 1, "cem.warmup_epochs": 0}.items()
            for a in ("--set", f"{k}={v}")]
    assert "checkpoint:" in ok("-m", "cem_bench.cli", "train", *sets, "--out", str(tmp_path / "run"))
    ok("-m", "cem_bench.cli", "attack", str(tmp_path / "run"), "--set", "attack.epochs=1")


@pytest.mark.slow
def test_a_terminated_pack_run_exits_through_its_handlers(tmp_path):
    """`timeout` ends gpu_pack.py with SIGTERM; by default Python then runs no `__exit__`, and an MPS daemon the
    run started outlived it (the next call on the warm machine skipped every pair). Its handler makes SIGTERM a
    SystemExit: exit code 143, not death by signal (-15)."""
    import os
    import signal
    import subprocess
    import time

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    p = subprocess.Popen([sys.executable, "scripts/gpu_pack.py", "--phases", "trials", "--budget-s", "600",
                          "--out", str(tmp_path)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    jsonl = tmp_path / "pack.jsonl"
    for _ in range(600):   # its first record is written once torch is imported
        if jsonl.exists() and jsonl.read_text().strip():
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=120) == 143, p.stderr.read()[-2000:]


def test_the_trials_phase_starts_a_run_only_with_a_tenth_to_spare_and_the_no_mps_pair_last(monkeypatch):
    """On a card (cuda True, simulated clock): a run killed at its timeout returns nothing, so one is started
    only where 1.1 × its estimate is left; the pairs the grid's GPU-hours need run first; the no-MPS comparison
    is not started after a skipped run (its time is the check's). 470 s: gmm's MPS pair (204 s) and
    attention_centroid's (204 s; it completes the grid's line, so 1.05 × 200 = 210 and the 10 s before the hard
    deadline were enough) run, 62 s are left: alone (1.1 × 110) is skipped, and so is the no-MPS pair."""
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("gpu_pack", "scripts/gpu_pack.py")
    gp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gp)
    clock = {"left": 470.0}

    def measure(k, keys, out_root, timeout, epochs_done, threads=2):
        clock["left"] -= 132.0 if k == 1 else 204.0
        return {"ok": True, "runs": []}
    monkeypatch.setattr(gp.paper, "measure", measure)
    monkeypatch.setattr(gp.mps, "running", lambda: False)
    events = []
    args = types.SimpleNamespace(trials_epochs=10, trials_surrogates=["gmm", "attention_centroid"],
                                 trials_no_mps=True)
    gp.trials_phase(args, True, lambda: clock["left"], lambda kind, **rec: events.append((kind, rec.get("phase"),
                                                                                        rec.get("label"))), {})
    ran = [label.split(" (MPS")[0] for kind, _, label in events if kind == "trials"]
    skipped = [phase for kind, phase, _ in events if kind == "skipped"]
    assert ran == ["2 at once, MPS", "2 at once, MPS, attention_centroid"], events
    assert skipped == ["trials alone", "trials 2 at once, no MPS"], events


def grid_cost_on_a_fake_card(monkeypatch, tmp_path, cost: dict, total: int = 570, import_s: float = 20.0):
    """gpu_grid_cost.sh's gpu_pack call on a simulated H100 (a fake clock; paper.measure and MPS replaced): its
    arguments as the script gives them for ``total``, `timeout` (SystemExit 143) at the hard deadline where the
    script's `timeout` sends SIGTERM. Each run takes ``cost[(k, surrogate)]`` seconds, MPS 2 s to start and 2
    to stop. Returns (the runs as (k, surrogate, timeout, ok), gpu_pack's exit, the seconds it ended at, its
    rows, summary.md)."""
    import importlib.util
    import json
    import types

    from cem_bench import mps
    from cem_bench.bench import paper
    spec = importlib.util.spec_from_file_location("gpu_pack_on_a_fake_card", "scripts/gpu_pack.py")
    gp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gp)
    start = 1.8e9
    clock = {"t": start + import_s}                     # gpu_pack's `import torch` on a cold machine
    hard_deadline = start + total - 30                  # where the script's `timeout` ends gpu_pack

    def term_at_limit():
        if clock["t"] >= hard_deadline:
            clock["t"] = hard_deadline
            raise SystemExit(143)
    gp.time = types.SimpleNamespace(monotonic=lambda: clock["t"], time=lambda: clock["t"])
    gp.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True,
                                                                get_device_name=lambda i: "NVIDIA H100 80GB HBM3"),
                                     __version__="2.11.0", version=types.SimpleNamespace(cuda="13.0"),
                                     device=lambda d: d)
    gp.sizes_for = lambda *a, **kw: None
    gp.subprocess = types.SimpleNamespace(run=lambda *a, **kw: types.SimpleNamespace(stdout="x", returncode=0))

    class Session:
        def __init__(self, *a, **kw):
            self.state = "started"

        def __enter__(self):
            clock["t"] += 2.0
            return self

        def __exit__(self, *exc):
            clock["t"] += 2.0
            term_at_limit()
    monkeypatch.setattr(mps, "Session", Session)
    monkeypatch.setattr(mps, "running", lambda: False)
    monkeypatch.setattr(mps, "servers", lambda: "rc 0")
    runs = []

    def measure(k, keys, out_root, timeout, epochs_done, threads=2):
        s, took = keys["cem.surrogate"], cost[(k, keys["cem.surrogate"])]
        runs.append((k, s, round(timeout), took <= timeout))
        clock["t"] += min(took, timeout)
        term_at_limit()
        if took > timeout:                                 # killed at its timeout: no figure
            return {"k": k, "ok": False, "runs": [{"rc": 124, "start": 0.0, "end": None, "epoch_s": [],
                                                    "log": "killed"}] * k}
        return {"k": k, "ok": True, "span_s": took, "steady_epoch_s": 1.0, "trial_gpu_s": (took + 230) / k,
                "runs": [{"rc": 0, "start": 0.0, "end": took, "epoch_s": [1.0] * 10, "log": "",
                          "attack_s": 60.0}] * k}
    monkeypatch.setattr(paper, "measure", measure)
    argv = ["--phases", "trials", "--trials-surrogates", "gmm", "attention_centroid", "--trials-no-mps",
            "--budget-s", str(total - 50), "--deadline", str(int(start + total - 50)),
            "--hard-deadline", str(int(hard_deadline)), "--out", str(tmp_path)]
    try:
        rc = gp.main(argv)
    except SystemExit as e:
        rc = e.code
    rows = [json.loads(line) for line in (tmp_path / "pack.jsonl").read_text().splitlines()]
    return runs, rc, clock["t"] - start, rows, (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("cost", [
    # the reviewer's cold machine: gmm's pair 280 s against its 170; 216 s were left of the budget, under 1.1 x 200
    {(2, "gmm"): 280, (2, "attention_centroid"): 200, (1, "gmm"): 110},
    # every run 1.4 x (attention_centroid's pair 1.4 x 180): started, then killed at the budget's timeout, 250 s
    {(2, "gmm"): 238, (2, "attention_centroid"): 252, (1, "gmm"): 154}])
def test_the_pair_that_completes_the_grid_line_may_run_into_the_check_s_reserve(monkeypatch, tmp_path, cost):
    """The grid's GPU-hours need gmm's pair and an attention pair, and come first (before the lone trial and the
    check): once gmm's pair has run, the attention pair starts on 1.0 x its estimate (not 1.1 x), scaled by gmm's
    overrun only up to GRID_PAIR_SCALE_CAP (a cold start inflates the first pair), against the hard deadline, and
    its timeout ends 10 s before it. Before, it was skipped or killed and summary.md had no grid line."""
    runs, rc, end, rows, text = grid_cost_on_a_fake_card(monkeypatch, tmp_path, cost)
    assert runs[:2] == [(2, "gmm", runs[0][2], True), (2, "attention_centroid", runs[1][2], True)], runs
    assert rc == 0 and end < 570 - 30, (rc, end)          # ended by itself, before the script's `timeout`
    assert "- the grid packed as measured (165 trials" in text, text
    assert [r["phase"] for r in rows if r["kind"] == "skipped"] == ["trials alone", "trials 2 at once, no MPS"]


def test_the_grid_pair_is_skipped_where_it_cannot_finish_even_in_the_reserve(monkeypatch, tmp_path):
    """A gmm pair of 420 s leaves 94 s before the hard deadline: the attention pair (200 s) is skipped, saying
    why, and the time goes to the check (no lone trial either: 1.1 x 110 are not left of the budget)."""
    cost = {(2, "gmm"): 420, (2, "attention_centroid"): 200, (1, "gmm"): 110}
    runs, rc, end, rows, text = grid_cost_on_a_fake_card(monkeypatch, tmp_path, cost)
    assert [r[:2] for r in runs] == [(2, "gmm")] and rc == 0 and end < 450
    skip = next(r for r in rows if r["kind"] == "skipped")
    assert skip["phase"] == "trials 2 at once, MPS, attention_centroid" and "needs 210 s" in skip["message"], skip
