"""The two real data sets read from the installed wheels (issue 35): ``digits`` and ``photos``.

Shapes, dtype, labels, class counts, determinism, the digits' fixed stratified split, the photos' disjoint
train and test regions (proved from the recorded patch coordinates, and through the resize), a clear error for
a missing package or file, the normalisation constants, and a tiny ``cem-bench train`` on each.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch
from conftest import TINY_TRAIN

from cem_bench.cli import main
from cem_bench.config import TrialConfig, key_specs
from cem_bench.core import data, realdata
from cem_bench.errors import ConfigError

DIGIT_COUNTS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]   # the 1,797 digits of the UCI set, by class


def load(**flat):
    return data.load(TrialConfig.from_flat(flat).data)


def _hashes(images: torch.Tensor) -> list[str]:
    return sorted(hashlib.sha1(im.numpy().tobytes()).hexdigest() for im in images)


def test_both_are_datasets_of_the_config():
    assert {"digits", "photos"} <= set(key_specs()["data.dataset"].choices)
    help_text = key_specs()["data.dataset"].help
    assert "digits" in help_text and "photos" in help_text


# ---------------------------------------------------------------------------------------- digits
def test_digits_are_32x32_rgb_uint8_in_a_fixed_stratified_split():
    s = load(**{"data.dataset": "digits"})
    assert (len(s.train), len(s.test)) == (1437, 360) and s.num_classes == 10 and s.name == "digits"
    for split in (s.train, s.test):
        assert split.images.dtype == torch.uint8 and split.images.shape[1:] == (3, 32, 32)
        assert split.labels.dtype == torch.int64 and 0 <= split.labels.min() and split.labels.max() <= 9
        assert torch.equal(split.images[:, 0], split.images[:, 1]) and torch.equal(split.images[:, 0], split.images[:, 2])
    train_counts = torch.bincount(s.train.labels, minlength=10)
    test_counts = torch.bincount(s.test.labels, minlength=10)
    assert (train_counts + test_counts).tolist() == DIGIT_COUNTS
    # stratified: every class holds its share of the test set to within one image
    share = torch.tensor(DIGIT_COUNTS, dtype=torch.float64) * 360 / 1797
    assert (test_counts - share).abs().max() <= 1
    # the full image range is used (0..16 -> 0..255) and the digit fills the frame (ink beyond the centre)
    assert s.train.images.max() == 255 and s.train.images.min() == 0
    ink = (s.train.images[:, 0].float() > 128).float().mean(0)
    assert ink[4:28, 4:28].mean() > 0.2 and ink[:, :4].mean() < 0.05


def test_a_digits_size_above_its_split_is_refused_and_the_splits_are_the_configs():
    """A seeded subset cannot be larger than its split: data.train_size 2000 on digits trained on its 1,437 images
    while the config, and so trials.parquet, kept 2000. The sizes the config refuses by are the loader's."""
    from cem_bench.config import FIXED_SPLITS
    s = load(**{"data.dataset": "digits"})
    assert FIXED_SPLITS["digits"] == {"train": len(s.train), "test": len(s.test)}
    with pytest.raises(ConfigError, match=r"data.train_size: 2,000 is more than the train split of digits "
                                          r"holds \(1,437 images\); allowed: 1 to 1,437, or empty for all of it"):
        TrialConfig.from_flat({"data.dataset": "digits", "data.train_size": 2000})
    with pytest.raises(ConfigError, match=r"data.test_size: 361 is more than the test split of digits"):
        TrialConfig.from_flat({"data.dataset": "digits", "data.test_size": 361})
    assert len(load(**{"data.dataset": "digits", "data.train_size": 1437}).train) == 1437   # all of it is allowed
    TrialConfig.from_flat({"data.dataset": "synthetic", "data.train_size": 2000})       # generated: any size


def test_digits_split_is_the_whole_file_each_image_once():
    """Train and test together are the 1,797 images of sklearn's ``load_digits`` (read here by scikit-learn's
    own reader), upscaled, each exactly once."""
    from sklearn.datasets import load_digits
    s = load(**{"data.dataset": "digits"})
    ref = realdata.digits_upscale(load_digits().images)
    assert _hashes(torch.cat([s.train.images, s.test.images])) == _hashes(ref)


