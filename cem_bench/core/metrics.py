"""Image-quality metrics for model-inversion evaluation (batched, pure torch).

Conventions
-----------
* Images are float tensors of shape ``(N, C, H, W)`` with values in ``[0, 1]``
  (data range 1). Any float dtype is accepted (bf16 included); all arithmetic
  is done on the inputs' device, in float32 (the paper's SSIM map in float64,
  see :func:`_ssim_paper_map_work`). Nothing synchronises with the host
  except the accumulators' ``compute``, which returns Python floats.
* cem-bench's own metrics (``mse``, ``psnr``, ``ssim``) are computed **per
  image** and returned as tensors of shape ``(N,)``; dataset-level numbers
  are image-weighted means of those, whatever the batch size.
* ``mse``  : mean over C, H, W of ``(x - y) ** 2``.
* ``psnr`` : ``10 * log10(1 / mse)``, with mse clamped at ``1e-10`` so that
  identical images give a finite value: PSNR is capped at 100 dB.
* ``ssim`` : Wang et al. (2004) SSIM, matching scikit-image's
  ``structural_similarity(a, b, gaussian_weights=True, sigma=1.5,
  use_sample_covariance=False, data_range=1, channel_axis=0)`` per image:
  11x11 Gaussian window (sigma 1.5, truncate 3.5), K1 = 0.01, K2 = 0.03,
  population (co)variances, scipy ``mode='reflect'`` boundary handling
  (= numpy ``'symmetric'``: the edge pixel is repeated), SSIM map cropped by
  the window radius (5 px) on every border, then averaged over the map and
  over channels. Because of the crop, the averaged value only depends on
  pixels whose window lies entirely inside the image; the boundary handling
  only matters for the full map returned by :func:`ssim_map`.

The paper's conventions (extra columns)
---------------------------------------
The CEM paper's code (xiasong0501/CEM, ``MIA_train.test_attack``; see
docs/reference.md §8 and docs/metrics.md) scores the attack per evaluation
batch and averages the batch values with an ``AverageMeter`` weighted by the
batch size. Two of its numbers differ from ours and are reproduced here:

* ``ssim_paper`` : the ``pytorch_ssim`` package: 11x11 Gaussian window
  (sigma 1.5, taps normalised over the 11 positions), C1 = 0.01 ** 2,
  C2 = 0.03 ** 2, ``F.conv2d`` per channel with ``padding = 5`` and *zero*
  padding (the window is not renormalised at the border), population
  moments, and the mean of the *whole* map (borders included) over channels
  and images of the batch. It differs from ``ssim`` on the 5-px border
  band, which is 53 % of a 32x32 image (inside it the two maps agree), and
  is usually higher there: the zeros are shared by both images. Any H, W >= 1
  is accepted.
* ``psnr_batch`` : ``10 * log10(1 / mse_batch)`` with ``mse_batch`` the mean
  squared error over the whole batch (same 1e-10 floor, so at most 100 dB;
  the paper's code has no floor). By Jensen's inequality it is at most the
  mean of the per-image PSNRs of that batch, and it depends on how the
  images are grouped into batches.

:class:`PaperMetricAccumulator` averages both over batches weighted by batch
size, as the paper's ``AverageMeter.update(value, batch_size)`` does. Since
the paper's batch SSIM is a mean over equal-size images, the weighted
``ssim_paper`` equals the image-weighted mean of
:func:`ssim_paper_per_image` and does not depend on the batch size;
``psnr_batch`` does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "mse_per_image",
    "psnr_per_image",
    "ssim_map",
    "ssim_per_image",
    "image_metrics",
    "MetricAccumulator",
    "ssim_paper_map",
    "ssim_paper_per_image",
    "ssim_paper",
    "psnr_batch",
    "paper_metrics",
    "PaperMetricAccumulator",
    "PSNR_MAX_DB",
]

_MSE_FLOOR = 1e-10
#: PSNR value returned for identical images (10 * log10(1 / 1e-10)).
PSNR_MAX_DB = 100.0

_SSIM_SIGMA = 1.5
_SSIM_TRUNCATE = 3.5
_SSIM_K1 = 0.01
_SSIM_K2 = 0.03
_SSIM_RADIUS = int(_SSIM_TRUNCATE * _SSIM_SIGMA + 0.5)  # 5, as in scipy.ndimage
_SSIM_WIN = 2 * _SSIM_RADIUS + 1  # 11


def _check_pair(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    if x.shape != y.shape:
        raise ValueError(f"shape mismatch: {tuple(x.shape)} vs {tuple(y.shape)}")
    if x.dim() != 4:
        raise ValueError(f"expected (N, C, H, W) tensors, got shape {tuple(x.shape)}")
    if not (x.is_floating_point() and y.is_floating_point()):
        raise TypeError(f"expected float tensors, got {x.dtype} and {y.dtype}")
    return x.float(), y.float()


def mse_per_image(x: Tensor, y: Tensor) -> Tensor:
    """Per-image mean squared error over C, H, W, in float32. Returns ``(N,)``."""
    x, y = _check_pair(x, y)
    return (x - y).square().flatten(1).mean(dim=1)


def _psnr_from_mse(mse: Tensor) -> Tensor:
    # data range 1 -> 10 * log10(1 / mse); mse floor 1e-10 caps PSNR at 100 dB.
    return -10.0 * torch.log10(mse.clamp_min(_MSE_FLOOR))


def psnr_per_image(x: Tensor, y: Tensor) -> Tensor:
    """Per-image PSNR in dB for data range 1, capped at 100 dB. Returns ``(N,)``."""
    return _psnr_from_mse(mse_per_image(x, y))


def _kernel_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


def _gaussian_kernel1d(device: torch.device, dtype: torch.dtype) -> Tensor:
    # Same taps as scipy.ndimage.gaussian_filter(sigma=1.5, truncate=3.5). Built on the device: a
    # host-to-device copy of the taps would synchronise with the host on every batch.
    r = torch.arange(-_SSIM_RADIUS, _SSIM_RADIUS + 1, dtype=_kernel_dtype(device), device=device)
    k = torch.exp(-0.5 * (r / _SSIM_SIGMA) ** 2)
    k = k / k.sum()
    return k.to(dtype)


def _symmetric_index(n: int, pad: int, device: torch.device) -> Tensor:
    """Indices of a length-``n`` axis padded by ``pad`` on both sides, numpy
    'symmetric' / scipy 'reflect' style (``d c b a | a b c d | d c b a``),
    valid for any ``pad`` (wraps around repeatedly if ``pad > n``)."""
    i = torch.arange(-pad, n + pad, device=device)
    period = 2 * n
    i = torch.remainder(i, period)
    return torch.where(i >= n, period - 1 - i, i)


def _gaussian_filter_same(z: Tensor) -> Tensor:
    """Separable Gaussian filter of ``(B, 1, H, W)`` with symmetric boundary,
    output the same size as the input (scipy ``gaussian_filter`` semantics)."""
    _, _, h, w = z.shape
    p = _SSIM_RADIUS
    z = z.index_select(2, _symmetric_index(h, p, z.device))
    z = z.index_select(3, _symmetric_index(w, p, z.device))
    k = _gaussian_kernel1d(z.device, z.dtype)
    z = F.conv2d(z, k.view(1, 1, -1, 1))
    return F.conv2d(z, k.view(1, 1, 1, -1))


def _ssim_from_moments(stats: Tensor) -> Tensor:
    """The SSIM map from the filtered moments ``cat([x, y, x*x, y*y, x*y])`` (population (co)variances,
    K1 = 0.01, K2 = 0.03 for data in [0, 1]); the two conventions differ only in how they filter."""
    ux, uy, uxx, uyy, uxy = stats.chunk(5, dim=0)
    vx, vy, vxy = uxx - ux * ux, uyy - uy * uy, uxy - ux * uy
    c1, c2 = _SSIM_K1**2, _SSIM_K2**2
    return ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))


def ssim_map(x: Tensor, y: Tensor) -> Tensor:
    """Full SSIM map ``(N, C, H, W)`` (float32), as scikit-image's ``full=True``
    output with ``gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
    data_range=1``: no border cropping, symmetric ('reflect' in scipy) padding."""
    x, y = _check_pair(x, y)
    n, c, h, w = x.shape
    if h < _SSIM_WIN or w < _SSIM_WIN:
        raise ValueError(f"SSIM needs H, W >= {_SSIM_WIN}, got {h}x{w}")
    x = x.reshape(n * c, 1, h, w)
    y = y.reshape(n * c, 1, h, w)
    # One filtering pass for the five moment images.
    stats = _gaussian_filter_same(torch.cat([x, y, x * x, y * y, x * y], dim=0))
    return _ssim_from_moments(stats).reshape(n, c, h, w)


def ssim_per_image(x: Tensor, y: Tensor) -> Tensor:
    """Per-image SSIM (mean over channels and over the map cropped by 5 px on
    each border), float32, shape ``(N,)``. Requires H, W >= 11."""
    s = ssim_map(x, y)
    p = _SSIM_RADIUS
    s = s[:, :, p : s.shape[2] - p, p : s.shape[3] - p]
    # Equal-size channels: mean over (C, H', W') == mean of per-channel means.
    return s.flatten(1).mean(dim=1)


def image_metrics(x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """Per-image ``{"mse", "psnr", "ssim"}`` tensors of shape ``(N,)``."""
    mse = mse_per_image(x, y)
    return {"mse": mse, "psnr": _psnr_from_mse(mse), "ssim": ssim_per_image(x, y)}


class _SumAccumulator:
    """Weighted sums of a batch's metrics kept on the device (no host sync in ``update``); ``compute`` syncs
    once and divides by the images added. Subclasses say which metrics (``KEYS``) and how a batch adds
    (``_batch_sums``)."""

    KEYS: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sums: dict[str, Tensor] | None = None
        self._count: int = 0
        self._batches: int = 0

    @property
    def count(self) -> int:
        """Images added."""
        return self._count

    @property
    def batches(self) -> int:
        """Batches added."""
        return self._batches

    def _batch_sums(self, x: Tensor, y: Tensor, acc_dtype) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        raise NotImplementedError  # pragma: no cover - abstract

    def update(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        """Add a batch; returns its metrics (device tensors)."""
        acc_dtype = torch.float32 if x.device.type == "mps" else torch.float64   # float64 where the backend has it
        m, batch = self._batch_sums(x, y, acc_dtype)
        if self._sums is None:
            self._sums = batch
        else:
            for k in self.KEYS:
                self._sums[k] = self._sums[k] + batch[k]
        self._count += int(x.shape[0])
        self._batches += 1
        return m

    def compute(self) -> dict[str, float]:
        """The weighted means; NaN for every key if nothing was added."""
        if self._sums is None or self._count == 0:
            return {k: math.nan for k in self.KEYS}
        stacked = torch.stack([self._sums[k] for k in self.KEYS]).cpu()
        return {k: float(v) / self._count for k, v in zip(self.KEYS, stacked.tolist())}


class MetricAccumulator(_SumAccumulator):
    """Running image-weighted means of MSE, PSNR and SSIM (per image, then averaged: cem-bench's
    convention, which does not depend on the batch size; the paper's are ``PaperMetricAccumulator``)."""

    KEYS = ("mse", "psnr", "ssim")

    def _batch_sums(self, x, y, acc_dtype):
        m = image_metrics(x, y)
        return m, {k: m[k].to(acc_dtype).sum() for k in self.KEYS}


# ------------------------------------------------------------------ the paper's conventions
def _paper_kernel1d(device: torch.device, dtype: torch.dtype) -> Tensor:
    # pytorch_ssim.gaussian(11, 1.5): exp(-(i - 5)^2 / (2 * 1.5^2)), i = 0..10, normalised.
    # The same taps as _gaussian_kernel1d; kept apart so the two conventions can move independently.
    # Built on the device (no host-to-device copy, so no host sync).
    r = torch.arange(_SSIM_WIN, dtype=_kernel_dtype(device), device=device) - _SSIM_WIN // 2
    k = torch.exp(-(r**2) / (2 * _SSIM_SIGMA**2))
    return (k / k.sum()).to(dtype)


def ssim_paper_map(x: Tensor, y: Tensor) -> Tensor:
    """The paper's SSIM map ``(N, C, H, W)``, float32: ``pytorch_ssim``'s zero-padded Gaussian SSIM
    (see :func:`_ssim_paper_map_work`), no border cropping."""
    return _ssim_paper_map_work(x, y).float()


def _ssim_paper_map_work(x: Tensor, y: Tensor) -> Tensor:
    """SSIM map ``(N, C, H, W)`` as ``pytorch_ssim._ssim`` computes it: per channel,
    11x11 Gaussian window (sigma 1.5), ``F.conv2d(..., padding=5)`` with zero padding, C1 = 0.01^2,
    C2 = 0.03^2 (data range 1). The 2-D window is the outer product of the 1-D taps, so the two
    separable zero-padded passes used here give the same map. Any H, W >= 1.

    Computed and returned in float64 (float32 on MPS): E[x^2] - E[x]^2 in float32, as the paper's
    code does it, is off by up to ~4e-5 per map value on smooth photographs (much less once averaged);
    float64 gives the formula's value. The public functions average in this dtype, then cast to float32."""
    x, y = _check_pair(x, y)
    n, c, h, w = x.shape
    work = torch.float32 if x.device.type == "mps" else torch.float64
    x = x.reshape(n * c, 1, h, w).to(work)
    y = y.reshape(n * c, 1, h, w).to(work)
    k = _paper_kernel1d(x.device, x.dtype)
    p = _SSIM_WIN // 2
    z = torch.cat([x, y, x * x, y * y, x * y], dim=0)
    z = F.conv2d(z, k.view(1, 1, -1, 1), padding=(p, 0))
    z = F.conv2d(z, k.view(1, 1, 1, -1), padding=(0, p))
    return _ssim_from_moments(z).reshape(n, c, h, w)


def ssim_paper_per_image(x: Tensor, y: Tensor) -> Tensor:
    """Per-image mean of :func:`ssim_paper_map` over C, H, W (no cropping), float32, ``(N,)``."""
    return _ssim_paper_map_work(x, y).flatten(1).mean(dim=1).float()


def ssim_paper(x: Tensor, y: Tensor) -> Tensor:
    """The batch's SSIM as ``pytorch_ssim.SSIM()(x, y)`` returns it: the mean of the full zero-padded
    map over the whole batch. A 0-dim float32 tensor on the inputs' device (no host sync)."""
    return _ssim_paper_map_work(x, y).mean().float()


def psnr_batch(x: Tensor, y: Tensor) -> Tensor:
    """PSNR of the batch's MSE, ``10 * log10(1 / mean((x - y)^2))`` over the whole batch (the paper's
    ``get_PSNR``), capped at 100 dB. A 0-dim float32 tensor on the inputs' device."""
    return _psnr_from_mse(mse_per_image(x, y).mean())


def paper_metrics(x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """``{"ssim_paper", "psnr_batch"}`` of one batch, 0-dim float32 tensors."""
    return {"ssim_paper": ssim_paper(x, y), "psnr_batch": psnr_batch(x, y)}


class PaperMetricAccumulator(_SumAccumulator):
    """Per-batch ``ssim_paper`` and ``psnr_batch``, averaged over batches weighted by batch size, as
    the paper's ``AverageMeter.update(value, n=batch_size)`` does.

    ``update`` only adds device tensors (no host sync); ``compute`` syncs once and returns Python floats.
    The values depend on how the images are split into batches (``psnr_batch`` does; the weighted
    ``ssim_paper`` equals the per-image mean whatever the split): feed it the batches whose
    convention you want, e.g. the paper's 256.
    """

    KEYS = ("ssim_paper", "psnr_batch")

    def _batch_sums(self, x, y, acc_dtype):
        m = paper_metrics(x, y)
        return m, {k: m[k].to(acc_dtype) * int(x.shape[0]) for k in self.KEYS}
