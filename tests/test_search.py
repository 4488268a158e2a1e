"""Ray Tune + Optuna search end to end (cem_bench.search), on tiny CPU trials.

The module shares Ray where it can: one two-node cluster (two `ray start --block` processes in their own
process groups, stopped by group id at the end) serves the cluster and the driver-kill tests, and one
in-process `ray.init(address="local", num_cpus=4, num_gpus=1)` session serves the packing, divergence and
worker-death tests. The local end-to-end test lets the CLI start and stop Ray itself.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import conftest
import numpy as np
import pandas as pd
import pytest
import search_hooks
import yaml

from cem_bench import cli, schema, search

TINY = {**conftest.TINY, "model.width": 0.0625}   # the shared tiny trial at half its width: a search runs many
RAY_BIN = str(Path(sys.executable).with_name("ray")) if Path(sys.executable).with_name("ray").exists() \
    else (shutil.which("ray") or "ray")


def write_space(folder: Path, name: str, *, num_samples: int | None = 2, max_concurrent: int = 2, params=None,
                fixed=None, sampler=None, max_failures: int = 1, cpu: float = 1, gpu: float = 0, **extra) -> str:
    doc = {
        "name": name,
        "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.0},
                       {"metric": "attack_ssim", "mode": "min", "ref": 1.0}],
        "sampler": sampler or {"name": "random", "seed": 0},
        "num_samples": num_samples,
        "max_concurrent": max_concurrent,
        "max_failures": max_failures,
        "resources": {"cpu": cpu, "gpu": gpu},
        # every surrogate's CEM loss active from epoch 2 of the tiny runs (gated_attention waits 5 by default, and a
        # run whose warm-up is all of it is refused: surrogates.never_active)
        "fixed": {**TINY, "cem.warmup_epochs": 1, **(fixed or {})},
        "params": params or {"cem.lambd": {"loguniform": [1, 32]}},
        # the noise floor and the confirmation add trials; tests that are about them turn them on
        "baseline": False,
        "confirm": False,
        **extra,
    }
    if num_samples is None:
        del doc["num_samples"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def subprocess_env() -> dict:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    # the test cluster runs without token authentication (all its processes agree on this explicitly)
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cem_bench.cli", "search", *args]


def hooks_cmd(hook: str, path: Path, *args: str) -> list[str]:
    """``cli_cmd(*args)`` with ``search_hooks``' ``--HOOK PATH`` (``full-while``, ``wait-for``,
    ``hold-after-first``, ``slow-report``: tests/search_hooks.py); run with ``hooks_env``."""
    return [sys.executable, "-c", "import search_hooks; search_hooks.main()", f"--{hook}", str(path), "search", *args]


def full_while_cmd(marker: Path, *args: str) -> list[str]:
    """``cli_cmd(*args)`` whose trials fail to save a checkpoint with ENOSPC while ``marker`` exists
    (``search_hooks.FullWhile``; run with ``hooks_env``)."""
    return hooks_cmd("full-while", marker, *args)


def hooks_env(env: dict) -> dict:
    """``env`` with ``tests/`` on the Python path (where ``search_hooks`` is)."""
    here = str(Path(__file__).resolve().parent)
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)}


def tree_snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns, p.is_dir())
            for p in folder.rglob("*")}


def finite(v) -> bool:
    return isinstance(v, float) and math.isfinite(v)


@pytest.fixture(scope="module", autouse=True)
def _restore_ray_env():
    # ray.init() of a new local cluster sets RAY_AUTH_MODE=token in this process; put it back afterwards
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE",)}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# ------------------------------------------------------------------------------ no Ray needed
def test_trial_resources_without_gpu_runs_on_cpu():
    res, note = search.trial_resources({"cpu": 2, "gpu": 0.25}, 0.0)
    assert res == {"cpu": 2.0, "gpu": 0.0} and "CPU" in note
    res, note = search.trial_resources({"cpu": 1, "gpu": 0.25}, 1.0)
    assert res == {"cpu": 1.0, "gpu": 0.25} and note is None
    res, note = search.trial_resources({"cpu": 1, "gpu": 1}, None)  # cluster: GPU nodes come on demand
    assert res == {"cpu": 1.0, "gpu": 1.0} and note is None


def test_cli_broken_space_exits_2_before_ray(tmp_path, monkeypatch, capsys):
    def boom(*a, **k):
        raise AssertionError("run_search must not be reached with a broken space")
    monkeypatch.setattr(search, "run_search", boom)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({
        "name": "broken",
        "objectives": [{"metric": "test_acc", "mode": "max"}, {"metric": "attack_sim", "mode": "min"}],
        "num_samples": 2,
        "fixed": {"train.epochz": 2},
        "params": {"cem.lambd": {"loguniform": [64, 1]}},
    }))
    storage = tmp_path / "res"
    rc = cli.main(["search", str(path), "--storage", str(storage)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "attack_sim" in err and "train.epochz" in err and "empty range" in err, err
    assert not storage.exists()


def test_cli_refuses_existing_experiment(tmp_path, capsys):
    space = write_space(tmp_path, "exists")
    exp = tmp_path / "res" / "exists"
    exp.mkdir(parents=True)
    (exp / "keep.txt").write_text("earlier results")
    before = tree_snapshot(exp)
    rc = cli.main(["search", space, "--storage", str(tmp_path / "res")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--resume" in err and "--name" in err, err
    assert tree_snapshot(exp) == before
    assert (exp / "keep.txt").read_text() == "earlier results"
    # --resume of a folder that holds no experiment is refused too, without touching it
    rc = cli.main(["search", space, "--storage", str(tmp_path / "res"), "--resume"])
    assert rc == 2 and tree_snapshot(exp) == before
    if "ray" in sys.modules:
        import ray
        assert not ray.is_initialized()


def test_a_dry_run_checks_and_prints_the_plan_and_starts_nothing(tmp_path, monkeypatch, capsys):
    def boom(*a, **k):
        raise AssertionError("a dry run must not reach run_search")
    monkeypatch.setattr(search, "run_search", boom)
    space = write_space(tmp_path, "dry", num_samples=3, max_concurrent=1,
                        params={"cem.lambd": {"loguniform": [1, 32]}, "cem.surrogate": {"choice": ["gmm", "slot_cross"]}})
    storage = tmp_path / "res"
    assert cli.main(["search", space, "--storage", str(storage), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry: 3 trials: 3 configurations x 1 seed, 1 at a time" in out, out
    assert f"experiment: {storage / 'dry'} (would be made)" in out
    assert "cem.lambd: 1 to 32 (loguniform)" in out and "cem.surrogate: one of gmm, slot_cross" in out
    assert f"train.epochs={TINY['train.epochs']}" in out
    assert "dry run: the checks passed; nothing was started and nothing was written" in out
    assert not storage.exists()
    # the checks are the search's own: an existing experiment is refused, and so is --resume of nothing
    (storage / "dry").mkdir(parents=True)
    assert cli.main(["search", space, "--storage", str(storage), "--dry-run"]) == 2
    assert "--resume" in capsys.readouterr().err
    (storage / "dry").rmdir()
    assert cli.main(["search", space, "--storage", str(storage), "--dry-run", "--resume"]) == 2
    assert "dry run" not in capsys.readouterr().out
    if "ray" in sys.modules:
        import ray
        assert not ray.is_initialized()


# ------------------------------------------------------------------ local mode via the CLI
@pytest.mark.ray
def test_cli_local_search_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    space = write_space(tmp_path, "e2e", num_samples=2, max_concurrent=2)
    storage = tmp_path / "res"
    rc = cli.main(["search", space, "--storage", str(storage)])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    exp = storage / "e2e"
    assert f"experiment: {exp}" in out and "summary: 2 trial(s) ok, 0 error(s)" in out
    trials = pd.read_parquet(exp / "trials.parquet")
    assert len(trials) == 2 and trials["trial_id"].is_unique
    assert (trials["status"] == "ok").all()
    for col in ("test_acc", "attack_ssim"):
        assert trials[col].map(finite).all(), trials[col]
    assert set(trials["pareto_rank"]) <= {0, 1} and (trials["pareto_rank"] == 0).any()
    assert trials["config.cem.lambd"].between(1, 32).all()
    assert trials["node_id"].notna().all() and trials["finished_at"].notna().all()
    assert (trials["torch_threads"] == 1).all()      # resources.cpu = 1: each trial's torch threads pinned to it
    epochs = pd.read_parquet(exp / "epochs.parquet")
    assert sorted(epochs.groupby("trial_id")["epoch"].apply(list).tolist()) == [[1, 2], [1, 2]]
    for d in trials["trial_dir"]:
        assert (exp / d / "recon.png").is_file() and (exp / d / schema.RESULT_FILE).is_file()
    # a trial's folder is re-attacked from its latest checkpoint: its own attack config, at its 1 torch thread,
    # gives its own numbers, so that checkpoint holds the encoder the trial attacked
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cli.main(["attack", str(exp / trials["trial_dir"].iloc[0])]) == 0
    finally:
        torch.set_num_threads(threads)
    again = json.loads(next((exp / trials["trial_dir"].iloc[0]).glob("attack-*/attack.json")).read_text())
    for k in ("attack_ssim__decoder", "attack_ssim__rmle", "attack_psnr"):
        assert again[k] == pytest.approx(trials[k].iloc[0], rel=1e-6), k
    capsys.readouterr()
    spec = json.loads((exp / "search_space.json").read_text())
    assert spec["name"] == "e2e" and [o["metric"] for o in spec["objectives"]] == ["test_acc", "attack_ssim"]
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    study = optuna.load_study(study_name="e2e", storage=JournalStorage(JournalFileBackend(str(exp / "optuna_journal.log"))))
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2 and all(len(t.values) == 2 for t in done)
    assert {t.user_attrs["ray_trial_id"] for t in done} == set(trials["trial_id"])
    assert (exp / "report" / "index.html").is_file()


@pytest.mark.ray
def test_a_grid_s_hypotheses_are_tested_on_the_runs_the_search_wrote(tmp_path, monkeypatch, capsys):
    """The contract between the space and the report: each side, written as the space's keys (an int for a
    float key), finds its 3 runs among the rows results.write_tables wrote, and the page leads with them."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    space = write_space(tmp_path, "hyp", num_samples=None, sampler={"name": "grid"}, replicates=3,
                        params={"cem.lambd": {"choice": [4, 8]}},
                        hypotheses={"tests": [
                            {"metric": "test_acc", "a": {"cem.lambd": 8}, "b": {"cem.lambd": 4}, "a_is": "not_lower",
                             "margin": 0.99},
                            {"metric": "attack_ssim", "a": {"cem.lambd": 8}, "b": {"cem.lambd": 4}, "a_is": "lower",
                             "paired": True}]})
    rc = cli.main(["search", space, "--storage", str(tmp_path / "res")])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    report = tmp_path / "res" / "hyp" / "report"
    tested = pd.read_csv(report / "hypotheses.csv")
    assert tested["name"].tolist() == ["H1", "H2"]
    assert (tested["n_a"] == 3).all() and (tested["n_b"] == 3).all()     # paired: the 3 seeds both ran
    # accuracy cannot fall by 0.99 from chance (a margin of 1, the whole range, is refused: it decides nothing); at
    # chance on every run (this tiny search's usual case) it does not vary
    trials = pd.read_parquet(tmp_path / "res" / "hyp" / "trials.parquet")
    varies = trials["test_acc"].nunique() > 1
    assert tested["verdict"].iloc[0] == ("holds" if varies else "not tested: the runs do not vary")
    assert tested["verdict"].iloc[1] in ("holds", "not shown") and np.isfinite(tested["p"].iloc[1])
    assert np.isfinite(tested["p"].iloc[0]) == varies
    assert "The space wrote down 2 hypotheses before the run" in (report / "index.html").read_text()


