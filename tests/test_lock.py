"""One driver per experiment folder (cem_bench.search.lock): of two searches with the same --storage and
--name exactly one runs, a --resume waits for nobody and is refused while a driver holds the folder, a killed
driver leaves no stale lock, and a search that fails before anything resumable exists leaves no folder."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fake_object_storage

from cem_bench import cli
from cem_bench.errors import SearchError
from cem_bench.search.lock import LOCK_FILE, experiment_lock

HOLD = """
import sys, time
from cem_bench.search.lock import experiment_lock
with experiment_lock(sys.argv[1], resume=sys.argv[2] == "resume"):
    open(sys.argv[3], "w").close()
    time.sleep(120)
"""


def _race(exp: str, barrier, results) -> None:
    barrier.wait()
    try:
        with experiment_lock(exp, resume=False):
            # what Ray writes once it runs: a folder with it is never taken over as abandoned (a racer
            # descheduled past the winner's end must still be refused)
            Path(exp, "tuner.pkl").write_bytes(b"x")
            Path(exp, "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
            results.put("ran")
            time.sleep(0.5)
    except SearchError as e:
        results.put("refused: " + str(e).split(";")[0])


def test_of_racing_new_searches_exactly_one_runs(tmp_path):
    exp = str(tmp_path / "res" / "same")
    ctx = mp.get_context("fork")
    n = 6
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(exp, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    got = sorted(results.get(timeout=5) for _ in range(n))
    assert got.count("ran") == 1, got
    assert all(g == f"refused: the experiment folder {exp} already exists" for g in got if g != "ran"), got


@pytest.fixture
def holder(tmp_path):
    """Start a process that holds a folder's lock; yields a function (exp, resume) -> the Popen."""
    procs = []

    def start(exp: Path, resume: bool = False) -> subprocess.Popen:
        ready = tmp_path / f"ready{len(procs)}"
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(exp), "resume" if resume else "new", str(ready)],
                             start_new_session=True)
        procs.append(p)
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert p.poll() is None and time.monotonic() < deadline, "the holder did not start"
            time.sleep(0.05)
        return p
    yield start
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])   # a dry run asks the lock without taking it: the same refusals
def test_resume_is_refused_while_a_driver_holds_the_folder(tmp_path, holder, capsys, dry):
    storage = tmp_path / "res"
    from test_search import write_space
    space = write_space(tmp_path, "busy")
    exp = storage / "busy"
    p = holder(exp)
    (exp / "tuner.pkl").write_bytes(b"a Ray experiment")   # resumable, as far as the check goes
    before = {q.name: q.read_bytes() for q in exp.iterdir()}
    rc = cli.main(["search", space, "--storage", str(storage), "--resume", *dry])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"another cem-bench search is running on {exp} (pid {p.pid} on " in err and "--resume" in err
    assert {q.name: q.read_bytes() for q in exp.iterdir()} == before
    rc = cli.main(["search", space, "--storage", str(storage), *dry])
    assert rc == 2 and "already exists" in capsys.readouterr().err
    if "ray" in sys.modules:
        import ray
        assert not ray.is_initialized()


def test_a_killed_driver_leaves_no_stale_lock(tmp_path, holder):
    exp = tmp_path / "res" / "killed"
    p = holder(exp)
    with pytest.raises(SearchError, match="another cem-bench search is running"):
        with experiment_lock(str(exp), resume=True):
            pass
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert exp.is_dir() and (exp / LOCK_FILE).is_file()
    with experiment_lock(str(exp), resume=True):   # the kernel dropped the lock with the process
        pass


