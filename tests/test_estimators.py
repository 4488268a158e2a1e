"""The estimator contract (docs/estimators.md): an entropy estimator whose own parameters are trained must
stay an estimate of the features' spread, not switch itself off.

Features come from a class-conditional Gaussian with a known within-class variance v, so the truth is known.
Parametrised over every registered surrogate and every ``cem.estimator_fit`` it allows besides ``joint``;
``joint`` (the seeds' literal fit) is shown to fail the same criterion, so the criterion can fail.
"""

from __future__ import annotations

import pytest
import torch

from cem_bench.config import ModelConfig, TrialConfig
from cem_bench.core.models import ClientEncoder
from cem_bench.core.schedule import estimator_sign
from cem_bench.surrogates import base, build, get, intra_class_mse, names, resolve

SHAPE = (8, 4, 4)            # D = 128
CLASSES = 4
BATCH = 64
STEPS = 200                  # surrogate-only Adam steps (lr 1e-3, the default cem.surrogate_lr)
KEEP_ESTIMATE = 0.1          # the estimate may fall by at most 10 % of its magnitude
KEEP_GRAD = 0.25             # ||dL/dz|| must keep at least a quarter of its starting norm
LAMBDA = 16.0                # the paper's lambda, on the encoder's side

PAIRS = [(n, m) for n in names() for m in get(n).fit_modes if m != "joint"]
JOINT = [n for n in names() if "joint" in get(n).fit_modes]


def cfg_of(name: str, fit: str) -> TrialConfig:
    return resolve(TrialConfig.from_flat({"cem.surrogate": name, "cem.estimator_fit": fit, "cem.hidden_dim": 32,
                                          "cem.num_heads": 4, "defense.noise_std": 0.1}))


def mixture(v: float, seed: int = 0):
    """Features x = m_c + sqrt(v) * eps: class means uniform in (0.3, 0.7), the same eps for every v."""
    g = torch.Generator().manual_seed(seed)
    d = SHAPE[0] * SHAPE[1] * SHAPE[2]
    means = 0.3 + 0.4 * torch.rand(CLASSES, d, generator=g)
    y = torch.arange(BATCH) % CLASSES
    eps = torch.randn(BATCH, d, generator=g)
    return (means[y] + v ** 0.5 * eps).view(BATCH, *SHAPE), y


def estimate(surr, z, y):
    """(L, ||dL/dz||) with the surrogate's random draws fixed."""
    if surr.needs_refit:
        surr.refit(z, y)
    z = z.clone().requires_grad_(True)
    surr.rng(z.device).manual_seed(1)
    loss = surr(z, y).loss
    (grad,) = torch.autograd.grad(loss, z)
    return float(loss.detach()), float(grad.norm())


def fit_on_fixed_features(surr, z, y, steps=STEPS):
    """Train only the surrogate's own parameters in the direction its cem.estimator_fit gives."""
    params = [p for p in surr.parameters() if p.requires_grad]
    if not params:
        return
    opt = torch.optim.Adam(params, lr=1e-3)
    sign = estimator_sign(surr.cfg.estimator_fit)
    for _ in range(steps):
        opt.zero_grad()
        (sign * surr(z, y).loss).backward()
        opt.step()


def kept(before, after):
    """Whether the estimate and its gradient survived the estimator's training (the criterion above)."""
    (l0, g0), (l1, g1) = before, after
    return l1 >= l0 - KEEP_ESTIMATE * abs(l0) and g1 >= KEEP_GRAD * g0


def trained(name, fit):
    torch.manual_seed(0)
    surr = build(cfg_of(name, fit), SHAPE, CLASSES)
    z, y = mixture(0.04)
    before = estimate(surr, z, y)
    fit_on_fixed_features(surr, z, y)
    return surr, before, estimate(surr, z, y)


@pytest.mark.slow
@pytest.mark.parametrize("name,fit", PAIRS)
def test_estimator_training_does_not_switch_the_estimate_off(name, fit):
    _, before, after = trained(name, fit)
    assert kept(before, after), f"{name} ({fit}): estimate, |dL/dz| {before} -> {after}"