@pytest.mark.ray
def test_a_second_search_of_the_same_experiment_is_refused_and_nothing_is_lost(tmp_path):
    """Two `cem-bench search` with one --storage and --name (issue 39: both ran, two of four trials were
    dropped, one journal held both): the second is refused before Ray starts, and so is a --resume while the
    first runs; the first finishes every trial once, with a journal of its own."""
    space = write_space(tmp_path, "twice", num_samples=2, max_concurrent=2)
    storage = tmp_path / "res"
    exp = storage / "twice"
    env = subprocess_env()
    # the first search's trials wait at their first report until the test releases them: the refusals must be
    # tried while it runs, however slowly the machine starts the second command
    release = tmp_path / "release"
    first = subprocess.Popen(hooks_cmd("wait-for", release, space, "--storage", str(storage)), env=hooks_env(env),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (exp / "tuner.pkl").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first search did not start"
            time.sleep(0.2)
        for extra in ([], ["--resume"]):
            second = subprocess.run(cli_cmd(space, "--storage", str(storage), *extra), env=env,
                                    capture_output=True, text=True, timeout=300)
            assert second.returncode == 2, second.stdout + second.stderr
            said = "already exists" if not extra else f"another cem-bench search is running on {exp} (pid {first.pid}"
            assert said in second.stderr, second.stderr
            assert "Ray" not in second.stdout   # refused before Ray started
        assert first.poll() is None             # still running: the refusals were not the end of it
        release.write_text("go\n")
        out, _ = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, out[-3000:]
    trials = pd.read_parquet(exp / "trials.parquet")
    assert len(trials) == 2 and trials["trial_id"].is_unique and (trials["status"] == "ok").all()
    assert len([d for d in exp.iterdir() if d.is_dir() and (d / schema.RESULT_FILE).is_file()]) == 2
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    study = optuna.load_study(study_name="twice",
                              storage=JournalStorage(JournalFileBackend(str(exp / "optuna_journal.log"))))
    assert len(study.trials) == 2


@pytest.mark.ray
def test_sigterm_while_the_report_is_drawn_cleans_up_and_says_how_to_build_it(tmp_path):
    """SIGTERM after the trials, while the report is drawn: ray.init's own SIGTERM handler (a bare sys.exit(15)),
    or Python's default, used to end the driver there with no word and the report's staging folder left in the
    temp folder. Now it exits 143 like an interrupted search, the staging folder is removed, the tables are
    complete, and the last words say how to build the report."""
    space = write_space(tmp_path, "late", num_samples=1, max_concurrent=1)
    storage = tmp_path / "res"
    exp = storage / "late"
    marker = tmp_path / "drawing"
    proc = subprocess.Popen(hooks_cmd("slow-report", marker, space, "--storage", str(storage)),
                            env=hooks_env(subprocess_env()), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        stage = Path(marker.read_text())
        assert stage.is_dir()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out[-3000:]
    assert not stage.exists(), out[-2000:]
    assert f"build it with `cem-bench report {exp}`" in out, out[-2000:]
    trials = pd.read_parquet(exp / "trials.parquet")
    assert len(trials) == 1 and (trials["status"] == "ok").all()
    assert not (exp / "report" / "index.html").exists()


def make_recorded_checkpoints_stale(exp: Path) -> list[str]:
    """What a driver killed between a trial's checkpoints and its next snapshot leaves: for each unfinished trial
    of Ray's newest experiment state, the checkpoint it records moved two places on (``checkpoint_N`` to
    ``N+2``, as the newer ones Ray kept) and the older one deleted. Returns the trials it changed; at least one,
    or Ray's state is not read as ``search.recorded_checkpoints`` expects."""
    state = json.loads(sorted(exp.glob("experiment_state-*.json"))[-1].read_text())
    changed = []
    for entry in state["trial_data"]:
        trial, meta = json.loads(entry[0]), json.loads(entry[1])
        recorded = search.recorded_checkpoints(meta)
        if trial["status"] == "TERMINATED" or not recorded:
            continue
        folder = exp / trial["relative_logdir"]
        latest = int(recorded[-1].split("_")[1])
        (folder / recorded[-1]).rename(folder / f"checkpoint_{latest + 2:06d}")
        for older in recorded[:-1]:
            shutil.rmtree(folder / older, ignore_errors=True)
        changed.append(trial["trial_id"])
    assert changed, state["trial_data"]
    return changed


@pytest.mark.ray
def test_a_signalled_search_is_interrupted_not_failed_and_resumes(tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group), then SIGTERM to the resumed search: each time the trials
    in flight are recorded as interrupted, not as errors; the exit code is 130 / 143; the last line is the exact
    --resume command; the report says the search was interrupted. After SIGTERM the trials' recorded
    checkpoints are also made stale, as a driver killed between a trial's checkpoints and its next snapshot
    leaves them (Ray deleted the recorded one and kept two newer). Running the printed command then finishes
    every trial once, from the newer checkpoint, instead of Ray failing them. (One search for both signals: a
    resumed search must be as interruptible as a new one, and the chain saves a search start and a whole
    search's epochs in the Ray tier.)"""
    space = write_space(tmp_path, "sig", num_samples=2, max_concurrent=2, fixed={"train.epochs": 40})
    storage = tmp_path / "res"
    exp = storage / "sig"
    env = subprocess_env()

    def logged() -> int:       # what the trials have reported so far (Ray appends an epoch's line to result.json)
        return sum(p.stat().st_size for p in exp.glob("*/result.json"))

    def interrupted(argv: list[str], sig: signal.Signals, after: int) -> str:
        """Run a search, send ``sig`` once its trials have reported more than ``after`` bytes (an epoch, so a
        checkpoint exists to continue from), check what it says and leaves; return its --resume command."""
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while logged() <= after:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
                time.sleep(0.3)
            if sig == signal.SIGINT:
                os.killpg(proc.pid, sig)    # what Ctrl-C in a terminal does
            else:
                proc.send_signal(sig)       # what `kill PID`, a job scheduler or systemd does
            out, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], out[-4000:]
        lines = [ln for ln in out.splitlines() if ln.strip()]
        assert lines[-2].startswith(f"interrupted by {sig.name}") and lines[-1].strip().endswith("--resume"), \
            out[-2000:]
        assert "error(s)" in out and "0 error(s)" in out, out[-3000:]
        assert "its new trials are made in" not in out     # not moved: the generator's storage is kept
        trials = pd.read_parquet(exp / "trials.parquet")
        assert set(trials["status"]) <= {"ok", "interrupted"} and (trials["status"] == "interrupted").any()
        assert (exp / schema.INTERRUPTED_FILE).is_file()
        page = (exp / "report" / "index.html").read_text()
        assert f"interrupted by {sig.name}" in page and "--resume" in page
        return lines[-1].strip()

    import shlex
    resume = interrupted(cli_cmd(space, "--storage", str(storage)), signal.SIGINT, 0)
    argv = shlex.split(resume)
    assert argv[:2] == ["cem-bench", "search"]
    command = [sys.executable, "-m", "cem_bench.cli", *argv[1:]]
    # the printed command resumes it; SIGTERM once a resumed trial has reported a new epoch
    assert interrupted(command, signal.SIGTERM, logged()) == resume
    stale = make_recorded_checkpoints_stale(exp)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "its new trials are made in" not in done.stdout
    for tid in stale:
        assert f"--resume: trial {tid}: its recorded checkpoint" in done.stdout, done.stdout[-3000:]
    trials = pd.read_parquet(exp / "trials.parquet")
    assert len(trials) == 2 and trials["trial_id"].is_unique and (trials["status"] == "ok").all()
    assert not (exp / schema.INTERRUPTED_FILE).exists()


# --------------------------------------------------------------------- two-node Ray cluster
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_status(address: str, env: dict) -> str:
    """``ray status``'s report of the cluster at ``address`` ("" when it did not answer within 30 s)."""
    try:
        return subprocess.run([RAY_BIN, "status", f"--address={address}"], env=env, capture_output=True, text=True,
                              timeout=30).stdout
    except subprocess.TimeoutExpired:
        return ""


def _alive_nodes(address: str, env: dict) -> int:
    out = _ray_status(address, env)
    active = out.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in out else ""
    return sum(1 for line in active.splitlines() if "node_" in line)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A head (1 CPU) and a worker node (1 CPU) on this machine, each a `ray start --block` process in
    its own process group; stopped by process-group id (SIGTERM, then SIGKILL)."""
    env = subprocess_env()
    port = _free_port()
    address = f"127.0.0.1:{port}"
    logs = tmp_path_factory.mktemp("cluster-logs")
    procs = []

    def start(args, log):
        fh = open(logs / log, "wb")
        p = subprocess.Popen([RAY_BIN, "start", *args, "--block"], env=env, stdout=fh, stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append((p, fh))
        return p

    try:
        start(["--head", f"--port={port}", "--num-cpus=1", "--disable-usage-stats", "--include-dashboard=false"],
              "head.log")
        deadline = time.time() + 300   # the head and the worker: under 22 s in CI; generous for a loaded box
        while _alive_nodes(address, env) < 1:
            assert time.time() < deadline, (logs / "head.log").read_text()[-3000:]
            time.sleep(1)
        start([f"--address={address}", "--num-cpus=1"], "worker.log")
        while _alive_nodes(address, env) < 2:
            assert time.time() < deadline, (logs / "worker.log").read_text()[-3000:]
            time.sleep(1)
        yield address
    finally:
        for p, _ in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + 5
        for p, fh in reversed(procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
            try:  # `ray start --block` can hang after SIGTERM: end the whole group it started
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
            fh.close()


@pytest.mark.ray
def test_search_on_two_node_cluster(tmp_path, ray_cluster):
    space = write_space(tmp_path, "cluster2", num_samples=2, max_concurrent=2)
    storage = tmp_path / "res"
    proc = subprocess.run(cli_cmd(space, "--storage", str(storage), "--address", ray_cluster),
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    trials = pd.read_parquet(storage / "cluster2" / "trials.parquet")
    assert len(trials) == 2 and (trials["status"] == "ok").all()
    assert trials["node_id"].nunique() == 2, trials[["trial_id", "node_id"]]
    assert trials["attack_ssim"].map(finite).all()


def kill_driver_when(tmp_path: Path, space: str, storage: Path, address: str, timeout: float, ready) -> None:
    """Start a search driver on the cluster at ``address`` and SIGKILL it as soon as ``ready()`` holds (within
    ``timeout`` seconds, while the driver still runs), then wait until its trials are gone too; its output goes
    to ``driver1.log``."""
    log = open(tmp_path / "driver1.log", "wb")
    driver = subprocess.Popen(cli_cmd(space, "--storage", str(storage), "--address", address),
                              env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + timeout
        while not ready():
            assert driver.poll() is None, (tmp_path / "driver1.log").read_text()[-3000:]
            assert time.time() < deadline, (tmp_path / "driver1.log").read_text()[-3000:]
            time.sleep(0.25)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        wait_until_killed_job_is_gone(address, storage)
    finally:
        if driver.poll() is None:
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        log.close()


def _cpus_in_use(address: str) -> float | None:
    """The CPUs the cluster's autoscaler reports in use (``ray status``), or None when it could not say."""
    out = _ray_status(address, subprocess_env())
    for line in out.split("Usage:", 1)[-1].splitlines():
        if line.strip().endswith(" CPU") and "/" in line:
            return float(line.split("/", 1)[0])
    return None


def wait_until_killed_job_is_gone(address: str, folder: Path, timeout: float = 90) -> None:
    """Wait until the cluster holds no CPU and nothing under ``folder`` has changed for 3 s.

    A SIGKILLed driver's trial actors are killed by Ray once it notices the driver is gone, not at once: on a
    busy machine one of them wrote its result after the test had moved the experiment (CI at 1958629), which
    recreated the old folder. Moving only after they are gone keeps the test about the resume."""
    def snapshot():
        try:
            return sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*") if p.is_file())
        except FileNotFoundError:  # a file went away while we looked (a rename): that is a change too
            return None

    deadline = time.time() + timeout
    before, stable_since = snapshot(), time.time()
    while True:
        now = snapshot()
        if now is None or now != before:
            before, stable_since = now, time.time()
        if time.time() - stable_since >= 3 and _cpus_in_use(address) == 0.0:
            return
        assert time.time() < deadline, f"the killed driver's trials still run after {timeout} s"
        time.sleep(0.5)


@pytest.mark.ray
def test_killed_driver_is_finished_by_resume(tmp_path, ray_cluster):
    """A driver killed during the baseline (its state files truncated, as a kill mid-copy leaves them) is
    finished by --resume: the 3 baseline runs, the 3 search runs and the 3 confirmation runs each exactly once.
    The experiment is moved to another folder before the resume (as a copy from a cluster is): every trial,
    the new ones too, is written where the experiment now is, nothing where it was."""
    n = 3 + 3 + 3
    space = write_space(tmp_path, "killed", num_samples=3, max_concurrent=2, baseline={"replicates": 3},
                        confirm={"top": 1, "replicates": 3})
    storage = tmp_path / "res"
    exp = storage / "killed"
    kill_driver_when(tmp_path, space, storage, ray_cluster, 180,
                     lambda: list(exp.glob(f"*/{schema.RESULT_FILE}")) and list(exp.glob("experiment_state-*.json")))
    finished_before = len(list(exp.glob(f"*/{schema.RESULT_FILE}")))
    assert finished_before < n, "the driver was killed too late to test anything"
    # A driver killed while Ray copies its checkpoint to the storage leaves truncated state files (this
    # is how CI once hung: EOFError in Ray's restore, then "Restarting experiment" forever). Make it so.
    assert (exp / schema.RESUME_STATE_FILE).exists()
    for pattern in ("searcher-state-*.pkl", "experiment_state-*.json"):
        newest = max(exp.glob(pattern))
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])
    # Ray's pickled search generator remembers the old folder: new trials were created there (their
    # checkpoints and trial_result.json), so the moved experiment lost them
    moved = tmp_path / "moved"
    shutil.move(storage, moved)
    old_storage, storage, exp = storage, moved, moved / "killed"

    try:
        proc = subprocess.run(cli_cmd(space, "--storage", str(storage), "--address", ray_cluster, "--resume"),
                              env=subprocess_env(), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"--resume did not finish in 300 s\nstdout:\n{out[-4000:]}\nstderr:\n{err[-8000:]}")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "restored from cem_resume_state.bin" in proc.stdout, proc.stdout[-3000:]
    assert not old_storage.exists(), sorted(str(p.relative_to(old_storage)) for p in old_storage.rglob("*"))[:20]
    assert f"its new trials are made in {exp}" in proc.stdout, proc.stdout[-3000:]
    trials = pd.read_parquet(exp / "trials.parquet")
    assert len(trials) == n, (trials[["trial_id", "status", "error"]], proc.stdout[-6000:])
    assert trials["trial_id"].is_unique
    assert (trials["status"] == "ok").all(), trials[["trial_id", "status", "error"]]
    assert sorted(trials["role"]) == ["baseline"] * 3 + ["confirm"] * 3 + ["search"] * 3
    runs = trials[["config_id", "config.seed"]].astype(str).agg("/".join, axis=1)
    assert runs.is_unique, trials[["role", "config_id", "config.seed"]]
    base = trials[trials["role"] == "baseline"]
    assert sorted(base["config.seed"]) == [0, 1, 2] and (base["config.cem.surrogate"] == "none").all()
    confirm = trials[trials["role"] == "confirm"]
    assert confirm["config_id"].nunique() == 1 and sorted(confirm["config.seed"]) == [3, 4, 5]
    assert confirm["config_id"].iloc[0] in set(trials.loc[trials["role"] == "search", "config_id"])
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    study = optuna.load_study(study_name="killed",
                              storage=JournalStorage(JournalFileBackend(str(exp / "optuna_journal.log"))))
    ids = [t.user_attrs["ray_trial_id"] for t in study.trials]
    assert sorted(ids) == sorted(trials.loc[trials["role"] == "search", "trial_id"])   # Optuna's trials only


