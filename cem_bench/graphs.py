"""The training step as one CUDA graph (``train.cuda_graph``; docs/performance.md "CUDA graphs").

A training step of this model launches a few hundred small kernels; on a fast GPU the card waits for
Python to launch them (docs/performance.md, "CUDA graphs"). ``GraphedStep`` captures the
whole step — forward, noise, CE, the CEM loss, backward and the optimizer steps — once, and then replays it
with one launch per batch.

What makes the step capturable (``Trainer.step_body``):

* static shapes: every training batch has ``train.batch_size`` images (``data.BatchIterator`` drops the short
  last batch), and the surrogates pad per class to the batch size, never to the batch's contents (no host
  sync anywhere in a step: ``surrogates.base.group_by_class``);
* host values as device tensors filled in place: the learning rate (the SGD param groups hold one tensor;
  fused SGD reads it on the device) and the CEM loss's weight and the encoder's multiplier of
  ``cem_scales`` (they change with the lr), so an lr drop or the warm-up needs no new capture;
* graph-safe random numbers: the noise generator and the surrogate's generator are registered with the
  graph (``CUDAGraph.register_generator_state``), the default generator (dropout) is handled by PyTorch,
  so every replay draws fresh noise and the eager code between replays (shuffling, augmentation) shares
  the same streams;
* the log accumulators are the same tensors every epoch (``Trainer.epoch_acc``); autocast's cast cache is
  off; the surrogate's Adam is ``capturable``.

A new capture is made when the step's structure changes — the CEM loss switching on after its warm-up, a
surrogate whose state tensors were reallocated, another accumulator dict — after ``WARMUP_STEPS`` eager
steps on a side stream (PyTorch's recipe: they create the optimizer state and the gradients, run cuDNN's
autotuning and the lazy initialisations that must not happen during a capture). Those steps are real
training steps. Refit and evaluation run eagerly between replays. Under ``train.cuda_graph=auto`` a failed
capture is reported once and the trial goes on with eager steps; under ``on`` it is an error.
"""

from __future__ import annotations

import contextlib
import itertools

import torch

WARMUP_STEPS = 3


def on_side_stream(fn, device) -> None:
    """Run ``fn()`` on a fresh CUDA stream, ordered after and before the current one (PyTorch's warm-up for a
    capture: lazy initialisations must not land on the stream that is captured later)."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream(device).wait_stream(stream)


def capture(fn, device, generators=()) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``fn()`` (recorded, not run), drawing from ``generators`` graph-safely."""
    graph = torch.cuda.CUDAGraph()
    for gen in generators:
        graph.register_generator_state(gen)
    torch.cuda.synchronize(device)
    with torch.cuda.graph(graph):
        fn()
    return graph


class CaptureSchedule:
    """PyTorch's recipe for a graphed step, shared by the trainer's and the decoder attack's: ``WARMUP_STEPS``
    eager steps on a side stream (optimizer state, gradients, cuDNN autotuning and lazy initialisations must
    not happen during a capture), one capture, then a replay per step. ``reset()`` starts over (a new step
    structure). A capture that fails is reported once and every later step runs eagerly (``strict=False``,
    ``train.cuda_graph=auto``), or raises (``strict``, ``on``).

    ``run(eager, captured, load, generators)``: ``eager()`` runs the step on the live inputs; ``captured()``
    runs it on the static inputs that the graph reads; ``load()`` puts the live inputs into the static ones
    (and makes them before the first capture); ``generators`` are registered with the graph."""

    def __init__(self, device, strict: bool, what: str):
        self.device, self.strict, self.what = device, strict, what
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warm_left = WARMUP_STEPS
        self.captures = self.replays = self.eager_steps = 0
        self.failed: str | None = None        # why capturing failed (auto mode then runs eager steps)

    def reset(self) -> None:
        self.graph, self.warm_left = None, WARMUP_STEPS

    def run(self, eager, captured, load, generators=()) -> None:
        if self.failed is None and self.graph is None:
            if self.warm_left > 0:
                self.warm_left -= 1
                self.eager_steps += 1
                on_side_stream(eager, self.device)
                return
            load()
            try:
                self.graph = capture(captured, self.device, generators)
                self.captures += 1
            except Exception as e:  # noqa: BLE001 - auto mode falls back to the eager step
                if self.strict:
                    raise
                self.failed = f"{type(e).__name__}: {e}"
                print(f"[cem-bench] train.cuda_graph=auto: capturing the {self.what} failed ({self.failed}); "
                      f"it runs eagerly from now on", flush=True)
        if self.failed is not None:
            self.eager_steps += 1
            eager()
            return
        load()
        self.graph.replay()
        self.replays += 1

    def stats(self) -> dict:
        return {"cuda_graph_captures": self.captures, "cuda_graph_replays": self.replays,
                "cuda_graph_eager_steps": self.eager_steps, "cuda_graph_failed": self.failed or ""}


