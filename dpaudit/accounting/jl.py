"""Privacy of DP-SGD-JL (Bu, Gopi, Kulkarni, Lee, Shen & Tantipongpipat 2021, "Fast and memory
efficient differentially private-SGD via JL projections", arXiv:2102.03013; seed paper).

Lemma 4.3: one step (before subsampling) is f-DP with
    f = T(Z_r, N(Z_r/sigma, 1) || Z_r, N(0, 1)),   Z_r = 1 / sqrt(chi2_r / r),
i.e. a Gaussian mechanism whose sensitivity Z_r/sigma is random but *public* (part of the output).
Given Z_r = z the pair is N(z/sigma, 1) vs N(0, 1), so the privacy-loss distribution is the
mixture over z of Gaussian PLDs, and after Poisson subsampling (Thm. 4.1, via Prop. 4.5) the
mixture over z of subsampled-Gaussian PLDs (Z_r has the same law under both hypotheses).

Pessimistic discretisation of Z_r (``z_r_bins``): geometric bins in z, z_(k+1) = z_k e^(1/bins_per_e),
from the lower quantile at ``tail`` up to a cap z_cap, refined by 500 equal-probability edges (so
large r, where Z_r ~ 1 +- 1/sqrt(2r), is resolved too), with *exact* chi^2 bin masses; every bin is
represented by its *upper* edge (the mass below the first edge goes to the first edge). Larger z
is less private (seed paper Lemma 4.2: a coupling Z >= Z' gives T(Z...) <= T(Z'...)), so this
upper-bounds the privacy loss; the relative error in z is at most e^(1/bins_per_e) - 1 (0.25% at
the default 400 bins per e-fold), i.e. about that much in epsilon.

Heavy tail: P(Z_r > z) ~ (r/2)^(r/2) z^-r / Gamma(r/2 + 1) (Prop. B.4 integrated), so a single step's
delta(eps) decays only like K_r eps^(-r/2), K_r = (r/(4 sigma^2))^(r/2)/Gamma(r/2+1) (the q=1 tail:
P(mu^2/2 > eps) with mu = Z_r/sigma). The mass P(Z_r > z_cap) is computed exactly (chi^2 CDF) and
represented by z = inf (P, Q mutually singular): it is charged to delta in full, never dropped. The
accountant chooses the loss cap per query so that it lies above the epsilon being sought by a
margin (pld.PldAccountant), which keeps the charge tight. The central limit theorem of Bu et al.
2019 does not apply here: chi^2(f) = inf (Prop. B.5).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats

from dpaudit.accounting.gdp import _GDP_DELTA_RTOL, _gdp_delta_nearest
from dpaudit.accounting.pld_pairs import (
    AtomPair,
    GaussianPair,
    LossPair,
    MixturePair,
    SubsampledGaussianAdd,
    SubsampledGaussianRemove,
    interval_masses,
    subsampled_non_private_pairs,
)
from dpaudit.validation import check_non_negative, check_positive, check_positive_int

# Grid points per mixture component of weight >= 1e-3 (heavy) and below (light); wider components
# use a coarser multiple of the PLD grid (connect-the-dots is pessimistic on any grid).
JL_COMPONENT_POINTS = (10_000, 2000)
# Equal-probability Z_r edges added to the geometric ones (z_r_bins).
JL_QUANTILE_BINS = 500


def z_r_survival(r: int, z: np.ndarray) -> np.ndarray:
    """P(Z_r > z) = P(chi2_r < r / z^2) (Prop. B.4 gives the density of Z_r); accurate in the upper tail."""
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return stats.chi2.cdf(r / (z * z), r)


def z_r_cdf(r: int, z: np.ndarray) -> np.ndarray:
    """P(Z_r <= z) = P(chi2_r >= r / z^2); accurate in the lower tail."""
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return stats.chi2.sf(r / (z * z), r)


def z_r_quantile_upper(r: int, s: np.ndarray) -> np.ndarray:
    """z with P(Z_r > z) = s (accurate for small s: chi2.ppf works from the lower tail)."""
    s = np.asarray(s, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.sqrt(r / stats.chi2.ppf(s, r))


def z_r_quantile_lower(r: int, s: np.ndarray) -> np.ndarray:
    """z with P(Z_r <= z) = s (accurate for small s)."""
    s = np.asarray(s, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.sqrt(r / stats.chi2.isf(s, r))


def single_step_tail_constant(noise_multiplier: float, projections: int) -> float:
    """K_r with delta_single(eps) ~ K_r eps^(-r/2) for one unsubsampled step, eps -> inf.

    delta(eps) -> P(mu^2/2 > eps) for mu = Z_r/sigma (the Gaussian hockey-stick tends to 1 when
    mu^2/2 >> eps and to 0 when mu^2/2 << eps), and P(Z_r > z) ~ (r/2)^(r/2) z^-r / Gamma(r/2+1)
    (chi^2_r CDF near 0: (x/2)^(r/2) / Gamma(r/2+1)); hence K_r = (r/(4 sigma^2))^(r/2) / Gamma(r/2+1).
    """
    sigma = check_positive(noise_multiplier=noise_multiplier)
    r = check_positive_int(projections=projections)
    return math.exp(0.5 * r * math.log(r / (4.0 * sigma * sigma)) - special.gammaln(0.5 * r + 1.0))


def z_r_bins(r: int, *, bins_per_e: int, z_cap: float, tail: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Pessimistic discretisation of Z_r: (bin weights, bin upper edges, mass above z_cap).

    Edges are geometric (ratio e^(1/bins_per_e)) from the lower quantile at ``tail`` to z_cap, plus
    the JL_QUANTILE_BINS-quantiles of Z_r below z_cap; the first bin holds all the mass below its
    edge. Weights are exact chi^2 masses, differenced from the CDF below the median and from the
    survival function above it (no cancellation in either tail). The weights plus the returned
    P(Z_r > z_cap) sum to 1 (to rounding).
    """
    r = check_positive_int(projections=r)
    z_lo = float(z_r_quantile_lower(r, np.array([tail]))[0])
    if not z_lo < z_cap:
        return (
            np.array([1.0 - float(z_r_survival(r, np.array([z_cap]))[0])]),
            np.array([z_cap]),
            float(z_r_survival(r, np.array([z_cap]))[0]),
        )
    n = max(1, math.ceil(math.log(z_cap / z_lo) * bins_per_e))
    geometric = z_lo * np.exp(np.arange(n) / bins_per_e)
    # Plus equal-probability edges: for large r, Z_r is concentrated near 1 and the geometric step
    # alone would inflate every z by up to e^(1/bins_per_e) - 1 (0.25%), i.e. ~0.7% in epsilon.
    quantiles = z_r_quantile_lower(r, np.arange(1, JL_QUANTILE_BINS) / JL_QUANTILE_BINS)
    edges = np.unique(np.concatenate([geometric, quantiles]))
    edges = np.append(edges[edges < z_cap], z_cap)
    cdf, sf = z_r_cdf(r, edges), z_r_survival(r, edges)
    weights = np.concatenate([[max(float(cdf[0]), 0.0)], interval_masses(cdf, sf)])
    s_cap = float(sf[-1])
    good = weights > 0.0
    return weights[good], edges[good], s_cap


