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

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError
from pathlift.graph import trace
from pathlift.graph.channels import (
    BATCHNORM,
    CONV_TRANSPOSE,
    ChannelMap,
    Producer,
    analyse,
    resolve_input_shape,
)
from pathlift.graph.factors import raw
from pathlift.graph.normalize import normalize
from pathlift.lift.path_metric import paired_parameters


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
    groups = cmap.group[p.neurons]
    if (groups == 0).any():
        return False
    counts = torch.bincount(cmap.group, minlength=cmap.num_groups)
    return bool((counts[groups] == 1).all())


def permutable_units(cmap: ChannelMap) -> list[Unit]:
    """Producers whose channels can be re-indexed alone (topological order).

    Every channel must be a free, untied neuron, read only by Linear, Conv or ConvTranspose
    layers without groups, or by BatchNorms whose own channels satisfy the same (they are
    permuted along). Channels tied by residual sums, depthwise convs and outputs are not.
    """
    readers: dict[int, list[Producer]] = {}
    for p in cmap.producers:
        for i in torch.unique(p.inputs).tolist():
            readers.setdefault(i, []).append(p)
    units = []
    for p in cmap.producers:
        if p.kind == BATCHNORM or p.groups != 1 or not _single_free(cmap, p):
            continue
        carried: list[Producer] = []
        frontier, ok = [p], True
        while frontier and ok:
            current = frontier.pop()
            for r in {r.name: r for i in current.neurons.tolist()
                      for r in readers.get(i, ())}.values():
                if r.kind == BATCHNORM:
                    own = r.neurons is not r.inputs
                    if not torch.equal(r.inputs, current.neurons) or (
                            own and not _single_free(cmap, r)):
                        ok = False
                    elif r.neurons is not r.inputs:
                        carried.append(r)
                        frontier.append(r)
                    else:
                        carried.append(r)
                elif r.groups != 1:
                    ok = False
        if ok:
            units.append(Unit(p, tuple(carried)))
    return units


def _apply_permutation(model: nn.Module, cmap: ChannelMap, unit: Unit, perm: Tensor) -> None:
    """New channel c of the unit = old channel perm[c], readers' columns moved to match."""
    id_map: dict[int, int] = {}
    for p in (unit.producer, *unit.carried):
        old = p.neurons.tolist()
        id_map.update({old[c]: old[int(perm[c])] for c in range(len(old))})
        if p is not unit.producer and p.neurons is p.inputs:
            continue
        module = model.get_submodule(p.name)
        dim = 1 if p.kind == CONV_TRANSPOSE else 0
        for name in ("weight", "bias"):
            t = raw(module, name)
            if t is not None:
                with torch.no_grad():
                    t.copy_(t.index_select(dim if name == "weight" else 0, perm))
            mask = getattr(module, name + "_mask", None)
            if mask is not None:
                mask.copy_(mask.index_select(dim if name == "weight" else 0, perm))
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
        index = torch.tensor(src)
        module = model.get_submodule(p.name)
        if p.kind == BATCHNORM:
            with torch.no_grad():
                for name in ("running_mean", "running_var"):
                    buf = getattr(module, name)
                    buf.copy_(buf.index_select(0, index))
            continue
        weight = raw(module, "weight")
        dim = 0 if p.kind == CONV_TRANSPOSE else 1
        with torch.no_grad():
            weight.copy_(weight.index_select(dim, index))
        mask = getattr(module, "weight_mask", None)
        if mask is not None:
            mask.copy_(mask.index_select(dim, index))


def permute(model: nn.Module, perms: Mapping[str, Sequence[int] | Tensor],
            input_shape: Sequence[int] | None = None) -> nn.Module:
    """A copy with the channels of layer ``name`` re-indexed: new c = old ``perms[name][c]``.

    Only layers of ``permutable_units`` can be permuted (InvalidParameterError otherwise);
    their BatchNorms and the layers reading them follow. The function is unchanged.
    """
    cmap = analyse(model, input_shape)
    units = {u.producer.name: u for u in permutable_units(cmap)}
    out = copy.deepcopy(model)
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
    return out


# --------------------------------------------------------------------------- canonical forms
@dataclass(frozen=True)
class Canonical:
    """A canonical copy and, per permutable layer, the permutation that was applied."""

    model: nn.Module
    permutations: dict[str, Tensor]


