"""Per-step white-box statistics (Nasr et al. 2023, arXiv:2302.07956): composition oracles, soundness
over 200 simulated runs, planted composition mistakes, and power against a noise bug."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpaudit.accounting import dpsgd_event, epsilon_for, gdp_epsilon
from dpaudit.audit.whitebox import audit_steps, composed_epsilon, estimate_ratio
from dpaudit.errors import InputError

ALPHA = 0.05
DELTA = 1e-5


def _slack(n: int, p: float) -> float:
    """p + 3 binomial standard deviations (normal approximation; 0.096 at n = 200, p = 0.05)."""
    return p + 3.0 * math.sqrt(p * (1 - p) / n)


def _run(rng, T, q, sigma, b=1.0):
    """One simulated run: coins c_t ~ Bernoulli(1/2), o_t ~ N(b·B_t·c_t, σ²) with B_t ~ Bernoulli(q)."""
    c = rng.random(T) < 0.5
    return rng.normal(b * c * (rng.random(T) < q), sigma), c


@pytest.mark.parametrize("q,ratio,T", [(1.0, 0.2, 100), (1.0, 1.0, 10), (0.1, 1.0, 300), (0.02, 0.7, 1000)])
def test_composed_epsilon_oracles(q, ratio, T):
    """q = 1: √T·μ composition (Dong et al. 2022, Cor. 3.3) equals the PLD accountant's T Gaussian
    steps; q < 1: the PLD accountant of DP-SGD with noise multiplier 1/ratio."""
    pld = epsilon_for(dpsgd_event(noise_multiplier=1.0 / ratio, sample_rate=q, steps=T), DELTA, "pld")
    ours = composed_epsilon(ratio, q, T, DELTA)
    if q == 1.0:
        assert ours == pytest.approx(gdp_epsilon(math.sqrt(T) * ratio, DELTA), rel=1e-12)
    assert ours == pytest.approx(pld, rel=2e-3)


def _linear_composition(ratio, q, T, delta):
    """Planted mistake: composing μ over T steps as T·μ instead of √T·μ."""
    return gdp_epsilon(T * ratio, delta)


def _exceedance_q1(compose, n=200, T=100, sigma=1.0) -> float:
    true = gdp_epsilon(math.sqrt(T) / sigma, DELTA)
    over = 0
    for seed in range(n):
        o, c = _run(np.random.default_rng(seed), T, 1.0, sigma)
        over += compose(estimate_ratio(o, c, 1.0, ALPHA).ratio_lower, 1.0, T, DELTA) > true
    return over / n


def test_composed_estimate_is_sound_for_full_batch_steps_and_catches_linear_composition():
    """q = 1, σ = 1, T = 100: the composed estimate exceeds the true ε in ≤ α + slack of 200 runs; the
    same check fails T·μ composition."""
    assert _exceedance_q1(composed_epsilon) <= _slack(200, ALPHA)
    assert _exceedance_q1(_linear_composition) > 0.5


def test_composed_estimate_is_sound_for_sampled_steps_and_catches_ignoring_q():
    """q = 0.05, σ = 1, T = 600 (b = 1 assumed, σ estimated): ε(ratio) increases in the ratio, so the
    estimate exceeds the true ε exactly when 1/σ_upper > 1/σ; that happens in ≤ α/2 + slack of 200 runs.
    Ignoring q (composing as if every step held the canary) overshoots the true ε = 8.3 every time."""
    q, sigma, T, n = 0.05, 1.0, 600, 200
    over = 0
    for seed in range(n):
        o, c = _run(np.random.default_rng(seed), T, q, sigma)
        over += 1.0 / estimate_ratio(o, c, q, ALPHA / 2).sigma_upper > 1.0 / sigma
    assert over / n <= _slack(n, ALPHA / 2)
    true = composed_epsilon(1.0 / sigma, q, T, DELTA)
    o, c = _run(np.random.default_rng(0), T, q, sigma)
    r = audit_steps(o, c, sample_rate=q, noise_multiplier=sigma, delta=DELTA)
    assert r.composed_epsilon_estimate <= true < composed_epsilon(1.0 / r.ratio.sigma_upper, 1.0, T, DELTA)


def test_noise_bug_is_flagged_formally_per_step_and_by_the_composed_estimate():
    """A planted implementation bug — the noise divided by the batch size (64), the claim for σ = 2 —
    gives a formal per-step refutation of the claimed step curve (named as such, with its ε an estimate)
    and a composed estimate above the claim, for q = 1 and q = 0.1; both verdicts reach ``verdicts`` (what
    ``--fail-on-violation`` / ``--fail-on-estimate`` read)."""
    for q, T in ((1.0, 200), (0.1, 400)):
        claim = composed_epsilon(0.5, q, T, DELTA)
        o, c = _run(np.random.default_rng(5), T, q, 2.0 / 64)
        r = audit_steps(o, c, sample_rate=q, noise_multiplier=2.0, delta=DELTA, claimed_epsilon=claim)
        assert not r.per_step.formal and r.per_step.verdict == "curve-refuted", r.summary()
        assert r.per_step.refutation["claimed_curve_refuted"]
        assert "the claimed DP-SGD step curve is refuted" in r.summary()
        assert r.composed_verdict == "estimate-exceeds-claim"
        assert r.verdicts == ("curve-refuted", "estimate-exceeds-claim")


def test_correct_run_is_not_flagged_and_is_tight():
    """A correct run (σ = 1, q = 1, T = 400): no violation; the composed estimate reaches ≥ 0.5 of ε."""
    T = 400
    claim = composed_epsilon(1.0, 1.0, T, DELTA)
    o, c = _run(np.random.default_rng(11), T, 1.0, 1.0)
    r = audit_steps(o, c, sample_rate=1.0, noise_multiplier=1.0, delta=DELTA, claimed_epsilon=claim)
    assert r.per_step.verdict != "violation" and r.composed_verdict == "consistent"
    assert r.composed_epsilon_estimate >= 0.5 * claim  # a lower confidence bound
    assert abs(r.ratio.ratio - 1.0) < 0.3  # b/σ: standard error about 0.08 with 200 + 200 steps


def test_inputs():
    o, c = _run(np.random.default_rng(0), 20, 1.0, 1.0)
    with pytest.raises(InputError):
        audit_steps(o, c[:-1], sample_rate=1.0, noise_multiplier=1.0)
    with pytest.raises(InputError):
        audit_steps(o, c, sample_rate=1.0, noise_multiplier=0.0)
    with pytest.raises(InputError):
        audit_steps(o, np.zeros(20, bool), sample_rate=1.0, noise_multiplier=1.0)


@pytest.mark.slow
def test_formal_per_step_bound_is_sound_200_seeds():
    """Part (a) on 200 correct runs (q = 0.5, σ = 0.5, T = 200): the refuted per-step 1/σ' exceeds the
    true 1/σ = 2 in ≤ α/2 + slack of the runs (part (a) runs at α/2)."""
    from dpaudit.audit import fdp_one_run, one_run

    n, q, sigma, T = 200, 0.5, 0.5, 200
    fam = fdp_one_run.sampled_gaussian_step_family(q)
    kp, km = one_run.bonferroni_pairs(T)  # the design part (a) uses, at alpha/2 split over the pairs
    over = 0
    for seed in range(n):
        o, c = _run(np.random.default_rng(500 + seed), T, q, sigma)
        top, bottom = one_run.guess_counts(o, c, np.random.default_rng(seed).random(T))
        t, _ = fdp_one_run.largest_refuted(T, kp + km, top[kp] + bottom[km], fam, ALPHA / 2 / len(kp))
        over += t > 1.0 / sigma
    assert over / n <= _slack(n, ALPHA / 2)
