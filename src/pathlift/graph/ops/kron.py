"""``KSLinear`` (``pathlift.kron``): y = K_1 ⋯ K_L x + b with Kronecker-sparse factors. In the
DAG of thesis Def. 2.2.2 the factors are L layers of weights: the nonzeros of K_L connect
the inputs to a layer of identity neurons without bias, ..., those of K_1 connect the last
such layer to the outputs, which carry the bias. The |theta|^q network of Thm 3.1.1 is
then |K_1|^q ⋯ |K_L|^q x + |b|^q, computed factor by factor on the (a, b, c, d) storage
(never the dense product): a path through the factors is a path of the DAG, so the
path-norm is that of the network whose KSLinear layers are chains of dense Linear layers
holding the factors (``pathlift.kron.to_dense``), which equals the dense layer K_1 ⋯ K_L
where each entry of the product is reached by one path (Monarch, butterflies).

Supported: the |theta|^q pass (path-norms at every q, the path-lifting bound), the
Lipschitz bound, rescaling of the layer's output and input neurons (normalisation; the
identity neurons between factors are left as they are), the path-metric (its
coordinates: every factor entry and the bias) and so quantisation of the factors with a
certified error, and torch.nn.utils.prune masks on the factors
(``pathlift.prune.prune_factors`` scores them by path-magnitude). Permutation and the
neuron oracle refuse the layer with a typed error naming it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pathlift.errors import UnsupportedModelError
from pathlift.graph.boundary import assign_, param, stored
from pathlift.graph.ops.affine import (
    AffineHandler,
    Workspace,
    _scale_,
    abs_power,
    live_abs_power,
)
from pathlift.graph.ops.base import Call, register
from pathlift.kron.factor import to_dense
from pathlift.kron.layer import KSLinear
from pathlift.kron.multiply import ks_multiply
from pathlift.kron.pattern import KSPattern


def _factors(module: KSLinear) -> list[Tensor]:
    return [param(module.factors, str(i)) for i in range(len(module.patterns))]


def _split(flat: Tensor, module: KSLinear) -> list[Tensor]:
    """The factors of ``module``'s shapes, in order, from their entries one after the other."""
    shapes = [f.shape for f in module.factors]
    parts = flat.split([s.numel() for s in shapes])
    return [part.reshape(shape) for part, shape in zip(parts, shapes, strict=True)]


def _rows(p: KSPattern) -> Tensor:
    """Row (output) index of each entry [i, k, l, j] of a factor: (i b + k) d + j."""
    a, b, _, d = p.as_tuple()
    return ((torch.arange(a)[:, None, None, None] * b + torch.arange(b)[None, :, None, None])
            * d + torch.arange(d)[None, None, None, :])


def _cols(p: KSPattern) -> Tensor:
    """Column (input) index of each entry [i, k, l, j] of a factor: (i c + l) d + j."""
    a, _, c, d = p.as_tuple()
    return ((torch.arange(a)[:, None, None, None] * c + torch.arange(c)[None, None, :, None])
            * d + torch.arange(d)[None, None, None, :])


