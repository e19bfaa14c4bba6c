"""A prefix code for quantised ReLU networks: ``encode`` writes the bits, ``decode`` reads
them back exactly, and the length of a code word is the number of bits written.

What is coded (a ``CodedNetwork``): one bit naming the scheme of the tensors' body (the
index in ``SCHEMES``); the architecture, as its index in a family of architectures fixed
in advance (``ceil(log2 |family|)`` bits; the decoder knows every tensor's name and shape
from it, and where the network's constants go); then every constant written in
``forward`` or in a module's settings (``constants_of``: the numbers of the traced graph,
a Python float weight included) as its shortest decimal, sign bit, gamma code of the
digits + 1 and signed gamma code of the power of ten, so that a constant fitted to the
data is paid for like a weight; then the quantised tensors (the weight and bias of every
Linear / Conv / ConvTranspose, the affine pair (a, c) of every eval BatchNorm, in the
order of ``pathlift.quant.quantize``), each with the exponent e of its power-of-two step
2^e (signed gamma code) and the exponent f >= e of the radius 2^f of its zero codes
(gamma code of f - e + 1), in one of two schemes:

- ``BIT_LENGTHS``: per tensor the largest bit length E of its integer codes (gamma code
  of E + 1); then one adaptive arithmetic-coded stream (a Krichevsky-Trofimov model per
  tensor) of one symbol per coordinate: "pruned" (the coordinate is exactly 0), "zero"
  (code 0) or the bit length 1..E of |code|; then the raw bits: for every non-zero code
  its sign and its mantissa (the bits of |code| below the leading one).
- ``ENUMERATIVE`` (``pathlift.bounds.enumerative``, Cover 1973): per tensor its histogram
  (a bit: is any coordinate pruned; gamma code of the number m of distinct codes + 1; the
  smallest code, signed gamma, and the gaps to the next ones, gamma; the counts of the
  K symbols, pruned first, as a composition of n), then the index of its sequence of
  symbols among the n!/prod c_k! with those counts. About n times the empirical entropy
  of the tensor's values: a peaked histogram (pruned weights, codes +-1) costs far
  below a bit length and a mantissa per weight.

``encode`` writes the shorter of the two words by default (``estimated_length`` the
shorter estimate): the code as a whole is the union of the two codes behind their bit,
so a network pays at most one bit above the bit-length code alone.

The code is prefix-free: each part is (the uniform codes, gamma codes, enumerative indices
of widths known to the decoder, and the arithmetic coder of ``pathlift.bounds.bitcode``
are decodable from any continuation, and the decoder knows where the arithmetic stream
ends), and the leading bit splits the words of the two schemes, so sum over code words of
2^-length <= 1/2 + 1/2 = 1 (Kraft), which is all the Occam bound needs
(``pathlift.bounds.kl``, Langford 2005 Thm 3.3 summed over the words; a network with two
words is counted twice, which only adds terms to the sum). The "pruned" / "zero"
distinction matters only to the box of ``CodedNetwork.box``: a pruned coordinate of the
trained network is exactly 0, a zero code may hide any value in [-2^f, 2^f].
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal

import torch
from torch import Tensor, nn

from pathlift.bounds.bitcode import (
    AdaptiveModel,
    ArithmeticDecoder,
    ArithmeticEncoder,
    BitReader,
    BitWriter,
    gamma_length,
    read_gamma,
    read_signed,
    signed_length,
    write_gamma,
    write_signed,
)
from pathlift.bounds.enumerative import (
    arrangement_width,
    composition_width,
    read_arrangement,
    read_composition,
    write_arrangement,
    write_composition,
)
from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from pathlift.graph import LayerGraph, graph_of
from pathlift.graph.functional import LOWERED, layer_in, tensor_name

__all__ = ["BIT_LENGTHS", "ENUMERATIVE", "SCHEMES", "Architecture", "CodeLength",
           "CodedNetwork", "Encoded", "architecture_of", "constants_of", "decode", "encode",
           "estimated_length", "quantized_tensors"]

_PRUNED, _ZERO = 0, 1  # symbols; bit length b of |code| is symbol b + 1


@dataclass(frozen=True)
class Architecture:
    """What the decoder knows of a network before reading it: a description of its
    computation (``signature``: the traced graph's operations and module settings, and
    the input shape, each constant written "#"), the name and shape of every quantised
    tensor, and the number of ``constants`` the code word carries."""

    signature: str
    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    constants: int = 0

    @property
    def num_parameters(self) -> int:
        return sum(math.prod(shape) for _, shape in self.tensors)


def quantized_tensors(graph: LayerGraph, model: nn.Module | None = None
                      ) -> list[tuple[str, nn.Module, str, Tensor]]:
    """(tensor name, module, parameter name, effective value) of every quantised tensor of
    ``model`` (default: the graph's), once per layer, in the order of
    ``pathlift.quant.quantize`` (handlers say what they quantise: BatchNorm its (a, c))."""
    model = graph.model if model is None else model
    out, seen = [], set()
    for node in graph.parametric_nodes():
        if node.target in seen:
            continue
        seen.add(node.target)
        module = layer_in(model, node.target, node.meta.get(LOWERED))
        for pname, value, _ in graph.handler(node).quantizable(module):
            out.append((f"{node.target}.{tensor_name(node, pname)}", module, pname, value))
    return out


def architecture_of(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None
                    ) -> Architecture:
    """The ``Architecture`` of a network: its traced operations (each node's op, target,
    arguments and, for modules, their settings, every constant written "#") and its
    quantised tensors. Two networks that differ only in their constants share it."""
    graph = graph_of(model, input_shape)
    lines, count = [f"input {tuple(graph.input_shape)}"], 0
    for node in graph.nodes():
        line, numbers = _described(graph, node)
        lines.append(line)
        count += len(numbers)
    tensors = tuple((name, tuple(value.shape)) for name, _, _, value in quantized_tensors(graph))
    return Architecture("\n".join(lines), tensors, count)


def constants_of(model: nn.Module | LayerGraph, input_shape: Sequence[int] | None = None
                 ) -> tuple[float, ...]:
    """Every constant of the traced computation, in the order of ``architecture_of``'s
    "#": the numbers among each operation's arguments (a Python float multiplying a
    tensor, a slice bound, a view size) and the non-integer numbers of each module's
    settings (a LeakyReLU slope, a BatchNorm eps). InvalidParameterError for NaN/inf."""
    graph = graph_of(model, input_shape)
    out: list[float] = []
    for node in graph.nodes():
        out += _described(graph, node)[1]
    return tuple(out)


_FLOAT = re.compile(r"(?<![\w.])-?(?:\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+|inf|nan)(?![\w.])")


def _described(graph: LayerGraph, node) -> tuple[str, list[float]]:
    """(the node's signature line with "#" for each constant, its constants)."""
    numbers = list(_numbers((node.args, node.kwargs)))
    args = repr(_blanked((node.args, node.kwargs)))
    module = graph.submodule(node)
    settings = ""
    if module is not None:
        settings = repr(module)
        numbers += [float(t) for t in _FLOAT.findall(settings)]
        settings = _FLOAT.sub("#", settings)
    for v in numbers:
        if not math.isfinite(v):
            raise InvalidParameterError(f"node '{node.name}' holds the constant {v}; a "
                                        "network with NaN/inf constants cannot be certified")
    target = node.target
    if not isinstance(target, str):  # a function: its name, not its address
        target = f"{getattr(target, '__module__', None) or ''}.{getattr(target, '__name__', '')}"
    return f"{node.op} {target} {args} {settings}".rstrip(), numbers


def _numbers(value: object) -> Iterator[float]:
    """The numbers (int or float, not bool) inside fx arguments, depth first."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, slice):
        yield from _numbers((value.start, value.stop, value.step))


def _blanked(value: object) -> object:
    """fx arguments with every number replaced by a marker and nodes by their names."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return _Marker()
    if isinstance(value, tuple | list):
        return type(value)(_blanked(v) for v in value)
    if isinstance(value, dict):
        return {k: _blanked(v) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(*(_blanked(v) for v in (value.start, value.stop, value.step)))
    return getattr(value, "name", None) or repr(value)


class _Marker:
    """Where a constant was (its value is in the code word, not the signature)."""

    def __repr__(self) -> str:
        return "#"


def _write_constant(writer: BitWriter, v: float) -> None:
    """A finite number as its shortest decimal (repr round-trips float64): sign bit, gamma
    code of the digits + 1, signed gamma code of the power of ten."""
    sign, digits, exponent = Decimal(repr(v)).normalize().as_tuple()
    mantissa = int("".join(map(str, digits)) or "0")
    writer.write(int(sign))
    write_gamma(writer, mantissa + 1)
    write_signed(writer, int(exponent) if mantissa else 0)


def _read_constant(reader: BitReader) -> float:
    negative = reader.read()
    mantissa = read_gamma(reader) - 1
    exponent = read_signed(reader)
    value = float(Decimal(mantissa).scaleb(exponent))
    return -value if negative else value


@dataclass(frozen=True, eq=False)
class CodedNetwork:
    """A quantised network: the architecture's index in its family, and per tensor the step
    exponent e, the zero radius exponent f >= e, the integer codes (int64) and the mask of
    coordinates that are exactly 0 in the network it was made from ("pruned"); and the
    network's ``constants`` (``constants_of``)."""

    architecture: int
    exponents: tuple[int, ...]
    zero_exponents: tuple[int, ...]
    codes: tuple[Tensor, ...]
    pruned: tuple[Tensor, ...]
    constants: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.codes)
        if not (len(self.exponents) == len(self.zero_exponents) == len(self.pruned) == n):
            raise InvalidParameterError("one exponent, zero exponent and mask per tensor")
        for e, f, c, p in zip(self.exponents, self.zero_exponents, self.codes, self.pruned,
                              strict=True):
            if f < e:
                raise InvalidParameterError(f"zero radius 2^{f} below the step 2^{e}")
            if c.dtype != torch.int64 or p.dtype != torch.bool or c.shape != p.shape:
                raise InvalidParameterError("codes must be int64 and masks bool of one shape")
            if bool((c[p] != 0).any()):
                raise InvalidParameterError("a pruned coordinate must have code 0")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CodedNetwork):
            return NotImplemented
        return (self.architecture == other.architecture and self.exponents == other.exponents
                and self.constants == other.constants
                and self.zero_exponents == other.zero_exponents
                and len(self.codes) == len(other.codes)
                and all(torch.equal(a, b) for a, b in zip(self.codes, other.codes, strict=True))
                and all(torch.equal(a, b) for a, b in zip(self.pruned, other.pruned,
                                                          strict=True)))

    __hash__ = None  # type: ignore[assignment]

    def values(self, dtype: torch.dtype = torch.float64) -> list[Tensor]:
        """The quantised tensors, codes * 2^e (exact in float32 for |code| < 2^24)."""
        return [torch.ldexp(c.to(dtype), torch.tensor(e, dtype=dtype))
                for c, e in zip(self.codes, self.exponents, strict=True)]

    def box(self) -> list[tuple[Tensor, Tensor]]:
        """(low, high) per tensor, float64: the parameters this code stands for. A non-zero
        code k: between k 2^e and (k + sign k) 2^e (truncation towards zero of any value
        there gives k); a zero code: [-2^f, 2^f]; a pruned coordinate: [0, 0]."""
        out = []
        for c, e, f, p in zip(self.codes, self.exponents, self.zero_exponents, self.pruned,
                              strict=True):
            step, radius = math.ldexp(1.0, e), math.ldexp(1.0, f)
            k = c.to(torch.float64)
            ends = (k * step, (k + torch.sign(k)) * step)
            low = torch.where(c == 0, -radius, torch.minimum(*ends))
            high = torch.where(c == 0, radius, torch.maximum(*ends))
            out.append((torch.where(p, 0.0, low), torch.where(p, 0.0, high)))
        return out

    @property
    def num_nonzero(self) -> int:
        return sum(int((c != 0).sum()) for c in self.codes)


