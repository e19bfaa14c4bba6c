"""ReLU and |z| as users write them (``pathlift.graph.ops.maximum``, ``.absolute``,
``.selection``, and ``clamp_min`` / ``clamp_max`` of ``.activation``): ``h.clamp_min(0)``,
``torch.maximum(h, torch.zeros_like(h))``, ``torch.max(h, zeros)`` (elementwise), a
broadcast zeros of C entries, ``F.threshold(h, 0, 0)``, ``torch.where(h > 0, h, 0)`` and
clamps selected by a comparison, ``torch.abs`` / ``.abs()`` / ``abs(h)``. Each model's
path-norms equal explicit path enumeration (``pathlift.testing.neurons``, which probes the
real ops) at q = 1, 2 (and mixed) in float64 to 1e-12, and equal those of its twin written
with F.relu (|z| as F.relu(z) + F.relu(-z)); a random rescaling and the normalisation keep
the function and every path-norm; path-magnitude scores equal the cost of pruning each
entry, ||Phi(theta)||_1 - ||Phi(theta_{-i})||_1, by enumeration (paper 002 eq. 11); the
Lipschitz bound of Thm 3.3.1 holds on sampled pairs. What is outside Def. 2.2.2 (a jump,
a maximum of two activations) is refused in one line naming the op."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from activation_checks import (
    assert_norms_equal_enumeration,
    assert_rescaling_keeps_function_and_norms,
    randomised,
)
from pathlift.bounds import lipschitz_input
from pathlift.cli_support import one_line
from pathlift.errors import UnsupportedModelError
from pathlift.lift import path_metric, path_norm
from pathlift.prune import path_magnitude_scores
from pathlift.testing.neurons import NeuronDAG

IMG = (2, 5, 5)
C = 3  # channels after the first conv


def _relu(h: Tensor) -> Tensor:
    return F.relu(h)


def _abs_twin(h: Tensor) -> Tensor:
    return F.relu(h) + F.relu(-h)


#: name -> (the spelling, its twin written with F.relu)
SPELLINGS = {
    "clamp_min_method": (lambda h: h.clamp_min(0), _relu),
    "clamp_min_function_keyword": (lambda h: torch.clamp_min(h, min=0.0), _relu),
    "clamp_min_in_place": (lambda h: h.clamp_min_(0), _relu),
    "maximum_zeros_like": (lambda h: torch.maximum(h, torch.zeros_like(h)), _relu),
    "maximum_method_new_zeros": (lambda h: h.maximum(h.new_zeros(h.shape)), _relu),
    "maximum_broadcast_zeros": (lambda h: torch.maximum(
        h, torch.zeros(C, 1, 1, dtype=h.dtype, device=h.device)), _relu),
    "maximum_zeros_no_device": (lambda h: torch.maximum(h, torch.zeros(1, dtype=h.dtype)),
                                _relu),
    "max_elementwise": (lambda h: torch.max(h, torch.zeros_like(h)), _relu),
    "max_method_keyword": (lambda h: h.max(other=torch.full_like(h, 0.0)), _relu),
    "fmax": (lambda h: torch.fmax(h, torch.zeros_like(h)), _relu),
    "minimum_negated": (lambda h: -torch.minimum(-h, torch.zeros_like(h)), _relu),
    "min_elementwise_negated": (lambda h: -torch.min(-h, torch.zeros_like(h)), _relu),
    "min_method_negated": (lambda h: -(-h).min(torch.zeros_like(h)), _relu),
    "threshold_functional": (lambda h: F.threshold(h, 0.0, 0.0), _relu),
    "where_number": (lambda h: torch.where(h > 0, h, 0), _relu),
    "where_method_ge": (lambda h: h.where(h >= 0, 0.0), _relu),
    "where_reflected_zeros_like": (lambda h: torch.where(0 < h, h, torch.zeros_like(h)),  # noqa: SIM300
                                   _relu),
    "where_swapped_le": (lambda h: torch.where(h <= 0, 0.0, h), _relu),
    "where_clamp_min": (lambda h: torch.where(h > -0.5, h, -0.5),
                        lambda h: h.clamp(min=-0.5)),
    "where_clamp_max_torch_lt": (lambda h: torch.where(torch.lt(h, 1.5), h, 1.5),
                                 lambda h: h.clamp(max=1.5)),
    "where_clamp_max_full_like": (
        lambda h: torch.where(h.gt(0.25), torch.full_like(h, 0.25), h),
        lambda h: h.clamp(max=0.25)),
    "where_leaky": (lambda h: torch.where(h > 0, h, 0.1 * h), lambda h: F.leaky_relu(h, 0.1)),
    "where_leaky_lt_method": (lambda h: torch.where(h.lt(0), h * 0.2, h),
                              lambda h: F.leaky_relu(h, 0.2)),
    "abs_function": (torch.abs, _abs_twin),
    "abs_method": (lambda h: h.abs(), _abs_twin),
    "abs_builtin": (lambda h: abs(h), _abs_twin),
    "absolute": (torch.absolute, _abs_twin),
    "abs_in_place": (lambda h: h.abs_(), _abs_twin),
}


class Net(nn.Module):
    """Conv, the spelling, a residual block with it again after a BatchNorm, a Linear head
    on the flattened map: as a user writes a small CNN."""

    def __init__(self, act) -> None:
        super().__init__()
        self.act = act
        self.c1 = nn.Conv2d(2, C, 3, padding=1)
        self.c2 = nn.Conv2d(C, C, 3, padding=1)
        self.bn = nn.BatchNorm2d(C)
        self.head = nn.Linear(C * 25, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.c1(x))
        h = h + self.act(self.bn(self.c2(h)))
        return self.head(h.flatten(1))


def _pair(name: str, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    spelled, twin = SPELLINGS[name]
    net = randomised(Net(spelled), seed)
    other = Net(twin).double().eval()
    other.load_state_dict(net.state_dict())
    return net, other


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_path_norms_equal_enumeration_and_the_twin(name: str) -> None:
    net, twin = _pair(name)
    x = torch.randn(4, *IMG, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(net(x.clone()), twin(x), rtol=0, atol=1e-12)
    assert_norms_equal_enumeration(net, IMG)
    dag = NeuronDAG.from_module(twin, IMG)
    for q in (1.0, 2.0):
        assert path_norm(net, IMG, q=q).log10 == pytest.approx(dag.path_norm_log10(q),
                                                               abs=1e-12)


@pytest.mark.parametrize("name", ["clamp_min_method", "maximum_broadcast_zeros",
                                  "threshold_functional", "abs_method", "abs_in_place"])
def test_rescaling_and_normalisation_keep_function_and_norms(name: str) -> None:
    """Both are positively homogeneous: the rescaling symmetries hold through them."""
    net, _ = _pair(name, seed=1)
    assert_rescaling_keeps_function_and_norms(net, IMG, lambda m: m.c1.weight)


@pytest.mark.parametrize("name", ["maximum_zeros_like", "abs_function"])
def test_scores_are_the_costs_of_pruning_by_enumeration(name: str) -> None:
    """theta_i d||Phi||_1/d theta_i = ||Phi(theta)||_1 - ||Phi(theta_{-i})||_1 for an
    entry on one layer (||Phi||_1 is affine in |theta_i|), each side enumerated."""
    net, _ = _pair(name, seed=2)
    scores = path_magnitude_scores(net, IMG)
    full = NeuronDAG.from_module(net, IMG).path_norm(1.0)
    for key, index in (("c1.weight", (0, 1, 1, 2)), ("c2.weight", (2, 0, 0, 1)),
                       ("head.weight", (1, 40))):
        pruned = copy.deepcopy(net)
        with torch.no_grad():
            pruned.get_parameter(key)[index] = 0.0
        cost = full - NeuronDAG.from_module(pruned, IMG).path_norm(1.0)
        assert float(scores.value(key)[index]) == pytest.approx(cost, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("name", ["maximum_zeros_like", "abs_method"])
def test_lipschitz_bound_holds_on_sampled_pairs(name: str) -> None:
    """Thm 3.3.1: |R(x) - R(x')|_1 <= ||Phi||_{1,1} |x - x'|_inf on 40 pairs (|z| is
    1-Lipschitz but not monotone)."""
    net, _ = _pair(name, seed=3)
    lip = lipschitz_input(net, IMG)
    x = torch.randn(40, *IMG, dtype=torch.float64)
    near = x + 0.05 * torch.randn_like(x)
    with torch.no_grad():
        change = (net(x) - net(near)).abs().sum(1)
    assert torch.all(change <= 10 ** lip.path_norm.log10
                     * (x - near).flatten(1).abs().amax(1) * (1 + 1e-9))


def test_abs_is_two_relu_paths_per_unit() -> None:
    """One unit: |z| = ReLU(z) + ReLU(-z) makes two paths from the input to the output,
    each of product magnitude |w_1| |w_2|, so ||Phi||_q^q = 2 |w_1|^q |w_2|^q."""
    net = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Identity(),
                        nn.Linear(1, 1, bias=False)).double().eval()
    with torch.no_grad():
        net[0].weight.fill_(2.0)
        net[2].weight.fill_(-3.0)

    class Abs(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x.abs()
    net[1] = Abs()
    for q in (1.0, 2.0):
        assert path_norm(net, (1,), q=q).value == pytest.approx(
            (3.0 ** q * 2 * 2.0 ** q) ** (1 / q), rel=1e-14)


def test_clamp_min_with_a_non_zero_bound_is_clamp() -> None:
    """clamp_min(c), c != 0, and maximum(h, full(c)) are clamp(min=c): a piecewise-linear
    activation with a bias (not homogeneous), measured as clamp(min=c) is. (The fill is
    float64 whatever the activation's dtype: the oracle runs a forward's fills on its
    int64 neuron ids, where full_like(h, 0.25) would hold 0.)"""
    nets = [randomised(Net(f), 4) for f in (lambda h: h.clamp_min(0.25),
                                             lambda h: torch.maximum(h, torch.full(
                                                 h.shape, 0.25, dtype=torch.float64)),
                                             lambda h: torch.clamp(h, min=0.25))]
    for net in nets[1:]:
        net.load_state_dict(nets[0].state_dict())
    assert_norms_equal_enumeration(nets[0], IMG)
    assert_norms_equal_enumeration(nets[1], IMG)
    values = [path_norm(n, IMG).log10 for n in nets]
    assert values[0] == pytest.approx(values[2], abs=1e-12)
    assert values[1] == pytest.approx(values[2], abs=1e-12)


#: name -> (spelling, what the one-line refusal says)
REFUSED = {
    "threshold_jump": (lambda h: F.threshold(h, 0.1, 0.0), "not continuous"),
    "threshold_module_jump": (nn.Threshold(0.0, -1.0), "not continuous"),
    "maximum_of_two_activations": (lambda h: torch.maximum(h, -h), "two tensors"),
    "maximum_fill_first": (lambda h: torch.maximum(torch.zeros_like(h), h),
                           "activation first"),
    "maximum_broadcasting_the_activation": (
        lambda h: torch.maximum(h, torch.zeros(2, *h.shape[1:], dtype=h.dtype)),
        "mixes the batch"),
    "trace_time_constant": (lambda h: torch.maximum(h, torch.zeros(1, dtype=torch.float64)),
                            "made a constant"),
    "fill_read_by_a_sum": (lambda h: h + torch.zeros_like(h), "zeros_like"),
    "max_over_everything": (lambda h: h.max(), "reduces over every dim"),
    "where_jump": (lambda h: torch.where(h > 0, h, 1.0), "jumps at 0"),
    "where_gate": (lambda h: torch.where(h > 0, h, h.flip(1)), "a gate"),
    "where_leaky_product_first": (lambda h: (lambda s: torch.where(h > 0, h, s))(0.1 * h),
                                  "computed just before it"),
    "where_leaky_off_zero": (lambda h: torch.where(h > 1, h, 0.1 * h), "jumps at 1"),
    "comparison_as_mask": (lambda h: h * (h > 0), "a comparison (gt) of activations"),
    "where_on_another_condition": (lambda h: torch.where(h.flip(1) > 0, h, 0), "(gt)"),
    "max_indices_read": (lambda h: h + h.max(1, keepdim=True)[1].to(h.dtype),
                         "its indices (argmax) are read"),
    "min_indices_read": (lambda h: h + torch.min(h, 1, keepdim=True).indices.to(h.dtype),
                         "its indices (argmin) are read"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_is_outside_is_refused_in_one_line(name: str) -> None:
    spelled, says = REFUSED[name]
    net = randomised(Net(spelled), 0) if name != "max_over_everything" else \
        nn.Sequential(nn.Linear(4, 3), _Max()).double().eval()
    shape = (4,) if name == "max_over_everything" else IMG
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(net, shape)
    line = one_line(info.value)
    assert says in line, line
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


class _Max(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.max()


def test_the_supported_table_lists_the_spellings() -> None:
    from pathlift.graph.ops.base import supported_names
    names = supported_names("activations")
    for op in ("clamp_min", "maximum", "threshold", "abs"):
        assert op in names, names


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 5), nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.b(torch.abs(self.a(x)))
        return self.c(torch.maximum(h, torch.zeros_like(h)))


def test_the_box_pass_encloses_every_network_of_the_box() -> None:
    """``box_outputs`` (the certificate's interval pass) through |z| (not monotone: its
    minimum over [lo, hi] is at 0 when the box straddles it) and maximum(h, 0): the
    outputs of 30 networks drawn in the box, on 16 inputs, lie in the enclosure."""
    from pathlift.bounds.box import box_outputs
    net = randomised(_Mlp(), 5)
    radius = 0.05
    boxes = {name: {p: (t.detach() - radius, t.detach() + radius)
                    for p, t in layer.named_parameters()}
             for name, layer in (("a", net.a), ("b", net.b), ("c", net.c))}
    x = torch.randn(16, 4, dtype=torch.float64)
    out = box_outputs(net, (4,), x, boxes)[0]
    assert float((out.radius > 0).double().mean()) == 1.0
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        other = copy.deepcopy(net)
        with torch.no_grad():
            for p in other.parameters():
                p.add_((torch.rand(p.shape, generator=g, dtype=p.dtype) * 2 - 1) * radius)
            y = other(x)
        assert torch.all(y >= out.low) and torch.all(y <= out.high)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), scale=st.floats(1 / 16, 16.0), fill=st.sampled_from(
    ["abs_method", "maximum_zeros_like", "clamp_min_method"]))
def test_lipschitz_and_pruning_inequalities_hold(seed: int, scale: float, fill: str) -> None:
    """Thm 3.3.1 (|R(x) - R(x')|_1 <= ||Phi||_{1,1} |x - x'|_inf) on 8 sampled pairs and
    Cor. 3.4.1 with Lemma 3.4.1 (pruning: the path-metric, exact in two passes, bounds
    |R_theta(x) - R_theta'(x)|_1 by max(1, |x|_inf) d) on 8 inputs, for random weights."""
    spelled, _ = SPELLINGS[fill]
    net = randomised(_MlpOf(spelled), seed % 97)
    with torch.no_grad():
        net.a.weight.mul_(scale)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64) * 3
    near = x + 0.1 * torch.randn(8, 4, generator=g, dtype=torch.float64)
    lip = 10 ** path_norm(net, (4,)).log10
    with torch.no_grad():
        change = (net(x) - net(near)).abs().sum(1)
    assert torch.all(change <= lip * (x - near).abs().amax(1) * (1 + 1e-9))
    pruned = copy.deepcopy(net)
    with torch.no_grad():
        pruned.b.weight.mul_((torch.rand(pruned.b.weight.shape, generator=g) > 0.4).double())
    metric = path_metric(net, pruned, (4,))
    assert metric.case == "exact"
    with torch.no_grad():
        gap = (net(x) - pruned(x)).abs().sum(1)
    assert torch.all(gap <= 10 ** metric.upper_log10 * x.abs().amax(1).clamp_min(1)
                     * (1 + 1e-9))


class _MlpOf(nn.Module):
    def __init__(self, act) -> None:
        super().__init__()
        self.act = act
        self.a, self.b, self.c = nn.Linear(4, 5), nn.Linear(5, 5), nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(self.act(self.b(self.act(self.a(x)))))
