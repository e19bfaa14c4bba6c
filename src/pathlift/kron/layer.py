"""``KSLinear``: a linear layer whose weight is a product of Kronecker-sparse factors
W = K_1 ⋯ K_L (thesis Ch. 5, Table 5.1), y = x W^T + bias."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.kron import cache
from pathlift.kron.factor import chain_to_dense, project, random_factor
from pathlift.kron.multiply import ALGORITHMS, apply, prepare
from pathlift.kron.pattern import KSPattern, check_chain
from pathlift.kron.timing import round_robin

__all__ = ["KSLinear", "fastest_algorithm"]

_FASTEST: dict[tuple[str, str], str] = {}


def fastest_algorithm(pattern: KSPattern, batch: int, dtype: torch.dtype,
                      device: torch.device | str = "cpu", repeats: int = 5) -> str:
    """The algorithm with the smallest forward time for this pattern, batch size, dtype and
    device (batch-size-first): all six timed round-robin at first use, each by its fastest
    of ``repeats`` runs (other processes and page faults only ever add time), so the choice
    is never slower than bmm as measured. Cached on disk per machine
    (``pathlift.kron.cache``: CPU, torch, threads, kernel build): measured once per machine."""
    device = torch.device(device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    key = (cache.fingerprint(), f"{pattern}|{batch}|{dtype}|{where}")
    if key not in _FASTEST:
        stored = cache.lookup("fastest", key[1])
        if stored not in ALGORITHMS:
            stored = _measure_fastest(pattern, batch, dtype, device, repeats)
            cache.store("fastest", key[1], stored)
        _FASTEST[key] = stored
    return _FASTEST[key]


def _measure_fastest(pattern: KSPattern, batch: int, dtype: torch.dtype,
                     device: torch.device, repeats: int) -> str:
    w = random_factor(pattern, dtype, device)
    x = torch.randn(batch, pattern.in_features, dtype=dtype, device=device)
    with torch.no_grad():
        ops = {alg: prepare(w, pattern, alg) for alg in ALGORITHMS}
        fns = {alg: (lambda alg=alg: apply(x, ops[alg], pattern, alg)) for alg in ops}
        times = {alg: min(ts) for alg, ts in round_robin(fns, repeats, device).items()}
    return min(times, key=times.__getitem__)


class KSLinear(nn.Module):
    """y = x (K_1 ⋯ K_L)^T + bias for inputs (..., N), N = a_L c_L d_L, outputs (..., M),
    M = a_1 b_1 d_1. Factors are parameters of shape (a, b, c, d), initialised uniformly in
    [-1/sqrt(c), 1/sqrt(c)] (thesis App. D.2.1).

    ``algorithm`` is one of ``pathlift.kron.ALGORITHMS`` or ``"auto"``: the fastest one
    measured for each factor's pattern at the batch size seen (cached per process).
    """

    def __init__(self, patterns: Sequence[KSPattern | Sequence[int]], bias: bool = True,
                 algorithm: str = "auto", dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None):
        super().__init__()
        self.patterns = check_chain(patterns)
        if algorithm != "auto" and algorithm not in ALGORITHMS:
            raise InvalidParameterError(
                f"unknown algorithm {algorithm!r}; choose 'auto' or one of {ALGORITHMS}")
        self.algorithm = algorithm
        self.in_features = self.patterns[-1].in_features
        self.out_features = self.patterns[0].out_features
        dtype = dtype or torch.get_default_dtype()
        self.factors = nn.ParameterList(
            nn.Parameter(random_factor(p, dtype, device)) for p in self.patterns)
        if bias:
            bound = 1.0 / math.sqrt(self.in_features)
            init = torch.empty(self.out_features, dtype=dtype, device=device).uniform_(-bound,
                                                                                       bound)
            self.bias = nn.Parameter(init)
        else:
            self.register_parameter("bias", None)
        self._cache: dict[tuple, tuple[int, dict]] = {}

    def extra_repr(self) -> str:
        chain = ", ".join(str(p) for p in self.patterns)
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"patterns=[{chain}], bias={self.bias is not None}, algorithm={self.algorithm}")

    def algorithms(self, batch: int) -> tuple[str, ...]:
        """Algorithm used for each factor at this batch size."""
        if self.algorithm != "auto":
            return (self.algorithm,) * len(self.patterns)
        w = self.factors[0]
        return tuple(fastest_algorithm(p, batch, w.dtype, w.device) for p in self.patterns)

    def _prepared(self, idx: int, algorithm: str) -> dict:
        w = self.factors[idx]
        if torch.is_grad_enabled() and w.requires_grad:
            return prepare(w, self.patterns[idx], algorithm)  # differentiable every call
        key = (idx, algorithm, w.data_ptr(), w.dtype, w.device)
        hit = self._cache.get(key)
        if hit is None or hit[0] != w._version:
            hit = (w._version, prepare(w.detach(), self.patterns[idx], algorithm))
            self._cache = {k: v for k, v in self._cache.items() if k[0] != idx} | {key: hit}
        return hit[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ShapeError(f"KSLinear expects inputs (..., {self.in_features}), got "
                             f"{tuple(x.shape)}")
        lead = x.shape[:-1]
        y = x.reshape(-1, self.in_features)
        algorithms = self.algorithms(y.shape[0])
        for idx in reversed(range(len(self.patterns))):  # x W^T = x K_L^T ⋯ K_1^T
            y = apply(y, self._prepared(idx, algorithms[idx]), self.patterns[idx],
                      algorithms[idx])
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def to_dense(self) -> torch.Tensor:
        """The dense M × N weight K_1 ⋯ K_L."""
        return chain_to_dense(list(self.factors), self.patterns)

    @classmethod
    def from_dense(cls, weight: torch.Tensor, patterns: Sequence[KSPattern | Sequence[int]],
                   bias: torch.Tensor | None = None, algorithm: str = "auto") -> KSLinear:
        """Layer whose factors are the projection of ``weight`` onto the chain (hierarchical
        block-SVD projection, ``pathlift.kron.project``); exact for Monarch, low-rank and
        butterfly products."""
        chain = check_chain(patterns)
        layer = cls(chain, bias=bias is not None, algorithm=algorithm, dtype=weight.dtype,
                    device=weight.device)
        with torch.no_grad():
            for param, w in zip(layer.factors, project(weight, chain), strict=True):
                param.copy_(w)
            if bias is not None:
                layer.bias.copy_(bias)
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Linear, patterns: Sequence[KSPattern | Sequence[int]],
                    algorithm: str = "auto") -> KSLinear:
        """Projection of an nn.Linear onto the chain (the Linear is not modified)."""
        return cls.from_dense(linear.weight.detach(), patterns,
                              None if linear.bias is None else linear.bias.detach(), algorithm)
