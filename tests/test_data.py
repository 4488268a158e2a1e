import hashlib
import os
import pickle

import numpy as np
import pytest
import torch

from cem_bench.config import TrialConfig
from cem_bench.core import data


def _hashes(images):
    return {hashlib.sha1(im.numpy().tobytes()).hexdigest() for im in images}


def test_synthetic_is_deterministic_balanced_and_seed_dependent():
    a, b = data.make_synthetic(200, seed=3), data.make_synthetic(200, seed=3)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert a.images.dtype == torch.uint8 and a.images.shape == (200, 3, 32, 32)
    assert torch.bincount(a.labels, minlength=10).tolist() == [20] * 10
    c = data.make_synthetic(200, seed=4)
    assert not torch.equal(a.images, c.images)


def test_synthetic_classes_differ_in_shape_not_only_colour():
    s = data.make_synthetic(400, seed=0)
    # every class renders some foreground, and class-mean images differ between classes
    means = torch.stack([s.images[s.labels == c].float().mean(0) for c in range(10)])
    dists = torch.cdist(means.flatten(1), means.flatten(1))
    assert dists[~torch.eye(10, dtype=torch.bool)].min() > 1.0


@pytest.mark.parametrize("protocol", ["inference", "training"])
def test_attack_splits(protocol):
    cfg = TrialConfig.from_flat({"data.train_size": 64, "data.test_size": 100, "data.attack_split": protocol})
    s = data.load(cfg.data)
    if protocol == "inference":
        assert len(s.attack_aux) == 90 and len(s.attack_eval) == 10
        assert not (_hashes(s.attack_aux.images) & _hashes(s.attack_eval.images))
    else:
        assert torch.equal(s.attack_aux.images, s.train.images) and torch.equal(s.attack_eval.images, s.test.images)
    assert len(s.test) == 100 and s.num_classes == 10 and s.image_shape == (3, 32, 32)


def test_augmentation_keeps_shape_and_is_seeded():
    s = data.make_synthetic(16, seed=0)
    x = s.images.float() / 255
    outs = [data.augment_batch(x, "crop_flip_rotate", torch.Generator().manual_seed(5)) for _ in range(2)]
    assert outs[0].shape == x.shape and torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], x)


def test_crop_flip_is_an_exact_shift_or_mirror():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8)
    gen = torch.Generator().manual_seed(0)
    out = data.augment_batch(x, "crop_flip", gen, pad=2)
    for i in range(2):
        found = False
        for flip in (False, True):
            src = x[i].flip(-1) if flip else x[i]
            padded = torch.nn.functional.pad(src, (2, 2, 2, 2))
            for dy in range(5):
                for dx in range(5):
                    if torch.equal(padded[:, dy:dy + 8, dx:dx + 8], out[i]):
                        found = True
        assert found, "crop_flip must equal a pad-2 crop of the (possibly mirrored) image"


def test_batch_iterator_covers_the_split_without_repeats():
    cfg = TrialConfig.from_flat({"data.train_size": 100, "data.test_size": 20})
    s = data.load(cfg.data)
    it = data.BatchIterator(s.train, s, 32, "none", torch.Generator().manual_seed(0))
    batches = list(it)
    assert len(batches) == 3  # the short last batch is dropped
    xs = torch.cat([b[0] for b in batches])
    assert xs.shape == (96, 3, 32, 32)
    assert len(_hashes((xs * 1000).round().to(torch.int64))) == 96


@pytest.mark.parametrize("augment", ["none", "crop_flip_rotate"])
def test_chunked_batches_are_the_same_epoch(augment):
    """CUDA gathers and augments several batches at once: the same permutation, every batch full-size, each
    image with its own label; without augmentation the very same batches as batch by batch."""
    cfg = TrialConfig.from_flat({"data.train_size": 200, "data.test_size": 20})
    s = data.load(cfg.data)
    one = list(data.BatchIterator(s.train, s, 32, augment, torch.Generator().manual_seed(0), chunk_batches=1))
    four = list(data.BatchIterator(s.train, s, 32, augment, torch.Generator().manual_seed(0), chunk_batches=4))
    assert len(one) == len(four) == 6 and all(x.shape == (32, 3, 32, 32) for x, _ in four)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(one, four))           # the same images in the same order
    if augment == "none":
        assert all(torch.equal(a[0], b[0]) for a, b in zip(one, four))
    else:                                        # augmented: the per-image draws come in another order
        assert not all(torch.equal(a[0], b[0]) for a, b in zip(one, four))


