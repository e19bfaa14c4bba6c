"""Layers with parameters: Linear, Conv, ConvTranspose and eval BatchNorm (thesis Def. 2.2.2:
identity neurons with weights and a bias; a convolution is a weight-shared fully connected
layer, an eval BatchNorm the affine neuron x*a + c).

``AffineHandler`` implements, for such layers, the protocol each pass declares next to
itself: the |theta|^q pass (``pathlift.graph.abs_pow.AbsPowLayer``: ``units``,
``weight_part``, ``bias``), the differentiable pass (``pathlift.lift.differentiable.
LiveLayer``: ``apply``, ``live_magnitudes``, ``magnitude_gradients``), rescaling
(``pathlift.graph.factors.RescalableLayer``: ``in_channels``, ``incoming_rows``,
``rescale_``), the channel analysis (``pathlift.graph.channels.ChannelLayer``: ``groups``,
``own_neurons``), and what the passes outside ``graph``/``lift`` ask (``permute_``,
``quantizable``, ``write_quantized_``, ``entry_channels``, ``dag_parameters``).
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from pathlift.errors import UnsupportedModelError
from pathlift.graph.boundary import assign_, mask, param, stored
from pathlift.graph.ops.base import (
    INPUT,
    MODULES,
    Call,
    Handler,
    Kind,
    Lowered,
    Operand,
    Parametric,
    lower,
    register,
    value_range,
)
from pathlift.graph.ops.pooling import window_max


class Workspace:
    """Scratch memory that the |W|^q of every layer reuses in turn (the pass of Thm 3.1.1).

    On CPU a fresh tensor the size of a layer's weights costs page faults, and a
    convolution with a freshly allocated weight runs several times slower than with a
    reused one, so |W|^q is written into one buffer, reused from pass to pass.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._buffer: Tensor | None = None

    def take(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tensor:
        """An uninitialised tensor of ``shape`` inside the buffer (grown when needed)."""
        numel = math.prod(shape)
        buffer = self._buffer
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype \
                or buffer.device != device:
            buffer = self._buffer = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)


def abs_power(t: Tensor, q: float, dtype: torch.dtype, workspace: Workspace | None = None,
              unit: float = 1.0) -> Tensor:
    """|t / unit|^q in ``dtype``, detached: in the workspace if given, else in one fresh
    tensor (``unit`` keeps |t|^q in range for large q: the caller carries unit^q)."""
    source = t.detach()
    if workspace is not None:
        magnitude = workspace.take(source.shape, dtype, source.device)
    else:
        magnitude = torch.empty_like(source, dtype=dtype, memory_format=torch.contiguous_format)
    scaled_copy_(magnitude, source, unit)
    return magnitude if q == 1 else magnitude.pow_(q)


def live_abs_power(t: Tensor, q: float, unit: float = 1.0) -> Tensor:
    """|t / unit|^q in the autograd graph of ``t``, with the fewest autograd nodes: |t| for
    q = 1, t*t for q = 2 (no division for unit 1)."""
    if unit != 1.0:
        t = t / unit
    if q == 1:
        return t.abs()
    return t.square() if q == 2 else t.abs().pow(q)


def scaled_copy_(out: Tensor, source: Tensor, unit: float = 1.0) -> Tensor:
    """out <- |source / unit|, the division rounded once in the wider of the two dtypes:
    after the cast when ``out`` is as wide as ``source`` (a float32 weight divided in
    float32 would cost a float64 path-norm ~1e-8), before it otherwise (a float64 weight
    cast to float32 first could overflow)."""
    if unit == 1.0:  # one pass over the memory when no cast is needed
        return torch.abs(source, out=out) if out.dtype == source.dtype else \
            out.copy_(source).abs_()
    if torch.finfo(out.dtype).bits < torch.finfo(source.dtype).bits:
        return out.copy_(source / unit).abs_()
    return out.copy_(source).div_(unit).abs_()
#: |t|^q is taken as it is while max |t| lies within 2^(+-16) of 1; beyond, divided first.
_UNIT_BAND = 16


def unit_of(t: Tensor | None, exact: bool = False) -> float:
    """The unit u in which a layer's |t|^q enters the pass, as |t / u|^q with u^q carried in
    log space (Thm 3.1.1 on any finite float: |t|^q alone leaves float64 beyond |t| ~
    1e+-154 at q = 2, and subnormals have lost their precision).

    ``exact``: u is the largest |t_i| (the largest entry becomes 1, for large q). Else u
    is the power of two 2^(e-1) <= max |t| < 2^e when max |t| lies outside 2^(+-16) (so the
    division is exact, subnormals included), and 1 inside, where |t|^q needs no help. u = 1
    for an empty, all-zero or non-finite t (whose values the caller checks).
    """
    return unit_of_peak(peak_of(t), exact)


def peak_of(t: Tensor | None) -> float:
    """max |t| (0 for None or an empty t), read without a copy of |t|."""
    if t is None or not t.numel():
        return 0.0
    low, high = value_range(t)  # one pass over t
    return max(-low, high)


def unit_of_peak(peak: float, exact: bool = False) -> float:
    """``unit_of`` of a tensor whose largest |t_i| is ``peak`` (a sharded layer's peak is
    the largest of its ranks')."""
    if not (0.0 < peak < math.inf):
        return 1.0
    if exact:
        return peak
    exponent = math.frexp(peak)[1]
    return 1.0 if abs(exponent) <= _UNIT_BAND else math.ldexp(1.0, exponent - 1)


# A module's units with the state of its tensors they were found on.
_UNITS: weakref.WeakKeyDictionary[nn.Module, tuple[list[tuple], tuple[float, float]]] = \
    weakref.WeakKeyDictionary()


