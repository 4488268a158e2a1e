"""Whether a graphed training step is the eager step: the verification harness of ``train.cuda_graph``,
``train.surrogate_stream`` and ``train.compile_surrogate`` (docs/performance.md, "Step by step from a common
state"). ``compare_with_eager`` compares whole short runs; ``compare_step_by_step`` loads the graphed copy's
whole state into two eager copies before each step; ``steps_agree`` and ``within_eager_floor`` judge them.
Used by scripts/gpu_check.py and tests/test_graphs.py; it builds whole trainers (``trial.build``), so it lives
in the bench, above the trainer, not beside the capture it checks."""

from __future__ import annotations

import contextlib
import itertools

import torch


@contextlib.contextmanager
def _comparison_settings(deterministic: bool):
    """The process's cuDNN/TF32 flags and deterministic-algorithms setting, restored on exit (a GPU check times
    other things after a comparison); with ``deterministic`` the copies run under
    ``torch.use_deterministic_algorithms(True, warn_only=True)``."""
    flags = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    determinism = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        if deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        yield
    finally:
        (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32,
         torch.backends.cuda.matmul.allow_tf32) = flags
        torch.use_deterministic_algorithms(determinism[0], warn_only=determinism[1])


def _comparison_copy(flat: dict, mode: str, dev: torch.device, random: bool):
    """``(cfg, splits, trainer)`` of one copy in a comparison: ``train.cuda_graph=mode`` on ``dev``, in train mode,
    with the same arithmetic as every other copy (no TF32, no autotuned algorithm choice); without ``random``
    nothing in its step draws random numbers but the surrogate (no defense noise, no classifier dropout)."""
    from ..core.trial import build, build_config
    if flat.get("train.compile_surrogate", "auto") == "auto":
        # auto compiles the surrogate of a graphed CUDA step only: every copy the same, so one arithmetic
        flat = {**flat, "train.compile_surrogate": "on" if dev.type == "cuda" else "off"}
    cfg = build_config({**flat, "train.cuda_graph": mode, "train.device": str(dev),
                        **({} if random else {"defense.noise_std": 0.0})})
    splits, tr = build(cfg, dev)
    if dev.type == "cuda":   # after build: the trainer switches cuDNN's autotuning on
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    if not random:
        for mod in tr.server.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
    tr.prepare_steps(tr.surrogate is not None)
    return cfg, splits, tr


def _comparison_batches(cfg, splits, dev: torch.device, steps: int):
    """The first ``steps`` training batches of a fixed order (epochs repeat as needed), no augmentation."""
    from ..core import data
    gen = torch.Generator(device=dev).manual_seed(0)
    batches = data.BatchIterator(splits.train, splits, cfg.train.batch_size, "none", gen)
    return list(itertools.islice(itertools.chain.from_iterable(itertools.repeat(batches)), steps))


def _flat_params(*modules) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for m in modules for p in m.parameters()])


