import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Two shared cores: intra-op threads only add contention for the tiny tensors of the tests."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


TINY = {
    "model.width": 0.125, "data.train_size": 256, "data.test_size": 100, "train.epochs": 2,
    "train.batch_size": 64, "attack.epochs": 1, "attack.blocks": 1, "attack.channels": 8,
    "attack.batch_size": 64, "attack.rmle_iterations": 10, "train.device": "cpu",   # both attacks, rmle short
    "attack.min_accuracy_margin": -1,   # the tiny trials sit at chance: attack them anyway (the gate has its own tests)
    # a match (cem.strength=matched, the attention surrogates' default) averages this many batches: the default
    # 64 is 16 of these 4-batch epochs and was most of a matched tiny trial's training (docs/architecture.md 5.5)
    "cem.strength_batches": 4,
}

# TINY as `train --set` takes it for gmm, the default surrogate, at its fixed strength: `train --set` refuses a key
# the run never reads (cli.check_train_sets_are_read), and cem.strength_batches is a matched strength's
TINY_TRAIN = {k: v for k, v in TINY.items() if k != "cem.strength_batches"}

# TINY for a run of rmle alone (attack.names: [rmle]) through `train --set`: the decoder's keys are refused there too
TINY_RMLE = {k: v for k, v in TINY_TRAIN.items()
             if k not in ("attack.epochs", "attack.blocks", "attack.channels", "attack.batch_size")}


def build_tiny(**flat):
    """(config, splits, trainer) of a ``TINY`` trial with ``flat`` on top, on the CPU."""
    from cem_bench.core.trial import build, build_config
    cfg = build_config({**TINY, **flat})
    splits, trainer = build(cfg, torch.device("cpu"))
    return cfg, splits, trainer


def make_trainer(**flat):
    """The trainer of a ``TINY`` trial with ``flat`` on top, on the CPU."""
    return build_tiny(**flat)[2]


def make_surrogate(name: str, shape: tuple, classes: int, **keys):
    """Surrogate ``name`` (resolved, with the flat config ``keys``) for features of ``shape``, built right after
    ``torch.manual_seed(0)`` so that its weights are the same in every test."""
    from cem_bench import surrogates
    from cem_bench.config import TrialConfig
    cfg = surrogates.resolve(TrialConfig.from_flat({"cem.surrogate": name, **keys}))
    torch.manual_seed(0)
    return surrogates.build(cfg, shape, classes)


def feature_batch(shape: tuple, n: int, classes: int, seed: int):
    """``n`` uniform features of ``shape`` from a seeded generator, labels 0, 1, ..., classes - 1, 0, ..."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *shape, generator=g), torch.arange(n) % classes


def alarm_after(seconds: int, what: str):
    """A generator for an autouse fixture: a test that blocks (a named pipe read, an expanded alias bomb) fails
    after ``seconds`` instead of hanging the suite or eating the machine."""
    import signal

    def boom(*_):
        raise TimeoutError(f"took more than {seconds} s: {what}")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(autouse=True)
def _ray_only_in_its_tier(request):
    """`make test` runs the `ray` tier beside the other tests (scripts/test_tiers.py): a test outside it that
    leaves an in-process Ray running would start a second cluster beside the tier's. Mark such a test `ray`."""
    yield
    import sys
    ray = sys.modules.get("ray")
    if ray is not None and request.node.get_closest_marker("ray") is None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"{request.node.nodeid} started Ray but is not marked ray (scripts/test_tiers.py)")


def direct_trainable(monkeypatch, tmp_path, gpu, run_trial, fixed=None, checkpoint=None, reports=None):
    """The search's trainable (cem_trial) called directly, without Ray: Ray's context replaced (trial
    ``t0001`` in ``tmp_path/cem_trial_t0001``, ``checkpoint`` the folder ``tune.get_checkpoint`` gives, else
    none), ``run_trial`` replaced by ``run_trial(flat)``; ``tune.report``'s metrics appended to ``reports``
    when a list is given (the real one needs a session)."""
    import tempfile
    import types

    import ray
    from ray import tune

    from cem_bench.core import trial
    from cem_bench.search import trainable

    ctx = types.SimpleNamespace(get_trial_id=lambda: "t0001", get_trial_dir=lambda: str(tmp_path / "cem_trial_t0001"))
    monkeypatch.setattr(tune, "get_context", lambda: ctx)
    monkeypatch.setattr(tune, "get_checkpoint",
                        lambda: None if checkpoint is None else tune.Checkpoint.from_directory(str(checkpoint)))
    if reports is not None:
        monkeypatch.setattr(tune, "report", lambda metrics, checkpoint=None: reports.append(dict(metrics)))
    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(get_node_id=lambda: "node"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(trial, "run_trial", lambda flat, report, out_dir=None, resume_state=None: run_trial(flat))
    spec = types.SimpleNamespace(metric_names=("test_acc",), fixed=dict(fixed or {}))
    # the worker's thread count as it is: the trainable sets it from resources.cpu
    return trainable.make_trainable(str(tmp_path), spec, {"cpu": torch.get_num_threads(), "gpu": gpu})


def fake_object_storage(monkeypatch, root) -> None:
    """``test://PATH`` URIs read and written as object storage (``storage.filesystem``'s pyarrow file system) in
    the local folder ``root/PATH``: the remote code paths (no lock, no links, one PUT per write) without a
    bucket. Any other path resolves as before."""
    import pyarrow.fs as pafs

    from cem_bench import storage
    real = storage.filesystem

    def fake(path):
        if str(path).startswith("test://"):
            return pafs.LocalFileSystem(), str(root / str(path)[len("test://"):])
        return real(path)
    monkeypatch.setattr(storage, "filesystem", fake)


def process_alive(pid: int) -> bool:
    """Is process ``pid`` running (not gone, not a zombie)? Read from /proc: the tests that kill a node or a
    pack of trials ask it of each process they expect gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
