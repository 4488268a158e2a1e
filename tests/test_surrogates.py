"""Generic checks run on every registered surrogate (docs/surrogates.md, "Common contract"), plus the shared layers.

Each test is parametrised over ``surrogates.names()``, so a newly registered surrogate gets them without
new test code. Everything is tiny (hidden_dim 16, batch 24) to stay fast on a shared CPU.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import feature_batch, make_surrogate

from cem_bench.config import ModelConfig, TrialConfig
from cem_bench.core.models import ClientEncoder
from cem_bench.surrogates import get, names, resolve
from cem_bench.surrogates.layers import GatedCrossAttention, SlotAttention, VarianceGates

NAMES = names()
SHAPES = [(8, 8, 8), (128, 8, 8)]
NUM_CLASSES = 4
BATCH = 24


TINY_KEYS = {"cem.hidden_dim": 16, "cem.num_heads": 2, "defense.noise_std": 0.1}


def make(name: str, shape=(8, 8, 8), refit_on: torch.Tensor | None = None, labels: torch.Tensor | None = None,
         **extra):
    """A tiny surrogate; gmm-like ones are refitted (on ``refit_on`` or random features) first."""
    surr = make_surrogate(name, shape, NUM_CLASSES, **{**TINY_KEYS, **extra})
    if surr.needs_refit:
        if refit_on is None:
            g = torch.Generator().manual_seed(1)
            refit_on = torch.rand(64, *shape, generator=g)
            labels = torch.arange(64) % NUM_CLASSES
        surr.refit(refit_on.detach(), labels)
    return surr


def batch(shape, n=BATCH, num_classes=NUM_CLASSES, seed=2):
    return feature_batch(shape, n, num_classes, seed)


def run(surr, z, y, seed=3):
    surr.rng(z.device).manual_seed(seed)   # surrogates that draw noise (slot init, dropout) see the same draws
    return surr(z, y)


# ------------------------------------------------------------------------------------ contract
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", NAMES)
def test_finite_loss_and_gradients(name, shape):
    surr = make(name, shape)
    z, y = batch(shape)
    z.requires_grad_(True)
    out = run(surr, z, y)
    assert out.loss.dim() == 0 and out.loss.dtype == torch.float32
    assert torch.isfinite(out.loss)
    assert {"rob_loss", "intra_mse"} <= set(out.logs)
    for key, v in out.logs.items():
        assert isinstance(v, torch.Tensor) and not v.requires_grad, key
        assert torch.isfinite(v).all(), key
    out.loss.backward()
    assert torch.isfinite(z.grad).all()
    assert z.grad.abs().sum() > 0
    for pname, p in surr.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", ["attention_centroid", "serial_enhanced"])
def test_the_adversarial_cells_log_their_sharpness(name):
    """Both fused surrogates log β of their soft cells under the adversarial fit (whether the maximising fit keeps
    the cells apart or blurs them toward the plain class hinge); the joint fit has no β and logs none."""
    z, y = batch((8, 8, 8))
    adv = make(name, **{"cem.estimator_fit": "adversarial"})
    with torch.no_grad():
        adv.log_assign_beta.fill_(math.log(3.0))
    assert float(run(adv, z, y).logs["assign_beta"]) == pytest.approx(3.0)
    assert "assign_beta" not in run(make(name, **{"cem.estimator_fit": "joint"}), z, y).logs


@pytest.mark.parametrize("name", NAMES)
def test_gradient_reaches_encoder(name):
    torch.manual_seed(0)
    enc = ClientEncoder(ModelConfig(width=0.125))
    imgs = torch.rand(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    y = torch.arange(BATCH) % NUM_CLASSES
    with torch.no_grad():
        feats = enc(imgs)
    assert feats.shape[1:] == (8, 8, 8)
    surr = make(name, tuple(feats.shape[1:]), refit_on=feats, labels=y)
    out = run(surr, enc(imgs), y)
    out.loss.backward()
    w = enc.features[0].weight.grad
    assert w is not None and torch.isfinite(w).all() and w.abs().sum() > 0


@pytest.mark.parametrize("name", NAMES)
def test_own_parameters_are_trained(name):
    surr = make(name)
    params = dict(surr.named_parameters())
    if not params:
        pytest.skip(f"{name} has no learnable parameters")
    z, y = batch((8, 8, 8))
    before = {k: p.detach().clone() for k, p in params.items()}
    opt = torch.optim.Adam(surr.parameters(), lr=1e-2)
    run(surr, z, y).loss.backward()
    missing = [k for k, p in params.items() if p.grad is None]
    assert not missing, f"parameters outside the loss graph: {missing}"
    opt.step()
    changed = [k for k, p in params.items() if not torch.equal(p.detach(), before[k])]
    assert changed
    for k, p in params.items():
        if p.grad.abs().sum() > 0:
            assert k in changed, k


@pytest.mark.parametrize("name", NAMES)
def test_singleton_class_contributes_nothing(name):
    shape = (8, 8, 8)
    z, y = batch(shape, n=BATCH - 1, num_classes=NUM_CLASSES - 1)   # classes 0..2, each with >= 2 members
    lone = torch.rand(1, *shape, generator=torch.Generator().manual_seed(7))
    z = torch.cat([z, lone]).requires_grad_(True)
    y = torch.cat([y, torch.tensor([NUM_CLASSES - 1])])
    surr = make(name, shape)
    out = run(surr, z, y)
    out.loss.backward()
    assert torch.equal(z.grad[-1], torch.zeros_like(z.grad[-1]))
    assert z.grad[:-1].abs().sum() > 0
    moved = z.detach().clone()
    moved[-1] = 1 - moved[-1]
    again = run(surr, moved, y)
    torch.testing.assert_close(again.loss, out.loss, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_batch_of_singletons_gives_zero_loss(name):
    # A singleton's within-class variance is 0 whatever its features, so the gradient check above cannot see
    # a singleton that is wrongly counted with a constant term; a batch of singletons only can.
    shape = (8, 8, 8)
    z, y = batch(shape, n=NUM_CLASSES)
    z.requires_grad_(True)
    surr = make(name, shape)
    out = run(surr, z, y)
    assert out.loss == 0
    out.loss.backward()
    assert torch.isfinite(z.grad).all() and not z.grad.any()


@pytest.mark.parametrize("name", NAMES)
def test_identical_features_give_finite_loss(name):
    shape = (8, 8, 8)
    z = torch.full((BATCH, *shape), 0.5)
    y = torch.arange(BATCH) % NUM_CLASSES
    surr = make(name, shape, refit_on=z, labels=y)
    z.requires_grad_(True)
    out = run(surr, z, y)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert torch.isfinite(z.grad).all()
    for pname, p in surr.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", NAMES)
def test_no_host_sync(name, monkeypatch):
    surr = make(name)                                   # gmm's refit may sync: it runs before the patch
    z, y = batch((8, 8, 8))
    z.requires_grad_(True)

    def boom(*args, **kwargs):
        raise AssertionError("host sync in the surrogate step")

    for attr in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, attr, boom)
    out = run(surr, z, y)
    out.loss.backward()
    monkeypatch.undo()
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("name", NAMES)
def test_resolve_fills_defaults(name):
    trial = TrialConfig.from_flat({"cem.surrogate": name})
    cfg = resolve(trial).cem
    klass = get(name)
    for key, value in klass.defaults.items():
        if key == "cem.loss_scale" and cfg.strength == "matched":
            value = None            # measured by the trial (cem.strength=matched); the default is the fixed one
        assert getattr(cfg, key.split(".", 1)[1]) == value, key
    import dataclasses
    own = {f.name: f.default for f in dataclasses.fields(klass.Keys)}
    assert cfg.params == klass.complete(own, trial)               # the surrogate's own keys, and only them
    assert set(klass.keys) == {f"cem.{k}" for k in own}


def test_attention_centroids_rho_is_the_noise_sigma_unless_set():
    """The reference's regularization_strength, whose 0.025 note 000 quotes, is the defense noise σ: ρ follows σ
    (it was 0.025 at every σ), a set value is kept, and at σ 0 it is sqrt(γ) (a finite log)."""
    def rho(**flat):
        return resolve(TrialConfig.from_flat({"cem.surrogate": "attention_centroid", "cem.estimator_fit": "joint",
                                              **flat})).cem.reg_strength
    assert rho() == 0.025 and rho(**{"defense.noise_std": 0.1}) == 0.1
    assert rho(**{"defense.noise_std": 0.1, "cem.reg_strength": 0.05}) == 0.05
    assert rho(**{"defense.noise_std": 0.0}) == pytest.approx(0.1)        # sqrt(var_eps 0.01)
    # under adversarial nothing reads it: the note's 0.025 at every sigma (a sigma grid's configurations then
    # differ in sigma alone, as before, not in a rho that looked searched)
    adversarial = resolve(TrialConfig.from_flat({"cem.surrogate": "attention_centroid", "defense.noise_std": 0.1}))
    assert adversarial.cem.estimator_fit == "adversarial" and adversarial.cem.reg_strength == 0.025
    cfg = resolve(TrialConfig.from_flat({"cem.surrogate": "attention_centroid", "cem.estimator_fit": "joint",
                                         "defense.noise_std": 0.15}))
    assert TrialConfig.from_flat(cfg.to_flat()) == cfg
    from cem_bench.surrogates import build
    assert build(cfg, (8, 4, 4), 4).rho2 == pytest.approx(0.15 ** 2)


def test_seed_defaults():
    ga = resolve(TrialConfig.from_flat({"cem.surrogate": "gated_attention"})).cem if "gated_attention" in NAMES else None
    if ga is not None:
        assert (ga.strength, ga.loss_scale, ga.warmup_epochs, ga.grad_mode, ga.stats_on) == \
            ("matched", None, 5, "inject", "raw")
        fixed = resolve(TrialConfig.from_flat({"cem.surrogate": "gated_attention", "cem.strength": "fixed"})).cem
        assert fixed.loss_scale == 0.84
    if "slot_cross" in NAMES:
        sc = resolve(TrialConfig.from_flat({"cem.surrogate": "slot_cross"})).cem
        assert (sc.strength, sc.loss_scale, sc.warmup_epochs, sc.grad_mode, sc.stats_on) == \
            ("matched", None, 3, "inject", "raw")
        assert (sc.num_slots, sc.num_iterations, sc.num_heads) == (8, 3, 4)
        assert sc.slot_temp == pytest.approx(128 ** 0.25)


# ------------------------------------------------------------------------------------ shared layers
def test_slot_attention_ignores_masked_tokens_and_survives_empty_sets():
    torch.manual_seed(0)
    sa = SlotAttention(16, num_slots=3, num_iterations=2, temperature=2.0,
                       temp_schedule=lambda t: max(0.1, 1 - 0.2 * t), competition=True)
    tokens = torch.randn(1, 5, 16)
    noise = torch.randn(1, 3, 16)
    slots, attn = sa(tokens, noise=noise)
    padded = torch.cat([tokens, 100 * torch.randn(1, 4, 16)], 1)
    mask = torch.tensor([[True] * 5 + [False] * 4])
    slots_p, attn_p = sa(padded, mask, noise=noise)
    torch.testing.assert_close(slots_p, slots, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attn_p[:, :5], attn, rtol=1e-5, atol=1e-6)
    assert torch.equal(attn_p[:, 5:], torch.zeros_like(attn_p[:, 5:]))
    torch.testing.assert_close(attn.sum(-1), torch.ones(1, 5), rtol=1e-5, atol=1e-6)
    # an all-masked set: finite outputs and gradients
    x = torch.randn(2, 4, 16, requires_grad=True)
    empty = torch.tensor([[True, True, False, False], [False] * 4])
    s, a = sa(x, empty)
    assert torch.isfinite(s).all() and torch.isfinite(a).all()
    s.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert torch.equal(x.grad[1], torch.zeros_like(x.grad[1]))


def test_slot_attention_eval_uses_the_mean():
    sa = SlotAttention(8, num_slots=4, num_iterations=1).eval()
    init = sa.initial_slots(2)
    assert torch.equal(init, sa.slots_mu.expand(2, 4, 8))
    sa.train()
    assert not torch.equal(sa.initial_slots(2), init)


def test_gated_cross_attention_starts_almost_closed():
    torch.manual_seed(0)
    ca = GatedCrossAttention(16, num_heads=4)
    tok, ctx = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    out = ca(tok, ctx, mask)
    assert out.shape == tok.shape
    assert torch.equal(out[1, 2:], torch.zeros(3, 16))
    assert torch.isclose(torch.tanh(ca.alpha_xattn), torch.tensor(math.tanh(0.1)))
    with torch.no_grad():
        ca.alpha_xattn.zero_()
        ca.alpha_ffn.zero_()
    torch.testing.assert_close(ca(tok, ctx), tok)


def test_variance_gates_hinge():
    vg = VarianceGates(6, 4, hinge_level=math.log(0.125 * 0.01 + 0.01), var_eps=0.01, snr_thresh=0.3,
                       snr_sharp=10.0, softplus_beta=1.0, margin=0.1)
    mean = torch.full((3, 6), 0.5)
    var = torch.tensor([0.0, 1e-3, 0.1]).unsqueeze(1).expand(3, 6)
    out = vg(mean, var)
    assert out.term.shape == (3,) and torch.isfinite(out.term).all()
    assert (out.penalty[0] < out.penalty[1]).all() and (out.penalty[1] < out.penalty[2]).all()
    assert ((out.dim_gate > 0) & (out.dim_gate < 1)).all()


def test_every_surrogate_has_a_reference_test():
    """A surrogate is checked against a slow, obviously-correct loop: a new one without such a test (or a
    renamed one whose test would no longer find it) fails here instead of being skipped silently."""
    import test_gmm
    import test_reference_centroid_serial
    import test_reference_gated_slot_cross
    covered = set(test_gmm.COVERS) | set(test_reference_centroid_serial.COVERS) | set(
        test_reference_gated_slot_cross.COVERS)
    assert covered == set(NAMES), f"without a reference test: {sorted(set(NAMES) - covered)}"



@pytest.mark.parametrize("name", ["gated_attention", "slot_cross"])
def test_the_snr_gate_is_closed_by_a_mean_shift_unless_its_statistics_are_detached(name):
    """Note 003's SNR gate h = sigmoid(k (var / (mean^2 + eps) - t)) keeps the gradient through the class mean:
    shifting every feature lowers L at an unchanged spread (the audit of 2026-11-28: 0.209 -> 0.085), so the
    encoder can saturate its outputs instead of concentrating them. cem.snr_gate_grad=false computes h from
    detached statistics: the gate still weights the penalty, and no gradient moves a class's mean through it."""
    x, y = feature_batch((8, 4, 4), 64, 4, seed=3)
    x = 0.3 + 0.1 * x                    # a spread of the features' own scale; the SNR gate partly open
    designed = make_surrogate(name, (8, 4, 4), 4)
    fixed = make_surrogate(name, (8, 4, 4), 4, **{"cem.snr_gate_grad": False})
    assert designed.gates.snr_gate_grad and not fixed.gates.snr_gate_grad
    for surr, closable in ((designed, True), (fixed, False)):
        z = x.clone().requires_grad_(True)
        out = surr(z, y)
        (g,) = torch.autograd.grad(out.loss, z)
        shift = torch.stack([g[y == c].sum() for c in range(4)])   # d L / d (a uniform shift of class c)
        spread = torch.stack([(g[y == c] - g[y == c].mean(0)).abs().sum() for c in range(4)])
        assert spread.sum() > 0                                    # the spread is penalised either way
        if closable:
            assert shift.abs().max() > 1e-3 * spread.max(), (shift, spread)
        else:
            assert shift.abs().max() <= 1e-4 * spread.max(), (shift, spread)
    with torch.no_grad():   # the forward is the same: only the gradient differs
        assert torch.allclose(designed(x, y).loss, fixed(x, y).loss)