# ------------------------------------------------------------------ in-process Ray session
@pytest.fixture(scope="module")
def local_ray():
    import ray
    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_fractional_gpu_packing(tmp_path, local_ray):
    from ray import tune

    barrier = tmp_path / "barrier"
    barrier.mkdir()

    def _packed(config):  # local, so that Ray pickles it by value
        import os
        import time

        import ray
        from ray import tune
        start = time.time()
        open(os.path.join(config["barrier"], str(config["i"])), "w").close()
        # wait (at most 300 s: a loaded box starts four workers slowly) until all four trials run; with fewer
        # slots the 4th starts only after this ends
        while len(os.listdir(config["barrier"])) < 4 and time.time() - start < 300:
            time.sleep(0.1)
        time.sleep(0.5)
        tune.report({"start": start, "end": time.time(), "gpu_ids": ",".join(map(str, ray.get_gpu_ids()))})

    res, note = search.trial_resources({"cpu": 1, "gpu": 0.25}, local_ray.cluster_resources().get("GPU"))
    assert res == {"cpu": 1.0, "gpu": 0.25} and note is None
    tuner = tune.Tuner(search.with_resources(_packed, res),
                       param_space={"i": tune.grid_search([0, 1, 2, 3]), "barrier": str(barrier)},
                       tune_config=tune.TuneConfig(max_concurrent_trials=4),
                       run_config=tune.RunConfig(name="packing", storage_path=str(tmp_path), verbose=0))
    grid = tuner.fit()
    assert not grid.errors
    spans = [(r.metrics["start"], r.metrics["end"]) for r in grid]
    assert len(spans) == 4
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak == 4, spans
    assert {r.metrics["gpu_ids"] for r in grid} == {"0"}  # all four share the one (logical) GPU


