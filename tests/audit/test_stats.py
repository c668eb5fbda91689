"""Clopper–Pearson bounds and the two rate-to-privacy conversions, against independent oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpaudit.accounting.gdp import gdp_delta
from dpaudit.audit import clopper_pearson_lower, clopper_pearson_upper, gdp_mu_lower_bound, hypothesis_test_epsilon
from dpaudit.audit.one_run import one_run_pure_epsilon
from dpaudit.audit.stats import _cp_margin

CASES = [(0, 1), (0, 10), (3, 10), (10, 10), (1, 1000), (500, 1000), (999, 1000), (7, 100_000)]


@pytest.mark.parametrize(("k", "n"), CASES)
@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_clopper_pearson_matches_scipy_binomtest(k, n, alpha):
    # scipy's exact one-sided intervals: alternative='less' gives [0, upper], 'greater' gives [lower, 1].
    up = stats.binomtest(k, n, alternative="less").proportion_ci(1 - alpha, method="exact").high
    lo = stats.binomtest(k, n, alternative="greater").proportion_ci(1 - alpha, method="exact").low
    # rel 1e-6: scipy forms 1 − α first and is the less accurate of the two (see the mpmath test below).
    assert clopper_pearson_upper(k, n, alpha) == pytest.approx(up, rel=1e-6, abs=1e-15)
    assert clopper_pearson_lower(k, n, alpha) == pytest.approx(lo, rel=1e-6, abs=1e-15)


# (1, 1e7, 0.05): scipy's betainccinv is 5.0e5 ulps BELOW the exact upper limit there; (15, 30, 1e-12): its betaincinv
# 40 ulps ABOVE the exact lower limit (benchmarks/stats_rounding.py): both fail without stats._cp_margin.
@pytest.mark.parametrize(
    ("k", "n", "alpha"),
    [
        (7, 100_000, 0.01),
        (0, 50, 1e-9),
        (1, 1000, 1e-6),
        (30, 60, 1e-4),
        (3, 20, 0.2),
        (1, 10**7, 0.05),
        (15, 30, 1e-12),
    ],
)
def test_clopper_pearson_is_on_the_safe_side_of_the_binomial_tail_equation(k, n, alpha):
    # High-precision oracle: the exact limits solve P[Bin(n, upper) <= k] = α and P[Bin(n, lower) >= k] = α. The tails
    # decrease in p (upper) and increase in p (lower), so "upper >= exact" is P[Bin(n, upper) <= k] <= α, and
    # "lower <= exact" is P[Bin(n, lower) >= k] <= α; and the limits are no wider than twice stats._cp_margin.
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 50

    def cdf(p, kk):
        p = mp.mpf(p)
        return mp.fsum(mp.binomial(n, j) * p**j * (1 - p) ** (n - j) for j in range(kk + 1))

    r = 2 * _cp_margin(n)
    up = clopper_pearson_upper(k, n, alpha)
    assert cdf(up, k) <= alpha < cdf(up / (1 + r), k)
    if k > 0:
        lo = clopper_pearson_lower(k, n, alpha)
        assert 1 - cdf(lo, k - 1) <= alpha < 1 - cdf(lo / (1 - r), k - 1)
    if 2 * k > n:  # the one-run pure-DP ε = logit(lower), rounded down too
        q = mp.findroot(lambda p: 1 - cdf(p, k - 1) - alpha, lo / (1 - r / 2))
        assert one_run_pure_epsilon(n, k, alpha) <= mp.log(q / (1 - q))


@pytest.mark.parametrize(("k", "n"), [c for c in CASES if c[0] < c[1]])
def test_clopper_pearson_upper_is_beta_quantile(k, n):
    assert clopper_pearson_upper(k, n, 0.025) == pytest.approx(stats.beta.ppf(0.975, k + 1, n - k), rel=1e-9)


def test_clopper_pearson_vectorised_and_edge_values():
    k = np.array([0, 5, 10])
    out = clopper_pearson_upper(k, 10, 0.05)
    assert out.shape == (3,) and out[-1] == 1.0
    assert out[0] == pytest.approx(1 - 0.05 ** (1 / 10), rel=1e-12)  # k = 0: 1 − α^(1/n)
    assert clopper_pearson_lower(0, 10, 0.05) == 0.0


@pytest.mark.parametrize("n", [5, 40, 200])
@pytest.mark.parametrize("p", [0.01, 0.3, 0.5, 0.93])
def test_clopper_pearson_exact_coverage(n, p):
    # Exact coverage by enumeration: P_k~Bin(n,p)[upper(k) >= p] >= 1 − α (and the same for lower).
    k = np.arange(n + 1)
    pmf = stats.binom.pmf(k, n, p)
    assert pmf[clopper_pearson_upper(k, n, 0.05) >= p].sum() >= 0.95 - 1e-12
    assert pmf[clopper_pearson_lower(k, n, 0.05) <= p].sum() >= 0.95 - 1e-12


def test_hypothesis_test_epsilon_values():
    # ln((1 − δ − FPR)/FNR) and ln((1 − δ − FNR)/FPR), whichever is larger, clamped at 0.
    assert hypothesis_test_epsilon(0.01, 0.5, 0.0) == pytest.approx(math.log(0.5 / 0.01))
    assert hypothesis_test_epsilon(0.5, 0.01, 1e-3) == pytest.approx(math.log((1 - 1e-3 - 0.5) / 0.01))
    assert hypothesis_test_epsilon(0.5, 0.5, 0.0) == 0.0
    assert hypothesis_test_epsilon(0.7, 0.7, 0.0) == 0.0
    assert hypothesis_test_epsilon(1.0, 1.0, 0.0) == 0.0


def test_hypothesis_test_epsilon_is_tight_for_randomized_response():
    # ε-DP randomised response: FPR = FNR = 1/(1+e^ε) at the threshold between its two outputs.
    for eps in (0.1, 1.0, 3.0):
        r = 1 / (1 + math.exp(eps))
        assert hypothesis_test_epsilon(r, r, 0.0) == pytest.approx(eps, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(1e-6, 1.0),
    st.floats(1e-6, 1.0),
    st.floats(0.0, 1.0),
    st.floats(0.0, 0.5),
)
def test_hypothesis_test_epsilon_decreases_in_rates(fpr, fnr, shrink, delta):
    # Plugging in larger (upper-bound) rates can only lower the bound.
    e = hypothesis_test_epsilon(fpr, fnr, delta)
    assert e >= 0.0
    assert hypothesis_test_epsilon(fpr * shrink, fnr, delta) >= e - 1e-12 or fpr * shrink == 0.0
    assert hypothesis_test_epsilon(fpr, fnr * shrink, delta) >= e - 1e-12 or fnr * shrink == 0.0


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("t", [-1.0, 0.3, 1.7])
def test_gdp_mu_recovers_mu_from_exact_gaussian_rates(mu, t):
    # Scores N(μ,1) (member) vs N(0,1), threshold t: FPR = 1 − Φ(t), FNR = Φ(t − μ).
    fpr, fnr = stats.norm.sf(t), stats.norm.cdf(t - mu)
    assert gdp_mu_lower_bound(fpr, fnr) == pytest.approx(mu, rel=1e-9)
    assert gdp_mu_lower_bound(fnr, fpr) == pytest.approx(mu, rel=1e-9)  # symmetric


def test_gdp_mu_is_zero_without_signal():
    assert gdp_mu_lower_bound(0.5, 0.5) == 0.0
    assert gdp_mu_lower_bound(0.8, 0.6) == 0.0  # FPR + FNR > 1 means "worse than guessing"
    assert gdp_mu_lower_bound(1.0, 0.0) == 0.0


def test_hypothesis_bound_never_exceeds_gdp_truth():
    # For a μ-GDP curve every (FPR, FNR) pair respects (ε(δ), δ): the HT bound at exact rates ≤ ε(δ).
    from dpaudit.accounting.gdp import gdp_epsilon

    mu, delta = 1.5, 1e-3
    eps = gdp_epsilon(mu, delta)
    t = np.linspace(-6, 8, 2001)
    e = hypothesis_test_epsilon(stats.norm.sf(t), stats.norm.cdf(t - mu), delta)
    assert e.max() <= eps + 1e-9
    assert e.max() == pytest.approx(eps, rel=1e-2)  # and the LR test at the right threshold attains it
    assert gdp_delta(mu, e.max()) >= delta * (1 - 1e-6)


def test_hypothesis_test_epsilon_where_a_numerator_is_zero():
    # FPR = 1 − δ and FNR = 0: FPR + e^ε·FNR = 1 − δ holds for every ε and FNR + e^ε·FPR ≥ 1 − δ for ε ≥ 0
    # (Kairouz et al. 2015, Thm 2.1), so the bound is 0 — not ln(0/0) = NaN.
    for fpr, fnr, delta in [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.5, 0.0, 0.5), (0.0, 0.5, 0.5)]:
        assert hypothesis_test_epsilon(fpr, fnr, delta) == 0.0
    out = hypothesis_test_epsilon(np.array([1.0, 0.01]), np.array([0.0, 0.5]), 0.0)
    assert out[0] == 0.0 and out[1] == pytest.approx(math.log(0.5 / 0.01), rel=1e-12)


def test_gdp_mu_lower_bound_returns_a_float_for_scalars_and_an_array_for_arrays():
    mu = 1.3
    fpr, fnr = stats.norm.sf(0.4), stats.norm.cdf(0.4 - mu)
    got = gdp_mu_lower_bound(fpr, fnr)
    assert type(got) is float and got == pytest.approx(mu, rel=1e-9)
    arr = gdp_mu_lower_bound(np.array([fpr, 0.5]), np.array([fnr, 0.5]))
    assert arr.shape == (2,) and arr[1] == 0.0


def test_array_inputs_with_one_bad_element_are_refused_and_the_message_names_it():
    # One out-of-range entry among valid ones must raise (it would come back as NaN, or as a bound of 0/1),
    # and the message names the offending entry, not its neighbour.
    from dpaudit.errors import InputError

    with pytest.raises(InputError, match="alpha"):
        clopper_pearson_upper(3, 10, np.array([0.05, 1.5]))
    with pytest.raises(InputError, match="alpha"):
        clopper_pearson_lower(3, 10, -0.1)
    with pytest.raises(InputError, match="fpr_upper"):
        hypothesis_test_epsilon(np.array([0.1, -0.1]), 0.2, 1e-5)
    with pytest.raises(InputError, match="fnr_upper"):
        gdp_mu_lower_bound(0.1, np.array([0.2, -0.2]))
    with pytest.raises(InputError, match="k=12"):
        clopper_pearson_upper(np.array([0, 5, 12]), np.array([10, 5, 10]), 0.05)
    with pytest.raises(InputError, match="k=-1"):
        clopper_pearson_lower(np.array([3, -1]), 10, 0.05)
    assert clopper_pearson_upper(0, 10, 0.0) == 1.0 and clopper_pearson_lower(10, 10, 1.0) == 1.0  # α at its ends


# (FPR, FNR, δ): the first two are where the unmargined float formula overshot the exact bound most (7.1e4·ε ulps, the
# cancellation in 1 − δ − FNR; 1.25 units for μ, benchmarks/stats_rounding.py); they fail without the margins.
RATE_PAIRS = [
    (1.6783469330915804e-07, 0.9999886277172603, 1e-05),
    (0.5001220603779077, 9.210297956921517e-06, 0.0),
    (0.01, 0.5, 0.0),
    (1e-300, 0.3, 1e-3),
    (0.2689414213699951, 0.2689414213699951, 0.0),
    # Found by a 6000-pair search against 40-digit mpmath (mutation testing, sixteenth pass): the first is above the
    # exact ε (by 0.79 ulp) with ln d's share of the margin dropped, the second (s = δ + FPR, ln(1 − s) < 0) with
    # ln(1 − s) added instead of |ln(1 − s)|, the third above the exact μ (by 31 ulps) with |Φ⁻¹(FNR)|'s share dropped.
    (0.6096509405869129, 1.298620137053523e-272, 1e-05),
    (0.07736277217286247, 0.99999900015582, 1e-3),
    (0.7230837030683271, 1.4700522197901985e-274, 0.0),
]


@pytest.mark.parametrize(("fpr", "fnr", "delta"), RATE_PAIRS)
def test_epsilon_and_mu_lower_bounds_are_rounded_down(fpr, fnr, delta):
    # 50-digit mpmath: the exact ε of Kairouz et al. (the formula at these float rates) and μ = −Φ⁻¹(FPR) − Φ⁻¹(FNR).
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 50
    f, g, d = mp.mpf(fpr), mp.mpf(fnr), mp.mpf(delta)
    eps = max([mp.mpf(0), *(mp.log((1 - d - a) / b) for a, b in ((f, g), (g, f)) if 1 - d - a > 0)])
    # ... and no lower than twice stats._log_ratio_down's margin, 8u·(s/(1 − s) + |ln(1 − s)| + |ln d|), s = δ + rate.
    tol = max(
        16 * 2.0**-52 * ((d + a) / (1 - d - a) + abs(mp.log(1 - d - a)) + abs(mp.log(b))) for a, b in ((f, g), (g, f))
    )
    got = hypothesis_test_epsilon(fpr, fnr, delta)
    assert eps - tol <= got <= eps

    def z(p):
        return mp.findroot(lambda x: mp.ncdf(x) - p, float(stats.norm.ppf(float(p))))

    mu = max(mp.mpf(0), -z(f) - z(g))
    got = gdp_mu_lower_bound(fpr, fnr)
    assert mu - 16 * 2.0**-52 * (abs(z(f)) + abs(z(g)) + 1) <= got <= mu  # within twice the margin


@pytest.mark.parametrize(
    ("n", "alpha"),
    [(100, 1e-12), (1000, 0.05), (10**5, 1e-6), (1, 1e-12), (3, 1e-12), (1, 5e-5), (10**9, 1e-300)]
    + [(n, alpha) for n in (1, 2, 3, 10) for alpha in (0.5, 0.05, 1e-3)],
)
def test_the_closed_form_limits_at_k_0_and_k_n_are_safe_and_tight(n, alpha):
    """k = 0: upper = 1 − α^(1/n); k = n: lower = α^(1/n) (Clopper & Pearson 1934), against 50-digit mpmath. Their
    margins come from the libm functions' bounds (stats._CLOSED_FORM_ULPS), not from the per-trial measured one, so
    they are on the safe side by at most ~4 times that bound. To nearest the upper limit was 0.54–0.60 ulps below
    exact at (10, 0.5), (100, 1e-12), (1000, 0.05), (1e5, 1e-6), the lower one 4.6, 3.9, 3.7 ulps above at (1, 1e-12),
    (3, 1e-12), (1, 5e-5). Planted: the closed forms without their margins fail those seven (and 11 more); the
    per-trial margin (16 (n + 4) ulps) instead of the closed form fails the tightness. (At n < 4 scipy was correctly
    rounded and a margin 16·(n − 4) ulps once put the lower limit 48 ulps above α at n = 1: the small-n grid.) At
    v = r the pure one-run ε = logit(lower) must stay below the exact logit (one_run_pure_epsilon's docstring)."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(50):
        root = mp.power(mp.mpf(alpha), mp.mpf(1) / n)
        up, lo = clopper_pearson_upper(0, n, alpha), clopper_pearson_lower(n, n, alpha)
        assert 1 - root <= up <= (1 - root) * (1 + 40 * 2.0**-52)
        x = abs(math.log(alpha) / n)
        assert root * (1 - (4 * (4.5 * x + 4) + 1) * 2.0**-52) <= lo <= root
        if root > 0.5:  # the pure one-run ε = logit(lower) at v = r (every guess right) stays rounded down
            assert one_run_pure_epsilon(n, n, alpha) <= mp.log(root / (1 - root))


@pytest.mark.parametrize(("n", "alpha"), [(100, 1e-12), (1000, 0.05), (1, 1e-12), (3, 0.5), (10**9, 1e-300)])
def test_the_closed_forms_carry_their_whole_derived_margin(n, alpha):
    """The closed forms' margins are 4 times a bound derived from libm's documented errors (stats._CLOSED_FORM_ULPS),
    not from this machine's rounding (0.6 ulps here, which a 1-ulp margin covers), so the test above cannot see them
    shrink. Each limit is moved outward by 4 B, B its own rounding bound (8.5 ulps for 1 − α^(1/n), 4.5 |ln α|/n + 4
    for α^(1/n)): with the value computed within B of exact, it lies at least 3 B − (a few ulps) beyond exact.
    Planted: the margin 1, 4, 8.5 or 17 ulps instead of 34 (upper) and B instead of 4 B (lower) pass the test above
    and fail here."""
    mp = pytest.importorskip("mpmath")
    u = 2.0**-52
    with mp.workdps(50):
        root = mp.power(mp.mpf(alpha), mp.mpf(1) / n)
        b_lower = 4.5 * abs(math.log(alpha) / n) + 4.0
        assert clopper_pearson_upper(0, n, alpha) >= (1 - root) * (1 + 3 * 8.5 * u - u)
        assert clopper_pearson_lower(n, n, alpha) <= root * (1 - 3 * b_lower * u + u)


@pytest.mark.parametrize("alpha", [1.0, 0.05, 0.0])
def test_no_trials_bound_nothing_and_a_limit_near_1_is_capped(alpha):
    """n = 0 (allowed: 0 <= k <= n): no data, so the upper limit is 1 and the lower 0 at every α. The closed forms
    take n > 0 only: at n = 0 they divide ln α by 0 (α = 1: 0/0, an upper limit of NaN and a lower one of 1).
    And an upper limit from scipy's quantile near 1, widened, stays capped at 1 (k = 1 of 2 at α = 1e-300: the
    quantile 1 − 1e-150 rounds to 1). Planted: the closed forms' n > 0 dropped or >= 0; the cap 2."""
    assert clopper_pearson_upper(0, 0, alpha) == 1.0
    assert clopper_pearson_lower(0, 0, alpha) == 0.0
    assert clopper_pearson_upper(1, 2, 1e-300) == 1.0