def _write_cifar(root, n_train_per_batch=6, n_test=8, cifar100=False):
    rng = np.random.default_rng(0)
    if cifar100:
        folder = os.path.join(root, "cifar-100-python")
        os.makedirs(folder)
        for name, n in (("train", 5 * n_train_per_batch), ("test", n_test)):
            with open(os.path.join(folder, name), "wb") as f:
                pickle.dump({"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                             "fine_labels": rng.integers(0, 100, n).tolist()}, f)
        with open(os.path.join(folder, "meta"), "wb") as f:
            pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)]}, f)
        return
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = n_test if name == "test_batch" else n_train_per_batch
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         "labels": rng.integers(0, 10, n).tolist()}, f)
    with open(os.path.join(folder, "batches.meta"), "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)


def test_cifar10_loader_reads_files_in_the_cifar_format(tmp_path):
    _write_cifar(str(tmp_path))
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path), "data.test_size": None})
    s = data.load(cfg.data)
    assert len(s.train) == 30 and len(s.test) == 8 and s.num_classes == 10
    assert s.train.images.dtype == torch.uint8 and s.train.images.shape[1:] == (3, 32, 32)
    # the first image is the first row of data_batch_1, reshaped CHW as CIFAR stores it
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        first = pickle.load(f)["data"][0].reshape(3, 32, 32)
    assert np.array_equal(s.train.images[0].numpy(), first)
    assert s.mean.flatten().tolist() == pytest.approx(list(data.CIFAR_MEAN))


def test_cifar100_loader(tmp_path):
    _write_cifar(str(tmp_path), cifar100=True)
    cfg = TrialConfig.from_flat({"data.dataset": "cifar100", "data.root": str(tmp_path), "data.train_size": 10})
    s = data.load(cfg.data)
    assert s.num_classes == 100 and len(s.train) == 10 and len(s.test) == 8


def test_cifar_missing_offline_says_where_the_files_go(tmp_path, monkeypatch):
    import torchvision

    def offline(self):
        raise OSError("network is unreachable")
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", offline)
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path)})
    with pytest.raises(data.DataError) as e:
        data.load(cfg.data)
    msg = str(e.value)
    assert str(tmp_path) in msg and "cifar-10-batches-py" in msg and "data.root" in msg
    # a data.root the failed download made is not left behind (an empty folder and its lock); one that was there
    # stays, with nothing of the attempt in it but the lock
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path / "new" / "data")})
    with pytest.raises(data.DataError):
        data.load(cfg.data)
    assert not (tmp_path / "new" / "data").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cifar-10-batches-py.download.lock"]


