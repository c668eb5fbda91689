"""GDP / f-DP, zCDP, classic composition and the analytic Gaussian: closed forms and identities."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from scipy import special, stats

from dpaudit.accounting import (
    GdpAccountant,
    ZcdpAccountant,
    advanced_composition,
    amplification_by_subsampling,
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
    basic_composition,
    dpsgd_event,
    epsilon_delta_tradeoff,
    gdp_delta,
    gdp_epsilon,
    gdp_mu_from_epsilon_delta,
    gdp_mu_poisson_clt,
    gdp_tradeoff,
    zcdp_epsilon,
    zcdp_epsilon_simple,
)
from dpaudit.accounting.zcdp import zcdp_delta
from dpaudit.errors import InputError, UnreachableTargetError, UnsupportedEventError
from dpaudit.events import (
    ZCDP,
    EpsilonDelta,
    Gaussian,
    GNMax,
    JLGaussian,
    Laplace,
    LNMax,
    PoissonSampled,
    RandomizedResponse,
)

# ---------------------------------------------------------------------------------------------
# Analytic Gaussian (Balle & Wang 2018)
# ---------------------------------------------------------------------------------------------


def test_analytic_gaussian_by_monte_carlo_free_integration():
    # delta(eps) = P[L > eps] - e^eps P'[L > eps] with L ~ N(mu^2/2, mu^2) under P and N(-mu^2/2, mu^2) under Q.
    sigma, eps = 1.3, 0.9
    mu = 1 / sigma
    direct = stats.norm.sf(eps, mu**2 / 2, mu) - math.exp(eps) * stats.norm.sf(eps, -(mu**2) / 2, mu)
    assert analytic_gaussian_delta(sigma, eps) == pytest.approx(direct, rel=1e-12)


@pytest.mark.parametrize(("eps", "delta"), [(0.1, 1e-5), (1.0, 1e-5), (8.0, 1e-10), (0.5, 0.01)])
def test_analytic_gaussian_sigma_round_trip(eps, delta):
    s = analytic_gaussian_sigma(eps, delta)
    assert analytic_gaussian_delta(s, eps) <= delta
    assert analytic_gaussian_delta(s * (1 - 1e-6), eps) > delta
    assert analytic_gaussian_epsilon(s, delta) == pytest.approx(eps, rel=1e-8)
    # Sensitivity scales sigma linearly.
    assert analytic_gaussian_sigma(eps, delta, sensitivity=3.0) == pytest.approx(3 * s, rel=1e-9)


def test_analytic_gaussian_beats_classical_calibration():
    # Classical Gaussian mechanism (Dwork & Roth 2014, Thm. A.1): sigma = sqrt(2 ln(1.25/delta)) / eps, eps < 1.
    eps, delta = 0.5, 1e-5
    assert analytic_gaussian_sigma(eps, delta) < math.sqrt(2 * math.log(1.25 / delta)) / eps


def test_analytic_gaussian_degenerate():
    assert analytic_gaussian_epsilon(0.0, 1e-5) == math.inf
    assert analytic_gaussian_delta(0.0, 1.0) == 1.0
    assert analytic_gaussian_delta(1.0, 1.0, sensitivity=0.0) == 0.0
    # Zero sensitivity releases nothing, even without noise: epsilon 0, not the noiseless mechanism's inf.
    assert analytic_gaussian_epsilon(0.0, 1e-5, sensitivity=0.0) == 0.0
    assert analytic_gaussian_delta(0.0, 0.5, sensitivity=0.0) == 0.0
    # A noise so small that mu^2 overflows: epsilon is infinite in float64 (it raised brentq's RuntimeError).
    assert analytic_gaussian_epsilon(1e-300, 1e-5) == math.inf


# ---------------------------------------------------------------------------------------------
# GDP / f-DP
# ---------------------------------------------------------------------------------------------


def test_gdp_tradeoff_closed_form():
    alpha = np.linspace(0, 1, 11)
    beta = gdp_tradeoff(1.0, alpha)
    np.testing.assert_allclose(beta, stats.norm.cdf(stats.norm.ppf(1 - alpha) - 1.0), atol=1e-15)
    assert gdp_tradeoff(0.0, 0.3) == pytest.approx(0.7)
    assert gdp_tradeoff(math.inf, 0.3) == 0.0
    with pytest.raises(InputError):
        gdp_tradeoff(1.0, 1.5)


def test_epsilon_delta_tradeoff_closed_form_and_dominated_by_gdp_point():
    alpha = np.linspace(0, 1, 101)
    f = epsilon_delta_tradeoff(1.0, 0.01, alpha)
    expected = np.maximum.reduce([np.zeros_like(alpha), 1 - 0.01 - math.e * alpha, (1 - 0.01 - alpha) / math.e])
    np.testing.assert_allclose(f, expected)
    # mu-GDP implies (eps, delta(eps))-DP, so G_mu >= f_(eps, delta(eps)) pointwise (Dong et al., Prop. 2.5).
    mu, eps = 1.0, 1.0
    g = gdp_tradeoff(mu, alpha)
    assert np.all(g >= epsilon_delta_tradeoff(eps, gdp_delta(mu, eps), alpha) - 1e-12)
    assert epsilon_delta_tradeoff(0.0, 0.0, 0.25) == pytest.approx(0.75)


def test_gdp_accountant_exact_for_gaussians():
    acc = GdpAccountant().compose(Gaussian(2.0), 4)  # mu = sqrt(4) / 2 = 1
    assert acc.mu == pytest.approx(1.0)
    assert acc.epsilon(1e-5) == pytest.approx(analytic_gaussian_epsilon(1.0, 1e-5), rel=1e-9)
    assert GdpAccountant().compose(GNMax(2.0, 10)).mu == pytest.approx(math.sqrt(2) / 2)
    assert GdpAccountant(neighbouring="replace_one").compose(Gaussian(2.0)).mu == pytest.approx(1.0)


def test_gdp_clt_warns_and_matches_formula():
    q, sigma, t = 256 / 60000, 1.1, 14063
    with pytest.warns(UserWarning, match="under-report"):
        acc = GdpAccountant().compose(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=t))
    mu = q * math.sqrt(t * math.expm1(1 / sigma**2))
    assert acc.mu == pytest.approx(mu, rel=1e-12)
    assert gdp_mu_poisson_clt(q, sigma, t) == pytest.approx(mu, rel=1e-12)
    assert acc.approximate
    assert acc.epsilon(1e-5) == pytest.approx(gdp_epsilon(mu, 1e-5))


def test_gdp_full_batch_is_exact_without_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc = GdpAccountant().compose(PoissonSampled(1.0, Gaussian(2.0)), 4)
    assert acc.mu == pytest.approx(1.0) and not acc.approximate


@pytest.mark.parametrize(
    ("eps", "delta", "mu_approx"),
    [
        # Large epsilon: mu ~ sqrt(2 eps) (the bracket stopped at mu = 1e4 and returned inf: `audit plan
        # --true-epsilon 1e9` then simulated NaN scores and failed with "scores must be finite").
        (1e9, 1e-5, math.sqrt(2e9)),
        # epsilon = 0: delta = 2 Phi(mu/2) - 1 ~ mu / sqrt(2 pi) (brentq started at mu = 1e-12, where delta is
        # already 4e-13, and raised "f(a) and f(b) must have different signs").
        (0.0, 1e-13, 1e-13 * math.sqrt(2 * math.pi)),
    ],
)
def test_gdp_mu_from_an_epsilon_delta_point_is_finite_at_both_ends(eps, delta, mu_approx):
    mu = gdp_mu_from_epsilon_delta(eps, delta)
    assert mu == pytest.approx(mu_approx, rel=1e-2, abs=0.0)  # abs=0: pytest's default 1e-12 would pass any 1e-13
    assert gdp_delta(mu, eps) == pytest.approx(delta, rel=1e-6, abs=0.0)


@pytest.mark.parametrize("mu", [1e-3, 1e-9, 1e-12])
def test_gdp_delta_at_epsilon_zero_is_the_total_variation_to_full_precision(mu):
    # delta(0) = Phi(mu/2) - Phi(-mu/2) = erf(mu / (2 sqrt 2)) (Dong, Roth & Su 2022, Cor. 2.13 at eps = 0). The
    # log-space difference cancelled near Phi = 1/2: 1.7e-7 low at mu = 1e-9, 1e-4 low at mu = 1e-12 (under-reported).
    assert gdp_delta(mu, 0.0) == pytest.approx(float(special.erf(mu / (2 * math.sqrt(2)))), rel=1e-14, abs=0.0)


def test_gdp_rejects_jl_and_pure_dp():
    with pytest.raises(UnsupportedEventError, match=r"Prop\. B\.5|use pld"):
        GdpAccountant().compose(PoissonSampled(0.1, JLGaussian(1.0, 5)))
    with pytest.raises(UnsupportedEventError):
        GdpAccountant().compose(Laplace(1.0))


# ---------------------------------------------------------------------------------------------
# zCDP
# ---------------------------------------------------------------------------------------------


def test_zcdp_gaussian_and_pure_dp():
    acc = ZcdpAccountant().compose(Gaussian(2.0), 3).compose(ZCDP(0.1)).compose(EpsilonDelta(0.2, 0.0))
    assert acc.rho == pytest.approx(3 / 8 + 0.1 + 0.02)
    assert ZcdpAccountant().compose(Laplace(2.0)).rho == pytest.approx(0.125)  # eps = 1/2
    with pytest.raises(UnsupportedEventError):
        ZcdpAccountant().compose(EpsilonDelta(1.0, 1e-6))
    with pytest.raises(UnsupportedEventError):
        ZcdpAccountant().compose(PoissonSampled(0.1, Gaussian(1.0)))
    # Sampling rate 1 is the plain Gaussian (dpsgd_event(sample_rate=1) builds it): rho = 1/(2 sigma^2) per step
    # (Bun & Steinke 2016, Prop. 1.6), was refused as "subsampling is not supported".
    full = ZcdpAccountant().compose(dpsgd_event(sample_rate=1.0, noise_multiplier=2.0, steps=5))
    assert full.rho == pytest.approx(5 / 8, rel=1e-15)


def test_zcdp_of_the_aggregation_and_randomized_response_leaves():
    # No test composed these leaves into the zcdp accountant (coverage): each rho against its closed form.
    # GNMax: one changed vote moves the histogram by sqrt(2) in L2, rho = 2 / (2 sigma^2) (Papernot et al. 2018,
    # Prop. 8); LNMax: (2/b)-DP (Papernot et al. 2017), rho = eps^2 / 2 (Bun & Steinke 2016, Prop. 1.4); k-ary
    # randomized response keeping the truth w.p. 1 - p: eps = log(k/p - k + 1).
    assert ZcdpAccountant().compose(GNMax(3.0, 10)).rho == pytest.approx(1 / 9, rel=1e-15)
    assert ZcdpAccountant().compose(LNMax(4.0, 10), 2).rho == pytest.approx(2 * 0.5**2 / 2, rel=1e-15)
    assert ZcdpAccountant().compose(LNMax(0.0, 10)).rho == math.inf
    rr = ZcdpAccountant(neighbouring="replace_one")
    assert rr.compose(RandomizedResponse(0.5, 4)).rho == pytest.approx(math.log(5.0) ** 2 / 2, rel=1e-15)
    assert ZcdpAccountant(neighbouring="replace_one").compose(RandomizedResponse(1.0, 4)).rho == 0.0
    assert ZcdpAccountant(neighbouring="replace_one").compose(RandomizedResponse(0.0, 4)).rho == math.inf
    with pytest.raises(UnsupportedEventError, match="replace_one"):
        ZcdpAccountant().compose(RandomizedResponse(0.5, 4))


@pytest.mark.parametrize("rho", [1e-4, 0.01, 0.5, 5.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_zcdp_conversions(rho, delta):
    simple = zcdp_epsilon_simple(rho, delta)
    assert simple == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)))
    tight = zcdp_epsilon(rho, delta)
    assert tight <= simple
    assert zcdp_delta(rho, tight) <= delta * (1 + 1e-6)
    # A Gaussian with rho = 1/(2 sigma^2) is exactly sigma-analytic; zCDP can only be looser.
    sigma = 1 / math.sqrt(2 * rho)
    assert tight >= analytic_gaussian_epsilon(sigma, delta) * (1 - 1e-9)


# ---------------------------------------------------------------------------------------------
# Classic composition
# ---------------------------------------------------------------------------------------------


def test_basic_composition():
    assert basic_composition([0.1, 0.2, 0.3], [1e-6, 0, 1e-6]) == (pytest.approx(0.6), pytest.approx(2e-6))
    with pytest.raises(InputError):
        basic_composition([0.1], [])


def test_advanced_composition_theorem_3_20():
    eps, k, dp = 0.1, 100, 1e-6
    e, d = advanced_composition(eps, 1e-8, k, dp)
    assert e == pytest.approx(math.sqrt(2 * k * math.log(1 / dp)) * eps + k * eps * (math.exp(eps) - 1))
    assert d == pytest.approx(k * 1e-8 + dp)


def test_amplification_by_subsampling():
    e, d = amplification_by_subsampling(1.0, 1e-5, 0.01)
    assert e == pytest.approx(math.log(1 + 0.01 * (math.e - 1)))
    assert d == pytest.approx(1e-7)
    # The seed lecture's Lemma 3: for eps = 1 and q <= 1, ln(1 + q(e-1)) <= 2q.
    for q in (0.01, 0.1, 0.5, 1.0):
        assert amplification_by_subsampling(1.0, 0.0, q)[0] <= 2 * q
    assert amplification_by_subsampling(1e-12, 0.0, 1e-9)[0] == pytest.approx(1e-21, rel=1e-9, abs=0)


# ---------------------------------------------------------------------------------------------
# Edge cases and independent high-precision oracles (mutation testing, seventh pass)
# ---------------------------------------------------------------------------------------------


def _mp_gdp_delta(mu, eps):
    """delta(eps) of mu-GDP (Dong, Roth & Su 2022, Cor. 2.13) at 50 digits with mpmath."""
    import mpmath as mp

    with mp.workdps(50):
        mu, eps = mp.mpf(mu), mp.mpf(eps)
        return mp.ncdf(-eps / mu + mu / 2) - mp.exp(eps) * mp.ncdf(-eps / mu - mu / 2)


def _mp_bisect(f, lo, hi, n=200):
    """Root of an increasing f on [lo, hi] by bisection (independent of scipy's brentq)."""
    for _ in range(n):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return lo, hi


def test_gdp_conversions_at_their_degenerate_points():
    # mu = 0: identical distributions, delta = 0 at every epsilon and epsilon = 0 at every delta (a 0/0 raised).
    for eps in (0.0, 0.5):
        assert gdp_delta(0.0, eps) == 0.0
    assert gdp_epsilon(0.0, 1e-5) == 0.0 and gdp_epsilon(0.0, 0.0) == 0.0
    # mu = inf: distinguishable with certainty; epsilon = inf: no delta left.
    assert gdp_delta(math.inf, 3.0) == 1.0 and gdp_epsilon(math.inf, 0.5) == math.inf
    assert gdp_delta(1.0, math.inf) == 0.0
    # delta(eps) = e^-2e8 or e^-4.5e8 is 0 in float64; there the two log-space terms round to b >= a (the branch
    # that returns 0, not a negative or a one).
    assert gdp_delta(1e-4, 2.0) == 0.0 and gdp_delta(1e-3, 30.0) == 0.0
    # delta = 0 needs epsilon = inf for any mu > 0 (the tails of two Gaussians never match).
    assert gdp_epsilon(1.0, 0.0) == math.inf
    # delta at or above delta(0) = Phi(mu/2) - Phi(-mu/2) is met by epsilon = 0 (never a negative epsilon).
    d0 = float(_mp_gdp_delta(0.1, 0.0))  # 0.0399
    assert gdp_epsilon(0.1, d0 * 1.01) == 0.0 and gdp_epsilon(0.1, 0.6) == 0.0
    assert gdp_epsilon(0.1, d0 * 0.99) > 0.0
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(InputError):
            gdp_epsilon(1.0, bad)
    acc = GdpAccountant()
    acc.compose(Gaussian(1.0))
    assert acc.epsilon(0.0) == math.inf and acc.delta(math.inf) == 0.0


@pytest.mark.parametrize(("mu", "delta"), [(0.3, 1e-5), (1.0, 1e-5), (2.5, 1e-9), (6.0, 1e-3)])
def test_gdp_epsilon_and_delta_against_a_50_digit_oracle(mu, delta):
    # gdp_delta to 1e-9 relative; gdp_epsilon is the smallest epsilon with delta(epsilon) <= delta: above the root
    # found by bisection at 50 digits, and within 1e-9 of it.
    for eps in (0.0, 0.7, 3.0, 12.0):
        assert gdp_delta(mu, eps) == pytest.approx(float(_mp_gdp_delta(mu, eps)), rel=1e-9, abs=1e-300)
    lo, hi = _mp_bisect(lambda e: delta - _mp_gdp_delta(mu, e), 0.0, 200.0)
    eps = gdp_epsilon(mu, delta)
    assert float(lo) * (1 - 1e-12) <= eps <= float(hi) * (1 + 1e-9) + 1e-12
    assert gdp_delta(mu, eps) <= delta  # the documented guarantee (brentq's root is nudged up where it misses)


def test_gdp_delta_is_never_below_the_50_digit_value_where_its_terms_cancel():
    # Small mu: delta = e^a - e^b with b - a -> 0, and the rounding of a and b was amplified in the difference:
    # 2.8e-8 below the 50-digit value at mu = 1e-8, eps = 1e-9; 2.2e-13 at mu = 1e-3, eps = 0; and
    # analytic_gaussian_sigma(0, 1e-7) returned a sigma 2.9e-11 below the exact 1/(2 sqrt2 erfinv(delta)).
    import mpmath

    for mu in (1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 0.3):
        for eps in (0.0, 1e-9, 1e-6, 1e-4, 1e-3, 0.05):
            exact = _mp_gdp_delta(mu, eps)
            if exact > 1e-300:
                ours = gdp_delta(mu, eps)
                assert ours >= exact and ours <= exact * (1 + 1e-14), (mu, eps)  # a few ulps, never below
    with mpmath.workdps(50):
        for delta in (1e-5, 1e-7, 1e-9, 1e-11):
            exact = 1 / (2 * mpmath.sqrt(2) * mpmath.erfinv(delta))
            assert exact <= analytic_gaussian_sigma(0.0, delta) <= exact * (1 + 1e-12), delta


def test_gdp_delta_is_within_a_few_ulps_above_the_50_digit_value_down_to_1e300():
    # The two terms of Cor. 2.13 cancel for small mu or large eps/mu; the difference of floats plus a margin that
    # covered its rounding was up to 2.6e-8 above the 50-digit value (mu = 1e-6, eps = 1e-6) and 1.7e-8 at
    # mu = 1e-8, eps = 1e-9. Now within 16 ulps (+3 measured) above, never below, on a grid of mu in [1e-6, 50],
    # eps in [1e-12, 100] and points placed at eps/mu - mu/2 = 36.5 (delta ~ 1e-292), 30, 10, 1, -0.5.
    import mpmath

    points = [(mu, eps) for mu in (1e-6, 1e-3, 0.05, 1.0, 7.0, 50.0) for eps in (1e-12, 1e-6, 0.01, 0.5, 3.0, 100.0)]
    points += [(mu, mu * (z + mu / 2)) for mu in (1e-6, 1e-3, 0.3, 2.0) for z in (36.5, 30.0, 10.0, 1.0, -0.5)]
    points += [(1e-8, 1e-9), (1e-6, 1e-9)]
    checked = 0
    for mu, eps in points:
        exact = _mp_gdp_delta(mu, eps)
        if exact > 1e-300:
            ours = gdp_delta(mu, eps)
            with mpmath.workdps(50):
                assert exact <= ours <= exact * (1 + 20 * 2.0**-52), (mu, eps, float(exact), ours)
            checked += 1
    assert checked >= 45


@pytest.mark.parametrize(("mu", "delta"), [(1e-300, 1e-310), (1e-8, 3.9e-9), (0.01, 1e-7)])
def test_gdp_epsilon_is_relatively_tight_at_tiny_epsilon(mu, delta):
    # An absolute root tolerance of 1e-12 returned 9.1e-13 where the smallest epsilon is 6.28e-300 (mu = 1e-300).
    # The oracle at 350 digits: at mu = 1e-300 the two terms agree to 300 digits.
    import mpmath as mp

    def mp_delta(e):
        with mp.workdps(350):
            m, e = mp.mpf(mu), mp.mpf(e)
            return mp.ncdf(-e / m + m / 2) - mp.exp(e) * mp.ncdf(-e / m - m / 2)

    lo, hi = _mp_bisect(lambda e: delta - mp_delta(e), 0.0, 100.0 * mu, n=80)
    eps = gdp_epsilon(mu, delta)
    assert float(lo) * (1 - 1e-13) <= eps <= float(hi) * (1 + 1e-12)
    assert gdp_delta(mu, eps) <= delta


def test_the_rounding_of_mu_never_under_reports_delta():
    # delta(eps) grows with mu up to ~1600 times as fast in relative terms near delta ~ 1e-300: Delta/sigma rounded
    # to nearest put delta 8.3e-14 below the 50-digit value at sigma = 0.13 (5.2e-14 at 0.7, with eps/mu - mu/2 =
    # 36). The accountant's mu = sqrt(sum of mu^2) likewise.
    import mpmath

    for sigma in (0.7, 0.13, 0.17, 0.23):
        mu = 1.0 / sigma
        eps = mu * (36 + mu / 2)
        with mpmath.workdps(50):
            m, e = 1 / mpmath.mpf(sigma), mpmath.mpf(eps)
            exact = mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)
        assert exact <= analytic_gaussian_delta(sigma, eps) <= exact * (1 + 1e-12), sigma
        assert exact <= GdpAccountant().compose(Gaussian(sigma)).delta(eps) <= exact * (1 + 1e-11), sigma
        d = float(exact) * 1.5
        assert exact * 1.5 >= analytic_gaussian_delta(sigma, analytic_gaussian_epsilon(sigma, d))
    assert analytic_gaussian_epsilon(2.0, 1e-5, sensitivity=3.0) == gdp_epsilon(1.5, 1e-5)  # an exact quotient


