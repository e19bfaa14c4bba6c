"""``KSLinear``: a linear layer whose weight is a product of Kronecker-sparse factors
W = K_1 ⋯ K_L (thesis Ch. 5, Table 5.1), y = x W^T + bias."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.kron import cache, cpu_kernel
from pathlift.kron.factor import chain_to_dense, project, random_factor
from pathlift.kron.multiply import ALGORITHMS, HALF, apply, prepare
from pathlift.kron.pattern import KSPattern, check_chain
from pathlift.kron.timing import round_robin

__all__ = ["DEFAULT_ALGORITHM", "KSLinear", "fastest_algorithm", "known_algorithm"]

DEFAULT_ALGORITHM = "bmm"  # an untuned "auto" factor: the baseline of thesis Ch. 5
TUNE_BATCH = 256  # batch size "auto" is chosen for when none is given

_FASTEST: dict[tuple[str, str], str] = {}


def _key(pattern: KSPattern, batch: int, dtype: torch.dtype, device: torch.device
         ) -> tuple[str, str]:
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return cache.fingerprint(), f"{pattern}|{batch}|{dtype}|{where}"


def known_algorithm(pattern: KSPattern, batch: int, dtype: torch.dtype,
                    device: torch.device | str = "cpu") -> str | None:
    """The fastest algorithm measured on this machine for this pattern, batch size, dtype
    and device (this process, or the disk cache), or None: nothing is timed or written."""
    key = _key(pattern, batch, dtype, torch.device(device))
    if key not in _FASTEST:
        stored = cache.lookup("fastest", key[1])
        if not isinstance(stored, str) or stored not in ALGORITHMS:  # malformed: re-measure
            return None
        _FASTEST[key] = stored
    return _FASTEST[key]


def fastest_algorithm(pattern: KSPattern, batch: int, dtype: torch.dtype,
                      device: torch.device | str = "cpu", repeats: int = 5) -> str:
    """The algorithm with the smallest forward time for this pattern, batch size, dtype and
    device (batch-size-first): all six timed round-robin, each by its fastest of
    ``repeats`` samples (other processes and page faults only ever add time), so the choice
    is never slower than bmm as measured. Measured once per machine: the result is stored
    in the disk cache (``pathlift.kron.cache``: CPU, torch, threads, kernel build) and
    read back by ``known_algorithm``. An explicit measurement: ``KSLinear.tune`` calls it,
    ``forward`` never does."""
    device = torch.device(device)
    known = known_algorithm(pattern, batch, dtype, device)
    if known is not None:
        return known
    choice = _measure_fastest(pattern, batch, dtype, device, repeats)
    key = _key(pattern, batch, dtype, device)
    cache.store("fastest", key[1], choice)
    _FASTEST[key] = choice
    return choice


def _measure_fastest(pattern: KSPattern, batch: int, dtype: torch.dtype,
                     device: torch.device, repeats: int) -> str:
    w = random_factor(pattern, dtype, device)
    x = torch.randn(batch, pattern.in_features, dtype=dtype, device=device)
    with torch.no_grad():
        ops = {alg: prepare(w, pattern, alg) for alg in ALGORITHMS}
        fns = {alg: (lambda alg=alg: apply(x, ops[alg], pattern, alg)) for alg in ops}
        times = {alg: min(ts) for alg, ts in round_robin(fns, repeats, device).items()}
    return min(times, key=times.__getitem__)


def chain_tensor(patterns: Sequence[KSPattern]) -> torch.Tensor:
    """The chain as an int64 tensor (L, 4) of rows (a, b, c, d): ``KSLinear``'s ``chain``
    buffer, saved with its weights."""
    return torch.tensor([p.as_tuple() for p in patterns], dtype=torch.int64).reshape(-1, 4)


def chain_from_tensor(chain: torch.Tensor) -> tuple[KSPattern, ...]:
    """The patterns of a ``chain`` buffer (inverse of ``chain_tensor``)."""
    if chain.dim() != 2 or chain.shape[1] != 4 or chain.dtype.is_floating_point:
        raise InvalidParameterError(
            f"a KSLinear chain is an integer tensor (L, 4) of patterns (a, b, c, d), got "
            f"{chain.dtype} {tuple(chain.shape)}")
    return check_chain(tuple(int(v) for v in row) for row in chain.tolist())


class KSLinear(nn.Module):
    """y = x (K_1 ⋯ K_L)^T + bias for inputs (..., N), N = a_L c_L d_L, outputs (..., M),
    M = a_1 b_1 d_1. Factors are parameters of shape (a, b, c, d), initialised uniformly in
    [-1/sqrt(c), 1/sqrt(c)] (thesis App. D.2.1) times 3^((L-1)/(2L)) for a chain of L
    factors, so that the product starts at the output variance of an ``nn.Linear``
    (``random_factor``).

    The chain is part of the module's state: the int64 buffer ``chain`` (L, 4) is in its
    state_dict and every checkpoint, so ``pathlift.kron.load_state`` rebuilds the layer
    from the weights alone, on any machine, without a cache or a timing.

    ``algorithm`` is one of ``pathlift.kron.ALGORITHMS`` or ``"auto"``. It is a per-machine
    runtime choice: every algorithm computes the same product from the same factors, so it
    is not saved and never changes weights or shapes. With ``"auto"`` each factor runs the
    algorithm measured fastest on this machine for batch size ``batch`` (default 256) when
    such a measurement is in the cache, else ``DEFAULT_ALGORITHM`` (bmm); ``tune()``
    measures (and stores) it. Construction and ``forward`` time nothing; ``forward``
    writes no file (construction builds the fused kernel if it needs it).
    """

    chain: torch.Tensor

    def __init__(self, patterns: Sequence[KSPattern | Sequence[int]], bias: bool = True,
                 algorithm: str = "auto", dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, batch: int = TUNE_BATCH):
        super().__init__()
        self.patterns = check_chain(patterns)
        self._check_algorithm(algorithm)
        self._algorithm = algorithm
        self.in_features = self.patterns[-1].in_features
        self.out_features = self.patterns[0].out_features
        dtype = dtype or torch.get_default_dtype()
        self.register_buffer("chain", chain_tensor(self.patterns).to(device))
        self.factors = nn.ParameterList(
            nn.Parameter(random_factor(p, dtype, device, depth=len(self.patterns)))
            for p in self.patterns)
        if bias:
            bound = 1.0 / math.sqrt(self.in_features)
            init = torch.empty(self.out_features, dtype=dtype, device=device).uniform_(-bound,
                                                                                       bound)
            self.bias = nn.Parameter(init)
        else:
            self.register_parameter("bias", None)
        self._cache: dict[tuple, tuple[tuple[int, ...], dict]] = {}
        self._chosen = self._known(batch)
        self._build_kernels()

    def extra_repr(self) -> str:
        chain = ", ".join(str(p) for p in self.patterns)
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"patterns=[{chain}], bias={self.bias is not None}, algorithm={self.algorithm}")

    @staticmethod
    def _check_algorithm(algorithm: str) -> None:
        if algorithm != "auto" and algorithm not in ALGORITHMS:
            raise InvalidParameterError(
                f"unknown algorithm {algorithm!r}; choose 'auto' or one of {ALGORITHMS}")

    @property
    def algorithm(self) -> str:
        """``"auto"`` or the algorithm every factor runs; settable (a runtime choice: the
        weights and the function are unchanged, the float rounding may differ)."""
        return self._algorithm

    @algorithm.setter
    def algorithm(self, algorithm: str) -> None:
        self._check_algorithm(algorithm)
        self._algorithm = algorithm
        self._chosen = self._known(TUNE_BATCH)
        self._build_kernels()

    def _known(self, batch: int) -> tuple[str, ...]:
        if self.algorithm != "auto":
            return (self.algorithm,) * len(self.patterns)
        w = self.factors[0]
        return tuple(known_algorithm(p, batch, w.dtype, w.device) or DEFAULT_ALGORITHM
                     for p in self.patterns)

    def _build_kernels(self) -> None:
        """Build (or load) the fused CPU kernel now if a factor runs it, so that ``forward``
        never compiles or writes a file."""
        w = self.factors[0]
        if "fused" in self._chosen and w.device.type == "cpu":
            cpu_kernel.current_kernel(torch.float32 if w.dtype in HALF else w.dtype)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
               ) -> KSLinear:
        out = super()._apply(fn, recurse)
        self._build_kernels()  # a new dtype or device: its kernel before the next forward
        return out

    def tune(self, batch: int = TUNE_BATCH, repeats: int = 5) -> tuple[str, ...]:
        """Measure (or read from this machine's cache) the fastest algorithm of every factor
        at batch size ``batch`` and use it from now on; stores the measurements in the disk
        cache (in memory, with one warning, where it cannot be written). A layer with a
        fixed ``algorithm`` keeps it. Returns the algorithm of each factor."""
        if self.algorithm == "auto":
            w = self.factors[0]
            self._chosen = tuple(fastest_algorithm(p, batch, w.dtype, w.device, repeats)
                                 for p in self.patterns)
            self._build_kernels()
        return self._chosen

    def algorithms(self) -> tuple[str, ...]:
        """Algorithm each factor runs (``tune`` changes it for ``"auto"``)."""
        return self._chosen

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              local_metadata: dict[str, Any], strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        saved = state_dict.get(prefix + "chain")
        if torch.is_tensor(saved) and (saved.shape != self.chain.shape
                                       or not torch.equal(saved.cpu(), self.chain.cpu())):
            error_msgs.append(
                f"KSLinear {prefix.rstrip('.') or '<model>'}: the state_dict was saved with "
                f"the chain {saved.tolist()}, this layer has {self.chain.tolist()}; load it "
                "with pathlift.kron.load_state(model, state_dict), which rebuilds the layer "
                "from the saved chain")
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                      missing_keys, unexpected_keys, error_msgs)
        if saved is None and prefix + "chain" in missing_keys:  # saved before the buffer
            missing_keys.remove(prefix + "chain")

    def _sources(self, idx: int) -> tuple[torch.Tensor, ...]:
        """What factor ``idx`` is made of: (``<idx>_orig``, ``<idx>_mask``) under a
        torch.nn.utils.prune mask, else (the parameter,). (Looked up in the ParameterList's
        own tables: a missing attribute raised and caught costs microseconds per forward.)"""
        params = self.factors._parameters
        orig = params.get(f"{idx}_orig")
        return (params[str(idx)],) if orig is None else \
            (orig, self.factors._buffers[f"{idx}_mask"])

    @staticmethod
    def _combined(sources: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return sources[0] if len(sources) == 1 else sources[0] * sources[1]

    def factor(self, idx: int) -> torch.Tensor:
        """Factor ``idx`` as the layer computes with it: ``<idx>_orig * <idx>_mask`` of
        ``self.factors`` where torch.nn.utils.prune masks it (differentiable in the
        original), else the parameter. (The pruning hook sits on ``self.factors``, which is
        never called, so the layer applies the mask itself.)"""
        return self._combined(self._sources(idx))

    def _prepared(self, idx: int, algorithm: str) -> dict:
        """The factor in the algorithm's storage: converted on every call where autograd
        needs it (or on shape-only tensors), else kept until the factor (or its pruning
        mask) changes in place or is replaced."""
        sources = self._sources(idx)
        if (torch.is_grad_enabled() and sources[0].requires_grad) or \
                sources[0].device.type == "meta":
            return prepare(self._combined(sources), self.patterns[idx], algorithm)
        key = (idx, algorithm, *(t.data_ptr() for t in sources), sources[0].dtype,
               sources[0].device, cpu_kernel.width_flags())
        version = tuple(t._version for t in sources)
        hit = self._cache.get(key)
        if hit is None or hit[0] != version:
            hit = (version, prepare(self._combined(sources).detach(), self.patterns[idx],
                                    algorithm))
            self._cache = {k: v for k, v in self._cache.items() if k[0] != idx} | {key: hit}
        return hit[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ShapeError(f"KSLinear expects inputs (..., {self.in_features}), got "
                             f"{tuple(x.shape)}")
        lead = x.shape[:-1]
        y = x.reshape(-1, self.in_features)
        algorithms = self._chosen
        for idx in reversed(range(len(self.patterns))):  # x W^T = x K_L^T ⋯ K_1^T
            # the bias with the last product (the fused kernel adds it as it stores Y)
            y = apply(y, self._prepared(idx, algorithms[idx]), self.patterns[idx],
                      algorithms[idx], bias=None if idx else self.bias)
        return y.reshape(*lead, self.out_features)

    def to_dense(self) -> torch.Tensor:
        """The dense M × N weight K_1 ⋯ K_L."""
        return chain_to_dense([self.factor(i) for i in range(len(self.patterns))], self.patterns)

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
