"""Path-norm bounds on the Rademacher complexity of ReLU DAG networks, in log space.

Convention (thesis Appendix C.5): R(F, S) = E_eps sup_{f in F} sum_i <eps_i, f(x_i)>, not
divided by n; Thm 4.1.1 then bounds the expected generalisation gap by (2 sqrt(2) L / n) R.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from pathlift.bounds.constants import ArchitectureConstants
from pathlift.errors import InvalidParameterError
from pathlift.logspace import power10


@dataclass(frozen=True)
class Sigma:
    """The data term sigma of the bounds, estimated on one sample S of size n.

    ``peeling`` = max(n, max_u sum_i x_{i,u}^2)^{1/2} over the input coordinates and the
    constant bias coordinate (Thm 4.4.1 with biases, Appendix C.5); ``covering`` =
    (sum_i max(1, ||x_i||_inf^2))^{1/2} (Thm 4.3.1); ``max_abs`` = max_i ||x_i||_inf, the
    B of thesis Sec. 7.2.1 (sigma / n <= B / sqrt(n)).
    """

    n: int
    peeling: float
    covering: float
    max_abs: float


def sigma_of(x: torch.Tensor) -> Sigma:
    """Sigma of Thm 4.4.1 and Thm 4.3.1 for the samples x (first dim = sample)."""
    flat = x.reshape(len(x), -1).to(torch.float64)
    return _sigma(len(flat), flat.pow(2).sum(0), flat.abs().amax(1))


def sigma_from_loader(loader: DataLoader) -> Sigma:
    """Sigma of Thm 4.4.1 and Thm 4.3.1 from one pass over a loader of (x, y) batches."""
    n, column_sq, row_max = 0, None, []
    for batch in loader:
        flat = batch[0].reshape(len(batch[0]), -1).to(torch.float64)
        n += len(flat)
        sq = flat.pow(2).sum(0)
        column_sq = sq if column_sq is None else column_sq + sq
        row_max.append(flat.abs().amax(1))
    if n == 0:
        raise InvalidParameterError("sigma_from_loader() got an empty loader")
    return _sigma(n, column_sq, torch.cat(row_max))


def _sigma(n: int, column_sq: torch.Tensor, row_max: torch.Tensor) -> Sigma:
    return Sigma(n=n, peeling=math.sqrt(max(n, float(column_sq.max()))),
                 covering=math.sqrt(float(row_max.pow(2).clamp(min=1.0).sum())),
                 max_abs=float(row_max.max()))


def peeling_constant(c: ArchitectureConstants, biases: bool = True,
                     depth: int | None = None) -> float:
    """C = (D log((3+2P)K) + log((3+2P)/(1+P) d_in d_out))^{1/2} of thesis Thm 4.4.1
    (d_in + 1 with biases, as in its extension to nonzero biases).

    ``depth`` overrides D = ``c.depth``; thesis Table 7.1 uses ``c.depth_without_maxpool``
    (Appendix E.1: D = 2 + #blocks x #convs, the max-pool layer not counted).
    """
    _check_depth(c)
    P, K = c.pool_types, c.kernel
    d_in = c.d_in + int(biases)
    D = c.depth if depth is None else depth
    return math.sqrt(D * math.log((3 + 2 * P) * K)
                     + math.log((3 + 2 * P) / (1 + P) * d_in * c.d_out))


def sharpened_constant(c: ArchitectureConstants, biases: bool = True) -> float:
    """C_sharpened = (D log 3 + M log K + log((d_in+1) d_out))^{1/2} of thesis Remark 4.4.1,
    with D the non-max-pool layers and M the max-pool layers of the longest path.

    Raises InvalidParameterError when the remark's assumptions fail (P != 1, or a skip
    connection jumps over a max-pool layer, as in U-Nets).
    """
    _check_depth(c)
    if not c.sharpened_applies:
        raise InvalidParameterError(
            "Remark 4.4.1 needs one type of max-pooling (P = 1) and no skip connection over "
            "a max-pool layer; use peeling_constant (Thm 4.4.1) for this network")
    d_in = c.d_in + int(biases)
    return math.sqrt(c.depth_without_maxpool * math.log(3) + c.maxpool_layers * math.log(c.kernel)
                     + math.log(d_in * c.d_out))


def _check_depth(c: ArchitectureConstants) -> None:
    if c.depth < 1:
        raise InvalidParameterError(
            "the network has no neuron between input and output (N_in and N_out must be "
            "disjoint, Thm 4.4.1); add a layer")


@dataclass(frozen=True)
class RademacherBound:
    """An upper bound on the Rademacher complexity R(F, mu) of {theta: ||Phi||_1 <= r}.

    ``log10`` is exact for any r (the path-norm is carried in log space); ``value`` may be
    inf. ``constant`` is the architecture factor (C, or 144 max(D, d_out) sqrt(#params)).
    """

    theorem: str
    constant: float
    sigma: float
    path_norm_log10: float
    log10: float

    @property
    def value(self) -> float:
        return power10(self.log10)


def rademacher_peeling(c: ArchitectureConstants, sigma: float, path_norm_log10: float,
                       sharpened: bool = False, biases: bool = True) -> RademacherBound:
    """R(F, mu) <= sqrt(2) sigma C r, thesis Thm 4.4.1 (C of Remark 4.4.1 if ``sharpened``).

    ``sigma`` is ``Sigma.peeling``, ``path_norm_log10`` is log10 of r = ||Phi(theta)||_1.
    """
    constant = sharpened_constant(c, biases) if sharpened else peeling_constant(c, biases)
    theorem = "Remark 4.4.1" if sharpened else "Thm 4.4.1"
    log10 = math.log10(math.sqrt(2) * sigma * constant) + path_norm_log10
    return RademacherBound(theorem, constant, sigma, path_norm_log10, log10)


def rademacher_covering(c: ArchitectureConstants, sigma: float, path_norm_log10: float,
                        weight_sharing: bool = True) -> RademacherBound:
    """R(F, mu) <= 144 sigma max(D, d_out) sqrt(#params) r, thesis Thm 4.3.1.

    ``sigma`` is ``Sigma.covering``. With ``weight_sharing`` #params counts free parameters
    (Theorem C.2.2); otherwise every coordinate of the unrolled DAG (Thm 4.3.1 as stated).
    """
    _check_depth(c)
    params = c.num_params if weight_sharing else c.num_params_unshared
    constant = 144.0 * max(c.depth, c.d_out) * math.sqrt(params)
    theorem = "Thm C.2.2" if weight_sharing else "Thm 4.3.1"
    log10 = math.log10(sigma * constant) + path_norm_log10
    return RademacherBound(theorem, constant, sigma, path_norm_log10, log10)