def test_gdp_delta_is_at_most_one_defined_at_a_tiny_epsilon_and_an_upper_bound_where_it_is_subnormal():
    # Mutation testing (fifteenth pass): min(1, .) raised to min(2, .) returned 1 + 4e-15 at mu = 50; the term count
    # 1/x^2 taken at every x raised ZeroDivisionError at eps/mu = 1e-200 (x^2 underflows); without the added
    # smallest subnormal (or with it subtracted) delta = 6.996e-321 came out below the 50-digit value (the
    # relative margin does not move a subnormal).
    import mpmath

    for mu, eps in ((50.0, 1e-12), (40.0, 1e-6), (38.0, 0.01)):
        assert gdp_delta(mu, eps) <= 1.0
    for mu, eps in ((1.0, 1e-200), (1e-3, 1e-170)):  # delta(eps) = delta(0) (1 - O(eps)): the total variation
        assert gdp_delta(mu, eps) == pytest.approx(gdp_delta(mu, 0.0), rel=1e-14)
        assert gdp_delta(mu, eps) >= _mp_gdp_delta(mu, eps)
    exact = _mp_gdp_delta(2.0, 78.4)  # eps/mu - mu/2 = 38.2: delta = 6.996e-321, subnormal
    with mpmath.workdps(50):
        assert 5e-321 < exact < 1e-320
        assert exact <= gdp_delta(2.0, 78.4) <= exact + 2 * 5e-324
    # Past eps/mu - mu/2 = 40 the value is below the smallest float: 0 (a return of 1 or -1 there survived), and
    # with mu/2 - eps/mu > 40 it is 1 (phi(z) taken as 1 there gave 0.98 at mu = 100, eps = 1).
    assert gdp_delta(1.0, 41.0) == 0.0 and gdp_delta(100.0, 1.0) == 1.0
    # mu = 100 > 83: the bracket's first end mu (41.5 + mu/2) with the sign flipped was negative (epsilon = inf).
    lo, hi = _mp_bisect(lambda e: 1e-5 - _mp_gdp_delta(100.0, e), 0.0, 6000.0, n=80)
    assert float(lo) * (1 - 1e-13) <= gdp_epsilon(100.0, 1e-5) <= float(hi) * (1 + 1e-12)
    # mu = 1.157e18: 41.5 mu is lost in the rounding of the bracket's end mu (41.5 + mu/2), where delta is still
    # 0.5: the doubling (never entered at smaller mu) is needed, and without it brentq refused the bracket. Past
    # mu = 1.3e154 epsilon is beyond float64: inf (a NaN there survived).
    mu = 1.1568200746347003e18
    eps = gdp_epsilon(mu, 1e-5)
    assert gdp_delta(mu, eps) <= 1e-5 < gdp_delta(mu, eps * (1 - 1e-12))
    assert gdp_epsilon(1e155, 1e-5) == math.inf


