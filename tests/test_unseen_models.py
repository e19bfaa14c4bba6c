"""Issue 38's last "Must show" line: models and families the engine was not written
against (tests/unseen_zoo.py), each in its authors' style. Every one pathlift measures is
exact in float64: ||Phi||_q at q = 1, 2 (and mixed) against explicit path enumeration
(``pathlift.testing.neurons``, whose outputs are checked to be the model's own), against
the independent |theta|^q pass of the model's eager forward (``abs_pow_oracle``) with
path-magnitude scores against autograd of that pass where that pass knows every op, and
unchanged, with the function, by a random neuron-wise rescaling (Thm 2.4.1). Every one it
refuses rightly is refused in one line naming the op and the module. Models inside the
theory (Def. 2.2.2, DESIGN.md: piecewise-linear activations and fixed linear maps are
small ReLU/identity sub-DAGs) that pathlift refuses today are ``xfail(strict=True)``
findings: each asserts the number its accepted twin (the same function, written with ops
pathlift reads) gets from enumeration.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import timm_scan
import unseen_zoo as z
from abs_pow_oracle import abs_pow_log10
from activation_checks import (
    assert_bounds_and_path_metric,
    assert_path_sgd_scale_is_enumerated,
    randomised,
)
from pathlift.cli_support import one_line
from pathlift.errors import PathliftError, UnsupportedModelError
from pathlift.graph.boundary import flat_outputs
from pathlift.lift import path_metric, path_norm
from pathlift.prune import global_path_magnitude, path_magnitude_scores
from pathlift.symmetry import random_rescale
from pathlift.testing.neurons import NeuronDAG

IMG, SEQ, VIDEO, VEC = z.IMAGE, z.SEQUENCE, z.VIDEO, (4,)

#: name -> (builder, input shape, whether the |theta|^q pass of abs_pow_oracle knows every
#: op: it leaves bilinear interpolation, PReLU slopes, Hardtanh off [0, M], parametrized
#: and pruned weights as they are, so there only enumeration is the reference)
MEASURED = {
    "fcn_dilated_dict_bilinear": (z.DilatedFCN, IMG, False),
    "deeplab_aspp": (z.DeepLabHead, IMG, True),
    "unet_convtranspose_skip": (z.UNet, (2, 2, 4), True),
    "ordereddict_flatten_unflatten": (z.ordered_autoencoder, (2, 3, 3), True),
    "view_and_torch_flatten": (z.ViewHead, IMG, True),
    "flatten_start_dim_permute": (z.TokenMLP, IMG, True),
    "interpolate_upsample_adaptive": (z.Upsampler, IMG, True),
    "depthwise_strided_shortcut": (z.SeparableBlock, IMG, True),
    "grouped_channel_shuffle": (z.ShuffleUnit, IMG, True),
    "leaky_relu_module_functional": (z.LeakyNet, IMG, True),
    "relu6_module": (lambda: z.mlp_with(nn.ReLU6()), VEC, True),
    "hardtanh_default": (z.hardtanh_net, VEC, False),
    "prelu_per_channel": (z.PReLUCNN, IMG, False),
    "shared_trunk_moduledict_tuple": (z.SharedTuple, (6,), False),  # scores: below
    "identity_dropout2d": (z.IdentityDropout, IMG, True),
    "avgpool_ceil_no_pad_maxpool_dilated": (z.odd_pools, IMG, False),
    "conv3d_maxpool3d_video": (z.C3D, VIDEO, True),
    "causal_tcn_fpad": (z.CausalTCN, SEQ, True),
    "weight_norm_parametrization": (z.weight_normed, IMG, False),
    "spectral_norm_parametrization": (z.spectral_normed, VEC, False),
    "nn_utils_prune_masks": (z.pruned_convnet, IMG, False),
    "noop_forward_pre_hook": (z.noop_pre_hooked, VEC, True),
    "reflection_pad_module": (lambda: z.padded_by_module(nn.ReflectionPad2d(1)), IMG, False),
    "circular_fpad": (z.CircularFPad, IMG, False),
    "relu_spellings_accepted": (z.AcceptedSpellings, VEC, True),
    "same_padding_even_kernel_dilated": (z.same_padding_even_kernels, IMG, True),
    "conv_transpose_output_padding_groups": (z.transposed_convs, IMG, True),
    "adaptive_max_overlapping": (lambda: z.adaptive_overlapping(nn.AdaptiveMaxPool2d), IMG,
                                 True),
    "adaptive_avg_overlapping": (lambda: z.adaptive_overlapping(nn.AdaptiveAvgPool2d), IMG,
                                 True),
    "max_pool_padding_on_negatives": (z.padded_max_pool, IMG, True),
    "trilinear_upsample": (z.trilinear_upsampling, (2, 2, 3, 3), False),
    "linear_upsample_1d": (z.linear_upsampling_1d, (2, 5), False),
    "tied_weights_two_layers": (z.TiedLayers, VEC, False),  # the pass powers a tied weight twice
    "batchnorm_affine_false": (z.batchnorm_without_affine, IMG, False),
    "batchnorm1d_amax": (z.BatchNorm1dNet, SEQ, False),
    "cat_same_tensor_twice": (z.CatTwice, VEC, True),
    "subclassed_layers_changed_forward": (z.subclassed_layers, IMG, True),
    "masked_linear_subclass": (lambda: z.computed_weights(z.MaskedLinear), VEC, False),
    "scaled_linear_subclass": (lambda: z.computed_weights(z.ScaledLinear), VEC, False),
    "flipped_conv_subclass": (lambda: z.computed_weights(z.FlippedConv), IMG, False),
    "no_grad_block": (z.NoGradInside, VEC, False),  # the pass has no gradient there
}
#: measured, but their rescaling is refused in one line (tied weights of distinct layers)
NOT_RESCALED = {"tied_weights_two_layers"}
#: measured, but their rescaling is refused in one line: a weight computed in forward
COMPUTED = {"masked_linear_subclass", "scaled_linear_subclass", "flipped_conv_subclass"}


def _net(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    make, shape, _ = MEASURED[name]
    torch.manual_seed(0)
    return randomised(make(), 0), shape


def _enumeration_agrees(net: nn.Module, shape: tuple[int, ...]) -> NeuronDAG:
    """The enumerated DAG computes the model's outputs on 3 inputs (1e-12), and
    path_norm's ||Phi||_{q,r} equals its sums over paths (1e-12 in log10)."""
    dag = NeuronDAG.from_module(net, shape)
    x = torch.randn(3, *shape, dtype=torch.float64)
    with torch.no_grad():
        y = flat_outputs(net(x), 3)
    for i in range(3):
        torch.testing.assert_close(torch.as_tensor(dag.output(x[i:i + 1])), y[i],
                                   rtol=0, atol=1e-12)
    for q, r in ((1.0, None), (2.0, None), (1.0, math.inf), (2.0, 1.0)):
        assert path_norm(net, shape, q=q, r=r).log10 == pytest.approx(
            dag.path_norm_log10(q, r), abs=1e-12), (q, r)
    return dag


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_unseen_model_is_exact_against_enumeration(name: str) -> None:
    net, shape = _net(name)
    before = copy.deepcopy(net.state_dict())
    _enumeration_agrees(net, shape)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # untouched


