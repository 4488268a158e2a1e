"""The switches that reproduce the reference's behaviours (docs/reference.md "Switches that reproduce the
reference"): each is off by default, and each does what the reference's code does when on."""

import math
import warnings

import pytest
import torch
from conftest import TINY, make_trainer

from cem_bench import attacks, surrogates
from cem_bench.attacks.base import AttackResult
from cem_bench.config import ConfigError, TrialConfig
from cem_bench.core import data as data_mod
from cem_bench.core.schedule import applied_lr, lr_at
from cem_bench.core.trainer import Trainer
from cem_bench.core.trial import build_config, run_trial

SWITCHES = {"train.reference_warmup_lr0": False, "train.milestones_epochs": [], "cem.legacy_prior_indexing": False,
            "cem.refit_augmented": False, "train.select_best_last": 0}


def test_every_switch_is_off_by_default_and_recorded():
    flat = build_config({}).to_flat()
    for k, v in SWITCHES.items():
        assert flat[k] == v, k


# ------------------------------------------------------------------------- train.reference_warmup_lr0
def test_warmup_lr0_epoch_one_moves_only_bn_statistics_and_momentum():
    """The reference's WarmUpLR sets the rate to 0 for epoch 1; SGD still steps: with lr 0 no weight moves
    (weight decay included), the momentum buffers fill and BN's running statistics update."""
    flat = {"cem.lambd": 0, "train.epochs": 1}
    t = make_trainer(**flat, **{"train.reference_warmup_lr0": True})
    params = lambda tr: {(i, k): v for i, m in enumerate((tr.client, tr.server)) for k, v in m.named_parameters()}  # noqa: E731
    means = lambda tr: {(i, k): v for i, m in enumerate((tr.client, tr.server))  # noqa: E731
                        for k, v in m.named_buffers() if k.endswith("running_mean")}
    w0 = {k: v.detach().clone() for k, v in params(t).items()}
    bn0 = {k: v.clone() for k, v in means(t).items()}
    h = t.fit()
    assert h[0]["lr"] == 0.0
    for k, v in params(t).items():
        assert torch.equal(v, w0[k]), k
    assert bn0 and all(not torch.equal(v, bn0[k]) for k, v in means(t).items())
    bufs = [s["momentum_buffer"] for opt in (t.client_opt, t.server_opt) for s in opt.state.values()]
    assert bufs and all(b is not None and float(b.abs().sum()) > 0 for b in bufs)

    plain = make_trainer(**flat)               # off: epoch 1 trains at the real rate
    assert plain.fit()[0]["lr"] == pytest.approx(0.05)
    assert any(not torch.equal(v, w0[k]) for k, v in params(plain).items())


def test_warmup_lr0_and_epoch_milestones_equal_the_reference_schedulers():
    """The reference's pair of schedulers on one SGD: MultiStepLR([60, 120, 180, 210, 260], 0.2), then a WarmUpLR
    (built second, stepped once at the end of epoch 1); MultiStepLR stepped with the epoch index from epoch 2."""
    from torch.optim.lr_scheduler import LRScheduler, MultiStepLR

    class WarmUpLR(LRScheduler):           # ResSFL's utils.WarmUpLR, as the reference uses it
        def __init__(self, optimizer, total_iters, last_epoch=-1):
            self.total_iters = total_iters
            super().__init__(optimizer, last_epoch)

        def get_lr(self):
            return [b * self.last_epoch / (self.total_iters + 1e-8) for b in self.base_lrs]

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.05, momentum=0.9, weight_decay=5e-4)
    multi = MultiStepLR(opt, milestones=[60, 120, 180, 210, 260], gamma=0.2)
    warm = WarmUpLR(opt, 391)
    ref, ref_sched = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")    # step(epoch) is deprecated; the reference calls it so
        for epoch in range(1, 241):
            if epoch > 1:
                multi.step(epoch)
            ref.append(opt.param_groups[0]["lr"])
            ref_sched.append(multi.get_last_lr()[0])   # what the reference's s(eta) reads
            if epoch <= 1:
                warm.step()
    cfg = TrialConfig.from_flat({"train.milestones_epochs": [60, 120, 180, 210, 260],
                                 "train.reference_warmup_lr0": True})
    assert [applied_lr(cfg, e) for e in range(1, 241)] == pytest.approx(ref, rel=1e-12)
    assert [lr_at(cfg, e) for e in range(1, 241)] == pytest.approx(ref_sched, rel=1e-12)
    assert lr_at(cfg, 60) == pytest.approx(0.01) and lr_at(cfg, 59) == pytest.approx(0.05)


