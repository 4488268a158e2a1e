"""The multi-objective ASHA scheduler's decisions on hand-made rung records (no training, no Ray start)."""

from __future__ import annotations

import contextlib
import json
import math
import pickle
import random
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cem_bench.frontier import pareto_ranks
from cem_bench.search import driver
from cem_bench.search.moasha import MOASHA
from cem_bench.search.rungs import RungRanker, rung_epochs

OBJ = [("acc", "max", None), ("ssim", "min", None)]
OBJ_REF = [("acc", "max", 0.0), ("ssim", "min", 1.0)]


def ranker(eta: float = 2, objectives=OBJ, max_epochs: int = 16, grace: int = 1) -> RungRanker:
    return RungRanker(max_epochs, grace, eta, objectives)


def v(acc, ssim) -> dict:
    return {"acc": acc, "ssim": ssim}


@dataclass
class FakeTrial:
    trial_id: str
    config: dict = field(default_factory=dict)


# -- rungs -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("grace,eta,max_t", [(1, 2, 10), (1, 2, 8), (15, 2, 240), (1, 4, 100), (3, 3, 81),
                                             (1, 10, 1000), (5, 3, 200), (2, 1.5, 20), (1, 2, 1)])
def test_rung_epochs_match_rays_bracket(grace, eta, max_t):
    from ray.tune.schedulers.async_hyperband import _Bracket
    ray_rungs = sorted({math.ceil(m) for m, _ in _Bracket(grace, max_t, eta, 0)._rungs if m < max_t})
    assert rung_epochs(max_t, grace, eta) == ray_rungs


def _brute_rungs(max_t: int, grace: int, eta: float) -> list[int]:
    """rung_epochs as it was written before 2026-12-07: one k at a time."""
    out, k = [], 0
    while (epoch := math.ceil(grace * eta ** k)) < max_t:
        if not out or epoch > out[-1]:
            out.append(epoch)
        k += 1
    return out


@settings(max_examples=300, deadline=None)
@given(grace=st.integers(1, 40), eta=st.floats(1.01, 50), max_t=st.integers(1, 400))
def test_rung_epochs_jump_to_the_same_rungs_as_one_k_at_a_time(grace, eta, max_t):
    if grace <= max_t:
        assert rung_epochs(max_t, grace, eta) == _brute_rungs(max_t, grace, eta)


@pytest.mark.parametrize("grace,eta,max_t,want", [
    (1, 1 + 1e-10, 100, list(range(1, 100))),    # one k at a time: 2e10 turns, and `search --dry-run` hung
    (3, 1 + 1e-12, 40, list(range(3, 40))),
    (2, 1e308, 300, [2]),                          # grace * eta is inf: math.ceil raised OverflowError
    (1, 1.7e308, 10, [1]),
])
def test_rung_epochs_of_an_extreme_reduction_factor_come_at_once(grace, eta, max_t, want):
    assert rung_epochs(max_t, grace, eta) == want


def test_results_off_the_rungs_record_nothing():
    r = ranker()                                        # rungs 1, 2, 4, 8 below 16
    assert r.rungs == [1, 2, 4, 8]
    r2 = RungRanker(16, 2, 2, OBJ)
    assert r2.on_result("a", 1, v(0.1, 0.9)).rung is None            # before the first rung
    for epoch in (16, 17):
        d = r.on_result("a", epoch, v(0.1, 0.9))                   # at / after max_epochs
        assert (d.action, d.rung) == ("continue", None)
    assert r.counter == 0
    r.on_result("a", 1, v(0.9, 0.1))
    r.on_result("b", 1, v(0.1, 0.9))
    d = r.on_result("b", 1, v(0.1, 0.9))                              # already recorded at rung 1
    assert (d.action, d.rung) == ("continue", None) and r.counter == 2
    d = r.on_result("c", 7, v(0.5, 0.5))                              # jumped over 1 and 2: judged at 4 only
    assert d.rung == 4 and r.recorded(1).keys() == {"a", "b"} and r.recorded(4).keys() == {"c"}


# -- the rule ----------------------------------------------------------------------------------------------

