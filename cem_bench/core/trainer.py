"""The CEM training loop (docs/reference.md §2, §6 and §11, docs/surrogates.md, docs/estimators.md).

One epoch: shuffled on-device batches with augmentation; the client encodes them (clean z, after the
sigmoid); from the first CEM epoch on, the surrogate's loss L is computed on the clean features; Gaussian
noise of std ``defense.noise_std`` is added *after* the CEM loss, and the server classifies the noisy
features. Gradient modes:

* ``inject`` (the paper's): the encoder gradient is g_CE + lambda*s(eta)*g_CEM (computed in one backward pass
  of CE + lambda*s*L, which equals the paper's two passes) with s(eta) = 0.001/eta when
  the current lr eta >= 4.1e-4, else 1.
* ``fused``: CE + lambda*L in one backward (under ``cem.strength=matched`` lambda*s(eta)/s(eta_0)*L, so that
  the term keeps its ratio to the injected ones through the lr drops; strength.py).

The loss scale of L is ``cem.loss_scale`` or, under ``cem.strength=matched`` (the attention surrogates'
default), measured at the first CEM epoch against gmm's pull on this encoder (``strength.Matcher``).

The surrogate's own parameters (the attention surrogates have some) are trained by their own Adam, in the
direction ``cem.estimator_fit`` says (docs/estimators.md): ``adversarial`` ascends the CEM loss (the
estimator looks for the spread the encoder must remove), ``joint`` descends it like the encoder (the
seeds' literal design, which lets the estimator switch itself off). A step whose CEM loss is not finite
contributes no gradient at all (a gate on the surrogate's input zeroes it in the backward pass, where a
``torch.where`` on the loss alone would still propagate 0 * inf = NaN; the surrogate's own Adam step is
skipped, as ``GradScaler`` skips an overflowed step) and is counted. Logs accumulate as
device tensors and are read once per epoch: no host sync in a step. On CUDA the step is captured as one CUDA
graph and replayed (``train.cuda_graph``, graphs.py): ``step_body`` takes its host values (lr, the CEM
loss's weight and the encoder's multiplier of ``cem_scales``) as floats or device tensors for that reason.
Deliberate differences from the reference (docs/reference.md §11): epoch 1 trains at the real lr (the
reference's WarmUpLR misuse made it 0); milestones are fractions of the run; the gmm refit encodes the clean
training split; lambda = 0 builds no surrogate and runs no clustering; the checkpoint kept is the last one (no
model selection on the test set). Each of those but the lambda = 0 one has a switch that reproduces the
reference, off by default (docs/reference.md "Switches that reproduce the reference"):
``train.reference_warmup_lr0``, ``train.milestones_epochs``, ``cem.refit_augmented``,
``train.select_best_last``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import time
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import TrialConfig
from ..errors import ConfigError, TrialDiverged  # noqa: F401  (TrialDiverged re-exported)
from ..surrogates import Surrogate, intra_class_mse
from . import data as data_mod
from . import graphs, models, strength
from .runtime import set_tf32
from .schedule import applied_lr, estimator_sign, inject_scale, lr_at
from .selection import BestEpoch
from .step_options import SURROGATE_COMPILE_OPTIONS, graph_mode, surrogate_options


class _GradGate(torch.autograd.Function):
    """Identity forward; the backward passes ``mult`` x the gradient only where ``ok`` (a 0-dim bool tensor that
    the caller fills in *after* the forward) is true. ``torch.where`` selects, so a NaN gradient becomes 0.
    ``mult`` (a float or a 0-dim tensor) is ``cem_scales``' encoder multiplier."""

    @staticmethod
    def forward(ctx, x, ok, mult):
        ctx.ok = ok          # not save_for_backward: it is written in place after this forward, by design
        ctx.mult = mult
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if isinstance(ctx.mult, torch.Tensor) or ctx.mult != 1.0:
            grad = grad * ctx.mult
        return torch.where(ctx.ok, grad, 0.0), None, None