def test_gdp_delta_is_within_a_few_ulps_above_the_50_digit_value_at_large_mu_on_the_series_branch():
    # eps/mu >= mu (x >= 2h with h = mu/2 > 1): the positive series for m(x - h) - m(x + h), whose term count the
    # grid above (mu <= 50, eps <= 100) never tested at large h: the term ratio's bound h^2/x^2 halved put delta
    # 759 ulps below the 50-digit value at mu = 60, eps = 3600; 1/x^2 replaced by 1 gave 1.6e213 times it at 40, 2000.
    for mu, eps in ((20.0, 400.0), (20.0, 600.0), (40.0, 1600.0), (40.0, 2000.0), (60.0, 3600.0)):
        exact = _mp_gdp_delta(mu, eps)
        assert exact <= gdp_delta(mu, eps) <= exact * (1 + 20 * 2.0**-52), (mu, eps)


def test_two_sum_and_two_product_are_exact():
    # Knuth's TwoSum and Dekker's product: a + b = s + e and a b = p + e exactly (gdp_delta's double-double z). TwoSum
    # with its error term cut to b - bb (Fast2Sum, which needs |a| >= |b|) lost a = 1e-20 from 1e-20 + 1.
    from fractions import Fraction

    from dpaudit.accounting.gdp import _two_product, _two_sum

    rng = np.random.default_rng(0)
    scale = 10.0 ** rng.integers(-30, 30, size=(2, 300))
    pairs = [(float(a), float(b)) for a, b in (rng.standard_normal((2, 300)) * scale).T]
    pairs += [(1e-20, 1.0), (3.0, -1e17), (0.1, 0.7), (-2.5, 2.5)]
    for a, b in pairs:
        s, e = _two_sum(a, b)
        assert Fraction(s) + Fraction(e) == Fraction(a) + Fraction(b), (a, b)
        p, e = _two_product(a, b)
        assert Fraction(p) + Fraction(e) == Fraction(a) * Fraction(b), (a, b)


