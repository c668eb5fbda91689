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


def test_composed_epsilon_of_no_shift_is_zero_and_a_sampled_step_is_not_composed_as_full_batch():
    """No shift (ratio 0, the lower bound when the shift's lower bound is <= 0): ε = 0 for q = 1 and q < 1 (1/ratio
    would divide by zero). q = 0.7 is accounted as sampled (PLD), below the full-batch √T·μ composition. Planted
    (tenth mutation pass): 0 -> 1 for ratio <= 0 (a composed estimate of 1 from no evidence, "estimate-exceeds-claim"
    for a claim below 1), and the full-batch branch taken from q >= 0.5 (ε overstated) -> fail."""
    for q in (1.0, 0.3):
        assert composed_epsilon(0.0, q, 50, DELTA) == 0.0
    pld = epsilon_for(dpsgd_event(noise_multiplier=2.0, sample_rate=0.7, steps=5), DELTA, "pld")
    assert composed_epsilon(0.5, 0.7, 5, DELTA) == pytest.approx(pld, rel=2e-3)
    assert pld < 0.95 * gdp_epsilon(math.sqrt(5) * 0.5, DELTA)


def test_estimate_ratio_bounds_cover_at_their_levels():
    """The two confidence bounds of :func:`estimate_ratio` at level α/2 each, by direct simulation (fixed seeds):
    the χ² upper bound on σ is exact for any sample size (P[σ_upper >= σ] = 1 − α/2 with 3 not-inserted steps),
    the Welch lower bound on the shift b is asymptotic (150 + 150 steps, q = 0.5, so E[o | inserted] = q·b and the
    inserted variance is σ² + q(1 − q)b²). With α = 0.2 both rates are 0.9; tolerance 4 Monte Carlo standard
    deviations (0.035 with 1200 draws, 0.042 with 800). Planted (tenth mutation pass): the χ² quantile at α or α/4,
    its degrees of freedom or the sample SD's ddof off by one, the shift multiplied by q or the Welch standard error
    missing a sample's variance -> a rate off by 0.05 or more -> fail."""
    alpha = 0.2
    rng = np.random.default_rng(1)
    c = np.arange(6) % 2 == 0
    n = 1200
    covered = sum(estimate_ratio(rng.normal(1.0 * c, 1.0), c, 1.0, alpha).sigma_upper >= 1.0 for _ in range(n))
    assert abs(covered / n - 0.9) <= 4 * math.sqrt(0.09 / n)
    rng = np.random.default_rng(2)
    q, b, c = 0.5, 2.0, np.arange(300) % 2 == 0
    n = 800
    covered = sum(
        estimate_ratio(rng.normal(b * c * (rng.random(300) < q), 1.0), c, q, alpha).shift_lower <= b for _ in range(n)
    )
    assert abs(covered / n - 0.9) <= 4 * math.sqrt(0.09 / n)


def test_point_ratio_and_a_run_without_shift():
    """The point estimate b/σ with σ ≠ 1 (b = 0.25, σ = 0.5, q = 1, 2000 steps: ratio 0.5, standard error about
    0.03; tolerance 0.15), and a run whose canary moves nothing (b = 0): the shift's lower bound is below 0, so
    the ratio's lower bound and the composed estimate are 0 and a claim of 0.5 is "consistent". Planted (tenth
    mutation pass): b̂·σ̂ for b̂/σ̂, max(b̂, 1) or the guard σ̂ > 1 in the point ratio; b̂ from the inserted mean
    alone or the sum of the means (not invariant to an offset); the lower bound's guard σ_upper > 1 (∞ for
    σ < 1); max(b_lo, 1) in the lower bound (an estimate above a claim with no evidence); ">=" for "exceeds" ->
    fail."""
    o, c = _run(np.random.default_rng(3), 2000, 1.0, 0.5, b=0.25)
    est = estimate_ratio(o, c, 1.0, ALPHA)
    assert abs(est.ratio - 0.5) < 0.15 and 0.0 < est.ratio_lower <= 0.5  # σ < 1: a finite lower bound below b/σ
    # a constant offset at the coordinate (the data's own gradient there) moves both samples: b is their difference
    assert estimate_ratio(o + 3.0, c, 1.0, ALPHA).__dict__ == pytest.approx(est.__dict__, rel=1e-9)
    o, c = _run(np.random.default_rng(4), 200, 1.0, 1.0, b=0.0)
    r = audit_steps(o, c, sample_rate=1.0, noise_multiplier=1.0, delta=DELTA, claimed_epsilon=0.5)
    assert r.ratio.shift_lower < 0.0 and r.ratio.ratio_lower == 0.0
    assert r.composed_epsilon_estimate == 0.0 and r.composed_verdict == "consistent"
    r = audit_steps(o, c, sample_rate=1.0, noise_multiplier=1.0, delta=DELTA, claimed_epsilon=0.0)
    assert r.composed_verdict == "consistent"  # 0 does not exceed a claim of 0


