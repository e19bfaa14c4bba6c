"""Architecture constants read from the traced graph (thesis Thm 4.4.1, Remark 4.4.1,
Thm 4.3.1), and thesis Table 7.1 recomputed from the reference ResNets' graphs."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pathlift import models
from pathlift.bounds import architecture_constants, peeling_constant, sharpened_constant
from pathlift.errors import InvalidParameterError
from pathlift.testing.neurons import Activation, NeuronDAG
from random_nets import networks

# Data constants of thesis Sec. 7.2.1 / Appendix E.1 (ImageNet, not architecture).
N_IMAGENET = 1_268_355
B_IMAGENET = 2.6400001
# Published Table 7.1 of ../shared/REFERENCE.md (both rows).
TABLE_7_1 = {"resnet18": (0.088, 0.060), "resnet34": (0.11, 0.072),
             "resnet50": (0.14, 0.082), "resnet101": (0.19, 0.11),
             "resnet152": (0.23, 0.13)}


def _two_digits(x: float) -> float:
    return float(f"{x:.2g}")


@pytest.mark.parametrize("name", list(TABLE_7_1))
def test_table_7_1_from_traced_resnets(name):
    """Both rows of Table 7.1 from D, K, P, d_in, d_out read off the traced ResNet."""
    c = architecture_constants(getattr(models, name)().eval(), (3, 224, 224))
    scale = 4 * B_IMAGENET / math.sqrt(N_IMAGENET)
    # The thesis counts D = 2 + #blocks x #convs (Appendix E.1): the max-pool layer is not
    # counted; pathlift's strict D (longest path of ReLU/max-pool layers) is one more.
    thesis_c = peeling_constant(c, depth=c.depth_without_maxpool)
    assert (_two_digits(scale * thesis_c), _two_digits(scale * sharpened_constant(c))) == \
        TABLE_7_1[name]
    assert (c.kernel, c.pool_types, c.maxpool_layers) == (9, 1, 1)
    assert (c.d_in, c.d_out) == (3 * 224 * 224, 1000)
    assert c.depth == c.depth_without_maxpool + 1 and c.sharpened_applies
    assert c.num_params == sum(p.numel() for p in getattr(models, name)().parameters())


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=0, max_size=4), st.integers(1, 6),
       st.integers(1, 5))
def test_mlp_constants(hidden, d_in, d_out):
    """An MLP with L hidden ReLU layers has D = L + 1, no max-pool, no weight sharing."""
    model = models.mlp(d_in, hidden, d_out)
    c = architecture_constants(model, (d_in,))
    assert (c.depth, c.depth_unrefined, c.depth_without_maxpool) == (len(hidden) + 1,) * 3
    assert (c.kernel, c.pool_types, c.maxpool_layers, c.sharpened_applies) == (1, 0, 0, False)
    assert (c.d_in, c.d_out) == (d_in, d_out)
    assert c.num_params == c.num_params_unshared == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("conv", [
    nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(2, 4, (3, 2), stride=2, padding=(1, 0)),
    nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2, bias=False),
    nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1)])
def test_unshared_params_count_edges_of_the_unrolled_conv(conv):
    """#params of Thm 4.3.1 = edges (non-zeros of the conv's Jacobian) + one bias per neuron."""
    with torch.no_grad():
        conv.weight.copy_(torch.rand_like(conv.weight) + 0.5)  # no zero weight
    shape = (conv.in_channels, 5, 6)
    jac = torch.autograd.functional.jacobian(lambda x: conv(x[None])[0], torch.randn(shape))
    out_neurons = conv(torch.zeros(1, *shape)).numel()
    edges = int((jac != 0).sum())
    c = architecture_constants(nn.Sequential(conv), shape)
    assert c.num_params_unshared == edges + (out_neurons if conv.bias is not None else 0)
    assert c.num_params == sum(p.numel() for p in conv.parameters())


def _window_sizes(pool, shape):
    """Number of inputs of each max-pool neuron, by probing with one-hot inputs."""
    n = math.prod(shape)
    eye = torch.eye(n).reshape(n, *shape)
    return pool(eye).sum(0)  # output o is 1 for the input e_j iff j is in o's window


@pytest.mark.parametrize("pool, shape", [
    (nn.MaxPool2d(3, stride=2, padding=1), (2, 9, 9)),
    (nn.MaxPool2d((2, 3), stride=1, dilation=(2, 1)), (1, 7, 7)),
    (nn.MaxPool1d(4, stride=3, ceil_mode=True), (2, 10)),
    (nn.AdaptiveMaxPool2d((2, 3)), (1, 5, 7)),
    (nn.AdaptiveMaxPool1d(3), (2, 8))])
