"""The result of an empirical privacy audit: plain data, JSON-ready."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Method = Literal["clopper-pearson", "gdp", "one-run"]
ThresholdSelection = Literal["holdout", "bonferroni", "fixed"]
Verdict = Literal["violation", "consistent", "inconclusive"]

METHODS: tuple[str, ...] = ("clopper-pearson", "gdp", "one-run")
THRESHOLD_SELECTIONS: tuple[str, ...] = ("holdout", "bonferroni", "fixed")


def decide_verdict(lower_bound: float, claimed: float | None, max_certifiable: float) -> Verdict | None:
    """Compare a lower bound with a claimed ε.

    ``violation`` when the bound exceeds the claim; ``inconclusive`` when the claim is at or above
    what this design could ever certify (even a perfect attack could not refute it); otherwise
    ``consistent``. ``None`` when there is no claim.
    """
    if claimed is None:
        return None
    if lower_bound > claimed:
        return "violation"
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
        method: "clopper-pearson" (hypothesis-testing bound), "gdp" (μ-GDP estimate) or "one-run".
        confidence: the confidence level 1 − α of the bound.
        delta: the δ at which ε is bounded.
        claimed_epsilon: the ε the mechanism claims, if any.
        verdict: "violation" | "consistent" | "inconclusive", or None without a claim.
        max_certifiable_epsilon: the bound a perfect attack would give with this design (sample
            sizes, confidence, threshold/guess selection).
        counts: n_members, n_nonmembers and the counts the bound was computed from.
        threshold: the decision threshold (predict member iff score ≥ threshold), or None.
        threshold_selection: "holdout", "bonferroni" or "fixed".
        formal: True for a formal high-confidence lower bound, False for an estimate.
        notes: human-readable caveats.
        details: method-specific numbers (rate bounds, μ, per-test α, tests tried, ...).
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
    notes: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d

    @property
    def is_estimate(self) -> bool:
        return not self.formal

    @property
    def design_too_small(self) -> bool:
        return self.claimed_epsilon is not None and self.claimed_epsilon >= self.max_certifiable_epsilon

    def summary(self) -> str:
        """A few human-readable lines (used by the CLI and by assert_dp messages)."""
        kind = "formal lower bound" if self.formal else "estimate"
        lines = [
            f"epsilon lower bound: {_fmt(self.epsilon_lower_bound)} ({kind}, {self.method}, "
            f"confidence {self.confidence:g}, delta {self.delta:g})",
            f"threshold selection: {self.threshold_selection}"
            + (f", threshold {self.threshold:.6g}" if self.threshold is not None else ""),
            f"max certifiable epsilon (perfect attack, same design): {_fmt(self.max_certifiable_epsilon)}",
        ]
        if self.claimed_epsilon is not None:
            lines.append(f"claimed epsilon: {_fmt(self.claimed_epsilon)}  ->  verdict: {self.verdict}")
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4g}"