# ------------------------------------------------------------------------- train.milestones_epochs
def test_epoch_milestones_replace_the_fractions():
    cfg = TrialConfig.from_flat({"train.epochs": 4, "train.milestones": [0.25], "train.milestones_epochs": "[3]"})
    assert cfg.train.milestones_epochs == [3]
    assert [lr_at(cfg, e) for e in (1, 2, 3, 4)] == pytest.approx([0.05, 0.05, 0.01, 0.01])
    frac = TrialConfig.from_flat({"train.epochs": 4, "train.milestones": [0.25]})
    assert lr_at(frac, 2) == pytest.approx(0.01)             # the fraction alone would drop at epoch 2


@pytest.mark.parametrize("value", ["[0, 10]", "[10, 10]", "[20, 10]", "[-5]", "[1.5]", "[true]", "abc"])
def test_epoch_milestones_reject_bad_values(value):
    with pytest.raises(ConfigError, match=r"train\.milestones_epochs.*(integers|list)"):
        TrialConfig.from_flat({"train.milestones_epochs": value})


# ------------------------------------------------------------------------- cem.legacy_prior_indexing
def _hand_gmm(legacy: bool):
    """gmm on D = 2, three classes, two clusters, with hand-set tables (sigma 0.1, tau 0.125, gamma 0.01)."""
    cfg = surrogates.resolve(TrialConfig.from_flat({"cem.num_clusters": 2, "defense.noise_std": 0.1,
                                                    "cem.legacy_prior_indexing": legacy}))
    s = surrogates.build(cfg, (2, 1, 1), 3)
    s.centroids.copy_(torch.tensor([[[5.0, 5.0], [6.0, 6.0]], [[0.0, 0.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, 1.0]]]))
    s.pi.copy_(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.8, 0.2]]))
    class_size = torch.tensor([10.0, 100.0, 50.0])
    s.cluster_n.copy_(s.pi * class_size.unsqueeze(1))
    s.var_iso.copy_(torch.tensor([[1.0, 1.0], [0.2, 0.3], [0.05, 0.5]]))
    s.valid.fill_(True)
    s._fitted.fill_(True)
    return s


def test_legacy_prior_indexing_equals_the_reference_by_hand():
    """Batch of classes 1, 1, 2, 2 (class 0 absent). Label-sorted samples: 1, 1, 2, 2; class ordinals: class 1
    -> 0, class 2 -> 1; so the reference reads class 1's tables for class 1 (sample 0) and class 1's again for
    class 2 (sample 1). Class 1's samples fall in its clusters 0 and 1, class 2's both in cluster 0."""
    z = torch.tensor([[0.1, 0.0], [0.9, 1.0], [0.0, 0.2], [0.0, -0.2]]).view(4, 2, 1, 1)
    y = torch.tensor([1, 1, 2, 2])
    t = math.log(0.125 * 0.1 ** 2 + 0.01)
    hinge = lambda v: max(0.0, math.log(v + 0.01) - t)  # noqa: E731
    # class 1: one sample per cluster, b = 0.005 each, alpha = 10 * 1 / (0.5 * 100) = 0.2
    c1 = 0.5 * hinge(0.2 * 0.005 + 0.8 * 0.2) + 0.5 * hinge(0.2 * 0.005 + 0.8 * 0.3)
    # class 2, cluster 0: two samples, b = 0.02. Fixed: pi 0.8, v 0.05, alpha = 10 * 2 / (0.8 * 50) = 0.5
    fixed_c2 = 0.8 * hinge(0.5 * 0.02 + 0.5 * 0.05)
    # legacy: class 1's pi 0.5 and v 0.2, cluster size 0.5 * 50 (its own N_c), alpha = 20 / 25 = 0.8
    legacy_c2 = 0.5 * hinge(0.8 * 0.02 + 0.2 * 0.2)
    fixed = float(_hand_gmm(False)(z, y).loss)
    legacy = float(_hand_gmm(True)(z, y).loss)
    assert fixed == pytest.approx((c1 + fixed_c2) / 2, rel=1e-5)
    assert legacy == pytest.approx((c1 + legacy_c2) / 2, rel=1e-5)
    assert abs(legacy - fixed) > 0.1


def test_legacy_prior_indexing_agrees_when_the_ordinals_match_and_differs_otherwise():
    """Classes 0 and 1 with at least two samples of class 0: the ordinals pick samples of class 0 for both
    classes, so class 1 reads class 0's tables; a batch of class 0 alone reads its own."""
    z = torch.tensor([[0.1, 0.0], [0.9, 1.0], [0.0, 0.2], [0.0, -0.2]]).view(4, 2, 1, 1)
    alone = torch.tensor([0, 0, 0, 0])
    assert float(_hand_gmm(True)(z + 5, alone).loss) == pytest.approx(float(_hand_gmm(False)(z + 5, alone).loss))
    mixed = torch.tensor([0, 0, 1, 1])
    assert float(_hand_gmm(True)(z, mixed).loss) != pytest.approx(float(_hand_gmm(False)(z, mixed).loss))