BIT_LENGTHS, ENUMERATIVE = "bit-lengths", "enumerative"
SCHEMES = (BIT_LENGTHS, ENUMERATIVE)  # the choice bit: the scheme's index


@dataclass(frozen=True)
class CodeLength:
    """Bits of one code word, by part (each counted from the bits written): the
    architecture index, the per-tensor header (exponents, and for the bit-length scheme
    the largest bit length), the arithmetic-coded symbol stream (zero / pruned / bit
    length, termination included), the signs, the mantissas and the constants of the
    computation; the ``choice`` bit naming the ``scheme``; for the enumerative scheme the
    ``histogram`` (which values occur, and how often) and the ``arrangement`` (the
    index of the values among the sequences with that histogram)."""

    architecture: int
    header: int
    symbols: int
    signs: int
    mantissas: int
    constants: int = 0
    choice: int = 0
    histogram: int = 0
    arrangement: int = 0
    scheme: str = BIT_LENGTHS

    @property
    def total(self) -> int:
        return (self.architecture + self.header + self.symbols + self.signs + self.mantissas
                + self.constants + self.choice + self.histogram + self.arrangement)

    def __repr__(self) -> str:
        body = (f"histogram {self.histogram}, arrangement {self.arrangement}"
                if self.scheme == ENUMERATIVE else
                f"symbols {self.symbols}, signs {self.signs}, mantissas {self.mantissas}")
        return (f"CodeLength({self.total} bits, {self.scheme}: choice {self.choice}, "
                f"architecture {self.architecture}, constants {self.constants}, header "
                f"{self.header}, {body})")


