"""Bitwise operators with a constant mask, as integer arithmetic.

Policy authors round to a power-of-two page with masks: ``x & (page - 1)`` (the offset in the
page), ``x & ~(page - 1)`` (round down), ``((x - 1) | (page - 1)) + 1`` (round up). On Python's
ints (two's complement with infinitely many sign bits) these are exact in linear integer
arithmetic, for negative ``x`` too. With ``low = x mod 2**k`` (in ``[0, 2**k)``):

* a low mask ``m = 2**k - 1``: ``x & m == low``, ``x | m == x - low + m``,
  ``x ^ m == x - 2*low + m`` (the low ``k`` bits flipped);
* a high mask ``m = -2**k`` (``~(2**k - 1)``): ``x & m == x - low``, ``x | m == low + m``,
  ``x ^ m == low - (x - low) + m`` (every bit from ``k`` up flipped: ``~(x >> k) << k``).

Any other mask mixes bits in a way that is not linear, and is refused by the caller; so is a
bitwise operator between two symbolic values. (No z3 bit-vectors: the rest of the checker is
integer arithmetic, and one bit-vector would force conversions everywhere.)
"""

from __future__ import annotations

from collections.abc import Callable

import z3


def mask_bits(m: int) -> tuple[str, int] | None:
    """``("low", k)`` for ``m == 2**k - 1``, ``("high", k)`` for ``m == -2**k``, else None."""
    if m >= 0 and m & (m + 1) == 0:
        return "low", (m + 1).bit_length() - 1
    if m < 0 and (-m) & (-m - 1) == 0:
        return "high", (-m).bit_length() - 1
    return None


def masked(
    op: str, x: z3.ArithRef, m: int, low_bits: Callable[[int], z3.ArithRef]
) -> z3.ArithRef | None:
    """``x op m`` for ``op`` in ``& | ^`` and a constant mask ``m``, or None where ``m`` is
    neither ``2**k - 1`` nor ``-2**k``. ``low_bits(k)`` is the caller's ``x mod 2**k`` (made
    with its floor division, so the quotient is shared with the rest of the formula)."""
    shape = mask_bits(m)
    if shape is None:
        return None
    kind, k = shape
    low = z3.IntVal(0) if k == 0 else low_bits(k)
    if kind == "low":
        table = {"&": low, "|": x - low + m, "^": x - 2 * low + m}
    else:
        table = {"&": x - low, "|": low + m, "^": 2 * low - x + m}
    return table[op]
