"""Privacy of DP-SGD-JL (Bu, Gopi, Kulkarni, Lee, Shen & Tantipongpipat 2021, "Fast and memory
efficient differentially private-SGD via JL projections", arXiv:2102.03013; seed paper).

Lemma 4.3: one step (before subsampling) is f-DP with
    f = T(Z_r, N(Z_r/sigma, 1) || Z_r, N(0, 1)),   Z_r = 1 / sqrt(chi2_r / r),
i.e. a Gaussian mechanism whose sensitivity Z_r/sigma is random but *public* (part of the output).
Given Z_r = z the pair is N(z/sigma, 1) vs N(0, 1), so the privacy-loss distribution is the
mixture over z of Gaussian PLDs, and after Poisson subsampling (Thm. 4.1, via Prop. 4.5) the
mixture over z of subsampled-Gaussian PLDs (Z_r has the same law under both hypotheses).

Pessimistic discretisation of Z_r: its range is cut at survival levels (uniform in probability in
the bulk, geometric in the upper tail) and every bin is represented by its *upper* edge. Larger z
is less private (Lemma 4.2: a coupling Z >= Z' gives T(Z...) <= T(Z'...)), so this upper-bounds
the privacy loss. The top bin Z > z_cap is treated as mu = infinity (P and Q mutually singular).
The central limit theorem of Bu et al. 2019 does not apply here: chi^2(f) = inf (Prop. B.5).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from dpaudit.accounting.pld import (
    GaussianPair,
    LossPair,
    MixturePair,
    SubsampledGaussianAdd,
    SubsampledGaussianRemove,
    subsampled_non_private_pairs,
)
from dpaudit.validation import check_non_negative, check_positive_int


def z_r_survival(r: int, z: np.ndarray) -> np.ndarray:
    """P(Z_r > z) = P(chi2_r < r / z^2) (Prop. B.4 gives the density of Z_r)."""
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return stats.chi2.cdf(r / (z * z), r)


def z_r_quantile_upper(r: int, s: np.ndarray) -> np.ndarray:
    """z with P(Z_r > z) = s (accurate for small s: chi2.ppf works from the lower tail)."""
    s = np.asarray(s, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.sqrt(r / stats.chi2.ppf(s, r))


def z_r_bins(r: int, *, n_bulk: int, z_cap: float, tail: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Pessimistic discretisation of Z_r: (bin weights, bin upper edges, mass above z_cap).

    Survival levels: 1 - k/n_bulk in the bulk, then geometric (ratio 0.8) down to ``tail``; levels
    whose quantile exceeds ``z_cap`` are replaced by z_cap itself, whose survival mass becomes the
    infinite-sensitivity top bin. Weights are exact differences of survival levels.
    """
    r = check_positive_int(projections=r)
    bulk = 1.0 - np.arange(1, n_bulk) / n_bulk
    geo = []
    s = 1.0 / n_bulk
    while s > tail:
        s *= 0.8
        geo.append(max(s, tail))
    levels = np.concatenate([bulk, np.array(geo)])
    edges = z_r_quantile_upper(r, levels)
    s_cap = float(z_r_survival(r, np.array([z_cap]))[0])
    keep = (edges < z_cap) & (levels > s_cap)
    levels, edges = levels[keep], edges[keep]
    levels = np.append(levels, s_cap)
    edges = np.append(edges, z_cap)
    weights = -np.diff(np.concatenate([[1.0], levels]))
    good = weights > 0.0
    return weights[good], edges[good], s_cap


def jl_pairs(
    noise_multiplier: float, projections: int, sample_rate: float, max_loss: float, n_bulk: int, tail: float
) -> tuple[LossPair, LossPair | None]:
    """(remove, add) dominating pairs of one Poisson-subsampled DP-SGD-JL step (add/remove neighbours).

    Formal guarantee (seed paper Lemma 4.3, Thm. 4.1) up to the pessimistic discretisation of Z_r
    described in the module docstring. ``sample_rate = 1`` gives the unsubsampled step (symmetric).
    """
    sigma = check_non_negative(noise_multiplier=noise_multiplier)
    q = float(sample_rate)
    if sigma == 0.0:
        return subsampled_non_private_pairs(q)
    # Beyond mu_cap the (subsampled) loss exceeds max_loss with overwhelming probability, so those
    # z are lumped into the infinite-sensitivity top bin (its mass goes to +inf anyway).
    extra = -math.log(q) if q < 1.0 else 0.0
    mu_cap = 8.0 + math.sqrt(64.0 + 2.0 * (max_loss + extra))
    z_tail = float(z_r_quantile_upper(projections, np.array([tail * 1e-3]))[0])
    z_cap = min(sigma * mu_cap, z_tail) if math.isfinite(sigma) else z_tail
    weights, edges, s_cap = z_r_bins(projections, n_bulk=n_bulk, z_cap=z_cap, tail=tail * 1e-3)
    if math.isinf(sigma):
        from dpaudit.accounting.pld import AtomPair

        return AtomPair([0.0], [1.0]), None
    mus = edges / sigma
    top_rem, top_add = subsampled_non_private_pairs(q)
    if q >= 1.0:
        rem = MixturePair([(w, GaussianPair(m)) for w, m in zip(weights, mus, strict=True)] + [(s_cap, top_rem)])
        return rem, None
    rem = MixturePair(
        [(w, SubsampledGaussianRemove(m, q)) for w, m in zip(weights, mus, strict=True)] + [(s_cap, top_rem)]
    )
    assert top_add is not None
    add = MixturePair(
        [(w, SubsampledGaussianAdd(m, q)) for w, m in zip(weights, mus, strict=True)] + [(s_cap, top_add)]
    )
    return rem, add
