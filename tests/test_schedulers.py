"""Scheduler plug-ins (cem_bench/spaces/schedulers/): one file each; a new one is a file plus its test, shown here
by registering a throw-away scheduler that the parser validates, that sets the probe at its epochs and that the
search builds without other edits. No Ray cluster: the Ray Tune scheduler objects are built without ``ray.init``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cem_bench.errors import SpaceError
from cem_bench.spaces import parse_space, schedulers
from cem_bench.spaces.schedulers import Option

SPACE = {"name": "s", "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.1},
                                     {"metric": "attack_ssim", "mode": "min", "ref": 1.0}],
         "sampler": {"name": "random", "seed": 0}, "num_samples": 4, "baseline": False, "confirm": False,
         "fixed": {"train.device": "cpu", "train.epochs": 20}, "params": {"cem.lambd": {"loguniform": [1, 64]}}}


def space(scheduler, **changes) -> dict:
    return {**SPACE, "scheduler": scheduler, **changes}


def errors_of(doc) -> list[str]:
    with pytest.raises(SpaceError) as info:
        parse_space(doc)
    return info.value.errors


def test_the_shipped_schedulers_are_the_package_files():
    assert schedulers.names() == ("fifo", "moasha")
    for name in schedulers.names():
        assert schedulers.get(name).doc, name   # each says what it is
    moasha = schedulers.get("moasha")
    assert moasha.defaults() == {"grace_epochs": 2, "reduction_factor": 3}
    assert all(o.what and o.help for o in moasha.options.values())
    assert not schedulers.get("fifo").stops_trials and schedulers.get("fifo").options == {}


def test_the_registry_imports_neither_ray_nor_the_search():
    """spaces/ may not import search/ (docs/architecture.md §3, rule 14) and imports no Ray: the parser reads a
    scheduler's options without them; the builder is handed Ray's pieces by search.moasha.make_scheduler."""
    code = ("import sys; from cem_bench.spaces import schedulers; schedulers.options(); "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith(('ray.', 'cem_bench.search'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.fixture
def median():
    """A throw-away plug-in: Ray's median stopping rule on the first objective, with one option, judging every
    epoch from its grace period on."""
    @schedulers.register(
        "median_test",
        {"grace_epochs": Option("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                                3, "the first epoch it may stop a trial at")},
        rungs=lambda opts, epochs: list(range(opts["grace_epochs"], epochs)),
        check=lambda opts, epochs: [] if opts["grace_epochs"] < epochs else [("grace_epochs", "too late")],
        describe=lambda opts: "below the median stops", doc="test")
    def build(ray_side, spec, opts):
        metric, mode, _ = spec.rung_objectives[0]
        return ray_side.tune_schedulers.MedianStoppingRule(time_attr=ray_side.time_attr, metric=metric, mode=mode,
                                                           grace_period=opts["grace_epochs"])
    yield
    schedulers.unregister("median_test")


def test_a_new_scheduler_is_one_registration(median):
    spec = parse_space(space({"name": "median_test"}, fixed={"train.device": "cpu", "train.epochs": 6}))
    assert spec.scheduler == {"name": "median_test", "grace_epochs": 3}      # the default filled in
    assert spec.rungs == [3, 4, 5] and spec.fixed["attack.probe_epochs"] == [3, 4, 5]
    assert parse_space(space("median_test")).scheduler["grace_epochs"] == 3  # a bare name, as for samplers
    # its options are checked, and a wrong one names the valid ones
    assert errors_of(space({"name": "median_test", "grace_epochs": 0})) == [
        "scheduler.grace_epochs: 0 must be an integer >= 1 (the first epoch it may stop a trial at)"]
    assert errors_of(space({"name": "median_test", "grace": 2})) == [
        "scheduler.grace: unknown option of scheduler 'median_test'; known: grace_epochs"]
    assert errors_of(space({"name": "median_test", "grace_epochs": 20})) == ["scheduler.grace_epochs: too late"]
    # the refusals of every scheduler that stops trials apply to it too
    assert any("replicates: 2 with a scheduler" in e for e in errors_of(space("median_test", replicates=2)))
    # the list of known schedulers includes it
    assert errors_of(space({"name": "hyperband"})) == [
        "scheduler.name: unknown scheduler 'hyperband'; known: fifo, median_test, moasha"]
    # the search builds it and states it in its plan
    from ray.tune.schedulers import MedianStoppingRule

    from cem_bench.search.moasha import make_scheduler
    from cem_bench.search.run import plan
    built = make_scheduler(spec, state_key="exp")
    assert isinstance(built, MedianStoppingRule)
    assert "a search trial may stop at epochs 3, 4, 5 (median_test, below the median stops)" in plan(spec)


def test_moasha_builds_the_same_scheduler_as_before():
    """moasha as a plug-in: the same MOASHA(RungRanker(train.epochs, grace, η, rung objectives)) that run.py built
    by hand, its rungs the probe's epochs, its words in the plan."""
    from cem_bench.search.moasha import MOASHA, make_scheduler
    from cem_bench.search.run import plan
    from cem_bench.search.rungs import RungRanker
    spec = parse_space(space({"name": "moasha", "grace_epochs": 2, "reduction_factor": 3}))
    built = make_scheduler(spec, state_key="exp")
    before = MOASHA(RungRanker(spec.fixed["train.epochs"], spec.scheduler["grace_epochs"],
                               spec.scheduler["reduction_factor"], spec.rung_objectives),
                    time_attr="epoch", state_key="exp")
    assert type(built) is MOASHA
    assert (built.time_attr, built.state_key, built.exempt_roles) == (before.time_attr, before.state_key,
                                                                        before.exempt_roles)
    r, b = built.ranker, before.ranker
    assert (r.max_epochs, r.grace_epochs, r.reduction_factor, r.rungs, r.objectives) == \
        (b.max_epochs, b.grace_epochs, b.reduction_factor, b.rungs, b.objectives)
    assert r.rungs == [2, 6, 18] and r.reduction_factor == 3 and r.grace_epochs == 2
    assert r.objectives == [("test_acc", "max", 0.1), ("probe_ssim", "min", 1.0)]
    assert spec.fixed["attack.probe_epochs"] == [2, 6, 18]
    assert "a search trial may stop at epochs 2, 6, 18 (moasha, keeps 1/3 of each rung)" in plan(spec)


