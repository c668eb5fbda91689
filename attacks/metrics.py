"""Evaluation of membership scores: ROC, AUC, balanced accuracy, advantage, TPR at low FPR, bootstrap CIs.

Convention (the whole ``attacks`` package): a score per candidate record, **higher = more likely a
member**; ``member`` is the ground truth (True = in the target's training set). Pure numpy.

Thresholds: every metric here is a property of the empirical ROC curve, i.e. the best threshold on the
evaluation data itself (the usual way MIAs are reported, Carlini et al. 2022, arXiv:2112.03570 §III).
That is an optimistic, in-sample estimate; the seeded bootstrap intervals show its sampling error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpaudit.errors import InputError
from dpaudit.validation import check_in_interval, check_positive_int, check_same_index, host_array

FPR_TARGETS = (0.001, 0.01, 0.1)


def fpr_key(target: float) -> str:
    """JSON key of an FPR target: 0.001 -> "0.001"."""
    return f"{target:g}"


def nonmembers_needed(fpr: float) -> int:
    """The fewest non-members at which a TPR at false-positive rate ``fpr`` means something: with n
    non-members the smallest non-zero FPR is 1/n, so below it the "TPR at ``fpr``" is the TPR at zero
    false positives, whatever ``fpr`` says (1e-9 absorbs 1/0.001 = 1000.0000000000001)."""
    return math.ceil(1.0 / float(fpr) - 1e-9)


def tpr_at_fpr_resolved(keys: Any, n_nonmembers: int) -> dict[str, bool]:
    """For each FPR key of ``tpr_at_fpr``: whether ``n_nonmembers`` resolve it (:func:`nonmembers_needed`);
    an unresolved TPR is the TPR at zero false positives, and tables show it as "n/a"."""
    return {k: int(n_nonmembers) >= nonmembers_needed(float(k)) for k in keys}


def check_scores(scores: Any, member: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (scores, member) pair: 1-D, same length, no NaN, both classes present."""
    check_same_index(scores=scores, member=member)
    s = np.asarray(host_array(scores), dtype=np.float64)
    m = np.asarray(host_array(member))
    if s.ndim != 1 or m.ndim != 1:
        raise InputError(f"expected 1-D scores and member arrays, got shapes {s.shape} and {m.shape}")
    if len(s) != len(m):
        raise InputError(f"scores has {len(s)} entries but member has {len(m)}")
    if m.dtype != bool:
        if not np.all(np.isin(m, (0, 1))):
            raise InputError("member must be boolean (or 0/1)")
        m = m.astype(bool)
    if np.isnan(s).any():
        raise InputError(f"scores contain {int(np.isnan(s).sum())} NaN value(s)")
    n_in = int(m.sum())
    if n_in == 0 or n_in == len(m):
        raise InputError(
            f"need both members and non-members to evaluate an attack, got {n_in} members "
            f"and {len(m) - n_in} non-members"
        )
    return s, m


def _roc_counts(s: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cumulative (TP, FP) counts and thresholds, one ROC point per distinct score (ties grouped)."""
    order = np.argsort(-s, kind="stable")
    s_sorted, m_sorted = s[order], m[order]
    # Last index of each group of equal scores: a threshold cannot split tied scores, so a tie group
    # is one ROC point (the diagonal segment to it is what counts ties as 1/2 in the AUC).
    # Compare with != rather than np.diff so that tied infinite scores stay one group.
    ends = np.r_[np.flatnonzero(s_sorted[1:] != s_sorted[:-1]), len(s) - 1]
    tp = np.cumsum(m_sorted, dtype=np.int64)[ends]
    fp = ends + 1 - tp
    return np.r_[0, tp], np.r_[0, fp], np.r_[np.inf, s_sorted[ends]]


def roc_curve(scores: Any, member: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empirical ROC ``(fpr, tpr, thresholds)``, starting at (0, 0) and ending at (1, 1).

    Point i is the classifier "member iff score >= thresholds[i]" (thresholds[0] = +inf). Tied
    scores form one point.
    """
    s, m = check_scores(scores, member)
    tp, fp, thr = _roc_counts(s, m)
    return fp / (len(m) - m.sum()), tp / m.sum(), thr


def auc_from_roc(fpr: np.ndarray, tpr: np.ndarray) -> float:
    """Trapezoidal area under a ROC curve.

    On the tie-grouped empirical ROC this equals the Mann–Whitney U statistic divided by n_in*n_out,
    i.e. P(score_member > score_nonmember) + 1/2 P(tie) (Hanley & McNeil 1982, Radiology 143:29).
    """
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))


