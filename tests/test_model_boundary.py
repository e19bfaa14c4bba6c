"""Every public function that takes a model, on the models users bring: freshly pruned with
torch.nn.utils.prune (never run forward), wrapped in DistributedDataParallel (gloo, world
of 1) or compiled with torch.compile, and a network that calls one layer twice. The first
three must give what the plain model gives; tied weights must give the right answer or a
typed refusal, never a different function."""

from __future__ import annotations

import math
import socket
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nets import (
    SHAPE,
    TIED_SHAPE,
    ResidualCNN,
    dense_equivalent,
    pruned_copy,
    residual_cnn,
    tied_mlp,
)
from pathlift import bounds, lift, prune, quant, symmetry
from pathlift.errors import UnsupportedModelError
from pathlift.graph import check, trace, writable_copy
from pathlift.testing.neurons import NeuronDAG

X = torch.randn((4, *SHAPE), dtype=torch.float64, generator=torch.Generator().manual_seed(5))
LOADER = DataLoader(TensorDataset(X, torch.tensor([0, 1, 2, 0])), batch_size=2)


def _outputs(model: nn.Module, x: torch.Tensor = X) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(x).double()


def _other(model: nn.Module) -> nn.Module:
    """A second network of the architecture, with the same signs and smaller magnitudes."""
    other = ResidualCNN().double().eval()
    other.load_state_dict(dense_equivalent(writable_copy(model), ResidualCNN().double())
                          .state_dict())
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    return other


# name -> call(model) returning something made comparable by ``_summary``
CALLS: dict[str, Callable[[nn.Module], object]] = {
    "trace": lambda m: trace(m, SHAPE).d_out,
    "check": lambda m: check(m, SHAPE).ok,
    "path_norm": lambda m: lift.path_norm(m, SHAPE, q=2).log10,
    "path_norms": lambda m: [v.log10 for v in lift.path_norms(m, SHAPE).values()],
    "path_metric": lambda m: lift.path_metric(m, _other(m), SHAPE).lower_log10,
    "lipschitz_input": lambda m: bounds.lipschitz_input(m, SHAPE).log10,
    "lipschitz_params": lambda m: bounds.lipschitz_params(m, _other(m), SHAPE).log10,
    "local_affine": lambda m: lift.local_affine(m, SHAPE, X).coefficients(),
    "average_case_path_norm": lambda m: lift.average_case_path_norm(m, SHAPE, X).mean,
    "rescale": lambda m: _outputs(symmetry.rescale(m, {"a": 3.0}, SHAPE)),
    "random_rescale": lambda m: _outputs(symmetry.random_rescale(m, input_shape=SHAPE)),
    "adversarial_rescale": lambda m: _outputs(
        symmetry.adversarial_rescale(m, 0.3, input_shape=SHAPE)),
    "normalize": lambda m: _outputs(symmetry.normalize(m, SHAPE)),
    "canonicalize": lambda m: _outputs(symmetry.canonicalize(m, SHAPE).model),
    "permute": lambda m: _outputs(symmetry.permute(m, {"head": list(range(5, -1, -1))},
                                                   SHAPE)),
    "equivalent": lambda m: symmetry.equivalent(m, symmetry.random_rescale(m, seed=3,
                                                                           input_shape=SHAPE),
                                                SHAPE).equivalent,
    "conserved_quantities": lambda m: symmetry.conserved_quantities(m, SHAPE).values,
    "magnitude_prune": lambda m: _outputs(symmetry.magnitude_prune(m, 0.3, SHAPE)),
    "magnitude_scores": lambda m: _flat(prune.magnitude_scores(m, SHAPE)),
    "path_magnitude_scores": lambda m: _flat(prune.path_magnitude_scores(m, SHAPE)),
    "prune_model": lambda m: (prune.prune_model(m, SHAPE, 0.3).log10_path_metric,
                              _outputs(m)),
    "channel_path_magnitude": lambda m: (_flat(prune.channel_path_magnitude(m, SHAPE, 0.25)),
                                         _outputs(m)),
    "quantize": lambda m: _outputs(quant.quantize(m, SHAPE, bits=6).model),
    "symmetry_aware_quantize": lambda m: _outputs(
        bounds.symmetry_aware_quantize(m, SHAPE, 6).quantized.model),
    "certified_error": lambda m: bounds.certified_error(
        m, quant.quantize(m, SHAPE, bits=6), SHAPE).log10,
    "architecture_constants": lambda m: bounds.architecture_constants(m, SHAPE),
    "margins": lambda m: bounds.margins(m, LOADER),
    "NeuronDAG": lambda m: NeuronDAG.from_module(m, SHAPE).path_norm_log10(2.0),
}


def _flat(scores) -> torch.Tensor:
    return torch.cat([t.double().flatten() for t in scores.tensors.values()]) \
        * 10.0 ** scores.log10_scale


def _summary(value: object) -> list[float]:
    if isinstance(value, torch.Tensor):
        return value.double().flatten().tolist()
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _summary(v)]
    if isinstance(value, bool):
        return [float(value)]
    if isinstance(value, (int, float)):
        return [float(value)]
    return [float(v) for v in vars(value).values()]  # a dataclass of numbers


