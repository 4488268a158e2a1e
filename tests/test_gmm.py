import math

import pytest
import torch

from cem_bench import surrogates
from cem_bench.config import ModelConfig, TrialConfig
from cem_bench.core.models import build as build_models
from cem_bench.surrogates.clustering import kmeans, kmeans_pp, pad_by_class

COVERS = ("gmm",)   # its vectorised step against a per-class loop, its k-means against scikit-learn


def make(fit="kmeans", entropy="isotropic", shape=(2, 4, 4), classes=4, sigma=0.1, k=3, about="centroid"):
    cfg = surrogates.resolve(TrialConfig.from_flat({
        "cem.gmm_fit": fit, "cem.entropy": entropy, "defense.noise_std": sigma, "cem.num_clusters": k,
        "cem.spread_about": about}))
    return surrogates.build(cfg, shape, classes)


def blobs(classes=4, k=3, per=40, dim=32, spread=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(classes, k, dim, generator=g)
    xs, ys, which = [], [], []
    for c in range(classes):
        for j in range(k):
            xs.append(centres[c, j] + spread * torch.randn(per, dim, generator=g))
            ys += [c] * per
            which += [j] * per
    return torch.cat(xs), torch.tensor(ys), torch.tensor(which), centres


def loop_reference(s, z, y):
    """Plain per-class, per-cluster loop of docs/surrogates.md §1 on the surrogate's fitted tables."""
    x = z.flatten(1).float()
    t = math.log(s.cfg.var_threshold * s.noise_std ** 2 + s.cfg.var_eps)
    total, counted = 0.0, 0
    for c in range(s.num_classes):
        idx = (y == c).nonzero().flatten().tolist()
        if len(idx) < 2:
            continue
        counted += 1
        assign = {}
        for i in idx:
            best, best_d = None, None
            for k in range(s.k):
                if not bool(s.valid[c, k]):
                    continue
                d = float(((x[i] - s.centroids[c, k]) ** 2).sum())
                if best_d is None or d < best_d:
                    best, best_d = k, d
            assign.setdefault(best, []).append(i)
        for k, members in assign.items():
            n = len(members)
            about = s.centroids[c, k] if s.cfg.spread_about == "centroid" else x[members].mean(0)
            sq = torch.stack([(x[i] - about) ** 2 for i in members])  # (n, D)
            alpha = s.cfg.shrink * n / float(s.pi[c, k] * s.cluster_n[c].sum() / s.pi[c].sum())
            alpha = 0.99 if alpha >= 1 else alpha          # the reference's `if var_lambda>=1: var_lambda=0.99`
            if s.cfg.entropy == "isotropic":
                v_hat = alpha * sq.mean() + (1 - alpha) * s.var_iso[c, k]
                term = torch.relu(torch.log(v_hat + s.cfg.var_eps) - t)
            else:
                v_hat = alpha * sq.mean(0) + (1 - alpha) * s.var_diag[c, k]
                term = torch.relu(torch.log(v_hat + s.cfg.var_eps) - t).mean()
            total = total + s.pi[c, k] * term
    return total / max(counted, 1)


@pytest.mark.parametrize("about", ["centroid", "batch_mean"])
@pytest.mark.parametrize("fit", ["kmeans", "em"])
@pytest.mark.parametrize("entropy", ["isotropic", "diag"])
def test_vectorised_equals_loop(fit, entropy, about):
    x, y, _, _ = blobs(dim=32, spread=0.2)
    s = make(fit, entropy, about=about)
    s.refit(x.view(-1, 2, 4, 4), y)
    g = torch.Generator().manual_seed(1)
    zb = torch.rand(30, 2, 4, 4, generator=g)
    yb = torch.randint(0, 4, (30,), generator=g)
    yb[0] = 3
    yb[1:] = torch.where(yb[1:] == 3, torch.zeros_like(yb[1:]), yb[1:])  # class 3 is a singleton
    out = s(zb, yb)
    ref = loop_reference(s, zb, yb)
    assert float(out.loss) == pytest.approx(float(ref), rel=1e-4, abs=1e-7)
    assert float(out.loss) > 0


def test_refit_finds_well_separated_blobs():
    x, y, which, centres = blobs(spread=0.01)
    s = make(k=3)
    s.refit(x.view(-1, 2, 4, 4), y)
    for c in range(4):
        for j in range(3):
            d = ((s.centroids[c] - centres[c, j]) ** 2).sum(-1)
            assert float(d.min()) < 1e-3  # every true centre has a fitted centroid on it
    assert torch.allclose(s.pi, torch.full((4, 3), 1 / 3), atol=1e-6)
    assert torch.allclose(s.var_iso, torch.full((4, 3), 0.01 ** 2), rtol=0.3)


def test_kmeans_matches_sklearn_from_the_same_seeds():
    sk = pytest.importorskip("sklearn.cluster")
    x, y, _, _ = blobs(classes=1, k=4, spread=0.15, dim=8, seed=3)
    mask = torch.ones(1, len(x), dtype=torch.bool)
    seeds = kmeans_pp(x.unsqueeze(0), mask, 4, torch.Generator().manual_seed(0))
    cents, assign, _, _ = kmeans(x.unsqueeze(0), mask, 4, None, init=seeds)
    ours = float(((x - cents[0][assign[0]]) ** 2).sum())
    ref = sk.KMeans(4, init=seeds[0].double().numpy(), n_init=1, max_iter=50, tol=0,
                    algorithm="lloyd").fit(x.double().numpy())
    assert ours == pytest.approx(ref.inertia_, rel=1e-4)
    assert torch.allclose(cents[0].double(), torch.from_numpy(ref.cluster_centers_), atol=1e-4)


def test_kmeans_of_all_classes_matches_sklearn_per_class():
    # overlapping blobs of different spreads: the classes converge after different numbers of iterations
    # and drop out of the batch one by one; each must still end where sklearn ends from the same seeds
    sk = pytest.importorskip("sklearn.cluster")
    xs, ys = [], []
    for c, spread in enumerate((0.05, 0.3, 0.6, 1.0)):
        x, _, _, _ = blobs(classes=1, k=4, per=30 + 10 * c, spread=spread, dim=16, seed=10 + c)
        xs.append(x)
        ys.append(torch.full((len(x),), c))
    x, y = torch.cat(xs), torch.cat(ys)
    padded, mask, _ = pad_by_class(x, y, 4)
    seeds = kmeans_pp(padded, mask, 4, torch.Generator().manual_seed(0))
    cents, assign, iters, class_iters = kmeans(padded, mask, 4, None, init=seeds)
    sk_iters = []
    for c in range(4):
        xc = x[y == c]
        ref = sk.KMeans(4, init=seeds[c].double().numpy(), n_init=1, max_iter=50, tol=0,
                        algorithm="lloyd").fit(xc.double().numpy())
        sk_iters.append(ref.n_iter_)
        n = len(xc)
        ours = float(((xc - cents[c][assign[c, :n]]) ** 2).sum())
        assert ours == pytest.approx(ref.inertia_, rel=1e-4), c
        assert torch.allclose(cents[c].double(), torch.from_numpy(ref.cluster_centers_), atol=1e-4), c
    assert len(set(sk_iters)) > 1  # the test exercises classes that stop at different iterations
    assert iters >= max(sk_iters) and class_iters < iters


@pytest.mark.parametrize("entropy", ["isotropic", "diag"])
def test_refit_statistics_equal_a_direct_computation(entropy):
    x, y, _, _ = blobs(spread=0.2, dim=32, seed=4)
    s = make(entropy=entropy)
    s.refit(x.view(-1, 2, 4, 4), y)
    for c in range(4):
        xc = x[y == c]
        nearest = ((xc.unsqueeze(1) - s.centroids[c].unsqueeze(0)) ** 2).sum(-1).argmin(1)
        for j in range(3):
            m = xc[nearest == j]
            assert len(m) > 1
            assert torch.allclose(s.centroids[c, j], m.mean(0), atol=1e-5)
            var = ((m - m.mean(0)) ** 2).mean(0)
            assert float(s.var_iso[c, j]) == pytest.approx(float(var.mean()), rel=1e-4)
            if entropy == "diag":
                assert torch.allclose(s.var_diag[c, j], var, rtol=1e-4, atol=1e-7)
            assert float(s.pi[c, j]) == pytest.approx(len(m) / len(xc))


def test_em_refines_towards_blob_variances():
    x, y, _, _ = blobs(spread=0.03)
    s = make(fit="em", entropy="diag")
    s.refit(x.view(-1, 2, 4, 4), y)
    assert torch.allclose(s.var_diag.mean(-1), torch.full((4, 3), 0.03 ** 2), rtol=0.3)
    assert torch.allclose(s.pi.sum(1), torch.ones(4), atol=1e-5)


def test_refit_warm_start_and_small_classes():
    x, y, _, _ = blobs()
    y[:3] = 3
    y[y == 3] = 0
    y[0] = 3  # class 3 has a single member: fewer points than clusters
    s = make()
    s.refit(x.view(-1, 2, 4, 4), y)
    assert int(s.valid[3].sum()) == 1 and float(s.pi[3].sum()) == pytest.approx(1.0)
    before = s.centroids.clone()
    s.refit(x.view(-1, 2, 4, 4), y)  # warm start: converged centroids stay put
    assert torch.allclose(before, s.centroids, atol=1e-5)


def test_gradient_reaches_the_encoder_and_not_the_fitted_centroids():
    """The CEM loss's gradient reaches every encoder parameter; the centroids are fitted (k-means), not trained,
    and take none. (That it reaches the encoder only, not the server, is the trainer's to keep:
    test_trainer.py's inject test, where both losses share one step.)"""
    client, _ = build_models(ModelConfig(width=0.125), 4)
    s = make(shape=(8, 8, 8))
    x = torch.randn(24, 3, 32, 32)
    y = torch.arange(24) % 4
    with torch.no_grad():
        s.refit(client(x), y)
    client.train()
    out = s(client(x), y)
    out.loss.backward()
    grads = [p.grad for p in client.parameters()]
    assert all(g is not None for g in grads) and sum(float(g.abs().sum()) for g in grads) > 0
    assert not s.centroids.requires_grad and s.centroids.grad is None and not list(s.parameters())


@pytest.mark.parametrize("k", [1, 3])
def test_about_the_batch_mean_the_pull_only_compacts(k):
    """cem.spread_about=batch_mean: the gradient of a cell's term sums to 0 over its members (nothing moves a cell's
    mean, as in the attention surrogates' per-class hinges); about the refitted centroid part of the pull moves
    the cell's mean toward the centroid (docs/estimators.md "Taken apart")."""
    x, y, _, _ = blobs(dim=32, spread=0.2)
    sums = {}
    for about in ("centroid", "batch_mean"):
        s = make(about=about, k=k)
        s.refit(x.view(-1, 2, 4, 4), y)
        zb = (x[::5] + 0.3).view(-1, 2, 4, 4).clone().requires_grad_()   # shifted: batch means off the centroids
        s(zb, y[::5]).loss.backward()
        g = zb.grad.flatten(1)
        with torch.no_grad():   # per (class, cell) sum of the members' gradients, as the step assigned them
            cents = s.centroids[y[::5]]
            slot = y[::5] * s.k + ((zb.flatten(1).unsqueeze(1) - cents).pow(2).sum(-1)).argmin(1)
        sums[about] = torch.zeros(s.num_classes * s.k, g.shape[1]).index_add_(0, slot, g).norm() / g.norm()
    assert float(sums["batch_mean"]) < 1e-5 and float(sums["centroid"]) > 0.5


def test_sigma_zero_hinges_at_log_gamma():
    s = make(sigma=0.0)
    x, y, _, _ = blobs(dim=32)
    s.refit(x.view(-1, 2, 4, 4), y)
    assert s.hinge_level == pytest.approx(math.log(0.01))
    assert torch.isfinite(s(x[:20].view(-1, 2, 4, 4), y[:20]).loss)
