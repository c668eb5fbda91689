"""The likelihood ratio attack (LiRA) of Carlini et al. 2022, "Membership Inference Attacks From First
Principles" (arXiv:2112.03570), on a signals matrix.

Design (ML Privacy Meter): reference models are summarised by an ``(n_records, n_models)`` matrix of
signals, here the logit-scaled confidence phi of each reference model on each candidate record, and a
boolean matrix of the same shape saying whether the record was IN that model's training set. The
attack never sees a model, only these arrays and the target model's signal on each record.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from scipy.special import log_ndtr
from scipy.stats import norm

from attacks.threshold import check_logits, logit_margin
from dpaudit.errors import InputError
from dpaudit.validation import check_choice, check_positive, check_positive_int, host_array

#: phi = log p_y - log(1 - p_y), float64 from logits (see :func:`attacks.threshold.logit_margin`).
logit_scaled_confidence = logit_margin

#: Below this many reference models the per-record variance is too noisy; Carlini et al. 2022 (§VI)
#: estimate one global variance instead.
GLOBAL_VARIANCE_BELOW = 64


def signals_matrix(logits: Any, labels: Any) -> np.ndarray:
    """Signals matrix ``(n_records, n_models)`` of phi from stacked logits ``(n_models, n_records, k)``."""
    z = np.asarray(host_array(logits), dtype=np.float64)
    if z.ndim != 3:
        raise InputError(f"expected stacked logits of shape (n_models, n_records, n_classes), got {z.shape}")
    return np.stack([logit_scaled_confidence(zm, labels) for zm in z], axis=1)


def balanced_membership(n_records: int, n_models: int, *, seed: int | np.random.Generator = 0) -> np.ndarray:
    """IN matrix ``(n_records, n_models)`` for reference training on a population: each record is IN
    for exactly floor(M/2) models (one more for a random half of the records when M is odd), so
    every record has as many IN as OUT models (Carlini et al. 2022, §IV: "each example is in half of
    the shadow models"). Model j trains on the records whose column j is True (about half)."""
    check_positive_int(n_models=n_models)
    rng = np.random.default_rng(seed)
    counts = np.full(n_records, n_models // 2)
    if n_models % 2:
        counts += rng.integers(0, 2, n_records)
    # Ranks of a random permutation per row: IN for the models ranked below the record's count.
    ranks = np.argsort(rng.random((n_records, n_models)), axis=1).argsort(axis=1)
    return ranks < counts[:, None]


def _check_matrix(signals: Any, in_mask: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(host_array(signals), dtype=np.float64)
    m = np.asarray(host_array(in_mask))
    if s.ndim != 2:
        raise InputError(f"expected a signals matrix of shape (n_records, n_models), got {s.shape}")
    if m.shape != s.shape:
        raise InputError(f"IN matrix has shape {m.shape}, expected the signals' shape {s.shape}")
    if m.dtype != bool:
        raise InputError(f"IN matrix must be boolean, got dtype {m.dtype}")
    if not np.all(np.isfinite(s)):
        raise InputError("signals contain NaN or inf")
    return s, m


def _masked_mean_std(s: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-row mean and unbiased std over masked entries, and the pooled within-row std.

    The pooled std sqrt(sum_i sum_j (s_ij - mu_i)^2 / sum_i (n_i - 1)) is the maximum-likelihood-style
    estimate of one variance shared by all records, each with its own mean (our reading of the
    "global variance" of Carlini et al. 2022, §VI; rows with one model contribute nothing to it).
    """
    n = mask.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = np.where(mask, s, 0.0).sum(axis=1) / n
        sq = np.where(mask, (s - mu[:, None]) ** 2, 0.0).sum(axis=1)
        std = np.sqrt(sq / (n - 1))
    dof = np.maximum(n - 1, 0).sum()
    pooled = float(np.sqrt(sq[n > 0].sum() / dof)) if dof > 0 else float("nan")
    return mu, std, pooled


class LiRA:
    """Likelihood ratio attack (Carlini et al. 2022, arXiv:2112.03570, Algorithm 1).

    Parameters
    ----------
    online : fit IN and OUT Gaussians per record and score the log-likelihood ratio (Alg. 1);
        offline: OUT Gaussian only, one-sided test (§IV-D "offline attack").
    global_variance : True, False or "auto" (global when fewer than 64 reference models, §VI).
    min_models : fewest IN (online) and OUT reference models a record needs.
    on_insufficient : "raise" (InputError) or "warn" (RuntimeWarning, the record is still scored)
        when a record has fewer than ``min_models`` but at least one. Zero models always raises.
    min_std : floor on every standard deviation (signals in phi units), so identical signals
        (e.g. a constant model) cannot divide by zero.

    Learned attributes: ``mean_in_``, ``mean_out_``, ``std_in_``, ``std_out_`` (per record),
    ``n_in_``, ``n_out_``, ``global_variance_`` (bool), ``n_models_``, ``std_floor_sides_`` (the sides, "IN" and/or
    "OUT", on which some record's std is ``min_std`` because no variance could be estimated: e.g. 2 reference
    models with min_models=1 give every record one OUT model).
    """

    def __init__(
        self,
        *,
        online: bool = True,
        global_variance: bool | str = "auto",
        min_models: int = 2,
        on_insufficient: str = "raise",
        min_std: float = 1e-6,
    ) -> None:
        self.online = online
        self.global_variance = global_variance
        self.min_models = min_models
        self.on_insufficient = on_insufficient
        self.min_std = min_std

    def fit(self, signals: Any, in_mask: Any, *, record_ids: Any = None) -> LiRA:
        """Estimate the per-record IN/OUT Gaussians from reference signals and their IN matrix.

        ``record_ids`` (optional, one per row) only names records in guard messages.
        """
        check_positive_int(min_models=self.min_models)
        check_choice(("raise", "warn"), on_insufficient=self.on_insufficient)
        check_positive(min_std=self.min_std)
        if self.global_variance not in (True, False, "auto"):
            raise InputError(f"expected global_variance True, False or 'auto', got {self.global_variance!r}")
        s, m = _check_matrix(signals, in_mask)
        ids = np.arange(len(s)) if record_ids is None else np.asarray(record_ids)
        n_in, n_out = m.sum(axis=1), (~m).sum(axis=1)
        self._guard(n_out, "OUT", ids)
        if self.online:
            self._guard(n_in, "IN", ids)
        self.n_models_ = s.shape[1]
        self.global_variance_ = (
            self.n_models_ < GLOBAL_VARIANCE_BELOW if self.global_variance == "auto" else bool(self.global_variance)
        )
        mu_in, std_in, pooled_in = _masked_mean_std(s, m)
        mu_out, std_out, pooled_out = _masked_mean_std(s, ~m)
        if self.global_variance_:
            std_in = np.full(len(s), pooled_in)
            std_out = np.full(len(s), pooled_out)
        else:  # per-record variance; a record with a single model falls back to the pooled value
            std_in = np.where(n_in >= 2, std_in, pooled_in)
            std_out = np.where(n_out >= 2, std_out, pooled_out)
        # nan_to_num: pooled std is NaN when no record has two models on that side (e.g. 1 IN model each).
        # The sides whose std is then the floor, not an estimate (offline scores read the OUT side only).
        self.std_floor_sides_ = tuple(
            side
            for side, std in (("IN", std_in), ("OUT", std_out))
            if (self.online or side == "OUT") and bool(np.isnan(std).any())
        )
        floor = self.min_std
        self.std_in_ = np.maximum(np.nan_to_num(std_in, nan=floor), floor)
        self.std_out_ = np.maximum(np.nan_to_num(std_out, nan=floor), floor)
        self.mean_in_, self.mean_out_ = mu_in, mu_out
        self.n_in_, self.n_out_ = n_in, n_out
        return self

    def _guard(self, counts: np.ndarray, side: str, ids: np.ndarray) -> None:
        low = np.flatnonzero(counts < self.min_models)
        if not len(low):
            return
        shown = ", ".join(f"{ids[i]} ({counts[i]})" for i in low[:8])
        more = f" and {len(low) - 8} more" if len(low) > 8 else ""
        msg = (
            f"LiRA: {len(low)} record(s) have fewer than {self.min_models} {side} reference models "
            f"(record id (count): {shown}{more}); train more reference models or lower min_models"
        )
        if self.on_insufficient == "raise" or counts[low].min() == 0:
            raise InputError(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def score(self, target_signals: Any) -> np.ndarray:
        """Membership scores (higher = member) of the target model's signals, one per fitted record.

        Online: log N(phi; mu_in, s_in^2) - log N(phi; mu_out, s_out^2) (Carlini et al. 2022, Alg. 1,
        line "Lambda = p(conf_obs | N(mu_in, s_in^2)) / p(conf_obs | N(mu_out, s_out^2))", in log space).
        Offline: the one-sided test (§IV-D) Lambda = 1 - Pr[Z > phi] = Phi(t), Z ~ N(mu_out, s_out^2),
        t = (phi - mu_out) / s_out (members have larger phi than OUT models give), reported as its
        log-odds log Phi(t) - log Phi(-t): a strictly increasing function of Lambda, so the same ROC,
        and in float64 it does not saturate (about t^2 / 2 for large t). log Phi(t) rounds to 0 for every
        t >= 38 (Phi(-38) ~ 3e-316), tying records the paper's Lambda ranks apart: with 2 reference
        models (one OUT per record, so the std is the ``min_std`` floor) 1,428 of 2,000 synthetic
        records tied at 0, AUC 0.72 instead of 0.85.
        """
        if not hasattr(self, "mean_out_"):
            raise InputError("LiRA.score called before fit")
        x = np.asarray(host_array(target_signals), dtype=np.float64)
        if x.shape != self.mean_out_.shape:
            raise InputError(f"expected {self.mean_out_.shape[0]} target signals, got shape {x.shape}")
        if not np.all(np.isfinite(x)):
            raise InputError("target signals contain NaN or inf")
        if not self.online:
            t = (x - self.mean_out_) / self.std_out_
            return log_ndtr(t) - log_ndtr(-t)
        return norm.logpdf(x, loc=self.mean_in_, scale=self.std_in_) - norm.logpdf(
            x, loc=self.mean_out_, scale=self.std_out_
        )

    def fit_score(self, signals: Any, in_mask: Any, target_signals: Any, *, record_ids: Any = None) -> np.ndarray:
        return self.fit(signals, in_mask, record_ids=record_ids).score(target_signals)


def lira_from_logits(
    target_logits: Any,
    reference_logits: Any,
    labels: Any,
    in_mask: Any,
    **params: Any,
) -> np.ndarray:
    """Convenience: LiRA scores from target logits ``(n, k)``, reference logits ``(m, n, k)``, labels and
    the IN matrix ``(n, m)``; ``params`` go to :class:`LiRA`."""
    z, y = check_logits(target_logits, labels, labelled=True)
    return LiRA(**params).fit_score(signals_matrix(reference_logits, y), in_mask, logit_scaled_confidence(z, y))
