"""Robust membership inference attack (RMIA) of Zarifzadeh et al. 2024, "Low-Cost High-Power Membership
Inference Attacks" (arXiv:2312.03262), on the same signals-matrix design as LiRA, with the signal
log Pr(x | theta) = log p_y (the true label's log-probability, float64 from logits).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import logsumexp

from dpaudit.errors import InputError
from dpaudit.validation import check_in_interval, check_positive, host_array


def _check(signals: Any, in_mask: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(host_array(signals), dtype=np.float64)
    m = np.asarray(host_array(in_mask))
    if s.ndim != 2 or m.shape != s.shape or m.dtype != bool:
        raise InputError(
            f"expected signals (n_records, n_models) with a boolean IN matrix of the same shape, "
            f"got {s.shape} and {m.shape} ({m.dtype})"
        )
    if not np.all(np.isfinite(s)) or (s > 0).any():
        raise InputError("RMIA signals must be finite log-probabilities (<= 0)")
    return s, m


class RMIA:
    """RMIA with log-probability signals.

    Pr(x) is the average of Pr(x | theta') over reference models: all of them online; offline (OUT
    models only) corrected by Zarifzadeh et al. 2024 §4 (offline): Pr(x) = ((1 + a) Pr_OUT(x) + (1 - a)) / 2.
    The score of x is the likelihood ratio log(Pr(x | theta) / Pr(x)). The paper's statistic
    Pr_z[LR(x, z) >= gamma] over population records z (eq. 2-3) is, for one shared set of z, a
    non-decreasing function of that same ratio, so both give the same ranking except that the
    paper's statistic ties records within the same gap between z ratios; :meth:`pairwise_score`
    computes it exactly.

    Learned attributes: ``log_px_`` (log Pr(x) per record), ``n_models_``.
    """

    def __init__(self, *, online: bool = True, offline_a: float = 0.3, gamma: float = 1.0) -> None:
        self.online = online
        self.offline_a = offline_a
        self.gamma = gamma

    def _log_marginal(self, s: np.ndarray, m: np.ndarray) -> np.ndarray:
        use = np.ones_like(m) if self.online else ~m
        n = use.sum(axis=1)
        if (n == 0).any():
            raise InputError(f"RMIA: {int((n == 0).sum())} record(s) have no usable reference model")
        log_mean = logsumexp(np.where(use, s, -np.inf), axis=1) - np.log(n)
        if self.online:
            return log_mean
        a = self.offline_a
        # log(((1 + a) p + (1 - a)) / 2), p = Pr_OUT(x)
        return np.logaddexp(np.log1p(a) + log_mean, np.log1p(-a)) - np.log(2.0) if a < 1 else log_mean

    def fit(self, signals: Any, in_mask: Any) -> RMIA:
        """Reference models' log Pr(x | theta') on the candidates ``(n, m)`` and their IN matrix."""
        check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, offline_a=self.offline_a)
        check_positive(gamma=self.gamma)
        s, m = _check(signals, in_mask)
        self.n_models_ = s.shape[1]
        self.log_px_ = self._log_marginal(s, m)
        return self

    def _log_ratio(self, target: Any, log_px: np.ndarray) -> np.ndarray:
        x = np.asarray(host_array(target), dtype=np.float64)
        if x.shape != log_px.shape:
            raise InputError(f"expected {log_px.shape[0]} target signals, got shape {x.shape}")
        return x - log_px

    def score(self, target_signals: Any) -> np.ndarray:
        """log(Pr(x | theta) / Pr(x)) for the target's log p_y on the fitted records (higher = member)."""
        if not hasattr(self, "log_px_"):
            raise InputError("RMIA.score called before fit")
        return self._log_ratio(target_signals, self.log_px_)

    def pairwise_score(
        self, target_signals: Any, population_signals: Any, population_in_mask: Any, target_population: Any
    ) -> np.ndarray:
        """The paper's score Pr_z[LR(x, z) >= gamma] (Zarifzadeh et al. 2024, eq. 3) with z the
        population records: reference signals ``(n_z, m)`` with their IN matrix, target's ``(n_z,)``."""
        ratio_x = self.score(target_signals)
        s, m = _check(population_signals, population_in_mask)
        ratio_z = np.sort(self._log_ratio(target_population, self._log_marginal(s, m)))
        # LR(x, z) >= gamma  <=>  ratio_z <= ratio_x - log gamma
        return np.searchsorted(ratio_z, ratio_x - np.log(self.gamma), side="right") / len(ratio_z)
