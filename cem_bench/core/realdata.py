"""The two real data sets that ship inside installed wheels: read from the package folders, never downloaded.

* ``digits``: scikit-learn's handwritten digits (``sklearn/datasets/data/digits.csv.gz``, the file
  ``sklearn.datasets.load_digits`` reads): 1,797 images of 8x8 pixels with 17 grey levels (0-16), 10 classes,
  brought to 32x32 RGB and split once, stratified, 1,437 train / 360 test.
* ``photos``: 32x32 RGB patches of the ten colour photographs bundled in the scikit-image and scikit-learn
  wheels, one class per photograph, training and test patches cut from disjoint regions of each photograph,
  and the attacker's evaluation patches (the test split's last 10 %) from held-out blocks of their own.

The files are found through ``importlib.util.find_spec`` (the package folder, without importing the package),
so a missing package or file is one ``DataError`` naming both, and scikit-image's on-demand fetcher
(``skimage.data``'s pooch registry) is never reached: only the files its wheel carries are listed here.
Decoded arrays are cached per process; a load takes well under a second once the first has run.

Everything is numpy / torch arrays; ``data.load`` turns them into splits on the device.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DataError

PATCH = 32  # every data set of the project is 32x32, the VGG's input (CIFAR's size)


# ---------------------------------------------------------------------------------------- files
@dataclass(frozen=True)
class WheelFile:
    """A file inside an installed package: ``pip`` names the distribution, ``package`` the import folder."""
    pip: str
    package: str
    path: str          # relative to the package folder


def package_dir(package: str) -> str | None:
    """The installed folder of ``package`` without importing it (None when it is not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def locate(f: WheelFile, dataset: str) -> str:
    """The absolute path of ``f``, or a ``DataError`` that names the package and the file."""
    folder = package_dir(f.package)
    if folder is None:
        raise DataError(f"data.dataset={dataset} reads {f.package}/{f.path} from the {f.pip} package, which is "
                        f"not installed: pip install {f.pip} (nothing is downloaded at run time)")
    path = os.path.join(folder, *f.path.split("/"))
    if not os.path.isfile(path):
        raise DataError(f"data.dataset={dataset} reads {f.package}/{f.path} from the installed {f.pip} package, "
                        f"but {path} is missing (the {f.pip} wheel ships it: pip install --force-reinstall "
                        f"{f.pip}; nothing is downloaded at run time)")
    return path


# ---------------------------------------------------------------------------------------- digits
DIGITS_FILE = WheelFile("scikit-learn", "sklearn", "datasets/data/digits.csv.gz")
DIGITS_TEST = 360          # 20 % of 1,797, stratified: 36 (or 35/37) of each digit
DIGITS_SPLIT_SEED = 0      # the split's own seed, not data.seed: every run sees the same test set
DIGITS_CLASSES = tuple(str(d) for d in range(10))
# Mean and std of the 1,437 training images after the upscale (every channel the same, the images are grey);
# computed by tests/test_real_data.py::test_normalisation_constants_are_those_of_the_training_data.
DIGITS_MEAN = (0.3054, 0.3054, 0.3054)
DIGITS_STD = (0.3237, 0.3237, 0.3237)


@functools.lru_cache(maxsize=4)
def _digits_8x8(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) float in 0..16, labels (1797,)) as ``load_digits`` reads the same file."""
    try:
        table = np.loadtxt(path, delimiter=",")
    # zlib.error: a corrupt deflate stream (a truncated file is an EOFError, a bad header an OSError)
    except (OSError, ValueError, EOFError, zlib.error) as e:
        raise DataError(f"data.dataset=digits: cannot read {path} ({type(e).__name__}: {e}); reinstall "
                        f"scikit-learn (pip install --force-reinstall scikit-learn)") from None
    images, labels = table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    images.flags.writeable = labels.flags.writeable = False   # cached: shared by every load of the process
    return images, labels


def digits_upscale(images8: np.ndarray) -> torch.Tensor:
    """8x8 counts 0..16 -> uint8 (N, 3, 32, 32).

    Bilinear upscaling by 4, not padding: each 8x8 value is the count of ink pixels in a 4x4 block of the
    original 32x32 NIST bitmap, so a x4 upscale returns the digit to its original frame, filling it as CIFAR's
    objects fill theirs (a padded 8x8 digit would be a speck in a black 32x32 frame, and the VGG's pooling
    would leave nothing of it at the cut). Bilinear rather than nearest: nearest would draw 4x4 blocks whose
    hard edges are an artefact of the downsampling, which a decoder would have to reproduce and SSIM would
    reward; bilinear gives smooth strokes like the pen's. Grey, so the three channels are equal.
    """
    x = torch.from_numpy(np.ascontiguousarray(images8, dtype=np.float32)).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(PATCH, PATCH), mode="bilinear", align_corners=False)
    x = (x * 255).round().clamp(0, 255).to(torch.uint8)
    return x.expand(-1, 3, -1, -1).contiguous()


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train images, train labels, test images, test labels): the fixed stratified split of the 1,797 digits.

    ``sklearn.model_selection.train_test_split`` with ``stratify`` and its own ``random_state``
    (``DIGITS_SPLIT_SEED``), independent of ``data.seed``: ``data.train_size`` / ``data.test_size`` then take
    seeded subsets of these two sets, as for CIFAR.
    """
    images8, labels = _digits_8x8(locate(DIGITS_FILE, "digits"))
    from sklearn.model_selection import train_test_split  # present: locate found the sklearn folder

    idx_train, idx_test = train_test_split(np.arange(len(labels)), test_size=DIGITS_TEST, stratify=labels,
                                           random_state=DIGITS_SPLIT_SEED)
    images = digits_upscale(images8)
    y = torch.from_numpy(labels.copy())
    tr, te = torch.from_numpy(idx_train), torch.from_numpy(idx_test)
    return images[tr], y[tr], images[te], y[te]


