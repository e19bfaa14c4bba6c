"""Rescaling symmetries lambda <> theta of ReLU networks (thesis Def. 2.4.1, Appendix E.1.2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError
from pathlift.graph import LayerGraph, writable_copy
from pathlift.graph.channels import ChannelMap, analyse
from pathlift.graph.factors import apply_all_, as_factors, refuse_shared_parameters


def diagonal_only(cmap: ChannelMap) -> set[int]:
    """Groups held by BatchNorm-like (diagonal) layers only: Appendix E.1.2 lets them
    follow the factor of their input instead of drawing their own."""
    held: set[int] = set()
    elsewhere: set[int] = set()  # groups a layer that is not diagonal holds too
    for p in cmap.producers:
        if not p.passthrough:
            groups = set(torch.unique(cmap.group[p.neurons]).tolist()) - {0}
            held |= groups
            if not p.diagonal:
                elsewhere |= groups
    return held - elsewhere


def factors_from_groups(cmap: ChannelMap, values: Tensor, given: Tensor) -> Tensor:
    """Per-id factors from per-group ``values``; groups not ``given`` get 1, except groups of
    BatchNorm channels only, which inherit the factor of their input (Appendix E.1.2)."""
    factor, known = values.tolist(), given.tolist()  # read and written one entry at a time
    factor[0], known[0] = 1.0, True
    inherit = diagonal_only(cmap)
    for p in cmap.producers:
        groups = cmap.group[p.neurons]
        todo = torch.nonzero(~given[groups]).flatten()
        if not len(todo):
            continue
        sources = cmap.group[p.inputs[todo]].tolist() if p.inputs.shape == p.neurons.shape \
            else [None] * len(todo)
        for g, source in zip(groups[todo].tolist(), sources, strict=True):
            if known[g]:
                continue
            factor[g] = factor[source] if g in inherit else 1.0
            known[g] = True
    return values.new_tensor(factor)[cmap.group]


def rescaled_copy(cmap: ChannelMap, grow: Tensor) -> nn.Module:
    """A copy of the analysed model with factors ``grow`` (per neuron id) applied, sharing
    its graph (no second trace)."""
    source = cmap.graph.model
    refuse_shared_parameters(source, cmap.producers)
    out = writable_copy(source)
    apply_all_(out, cmap.producers, grow, 1.0 / grow)
    _check_representable(source, out, cmap)
    cmap.graph.bind(out)
    return out


def _check_representable(source: nn.Module, out: nn.Module, cmap: ChannelMap) -> None:
    """InvalidParameterError naming the first layer whose rescaled parameters left the
    range of their dtype (a finite entry became inf, or a non-zero one 0): the copy would
    no longer compute the same function, and its path-norm would read as NaN weights."""
    for p in cmap.producers:
        module = source.get_submodule(p.name)  # a parametrized one computes its tensors
        for name, t in out.get_submodule(p.name).named_parameters():
            owner, _, leaf = name.rpartition(".")  # 'factors.0' of a KSLinear
            old = getattr(module.get_submodule(owner) if owner else module, leaf).detach()
            new = t.detach()
            if bool((torch.isfinite(old) & ~torch.isfinite(new)).any()) or \
                    bool(((old != 0) & (new == 0)).any()):
                raise InvalidParameterError(
                    f"rescaling takes '{p.name}.{name}' out of {new.dtype}'s range (entries "
                    "became inf or 0); use factors closer to 1, or a float64 model")


def rescale(model: nn.Module | LayerGraph, lambdas: Mapping[str, float | Sequence[float] | Tensor],
            input_shape: Sequence[int] | None = None) -> nn.Module:
    """A copy of ``model`` with the rescaling lambda <> theta applied (thesis Def. 2.4.1).

    ``lambdas`` maps a layer name (Linear, Conv, ConvTranspose, affine BatchNorm) to one
    positive factor per output channel (or one scalar for all): that channel's incoming
    weights and bias are multiplied by it, the weights reading it divided by it, through
    ReLU, pooling, flatten/reshape/permute and cat. A BatchNorm not named inherits the
    factor of its input channel, i.e. its running mean and bias are multiplied by it and
    its weight is unchanged (thesis Appendix E.1.2); named, it rescales as its own affine
    identity neuron. Channels tied by a residual addition must get equal factors, output
    channels (and channels tied to the input or an output) must keep 1; so must channels
    of a layer called several times where a call reads them (tied weights). The function
    and every path-norm are unchanged; the model itself is not modified.
    """
    cmap = analyse(model, input_shape)
    values = torch.ones(cmap.num_groups, dtype=torch.float64)
    given = torch.zeros(cmap.num_groups, dtype=torch.bool)
    names = {p.name: p for p in cmap.producers}
    for name, raw_values in lambdas.items():
        p = names.get(name)
        if p is None or p.passthrough:
            raise InvalidParameterError(
                f"'{name}' is not a rescalable layer; choose among {sorted(names)}")
        lam = as_factors(raw_values, p.neurons.numel(), name)
        if not (torch.isfinite(lam).all() and (lam > 0).all()):
            raise InvalidParameterError(f"factors of layer '{name}' must be positive and "
                                        "finite (ReLU is only positively homogeneous)")
        groups = cmap.group[p.neurons]
        for c, g in enumerate(groups.tolist()):
            value = float(lam[c])
            if g == 0 and value != 1.0:
                raise InvalidParameterError(
                    f"channel {c} of layer '{name}' is an output neuron or tied to an "
                    "output/the input by a residual addition; it cannot be rescaled")
            if given[g] and abs(values[g] - value) > 1e-12 * abs(value):
                raise InvalidParameterError(
                    f"channel {c} of layer '{name}' is tied (by a residual addition or a layer "
                    "called twice) to a "
                    f"channel given factor {float(values[g]):g}; tied channels share one factor")
            values[g], given[g] = value, True
    return rescaled_copy(cmap, factors_from_groups(cmap, values, given))


def random_rescale(model: nn.Module | LayerGraph, factors: Sequence[float] = (1.0, 128.0, 4096.0),
                   seed: int = 0, input_shape: Sequence[int] | None = None) -> nn.Module:
    """A copy of ``model`` under a random rescaling (thesis Appendix E.1.2).

    Every free hidden neuron group (a conv channel, a Linear unit, or channels tied by
    residual additions) gets a factor drawn uniformly from ``factors``; BatchNorm channels
    follow their input as in the thesis. The function and path-norms are unchanged, while
    magnitude-based criteria are not.
    """
    choices = torch.as_tensor(list(factors), dtype=torch.float64)
    if choices.numel() == 0 or not (torch.isfinite(choices).all() and (choices > 0).all()):
        raise InvalidParameterError(f"factors must be positive and finite, got {factors}")
    cmap = analyse(model, input_shape)
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(choices.numel(), (cmap.num_groups,), generator=generator)
    values = choices[draws]
    given = torch.ones(cmap.num_groups, dtype=torch.bool)
    for g in diagonal_only(cmap):
        given[g] = False
    return rescaled_copy(cmap, factors_from_groups(cmap, values, given))