class Trainer:
    """Holds models, optimizers and the surrogate; ``fit()`` runs the epochs, ``step()`` one batch."""

    def __init__(self, cfg: TrialConfig, splits: data_mod.Splits, client: nn.Module, server: nn.Module,
                 surrogate: Surrogate | None, device: torch.device):
        self.cfg, self.splits, self.device = cfg, splits, device
        self.client, self.server, self.surrogate = client.to(device), server.to(device), surrogate
        self.amp = models.amp_dtype(cfg.train, device)
        cuda = device.type == "cuda"
        if cuda:
            torch.backends.cudnn.benchmark = True
            set_tf32(cfg.train.tf32)
            self.client.to(memory_format=torch.channels_last)
            self.server.to(memory_format=torch.channels_last)
        self.graphed = graph_mode(cfg, device)
        stream, compile_surrogate = surrogate_options(cfg, self.graphed)
        # train.surrogate_stream: the surrogate's own CUDA stream, public for the bench (None: the current one)
        self.streams = graphs.SideStream(device, cuda and stream and surrogate is not None)
        # fused (one multi-tensor kernel per optimizer) on the CPU too: one code path, whose kernel count the
        # bench's ``kernels`` group counts here for the GPU (docs/performance.md, 'Kernels per step')
        opt_kw = dict(lr=cfg.train.lr, momentum=cfg.train.momentum, weight_decay=cfg.train.weight_decay,
                      fused=True)
        self.client_opt = torch.optim.SGD(self.client.parameters(), **opt_kw)
        self.server_opt = torch.optim.SGD(self.server.parameters(), **opt_kw)
        self.surrogate_opt = None
        if surrogate is not None:
            surrogate.to(device)
            params = [p for p in surrogate.parameters() if p.requires_grad]
            if params:
                # fused everywhere (as the SGDs); capturable on CUDA whether graphed or not, so that graphed and
                # eager steps share one bias-correction arithmetic (docs/performance.md, "CUDA graphs")
                self.surrogate_opt = torch.optim.Adam(params, lr=cfg.cem.surrogate_lr, fused=True, capturable=cuda)
        # the learning rate as a device tensor (filled in place) where the step is a graph: a graph replays
        # what it captured, so a float assigned to the param group later would be silently ignored
        self._lr_tensor = torch.tensor(float(cfg.train.lr), device=device) if self.graphed else None
        self._install_lr()
        self.client_params = [p for p in self.client.parameters() if p.requires_grad]
        self.surrogate_params = list(self.surrogate_opt.param_groups[0]["params"]) if self.surrogate_opt else []
        self.gen = torch.Generator(device=device).manual_seed(cfg.seed)
        self.lambd = cfg.cem.lambd
        # cem.strength: the loss scale, fixed or matched to gmm's pull on this encoder (cem_bench/core/strength.py)
        self.matcher = strength.Matcher(cfg, device, surrogate is not None)
        self._client_fwd = self.client
        self._server_fwd = self.server
        if cfg.train.compile:
            self._client_fwd = torch.compile(self.client)
            self._server_fwd = torch.compile(self.server)
        # train.compile_surrogate: the training forward only (refit and evaluation call the module itself);
        # static shapes (the step's batch is fixed), so one compile for the trial
        self._surrogate_fwd = surrogate
        self.step_flops: int | None = None   # FLOPs of one step's client and server (CUDA records' tflops)
        self.surrogate_compile_failed: str | None = None   # train.compile_surrogate=auto fell back: why
        if surrogate is not None and compile_surrogate:
            self._surrogate_fwd = surrogate.compiled(SURROGATE_COMPILE_OPTIONS)
        self.epoch = 0
        self.history: list[dict] = []
        self.selection = BestEpoch(cfg.train.select_best_last, cfg.train.epochs)   # train.select_best_last
        self.refit_augmented = bool(cfg.cem.params.get("refit_augmented", False))
        self._acc: dict[str, torch.Tensor] | None = None      # the epoch's log accumulators, reused in place
        self.surr_log_names: tuple[str, ...] | None = None    # the order of acc["surr"]
        self.graph_step = graphs.GraphedStep(self.device, cfg.train.cuda_graph == "on", "training step",
                                             n_scalars=2) if self.graphed else None   # weight and mult

    def _install_lr(self) -> None:
        if self._lr_tensor is not None:
            self._set_group_lr(self._lr_tensor)

    def _set_group_lr(self, lr) -> None:
        for opt in (self.client_opt, self.server_opt):
            for group in opt.param_groups:
                group["lr"] = lr

    def set_lr(self, lr: float) -> None:
        """The rate the client's and server's SGD step with from now on (a graphed trainer's tensor, in place)."""
        if self._lr_tensor is not None:
            self._lr_tensor.fill_(lr)
        else:
            self._set_group_lr(lr)

    # ------------------------------------------------------------------------------------ one step
    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        # a graph must not capture autocast's cast cache (torch.cuda.graphs docs): it would replay stale casts
        return torch.autocast(self.device.type, dtype=self.amp, cache_enabled=not self.graphed)

    def add_noise(self, z: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
        """z + sigma * N(0, 1) in fp32 whatever the autocast: a bf16 step near z = 1 is 0.004, which at
        sigma = 0.01 would quantise the defense noise to a few levels."""
        sigma = self.cfg.defense.noise_std
        z = z.float()
        if sigma == 0:
            return z
        return z + sigma * torch.randn(z.shape, generator=gen if gen is not None else self.gen, device=z.device,
                                       dtype=torch.float32)

    def cem_scales(self, lr: float) -> tuple[float, float]:
        """(weight, mult) of a CEM step at scheduled rate ``lr``. The backward seeds the CEM loss L with weight,
        so the surrogate's own parameters get weight·dL/dθ, and the gate on the surrogate's input multiplies
        the encoder's share by mult: the encoder descends CE + scale·L with scale = weight·mult. fused: scale
        = λ; inject: λ·s(lr), whose backward equals the paper's g_CE + λ·s·g_CEM (its code: two backward
        passes). The surrogate's gradient: joint keeps λ·dL/dθ (fused) or drops the scale (inject: weight 1);
        adversarial ascends (weight -1). The matched loss scale is not in either: ``step_body`` multiplies it
        into the gate's mult, so the surrogate's gradient never carries it (Adam is invariant to a constant
        scale only well above its eps). One multiplication of z's gradient, not one per surrogate parameter:
        a graphed step's time is its kernel count."""
        fused = self.cfg.cem.grad_mode == "fused"
        if fused:
            # matched: the fused weight follows s(η) from the first CEM epoch on, as the injected ones do
            scale = self.lambd * self.matcher.fused_factor(lr)
        else:
            scale = self.lambd * inject_scale(lr)
        sign = estimator_sign(self.cfg.cem.estimator_fit)
        weight = scale if (fused and sign > 0) else sign
        return weight, scale / weight

    def step(self, x: torch.Tensor, y: torch.Tensor, cem_on: bool, lr: float, acc: dict) -> None:
        """One training step on a normalised batch; adds its logs to the device tensors in ``acc``. With
        ``train.cuda_graph`` on, ``step_body`` replayed from its captured graph (``graphs.GraphedStep``)."""
        weight, mult = self.cem_scales(lr) if cem_on else (0.0, 1.0)
        if self.graph_step is None:
            self.step_body(x, y, cem_on, weight, mult, acc)
            return
        gens = [self.gen] + ([self.surrogate.rng(self.device)] if cem_on and self.surrogate is not None else [])
        self.graph_step.run(lambda x, y, w, m: self.step_body(x, y, cem_on, w, m, acc), (x, y), (weight, mult),
                            self.graph_signature(x, cem_on, acc), gens)

    def graph_signature(self, x: torch.Tensor, cem_on: bool, acc: dict) -> tuple:
        """What a captured step depends on: CEM on or off, the batch's shape, the accumulators the caller gave
        (``ACC_KEYS``; not the step's own ``acc["surr"]``), and where the surrogate's tensors live."""
        s = self.surrogate if cem_on else None
        state = () if s is None else tuple(t.data_ptr() for t in itertools.chain(s.parameters(), s.buffers()))
        return cem_on, tuple(x.shape), id(acc), tuple(id(acc[k]) for k in self.ACC_KEYS if k in acc), state

    def step_body(self, x: torch.Tensor, y: torch.Tensor, cem_on: bool, weight, mult, acc: dict) -> None:
        """The step itself, with ``weight`` and ``mult`` (``cem_scales``) as floats or 0-dim device tensors
        (the graph's: no host value enters a captured step). No host sync, no allocation that outlives it."""
        if self.device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        self.client_opt.zero_grad(set_to_none=True)
        self.server_opt.zero_grad(set_to_none=True)
        with self._autocast():
            z = self._client_fwd(x)
        rob = nonfinite = rob_grad = None
        if cem_on:
            ok = torch.ones((), dtype=torch.bool, device=z.device)
            # the matched loss scale (cem.strength: matched) reaches the encoder through the gate, not the
            # backward's seed: seeded with it, the surrogate's own gradient would carry it too, and at small
            # scales that gradient falls below Adam's eps (invariant to a constant scale only well above it),
            # slowing the estimator's fit (docs/estimators.md)
            zin = _GradGate.apply(z.float(), ok, mult * self.matcher.scale_t)
            # Everything of the CEM loss happens on the surrogate's stream (train.surrogate_stream), up to the
            # scaled loss that seeds the backward: the server's forward and backward then never wait for the
            # surrogate's forward, and the two branches meet only at the encoder (the gate's backward).
            with self.streams.run(zin, y, ok), torch.autocast(self.device.type, enabled=False):
                out = self._surrogate_fwd(zin, y)          # statistics in fp32
                finite = torch.isfinite(out.loss)
                ok.copy_(finite)                           # the gate's backward reads it after this stream's gradient
                rob = torch.where(finite, out.loss, 0.0)           # the backward's root: unscaled (above)
                nonfinite = (~finite).float()
                acc["rob_nonfinite"] += nonfinite
                acc["rob_loss"].addcmul_(rob.detach(), self.matcher.scale_t)   # logged as the encoder feels it
                self._add_surrogate_logs(acc, out.logs)
                rob_grad = weight if isinstance(weight, torch.Tensor) else rob.new_full((), weight)
                if self.surrogate_opt is not None:
                    self.surrogate_opt.zero_grad(set_to_none=True)
        with self._autocast():
            logits = self._server_fwd(self.add_noise(z))
            ce = F.cross_entropy(logits.float(), y)
        if rob is None:
            ce.backward()
        else:
            # the gradient of ce + weight * rob (see cem_scales), with the two terms as separate roots: a sum
            # would join the streams before the backward starts
            torch.autograd.backward((ce, rob), (None, rob_grad))
        self.client_opt.step()
        self.server_opt.step()
        if rob is not None and self.surrogate_opt is not None:
            # a non-finite loss skips the step in the fused kernel (GradScaler's mechanism; its gradients may be
            # NaN): one flag for every parameter, no pass over them. On the surrogate's stream, where its
            # gradients were made, beside the encoder's optimizer steps.
            with self.streams.run(fork=False):
                self.surrogate_opt.found_inf = nonfinite
                self.surrogate_opt.step()
        if cem_on:
            self.streams.join()
        with torch.no_grad():
            acc["ce_sum"] += ce.detach() * y.shape[0]
            acc["correct"] += (logits.argmax(1) == y).sum()
            acc["seen"] += y.shape[0]
            acc["ce_nonfinite"] += (~torch.isfinite(ce)).float()

    @property
    def side_stream(self):
        """The surrogate's own CUDA stream (``train.surrogate_stream``), or None: the current one."""
        return self.streams.stream

    def set_surrogate_stream_priority(self, priority: int) -> None:
        self.streams.set_priority(priority)

    def _add_surrogate_logs(self, acc: dict, logs: dict) -> None:
        """Add the surrogate's logs (but rob_loss, which the step scales) to ``acc["surr"]``, one vector in the
        order of ``self.surr_log_names``: one kernel, not one per log."""
        names = tuple(k for k in logs if k != "rob_loss")
        if not names:
            return
        if self.surr_log_names is None:
            self.surr_log_names = names
        elif names != self.surr_log_names:
            raise RuntimeError(f"surrogate {self.cfg.cem.surrogate!r} changed its logs from "
                               f"{self.surr_log_names} to {names}; a surrogate's logs must be the same every step")
        if "surr" not in acc:
            acc["surr"] = torch.zeros(len(names), device=self.device)
        acc["surr"] += torch.stack([logs[k].detach().float() for k in names])

    # ------------------------------------------------------------------------------------ epochs
    ACC_KEYS = ("ce_sum", "correct", "seen", "ce_nonfinite", "rob_loss", "rob_nonfinite")

    def epoch_acc(self) -> dict[str, torch.Tensor]:
        """The log accumulators of an epoch, zeroed: the same tensors every epoch (a captured step adds into
        the ones it was captured with)."""
        if self._acc is None:
            self._acc = {k: torch.zeros((), device=self.device) for k in self.ACC_KEYS}
        for v in self._acc.values():
            v.zero_()
        return self._acc

    def prepare_steps(self, cem_on: bool) -> None:
        """Before training steps: a surrogate that needs a refit and has none is fitted (when CEM is on), and
        every module is in train mode."""
        if cem_on and self.surrogate.needs_refit and not self.surrogate.fitted:
            self.refit_surrogate()
        for m in (self.client, self.server, self.surrogate):
            if m is not None:
                m.train()

    def check_surrogate_compiles(self) -> None:
        """``train.compile_surrogate``: compile the surrogate's training forward and backward now
        (``Surrogate.probe_compiled``), so that a toolchain that cannot compile stops the trial before its first
        epoch (``on``) or falls back to the eager surrogate (``auto``). Nothing to do without the key."""
        if self._surrogate_fwd is not self.surrogate:
            self._surrogate_fwd, self.surrogate_compile_failed = self.surrogate.probe_compiled(
                self._surrogate_fwd, self.cfg.train.batch_size, self.device, self.cfg.train.compile_surrogate)

    def count_step_flops(self) -> int:
        """FLOPs of one training step's client and server, forward and backward (not the surrogate), on a batch
        of zeros of the step's shape (the count depends on shapes only). Called before the first step of the
        process: its backward's gradients are dropped, which a captured step's static gradients must not be."""
        shape = (self.cfg.train.batch_size, *self.splits.image_shape)
        x = torch.zeros(shape, device=self.device)
        y = torch.zeros(shape[0], dtype=torch.long, device=self.device)
        return models.count_train_flops(self.client, self.server, x, y, self.amp)[1]

    def cem_active(self, epoch: int) -> bool:
        return self.surrogate is not None and self.lambd > 0 and epoch > (self.cfg.cem.warmup_epochs or 0)

    def train_epoch(self, epoch: int) -> dict:
        t0 = time.perf_counter()
        lr = lr_at(self.cfg, epoch)            # the scheduled rate: s(eta) of the injection uses it
        step_lr = applied_lr(self.cfg, epoch)  # 0 in epoch 1 under train.reference_warmup_lr0
        self.set_lr(step_lr)
        cem_on = self.cem_active(epoch)
        if cem_on and self.matcher.due(epoch):
            if self.surrogate.needs_refit and not self.surrogate.fitted:
                self.refit_surrogate()   # no epoch end has fitted it yet (no warm-up): a pull needs fitted cells
            self.matcher.match(epoch, lr, self.splits, self.client, self.server, self.surrogate,
                               self.encode(self.splits.train))
        t_prep = time.perf_counter()   # a first fit of the surrogate and the FLOP count are not steps
        self.prepare_steps(cem_on)
        acc = self.epoch_acc()
        if self.device.type == "cuda" and self.step_flops is None:
            self.step_flops = self.count_step_flops()
        prep_s = time.perf_counter() - t_prep
        it = data_mod.BatchIterator(self.splits.train, self.splits, self.cfg.train.batch_size,
                                    self.cfg.train.augment, self.gen)
        steps = 0
        warm_steps = self.cfg.train.warmup_lr_epochs * len(it)   # linear warm-up: steps 1..warm_steps
        done_before = (epoch - 1) * len(it)
        for x, y in it:
            if done_before + steps < warm_steps:     # its last step reaches the full rate (frac = 1)
                self.set_lr(step_lr * min(1.0, (done_before + steps + 1) / warm_steps))
            self.step(x, y, cem_on, lr, acc)
            steps += 1
        # end of epoch: one host sync to read the logs
        vals = {k: float(v) for k, v in acc.items() if k != "surr"}
        # the steps (and a strength match) alone: the sync above waited for the last one
        steps_s = time.perf_counter() - t0 - prep_s
        if "surr" in acc:
            vals.update(zip(("surr_" + k for k in self.surr_log_names), acc["surr"].tolist()))
        if vals["ce_nonfinite"] > 0:
            raise TrialDiverged(f"the classification loss became non-finite in epoch {epoch} "
                                f"({int(vals['ce_nonfinite'])} of {steps} steps); lower train.lr or cem.lambd")
        if self.surrogate is not None and self.surrogate.needs_refit and (cem_on or self.cem_active(epoch + 1)):
            self.refit_surrogate()
        rec = {
            "epoch": epoch, "lr": step_lr, "cem_active": cem_on,
            "train_loss": vals["ce_sum"] / max(vals["seen"], 1),
            "train_acc": vals["correct"] / max(vals["seen"], 1),
            "rob_loss": vals["rob_loss"] / steps if cem_on else 0.0,
            "rob_nonfinite": int(vals["rob_nonfinite"]),
        }
        if cem_on:
            rec["cem_loss_scale"] = self.matcher.scale    # the scale this epoch's steps used (cem.strength)
        for k, v in vals.items():
            if k.startswith("surr_"):
                rec[k] = v / steps
        # throughput of the steps, as nanoGPT logs its MFU: a slow trial shows in its own records
        rec["images_per_s"] = vals["seen"] / steps_s
        if self.step_flops is not None:
            rec["tflops"] = self.step_flops * steps / steps_s / 1e12
        if self.graph_step is not None:
            rec.update(self.graph_step.stats())
        if self.surrogate_compile_failed is not None:
            rec["surrogate_compile_failed"] = self.surrogate_compile_failed
        rec["train_s"] = time.perf_counter() - t0
        return rec

    @torch.no_grad()
    def encode(self, split: data_mod.Split) -> torch.Tensor:
        """Clean features of a split (eval mode, no augmentation, no noise), fp32."""
        self.client.eval()
        batches = (x for x, _ in data_mod.eval_batches(split, self.splits, self.cfg.train.eval_batch_size))
        return models.encode(self._client_fwd, batches, self.device, self.amp)

    @torch.no_grad()
    def encode_augmented(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Clean features and labels of one extra shuffled, augmented pass over the training split (eval mode,
        no noise), drawn with the trainer's generator like a training epoch: the reference's epoch-end
        feature pass, which consumed the training iterator (docs/reference.md §5.1, §10 item 7)."""
        self.client.eval()
        labels = []

        def images():
            for x, y in data_mod.BatchIterator(self.splits.train, self.splits, self.cfg.train.batch_size,
                                               self.cfg.train.augment, self.gen):
                labels.append(y)
                yield x

        feats = models.encode(self._client_fwd, images(), self.device, self.amp)
        return feats, torch.cat(labels)

    def refit_surrogate(self) -> None:
        """Refit the surrogate on the clean training split, or under ``cem.refit_augmented`` on an extra
        augmented pass (which shifts the trainer's random stream, as the reference's extra pass did)."""
        if self.refit_augmented:
            feats, labels = self.encode_augmented()
        else:
            feats, labels = self.encode(self.splits.train), self.splits.train.labels
        self.surrogate.refit(feats, labels)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Noisy test accuracy (as the paper reports), clean test accuracy and the feature spread."""
        self.client.eval()
        self.server.eval()
        correct_noisy = torch.zeros((), device=self.device)
        correct_clean = torch.zeros((), device=self.device)
        feats = []
        # evaluation noise must not shift the training noise stream: the eager trainer borrows its generator
        # and restores it; a graphed one (whose generator the graph's replays advance) uses its own, seeded
        # from the trial seed and the epoch
        gen, gen_state = self.gen, None
        if self.graphed:
            gen = torch.Generator(device=self.device).manual_seed(self.cfg.seed * 1000003 + len(self.history) + 1)
        else:
            gen_state = self.gen.get_state()
        for x, y in data_mod.eval_batches(self.splits.test, self.splits, self.cfg.train.eval_batch_size):
            if self.device.type == "cuda":
                x = x.contiguous(memory_format=torch.channels_last)
            with self._autocast():
                z = self._client_fwd(x)
                correct_clean += (self._server_fwd(z).argmax(1) == y).sum()
                correct_noisy += (self._server_fwd(self.add_noise(z, gen)).argmax(1) == y).sum()
            feats.append(z.float().flatten(1))
        if gen_state is not None:
            self.gen.set_state(gen_state)
        n = len(self.splits.test)
        spread = intra_class_mse(torch.cat(feats), self.splits.test.labels, self.splits.num_classes)
        return {"test_acc": float(correct_noisy) / n, "test_acc_clean": float(correct_clean) / n,
                "feature_spread": float(spread)}

    def fit(self, on_epoch: Callable[[dict], None] | None = None, start_epoch: int = 1) -> list[dict]:
        """Train from ``start_epoch`` to ``train.epochs``; ``on_epoch(record)`` after each epoch."""
        if self.surrogate is not None and self.lambd > 0:
            self.check_surrogate_compiles()
        for epoch in range(start_epoch, self.cfg.train.epochs + 1):
            t0 = time.perf_counter()
            rec = self.train_epoch(epoch)
            rec.update(self.evaluate())
            self.check_finite(epoch, rec)
            self.selection.track(rec, self.client, self.server)
            rec["epoch_s"] = time.perf_counter() - t0
            self.epoch = epoch
            self.history.append(rec)
            if on_epoch is not None:
                on_epoch(rec)
        return self.history

    def check_finite(self, epoch: int, rec: dict) -> None:
        """TrialDiverged where the epoch left non-finite weights or features. Its steps' losses can all be finite
        while the last update overflows the weights (a rate of 100 in one epoch): the run was then an ``ok`` row
        at chance, its checkpoint NaN, and ``cem-bench attack`` refused the encoder that ``train`` had attacked.
        One host sync per epoch."""
        params = itertools.chain(self.client.parameters(), self.server.parameters())
        if math.isfinite(rec["feature_spread"]) and bool(torch.stack([p.isfinite().all() for p in params]).all()):
            return
        raise TrialDiverged(f"the model's weights or features became non-finite in epoch {epoch} (train loss "
                            f"{rec['train_loss']:.4g}); lower train.lr or cem.lambd")

    # ------------------------------------------------------------------------------------ test-set selection
    def select_best(self) -> int:
        """Load the selected epoch's client and server (``train.select_best_last``) and return that epoch; the
        last epoch when selection is off (or nothing was selected)."""
        return self.selection.select(self.client, self.server, self.epoch)

    # ------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch, "history": self.history,
            "client": self.client.state_dict(), "server": self.server.state_dict(),
            "surrogate": self.surrogate.state_dict() if self.surrogate is not None else None,
            "client_opt": self.client_opt.state_dict(), "server_opt": self.server_opt.state_dict(),
            "surrogate_opt": self.surrogate_opt.state_dict() if self.surrogate_opt is not None else None,
            "gen": self.gen.get_state(),
            "surrogate_gen": (self.surrogate.rng(self.device).get_state() if self.surrogate is not None else None),
            "best": self.selection.best,
            "strength": self.matcher.state_dict(),
            # the global streams too: the server's dropout draws from them, and a resume re-seeds them from the
            # trial seed, so without these its epochs replayed epoch 1's dropout masks
            "device_type": self.device.type,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.history = state["epoch"], list(state["history"])
        self.client.load_state_dict(state["client"])
        self.server.load_state_dict(state["server"])
        if self.surrogate is not None and state.get("surrogate") is not None:
            self.surrogate.load_state_dict(state["surrogate"])
        self.client_opt.load_state_dict(state["client_opt"])
        self.server_opt.load_state_dict(state["server_opt"])
        # a graphed run saves its rate as a tensor: back to this trainer's kind (train_epoch sets the value)
        saved = float(self.client_opt.param_groups[0]["lr"])
        self._set_group_lr(self._lr_tensor if self._lr_tensor is not None else saved)
        if self.surrogate_opt is not None and state.get("surrogate_opt") is not None:
            self.surrogate_opt.load_state_dict(state["surrogate_opt"])
        self.selection.load(state.get("best"), self.device)
        if state.get("strength") is not None:   # the scales it measured: a resume does not measure again
            self.matcher.load_state_dict(state["strength"])
        self.load_streams(state)

    def load_streams(self, state: dict) -> None:
        """Put back the random streams of ``state``: the trainer's, the surrogate's and the global ones, so that
        the resumed epochs are those of a run that never stopped. A state saved on another kind of device (a
        CUDA generator's state is 16 bytes, a CPU one's 5,056: ``--resume`` may change ``train.device``) cannot
        be set; its streams are seeded again from the trial seed and the epoch instead, and a note says that the
        resumed epochs draw other numbers than an uninterrupted run would (the weights, optimisers and
        everything else still continue)."""
        # a state from before the device was saved: a CPU generator's state has the CPU's size
        saved = state.get("device_type") or \
            ("cpu" if state["gen"].numel() == torch.Generator().get_state().numel() else "cuda")
        if saved != self.device.type:
            seed = (self.cfg.seed * 1_000_003 + self.epoch) % 2 ** 62
            self.gen.manual_seed(seed)
            if self.surrogate is not None:
                self.surrogate.rng(self.device).manual_seed(seed + 1)
            torch.manual_seed(seed + 2)
            print(f"cem-bench: note: this trial's state was saved on {saved} and resumes on {self.device.type}: its "
                  f"random streams are seeded again from the trial seed and epoch {self.epoch}, so the epochs from "
                  f"now on draw other numbers than an uninterrupted run's", file=sys.stderr, flush=True)
            return
        self.gen.set_state(state["gen"].cpu() if self.device.type != "cuda" else state["gen"])
        if self.surrogate is not None and state.get("surrogate_gen") is not None:
            self.surrogate.rng(self.device).set_state(state["surrogate_gen"].cpu())
        if state.get("torch_rng") is not None:
            torch.set_rng_state(state["torch_rng"].cpu())
        if state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"].cpu(), self.device)
