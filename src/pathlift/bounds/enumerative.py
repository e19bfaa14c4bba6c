"""Enumerative codes (Cover 1973): a sequence of symbols from an ordered alphabet as its
histogram, then its index among the sequences with that histogram.

A sequence s of n symbols (n known to the decoder) whose K distinct symbols occur
c_1, ..., c_K >= 1 times is written as

- the composition (c_1, ..., c_K) of n, as its index among the C(n - 1, K - 1)
  compositions of n into K positive parts, in ceil(log2 C(n - 1, K - 1)) bits;
- the arrangement, as its index among the n! / (c_1! ... c_K!) sequences with those
  counts (lexicographic rank of a multiset permutation), in ceil(log2 n!/prod c_k!) bits.

Both widths are known to the decoder when it reads them (K and n before the composition,
the counts before the arrangement), so the code of the counts and arrangement given (n, K)
is a fixed-width code of the index: decodable from any continuation, with its length.
The arrangement costs about n times the empirical entropy of s (Stirling), so a peaked
histogram (most weights 0 or +-1) costs well below a fixed width per symbol. Which
symbols occur (the alphabet) is written by the caller (``pathlift.bounds.code``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pathlift.bounds.bitcode import BitReader, BitWriter
from pathlift.errors import InvalidParameterError

__all__ = ["arrangement_width", "composition_width", "read_arrangement",
           "read_composition", "write_arrangement", "write_composition"]


def _width(count: int) -> int:
    """Bits of an index among ``count`` >= 1 equally likely values: ceil(log2 count)."""
    return (count - 1).bit_length()


def composition_width(n: int, k: int) -> int:
    """ceil(log2 C(n - 1, k - 1)): bits of a composition of n into k positive parts."""
    return _width(math.comb(n - 1, k - 1)) if n >= 1 and 1 <= k <= n else 0


def multinomial(counts: Sequence[int]) -> int:
    """n! / prod c! for n = sum counts, exactly."""
    out, n = 1, 0
    for c in counts:
        n += c
        out *= math.comb(n, c)
    return out


def arrangement_width(counts: Sequence[int]) -> int:
    """ceil(log2 n!/prod c!): bits of a sequence's index among those with ``counts``."""
    return _width(multinomial(counts))


def write_composition(writer: BitWriter, counts: Sequence[int]) -> None:
    """Counts c_1..c_K >= 1 as their cut points c_1, c_1 + c_2, ... (a (K - 1)-subset of
    {1..n-1}) ranked in the combinatorial number system: sum_i C(p_i - 1, i)."""
    if any(c < 1 for c in counts):
        raise InvalidParameterError("a composition has positive parts")
    n, rank, cut = sum(counts), 0, 0
    for i, c in enumerate(counts[:-1], start=1):
        cut += c
        rank += math.comb(cut - 1, i)
    writer.write_uint(rank, composition_width(n, len(counts)))


def read_composition(reader: BitReader, n: int, k: int) -> list[int]:
    """Inverse of ``write_composition`` for a total n and k parts."""
    rank = reader.read_uint(composition_width(n, k))
    if rank >= math.comb(n - 1, k - 1):
        raise InvalidParameterError("corrupt code: composition index out of range")
    cuts, high = [], n - 1
    for i in range(k - 1, 0, -1):  # the largest p <= high with C(p - 1, i) <= rank
        low, top = i, high  # C(i - 1, i) = 0 <= rank
        while low < top:
            mid = (low + top + 1) // 2
            low, top = (mid, top) if math.comb(mid - 1, i) <= rank else (low, mid - 1)
        rank -= math.comb(low - 1, i)
        cuts.append(low)
        high = low - 1
    ends = [*sorted(cuts), n]
    return [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def write_arrangement(writer: BitWriter, symbols: Sequence[int], counts: Sequence[int]
                      ) -> None:
    """``symbols`` (each in range(len(counts)), symbol s occurring counts[s] times) as its
    lexicographic rank among the sequences with those counts: at each position, the number
    of sequences of the remaining counts that start with a smaller symbol, M c_<s / r
    (M the multinomial of the r remaining symbols, c_<s the remaining count of smaller
    ones)."""
    left = list(counts)
    total = multinomial(left)
    m, rank, r = total, 0, len(symbols)
    for s in symbols:
        rank += m * sum(left[:s]) // r
        m = m * left[s] // r
        left[s] -= 1
        r -= 1
    if any(left):
        raise InvalidParameterError("the symbols do not have the counts given")
    writer.write_uint(rank, _width(total))


def read_arrangement(reader: BitReader, counts: Sequence[int]) -> list[int]:
    """Inverse of ``write_arrangement``: symbol s at a position is the one with
    c_<s <= floor(rank r / M) < c_<s + c_s (exact: every M c_<s / r is an integer)."""
    left = list(counts)
    total = multinomial(left)
    rank = reader.read_uint(_width(total))
    if rank >= total:
        raise InvalidParameterError("corrupt code: arrangement index out of range")
    m, r, out = total, sum(left), []
    for _ in range(r):
        t, below, s = rank * r // m, 0, 0
        while below + left[s] <= t:
            below += left[s]
            s += 1
        rank -= m * below // r
        m = m * left[s] // r
        left[s] -= 1
        r -= 1
        out.append(s)
    return out
