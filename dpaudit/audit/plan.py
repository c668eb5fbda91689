"""Planning an audit: how many runs (or canaries) a design needs before it can refute a claim.

An audit can only refute a claimed ε below its *max certifiable ε* — the bound a perfect attack
would give with the same sample sizes, confidence, threshold selection and direction
(:func:`dpaudit.audit.max_certifiable_epsilon`). A claim at or above it is "inconclusive" whatever
the data say. :func:`trials_needed` inverts that: the smallest size whose max certifiable ε exceeds a
target, so that a test of the target claim has at least the *possibility* of failing.

Because it assumes a perfect attack (every test decision right), the answer is a lower bound on what
a real audit needs: a real attack's error rates make the bound smaller, often much smaller.

    >>> from dpaudit.audit import trials_needed
    >>> trials_needed(2.0, delta=1e-5)  # runs with and runs without the record, each
    59
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dpaudit.audit.bounds import max_certifiable_epsilon
from dpaudit.audit.result import ALTERNATIVES, METHODS, THRESHOLD_SELECTIONS
from dpaudit.errors import InputError
from dpaudit.validation import check_choice, check_in_interval, check_non_negative, check_positive_int

DEFAULT_MAX_TRIALS = 10**8


def _smallest_size(method: str, selection: str) -> int:
    """Smallest trials per side (one-run: canaries) that the design accepts."""
    if method == "one-run":
        return 4 if selection == "holdout" else 2  # the one-run holdout split needs ≥ 4 canaries
    return 2 if selection == "holdout" else 1  # holdout needs ≥ 2 of each class


def _certifiable(n: int, method: str, delta: float, confidence: float, selection: str, alternative: str) -> float:
    """max certifiable ε with n trials per side (one-run: n canaries, about half of them included)."""
    n_pos, n_neg = (n - n // 2, n // 2) if method == "one-run" else (n, n)
    return max_certifiable_epsilon(
        n_pos, n_neg, method=method, delta=delta, confidence=confidence, threshold_selection=selection,
        alternative=alternative,
    )  # fmt: skip


def trials_needed(
    target_epsilon: float,
    *,
    delta: float = 1e-5,
    confidence: float = 0.95,
    method: str = "clopper-pearson",
    threshold_selection: str = "holdout",
    alternative: str = "greater",
    max_trials: int = DEFAULT_MAX_TRIALS,
) -> int:
    """Smallest design size whose max certifiable ε exceeds ``target_epsilon``.

    The size is the number of trials *per side* (runs with the record and, as many, runs without it)
    for the threshold methods ("clopper-pearson", "gdp"), and the number of canaries m for "one-run".
    With fewer, even a perfect attack leaves a claim of ``target_epsilon`` "inconclusive"
    (:func:`dpaudit.audit.decide_verdict`).

    It assumes a perfect attack, so it is a **lower bound** on what an audit needs: any real attack
    makes errors and certifies less with the same size.

    Search: doubling from the smallest size the design accepts, then bisection, which returns n with
    max certifiable ε(n − 1) ≤ target < max certifiable ε(n). The max certifiable ε is nondecreasing
    in n for holdout and fixed threshold designs; with Bonferroni selection the grid of anchors grows
    with n and lowers it by up to ~0.2% where an anchor is added, and one-run guess counts are floors of
    fractions of m, so there the answer may exceed the very smallest size by the width of such a dip.

    Raises:
        InputError: when no size up to ``max_trials`` reaches the target. In particular the one-run
            method with δ > 0 has a ceiling: its δ term grows as 2mδ (Steinke, Nasr & Jagielski 2023,
            arXiv:2305.08846, Section 5), so its max certifiable ε peaks at some m and then decreases
            towards a limit; the search stops once it has fallen over two successive doublings and
            reports the peak found.
    """
    target = check_non_negative(target_epsilon=target_epsilon)
    if math.isinf(target):
        raise InputError("expected target_epsilon to be finite: no finite design certifies epsilon = inf")
    delta = check_in_interval(0.0, 1.0, lo_open=False, delta=delta)
    confidence = check_in_interval(0.0, 1.0, confidence=confidence)
    method = check_choice(METHODS, method=method)
    selection = check_choice(THRESHOLD_SELECTIONS, threshold_selection=threshold_selection)
    alternative = check_choice(ALTERNATIVES, alternative=alternative)
    max_trials = check_positive_int(max_trials=max_trials)
    if method == "gdp" and delta == 0.0:
        raise InputError("the gdp method needs delta > 0")
    if method == "one-run" and selection == "fixed":
        raise InputError("plan a one-run design with threshold_selection 'holdout' or 'bonferroni'")

    def f(n: int) -> float:
        return _certifiable(n, method, delta, confidence, selection, alternative)

    lo = _smallest_size(method, selection)
    if lo > max_trials:
        raise InputError(f"expected max_trials >= {lo} for this design, got {max_trials}")
    v_lo = f(lo)
    if v_lo > target:
        return lo
    # Doubling: f(lo) <= target at every step; stop at the first size above the target.
    history = [(lo, v_lo)]
    hi = lo
    while True:
        if hi >= max_trials:
            best_n, best_v = max(history, key=lambda t: t[1])
            raise InputError(
                f"epsilon = {target:g} is not certifiable with up to {max_trials} "
                f"{_unit(method)}: at most {best_v:.3g} (at {best_n}); lower the confidence or the target epsilon"
            )
        hi = min(2 * hi, max_trials)
        v_hi = f(hi)
        if v_hi > target:
            break
        history.append((hi, v_hi))
        if method == "one-run" and delta > 0.0 and len(history) >= 3:
            (_, a), (_, b), (_, c) = history[-3:]
            if 0.0 < a and c < b < a:  # past the peak: the δ term 2mδ now dominates
                best_n, best_v = max(history, key=lambda t: t[1])
                raise InputError(
                    f"epsilon = {target:g} is out of reach of the one-run method at delta = {delta:g}: its max "
                    f"certifiable epsilon peaks at about {best_v:.3g} (near {best_n} canaries) and decreases for "
                    "more canaries (the 2*m*delta term of Steinke et al. 2023); audit independent runs instead "
                    "(clopper-pearson, design multi-run)"
                )
        lo = hi
    # Bisection keeps f(lo) <= target < f(hi).
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if f(mid) > target:
            hi = mid
        else:
            lo = mid
    return hi


def _unit(method: str) -> str:
    return "canaries" if method == "one-run" else "trials per side"


@dataclass(frozen=True)
class DesignPlan:
    """The smallest design that could refute a claim of ``target_epsilon`` (see :func:`plan_design`).

    Attributes:
        target_epsilon: the ε the audit must be able to refute.
        method, threshold_selection, alternative: the audit's design, as for ``audit_scores``.
        trials: runs per side (threshold methods) or canaries (one-run).
        unit: "trials per side" or "canaries".
        max_certifiable_epsilon: what a perfect attack certifies at ``trials`` (> target_epsilon).
        confidence, delta: as for ``audit_scores``.
        note: what the number means and assumes.
    """

    target_epsilon: float
    method: str
    threshold_selection: str
    alternative: str
    trials: int
    unit: str
    max_certifiable_epsilon: float
    confidence: float
    delta: float
    note: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"{self.trials} {self.unit} needed to refute epsilon = {self.target_epsilon:g} "
            f"({self.method}, {self.threshold_selection}, {self.alternative}, confidence {self.confidence:g}, "
            f"delta {self.delta:g}); max certifiable epsilon there: {self.max_certifiable_epsilon:.4g}\n"
            f"note: {self.note}"
        )


def plan_design(
    target_epsilon: float,
    *,
    delta: float = 1e-5,
    confidence: float = 0.95,
    method: str = "clopper-pearson",
    threshold_selection: str = "holdout",
    alternative: str = "greater",
    max_trials: int = DEFAULT_MAX_TRIALS,
) -> DesignPlan:
    """:func:`trials_needed` with the design it was computed for, as plain data (for the CLI)."""
    n = trials_needed(
        target_epsilon, delta=delta, confidence=confidence, method=method, threshold_selection=threshold_selection,
        alternative=alternative, max_trials=max_trials,
    )  # fmt: skip
    if method == "one-run":
        note = (
            "canaries in one run, each included independently with probability 1/2; assumes a perfect attack "
            "(every guess right), so a real audit needs more"
        )
    else:
        note = (
            "independent runs with the record and as many without it; assumes a perfect attack (no test "
            "errors), so a real audit needs more"
        )
    return DesignPlan(
        target_epsilon=float(target_epsilon),
        method=method,
        threshold_selection=threshold_selection,
        alternative=alternative,
        trials=n,
        unit=_unit(method),
        max_certifiable_epsilon=float(
            _certifiable(n, method, float(delta), float(confidence), threshold_selection, alternative)
        ),
        confidence=float(confidence),
        delta=float(delta),
        note=note,
    )


__all__ = ["DEFAULT_MAX_TRIALS", "DesignPlan", "plan_design", "trials_needed"]