def test_a_damaged_cifar_file_is_a_data_error_saying_how_to_get_the_files(tmp_path):
    """A truncated or foreign batch file ended the trial in a bare UnpicklingError traceback; a missing one was
    torchvision's "You can use download=True", which no cem-bench key sets. Both now name the folder, the file
    where known, and how to get a complete copy."""
    _write_cifar(str(tmp_path))
    folder = tmp_path / "cifar-10-batches-py"
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path)})
    whole = (folder / "data_batch_3").read_bytes()
    for damaged in (whole[: len(whole) // 2], b"not a pickle"):
        (folder / "data_batch_3").write_bytes(damaged)
        with pytest.raises(data.DataError) as e:
            data.load(cfg.data)
        msg = str(e.value)
        assert str(folder) in msg and "cannot be read" in msg and "cifar-10-python.tar.gz" in msg, msg
        assert "file data_batch_3 under" in msg, msg   # the file a user replaces (the folder alone before 2026-12-06)
    (folder / "data_batch_3").write_bytes(whole)
    meta = (folder / "batches.meta").read_bytes()
    (folder / "batches.meta").write_bytes(meta[:10])
    with pytest.raises(data.DataError, match="file batches.meta under"):
        data.load(cfg.data)
    (folder / "batches.meta").write_bytes(meta)
    (folder / "data_batch_3").unlink()
    with pytest.raises(data.DataError) as e:
        data.load(cfg.data)
    msg = str(e.value)
    assert "missing data_batch_3" in msg and "cifar-10-python.tar.gz" in msg and "download=True" not in msg, msg


class _Planted:
    """Unpickled by a plain pickle.load, this makes the folder ``marker``: what a crafted batch file could run."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.mark.parametrize("which", ["data_batch_2", "batches.meta"])
def test_a_crafted_cifar_file_runs_nothing(tmp_path, which):
    """torchvision read the batch files with pickle.load, which calls whatever a file names: a file put under
    data.root ran code in every trial. Now only numpy's array reconstruction is allowed, and the file is a
    DataError saying what it named."""
    _write_cifar(str(tmp_path))
    marker = tmp_path / "ran"
    path = tmp_path / "cifar-10-batches-py" / which
    with open(path, "rb") as f:
        entry = pickle.load(f)
    entry["labels" if which != "batches.meta" else "label_names"] = _Planted(str(marker))
    with open(path, "wb") as f:
        pickle.dump(entry, f)
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path)})
    with pytest.raises(data.DataError, match="posix.mkdir, which no CIFAR batch holds"):
        data.load(cfg.data)
    assert not marker.exists()


def test_cifar_files_of_every_pickle_protocol_read_as_torchvision_reads_them(tmp_path):
    """The restricted reader gives torchvision's arrays, labels and classes, whatever protocol wrote the files
    (CIFAR's own are Python 2 pickles; by hand a user may write any)."""
    import torchvision
    base = torchvision.datasets.CIFAR10

    class Unchecked(base):   # torchvision's reader without the md5 sums of the real files
        train_list = [[f, None] for f, _ in base.train_list]
        test_list = [[f, None] for f, _ in base.test_list]
        meta = {**base.meta, "md5": None}
    for protocol in (2, 4, 5):
        root = tmp_path / f"p{protocol}"
        _write_cifar(str(root))
        folder = root / "cifar-10-batches-py"
        for f in folder.iterdir():
            with open(f, "rb") as fh:
                obj = pickle.load(fh)
            with open(f, "wb") as fh:
                pickle.dump(obj, fh, protocol=protocol)
        train, test, k = data.load_cifar("cifar10", str(root))
        for split, ref in ((train, Unchecked(str(root), train=True)), (test, Unchecked(str(root), train=False))):
            assert torch.equal(split.images, torch.from_numpy(ref.data).permute(0, 3, 1, 2)), protocol
            assert split.labels.tolist() == ref.targets and split.labels.dtype == torch.int64
        assert k == 10


def test_cifar_labels_outside_the_class_list_are_refused_at_load(tmp_path):
    """A label past the meta file's classes loaded silently and stopped training at its first batch."""
    _write_cifar(str(tmp_path))
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    with open(path, "rb") as f:
        batch = pickle.load(f)
    batch["labels"][0] = 10
    with open(path, "wb") as f:
        pickle.dump(batch, f)
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path)})
    with pytest.raises(data.DataError, match=r"test files .* in 0\.\.9"):
        data.load(cfg.data)


@pytest.mark.parametrize("dataset", ["digits", "photos"])
def test_check_available_finds_a_missing_wheel_file_before_a_search(dataset, monkeypatch, tmp_path):
    """The search's driver calls check_available before Ray starts; for digits and photos it checked nothing,
    so a missing package or file failed every trial on its own."""
    from cem_bench.core import realdata
    monkeypatch.setattr(realdata, "package_dir", lambda p: str(tmp_path))
    with pytest.raises(data.DataError, match=f"data.dataset={dataset} reads"):
        data.check_available(dataset, str(tmp_path))
    data.check_available("synthetic", str(tmp_path))


