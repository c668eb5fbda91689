"""GDP / f-DP, zCDP, classic composition and the analytic Gaussian: closed forms and identities."""

from __future__ import annotations

import math

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
from dpaudit.errors import InputError, UnsupportedEventError
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
    assert amplification_by_subsampling(1e-12, 0.0, 1e-9)[0] == pytest.approx(1e-21, rel=1e-9)
