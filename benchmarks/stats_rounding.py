"""Rounding error of the formal audit bounds (dpaudit/audit/stats.py, one_run_pure_epsilon) against 50-digit mpmath.

For each (k, n, α) the exact Clopper–Pearson limits are found by one Newton step, in mpmath, from scipy's value:
x* = x − (T(x) − α)/T'(x) with T the binomial tail summed term by term at 50 digits (the step is second-order exact
for the ~1e-13 relative errors seen). Reported: the worst error in the UNSAFE direction (upper limit below x*, lower
limit above x*) in units of x·2^-52, and likewise for the ε / μ lower bounds (in units of the margin's scale).
Run with ``raw=1`` in the environment to measure scipy's values (the unmargined functions); by default the shipped
functions are measured, and every unsafe error must then be ≤ 0. The last two lines are always scipy's / the float
p-value's own error (the one-run margin is applied by the caller, one_run_epsilon_lower_bound).

    PYTHONPATH=$PWD nice python benchmarks/stats_rounding.py
"""

from __future__ import annotations

import math
import os
import sys

import mpmath as mp
import numpy as np
from scipy import special

from dpaudit.audit import stats
from dpaudit.audit.one_run import one_run_pure_epsilon

mp.mp.dps = 50
U = 2.0**-52
RAW = os.environ.get("raw") == "1"


def tail_le(k: int, n: int, p) -> mp.mpf:
    """P[Bin(n, p) ≤ k], summed from j = k downward (k below the mean at the upper limit)."""
    t = mp.exp(
        mp.loggamma(n + 1) - mp.loggamma(k + 1) - mp.loggamma(n - k + 1) + k * mp.log(p) + (n - k) * mp.log1p(-p)
    )
    s, j, r = t, k, p / (1 - p)
    while j > 0:
        t = t * j / ((n - j + 1) * r)
        s += t
        j -= 1
        if t < s * mp.mpf(10) ** -55:
            break
    return s


def tail_ge(k: int, n: int, p) -> mp.mpf:
    """P[Bin(n, p) ≥ k], summed from j = k upward."""
    t = mp.exp(
        mp.loggamma(n + 1) - mp.loggamma(k + 1) - mp.loggamma(n - k + 1) + k * mp.log(p) + (n - k) * mp.log1p(-p)
    )
    s, j, r = t, k, p / (1 - p)
    while j < n:
        t = t * (n - j) * r / (j + 1)
        s += t
        j += 1
        if t < s * mp.mpf(10) ** -55:
            break
    return s


def beta_pdf(x, a, b) -> mp.mpf:
    return mp.exp((a - 1) * mp.log(x) + (b - 1) * mp.log1p(-x) - mp.log(mp.beta(a, b)))


def exact_upper(k: int, n: int, alpha: float, x: float) -> mp.mpf:
    x = mp.mpf(x)
    return x + (tail_le(k, n, x) - mp.mpf(alpha)) / beta_pdf(x, k + 1, n - k)  # dT/dp = −Beta(k+1, n−k) pdf


def exact_lower(k: int, n: int, alpha: float, x: float) -> mp.mpf:
    x = mp.mpf(x)
    return x - (tail_ge(k, n, x) - mp.mpf(alpha)) / beta_pdf(x, k, n - k + 1)


def exact_log_p_value(m: int, r: int, v: int, eps: float, delta: float) -> mp.mpf:
    """ln of the one-run p-value β + 2mδ·max_i S_i/i (dpaudit.audit.one_run._log_p_value) at 50 digits,
    q = e^ε/(1 + e^ε) exactly for the float ε, all terms within 40 sd of the mean summed (the rest is below
    1e-300 relative)."""
    q = 1 / (1 + mp.exp(-mp.mpf(eps)))
    lq, l1q, lgr = mp.log(q), mp.log1p(-q), mp.loggamma(r + 1)

    def pmf(j):
        return mp.exp(lgr - mp.loggamma(j + 1) - mp.loggamma(r - j + 1) + j * lq + (r - j) * l1q)

    sd = mp.sqrt(r * q * (1 - q))
    lo, hi = max(0, min(v, int(r * q - 40 * sd - 50))), min(r, max(v, int(r * q + 40 * sd + 50)))
    beta = mp.fsum(pmf(j) for j in range(v, hi + 1))
    best, s = mp.mpf(0), mp.mpf(0)
    for i in range(1, v - lo + 1):
        s += pmf(v - i)
        best = max(best, s / i)
    return min(mp.mpf(0), mp.log(beta + 2 * m * mp.mpf(delta) * best))


