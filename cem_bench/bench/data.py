"""Row ``data``: the data path. Images per second of cem-bench's on-device batches with augmentation
(``data.BatchIterator``: uint8 -> float, pad-4 crop, flip, +-15 degree rotation, normalise, on the device),
against a torchvision ``DataLoader`` applying the same augmentation as PIL transforms (RandomCrop(32,
padding=4), RandomHorizontalFlip, RandomRotation(15), ToTensor, Normalize) with ``num_workers`` = the
reference's 8 capped at this machine's CPU count and persistent workers (their start-up is not timed);
pinned memory and non-blocking copies on CUDA. The two are timed alternately; target: >= 5x.
"""

from __future__ import annotations

import os
import statistics

import torch

from .harness import Sizes, make_row, round_robin, row, synthetic_splits

REFERENCE_NUM_WORKERS = 8  # docs/reference.md §3: the reference's CIFAR loaders use num_workers=8
TARGET_DATA = ("ge", 5.0)


@row("data", "data path", order=10)
def bench_data(device: torch.device, sizes: Sizes) -> list[dict]:
    """On-device batches with augmentation vs a DataLoader with the same augmentation in PIL."""
    import numpy as np
    import torchvision.transforms as T

    from ..core import data

    splits = synthetic_splits(sizes.data_images, 20, device)
    split = splits.train
    n_batches = len(split) // sizes.batch_size
    images_per_pass = n_batches * sizes.batch_size
    gen = torch.Generator(device=device).manual_seed(0)

    def ours() -> None:
        last = None
        for x, _ in data.BatchIterator(split, splits, sizes.batch_size, "crop_flip_rotate", gen):
            last = x
        assert last is not None

    # the conventional pipeline: uint8 HWC arrays -> PIL per image (as torchvision's CIFAR10 does)
    arr = split.images.permute(0, 2, 3, 1).contiguous().cpu().numpy()
    labels = split.labels.cpu().numpy().astype(np.int64)
    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.RandomRotation(15),
                           T.ToTensor(), T.Normalize(data.SYNTHETIC_MEAN, data.SYNTHETIC_STD)])
    dataset = _PILDataset(arr, labels, transform)
    workers = min(REFERENCE_NUM_WORKERS, os.cpu_count() or 1)
    cuda = device.type == "cuda"
    # the only reference to the loader: cleared after timing, which stops its persistent workers
    loaders = [torch.utils.data.DataLoader(dataset, batch_size=sizes.batch_size, shuffle=True, drop_last=True,
                                           num_workers=workers, persistent_workers=workers > 0, pin_memory=cuda)]

    def baseline() -> None:
        for x, y in loaders[0]:
            x = x.to(device, non_blocking=cuda)
            y = y.to(device, non_blocking=cuda)

    try:
        times = round_robin({"ours": ours, "baseline": baseline}, device, sizes.repeats, max(1, sizes.warmup))
    finally:
        loaders.clear()  # stops the persistent workers
    ours_s, base_s = times["ours"], times["baseline"]
    ours_ips = images_per_pass / statistics.median(ours_s)
    base_ips = images_per_pass / statistics.median(base_s)
    return [make_row("data path: on-device batches + augmentation", ours_ips, "img/s", base_ips,
                     f"DataLoader + PIL transforms, {workers} workers", ours_ips / base_ips, "speed-up", TARGET_DATA,
                     note=f"{images_per_pass} images/pass, batch {sizes.batch_size}; baseline: RandomCrop(32, pad "
                          f"4), HFlip, RandomRotation(15), ToTensor, Normalize, num_workers={workers} (the "
                          f"reference's 8 capped at {os.cpu_count()} CPUs), persistent workers"
                          + (", pin_memory + non_blocking copy" if cuda else ""),
                     samples=[images_per_pass / t for t in ours_s],
                     baseline_samples=[images_per_pass / t for t in base_s])]


class _PILDataset(torch.utils.data.Dataset):
    def __init__(self, arr, labels, transform):
        self.arr, self.labels, self.transform = arr, labels, transform

    def __len__(self) -> int:
        return len(self.arr)

    def __getitem__(self, i: int):
        from PIL import Image
        return self.transform(Image.fromarray(self.arr[i])), int(self.labels[i])
