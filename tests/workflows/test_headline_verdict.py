"""The headline's verdict and text (dpaudit.workflows.result.headline), case by case, on hand-built audit entries.

The eleventh mutation pass found its branches guarded only by end-to-end tests (trainings, the demo): these cases
pin what each kind of evidence may say. A formal ε bound sets the verdict; a formal test that bounds no ε (a curve
test, the noise check) says what it showed and, without a formal bound, sets "consistent" / "inconclusive"; a
rejecting check or a refuted curve sets "violation" / "curve-refuted"; an estimate never sets the verdict and is
always labelled an estimate.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpaudit.audit import audit_scores
from dpaudit.errors import InputError
from dpaudit.workflows.result import AuditRecord, check_verdict, effective_verdict, headline

CLAIM = {"epsilon": 1.0, "delta": 1e-5}
_rng = np.random.default_rng(0)
_M = _rng.random(400) < 0.5
_S = _rng.normal(size=400) + 0.2 * _M
STRONG = _rng.normal(size=400) + 6.0 * _M


def _entry(attack, result, **replace):
    return AuditRecord(attack, "hand-built", dataclasses.replace(result, **replace) if replace else result).to_dict()


FORMAL_OK = _entry("multi-run", audit_scores(_S, _M, design="multi-run", claimed_epsilon=1.0))
FORMAL_BAD = _entry("multi-run", audit_scores(STRONG, _M, design="multi-run", claimed_epsilon=1.0))
ESTIMATE_OK = _entry("loss", audit_scores(_S, _M, claimed_epsilon=1.0))
ESTIMATE_BAD = _entry("loss", audit_scores(STRONG, _M, claimed_epsilon=1.0))
CURVE_WEAK = _entry(
    "canaries", audit_scores(_S, _M, claimed_epsilon=1.0), verdict="inconclusive",
    refutation={"statement": "the claimed DP-SGD curve is not refuted (test too weak)"},
)  # fmt: skip
CURVE_REFUTED = _entry(
    "canaries", audit_scores(STRONG, _M, claimed_epsilon=1.0), verdict="curve-refuted",
    refutation={"statement": "the claimed DP-SGD curve is refuted"},
)  # fmt: skip
CURVE_OK = _entry(
    "canaries", audit_scores(_S, _M, claimed_epsilon=1.0), verdict="consistent",
    refutation={"statement": "the claimed DP-SGD curve is not refuted"},
)  # fmt: skip
COMPOSED = {  # a per-step audit's composed estimate (whitebox.steps_record), the run's only estimate
    **CURVE_WEAK,
    "details": {
        "composed_epsilon_estimate": 3.0, "composed_claimed_epsilon": 1.0,
        "composed_label": "estimate under composition", "composed_verdict": "estimate-exceeds-claim",
    },
}  # fmt: skip
CHECK_OK = {"formal": True, "verdict": "consistent", "statement": "the noise check finds no less noise"}
CHECK_REJECTS = {"formal": True, "verdict": "violation", "statement": "the noise check rejects the claimed noise"}


def test_the_entries_are_what_their_names_say():
    assert FORMAL_OK["formal"] and FORMAL_OK["verdict"] == "consistent"
    assert FORMAL_BAD["formal"] and FORMAL_BAD["verdict"] == "violation"
    assert not ESTIMATE_OK["formal"] and ESTIMATE_OK["verdict"] == "consistent"
    assert not ESTIMATE_BAD["formal"] and ESTIMATE_BAD["verdict"] == "estimate-exceeds-claim"


@pytest.mark.parametrize(
    ("audits", "checks", "verdict", "starts"),
    [
        ([FORMAL_OK], [CHECK_OK], "consistent", "consistent: ε ≥"),  # a formal bound heads it, checks or not
        ([FORMAL_BAD, ESTIMATE_OK], [], "violation", "violation: ε ≥"),
        ([ESTIMATE_OK, CURVE_WEAK], [], "inconclusive", "no formal ε bound; the claimed DP-SGD curve is not refuted"),
        ([ESTIMATE_OK], [CHECK_OK], "consistent", "no formal ε bound; the noise check finds no less noise"),
        ([ESTIMATE_OK, CURVE_WEAK], [CHECK_OK], "consistent", "no formal ε bound; the claimed DP-SGD curve is not"),
        ([ESTIMATE_BAD], [], None, "no formal audit (train with canaries"),  # an estimate never sets the verdict
        ([], [], None, "no formal audit (train with canaries"),
        ([FORMAL_OK], [CHECK_REJECTS], "violation", "violation: the noise check rejects the claimed noise"),
        ([ESTIMATE_OK], [CHECK_REJECTS], "violation", "violation: the noise check rejects the claimed noise"),
        ([FORMAL_OK, CURVE_REFUTED], [], "curve-refuted", "consistent: ε ≥"),
        ([FORMAL_BAD, CURVE_REFUTED], [], "violation", "violation: ε ≥"),
        ([ESTIMATE_OK], [{**CHECK_REJECTS, "formal": False}], None, "no formal audit"),  # an informal check: nothing
        ([FORMAL_BAD], [CHECK_REJECTS], "violation", "violation: ε ≥"),  # the ε bound heads; the check is not added
        ([ESTIMATE_OK, CURVE_OK], [], "consistent", "no formal ε bound; the claimed DP-SGD curve is not refuted"),
        ([ESTIMATE_OK, CURVE_WEAK, CURVE_OK], [], "consistent", "no formal ε bound; the claimed DP-SGD curve is not"),
        ([{**ESTIMATE_OK, "design": "canaries"}], [], None, "no formal audit (its canary audit is an estimate"),
        ([FORMAL_OK, {**ESTIMATE_OK, "design": "canaries"}], [], "consistent", "consistent: ε ≥"),
    ],
)
def test_headline_verdict_and_text(audits, checks, verdict, starts):
    h = headline(audits, CLAIM, checks)
    assert h.verdict == verdict, h.text
    assert h.text.startswith(starts), h.text
    if any(a.get("verdict") == "curve-refuted" for a in audits) and verdict == "curve-refuted":
        assert "curve refuted: the claimed DP-SGD curve is refuted (formal, canaries" in h.text
    if h.verdict != "violation":
        assert "violation" not in h.text.split("(")[0]
    estimates = [a for a in audits if not a["formal"] and not a.get("refutation")]
    if estimates:  # the estimate is beside the verdict, always labelled
        assert "estimate ε ≥ " in h.text and h.estimate_verdict == estimates[0]["verdict"]
        shown = float(h.text.split("estimate ε ≥ ")[1].split(" ")[0])  # the estimate, rounded down; not the claim
        assert 0.99 * estimates[0]["epsilon_lower_bound"] <= shown <= estimates[0]["epsilon_lower_bound"], h.text
        exceeds = estimates[0]["verdict"] == "estimate-exceeds-claim"
        assert ("exceeds the claim — an estimate, not a formal violation" in h.text) is exceeds
    else:
        assert h.estimate is None


def test_the_strongest_formal_audit_heads_and_a_claim_curve_audit_is_never_picked():
    """`_pick`: the largest formal bound (not the first), never a claim-curve audit (its ε is an estimate)."""
    h = headline([FORMAL_OK, FORMAL_BAD, CURVE_REFUTED], CLAIM)
    assert h.formal["audit_index"] == 1 and h.verdict == "violation"
    h = headline([CURVE_REFUTED, ESTIMATE_OK], CLAIM)
    assert h.formal is None and h.estimate["audit_index"] == 1 and h.verdict == "curve-refuted"


def test_headline_refuses_an_audit_result_object_in_one_line():
    with pytest.raises(InputError, match=r"takes audit entries as AuditRecord\.to_dict"):
        headline([audit_scores(_S, _M, claimed_epsilon=1.0)], CLAIM)


def test_a_verdict_that_contradicts_its_numbers_is_refused_and_an_unclaimed_audit_is_judged_by_the_models_claim():
    for entry, wrong in ((FORMAL_OK, "violation"), (FORMAL_BAD, "consistent"), (FORMAL_BAD, "estimate-exceeds-claim"),
                         (ESTIMATE_BAD, "violation"), (ESTIMATE_OK, "estimate-exceeds-claim"),
                         (FORMAL_BAD, "inconclusive")):  # fmt: skip
        with pytest.raises(InputError, match="contradicts its own numbers"):
            check_verdict({**entry, "verdict": wrong})
    for entry in (FORMAL_OK, FORMAL_BAD, ESTIMATE_OK, ESTIMATE_BAD):
        check_verdict(entry)  # the entries' own verdicts stand
        check_verdict({**entry, "verdict": None})
    check_verdict({**CURVE_REFUTED})  # decided by its curve test, not by these numbers
    unclaimed = {**FORMAL_BAD, "verdict": None, "claimed_epsilon": None}
    assert effective_verdict(unclaimed, CLAIM) == "violation"
    assert effective_verdict({**unclaimed, "formal": False}, CLAIM) == "estimate-exceeds-claim"
    assert effective_verdict(unclaimed, None) is None
    assert effective_verdict(FORMAL_OK, {"epsilon": 0.0}) == "consistent"  # its own verdict first
    weak = {**FORMAL_OK, "verdict": None, "claimed_epsilon": None, "max_certifiable_epsilon": None}
    assert effective_verdict(weak, {"epsilon": 50.0}) == "inconclusive"  # unknown power counts as none


def test_an_audit_run_without_a_claim_is_judged_against_the_models_claim():
    """As the docstring (and the report, through effective_verdict) says. headline() read the audit's own verdict,
    None: a formal bound of 3.3 against the model's claim 1 read "inconclusive: ε ≥ 3.3; this design certifies at
    most 3.37 ≤ claimed 1" with verdict None, and an estimate above the claim went without its "exceeds" label."""
    bad = {**FORMAL_BAD, "claimed_epsilon": None, "verdict": None}
    h = headline([bad], CLAIM)
    assert h.verdict == "violation" and h.text.startswith("violation: ε ≥ "), h.text
    ok = {**FORMAL_OK, "claimed_epsilon": None, "verdict": None}
    h = headline([ok], CLAIM)
    assert h.verdict == "consistent" and h.text.startswith("consistent: ε ≥ "), h.text
    h = headline([ok], {"epsilon": 50.0})
    assert h.verdict == "inconclusive" and h.text.startswith("inconclusive: ε ≥ "), h.text
    est = {**ESTIMATE_BAD, "claimed_epsilon": None, "verdict": None}
    h = headline([est], CLAIM)
    assert h.verdict is None and h.estimate_verdict == "estimate-exceeds-claim"
    assert "exceeds the claim — an estimate, not a formal violation" in h.text
    assert "> claimed 1 (" in headline([FORMAL_BAD], {"epsilon": 0.25}).text  # its own claim, not the model's
    h = headline([bad, est], None)  # no claim anywhere: what was shown, no verdict
    assert h.verdict is None and h.text.startswith("leaks: ε ≥ "), h.text