def one_run_p_values() -> None:
    """Worst amount by which dpaudit's float log p-value of the one-run test falls BELOW the exact one (unsafe: a
    crossing p = α found in floats can have exact p > α), in units of 2^-52·(ln Γ(r + 1) + r + 4)."""
    from scipy.special import expit, gammaln

    from dpaudit.audit.one_run import _log_p_value

    worst, where = -math.inf, None
    for m in (100, 1000, 10_000):
        for r in sorted({m, m // 2, m // 4, m // 16}):
            for frac in (0.55, 0.7, 0.9, 0.99, 1.0):
                v = max(1, min(r, round(frac * r)))
                for delta in (1e-8, 1e-5, 1e-3):
                    for eps in (0.1, 0.5, 1.0, 2.0, 4.0, 8.0):
                        if r * expit(eps) > v:
                            continue
                        c = _log_p_value(m, r, v, eps, delta)
                        if c in (0.0, -math.inf):
                            continue
                        err = float((exact_log_p_value(m, r, v, eps, delta) - c) / ((gammaln(r + 1.0) + r + 4) * U))
                        if err > worst:
                            worst, where = err, (m, r, v, eps, delta)
    print(
        f"one-run log p-value: worst shortfall {worst:.4f} x (lnGamma(r + 1) + r + 4) ulps"
        f" at (m, r, v, eps, delta)={where}"
    )


def scan_small_k() -> None:
    """scipy's own Clopper–Pearson error per trial (small k and a few random k, n from 30 to 1e8): the envelope
    that stats._CP_ULPS_PER_TRIAL covers. Printed: the worst unsafe error divided by n, in ulps."""
    rng = np.random.default_rng(1)
    worst, where = -math.inf, None
    for n in (
        30,
        60,
        100,
        150,
        200,
        250,
        333,
        400,
        500,
        700,
        2000,
        30_000,
        300_000,
        3_000_000,
        10**7,
        3 * 10**7,
        10**8,
    ):
        ks = {0, 1, 2, 3, 5, 8} | {int(x) for x in rng.integers(0, min(n, 60), 3)}
        ks |= {int(x) for x in rng.integers(0, n, 2 if n < 1e6 else 0)}
        for k in sorted(kk for kk in ks if kk < n):
            for a in (1e-12, 1e-8, 1e-5, 1e-3, 0.01, 0.05, 0.2, 0.5):
                x = float(special.betainccinv(k + 1.0, n - k, a))
                errs = [float((exact_upper(k, n, a, x) - x) / (x * U))]
                y = float(special.betaincinv(float(k), n - k + 1.0, a)) if k > 0 else 0.0
                if 0.0 < y < 1.0:
                    errs.append(float((y - exact_lower(k, n, a, y)) / (y * U)))
                if max(errs) / n > worst:
                    worst, where = max(errs) / n, (k, n, a)
    print(f"scipy Clopper-Pearson, small-k scan: worst unsafe error {worst:.3f} x n ulps at (k, n, alpha)={where}")


def points(rng):
    alphas = [1e-12, 1e-9, 1e-6, 1e-4, 2.5e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 0.05 / 20, 0.05 / 1000, 0.05 / 60, 0.01 / 7]
    out = []
    for n in [1, 2, 3, 5, 10, 17, 50, 100, 333, 1000, 4096, 10_000, 100_000, 1_000_000, 10_000_000]:
        ks = {0, 1, 2, n // 2, n - 1, n} | set(int(x) for x in rng.integers(0, n + 1, size=4 if n < 1e6 else 1))
        if n >= 100:
            ks |= {n // 100, n - n // 100}
        for k in sorted(kk for kk in ks if 0 <= kk <= n):
            for a in alphas if n < 1e6 else alphas[::3]:
                out.append((k, n, a))
    return out


def main() -> int:
    rng = np.random.default_rng(0)
    pts = points(rng)
    worst_up = worst_lo = -math.inf
    where_up = where_lo = None
    cp = []
    per_n = {}
    up_fn = (lambda k, n, a: float(special.betainccinv(k + 1.0, n - k, a))) if RAW else stats.clopper_pearson_upper
    lo_fn = (
        (lambda k, n, a: float(special.betaincinv(float(k), n - k + 1.0, a))) if RAW else stats.clopper_pearson_lower
    )
    for k, n, a in pts:
        if k < n:
            x = float(up_fn(k, n, a))
            if 0.0 < x < 1.0:
                err = float((exact_upper(k, n, a, x) - x) / (x * U))  # > 0: below the exact limit (unsafe)
                w = per_n.setdefault(n, [-math.inf, -math.inf])
                w[0] = max(w[0], err)
                if err > worst_up:
                    worst_up, where_up = err, (k, n, a)
                cp.append((x, n))
        if k > 0:
            x = float(lo_fn(k, n, a))
            if 0.0 < x < 1.0:
                err = float((x - exact_lower(k, n, a, x)) / (x * U))  # > 0: above the exact limit (unsafe)
                w = per_n.setdefault(n, [-math.inf, -math.inf])
                w[1] = max(w[1], err)
                if err > worst_lo:
                    worst_lo, where_lo = err, (k, n, a)
    print(f"{len(pts)} (k, n, alpha) points; raw={RAW}")
    for n_, (eu, el) in sorted(per_n.items()):
        print(f"  n={n_:>9}: worst unsafe upper {eu:10.3f} ulps, lower {el:10.3f} ulps")
    print(f"clopper_pearson_upper: worst unsafe error {worst_up:.3f} ulps (relative) at {where_up}")
    print(f"clopper_pearson_lower: worst unsafe error {worst_lo:.3f} ulps (relative) at {where_lo}")

    # ε / μ lower bounds from pairs of computed upper limits, δ ∈ {0, 1e-5, 1e-3, 0.1}.
    rates = np.array([x for x, _ in cp] + [1e-300, 1e-20, 0.3, 0.5, 0.4999999999, 0.7, 0.999999])
    fpr = rng.choice(rates, size=3000)
    fnr = rng.choice(rates, size=3000)
    worst_e = worst_mu = worst_l = -math.inf
    where_e = where_mu = where_l = None
    for delta in (0.0, 1e-5, 1e-3, 0.1):
        if RAW:
            with np.errstate(divide="ignore", invalid="ignore"):
                a_, b_ = 1.0 - delta - fpr, 1.0 - delta - fnr
                e1 = np.where(a_ > 0, np.log1p(-(delta + fpr)) - np.log(fnr), -np.inf)
                e2 = np.where(b_ > 0, np.log1p(-(delta + fnr)) - np.log(fpr), -np.inf)
            eps = np.maximum(np.maximum(e1, e2), 0.0)
        else:
            eps = stats.hypothesis_test_epsilon(fpr, fnr, delta)
        for f, g, e in zip(fpr, fnr, eps, strict=True):
            mf, mg, md = mp.mpf(float(f)), mp.mpf(float(g)), mp.mpf(delta)
            ex = max([mp.mpf(0), *(mp.log((1 - md - p) / q) for p, q in ((mf, mg), (mg, mf)) if 1 - md - p > 0)])
            if e > 0 or ex > 0:
                err = float((mp.mpf(float(e)) - ex) / (max(ex, 1) * U))  # > 0: above the exact bound (unsafe)
                if err > worst_e:
                    worst_e, where_e = err, (float(f), float(g), delta)
    print(f"hypothesis_test_epsilon: worst unsafe error {worst_e:.3f} x max(eps, 1) ulps at {where_e}")
    with np.errstate(invalid="ignore"):
        mus = (-special.ndtri(fpr) - special.ndtri(fnr)) if RAW else stats.gdp_mu_lower_bound(fpr, fnr)
    for f, g, m in zip(fpr, fnr, mus, strict=True):
        z = []
        for p in (f, g):
            z0 = mp.mpf(float(special.ndtri(p)))  # one Newton step on Φ(z) = p at 50 digits
            z.append(z0 - (mp.ncdf(z0) - mp.mpf(float(p))) / mp.npdf(z0))
        ex = max(mp.mpf(0), -z[0] - z[1])
        if m > 0 or ex > 0:
            err = float((mp.mpf(float(m)) - ex) / ((abs(z[0]) + abs(z[1]) + 1) * U))
            if err > worst_mu:
                worst_mu, where_mu = err, (float(f), float(g))
    print(f"gdp_mu_lower_bound: worst unsafe error {worst_mu:.3f} x (|z1| + |z2| + 1) ulps at {where_mu}")
    # One-run pure-DP ε = logit(clopper_pearson_lower(v, r, α)): against logit of the exact lower limit.
    for k, n, a in pts:
        if k == 0 or 2 * k <= n:
            continue
        x = float(special.betaincinv(float(k), n - k + 1.0, a))
        if not 0.5 < x < 1.0:
            continue
        if RAW:
            e, ex = float(special.logit(x)), mp.log(mp.mpf(x) / (1 - mp.mpf(x)))  # the logit step alone
        else:
            e = float(one_run_pure_epsilon(n, k, a))
            q = exact_lower(k, n, a, x)
            ex = max(mp.mpf(0), mp.log(q / (1 - q)))
        err = float((mp.mpf(e) - ex) / ((abs(ex) + 1) * U))
        if err > worst_l:
            worst_l, where_l = err, (k, n, a)
    print(f"one_run_pure_epsilon (logit): worst unsafe error {worst_l:.3f} x (|eps| + 1) ulps at {where_l}")
    one_run_p_values()
    scan_small_k()
    return 0


if __name__ == "__main__":
    sys.exit(main())
