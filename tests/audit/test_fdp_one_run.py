"""One-run f-DP audit (Mahloujifar, Melis & Chaudhuri 2025, arXiv:2410.22235): exact oracles, the
closed-form one-step curve against the PLD accountant, soundness over 200 seeds, power, planted mistakes."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import special, stats

from dpaudit.accounting import dpsgd_event, make_accountant
from dpaudit.audit import audit_scores, max_certifiable_epsilon, one_run, one_run_epsilon_lower_bound
from dpaudit.audit import fdp_one_run as F

ALPHA = 0.05


def _binomial_slack(n: int, p: float) -> float:
    """p + 3 binomial standard deviations: an exceedance rate above it has probability < 0.2% if the
    true rate is p (normal approximation; at n = 200, p = 0.05 this is 0.096)."""
    return p + 3.0 * math.sqrt(p * (1 - p) / n)


def _rejects_with_wrong_factor(m, k, v, g, alpha):
    """Planted mistake: the recursion's i/(k − i) written (i + 1)/(k − i)."""
    r, h = alpha * v / m, alpha * (k - v) / m
    for i in range(v - 1, -1, -1):
        h_new = max(h, g(r))
        if h_new == h:
            break
        r, h = min(1.0, r + (i + 1) / (k - i) * (h_new - h)), h_new
    return r + h > k / m


def test_two_canaries_no_leakage_is_exact():
    """f = identity (no leakage), m = k = v = 2: P[both right] = 1/4 exactly, and the recursion rejects
    iff alpha > 1/4; m = 2, k = v = 1: P = 1/2, rejected iff alpha > 1/2."""
    g = F._gdp_g(0.0)
    assert not F.fdp_rejects(2, 2, 2, g, 0.249) and F.fdp_rejects(2, 2, 2, g, 0.251)
    assert not F.fdp_rejects(2, 1, 1, g, 0.499) and F.fdp_rejects(2, 1, 1, g, 0.501)
    # At alpha = 1/4 exactly (every number dyadic: no rounding) the recursion ends at r + h = k/m, which is not a
    # contradiction (the rule is r + h > k/m: P[V >= v] = alpha is not "< alpha").
    assert not F.fdp_rejects(2, 2, 2, g, 0.25)


def _rr_unsound_cases(rejects) -> list:
    """Cases where ``rejects`` refutes ε-DP although ε-randomised response on each canary (which is
    ε-DP) has P[V ≥ v] = P[Bin(k, e^ε/(1 + e^ε)) ≥ v] > α: the test would reject a true null more
    often than α."""
    bad = []
    for eps in (0.0, 0.5, 1.0, 2.0):
        g = F._eps_delta_g(eps, 0.0)
        q = special.expit(eps)
        for m in (4, 10, 25):
            for k in range(1, m + 1):
                for v in range(1, k + 1):
                    for alpha in (0.05, 0.3):
                        if rejects(m, k, v, g, alpha) and stats.binom.sf(v - 1, k, q) > alpha * (1 + 1e-9):
                            bad.append((eps, m, k, v, alpha))
    return bad


def test_recursion_is_sound_against_randomised_response_exactly():
    assert _rr_unsound_cases(F.fdp_rejects) == []


def test_planted_wrong_recursion_factor_is_caught():
    assert _rr_unsound_cases(_rejects_with_wrong_factor)


def test_recursion_is_sound_against_an_epsilon_delta_mechanism_exactly():
    """The (ε, δ) family with δ > 0 (the tests above have δ = 0). Mechanism: with probability δ reveal the bit,
    else ε-randomised response; for every set S, P[M(1) ∈ S] ≤ e^ε P[M(0) ∈ S] + δ, so it is (ε, δ)-DP per canary
    and guessing its bit is right with probability p = δ + (1 − δ)·e^ε/(1 + e^ε), independently: P[V ≥ v] =
    P[Bin(k, p) ≥ v] exactly. A test that refutes (ε, δ)-DP where that exceeds α is unsound. Also: v = 0 is
    never a refutation, and counts outside 0 ≤ v ≤ k ≤ m are refused. Planted (tenth mutation pass): the curve's
    1 − δ − e^ε(1 − y) written 1 + δ − ... or 1 − e^ε(1 − y) refutes where P[V ≥ v] = 0.066 > α = 0.05 -> fails."""
    bad = []
    for eps in (0.0, 1.0):
        for delta in (0.01, 0.1):
            g = F._eps_delta_g(eps, delta)
            p = delta + (1.0 - delta) * special.expit(eps)
            for m in (10, 25):
                for k in range(1, m + 1):
                    for v in range(1, k + 1):
                        if F.fdp_rejects(m, k, v, g, ALPHA) and stats.binom.sf(v - 1, k, p) > ALPHA * (1 + 1e-9):
                            bad.append((eps, delta, m, k, v))
    assert bad == []
    assert not F.fdp_rejects(10, 5, 0, F._gdp_g(50.0), 0.5)
    from dpaudit.errors import InputError

    with pytest.raises(InputError, match="needs delta > 0"):  # direct callers: audit_scores refuses it earlier
        F.resolve_family("epsilon-delta", 0.0)
    for m, k, v in ((10, 5, 6), (10, 11, 3), (10, 5, -1)):
        with pytest.raises(ValueError):
            F.fdp_rejects(m, k, v, F._gdp_g(1.0), ALPHA)


