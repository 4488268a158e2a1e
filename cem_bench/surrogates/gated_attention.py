"""``gated_attention``: gated-attention pooling per class (docs/surrogates.md §2, design note 003 "gated-att").

Per class c, over its members j: u_j = LN(x_j) (no affine); attention logits a_j = w.(tanh(V u_j) *
sigmoid(U u_j)) (Ilse et al. 2018; V, U: D -> hidden_dim, w: hidden_dim -> 1); alpha = softmax over the
class's members; weighted mean mu and per-dimension variance var of s_j (x_j with ``stats_on: raw``, the
default; u_j with ``normalized``, the seed's reading); then the gates and hinge of ``layers.VarianceGates``:

    L_c = gate_c * mean_d(g * h * p),   gate_c = sigmoid(a * (M_c/B - b)),   w_c = (M_c/B)^slot_power
    L   = sum_c w_c L_c / sum_c w_c     over the classes with M_c >= 2 (the others get w_c = 0)

All classes at once: the members of a class never interact except through the softmax and the weighted
sums, so these are segment operations over the batch (scatter max, ``index_add``) on (B, D) tensors rather
than a (classes, B, D) padded copy, which would cost classes x the memory. No host sync.

Numerics: the log-variance is log(var + gamma) with gamma = ``cem.var_eps``, the same gamma as the hinge
level t = log(tau*sigma^2 + gamma), so a class of identical features (var = 0) gives a finite loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..keys import key
from .base import AttentionKeys, Surrogate, SurrogateOut, intra_class_mse, register, rows
from .layers import GateKeys, build_gates, class_softmax


@dataclass(frozen=True)
class GatedAttentionKeys(GateKeys, AttentionKeys):
    stats_on: str = key("raw", "statistics on the raw encoder features (raw) or on their layer norm (normalized, "
                        "the seed's reading)", choices=("raw", "normalized"))


@register("gated_attention")
class GatedAttention(Surrogate):
    Keys = GatedAttentionKeys
    # cem.strength=matched: each trial measures the loss scale with which one unit of lambda pulls on its encoder as
    # gmm's does (cem_bench/core/strength.py); cem.loss_scale is the fixed scale of cem.strength=fixed, calibrated at the
    # synthetic reference state (docs/estimators.md, "One lambda scale"); the seed's own weight was 0.1.
    defaults = {"cem.strength": "matched",
                "cem.loss_scale": 0.84, "cem.warmup_epochs": 5, "cem.grad_mode": "inject"}

    def __init__(self, cfg, feature_shape, num_classes):
        super().__init__(cfg, feature_shape, num_classes)
        d, h = self.dim, self.cfg.hidden_dim
        self.attn_v = nn.Linear(d, h)
        self.attn_u = nn.Linear(d, h)
        self.attn_w = nn.Linear(h, 1, bias=False)   # a bias would cancel in the softmax
        self.gates = build_gates(self, d)

    def pool_logits(self, u: torch.Tensor) -> torch.Tensor:
        """Gated-attention logits a_j (B,) of the layer-normalised features u (B, D)."""
        return self.attn_w(torch.tanh(self.attn_v(u)) * torch.sigmoid(self.attn_u(u))).squeeze(-1)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> SurrogateOut:
        with torch.autocast(z.device.type, enabled=False):   # statistics in fp32 (docs/surrogates.md, common contract)
            return self._forward(z.float(), y)

    def _forward(self, z: torch.Tensor, y: torch.Tensor) -> SurrogateOut:
        c = self.cfg
        g_cls = self.num_classes
        x = z.flatten(1)
        b_sz, d = x.shape
        u = F.layer_norm(x, (d,))
        alpha = class_softmax(self.pool_logits(u), y, g_cls)                   # (B,), sums to 1 per class
        s = x if c.stats_on == "raw" else u
        mu = x.new_zeros(g_cls, d).index_add(0, y, alpha.unsqueeze(1) * s)     # (G, D)
        var = x.new_zeros(g_cls, d).index_add(0, y, alpha.unsqueeze(1) * (s - rows(mu, y)).pow(2))
        gate = self.gates(mu, var)                                             # term (G,)

        counts = x.new_zeros(g_cls).index_add(0, y, x.new_ones(b_sz))
        frac = counts / b_sz
        counted = (counts >= 2).to(x.dtype)                                    # M_c < 2 contributes nothing
        class_gate = torch.sigmoid(c.class_gate_a * (frac - c.class_gate_b))
        weight = frac.pow(c.slot_power) * counted
        loss = (weight * class_gate * gate.term).sum() / weight.sum().clamp(min=1e-30)

        with torch.no_grad():   # the logs: means over the counted classes, all in one batch (few kernels)
            pool_max = x.new_zeros(g_cls).scatter_reduce(0, y, alpha, "amax")
            per_class = torch.cat([torch.stack([gate.dim_gate, gate.snr_gate, gate.penalty]).mean(-1),
                                   torch.stack([class_gate, pool_max])])                              # (5, G)
            means = (per_class * counted).sum(1) / counted.sum().clamp(min=1)
        logs = {
            "rob_loss": loss.detach(),
            "intra_mse": intra_class_mse(x, y, g_cls, counts),
            "gate_dim": means[0], "gate_snr": means[1], "gate_class": means[3], "hinge": means[2],
            "pool_max": means[4],
        }
        return SurrogateOut(loss, logs)