def test_analytic_gaussian_sigma_has_no_cap_at_epsilon_zero_or_floor_at_huge_epsilon():
    # epsilon = 0 (pure delta): sigma = Delta / (2 sqrt2 erfinv(delta)) exactly; a bracket capped at 1e12 Delta said
    # "no sigma reaches" at delta = 1e-13 (sigma = 4e12) and 1e-300 (4e299). eps = 1e30 needs sigma ~ 1/sqrt(2e30)
    # = 7.07e-16, where a floor of 1e-12 returned 2^-40 = 9.1e-13.
    import mpmath

    with mpmath.workdps(50):
        for delta in (1e-13, 1e-300):
            exact = 1 / (2 * mpmath.sqrt(2) * mpmath.erfinv(delta))
            assert exact <= analytic_gaussian_sigma(0.0, delta) <= exact * (1 + 1e-12), delta
    assert analytic_gaussian_sigma(1e30, 1e-5) == pytest.approx(1 / math.sqrt(2e30), rel=1e-10)
    sigma = analytic_gaussian_sigma(1e-12, 1e-300)  # the smallest: delta(sigma) <= 1e-300 < delta(sigma (1 - 1e-9))
    assert _mp_gdp_delta(1 / sigma, 1e-12) <= 1e-300 < _mp_gdp_delta(1 / (sigma * (1 - 1e-9)), 1e-12)
    with pytest.raises(UnreachableTargetError, match="float64 range"):
        analytic_gaussian_sigma(0.0, 5e-324)  # sigma ~ 1e323 Delta
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(InputError, match="delta"):
            analytic_gaussian_sigma(1.0, bad)


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-5), (0.2, 0.01), (4.0, 1e-10), (20.0, 1e-3), (2e7, 0.5)])
def test_gdp_mu_from_epsilon_delta_against_a_50_digit_oracle(eps, delta):
    # (20, 1e-3): mu* ~ 5.7 > 1, the bracket is doubled; (2e7, 0.5): mu* ~ sqrt(2 eps) = 6325.
    from dpaudit.accounting.gdp import gdp_mu_from_epsilon_delta

    lo, hi = _mp_bisect(lambda m: _mp_gdp_delta(m, eps) - delta, 1e-9, 1e5)
    assert gdp_mu_from_epsilon_delta(eps, delta) == pytest.approx(float((lo + hi) / 2), rel=1e-9)
    # delta(eps; mu) ~ Phi(mu/2 - eps/mu): delta = 1/2 at eps = 1e9 needs mu = sqrt(2e9) (once reported as infinite, a
    # bracket capped at 1e4; covhunt removed the cap).
    assert gdp_mu_from_epsilon_delta(1e9, 0.5) == pytest.approx(math.sqrt(2e9), rel=1e-9)


