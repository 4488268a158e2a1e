"""``cem_bench/bench/paper.py`` and ``scripts/gpu_pack.py --phases trials``: whole paper trials alone and packed,
the measurement behind the paper grid's GPU-hours (issue 40 item 5; docs/performance.md "The paper grid")."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from cem_bench.bench import paper


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
    import json

    spec = importlib.util.spec_from_file_location("gpu_pack_under_test", "scripts/gpu_pack.py")
    gpu_pack = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, gpu_pack)
    spec.loader.exec_module(gpu_pack)
    monkeypatch.setattr(sys, "argv", ["gpu_pack.py", "--phases", "trials", "--trials-no-mps", "--trials-epochs",
                                      "3", "--budget-s", "4000", "--out", str(tmp_path)])
    assert gpu_pack.main() == 0
    rows = [json.loads(line) for line in (tmp_path / "pack.jsonl").read_text().splitlines()]
    trials = [r for r in rows if r["kind"] == "trials"]
    assert [r["k"] for r in trials] == [1, 2, 2] and all(r["ok"] for r in trials)
    text = (tmp_path / "summary.md").read_text()
    assert "## whole paper trials (slices of 3 epochs with both attacks, extrapolated to 240" in text
    assert "- alone: slice span" in text and "- 2 at once, no MPS: slice span" in text
    assert "- 2 at once, MPS (MPS off):" in text                          # no MPS on this machine: said