# ---------------------------------------------------------------------------------------- photos
# The colour photographs whose files the wheels carry: scikit-image's wheel holds these in skimage/data/ (the
# files its fetcher finds there as "legacy" files and returns without a download; checked on 0.26), while
# the rest of its registry, e.g. eagle.png, would be fetched on demand and is not used. Not used:
# motorcycle_right (the same scene as motorcycle_left), color.png and chessboard_RGB.png (test patterns, not
# photographs), horse.png and logo.png (RGBA drawings), and the grey images.
PHOTOS = (
    ("astronaut", WheelFile("scikit-image", "skimage", "data/astronaut.png")),
    ("chelsea", WheelFile("scikit-image", "skimage", "data/chelsea.png")),
    ("coffee", WheelFile("scikit-image", "skimage", "data/coffee.png")),
    ("hubble_deep_field", WheelFile("scikit-image", "skimage", "data/hubble_deep_field.jpg")),
    ("immunohistochemistry", WheelFile("scikit-image", "skimage", "data/ihc.png")),
    ("motorcycle", WheelFile("scikit-image", "skimage", "data/motorcycle_left.png")),
    ("retina", WheelFile("scikit-image", "skimage", "data/retina.jpg")),
    ("rocket", WheelFile("scikit-image", "skimage", "data/rocket.jpg")),
    ("china", WheelFile("scikit-learn", "sklearn", "datasets/images/china.jpg")),
    ("flower", WheelFile("scikit-learn", "sklearn", "datasets/images/flower.jpg")),
)
PHOTO_CLASSES = tuple(name for name, _ in PHOTOS)
PHOTOS_TRAIN = 4096        # data.train_size default, as for synthetic
PHOTOS_TEST = 2560         # data.test_size default, as for synthetic
# Each photograph is resized so that its shorter side is 192 px (from 300-1411 px). A 32x32 patch then spans
# a sixth of the short side: an eye and fur of the cat, a stretch of the saucer's rim, a few galaxies, a vessel
# crossing the retina, a recognisable part of an object rather than a flat stretch of a large image (at full
# resolution most patches of retina or hubble are a single colour), while leaving thousands of training
# positions per photograph.
PHOTO_SHORT_SIDE = 192
# The held-out region: square blocks of 48 px, block (bx, by) held out when (bx - 2 by) % 4 == 0, a quarter of
# every photograph's area (22 % of the hubble image, whose width is not a whole number of blocks) spread over
# all of it, so that test patches come from the same parts of the scene as training patches (a band at one
# edge would hold the sky of the rocket and nothing else). The blocks never touch, not even at a corner, and a
# test patch lies wholly inside one block (17 x 17 positions per block).
PHOTO_BLOCK = 48
# Training boxes keep this many pixels away from every held-out block: the resize's antialiasing (bilinear,
# support one output pixel on each side) makes an output pixel depend on the source pixels under it and its
# neighbours', so with a 2 px gap no source pixel reaches both a training and a test pixel.
PHOTO_GUARD = 2
# Patches whose grey values have a standard deviation below 4 (of 255) are not drawn: the black corners
# outside the retina's disc, flat sky of rocket and china, the flower's blurred backdrop. They carry no class
# texture (black retina corners would be a free class), and an attack reconstructs a constant patch
# trivially, which inflates SSIM. This keeps at least 62 % of every photograph's test positions and 81 % of
# its training positions (docs/datasets.md).
PHOTO_MIN_STD = 4.0
# The attacker's evaluation patches (data.attack_split=inference: the last 10 % of the test split) come from
# their own held-out blocks, a tenth of each photograph's blocks (at least one; with 4-6 blocks, one), drawn
# with the split's generator among the blocks of which at least half the 17 x 17 positions are textured; its
# training (aux) patches come from the other blocks. Two patches of one 48 px block always overlap (32 + 32 >
# 48), so whole blocks are the only pixel-disjoint cut; the blocks never touch, so aux and eval share no pixel.
PHOTO_EVAL_BLOCK_SHARE = 0.1
# Mean and std of the default training set (data.seed 0, 4,096 patches); computed by
# tests/test_real_data.py::test_normalisation_constants_are_those_of_the_training_data.
PHOTOS_MEAN = (0.4637, 0.3598, 0.3144)
PHOTOS_STD = (0.3150, 0.2445, 0.2455)