def _ckx_grid(rho, delta=None, eps=None):
    """Canonne, Kamath & Steinke 2020 (arXiv:2004.00010, Prop. 12 on r(alpha) = rho alpha), minimised over a fine
    grid of orders alpha = 1 + e^t in float64 numpy (independent of the code's scalar optimiser)."""
    a = 1.0 + np.exp(np.linspace(-12.0, 12.0, 200_001))
    if eps is None:
        return float(np.min(a * rho + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)))
    log_d = (a - 1.0) * (a * rho - eps) + a * np.log1p(-1.0 / a) - np.log(a - 1.0)
    return float(min(1.0, math.exp(min(0.0, float(np.min(log_d))))))


@pytest.mark.parametrize(("rho", "delta"), [(1e-3, 1e-5), (0.05, 1e-6), (0.5, 1e-3), (1.0, 1e-5), (20.0, 1e-10)])
def test_zcdp_conversions_are_the_optimum_over_orders(rho, delta):
    # The optimiser only affects tightness, so the code's epsilon is >= the grid's minimum up to the grid's
    # spacing, and a mutant that lands elsewhere (a wrong bound, a wrong sign) is seen as not tight.
    grid = _ckx_grid(rho, delta=delta)
    assert grid * (1 - 1e-6) - 1e-9 <= zcdp_epsilon(rho, delta) <= grid * (1 + 1e-6) + 1e-9
    eps = 0.5 * grid
    d_grid = _ckx_grid(rho, eps=eps)
    assert zcdp_delta(rho, eps) == pytest.approx(d_grid, rel=1e-5)
    assert zcdp_delta(rho, 1.5 * grid) < delta < zcdp_delta(rho, eps)


def test_zcdp_degenerate_points_and_accountant():
    assert zcdp_epsilon(0.0, 1e-5) == 0.0 and zcdp_delta(0.0, 0.1) == 0.0 and zcdp_delta(0.0, 0.0) == 0.0
    # Where the bound at some order is below 0 (rho 1e-4, delta 1/2: -0.69 at alpha = 2), epsilon is 0, not negative.
    assert zcdp_epsilon(1e-4, 0.5) == 0.0
    assert zcdp_epsilon(math.inf, 1e-5) == math.inf and zcdp_delta(math.inf, 1.0) == 1.0
    assert zcdp_epsilon_simple(math.inf, 1e-5) == math.inf
    # Huge rho at a small epsilon: delta is capped at 1 (the log-space bound exceeds 0 there).
    assert zcdp_delta(50.0, 0.0) == 1.0
    for bad in (0.0, 1.0):
        with pytest.raises(InputError):
            zcdp_epsilon(0.1, bad)
    with pytest.raises(InputError):
        zcdp_epsilon_simple(0.1, 1.0)
    acc = ZcdpAccountant().compose(Gaussian(2.0), 2).compose(GNMax(4.0, 10))
    # Gaussian: 1/(2 sigma^2) each (Bun & Steinke 2016, Prop. 1.6); GNMax: sensitivity sqrt(2), 2/(2 sigma^2).
    assert acc.rho == pytest.approx(2 / 8 + 1 / 16, rel=1e-15)
    assert acc.epsilon(0.0) == math.inf and ZcdpAccountant().compose(ZCDP(0.0)).epsilon(0.0) == 0.0
    assert acc.delta(0.3) == zcdp_delta(acc.rho, 0.3)
    assert ZcdpAccountant().compose(Gaussian(0.0)).rho == math.inf
    assert ZcdpAccountant().compose(Laplace(0.0)).rho == math.inf
    # LNMax of scale b is (2/b, 0)-DP (Papernot et al. 2017, Sec. 3), so rho = (2/b)^2 / 2 (Bun & Steinke, Prop. 1.4).
    assert ZcdpAccountant().compose(LNMax(4.0, 10)).rho == pytest.approx(0.125, rel=1e-15)
    assert ZcdpAccountant().compose(LNMax(0.0, 10)).rho == math.inf
    # k-ary randomized response keeping the truth w.p. 1 - p: its largest privacy loss is
    # log((1 - p + p/k) / (p/k)) = log(k/p - k + 1) (pure DP), so rho = that^2 / 2 (Bun & Steinke, Prop. 1.4).
    for p, k in ((0.5, 2), (0.2, 10), (0.9, 3)):
        loss = math.log((1 - p + p / k) / (p / k))
        assert ZcdpAccountant(neighbouring="replace_one").compose(RandomizedResponse(p, k)).rho == pytest.approx(
            loss * loss / 2, rel=1e-12
        )
    for p, k, rho in ((1.0, 5, 0.0), (0.3, 1, 0.0), (0.0, 5, math.inf)):
        assert ZcdpAccountant(neighbouring="replace_one").compose(RandomizedResponse(p, k)).rho == rho
    with pytest.raises(UnsupportedEventError, match="replace_one"):
        ZcdpAccountant().compose(RandomizedResponse(0.5, 2))