def test_a_composed_estimate_is_labelled_and_never_sets_the_verdict():
    h = headline([COMPOSED], CLAIM)
    assert h.verdict == "inconclusive" and h.estimate_verdict == "estimate-exceeds-claim"
    assert h.text.endswith(
        "; estimate ε ≥ 3 composed over all steps vs claimed 1 (estimate under composition) exceeds the claim — an "
        "estimate, not a formal violation"
    ), h.text
    within = {**COMPOSED, "details": {**COMPOSED["details"], "composed_verdict": "consistent"}}
    h = headline([within], CLAIM)
    assert h.estimate_verdict == "consistent" and "exceeds" not in h.text and "composed over all steps" in h.text


def test_without_a_claim_a_zero_bound_shows_no_leakage():
    zero = {**FORMAL_OK, "claimed_epsilon": None, "verdict": None}
    assert zero["epsilon_lower_bound"] == 0.0
    assert headline([zero], None).text.startswith("no leakage shown (formal, multi-run"), headline([zero], None).text
    small = {**zero, "epsilon_lower_bound": 0.5}
    assert headline([small], None).text.startswith("leaks: ε ≥ 0.5 shown (formal"), headline([small], None).text


def test_equal_bounds_pick_the_most_powerful_design_and_unknown_power_counts_as_none():
    weak, strong = {**FORMAL_OK, "max_certifiable_epsilon": None}, {**FORMAL_OK, "max_certifiable_epsilon": 9.0}
    for audits in ([weak, FORMAL_OK, strong], [strong, FORMAL_OK, weak]):
        assert headline(audits, CLAIM).formal["max_certifiable_epsilon"] == 9.0
    assert headline([weak, FORMAL_OK], CLAIM).formal["max_certifiable_epsilon"] == FORMAL_OK["max_certifiable_epsilon"]


