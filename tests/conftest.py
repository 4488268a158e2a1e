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
}


@pytest.fixture
def tiny():
    return dict(TINY)