def test_digits_upscale_is_bilinear_by_four():
    """One ink count of 16 at (3, 3) becomes a smooth symmetric bump over output pixels 10..17 (input
    coordinates within one pixel of 3), peaking at 0.875^2 of white on the central 2x2: bilinear, not a
    nearest-neighbour 4x4 block."""
    x = np.zeros((1, 8, 8))
    x[0, 3, 3] = 16
    up = realdata.digits_upscale(x)[0, 0].float()
    assert up.max() == round(255 * 0.875 ** 2) and (up[13:15, 13:15] == up.max()).all()
    bump = up[10:18, 10:18]
    assert (bump > 0).all() and up.sum() == bump.sum()
    assert torch.equal(up, up.t()) and torch.equal(bump, bump.flip(0)) and torch.equal(bump, bump.flip(1))
    assert len(torch.unique(bump)) > 4


def test_digits_are_deterministic_and_the_test_set_ignores_data_seed():
    a, b = load(**{"data.dataset": "digits"}), load(**{"data.dataset": "digits", "data.seed": 7})
    assert torch.equal(a.test.images, b.test.images) and torch.equal(a.test.labels, b.test.labels)
    assert torch.equal(a.train.images, b.train.images)
    # data.train_size / data.test_size: seeded subsets of the two fixed sets, as for CIFAR
    c = load(**{"data.dataset": "digits", "data.train_size": 100, "data.test_size": 50})
    d = load(**{"data.dataset": "digits", "data.train_size": 100, "data.test_size": 50})
    e = load(**{"data.dataset": "digits", "data.train_size": 100, "data.test_size": 50, "data.seed": 1})
    assert len(c.train) == 100 and len(c.test) == 50 and len(c.attack_aux) == 45 and len(c.attack_eval) == 5
    assert torch.equal(c.train.images, d.train.images) and torch.equal(c.test.labels, d.test.labels)
    assert not torch.equal(c.train.images, e.train.images)
    assert set(_hashes(c.test.images)) <= set(_hashes(a.test.images))


# ---------------------------------------------------------------------------------------- photos
def test_the_digits_test_subset_does_not_change_with_train_size():
    """train_size and test_size drew from one generator, so setting data.train_size changed which test images
    (and attack_eval images) a run measured on: two runs that differed only in train_size had different test
    sets. The generated sets never did."""
    ref = load(**{"data.dataset": "digits", "data.test_size": 100})
    for n in (500, 1436):
        s = load(**{"data.dataset": "digits", "data.test_size": 100, "data.train_size": n})
        assert torch.equal(s.test.images, ref.test.images) and torch.equal(s.attack_eval.labels, ref.attack_eval.labels)
        assert len(s.train) == n


def test_photos_are_balanced_32x32_rgb_uint8_patches_of_ten_photographs():
    s = load(**{"data.dataset": "photos"})
    assert (len(s.train), len(s.test)) == (4096, 2560) and s.num_classes == 10 == len(realdata.PHOTOS)
    for split, n in ((s.train, 4096), (s.test, 2560)):
        assert split.images.dtype == torch.uint8 and split.images.shape == (n, 3, 32, 32)
        counts = torch.bincount(split.labels, minlength=10)
        assert counts.max() - counts.min() <= 1 and counts.sum() == n
    # colour: the channels differ (the photographs are not grey)
    assert (s.train.images[:, 0].float() - s.train.images[:, 2].float()).abs().mean() > 10
    # shuffled: the attacker's 90 % / 10 % slices of the test set hold every photograph
    assert torch.unique(s.attack_eval.labels).numel() == 10
    small = load(**{"data.dataset": "photos", "data.train_size": 55, "data.test_size": 20})
    assert torch.bincount(small.train.labels, minlength=10).tolist() == [6] * 5 + [5] * 5


