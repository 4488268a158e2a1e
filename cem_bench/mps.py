"""CUDA MPS (Multi-Process Service) for trials that share a GPU (docs/performance.md, 'Packing').

Several trial processes on one card each get their own CUDA context; without MPS the card time-slices
between the contexts, and the small kernels of this model cannot overlap. Under MPS their kernels run
concurrently. ``start()`` starts the control daemon (``nvidia-cuda-mps-control -d``) unless one
already runs, and says whether it did, so that ``stop()`` stops only a daemon this process started.

``cem-bench search --mps auto|on|off`` (auto: on when trials share a GPU, i.e. ``resources.gpu`` < 1, and a
GPU is visible) starts it before Ray and stops it at the end; ``cluster.yaml`` starts it on every GPU node.
Where it cannot start (no ``nvidia-cuda-mps-control``, no GPU, no permission) ``auto`` prints why and
goes on without it; ``on`` is an error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from .errors import ConfigError

CONTROL = "nvidia-cuda-mps-control"


class MPSError(ConfigError):
    """MPS was asked for (``--mps on``) and cannot start: the CLI prints the reason (exit 2)."""


def pipe_dir() -> str:
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")


def daemons() -> list[int] | None:
    """PIDs of the processes running ``nvidia-cuda-mps-control`` (read from /proc); None where there is no
    /proc to read."""
    if not os.path.isdir("/proc"):
        return None
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if os.path.basename(argv0) == CONTROL:
                pids.append(int(d))
    return pids


def running() -> bool:
    """A control daemon runs for the pipe directory (the default, or CUDA_MPS_PIPE_DIRECTORY): its ``control``
    pipe is there and its process is alive. The pipe alone is not enough: a daemon that has quit can leave it
    behind, and a session that took it for a running daemon would start none and pack its trials without MPS."""
    if not os.path.exists(os.path.join(pipe_dir(), "control")):
        return False
    pids = daemons()
    return pids is None or bool(pids)


def servers(timeout_s: float = 10.0) -> str:
    """What the control daemon says of its servers (one runs once MPS clients are connected): a check that
    packed processes really share the card through MPS. A diagnostic, so it never raises: a daemon that does
    not answer in ``timeout_s`` (or cannot be run) is said in the string, and the measurement it was read
    beside is kept (a TimeoutExpired here once threw away a measured pair of paper trials)."""
    exe = shutil.which(CONTROL)
    if exe is None:
        return f"no {CONTROL}"
    try:
        p = subprocess.run([exe], input="get_server_list\n", capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"error: {CONTROL} did not answer get_server_list in {timeout_s:g} s (a wedged daemon?)"
    except OSError as e:
        return f"error: {CONTROL} could not run: {e}"
    return f"rc {p.returncode}: {(p.stdout + p.stderr).strip()[:200]}"


def control() -> str:
    """The control daemon's executable; ``MPSError`` when it is not on PATH (``--mps on`` is refused with it
    before anything is written)."""
    exe = shutil.which(CONTROL)
    if exe is None:
        raise MPSError(f"{CONTROL} is not on PATH (it ships with the NVIDIA driver; MPS needs a Linux GPU node)")
    return exe


def start() -> bool:
    """Start the MPS control daemon; True if this call started it, False if one was running. Raises
    ``MPSError`` with the reason when it cannot."""
    if running():
        return False
    exe = control()
    # the daemon sees every card, numbered as the driver numbers them: started with CUDA_VISIBLE_DEVICES=1, its
    # server renumbers that card 0 (NVIDIA's MPS guide, 4.2.1), and a client that Ray gives
    # CUDA_VISIBLE_DEVICES=1 finds no device: torch.cuda.is_available() is False and train.device=auto trains
    # on the CPU without a word. The clients' own CUDA_VISIBLE_DEVICES still picks their card.
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    try:
        proc = subprocess.run([exe, "-d"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise MPSError(f"{CONTROL} -d failed: {e}") from None
    if proc.returncode != 0:
        raise MPSError(f"{CONTROL} -d exited with {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
    return True


def stop(wait_s: float = 30.0, quit_timeout_s: float = 60.0) -> str | None:
    """Ask the control daemon to quit (clients finish first), and wait up to ``wait_s`` for it to be gone, so
    that a session that starts next starts its own. None when it was asked; otherwise why not, as a string
    rather than an exception: it runs on the way out of a ``Session`` (and of a run being ended), where a
    raise would replace what the session's body returned or raised."""
    exe = shutil.which(CONTROL)
    if exe is None or not running():
        return None
    try:
        subprocess.run([exe], input="quit\n", capture_output=True, text=True, timeout=quit_timeout_s)
    except subprocess.TimeoutExpired:
        return f"error: {CONTROL} did not take 'quit' in {quit_timeout_s:g} s; its daemon may still run"
    except OSError as e:
        return f"error: {CONTROL} could not run to stop the daemon: {e}"
    deadline = time.monotonic() + wait_s
    while daemons() and time.monotonic() < deadline:
        time.sleep(0.2)
    return None


def wanted(mode: str, gpu_per_trial: float, gpu_visible: bool) -> bool:
    """Whether ``--mps mode`` asks for MPS: ``on``; ``auto`` when trials share a visible GPU."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"--mps {mode!r}; allowed: auto, on, off")
    return mode == "on" or (mode == "auto" and gpu_visible and 0 < gpu_per_trial < 1)


# Session.state when MPS served the processes of the session (started here, or a daemon already running)
ON_STATES = ("started", "already running")


class Session:
    """``with mps.Session(mode, gpu_per_trial, gpu_visible):`` MPS for the duration, started and stopped here
    when this process started it. ``state`` says what happened (for the log and the results)."""

    def __init__(self, mode: str, gpu_per_trial: float, gpu_visible: bool, log=print):
        self.mode, self.want = mode, wanted(mode, gpu_per_trial, gpu_visible)
        self.started, self.state, self.log = False, "off", log

    def __enter__(self) -> Session:
        if not self.want:
            return self
        try:
            self.started = start()
            self.state = "started" if self.started else "already running"
        except MPSError as e:
            if self.mode == "on":
                raise
            self.state = f"not started: {e}"
            self.log(f"[cem-bench] --mps auto: trials share a GPU but CUDA MPS could not start ({e}); the "
                     f"trials run without it (slower when packed)")
            return self
        self.log(f"[cem-bench] CUDA MPS {self.state} (pipe directory {pipe_dir()})")
        return self

    def __exit__(self, *exc) -> None:
        if self.started:
            # a run being ended (SIGTERM as SystemExit: gpu_pack under `timeout -k`) has seconds before SIGKILL: a
            # wedged daemon held it 60 s on 'quit' and 30 more on the wait, past the caller's limit
            ending = exc and exc[0] is not None and issubclass(exc[0], SystemExit)
            err = stop(wait_s=5.0, quit_timeout_s=5.0) if ending else stop()
            self.log(f"[cem-bench] CUDA MPS not stopped: {err}" if err else "[cem-bench] CUDA MPS stopped")