@dataclass(frozen=True, repr=False)
class Encoded:
    """A code word and its length by part; ``len(bits) == length.total``."""

    bits: tuple[int, ...]
    length: CodeLength

    def __repr__(self) -> str:
        return f"Encoded({self.length!r})"


def _index_width(family: Sequence[Architecture]) -> int:
    if not family:
        raise InvalidParameterError("the family of architectures is empty")
    return (len(family) - 1).bit_length()


def _check_scheme(scheme: str | None) -> None:
    if scheme is not None and scheme not in SCHEMES:
        raise InvalidParameterError(f"unknown code scheme {scheme!r}; choose from {SCHEMES}")


def encode(network: CodedNetwork, family: Sequence[Architecture],
           scheme: str | None = None) -> Encoded:
    """The code word of ``network`` (module docstring), ``family`` the architectures fixed
    in advance, in ``scheme`` (default: the shorter of the two, the bit-length one on a
    tie). Raises ArchitectureMismatchError when the tensors do not match the architecture
    the network names."""
    _check_scheme(scheme)
    if scheme is None:
        return min((encode(network, family, s) for s in SCHEMES),
                   key=lambda word: word.length.total)
    if not 0 <= network.architecture < len(family):
        raise ArchitectureMismatchError(
            f"architecture index {network.architecture} outside the family of {len(family)}")
    arch = family[network.architecture]
    shapes = [shape for _, shape in arch.tensors]
    if [tuple(c.shape) for c in network.codes] != shapes:
        raise ArchitectureMismatchError(
            "the codes do not have the shapes of the architecture they name")
    if len(network.constants) != arch.constants:
        raise ArchitectureMismatchError(
            f"the network carries {len(network.constants)} constants, its architecture "
            f"{arch.constants}")
    writer = BitWriter()
    writer.write(SCHEMES.index(scheme))
    writer.write_uint(network.architecture, _index_width(family))
    for v in network.constants:
        _write_constant(writer, v)
    start = len(writer)
    parts = (_write_bit_lengths if scheme == BIT_LENGTHS else _write_enumerative)(
        writer, network)
    return Encoded(tuple(writer.bits), CodeLength(
        architecture=_index_width(family), constants=start - 1 - _index_width(family),
        choice=1, scheme=scheme, **parts))


