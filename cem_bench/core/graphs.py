"""The training step as one CUDA graph (``train.cuda_graph``; docs/performance.md "CUDA graphs").

A training step of this model launches a few hundred small kernels; on a fast GPU the card waits for
Python to launch them (docs/performance.md, "CUDA graphs"). ``GraphedStep`` captures the whole step
(``Trainer.step`` hands it ``Trainer.step_body``) — forward, noise, CE, the CEM loss, backward and the
optimizer steps — once, and then replays it with one launch per batch.

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


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device) -> torch.cuda.Stream:
    """The stream a capture on ``device`` records on, one per device for the process. Not torch.cuda.graph's
    default: that is one stream for the whole class, made on whichever device was current at its first use, so
    a step on another card (``cuda:1``) launched its kernels outside the capture (an empty graph)."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _CAPTURE_STREAMS.get(index)
    if stream is None:
        stream = _CAPTURE_STREAMS[index] = torch.cuda.Stream(device=index)
    return stream


def capture(fn, device, generators=()) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``fn()`` (recorded, not run), drawing from ``generators`` graph-safely."""
    graph = torch.cuda.CUDAGraph()
    for gen in generators:
        graph.register_generator_state(gen)
    torch.cuda.synchronize(device)
    with torch.cuda.graph(graph, stream=capture_stream(device)):
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
    """A step function replayed from a captured graph (``CaptureSchedule``), knowing nothing of what the step
    computes. ``run(body, tensors, scalars, key, generators)`` runs ``body(*tensors, *scalars)``: the live
    tensors on an eager step, or the static copies that the graph reads (``tensors`` copied in before each
    replay); ``scalars`` are host numbers filled into 0-dim device tensors in place, so that a new value needs
    no new capture; a new ``key`` (the caller's signature of what the captured step depends on) starts the
    warm-up and capture over; ``generators`` are registered with the graph."""

    def __init__(self, device, strict: bool, what: str, n_scalars: int = 0):
        self.scalars = tuple(torch.zeros((), device=device) for _ in range(n_scalars))
        self.key = None
        self.static: tuple[torch.Tensor, ...] | None = None
        self.schedule = CaptureSchedule(device, strict, what)

    # the schedule's counts, as the bench rows, the epoch records and the tests read them
    captures = property(lambda self: self.schedule.captures)
    replays = property(lambda self: self.schedule.replays)
    eager_steps = property(lambda self: self.schedule.eager_steps)
    failed = property(lambda self: self.schedule.failed)

    def run(self, body, tensors: tuple, scalars: tuple, key, generators=()) -> None:
        for t, v in zip(self.scalars, scalars):
            t.fill_(v)
        if key != self.key:
            self.key = key
            self.schedule.reset()

        def load() -> None:
            if self.static is None or any(a.shape != b.shape for a, b in zip(self.static, tensors)):
                # an image batch is kept channels_last, the layout the step computes in on CUDA, so that the
                # step's own conversion is a no-op inside the graph
                self.static = tuple(t.detach().clone(memory_format=torch.channels_last if t.dim() == 4
                                                     else torch.preserve_format) for t in tensors)
            else:
                for a, b in zip(self.static, tensors):
                    a.copy_(b)

        self.schedule.run(lambda: body(*tensors, *self.scalars), lambda: body(*self.static, *self.scalars), load,
                          generators)

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