@pytest.mark.parametrize("q,sigma", [(1.0, 1.0), (0.05, 1.0), (0.3, 0.7), (0.01, 0.5)])
def test_one_step_curve_matches_pld(q, sigma):
    """The closed-form δ(ε) of one Poisson-sampled Gaussian step equals the PLD accountant's (to its
    1e-4-nat discretisation, pessimistic side), and so does the family's ε(δ)."""
    acc = make_accountant("pld").compose(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=1))
    eps = np.array([0.0, 0.05, 0.5, 1.0, 2.0, 3.0])
    ours = F._sampled_gaussian_step_delta(eps, 1.0 / sigma, q)
    pld = np.array([acc.delta(float(e)) for e in eps])
    assert np.all(ours <= pld + 1e-12) and np.allclose(ours, pld, rtol=2e-3, atol=0)  # delta down to 1.9e-10
    eps = F.sampled_gaussian_step_family(q).epsilon(1.0 / sigma, 1e-5)
    assert eps == pytest.approx(acc.epsilon(1e-5), abs=2e-3) and eps <= acc.epsilon(1e-5)


def _gaussian_canaries(rng, m, mu):
    member = rng.random(m) < 0.5
    return rng.normal(mu * member, 1.0), member  # each canary's score is its own μ-GDP Gaussian


def test_soundness_gdp_family_200_seeds():
    """Each canary independently μ-GDP (μ = 1.5, a strong likelihood-ratio ranking): the rate at which
    the refuted μ exceeds the true μ stays within α + binomial slack (observed: 0)."""
    n, mu = 200, 1.5
    over = 0
    for seed in range(n):
        rng = np.random.default_rng(seed)
        s, mem = _gaussian_canaries(rng, 300, mu)
        r = audit_scores(s, mem, method="one-run-fdp", design="canaries", tradeoff="gdp", seed=seed,
                         threshold_selection="bonferroni")  # fmt: skip
        over += r.details["mu_lower_bound"] > mu
    assert over / n <= _binomial_slack(n, ALPHA)


def test_power_leaky_mechanism_refutes_claim():
    """μ = 4 per canary (ε(1e-5) ≈ 24) audited with 1000 canaries against a claim of ε = 2: violation
    with the formal (ε, δ) family; the claim's own curve (one Gaussian step, q = 1) refuted, named so."""
    rng = np.random.default_rng(0)
    s, mem = _gaussian_canaries(rng, 1000, 4.0)
    kw = dict(method="one-run-fdp", design="canaries", claimed_epsilon=2.0, threshold_selection="bonferroni")
    r = audit_scores(s, mem, tradeoff="epsilon-delta", **kw)
    assert r.formal and r.verdict == "violation" and r.refutation is None, r.summary()
    r = audit_scores(s, mem, tradeoff=F.sampled_gaussian_step_family(1.0), **kw)
    assert not r.formal and r.verdict == "curve-refuted", r.summary()
    assert r.refutation["claimed_curve_refuted"] and r.refutation["curve"] == "DP-SGD step"
    assert r.summary().startswith("the claimed DP-SGD step curve is refuted")
    g = audit_scores(s, mem, method="one-run-fdp", design="canaries", claimed_epsilon=2.0)
    assert not g.formal and g.verdict == "estimate-exceeds-claim"


def test_fdp_is_tighter_than_epsilon_delta_one_run_on_gaussian_canaries():
    """The point of the paper: on Gaussian canaries the GDP-family bound beats Steinke et al.'s."""
    rng = np.random.default_rng(1)
    s, mem = _gaussian_canaries(rng, 1000, 2.0)
    kw = dict(design="canaries", threshold_selection="bonferroni", seed=0)
    fdp = audit_scores(s, mem, method="one-run-fdp", **kw).epsilon_lower_bound
    steinke = audit_scores(s, mem, method="one-run", **kw).epsilon_lower_bound
    assert fdp > steinke + 0.5, (fdp, steinke)


def test_max_certifiable_and_inputs():
    """A perfect attack's bound is the max certifiable; more canaries certify more; bad inputs raise."""
    m1 = max_certifiable_epsilon(50, 50, method="one-run-fdp", threshold_selection="bonferroni")
    m2 = max_certifiable_epsilon(500, 500, method="one-run-fdp", threshold_selection="bonferroni")
    assert 0 < m1 < m2
    mem = np.arange(100) % 2 == 0
    perfect = audit_scores(mem.astype(float), mem, method="one-run-fdp", design="canaries",
                           threshold_selection="bonferroni")  # fmt: skip
    assert perfect.epsilon_lower_bound == pytest.approx(m1, rel=1e-6)
    from dpaudit.errors import InputError

    with pytest.raises(InputError):
        audit_scores(mem.astype(float), mem, method="one-run-fdp", design="membership")
    with pytest.raises(InputError):
        audit_scores(mem.astype(float), mem, method="one-run-fdp", design="canaries", tradeoff="laplace")
    with pytest.raises(InputError):
        audit_scores(mem.astype(float), mem, method="one-run-fdp", design="canaries", delta=0.0)


