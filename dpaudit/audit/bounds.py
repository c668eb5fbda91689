"""From membership scores to ε lower bounds with valid confidence.

Score convention: higher = member. ``member[i]`` says whether score i came from a run on the dataset
with the target record (or canary) — "member" — or from the neighbouring dataset without it.

Methods:

* ``"clopper-pearson"`` — hypothesis-testing bound (Jagielski et al. 2020, arXiv:2006.07709; Nasr et
  al. 2021, arXiv:2101.04535). Formal guarantee: holds with probability ≥ confidence whenever the
  member scores are i.i.d. draws of a post-processing of M(D) and the non-member scores i.i.d. draws
  of the same post-processing of M(D′) (e.g. one score per independent training run): design
  "multi-run" only; on the default design ("membership") and on "canaries" it is an estimate.
* ``"gdp"`` — the tightest μ consistent with Clopper–Pearson bounds on (FPR, FNR), converted to
  ε(δ) (Nasr et al. 2023, arXiv:2302.07956). Estimate: formal only if the mechanism's trade-off
  curve is Gaussian (μ-GDP). Elsewhere it can exceed the true ε: the Laplace mechanism's curve is
  flatter in the tails than the Gaussian fitted to its middle (``dpaudit audit selftest --method gdp``
  shows the false alarms).
* ``"one-run"`` — Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846). Formal guarantee: holds when
  each canary was included independently with probability 1/2 and the scores come from one run.
* ``"one-run-fdp"`` — the same design tested against a trade-off curve family (Mahloujifar, Melis &
  Chaudhuri 2025, arXiv:2410.22235; :mod:`dpaudit.audit.fdp_one_run`): ``tradeoff="gdp"`` (an estimate
  of ε), ``"epsilon-delta"`` (formal) or the claim's own curve, e.g. ``dpsgd_family(q, T)`` (the curve's
  refutation is formal, its ε an estimate).

Designs — how the member bits were produced, which decides whether a bound is formal:

* ``"multi-run"`` — one score per independent run of the mechanism on D (member) or D′ (non-member):
  independent trials, so Clopper–Pearson is formal.
* ``"canaries"`` — the m canaries of one run, each included independently with probability 1/2: the
  one-run theorem applies; Clopper–Pearson does not (the scores share one run's randomness, so they
  are not independent trials) and gives an estimate.
* ``"membership"`` (default) — members and non-members of an ordinary model (e.g. a training set and
  a holdout set): not independent trials of the mechanism on neighbouring datasets, so every method
  gives an estimate.

Threshold (or guess-count) selection never reuses data without correction: ``holdout`` chooses on a
seeded random half and evaluates on the other (the half drawn on a canonical order of the records, so
their order does not matter, and the choice made at a fixed reference level, so a smaller α or a
larger δ never raises the bound: :mod:`dpaudit.audit.holdout`), ``bonferroni`` searches a grid fixed in advance on all
data and splits α across every confidence bound involved, ``fixed`` uses a user-given value.

Direction: scores are "higher = member" (``alternative="greater"``) or "lower = member" ("less").
When the direction is not known in advance, ``"two-sided"`` audits both the scores and their
negation, each at level α/2, and reports the larger bound: by the union bound both directions' bounds
hold at once with probability ≥ 1 − α (Bonferroni over the two directions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import binomtest

from dpaudit import numfmt
from dpaudit.accounting.gdp import gdp_epsilon_lower
from dpaudit.audit import fdp_one_run, holdout, one_run
from dpaudit.audit.holdout import select_then_evaluate, split
from dpaudit.audit.result import (
    ALTERNATIVES,
    DESIGNS,
    METHODS,
    THRESHOLD_SELECTIONS,
    AuditResult,
    decide_verdict,
    is_formal,
)
from dpaudit.audit.stats import clopper_pearson_upper, gdp_mu_lower_bound, hypothesis_test_epsilon
from dpaudit.errors import InputError
from dpaudit.validation import (
    check_choice,
    check_in_interval,
    check_non_negative,
    check_same_index,
    check_seed,
    host_array,
    python_scalar,
    shown,
)

# Candidate thresholds examined on the selection half of a holdout split (any number is valid there;
# this only caps the cost).
_MAX_HOLDOUT_CANDIDATES = 4096
_SEED_SALT = 0xA0D17  # see _as_rng
# Level of the test that the canaries' inclusion rate is 1/2 (see _audit_one_run): a one-run result whose
# inclusion bits it rejects is an estimate.
INCLUSION_TEST_ALPHA = 1e-3
# Ratio of the geometric grid of anchor ranks searched by the Bonferroni threshold selection.
_RANK_RATIO = 1.5
_GDP_NOTE = (
    "estimate: the gdp method assumes the mechanism's trade-off curve is Gaussian (mu-GDP); the mu "
    "lower bound is formal only under that assumption (Nasr et al. 2023, arXiv:2302.07956)"
)
_DESIGN_NOTES = {
    "membership": (
        "estimate: design='membership' - members and non-members of one model are not independent runs of "
        "the mechanism on neighbouring datasets, so the sampling assumption of a formal bound does not hold; "
        "for a formal bound, score independent training runs (`dpaudit audit train`; `audit scores --design "
        "multi-run`) or train with canaries (`dpaudit train --canaries M`, audited one-run)"
    ),
    "canaries": (
        "estimate: the canaries of one run are not independent trials (their scores share the run's "
        "randomness), so a Clopper-Pearson bound on them is not formal; the one-run method is "
        "(Steinke, Nasr & Jagielski 2023, arXiv:2305.08846)"
    ),
}


# --------------------------------------------------------------------------------------------------
# Threshold tests: predict "member" iff score >= t.


def _objective(method: str, fpr_u, fnr_u, delta: float):
    """Quantity maximised over thresholds: ε (clopper-pearson) or μ (gdp; ε(δ) increases in μ)."""
    if method == "gdp":
        return gdp_mu_lower_bound(fpr_u, fnr_u)
    return hypothesis_test_epsilon(fpr_u, fnr_u, delta)


def _sorted(x: np.ndarray) -> np.ndarray:
    """``np.sort(x)``, without sorting when ``x`` is sorted already (as in ``audit plan``'s simulated audits, which
    pass the records in the canonical order: :func:`dpaudit.audit.holdout.in_canonical_order`). The same bits: the
    scores here are finite and carry no -0.0 (:func:`_as_scores`; an oriented "less" copy has only -0.0), so
    values that compare equal are identical and every sorted arrangement of them is the same array."""
    return x if bool(np.all(x[1:] >= x[:-1])) else np.sort(x)


def _distinct(x_sorted: np.ndarray) -> np.ndarray:
    """The distinct values of a sorted array, in order (np.unique's, without its sort)."""
    return x_sorted[np.r_[True, x_sorted[1:] != x_sorted[:-1]]] if len(x_sorted) else x_sorted


def _counts_at(pos_sorted: np.ndarray, neg_sorted: np.ndarray, t):
    fn = np.searchsorted(pos_sorted, t, side="left")  # members with score < t
    fp = len(neg_sorted) - np.searchsorted(neg_sorted, t, side="left")  # non-members with score >= t
    return fp, fn


def rank_grid(n: int) -> np.ndarray:
    """Anchor ranks 0, 1, 2, 3, 5, 7, 11, ... ≤ n/2 (geometric, ratio 1.5); depends on n only."""
    ks = {0}
    x = 1.0
    while x <= n // 2:
        ks.add(int(x))
        x *= _RANK_RATIO
    return np.array(sorted(k for k in ks if k <= n - 1), dtype=np.int64)


@dataclass(frozen=True)
class _ThresholdOutcome:
    value: float  # ε (clopper-pearson) or μ (gdp)
    threshold: float
    fp: int
    fn: int
    n_pos: int
    n_neg: int
    fpr_upper: float
    fnr_upper: float
    alpha_per_bound: float
    n_thresholds: int


def _evaluate_fixed(method, pos, neg, t, alpha, delta) -> _ThresholdOutcome:
    pos_s, neg_s = _sorted(pos), _sorted(neg)
    fp, fn = _counts_at(pos_s, neg_s, t)
    a = alpha / 2.0  # union bound over the two Clopper–Pearson bounds (FPR and FNR)
    fpr_u = clopper_pearson_upper(fp, len(neg), a)
    fnr_u = clopper_pearson_upper(fn, len(pos), a)
    return _ThresholdOutcome(
        value=float(_objective(method, fpr_u, fnr_u, delta)), threshold=float(t), fp=int(fp), fn=int(fn),
        n_pos=len(pos), n_neg=len(neg), fpr_upper=float(fpr_u), fnr_upper=float(fnr_u), alpha_per_bound=a,
        n_thresholds=1,
    )  # fmt: skip


def _select_threshold(method, pos, neg) -> float:
    """Threshold maximising the bound on the selection half (any rule is valid on held-out data), scored at the
    reference level of :mod:`dpaudit.audit.holdout` (not the user's α and δ: "Level-free selection")."""
    pos_s, neg_s = _sorted(pos), _sorted(neg)
    # Every distinct ROC point: just above each non-member score, at each member score.
    # The distinct values of each sorted class first (O(n); the same set, so the same np.unique), which leaves
    # np.unique little to sort when scores repeat (a randomized-response leak's 0s and 1s in audit plan).
    cand = np.unique(np.concatenate([np.nextafter(_distinct(neg_s), np.inf), _distinct(pos_s)]))
    if len(cand) > _MAX_HOLDOUT_CANDIDATES:
        cand = cand[np.unique(np.linspace(0, len(cand) - 1, _MAX_HOLDOUT_CANDIDATES).round().astype(int))]
    fp, fn = _counts_at(pos_s, neg_s, cand)
    a = holdout.SELECTION_ALPHA / 2.0  # one Clopper–Pearson bound per rate, as in _evaluate_fixed
    fpr_u, fnr_u = clopper_pearson_upper(fp, len(neg), a), clopper_pearson_upper(fn, len(pos), a)
    obj = _objective(method, fpr_u, fnr_u, holdout.SELECTION_DELTA)
    if np.max(obj) <= 0.0:  # nothing certifiable on this half: fall back to the best accuracy (Youden's J)
        obj = (len(pos) - fn) / len(pos) - fp / len(neg)
    # Ties (e.g. a run of thresholds inside a gap between the classes): take the candidate at their
    # median *index*, away from the edges of the gap, where the held-out data are least likely to fall
    # on the wrong side. An index (not the median of the values) depends on the ranks only, so a
    # strictly increasing transform of the scores selects the same test.
    idx = np.flatnonzero(obj == np.max(obj))
    return float(cand[idx[len(idx) // 2]])


def _bonferroni_thresholds(method, pos, neg, alpha, delta) -> _ThresholdOutcome:
    """Search thresholds anchored at order statistics with fixed ranks, Bonferroni-corrected.

    Anchors: just above the (k+1)-th largest non-member score (so FP ≤ k) for k in rank_grid(n_neg),
    and at the (k+1)-th smallest member score (so FN ≤ k) for k in rank_grid(n_pos). The ranks are
    fixed by the sample sizes alone. For an anchored rate the event "true rate > CP_upper(k)" has
    probability ≤ α' for each rank (order-statistic form of Clopper–Pearson: it happens only if at
    most k of n draws exceed the level where the tail mass equals CP_upper(k)); the other rate is an
    ordinary binomial count given the anchoring sample, which is independent of it. With K anchors
    there are 2K confidence bounds, each at α' = α / (2K), so all hold at once with probability
    ≥ 1 − α (union bound) and the maximum over anchors is a valid bound.
    """
    n_pos, n_neg = len(pos), len(neg)
    pos_s, neg_s = _sorted(pos), _sorted(neg)
    r_neg, r_pos = rank_grid(n_neg), rank_grid(n_pos)
    k_total = len(r_neg) + len(r_pos)
    a = alpha / (2.0 * k_total)
    # Non-member anchors: t = next float above the (k+1)-th largest non-member score.
    t_neg = np.nextafter(neg_s[n_neg - 1 - r_neg], np.inf)
    fp_neg, fn_neg = _counts_at(pos_s, neg_s, t_neg)
    fpr_u_neg = clopper_pearson_upper(r_neg, n_neg, a)  # the rank k, not the (tie-reduced) count
    fnr_u_neg = clopper_pearson_upper(fn_neg, n_pos, a)
    # Member anchors: t = the (k+1)-th smallest member score.
    t_pos = pos_s[r_pos]
    fp_pos, fn_pos = _counts_at(pos_s, neg_s, t_pos)
    fpr_u_pos = clopper_pearson_upper(fp_pos, n_neg, a)
    fnr_u_pos = clopper_pearson_upper(r_pos, n_pos, a)

    t = np.concatenate([t_neg, t_pos])
    fp = np.concatenate([fp_neg, fp_pos])
    fn = np.concatenate([fn_neg, fn_pos])
    fpr_u = np.concatenate([fpr_u_neg, fpr_u_pos])
    fnr_u = np.concatenate([fnr_u_neg, fnr_u_pos])
    obj = np.atleast_1d(_objective(method, fpr_u, fnr_u, delta))
    i = int(np.argmax(obj))
    return _ThresholdOutcome(
        value=float(obj[i]), threshold=float(t[i]), fp=int(fp[i]), fn=int(fn[i]), n_pos=n_pos, n_neg=n_neg,
        fpr_upper=float(fpr_u[i]), fnr_upper=float(fnr_u[i]), alpha_per_bound=a, n_thresholds=k_total,
    )  # fmt: skip


def _direction_alpha(alpha: float, alternative: str) -> float:
    """α of each direction's test: "two-sided" runs two tests, so each gets α/2 (union bound)."""
    return alpha / 2.0 if alternative == "two-sided" else alpha


def _directions(alternative: str) -> tuple[str, ...]:
    return ("greater", "less") if alternative == "two-sided" else (alternative,)


def _oriented(scores: np.ndarray, direction: str) -> np.ndarray:
    """Scores in the "higher = member" orientation of ``direction`` (negated for "less")."""
    return scores if direction == "greater" else -scores


def _threshold_max_certifiable(method, n_pos, n_neg, alpha_per_bound, delta) -> float:
    """The bound of a perfect attack (FP = FN = 0) with these evaluation sizes and per-bound α."""
    fpr_u = clopper_pearson_upper(0, n_neg, alpha_per_bound)
    fnr_u = clopper_pearson_upper(0, n_pos, alpha_per_bound)
    v = float(_objective(method, fpr_u, fnr_u, delta))
    return _to_epsilon(method, v, delta)


def _to_epsilon(method: str, value: float, delta: float) -> float:
    # A lower bound (and the most a perfect attack certifies, compared with it): ε rounded down, never up.
    return gdp_epsilon_lower(value, delta) if method == "gdp" else value


# --------------------------------------------------------------------------------------------------
# Input handling.


def _as_scores(scores) -> np.ndarray:
    try:
        s = np.asarray(host_array(scores), dtype=float)
    except (TypeError, ValueError):
        raise InputError("scores must be numeric") from None
    if s.ndim != 1:
        raise InputError(f"scores must be a 1-D array, got shape {s.shape}")
    bad = np.flatnonzero(~np.isfinite(s))
    if len(bad):
        raise InputError(f"scores must be finite; found {len(bad)} NaN/inf value(s), first at index {bad[0]}")
    # -0.0 + 0.0 = +0.0 and nothing else changes: -0.0 and 0.0 compare equal, so which of them a tie shows (the
    # returned threshold's sign) would otherwise follow the input order.
    return s + 0.0


def _as_member(member) -> np.ndarray:
    try:
        m = np.asarray(host_array(member))
        mf = m.astype(float)
    except (TypeError, ValueError):
        raise InputError("member must be boolean or 0/1") from None
    if m.ndim != 1:
        raise InputError(f"member must be a 1-D array, got shape {m.shape}")
    bad = np.flatnonzero(~np.isin(mf, (0.0, 1.0)))
    if len(bad):
        raise InputError(f"member must be boolean or 0/1; found {shown(m[bad[0]])} at index {bad[0]}")
    return mf.astype(bool)


def _as_rng(seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    # An integer seed (a Generator passes as is), by the one seed rule.
    # Salted so that the audit's stream differs from np.random.default_rng(seed): if the same integer
    # also seeded the data (e.g. canary inclusion), unsalted tie-breaking keys would equal the
    # inclusion draws and leak them into the guesses.
    return np.random.default_rng([check_seed(seed=seed), _SEED_SALT])


def _alpha(confidence: float) -> float:
    """α = 1 − confidence, rounded *down* to 12 decimals (0.95 gives 0.05, not 0.050000000000000044)."""
    a = 1.0 - confidence
    rounded = math.floor(a * 1e12) / 1e12
    return rounded if rounded > 0 else a


def _as_count(name: str, value) -> int:
    value = python_scalar(value)  # a 0-d torch/NumPy/JAX integer is its int
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InputError(f"expected {name} to be a non-negative integer, got {value!r}")
    return int(value)


def _resolve_selection(method, threshold_selection, threshold, k_plus, k_minus) -> str:
    sel = check_choice(THRESHOLD_SELECTIONS, threshold_selection=threshold_selection)
    if method in ("one-run", "one-run-fdp"):
        if threshold is not None:
            raise InputError("threshold does not apply to the one-run method; use k_plus/k_minus")
        if k_plus is not None or k_minus is not None:
            if sel == "bonferroni":
                raise InputError("k_plus/k_minus fix the guess counts; drop threshold_selection='bonferroni'")
            return "fixed"
        if sel == "fixed":
            raise InputError("threshold_selection='fixed' with the one-run method needs k_plus and/or k_minus")
        return sel
    if k_plus is not None or k_minus is not None:
        raise InputError(f"k_plus/k_minus apply only to the one-run method, not {method!r}")
    if threshold is not None:
        if sel == "bonferroni":
            raise InputError("a fixed threshold was given; drop threshold_selection='bonferroni'")
        return "fixed"
    if sel == "fixed":
        raise InputError("threshold_selection='fixed' needs a threshold")
    return sel


# --------------------------------------------------------------------------------------------------
# Public API.


def check_audit_claim(
    *, delta: float, confidence: float, claimed_epsilon: float | None
) -> tuple[float, float, float | None]:
    """The claim an audit tests and its confidence, validated as :func:`audit_scores` does: workflows call it
    before training reference models or runs, so that a bad value costs no work."""
    confidence = check_in_interval(0.0, 1.0, confidence=confidence)
    delta = check_in_interval(0.0, 1.0, lo_open=False, delta=delta)
    if claimed_epsilon is not None:
        claimed_epsilon = check_non_negative(claimed_epsilon=claimed_epsilon)
    return delta, confidence, claimed_epsilon


def audit_scores(
    scores,
    member,
    *,
    method: str = "clopper-pearson",
    delta: float = 1e-5,
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
    threshold_selection: str = "holdout",
    threshold: float | None = None,
    seed: int | np.random.Generator = 0,
    k_plus: int | None = None,
    k_minus: int | None = None,
    design: str = "membership",
    alternative: str = "greater",
    tradeoff="gdp",
) -> AuditResult:
    """ε lower bound (natural log) at ``delta`` from membership scores, and a verdict on a claim.

    Args:
        scores: 1-D float array, higher = member (see ``alternative``).
        member: 1-D bool/0-1 array of the same length: True when the score came from a run with the
            record/canary included.
        method: "clopper-pearson" (hypothesis-testing bound), "gdp" (estimate under μ-GDP), "one-run"
            (the entries are the m canaries of one run, each included with probability 1/2) or "one-run-fdp"
            (the same canaries tested against a trade-off curve, ``tradeoff``).
        delta: δ in [0, 1) at which ε is bounded (the gdp method needs δ > 0).
        confidence: 1 − α in (0, 1).
        claimed_epsilon: the mechanism's claimed ε at ``delta``; gives a verdict.
        threshold_selection: "holdout" (default; choose on a seeded random half, evaluate on the
            other), "bonferroni" (search a fixed grid on all data with α split across every bound)
            or "fixed" (implied by ``threshold`` / ``k_plus``/``k_minus``).
        threshold: fixed decision threshold (predict member iff score ≥ threshold).
        seed: seed (or Generator) for the holdout split and one-run tie-breaking (drawn on a canonical order of
            the records, so the result does not depend on their order: :mod:`dpaudit.audit.holdout`).
        k_plus, k_minus: fixed one-run guess counts (top k_plus guessed in, bottom k_minus out).
        design: how the member bits were produced — "multi-run" (one score per independent run of
            the mechanism on D or D′), "canaries" (canaries of one run, each included independently
            with probability 1/2) or "membership" (members/non-members of an ordinary model; the
            default, because it claims nothing about independence). See the module docstring.
        alternative: "greater" (higher = member), "less" (lower = member) or "two-sided" (direction
            unknown in advance: both directions are audited at α/2 each (with one holdout split of the
            canonical order, :mod:`dpaudit.audit.holdout`) and the larger bound is reported;
            ``details["direction"]`` says which won).
        tradeoff: method "one-run-fdp" only: the hypothesised trade-off family — "gdp" (μ-GDP; the ε of
            the refuted μ is an estimate), "epsilon-delta" (formal ε lower bound) or a
            :class:`dpaudit.audit.fdp_one_run.TradeoffFamily` such as ``dpsgd_family(q, T)`` (the
            claim's own curve: its refutation is formal, ``refutation`` and verdict "curve-refuted"; its ε
            is an estimate).

    Returns:
        AuditResult. ``formal`` is True only for ("clopper-pearson", "multi-run"), ("one-run",
        "canaries") and ("one-run-fdp", "canaries") with ``tradeoff="epsilon-delta"`` (see
        :func:`dpaudit.audit.is_formal`). Formal guarantee in those cases: P[epsilon_lower_bound > true ε] ≤
        1 − confidence under the sampling assumptions in the module docstring, so the verdict is
        "violation" with probability ≤ 1 − confidence for a mechanism that meets its claim. Every
        other pairing is an estimate: a bound above the claim gives "estimate-exceeds-claim", never
        "violation", and a note says why it is not formal.
    """
    method = check_choice(METHODS, method=method)
    design = check_choice(DESIGNS, design=design)
    alternative = check_choice(ALTERNATIVES, alternative=alternative)
    if method in ("one-run", "one-run-fdp") and design != "canaries":
        raise InputError(
            f"the {method} method needs design='canaries' (the canaries of one run, each included independently "
            f"with probability 1/2), got design={design!r}"
        )
    delta, confidence, claimed_epsilon = check_audit_claim(
        delta=delta, confidence=confidence, claimed_epsilon=claimed_epsilon
    )
    if method in ("gdp", "one-run-fdp") and delta == 0.0:
        raise InputError(
            f"the {method} method needs delta > 0 (a mu-GDP mechanism with mu > 0 has epsilon = inf at delta = 0)"
        )
    if threshold is not None:
        threshold = check_in_interval(-math.inf, math.inf, threshold=threshold)
    k_plus = None if k_plus is None else _as_count("k_plus", k_plus)
    k_minus = None if k_minus is None else _as_count("k_minus", k_minus)
    selection = _resolve_selection(method, threshold_selection, threshold, k_plus, k_minus)
    check_same_index(scores=scores, member=member)
    s = _as_scores(scores)
    mem = _as_member(member)
    if len(s) != len(mem):
        raise InputError(f"scores and member differ in length: {len(s)} vs {len(mem)}")
    n_pos, n_neg = int(mem.sum()), int((~mem).sum())
    if n_pos == 0 or n_neg == 0:
        raise InputError(
            f"member has a single class ({n_pos} members, {n_neg} non-members); need both members and non-members"
        )
    rng = _as_rng(seed)
    alpha = _alpha(confidence)
    setup = _Setup(method, design, alternative, delta, alpha, confidence, claimed_epsilon, selection)
    if method == "one-run":
        return _audit_one_run(s, mem, setup, k_plus, k_minus, rng)
    if method == "one-run-fdp":
        return _audit_one_run(s, mem, setup, k_plus, k_minus, rng, fdp_one_run.resolve_family(tradeoff, delta))
    return _audit_threshold(s, mem, setup, threshold, rng)


@dataclass(frozen=True)
class _Setup:
    method: str
    design: str
    alternative: str
    delta: float
    alpha: float
    confidence: float
    claimed: float | None
    selection: str


def _audit_threshold(s, mem, setup: _Setup, threshold, rng) -> AuditResult:
    method, delta, selection = setup.method, setup.delta, setup.selection
    n_pos, n_neg = int(mem.sum()), int((~mem).sum())
    a_dir = _direction_alpha(setup.alpha, setup.alternative)
    if selection == "holdout":
        if n_pos < 2 or n_neg < 2:
            raise InputError(
                f"holdout threshold selection needs at least 2 members and 2 non-members, got {n_pos} and {n_neg}"
            )
        # One stratified split of the canonical order (non-members, then members: np.sort(mem), built without
        # sorting), laid onto the records per direction, so the halves depend on the (score, member) pairs, not
        # their order.
        sel_canonical = split(np.arange(len(mem)) >= n_neg, rng, stratified=True)
        n_sel = int(sel_canonical.sum())
    best: _ThresholdOutcome | None = None
    direction = setup.alternative
    for d in _directions(setup.alternative):
        x = _oriented(s, d)
        if selection == "fixed":
            out = _evaluate_fixed(method, x[mem], x[~mem], threshold if d == "greater" else -threshold, a_dir, delta)
        elif selection == "bonferroni":
            out = _bonferroni_thresholds(method, x[mem], x[~mem], a_dir, delta)
        else:
            out = select_then_evaluate(
                holdout.on_records(sel_canonical, x, mem), (x, mem),
                choose=lambda xs, ms: _select_threshold(method, xs[ms], xs[~ms]),
                evaluate=lambda t, xe, me: _evaluate_fixed(method, xe[me], xe[~me], t, a_dir, delta),
            )  # fmt: skip
        if best is None or out.value > best.value:
            best, direction = out, d
    assert best is not None
    notes: list[str] = []
    if selection == "bonferroni":
        notes.append(
            f"threshold searched over {best.n_thresholds} order-statistic anchors on all data; "
            f"each of the {2 * best.n_thresholds} confidence bounds at alpha = {best.alpha_per_bound:.3g} (Bonferroni)"
        )
    elif selection == "holdout":
        notes.append(
            f"threshold chosen on a random half ({n_sel} records) and evaluated on the other {len(mem) - n_sel}"
        )
    if setup.alternative == "two-sided":
        notes.append(f"two-sided: both score directions audited at alpha/2 each; the {direction!r} direction won")
    eps = _to_epsilon(method, best.value, delta)
    max_cert = _threshold_max_certifiable(method, best.n_pos, best.n_neg, best.alpha_per_bound, delta)
    details = {
        "fpr_upper": best.fpr_upper,
        "fnr_upper": best.fnr_upper,
        "alpha_per_bound": best.alpha_per_bound,
        "n_thresholds_tried": best.n_thresholds,
        "alternative": setup.alternative,
        "direction": direction,
    }
    if method == "gdp":
        details["mu_lower_bound"] = best.value
    counts = {
        "n_members": n_pos,
        "n_nonmembers": n_neg,
        "n_eval_members": best.n_pos,
        "n_eval_nonmembers": best.n_neg,
        "tp": best.n_pos - best.fn,
        "fp": best.fp,
        "tn": best.n_neg - best.fp,
        "fn": best.fn,
    }
    # The reported threshold is on the original scores: "less" predicts member iff score ≤ threshold.
    t_out = best.threshold if direction == "greater" else -best.threshold
    return _finish(setup, eps, max_cert, counts, t_out, notes, details)


def _audit_one_run(s, mem, setup: _Setup, k_plus, k_minus, rng, family=None) -> AuditResult:
    """The one-run design: the (ε, δ) analysis (``family`` None) or the f-DP one against ``family``."""
    m, n_in = len(s), int(mem.sum())
    common = {
        "delta": setup.delta, "alpha": _direction_alpha(setup.alpha, setup.alternative), "rng": rng,
        "selection": setup.selection, "k_plus": k_plus, "k_minus": k_minus,
        "directions": _directions(setup.alternative),
    }  # fmt: skip
    out = one_run.audit(s, mem, **common) if family is None else fdp_one_run.audit(s, mem, family=family, **common)
    # Exact two-sided binomial test of the inclusion rate: the one-run theorems assume each canary included
    # independently with probability 1/2 (Steinke, Nasr & Jagielski 2023, Theorem 3.1). With another rate a
    # constant guess is right more often than 1/2 (10% included: "out" is right 90% of the time, whatever the
    # scores), so the bound of a private mechanism can exceed its ε; a rate the test rejects makes the result
    # an estimate. Under the assumption that happens with probability < INCLUSION_TEST_ALPHA: power only.
    inclusion_p = float(binomtest(n_in, m, 0.5).pvalue)
    fair = inclusion_p >= INCLUSION_TEST_ALPHA
    if fair:
        notes = [] if family is None else [family.note]
    else:  # the family's note says what its refutation would formally show: not so here
        notes = [
            f"estimate: {n_in} of {m} canaries are included (two-sided binomial test of rate 1/2: p = "
            f"{inclusion_p:.2g} < {INCLUSION_TEST_ALPHA:g}); the one-run bound is formal only when each canary is "
            "included independently with probability 1/2, which these inclusion bits contradict"
        ]
    notes += [] if out.note is None else [out.note]
    if setup.alternative == "two-sided":
        notes.append(
            f"two-sided: the ranking and its reverse audited at alpha/2 each; the {out.direction!r} direction won"
        )
    counts = {
        "n_members": n_in, "n_nonmembers": m - n_in, "n_eval_canaries": out.n_eval, "k_plus": out.k_plus,
        "k_minus": out.k_minus, "guesses": out.guesses, "correct": out.correct,
    }  # fmt: skip
    details = {
        "alpha_per_test": out.alpha_per_test, "n_tests": out.n_tests, "alternative": setup.alternative,
        "direction": out.direction, "inclusion_p_value": inclusion_p,
    }  # fmt: skip
    if family is None:
        return _finish(setup, out.epsilon, out.max_certifiable, counts, None, notes, details, formal=fair)
    details |= {
        "tradeoff": family.name, "parameter": family.parameter, "parameter_lower_bound": out.parameter,
        "max_certifiable_parameter": out.max_parameter,
    }  # fmt: skip
    if family.name == "gdp":
        details["mu_lower_bound"] = out.parameter
    # A curve refutation needs the same assumption: with unfair inclusion there is none (the ε is an estimate).
    refutation = None if family.claim_curve is None or not fair else _curve_refutation(family, out, setup)
    return _finish(
        setup, out.epsilon, out.max_certifiable, counts, None, notes, details, formal=family.formal and fair,
        refutation=refutation,
    )  # fmt: skip


def _curve_refutation(family: fdp_one_run.TradeoffFamily, out: fdp_one_run.FdpOutcome, setup: _Setup) -> dict:
    """What the one-run f-DP audit against the claim's own curve family shows: a refutation of curves.

    The family is nested (a larger t = 1/noise multiplier is a leakier curve, a weaker guarantee): a
    mechanism that is not f_t-DP is not f_s-DP for any s ≤ t either, so every curve with a noise
    multiplier ≥ 1/t is refuted with the largest refuted t (:func:`dpaudit.audit.fdp_one_run.largest_refuted`).
    Its ε(δ) increases in t, so the curve whose ε(δ) is the claim is refuted exactly when the refuted
    curve's ε exceeds the claim.
    """
    t, eps = out.parameter, max(0.0, out.epsilon)
    sigma = 1.0 / t if t > 0 else None
    curve, name, claimed = family.claim_curve, family.name, setup.claimed
    # Nothing refuted (t = 0) refutes no claim, whatever the family's epsilon there (0 for every family now).
    refuted = None if claimed is None else (sigma is not None and eps > claimed)
    if sigma is None:
        shown = f"no {name} curve is refuted"
    else:
        # Rounded up, both (dpaudit.numfmt.upper): the refuted curves are those with σ >= sigma, each with ε <= eps,
        # so a printed threshold at or above sigma and a printed ε at or above eps keep the sentence true.
        shown = (
            f"every {name} curve with noise multiplier >= {numfmt.upper(sigma, 4)} is refuted "
            f"(each with epsilon <= {numfmt.upper(eps, 4)})"
        )
    if refuted is None:
        statement = shown[0].upper() + shown[1:]
    elif refuted:
        statement = (
            f"the claimed {curve} curve is refuted: {shown}, and the claim (epsilon = {numfmt.upper(claimed)} at "
            f"delta = {numfmt.exact(setup.delta)}) is one of them; a refutation of the curve, not an epsilon lower "
            "bound"
        )
    else:
        statement = (
            f"the claimed {curve} curve is not refuted: {shown}, not the claim's (epsilon = {numfmt.upper(claimed)})"
        )
    return {
        "statement": statement, "family": name, "curve": curve, "parameter": "noise_multiplier",
        "refuted_noise_multiplier_from": sigma, "claimed_curve_refuted": refuted,
    }  # fmt: skip


def _plan_pointer(setup: _Setup, claim: str) -> str:
    """The `audit plan` command that sizes a design able to refute the claim, for the "design too small" note (its
    README promise: `dpaudit audit plan` says how many runs or canaries). ``claim`` is the claim as the note prints it,
    rounded up, and the confidence is rounded up too: both only enlarge the planned size. The f-DP curve audit
    (one-run-fdp) gets none: the note cannot name its claim's curve in `--tradeoff`'s syntax, and the (epsilon, delta)
    one-run plan sizes another test. A membership design (the model's own members, an estimate) has no size to
    plan: the pointer is to a formal multi-run design."""
    if setup.method == "one-run-fdp":
        return ""
    options = f"--epsilon {claim} --delta {numfmt.exact(setup.delta)}"
    if setup.method != "clopper-pearson":
        options += f" --method {setup.method}"
    if setup.selection == "bonferroni":  # a fixed threshold is not planned; holdout's size is the larger (safe) one
        options += " --threshold-selection bonferroni"
    if setup.alternative == "two-sided":
        options += " --two-sided"
    if setup.confidence != 0.95:
        options += f" --confidence {numfmt.upper(setup.confidence, 6)}"
    what = "the independent runs a formal audit needs" if setup.design == "membership" else "the size needed"
    return f"; `dpaudit audit plan {options}` gives {what}"


def _finish(
    setup: _Setup, eps, max_cert, counts, threshold, notes, details, *, formal: bool = True, refutation=None
) -> AuditResult:
    eps = float(max(0.0, eps))
    max_cert = float(max_cert)
    claimed = setup.claimed
    formal = formal and is_formal(setup.method, setup.design)
    # A claim-curve refutation is formal only where the one-run design is (canaries).
    refutes_curve = refutation is not None and is_formal(setup.method, setup.design)
    caveats = []
    if setup.method == "gdp":
        caveats.append(_GDP_NOTE)
    if not formal and setup.design in _DESIGN_NOTES and setup.method not in ("one-run", "one-run-fdp"):
        caveats.append(_DESIGN_NOTES[setup.design])
    # The refutation's statement leads the notes, so every renderer of notes (Markdown, HTML) shows it.
    notes = [*([] if refutation is None else [refutation["statement"]]), *caveats, *notes]
    if claimed is not None and claimed >= max_cert and eps <= claimed:
        most, claim = numfmt.ordered(max_cert, claimed, left_up=True)  # both upper bounds, in the order computed
        notes.append(
            f"design too small: max certifiable epsilon = {most} <= claimed {claim} -> inconclusive "
            f"(more runs/canaries, or a larger delta, are needed to refute this claim{_plan_pointer(setup, claim)})"
        )
    return AuditResult(
        epsilon_lower_bound=eps,
        method=setup.method,
        confidence=setup.confidence,
        delta=setup.delta,
        claimed_epsilon=claimed,
        verdict=decide_verdict(eps, claimed, max_cert, formal=formal, refutes_curve=refutes_curve),
        max_certifiable_epsilon=max_cert,
        counts=counts,
        threshold=threshold,
        threshold_selection=setup.selection,
        formal=formal,
        design=setup.design,
        notes=tuple(notes),
        details=details,
        refutation=refutation,
    )


def max_certifiable_epsilon(
    n_members: int,
    n_nonmembers: int,
    *,
    method: str = "clopper-pearson",
    delta: float = 1e-5,
    confidence: float = 0.95,
    threshold_selection: str = "holdout",
    k_plus: int | None = None,
    k_minus: int | None = None,
    alternative: str = "greater",
    tradeoff="gdp",
) -> float:
    """Largest ε this design could certify: the bound a perfect attack would give.

    For threshold methods a perfect attack has FP = FN = 0 on the evaluation data (half of each class
    under holdout); for one-run every guess is correct (with the guess counts the selection rule can
    reach; for holdout, on the evaluation half). A claim at or above this value can never be refuted
    by this design. For one-run, ``n_members + n_nonmembers`` is the number of canaries m. With
    ``alternative="two-sided"`` each direction's test runs at α/2, as :func:`audit_scores` does.
    """
    method = check_choice(METHODS, method=method)
    alternative = check_choice(ALTERNATIVES, alternative=alternative)
    confidence = check_in_interval(0.0, 1.0, confidence=confidence)
    delta = check_in_interval(0.0, 1.0, lo_open=False, delta=delta)
    n_pos, n_neg = _as_count("n_members", n_members), _as_count("n_nonmembers", n_nonmembers)
    if n_pos == 0 or n_neg == 0:
        raise InputError("need at least one member and one non-member")
    if method == "gdp" and delta == 0.0:
        raise InputError("the gdp method needs delta > 0")
    alpha = _direction_alpha(_alpha(confidence), alternative)
    k_plus = None if k_plus is None else _as_count("k_plus", k_plus)
    k_minus = None if k_minus is None else _as_count("k_minus", k_minus)
    selection = check_choice(THRESHOLD_SELECTIONS, threshold_selection=threshold_selection)
    if method == "one-run":
        selection = _resolve_selection(method, threshold_selection, None, k_plus, k_minus)
        return one_run.max_certifiable(n_pos + n_neg, delta, alpha, selection, k_plus, k_minus)
    if method == "one-run-fdp":
        if delta == 0.0:
            raise InputError("the one-run-fdp method needs delta > 0")
        selection = _resolve_selection(method, threshold_selection, None, k_plus, k_minus)
        family = fdp_one_run.resolve_family(tradeoff, delta)
        return fdp_one_run.max_certifiable(n_pos + n_neg, family, delta, alpha, selection, k_plus, k_minus)[1]
    if selection == "bonferroni":
        k_total = len(rank_grid(n_neg)) + len(rank_grid(n_pos))
        return _threshold_max_certifiable(method, n_pos, n_neg, alpha / (2.0 * k_total), delta)
    if selection == "holdout":
        n_pos, n_neg = n_pos - n_pos // 2, n_neg - n_neg // 2
    return _threshold_max_certifiable(method, n_pos, n_neg, alpha / 2.0, delta)
