"""The result of an empirical privacy audit: plain data, JSON-ready."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from dpaudit import numfmt
from dpaudit.errors import InputError

Method = Literal["clopper-pearson", "gdp", "one-run", "one-run-fdp"]
ThresholdSelection = Literal["holdout", "bonferroni", "fixed"]
Design = Literal["membership", "canaries", "multi-run"]
Verdict = Literal["violation", "curve-refuted", "estimate-exceeds-claim", "consistent", "inconclusive"]

METHODS: tuple[str, ...] = ("clopper-pearson", "gdp", "one-run", "one-run-fdp")
THRESHOLD_SELECTIONS: tuple[str, ...] = ("holdout", "bonferroni", "fixed")
# How the member bits were produced (see :func:`dpaudit.audit.audit_scores`):
#   "multi-run"  — one score per independent run of the mechanism on D (member) or D′ (non-member);
#   "canaries"   — the canaries of one run, each included independently with probability 1/2;
#   "membership" — members/non-members of an ordinary model: not independent trials (the safe default).
DESIGNS: tuple[str, ...] = ("membership", "canaries", "multi-run")
# "greater": higher score = member; "less": lower score = member; "two-sided": either (α split in half).
ALTERNATIVES: tuple[str, ...] = ("greater", "less", "two-sided")
VERDICTS: tuple[str, ...] = ("violation", "curve-refuted", "estimate-exceeds-claim", "consistent", "inconclusive")
# What exit code 1 stands for (``--fail-on-violation``): a formal refutation of the claim as stated —
# a formal ε lower bound above the claimed ε ("violation") or the claimed trade-off curve refuted
# ("curve-refuted", the one-run f-DP audit against the claim's own curve family). The two verdicts
# say which was shown; neither is ever given by an estimate.
FORMAL_REFUTATIONS: tuple[str, ...] = ("violation", "curve-refuted")
# Opt-in exit code 1 (``--fail-on-estimate``): an estimate above the claim.
ESTIMATE_REFUTATIONS: tuple[str, ...] = ("estimate-exceeds-claim",)
# A gate that cannot fail must not pass: with ``--fail-on-violation`` an audit whose verdict is one of these
# (the design could not refute the claim whatever the mechanism does) exits 2, never 0 (a CI job would pass
# on a test that proves nothing) and never 1 (nothing was refuted).
CANNOT_REFUTE: tuple[str, ...] = ("inconclusive",)
# Nor may a gate pass that has no formal test at all: with ``--fail-on-violation`` alone, an audit whose every
# result is an estimate (:func:`tests_formally`) could never exit 1, so it exits 2 (dpaudit.cli.audit._exit_code).


def tests_formally(result: AuditResult) -> bool:
    """Whether ``result`` can formally refute its claim: a formal ε lower bound, or a formal refutation of the
    claim's own trade-off curve (``refutation``; its ε is an estimate but the refutation is formal)."""
    return result.formal or result.refutation is not None


def is_formal(method: str, design: str) -> bool:
    """Whether ``method`` gives a formal lower bound on scores produced by ``design``.

    Only two pairings meet their theorem's sampling assumption: Clopper–Pearson on independent runs
    ("multi-run"; Jagielski et al. 2020, arXiv:2006.07709) and the one-run test on canaries included
    independently with probability 1/2 ("canaries"; Steinke, Nasr & Jagielski 2023, arXiv:2305.08846,
    Theorem 3.1). The gdp method is an estimate on any design (it assumes a Gaussian trade-off curve).
    The one-run f-DP test ("one-run-fdp" on "canaries"; Mahloujifar, Melis & Chaudhuri 2025,
    arXiv:2410.22235) is formal here; :func:`dpaudit.audit.audit_scores` downgrades its ε to an
    estimate for every trade-off family whose ε conversion assumes the curve's shape: the GDP family
    and the claim's own curve families (DP-SGD, one DP-SGD step), whose refutation is formal but is a
    refutation of a *curve*, not an ε lower bound for every mechanism (see ``AuditResult.refutation``).
    """
    return (method, design) in {("clopper-pearson", "multi-run"), ("one-run", "canaries"), ("one-run-fdp", "canaries")}


def decide_verdict(
    lower_bound: float,
    claimed: float | None,
    max_certifiable: float,
    *,
    formal: bool = True,
    refutes_curve: bool = False,
) -> Verdict | None:
    """Compare a lower bound with a claimed ε.

    When the bound exceeds the claim: ``violation`` if the bound is a formal ε lower bound;
    ``curve-refuted`` if it is the ε of a refuted curve of the claim's own family (``refutes_curve``:
    the family is nested and its ε(δ) increases with the parameter, so a refuted curve whose ε exceeds
    the claim means the claimed curve itself is refuted — formal, but about the curve, not ε); else
    ``estimate-exceeds-claim`` (an estimate is evidence, never proof). Otherwise ``inconclusive`` when
    the claim is at or above what this design could ever certify (even a perfect attack could not
    refute it), else ``consistent``. ``None`` when there is no claim.
    """
    if claimed is None:
        return None
    for name, value in (("lower_bound", lower_bound), ("claimed", claimed), ("max_certifiable", max_certifiable)):
        if math.isnan(value):  # every comparison with NaN is False: the verdict would read "consistent"
            raise InputError(f"expected {name} to be a number, got NaN")
    if lower_bound > claimed:
        if formal:
            return "violation"
        return "curve-refuted" if refutes_curve else "estimate-exceeds-claim"
    if claimed >= max_certifiable:
        return "inconclusive"
    return "consistent"