def test_dominated_trials_stop():
    r = ranker(eta=2)
    assert r.on_result("good", 1, v(0.8, 0.2)).action == "continue"
    d = r.on_result("bad", 1, v(0.7, 0.3))                            # dominated by "good"
    assert (d.action, d.rank, d.position, d.keep, d.recorded) == ("stop", 1, 1, 1, 2)
    assert d.reason == "rank 1 of 2 fronts at epoch 1: outside the top 1 of 2"
    r.on_result("ok", 1, v(0.9, 0.25))                                # non-dominated: continues (keep 2)
    d = r.on_result("worse", 1, v(0.6, 0.4))                          # dominated by all three
    assert (d.action, d.rank, d.keep) == ("stop", 2, 2)


@pytest.mark.parametrize("objectives", [OBJ, OBJ_REF])
def test_a_trial_dominating_every_recorded_one_is_never_stopped(objectives):
    rng = random.Random(0)
    others = [v(rng.uniform(0.1, 0.8), rng.uniform(0.2, 0.9)) for _ in range(7)]
    others += [v(0.8, 0.2), v(0.8, 0.2), v(math.nan, 0.1), v(0.85, math.nan)]   # ties, best-in-one, NaN
    best = v(0.9, 0.1)
    for eta in (2, 3, 4):
        for _ in range(200):
            order = rng.sample(others, len(others))
            r = ranker(eta=eta, objectives=objectives)
            for i, vals in enumerate(order):
                r.on_result(f"t{i}", 1, vals)
            d = r.on_result("best", 1, best)
            assert (d.action, d.rank, d.position) == ("continue", 0, 0), (eta, order, d)


def test_non_dominated_trials_stop_only_when_the_front_exceeds_keep():
    rng = np.random.default_rng(1)
    for trial in range(60):
        eta = float(rng.choice([2, 3, 4]))
        r = ranker(eta=eta)
        for i in range(int(rng.integers(2, 14))):
            d = r.on_result(f"t{i}", 1, v(*rng.uniform(0, 1, 2).round(1)))
            pts = np.array(list(r.recorded(1).values()))
            n_front = int(np.sum(pareto_ranks(pts, ["max", "min"]) == 0))
            assert d.keep == math.ceil(d.recorded / eta)
            if d.rank == 0 and n_front <= d.keep:
                assert d.action == "continue", (trial, d)
            if d.rank > 0 and n_front >= d.keep:
                assert d.action == "stop", (trial, d)


@pytest.mark.parametrize("objectives", [OBJ, OBJ_REF])
def test_inside_a_front_an_extreme_point_beats_a_crowded_middle_point(objectives):
    # all five on one front (accuracy and SSIM rise together); keep = ceil(5 / 2) = 3
    r = ranker(eta=2, objectives=objectives)
    for tid, vals in [("A", v(0.5, 0.5)), ("B", v(0.51, 0.51)), ("C", v(0.9, 0.9))]:
        r.on_result(tid, 1, vals)
    d = r.on_result("D", 1, v(0.1, 0.1))              # extreme, last to arrive: placed before A and B
    assert (d.action, d.rank) == ("continue", 0) and d.position <= 1
    d = r.on_result("E", 1, v(0.505, 0.505))          # between A and B: the smallest share of the front
    assert (d.action, d.rank, d.position, d.keep) == ("stop", 0, 4, 3)
    assert "hypervolume contribution" in d.reason


def test_equal_contributions_fall_back_to_arrival_order():
    r = RungRanker(16, 1, 2, [("acc", "max", None)])
    assert r.on_result("first", 1, {"acc": 0.5}).action == "continue"
    d = r.on_result("second", 1, {"acc": 0.5})        # identical: same rank, same (zero) contribution
    assert (d.action, d.rank, d.position) == ("stop", 0, 1)