def compare_with_eager(flat: dict, steps: int = 8, device: str = "cuda", random: bool = False,
                       eager_flat: dict | None = None, deterministic: bool = False) -> dict:
    """Train two copies of one trial config for ``steps`` steps on the same batches, one with the graphed
    step and one eager, and return the largest difference of their client and server parameters, with the
    graphed copy's step counts, and the difference between two eager copies (``eager_floor``: run-to-run
    non-determinism of CUDA kernels). ``random=False`` switches off what draws random numbers in a step (the
    defense noise and the classifier's dropout), so that the two must agree to rounding; with ``random=True``
    they agree only if the graph's replays draw the numbers the eager steps draw. Used by the GPU check script
    (the CUDA tests use ``compare_step_by_step``, which no amplification confuses). ``eager_flat``: keys that
    only the two eager copies change (e.g. the graphed copy with ``train.surrogate_stream`` against one-stream
    eager steps). Also the two differences after each step (``diff_by_step``, ``floor_by_step``).
    ``deterministic``: all three copies under ``torch.use_deterministic_algorithms(True, warn_only=True)`` (the
    atomic adds of index backward replaced by deterministic kernels where PyTorch has them; Inductor compiles
    deterministic code), so that the floor is ~0 and a graphed run that differs stands out; the process's
    setting is restored after."""
    dev = torch.device(device)
    out = {}
    trail: dict[str, list[torch.Tensor]] = {}   # all client and server parameters after each step
    with _comparison_settings(deterministic):
        # "off" twice: two eager runs differ too where CUDA kernels add with atomics (index_add_, the scatter in
        # the backward of a gather): that difference is the floor the graphed run is compared against
        for mode in ("on", "off", "off again"):
            cfg, splits, tr = _comparison_copy({**flat, **((eager_flat or {}) if mode != "on" else {})},
                                               mode.split()[0], dev, random)
            cem_on, acc = tr.surrogate is not None, tr.epoch_acc()
            trail[mode] = []
            for x, y in _comparison_batches(cfg, splits, dev, steps):
                tr.step(x, y, cem_on, cfg.train.lr, acc)
                trail[mode].append(_flat_params(tr.client, tr.server))
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if tr.graph_step is not None:
                out.update(tr.graph_step.stats())
    # after each step: a difference that starts at rounding and grows step by step is a chaotic amplification
    # (Adam's normalised steps, a hard assignment that flips); one that jumps at a step is a different step
    by_step = lambda a, b: [float((u - v).abs().max()) for u, v in zip(trail[a], trail[b])]  # noqa: E731
    out["diff_by_step"] = by_step("on", "off")
    out["floor_by_step"] = by_step("off", "off again")
    out["max_abs_diff"] = out["diff_by_step"][-1]        # after the last step
    out["eager_floor"] = out["floor_by_step"][-1]
    out["max_abs_param"] = float(trail["off"][-1].abs().max())
    return out


# a parameter entry "moves differently" in two copies when their updates of it differ by more than MOVE_RTOL of
# the update (plus MOVE_ATOL); counted over the entries whose gradient is at least STRONG of its tensor's largest
# (Adam normalises each entry's step: an entry whose gradient sits at its own rounding level moves anywhere
# within its rate, by rounding alone)
MOVE_RTOL, MOVE_ATOL, STRONG = 1e-3, 1e-7, 1e-2


