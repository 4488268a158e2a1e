"""``cem_bench/bench/paper.py`` and ``scripts/gpu_pack.py --phases trials``: whole paper trials alone and packed,
the measurement behind the paper grid's GPU-hours (issue 40 item 5; docs/performance.md "The paper grid")."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest
from conftest import process_alive

from cem_bench import mps
from cem_bench.bench import paper


def load_gpu_pack(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_pack_under_test", "scripts/gpu_pack.py")
    gpu_pack = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, gpu_pack)
    spec.loader.exec_module(gpu_pack)
    return gpu_pack


def fake_result(k: int, trial_gpu_s: float, span_s: float = 100.0) -> dict:
    """paper.measure's result for k trials that ran ``span_s`` together and cost ``trial_gpu_s`` each."""
    runs = [{"rc": 0, "start": 0.0, "end": span_s, "epoch_s": [1.0] * 3, "log": "", "attack_s": 1.0}] * k
    return {"k": k, "ok": True, "runs": runs, "span_s": span_s, "steady_epoch_s": 1.0, "trial_gpu_s": trial_gpu_s}


def rows_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / "pack.jsonl").read_text().splitlines()]


def test_the_paper_keys_are_the_grid_s_own():
    """The slice is cifar10_paper.yaml's trial: its fixed keys (fp32, 240 epochs, the 50-epoch res_normN8C64
    decoder on the training images), on synthetic data of CIFAR's size, with the attacks always run."""
    keys = paper.paper_keys(cuda=True)
    assert keys["train.amp"] == "off" and keys["train.epochs"] == paper.PAPER_EPOCHS == 240
    assert (keys["attack.epochs"], keys["attack.blocks"], keys["attack.channels"]) == (50, 8, 64)
    assert keys["data.attack_split"] == "training" and keys["model.width"] == 1.0
    assert (keys["data.dataset"], keys["data.train_size"], keys["data.test_size"]) == ("synthetic", 50000, 10000)
    assert keys["attack.min_accuracy_margin"] == -1 and keys["train.device"] == "cuda"
    tiny = paper.paper_keys(cuda=False)
    assert tiny["train.device"] == "cpu" and tiny["model.width"] < 1 and tiny["data.train_size"] < 1000


def test_train_args_and_epoch_seconds_round_trip_through_the_cli_s_words():
    args = paper.train_args({"a.b": 1, "c": True, "d": ["x", "y"]}, "/tmp/o")
    assert args == ["train", "--out", "/tmp/o", "--set", "a.b=1", "--set", "c=true", "--set", 'd=["x", "y"]']
    log = "epoch 1 train_loss=2.3 epoch_s=3.50 test_acc=0.1\nepoch 2 epoch_s=1.25\nsomething else\n"
    assert paper.epoch_seconds(log) == [3.5, 1.25]


def test_a_whole_trial_is_the_slice_plus_the_missing_epochs_at_the_steady_epoch():
    """A 10-epoch slice whose first two epochs are slow (capture, autotuning, CEM's start): the median of the
    rest is the steady epoch; the whole trial adds the 230 epochs the slice did not run."""
    assert paper.steady_epoch_s([[9.0, 3.0, 1.0, 1.0, 1.2]]) == pytest.approx(1.0)
    assert paper.steady_epoch_s([[9.0, 3.0, 1.0], [9.0, 3.0, 2.0, 2.0]]) == pytest.approx(2.0)   # pooled
    assert paper.steady_epoch_s([[4.0]]) == pytest.approx(4.0)            # too short to drop any
    assert paper.steady_epoch_s([]) is None
    assert paper.whole_trials_s(100.0, 10, 1.0) == pytest.approx(330.0)
    assert paper.whole_trials_s(100.0, 300, 1.0) == pytest.approx(100.0)   # nothing is missing


def fake_runs(spans: list[tuple[float, float]], epochs: list[float]) -> list[dict]:
    return [{"rc": 0, "start": s, "end": e, "epoch_s": list(epochs), "log": ""} for s, e in spans]


