"""provenance.git_sha answers from the repository that holds the package, wherever that copy lives (a node of the
cluster gets the tree and its .git from `ray up`), and says "unknown" without one."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def load_copy(tree: Path):
    """cem_bench/provenance.py imported from ``tree``/cem_bench (copied there first unless it is)."""
    if not (tree / "cem_bench" / "provenance.py").exists():
        (tree / "cem_bench").mkdir(parents=True)
        shutil.copy(ROOT / "cem_bench" / "provenance.py", tree / "cem_bench" / "provenance.py")
    spec = importlib.util.spec_from_file_location(f"provenance_copy_{tree.name}", tree / "cem_bench" / "provenance.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def committed_repo(path: Path, files: dict[str, str], package: bool) -> Path:
    """A git repository at ``path`` with ``files`` (and a copy of cem_bench/provenance.py when ``package``),
    all committed."""
    if shutil.which("git") is None:
        pytest.skip("no git")
    path.mkdir(parents=True)
    subprocess.run([*GIT, "init", "-q"], cwd=path, check=True)
    for name, text in files.items():
        (path / name).write_text(text)
    if package:
        (path / "cem_bench").mkdir()
        shutil.copy(ROOT / "cem_bench" / "provenance.py", path / "cem_bench" / "provenance.py")
    subprocess.run([*GIT, "add", "."], cwd=path, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "one"], cwd=path, check=True)
    return path


@pytest.fixture
def repo(tmp_path):
    return committed_repo(tmp_path / "src", {"f.txt": "x\n"}, package=True)


def test_git_sha_of_a_copied_repository(repo, tmp_path):
    node = tmp_path / "node"
    shutil.copytree(repo, node)   # what `ray up` uploads: the tree and its .git
    sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert len(sha) == 12
    assert load_copy(node).git_sha() == sha


def test_git_sha_without_a_repository_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))   # whatever holds the temporary folder
    assert load_copy(tmp_path / "bare").git_sha() == "unknown"


def test_git_sha_without_git_is_unknown(repo, monkeypatch):
    monkeypatch.setenv("PATH", "")
    assert load_copy(repo).git_sha() == "unknown"


def test_git_sha_is_the_commit_the_process_imported_not_a_later_one(repo):
    """A commit made while a trial trains does not relabel it: the sha is that of the code the process imported,
    not the tree's HEAD when the result is written."""
    def head():
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
    mod = load_copy(repo)
    before = head()
    (repo / "f.txt").write_text("y\n")
    subprocess.run([*GIT, "commit", "-q", "-am", "two"], cwd=repo, check=True)
    assert head() != before
    assert mod.git_sha() == before


def test_git_sha_says_dirty_when_the_package_is_not_the_commit_s(repo):
    """A trial run from uncommitted code is not labelled as the commit: a changed or an added file of the package
    marks it -dirty; a changed file outside the package (a doc, a space) does not."""
    sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True,
                         check=True).stdout.strip()
    (repo / "f.txt").write_text("a doc changed\n")
    assert load_copy(repo).git_sha() == sha
    (repo / "cem_bench" / "new_estimator.py").write_text("x = 1\n")
    assert load_copy(repo).git_sha() == sha + "-dirty"
    (repo / "cem_bench" / "new_estimator.py").unlink()
    with open(repo / "cem_bench" / "provenance.py", "a") as fh:
        fh.write("# changed\n")
    assert load_copy(repo).git_sha() == sha + "-dirty"


@pytest.mark.parametrize("how", ["ignored", "untracked"])
def test_git_sha_of_a_package_inside_another_repository_is_unknown(tmp_path, how):
    """An installed copy in a .venv inside a user's own repository is not labelled with that repository's HEAD:
    the repository does not track the package, so the commit says nothing about the code that ran."""
    files = {"notes.txt": "the user's project\n", **({".gitignore": ".venv/\n"} if how == "ignored" else {})}
    user = committed_repo(tmp_path / "user", files, package=False)
    site = user / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    assert load_copy(site).git_sha() == "unknown"


def test_a_cpu_result_names_the_kind_of_machine_that_computed_it():
    """A rerun of a search at one thread repeats its first run on the same kind of CPU and not on another
    (findings/README.md, tradeoff_matched_digits): the device says the CPU's model and the instruction set torch's
    kernels dispatch to, so that two runs' tables tell whether they can be compared digit for digit."""
    import os
    import platform

    import torch

    from cem_bench.provenance import device_name
    name = device_name("cpu")
    assert name.startswith("cpu (") and f", {platform.machine()}, {os.cpu_count()} cores, " in name
    assert name.endswith(f"torch kernels {torch.backends.cpu.get_cpu_capability()})"), name


def test_every_result_records_the_versions_of_the_libraries_that_shape_its_numbers():
    """Two nodes of a cluster set up on different days could decode `photos` with other Pillow or scikit-image
    versions and nothing in the result said so: run_info records them beside torch's."""
    from importlib import metadata

    from cem_bench.provenance import LIBRARIES, run_info
    info = run_info("cpu", "0.0")
    assert info["libraries"] == ", ".join(f"{n} {metadata.version(n)}" for n in LIBRARIES)
    assert "pillow " in info["libraries"] and "scikit-image " in info["libraries"]