def _tensor_state(module: nn.Module) -> list[tuple] | None:
    """Each parameter and buffer of ``module`` (its own and its children's) as (itself,
    storage, version): an in-place update, an optimiser step or an assignment changes
    one of them. None when a tensor keeps no version (inference mode)."""
    tensors = itertools.chain(module.parameters(), module.buffers()) if module._modules \
        else itertools.chain(module._parameters.values(), module._buffers.values())
    try:  # a leaf layer's own tables directly: this runs for every layer of every pass
        return [(weakref.ref(t), t.data_ptr(), t._version) for t in tensors if t is not None]
    except RuntimeError:
        return None


def _known_units(module: nn.Module, exact: bool) -> tuple[list[tuple] | None,
                                                         tuple[float, float] | None]:
    """(the state of the module's tensors, its units kept for that state or None); no
    state (nothing kept) for exact units or tensors without versions."""
    state = None if exact else _tensor_state(module)
    kept = _UNITS.get(module)
    if kept is not None and state is not None and _same(kept[0], state):
        return state, kept[1]
    return state, None


def _remember_units(module: nn.Module, state: list[tuple] | None,
                    found: tuple[float, float]) -> None:
    if state is not None:
        _UNITS[module] = (state, found)


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(x[0]() is y[0]() and x[1:] == y[1:]
                                    for x, y in zip(a, b, strict=True))


def channel_view(v: Tensor, ndim: int) -> Tensor:
    return v.reshape((1, -1) + (1,) * (ndim - 2)) if ndim > 1 else v