def _snapshot(tr, grads: bool = True) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Every parameter of a trainer's client, server and surrogate by name (``client.features.0.weight``), with
    its gradient of the last step (None without ``grads``), as fp32 copies."""
    out = {}
    for part in ("client", "server", "surrogate"):
        mod = getattr(tr, part)
        for name, p in (mod.named_parameters() if mod is not None else ()):
            grad = p.grad.detach().float().clone() if grads and p.grad is not None else None
            out[f"{part}.{name}"] = (p.detach().float().clone(), grad)
    return out


def _step_metrics(a: dict, b: dict, before: dict) -> dict:
    """How snapshot ``a`` after a step differs from ``b`` (the eager reference), both from ``before``."""
    enc = [n for n in b if not n.startswith("surrogate.")]
    diff = max((float((a[n][0] - b[n][0]).abs().max()) for n in enc), default=0.0)
    size = max((float((b[n][0] - before[n][0]).abs().max()) for n in enc), default=0.0)
    # each tensor's gradient difference over its largest gradient, or over STRONG of its part's (client, server,
    # surrogate) largest where that is more: some gradients are 0 in exact arithmetic and rounding in practice
    # (a convolution's bias before batch norm, a bias that shifts every logit of a softmax alike)
    grads = {n: (a[n][1], g) for n, (_, g) in b.items() if g is not None and a[n][1] is not None}
    part_max: dict[str, float] = {}
    for n, (_, g) in grads.items():
        part = n.split(".", 1)[0]
        part_max[part] = max(part_max.get(part, 0.0), float(g.abs().max()))
    worst = {"encoder": (0.0, ""), "surrogate": (0.0, "")}
    for n, (ga, g) in grads.items():
        part = n.split(".", 1)[0]
        scale = max(float(g.abs().max()), STRONG * part_max[part])
        rel = float((ga - g).abs().max()) / scale if scale > 0 else 0.0
        side = "surrogate" if part == "surrogate" else "encoder"
        if rel > worst[side][0]:
            worst[side] = (rel, n)
    strong = moved = 0
    for n in (n for n in b if n.startswith("surrogate.") and b[n][1] is not None):
        g = b[n][1].abs()
        keep = g >= STRONG * g.max()
        upd = (b[n][0] - before[n][0]).abs()
        off = (a[n][0] - b[n][0]).abs() > MOVE_RTOL * upd + MOVE_ATOL
        strong += int(keep.sum())
        moved += int((off & keep).sum())
    return {"diff": diff, "size": size, "grad_rel": worst["encoder"][0], "grad_worst": worst["encoder"][1],
            "surrogate_grad_rel": worst["surrogate"][0], "surrogate_grad_worst": worst["surrogate"][1],
            "surrogate_moved": moved / strong if strong else 0.0}


def compare_step_by_step(flat: dict, steps: int = 8, device: str = "cuda", random: bool = False,
                         eager_flat: dict | None = None, deterministic: bool = False, mode: str = "on") -> dict:
    """Each step of a graphed copy against eager steps from the *same* state, one step at a time.

    Before each of the first copy's steps (``train.cuda_graph=mode``: its warm-up, capture and replays) its
    whole state — parameters, buffers, optimizer states, its noise and surrogate random streams, and the
    process's default generators — is loaded into two eager copies, and all three take the step on the same
    batch. What differs after it is that step's difference alone: nothing carried over from earlier steps, so
    nothing that a later step amplifies (Adam's normalised updates of near-zero gradients, a hard assignment
    that flips, which make ``compare_with_eager``'s trails grow from rounding to 1e-3). Per step, each as a list
    (the eager pair's own difference in the ``*_floor`` lists):

    * ``diff`` / ``floor`` / ``size``: the largest difference of the client and server parameters, graphed vs
      eager and eager vs eager, and the eager step's own update.
    * ``grad_rel`` / ``grad_floor``: the step's gradients of the client and server parameters, as the largest
      difference over the tensor's largest gradient (``grad_worst``: which tensor). The surrogate's gradient
      reaches the encoder within the step, so a wrong surrogate forward or backward shows here; the encoder's
      gradients are well conditioned (compiled vs eager surrogate on the CPU: ~1e-5).
    * ``surrogate_grad_rel`` / ``surrogate_grad_floor`` (``surrogate_grad_worst``): the same for the surrogate's
      own parameters. Some estimators are ill-conditioned (a log of a small variance of nearly equal
      features): compiled vs eager on the CPU, one step differed by up to 1.3e-2 here by rounding alone.
    * ``surrogate_moved`` / ``surrogate_moved_floor``: the share of the surrogate's entries with a clear
      gradient (at least ``STRONG`` of the tensor's largest) that the two copies' Adam steps moved differently
      (by more than ``MOVE_RTOL`` of the eager update plus ``MOVE_ATOL``): a stale rate or step count in the
      captured optimizer step moves most of them.

    ``random``, ``eager_flat`` and ``deterministic`` as in ``compare_with_eager``; also the first copy's step
    counts. ``steps_agree`` judges the result. ``mode="off"`` compares three eager copies (the CPU test of the
    comparison itself: every difference is then 0)."""
    import copy
    dev = torch.device(device)
    out: dict = {k: [] for k in ("diff", "floor", "size", "grad_rel", "grad_floor", "grad_worst", "surrogate_grad_rel",
                                 "surrogate_grad_floor", "surrogate_grad_worst", "surrogate_moved",
                                 "surrogate_moved_floor")}
    with _comparison_settings(deterministic):
        cfg, splits, first = _comparison_copy(flat, mode, dev, random)
        twins = [_comparison_copy({**flat, **(eager_flat or {})}, "off", dev, random)[2] for _ in range(2)]
        cem_on = first.surrogate is not None
        accs = [t.epoch_acc() for t in (first, *twins)]
        cuda = dev.type == "cuda"
        for x, y in _comparison_batches(cfg, splits, dev, steps):
            state = first.state_dict()   # views of its live tensors: the first copy steps last
            # the classifier's dropout draws from the process's default generator: each copy from the same state
            default_rng = (torch.get_rng_state(), torch.cuda.get_rng_state(dev) if cuda else None)
            before = _snapshot(first, grads=False)
            after = []
            for tr, acc in zip((*twins, first), (*accs[1:], accs[0])):
                if tr is not first:
                    tr.load_state_dict(copy.deepcopy(state))   # each its own copy: an optimizer may keep the tensors
                torch.set_rng_state(default_rng[0])
                if cuda:
                    torch.cuda.set_rng_state(default_rng[1], dev)
                tr.step(x, y, cem_on, cfg.train.lr, acc)
                after.append(_snapshot(tr))
            eager, again, graphed = after
            step, floor = _step_metrics(graphed, eager, before), _step_metrics(again, eager, before)
            for k in ("diff", "size", "grad_rel", "grad_worst", "surrogate_grad_rel", "surrogate_grad_worst",
                      "surrogate_moved"):
                out[k].append(step[k])
            for k, f in (("floor", "diff"), ("grad_floor", "grad_rel"), ("surrogate_grad_floor", "surrogate_grad_rel"),
                         ("surrogate_moved_floor", "surrogate_moved")):
                out[k].append(floor[f])
        if cuda:
            torch.cuda.synchronize(dev)
        if first.graph_step is not None:
            out.update(first.graph_step.stats())
    return out


def steps_agree(res: dict, rtol: float = 1e-3, surrogate_rtol: float = 0.1, moved_share: float = 0.1) -> bool:
    """Whether every step of a ``compare_step_by_step`` result is the eager step to rounding. Each quantity within
    10x the eager pair's own difference (2x for the share), or else within:

    * ``rtol`` of the step's update for the client and server parameters, and of each tensor's largest
      gradient for their gradients (a wrong step — a stale rate, a missed update, other noise, a wrong
      surrogate — differs by about the update or the gradient itself; rounding by far less);
    * ``surrogate_rtol`` for the surrogate's own gradients (ill-conditioned: rounding alone moves them by about 1e-2);
    * ``moved_share`` of the surrogate's clear entries moved differently by its optimizer (a stale rate or step
      count in the captured Adam moves nearly all; compiled vs eager rounding moves a few per cent; docs/performance.md,
      'Step by step from a common state')."""
    def within(vals, floors, bounds, times=10.0):
        return all(v <= max(times * f, b) for v, f, b in zip(vals, floors, bounds))
    n = len(res["diff"])
    return within(res["diff"], res["floor"], [rtol * s for s in res["size"]]) and \
        within(res["grad_rel"], res["grad_floor"], [rtol] * n) and \
        within(res["surrogate_grad_rel"], res["surrogate_grad_floor"], [surrogate_rtol] * n) and \
        within(res["surrogate_moved"], res["surrogate_moved_floor"], [moved_share] * n, times=2.0)


def within_eager_floor(res: dict) -> bool:
    """Whether a ``compare_with_eager`` result agrees with eager: within 10x the two eager runs' own
    difference, or 1e-3 of the largest parameter (a step gone wrong, a stale rate or a missed update, moves
    parameters by ~lr * grad = 1e-2 per step)."""
    return res["max_abs_diff"] <= max(10 * res["eager_floor"], 1e-3 * max(1.0, res["max_abs_param"]))