def _seed_with_both(spec_path: str, values: set) -> int:
    """A random-sampler seed whose first two suggestions for train.lr are the two different values."""
    import optuna

    from cem_bench.spaces import define_by_run, load_space, make_sampler
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for seed in range(50):
        spec = load_space(spec_path, {"sampler.seed": seed})
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=make_sampler(spec))
        got = set()
        for _ in range(2):
            t = study.ask()
            define_by_run(spec)(t)
            got.add(t.params["train.lr"])
        if got == values:
            return seed
    raise AssertionError("no seed gives both learning rates")


@pytest.mark.ray
def test_diverged_trial_is_an_error_row(tmp_path, local_ray):
    from cem_bench.spaces import load_space
    params = {"train.lr": {"choice": [0.05, 1000000.0]}}
    path = write_space(tmp_path, "diverge", num_samples=2, max_concurrent=2, params=params)
    seed = _seed_with_both(path, {0.05, 1000000.0})
    spec = load_space(path, {"sampler.seed": seed})
    exp = Path(search.run_search(spec, storage=str(tmp_path / "res")))
    from cem_bench.analysis.results import write_tables
    trials_path, _ = write_tables(exp)
    trials = pd.read_parquet(trials_path).set_index("config.train.lr")
    assert len(trials) == 2
    bad, good = trials.loc[1000000.0], trials.loc[0.05]
    assert bad["status"] == "error" and "non-finite" in bad["error"], bad["error"]
    assert math.isnan(bad["test_acc"]) and math.isnan(bad["attack_ssim"]) and bad["pareto_rank"] == -1
    assert good["status"] == "ok" and finite(good["attack_ssim"]) and good["pareto_rank"] == 0
    assert not list(exp.glob("*/error.txt"))  # a diverged trial is a result, not a Ray failure: no retry
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    study = optuna.load_study(study_name="diverge",
                              storage=JournalStorage(JournalFileBackend(str(exp / "optuna_journal.log"))))
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "FAIL"]


