"""PLD accountant: exact references (analytic Gaussian, closed-form pure-DP curves), pessimism, JL."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import integrate, special, stats

from dpaudit.accounting import (
    PldAccountant,
    RdpAccountant,
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    dpsgd_event,
)
from dpaudit.accounting.pld_pairs import DiscretePLD
from dpaudit.errors import UnsupportedEventError
from dpaudit.events import (
    Composed,
    EpsilonDelta,
    FixedSizeSampled,
    Gaussian,
    GNMax,
    JLGaussian,
    Laplace,
    LNMax,
    PoissonSampled,
    RandomizedResponse,
    SelfComposed,
)


@pytest.mark.parametrize("sigma", [0.3, 0.8, 1.0, 2.0, 10.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
def test_single_gaussian_matches_analytic_and_upper_bounds_it(sigma, delta):
    exact = analytic_gaussian_epsilon(sigma, delta)
    pld = PldAccountant().compose(Gaussian(sigma)).epsilon(delta)
    assert pld == pytest.approx(exact, rel=1e-3)
    assert pld >= exact * (1 - 1e-9)  # pessimistic (up to float rounding of the reference)
    assert RdpAccountant().compose(Gaussian(sigma)).epsilon(delta) >= exact


def test_composed_gaussians_are_one_gaussian():
    # T Gaussians with sigma compose to one Gaussian with sigma / sqrt(T) (Dong, Roth & Su 2022, Cor. 3.3).
    pld = PldAccountant().compose(Gaussian(3.0), 9).epsilon(1e-6)
    assert pld == pytest.approx(analytic_gaussian_epsilon(1.0, 1e-6), rel=2e-3)
    assert pld >= analytic_gaussian_epsilon(1.0, 1e-6) * (1 - 1e-9)


@pytest.mark.parametrize("eps", [0.0, 0.8, 1.0])
def test_delta_curve_of_gaussian(eps):
    d = PldAccountant().compose(Gaussian(1.0)).delta(eps)
    exact = analytic_gaussian_delta(1.0, eps)
    # At grid points connect-the-dots is exact, so only float rounding (1e-12) separates the two.
    assert exact * (1 - 1e-12) <= d <= exact * (1 + 1e-3)


def test_laplace_delta_curve_closed_form():
    # P = Lap(1, b), Q = Lap(0, b): delta(eps) = 1 - exp((eps - eps0)/2) for 0 <= eps <= eps0
    # (Koskela et al. 2020), and 0 above eps0 = 1/b.
    acc = PldAccountant().compose(Laplace(0.5))
    for eps in (0.0, 0.5, 1.0, 1.9):
        assert acc.delta(eps) == pytest.approx(-math.expm1((eps - 2.0) / 2), rel=1e-6, abs=1e-12)
    assert acc.delta(2.0 + 1e-3) == 0.0
    assert acc.epsilon(1e-12) == pytest.approx(2.0, abs=1e-4)


def test_epsilon_delta_event_is_exact():
    acc = PldAccountant().compose(EpsilonDelta(1.0, 1e-6))
    assert acc.epsilon(1e-6) == pytest.approx(1.0, abs=1e-4)
    assert acc.epsilon(1e-7) == math.inf
    assert acc.delta(1.0) == pytest.approx(1e-6, rel=1e-9)


def test_randomized_response_closed_form():
    p, k = 0.4, 4
    eps0 = math.log(k / p - k + 1)
    acc = PldAccountant(neighbouring="replace_one").compose(RandomizedResponse(p, k))
    assert acc.epsilon(1e-12) == pytest.approx(eps0, abs=1e-4)
    # delta(0) = total variation = 1 - p (first two outcomes move 1 - p of mass).
    assert acc.delta(0.0) == pytest.approx(1 - p, rel=1e-9)


def test_aggregation_leaves_are_their_mechanisms():
    # No test composed GNMax or LNMax into the pld accountant (coverage). GNMax: one changed vote moves the
    # histogram by sqrt(2) in L2, the Gaussian of sigma / sqrt(2) (Papernot et al. 2018, Prop. 8).
    gnmax = PldAccountant().compose(GNMax(3.0, 10), 5).epsilon(1e-5)
    assert gnmax == PldAccountant().compose(Gaussian(3.0 / math.sqrt(2.0)), 5).epsilon(1e-5)
    # LNMax with Laplace scale b is (2/b, 0)-DP (Papernot et al. 2017), here b = 4: losses +-1/2, P's mass at
    # +1/2 is p = e^(1/2) / (1 + e^(1/2)), delta(eps) = p (1 - e^(eps - 1/2)) below 1/2.
    p = math.exp(0.5) / (1 + math.exp(0.5))
    assert PldAccountant().compose(LNMax(4.0, 10)).epsilon(1e-5) == pytest.approx(0.5 + math.log1p(-1e-5 / p), abs=1e-4)
    with pytest.raises(UnsupportedEventError, match="replace_one"):
        PldAccountant().compose(RandomizedResponse(0.5, 4))


def test_subsampled_gaussian_delta_by_integration():
    # Remove direction: delta(eps) = E_P[(1 - e^(eps - L))_+], P = (1-q)N(0,1) + q N(mu,1).
    q, sigma, eps = 0.05, 0.8, 0.30005  # off the grid
    mu = 1 / sigma

    def ratio(x):
        return 1 - q + q * math.exp(min(mu * x - mu * mu / 2, 700.0))

    def integrand(x):
        p_density = (1 - q) * stats.norm.pdf(x) + q * stats.norm.pdf(x - mu)
        return p_density * max(0.0, 1 - math.exp(eps) / ratio(x))

    x0 = (math.log((math.exp(eps) - 1 + q) / q) + mu * mu / 2) / mu
    remove = integrate.quad(integrand, x0, np.inf, epsabs=1e-14, epsrel=1e-12)[0]

    def integrand_add(x):
        return stats.norm.pdf(x) * max(0.0, 1 - math.exp(eps) * ratio(x))

    add = integrate.quad(integrand_add, -np.inf, 8, epsabs=1e-14, epsrel=1e-12)[0]
    exact = max(remove, add)
    ours = PldAccountant().compose(PoissonSampled(q, Gaussian(sigma))).delta(eps)
    assert exact * (1 - 1e-12) <= ours <= exact * (1 + 1e-3)


@pytest.mark.parametrize("sigma", [1e20, 1e300])
def test_subsampled_gaussian_with_vast_noise_is_nearly_free_not_infinite(sigma):
    # mu = 1/sigma below ~1e-16: the loss range's upper end log(1 - q + q e^(mu z + mu^2/2)) rounded to exactly 0,
    # the mass above it (half of P) was put at an infinite loss, and `account dpsgd --accountant pld
    # --noise-multiplier 1e20` printed epsilon = inf (rdp and the unsubsampled Gaussian said 0).
    acc = PldAccountant().compose(PoissonSampled(0.5, Gaussian(sigma)), 10)
    # Each step's losses are rounded up by at most one grid interval: 10 steps, at most 10 intervals.
    assert 0.0 <= acc.epsilon(1e-5) <= 10 * acc.interval


def test_round_trip_epsilon_delta():
    acc = PldAccountant(value_discretization_interval=1e-3).compose(
        SelfComposed(PoissonSampled(0.02, Gaussian(1.0)), 300)
    )
    for delta in (1e-3, 1e-6, 1e-9):
        eps = acc.epsilon(delta)
        assert acc.delta(eps) <= delta
        assert acc.delta(eps * 0.99) > delta  # and it is the smallest such epsilon (to 1%)


def test_self_composition_identity_is_exact():
    e = PoissonSampled(0.01, Gaussian(1.2))
    a = PldAccountant().compose(e, 30).compose(e, 70)
    b = PldAccountant().compose(SelfComposed(e, 100))
    assert a.epsilon(1e-6) == b.epsilon(1e-6)
    assert a.ledger == [(e, 30), (e, 70)]


def test_composition_order_independent():
    g, lap = PoissonSampled(0.05, Gaussian(1.0)), Laplace(5.0)
    a = PldAccountant().compose(Composed((g, lap, g))).epsilon(1e-6)
    b = PldAccountant().compose(Composed((lap, g, g))).epsilon(1e-6)
    c = PldAccountant().compose(lap).compose(g, 2).epsilon(1e-6)
    assert a == pytest.approx(b, rel=1e-9)
    assert a == pytest.approx(c, rel=1e-9)


def test_pld_below_rdp_on_dpsgd():
    for q, sigma, steps in [(0.01, 1.0, 1000), (0.004, 1.1, 2000), (0.1, 2.0, 200)]:
        e = SelfComposed(PoissonSampled(q, Gaussian(sigma)), steps)
        pld = PldAccountant(value_discretization_interval=1e-3).compose(e).epsilon(1e-5)
        rdp = RdpAccountant().compose(e).epsilon(1e-5)
        assert pld <= rdp


def test_finer_grid_only_tightens():
    e = SelfComposed(PoissonSampled(0.01, Gaussian(1.0)), 500)
    coarse = PldAccountant(value_discretization_interval=1e-3).compose(e).epsilon(1e-5)
    fine = PldAccountant(value_discretization_interval=1e-4).compose(e).epsilon(1e-5)
    assert fine <= coarse * (1 + 1e-9)
    assert coarse == pytest.approx(fine, rel=5e-3)


def test_discrete_pld_queries():
    # Two atoms: loss 1 (mass 0.6) and -1 (mass 0.3), +inf (mass 0.1).
    pld = DiscretePLD(0.5, -2, np.array([0.3, 0.0, 0.0, 0.0, 0.6]), 0.1)
    assert pld.delta(0.0) == pytest.approx(0.1 + 0.6 * (1 - math.exp(-1)))
    assert pld.delta(1.0) == pytest.approx(0.1)
    assert pld.epsilon(0.1) == pytest.approx(1.0)
    assert pld.epsilon(0.05) == math.inf
    eps = pld.epsilon(0.3)
    # Between the atoms: 0.1 + 0.6 (1 - e^(eps - 1)) = 0.3  =>  eps = 1 + log(0.4 / 0.6).
    assert eps == pytest.approx(1 + math.log(0.4 / 0.6), rel=1e-9)
    assert pld.delta(eps) <= 0.3


def test_unsupported_and_relations():
    with pytest.raises(UnsupportedEventError, match="use rdp"):
        PldAccountant(neighbouring="replace_one").compose(FixedSizeSampled(8, 100, Gaussian(1.0)))
    with pytest.raises(UnsupportedEventError, match="add_remove"):
        PldAccountant(neighbouring="replace_one").compose(PoissonSampled(0.1, Gaussian(1.0)))
    with pytest.raises(UnsupportedEventError, match="Laplace"):
        PldAccountant().compose(PoissonSampled(0.1, Laplace(1.0)))
    # Replace-one doubles the sensitivity of an unsampled Gaussian.
    rep = PldAccountant(neighbouring="replace_one").compose(Gaussian(2.0)).epsilon(1e-5)
    assert rep == pytest.approx(PldAccountant().compose(Gaussian(1.0)).epsilon(1e-5), rel=1e-9)


# ---------------------------------------------------------------------------------------------
# DP-SGD-JL (seed paper, Lemma 4.3 / Thm. 4.1)
# ---------------------------------------------------------------------------------------------


def _jl_delta_oracle(sigma: float, r: int, eps: float) -> float:
    """delta_Z(eps) = E_z[delta_(z/sigma)(eps)] (seed paper, proof of Lemma 4.2), by quadrature over Z_r."""

    def integrand(u):
        z = math.sqrt(r / stats.chi2.isf(u, r))  # P(Z_r <= z) = u
        mu = z / sigma
        return special.ndtr(-eps / mu + mu / 2) - math.exp(eps) * special.ndtr(-eps / mu - mu / 2)

    return integrate.quad(integrand, 0, 1, limit=400, epsabs=1e-13, epsrel=1e-10)[0]


@pytest.mark.parametrize(("sigma", "r", "eps"), [(1.0, 30, 1.0), (2.0, 5, 0.5), (1.3, 100, 2.0)])
def test_jl_single_step_against_quadrature(sigma, r, eps):
    exact = _jl_delta_oracle(sigma, r, eps)
    acc = PldAccountant(value_discretization_interval=2e-3, jl_bins=200)
    ours = acc.compose(JLGaussian(sigma, r)).delta(eps)
    assert ours >= exact * (1 - 1e-9)  # the quantile binning of Z_r is pessimistic ...
    assert ours <= exact * 1.02  # ... and tight to the bin width


def test_jl_converges_to_dpsgd_and_heavy_tail_for_small_r():
    q, sigma, steps, delta = 0.01, 1.3, 300, 1e-5
    plain = (
        PldAccountant(value_discretization_interval=1e-3)
        .compose(SelfComposed(PoissonSampled(q, Gaussian(sigma)), steps))
        .epsilon(delta)
    )
    big_r = (
        PldAccountant(value_discretization_interval=1e-3)
        .compose(SelfComposed(PoissonSampled(q, JLGaussian(sigma, 20000)), steps))
        .epsilon(delta)
    )
    assert big_r == pytest.approx(plain, rel=5e-3)
    small_r = (
        PldAccountant(value_discretization_interval=1e-3)
        .compose(SelfComposed(PoissonSampled(q, JLGaussian(sigma, 30)), steps))
        .epsilon(delta)
    )
    assert small_r > plain


def test_jl_zero_noise_is_not_private():
    acc = PldAccountant().compose(SelfComposed(PoissonSampled(0.01, JLGaussian(0.0, 5)), 10))
    assert acc.epsilon(1e-5) == math.inf


def test_subsampled_non_private_is_zero_q_dp():
    # Releasing the record with probability q: total variation q, so (0, q)-DP and nothing below q.
    from dpaudit.events import NonPrivate

    acc = PldAccountant().compose(PoissonSampled(0.01, NonPrivate()))
    assert acc.epsilon(0.0101) == 0.0
    assert acc.epsilon(0.0099) == math.inf


# ---------------------------------------------------------------- the Chernoff window of self_compose


def _exact_log_mgf(p: np.ndarray, lam: float) -> float:
    i = np.arange(p.size, dtype=np.float64)
    return float(special.logsumexp(np.log(np.where(p > 0, p, 1.0)) + lam * i, b=(p > 0).astype(float)))


def test_chernoff_window_holds_the_mass_it_claims_on_an_exactly_composed_pmf():
    # A 9000-bin PMF (blocks of 3 bins) composed 6 times exactly (float64 convolution of a PMF whose mass sits in
    # a few bins, so the direct sums are accurate to ~1e-15 relative): the mass outside [lo, hi] is <= tail.
    from dpaudit.accounting.pld_pairs import _chernoff_window

    rng = np.random.default_rng(3)
    p = np.zeros(9000)
    p[:40] = rng.dirichlet(np.ones(40))
    p[40:] = rng.random(8960) * 1e-9 * np.exp(-np.arange(8960) / 700.0)
    p /= p.sum()
    count, tail = 6, 1e-12
    lo, hi, _, tail_hi = _chernoff_window(p, count, tail, 1e-3)
    dist = p
    for _ in range(count - 1):
        dist = np.convolve(dist, p)
    assert dist[hi + 1 :].sum() <= tail * (1 + 1e-9) and dist[:lo].sum() <= tail * (1 + 1e-9)
    assert tail_hi == tail and hi < dist.size - 1  # it did cut


def test_chernoff_window_is_not_widened_by_coarse_graining():
    """10^6 steps of q = 1e-5, sigma = 0.5: one step's loss concentrates at one bin, so bounding each 22-bin
    block by its largest index (the old coarse-graining) put the window's top 2,100 nats above count * offset
    instead of ~35 nats of the exact log-MGF's Chernoff bound (and 22 M grid points: 17 s instead of 0.2 s)."""
    from dpaudit.accounting.pld_pairs import SubsampledGaussianRemove, _chernoff_window

    acc = PldAccountant()
    d = SubsampledGaussianRemove(2.0, 1e-5).discretise(acc.interval, acc.tail * 1e-5, acc.max_loss)
    count = 10**6
    assert d.probs.size > 4096  # coarse-grained
    _, hi, _, _ = _chernoff_window(d.probs, count, acc.tail, acc.interval)
    # The exact-K Chernoff bound at the best of a fine lam grid: the coarse one may only be a little above it.
    exact = min(
        math.ceil((count * _exact_log_mgf(d.probs, lam) - math.log(acc.tail)) / lam)
        for lam in np.geomspace(1e-6, 1e-2, 200)
    )
    assert exact <= hi <= exact * 1.05 + 100
    assert (hi + d.offset * count) * acc.interval < 60.0  # nats