def test_alpha_is_split_between_the_per_step_test_and_the_composed_estimate():
    """Both results hold at once with probability >= confidence because each takes α/2 (Bonferroni): at confidence
    0.9 the per-step f-DP audit runs at 0.95 and the ratio's bounds are estimate_ratio's at α/2 = 0.05 (whose
    coverage is checked above). The per-step claim is one step's ε(δ) (the exact one-step curve, within the PLD's
    pessimistic 2e-3); q < 1 takes the sampled label (b = 1 assumed). Planted (tenth mutation pass): the per-step
    audit at confidence α/2, 1 − 2α or 1 − α, the ratio at α or 2α, the claim of 2 steps, the full-batch branch from
    q >= 0.5, the point estimate's b = 1 read as 1·σ̂ or 2/σ̂, the shift note on a run without excess shift ->
    fail. Non-finite observations are refused by name."""
    from dpaudit.audit.fdp_one_run import sampled_gaussian_step_family
    from dpaudit.audit.whitebox import ESTIMATE_LABEL_SAMPLED

    q, sigma = 0.5, 2.0
    o, c = _run(np.random.default_rng(6), 200, q, sigma)
    r = audit_steps(o, c, sample_rate=q, noise_multiplier=sigma, delta=DELTA, confidence=0.9, steps=4)  # cheap PLD
    assert r.per_step.confidence == pytest.approx(0.95, abs=1e-9) and r.confidence == 0.9
    assert r.ratio.__dict__ == pytest.approx(estimate_ratio(o, c, q, 0.05).__dict__, rel=1e-9)
    exact = sampled_gaussian_step_family(q).epsilon(1.0 / sigma, DELTA)
    assert exact <= r.per_step_claimed_epsilon <= exact + 2e-3
    assert r.label == ESTIMATE_LABEL_SAMPLED and r.notes == ()  # b = 1 as claimed: no note on the shift
    # the point estimate (b = 1, σ estimated from about 100 steps, relative standard error 7%) near the true ε
    assert r.composed_epsilon_point == pytest.approx(composed_epsilon(1.0 / sigma, q, 4, DELTA), rel=0.3)
    o[3] = np.nan
    with pytest.raises(InputError, match="observations must be finite"):
        audit_steps(o, c, sample_rate=q, noise_multiplier=1.0)


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
    one_in, one_out = np.arange(20) == 0, np.arange(20) != 0  # one inserted / one not-inserted step: no variance
    for c in (one_in, one_out):
        with pytest.raises(InputError, match="need at least 2 inserted and 2 not-inserted steps"):
            estimate_ratio(o, c, 1.0, ALPHA)
    two = np.arange(4) < 2
    assert np.isfinite(estimate_ratio(np.array([0.0, 1.0, 0.5, -0.5]), two, 1.0, ALPHA).sigma_upper)
    # not-inserted steps without noise (sample SD 0): the ratio is infinite, not a ZeroDivisionError
    assert estimate_ratio(np.array([1.0, 2.0, 0.5, 0.5]), two, 1.0, ALPHA).ratio == math.inf


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


def test_the_full_batch_composed_estimate_is_rounded_down():
    # composed_epsilon is a lower estimate compared with the claim: at q = 1 it is never above the 50-digit
    # epsilon(delta) of sqrt(T) * ratio (gdp_epsilon, which rounds up for claims, gave 1e-14 relative above it).
    from tests.accounting.test_conversions import _mp_bisect, _mp_gdp_delta

    for ratio, T in ((0.2, 100), (1.0, 10), (0.37, 7)):
        mu = math.sqrt(T) * ratio
        lo, _ = _mp_bisect(lambda e, mu=mu: DELTA - _mp_gdp_delta(mu, e), 0.0, 200.0)
        assert composed_epsilon(ratio, 1.0, T, DELTA) <= lo


