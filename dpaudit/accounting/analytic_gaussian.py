"""The analytic Gaussian mechanism (Balle & Wang 2018, arXiv:1805.06530): exact (epsilon, delta).

Balle & Wang 2018, Thm. 8: the Gaussian mechanism with noise std sigma and L2 sensitivity Delta is
(epsilon, delta)-DP if and only if
    Phi(Delta/(2 sigma) - epsilon sigma/Delta) - e^epsilon Phi(-Delta/(2 sigma) - epsilon sigma/Delta) <= delta.
This is the mu-GDP curve with mu = Delta/sigma (Dong, Roth & Su 2022, Cor. 2.13), so the numerics
(log-space, verified root finding) are shared with :mod:`dpaudit.accounting.gdp`. These functions
are the exact reference that the accountants are tested against.
"""

from __future__ import annotations

import math

from scipy import optimize

from dpaudit.accounting.gdp import gdp_delta, gdp_epsilon
from dpaudit.errors import UnreachableTargetError
from dpaudit.validation import check_in_interval, check_non_negative, check_positive


def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Exact delta(epsilon) of one Gaussian mechanism (Balle & Wang 2018, Thm. 8). Formal and tight."""
    sigma = check_non_negative(sigma=sigma)
    epsilon = check_non_negative(epsilon=epsilon)
    sensitivity = check_non_negative(sensitivity=sensitivity)
    if sensitivity == 0.0:
        return 0.0
    if sigma == 0.0:
        return 1.0
    return gdp_delta(sensitivity / sigma, epsilon)


def analytic_gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Exact epsilon(delta) of one Gaussian mechanism (inverts Balle & Wang 2018, Thm. 8).

    Formal guarantee: the returned epsilon satisfies analytic_gaussian_delta(sigma, epsilon) <= delta.
    """
    sigma = check_non_negative(sigma=sigma)
    delta = check_in_interval(0.0, 1.0, delta=delta)
    sensitivity = check_non_negative(sensitivity=sensitivity)
    if sensitivity == 0.0:
        return 0.0
    if sigma == 0.0:
        return math.inf
    return gdp_epsilon(sensitivity / sigma, delta)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest noise std sigma making the Gaussian mechanism (epsilon, delta)-DP (Balle & Wang 2018, Alg. 1).

    delta(sigma) is decreasing in sigma, so the root is bracketed and found with Brent's method,
    then nudged up until the guarantee provably holds (never under-reports).
    """
    epsilon = check_non_negative(epsilon=epsilon)
    delta = check_in_interval(0.0, 1.0, delta=delta)
    sensitivity = check_positive(sensitivity=sensitivity)
    if math.isinf(epsilon):
        return 0.0

    def excess(s: float) -> float:
        return analytic_gaussian_delta(s, epsilon, sensitivity) - delta

    hi = sensitivity
    while excess(hi) > 0:
        hi *= 2.0
        if hi > 1e12 * sensitivity:
            raise UnreachableTargetError(f"no sigma reaches epsilon={epsilon} at delta={delta}")
    lo = hi / 2.0
    while excess(lo) <= 0 and lo > 1e-12 * sensitivity:
        lo /= 2.0
    if excess(lo) <= 0:
        return lo
    s = optimize.brentq(excess, lo, hi, xtol=1e-15, rtol=1e-14)
    while excess(s) > 0:
        s = math.nextafter(s, math.inf) + 1e-14 * s
    return float(s)