class AffineHandler(Parametric, Handler):
    """Layers with parameters: y = W x + b, one output channel per neuron group.

    ``channel_dim`` is the activation dim holding channels (-1 for Linear), ``out_dim``
    the weight dim holding output channels (the other of dims 0, 1 holds the input
    channels of a group). ``scored``: its weights and bias are coordinates of theta that
    pruning may zero. Everything pathlift does to a layer's parameters (the |theta|^q
    pass, rescaling, normalisation, permutation, quantisation) asks these methods.
    ``scales_rows``: ``magnitude`` gives the whole |W/u|^q with output channels along dim
    0, which ``apply`` takes, so a following diagonal op (eval BatchNorm) can enter the
    |theta|^q pass folded into its rows (``AbsPowInterpreter``).
    """

    kind = Kind.AFFINE
    creates_neurons = True
    family = "layers"
    channel_dim = 1
    out_dim = 0
    diagonal = False
    scored = True
    live = True
    scales_rows = False
    layer_on_path = True
    absorbs_folds = True

    # ---- the |theta|^q network (Thm 3.1.1)
    def prepare(self, modules: Sequence[nn.Module]) -> None:
        """Compute at once, for several layers of this handler, what a |theta|^q pass
        will ask of each (it fills the caches the other methods read): nothing by
        default; eval BatchNorm folds all its modules in one batch (``fold_batchnorms``)."""

    def magnitude(self, module: nn.Module, q: float, dtype: torch.dtype,
                  workspace: Workspace | None = None, unit: float = 1.0) -> Tensor:
        """|W / unit|^q: the layer's weight in the |theta|^q network (Thm 3.1.1), a fresh
        tensor or one inside ``workspace``."""
        return abs_power(param(module, "weight"), q, dtype, workspace, unit)

    def units(self, module: nn.Module, exact: bool = False) -> tuple[float, float]:
        """(u_W, u_b): the layer enters the |theta|^q pass as |W / u_W|^q and |b / u_b|^q,
        each unit that of its own tensor (``unit_of``), so that a bias far from the
        weights' scale keeps its precision. Powers of two are kept per module until one
        of its tensors changes (a repeated pass reads no weight twice)."""
        state, found = _known_units(module, exact)
        if found is None:
            weight, bias = self.dag_parameters(module)
            found = unit_of(weight, exact), unit_of(bias, exact)
            _remember_units(module, state, found)
        return found

    def magnitude_in_units(self, module: nn.Module, q: float, dtype: torch.dtype,
                           workspace: Workspace | None = None, exact: bool = False
                           ) -> tuple[Tensor, tuple[float, float]]:
        """(``magnitude`` in the layer's ``units``, the units), for a layer whose DAG
        weight is its ``weight``. Where the units are not known yet and ``dtype`` is at
        least as wide as the weight, the peak of |W| is read from the copy just made, as
        |W|/u = |W/u| bit for bit: a first pass reads W once, not twice."""
        state, found = _known_units(module, exact)
        weight = param(module, "weight")
        if found is not None or torch.finfo(dtype).bits < torch.finfo(weight.dtype).bits:
            found = found or self.units(module, exact)
            return self.magnitude(module, q, dtype, workspace, found[0]), found
        magnitude = abs_power(weight, 1.0, dtype, workspace)
        unit = unit_of_peak(float(magnitude.amax()) if magnitude.numel() else 0.0, exact)
        if unit != 1.0:
            magnitude.div_(unit)
        found = unit, unit_of(param(module, "bias"), exact)
        _remember_units(module, state, found)
        return (magnitude if q == 1 else magnitude.pow_(q)), found

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        """The layer's linear map with ``weight`` in place of W, plus ``bias`` if given."""
        raise NotImplementedError

    def as_products(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
                    ) -> Tensor | None:
        """``apply`` as matrix products: each output one dot product of W's entries with
        its inputs (plus the bias), so that its floating-point error obeys the classical
        |fl(W x + b) - (W x + b)| <= gamma_(k+1) (|W| |x| + |b|) in any summation order
        (Higham, Thm 3.1); None where not written (a convolution library may use
        Winograd or FFT algorithms, which do not)."""
        return None

    def weight_part(self, x: Tensor, q: float, call: Call, bias: Tensor | None = None,
                    workspace: Workspace | None = None, unit: float = 1.0) -> Tensor:
        """|W / unit|^q x (+ ``bias``, one entry per output channel), |W / unit|^q in
        ``workspace``."""
        return self.apply(x, self.magnitude(call.module, q, x.dtype, workspace, unit), call,
                          bias)

    def live_magnitudes(self, module: nn.Module, q: float, dtype: torch.dtype,
                        units: tuple[float, float] = (1.0, 1.0)
                        ) -> tuple[Tensor, Tensor | None]:
        """(|W/u|^q, |b/v|^q) as ``apply`` takes them, in ``dtype``, differentiable in the
        module's parameters (the differentiable pass, ``pathlift.lift.differentiable``);
        (u, v) = ``units``."""
        weight, bias = self.live_parameters(module, dtype)
        return (live_abs_power(weight, q, units[0]),
                None if bias is None else live_abs_power(bias, q, units[1]))

    def live_parameters(self, module: nn.Module, dtype: torch.dtype
                        ) -> tuple[Tensor, Tensor | None]:
        """(W, b) of the layer's DAG neurons in ``dtype``, in the autograd graph of its
        parameters (pruning masks applied)."""
        weight, bias = param(module, "weight", detach=False), param(module, "bias", detach=False)
        return weight.to(dtype), None if bias is None else bias.to(dtype)

    def magnitude_gradients(self, module: nn.Module, weight: Tensor, bias: Tensor | None,
                            q: float) -> list[tuple[str, Tensor | None]]:
        """(stored parameter name, d||Phi||_q^q / d|p|^q) from the gradients ``weight`` and
        ``bias`` of the pass in |W|^q and |b|^q (``live_magnitudes``), one per parameter;
        a parameter that is no coordinate of ||Phi||_q^q is left out."""
        return [("weight", weight), ("bias", bias)]

    def bias(self, module: nn.Module) -> Tensor | None:
        """The bias vector b (one entry per output channel), or None."""
        return param(module, "bias")

    def row_split(self, module: nn.Module) -> str | None:
        """What the rows of the weight are in the layer's map, when they are split across
        ranks (dim-0 shards, ``pathlift.graph.sharded``): "outputs" (output channels:
        Linear, Conv), "inputs" (input channels: ConvTranspose), or None when a row mixes
        both (grouped convolutions) or the layer is not a channel matrix (BatchNorm): its
        parameters are then gathered whole."""
        if self.diagonal or self.groups(module) != 1:
            return None
        return "outputs" if self.out_dim == 0 else "inputs"

    # ---- the layer as DAG parameters (Def. 2.2.2)
    def dag_parameters(self, module: nn.Module) -> tuple[Tensor, Tensor | None]:
        """(weights, bias) of the layer's neurons in the DAG of Def. 2.2.2."""
        return param(module, "weight"), self.bias(module)

    def groups(self, module: nn.Module) -> int:
        return getattr(module, "groups", 1)

    def own_neurons(self, module: nn.Module) -> bool:
        """Whether its output channels are neurons of their own (rescalable)."""
        return True

    def entry_channels(self, module: nn.Module) -> tuple[Tensor, Tensor]:
        """For weight entry [i, j, ...]: its (output-channel, input-channel) indices, as two
        grids that broadcast to weight.shape[:2] (groups of a convolution included)."""
        weight = param(module, "weight")
        a, b = weight.shape[0], weight.shape[1]
        major = torch.arange(a)[:, None]
        g = self.groups(module)
        minor = torch.arange(b)[None, :] if g == 1 else (major // (a // g)) * b + torch.arange(b)
        return (major, minor) if self.out_dim == 0 else (minor, major)

    def in_channels(self, module: nn.Module) -> int:
        """Number of input channels (features of a Linear layer) the layer reads."""
        shape = param(module, "weight").shape
        return shape[1] * self.groups(module) if self.out_dim == 0 else shape[0]

    def incoming_rows(self, module: nn.Module) -> Tensor:
        """One float64 row per output channel: its incoming weights (every kernel entry),
        then its bias: the vector (theta^{->v}, b_v) of Alg. 3.2.1."""
        weight = param(module, "weight").to(torch.float64)
        if self.out_dim == 1:  # (in, out/groups, k...) -> (out, in/groups * k)
            g = self.groups(module)
            weight = weight.reshape(g, weight.shape[0] // g, weight.shape[1], -1)
            weight = weight.permute(0, 2, 1, 3).reshape(g * weight.shape[2], -1)
        else:
            weight = weight.reshape(weight.shape[0], -1)
        bias = self.bias(module)
        if bias is None:
            return weight
        return torch.cat([weight, bias.to(torch.float64)[:, None]], dim=1)

    # ---- transformations of the parameters, in place on a copy
    def rescale_(self, module: nn.Module, grow: Tensor, shrink: Tensor) -> None:
        """Incoming weights and bias of output channel c times grow[c]; weights reading
        input channel i times shrink[i] (Def. 2.4.1 with shrink = 1/grow; Alg. 3.2.1 also
        uses shrink = 0 for an input-dead neuron). Float64 arithmetic."""
        rows, cols = self.entry_channels(module)
        weight = stored(module, "weight")
        step = max(1, _BLOCK_BYTES // (8 * weight[0].numel()))  # float64 rows per block
        for start in range(0, weight.shape[0], step):  # never a float64 copy of W whole
            part = slice(start, start + step)
            factor = grow[rows[part] if len(rows) > 1 else rows] * \
                shrink[cols[part] if len(cols) > 1 else cols]
            block = weight[part]
            _scale_(block, factor.reshape(factor.shape + (1,) * (block.dim() - 2)))
        bias = stored(module, "bias")
        if bias is not None:
            _scale_(bias, grow)

    def permute_(self, module: nn.Module, outputs: Tensor | None = None,
                 inputs: Tensor | None = None) -> None:
        """New output channel c = old ``outputs[c]``; new input column i reads old column
        ``inputs[i]`` (layers without groups). Pruning masks move along."""
        for name, dim, index in (("weight", self.out_dim, outputs),
                                 ("weight", 1 - self.out_dim, inputs), ("bias", 0, outputs)):
            if index is None:
                continue
            for t in (stored(module, name), mask(module, name)):
                if t is not None:
                    with torch.no_grad():
                        t.copy_(t.index_select(dim, index))

    def quantizable(self, module: nn.Module) -> list[tuple[str, Tensor, int | None]]:
        """(name, effective value, per-channel dim) of every tensor quantisation rounds."""
        out = [("weight", param(module, "weight"), self.out_dim)]
        bias = param(module, "bias")
        return out + ([("bias", bias, None)] if bias is not None else [])


def _scale_(tensor: Tensor, factor: Tensor) -> None:
    with torch.no_grad():
        tensor.copy_((tensor.to(torch.float64) * factor).to(tensor.dtype))


class LinearHandler(AffineHandler):
    channel_dim = -1
    scales_rows = True
    dense_rows = True

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        return F.linear(x, weight, bias)

    as_products = apply  # one matrix product

    def weight_part(self, x: Tensor, q: float, call: Call, bias: Tensor | None = None,
                    workspace: Workspace | None = None, unit: float = 1.0) -> Tensor:
        """|W / unit|^q x by blocks of rows of W, each made non-negative in a cache-sized
        buffer: a large classifier is read once, never copied whole."""
        weight = param(call.module, "weight")
        rows = max(1, _BLOCK_BYTES // (weight.shape[1] * x.element_size()))
        if rows >= weight.shape[0]:
            return super().weight_part(x, q, call, bias, workspace, unit)
        out = x.new_empty((*x.shape[:-1], weight.shape[0]))
        buffer = (workspace or Workspace()).take((rows, weight.shape[1]), x.dtype, x.device)
        for start in range(0, weight.shape[0], rows):
            block = weight[start:start + rows]
            part = buffer[:len(block)]
            scaled_copy_(part, block, unit)
            if q != 1:
                part.pow_(q)
            torch.matmul(x, part.t(), out=out[..., start:start + len(block)])
        return out if bias is None else out.add_(bias)

    def rank_one_input(self, x: Tensor) -> Tensor | None:
        rows = x.reshape(-1, x.shape[-1])
        return rows.reshape(-1).detach() if rows.shape[0] == 1 else None

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x.amax(dim=-1, keepdim=True)  # every output reads every input feature


class MatmulHandler(AffineHandler):
    """y = x W + b with W stored (in, out): ``x @ self.weight`` or ``einsum("bi,io->bo")``
    over a module's own weight, the transpose of a Linear layer (output channels along
    dim 1 of W)."""

    channel_dim = -1
    out_dim = 1

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        y = torch.matmul(x, weight)
        return y if bias is None else y + bias

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x.amax(dim=-1, keepdim=True)


_BLOCK_BYTES = 1 << 20  # a block of |W| that stays in the L2 cache


class ConvHandler(AffineHandler):
    scales_rows = True

    def traced_through(self, module: nn.Module) -> bool:
        """``padding_mode`` reflect, replicate or circular: torch's ``_conv_forward`` is
        ``F.pad(mode=...)`` (copies of weight 1, identity neurons of Def. 2.2.2) and the
        convolution over its own weight unpadded, read as those two ops, so that each
        kernel entry stays an edge of its own."""
        return getattr(module, "padding_mode", "zeros") != "zeros"

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        return call.module._conv_forward(x, weight, bias)

    def as_products(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
                    ) -> Tensor | None:
        """A convolution without groups as one matrix product of W with the windows of x
        (channels last, zero-padded and unfolded: exact copies, each window's entries
        side by side); None with groups, string padding, or a ``_conv_forward`` of the
        module's own (what ``apply`` runs)."""
        m = call.module
        dims = x.dim() - 2
        if m.groups != 1 or isinstance(m.padding, str) or \
                getattr(type(m), "_conv_forward", None) not in _PLAIN_CONV_FORWARDS:
            return None
        last = x.movedim(1, -1)  # (batch, places..., C)
        windows = F.pad(last, [0, 0, *(p for pad in reversed(m.padding[:dims]) for p in
                                        (pad, pad))])
        for i, (k, s, d) in enumerate(zip(m.kernel_size, m.stride, m.dilation, strict=True)):
            windows = windows.unfold(1 + i, d * (k - 1) + 1, s)[..., ::d]
        # (batch, places..., C, kernel...) -> (batch x places, kernel... x C)
        order = (*range(1 + dims), *range(2 + dims, 2 + 2 * dims), 1 + dims)
        places = windows.shape[1:1 + dims]
        rows = windows.permute(order)
        if m.dilation[-1] == 1:  # the last window and C side by side: one run (a view)
            rows = rows.flatten(-2)
        rows = rows.reshape(-1, weight[0].numel())
        flat = weight.movedim(1, -1).reshape(len(weight), -1)  # (O, kernel... x C)
        out = F.linear(rows, flat, bias)
        return out.reshape(len(x), *places, len(weight)).movedim(-1, 1)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        conv = call.module
        if isinstance(conv.padding, str):
            raise UnsupportedModelError(
                f"string padding '{conv.padding}' of a convolution is not supported here; "
                "give explicit padding")
        dims = x.dim() - 2
        out_spatial = call.node.meta["tensor_meta"].shape[2:]
        pooled = window_max(x, conv.kernel_size, conv.stride, conv.padding[:dims],
                            conv.dilation, out_spatial)
        groups = conv.groups
        pooled = pooled.reshape(1, groups, -1, *out_spatial).amax(dim=2)
        return pooled.repeat_interleave(conv.out_channels // groups, dim=1)


_PLAIN_CONV_FORWARDS = (nn.Conv1d._conv_forward, nn.Conv2d._conv_forward,
                        nn.Conv3d._conv_forward)


class ConvTransposeHandler(ConvHandler):
    out_dim = 1
    scales_rows = False  # output channels along dim 1, by groups

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        m = call.module
        dims = x.dim() - 2
        output_size = call.arg(1, "output_size")
        output_padding = m._output_padding(
            x, output_size, m.stride, m.padding, m.kernel_size, dims, m.dilation
        )
        fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[dims - 1]
        return fn(x, weight, bias, m.stride, m.padding, output_padding, m.groups, m.dilation)

    def as_products(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
                    ) -> Tensor | None:
        return None  # not written for the transpose

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        raise UnsupportedModelError(
            f"'{call.node.target}' (ConvTranspose): the max over antecedents of a transposed "
            "convolution is not implemented")


def batchnorm_affine(bn: nn.modules.batchnorm._BatchNorm, dtype: torch.dtype | None = None,
                     detach: bool = True) -> tuple[Tensor, Tensor]:
    """Eval-mode BatchNorm as the affine identity neuron x*a + c (thesis, below Def 2.2.2):
    a = weight / sqrt(running_var + eps), c = bias - running_mean * a.

    ``dtype`` (default: the buffers' dtype) is the precision of the result: a detached
    fold is computed in float64 (folding float32 statistics in float32 loses ~1e-7
    relative, more than a float64 path-norm tolerates) and rounded to ``dtype``, so a
    pass in float32 and one in float64 fold each BatchNorm once.
    ``detach=False`` keeps the autograd history of weight and bias (the statistics are
    constants either way). A detached fold is kept per module and dtype until one of the
    module's tensors, its ``eps`` or the fold itself changes (a |theta|^q pass asks for it
    up to three times per BatchNorm: units, gain, bias).
    """
    dtype = dtype or bn.running_var.dtype
    return _kept_fold(bn, _kept_folds(bn) if detach else None, dtype, detach)


def _kept_folds(bn: nn.modules.batchnorm._BatchNorm) -> dict | None:
    """The detached folds kept for ``bn`` by dtype (emptied when one of its tensors or its
    eps changed), or None where its tensors keep no version (nothing is kept)."""
    state = _tensor_state(bn)
    if state is None:
        return None
    kept = _FOLDS.get(bn)
    if kept is None or kept[1] != bn.eps or not _same(kept[0], state):
        kept = _FOLDS[bn] = (state, bn.eps, {})
    return kept[2]


def _kept_fold(bn: nn.modules.batchnorm._BatchNorm, folds: dict | None, dtype: torch.dtype,
               detach: bool) -> tuple[Tensor, Tensor]:
    """(a, c) in ``dtype`` from ``folds`` (the kept float64 fold rounded, so one fold per
    module whatever the dtypes passes ask for), computed and kept there when missing or
    written to since; computed afresh without ``folds``."""
    fold = None if folds is None else folds.get(dtype)
    if fold is None or _versions(fold[:2]) != fold[2]:
        if folds is not None and dtype != torch.float64:
            wide = _kept_fold(bn, folds, torch.float64, detach)
            a, c = wide[0].to(dtype), wide[1].to(dtype)
        else:
            a, c = _fold(bn, dtype, detach)
        fold = (a, c, _versions((a, c)))
        if folds is not None and fold[2] is not None:  # an inference tensor keeps no version
            folds[dtype] = fold
    return fold[0], fold[1]


def fold_batchnorms(bns: Sequence[nn.modules.batchnorm._BatchNorm]) -> None:
    """Keep the detached float64 fold (``batchnorm_affine``) of every BatchNorm of ``bns``
    that has none kept, for all of them in one batch of elementwise float64 ops on their
    concatenated tensors: each entry meets the same correctly rounded operations as
    ``_fold`` gives it one module at a time, so the folds are the same bit for bit
    (tests/test_batchnorm_fold_batch.py). Modules without weight or bias, with tensors
    other than plain ones (FSDP2's DTensor shards), on another device than the first, or
    whose tensors keep no version are left to ``batchnorm_affine``."""
    todo = []
    for bn in bns:
        folds = _kept_folds(bn)
        fold = None if folds is None else folds.get(torch.float64)
        weight, bias = param(bn, "weight"), param(bn, "bias")
        if folds is not None and (fold is None or _versions(fold[:2]) != fold[2]) \
                and weight is not None and bias is not None \
                and all(type(t) is Tensor for t in (weight, bias, bn.running_var,
                                                    bn.running_mean)) \
                and weight.shape == bias.shape == bn.running_var.shape == bn.running_mean.shape \
                and weight.dim() == 1 and bn.running_var.device == bns[0].running_var.device:
            todo.append((folds, bn, weight, bias))
    if len(todo) < 2:
        return
    sizes = [len(bn.running_var) for _, bn, _, _ in todo]

    def joined(tensors: list[Tensor]) -> Tensor:  # detached: buffers, ``param``'s reads
        return torch.cat(tensors).to(torch.float64)  # each entry converted exactly

    eps = torch.tensor([bn.eps for _, bn, _, _ in todo], dtype=torch.float64,
                       device=todo[0][1].running_var.device)
    a = torch.add(joined([bn.running_var for _, bn, _, _ in todo]),
                  eps.repeat_interleave(torch.tensor(sizes, device=eps.device))).rsqrt_()
    a = a.mul_(joined([w for _, _, w, _ in todo]))
    c = torch.mul(joined([bn.running_mean for _, bn, _, _ in todo]), a).neg_()
    c = c.add_(joined([b for _, _, _, b in todo]))
    for (folds, _, _, _), a_i, c_i in zip(todo, a.split(sizes), c.split(sizes), strict=True):
        folds[torch.float64] = (a_i, c_i, _versions((a_i, c_i)))
    if torch.is_grad_enabled():  # a differentiable pass, which a tape may record
        return  # (pathlift.lift.tape): each unit read from its own fold, its drift checked
    for dtype in {bn.running_var.dtype for _, bn, _, _ in todo}:
        _keep_in_dtype([t[:2] for t in todo], sizes, a, c, dtype)


def _keep_in_dtype(todo: list[tuple[dict, nn.Module]], sizes: list[int], a: Tensor, c: Tensor,
                   dtype: torch.dtype) -> None:
    """For the BatchNorms of ``todo`` whose buffers are in ``dtype``, from their batched
    float64 folds (a, c): the folds rounded to ``dtype`` (what ``dag_parameters`` and a pass in
    that dtype read) and the layer's ``units``, each peak max |a_i| and max |c_i| read by one
    segment max over the batch (the same floats as ``peak_of`` module by module, NaN
    included, so the same units): a first pass reads no fold twice."""
    narrow = (a, c) if dtype == torch.float64 else (a.to(dtype), c.to(dtype))
    segment = torch.arange(len(sizes), device=a.device).repeat_interleave(
        torch.tensor(sizes, device=a.device))
    peaks = torch.zeros((2, len(sizes)), dtype=dtype, device=a.device).scatter_reduce_(
        1, segment.expand(2, -1), torch.stack(narrow).abs(), "amax").tolist()
    for i, ((folds, bn), a_i, c_i) in enumerate(zip(todo, narrow[0].split(sizes),
                                                  narrow[1].split(sizes), strict=True)):
        if bn.running_var.dtype != dtype:
            continue
        if dtype != torch.float64:
            folds[dtype] = (a_i, c_i, _versions((a_i, c_i)))
        _remember_units(bn, _FOLDS[bn][0], (unit_of_peak(peaks[0][i]),
                                            unit_of_peak(peaks[1][i])))


# An eval BatchNorm's detached folds (a, c, their versions) by dtype, with the state of its
# tensors and its eps they were computed from (``batchnorm_affine``).
_FOLDS: weakref.WeakKeyDictionary[nn.Module, tuple[list[tuple], float, dict]] = \
    weakref.WeakKeyDictionary()


def _versions(tensors: Sequence[Tensor]) -> tuple[int, ...] | None:
    """The version of each tensor (an in-place write changes it); None for inference
    tensors, which keep none."""
    try:
        return tuple(t._version for t in tensors)
    except RuntimeError:
        return None


def _fold(bn: nn.modules.batchnorm._BatchNorm, dtype: torch.dtype, detach: bool
          ) -> tuple[Tensor, Tensor]:
    a = torch.add(bn.running_var.detach().to(dtype), bn.eps).rsqrt_()
    weight, bias = param(bn, "weight", detach), param(bn, "bias", detach)
    if weight is not None:  # in place where no autograd history is kept
        a = a.mul_(weight.to(dtype)) if detach else a * weight.to(dtype)
    c = torch.mul(bn.running_mean.detach().to(dtype), a).neg_()  # -mean * a
    if bias is not None:
        c = c.add_(bias.to(dtype)) if detach else c + bias.to(dtype)
    return a, c


class BatchNormHandler(AffineHandler):
    """Eval BatchNorm: the affine identity neuron x*a + c, one antecedent per neuron (its
    input channel). Its parameters are statistics and an affine pair, so it is never
    pruned (``scored`` False); without affine parameters it has no neurons of its own."""

    diagonal = True
    scored = False
    folds = True
    derived = True
    contiguous_backward = True  # torch 2.13's CPU eval BatchNorm backward, see LayerGraph

    def problem(self, call: Call) -> str | None:
        if call.module.running_mean is None:
            return "BatchNorm without running statistics (track_running_stats=False) is not affine"
        return None

    def training_problem(self, module: nn.Module) -> str | None:
        return ("BatchNorm in training mode normalises by batch statistics; call "
                "model.eval(), or measure inside `with pathlift.graph.eval_mode(model):`")

    def value_problem(self, module: nn.Module) -> str | None:
        found = super().value_problem(module)
        if found is None and not bool((module.running_var.detach() + module.eps > 0).all()):
            return ("running_var + eps is not positive for some channel, so x*a + c is "
                    "undefined; fix the statistics (running_var >= 0, eps > 0)")
        return found

    def prepare(self, modules: Sequence[nn.Module]) -> None:
        fold_batchnorms(modules)

    def magnitude(self, module: nn.Module, q: float, dtype: torch.dtype,
                  workspace: Workspace | None = None, unit: float = 1.0) -> Tensor:
        return abs_power(batchnorm_affine(module, dtype)[0], q, dtype, unit=unit)

    def apply(self, x: Tensor, weight: Tensor, call: Call, bias: Tensor | None = None
              ) -> Tensor:
        a = channel_view(weight, x.dim())
        return x * a if bias is None else torch.addcmul(channel_view(bias, x.dim()), x, a)

    def bias(self, module: nn.Module) -> Tensor | None:
        return batchnorm_affine(module, torch.float64)[1]

    def dag_parameters(self, module: nn.Module) -> tuple[Tensor, Tensor | None]:
        return batchnorm_affine(module)

    def live_parameters(self, module: nn.Module, dtype: torch.dtype
                        ) -> tuple[Tensor, Tensor | None]:
        """The fold x*a + c, differentiable in weight and bias (statistics constant)."""
        return batchnorm_affine(module, dtype, detach=False)

    def magnitude_gradients(self, module: nn.Module, weight: Tensor, bias: Tensor | None,
                            q: float) -> list[tuple[str, Tensor | None]]:
        """For x*a + c, a = w s, c = b - m a (q = 2 only, where the fold stays a sum of
        squares per parameter): gamma_w = s^2 (gamma_a + m^2 gamma_c), gamma_b = gamma_c.
        At q != 2 weight and bias are no coordinates of ||Phi||_q^q (the fold mixes them
        into one bias): none."""
        if q != 2:
            return []
        s = torch.rsqrt(module.running_var.detach().to(weight.dtype) + module.eps)
        m = module.running_mean.detach().to(weight.dtype)
        return [("weight", s.pow(2) * (weight + m.pow(2) * bias)), ("bias", bias)]

    def own_neurons(self, module: nn.Module) -> bool:
        return module.affine

    def entry_channels(self, module: nn.Module) -> tuple[Tensor, Tensor]:
        channels = torch.arange(module.num_features)
        return channels, channels

    def in_channels(self, module: nn.Module) -> int:
        return module.num_features

    def incoming_rows(self, module: nn.Module) -> Tensor:
        return torch.stack(batchnorm_affine(module, torch.float64), dim=1)

    def antecedent_max(self, x: Tensor, call: Call) -> Tensor:
        return x

    def rescale_(self, module: nn.Module, grow: Tensor, shrink: Tensor) -> None:
        """Input times s = 1/shrink, output times mu = grow: mean -> s mean, weight ->
        weight mu / s, bias -> mu bias; for mu = s this is the thesis' Appendix E.1.2 rule
        (running mean and bias times lambda). A dead input (shrink = 0) makes a = 0 and
        keeps the constant c in the bias. Without affine parameters, grow = 1/shrink."""
        mean = module.running_mean
        if not module.affine:
            _scale_(mean, 1 / torch.where(shrink > 0, shrink, 1.0))
            return
        dead = shrink == 0
        c = batchnorm_affine(module, torch.float64)[1]
        bias = param(module, "bias").to(torch.float64)
        assign_(module, "bias", torch.where(dead, grow * c, grow * bias))
        with torch.no_grad():
            mean.copy_(torch.where(dead, mean.to(torch.float64),
                                   mean.to(torch.float64)
                                   / torch.where(dead, 1.0, shrink.to(torch.float64))))
        _scale_(stored(module, "weight"), grow * shrink)

    def permute_(self, module: nn.Module, outputs: Tensor | None = None,
                 inputs: Tensor | None = None) -> None:
        """Its affine pair follows ``outputs``, its statistics (which read the input
        channels) follow ``inputs``."""
        if outputs is not None and module.affine:
            super().permute_(module, outputs)
        if inputs is not None:
            with torch.no_grad():
                for buf in (module.running_mean, module.running_var):
                    buf.copy_(buf.index_select(0, inputs))

    def quantizable(self, module: nn.Module) -> list[tuple[str, Tensor, int | None]]:
        a, c = batchnorm_affine(module)
        return [("weight", a, None), ("bias", c, None)]

    def write_quantized_(self, module: nn.Module, values: dict[str, Tensor]) -> None:
        """The module becomes x * Q(a) + Q(c) exactly: running mean 0, variance 1, eps 0."""
        with torch.no_grad():
            module.running_mean.zero_()
            module.running_var.fill_(1.0)
        module.eps = 0.0
        for name, value in values.items():
            if param(module, name) is None:
                setattr(module, name, nn.Parameter(value.clone()))
            else:
                assign_(module, name, value)
        module.affine = True


# --------------------------------------------------------------------------- activations


register(LinearHandler("Linear"), modules=[nn.Linear])
for _d in (1, 2, 3):
    register(ConvHandler(f"Conv{_d}d"), modules=[getattr(nn, f"Conv{_d}d")])
    register(ConvTransposeHandler(f"ConvTranspose{_d}d"),
             modules=[getattr(nn, f"ConvTranspose{_d}d")])
    register(BatchNormHandler(f"BatchNorm{_d}d"), modules=[getattr(nn, f"BatchNorm{_d}d")],
             note="in eval mode")


# --------------------------------------------------------------------------- functional forms


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _operand(arg: Any, role: str = "") -> tuple[fx.Node, Operand] | None:
    """(a node holding the tensor, its ``Operand``) of an argument that is a tensor of the
    module (``self.weight``; ``weight_orig * weight_mask`` under torch.nn.utils.prune,
    which the pass reads itself), its transpose (``.T``, ``.mT``, ``.t()``,
    ``.transpose(0, 1)``), or else a tensor computed in forward (``derived``: the
    caller's ``value`` of it says whether it is computed from the model's tensors alone)."""
    if not isinstance(arg, fx.Node):
        return None
    if arg.op == "get_attr":
        return arg, Operand(role)
    if _is_masked(arg):
        return arg.args[1], Operand(role)
    source = arg.args[0] if arg.args else None
    if isinstance(source, fx.Node) and (source.op == "get_attr" or _is_masked(source)):
        source = source if source.op == "get_attr" else source.args[1]
        if arg.op == "call_function" and arg.target is getattr and arg.args[1] in ("T", "mT"):
            return source, Operand(role, arg.args[1])
        if arg.op == "call_method" and (arg.target == "t" or (
                arg.target == "transpose" and {d % 2 for d in arg.args[1:3]} == {0, 1})):
            return source, Operand(role, arg.target, tuple(arg.args[1:]))
    if arg.op in ("call_function", "call_method"):
        return arg, Operand(role, derived=True)
    return None


def _is_masked(node: fx.Node) -> bool:
    """``name_mask.to(dtype=...) * name_orig``: torch.nn.utils.prune's pre-hook, traced."""
    if node.op != "call_function" or node.target is not operator.mul or len(node.args) != 2:
        return False
    mask, orig = node.args
    if isinstance(mask, fx.Node) and mask.op == "call_method" and mask.target == "to":
        mask = mask.args[0]
    return all(isinstance(n, fx.Node) and n.op == "get_attr" for n in (orig, mask)) and \
        str(orig.target).endswith("_orig") and \
        str(mask.target) == str(orig.target).removesuffix("_orig") + "_mask"


def _tensors(node: fx.Node, value: Callable[[fx.Node], Any], *roles: tuple[str, Any],
             ) -> dict[fx.Node, Any] | None:
    """{argument node: Operand} for (role, argument) pairs, or None when an argument is
    not a tensor of the module (an activation, or a tensor computed in forward)."""
    marks: dict[fx.Node, Any] = {}
    for role, arg in roles:
        if arg is None:
            continue
        found = _operand(arg, role)
        if found is None or not isinstance(value(found[0]), Tensor):
            return None
        marks[arg] = found[1]
    return marks


def _layer(handler: Handler, form: type, x: Any, marks: dict[fx.Node, Any] | None,
           settings: dict[str, Any], checked: dict[str, Any] | None = None) -> Lowered | None:
    """The ``Lowered`` call reading the activation ``x`` (None when x is no node)."""
    if marks is None or not isinstance(x, fx.Node):
        return None
    return Lowered(handler, form, {x: INPUT, **marks}, settings, checked or {})


def _read_linear(node: fx.Node, value: Callable[[fx.Node], Any]) -> Lowered | None:
    """``F.linear(x, self.weight, self.bias)``: nn.Linear's op."""
    weight = _arg(node, 1, "weight")
    marks = _tensors(node, value, ("weight", weight), ("bias", _arg(node, 2, "bias")))
    if marks is None or marks[weight].transposed:
        return None
    w = value(_operand(weight)[0])
    return _layer(MODULES[nn.Linear], nn.Linear, node.args[0], marks,
                  {"in_features": w.shape[1], "out_features": w.shape[0]})


def _matmul(node: fx.Node, value: Callable[[fx.Node], Any], x: Any, weight: Any,
            rows_out: bool) -> Lowered | None:
    """x times a weight of the module: a Linear layer when the weight as the call reads
    it is (out, in) (``rows_out``), else the transposed layout (``MatmulHandler``)."""
    marks = _tensors(node, value, ("weight", weight))
    if marks is None:
        return None
    w = value(_operand(weight)[0])
    if w.dim() != 2:
        return None
    out_first = rows_out != marks[weight].transposed
    handler = MODULES[nn.Linear] if out_first else MATMUL
    return _layer(handler, nn.Linear, x, marks,
                  {"in_features": w.shape[1 if out_first else 0],
                   "out_features": w.shape[0 if out_first else 1]})


def _read_matmul(node: fx.Node, value: Callable[[fx.Node], Any]) -> Lowered | None:
    """``x @ self.weight.T`` (Linear), ``x @ self.weight`` (weight stored (in, out))."""
    return _matmul(node, value, node.args[0], _arg(node, 1, "other"), rows_out=False)


_EINSUM = re.compile(r"(\.\.\.|[a-z]*)([a-z]),([a-z])([a-z])->\1([a-z])")


def _read_einsum(node: fx.Node, value: Callable[[fx.Node], Any]) -> Lowered | None:
    """``einsum("bi,oi->bo", x, self.weight)`` (Linear), ``"...i,io->...o"`` (weight
    stored (in, out)): a contraction of x's last dim with one dim of a 2-d weight."""
    equation, *operands = node.args
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    found = _EINSUM.fullmatch(str(equation).replace(" ", ""))
    if found is None or len(operands) != 2:
        return None
    batch, i, a, b, o = found.groups()
    if len({i, o}) != 2 or {a, b} != {i, o} or {i, o} & set(batch):
        return None
    return _matmul(node, value, operands[0], operands[1], rows_out=(a == o))


def _tuple(v: Any, dims: int) -> Any:
    return v if isinstance(v, str) else tuple(v) if isinstance(v, (tuple, list)) \
        else (v,) * dims


def _read_conv(dims: int, transposed: bool) -> Callable[[fx.Node, Callable], Lowered | None]:
    """``F.conv{d}d`` / ``F.conv_transpose{d}d`` over the module's weight and bias: the
    op of the module form, its settings read off the call."""
    names = ("stride", "padding", "output_padding", "groups", "dilation") if transposed \
        else ("stride", "padding", "dilation", "groups")
    defaults = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "output_padding": 0}
    form = getattr(nn, f"ConvTranspose{dims}d" if transposed else f"Conv{dims}d")

    def read(node: fx.Node, value: Callable[[fx.Node], Any]) -> Lowered | None:
        weight = _arg(node, 1, "weight")
        marks = _tensors(node, value, ("weight", weight), ("bias", _arg(node, 2, "bias")))
        if marks is None or marks[weight].transposed:
            return None
        given = {k: _arg(node, 3 + i, k, defaults[k]) for i, k in enumerate(names)}
        if any(isinstance(v, fx.Node) for v in given.values()):
            return None
        w, groups = value(_operand(weight)[0]), given["groups"]
        settings = {k: v if k == "groups" else _tuple(v, dims) for k, v in given.items()}
        channels = (w.shape[0], w.shape[1] * groups) if transposed else \
            (w.shape[1] * groups, w.shape[0])
        settings.update(in_channels=channels[0], out_channels=channels[1],
                        kernel_size=tuple(w.shape[2:]), padding_mode="zeros",
                        transposed=transposed)
        if not transposed:
            settings["output_padding"] = (0,) * dims
        return _layer(MODULES[form], form, node.args[0], marks, settings, {"groups": 1})
    return read


def _read_batch_norm(node: fx.Node, value: Callable[[fx.Node], Any]) -> Lowered | str | None:
    """``F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
    False, momentum, eps)`` inside a BatchNorm subclass (timm's ``BatchNormAct2d``, which
    then applies its activation): eval BatchNorm's op, x*a + c."""
    roles = [("running_mean", _arg(node, 1, "running_mean")),
             ("running_var", _arg(node, 2, "running_var")),
             ("weight", _arg(node, 3, "weight")), ("bias", _arg(node, 4, "bias"))]
    marks = _tensors(node, value, *roles)
    if marks is None:
        return None
    if _arg(node, 5, "training", False) is not False or roles[0][1] is None:
        return ("functional batch_norm normalises by batch statistics (training=True or "
                "no running statistics); call model.eval()")
    mean = value(_operand(roles[0][1])[0])
    settings = {"num_features": mean.shape[0], "eps": _arg(node, 7, "eps", 1e-5),
                "momentum": _arg(node, 6, "momentum", 0.1),
                "affine": roles[2][1] is not None or roles[3][1] is not None,
                "track_running_stats": True}
    return _layer(MODULES[nn.BatchNorm2d], nn.BatchNorm2d, node.args[0], marks, settings,
                  {"eps": None, "num_features": None, "affine": None})


MATMUL = MatmulHandler("matmul")
lower([F.linear], _read_linear)
lower([torch.matmul, operator.matmul, "matmul", "__matmul__"], _read_matmul)
lower([torch.einsum], _read_einsum)
lower([F.batch_norm], _read_batch_norm)
for _d in (1, 2, 3):
    lower([getattr(F, f"conv{_d}d")], _read_conv(_d, False))
    lower([getattr(F, f"conv_transpose{_d}d")], _read_conv(_d, True))
