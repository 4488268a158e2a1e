"""What `cem-bench search` says before it starts, against what it does: how many trials run at once (and why),
how many trials Ray runs in all, and whether the shipped spaces pack the cluster.yaml instances as their
comments say. No Ray session is started here (the trial count drives the real searcher without Ray's runtime).
"""

from __future__ import annotations

import argparse
import glob
import os
import pickle
import re
import zlib

import numpy as np
import pytest
import yaml

from cem_bench import cli
from cem_bench.errors import SearchError
from cem_bench.search import run
from cem_bench.search.run import Concurrency, concurrency, trials_that_fit
from cem_bench.spaces import load_space

ROOT = os.path.join(os.path.dirname(__file__), "..")
SPACES = sorted(glob.glob(os.path.join(ROOT, "search_spaces", "*.yaml")))
CLUSTER = os.path.join(ROOT, "cluster.yaml")

# What Ray detects on the instance types cluster.yaml starts (AWS: vCPUs, GPUs). A type cluster.yaml names
# that is missing here fails test_cluster_instance_types_are_known: add its row.
INSTANCES = {
    "m5.xlarge": {"CPU": 4, "GPU": 0},
    "g5.xlarge": {"CPU": 4, "GPU": 1},   # one A10G (24 GB)
}


# ------------------------------------------------------------------------------------ concurrency
def test_ray_counts_fractions_in_fixed_point():
    assert trials_that_fit(1, 0.125) == 8 and trials_that_fit(1, 0.1) == 10 and trials_that_fit(1, 0.3) == 3
    assert trials_that_fit(0.7, 0.1) == 7 and trials_that_fit(4, 1) == 4 and trials_that_fit(2, 4) == 0
    with pytest.raises(ValueError):
        trials_that_fit(1, 0)


def test_gpus_per_trial_fills_the_gpus():
    """--gpus-per-trial on one machine: GPUs / F at once, above the space's max_concurrent too."""
    one = concurrency(4, {"cpu": 1, "gpu": 0.125}, cli_gpu=True, gpus=1, cpus=16)
    assert one == Concurrency(8, 8, "1 GPU / 0.125 per trial")
    assert concurrency(4, {"cpu": 1, "gpu": 0.25}, cli_gpu=True, gpus=2, cpus=16) == \
        Concurrency(8, 8, "2 GPUs / 0.25 per trial")
    assert concurrency(4, {"cpu": 1, "gpu": 0.3}, cli_gpu=True, gpus=1, cpus=16).limit == 3
    # fewer than the space's max_concurrent fit: what fits, not trials that would only wait
    assert concurrency(8, {"cpu": 1, "gpu": 0.5}, cli_gpu=True, gpus=1, cpus=16).limit == 2
    # a whole GPU a trial (the most a space or --gpus-per-trial can ask): one trial per GPU
    assert concurrency(4, {"cpu": 1, "gpu": 1}, cli_gpu=True, gpus=1, cpus=16).limit == 1
    assert concurrency(4, {"cpu": 1, "gpu": 1}, cli_gpu=True, gpus=2, cpus=16).limit == 2


def test_cpus_can_limit_the_packing_and_the_banner_says_how_to_fill_the_gpu():
    c = concurrency(4, {"cpu": 1, "gpu": 0.125}, cli_gpu=True, gpus=1, cpus=4)
    assert (c.limit, c.at_once) == (4, 4)
    assert c.why == "4 CPUs / 1 per trial; the 1 GPU would take 8 at 0.125: --cpus-per-trial 0.5 fills them"
    hint = concurrency(4, {"cpu": 1, "gpu": 0.15}, cli_gpu=True, gpus=1, cpus=4)   # 6 on the GPU
    assert hint.limit == 4 and "--cpus-per-trial 0.66" in hint.why and trials_that_fit(4, 0.66) == 6


def test_the_space_is_a_default_lowered_to_what_fits():
    paper = concurrency(8, {"cpu": 2, "gpu": 0.5}, gpus=1, cpus=16)
    assert paper == Concurrency(2, 2, "1 GPU / 0.5 per trial; the space allows 8")
    fast = concurrency(4, {"cpu": 1, "gpu": 0.25}, gpus=1, cpus=16)
    assert fast == Concurrency(4, 4, "max_concurrent in the space")
    more = concurrency(4, {"cpu": 1, "gpu": 0.25}, gpus=2, cpus=16)
    assert more.limit == 4 and more.why == ("max_concurrent in the space; 2 GPUs / 0.25 per trial would take 8: "
                                            "--max-concurrent 8")