def test_a_search_that_fails_before_ray_wrote_anything_leaves_no_folder(tmp_path):
    exp = tmp_path / "res" / "failed"
    with pytest.raises(RuntimeError):
        with experiment_lock(str(exp), resume=False):
            (exp / "search_space.json").write_text("{}")
            raise RuntimeError("Ray did not start")
    assert not exp.exists()
    # Ray's tuner.pkl alone restores nothing (--resume needs an experiment state): the folder goes too
    with pytest.raises(KeyboardInterrupt):
        with experiment_lock(str(exp), resume=False):
            (exp / "tuner.pkl").write_bytes(b"x")
            raise KeyboardInterrupt
    assert not exp.exists()
    # once Ray saved an experiment state, a failure keeps the folder: --resume continues it
    with pytest.raises(KeyboardInterrupt):
        with experiment_lock(str(exp), resume=False):
            (exp / "tuner.pkl").write_bytes(b"x")
            (exp / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
            raise KeyboardInterrupt
    assert (exp / "tuner.pkl").is_file()


def test_a_driver_killed_while_starting_leaves_a_folder_the_next_search_takes_over(tmp_path, holder, capsys):
    """A plain kill during Ray's start-up left the folder holding only the lock (and perhaps the space and its
    checksum list): a new search said "already exists" and --resume "no tuner.pkl" (the audit of 2026-11-28).
    The next new search now takes it over; never one a live driver holds, nor one with anything else in it."""
    exp = tmp_path / "res" / "starting"
    p = holder(exp)
    with pytest.raises(SearchError, match="already exists"):     # a live driver still starting: refused
        with experiment_lock(str(exp), resume=False):
            pass
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    (exp / "search_space.json").write_text("{}")
    with experiment_lock(str(exp), resume=False):
        assert "holds only what a search stopped while starting leaves" in capsys.readouterr().out
        (exp / "tuner.pkl").write_bytes(b"x")
    (exp / "tuner.pkl").unlink()
    (exp / "trials.parquet").write_bytes(b"results")         # anything else: kept, refused
    with pytest.raises(SearchError, match="already exists"):
        with experiment_lock(str(exp), resume=False):
            pass
    assert (exp / "trials.parquet").read_bytes() == b"results"
    empty = tmp_path / "res" / "empty"                       # an empty folder: a racer before its lock
    empty.mkdir()
    with pytest.raises(SearchError, match="already exists"):
        with experiment_lock(str(empty), resume=False):
            pass


def test_the_lock_is_reentrant_in_one_process(tmp_path):
    """search_command holds the folder around run_search and the tables; run_search takes it again."""
    exp = str(tmp_path / "res" / "r")
    with experiment_lock(exp, resume=False):
        with experiment_lock(exp, resume=False):
            pass
        assert os.path.isdir(exp)


def test_a_linked_lock_file_is_refused(tmp_path):
    exp = tmp_path / "res" / "l"
    exp.mkdir(parents=True)
    (tmp_path / "target").write_text("not a lock")
    os.symlink(tmp_path / "target", exp / LOCK_FILE)
    with pytest.raises(SearchError, match="symbolic link"):
        with experiment_lock(str(exp), resume=True):
            pass
    assert (tmp_path / "target").read_text() == "not a lock"


@pytest.mark.parametrize("resume", [True, False])
def test_a_readers_probe_does_not_refuse_a_resume_or_a_takeover(tmp_path, monkeypatch, resume):
    """`cem-bench report`/`table` probe a folder's lock with a shared flock for an instant (storage.lock_holder).
    A --resume, and a new search taking over a folder a killed start left, that meet that probe retry and go on;
    before, the takeover tried once and refused with "already exists"."""
    import fcntl
    import types

    from cem_bench.search import lock

    exp = tmp_path / "res" / "probed"
    exp.mkdir(parents=True)
    (exp / LOCK_FILE).write_text('{"pid": 1}')                  # what a killed start leaves: a lock written once
    reader = os.open(exp / LOCK_FILE, os.O_RDONLY)
    fcntl.flock(reader, fcntl.LOCK_SH | fcntl.LOCK_NB)          # the reader's probe, held at the first try
    waits = []

    def sleep(s):   # the probe ends while the driver waits: released at its first wait, deterministically
        waits.append(s)
        fcntl.flock(reader, fcntl.LOCK_UN)

    monkeypatch.setattr(lock, "time", types.SimpleNamespace(sleep=sleep, strftime=time.strftime))
    try:
        with experiment_lock(str(exp), resume=resume):
            (exp / "tuner.pkl").write_bytes(b"x")
    finally:
        os.close(reader)
    assert waits == [lock.LOCK_RETRY_S]
    assert (exp / "tuner.pkl").is_file()


def test_every_file_a_start_leaves_before_ray_is_taken_over(tmp_path, holder, capsys):
    """A driver killed after the searcher made the Optuna journal, or after Ray's storage marker, or inside an
    atomic write, left a folder that neither a new search ("already exists") nor --resume ("no tuner.pkl")
    accepted: only deleting it by hand got out."""
    exp = tmp_path / "res" / "late"
    p = holder(exp)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    for name in ("search_space.json", "optuna_journal.log", "optuna_journal.log.lock", ".validate_storage_marker",
                 ".search_space.json.tmp4242.0123abcd"):
        (exp / name).write_text("x")
    with experiment_lock(str(exp), resume=False):
        assert "this search takes it over" in capsys.readouterr().out
        (exp / "tuner.pkl").write_bytes(b"x")


def test_a_driver_stopped_just_after_tuner_pkl_leaves_a_name_a_new_search_takes_over(tmp_path, holder, capsys):
    """Stopped after Ray wrote tuner.pkl but before its first experiment state: a new search said "already
    exists, continue it with --resume", and --resume "no readable experiment state, start under a new --name",
    for good. --resume now says to drop it, and a new search takes the folder over; not once a trial folder or an
    experiment state is there."""
    exp = tmp_path / "res" / "early"
    p = holder(exp)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    for name in ("search_space.json", "optuna_journal.log", ".validate_storage_marker", "tuner.pkl"):
        (exp / name).write_text("x")
    from cem_bench.search import repair_experiment_state
    with pytest.raises(SearchError, match="holds no experiment state to continue.*drop --resume"):   # --resume
        repair_experiment_state(str(exp))
    from test_search import write_space
    space = write_space(tmp_path, "early")
    (exp / "search_space.json").unlink()   # the stand-in "x" would be refused as damaged first
    for dry in ([], ["--dry-run"]):   # both before Ray starts (the dry run passed it, 2026-12-07 probe)
        assert cli.main(["search", space, "--storage", str(tmp_path / "res"), "--resume", *dry]) == 2
        assert "holds no experiment state to continue" in capsys.readouterr().err
        if "ray" in sys.modules:
            import ray
            assert not ray.is_initialized()
    assert (exp / "tuner.pkl").is_file()
    with experiment_lock(str(exp), resume=False):
        assert "this search takes it over" in capsys.readouterr().out
    (exp / "cem_trial_00000001_1_x").mkdir()                 # a trial folder: kept, refused
    with pytest.raises(SearchError, match="already exists"):
        with experiment_lock(str(exp), resume=False):
            pass
    os.rmdir(exp / "cem_trial_00000001_1_x")
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    with pytest.raises(SearchError, match="already exists"):
        with experiment_lock(str(exp), resume=False):
            pass


def test_only_a_saved_state_is_advised_to_be_resumed(tmp_path):
    from cem_bench.search.resume import has_saved_state
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "tuner.pkl").write_bytes(b"x")
    assert not has_saved_state(str(exp)) and not has_saved_state(str(tmp_path / "none"))
    (exp / "cem_resume_state.bin").write_bytes(b"{}")
    assert has_saved_state(str(exp))