def test_legacy_prior_indexing_step_has_no_host_sync(monkeypatch):
    t = make_trainer(**{"cem.legacy_prior_indexing": True})
    t.refit_surrogate()
    x, y = next(iter(data_mod.BatchIterator(t.splits.train, t.splits, 32, "crop_flip_rotate", t.gen)))
    acc = t.epoch_acc()

    def boom(*a, **k):
        raise AssertionError("host sync inside a training step")
    for meth in ("item", "tolist", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, meth, boom)
    t.step(x, y, True, 0.05, acc)
    monkeypatch.undo()
    assert float(acc["rob_loss"]) > 0


# ------------------------------------------------------------------------- cem.refit_augmented
def test_refit_augmented_uses_the_trainers_augmentation_and_changes_the_centroids(monkeypatch):
    calls = []
    real = data_mod.augment_batch

    def counted(x, kind, gen, *a, **k):
        calls.append((kind, gen))
        return real(x, kind, gen, *a, **k)

    monkeypatch.setattr(data_mod, "augment_batch", counted)
    clean = make_trainer()
    clean.refit_surrogate()
    assert calls == []                                        # the default refit: clean split, no augmentation
    aug = make_trainer(**{"cem.refit_augmented": True})
    state = aug.gen.get_state()
    aug.refit_surrogate()
    n_batches = len(aug.splits.train) // aug.cfg.train.batch_size
    assert len(calls) == n_batches and all(k == "crop_flip_rotate" and g is aug.gen for k, g in calls)
    assert not torch.equal(aug.gen.get_state(), state)       # the extra pass consumes the trainer's stream
    assert aug.surrogate.fitted
    assert not torch.allclose(aug.surrogate.centroids, clean.surrogate.centroids, atol=1e-4)


# ------------------------------------------------------------------------- train.select_best_last
def _scripted_evaluate(accs):
    def evaluate(self):
        return {"test_acc": accs[len(self.history)], "test_acc_clean": 0.5, "feature_spread": 0.0}
    return evaluate


class _SpyAttack:
    def __init__(self):
        self.client = None

    def run(self, encoder, splits, noise_std, device):
        self.client = {k: v.detach().clone() for k, v in encoder.state_dict().items()}
        return AttackResult({"attack_mse": 0.1, "attack_psnr": 10.0, "attack_ssim": 0.5},
                            torch.zeros(1, 3, 32, 32), torch.zeros(1, 3, 32, 32))


@pytest.mark.parametrize("last", [0, 2])
def test_select_best_last_attacks_the_best_test_epoch_of_the_window(last, monkeypatch):
    """Accuracies 0.95, 0.9, 0.6: epoch 1 is the best but outside the last 2 epochs, so epoch 2 is attacked;
    with selection off the last epoch is."""
    monkeypatch.setattr(Trainer, "evaluate", _scripted_evaluate([0.95, 0.9, 0.6]))
    spy = _SpyAttack()
    monkeypatch.setattr(attacks, "run_all", lambda cfg, encoder, splits, noise_std, device: attacks.AttackSet(
        {"decoder": spy.run(encoder, splits, noise_std, device)}))
    clients = {}

    def report(rec, final, state_fn=None):
        if not final:
            clients[rec["epoch"]] = {k: v.clone() for k, v in state_fn()["client"].items()}

    res = run_trial({**TINY, "train.epochs": 3, "train.select_best_last": last}, report)
    want = 2 if last else 3
    assert res["selected_epoch"] == want and res["epochs_done"] == 3
    assert res["test_acc"] == [0.95, 0.9, 0.6][want - 1]
    assert res["info"]["config"]["train.select_best_last"] == last
    other = 3 if last else 2
    assert all(torch.equal(spy.client[k], v) for k, v in clients[want].items())
    assert any(not torch.equal(spy.client[k], v) for k, v in clients[other].items() if v.is_floating_point())


def test_selected_state_survives_a_checkpoint():
    t = make_trainer(**{"train.select_best_last": 2, "cem.lambd": 0})
    t.fit()
    assert t.selection.best is not None and t.selection.best["epoch"] in (1, 2)
    again = make_trainer(**{"train.select_best_last": 2, "cem.lambd": 0})
    again.load_state_dict(t.state_dict())
    assert again.selection.best["epoch"] == t.selection.best["epoch"]
    assert all(torch.equal(again.selection.best["client"][k], v) for k, v in t.selection.best["client"].items())
