"""Calibration returns values that provably meet the target, and reports unreachable targets."""

from __future__ import annotations

import math

import pytest

from dpaudit.accounting import (
    PldAccountant,
    calibrate_noise_multiplier,
    calibrate_sample_rate,
    calibrate_steps,
    dpsgd_event,
    epsilon_for,
)
from dpaudit.errors import InputError, UnreachableTargetError
from dpaudit.events import Gaussian, NonPrivate


def test_noise_multiplier_meets_target_and_is_nearly_minimal():
    q, t, delta, target = 0.01, 1000, 1e-5, 2.0

    def make(s):
        return dpsgd_event(noise_multiplier=s, sample_rate=q, steps=t)

    sigma = calibrate_noise_multiplier(target_epsilon=target, delta=delta, make_event=make)
    assert epsilon_for(make(sigma), delta) <= target
    assert epsilon_for(make(sigma * (1 - 2e-4)), delta) > target


def test_noise_multiplier_with_pld_factory():
    sigma = calibrate_noise_multiplier(
        target_epsilon=1.0,
        delta=1e-6,
        make_event=Gaussian,
        accountant=lambda: PldAccountant(value_discretization_interval=1e-3),
    )
    acc = PldAccountant(value_discretization_interval=1e-3).compose(Gaussian(sigma))
    assert acc.epsilon(1e-6) <= 1.0


def test_unreachable_targets():
    with pytest.raises(UnreachableTargetError, match="not reachable"):
        calibrate_noise_multiplier(target_epsilon=1.0, delta=1e-5, make_event=lambda s: NonPrivate())
    with pytest.raises(UnreachableTargetError, match="single step"):
        calibrate_steps(
            target_epsilon=0.01,
            delta=1e-5,
            make_event=lambda t: dpsgd_event(noise_multiplier=0.5, sample_rate=1.0, steps=t),
        )
    with pytest.raises(InputError, match="target_epsilon"):
        calibrate_noise_multiplier(target_epsilon=0.0, delta=1e-5, make_event=Gaussian)
    with pytest.raises(InputError, match="accountant"):
        calibrate_noise_multiplier(target_epsilon=1.0, delta=1e-5, make_event=Gaussian, accountant="nope")


def test_steps_is_the_largest_within_budget():
    def make(t):
        return dpsgd_event(noise_multiplier=1.0, sample_rate=0.02, steps=t)

    t = calibrate_steps(target_epsilon=2.0, delta=1e-5, make_event=make)
    assert epsilon_for(make(t), 1e-5) <= 2.0 < epsilon_for(make(t + 1), 1e-5)
    assert calibrate_steps(target_epsilon=100.0, delta=1e-5, make_event=make, max_steps=50) == 50


def test_sample_rate():
    def make(q):
        return dpsgd_event(noise_multiplier=1.0, sample_rate=q, steps=500)

    q = calibrate_sample_rate(target_epsilon=1.5, delta=1e-5, make_event=make)
    assert epsilon_for(make(q), 1e-5) <= 1.5
    assert epsilon_for(make(q * 1.001), 1e-5) > 1.5
    assert calibrate_sample_rate(target_epsilon=1e6, delta=1e-5, make_event=make) == 1.0
    assert math.isfinite(q)


def test_a_target_met_by_the_least_accepted_noise_is_refused_as_too_large():
    # ε(σ = 1e-6) at q = 0.01, T = 100 is ~5.5e12 (RDP): a larger target is met by every noise multiplier the
    # events accept, so there is no smallest one; the error is about the target, not a rejected noise value.
    def make(s):
        return dpsgd_event(noise_multiplier=s, sample_rate=0.01, steps=100)

    least = epsilon_for(make(1e-6), 1e-5)
    for target in (1e300, 2 * least):
        with pytest.raises(InputError, match=r"^the target epsilon .* is too large to calibrate.*expected epsilon < "):
            calibrate_noise_multiplier(target_epsilon=target, delta=1e-5, make_event=make)
    sigma = calibrate_noise_multiplier(target_epsilon=least / 2, delta=1e-5, make_event=make)
    assert 1e-6 < sigma and epsilon_for(make(sigma), 1e-5) <= least / 2