def resized_size(w: int, h: int) -> tuple[int, int]:
    """(width, height) of a w x h photograph once its shorter side is ``PHOTO_SHORT_SIDE``."""
    s = PHOTO_SHORT_SIDE / min(w, h)
    return round(w * s), round(h * s)


@functools.lru_cache(maxsize=32)
def _photo(path: str) -> np.ndarray:
    """The photograph at ``path`` as uint8 (H, W, 3), its shorter side resized to ``PHOTO_SHORT_SIDE``."""
    from PIL import Image  # Pillow: a dependency of torchvision and scikit-image

    try:
        with Image.open(path) as im:
            # Pillow's bilinear filter widens with the reduction (antialiased: every source pixel counts)
            im = im.convert("RGB").resize(resized_size(*im.size), Image.Resampling.BILINEAR)
            a = np.array(im, dtype=np.uint8)
    except OSError as e:   # a truncated or unreadable file (PIL raises OSError subclasses)
        raise DataError(f"data.dataset=photos: cannot decode {path} ({type(e).__name__}: {e}); reinstall the "
                        f"package that holds it") from None
    a.flags.writeable = False   # cached: shared by every load of the process
    return a


def photo(c: int) -> np.ndarray:
    """Photograph of class ``c``, resized (uint8 (H, W, 3))."""
    return _photo(locate(PHOTOS[c][1], "photos"))