def test_trials_starting_together_download_cifar_once_and_never_read_it_half_written(tmp_path, monkeypatch):
    """The trials a fresh cluster node starts at once all found CIFAR missing and all downloaded and extracted
    into the same folder, which exists as soon as extraction begins: one could read it half-written (a DataError,
    never retried). Now one downloads into a folder of its own and renames it into place; the others wait and
    read the complete folder."""
    import threading
    import time

    import torchvision
    calls = []

    def download(self):          # torchvision's download, as slow as a real one, file by file
        calls.append(self.root)
        time.sleep(0.3)
        _write_cifar(self.root)

    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", download)
    # the test's files are not CIFAR's: torchvision checks them for presence only
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path / "data"),
                                 "data.test_size": None})
    sizes, errors = [], []

    def trial():
        try:
            sizes.append(len(data.load(cfg.data).train))
        except Exception as e:  # noqa: BLE001 - the assertion below shows it
            errors.append(e)
    threads = [threading.Thread(target=trial) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and sizes == [30] * 4, errors
    assert len(calls) == 1 and calls[0] != str(tmp_path / "data"), calls   # once, into a folder of its own
    assert sorted(os.listdir(tmp_path / "data")) == [".cifar-10-batches-py.download.lock", "cifar-10-batches-py"]


def test_cifar100_is_normalised_with_its_own_statistics(tmp_path):
    """CIFAR-100 was normalised with CIFAR-10's mean and std; the reference's CIFAR-100 loaders use its own."""
    _write_cifar(str(tmp_path), cifar100=True)
    cfg = TrialConfig.from_flat({"data.dataset": "cifar100", "data.root": str(tmp_path)})
    s = data.load(cfg.data)
    assert s.mean.flatten().tolist() == pytest.approx([0.5071, 0.4865, 0.4409], abs=1e-4)
    assert s.std.flatten().tolist() == pytest.approx([0.2673, 0.2564, 0.2762], abs=1e-4)


@pytest.mark.parametrize("what", ["float", "nhwc", "uint16", "float_labels"])
def test_cifar_files_in_another_layout_are_refused_not_cast(tmp_path, what):
    """A hand-written batch in another dtype or layout was cast and reshaped silently: float pixels in [0, 1]
    became black images, (n, 32, 32, 3) rows scrambled channels, uint16 wrapped, float labels truncated."""
    _write_cifar(str(tmp_path))
    path = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    with open(path, "rb") as f:
        batch = pickle.load(f)
    x = batch["data"]
    batch["data"] = {"float": x.astype(np.float32) / 255, "nhwc": x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1),
                     "uint16": x.astype(np.uint16), "float_labels": x}[what]
    if what == "float_labels":
        batch["labels"] = [float(v) + 0.5 for v in batch["labels"]]
    with open(path, "wb") as f:
        pickle.dump(batch, f)
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path)})
    with pytest.raises(data.DataError, match=r"file data_batch_2 under .*(uint8 of shape \(n, 3072\)|a list of "
                                             r"integers)"):
        data.load(cfg.data)


def test_a_data_root_that_is_the_batch_folder_itself_names_its_parent(tmp_path, monkeypatch):
    """data.root pointing at cifar-10-batches-py/ itself tried a download into a folder nested inside it."""
    import torchvision
    _write_cifar(str(tmp_path))
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", lambda self: pytest.fail("downloaded"))
    inner = tmp_path / "cifar-10-batches-py"
    before = sorted(os.listdir(inner))
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(inner)})
    with pytest.raises(data.DataError, match=f"batch folder itself .* here '{tmp_path}'"):
        data.load(cfg.data)
    assert sorted(os.listdir(inner)) == before    # no download lock left in the user's folder


@pytest.fixture
def silent_server():
    """The URL of a local server that accepts connections and never answers (a stalled download server)."""
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []

    def accept():
        while True:
            try:
                conns.append(srv.accept()[0])
            except OSError:   # closed at the end of the test
                return
    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/cifar-10-python.tar.gz"
    srv.close()
    for c in conns:   # an old-code client still waiting gets its EOF and ends
        c.close()