def jl_mu_cap(sample_rate: float, max_loss: float) -> float:
    """mu beyond which a (subsampled) Gaussian component's loss exceeds ``max_loss`` except with
    probability < Phi(-8) ~ 6e-16: log q + mu^2/2 - 8 mu >= max_loss."""
    extra = -math.log(sample_rate) if sample_rate < 1.0 else 0.0
    return 8.0 + math.sqrt(64.0 + 2.0 * (max_loss + extra))


def jl_pairs(
    noise_multiplier: float, projections: int, sample_rate: float, max_loss: float, bins_per_e: int, tail: float
) -> tuple[LossPair, LossPair | None]:
    """(remove, add) dominating pairs of one Poisson-subsampled DP-SGD-JL step (add/remove neighbours).

    Formal guarantee (seed paper Lemma 4.3, Thm. 4.1) with the pessimistic discretisation of Z_r
    described in the module docstring: z > z_cap is represented by z = inf, where z_cap puts the
    components' losses beyond ``max_loss`` (or Z_r's mass beyond it below ``tail`` * 1e-3).
    ``sample_rate = 1`` gives the unsubsampled step (symmetric).
    """
    sigma = check_non_negative(noise_multiplier=noise_multiplier)
    q = float(sample_rate)
    if sigma == 0.0:
        return subsampled_non_private_pairs(q)
    if math.isinf(sigma):
        return AtomPair([0.0], [1.0]), None
    z_tail = float(z_r_quantile_upper(projections, np.array([tail * 1e-3]))[0])
    z_cap = min(sigma * jl_mu_cap(q, max_loss), z_tail)
    weights, edges, s_cap = z_r_bins(projections, bins_per_e=bins_per_e, z_cap=z_cap, tail=tail * 1e-3)
    mus = edges / sigma
    top_rem, top_add = subsampled_non_private_pairs(q)
    if q >= 1.0:
        rem = MixturePair(
            [(w, GaussianPair(m)) for w, m in zip(weights, mus, strict=True)] + [(s_cap, top_rem)],
            JL_COMPONENT_POINTS[0],
            light_points=JL_COMPONENT_POINTS[1],
        )
        return rem, None
    rem = MixturePair(
        [(w, SubsampledGaussianRemove(m, q)) for w, m in zip(weights, mus, strict=True)] + [(s_cap, top_rem)],
        JL_COMPONENT_POINTS[0],
        light_points=JL_COMPONENT_POINTS[1],
    )
    assert top_add is not None
    add = MixturePair(
        [(w, SubsampledGaussianAdd(m, q)) for w, m in zip(weights, mus, strict=True)] + [(s_cap, top_add)],
        JL_COMPONENT_POINTS[0],
        light_points=JL_COMPONENT_POINTS[1],
    )
    return rem, add


