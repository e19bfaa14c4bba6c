"""Local identifiability of a ReLU DAG network from its outputs on finitely many inputs.

Thesis Sec. 7.1.1 asks for practical identifiability tests for the DAG networks of
Def. 2.2.2. Two results on layered fully-connected networks carry over through the
path-lifting (Thm 2.4.2: R_theta(x) = <Phi(theta), A(theta, x)(x; 1)>):

- Stock & Gribonval 2023, "An embedding of ReLU networks and an analysis of their
  identifiability" (Constr. Approx. 57): Phi determines theta up to rescalings (their
  Thm 1), so at a generic theta the kernel of dPhi/dtheta is the tangent space of the
  rescaling orbit, of dimension the number of free rescaling groups.
- Bona-Pellissier, Bachoc & Malgouyres 2022, "Local identifiability of deep ReLU neural
  networks: the theory" (NeurIPS 2022): theta is locally identifiable from inputs
  x_1..x_n, up to its symmetries, when the Jacobian of theta -> (R_theta(x_i))_i has rank
  dim theta minus the dimension of the symmetries.

``identify`` computes that rank (``pathlift.symmetry.rank``), the symmetry dimension
predicted by the known obstructions (``pathlift.symmetry.obstructions``) and cross-checked
against the rank of dPhi/dtheta (``pathlift.symmetry.jacobian``), and the number of linear
regions the inputs visit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.errors import InvalidParameterError, ShapeError, check_number
from pathlift.graph import LayerGraph
from pathlift.graph.channels import analyse
from pathlift.memory import check_samples
from pathlift.symmetry.jacobian import Parameterized, activation_patterns
from pathlift.symmetry.obstructions import Obstructions, obstructions
from pathlift.symmetry.rank import Rank, dense_jacobian, exact_rank, randomized_rank

DOMAIN = 4096  # Gaussian inputs standing for the input domain (dead / always-active neurons)
EXACT_MAX = 4096  # "auto" computes dense Jacobians and full SVDs up to this many parameters
_INVOLVED = 0.1  # a layer is named when it carries this share of a missing direction


@dataclass(frozen=True)
class SymmetryDimension:
    """Dimension of the symmetries of theta: ``predicted`` by the known obstructions, and
    ``phi_kernel`` = dim theta - rank dPhi/dtheta (Stock & Gribonval 2023, Thm 1: the
    rescaling orbit; it does not see twins, dead neurons or bias shifts)."""

    num_params: int
    obstructions: Obstructions
    phi_rank: Rank | None

    @property
    def predicted(self) -> int:
        return self.obstructions.total

    @property
    def phi_kernel(self) -> int | None:
        return None if self.phi_rank is None else self.num_params - self.phi_rank.rank

    def __repr__(self) -> str:
        phi = "" if self.phi_rank is None else f", dim ker dPhi = {self.phi_kernel}"
        return f"SymmetryDimension({self.predicted} of {self.num_params}{phi})"


@dataclass(frozen=True)
class Identifiability:
    """The local identifiability test from ``samples`` inputs.

    ``identified``: rank of d(R_theta(x_i))_i / dtheta = ``num_params`` - symmetry
    dimension (Bona-Pellissier et al. 2022); else ``missing`` directions are unresolved
    (negative: the rank exceeds the prediction, a predicted obstruction is not one at this
    theta). ``involved`` names the layers carrying the unexplained null directions (exact
    method only). ``regions`` counts the distinct activation patterns of the inputs.
    """

    identified: bool
    missing: int
    samples: int
    num_params: int
    symmetry: SymmetryDimension
    rank: Rank
    regions: int
    involved: tuple[str, ...]

    @property
    def deficiency(self) -> int:
        """dim theta - rank: the null directions, symmetries included."""
        return self.num_params - self.rank.rank

    def __repr__(self) -> str:
        verdict = "identified up to its symmetries" if self.identified else \
            f"NOT identified: {self.missing} missing directions" + \
            (f" in {', '.join(self.involved)}" if self.involved else "")
        return (f"Identifiability({verdict} from {self.samples} inputs: rank "
                f"{self.rank.rank} = {self.num_params} params - {self.deficiency}, "
                f"{self.symmetry.predicted} predicted symmetries, {self.regions} regions, "
                f"gap {self.rank.gap:.1e})")


def _inputs(par: Parameterized, inputs: Tensor | int, seed: int) -> Tensor:
    shape = par.graph.input_shape
    if isinstance(inputs, int):
        check_samples(inputs, shape, "identifiability")
        generator = torch.Generator().manual_seed(seed)
        return torch.randn((inputs, *shape), generator=generator, dtype=torch.float64)
    if tuple(inputs.shape[1:]) != shape:
        raise ShapeError(f"inputs of shape {tuple(inputs.shape)} do not fit the model's "
                         f"input shape {shape}; pass a batch (n, {', '.join(map(str, shape))})")
    return inputs.detach().to("cpu", torch.float64)


def _method(method: str, size: int, exact_max: int) -> str:
    if method not in ("auto", "exact", "randomized"):
        raise InvalidParameterError(f"method must be 'auto', 'exact' or 'randomized', "
                                    f"got {method!r}")
    if method == "auto":
        return "exact" if size <= exact_max else "randomized"
    return method


def _phi_rank(par: Parameterized, method: str, seed: int) -> tuple[Rank, Tensor | None]:
    """Rank of dPhi/dtheta through the gated path network, at enough random points."""
    d_out = par.graph.d_out
    points = math.ceil((par.size + 16) / d_out) + 2
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((points, *par.graph.input_shape), generator=generator, dtype=torch.float64)
    f = par.gated_outputs(x, generator)
    if method == "exact":
        return exact_rank(dense_jacobian(f, par.theta, points * d_out))
    return randomized_rank(f, par.theta, points * d_out, generator), None


def _phi_supported(graph: LayerGraph) -> bool:
    """The gated path network covers every op but activations with trainable slopes."""
    return not any(graph.handler(n).parametric and not graph.handler(n).live
                   for n in graph.nodes())


def _involved(par: Parameterized, null: Tensor, known: Tensor | None, missing: int
              ) -> tuple[str, ...]:
    """Layers carrying the null directions of J that the known symmetry directions (the
    kernel of dPhi/dtheta) do not explain: the top ``missing`` of the residual."""
    residual = null if known is None else null - known @ (known.T @ null)
    directions = torch.linalg.svd(residual, full_matrices=False)[0][:, :missing]
    mass: dict[str, float] = {}
    for name, part in par.slices():
        layer = name.rpartition(".")[0] or name
        share = directions[part].pow(2).sum(0)
        if bool((share >= _INVOLVED).any()):
            mass[layer] = mass.get(layer, 0.0) + float(share.sum())
    return tuple(sorted(mass, key=mass.__getitem__, reverse=True))


def _refuse_too_few(rows: int, needed: int, d_out: int, samples: int) -> None:
    """The Jacobian's rank is at most its row count: refuse a test that cannot succeed."""
    if rows < needed:
        raise InvalidParameterError(
            f"{samples} inputs give a Jacobian of {rows:,} rows ({samples} x {d_out} "
            f"outputs), fewer than the rank of {needed:,} the test needs (parameters minus "
            f"predicted symmetries): it cannot succeed; use at least "
            f"{math.ceil(needed / d_out):,} inputs")