def test_classic_theorems_cap_delta_and_refuse_out_of_range_inputs():
    # Dwork & Roth 2014, Thm. 3.16 and 3.20: delta sums (capped at 1, a probability).
    assert basic_composition([1.0, 2.0], [0.6, 0.7]) == (3.0, 1.0)
    assert advanced_composition(0.1, 0.2, 10, 1e-6)[1] == 1.0
    for bad in ((-0.1, 0.0), (0.1, 1.5), (0.1, -1e-9)):
        with pytest.raises(InputError):
            basic_composition([bad[0]], [bad[1]])
    with pytest.raises(InputError):
        advanced_composition(0.1, 1e-8, 0, 1e-6)
    with pytest.raises(InputError):
        advanced_composition(0.1, 1e-8, 10, 0.0)
    # One mechanism (k = 1): sqrt(2 ln(1/delta')) eps + eps (e^eps - 1), not below eps for small delta'.
    e1, d1 = advanced_composition(0.5, 0.0, 1, 1e-3)
    # Rounded up by at most 8 ulps (classic._ULPS), never to nearest.
    closed = math.sqrt(2 * math.log(1e3)) * 0.5 + 0.5 * math.expm1(0.5)
    assert closed <= e1 <= closed * (1 + 4e-15) and d1 == 1e-3
    # Poisson subsampling (Balle, Barthe & Gaboardi 2018): q = 1 changes nothing; eps = inf stays inf.
    assert amplification_by_subsampling(0.7, 1e-5, 1.0) == (pytest.approx(0.7, rel=1e-15), 1e-5)
    assert amplification_by_subsampling(math.inf, 0.5, 0.1) == (math.inf, pytest.approx(0.05))
    with pytest.raises(InputError):
        amplification_by_subsampling(1.0, 1e-5, 0.0)
    # Every delta is a probability in [0, 1], 1 included (vacuous, not invalid): delta' of the advanced theorem too.
    assert basic_composition([0.5], [1.0]) == (0.5, 1.0) and advanced_composition(0.1, 1.0, 2, 1e-6)[1] == 1.0
    assert amplification_by_subsampling(0.5, 1.0, 0.5)[1] == 0.5
    for delta, delta_prime in ((-1e-9, 1e-6), (1.5, 1e-6), (1e-8, 1.5)):
        with pytest.raises(InputError, match="delta"):
            advanced_composition(0.1, delta, 10, delta_prime)
    for delta in (-1e-9, 1.5):
        with pytest.raises(InputError, match="delta"):
            amplification_by_subsampling(1.0, delta, 0.5)
    with pytest.raises(InputError, match="sample_rate"):
        amplification_by_subsampling(1.0, 1e-5, 1.5)


def test_analytic_gaussian_scales_with_sensitivity_and_its_extremes():
    # Balle & Wang 2018, Thm. 8 depends on Delta / sigma only.
    assert analytic_gaussian_delta(2.0, 0.5, sensitivity=3.0) == pytest.approx(float(_mp_gdp_delta(1.5, 0.5)), rel=1e-9)
    assert analytic_gaussian_epsilon(2.0, 1e-5, sensitivity=3.0) == gdp_epsilon(1.5, 1e-5)
    assert analytic_gaussian_epsilon(2.0, 1e-5, sensitivity=0.0) == 0.0
    assert analytic_gaussian_delta(0.0, 1.0, sensitivity=0.0) == 0.0
    assert analytic_gaussian_sigma(math.inf, 1e-5) == 0.0
    # epsilon = 0: delta(0) = 2 Phi(mu/2) - 1 (Balle & Wang 2018, Thm. 8), so sigma = 1 / (2 Phi^-1((1 + delta)/2)).
    import mpmath as mp

    with mp.workdps(40):
        exact0 = float(1 / (2 * mp.sqrt(2) * mp.erfinv(mp.mpf("1e-3"))))
    assert exact0 * (1 - 1e-12) <= analytic_gaussian_sigma(0.0, 1e-3) <= exact0 * (1 + 1e-8)
    # (delta = 1e-13, sigma ~ 4e12: test_analytic_gaussian_sigma_has_no_cap_at_epsilon_zero_or_floor_at_huge_epsilon.)
    with pytest.raises(InputError):
        analytic_gaussian_sigma(1.0, 1e-5, sensitivity=0.0)
    # A huge epsilon needs sigma well below the sensitivity (the bracket is halved down to it), still sound and tight.
    s = analytic_gaussian_sigma(60.0, 0.01)
    assert s < 0.2 and analytic_gaussian_delta(s, 60.0) <= 0.01 < analytic_gaussian_delta(s * (1 - 1e-6), 60.0)
    # An absurd epsilon is met even at the search's floor, 1e-12 sensitivities: that sigma is returned, and sound.
    s = analytic_gaussian_sigma(1e30, 1e-5)
    assert s <= 1e-12 and analytic_gaussian_delta(s, 1e30) <= 1e-5
    # A tiny epsilon with a tiny delta needs sigma far above the sensitivity (the bracket is doubled).
    s = analytic_gaussian_sigma(1e-3, 1e-12)
    assert s > 100 and analytic_gaussian_delta(s, 1e-3) <= 1e-12 < analytic_gaussian_delta(s * (1 - 1e-6), 1e-3)