# Closed-form oracles through the GDP accountant (Dong, Roth & Su 2022): T Gaussians of noise sigma are exactly
# (sqrt(T)/sigma)-GDP (Cor. 3.3), so the calibrated value is fixed by the one mu* with delta(eps; mu*) = delta
# (Cor. 2.13), found here by 50-digit bisection with mpmath, independent of the code's searches.


def _mu_star(eps, delta):
    import mpmath as mp

    with mp.workdps(50):
        lo, hi = mp.mpf("1e-6"), mp.mpf(100)
        for _ in range(200):
            mid = (lo + hi) / 2
            d = mp.ncdf(-eps / mid + mid / 2) - mp.exp(eps) * mp.ncdf(-eps / mid - mid / 2)
            lo, hi = (mid, hi) if d < delta else (lo, mid)
        return float(lo), float(hi)


@pytest.mark.parametrize(("target", "delta", "steps"), [(1.0, 1e-5, 1), (0.3, 1e-6, 16), (6.0, 1e-3, 3)])
def test_calibrated_noise_is_the_exact_gdp_optimum_within_tol(target, delta, steps):
    from dpaudit.events import SelfComposed

    lo, hi = _mu_star(target, delta)
    sigma_star = math.sqrt(steps) / lo  # the smallest sound sigma (mu <= mu*)
    tol = 1e-4
    sigma = calibrate_noise_multiplier(
        target_epsilon=target, delta=delta, make_event=lambda s: SelfComposed(Gaussian(s), steps), accountant="gdp",
        tol=tol,
    )  # fmt: skip
    # Sound: never less noise than the optimum (up to the oracle's bracket); tight: within the relative tol.
    assert sigma >= math.sqrt(steps) / hi * (1 - 1e-12)
    assert sigma <= sigma_star * (1 + tol)


@pytest.mark.parametrize(("target", "delta", "sigma"), [(1.0, 1e-5, 8.0), (2.0, 1e-6, 6.0), (0.5, 1e-5, 20.0)])
def test_calibrated_steps_are_the_exact_gdp_optimum(target, delta, sigma):
    from dpaudit.events import SelfComposed

    lo, hi = _mu_star(target, delta)
    # The largest T with sqrt(T)/sigma <= mu*: floor((mu* sigma)^2), the oracle's bracket narrow enough to fix it.
    t_lo, t_hi = math.floor((lo * sigma) ** 2), math.floor((hi * sigma) ** 2)
    assert t_lo == t_hi
    t = calibrate_steps(target_epsilon=target, delta=delta, make_event=lambda n: SelfComposed(Gaussian(sigma), n),
                        accountant="gdp")  # fmt: skip
    assert t == t_lo
    capped = calibrate_steps(target_epsilon=target, delta=delta, accountant="gdp", max_steps=t_lo - 1,
                             make_event=lambda n: SelfComposed(Gaussian(sigma), n))  # fmt: skip
    assert capped == t_lo - 1
    with pytest.raises(UnreachableTargetError, match="single step"):
        calibrate_steps(target_epsilon=target, delta=delta, accountant="gdp", make_event=lambda n: Gaussian(0.1))