def test_measure_divides_the_span_of_k_trials_and_their_missing_epochs_by_k(monkeypatch):
    """One trial alone: a 100-s slice of 10 epochs at 1 s steady -> 330 GPU-s a whole trial. Two together: a
    150-s span from the first start to the last end, 1.6 s steady epochs -> (150 + 230 x 1.6) / 2 each."""
    seen = {}

    def together(keys, out_root, timeout, threads):
        seen.setdefault("seeds", []).append([k["seed"] for k in keys])
        if len(keys) == 1:
            return fake_runs([(0.0, 100.0)], [5.0, 2.0] + [1.0] * 8)
        return fake_runs([(0.0, 140.0), (0.5, 150.0)], [5.0, 2.0] + [1.6] * 8)
    monkeypatch.setattr(paper, "run_together", together)
    keys = {**paper.paper_keys(cuda=False), "seed": 125}
    alone = paper.measure(1, keys, "/nowhere", 60, epochs_done=10)
    pair = paper.measure(2, keys, "/nowhere", 60, epochs_done=10)
    assert seen["seeds"] == [[125], [125, 126]]                         # the packed trials are seeds apart
    assert alone["ok"] and alone["trial_gpu_s"] == pytest.approx(330.0)
    assert pair["span_s"] == pytest.approx(150.0) and pair["steady_epoch_s"] == pytest.approx(1.6)
    assert pair["trial_gpu_s"] == pytest.approx((150 + 230 * 1.6) / 2)
    alone["label"], pair["label"] = "alone", "2 at once, MPS"
    lines = paper.summary_lines(alone, [pair])
    assert lines[0].startswith("- alone: slice span 100.0 s") and "5.50 GPU-min" in lines[0]
    assert "165 trials 15.1 GPU-hours" in lines[0]
    assert lines[1].startswith("- 2 at once, MPS:") and f"{330 / ((150 + 230 * 1.6) / 2):.2f}x one at a time" \
        in lines[1]
    # another surrogate's pair is not set beside gmm's lone trial (its trial costs more for another reason)
    other = {**pair, "label": "2 at once, MPS, attention_centroid", "surrogate": "attention_centroid"}
    alone["surrogate"] = pair["surrogate"] = "gmm"
    lines = paper.summary_lines(alone, [pair, other])
    assert "one at a time" in lines[1] and "one at a time" not in lines[2]


def test_a_trial_that_failed_or_ran_out_of_time_gives_no_figure(monkeypatch):
    monkeypatch.setattr(paper, "run_together", lambda keys, out_root, timeout, threads: [
        {"rc": 0, "start": 0.0, "end": 10.0, "epoch_s": [1.0], "log": ""},
        {"rc": 124, "start": 0.0, "end": None, "epoch_s": [], "log": "killed"}])
    r = paper.measure(2, paper.paper_keys(cuda=False), "/nowhere", 1, epochs_done=3)
    assert r["ok"] is False and "trial_gpu_s" not in r
    r["label"] = "2 at once"
    alone = {"label": "alone", "ok": False, "runs": [{"rc": 1, "log": "Traceback ..."}]}
    lines = paper.summary_lines(alone, [r])
    assert lines[0].startswith("- alone: failed (return codes [1]): 'Traceback ...'")
    assert lines[1].startswith("- 2 at once: failed (return codes [0, 124]): 'killed'")   # the failed one's log
    # a run that printed no epoch (its output not as epoch_seconds reads it) gives no figure either
    monkeypatch.setattr(paper, "run_together", lambda keys, out_root, timeout, threads: [
        {"rc": 0, "start": 0.0, "end": 10.0, "epoch_s": [], "log": "no epochs"}])
    assert paper.measure(1, paper.paper_keys(cuda=False), "/nowhere", 1, epochs_done=3)["ok"] is False