@pytest.mark.slow
@pytest.mark.parametrize("name", JOINT)
def test_joint_fit_switches_itself_off(name):
    """The seeds' literal fit fails the criterion above: without this the criterion could not fail."""
    _, before, after = trained(name, "joint")
    assert not kept(before, after), f"{name} (joint) kept its estimate: {before} -> {after}"


@pytest.mark.slow
@pytest.mark.parametrize("name,fit", PAIRS)
def test_estimate_grows_with_the_true_within_class_variance(name, fit):
    surr, _, _ = trained(name, fit)
    values = [estimate(surr, *mixture(v))[0] for v in (0.01, 0.04, 0.16)]
    assert values[0] < values[1] < values[2], f"{name} ({fit}): {values}"


@pytest.mark.parametrize("name,fit", PAIRS)
def test_cem_gradient_through_an_encoder_shrinks_the_within_class_spread(name, fit):
    torch.manual_seed(0)
    enc = ClientEncoder(ModelConfig(width=0.125))
    g = torch.Generator().manual_seed(3)
    y = torch.arange(BATCH) % CLASSES
    templates = torch.rand(CLASSES, 3, 32, 32, generator=g)
    images = templates[y] + 0.3 * torch.randn(BATCH, 3, 32, 32, generator=g)
    with torch.no_grad():
        shape = tuple(enc(images).shape[1:])
    torch.manual_seed(0)
    surr = build(cfg_of(name, fit), shape, CLASSES)
    params = [p for p in surr.parameters() if p.requires_grad]
    surr_opt = torch.optim.Adam(params, lr=1e-3) if params else None
    enc_opt = torch.optim.SGD(enc.parameters(), lr=0.05)
    sign = estimator_sign(fit)

    def spread():
        with torch.no_grad():
            return float(intra_class_mse(enc(images).flatten(1), y, CLASSES))

    start = spread()
    for _ in range(10):
        if surr.needs_refit:
            with torch.no_grad():
                surr.refit(enc(images), y)
        loss = LAMBDA * surr(enc(images), y).loss
        enc_opt.zero_grad()
        if surr_opt is not None:
            surr_opt.zero_grad()
        loss.backward()
        for p in params:                       # the estimator moves in its own direction, the encoder down
            if p.grad is not None:
                p.grad.mul_(sign)
        enc_opt.step()
        if surr_opt is not None:
            surr_opt.step()
    assert spread() < 0.9 * start, f"{name} ({fit}): within-class spread {start} -> {spread()}"


def test_estimator_fit_is_checked_per_surrogate():
    from cem_bench.config import ConfigError
    with pytest.raises(ConfigError, match="'joint' does not apply to surrogate 'gmm'; allowed: refit"):
        resolve(TrialConfig.from_flat({"cem.surrogate": "gmm", "cem.estimator_fit": "joint"}))
    for name in names():
        cfg = resolve(TrialConfig.from_flat({"cem.surrogate": name})).cem
        assert cfg.estimator_fit == get(name).fit_modes[0] != "joint"   # no default may collapse


def test_surrogates_leave_the_global_rng_alone():
    """Slot initialisations and dropout draw from the surrogate's own stream, so a CEM run and its lambda = 0
    baseline see the same classifier dropout masks."""
    for name in names():
        surr = build(cfg_of(name, get(name).fit_modes[0]), SHAPE, CLASSES).train()
        z, y = mixture(0.04)
        if surr.needs_refit:
            surr.refit(z, y)
        state = torch.get_rng_state()
        surr(z.requires_grad_(True), y).loss.backward()
        assert torch.equal(torch.get_rng_state(), state), name
    # the own stream starts at seed + RNG_OFFSET: not the trainer's torch.manual_seed(seed), and moves with the seed
    for name, seed in zip(names(), (0, 3, 5, 11, 2, 7)):
        cfg = cfg_of(name, get(name).fit_modes[0]).replace(seed=seed)
        own = build(cfg, SHAPE, CLASSES).rng(torch.device("cpu")).get_state()
        assert torch.equal(own, torch.Generator().manual_seed(seed + base.RNG_OFFSET).get_state()), seed
        assert not torch.equal(own, torch.Generator().manual_seed(seed).get_state()), seed


