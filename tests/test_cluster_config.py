"""cluster.yaml passes Ray's own cluster-config checks (as `ray up` runs them before any AWS call)."""

from __future__ import annotations

import copy
import fnmatch
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


@pytest.fixture(scope="module")
def prepared(raw):
    pytest.importorskip("jsonschema")  # ray's validate_config needs it (installed with ray[tune])
    from ray.autoscaler._private.util import prepare_config, validate_config
    cfg = prepare_config(copy.deepcopy(raw))  # merge the AWS defaults, docker checks, min/max workers
    validate_config(cfg)                      # ray-schema.json + head/worker type consistency
    return cfg


def test_ray_validates_the_cluster_config(prepared):
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_pinned_gpu_image_matches_installed_ray(raw):
    import ray
    image = raw["docker"]["image"]
    m = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py3\d+-(gpu|cu\d+)", image)
    assert m, f"{image!r} is not a pinned rayproject/ray GPU tag"
    assert m.group(1) == ray.__version__, (image, ray.__version__)
    assert "ray-ml" not in image


def test_nodes_and_scaling(raw, prepared):
    types = raw["available_node_types"]
    head = types[raw["head_node_type"]]
    assert head["resources"] == {"CPU": 0}  # the head runs the driver only
    workers = {k: v for k, v in types.items() if k != raw["head_node_type"]}
    assert workers
    for name, w in workers.items():
        assert w["min_workers"] == 0 and 0 < w["max_workers"] <= raw["max_workers"]
        itype = w["node_config"]["InstanceType"]
        assert itype.split(".")[0] in ("g4dn", "g5", "g6", "g6e", "p3", "p4d", "p5"), itype
        assert "IamInstanceProfile" in w["node_config"]  # workers write checkpoints/results to S3
        # ... and the head launches them with it only once its role may pass that role (the header's step)
        assert "iam:PassRole" in (ROOT / "cluster.yaml").read_text()
        assert prepared["available_node_types"][name]["max_workers"] == w["max_workers"]
    assert raw["idle_timeout_minutes"] > 0


def test_commands_install_package_and_set_auth(raw):
    mounts = raw["file_mounts"]
    tree = [remote for remote, local in mounts.items() if local in (".", "./")]
    assert tree, "the working tree must be uploaded"
    assert any("pip install" in c and "-e" in c and tree[0] in c for c in raw["setup_commands"])
    assert "~/.ray/auth_token" in mounts
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in raw[key] if "ray start" in c]
        assert start and all("RAY_AUTH_MODE=token" in c for c in start), key
    assert any("--autoscaling-config=~/ray_bootstrap_config.yaml" in c for c in raw["head_start_ray_commands"])
    assert any("$RAY_HEAD_IP" in c for c in raw["worker_start_ray_commands"])


def test_every_node_installs_the_libraries_at_the_tested_versions(raw):
    """Workers the autoscaler starts late resolved numpy, Pillow, scikit-image, ... anew from PyPI (open ranges in
    pyproject.toml): the package is installed with cluster-constraints.txt, whose every pin satisfies
    pyproject.toml's range and names a dependency of the package's (or of scikit-image's image reading)."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    tree = next(remote for remote, local in raw["file_mounts"].items() if local in (".", "./"))
    assert any(f"-c {tree}/cluster-constraints.txt" in c and f"-e {tree}" in c for c in raw["setup_commands"])
    pins = {}
    for line in (ROOT / "cluster-constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", line
            pins[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    deps = {canonicalize_name(r.name): r for r in map(Requirement, tomllib.loads(
        (ROOT / "pyproject.toml").read_text())["project"]["dependencies"])}
    for name, version in pins.items():
        assert name in deps or name in {"pillow", "imageio", "tifffile", "scipy"}, name
        if name in deps:
            assert deps[name].specifier.contains(version), (name, version, str(deps[name].specifier))
    # every dependency that shapes a number is pinned; torch, torchvision and ray are pinned by cluster.yaml
    assert set(deps) - {"torch", "torchvision", "ray"} <= set(pins), set(deps) - set(pins)


def test_git_repository_is_uploaded(raw):
    """Each trial records `git rev-parse HEAD` (provenance.git_sha): on a node that needs the uploaded .git."""
    for pattern in raw.get("rsync_exclude", []):
        assert not fnmatch.fnmatch(".git", pattern.removeprefix("**/")), pattern
    for name in raw.get("rsync_filter", []):   # files of rsync exclude patterns, like .gitignore
        patterns = [ln.strip().strip("/") for ln in (ROOT / name).read_text().splitlines()
                    if ln.strip() and not ln.startswith(("#", "!"))]
        assert not any(fnmatch.fnmatch(".git", p) for p in patterns), name


def test_broken_config_is_rejected(raw):
    """The check has teeth: a wrong head_node_type or an unknown top-level key fails."""
    pytest.importorskip("jsonschema")
    from ray.autoscaler._private.util import prepare_config, validate_config
    bad = copy.deepcopy(raw)
    bad["head_node_type"] = "nope"
    with pytest.raises(Exception):  # noqa: B017 - Ray raises jsonschema or ValueError errors by field
        validate_config(prepare_config(bad))
    bad = copy.deepcopy(raw)
    bad["max_wrokers"] = 3
    with pytest.raises(Exception):  # noqa: B017 - Ray raises jsonschema or ValueError errors by field
        validate_config(prepare_config(bad))
