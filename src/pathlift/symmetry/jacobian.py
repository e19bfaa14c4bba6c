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
from torch import Tensor, fx, nn
from torch.func import functional_call, jvp

from pathlift.errors import InvalidParameterError, UnsupportedModelError
from pathlift.graph import LayerGraph, copy_model, graph_of
from pathlift.graph.boundary import flat_outputs
from pathlift.graph.ops import Call, Kind
from pathlift.graph.trace import GraphInterpreter

# Ops whose outputs are neurons of Def. 2.2.2 (a ReLU either merges into the neuron it
# follows or creates one; both get a gate, a product of gates is still one monomial). A
# piecewise-linear activation is lowered to ReLU neurons n_j = ReLU(sigma_j z + beta_j) and
# one identity neuron y = f(t_1) + sum_j c_j n_j (``pathlift.graph.ops.activation``): each
# gets a gate of its own.
_NEURON_KINDS = (Kind.AFFINE, Kind.POOL, Kind.ADD, Kind.MAXPOOL, Kind.RELU, Kind.ACTIVATION)


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
        copy = copy_model(source.model).to("cpu", torch.float64).eval()
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


class _Gated(GraphInterpreter):
    """The gated path network R~ of this module's docstring, batch ``batch``."""

    def __init__(self, graph: LayerGraph, batch: int, generator: torch.Generator):
        super().__init__(graph)
        self.gates: dict[str, Tensor] = {}
        self.choices: dict[str, Tensor] = {}
        self.lowered: dict[str, tuple[list[tuple[float, float, float]], float, list[Tensor]]] = {}

        def gate(shape: tuple[int, ...]) -> Tensor:  # away from 0: a well-scaled Jacobian
            sign = torch.randint(0, 2, shape, generator=generator) * 2 - 1
            return sign * (0.5 + torch.rand(shape, generator=generator, dtype=torch.float64))

        for n in graph.nodes():
            handler = graph.handler(n)
            kind = handler.kind
            if kind not in _NEURON_KINDS:
                continue
            shape = (batch, *graph.output_shape(n))
            if kind is Kind.ACTIVATION:
                if handler.parametric:
                    raise UnsupportedModelError(
                        f"node '{n.name}' ({handler.name}) has trainable slopes; the rank of "
                        "dPhi/dtheta does not cover them yet: pass phi=False")
                call = Call(n, graph.submodule(n), tuple(n.args), dict(n.kwargs))
                pieces = handler.pieces(call)
                neurons = [(float(a), float(b), float(c)) for a, b, c in pieces.neurons()]
                self.lowered[n.name] = (neurons, float(pieces.value),
                                        [gate(shape) for _ in neurons])
            self.gates[n.name] = gate(shape)
            if kind is Kind.MAXPOOL:
                arg = n.args[0]
                self.choices[n.name] = torch.rand((batch, *graph.output_shape(arg)),
                                                  generator=generator, dtype=torch.float64)

    def run_node(self, n: fx.Node) -> Any:
        if n.op in ("placeholder", "output"):
            return super().run_node(n)
        kind = self.layer_graph.handler(n).kind
        if kind is Kind.RELU:
            args, _ = self.fetch_args_kwargs_from_env(n)
            return args[0] * self.gates[n.name]
        if kind is Kind.ACTIVATION:  # y = f(t_1) + sum_j c_j g_j (sigma_j z + beta_j)
            z = self.fetch_args_kwargs_from_env(n)[0][0]
            neurons, value, gates = self.lowered[n.name]
            y = sum(c * g * (sigma * z + beta) for (sigma, beta, c), g in
                    zip(neurons, gates, strict=True)) + value
            return y * self.gates[n.name]
        if kind is Kind.MAXPOOL:  # the pool linearised at a random point: one winner each
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            call = Call(n, self.layer_graph.submodule(n), tuple(args), kwargs)
            _, picked = jvp(call.run, (self.choices[n.name],), (args[0],))
            return picked * self.gates[n.name]
        out = super().run_node(n)
        return out * self.gates[n.name] if n.name in self.gates else out


class _Patterns(GraphInterpreter):
    """Records, per input, the on/off bit of every ReLU output, the linear piece of every
    piecewise-linear activation's input (the on/off bits of its lowered ReLU neurons) and
    the winner of every max-pool output (the antecedent it reads, as a jvp's tangent)."""

    def __init__(self, graph: LayerGraph):
        super().__init__(graph)
        self.parts: list[Tensor] = []
        self.relu_inputs: dict[str, Tensor] = {}
        self.clipped: dict[str, Tensor] = {}

    def run_node(self, n: fx.Node) -> Any:
        kind = None if n.op in ("placeholder", "output") else self.layer_graph.handler(n).kind
        if kind is Kind.ACTIVATION:  # before the op: it may overwrite its input
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            handler = self.layer_graph.handler(n)
            pieces = handler.pieces(Call(n, self.layer_graph.submodule(n), tuple(args), kwargs))
            z = args[0]
            self.parts += [(z > t).reshape(z.shape[0], -1).to(torch.float64)
                           for t in pieces.breakpoints]
            if not pieces.homogeneous:  # it fixes scales where a breakpoint is passed
                crossed = torch.zeros(z.shape, dtype=torch.bool)
                for t in pieces.breakpoints:
                    if t != 0:
                        crossed |= z > t if t > 0 else z < t
                self.clipped[n.name] = crossed
        out = super().run_node(n)
        if kind is Kind.RELU:
            self.parts.append((out > 0).reshape(out.shape[0], -1).to(torch.float64))
            self.relu_inputs[n.name] = out > 0
        elif kind is Kind.MAXPOOL:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            call = Call(n, self.layer_graph.submodule(n), tuple(args), kwargs)
            x = args[0]
            index = torch.arange(x[0].numel(), dtype=x.dtype).reshape(x.shape[1:]).expand_as(x)
            _, winner = jvp(call.run, (x,), (index.contiguous(),))
            self.parts.append(winner.reshape(x.shape[0], -1))
        return out


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
