"""The design documents' (``/work/shared/seeds/``) concrete numbers and closed forms, each checked against
dpaudit AND an independent computation (mpmath at 50 digits, exact enumeration, or dp_accounting).

One test per seed number or formula that no other test pinned; the census in benchmarks/RESULTS.md
("Bug hunt: a census of the seeds' numbers") lists every number, where dpaudit implements it and which test
checks it. Seed files are cited by short name and line:

- ``yale``: lecture-dp-in-deep-learning-attacks-cloak-dpicl.txt
- ``nonconvex``: lecture-private-nonconvex-learning-dpsgd-pate.txt
- ``jl``: paper-dpsgd-jl-projections.txt
- ``cs208``: section-ml-with-dp-output-objective-perturbation.txt
- ``agd``: slides-dp-agd-zcdp-adaptive-budget.txt

Tolerances: where the seed prints a rounded number, half a unit of its last printed digit; where dpaudit
rounds a privacy claim up on purpose, one-sided (never below the exact value) plus the documented margin.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from dpaudit.accounting import (
    PldAccountant,
    ZcdpAccountant,
    advanced_composition,
    amplification_by_subsampling,
    analytic_gaussian_delta,
    dpsgd_event,
    epsilon_for,
)
from dpaudit.accounting.jl import z_r_cdf, z_r_survival
from dpaudit.accounting.zcdp import zcdp_rho_gaussian, zcdp_rho_pure
from dpaudit.events import Laplace, RandomizedResponse
from dpaudit.training.convex import ConvexLearner, output_sensitivity
from dpaudit.training.dpagd import DPAGDConfig

mpmath.mp.dps = 50


# ---------------------------------------------------------------------------------------------
# yale L86-108: the coin-flip survey (randomized response)
# ---------------------------------------------------------------------------------------------


def test_yale_coin_flip_survey_is_ln3_dp_and_its_debiasing():
    # Independent: enumerate the protocol exactly. Heads (1/2): the true answer; tails: a fair random answer.
    def p_yes(truth: bool) -> Fraction:
        return Fraction(1, 2) * (1 if truth else 0) + Fraction(1, 2) * Fraction(1, 2)

    # The seed's p_T' = p_T/2 + 1/4 and its inverse p_T = 2 p_T' - 1/2, for every p_T in a grid.
    for k in range(11):
        p_true = Fraction(k, 10)
        p_noisy = p_true * p_yes(True) + (1 - p_true) * p_yes(False)
        assert p_noisy == p_true / 2 + Fraction(1, 4)
        assert 2 * p_noisy - Fraction(1, 2) == p_true
    # Worst likelihood ratio over both outputs: (3/4)/(1/4) = 3, so the survey is exactly ln 3-DP.
    ratio = max(p_yes(True) / p_yes(False), (1 - p_yes(False)) / (1 - p_yes(True)))
    assert ratio == 3
    # dpaudit: the same protocol is RandomizedResponse(noise_parameter=1/2, num_buckets=2) (replace-one).
    # zCDP of a pure eps-DP leaf is eps^2/2 (Bun & Steinke 2016, Prop. 1.4): eps must come out as ln 3.
    rho = ZcdpAccountant(neighbouring="replace_one").compose(RandomizedResponse(0.5, 2)).rho
    assert math.sqrt(2 * rho) == pytest.approx(math.log(3), rel=1e-15)
    # PLD: an upper bound; at delta -> 0 it must not be below ln 3, and its grid puts it at most 1e-4 above.
    eps = PldAccountant(neighbouring="replace_one").compose(RandomizedResponse(0.5, 2)).epsilon(1e-12)
    assert math.log(3) <= eps <= math.log(3) + 1e-4


# ---------------------------------------------------------------------------------------------
# yale L235-243: "Laplacian mechanism offering 0.5-differential privacy for a function with sensitivity (b) 1"
# ---------------------------------------------------------------------------------------------


def test_yale_laplace_of_scale_two_is_half_dp():
    # The figure's curve has b = 2 (Lap(0, Delta/eps) with Delta = 1, eps = 0.5). Independent: the density
    # ratio of Lap(0, b) and Lap(1, b) is at most e^(1/b) (triangle inequality), attained for x <= 0.
    b = mpmath.mpf(2)

    def density(x, mu):
        return mpmath.exp(-abs(x - mu) / b) / (2 * b)

    worst = max(density(x, 0) / density(x, 1) for x in (mpmath.mpf(-5), mpmath.mpf(-0.3), mpmath.mpf(0)))
    assert float(mpmath.log(worst)) == pytest.approx(0.5, rel=1e-40)
    # dpaudit: Laplace(noise_multiplier=2) (scale 2 x the L1 bound, add/remove): delta(0.5) = 0 exactly, and
    # eps at delta = 1e-12 at most 0.5 but not below the exact profile 0.5 + 2 log(1 - delta) (Balle et al. 2018:
    # delta(eps) = 1 - exp((eps - eps0)/2) below eps0).
    acc = PldAccountant().compose(Laplace(2.0))
    assert acc.delta(0.5) == 0.0
    assert 0.5 + 2 * math.log1p(-1e-12) <= acc.epsilon(1e-12) <= 0.5
    assert zcdp_rho_pure(0.5) == 0.125  # agd L137 (Lemma 3.7): eps-DP is eps^2/2-zCDP


# ---------------------------------------------------------------------------------------------
# nonconvex L69-87 (Lemma 3) and yale L500 (amplification by subsampling)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0])
@pytest.mark.parametrize("q", [1e-3, 0.01, 0.1, 0.5, 1.0])
def test_amplification_by_subsampling_meets_both_lectures_bounds(eps, q):
    got, d = amplification_by_subsampling(eps, 1e-6, q)
    exact = mpmath.log(1 + q * (mpmath.e**eps - 1))  # yale L500: ln(1 + (m/n)(e^eps - 1))
    # dpaudit rounds up by at most 8 ulps (classic._ULPS) plus one nextafter; never below the exact value.
    assert mpmath.mpf(got) >= exact
    assert got <= float(exact) * (1 + 9 * 2.0**-52) + math.ulp(float(exact))
    # yale L500: <= 2 (m/n) eps when eps <= 1; nonconvex L81: for eps = 1, 1 + q(e - 1) <= e^(2q).
    assert got <= 2 * q * eps
    # nonconvex L85: the other direction, p_x(S) >= (1 - q(1 - e^-eps)) p_x'(S) >= e^(-q eps) p_x'(S); dpaudit's
    # single eps' must cover its log too (add/remove: both directions in one number).
    lower_direction = -mpmath.log(1 - q * (1 - mpmath.e ** (-eps)))
    assert mpmath.mpf(got) >= lower_direction * (1 - mpmath.mpf(10) ** -40)  # equal at q = 1 (50-digit rounding)
    assert lower_direction <= q * eps * (1 + mpmath.mpf(10) ** -40)  # the seed's last inequality (equal at q = 1)
    assert d == pytest.approx(q * 1e-6, rel=1e-15)  # yale L500: delta' = (m/n) delta


# ---------------------------------------------------------------------------------------------
# yale L521-565: the lecture's DP-SGD noise (Bassily, Smith & Thakurta 2014) and its proof sketch
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, eps, delta", [(1000, 1.0, 1e-5), (10_000, 0.5, 1e-6), (500, 2.0, 1e-4)])
def test_yale_dpsgd_sigma_chain_gives_eps_delta(n, eps, delta):
    """sigma^2 = 16^2 L^2 T ln(2/delta) ln(2.5T/(delta n)) / (n^2 eps^2) with T = n^2 steps of batch 1: the
    Gaussian mechanism (Delta_2 = 2L) makes a step (n eps/(4 sqrt(2T ln(2/delta))), delta n/(2T))-DP, sampling
    one of n records (eps/(2 sqrt(2T ln(2/delta))), delta/(2T))-DP, and advanced composition with delta' =
    delta/2 gives (eps, delta). Each link recomputed with mpmath and with dpaudit's classic theorems."""
    lip, T = 1.0, n * n
    mp = mpmath.mpf
    L = mpmath.log(2 / mp(delta))
    sigma2 = 16**2 * lip**2 * T * L * mpmath.log(mp(2.5) * T / (mp(delta) * n)) / (n**2 * mp(eps) ** 2)
    eps0, delta0 = n * mp(eps) / (4 * mpmath.sqrt(2 * T * L)), mp(delta) * n / (2 * T)
    # Link 1 (yale L257, Gaussian mechanism): sigma = Delta sqrt(2 ln(1.25/delta0))/eps0 is the seed's sigma.
    assert sigma2 == pytest.approx(float((2 * lip) ** 2 * 2 * mpmath.log(mp(1.25) / delta0) / eps0**2), rel=1e-14)
    assert eps0 < 1  # the classical Gaussian theorem's condition
    # and the classical calibration is valid by dpaudit's exact (analytic) Gaussian delta:
    assert analytic_gaussian_delta(math.sqrt(float(sigma2)), float(eps0), sensitivity=2 * lip) <= float(delta0)
    # Link 2 (yale L500 with m/n = 1/n): at most the seed's (eps/(2 sqrt(2T ln(2/delta))), delta/(2T)).
    eps1, delta1 = amplification_by_subsampling(float(eps0), float(delta0), 1.0 / n)
    assert eps1 <= float(mp(eps) / (2 * mpmath.sqrt(2 * T * L)))
    assert eps1 >= float(mpmath.log(1 + (mpmath.e**eps0 - 1) / n))
    assert delta1 == pytest.approx(delta / (2 * T), rel=1e-12)
    # Link 3 (nonconvex L63, advanced composition over T steps, delta' = delta/2): (eps, delta) at the end.
    eps_total, delta_total = advanced_composition(eps1, delta1, T, delta / 2)
    exact_total = mpmath.sqrt(2 * T * mpmath.log(2 / mp(delta))) * eps1 + T * eps1 * mpmath.expm1(eps1)
    assert mpmath.mpf(eps_total) >= exact_total
    assert eps_total <= eps
    assert delta_total <= delta * (1 + 1e-12)


