import pytest
import torch

from cem_bench import surrogates
from cem_bench.config import TrialConfig
from cem_bench.trainer import TrialDiverged, inject_scale, lr_at
from cem_bench.trial import build, build_config

from conftest import TINY


def test_lr_schedule_matches_the_reference_at_240_epochs():
    cfg = TrialConfig()
    assert [lr_at(cfg, e) for e in (1, 60, 61, 120, 121, 181, 211, 240)] == pytest.approx(
        [0.05, 0.05, 0.01, 0.01, 0.002, 0.0004, 8e-5, 8e-5])
    short = TrialConfig.from_flat({"train.epochs": 5})
    assert lr_at(short, 1) == lr_at(short, 2) == 0.05  # short runs keep their first epochs at full lr


def test_inject_scale():
    assert inject_scale(0.05) == pytest.approx(0.02) and inject_scale(0.01) == pytest.approx(0.1)
    assert inject_scale(0.0004) == 1.0 and inject_scale(8e-5) == 1.0


def _trainer(**flat):
    cfg = build_config({**TINY, **flat})
    return build(cfg, torch.device("cpu"))[1]


def _strip(history):
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in history]


def test_same_seed_same_history():
    a = _trainer(**{"cem.lambd": 16}).fit()
    b = _trainer(**{"cem.lambd": 16}).fit()
    assert _strip(a) == _strip(b)
    assert a[-1]["cem_active"] and a[-1]["rob_loss"] > 0


def test_lambda_zero_builds_no_surrogate():
    t = _trainer(**{"cem.lambd": 0})
    assert t.surrogate is None
    h = t.fit()
    assert all(not r["cem_active"] for r in h) and all("feature_spread" in r for r in h)


def test_divergence_names_the_epoch():
    t = _trainer(**{"train.lr": 1e12, "train.weight_decay": 0})
    with pytest.raises(TrialDiverged, match="epoch 1"):
        t.fit()


def _batch(t):
    from cem_bench.data import BatchIterator
    it = BatchIterator(t.splits.train, t.splits, 32, "crop_flip_rotate", t.gen)
    return next(iter(it))


def _acc(t):
    z = lambda: torch.zeros(())  # noqa: E731
    return {k: z() for k in ("ce_sum", "correct", "seen", "ce_nonfinite", "rob_loss", "rob_nonfinite")}


@pytest.mark.parametrize("name", surrogates.names())
@pytest.mark.parametrize("mode", ["inject", "fused"])
def test_training_step_has_no_host_sync_and_trains_the_surrogate(name, mode, monkeypatch):
    t = _trainer(**{"cem.surrogate": name, "cem.grad_mode": mode, "cem.hidden_dim": 16, "cem.num_heads": 2})
    if t.surrogate.needs_refit:
        t.refit_surrogate()
    x, y = _batch(t)
    before = [p.detach().clone() for p in t.surrogate_params]
    enc_before = [p.detach().clone() for p in t.client_params]

    def boom(*a, **k):
        # Adam's step counter is a host-side scalar on the CPU (fused Adam on CUDA keeps it on the device):
        # reading it is not a device sync, so calls from torch.optim itself are allowed.
        import inspect
        if any("torch/optim/" in f.filename for f in inspect.stack()[1:4]):
            return orig_item(*a, **k)
        raise AssertionError("host sync inside a training step")
    orig_item = torch.Tensor.item
    for meth in ("item", "tolist", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, meth, boom)
    t.step(x, y, True, 0.05, _acc(t))
    monkeypatch.undo()
    assert any(not torch.equal(a, p) for a, p in zip(enc_before, t.client_params))
    if before:
        assert any(not torch.equal(a, p) for a, p in zip(before, t.surrogate_params)), "surrogate not trained"


def test_inject_adds_lambda_scaled_cem_gradient_to_the_encoder_only():
    t = _trainer(**{"cem.grad_mode": "inject", "train.momentum": 0, "train.weight_decay": 0})
    t.refit_surrogate()
    for m in t.server.modules():  # dropout draws from the global RNG: take it out of the comparison
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x, y = _batch(t)
    # reference: CE gradient alone, then the CEM gradient alone, from the same state and noise
    state = t.gen.get_state()
    z = t.client(x)
    out = t.surrogate(z.float(), y)
    g_cem = torch.autograd.grad(out.loss, t.client_params, retain_graph=True)
    t.gen.set_state(state)
    ce = torch.nn.functional.cross_entropy(t.server(t._noise(z)), y)
    g_ce = torch.autograd.grad(ce, t.client_params + list(t.server.parameters()))
    t.gen.set_state(state)
    params0 = [p.detach().clone() for p in t.client_params + list(t.server.parameters())]
    t.step(x, y, True, 0.05, _acc(t))
    scale = t.lambd * inject_scale(0.05)
    n_client = len(t.client_params)
    for i, (p0, p) in enumerate(zip(params0, t.client_params + list(t.server.parameters()))):
        expected = g_ce[i] + (scale * g_cem[i] if i < n_client else 0)
        assert torch.allclose((p0 - p) / 0.05, expected, atol=1e-5, rtol=1e-3)
