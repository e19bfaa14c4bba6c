"""The |theta|^q pass of Thm 3.1.1 inside autograd: differentiable path-norms and the
per-parameter scales of Path-SGD.

``AbsPowInterpreter`` reads every parameter detached, so that measuring never disturbs a
training step. ``LivePass`` substitutes, through the pass's two hooks (``weight_part`` and
``bias_magnitude``), |W|^q and |b|^q computed from the model's own parameters (honouring
torch.nn.utils.prune masks; eval BatchNorm folded with its running statistics as
constants), so the outputs o_v = ||Phi^{->v}||_q^q carry the autograd graph of the
parameters, and nothing else about them changes (no flag, no ``.grad``). Log scales are
constants of the pass, so ln o_v = ln mantissa + scale is differentiable and exact far
beyond float64. With ``leaves=True`` the pass instead takes fresh leaves A = |W|^q (one
per layer) and ``magnitude_gradients`` maps dM/dA back to the parameters.

Both passes are recorded once per model, input shape and setting as plain tensor code
and replayed at each training step without walking the graph, the gradients of the
leaves' pass by its transpose without autograd (``pathlift.lift.transpose``) where it
covers the pass (``pathlift.lift.replay``:
a parameter replaced, pruned or parametrized, a dtype, device or sharding changed, a
module swapped or flipped, or peaks that drift out of the recorded scales record them
again; sharded (FSDP2) and FSDP1 models are walked at each call).

This module is the only one of ``pathlift.train`` that talks to the graph engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError, PrecisionError, Problem, UnsupportedModelError
from pathlift.exponents import check_q, check_r
from pathlift.graph import AbsPowInterpreter, LayerGraph, graph_of
from pathlift.graph.abs_pow import AbsPowLayer, output_logs, output_sum
from pathlift.graph.boundary import is_fsdp1
from pathlift.graph.ops import Call
from pathlift.graph.sharded import ShardedWalker, is_sharded_graph
from pathlift.lift.path_norm import COUNTING_Q, check_finite, log_outputs, log_r_norm
from pathlift.lift.replay import recorded_chain, replayed, replayed_gradients

__all__ = ["LivePass", "MagnitudeGradients", "ShardedLivePass", "differentiable_path_norm",
           "magnitude_gradients", "path_norm_backward"]


@runtime_checkable
class LiveLayer(AbsPowLayer, Protocol):
    """What the differentiable pass asks of a layer beyond the |theta|^q pass's: its
    magnitudes in autograd, its map with them, and the gradients per stored parameter.
    ``AffineHandler`` implements it (BatchNorm and KSLinear their own way)."""

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor: ...

    def live_magnitudes(self, module: nn.Module, q: float, dtype: torch.dtype,
                        units: tuple[float, float] = (1.0, 1.0)
                        ) -> tuple[Tensor, Tensor | None]: ...

    def magnitude_gradients(self, module: nn.Module, weight: Tensor, bias: Tensor | None,
                            q: float) -> list[tuple[str, Tensor | None]]: ...


class LivePass(AbsPowInterpreter):
    """The |theta|^q network (Thm 3.1.1) whose |W|^q and |b|^q are computed from the live
    parameters (``leaves=False``: the outputs are differentiable in them) or are fresh
    autograd leaves, one pair per layer, kept in ``leaves`` (``leaves=True``).

    Each layer enters in its units (``AffineHandler.units``, powers of two, constants of
    the pass like its log scales): |W/u|^q and |b/v|^q, u^q and v^q carried in log space.
    The leaves are those scaled magnitudes; ``units`` keeps (u, v) per layer."""

    def __init__(self, graph: LayerGraph, q: float, dtype: torch.dtype, leaves: bool = False):
        super().__init__(graph, q, dtype)
        self.make_leaves = leaves
        self.leaves: dict[str, tuple[Tensor, Tensor | None]] = {}
        self.handlers: dict[str, LiveLayer] = {}
        self.layer_units: dict[str, tuple[float, float]] = {}
        self._current: tuple[str, tuple[Tensor, Tensor | None]] | None = None

    def _magnitudes(self, handler: LiveLayer, call: Call) -> tuple[Tensor, Tensor | None]:
        """|W/u|^q, |b/v|^q of the layer of ``call`` (computed once per call of the layer;
        with leaves, once per layer)."""
        if self._current is not None and self._current[0] == call.node.name:
            return self._current[1]
        name = _layer_name(call)
        if self.make_leaves and name in self.leaves:
            pair = self.leaves[name]
        else:
            units = self.layer_units[name] = self.module_units(handler, call.module)
            pair = handler.live_magnitudes(call.module, self.q, self.dtype, units)
            if self.make_leaves:
                pair = (pair[0].detach().requires_grad_(),
                        None if pair[1] is None else pair[1].detach().requires_grad_())
                self.leaves[name], self.handlers[name] = pair, handler
        self._current = (call.node.name, pair)
        return pair

    def units(self, handler: LiveLayer, call: Call) -> tuple[float, float]:
        self._magnitudes(handler, call)
        return self.layer_units[_layer_name(call)]

    def weight_part(self, handler: LiveLayer, x: Tensor, call: Call,
                    bias: Tensor | None = None, unit: float = 1.0) -> Tensor:
        return handler.apply(x, self._magnitudes(handler, call)[0], call, bias)

    def bias_magnitude(self, handler: LiveLayer, call: Call, unit: float = 1.0
                       ) -> Tensor | None:
        return self._magnitudes(handler, call)[1]


class ShardedLivePass(ShardedWalker, LivePass):
    """``LivePass`` over a model with sharded layers (FSDP2): each rank's |W|^q is that of
    its local rows (``pathlift.graph.sharded``), so ``backward`` puts the gradient of
    every shard, exact, in its DTensor parameter's ``.grad``, where FSDP2 adds the
    reduce-scattered gradient of the rest of the loss. A sharded layer's units are those
    of the whole layer (its peaks all-reduced), the same on every rank."""


def _layer_name(call: Call) -> str:
    return call.node.target if isinstance(call.node.target, str) else call.node.name


def _graph(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None) -> LayerGraph:
    """The traced graph, validated as ``path_norm`` validates it (a module computing
    otherwise in training mode, BatchNorm or Dropout, is refused: measure inside
    ``pathlift.graph.eval_mode``), refusing also ops whose own parameters the pass would
    read as constants (PReLU's slopes): their gradient would silently be missing. The
    refusal depends on the graph alone: found once per graph."""
    if isinstance(model, nn.Module) and is_fsdp1(model) and torch.is_grad_enabled():
        raise UnsupportedModelError(
            "a differentiable path-norm of a FullyShardedDataParallel (FSDP1) model would "
            "differentiate the views that summon_full_params frees when it ends; shard the "
            "model with torch.distributed.fsdp.fully_shard (FSDP2), whose penalty pathlift "
            "differentiates on every rank")
    graph = graph_of(model, input_shape)
    frozen = graph.derived.get(_FROZEN)
    if frozen is None:
        frozen = graph.derived[_FROZEN] = [
            Problem(str(n.target), type(graph.submodule(n)).__name__,
                    "its parameters enter the |theta|^q pass as constants; differentiable "
                    "path-norms and Path-SGD cover Linear, Conv and BatchNorm parameters")
            for n in graph.nodes()
            if graph.handler(n).parametric and not graph.handler(n).live
            and any(True for _ in graph.submodule(n).parameters(recurse=False))]
    if frozen:
        raise UnsupportedModelError(frozen)
    return graph


_FROZEN = "differentiable.frozen"


def _log_norm(out: object, q: float, r: float) -> Tensor:
    """ln ||(o_v^{1/q})_v||_r from the outputs o_v of the pass, in the autograd graph."""
    if r == q:  # (1/q) ln sum_v o_v: one sum of the aligned mantissas, one log
        total, top = output_sum(out)
        ln = total.log() + top if top else total.log()
        return ln if q == 1 else ln / q
    return log_r_norm(output_logs(out) / q, r)


def differentiable_path_norm(model: nn.Module | LayerGraph,
                             input_shape: Sequence[int] | None = None, q: float = 1.0,
                             r: float | None = None, dtype: torch.dtype | None = None
                             ) -> Tensor:
    """ln ||Phi(theta)||_{q,r} as a 0-dim tensor in the autograd graph of the model's
    parameters: one |theta|^q pass (thesis Thm 3.1.1) through autograd, in log space.

    Args:
        model: a supported ReLU network (or its ``LayerGraph``), validated as
            ``path_norm`` validates it: BatchNorm or Dropout in training mode is refused
            (penalise inside ``with pathlift.graph.eval_mode(model):`` to measure BatchNorm
            as its affine map with running statistics, Def. 2.2.2).
        input_shape: input size without the batch dimension.
        q: in [1, inf) (|w|^q is not differentiable at 0 for q < 1).
        r: the outer exponent in (0, inf]; None takes r = q (the plain ||Phi||_q).
        dtype: mantissa precision (default: the model's dtype).

    Returns:
        ln ||Phi||_{q,r} (natural log; exp() of it is the norm while it fits a float).
        ``backward()`` on it accumulates d ln||Phi|| / d theta into the parameters'
        ``.grad``; nothing else of the model changes. Under ``torch.no_grad()`` it is a
        plain number. ``path_norm_backward`` adds the same gradient to ``.grad`` without
        an autograd graph (a training step's cheaper route on an MLP).

    Raises:
        InvalidParameterError for q outside [1, inf) or r <= 0; UnsupportedModelError
        (layers holding NaN/inf, modules in training mode...) and ShapeError as
        ``path_norm``; PrecisionError when the pass underflows the dtype.

    Example::

        loss = F.cross_entropy(model(x), y) + 1e-3 * differentiable_path_norm(model, (1, 8, 8))
        loss.backward()
    """
    check_q(q, minimum=1.0, what=" for a differentiable path-norm")
    r = q if r is None else check_r(r)

    def record(graph: LayerGraph) -> Tensor:
        walker = ShardedLivePass if is_sharded_graph(graph) else LivePass
        return _log_norm(walker(graph, q, dtype or graph.dtype).run_all_ones(), q, r)

    ln = replayed(model, input_shape, ("norm", q, r, dtype), record, _graph)
    value = ln.item()
    if not math.isfinite(value):
        _refuse_non_finite(_graph(model, input_shape), value, q, dtype)
    return ln if torch.is_grad_enabled() else ln.detach()


def path_norm_backward(model: nn.Module, input_shape: Sequence[int], weight: float | Tensor = 1.0,
                       q: float = 1.0, r: float | None = None, dtype: torch.dtype | None = None,
                       log: bool = True) -> float:
    """``(weight * penalty).backward()`` for the penalty ln ||Phi(theta)||_{q,r} (``log=False``:
    ||Phi(theta)||_{q,r}) of ``differentiable_path_norm``, at the cost of arithmetic: the
    regularised training step as ``loss.backward()``, then this, then ``opt.step()``
    (weight decay's way: the penalty's gradient added to ``.grad``, thesis Thm 3.1.1).

    On a chain of dense layers (an MLP whose recorded pass ``pathlift.lift.chain`` runs)
    one compiled call computes the value and adds weight times its gradient to each
    parameter's ``.grad`` without building an autograd graph (parameter hooks are not
    called: a parameter that has one takes autograd's route); any other network takes
    autograd's route on the recorded pass. Both give autograd's numbers: the same
    ``.grad`` (``None`` becomes the gradient, frozen parameters untouched), whatever the
    grad mode.

    Args and errors as ``differentiable_path_norm``; ``weight``: the penalty's factor in
    the loss (a finite number or 0-dim tensor).

    Returns:
        the penalty's value (ln ||Phi||_{q,r}, or ||Phi||_{q,r}, inf where it leaves float64).

    Example::

        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        path_norm_backward(model, (1, 8, 8), 1e-3)  # + 1e-3 ln ||Phi||_1 in the loss
        opt.step()
    """
    check_q(q, minimum=1.0, what=" for a differentiable path-norm")
    r = q if r is None else check_r(r)
    weight = float(weight)  # a 0-dim tensor (a scheduled strength) too
    if not math.isfinite(weight):
        raise InvalidParameterError(f"the penalty's weight must be finite, got {weight}")
    chain = recorded_chain(model, input_shape, ("norm", q, r, dtype))
    value = None if chain is None else chain.add_gradient(weight, not log)
    if value is not None:
        return value
    with torch.enable_grad():
        ln = differentiable_path_norm(model, input_shape, q, r, dtype)
        penalty = ln if log else ln.exp()
        if penalty.requires_grad:
            (weight * penalty).backward()
    return float(penalty.detach())


def _refuse_non_finite(graph: LayerGraph, ln: float, q: float, dtype: torch.dtype | None
                       ) -> None:
    """What ``path_norm`` says of a pass that came out NaN or inf (the layers holding
    NaN/inf, else a PrecisionError); for -inf, nothing when the network has no non-zero
    path (its norm is 0), else a PrecisionError: the pass underflowed where
    ``path_norm``'s normalised pass (Alg. 3.2.1) does not."""
    if ln != -math.inf:
        check_finite(graph, torch.tensor([ln]), f"ln ||Phi||_q at q = {q:g}", q)
    if bool((log_outputs(graph, q, dtype or graph.dtype) > -math.inf).any()):
        raise PrecisionError(
            f"the differentiable ||Phi||_q at q = {q:g} underflows "
            f"{dtype or graph.dtype} (the network's paths span more than its range); "
            "use dtype=torch.float64, or normalise the network first")


@dataclass(frozen=True)
class MagnitudeGradients:
    """gamma_p = d||Phi||_q^q / d|p|^q for every parameter p of the DAG, as
    ``mantissas[p] * e^log_scale`` (natural log, one scale for all, so nothing overflows).

    For q = 2 these are the Path-SGD scales (Neyshabur, Salakhutdinov & Srebro 2015, eq. 5:
    the coefficient of p^2 in the squared l2 path-norm); for q = 1 and an output layer,
    d||Phi||_1/d|W_vu| is the l1 path-norm reaching its input u (thesis Thm 3.1.1).
    """

    q: float
    mantissas: dict[nn.Parameter, Tensor]
    log_scale: float


def magnitude_gradients(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
                        q: float = 2.0, dtype: torch.dtype | None = None) -> MagnitudeGradients:
    """gamma_p = d||Phi||_q^q / d|p|^q of every weight and bias on any supported DAG, by one
    forward and one backward pass of the |theta|^q network (Thm 3.1.1) whose leaves are
    A = |W|^q; a parameter shared by several DAG edges (a convolution kernel) gets the sum
    over its edges. The model is not modified.

    Each path crosses a Linear/Conv parameter at most once, so ||Phi||_q^q is
    gamma_p |p|^q + (terms without p). For eval BatchNorm (x*a + c, a = w s, c = b - m a;
    q = 2 only, where the fold stays a sum of squares per parameter) the chain rule gives
    gamma_w = s^2 (gamma_a + m^2 gamma_c) and gamma_b = gamma_c: (1/2) d^2||Phi||_2^2/dp^2
    exactly. At q != 2 BatchNorm's weight and bias are no coordinates of ||Phi||_q^q in
    this sense (the fold mixes them into one bias): they are left out of ``mantissas``,
    and every other parameter keeps its gamma (the path-norm budget reads the output
    layer's at q = 1).
    """
    def record(graph: LayerGraph) -> tuple[_Layers, Tensor, list[Tensor]]:
        if is_sharded_graph(graph):
            raise UnsupportedModelError(
                "magnitude gradients (Path-SGD scales) of a sharded (FSDP2) model are not "
                "implemented; differentiable_path_norm and path_magnitude_scores are")
        return _leaf_pass(graph, q, dtype or graph.dtype)

    (layers, total, leaves), grads = replayed_gradients(model, input_shape, ("gamma", q, dtype),
                                                        record, _graph)
    if not math.isfinite(float(total.detach())):
        _refuse_non_finite(layers.graph, float(total.detach()), q, dtype)
    found = _gradients(layers, leaves, grads)
    if layers.rescaled:  # scales beyond the float range: zeros may be flushed values
        refuse_flushed(layers.graph, {name: [(g, None) for g in pair]
                                      for name, pair in found.items()}, "magnitude gradients")
    scales: dict[nn.Parameter, Tensor] = {}
    for (_, module, params, handler, _), (g_w, g_b) in zip(layers.layers, found.values(),
                                                               strict=True):
        for pname, gamma in handler.magnitude_gradients(module, g_w, g_b, q):
            p = params.get(pname)
            if p is not None and gamma is not None:
                gamma = gamma.detach() if gamma.requires_grad else gamma
                # a weight tied across layers: d/d|p|^q sums over them (chain rule)
                scales[p] = scales[p] + gamma if p in scales else gamma
    return MagnitudeGradients(q, scales, layers.top + layers.shift)


class _Layers:
    """What a pass with leaves fixes once (constants of its tape, a single pytree leaf):
    the graph, the scale of ``total``, whether some layer took a unit other than 1, and
    per layer its name, module, the nn.Parameters holding its "weight" and "bias", its
    handler and, for its two leaves |W/u|^q and |b/v|^q, the factor e^(-q ln u - shift)
    that brings d/d|W/u|^q to d/d|W|^q at one scale e^shift (None: at it already)."""

    def __init__(self, graph: LayerGraph, walker: LivePass, top: float, q: float):
        self.graph, self.top, self.rescaled = graph, top, walker.rescaled
        shifts = {name: tuple(-q * math.log(u) for u in units)
                  for name, units in walker.layer_units.items()}
        self.shift = max((shifts[name][i] for name, pair in walker.leaves.items()
                          for i, t in enumerate(pair) if t is not None), default=0.0)
        self.layers = []
        for name, pair in walker.leaves.items():
            module = graph.module.get_submodule(name)
            params = {k: p for k in ("weight", "bias")
                      if (p := _stored_parameter(module, k)) is not None}
            gains = tuple(None if t is None or shifts[name][i] == self.shift
                          else math.exp(shifts[name][i] - self.shift)
                          for i, t in enumerate(pair))
            self.layers.append((name, module, params, walker.handlers[name], gains))
        self.biased = [pair[1] is not None for pair in walker.leaves.values()]


def _leaf_pass(graph: LayerGraph, q: float, dtype: torch.dtype
               ) -> tuple[_Layers, Tensor, list[Tensor]]:
    """The |theta|^q pass whose leaves are A = |W/u|^q, one pair a layer (``LivePass``):
    its constants, sum_v o_v (the mantissa at scale ``_Layers.top``) and the leaves, flat
    (a small pytree: replayed without walking nested containers)."""
    walker = LivePass(graph, q, dtype, leaves=True)
    total, top = output_sum(walker.run_all_ones())
    leaves = [t for pair in walker.leaves.values() for t in pair if t is not None]
    return _Layers(graph, walker, top, q), total, leaves


def _gradients(layers: _Layers, leaves: list[Tensor], grads: list[Tensor | None]
               ) -> dict[str, tuple[Tensor, Tensor | None]]:
    """For each layer d(sum_v o_v)/d|W|^q and d/d|b|^q at scale e^(top + shift), from
    d(sum_v o_v)/d leaf for each leaf (None: zero)."""
    grads, leaf = iter(grads), iter(leaves)
    found = {}
    for (name, _, _, _, gains), biased in zip(layers.layers, layers.biased, strict=True):
        pair = []
        for gain, present in zip(gains, (True, biased), strict=True):
            if not present:
                pair.append(None)
                continue
            g, t = next(grads), next(leaf)
            g = torch.zeros_like(t) if g is None else g
            pair.append(g if gain is None else g * gain)
        found[name] = (pair[0], pair[1])
    return found


def refuse_flushed(graph: LayerGraph,
                   found: dict[str, list[tuple[Tensor | None, Tensor | None]]], what: str
                   ) -> None:
    """PrecisionError when an entry of ``found`` (per layer, (values, parameter) pairs for
    its weight and bias; parameter None: any) is zero although its parameter is non-zero
    and lies on a path p with Phi_p != 0: a number flushed to zero by one float scale
    (paths of the network that differ by more than the float's range). Called after a
    pass that took some layer in a unit other than 1 (``AbsPowInterpreter.rescaled``):
    a network whose weights lie within 2^(+-16) of 1 pays nothing. Which entries lie on
    such a path is asked only when some entry is zero: the pass at q = 2^-60 counts the
    non-zero paths through each one (``COUNTING_Q``)."""
    zero = {name: [None if v is None else (v == 0) if p is None else (v == 0) & (p != 0)
                   for v, p in pairs] for name, pairs in found.items()}
    if not any(bool(z.any()) for pairs in zero.values() for z in pairs if z is not None):
        return
    with torch.enable_grad():
        counted, total, leaves = _leaf_pass(graph, COUNTING_Q, torch.float64)
        live = _gradients(counted, leaves, torch.autograd.grad(total, leaves, allow_unused=True))
    for name, pairs in zero.items():
        if name in live and any(z is not None and g is not None and bool((z & (g > 0)).any())
                                for z, g in zip(pairs, live[name], strict=True)):
            raise PrecisionError(
                f"'{name}': {what} of some of its coordinates lie more than float64's range "
                "below the largest (the network's paths span more than 1e308) and cannot be "
                "given at one scale; normalise the network's scale first")


def _stored_parameter(module: nn.Module, name: str) -> nn.Parameter | None:
    """The ``nn.Parameter`` that holds ``name`` (``name_orig`` for a pruned module)."""
    p = getattr(module, name + "_orig", None)
    if p is None:
        p = getattr(module, name, None)
    return p if isinstance(p, nn.Parameter) else None
