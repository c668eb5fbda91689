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

from dpaudit.accounting.gdp import _two_product, gdp_delta, gdp_epsilon
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
    return gdp_delta(_mu_up(sensitivity, sigma), epsilon)


def _mu_up(sensitivity: float, sigma: float) -> float:
    """Delta/sigma rounded up: delta(eps) grows with mu up to ~1600 times as fast in relative terms (delta ~ 1e-300),
    so an inexact quotient rounded down would under-report. Exact quotients (3/2) are kept."""
    mu = sensitivity / sigma
    if math.isinf(mu):
        return mu
    p, e = _two_product(mu, sigma)
    return mu if (p == sensitivity and e == 0.0) else math.nextafter(mu, math.inf)


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
    return gdp_epsilon(_mu_up(sensitivity, sigma), delta)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest noise std sigma making the Gaussian mechanism (epsilon, delta)-DP (Balle & Wang 2018, Alg. 1).

    delta(sigma) is decreasing in sigma and tends to 0 as sigma -> inf for every epsilon >= 0 (at epsilon = 0 it
    is erf(Delta/(2 sqrt2 sigma)), the total variation: pure-delta privacy), so every delta in (0, 1) has a finite
    sigma. The root is bracketed by doubling and halving without a fixed cap (a cap of 1e12 Delta refused
    epsilon = 0 at delta = 1e-13, whose sigma is 4e12 Delta; a floor of 1e-12 Delta returned 2^-40 Delta for
    epsilon = 1e30, 1300 times the smallest), found with Brent's method, then nudged up until the guarantee
    provably holds (never under-reports). Raises UnreachableTargetError only when sigma is beyond float64.
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
        if math.isinf(hi):
            raise UnreachableTargetError(
                f"the noise needed for epsilon={epsilon} at delta={delta} exceeds the float64 range "
                f"(sigma > 1e308 times the sensitivity); raise delta or epsilon"
            )
    lo = hi / 2.0
    while excess(lo) <= 0:  # terminates: delta(sigma) -> 1 as sigma -> 0 (and is 1 at sigma = 0)
        hi, lo = lo, lo / 2.0
    s = optimize.brentq(excess, lo, hi, xtol=1e-300, rtol=1e-14)
    while excess(s) > 0:
        s = math.nextafter(s, math.inf) + 1e-14 * s
    return float(s)