def held_out_mask(h: int, w: int) -> np.ndarray:
    """Boolean (h, w): True on the held-out (test) blocks of a photograph of that size."""
    b = PHOTO_BLOCK
    mask = np.zeros((h, w), dtype=bool)
    for by in range(h // b):
        for bx in range(w // b):
            if (bx - 2 * by) % 4 == 0:
                mask[by * b:(by + 1) * b, bx * b:(bx + 1) * b] = True
    return mask


def _window_sums(a: np.ndarray, k: int) -> np.ndarray:
    """Sums of ``a`` (h, w) over every k x k window, indexed by the window's top-left corner."""
    c = np.zeros((a.shape[0] + 1, a.shape[1] + 1), dtype=np.float64)
    c[1:, 1:] = a.astype(np.float64).cumsum(0).cumsum(1)
    return c[k:, k:] - c[:-k, k:] - c[k:, :-k] + c[:-k, :-k]


@functools.lru_cache(maxsize=32)
def _positions_of(path: str) -> tuple[np.ndarray, np.ndarray]:
    img = _photo(path)
    h, w, _ = img.shape
    test = held_out_mask(h, w)
    g = PHOTO_GUARD
    # the held-out blocks grown by the guard: a training box may not touch this
    grown = _window_sums(np.pad(test, g), 2 * g + 1) > 0
    train_ok = _window_sums(grown, PATCH) == 0
    test_ok = _window_sums(test, PATCH) == PATCH * PATCH
    grey = img.astype(np.float64).mean(2)
    mean = _window_sums(grey, PATCH) / PATCH ** 2
    var = _window_sums(grey ** 2, PATCH) / PATCH ** 2 - mean ** 2
    textured = np.sqrt(np.maximum(var, 0)) >= PHOTO_MIN_STD
    tr = np.argwhere(train_ok & textured)
    te = np.argwhere(test_ok & textured)
    tr.flags.writeable = te.flags.writeable = False
    return tr, te


def photo_positions(c: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) allowed top-left corners (k, 2) as (y, x) of 32x32 patches in photograph ``c``."""
    return _positions_of(locate(PHOTOS[c][1], "photos"))


@dataclass
class PhotoPatches:
    images: torch.Tensor   # uint8 (N, 3, 32, 32)
    labels: torch.Tensor   # int64 (N,): the photograph
    y: torch.Tensor        # int64 (N,): the patch's top row in the resized photograph
    x: torch.Tensor        # int64 (N,): its left column


def eval_blocks(pos: np.ndarray, g: torch.Generator) -> np.ndarray:
    """Boolean (k,): which of the test positions ``pos`` (k, 2) lie in the attacker's evaluation blocks
    (``PHOTO_EVAL_BLOCK_SHARE`` of the photograph's held-out blocks that hold positions, at least one and never
    all, drawn with ``g`` among those with at least half their positions textured)."""
    b = PHOTO_BLOCK
    span = b - PATCH + 1                      # positions per block side (17): a test patch lies in one block
    block = (pos[:, 0] // b) * 10_000 + pos[:, 1] // b
    ids, counts = np.unique(block, return_counts=True)
    if len(ids) < 2:   # pragma: no cover - every photograph holds 4 to 6 (docs/datasets.md)
        raise DataError("data.dataset=photos: a photograph with fewer than two textured held-out blocks cannot "
                        "give the attacker disjoint training and evaluation patches")
    eligible = ids[counts >= span * span / 2]
    if len(eligible) == 0:   # pragma: no cover - every photograph has full blocks
        eligible = ids
    k = min(max(1, round(PHOTO_EVAL_BLOCK_SHARE * len(ids))), len(eligible), len(ids) - 1)
    chosen = eligible[torch.randperm(len(eligible), generator=g)[:k].numpy()]
    return np.isin(block, chosen)


def photo_patches(part: str, n: int, seed: int, n_eval: int = 0) -> PhotoPatches:
    """``n`` patches of ``part`` ("train" or "test"), balanced over the photographs (the first n % 10 classes
    get one more), at positions drawn without replacement (repeating only when ``n`` asks for more patches
    than a photograph has positions) from a generator seeded with ``seed``; the order is shuffled so that
    every slice of the split holds every class.

    ``n_eval`` (test only; ``data.load`` gives the size of the attacker's evaluation slice, the last 10 %): the
    last ``n_eval`` patches come from each photograph's evaluation blocks (``eval_blocks``), the first
    ``n - n_eval`` from its other held-out blocks, each part balanced over the photographs and shuffled on its
    own, so that no evaluation patch shares a pixel with any earlier patch. With ``n_eval`` 0 (the training
    part, or a test split too small to have an evaluation slice) the draw is one part as before."""
    if part not in ("train", "test"):
        raise ValueError(part)
    if n_eval and (part != "test" or not 0 < n_eval <= n):
        raise ValueError(f"n_eval={n_eval} for {part} of {n}")
    g = torch.Generator().manual_seed(int(seed))
    k = len(PHOTOS)
    images, labels, ys, xs, is_eval = [], [], [], [], []
    for c in range(k):
        n_c = n // k + (c < n % k)
        if n_c == 0:
            continue
        pos = photo_positions(c)[0 if part == "train" else 1]
        if n_eval:
            # the eval slice's extra patches go to the first classes, as the split's do: both parts stay
            # balanced to within one patch (n_eval <= n, so e_c <= n_c)
            e_c = n_eval // k + (c < n_eval % k)
            in_eval = eval_blocks(pos, g)
            parts = ((pos[~in_eval], n_c - e_c, False), (pos[in_eval], e_c, True))
        else:
            parts = ((pos, n_c, False),)
        windows = np.lib.stride_tricks.sliding_window_view(photo(c), (PATCH, PATCH), axis=(0, 1))
        for pool, m, ev in parts:
            if m == 0:
                continue
            reps = -(-m // len(pool))
            pick = torch.cat([torch.randperm(len(pool), generator=g) for _ in range(reps)])[:m].numpy()
            yx = pool[pick]
            images.append(torch.from_numpy(np.ascontiguousarray(windows[yx[:, 0], yx[:, 1]])))  # (m, 3, P, P)
            labels.append(torch.full((m,), c, dtype=torch.int64))
            ys.append(torch.from_numpy(yx[:, 0].astype(np.int64)))
            xs.append(torch.from_numpy(yx[:, 1].astype(np.int64)))
            is_eval.append(torch.full((m,), ev))
    if n_eval:
        ev = torch.cat(is_eval)
        first, last = (~ev).nonzero().squeeze(1), ev.nonzero().squeeze(1)
        order = torch.cat([first[torch.randperm(len(first), generator=g)],
                           last[torch.randperm(len(last), generator=g)]])
    else:
        order = torch.randperm(n, generator=g)
    return PhotoPatches(torch.cat(images)[order].contiguous(), torch.cat(labels)[order], torch.cat(ys)[order],
                        torch.cat(xs)[order])
