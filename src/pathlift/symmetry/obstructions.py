"""The known obstructions to identifiability, counted as directions of theta along which the
Jacobian of theta -> R_theta vanishes (thesis Sec. 7.1.1; Stock & Gribonval 2023, "An
embedding of ReLU networks and an analysis of their identifiability", Sec. 3).

- rescaling (Def. 2.4.1): one direction per free tie group of the channel analysis
  (``pathlift.graph.channels``): a hidden channel, or channels tied by a residual addition
  or by a layer called twice (tied weights share one factor, so ties lower the count).
  A clipping activation (ReLU6, Hardtanh: a breakpoint other than 0) fixes the scale of
  the neurons it reads (the channel analysis puts them in the fixed group), unless no
  input of the domain reaches that breakpoint: there it acts as a homogeneous activation
  and the rescaling is back, one direction per such channel ("unclipped").
- dead neurons: a channel whose ReLU is off on every input (an input-dead neuron of
  Def. 2.4.2 is one) has zero derivative in its incoming weights and bias (n_in of them)
  and in the weights that read it (n_out): n_in + n_out null directions, one of them its
  rescaling already counted. A BatchNorm reading it loses one of its two (its output is a
  constant).
- always-active neurons: k channels of one layer whose ReLU is on for every input act as a
  linear bottleneck there: any invertible k x k map of them (k^2 directions, k of them
  the rescalings) keeps the function, and so does shifting their biases against the
  biases of the Linear layers reading them: k^2 - k (+ k with those biases) beyond their
  rescalings. (A ReLU neuron is never on over all of R^d unless what it reads is
  non-negative, e.g. the outputs of other ReLUs.)
- twin neurons: t channels of one layer whose incoming weights and biases are positive
  multiples of one another are always co-active; with n_in incoming and m outgoing
  parameters each and an outgoing matrix of rank r, they lose (t - r)(n_in - 1) + (t - 1)m
  directions beyond their t rescalings (the derivatives in their outgoing weights are all
  multiples of one function, and t of them lie in the span of the incoming ones).
- bias shift: a layer with bias read directly (no ReLU) by an affine BatchNorm: adding d
  to the bias of channel c and subtracting its effect from the BatchNorm's shift keeps the
  function: one direction per channel. This is not a rescaling, and Phi does not see it.

Linear bottlenecks by design (a hidden layer without activation read by a non-diagonal
layer) have the same invertible-map symmetries; they are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, fx

from pathlift.graph.boundary import param
from pathlift.graph.channels import ChannelLayer, ChannelMap, Producer
from pathlift.graph.layer_graph import LayerGraph
from pathlift.graph.ops import AffineHandler
from pathlift.symmetry.jacobian import Patterns

_TWIN_COSINE = 1 - 1e-12  # incoming rows this aligned are twins (up to rounding)


@dataclass(frozen=True)
class Obstructions:
    """Predicted null directions of the Jacobian of theta -> R_theta, by cause.

    ``dead`` and ``twins`` count directions beyond the rescalings of those neurons;
    ``dead_neurons`` and ``twin_groups`` name them as ``layer[channel]``;
    ``tied_channels`` is the number of hidden channels sharing a factor with another
    (information: ties are already in ``rescaling``).
    """

    rescaling: int
    unclipped: int
    dead: int
    always_on: int
    twins: int
    bias_shift: int
    tied_channels: int
    dead_neurons: tuple[str, ...] = ()
    always_on_neurons: tuple[str, ...] = ()
    twin_groups: tuple[tuple[str, ...], ...] = ()

    @property
    def total(self) -> int:
        return (self.rescaling + self.unclipped + self.dead + self.always_on + self.twins
                + self.bias_shift)

    def __repr__(self) -> str:
        return (f"Obstructions(total={self.total}: rescaling {self.rescaling}, unclipped "
                f"{self.unclipped}, dead "
                f"{self.dead}, always on {self.always_on}, twins {self.twins}, bias shift "
                f"{self.bias_shift})")


def _rescalable_groups(cmap: ChannelMap) -> int:
    """One rescaling per free tie group (Def. 2.4.1); channels read by an activation that
    fixes their scale (the op trait ``fixes_scale``) are in the fixed group 0."""
    return cmap.num_groups - 1


def _kernel(module: torch.nn.Module) -> int:
    weight = param(module, "weight")
    return int(weight[0, 0].numel()) if weight.dim() > 1 else 1


def _out_channels(p: Producer, module: torch.nn.Module) -> Tensor:
    """Output channel of each (row, column) entry of the weight, broadcast to its shape."""
    rows, _ = p.handler.entry_channels(module)
    return rows.expand(param(module, "weight").shape[:2])


def _in_channels(p: Producer, module: torch.nn.Module) -> Tensor:
    _, cols = p.handler.entry_channels(module)
    return cols.expand(param(module, "weight").shape[:2])


class _Counter:
    """Parameter counts of channels and their readers, on one graph."""

    def __init__(self, graph: LayerGraph, cmap: ChannelMap):
        self.graph, self.cmap = graph, cmap
        self.module = graph.module.get_submodule
        sizes = torch.bincount(cmap.group, minlength=cmap.num_groups)
        self.single = sizes == 1
        self.calls = graph.calls()

    def simple(self, p: Producer) -> bool:
        """A non-diagonal layer with neurons of its own, called once."""
        return not p.passthrough and not p.diagonal and self.calls.get(p.name, 0) == 1

    def incoming(self, p: Producer, c: int) -> int:
        module = self.module(p.name)
        count = int((_out_channels(p, module) == c).sum()) * _kernel(module)
        return count + (p.handler.bias(module) is not None)

    def readers(self, groups: set[int]) -> list[Producer]:
        """The layers with parameters reading any of ``groups``."""
        return [q for q in self.cmap.producers if not q.passthrough
                and bool(torch.isin(self.cmap.group[q.inputs], torch.tensor(sorted(groups))).any())]

    def outgoing(self, group: int) -> list[Tensor]:
        """The weights reading ``group``, one flat tensor per reader entry block."""
        out = []
        for q in self.cmap.producers:
            if q.passthrough:
                continue
            module = self.module(q.name)
            if q.diagonal:
                if bool((self.cmap.group[q.inputs] == group).any()):
                    out.append(torch.zeros(1))  # a BatchNorm loses one of (weight, bias)
                continue
            reads = self.cmap.group[q.inputs][_in_channels(q, module)] == group
            if bool(reads.any()):
                weight = param(module, "weight").detach()
                out.append(weight.reshape(*weight.shape[:2], -1)[reads].reshape(-1))
        return out


def _relu_channels(graph: LayerGraph, on: dict[str, Tensor], value: bool
                   ) -> dict[str, Tensor]:
    """For each layer read directly (and only) by a ReLU (or activation) node of ``on``:
    whether each of its output channels is ``value`` for some input and position."""
    out: dict[str, Tensor] = {}
    for n in graph.nodes():
        if n.name not in on or not isinstance(n.args[0], fx.Node):
            continue
        src = n.args[0]
        if src.op != "call_module" or not isinstance(graph.handler(src), ChannelLayer) \
                or len(src.users) != 1:
            continue
        handler: AffineHandler = graph.handler(src)
        active = on[n.name] == value
        dim = active.dim() - 1 if handler.channel_dim == -1 else 1
        ever = active.movedim(dim, 0).reshape(active.shape[dim], -1).any(dim=1)
        out[src.target] = out.get(src.target, torch.zeros_like(ever)) | ever
    return out


def _dead(counter: _Counter, on: dict[str, Tensor]) -> tuple[int, list[str]]:
    extra, names = 0, []
    for name, ever in _relu_channels(counter.graph, on, True).items():
        p = counter.cmap.producer(name)
        if not counter.simple(p):
            continue
        for c in torch.nonzero(~ever).flatten().tolist():
            group = int(counter.cmap.group[p.neurons[c]])
            if group == 0 or not counter.single[group]:
                continue
            n_out = sum(t.numel() for t in counter.outgoing(group))
            extra += counter.incoming(p, c) + n_out - 1
            names.append(f"{name}[{c}]")
    return extra, names


def _unclipped(counter: _Counter, clipped: dict[str, Tensor]) -> int:
    """Channels of a simple layer read by a clipping activation that never clips them."""
    count = 0
    for name, ever in _relu_channels(counter.graph, clipped, True).items():
        p = counter.cmap.producer(name)
        if counter.simple(p):
            count += int((~ever).sum())
    return count


def _always_on(counter: _Counter, on: dict[str, Tensor]) -> tuple[int, list[str]]:
    extra, names = 0, []
    for name, ever_off in _relu_channels(counter.graph, on, False).items():
        p = counter.cmap.producer(name)
        if not counter.simple(p):
            continue
        groups = counter.cmap.group[p.neurons]
        linear = [c for c in torch.nonzero(~ever_off).flatten().tolist()
                  if int(groups[c]) and counter.single[groups[c]]]
        if not linear:
            continue
        k = len(linear)
        readers = counter.readers({int(groups[c]) for c in linear})
        shift = p.handler.bias(counter.module(p.name)) is not None and bool(readers) and all(
            q.handler.channel_dim == -1 and q.handler.bias(counter.module(q.name)) is not None
            for q in readers)
        extra += k * k - k + (k if shift else 0)
        names += [f"{name}[{c}]" for c in linear]
    return extra, names


def _twins(counter: _Counter, dead: set[str]) -> tuple[int, list[tuple[str, ...]]]:
    extra, found = 0, []
    for p in counter.cmap.producers:
        if not counter.simple(p) or p.groups != 1 or p.handler.out_dim != 0:
            continue
        module = counter.module(p.name)
        weight = param(module, "weight").detach().double().reshape(p.neurons.numel(), -1)
        bias = p.handler.bias(module)
        rows = weight if bias is None else torch.cat([weight, bias.detach().double()[:, None]], 1)
        groups = counter.cmap.group[p.neurons]
        usable = [c for c in range(len(rows)) if int(groups[c]) and counter.single[groups[c]]
                  and f"{p.name}[{c}]" not in dead and bool(rows[c].any())]
        unit = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-300)
        left = set(usable)
        for c in usable:
            if c not in left:
                continue
            members = [d for d in sorted(left) if float(unit[c] @ unit[d]) > _TWIN_COSINE]
            left -= set(members)
            if len(members) < 2:
                continue
            outgoing = torch.stack([torch.cat(counter.outgoing(int(groups[d])))
                                    for d in members])
            t, m = outgoing.shape
            r = int(torch.linalg.matrix_rank(outgoing.double()))
            extra += (t - r) * (rows.shape[1] - 1) + (t - 1) * m
            found.append(tuple(f"{p.name}[{d}]" for d in members))
    return extra, found


def _bias_shifts(graph: LayerGraph, counter: _Counter) -> int:
    count = 0
    for n in graph.nodes():
        handler = graph.handler(n)
        if n.op != "call_module" or not handler.diagonal:
            continue
        module = graph.submodule(n)
        if not handler.own_neurons(module) or counter.calls.get(n.target, 0) != 1:
            continue
        src = n.args[0]
        while isinstance(src, fx.Node) and len(src.users) == 1 and src.op != "placeholder" \
                and graph.handler(src).aliases_input:
            src = src.args[0]
        if not (isinstance(src, fx.Node) and src.op == "call_module" and len(src.users) == 1):
            continue
        source = graph.handler(src)
        if source.parametric and not source.diagonal \
                and source.dag_parameters(graph.submodule(src))[1] is not None:
            count += handler.in_channels(module)
    return count


def obstructions(graph: LayerGraph, cmap: ChannelMap, patterns: Patterns) -> Obstructions:
    """The obstructions of this module's docstring at the graph's current parameters, with
    dead, always-active and unclipped neurons read from the ``patterns`` of the domain."""
    counter = _Counter(graph, cmap)
    on = patterns.on
    dead, dead_names = _dead(counter, on)
    always_on, linear = _always_on(counter, on)
    twins, twin_groups = _twins(counter, set(dead_names) | set(linear))
    hidden = cmap.group[1:]
    sizes = torch.bincount(cmap.group, minlength=cmap.num_groups)
    tied = int(((hidden > 0) & (sizes[hidden] > 1)).sum())
    return Obstructions(_rescalable_groups(cmap), _unclipped(counter, patterns.clipped),
                        dead, always_on, twins,
                        _bias_shifts(graph, counter), tied, tuple(dead_names), tuple(linear),
                        tuple(twin_groups))