def test_loading_a_space_imports_no_dynamo_and_a_compile_marks_every_draw():
    """The random draws a compiled surrogate runs eagerly (``layers.eager``) are marked with
    ``torch.compiler.disable`` when a surrogate is compiled, not at import: that imported Dynamo into every
    `cem-bench search` driver, which only reads the surrogates' keys. In a fresh interpreter: loading a space
    imports no Dynamo; compiling serial_enhanced (a method of its own and ``SlotAttention.draw_noise``) marks
    every ``eager`` function its forward reaches and the module's own draws, once however often."""
    import subprocess
    import sys
    from pathlib import Path
    code = """
import sys
from cem_bench.spaces.parse import load_space
load_space(sys.argv[1])
assert "torch._dynamo" not in sys.modules, "loading a space imported Dynamo"
from cem_bench.surrogates import layers
from cem_bench.surrogates.serial_enhanced import SerialEnhanced
from conftest import make_surrogate
s = make_surrogate("serial_enhanced", (8, 8, 8), 4)
assert layers.draw.eager_in_compile is True
layers.disable_marked(s)
first = SerialEnhanced.draws
layers.disable_marked(s)
assert SerialEnhanced.draws is first, "marked twice"
for f in (SerialEnhanced.draws, layers.SlotAttention.draw_noise, layers.draw, layers.dropout_keep):
    assert f.eager_in_compile == "disabled" and f._torchdynamo_disable, f
"""
    tests = Path(__file__).resolve().parent
    space = tests.parent / "search_spaces" / "demo.yaml"
    done = subprocess.run([sys.executable, "-c", code, str(space)], cwd=tests, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _backward_nodes(loss: torch.Tensor) -> set[str]:
    seen, todo, out = set(), [loss.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        out.add(type(fn).__name__)
        todo.extend(f for f, _ in fn.next_functions)
    return out


BATCH_MEAN = [{"cem.spread_about": "batch_mean"},
              {"cem.spread_about": "batch_mean", "cem.entropy": "diag", "cem.num_clusters": 1, "cem.gmm_fit": "em"}]


@pytest.mark.parametrize("name, extra", [(n, {}) for n in NAMES] + [("gmm", e) for e in BATCH_MEAN],
                         ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k.split('.')[-1]}={x}" for k, x in v.items()) or "defaults")
def test_no_gather_back_propagates_through_an_atomic_scatter(name, extra):
    """Advanced indexing's backward (IndexBackward0) adds through ``index_put_(accumulate=True)``, whose order on a
    multi-threaded CPU follows the threads: the same step's gradients then differ in the last bits and a trial
    drifts from its own rerun. Every gather on the loss's path goes through ``base.rows`` (index_select, a serial
    index_add_ backward). gmm's batch-mean cell means gathered by plain indexing (2026-12-07 audit)."""
    shape = (8, 8, 8)
    surr = make(name, shape, **extra)
    z, y = batch(shape)
    z.requires_grad_(True)
    nodes = _backward_nodes(run(surr, z, y).loss)
    assert "IndexBackward0" not in nodes, sorted(nodes)
