"""A results folder is shared, and cem-bench often runs as root: links, pipes and paths planted in one must
never make a command write outside the folders it was given, copy another file into a report, or hang.

Each class of planted input is tried against the real commands (``cem-bench report``, the remote fetch,
the tables' readers) and against the primitives they all go through (``storage.write_bytes``,
``storage.read_regular``, ``storage.publish``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import alarm_after, fake_object_storage
from test_report import write_results

from cem_bench import storage
from cem_bench.analysis.report import build_report
from cem_bench.cli import main
from cem_bench.storage import UnsafePath

SECRET = b"root's private file\n"


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside the results with one file in it: nothing may change here."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_bytes(SECRET)
    return d


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(autouse=True)
def no_hang():
    yield from alarm_after(60, "a file was opened that never answers")


# ---------------------------------------------------------------- the report
@pytest.mark.parametrize("name", ["frontier.csv", "hypervolume.png", "index.html"])
def test_a_link_planted_in_report_is_replaced_not_written_through(tmp_path, outside, name):
    res = write_results(tmp_path / "R", n=6, vary_params=False)
    (res / "report").mkdir()
    os.symlink(outside / "secret.txt", res / "report" / name)
    before = snapshot(outside)
    index = build_report(res)
    assert snapshot(outside) == before
    assert index == res / "report" / "index.html"
    planted = res / "report" / name
    assert planted.is_file() and not planted.is_symlink() and planted.read_bytes() != SECRET


def test_a_planted_report_record_removes_nothing_outside_the_report_or_through_a_link(tmp_path, outside):
    """The list of a report's files (REPORT_RECORD) names what the next report removes: planted in a shared
    results folder, its names outside report/, through a linked folder, or of a folder, remove nothing there."""
    from cem_bench.schema import REPORT_RECORD
    res = write_results(tmp_path / "R", n=6, vary_params=False)
    report = res / "report"
    report.mkdir()
    os.symlink(outside, report / "via")
    (report / "keep").mkdir()
    (report / "keep" / "x.txt").write_bytes(b"kept")
    planted = ["../trials.parquet", str(outside / "secret.txt"), "via/secret.txt", "keep", "galleries/../../x",
               "/etc/passwd", str(res / "trials.parquet")]
    (report / REPORT_RECORD).write_text("\n".join(planted) + "\n")
    before, trials = snapshot(outside), (res / "trials.parquet").read_bytes()
    build_report(res)
    assert snapshot(outside) == before and (res / "trials.parquet").read_bytes() == trials
    assert (report / "via").is_symlink() and (report / "keep" / "x.txt").read_bytes() == b"kept"
    # the list itself a link (to a list naming the outside file) or a pipe: never read, replaced by a file
    (outside / "list").write_text(str(outside / "secret.txt") + "\n")
    (report / REPORT_RECORD).unlink()
    os.symlink(outside / "list", report / REPORT_RECORD)
    build_report(res)
    assert (outside / "secret.txt").read_bytes() == SECRET and not (report / REPORT_RECORD).is_symlink()
    (report / REPORT_RECORD).unlink()
    os.mkfifo(report / REPORT_RECORD)
    build_report(res)                 # a pipe: not read (it would block), and renamed over by the new list
    assert (report / REPORT_RECORD).is_file() and (outside / "secret.txt").read_bytes() == SECRET


@pytest.mark.parametrize("link", ["report", "report/galleries"])
def test_a_linked_report_folder_is_refused_before_anything_is_written(tmp_path, outside, link, capsys):
    res = write_results(tmp_path / "R", n=6, vary_params=False)
    (res / link).parent.mkdir(exist_ok=True)
    os.symlink(outside, res / link)
    before, inside = snapshot(outside), snapshot(res)
    assert main(["report", str(res)]) == 2
    err = capsys.readouterr().err
    assert f"{res / link} is a symbolic link (to {outside})" in err and "Remove the link" in err
    assert len(err.strip().splitlines()) == 1
    assert snapshot(outside) == before
    assert snapshot(res) == inside


def test_out_named_by_the_user_may_be_a_link_of_theirs(tmp_path):
    """The folder the user named is theirs to point anywhere; only what lies below it is not followed."""
    res = write_results(tmp_path / "R", n=6, vary_params=False)
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "mine")
    index = build_report(res, tmp_path / "mine")
    assert (tmp_path / "real" / "index.html").is_file() and index == tmp_path / "mine" / "index.html"


def test_a_linked_recon_png_is_not_copied_into_the_gallery(tmp_path, outside):
    res = write_results(tmp_path / "R", n=6, vary_params=False)
    recons = sorted(res.rglob("recon.png"))
    assert recons
    for p in recons:
        p.unlink()
        os.symlink(outside / "secret.txt", p)
    build_report(res)
    copied = [p.read_bytes() for p in (res / "report").rglob("*") if p.is_file()]
    assert SECRET not in copied and not any(SECRET in c for c in copied)


def test_a_trial_dir_that_leaves_the_folder_is_ignored(tmp_path, outside):
    """trial_dir comes from the table: ``../x`` or an absolute path elsewhere is never read or written."""
    import pandas as pd
    res = write_results(tmp_path / "R", n=6, vary_params=False)
    (outside / "t").mkdir()
    (outside / "t" / "recon.png").write_bytes(SECRET)
    t = pd.read_parquet(res / "trials.parquet")
    t["trial_dir"] = [os.path.relpath(outside / "t", res), str(outside / "t")] * (len(t) // 2) + \
        ["../" * 5 + "etc"] * (len(t) % 2)
    (res / "trials.parquet").unlink()
    (res / "configs.parquet").unlink(missing_ok=True)
    (res / "cem_bench_files.json").unlink(missing_ok=True)
    t.to_parquet(res / "trials.parquet")
    build_report(res)
    assert not any(SECRET == p.read_bytes() for p in (res / "report").rglob("*.png"))


def test_a_remote_report_keeps_every_file_under_out(tmp_path, monkeypatch):
    """`report URI --out o1/o2/o3` with a trial_dir of ../../x/PLANT: the fetch writes only under o1/o2/o3
    (issue 39, item 2: it wrote o1/o2/x/PLANT/recon.png)."""
    import pandas as pd
    bucket = tmp_path / "bucket" / "res"
    write_results(bucket, n=6, vary_params=False)
    t = pd.read_parquet(bucket / "trials.parquet")
    t["trial_dir"] = "../../x/PLANT"
    for f in ("trials.parquet", "configs.parquet", "cem_bench_files.json"):
        (bucket / f).unlink(missing_ok=True)
    t.to_parquet(bucket / "trials.parquet")
    (bucket.parent / "x" / "PLANT").mkdir(parents=True)
    (bucket.parent / "x" / "PLANT" / "recon.png").write_bytes(SECRET)
    fake_object_storage(monkeypatch, tmp_path / "bucket")
    out = tmp_path / "o1" / "o2" / "o3"
    build_report("test://res", out)
    written = [p for p in (tmp_path / "o1").rglob("*") if p.is_file()]
    assert written and all(out in p.parents for p in written)
    assert not any(p.read_bytes() == SECRET for p in written)


# ---------------------------------------------------------------- pipes, devices and runaway files
@pytest.mark.parametrize("special", ["fifo", "devzero"])
@pytest.mark.parametrize("command", ["report", "table"])
def test_a_pipe_or_device_as_trials_parquet_is_refused_not_read(tmp_path, special, command, capsys):
    res = write_results(tmp_path / "R", n=6, vary_params=False)
    (res / "trials.parquet").unlink()
    if special == "fifo":
        os.mkfifo(res / "trials.parquet")
    else:
        os.symlink("/dev/zero", res / "trials.parquet")
    assert main([command, str(res)]) == 2
    err = capsys.readouterr().err
    assert str(res / "trials.parquet") in err
    # the device is planted as a link, refused as one (a link inside the results folder is never followed)
    assert ("named pipe" if special == "fifo" else "Remove the link") in err
    assert not (res / "report").exists()


def test_read_regular_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(UnsafePath, match="named pipe"):
        storage.read_regular(tmp_path / "pipe")
    with pytest.raises(UnsafePath, match="a device"):
        storage.read_regular("/dev/zero")
    (tmp_path / "big").write_bytes(b"x" * 100)
    with pytest.raises(UnsafePath, match="more than the 99 cem-bench reads"):
        storage.read_regular(tmp_path / "big", limit=99)
    assert storage.read_regular(tmp_path / "big", limit=100) == b"x" * 100
    os.symlink(tmp_path / "big", tmp_path / "link")
    assert storage.read_regular(tmp_path / "link") == b"x" * 100            # a path the user named
    with pytest.raises(UnsafePath, match="symbolic link"):
        storage.read_regular(tmp_path / "link", within=tmp_path)            # inside a results folder
    with pytest.raises(UnsafePath, match="outside"):
        storage.read_regular(tmp_path / "big", within=tmp_path / "sub")


# ---------------------------------------------------------------- the primitives
def test_write_bytes_never_writes_through_a_link(tmp_path, outside):
    os.symlink(outside / "secret.txt", tmp_path / "f")
    storage.write_bytes(str(tmp_path / "f"), b"new")
    assert (outside / "secret.txt").read_bytes() == SECRET
    assert not (tmp_path / "f").is_symlink() and (tmp_path / "f").read_bytes() == b"new"
    # a folder between `within` and the file that is a link: refused, nothing written there
    (tmp_path / "R").mkdir()
    os.symlink(outside, tmp_path / "R" / "sub")
    with pytest.raises(UnsafePath, match="is a symbolic link"):
        storage.write_bytes(str(tmp_path / "R" / "sub" / "g"), b"x", within=tmp_path / "R")
    assert snapshot(outside) == {"secret.txt": SECRET}
    # without `within` the parent is the user's: followed
    storage.write_bytes(str(tmp_path / "R" / "sub" / "g"), b"x")
    assert (outside / "g").read_bytes() == b"x"
    with pytest.raises(ValueError, match="not inside"):
        storage.write_bytes(str(tmp_path / "elsewhere"), b"x", within=tmp_path / "R")


def test_write_bytes_temp_names_cannot_be_planted(tmp_path, outside, monkeypatch):
    """The old temp name was ``FILE.tmpPID``, opened with ``open(..., "wb")``: a link planted under it was
    written through. The temp file is now created with O_EXCL | O_NOFOLLOW under a random name."""
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        os.symlink(outside / "secret.txt", tmp_path / f"f.tmp{pid}")
        os.symlink(outside / "secret.txt", tmp_path / f".f.tmp{pid}")
    storage.write_bytes(str(tmp_path / "f"), b"new")
    assert (outside / "secret.txt").read_bytes() == SECRET and (tmp_path / "f").read_bytes() == b"new"


@pytest.mark.parametrize("name", ["a" * 245 + ".json", "é" * 127])
def test_write_bytes_takes_any_name_the_file_system_takes(tmp_path, name):
    """The temp name was ``.NAME.tmpPID.HEX``: a name of 240 bytes or more (the file system takes 255) made a temp
    name it refuses, and `calibrate --json` failed after its measurement. Nothing else is left beside it."""
    storage.write_bytes(str(tmp_path / name), b"new")
    assert (tmp_path / name).read_bytes() == b"new" and os.listdir(tmp_path) == [name]


def test_relative_inside_accepts_only_paths_inside(tmp_path):
    root = tmp_path / "R"
    assert storage.relative_inside(root, "exp/t1") == "exp/t1"
    assert storage.relative_inside(root, str(root / "t1")) == "t1"
    for bad in ("../x", "a/../../x", "/etc", str(tmp_path / "x"), "", ".", "a//b", "a\0b", str(root)):
        assert storage.relative_inside(root, bad) is None, bad


def test_publish_refuses_a_linked_subfolder_before_writing_any_file(tmp_path, outside):
    stage = tmp_path / "stage"
    (stage / "galleries").mkdir(parents=True)
    (stage / "index.html").write_bytes(b"page")
    (stage / "galleries" / "a.png").write_bytes(b"png")
    (tmp_path / "out").mkdir()
    os.symlink(outside, tmp_path / "out" / "galleries")
    with pytest.raises(UnsafePath):
        storage.publish(stage, tmp_path / "out", [])
    assert not (tmp_path / "out" / "index.html").exists() and snapshot(outside) == {"secret.txt": SECRET}
    os.unlink(tmp_path / "out" / "galleries")
    assert storage.publish(stage, tmp_path, ["out"]) == str(tmp_path / "out")
    assert (tmp_path / "out" / "galleries" / "a.png").read_bytes() == b"png"


@pytest.mark.parametrize("target", ["file", "folder"])
def test_a_link_planted_at_the_gallery_is_replaced_not_written_through(tmp_path, outside, target):
    """``recon.png`` of a run (``train --out``, a search trial, ``attack``) was written by torchvision's
    ``save_image(path)``, which followed a link planted there and overwrote its target (the newcomer audit of
    2026-12-06). It is now written as every result file: the link is replaced, the target left alone."""
    import torch

    from cem_bench.attacks import save_gallery
    run = tmp_path / "run"
    run.mkdir()
    link = run / "recon.png"
    link.symlink_to(outside / "secret.txt" if target == "file" else outside)
    before = snapshot(outside)
    originals = torch.rand(3, 1, 8, 8)
    assert save_gallery(originals, [originals.flip(0)], link) == str(link)
    assert snapshot(outside) == before
    assert not link.is_symlink() and link.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("target", ["file", "folder"])
def test_train_refuses_a_planted_gallery_before_training(tmp_path, outside, target, monkeypatch, capsys):
    """A ``recon.png`` already in ``train --out`` (a link to a file or to a folder) is refused before training: a
    link to a folder stopped the run after its training with "Is a directory", nothing saved."""
    from cem_bench.core import trial
    run = tmp_path / "run"
    run.mkdir()
    (run / "recon.png").symlink_to(outside / "secret.txt" if target == "file" else outside)
    monkeypatch.setattr(trial, "run_trial", lambda *a, **k: pytest.fail("trained"))
    before = snapshot(outside)
    assert main(["train", "--set", "data.dataset=synthetic", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "already holds a run (recon.png)" in err and "Nothing was trained" in err, err
    assert snapshot(outside) == before


def test_train_out_on_object_storage_is_refused_and_a_file_uri_is_the_local_folder(tmp_path, monkeypatch, capsys):
    """``train --out s3://…`` ran its checks on the URI as a local name and wrote the run into a local "s3:"
    folder; ``file://DIR`` is DIR, checked there (the review of 2026-12-06)."""
    from cem_bench.core import trial
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trial, "run_trial", lambda *a, **k: pytest.fail("trained"))
    assert main(["train", "--set", "data.dataset=synthetic", "--out", "s3://bucket/run"]) == 2
    assert "a run is written to a local folder" in capsys.readouterr().err and not any(tmp_path.iterdir())
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text("{}")
    assert main(["train", "--set", "data.dataset=synthetic", "--out", f"file://{run}"]) == 2
    assert "already holds a run (metrics.json)" in capsys.readouterr().err


