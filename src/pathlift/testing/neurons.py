"""The explicit neuron-level DAG of a small network (thesis Def. 2.2.2): the tests' ground truth.

``NeuronDAG.from_module`` turns a small supported module into the DAG of Def. 2.2.2, with one
neuron per element of each op's output (batch 1), and computes everything by enumerating
paths: the path-lifting Phi(theta) and the path-activations A(theta, x) (Def. 2.3.3), the
output through Thm 2.4.2, and the mixed path-norms of Def. 3.1.1 as explicit sums.

Its numbers are computed independently of the |theta|^q pass of Thm 3.1.1
(``pathlift.graph.abs_pow``): it never uses the handlers' ``abs_pow``/``weight_part``. It
only uses the traced graph to know which op each node is, and recovers every number by
probing the real torch op on a float64 copy of the model:

- linear ops (Linear, Conv, ConvTranspose, eval BatchNorm, average pools, ``mean``, nearest
  upsampling, residual ``+``) run on the zero input (their bias) and on a batch of basis
  vectors (their exact matrix); each non-zero matrix entry is an edge. A zero entry is left
  out: a path through a zero weight has Phi_p = 0, so it changes neither R nor any norm.
- max-pool ops run on inputs equal to -1e9 everywhere but 0 at one position i: the outputs
  equal to 0 are the windows containing i. Each output is a 1-max-pool neuron with weights
  1 and bias 0 (below Def. 2.2.2); padding is never an antecedent.
- a ReLU makes the neurons it follows ReLU neurons when nothing else reads their
  pre-activation; otherwise (the ReLU reads an input, a max-pool neuron, or a value that is
  also used elsewhere) it creates ReLU neurons with one weight-1 edge and bias 0.
- structural ops (view, flatten, permute, transpose, squeeze, cat, slicing, Identity, eval
  Dropout) create no neuron: they run on a tensor of neuron ids and only relabel. This
  keeps P minimal; identity neurons with a zero bias and weight-1 edges would only add
  paths with Phi_p = 0 and change no norm.
- a neuron that one op reads twice (``x + x``, a conv or max-pool after ``cat([x, x])``)
  is read the second time through an identity copy (weight-1 edge, bias 0). Def. 2.2.2 has
  no parallel edges; merging the two into one edge of weight w1 + w2 would describe the
  same function but another parameterization, whose q != 1 path-norms differ from those of
  the torch weights w1, w2 (the copy keeps them two edges, as Thm 3.1.1's pass does).

Paths follow Def. 2.3.1: every path ending at an output neuron, starting at an input
neuron (Phi_p = product of weights) or at any other neuron (Phi_p = its bias times the
product). In A(theta, x), a path starting at an input neuron u uses column u and a path
starting at a hidden or output neuron uses the bias column, so that
<Phi, A(x; 1)> = sum_p Phi_p a_p x_{p_0} with x_u := 1 off the inputs (proof of Thm 2.4.2).
The output neurons are the elements of the returned tensors, also when another op reads
them (Thm 2.4.2 and Def. 3.1.1 hold for Phi^{->v} of any neuron v).

Numbers: Phi_p is kept as a sign and ln|Phi_p| (a sum of ln|weight|, ~1e-15 relative, no
overflow), and norms sum |Phi_p|^q with math.fsum. Enumeration costs O(|P| * depth); more
than ``max_paths`` (default 1e6) paths is refused.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

import numpy as np
import scipy.sparse
import torch
from torch import Tensor, fx, nn

from pathlift.errors import ShapeError, UnsupportedModelError
from pathlift.exponents import check_q, check_r
from pathlift.graph.boundary import copy_model, output_leaves
from pathlift.graph.layer_graph import LayerGraph
from pathlift.graph.ops import Call, Handler
from pathlift.graph.trace import trace
from pathlift.graph.walk import OpWalker
from pathlift.logspace import LN10, power10

MAX_PATHS = 10**6
_FAR_BELOW = -1e9  # max-pool probes: every position but one is far below the probed one
# piecewise-linear probes: 0 and +-2^k, k = -20..20 (exact in float64); breakpoints beyond
# 2^20 in magnitude are not resolved (the reconstruction is checked, see _learn_pieces)
_GRID = np.concatenate([-(2.0 ** np.arange(20, -21, -1)), [0.0], 2.0 ** np.arange(-20, 21)])


class Activation(Enum):
    """The activation rho_v of a neuron (Def. 2.2.2); max-pool neurons are 1-max-pool."""

    INPUT = "input"
    IDENTITY = "id"
    RELU = "relu"
    MAXPOOL = "1-max-pool"


@dataclass(frozen=True)
class Neuron:
    """One neuron v: where it lives in the model, rho_v, b_v and its incoming edges."""

    node: str  # the fx node whose output holds it ("x" for the input)
    index: tuple[int, ...]  # its position in that output, batch dimension excluded
    activation: Activation
    bias: float
    antecedents: tuple[int, ...]  # ids of ant(v), ascending (the lexicographic order)
    weights: tuple[float, ...]  # theta^{u -> v}, aligned with ``antecedents``

    @property
    def label(self) -> str:
        return f"{self.node}[{','.join(map(str, self.index))}]"


@dataclass(frozen=True, eq=False)
class PathLifting:
    """Phi(theta) (Def. 2.3.3) with its path labels, grouped by output neuron.

    Row p of ``padded`` lists the neuron ids of path p from p_0 to its output, then -1;
    ``paths[p]`` is that row as a tuple. ``ends[p]`` is the position in
    ``NeuronDAG.outputs`` of the output it ends at (ascending). |Phi_p| is kept as a natural
    log so that products of many large weights do not overflow.
    """

    padded: np.ndarray
    ends: np.ndarray
    sign: np.ndarray
    log_abs: np.ndarray

    @cached_property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        """Every path as a tuple of neuron ids, from p_0 to its output."""
        lengths = (self.padded >= 0).sum(axis=1).tolist()
        return tuple(tuple(row[:n]) for row, n in zip(self.padded.tolist(), lengths,
                                                        strict=True))

    @property
    def values(self) -> np.ndarray:
        """The coordinates Phi_p(theta) as float64 (inf where they exceed float64)."""
        with np.errstate(over="ignore"):
            return self.sign * np.exp(self.log_abs)

    def __len__(self) -> int:
        return len(self.ends)


@dataclass(frozen=True, eq=False)
class PathActivations:
    """A(theta, x) (Def. 2.3.3), stored by rows: path p is active (a_p) in column ``column[p]``
    of (x; 1) — the input index of p_0, or d_in (the bias column) when p_0 is not an input."""

    active: np.ndarray
    column: np.ndarray
    num_inputs: int

    def matrix(self) -> scipy.sparse.csr_matrix:
        """The binary matrix A(theta, x) of shape (#paths, d_in + 1)."""
        rows = np.flatnonzero(self.active)
        data = np.ones(len(rows))
        shape = (len(self.active), self.num_inputs + 1)
        return scipy.sparse.csr_matrix((data, (rows, self.column[rows])), shape=shape)


@dataclass(frozen=True, eq=False)
class NeuronDAG:
    """A ReLU network as an explicit DAG of neurons (thesis Def. 2.2.2).

    Neuron ids are a topological order: input neurons are ``0 .. d_in - 1`` in the order of
    the flattened input, and every antecedent has a smaller id than its successor.
    ``outputs`` lists the output neurons of every output tensor, flattened and concatenated.
    """

    neurons: tuple[Neuron, ...]
    input_shape: tuple[int, ...]
    outputs: tuple[int, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    _csr: tuple[np.ndarray, np.ndarray, np.ndarray] = field(repr=False)

    @staticmethod
    def from_module(model: nn.Module, input_shape: Sequence[int],
                    max_paths: int = MAX_PATHS) -> NeuronDAG:
        """The DAG of a small supported ``model`` (``input_shape`` without batch dimension).

        The model is not modified: a float64 deep copy is traced and probed. Raises
        UnsupportedModelError for ops outside Def. 2.2.2 and when the network has more than
        ``max_paths`` paths (enumeration is for small networks; use ``pathlift.path_norm``).
        """
        graph = trace(copy_model(model).to("cpu", torch.float64), input_shape)
        builder = _Builder(graph)
        with torch.no_grad():
            out = builder.run(builder.input_ids())
        leaves = output_leaves(out)
        dag = builder.finish(leaves)
        count = dag.num_paths
        if count > max_paths:
            raise UnsupportedModelError(
                f"{type(model).__name__} has {count} paths, more than max_paths={max_paths}: "
                "the explicit neuron DAG enumerates every path and is meant for small "
                "networks; use pathlift.path_norm for large ones or raise max_paths")
        return dag

    @property
    def num_inputs(self) -> int:
        return math.prod(self.input_shape)

    @cached_property
    def num_paths(self) -> int:
        """|P|, counted without enumeration: #paths ending at v = 1 + sum over ant(v)."""
        counts: list[int] = []
        for v in self.neurons:
            counts.append(1 + sum(counts[u] for u in v.antecedents))
        return sum(counts[v] for v in self.outputs)

    def paths(self) -> Iterator[tuple[int, ...]]:
        """Every path of P (Def. 2.3.1), as neuron ids from p_0 to its output neuron."""
        return iter(self.phi().paths)

    def phi(self) -> PathLifting:
        """The path-lifting Phi(theta) of Def. 2.3.3, by explicit enumeration of the paths."""
        return self._phi

    @cached_property
    def _phi(self) -> PathLifting:
        """Paths enumerated backwards from the outputs, one length at a time: the paths of
        length k + 1 are those of length k extended by each antecedent of their first
        neuron (Def. 2.3.1), each with the sign and ln|.| of its product of weights; a path
        starting at a hidden or output neuron multiplies in that neuron's bias."""
        indptr, indices, data = self._csr
        is_input = np.array([v.activation is Activation.INPUT for v in self.neurons],
                            dtype=bool)
        bias = np.array([v.bias for v in self.neurons], dtype=np.float64)
        with np.errstate(divide="ignore"):  # ln 0 = -inf: a path through a zero bias
            start_log = np.where(is_input, 0.0, np.log(np.abs(bias)))
            edge_log = np.log(np.abs(data))
        start_sign = np.where(is_input, 1.0, np.sign(bias))
        edge_sign = np.sign(data)
        first = np.asarray(self.outputs, dtype=np.int64)  # p_0 of the paths of this length
        end = np.arange(first.size, dtype=np.int64)
        sign, log_abs = np.ones(first.size), np.zeros(first.size)
        parent = np.full(first.size, -1, dtype=np.int64)  # the path it extends
        levels: list[tuple[np.ndarray, ...]] = []
        count = 0
        while first.size:
            levels.append((first, end, sign * start_sign[first], log_abs + start_log[first],
                           parent))
            degree = indptr[first + 1] - indptr[first]
            row = np.repeat(np.arange(first.size), degree)
            edge = indptr[first][row] + np.arange(row.size) - np.repeat(
                np.cumsum(degree) - degree, degree)
            parent = count + row
            count += first.size
            first, end = indices[edge], end[row]
            sign, log_abs = sign[row] * edge_sign[edge], log_abs[row] + edge_log[edge]
        first, end, sign, log_abs, parent = (np.concatenate(a)
                                             for a in zip(*levels, strict=True))
        padded = np.full((first.size, len(levels)), -1, dtype=np.int64)
        at = np.arange(first.size)
        for column in range(len(levels)):  # p_0, then each neuron after it to the output
            there = at >= 0
            padded[there, column] = first[at[there]]
            at = np.where(there, parent[np.where(there, at, 0)], -1)
        order = np.argsort(end, kind="stable")
        return PathLifting(padded[order], end[order], sign[order], log_abs[order])

    def values(self, x: Tensor) -> np.ndarray:
        """v(theta, x) for every neuron v, by the recursion of Def. 2.2.2 (Eq. 2.2-2.3)."""
        flat = self._flat_input(x)
        indptr, indices, data = self._csr
        vals = np.zeros(len(self.neurons))
        vals[: len(flat)] = flat
        for v in range(len(flat), len(self.neurons)):
            neuron = self.neurons[v]
            inputs = vals[indices[indptr[v]: indptr[v + 1]]]
            weights = data[indptr[v]: indptr[v + 1]]
            if neuron.activation is Activation.MAXPOOL:
                vals[v] = np.max(neuron.bias + inputs * weights)
            else:
                pre = neuron.bias + float(inputs @ weights)
                vals[v] = max(pre, 0.0) if neuron.activation is Activation.RELU else pre
        return vals

    def activations(self, x: Tensor) -> PathActivations:
        """The path-activations A(theta, x) of Def. 2.3.3.

        a_p = a_{p_0} * prod of edge activations: an edge into a ReLU neuron v is active iff
        v(theta, x) > 0; an edge u -> v into a max-pool neuron iff u is the first antecedent
        (ascending id) attaining the max; every other neuron and edge is active.
        """
        vals = self.values(x)
        relu = np.array([v.activation is Activation.RELU for v in self.neurons])
        node_on = ~relu | (vals > 0)
        chosen = np.full(len(self.neurons), -1, dtype=np.int64)
        for i, v in enumerate(self.neurons):
            if v.activation is Activation.MAXPOOL:
                scores = [v.bias + vals[u] * w for u, w in zip(v.antecedents, v.weights,
                                                                strict=True)]
                chosen[i] = v.antecedents[int(np.argmax(scores))]  # argmax: first maximum
        padded = self.phi().padded
        active = node_on[padded[:, 0]]
        for step in range(1, padded.shape[1]):
            prev, cur = padded[:, step - 1], padded[:, step]
            there = cur >= 0
            cur_safe = np.where(there, cur, 0)
            edge_on = np.where(chosen[cur_safe] >= 0, chosen[cur_safe] == prev,
                               node_on[cur_safe])
            active &= ~there | edge_on
        starts = padded[:, 0]
        column = np.where(starts < self.num_inputs, starts, self.num_inputs)
        return PathActivations(active, column, self.num_inputs)

    def output(self, x: Tensor) -> np.ndarray:
        """R_theta(x) through Thm 2.4.2: <Phi^{->v}, A^{->v}(theta, x)(x; 1)> per output v,
        flattened over all output tensors."""
        phi = self.phi()
        act = self.activations(x)
        x1 = np.append(self._flat_input(x), 1.0)
        terms = phi.values * act.active * x1[act.column]
        return np.bincount(phi.ends, weights=terms, minlength=len(self.outputs))

    def output_path_norms_log(self, q: float) -> np.ndarray:
        """ln ||Phi^{->v}(theta)||_q for each output v, as an explicit sum over its paths."""
        check_q(q)
        phi = self.phi()
        logs = np.empty(len(self.outputs))
        bounds = np.searchsorted(phi.ends, np.arange(len(self.outputs) + 1))
        for j in range(len(self.outputs)):
            logs[j] = _log_sum_exp(q * phi.log_abs[bounds[j]: bounds[j + 1]]) / q
        return logs

    def path_norm_log10(self, q: float = 1.0, r: float | None = None) -> float:
        """log10 of the mixed path-norm ||Phi(theta)||_{q,r} of Def. 3.1.1, by enumeration
        (r = q when None: ||Phi(theta)||_q)."""
        r = q if r is None else r
        check_r(r)
        per_output = self.output_path_norms_log(q)
        total = per_output.max() if math.isinf(r) else _log_sum_exp(r * per_output) / r
        return float(total) / LN10

    def path_norm(self, q: float = 1.0, r: float | None = None) -> float:
        """The mixed path-norm ||Phi(theta)||_{q,r} of Def. 3.1.1 (inf beyond float64)."""
        log10 = self.path_norm_log10(q, r)
        return power10(log10)

    def _flat_input(self, x: Tensor) -> np.ndarray:
        x = torch.as_tensor(x)
        if tuple(x.shape) not in (self.input_shape, (1, *self.input_shape)):
            raise ShapeError(f"input of shape {tuple(x.shape)} does not fit the DAG's input "
                             f"shape {self.input_shape} (batch dimension 1 at most)")
        return x.detach().to(torch.float64).reshape(-1).cpu().numpy()


def _learn_pieces(points: np.ndarray, values: np.ndarray, checks: np.ndarray,
                  checked: np.ndarray, name: str) -> tuple[list[float], list[float], float]:
    """(breakpoints t_1 < ... < t_k, slopes s_0..s_k, f(t_1)) of the scalar function with
    ``values`` at the sorted ``points``: runs of cells of one slope are pieces, a single
    cell between two pieces whose lines meet inside it holds that breakpoint, and the
    breakpoint between two pieces is where their lines meet. The reconstruction must
    match the op's values ``checked`` at ``checks``; a function it does not match (two
    breakpoints in one cell, a discontinuity) is refused."""
    slopes = np.diff(values) / np.diff(points)
    runs: list[list] = []  # [slope, intercept, first cell, last cell]
    for i, s in enumerate(slopes):
        if runs and math.isclose(s, runs[-1][0], rel_tol=1e-9, abs_tol=1e-12):
            runs[-1][3] = i
        else:
            runs.append([float(s), float(values[i] - s * points[i]), i, i])
    kept = [runs[0]]
    for k in range(1, len(runs)):
        run, nxt = runs[k], runs[k + 1] if k + 1 < len(runs) else None
        if nxt is not None and run[2] == run[3] and kept[-1][0] != nxt[0]:
            meet = (nxt[1] - kept[-1][1]) / (kept[-1][0] - nxt[0])
            if points[run[2]] <= meet <= points[run[2] + 1]:
                continue  # a cell straddling one breakpoint
        kept.append(run)
    lines = [(s, b) for s, b, _, _ in kept]
    if len(lines) == 1:  # linear: one breakpoint at 0 with equal slopes
        lines.append(lines[0])
        breaks = [0.0]
    else:
        breaks = [(b2 - b1) / (s1 - s2) for (s1, b1), (s2, b2) in itertools.pairwise(lines)]
    piece_slopes = [s for s, _ in lines]
    value = lines[0][0] * breaks[0] + lines[0][1]
    rebuilt = _evaluate(checks, breaks, piece_slopes, value)
    scale = max(1.0, float(np.abs(values).max()))
    if any(b >= a for a, b in zip(breaks[1:], breaks, strict=False)) or not np.allclose(
            rebuilt, checked, rtol=1e-9, atol=1e-9 * scale):
        raise UnsupportedModelError(
            f"node '{name}': the neuron DAG could not resolve this activation as a "
            "continuous piecewise-linear function (breakpoints closer than its probes, or "
            "beyond +-2^20)")
    return breaks, piece_slopes, value


def _evaluate(z: np.ndarray, breaks: list[float], slopes: list[float], value: float
              ) -> np.ndarray:
    """The piecewise-linear function of (breaks, slopes, f(t_1)) at ``z``."""
    out = value + slopes[0] * np.minimum(z - breaks[0], 0.0)
    for i, t in enumerate(breaks):
        right = breaks[i + 1] if i + 1 < len(breaks) else np.inf
        out = out + slopes[i + 1] * (np.clip(z, t, right) - t)
    return out


def _lowering(breaks: list[float], slopes: list[float], value: float
              ) -> tuple[list[tuple[float, float, float]], float]:
    """((sigma_j, beta_j, c_j), f(t_1)) of the documented lowering f(z) = f(t_1)
    - s_0 ReLU(t_1 - z) + s_1 ReLU(z - t_1) + sum_{i>=2} (s_i - s_{i-1}) ReLU(z - t_i),
    zero coefficients left out."""
    neurons = [(-1.0, breaks[0], -slopes[0]), (1.0, -breaks[0], slopes[1])]
    neurons += [(1.0, -breaks[i], slopes[i + 1] - slopes[i]) for i in range(1, len(breaks))]
    return [n for n in neurons if n[2] != 0], value


def _log_sum_exp(a: np.ndarray) -> float:
    """ln sum exp(a), with an exact (fsum) sum of the rescaled terms."""
    if a.size == 0:
        return -math.inf
    top = float(a.max())
    if top == -math.inf:
        return top
    return top + math.log(math.fsum(np.exp(a - top)))


class _Builder(OpWalker):
    """Runs the traced graph on tensors of neuron ids, creating neurons as it goes."""

    def __init__(self, graph: LayerGraph):
        super().__init__(graph)
        self.node: list[str] = []
        self.index: list[tuple[int, ...]] = []
        self.act: list[Activation] = []
        self.bias: list[float] = []
        self.edges: list[dict[int, float]] = []
        self.from_relu: list[bool] = []

    def input_ids(self) -> Tensor:
        shape = self.layer_graph.input_shape
        return self._new("x", shape, Activation.INPUT, np.zeros(math.prod(shape)),
                         [{} for _ in range(math.prod(shape))])

    def _new(self, node: str, shape: Sequence[int], act: Activation, bias: np.ndarray,
             edges: list[dict[int, float]], from_relu: bool = False) -> Tensor:
        """Neurons for every element of an output of ``shape``; their ids, batch 1."""
        start = len(self.node)
        for flat, idx in enumerate(np.ndindex(*shape)):
            self.node.append(node)
            self.index.append(tuple(int(i) for i in idx))
            self.act.append(act)
            self.bias.append(float(bias[flat]))
            self.edges.append(edges[flat])
            self.from_relu.append(from_relu)
        count = len(self.node) - start
        return torch.arange(start, start + count, dtype=torch.int64).reshape(1, *shape)

    def on_relu(self, handler: Handler, call: Call) -> Tensor:
        ids = call.args[0]
        edges = [{int(u): 1.0} for u in ids.reshape(-1).tolist()]
        return self._new(call.label, ids.shape[1:], Activation.RELU, np.zeros(len(edges)),
                         edges, from_relu=True)

    def on_maxpool(self, handler: Handler, call: Call) -> Tensor:
        return self._maxpool(call.label, call)

    def on_affine(self, handler: Handler, call: Call) -> Tensor:
        return self._linear(call.label, call)

    on_pool = on_add = on_affine

    def on_activation(self, handler: Handler, call: Call) -> Tensor:
        return self._piecewise(call.label, call)

    def _linear(self, name: str, call: Call) -> Tensor:
        """Neurons of an affine op: bias = op(0), matrix = op(basis) - op(0), per input."""
        if any(isinstance(v, Tensor) for v in call.kwargs.values()):
            raise UnsupportedModelError(f"node '{name}' passes a tensor by keyword; NeuronDAG "
                                        "probes positional tensor arguments only")
        slots = [i for i, a in enumerate(call.args) if isinstance(a, Tensor)]
        call = self._distinct(call, slots)
        zeros = [torch.zeros(call.args[i].shape, dtype=torch.float64) for i in slots]
        y0 = self._run(call, slots, zeros)
        bias = y0.reshape(-1).numpy()
        edges: list[dict[int, float]] = [{} for _ in range(bias.size)]
        for k, slot in enumerate(slots):
            ids = call.args[slot].reshape(-1)
            n_in = ids.numel()
            probes = [torch.zeros((n_in, *call.args[i].shape[1:]), dtype=torch.float64)
                      for i in slots]
            probes[k] = torch.eye(n_in, dtype=torch.float64).reshape(probes[k].shape)
            matrix = (self._run(call, slots, probes) - y0).reshape(n_in, -1).numpy()
            for i, o in zip(*np.nonzero(matrix), strict=True):
                edges[o][int(ids[i])] = float(matrix[i, o])
        return self._new(name, y0.shape[1:], Activation.IDENTITY, bias, edges)

    def _piecewise(self, name: str, call: Call) -> Tensor:
        """An elementwise continuous piecewise-linear activation, lowered to ReLU neurons
        n_j = ReLU(sigma_j z + beta_j) and one identity neuron y = f(t_1) + sum_j c_j n_j
        per element (the representation of ``pathlift.graph.ops.activation``), with the
        breakpoints and slopes learnt by probing the real op (``_learn_pieces``): on
        ``_GRID``, then finely in every grid cell where the slope changes, then checked."""
        ids = call.args[0]
        flat = ids.reshape(-1)

        def probe(points: np.ndarray) -> np.ndarray:
            z = torch.tensor(points, dtype=torch.float64).reshape(
                (-1,) + (1,) * (ids.dim() - 1)).expand((len(points), *ids.shape[1:]))
            return _of_first(call, z.contiguous()).run().reshape(len(points), -1).numpy()

        coarse = probe(_GRID)
        slopes = np.diff(coarse, axis=0) / np.diff(_GRID)[:, None]
        bends = ~np.isclose(slopes[1:], slopes[:-1], rtol=1e-9, atol=1e-12).all(axis=1)
        cells = sorted({c for i in np.flatnonzero(bends) for c in (i, i + 1)})
        fine = np.unique(np.concatenate(
            [np.linspace(_GRID[c], _GRID[c + 1], 66)[1:-1] for c in cells] or [np.empty(0)]))
        points = np.concatenate([_GRID, fine])
        order = np.argsort(points)
        checks = np.concatenate([points[order][:-1] + np.diff(points[order]) * f
                                 for f in (0.3, 0.7)])
        values = np.concatenate([coarse, probe(fine), probe(checks)])
        functions, which = np.unique(values, axis=1, return_inverse=True)
        cut = len(points)
        lowered = [_lowering(*_learn_pieces(points[order], functions[:cut][order, k], checks,
                                            functions[cut:, k], name))
                   for k in range(functions.shape[1])]
        out = torch.empty_like(flat)
        for pos, (u, k) in enumerate(zip(flat.tolist(), which.reshape(-1).tolist(),
                                         strict=True)):
            neurons, constant = lowered[k]
            hidden = [int(self._new(name + ".relu", (1,), Activation.RELU, np.array([beta]),
                                    [{int(u): sigma}])[0, 0]) for sigma, beta, _ in neurons]
            edges = {h: c for h, (_, _, c) in zip(hidden, neurons, strict=True)}
            out[pos] = self._new(name, (1,), Activation.IDENTITY, np.array([constant]),
                                 [edges])[0, 0]
        return out.reshape(ids.shape)

    def _maxpool(self, name: str, call: Call) -> Tensor:
        """1-max-pool neurons, weights 1, bias 0; windows found by probing the real op. A
        min-pool (min x = -max(-x)), found when probing from above, is max-pool neurons
        with incoming weights -1 followed by identity neurons of weight -1."""
        call = self._distinct(call, [0])
        ids = call.args[0]
        n_in = ids.numel()
        for sign in (1.0, -1.0):  # a max, else a min
            probe = torch.full((n_in, *ids.shape[1:]), sign * _FAR_BELOW, dtype=torch.float64)
            probe.reshape(n_in, n_in).fill_diagonal_(0.0)
            hit = (call.run(probe) == 0).reshape(n_in, -1).numpy()
            if hit.any(axis=0).all():
                break
        else:
            raise UnsupportedModelError(f"node '{name}' has a max-pool window inside the "
                                        "padding only (its output is -inf); reduce the "
                                        "padding or the dilation")
        flat_ids = ids.reshape(-1)
        edges: list[dict[int, float]] = [{} for _ in range(hit.shape[1])]
        for i, o in zip(*np.nonzero(hit), strict=True):
            edges[o][int(flat_ids[i])] = sign
        out_shape = call.run(torch.zeros(ids.shape, dtype=torch.float64)).shape[1:]
        pooled = self._new(name, out_shape, Activation.MAXPOOL, np.zeros(hit.shape[1]), edges)
        if sign > 0:
            return pooled
        return self._new(f"{name}.negated", out_shape, Activation.IDENTITY,
                         np.zeros(hit.shape[1]), [{int(u): -1.0} for u in pooled.reshape(-1)])

    def _distinct(self, call: Call, slots: list[int]) -> Call:
        """The call with every repeated neuron (x + x, a conv after cat([x, x])) read
        through a fresh identity copy (weight 1, bias 0): Def. 2.2.2 has no parallel edges,
        and the copies keep each torch weight its own edge, as in the |theta|^q pass."""
        seen: set[int] = set()
        args = list(call.args)
        for slot in slots:
            flat = args[slot].reshape(-1).clone()
            for pos, u in enumerate(flat.tolist()):
                if u in seen:
                    flat[pos] = self._new(f"{call.node.name}.copy", (1,), Activation.IDENTITY,
                                          np.zeros(1), [{u: 1.0}])[0, 0]
                seen.add(u)
            args[slot] = flat.reshape(args[slot].shape)
        return Call(call.node, call.module, tuple(args), call.kwargs)

    @staticmethod
    def _run(call: Call, slots: list[int], tensors: list[Tensor]) -> Tensor:
        args = list(call.args)
        for slot, t in zip(slots, tensors, strict=True):
            args[slot] = t
        return Call(call.node, call.module, tuple(args), call.kwargs).run()

    def finish(self, outputs: list[Tensor]) -> NeuronDAG:
        """Merge each ReLU into the neurons it follows when possible, renumber, freeze."""
        out_ids = [int(i) for t in outputs for i in t.reshape(-1).tolist()]
        alias = list(range(len(self.node)))
        successors = [0] * len(self.node)
        for e in self.edges:
            for u in e:
                successors[u] += 1
        watched = set(out_ids)
        kept: list[int] = []
        for v in range(len(self.node)):
            self.edges[v] = {alias[u]: w for u, w in self.edges[v].items()}
            if self.from_relu[v]:
                (u,) = self.edges[v]
                if (self.act[u] in (Activation.IDENTITY, Activation.RELU)
                        and successors[u] == 1 and u not in watched):
                    self.act[u] = Activation.RELU  # relu(relu(z)) = relu(z)
                    successors[u] = successors[v]
                    alias[v] = u
                    if v in watched:
                        watched.add(u)
                    continue
            kept.append(v)
        new_id = {v: i for i, v in enumerate(kept)}
        neurons = []
        for v in kept:
            edges = sorted((new_id[u], w) for u, w in self.edges[v].items())
            neurons.append(Neuron(self.node[v], self.index[v], self.act[v], self.bias[v],
                                  tuple(u for u, _ in edges), tuple(w for _, w in edges)))
        indptr = np.cumsum([0] + [len(v.antecedents) for v in neurons])
        indices = np.fromiter((u for v in neurons for u in v.antecedents), dtype=np.int64)
        data = np.fromiter((w for v in neurons for w in v.weights), dtype=np.float64)
        return NeuronDAG(tuple(neurons), self.layer_graph.input_shape,
                         tuple(new_id[alias[v]] for v in out_ids),
                         tuple(tuple(t.shape[1:]) for t in outputs), (indptr, indices, data))


def _of_first(call: Call, z: Tensor) -> Call:
    """``call`` with ``z`` as its first argument and every other argument that the traced
    graph computes from that first argument alone (with numbers: the condition ``h > c``
    of a selection, a filled tensor sized by h) computed again from ``z``: the real op as a
    function of its activation."""
    first = call.node.args[0]

    missing = object()  # a value read from another node: not a function of z alone

    def again(value: object) -> object:
        if value is first:
            return z
        if isinstance(value, list | tuple):
            found = [again(v) for v in value]
            return missing if any(v is missing for v in found) else type(value)(found)
        if not isinstance(value, fx.Node):
            return value
        if value.op not in ("call_function", "call_method"):
            return missing
        args = [again(a) for a in value.args]
        kwargs = {k: again(v) for k, v in value.kwargs.items()}
        if any(a is missing for a in (*args, *kwargs.values())):
            return missing
        if value.op == "call_method":
            return getattr(args[0], value.target)(*args[1:], **kwargs)
        return value.target(*args, **kwargs)

    args = [z]
    for node, recorded in zip(call.node.args[1:], call.args[1:], strict=False):
        found = again(node) if isinstance(node, fx.Node) else missing
        args.append(recorded if found is missing else found)
    return call.replace(*args)
