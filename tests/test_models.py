import pytest
import torch

from cem_bench.config import ModelConfig
from cem_bench.core.models import build, count_params, feature_shape


def test_paper_model_parameter_counts():
    client, server = build(ModelConfig(), 10)
    assert count_params(client) == 85_256          # reference §1, client without LCA
    assert count_params(server) == 9_689_738       # server convs 9,159,296 + classifier 530,442
    assert feature_shape(client) == (8, 8, 8)
    z = client(torch.randn(2, 3, 32, 32))
    assert z.min() > 0 and z.max() < 1             # sigmoid: smashed data in (0, 1)
    assert server(z).shape == (2, 10)


@pytest.mark.parametrize("cut, bottleneck, shape", [
    (2, 8, (8, 16, 16)), (3, 8, (8, 16, 16)), (4, 8, (8, 8, 8)), (4, 0, (32, 8, 8)), (6, 4, (4, 8, 8)),
])
def test_cut_layers_and_width(cut, bottleneck, shape):
    client, server = build(ModelConfig(width=0.25, cut_layer=cut, bottleneck_channels=bottleneck), 7)
    assert feature_shape(client) == shape
    assert server(client(torch.randn(2, 3, 32, 32))).shape == (2, 7)


def test_client_init_is_xavier_with_zero_bias():
    client, _ = build(ModelConfig(width=0.25), 10)
    conv = client.features[0]
    assert torch.all(conv.bias == 0)
    bound = (6 / (conv.in_channels * 9 + conv.out_channels * 9)) ** 0.5
    assert conv.weight.abs().max() <= bound