def test_max_concurrent_on_the_command_line_always_wins():
    assert concurrency(4, {"cpu": 1, "gpu": 0.125}, cli_limit=3, cli_gpu=True, gpus=1, cpus=16) == \
        Concurrency(3, 3, "--max-concurrent")
    over = concurrency(4, {"cpu": 1, "gpu": 0.25}, cli_limit=16, gpus=1, cpus=16)
    assert (over.limit, over.at_once) == (16, 4)
    assert over.why == "--max-concurrent 16, but 1 GPU / 0.25 per trial fits 4"
    assert concurrency(4, {"cpu": 1, "gpu": 0.25}, cli_limit=16) == Concurrency(16, 16, "--max-concurrent")


def test_without_a_gpu_the_cpus_decide():
    """CPU only (as in the tests): the GPU request is dropped (trial_resources), the CPUs hold the trials."""
    c = concurrency(4, {"cpu": 1, "gpu": 0.25}, cli_gpu=True, gpus=0, cpus=2)
    assert c == Concurrency(2, 2, "2 CPUs / 1 per trial; the space allows 4; no GPU: the trials run on CPU")
    assert concurrency(2, {"cpu": 1, "gpu": 0}, gpus=0, cpus=2) == Concurrency(2, 2, "max_concurrent in the space")
    assert concurrency(2, {"cpu": 1, "gpu": 0}, gpus=0, cpus=16).limit == 2
    assert concurrency(2, {"cpu": 0.5, "gpu": 0}, cli_limit=6, gpus=0, cpus=2).at_once == 4


def test_one_trial_that_does_not_fit_the_cpus_is_an_error():
    with pytest.raises(SearchError, match=r"resources.cpu is 4 per trial but Ray has 2 CPUs .* --cpus-per-trial 2"):
        concurrency(2, {"cpu": 4, "gpu": 0}, gpus=0, cpus=2)


def test_a_cluster_keeps_the_space_limit_and_says_why():
    """--address: the autoscaler adds GPU nodes while trials wait, so no machine count limits the search."""
    assert concurrency(8, {"cpu": 2, "gpu": 0.5}) == Concurrency(8, 8, "max_concurrent in the space")
    c = concurrency(8, {"cpu": 1, "gpu": 0.25}, cli_gpu=True)
    assert c.limit == 8 and "--max-concurrent" in c.why


# ---------------------------------------------------------------------------------------- the CLI
def search_args(space: str, *extra: str) -> argparse.Namespace:
    return cli.make_parser().parse_args(["search", space, "--mps", "off", *extra])


class Started(Exception):
    pass


REAL_RUN_SEARCH = run.run_search   # before any fixture replaces it


@pytest.fixture
def fake_machine(monkeypatch, tmp_path):
    """One GPU and 8 CPUs, and a run_search that records the spec it was given instead of starting Ray
    (in a folder of its own: the default --storage ./results may hold a user's experiments)."""
    got = {}
    monkeypatch.chdir(tmp_path)

    def fake_run_search(spec, **kw):
        got["spec"] = spec
        raise Started

    monkeypatch.setattr(run, "_detect_gpus", lambda: 1)
    monkeypatch.setattr(run, "_detect_cpus", lambda: 8)
    monkeypatch.setattr(run, "run_search", fake_run_search)
    # the machine has its data sets (the check itself: test_a_missing_data_set_stops_a_local_search_before_ray)
    monkeypatch.setattr(run, "check_data", lambda spec: got.setdefault("data_checked", spec.name))
    return got


def first_line(capsys) -> str:
    return capsys.readouterr().out.splitlines()[0]


def test_banner_on_one_gpu(fake_machine, capsys):
    fast = os.path.join(ROOT, "search_spaces", "cifar10_fast.yaml")
    with pytest.raises(Started):
        run.search_command(search_args(fast, "--gpus-per-trial", "0.125"))
    line = first_line(capsys)
    assert line.startswith("cem-bench search: cifar10_fast: 72 trials at most: ")
    assert ", 8 at a time (1 GPU / 0.125 per trial), objectives " in line, line
    assert fake_machine["spec"].max_concurrent == 8 and fake_machine["spec"].resources["gpu"] == 0.125

    with pytest.raises(Started):
        run.search_command(search_args(fast))
    assert ", 4 at a time (max_concurrent in the space), " in first_line(capsys)
    assert fake_machine["spec"].max_concurrent == 4

    paper = os.path.join(ROOT, "search_spaces", "cifar10_paper.yaml")
    with pytest.raises(Started):
        run.search_command(search_args(paper))
    line = first_line(capsys)
    assert line.startswith("cem-bench search: cifar10_paper: 165 trials: 55 configurations x 3 seeds, ")
    assert "2 at a time (1 GPU / 0.5 per trial; the space allows 8)" in line, line
    assert fake_machine["spec"].max_concurrent == 2

    with pytest.raises(Started):
        run.search_command(search_args(paper, "--max-concurrent", "5"))
    assert "2 at a time (--max-concurrent 5, but 1 GPU / 0.5 per trial fits 2)" in first_line(capsys)
    assert fake_machine["spec"].max_concurrent == 5


