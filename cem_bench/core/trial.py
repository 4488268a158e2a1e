"""One trial end to end: config -> data/models -> CEM training -> model-inversion attack -> result.

``run_trial`` is what ``cem-bench train`` and every Ray Tune trial call. It imports no Ray: progress goes
through the ``report(record, final, state_fn=None)`` callback, which the Ray trainable turns into
``tune.report`` (with a checkpoint built from ``state_fn()``) and the CLI into progress lines.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import __version__, attacks, surrogates
from ..config import ConfigError, TrialConfig
from ..provenance import run_info
from ..schema import ATTACK_METRICS, GALLERY_FILE
from . import data, models
from .runtime import resolve_device, seed_everything
from .trainer import Trainer

Report = Callable[..., None]


def build_config(config: TrialConfig | dict) -> TrialConfig:
    cfg = config if isinstance(config, TrialConfig) else TrialConfig.from_flat(config)
    return attacks.resolve(surrogates.resolve(cfg))


def build(cfg: TrialConfig, device: torch.device, splits: data.Splits | None = None):
    """Data, models, surrogate and trainer of a resolved config (no training yet)."""
    seed_everything(cfg.seed)
    splits = splits if splits is not None else data.load(cfg.data, device)
    client, server = models.build(cfg.model, splits.num_classes, splits.image_shape)
    surrogate = None
    if cfg.cem.lambd > 0:
        fshape = models.feature_shape(client, splits.image_shape)
        # the surrogate's init draws from its own stream, so that a CEM run and its lambda = 0 baseline see
        # the same model init, data order and dropout masks: they differ by the CEM loss only
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(cfg.seed + 7919)
            surrogate = surrogates.build(cfg, fshape, splits.num_classes)
    return splits, Trainer(cfg, splits, client, server, surrogate, device)


def attack_gate(test_acc: float, num_classes: int, margin: float) -> str:
    """``attack.min_accuracy_margin``: why the attack is not run ("" = run it). An encoder whose noisy test
    accuracy is below chance + margin carries no usable class information: it is private for free, and its
    attack numbers would only put a useless model on the privacy side of the frontier. A negative margin
    always attacks; so does a NaN accuracy (nothing to judge by)."""
    chance = 1.0 / num_classes
    if margin < 0 or not test_acc < chance + margin - 1e-9:   # 1e-9: 0.1 + 0.05 is 0.15000000000000002
        return ""
    where = f"within {margin:g} of" if test_acc >= chance else "below"
    return (f"test accuracy {test_acc:.3f} is {where} chance ({chance:.3f}): the encoder carries no class "
            f"information; the attack was not run (attack.min_accuracy_margin={margin:g})")


# ------------------------------------------------------------------------------------------ privacy probe
PROBE_KEYS: tuple[str, ...] = ("probe_ssim", "probe_psnr", "probe_s")


def probe_config(cfg: TrialConfig) -> TrialConfig:
    """The config of the privacy probe's rmle attack: rmle's own keys of ``cfg`` (its lr and TV weight; the
    defaults when ``attack.names`` has no rmle), ``attack.probe_iterations`` steps and one (grey) start."""
    acfg = dataclasses.replace(cfg.attack, names=["rmle"])
    rcfg = attacks.resolve(dataclasses.replace(cfg, attack=acfg))
    params = {**rcfg.attack.params, "rmle_iterations": cfg.attack.probe_iterations, "rmle_restarts": 1}
    return dataclasses.replace(rcfg, attack=dataclasses.replace(rcfg.attack, params=params))


def probe(cfg: TrialConfig, encoder: torch.nn.Module, splits: data.Splits, noise_std: float,
          device) -> dict[str, float]:
    """The privacy probe: a cheap estimate of the final attack SSIM of ``encoder`` as it is now.

    The white-box rmle attack (``attacks.rmle``) on a fixed batch, the first ``attack.probe_images`` images of
    ``splits.attack_eval``, ``attack.probe_iterations`` Adam steps (rmle's lr and TV weight, one start), the
    defense noise and the start's jitter drawn from the attack's own generator seeded by ``attack.seed`` (the
    same draws at every probe), scored by the attacks' ``Scorer``. It moves no random stream of the training
    (not the global torch RNG, not the trainer's generators) and leaves the encoder's mode and
    ``requires_grad`` as they were (``RMLEAttack.run``), so a run with probes trains exactly as one without.
    Returns ``{"probe_ssim", "probe_psnr", "probe_s"}`` (seconds of the call).
    """
    t0 = time.perf_counter()
    n = cfg.attack.probe_images
    ev = splits.attack_eval
    sub = dataclasses.replace(splits, attack_eval=data.Split(ev.images[:n], ev.labels[:n]))
    res = attacks.build(probe_config(cfg), "rmle").run(encoder, sub, noise_std, device)
    return {"probe_ssim": float(res.metrics["attack_ssim"]), "probe_psnr": float(res.metrics["attack_psnr"]),
            "probe_s": time.perf_counter() - t0}


def run_trial(config: TrialConfig | dict, report: Report | None = None, *, out_dir: str | None = None,
              resume_state: dict | None = None) -> dict[str, Any]:
    """Train with CEM, attack the trained encoder with every attack of ``attack.names``, and return metrics,
    costs and info.

    ``report(record, final, state_fn=...)`` is called after every epoch (``final=False``) and once at the
    end with the result (``final=True``). Every record carries every key of ``schema.OBJECTIVE_METRICS``
    (attack metrics are NaN until the attacks have run, and stay NaN when the utility gate
    ``attack.min_accuracy_margin`` skips them: ``attack_skipped`` then says why, else it is ""). The final
    record also has each attack's own metrics and seconds (``attack_ssim__rmle``, ``attack_s__rmle``); the
    objective attack metrics are their worst case for privacy, and ``attack_ssim_by``, ... name the attack
    that set each. With ``train.select_best_last`` the result's accuracies and the attacks are those of
    ``selected_epoch`` (test-set selection); otherwise ``selected_epoch`` is the last epoch.

    The privacy probe (``attack.probe_epochs``, ``probe``): after each listed epoch the current encoder is
    probed and that epoch's record gets ``probe_ssim``, ``probe_psnr`` and ``probe_s``. When the list is not
    empty every epoch record carries these keys, in the trainer's history (so ``epochs.parquet``, whether read
    from ``info.history`` or from Ray's report lines) as in the reports (so Ray's metric checks see them in every
    report): NaN metrics and 0 seconds at the epochs without a probe. With no probe epochs the records have no
    probe keys. A probe's time is outside ``epoch_s`` but inside ``train_s`` (the wall time of the training
    loop). ``resume_state``
    (a ``state_fn()`` value) continues a run from its last finished epoch. With ``out_dir`` the gallery
    ``recon.png`` (the originals, then a row per attack) is written there when the attacks ran.
    """
    t_wall = time.perf_counter()
    cfg = build_config(config)
    inactive = surrogates.never_active(cfg)
    if inactive:
        raise ConfigError(inactive)
    device = resolve_device(cfg.train.device)
    splits, trainer = build(cfg, device)
    start = 1
    if resume_state is not None:
        trainer.load_state_dict(resume_state)
        start = trainer.epoch + 1
    nan = float("nan")
    # the training loop's time before the resume: its epochs and their probes (train_s holds both)
    prior_train_s = sum(r["epoch_s"] + r.get("probe_s", 0.0) for r in trainer.history)

    probe_epochs = set(cfg.attack.probe_epochs)

    def on_epoch(rec: dict) -> None:
        # rec is the record the trainer has just appended to its history: the probe's keys land in both
        if probe_epochs:
            if rec["epoch"] in probe_epochs:
                rec.update(probe(cfg, trainer.client, splits, cfg.defense.noise_std, device))
            else:
                rec.update(probe_ssim=nan, probe_psnr=nan, probe_s=0.0)
        if report is not None:
            record = {**rec, **{k: nan for k in ATTACK_METRICS}}
            report(record, False, state_fn=trainer.state_dict)

    t_train = time.perf_counter()
    trainer.fit(on_epoch, start_epoch=start)
    train_s = prior_train_s + (time.perf_counter() - t_train)

    # train.select_best_last: the epoch with the best noisy test accuracy of the last N (test-set selection, as
    # the reference); its client and server are loaded, so the attack and the final state are that epoch's
    selected_epoch = trainer.select_best()
    last = trainer.history[-1] if trainer.history else {}
    chosen = next((r for r in trainer.history if r.get("epoch") == selected_epoch), last)
    test_acc = chosen.get("test_acc", nan)
    skipped = attack_gate(test_acc, splits.num_classes, cfg.attack.min_accuracy_margin)
    res = None
    metrics = attacks.AttackSet.skipped_metrics(cfg.attack.names)   # the same columns whether or not they ran
    if not skipped:
        res = attacks.run_all(cfg, trainer.client, splits, cfg.defense.noise_std, device)
        metrics = res.metrics()
    result: dict[str, Any] = {
        "test_acc": test_acc,
        "test_acc_clean": chosen.get("test_acc_clean", nan),
        "feature_spread": chosen.get("feature_spread", nan),
        **metrics,
        "attack_skipped": skipped,
        "train_s": train_s,
        "attack_s": res.seconds if res is not None else 0.0,
        "wall_s": time.perf_counter() - t_wall,
        "epochs_done": trainer.epoch,
        "final_train_loss": last.get("train_loss", nan),
        "final_train_acc": last.get("train_acc", nan),
        "rob_nonfinite": sum(r.get("rob_nonfinite", 0) for r in trainer.history),
        "epoch": trainer.epoch,
        "selected_epoch": selected_epoch,
        "torch_threads": torch.get_num_threads(),   # a packed trial's CPU share (the search pins it)
        **trainer.matcher.record,    # cem.strength: the loss scale used and where it came from
    }
    gallery = None
    if out_dir is not None and res is not None:
        os.makedirs(out_dir, exist_ok=True)
        # its name inside the run's folder, as a search trial's trial_result.json records it (the absolute path
        # was recorded until 2026-12-07: a script joining the folder with it broke on one of the two)
        gallery = GALLERY_FILE if res.save_gallery(os.path.join(out_dir, GALLERY_FILE)) else None
    result["info"] = {
        "config": cfg.to_flat(),
        **run_info(device, __version__),
        "client_params": models.count_params(trainer.client),
        "server_params": models.count_params(trainer.server),
        "surrogate_params": models.count_params(trainer.surrogate) if trainer.surrogate is not None else 0,
        # what the run used, not what it asked for: data.train_size larger than a fixed split takes all of it
        "images": {name: len(getattr(splits, name).labels) for name in ("train", "test", "attack_aux", "attack_eval")},
        # which images, not only how many: `cem-bench attack` compares them with those it loads
        "data_sha256": data.fingerprints(splits),
        "gallery": gallery,
        "history": trainer.history,
        "attack_history": res.history() if res is not None else [],
    }
    if report is not None:
        report(result, True, state_fn=trainer.state_dict)
    return result
