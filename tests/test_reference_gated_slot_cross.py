"""The vectorised attention surrogates against slow, obviously-correct per-class loops (docs/surrogates.md §2, §3).

The references below loop over classes, slots and heads in plain Python on unpadded per-class tensors,
reuse the module's own weights, and write the gate/hinge formulas out again rather than calling
``VarianceGates``. The slot initial noise is passed explicitly so both sides see the same draw.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_surrogate

from cem_bench.surrogates.layers import SNR_EPS

COVERS = ("gated_attention", "slot_cross")   # surrogates whose reference loops live here (guard test)

NUM_CLASSES = 5
SHAPE = (4, 2, 2)   # D = 16


def make(name, **extra):
    flat = {"cem.surrogate": name, "cem.hidden_dim": 16, "cem.num_heads": 2, "defense.noise_std": 0.1,
            "cem.num_slots": 3, **extra}
    if name == "gated_attention":
        del flat["cem.num_slots"]
    return make_surrogate(flat.pop("cem.surrogate"), SHAPE, NUM_CLASSES, **flat)


def data(seed=0):
    """20 samples: class 0..2 with several members, class 3 a singleton, class 4 absent."""
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor([0] * 7 + [1] * 5 + [2] * 7 + [3])
    y = y[torch.randperm(len(y), generator=g)]
    z = torch.rand(len(y), *SHAPE, generator=g)
    return z, y


def gate_term(surr, mu, var):
    """mean_d(g * h * p) of docs/surrogates.md §2 step 4, written out again."""
    c = surr.cfg
    lv = torch.log(var + c.var_eps)
    g = torch.sigmoid(surr.gates.mlp(surr.gates.norm(lv)))
    h = torch.sigmoid(c.snr_sharp * (var / (mu ** 2 + SNR_EPS) - c.snr_thresh))
    p = F.softplus(c.softplus_beta * (lv - surr.hinge_level - c.margin)) / c.softplus_beta
    return (g * h * p).mean()


def classes_with_pairs(x, y):
    """(class, its rows of x) for every class with at least two members, in class order (a loop, as written
    without the vectorised layout under test)."""
    for cls in range(NUM_CLASSES):
        xc = x[y == cls]
        if len(xc) >= 2:
            yield cls, xc


# ------------------------------------------------------------------------------------ gated_attention
def reference_gated(surr, z, y):
    c = surr.cfg
    x = z.flatten(1).float()
    b = len(x)
    num = den = 0.0
    for _, xc in classes_with_pairs(x, y):
        m = len(xc)
        u = F.layer_norm(xc, (xc.shape[1],))
        a = torch.stack([surr.attn_w(torch.tanh(surr.attn_v(uj)) * torch.sigmoid(surr.attn_u(uj)))[0] for uj in u])
        alpha = torch.softmax(a, 0)
        s = xc if c.stats_on == "raw" else u
        mu = sum(alpha[j] * s[j] for j in range(m))
        var = sum(alpha[j] * (s[j] - mu) ** 2 for j in range(m))
        class_gate = torch.sigmoid(torch.tensor(c.class_gate_a * (m / b - c.class_gate_b)))
        w = (m / b) ** c.slot_power
        num = num + w * class_gate * gate_term(surr, mu, var)
        den += w
    return num / den


@pytest.mark.parametrize("stats_on", ["raw", "normalized"])
def test_gated_attention_matches_loop(stats_on):
    surr = make("gated_attention", **{"cem.stats_on": stats_on})
    for seed in range(2):
        z, y = data(seed)
        za = z.clone().requires_grad_(True)
        zb = z.clone().requires_grad_(True)
        fast = surr(za, y).loss
        slow = reference_gated(surr, zb, y)
        torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-7)
        fast.backward()
        slow.backward()
        torch.testing.assert_close(za.grad, zb.grad, rtol=1e-3, atol=1e-6)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed + 10))
        torch.testing.assert_close(surr(z[perm], y[perm]).loss, fast.detach(), rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------ slot_cross
def reference_slot_attention(sa, tokens, noise):
    """Locatello et al. on one unpadded set (M, h) with initial noise (K, h)."""
    h = tokens.shape[1]
    x = sa.norm_inputs(tokens)
    k, v = sa.to_k(x), sa.to_v(x)
    slots = sa.slots_mu[0, 0] + torch.exp(sa.slots_log_sigma[0, 0]) * noise
    for _ in range(sa.num_iterations):
        q = sa.to_q(sa.norm_slots(slots))
        attn = torch.softmax(k @ q.T / (math.sqrt(h) * sa.temperature), dim=1) + sa.eps   # (M, K)
        updates = (attn / attn.sum(0, keepdim=True)).T @ v
        slots = sa.gru(updates, slots)
        slots = slots + sa.mlp(sa.norm_mlp(slots))
    return slots


def reference_cross(ca, tokens, ctx):
    q = ca.to_q(ca.ln_q(tokens))
    kv = ca.ln_kv(ctx)
    k, v = ca.to_k(kv), ca.to_v(kv)
    hd = ca.head_dim
    heads = []
    for head in range(ca.num_heads):
        sl = slice(head * hd, (head + 1) * hd)
        heads.append(torch.softmax(q[:, sl] @ k[:, sl].T / math.sqrt(hd), -1) @ v[:, sl])
    out = tokens + torch.tanh(ca.alpha_xattn) * ca.proj(torch.cat(heads, -1))
    return out + torch.tanh(ca.alpha_ffn) * ca.ffn(ca.ln_ff(out))


def reference_slot_cross(surr, z, y, noise):
    c = surr.cfg
    x = z.flatten(1).float()
    b = len(x)
    beta = surr.log_assign_beta.exp()
    num = den = 0.0
    for cls, xc in classes_with_pairs(x, y):
        m = len(xc)
        e = surr.proj_in(F.layer_norm(xc, (xc.shape[1],)))
        slots = reference_slot_attention(surr.slot_attn, e, noise[cls])
        yt = reference_cross(surr.cross, e, slots)
        s = xc if c.stats_on == "raw" else yt
        yn = F.layer_norm(yt, (yt.shape[1],))
        cos = torch.stack([torch.stack([F.cosine_similarity(yn[j], sk, dim=0, eps=1e-12) for sk in slots])
                           for j in range(m)])
        r = torch.softmax(beta * cos, 1)                                          # (M, K)
        terms, shares = [], []
        for k in range(slots.shape[0]):
            mass = r[:, k].sum()
            mu = (r[:, k:k + 1] * s).sum(0) / mass
            var = (r[:, k:k + 1] * (s - mu) ** 2).sum(0) / mass
            terms.append(gate_term(surr, mu, var))
            shares.append((mass / m) ** c.slot_power)
        class_loss = sum(p * t for p, t in zip(shares, terms)) / sum(shares)
        class_gate = torch.sigmoid(torch.tensor(c.class_gate_a * (m / b - c.class_gate_b)))
        num = num + (m / b) * class_gate * class_loss
        den += m / b
    return num / den


@pytest.mark.parametrize("stats_on", ["raw", "enhanced"])
def test_slot_cross_matches_loop(stats_on):
    # 'enhanced' statistics exist only with the seeds' joint fit (docs/estimators.md: unbounded otherwise)
    fit = "joint" if stats_on == "enhanced" else "adversarial"
    surr = make("slot_cross", **{"cem.stats_on": stats_on, "cem.estimator_fit": fit})
    with torch.no_grad():   # open the cross-attention gates so that the tokens really change
        surr.cross.alpha_xattn.fill_(0.8)
        surr.cross.alpha_ffn.fill_(0.5)
    h, k = surr.cfg.hidden_dim, surr.cfg.num_slots
    for seed in range(2):
        z, y = data(seed)
        noise = torch.randn(NUM_CLASSES, k, h, generator=torch.Generator().manual_seed(seed + 20))
        za = z.clone().requires_grad_(True)
        zb = z.clone().requires_grad_(True)
        fast = surr(za, y, slot_noise=noise).loss
        slow = reference_slot_cross(surr, zb, y, noise)
        torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-7)
        fast.backward()
        slow.backward()
        torch.testing.assert_close(za.grad, zb.grad, rtol=1e-3, atol=1e-6)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed + 10))
        torch.testing.assert_close(surr(z[perm], y[perm], slot_noise=noise).loss, fast.detach(),
                                   rtol=1e-5, atol=1e-7)


def test_slot_cross_eval_mode_uses_slot_mean():
    surr = make("slot_cross").eval()
    z, y = data(3)
    zero = torch.zeros(NUM_CLASSES, surr.cfg.num_slots, surr.cfg.hidden_dim)
    torch.testing.assert_close(surr(z, y).loss, reference_slot_cross(surr, z, y, zero), rtol=1e-4, atol=1e-7)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(surr(z[perm], y[perm]).loss, surr(z, y).loss, rtol=1e-5, atol=1e-7)