def test_a_named_pipe_at_the_lock_is_refused_by_name_and_never_waited_on(tmp_path):
    """A pipe at the lock's name: --resume ended in a bare "cem-bench: Invalid argument"; the takeover check of
    a new search opened it for reading, which waits for a writer."""
    exp = tmp_path / "res" / "p"
    exp.mkdir(parents=True)
    (exp / "tuner.pkl").write_bytes(b"x")
    os.mkfifo(exp / LOCK_FILE)
    with pytest.raises(SearchError, match=f"{LOCK_FILE} is not a regular file .*remove it"):
        with experiment_lock(str(exp), resume=True):
            pass
    (exp / "tuner.pkl").unlink()
    with pytest.raises(SearchError, match="already exists"):
        with experiment_lock(str(exp), resume=False):
            pass


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """``test://`` URIs as object storage in tmp_path/bucket (pyarrow's local file system behind
    storage.filesystem), the claim's wait shortened."""
    from cem_bench.search import lock
    fake_object_storage(monkeypatch, tmp_path / "bucket")
    monkeypatch.setattr(lock, "CLAIM_WAIT_S", 0.01)
    (tmp_path / "bucket" / "res").mkdir(parents=True)
    return tmp_path / "bucket" / "res"


def test_a_search_stopped_while_it_claims_object_storage_leaves_the_name_free(bucket, monkeypatch):
    """Ctrl-C (or ``ray job stop``'s SIGTERM) in the claim's wait left the claim: the same command then said
    "already exists", and with --resume "no tuner.pkl", for good."""
    from cem_bench.search import lock

    def interrupted(s):
        raise KeyboardInterrupt
    monkeypatch.setattr(lock.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with experiment_lock("test://res/k", resume=False):
            pass
    assert not (bucket / "k" / lock.CLAIM_FILE).exists()
    monkeypatch.undo()


def test_a_stale_claim_on_object_storage_is_taken_over_and_a_young_one_explained(bucket, capsys):
    """A driver killed (kill -9) during its claim or Ray's start left a claim and nothing resumable: refused
    for ten minutes with a message that says so, then taken over; never a folder with an experiment in it."""
    from cem_bench.search import lock
    exp = bucket / "k"
    exp.mkdir()
    (exp / lock.CLAIM_FILE).write_text('{"token": "dead", "host": "h", "pid": 1}')
    (exp / "search_space.json").write_text("{}")
    with pytest.raises(SearchError, match="holds only the claim of a search that started"):
        with experiment_lock("test://res/k", resume=False):
            pass
    old = time.time() - lock.CLAIM_STALE_S - 60
    os.utime(exp / lock.CLAIM_FILE, (old, old))
    with experiment_lock("test://res/k", resume=False):
        assert "this search takes it over" in capsys.readouterr().out
        (exp / "tuner.pkl").write_bytes(b"x")
        (exp / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    with pytest.raises(SearchError, match="already exists"):
        with experiment_lock("test://res/k", resume=False):
            pass
