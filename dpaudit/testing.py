"""Privacy assertions for users' own test suites.

    from dpaudit.testing import assert_dp

    def my_mechanism(data, rng):
        return data.sum() + rng.normal(0.0, 5.0)

    def test_my_mechanism_is_private():
        assert_dp(my_mechanism, np.array([1.0, 0.0]), np.array([0.0, 0.0]), epsilon=1.0, delta=1e-5, trials=20_000)

The mechanism is run ``trials`` times on each of two neighbouring datasets; its outputs become
membership scores ("member" = a run on ``data``) and are audited with
:func:`dpaudit.audit.audit_scores`. A failed assertion is evidence (at the chosen confidence) that
the claim is false; a pass only means this test could not refute it (see ``max_certifiable_epsilon``
of the returned result for what the design could detect at all).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from dpaudit.audit.bounds import audit_scores
from dpaudit.audit.result import AuditResult
from dpaudit.errors import InputError
from dpaudit.validation import check_choice, check_in_interval, check_non_negative, check_positive_int

Mechanism = Callable[[Any, np.random.Generator], Any]

PILOT_FRACTION = 0.2
_MIN_TRIALS = 20


def _run(mechanism: Mechanism, data: Any, trials: int, rng: np.random.Generator, which: str) -> np.ndarray:
    rows = []
    for i in range(trials):
        out = mechanism(data, rng)
        try:
            x = np.atleast_1d(np.asarray(out, dtype=float))
        except (TypeError, ValueError):
            raise InputError(
                f"mechanism output on {which} must be a float or a 1-D numeric array, got {out!r}"
            ) from None
        if x.ndim != 1:
            raise InputError(f"mechanism output on {which} must be a float or a 1-D array, got shape {x.shape}")
        if rows and x.shape != rows[0].shape:
            raise InputError(
                f"mechanism output on {which} changed shape from {rows[0].shape} to {x.shape} at trial {i}"
            )
        if not np.all(np.isfinite(x)):
            raise InputError(f"mechanism output on {which} is not finite at trial {i}: {x}")
        rows.append(x)
    return np.stack(rows)


def _projection(pilot_in: np.ndarray, pilot_out: np.ndarray) -> np.ndarray:
    """Direction of Fisher's linear discriminant, Σ⁻¹(μ_in − μ_out), from the pilot runs.

    For Gaussian outputs with a shared covariance this is the likelihood-ratio direction (Neyman–
    Pearson optimal); for a scalar output it reduces to the sign of the mean difference. A small ridge
    (1e-6 of the mean variance) keeps Σ invertible for degenerate coordinates.
    """
    diff = pilot_in.mean(axis=0) - pilot_out.mean(axis=0)
    d = pilot_in.shape[1]
    if d == 1:
        return np.array([1.0 if diff[0] >= 0 else -1.0])
    cov = 0.5 * (np.cov(pilot_in, rowvar=False) + np.cov(pilot_out, rowvar=False))
    ridge = 1e-6 * max(float(np.trace(cov)) / d, 1e-300)
    w = np.linalg.solve(cov + ridge * np.eye(d), diff)
    if not np.any(w):
        w = np.ones(d)
    return w


def audit_mechanism(
    mechanism: Mechanism,
    data: Any,
    neighbour: Any,
    *,
    epsilon: float,
    delta: float,
    trials: int,
    confidence: float = 0.95,
    seed: int = 0,
    method: str = "clopper-pearson",
) -> AuditResult:
    """Audit ``mechanism``'s claim of (epsilon, delta)-DP on one pair of neighbouring datasets.

    ``mechanism(data, rng) -> float | 1-D array`` is run ``trials`` times on ``data`` and ``trials``
    times on ``neighbour`` with a ``np.random.Generator`` seeded by ``seed``. The first 20% of the runs
    on each side (the pilot) only choose the test statistic: the outputs' projection on Fisher's
    discriminant direction (just the sign for scalar outputs). The other 80% are scored with it and
    audited by :func:`dpaudit.audit.audit_scores` (holdout threshold selection).

    Formal guarantee (method "clopper-pearson"): if the mechanism is (epsilon, delta)-DP, the verdict
    is "violation" with probability ≤ 1 − confidence. Method "gdp" gives a tighter estimate that
    assumes Gaussian trade-offs. Detecting a violation needs enough trials: the result's
    ``max_certifiable_epsilon`` is the largest ε this many trials could ever refute.
    """
    epsilon = check_non_negative(epsilon=epsilon)
    trials = check_positive_int(trials=trials)
    check_in_interval(0.0, 1.0, confidence=confidence)
    method = check_choice(("clopper-pearson", "gdp"), method=method)
    if trials < _MIN_TRIALS:
        raise InputError(f"expected trials >= {_MIN_TRIALS}, got {trials}")
    rng = np.random.default_rng(seed)
    x_in = _run(mechanism, data, trials, rng, "data")
    x_out = _run(mechanism, neighbour, trials, rng, "neighbour")
    if x_in.shape[1] != x_out.shape[1]:
        raise InputError(f"mechanism output sizes differ: {x_in.shape[1]} on data, {x_out.shape[1]} on neighbour")
    n_pilot = max(2, round(PILOT_FRACTION * trials))
    w = _projection(x_in[:n_pilot], x_out[:n_pilot])
    s_in, s_out = x_in[n_pilot:] @ w, x_out[n_pilot:] @ w
    result = audit_scores(
        np.concatenate([s_in, s_out]),
        np.r_[np.ones(len(s_in), bool), np.zeros(len(s_out), bool)],
        method=method,
        delta=delta,
        confidence=confidence,
        claimed_epsilon=epsilon,
        seed=rng,
    )
    note = f"test statistic learned on a pilot of {n_pilot} runs per side; audited on the other {trials - n_pilot}"
    return dataclasses.replace(result, notes=(*result.notes, note), details={**result.details, "pilot_trials": n_pilot})


def assert_dp(
    mechanism: Mechanism,
    data: Any,
    neighbour: Any,
    *,
    epsilon: float,
    delta: float,
    trials: int,
    confidence: float = 0.95,
    seed: int = 0,
    method: str = "clopper-pearson",
) -> AuditResult:
    """Raise AssertionError when the audit refutes the (epsilon, delta)-DP claim; else return the result.

    Same arguments and guarantee as :func:`audit_mechanism`. The message states the ε lower bound
    and the claimed ε.
    """
    result = audit_mechanism(
        mechanism, data, neighbour, epsilon=epsilon, delta=delta, trials=trials,
        confidence=confidence, seed=seed, method=method,
    )  # fmt: skip
    if result.verdict == "violation":
        kind = "formal lower bound" if result.formal else "estimate"
        raise AssertionError(
            f"mechanism is not ({epsilon:g}, {delta:g})-DP: epsilon lower bound {result.epsilon_lower_bound:.4g} "
            f"> claimed epsilon {epsilon:g} ({kind}, {result.method}, confidence {result.confidence:g})\n"
            + result.summary()
        )
    return result


__all__ = ["assert_dp", "audit_mechanism"]