def test_keep_is_ceil_n_over_eta_and_the_first_trial_continues():
    for eta in (2, 3, 4, 1.5):
        r = ranker(eta=eta)
        for rung in r.rungs:
            d = r.on_result(f"first@{rung}", rung, v(0.0, 1.0))
            assert (d.action, d.keep, d.recorded) == ("continue", 1, 1)
        for n in range(2, 12):                          # each better than all before: always position 0
            d = r.on_result(f"t{n}", 1, v(n / 20, 1 - n / 20))
            assert (d.action, d.position, d.recorded, d.keep) == ("continue", 0, n, math.ceil(n / eta))
        for n in range(12, 20):                          # each worse than all before: last place
            d = r.on_result(f"t{n}", 1, v(0.0, 1.0 + n))
            assert d.keep == math.ceil(n / eta) and d.position == n - 1 and d.action == "stop"


def test_nan_and_missing_count_as_the_worst_value():
    r = ranker(eta=2)
    r.on_result("a", 1, v(0.1, 0.5))
    d = r.on_result("nan_acc", 1, v(math.nan, 0.5))      # acc -inf: dominated by "a"
    assert (d.action, d.rank) == ("stop", 1)
    d = r.on_result("no_ssim", 1, {"acc": 0.1})          # ssim missing: +inf, dominated by "a"
    assert (d.action, d.rank) == ("stop", 1)
    r2 = ranker(eta=2)
    r2.on_result("nan", 1, v(0.9, math.nan))
    d = r2.on_result("worse_acc", 1, v(0.8, 0.99))        # any finite SSIM beats NaN: non-dominated
    assert (d.action, d.rank) == ("continue", 0)


# -- state -------------------------------------------------------------------------------------------------

def _stream(seed: int, n: int = 40):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        for epoch in (1, 2, 4, 8):
            out.append((f"t{i % 12}_{i // 12}", epoch, v(round(rng.random(), 2), round(rng.random(), 2))))
    rng.shuffle(out)
    return out


def test_state_dict_round_trips_through_json():
    stream = _stream(3)
    a = ranker(eta=3)
    for t, e, vals in stream[:70]:
        a.on_result(t, e, vals)
    b = ranker(eta=3)
    b.load_state_dict(json.loads(json.dumps(a.state_dict(), allow_nan=False)))
    assert b.state_dict() == a.state_dict()
    assert [a.on_result(*x) for x in stream[70:]] == [b.on_result(*x) for x in stream[70:]]
    with pytest.raises(ValueError, match="reduction_factor"):
        ranker(eta=2).load_state_dict(a.state_dict())


def _feed(m: MOASHA, items):
    """Each result after its trial was added, as Tune does (adding is idempotent here, as in MOASHA)."""
    out = []
    for t, e, vals in items:
        m.on_trial_add(None, FakeTrial(t))
        out.append(m.on_trial_result(None, FakeTrial(t), {"epoch": e, **vals}))
    return out


def _restore_trials(m: MOASHA, items):
    """What a restoring Tune driver does before the first result: add every trial its experiment lists."""
    for t in dict.fromkeys(t for t, _, _ in items):
        m.on_trial_add(None, FakeTrial(t))


def test_exempt_roles_are_never_stopped_nor_recorded():
    m = MOASHA(ranker(eta=4))
    _feed(m, [("good", 1, v(0.9, 0.1))])
    for role in ("baseline", "confirm"):
        out = m.on_trial_result(None, FakeTrial(role, {"role": role}), {"epoch": 1, **v(0.0, 1.0)})
        assert out == MOASHA.CONTINUE
    assert m.ranker.counter == 1 and m.stopped == {}
    assert m.on_trial_result(None, FakeTrial("x", {"role": "search"}), {"epoch": 1, **v(0.0, 1.0)}) == MOASHA.STOP
    assert m.stopped == {"x": 1}
    assert m.decisions == [{"trial_id": "x", "epoch": 1, "rung": 1, "rank": 1, "position": 1, "keep": 1,
                            "recorded": 2, "reason": "rank 1 of 2 fronts at epoch 1: outside the top 1 of 2"}]


@pytest.fixture
def state_file():
    """``state_file(path)``: from now to the end of the test, ``path`` is the scheduler state file of the driver
    of experiment "exp" (what run_search registers, search/driver.py); a later call registers over it."""
    with contextlib.ExitStack() as stack:
        yield lambda path: stack.enter_context(driver.active("exp", driver.DriverPaths(scheduler_state=str(path))))
    assert driver.lookup("exp") is None


