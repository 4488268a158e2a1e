"""Batched clustering of many small point sets at once, on the device: one set per class, padded to a
(sets, members, D) tensor with a mask. k-means++ seeding (probability proportional to D², as the paper's
reference meant), Lloyd iterations with empty clusters re-seeded at the farthest point, and diagonal-covariance
EM started from k-means. The ``gmm`` surrogate refits with it at every epoch end (docs/reference.md §5.1);
tests/test_gmm.py checks it against scikit-learn. It is not a plug-in (the registry skips it) and imports
nothing of the project."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

MAX_LLOYD_ITERS = 50
MAX_EM_ITERS = 50
EM_TOL = 1e-5
MIN_VAR = 1e-6
FAR = 1e30
COMPACT_AT = 0.75  # drop converged classes from the Lloyd batch once at most this share of it still moves


def pad_by_class(x: torch.Tensor, labels: torch.Tensor, g: int):
    """(G, N_max, D) features per class, (G, N_max) mask and (G,) counts. Syncs once (refit only)."""
    counts = torch.bincount(labels, minlength=g)[:g]
    n_max = max(1, int(counts.max()))
    order = torch.argsort(labels, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.empty_like(order)
    pos[order] = torch.arange(len(labels), device=x.device) - starts[labels[order]]  # rank within the class
    padded = x.new_zeros(g, n_max, x.shape[1])
    padded[labels, pos] = x
    mask = torch.zeros(g, n_max, dtype=torch.bool, device=x.device)
    mask[labels, pos] = True
    return padded, mask, counts.to(x.dtype)


def _sqdist(x: torch.Tensor, c: torch.Tensor, x2: torch.Tensor | None = None) -> torch.Tensor:
    """Squared distances (G, N, K) between points (G, N, D) and centroids (G, K, D); ``x2`` = |x|^2 (G, N)."""
    if x2 is None:
        x2 = x.pow(2).sum(-1)
    return (_scores(x, c) + x2.unsqueeze(-1)).clamp_(min=0)


def _scores(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """|c|^2 - 2 x.c (G, N, K): the squared distance less |x|^2, enough for the nearest centroid."""
    return torch.baddbmm(c.pow(2).sum(-1).unsqueeze(1), x, c.transpose(1, 2), alpha=-2)


def cluster_sums(x: torch.Tensor, mask: torch.Tensor, assign: torch.Tensor, k: int):
    """Per-cluster sums (G, K, D) and member counts (G, K) of the masked points (G, N, D) under ``assign``.

    On CPU a scatter (``index_add_``: N x D additions, sequential, deterministic) is 2-3x faster than the
    one-hot matmul (K x N x D multiply-adds); on CUDA the matmul is deterministic where the scatter's
    atomics are not, and costs nothing at these sizes."""
    g, n, d = x.shape
    if x.is_cuda:
        onehot = F.one_hot(assign, k).to(x.dtype) * mask.unsqueeze(-1)
        return onehot.transpose(1, 2) @ x, onehot.sum(1)
    slot = torch.where(mask, torch.arange(g, device=x.device).unsqueeze(1) * k + assign, g * k).flatten()
    sums = x.new_zeros(g * k + 1, d).index_add_(0, slot, x.reshape(-1, d))   # row g*k collects padding
    counts = torch.bincount(slot, minlength=g * k + 1).to(x.dtype)
    return sums[:-1].view(g, k, d), counts[:-1].view(g, k)


def kmeans_pp(x: torch.Tensor, mask: torch.Tensor, k: int, gen: torch.Generator,
              x2: torch.Tensor | None = None) -> torch.Tensor:
    """k-means++ seeding for every class at once: each new seed drawn with probability ~ D^2."""
    g, n, d = x.shape
    rows = torch.arange(g, device=x.device)
    if x2 is None:
        x2 = x.pow(2).sum(-1)
    w = mask.to(x.dtype)
    w[:, 0] += (mask.sum(1) == 0).to(x.dtype)  # an empty class still draws (a zero point), harmlessly
    first = torch.multinomial(w, 1, generator=gen).squeeze(1)
    cents = [x[rows, first]]
    d2 = _sqdist(x, cents[0].unsqueeze(1), x2).squeeze(-1)
    for _ in range(1, k):
        p = d2 * mask
        none_left = p.sum(1) <= 0           # fewer distinct points than clusters: any member will do
        p = torch.where(none_left.unsqueeze(1), w, p)
        idx = torch.multinomial(p, 1, generator=gen).squeeze(1)
        c = x[rows, idx]
        cents.append(c)
        d2 = torch.minimum(d2, _sqdist(x, c.unsqueeze(1), x2).squeeze(-1))
        d2[rows, idx] = 0  # exactly: a chosen point is never drawn again because of rounding
    return torch.stack(cents, 1)


def kmeans(x: torch.Tensor, mask: torch.Tensor, k: int, gen: torch.Generator, init: torch.Tensor | None = None,
           init_valid: torch.Tensor | None = None, max_iters: int = MAX_LLOYD_ITERS):
    """Lloyd's algorithm on every class at once, each class until none of its assignments changes
    (<= ``max_iters``); a converged class drops out of the batch (its centroids are a fixed point).

    Returns centroids (G, K, D), assignments (G, N), the iterations of the slowest class and the mean
    iterations per class. Empty clusters of a class with at least K members are re-seeded at the member
    farthest from its centroid.
    """
    g, n, _ = x.shape
    x2 = x.pow(2).sum(-1)
    if init is None:
        cents = kmeans_pp(x, mask, k, gen, x2)
    else:
        cents = init.clone()
        if init_valid is not None and not bool(init_valid.all()):
            fresh = kmeans_pp(x, mask, k, gen, x2)
            cents = torch.where(init_valid.unsqueeze(-1), cents, fresh)
    class_n = mask.sum(1)
    active = torch.arange(g, device=x.device)     # classes still iterating; xa/ma/ca: their slices
    xa, ma, ca = x, mask, cents
    class_iters = 0
    prev = None
    it = 0
    for it in range(1, max_iters + 1):  # noqa: B007 - the count is returned
        scores = _scores(xa, ca)
        assign = scores.argmin(-1)
        class_iters += len(active)
        if prev is not None:
            moved = ((assign != prev) & ma).any(1)
            n_moved = int(moved.sum())
            if n_moved == 0:
                break
            if n_moved <= COMPACT_AT * len(active):  # compact; a few converged classes may ride along until then
                keep = moved.nonzero().squeeze(1)
                cents[active] = ca
                active, xa, ma, ca, assign, scores = (active[keep], xa[keep], ma[keep], ca[keep], assign[keep],
                                                      scores[keep])
        sums, n_ck = cluster_sums(xa, ma, assign, k)
        new = sums / n_ck.clamp(min=1).unsqueeze(-1)
        empty = (n_ck == 0) & (class_n[active] >= k).unsqueeze(1)
        ca = torch.where(n_ck.unsqueeze(-1) > 0, new, ca)
        if bool(empty.any()):
            mind = (scores.gather(-1, assign.unsqueeze(-1)).squeeze(-1) + x2[active]).masked_fill(~ma, -1)
            for c, j in empty.nonzero().tolist():  # rare; refit only
                far = int(mind[c].argmax())
                ca[c, j] = xa[c, far]
                mind[c, far] = -1
            prev = None  # the re-seed changes the next assignment; do not stop on it
            continue
        prev = assign
    cents[active] = ca
    assign = _scores(x, cents).argmin(-1)
    return cents, assign, it, class_iters / max(g, 1)


def diag_em(x, mask, mu, var, pi, valid, max_iters: int = MAX_EM_ITERS, tol: float = EM_TOL):
    """Diagonal-covariance Gaussian mixture per class by EM, started from the k-means result."""
    m = mask.to(x.dtype)
    counts = m.sum(1).clamp(min=1)
    var = var.clamp(min=MIN_VAR)
    prev_ll = None
    n_k = pi * counts.unsqueeze(1)
    for _ in range(max_iters):
        inv = 1.0 / var                                                   # (G, K, D)
        # log N(x; mu_k, diag var_k) via matmuls: sum_d x^2/v - 2 x (mu/v) + mu^2/v
        quad = (x.pow(2) @ inv.transpose(1, 2)) - 2 * (x @ (mu * inv).transpose(1, 2)) \
            + (mu.pow(2) * inv).sum(-1).unsqueeze(1)
        logdet = torch.log(var).sum(-1).unsqueeze(1)
        logp = -0.5 * (quad + logdet + x.shape[-1] * math.log(2 * math.pi))
        logp = logp + torch.log(pi.clamp(min=1e-12)).unsqueeze(1)
        logp = logp.masked_fill(~valid.unsqueeze(1), float("-inf"))
        lse = torch.logsumexp(logp, -1, keepdim=True)
        r = torch.exp(logp - lse) * m.unsqueeze(-1)                        # (G, N, K)
        ll = float((lse.squeeze(-1) * m).sum() / m.sum().clamp(min=1))
        n_k = r.sum(1)
        pi = n_k / counts.unsqueeze(1)
        mu = (r.transpose(1, 2) @ x) / n_k.clamp(min=1e-12).unsqueeze(-1)
        ex2 = (r.transpose(1, 2) @ x.pow(2)) / n_k.clamp(min=1e-12).unsqueeze(-1)
        var = (ex2 - mu.pow(2)).clamp(min=MIN_VAR)
        valid = valid & (n_k > 1e-6)
        if prev_ll is not None and abs(ll - prev_ll) < tol * max(1.0, abs(prev_ll)):
            break
        prev_ll = ll
    return mu, var, pi, n_k * valid
