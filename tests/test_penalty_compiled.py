"""The training step's passes recorded once and replayed (pathlift.lift.tape,
pathlift.lift.replay): the replayed ln ||Phi||_q, its gradient and Path-SGD's gamma equal
the walked pass (a LayerGraph is walked at every call) to 1e-12 in float64 after
parameter updates, on user-style networks; the tape is replayed (the same object) while
nothing structural changes, and recorded anew when a parameter is replaced, pruned,
parametrized, rescaled in place by large factors, moved to another dtype, or a module is
swapped."""

from __future__ import annotations

import copy
import gc
import math
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize, prune

from nets import residual_cnn, step_
from pathlift.errors import InvalidParameterError, PrecisionError, UnsupportedModelError
from pathlift.graph import eval_mode, graph_of
from pathlift.lift import path_norm
from pathlift.lift.chain import Chain
from pathlift.lift.differentiable import differentiable_path_norm, magnitude_gradients
from pathlift.lift.replay import _PLANS
from pathlift.models import mlp, small_cnn
from pathlift.symmetry import random_rescale
from pathlift.track import PathNormTracker
from pathlift.train import PathNormPenalty, PathSGD
from user_zoo import bn_cnn, densenet_bc, logits_and_features, randomise_batchnorm_


class AvgPoolNet(nn.Module):
    """Functional style: F.relu, F.avg_pool2d, a skip connection and a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.mix = nn.Conv2d(4, 4, 1)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        h = F.relu(self.conv(x))
        h = F.avg_pool2d(h + F.relu(self.mix(h)), 2)
        return {"logits": self.fc(h.flatten(1))}


def _mlp() -> nn.Module:
    return mlp(64, (16, 8), 5)


def _bn_cnn() -> nn.Module:
    return randomise_batchnorm_(bn_cnn())


def _logits_and_features() -> nn.Module:
    return randomise_batchnorm_(logits_and_features())


NETS = {"mlp": (_mlp, (1, 8, 8)), "small_cnn (max-pool)": (small_cnn, (1, 8, 8)),
        "bn_cnn (BatchNorm eval)": (_bn_cnn, (3, 8, 8)),
        "residual_cnn": (residual_cnn, (2, 4, 4)), "avg-pool, dict output": (AvgPoolNet, (1, 8, 8)),
        "two outputs": (_logits_and_features, (3, 8, 8)),
        "concat (DenseNet-BC)": (lambda: randomise_batchnorm_(densenet_bc()), (3, 8, 8))}


def _model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    build, shape = NETS[name]
    return build().double().eval(), shape


def _value_and_grads(model: nn.Module, measure, q: float = 1.0) -> tuple[float, list]:
    """ln ||Phi||_q by ``measure`` and its gradient in every parameter."""
    model.zero_grad(set_to_none=True)
    ln = measure(q)
    ln.backward()
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    return float(ln.detach()), grads


def _assert_same(replayed: tuple[float, list], walked: tuple[float, list]) -> None:
    assert replayed[0] == pytest.approx(walked[0], rel=1e-12, abs=1e-12)
    for got, want in zip(replayed[1], walked[1], strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            scale = max(float(want.abs().max()), 1e-300)
            assert float((got - want).abs().max()) <= 1e-12 * scale


def _check(model: nn.Module, shape: tuple[int, ...], q: float = 1.0) -> None:
    """The replayed penalty against the walked one (a LayerGraph is walked each call)."""
    graph = graph_of(model, shape, as_eval=True)
    _assert_same(_value_and_grads(model, lambda q: differentiable_path_norm(model, shape, q), q),
                 _value_and_grads(model, lambda q: differentiable_path_norm(graph, q=q), q))


def _tapes(model: nn.Module) -> list:
    return [tape for _, tape, _ in _PLANS.get(model, {}).values()]


@pytest.mark.parametrize("name", list(NETS))
@pytest.mark.parametrize("q", [1.0, 2.0, 3.5])
def test_the_replayed_penalty_and_gradient_equal_the_walked_ones(name: str, q: float) -> None:
    model, shape = _model(name)
    _check(model, shape, q)  # recorded
    tapes = _tapes(model)
    assert len(tapes) == 1 and tapes[0] is not None
    for seed in range(3):  # replayed on updated parameters
        step_(model, seed)
        _check(model, shape, q)
    assert _tapes(model) == tapes  # the same tape all along: replayed, not recorded
    expected = path_norm(model, shape, q=q).log10 * math.log(10)
    assert float(differentiable_path_norm(model, shape, q)) == pytest.approx(expected,
                                                                             rel=1e-12)


def test_a_concat_of_one_tensor_replays() -> None:
    """DenseNet-BC's first dense layer concatenates a list of one tensor along dim 1
    (``torch.cat([x], 1)``, an fx immutable_list): the replay passes the list, not the
    tensor (it raised a TypeError at the second call), and equals the walked pass."""
    torch.manual_seed(0)
    model, shape = randomise_batchnorm_(densenet_bc()).double().eval(), (3, 16, 16)
    for seed in range(3):
        _check(model, shape)
        step_(model, seed)
    assert len(_tapes(model)) == 1


@pytest.mark.parametrize("name", ["mlp", "residual_cnn", "bn_cnn (BatchNorm eval)"])
def test_replayed_path_sgd_scales_equal_the_walked_ones(name: str) -> None:
    model, shape = _model(name)
    graph = graph_of(model, shape, as_eval=True)
    for seed in range(3):
        replayed = magnitude_gradients(model, shape, 2.0)
        walked = magnitude_gradients(graph, q=2.0)
        assert replayed.mantissas.keys() == walked.mantissas.keys()
        for p, gamma in walked.mantissas.items():  # the same numbers, perhaps at other scales
            torch.testing.assert_close(replayed.mantissas[p] * math.exp(replayed.log_scale),
                                       gamma * math.exp(walked.log_scale), rtol=1e-12, atol=0)
        step_(model, seed)
    assert len(_tapes(model)) == 1


def _recorded_anew(model: nn.Module, shape: tuple[int, ...], change) -> None:
    """After ``change(model)`` the penalty is recorded anew and equals the walked one (new
    values alone, as a rescaling, keep a compiled chain: it holds no scale of the walk)."""
    _check(model, shape)
    before = _tapes(model)
    plans = [plan for _, _, plan in _PLANS[model].values()]
    change(model)
    _check(model, shape)
    if change is _rescale_in_place and all(isinstance(p, Chain) for p in plans):
        assert [plan for _, _, plan in _PLANS[model].values()] == plans
        return
    assert all(a is not b for a, b in zip(_tapes(model), before, strict=True))


def _replace_weight(model: nn.Module) -> None:
    layer = next(m for m in model.modules() if isinstance(m, nn.Linear))
    layer.weight = nn.Parameter(torch.randn_like(layer.weight))


def _prune(model: nn.Module) -> None:
    layer = next(m for m in model.modules() if isinstance(m, nn.Linear))
    prune.l1_unstructured(layer, "weight", amount=0.5)


class _Double(nn.Module):
    def forward(self, w):
        return 2 * w


def _parametrize(model: nn.Module) -> None:
    layer = next(m for m in model.modules() if isinstance(m, nn.Linear))
    parametrize.register_parametrization(layer, "weight", _Double())


def _rescale_in_place(model: nn.Module) -> None:
    """A rescaling by factors up to 2^40 (Phi unchanged), written into the parameters."""
    with torch.no_grad():
        rescaled = random_rescale(model, factors=(2.0 ** -40, 1.0, 2.0 ** 40), seed=1)
        for p, new in zip(model.parameters(), rescaled.parameters(), strict=True):
            p.copy_(new)


def _swap_activation(model: nn.Module) -> None:
    model[2] = nn.Identity()


def _set_start_dim(model: nn.Module) -> None:
    model[0].start_dim = -3  # the same flattening of a (1, 8, 8) input, another value


def _hook(model: nn.Module) -> None:
    model[1].register_forward_hook(lambda module, args, out: None)


@pytest.mark.parametrize("change", [_replace_weight, _prune, _parametrize, _rescale_in_place,
                                    _swap_activation, lambda m: m.float(), _set_start_dim,
                                    _hook],
                         ids=["replaced", "pruned", "parametrized", "rescaled in place",
                              "module swapped", "dtype", "plain attribute", "forward hook"])
def test_the_penalty_is_recorded_anew_when_the_model_changes(change) -> None:
    model, shape = _model("mlp")
    _recorded_anew(model, shape, change)


def test_a_plain_attribute_holding_nan_keeps_the_tape() -> None:
    """The structure check compares a module's plain attributes as they were: a NaN that
    stays the same object is unchanged (NaN != NaN must not record the pass at every
    call); deleting it records the pass anew."""
    torch.manual_seed(0)
    model, shape = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).double(), (1, 4, 4)
    model.note = math.nan  # the Sequential's one plain attribute
    differentiable_path_norm(model, shape)
    tapes = _tapes(model)
    _check(model, shape)
    assert _tapes(model) == tapes
    del model.note
    _check(model, shape)
    assert _tapes(model)[0] is not tapes[0]


def test_a_rescaling_keeps_the_replayed_penalty_and_a_replaced_copy_gets_its_own() -> None:
    model, shape = _model("residual_cnn")
    before = float(differentiable_path_norm(model, shape))
    rescaled = random_rescale(model, seed=3, input_shape=shape)  # new parameters (replacement)
    _check(rescaled, shape)
    assert float(differentiable_path_norm(rescaled, shape)) == pytest.approx(before, rel=1e-12)
    with torch.no_grad():  # the same rescaling written in place: replayed or recorded
        for p, new in zip(model.parameters(), rescaled.parameters(), strict=True):
            p.copy_(new)
        for b, new in zip(model.buffers(), rescaled.buffers(), strict=True):
            b.copy_(new)
    _check(model, shape)
    assert float(differentiable_path_norm(model, shape)) == pytest.approx(before, rel=1e-12)


def test_no_grad_gives_a_plain_number_and_keeps_the_tape() -> None:
    model, shape = _model("mlp")
    with_grad = differentiable_path_norm(model, shape)
    tapes = _tapes(model)
    with torch.no_grad():
        plain = differentiable_path_norm(model, shape)
    assert not plain.requires_grad and float(plain) == float(with_grad)
    assert _tapes(model) == tapes and all(p.grad is None for p in model.parameters())


def test_a_float32_rescaling_beyond_the_recorded_scales_is_recorded_anew_and_exact() -> None:
    """Every neuron of the first hidden layer rescaled by 2^70 in place (Def. 2.4.1: Phi
    unchanged): its |W|^2 reaches 2^140, beyond float32, which the walk takes in units
    and a replay with the recorded units would give as inf; the peaks' drift records the
    pass anew."""
    torch.manual_seed(0)
    model, shape = _mlp().eval(), (1, 8, 8)
    exact = path_norm(model, shape, q=2.0).log10 * math.log(10)
    assert float(differentiable_path_norm(model, shape, 2.0)) == pytest.approx(exact, rel=1e-5)
    first, second = [m for m in model.modules() if isinstance(m, nn.Linear)][:2]
    with torch.no_grad():
        first.weight.mul_(2.0 ** 70)
        first.bias.mul_(2.0 ** 70)
        second.weight.mul_(2.0 ** -70)
    assert float(differentiable_path_norm(model, shape, 2.0)) == pytest.approx(exact, rel=1e-5)


def _path_sgd_follows_the_walked_formula(model: nn.Module, twin: nn.Module,
                                         shape: tuple[int, ...], steps: int,
                                         momentum: float = 0.0, check=None) -> None:
    """``steps`` PathSGD steps on ``model`` against p <- p - lr * buf, buf <- momentum * buf
    + grad / gamma (0 where gamma = 0), gamma from the walked pass (a LayerGraph) on
    ``twin``, a model with the same weights; ``check(gammas)`` after each walked pass."""
    graph = graph_of(twin, shape, as_eval=True)
    x, y = torch.randn(4, *shape, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    opt, lr, buffers = PathSGD(model, shape, lr=1e-3, momentum=momentum), 1e-3, {}
    for _ in range(steps):
        for net in (model, twin):
            net.zero_grad()
            F.cross_entropy(net(x), y).backward()
        opt.step()
        gammas = magnitude_gradients(graph, q=2.0)
        if check is not None:
            check(gammas)
        with torch.no_grad():
            for p in twin.parameters():
                gamma = gammas.mantissas[p] * math.exp(gammas.log_scale)
                step = torch.where(gamma > 0, p.grad / gamma, 0.0)
                buffers[p] = step if p not in buffers else momentum * buffers[p] + step
                p.sub_(lr * buffers[p])
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_path_sgd_steps_with_replayed_scales_follow_the_walked_formula(momentum: float) -> None:
    """Three PathSGD steps against the walked formula on a copy of the model."""
    model, shape = _model("residual_cnn")
    _path_sgd_follows_the_walked_formula(model, copy.deepcopy(model), shape, 3, momentum)


def test_the_tracker_replays_its_passes_and_equals_path_norm() -> None:
    """The tracker's path-norms (q = 1, 2 replayed; q = 8 by path_norm's normalised pass)
    against path_norm on a BatchNorm network in train mode, measured as in eval mode,
    along updates; one tape for the replayed passes, kept."""
    torch.manual_seed(0)
    model, shape = _bn_cnn().double().train(), (3, 8, 8)
    tracker, tapes = PathNormTracker(shape, qs=(1.0, 2.0, 8.0), sparsity=False), None
    for seed in range(3):
        row = tracker(model, seed)
        with eval_mode(model):
            for q in (1.0, 2.0, 8.0):
                assert row[f"path_norm_log10_q{q:g}"] == pytest.approx(
                    path_norm(model, shape, q=q).log10, rel=1e-12, abs=1e-12)
        tapes = tapes or _tapes(model)
        step_(model, seed)
    assert len(tapes) == 1 and _tapes(model) == tapes and model.training


# ---- the penalty, Path-SGD and the tracker refuse what path_norm refuses
def _bn_train() -> nn.Module:
    return _bn_cnn().double().train()


def _dropout_train() -> nn.Module:
    return nn.Sequential(_mlp(), nn.Dropout(0.5)).double().train()


def _nan_weight() -> nn.Module:
    model = _mlp().double()
    with torch.no_grad():
        model[3].weight[0, 0] = math.nan
    return model


def _inf_bias() -> nn.Module:
    model = _mlp().double()
    with torch.no_grad():
        model[1].bias[2] = math.inf
    return model


REFUSED = {"BatchNorm in training mode": (_bn_train, (3, 8, 8)),
           "Dropout in training mode": (_dropout_train, (1, 8, 8)),
           "NaN weight": (_nan_weight, (1, 8, 8)), "inf bias": (_inf_bias, (1, 8, 8))}


def _path_sgd_step(model: nn.Module, shape: tuple[int, ...]) -> None:
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    PathSGD(model, shape, lr=1e-3).step()


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("use", [
    lambda m, s: differentiable_path_norm(m, s), lambda m, s: PathNormPenalty(s, 2.0)(m),
    lambda m, s: magnitude_gradients(m, s), _path_sgd_step],
    ids=["differentiable_path_norm", "PathNormPenalty", "magnitude_gradients", "PathSGD"])
def test_what_path_norm_refuses_the_penalty_and_path_sgd_refuse_alike(case: str, use) -> None:
    torch.manual_seed(0)
    build, shape = REFUSED[case]
    model = build()
    with pytest.raises(UnsupportedModelError) as expected:
        path_norm(model, shape)
    with pytest.raises(UnsupportedModelError) as refused:
        use(model, shape)
    assert str(refused.value) == str(expected.value)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_nan_written_after_recording_is_refused_by_the_replay(value: float) -> None:
    model, shape = _model("mlp")
    differentiable_path_norm(model, shape)
    tracker = PathNormTracker(shape, sparsity=False)
    tracker(model)
    with torch.no_grad():
        model[3].weight[1, 2] = value
    with pytest.raises(UnsupportedModelError) as expected:
        path_norm(model, shape)
    for use in (lambda: differentiable_path_norm(model, shape), lambda: tracker(model)):
        with pytest.raises(UnsupportedModelError) as refused:
            use()
        assert str(refused.value) == str(expected.value)


def test_an_underflowing_penalty_is_a_precision_error_and_a_zero_network_is_minus_inf() -> None:
    """Weights spanning 2^160 within layers: |w|^2 spans 2^320, beyond float32; path_norm
    is finite (its normalised pass), the differentiable pass would say ||Phi|| = 0."""
    torch.manual_seed(0)
    model, shape = _mlp().eval(), (1, 8, 8)
    rescaled = random_rescale(model, factors=(2.0 ** -40, 2.0 ** 40), seed=2)
    assert math.isfinite(path_norm(rescaled, shape, q=2.0).log10)
    with pytest.raises(PrecisionError):
        differentiable_path_norm(rescaled, shape, 2.0)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert path_norm(model, shape).log10 == -math.inf
    assert float(differentiable_path_norm(model, shape)) == -math.inf


def test_the_tracker_measures_a_training_model_as_in_eval_mode_and_path_norm_refuses_it() -> None:
    """The tracker's contract: BatchNorm in training mode is measured as its affine map
    (flags flipped and restored around the whole row); path_norm of the same model as it
    is refuses it, and inside eval_mode equals the tracker."""
    model, shape = _bn_train(), (3, 8, 8)
    row = PathNormTracker(shape, sparsity=False, qs=(1.0,))(model)
    with pytest.raises(UnsupportedModelError):
        path_norm(model, shape)
    with eval_mode(model):
        assert row["path_norm_log10_q1"] == pytest.approx(path_norm(model, shape).log10,
                                                          rel=1e-12)
    assert model.training


def test_the_recorded_passes_do_not_keep_a_model_alive() -> None:
    """The cache of tapes is weak in the model: after the penalty, a Path-SGD step and a
    tracker call, deleting the model frees it."""
    model, shape = _model("bn_cnn (BatchNorm eval)")
    differentiable_path_norm(model, shape)
    _path_sgd_step(model, shape)
    PathNormTracker(shape, sparsity=False)(model)
    assert len(_tapes(model)) == 3
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


def test_path_sgd_on_a_pruned_network_with_a_dead_neuron_follows_the_walked_formula() -> None:
    """A pruned layer (weight_orig and its mask) and a dead hidden neuron (no incoming
    weight, no bias: its outgoing weights have gamma = 0 and grad = 0): two steps of the
    foreach update against grad / gamma (0 where gamma = 0) from the walked pass."""
    def pruned() -> tuple[nn.Module, tuple[int, ...]]:
        model, shape = _model("mlp")  # the same seed: the same weights
        prune.l1_unstructured(model[1], "weight", 0.5)
        with torch.no_grad():
            model[1].weight_orig[0] = 0.0
            model[1].bias[0] = 0.0
        return model, shape

    (model, shape), (twin, _) = pruned(), pruned()

    def dead(gammas) -> None:
        assert bool((gammas.mantissas[twin[3].weight][:, 0] == 0).all())

    _path_sgd_follows_the_walked_formula(model, twin, shape, 2, check=dead)


class _Unused(nn.Module):
    """An MLP with a parameter its forward never reads."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()
        self.extra = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.net(x)


def test_path_sgd_refuses_a_parameter_outside_the_network_and_moves_nothing() -> None:
    torch.manual_seed(0)
    model = _Unused().double()
    shape = (1, 8, 8)
    opt = PathSGD(model, shape, lr=1e-3)
    F.cross_entropy(model(torch.randn(4, *shape, dtype=torch.float64)),
                    torch.tensor([0, 1, 2, 0])).backward()
    model.extra.grad = torch.ones(3, dtype=torch.float64)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InvalidParameterError, match="shape \\(3,\\)"):
        opt.step()
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)