# ---------------------------------------------------------------------------------------------
# yale L467 and nonconvex L6: output perturbation of a 1-Lipschitz, strongly convex ERM
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, eps, delta", [(100, 0.5, 1e-5), (1000, 0.9, 1e-6)])
def test_dp_erm_gaussian_output_perturbation_meets_the_lectures_variance(n, eps, delta):
    # yale L467: Y ~ N(0, 8 ln(1.25/delta)/(n^2 eps^2)), i.e. Delta_2 = 2/n (nonconvex L6: "Delta L = 2/N"; both
    # with regulariser strength lambda = 1) in the Gaussian mechanism's sigma^2 = 2 Delta^2 ln(1.25/delta)/eps^2.
    seed_sigma = math.sqrt(8 * math.log(1.25 / delta) / (n**2 * eps**2))
    assert seed_sigma == pytest.approx(math.sqrt(2 * (2 / n) ** 2 * math.log(1.25 / delta)) / eps, rel=1e-15)
    # dpaudit: sensitivity 2/(n lambda) plus the solver's slack, never below 2/n.
    sens = output_sensitivity(n, 1.0)
    assert 2 / n <= sens <= 2 / n + 4.01e-7
    # The user-visible number: the learner's claim (it calibrates Gaussian(sigma / (Delta/2)) under replace-one).
    sigma = ConvexLearner("outpert-gaussian", 1.0, eps, delta).claim(n, 5, 1)["noise_std"]
    # dpaudit calibrates with the exact Gaussian profile, so it may add less noise than the classical formula
    # (valid for eps < 1), but must meet (eps, delta) at its own sensitivity. Independent check with mpmath of the
    # analytic Gaussian (Balle & Wang 2018, Thm 8): delta = Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D).
    assert sigma <= seed_sigma * sens / (2 / n) * (1 + 1e-12)  # the seed's formula at dpaudit's sensitivity
    D, s = mpmath.mpf(sens), mpmath.mpf(sigma)
    exact_delta = mpmath.ncdf(D / (2 * s) - eps * s / D) - mpmath.e**eps * mpmath.ncdf(-D / (2 * s) - eps * s / D)
    assert exact_delta <= delta


