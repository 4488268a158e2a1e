"""The capturable training step (train.cuda_graph, cem_bench/core/graphs.py).

On the CPU: the static form of the step that a CUDA graph captures — learning rate, the CEM loss's weight and
the encoder's multiplier as device tensors, the same accumulators every step — trains exactly as the eager step with
Python floats, for every surrogate and both gradient modes. On CUDA (skipped here): the graphed trainer
equals the eager one after its warm-up, capture and replays.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, build_tiny

from cem_bench import surrogates
from cem_bench.config import ConfigError, TrialConfig
from cem_bench.core import data
from cem_bench.core.schedule import lr_at
from cem_bench.core.step_options import graph_mode
from cem_bench.core.trial import build, build_config

CASES = [(s, g) for s in surrogates.names() for g in ("inject", "fused")]


def _trainer(flat):
    cfg, splits, tr = build_tiny(**flat)
    tr.prepare_steps(tr.surrogate is not None)
    return cfg, splits, tr


@pytest.mark.parametrize("name, grad_mode", CASES)
def test_static_step_equals_the_eager_step(name, grad_mode):
    flat = {"cem.surrogate": name, "cem.lambd": 4.0, "cem.grad_mode": grad_mode, "defense.noise_std": 0.1}
    cfg, splits, eager = _trainer(flat)
    _, _, static = _trainer(flat)
    lr = lr_at(cfg, 1) * 0.5
    static._lr_tensor = torch.tensor(lr)          # what a graphed trainer holds
    static._install_lr()
    eager.set_lr(lr)
    weight, mult = static.cem_scales(lr)
    weight_t, mult_t = torch.tensor(weight), torch.tensor(mult)
    acc_e, acc_s = eager.epoch_acc(), static.epoch_acc()
    gen = torch.Generator().manual_seed(1)
    batches = [b for _, b in zip(range(3), data.BatchIterator(splits.train, splits, cfg.train.batch_size, "none",
                                                               gen))]
    torch.manual_seed(5)                          # the server's dropout draws from the global generator
    for x, y in batches:
        eager.step(x, y, True, lr, acc_e)
    torch.manual_seed(5)
    for x, y in batches:
        static.step_body(x, y, True, weight_t, mult_t, acc_s)
    for a, b in zip([*eager.client.parameters(), *eager.server.parameters(), *eager.surrogate.parameters()],
                    [*static.client.parameters(), *static.server.parameters(), *static.surrogate.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert set(acc_e) == set(acc_s) and all(torch.allclose(acc_e[k], acc_s[k]) for k in acc_e)
    assert float(acc_e["seen"]) == 3 * cfg.train.batch_size


def test_lr_tensor_follows_the_schedule_in_place():
    cfg, _, tr = _trainer({"cem.lambd": 0})
    tr._lr_tensor = torch.tensor(1.0)
    tr._install_lr()
    tr.set_lr(0.01)
    assert all(g["lr"] is tr._lr_tensor for o in (tr.client_opt, tr.server_opt) for g in o.param_groups)
    assert float(tr._lr_tensor) == pytest.approx(0.01)
    state = tr.state_dict()                      # a graphed run's checkpoint resumes anywhere
    _, _, other = _trainer({"cem.lambd": 0})
    other.load_state_dict(state)
    assert all(isinstance(g["lr"], float) for g in other.client_opt.param_groups)


def test_graph_mode_follows_the_key_and_the_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    auto = TrialConfig.from_flat({})
    assert not graph_mode(auto, cpu) and graph_mode(auto, cuda)
    assert not graph_mode(auto.replace(**{"train.compile": True}), cuda)
    assert not graph_mode(auto.replace(**{"train.cuda_graph": "off"}), cuda)
    with pytest.raises(ConfigError, match="train.cuda_graph=on needs a CUDA device"):
        graph_mode(auto.replace(**{"train.cuda_graph": "on"}), cpu)
    with pytest.raises(ConfigError, match="train.cuda_graph: 'on' needs a CUDA device but train.device is cpu"):
        TrialConfig.from_flat({"train.cuda_graph": "on", "train.device": "cpu"})


@pytest.mark.parametrize("name", ["lambda=0", *surrogates.names()])
def test_step_by_step_comparison_carries_the_whole_state(name):
    """compare_step_by_step loads the first copy's whole state into the eager copies before each step: copies
    made with another seed (other weights, optimizer states, noise and surrogate random streams) then take
    exactly the first copy's steps, defense noise, dropout and slot noise included. The CUDA tests compare the
    graphed step with the eager one this way."""
    from cem_bench.bench.equivalence import compare_step_by_step, steps_agree
    flat = {**TINY, "defense.noise_std": 0.1,
            **({"cem.lambd": 0} if name == "lambda=0" else {"cem.surrogate": name, "cem.lambd": 4.0})}
    res = compare_step_by_step(flat, steps=2, device="cpu", random=True, mode="off", eager_flat={"seed": 1})
    assert all(s > 1e-4 for s in res["size"])
    for k in ("diff", "floor", "grad_rel", "grad_floor", "surrogate_grad_rel", "surrogate_grad_floor",
              "surrogate_moved", "surrogate_moved_floor"):
        assert res[k] == [0.0, 0.0], (k, res)
    assert steps_agree(res)


def test_step_by_step_comparison_catches_a_different_step(monkeypatch):
    """A step that is not the eager one fails ``steps_agree``: the CEM loss at twice its weight moves the encoder
    by 5e-3 of its update and its gradients by 2e-2 (a compiled surrogate's rounding: about 1e-6 and 1e-5);
    copies that miss the surrogate's random stream move the encoder alike to 5e-4 of its update, but the
    surrogate's gradients differ by more than their size and most of its entries move differently."""
    from cem_bench.bench.equivalence import compare_step_by_step, steps_agree
    from cem_bench.core.trainer import Trainer
    # the weight these numbers were measured at (slot_cross's seed weight; its calibrated default is 0.93)
    flat = {**TINY, "cem.surrogate": "slot_cross", "cem.lambd": 4.0, "cem.loss_scale": 0.25, "defense.noise_std": 0.1}
    res = compare_step_by_step(flat, steps=2, device="cpu", random=True, mode="off", eager_flat={"cem.lambd": 8.0})
    assert not steps_agree(res), res
    load = Trainer.load_state_dict
    monkeypatch.setattr(Trainer, "load_state_dict", lambda self, state: load(self, {**state, "surrogate_gen": None}))
    res = compare_step_by_step(flat, steps=2, device="cpu", random=True, mode="off", eager_flat={"seed": 1})
    assert max(d / s for d, s in zip(res["diff"], res["size"])) < 1e-3, res
    assert min(res["surrogate_grad_rel"]) > 1 and min(res["surrogate_moved"]) > 0.5, res
    assert not steps_agree(res)


@pytest.mark.slow
def test_a_compiled_surrogate_step_is_the_eager_step_to_rounding():
    """train.compile_surrogate judged step by step on the CPU: Inductor's code for the surrogate differs from
    the eager surrogate by rounding only, within steps_agree's bounds (the same bounds the CUDA tests hold the
    graphed steps to)."""
    from cem_bench.bench.equivalence import compare_step_by_step, steps_agree
    flat = {**TINY, "defense.noise_std": 0.1, "cem.surrogate": "slot_cross", "cem.hidden_dim": 16,
            "cem.num_heads": 2, "cem.lambd": 4.0, "train.compile_surrogate": True}
    res = compare_step_by_step(flat, steps=3, device="cpu", random=True, mode="off",
                               eager_flat={"train.compile_surrogate": False})
    assert steps_agree(res), res
    assert max(res["grad_rel"]) > 0, res     # compiled code, not the eager one again: rounding differs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("random", [False, True], ids=["plain", "noise+dropout"])
@pytest.mark.parametrize("name", ["lambda=0", *surrogates.names()])
def test_graphed_step_equals_eager_on_cuda(name, random):
    """Every step of the graphed trainer (3 eager warm-up steps, the capture, 5 replays) is the eager step from
    the same state, to rounding (compare_step_by_step). Whole runs are not compared: a surrogate's CUDA
    kernels add with atomics, and its Adam and hard assignments amplify the last bits step by step (on an
    H100 two eager runs of slot_cross differed by 4e-7 once and 5e-3 another time)."""
    from cem_bench.bench.equivalence import compare_step_by_step, steps_agree
    from cem_bench.core.graphs import WARMUP_STEPS
    flat = {**TINY, "train.amp": "off",
            **({"cem.lambd": 0} if name == "lambda=0" else {"cem.surrogate": name, "cem.lambd": 4.0})}
    res = compare_step_by_step(flat, steps=WARMUP_STEPS + 5, random=random)
    assert res["cuda_graph_captures"] == 1 and res["cuda_graph_replays"] == 5 and not res["cuda_graph_failed"]
    assert steps_agree(res), res


def test_warm_up_and_capture_schedule(monkeypatch):
    """GraphedStep's schedule, without a GPU (the capture and the side stream replaced by their eager
    bodies): 3 eager warm-up steps, then one capture and replays. The surrogate's log accumulator, which the
    first warm-up step adds to ``acc``, does not restart the warm-up (it did: 4 eager steps, measured on the
    H100); switching CEM on does, and captures again."""
    from cem_bench.core import graphs

    class Replayed:   # what ``capture`` returns: replay() runs the captured body
        def __init__(self, fn):
            self.fn = fn

        def replay(self):
            self.fn()

    monkeypatch.setattr(graphs, "on_side_stream", lambda fn, device: fn())
    monkeypatch.setattr(graphs, "capture", lambda fn, device, gens: Replayed(fn))
    cfg, splits, tr = _trainer({"cem.surrogate": "slot_cross", "cem.lambd": 4.0})
    # the trainer's one hop: Trainer.step hands step_body to the generic graphed step (CUDA builds it itself)
    tr.graph_step = step = graphs.GraphedStep(tr.device, False, "training step", n_scalars=2)
    acc = tr.epoch_acc()
    gen = torch.Generator().manual_seed(1)
    x, y = next(iter(data.BatchIterator(splits.train, splits, cfg.train.batch_size, "none", gen)))
    for _ in range(graphs.WARMUP_STEPS + 5):
        tr.step(x, y, True, lr_at(cfg, 1), acc)
    assert "surr" in acc
    assert (step.eager_steps, step.captures, step.replays) == (graphs.WARMUP_STEPS, 1, 5)
    weight, mult = tr.cem_scales(lr_at(cfg, 1))       # the host values, in the graph's device scalars
    assert float(step.scalars[0]) == pytest.approx(weight) and float(step.scalars[1]) == pytest.approx(mult)
    assert torch.equal(step.static[0], x) and step.static[0].is_contiguous(memory_format=torch.channels_last)
    acc0 = tr.epoch_acc()
    for cem_on in (False, False, False, False, True):   # a new step structure each: warm up again, capture again
        tr.step(x, y, cem_on, lr_at(cfg, 1), acc0 if not cem_on else acc)
    assert (step.eager_steps, step.captures, step.replays) == (2 * graphs.WARMUP_STEPS + 1, 2, 6)


def test_the_graphed_step_knows_nothing_of_the_trainer():
    """graphs.py names no trainer attribute: the step body, its inputs, its scalars, its signature and its
    generators are handed in (issue 37: the graph code used to reach back into the trainer by duck typing)."""
    import ast
    import inspect

    from cem_bench.core import graphs
    tree = ast.parse(inspect.getsource(graphs))
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & {"trainer", "step_body", "cem_scales", "ACC_KEYS", "surrogate", "gen"}


@pytest.mark.parametrize("strict", [False, True])
def test_a_failed_capture_runs_eager_steps_under_auto_and_raises_under_on(monkeypatch, strict):
    """CaptureSchedule, which the trainer's and the decoder attack's graphed steps share: after the warm-up a
    capture that fails is reported once and every later step runs eagerly on the live inputs
    (train.cuda_graph=auto), or raises (on). The decoder's graphed step raised under auto too before it
    shared the schedule."""
    from cem_bench.core import graphs

    def no_capture(fn, device, gens):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "on_side_stream", lambda fn, device: fn())
    monkeypatch.setattr(graphs, "capture", no_capture)
    sched = graphs.CaptureSchedule(torch.device("cpu"), strict, "test step")
    ran = []
    run = lambda i: sched.run(lambda: ran.append(("eager", i)), lambda: ran.append(("captured", i)),  # noqa: E731
                              lambda: None)
    for i in range(graphs.WARMUP_STEPS):
        run(i)
    if strict:
        with pytest.raises(RuntimeError, match="capturing"):
            run(graphs.WARMUP_STEPS)
        return
    for i in range(graphs.WARMUP_STEPS, graphs.WARMUP_STEPS + 3):
        run(i)
    assert ran == [("eager", i) for i in range(graphs.WARMUP_STEPS + 3)]
    assert sched.stats() == {"cuda_graph_captures": 0, "cuda_graph_replays": 0,
                             "cuda_graph_eager_steps": graphs.WARMUP_STEPS + 3,
                             "cuda_graph_failed": "RuntimeError: operation not permitted when stream is capturing"}


