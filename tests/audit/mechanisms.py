"""Correct mechanisms with a known ε(δ), as score samplers for the soundness tests.

Each mechanism draws ``n_in`` scores of runs with the target record and ``n_out`` without; the
scores are (monotone in) the mechanism's privacy-loss statistic, so threshold tests on them are as
strong as any test. ``true_epsilon(delta)`` is exact (or, for DP-SGD, the accountant's upper bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpaudit.accounting.gdp import gdp_epsilon


@dataclass(frozen=True)
class Mechanism:
    name: str
    sample: Callable[[np.random.Generator, int, int], tuple[np.ndarray, np.ndarray]]
    true_epsilon: Callable[[float], float]
    gaussian_tradeoff: bool  # exactly μ-GDP: the gdp method's assumption holds

    def scores(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n runs with and n without the record: (scores, member)."""
        s_in, s_out = self.sample(rng, n, n)
        return np.concatenate([s_in, s_out]), np.r_[np.ones(n, bool), np.zeros(n, bool)]

    def canaries(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
        """One run over m canaries, each included independently with probability 1/2."""
        included = rng.random(m) < 0.5
        s_in, s_out = self.sample(rng, int(included.sum()), int((~included).sum()))
        scores = np.empty(m)
        scores[included], scores[~included] = s_in, s_out
        return scores, included


def gaussian(sigma: float) -> Mechanism:
    # N(1, σ²) vs N(0, σ²) is exactly (1/σ)-GDP (Dong, Roth & Su 2022, Theorem 2.7).
    return Mechanism(
        f"gaussian(sigma={sigma})",
        lambda rng, a, b: (rng.normal(1.0, sigma, a), rng.normal(0.0, sigma, b)),
        lambda d: gdp_epsilon(1.0 / sigma, d),
        True,
    )


def gdp_scores(mu: float) -> Mechanism:
    """Attack scores N(μ, 1) vs N(0, 1): μ-GDP ground truth."""
    return Mechanism(
        f"gdp-scores(mu={mu})",
        lambda rng, a, b: (rng.normal(mu, 1.0, a), rng.normal(0.0, 1.0, b)),
        lambda d: gdp_epsilon(mu, d),
        True,
    )


def laplace(scale: float) -> Mechanism:
    # Lap(1, b) vs Lap(0, b): exactly (1/b)-DP for every δ ≥ 0.
    return Mechanism(
        f"laplace(b={scale})",
        lambda rng, a, b: (rng.laplace(1.0, scale, a), rng.laplace(0.0, scale, b)),
        lambda d: 1.0 / scale,
        False,
    )


def randomized_response(epsilon: float) -> Mechanism:
    """One bit, truthful with probability e^ε/(1+e^ε): exactly ε-DP and tight for threshold tests."""
    p = 1.0 / (1.0 + math.exp(-epsilon))
    return Mechanism(
        f"randomized-response(eps={epsilon})",
        lambda rng, a, b: ((rng.random(a) < p).astype(float), (rng.random(b) >= p).astype(float)),
        lambda d: epsilon,
        False,
    )


def subsampled_gaussian(q: float, sigma: float, steps: int) -> Mechanism:
    """T steps of Poisson-subsampled Gaussian (sensitivity 1), scored by the exact log-likelihood ratio."""

    def llr(x: np.ndarray) -> np.ndarray:
        return np.logaddexp(math.log1p(-q), math.log(q) + (x - 0.5) / sigma**2).sum(axis=1)

    def sample(rng: np.random.Generator, a: int, b: int):
        x_in = (rng.random((a, steps)) < q) + rng.normal(0.0, sigma, (a, steps))
        return llr(x_in), llr(rng.normal(0.0, sigma, (b, steps)))

    def true_epsilon(d: float) -> float:
        from dpaudit.audit.selftest import poisson_dpsgd_epsilon

        return poisson_dpsgd_epsilon(q, sigma, steps, d)

    return Mechanism(f"subsampled-gaussian(q={q}, sigma={sigma}, T={steps})", sample, true_epsilon, False)


def leak(delta: float) -> Mechanism:
    """Publish the target record with probability δ, else nothing: exactly (0, δ)-DP.

    Member runs output 1 with probability δ (the record is revealed) and 0 otherwise; non-member runs
    always output 0. The total-variation distance is δ, so the mechanism is (0, δ)-DP and (ε, δ′)-DP
    for no finite ε when δ′ < δ: the tightest case for the δ term of every bound.
    """
    return Mechanism(
        f"leak(delta={delta})",
        lambda rng, a, b: ((rng.random(a) < delta).astype(float), np.zeros(b)),
        lambda d: 0.0 if d >= delta else math.inf,
        False,
    )


def leaky_randomized_response(epsilon: float, delta: float) -> Mechanism:
    """With probability δ reveal membership, else ε-randomised response: exactly (ε, δ)-DP.

    Outputs: 2 ("member", revealed), −1 ("non-member", revealed), else one randomised-response bit
    (1 = member) truthful with probability e^ε/(1 + e^ε). Its hockey-stick divergence at e^ε is
    δ·1 + (1 − δ)·0 = δ (the revealed outputs carry all of it), so ε(δ) = ε exactly; at δ′ < δ
    the privacy loss is unbounded.
    """
    p = 1.0 / (1.0 + math.exp(-epsilon))

    def sample(rng: np.random.Generator, a: int, b: int):
        s_in = np.where(rng.random(a) < delta, 2.0, (rng.random(a) < p).astype(float))
        s_out = np.where(rng.random(b) < delta, -1.0, (rng.random(b) >= p).astype(float))
        return s_in, s_out

    return Mechanism(
        f"leaky-randomized-response(eps={epsilon}, delta={delta})",
        sample,
        lambda d: epsilon if d >= delta else math.inf,
        False,
    )