@pytest.mark.filterwarnings("ignore:GDP accounting of Poisson")
@pytest.mark.parametrize(
    ("target", "delta", "sigma", "steps"),
    # q* = 0.635 (> 1/2): a check "eps(0.5) <= target -> q = 1" or an upper end of 0.5 passed the small-q* cases
    [(1.0, 1e-5, 1.0, 400), (0.5, 1e-6, 2.0, 2000), (8.0, 1e-5, 1.0, 4)],
)
def test_calibrated_sample_rate_is_the_clt_closed_form(target, delta, sigma, steps):
    # GDP's CLT: mu = q sqrt(T (e^(1/sigma^2) - 1)) (Bu et al. 2020), so q* = mu* / sqrt(T expm1(1/sigma^2)).
    lo, hi = _mu_star(target, delta)
    scale = math.sqrt(steps * math.expm1(1 / sigma**2))
    tol = 1e-4
    q = calibrate_sample_rate(
        target_epsilon=target, delta=delta, accountant="gdp", tol=tol,
        make_event=lambda r: dpsgd_event(noise_multiplier=sigma, sample_rate=r, steps=steps),
    )  # fmt: skip
    assert hi / scale * (1 + 1e-12) >= q >= lo / scale * (1 - tol)
    with pytest.raises(UnreachableTargetError, match=r"sample_rate >= 0\.01"):
        calibrate_sample_rate(
            target_epsilon=target, delta=delta, accountant="gdp", min_sample_rate=0.01,
            make_event=lambda r: dpsgd_event(noise_multiplier=0.2, sample_rate=r, steps=steps),
        )  # fmt: skip
    with pytest.raises(InputError, match="min_sample_rate"):
        calibrate_sample_rate(target_epsilon=target, delta=delta, min_sample_rate=1.0, make_event=Gaussian)


@pytest.mark.filterwarnings("ignore:GDP accounting of Poisson")
def test_sample_rate_floor_must_be_in_0_1_and_any_floor_below_the_answer_gives_it():
    """min_sample_rate = 0 was accepted by a check with <= (the bisection's geometric midpoint is then 0 forever); a
    floor of 0.6 below the answer q* = 0.635 must give q* (a check "< 0.5" refused it)."""
    for bad in (0.0, -0.5, 1.0):
        with pytest.raises(InputError, match="min_sample_rate"):
            calibrate_sample_rate(target_epsilon=1.0, delta=1e-5, min_sample_rate=bad, make_event=Gaussian)
    lo, hi = _mu_star(8.0, 1e-5)
    scale = math.sqrt(4 * math.expm1(1.0))
    q = calibrate_sample_rate(
        target_epsilon=8.0, delta=1e-5, accountant="gdp", min_sample_rate=0.6,
        make_event=lambda r: dpsgd_event(noise_multiplier=1.0, sample_rate=r, steps=4),
    )  # fmt: skip
    assert hi / scale * (1 + 1e-12) >= q >= lo / scale * (1 - 1e-4)


def test_a_formal_lower_bound_refuses_unreachable_targets_at_once_and_skips_slow_evaluations():
    from dpaudit.accounting import GdpAccountant

    delta, calls = 1e-5, []

    def factory():
        calls.append(1)
        return GdpAccountant()

    def exact(s):  # the accountant's own epsilon: a lower bound of itself, with equality
        return GdpAccountant().compose(Gaussian(s)).epsilon(delta)

    # A target below the bound at the largest noise allowed is refused before any accountant is built.
    with pytest.raises(
        UnreachableTargetError, match=r"even that much noise gives epsilon >= .* \(a formal lower bound\)"
    ):
        calibrate_noise_multiplier(target_epsilon=exact(8192.0) / 2, delta=delta, make_event=Gaussian,
                                   accountant=factory, max_noise_multiplier=8192.0, lower_bound=exact)  # fmt: skip
    assert calls == []
    # A target equal to the bound there is reachable (at that noise): refused only when the bound exceeds it.
    target = exact(8192.0)
    sigma = calibrate_noise_multiplier(target_epsilon=target, delta=delta, make_event=Gaussian, accountant=factory,
                                       max_noise_multiplier=8192.0, lower_bound=exact)  # fmt: skip
    assert exact(sigma) <= target and sigma <= 8192.0
    # Same answer with and without the bound, with fewer accountant evaluations (the doubling is skipped).
    calls.clear()
    with_bound = calibrate_noise_multiplier(target_epsilon=0.05, delta=delta, make_event=Gaussian,
                                            accountant=factory, lower_bound=exact)  # fmt: skip
    n_with = len(calls)
    calls.clear()
    without = calibrate_noise_multiplier(target_epsilon=0.05, delta=delta, make_event=Gaussian, accountant=factory)
    assert with_bound == without and n_with < len(calls)