class GraphedStep:
    """``step(x, y, cem_on, lr, acc)``: ``Trainer.step`` as a replay of a captured graph (``CaptureSchedule``),
    captured again when the step's signature changes."""

    def __init__(self, trainer):
        self.trainer = trainer
        dev = trainer.device
        self.weight = torch.zeros((), device=dev)
        self.mult = torch.ones((), device=dev)
        self.key = None
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.schedule = CaptureSchedule(dev, trainer.cfg.train.cuda_graph == "on", "training step")

    # the schedule's counts, as the bench rows, the epoch records and the tests read them
    captures = property(lambda self: self.schedule.captures)
    replays = property(lambda self: self.schedule.replays)
    eager_steps = property(lambda self: self.schedule.eager_steps)
    failed = property(lambda self: self.schedule.failed)

    def _signature(self, x: torch.Tensor, cem_on: bool, acc: dict) -> tuple:
        """What a captured step depends on: CEM on or off, the batch's shape, the accumulator dict and the
        tensors the caller gave in it (``Trainer.ACC_KEYS``; the accumulator the step makes for itself,
        ``acc["surr"]`` on its first step, belongs to the step and changes nothing), and where the surrogate's
        parameters and buffers live."""
        s = self.trainer.surrogate          # every step: parameters and buffers, not a state_dict
        state = tuple(t.data_ptr() for t in itertools.chain(s.parameters(), s.buffers())) \
            if (cem_on and s is not None) else ()
        given = tuple(id(acc[k]) for k in self.trainer.ACC_KEYS if k in acc)
        return (cem_on, tuple(x.shape), id(acc), given, state)

    def step(self, x: torch.Tensor, y: torch.Tensor, cem_on: bool, lr: float, acc: dict) -> None:
        tr = self.trainer
        weight, mult = tr.cem_scales(lr) if cem_on else (0.0, 1.0)
        self.weight.fill_(weight)
        self.mult.fill_(mult)
        key = self._signature(x, cem_on, acc)
        if key != self.key:
            self.key = key
            self.schedule.reset()

        def load() -> None:
            if self.x is None or self.x.shape != x.shape:
                self.x = x.detach().clone(memory_format=torch.channels_last)
                self.y = y.detach().clone()
            else:
                self.x.copy_(x)
                self.y.copy_(y)

        gens = [tr.gen] + ([tr.surrogate.rng(tr.device)] if cem_on and tr.surrogate is not None else [])
        self.schedule.run(lambda: tr.step_body(x, y, cem_on, self.weight, self.mult, acc),
                          lambda: tr.step_body(self.x, self.y, cem_on, self.weight, self.mult, acc), load, gens)

    def stats(self) -> dict:
        return self.schedule.stats()


def graph_mode(mode: str, device: torch.device, compiled: bool) -> bool:
    """Whether a training step runs as a CUDA graph: ``train.cuda_graph`` ``mode`` (auto: on for CUDA unless the
    models are ``torch.compile``d, ``compiled``). The caller refuses ``on`` off CUDA (``Trainer``)."""
    return mode == "on" or (mode == "auto" and device.type == "cuda" and not compiled)


class SideStream:
    """The surrogate's own CUDA stream of a training step (``train.surrogate_stream``): its small kernels (and,
    by autograd's rule that a backward op runs on its forward op's stream, its backward) run beside the
    server's; a captured step holds them as a parallel branch. Disabled (CPU, or the key off): every method is
    a no-op and ``stream`` is None."""

    def __init__(self, device, enabled: bool):
        self.device = device
        self.stream = torch.cuda.Stream(device) if enabled else None

    def set_priority(self, priority: int) -> None:
        """CUDA priority ``priority`` (lower is higher); before the first step, since a capture records the
        stream. No own stream: nothing to do."""
        if self.stream is not None:
            self.stream = torch.cuda.Stream(self.device, priority=priority)

    def run(self, *inputs, fork: bool = True):
        """The context the surrogate's work runs in. ``fork``: the side stream first waits for the current one
        (the forward, which reads the encoder's features); the optimizer step needs no fork, since its
        gradients were made on the side stream. ``inputs`` made on the current stream are marked as used on the
        side one (the allocator must not hand out their memory while the side stream may still read it)."""
        if self.stream is None:
            return contextlib.nullcontext()
        if fork:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        for t in inputs:
            t.record_stream(self.stream)
        return torch.cuda.stream(self.stream)

    def join(self) -> None:
        """The current stream waits for the side stream (its logs and its optimizer step), at the end of the
        step: a captured graph must end joined, and the accumulators are read on the current stream. The
        backward needed no join: the engine syncs each gradient that crosses streams, and the leaf gradients
        with the stream that called ``backward``."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