@pytest.mark.parametrize("name", sorted(n for n, (_, _, known) in MEASURED.items() if known))
def test_unseen_model_against_the_independent_pass_with_scores(name: str) -> None:
    net, shape = _net(name)
    worst = timm_scan.check_measured(net, shape)  # q = 1, 2, per output, scores, rescaled
    assert max(worst.values()) <= timm_scan.RTOL, worst


@pytest.mark.parametrize("name", sorted(set(MEASURED) - NOT_RESCALED - COMPUTED))
def test_unseen_model_keeps_function_and_norm_under_random_rescaling(name: str) -> None:
    net, shape = _net(name)
    rescaled = random_rescale(net, seed=1, input_shape=shape)
    x = torch.randn(4, *shape, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(flat_outputs(rescaled(x), 4), flat_outputs(net(x), 4),
                                   rtol=1e-10, atol=1e-10)
    dag = NeuronDAG.from_module(rescaled, shape)  # the rescaled copy, enumerated anew
    for q in (1.0, 2.0):
        assert dag.path_norm_log10(q) == pytest.approx(path_norm(net, shape, q=q).log10,
                                                       abs=1e-12)


def test_a_shared_trunk_matches_the_pass_and_its_scores_are_refused_in_one_line() -> None:
    """The Siamese trunk is called twice: path-norms equal the independent pass, but
    path-magnitude scores need each weight on one layer and say so, naming it."""
    net, shape = _net("shared_trunk_moduledict_tuple")
    for q in (1.0, 2.0):
        assert path_norm(net, shape, q=q).log10 == pytest.approx(
            abs_pow_log10(net, shape, q), abs=1e-12)
    with pytest.raises(UnsupportedModelError) as info:
        path_magnitude_scores(net, shape)
    line = timm_scan.check_refused(info.value)
    assert "'trunk'" in line and "called several times" in line


def test_tied_layers_are_measured_but_not_rescaled() -> None:
    net, shape = _net("tied_weights_two_layers")
    with pytest.raises(UnsupportedModelError) as info:
        random_rescale(net, seed=1, input_shape=shape)
    assert "'a' and 'b' share the parameter 'weight'" in one_line(info.value)


@pytest.mark.parametrize("name", sorted(COMPUTED))
def test_a_weight_computed_in_forward_is_measured_but_not_rescaled(name: str) -> None:
    net, shape = _net(name)
    with pytest.raises(UnsupportedModelError) as info:
        random_rescale(net, seed=1, input_shape=shape)
    line = one_line(info.value)
    assert "layer '0' computes its weight in forward" in line and "\n" not in line, line


def test_path_magnitudes_of_tied_layers_are_refused_not_wrong() -> None:
    """Two layers holding one weight: a path may cross the tied entry twice, so ||Phi||_1
    is not affine in it and theta_i d||Phi||_1/d theta_i is not the cost of pruning it
    (Sec. 3.5). Scores were returned per layer, each counting one occurrence (entry (0, 0):
    12.5 for 'a', 20.6 for 'b', true cost 24.8): refused in one line naming both layers,
    as a layer called twice is, for scores and for path-magnitude pruning."""
    net, shape = _net("tied_weights_two_layers")
    with torch.no_grad():
        net.a.weight.mul_(3)
    pruned = copy.deepcopy(net)
    with torch.no_grad():
        pruned.a.weight[0, 0] = 0
    true_cost = path_norm(net, shape).value - path_norm(pruned, shape).value
    assert abs(true_cost) > 1  # a real cost the scores would have to give
    for call in (lambda: path_magnitude_scores(net, shape),
                 lambda: global_path_magnitude(copy.deepcopy(net), shape, 0.3)):
        with pytest.raises(UnsupportedModelError) as info:
            call()
        line = timm_scan.check_refused(info.value)
        assert "'a'" in line and "'b'" in line and "tied" in line, line


def test_path_sgd_scales_of_tied_layers_sum_both_layers() -> None:
    """Path-SGD's gamma_p = d||Phi||_2^2 / d(p^2) of a weight held by two layers is the sum
    over both (chain rule): checked entry by entry against central differences of the
    enumerated ||Phi||_2^2 (one layer's gamma overwrote the other's: 0.977 for 1.509)."""
    net, shape = _net("tied_weights_two_layers")
    assert_path_sgd_scale_is_enumerated(net, shape, net.a.weight,
                                        [(0, 0), (1, 1), (0, 1), (2, 3)])


def test_rescaling_moves_the_weights_of_a_plain_unseen_model() -> None:
    """The rescaling test above is not vacuous: on a plain model it changes weights."""
    net, shape = _net("unet_convtranspose_skip")
    rescaled = random_rescale(net, seed=1, input_shape=shape)
    assert not torch.equal(rescaled.inc[0].weight, net.inc[0].weight)


def test_oracle_of_bilinear_upsampling_is_not_the_path_norm_at_q2() -> None:
    """Why the FCN is checked by enumeration only: its bilinear weights w sum to 1, so an
    all-ones pass that keeps them (abs_pow_oracle) gets q = 1 right and q = 2 wrong."""
    net, shape = _net("fcn_dilated_dict_bilinear")
    assert abs_pow_log10(net, shape, 1.0) == pytest.approx(path_norm(net, shape).log10,
                                                           abs=1e-12)
    assert abs(abs_pow_log10(net, shape, 2.0) - path_norm(net, shape, q=2).log10) > 1e-3


# ------------------------------------------------------------------ refused, rightly

REFUSED = {  # name -> (builder, shape, op named in the message)
    "bilinear_layer": (z.bilinear_layer, VEC, "Bilinear"),
    "embedding": (z.embedding_bag, VEC, "Embedding"),
    "pre_hook_that_scales": (z.pre_hooked, VEC, "torch.fx trace"),
    "forward_hook_that_scales": (z.forward_hooked, VEC, "torch.fx trace"),
    "batchnorm_without_running_stats": (z.batchnorm_without_running_stats, IMG,
                                        "BatchNorm2d"),
    "instance_norm_running_stats": (z.instance_norm_with_running_stats, IMG,
                                    "InstanceNorm2d"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unseen_model_outside_what_is_read_is_refused_in_one_line(name: str) -> None:
    make, shape, op = REFUSED[name]
    torch.manual_seed(0)
    net = make().double().eval()
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(net, shape)
    line = timm_scan.check_refused(info.value)
    assert f"({op})" in line, line


# ------------------------------------------------- inside the theory, refused today

def _assert_like_twin(net: nn.Module, twin: nn.Module, shape: tuple[int, ...]) -> None:
    """``net`` computes ``twin``'s function and pathlift gives it the twin's enumerated
    path-norms (the twin writes the same network with ops pathlift reads)."""
    x = torch.randn(3, *shape, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(net(x), twin(x), rtol=0, atol=1e-12)
    dag = NeuronDAG.from_module(twin, shape)
    for q in (1.0, 2.0):
        assert path_norm(net, shape, q=q).log10 == pytest.approx(dag.path_norm_log10(q),
                                                                 abs=1e-12)


def _twins(name: str) -> tuple[nn.Module, nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    if name.startswith("padding_mode_"):
        mode = name.removeprefix("padding_mode_")
        net = randomised(z.padded_convs(mode), 0)
        return net, z.padded_twin(net, mode), IMG
    net = randomised(z.WRONGLY_REFUSED[name](), 0)
    return net, z.twin_of(net), VEC


#: name -> (what pathlift does today and where, what it raises)
INSIDE_REFUSED = {
    "torch_stack_sum": ("torch.stack at dim 0 puts the stacked tensors before the batch "
                        "dim, which every pass assumes at dim 0: refused in one line "
                        "(graph/ops/relabel.py StackHandler; stack along a feature dim is "
                        "measured, tests/test_fixed_maps.py)", PathliftError),
    "jit_script_submodule": ("a torch.jit.script-ed Sequential inside an eager model is "
                             "refused in one line naming the submodule and TorchScript "
                             "(graph/trace.py _refuse_torchscript): its compiled forward "
                             "is not read", PathliftError),
}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, raises=raises, reason=why))
    for n, (why, raises) in INSIDE_REFUSED.items()])
def test_inside_the_theory_but_refused_today(name: str) -> None:
    net, twin, shape = _twins(name)
    _assert_like_twin(net, twin, shape)


@pytest.mark.parametrize("mode", ["reflect", "circular", "replicate"])
def test_a_conv_padding_mode_is_measured_like_its_twin(mode: str) -> None:
    """Conv2d(padding_mode=mode) is F.pad(mode=mode) and the unpadded conv (it used to be
    refused by ConvHandler.problem)."""
    net, twin, shape = _twins(f"padding_mode_{mode}")
    _assert_like_twin(net, twin, shape)


@pytest.mark.parametrize("name", ["clamp_min_zero", "maximum_with_zeros", "abs",
                                  "where_leaky"])
def test_inside_the_theory_and_measured_like_its_twin(name: str) -> None:
    """Refused at an earlier stop: ``clamp_min(0)`` and ``torch.maximum(h, zeros)`` are
    ReLU, |z| is ReLU(z) + ReLU(-z), ``torch.where(h > 0, h, 0.1 * h)`` is LeakyReLU
    (tests/test_relu_spellings.py checks every spelling)."""
    net, twin, shape = _twins(name)
    _assert_like_twin(net, twin, shape)


def test_a_constant_times_an_activation_is_measured_like_its_twin() -> None:
    """``2.0 * h`` (``operator.mul(2.0, h)``) is ``h * 2.0``: it used to end in a traceback
    (the scale's input taken as its first argument)."""
    net, twin, shape = _twins("scalar_times_tensor")
    _assert_like_twin(net, twin, shape)


def test_a_scripted_model_is_refused_naming_torchscript() -> None:
    """It was refused as ShapeError "asserts on the input's shape" (the cause is
    TorchScript, not the shape)."""
    torch.manual_seed(0)
    net = torch.jit.script(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval())
    with pytest.raises(PathliftError) as info:
        path_norm(net, VEC)
    assert isinstance(info.value, UnsupportedModelError), one_line(info.value)
    line = timm_scan.check_refused(info.value)
    assert "TorchScript" in line and "pass the eager module" in line, line


def test_a_scripted_submodule_is_refused_in_one_line_naming_it() -> None:
    """It was refused as "data-dependent control flow" ('_CachedForward' object has no
    attribute '__getattr__')."""
    torch.manual_seed(0)
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(z.ScriptedBlock().double().eval(), VEC)
    line = timm_scan.check_refused(info.value)
    assert "submodule 'block' is a TorchScript module" in line, line


def test_a_reciprocal_is_refused_in_one_line() -> None:
    """``2.0 / h`` is not a constant scale (it was read as ``h / 2``, then crashed)."""
    torch.manual_seed(0)
    net = z.Reciprocal().double().eval()
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(net, VEC)
    timm_scan.check_refused(info.value)


@pytest.mark.parametrize("inner", [
    pytest.param(False, id="on_the_root", marks=pytest.mark.xfail(
        strict=True, raises=PathliftError, reason=(
            "a parameter of the root module read by a functional layer is refused in one "
            "line, 'tensors belong to one submodule (not the model's root)' (graph/"
            "functional.py _owner): the lowered layer would be the root itself, whose "
            "name '' every pass joins into keys ('.gamma')"))),
    pytest.param(True, id="on_a_submodule")])
def test_a_layer_scale_stored_as_1c11_is_a_depthwise_scale(inner: bool) -> None:
    torch.manual_seed(0)
    net = randomised(z.LayerScale(inner=inner), 0)
    twin = z.depthwise_twin(net)
    _assert_like_twin(net, twin, IMG)


@pytest.mark.parametrize("name", sorted(set(z.FIXED_MAPS) - {"amax"}))
def test_fixed_linear_maps_are_measured(name: str) -> None:
    """Each map moves or sums entries with weight 1, so the |theta|^q pass of the eager
    forward is exact at q = 1, 2 (amin: against its twin amax, -amin(-h) = amax(h))."""
    torch.manual_seed(0)
    net = randomised(z.fixed_map(name), 0)
    for q in (1.0, 2.0):
        if name == "amin":
            twin = randomised(z.fixed_map("amax"), 0)
            twin.load_state_dict(net.state_dict())
            expected = path_norm(twin, IMG, q=q).log10
        else:
            expected = abs_pow_log10(net, IMG, q)
        assert path_norm(net, IMG, q=q).log10 == pytest.approx(expected, abs=1e-12)


@pytest.mark.xfail(strict=True, raises=PathliftError, reason=(
    "(x - self.mean) / self.std on the input is a per-channel affine map (identity "
    "neurons with a bias); refused as buffers 'read outside any layer' (graph/validate.py)"))
def test_an_input_normalised_in_forward_is_an_affine_layer() -> None:
    torch.manual_seed(0)
    net = randomised(z.NormalisedInput(), 0)
    _assert_like_twin(net, z.NormalisedInputTwin(net).eval(), IMG)


#: every weight sits behind a parametrization or prune mask: the copy below prunes none
PARAMETRIZED = {"weight_norm_parametrization", "nn_utils_prune_masks"}


def _pruned(net: nn.Module) -> nn.Module:
    """A copy with 30% of every plain Linear/Conv weight set to zero (|theta'| <= |theta|,
    same signs: Lemma 3.4.1's premise)."""
    out = copy.deepcopy(net)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for m in out.modules():
            if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)) \
                    and not nn.utils.parametrize.is_parametrized(m):
                keep = torch.rand(m.weight.shape, generator=g, dtype=m.weight.dtype) > 0.3
                m.weight.mul_(keep.to(m.weight.dtype))
    return out