def test_gdp_leaves_at_their_edges_and_the_tradeoff_curves_refuse_alphas_outside_0_1():
    # Gaussian(sigma) is exactly (1/sigma)-GDP (Dong, Roth & Su 2022, Thm. 2.7); no noise is mu = inf, not an error.
    assert GdpAccountant().compose(Gaussian(1.0)).mu == 1.0
    assert GdpAccountant().compose(Gaussian(0.0)).mu == math.inf
    assert GdpAccountant().compose(PoissonSampled(1.0, Gaussian(1.0))).mu == 1.0
    assert GdpAccountant().compose(PoissonSampled(1.0, Gaussian(0.0))).mu == math.inf
    assert GdpAccountant().compose(GNMax(0.0, 10)).mu == math.inf
    with pytest.raises(UnsupportedEventError, match="add_remove"):
        GdpAccountant(neighbouring="replace_one").compose(PoissonSampled(0.1, Gaussian(1.0)))
    with pytest.raises(UnsupportedEventError, match="only Gaussian mechanisms"):
        GdpAccountant().compose(PoissonSampled(0.1, Laplace(1.0)))
    with pytest.raises(UnsupportedEventError, match=r"Prop\. B\.5"):
        GdpAccountant().compose(JLGaussian(1.0, 5))
    # The CLT mu (Bu et al. 2020): q sqrt(T (e^(1/sigma^2) - 1)); sigma = 1 exactly, no noise and too little noise.
    assert gdp_mu_poisson_clt(0.01, 1.0, 100) == pytest.approx(0.01 * math.sqrt(100 * math.expm1(1.0)), rel=1e-15)
    assert gdp_mu_poisson_clt(0.01, 0.0, 10) == math.inf
    assert gdp_mu_poisson_clt(0.01, 0.03, 10) == math.inf  # 1/sigma^2 = 1111: e^1111 overflows
    assert gdp_mu_poisson_clt(0.01, 0.04, 10) == pytest.approx(0.01 * math.sqrt(10 * math.expm1(625.0)), rel=1e-14)
    for bad in ([0.5, 1.5], [-0.5, 0.5], [0.5, math.nan]):
        with pytest.raises(InputError, match=r"alpha in \[0, 1\]"):
            gdp_tradeoff(1.0, bad)
        with pytest.raises(InputError, match=r"alpha in \[0, 1\]"):
            epsilon_delta_tradeoff(1.0, 1e-5, bad)


@pytest.mark.parametrize(("mu", "delta"), [(0.3, 1e-6), (1.0, 1e-5), (2.5, 1e-5), (6.0, 1e-3), (1e-3, 1e-4)])
def test_gdp_epsilon_lower_is_never_above_the_50_digit_root_and_gdp_epsilon_never_below(mu, delta):
    # The two directions of one conversion: gdp_epsilon (claims) at or above the exact epsilon(delta), and
    # gdp_epsilon_lower (audit lower bounds) at or below it, each within 1e-12 relative. gdp_epsilon alone returned
    # up to 1e-14 relative above the root for a lower bound (4.37717809568127 vs 4.37717809568122 at mu = 1).
    from dpaudit.accounting.gdp import gdp_epsilon_lower

    lo, hi = _mp_bisect(lambda e: delta - _mp_gdp_delta(mu, e), 0.0, 200.0)
    down, up = gdp_epsilon_lower(mu, delta), gdp_epsilon(mu, delta)
    assert down <= lo and up >= hi
    assert down >= float(lo) * (1 - 1e-12) and down < up
    # Degenerate points: as gdp_epsilon's, and a delta met at epsilon = 0 gives 0.
    assert gdp_epsilon_lower(0.0, 1e-5) == 0.0 and gdp_epsilon_lower(math.inf, 0.5) == math.inf
    assert gdp_epsilon_lower(1.0, 0.0) == math.inf and gdp_epsilon_lower(0.1, 0.6) == 0.0


def test_gdp_epsilon_lower_edges_and_refusals():
    # 0-GDP is perfectly private: epsilon 0 even at delta = 0 (not the delta = 0 -> inf of mu > 0), as gdp_epsilon.
    from dpaudit.accounting.gdp import _gdp_delta_lower, gdp_epsilon_lower

    assert gdp_epsilon_lower(0.0, 0.0) == 0.0 == gdp_epsilon(0.0, 0.0)
    # mu = inf (disjoint supports): delta(epsilon) = 1 at every finite epsilon, up and down (not NaN).
    assert gdp_delta(math.inf, 1.0) == 1.0 == _gdp_delta_lower(math.inf, 5.0)
    # mu > 1.3e154: the root mu^2/2 - ... is beyond float64; the largest float is below it (a lower bound), while
    # the claim direction is inf.
    assert gdp_epsilon_lower(1e160, 1e-5) == sys.float_info.max and gdp_epsilon(1e160, 1e-5) == math.inf
    # The documented guarantee, provable in floats: delta(epsilon) evaluated DOWN is still >= delta at the returned
    # epsilon (so the exact root is at least it). At these points brentq's root misses it by an ulp or two and the
    # step-down loop must run, also below epsilon = 1.
    for mu, delta in ((0.08, 0.002), (0.1, 1e-3), (0.16, 5e-4), (2.0, 1e-5)):
        assert _gdp_delta_lower(mu, gdp_epsilon_lower(mu, delta)) >= delta
    # The same domain as gdp_epsilon: mu >= 0, delta in [0, 1).
    for mu, delta in ((-0.1, 1e-5), (1.0, 1.0), (1.0, 1.5), (1.0, -1e-9)):
        with pytest.raises(InputError):
            gdp_epsilon_lower(mu, delta)
        with pytest.raises(InputError):
            gdp_epsilon(mu, delta)


# ---------------------------------------------------------------------------------------------
# Classic theorems rounded up, over the whole float range (benchmarks/accountant_sweep.py)
# ---------------------------------------------------------------------------------------------


