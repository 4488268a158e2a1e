"""`cem-bench attack` re-loads the run's data set: a trial records which images each split held (info.data_sha256),
and a re-attack on other images is refused (tests/test_data.py has the CIFAR fixtures used here)."""

import json
import os
import pickle
import shutil

import pytest
from conftest import TINY
from test_cli import _trial_folder
from test_data import _write_cifar

from cem_bench.cli import main
from cem_bench.config import TrialConfig
from cem_bench.core import data


def _change_pixel(root, batch, row):
    path = os.path.join(root, "cifar-10-batches-py", batch)
    with open(path, "rb") as f:
        entry = pickle.load(f)
    entry["data"][row, 0] ^= 0xFF
    with open(path, "wb") as f:
        pickle.dump(entry, f)


def test_fingerprints_follow_the_images_not_only_their_number(tmp_path):
    _write_cifar(str(tmp_path / "a"), n_train_per_batch=4, n_test=40)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    _change_pixel(str(tmp_path / "b"), "test_batch", 39)     # the last test image: in attack_eval
    load = lambda root, split="inference": data.load(TrialConfig.from_flat(  # noqa: E731
        {"data.dataset": "cifar10", "data.root": str(root), "data.attack_split": split}).data)
    a, a2, b = data.fingerprints(load(tmp_path / "a")), data.fingerprints(load(tmp_path / "a")), \
        data.fingerprints(load(tmp_path / "b"))
    assert a == a2 and set(a) == {"train", "test", "attack_aux", "attack_eval"}
    assert [k for k in a if a[k] != b[k]] == ["test", "attack_eval"]
    t = data.fingerprints(load(tmp_path / "a", "training"))
    assert t["attack_aux"] == t["train"] == a["train"] and t["attack_eval"] == t["test"] == a["test"]


@pytest.mark.slow
def test_attack_refuses_other_images_than_the_run_used(tmp_path, capsys):
    """The run recorded only its splits' sizes: `attack --set data.root=` another copy (or other package
    versions making digits or photos) re-attacked other images of the same number and reported the numbers
    beside the run's. Now the attacked splits' sha256 must match; the train split is not compared (no attack
    reads it), and a record without fingerprints (an older cem-bench's) is attacked as before."""
    root = tmp_path / "data"
    _write_cifar(str(root), n_train_per_batch=20, n_test=40)
    trial = tmp_path / "cem_trial_1"
    result = _trial_folder(trial, {**TINY, "data.dataset": "cifar10", "data.root": str(root),
                                   "attack.names": "[rmle]"})
    other = tmp_path / "copy"
    shutil.copytree(root, other)
    _change_pixel(str(other), "test_batch", 39)
    capsys.readouterr()
    assert main(["attack", str(trial), "--set", f"data.root={other}"]) == 2
    err = capsys.readouterr().err
    assert "data error: the attack_eval images loaded now" in err and "not those the run used" in err, err
    assert "attack_aux" not in err and "trial_result.json" in err and "Nothing was attacked" in err, err
    assert not [d for d in os.listdir(trial) if d.startswith("attack-")]
    assert result["info"]["data_sha256"] == data.fingerprints(data.load(
        TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(root), **{
            k: v for k, v in TINY.items() if k.startswith("data.")}}).data))

    train_only = tmp_path / "train_only"
    shutil.copytree(root, train_only)
    _change_pixel(str(train_only), "data_batch_1", 0)
    assert main(["attack", str(trial), "--set", f"data.root={train_only}"]) == 0

    record = json.loads((trial / "trial_result.json").read_text())
    del record["info"]["data_sha256"]
    (trial / "trial_result.json").write_text(json.dumps(record))
    assert main(["attack", str(trial), "--set", f"data.root={other}"]) == 0