@pytest.mark.parametrize("name", sorted(set(MEASURED) - COMPUTED - PARAMETRIZED))
def test_unseen_model_bounds_hold_and_the_path_metric_is_enumerated(name: str) -> None:
    """Thm 3.3.1 on 40 sampled pairs (and ||Phi||_{1,1} <= the layer-norm product, Thm
    3.3.2); the l1 path-metric to a pruned copy is exact (Lemma 3.4.1) and equals
    ||Phi||_1 - ||Phi'||_1 by enumeration, and bounds the change of every output
    (Cor. 3.4.1) on 40 inputs."""
    net, shape = _net(name)
    assert_bounds_and_path_metric(net, shape, _pruned(net))


@pytest.mark.parametrize("name", sorted(COMPUTED))
def test_the_path_metric_reads_a_weight_computed_in_forward(name: str) -> None:
    """It used to raise "operation '_0' (Linear) differs from '_0' (Linear)": a layer
    lowered from a functional call gets its op per graph, compared by identity."""
    net, shape = _net(name)
    other = copy.deepcopy(net)
    with torch.no_grad():
        next(other.parameters()).mul_(0.5)  # |theta'| <= |theta|, same signs
    metric = path_metric(net, other, shape)
    enumerated = (NeuronDAG.from_module(net, shape).path_norm(1.0)
                  - NeuronDAG.from_module(other, shape).path_norm(1.0))
    assert metric.upper_log10 == pytest.approx(math.log10(enumerated), abs=1e-12)