@pytest.mark.parametrize("seed", range(4))
def test_coarse_log_mgf_chord_bound_is_above_the_exact_one(seed):
    # The window's validity rests on the chord bound being an upper bound of K(lam) (upper tail) and of
    # K(-lam) (lower tail) for every lam; checked through the window: with a single lam it must never be
    # narrower than the exact-K window at that lam.
    from dpaudit.accounting.pld_pairs import _chernoff_window

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5000, 20000))
    p = rng.random(n) ** 8
    p[rng.integers(0, n, 5)] += 1.0
    p /= p.sum()
    count, tail = int(rng.integers(2, 10**5)), 1e-15
    lam_idx = float(rng.choice([1e-4, 1e-3, 1e-2]))
    lo, hi, _, _ = _chernoff_window(p, count, tail, 1.0, lams=np.array([lam_idx]))
    k_pos = _exact_log_mgf(p, lam_idx)
    k_neg = _exact_log_mgf(p, -lam_idx)
    exact_hi = math.ceil((count * k_pos - math.log(tail)) / lam_idx)
    exact_lo = math.floor((math.log(tail) - count * k_neg) / lam_idx)
    assert hi >= min(exact_hi, count * (n - 1)) and lo <= max(exact_lo, 0)


def test_cached_steps_and_windows_follow_the_ledger():
    """The accountant caches one-step discretisations and their self-composition windows across queries and
    precisions; composing more of the same event (a new count) or another event (a new grid step) must give
    what a fresh accountant gives, at a usual delta and at one below the long-double switch."""
    from dpaudit.accounting import dpsgd_event

    def fresh(*parts):
        acc = PldAccountant()
        for e in parts:
            acc.compose(e)
        return acc

    small = dpsgd_event(noise_multiplier=1.0, sample_rate=0.02, steps=50)
    wide = PoissonSampled(0.5, Gaussian(0.05))  # its loss range widens the common grid step
    acc = PldAccountant().compose(small)
    for delta in (1e-5, 1e-9):
        acc.epsilon(delta)
    acc.compose(small)  # 100 steps of the same leaf: a new count, the same discretised step
    for delta in (1e-5, 1e-9):
        assert acc.epsilon(delta) == fresh(small, small).epsilon(delta)
    acc.compose(wide)
    for delta in (1e-5, 1e-9):
        assert acc.epsilon(delta) == fresh(small, small, wide).epsilon(delta)


