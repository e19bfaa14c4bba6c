"""A data-dependent code for the compression certificate: a reference network A trained on
part of the sample fixes the code, the bound is counted on the rest.

**Theorem** (Occam with a data-dependent prior; Langford 2005 Thm 3.3 as in
``pathlift.bounds.kl``, in the form of Ambroladze, Parrado-Hernandez & Shawe-Taylor 2007,
Parrado-Hernandez et al. 2012 JMLR, Dziugaite et al. 2021 "On the role of data in
PAC-Bayes bounds", Perez-Ortiz et al. 2021 JMLR "Tighter risk certificates for neural
networks"). Fix in advance a rule that splits n sample indices into S1 (n1 of them) and
S2 (n2 = n - n1): here ``split_sample``, a seeded uniform permutation and a fraction fixed
before the data are seen. Let A be any network computed from S1 alone (the reference).
Given A, ``relative`` maps a coded network Q (``pathlift.bounds.code.CodedNetwork``) to
the coded network D of its differences with A on Q's own grids, injectively (``absolute``
inverts it), so the code word c_A(Q) = ``encode``(D) is a prefix code of the Q's that
depends on S1 only: sum_Q 2^-|c_A(Q)| <= sum over words 2^-|w| <= 1 (Kraft). Conditionally
on S1, S2 is n2 i.i.d. draws independent of c_A, so the Occam bound of
``pathlift.bounds.compression`` (its theorem, proof unchanged with L(Q) = |c_A(Q)| and n =
n2) holds over S2: with probability >= 1 - delta,

    P(theta errs) <= kl^-1(P_S2[E(Q)], (L(Q|A) ln 2 + ln T + ln 1/delta) / n2)

for every Q and event E of the grid at once, hence for Q and theta chosen after seeing all
of S (theta may be trained on S1 and S2 together: only the event must be counted on S2,
where the prior does not look). Integrating over S1 keeps the probability >= 1 - delta.
The statement says: code from n1 samples, bound on the other n2.

The map: A_int = trunc(A / 2^e) on the grid 2^e of Q's tensor (the exponent e is in D's
header), A_pruned = (A == 0). Where A is not pruned, D is pruned where Q is and D's code
is Q_int - A_int elsewhere; where A is pruned, D's code is Q_int, and D is pruned only
where Q is not pruned with code 0 (Q pruned gives D = 0 unpruned). So Q = A gives D = 0
everywhere, a few bits a tensor (``pathlift.bounds.enumerative``: one symbol, no
arrangement), and a Q that moves few weights of A a grid step costs about its number of
weights times the empirical entropy of its differences, not of its weights.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from pathlift.bounds.code import CodedNetwork, quantized_tensors
from pathlift.bounds.duplicates import duplicates, row_hashes
from pathlift.bounds.sample import as_batches
from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from pathlift.graph import graph_of, unwrap, writable_copy
from pathlift.graph.outputs import OutputKey, select_output

__all__ = ["Reference", "absolute", "reference_of", "relative", "split_sample"]


def split_sample(n: int, prior_fraction: float, seed: int = 0) -> tuple[Tensor, Tensor]:
    """(S1, S2): the indices of a uniform permutation of range(n) drawn with ``seed``, its
    first floor(``prior_fraction`` n) for the reference network, the others for the bound
    (each sorted). Fix the fraction and the seed before looking at the data."""
    if not 0 < prior_fraction < 1:
        raise InvalidParameterError(f"prior_fraction must lie in (0, 1), got {prior_fraction}")
    n1 = math.floor(prior_fraction * n)
    if not 0 < n1 < n:
        raise InvalidParameterError(f"a split of {n} samples at {prior_fraction} leaves a "
                                    "part empty; use more samples or another fraction")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[:n1].sort().values, order[n1:].sort().values


def _digest(x: Tensor, y: Tensor) -> str:
    """sha256 of the rows (their dtype, shape and bytes, labels as int64)."""
    h = hashlib.sha256()
    for t in (x.detach().cpu().contiguous(), y.detach().cpu().to(torch.int64).contiguous()):
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True, repr=False)
class Reference:
    """The reference network A of the module docstring, frozen: its quantisable tensors
    (float64, in ``quantized_tensors`` order, by ``names``), the sample size ``n`` it was
    split from, the indices ``prior`` of S1 (those A was trained on) and a ``digest`` of
    those rows, so that the bound counts its events on the complement of exactly the rows
    A saw (``held_out``)."""

    names: tuple[str, ...]
    values: tuple[Tensor, ...]
    n: int
    prior: Tensor
    digest: str

    @property
    def n1(self) -> int:
        return len(self.prior)

    @property
    def n2(self) -> int:
        return self.n - self.n1

    def held_out(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(x, y) of S2 from the whole sample (x, y) the reference's split was made on.
        InvalidParameterError when (x, y) is not that sample: another length, or rows at
        S1's indices other than those A was trained on."""
        if not (isinstance(x, Tensor) and isinstance(y, Tensor)):
            raise InvalidParameterError("a certificate with a reference takes the whole "
                                        "sample as two tensors (x, y), not batches")
        if len(x) != self.n or len(y) != self.n:
            raise InvalidParameterError(
                f"the reference was split from {self.n} samples, got {len(x)}: pass the whole "
                "sample (S1 and S2) the split was made on")
        if _digest(x[self.prior], y[self.prior]) != self.digest:
            raise InvalidParameterError(
                "the rows at the reference's S1 indices are not those it was trained on: "
                "pass the sample the split was made on, in its order")
        return x[self._bound_rows()], y[self._bound_rows()]

    def repeats(self, x: Tensor, y: Tensor) -> int:
        """The rows of S2 (of the whole sample (x, y)) equal to a row of S1 or to an earlier
        row of S2: the duplicates the certificate reports. A row of S2 that A saw in S1 is
        no fresh draw for A (a sample passed twice puts most rows in both parts), which an
        i.i.d. sample of a continuous distribution never holds."""
        s1, s2 = self.prior, self._bound_rows().nonzero().reshape(-1)

        def repeated(rows: Tensor) -> int:
            return duplicates(as_batches(x[rows], y[rows]), row_hashes(x[rows], y[rows]))

        return repeated(torch.cat([s1, s2])) - repeated(s1)

    def _bound_rows(self) -> Tensor:
        """The mask of S2's rows in the whole sample."""
        keep = torch.ones(self.n, dtype=torch.bool)
        keep[self.prior] = False
        return keep

    def codes(self, exponents: Sequence[int]) -> list[Tensor]:
        """A_int = trunc(A / 2^e) per tensor (int64), exactly (division by a power of two)."""
        out = []
        for v, e in zip(self.values, exponents, strict=True):
            k = torch.trunc(torch.ldexp(v, torch.tensor(-e, dtype=torch.float64)))
            if bool((k.abs() >= 2.0 ** 62).any()):
                raise InvalidParameterError(f"the reference's codes overflow on the grid 2^{e}")
            out.append(k.to(torch.int64))
        return out

    def __repr__(self) -> str:
        return (f"Reference({len(self.values)} tensors, n1 = {self.n1} samples for the code, "
                f"n2 = {self.n2} for the bound)")


