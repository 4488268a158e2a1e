"""``slot_cross``: Slot Attention + gated cross-attention mixture (docs/surrogates.md §3, seeds 002 and 004).

Per class c the members are the tokens (one token per sample), so the slots are sub-clusters of the class
(design note 002's "team captains"):

1. e_j = P(LN(x_j)), P: D -> hidden_dim (LN without affine); never a D x D layer (design note 004's defect).
2. ``SlotAttention`` over the class's tokens, K = ``num_slots``, logits damped by sqrt(h) * ``slot_temp``.
3. ``GatedCrossAttention``: the tokens query the slots, y = e + tanh(a_x) proj(attn); y += tanh(a_f) FFN.
4. Responsibilities r_jk = softmax_k(beta_a * cos(LN(y_j), slot_k)) with a learnable beta_a (stored as its
   log, initialised to ``ASSIGN_BETA_INIT``); slot mass m_k = sum_j r_jk; weighted mean mu_k and variance
   var_k of s_j (x_j with ``stats_on: raw``, the default; y_j with ``enhanced``).
5. ``VarianceGates`` per (class, slot); pi_k = (m_k/M_c)^slot_power normalised over k;
   L_c = sum_k pi_k mean_d(g * h * p).
6. L = sum_c w_c gate_c L_c / sum_c w_c with w_c = M_c/B over the classes with M_c >= 2,
   gate_c = sigmoid(a * (M_c/B - b)).

All classes at once: the tokens are laid out as a padded (classes, B, h) batch of sets with a mask for
steps 2-4 (cheap: h is small), then mapped back to the samples so that the D-wide statistics of step 4
are ``index_add`` sums over (B, K, D) tensors, not a (classes, B, D) copy. No host sync.

Slot initial noise: N(0, 1) in train mode, the learned mean in eval mode, or the ``slot_noise`` argument
of ``forward`` (classes, K, h), which the reference tests use to make the step reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import ConfigError
from ..keys import key
from .base import SlotKeys, Surrogate, SurrogateOut, group_by_class, intra_class_mse, register, rows, soft_cell_stats
from .layers import GatedCrossAttention, GateKeys, SlotAttention, build_gates

ASSIGN_BETA_INIT = 10.0   # cosine logits in [-10, 10] at the start: clearly, not hard, assigned
MIN_MASS = 1e-12


@dataclass(frozen=True)
class SlotCrossKeys(GateKeys, SlotKeys):
    stats_on: str = key("raw", "statistics on the raw encoder features (raw) or on the cross-attended tokens "
                        "(enhanced, the seed's reading; joint fit only)", choices=("raw", "enhanced"))
    slot_temp: Optional[float] = key(None, "extra damping of slot logits (empty = hidden_dim**0.25)",
                                     lo=0.0, lo_open=True, derived_from=("cem.hidden_dim",))


@register("slot_cross")
class SlotCross(Surrogate):
    Keys = SlotCrossKeys
    # cem.strength=matched: each trial measures the loss scale with which one unit of lambda pulls on its encoder as
    # gmm's does (cem_bench/core/strength.py); cem.loss_scale is the fixed scale of cem.strength=fixed, calibrated at the
    # synthetic reference state (docs/estimators.md, "One lambda scale"); the seed's own weight was 0.25.
    defaults = {"cem.strength": "matched",
                "cem.loss_scale": 0.93, "cem.warmup_epochs": 3, "cem.grad_mode": "inject"}

    @classmethod
    def complete(cls, params: dict, cfg) -> dict:
        if params["slot_temp"] is None:      # seeds 002/004: damping by the fourth root of the width
            params = {**params, "slot_temp": float(params["hidden_dim"]) ** 0.25}
        return params

    @classmethod
    def check(cls, cem) -> None:
        if cem.estimator_fit == "adversarial" and cem.stats_on == "enhanced":
            raise ConfigError("cem.stats_on: 'enhanced' statistics live in a learned space whose scale the "
                              "estimator could grow without bound under cem.estimator_fit=adversarial; "
                              "allowed with adversarial: raw (or use cem.estimator_fit=joint)")

    def __init__(self, cfg, feature_shape, num_classes):
        super().__init__(cfg, feature_shape, num_classes)
        c = self.cfg
        h = c.hidden_dim
        self.proj_in = nn.Linear(self.dim, h)
        self.slot_attn = SlotAttention(h, c.num_slots, c.num_iterations, temperature=c.slot_temp)
        self.cross = GatedCrossAttention(h, c.num_heads)
        self.log_assign_beta = nn.Parameter(torch.tensor(math.log(ASSIGN_BETA_INIT)))
        self.gates = build_gates(self, self.dim if c.stats_on == "raw" else h)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Step 1: e = P(LN(x)), (..., D) -> (..., h)."""
        return self.proj_in(F.layer_norm(x, x.shape[-1:]))

    def responsibilities(self, y_tok: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Step 4: r (..., M, K) = softmax_k(beta_a * cos(LN(y), slot_k)) for tokens (..., M, h), slots (..., K, h)."""
        cos = F.normalize(F.layer_norm(y_tok, y_tok.shape[-1:]), dim=-1) @ F.normalize(slots, dim=-1).transpose(-1, -2)
        return (self.log_assign_beta.exp() * cos).softmax(-1)

    def forward(self, z: torch.Tensor, y: torch.Tensor, slot_noise: torch.Tensor | None = None) -> SurrogateOut:
        if slot_noise is None:   # drawn first: a compiled forward breaks its graph here only
            slot_noise = self.slot_attn.draw_noise(self.num_classes, self.rng)
        with torch.autocast(z.device.type, enabled=False):   # statistics in fp32 (docs/surrogates.md, common contract)
            return self._forward(z.float(), y, slot_noise)

    def _forward(self, z, y, slot_noise) -> SurrogateOut:
        c = self.cfg
        g_cls = self.num_classes
        x = z.flatten(1)
        b_sz = x.shape[0]
        padded, mask, counts, pos = group_by_class(self.tokens(x), y, g_cls)       # (G, B, h), (G, B), (G,), (B,)
        slots, _ = self.slot_attn(padded, mask, noise=slot_noise)                   # (G, K, h)
        y_tok = self.cross(padded, slots, mask)                                     # (G, B, h)
        resp = self.responsibilities(y_tok, slots)                                  # (G, B, K)

        r = rows(resp, y, pos)                                                      # (B, K), back to the samples
        s = x if c.stats_on == "raw" else rows(y_tok, y, pos)                       # (B, S)
        mass, mu, var = soft_cell_stats(s, y, r, g_cls, MIN_MASS)                   # (G, K), (G, K, S) x 2
        gate = self.gates(mu, var)                                                  # term (G, K)

        share = (mass / counts.clamp(min=1).unsqueeze(1)).clamp(min=MIN_MASS).pow(c.slot_power)
        pi = share / share.sum(1, keepdim=True)                                     # (G, K)
        class_loss = (pi * gate.term).sum(1)                                        # L_c (G,)

        frac = counts / b_sz
        counted = (counts >= 2).to(x.dtype)                                         # M_c < 2 contributes nothing
        class_gate = torch.sigmoid(c.class_gate_a * (frac - c.class_gate_b))
        weight = frac * counted
        loss = (weight * class_gate * class_loss).sum() / weight.sum().clamp(min=1e-30)

        with torch.no_grad():   # the logs: means over the counted classes, all in one batch (few kernels)
            gated = (pi * torch.stack([gate.dim_gate, gate.snr_gate, gate.penalty]).mean(-1)).sum(-1)   # (3, G)
            per_class = torch.cat([gated, class_gate.unsqueeze(0), pi.amax(1).unsqueeze(0)])          # (5, G)
            means = (per_class * counted).sum(1) / counted.sum().clamp(min=1)
            alphas = torch.tanh(torch.stack([self.cross.alpha_xattn, self.cross.alpha_ffn]))
        logs = {
            "rob_loss": loss.detach(),
            "intra_mse": intra_class_mse(x, y, g_cls, counts),
            "gate_dim": means[0], "gate_snr": means[1], "gate_class": means[3], "hinge": means[2],
            "slot_weight_max": means[4],
            "assign_beta": self.log_assign_beta.detach().exp(),
            "alpha_xattn": alphas[0], "alpha_ffn": alphas[1],
        }
        return SurrogateOut(loss, logs)