def test_a_search_resumed_under_another_name_keeps_its_scheduler_state(tmp_path):
    """The pickled scheduler carries the name the search first ran under; resumed under another --name (its folder
    renamed), the driver registers the new one: the scheduler found no state file, forgot its rung records and
    wrote its later stops nowhere. It now uses the one search's, and decides as one never stopped."""
    path = tmp_path / "moasha_state.json"
    stream = _stream(5)
    first = MOASHA(ranker(eta=2), state_key="exp_a")
    at_start = pickle.dumps(first)
    with driver.active("exp_a", driver.DriverPaths(scheduler_state=str(path))):
        _feed(first, stream[:80])
    with driver.active("exp_b", driver.DriverPaths(scheduler_state=str(path))):
        resumed = pickle.loads(at_start)
        assert resumed.state_path == str(path)
        _restore_trials(resumed, stream[:80])
        assert resumed.decisions == first.decisions and first.decisions
        assert _feed(resumed, stream[80:]) == _feed(first, stream[80:])
        assert resumed.stopped == first.stopped


def test_state_survives_a_killed_driver_through_the_state_file(tmp_path, state_file):
    state_file(tmp_path / "sub" / "moasha_state.json")
    stream = _stream(5)
    first = MOASHA(ranker(eta=2), state_key="exp")
    at_start = pickle.dumps(first)                       # what Ray restores: the object pickled at the start
    before = _feed(first, stream[:40])
    midway = pickle.dumps(first)                         # a copy pickled after some records
    before += _feed(first, stream[40:80])
    assert MOASHA.STOP in before and (tmp_path / "sub" / "moasha_state.json").exists()
    resumed = pickle.loads(at_start)
    fresh = MOASHA(ranker(eta=2), state_key="exp")
    late = pickle.loads(midway)
    assert resumed.decisions == first.decisions == fresh.decisions == late.decisions
    for copy in (resumed, fresh, late):
        _restore_trials(copy, stream[:80])
    after = _feed(first, stream[80:])
    assert _feed(resumed, stream[80:]) == after == _feed(fresh, stream[80:]) == _feed(late, stream[80:])
    assert resumed.decisions == first.decisions and resumed.stopped == first.stopped
    unkeyed = MOASHA(ranker(eta=2))                      # no state key: starts empty
    assert unkeyed.decisions == [] and unkeyed.ranker.counter == 0


@pytest.mark.parametrize("content", [b"{}", b"null", b"[1, 2]", b'{"ranker": {"counter": 99, "rungs": 3}}',
                                     b'{"ranker": {"counter": "x"}}', b"{not json"])
def test_a_damaged_state_file_leaves_the_scheduler_its_own_state(tmp_path, state_file, capsys, content):
    """A state file of valid JSON but another shape raised KeyError/TypeError in the resumed driver (the audit of
    2026-11-28; only invalid JSON was caught): every damage is said once, and the scheduler goes on with the state
    it was restored with, deciding as an undamaged one does."""
    state_file(tmp_path / "state.jsonl")
    stream = _stream(5)
    first = MOASHA(ranker(eta=2), state_key="exp")
    at_start = pickle.dumps(first)
    _feed(first, stream[:40])
    (tmp_path / "state.jsonl").write_bytes(content)
    resumed = pickle.loads(at_start)
    reference = pickle.loads(at_start)
    state_file(tmp_path / "none.jsonl")      # the reference reads no file at all
    _restore_trials(reference, stream[:40])
    state_file(tmp_path / "state.jsonl")
    _restore_trials(resumed, stream[:40])
    assert "the scheduler's saved state" in capsys.readouterr().err
    assert _feed(resumed, stream[40:]) == _feed(reference, stream[40:])