def reference_of(model: nn.Module, input_shape: Sequence[int], x: Tensor, y: Tensor,
                 prior: Tensor, outputs: OutputKey | None = None) -> Reference:
    """The ``Reference`` of a network A trained on (x[prior], y[prior]) alone, ``prior``
    the S1 of ``split_sample(len(x), ...)``; ``outputs`` picks the class logits of a model
    returning several, as ``compression_bound``'s. The model is not modified. That A saw
    no row outside S1 is the caller's to keep (``pathlift.train.train_with_reference``
    keeps it by construction): the reference records which rows are S1, not how A was
    trained."""
    prior = torch.as_tensor(prior, dtype=torch.int64).sort().values
    if len(prior) and (int(prior[0]) < 0 or int(prior[-1]) >= len(x)
                       or bool((prior[1:] == prior[:-1]).any())):
        raise InvalidParameterError("prior must hold distinct indices of the sample")
    shape = tuple(input_shape)
    net = writable_copy(select_output(unwrap(model), outputs, shape)).to(torch.float64).eval()
    tensors = quantized_tensors(graph_of(net, shape))
    return Reference(tuple(name for name, *_ in tensors),
                     tuple(v.detach().clone() for *_, v in tensors), len(x), prior,
                     _digest(x[prior], y[prior]))


def relative(coded: CodedNetwork, reference: Reference) -> CodedNetwork:
    """D, the differences of Q = ``coded`` with the reference on Q's grids (module
    docstring); ``absolute(relative(Q, A), A) == Q``."""
    return _shifted(coded, reference, -1)


def absolute(diff: CodedNetwork, reference: Reference) -> CodedNetwork:
    """Q from its differences D with the reference (inverse of ``relative``)."""
    return _shifted(diff, reference, 1)


def _shifted(network: CodedNetwork, reference: Reference, sign: int) -> CodedNetwork:
    """Both directions of the map: where A is pruned the pruned flag is swapped with "code
    0, not pruned" and the codes kept (A_int = 0 there), elsewhere the flag is kept and
    sign * A_int added to the codes of unpruned coordinates."""
    if [tuple(c.shape) for c in network.codes] != [tuple(v.shape) for v in reference.values]:
        raise ArchitectureMismatchError("the reference network's tensors do not have the "
                                        "shapes of the certified network's")
    codes, pruned = [], []
    for c, p, a, v in zip(network.codes, network.pruned, reference.codes(network.exponents),
                          reference.values, strict=True):
        flag = torch.where(v == 0, ~p & (c == 0), p)
        codes.append(torch.where(flag, 0, c + sign * a))
        pruned.append(flag)
    return CodedNetwork(network.architecture, network.exponents, network.zero_exponents,
                        tuple(codes), tuple(pruned), network.constants)
