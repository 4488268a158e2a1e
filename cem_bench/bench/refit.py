"""Row ``refit``: the ``gmm`` surrogate's epoch-end refit, cold (k-means++ seeding and Lloyd from scratch,
then the cluster statistics), on the clean features of the training split, all classes at once; against
scikit-learn's ``KMeans`` per class on the same features (same K, ``max_iter`` = the same iteration cap,
``tol=0`` = the same "no assignment changed" stop, one init). Target: >= 3x.

Both are short (milliseconds), so each repeat is timed by ``torch.utils.benchmark.Timer`` (``time_short``:
two untimed calls, then the timed one); the two alternate, and the Timer's setup pauses 0.2 s, untimed,
right before each call (their OpenMP runtimes' spinning threads otherwise slow each other's first
milliseconds: docs/performance.md, 'Why the refit row pauses between torch and scikit-learn'). The warm
refit of later epochs and the feature pass are reported in the note.
"""

from __future__ import annotations

import statistics

import torch

from .harness import Sizes, make_row, median_time, round_robin, row, step_config, synthetic_splits

TARGET_REFIT = ("ge", 3.0)


@row("refit", "gmm refit", order=30)
def bench_refit(device: torch.device, sizes: Sizes) -> list[dict]:
    """The gmm refit (cold) against scikit-learn's KMeans per class, on the same features."""
    from ..core.trial import build, build_config
    from ..surrogates.clustering import MAX_LLOYD_ITERS

    flat = step_config(sizes, device, **{"data.train_size": sizes.refit_images, "data.test_size": 20,
                                         "cem.surrogate": "gmm"})
    cfg = build_config(flat)
    splits = synthetic_splits(sizes.refit_images, 20, device)
    _, tr = build(cfg, device, splits)
    sur = tr.surrogate
    feats = None

    def encode() -> None:
        nonlocal feats
        feats = tr.encode(splits.train)

    feat_s = median_time(encode, device, 1, 1)
    labels = splits.train.labels
    k = sur.k

    def ours() -> None:
        sur.fitted = False  # cold: k-means++ seeding and Lloyd from scratch every call
        sur.refit(feats, labels)

    def warm() -> None:
        sur.refit(feats, labels)  # as at every later epoch end: started from the previous centroids

    import numpy as np
    from sklearn.cluster import KMeans  # dev extra; a missing package becomes an error row
    x = feats.flatten(1).float().cpu().numpy()
    y = labels.cpu().numpy()
    per_class = [np.ascontiguousarray(x[y == c]) for c in range(splits.num_classes)]
    sk_iters: list[int] = []
    seed = [0]

    def sklearn_fit() -> None:
        sk_iters.clear()
        for xc in per_class:
            if len(xc) < k:
                continue
            km = KMeans(n_clusters=k, init="k-means++", n_init=1, max_iter=MAX_LLOYD_ITERS, tol=0.0,
                        algorithm="lloyd", random_state=seed[0]).fit(xc)
            sk_iters.append(int(km.n_iter_))
        seed[0] += 1

    # the 0.2 s pause lets the other runtime's OpenMP threads stop spinning before each timed call
    # (docs/performance.md, 'Why the refit row pauses between torch and scikit-learn')
    times = round_robin({"ours": ours, "sklearn": sklearn_fit}, device, sizes.repeats, sizes.warmup, settle_s=0.2,
                        short=True)
    ours_s, sk_s = times["ours"], times["sklearn"]
    ours_iters, ours_class_iters = sur.last_fit_iters, sur.last_fit_class_iters
    warm_s = median_time(warm, device, sizes.repeats, 0, short=True)
    med, sk = statistics.median(ours_s), statistics.median(sk_s)
    d = x.shape[1]
    return [make_row("gmm refit (cold k-means, all classes)", med, "s", sk, "sklearn KMeans per class", sk / med,
                     "speed-up", TARGET_REFIT,
                     note=f"{len(x)} features x {d} dims, {splits.num_classes} classes, K={k}, <= "
                          f"{MAX_LLOYD_ITERS} iterations, tol=0 (stop when no assignment changes); Lloyd "
                          f"iterations per class: ours mean {ours_class_iters:.1f} (slowest {ours_iters}; all "
                          f"classes batched, a converged class drops out), sklearn mean "
                          f"{statistics.mean(sk_iters) if sk_iters else 0:.1f}; warm refit (later epochs) "
                          f"{statistics.median(warm_s) * 1e3:.1f} ms; feature pass {feat_s[0]:.2f} s (not "
                          f"included; sklearn gets numpy features for free); each repeat timed by "
                          f"torch.utils.benchmark.Timer after two untimed calls and a 0.2 s pause",
                     samples=ours_s, baseline_samples=sk_s)]