@pytest.mark.parametrize("flag,value,says", [
    ("--gpus-per-trial", "1.5", "--gpus-per-trial 1.5: give a fraction of one GPU (0 < F <= 1"),
    ("--gpus-per-trial", "-0.25", "--gpus-per-trial -0.25: give a fraction"),
    ("--gpus-per-trial", "nan", "--gpus-per-trial nan: give a fraction"),
    ("--gpus-per-trial", "2", "a trial trains on one GPU, so more than 1 would leave cards reserved and idle"),
    ("--max-concurrent", "0", "--max-concurrent 0: give how many trials may run at once, an integer >= 1"),
    ("--cpus-per-trial", "0", "--cpus-per-trial 0: give the CPUs each trial reserves, a number > 0"),
    ("--name", "", "name: '' is not a safe folder name"),      # it fell back to the space's name
])
def test_bad_values_are_refused_before_ray(fake_machine, capsys, tmp_path, flag, value, says):
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    rc = cli.main(["search", demo, "--storage", str(tmp_path / "res"), "--mps", "off", flag, value])
    err = capsys.readouterr().err
    assert rc == 2 and says in err, err
    assert "spec" not in fake_machine and not (tmp_path / "res").exists()


def test_a_whole_gpu_and_cpu_only_trials_are_accepted(fake_machine, capsys):
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    with pytest.raises(Started):
        run.search_command(search_args(demo, "--gpus-per-trial", "1"))
    assert "1 at a time (1 GPU / 1 per trial)" in first_line(capsys)
    with pytest.raises(Started):
        run.search_command(search_args(demo, "--gpus-per-trial", "0"))
    assert "2 at a time (max_concurrent in the space)" in first_line(capsys)
    assert fake_machine["spec"].resources["gpu"] == 0


def test_a_trial_asking_more_cpus_than_the_machine_has_is_refused(fake_machine, capsys):
    paper = os.path.join(ROOT, "search_spaces", "cifar10_paper.yaml")
    with pytest.raises(SearchError, match="resources.cpu is 12 per trial but Ray has 8 CPUs"):
        run.search_command(search_args(paper, "--cpus-per-trial", "12"))


def _saved_experiment(tmp_path, space: str, overrides: dict | None = None):
    """An experiment folder as a search of ``space`` leaves it (``tuner.pkl`` stands for Ray's state: the
    checks below run before Ray), its search_space.json written and recorded as the search writes it."""
    from cem_bench.integrity import write_recorded_json
    exp = tmp_path / "results" / "demo"       # the fixture runs in tmp_path: the default --storage ./results
    exp.mkdir(parents=True)
    (exp / "tuner.pkl").write_bytes(b"a Ray experiment")
    # and a saved state beside it: a folder of start-up files alone is a stopped start, which --resume refuses
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text("{}")
    write_recorded_json(str(exp), "search_space.json", load_space(space, overrides or {}).to_dict())
    return exp


def test_resume_with_a_changed_budget_is_refused_after_the_experiments_own_count(fake_machine, capsys, tmp_path):
    """--resume restores the experiment's own plan: the banner counts its trials, not the new file's (issue
    39), and a budget it would not run is refused (Ray's restored experiment keeps its own)."""
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    _saved_experiment(tmp_path, demo, {"num_samples": 2})
    with pytest.raises(SearchError, match=r"--resume: the space differs from the experiment's search_space.json "
                                          r"in num_samples \(2 -> 9\)\."):
        run.search_command(search_args(demo, "--num-samples", "9", "--resume"))
    assert "cem-bench search:" not in capsys.readouterr().out   # the plan comes after the checks, and this failed one
    # a resume that passes its checks prints the experiment's plan
    assert run.search_command(search_args(demo, "--num-samples", "2", "--resume", "--dry-run"))["dry_run"]
    line = first_line(capsys)
    assert run.plan(load_space(demo, {"num_samples": 2})) in line, line


def test_resume_of_an_experiment_whose_recorded_space_was_deleted_is_refused(fake_machine, tmp_path):
    """2026-12-07 probe: with search_space.json deleted, a space of other epochs resumed the experiment and its
    table split its cells by train.epochs. The manifest still lists the file: refused; without a manifest (an
    older cem-bench's experiment) nothing can tell, and the resume goes on."""
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    exp = _saved_experiment(tmp_path, demo)
    (exp / "search_space.json").unlink()
    with pytest.raises(SearchError, match=r"search_space.json is missing, though the experiment's "
                                          r"cem_bench_files.json lists it"):
        run.search_command(search_args(demo, "--set", "train.epochs=3", "--resume"))
    (exp / "cem_bench_files.json").unlink()
    run.check_space_unchanged(load_space(demo), str(exp))   # not checked: no record of what it was