def _sort_key(model: nn.Module, cmap: ChannelMap, unit: Unit) -> np.ndarray:
    """Rows, one per channel, compared lexicographically: -bias of the layer and of its
    BatchNorms, -incoming weights, then -outgoing weights (which separate channels with
    equal incoming weights)."""
    p = unit.producer
    module = model.get_submodule(p.name)
    weight = raw(module, "weight").detach().double()
    if p.kind == CONV_TRANSPOSE:
        weight = weight.transpose(0, 1)
    biases = [raw(model.get_submodule(q.name), "bias") for q in (p, *unit.carried)
              if q is p or q.neurons is not q.inputs]
    columns = [b.detach().double()[:, None] for b in biases if b is not None]
    columns.append(weight.reshape(weight.shape[0], -1))
    last = unit.carried[-1] if unit.carried and unit.carried[-1].neurons is not \
        unit.carried[-1].inputs else p
    for reader in cmap.producers:
        if reader.kind == BATCHNORM or not torch.isin(reader.inputs, last.neurons).any():
            continue
        w = raw(model.get_submodule(reader.name), "weight").detach().double()
        w = w.transpose(0, 1) if reader.kind != CONV_TRANSPOSE else w
        rows = [w[reader.inputs == i].reshape(-1) for i in last.neurons.tolist()]
        columns.append(torch.stack(rows))
    key = -torch.cat(columns, dim=1).numpy()
    scale = np.maximum(np.abs(key).max(axis=0, keepdims=True), 1e-300)
    return np.round(key / scale, 9)  # rounding noise must not decide between equal keys


def canonicalize(model: nn.Module, input_shape: Sequence[int] | None = None,
                 normalized: bool = True, q: float = 2.0) -> Canonical:
    """Sort the neurons of every permutable layer, biases in descending order (slides).

    With ``normalized`` the parameters are first q-normalised (Alg. 3.2.1), which removes
    the rescaling symmetry, so that permuted and rescaled copies share one canonical form.
    Ties in the bias are broken by the BatchNorm biases, then the incoming weights, then
    the outgoing weights (lexicographically, descending). Layers are sorted in topological
    order, each after its inputs were. The model is not modified.
    """
    shape = resolve_input_shape(model, input_shape)
    current = normalize(model, shape, q) if normalized else copy.deepcopy(model)
    cmap = analyse(current, shape)
    permutations = {}
    for unit in permutable_units(cmap):
        key = _sort_key(current, cmap, unit)
        perm = torch.from_numpy(np.lexsort(key.T[::-1]).copy())
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


def equivalent(model_a: nn.Module, model_b: nn.Module, input_shape: Sequence[int],
               tolerance: float = 1e-6, samples: int = 16, seed: int = 0) -> Equivalence:
    """Decide functional equivalence up to permutations and rescalings (canonical forms equal
    up to ``tolerance``, relative), and report the output gap on N(0, 1) samples.

    ArchitectureMismatchError when the models do not share one architecture.
    """
    shape = tuple(input_shape)
    paired_parameters(trace(model_a, shape), trace(model_b, shape))  # same architecture
    ca = canonicalize(model_a, shape).model
    cb = canonicalize(model_b, shape).model
    pairs = paired_parameters(trace(ca, shape), trace(cb, shape))
    scale = max((float(a.double().abs().max()) for _, a, _ in pairs if a.numel()), default=0.0)
    gap = max((float((a.double() - b.double()).abs().max()) for _, a, b in pairs if a.numel()),
              default=0.0)
    relative = gap / scale if scale > 0 else gap
    dtype = next((t.dtype for t in (*model_a.parameters(), *model_a.buffers())
                  if t.is_floating_point()), torch.float32)
    x = torch.randn((samples, *shape), generator=torch.Generator().manual_seed(seed)).to(dtype)
    with torch.no_grad():
        out_gap = _max_gap(model_a(x), model_b(x))
    return Equivalence(relative <= tolerance, relative, out_gap, tolerance)


def _max_gap(a, b) -> float:
    if isinstance(a, Tensor):
        return float((a - b).abs().max())
    return max(_max_gap(u, v) for u, v in zip(a, b, strict=True))
