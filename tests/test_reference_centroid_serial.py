"""``attention_centroid`` (docs/surrogates.md §4) and ``serial_enhanced`` (§5) against slow per-class loops.

Each reference below is the obvious reading of its section: a Python loop over classes (and samples),
reusing the surrogate's own submodules and weights in eval mode (no dropout) with explicit initial-slot
noise, so the vectorised step must give the same loss. (Eval mode alone would start all K slots at the same
mean, keep them identical and put every sample in one cluster, leaving the per-cluster code untested.)
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_surrogate

from cem_bench import surrogates
from cem_bench.config import TrialConfig

NUM_CLASSES = 5
COVERS = ("attention_centroid", "serial_enhanced")   # surrogates whose reference loops live here


def make(name: str, feature_shape=(8, 4, 4), **flat):
    return make_surrogate(name, feature_shape, NUM_CLASSES, **{"cem.hidden_dim": 16, **flat})


def batch(b=24, feature_shape=(8, 4, 4), seed=1):
    gen = torch.Generator().manual_seed(seed)
    z = torch.rand(b, *feature_shape, generator=gen)
    y = torch.randint(0, NUM_CLASSES - 1, (b,), generator=gen)
    y[-1] = NUM_CLASSES - 1                  # a class with a single member: it must contribute nothing
    return z, y


def slot_noise(sur, rows: int, seed=4, scale=3.0) -> torch.Tensor:
    """Initial-slot noise for ``rows`` sets: per sample for attention_centroid, per class for serial_enhanced.
    Wide (``scale``) so that the slots differ enough to split classes into several clusters."""
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(rows, sur.cfg.num_slots, sur.cfg.hidden_dim, generator=gen)


def use_noise(sur, noise: torch.Tensor):
    """Make the vectorised step draw its initial slots from ``noise`` (row i for set i): the surrogate asks
    ``SlotAttention.draw_noise`` for them first thing in its forward."""
    sur.slot_attn.draw_noise = lambda n, generator: noise[:n]
    return sur


def noise_rows(name, z) -> int:
    return z.shape[0] if name == "attention_centroid" else NUM_CLASSES


# ------------------------------------------------------------------------------------ references
def reference_attention_centroid(sur, z, y, noise) -> torch.Tensor:
    h, rho2 = sur.cfg.hidden_dim, sur.rho2
    slots, embeds = [], []
    for j in range(z.shape[0]):                                    # one sample at a time
        tokens = sur.proj(z[j].float().reshape(z.shape[1], -1).t()).unsqueeze(0)   # (1, H*W, h)
        s, _ = sur.slot_attn(tokens, None, noise[j : j + 1])
        attended, _ = sur.cross(tokens, s, s)
        slots.append(s[0])
        embeds.append((tokens + attended)[0].mean(0))
    losses = []
    for c in y.unique().tolist():
        members = [j for j in range(len(y)) if y[j] == c]
        if len(members) < 2:
            continue
        centroids = torch.stack([slots[j] for j in members]).mean(0)           # (K, h)
        if sur.cfg.estimator_fit == "adversarial":   # soft cells from the distances, raw-feature variances
            beta = sur.log_assign_beta.exp()
            loss_c = 0.0
            for k in range(centroids.shape[0]):
                r = torch.stack([torch.softmax(-beta * ((embeds[j] - centroids) ** 2).sum(-1) / h, 0)[k]
                                 for j in members])
                xs = torch.stack([z[j].flatten().float() for j in members])
                mu = (r[:, None] * xs).sum(0) / r.sum()
                var = ((r[:, None] * (xs - mu) ** 2).sum(0) / r.sum()).mean()
                t = math.log(sur.cfg.var_threshold * sur.noise_std ** 2 + sur.cfg.var_eps)
                loss_c = loss_c + r.sum() / len(members) * F.relu(torch.log(var + sur.cfg.var_eps) - t)
            losses.append(loss_c)
            continue
        clusters: dict[int, list] = {}
        for j in members:
            d = ((embeds[j] - centroids) ** 2).sum(-1) / h
            k = int(d.argmin())
            clusters.setdefault(k, []).append((j, d[k]))
        loss_c = 0.0
        for cell in clusters.values():   # joint (design note 000): the distance to the slot centroid
            var = torch.stack([d for _, d in cell]).mean()
            loss_c = loss_c + len(cell) / len(members) * torch.log(var + rho2)
        losses.append(loss_c)
    return torch.stack(losses).mean()


def reference_serial_enhanced(sur, z, y, noise) -> torch.Tensor:
    x = z.flatten(1).float()
    per_class, sizes = [], []
    for c in y.unique().tolist():
        members = [j for j in range(len(y)) if y[j] == c]
        if len(members) < 2:
            continue
        u = []
        for j in members:
            uj = sur.w_in(F.layer_norm(x[j], x[j].shape))
            gate = torch.sigmoid(sur.mlp_gate(torch.cat([sur.mlp_small(uj), sur.mlp_large(uj), uj])))
            u.append(uj * gate)
        u = torch.stack(u)                                                   # (M_c, h)
        slots, _ = sur.slot_attn(u.unsqueeze(0), None, noise[c : c + 1])   # only this class's members
        slots = slots[0]                                                     # (K, h)
        if sur.cfg.estimator_fit == "adversarial":   # soft cells from the distances, raw-feature variances
            t = math.log(sur.cfg.var_threshold * sur.noise_std ** 2 + sur.cfg.var_eps)
            d = []
            for i in range(len(members)):
                attended, _ = sur.cross(u[i].view(1, 1, -1), slots.unsqueeze(0), slots.unsqueeze(0))
                y1 = sur.norm1(u[i] + attended.view(-1))
                y2 = sur.norm2(y1 + sur.ffn_out(torch.nn.functional.gelu(sur.ffn_in(y1))))
                feat = sur.norm3(u[i] + y2)
                d.append(torch.stack([((feat - s) ** 2).sum() - 0.1 * (1 - F.cosine_similarity(feat, s, dim=0))
                                      for s in slots]))
            r = torch.softmax(-sur.log_assign_beta.exp() * torch.stack(d), 1)        # (M_c, K)
            xs = x[members]
            loss_c = 0.0
            for k in range(slots.shape[0]):
                mu = (r[:, k:k + 1] * xs).sum(0) / r[:, k].sum()
                var = (r[:, k:k + 1] * (xs - mu) ** 2).sum(0) / r[:, k].sum()
                info = F.relu(torch.log(var + sur.cfg.var_eps) - t).mean()
                loss_c = loss_c + r[:, k].sum() / len(members) * info
            per_class.append(loss_c)
            sizes.append(len(members))
            continue
        clusters: dict[int, list] = {}
        for i in range(len(members)):
            attended, _ = sur.cross(u[i].view(1, 1, -1), slots.unsqueeze(0), slots.unsqueeze(0))
            y1 = sur.norm1(u[i] + attended.view(-1))
            y2 = sur.norm2(y1 + sur.ffn_out(torch.nn.functional.gelu(sur.ffn_in(y1))))
            feat = sur.norm3(u[i] + y2)
            dists = [((feat - s) ** 2).sum() - 0.1 * (1 - F.cosine_similarity(feat, s, dim=0)) for s in slots]
            k = int(torch.stack(dists).argmin())
            clusters.setdefault(k, []).append(feat)
        loss_c = 0.0
        for feats in clusters.values():
            var = torch.stack(feats).var(0, unbiased=False) + 1e-4
            info = F.relu(torch.log(var + 1e-8) - math.log(1e-4)).mean()
            loss_c = loss_c + len(feats) / len(members) * info
        per_class.append(loss_c)
        sizes.append(len(members))
    weights = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
    return (weights * torch.stack(per_class)).sum()


REFERENCES = {"attention_centroid": reference_attention_centroid, "serial_enhanced": reference_serial_enhanced}


# ------------------------------------------------------------------------------------ tests
def check_against_reference(name, sur, z, y):
    noise = slot_noise(sur, noise_rows(name, z))
    use_noise(sur.eval(), noise)
    with torch.no_grad():
        out = sur(z, y)
        want = REFERENCES[name](sur, z, y, noise)
    assert out.loss.dtype == torch.float32 and out.loss.dim() == 0
    assert torch.isfinite(out.loss)
    assert out.logs["active_slots"] > 1.2          # several clusters per class: the per-cluster code runs
    assert torch.allclose(out.loss, want, rtol=1e-4, atol=1e-6), (out.loss.item(), want.item())


FIT_MODES = ["adversarial", "joint"]


def check_gradients_against_reference(name, sur, z, y):
    """The gradient of the vectorised loss, w.r.t. the features and every parameter, is the per-class loop's: a
    detach in the wrong place (the joint branch's statistics, a slot) leaves the loss value unchanged, so the
    value check alone cannot see it. Parameters whose true gradient is 0 (a LayerNorm bias under a shift
    invariance) are compared on the features' scale."""
    noise = slot_noise(sur, noise_rows(name, z))
    use_noise(sur.eval(), noise)
    params = [p for p in sur.parameters() if p.requires_grad]
    za, zb = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    fast = torch.autograd.grad(sur(za, y).loss, [za, *params], allow_unused=True)
    slow = torch.autograd.grad(REFERENCES[name](sur, zb, y, noise), [zb, *params], allow_unused=True)
    names = ["z"] + [n for n, p in sur.named_parameters() if p.requires_grad]
    scale = float(slow[0].abs().max())
    assert scale > 0, "no gradient reaches the features"
    for n, a, b in zip(names, fast, slow):
        assert (a is None) == (b is None), n
        if a is not None:
            assert torch.allclose(a, b, rtol=1e-3, atol=1e-5 * max(scale, float(b.abs().max()))), \
                (n, float((a - b).abs().max()), float(b.abs().max()))


@pytest.mark.parametrize("fit", FIT_MODES)
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_gradients_match_per_class_loop(name, fit):
    z, y = batch()
    check_gradients_against_reference(name, make(name, **{"cem.estimator_fit": fit}), z, y)


@pytest.mark.parametrize("fit", FIT_MODES)
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_matches_per_class_loop(name, fit):
    z, y = batch()
    check_against_reference(name, make(name, **{"cem.estimator_fit": fit}), z, y)


@pytest.mark.parametrize("fit", FIT_MODES)
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_matches_per_class_loop_after_training_steps(name, fit):
    """The same after a few sign-gradient steps, so that the slots and gates are not at their initial values."""
    sur = make(name, **{"cem.estimator_fit": fit})
    sur.rng(torch.device("cpu")).manual_seed(1)   # dropout/slot draws that leave several clusters per class
    z, y = batch(seed=2)
    for _ in range(3):
        sur.zero_grad()
        sur(z, y).loss.backward()
        with torch.no_grad():
            for p in sur.parameters():
                if p.grad is not None:
                    p -= 1e-2 * p.grad.sign()
    check_against_reference(name, sur, z, y)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_invariant_to_batch_permutation(name):
    sur = make(name).eval()
    z, y = batch()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(3))
    noise = slot_noise(sur, noise_rows(name, z))
    with torch.no_grad():
        a = use_noise(sur, noise)(z, y).loss
        # per-sample noise travels with its sample; per-class noise stays with its class
        b = use_noise(sur, noise[perm] if name == "attention_centroid" else noise)(z[perm], y[perm]).loss
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a.item(), b.item())


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_singleton_classes_contribute_nothing(name):
    sur = make(name).eval()
    z, y = batch()
    with torch.no_grad():
        full = sur(z, y).loss
        without = sur(z[:-1], y[:-1]).loss                  # drop the one-member class
    assert torch.allclose(full, without, rtol=1e-5, atol=1e-6)
    with torch.no_grad():                                   # no class with two members: nothing to measure
        lone = sur(z[:NUM_CLASSES], torch.arange(NUM_CLASSES)).loss
    assert lone.item() == 0.0


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_gradient_reaches_features_and_parameters(name):
    sur = make(name).train()
    z, y = batch()
    z.requires_grad_(True)
    out = sur(z, y)
    out.loss.backward()
    assert z.grad is not None and torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0
    assert sur.slot_attn.to_k.weight.grad is not None and sur.slot_attn.to_k.weight.grad.abs().sum() > 0
    assert {"rob_loss", "intra_mse", "active_slots"} <= set(out.logs)
    assert all(not v.requires_grad and torch.isfinite(v) for v in out.logs.values())


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("shape", [(8, 8, 8), (128, 8, 8)])
def test_finite_for_identical_features_and_large_shapes(name, shape):
    sur = make(name, feature_shape=shape)
    y = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])
    for z in (torch.full((8, *shape), 0.5), torch.rand(8, *shape)):
        for mode in (True, False):
            sur.train(mode)
            assert torch.isfinite(sur(z, y).loss)