def test_kernel_is_the_largest_max_pool_window(pool, shape):
    out_features = pool(torch.zeros(1, *shape)).numel()
    model = nn.Sequential(nn.ReLU(), pool, nn.Flatten(), nn.Linear(out_features, 2))
    c = architecture_constants(model, shape)
    assert c.kernel == int(_window_sizes(pool, shape).max())
    assert (c.pool_types, c.maxpool_layers, c.depth) == (1, 1, 3)


class _SkipOverPool(nn.Module):
    """U-Net-like: a skip connection jumps over the max-pool layer."""

    def __init__(self):
        super().__init__()
        self.enc, self.mid, self.out = nn.Conv2d(1, 2, 3, padding=1), nn.Conv2d(2, 2, 1), \
            nn.Conv2d(4, 1, 1)

    def forward(self, x):
        e = F.relu(self.enc(x))
        m = F.interpolate(F.relu(self.mid(F.max_pool2d(e, 2))), scale_factor=2)
        return self.out(torch.cat([e, m], dim=1))


def test_sharpened_constant_refused_when_a_skip_jumps_over_max_pooling():
    c = architecture_constants(_SkipOverPool(), (1, 4, 4))
    assert not c.sharpened_applies
    with pytest.raises(InvalidParameterError, match=r"Remark 4\.4\.1"):
        sharpened_constant(c)
    # longest path: enc ReLU, max-pool, mid ReLU, output conv
    assert (c.depth, c.depth_without_maxpool, c.maxpool_layers, c.kernel) == (4, 3, 1, 4)


def test_identity_neurons_merged_except_before_a_max_pool():
    """Refined D merges identity neurons into the next layer (text after Thm 4.4.1) but not
    into a max-pool (the max of a sum is not a max of its terms)."""
    chain = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    c = architecture_constants(chain, (3,))
    assert (c.depth, c.depth_unrefined) == (2, 3)
    pooled = nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.ReLU(), nn.AvgPool2d(2),
                           nn.Flatten(), nn.Linear(2, 3))
    c = architecture_constants(pooled, (1, 6, 6))
    assert (c.depth, c.depth_unrefined, c.depth_without_maxpool) == (4, 5, 3)


def test_constants_leave_the_model_untouched():
    model = models.small_cnn().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    c = architecture_constants(model, (1, 8, 8))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert (c.depth, c.maxpool_layers, c.kernel, c.d_in, c.d_out) == (6, 2, 4, 64, 10)


def _dag_constants(dag: NeuronDAG) -> list:
    """[M, K, P, Remark 4.4.1 applies] from the explicit neuron DAG: M by dynamic
    programming over neurons, K = most antecedents of a max-pool neuron, the remark by
    reachability of the outputs without each max-pool layer."""
    neurons = dag.neurons
    pools = [0] * len(neurons)
    for i, v in enumerate(neurons):
        pools[i] = max((pools[u] for u in v.antecedents), default=0) + (
            v.activation is Activation.MAXPOOL)
    maxpools = [v for v in neurons if v.activation is Activation.MAXPOOL]
    K = max((len(v.antecedents) for v in maxpools), default=1)

    def reaches_output_without(layer: str) -> bool:
        seen = [False] * len(neurons)
        for i, v in enumerate(neurons):
            seen[i] = v.node != layer and (v.activation is Activation.INPUT
                                           or any(seen[u] for u in v.antecedents))
        return any(seen[o] for o in dag.outputs)

    remark = bool(maxpools) and not any(reaches_output_without(layer)
                                        for layer in {v.node for v in maxpools})
    return [max(pools[o] for o in dag.outputs), K, int(bool(maxpools)), remark]


@settings(max_examples=25, deadline=None)
@given(networks(max_paths=3000))
def test_constants_match_the_neuron_dag_on_random_networks(net_shape):
    """M, K, P, d_in, d_out and Remark 4.4.1's assumptions, layer-level (pathlift.bounds)
    against neuron-level (pathlift.testing.neurons), on random DAGs of every supported op.

    D is compared on the hand-built networks and the ResNets above only: in corner cases of
    the random DAGs (ReLU of copies of ReLU neurons, neurons repeated in a max-pool window)
    the two levels merge different neurons. M is an upper bound: a layer whose every output
    reads padding only (a strided 1x1 convolution with padding) cuts the neuron-level paths
    that the layer-level graph still draws (random network 12767792)."""
    net, shape = net_shape
    c = architecture_constants(net, shape)
    dag = NeuronDAG.from_module(net, shape)
    m, *rest = _dag_constants(dag)
    assert [c.kernel, c.pool_types] == rest[:2]
    assert c.maxpool_layers >= m
    if c.maxpool_layers == m:
        assert c.sharpened_applies == rest[2]
    assert (c.d_in, c.d_out) == (dag.num_inputs, len(dag.outputs))
