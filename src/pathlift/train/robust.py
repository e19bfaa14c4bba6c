"""Training toward the compression certificate (``pathlift.bounds.compression``): a loss on
the margin every network of a box of parameters around the current one is certain to
have, so that a coarser quantisation of the trained network keeps its margins.

``box_robust_loss(model, shape, x, y, relative)`` encloses, by the differentiable version
of the interval pass of ``pathlift.bounds.box``, the outputs of every theta' with
|theta'_i - theta_i| <= relative * max_j |theta_j| (max over theta_i's tensor, the scale
the certificate's steps are set from), and returns the cross-entropy of the worst-case
logits: z_y = 0, z_c = -(lower bound of the margin against c) (Gowal et al. 2018's
interval bound propagation, here over parameters instead of inputs). At relative = 0 it
is the plain cross-entropy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pathlift.bounds.box import Interval, box_margins
from pathlift.errors import UnsupportedModelError
from pathlift.graph import LayerGraph, graph_of
from pathlift.graph.boundary import mask

__all__ = ["box_robust_loss", "live_boxes"]


def live_boxes(graph: LayerGraph, model: nn.Module, relative: float
               ) -> dict[str, dict[str, Interval]]:
    """{layer: {"weight"/"bias": Interval(live value, relative * max |value|)}} for every
    layer with parameters, differentiable in the model's parameters (BatchNorm: its
    affine pair (a, c), running statistics constant)."""
    boxes: dict[str, dict[str, Interval]] = {}
    for node in graph.parametric_nodes():
        module = model.get_submodule(node.target)
        handler = graph.handler(node)
        if handler.derived:  # the op's (a, c), differentiable in its stored parameters
            values = dict(zip(("weight", "bias"), handler.live_parameters(module, None),
                              strict=True))
        else:
            names = {n.removesuffix("_orig") for n, _ in module.named_parameters(recurse=False)}
            if names - {"weight", "bias"}:
                raise UnsupportedModelError(f"'{node.target}': box-robust training supports "
                                            "layers with a weight and a bias only")
            values = {n: getattr(module, n) for n in sorted(names)}  # masks applied
        boxes[node.target] = {name: Interval(v, relative * v.detach().abs().max()
                                             * _free(module, name, v))
                              for name, v in values.items()}
    return boxes


def _free(module: nn.Module, name: str, value: Tensor) -> Tensor:
    """1 where the coordinate may move, 0 where a pruning mask holds it at 0 (the
    certificate codes such a coordinate as exactly 0, a box of width 0)."""
    held = mask(module, name)
    return torch.ones_like(value) if held is None else (held != 0).to(value.dtype)


def box_robust_loss(model: nn.Module, input_shape: Sequence[int], x: Tensor, y: Tensor,
                    relative: float) -> Tensor:
    """Mean cross-entropy of the worst-case logits over the box of relative radius
    ``relative`` around the model's current parameters (module docstring); differentiable
    in them. The model's forward mode is used as is (put BatchNorm in eval mode)."""
    graph = graph_of(model, input_shape)
    boxes = live_boxes(graph, model, relative)
    lower = box_margins(graph, None, x, y, boxes, per_class=True)
    worst = -lower.scatter(1, y.reshape(-1, 1), 0.0)
    return F.cross_entropy(worst, y)