def sub_clusters(seed: int = 0):
    """Features of CLASSES classes, each three tight sub-clusters (spread 0.03 around means uniform in
    (0.3, 0.7)): a partition into cells has far less spread in its cells than the class as a whole."""
    g = torch.Generator().manual_seed(seed)
    d, b = SHAPE[0] * SHAPE[1] * SHAPE[2], 96
    sub = 0.3 + 0.4 * torch.rand(CLASSES, 3, d, generator=g)
    y, k = torch.arange(b) % CLASSES, (torch.arange(b) // CLASSES) % 3
    return (sub[y, k] + 0.03 * torch.randn(b, d, generator=g)).view(b, *SHAPE), y, k


@pytest.mark.parametrize("name, per_dim, steps", [("attention_centroid", False, 0), ("serial_enhanced", True, 150)])
def test_the_adversarial_fit_is_the_plain_class_hinge_whatever_the_attention(name, per_dim, steps):
    """docs/surrogates.md "Common contract": for classes whose variance is above v*, where the hinge meets its
    concave envelope (as here; not the findings' trained features, which sat below it), the fit that maximises
    the estimate under ``adversarial`` makes the soft cells uniform (by the law of total variance the cells'
    mass-weighted variance never exceeds the class's), so attention_centroid's estimate is each class's hinged
    isotropic variance from the start (β 10 over distances ~0.03 apart), and serial_enhanced's reaches the
    per-dimension one by step 150, whatever ``num_slots``; the three true sub-clusters as cells would give a
    fraction of it. (Below v* a split can score more: not tested here.) A fit that kept the cells apart above v*
    would fail this test (and should change those docs)."""
    x, y, k = sub_clusters()
    xf = x.flatten(1)

    for slots in (2, 16):
        cfg = resolve(TrialConfig.from_flat({"cem.surrogate": name, "cem.estimator_fit": "adversarial",
                                             "cem.hidden_dim": 32, "cem.num_heads": 4, "cem.num_slots": slots,
                                             "defense.noise_std": 0.1}))
        torch.manual_seed(0)
        surr = build(cfg, SHAPE, CLASSES)
        t, eps = surr.hinge_level, surr.cfg.var_eps

        def class_hinge(cells, t=t, eps=eps):   # mass-weighted hinged variance of the cells, mean over classes
            total = 0.0
            for c in range(CLASSES):
                own = y == c
                for j in cells[own].unique():
                    member = xf[own][cells[own] == j]
                    v = member.var(0, unbiased=False)
                    h = torch.relu(torch.log((v if per_dim else v.mean()) + eps) - t).mean()
                    total += float(h) * len(member) / int(own.sum())
            return total / CLASSES

        plain, oracle = class_hinge(torch.zeros_like(y)), class_hinge(k)
        assert oracle < 0.1 * plain
        # every class above v* (the regime the docs claim this for): v* maximises h(v)/v, h the hinge
        grid = torch.linspace(1e-5, 0.05, 50_001)
        v_star = float(grid[(torch.relu(torch.log(grid + eps) - t) / grid).argmax()])
        assert all(float(xf[y == c].var(0, unbiased=False).mean()) > v_star for c in range(CLASSES)), v_star
        opt = torch.optim.Adam([p for p in surr.parameters() if p.requires_grad], lr=1e-3)
        for _ in range(steps):
            surr.rng(torch.device("cpu")).manual_seed(1)
            out = surr(x, y)
            opt.zero_grad()
            (-out.loss).backward()
            opt.step()
        surr.rng(torch.device("cpu")).manual_seed(1)
        with torch.no_grad():
            estimate = float(surr(x, y).loss)
        assert estimate == pytest.approx(plain, rel=1e-3), (slots, estimate, plain, oracle)