def test_check_verdict_at_the_boundaries():
    check_verdict({**FORMAL_BAD, "claimed_epsilon": None})  # no claim: nothing to contradict
    check_verdict({**CURVE_REFUTED, "verdict": "consistent"})  # a curve test decides its own verdict
    tie = {**FORMAL_OK, "epsilon_lower_bound": 1.0, "claimed_epsilon": 1.0}
    check_verdict(tie)  # equal is not above
    with pytest.raises(InputError, match=r"\(formal\) reads 'violation'.* is not above"):
        check_verdict({**tie, "verdict": "violation"})
    with pytest.raises(InputError, match=r"\(estimate\) reads 'violation'"):
        check_verdict({**ESTIMATE_BAD, "verdict": "violation"})


def test_effective_verdict_keeps_its_own_and_reads_unknown_power_as_none():
    assert effective_verdict(FORMAL_BAD, {"epsilon": 100.0}) == "violation"  # its own verdict, not the model's claim
    unclaimed = {**FORMAL_OK, "verdict": None, "claimed_epsilon": None}
    assert effective_verdict(unclaimed, CLAIM) == "consistent"  # its max certifiable ε (3.37) exceeds the claim
    weak = {**unclaimed, "max_certifiable_epsilon": None}
    assert effective_verdict(weak, {"epsilon": 0.5}) == "inconclusive"