def symmetry_dimension(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None,
                       domain: Tensor | int = DOMAIN, method: str = "auto", seed: int = 0,
                       exact_max: int = EXACT_MAX) -> SymmetryDimension:
    """The dimension of the symmetries of ``model`` at its parameters (thesis Sec. 7.1.1).

    Predicted by the obstructions (``pathlift.symmetry.obstructions``: rescalings per free
    tie group, dead and always-active neurons over the inputs ``domain`` that stand for the
    input domain — a batch, or a number of standard Gaussian inputs —, twins, bias shifts)
    and compared with dim theta - rank dPhi/dtheta (Stock & Gribonval 2023, Thm 1), exact
    up to ``exact_max`` parameters, randomized (Jacobian-vector products) above. The model
    is not modified.
    """
    par = Parameterized.of(model, None if input_shape is None else tuple(input_shape))
    return _symmetry(par, _obstructions(par, _inputs(par, domain, seed)),
                     _method(method, par.size, exact_max), seed)[0]


def _obstructions(par: Parameterized, domain: Tensor) -> Obstructions:
    return obstructions(par.graph, analyse(par.graph), activation_patterns(par.graph, domain))


def _symmetry(par: Parameterized, found: Obstructions, method: str, seed: int,
              with_phi: bool = True) -> tuple[SymmetryDimension, Tensor | None]:
    phi, known = _phi_rank(par, method, seed) if with_phi else (None, None)
    return SymmetryDimension(par.size, found, phi), known