def test_resume_says_it_does_not_apply_max_concurrent(fake_machine, capsys, tmp_path):
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    _saved_experiment(tmp_path, demo)
    assert run.search_command(search_args(demo, "--max-concurrent", "1", "--resume", "--dry-run"))["dry_run"]
    out = capsys.readouterr().out
    assert "note: --max-concurrent 1 is not applied on --resume" in out, out


def test_the_printed_resume_command_is_accepted_by_resume(fake_machine, tmp_path, monkeypatch):
    """The command an interrupted search prints names every option a resume must repeat: `--num-samples` was
    dropped, and the printed command was refused ("the space differs ... in num_samples")."""
    import shlex

    from cem_bench.search.interrupt import resume_command
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    _saved_experiment(tmp_path, demo, {"num_samples": 7, "fixed": {**load_space(demo).fixed, "train.epochs": 3}})
    first = search_args(demo, "--num-samples", "7", "--set", "train.epochs=3", "--cpus-per-trial", "0.5")
    printed = shlex.split(resume_command(first, "demo", str(tmp_path / "results")))
    assert printed[:2] == ["cem-bench", "search"] and printed[-1] == "--resume"
    assert "--num-samples" in printed and "--mps" in printed    # off: the first search's, not the default

    def before_ray(*a, **kw):
        raise Started
    monkeypatch.setattr(run, "_run_locked", before_ray)
    with pytest.raises(Started):
        run.search_command(cli.make_parser().parse_args(printed[1:]))

@pytest.mark.parametrize("override, words", [
    ({"max_failures": 5}, "max_failures (2 -> 5: the restored experiment keeps its own)"),
    ({"utility_tolerance": 0.05}, "utility_tolerance (null -> 0.05: the restored experiment keeps its own)"),
])
def test_resume_refuses_a_failure_budget_or_tolerance_it_could_not_use(fake_machine, tmp_path, override, words):
    """Ray's restore keeps the experiment's FailureConfig and the report reads the saved tolerance: a changed one
    was accepted with a note and then not used. Now refused before Ray starts, naming both values."""
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    _saved_experiment(tmp_path, demo)
    (key, value), = override.items()
    edited = tmp_path / "demo.yaml"    # the space file edited after the start: the name (the folder) is kept
    edited.write_text(open(demo).read() + f"\n{key}: {value}\n")
    with pytest.raises(SearchError) as e:
        run.search_command(search_args(str(edited), "--resume"))
    msg = str(e.value)
    assert words in msg and "Nothing was changed" in msg, msg


def test_resume_refuses_a_space_that_changes_what_the_trials_compute(fake_machine, capsys, tmp_path, monkeypatch):
    """A --set or an edit of a fixed key on --resume reached the remaining epochs of trials halfway through and
    re-attacked finished ones (the audit of 2026-11-28): refused before Ray starts, naming the key and both
    values. How trials run (data.root, the device) and the resources may change, with a note."""
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    _saved_experiment(tmp_path, demo)
    with pytest.raises(SearchError) as e:
        run.search_command(search_args(demo, "--resume", "--set", "defense.noise_std=0.9"))
    msg = str(e.value)
    assert "fixed.defense.noise_std (" in msg and "-> 0.9)" in msg and "--name NEW_NAME" in msg, msg
    # a key the saved file does not name stands at its default: setting that default is no change
    import dataclasses
    import json

    from cem_bench.config import key_specs
    from cem_bench.storage import json_bytes
    spec = load_space(demo)
    saved = json.loads(json_bytes(spec.to_dict()))
    key, ks = next((k, v) for k, v in key_specs().items()
                   if k not in spec.fixed and isinstance(v.default, float) and not isinstance(v.default, bool))
    assert run.space_changes(dataclasses.replace(spec, fixed={**spec.fixed, key: ks.default}), saved) == ([], [])
    refused, _ = run.space_changes(dataclasses.replace(spec, fixed={**spec.fixed, key: ks.default + 1}), saved)
    assert refused == [f"fixed.{key} ({json.dumps(ks.default)} -> {json.dumps(ks.default + 1)})"], refused
    # the real run_search up to Ray (it checks the space too, when called on its own): the note comes once
    monkeypatch.setattr(run, "run_search", REAL_RUN_SEARCH)

    def before_ray(*a, **kw):
        raise Started
    monkeypatch.setattr(run, "_run_locked", before_ray)
    with pytest.raises(Started):
        # train.eval_batch_size: demo's digits never read data.root, which search --set now refuses
        run.search_command(search_args(demo, "--resume", "--set", "train.eval_batch_size=64", "--cpus-per-trial", "2"))
    out = capsys.readouterr().out
    assert "differs from the experiment's search_space.json in resources, fixed.train.eval_batch_size" in out, out
    assert out.count("differs from the experiment's search_space.json") == 1, out


