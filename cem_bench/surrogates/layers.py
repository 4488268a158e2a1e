"""Attention layers and gate blocks shared by several surrogates (docs/surrogates.md §2-§6).

* ``SlotAttention``: Locatello et al. 2020 on a padded batch of sets (``mask`` marks the real tokens), with
  the extra damping, temperature schedule and slot competition that seeds 001/002/004 add.
* ``GatedCrossAttention``: Flamingo's gated xattn-dense block (design note 004): tokens attend to a context
  (the slots) and the result is written back through ``tanh(alpha)`` gates that start almost closed.
* ``VarianceGates``: the gate/penalty block of §2 step 4 (dimension gate, SNR gate, softplus hinge), used
  per class by ``gated_attention`` and per (class, slot) by ``slot_cross``.
* ``class_softmax``: per-class softmax over samples, without a host sync.

Everything works on whole batches of sets at once; the only Python loop is over SlotAttention iterations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..keys import key

SNR_EPS = 1e-6   # epsilon of the SNR gate sigma^2 / (mu^2 + eps)
# a random stream: a generator, or a function of the device that returns one (``Surrogate.rng``)
Rng = torch.Generator | Callable[[torch.device], torch.Generator] | None


def eager(fn: Callable) -> Callable:
    """Mark ``fn`` (a function or a method) as one a ``torch.compile``d surrogate (``train.compile_surrogate``)
    runs eagerly: a random draw, which Dynamo cannot trace from a ``torch.Generator``. ``disable_marked`` puts
    ``torch.compiler.disable`` on it when a surrogate is first compiled, not this decorator: that imports Dynamo,
    which a process that only reads the surrogates (a search driver, for their keys) would otherwise pay."""
    fn.eager_in_compile = True
    return fn


def disable_marked(surrogate: nn.Module) -> None:
    """``torch.compiler.disable`` on every ``eager`` function of this module and of the classes of ``surrogate``
    and its submodules (and their bases), in place: a call through the class or this module gets the disabled
    one. A name imported from here keeps the unmarked function (serial_enhanced calls ``dropout_keep`` only inside
    its own ``eager`` ``draws``). Idempotent."""
    import sys
    owners = {c for m in surrogate.modules() for c in type(m).__mro__} | {sys.modules[__name__]}
    for owner in owners:
        for name, fn in list(vars(owner).items()):
            if getattr(fn, "eager_in_compile", None) is True:
                disabled = torch.compiler.disable(fn)
                disabled.eager_in_compile = "disabled"
                setattr(owner, name, disabled)


@dataclass(frozen=True)
class GateKeys:
    """The keys of ``VarianceGates`` and the class gate (gated_attention and slot_cross, design note 003)."""
    snr_thresh: float = key(0.3, "SNR gate threshold on var/(mean^2+eps)", lo=0.0)
    snr_sharp: float = key(10.0, "SNR gate sharpness", lo=0.0)
    snr_gate_grad: bool = key(True, "the encoder's gradient flows through the SNR gate's class statistics (note "
                                    "003; the encoder can then close the gate by shifting a class mean: "
                                    "docs/estimators.md); false: the gate only weights the penalty")
    softplus_beta: float = key(1.0, "beta of the softplus hinge", lo=0.0, lo_open=True)
    margin: float = key(0.1, "margin m of the softplus hinge (in log-variance units)")
    slot_power: float = key(2.0, "exponent of slot/class weights", lo=0.0)
    class_gate_a: float = key(10.0, "class gate sharpness a in sigmoid(a*(M_c/B - b))", lo=0.0)
    class_gate_b: float = key(0.05, "class gate offset b in sigmoid(a*(M_c/B - b))", lo=0.0, hi=1.0)


class SlotAttention(nn.Module):
    """Locatello et al. 2020 on a padded batch of sets.

    ``forward(inputs (N, M, dim), mask (N, M) bool | None, noise (N, K, dim) | None, generator)`` returns
    ``slots (N, K, dim)`` and ``attn (N, M, K)``: the last iteration's assignment of each token over the
    slots (softmax over slots + eps; rows of masked tokens are 0).

    Initial slots are ``mu + exp(log_sigma) * noise`` with learnable ``mu``, ``log_sigma`` (1, 1, dim); the
    noise is the given ``noise``, else N(0, 1) from ``generator`` in train mode and 0 (the mean) in eval mode.
    Each iteration:
    ``q = W_q LN(slots)``; ``logits = k.q / (sqrt(dim) * temperature * temp_schedule(t))``; softmax over
    slots (slots compete for tokens), + eps, masked tokens set to 0, renormalised over tokens; updates =
    weighted mean of v; ``slots = GRU(updates, slots)``; ``slots += MLP(LN(slots))``; with ``competition``
    also ``slots *= sigmoid(MLP_c(slots))`` (design note 001: a per-slot scalar weight). An all-masked set gives
    finite slots (its updates are 0).
    """

    def __init__(self, dim: int, num_slots: int, num_iterations: int, mlp_hidden: int | None = None,
                 temperature: float = 1.0, temp_schedule: Callable[[int], float] | None = None,
                 competition: bool = False, eps: float = 1e-8):
        super().__init__()
        self.dim, self.num_slots, self.num_iterations = dim, num_slots, num_iterations
        self.temperature = float(temperature)
        self.temp_schedule = temp_schedule
        self.eps = eps
        mlp_hidden = mlp_hidden or 2 * dim   # Locatello: slot size 64, MLP hidden 128
        self.slots_mu = nn.Parameter(torch.empty(1, 1, dim))
        self.slots_log_sigma = nn.Parameter(torch.empty(1, 1, dim))
        nn.init.xavier_uniform_(self.slots_mu)
        nn.init.xavier_uniform_(self.slots_log_sigma)
        self.norm_inputs = nn.LayerNorm(dim)
        self.norm_slots = nn.LayerNorm(dim)
        self.norm_mlp = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(dim, dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.gru = nn.GRUCell(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_hidden), nn.ReLU(), nn.Linear(mlp_hidden, dim))
        self.competition = (nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1))
                            if competition else None)

    @eager
    def draw_noise(self, n: int, generator: Rng) -> Tensor | None:
        """The noise of ``n`` sets' initial slots, (n, K, dim) ~ N(0, 1) from ``generator``, in train mode; None
        in eval mode (the slots start at their mean). The same numbers ``forward`` would draw itself. A
        surrogate calls it first thing in its forward and passes the noise on: a ``torch.compile``d forward
        (``train.compile_surrogate``) then breaks its graph once, at the top, and the rest is one graph (a
        draw deep inside nested calls split every enclosing frame into separately compiled pieces)."""
        if not self.training:
            return None
        return draw(torch.randn, (n, self.num_slots, self.dim), generator, self.slots_mu.device, self.slots_mu.dtype)

    def initial_slots(self, n: int, noise: Tensor | None = None, generator: Rng = None) -> Tensor:
        mu = self.slots_mu.expand(n, self.num_slots, self.dim)
        if noise is None:
            if not self.training:
                return mu
            noise = draw(torch.randn, mu.shape, generator, mu.device, mu.dtype)
        return mu + torch.exp(self.slots_log_sigma) * noise

    def forward(self, inputs: Tensor, mask: Tensor | None = None, noise: Tensor | None = None,
                generator: Rng = None):
        n, m, d = inputs.shape
        k_slots = self.num_slots
        x = self.norm_inputs(inputs)
        k, v = self.to_k(x), self.to_v(x)
        keep = None if mask is None else mask.unsqueeze(-1).to(inputs.dtype)       # (N, M, 1)
        slots = self.initial_slots(n, noise, generator)
        attn = inputs.new_zeros(n, m, k_slots)
        for t in range(self.num_iterations):
            prev = slots
            q = self.to_q(self.norm_slots(slots))
            damp = math.sqrt(d) * self.temperature * (self.temp_schedule(t) if self.temp_schedule else 1.0)
            logits = torch.einsum("nmd,nkd->nmk", k, q) / damp
            attn = logits.softmax(-1) + self.eps                                    # slots compete per token
            if keep is not None:
                attn = attn * keep
            weights = attn / attn.sum(1, keepdim=True).clamp(min=1e-30)             # mean over tokens
            updates = torch.einsum("nmk,nmd->nkd", weights, v)
            slots = self.gru(updates.reshape(-1, d), prev.reshape(-1, d)).view(n, k_slots, d)
            slots = slots + self.mlp(self.norm_mlp(slots))
            if self.competition is not None:
                slots = slots * torch.sigmoid(self.competition(slots))
        return slots, attn


class GatedCrossAttention(nn.Module):
    """Flamingo gated xattn-dense: tokens attend to context (slots).

    ``forward(tokens (N, M, dim), context (N, K, dim), token_mask (N, M) bool | None) -> (N, M, dim)``::

        y = x + tanh(alpha_x) * proj(MHA(q = LN_q(x), k = v = LN_kv(context)))
        y = y + tanh(alpha_f) * FFN(LN_f(y))

    ``alpha_x``, ``alpha_f`` are learnable scalars initialised to ``alpha_init`` (0.1: the block starts almost
    closed). Rows of masked tokens are returned as 0.
    """

    def __init__(self, dim: int, num_heads: int, ffn_mult: int = 4, alpha_init: float = 0.1):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"num_heads {num_heads} must divide dim {dim}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.ln_q = nn.LayerNorm(dim)
        self.ln_kv = nn.LayerNorm(dim)
        self.ln_ff = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(dim, dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_mult * dim), nn.GELU(), nn.Linear(ffn_mult * dim, dim))
        self.alpha_xattn = nn.Parameter(torch.tensor(float(alpha_init)))
        self.alpha_ffn = nn.Parameter(torch.tensor(float(alpha_init)))

    def forward(self, tokens: Tensor, context: Tensor, token_mask: Tensor | None = None) -> Tensor:
        n, m, d = tokens.shape
        h, hd = self.num_heads, self.head_dim
        q = self.to_q(self.ln_q(tokens)).view(n, m, h, hd)
        ctx = self.ln_kv(context)
        k = self.to_k(ctx).view(n, -1, h, hd)
        v = self.to_v(ctx).view(n, -1, h, hd)
        attn = (torch.einsum("nmhe,nkhe->nhmk", q, k) / math.sqrt(hd)).softmax(-1)
        out = torch.einsum("nhmk,nkhe->nmhe", attn, v).reshape(n, m, d)
        y = tokens + torch.tanh(self.alpha_xattn) * self.proj(out)
        y = y + torch.tanh(self.alpha_ffn) * self.ffn(self.ln_ff(y))
        if token_mask is not None:
            y = y * token_mask.unsqueeze(-1).to(y.dtype)
        return y


@dataclass
class GateOut:
    term: Tensor      # (...,)   mean over dimensions of g * h * p: the penalty of each group
    dim_gate: Tensor  # (..., D) g, sigmoid(MLP(LN(log(var + gamma))))
    snr_gate: Tensor  # (..., D) h, sigmoid(snr_sharp * (var / (mu^2 + SNR_EPS) - snr_thresh))
    penalty: Tensor   # (..., D) p, softplus(beta * (log(var + gamma) - t - margin)) / beta


class VarianceGates(nn.Module):
    """The gate/penalty block of docs/surrogates.md §2 step 4, for any number of groups at once.

    ``VarianceGates(dim, hidden_dim, hinge_level, var_eps, snr_thresh, snr_sharp, softplus_beta, margin)``;
    ``forward(mean (..., dim), var (..., dim)) -> GateOut``. With ``lv = log(var + var_eps)``:

    * dimension gate ``g = sigmoid(MLP(LN(lv)))``, MLP dim -> hidden_dim -> dim (GELU), LN with affine;
    * SNR gate ``h = sigmoid(snr_sharp * (var / (mean^2 + SNR_EPS) - snr_thresh))``, from detached statistics
      when ``snr_gate_grad`` is false (then the encoder cannot lower the term by moving a class mean, only by
      shrinking its spread; note 003 keeps the gradient, the default);
    * penalty ``p = softplus(beta * (lv - t - margin)) / beta`` with ``t = hinge_level = log(tau*sigma^2 +
      var_eps)``, so var_eps (gamma) sits inside both logs, as in ``gmm``: var = 0 gives a finite loss and
      p is small exactly when var is well below tau*sigma^2;
    * ``term = mean_d(g * h * p)``.

    ``build_gates(surrogate, dim)`` makes one from a surrogate's resolved ``CemConfig``.
    """

    def __init__(self, dim: int, hidden_dim: int, hinge_level: float, var_eps: float, snr_thresh: float,
                 snr_sharp: float, softplus_beta: float, margin: float, snr_gate_grad: bool = True):
        super().__init__()
        self.hinge_level, self.var_eps = float(hinge_level), float(var_eps)
        self.snr_thresh, self.snr_sharp = float(snr_thresh), float(snr_sharp)
        self.snr_gate_grad = bool(snr_gate_grad)
        self.beta, self.margin = float(softplus_beta), float(margin)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, dim))

    def forward(self, mean: Tensor, var: Tensor) -> GateOut:
        logvar = torch.log(var + self.var_eps)
        g = torch.sigmoid(self.mlp(self.norm(logvar)))
        m, v = (mean, var) if self.snr_gate_grad else (mean.detach(), var.detach())
        h = torch.sigmoid(self.snr_sharp * (v / (m.pow(2) + SNR_EPS) - self.snr_thresh))
        p = F.softplus(self.beta * (logvar - self.hinge_level - self.margin)) / self.beta
        return GateOut((g * h * p).mean(-1), g, h, p)


def build_gates(surrogate, dim: int) -> VarianceGates:
    """``VarianceGates`` over ``dim`` statistics from ``surrogate.cfg`` (a resolved CemConfig)."""
    c = surrogate.cfg
    return VarianceGates(dim, c.hidden_dim, surrogate.hinge_level, c.var_eps, c.snr_thresh, c.snr_sharp,
                         c.softplus_beta, c.margin, c.snr_gate_grad)


@eager
def dropout_keep(shape, p: float, training: bool, generator: Rng, device, dtype=torch.float32) -> Tensor | None:
    """The keep mask (``shape``, bool) of an inverted dropout with rate ``p``, drawn from ``generator``
    (``F.dropout`` can only use the global RNG); None when nothing is dropped (eval mode, ``p`` = 0). Apply
    with ``dropout(x, keep, p)``. Drawn apart from its use so that a surrogate can draw first thing in its
    forward (see ``SlotAttention.draw_noise``)."""
    if not training or p == 0:
        return None
    return draw(torch.rand, shape, generator, device, dtype) >= p


def dropout(x: Tensor, keep: Tensor | None, p: float) -> Tensor:
    """``x`` with the entries that ``keep`` (``dropout_keep``) drops set to 0 and the rest scaled by 1/(1-p)."""
    return x if keep is None else x * keep / (1 - p)


@eager
def draw(fn: Callable, shape, generator: Rng, device, dtype) -> Tensor:
    """``fn(shape, generator=...)`` (``torch.randn``, ``torch.rand``), kept out of a ``torch.compile`` graph
    (``train.compile_surrogate``): Dynamo cannot trace a ``torch.Generator``, so the draw runs eagerly, from
    the same stream and in the same order as without compile, and the graph breaks once around it.
    ``generator``: a generator, or a function of the device that returns one (``Surrogate.rng``, passed
    uncalled so that the compiled code never holds the generator)."""
    gen = generator if generator is None or isinstance(generator, torch.Generator) else generator(device)
    return fn(shape, generator=gen, device=device, dtype=dtype)


def class_softmax(logits: Tensor, y: Tensor, num_classes: int) -> Tensor:
    """Softmax of ``logits`` (B,) over the members of each sample's class, no host sync."""
    with torch.no_grad():   # the shift only stabilises; softmax does not depend on it
        top = logits.new_full((num_classes,), -torch.inf).scatter_reduce(0, y, logits, "amax")
    e = torch.exp(logits - top[y])
    denom = logits.new_zeros(num_classes).index_add(0, y, e)
    return e / denom.index_select(0, y)
