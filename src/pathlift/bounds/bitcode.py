"""Bits: a writer and a reader, Elias gamma codes of integers, and an adaptive arithmetic
coder with exact integer arithmetic (Witten, Neal & Cleary 1987).

Every code here is *prefix-free in the strong sense the Occam bound needs*: the decoder,
given a code word followed by ANY bits, returns the coded value and says exactly how many
bits the word took. For the arithmetic coder this holds because its termination writes
the two bits (plus pending bits) of a quarter of [0, 1) that lies inside the final
interval, so every continuation of the word is a number inside that interval; the
decoder mirrors the encoder's renormalisations, so it knows the word ends after
(renormalisations + 2) bits. A code in which every word is decodable with its length
from any continuation is prefix-free, hence satisfies Kraft's inequality
sum 2^-length <= 1 (tested on exhaustive small alphabets in tests/test_bounds_code.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pathlift.errors import InvalidParameterError

__all__ = ["AdaptiveModel", "ArithmeticDecoder", "ArithmeticEncoder", "BitReader",
           "BitWriter", "gamma_length", "read_gamma", "read_signed", "signed_length",
           "write_gamma", "write_signed"]

_PRECISION = 62
_FULL = 1 << _PRECISION
_HALF = _FULL >> 1
_QUARTER = _FULL >> 2
_MAX_TOTAL = 1 << (_PRECISION - 2)  # frequencies must keep every sub-range non-empty


class BitWriter:
    """Bits appended one at a time or as an integer's binary digits (most significant
    first); ``bits`` is the list written."""

    def __init__(self) -> None:
        self.bits: list[int] = []

    def write(self, bit: int) -> None:
        self.bits.append(1 if bit else 0)

    def write_uint(self, value: int, width: int) -> None:
        """``value`` in exactly ``width`` bits (0 <= value < 2^width)."""
        if value < 0 or value >> width:
            raise InvalidParameterError(f"{value} does not fit in {width} bits")
        self.bits.extend((value >> (width - 1 - i)) & 1 for i in range(width))

    def extend(self, bits: Iterable[int]) -> None:
        self.bits.extend(1 if b else 0 for b in bits)

    def __len__(self) -> int:
        return len(self.bits)


class BitReader:
    """Reads ``bits`` from ``position`` on; past the end it reads 0 (a code word's decoding
    must not depend on what follows it, which the tests check with random suffixes)."""

    def __init__(self, bits: Sequence[int], position: int = 0):
        self.bits, self.position = bits, position

    def read(self) -> int:
        bit = self.bits[self.position] if self.position < len(self.bits) else 0
        self.position += 1
        return bit

    def read_uint(self, width: int) -> int:
        value = 0
        for _ in range(width):
            value = (value << 1) | self.read()
        return value


def write_gamma(writer: BitWriter, n: int) -> None:
    """Elias gamma code of an integer n >= 1: floor(log2 n) zeros, then n in binary."""
    if n < 1:
        raise InvalidParameterError(f"the gamma code needs n >= 1, got {n}")
    width = n.bit_length()
    writer.extend([0] * (width - 1))
    writer.write_uint(n, width)


def read_gamma(reader: BitReader) -> int:
    zeros = 0
    while reader.read() == 0:
        zeros += 1
        if zeros > 4096:
            raise InvalidParameterError("corrupt gamma code: more than 4096 leading zeros")
    return (1 << zeros) | reader.read_uint(zeros)


def gamma_length(n: int) -> int:
    """Length of the gamma code of n >= 1: 2 floor(log2 n) + 1."""
    return 2 * n.bit_length() - 1


def _zigzag(v: int) -> int:
    """0, -1, 1, -2, 2, ... -> 1, 2, 3, 4, 5, ..."""
    return 2 * v + 1 if v >= 0 else -2 * v


def write_signed(writer: BitWriter, v: int) -> None:
    """A signed integer as the gamma code of its zigzag index (0 costs one bit)."""
    write_gamma(writer, _zigzag(v))


def read_signed(reader: BitReader) -> int:
    z = read_gamma(reader)
    return (z - 1) // 2 if z % 2 else -(z // 2)


def signed_length(v: int) -> int:
    return gamma_length(_zigzag(v))


class AdaptiveModel:
    """The Krichevsky-Trofimov estimator over the alphabet {0, ..., size-1}: symbol s has
    probability (2 c_s + 1) / (2 N + size) after N symbols of which c_s were s, computed in
    integers (frequencies 2 c_s + 1), updated after each symbol by encoder and decoder
    alike."""

    def __init__(self, size: int):
        if size < 1:
            raise InvalidParameterError(f"an alphabet needs a symbol, got size {size}")
        self.freq = [1] * size
        self.total = size

    def interval(self, symbol: int) -> tuple[int, int, int]:
        low = sum(self.freq[:symbol])
        return low, low + self.freq[symbol], self.total

    def find(self, target: int) -> tuple[int, int, int]:
        """The symbol whose cumulative interval holds ``target``, and that interval."""
        low = 0
        for s, f in enumerate(self.freq):
            if target < low + f:
                return s, low, low + f
            low += f
        raise InvalidParameterError("corrupt arithmetic code: target beyond the total")

    def update(self, symbol: int) -> None:
        self.freq[symbol] += 2
        self.total += 2
        if self.total > _MAX_TOTAL:
            raise InvalidParameterError("too many symbols for one adaptive model")


class ArithmeticEncoder:
    """Integer arithmetic coding (62-bit registers, Witten, Neal & Cleary's renormalisation
    with pending bits) into a ``BitWriter``; ``finish()`` terminates the word."""

    def __init__(self, writer: BitWriter):
        self.writer, self.low, self.high, self.pending = writer, 0, _FULL - 1, 0

    def _emit(self, bit: int) -> None:
        self.writer.write(bit)
        self.writer.extend([1 - bit] * self.pending)
        self.pending = 0

    def encode(self, low: int, high: int, total: int) -> None:
        """Narrow to the sub-interval [low, high) of [0, total)."""
        span = self.high - self.low + 1
        self.high = self.low + span * high // total - 1
        self.low = self.low + span * low // total
        while True:
            if self.high < _HALF:
                self._emit(0)
            elif self.low >= _HALF:
                self._emit(1)
                self.low -= _HALF
                self.high -= _HALF
            elif self.low >= _QUARTER and self.high < _HALF + _QUARTER:
                self.pending += 1
                self.low -= _QUARTER
                self.high -= _QUARTER
            else:
                break
            self.low, self.high = 2 * self.low, 2 * self.high + 1

    def encode_symbol(self, model: AdaptiveModel, symbol: int) -> None:
        self.encode(*model.interval(symbol))
        model.update(symbol)

    def finish(self) -> None:
        """Write a quarter of [0, 1) inside [low, high]: any continuation decodes alike."""
        self.pending += 1
        self._emit(0 if self.low < _QUARTER else 1)


class ArithmeticDecoder:
    """Mirror of ``ArithmeticEncoder`` reading a ``BitReader`` from its position;
    ``length()`` is the number of bits the encoder wrote for what was decoded so far,
    once it finished (renormalisations + 2)."""

    def __init__(self, reader: BitReader):
        self.reader, self.start = reader, reader.position
        self.low, self.high, self.shifts = 0, _FULL - 1, 0
        self.value = reader.read_uint(_PRECISION)

    def decode_symbol(self, model: AdaptiveModel) -> int:
        span = self.high - self.low + 1
        target = ((self.value - self.low + 1) * model.total - 1) // span
        symbol, low, high = model.find(target)
        self.high = self.low + span * high // model.total - 1
        self.low = self.low + span * low // model.total
        while True:
            if self.high < _HALF:
                pass
            elif self.low >= _HALF:
                self.low -= _HALF
                self.high -= _HALF
                self.value -= _HALF
            elif self.low >= _QUARTER and self.high < _HALF + _QUARTER:
                self.low -= _QUARTER
                self.high -= _QUARTER
                self.value -= _QUARTER
            else:
                break
            self.low, self.high = 2 * self.low, 2 * self.high + 1
            self.value = 2 * self.value + self.reader.read()
            self.shifts += 1
        model.update(symbol)
        return symbol

    def length(self) -> int:
        """Bits of the terminated word the decoded symbols came from."""
        return self.shifts + 2
