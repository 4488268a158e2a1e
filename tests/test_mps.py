"""CUDA MPS for packed trials (cem_bench/mps.py): when it is wanted, and what happens where it cannot start."""

from __future__ import annotations

import pytest

from cem_bench import mps


def test_wanted_when_trials_share_a_visible_gpu():
    assert mps.wanted("auto", 0.25, True)
    assert not mps.wanted("auto", 1.0, True)          # a whole card per trial: nothing to share
    assert not mps.wanted("auto", 0.25, False)        # no GPU here
    assert not mps.wanted("auto", 0.0, True)
    assert mps.wanted("on", 1.0, False) and not mps.wanted("off", 0.25, True)
    with pytest.raises(ValueError, match="allowed: auto, on, off"):
        mps.wanted("sometimes", 0.5, True)


def test_auto_goes_on_without_mps_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))    # no daemon answers there
    monkeypatch.setattr(mps.shutil, "which", lambda name: None)
    said = []
    with mps.Session("auto", 0.25, True, log=said.append) as s:
        assert not s.started and s.state.startswith("not started: nvidia-cuda-mps-control is not on PATH")
    assert said and "could not start" in said[0]
    with pytest.raises(mps.MPSError, match="not on PATH"), mps.Session("on", 0.25, True, log=said.append):
        pass


def test_a_running_daemon_is_kept(monkeypatch, tmp_path):
    (tmp_path / "control").write_text("")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.setattr(mps, "daemons", lambda: [4242])
    calls = []
    monkeypatch.setattr(mps, "stop", lambda: calls.append("stop"))
    with mps.Session("auto", 0.5, True, log=lambda *_: None) as s:
        assert s.state == "already running" and not s.started
    assert calls == []                                  # not ours: not stopped


def test_a_daemon_started_here_is_stopped_here(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.setattr(mps.shutil, "which", lambda name: "/bin/true")
    calls = []
    monkeypatch.setattr(mps, "stop", lambda: calls.append("stop"))
    with mps.Session("on", 0.5, True, log=lambda *_: None) as s:
        assert s.started and s.state == "started"
    assert calls == ["stop"]


def test_a_session_ended_by_sigterm_stops_its_daemon_with_short_waits(monkeypatch, tmp_path):
    """gpu_pack turns `timeout`'s SIGTERM into SystemExit, and `timeout -k` kills it seconds later: the session's
    stop on that way out waited up to 60 s for a wedged daemon to take 'quit' and 30 more for it to go. Now at
    most 5 s each; the normal way out keeps stop's own waits."""
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.setattr(mps.shutil, "which", lambda name: "/bin/true")
    calls = []
    monkeypatch.setattr(mps, "stop", lambda **waits: calls.append(waits))
    with pytest.raises(SystemExit), mps.Session("on", 0.5, True, log=lambda *_: None) as s:
        assert s.started
        raise SystemExit(143)
    assert len(calls) == 1 and calls[0] and all(v <= 5 for v in calls[0].values()), calls
    with pytest.raises(RuntimeError), mps.Session("on", 0.5, True, log=lambda *_: None):
        raise RuntimeError("a measurement failed")
    assert calls[1] == {}


def test_a_pipe_left_by_a_daemon_that_quit_is_not_a_running_daemon(monkeypatch, tmp_path):
    """A daemon that has quit can leave its control pipe behind; a session that took it for a running daemon
    would start none and pack its trials without MPS. Only a live daemon process counts."""
    (tmp_path / "control").write_text("")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.setattr(mps, "daemons", lambda: [])
    monkeypatch.setattr(mps.shutil, "which", lambda name: "/bin/true")
    monkeypatch.setattr(mps, "stop", lambda: None)
    assert not mps.running()
    with mps.Session("auto", 0.5, True, log=lambda *_: None) as s:
        assert s.started and s.state == "started"


def test_the_daemons_are_read_from_proc(tmp_path):
    """A process whose program is named nvidia-cuda-mps-control is found in /proc, and this test's own is not:
    a reader that found nothing (or read nothing) passed the test before."""
    import os
    import shutil
    import subprocess
    if not os.path.isdir("/proc"):
        assert mps.daemons() is None
        return
    fake = tmp_path / mps.CONTROL
    shutil.copy(shutil.which("sleep"), fake)
    proc = subprocess.Popen([str(fake), "30"])
    try:
        import time
        for _ in range(500):        # until the child's exec shows in /proc (its cmdline is empty a moment)
            pids = mps.daemons()
            if proc.pid in pids:
                break
            time.sleep(0.01)
        assert isinstance(pids, list) and proc.pid in pids and os.getpid() not in pids
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in mps.daemons()


def test_the_daemon_starts_seeing_every_card_whatever_the_driver_sees(monkeypatch, tmp_path):
    """Started with CUDA_VISIBLE_DEVICES=1 the MPS server renumbers that card 0, and the trials Ray gives
    CUDA_VISIBLE_DEVICES=1 found no GPU: they trained on the CPU without a word."""
    seen = tmp_path / "seen"
    exe = tmp_path / "nvidia-cuda-mps-control"
    exe.write_text(f"#!/bin/sh\necho \"${{CUDA_VISIBLE_DEVICES-unset}}\" > {seen}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(mps.shutil, "which", lambda name: str(exe))
    assert mps.start()
    assert seen.read_text().strip() == "unset"
    import os
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"     # this process (and Ray's workers) keep theirs


def test_a_daemon_that_does_not_answer_is_said_not_raised(monkeypatch, tmp_path):
    """servers() and stop() are read beside a measurement (gpu_pack's pairs of paper trials, pack_phase's workers)
    and on the way out of a Session: a wedged daemon's TimeoutExpired propagated from both, and a pair measured
    for minutes on a lent card was thrown away before its row was written. Now each says why in a string."""
    import subprocess

    (tmp_path / "control").write_text("")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.setattr(mps, "daemons", lambda: [4242])                   # a daemon runs, and hangs
    monkeypatch.setattr(mps.shutil, "which", lambda name: "/usr/bin/nvidia-cuda-mps-control")

    def hung(argv, **kw):
        if "-d" in argv:
            return subprocess.CompletedProcess(argv, 0, "", "")
        raise subprocess.TimeoutExpired(argv, kw.get("timeout"))
    monkeypatch.setattr(mps.subprocess, "run", hung)
    said = mps.servers()
    assert said.startswith("error: nvidia-cuda-mps-control did not answer get_server_list in 10 s"), said
    err = mps.stop(wait_s=0)
    assert err.startswith("error: nvidia-cuda-mps-control did not take 'quit' in 60 s"), err
    monkeypatch.setattr(mps, "running", lambda: False)                   # so that the session starts its own
    logged = []
    with mps.Session("on", 0.5, True, log=logged.append) as s:
        assert s.started
        monkeypatch.setattr(mps, "running", lambda: True)
    assert logged[-1].startswith("[cem-bench] CUDA MPS not stopped: error:"), logged    # said, not raised
