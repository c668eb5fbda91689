"""Reference-free threshold attacks: membership scores from one model's logits and the true labels.

Each function maps ``logits`` (n, k) and ``labels`` (n,) to scores (n,), **higher = more likely a
member**; thresholding the score is the attack, and the ROC evaluates all thresholds at once.
Everything runs in float64 from log-softmax (never softmax then log), so a confident model's
scores stay distinct instead of collapsing to ties at p = 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import logsumexp

from dpaudit.errors import InputError
from dpaudit.validation import host_array

THRESHOLD_METHODS = ("loss", "confidence", "entropy", "modified-entropy")


def check_logits(logits: Any, labels: Any = None, *, labelled: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate (n, k) finite logits (as float64) and, if given, (n,) integer labels in [0, k).

    ``labelled``: the caller reads each record's true-label logit, so labels None is refused (NumPy would
    index ``z[rows, None]`` as a new axis and fail later with a broadcasting error, or return the wrong shape).
    """
    z = np.asarray(host_array(logits), dtype=np.float64)
    if z.ndim != 2 or z.shape[1] < 2:
        raise InputError(f"expected logits of shape (n_records, n_classes >= 2), got {z.shape}")
    if not np.all(np.isfinite(z)):
        raise InputError("logits contain NaN or inf")
    if labels is None:
        if labelled:
            raise InputError(f"expected labels of shape ({z.shape[0]},), got None: the attack reads the labels")
        return z, None
    y = np.asarray(host_array(labels))
    if y.shape != (z.shape[0],):
        raise InputError(f"expected labels of shape ({z.shape[0]},), got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"labels must be integers, got dtype {y.dtype}")
    if len(y) and (y.min() < 0 or y.max() >= z.shape[1]):
        raise InputError(f"labels must lie in [0, {z.shape[1]}), got range [{y.min()}, {y.max()}]")
    return z, y.astype(np.int64)


def _row_lse(a: np.ndarray) -> np.ndarray:
    """Row-wise logsumexp, (n, 1), of each row sorted first (as :func:`_row_sum`)."""
    return logsumexp(np.sort(a, axis=1), axis=1, keepdims=True)


def _row_sum(a: np.ndarray) -> np.ndarray:
    """Row-wise sum taken in sorted order, so that it is a function of the row's multiset of values.

    A float sum depends on the order of its terms: summed in column order, a record and its copy with the classes
    renamed (columns permuted, label renamed alike) got scores a few ulps apart in 8,386 of 80,000 draws (entropy;
    3 to 10 classes), so a member and a non-member that should tie (counted 1/2 in the AUC) were ranked apart.
    """
    return np.sum(np.sort(a, axis=1), axis=1)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p_j = z_j - logsumexp(z), float64 (exact up to rounding, no overflow; the same whatever the class order)."""
    z = np.asarray(logits, dtype=np.float64)
    return z - _row_lse(z)


def _others_lse(z: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """logsumexp over j != idx[i] of z[i, j] (row-wise; the same whatever the class order)."""
    masked = z.copy()
    masked[np.arange(len(z)), idx] = -np.inf
    return _row_lse(masked)[:, 0]


def logit_margin(logits: Any, labels: Any) -> np.ndarray:
    """phi = log p_y - log(1 - p_y) = z_y - logsumexp_{j != y} z_j, exactly and stably in float64.

    The logit-scaled confidence of Carlini et al. 2022 (arXiv:2112.03570, §IV, "logit scaling"):
    with a = logsumexp_{j!=y}(z_j - z_y), log p_y = -softplus(a) and log(1 - p_y) = -softplus(-a),
    so phi = -a. No probability is formed, so phi stays finite and distinct even when p_y rounds
    to 1 in float64 (where log(p/(1-p)) would be inf).
    """
    z, y = check_logits(logits, labels, labelled=True)
    return z[np.arange(len(z)), y] - _others_lse(z, y)


def loss_score(logits: Any, labels: Any) -> np.ndarray:
    """Negative cross-entropy loss, log p_y: Yeom et al. 2018 (arXiv:1709.01604, §3.2, Alg. 1) predict
    "member" when the loss is below a threshold, i.e. when -loss is above one."""
    return log_p_from_margin(logit_margin(logits, labels))


def log_p_from_margin(phi: np.ndarray) -> np.ndarray:
    """log p_y from the logit margin phi = log p_y - log(1 - p_y) (:func:`logit_margin`): p_y = sigmoid(phi), so
    log p_y = -softplus(-phi), exact for p_y near 0 and near 1."""
    return -np.logaddexp(0.0, -phi)


def confidence_score(logits: Any, labels: Any = None) -> np.ndarray:
    """Log of the top predicted probability, log max_j p_j (label-free; Salem et al. 2019, ML-Leaks,
    arXiv:1806.01246, adversary 3 uses the maximum posterior).

    Computed as -softplus(-(z_max - logsumexp_{j != argmax} z_j)) so it stays distinct near p = 1.
    """
    z, _ = check_logits(logits, labels)
    top = z.argmax(axis=1)
    margin = z[np.arange(len(z)), top] - _others_lse(z, top)
    return -np.logaddexp(0.0, -margin)


def entropy_score(logits: Any, labels: Any = None) -> np.ndarray:
    """Negative Shannon entropy of the prediction, -H(p) = sum_j p_j log p_j (label-free).

    Members tend to get confident, low-entropy predictions (Shokri et al. 2017, arXiv:1610.05820,
    §VI; Song & Mittal 2021, arXiv:2003.10595, §3.1 eq. "Ientr"). p_j log p_j -> 0 as p_j underflows.
    """
    z, _ = check_logits(logits, labels)
    lp = log_softmax(z)
    return _row_sum(np.exp(lp) * lp)


def _log1m_probs(lp: np.ndarray) -> np.ndarray:
    """log(1 - p_j) for every class, stably.

    For p_j < 1/2, log1p(-p_j) is accurate. At most one class per row has p_j >= 1/2; for it,
    1 - p_j = sum_{i != j} p_i, so log(1 - p_j) = logsumexp_{i != j}(log p_i) has no cancellation.
    """
    p = np.exp(lp)
    with np.errstate(divide="ignore"):
        out = np.log1p(-np.minimum(p, 0.5))
    top = lp.argmax(axis=1)
    rows = np.flatnonzero(p[np.arange(len(p)), top] >= 0.5)
    if len(rows):
        out[rows, top[rows]] = _others_lse(lp[rows], top[rows])
    return out


def modified_entropy_score(logits: Any, labels: Any) -> np.ndarray:
    """Negative modified prediction entropy, -Mentr (Song & Mittal 2021, arXiv:2003.10595, §3.1):

        Mentr(p, y) = -(1 - p_y) log p_y - sum_{j != y} p_j log(1 - p_j).

    Mentr is monotonically decreasing in p_y and increasing in the wrong-class p_j, so it uses the
    label (unlike entropy, which is small for confidently *wrong* predictions too).
    """
    z, y = check_logits(logits, labels, labelled=True)
    lp = log_softmax(z)
    p = np.exp(lp)
    l1m = _log1m_probs(lp)
    rows = np.arange(len(z))
    lp_y, l1m_y = lp[rows, y], l1m[rows, y]
    wrong = p * l1m
    wrong[rows, y] = 0.0
    mentr = -np.exp(l1m_y) * lp_y - _row_sum(wrong)  # 1 - p_y as exp(log(1 - p_y)): exact near p_y = 1
    return -mentr


_SCORERS = {
    "loss": loss_score,
    "confidence": confidence_score,
    "entropy": entropy_score,
    "modified-entropy": modified_entropy_score,
}


def threshold_scores(method: str, logits: Any, labels: Any) -> np.ndarray:
    """Scores of one reference-free attack by name (one of :data:`THRESHOLD_METHODS`)."""
    if method not in _SCORERS:
        raise InputError(f"unknown threshold attack {method!r}; valid: {', '.join(THRESHOLD_METHODS)}")
    return _SCORERS[method](logits, labels)