def _write_bit_lengths(writer: BitWriter, network: CodedNetwork) -> dict[str, int]:
    """The bit-length scheme's body (module docstring); its parts' lengths."""
    start = len(writer)
    flats = [c.reshape(-1) for c in network.codes]
    lengths = [_bit_lengths(c) for c in flats]
    for e, f, bl in zip(network.exponents, network.zero_exponents, lengths, strict=True):
        write_signed(writer, e)
        write_gamma(writer, f - e + 1)
        write_gamma(writer, (int(bl.max()) if bl.numel() else 0) + 1)
    header = len(writer) - start
    encoder = ArithmeticEncoder(writer)
    for bl, pruned in zip(lengths, network.pruned, strict=True):
        model = AdaptiveModel((int(bl.max()) if bl.numel() else 0) + 2)
        symbols = torch.where(pruned.reshape(-1), _PRUNED, bl + 1).tolist()
        for s in symbols:
            encoder.encode_symbol(model, s)
    encoder.finish()
    symbols = len(writer) - start - header
    signs = mantissas = 0
    for c, bl in zip(flats, lengths, strict=True):
        nonzero = c != 0
        for value, width in zip(c[nonzero].tolist(), bl[nonzero].tolist(), strict=True):
            writer.write(value < 0)
            writer.write_uint(abs(value) - (1 << (width - 1)), width - 1)
            mantissas += width - 1
        signs += int(nonzero.sum())
    return {"header": header, "symbols": symbols, "signs": signs, "mantissas": mantissas}