def test_epsilon_delta_family_close_to_steinke_on_randomised_response():
    """Pure ε-DP randomised response: the (ε, δ) family and Steinke et al. test the same curve; the f-DP
    bound is sound (below the true ε = 2 here) and within 0.6 of Steinke's with fixed guess counts."""
    rng = np.random.default_rng(3)
    m, eps = 2000, 2.0
    mem = rng.random(m) < 0.5
    keep = rng.random(m) < special.expit(eps)
    s = np.where(keep, mem, ~mem).astype(float) + 1e-3 * rng.random(m)
    kw = dict(design="canaries", k_plus=200, k_minus=200, seed=0, delta=1e-5)
    fdp = audit_scores(s, mem, method="one-run-fdp", tradeoff="epsilon-delta", **kw).epsilon_lower_bound
    r = audit_scores(s, mem, method="one-run", **kw)
    assert fdp <= eps and abs(fdp - r.epsilon_lower_bound) < 0.6, (fdp, r.epsilon_lower_bound)
    assert one_run_epsilon_lower_bound(m, 400, r.counts["correct"], 1e-5, 0.05) == pytest.approx(r.epsilon_lower_bound)


def test_soundness_subsampled_gaussian_step_family_200_seeds():
    """Each canary one Poisson-sampled Gaussian step (q = 0.3, σ = 0.5: in the batch w.p. q, then
    N(1, σ²) vs N(0, σ²)): the refuted 1/σ' exceeds the true 1/σ = 2 at a rate within α + slack."""
    n, q, sigma = 200, 0.3, 0.5
    fam = F.sampled_gaussian_step_family(q)
    over = 0
    for seed in range(n):
        rng = np.random.default_rng(10_000 + seed)
        mem = rng.random(300) < 0.5
        s = rng.normal(mem * (rng.random(300) < q), sigma)
        v = int(mem[np.argsort(-s)[:30]].sum())  # top 30 guessed "in" (no ties: continuous scores)
        over += F.largest_refuted(300, [30], [v], fam, ALPHA)[0] > 1.0 / sigma
    assert over / n <= _binomial_slack(n, ALPHA)


@pytest.mark.slow
def test_dpsgd_family_matches_the_gaussian_for_one_full_batch_step():
    """dpsgd_family(q = 1, T = 1) (PLD accountant) is the Gaussian curve: same refuted parameter as the
    closed-form one-step family, up to the ε-grid and discretisation (both sound)."""
    rng = np.random.default_rng(2)
    s, mem = _gaussian_canaries(rng, 1000, 2.0)
    kw = dict(design="canaries", k_plus=100, k_minus=100, seed=0)
    a = audit_scores(s, mem, method="one-run-fdp", tradeoff=F.dpsgd_family(1.0, 1), **kw)
    b = audit_scores(s, mem, method="one-run-fdp", tradeoff=F.sampled_gaussian_step_family(1.0), **kw)
    assert a.details["parameter_lower_bound"] == pytest.approx(b.details["parameter_lower_bound"], rel=0.03)
    assert a.epsilon_lower_bound == pytest.approx(b.epsilon_lower_bound, rel=0.03)


def _rr_canaries(rng, m, eps):
    """Randomised response on each canary's inclusion bit: exactly (ε, 0)-DP per canary."""
    member = rng.random(m) < 0.5
    keep = rng.random(m) < special.expit(eps)
    return np.where(keep, member, ~member).astype(float), member


def test_claim_curve_refutation_is_never_an_epsilon_lower_bound():
    """Issue 27: randomised response exactly (2, 0)-DP, one-run f-DP against DP-SGD(q=1, T=1) with a claim
    of ε = 2. The DP-SGD curve is refuted (RR is not f-DP for the Gaussian curve with ε(δ) = 2), so the
    ε of the refuted curve exceeds 2; it must be labelled an estimate and the verdict must name the curve,
    in the result object, its JSON and its summary (every renderer reads those)."""
    from dpaudit.cli.audit import parse_tradeoff

    family = parse_tradeoff("dpsgd:1,1", "one-run-fdp")
    refuted = 0
    for seed in range(5):
        s, mem = _rr_canaries(np.random.default_rng(seed), 1000, 2.0)
        r = audit_scores(s, mem, method="one-run-fdp", design="canaries", tradeoff=family, claimed_epsilon=2.0,
                         seed=seed)  # fmt: skip
        assert not r.formal and r.verdict != "violation"
        d = r.to_dict()
        assert d["formal"] is False and d["refutation"]["curve"] == "DP-SGD"
        if r.epsilon_lower_bound > 2.0:
            refuted += 1
            assert r.verdict == "curve-refuted" and d["refutation"]["claimed_curve_refuted"] is True
            text = r.summary()
            assert text.startswith("the claimed DP-SGD curve is refuted")
            assert "formal lower bound" not in text.replace("not a formal lower bound", "")
            assert "epsilon estimate" in text
    assert refuted >= 4  # the refutation is what the audit shows on this mechanism (30 of 30 seeds in issue 27)