def test_surrogate_stream_is_ignored_on_the_cpu():
    """train.surrogate_stream is CUDA only: on the CPU the step is the one-stream step, to the bit."""
    flat = {"cem.surrogate": "slot_cross", "cem.lambd": 4.0, "defense.noise_std": 0.1}
    runs = []
    for on in (False, True):
        cfg, splits, tr = _trainer({**flat, "train.surrogate_stream": on})
        assert tr.side_stream is None
        gen = torch.Generator().manual_seed(1)
        torch.manual_seed(5)
        for _, (x, y) in zip(range(2), data.BatchIterator(splits.train, splits, cfg.train.batch_size, "none", gen)):
            tr.step(x, y, True, lr_at(cfg, 1), tr.epoch_acc())
        runs.append([p.detach().clone() for m in (tr.client, tr.server, tr.surrogate) for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", surrogates.names())
def test_surrogate_stream_step_equals_one_stream_on_cuda(name):
    """The surrogate on its own stream (train.surrogate_stream), graphed, trains as the one-stream eager step:
    streams change when kernels run, not what they compute; and so does its eager two-stream step."""
    from cem_bench.bench.equivalence import compare_step_by_step, steps_agree
    from cem_bench.core.graphs import WARMUP_STEPS
    flat = {**TINY, "train.amp": "off", "cem.surrogate": name, "cem.lambd": 4.0, "train.surrogate_stream": True,
            "train.compile_surrogate": False}
    for eager_flat in ({"train.surrogate_stream": False}, None):
        res = compare_step_by_step(flat, steps=WARMUP_STEPS + 5, eager_flat=eager_flat)
        assert res["cuda_graph_captures"] == 1 and res["cuda_graph_replays"] == 5 and not res["cuda_graph_failed"]
        assert steps_agree(res), res


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", surrogates.names())
def test_compiled_surrogate_graphed_equals_compiled_eager_on_cuda(name):
    """train.compile_surrogate inside the graph, on the surrogate's own stream: the captured replays of the
    compiled kernels train as the compiled eager steps on one stream (no noise or dropout; scripts/gpu_check.py
    also runs them with both)."""
    from cem_bench.bench.equivalence import compare_step_by_step, steps_agree
    from cem_bench.core.graphs import WARMUP_STEPS
    flat = {**TINY, "train.amp": "off", "cem.surrogate": name, "cem.lambd": 4.0, "train.surrogate_stream": True,
            "train.compile_surrogate": True}
    res = compare_step_by_step(flat, steps=WARMUP_STEPS + 5, eager_flat={"train.surrogate_stream": False})
    assert res["cuda_graph_captures"] == 1 and res["cuda_graph_replays"] == 5 and not res["cuda_graph_failed"]
    assert steps_agree(res), res


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_graphed_decoder_attack_equals_eager_on_cuda():
    """The decoder's graphed training step draws the eager step's noise and gives its losses (measured on an
    H200: the same training MSE every epoch, SSIM 0.6915 vs 0.6916)."""
    from cem_bench import attacks
    out = {}
    for mode in ("on", "off"):
        cfg = build_config({**TINY, "train.device": "cuda", "train.cuda_graph": mode, "data.test_size": 1000,
                            "attack.names": ["decoder"], "attack.epochs": 3, "attack.batch_size": 64})
        splits, tr = build(cfg, torch.device("cuda"))
        out[mode] = attacks.build(cfg, "decoder").run(tr.client, splits, 0.05, "cuda")
    assert out["on"].history[-1]["cuda_graph_replays"] > 0
    for a, b in zip(out["on"].history, out["off"].history):
        assert a["train_mse"] == pytest.approx(b["train_mse"], rel=1e-3)