def test_a_stalled_cifar_server_is_an_error_not_a_hang(tmp_path, monkeypatch, silent_server):
    """urllib waits forever by default and torchvision passes no timeout: a server that accepted and never
    answered held the node's download lock, and every trial of the node hung behind it."""
    import socket
    import threading

    import torchvision
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url", silent_server)
    monkeypatch.setattr(data, "DOWNLOAD_TIMEOUT_S", 0.5, raising=False)
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path)})
    raised = []

    def load():
        try:
            data.load(cfg.data)
        except Exception as e:  # noqa: BLE001 - checked below
            raised.append(e)
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(60)   # a bound on the old code's hang, not a measurement: its own words below are the test
    assert not worker.is_alive(), "data.load still waits on a silent server after 60 s"
    assert len(raised) == 1, raised
    msg = str(raised[0])
    assert "could not be downloaded" in msg and "timed out" in msg, msg
    assert socket.getdefaulttimeout() is None   # the process's default is restored
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cifar-10-batches-py.download.lock"]


def _network(kind):
    import http.client
    import socket
    import urllib.error
    return {"unreachable": urllib.error.URLError(OSError(101, "Network is unreachable")),
            "dns": urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution")),
            "reset": ConnectionResetError(104, "Connection reset by peer"),
            "timeout": TimeoutError("timed out"),
            "cut": http.client.IncompleteRead(b"x" * 10, 100),
            "http503": urllib.error.HTTPError("https://x", 503, "Service Unavailable", {}, None),
            "http404": urllib.error.HTTPError("https://x", 404, "Not Found", {}, None),
            "md5": RuntimeError("File not found or corrupted."),
            "disk": OSError(28, "No space left on device"),
            "bad_url": urllib.error.URLError("unknown url type: htp")}[kind]


@pytest.mark.parametrize("kind,retried", [("unreachable", True), ("dns", True), ("reset", True), ("timeout", True),
                                          ("cut", True), ("http503", True), ("http404", False), ("md5", True),
                                          ("disk", False), ("bad_url", False)])
def test_a_cifar_download_cut_by_the_network_is_retried_by_the_search(tmp_path, monkeypatch, kind, retried):
    """Every failed download was a DataError, which a search's trial ends on for good (an error row, never
    retried by Ray's max_failures nor by --resume): a brief network failure on a node lost its trials. A failure
    that may pass is now a DataDownloadError, outside TRIAL_FATAL, so Ray retries the trial; one that would
    fail the same way again stays a DataError. Both say where the files go. A file whose md5 does not match is
    retried: a server that closes the connection cleanly part-way leaves only a short file, which torchvision
    reports as "File not found or corrupted." (it was a DataError: a cut transfer ended the trial for good)."""
    import pickle as pkl

    import torchvision

    from cem_bench import errors
    from cem_bench.search.diskspace import is_enospc

    def download(self):
        raise _network(kind)
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", download)
    cfg = TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path)})
    with pytest.raises(Exception) as e:
        data.load(cfg.data)
    err = e.value
    assert "could not be downloaded" in str(err) and "cifar-10-batches-py" in str(err), str(err)
    assert isinstance(err, errors.TRIAL_FATAL) is not retried, type(err)
    if retried:
        assert isinstance(err, errors.DataDownloadError) and not is_enospc(err)
        back = pkl.loads(pkl.dumps(err))       # Ray ships a trial's error to the driver pickled
        assert type(back) is errors.DataDownloadError and str(back) == str(err)
    else:
        assert isinstance(err, data.DataError)
    # the search's driver checks the data before Ray starts: there it is the one clear refusal either way
    with pytest.raises(data.DataError, match="could not be downloaded"):
        data.check_available("cifar10", str(tmp_path))