def test_fifo_is_no_scheduler_and_takes_no_options():
    from cem_bench.search.moasha import make_scheduler
    for value in ("fifo", {"name": "fifo"}, None):
        spec = parse_space(space(value))
        assert spec.scheduler is None and make_scheduler(spec) is None and spec.rungs == []
    assert errors_of(space({"name": "fifo", "grace_epochs": 2})) == [
        "scheduler.grace_epochs: unknown option of scheduler 'fifo'; known: none (it takes no options)"]


def test_moasha_option_errors_name_the_valid_ones():
    assert errors_of(space({"name": "moasha", "grace": 2})) == [
        "scheduler.grace: unknown option of scheduler 'moasha'; known: grace_epochs, reduction_factor"]
    assert errors_of(space({"name": "moasha", "reduction_factor": True})) == [
        "scheduler.reduction_factor: True must be a finite number > 1 (a rung keeps 1/η of its trials)"]
    errs = errors_of(space(["moasha"]))
    assert errs == ["scheduler: ['moasha'] must be a mapping such as {name: fifo} or {name: moasha, grace_epochs: 2, "
                    "reduction_factor: 3}, or a bare name (known: fifo, moasha)"]


def test_a_plugin_whose_default_fails_its_own_check_is_refused():
    with pytest.raises(ValueError, match="the default of 'g', 0, fails its own check"):
        schedulers.register("bad_test", {"g": Option("an integer >= 1", lambda v: v >= 1, 0)}, rungs=None)
    assert schedulers.get("bad_test") is None


def test_a_searched_seed_is_refused_with_a_stopping_scheduler_and_the_probe_kept_on_resume():
    """A searched seed is a configuration's replicates (its id leaves the seed out): the scheduler stopped them one
    by one and the configuration's mean was over the seeds it kept, as replicates: 2 would (refused since). And a
    --resume that changes the probe's strength ranked the later rungs against records of another probe."""
    import json

    from cem_bench.search import run
    from cem_bench.storage import json_bytes
    doc = space("moasha", params={**SPACE["params"], "seed": {"choice": [0, 1, 2]}})
    assert any(e.startswith("scheduler: seed is searched: its values are replicates") for e in errors_of(doc))
    parse_space(space("fifo", params={**SPACE["params"], "seed": {"choice": [0, 1, 2]}}))   # nothing stops them
    for sched, refused_words in (("moasha", "the scheduler's rungs rank on the probe"), ("fifo", None)):
        spec = parse_space(space(sched))
        saved = json.loads(json_bytes(spec.to_dict()))
        changed = parse_space(space(sched, fixed={**SPACE["fixed"], "attack.probe_iterations": 300}))
        refused, allowed = run.space_changes(changed, saved)
        if refused_words:
            assert len(refused) == 1 and refused_words in refused[0] and "attack.probe_iterations" in refused[0]
        else:
            assert refused == [] and allowed == ["fixed.attack.probe_iterations (30 -> 300)"]
    # a scheduler ranking on accuracy alone never reads the probe: the change is allowed
    accuracy = [{"metric": "test_acc", "mode": "max", "ref": 0.1}, {"metric": "test_acc_clean", "mode": "max", "ref": 0.1}]
    saved = json.loads(json_bytes(parse_space(space("moasha", objectives=accuracy)).to_dict()))
    changed = parse_space(space("moasha", objectives=accuracy,
                                fixed={**SPACE["fixed"], "attack.probe_iterations": 300}))
    assert run.space_changes(changed, saved)[0] == []