def test_save_and_restore_by_pickle(tmp_path):
    stream = _stream(7)
    a = MOASHA(ranker(eta=2))
    _feed(a, stream[:60])
    a.save(str(tmp_path / "sched.pkl"))
    b = MOASHA(ranker(eta=2))
    b.restore(str(tmp_path / "sched.pkl"))
    assert b.decisions == a.decisions and b.ranker.state_dict() == a.ranker.state_dict()
    _restore_trials(b, stream[:60])
    assert _feed(b, stream[60:]) == _feed(a, stream[60:])
    assert "MOASHA" in b.debug_string()


def test_a_stopped_trial_that_reports_again_is_stopped_again():
    """A stop is final: a trial whose worker resumes it from a checkpoint after the stop (a driver killed between
    the decision and Ray's stop) is stopped again at its next result, whatever its values."""
    from ray.tune.schedulers import TrialScheduler

    from cem_bench.search.moasha import MOASHA
    from cem_bench.search.rungs import RungRanker

    class T:
        def __init__(self, tid):
            self.trial_id, self.config = tid, {}

    s = MOASHA(RungRanker(8, 2, 2, [("test_acc", "max", None), ("probe_ssim", "min", None)]))
    assert s.on_trial_result(None, T("a"), {"epoch": 2, "test_acc": 0.9, "probe_ssim": 0.1}) == TrialScheduler.CONTINUE
    assert s.on_trial_result(None, T("b"), {"epoch": 2, "test_acc": 0.1, "probe_ssim": 0.9}) == TrialScheduler.STOP
    assert s.on_trial_result(None, T("b"), {"epoch": 3, "test_acc": 1.0, "probe_ssim": 0.0}) == TrialScheduler.STOP
    assert s.stopped == {"b": 2}


def test_a_killed_drivers_trial_that_the_restored_experiment_lacks_is_forgotten(tmp_path, state_file):
    """A driver killed between starting a trial and its next experiment snapshot leaves records of a trial the
    restored experiment never lists (the sample runs again under a new id). The resumed scheduler forgets that
    ghost at its first result, so it holds no place at a rung: the new trials are judged as if it never ran."""
    state_file(tmp_path / "state.jsonl")
    first = MOASHA(ranker(eta=4), state_key="exp")
    at_start = pickle.dumps(first)
    _feed(first, [("kept", 1, v(0.5, 0.5)), ("ghost", 1, v(0.9, 0.1)), ("gone", 1, v(0.1, 0.9))])
    assert first.stopped.keys() == {"gone"}
    (tmp_path / "copy.jsonl").write_bytes((tmp_path / "state.jsonl").read_bytes())
    new = [("new", 1, v(0.6, 0.4))]          # dominated by the ghost only
    resumed = pickle.loads(at_start)
    _restore_trials(resumed, [("kept", 1, None), ("gone", 1, None)])
    assert _feed(resumed, new) == [MOASHA.CONTINUE]
    assert "ghost" not in resumed.ranker.trial_ids() and resumed.stopped == {"gone": 1}
    assert json.loads((tmp_path / "state.jsonl").read_text())["ranker"]["rungs"]["1"].keys() == {"kept", "gone", "new"}
    # a driver whose experiment does list the ghost keeps it, and then "new" is outside the top 1 of 4
    state_file(tmp_path / "copy.jsonl")
    listed = pickle.loads(at_start)
    _restore_trials(listed, [("kept", 1, None), ("ghost", 1, None), ("gone", 1, None)])
    assert _feed(listed, new) == [MOASHA.STOP]


# -- progress: a search always has a trial that runs to the end ------------------------------------------