def test_the_cli_says_a_failed_download_in_one_line(tmp_path, monkeypatch, capsys):
    import torchvision

    from cem_bench.cli import os_error_message
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", lambda self: (_ for _ in ()).throw(_network("reset")))
    with pytest.raises(data.DataDownloadError) as e:
        data.load(TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": str(tmp_path)}).data)
    line = os_error_message(e.value)
    assert line == str(e.value) and line.startswith("cifar10 is not in data.root=") and \
        line.endswith("set data.root=DIR to where it already is."), line
    # `cem-bench train` says it as the data error it is, as a search's pre-flight check does
    from cem_bench.cli import main
    capsys.readouterr()
    assert main(["train", "--set", "data.dataset=cifar10", "--set", f"data.root={tmp_path}",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cem-bench: data error: cifar10 is not in data.root="), err


def _listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("asked,other", [("cifar10", "cifar100"), ("cifar100", "cifar10")])
@pytest.mark.parametrize("where", ["parent", "batch_folder"])
def test_a_data_root_of_the_other_cifar_set_is_refused_untouched(tmp_path, monkeypatch, asked, other, where):
    """data.root holding CIFAR-100 (its folder, or the batch folder itself) with data.dataset=cifar10 downloaded
    CIFAR-10 into the user's folder, left its lock there, and trained on a set the user did not point at."""
    import torchvision
    for klass in (torchvision.datasets.CIFAR10, torchvision.datasets.CIFAR100):
        monkeypatch.setattr(klass, "download", lambda self: pytest.fail("downloaded"))
    _write_cifar(str(tmp_path), cifar100=other == "cifar100")
    root = tmp_path / ("cifar-100-python" if other == "cifar100" else "cifar-10-batches-py") \
        if where == "batch_folder" else tmp_path
    before = _listing(tmp_path)
    cfg = TrialConfig.from_flat({"data.dataset": asked, "data.root": str(root)})
    title = "CIFAR-100" if other == "cifar100" else "CIFAR-10"
    with pytest.raises(data.DataError, match=f"holds {title}'s .*did you mean data.dataset={other}") as e:
        data.load(cfg.data)
    assert "nothing was written" in str(e.value)
    with pytest.raises(data.DataError, match=f"did you mean data.dataset={other}"):
        data.check_available(asked, str(root))       # the search's check before Ray starts says the same
    assert _listing(tmp_path) == before              # no download, no lock file


def test_the_default_data_root_holds_both_cifar_sets(tmp_path, monkeypatch):
    """cem-bench's own data.root (~/.cache/cem-bench/data) is where both sets are downloaded side by side: one
    there does not stop the other's download."""
    import torchvision
    monkeypatch.setenv("HOME", str(tmp_path))
    default = tmp_path / ".cache" / "cem-bench" / "data"
    _write_cifar(str(default), cifar100=True)
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", lambda self: _write_cifar(self.root))
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))
    s = data.load(TrialConfig.from_flat({"data.dataset": "cifar10"}).data)
    assert s.num_classes == 10 and (default / "cifar-10-batches-py").is_dir()


@pytest.mark.parametrize("root", ["s3://bucket/cifar", "gs://bucket/data", "file:///data/cifar"])
def test_a_uri_as_data_root_is_refused_by_the_config(root):
    """data.root=s3://... passed every check (a search's check_data_root lets URIs through, as for --storage)
    and load_cifar then read and downloaded into a local folder named 's3:'."""
    from cem_bench.config import ConfigError
    from cem_bench.spaces.parse import parse_space
    with pytest.raises(ConfigError, match=r"data.root: .* is a URI, .*folder on each machine.*--storage"):
        TrialConfig.from_flat({"data.dataset": "cifar10", "data.root": root})
    space = {"name": "t", "objectives": [{"metric": "test_acc", "mode": "max", "ref": 0.1},
                                         {"metric": "attack_ssim", "mode": "min", "ref": 1.0}],
             "sampler": {"name": "random", "seed": 0}, "num_samples": 2,
             "fixed": {"train.device": "cpu", "data.dataset": "cifar10"},
             "params": {"data.root": {"choice": ["/data/cifar", root]}}}
    with pytest.raises(ConfigError, match="is a URI"):   # a search refuses it before Ray starts
        parse_space(space)
    TrialConfig.from_flat({"data.root": "/data/cifar:v2"})   # a colon alone is a folder name
