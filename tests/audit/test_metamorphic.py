"""Metamorphic relations of the audit layer: changes of presentation that must not change a bound or a verdict
(record order, score direction, unrelated global RNG state) and changes of evidence that move a bound only one way
(more correct guesses, a smaller α, a larger δ, a larger claim). No oracle is needed: a violation is a bug."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.audit import audit_scores, decide_verdict, one_run_epsilon_lower_bound

DESIGN = {"clopper-pearson": "multi-run", "gdp": "multi-run", "one-run": "canaries", "one-run-fdp": "canaries"}
CASES = [(method, selection) for method in DESIGN for selection in ("holdout", "bonferroni")]


def _key(r):
    return r.epsilon_lower_bound, r.verdict, r.counts, r.threshold, r.max_certifiable_epsilon, r.details


def _scores(seed: int, n: int = 80):
    # Integer scores (many ties, members and non-members tied together) plus a signal: the order of tied records is
    # where a position-dependent design would show.
    rng = np.random.default_rng(seed)
    member = rng.permutation(np.arange(n) % 2 == 0)
    return rng.integers(0, 6, n) + 2.0 * member, member


@pytest.mark.parametrize("method", list(DESIGN))
def test_a_bonferroni_or_fixed_audit_depends_on_the_score_member_pairs_not_their_order(method):
    # Threshold audits read counts at thresholds, so ties stay in; the one-run ranking breaks ties by keys drawn per
    # position, so its scores here are distinct. (The holdout half is drawn per position too: see RESULTS.md,
    # "a metamorphic sweep of the attack and audit layers", for why the holdout design is left order-dependent.)
    fixed = {"threshold": 3.0} if method in ("clopper-pearson", "gdp") else {"k_plus": 10, "k_minus": 10}
    for seed in range(2):
        s, m = _scores(seed)
        if method.startswith("one-run"):
            s = s + np.random.default_rng(seed).random(len(s))
        p = np.random.default_rng(100 + seed).permutation(len(s))
        for design in ({"threshold_selection": "bonferroni"}, fixed):
            for alternative in ("greater", "two-sided"):
                kw = {"method": method, "design": DESIGN[method], "seed": 7, "claimed_epsilon": 0.5,
                      "alternative": alternative, **design}  # fmt: skip
                assert _key(audit_scores(s, m, **kw)) == _key(audit_scores(s[p], m[p], **kw)), (seed, design)


@pytest.mark.parametrize(("method", "selection"), CASES)
def test_less_on_scores_is_greater_on_their_negation_and_two_sided_ignores_the_sign(method, selection):
    s, m = _scores(3)
    s = s + 2.0 * m  # a signal strong enough that one direction wins outright
    kw = {"method": method, "design": DESIGN[method], "threshold_selection": selection, "seed": 2}
    less, greater = audit_scores(s, m, alternative="less", **kw), audit_scores(-s, m, **kw)
    assert less.epsilon_lower_bound == greater.epsilon_lower_bound and less.counts == greater.counts
    if method in ("clopper-pearson", "gdp"):
        assert less.threshold == -greater.threshold
    a, b = audit_scores(s, m, alternative="two-sided", **kw), audit_scores(-s, m, alternative="two-sided", **kw)
    assert a.epsilon_lower_bound == b.epsilon_lower_bound > 0.0
    # The same two tests in the other order: the winner is the same test, so the same counts.
    assert {a.details["direction"], b.details["direction"]} == {"greater", "less"} and a.counts == b.counts


@pytest.mark.parametrize(("method", "selection"), [("one-run-fdp", "holdout"), ("one-run-fdp", "bonferroni")])
def test_one_run_fdp_bounds_depend_on_ranks_only(method, selection):
    # test_bounds.py::test_bounds_depend_on_ranks_only checks the other methods.
    s, m = _scores(4)
    s = s + np.random.default_rng(4).random(len(s))  # distinct scores: a transform then keeps every rank
    kw = {"method": method, "design": "canaries", "threshold_selection": selection, "seed": 1}
    assert _key(audit_scores(s, m, **kw)) == _key(audit_scores(np.exp(s / 3) - 2.0, m, **kw))


@pytest.mark.parametrize(("method", "selection"), CASES[::3])
def test_an_audit_ignores_the_global_random_state(method, selection):
    s, m = _scores(5)
    kw = {"method": method, "design": DESIGN[method], "threshold_selection": selection, "seed": 3}
    results = []
    for state in (0, 12345):
        np.random.seed(state)  # noqa: NPY002 (the legacy global state is what an unseeded draw reads)
        torch.manual_seed(state)
        results.append(_key(audit_scores(s, m, **kw)))
    assert results[0] == results[1] == _key(audit_scores(s, m, **kw))


def test_a_fixed_threshold_bound_grows_with_correct_calls_and_with_copies_of_the_data():
    # At a fixed threshold the bound is a function of the counts: one more true positive (a member moved above the
    # threshold) never lowers it, and k copies of the data (k times every count) never lower it either.
    for seed in range(6):
        s, m = _scores(seed, 60)
        for method in ("clopper-pearson", "gdp"):
            kw = {"method": method, "design": "multi-run", "threshold": 4.0}
            base = audit_scores(s, m, **kw).epsilon_lower_bound
            i = np.flatnonzero(m & (s < 4.0))[0]
            better = audit_scores(np.where(np.arange(len(s)) == i, 9.0, s), m, **kw).epsilon_lower_bound
            twice = audit_scores(np.tile(s, 2), np.tile(m, 2), **kw).epsilon_lower_bound
            assert better >= base and twice >= base, (seed, method)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 2000).flatmap(
        lambda m: st.tuples(st.just(m), st.integers(1, m)).flatmap(
            lambda mr: st.tuples(st.just(mr[0]), st.just(mr[1]), st.integers(0, mr[1]))
        )
    ),
    st.floats(-8, -2),
    st.floats(-3, -0.5),
)
def test_one_run_bound_moves_one_way_with_the_evidence_and_the_level(mrv, log_delta, log_alpha):
    # Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846), Theorem 3.1 and Section 5: the p-value falls with more
    # correct guesses and rises with δ and with m (the 2mδ term), so the ε where it crosses α moves accordingly.
    m, r, v = mrv
    d, a = 10.0**log_delta, 10.0**log_alpha
    e = one_run_epsilon_lower_bound(m, r, v, d, a)
    slack = 1e-6 * max(1.0, e)  # the root search's relative tolerance (one_run._ROOT_TOL = 1e-7), with margin
    if v < r:
        assert one_run_epsilon_lower_bound(m, r, v + 1, d, a) >= e - slack
    if r < m:  # one more guess: right never lowers the bound, wrong never raises it
        assert one_run_epsilon_lower_bound(m, r + 1, v + 1, d, a) >= e - slack
        assert one_run_epsilon_lower_bound(m, r + 1, v, d, a) <= e + slack
    assert one_run_epsilon_lower_bound(m, r, v, d, a / 2) <= e + slack
    assert one_run_epsilon_lower_bound(m, r, v, min(0.5, 3 * d), a) <= e + slack
    assert one_run_epsilon_lower_bound(m + 10, r, v, d, a) <= e + slack


def test_a_larger_claim_never_turns_consistent_into_a_refutation():
    rng = np.random.default_rng(0)
    refuting = ("violation", "estimate-exceeds-claim")
    for _ in range(500):
        eps, most, claim = rng.exponential(), 2 * rng.exponential(), rng.exponential()
        for formal in (True, False):
            for curve in (False, True):
                before = decide_verdict(eps, claim, most, formal=formal, refutes_curve=curve)
                after = decide_verdict(eps, 1.5 * claim + 0.01, most, formal=formal, refutes_curve=curve)
                assert not (before not in refuting and after in refuting)
                stronger = decide_verdict(1.2 * eps + 0.01, claim, most, formal=formal, refutes_curve=curve)
                assert not (before in refuting and stronger not in refuting)
