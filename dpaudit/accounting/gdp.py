"""Gaussian differential privacy (μ-GDP): conversions to (ε, δ).

Reference: Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022 (arXiv:1905.02383).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from dpaudit.validation import check_in_interval, check_non_negative


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of a μ-GDP mechanism.

    Dong, Roth & Su 2022, Corollary 2.13:
        δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).
    The second term is evaluated in log space (log Φ via scipy's log_ndtr) so that large ε
    does not overflow e^ε.
    """
    mu = check_non_negative(mu=mu)
    if mu == 0.0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    if math.isinf(epsilon):
        return 0.0
    a = special.log_ndtr(-epsilon / mu + mu / 2.0)
    b = epsilon + special.log_ndtr(-epsilon / mu - mu / 2.0)
    if b >= a:  # only through rounding; the true difference is >= 0
        return 0.0
    # log(e^a - e^b) = a + log1p(-e^(b - a))
    return float(max(0.0, math.exp(a + math.log1p(-math.exp(b - a)))))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ delta for a μ-GDP mechanism (inverts Corollary 2.13).

    δ(ε) is strictly decreasing in ε, so the root is bracketed and found with Brent's method;
    the result is nudged upward so that gdp_delta(mu, result) <= delta always holds.
    """
    mu = check_non_negative(mu=mu)
    delta = check_in_interval(0.0, 1.0, lo_open=False, delta=delta)
    if mu == 0.0:
        return 0.0
    if math.isinf(mu) or delta == 0.0:
        return math.inf
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    eps = optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12, rtol=1e-14)
    # Never under-report: step up until the guarantee provably holds at the returned value.
    while gdp_delta(mu, eps) > delta:
        eps = float(np.nextafter(eps, math.inf)) + 1e-12 * max(1.0, eps)
    return float(eps)


def gdp_mu_from_epsilon_delta(epsilon: float, delta: float) -> float:
    """Smallest μ whose μ-GDP curve gives δ(ε) ≥ delta, i.e. the μ implied by an (ε, δ) point.

    Used by audits to turn an empirical (ε, δ) into μ; δ(ε; μ) increases in μ (Dong, Roth & Su
    2022, Corollary 2.13), so this is a bracketed root.
    """
    check_non_negative(epsilon=epsilon)
    delta = check_in_interval(0.0, 1.0, delta=delta)
    hi = 1.0
    while gdp_delta(hi, epsilon) < delta:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    return float(optimize.brentq(lambda m: gdp_delta(m, epsilon) - delta, 1e-12, hi, xtol=1e-14))