@pytest.mark.ray
def test_dead_worker_is_retried_from_checkpoint(tmp_path, local_ray):
    from cem_bench.spaces import load_space
    path = write_space(tmp_path, "die", num_samples=1, max_concurrent=1, max_failures=1)
    exp = Path(search.run_search(load_space(path), storage=str(tmp_path / "res"), hooks=search_hooks.DieOnce(1)))
    from cem_bench.analysis.results import write_tables
    trials_path, epochs_path = write_tables(exp)
    trials = pd.read_parquet(trials_path)
    assert len(trials) == 1
    row = trials.iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["resumed_from_epoch"] == 1  # the second attempt started at epoch 2
    tdir = exp / row["trial_dir"]
    assert (tdir / search_hooks.DIE_MARKER).is_file() and (tdir / "error.txt").is_file()
    epochs = pd.read_parquet(epochs_path)
    assert epochs["epoch"].tolist() == [1, 2]
    # the trial's own record agrees: each epoch once over both attempts. (Ray's result.json is not asserted:
    # on a busy machine Ray may not have logged the killed attempt's epoch 1 while the project's records were
    # right, issue 37.)
    record = json.loads((tdir / schema.RESULT_FILE).read_text())
    assert [h["epoch"] for h in record["info"]["history"]] == [1, 2]


