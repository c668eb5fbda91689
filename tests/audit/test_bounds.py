"""audit_scores: input validation, designs and verdicts, directions, power checks, pure noise and tightness."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpaudit.accounting.gdp import gdp_epsilon
from dpaudit.audit import AuditResult, audit_scores, decide_verdict, max_certifiable_epsilon
from dpaudit.audit.result import DESIGNS, METHODS, VERDICTS
from dpaudit.errors import InputError

from .mechanisms import gdp_scores

METHOD_SELECTIONS = [
    ("clopper-pearson", "holdout"),
    ("clopper-pearson", "bonferroni"),
    ("gdp", "holdout"),
    ("gdp", "bonferroni"),
    ("one-run", "holdout"),
    ("one-run", "bonferroni"),
]
KEYS = {
    "epsilon_lower_bound", "method", "confidence", "delta", "claimed_epsilon", "verdict", "max_certifiable_epsilon",
    "counts", "threshold", "threshold_selection", "formal", "design", "notes",
}  # fmt: skip
# The design under which each method can be formal (gdp never is).
FORMAL_DESIGN = {"clopper-pearson": "multi-run", "gdp": "multi-run", "one-run": "canaries"}


def _data(n=200, mu=1.0, seed=0):
    rng = np.random.default_rng(seed)
    return np.r_[rng.normal(mu, 1, n), rng.normal(0, 1, n)], np.r_[np.ones(n, bool), np.zeros(n, bool)]


# ---- input validation -------------------------------------------------------------------------------

S, M = _data()
BAD_INPUTS = [
    ({"scores": S[:-1]}, "differ in length"),
    ({"scores": np.where(np.arange(len(S)) == 3, np.nan, S)}, "NaN/inf"),
    ({"scores": np.where(np.arange(len(S)) == 5, np.inf, S)}, "NaN/inf"),
    ({"scores": ["a"] * len(S)}, "numeric"),
    ({"scores": S.reshape(2, -1), "member": M.reshape(2, -1)}, "1-D"),
    ({"member": np.ones(len(S), bool)}, "single class"),
    ({"member": np.zeros(len(S))}, "single class"),
    ({"member": np.full(len(S), 2)}, "0/1"),
    ({"confidence": 1.0}, "confidence"),
    ({"confidence": 0.0}, "confidence"),
    ({"confidence": float("nan")}, "confidence"),
    ({"delta": 1.0}, "delta"),
    ({"delta": -1e-9}, "delta"),
    ({"method": "magic"}, "method"),
    ({"threshold_selection": "peek"}, "threshold_selection"),
    ({"claimed_epsilon": -1.0}, "claimed_epsilon"),
    ({"method": "gdp", "delta": 0.0}, "delta > 0"),
    ({"threshold_selection": "fixed"}, "needs a threshold"),
    ({"threshold": 0.5, "threshold_selection": "bonferroni"}, "fixed threshold"),
    ({"threshold": float("nan")}, "threshold"),
    ({"k_plus": 3}, "one-run"),
    ({"method": "one-run", "design": "canaries", "threshold": 0.1}, "k_plus"),
    ({"method": "one-run", "design": "canaries", "k_plus": -1}, "k_plus"),
    ({"method": "one-run", "design": "canaries", "k_plus": 0, "k_minus": 0}, "at least 1"),
    ({"method": "one-run", "design": "canaries", "k_plus": 300, "k_minus": 300}, "at most"),
    ({"method": "one-run", "design": "canaries", "threshold_selection": "fixed"}, "k_plus"),
    ({"seed": -3}, "seed"),
    ({"design": "shadow"}, "design"),
    ({"method": "one-run"}, "needs design='canaries'"),
    ({"method": "one-run", "design": "multi-run"}, "needs design='canaries'"),
    ({"alternative": "sideways"}, "alternative"),
]


@pytest.mark.parametrize(("override", "message"), BAD_INPUTS)
def test_bad_inputs_raise_clear_input_errors(override, message):
    kwargs = {"scores": S, "member": M, **override}
    with pytest.raises(InputError, match=message):
        audit_scores(kwargs.pop("scores"), kwargs.pop("member"), **kwargs)


def test_holdout_needs_two_of_each_class():
    with pytest.raises(InputError, match="at least 2"):
        audit_scores([0.1, 0.2, 0.3], [1, 0, 0])
    assert audit_scores([0.1, 0.2, 0.3], [1, 0, 0], threshold_selection="bonferroni").epsilon_lower_bound == 0.0


# ---- result shape and verdicts ----------------------------------------------------------------------


@pytest.mark.parametrize(("method", "selection"), METHOD_SELECTIONS)
def test_result_dict_has_the_documented_keys(method, selection):
    design = FORMAL_DESIGN[method]
    res = audit_scores(S, M, method=method, threshold_selection=selection, claimed_epsilon=1.0, design=design)
    d = res.to_dict()
    assert KEYS <= set(d)
    assert d["method"] == method and d["threshold_selection"] == selection and d["design"] == design
    assert d["formal"] is (method != "gdp")
    assert d["verdict"] in VERDICTS
    assert d["epsilon_lower_bound"] >= 0.0
    assert d["epsilon_lower_bound"] <= d["max_certifiable_epsilon"]
    assert AuditResult(**{**d, "notes": tuple(d["notes"])}) == res  # round trip
    if method == "gdp":
        assert any("assumes" in n for n in d["notes"])
    if method == "one-run":
        assert d["threshold"] is None and {"guesses", "correct", "k_plus", "k_minus"} <= set(d["counts"])
    else:
        assert {"tp", "fp", "tn", "fn", "n_members", "n_nonmembers"} <= set(d["counts"])


def test_decide_verdict_rules():
    assert decide_verdict(2.0, None, 5.0) is None
    assert decide_verdict(2.0, 1.0, 5.0) == "violation"
    assert decide_verdict(2.0, 2.0, 5.0) == "consistent"  # equal is not a violation
    assert decide_verdict(0.5, 3.0, 5.0) == "consistent"
    assert decide_verdict(0.5, 5.0, 5.0) == "inconclusive"  # at the design's ceiling
    assert decide_verdict(0.5, 8.0, 5.0) == "inconclusive"
    assert decide_verdict(6.0, 5.5, 5.0) == "violation"
    # An estimate can exceed a claim but never makes a violation.
    assert decide_verdict(2.0, 1.0, 5.0, formal=False) == "estimate-exceeds-claim"
    assert decide_verdict(6.0, 5.5, 5.0, formal=False) == "estimate-exceeds-claim"
    assert decide_verdict(2.0, 2.0, 5.0, formal=False) == "consistent"
    assert decide_verdict(0.5, 8.0, 5.0, formal=False) == "inconclusive"
    assert decide_verdict(2.0, None, 5.0, formal=False) is None


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("design", DESIGNS)
def test_only_two_pairings_are_formal(method, design):
    # Formal: Clopper–Pearson on independent runs, one-run on canaries (one-run-fdp with the default μ-GDP
    # curves reports an estimated ε). Everything else is an estimate with a note saying why, and an
    # estimate far above the claim is never a "violation".
    strong_s, strong_m = _data(500, mu=4.0, seed=2)
    if method in ("one-run", "one-run-fdp"):
        strong_m = np.random.default_rng(2).random(1000) < 0.5
        strong_s = np.random.default_rng(3).normal(size=1000) + 8.0 * strong_m
    kwargs = {"method": method, "design": design, "claimed_epsilon": 0.1, "delta": 1e-3}
    if method in ("one-run", "one-run-fdp") and design != "canaries":
        with pytest.raises(InputError, match="needs design='canaries'"):
            audit_scores(strong_s, strong_m, **kwargs)
        return
    res = audit_scores(strong_s, strong_m, **kwargs)
    formal = (method, design) in {("clopper-pearson", "multi-run"), ("one-run", "canaries")}
    assert res.formal is formal and res.design == design
    assert res.epsilon_lower_bound > 1.0  # far above the claim of 0.1
    assert res.verdict == ("violation" if formal else "estimate-exceeds-claim")
    if not formal:
        assert any(n.startswith("estimate:") for n in res.notes), res.notes
        assert "ESTIMATE" in res.summary() and "verdict: estimate-exceeds-claim" in res.summary()
    else:
        assert not any(n.startswith("estimate:") for n in res.notes)
        assert "formal lower bound" in res.summary()


def test_default_design_is_membership_and_never_formal():
    res = audit_scores(*_data(500, mu=4.0), claimed_epsilon=0.1)
    assert res.design == "membership" and res.formal is False and res.verdict == "estimate-exceeds-claim"
    assert any("design='membership'" in n for n in res.notes)


def test_summary_prints_every_note_once_and_a_refutation_statement_first():
    """The summary (what `audit scores` prints, and assert_dp's message) carries every note — for an estimate, the
    one that says why it is one — each once; a curve refutation's statement heads it and is not repeated as a note.
    Mutants that survived every test: the note filter negated (no note printed at all), notes dropped whenever a
    refutation is set, and only the statement printed as a note."""
    import dataclasses

    res = audit_scores(*_data(500, mu=4.0), claimed_epsilon=0.1)  # membership design: an estimate, with notes
    assert res.notes and any(n.startswith("estimate:") for n in res.notes)
    lines = res.summary().splitlines()
    assert [ln for ln in lines if ln.startswith("note: ")] == [f"note: {n}" for n in res.notes]
    statement = "the claimed curve is refuted (test statement)"
    curve = dataclasses.replace(res, refutation={"statement": statement}, notes=(statement, *res.notes))
    lines = curve.summary().splitlines()
    assert lines[0].startswith(statement + " (formal, confidence")
    assert [ln for ln in lines if ln.startswith("note: ")] == [f"note: {n}" for n in res.notes]


def test_claim_beyond_design_is_inconclusive_with_a_note():
    res = audit_scores(S, M, claimed_epsilon=50.0)
    assert res.verdict == "inconclusive" and res.design_too_small
    assert any("design too small" in n for n in res.notes)


def test_design_too_small_names_the_audit_plan_that_sizes_a_design_able_to_refute():
    """README: `inconclusive` ... "`dpaudit audit plan` says how many runs or canaries would be needed"; the note said
    only "more runs/canaries are needed". It names the plan of this audit's design (claim rounded up, its δ, method,
    selection, sides and per-test confidence, each only enlarging the size), options `audit plan` parses, and a
    planned perfect attack there certifies more than the claim (its size exceeds this design's)."""
    import re
    import shlex

    from typer.main import get_command

    from dpaudit.audit.plan import trials_needed
    from dpaudit.cli.main import app

    plan = get_command(app).commands["audit"].commands["plan"]
    cases = [
        (dict(design="multi-run"), 8.0, "--epsilon 8 --delta 1e-05`", "the size needed"),
        (dict(design="multi-run", method="gdp"), 30.0, "--epsilon 30 --delta 1e-05 --method gdp`", "the size needed"),
        (dict(design="multi-run", threshold_selection="bonferroni", alternative="two-sided", confidence=0.975), 8.0,
         "--delta 1e-05 --threshold-selection bonferroni --two-sided --confidence 0.975`", "the size needed"),
        (dict(design="canaries", method="one-run", confidence=1 - 0.05 / 3), 8.0,
         "--method one-run --confidence 0.983334`", "the size needed"),
        (dict(), 8.0, "--epsilon 8 --delta 1e-05`", "the independent runs a formal audit needs"),  # membership
    ]  # fmt: skip
    for kw, claim, tail, what in cases:
        res = audit_scores(S, M, claimed_epsilon=claim, delta=1e-5, **kw)
        (note,) = [n for n in res.notes if n.startswith("design too small")]
        command = re.search(r"`dpaudit audit plan ([^`]*)`", note)
        assert command and note.endswith(f"{tail} gives {what})"), note
        ctx = plan.make_context("plan", shlex.split(command.group(1)))  # options the command parses
        p = ctx.params
        assert p["target_epsilon"] >= claim and p["delta"] == 1e-5 and p["confidence"] >= kw.get("confidence", 0.95)
        assert (p["method"], p["threshold_selection"], p["two_sided"]) == (
            kw.get("method", "clopper-pearson"), kw.get("threshold_selection", "holdout"), "alternative" in kw
        )  # fmt: skip
        if p["method"] != "one-run":  # one-run at 8: out of reach (the plan says so); else more than this design
            need = trials_needed(
                p["target_epsilon"], delta=p["delta"], confidence=p["confidence"], method=p["method"],
                threshold_selection=p["threshold_selection"], alternative="two-sided" if p["two_sided"] else "greater",
            )  # fmt: skip
            assert need > int(M.sum())
    fdp = audit_scores(S, M, claimed_epsilon=50.0, design="canaries", method="one-run-fdp", delta=1e-5)
    (note,) = [n for n in fdp.notes if n.startswith("design too small")]  # no pointer: the sentence ends as before
    assert note.endswith("are needed to refute this claim)") and "audit plan" not in " ".join(fdp.notes)


def test_design_too_small_exactly_when_the_verdict_rule_says_inconclusive():
    """``design_too_small`` (the CLI's "the design is too small to refute the claim" warning) holds exactly when
    :func:`decide_verdict` has the claim at or above the max certifiable ε, the ceiling included, and never
    without a claim. Mutants that survived every test: the claim alone (the warning on every consistent result),
    ``>`` (no warning at the ceiling, where the verdict is inconclusive), the None check dropped (TypeError)."""
    import dataclasses

    res = audit_scores(S, M, claimed_epsilon=1.0)
    most = res.max_certifiable_epsilon
    for claimed, expected in ((None, False), (most / 2, False), (most, True), (2 * most, True)):
        r = dataclasses.replace(res, claimed_epsilon=claimed)
        assert r.design_too_small is expected, claimed
        if claimed is not None:
            inconclusive = decide_verdict(0.0, claimed, most) == "inconclusive"
            assert r.design_too_small is inconclusive


@pytest.mark.parametrize(("method", "selection"), METHOD_SELECTIONS)
def test_perfect_attack_reaches_max_certifiable(method, selection):
    # Perfectly separated scores: the bound is what max_certifiable_epsilon predicts from counts alone.
    n = 300
    scores = np.r_[np.arange(n) + 1000.0, np.arange(n, dtype=float)]
    member = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    res = audit_scores(
        scores, member, method=method, threshold_selection=selection, delta=1e-3, design=FORMAL_DESIGN[method]
    )
    predicted = max_certifiable_epsilon(n, n, method=method, threshold_selection=selection, delta=1e-3)
    assert res.max_certifiable_epsilon == pytest.approx(predicted, rel=1e-9)
    if method == "one-run" and selection == "holdout":
        # The unstratified split leaves the halves unbalanced, so score thresholds chosen on the selection
        # half can include a few wrong guesses on the evaluation half even for a perfect ranking.
        assert 0.5 * predicted <= res.epsilon_lower_bound <= predicted
    else:
        assert res.epsilon_lower_bound == pytest.approx(predicted, rel=1e-9)


def test_max_certifiable_for_a_fixed_threshold_and_fixed_guesses():
    # Fixed threshold, perfect test: FPR̄ = FNR̄ = 1 − (α/2)^(1/n), bound = ln((1 − δ − FPR̄)/FNR̄).
    n, a = 1000, 0.05
    u = 1 - (a / 2) ** (1 / n)
    assert max_certifiable_epsilon(n, n, threshold_selection="fixed", delta=0.0) == pytest.approx(np.log((1 - u) / u))
    # Fixed guesses, δ = 0: all r correct → logit(α^(1/r)).
    r = 50
    expected = np.log(a ** (1 / r) / (1 - a ** (1 / r)))
    got = max_certifiable_epsilon(500, 500, method="one-run", k_plus=25, k_minus=25, delta=0.0)
    assert got == pytest.approx(expected, rel=1e-9)


def test_fixed_threshold_counts():
    scores = np.array([0.0, 1.0, 2.0, 3.0, 0.5, 1.5, 2.5, 3.5])
    member = np.array([1, 1, 1, 1, 0, 0, 0, 0], bool)
    res = audit_scores(scores, member, threshold=2.0)
    assert res.threshold_selection == "fixed" and res.threshold == 2.0
    # predict member iff score >= 2: TP = {2, 3}, FP = {2.5, 3.5}
    assert (res.counts["tp"], res.counts["fn"], res.counts["fp"], res.counts["tn"]) == (2, 2, 2, 2)
    assert res.details["fpr_upper"] == pytest.approx(stats.beta.ppf(0.975, 3, 2))


def test_holdout_is_reproducible_and_seeded():
    s, m = _data(500, 1.0, 3)
    a, b = audit_scores(s, m, seed=7), audit_scores(s, m, seed=7)
    assert a == b
    g1, g2 = np.random.default_rng(5), np.random.default_rng(5)
    assert audit_scores(s, m, seed=g1) == audit_scores(s, m, seed=g2)  # a Generator is used as given


def test_inputs_as_lists_and_bools():
    res = audit_scores(list(S), [bool(x) for x in M], threshold_selection="bonferroni")
    assert res.counts["n_members"] == int(M.sum())


def test_one_run_warns_when_inclusion_is_not_a_fair_coin():
    rng = np.random.default_rng(0)
    member = rng.random(1000) < 0.8
    res = audit_scores(rng.normal(size=1000) + member, member, method="one-run", design="canaries")
    assert any("probability 1/2" in n for n in res.notes)


# ---- pure noise --------------------------------------------------------------------------------------


def test_identical_scores_give_zero():
    for method, selection in METHOD_SELECTIONS:
        res = audit_scores(
            np.zeros(400), np.r_[np.ones(200), np.zeros(200)], method=method, threshold_selection=selection,
            design=FORMAL_DESIGN[method],
        )  # fmt: skip
        assert res.epsilon_lower_bound == 0.0, (method, selection)


@pytest.mark.parametrize(("method", "selection"), METHOD_SELECTIONS)
def test_pure_noise_gives_zero_in_at_least_confidence_of_runs(method, selection):
    # Members and non-members identically distributed: a positive bound is a false alarm, allowed in
    # at most α of runs. 200 runs; the 99.9% quantile of Binomial(200, 0.05) is 21, so > 21 positive
    # runs would be a bug (chance < 0.1% for a correct auditor).
    positive = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        scores = rng.normal(size=400)
        member = rng.random(400) < 0.5 if method == "one-run" else np.r_[np.ones(200, bool), np.zeros(200, bool)]
        res = audit_scores(
            scores, member, method=method, threshold_selection=selection, seed=seed, design=FORMAL_DESIGN[method]
        )
        positive += res.epsilon_lower_bound > 0
    assert positive <= stats.binom.ppf(0.999, 200, 0.05)


# ---- tightness ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("selection", ["holdout", "bonferroni"])
def test_gdp_method_is_tight_on_gdp_scores(mu, selection):
    # 10^5 members ~ N(μ,1) and 10^5 non-members ~ N(0,1): ε(δ) of μ-GDP is known exactly.
    scores, member = gdp_scores(mu).scores(np.random.default_rng(1), 100_000)
    res = audit_scores(scores, member, method="gdp", threshold_selection=selection)
    truth = gdp_epsilon(mu, 1e-5)
    assert 0.8 * truth <= res.epsilon_lower_bound <= truth * 1.0001


# ---- identities ---------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(METHOD_SELECTIONS))
def test_bounds_depend_on_ranks_only(seed, method_selection):
    # A strictly increasing transform of the scores changes no test's counts, hence no bound.
    method, selection = method_selection
    rng = np.random.default_rng(seed)
    n = 150
    member = rng.random(2 * n) < 0.5 if method == "one-run" else np.r_[np.ones(n, bool), np.zeros(n, bool)]
    if member.all() or not member.any():
        return
    scores = rng.normal(size=2 * n) + member * rng.uniform(0, 3)
    kw = {"method": method, "threshold_selection": selection, "seed": seed, "design": FORMAL_DESIGN[method]}
    a = audit_scores(scores, member, **kw)
    b = audit_scores(np.exp(scores / 2) + 7.0, member, **kw)
    assert a.epsilon_lower_bound == pytest.approx(b.epsilon_lower_bound, rel=1e-12, abs=1e-12)
    assert a.counts == b.counts
    assert 0.0 <= a.epsilon_lower_bound <= a.max_certifiable_epsilon


def test_tied_thresholds_are_chosen_by_rank_not_by_value():
    # Two well-separated classes with one straggler each: on the selection half a run of thresholds
    # inside the gap ties. The old rule (median of the tied *values*) moved under these transforms and changed
    # the bound in 5 of these 60 seeds; the median *index* depends on the ranks only.
    for seed in range(60):
        rng = np.random.default_rng(seed)
        n = 40
        s = np.r_[rng.uniform(2, 3, n), rng.uniform(0, 1, n)]
        s[rng.integers(0, n)] = rng.uniform(0, 3)
        s[n + rng.integers(0, n)] = rng.uniform(0, 3)
        m = np.r_[np.ones(n, bool), np.zeros(n, bool)]
        for transform in (lambda x: np.exp(3 * x), lambda x: 5.0 * x - 2.0):
            a = audit_scores(s, m, seed=seed)
            b = audit_scores(transform(s), m, seed=seed)
            assert a.epsilon_lower_bound == b.epsilon_lower_bound, seed
            assert a.counts == b.counts, seed


# ---- directions -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "selection"), METHOD_SELECTIONS)
def test_two_sided_is_the_better_direction_at_half_alpha(method, selection):
    # Oracle: a two-sided audit at 1 − α equals the larger of the two one-sided audits at 1 − α/2 on s
    # and on −s, with the same seed (hence the same holdout split and tie-breaking keys).
    rng = np.random.default_rng(4)
    if method == "one-run":
        member = rng.random(600) < 0.5
    else:
        member = np.r_[np.ones(300, bool), np.zeros(300, bool)]
    design = FORMAL_DESIGN[method]
    for sign in (1.0, -1.0):  # the signal in either direction
        s = sign * (rng.normal(size=600) + 3.0 * member)
        kw = {"method": method, "threshold_selection": selection, "seed": 9, "design": design, "delta": 1e-5}
        two = audit_scores(s, member, alternative="two-sided", **kw)
        up = audit_scores(s, member, confidence=0.975, **kw)
        down = audit_scores(-s, member, confidence=0.975, **kw)
        assert two.epsilon_lower_bound == max(up.epsilon_lower_bound, down.epsilon_lower_bound)
        assert two.details["direction"] == ("greater" if sign > 0 else "less")
        assert two.epsilon_lower_bound > 0.5
        assert two.max_certifiable_epsilon == pytest.approx(up.max_certifiable_epsilon, rel=1e-12)
        assert two.max_certifiable_epsilon == pytest.approx(
            max_certifiable_epsilon(
                int(member.sum()), int((~member).sum()), method=method, threshold_selection=selection,
                delta=1e-5, alternative="two-sided",
            ),
            rel=1e-12,
        )  # fmt: skip
        # "less" on s is "greater" on −s.
        less = audit_scores(s, member, alternative="less", **kw)
        assert less.epsilon_lower_bound == audit_scores(-s, member, **kw).epsilon_lower_bound


def test_two_sided_threshold_is_reported_on_the_original_scores():
    s, m = _data(400, mu=2.0, seed=5)
    res = audit_scores(-s, m, alternative="two-sided", design="multi-run", threshold_selection="bonferroni")
    assert res.details == {**res.details, "direction": "less", "alternative": "two-sided"}
    # Direction "less": predict member iff score ≤ threshold; that rule reproduces the counts.
    pred = -s <= res.threshold
    assert res.counts["tp"] == int((pred & m).sum()) and res.counts["fp"] == int((pred & ~m).sum())
    assert "direction less" in res.summary()
    fixed = audit_scores(-s, m, alternative="two-sided", threshold=res.threshold)
    assert fixed.threshold == res.threshold and fixed.details["direction"] == "less"


def test_two_sided_costs_alpha():
    # Each direction runs at α/2, so the ceiling is lower than one-sided at the same confidence.
    one = max_certifiable_epsilon(1000, 1000, delta=0.0)
    two = max_certifiable_epsilon(1000, 1000, delta=0.0, alternative="two-sided")
    assert two < one
    assert two == pytest.approx(max_certifiable_epsilon(1000, 1000, delta=0.0, confidence=0.975), rel=1e-12)


@pytest.mark.parametrize(("n_pos", "n_neg", "seed"), [(40, 400, 0), (400, 40, 1), (60, 300, 2), (300, 60, 3)])
def test_bonferroni_threshold_rates_cover_the_counts_at_the_reported_threshold(n_pos, n_neg, seed):
    # Whatever anchor wins, its rate bounds must be at least the exact Clopper–Pearson upper bounds (beta
    # quantiles, Clopper & Pearson 1934) of the false-positive and false-negative counts that the reported
    # threshold really has, at the per-bound level α/(2K): a smaller bound over-claims ε.
    from dpaudit.audit.bounds import _bonferroni_thresholds

    rng = np.random.default_rng(seed)
    pos, neg = rng.normal(2.0, 1.0, n_pos), rng.normal(0.0, 1.0, n_neg)
    out = _bonferroni_thresholds("clopper-pearson", pos, neg, 0.05, 1e-5)
    fp, fn = int(np.sum(neg >= out.threshold)), int(np.sum(pos < out.threshold))
    assert (out.fp, out.fn) == (fp, fn)
    a = out.alpha_per_bound
    assert a * 2 * out.n_thresholds <= 0.05 * (1 + 1e-12)
    assert out.fpr_upper >= stats.beta.isf(a, fp + 1, n_neg - fp) * (1 - 1e-9)
    assert out.fnr_upper >= stats.beta.isf(a, fn + 1, n_pos - fn) * (1 - 1e-9)


def test_max_certifiable_refuses_an_empty_class_and_gdp_without_delta_and_counts_the_holdout_half():
    # Sizes that no design can audit are refused (an empty class gave a number; gdp at δ = 0 gave ε = ∞).
    for n_pos, n_neg, kw in [
        (0, 10, {}),
        (10, 0, {}),
        (0, 10, {"method": "one-run"}),
        (5, 5, {"method": "gdp", "delta": 0.0}),
        (5, 5, {"method": "one-run-fdp", "delta": 0.0}),
    ]:
        with pytest.raises(InputError):
            max_certifiable_epsilon(n_pos, n_neg, **kw)
    # δ = 0 one-run, every one of r guesses right: logit of the Clopper–Pearson lower bound α^(1/r)
    # (Steinke et al. 2023, Theorem 3.1). Fixed guesses with one of k_plus, k_minus left out, and holdout on
    # m = 11 canaries, which evaluates on m − ⌊m/2⌋ = 6 of them with r up to all 6.
    a = 0.05

    def logit_cp(r):
        return float(np.log(a ** (1 / r) / (1 - a ** (1 / r))))

    got = max_certifiable_epsilon(500, 500, method="one-run", k_plus=40, delta=0.0)
    assert got == pytest.approx(logit_cp(40), rel=1e-9)
    got = max_certifiable_epsilon(500, 500, method="one-run", k_minus=30, delta=0.0)
    assert got == pytest.approx(logit_cp(30), rel=1e-9)
    got = max_certifiable_epsilon(5, 6, method="one-run", threshold_selection="holdout", delta=0.0)
    assert got == pytest.approx(logit_cp(6), rel=1e-9)
    # Threshold holdout on 41 members and 41 non-members evaluates on 41 − ⌊41/2⌋ = 21 of each: a perfect test
    # has FPR̄ = FNR̄ = 1 − (α/2)^(1/21) (Clopper–Pearson at k = 0), so the bound is ln((1 − u)/u) at δ = 0.
    u = 1 - (a / 2) ** (1 / 21)
    assert max_certifiable_epsilon(41, 41, delta=0.0) == pytest.approx(float(np.log((1 - u) / u)), rel=1e-9)


def test_threshold_audit_reports_hand_counts_its_notes_and_details_and_the_holdout_minimum():
    """What a threshold audit reports, against counts made by hand (member predicted iff score >= threshold),
    the notes that say how the threshold was chosen, μ only for the gdp method; the holdout split needs 2 of each
    class (one per half). Planted (tenth mutation pass): tn reported as fp, the Bonferroni or two-sided note
    dropped or put on the other designs, mu_lower_bound on the wrong method, a holdout accepted with 1 non-member
    or refused with 2 -> fail."""
    rng = np.random.default_rng(12)
    mem = np.arange(60) < 30
    s = rng.normal(1.0 * mem, 1.0)
    r = audit_scores(s, mem, threshold=0.7)
    tp, fp = int((s[mem] >= 0.7).sum()), int((s[~mem] >= 0.7).sum())
    assert {k: r.counts[k] for k in ("tp", "fp", "tn", "fn")} == {"tp": tp, "fp": fp, "tn": 30 - fp, "fn": 30 - tp}
    assert not any("searched over" in n or n.startswith("two-sided") for n in r.notes)
    assert "mu_lower_bound" not in r.details
    b = audit_scores(s, mem, threshold_selection="bonferroni", alternative="two-sided", method="gdp")
    assert any("order-statistic anchors" in n for n in b.notes) and any(n.startswith("two-sided") for n in b.notes)
    assert b.details["mu_lower_bound"] >= 0.0
    for n_pos, n_neg in ((2, 1), (1, 2)):
        m2 = np.arange(n_pos + n_neg) < n_pos
        with pytest.raises(InputError, match="at least 2 members and 2 non-members"):
            audit_scores(m2.astype(float), m2, threshold_selection="holdout")
    m2 = np.arange(4) < 2
    assert audit_scores(m2.astype(float), m2, threshold_selection="holdout").counts["n_eval_members"] == 1


def test_a_threshold_of_minus_zero_prints_as_0():
    """A loss attack's threshold of -0.0 (a loss of 0, negated) printed "threshold -0" in the text output."""
    scores = -np.array([0.0, 0.0, 0.0, 1.0, 2.0, 3.0])  # -0.0 for the members: a loss of 0
    member = np.array([True, True, True, False, False, False])
    res = audit_scores(scores, member, threshold_selection="fixed", threshold=-0.0, delta=0.0)
    assert math.copysign(1.0, res.threshold) == -1.0  # the -0.0 really reaches the summary
    line = next(x for x in res.summary().splitlines() if x.startswith("threshold selection"))
    assert line.endswith("threshold 0") and "-0" not in line, line


@pytest.mark.parametrize(("method", "extra"), [("gdp", {}), ("one-run-fdp", {"tradeoff": "gdp", "design": "canaries"})])
def test_a_gdp_lower_bound_never_exceeds_a_claim_at_the_exact_epsilon_of_its_mu(method, extra):
    # Planted flip: the claim is the smallest float at or above the 50-digit epsilon(delta) of the audit's own mu
    # lower bound. An epsilon rounded up (gdp_epsilon, for claims; 13 ulps above the root here) read as
    # "estimate-exceeds-claim"; rounded down (gdp_epsilon_lower) it cannot exceed the claim.
    from tests.accounting.test_conversions import _mp_bisect, _mp_gdp_delta

    rng = np.random.default_rng(3)
    member = rng.random(400) < 0.5
    scores = rng.normal(size=400) + 2.0 * member
    kw = {"method": method, "threshold_selection": "bonferroni", "delta": 1e-5, **extra}
    mu = audit_scores(scores, member, **kw).details["mu_lower_bound"]
    assert mu > 0.5
    _, hi = _mp_bisect(lambda e: 1e-5 - _mp_gdp_delta(mu, e), 0.0, 200.0)
    claim = float(hi)
    claim = claim if claim >= hi else math.nextafter(claim, math.inf)
    res = audit_scores(scores, member, claimed_epsilon=claim, **kw)
    assert res.epsilon_lower_bound <= claim and res.verdict != "estimate-exceeds-claim"


@pytest.mark.parametrize(("most", "claim"), [(1.9995, 2.0), (2.0099, 2.00995), (7.99995, 7.999954)])
def test_summary_prints_an_inconclusive_max_certifiable_at_or_below_the_claim(most, claim):
    """An inconclusive audit's claim is at or above the max certifiable ε: its summary (what `audit scores`,
    `audit checkpoint` and `audit train` print) and the CLI's too-small warning never print the max certifiable ε
    above the claim or equal-looking to a claim it is below. Before: "max certifiable epsilon: 8 ... claimed
    epsilon: 7.99996 -> verdict: inconclusive", "2 ... 2", and "at most epsilon = 2.01 could be certified" under
    "claimed epsilon: 2.00995"."""
    import dataclasses
    import re
    from decimal import Decimal

    from dpaudit.cli.audit import describe

    res = dataclasses.replace(
        audit_scores(S, M, claimed_epsilon=1.0),
        max_certifiable_epsilon=most,
        claimed_epsilon=claim,
        verdict="inconclusive",
    )
    assert res.verdict is not None and res.design_too_small
    text = describe(res)
    m = Decimal(re.search(r"max certifiable epsilon \(perfect attack, same design\): (\S+)", text).group(1))
    c = Decimal(re.search(r"claimed epsilon: (\S+) ", text).group(1))
    w = Decimal(re.search(r"at most epsilon = (\S+) could be certified", text).group(1))
    # rounded up: at or above the number, or its own short decimal (dpaudit.numfmt's stated exception)
    assert m < c and m == w and float(m) >= most and float(c) >= claim, text