@pytest.mark.parametrize("method", ["clopper-pearson", "one-run", "one-run-fdp"])
def test_holdout_choice_depends_on_the_selection_part_only(method, monkeypatch):
    """The holdout selection (one helper for every method, dpaudit.audit.holdout) must choose the test —
    the threshold, or the one-run guess thresholds — from the selection part alone: rewriting every evaluation-part
    score and bit leaves the choice unchanged. Choosing on the evaluation part (issue 27's surviving
    mutant for the f-DP audit, unsound: bound above the true ε in ~14% of runs at α = 0.05) fails this.
    The halves are drawn on a canonical order of the records, a function of their scores and bits
    (holdout.canonical_order), so the rewrite would move records between halves: the order is held at
    the first data set's, which keeps every record in its half."""
    from dpaudit.audit import bounds, holdout, one_run

    m, seed = 400, 3
    s, mem = _gaussian_canaries(np.random.default_rng(0), m, 2.0)
    order = holdout.canonical_order(s, mem)
    monkeypatch.setattr(holdout, "canonical_order", lambda *_: order)
    kw = {"method": method, "seed": seed, "claimed_epsilon": 1.0}
    if method == "clopper-pearson":
        sel = holdout.on_records(holdout.split(np.sort(mem), bounds._as_rng(seed), stratified=True), s, mem)
        kw["design"] = "multi-run"
    else:
        sel = holdout.on_records(one_run.draw_design(m, "holdout", bounds._as_rng(seed))[1], s, mem)
        kw["design"] = "canaries"
    if method == "one-run-fdp":
        kw["tradeoff"] = "epsilon-delta"
    chosen = []  # the one-run choice (score thresholds) as handed to the evaluation part
    apply = one_run.apply_guess_fractions
    monkeypatch.setattr(one_run, "apply_guess_fractions", lambda c, *parts: (chosen.append(c), apply(c, *parts))[1])
    a = audit_scores(s, mem, **kw)
    s2, mem2 = s.copy(), mem.copy()
    rng = np.random.default_rng(1)
    ev = ~sel
    if method == "clopper-pearson":  # keep the class sizes: a multi-run design has them fixed
        s2[ev] = rng.normal(0.0, 1.0, ev.sum()) + 6.0 * mem[ev]
    else:
        mem2[ev] = rng.random(ev.sum()) < 0.5
        s2[ev] = rng.normal(0.0, 1.0, ev.sum()) + 6.0 * mem2[ev]
    b = audit_scores(s2, mem2, **kw)
    if method == "clopper-pearson":
        assert a.threshold == b.threshold
    else:
        assert len(chosen) == 2 and chosen[0] == chosen[1]
    assert b.epsilon_lower_bound > a.epsilon_lower_bound  # the evaluation part did change


def test_claim_curves_are_cached_per_mechanism_across_families():
    """The PLD curve cache (shared by every audit of a process) is keyed on the whole mechanism: two
    DP-SGD families at the same noise multiplier but different (q, T) get each its own curve, equal to an
    uncached PLD computation; the same (q, T, σ) from a second family is the cached object."""
    t, ys = 1.0, np.linspace(0.0, 1.0, 41)
    for q, steps in ((0.5, 10), (0.1, 3)):
        acc = make_accountant("pld").compose(dpsgd_event(noise_multiplier=1.0 / t, sample_rate=q, steps=steps))
        grid = np.linspace(0.0, acc.epsilon(F._GRID_DELTA_MIN), F._GRID_POINTS)
        expected = F._grid_g(grid, acc.deltas(grid))
        g = F.dpsgd_family(q, steps).blowup_inverse(t)
        assert [g(y) for y in ys] == [expected(y) for y in ys]
    a = F._pld_curve(dpsgd_event(noise_multiplier=1.0, sample_rate=0.5, steps=10))
    assert a is F._pld_curve(dpsgd_event(noise_multiplier=1.0, sample_rate=0.5, steps=10))
    assert not a[0].flags.writeable and not a[1].flags.writeable  # a caller cannot corrupt the shared curve


def test_event_family_epsilon_is_the_accountants_at_sigma_one_over_t():
    """The family's ε of curve t (the estimate shown for the leakiest refuted curve) is the PLD accountant's ε(δ) of
    make_event(σ = 1 / t); t = 0 is no leakage (ε 0); a mechanism whose ε(1e-12) is infinite (σ = 0 under Poisson
    sampling: mass q at +inf) gives the curve g = 0 (anything distinguishable). Planted: ε read at σ = t, at σ = 0,
    or 0 for every t <= 1; g = 1 for the infinite curve -> fails."""
    from dpaudit.events import Gaussian, PoissonSampled

    q, steps, delta = 0.1, 3, 1e-5
    family = F.dpsgd_family(q, steps)
    for t in (0.5, 2.0):
        acc = make_accountant("pld").compose(dpsgd_event(noise_multiplier=1.0 / t, sample_rate=q, steps=steps))
        assert family.epsilon(t, delta) == acc.epsilon(delta)
    assert family.epsilon(0.0, delta) == 0.0
    blatant = F.event_family(lambda s: PoissonSampled(0.3, Gaussian(0.0)))
    assert [blatant.blowup_inverse(1.0)(y) for y in (0.0, 0.5, 1.0)] == [0.0, 0.0, 0.0]


