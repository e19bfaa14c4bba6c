"""Permutation symmetry, canonical forms and functional equivalence.

Slides "Complexity of deep neural networks from the perspective of functional
equivalence": re-indexing the neurons of a hidden layer (with the rows of its weights and
bias and the columns of the next layer) keeps the function (permutation invariance, any
activation); positively homogeneous activations add scaling invariance, odd ones sign
flips. Two networks of one architecture that differ only by permutations and rescalings
have the same canonical form: normalise (Alg. 3.2.1, removes rescalings) then sort the
neurons of every permutable layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError, check_count, check_number
from pathlift.graph import LayerGraph, graph_of, writable_copy
from pathlift.graph.boundary import flat_outputs, stored
from pathlift.graph.channels import ChannelMap, Producer, analyse
from pathlift.graph.factors import refuse_shared_parameters
from pathlift.graph.normalize import normalize
from pathlift.graph.structure import paired_parameters
from pathlift.memory import check_samples


@runtime_checkable
class PermutableLayer(Protocol):
    """What permutation (canonical forms, functional equivalence, ``permute``) asks of a
    layer beyond the channel analysis' ``ChannelLayer``: which dim of its weight holds its
    output channels (``out_dim``), and the in-place permutation of a copy's output channels
    and input columns. ``AffineHandler`` implements it (a KSLinear refuses, typed)."""

    out_dim: int

    def permute_(self, module: nn.Module, outputs: Tensor | None = None,
                 inputs: Tensor | None = None) -> None: ...


def _permutable(p: Producer) -> PermutableLayer:
    return p.handler


# --------------------------------------------------------------------------- the slides' table
@dataclass(frozen=True)
class Symmetries:
    """Which transformations of a hidden neuron keep the function, for one activation."""

    activation: str
    scaling: bool
    sign_flip: bool
    permutation: bool
    note: str


_TABLE = {
    "relu": Symmetries("relu", True, False, True,
                       "sigma(lambda x) = lambda sigma(x) for lambda > 0"),
    "leaky_relu": Symmetries("leaky_relu", True, False, True,
                             "positively homogeneous like ReLU"),
    "tanh": Symmetries("tanh", False, True, True, "odd: sigma(-x) = -sigma(x)"),
    "sigmoid": Symmetries("sigmoid", False, True, True,
                          "sign flip up to the constant 0.5, absorbed by the next bias"),
    "identity": Symmetries("identity", True, True, True, "linear: any invertible map"),
}


def symmetries(activation: str) -> Symmetries:
    """The symmetry table of the slides (scaling, sign flip, permutation) for ``activation``."""
    key = activation.lower().replace(" ", "_").replace("-", "_")
    if key not in _TABLE:
        raise InvalidParameterError(f"unknown activation '{activation}'; choose among "
                                    f"{sorted(_TABLE)}")
    return _TABLE[key]


# --------------------------------------------------------------------------- permutations
@dataclass(frozen=True)
class Unit:
    """A permutable layer: a producer and the BatchNorms that carry its channels along."""

    producer: Producer
    carried: tuple[Producer, ...]


def _single_free(cmap: ChannelMap, p: Producer) -> bool:
    group = cmap.permutation_group
    groups = group[p.neurons]
    if (groups == 0).any():
        return False
    counts = torch.bincount(group)
    return bool((counts[groups] == 1).all())


def permutable_units(cmap: ChannelMap) -> list[Unit]:
    """Producers whose channels can be re-indexed alone (topological order).

    Every channel must be a free, untied neuron, read only by Linear, Conv or ConvTranspose
    layers without groups, or by BatchNorms whose own channels satisfy the same (they are
    permuted along, as are the slopes of a per-channel PReLU). Channels tied by residual
    sums, depthwise convs and outputs are not, nor channels split by slicing or ``chunk``
    (which positions go where is part of the structure).
    """
    readers: dict[int, list[Producer]] = {}
    for p in cmap.producers:
        for i in torch.unique(p.inputs).tolist():
            readers.setdefault(i, []).append(p)
    units = []
    for p in cmap.producers:
        if p.diagonal or p.groups != 1 or not _single_free(cmap, p):
            continue
        carried: list[Producer] = []
        frontier, ok = [p], True
        while frontier and ok:
            current = frontier.pop()
            for r in {r.name: r for i in current.neurons.tolist()
                      for r in readers.get(i, ())}.values():
                if r.diagonal:
                    if not torch.equal(r.inputs, current.neurons) or (
                            not r.passthrough and not _single_free(cmap, r)):
                        ok = False
                    elif not r.passthrough:
                        carried.append(r)
                        frontier.append(r)
                    else:
                        carried.append(r)
                elif r.groups != 1:
                    ok = False
        if ok and not any(i in cmap.split for q in (p, *carried) for i in q.neurons.tolist()):
            units.append(Unit(p, tuple(carried)))
    return units


def _apply_permutation(model: nn.Module, cmap: ChannelMap, unit: Unit, perm: Tensor) -> None:
    """New channel c of the unit = old channel perm[c], readers' columns moved to match."""
    id_map: dict[int, int] = {}
    for p in (unit.producer, *unit.carried):
        old = p.neurons.tolist()
        id_map.update({old[c]: old[int(perm[c])] for c in range(len(old))})
        if p is unit.producer or not p.passthrough:
            _permutable(p).permute_(p.module_in(model), outputs=perm)
    for name, ids in cmap.carriers:  # per-channel slopes follow their channels
        labels = ids.tolist()
        if any(i in id_map for i in labels):
            slopes = stored(model.get_submodule(name), "weight")
            src = torch.tensor([labels.index(id_map.get(i, i)) for i in labels])
            with torch.no_grad():
                slopes.copy_(slopes.index_select(0, src))
    for p in cmap.producers:  # readers: move input columns, BatchNorm statistics
        labels = p.inputs.tolist()
        if not any(i in id_map for i in labels):
            continue
        columns: dict[int, list[int]] = {}
        for position, i in enumerate(labels):
            columns.setdefault(i, []).append(position)
        src = list(range(len(labels)))
        for i, positions in columns.items():
            if i in id_map:
                for position, old in zip(positions, columns[id_map[i]], strict=True):
                    src[position] = old
        _permutable(p).permute_(p.module_in(model), inputs=torch.tensor(src))