def test_a_rung_whose_other_trials_were_all_stopped_lets_the_next_trial_continue(tmp_path, state_file):
    """The case a killed driver can leave: the trial that continued at a rung ("lead") was started after the
    last experiment snapshot, so the resumed scheduler forgets it, while the stop it caused ("kept") stays
    final. Judged by position alone, every later trial worse than "kept" would be stopped at rung 1 and the
    search would end with no trial run to the end, nothing to confirm. A trial is stopped only when some other
    trial recorded at its rung has not been stopped, so the next one continues, and the rule is ASHA's again."""
    state_file(tmp_path / "state.jsonl")
    first = MOASHA(ranker(eta=2, max_epochs=4), state_key="exp")      # rungs 1, 2
    at_start = pickle.dumps(first)
    assert _feed(first, [("lead", 1, v(0.9, 0.1)), ("kept", 1, v(0.5, 0.5))]) == [MOASHA.CONTINUE, MOASHA.STOP]
    resumed = pickle.loads(at_start)
    _restore_trials(resumed, [("kept", 1, None)])
    assert _feed(resumed, [("next", 1, v(0.4, 0.6))]) == [MOASHA.CONTINUE]
    assert resumed.stopped == {"kept": 1}
    # the same on the rule alone, with its reason; and a later, worse trial is judged by position again
    r = ranker(eta=2, max_epochs=4)
    r.on_result("lead", 1, v(0.9, 0.1))
    assert r.on_result("kept", 1, v(0.5, 0.5)).action == "stop"
    r.forget({"lead"})
    d = r.on_result("next", 1, v(0.4, 0.6))
    assert (d.action, d.position, d.keep) == ("continue", 1, 1)
    assert d.reason == ("rank 1 of 2 fronts at epoch 1: outside the top 1 of 2, but continues: every other trial "
                        "recorded at epoch 1 was stopped or failed")
    d = r.on_result("worse", 1, v(0.3, 0.7))
    assert (d.action, d.position, d.keep) == ("stop", 2, 2)
    # the stops survive the state file: a third driver restored from it knows "kept" was stopped
    third = pickle.loads(at_start)
    _restore_trials(third, [("kept", 1, None), ("next", 1, None)])
    assert _feed(third, [("late", 1, v(0.3, 0.7))]) == [MOASHA.STOP]   # "next" is still going
    # a state file written before the ranker kept its stops: the scheduler's decisions say which were stopped
    saved = json.loads((tmp_path / "state.jsonl").read_text())
    assert saved["ranker"].pop("stopped") == {"kept": 1, "late": 1}
    (tmp_path / "old.jsonl").write_text(json.dumps(saved) + "\n")
    state_file(tmp_path / "old.jsonl")
    old = pickle.loads(at_start)
    _restore_trials(old, [("kept", 1, None), ("next", 1, None), ("late", 1, None)])
    assert old.ranker.state_dict()["stopped"] == {"kept": 1, "late": 1}    # loaded on the first trial added


def test_a_trial_that_failed_after_continuing_does_not_hold_the_rung_for_ever(tmp_path, state_file):
    """A trial that continued at a rung and then failed (the trainable's status "error", or a Ray error with no
    retry left) keeps its record and place, but will never finish: when every other trial at the rung is
    stopped or failed, the next one continues. A retried trial (Ray adds it again) or one that reports again
    is running, and counts again. The marks survive the state file."""
    state_file(tmp_path / "state.jsonl")
    m = MOASHA(ranker(eta=2, max_epochs=4), state_key="exp")
    at_start = pickle.dumps(m)
    assert _feed(m, [("lead", 1, v(0.9, 0.1)), ("kept", 1, v(0.5, 0.5))]) == [MOASHA.CONTINUE, MOASHA.STOP]
    assert _feed(m, [("x", 1, v(0.4, 0.6))]) == [MOASHA.STOP]           # "lead" is running: by position
    m.on_trial_complete(None, FakeTrial("lead"), {"epoch": 3, "status": "error"})
    assert _feed(m, [("y", 1, v(0.3, 0.7))]) == [MOASHA.CONTINUE]       # "lead" failed, the rest stopped
    assert m.ranker.state_dict()["failed"] == ["lead"]
    resumed = pickle.loads(at_start)                                    # read back from the state file
    _restore_trials(resumed, [("lead", 1, None), ("kept", 1, None), ("x", 1, None), ("y", 1, None)])
    assert resumed.ranker.state_dict()["failed"] == ["lead"]
    # a Ray error, then the retry: Ray calls on_trial_error, then adds the trial again as PENDING
    m.on_trial_error(None, FakeTrial("y"))
    assert m.ranker.state_dict()["failed"] == ["lead", "y"]
    retried = FakeTrial("y")
    retried.status = "PENDING"
    m.on_trial_add(None, retried)
    assert m.ranker.state_dict()["failed"] == ["lead"]
    # one that reports again is running
    m.on_trial_error(None, FakeTrial("y"))
    assert _feed(m, [("y", 2, v(0.3, 0.7))]) == [MOASHA.CONTINUE] and m.ranker.state_dict()["failed"] == ["lead"]