def test_the_grid_s_trials_are_counted_from_its_own_space():
    """cifar10_paper.yaml: 5 sigmas x (lambda = 0, then gmm and the four attention surrogates at 2 lambdas) x 3
    seeds. The count is read from the space, so an edit of its grid changes the bracket with it."""
    counts = paper.grid_trials()
    assert counts == {"lambda=0": 15, "gmm": 30, "gated_attention": 30, "slot_cross": 30, "attention_centroid": 30,
                      "serial_enhanced": 30}
    assert sum(counts.values()) == 165                                   # 55 cells x 3 seeds
    assert paper.paper_keys(cuda=True, surrogate="attention_centroid")["cem.surrogate"] == "attention_centroid"


def test_the_grid_is_bracketed_by_gmm_s_trial_and_the_attention_surrogates_own():
    """gmm's packed trial 300 GPU-s, attention_centroid's 400: every trial at gmm's is 165 x 300 s; with each
    surrogate's own, lambda = 0 and gmm at 300 and the 120 attention trials at 400 (the three not measured at
    attention_centroid's, said). A failed pair or no attention pair gives no bracket."""
    counts = paper.grid_trials()
    packed = [{"ok": True, "surrogate": "gmm", "trial_gpu_s": 300.0},
              {"ok": False, "surrogate": "attention_centroid"},
              {"ok": True, "surrogate": "attention_centroid", "trial_gpu_s": 400.0}]
    line, = paper.grid_lines(packed, counts)
    assert f"{165 * 300 / 3600:.1f} GPU-hours with every trial at gmm's cost" in line
    assert f"{(45 * 300 + 120 * 400) / 3600:.1f} with each surrogate's own" in line
    assert "(gated_attention, serial_enhanced, slot_cross at attention_centroid's, the dearest measured)" in line
    assert paper.grid_lines(packed[:2], counts) == []                       # no attention trial measured
    assert paper.grid_lines(packed[1:], counts) == []                       # no gmm trial
    every = packed[:1] + [{"ok": True, "surrogate": s, "trial_gpu_s": 400.0}
                          for s in counts if s not in ("lambda=0", "gmm")]
    assert paper.grid_lines(every, counts)[0].endswith("with each surrogate's own")   # nothing stood in for


@pytest.mark.slow
def test_two_real_trials_run_together_and_are_timed_from_their_own_ends(tmp_path):
    """Two tiny ``cem-bench train`` processes at once: both finish, each with its epochs and metrics read and
    its folder removed; a third run past its timeout is killed and has no end (a figure from it is refused)."""
    keys = {**paper.paper_keys(cuda=False), "train.epochs": 2}
    runs = paper.run_together([keys, {**keys, "seed": 126}], str(tmp_path), timeout=240, threads=1)
    assert [r["rc"] for r in runs] == [0, 0], [r["log"][-500:] for r in runs]
    for r in runs:
        assert len(r["epoch_s"]) == 2 and r["end"] > r["start"] and r["epochs_done"] == 2
        assert r["attack_s"] > 0 and r["train_s"] > 0
    assert list(tmp_path.iterdir()) == []                               # checkpoints and images are not kept
    killed = paper.run_together([keys], str(tmp_path), timeout=0.2, threads=1)[0]
    assert killed["rc"] == 124 and killed["end"] is None
    # one that fails (a bad key: exit 2 before any work) stops the other at once instead of letting it run on
    bad = paper.run_together([{**keys, "train.epochs": 10000}, {**keys, "cem.lambd": -1}], str(tmp_path),
                             timeout=240, threads=1)
    assert [r["rc"] for r in bad] == [125, 2] and bad[0]["end"] is None    # 125, not the timeout's 124


