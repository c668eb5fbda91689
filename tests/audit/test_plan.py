"""trials_needed / plan_design against max_certifiable_epsilon, the quantity they invert."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dpaudit.audit import DesignPlan, max_certifiable_epsilon, plan_design, trials_needed
from dpaudit.errors import InputError

SETTINGS = [
    # (target ε, keyword arguments)
    (1.0, {}),
    (3.0, {}),
    (6.0, {"delta": 0.0}),
    (3.0, {"threshold_selection": "bonferroni"}),
    (3.0, {"threshold_selection": "fixed"}),
    (4.0, {"method": "gdp"}),
    (3.0, {"alternative": "two-sided", "confidence": 0.99}),
    (3.0, {"method": "one-run", "delta": 0.0}),
    (3.0, {"method": "one-run"}),
    (2.0, {"method": "one-run", "threshold_selection": "bonferroni", "alternative": "two-sided"}),
    (2.0, {"method": "one-run-fdp", "tradeoff": "epsilon-delta"}),
]


def _certifiable(n, kwargs):
    if kwargs.get("method") in ("one-run", "one-run-fdp"):  # n canaries, about half included
        return max_certifiable_epsilon(n - n // 2, n // 2, **kwargs)
    return max_certifiable_epsilon(n, n, **kwargs)


@pytest.mark.parametrize(("target", "kwargs"), SETTINGS)
def test_one_fewer_trial_does_not_certify_and_the_answer_does(target, kwargs):
    n = trials_needed(target, **kwargs)
    assert _certifiable(n, kwargs) > target
    assert _certifiable(n - 1, kwargs) <= target
    assert "perfect attack" in trials_needed.__doc__


@pytest.mark.parametrize(
    ("target", "kwargs"), [s for s in SETTINGS if s[1].get("delta", 1e-5) > 0][:6:2] + SETTINGS[-2:]
)
def test_plan_reports_the_perfect_attack_size_beside_the_powered_one_in_the_right_unit(target, kwargs):
    # Against randomized response at 3x the claim (cheap to simulate): the powered size is at least the
    # perfect-attack size, which is trials_needed; the JSON key names the unit. The checks hold for any number of
    # simulations the plan accepts (>= 17 show power 0.8 at 95%: the too-few-draws test below);
    # 20, a few above it.
    plan = plan_design(target, true_epsilon=3 * target, family="randomized-response", simulations=20, **kwargs)
    n = trials_needed(target, **kwargs)
    one_run = kwargs.get("method", "").startswith("one-run")
    assert isinstance(plan, DesignPlan) and plan.perfect_attack_size == n <= plan.size
    assert plan.max_certifiable_epsilon == _certifiable(n, kwargs) > target
    assert plan.unit == ("canaries" if one_run else "runs per side") and plan.simulated_power >= 0.8
    d = plan.to_dict()
    key = "canaries" if one_run else "runs_per_side"
    assert d[key] == plan.size and d[f"perfect_attack_{key}"] == n and ("trials" not in d)
    assert "perfect attack" in plan.summary()


def test_acceptance_rr_3_vs_claim_2_power_is_what_the_plan_says():
    """Issue 27 acceptance: multi-run Clopper-Pearson (holdout), true randomized-response ε = 3, claim 2.
    The plan's run count, checked by an independent simulation of the real audit (600 fresh draws of
    randomized-response scores, n runs per side, audit_scores with design multi-run and fresh seeds):
    the claim is refuted with probability in [0.7, 0.95] (600 draws: sd 0.016 at 0.8)."""
    from dpaudit.audit import audit_scores

    plan = plan_design(2.0, true_epsilon=3.0, family="randomized-response")
    n = plan.size
    assert 59 < n < 400 and plan.perfect_attack_size == 59
    rng = np.random.default_rng(2027)
    member = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    q = np.exp(3.0) / (1 + np.exp(3.0))
    refuted = 0
    for i in range(600):
        scores = np.where(rng.random(2 * n) < q, member, ~member).astype(float)
        refuted += (
            audit_scores(scores, member, claimed_epsilon=2.0, design="multi-run", seed=10_000 + i).verdict
            == "violation"
        )
    assert 0.7 <= refuted / 600 <= 0.95, refuted / 600


def test_no_power_against_a_leak_that_is_not_above_the_claim():
    with pytest.raises(InputError, match="does not exceed the claim"):
        plan_design(2.0, true_epsilon=2.0, family="randomized-response")
    with pytest.raises(InputError, match="exactly one"):
        plan_design(2.0, true_epsilon=3.0, mu=1.0)
    with pytest.raises(InputError, match="not mu"):
        plan_design(2.0, mu=1.0, family="randomized-response")


def test_more_confidence_or_two_sides_cost_trials():
    base = trials_needed(3.0)
    assert trials_needed(3.0, confidence=0.99) > base
    assert trials_needed(3.0, alternative="two-sided") > base
    assert trials_needed(3.0, alternative="two-sided") == trials_needed(3.0, confidence=0.975)
    assert trials_needed(4.0) > base


@pytest.mark.parametrize("selection", ["holdout", "fixed"])
def test_max_certifiable_is_nondecreasing_for_holdout_and_fixed_designs(selection):
    # The monotonicity the bisection relies on (documented in trials_needed).
    v = [max_certifiable_epsilon(n, n, threshold_selection=selection) for n in range(2, 3000)]
    assert np.all(np.diff(v) >= 0)


def test_bonferroni_dips_are_small():
    # The anchor grid grows with n; documented: the dips stay within ~0.2% (checked for n < 3000).
    v = np.array([max_certifiable_epsilon(n, n, threshold_selection="bonferroni") for n in range(2, 3000)])
    rel = -np.diff(v) / np.maximum(v[:-1], 1e-300)
    assert rel.max() <= 0.0025


def test_one_run_with_delta_has_a_ceiling():
    # Through the 2mδ term (Steinke et al. 2023, Section 5) the one-run max certifiable ε peaks and then
    # falls as m grows: at δ = 1e-3 it peaks near 3.6 (about 500 canaries).
    with pytest.raises(InputError, match=r"out of reach of the one-run method at delta = 0.001.*peaks at about 3\.6"):
        trials_needed(4.0, method="one-run", delta=1e-3)
    assert trials_needed(3.0, method="one-run", delta=1e-3) < 512
    assert trials_needed(4.0, method="one-run", delta=0.0) > 0  # δ = 0 has no ceiling


def test_unreachable_within_max_trials():
    with pytest.raises(InputError, match=r"not certifiable with up to 1000 runs per side: at most 4\.91 \(at 1000\)"):
        trials_needed(8.0, max_trials=1000)
    assert trials_needed(4.0, max_trials=10**8) == trials_needed(4.0, max_trials=407)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((-1.0,), {}, "target_epsilon"),
        ((float("inf"),), {}, "finite"),
        ((float("nan"),), {}, "target_epsilon"),
        ((1.0,), {"delta": 1.0}, "delta"),
        ((1.0,), {"confidence": 1.0}, "confidence"),
        ((1.0,), {"method": "magic"}, "method"),
        ((1.0,), {"method": "gdp", "delta": 0.0}, "delta > 0"),
        ((1.0,), {"method": "one-run", "threshold_selection": "fixed"}, "one-run"),
        ((1.0,), {"alternative": "up"}, "alternative"),
        ((1.0,), {"max_trials": 0}, "max_trials"),
        ((1.0,), {"max_trials": 1}, "max_trials >= 2"),
        ((1.0,), {"method": "one-run", "max_trials": 3}, "max_trials >= 4 for this design"),  # the holdout's 4 canaries
        # the Bonferroni selection takes 2 canaries (mutant: the holdout's 4 asked of every one-run design)
        (
            (1.0,),
            {"method": "one-run", "threshold_selection": "bonferroni", "max_trials": 3},
            r"up to 3 canaries: .*\(at 2\)",
        ),
        # the smallest size itself is searched (mutant: `lo >= max_trials` said "expected max_trials >= 4, got 4")
        ((1.0,), {"method": "one-run", "max_trials": 4}, r"up to 4 canaries: at most 0 \(at 4\)"),
        ((1.0,), {"max_trials": 2}, r"up to 2 runs per side: at most 0 \(at 2\)"),
    ],
)
def test_bad_inputs(args, kwargs, message):
    with pytest.raises(InputError, match=message):
        trials_needed(*args, **kwargs)


def test_simulated_power_is_reported_with_its_clopper_pearson_interval_and_too_few_draws_are_refused():
    # Power from k of n simulated audits is a binomial estimate: its exact two-sided interval at the
    # plan's confidence is [Beta(k, n-k+1).ppf(α/2), Beta(k+1, n-k).ppf(1-α/2)] (Clopper & Pearson 1934).
    from scipy import stats

    plan = plan_design(2.0, true_epsilon=6.0, family="randomized-response", simulations=40)
    k, n = round(plan.simulated_power * 40), 40
    lo, hi = plan.simulated_power_interval
    assert lo == pytest.approx(stats.beta.ppf(0.025, k, n - k + 1) if k else 0.0, rel=1e-9)
    assert hi == pytest.approx(stats.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0, rel=1e-9)
    assert "estimated power" in plan.summary() and "rule: " in plan.summary()
    d = plan.to_dict()
    assert d["simulated_power"] == plan.simulated_power and tuple(d["simulated_power_interval"]) == (lo, hi)
    # Too few draws can never show power 0.8: 16 of 16 refuted give 0.025^(1/16) = 0.794 < 0.8; 17 give 0.805.
    assert stats.beta.ppf(0.025, 16, 1) < 0.8 <= stats.beta.ppf(0.025, 17, 1)
    with pytest.raises(InputError, match=r"^expected simulations >= 17 to show power 0\.8 at confidence 0\.95, got 5"):
        plan_design(2.0, true_epsilon=6.0, family="randomized-response", simulations=5)


@pytest.mark.parametrize(("power", "simulations", "confidence"), [(0.8, 200, 0.95), (0.9, 100, 0.99), (0.5, 17, 0.9)])
def test_refutations_needed_is_the_smallest_count_whose_interval_lower_end_reaches_the_power(
    power, simulations, confidence
):
    from scipy import stats

    from dpaudit.audit.power import refutations_needed

    k = refutations_needed(power, simulations, confidence)
    a = (1 - confidence) / 2
    assert stats.beta.ppf(a, k, simulations - k + 1) >= power > stats.beta.ppf(a, k - 1, simulations - k + 2)


def test_the_planned_size_is_chosen_on_the_power_lower_bound_not_the_point_estimate():
    """Issue: the search took the first size whose point estimate reached the power (RR 3 vs claim 2: 170 runs,
    estimate 0.815, interval 0.754 to 0.866 — power 0.8 not shown). Now the interval's lower end must reach it,
    and the plan says so."""
    from dpaudit.audit.power import refutations_needed

    plan = plan_design(2.0, true_epsilon=3.0, family="randomized-response")
    assert plan.simulated_power_interval[0] >= plan.power == 0.8
    k = refutations_needed(0.8, 200, 0.95)
    assert plan.refutations_needed == k == 172 and round(plan.simulated_power * 200) >= k
    assert f"at least {k} of 200 draws" in plan.summary() and "lower end of its 95% Clopper-Pearson" in plan.summary()


def test_a_gdp_plan_says_its_refutations_are_estimates_that_fail_on_violation_never_exits_on():
    # The simulation counts "estimate-exceeds-claim" as refuted; `audit train --method gdp --fail-on-violation`
    # never exits 1 on it. The plan used to say "needed to refute" with nothing about it.
    gdp = plan_design(1.0, method="gdp", simulations=20)
    assert not gdp.formal and gdp.to_dict()["formal"] is False
    assert "estimate-exceeds-claim" in gdp.summary() and "--fail-on-estimate" in gdp.note
    cp = plan_design(1.0, simulations=20)
    assert cp.formal and "estimate-exceeds-claim" not in cp.note


def test_a_one_run_fdp_plan_with_the_gdp_family_says_it_plans_an_estimate():
    # one-run-fdp's gdp family estimates μ (no formal bound): its plan is not formal, as method gdp's is not.
    # Planted: the family's check dropped -> "formal". A large leak keeps the simulated sizes small.
    gdp = plan_design(1.0, method="one-run-fdp", tradeoff="gdp", true_epsilon=8.0, simulations=20)
    assert not gdp.formal and gdp.to_dict()["formal"] is False and "(gdp family) gives an estimate" in gdp.note


@pytest.mark.parametrize("true_epsilon", [3.0, 1e9])
def test_a_gaussian_leak_given_by_its_epsilon_has_a_finite_mu_and_finite_scores(true_epsilon):
    # No fast test drew the gaussian family's scores (coverage). Its mu was inf above eps ~ 5e7 (the bracket of
    # gdp_mu_from_epsilon_delta stopped at mu = 1e4): `audit plan --epsilon 2 --true-epsilon 1e9 --family
    # gaussian` drew NaN scores and stopped with "scores must be finite".
    from dpaudit.accounting.gdp import gdp_delta
    from dpaudit.audit.power import hypothesised_leak

    leak = hypothesised_leak(family="gaussian", epsilon=true_epsilon, delta=1e-5)
    assert np.isfinite(leak.mu) and gdp_delta(leak.mu, true_epsilon) == pytest.approx(1e-5, rel=1e-6)
    member = np.arange(100) % 2 == 0
    scores = leak.sample(member, np.random.default_rng(0))
    assert np.all(np.isfinite(scores))
    # The members' scores are shifted by mu: N(mu, 1) against N(0, 1) (Dong, Roth & Su 2022, Def. 2.5).
    assert scores[member].mean() - scores[~member].mean() == pytest.approx(leak.mu, abs=5 * np.sqrt(2 / 50))


def test_simulated_power_is_the_exact_power_of_a_fixed_threshold_audit():
    """Randomized response at ε = 3 (each run's bit reported truthfully with probability p = e^3/(1 + e^3)), 15 runs
    per side, a claim of 1, the threshold fixed at 0.5: the audit sees tp ~ Bin(15, p) members at 1 and
    fp ~ Bin(15, 1 − p) non-members at 1, independently, so its exact power is the sum over (tp, fp) of the two
    binomial probabilities where the audit of those counts refutes (0.70 here). The simulation of 300 draws must
    agree within 4 standard errors (sqrt(P(1 − P)/300) = 0.026). Planted (tenth mutation pass): the truthful
    probability, the member bits or the refutation count of the simulation changed -> fail."""
    from scipy import stats

    from dpaudit.audit import audit_scores
    from dpaudit.audit.power import hypothesised_leak, simulated_power

    n, eps, claim = 15, 3.0, 1.0
    p = 1.0 / (1.0 + np.exp(-eps))
    mem = np.arange(2 * n) < n
    exact = 0.0
    for tp in range(n + 1):
        for fp in range(n + 1):
            s = np.r_[np.arange(n) < tp, np.arange(n) < fp].astype(float)
            if audit_scores(s, mem, claimed_epsilon=claim, threshold=0.5, design="multi-run").verdict == "violation":
                exact += stats.binom.pmf(tp, n, p) * stats.binom.pmf(fp, n, 1.0 - p)
    assert 0.3 < exact < 0.9
    leak = hypothesised_leak(family="randomized-response", epsilon=eps)
    sims = 300
    power = simulated_power(n, claim, leak, simulations=sims, threshold=0.5)
    assert abs(power - exact) <= 4.0 * np.sqrt(exact * (1.0 - exact) / sims)


def test_gaussian_leak_scores_are_unit_variance_in_each_class():
    """μ-GDP scores are N(μ, 1) for members and N(0, 1) for non-members (Dong, Roth & Su 2022, Def. 2.1): with 2000
    of each, the sample SDs are 1 within 5 standard errors (0.016 each) and the means μ and 0. Planted (tenth
    mutation pass): the unit noise dropped (members at exactly μ: a perfect attack, power overstated) -> fail."""
    from dpaudit.audit.power import hypothesised_leak

    leak = hypothesised_leak(family="gaussian", mu=1.0)
    member = np.arange(4000) % 2 == 0
    s = leak.sample(member, np.random.default_rng(5))
    for x, mean in ((s[member], 1.0), (s[~member], 0.0)):
        assert abs(x.std(ddof=1) - 1.0) <= 5 * np.sqrt(0.5 / 2000) and abs(x.mean() - mean) <= 5 * np.sqrt(1 / 2000)
    # and the leaks that cannot be simulated are refused by name
    with pytest.raises(InputError, match="expected a finite true epsilon"):
        hypothesised_leak(family="randomized-response", epsilon=float("inf"))
    with pytest.raises(InputError, match="the gaussian family needs delta > 0"):
        hypothesised_leak(family="gaussian", epsilon=1.0, delta=0.0)
    with pytest.raises(InputError, match="expected a finite true epsilon"):
        hypothesised_leak(family="gaussian", epsilon=float("inf"))


def test_one_run_draws_include_each_canary_with_probability_one_half_and_simulations_needed_is_the_smallest():
    """The one-run design the power is simulated for includes each canary independently with probability 1/2
    (Steinke, Nasr & Jagielski 2023): 4000 draws, the rate within 5 standard errors (0.04) of 1/2; the multi-run
    design has n of each. simulations_needed is the smallest S whose all-refuted interval's lower end
    ((1 − confidence)/2)^(1/S) reaches the power, by direct search from S = 1. Planted (tenth mutation pass): the
    inclusion probability 1/4 (power of another design), the search started at 2 -> fail."""
    from dpaudit.audit.power import _draw, hypothesised_leak, simulated_power, simulations_needed

    leak = hypothesised_leak(family="randomized-response", epsilon=1.0)
    _, member = _draw(leak, 4000, True, np.random.default_rng(0))
    assert abs(member.mean() - 0.5) <= 5 * np.sqrt(0.25 / 4000)
    _, member = _draw(leak, 7, False, np.random.default_rng(0))
    assert member.tolist() == [True] * 7 + [False] * 7
    # Two canaries: half the draws include both or neither; those cannot be audited and count as not refuted (the
    # audit would refuse a single class). Planted: the check dropped -> InputError from the simulation.
    assert simulated_power(2, 1.0, leak, simulations=20, method="one-run", threshold_selection="bonferroni") == 0.0
    for power, confidence in ((0.8, 0.95), (0.01, 0.95), (0.5, 0.9), (0.9, 0.99), (0.02, 0.5)):
        a = (1.0 - confidence) / 2.0
        smallest = next(n for n in range(1, 10_000) if a ** (1.0 / n) >= power)
        assert simulations_needed(power, confidence) == smallest, (power, confidence)


def test_size_for_power_called_without_a_confidence_decides_at_the_audits_default():
    """size_for_power is public: called without ``confidence`` the audits run at audit_scores' default 0.95, so the
    rule must be the 95% one (20 of 20 draws for power 0.8). Randomized response at ε = 6 against a claim of 1,
    20 draws: the size returned must have every draw refuted. Planted (tenth mutation pass): the rule's default
    confidence 0.475 (18 of 20: a size whose power 0.8 is not shown at 95%) -> fail."""
    from dpaudit.audit.power import hypothesised_leak, refutations_needed, size_for_power

    leak = hypothesised_leak(family="randomized-response", epsilon=6.0)
    _, power = size_for_power(1.0, leak, simulations=20, start=2)
    assert round(power * 20) >= refutations_needed(0.8, 20, 0.95) == 20
    # A design cap below what the leak needs is an error naming the cap (planted: the raise dropped, or the cap
    # compared with ">": the search doubled at the cap forever). 16, where the most powerful test on the holdout's
    # 8 evaluation runs per side has power 0.999 but the audit none: the simulated path (a cap of 8 is refused before
    # simulating now, as the bound on its 4 evaluation runs is 0.60).
    with pytest.raises(InputError, match=r"no design up to 16 runs per side is shown to reach power 0\.8"):
        size_for_power(1.0, leak, simulations=20, start=2, max_size=16)
    # There no randomized-response leak at all reaches 0.8 (its bound saturates at 0.60): said so, where the search
    # for the plannable leak doubled epsilon to inf and answered "expected a finite true epsilon".
    with pytest.raises(InputError, match=r"no design up to 8 runs per side can refute epsilon = 1.*no randomized-resp"):
        size_for_power(1.0, leak, simulations=20, start=2, max_size=8)


def _fake_power(monkeypatch, power_at) -> None:
    """size_for_power's simulations replaced by ``power_at(size)``, the fraction of draws that refute (all drawn)."""
    from dpaudit.audit import power as pw

    def fake(n, *a, simulations, **k):
        return round(power_at(n) * simulations), simulations

    monkeypatch.setattr(pw, "_simulate", fake)


def test_a_leak_no_sound_audit_detects_within_the_cap_is_refused_without_simulating(monkeypatch):
    """`audit plan --epsilon 2 --true-epsilon 2.0000001` simulated ever larger designs up to the cap of 10^6 runs per
    side, each costlier than the last (still running after 100 s). Even the most powerful level-α test of the claim
    against such a leak has power ~α there, so no sound audit can reach 0.8: refused at once, naming the bound and
    the leak that could be planned. Planted: the bound's check dropped (the simulator is called)."""

    calls = []
    _fake_power(monkeypatch, lambda n: calls.append(n) or 0.0)
    for kwargs in ({"true_epsilon": 2.0000001}, {"true_epsilon": 2.0000001, "method": "one-run"},
                   {"true_epsilon": 2.01, "family": "gaussian"}):  # fmt: skip
        with pytest.raises(InputError) as e:
            plan_design(2.0, **kwargs)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("no design up to 1000000 "), msg
        assert "even the most powerful test at level 0.05 (Neyman-Pearson) has power at most 0." in msg, msg
        assert "a leak must exceed epsilon 2.0" in msg and f"leak of epsilon {kwargs['true_epsilon']:g}" in msg, msg
    assert calls == []


def test_the_power_bound_is_the_most_powerful_tests_power():
    """power_upper_bound by hand. Randomized response, 1 run per side, claim 0: T (bits equal to membership) ~
    Bin(2, 1/2) under the claim; the level-0.05 Neyman-Pearson test rejects at T = 2 with probability 0.05/0.25, so
    its power is 0.2 p² with p = e^ε/(1 + e^ε). Gaussian: members' sum, power Φ(√n (μ − μ0) − z_0.95), with n the
    runs per side (canaries) the test reads: with holdout selection the evaluation part's, 15 of 30 (the bound at 30
    was the whole design's, twice what a holdout audit can use). The estimate audits (gdp, one-run-fdp against the
    gdp family) have no level: no bound."""
    from scipy import special, stats

    from dpaudit.accounting.gdp import gdp_mu_from_epsilon_delta
    from dpaudit.audit.power import hypothesised_leak, power_upper_bound

    rr = hypothesised_leak(family="randomized-response", epsilon=1.5)
    assert power_upper_bound(1, 0.0, rr, method="clopper-pearson") == pytest.approx(0.2 * special.expit(1.5) ** 2)
    g = hypothesised_leak(family="gaussian", mu=2.0, delta=1e-5)
    mu0 = gdp_mu_from_epsilon_delta(1.0, 1e-5)
    want = stats.norm.cdf(np.sqrt(15) * (2.0 - mu0) - stats.norm.ppf(0.95))
    whole = stats.norm.cdf(np.sqrt(30) * (2.0 - mu0) - stats.norm.ppf(0.95))
    for method in ("clopper-pearson", "one-run"):
        assert power_upper_bound(30, 1.0, g, method=method) == pytest.approx(want, rel=1e-6)
        assert power_upper_bound(31, 1.0, g, method=method) == pytest.approx(
            stats.norm.cdf(np.sqrt(16) * (2.0 - mu0) - stats.norm.ppf(0.95)), rel=1e-6
        )
        assert power_upper_bound(30, 1.0, g, method=method, threshold_selection="bonferroni") == pytest.approx(whole)
    assert power_upper_bound(30, 1.0, g, method="gdp") is None
    assert power_upper_bound(30, 1.0, g, method="one-run-fdp") is None  # audit_scores' default family: gdp
    assert power_upper_bound(30, 1.0, g, method="one-run-fdp", tradeoff="epsilon-delta") == pytest.approx(want)


def test_a_size_the_most_powerful_test_rules_out_is_never_returned(monkeypatch):
    """A simulator that refutes every draw (as a fluke of 200 draws can at one size) made the search return the
    start, 59 runs per side, against a leak of 2.1 for a claim of 2, where no sound audit has power above 0.1. The
    decision still reads exact refutation counts, and also needs the bound. Planted: the bound not consulted."""
    from dpaudit.audit.power import hypothesised_leak, power_upper_bound, size_for_power

    _fake_power(monkeypatch, lambda n: 1.0)
    leak = hypothesised_leak(family="randomized-response", epsilon=2.1)
    audit = {"method": "clopper-pearson", "delta": 1e-5, "confidence": 0.95}
    n, _ = size_for_power(2.0, leak, start=59, **audit)
    assert power_upper_bound(59, 2.0, leak, **audit) < 0.1
    assert power_upper_bound(n, 2.0, leak, **audit) >= 0.8 > power_upper_bound(int(0.9 * n), 2.0, leak, **audit)


def test_a_large_simulated_size_is_announced_before_it_runs(monkeypatch):
    """`audit plan --epsilon 2 --true-epsilon 2.01` ran for minutes without a word (the sizes simulated are near the
    10^6 cap). Each size from 10^5 up is announced first, naming the leak and the claim; small ones are not."""
    from dpaudit.audit.power import hypothesised_leak, size_for_power
    from dpaudit.progress import notices

    said = []
    _fake_power(monkeypatch, lambda n: 1.0 if n >= 900_000 else 0.0)
    with notices(said.append):
        size_for_power(2.0, hypothesised_leak(family="randomized-response", epsilon=2.01), start=59, delta=1e-5)
    # Naming the leak and the claim, not a cause: `audit plan --method one-run --epsilon 8` (leak 16, far from the
    # claim, near the one-run ceiling) was told "a leak of epsilon 16 is close to the claim (8)". Planted: that text.
    assert said and all("audits of" in m and "leak of epsilon 2.01 for a claim of 2;" in m for m in said), said
    assert not any("close" in m for m in said), said
    assert any("966,656 runs per side" in m for m in said), said
    said.clear()
    _fake_power(monkeypatch, lambda n: 1.0 if n >= 200 else 0.0)
    with notices(said.append):
        size_for_power(2.0, hypothesised_leak(family="randomized-response", epsilon=4.0), start=59, delta=1e-5)
    assert said == []


def test_a_size_the_bound_rules_out_is_never_simulated(monkeypatch):
    """`audit plan --epsilon 2 --true-epsilon 2.01` simulated 483,328 runs per side (91 s here, power 0.505) where a
    holdout audit, testing on half of them, has power at most 0.727 < 0.8; and the bracket's lower end and the
    bisection's midpoints were simulated even where the bound rules them out. Planted: the whole design in the bound,
    or p(lo) / p(mid) simulated regardless (recorded here)."""
    from dpaudit.audit.power import hypothesised_leak, power_upper_bound, size_for_power

    simulated = []

    def fake(n):
        simulated.append(n)
        return 1.0 if n >= 20_000 else 0.0

    _fake_power(monkeypatch, fake)
    leak = hypothesised_leak(family="randomized-response", epsilon=2.05)
    audit = {"method": "clopper-pearson", "delta": 1e-5, "confidence": 0.95}
    n, _ = size_for_power(2.0, leak, start=59, **audit)
    assert simulated and all(power_upper_bound(m, 2.0, leak, **audit) >= 0.8 for m in simulated), simulated
    assert power_upper_bound(n, 2.0, leak, **audit) >= 0.8 and n >= 20_000
    whole = {**audit, "threshold_selection": "bonferroni"}  # the bound on the whole design
    assert power_upper_bound(15_104, 2.0, leak, **whole) >= 0.8 > power_upper_bound(15_104, 2.0, leak, **audit)


def _np_power_by_enumeration(records: int, eps0: float, eps1: float, alpha: float) -> float:
    """The randomized Neyman-Pearson test of Bin(N, p0) against Bin(N, p1), p = e^ε/(1 + e^ε), by enumeration in 40
    digits: outcomes T = N, N - 1, ... in decreasing likelihood ratio (p1 > p0) are rejected while their null mass
    fits in α; the first that does not is rejected with the fraction of its mass that does."""
    import mpmath

    with mpmath.workdps(40):
        p0, p1 = (mpmath.e**e / (1 + mpmath.e**e) for e in (mpmath.mpf(eps0), mpmath.mpf(eps1)))
        size, power = mpmath.mpf(0), mpmath.mpf(0)
        for t in range(records, -1, -1):
            m0 = mpmath.binomial(records, t) * p0**t * (1 - p0) ** (records - t)
            m1 = mpmath.binomial(records, t) * p1**t * (1 - p1) ** (records - t)
            if size + m0 <= alpha:
                size, power = size + m0, power + m1
            else:
                return float(power + (alpha - size) / m0 * m1)
        return float(power)


@pytest.mark.parametrize(
    ("n", "claim", "leak", "method", "confidence"),
    [
        (7, 1.0, 3.0, "one-run", 0.95),  # one run: n canaries are N = n records
        (7, 1.0, 3.0, "clopper-pearson", 0.95),  # multi-run: n runs per side are N = 2n records
        (1, 0.0, 2.0, "one-run", 0.95),  # N = 1: T = 1 rejected with probability 0.05 / (1/2)
        (300, 2.0, 2.4, "clopper-pearson", 0.9),
        (400, 0.5, 0.8, "one-run-fdp", 0.99),  # the one-run f-DP test against the (ε, δ) curve has a level too
    ],
)
def test_randomized_response_power_bound_is_the_neyman_pearson_power_by_enumeration(n, claim, leak, method, confidence):
    """power_upper_bound for the randomized-response family against the most powerful test written out by
    enumeration (the earlier by-hand check had one run per side at claim 0 only: the one-run design's record count,
    the critical count's search and the randomization at it were not pinned)."""
    from dpaudit.audit.power import hypothesised_leak, power_upper_bound

    rr = hypothesised_leak(family="randomized-response", epsilon=leak)
    kw = {"tradeoff": "epsilon-delta"} if method == "one-run-fdp" else {}
    for selection, tested in (("holdout", n - n // 2), ("bonferroni", n)):  # holdout: its evaluation part only
        got = power_upper_bound(n, claim, rr, method=method, confidence=confidence, threshold_selection=selection, **kw)
        records = tested if method.startswith("one-run") else 2 * tested
        want = _np_power_by_enumeration(records, claim, leak, 1.0 - confidence)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_the_leak_a_refusal_names_is_the_smallest_the_most_powerful_test_detects():
    """The refusal's "a leak must exceed epsilon e" (power.py's _leak_needed) against closed forms. Gaussian: the
    bound Φ(√n (μ − μ0) − z_{1−α}) reaches the power P at μ* = μ0 + (z_{1−α} + z_P)/√n; μ0 and ε* = ε(μ*) from
    the μ-GDP curve δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth & Su 2022, Cor. 2.13), solved here
    with brentq. Randomized response: the enumerated Neyman-Pearson power, bisected in ε."""
    from scipy import optimize, stats

    from dpaudit.audit.power import _leak_needed, hypothesised_leak

    def gdp_delta(eps, mu):
        return stats.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)

    delta, claim, n, power, conf = 1e-5, 1.0, 50, 0.8, 0.95
    mu0 = optimize.brentq(lambda mu: gdp_delta(claim, mu) - delta, 1e-3, 20, xtol=1e-14, rtol=1e-15)
    tested = n - n // 2  # audit_scores' default threshold selection (holdout) tests on this evaluation part
    mu_star = mu0 + (stats.norm.ppf(conf) + stats.norm.ppf(power)) / np.sqrt(tested)
    eps_star = optimize.brentq(lambda e: gdp_delta(e, mu_star) - delta, 0, 50, xtol=1e-14, rtol=1e-15)
    leak = hypothesised_leak(family="gaussian", epsilon=1.1, delta=delta)
    got = _leak_needed(claim, leak, n, power, method="clopper-pearson", confidence=conf, delta=delta)
    assert got == pytest.approx(eps_star, rel=1e-6)
    # The bound itself off saturation (the by-hand test's gaussian case has power 1 - 3e-15), with the audit's
    # default δ = 1e-5 (no delta given).
    from dpaudit.audit.power import power_upper_bound

    near = hypothesised_leak(family="gaussian", mu=mu0 + 0.5, delta=delta)
    want = stats.norm.cdf(np.sqrt(5) * 0.5 - stats.norm.ppf(conf))  # 10 runs per side, 5 in the evaluation part
    assert power_upper_bound(10, claim, near, method="clopper-pearson") == pytest.approx(want, rel=1e-6)

    claim, n, power = 1.0, 10, 0.9  # needs ε ≈ 3.1, above the search's first upper end 2 × 1.01: it doubles
    lo, hi = claim, 20.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _np_power_by_enumeration(2 * (n - n // 2), claim, mid, 0.05) >= power else (mid, hi)
    rr = hypothesised_leak(family="randomized-response", epsilon=1.01)
    got = _leak_needed(claim, rr, n, power, method="clopper-pearson", confidence=0.95)
    assert got == pytest.approx(hi, rel=1e-6)


def test_the_summary_prints_the_perfect_attacks_max_certifiable_above_the_claim():
    """The perfect-attack size is the smallest whose max certifiable ε is above the claim; the summary prints the
    two so that they read so (dpaudit.numfmt.against). Rounded up each on its own, a claim of 1.9999951 and a max
    certifiable 1.9999952 both read "2". The hypothesised leak's δ prints as given (":g" read 1/70000 as
    1.42857e-05)."""
    import dataclasses
    import re
    from decimal import Decimal

    plan = plan_design(2.0, true_epsilon=6.0, family="randomized-response", simulations=20)
    plan = dataclasses.replace(plan, target_epsilon=1.9999951, max_certifiable_epsilon=1.9999952)
    text = plan.summary()
    claim = Decimal(re.search(r"needed to refute epsilon = (\S+) with", text).group(1))
    most = Decimal(re.search(r"max certifiable epsilon there (\S+)\)", text).group(1))
    assert most > claim and float(claim) >= 1.9999951, text
    leak = {**plan.leak, "family": "gaussian", "mu": 1.0, "delta": 1 / 70000}
    assert "at delta 1.4285714285714285e-05)" in dataclasses.replace(plan, leak=leak).summary()


def test_size_advice_names_the_perfect_attack_minimum_when_no_simulated_size_has_power():
    """size_advice's third branch: plan_design refuses (no size up to 32 times the perfect-attack minimum reaches 80%
    power against a leak of 1.05 for a claim of 1), so the phrase is the minimum with plan_design's reason, and
    does not point to `dpaudit audit plan` itself (the refusal adds the pointer). Planted: points_to_plan True,
    the return dropped, the search cap 31, 33 times n0, n0 alone or n0/32 (each passed the other tests)."""
    from dpaudit.audit.plan import size_advice

    advice = size_advice(1.0, method="clopper-pearson", delta=1e-5, true_epsilon=1.05)
    assert advice.points_to_plan is False
    assert advice.text.startswith("at least 23 runs per side even for a perfect attack (no design up to 736 runs per")


def test_the_one_run_ceiling_is_taken_where_and_at_the_level_the_audit_computes():
    """power._one_run_ceiling against the design's perfect attack (max_certifiable_epsilon, the audit's own guess
    counts): at most 1e-4 above it (Bonferroni: 1e-3), never below, at odd sizes (holdout evaluates size - size // 2
    canaries), two-sided (alpha/2 per direction), Bonferroni (alpha over the grid, on all m) and at 99%. None where the
    claim is below it, and for the other methods. Plants caught: size // 2 or size - size // 2 + 1 canaries, alpha
    not halved, the Bonferroni split dropped, delta 1e-5 (the default) in place of the audit's."""
    from dpaudit.audit.power import _one_run_ceiling

    cases = (
        (201, {"delta": 1e-2}),
        (1601, {"delta": 1e-3, "alternative": "two-sided"}),
        (1601, {"delta": 1e-4, "threshold_selection": "bonferroni"}),
        (3201, {"delta": 3e-6, "confidence": 0.99, "threshold_selection": "bonferroni", "alternative": "two-sided"}),
    )
    for size, kwargs in cases:
        perfect = max_certifiable_epsilon(size - size // 2, size // 2, method="one-run", **kwargs)
        ceiling = _one_run_ceiling(size, 50.0, method="one-run", **kwargs)
        # Bonferroni's perfect attack guesses only the grid's counts: up to 1e-3 below an attack free to choose them.
        tol = 1e-3 if kwargs.get("threshold_selection") == "bonferroni" else 1e-4
        assert 0.0 < perfect <= ceiling <= perfect + tol, (size, kwargs, perfect, ceiling)
        assert _one_run_ceiling(size, perfect, method="one-run", **kwargs) is None  # the perfect attack refutes less
    for method in ("clopper-pearson", "gdp", "one-run-fdp"):
        assert _one_run_ceiling(201, 50.0, method=method, delta=1e-2) is None


def test_a_one_run_plan_past_the_ceiling_is_refused_naming_it_and_the_slow_path_agrees(monkeypatch):
    """`audit plan --method one-run --epsilon 8` simulated every doubling up to the 10^6 cap (minutes), although past
    about 830,000 canaries no outcome of the audit certifies 8 (the 2*m*delta term of Steinke et al. 2023). Sizes at
    or past the one-run ceiling are not simulated (their power is exactly 0) and a cap past it is refused naming the
    ceiling there and the largest size simulated. Here: a claim of 0.85 at delta 1e-2 (perfect attack from 29
    canaries, ceiling 0.787 at 232). The search without the ceiling (the old path) simulates 232 too and also finds
    no refutation there. Plants caught: the ceiling not consulted (232 simulated), the refusal naming the cap's
    power instead, a ceiling at the wrong delta (232 simulated: 1e-5's ceiling is above 0.85)."""
    from dpaudit.audit import power as pw

    real, calls = pw._simulate, []

    def counting(n, *a, **k):
        calls.append(n)
        return real(n, *a, **k)

    monkeypatch.setattr(pw, "_simulate", counting)
    kwargs = {"method": "one-run", "delta": 1e-2, "max_size": 232, "simulations": 100}
    with pytest.raises(InputError) as e:
        plan_design(0.85, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("no design up to 232 canaries is shown to reach power 0.8 "), msg
    assert "at 232 canaries no one-run audit certifies epsilon 0.85 whatever its guesses (at most 0.7874 at " in msg
    assert f"; at {max(calls)} canaries the simulated audit refuted the claim in 0 of the first " in msg, msg
    assert "audit independent runs instead" in msg, msg
    assert 232 not in calls and calls, calls
    assert all(pw._one_run_ceiling(n, 0.85, method="one-run", delta=1e-2) is None for n in calls), calls
    fast = list(calls)
    calls.clear()
    monkeypatch.setattr(pw, "_one_run_ceiling", lambda *a, **k: None)  # the search as it was
    with pytest.raises(InputError) as e:
        plan_design(0.85, **kwargs)
    # stopped once 100 - 89 + 1 = 12 draws failed: not enough, as the full 100 draws decide it
    assert (
        "at 232 canaries the simulated audit refuted the claim in 0 of the first 12 of 100 draws, so in at most 88, "
        "89 needed (the rest were not simulated)"
    ) in str(e.value), str(e.value)
    assert calls[: len(fast)] == fast and 232 in calls, (fast, calls)


def test_the_ceiling_refusal_names_the_largest_size_simulated_at_the_audits_default_delta():
    """_ceiling_refusal reports the simulation at the largest size simulated (the one nearest the cap), however the
    sizes were reached; _one_run_ceiling without a delta takes the audit's own default (audit_scores' 1e-5) on the
    holdout's 100,001 evaluated canaries of 200,001. Plants caught: min(simulated) in place of max, the default delta
    2e-5 or 5e-6."""
    import inspect

    from dpaudit.audit import one_run
    from dpaudit.audit import power as pw
    from dpaudit.audit.bounds import audit_scores

    default = inspect.signature(audit_scores).parameters["delta"].default
    # 100,001 evaluated canaries: the 2*m*delta term sets the ceiling (8.128 at 1e-5; 7.367 at 2e-5, 8.897 at 5e-6)
    ceiling = pw._one_run_ceiling(200_001, 50.0, method="one-run")
    assert ceiling == one_run.certifiable_ceiling(100_001, default, 0.05) == pytest.approx(8.128, abs=1e-3)
    leak = pw.hypothesised_leak(epsilon=16.0)
    text = pw._ceiling_refusal(
        8.0, leak, 0.8, 3200, 7.5, {400: (46, 100), 100: (10, 100), 200: (30, 100)}, 100, 80, 1e-5
    )
    assert "simulated power at 400 canaries 0.46 (the simulated audit refuted the claim in 46 of 100 draws, 80 " in text
    assert "no design up to 3200 canaries" in text and "at most 7.5 at delta 1e-05" in text, text


def test_a_sizes_simulation_stops_once_it_cannot_show_the_power_and_decides_as_all_draws_would(monkeypatch):
    """`audit plan --method one-run --epsilon 8` ran all 200 audits at every size the search doubled through (minutes
    at 10^5-10^6 canaries), although 29 failed draws already settle that a size cannot reach the 172 refutations power
    0.8 needs. _simulate stops there, and only there: on a scripted stream of verdicts, a run that can still reach
    the count exactly is drawn to the end; one that cannot is cut at the first draw that settles it. Plants caught:
    `<=` for `<` (a size that reaches exactly k cut short), no stop at all."""
    from dpaudit.audit import bounds
    from dpaudit.audit import power as pw

    leak = pw.hypothesised_leak(family="randomized-response", epsilon=3.0)
    cases = (("FFFFFRRRRR", (5, 10)), ("FFFFFFRRRR", (0, 6)), ("RFRFFFFFRR", (2, 8)), ("RRRRRRRRRR", (10, 10)))
    for stream, want in cases:
        verdicts = iter("violation" if c == "R" else "consistent" for c in stream)
        monkeypatch.setattr(bounds, "audit_scores", lambda *a, v=verdicts, **k: SimpleNamespace(verdict=next(v)))
        assert pw._simulate(20, 2.0, leak, simulations=10, seed=0, stop_below=5) == want, stream


def test_a_plan_with_stopped_simulations_is_the_plan_full_simulations_give(monkeypatch):
    """The doubling's stopped sizes decide as all their draws would, and the bracket (whose secant reads the
    estimates) simulates in full: the plan and its simulated power are those of full simulations at every size, and
    a refusal at the cap names the draws that settled it. Plant caught: the bracket's lower end read from its stopped
    simulation."""
    from dpaudit.audit import power as pw

    real, stops = pw._simulate, []

    def full(n, *a, stop_below=0, **k):
        stops.append(stop_below)
        return real(n, *a, **k)

    for claim, true in ((2.0, 3.0), (1.0, 1.6)):
        plan = plan_design(claim, true_epsilon=true, family="randomized-response", simulations=100)
        monkeypatch.setattr(pw, "_simulate", full)
        assert plan_design(claim, true_epsilon=true, family="randomized-response", simulations=100) == plan
        assert any(stops), "the search asked for stopped simulations"
        monkeypatch.undo()