def test_seed_defaults():
    a = surrogates.resolve(TrialConfig.from_flat({"cem.surrogate": "attention_centroid"})).cem
    assert (a.num_slots, a.num_iterations, a.num_heads, a.grad_mode, a.strength) == (8, 3, 8, "fused", "matched")
    s = surrogates.resolve(TrialConfig.from_flat({"cem.surrogate": "serial_enhanced"})).cem
    assert (s.num_slots, s.num_iterations, s.num_heads, s.grad_mode, s.strength) == (12, 4, 8, "fused", "matched")
    fixed = {"cem.strength": "fixed"}
    assert surrogates.resolve(TrialConfig.from_flat({"cem.surrogate": "attention_centroid", **fixed})).cem.loss_scale \
        == 0.038
    assert surrogates.resolve(TrialConfig.from_flat({"cem.surrogate": "serial_enhanced", **fixed})).cem.loss_scale \
        == 0.017
    explicit = surrogates.resolve(TrialConfig.from_flat({"cem.surrogate": "serial_enhanced", "cem.num_slots": 3}))
    assert explicit.cem.num_slots == 3


def test_serial_enhanced_distance_subtracts_the_cosine_term():
    """d = ||y - S||^2 - 0.1 (1 - cos(y, S)) as written in design note 001: at equal Euclidean distance the slot
    pointing *away* from y is the closer one."""
    dist = surrogates.get("serial_enhanced").distance
    y = torch.tensor([[1.0, 0.0]])
    slots = torch.tensor([[[2.0, 0.0], [1.0, 1.0]]])          # both at squared distance 1 from y
    d = dist(y, slots)[0]
    assert torch.allclose(d, torch.tensor([1.0, 1.0 - 0.1 * (1 - 2 ** -0.5)]))
    assert int(d.argmin()) == 1
    gen = torch.Generator().manual_seed(5)
    yr, sr = torch.randn(6, 4, generator=gen), torch.randn(6, 3, 4, generator=gen)
    want = torch.stack([torch.stack([((yr[i] - sr[i, k]) ** 2).sum()
                                     - 0.1 * (1 - F.cosine_similarity(yr[i], sr[i, k], dim=0)) for k in range(3)])
                        for i in range(6)])
    assert torch.allclose(dist(yr, sr), want, atol=1e-6)


def test_serial_enhanced_attention_is_its_multihead_attention():
    """``attend`` writes ``self.cross`` out for one query per sample: the same output and the same gradients
    (of the query, the slots and the attention's parameters) as ``nn.MultiheadAttention`` itself."""
    sur = make("serial_enhanced")
    torch.manual_seed(3)
    u = torch.randn(24, sur.h, requires_grad=True)
    slots = torch.randn(24, sur.k, sur.h, requires_grad=True)
    ours = sur.attend(u, slots)
    theirs, _ = sur.cross(u.unsqueeze(1), slots, slots, need_weights=False)
    theirs = theirs.squeeze(1)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    wrt = [u, slots, *sur.cross.parameters()]
    g_ours = torch.autograd.grad(ours.square().sum(), wrt)
    g_theirs = torch.autograd.grad(theirs.square().sum(), wrt)
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