@pytest.mark.slow
def test_gpu_pack_s_trials_phase_dry_runs_on_the_cpu_and_writes_its_summary(tmp_path, monkeypatch):
    """``scripts/gpu_pack.py --phases trials --trials-no-mps`` on the CPU: each row in pack.jsonl as it ends, the
    summary with the lone trial and both packings (MPS cannot start here and the line says so). The budget is a
    cap no box reaches (the phase takes 36 s in CI): on the CPU it decides nothing but what runs, all of it."""
    gpu_pack = load_gpu_pack(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["gpu_pack.py", "--phases", "trials", "--trials-no-mps", "--trials-epochs",
                                      "3", "--budget-s", "4000", "--out", str(tmp_path)])
    before = signal.getsignal(signal.SIGTERM)
    assert gpu_pack.main() == 0
    assert signal.getsignal(signal.SIGTERM) is before        # its SIGTERM handler does not outlive it
    trials = [r for r in rows_of(tmp_path) if r["kind"] == "trials"]
    # the pair first, then alone; the dry run (MPS never wanted on the CPU) runs the no-MPS pair too
    assert [r["k"] for r in trials] == [2, 1, 2] and all(r["ok"] for r in trials)
    text = (tmp_path / "summary.md").read_text()
    assert "## whole paper trials (slices of 3 epochs with both attacks, extrapolated to 240" in text
    assert "- alone: slice span" in text and "- 2 at once, no MPS: slice span" in text
    assert "- 2 at once, MPS (MPS off):" in text                          # no MPS on this machine: said


def test_no_trial_outlives_run_together_when_it_is_interrupted(tmp_path, monkeypatch):
    """gpu_pack's SIGTERM handler raises SystemExit inside run_together's wait: the `cem-bench train` processes
    ran on (a lent card's time), and recreated trial0/ in the caller's temporary folder after it was removed.
    Now every process it started has ended and been waited for before the exception leaves it."""
    started = []

    class Interrupted(subprocess.Popen):
        polled = False

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            started.append(self)

        def poll(self):
            if not Interrupted.polled:         # the wait loop's first look, with every trial started
                Interrupted.polled = True
                raise SystemExit(143)          # what gpu_pack's SIGTERM handler raises
            return super().poll()
    monkeypatch.setattr(paper.subprocess, "Popen", Interrupted)
    keys = paper.paper_keys(cuda=False)
    try:
        with pytest.raises(SystemExit):
            paper.run_together([keys, {**keys, "seed": 1}], str(tmp_path), timeout=240, threads=1)
        assert len(started) == 2
        assert [p.returncode for p in started if p.returncode is None] == [], "a trial still runs"
        assert [p.pid for p in started if os.path.exists(f"/proc/{p.pid}")] == []    # ended and reaped
    finally:
        for p in started:                      # the old code's survivors: not left to the next test
            if p.returncode is None:
                p.kill()
                p.wait()


def test_gpu_pack_measures_the_grid_s_pairs_first_and_keeps_its_summary_when_ended(tmp_path, monkeypatch):
    """The device call ends gpu_pack with SIGTERM (SystemExit in its handler). summary.md, written only at the
    end, was lost with every pair measured before; now it is written after each row. The two pairs the grid's
    GPU-hours need run first (gmm's and the attention surrogate's), and the lone trial after; where MPS did not
    start (the CPU here), the grid's line comes from the pairs without it, said so. Its SIGTERM handler is the
    caller's again afterwards."""
    gpu_pack = load_gpu_pack(monkeypatch)
    calls = []

    def measure(k, keys, out_root, timeout, epochs_done, threads=2):
        calls.append((k, keys["cem.surrogate"]))
        if len(calls) == 3:
            raise SystemExit(143)              # the device call's limit, during the third run
        return fake_result(k, 300.0 if keys["cem.surrogate"] == "gmm" else 400.0)
    monkeypatch.setattr(paper, "measure", measure)
    monkeypatch.setattr(sys, "argv", ["gpu_pack.py", "--phases", "trials", "--trials-surrogates", "gmm",
                                      "attention_centroid", "--trials-no-mps", "--budget-s", "4000", "--out",
                                      str(tmp_path)])
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit):
            gpu_pack.main()
        text = (tmp_path / "summary.md").read_text()
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, before)
    assert calls == [(2, "gmm"), (2, "attention_centroid"), (1, "gmm")]
    assert "- 2 at once, MPS (MPS off): slice span 100.0 s" in text
    assert "- 2 at once, MPS, attention_centroid (MPS off): slice span 100.0 s" in text
    assert (f"- the grid packed as measured without MPS (165 trials: lambda=0 15, gmm 30, gated_attention 30, "
            f"slot_cross 30, attention_centroid 30, serial_enhanced 30): {165 * 300 / 3600:.1f} GPU-hours") in text
    assert sorted(os.listdir(tmp_path)) == ["pack.jsonl", "summary.md"]   # no half-written file left beside it
    assert [r["label"] for r in rows_of(tmp_path) if r["kind"] == "trials"] == [
        "2 at once, MPS (MPS off)", "2 at once, MPS, attention_centroid (MPS off)"]


