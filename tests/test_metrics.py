"""Tests for cem_bench.core.metrics: the per-image metrics against scikit-image, the paper's per-batch metrics
(pytorch_ssim SSIM, batch PSNR) against straightforward float64 implementations written here."""

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

from cem_bench.core.metrics import (  # noqa: E402
    PSNR_MAX_DB,
    MetricAccumulator,
    PaperMetricAccumulator,
    image_metrics,
    mse_per_image,
    paper_metrics,
    psnr_batch,
    psnr_per_image,
    ssim_map,
    ssim_paper,
    ssim_paper_map,
    ssim_paper_per_image,
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


def _photo_pairs(size, gray: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every photograph of PHOTOS at ``size``, each once per distortion of DISTORTIONS: (clean, distorted)."""
    rng = np.random.default_rng(seed)
    clean, dist = [], []
    for name in PHOTOS:
        img = _photo(name, size, gray)
        for kind in DISTORTIONS:
            clean.append(img)
            dist.append(_distort(img, kind, rng))
    return torch.from_numpy(np.stack(clean)).float(), torch.from_numpy(np.stack(dist)).float()


@pytest.mark.parametrize("gray", [False, True], ids=["rgb", "gray"])
@pytest.mark.parametrize("size", [(64, 64), (32, 32), (32, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_photographs_vs_distortions(size, gray):
    x, y = _photo_pairs(size, gray, seed=1)
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


# ================================================================ the paper's conventions
# References written from the formulas (pytorch_ssim._ssim and utils.get_PSNR of xiasong0501/CEM), in
# float64 numpy, sharing no code with cem_bench.core.metrics.
PAPER_ATOL = 1e-5


def _paper_window() -> np.ndarray:
    """pytorch_ssim.create_window(11, C): outer product of exp(-(i-5)^2 / (2 * 1.5^2)) / sum, i = 0..10."""
    g = np.array([math.exp(-((i - 5) ** 2) / (2 * 1.5**2)) for i in range(11)])
    g /= g.sum()
    return np.outer(g, g)


def _ssim_map_from_filter(a: np.ndarray, b: np.ndarray, filt) -> np.ndarray:
    """SSIM map of two (H, W) planes given a 'same'-size filter (population moments, C1, C2 for range 1)."""
    mu1, mu2 = filt(a), filt(b)
    s11 = filt(a * a) - mu1 * mu1
    s22 = filt(b * b) - mu2 * mu2
    s12 = filt(a * b) - mu1 * mu2
    c1, c2 = 0.01**2, 0.03**2
    return ((2 * mu1 * mu2 + c1) * (2 * s12 + c2)) / ((mu1**2 + mu2**2 + c1) * (s11 + s22 + c2))


def _zero_pad_filter_scipy(z: np.ndarray) -> np.ndarray:
    from scipy.signal import convolve2d

    # the window is symmetric, so convolution = correlation; 'fill' with 0 = F.conv2d's zero padding
    return convolve2d(z, _paper_window(), mode="same", boundary="fill", fillvalue=0.0)


def _zero_pad_filter_loops(z: np.ndarray) -> np.ndarray:
    """The same filter as explicit sums: out[i, j] = sum over in-image (i+u, j+v) of w[u+5, v+5] z[i+u, j+v]."""
    w = _paper_window()
    h, wd = z.shape
    out = np.zeros_like(z)
    for i in range(h):
        for j in range(wd):
            acc = 0.0
            for u in range(-5, 6):
                for v in range(-5, 6):
                    if 0 <= i + u < h and 0 <= j + v < wd:
                        acc += w[u + 5, v + 5] * z[i + u, j + v]
            out[i, j] = acc
    return out


def _ref_paper_map(x: torch.Tensor, y: torch.Tensor, filt=_zero_pad_filter_scipy) -> np.ndarray:
    """(N, C, H, W) float64 map: every channel of every image filtered on its own (groups = channels)."""
    a = x.double().cpu().numpy()
    b = y.double().cpu().numpy()
    out = np.empty_like(a)
    for n in range(a.shape[0]):
        for c in range(a.shape[1]):
            out[n, c] = _ssim_map_from_filter(a[n, c], b[n, c], filt)
    return out


def _ref_ssim_paper(x: torch.Tensor, y: torch.Tensor) -> float:
    """pytorch_ssim.SSIM()(x, y): the mean of the full map over the whole batch."""
    return float(_ref_paper_map(x, y).mean())


def _ref_psnr_batch(x: torch.Tensor, y: torch.Tensor) -> float:
    """utils.get_PSNR: 10 log10(1 / mean squared error over the whole batch)."""
    a = x.double().cpu().numpy()
    b = y.double().cpu().numpy()
    return float(10.0 * np.log10(1.0 / np.mean((a - b) ** 2)))


def _assert_paper_matches(x: torch.Tensor, y: torch.Tensor) -> None:
    ref_map = _ref_paper_map(x, y)
    got_map = ssim_paper_map(x, y)
    assert got_map.shape == x.shape and got_map.dtype == torch.float32
    np.testing.assert_allclose(got_map.double().numpy(), ref_map, rtol=0, atol=PAPER_ATOL)
    per_image = ssim_paper_per_image(x, y)
    assert per_image.shape == (x.shape[0],)
    np.testing.assert_allclose(per_image.double().numpy(), ref_map.reshape(x.shape[0], -1).mean(axis=1),
                               rtol=0, atol=PAPER_ATOL)
    got = paper_metrics(x, y)
    for k in ("ssim_paper", "psnr_batch"):
        assert got[k].shape == () and got[k].dtype == torch.float32, k
    assert torch.equal(got["ssim_paper"], ssim_paper(x, y))
    assert torch.equal(got["psnr_batch"], psnr_batch(x, y))
    assert float(got["ssim_paper"]) == pytest.approx(float(ref_map.mean()), abs=PAPER_ATOL)
    assert float(got["psnr_batch"]) == pytest.approx(_ref_psnr_batch(x, y), abs=PAPER_ATOL)


def test_paper_reference_filter_is_zero_padding():
    """The scipy reference filter and the explicit loops agree (so the reference is what it says)."""
    rng = np.random.default_rng(10)
    for shape in [(7, 9), (3, 3), (12, 5)]:
        z = rng.random(shape)
        np.testing.assert_allclose(_zero_pad_filter_scipy(z), _zero_pad_filter_loops(z), rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", [(2, 2, 6, 7), (1, 3, 3, 3), (1, 1, 12, 5)])
def test_paper_ssim_against_loops_on_tiny_images(shape):
    """Images smaller than the window: every map value sees the zero padding."""
    g = torch.Generator().manual_seed(11)
    x = torch.rand(shape, generator=g)
    y = (x + 0.3 * torch.randn(shape, generator=g)).clamp(0, 1)
    ref = _ref_paper_map(x, y, filt=_zero_pad_filter_loops)
    np.testing.assert_allclose(ssim_paper_map(x, y).double().numpy(), ref, rtol=0, atol=PAPER_ATOL)
    assert float(ssim_paper(x, y)) == pytest.approx(float(ref.mean()), abs=PAPER_ATOL)


@pytest.mark.parametrize("shape", [(3, 3, 32, 32), (2, 1, 64, 64), (2, 3, 32, 48), (2, 1, 11, 17), (2, 3, 8, 8)])
def test_paper_metrics_random_images(shape):
    g = torch.Generator().manual_seed(12)
    x = torch.rand(shape, generator=g)
    y = (x + 0.2 * torch.randn(shape, generator=g)).clamp(0, 1)
    _assert_paper_matches(x, y)
    _assert_paper_matches(x, torch.rand(shape, generator=g))  # independent images


@pytest.mark.parametrize("gray", [False, True], ids=["rgb", "gray"])
@pytest.mark.parametrize("size", [(32, 32), (64, 64), (32, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_paper_metrics_photographs_vs_distortions(size, gray):
    x, y = _photo_pairs(size, gray, seed=13)
    _assert_paper_matches(x, y)
    # one photograph-distortion pair at a time, too (a batch of one)
    for i in range(0, len(x), 5):
        _assert_paper_matches(x[i : i + 1], y[i : i + 1])


def test_paper_metrics_identical_images():
    x = torch.from_numpy(np.stack([_photo(n, (32, 32), False) for n in PHOTOS])).float()
    m = paper_metrics(x, x.clone())
    assert float(m["ssim_paper"]) == pytest.approx(1.0, abs=1e-6)
    assert float(m["psnr_batch"]) == pytest.approx(PSNR_MAX_DB, abs=1e-4)


def test_paper_conventions_differ_from_ours_only_where_they_should():
    """Inside the 5-px border band the two SSIM maps are the same numbers (same window, no padding reached);
    on the band they differ, so the averaged values differ; batch PSNR is at most the mean per-image PSNR."""
    rng = np.random.default_rng(14)
    x = torch.from_numpy(np.stack([_photo(n, (32, 32), False) for n in PHOTOS])).float()
    y = torch.from_numpy(np.stack([_distort(a.numpy(), "noise", rng) for a in x])).float()
    ours, paper = ssim_map(x, y), ssim_paper_map(x, y)
    torch.testing.assert_close(paper[..., 5:-5, 5:-5], ours[..., 5:-5, 5:-5], rtol=0, atol=ATOL)  # ours: float32
    assert (paper - ours).abs().amax() > 1e-2
    assert (ssim_paper_per_image(x, y) - ssim_per_image(x, y)).abs().min() > 1e-3
    # Jensen: -log is convex, so the PSNR of the mean MSE is below the mean of the PSNRs
    y2 = y.clone()
    y2[0] = x[0] + 0.01  # one image much closer than the others
    assert float(psnr_batch(x, y2)) < float(psnr_per_image(x, y2).mean()) - 1.0


def test_paper_accumulator_weights_batches_by_size():
    """Two batches of different sizes: the accumulator returns (3 * value_1 + 5 * value_2) / 8, as the
    paper's AverageMeter.update(value, n=batch_size) does, for both metrics."""
    g = torch.Generator().manual_seed(15)
    x = torch.rand(8, 3, 32, 32, generator=g)
    y = x.clone()
    y[:3] = (x[:3] + 0.02 * torch.randn(3, 3, 32, 32, generator=g)).clamp(0, 1)   # close reconstructions
    y[3:] = (x[3:] + 0.30 * torch.randn(5, 3, 32, 32, generator=g)).clamp(0, 1)   # poor ones

    acc = PaperMetricAccumulator()
    first = acc.update(x[:3], y[:3])
    acc.update(x[3:], y[3:])
    assert acc.count == 8 and acc.batches == 2
    assert float(first["psnr_batch"]) == pytest.approx(_ref_psnr_batch(x[:3], y[:3]), abs=PAPER_ATOL)
    got = acc.compute()
    assert all(isinstance(v, float) for v in got.values())

    s1, s2 = _ref_ssim_paper(x[:3], y[:3]), _ref_ssim_paper(x[3:], y[3:])
    p1, p2 = _ref_psnr_batch(x[:3], y[:3]), _ref_psnr_batch(x[3:], y[3:])
    assert got["ssim_paper"] == pytest.approx((3 * s1 + 5 * s2) / 8, abs=PAPER_ATOL)
    assert got["psnr_batch"] == pytest.approx((3 * p1 + 5 * p2) / 8, abs=PAPER_ATOL)
    # the weighting matters: the unweighted mean of the two batch values is far off
    assert abs(got["psnr_batch"] - (p1 + p2) / 2) > 1.0
    assert abs(got["ssim_paper"] - (s1 + s2) / 2) > 0.02
    # weighted SSIM = the per-image mean over all eight, whatever the split; batch PSNR depends on the split
    assert got["ssim_paper"] == pytest.approx(_ref_ssim_paper(x, y), abs=PAPER_ATOL)
    whole = PaperMetricAccumulator()
    whole.update(x, y)
    assert whole.compute()["psnr_batch"] == pytest.approx(_ref_psnr_batch(x, y), abs=PAPER_ATOL)
    assert abs(whole.compute()["psnr_batch"] - got["psnr_batch"]) > 1.0

    empty = PaperMetricAccumulator().compute()
    assert set(empty) == {"ssim_paper", "psnr_batch"} and all(math.isnan(v) for v in empty.values())


def test_paper_metrics_bf16_inputs():
    img = torch.from_numpy(np.stack([_photo(n, (32, 32), False) for n in PHOTOS]))
    g = torch.Generator().manual_seed(16)
    x = img.to(torch.bfloat16)
    y = (img + 0.05 * torch.randn(img.shape, generator=g, dtype=img.dtype)).clamp(0, 1).to(torch.bfloat16)
    _assert_paper_matches(x, y)  # the references see the same bf16 values, upcast


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_paper_metrics_cuda_no_sync():
    g = torch.Generator().manual_seed(17)
    x = torch.rand(4, 3, 32, 32, generator=g)
    y = (x + 0.1 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    cpu = paper_metrics(x, y)
    xc, yc = x.cuda(), y.cuda()
    acc = PaperMetricAccumulator()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(0, 4, 3):  # batches of 3 and 1, no host sync inside
            acc.update(xc[i : i + 3], yc[i : i + 3])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    gpu = paper_metrics(xc, yc)
    for k in cpu:
        assert gpu[k].device.type == "cuda"
        assert float(gpu[k]) == pytest.approx(float(cpu[k]), abs=1e-5)
    out = acc.compute()
    want = (3 * float(psnr_batch(x[:3], y[:3])) + float(psnr_batch(x[3:], y[3:]))) / 4
    assert out["psnr_batch"] == pytest.approx(want, abs=1e-5)
