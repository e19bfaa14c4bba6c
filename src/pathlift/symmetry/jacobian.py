"""The maps whose Jacobians decide identifiability, as functions of one flat parameter vector.

- ``Parameterized``: a float64 copy of the model, its parameters theta as one flat vector
  (shared parameters once) and ``outputs(theta, x)`` = (R_theta(x_i))_i, flattened, through
  ``torch.func.functional_call`` (the caller's model is never touched).
- ``gated_outputs``: the *gated path network* R~_theta(x, g), whose Jacobian in theta has the
  rank of the Jacobian of the path-lifting Phi(theta) (thesis Def. 2.3.3): every neuron's
  output is multiplied by its own gate g_v, ReLUs are removed and each max-pool neuron reads
  one antecedent drawn at random. Then R~_theta(x, g) = sum_p Phi_p(theta) m_p(g) x_{p_0}
  (Thm 2.4.2 with every path active) where m_p(g) is the product of the gates of the
  neurons of p. Two distinct paths of a DAG have distinct neuron sets, so the m_p are
  distinct monomials and, at enough generic points (x_k, g_k), the evaluation map
  Phi -> (R~(x_k, g_k))_k is injective on the span of the columns of dPhi/dtheta: both
  Jacobians have one rank (Stock & Gribonval 2023, Thm 1: its kernel is the tangent space of
  the rescaling orbit at a generic theta).
- ``activation_patterns``: the ReLU on/off bits and max-pool winners of each input (the
  linear region of x, see ``count_regions``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp

from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph import LayerGraph, graph_of, writable_copy
from pathlift.graph.boundary import flat_outputs
from pathlift.graph.layer_graph import GraphInterpreter
from pathlift.graph.ops import Call, Handler
from pathlift.graph.walk import OpWalker


@dataclass(frozen=True, eq=False)
class Parameterized:
    """A float64 copy of a model with its parameters as one flat vector ``theta``.

    ``names``/``shapes`` list the parameter tensors in ``theta`` order (a parameter shared
    by several modules appears once); ``graph`` is the traced graph of the copy.
    """

    model: nn.Module
    graph: LayerGraph
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    theta: Tensor

    @staticmethod
    def of(model: nn.Module | LayerGraph, input_shape: tuple[int, ...] | None) -> Parameterized:
        source = graph_of(model, input_shape)
        copy = writable_copy(source.model).to("cpu", torch.float64).eval()  # the weights
        graph = source.bind(copy)
        named = [(n, p) for n, p in copy.named_parameters() if p.is_floating_point()]
        if not named:
            raise InvalidParameterError(
                f"{type(copy).__name__} has no floating-point parameters: there is nothing to "
                "identify")
        theta = torch.cat([p.detach().reshape(-1) for _, p in named])
        return Parameterized(copy, graph, tuple(n for n, _ in named),
                             tuple(tuple(p.shape) for _, p in named), theta)

    @property
    def size(self) -> int:
        return self.theta.numel()

    def unflatten(self, theta: Tensor) -> dict[str, Tensor]:
        out, start = {}, 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            count = math.prod(shape)
            out[name] = theta[start:start + count].reshape(shape)
            start += count
        return out

    def slices(self) -> list[tuple[str, slice]]:
        """(parameter name, its slice of ``theta``)."""
        out, start = [], 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            count = math.prod(shape)
            out.append((name, slice(start, start + count)))
            start += count
        return out

    def outputs(self, x: Tensor) -> Callable[[Tensor], Tensor]:
        """theta -> (R_theta(x_i))_i flattened: n * d_out values."""
        def f(theta: Tensor) -> Tensor:
            out = functional_call(self.model, self.unflatten(theta), (x,))
            return flat_outputs(out, x.shape[0]).reshape(-1)
        return f

    def gated_outputs(self, x: Tensor, generator: torch.Generator) -> Callable[[Tensor], Tensor]:
        """theta -> R~_theta(x_k, g_k) flattened, gates and max-pool choices drawn once."""
        interpreter = _Gated(self.graph, x.shape[0], generator)
        holder = _Run(interpreter)

        def f(theta: Tensor) -> Tensor:
            params = {f"net.{k}": v for k, v in self.unflatten(theta).items()}
            return flat_outputs(functional_call(holder, params, (x,)), x.shape[0]).reshape(-1)
        return f


class _Run(nn.Module):
    """Holds the copy (so that functional_call swaps its parameters) and runs a pass on it."""

    def __init__(self, interpreter: GraphInterpreter):
        super().__init__()
        self.net = interpreter.layer_graph.model
        self.interpreter = interpreter

    def forward(self, x: Tensor) -> Any:
        return self.interpreter.run(x)


class _Gated(OpWalker):
    """The gated path network R~ of this module's docstring: every op that makes (or
    activates) neurons multiplies its output by a fixed random gate, drawn at its first
    run and kept, so that every run of the walker computes the same network."""

    purpose = "the gated path network"

    def __init__(self, graph: LayerGraph, batch: int, generator: torch.Generator):
        super().__init__(graph)
        self.batch, self.generator = batch, generator
        self.gates: dict[str, Tensor] = {}
        self.choices: dict[str, Tensor] = {}
        self.lowered: dict[str, tuple[list[tuple[float, float, float]], float, list[Tensor]]] = {}
        with torch.no_grad():  # draw every gate now, outside any functorch transform
            self.run(torch.zeros((batch, *graph.input_shape), dtype=torch.float64))

    def _draw(self, shape: tuple[int, ...]) -> Tensor:  # away from 0: a well-scaled Jacobian
        sign = torch.randint(0, 2, shape, generator=self.generator) * 2 - 1
        return sign * (0.5 + torch.rand(shape, generator=self.generator, dtype=torch.float64))

    def _gate(self, call: Call) -> Tensor:
        name = call.node.name
        if name not in self.gates:
            self.gates[name] = self._draw((self.batch, *self.layer_graph.output_shape(
                call.node)))
        return self.gates[name]

    def _gated(self, handler: Handler, call: Call) -> Tensor:
        return call.run() * self._gate(call)

    on_affine = on_pool = on_add = _gated

    def on_relu(self, handler: Handler, call: Call) -> Tensor:
        return call.args[0] * self._gate(call)

    def on_activation(self, handler: Handler, call: Call) -> Tensor:
        """y = f(t_1) + sum_j c_j g_j (sigma_j z + beta_j), each lowered neuron gated."""
        name = call.node.name
        if name not in self.lowered:
            if handler.parametric:
                raise UnsupportedModelError(
                    f"node '{name}' ({handler.name}) has trainable slopes; the rank of "
                    "dPhi/dtheta does not cover them yet: pass phi=False")
            pieces = handler.pieces(call)
            neurons = [(float(a), float(b), float(c)) for a, b, c in pieces.neurons()]
            shape = (self.batch, *self.layer_graph.output_shape(call.node))
            self.lowered[name] = (neurons, float(pieces.value),
                                  [self._draw(shape) for _ in neurons])
        neurons, value, gates = self.lowered[name]
        z = call.args[0]
        y = sum(c * g * (sigma * z + beta) for (sigma, beta, c), g in
                zip(neurons, gates, strict=True)) + value
        return y * self._gate(call)

    def on_maxpool(self, handler: Handler, call: Call) -> Tensor:
        """The pool linearised at a random point: one winner for each output."""
        name = call.node.name
        if name not in self.choices:
            self.choices[name] = torch.rand(
                (self.batch, *self.layer_graph.output_shape(call.node.args[0])),
                generator=self.generator, dtype=torch.float64)
        _, picked = jvp(call.run, (self.choices[name],), (call.args[0],))
        return picked * self._gate(call)


class _Patterns(OpWalker):
    """Records, per input, the on/off bit of every ReLU output, the linear piece of every
    piecewise-linear activation's input (the on/off bits of its lowered ReLU neurons) and
    the winner of every max-pool output (the antecedent it reads, as a jvp's tangent)."""

    purpose = "activation patterns"

    def __init__(self, graph: LayerGraph):
        super().__init__(graph)
        self.parts: list[Tensor] = []
        self.relu_inputs: dict[str, Tensor] = {}
        self.clipped: dict[str, Tensor] = {}

    def _run(self, handler: Handler, call: Call) -> Tensor:
        return call.run()

    on_affine = on_pool = on_add = _run

    def on_activation(self, handler: Handler, call: Call) -> Tensor:
        pieces = handler.pieces(call)  # before the op: it may overwrite its input
        z = call.args[0]
        self.parts += [(z > t).reshape(z.shape[0], -1).to(torch.float64)
                       for t in pieces.breakpoints]
        if not pieces.homogeneous:  # it fixes scales where a breakpoint is passed
            crossed = torch.zeros(z.shape, dtype=torch.bool)
            for t in pieces.breakpoints:
                if t != 0:
                    crossed |= z > t if t > 0 else z < t
            self.clipped[call.node.name] = crossed
        return call.run()

    def on_relu(self, handler: Handler, call: Call) -> Tensor:
        out = call.run()
        self.parts.append((out > 0).reshape(out.shape[0], -1).to(torch.float64))
        self.relu_inputs[call.node.name] = out > 0
        return out

    def on_maxpool(self, handler: Handler, call: Call) -> Tensor:
        x = call.args[0]
        index = torch.arange(x[0].numel(), dtype=x.dtype).reshape(x.shape[1:]).expand_as(x)
        _, winner = jvp(call.run, (x,), (index.contiguous(),))
        self.parts.append(winner.reshape(x.shape[0], -1))
        return call.run()


@dataclass(frozen=True, eq=False)
class Patterns:
    """``codes[i]``: the activation pattern of input i as one row; ``on[node]``: the on/off
    tensor of each ReLU node's output, ``clipped[node]``: where the input of each
    piecewise-linear activation passes a breakpoint other than 0 (batch first)."""

    codes: Tensor
    on: dict[str, Tensor]
    clipped: dict[str, Tensor]

    def count_regions(self) -> int:
        """Number of distinct patterns among the inputs.

        A(theta, x) (Def. 2.3.3) is a function of this pattern: a_p is the product of the
        on/off bits of the ReLU neurons of p and of the indicators that p enters each
        max-pool neuron through its winner. Equal patterns thus give equal A, and the count
        of patterns bounds the count of distinct A(theta, x_i) from above; they are equal
        when every neuron's on/off bit shows in some active path (it does for the paths that
        start at that neuron, unless everything downstream of it is off). Patterns cost one
        forward pass, A costs one row per path (|P| grows exponentially with depth).
        """
        if self.codes.shape[1] == 0:
            return 1
        return int(torch.unique(self.codes, dim=0).shape[0])


def activation_patterns(graph: LayerGraph, x: Tensor) -> Patterns:
    """The activation pattern of every input of the batch ``x`` (no gradient)."""
    recorder = _Patterns(graph)
    with torch.no_grad():
        recorder.run(x)
    codes = torch.cat(recorder.parts, dim=1) if recorder.parts else \
        torch.zeros((x.shape[0], 0), dtype=torch.float64)
    return Patterns(codes, recorder.relu_inputs, recorder.clipped)