def test_summary_prints_the_composed_estimate_beside_its_claim_in_order():
    """The composed estimate and the claim its verdict compares it with print in the order computed
    (dpaudit.numfmt.against). Before: "epsilon >= 7.999 ... claimed epsilon: 7.99996 -> composed verdict:
    estimate-exceeds-claim" for an estimate of 7.999957 above a claim of 7.999954."""
    import dataclasses
    import re
    from decimal import Decimal

    o, c = _run(np.random.default_rng(11), 40, 1.0, 1.0)
    r = audit_steps(o, c, sample_rate=1.0, noise_multiplier=1.0, delta=DELTA, claimed_epsilon=8.0)
    for est, verdict in ((7.999957, "estimate-exceeds-claim"), (7.999951, "consistent")):
        r = dataclasses.replace(r, composed_epsilon_estimate=est, claimed_epsilon=7.999954, composed_verdict=verdict)
        text = r.summary()
        e = Decimal(re.search(r"\(b\) composed over .*: epsilon >= (\S+) ", text).group(1))
        claimed = Decimal(re.search(r"claimed epsilon: (\S+)  ->  composed verdict: " + verdict, text).group(1))
        assert (e > claimed) is (verdict == "estimate-exceeds-claim") and e <= Decimal(est), text


def _exact_ratio_bounds(o, c, q, alpha):
    """estimate_ratio's three bounds in 50-digit mpmath from the same data: (shift_lower, sigma_upper, ratio_lower)."""
    import mpmath as mp

    with mp.workdps(50):
        oi, oo = ([mp.mpf(float(x)) for x in o[s]] for s in (c, ~c))
        mi, m0 = mp.fsum(oi) / len(oi), mp.fsum(oo) / len(oo)
        vi = mp.fsum((x - mi) ** 2 for x in oi) / (len(oi) - 1)
        v0 = mp.fsum((x - m0) ** 2 for x in oo) / (len(oo) - 1)
        a = mp.mpf(alpha) / 2
        z = -mp.sqrt(2) * mp.erfinv(2 * a - 1)  # z_{1−α/2}
        k = mp.mpf(len(oo) - 1) / 2
        from scipy import stats

        start = stats.chi2.ppf(alpha / 2, len(oo) - 1)
        x = mp.findroot(lambda t: mp.gammainc(k, 0, t / 2, regularized=True) - a, start)
        sigma_up = mp.sqrt(v0 * (len(oo) - 1) / x)
        lo = (mi - m0) / q - z * mp.sqrt(vi / len(oi) + v0 / len(oo)) / q
        return lo, sigma_up, max(lo, 0) / sigma_up


@pytest.mark.parametrize(
    ("n", "alpha", "q", "loc", "seed"),
    [(30, 1e-10, 1.0, 0.0, 7), (1000, 0.025, 1.0, 1e3, 7), (200, 1e-6, 0.3, 1e3, 7), (10, 0.05, 1.0, 0.0, 7),
     (200, 0.05, 1.0, 1e6, 4)],
)  # fmt: skip
def test_the_ratio_bounds_are_on_the_safe_side_of_their_exact_values(n, alpha, q, loc, seed):
    """shift_lower and ratio_lower never above, sigma_upper never below their values in exact arithmetic on the same
    data. Before: z was ndtri(1 − α/2), whose argument rounds: at α = 1e-10 (n = 30) shift_lower came out 6.9e7 ulps
    above; the means' rounding (observations near 1e6, shift near 3: 1.9e-10 above) and chi2.ppf's (up to 20 ulps
    high) were not charged. Planted: each of the three reverted fails at least one case."""
    rng = np.random.default_rng(seed)
    c = np.arange(n) % 2 == 0
    o = rng.normal(loc, 1.0, n) + 3.0 * (c & (rng.random(n) < q))
    est = estimate_ratio(o, c, q, alpha)
    lo, sig, ratio = _exact_ratio_bounds(o, c, q, alpha)
    assert est.shift_lower <= lo and est.sigma_upper >= sig and est.ratio_lower <= ratio
