"""Extrapolating retained bytes from short probe sequences to the recipe's sequence length.

A layer's retained bytes are a polynomial of degree ≤ 2 in the sequence length s at fixed widths:
every saved activation is ``tokens × width`` (linear in s), except the unfused core attention's score
tensors, ``b·np·s²`` (quadratic), plus constants (none seen in MCore's layers, but allowed). Three
measured lengths determine that polynomial exactly; it is evaluated at the target with exact
rational arithmetic (Lagrange form), so no float rounding enters the byte counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction


def extrapolate(lengths: Sequence[int], values: Sequence[int], target: int) -> Fraction:
    """The degree-(n-1) polynomial through ``(lengths[i], values[i])``, evaluated at ``target``."""
    if len(lengths) != len(values) or len(set(lengths)) != len(lengths) or not lengths:
        raise ValueError(
            f"need distinct lengths with one value each, got {list(lengths)} / {list(values)}"
        )
    total = Fraction(0)
    for i, (xi, yi) in enumerate(zip(lengths, values)):
        term = Fraction(yi)
        for j, xj in enumerate(lengths):
            if j != i:
                term *= Fraction(target - xj, xi - xj)
        total += term
    return total


def quadratic_coefficient(lengths: Sequence[int], values: Sequence[int]) -> Fraction:
    """The s² coefficient of the polynomial through three points (second divided difference)."""
    if len(lengths) != 3:
        raise ValueError("the s² coefficient needs exactly three points")
    (x0, x1, x2), (y0, y1, y2) = lengths, values
    first01 = Fraction(y1 - y0, x1 - x0)
    first12 = Fraction(y2 - y1, x2 - x1)
    return (first12 - first01) / (x2 - x0)