# gdp capped at μ = 1.5 (below the 1.92 that 400 canaries refute): the search meets the family's largest parameter
@pytest.mark.parametrize(
    "family",
    [F.gdp_family(), F.epsilon_delta_family(1e-5), dataclasses.replace(F.gdp_family(), t_max=1.5)],
    ids=["gdp", "epsilon-delta", "gdp-capped"],
)
@pytest.mark.parametrize("m", [10, 50, 400])
def test_can_refute_decides_as_the_full_search_does(family, m):
    """`train --canaries` decides with :func:`can_refute` (a few curves) what ``max_certifiable`` (the full search)
    answers: a perfect attack refutes a curve above ε exactly when the design certifies more than ε. The ε shown
    is a refuted curve's, above ε (True), or an upper bound on what the design certifies (False). Where the design
    refutes even the family's largest parameter, a claim above that curve's ε is not refutable (an unchecked return
    there accepted it)."""
    _, best = F.max_certifiable(m, family, 1e-5, 0.05, "holdout")
    for eps in (0.1, 0.5 * best, 0.999 * best, best, 1.001 * best, 2.0 * best):
        ok, shown = F.can_refute(m, family, 1e-5, 0.05, "holdout", eps)
        assert ok == (best > eps), (eps, best, shown)
        assert shown > eps if ok else shown >= best * (1 - 1e-12)
    # At eps = best the search runs to its end undecided; what it shows must bound the design's ε from above, not
    # sit at the bracket's refuted end (best itself, below the true value by up to the bisection's tolerance).
    n_eval = m - m // 2
    kp, km = F._design_pairs(n_eval, "holdout", None, None)
    t_fine, _ = F.largest_refuted(n_eval, kp + km, kp + km, family, 0.05, tol=1e-9)
    _, shown = F.can_refute(m, family, 1e-5, 0.05, "holdout", best)
    assert shown >= family.epsilon(t_fine, 1e-5)


def test_the_parameter_search_stays_within_the_familys_range():
    """The doubling stops at ``t_max``, the largest parameter the family is searched to: 250 of 250 guesses right
    refute μ up to 1.79 (GDP), so a family capped at 1.5 returns 1.5 itself, not a μ beyond its range (mutant:
    doubling past t_max, 1 -> 2, then bisection to 1.79)."""
    capped = dataclasses.replace(F.gdp_family(), t_max=1.5)
    assert F.largest_refuted(500, [250], [250], capped, 0.05) == (1.5, 0)
    assert 1.7 < F.largest_refuted(500, [250], [250], F.gdp_family(), 0.05)[0] < 1.8


