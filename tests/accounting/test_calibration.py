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
