"""Image-quality metrics for model-inversion evaluation (batched, pure torch).

Conventions
-----------
* Images are float tensors of shape ``(N, C, H, W)`` with values in ``[0, 1]``
  (data range 1). Any float dtype is accepted (bf16 included); all arithmetic
  is done in float32 on the inputs' device. Nothing synchronises with the host
  except :meth:`MetricAccumulator.compute`, which returns Python floats.
* Every metric is computed **per image** and returned as a tensor of shape
  ``(N,)``; dataset-level numbers are image-weighted means of those.
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

Differences from the paper's code
---------------------------------
The original code used the ``pytorch_ssim`` package, which convolves with
*zero* padding and averages the *whole* SSIM map (borders included), so its
values are lower near edges and differ from ours, especially on small
(e.g. 32x32 or 64x64) images. It also averaged PSNR *per batch* (PSNR of
the batch MSE, or mean of per-batch PSNRs); cem-bench's convention is the
mean of per-image PSNR.
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


def _gaussian_kernel1d(device: torch.device, dtype: torch.dtype) -> Tensor:
    # Same taps as scipy.ndimage.gaussian_filter(sigma=1.5, truncate=3.5).
    r = torch.arange(-_SSIM_RADIUS, _SSIM_RADIUS + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * (r / _SSIM_SIGMA) ** 2)
    k = k / k.sum()
    return k.to(device=device, dtype=dtype)


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
    ux, uy, uxx, uyy, uxy = stats.chunk(5, dim=0)
    vx = uxx - ux * ux
    vy = uyy - uy * uy
    vxy = uxy - ux * uy
    c1 = _SSIM_K1**2
    c2 = _SSIM_K2**2
    a1 = 2 * ux * uy + c1
    a2 = 2 * vxy + c2
    b1 = ux * ux + uy * uy + c1
    b2 = vx + vy + c2
    s = (a1 * a2) / (b1 * b2)
    return s.reshape(n, c, h, w)


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


class MetricAccumulator:
    """Running image-weighted means of MSE, PSNR and SSIM.

    ``update`` only adds device tensors (no host sync); ``compute`` returns
    Python floats. PSNR is the mean of per-image PSNR (cem-bench convention);
    the paper's code averaged per-batch PSNR instead, which depends on the
    batch size and is not comparable.
    """

    KEYS = ("mse", "psnr", "ssim")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sums: dict[str, Tensor] | None = None
        self._count: int = 0

    @property
    def count(self) -> int:
        return self._count

    def update(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        """Add a batch; returns its per-image metrics (device tensors)."""
        m = image_metrics(x, y)
        # float64 sums where the backend has it (not on MPS).
        acc_dtype = torch.float32 if x.device.type == "mps" else torch.float64
        batch = {k: m[k].to(acc_dtype).sum() for k in self.KEYS}
        if self._sums is None:
            self._sums = batch
        else:
            for k in self.KEYS:
                self._sums[k] = self._sums[k] + batch[k]
        self._count += int(x.shape[0])
        return m

    def compute(self) -> dict[str, float]:
        """Image-weighted means; NaN for every key if nothing was added."""
        if self._sums is None or self._count == 0:
            return {k: math.nan for k in self.KEYS}
        stacked = torch.stack([self._sums[k] for k in self.KEYS]).cpu()
        return {k: float(v) / self._count for k, v in zip(self.KEYS, stacked.tolist())}