# --------------------------------------------------------------------------------------------
# A fast lower bound on the epsilon of T subsampled DP-SGD-JL steps (for calibration's early exit)
# --------------------------------------------------------------------------------------------


def _log_gaussian_delta(eps: float, mu: np.ndarray) -> np.ndarray:
    """log delta of the Gaussian mechanism N(mu, 1) vs N(0, 1) at eps (Balle & Wang 2018, arXiv:1805.06530,
    Thm. 8): delta = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), in log space; -inf where it is 0.
    Vectorised and not rounded in either direction: :func:`epsilon_lower_bound` uses it only to locate the best
    z0 on its grid, and bounds with :func:`_log_bound_at`."""
    mu = np.asarray(mu, dtype=np.float64)
    a = stats.norm.logcdf(-eps / mu + mu / 2.0)
    b = eps + stats.norm.logcdf(-eps / mu - mu / 2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b < a, a + np.log1p(-np.exp(np.minimum(b - a, 0.0))), -np.inf)


# Relative error allowed for scipy's chi2.cdf (Cephes igam, accurate to ~1e-14) and the log1p/expm1 around it in
# the hitting probability: _log_bound_at takes that much off, so that it stays a lower bound.
_HIT_RTOL = 1e-12


# -log of a zero bound inside epsilon_lower_bound's refinement: finite, above any finite -log bound (|log| < 1e6).
_NO_BOUND = 1e300


def _log_hit(r: int, sigma: float, steps: int, mus: np.ndarray) -> np.ndarray:
    """log P(max_t Z_t >= z0) = log(1 - (1 - S(z0))^T), z0 = mu sigma, S the Z_r survival function."""
    surv = np.minimum(z_r_survival(r, np.asarray(mus, dtype=np.float64) * sigma), 1.0 - 1e-16)
    with np.errstate(divide="ignore"):
        return np.log(-np.expm1(steps * np.log1p(-surv)))


def _subsampled_epsilon(eps: float, q: float) -> float:
    """eps' with e^eps' = 1 + (e^eps - 1)/q (amplification by subsampling, inverted), rounded up by a few ulps:
    delta_G decreases in eps', so an eps' above the exact one keeps the bound a lower bound."""
    eps_p = math.log1p(math.expm1(eps) / q) if eps < 700 else eps - math.log(q)
    return eps_p * (1.0 + 8 * 2.0**-52)


def _log_bound_at(eps: float, mu: float, r: int, sigma: float, q: float, steps: int) -> float:
    """A lower bound (rounding included) on log [P(max_t Z_t >= z0) q delta_G(eps'; mu)], z0 = mu sigma: the bound of
    :func:`epsilon_lower_bound` at one z0. delta_G from :func:`dpaudit.accounting.gdp._gdp_delta_nearest` (a few
    ulps), less its documented margin."""
    log_hit = float(_log_hit(r, sigma, steps, np.array([mu]))[0]) + math.log1p(-_HIT_RTOL)
    d = _gdp_delta_nearest(mu, _subsampled_epsilon(eps, q)) * (1.0 - _GDP_DELTA_RTOL)
    if not d > 0.0 or math.isinf(log_hit):
        return -math.inf
    return log_hit + math.log(q) + math.log(d) - 4 * 2.0**-52 * (abs(log_hit) + abs(math.log(d)) + 1.0)


