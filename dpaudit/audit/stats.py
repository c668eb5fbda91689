"""Exact binomial confidence bounds and the two score-to-privacy conversions built on them.

All functions are vectorised over numpy arrays and work in float64. Probabilities that can be tiny
(Bonferroni-corrected α, tail masses) are passed to scipy's inverse *complementary* incomplete beta
so that 1 − α is never formed in floating point.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from dpaudit.errors import InputError

_ULP = 2.0**-52
# Relative margin of the Clopper–Pearson limits, per trial: scipy's betainccinv / betaincinv (Boost's inverse incomplete
# beta) return the quantile to nearest only for small n; against 50-digit mpmath (one Newton step on the binomial tail
# summed term by term) at 1630 (k, n, α) points plus a scan of small k, n from 1 to 1e8, α from 1e-12 to 0.5 incl.
# Bonferroni-divided, the error on the unsafe side was at most 1.33·n ulps (40 ulps at k = 15, n = 30, α = 1e-12 for the
# lower limit; 5.0e5 ulps = 1.1e-10 relative at k = 1, n = 1e7, α = 0.05 for the upper), never a fixed few ulps
# (benchmarks/stats_rounding.py; benchmarks/RESULTS.md, "Bug hunt: formal audit bounds rounded in the safe direction").
# The margin is 16·(n + 4) ulps, over 12 times that envelope: 3.6e-8 relative at n = 1e7, far inside the statistical
# width of the interval.
_CP_ULPS_PER_TRIAL = 16.0


def _cp_margin(n):
    """The relative widening of a Clopper–Pearson limit over n trials (see :data:`_CP_ULPS_PER_TRIAL`)."""
    return _CP_ULPS_PER_TRIAL * (n + 4.0) * _ULP


# k = 0 (upper limit) and k = n (lower limit) have closed forms, 1 − α^(1/n) = −expm1(ln α / n) and α^(1/n) =
# exp(ln α / n) (Clopper & Pearson 1934: (1 − p)^n = α and p^n = α), whose rounding is bounded from the functions'
# own error bounds rather than measured: ln, expm1 and exp each within 4 ulps (glibc documents ≤ 1–2 ulps for these on
# x86-64, GNU C Library manual, "Known Maximum Errors in Math Functions"; numpy's SIMD loops are within 4), the
# division within ½, so x = ln α / n carries a relative error ≤ 4.5u. −expm1(x) then errs by ≤ 4.5u + 4u relative
# (its relative sensitivity to x, x e^x / expm1(x), is in (0, 1] for x < 0), exp(x) by ≤ 4.5u·|x| + 4u. Each is moved
# outward by 4 times its bound (these limits are the ones of a threshold with no false positive, the commonest best
# threshold of an audit, so they no longer carry the measured per-trial margin below).
_CLOSED_FORM_ULPS = 4.0


def _binomial_args(k, n, alpha):
    """k, n, alpha broadcast as float64 arrays, with 0 <= k <= n and alpha in [0, 1] (else one InputError:
    scipy would answer NaN for k > n or alpha > 1, and a bound from k < 0 would silently read 0)."""
    k, n, alpha = np.broadcast_arrays(np.asarray(k, float), np.asarray(n, float), np.asarray(alpha, float))
    if not np.all((k >= 0) & (k <= n)):
        i = int(np.argmin((k >= 0) & (k <= n)))
        raise InputError(f"need 0 <= k <= n (k successes out of n trials), got k={k.flat[i]:g}, n={n.flat[i]:g}")
    if not np.all((alpha >= 0) & (alpha <= 1)):
        raise InputError(f"expected alpha in [0, 1], got {alpha.flat[int(np.argmin((alpha >= 0) & (alpha <= 1)))]:g}")
    return k, n, alpha


def _rates(**kwargs):
    """Each keyword (an upper confidence bound on an error rate) as a float64 array, refusing NaN and negative
    values in one InputError (they would silently give a bound of 0). A bound above 1 is allowed: it is valid and
    vacuous (a normal-approximation bound can exceed 1), and gives no evidence."""
    out = []
    for name, value in kwargs.items():
        x = np.asarray(value, float)
        if not np.all(x >= 0):
            raise InputError(f"expected {name} >= 0 (a bound on a rate), got {x.flat[int(np.argmin(x >= 0))]:g}")
        out.append(x)
    return out


def clopper_pearson_upper(k, n, alpha):
    """One-sided upper confidence bound on a binomial proportion.

    Formal guarantee: if k ~ Binomial(n, p) then P[p ≤ upper] ≥ 1 − alpha.
    Clopper & Pearson (1934), Biometrika 26(4); the one-sided upper limit is the (1 − α) quantile of
    Beta(k + 1, n − k), i.e. the p that solves P[Binomial(n, p) ≤ k] = α; it is 1 when k = n.
    Rounded up: never below that quantile (scipy's value widened by :func:`_cp_margin`, capped at 1; at k = 0 the
    closed form 1 − α^(1/n) widened by a bound on its own rounding, see :data:`_CLOSED_FORM_ULPS`).
    """
    k, n, alpha = _binomial_args(k, n, alpha)
    out = np.ones(k.shape)
    m = (k > 0) & (k < n)
    # betainccinv(a, b, y) solves 1 − I_x(a, b) = y: the upper α-quantile of Beta(a, b), without 1 − α.
    q = special.betainccinv(k[m] + 1.0, n[m] - k[m], alpha[m])
    out[m] = np.minimum(q * (1.0 + _cp_margin(n[m])), 1.0)  # up by the measured error's margin (_CP_ULPS_PER_TRIAL)
    z = (k == 0) & (n > 0)  # (1 − p)^n = α: −expm1(ln α / n), up by 4 times its bound (_CLOSED_FORM_ULPS)
    with np.errstate(divide="ignore"):  # α = 0: ln α = −inf, the limit 1
        q = 0.0 - np.expm1(np.log(alpha[z]) / n[z])  # 0.0 −: +0, not −0, at α = 1
    out[z] = np.minimum(q * (1.0 + _CLOSED_FORM_ULPS * 8.5 * _ULP), 1.0)
    return out if out.ndim else float(out)


def clopper_pearson_lower(k, n, alpha):
    """One-sided lower confidence bound on a binomial proportion (0 when k = 0).

    Clopper & Pearson (1934): the α quantile of Beta(k, n − k + 1), i.e. the p that solves
    P[Binomial(n, p) ≥ k] = α. Rounded down: never above that quantile (scipy's value narrowed by
    :func:`_cp_margin`; at k = n the closed form α^(1/n) narrowed by a bound on its own rounding, see
    :data:`_CLOSED_FORM_ULPS`).
    """
    k, n, alpha = _binomial_args(k, n, alpha)
    out = np.zeros(k.shape)
    m = (k > 0) & (k < n)
    q = special.betaincinv(k[m], n[m] - k[m] + 1.0, alpha[m])
    # Down by the measured error's margin (_CP_ULPS_PER_TRIAL); at alpha = 1 the quantile is exactly 1.
    out[m] = np.where(alpha[m] == 1.0, q, q * (1.0 - _cp_margin(n[m])))
    z = (k == n) & (n > 0)  # p^n = α: exp(ln α / n), down by 4 times its bound (_CLOSED_FORM_ULPS); exactly 1 at α = 1
    with np.errstate(divide="ignore"):  # α = 0: ln α = −inf, the limit 0
        x = np.log(alpha[z]) / n[z]
    down = np.exp(x) * (1.0 - _CLOSED_FORM_ULPS * (4.5 * np.abs(np.where(np.isfinite(x), x, 0.0)) + 4.0) * _ULP)
    out[z] = np.where(alpha[z] == 1.0, 1.0, down)
    return out if out.ndim else float(out)


def hypothesis_test_epsilon(fpr_upper, fnr_upper, delta: float):
    """ε lower bound from upper bounds on the false-positive and false-negative rates of one test.

    An (ε, δ)-DP mechanism forces every test between neighbours to satisfy
    FPR + e^ε·FNR ≥ 1 − δ and FNR + e^ε·FPR ≥ 1 − δ (Kairouz, Oh & Viswanath 2015, Theorem 2.1;
    used for auditing by Jagielski et al. 2020, arXiv:2006.07709, and Nasr et al. 2021,
    arXiv:2101.04535, Section 3), hence
        ε ≥ max{ ln((1 − δ − FPR)/FNR), ln((1 − δ − FNR)/FPR) }.
    The right-hand side decreases in FPR and FNR, so plugging in upper confidence bounds keeps it a
    lower bound. Clamped at 0, and rounded down: never above the exact value of the formula at the given
    rates (each branch lowered by :func:`_log_ratio_down`'s error bound).
    """
    fpr_upper, fnr_upper = _rates(fpr_upper=fpr_upper, fnr_upper=fnr_upper)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = 1.0 - delta - fpr_upper
        b = 1.0 - delta - fnr_upper
        e1 = np.where(a > 0, _log_ratio_down(delta + fpr_upper, fnr_upper), -np.inf)
        e2 = np.where(b > 0, _log_ratio_down(delta + fnr_upper, fpr_upper), -np.inf)
    out = np.maximum(np.maximum(e1, e2), 0.0)
    return out if out.ndim else float(out)


def _log_ratio_down(s, d):
    """ln((1 − s)/d) rounded down, for s < 1 (s = δ + a rate, d the other rate; NumPy arrays).

    log1p keeps precision when 1 − s is close to 1. Error of the float evaluation (to first order in u = 2^-52): the
    sum s carries ≤ u·s, which ln(1 − s) turns into ≤ u·s/(1 − s) (the cancellation when s is near 1); log1p and log
    are within 1 ulp of their results t1 = ln(1 − s), t2 = ln d, and the difference within u·|t1 − t2|; in all
    ≤ 2u·(s/(1 − s) + |t1| + |t2|). The margin is 4 times that (8u·(...)); measured against 50-digit mpmath on 12000
    rate pairs (benchmarks/stats_rounding.py) the unmargined error reached 7.1e4·max(ε, 1) ulps (s = 1 − 1.4e-6),
    inside the bound. An infinite term (d = 0) is kept as is.
    """
    t1 = np.log1p(-s)
    t2 = np.log(d)
    value = t1 - t2
    margin = 8.0 * _ULP * (s / (1.0 - s) + np.abs(t1) + np.abs(t2))
    return np.where(np.isfinite(value), value - margin, value)


def gdp_mu_lower_bound(fpr_upper, fnr_upper):
    """Smallest μ of a μ-GDP trade-off curve that passes through (FPR, FNR) ≤ the given bounds.

    The μ-GDP trade-off curve is T_μ(α) = Φ(Φ⁻¹(1 − α) − μ) (Dong, Roth & Su 2022, arXiv:1905.02383,
    Definition 2.7), so a test with rates (FPR, FNR) requires μ ≥ Φ⁻¹(1 − FPR) − Φ⁻¹(FNR)
    (the estimator of Nasr et al. 2023, "Tight auditing of DP-SGD", arXiv:2302.07956, Section 3).
    The expression decreases in both rates, so upper confidence bounds give a lower bound on μ. It is
    symmetric in (FPR, FNR) because T_μ is symmetric, so both directions of the test give the same μ.
    Clamped at 0: identically distributed scores never yield a positive μ unless a rate bound fails.
    Rounded down: scipy's ndtri was within 1.25·(|z₁| + |z₂| + 1) ulps of 50-digit mpmath (z = Φ⁻¹ of each rate) on
    12000 rate pairs (benchmarks/stats_rounding.py), so the difference is lowered by 8·(|z₁| + |z₂| + 1) ulps (over 6
    times that).
    """
    fpr_upper, fnr_upper = _rates(fpr_upper=fpr_upper, fnr_upper=fnr_upper)
    with np.errstate(invalid="ignore"):
        # Φ⁻¹(1 − x) = −Φ⁻¹(x): written this way it needs no 1 − x.
        z1, z2 = special.ndtri(fpr_upper), special.ndtri(fnr_upper)
        mu = -z1 - z2
        mu = np.where(np.isfinite(mu), mu - 8.0 * _ULP * (np.abs(z1) + np.abs(z2) + 1.0), mu)
    mu = np.where(np.isnan(mu), 0.0, np.maximum(mu, 0.0))
    return mu if mu.ndim else float(mu)