def _histogram(codes: Tensor, pruned: Tensor) -> tuple[bool, list[int], list[int], Tensor]:
    """The enumerative scheme's view of one tensor: (any pruned coordinate, the distinct
    codes of the others in increasing order, the count of each symbol, the symbol of each
    coordinate): symbol 0 is "pruned" when there is one, then the distinct codes."""
    c, p = codes.reshape(-1), pruned.reshape(-1)
    values, inverse, counts = torch.unique(c[~p], return_inverse=True, return_counts=True)
    has_pruned = bool(p.any())
    symbols = torch.zeros_like(c)
    symbols[~p] = inverse + int(has_pruned)
    return (has_pruned, values.tolist(),
            [int(p.sum())] * has_pruned + counts.tolist(), symbols)


def _histogram_length(has_pruned: bool, values: Sequence[int], counts: Sequence[int]) -> int:
    """Bits of ``_write_histogram``."""
    gaps = sum(gamma_length(b - a) for a, b in itertools.pairwise(values))
    return (1 + gamma_length(len(values) + 1) + (signed_length(values[0]) if values else 0)
            + gaps + composition_width(sum(counts), len(counts)))


def _write_enumerative(writer: BitWriter, network: CodedNetwork) -> dict[str, int]:
    """The enumerative scheme's body (module docstring); its parts' lengths."""
    header = histogram = arrangement = 0
    for c, e, f, p in zip(network.codes, network.exponents, network.zero_exponents,
                          network.pruned, strict=True):
        start = len(writer)
        write_signed(writer, e)
        write_gamma(writer, f - e + 1)
        header += len(writer) - start
        if not c.numel():
            continue
        start = len(writer)
        has_pruned, values, counts, symbols = _histogram(c, p)
        writer.write(has_pruned)
        write_gamma(writer, len(values) + 1)
        if values:
            write_signed(writer, values[0])
        for a, b in itertools.pairwise(values):
            write_gamma(writer, b - a)
        write_composition(writer, counts)
        histogram += len(writer) - start
        start = len(writer)
        write_arrangement(writer, symbols.tolist(), counts)
        arrangement += len(writer) - start
    return {"header": header, "symbols": 0, "signs": 0, "mantissas": 0,
            "histogram": histogram, "arrangement": arrangement}


def estimated_length(network: CodedNetwork, family: Sequence[Architecture],
                     scheme: str | None = None) -> CodeLength:
    """The ``CodeLength`` of ``encode`` without writing the word (default: the shorter
    scheme by this estimate): every part exact but the bit-length scheme's
    arithmetic-coded symbols, there the ideal length of the Krichevsky-Trofimov code,
    -log2 prod_s Gamma(c_s + 1/2) Gamma(M/2) / (Gamma(1/2)^M Gamma(N + M/2)) per tensor
    (Krichevsky & Trofimov 1981), rounded up, + 2 for the termination (the coder's
    62-bit registers add a fraction of a bit). For a search to rank candidates; a
    certificate counts the bits ``encode`` writes."""
    _check_scheme(scheme)
    if scheme is None:
        return min((estimated_length(network, family, s) for s in SCHEMES),
                   key=lambda length: length.total)
    writer = BitWriter()
    for v in network.constants:
        _write_constant(writer, v)
    header = symbols = signs = mantissas = histogram = arrangement = 0.0
    for c, e, f, pruned in zip(network.codes, network.exponents, network.zero_exponents,
                               network.pruned, strict=True):
        header += signed_length(e) + gamma_length(f - e + 1)
        if scheme == ENUMERATIVE:
            if c.numel():
                has_pruned, values, counts, _ = _histogram(c, pruned)
                histogram += _histogram_length(has_pruned, values, counts)
                arrangement += arrangement_width(counts)
            continue
        bl = _bit_lengths(c.reshape(-1))
        largest = int(bl.max()) if bl.numel() else 0
        header += gamma_length(largest + 1)
        counts = torch.bincount(torch.where(pruned.reshape(-1), _PRUNED, bl + 1),
                                minlength=largest + 2).to(torch.float64)
        size = float(len(counts))
        symbols += float((torch.lgamma(counts + 0.5).sum() - size * math.lgamma(0.5)
                          + math.lgamma(size / 2) - math.lgamma(float(counts.sum()) + size / 2))
                         / -math.log(2))
        signs += int((c != 0).sum())
        mantissas += int((bl - 1).clamp(min=0).sum())
    if scheme == BIT_LENGTHS:
        symbols = math.ceil(symbols) + 2
    return CodeLength(_index_width(family), int(header), int(symbols), int(signs),
                      int(mantissas), len(writer), 1, int(histogram), int(arrangement),
                      scheme)


