"""Holdout selection, once for every audit: choose the test on one part of the data, evaluate it on the rest.

Every method that picks its test from the data — the threshold of a Clopper–Pearson or GDP audit,
the guess counts (k₊, k₋) of a one-run audit, (ε, δ) or f-DP — does it here: :func:`split` draws the
selection part, :func:`select_then_evaluate` hands the selection part (and only it) to the chooser
and the evaluation part (and only it) to the evaluator. A chooser therefore cannot see the data its
choice is evaluated on, by construction.

Why this keeps the level.

* Independent runs (multi-run designs, stratified split). The evaluation runs are independent of the
  selection runs, so given the selection part the chosen threshold is a fixed number and the
  Clopper–Pearson bounds on the evaluation runs hold at their level (Jagielski et al. 2020,
  arXiv:2006.07709; the usual sample-splitting argument).

* One run with canaries (one-run designs, unstratified split). Here the two parts share one output Y
  of the mechanism, so the chosen guess counts depend on Y and, through Y, on the evaluation part's
  inclusion bits: the number of guesses r on the evaluation part is data-dependent, while the one-run
  p-value is written for a number of guesses r. The level still holds:

  1. Condition on the selection part's inclusion bits S_A = s_A (the split is drawn independently of
     the bits, and the bits are i.i.d. fair coins, so the evaluation bits S_B stay i.i.d. fair coins).
     S_B ↦ M(s_A, S_B) is (ε, δ)-DP (or f-DP) in each coordinate of S_B: two neighbouring S_B are two
     neighbouring inclusion vectors of the canaries.
  2. The evaluation guesses T_B ∈ {−1, 0, 1}^{m_B} are a randomised function of the output Y and s_A
     (the chooser reads Y's selection-part scores and s_A and returns score thresholds; the guesses compare
     Y's evaluation-part scores with them; the tie-breaking keys are independent of everything). That is an
     arbitrary post-processing "A(M(S))" as in the one-run game, with r = ‖T_B‖₁ a function of the output.
  3. The one-run theorems bound the correct guesses *given the guesses*: for every t in the support
     of T, P[W ≥ v | T = t] ≤ p(ε, δ; m, ‖t‖₁, v) (Steinke, Nasr & Jagielski 2023, arXiv:2305.08846,
     Theorem 3.1, whose proof conditions on the output and uses only that each guessed bit, given the
     output and the other bits, is a coin with bias at most e^ε/(1 + e^ε); its approximate-DP form in
     Section 5 is proved through the same conditioning, with the 2mδ term). The f-DP recursion of
     Mahloujifar, Melis & Chaudhuri 2025 (arXiv:2410.22235) is likewise a bound for a given guess
     vector.
  4. Hence P[reject | S_A = s_A] = E[ P[W ≥ v_α(‖T_B‖₁) | T_B] ] ≤ α, and averaging over s_A keeps it.

  So a data-dependent count is as valid as a fixed one *provided the chooser sees only the selection
  part* (step 2: choosing on the evaluation part makes T_B depend on S_B directly, not through Y, and
  breaks step 3 — tests/audit/test_mutations.py plants exactly that). The calibrated stress case
  ``rr-regimes-one-run`` in tests/audit/calibration.py runs mechanisms whose leakage switches between
  runs, so the chosen count swings between a few and most of the canaries, and checks the exceedance
  rate against α.

Record order. The split and the one-run tie-breaking keys are drawn per position of a *canonical order* of
the records (:func:`canonical_order`: non-members then members, each class by score, ties in input order)
and laid onto the records through it (:func:`on_records`), so the result is a function of the multiset of
(score, member) pairs and the seed: a user who sorts the file gets the same bound. Records that tie on both
are interchangeable, so which of them gets which position changes nothing. Validity is untouched: if σ is
a uniform permutation (or u a vector of i.i.d. keys, and a uniform half) drawn independently of the data,
and π any permutation computed from the data, then σ∘π is again uniform and independent of the data,
because P[σ∘π = τ | data] = P[σ = τ∘π⁻¹ | data] = 1/n! for every τ; likewise u∘π is i.i.d. and independent
of the data (u is exchangeable). So the half laid on the records is a uniformly random half (a uniformly
random half of each class when stratified) independent of the scores and the member bits, exactly as a
half drawn per input position, which is all the two arguments above use. A split by a seeded hash of each
record's content would not be: equal records would share a half (a score taking two values could put all
its 0s in one half and its 1s in the other), so the evaluation half would not be a sample of the data.

Level-free selection. The chooser scores its candidates at a fixed reference level
(:data:`SELECTION_ALPHA`, :data:`SELECTION_DELTA`), not at the user's α and δ, so the test chosen is the
same at every level and the certified bound moves with the level as a fixed test's does: a smaller α never
raises it (each confidence bound is wider, Clopper & Pearson 1934; the one-run p-value must fall below a
smaller α, Steinke, Nasr & Jagielski 2023, Theorem 3.1) and a larger δ never raises it (the
hypothesis-testing bound ε ≥ log((1 − δ − FPR)/FNR) falls with δ, Kairouz, Oh & Viswanath 2015,
Theorem 2.1; the one-run p-value's 2mδ term grows with δ, Steinke et al. 2023, Section 5). Choosing at the
user's level let another level choose another test: a larger δ raised a one-run bound from 0.45 to 1.72
(RESULTS.md, "a metamorphic sweep of the attack and audit layers"). Any rule that reads only the selection
part keeps the level (above), and a constant one does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

C = TypeVar("C")
R = TypeVar("R")

# The reference level at which every chooser scores its candidates (see "Level-free selection"): α = 0.01 / 20
# and δ = 1e-5 (audit_scores' default). A selection level stricter than the audit's favours candidates with
# enough counts to replicate on the evaluation half (the best of thousands of candidates is optimistic: winner's
# curse). The choosers used the user's α / 20 before they were made level-free; 0.01 / 20 (that rule at 99 %) was
# measured against it and against 0.05 / 20 (RESULTS.md, "the holdout audit design"): one-run mean bounds at least
# the old rule's at 80-99 % confidence and δ 1e-8 to 1e-3 (+2 % at the default), where 0.05 / 20 lost 3 % at
# 99 % (`audit plan` 356 -> 451 canaries); Clopper-Pearson within 0.1 % at 95-99 %, 1-3 % lower at 80-90 %.
# Any constant keeps the level.
SELECTION_ALPHA = 0.01 / 20.0
SELECTION_DELTA = 1e-5


def canonical_order(scores: np.ndarray, member: np.ndarray) -> np.ndarray:
    """Positions of the records in the canonical order: non-members then members, each by score ascending,
    ties in input order (stable). Positions of a class are the same for every score direction.

    Records already in that order (``audit plan``'s simulated audits pass them so: :func:`in_canonical_order`) give
    the identity without sorting: a stable sort of a sequence already sorted by its key leaves it as it is."""
    scores, member = np.asarray(scores), np.asarray(member, bool)
    if is_canonical(scores, member):
        return np.arange(len(scores))
    return np.lexsort((scores, member))


def is_canonical(scores: np.ndarray, member: np.ndarray) -> bool:
    """Whether the records are in :func:`canonical_order` already: the member bits nondecreasing (non-members
    first) and the scores nondecreasing within each class (O(n), no sort)."""
    scores, member = np.asarray(scores), np.asarray(member, bool)
    same_class = member[1:] == member[:-1]
    return bool(np.all(member[1:] >= member[:-1]) and np.all((scores[1:] >= scores[:-1]) | ~same_class))


def in_canonical_order(scores: np.ndarray, member: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The records (scores and member bits) rearranged into :func:`canonical_order`. Every audit of this module's
    kind reads only the multiset of (score, member) pairs ("Record order" above), so its result is unchanged; what
    changes is its cost: the sorts it then runs find the records sorted. Each class's scores are sorted by value,
    which is the canonical order's (records tying on both are interchangeable)."""
    scores, member = np.asarray(scores), np.asarray(member, bool)
    n_out = len(member) - int(member.sum())
    return np.concatenate([np.sort(scores[~member]), np.sort(scores[member])]), np.arange(len(member)) >= n_out


def on_records(drawn: np.ndarray, scores: np.ndarray, member: np.ndarray) -> np.ndarray:
    """Values ``drawn`` per position of the canonical order (keys, a selection mask), laid onto the records:
    record i gets the value of its canonical position. Valid wherever per-position draws are (module docstring,
    "Record order")."""
    out = np.empty_like(drawn)
    out[canonical_order(scores, member)] = drawn
    return out


def split(member: np.ndarray, rng: np.random.Generator, *, stratified: bool) -> np.ndarray:
    """Boolean mask of the selection part, per position of ``member``; its complement is the evaluation part.
    Callers draw it on the canonical order (``member`` sorted) and lay it on the records with :func:`on_records`.

    ``stratified=True`` (independent runs): floor(n/2) of each class select, so both parts keep both
    classes. ``stratified=False`` (canaries of one run): a uniformly random floor(m/2) of the canaries,
    drawn without looking at the inclusion bits, so the evaluation part's bits stay i.i.d. fair coins.
    """
    member = np.asarray(member, bool)
    sel = np.zeros(len(member), dtype=bool)
    if stratified:
        for idx in (np.flatnonzero(member), np.flatnonzero(~member)):
            sel[rng.permutation(idx)[: len(idx) // 2]] = True
    else:
        sel[rng.permutation(len(member))[: len(member) // 2]] = True
    return sel


def select_then_evaluate(
    select: np.ndarray,
    arrays: Sequence[np.ndarray],
    choose: Callable[..., C],
    evaluate: Callable[..., R],
) -> R:
    """``evaluate(choose(*selection parts), *evaluation parts)``: the only route from data to a choice.

    ``arrays`` are aligned per record (scores, member bits, tie-breaking keys, ...); ``choose`` gets
    each restricted to ``select``, ``evaluate`` gets the choice and each restricted to ``~select``.
    """
    chosen = choose(*(a[select] for a in arrays))
    return evaluate(chosen, *(a[~select] for a in arrays))


__all__ = [
    "SELECTION_ALPHA",
    "SELECTION_DELTA",
    "canonical_order",
    "in_canonical_order",
    "is_canonical",
    "on_records",
    "select_then_evaluate",
    "split",
]