def test_gpu_pack_s_budget_ends_at_the_caller_s_deadline(tmp_path, monkeypatch, capsys):
    """gpu_grid_cost.sh's `timeout` starts before gpu_pack's `import torch` (10-20 s cold), gpu_pack's own budget
    after it: --deadline, on the caller's clock, ends the budget where the caller counted it. A deadline already
    past starts nothing, and writes its rows and summary; a length passed as the deadline is refused."""
    gpu_pack = load_gpu_pack(monkeypatch)
    monkeypatch.setattr(paper, "measure", lambda *a, **kw: pytest.fail("a run started past the deadline"))
    argv = ["gpu_pack.py", "--phases", "trials", "--trials-surrogates", "gmm", "attention_centroid",
            "--trials-no-mps", "--budget-s", "4000", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*argv, "--deadline", str(time.time() - 1)])
    assert gpu_pack.main() == 0
    skipped = [r for r in rows_of(tmp_path) if r["kind"] == "skipped"]
    assert len(skipped) == 4 and all(r["left"] < 0 for r in skipped), skipped
    assert (tmp_path / "summary.md").exists()
    monkeypatch.setattr(sys, "argv", [*argv, "--deadline", "500"])
    with pytest.raises(SystemExit) as e:
        gpu_pack.main()
    assert e.value.code == 2 and "--deadline 500 is not a time" in capsys.readouterr().err


def plan_on_a_card(gpu_pack, monkeypatch, cost: dict, mps_state: str, budget: float):
    """trials_phase as on a card (cuda=True) with paper.measure replaced: each run takes ``cost[(k, surrogate)]``
    seconds off a clock of ``budget`` and MPS ends in ``mps_state``; the events and summary.md's lines."""
    clock = {"left": budget}

    def measure(k, keys, out_root, timeout, epochs_done, threads=2):
        s = keys["cem.surrogate"]
        clock["left"] -= cost[(k, s)]
        return fake_result(k, 300.0 if s == "gmm" else 400.0, span_s=cost[(k, s)])

    class Session:
        def __init__(self, *a, **kw):
            self.state = mps_state

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass
    monkeypatch.setattr(paper, "measure", measure)
    monkeypatch.setattr(mps, "Session", Session)
    monkeypatch.setattr(mps, "running", lambda: False)
    monkeypatch.setattr(mps, "servers", lambda: "rc 0")
    events, summary = [], {}
    args = types.SimpleNamespace(trials_epochs=10, trials_surrogates=["gmm", "attention_centroid"],
                                 trials_no_mps=True)
    gpu_pack.trials_phase(args, True, lambda: clock["left"], lambda kind, **r: events.append((kind, r)), summary)
    return events, summary


@pytest.mark.parametrize("over", [1.0, 1.2])
def test_on_a_card_the_grid_line_comes_from_pairs_run_first(tmp_path, monkeypatch, over):
    """With the 520 s gpu_grid_cost.sh gives the trials (15 s of them a cold start), at the estimates and with
    every run 20 % over them: the two pairs the grid line needs were third and second after the lone trial, and
    at 20 % over the attention pair was skipped and the grid had no GPU-hours. Now they run first."""
    gpu_pack = load_gpu_pack(monkeypatch)
    cost = {(2, "gmm"): 170 * over, (2, "attention_centroid"): 180 * over, (1, "gmm"): 110 * over}
    events, summary = plan_on_a_card(gpu_pack, monkeypatch, cost, "started", 505.0)
    ran = [(r["k"], r["surrogate"]) for kind, r in events if kind == "trials"]
    assert ran[:2] == [(2, "gmm"), (2, "attention_centroid")]
    assert ran[2:] == ([(1, "gmm")] if over == 1.0 else [])        # alone only with the time they leave
    gpu_pack.write_summary(str(tmp_path), {"device": "H100", "torch": "2.11", "commit": "0" * 40}, summary,
                           echo=False)
    text = (tmp_path / "summary.md").read_text()
    assert "- the grid packed as measured (165 trials" in text and f"{165 * 300 / 3600:.1f} GPU-hours" in text


