"""Classic (epsilon, delta) composition and amplification theorems, as plain functions.

These are the textbook bounds (loose compared to the RDP/PLD accountants) used for teaching,
for sanity checks and for mechanisms known only through an (epsilon, delta) guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from dpaudit.errors import InputError
from dpaudit.validation import check_in_interval, check_non_negative, check_positive_int

#: Relative margin for a result computed with a few float operations: each of +, *, sqrt rounds by at most half
#: an ulp and libm's log, log1p, expm1 by at most one (Goldberg 1991, "What every computer scientist should know
#: about floating-point arithmetic", Thm. 2 ff.; glibc's documented ulps), and every formula below is a short
#: chain of well-conditioned steps (relative condition number <= 1 for log1p(x), x >= 0, and for sums of
#: non-negative terms), so its relative error stays below 8 ulps. Rounding to nearest alone put half of the
#: results below the exact value (up to 3e-16 relative): a privacy claim rounded down.
_ULPS = 8.0 * 2.0**-52


def _up(x: float) -> float:
    """``x`` (a non-negative result within :data:`_ULPS` relative of the exact value) rounded up past it."""
    if x == 0.0 or math.isinf(x):
        return x
    return math.nextafter(x * (1.0 + _ULPS), math.inf)


def _exact_up(value: Fraction) -> float:
    """The exact rational ``value`` (sums and products of floats are exact as Fractions) rounded up to a float."""
    f = float(value)
    return math.nextafter(f, math.inf) if Fraction(f) < value else f


def basic_composition(epsilons: Sequence[float], deltas: Sequence[float]) -> tuple[float, float]:
    """(sum epsilon_i, sum delta_i) for the adaptive composition of (epsilon_i, delta_i)-DP mechanisms.

    Formal guarantee (Dwork & Roth 2014, "The Algorithmic Foundations of Differential Privacy",
    Thm. 3.16; seed lecture "Recall Composition Theorem"). delta is capped at 1. Both sums are exact (Fractions)
    rounded up, never to nearest.
    """
    if len(epsilons) != len(deltas):
        raise InputError(f"expected as many deltas as epsilons, got {len(deltas)} and {len(epsilons)}")
    eps = [check_non_negative(epsilon=e) for e in epsilons]
    dlt = [check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=d) for d in deltas]
    total = math.inf if math.inf in eps else _exact_up(sum(map(Fraction, eps), Fraction(0)))
    return total, min(1.0, _exact_up(sum(map(Fraction, dlt), Fraction(0))))


def advanced_composition(epsilon: float, delta: float, k: int, delta_prime: float) -> tuple[float, float]:
    """k-fold adaptive composition of (epsilon, delta)-DP mechanisms: (epsilon', k delta + delta').

    Formal guarantee (Dwork & Roth 2014, Thm. 3.20; seed lecture Theorem 3.20):
        epsilon' = sqrt(2 k ln(1/delta')) epsilon + k epsilon (e^epsilon - 1).
    Not capped at k epsilon (apply :func:`basic_composition` too and take the smaller if wanted). Rounded up
    (:func:`_up`); e^epsilon beyond float64 (epsilon > 709.78) gives epsilon' = inf, not an OverflowError, and
    ln(1/delta') is taken as -ln(delta'), finite also where 1/delta' overflows (subnormal delta').
    """
    eps = check_non_negative(epsilon=epsilon)
    dlt = check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=delta)
    k = check_positive_int(k=k)
    dp = check_in_interval(0.0, 1.0, delta_prime=delta_prime)
    d_out = min(1.0, _exact_up(k * Fraction(dlt) + Fraction(dp)))
    if eps == 0.0:
        return 0.0, d_out
    growth = math.expm1(eps) if eps <= 709.0 else math.inf  # math.expm1 raises OverflowError beyond ~709.78
    eps_total = math.sqrt(2.0 * k * -math.log(dp)) * eps + k * eps * growth
    return _up(eps_total), d_out


def amplification_by_subsampling(epsilon: float, delta: float, sample_rate: float) -> tuple[float, float]:
    """(epsilon', delta') of an (epsilon, delta)-DP mechanism run on a Poisson subsample.

    Formal guarantee for add/remove neighbours: epsilon' = ln(1 + q (e^epsilon - 1)), delta' = q delta
    (Balle, Barthe & Gaboardi 2018, arXiv:1807.01647, Poisson subsampling row of their Table 1; the
    seed lecture's "Amplification via sampling" proof derives the same factor 1 + q (e - 1) for
    epsilon = 1). The same (epsilon', delta') holds for a uniform sample of m of n records without replacement,
    q = m/n, with substitution neighbours, for a mechanism (epsilon, delta)-DP under substitution (ibid., Table 1's
    row for sampling without replacement; the Yale seed lecture's "Amplification by subsampling" theorem).
    Computed with log1p/expm1 so that small q and epsilon keep full precision, and rounded up (:func:`_up`; capped
    at epsilon, which is exact at q = 1). For epsilon > 700, where e^epsilon overflows, q (e^eps - 1) is evaluated
    as e^t (1 - e^-eps) with t = eps + ln q (and ln(1 + that) as t + log1p(e^-t (1 - q)) where e^t overflows too),
    t carrying an absolute error of a few ulps of eps + |ln q|.
    """
    eps = check_non_negative(epsilon=epsilon)
    dlt = check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=delta)
    q = check_in_interval(0.0, 1.0, hi_open=False, sample_rate=sample_rate)
    d_out = _exact_up(Fraction(q) * Fraction(dlt))
    if math.isinf(eps) or q == 1.0 or eps == 0.0:
        return eps, dlt if q == 1.0 else d_out
    if eps <= 700.0:
        out = _up(math.log1p(q * math.expm1(eps)))
    else:  # q (e^eps - 1) = e^t (1 - e^-eps), t = eps + ln q; t carries an absolute error of a few ulps of eps + |ln q|
        log_q = math.log(q)
        t = eps + log_q
        slack = _ULPS * (eps - log_q)  # absolute, on t; a relative error of the same size on e^t
        if t < 700.0:
            out = math.log1p(math.exp(t) * -math.expm1(-eps))
            out = math.nextafter(out * (1.0 + slack + _ULPS), math.inf)
        else:
            out = math.nextafter(t + math.log1p(math.exp(-t) * (1.0 - q)) + slack + _ULPS * t, math.inf)
    # The exact value is positive here (q > 0, eps > 0): one below the least subnormal is not rounded to 0.
    return min(eps, max(out, math.ulp(0.0))), d_out
