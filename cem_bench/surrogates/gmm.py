"""``gmm``: the CEM paper's estimator (docs/surrogates.md §1, docs/reference.md §5).

What the paper's code really does is per-class hard k-means (K = 5) refitted at every epoch end, then per
batch a hinge on a shrunk log-variance of each sample's nearest own-class cluster. Reproduced here with
the reference's defects fixed:

* pi and the prior variance are looked up by (class, cluster), not by sample position (docs/reference.md §5.2's bug);
* empty clusters are re-seeded at the point farthest from its centroid, so the tables never misalign;
* the refit uses the clean training split (eval mode, no augmentation), not an extra augmented draw;
* k-means++ seeding samples with probability proportional to D^2 (the reference used D);
* sigma = 0 works: the hinge sits at log(gamma).

``cem.legacy_prior_indexing`` and ``cem.refit_augmented`` (both off by default) put the first and third
defects back, for reproducing the reference (docs/reference.md "Switches that reproduce the reference").

Everything runs on the training device, all classes at once: the refit on a (classes, members, D) padded
tensor, the per-batch term with ``index_add_`` over (class, cluster) slots. The step has no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..keys import key
from .base import Surrogate, SurrogateKeys, SurrogateOut, intra_class_mse, register, rows
from .clustering import FAR, cluster_sums, diag_em, kmeans, pad_by_class


@dataclass(frozen=True)
class GMMKeys(SurrogateKeys):
    num_clusters: int = key(5, "clusters per class", lo=1, hi=256)
    gmm_fit: str = key("kmeans", "refit by hard k-means (the paper's code) or diagonal EM started from it",
                       choices=("kmeans", "em"))
    entropy: str = key("isotropic", "hinge on the scalar variance (the paper's code) or per dimension",
                       choices=("isotropic", "diag"))
    shrink: float = key(10.0, "s in alpha = s*n/(pi*N_c) (0.99 where it reaches 1), batch-vs-prior shrinkage", lo=0.0)
    spread_about: str = key("centroid", "the batch term's spread about each cell's centroid refitted at the epoch's start "
                            "(the paper's code; eval-mode features) or about its members' own mean in the batch "
                            "(batch_mean: a pull that only compacts, as the attention surrogates' per-class hinges)",
                            choices=("centroid", "batch_mean"))
    legacy_prior_indexing: bool = key(False, "reproduce the reference's lookup defect: each class present in the "
                                      "batch takes pi, the prior variance and the cluster size from the class of the "
                                      "label-sorted sample at its class ordinal (almost always class 0) instead of "
                                      "its own (docs/reference.md §5.2, §11.1)")
    refit_augmented: bool = key(False, "refit on an extra shuffled, augmented pass over the training split (eval "
                                "mode, the trainer's augmentation and random stream) as the reference's epoch-end "
                                "feature pass did, instead of the clean split in order (docs/reference.md §5.1, "
                                "§11.4)")


@register("gmm")
class GMM(Surrogate):
    Keys = GMMKeys
    defaults = {"cem.loss_scale": 1.0, "cem.warmup_epochs": 1, "cem.grad_mode": "inject"}
    needs_refit = True
    fit_modes = ("refit",)   # no gradient-trained parameters: centroids and variances are refitted by clustering

    def __init__(self, cfg, feature_shape, num_classes):
        super().__init__(cfg, feature_shape, num_classes)
        g, k, d = num_classes, self.cfg.num_clusters, self.dim
        self.k = k
        self.seed = cfg.seed
        self.register_buffer("centroids", torch.zeros(g, k, d))
        self.register_buffer("var_iso", torch.zeros(g, k))     # mean over members and dimensions of (x-mu)^2
        self.register_buffer("var_diag", torch.zeros(g, k, d) if self.cfg.entropy == "diag" else torch.zeros(0))
        self.register_buffer("pi", torch.zeros(g, k))          # n_ck / N_c
        self.register_buffer("cluster_n", torch.zeros(g, k))   # n_ck = pi_ck * N_c
        self.register_buffer("valid", torch.zeros(g, k, dtype=torch.bool))
        self.register_buffer("_fitted", torch.zeros((), dtype=torch.bool))
        self._gen: torch.Generator | None = None
        self.last_fit_iters = 0         # Lloyd iterations of the slowest class at the last refit
        self.last_fit_class_iters = 0.0  # mean Lloyd iterations per class at the last refit

    @property
    def fitted(self) -> bool:
        return bool(self._fitted)

    @fitted.setter
    def fitted(self, value: bool) -> None:
        """Only ``False``: forget the clusters, so that the next refit starts cold (k-means++ seeding, then
        Lloyd from scratch) instead of from the previous centroids. Only ``refit`` makes it ``True``."""
        if value:
            raise ValueError("fitted can only be reset to False; refit() fits the clusters")
        self._fitted.fill_(False)

    # ------------------------------------------------------------------------------------ per batch
    def forward(self, z: torch.Tensor, y: torch.Tensor) -> SurrogateOut:
        g, k = self.num_classes, self.k
        x = z.flatten(1).float()
        b_sz = x.shape[0]
        # nearest centroid of the sample's own class (distances without gradient: mu is constant)
        with torch.no_grad():
            cents = self.centroids[y]                                      # (B, K, D)
            dist = (x.unsqueeze(1) - cents).pow(2).sum(-1)                 # (B, K)
            dist = dist.masked_fill(~self.valid[y], FAR)
            slot = y * k + dist.argmin(1)                                  # (B,) flat (class, cluster)
        ones = x.new_ones(b_sz)
        n = x.new_zeros(g * k).index_add_(0, slot, ones)
        n_safe = n.clamp(min=1)
        if self.cfg.spread_about == "batch_mean":
            # each cell's members' own mean in this batch (differentiable; its gradient terms cancel, so the pull
            # has no component along a cell's mean: it only compacts). A cell of one member has spread 0.
            # (gathered by ``rows``: plain indexing's backward adds by atomics on a multi-threaded CPU)
            mu = rows(x.new_zeros(g * k, x.shape[1]).index_add(0, slot, x) / n_safe.unsqueeze(1), slot)
        else:
            mu = self.centroids.view(g * k, -1)[slot]                      # constant: refitted at the epoch's start
        sq = (x - mu).pow(2)                                               # (B, D), differentiable in x
        class_n = x.new_zeros(g).index_add_(0, y, ones)
        pi, cluster_n, var_iso, var_diag = self.pi, self.cluster_n, self.var_iso, self.var_diag
        if self.cfg.legacy_prior_indexing:
            pi, cluster_n, var_iso, var_diag = self._legacy_tables(y, class_n)
        alpha = self.cfg.shrink * n / cluster_n.reshape(-1).clamp(min=1e-12)
        alpha = alpha.masked_fill(alpha >= 1, 0.99)                        # the reference's `if >= 1: 0.99`
        t = self.hinge_level
        if self.cfg.entropy == "isotropic":
            b = x.new_zeros(g * k).index_add_(0, slot, sq.mean(1)) / n_safe
            v_hat = alpha * b + (1 - alpha) * var_iso.reshape(-1)
            term = F.relu(torch.log(v_hat + self.cfg.var_eps) - t)
        else:  # diag: the same hinge per dimension, averaged over dimensions (closer to the log-det)
            b = x.new_zeros(g * k, x.shape[1]).index_add_(0, slot, sq) / n_safe.unsqueeze(1)
            v_hat = alpha.unsqueeze(1) * b + (1 - alpha.unsqueeze(1)) * var_diag.reshape(g * k, -1)
            term = F.relu(torch.log(v_hat + self.cfg.var_eps) - t).mean(1)
        term = pi.reshape(-1) * term * (n >= 1)
        counted = (class_n >= 2).to(x.dtype)                              # classes with M_c < 2 contribute nothing
        loss = (term.view(g, k).sum(1) * counted).sum() / counted.sum().clamp(min=1)
        logs = {"rob_loss": loss.detach(), "intra_mse": intra_class_mse(x, y, g, class_n)}
        return SurrogateOut(loss, logs)

    def _legacy_tables(self, y: torch.Tensor, class_n: torch.Tensor):
        """pi, cluster sizes and prior variances (G, K[, D]) as the reference's ``compute_class_means`` reads them
        (docs/reference.md §5.2): it stacks the tables per sample in label order, then indexes that stack with
        the ordinal of each class among the classes present in the batch. Class c, the o-th present class
        (from 0, ascending), so gets the tables of the class of the o-th label-sorted sample: in a batch of 128
        with about 13 per class, class 0's for every class. Centroids and assignments stay right. The cluster
        size in alpha is pi (of that class) times the class's own size N_c, where the reference used pi times
        a nominal class size the same for every class (docs/reference.md §11.5). Classes absent from the batch
        get some class's tables; they contribute nothing. No host sync: sort, cumsum and gathers."""
        present = (class_n >= 1).long()
        ordinal = (torch.cumsum(present, 0) - 1).clamp(min=0, max=y.shape[0] - 1)   # (G,)
        src = torch.sort(y).values[ordinal]                                          # (G,) the class read
        own_size = self.cluster_n.sum(1, keepdim=True)                              # N_c (G, 1)
        pi = self.pi[src]
        return pi, pi * own_size, self.var_iso[src], (self.var_diag[src] if self.var_diag.numel() else self.var_diag)

    # ------------------------------------------------------------------------------------ epoch refit
    @torch.no_grad()
    def refit(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Per-class k-means (and optionally diagonal EM) on the clean training features."""
        dev = self.centroids.device
        x = features.flatten(1).float().to(dev)
        labels = labels.to(dev)
        g, k = self.num_classes, self.k
        if self._gen is None:
            self._gen = torch.Generator(device=dev).manual_seed(1000003 * (self.seed + 1))
        padded, mask, counts = pad_by_class(x, labels, g)
        warm = self.centroids if self.fitted else None
        cents, assign, iters, class_iters = kmeans(padded, mask, k, self._gen, init=warm,
                                                   init_valid=self.valid if warm is not None else None)
        self.last_fit_iters, self.last_fit_class_iters = iters, class_iters
        sums, n_ck = cluster_sums(padded, mask, assign, k)               # (G, K, D), (G, K)
        cents = sums / n_ck.clamp(min=1).unsqueeze(-1)
        # per-dimension variance about each member's own centroid: exact (no E[x^2] - mu^2 cancellation)
        # and O(G N D) memory
        own = cents.flatten(0, 1)[(torch.arange(g, device=dev).unsqueeze(1) * k + assign)]   # (G, N, D)
        var_diag = cluster_sums((padded - own).pow_(2), mask, assign, k)[0] / n_ck.clamp(min=1).unsqueeze(-1)
        pi = n_ck / counts.clamp(min=1).unsqueeze(1)
        if self.cfg.gmm_fit == "em":
            cents, var_diag, pi, n_ck = diag_em(padded, mask, cents, var_diag, pi, n_ck > 0)
        valid = n_ck > 0
        self.centroids.copy_(cents)
        self.var_iso.copy_(var_diag.mean(-1) * valid)
        if self.cfg.entropy == "diag":
            self.var_diag.copy_(var_diag * valid.unsqueeze(-1))
        self.pi.copy_(pi * valid)
        self.cluster_n.copy_(pi * counts.unsqueeze(1) * valid)
        self.valid.copy_(valid)
        self._fitted.fill_(True)