# ------------------------------------------------------------------------------- duplicate proposals
def test_searcher_does_not_repeat_a_configuration(tmp_path):
    """A seeded sampler over a small discrete space proposes copies; the searcher asks again instead, and
    only hands out a copy once nothing new is left (each copy would rerun an identical trial)."""
    from cem_bench.spaces import load_space
    params = {"cem.lambd": {"choice": [0, 4, 16]}, "cem.surrogate": {"choice": ["gmm", "gated_attention"]}}
    spec = load_space(write_space(tmp_path, "dups", num_samples=6, params=params,
                                  sampler={"name": "random", "seed": 0}))
    # a space may not ask for more samples than it has configurations (the parser refuses it); the searcher
    # must still survive it (an experiment started before that rule, resumed): 8 asked of 6
    import dataclasses
    spec = dataclasses.replace(spec, num_samples=8)
    from cem_bench.search.searcher import make_searcher
    searcher = make_searcher(spec, str(tmp_path / "exp")).searcher.searcher  # generator > limiter > ours
    keys = []
    for i in range(6):
        cfg = searcher.suggest(f"t{i}")
        keys.append((cfg["cem.lambd"], cfg["cem.surrogate"]))
        searcher.on_trial_complete(f"t{i}", {"test_acc": 0.5, "attack_ssim": 0.5, "status": "ok"})
    assert len(set(keys)) == 6, keys  # the space has exactly 6 configurations: every one, once
    assert searcher._duplicates_skipped > 0  # the seeded sampler did propose copies
    cfg = searcher.suggest("t6")  # nothing new left: a copy, after MAX_DUPLICATE_ASKS tries, not a hang
    assert (cfg["cem.lambd"], cfg["cem.surrogate"]) in set(keys)
    import optuna
    states = [t.state for t in searcher._ot_study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 6


def test_tpe_copy_is_replaced_by_a_new_configuration(tmp_path):
    """TPE asked again proposes the same point (its model is unchanged); the replacement must differ."""
    from cem_bench.spaces import load_space
    params = {"cem.lambd": {"choice": [0, 4, 16, 32]}, "cem.surrogate": {"choice": ["gmm", "gated_attention"]}}
    spec = load_space(write_space(tmp_path, "tpe", num_samples=8, params=params,
                                  sampler={"name": "tpe", "seed": 0, "n_startup_trials": 3}))
    import dataclasses
    spec = dataclasses.replace(spec, num_samples=10)   # as the test was written: 10 asked of 8 (see above)
    from cem_bench.search.searcher import make_searcher
    searcher = make_searcher(spec, str(tmp_path / "exp")).searcher.searcher
    keys = []
    for i in range(8):
        cfg = searcher.suggest(f"t{i}")
        keys.append((cfg["cem.lambd"], cfg["cem.surrogate"]))
        good = cfg["cem.lambd"] == 32 and cfg["cem.surrogate"] == "gmm"  # one clear winner pulls TPE to it
        searcher.on_trial_complete(f"t{i}", {"test_acc": 0.9 if good else 0.3, "attack_ssim": 0.2 if good else 0.5,
                                             "status": "ok"})
    assert len(set(keys)) == 8, keys


GRID = {"defense.noise_std": {"choice": [0.01, 0.1]}, "cem.lambd": {"choice": [0, 8, 16]},
        "cem.surrogate": {"choice": ["gmm", "slot_cross"], "when": {"cem.lambd": [8, 16]}}}


def test_grid_with_replicates_runs_every_cell_once_per_seed_and_tells_optuna_the_mean(tmp_path):
    """sampler grid: the 2 x (1 + 2 x 2) = 10 cells (lambda = 0 is one cell, not one per surrogate), each
    with both seeds, as 20 separate trials; Optuna gets one value per cell, the mean of its runs."""
    import optuna

    from cem_bench.search.searcher import make_searcher
    from cem_bench.spaces import load_space
    spec = load_space(write_space(tmp_path, "grid", num_samples=None, params=GRID, sampler={"name": "grid"},
                                  replicates=2, fixed={"seed": 5}))
    assert (spec.num_samples, spec.seeds, spec.runs) == (10, (5, 6), 20)
    searcher = make_searcher(spec, str(tmp_path / "exp")).searcher.searcher
    runs = []
    for i in range(spec.runs):
        cfg = searcher.suggest(f"t{i}")
        cell = tuple(sorted((k, v) for k, v in cfg.items() if k.startswith(("cem.", "defense.")) and k in GRID))
        runs.append((cell, cfg["seed"]))
        acc = 0.5 + 0.1 * (cfg["seed"] - 5)           # the two seeds differ by 0.1: the mean is +0.05
        searcher.on_trial_complete(f"t{i}", {"test_acc": acc, "attack_ssim": 0.3, "status": "ok"})
    assert len(set(runs)) == 20 and len({c for c, _ in runs}) == 10
    assert all(sum(1 for c, _ in runs if c == cell) == 2 for cell, _ in runs)
    assert not any(dict(c).get("cem.surrogate") for c, _ in runs if dict(c)["cem.lambd"] == 0)
    done = [t for t in searcher._ot_study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 10 and all(t.values[0] == pytest.approx(0.55) for t in done)


def test_grid_refuses_continuous_parameters_and_a_wrong_budget(tmp_path):
    from cem_bench.spaces import SpaceError, load_space
    params = dict(GRID, **{"cem.var_threshold": {"uniform": [0.1, 0.2]}})
    with pytest.raises(SpaceError, match="params.cem.var_threshold: sampler grid enumerates discrete values"):
        load_space(write_space(tmp_path, "g1", num_samples=None, params=params, sampler={"name": "grid"}))
    with pytest.raises(SpaceError, match="num_samples: 7 with sampler grid, whose space has 10 cells"):
        load_space(write_space(tmp_path, "g2", num_samples=7, params=GRID, sampler={"name": "grid"}))
    with pytest.raises(SpaceError, match="num_samples: missing"):
        load_space(write_space(tmp_path, "g3", num_samples=None, params=GRID))
    with pytest.raises(SpaceError, match="seed is set per replicate"):
        load_space(write_space(tmp_path, "g4", params={"seed": {"choice": [1, 2]}}, replicates=2))



def test_replicate_queue_survives_a_searcher_restore(tmp_path):
    """--resume restores the searcher from its saved state: runs queued for a configuration whose leader
    already started are still served, so every (cell, seed) runs exactly once across the restart."""
    from cem_bench.search.searcher import make_searcher
    from cem_bench.spaces import load_space
    spec = load_space(write_space(tmp_path, "gr", num_samples=None, params=GRID, sampler={"name": "grid"},
                                  replicates=3))
    first = make_searcher(spec, str(tmp_path / "exp")).searcher.searcher
    seen = []
    for i in range(4):                                 # a leader, its two replicates, the next leader
        cfg = first.suggest(f"t{i}")
        seen.append((tuple(sorted((k, cfg.get(k)) for k in GRID)), cfg["seed"]))
        first.on_trial_complete(f"t{i}", {"test_acc": 0.5, "attack_ssim": 0.3, "status": "ok"})
    first.save(str(tmp_path / "searcher.pkl"))
    second = make_searcher(spec, str(tmp_path / "exp")).searcher.searcher
    second.restore(str(tmp_path / "searcher.pkl"))
    for i in range(4, spec.runs):
        cfg = second.suggest(f"t{i}")
        seen.append((tuple(sorted((k, cfg.get(k)) for k in GRID)), cfg["seed"]))
        second.on_trial_complete(f"t{i}", {"test_acc": 0.5, "attack_ssim": 0.3, "status": "ok"})
    assert len(seen) == 30 and len(set(seen)) == 30 and len({c for c, _ in seen}) == 10


@pytest.mark.ray
def test_paper_grid_end_to_end(tmp_path, monkeypatch, capsys):
    """The shipped paper_grid_synthetic.yaml through Ray at a tinier size (its own keys, trimmed to one σ, two
    surrogates and two seeds: 3 cells x 2 seeds), each trial exactly once, configs.parquet with one row of two
    runs per cell, and the paper-style table with the loss scale each CEM cell used."""
    import yaml
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    shipped = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "search_spaces",
                                               "paper_grid_synthetic.yaml")))
    shipped["replicates"] = 2
    shipped["params"]["defense.noise_std"] = {"choice": [0.1]}
    shipped["params"]["cem.surrogate"]["choice"] = ["gmm", "gated_attention"]
    space = str(tmp_path / "paper_grid_synthetic.yaml")
    with open(space, "w") as fh:
        fh.write(yaml.safe_dump(shipped))
    sets = [a for k, v in TINY.items() if k != "train.device" for a in ("--set", f"{k}={v}")]
    storage = tmp_path / "res"
    rc = cli.main(["search", space, "--storage", str(storage), *sets])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    exp = storage / "paper_grid_synthetic"
    trials = pd.read_parquet(exp / "trials.parquet")
    assert len(trials) == 6 and (trials["status"] == "ok").all()
    runs = set(zip(trials["config.cem.lambd"], trials["config.cem.surrogate"].where(trials["config.cem.lambd"] > 0),
                   trials["config.seed"]))
    assert len(runs) == 6 and {s for *_, s in runs} == {0, 1}
    configs = pd.read_parquet(exp / "configs.parquet")
    assert len(configs) == 3 and (configs["runs"] == 2).all() and (configs["runs_ok"] == 2).all()
    assert configs["test_acc_mean"].map(finite).all() and configs["test_acc_std"].map(finite).all()
    assert cli.main(["table", str(exp)]) == 0
    table = capsys.readouterr().out
    assert "| test_acc | λ=0 | λ=16 gated_attention | λ=16 gmm |" in table and "(2)" in table
    # cem.strength: gated_attention matched gmm on each run's encoder (two runs), gmm is the reference at 1
    assert "| cem loss scale | λ=0 | λ=16 gated_attention | λ=16 gmm |" in table
    assert re.search(r"\| σ=0.1 \|  \| [\d.e+-]+ ± [\d.e+-]+ matched \(2\) \| 1 fixed \|", table), table
    assert (trials["cem_strength"].where(trials["config.cem.lambd"] > 0).dropna() ==
            trials["config.cem.surrogate"].where(trials["config.cem.lambd"] > 0).dropna().map(
                {"gmm": "fixed", "gated_attention": "matched"})).all()


