"""Issue 21 on a zoo of public architectures (``tests/zoo.py``, written from their papers).

- full size: traced and path-normed, float32 and float64 mantissas agree, finite, positive;
- scaled down: every (q, r) of the exactness suite equals explicit path enumeration
  (``NeuronDAG``, Def. 2.2.2, 3.1.1) at 1e-12; the model's outputs equal the oracle's
  <Phi, A(x; 1)> (Thm 2.4.2);
- every public function that takes a model runs on each zoo model (with a number checked
  against an independent computation: the eager model, the oracle, a theorem's inequality)
  or, for those allowed to, refuses with a typed ``PathliftError``; none modifies the model;
- rescaling and normalisation keep the function and every path-norm of LeakyReLU/PReLU
  networks, and the function of ReLU6 networks;
- the MobileNetV3-like model is refused by every function, in at most 10 lines naming each
  cause once;
- random networks drawing the new ops (``random_nets.NEW_OPS``), one flag at a time and all
  mixed: path-norms and outputs against enumeration, rescaling and normalisation.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

import zoo
from pathlift.bounds import (
    architecture_constants,
    certified_error,
    lipschitz_input,
    lipschitz_params,
    margins,
    rademacher_peeling,
    symmetry_aware_quantize,
)
from pathlift.bounds.symmetry_aware import compare
from pathlift.errors import PathliftError, UnsupportedModelError
from pathlift.graph import check, trace
from pathlift.lift import (
    average_case_path_norm,
    layer_norm_product,
    local_affine,
    path_metric,
    path_norm,
    path_norms,
)
from pathlift.lift.path_metric import enumerated_path_metric
from pathlift.prune import (
    channel_path_magnitude,
    global_magnitude,
    global_path_magnitude,
    layerwise_magnitude,
    layerwise_path_magnitude,
    magnitude_scores,
    path_magnitude_scores,
    path_magnitude_unstructured,
    prunable_parameters,
    prune_model,
)
from pathlift.quant import lfcn_constants, quantize
from pathlift.symmetry import (
    adversarial_rescale,
    analyse,
    canonicalize,
    conserved_quantities,
    equivalent,
    magnitude_prune,
    normalize,
    normalize_report,
    random_rescale,
)
from pathlift.testing.neurons import NeuronDAG
from pathlift.track import PathNormTracker
from random_nets import NEW_OPS, random_network
from test_path_norm import QS, RS

LN10 = math.log(10.0)
NAMES = sorted(zoo.ZOO)
HOMOGENEOUS = [n for n in NAMES if not zoo.ZOO[n].activations & {"relu6", "hardtanh"}]
CLIPPING = [n for n in NAMES if zoo.ZOO[n].activations & {"relu6", "hardtanh"}]


# --------------------------------------------------------------------------- helpers
def flat(y: Any) -> Tensor:
    """Every output neuron of a model's output, per sample: dict values in insertion order,
    tuple/namedtuple fields in order (written here, not pathlift's own flattening)."""
    if isinstance(y, Tensor):
        return y.reshape(y.shape[0], -1)
    if isinstance(y, dict):
        return torch.cat([flat(v) for v in y.values()], dim=1)
    return torch.cat([flat(v) for v in y], dim=1)


def outputs(model: nn.Module, x: Tensor) -> Tensor:
    with torch.no_grad():
        return flat(model(x)).double()


def inputs(shape: tuple[int, ...], seed: int, n: int = 4, scale: float = 2.0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((n, *shape), generator=g, dtype=torch.float64) * scale


def state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(model: nn.Module, before: dict[str, Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), k


def assert_same_function(a: nn.Module, b: nn.Module, shape: tuple[int, ...], rel: float,
                         seed: int = 0) -> None:
    for scale in (0.5, 3.0, 20.0):  # large inputs saturate ReLU6/Hardtanh neurons
        x = inputs(shape, seed, scale=scale)
        ya, yb = outputs(a, x), outputs(b, x)
        assert float((ya - yb).abs().max()) <= rel * max(float(ya.abs().max()), 1e-300)


def assert_log10_close(a: float, b: float, rel: float) -> None:
    """|a - b| in log10 within the given relative error of the values."""
    assert a == b or abs(a - b) * LN10 <= rel, (a, b)


def clipping_ops(model: nn.Module) -> list[nn.Module]:
    """The clipping activation modules of a zoo model (ReLU6, Hardtanh)."""
    return [m for m in model.modules() if isinstance(m, (nn.ReLU6, nn.Hardtanh))]


def shrunk(model: nn.Module, factor: float = 0.9) -> nn.Module:
    """A copy with every parameter times ``factor`` in (0, 1): same signs, |theta'| <= |theta|
    (Lemma 3.4.1), so the l1 path-metric is exact."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.mul_(factor)
    return out


# --------------------------------------------------------------------------- eager models
def test_channel_shuffle_interleaves_the_two_halves():
    """ShuffleNet's shuffle by view/transpose with x.size() arithmetic is the permutation
    c -> (c % (C/2)) * 2 + c // (C/2) of the channels."""
    x = torch.arange(2 * 6 * 2 * 3, dtype=torch.float64).reshape(2, 6, 2, 3)
    perm = [0, 3, 1, 4, 2, 5]
    assert torch.equal(zoo.channel_shuffle(x, 2), x[:, perm])


def test_pixel_shuffle_spelled_out_is_torchs():
    x = torch.randn(2, 12, 3, 4, dtype=torch.float64)
    assert torch.equal(zoo.pixel_shuffle_view(x, 2), F.pixel_shuffle(x, 2))


@pytest.mark.parametrize("name", NAMES + sorted(zoo.REFUSED))
def test_zoo_models_run_eagerly_with_the_papers_shapes(name):
    """Both sizes run; segmentation and super-resolution outputs have the input's (times
    the scale) spatial size; the dict and namedtuple models return their types."""
    expected = {"deeplabv3": ({"out": (21, 224, 224), "aux": (21, 224, 224)},
                              {"out": (1, 2, 3), "aux": (1, 2, 3)}),
                "unet": ((2, 572, 572), (1, 2, 3)), "srresnet": ((3, 96, 96), (1, 2, 2)),
                "patchgan": ((1, 30, 30), (1, 1, 1)), "r3d_18": ((400,), (2,)),
                "aux_classifier": (((10,), (10,)), ((2,), (2,)))}
    for small in (True, False):
        model, shape = zoo.build(name, small=small, dtype=torch.float32)
        if not small and zoo.ZOO.get(name, zoo.REFUSED.get(name)).heavy:
            continue  # shapes only: skip the seconds-long full-size forward
        with torch.no_grad():
            y = model(torch.randn(1, *shape))
        if isinstance(y, dict):
            got: Any = {k: tuple(v.shape[1:]) for k, v in y.items()}
        elif isinstance(y, tuple):
            assert type(y).__name__ == "ClassifierOutputs"
            got = tuple(tuple(v.shape[1:]) for v in y)
        else:
            got = tuple(y.shape[1:])
        if name in expected:
            assert got == expected[name][1 if small else 0]
        assert torch.isfinite(flat(y)).all()


# --------------------------------------------------------------------------- full size
def _full(name: str):
    marks = [pytest.mark.slow] if zoo.ZOO[name].heavy else []
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_full(n) for n in NAMES])
def test_full_size_is_traced_and_path_normed(name):
    model, shape = zoo.build(name, small=False, dtype=torch.float32)
    before = state(model)
    graph = trace(model, shape)
    f64 = path_norm(graph, None, 1.0, 1.0)
    f32 = path_norm(graph, None, 1.0, 1.0, dtype=torch.float32)
    assert math.isfinite(f64.log10) and f64.value > 0
    assert_log10_close(f32.log10, f64.log10, 1e-5)
    l2 = path_norm(model, shape, 2.0, 2.0)
    assert math.isfinite(l2.log10) and l2.log10 < f64.log10  # ||.||_2 <= ||.||_1
    assert_same_state(model, before)


# --------------------------------------------------------------------------- exactness
_DAGS: dict[str, NeuronDAG] = {}


def small_dag(name: str) -> tuple[nn.Module, tuple[int, ...], NeuronDAG]:
    model, shape = zoo.build(name)
    if name not in _DAGS:
        _DAGS[name] = NeuronDAG.from_module(model, shape, max_paths=zoo.SMALL_MAX_PATHS)
    return model, shape, _DAGS[name]


@pytest.mark.parametrize("name", NAMES)
def test_small_path_norms_equal_enumeration(name):
    """Thm 3.1.1 against Def. 3.1.1 summed path by path, every (q, r) of the exactness
    suite, float64, 1e-12 relative."""
    model, shape, dag = small_dag(name)
    assert 0 < dag.num_paths <= zoo.SMALL_MAX_PATHS
    graph = trace(model, shape)
    for q in QS:
        for r in RS:
            assert_log10_close(path_norm(graph, None, q, r).log10, dag.path_norm_log10(q, r),
                               1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_small_outputs_equal_the_path_lifting_formula(name):
    """R_theta(x) = <Phi(theta), A(theta, x)(x; 1)> (Thm 2.4.2) on random inputs of three
    scales (ReLU6 neurons saturate at the largest)."""
    model, shape, dag = small_dag(name)
    for seed, scale in enumerate((0.5, 3.0, 20.0)):
        x = inputs(shape, seed, n=1, scale=scale)
        y = outputs(model, x)[0].numpy()
        oracle = dag.output(x)
        assert oracle.shape == y.shape
        assert abs(oracle - y).max() <= 1e-10 * max(abs(y).max(), 1.0)


# --------------------------------------------------------------------------- public API
class Calls:
    """Runs public functions, letting a typed refusal through only where allowed."""

    def __init__(self) -> None:
        self.refused: dict[str, str] = {}

    def required(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def optional(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PathliftError as e:
            self.refused[fn.__name__] = f"{type(e).__name__}: {e}"
            return None


@pytest.mark.parametrize("name", NAMES)
def test_every_public_function_runs_or_refuses_typed(name):
    model, shape, dag = small_dag(name)
    check_public_functions(model, shape, dag)


def check_public_functions(model: nn.Module, shape: tuple[int, ...], dag: NeuronDAG) -> None:
    """Each public function that takes a model, on ``model``; numbers against ``dag``, the
    eager model and the theorems' inequalities."""
    before = state(model)
    call = Calls()
    x = inputs(shape, 7, n=6)
    y = outputs(model, x)
    l1 = dag.path_norm(1.0, 1.0)

    # path-norms
    norms = call.required(path_norms, model, shape, qs=(1.0, 2.0))
    assert_log10_close(norms[1.0].log10, dag.path_norm_log10(1.0), 1e-12)
    assert_log10_close(norms[2.0].log10, dag.path_norm_log10(2.0, 2.0), 1e-12)

    # Lipschitz in x (Thm 3.3.1) and the product of layer norms (Thm 3.3.2)
    lip = call.required(lipschitz_input, model, shape)
    x2 = x + inputs(shape, 8, n=6, scale=0.1)
    ratio = (y - outputs(model, x2)).abs().sum(1) / (x - x2).flatten(1).abs().amax(1)
    assert float(ratio.max()) <= lip.path_norm.value * (1 + 1e-9)
    product = call.optional(layer_norm_product, model, shape)
    if product is not None:
        assert product.log10 >= lip.log10 - 1e-9

    # Lipschitz in theta: the l1 path-metric against its enumeration (Lemma 3.4.1 when
    # |theta'| <= |theta| with the same signs in the lowered DAG: always for homogeneous
    # networks; a clipping neuron's fixed bias (ReLU6's -6) may break it) and Cor. 3.4.1
    small = shrunk(model)
    truth = enumerated_path_metric(model, small, shape)
    metric = call.required(path_metric, model, small, shape)
    clipping = bool(clipping_ops(model))
    assert metric.exact or clipping
    if metric.exact:
        assert metric.value == pytest.approx(truth, rel=1e-9)
    else:
        assert metric.lower * (1 - 1e-9) <= truth <= metric.upper * (1 + 1e-9)
    bound = call.required(lipschitz_params, model, small, shape, x_inf=1.0)
    assert bound.applies or clipping
    if bound.applies:
        assert bound.value >= truth * (1 - 1e-9)
        gap = (y - outputs(small, x)).abs().sum(1)
        radius = x.flatten(1).abs().amax(1).clamp(min=1)
        assert (gap <= truth * radius * (1 + 1e-9)).all()

    # local affine map and average case (Sec. 7.2.2): E ||A^T Phi||_1 <= ||Phi||_1
    affine = call.required(local_affine, model, shape, x)
    rebuilt = (affine.slopes.flatten(2) * x.flatten(1).unsqueeze(1)).sum(2) + affine.offsets
    assert float((rebuilt - y).abs().max()) <= 1e-9 * max(float(y.abs().max()), 1.0)
    average = call.required(average_case_path_norm, model, shape, x)
    assert 0 < average.mean <= l1 * (1 + 1e-9)

    # generalisation bound constants (Thm 4.4.1)
    constants = call.required(architecture_constants, model, shape)
    assert constants.d_in == math.prod(shape) and constants.d_out == y.shape[1]
    assert math.isfinite(rademacher_peeling(constants, 1.0, norms[1.0].log10).log10)

    # rescaling, normalisation, canonical form, equivalence: the function is kept
    rescaled = call.required(random_rescale, model, seed=1, input_shape=shape)
    assert_same_function(model, rescaled, shape, 1e-10)
    normalised = call.required(normalize, model, shape)
    assert_same_function(model, normalised, shape, 1e-10)
    call.required(normalize_report, model, shape)
    canonical = call.required(canonicalize, model, shape)
    assert_same_function(model, canonical.model, shape, 1e-10)
    assert call.required(equivalent, model, rescaled, shape).equivalent
    other = shrunk(model, 0.5)
    assert not call.required(equivalent, model, other, shape).equivalent
    call.required(analyse, model, shape)
    call.optional(conserved_quantities, model, shape)
    attacked = call.optional(adversarial_rescale, model, input_shape=shape)
    if attacked is not None:
        assert_same_function(model, attacked, shape, 1e-9)
    call.optional(magnitude_prune, model, 0.3, shape)

    # scores: |theta| and Path-Mag = ||Phi||_1 - ||Phi(theta_{-i})||_1 (Sec. 3.5)
    mags = call.required(magnitude_scores, model, shape)
    params = dict(model.named_parameters())
    for key in mags.tensors:
        assert torch.equal(mags.value(key), params[key].detach().abs().double()), key
    path_mag = call.required(path_magnitude_scores, model, shape)
    values = {k: path_mag.value(k) for k in path_mag.tensors}  # mantissa x 10^scale
    best_key, best = max(values.items(), key=lambda kv: float(kv[1].max()))
    assert all(float(v.min()) >= 0 and float(v.max()) <= l1 * (1 + 1e-9)
               for v in values.values())

    # pruning (on copies: the torch.nn.utils.prune methods modify their argument)
    certificates = []
    for fn in (global_magnitude, global_path_magnitude, layerwise_magnitude,
               layerwise_path_magnitude):
        pruned = copy.deepcopy(model)
        result = call.required(fn, pruned, shape, 0.3)
        gap = (y - outputs(pruned, x)).abs().sum(1)
        radius = x.flatten(1).abs().amax(1).clamp(min=1)
        assert (gap <= result.path_metric * radius * (1 + 1e-9)).all(), fn.__name__
        certificates.append((fn.__name__, result))
    pruned = copy.deepcopy(model)
    result = call.required(prune_model, pruned, shape, 0.3, steps=2)
    assert result.pruned > 0
    pruned = copy.deepcopy(model)
    call.optional(channel_path_magnitude, pruned, shape, 0.3)
    pruned = copy.deepcopy(model)
    module_name, _, param_name = prunable_parameters(trace(pruned, shape))[0]
    call.required(path_magnitude_unstructured, pruned.get_submodule(module_name), param_name,
                  0.5, pruned, shape)

    # quantisation with its certified error (Ch. 6)
    quantized = call.required(quantize, model, shape, bits=6)
    certified = call.required(certified_error, model, quantized, shape)
    gap = (y - outputs(quantized.model, x)).abs().sum(1)
    assert (gap <= certified.bound(x) * (1 + 1e-9)).all()
    call.optional(lfcn_constants, model, shape)
    call.optional(symmetry_aware_quantize, model, shape, 6)
    call.optional(compare, model, shape, 6, x)

    # the tracker and the checker
    row = call.required(PathNormTracker(shape, qs=(1.0,)), model, 0)
    assert_log10_close(row["path_norm_log10_q1"], dag.path_norm_log10(1.0), 1e-12)
    assert call.required(check, model, shape).ok
    loader = DataLoader(TensorDataset(x, torch.zeros(len(x), dtype=torch.long)), batch_size=3)
    call.optional(margins, model, loader)

    assert_same_state(model, before)
    # checked last: the pruning certificates (eq. 3.17: the exact path-metric never exceeds
    # the sum of the pruned coordinates' Path-Mag) and Path-Mag of the largest-scored
    # coordinate, which is the cost of pruning it
    for fn_name, result in certificates:
        assert result.log10_path_metric <= result.log10_bound + 1e-9, (
            fn_name, result.log10_path_metric, result.log10_bound)
    index = int(best.argmax())
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        dict(zeroed.named_parameters())[best_key].view(-1)[index] = 0.0
    without = NeuronDAG.from_module(zeroed, shape, zoo.SMALL_MAX_PATHS).path_norm(1.0)
    assert float(best.view(-1)[index]) == pytest.approx(l1 - without, rel=1e-9)
    assert set(call.refused) <= {"layer_norm_product", "conserved_quantities",
                                 "adversarial_rescale", "magnitude_prune",
                                 "channel_path_magnitude", "lfcn_constants",
                                 "symmetry_aware_quantize", "compare", "margins"}, call.refused


# --------------------------------------------------------------------------- symmetries
def _powers_of_two_kept(model: nn.Module, shape, rescaled: nn.Module, dag: NeuronDAG) -> None:
    assert_same_function(model, rescaled, shape, 1e-12)
    after = NeuronDAG.from_module(rescaled, shape, zoo.SMALL_MAX_PATHS)
    graph = trace(rescaled, shape)
    for q in QS:
        for r in RS:
            expected = dag.path_norm_log10(q, r)
            assert_log10_close(after.path_norm_log10(q, r), expected, 1e-12)
            assert_log10_close(path_norm(graph, None, q, r).log10, expected, 1e-12)


@pytest.mark.parametrize("name", ["patchgan", "srresnet"])
def test_leaky_and_prelu_networks_rescale_and_normalise_exactly(name):
    """LeakyReLU and PReLU are positively homogeneous: rescaling (Def. 2.4.1, factors that
    are powers of two, so exact in floating point) and normalisation (Alg. 3.2.1) keep the
    function and every path-norm, at 1e-12 in float64; the parameters did move."""
    model, shape, dag = small_dag(name)
    rescaled = random_rescale(model, factors=(1.0, 128.0, 4096.0), seed=2, input_shape=shape)
    moved = sum(float((a - b).abs().sum()) for a, b in
                zip(model.parameters(), rescaled.parameters(), strict=True))
    assert moved > 1.0
    _powers_of_two_kept(model, shape, rescaled, dag)
    for q in (1.0, 2.0):
        normalised = normalize(model, shape, q)
        assert_same_function(model, normalised, shape, 1e-12)
        graph = trace(normalised, shape)
        for qq in QS:
            for r in RS:
                assert_log10_close(path_norm(graph, None, qq, r).log10,
                                   dag.path_norm_log10(qq, r), 1e-12)


@pytest.mark.parametrize("name", CLIPPING)
def test_clipping_networks_keep_their_function(name):
    """ReLU6/Hardtanh neurons fix their scale (they are not positively homogeneous):
    rescaling and normalisation move only the free neurons and keep the function."""
    model, shape, _ = small_dag(name)
    for factors in ((1.0, 128.0, 4096.0), (0.37, 3.1, 250.0)):
        rescaled = random_rescale(model, factors=factors, seed=3, input_shape=shape)
        assert_same_function(model, rescaled, shape, 1e-10)
    assert_same_function(model, normalize(model, shape, 1.0), shape, 1e-10)


def test_pixel_shuffle_module_is_the_relabelling_or_a_typed_refusal():
    """nn.PixelShuffle moves entries and computes nothing: the path-norms of SRResNet with
    it equal those with the shuffle spelled out as view/permute, or it is refused by name."""
    torch.manual_seed(0)
    spelled = zoo.randomise_(zoo.srresnet_small("view"), 0).double()
    module = zoo.srresnet_small("module").double().eval()
    module.load_state_dict(spelled.state_dict())
    shape = zoo.ZOO["srresnet"].small_shape
    assert_same_function(spelled, module, shape, 0.0)
    try:
        got = path_norms(module, shape, qs=(1.0, 2.0))
    except UnsupportedModelError as e:
        assert "PixelShuffle" in str(e) or "pixel_shuffle" in str(e)
        return
    want = path_norms(spelled, shape, qs=(1.0, 2.0))
    for q in want:
        assert_log10_close(got[q].log10, want[q].log10, 1e-12)


# --------------------------------------------------------------------------- refusals
REFUSING: tuple[tuple[str, Callable[[nn.Module, tuple[int, ...]], Any]], ...] = (
    ("path_norm", lambda m, s: path_norm(m, s)),
    ("path_norms", lambda m, s: path_norms(m, s)),
    ("lipschitz_input", lambda m, s: lipschitz_input(m, s)),
    ("path_metric", lambda m, s: path_metric(m, shrunk(m), s)),
    ("lipschitz_params", lambda m, s: lipschitz_params(m, shrunk(m), s)),
    ("architecture_constants", lambda m, s: architecture_constants(m, s)),
    ("average_case_path_norm", lambda m, s: average_case_path_norm(m, s, inputs(s, 0))),
    ("local_affine", lambda m, s: local_affine(m, s, inputs(s, 0))),
    ("random_rescale", lambda m, s: random_rescale(m, input_shape=s)),
    ("normalize", lambda m, s: normalize(m, s)),
    ("canonicalize", lambda m, s: canonicalize(m, s)),
    ("equivalent", lambda m, s: equivalent(m, shrunk(m), s)),
    ("path_magnitude_scores", lambda m, s: path_magnitude_scores(m, s)),
    ("prune_model", lambda m, s: prune_model(copy.deepcopy(m), s, 0.3)),
    ("quantize", lambda m, s: quantize(m, s, bits=6)),
    ("tracker", lambda m, s: PathNormTracker(s)(m)),
    ("NeuronDAG", lambda m, s: NeuronDAG.from_module(m, s)),
)


@pytest.mark.parametrize("what, fn", REFUSING, ids=[w for w, _ in REFUSING])
def test_mobilenet_v3_like_is_refused_by_every_function(what, fn):
    model, shape = zoo.build("mobilenet_v3_like")
    before = state(model)
    with pytest.raises(UnsupportedModelError):
        fn(model, shape)
    assert_same_state(model, before)


@pytest.mark.parametrize("small", [True, False])
def test_mobilenet_v3_like_error_reads_once(small):
    """At most 10 lines; one line for hardswish (not piecewise-linear) with the number of
    hardswish nodes, one for the squeeze-excitation products with their number; the
    hardsigmoid gates (piecewise-linear: lowered, or refused) on one line at most."""
    model, shape = zoo.build("mobilenet_v3_like", small=small, dtype=torch.float32)
    hardswish = sum(isinstance(m, nn.Hardswish) for m in model.modules())
    products = sum(isinstance(m, zoo.SqueezeExcitation) for m in model.modules())
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(model, shape)
    lines = str(info.value).splitlines()
    assert len(lines) <= 10, str(info.value)
    assert lines[-1].startswith("  supported: ")  # once, after the causes
    lines = lines[:-1]
    swish = [line for line in lines if "hardswish" in line.lower()]
    assert len(swish) == 1, str(info.value)
    assert re.search(rf"\b{hardswish}\b", swish[0]), swish[0]
    product = [line for line in lines if re.search(r"\bmul\b|product", line.lower())]
    assert len(product) == 1, str(info.value)
    assert re.search(rf"\b{products}\b", product[0]), product[0]
    assert sum("hardsigmoid" in line.lower() for line in lines) <= 1, str(info.value)


# --------------------------------------------------------------------------- random networks
def _seeds_with(flag: str, count: int, new_ops: frozenset[str] | None = None) -> list[int]:
    """The first ``count`` seeds whose network (drawing ``new_ops``, default {flag}) uses
    ``flag``."""
    ops = new_ops or frozenset({flag})
    found = []
    for seed in range(10_000):
        model, _ = random_network(seed, new_ops=ops)
        if model.as_dict if flag == "dict_output" else any(st.tag == flag for st in model.steps):
            found.append(seed)
            if len(found) == count:
                return found
    raise AssertionError(f"random_nets never draws {flag}")


PER_FLAG = [(flag, seed) for flag in sorted(NEW_OPS) for seed in _seeds_with(flag, 3)]
PIECEWISE = frozenset({"leaky_relu", "prelu", "relu6", "hardtanh", "clamp"})
HOMOGENEOUS_OPS = NEW_OPS - {"relu6", "hardtanh", "clamp"}


def test_random_networks_draw_every_new_op_and_trace():
    """Over 200 seeds with every flag on, each flag is drawn at least 5 times and every
    network is traced by torch.fx to a graph computing what the eager model computes."""
    counts = dict.fromkeys(NEW_OPS, 0)
    for seed in range(200):
        model, shape = random_network(seed, new_ops=NEW_OPS)
        for st in model.steps:
            if st.tag:
                counts[st.tag] += 1
        counts["dict_output"] += model.as_dict
        x = inputs(shape, seed, n=2)
        model = model.double()
        graph = torch.fx.symbolic_trace(model)
        assert torch.equal(outputs(model, x), outputs(graph, x)), seed
    assert min(counts.values()) >= 5, counts


def check_against_enumeration(model: nn.Module, shape: tuple[int, ...]) -> NeuronDAG:
    """Every (q, r) of the exactness suite at 1e-12 and the outputs (Thm 2.4.2)."""
    model = model.double()
    dag = NeuronDAG.from_module(model, shape)
    graph = trace(model, shape)
    for q in QS:
        for r in RS:
            assert_log10_close(path_norm(graph, None, q, r).log10, dag.path_norm_log10(q, r),
                               1e-12)
    for seed, scale in enumerate((0.5, 4.0)):
        x = inputs(shape, seed, n=1, scale=scale)
        y = outputs(model, x)[0].numpy()
        assert abs(dag.output(x) - y).max() <= 1e-10 * max(abs(y).max(), 1.0)
    return dag


@pytest.mark.parametrize("flag, seed", PER_FLAG, ids=[f"{f}-{s}" for f, s in PER_FLAG])
def test_each_new_op_equals_enumeration(flag, seed):
    """One flag at a time (so a failure names the op): networks that draw it."""
    model, shape = random_network(seed, new_ops={flag})
    check_against_enumeration(model, shape)


@pytest.mark.parametrize("seed", [pytest.param(s, marks=[pytest.mark.slow] if s >= 20 else [])
                                  for s in range(150)])
def test_random_networks_mixing_every_new_op_equal_enumeration(seed):
    model, shape = random_network(seed, new_ops=NEW_OPS)
    check_against_enumeration(model, shape)


@pytest.mark.parametrize("seed", _seeds_with("leaky_relu", 4, HOMOGENEOUS_OPS)
                         + _seeds_with("prelu", 4, HOMOGENEOUS_OPS))
def test_leaky_prelu_random_networks_rescale_and_normalise_exactly(seed):
    """Positively homogeneous activations (and the relabelling/linear new ops): rescaling by
    powers of two and normalisation keep the function and every path-norm at 1e-12."""
    model, shape = random_network(seed, new_ops=HOMOGENEOUS_OPS)
    model = model.double()
    dag = NeuronDAG.from_module(model, shape)
    rescaled = random_rescale(model, factors=(1.0, 128.0, 4096.0), seed=seed, input_shape=shape)
    _powers_of_two_kept(model, shape, rescaled, dag)
    normalised = normalize(model, shape, 1.0)
    assert_same_function(model, normalised, shape, 1e-12)
    graph = trace(normalised, shape)
    for q in QS:
        for r in RS:
            assert_log10_close(path_norm(graph, None, q, r).log10, dag.path_norm_log10(q, r),
                               1e-12)


@pytest.mark.parametrize("seed", _seeds_with("relu6", 3, NEW_OPS)
                         + _seeds_with("hardtanh", 3, NEW_OPS) + _seeds_with("clamp", 3, NEW_OPS))
def test_clipping_random_networks_keep_their_function(seed):
    """ReLU6, Hardtanh, clamp fix their neurons' scale: rescaling (any factors) and
    normalisation keep the function."""
    model, shape = random_network(seed, new_ops=NEW_OPS)
    model = model.double()
    for factors in ((1.0, 128.0, 4096.0), (0.37, 3.1, 250.0)):
        rescaled = random_rescale(model, factors=factors, seed=seed, input_shape=shape)
        assert_same_function(model, rescaled, shape, 1e-10)
    assert_same_function(model, normalize(model, shape, 1.0), shape, 1e-10)


# --------------------------------------------------------------------------- Path-Mag
def _scored_nets() -> dict[str, tuple[nn.Module, tuple[int, ...]]]:
    torch.manual_seed(5)
    nets = {
        "conv-relu-adaptive-avg": (nn.Sequential(
            nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(2, 2)), (1, 4, 4)),
        "conv-relu-mean": (nn.Sequential(
            nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Flatten(2), nn.Linear(16, 2)),
            (1, 4, 4)),
        "mlp-leaky-relu": (nn.Sequential(nn.Linear(3, 4), nn.LeakyReLU(0.2), nn.Linear(4, 2)),
                           (3,)),
        "mlp-leaky-relu-negative": (nn.Sequential(nn.Linear(3, 4), nn.LeakyReLU(-1.5),
                                                  nn.Linear(4, 2)), (3,)),
        "mlp-prelu-per-channel": (nn.Sequential(nn.Linear(3, 4), nn.PReLU(4), nn.Linear(4, 2)),
                                  (3,)),
        "mlp-prelu-shared": (nn.Sequential(nn.Linear(3, 4), nn.PReLU(), nn.Linear(4, 2)), (3,)),
        "mlp-relu6": (nn.Sequential(nn.Linear(3, 4), nn.ReLU6(), nn.Linear(4, 2)), (3,)),
        "mlp-hardtanh": (nn.Sequential(nn.Linear(3, 4), nn.Hardtanh(-0.5, 2.0),
                                       nn.Linear(4, 2)), (3,)),
    }
    for model, _ in nets.values():
        zoo.randomise_(model, 5)
    return {k: (m.double().eval(), s) for k, (m, s) in nets.items()}


SCORED = _scored_nets()


@pytest.mark.parametrize("name", sorted(SCORED))
def test_path_magnitude_is_the_cost_of_pruning_each_coordinate(name):
    """Path-Mag(theta, i) = ||Phi(theta)||_1 - ||Phi(theta_{-i})||_1 (paper 002 eq. 11/14)
    for every scored coordinate, both norms by enumeration of the lowered DAG; PReLU slopes
    are scored (issue 21)."""
    model, shape = SCORED[name]
    l1 = NeuronDAG.from_module(model, shape).path_norm(1.0)
    scores = path_magnitude_scores(model, shape)
    params = dict(model.named_parameters())
    prelu = [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.PReLU)]
    assert set(prelu) <= set(scores.tensors), sorted(scores.tensors)
    for key in scores.tensors:
        score = scores.value(key)  # mantissa x 10^log10_scale
        assert score.shape == params[key].shape, key
        for i in range(score.numel()):
            zeroed = copy.deepcopy(model)
            with torch.no_grad():
                dict(zeroed.named_parameters())[key].view(-1)[i] = 0.0
            cost = l1 - NeuronDAG.from_module(zeroed, shape).path_norm(1.0)
            assert float(score.view(-1)[i]) == pytest.approx(cost, rel=1e-9, abs=1e-12 * l1), (
                key, i)
