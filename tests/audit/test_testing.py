"""dpaudit.testing: audit_mechanism and assert_dp on users' mechanisms."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.accounting.gdp import gdp_mu_from_epsilon_delta
from dpaudit.errors import InputError
from dpaudit.testing import assert_dp, audit_mechanism

EPS, DELTA = 2.0, 1e-5
# Gaussian noise calibrated exactly to (2, 1e-5) for sensitivity 1: σ = 1/μ(ε, δ) (μ-GDP ↔ (ε, δ)).
SIGMA = 1.0 / gdp_mu_from_epsilon_delta(EPS, DELTA)
D, D_PRIME = np.array([1.0, 0.0, 1.0]), np.array([0.0, 0.0, 1.0])  # differ in one record


def gaussian_sum(sigma):
    def mechanism(data, rng):
        return float(np.sum(data)) + rng.normal(0.0, sigma)

    return mechanism


def laplace_sum(scale):
    def mechanism(data, rng):
        return float(np.sum(data)) + rng.laplace(0.0, scale)

    return mechanism


def test_correct_gaussian_mechanism_passes():
    for method in ("clopper-pearson", "gdp"):
        res = assert_dp(gaussian_sum(SIGMA), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=5000, method=method)
        assert res.verdict == "consistent"
        assert res.claimed_epsilon == EPS and res.details["pilot_trials"] == 1000


def test_half_the_noise_fails_the_gdp_audit():
    # Half the noise doubles μ: true ε(1e-5) ≈ 4.4 vs the claimed 2. The gdp estimate sees it at 5000
    # trials (its bound is ≈ 3.7 here, with a margin of several standard errors).
    with pytest.raises(AssertionError, match=r"lower bound [0-9.]+ > claimed epsilon 2"):
        assert_dp(gaussian_sum(SIGMA / 2), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=5000, method="gdp")


def test_half_the_noise_fails_the_formal_audit_for_laplace():
    # Laplace with half the scale is exactly 2ε-DP: the formal (Clopper–Pearson) bound refutes ε = 1.
    with pytest.raises(AssertionError, match="claimed epsilon 1"):
        assert_dp(laplace_sum(0.5), D, D_PRIME, epsilon=1.0, delta=0.0, trials=5000)
    assert_dp(laplace_sum(1.0), D, D_PRIME, epsilon=1.0, delta=0.0, trials=5000)


def test_vector_outputs_use_a_learned_projection():
    # The signal sits in one of 5 coordinates with unequal noise; the pilot finds it (Fisher direction).
    scales = np.array([3.0, 0.2, 1.0, 5.0, 1.0])

    def mechanism(data, rng):
        out = rng.normal(0.0, scales)
        out[1] += 0.4 * float(np.sum(data))  # sensitivity 0.4 against noise 0.2: μ = 2
        return out

    res = audit_mechanism(mechanism, D, D_PRIME, epsilon=1.0, delta=DELTA, trials=4000, method="gdp")
    assert res.verdict == "violation"
    assert res.details["mu_lower_bound"] > 1.7


def test_audit_mechanism_is_reproducible():
    a = audit_mechanism(gaussian_sum(1.0), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=200, seed=3)
    b = audit_mechanism(gaussian_sum(1.0), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=200, seed=3)
    assert a == b


@pytest.mark.parametrize(
    ("mechanism", "kwargs", "message"),
    [
        (lambda d, rng: "x", {}, "float or a 1-D"),
        (lambda d, rng: np.ones((2, 2)), {}, "1-D array"),
        (lambda d, rng: np.nan, {}, "not finite"),
        (lambda d, rng: np.ones(int(rng.integers(1, 3))), {}, "changed shape"),
        (lambda d, rng: 0.0, {"trials": 5}, "trials >= 20"),
        (lambda d, rng: 0.0, {"method": "one-run"}, "method"),
        (lambda d, rng: 0.0, {"epsilon": -1.0}, "epsilon"),
    ],
)
def test_bad_mechanisms_and_arguments(mechanism, kwargs, message):
    args = {"epsilon": 1.0, "delta": DELTA, "trials": 100, **kwargs}
    with pytest.raises(InputError, match=message):
        audit_mechanism(mechanism, D, D_PRIME, **args)