def test_a_local_path_holding_a_scheme_separator_is_a_path(tmp_path, capsys):
    """2026-12-07 probe: `table /tmp/p/odd://dir` was read as object storage ("the bucket '' does not exist")."""
    from cem_bench.cli import main
    from cem_bench.storage import is_uri
    assert is_uri("s3://b/x") and is_uri("gs://b") and is_uri("file:///tmp/x")
    assert not is_uri(str(tmp_path / "odd://dir")) and not is_uri("odd://dir".join(["./", ""]))
    odd = tmp_path / "odd:" / "" / "dir"
    odd.mkdir(parents=True)
    assert main(["table", f"{tmp_path}/odd://dir"]) == 2
    err = capsys.readouterr().err
    assert "bucket" not in err and "neither configs.parquet nor trials.parquet" in err, err


@pytest.mark.parametrize("command", [["train"], ["calibrate"], ["search"]])
def test_a_named_pipe_as_the_yaml_file_is_refused_not_waited_on(tmp_path, capsys, command):
    """`--config PIPE` (and a search space that is one) blocked in open() until a writer came: the check that
    refuses a pipe ran only after it (2026-12-07 probe: calibrate hung until killed)."""
    import threading
    pipe = tmp_path / "pipe.yaml"
    os.mkfifo(pipe)
    argv = [*command, str(pipe)] if command == ["search"] else [*command, "--config", str(pipe)]
    done = {}
    worker = threading.Thread(target=lambda: done.setdefault("rc", main(argv)), daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():   # a regression fails here instead of hanging the suite: a writer releases the open
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(30)
        pytest.fail(f"{' '.join(command)} waited on the pipe")
    assert done["rc"] == 2
    assert "is not a regular file (a pipe or a device)" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["train"], ["calibrate"], ["search"]])