@dataclass(frozen=True)
class AuditResult:
    """An ε lower bound from membership/attack scores and what it says about a claim.

    Attributes:
        epsilon_lower_bound: ε ≥ 0 (natural-log units). Formal (holds with probability ≥
            ``confidence``) when ``formal`` is True; an estimate under a modelling assumption
            (see ``notes``) otherwise.
        method: "clopper-pearson" (hypothesis-testing bound), "gdp" (μ-GDP estimate), "one-run" or
            "one-run-fdp" (the one-run canaries against a trade-off curve).
        confidence: the confidence level 1 − α of the bound.
        delta: the δ at which ε is bounded.
        claimed_epsilon: the ε the mechanism claims, if any.
        verdict: "violation" (formal ε lower bound above the claim) | "curve-refuted" (the claimed
            trade-off curve is formally refuted; see ``refutation``) | "estimate-exceeds-claim" (an
            estimate above the claim: evidence, not proof) | "consistent" | "inconclusive", or None
            without a claim.
        max_certifiable_epsilon: the bound a perfect attack would give with this design (sample
            sizes, confidence, threshold/guess selection, one- or two-sided).
        counts: n_members, n_nonmembers and the counts the bound was computed from.
        threshold: the decision threshold, or None. Predict member iff score ≥ threshold, or iff
            score ≤ threshold when ``details["direction"]`` is "less".
        threshold_selection: "holdout", "bonferroni" or "fixed".
        formal: True for a formal high-confidence lower bound, False for an estimate.
        design: how the member bits were produced: "multi-run", "canaries" or "membership".
        notes: human-readable caveats.
        details: method-specific numbers (rate bounds, μ, per-test α, tests tried, direction, ...).
        refutation: set by the one-run f-DP audit against the claim's own curve family (DP-SGD's curves,
            one DP-SGD step's): what was formally shown about *curves* — ``statement`` (one sentence),
            ``family``, ``curve`` (e.g. "DP-SGD"), ``parameter`` ("noise_multiplier"),
            ``refuted_noise_multiplier_from`` (every curve of the family with a noise multiplier at
            least this is refuted at ``confidence``; None when none is), ``claimed_curve_refuted`` (None
            without a claim).
            ``epsilon_lower_bound`` is then the ε of the leakiest refuted curve: an estimate (an ε lower
            bound only for mechanisms whose curve has the family's shape), and ``formal`` is False.
    """

    epsilon_lower_bound: float
    method: Method
    confidence: float
    delta: float
    claimed_epsilon: float | None
    verdict: Verdict | None
    max_certifiable_epsilon: float
    counts: dict[str, int]
    threshold: float | None
    threshold_selection: ThresholdSelection
    formal: bool
    design: Design = "membership"
    notes: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    refutation: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d

    @property
    def design_too_small(self) -> bool:
        return self.claimed_epsilon is not None and self.claimed_epsilon >= self.max_certifiable_epsilon

    def summary(self) -> str:
        """A few human-readable lines (used by the CLI and by assert_dp messages)."""
        lines = []
        # dpaudit.numfmt: the bound rounded down (what is printed must be implied by what was computed), the claim
        # and the max certifiable ε up (a claim is never under-reported), each beside the ONE printed claim in the
        # order computed (numfmt.against): "max certifiable 2 ... claimed 2 -> inconclusive" hid that 1.9995 < 2,
        # and "max certifiable 8 ... claimed 7.99996 -> inconclusive" read as the opposite of the verdict.
        claimed, (bound,), (most,) = numfmt.against(
            self.claimed_epsilon, [self.epsilon_lower_bound], [self.max_certifiable_epsilon], digits=4
        )
        if self.refutation is not None:
            lines.append(f"{self.refutation['statement']} (formal, confidence {numfmt.lower(self.confidence, 6)})")
        # δ as given (numfmt.exact): the claim's, or the bound's; never rounded to another δ.
        delta = numfmt.exact(self.delta)
        if self.formal:
            head = f"epsilon lower bound: {bound} (formal lower bound"
        else:
            head = f"epsilon estimate: {bound} (ESTIMATE, not a formal lower bound"
        confidence = numfmt.lower(self.confidence, 6)  # rounded down: never "confidence 1" for 0.9999999
        lines += [
            f"{head}, {self.method}, design {self.design}, confidence {confidence}, delta {delta})",
            f"threshold selection: {self.threshold_selection}"
            # + 0.0: a loss attack's threshold -0.0 (a loss of 0, negated) read "threshold -0" (IEEE 754: -0 + 0 = +0)
            + (f", threshold {self.threshold + 0.0:.6g}" if self.threshold is not None else "")
            + (f", direction {self.details['direction']}" if self.details.get("alternative") == "two-sided" else ""),
            f"max certifiable epsilon (perfect attack, same design): {most}",
        ]
        if self.claimed_epsilon is not None:
            lines.append(f"claimed epsilon: {claimed}  ->  verdict: {self.verdict}")
        for note in self.notes:
            if self.refutation is None or note != self.refutation["statement"]:  # already the first line
                lines.append(f"note: {note}")
        return "\n".join(lines)