@pytest.mark.parametrize("family", [F.gdp_family(), F.epsilon_delta_family(1e-5)], ids=["gdp", "epsilon-delta"])
def test_largest_refuted_returns_a_refuted_parameter_at_the_bracket_end(family):
    """The refuted parameter t* (hence the ε lower bound) must be one the test rejected, never the bracket's
    unrefuted end: a search that returned its upper end read "violation" above what the guesses refute. Checked
    at t*: the pair returned rejects f_t*; and a little above (the bisection's tolerance), no pair rejects."""
    rng = np.random.default_rng(7)
    for m in (40, 200, 1000):
        ks = [int(k) for k in rng.integers(5, m // 2, size=3)]
        vs = [int(rng.integers(k // 2, k + 1)) for k in ks]
        t, i = F.largest_refuted(m, ks, vs, family, ALPHA)
        assert t > 0.0, (m, ks, vs)
        assert F.fdp_rejects(m, ks[i], vs[i], family.blowup_inverse(t), ALPHA)
        if t < family.t_max:
            above = family.blowup_inverse(t * (1 + 2 * F._PARAM_TOL) + 2e-3 * F._PARAM_TOL)
            assert not any(F.fdp_rejects(m, k, v, above, ALPHA) for k, v in zip(ks, vs, strict=True))


def test_fixed_guess_counts_are_the_users_and_the_bound_is_the_refuted_curve_of_the_hand_count():
    """A fixed design of the f-DP audit guesses "in" for the k₊ highest scores and "out" for the k₋ lowest (continuous
    scores: no ties); with v counted by hand the reported (ε, δ) bound is a curve the test rejects, and a curve just
    above it (the search's tolerance) is not rejected (fdp_rejects is checked against exact tail probabilities
    above). Without leakage nothing is refuted and the counts are still the user's. Planted (thirteenth mutation
    pass): the user's k₊ replaced by 0 in ``_design_pairs`` (the guesses, the bound and what a perfect attack
    certifies all silently for k₋ alone), v from one side only, the Bonferroni note on a one-test design, or the
    pair reported when nothing is refuted read at index 1 -> fail."""
    family = F.epsilon_delta_family(1e-5)
    rng = np.random.default_rng(8)
    m = 200
    member = rng.random(m) < 0.5
    for mu in (3.0, 0.0):
        scores = rng.normal(mu * member, 1.0)
        order = np.argsort(-scores)
        for kp, km in ((20, 10), (0, 16), (12, 0)):
            r = audit_scores(scores, member, method="one-run-fdp", design="canaries", tradeoff="epsilon-delta",
                             k_plus=kp or None, k_minus=km or None)  # fmt: skip
            v = int(member[order[:kp]].sum() + (~member[order[m - km :]]).sum())
            c = r.counts
            assert (c["k_plus"], c["k_minus"], c["guesses"], c["correct"]) == (kp, km, kp + km, v)
            assert r.details["n_tests"] == 1 and r.details["alpha_per_test"] == ALPHA
            assert not any("Bonferroni" in n for n in r.notes)  # one test: no union bound to report
            eps = r.epsilon_lower_bound
            above = family.blowup_inverse(eps * (1 + 2 * F._PARAM_TOL) + 2e-3 * F._PARAM_TOL)
            assert not F.fdp_rejects(m, kp + km, v, above, ALPHA)
            if mu > 0:  # a strong attack: some curve is refuted, and it is one the test rejects
                assert eps > 0.5 and F.fdp_rejects(m, kp + km, v, family.blowup_inverse(eps), ALPHA)
            else:
                assert eps == 0.0
            # what a perfect attack certifies with the same guess counts (v = k₊ + k₋)
            t, _ = F.largest_refuted(m, [kp + km], [kp + km], family, ALPHA)
            assert r.max_certifiable_epsilon == t


def test_holdout_max_certifiable_is_over_the_evaluation_half_the_audit_uses():
    """With an odd number of canaries the holdout split selects on m // 2 and evaluates on the other m - m // 2
    (holdout.split). What a perfect attack certifies is the search over the guess-count grid of that evaluation half
    and its every canary guessed (one_run.holdout_perfect_pairs: the thresholds can guess all; perfect: v = k), so
    it bounds the perfect attack's own holdout result; ``can_refute`` decides as it does.
    Planted (thirteenth mutation pass): the evaluation half taken as m // 2 (or m / 2) in max_certifiable or in
    can_refute survived every even m of the tests above; the holdout searched over bonferroni_pairs; can_refute's
    Bonferroni level alpha * K -> fail."""
    family = F.gdp_family()
    for m in (21, 51):
        mem = np.arange(m) % 2 == 0
        r = audit_scores(mem.astype(float), mem, method="one-run-fdp", design="canaries", seed=3,
                         threshold_selection="holdout")  # fmt: skip
        n_eval, a = r.counts["n_eval_canaries"], r.details["alpha_per_test"]
        assert n_eval == m - m // 2
        kp, km = one_run.holdout_perfect_pairs(n_eval)  # the grid the holdout chooses from, and all n_eval guessed
        t, _ = F.largest_refuted(n_eval, kp + km, kp + km, family, a)
        assert r.details["max_certifiable_parameter"] == t and 0.0 < r.epsilon_lower_bound <= r.max_certifiable_epsilon
        best = r.max_certifiable_epsilon
        assert F.can_refute(m, family, 1e-5, a, "holdout", 0.999 * best)[0]
        assert not F.can_refute(m, family, 1e-5, a, "holdout", 1.001 * best)[0]
        # Bonferroni: every pair of bonferroni_pairs(m) at alpha / K
        best = F.max_certifiable(m, family, 1e-5, a, "bonferroni")[1]
        assert F.can_refute(m, family, 1e-5, a, "bonferroni", 0.999 * best)[0]
        assert not F.can_refute(m, family, 1e-5, a, "bonferroni", 1.001 * best)[0]


def test_the_less_direction_audits_the_reversed_ranking_and_two_sided_takes_the_better_direction():
    """Members scored LOWER (mu = -3): the "less" alternative refutes what "greater" cannot (no member among the top
    scores), and a two-sided audit takes the better direction at alpha / 2 (its bound is the one-sided "less" bound
    at alpha / 2: the reversed ranking read by hand). Planted (thirteenth mutation pass): the "less" direction
    auditing the scores unreversed, or the two-sided audit keeping its first direction -> fail."""
    rng = np.random.default_rng(5)
    m = 200
    member = rng.random(m) < 0.5
    scores = rng.normal(-3.0 * member, 1.0)
    kw = dict(method="one-run-fdp", design="canaries", tradeoff="epsilon-delta", k_plus=20, k_minus=20)
    greater = audit_scores(scores, member, alternative="greater", **kw)
    less = audit_scores(scores, member, alternative="less", **kw)
    both = audit_scores(scores, member, alternative="two-sided", **kw)
    bonf = audit_scores(scores, member, alternative="less", **{**kw, "k_plus": None, "k_minus": None},
                        threshold_selection="bonferroni")  # fmt: skip
    a = bonf.details["alpha_per_test"]
    assert bonf.details["n_tests"] > 1 and a == pytest.approx(ALPHA / bonf.details["n_tests"])
    assert any(f"each test at alpha = {a:.3g} (Bonferroni)" in n for n in bonf.notes)
    assert greater.epsilon_lower_bound == 0.0 and less.epsilon_lower_bound > 1.0
    assert both.details["direction"] == "less" and 0.0 < both.epsilon_lower_bound <= less.epsilon_lower_bound
    half = audit_scores(-scores, member, alternative="greater", confidence=1 - ALPHA / 2, **kw)
    assert both.epsilon_lower_bound == half.epsilon_lower_bound
    assert both.counts["correct"] == less.counts["correct"] == half.counts["correct"]


def test_holdout_bound_is_the_refuted_curve_of_the_evaluation_half_counted_by_hand():
    """Holdout design: the guess counts (k₊, k₋) come from the selection half, the correct guesses v are counted by
    hand on the other half (the split drawn as the audit draws it), and the bound is a curve that v of k₊ + k₋
    guesses rejects, with the curve just above it not rejected. Three attacks: both sides informative, only the top
    (30% of members far above), only the bottom (30% of non-members far below): the holdout picks one-sided counts.
    Planted (thirteenth mutation pass): the evaluation skipped (bound 0) unless k₊ > 0, or unless k₋ > 0, instead
    of k₊ + k₋ > 0; the guesses reported as k₊ or k₋ alone; n_tests 0 or 2 -> fail."""
    from dpaudit.audit import bounds, holdout

    family = F.epsilon_delta_family(1e-5)
    m, seed = 400, 7  # a split where the bottom-only attack guesses none "in" (others add 1-3)
    rng = np.random.default_rng(4)
    mem = rng.random(m) < 0.5
    far = rng.random(m) < 0.3
    sides = []
    for s in (rng.normal(2.0 * mem, 1.0), rng.normal(6.0 * (mem & far), 1.0), rng.normal(-6.0 * (~mem & far), 1.0)):
        r = audit_scores(s, mem, method="one-run-fdp", design="canaries", tradeoff="epsilon-delta", seed=seed,
                         threshold_selection="holdout")  # fmt: skip
        sel = holdout.on_records(one_run.draw_design(m, "holdout", bounds._as_rng(seed))[1], s, mem)
        ev_s, ev_m = s[~sel], mem[~sel]
        c = r.counts
        kp, km, m_b = c["k_plus"], c["k_minus"], c["n_eval_canaries"]
        sides.append((kp > 0, km > 0))
        assert m_b == len(ev_s)
        order = np.argsort(-ev_s)
        v = int(ev_m[order[:kp]].sum() + (~ev_m[order[m_b - km :]]).sum())
        assert (c["guesses"], c["correct"]) == (kp + km, v)
        assert r.details["n_tests"] == 1 and r.details["alpha_per_test"] == ALPHA  # one test, on the evaluation half
        eps = r.epsilon_lower_bound
        assert eps > 0.5 and F.fdp_rejects(m_b, kp + km, v, family.blowup_inverse(eps), ALPHA)
        above = family.blowup_inverse(eps * (1 + 2 * F._PARAM_TOL) + 2e-3 * F._PARAM_TOL)
        assert not F.fdp_rejects(m_b, kp + km, v, above, ALPHA)
    assert sides[1:] == [(True, False), (False, True)], sides


@pytest.mark.parametrize("q", [1.0, 0.3, 0.02])
def test_one_step_family_curve_is_below_the_exact_trade_off_and_its_epsilon_is_zero_without_leakage(q):
    """Independent closed form: one Poisson-sampled Gaussian step, P = (1 − q)N(0, 1) + qN(μ, 1) vs Q = N(0, 1), has a
    monotone likelihood ratio, so its exact trade-off (Neyman–Pearson, threshold tests) is f(a) = (1 − q)(1 − a) +
    q·Φ(Φ⁻¹(1 − a) − μ) (remove), f⁻¹ for add (Dong, Roth & Su 2022, Def. 2.1 and Prop. 2.4 for the symmetrised
    curve); at q = 1 it is the μ-GDP curve. The family's curve g_t(y) must not exceed min(f, f⁻¹)(1 − y) (a curve
    above the mechanism's would refute a true claim), and stay within 0.02 of it at q = 1 (the ε grid's coarseness).
    ε(δ) of a curve without leakage (t = 0, or total variation ≤ δ) is 0: the verdict "curve-refuted" compares it
    with the claim. Planted (thirteenth mutation pass): ε reported 1 (not 0) there -> fail; g's grid mutants
    (range, size) are tightness only and pass."""
    fam = F.sampled_gaussian_step_family(q)

    def f(a, mu):
        return (1 - q) * (1 - a) + q * special.ndtr(special.ndtri(1 - a) - mu)

    ys = np.linspace(0.001, 0.999, 999)
    for mu in (0.2, 1.0, 2.5):
        fy = f(1 - ys, mu)
        # f⁻¹(1 − y) by bisection on the decreasing f
        lo, hi = np.zeros_like(ys), np.ones_like(ys)
        for _ in range(60):
            mid = (lo + hi) / 2
            right = f(mid, mu) > 1 - ys
            lo, hi = np.where(right, mid, lo), np.where(right, hi, mid)
        exact = np.minimum(fy, hi)
        g = fam.blowup_inverse(mu)
        ours = np.array([g(y) for y in ys])
        assert np.all(ours <= exact + 1e-9), (mu, float(np.max(ours - exact)))
        if q == 1.0:
            assert np.max(exact - ours) < 0.02
    assert fam.epsilon(0.0, 1e-5) == 0.0
    tiny = 1e-6  # total variation of one step at μ = 1e-6: about q·μ/√(2π) < δ = 1e-5
    assert fam.epsilon(tiny, 1e-5) == 0.0 and fam.epsilon(1.0, 1e-5) > 0.0


def test_no_refuted_curve_refutes_no_claim_whatever_the_familys_epsilon_there():
    """The thirteenth mutation pass: a family reporting epsilon 1 at t = 0 (no curve refuted) made the verdict
    'curve-refuted' against a claim of 0.5 while the statement said no curve was refuted. The decision now needs a
    refuted curve (t > 0) as well as its epsilon above the claim."""
    from dpaudit.audit import bounds, fdp_one_run
    from dpaudit.cli.audit import parse_tradeoff

    family = parse_tradeoff("dpsgd:1,1", "one-run-fdp")
    out = fdp_one_run.FdpOutcome(
        parameter=0.0, epsilon=1.0, max_parameter=1.0, max_certifiable=2.0, k_plus=10, k_minus=10, guesses=20,
        correct=10, n_eval=100, alpha_per_test=0.05, n_tests=1, note=None,
    )  # fmt: skip
    setup = bounds._Setup("one-run-fdp", "canaries", "greater", 1e-5, 0.05, 0.95, 0.5, "fixed")
    got = bounds._curve_refutation(family, out, setup)
    assert got["claimed_curve_refuted"] is False and got["refuted_noise_multiplier_from"] is None
    assert got["statement"].startswith("the claimed DP-SGD curve is not refuted: no dpsgd(q=1, T=1) curve is refuted")


def _exact_recursion_rejects(m, k, v, g, alpha) -> bool:
    """fdp_rejects' recursion in 50-digit mpmath (``g`` maps an mpf to an mpf), at exactly the float ``alpha``."""
    import mpmath as mp

    with mp.workdps(50):
        a = mp.mpf(alpha)
        r, h = a * v / m, a * (k - v) / m
        for i in range(v - 1, -1, -1):
            h_new = max(h, g(r))
            if h_new == h:
                break
            r, h = min(mp.mpf(1), r + mp.mpf(i) / (k - i) * (h_new - h)), h_new
        return r + h > mp.mpf(k) / m


def _exact_gdp_g(mu):
    import mpmath as mp

    return lambda y: mp.ncdf(mp.sqrt(2) * mp.erfinv(2 * y - 1) - mu) if 0 < y < 1 else mp.mpf(y > 0)


def _exact_eps_delta_g(eps, delta):
    import mpmath as mp

    e, d = mp.exp(mp.mpf(eps)), mp.mpf(delta)
    return lambda y: max(mp.mpf(0), 1 - d - e * (1 - y), (y - d) / e)


@pytest.mark.parametrize(
    ("m", "k", "v", "alpha", "family", "param"),
    [
        (300, 133, 92, 0.14757067140480049, "ed", (0.5691833506658144, 9.087527650185219e-06)),
        (30, 28, 23, 0.0013460636132350007, "gdp", (0.05958978569893622,)),
    ],
)
def test_the_recursion_rejects_only_where_exact_arithmetic_does(m, k, v, alpha, family, param):
    """Two boundary cases of benchmarks/stats_rounding.py's ``fdp`` section: before the margin the float recursion
    rejected at ``alpha`` (the smallest float α at which it did), while in exact arithmetic it first rejects 14.8
    and 7.5 ulps higher. Now it does not, and 1e-9 relative higher it does (the margin costs nothing visible).
    Planted: without the margin (fdp_one_run._RECURSION_ULPS = 0) both fail."""
    g, g_exact = (
        (F._gdp_g(*param), _exact_gdp_g(*param))
        if family == "gdp"
        else (F._eps_delta_g(*param), _exact_eps_delta_g(*param))
    )
    assert not _exact_recursion_rejects(m, k, v, g_exact, alpha)  # the case is on the boundary's safe side
    assert not F.fdp_rejects(m, k, v, g, alpha)
    assert F.fdp_rejects(m, k, v, g, alpha * (1 + 1e-9)) and _exact_recursion_rejects(
        m, k, v, g_exact, alpha * (1 + 1e-9)
    )
