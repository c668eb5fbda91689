"""Exact binomial confidence bounds and the two score-to-privacy conversions built on them.

All functions are vectorised over numpy arrays and work in float64. Probabilities that can be tiny
(Bonferroni-corrected α, tail masses) are passed to scipy's inverse *complementary* incomplete beta
so that 1 − α is never formed in floating point.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from dpaudit.errors import InputError


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
    """
    k, n, alpha = _binomial_args(k, n, alpha)
    out = np.ones(k.shape)
    m = k < n
    # betainccinv(a, b, y) solves 1 − I_x(a, b) = y: the upper α-quantile of Beta(a, b), without 1 − α.
    out[m] = special.betainccinv(k[m] + 1.0, n[m] - k[m], alpha[m])
    return out if out.ndim else float(out)


def clopper_pearson_lower(k, n, alpha):
    """One-sided lower confidence bound on a binomial proportion (0 when k = 0).

    Clopper & Pearson (1934): the α quantile of Beta(k, n − k + 1), i.e. the p that solves
    P[Binomial(n, p) ≥ k] = α.
    """
    k, n, alpha = _binomial_args(k, n, alpha)
    out = np.zeros(k.shape)
    m = k > 0
    out[m] = special.betaincinv(k[m], n[m] - k[m] + 1.0, alpha[m])
    return out if out.ndim else float(out)


def hypothesis_test_epsilon(fpr_upper, fnr_upper, delta: float):
    """ε lower bound from upper bounds on the false-positive and false-negative rates of one test.

    An (ε, δ)-DP mechanism forces every test between neighbours to satisfy
    FPR + e^ε·FNR ≥ 1 − δ and FNR + e^ε·FPR ≥ 1 − δ (Kairouz, Oh & Viswanath 2015, Theorem 2.1;
    used for auditing by Jagielski et al. 2020, arXiv:2006.07709, and Nasr et al. 2021,
    arXiv:2101.04535, Section 3), hence
        ε ≥ max{ ln((1 − δ − FPR)/FNR), ln((1 − δ − FNR)/FPR) }.
    The right-hand side decreases in FPR and FNR, so plugging in upper confidence bounds keeps it a
    lower bound. Clamped at 0.
    """
    fpr_upper, fnr_upper = _rates(fpr_upper=fpr_upper, fnr_upper=fnr_upper)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = 1.0 - delta - fpr_upper
        b = 1.0 - delta - fnr_upper
        # log1p keeps precision when the numerators are close to 1.
        e1 = np.where(a > 0, np.log1p(-(delta + fpr_upper)) - np.log(fnr_upper), -np.inf)
        e2 = np.where(b > 0, np.log1p(-(delta + fnr_upper)) - np.log(fpr_upper), -np.inf)
    out = np.maximum(np.maximum(e1, e2), 0.0)
    return out if out.ndim else float(out)


def gdp_mu_lower_bound(fpr_upper, fnr_upper):
    """Smallest μ of a μ-GDP trade-off curve that passes through (FPR, FNR) ≤ the given bounds.

    The μ-GDP trade-off curve is T_μ(α) = Φ(Φ⁻¹(1 − α) − μ) (Dong, Roth & Su 2022, arXiv:1905.02383,
    Definition 2.7), so a test with rates (FPR, FNR) requires μ ≥ Φ⁻¹(1 − FPR) − Φ⁻¹(FNR)
    (the estimator of Nasr et al. 2023, "Tight auditing of DP-SGD", arXiv:2302.07956, Section 3).
    The expression decreases in both rates, so upper confidence bounds give a lower bound on μ. It is
    symmetric in (FPR, FNR) because T_μ is symmetric, so both directions of the test give the same μ.
    Clamped at 0: identically distributed scores never yield a positive μ unless a rate bound fails.
    """
    fpr_upper, fnr_upper = _rates(fpr_upper=fpr_upper, fnr_upper=fnr_upper)
    with np.errstate(invalid="ignore"):
        # Φ⁻¹(1 − x) = −Φ⁻¹(x): written this way it needs no 1 − x.
        mu = -special.ndtri(fpr_upper) - special.ndtri(fnr_upper)
    mu = np.where(np.isnan(mu), 0.0, np.maximum(mu, 0.0))
    return mu if mu.ndim else float(mu)