def permute(model: nn.Module | LayerGraph, perms: Mapping[str, Sequence[int] | Tensor],
            input_shape: Sequence[int] | None = None) -> nn.Module:
    """A copy with the channels of layer ``name`` re-indexed: new c = old ``perms[name][c]``.

    Only layers of ``permutable_units`` can be permuted (InvalidParameterError otherwise);
    their BatchNorms and the layers reading them follow. The function is unchanged.
    """
    cmap = analyse(model, input_shape)
    units = {u.producer.name: u for u in permutable_units(cmap)}
    refuse_shared_parameters(cmap.graph.model, cmap.producers)
    out = writable_copy(cmap.graph.model)
    for name, perm in perms.items():
        if name not in units:
            raise InvalidParameterError(
                f"layer '{name}' cannot be permuted alone (tied, grouped or an output); "
                f"permutable: {sorted(units)}")
        index = torch.as_tensor(perm, dtype=torch.long)
        n = units[name].producer.neurons.numel()
        if sorted(index.tolist()) != list(range(n)):
            raise InvalidParameterError(f"perms['{name}'] must be a permutation of 0..{n - 1}")
        _apply_permutation(out, cmap, units[name], index)
    cmap.graph.bind(out)
    return out


# --------------------------------------------------------------------------- canonical forms
@dataclass(frozen=True)
class Canonical:
    """A canonical copy and, per permutable layer, the permutation that was applied."""

    model: nn.Module
    permutations: dict[str, Tensor]


def _sort_keys(model: nn.Module, cmap: ChannelMap, unit: Unit) -> Iterator[np.ndarray]:
    """Blocks of columns, one row per channel, the rows compared lexicographically across
    them: -bias of the layer and of its BatchNorms, -incoming weights, then -outgoing
    weights, sorted (they separate channels with equal incoming weights whatever the order
    of the readers' channels). Each block is made when asked: channels that the biases
    already tell apart never have their outgoing weights sorted."""
    p = unit.producer
    biases = [stored(q.module_in(model), "bias") for q in (p, *unit.carried)
              if q is p or not q.passthrough]
    columns = [b.detach().double()[:, None] for b in biases if b is not None]
    if columns:
        yield _rounded(torch.cat(columns, dim=1))
    weight = stored(p.module_in(model), "weight").detach().double()
    if _permutable(p).out_dim == 1:
        weight = weight.transpose(0, 1)
    yield _rounded(weight.reshape(weight.shape[0], -1))
    last = unit.carried[-1] if unit.carried and not unit.carried[-1].passthrough else p
    for reader in cmap.producers:
        if reader.diagonal or not torch.isin(reader.inputs, last.neurons).any():
            continue
        w = stored(reader.module_in(model), "weight").detach().double()
        w = w.transpose(0, 1) if _permutable(reader).out_dim == 0 else w
        yield _rounded(_outgoing(w, reader.inputs, last.neurons))


def _rounded(columns: Tensor) -> np.ndarray:
    """-columns, each divided by its largest magnitude and rounded to 9 digits: rounding
    noise must not decide between equal keys."""
    key = -columns.numpy()
    scale = np.maximum(np.abs(key).max(axis=0, keepdims=True), 1e-300) if key.size else 1.0
    return np.round(key / scale, 9)


def _lexicographic_order(blocks: Iterable[np.ndarray], n: int) -> np.ndarray:
    """``np.lexsort`` of the n rows made of the blocks side by side (the first column
    first, equal rows in index order), reading the columns one by one and only while some
    rows are still tied: each column refines the ranks of the rows tied so far."""
    order = np.arange(n)
    if n < 2:
        return order
    rank = np.zeros(n, dtype=np.int64)
    for block in blocks:
        for column in block.T:
            order = np.lexsort((column, rank))
            r, v = rank[order], column[order]
            rank[order] = np.concatenate(([0], np.cumsum((r[1:] != r[:-1])
                                                         | (v[1:] != v[:-1]))))
            if rank[order[-1]] == n - 1:  # every row told apart: later columns are moot
                return order
    return order