# ---------------------------------------------------------------------------------------------
# agd L94, L127, L137, L177, L336-353, L426, L523: DP-AGD's constants
# ---------------------------------------------------------------------------------------------


def test_dpagd_defaults_are_the_slides_and_authors_constants():
    cfg = DPAGDConfig(epsilon=1.0, delta=1e-8)
    assert cfg.splits == 60  # agd L336 (splits=60)
    assert cfg.gamma == 0.1  # agd L336 (gamma=0.1), L426 (rho_ng *= 1 + gamma)
    assert cfg.candidates == 20  # agd L177 (m = 20), L353 (n_candidate = 20)
    assert cfg.update_every == 10  # agd L177 (r = 10), L452 (t % 10)
    assert cfg.eta == 0.1  # agd L177 (eta = 0.1), L453 (1.1 * max)
    assert cfg.alpha_max == 2.0  # agd L177 (a_max = 2), L352 (max_step_size = 2.0)
    # agd L127 (Lemma 3.6): the Gaussian mechanism is Delta^2/(2 sigma^2)-zCDP.
    assert zcdp_rho_gaussian(3.0, sensitivity=1.5) == 1.5**2 / (2 * 3.0**2)


# ---------------------------------------------------------------------------------------------
# jl L522-529 (Prop. B.4): the density of Z_r = 1/sqrt(chi2_r / r)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("r", [1, 2, 3, 4, 5, 8])
def test_jl_z_r_normalising_constant_and_law(r):
    """The seed prints C_r = (r/2)^(r/2) Gamma(r/2)/2; the integral is (2/r)^(r/2) Gamma(r/2)/2 (substitute
    u = r/(2a^2)): a typo in the seed, equal only at r = 2. dpaudit's Z_r law (chi2 CDF, jl.z_r_survival) is
    checked against the corrected density, integrated with mpmath."""
    mp = mpmath.mpf
    rr = mp(r)

    def unnormalised(a):
        return a ** (-(rr + 1)) * mpmath.exp(-rr / (2 * a * a))

    integral = mpmath.quad(unnormalised, [0, 1, mpmath.inf])
    corrected = (2 / rr) ** (rr / 2) * mpmath.gamma(rr / 2) / 2
    printed = (rr / 2) ** (rr / 2) * mpmath.gamma(rr / 2) / 2
    assert mpmath.almosteq(integral, corrected, rel_eps=mp(10) ** -30)
    assert mpmath.almosteq(integral, printed, rel_eps=mp(10) ** -30) == (r == 2)
    # The seed's Gamma(r/2) for odd r: sqrt(pi) (r-1)! / (2^(r-1) ((r-1)/2)!) is right.
    if r % 2:
        odd = mpmath.sqrt(mpmath.pi) * mpmath.factorial(r - 1) / (2 ** (r - 1) * mpmath.factorial((r - 1) // 2))
        assert mpmath.almosteq(odd, mpmath.gamma(rr / 2), rel_eps=mp(10) ** -40)
    for z in (0.5, 1.0, 2.0, 10.0):
        tail = mpmath.quad(unnormalised, [z, 10 * z, mpmath.inf]) / corrected
        assert float(z_r_survival(r, np.array([z]))[0]) == pytest.approx(float(tail), rel=1e-12)
        assert float(z_r_cdf(r, np.array([z]))[0]) == pytest.approx(float(1 - tail), rel=1e-12, abs=1e-300)


# ---------------------------------------------------------------------------------------------
# jl L143-145 (MNIST: B = 256, sigma = 1.3, E = 15, delta = 1e-5): "DP-SGD-Outer ... achieves an eps of less than 1"
# ---------------------------------------------------------------------------------------------


def test_jl_paper_mnist_dpsgd_epsilon_is_below_one():
    import dp_accounting

    q, steps, sigma, delta = 256 / 60_000, math.ceil(15 * 60_000 / 256), 1.3, 1e-5  # jl L138: E = BT/N
    ours = epsilon_for(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps), delta, "pld")
    # Independent: Google's dp_accounting PLD accountant (its own discretisation, pessimistic).
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    theirs = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(delta)
    assert ours < 1 and theirs < 1  # 0.86459 both (dp_accounting at 1e-3: 0.8694; RDP: 0.9546)
    assert ours == pytest.approx(theirs, rel=1e-3)


# ---------------------------------------------------------------------------------------------
# jl L145, L165, L185: DP-SGD-JL(1)'s reported eps (2.4 on MNIST, 5.55 on CIFAR10, 21 on IMDB, delta = 1e-5)
# ---------------------------------------------------------------------------------------------


def _one_jl1_step_delta_lower_bound(sigma: float, q: float, eps: float, z0: float) -> mpmath.mpf:
    """An independent lower bound on delta(eps) of ONE Poisson-subsampled DP-SGD-JL step with r = 1.

    Z_1 = 1/|N(0,1)| is public and has the same law on both sides, so delta = E_Z[delta_{q, Z/sigma}(eps)], and
    delta_{q, mu} increases in mu (seed Cor. B.1 and Prop. 4.5), so delta >= P(Z_1 > z0) delta_{q, z0/sigma}(eps),
    with P(Z_1 > z0) = P(chi2_1 < 1/z0^2) = erf(1/(sqrt(2) z0)) and, for the remove direction P = (1-q) N(0,1) +
    q N(mu,1) against N(0,1), the likelihood ratio exceeds e^eps exactly above
    x* = (log((e^eps - 1 + q)/q) + mu^2/2)/mu, so delta_{q,mu} = (1-q) Phi(-x*) + q Phi(mu - x*) - e^eps Phi(-x*).
    Composition with more steps can only raise delta, so this bounds every training length."""
    mu = mpmath.mpf(z0) / sigma
    x_star = (mpmath.log((mpmath.e**eps - 1 + q) / q) + mu**2 / 2) / mu
    hockey = (1 - q) * mpmath.ncdf(-x_star) + q * mpmath.ncdf(mu - x_star) - mpmath.e**eps * mpmath.ncdf(-x_star)
    return mpmath.erf(1 / (mpmath.sqrt(2) * z0)) * hockey


@pytest.mark.parametrize(
    "sigma, n, eps_paper, z0",
    [(1.3, 60_000, 2.4, 7.0), (0.9, 50_000, 5.55, 5.0), (0.6, 25_000, 21.0, 5.0)],  # jl L143/L160/L178, B = 256
)
def test_jl_papers_jl1_epsilons_are_refuted_by_one_step(sigma, n, eps_paper, z0):
    from dpaudit.accounting.jl import epsilon_lower_bound

    q, delta = 256 / n, 1e-5
    # Independent: already one step of JL(1) has delta(eps_paper) 40-135x above the paper's delta = 1e-5.
    assert _one_jl1_step_delta_lower_bound(sigma, q, eps_paper, z0) > 40 * delta
    # dpaudit's own formal lower bound (one step) is far above the paper's eps (MNIST 3.3e4, CIFAR 1.0e5, IMDB
    # 9.2e5), and its certified epsilon for any number of steps is at least that (tests/accounting/test_jl_*).
    assert epsilon_lower_bound(sigma, 1, q, 1, delta) > 1000 * eps_paper