def test_a_yaml_file_in_object_storage_is_refused_by_name(tmp_path, capsys, command):
    """`--config s3://b/x.yaml` (and a search space there) said "does not exist": the name was opened as a local
    path. It is refused as object storage, with what to do (2026-12-07 probe)."""
    uri = "s3://bucket/space.yaml"
    argv = [*command, uri] if command == ["search"] else [*command, "--config", uri]
    assert main([*argv, "--dry-run"] if command == ["search"] else argv) == 2
    err = capsys.readouterr().err
    assert "is in object storage" in err and "aws s3 cp s3://bucket/space.yaml ." in err, err
    assert "does not exist" not in err


def test_a_file_uri_yaml_is_the_local_file(tmp_path):
    """`--config file:///abs/x.yaml` is /abs/x.yaml, as `train --out file://...` is a local folder (it said
    "does not exist")."""
    from cem_bench.config import load_yaml_config
    from cem_bench.spaces import load_space
    keys = tmp_path / "keys.yaml"
    keys.write_text("train.epochs: 3\n")
    assert load_yaml_config(f"file://{keys}") == {"train.epochs": 3}
    space = tmp_path / "space.yaml"
    space.write_text("name: s\nobjectives: [{metric: test_acc, mode: max}, {metric: attack_ssim, mode: min}]\n"
                     "sampler: grid\n"
                     "params: {cem.lambd: {choice: [4, 8]}}\n")
    assert load_space(f"file://{space}").name == "s"