def test_delta_at_infinite_epsilon_is_the_mass_at_infinity():
    # delta(inf) raised OverflowError (math.floor(inf) in the rounding charge) once an FFT composition had run;
    # deltas() gave the value with a RuntimeWarning. At eps = inf only the +inf mass (truncated tails) counts.
    acc = PldAccountant().compose(SelfComposed(PoissonSampled(0.01, Gaussian(1.0)), 10))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        d_inf, d_many = acc.delta(math.inf), acc.deltas([1.0, math.inf])
    assert 0.0 <= d_inf == d_many[1] <= acc.delta(1e300) <= 1e-14
    assert d_many[0] == pytest.approx(acc.delta(1.0), rel=1e-9, abs=0)


def test_a_count_past_the_error_bounds_float_range_is_refused_in_one_line():
    # 1e15 steps: tot^count (the composed mass with its error terms) raised OverflowError, an internal error
    # (exit 3) in `dpaudit account dpsgd --accountant pld` and in `--accountant all`, which lost RDP's answer.
    from dpaudit.accounting import compare_accountants, dpsgd_event

    event = dpsgd_event(noise_multiplier=1.0, sample_rate=0.01, steps=10**15)
    with pytest.raises(UnsupportedEventError, match=r"PLD accounting of 1000000000000000 compositions: .* use the rdp"):
        PldAccountant().compose(event).epsilon(1e-5)
    results, best = compare_accountants(event, 1e-5, ("rdp", "pld"))
    assert results["pld"].epsilon is None and best == results["rdp"].epsilon < math.inf


