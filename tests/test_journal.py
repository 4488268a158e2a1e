"""The searcher's Optuna journal (cem_bench.search.searcher), without Ray: a remote experiment's cached copy is
its own (not shared with a same-named experiment elsewhere, empty for a new search, continued by a resume), and
a journal whose last line was cut short is readable again after the next update. The searcher is built as
Tune gets it (make_searcher) and driven by hand; the upload to s3:// is a copy into a local folder."""

from __future__ import annotations

import os
import shutil

import pytest
from test_search import write_space

METRICS = {"attack_ssim": 0.5, "status": "ok"}


def ray_trial_ids(path: str, name: str) -> list[str]:
    """The Ray trial ids of the trials in the journal file ``path`` (loaded as optuna-dashboard would)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    study = optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(path)))
    return sorted(t.user_attrs["ray_trial_id"] for t in study.get_trials(deepcopy=False))


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """HOME in tmp_path (the journal cache is ~/.cache/cem-bench/journals) and uploads to s3://B/K copied to
    tmp_path/s3/B/K; returns that folder."""
    from cem_bench.search import searcher
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "s3"

    def copy_file(src: str, dst: str) -> None:
        assert dst.startswith("s3://"), dst
        out = root / dst[len("s3://"):]
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out)
    monkeypatch.setattr(searcher, "copy_file", copy_file)
    return root


def run(searcher, ids) -> None:
    for i, tid in enumerate(ids):
        assert isinstance(searcher.suggest(tid), dict)
        searcher.on_trial_complete(tid, {"test_acc": 0.1 * (i + 1), **METRICS})


def test_same_named_experiments_in_two_buckets_keep_their_own_journal(tmp_path, bucket):
    """Two experiments named alike (s3://bucketA/... and s3://bucketB/...): each uploaded journal holds its own
    trials only, and so does a new search made again under bucketA's URI."""
    from cem_bench.search.searcher import journal_target, make_searcher
    from cem_bench.spaces import load_space
    spec = load_space(write_space(tmp_path, "same", num_samples=3))
    a, b = "s3://bucketA/results/same", "s3://bucketB/results/same"
    run(make_searcher(spec, a).searcher.searcher, ["aaaa0", "aaaa1"])
    run(make_searcher(spec, b).searcher.searcher, ["bbbb0"])
    assert ray_trial_ids(str(bucket / "bucketA/results/same/optuna_journal.log"), "same") == ["aaaa0", "aaaa1"]
    assert ray_trial_ids(str(bucket / "bucketB/results/same/optuna_journal.log"), "same") == ["bbbb0"]
    assert journal_target(a, "same")[0] != journal_target(b, "same")[0]
    # the experiment made again where A was (its folder deleted): a new search, a new journal
    shutil.rmtree(bucket / "bucketA")
    run(make_searcher(spec, a).searcher.searcher, ["cccc0"])
    assert ray_trial_ids(str(bucket / "bucketA/results/same/optuna_journal.log"), "same") == ["cccc0"]


def test_a_file_uri_experiment_keeps_its_journal_in_its_folder(tmp_path, monkeypatch):
    """2026-12-07 probe: with --storage file:///DIR the journal went to a relative folder named "file:" in the
    current one (git status showed it in the repository), not beside the experiment's tables."""
    from cem_bench.search.searcher import journal_target, make_searcher
    from cem_bench.spaces import load_space
    monkeypatch.chdir(tmp_path)
    exp = tmp_path / "results" / "fileuri"
    exp.mkdir(parents=True)
    assert journal_target(f"file://{exp}", "fileuri") == (str(exp / "optuna_journal.log"), None)
    spec = load_space(write_space(tmp_path / "spaces", "fileuri", num_samples=2))
    run(make_searcher(spec, f"file://{exp}").searcher.searcher, ["ffff0"])
    assert ray_trial_ids(str(exp / "optuna_journal.log"), "fileuri") == ["ffff0"]
    assert not (tmp_path / "file:").exists()


def test_a_resumed_search_continues_its_cached_journal(tmp_path, bucket):
    """--resume unpickles the searcher Tune saved with the experiment (never builds a new one): its journal
    keeps what the killed driver copied into it after the searcher's last checkpoint, and goes on from there."""
    import ray.cloudpickle as cloudpickle

    from cem_bench.search.searcher import make_searcher
    from cem_bench.spaces import load_space
    spec = load_space(write_space(tmp_path, "res", num_samples=4))
    exp = "s3://bucketA/results/res"
    generator = make_searcher(spec, exp)
    pickled = cloudpickle.dumps(generator)                  # tuner.pkl
    first = generator.searcher.searcher
    run(first, ["r0"])
    first.save(str(tmp_path / "searcher.pkl"))              # the searcher's last checkpoint
    run(first, ["r1"])                                      # copied into the journal, then the driver is killed
    second = cloudpickle.loads(pickled).searcher.searcher
    second.restore(str(tmp_path / "searcher.pkl"))
    run(second, ["r2"])
    assert ray_trial_ids(str(bucket / "bucketA/results/res/optuna_journal.log"), "res") == ["r0", "r1", "r2"]


def test_a_journal_cut_off_mid_line_is_readable_after_the_next_update(tmp_path):
    """A kill (or a full disk) during Optuna's append leaves the last line without its newline; the next update
    must not glue its record onto it: the journal loads afterwards, with every trial."""
    from cem_bench.search.searcher import make_searcher
    from cem_bench.spaces import load_space
    spec = load_space(write_space(tmp_path, "cut", num_samples=3))
    exp = tmp_path / "exp"
    searcher = make_searcher(spec, str(exp)).searcher.searcher
    run(searcher, ["t0"])
    journal = exp / "optuna_journal.log"
    data = journal.read_bytes()
    assert data.endswith(b"\n") and ray_trial_ids(str(journal), "cut") == ["t0"]
    journal.write_bytes(data[:-20])                        # t0's record, half written
    run(searcher, ["t1", "t2"])
    assert journal.read_bytes().endswith(b"\n")
    assert ray_trial_ids(str(journal), "cut") == ["t0", "t1", "t2"]   # t0 copied again, each on a line of its own


@pytest.mark.parametrize("content, kept", [(b"", b""), (b"{}\n", b"{}\n"), (b'{"op', b""),
                                           (b'{}\n{"a":1}\n{"op', b'{}\n{"a":1}\n')])
def test_drop_unfinished_line(tmp_path, content, kept):
    from cem_bench.search.searcher import drop_unfinished_line
    path = tmp_path / "j.log"
    path.write_bytes(content)
    assert drop_unfinished_line(str(path)) == len(content) - len(kept)
    assert path.read_bytes() == kept
    assert drop_unfinished_line(str(tmp_path / "missing.log")) == 0 and not os.path.exists(tmp_path / "missing.log")


def test_a_trial_that_errored_runs_again_after_resume_and_counts_as_it_ends(tmp_path):
    """--resume runs Ray's errored trials again (resume_errored). The restored searcher had them finished and
    failed: the confirmation was planned while the rerun ran (and without it), and the rerun's result never
    reached the study (Ray's OptunaSearch drops a second completion), so the journal kept FAIL where the tables
    said ok. Now the rerun is waited for, chosen on, and recorded as a trial of its own beside the failure."""
    import ray.cloudpickle as cloudpickle

    from cem_bench.search.searcher import make_searcher
    from cem_bench.spaces import load_space
    spec = load_space(write_space(tmp_path, "rerun", num_samples=3, max_concurrent=3,
                                  confirm={"top": 1, "replicates": 3}))
    exp = tmp_path / "exp"
    generator = make_searcher(spec, str(exp))
    pickled = cloudpickle.dumps(generator)
    configs = {tid: generator.searcher.suggest(tid) for tid in ("a", "b", "c")}   # through the limiter, as Tune
    first = generator.searcher
    first.on_trial_complete("a", {"test_acc": 0.80, "attack_ssim": 0.50, "status": "ok"})
    first.on_trial_complete("b", {"test_acc": 0.70, "attack_ssim": 0.60, "status": "ok"})
    first.on_trial_complete("c", None, error=True)           # its retries used up: Ray's ERROR
    generator.save_to_dir(str(tmp_path), "s1")               # the experiment checkpoint: the limiter's state too
    restored = cloudpickle.loads(pickled)                    # --resume, through the generator Tune drives
    restored.restore_from_dir(str(tmp_path))
    limiter = restored.searcher
    assert limiter.suggest("d") is None                      # c runs again: the confirmation waits for it
    limiter.on_trial_complete("c", {"test_acc": 0.95, "attack_ssim": 0.10, "status": "ok"})
    confirm = limiter.suggest("d")
    assert confirm["role"] == "confirm" and confirm["cem.lambd"] == configs["c"]["cem.lambd"], (confirm, configs)
    limiter.on_trial_complete("d", {"test_acc": 0.9, "attack_ssim": 0.1, "status": "ok"})
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    study = optuna.load_study(study_name="rerun",
                              storage=JournalStorage(JournalFileBackend(str(exp / "optuna_journal.log"))))
    c = [(t.state.name, t.values) for t in study.get_trials() if t.user_attrs["ray_trial_id"] == "c"]
    assert c == [("FAIL", None), ("COMPLETE", [0.95, 0.10])], c


def test_a_confirmation_planned_before_resume_is_planned_again_after_the_reruns(tmp_path):
    """Every search run had failed in Ray, so the first driver planned the confirmation as empty (FINISHED); after
    --resume reran them and they finished ok, the empty plan stood: no confirmation ran. It is planned again."""
    import ray.cloudpickle as cloudpickle

    from cem_bench.search.searcher import make_searcher
    from cem_bench.spaces import load_space
    spec = load_space(write_space(tmp_path, "rerun", num_samples=2, max_concurrent=3,
                                  confirm={"top": 1, "replicates": 3}))
    generator = make_searcher(spec, str(tmp_path / "exp"))
    generator._total_samples = spec.total_runs                # what Tune's add_configurations sets (run.py)
    pickled = cloudpickle.dumps(generator)
    first = generator.searcher
    configs = {tid: first.suggest(tid) for tid in ("a", "b")}
    first.on_trial_complete("a", None, error=True)
    first.on_trial_complete("b", None, error=True)
    # as Tune asks (SearchGenerator.create_trial_if_possible): nothing to confirm, the generator is finished, and
    # Ray saves and restores that flag with it
    assert generator.create_trial_if_possible({}) is None and generator.is_finished()
    generator.save_to_dir(str(tmp_path), "s1")
    restored = cloudpickle.loads(pickled)
    restored.restore_from_dir(str(tmp_path))
    assert not restored.is_finished()                         # a and b run again, then the confirmation
    limiter = restored.searcher
    assert limiter.suggest("d") is None                      # a and b run again: the confirmation waits
    limiter.on_trial_complete("a", {"test_acc": 0.8, "attack_ssim": 0.5, "status": "ok"})
    limiter.on_trial_complete("b", {"test_acc": 0.7, "attack_ssim": 0.6, "status": "ok"})
    assert not restored.is_finished()                         # so Tune still asks (next_trial), and gets:
    confirm = limiter.suggest("d")
    assert confirm["role"] == "confirm" and confirm["cem.lambd"] == configs["a"]["cem.lambd"], (confirm, configs)


def test_a_confirmation_already_handed_out_is_not_planned_again(tmp_path):
    """Once a confirmation run was handed out, its plan is the experiment's: a reopened run does not replace it."""
    from cem_bench.search.searcher import make_searcher
    from cem_bench.spaces import load_space
    spec = load_space(write_space(tmp_path, "kept", num_samples=2, max_concurrent=3,
                                  confirm={"top": 1, "replicates": 3}))
    queue = make_searcher(spec, str(tmp_path / "exp")).searcher.searcher
    for tid in ("a", "b"):
        queue.suggest(tid)
    queue.on_trial_complete("a", {"test_acc": 0.8, "attack_ssim": 0.5, "status": "ok"})
    queue.on_trial_complete("b", None, error=True)
    assert queue.suggest("c")["role"] == "confirm"
    plan = list(queue._confirm_queue)
    assert queue.reopen_errored() == ["b"]
    assert queue._confirm_queue == plan


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_discrete_space_runs_every_configuration_once_before_any_copy(tmp_path, seed):
    """num_samples equal to a discrete space's 36 configurations: the replacement of a duplicate proposal was up
    to 20 random draws, which miss the last unseen cell more often than not, so a copy ran (a repeat of the same
    seed) and a configuration never did, on every TPE seed tried. The last cells are now taken from the list."""
    from cem_bench.search.searcher import make_searcher
    from cem_bench.spaces import load_space
    noise = [0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4]
    spec = load_space(write_space(tmp_path, "full", num_samples=36, sampler={"name": "tpe", "seed": seed},
                                  params={"cem.lambd": {"choice": [4, 8, 16, 32]},
                                          "defense.noise_std": {"choice": noise}}))
    searcher = make_searcher(spec, str(tmp_path / "exp")).searcher.searcher
    seen = []
    for i in range(36):
        c = searcher.suggest(f"t{i}")
        seen.append((c["cem.lambd"], c["defense.noise_std"]))
        searcher.on_trial_complete(f"t{i}", {"test_acc": c["cem.lambd"] / 40, "attack_ssim": c["defense.noise_std"],
                                             "status": "ok"})
    assert len(set(seen)) == 36


def test_a_replicate_rerun_does_not_count_its_configuration_twice(tmp_path):
    """A group whose replicate errored was told the mean of its other runs (COMPLETE); its rerun after --resume
    added a second COMPLETE trial of the same parameters, counted twice by the sampler and the dashboard."""
    import ray.cloudpickle as cloudpickle

    from cem_bench.search.searcher import make_searcher
    from cem_bench.spaces import load_space
    spec = load_space(write_space(tmp_path, "group", num_samples=1, max_concurrent=3, replicates=3))
    exp = tmp_path / "exp"
    generator = make_searcher(spec, str(exp))
    pickled = cloudpickle.dumps(generator)
    limiter = generator.searcher
    for tid in ("a", "b", "c"):
        assert limiter.suggest(tid) is not None
    limiter.on_trial_complete("a", {"test_acc": 0.7, "attack_ssim": 0.4, "status": "ok"})
    limiter.on_trial_complete("b", {"test_acc": 0.7, "attack_ssim": 0.4, "status": "ok"})
    limiter.on_trial_complete("c", None, error=True)
    generator.save_to_dir(str(tmp_path), "s1")
    restored = cloudpickle.loads(pickled)
    restored.restore_from_dir(str(tmp_path))
    restored.searcher.on_trial_complete("c", {"test_acc": 0.9, "attack_ssim": 0.1, "status": "ok"})
    study = restored.searcher.searcher._ot_study
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE"]


def test_a_file_uri_search_builds_its_report_in_place(tmp_path, monkeypatch, capsys):
    """The same probe: `search --storage file:///DIR` ended "report 0.0 s" and advised `report file:///… --out
    results/…` (reads the storage), though a file:// path is this machine's folder, read in place."""
    from cem_bench import cli, search
    from cem_bench.analysis import report
    exp = tmp_path / "results" / "x"
    exp.mkdir(parents=True)
    built = []
    monkeypatch.setattr(search, "search_command", lambda args: {
        "experiment": f"file://{exp}", "name": "x", "ok": 1, "error": 0, "seconds": 0.0, "stats": {}})
    monkeypatch.setattr(report, "build_report", lambda path: built.append(path) or os.path.join(path, "report"))
    assert cli.main(["search", "spaces.yaml", "--storage", f"file://{tmp_path / 'results'}"]) == 0
    assert built == [str(exp)] and "(reads the storage)" not in capsys.readouterr().out