def test_classic_theorems_round_up_and_survive_large_epsilon():
    """Rounding to nearest put about half of the results below the exact value (up to 3e-16 relative: a privacy
    claim rounded down), amplification at q = 1 changed epsilon (0.4771670089232277 -> ...766), and epsilon > 709.78
    raised OverflowError from math.expm1 (a traceback), a subnormal delta' gave NaN (ln(1/delta') = ln(inf))."""
    import mpmath

    rng = np.random.default_rng(7)
    for _ in range(300):
        eps = float(np.exp(rng.uniform(-20, 7.0)))
        q = float(np.exp(rng.uniform(-740, 0) if rng.random() < 0.3 else rng.uniform(-20, 0)))
        k, dp = int(np.exp(rng.uniform(0, 16))), float(np.exp(rng.uniform(-700, -1)))
        with mpmath.workdps(60):
            e_ = mpmath.mpf(eps)
            # Balle, Barthe & Gaboardi 2018, Table 1 (Poisson): ln(1 + q (e^eps - 1)).
            amp = mpmath.log1p(mpmath.mpf(q) * mpmath.expm1(e_))
            # Dwork & Roth 2014, Thm. 3.20: sqrt(2 k ln(1/delta')) eps + k eps (e^eps - 1).
            adv = mpmath.sqrt(2 * k * mpmath.log(1 / mpmath.mpf(dp))) * e_ + k * e_ * mpmath.expm1(e_)
        got = amplification_by_subsampling(eps, 0.0, q)[0]
        assert amp <= got <= eps and (amp < 1e-300 or got <= amp * (1 + 1e-11)), (eps, q)
        got = advanced_composition(eps, 0.0, k, dp)[0]
        assert (adv <= got <= adv * (1 + 1e-14)) if adv < 1.7e308 else got == math.inf, (eps, k, dp)
        parts = [float(x) for x in np.exp(rng.uniform(-30, 3, size=int(rng.integers(2, 12))))]
        deltas = [x * 1e-3 for x in parts]
        with mpmath.workdps(60):
            out = basic_composition(parts, deltas)
            assert out[0] >= mpmath.fsum([mpmath.mpf(x) for x in parts])
            assert out[1] >= min(1, mpmath.fsum([mpmath.mpf(x) for x in deltas]))
        with mpmath.workdps(60):  # delta' = k delta + delta' and q delta, exact then rounded up
            assert advanced_composition(eps, deltas[0], k, dp)[1] >= min(1, k * mpmath.mpf(deltas[0]) + mpmath.mpf(dp))
            assert amplification_by_subsampling(eps, deltas[0], q)[1] >= mpmath.mpf(q) * mpmath.mpf(deltas[0])
    # eps > 700 and a subnormal q: t = eps + ln q is small (3.21 at eps = 740) but carries the rounding of two terms
    # near 740; the slack 8 ulps·(eps + |ln q|) covers it, where 8 ulps of t, or of the result, left it below the exact
    # value.
    for eps, q in ((740.0, 1e-320), (701.0, 1e-320)):
        with mpmath.workdps(60):
            amp = mpmath.log1p(mpmath.mpf(q) * mpmath.expm1(mpmath.mpf(eps)))
        assert amp <= amplification_by_subsampling(eps, 0.0, q)[0] <= amp * (1 + 1e-11), (eps, q)
    assert amplification_by_subsampling(0.4771670089232277, 1e-5, 1.0) == (0.4771670089232277, 1e-5)
    # ln(1 + q (e^eps - 1)) <= eps for q <= 1: capped there, where the round-up (8 ulps) put q = 1 - 2^-53 above eps
    assert amplification_by_subsampling(0.5, 0.0, 1 - 2**-53)[0] == 0.5
    assert amplification_by_subsampling(1e-6, 0.0, 1e-320)[0] > 0.0  # exact 1e-326 is not 0
    # e^800 overflows float64; ln(1 + 1e-3 (e^800 - 1)) = 800 + ln(1e-3) + ~e^-793.
    assert amplification_by_subsampling(800.0, 0.0, 1e-3)[0] == pytest.approx(800.0 + math.log(1e-3), rel=1e-13)
    assert amplification_by_subsampling(710.0, 0.0, 0.5)[0] == pytest.approx(710.0 + math.log(0.5), rel=1e-13)
    assert advanced_composition(800.0, 0.0, 1, 1e-5)[0] == math.inf
    assert advanced_composition(0.0, 0.0, 1, 1e-320) == (0.0, pytest.approx(1e-320, rel=1e-3))
    # ln(1/1e-320) = 736.8: finite, not the overflow of 1/delta'.
    assert advanced_composition(1.0, 0.0, 1, 1e-320)[0] == pytest.approx(
        math.sqrt(2 * 320 * math.log(10)) + math.expm1(1.0)
    )


def test_epsilon_delta_tradeoff_beyond_e_700():
    """Dong, Roth & Su 2022, Prop. 2.5: f(alpha) = max{0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha)}. e^eps
    was capped at e^700, so at eps = 1000 and alpha = 1e-310 the curve read 1 - 1e-310 e^700 = 0.999999 where the exact
    value is e^-1000 (1 - 1e-310) ~ 0: a tradeoff curve far above the guarantee's (more privacy than claimed)."""
    assert epsilon_delta_tradeoff(1000.0, 0.0, 1e-310) == 0.0
    # e^710 1e-308 = 2.2: the first term is negative, the second e^-710 (1 - 1e-308).
    assert epsilon_delta_tradeoff(710.0, 0.0, 1e-308) == pytest.approx(math.exp(-710.0), rel=1e-9)
    # e^710 1e-309 = 0.22 is representable through the log: 1 - 0.22.
    assert epsilon_delta_tradeoff(710.0, 0.0, 1e-309) == pytest.approx(
        1.0 - math.exp(710.0 + math.log(1e-309)), rel=1e-12
    )
    assert epsilon_delta_tradeoff(1.0, 1e-5, 0.1) == 1.0 - 1e-5 - math.exp(1.0) * 0.1


def test_effective_noise_multiplier_of_composed_gaussians():
    # k Gaussians on the same data are one Gaussian with sigma_eff = (sum_i 1/sigma_i^2)^(-1/2) (McMahan et al. 2018,
    # Sec. 3); a noiseless or non-private part makes it 0; any other mechanism is returned as the offending leaf.
    from dpaudit.accounting.base import effective_gaussian_noise_multiplier as eff
    from dpaudit.events import Composed, Gaussian, Laplace, NonPrivate, NoOp, SelfComposed

    assert eff(Gaussian(2.0)) == 2.0
    assert eff(SelfComposed(Gaussian(2.0), 4)) == 1.0
    mixed = Composed((Gaussian(2.0), SelfComposed(Gaussian(4.0), 3), NoOp()))
    assert eff(mixed) == pytest.approx((1 / 4 + 3 / 16) ** -0.5, rel=1e-15)
    assert eff(Composed((Gaussian(2.0), NonPrivate()))) == 0.0
    assert eff(Composed((Gaussian(0.0), Gaussian(2.0)))) == 0.0
    assert eff(Composed((NoOp(),))) == math.inf  # nothing released
    lap = Laplace(1.0)
    assert eff(Composed((Gaussian(2.0), lap))) is lap
    # Through the GDP accountant: no subsampling (q = 1) is exactly (1/sigma_eff)-GDP.
    acc = GdpAccountant().compose(PoissonSampled(1.0, mixed))
    assert acc.mu == pytest.approx(math.sqrt(1 / 4 + 3 / 16), rel=1e-15)


def test_gdp_delta_lower_is_never_above_the_50_digit_value():
    # The mirror of gdp_delta's margin, for lower bounds: at these points the unrounded evaluation lands above the
    # exact delta(epsilon) (by ~1.4e-16 relative), so only the downward rounding keeps it below.
    from dpaudit.accounting.gdp import _gdp_delta_lower

    for mu, eps in ((0.25, 0.5), (0.5, 1.0), (1.0, 2.5), (2.0, 1.0)):
        exact = _mp_gdp_delta(mu, eps)
        assert _gdp_delta_lower(mu, eps) <= exact <= gdp_delta(mu, eps)
        assert _gdp_delta_lower(mu, eps) >= float(exact) * (1 - 1e-14)
    assert _gdp_delta_lower(1.0, 0.0) <= special.erf(1 / (2 * math.sqrt(2)))