def tpr_at_fpr_from_roc(fpr: np.ndarray, tpr: np.ndarray, target: float, n_out: int) -> float:
    """Largest TPR among ROC points with FPR <= target (no interpolation beyond the data).

    Honest reading of Carlini et al. 2022 (arXiv:2112.03570, §III): a TPR at FPR ``target`` is only
    claimed for a threshold that actually attains FPR <= target. Counts are compared as integers
    (FP <= floor(target * n_out)), so 1/100 <= 0.01 holds despite floating point. When no point but
    (0, 0) qualifies the answer is 0.
    """
    max_fp = math.floor(target * n_out + 1e-9)
    fp = np.rint(fpr * n_out)
    return float(tpr[fp <= max_fp].max())


def _point_metrics(tp: np.ndarray, fp: np.ndarray, n_in: int, n_out: int, targets) -> dict[str, Any]:
    tpr, fpr = tp / n_in, fp / n_out
    max_fp = [math.floor(t * n_out + 1e-9) for t in targets]
    return {
        "auc": auc_from_roc(fpr, tpr),
        # Best threshold: balanced accuracy = (TPR + TNR)/2 maximised over the ROC points.
        "balanced_accuracy": float(np.max((tpr + 1.0 - fpr) / 2.0)),
        # Membership advantage Adv = TPR - FPR (Yeom et al. 2018, arXiv:1709.01604, Def. 4),
        # maximised over thresholds (the Youden index of the ROC).
        "advantage": float(np.max(tpr - fpr)),
        "tpr_at_fpr": {fpr_key(t): float(tpr[fp <= k].max()) for t, k in zip(targets, max_fp, strict=True)},
    }


def bootstrap_ci(
    scores: Any,
    member: Any,
    *,
    n_bootstrap: int = 200,
    confidence: float = 0.95,
    fpr_targets: tuple[float, ...] = FPR_TARGETS,
    seed: int | np.random.Generator = 0,
) -> dict[str, Any]:
    """Percentile bootstrap intervals of every metric, resampling members and non-members separately
    (stratified, so each replicate keeps the class sizes; Efron & Tibshirani 1993, ch. 13).

    Returns ``{"auc": [lo, hi], "balanced_accuracy": [..], "advantage": [..],
    "tpr_at_fpr": {"0.001": [lo, hi], ...}}``. Deterministic for a given ``seed``.
    """
    s, m = check_scores(scores, member)
    check_positive_int(n_bootstrap=n_bootstrap)
    check_in_interval(0.0, 1.0, confidence=confidence)
    rng = np.random.default_rng(seed)
    # Each class's scores sorted before resampling, so that the intervals are a function of the two multisets of
    # scores: indexing the file order, permuting the records (scores with their member bits) moved the intervals in
    # 184 of 197 random data sets (benchmarks/attack_audit_sweep.py, section metrics).
    s_in, s_out = np.sort(s[m]), np.sort(s[~m])
    n_in, n_out = len(s_in), len(s_out)
    labels = np.r_[np.ones(n_in, bool), np.zeros(n_out, bool)]
    reps: list[dict[str, Any]] = []
    for _ in range(n_bootstrap):
        sb = np.r_[s_in[rng.integers(0, n_in, n_in)], s_out[rng.integers(0, n_out, n_out)]]
        tp, fp, _thr = _roc_counts(sb, labels)
        reps.append(_point_metrics(tp, fp, n_in, n_out, fpr_targets))
    q = [(1 - confidence) / 2 * 100, (1 + confidence) / 2 * 100]

    def interval(values: list[float]) -> list[float]:
        lo, hi = np.percentile(values, q)
        return [float(lo), float(hi)]

    out: dict[str, Any] = {k: interval([r[k] for r in reps]) for k in ("auc", "balanced_accuracy", "advantage")}
    out["tpr_at_fpr"] = {fpr_key(t): interval([r["tpr_at_fpr"][fpr_key(t)] for r in reps]) for t in fpr_targets}
    return out