def test_every_photograph_is_a_local_rgb_file_of_its_wheel():
    """Only files the wheels carry: each is found in the installed package folder, not in a download cache."""
    for c, (name, f) in enumerate(realdata.PHOTOS):
        path = realdata.locate(f, "photos")
        assert path.startswith(realdata.package_dir(f.package)) and f.package in ("skimage", "sklearn")
        img = realdata.photo(c)
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3 and min(img.shape[:2]) == 192, name
        rb = np.abs(img[..., 0].astype(int) - img[..., 2])
        assert (rb > 0).mean() > 0.5 and rb.max() > 64, f"{name} is not a colour photograph"


def test_photos_are_deterministic_from_data_seed():
    a = realdata.photo_patches("train", 300, seed=5)
    b = realdata.photo_patches("train", 300, seed=5)
    c = realdata.photo_patches("train", 300, seed=6)
    assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("images", "labels", "y", "x"))
    assert not torch.equal(a.images, c.images)
    s, t = load(**{"data.dataset": "photos", "data.train_size": 200}), load(**{"data.dataset": "photos",
                                                                                 "data.train_size": 200})
    assert torch.equal(s.train.images, t.train.images) and torch.equal(s.test.images, t.test.images)


def _boxes_by_photo(p: realdata.PhotoPatches):
    return {c: torch.stack([p.y[p.labels == c], p.x[p.labels == c]], 1) for c in range(len(realdata.PHOTOS))}