def _assert_same(got: object, want: object, rtol: float = 1e-9, atol: float = 1e-10) -> None:
    a, b = np.asarray(_summary(got)), np.asarray(_summary(want))
    assert a.shape == b.shape
    finite = np.isfinite(b)
    assert (np.isfinite(a) == finite).all() and (a[~finite] == b[~finite]).all()
    np.testing.assert_allclose(a[finite], b[finite], rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def process_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def _ddp(model: nn.Module) -> nn.Module:
    return nn.parallel.DistributedDataParallel(model)


@pytest.mark.parametrize("name", list(CALLS))
def test_wrapped_and_compiled_models_give_the_plain_result(name, process_group):
    call = CALLS[name]
    want = call(residual_cnn())
    for wrap in (_ddp, torch.compile):
        _assert_same(call(wrap(residual_cnn())), want)


@pytest.mark.parametrize("name", list(CALLS))
def test_a_freshly_pruned_model_gives_the_result_of_its_dense_equivalent(name):
    call = CALLS[name]
    pruned = pruned_copy(residual_cnn())
    dense = dense_equivalent(pruned, ResidualCNN().double())
    if name in ("conserved_quantities", "prune_model", "channel_path_magnitude"):
        # conserved quantities are of the stored (trained) tensors; in-place pruning adds
        # masks on top of the existing ones: compare the functions only
        got, want = call(pruned), call(pruned_copy(residual_cnn()))
    else:
        got, want = call(pruned), call(dense)
    _assert_same(got, want)


# a layer called twice: the right answer, or a typed refusal naming the layer
REFUSED = {"adversarial_rescale", "path_magnitude_scores", "prune_model",
           "channel_path_magnitude"}
FUNCTION_PRESERVING = {"rescale": lambda m: symmetry.rescale(m, {"inp": 2.0}, TIED_SHAPE),
                       "random_rescale": lambda m: symmetry.random_rescale(m, seed=1,
                                                                          input_shape=TIED_SHAPE),
                       "normalize": lambda m: symmetry.normalize(m, TIED_SHAPE),
                       "canonicalize": lambda m: symmetry.canonicalize(m, TIED_SHAPE).model}
TX = torch.randn((16, *TIED_SHAPE), dtype=torch.float64,
                 generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("name", sorted(FUNCTION_PRESERVING))
def test_tied_weights_keep_the_function_and_every_path_norm(name):
    model = tied_mlp()
    out = FUNCTION_PRESERVING[name](model)
    torch.testing.assert_close(_outputs(out, TX), _outputs(model, TX), rtol=1e-10, atol=1e-10)
    dag = NeuronDAG.from_module(model, TIED_SHAPE)
    for q in (1.0, 2.0):
        assert lift.path_norm(out, TIED_SHAPE, q).log10 == pytest.approx(
            dag.path_norm_log10(q), abs=1e-10)


def test_tied_weights_are_rescaled_with_one_factor_per_shared_neuron():
    """The shared layer reads its own outputs: its neurons and those of ``inp`` are tied,
    so a factor given to ``inp`` moves ``shared``'s rows and columns alike."""
    model = tied_mlp()
    out = symmetry.rescale(model, {"inp": torch.arange(1.0, 7.0)}, TIED_SHAPE)
    lam = torch.arange(1.0, 7.0, dtype=torch.float64)
    torch.testing.assert_close(out.shared.weight, model.shared.weight * lam[:, None] / lam)
    with pytest.raises(Exception, match="tied"):
        symmetry.rescale(model, {"inp": 2.0, "shared": 3.0}, TIED_SHAPE)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_tied_weights_are_refused_where_the_theory_needs_single_coordinates(name):
    calls = {"adversarial_rescale": lambda m: symmetry.adversarial_rescale(
                 m, input_shape=TIED_SHAPE),
             "path_magnitude_scores": lambda m: prune.path_magnitude_scores(m, TIED_SHAPE),
             "prune_model": lambda m: prune.prune_model(m, TIED_SHAPE, 0.3),
             "channel_path_magnitude": lambda m: prune.channel_path_magnitude(
                 m, TIED_SHAPE, 0.3)}
    with pytest.raises(UnsupportedModelError, match="shared") as info:
        calls[name](tied_mlp())
    assert "called several times" in str(info.value)


def test_tied_weights_path_norms_quantisation_and_metric_are_exact():
    model = tied_mlp()
    dag = NeuronDAG.from_module(model, TIED_SHAPE)
    for q in (0.5, 1.0, 4.0):
        assert lift.path_norm(model, TIED_SHAPE, q).log10 == pytest.approx(
            dag.path_norm_log10(q), abs=1e-10)
    quantized = quant.quantize(model, TIED_SHAPE, bits=4).model
    d = bounds.certified_error(model, quantized, TIED_SHAPE)
    enumerated = lift.path_metric.__globals__["enumerated_path_metric"](
        model, quantized, TIED_SHAPE)
    assert d.exact and d.value == pytest.approx(enumerated, rel=1e-9)
    worst = float((_outputs(model, TX) - _outputs(quantized, TX)).abs().sum(1).max())
    assert worst <= float(d.bound(TX).max()) * (1 + 1e-9)
    assert not math.isnan(lift.layer_norm_product(model, TIED_SHAPE).log10)


@pytest.mark.parametrize("wrap", ["weight_norm", "spectral_norm", "orthogonal"])
def test_a_parametrized_model_traces_and_gives_its_plain_weights_result(wrap):
    """torch.nn.utils.parametrize refuses pickling, which copy.copy went through."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3)).double().eval()
    getattr(nn.utils.parametrizations, wrap)(model[0])
    plain = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    with torch.no_grad():
        plain[0].weight.copy_(model[0].weight)
        plain[0].bias.copy_(model[0].bias)
        plain[2].load_state_dict(model[2].state_dict())
    got, want = lift.path_norm(model, (6,), q=2), lift.path_norm(plain, (6,), q=2)
    assert got.log10 == pytest.approx(want.log10, rel=1e-12)
    assert trace(model, (6,)).d_out == 3


def test_tensors_without_values_are_refused_in_one_line_never_read():
    """A parameter on the meta device, one whose memory was freed (what FSDP1 leaves
    outside forward), also after its graph was traced: a typed error naming the tensor,
    before any pass reads it (reading freed memory segfaulted)."""
    from pathlift.errors import InvalidParameterError

    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))

    with torch.device("meta"):
        meta = build()
    with pytest.raises(InvalidParameterError, match=r"^'0.weight' \(Linear\) is on the meta"):
        lift.path_norm(meta, (6,))
    freed = build()
    freed[2].bias.data.untyped_storage().resize_(0)
    with pytest.raises(InvalidParameterError, match=r"^'2.bias' \(Linear\) has no memory"):
        lift.path_norm(freed, (6,))
    model = build()
    graph = trace(model, (6,))  # traced while the values were there
    assert lift.path_norm(graph).log10 == lift.path_norm(build(), (6,)).log10
    model[0].weight.data.untyped_storage().resize_(0)
    with pytest.raises(InvalidParameterError, match=r"'0.weight' \(Linear\) has no memory"):
        lift.path_norm(graph)
def _parametrized() -> ResidualCNN:
    """``residual_cnn()`` with weight_norm on two convs and spectral_norm on a Linear."""
    from torch.nn.utils.parametrizations import spectral_norm, weight_norm

    model = residual_cnn()
    weight_norm(model.stem)
    weight_norm(model.a, dim=None)
    spectral_norm(model.head)
    return model.eval()


def _effective(model: ResidualCNN) -> ResidualCNN:
    """A plain ResidualCNN holding the weights the parametrized one computes with."""
    plain = ResidualCNN().double().eval()
    plain.load_state_dict({**residual_cnn().state_dict(),
                           **{f"{name}.weight": getattr(model, name).weight.detach()
                              for name in ("stem", "a", "head")}})
    return plain


# functions that need the stored tensors themselves (the coordinates gradient flow or
# torch.nn.utils.prune act on): a typed refusal naming the parametrization
PARAMETRIZED_REFUSED = {"conserved_quantities", "prune_model", "channel_path_magnitude"}


@pytest.mark.parametrize("name", list(CALLS))
def test_parametrized_models_give_the_result_of_their_effective_weights(name):
    """weight_norm / spectral_norm (torch.nn.utils.parametrize) models: the numbers of the
    plain model holding the same effective weights (float64, 1e-12), the model untouched
    (spectral_norm's power-iteration vectors included); functions that write weights
    return plain copies."""
    model = _parametrized()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    if name in PARAMETRIZED_REFUSED:
        with pytest.raises(UnsupportedModelError, match="parametriz"):
            CALLS[name](model)
    else:
        _assert_same(CALLS[name](model), CALLS[name](_effective(_parametrized())),
                     rtol=1e-12, atol=1e-12)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert type(model.stem).__name__ == "ParametrizedConv2d"  # still parametrized


def test_meta_clone_copies_parametrized_modules():
    """weight_norm / spectral_norm modules refuse copy.copy (torch's __reduce__); the meta
    clone copies them shallowly, so tracing and the |theta|^q pass run on them."""
    model = _parametrized()
    for q in (1.0, 2.0):
        assert lift.path_norm(model, SHAPE, q).log10 == pytest.approx(
            NeuronDAG.from_module(_effective(model), SHAPE).path_norm_log10(q), abs=1e-12)


def test_a_writable_copy_of_a_parametrized_model_leaves_the_model_parametrized():
    """torch's remove_parametrizations deletes the property from the class a deep copy
    shares with the original: writable_copy must not, and its copy is plain."""
    model = _parametrized()
    copy = writable_copy(model)
    assert type(copy.stem) is nn.Conv2d and "stem.weight" in dict(copy.named_parameters())
    torch.testing.assert_close(_outputs(copy), _outputs(model), rtol=0, atol=0)
    torch.testing.assert_close(model.stem.weight, copy.stem.weight, rtol=0, atol=0)
    assert lift.path_norm(model, SHAPE).log10 == lift.path_norm(copy, SHAPE).log10
