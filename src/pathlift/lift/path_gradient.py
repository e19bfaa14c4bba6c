"""theta_i * d||Phi(theta)||_1 / d theta_i for the weights and biases of chosen layers, from one
|theta| pass and its backward (paper 002 eq. 14, thesis Sec. 3.5.1): the path-magnitudes.

||Phi||_1 depends on theta through |theta| only, so theta_i d||Phi||_1/d theta_i =
|theta_i| d||Phi||_1/d|theta_i|. The pass therefore runs on fresh tensors A = |W| that are
the autograd leaves (the model's parameters are never touched, not even their
requires_grad flags), and each A is turned into its scores in place, A <- A * dM/dA: one
fresh tensor per weight, the least there can be. For a Linear layer on the single row of
the all-ones pass, dM/dA = g x^T is applied as two broadcast products without forming it;
other layers get their weight gradient from autograd, layer by layer, from the gradient at
their output (so the backward through the network computes input gradients only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from pathlift.errors import Problem, UnsupportedModelError
from pathlift.graph import AbsPowInterpreter, LayerGraph, Scaled
from pathlift.graph.abs_pow import AbsPowLayer, output_sum
from pathlift.graph.boundary import param
from pathlift.graph.factors import tied_layers
from pathlift.graph.ops import Activation, AffineHandler, Call, abs_power
from pathlift.graph.sharded import ShardedWalker, is_sharded_graph
from pathlift.lift.differentiable import refuse_flushed


@dataclass(frozen=True)
class PathMagnitudes:
    """Path-magnitudes of the chosen weights and biases, all ``tensor * e^log_scale``.

    ``weights`` / ``biases`` map a module name to a non-negative tensor of its parameter's
    shape (on a sharded model, this rank's rows of it); ``log_scale`` (natural log) is
    common to all, so nothing overflows.
    """

    weights: dict[str, Tensor]
    biases: dict[str, Tensor]
    log_scale: float


class _Tape(AbsPowInterpreter):
    """The q = 1 pass with A = |W| (and B = |b|) of the chosen layers as autograd leaves,
    recording each chosen layer's handler, input and output."""

    def __init__(self, graph: LayerGraph, layers: Sequence[str], biases: Sequence[str],
                 dtype: torch.dtype):
        super().__init__(graph, 1.0, dtype)
        handlers = {n.target: graph.handler(n) for n in graph.nodes() if n.op == "call_module"}
        module = graph.module.get_submodule
        # each affine layer in its units (|W/u|, |b/v| as the leaves, u and v carried by
        # the pass's scale): theta_i d/d theta_i is the same in any unit
        self.layer_units = {name: self.module_units(handlers[name], module(name))
                            for name in {*layers, *biases}
                            if isinstance(handlers[name], AbsPowLayer)}
        self.weights = {name: (handlers[name].magnitude(module(name), 1.0, dtype,
                                                        unit=self.layer_units[name][0])
                               if name in self.layer_units
                               else abs_power(param(module(name), "weight"), 1.0, dtype)
                               ).requires_grad_() for name in layers}
        self.biases = {name: abs_power(handlers[name].bias(module(name)), 1.0, dtype,
                                       unit=self.layer_units[name][1])
                       .requires_grad_() for name in biases}
        self.records: dict[str, tuple[AffineHandler, Tensor, Tensor]] = {}

    def units(self, handler: AffineHandler, call: Call) -> tuple[float, float]:
        if call.node.target in self.layer_units:
            return self.layer_units[call.node.target]
        return super().units(handler, call)

    def weight_part(self, handler: AffineHandler, x: Tensor, call: Call,
                    bias: Tensor | None = None, unit: float = 1.0) -> Tensor:
        if call.node.target not in self.weights:
            return super().weight_part(handler, x, call, bias, unit)
        y = handler.apply(x, self.weights[call.node.target], call, bias)
        self.records[call.node.target] = (handler, x, y)
        return y

    def on_activation(self, handler: Activation, call: Call) -> Scaled:
        """A parametric activation (PReLU) whose slopes are chosen: the lowered neurons'
        |theta| map y = (sum_j |c_j|) x + sum_j |c_j| |beta_j| + |f(t_1)| (Thm 3.1.1, q = 1)
        with the slopes' magnitudes as the leaf."""
        name = call.node.target
        if name not in self.weights:
            return super().on_activation(handler, call)
        x = call.args[0]
        pieces = handler.pieces_from(call.replace(x.mantissa), self.weights[name])
        neurons = pieces.neurons()
        gain = sum(_magnitude(c) for _, _, c in neurons)
        offset = sum(_magnitude(c) * abs(beta) for _, beta, c in neurons) + abs(pieces.value)
        size = float(offset.detach().max()) if isinstance(offset, Tensor) else float(offset)
        top = max(x.log_scale, math.log(size)) if size > 0 else x.log_scale
        y = x.mantissa * gain * math.exp(x.log_scale - top) + offset * math.exp(-top)
        self.records[name] = (handler, x.mantissa, y)
        return Scaled.normalised(y, top)

    def bias_magnitude(self, handler: AffineHandler, call: Call, unit: float = 1.0
                       ) -> Tensor | None:
        if call.node.target in self.biases:
            return self.biases[call.node.target]
        return super().bias_magnitude(handler, call, unit)


class _ShardedTape(ShardedWalker, _Tape):
    """``_Tape`` over a model with sharded layers: the leaves are each rank's rows."""


def _magnitude(c: float | Tensor) -> float | Tensor:
    """|c| of a coefficient whose magnitude is a non-negative leaf (or a plain float)."""
    return c.abs() if isinstance(c, Tensor) else abs(c)


def path_magnitudes(graph: LayerGraph, layers: Sequence[str], biases: Sequence[str] = (),
                    dtype: torch.dtype = torch.float64) -> PathMagnitudes:
    """|theta_i| d||Phi||_1/d|theta_i| / e^s for the weights of ``layers`` and the biases of
    ``biases`` (module names of Linear/Conv layers called once; ``biases`` only layers that
    have one), s the natural-log scale of the pass. An all-zero bias gets zeros.

    Costs one |theta| pass and one backward pass through the network, whose weight
    gradients are scaled into A = |W| in place (a Linear layer on one row gets the
    gradient at its output g and A is scaled by g v^T without forming it). Raises
    UnsupportedModelError for a chosen layer called several times: a path may then cross
    its weights twice, ||Phi||_1 is not affine in them and theta_i d/d theta_i is not the
    cost of pruning theta_i.
    """
    calls = graph.calls()
    shared = [name for name in {*layers, *biases} if calls.get(name, 0) > 1]
    if shared:
        raise UnsupportedModelError([Problem(
            name, type(graph.module.get_submodule(name)).__name__,
            "this layer is called several times; path-magnitudes need each weight on one "
            "layer of the DAG") for name in sorted(shared)])
    tied = tied_layers(graph.module, sorted({*layers, *biases}))
    if tied:
        raise UnsupportedModelError([Problem(
            name, type(graph.module.get_submodule(name)).__name__,
            f"holds a parameter of layer '{other}' too (tied weights of distinct layers); "
            "path-magnitudes need each weight on one layer of the DAG")
            for name, other, _ in tied])
    tape = (_ShardedTape if is_sharded_graph(graph) else _Tape)(graph, layers, biases, dtype)
    with torch.enable_grad():
        mantissa, log_scale = output_sum(tape.run_all_ones())
        # a layer whose weight gradient is g v^T gets g (its output's gradient) and is
        # never formed; the others get their weight gradient: one backward for all
        rank_one = {name: handler.rank_one_input(x)
                    for name, (handler, x, _) in tape.records.items()}
        wanted = [y if rank_one[name] is not None else tape.weights[name]
                  for name, (_, _, y) in tape.records.items()]
        grads = torch.autograd.grad(mantissa, wanted + list(tape.biases.values()),
                                    allow_unused=True)
    weights = {}
    with torch.no_grad():
        for name, wanted_item, g in zip(tape.records, wanted, grads, strict=False):
            a = tape.weights[name].detach()  # A becomes its scores in place
            g = torch.zeros_like(wanted_item) if g is None else g
            if rank_one[name] is not None:
                weights[name] = a.mul_(g.reshape(-1, 1)).mul_(rank_one[name])
            else:
                weights[name] = a.mul_(g)
        bias_scores = {name: b.detach() * g if g is not None else torch.zeros_like(b.detach())
                       for (name, b), g in zip(tape.biases.items(), grads[len(wanted):],
                                               strict=True)}
    if tape.rescaled and not isinstance(tape, _ShardedTape):
        # scales beyond the float range: zeros may be flushed values (the counting pass
        # behind this check does not run sharded)
        module = graph.module.get_submodule
        refuse_flushed(graph, {name: [(weights.get(name), param(module(name), "weight")),
                                      (bias_scores.get(name), param(module(name), "bias"))]
                               for name in {*weights, *bias_scores}}, "path-magnitudes")
    if isinstance(tape, _ShardedTape):  # this rank's rows of each parameter
        layer = tape.shards.by_target.get
        weights = {n: layer(n).local_rows("weight", t) if layer(n) else t
                   for n, t in weights.items()}
        bias_scores = {n: layer(n).local_rows("bias", t) if layer(n) else t
                       for n, t in bias_scores.items()}
    return PathMagnitudes(weights, bias_scores, log_scale)