def identify(model: nn.Module | LayerGraph, inputs: Tensor | int,
             input_shape: Sequence[int] | None = None, method: str = "auto",
             rtol: float | None = None, seed: int = 0, exact_max: int = EXACT_MAX,
             domain: Tensor | None = None, phi: bool | None = None, scale: float = 1.0
             ) -> Identifiability:
    """Is ``model`` locally identifiable, up to its symmetries, from its outputs on ``inputs``?

    Bona-Pellissier, Bachoc & Malgouyres 2022 ("Local identifiability of deep ReLU neural
    networks: the theory"), here for any DAG network of Def. 2.2.2: compares the rank of
    the Jacobian of theta -> (R_theta(x_i))_i with dim theta minus the symmetry dimension
    (``symmetry_dimension``; Stock & Gribonval 2023 for the rescaling part).

    Args:
        model: the network (any supported ReLU DAG), or its ``LayerGraph``.
        inputs: a batch (n, *input_shape), or a number n of Gaussian inputs N(0, scale^2)
            (float64, drawn from a generator seeded with ``seed``).
        input_shape: without the batch dimension; default that of ``inputs`` or the model's.
        method: "exact" (dense Jacobian by ``torch.func``, SVD in float64), "randomized"
            (Gaussian sketch by Jacobian-vector products, with an a posteriori bound), or
            "auto" (exact up to ``exact_max`` parameters).
        rtol: singular values below rtol * sigma_max count as zero (default
            max(m, P) * eps64, as numpy's matrix_rank).
        domain: inputs standing for the input domain, on which dead and always-active
            neurons are symmetries of the function (not gaps of the samples); default
            4096 Gaussian inputs with the standard deviation of ``inputs`` (at least 1).
        phi: also compute the rank of dPhi/dtheta (default: with the exact method only,
            and not for PReLU's trainable slopes; it needs about dim theta / d_out
            evaluations of the gated path network).
        scale: standard deviation of the Gaussian inputs when ``inputs`` is a number
            (``pathlift identify --scale``); ignored for a batch.

    Returns:
        An ``Identifiability``: verdict, missing directions and the layers they involve,
        the rank with its tolerance and singular value gap, the symmetry dimension and the
        number of linear regions (distinct activation patterns) the inputs visit.

    Raises:
        UnsupportedModelError naming the layers outside Def. 2.2.2; ShapeError when the
        inputs do not fit; InvalidParameterError for a bad ``method`` or sample count, and
        before any Jacobian is computed when n inputs give fewer rows (n x d_out) than
        the rank the test needs (dim theta minus the predicted symmetries): it could not
        succeed (the message gives the smallest n that could).

    Example::

        result = identify(mlp(in_features=4, hidden=(6,), num_classes=2), 200, (4,))
        result.identified, result.rank.rank, result.symmetry.predicted
    """
    if input_shape is None and isinstance(inputs, Tensor):
        input_shape = tuple(inputs.shape[1:])
    par = Parameterized.of(model, None if input_shape is None else tuple(input_shape))
    x = _inputs(par, inputs, seed)
    if isinstance(inputs, int):
        x = check_number("scale", scale, 0.0, above=True) * x
    method = _method(method, par.size, exact_max)
    if domain is None:
        domain = _inputs(par, DOMAIN, seed + 2) * max(1.0, float(x.std()) if x.numel() > 1 else 1.0)
    with_phi = method == "exact" and _phi_supported(par.graph) if phi is None else phi
    found = _obstructions(par, _inputs(par, domain, seed))
    rows = x.shape[0] * par.graph.d_out
    _refuse_too_few(rows, par.size - found.total, par.graph.d_out, x.shape[0])
    symmetry, known = _symmetry(par, found, method, seed, with_phi)
    regions = activation_patterns(par.graph, x).count_regions()
    f = par.outputs(x)
    if method == "exact":
        rank, null = exact_rank(dense_jacobian(f, par.theta, rows), rtol)
    else:
        rank, null = randomized_rank(f, par.theta, rows, torch.Generator().manual_seed(seed),
                                     rtol), None
    missing = par.size - symmetry.predicted - rank.rank
    involved = _involved(par, null, known, missing) if null is not None and missing > 0 else ()
    return Identifiability(missing <= 0, missing, x.shape[0], par.size, symmetry, rank,
                           regions, involved)
