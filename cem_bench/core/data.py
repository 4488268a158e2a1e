"""Datasets, splits and on-device batches.

Every split lives on the training device as uint8 NCHW and is converted, augmented and normalised there
in whole batches: no DataLoader worker processes and no PIL in the loop (the reference's CPU pipeline and
its extra per-epoch data pass dominate its epoch time, docs/reference.md §9).

* ``synthetic``: 10 classes of 32x32 RGB shapes generated in memory, deterministic from ``data.seed``.
* ``cifar10`` / ``cifar100``: torchvision's files under ``data.root``; downloaded when missing and online.
* ``digits`` / ``photos``: real images read from files inside the installed scikit-learn and scikit-image
  wheels, never downloaded (``realdata.py``; docs/datasets.md).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import pickle
import socket
import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..config import DataConfig
from ..errors import ConfigError, DataDownloadError, DataError  # noqa: F401  (re-exported)
from . import realdata

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.247, 0.243, 0.261)
# CIFAR-100's own training-set statistics, as the reference code's CIFAR-100 loaders normalise with
CIFAR100_MEAN = (0.5070751592371323, 0.48654887331495095, 0.4409178433670343)
CIFAR100_STD = (0.2673342858792401, 0.2564384629170883, 0.27615047132568404)
SYNTHETIC_MEAN = (0.5, 0.5, 0.5)
SYNTHETIC_STD = (0.25, 0.25, 0.25)
SYNTHETIC_TRAIN = 4096
SYNTHETIC_TEST = 2560
SYNTHETIC_CLASSES = ("disc", "square", "triangle", "cross", "ring", "h_stripes", "v_stripes", "checker",
                     "diamond", "diagonal_bar")




@dataclass
class Split:
    images: torch.Tensor  # uint8 (N, 3, H, W) on the device
    labels: torch.Tensor  # int64 (N,) on the device

    def __len__(self) -> int:
        return self.images.shape[0]

    def to(self, device) -> Split:
        return Split(self.images.to(device), self.labels.to(device))


@dataclass
class Splits:
    train: Split         # the client's training images
    test: Split          # accuracy is measured on the whole test split
    attack_aux: Split    # the attacker's own images (decoder training)
    attack_eval: Split   # images the attacker never saw (decoder evaluation)
    num_classes: int
    mean: torch.Tensor   # (1, 3, 1, 1) float32 on the device
    std: torch.Tensor
    name: str

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train.images.shape[1:])

    def normalize(self, images_uint8: torch.Tensor) -> torch.Tensor:
        return self.standardize(images_uint8.float() / 255.0)

    def standardize(self, images01: torch.Tensor) -> torch.Tensor:
        """Float images in [0, 1] as the encoder takes them (the dataset's mean and std)."""
        return (images01 - self.mean) / self.std


# ---------------------------------------------------------------------------------------- loading
# bytes an image costs while a generated set is made: synthetic renders at 2x in float32 with a handful of
# full-size intermediates (measured: 4096 images peak at about 0.55 GB over the process, 135 KB an image);
# a photo patch is its uint8 copy plus the shuffle's
SYNTHETIC_PEAK_BYTES = 135_000
PHOTOS_BYTES = 2 * 3 * 32 * 32


def check_memory(name: str, n: int, per_image: int) -> None:
    """ConfigError, before any allocation, when making ``n`` images of a generated set would need more than
    80 % of this machine's memory (a train_size of 10⁹ asks for terabytes)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):   # not a POSIX system: nothing to compare with
        return
    need = n * per_image
    if need > 0.8 * total:
        most = int(0.8 * total // per_image)
        raise ConfigError(f"data.train_size / data.test_size: {n:,} {name} images would need about "
                          f"{need / 2**30:,.0f} GiB to make ({per_image / 1000:g} KB each), more than the 80 % of "
                          f"this machine's {total / 2**30:,.0f} GiB cem-bench allows; give at most {most:,}")


def check_generated_sizes(cfg: DataConfig) -> None:
    """``check_memory`` of the sets ``load`` generates (synthetic, photos), without making an image: callers run it
    before their first line (`train` printed its plan, then refused 5,000,000 synthetic images)."""
    if cfg.dataset == "synthetic":
        check_memory("synthetic", max(cfg.train_size or SYNTHETIC_TRAIN, cfg.test_size or SYNTHETIC_TEST),
                     SYNTHETIC_PEAK_BYTES)
    elif cfg.dataset == "photos":
        check_memory("photos", (cfg.train_size or realdata.PHOTOS_TRAIN) + (cfg.test_size or realdata.PHOTOS_TEST),
                     PHOTOS_BYTES)


def load(cfg: DataConfig, device: torch.device | str = "cpu") -> Splits:
    """Load the dataset of ``cfg`` and lay out the four splits on ``device``."""
    check_generated_sizes(cfg)
    if cfg.dataset == "synthetic":
        n_train = cfg.train_size or SYNTHETIC_TRAIN
        n_test = cfg.test_size or SYNTHETIC_TEST
        train = make_synthetic(n_train, seed=cfg.seed * 2 + 1)
        test = make_synthetic(n_test, seed=cfg.seed * 2 + 2)
        mean, std, num_classes = SYNTHETIC_MEAN, SYNTHETIC_STD, len(SYNTHETIC_CLASSES)
    elif cfg.dataset in ("cifar10", "cifar100"):
        train, test, num_classes = load_cifar(cfg.dataset, cfg.root)
        train, test = seeded_subsets(train, test, cfg)
        mean, std = (CIFAR_MEAN, CIFAR_STD) if cfg.dataset == "cifar10" else (CIFAR100_MEAN, CIFAR100_STD)
    elif cfg.dataset == "digits":
        tr_x, tr_y, te_x, te_y = realdata.digits()
        train, test = seeded_subsets(Split(tr_x, tr_y), Split(te_x, te_y), cfg)
        mean, std, num_classes = realdata.DIGITS_MEAN, realdata.DIGITS_STD, len(realdata.DIGITS_CLASSES)
    elif cfg.dataset == "photos":
        tr = realdata.photo_patches("train", cfg.train_size or realdata.PHOTOS_TRAIN, seed=cfg.seed * 2 + 1)
        # the test split's last 10 % (the attacker's evaluation slice under ``inference``) from held-out blocks
        # of their own: test patches of one block overlap, so a random cut would give the attacker near-copies
        # of its evaluation images. The same split under both protocols, so that test_acc is comparable.
        n_test = cfg.test_size or realdata.PHOTOS_TEST
        te = realdata.photo_patches("test", n_test, seed=cfg.seed * 2 + 2, n_eval=n_test - inference_cut(n_test))
        train, test = Split(tr.images, tr.labels), Split(te.images, te.labels)
        mean, std, num_classes = realdata.PHOTOS_MEAN, realdata.PHOTOS_STD, len(realdata.PHOTO_CLASSES)
    else:  # pragma: no cover - validated by the config
        raise ConfigError(f"data.dataset: unknown dataset {cfg.dataset!r}; known: "
                          f"{', '.join(DataConfig.__dataclass_fields__['dataset'].metadata.get('choices', ()))}")
    aux, ev = attack_splits(train, test, cfg.attack_split)
    device = torch.device(device)
    return Splits(train=train.to(device), test=test.to(device), attack_aux=aux.to(device),
                  attack_eval=ev.to(device), num_classes=num_classes,
                  mean=torch.tensor(mean, device=device).view(1, 3, 1, 1),
                  std=torch.tensor(std, device=device).view(1, 3, 1, 1), name=cfg.dataset)


SPLIT_NAMES = ("train", "test", "attack_aux", "attack_eval")


def fingerprints(splits: Splits) -> dict[str, str]:
    """The sha256 of each split (its images' and labels' shape, dtype and bytes), as hex. A trial records them
    (``info.data_sha256``), so that ``cem-bench attack`` can tell that it re-loaded the images the run used: a
    run records its splits' sizes only, and another copy of a data set under ``data.root``, or other versions of
    the packages that make digits and photos, give other images of the same sizes. A split that is another's
    tensor (``training``: attack_aux is train) is hashed once."""
    import hashlib
    out: dict[str, str] = {}
    done: dict[tuple, str] = {}
    for name in SPLIT_NAMES:
        split = getattr(splits, name)
        key = tuple((t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.device))
                    for t in (split.images, split.labels))
        if key not in done:
            h = hashlib.sha256()
            for t in (split.images, split.labels):
                h.update(f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)};".encode())
                h.update(t.detach().contiguous().cpu().numpy())
            done[key] = h.hexdigest()
        out[name] = done[key]
    return out


def seeded_subsets(train: Split, test: Split, cfg: DataConfig) -> tuple[Split, Split]:
    """``data.train_size`` / ``data.test_size`` images of a data set with fixed splits (CIFAR, digits), a
    subset drawn with ``data.seed``; all of a split when the size is empty (the config refuses a larger one).
    Each split from a generator of its own, so that the test subset (and the attacker's images cut from it)
    does not change with ``data.train_size``, as for the generated sets."""
    if cfg.train_size is not None and cfg.train_size < len(train):
        idx = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed))[: cfg.train_size]
        train = Split(train.images[idx], train.labels[idx])
    if cfg.test_size is not None and cfg.test_size < len(test):
        idx = torch.randperm(len(test), generator=torch.Generator().manual_seed(cfg.seed))[: cfg.test_size]
        test = Split(test.images[idx], test.labels[idx])
    return train, test


def inference_cut(n: int) -> int:
    """How many of ``n`` test images the attacker trains on under ``inference`` (the rest it is scored on)."""
    return int(round(0.9 * n))


def attack_splits(train: Split, test: Split, protocol: str) -> tuple[Split, Split]:
    """The attacker's training (aux) and evaluation images.

    ``inference``: aux = test[:90%], eval = test[90%:] (disjoint, the attacker never saw the client's data);
    ``training``: aux = the client's training images, eval = the whole test set (the paper's headline).
    The eval slice is not stratified by class. For ``photos`` the two slices are also disjoint in pixels (its
    test split is laid out so: ``realdata.photo_patches``'s ``n_eval``); the other sets' test images are
    separate samples.
    """
    if protocol == "inference":
        cut = inference_cut(len(test))
        return Split(test.images[:cut], test.labels[:cut]), Split(test.images[cut:], test.labels[cut:])
    if protocol == "training":
        return train, test
    raise ConfigError(f"data.attack_split: {protocol!r}; allowed: inference, training")


# ---------------------------------------------------------------------------------------- CIFAR
_CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


def check_available(name: str, root: str) -> None:
    """DataError unless the data set ``name`` can be read here: CIFAR's files under ``root`` (downloaded now
    when missing and online, as ``load`` would) read once through, so that a truncated or foreign file is
    found here too (about a second for CIFAR-10's 180 MB); the files of digits and photos inside the installed
    wheels, checked for presence only. The search's driver calls it before Ray starts, so that a missing or
    damaged data set is one message instead of every trial's error. The synthetic set needs nothing."""
    if name in _CIFAR_FOLDERS:
        try:
            load_cifar(name, root)
        except DataDownloadError as e:   # retried inside a trial; before a search starts it is the answer
            raise DataError(str(e)) from None
    elif name == "digits":
        realdata.locate(realdata.DIGITS_FILE, name)
    elif name == "photos":
        for _, f in realdata.PHOTOS:
            realdata.locate(f, name)


def _cifar_url(name: str) -> str:
    return f"https://www.cs.toronto.edu/~kriz/{'cifar-10-python' if name == 'cifar10' else 'cifar-100-python'}.tar.gz"


def _cifar_remedy(name: str, folder: str) -> str:
    """How to get a complete copy of a CIFAR folder that is there but damaged (no download is tried then)."""
    return (f"remove {folder} and run again online to download it, or put the files of the folder inside "
            f"{_cifar_url(name)} there")


def _check_cifar_files(name: str, klass, folder: str) -> None:
    """DataError naming the missing files of a CIFAR folder that exists."""
    expected = [f for f, _ in klass.train_list + klass.test_list] + [klass.meta["filename"]]
    missing = [f for f in expected if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise DataError(f"{name} files under {folder} are incomplete (missing {', '.join(missing)}); expected "
                        f"{', '.join(expected)}: {_cifar_remedy(name, folder)}")


def _cifar_folder(name: str, root: str):
    """(torchvision's dataset class, the folder of its files), downloading into ``root`` when the folder is
    missing and the network allows; DataError, naming where the files go, when it does not."""
    import torchvision

    klass = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
    folder = os.path.join(root, _CIFAR_FOLDERS[name])
    if not os.path.isdir(folder) and os.path.isfile(os.path.join(root, klass.meta["filename"])):
        # data.root names the batch folder itself: a download would put a second copy inside it
        raise DataError(f"data.root={root!r} is {name}'s batch folder itself (it holds {klass.meta['filename']}); "
                        f"set data.root to the folder that holds {_CIFAR_FOLDERS[name]}/, here "
                        f"{os.path.dirname(os.path.abspath(root))!r}")
    if not os.path.isdir(folder):
        _refuse_other_cifar(name, root)
        try:
            _download_once(klass, root, folder)
        except Exception as e:  # offline, proxy, disk: say where the files go
            msg = (f"{name} is not in data.root={root!r} and could not be downloaded ({type(e).__name__}: {e}). "
                   f"Put the python version of the dataset there, so that {folder}/ exists (the folder inside "
                   f"{_cifar_url(name)}), or run once online, or set data.root=DIR to where it already is.")
            # a network failure may pass: a search's trial is retried (max_failures) instead of ending as an
            # error row for good
            raise (DataDownloadError if _transient(e) else DataError)(msg) from None
    return klass, folder


# files that say a folder is the batch folder of a CIFAR set: CIFAR-10's meta file is its own; CIFAR-100's
# ``meta`` is a common name, so it counts only beside that set's ``train`` or ``test``
_CIFAR_MARKS = {"cifar10": (("batches.meta",),), "cifar100": (("meta", "train"), ("meta", "test"))}
_CIFAR_TITLES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}


def _refuse_other_cifar(name: str, root: str) -> None:
    """DataError, before a download touches ``root``, where ``root`` holds the other CIFAR set instead: its batch
    folder itself, or (not in cem-bench's default data.root, which holds both side by side) only the other set's
    folder. Either way the data set key and the folder disagree; a download put CIFAR-10 into a CIFAR-100 folder
    (and left its lock there) and then trained on a data set the user did not point at."""
    other = "cifar100" if name == "cifar10" else "cifar10"
    title, other_title = _CIFAR_TITLES[name], _CIFAR_TITLES[other]
    marks = next((m for m in _CIFAR_MARKS[other] if all(os.path.isfile(os.path.join(root, f)) for f in m)), None)
    if marks is not None:
        parent = os.path.dirname(os.path.abspath(root))
        raise DataError(f"data.root={root!r} holds {other_title}'s files ({', '.join(marks)}), not {title}'s; did you "
                        f"mean data.dataset={other} (with data.root={parent!r}, the folder that holds "
                        f"{os.path.basename(os.path.abspath(root))}/)? For {name}, set data.root to a folder that "
                        f"holds {_CIFAR_FOLDERS[name]}/ or may receive its download; nothing was written to {root}")
    other_folder = os.path.join(root, _CIFAR_FOLDERS[other])
    default = os.path.abspath(os.path.expanduser(DataConfig().root))
    if os.path.isdir(other_folder) and os.path.abspath(root) != default:
        raise DataError(f"data.root={root!r} holds {other_title}'s folder {_CIFAR_FOLDERS[other]}/ and no "
                        f"{_CIFAR_FOLDERS[name]}/; did you mean data.dataset={other}? For {name} here, extract "
                        f"{_cifar_url(name)} into it (no download is made into a folder of {other_title}), or set "
                        f"data.root to a folder that holds {_CIFAR_FOLDERS[name]}/ or may receive its download; "
                        f"nothing was written to {root}")


# errnos of a network that may come back (a socket error urllib did not wrap in URLError)
_NETWORK_ERRNOS = frozenset(getattr(errno, n) for n in ("ENETUNREACH", "ENETDOWN", "ENETRESET", "EHOSTUNREACH",
                                                        "EHOSTDOWN", "ETIMEDOUT", "ECONNRESET", "ECONNREFUSED",
                                                        "ECONNABORTED", "EPIPE") if hasattr(errno, n))


def _transient(e: BaseException) -> bool:
    """Did a download fail for a reason that may pass: the network (unreachable, refused, reset, a DNS failure, a
    timeout, a cut transfer) or the server (HTTP 5xx)? Not a 4xx (the file is not there), a full or read-only
    disk, or a bad URL: those fail the same way on a retry. A downloaded file whose md5 does not match counts as
    a cut transfer: a server that closes the connection cleanly part-way raises nothing in urllib, and
    torchvision then finds only a short file ("File not found or corrupted."); a server that keeps sending a
    corrupt file fails each retry too, and Ray's max_failures bounds them."""
    import http.client
    import urllib.error
    if isinstance(e, RuntimeError) and "not found or corrupted" in str(e):   # torchvision's integrity check
        return True
    if isinstance(e, urllib.error.HTTPError):
        return e.code >= 500
    if isinstance(e, urllib.error.URLError):   # the socket's error inside (DNS, refused, timeout, ...)
        return isinstance(e.reason, BaseException) and _transient(e.reason)   # a text reason: a bad URL
    if isinstance(e, (ConnectionError, TimeoutError, socket.gaierror, http.client.IncompleteRead,
                      http.client.BadStatusLine)):
        return True
    return isinstance(e, OSError) and e.errno in _NETWORK_ERRNOS


# Seconds a CIFAR download may wait on the server (to connect, or for the next bytes), not for the whole file.
# urllib waits forever by default, and torchvision takes no timeout: a server that accepts and never answers
# held the node's download lock for good, and every trial of the node (and a local search's pre-flight check)
# hung behind it. A stall now fails as an unreachable server does.
DOWNLOAD_TIMEOUT_S = 60.0
_timeout_lock = threading.Lock()


@contextlib.contextmanager
def _download_timeout():
    """Sockets opened inside get ``DOWNLOAD_TIMEOUT_S`` (torchvision's download opens its own, with no timeout
    argument to pass). The default is process-wide: the lock keeps two downloads of a process from restoring
    each other's value, and it is restored at once after."""
    with _timeout_lock:
        before = socket.getdefaulttimeout()
        socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
        try:
            yield
        finally:
            socket.setdefaulttimeout(before)


def _download_once(klass, root: str, folder: str) -> None:
    """Download and extract into a private folder of ``root``, then rename the extracted folder into place, under
    a lock of ``root``. The trials a fresh cluster node starts at once all find the folder missing; torchvision
    extracts file by file, and ``isdir(folder)`` is true as soon as extraction begins, so without this a trial
    could read a half-written folder. The folder appears complete or not at all (one rename), and the lock makes
    the others wait for the first download instead of repeating it; where the file system has no locks, the
    rename alone still keeps a half-written folder out of sight."""
    import fcntl
    import shutil
    import tempfile
    made, up = [], os.path.abspath(root)   # the folders this makes, deepest first
    while not os.path.isdir(up) and os.path.dirname(up) != up:
        made.append(up)
        up = os.path.dirname(up)
    os.makedirs(root, exist_ok=True)
    lock = os.path.join(root, f".{os.path.basename(folder)}.download.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass   # no flock here: the rename below still publishes only a complete folder
        if os.path.isdir(folder):   # another trial downloaded it while this one waited
            return
        tmp = tempfile.mkdtemp(prefix=".download-", dir=root)
        try:
            with _download_timeout():
                klass(tmp, train=True, download=True)
            try:
                os.rename(os.path.join(tmp, os.path.basename(folder)), folder)
            except OSError:
                if not os.path.isdir(folder):   # not another process's complete folder: a real failure
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        if made:   # a failed download leaves no data.root behind that it made (empty folders and the lock)
            with contextlib.suppress(OSError):
                os.unlink(lock)
                for folder_made in made:
                    os.rmdir(folder_made)
        raise
    finally:
        os.close(fd)


# What a CIFAR python batch may name when it is unpickled: numpy's array reconstruction, nothing else. A plain
# pickle.load (torchvision's reader) calls any global a file names, so a batch file put under data.root
# could run code in every trial; with these, such a file is a DataError and nothing runs (tests/test_data.py).
_CIFAR_GLOBALS = frozenset((module, name)
                           for module in ("numpy.core.multiarray", "numpy._core.multiarray",
                                          "numpy.core.numeric", "numpy._core.numeric", "numpy")
                           for name in ("_reconstruct", "_frombuffer", "scalar", "ndarray", "dtype")) | {
    ("_codecs", "encode")}   # how Python 3 writes bytes at protocol 2 or below: it encodes a string, nothing more


class _CifarUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _CIFAR_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which no CIFAR batch holds (refused: unpickling "
                                     f"it would run code)")


def _read_cifar_file(path: str) -> dict:
    """One CIFAR python file (a batch or the meta file) as a dict with text keys. CIFAR's files are Python 2
    pickles: latin1 reads their byte strings as text, as torchvision does."""
    with open(path, "rb") as f:
        obj = _CifarUnpickler(f, encoding="latin1").load()
    if not isinstance(obj, dict):
        raise ValueError(f"{os.path.basename(path)} holds a {type(obj).__name__}, not CIFAR's dict")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _read_cifar_split(read, files: list) -> tuple[np.ndarray, np.ndarray]:
    """The images (N, 3, 32, 32 uint8, as CIFAR stores them) and labels of a split's batch files, each read by
    ``read(name)``."""
    images, labels = [], []
    for f, _ in files:
        entry = read(f)
        data = np.asarray(entry["data"])
        # CIFAR's layout, and nothing a cast or reshape would silently turn into other images: float pixels in
        # [0, 1] would become black, (n, 32, 32, 3) rows scrambled channels, uint16 wrapped modulo 256
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise ValueError(f"its data is {data.dtype} of shape {data.shape}; CIFAR's is uint8 of shape (n, 3072), "
                             f"each row the red, green and blue 32x32 planes")
        lab = np.asarray(entry["labels"] if "labels" in entry else entry["fine_labels"])
        if lab.ndim != 1 or (lab.size and lab.dtype.kind not in "iu"):
            raise ValueError(f"its labels are {lab.dtype} of shape {lab.shape}; CIFAR's are a list of integers")
        images.append(data.reshape(-1, 3, 32, 32))
        labels.append(lab.astype(np.int64))
    return np.concatenate(images), np.concatenate(labels)


def load_cifar(name: str, root: str) -> tuple[Split, Split, int]:
    """Read CIFAR-10/100 from its python batch files (downloaded through torchvision when missing and online,
    else a clear error). Only presence is checked, not torchvision's md5 sums (it verifies them when it
    downloads), so files copied in by hand work; they are unpickled by ``_CifarUnpickler``, which runs nothing."""
    root = os.path.expanduser(root)
    klass, folder = _cifar_folder(name, root)
    _check_cifar_files(name, klass, folder)
    reading = [klass.meta["filename"]]   # the file being read: the error names it (a user replaces that one)

    def read(f: str) -> dict:
        reading[0] = f
        return _read_cifar_file(os.path.join(folder, f))
    try:
        classes = list(read(klass.meta["filename"])[klass.meta["key"]])
        splits = {part: _read_cifar_split(read, files)
                  for part, files in (("training", klass.train_list), ("test", klass.test_list))}
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file fails anywhere inside unpickling
        raise DataError(f"{name} file {reading[0]} under {folder} cannot be read ({type(e).__name__}: {e}): it "
                        f"is truncated or not in CIFAR's python format; {_cifar_remedy(name, folder)}") from None
    for part, (images, labels) in splits.items():
        # a label past the class list stops training at its first batch (CUDA: a device-side assert)
        if len(labels) != len(images) or (len(labels) and not (0 <= labels.min() and labels.max() < len(classes))):
            raise DataError(f"{name} files under {folder}: the {part} files hold {len(images)} images and "
                            f"{len(labels)} labels, which must be as many and in 0..{len(classes) - 1} (the "
                            f"{len(classes)} classes of {klass.meta['filename']}); {_cifar_remedy(name, folder)}")

    def to_split(images: np.ndarray, labels: np.ndarray) -> Split:
        return Split(torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(labels))

    return to_split(*splits["training"]), to_split(*splits["test"]), len(classes)


# ---------------------------------------------------------------------------------------- synthetic
def make_synthetic(n: int, seed: int, size: int = 32) -> Split:
    """``n`` images of the 10 shape classes, balanced, deterministic from ``seed``.

    Each image: a smooth two-colour gradient background, one class-specific foreground shape with random
    position (+-6 px), size, aspect, rotation (+-15 deg) and a colour kept apart from the background, and a
    small distractor blob of another colour. Difficulty comes from variety, not from pixel noise (noise
    caps what any attack can reconstruct). Rendered at 2x and box-filtered, so edges are antialiased.

    The contrast (at least 0.25 in every channel) and radii (from 7 px) are set so that a small VGG leaves
    its early plateau at once on every seed, and the demo's lambda = 0 accuracy does not depend on the seed or
    the thread count; a linear model on the pixels still reaches only about half (docs/protocol.md section 6).
    """
    g = torch.Generator().manual_seed(int(seed))
    k = len(SYNTHETIC_CLASSES)
    labels = torch.arange(n) % k
    labels = labels[torch.randperm(n, generator=g)]
    ss = 2 * size
    r = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731

    def grid(res: int):
        c = (torch.arange(res, dtype=torch.float32) + 0.5) * (size / res)  # pixel units at 1x
        yy, xx = torch.meshgrid(c, c, indexing="ij")
        return yy.view(1, res, res), xx.view(1, res, res)

    # background at 1x (it is smooth): a linear gradient between two colours in a random direction
    yy, xx = grid(size)
    c1, c2 = r(n, 3) * 0.4, r(n, 3) * 0.4     # darkest 40% of each channel
    theta = r(n) * 2 * math.pi
    t = ((xx - size / 2) * torch.cos(theta).view(-1, 1, 1) + (yy - size / 2) * torch.sin(theta).view(-1, 1, 1))
    t = (t / (size * 0.75) + 0.5).clamp(0, 1).unsqueeze(1)  # (n,1,H,W)
    bg = c1.view(n, 3, 1, 1) * (1 - t) + c2.view(n, 3, 1, 1) * t

    # foreground colour: any hue, but at least 0.25 brighter than the background in every channel
    fg = 0.65 + 0.35 * r(n, 3)

    # shapes rendered at 2x, box-filtered to 1x coverage (antialiased edges)
    yy, xx = grid(ss)
    cx = size / 2 + (r(n) * 12 - 6)
    cy = size / 2 + (r(n) * 12 - 6)
    rad = 7.0 + r(n) * 3.0
    aspect = 0.85 + r(n) * 0.3
    ang = (r(n) * 30 - 15) * math.pi / 180
    dx, dy = xx - cx.view(-1, 1, 1), yy - cy.view(-1, 1, 1)
    ca, sa = torch.cos(ang).view(-1, 1, 1), torch.sin(ang).view(-1, 1, 1)
    u = (ca * dx + sa * dy) / (rad * aspect).view(-1, 1, 1)
    v = (-sa * dx + ca * dy) / (rad / aspect).view(-1, 1, 1)
    shape_cov = F.avg_pool2d(_class_masks(u, v, labels).unsqueeze(1).float(), 2)

    # distractor: a small blob of a random colour somewhere else
    bx, by = r(n) * (size - 8) + 4, r(n) * (size - 8) + 4
    brad = 1.0 + r(n) * 1.0
    blob = ((xx - bx.view(-1, 1, 1)) ** 2 + (yy - by.view(-1, 1, 1)) ** 2) < brad.view(-1, 1, 1) ** 2
    blob_cov = F.avg_pool2d(blob.unsqueeze(1).float(), 2)
    bcol = r(n, 3)

    img = torch.lerp(bg, bcol.view(n, 3, 1, 1), blob_cov)
    img = torch.lerp(img, fg.view(n, 3, 1, 1), shape_cov)
    images = (img * 255).round().clamp(0, 255).to(torch.uint8)
    return Split(images.contiguous(), labels.to(torch.int64))


def _class_masks(u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Boolean masks (n, H, W) of each image's class shape in its unit coordinates (u, v).

    Each class's rule is evaluated only on that class's images (generation, not a training step)."""
    s3 = math.sqrt(3)

    def rule(c, u, v):
        au, av = u.abs(), v.abs()
        box = (au < 1) & (av < 1)
        if c == 0:
            return u * u + v * v < 1                                         # disc
        if c == 1:
            return (au < 0.85) & (av < 0.85)                                 # square
        if c == 2:
            return (v < 0.5) & (s3 * u - v < 1) & (-s3 * u - v < 1)          # triangle (pointing up)
        if c == 3:
            return ((au < 0.3) & (av < 1)) | ((av < 0.3) & (au < 1))         # cross
        if c == 4:
            rr = u * u + v * v
            return (rr < 1) & (rr > 0.3)                                     # ring
        if c == 5:
            return box & (torch.floor((v + 1) * 1.5) % 2 == 0)               # horizontal stripes
        if c == 6:
            return box & (torch.floor((u + 1) * 1.5) % 2 == 0)               # vertical stripes
        if c == 7:
            return box & ((torch.floor((u + 1) * 1.5) + torch.floor((v + 1) * 1.5)) % 2 == 0)  # checker patch
        if c == 8:
            return au + av < 1.1                                             # diamond
        return ((u - v).abs() < 0.35) & ((u + v).abs() < 1.6)                # diagonal bar

    mask = torch.zeros(u.shape, dtype=torch.bool)
    for c in range(len(SYNTHETIC_CLASSES)):
        idx = (labels == c).nonzero().squeeze(1)
        if len(idx):
            mask[idx] = rule(c, u[idx], v[idx])
    return mask


# ---------------------------------------------------------------------------------------- batches
class BatchIterator:
    """Shuffled, augmented, normalised batches of a device-resident split.

    One ``randperm`` per epoch on the device; the short last batch is dropped (as the reference's loader
    reset does) unless the split is smaller than one batch. On CUDA the images of ``CUDA_CHUNK_BATCHES``
    batches are gathered, augmented and normalised at once (a dozen kernels per chunk instead of per batch:
    the launches, not the arithmetic, are the cost); on the CPU batch by batch, which keeps the CPU's random
    stream, and so its results, those of per-batch augmentation.
    """

    CUDA_CHUNK_BATCHES = 64

    def __init__(self, split: Split, splits: Splits, batch_size: int, augment: str, generator: torch.Generator,
                 chunk_batches: int | None = None):
        self.split, self.splits, self.batch_size, self.augment, self.gen = split, splits, batch_size, augment, generator
        self.chunk_batches = chunk_batches       # None: CUDA_CHUNK_BATCHES on CUDA, 1 elsewhere

    def __len__(self) -> int:
        n = len(self.split)
        return max(1, n // self.batch_size)

    def __iter__(self):
        n = len(self.split)
        dev = self.split.images.device
        perm = torch.randperm(n, generator=self.gen, device=self.gen.device).to(dev)
        bs = min(self.batch_size, n)
        chunk = self.chunk_batches or (self.CUDA_CHUNK_BATCHES if dev.type == "cuda" else 1)
        for c in range(0, len(self), chunk):
            k = min(chunk, len(self) - c)
            idx = perm[c * bs:(c + k) * bs]
            x = self.split.images[idx].float().div_(255.0)
            if self.augment != "none":
                x = augment_batch(x, self.augment, self.gen)
            x = self.splits.standardize(x)
            y = self.split.labels[idx]
            for j in range(k):
                yield x[j * bs:(j + 1) * bs], y[j * bs:(j + 1) * bs]


def augment_batch(x: torch.Tensor, kind: str, gen: torch.Generator, pad: int = 4, max_deg: float = 15.0):
    """Random pad-``pad`` crop, horizontal flip and (``crop_flip_rotate``) rotation in one affine resample.

    ``x`` is float in [0, 1] (before normalisation, so out-of-image pixels are black as with torchvision's
    zero fill). The crop offset is an integer number of pixels, nearest sampling keeps crop/flip exact.
    """
    n, _, h, w = x.shape
    dev = x.device
    rnd = lambda *s: torch.rand(*s, generator=gen, device=gen.device).to(dev)  # noqa: E731
    tx = torch.floor(rnd(n) * (2 * pad + 1)) - pad  # integer pixel shifts in [-pad, pad]
    ty = torch.floor(rnd(n) * (2 * pad + 1)) - pad
    flip = torch.where(rnd(n) < 0.5, -1.0, 1.0)
    if kind == "crop_flip_rotate":
        a = (rnd(n) * 2 - 1) * max_deg * math.pi / 180
    else:
        a = torch.zeros(n, device=dev)
    cos, sin = torch.cos(a), torch.sin(a)
    # output pixel p samples input at R(p) * flip + shift (normalised coordinates, align_corners=False)
    theta = torch.zeros(n, 2, 3, device=dev)
    theta[:, 0, 0] = cos * flip
    theta[:, 0, 1] = -sin * (h / w)
    theta[:, 1, 0] = sin * flip * (w / h)
    theta[:, 1, 1] = cos
    theta[:, 0, 2] = 2 * tx / w
    theta[:, 1, 2] = 2 * ty / h
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def eval_batches(split: Split, splits: Splits, batch_size: int):
    """Un-augmented normalised batches in order (evaluation and feature passes)."""
    for i in range(0, len(split), batch_size):
        yield splits.normalize(split.images[i:i + batch_size]), split.labels[i:i + batch_size]