def _outgoing(weight: Tensor, inputs: Tensor, neurons: Tensor) -> Tensor:
    """One row per neuron: the weights that read it (``weight`` has input columns first,
    ``inputs[k]`` is the neuron column k reads), sorted in descending order: the readers'
    own channels are not canonical yet, so their order must not count."""
    order = torch.argsort(inputs, stable=True)
    ids, counts = torch.unique_consecutive(inputs[order], return_counts=True)
    if bool((counts == counts[0]).all()):  # every neuron read alike: one sort for all rows
        rows = weight[order].reshape(len(ids), -1).sort(dim=1, descending=True).values
        at = torch.searchsorted(ids, neurons).clamp(max=len(ids) - 1)
        read = ids[at] == neurons
        out = rows.new_zeros(len(neurons), rows.shape[1])
        out[read] = rows[at[read]]
        return out
    grouped = weight[order].reshape(len(order), -1).split(counts.tolist())
    by_id = dict(zip(ids.tolist(), grouped, strict=True))
    none = weight.new_zeros(0)  # a neuron this reader does not read
    rows = [by_id.get(i, none).reshape(-1).sort(descending=True).values
            for i in neurons.tolist()]
    return nn.utils.rnn.pad_sequence(rows, batch_first=True)  # unequal fan-outs: 0-padded


def canonicalize(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
                 normalized: bool = True, q: float = 2.0) -> Canonical:
    """Sort the neurons of every permutable layer, biases in descending order (slides).

    With ``normalized`` the parameters are first q-normalised (Alg. 3.2.1), which removes
    the rescaling symmetry, so that permuted and rescaled copies share one canonical form.
    Ties in the bias are broken by the BatchNorm biases, then the incoming weights, then
    the outgoing weights (lexicographically, descending). Layers are sorted in topological
    order, each after its inputs were. The model is not modified; its graph is traced
    once (or reused) and serves the copy too.
    """
    graph = graph_of(model, input_shape)
    if normalized:
        current = normalize(graph, None, q)
    else:
        current = writable_copy(graph.model)
        graph.bind(current)
    cmap = analyse(current, graph.input_shape)
    permutations = {}
    for unit in permutable_units(cmap):
        n = len(unit.producer.neurons)
        perm = torch.from_numpy(_lexicographic_order(_sort_keys(current, cmap, unit), n))
        _apply_permutation(current, cmap, unit, perm)
        permutations[unit.producer.name] = perm
    return Canonical(current, permutations)


@dataclass(frozen=True)
class Equivalence:
    """Whether two networks differ only by permutations and rescalings.

    ``parameter_gap``: largest |difference| of the canonical DAG parameters relative to the
    largest |parameter|; ``output_gap``: largest |R_a(x) - R_b(x)| on the samples.
    """

    equivalent: bool
    parameter_gap: float
    output_gap: float
    tolerance: float


def equivalent(model_a: nn.Module | LayerGraph, model_b: nn.Module | LayerGraph,
               input_shape: Sequence[int] | None = None, tolerance: float | None = None,
               samples: int = 16, seed: int = 0) -> Equivalence:
    """Decide functional equivalence up to permutations and rescalings (canonical forms equal
    up to ``tolerance``, relative), and report the output gap on N(0, 1) samples.

    ``tolerance`` None: 1e-6, or 4 units in the last place of a half-precision model's
    dtype (a rescaled float16 copy rounds every weight again: 3.9e-3; bfloat16 3.1e-2).

    Each model is traced once (or its graph reused). ArchitectureMismatchError when the
    models do not share one architecture.
    """
    if tolerance is not None:
        tolerance = check_number("tolerance", tolerance, 0.0)
    samples = check_count("samples", samples)
    graph_a = graph_of(model_a, input_shape)
    graph_b = graph_of(model_b, graph_a.input_shape)
    paired_parameters(graph_a, graph_b)  # same architecture
    if tolerance is None:
        tolerance = max(1e-6, *(4 * torch.finfo(g.dtype).eps for g in (graph_a, graph_b)))
    ca, cb = canonicalize(graph_a).model, canonicalize(graph_b).model
    pairs = paired_parameters(graph_of(ca, graph_a.input_shape), graph_of(cb, graph_a.input_shape))
    scale = max((float(a.double().abs().max()) for _, a, _ in pairs if a.numel()), default=0.0)
    gap = max((float((a.double() - b.double()).abs().max()) for _, a, b in pairs if a.numel()),
              default=0.0)
    relative = gap / scale if scale > 0 else gap
    check_samples(samples, graph_a.input_shape, "comparing the outputs", 4)
    shape = (samples, *graph_a.input_shape)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(graph_a.dtype)
    with torch.no_grad():
        out_gap = float((flat_outputs(graph_a.model(x), samples).double()
                         - flat_outputs(graph_b.model(x.to(graph_b.dtype)), samples).double()
                         ).abs().max())
    return Equivalence(relative <= tolerance, relative, out_gap, tolerance)