def _search(seed: int, n: int, workers: int, max_epochs: int, eta: float, kills: int, failures: int = 0):
    """A simulated search on the rule alone: ``n`` samples on ``workers`` workers, each result one epoch of a
    running trial picked at random, every epoch reported. ``kills`` times the driver is killed: a random subset
    of the trials started since the last kill never reached a snapshot, so they are forgotten (records and
    stops) and their samples run again under new ids. ``failures`` times a running trial fails (it is not run
    again). Returns the ranker, the finished trials, every decision, the ghosts and whether a trial started
    after the last kill or failure."""
    rng = random.Random(seed)
    r = RungRanker(max_epochs, 1, eta, OBJ)
    queue = list(range(n))
    kill_at = set(rng.sample(range(1, 4 * n * max_epochs), kills)) if kills else set()
    fail_at = set(rng.sample(range(1, 4 * n * max_epochs), failures)) - kill_at if failures else set()
    started_since_event = False
    running: dict[str, int] = {}
    since_kill: list[str] = []
    finished, ghosts, decisions = set(), set(), []
    ids = 0
    step = 0
    while queue or running:
        while queue and len(running) < workers:
            queue.pop(0)
            tid = f"t{ids}"
            ids += 1
            running[tid] = 0
            since_kill.append(tid)
            started_since_event = True
        step += 1
        if step in fail_at and running:
            tid = rng.choice(sorted(running))
            r.mark_failed(tid)
            del running[tid]
            started_since_event = False
            continue
        if step in kill_at and since_kill:
            gone = set(rng.sample(since_kill, rng.randint(1, len(since_kill))))
            r.forget(gone)
            ghosts |= gone
            finished -= gone
            decisions = [d for d in decisions if d.trial_id not in gone]
            for tid in gone:
                running.pop(tid, None)
                queue.append(0)               # the sample runs again under a new id
            since_kill = []
            started_since_event = False
            continue
        tid = rng.choice(sorted(running))
        running[tid] += 1
        d = r.on_result(tid, running[tid], v(round(rng.random(), 1), round(rng.random(), 1)))
        if d.rung is not None:
            decisions.append(d)
        if d.action == "stop" or running[tid] >= max_epochs:
            if d.action != "stop":
                finished.add(tid)
            del running[tid]
    return r, finished, decisions, ghosts, started_since_event


@settings(max_examples=300, deadline=None)
@example(seed=28, n=2, workers=2, max_epochs=4, eta=2, kills=1, failures=0)   # all stopped, by position alone
@example(seed=66, n=2, workers=3, max_epochs=8, eta=2, kills=2, failures=0)
@example(seed=203, n=2, workers=1, max_epochs=9, eta=2, kills=0, failures=2)  # the leader failed: the same
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12), workers=st.integers(1, 4),
       max_epochs=st.integers(2, 9), eta=st.sampled_from([1.5, 2, 3, 4]), kills=st.integers(0, 3),
       failures=st.integers(0, 2))
def test_a_search_always_runs_some_trial_to_the_end(seed, n, workers, max_epochs, eta, kills, failures):
    """Whatever the values, the order of results, the kills and the failures, some trial that the experiment
    still has runs to the end, if a trial started after the last kill or failure (with neither, this is ASHA's
    own guarantee: the first trial at a rung continues)."""
    _, finished, decisions, ghosts, started = _search(seed, n, workers, max_epochs, eta, kills, failures)
    assert not finished & ghosts
    if started:
        assert finished
    if not kills and not failures:
        # every epoch reported, nothing forgotten: the rule is ASHA's by position alone
        assert all((d.action == "continue") == (d.position < d.keep) for d in decisions)
