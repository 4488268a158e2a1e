"""What a search driver hands the objects it runs, without Ray's privates: the CPUs a local session counts
(a container's quota from cgroup files), the registry of the driver's paths (``search/driver.py``) and the
storage guard that a restored experiment's pickled copy reports into. No Ray session is started."""

from __future__ import annotations

import os
import pickle

import pytest

from cem_bench.search import machine


# ------------------------------------------------------------------------------ the CPUs
def _cgroup(root, files: dict[str, str]):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


@pytest.mark.parametrize(("files", "cpus"), [
    ({"cpu.max": "max 100000\n"}, None),                           # cgroup v2, no quota
    ({"cpu.max": "200000 100000\n"}, 2),                           # 2 CPUs
    ({"cpu.max": "150000 100000\n"}, 1),                           # 1.5: rounded down
    ({"cpu.max": "50000 100000\n"}, 1),                            # half a CPU: at least 1
    ({"cpu.max": "400000\n"}, 4),                                  # the period left out: its default, 100000
    ({"cpu.max": "garbage\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),   # cgroup v1, no quota
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),
    ({"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2),
    ({"cpu/cpu.cfs_quota_us": "300000\n"}, None),                  # no period: unreadable, no quota
    ({}, None),                                                    # no cgroup files at all
])
def test_cpu_quota_reads_cgroup_v2_and_v1(tmp_path, files, cpus):
    assert machine.cpu_quota(_cgroup(tmp_path, files)) == cpus


def test_cgroup_v2_wins_over_v1(tmp_path):
    root = _cgroup(tmp_path, {"cpu.max": "100000 100000", "cpu/cpu.cfs_quota_us": "800000",
                              "cpu/cpu.cfs_period_us": "100000"})
    assert machine.cpu_quota(root) == 1


def test_detected_cpus_are_the_usable_cores_capped_by_the_quota(tmp_path):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert machine.detect_cpus(_cgroup(tmp_path / "none", {"cpu.max": "max 100000"})) == cores
    assert machine.detect_cpus(_cgroup(tmp_path / "one", {"cpu.max": "100000 100000"})) == 1
    assert machine.detect_cpus(_cgroup(tmp_path / "many", {"cpu.max": f"{(cores + 8) * 100000} 100000"})) == cores


# ------------------------------------------------------------------------------ the registry
def test_active_registers_for_the_block_and_puts_back_what_was_there():
    from cem_bench.search import driver
    outer, inner = driver.DriverPaths(snapshot="a"), driver.DriverPaths(snapshot="b")
    assert driver.lookup("exp") is None and driver.lookup(None) is None
    with driver.active("exp", outer):
        # a name not registered is the one search running (its pickled objects carry the name it first ran
        # under: a search resumed under another --name lost its scheduler state, journal and guard)
        assert driver.lookup("exp") is outer and driver.sole() is outer and driver.lookup("other") is outer
        with driver.active("exp", inner):
            assert driver.lookup("exp") is inner
        assert driver.lookup("exp") is outer
        with driver.active("other", inner):
            assert driver.sole() is None                   # two searches: no single one
            assert driver.lookup("third") is None and driver.lookup("other") is inner
    assert driver.lookup("exp") is None and driver.sole() is None
    with pytest.raises(RuntimeError), driver.active("exp", outer):
        raise RuntimeError("a failed search")
    assert driver.lookup("exp") is None                    # removed on the way out of a failure too


# ------------------------------------------------------------------------------ the storage guard
class FakeTrial:
    def __init__(self, trial_id: str, error_file: str | None):
        self.trial_id, self.error_file = trial_id, error_file


@pytest.fixture
def sigusr1():
    """SIGUSR1 (what the guard raises to interrupt Tune) counted instead of ending the test process."""
    import signal
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    yield got
    signal.signal(signal.SIGUSR1, old)


def test_a_restored_guard_reports_into_the_live_one(tmp_path, sigusr1):
    """Tune calls the guard its first driver pickled with the experiment; the resumed driver reads its own, live
    guard after fit(): the copy finds it by the experiment's name and its hooks act on it."""
    from cem_bench.search import driver
    from cem_bench.search.diskspace import StorageGuard
    old = StorageGuard(str(tmp_path / "moved-away"), key="exp")
    restored = pickle.loads(pickle.dumps(old))              # what Tuner.restore hands the resumed driver
    live = StorageGuard(str(tmp_path), key="exp")
    (tmp_path / "error.txt").write_text("Traceback ...\nStorageFull: no space left in ...\n")
    (tmp_path / "other.txt").write_text("RuntimeError: not a full disk\n")
    with driver.active("exp", driver.DriverPaths(guard=live)):
        restored.on_trial_error(0, [], FakeTrial("t1", str(tmp_path / "other.txt")))
        assert live.full is None and not restored.stop_all()
        restored.on_trial_recover(0, [], FakeTrial("t2", str(tmp_path / "error.txt")))
        assert live.full == "t2" and live.interrupted and sigusr1 == [1]
        assert restored.full is None and not restored.interrupted   # the copy's own state is untouched
        assert not restored.stop_all()                   # interrupted the way Ctrl+C does, not stopped
        live.interrupted = False                         # (off the main thread there is no signal to raise)
        assert restored.stop_all() and not restored("t3", {})
    assert not restored.stop_all()                       # outside the search: its own state
    assert restored.live() is restored


def test_a_guard_without_a_key_reports_into_the_one_search_of_the_process(tmp_path, sigusr1):
    """A guard pickled by an older cem-bench carries no key: it reports into the one search running here."""
    from cem_bench.search import driver
    from cem_bench.search.diskspace import StorageGuard
    keyless = StorageGuard(str(tmp_path))
    del keyless.key
    keyless = pickle.loads(pickle.dumps(keyless))
    live = StorageGuard(str(tmp_path), key="exp")
    (tmp_path / "error.txt").write_text("OSError: [Errno 28] No space left on device\n")
    with driver.active("exp", driver.DriverPaths(guard=live)):
        keyless.on_trial_error(0, [], FakeTrial("t1", str(tmp_path / "error.txt")))
    assert live.full == "t1" and keyless.full is None and sigusr1 == [1]