def epsilon_lower_bound(
    noise_multiplier: float, projections: int, sample_rate: float, steps: int, delta: float
) -> float:
    """A formal lower bound on epsilon(delta) of T Poisson-subsampled DP-SGD-JL steps, computed in milliseconds.

    Z_r is public and has the same law under both hypotheses, so the hockey-stick divergence of the
    T-step mechanism is E_z[H(P_z || Q_z)]. Given z = (z_1..z_T), dropping all steps but one cannot
    increase it (post-processing), and a step with z_t >= z0 is at least as leaky as one with z0 (seed
    paper Lemma 4.2). For one remove-direction step, H_{e^eps}(q P + (1-q) Q || Q) = q H_{e^eps'}(P || Q)
    with e^eps' = 1 + (e^eps - 1)/q (exact, by expanding the positive part). Hence for every z0,
        delta_T(eps) >= B(eps; z0) = P(max_t Z_t >= z0) q delta_G(eps'; z0/sigma),
    P(max_t Z_t >= z0) = 1 - (1 - S(z0))^T, with S the Z_r survival function and delta_G the Gaussian
    hockey-stick. B(eps) = max_z0 B(eps; z0) decreases in eps, and the result is its crossing of delta: the
    best z0 is located on a grid of z0/sigma (600 points over 1e-2..1e5) and refined between the grid's
    neighbours (bounded Brent, to 1e-10 in log z0); the crossing is found with Brent's method to 1e-12
    relative, then stepped down until B, evaluated as a lower bound rounding included (:func:`_log_bound_at`),
    exceeds delta there. So every eps below the result has delta_T(eps) > delta, and no accountant can certify
    less. The accountant's epsilon (pessimistic PLD) is never below it. (The grid's maximum alone, inverted by
    bisection to 1e-3, left up to 2.6% of delta and 0.1% of epsilon on the table.)
    """
    sigma = check_positive(noise_multiplier=noise_multiplier)
    r = check_positive_int(projections=projections)
    steps = check_positive_int(steps=steps)
    q = float(sample_rate)
    log_delta = math.log(delta)
    log_mus = np.linspace(math.log(1e-2), math.log(1e5), 600)  # the grid of log(z0 / sigma)
    mus = np.exp(log_mus)
    log_hit = _log_hit(r, sigma, steps, mus)

    def at(eps: float, log_mu: float) -> float:
        return _log_bound_at(eps, math.exp(log_mu), r, sigma, q, steps)

    def log_bound(eps: float) -> float:
        grid = log_hit + math.log(q) + _log_gaussian_delta(_subsampled_epsilon(eps, q), mus)
        i = int(np.argmax(grid))
        best = at(eps, float(log_mus[i]))
        lo, hi = float(log_mus[max(i - 1, 0)]), float(log_mus[min(i + 1, len(mus) - 1)])
        # Where delta_G underflows between the grid's neighbours the bound is 0 (log -inf): Brent's parabola through
        # an infinite value computed inf - inf, and scipy's RuntimeWarning "invalid value encountered in scalar
        # subtract" reached the user (train --algo dpsgd-jl's calibration; 85 of 288 settings, sigma 0.5-5, r 1-256,
        # delta 1e-5-1e-30). A finite stand-in, above every finite -log bound, keeps the search's arithmetic finite;
        # every point it evaluates is still a lower bound (at), and the max with the grid point is kept.
        res = optimize.minimize_scalar(
            lambda t: min(-at(eps, t), _NO_BOUND), bounds=(lo, hi), method="bounded", options={"xatol": 1e-10}
        )
        return max(best, -float(res.fun)) if np.isfinite(res.fun) else best

    if not log_bound(0.0) > log_delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while log_bound(hi) > log_delta:
        lo, hi = hi, 2.0 * hi
        if hi > 1e12:  # unreachable (the z0/sigma grid stops at 1e5: delta_G(1e12) underflows), and if it were
            return lo  # reached, the lower bound shown so far is lo (inf would claim more than was shown)
    eps = optimize.brentq(lambda e: log_bound(e) - log_delta, lo, hi, xtol=1e-300, rtol=1e-12)
    step = 1e-12 * eps
    while eps > lo and not log_bound(eps) > log_delta:  # the crossing, to the safe side
        eps = max(lo, eps - step)
        step *= 2.0
    return eps