@pytest.mark.parametrize("seed", [0, 3])
def test_no_test_pixel_lies_in_any_training_patch(seed):
    """From the recorded coordinates: in each photograph, no test patch's 32x32 box meets any training
    patch's box, even with the training box grown by the guard; every patch is the crop at its coordinates;
    every test box lies in the held-out blocks and no training box touches them."""
    cfg = TrialConfig.from_flat({"data.dataset": "photos", "data.seed": seed}).data
    train = realdata.photo_patches("train", 4096, seed=cfg.seed * 2 + 1)
    test = realdata.photo_patches("test", 2560, seed=cfg.seed * 2 + 2, n_eval=2560 - data.inference_cut(2560))
    assert torch.equal(test.images, data.load(cfg).test.images)   # the layout data.load uses
    tr, te = _boxes_by_photo(train), _boxes_by_photo(test)
    P, G = realdata.PATCH, realdata.PHOTO_GUARD
    for c in range(len(realdata.PHOTOS)):
        # boxes [y, y+P) x [x, x+P): two meet iff |dy| < P and |dx| < P; with the guard, iff both < P + G
        d = (tr[c][:, None, :] - te[c][None, :, :]).abs().max(-1).values
        assert d.min() >= P + G, f"photograph {c}: a test box is {d.min()} px from a training box"
        img = realdata.photo(c)
        held = realdata.held_out_mask(*img.shape[:2])
        for (y, x) in te[c].tolist():
            assert held[y:y + P, x:x + P].all()
        for (y, x) in tr[c].tolist():
            assert not held[max(0, y - G):y + P + G, max(0, x - G):x + P + G].any()
        for p, boxes in ((train, tr[c]), (test, te[c])):
            (y, x) = boxes[0].tolist()
            first = p.images[p.labels == c][0]
            assert torch.equal(first, torch.from_numpy(np.ascontiguousarray(img[y:y + P, x:x + P].transpose(2, 0, 1))))
        # the held-out region is spread over the photograph: test patches from several blocks
        blocks = {(y // realdata.PHOTO_BLOCK, x // realdata.PHOTO_BLOCK) for y, x in te[c].tolist()}
        assert len(blocks) >= 4


def _positions_by_content(images: torch.Tensor, labels: torch.Tensor) -> list[tuple[int, list[tuple[int, int]]]]:
    """(photograph, every test position whose 32x32 window is the image) of each image, found from its pixels
    alone (not from how the split was drawn)."""
    P = realdata.PATCH
    where = {}
    for c in range(len(realdata.PHOTOS)):
        img = realdata.photo(c)
        for y, x in realdata.photo_positions(c)[1].tolist():
            key = (c, np.ascontiguousarray(img[y:y + P, x:x + P].transpose(2, 0, 1)).tobytes())
            where.setdefault(key, []).append((y, x))
    return [(c, where[(c, im.numpy().tobytes())]) for im, c in zip(images, labels.tolist())]


@pytest.mark.parametrize("flat", [{}, {"data.test_size": 1280}, {"data.test_size": 200, "data.seed": 3}])
def test_the_attackers_eval_patches_share_no_pixel_with_its_aux_patches(flat):
    """data.attack_split=inference on photos: no evaluation patch overlaps any aux patch of its photograph (a
    random 90/10 cut of patches from shared blocks gave every eval patch a 76-97 % overlapping aux patch), no
    image is on both sides, and the eval slice still holds every photograph, balanced to within one patch."""
    s = load(**{"data.dataset": "photos", **flat})
    P = realdata.PATCH
    aux, ev = _positions_by_content(s.attack_aux.images, s.attack_aux.labels), \
        _positions_by_content(s.attack_eval.images, s.attack_eval.labels)
    aux_boxes = {c: torch.tensor([yx for cc, ps in aux if cc == c for yx in ps]) for c in range(len(realdata.PHOTOS))}
    worst = 0.0
    for c, ps in ev:
        for y, x in ps:
            d = (aux_boxes[c] - torch.tensor([y, x])).abs()
            overlap = ((P - d[:, 0]).clamp(min=0) * (P - d[:, 1]).clamp(min=0)).max().item() / P ** 2
            worst = max(worst, overlap)
    assert worst == 0, f"an eval patch shares {worst:.0%} of its pixels with an aux patch"
    assert not set(_hashes(s.attack_aux.images)) & set(_hashes(s.attack_eval.images))
    counts = torch.bincount(s.attack_eval.labels, minlength=10)
    assert counts.min() >= 1 and counts.max() - counts.min() <= 1
    aux_counts = torch.bincount(s.attack_aux.labels, minlength=10)
    assert aux_counts.max() - aux_counts.min() <= 1
    # the whole test split (what accuracy is measured on) stays balanced, and far from the training patches
    total = counts + aux_counts
    assert total.max() - total.min() <= 1 and total.sum() == len(s.test)


def _resize(a: np.ndarray, w: int, h: int) -> np.ndarray:
    """``a`` (float32) resized as the photographs are (Pillow, bilinear), without rounding."""
    from PIL import Image
    return np.asarray(Image.fromarray(a).resize((w, h), Image.Resampling.BILINEAR))


def test_the_guard_keeps_the_resize_from_mixing_train_and_test_source_pixels():
    """Through the resize: the source pixels that any held-out output pixel reads (Pillow's bilinear filter,
    support one output pixel each side) reach no output pixel a training patch may use. Resizing their
    indicator (a float image, no rounding) with the same call gives exactly 0 wherever training is allowed; the
    complement's gives exactly 0 on the held-out blocks, so the indicator holds every source pixel they read."""
    from PIL import Image
    P, G = realdata.PATCH, realdata.PHOTO_GUARD
    for c, (name, f) in enumerate(realdata.PHOTOS):
        with Image.open(realdata.locate(f, "photos")) as im:
            W, H = im.size
        w, h = realdata.resized_size(W, H)
        held = realdata.held_out_mask(h, w)
        sx, sy = W / w, H / h
        src = np.zeros((H, W), dtype=np.float32)
        for by in range(h // realdata.PHOTO_BLOCK):
            for bx in range(w // realdata.PHOTO_BLOCK):
                y0, x0 = by * realdata.PHOTO_BLOCK, bx * realdata.PHOTO_BLOCK
                if not held[y0, x0]:
                    continue
                y1, x1 = y0 + realdata.PHOTO_BLOCK, x0 + realdata.PHOTO_BLOCK
                # source pixels j with j + 0.5 inside ((o0 - 0.5) s, (o1 + 0.5) s): what outputs o0..o1-1 read
                jy = np.arange(H) + 0.5
                jx = np.arange(W) + 0.5
                ry = (jy > (y0 - 0.5) * sy) & (jy < (y1 + 0.5) * sy)
                rx = (jx > (x0 - 0.5) * sx) & (jx < (x1 + 0.5) * sx)
                src[np.ix_(ry, rx)] = 1.0
        # src is all that the held-out pixels read: its complement reaches none of them
        assert (_resize(1.0 - src, w, h)[held] == 0).all()
        reached = _resize(src, w, h) > 0
        tr, _ = realdata.photo_positions(c)
        usable = np.zeros_like(held)
        for y, x in tr:
            usable[y:y + P, x:x + P] = True
        assert not (usable & _grown(held, G)).any()
        assert not (reached & usable).any(), f"{name}: a training pixel reads a source pixel of a test block"


def _grown(mask: np.ndarray, g: int) -> np.ndarray:
    """``mask`` grown by ``g`` pixels in every direction (corners included)."""
    padded = np.pad(mask, g)
    out = np.zeros_like(mask)
    for dy in range(2 * g + 1):
        for dx in range(2 * g + 1):
            out |= padded[dy:dy + mask.shape[0], dx:dx + mask.shape[1]]
    return out


def test_photos_sizes_follow_data_train_size_and_test_size():
    s = load(**{"data.dataset": "photos", "data.train_size": 64, "data.test_size": 40, "data.attack_split": "training"})
    assert len(s.train) == 64 and len(s.test) == 40
    assert torch.equal(s.attack_aux.images, s.train.images) and torch.equal(s.attack_eval.images, s.test.images)
    # more patches than a photograph has positions: positions repeat, still only from the allowed ones
    many = realdata.photo_patches("test", 10 * 1200, seed=0)
    boxes = _boxes_by_photo(many)
    _, te = realdata.photo_positions(0)
    allowed = {tuple(p) for p in te.tolist()}
    assert {tuple(p) for p in boxes[0].tolist()} <= allowed and len(boxes[0]) == 1200 > len(allowed)
    # with the attacker's eval slice: each part repeats within its own blocks, never across
    split = realdata.photo_patches("test", 10 * 1200, seed=0, n_eval=1200)
    aux = {tuple(p) for p in _boxes_by_photo(realdata.PhotoPatches(*(getattr(split, k)[:-1200] for k in
                                                                     ("images", "labels", "y", "x"))))[0].tolist()}
    ev = {tuple(p) for p in _boxes_by_photo(realdata.PhotoPatches(*(getattr(split, k)[-1200:] for k in
                                                                    ("images", "labels", "y", "x"))))[0].tolist()}
    assert aux | ev <= allowed and not aux & ev
    assert {(y // realdata.PHOTO_BLOCK, x // realdata.PHOTO_BLOCK) for y, x in ev}.isdisjoint(
        {(y // realdata.PHOTO_BLOCK, x // realdata.PHOTO_BLOCK) for y, x in aux})


# ---------------------------------------------------------------------------------------- errors
def test_a_missing_file_is_a_data_error_naming_package_and_file(monkeypatch, tmp_path):
    real = realdata.package_dir
    monkeypatch.setattr(realdata, "package_dir", lambda p: str(tmp_path) if p == "skimage" else real(p))
    with pytest.raises(data.DataError) as e:
        load(**{"data.dataset": "photos"})
    msg = str(e.value)
    assert "scikit-image" in msg and "skimage/data/astronaut.png" in msg and str(tmp_path) in msg
    assert "data.dataset=photos" in msg and "downloaded" in msg

    monkeypatch.setattr(realdata, "package_dir", lambda p: str(tmp_path) if p == "sklearn" else real(p))
    with pytest.raises(data.DataError) as e:
        load(**{"data.dataset": "digits"})
    assert "scikit-learn" in str(e.value) and "sklearn/datasets/data/digits.csv.gz" in str(e.value)


def test_a_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(realdata, "package_dir", lambda p: None)
    with pytest.raises(data.DataError, match=r"pip install scikit-learn"):
        load(**{"data.dataset": "digits"})


def test_a_broken_file_is_a_data_error(monkeypatch, tmp_path):
    (tmp_path / "data").mkdir()
    for _, f in realdata.PHOTOS:
        if f.package == "skimage":
            (tmp_path / f.path).write_bytes(b"not an image")
    real = realdata.package_dir
    monkeypatch.setattr(realdata, "package_dir", lambda p: str(tmp_path) if p == "skimage" else real(p))
    with pytest.raises(data.DataError, match="cannot decode"):
        load(**{"data.dataset": "photos"})


# ---------------------------------------------------------------------------------------- normalisation
def _channel_stats(images: torch.Tensor) -> tuple[list[float], list[float]]:
    x = images.float().div(255).permute(1, 0, 2, 3).reshape(3, -1)
    return x.mean(1).tolist(), x.std(1).tolist()


def test_normalisation_constants_are_those_of_the_training_data():
    """The hard-coded means and stds are the training data's (digits: the 1,437 training images; photos: the
    default training set, data.seed 0); the splits carry them."""
    d = load(**{"data.dataset": "digits"})
    mean, std = _channel_stats(d.train.images)
    assert mean == pytest.approx(list(realdata.DIGITS_MEAN), abs=1e-4)
    assert std == pytest.approx(list(realdata.DIGITS_STD), abs=1e-4)
    assert d.mean.flatten().tolist() == pytest.approx(list(realdata.DIGITS_MEAN))
    p = load(**{"data.dataset": "photos"})
    mean, std = _channel_stats(p.train.images)
    assert mean == pytest.approx(list(realdata.PHOTOS_MEAN), abs=1e-4)
    assert std == pytest.approx(list(realdata.PHOTOS_STD), abs=1e-4)
    assert p.std.flatten().tolist() == pytest.approx(list(realdata.PHOTOS_STD))


# ---------------------------------------------------------------------------------------- a tiny train
@pytest.mark.parametrize("dataset", ["digits", "photos"])
def test_a_tiny_train_runs_on_each(dataset, tmp_path, capsys):
    out = tmp_path / "run"
    # digits' test split has 360 images, all of them asked for (more is refused); the run records what it used
    flat = {**TINY_TRAIN, "data.dataset": dataset, "train.epochs": 1, "cem.warmup_epochs": 0,
            "attack.rmle_iterations": 3, "data.test_size": 360 if dataset == "digits" else 400}
    sets = [a for k, v in flat.items() for a in ("--set", f"{k}={v}")]
    assert main(["train", *sets, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert dataset in printed and "epoch   1" in printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["info"]["config"]["data.dataset"] == dataset
    images = metrics["info"]["images"]
    assert images["train"] == 256 and images["test"] == (360 if dataset == "digits" else 400), images
    assert images["attack_aux"] + images["attack_eval"] == images["test"]    # the inference protocol's cut
    for k in ("test_acc", "attack_ssim"):
        assert math.isfinite(metrics[k]), k


def test_a_corrupt_digits_file_is_a_data_error(monkeypatch, tmp_path):
    """A digits.csv.gz with bytes flipped inside its deflate stream (not truncated) raised zlib.error, which is
    no OSError or ValueError: a traceback instead of the message saying to reinstall scikit-learn."""
    import shutil
    import zlib
    real = realdata.package_dir
    copy = tmp_path / "datasets" / "data" / "digits.csv.gz"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(realdata.locate(realdata.DIGITS_FILE, "digits"), copy)
    raw = bytearray(copy.read_bytes())
    for i in range(2000, 2020):
        raw[i] ^= 0xFF
    copy.write_bytes(bytes(raw))
    with pytest.raises(zlib.error):   # what the test is about: the bytes break the stream itself
        np.loadtxt(copy, delimiter=",")
    monkeypatch.setattr(realdata, "package_dir", lambda p: str(tmp_path) if p == "sklearn" else real(p))
    with pytest.raises(data.DataError, match=r"data.dataset=digits: cannot read .*digits.csv.gz \(error: .*"
                                             r"pip install --force-reinstall scikit-learn"):
        load(**{"data.dataset": "digits"})