def test_resume_refuses_a_damaged_space_file_before_any_trial(fake_machine, tmp_path):
    """A truncated search_space.json was found only after every trial had run (the tables' check): now before."""
    from cem_bench.errors import ResultsError
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    exp = _saved_experiment(tmp_path, demo)
    data = (exp / "search_space.json").read_bytes()
    (exp / "search_space.json").write_bytes(data[: len(data) // 2])
    with pytest.raises(ResultsError, match="search_space.json is not the file cem-bench wrote there"):
        run.search_command(search_args(demo, "--resume"))


# ---------------------------------------------------------------------------------- trial count
def trials_handed_out(spec, tmp_path) -> int:
    """Drive the searcher Tune would get (make_searcher) to its end: every run it hands out is one Ray trial.
    Each finishes at once with a result that differs per configuration (so every one is confirmable)."""
    from ray.tune.search import Searcher

    from cem_bench.search.searcher import make_searcher
    searcher = make_searcher(spec, str(tmp_path / spec.name)).searcher.searcher   # generator > limiter > ours
    n = 0
    while True:
        cfg = searcher.suggest(f"t{n}")
        if cfg == Searcher.FINISHED:
            return n
        assert cfg is not None, "every run finished at once: the searcher has nothing to wait for"
        h = zlib.crc32(repr(sorted((k, v) for k, v in cfg.items() if k != "seed")).encode()) % 1000 / 1000
        searcher.on_trial_complete(f"t{n}", {"test_acc": h, "attack_ssim": 1 - h * h, "attack_mse": h, "status": "ok"})
        n += 1
        assert n <= 10_000


@pytest.mark.parametrize("path", SPACES, ids=os.path.basename)
def test_banner_counts_every_trial_the_searcher_starts(path, tmp_path):
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_space(path)
    line = run.banner(spec, concurrency(spec.max_concurrent, spec.resources))
    announced = int(re.match(r"cem-bench search: [^:]+: (\d+) trials", line).group(1))
    assert announced == trials_handed_out(spec, tmp_path), line
    assert spec.total_runs == announced   # Tune's num_samples: it starts no more than this


# ------------------------------------------------------------------------------- cluster packing
def cluster_nodes() -> dict[str, dict]:
    """Node type -> the resources Ray gives it: the instance's vCPUs and GPUs, with cluster.yaml's
    ``resources`` on top (the head's CPU 0: it runs the driver and no trial), and the type's max_workers."""
    with open(CLUSTER) as fh:
        doc = yaml.safe_load(fh)
    nodes = {}
    for name, node in doc["available_node_types"].items():
        have = {**INSTANCES[node["node_config"]["InstanceType"]], **(node.get("resources") or {})}
        nodes[name] = {**have, "max_workers": node.get("max_workers", 0), "head": name == doc["head_node_type"]}
    return nodes


def per_node(node: dict, resources: dict) -> int:
    n = trials_that_fit(node["CPU"], resources["cpu"]) if node["CPU"] else 0
    if resources["gpu"] > 0:
        n = min(n, trials_that_fit(node["GPU"], resources["gpu"]) if node["GPU"] else 0)
    return n


def test_cluster_instance_types_are_known():
    with open(CLUSTER) as fh:
        doc = yaml.safe_load(fh)
    types = {n["node_config"]["InstanceType"] for n in doc["available_node_types"].values()}
    assert types <= set(INSTANCES), f"add {sorted(types - set(INSTANCES))} to INSTANCES"
    assert cluster_nodes()["head"]["CPU"] == 0   # no trial is ever placed on the head


@pytest.mark.parametrize("path", SPACES, ids=os.path.basename)
def test_space_packs_the_cluster_as_its_comments_say(path):
    spec = load_space(path)
    res = spec.resources
    nodes = cluster_nodes()
    workers = {k: v for k, v in nodes.items() if not v["head"]}
    assert all(per_node(v, res) == 0 for v in nodes.values() if v["head"])
    assert any(per_node(v, res) >= 1 for v in workers.values()), f"no worker of cluster.yaml holds one trial {res}"
    with open(path) as fh:
        text = fh.read()
    claims = [int(n) for n in re.findall(r"(\d+) trials per GPU", text)]
    if 0 < res["gpu"] < 1:
        assert claims, f"{os.path.basename(path)}: say how many trials share a GPU ('N trials per GPU')"
    gpu_workers = [v for v in workers.values() if v["GPU"]]
    for n in claims:
        assert n == trials_that_fit(1, res["gpu"]), f"the comment says {n} trials per GPU; resources.gpu is {res['gpu']}"
    if res["gpu"] > 0:
        for node in gpu_workers:
            by_gpu = trials_that_fit(node["GPU"], res["gpu"])
            # the CPUs must not hold fewer trials than the GPU fraction promises
            assert per_node(node, res) == by_gpu, (f"{os.path.basename(path)}: {node['CPU']} vCPUs / {res['cpu']:g} "
                                                   f"per trial hold {per_node(node, res)}, the GPUs {by_gpu}")
    for w, t in re.findall(r"(\d+) GPU workers x (\d+) trials", text):
        assert all(int(t) == per_node(node, res) for node in gpu_workers), (w, t)
        assert int(w) * int(t) == spec.max_concurrent
        assert int(w) <= max(node["max_workers"] for node in gpu_workers)


def test_a_missing_data_set_stops_a_local_search_before_ray(monkeypatch, capsys, tmp_path):
    """A local search of CIFAR without its files ran every trial into the same DataError and exited 0; now the
    driver checks the data set first (the folder there but incomplete: no download is tried) and nothing
    starts or is written. With all files there the search starts."""
    started = {}

    def fake_run_search(spec, **kw):
        started["spec"] = spec
        raise Started
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run, "run_search", fake_run_search)
    fast = os.path.join(ROOT, "search_spaces", "cifar10_fast.yaml")
    folder = tmp_path / "data" / "cifar-10-batches-py"
    folder.mkdir(parents=True)

    def write(f, obj):
        (folder / f).write_bytes(pickle.dumps(obj))
    batch = {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}
    write("batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    for f in ("data_batch_1", "data_batch_2"):
        write(f, batch)
    argv = ["search", fast, "--storage", str(tmp_path / "res"), "--mps", "off", "--set",
            f"data.root={tmp_path / 'data'}"]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert "data error: cifar10 files under" in err and "missing data_batch_3, data_batch_4" in err, err
    assert not started and not (tmp_path / "res").exists()
    # no plan above the refusal: printed before the checks, it read as a search that had started and failed
    assert "cem-bench search:" not in out, out
    for f in ("data_batch_3", "data_batch_4", "data_batch_5"):
        write(f, batch)
    # a file that is there but cannot be read is found before Ray too (every trial failed on it)
    (folder / "test_batch").write_bytes(b"")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "data error: cifar10 file test_batch under" in err and "cannot be read" in err, err
    assert not started and not (tmp_path / "res").exists()
    write("test_batch", batch)
    # a relative data.root names another folder in each trial's own working folder: refused, the absolute
    # path offered, nothing started (every trial failed on it after the driver's check had passed)
    rel = argv[:-1] + ["data.root=data"]
    assert cli.main(rel) == 2
    err = capsys.readouterr().err
    assert "data.root='data' is a relative path" in err and f"data.root={tmp_path / 'data'}" in err, err
    assert not started and not (tmp_path / "res").exists()
    with pytest.raises(Started):
        run.search_command(cli.make_parser().parse_args(argv))
    assert started["spec"].name == "cifar10_fast"


@pytest.mark.parametrize("ok, error, rc", [(0, 3, 1), (1, 2, 0), (0, 0, 0)])
def test_a_search_that_finished_no_trial_exits_1(monkeypatch, capsys, tmp_path, ok, error, rc):
    """Every trial errored: the search ran, but a script (or `ray job submit`) must see that it produced
    nothing; some errors beside finished trials are a search's normal course."""
    import cem_bench.search as search_pkg
    done = {"experiment": str(tmp_path / "none"), "name": "demo", "trials": "", "epochs": "", "ok": ok,
            "error": error, "stopped": 0, "interrupted": 0, "stats": {"mode": "local"}, "seconds": 1.0}
    monkeypatch.setattr(search_pkg, "search_command", lambda args: done)
    assert cli.main(["search", os.path.join(ROOT, "search_spaces", "demo.yaml"), "--mps", "off"]) == rc
    err = capsys.readouterr().err
    assert ("cem-bench: no trial of demo finished (3 error(s))" in err) == (rc == 1), err


def test_mps_on_without_its_daemon_is_refused_before_the_storage_is_made(fake_machine, monkeypatch, capsys,
                                                                          tmp_path):
    """--mps on where nvidia-cuda-mps-control is not on PATH: exit 2 naming it; the storage folder is not made
    (it was left empty behind the error)."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    rc = cli.main(["search", demo, "--storage", str(tmp_path / "res"), "--mps", "on"])
    err = capsys.readouterr().err
    assert rc == 2 and "nvidia-cuda-mps-control is not on PATH" in err, err
    assert "spec" not in fake_machine and not (tmp_path / "res").exists()


def test_resume_of_an_unreadable_tuner_pkl_is_one_clear_error(tmp_path, monkeypatch):
    """A truncated tuner.pkl beside a readable experiment state came out of Ray's restore as a raw UnpicklingError
    traceback (the audit of 2026-11-28): now a SearchError naming the file and what to do."""
    import pickle
    exp = tmp_path / "exp"
    exp.mkdir()
    data = pickle.dumps({"tuner": list(range(1000))})
    (exp / "tuner.pkl").write_bytes(data[: len(data) // 2])
    monkeypatch.setattr(run, "repair_experiment_state", lambda *a, **k: [])   # the state beside it is readable
    monkeypatch.setattr(run, "restore_removed_checkpoints", lambda *a, **k: [])
    with pytest.raises(SearchError, match=r"tuner.pkl cannot be read \(UnpicklingError: .*--name"):
        run._tuner(None, str(tmp_path), str(exp), True, False, lambda config: None, None)


def _closed_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]     # nothing listens once the socket is closed


def test_an_address_where_nothing_answers_is_refused_before_ray_starts(fake_machine, monkeypatch):
    """ray.init retried a dead --address for minutes (a stale address `auto` found hung it past 170 s in the
    audit of 2026-11-28): now one SearchError within seconds, naming the address, before Ray or the folder."""
    import socket
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    port = _closed_port()
    with pytest.raises(SearchError, match=rf"--address 127.0.0.1:{port}: nothing answers at 127.0.0.1:{port}"):
        run.search_command(search_args(demo, "--address", f"127.0.0.1:{port}"))
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(SearchError, match=rf"where --address auto found the cluster: 127.0.0.1:{port}"):
        run.check_address("auto", timeout_s=2)
    with socket.socket() as listening:      # a cluster that answers passes (Ray then does the rest)
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        run.check_address(f"127.0.0.1:{listening.getsockname()[1]}", timeout_s=2)
    run.check_address(None)


@pytest.mark.parametrize("address, says", [
    ("nonsense", "is not an address Ray can connect to"), ("localhost", "is not an address"),
    ("127.0.0.1:abc", "is not an address"), (":6379", "is not an address"), ("10.0.0.1:99999", "is not an address"),
    ("http://127.0.0.1:8265", "is the dashboard's"), ("gcs://x:1", "unknown scheme gcs://")])
def test_an_address_ray_cannot_use_is_one_message_not_a_traceback(fake_machine, address, says):
    """Each of these was a traceback out of ray.init (2026-12-06 audit); the dashboard's URL is one line above
    `--address auto` in the README."""
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    with pytest.raises(SearchError, match=re.escape(f"--address {address}") + ".*" + re.escape(says)):
        run.search_command(search_args(demo, "--address", address))


def test_a_ray_client_address_needs_the_client(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    with pytest.raises(SearchError, match=r"needs `pip install 'ray\[client\]'`"):
        run.check_address("ray://somewhere:10001")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    run.check_address("ray://somewhere:10001")   # with the client: left to Ray


def test_a_gpu_request_on_a_cluster_without_gpus_says_what_it_waits_for():
    note = run.cluster_gpu_note("auto", {"cpu": 1, "gpu": 0.25}, 0.0)
    assert note and "has no GPU now" in note and "--gpus-per-trial 0" in note
    assert run.cluster_gpu_note("auto", {"cpu": 1, "gpu": 0.25}, 1.0) is None
    assert run.cluster_gpu_note("auto", {"cpu": 1, "gpu": 0}, 0.0) is None


def test_a_cluster_search_into_a_local_folder_says_every_node_must_share_it(fake_machine, capsys):
    import socket
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        with pytest.raises(Started):
            run.search_command(search_args(demo, "--address", f"127.0.0.1:{head.getsockname()[1]}"))
    assert "with --address every node writes there" in capsys.readouterr().out


@pytest.mark.parametrize("setting", ["train.device=cuda", "train.device=cuda:1"])
def test_a_device_this_machine_lacks_stops_a_local_search_before_ray(fake_machine, monkeypatch, tmp_path, setting):
    """Every trial failed with train's own ConfigError, the search ran to its end on errors, and the name was
    used up (2026-12-06 audit): now one SearchError before Ray and before the folder; a cluster's nodes are
    their own (not checked)."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    demo = os.path.join(ROOT, "search_spaces", "demo.yaml")
    with pytest.raises(SearchError, match=re.escape(f"{setting.replace('=', '=' + chr(39))}'") + ", but this machine"):
        run.search_command(search_args(demo, "--set", setting, "--storage", str(tmp_path / "s")))
    assert not (tmp_path / "s").exists()
    with pytest.raises(Started):
        run.search_command(search_args(demo, "--set", "train.device=auto", "--storage", str(tmp_path / "s")))


def test_a_long_list_of_seeds_is_shortened_in_the_first_line():
    """`baseline: {replicates: 5000}` printed every seed: a 29 KB first line (2026-12-06 audit)."""
    assert run.seed_list(range(5000)) == "0, 1, …, 4999 (5,000 seeds)" and run.seed_list([3, 4]) == "3, 4"


def test_a_storage_uri_with_options_keeps_them_after_the_experiment_name():
    """`--storage 's3://b/p?endpoint_override=…&scheme=http'` put the experiment's name after the options
    (`…scheme=http/q1`), which pyarrow read as the scheme 'http/q1': every such search failed."""
    from cem_bench.storage import join, resolve_storage
    base = resolve_storage("s3://b/p/?endpoint_override=127.0.0.1:5917&scheme=http")
    assert join(base, "q1") == "s3://b/p/q1?endpoint_override=127.0.0.1:5917&scheme=http"
    assert join(base, "q1", "trials.parquet") == "s3://b/p/q1/trials.parquet?endpoint_override=127.0.0.1:5917&scheme=http"
    assert join("s3://b/p", "q1") == "s3://b/p/q1" and join("/r", "q1") == "/r/q1"
    from cem_bench.storage import Dir
    d = Dir.__new__(Dir)       # a Dir of that folder, without connecting to the bucket
    d.uri, d.display = True, join(base, "q1")
    assert d.url("trials.parquet") == "s3://b/p/q1/trials.parquet?endpoint_override=127.0.0.1:5917&scheme=http"


def test_resume_of_an_experiment_saved_by_an_older_cem_bench_is_not_refused_for_derived_values():
    """An older cem-bench saved the baseline's seeds from the search's and confirm.top as written; the same space
    now derives other seeds (a grid with λ = 0 cells) and a top cut to the configurations it can have: --resume
    refused the very file it was started with. What the space says is still compared."""
    import json

    from cem_bench.spaces import parse_space
    doc = {"name": "old", "sampler": {"name": "grid"}, "confirm": {"top": 20, "replicates": 3},
           "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.1},
                          {"metric": "attack_ssim", "mode": "min", "ref": 1.0}],
           "fixed": {"train.device": "cpu"},
           "params": {"cem.lambd": {"choice": [0, 4, 8]}, "cem.surrogate": {"choice": ["gmm", "slot_cross"]}}}
    spec = parse_space(doc)
    saved = json.loads(json.dumps(spec.to_dict()))
    saved["baseline"]["seeds"] = [0, 1, 2]          # as the older code derived them
    saved["confirm"]["top"] = 20                     # as written, before the cut to 4 cells
    assert run.space_changes(spec, saved) == ([], [])
    saved["confirm"]["top"] = 2                      # a space that asked for fewer: changed
    refused, _ = run.space_changes(spec, saved)
    assert refused and refused[0].startswith("confirm")


def test_derived_seeds_stay_within_a_trial_s_range_and_after_a_searched_seed():
    """The baseline's and the confirmation's seeds are the search's plus one, two, ...: seeds [4294967295] parsed,
    and every confirmation run failed after the whole search (seed out of range). And a grid with λ = 0 cells and a
    searched seed ran its baseline at seeds the λ = 0 cells had run already."""
    from cem_bench.errors import SpaceError
    from cem_bench.spaces import parse_space
    base = {"name": "s", "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.1},
                                        {"metric": "attack_ssim", "mode": "min", "ref": 1.0}],
            "fixed": {"train.device": "cpu"}}
    with pytest.raises(SpaceError, match="past 4294967295, the largest seed a trial takes"):
        parse_space({**base, "sampler": {"name": "random", "seed": 0}, "num_samples": 2, "seeds": [4294967295],
                     "params": {"cem.lambd": {"loguniform": [1, 64]}}})
    spec = parse_space({**base, "sampler": {"name": "grid"}, "baseline": {"replicates": 3}, "confirm": False,
                        "params": {"cem.lambd": {"choice": [0, 8]}, "seed": {"choice": [0, 1, 2]}}})
    assert min(spec.baseline_seeds) > 2, spec.baseline_seeds
