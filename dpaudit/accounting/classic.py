"""Classic (epsilon, delta) composition and amplification theorems, as plain functions.

These are the textbook bounds (loose compared to the RDP/PLD accountants) used for teaching,
for sanity checks and for mechanisms known only through an (epsilon, delta) guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dpaudit.errors import InputError
from dpaudit.validation import check_in_interval, check_non_negative, check_positive_int


def basic_composition(epsilons: Sequence[float], deltas: Sequence[float]) -> tuple[float, float]:
    """(sum epsilon_i, sum delta_i) for the adaptive composition of (epsilon_i, delta_i)-DP mechanisms.

    Formal guarantee (Dwork & Roth 2014, "The Algorithmic Foundations of Differential Privacy",
    Thm. 3.16; seed lecture "Recall Composition Theorem"). delta is capped at 1.
    """
    if len(epsilons) != len(deltas):
        raise InputError(f"expected as many deltas as epsilons, got {len(deltas)} and {len(epsilons)}")
    eps = math.fsum(check_non_negative(epsilon=e) for e in epsilons)
    dlt = math.fsum(check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=d) for d in deltas)
    return eps, min(1.0, dlt)


def advanced_composition(epsilon: float, delta: float, k: int, delta_prime: float) -> tuple[float, float]:
    """k-fold adaptive composition of (epsilon, delta)-DP mechanisms: (epsilon', k delta + delta').

    Formal guarantee (Dwork & Roth 2014, Thm. 3.20; seed lecture Theorem 3.20):
        epsilon' = sqrt(2 k ln(1/delta')) epsilon + k epsilon (e^epsilon - 1).
    Not capped at k epsilon (apply :func:`basic_composition` too and take the smaller if wanted).
    """
    eps = check_non_negative(epsilon=epsilon)
    dlt = check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=delta)
    k = check_positive_int(k=k)
    dp = check_in_interval(0.0, 1.0, delta_prime=delta_prime)
    eps_total = math.sqrt(2.0 * k * math.log(1.0 / dp)) * eps + k * eps * math.expm1(eps)
    return eps_total, min(1.0, k * dlt + dp)


def amplification_by_subsampling(epsilon: float, delta: float, sample_rate: float) -> tuple[float, float]:
    """(epsilon', delta') of an (epsilon, delta)-DP mechanism run on a Poisson subsample.

    Formal guarantee for add/remove neighbours: epsilon' = ln(1 + q (e^epsilon - 1)), delta' = q delta
    (Balle, Barthe & Gaboardi 2018, arXiv:1807.01647, Poisson subsampling row of their Table 1; the
    seed lecture's "Amplification via sampling" proof derives the same factor 1 + q (e - 1) for
    epsilon = 1). Computed with log1p/expm1 so
    that small q and epsilon keep full precision.
    """
    eps = check_non_negative(epsilon=epsilon)
    dlt = check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=delta)
    q = check_in_interval(0.0, 1.0, hi_open=False, sample_rate=sample_rate)
    if math.isinf(eps):
        return math.inf, q * dlt
    return math.log1p(q * math.expm1(eps)), q * dlt
