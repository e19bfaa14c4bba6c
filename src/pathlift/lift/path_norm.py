"""Mixed path-norms ||Phi(theta)||_{q,r} in one forward pass (thesis Def. 3.1.1, Thm 3.1.1)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn

from pathlift.errors import PrecisionError
from pathlift.exponents import LOG_SPACE_Q_MAX, check_dtype, check_exponents
from pathlift.graph import AbsPowInterpreter, LayerGraph, graph_of
from pathlift.graph.abs_pow import output_logs
from pathlift.graph.boundary import copy_model
from pathlift.graph.input_shape import InputShape, shape_used
from pathlift.graph.normalize import FactorRangeError, normalize
from pathlift.graph.sharded import ShardedAbsPow, is_sharded_graph
from pathlift.logspace import LN10, format_log10, power10


@dataclass(frozen=True)
class PathNorm:
    """A mixed path-norm ||(||Phi^{->v}||_q)_{v output}||_r, exact in log space.

    ``value`` is a float (inf when it exceeds float64); ``log10`` is always finite for a
    non-zero norm. ``per_output_log10`` holds log10 ||Phi^{->v}||_q for each output neuron.
    ``input_shape`` is the shape it was computed at, and ``input_shape.source`` where that
    came from ("given", "timm's pretrained_cfg['input_size']", ...: never a guess).
    """

    q: float
    r: float
    log10: float
    per_output_log10: tuple[float, ...] = field(repr=False)
    input_shape: InputShape | None = field(default=None, repr=False, compare=False)

    @property
    def value(self) -> float:
        return power10(self.log10)

    def __str__(self) -> str:
        r = "inf" if math.isinf(self.r) else f"{self.r:g}"
        return f"||Phi||_(q={self.q:g}, r={r}) = {format_log10(self.log10)}"


#: Above this exponent the pass runs on the q-normalised parameters (Alg. 3.2.1), each
#: layer divided by its largest entry: |w|^q of raw weights leaves the range of float32
#: from q ~ 16 and of float64 from q ~ 500 (ResNet-18).
LARGE_Q = 4.0


def log_outputs(graph: LayerGraph, q: float, dtype: torch.dtype = torch.float64) -> Tensor:
    """ln o_v = ln ||Phi^{->v}||_q^q for every output neuron v, across every returned tensor
    in order (Thm 3.1.1: one |theta|^q pass on the all-ones input), exact for any finite
    parameters, subnormals included, or a PrecisionError.

    Each layer enters as |W/u|^q with u a power of two near its largest weight (its bias
    likewise, with its own unit) and u^q carried in log space, so |theta|^q never leaves
    the float range. For q > ``LARGE_Q`` the pass runs on a float64 copy normalised by
    Alg. 3.2.1 at exponent q (Phi is invariant, Thm 2.4.1, and every hidden neuron's
    incoming (weights, bias) then has q-norm 1), every layer divided by its largest entry.
    Every output is checked: NaN or +inf names the layer holding NaN/inf
    (UnsupportedModelError; the parameters are only read then, so a healthy network pays
    nothing), else is a PrecisionError; a zero output whose network has a non-zero path
    (``_support``) is computed again on the normalised copy, and is a PrecisionError if it
    stays zero.
    """
    large = q > LARGE_Q
    # a sharded model is never copied: every layer is only divided by its unit
    walker = ShardedAbsPow if is_sharded_graph(graph) else AbsPowInterpreter
    normalisable = walker is AbsPowInterpreter
    log_o = _pass(graph, q, dtype, walker, normalised=large and normalisable, unit_weights=large)
    if bool((log_o == -math.inf).any()):
        lost = (log_o == -math.inf) & _support(graph, walker)
        if bool(lost.any()) and not large and normalisable:
            # underflow: Alg. 3.2.1 balances the layers
            log_o = torch.where(lost, _pass(graph, q, dtype, walker, normalised=True,
                                            unit_weights=True), log_o)
            lost = lost & (log_o == -math.inf)
        if bool(lost.any()):
            check_log_space_q(q)
            remedy = "a smaller q" if dtype == torch.float64 else \
                "dtype=torch.float64 or a smaller q"
            raise PrecisionError(
                f"||Phi^(->v)||_q at q = {q:g} underflows {dtype} for {int(lost.sum())} "
                f"output neuron(s) even after normalising the parameters (Alg. 3.2.1); use "
                f"{remedy}")
    return log_o


def _pass(graph: LayerGraph, q: float, dtype: torch.dtype, walker: type[AbsPowInterpreter],
          normalised: bool, unit_weights: bool) -> Tensor:
    """ln o_v of one |theta|^q pass, on the Alg. 3.2.1 float64 copy when ``normalised``
    (rounding the factors then loses nothing), each layer divided by its largest entry
    when ``unit_weights``; NaN or +inf checked (see ``log_outputs``)."""
    source = graph
    if normalised:
        wide = copy_model(graph.model).to(torch.float64)
        try:
            normalised_model = normalize(graph.bind(wide), None, q)  # kept alive: graphs
            graph = graph_of(normalised_model, graph.input_shape)   # are weak
        except FactorRangeError:
            pass  # Alg. 3.2.1 would move every hidden neuron's scale into the output layer,
        # beyond float64 (weights near 1e200 in two layers): the pass runs on the parameters
        # as they are, each layer divided by its largest entry, exact unless |w/u|^q underflows
    with torch.no_grad():
        log_o = output_logs(walker(graph, q, dtype, unit_weights=unit_weights).run_all_ones())
    check_finite(source, log_o, f"||Phi^(->v)||_q^q at q = {q:g}", q)
    return log_o


def check_finite(graph: LayerGraph, logs: Tensor, what: str, q: float) -> None:
    """Nothing when no entry of ``logs`` is NaN or +inf (-inf, a zero, is left to the
    caller). Else UnsupportedModelError naming the layers that hold NaN/inf, or, when every
    parameter is finite, a PrecisionError: ``check_log_space_q``, else a bug or a range no
    scaling covers, never a number."""
    if bool((logs < math.inf).all()):
        return
    graph.check_values()
    check_log_space_q(q)
    raise PrecisionError(f"{what} came out {'NaN' if bool(logs.isnan().any()) else 'inf'} "
                         "although every parameter is finite and every layer enters divided "
                         "by its largest entry (log space): a bug to report, with the model "
                         "(pathlift --debug shows where)")


def check_log_space_q(q: float) -> None:
    """PrecisionError naming the cause when q > ``LOG_SPACE_Q_MAX``: |w|^q is carried as
    q*ln|w| (Thm 3.1.1's pass in log space), which then overflows float64 for weights away
    from 1, so a NaN, inf or zero there is that overflow, not the network's range."""
    if q > LOG_SPACE_Q_MAX:
        raise PrecisionError(
            f"q = {q:g} is too large for float64 exponent arithmetic: |w|^q is carried as "
            f"q*ln|w|, which overflows float64 for every weight w with |ln|w|| > "
            f"{torch.finfo(torch.float64).max / q:.3g}; use q <= {LOG_SPACE_Q_MAX:.4g}, "
            "where q*ln|w| is finite for every float64 w")


def _support(graph: LayerGraph, walker: type[AbsPowInterpreter]) -> Tensor:
    """Whether each output neuron ends a path p with Phi_p != 0: the pass at q = 2^-60,
    where |w|^q = 1 within 1e-15 for every non-zero float w and 0^q = 0 (it counts the
    non-zero paths, ||Phi||_0, and a sum of such terms is zero only when it has none)."""
    with torch.no_grad():
        out = walker(graph, COUNTING_Q, torch.float64).run_all_ones()
    return output_logs(out) > -math.inf


#: q at which |w|^q is 1 within 1e-15 for every non-zero float w: the pass counts the
#: non-zero paths (||Phi||_0), whatever their weights.
COUNTING_Q = 2.0**-60


def log_r_norm(per_output: Tensor, r: float) -> Tensor:
    """ln ||(e^{x_v})_v||_r from the per-output ln norms x_v, r in (0, inf], as a 0-dim
    tensor (in the autograd graph of ``per_output``)."""
    return per_output.max() if math.isinf(r) else torch.logsumexp(per_output * r, dim=0) / r


def mixed_norm_log(log_o: Tensor, q: float, r: float) -> tuple[float, Tensor]:
    """ln of the (q, r) norm, and per-output ln norms, from ln o_v = ln ||Phi^{->v}||_q^q."""
    per_output = log_o / q
    return float(log_r_norm(per_output, r)), per_output


def path_norm(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
              q: float = 1.0, r: float | None = None, dtype: torch.dtype = torch.float64
              ) -> PathNorm:
    """Path-norm ||Phi(theta)||_q, or the mixed (q, r) norm ||Phi(theta)||_{q,r}, in one
    forward pass (thesis Thm 3.1.1).

    Args:
        model: a supported ReLU network (DDP, compiled and pruned models included), or
            its ``LayerGraph``. The graph is traced once per model object and reused.
        input_shape: input size without the batch dimension, e.g. (3, 224, 224); None
            takes the one the model declares (an ``input_shape`` attribute, timm's
            pretrained_cfg, torchvision's documented input), else raises ShapeError.
        q: the exponent, in (0, inf).
        r: None (default) takes r = q: the l^q norm ||Phi||_q of the whole path-lifting,
            as ``path_norms`` and ``pathlift norm``; a number in (0, inf] gives the mixed
            norm ||(||Phi^{->v}||_q)_{v output}||_r (Def. 3.1.1): r = 1 sums the output
            neurons' q-norms, r = inf takes the largest.
        dtype: mantissa precision (float64 exact to ~1e-13; float32 ~1e-6, faster).

    Returns:
        A ``PathNorm`` with ``log10`` (finite far beyond float64) and ``value``.

    Raises:
        UnsupportedModelError naming every node outside the ReLU DAG model of Def. 2.2.2
        (or a layer holding NaN/inf), ShapeError, InvalidParameterError for bad q, r, dtype.

    Max-pool neurons are replaced by window sums, average-pool weights become (1/K)^q, eval
    BatchNorm is an affine identity neuron, torch.nn.utils.prune masks are honoured. The
    model is not modified, nor its autograd state: it may be called between a forward and
    ``loss.backward()``.

    Example::

        model = pathlift.models.resnet18().eval()
        l1 = path_norm(model, (3, 224, 224))       # l1.log10 = 30.8, l1.value = 6.3e30
        l2 = path_norm(model, (3, 224, 224), q=2)  # ||Phi||_2; same graph: no second trace
        mixed = path_norm(model, (3, 224, 224), q=2, r=1)  # the (2, 1) mixed norm
    """
    r = q if r is None else r
    check_exponents(q, r)
    check_dtype(dtype)
    graph = graph_of(model, input_shape)
    total, per_output = mixed_norm_log(log_outputs(graph, q, dtype), q, r)
    return PathNorm(q=q, r=r, log10=total / LN10,
                    per_output_log10=tuple((per_output / LN10).tolist()),
                    input_shape=shape_used(graph.input_shape, input_shape))


def path_norms(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
               qs: Iterable[float] = (1.0, 2.0, 4.0), r: float | None = None,
               dtype: torch.dtype = torch.float64) -> dict[float, PathNorm]:
    """Several path-norms from one graph: one |theta|^q pass per exponent q (Thm 3.1.1).

    Args:
        model, input_shape, dtype: as for ``path_norm``.
        qs: the exponents q.
        r: None takes r = q for each exponent, i.e. the plain l^q norm ||Phi(theta)||_q of
            the whole path-lifting (thesis Table 7.2); a number fixes r for all.

    Returns:
        ``{q: PathNorm}``.

    Example::

        norms = path_norms(model, (3, 224, 224))   # {1.0: ..., 2.0: ..., 4.0: ...}
        norms[2.0].log10
    """
    graph = graph_of(model, input_shape)
    shape = shape_used(graph.input_shape, input_shape)
    return {float(q): replace(path_norm(graph, None, float(q), r, dtype), input_shape=shape)
            for q in qs}
