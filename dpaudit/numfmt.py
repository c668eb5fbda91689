"""How every ε (and δ) a user reads is printed: ε rounded in the direction that keeps the printed number true,
δ as given.

One module, used by the audit summaries, the workflows' headlines, the report and the CLI, so that a number
reads the same everywhere and no printer rounds on its own:

- :func:`upper` rounds toward +∞, for every upper bound a user relies on: a claimed ε, "this design
  certifies at most ε = …". A privacy claim must never be under-reported (STYLE.md's non-negotiable): an
  accounted ε of 7.999954 prints 7.99996, never 7.99995.
- :func:`lower` rounds toward −∞, for every lower bound shown ("ε ≥ …"): a bound shown must be implied by the
  computed one, so 4.8151 prints 4.81, never 4.82 (which nothing showed).
- :func:`nearest` rounds to nearest, for estimates shown with "=" (a noise ratio, a median): an estimate is no
  bound, so no direction is safe; its label says it is an estimate.
- :func:`exact` prints an input as given (its shortest round-trip decimal): every δ, which is a claim's or an
  audit's parameter, never a computed bound, so no rounding of it is safe in both uses.
- :func:`percent_down` prints a confidence level as a percentage rounded down: a level shown never claims more
  certainty than the bound has (0.9999999 is 99.9999%, not 100%).
- :func:`percent_up` rounds a percentage up, for the upper end of a confidence interval on a rate (its lower end
  :func:`percent_down`), so that a printed interval contains the computed one.
- :func:`p_value` prints a p-value as an estimate, and one that underflowed to 0 as "p < 1e-300", never "p = 0".
- :func:`ordered` shows a lower bound beside a claim with as many digits as it takes (up to the 17 that tell any
  two float64 apart) for the printed numbers to compare as the computed ones do: "ε ≥ 8.00001 > claimed 8",
  never "ε ≥ 8 > claimed 8"; :func:`against` does so for one claim and several bounds printed beside it.

Rounding is exact: ``decimal.Decimal(x)`` is the float's exact binary value, rounded with ROUND_CEILING or
ROUND_FLOOR at the significant digit; float arithmetic such as ``math.ceil(x * 10**k) / 10**k`` can itself
round the wrong way (1.0000000000000002 * 1e5 is 100000.0 in float64). One exception, stated: a float whose
shortest round-trip decimal (``repr``) has at most ``digits`` significant digits prints as that decimal, in
either direction: it is the decimal the float stands for (``--epsilon 0.1`` stores the float nearest 0.1,
0.1000000000000000055…), less than half a unit in the last place (1.1e-16 relative) away, which float64
cannot tell apart from it. Without it every claim of 0.1 would print 0.100001.

Output reads as Python's ``format(x, f".{digits}g")`` does (trailing zeros dropped, scientific below 1e-4 and
from 10**digits): 7.99996, 8, 1e-05, 1.00001e-05, 2.707e+04 at 4 digits; ∞ and −∞ for infinities, nan, and
``missing`` for None. JSON keeps full floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Context, Decimal
from fractions import Fraction
from typing import Any

CLAIM_DIGITS = 6  # claims: as ``format(x, "g")`` printed them before (6 significant digits)
MAX_DIGITS = 17  # 17 significant digits tell any two distinct float64 apart (IEEE 754-2008, 5.12.2)
DASH = "—"


def upper(x: Any, digits: int = CLAIM_DIGITS, *, missing: str = DASH) -> str:
    """``x`` rounded toward +∞ at ``digits`` significant digits: for claims and every other upper bound shown.

    The printed number is ≥ ``x`` (exactly, or it is ``x``'s own short decimal; see the module docstring), so a
    claim is never under-reported. None → ``missing``.
    """
    return _show(x, digits, ROUND_CEILING, missing)


def exact(x: Any, *, missing: str = DASH) -> str:
    """``x`` as the shortest decimal that reads back as it (Python's ``repr``, up to :data:`MAX_DIGITS` digits),
    written as :func:`upper` writes: for an input shown as given, such as a claim's δ, which no printer may round
    to another value (δ = 0.09999999 is not δ = 0.1, and 1/70000 is neither 1.42857e-05 nor 1.42858e-05).
    None → ``missing``."""
    return _show(x, MAX_DIGITS, ROUND_CEILING, missing)  # repr has <= 17 digits: printed as it is, never rounded


def as_typed(x: float) -> Fraction:
    """``x`` as the exact rational of the decimal a user typed (its shortest round-trip decimal, ``repr``), for
    arithmetic where the float's binary excess would change a count: ``Fraction(1.1)`` is 1.100000000000000088…,
    which made 1.1 epochs of 10 steps 12 steps instead of 11, and ``1 / Fraction(0.1)`` is 9.99…, not 10."""
    return Fraction(repr(float(x)))


def lower(x: Any, digits: int = 3, *, missing: str = DASH) -> str:
    """``x`` rounded toward −∞ at ``digits`` significant digits: for lower bounds shown ("ε ≥ …").

    The printed number is ≤ ``x``, so what is printed after "≥" is implied by what was computed. None → ``missing``.
    """
    return _show(x, digits, ROUND_FLOOR, missing)


def nearest(x: Any, digits: int = 3, *, missing: str = DASH) -> str:
    """``x`` rounded to nearest (ties to even) at ``digits`` significant digits: for ESTIMATES shown with "="
    (noise ratios, medians, data-dependent ε), which bound nothing, so no direction is the safe one. Never
    for a claim or a bound. None → ``missing``."""
    return _show(x, digits, ROUND_HALF_EVEN, missing)


def percent_down(x: Any, digits: int = CLAIM_DIGITS, *, missing: str = DASH) -> str:
    """A fraction as a percentage rounded toward −∞ at ``digits`` significant digits: for a confidence level shown,
    which must never read as more certainty than the bound has (0.9999999 prints 99.9999%, never 100%). The
    fraction's own short decimal is scaled exactly, so 0.57 prints 57%, not 56.9999% (100 * 0.57 is
    56.99999999999999 in float64). None → ``missing``."""
    return _percent(x, digits, ROUND_FLOOR, missing)


def percent_up(x: Any, digits: int = CLAIM_DIGITS, *, missing: str = DASH) -> str:
    """A fraction as a percentage rounded toward +∞ at ``digits`` significant digits, as :func:`percent_down` writes
    it: for the upper end of a confidence interval on a rate, so that the printed interval contains the computed one
    (0.123456 prints 12.35% at 4 digits). None → ``missing``."""
    return _percent(x, digits, ROUND_CEILING, missing)


def percent_nearest(x: Any, digits: int = 3, *, missing: str = DASH) -> str:
    """A fraction as a percentage rounded to nearest (ties to even) at ``digits`` significant digits, as
    :func:`percent_down` writes it: for a DESCRIPTIVE share (records left out of an estimate), which bounds nothing
    (1/3 prints 33.3%). None → ``missing``."""
    return _percent(x, digits, ROUND_HALF_EVEN, missing)


def _percent(x: Any, digits: int, rounding: str, missing: str) -> str:
    if x is None:
        return missing
    v = float(x)
    if not math.isfinite(v):
        return _show(v, digits, rounding, missing)
    if v == 0:
        return "0%"
    p = Context(prec=digits, rounding=rounding).plus(Decimal(repr(v)).scaleb(2)).normalize()
    return f"{p:f}%"  # fixed notation: 1e-05% reads badly


def ordered(
    left: float,
    right: float,
    *,
    left_digits: int = 3,
    right_digits: int = CLAIM_DIGITS,
    left_up: bool = False,
    right_up: bool = True,
) -> tuple[str, str]:
    """``left`` and ``right`` printed so that the printed decimals keep the numbers' order: printed left >
    printed right when ``left > right``, < when ``left < right``, and ≤ when they are equal (lines state
    "b > c" or "b ≤ c", so an equal pair need not print equal: "ε ≥ 7.99 ≤ claimed 7.99996" is true).

    For a line that states an order, such as a headline "ε ≥ b > claimed c" (b a lower bound, rounded down;
    c a claim, rounded up) or "certifies at most m ≤ claimed c" (``left_up=True``). Each is rounded in its own
    safe direction at its own digits first; that alone can print b > c as "8 > 8", or m = c (both rounded up,
    m at fewer digits) as "8 ≤ 7.99996"; so both get one more digit at a time, up to :data:`MAX_DIGITS`, where
    each prints its own round-trip decimal (``repr``), and those compare as the floats do. Non-finite numbers
    are printed without the search.
    """
    left, right = float(left), float(right)
    for extra in range(MAX_DIGITS):
        ld, rd = min(MAX_DIGITS, left_digits + extra), min(MAX_DIGITS, right_digits + extra)
        a = upper(left, ld) if left_up else lower(left, ld)
        b = upper(right, rd) if right_up else lower(right, rd)
        if not (math.isfinite(left) and math.isfinite(right)):
            return a, b
        shown = _sign(Decimal(a) - Decimal(b))
        if shown == _sign(left - right) or (left == right and shown < 0):
            return a, b
        if ld == rd == MAX_DIGITS:
            break
    return a, b  # unreachable for finite floats: at 17 digits each prints its own repr, which keeps their order


def against(
    claim: Any, lowers: Sequence[Any], uppers: Sequence[Any] = (), *, digits: int = 3
) -> tuple[str, list[str], list[str]]:
    """One claim printed once (rounded up) with the lower bounds (``lowers``, "ε ≥ …", rounded down) and upper bounds
    (``uppers``, "certifies at most …", rounded up) shown beside it, each at ``digits`` significant digits or more,
    so that every printed bound compares with the ONE printed claim as the computed numbers do (as :func:`ordered`
    does for a pair): a line or a table never reads "claimed 2 …; estimate ε ≥ 1.999996 exceeds the claim" (two
    pairs, each ordered on its own, with the claim printed at the digits of the first pair only), nor
    "max certifiable 8 … claimed 7.99996 -> inconclusive".

    The claim takes the most digits any pair needs (rounded up at more digits is smaller, and still ≥ the claim, so
    each bound that printed above its pair's claim is above it); each bound then takes the fewest digits at which it
    compares right (at most :data:`MAX_DIGITS`, where it prints its own round-trip decimal). None → :data:`DASH`.
    """
    c = None if claim is None else float(claim)
    items = [(None if b is None else float(b), False) for b in lowers]
    items += [(None if m is None else float(m), True) for m in uppers]
    comparable = c is not None and math.isfinite(c)
    need = CLAIM_DIGITS
    for x, up in items:
        if comparable and x is not None and math.isfinite(x):
            pair = ordered(x, c, left_digits=digits, left_up=up)[1]
            need = max(need, len(Decimal(pair).as_tuple().digits))
    claim_shown = upper(c, need)
    shown = []
    for x, up in items:
        for extra in range(MAX_DIGITS):
            text = (upper if up else lower)(x, min(digits + extra, MAX_DIGITS))
            if not (comparable and x is not None and math.isfinite(x)):
                break
            printed = Decimal(text) - Decimal(claim_shown)
            if printed > 0 if x > c else (printed < 0 if x < c else printed <= 0):
                break
        shown.append(text)
    n = len(lowers)
    return claim_shown, shown[:n], shown[n:]


P_FLOOR = "1e-300"  # a p-value computed as 0 underflowed: it is below float64's least normal (2.2e-308), not 0


def p_value(x: Any, digits: int = 3, *, name: str = "p", missing: str = DASH) -> str:
    """A p-value as an estimate shown with "=" (rounded to nearest, as :func:`nearest`): "p = 0.0312". A p-value
    computed as 0 underflowed float64, and no test's evidence is infinite, so it prints "p < 1e-300", never
    "p = 0". ``name=""`` gives the bare value for a table column ("0.0312", "< 1e-300"). None → ``missing``."""
    if x is None:
        return missing
    lead = f"{name} " if name else ""
    if float(x) == 0:
        return f"{lead}< {P_FLOOR}"
    return f"{lead}= {nearest(x, digits)}" if name else nearest(x, digits)


def _sign(x: Any) -> int:
    return (x > 0) - (x < 0)


def _show(x: Any, digits: int, rounding: str, missing: str) -> str:
    if x is None:
        return missing
    if digits < 1:
        raise ValueError(f"expected digits >= 1, got {digits}")
    v = float(x)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if v == 0:
        return "0"
    short = Decimal(repr(v))  # the shortest decimal that reads back as v (Python's float repr)
    if len(short.normalize().as_tuple().digits) <= digits:
        return _g(short, digits)
    return _g(Context(prec=digits, rounding=rounding).plus(Decimal(v)), digits)  # Decimal(v): v's exact value


def _g(d: Decimal, digits: int) -> str:
    """A finite nonzero Decimal of at most ``digits`` significant digits as ``format(x, f".{digits}g")`` writes
    it: fixed point for exponents in [-4, digits), else scientific; trailing zeros dropped."""
    d = d.normalize()
    sign, coeff, _ = d.as_tuple()
    e = d.adjusted()
    if -4 <= e < digits:
        text = format(d, "f")
    else:
        mantissa = "".join(map(str, coeff))
        mantissa = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
        text = f"{'-' if sign else ''}{mantissa}e{e:+03d}"
    return text