def _bit_lengths(codes: Tensor) -> Tensor:
    """floor(log2 |k|) + 1 for each code k (0 for k = 0), exactly, as int64."""
    magnitude = codes.abs()
    out = torch.zeros_like(magnitude)
    rest = magnitude.clone()
    while bool((rest > 0).any()):
        out += (rest > 0).to(out.dtype)
        rest >>= 1
    return out


def decode(bits: Sequence[int], family: Sequence[Architecture]) -> tuple[CodedNetwork, int]:
    """The network a code word stands for, and the number of bits it took (bits after it
    are ignored, whatever they are). Inverse of ``encode``: decode(encode(Q).bits) == Q."""
    reader = BitReader(bits)
    scheme = SCHEMES[reader.read()]
    index = reader.read_uint(_index_width(family))
    if index >= len(family):
        raise InvalidParameterError(f"corrupt code: architecture {index} of {len(family)}")
    shapes = [shape for _, shape in family[index].tensors]
    constants = tuple(_read_constant(reader) for _ in range(family[index].constants))
    read = _read_bit_lengths if scheme == BIT_LENGTHS else _read_enumerative
    exponents, zero_exponents, codes, pruned, end = read(reader, shapes)
    network = CodedNetwork(index, tuple(exponents), tuple(zero_exponents), tuple(codes),
                           tuple(pruned), constants)
    return network, end


def _read_bit_lengths(reader: BitReader, shapes: Sequence[tuple[int, ...]]):
    """(exponents, zero exponents, codes, pruned masks, end position) of the bit-length
    scheme's body."""
    headers = []
    for _ in shapes:
        e = read_signed(reader)
        f = e + read_gamma(reader) - 1
        headers.append((e, f, read_gamma(reader) - 1))
    decoder = ArithmeticDecoder(reader)
    symbol_lists = []
    for shape, (_, _, largest) in zip(shapes, headers, strict=True):
        model = AdaptiveModel(largest + 2)
        symbol_lists.append([decoder.decode_symbol(model) for _ in range(math.prod(shape))])
    raw = BitReader(reader.bits, decoder.start + decoder.length())
    codes, pruned = [], []
    for shape, symbols in zip(shapes, symbol_lists, strict=True):
        values = []
        for s in symbols:
            if s <= _ZERO:
                values.append(0)
                continue
            negative = raw.read()
            magnitude = (1 << (s - 2)) | raw.read_uint(s - 2)
            values.append(-magnitude if negative else magnitude)
        codes.append(torch.tensor(values, dtype=torch.int64).reshape(shape))
        pruned.append(torch.tensor([s == _PRUNED for s in symbols],
                                   dtype=torch.bool).reshape(shape))
    return ([h[0] for h in headers], [h[1] for h in headers], codes, pruned, raw.position)


def _read_enumerative(reader: BitReader, shapes: Sequence[tuple[int, ...]]):
    """(exponents, zero exponents, codes, pruned masks, end position) of the enumerative
    scheme's body."""
    exponents, zero_exponents, codes, pruned = [], [], [], []
    for shape in shapes:
        e = read_signed(reader)
        exponents.append(e)
        zero_exponents.append(e + read_gamma(reader) - 1)
        n = math.prod(shape)
        symbols, values, has_pruned = [], [], False
        if n:
            has_pruned = bool(reader.read())
            m = read_gamma(reader) - 1
            k = m + int(has_pruned)
            if not 1 <= k <= n:
                raise InvalidParameterError(f"corrupt code: {k} distinct values of {n}")
            values = [read_signed(reader)] if m else []
            for _ in range(m - 1):
                values.append(values[-1] + read_gamma(reader))
            symbols = read_arrangement(reader, read_composition(reader, n, k))
        table = torch.tensor([0] * has_pruned + values, dtype=torch.int64)
        index = torch.tensor(symbols, dtype=torch.int64)
        codes.append(table[index].reshape(shape) if n else torch.zeros(shape, dtype=torch.int64))
        pruned.append((index < int(has_pruned)).reshape(shape))
    return exponents, zero_exponents, codes, pruned, reader.position