def test_pld_all_mass_at_infinity_self_composes():
    """A noise multiplier so small that the whole Gaussian loss (mean 1/(2 sigma^2) = 2e5 nats) lies past max_loss
    leaves inf_mass == tot; self_compose took math.log1p(-1), which raises ValueError: `dpaudit account dpsgd
    --noise-multiplier 0.0016 --sample-rate 1 --steps 2 --accountant pld` ended in an internal error (exit 3). All
    the mass at +inf composes to all the mass at +inf: delta = 1 at every epsilon, epsilon = inf (a valid bound)."""
    event = dpsgd_event(noise_multiplier=0.0015784749640999276, sample_rate=1.0, steps=2)
    acc = PldAccountant().compose(event)
    assert acc.epsilon(1e-5) == math.inf
    assert acc.delta(10.0) == 1.0


@pytest.mark.parametrize(("sigma", "q"), [(1e9, 1.0), (1e8, 1.0), (1e6, 1.0), (1e8, 0.5)])
def test_pld_delta_of_a_nearly_noiseless_step_is_not_below_exact(sigma, q):
    """delta(0) of one Gaussian step (q = 1: total variation erf(1/(2 sqrt(2) sigma)), Balle & Wang 2018,
    arXiv:1805.06530, Thm. 8) and of one Poisson-subsampled step (q(2 Phi(mu/2) - 1): the remove direction's
    hockey-stick at 0, P - Q = q (N(mu, 1) - N(0, 1))), against 40-digit mpmath. The connect-the-dots split
    1 - (w/m) e^l_k is of the order of the grid step (2.4e-8 nats here), so the masses' rounding near 1/2 came out
    up to 3e-8 relative in delta: at sigma = 1e9, 3.98942268e-10 against 3.98942280e-10. Planted: the split without
    its rounding margin (pld_pairs._split, m_err = w_err = 0 and no slack) fails all four."""
    import mpmath as mp

    with mp.workdps(40):
        exact = mp.mpf(q) * mp.erf(1 / (2 * mp.sqrt(2) * mp.mpf(sigma)))
    acc = PldAccountant().compose(PoissonSampled(q, Gaussian(sigma)) if q < 1.0 else Gaussian(sigma))
    d = acc.delta(0.0)
    assert d >= exact and d <= exact * (1 + 1e-4)


@pytest.mark.parametrize("q", [5e-324, 1e-320])
def test_a_subnormal_sample_rate_is_accounted_not_an_overflow(q):
    """`account dpsgd --accountant pld --sample-rate 5e-324` (or such a phase in a stranger's --schedule file) was an
    internal error (OverflowError: the grid's halvings from log2(inf)): the loss range's width is subnormal. Now the
    halvings' cap. ε = 0 is exact here: δ(0) <= T·q·TV(N(0, 1), N(1, 1)) < 1e-320 < δ."""
    assert PldAccountant().compose(dpsgd_event(noise_multiplier=1.0, sample_rate=q, steps=10)).epsilon(1e-5) == 0.0