# ------------------------------------------------------------------ a full disk
def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


@pytest.mark.ray
def test_a_full_disk_stops_the_search_and_resume_finishes_it(tmp_path):
    """A 3 MiB tmpfs as --storage (where the platform lets the test mount one; else the trainable's test hook
    search_hooks.FullWhile fails every checkpoint with ENOSPC while a marker file exists): the search stops at the first
    out-of-space failure with one message and exit 2; once space is freed, --resume finishes every trial once."""
    n = 4
    space = write_space(tmp_path, "full", num_samples=n, max_concurrent=2, fixed={"train.epochs": 3})
    disk = tmp_path / "disk"
    mounted = _mount_tmpfs(disk, "3m")
    env = subprocess_env()
    marker = tmp_path / "disk-is-full"
    search_cmd = cli_cmd
    if not mounted:
        disk.mkdir(exist_ok=True)
        marker.touch()
        env = hooks_env(env)
        search_cmd = functools.partial(full_while_cmd, marker)
    try:
        first = subprocess.run(search_cmd(space, "--storage", str(disk)), env=env, capture_output=True, text=True,
                               timeout=300)
        assert first.returncode == 2, (first.stdout[-3000:], first.stderr[-3000:])
        assert "Traceback" not in first.stderr + first.stdout, first.stderr[-6000:]
        last = first.stderr.strip().splitlines()[-1]
        assert last.startswith(f"cem-bench: the storage {disk} is full (") and "MiB free" in last, last
        assert "--resume" in last, last
        if mounted:
            assert f"warning: {disk} has 3.0 MiB free; this search writes about" in first.stdout, first.stdout[-3000:]
        results_before = list((disk / "full").glob(f"*/{schema.RESULT_FILE}"))
        assert len(results_before) < n

        if mounted:
            subprocess.run(["mount", "-o", "remount,size=128m", str(disk)], check=True)
        else:
            marker.unlink()
        second = subprocess.run(search_cmd(space, "--storage", str(disk), "--resume"), env=env, capture_output=True,
                                text=True, timeout=300)
        assert second.returncode == 0, (second.stdout[-3000:], second.stderr[-3000:])
        trials = pd.read_parquet(disk / "full" / "trials.parquet")
        assert len(trials) == n and trials["trial_id"].is_unique, trials[["trial_id", "status", "error"]]
        assert (trials["status"] == "ok").all(), trials[["trial_id", "status", "error"]]
        assert (trials["epochs_done"] == 3).all()
    finally:
        if mounted and subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            # a Ray process that still holds a file there makes it busy: detach it now, freed when released
            # (a plain umount that failed left the tmpfs mounted under pytest's tmp dirs after a CI run)
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.ray
def test_a_full_disk_stops_a_resumed_search_too(tmp_path):
    """A search resumed while the storage is still full stops as the first one did (exit 2, the same message):
    Tune calls the storage guard that the first driver pickled with the experiment, and that copy reports into
    the resumed driver's own guard (search/driver.py), which the driver reads after fit(). The hook, not a
    tmpfs, fills the disk: the trials fail where the guard looks (their error.txt), not in Ray's own writes."""
    space = write_space(tmp_path, "fullagain", num_samples=2, max_concurrent=2)
    disk, marker = tmp_path / "disk", tmp_path / "disk-is-full"
    disk.mkdir()
    marker.touch()
    env = hooks_env(subprocess_env())
    for extra in ([], ["--resume"]):
        run = subprocess.run(full_while_cmd(marker, space, "--storage", str(disk), *extra), env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 2, (extra, run.stdout[-3000:], run.stderr[-3000:])
        assert "Traceback" not in run.stderr + run.stdout, run.stderr[-6000:]
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith(f"cem-bench: the storage {disk} is full (") and "ran out of space" in last, last
        assert "--resume" in last, last
        assert re.search(rf"cem-bench: trial \S+ failed for lack of space in {re.escape(str(disk))}; stopping the "
                         rf"search", run.stdout), (extra, run.stdout[-3000:])
    assert "resuming" in run.stdout, run.stdout[-3000:]


def test_baseline_and_confirmation_run_exactly_once_across_restores(tmp_path):
    """The searcher hands out the λ = 0 baseline first (2 σ cells x 3 seeds), then the search's 5 runs, waits
    for the last of them, then the 2 best configurations again with 3 new seeds each, then FINISHED; restored
    from its saved state at any point (as --resume does) it hands out none of these twice and misses none."""
    from ray.tune.search import Searcher

    from cem_bench.search.searcher import make_searcher
    from cem_bench.spaces import load_space
    params = {"defense.noise_std": {"choice": [0.05, 0.1]}, "cem.lambd": {"loguniform": [1, 32]},
              "cem.surrogate": {"choice": ["gmm", "slot_cross"]}}
    spec = load_space(write_space(tmp_path, "floor", num_samples=5, params=params, baseline={"replicates": 3},
                                  confirm={"top": 2, "replicates": 3}))
    assert (spec.baseline_runs, spec.runs, spec.confirm_runs, spec.total_runs) == (6, 5, 6, 17)
    assert spec.baseline_seeds == (0, 1, 2) and spec.confirm_seeds == (3, 4, 5)

    def result(cfg):   # a larger λ: more private, less accurate; slot_cross is dominated by gmm
        lam, penalty = cfg["cem.lambd"], 0.5 * (cfg["cem.surrogate"] != "gmm")
        return {"test_acc": 1 - lam / 100 - penalty, "attack_ssim": 1 - lam / 50 + penalty, "status": "ok"}

    searcher = make_searcher(spec, str(tmp_path / "exp")).searcher.searcher
    handed, running = [], {}
    n = 0
    restores = {3, 9, 11, 13}                    # inside the baseline, the search, the wait, the confirmation
    while True:
        if n in restores:
            searcher.save(str(tmp_path / "s.pkl"))
            searcher = make_searcher(spec, str(tmp_path / "exp")).searcher.searcher
            searcher.restore(str(tmp_path / "s.pkl"))
            restores.discard(n)
        cfg = searcher.suggest(f"t{n}")
        if cfg is None:                          # the confirmation waits for the running search runs
            assert running and all(c.get("role") is None for c in running.values())
            for tid, c in list(running.items()):
                searcher.on_trial_complete(tid, result(c))
                del running[tid]
            continue
        if cfg == Searcher.FINISHED:
            break
        handed.append(cfg)
        if cfg.get("role") is None and len([c for c in handed if c.get("role") is None]) <= 3:
            searcher.on_trial_complete(f"t{n}", result(cfg))   # the search's first runs finish at once
        elif cfg.get("role") is None:
            running[f"t{n}"] = cfg                              # the last two are still running
        else:
            searcher.on_trial_complete(f"t{n}", {"test_acc": 0.5, "attack_ssim": 0.5, "status": "ok"})
        n += 1
    roles = [c.get("role") or "search" for c in handed]
    assert roles == ["baseline"] * 6 + ["search"] * 5 + ["confirm"] * 6, roles
    base = sorted((c["defense.noise_std"], c["seed"], c["cem.lambd"]) for c in handed[:6])
    assert base == [(s, seed, 0.0) for s in (0.05, 0.1) for seed in (0, 1, 2)]
    search = handed[6:11]
    # the front first (gmm's runs), within it the largest exclusive hypervolume (refs 0 and 1 of write_space)
    from cem_bench.frontier import hypervolume_contributions, pareto_ranks
    values = np.array([[result(c)["test_acc"], result(c)["attack_ssim"]] for c in search])
    ranks = pareto_ranks(values, ["max", "min"])
    gain = np.zeros(len(search))
    for r in set(ranks):
        gain[ranks == r] = hypervolume_contributions(values[ranks == r], ["max", "min"], [0.0, 1.0])
    best = [search[i] for i in sorted(range(len(search)), key=lambda i: (ranks[i], -gain[i], -values[i, 0]))[:2]]
    confirm = handed[11:]
    assert sorted((c["cem.lambd"], c["seed"]) for c in confirm) == sorted(
        (c["cem.lambd"], s) for c in best for s in (3, 4, 5))
    assert all({k: v for k, v in c.items() if k not in ("seed", "role")} in
               [{k: v for k, v in b.items() if k != "seed"} for b in best] for c in confirm)


@pytest.mark.ray
def test_moasha_search_stops_dominated_trials_and_a_killed_driver_resumes_it(tmp_path, ray_cluster):
    """A MOASHA search (rungs at epochs 1 and 2 of 4) with a baseline and a confirmation, its driver killed once
    the scheduler has stopped a trial, finished by --resume: every run exactly once; the scheduler's decisions
    from before the kill kept; trials it stopped are "stopped" at a rung in trials.parquet and PRUNED in
    Optuna's study, never errors; the baseline's and the confirmation's runs are never stopped."""
    space = write_space(tmp_path, "moasha", num_samples=6, max_concurrent=2, baseline={"replicates": 3},
                        confirm={"top": 1, "replicates": 3}, fixed={"train.epochs": 4},
                        scheduler={"name": "moasha", "grace_epochs": 1, "reduction_factor": 2})
    storage = tmp_path / "res"
    exp = storage / "moasha"
    state = exp / schema.SCHEDULER_FILE
    kill_driver_when(tmp_path, space, storage, ray_cluster, 240,
                     lambda: state.exists() and json.loads(state.read_text() or "{}").get("decisions")
                     and list(exp.glob("experiment_state-*.json")))
    before = {d["trial_id"]: d["epoch"] for d in json.loads(state.read_text())["decisions"]}
    proc = subprocess.run(cli_cmd(space, "--storage", str(storage), "--address", ray_cluster, "--resume"),
                          env=subprocess_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    after = {d["trial_id"]: d["epoch"] for d in json.loads(state.read_text())["decisions"]}
    trials = pd.read_parquet(exp / "trials.parquet")
    # kept: every decision about a trial the experiment has (a trial the killed driver started after its last
    # snapshot is not in it: its sample ran again under a new id, and the scheduler forgot it)
    assert {t: e for t, e in before.items() if t in set(trials["trial_id"])}.items() <= after.items()
    assert trials["trial_id"].is_unique and len(trials) == 3 + 6 + 3, trials[["trial_id", "role", "status"]]
    # a stopped trial's config is what the searcher gave (params.json): no seed key means the default seed 0
    runs = trials["config_id"] + "/" + trials["config.seed"].fillna(0).astype(int).astype(str)
    assert runs.is_unique
    assert set(trials["status"]) <= {"ok", "stopped"}, trials[["trial_id", "status", "error"]]
    assert (trials.loc[trials["role"] != "search", "status"] == "ok").all()
    stopped = trials[trials["status"] == "stopped"]
    assert len(stopped) >= 1 and set(stopped["trial_id"]) == set(after)
    assert set(stopped["stopped_at_epoch"].astype(int)) <= {1, 2}
    assert stopped["stop_reason"].str.contains("outside the top").all()
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    study = optuna.load_study(study_name="moasha",
                              storage=JournalStorage(JournalFileBackend(str(exp / "optuna_journal.log"))))
    state_of = {t.user_attrs["ray_trial_id"]: t.state.name for t in study.trials}
    search = trials[trials["role"] == "search"].set_index("trial_id")["status"]
    assert {t: state_of.get(t) for t in search.index} == \
        {tid: ("PRUNED" if s == "stopped" else "COMPLETE") for tid, s in search.items()}
    # the journal is the mirror of what Optuna was told, append-only: trials the killed driver stopped after its
    # last snapshot stay in it as PRUNED (Ray's restored experiment does not have them)
    assert all(state_of[t] == "PRUNED" and t in before for t in set(state_of) - set(search.index))