def test_where_mps_does_not_start_on_a_card_the_no_mps_pair_is_not_run_again(tmp_path, monkeypatch):
    """MPS that cannot start on the card: both pairs ran without it, and were left out of the grid line (only
    pairs under MPS counted: no GPU-hours at all), while the no-MPS pair measured gmm's again. Now the grid line
    is given from the pairs as they ran, labelled "without MPS", and the duplicate is skipped, saying why."""
    gpu_pack = load_gpu_pack(monkeypatch)
    cost = {(2, "gmm"): 170, (2, "attention_centroid"): 180, (1, "gmm"): 110}
    events, summary = plan_on_a_card(gpu_pack, monkeypatch, cost, "not started: no permission", 4000.0)
    ran = [(r["k"], r["surrogate"]) for kind, r in events if kind == "trials"]
    assert ran == [(2, "gmm"), (2, "attention_centroid"), (1, "gmm")]
    skip, = [r for kind, r in events if kind == "skipped"]
    assert skip["phase"] == "trials 2 at once, no MPS" and "already ran 2 at once without MPS" in skip["message"]
    gpu_pack.write_summary(str(tmp_path), {"device": "H100", "torch": "2.11", "commit": "0" * 40}, summary,
                           echo=False)
    text = (tmp_path / "summary.md").read_text()
    assert "- 2 at once, MPS (MPS not started: no permission): slice span 170.0 s" in text
    assert "- the grid packed as measured without MPS (165 trials" in text


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` and that run `cem-bench train` (read from /proc)."""
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"cem_bench.cli" in cmd:
            kids.append(int(d))
    return kids


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the processes from /proc")
def test_sigterm_ends_gpu_pack_with_its_summary_and_no_trial_left_running(tmp_path):
    """`timeout`'s SIGTERM during the second pair (the device call's end, as gpu_grid_cost.sh gives it): the first
    pair is in summary.md, and neither trial of the pair being measured outlives gpu_pack. Before, summary.md was
    never written and both `cem-bench train` processes ran on."""
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    err = open(tmp_path / "stderr.txt", "w")
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([sys.executable, "scripts/gpu_pack.py", "--phases", "trials", "--trials-surrogates", "gmm",
                          "attention_centroid", "--trials-epochs", "3", "--budget-s", "4000", "--out", str(out)],
                         env=env, stdout=subprocess.DEVNULL, stderr=err)
    kids = []
    try:
        give_up = time.monotonic() + 600        # a bound on a hung run, not a measurement
        while '"kind": "trials"' not in ((out / "pack.jsonl").read_text() if (out / "pack.jsonl").exists()
                                         else ""):
            assert p.poll() is None and time.monotonic() < give_up, (tmp_path / "stderr.txt").read_text()[-2000:]
            time.sleep(0.2)
        while len(kids) < 2:                    # the attention pair's two trials, started
            assert p.poll() is None and time.monotonic() < give_up, (tmp_path / "stderr.txt").read_text()[-2000:]
            kids = _children(p.pid)
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 143
        assert [k for k in kids if process_alive(k)] == [], "a trial outlived gpu_pack"
        text = (out / "summary.md").read_text()
        assert "- 2 at once, MPS (MPS off): slice span" in text             # the pair measured before the end
        assert "- 2 at once, MPS, attention_centroid" not in text            # the one cut off: no figure
    finally:
        err.close()
        if p.poll() is None:
            p.kill()
            p.wait()
        for k in kids:                          # the old code's survivors: not left to run on
            if process_alive(k):
                os.kill(k, signal.SIGKILL)


def test_a_grid_line_from_pairs_of_different_mps_states_says_which_ran_without(tmp_path, monkeypatch):
    """MPS started for gmm's pair and not for the attention pair (or the other way round): each subset, under MPS
    and without, lacked one end, and summary.md had no grid line though both pairs were measured. Now the line
    comes from both, labelled with the pair that ran without MPS."""
    gpu_pack = load_gpu_pack(monkeypatch)
    gmm = {**fake_result(2, 300.0), "label": "2 at once, MPS", "surrogate": "gmm", "mps": "started"}
    att = {**fake_result(2, 400.0), "label": "2 at once, MPS, attention_centroid (MPS not started: no permission)",
           "surrogate": "attention_centroid", "mps": "not started: no permission"}
    for packed, which in (([gmm, att], "attention_centroid's pair (MPS not started)"),
                          ([{**gmm, "mps": "not started: x", "label": "2 at once, MPS (MPS not started: x)"},
                            {**att, "mps": "started", "label": "2 at once, MPS, attention_centroid"}],
                           "gmm's pair (MPS not started)")):
        summary = {"trials": {"trials": {"alone": None, "packed": packed, "epochs": 10, "surrogate": "gmm"}}}
        gpu_pack.write_summary(str(tmp_path), {"device": "H100", "torch": "2.11", "commit": "0" * 40}, summary,
                               echo=False)
        text = (tmp_path / "summary.md").read_text()
        assert (f"- the grid packed as measured partly without MPS: {which} (165 trials: lambda=0 15, gmm 30"
                in text), text
        assert f"{165 * 300 / 3600:.1f} GPU-hours with every trial at gmm's cost" in text


def test_the_ratio_of_the_pair_that_ran_cold_says_it_understates_packing(tmp_path, monkeypatch):
    """The first pair pays the machine's cold start, the lone trial after it does not: "N x one at a time" beside
    the first pair understates packing's gain, and the line says so; a pair that did not run first does not."""
    gpu_pack = load_gpu_pack(monkeypatch)
    alone = {**fake_result(1, 360.0), "label": "alone", "surrogate": "gmm", "mps": "off"}
    cold = {**fake_result(2, 300.0), "label": "2 at once, MPS", "surrogate": "gmm", "mps": "started", "cold": True}
    warm = {**fake_result(2, 330.0), "label": "2 at once, no MPS", "surrogate": "gmm", "mps": "off"}
    summary = {"trials": {"trials": {"alone": alone, "packed": [cold, warm], "epochs": 10, "surrogate": "gmm"}}}
    gpu_pack.write_summary(str(tmp_path), {"device": "H100", "torch": "2.11", "commit": "0" * 40}, summary,
                           echo=False)
    lines = (tmp_path / "summary.md").read_text().splitlines()
    first = next(line for line in lines if line.startswith("- 2 at once, MPS:"))
    other = next(line for line in lines if line.startswith("- 2 at once, no MPS:"))
    assert "1.20x one at a time (this pair ran first, on a cold machine" in first and "understates" in first
    assert other.endswith("x one at a time"), other


@pytest.mark.parametrize("script, argv", [
    ("pack", ["--budget-s", "nan"]), ("pack", ["--budget-s", "-5"]), ("pack", ["--trials-epochs", "-1"]),
    ("check", ["--budget-s", "nan"]), ("check", ["--budget-s", "-1"]), ("check", ["--equivalence-cap-s", "inf"]),
])
def test_the_gpu_scripts_refuse_a_budget_that_is_no_limit(tmp_path, monkeypatch, capsys, script, argv):
    """2026-12-07 probe: gpu_pack.py --budget-s nan measured with no limit until killed; a negative budget
    measured nothing and exited 0, as gpu_check.py's did. Each is now argparse's one line and exit 2, nothing
    measured or written."""
    if script == "pack":
        module = load_gpu_pack(monkeypatch)
    else:
        from test_gpu_path import load_gpu_check
        module = load_gpu_check(monkeypatch)
    monkeypatch.setenv("OUT", str(tmp_path / "o"))   # gpu_check's output folder
    with pytest.raises(SystemExit) as e:
        module.main([*argv, *(["--out", str(tmp_path / "o")] if script == "pack" else [])])
    assert e.value.code == 2 and "is not a " in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
