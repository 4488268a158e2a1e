"""Tests for cem_bench.metrics against scikit-image's reference implementations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

skimage = pytest.importorskip("skimage")
from skimage import data as skdata  # noqa: E402
from skimage.filters import gaussian as sk_gaussian  # noqa: E402
from skimage.metrics import (  # noqa: E402
    mean_squared_error,
    peak_signal_noise_ratio,
    structural_similarity,
)
from skimage.transform import resize  # noqa: E402

from cem_bench.metrics import (  # noqa: E402
    PSNR_MAX_DB,
    MetricAccumulator,
    image_metrics,
    mse_per_image,
    psnr_per_image,
    ssim_map,
    ssim_per_image,
)

ATOL = 1e-4


# ---------------------------------------------------------------- references
def _ref_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """a, b: (C, H, W) float64."""
    return float(
        structural_similarity(
            a,
            b,
            gaussian_weights=True,
            sigma=1.5,
            use_sample_covariance=False,
            data_range=1,
            channel_axis=0,
        )
    )


def _ref_all(x: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
    a = x.double().cpu().numpy()
    b = y.double().cpu().numpy()
    out = {"mse": [], "psnr": [], "ssim": []}
    for i in range(a.shape[0]):
        out["mse"].append(mean_squared_error(a[i], b[i]))
        with np.errstate(divide="ignore"):
            out["psnr"].append(peak_signal_noise_ratio(a[i], b[i], data_range=1))
        out["ssim"].append(_ref_ssim(a[i], b[i]))
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def _assert_matches(x: torch.Tensor, y: torch.Tensor) -> None:
    ref = _ref_all(x, y)
    got = image_metrics(x, y)
    for k in ("mse", "psnr", "ssim"):
        assert got[k].shape == (x.shape[0],)
        assert got[k].dtype == torch.float32
        np.testing.assert_allclose(got[k].double().numpy(), ref[k], rtol=0, atol=ATOL, err_msg=k)
    # the standalone functions agree with image_metrics
    assert torch.equal(mse_per_image(x, y), got["mse"])
    assert torch.equal(psnr_per_image(x, y), got["psnr"])
    assert torch.equal(ssim_per_image(x, y), got["ssim"])


# ---------------------------------------------------------------- images
def _photo(name: str, size: tuple[int, int], gray: bool) -> np.ndarray:
    """Real photograph from scikit-image, centre-cropped to the target aspect,
    resized, as (C, H, W) float64 in [0, 1]."""
    img = getattr(skdata, name)().astype(np.float64) / 255.0  # (H, W, 3)
    h, w = img.shape[:2]
    th, tw = size
    scale = min(h / th, w / tw)
    ch, cw = int(th * scale), int(tw * scale)
    top, left = (h - ch) // 2, (w - cw) // 2
    img = img[top : top + ch, left : left + cw]
    img = resize(img, (th, tw, 3), anti_aliasing=True, order=1)
    if gray:
        img = img @ np.array([0.2125, 0.7154, 0.0721])
        img = img[..., None]
    return np.clip(img, 0.0, 1.0).transpose(2, 0, 1).copy()


def _distort(img: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "blur":
        out = sk_gaussian(img, sigma=1.0, channel_axis=0, preserve_range=True)
    elif kind == "noise":
        out = img + 0.08 * rng.standard_normal(img.shape)
    elif kind == "shift":
        out = np.roll(img, shift=(2, -3), axis=(1, 2))
    elif kind == "contrast":
        out = 0.7 * (img - 0.5) + 0.5 + 0.05
    else:
        raise ValueError(kind)
    return np.clip(out, 0.0, 1.0)


PHOTOS = ("astronaut", "chelsea", "coffee")
DISTORTIONS = ("blur", "noise", "shift", "contrast")


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("shape", [(3, 3, 32, 32), (2, 1, 64, 64), (2, 3, 32, 48), (2, 1, 11, 17)])
def test_random_noise_images(shape):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(shape, generator=g)
    y = (x + 0.2 * torch.randn(shape, generator=g)).clamp(0, 1)
    _assert_matches(x, y)
    # independent noise images (SSIM near 0)
    _assert_matches(x, torch.rand(shape, generator=g))


@pytest.mark.parametrize("gray", [False, True], ids=["rgb", "gray"])
@pytest.mark.parametrize("size", [(64, 64), (32, 32), (32, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_photographs_vs_distortions(size, gray):
    rng = np.random.default_rng(1)
    clean, dist = [], []
    for name in PHOTOS:
        img = _photo(name, size, gray)
        for kind in DISTORTIONS:
            clean.append(img)
            dist.append(_distort(img, kind, rng))
    x = torch.from_numpy(np.stack(clean)).float()
    y = torch.from_numpy(np.stack(dist)).float()
    assert x.shape == (len(PHOTOS) * len(DISTORTIONS), 1 if gray else 3, *size)
    _assert_matches(x, y)
    # the ordering is sensible: every distortion lowers SSIM below 1
    assert (ssim_per_image(x, y) < 0.999).all()


@pytest.mark.parametrize("gray", [False, True], ids=["rgb", "gray"])
def test_identical_images(gray):
    x = torch.from_numpy(np.stack([_photo(n, (32, 48), gray) for n in PHOTOS])).float()
    m = image_metrics(x, x.clone())
    assert torch.all(m["mse"] == 0)
    torch.testing.assert_close(m["psnr"], torch.full((3,), PSNR_MAX_DB), rtol=0, atol=1e-4)
    assert torch.isfinite(m["psnr"]).all()
    torch.testing.assert_close(m["ssim"], torch.ones(3), rtol=0, atol=1e-5)
    for i in range(3):
        a = x[i].double().numpy()
        assert abs(_ref_ssim(a, a) - float(m["ssim"][i])) < ATOL


def test_psnr_cap_and_formula():
    x = torch.zeros(2, 1, 16, 16)
    y = x.clone()
    y[1] += 0.1  # mse = 0.01 -> 20 dB
    p = psnr_per_image(x, y)
    assert p[0].item() == pytest.approx(100.0, abs=1e-4)
    assert p[1].item() == pytest.approx(20.0, abs=1e-4)


def test_bf16_inputs():
    g = torch.Generator().manual_seed(2)
    img = torch.from_numpy(np.stack([_photo(n, (32, 32), False) for n in PHOTOS]))
    x = img.to(torch.bfloat16)
    noise = 0.05 * torch.randn(img.shape, generator=g, dtype=img.dtype)
    y = (img + noise).clamp(0, 1).to(torch.bfloat16)
    # reference on the exact bf16 values, upcast
    _assert_matches(x, y)
    # mixed precision pair is accepted too
    got = ssim_per_image(x, y.float())
    np.testing.assert_allclose(got.numpy(), _ref_all(x, y)["ssim"], rtol=0, atol=ATOL)


def test_full_ssim_map_matches_skimage_full():
    """The full (uncropped) map uses scipy 'reflect' (= symmetric) padding."""
    rng = np.random.default_rng(3)
    a = _photo("chelsea", (24, 30), False)
    b = _distort(a, "noise", rng)
    s = ssim_map(torch.from_numpy(a)[None].float(), torch.from_numpy(b)[None].float())[0]
    for c in range(3):
        _, ref = structural_similarity(
            a[c], b[c], gaussian_weights=True, sigma=1.5,
            use_sample_covariance=False, data_range=1, full=True,
        )
        np.testing.assert_allclose(s[c].double().numpy(), ref, rtol=0, atol=ATOL)


def test_accumulator_weighting():
    g = torch.Generator().manual_seed(4)
    x = torch.rand(8, 3, 16, 20, generator=g)
    y = (x + 0.1 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    y[0] = x[0]  # one PSNR-capped image inside the first batch

    split = MetricAccumulator()
    split.update(x[:3], y[:3])
    split.update(x[3:], y[3:])
    whole = MetricAccumulator()
    whole.update(x, y)
    assert split.count == whole.count == 8

    a, b = split.compute(), whole.compute()
    per_image = image_metrics(x, y)
    for k in ("mse", "psnr", "ssim"):
        assert isinstance(a[k], float)
        assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-7)
        assert a[k] == pytest.approx(per_image[k].double().mean().item(), rel=1e-6, abs=1e-7)
    # image-weighted, not the mean of the two batch means
    batch_mean = (per_image["psnr"][:3].mean() + per_image["psnr"][3:].mean()).item() / 2
    assert abs(a["psnr"] - batch_mean) > 1e-3

    empty = MetricAccumulator().compute()
    assert all(math.isnan(v) for v in empty.values())


def test_shape_validation():
    x = torch.rand(1, 3, 16, 16)
    with pytest.raises(ValueError):
        mse_per_image(x, torch.rand(1, 3, 16, 15))
    with pytest.raises(ValueError):
        ssim_per_image(torch.rand(1, 3, 10, 16), torch.rand(1, 3, 10, 16))
    with pytest.raises(ValueError):
        psnr_per_image(x[0], x[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    g = torch.Generator().manual_seed(5)
    x = torch.rand(4, 3, 32, 32, generator=g)
    y = (x + 0.1 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    cpu = image_metrics(x, y)
    gpu = image_metrics(x.cuda(), y.cuda())
    for k in cpu:
        assert gpu[k].device.type == "cuda"
        torch.testing.assert_close(gpu[k].cpu(), cpu[k], rtol=0, atol=1e-5)
    acc = MetricAccumulator()
    acc.update(x.cuda(), y.cuda())
    out = acc.compute()
    assert out["ssim"] == pytest.approx(cpu["ssim"].double().mean().item(), abs=1e-5)