class KSLinearHandler(AffineHandler):
    """``pathlift.kron.KSLinear``: the chain of factors as layers of the DAG."""

    channel_dim = -1
    scored = False  # pruning scores one coordinate per weight of a Linear-like layer

    def apply(self, x: Tensor, weight: Tensor | list[Tensor], call: Call,
              bias: Tensor | None = None) -> Tensor:
        """The chain with the factors ``weight`` (a list, output factor first, or their
        entries flattened one after the other as ``live_magnitudes`` gives them) in place of
        the layer's, plus ``bias``: x K_L^T ⋯ K_1^T + bias on (..., N) inputs."""
        module: KSLinear = call.module
        if isinstance(weight, Tensor):  # the factors flattened one after the other
            weight = _split(weight, module)
        y = x.reshape(-1, module.in_features)
        for factor, pattern in reversed(list(zip(weight, module.patterns, strict=True))):
            y = ks_multiply(y, factor, pattern, "bmm")
        y = y.reshape(*x.shape[:-1], module.out_features)
        return y if bias is None else y + bias

    def weight_part(self, x: Tensor, q: float, call: Call, bias: Tensor | None = None,
                    workspace: Workspace | None = None, unit: float = 1.0) -> Tensor:
        """|K_1 / unit|^q |K_2|^q ⋯ |K_L|^q x (+ ``bias``): the caller's unit^q is carried
        once, by the output factor (as by the bias it scales alike)."""
        factors = _factors(call.module)
        magnitudes = [abs_power(f, q, x.dtype, unit=unit if i == 0 else 1.0)
                      for i, f in enumerate(factors)]
        return self.apply(x, magnitudes, call, bias)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x.amax(dim=-1, keepdim=True)  # a dense-support chain reads every input

    def dag_parameters(self, module: nn.Module) -> tuple[Tensor, Tensor | None]:
        """Every factor's entries (output factor first, flattened: several layers of the
        DAG, compared coordinate by coordinate) and the bias."""
        return torch.cat([f.reshape(-1) for f in _factors(module)]), param(module, "bias")

    def live_magnitudes(self, module: nn.Module, q: float, dtype: torch.dtype,
                        units: tuple[float, float] = (1.0, 1.0)
                        ) -> tuple[Tensor, Tensor | None]:
        """|K_1 / u|^q, |K_2|^q, ..., |K_L|^q flattened one after the other (what ``apply``
        takes, as ``weight_part`` carries the unit once) and |b / v|^q, differentiable in
        the factors and the bias."""
        factors = [param(module.factors, str(i), detach=False).to(dtype)
                   for i in range(len(module.patterns))]
        bias = param(module, "bias", detach=False)
        return (torch.cat([live_abs_power(f, q, units[0] if i == 0 else 1.0).reshape(-1)
                           for i, f in enumerate(factors)]),
                None if bias is None else live_abs_power(bias.to(dtype), q, units[1]))

    def magnitude_gradients(self, module: nn.Module, weight: Tensor, bias: Tensor | None,
                            q: float) -> list[tuple[str, Tensor | None]]:
        raise self._refuse(module, "magnitude gradients (Path-SGD scales) of its factors "
                                   "are not implemented")

    def rescale_(self, module: nn.Module, grow: Tensor, shrink: Tensor) -> None:
        """Output neuron v's incoming weights (row v of K_1, nonzeros only) and bias times
        grow[v]; the weights reading input i (column i of K_L) times shrink[i]. The
        identity neurons between factors are not rescaled (the function and every
        path-norm stay as they are). Float64 arithmetic."""
        first, last = module.patterns[0], module.patterns[-1]
        scale = {0: grow.to(torch.float64)[_rows(first)]}
        cols = shrink.to(torch.float64)[_cols(last)]
        end = len(module.patterns) - 1
        scale[end] = scale[end] * cols if end in scale else cols
        for index, factor in scale.items():
            _scale_(stored(module.factors, str(index)), factor)
        bias = stored(module, "bias")
        if bias is not None:
            _scale_(bias, grow.to(torch.float64))

    def permute_(self, module: nn.Module, outputs: Tensor | None = None,
                 inputs: Tensor | None = None) -> None:
        raise self._refuse(module, "permuting its neurons is not implemented")

    def quantizable(self, module: nn.Module) -> list[tuple[str, Tensor, int | None]]:
        """Each factor ("factors.<i>", one step per factor) and the bias."""
        out: list[tuple[str, Tensor, int | None]] = [
            (f"factors.{i}", f, None) for i, f in enumerate(_factors(module))]
        return out + ([("bias", module.bias.detach(), None)] if module.bias is not None
                      else [])

    def write_quantized_(self, module: nn.Module, values: dict[str, Tensor]) -> None:
        for name, value in values.items():
            owner, _, leaf = name.rpartition(".")
            assign_(module.get_submodule(owner) if owner else module, leaf, value)

    def incoming_rows(self, module: nn.Module) -> Tensor:
        """Per output neuron its incoming weights (row of K_1, zeros where no edge) and
        bias, float64."""
        rows = to_dense(_factors(module)[0].to(torch.float64), module.patterns[0])
        bias = module.bias
        return rows if bias is None else torch.cat(
            [rows, bias.detach().to(torch.float64)[:, None]], dim=1)

    def entry_channels(self, module: nn.Module) -> tuple[Tensor, Tensor]:
        raise self._refuse(module, "its weights are not one (out, in) matrix")

    def in_channels(self, module: nn.Module) -> int:
        return module.in_features

    def _refuse(self, module: nn.Module, why: str) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"KSLinear {module.extra_repr()}: {why}; path-norms and Lipschitz bounds are "
            "supported. Densify it for the rest: replace it by nn.Linear with weight "
            "layer.to_dense() and its bias")


register(KSLinearHandler("KSLinear"), modules=[KSLinear])