def evaluate(
    scores: Any,
    member: Any,
    *,
    fpr_targets: tuple[float, ...] = FPR_TARGETS,
    n_bootstrap: int = 200,
    confidence: float = 0.95,
    seed: int | np.random.Generator = 0,
) -> dict[str, Any]:
    """All metrics of one attack: counts, AUC, balanced accuracy, advantage, TPR at each FPR target,
    bootstrap CIs (``n_bootstrap=0`` skips them: ``ci`` is then empty) and the full ROC arrays."""
    s, m = check_scores(scores, member)
    for t in fpr_targets:
        check_in_interval(0.0, 1.0, hi_open=False, fpr_target=t)
    n_in, n_out = int(m.sum()), int((~m).sum())
    tp, fp, _thr = _roc_counts(s, m)
    out: dict[str, Any] = {"n_members": n_in, "n_nonmembers": n_out}
    out.update(_point_metrics(tp, fp, n_in, n_out, fpr_targets))
    out["ci"] = (
        bootstrap_ci(s, m, n_bootstrap=n_bootstrap, confidence=confidence, fpr_targets=fpr_targets, seed=seed)
        if n_bootstrap
        else {}
    )
    out["roc"] = {"fpr": fp / n_out, "tpr": tp / n_in}
    return out


def _corners(fpr: np.ndarray, tpr: np.ndarray) -> np.ndarray:
    """Mask of the points a ROC polyline needs: the ends and every point where the direction changes.

    A point collinear with its neighbours (inside a vertical run of members or a horizontal run of
    non-members) lies on the segment between them, so dropping it leaves the curve unchanged.
    The cross product is exactly 0 there in floating point (one of dx, dy is exactly 0 on both sides).
    """
    keep = np.ones(len(fpr), bool)
    if len(fpr) > 2:
        dx, dy = np.diff(fpr), np.diff(tpr)
        keep[1:-1] = dx[:-1] * dy[1:] - dy[:-1] * dx[1:] != 0
    return keep


def downsample_roc(
    fpr: np.ndarray, tpr: np.ndarray, *, max_points: int = 500, keep_below: float = 0.01
) -> tuple[np.ndarray, np.ndarray]:
    """A ROC curve with at most ``max_points`` points (for plots and JSON).

    First, points inside straight runs are dropped (lossless). If that is not enough, the region
    FPR <= ``keep_below`` is kept exactly (it is where the low-FPR operating points lie, and is kept
    even if it alone exceeds the budget), as are the ends and the points each standard TPR-at-FPR is
    read from; the rest is thinned evenly by index. Thinning only drops points, so the curve never
    shows an operating point the attack does not have.
    """
    fpr, tpr = np.asarray(fpr, np.float64), np.asarray(tpr, np.float64)
    corners = _corners(fpr, tpr)
    fpr, tpr = fpr[corners], tpr[corners]
    n = len(fpr)
    if n <= max_points:
        return fpr, tpr
    keep = fpr <= keep_below
    keep[[0, n - 1]] = True
    for t in FPR_TARGETS:  # the point each reported TPR@FPR is read from
        ok = np.flatnonzero(fpr <= t)
        keep[ok[np.argmax(tpr[ok])]] = True
    budget = max_points - int(keep.sum())
    rest = np.flatnonzero(~keep)
    if budget > 0 and len(rest):
        keep[rest[np.unique(np.linspace(0, len(rest) - 1, min(budget, len(rest))).round().astype(int))]] = True
    return fpr[keep], tpr[keep]
