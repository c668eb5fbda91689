"""Rounding error of the formal audit bounds (dpaudit/audit/stats.py, one_run_pure_epsilon) against 50-digit mpmath.

For each (k, n, α) the exact Clopper–Pearson limits are found by one Newton step, in mpmath, from scipy's value:
x* = x − (T(x) − α)/T'(x) with T the binomial tail summed term by term at 50 digits (the step is second-order exact
for the ~1e-13 relative errors seen). Reported: the worst error in the UNSAFE direction (upper limit below x*, lower
limit above x*) in units of x·2^-52, and likewise for the ε / μ lower bounds (in units of the margin's scale).
Run with ``raw=1`` in the environment to measure scipy's values (the unmargined functions); by default the shipped
functions are measured, and every unsafe error must then be ≤ 0. The last two lines are always scipy's / the float
p-value's own error (the one-run margin is applied by the caller, one_run_epsilon_lower_bound).

Sections (``--sections`` picks, default all; ``--large`` adds the slow points):

- ``cp``: the Clopper–Pearson limits, hypothesis_test_epsilon, gdp_mu_lower_bound and the pure one-run ε (above).
- ``pvalue``: the one-run δ > 0 log p-value's shortfall, m ≤ 1e4 (``--large``: also m = 1e5 and 1e6 at sampled
  points; the exact sums then run to 4e4 terms each).
- ``fdp``: the one-run f-DP recursion (fdp_one_run.fdp_rejects): at random (m, k, v, curve) the smallest float α
  at which it rejects, against the α at which the recursion in 50-digit arithmetic first rejects; the worst
  (float − exact)/exact in ulps (< 0: rejects where exact arithmetic does not). ``raw=1``: without the margin.
- ``whitebox``: estimate_ratio's shift_lower, sigma_upper and ratio_lower against the same statistics of the
  same data in 50 digits (exact z and χ² quantile), in ulps of each, unsafe direction > 0.
- ``noise``: the noise check's variance p-value (noise.variance_p_value) and scipy's chi2.cdf against 60 digits,
  dof 1e4..1e7 (``--large``: 1e8) and 60 random (dof ≤ 1e5, p ≥ 1e-300) points (``--large``: 300), relative error
  below exact (> 0 unsafe).
- ``noise-other``: the noise check's Student and Fisher tails, its cross-group Beta tail and its planning ratio
  (resolvable_noise_ratio) against 50 digits, scipy's beside the shipped (``--large``: 400 random points each).
- ``pld``: δ(0) of one Gaussian (σ 1e3..1e10) and one Poisson-subsampled Gaussian step against erf in 40 digits
  (relative, < 0 unsafe); ``--large`` adds the interval masses' own error (pld_pairs.interval_mass_errors' units).

    PYTHONPATH=$PWD nice python benchmarks/stats_rounding.py \
        [--sections cp,pvalue,fdp,whitebox,pld,noise,noise-other] [--large]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

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
    1e-300 relative); the pmf by its term ratio from j = v both ways (relative error ~ terms x 1e-50)."""
    q = 1 / (1 + mp.exp(-mp.mpf(eps)))
    rho = q / (1 - q)
    sd = mp.sqrt(r * q * (1 - q))
    lo, hi = max(0, min(v, int(r * q - 40 * sd - 50))), min(r, max(v, int(r * q + 40 * sd + 50)))
    pv = mp.exp(
        mp.loggamma(r + 1) - mp.loggamma(v + 1) - mp.loggamma(r - v + 1) + v * mp.log(q) + (r - v) * mp.log1p(-q)
    )
    beta, t = pv, pv
    for j in range(v, hi):
        t = t * (r - j) * rho / (j + 1)
        beta += t
    best, s, t = mp.mpf(0), mp.mpf(0), pv
    for i in range(1, v - lo + 1):
        j = v - i + 1  # t is pmf(j); pmf(j − 1) = pmf(j)·j / ((r − j + 1)·ρ)
        t = t * j / ((r - j + 1) * rho)
        s += t
        best = max(best, s / i)
    return min(mp.mpf(0), mp.log(beta + 2 * m * mp.mpf(delta) * best))


def one_run_p_values(large: bool = False) -> None:
    """Worst amount by which dpaudit's float log p-value of the one-run test falls BELOW the exact one (unsafe: a
    crossing p = α found in floats can have exact p > α), in units of 2^-52·(ln Γ(r + 1) + r + 4)."""
    from scipy.special import expit, gammaln

    from dpaudit.audit.one_run import _log_p_value

    def grid():
        for m in (100, 1000, 10_000):
            for r in sorted({m, m // 2, m // 4, m // 16}):
                for frac in (0.55, 0.7, 0.9, 0.99, 1.0):
                    for delta in (1e-8, 1e-5, 1e-3):
                        for eps in (0.1, 0.5, 1.0, 2.0, 4.0, 8.0):
                            yield m, r, frac, delta, eps
        if large:  # sampled: each point sums up to 4e4 terms at 50 digits
            for m in (100_000, 1_000_000):
                for r in (m, m // 4):
                    for frac in (0.55, 0.7, 0.9):
                        for delta in (1e-8, 1e-5):
                            for eps in (0.1, 0.5, 1.5):
                                yield m, r, frac, delta, eps

    worst, where, n = -math.inf, None, 0
    for m, r, frac, delta, eps in grid():
        v = max(1, min(r, round(frac * r)))
        if r * expit(eps) > v:
            continue
        c = _log_p_value(m, r, v, eps, delta)
        if c in (0.0, -math.inf):
            continue
        n += 1
        err = float((exact_log_p_value(m, r, v, eps, delta) - c) / ((gammaln(r + 1.0) + r + 4) * U))
        if err > worst:
            worst, where = err, (m, r, v, eps, delta)
    print(
        f"one-run log p-value ({n} points{', m to 1e6' if large else ''}): worst shortfall {worst:.4f} x"
        f" (lnGamma(r + 1) + r + 4) ulps at (m, r, v, eps, delta)={where}"
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


def clopper_pearson_and_epsilon() -> None:
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
    scan_small_k()


def fdp_recursion(large: bool = False) -> None:
    """The smallest float α at which fdp_rejects rejects (bisection on floats) against the exact recursion's
    threshold near it (bisection at 50 digits, relative width 1e-22), in ulps of α; < 0: unsafe."""
    from dpaudit.audit import fdp_one_run as F
    from tests.audit import test_fdp_one_run as T  # the tests' exact recursion and curves: one oracle

    if RAW:
        F._RECURSION_ULPS = 0.0
    rng = np.random.default_rng(2)
    worst, where, n = math.inf, None, 0
    for _ in range(400 if large else 24):
        m = int(rng.choice([10, 30, 100, 300, 1000, 3000, 10000]))
        k = int(rng.integers(1, min(m, 400) + 1))
        v = int(rng.integers(max(1, (k * 3) // 5), k + 1))
        if rng.integers(0, 2) == 0:
            fam = ("gdp", float(10 ** rng.uniform(-1.5, 0.7)))
            g, gx = F._gdp_g(fam[1]), T._exact_gdp_g(fam[1])
        else:
            fam = ("eps-delta", float(rng.uniform(0.02, 5)), float(10 ** rng.uniform(-9, -2)))
            g, gx = F._eps_delta_g(*fam[1:]), T._exact_eps_delta_g(*fam[1:])
        lo, hi = 1e-12, 1.0
        if not F.fdp_rejects(m, k, v, g, hi) or F.fdp_rejects(m, k, v, g, lo):
            continue
        while (mid := 0.5 * (lo + hi)) not in (lo, hi):
            lo, hi = (lo, mid) if F.fdp_rejects(m, k, v, g, mid) else (mid, hi)
        xl, xh = mp.mpf(hi) * (1 - mp.mpf(1e-9)), mp.mpf(hi) * (1 + mp.mpf(1e-9))
        if T._exact_recursion_rejects(m, k, v, gx, xl) or not T._exact_recursion_rejects(m, k, v, gx, xh):
            print(f"  fdp: exact threshold not within 1e-9 of the float one at {(m, k, v, fam)}")
            continue
        for _ in range(45):
            xm = (xl + xh) / 2
            xl, xh = (xl, xm) if T._exact_recursion_rejects(m, k, v, gx, xm) else (xm, xh)
        n += 1
        err = float((mp.mpf(hi) - xh) / xh / U)
        if err < worst:
            worst, where = err, (m, k, v, hi, fam)
    print(
        f"fdp recursion ({n} boundary cases; raw={RAW}): worst (alpha_float - alpha_exact) {worst:.2f} ulps at {where}"
    )


def whitebox(large: bool = False) -> None:
    """estimate_ratio's bounds against 50 digits on random data (n 10..1e4, α 1e-10..0.2, q, shift, offset 0 or
    1e3 or 1e6), in ulps of each value, > 0 unsafe."""
    from dpaudit.audit.whitebox import estimate_ratio
    from tests.audit.test_whitebox import _exact_ratio_bounds  # one oracle, the test's

    rng = np.random.default_rng(0)
    worst = {"shift_lower": (-math.inf, None), "sigma_upper": (-math.inf, None), "ratio_lower": (-math.inf, None)}
    ns = (10, 30, 100, 1000, 10_000) if large else (10, 100, 1000)
    for n in ns:
        for alpha in (0.2, 0.05, 0.025, 1e-3, 1e-6, 1e-10):
            for q in (1.0, 0.3, 0.01):
                for b, loc in ((0.5, 0.0), (3.0, 1e3), (30.0, 0.0), (3.0, 1e6)):
                    c = rng.random(n) < 0.5
                    if c.sum() < 2 or (~c).sum() < 2:
                        continue
                    o = rng.normal(loc, 1.0, n) + b * (c & (rng.random(n) < q))
                    est = estimate_ratio(o, c, q, alpha)
                    lo, sig, ratio = _exact_ratio_bounds(o, c, q, alpha)
                    for name, err in (
                        ("shift_lower", (mp.mpf(est.shift_lower) - lo) / abs(lo)),
                        ("sigma_upper", (sig - mp.mpf(est.sigma_upper)) / sig),
                        ("ratio_lower", (mp.mpf(est.ratio_lower) - ratio) / ratio if ratio > 0 else None),
                    ):
                        if err is not None and float(err / U) > worst[name][0]:
                            worst[name] = (float(err / U), (n, alpha, q, b, loc))
    for name, (e, at) in worst.items():
        print(f"whitebox {name}: worst unsafe error {e:.2f} ulps at (n, alpha, q, shift, offset)={at}")


def pld_delta0(large: bool = False) -> None:
    """δ(0) of one Gaussian step (erf(1/(2√2σ)), Balle & Wang 2018, Thm. 8) and of one Poisson-subsampled step
    (q·erf(...), the remove direction) from the PLD accountant, relative to 40 digits; < 0 unsafe."""
    from dpaudit.accounting import PldAccountant
    from dpaudit.events import Gaussian, PoissonSampled

    worst, best, where = math.inf, -math.inf, None
    for sigma in (1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10):
        for q in (1.0, 0.5, 0.01):
            with mp.workdps(40):
                exact = mp.mpf(q) * mp.erf(1 / (2 * mp.sqrt(2) * mp.mpf(sigma)))
                event = Gaussian(sigma) if q == 1.0 else PoissonSampled(q, Gaussian(sigma))
                rel = float((mp.mpf(PldAccountant().compose(event).delta(0.0)) - exact) / exact)
            if rel < worst:
                worst, where = rel, (sigma, q)
            best = max(best, rel)
    print(f"pld delta(0): worst relative error {worst:.3g} at (sigma, q)={where} (largest above: {best:.3g})")
    if large:
        pld_masses()


def pld_masses() -> None:
    """pld_pairs.interval_masses' absolute error against 80-digit mpmath, in the units of
    pld_pairs._MASS_ERROR_UNITS (2^-52 · Σ v (1 + |ln v|) over the two values differenced)."""
    from dpaudit.accounting.pld_pairs import (
        GaussianPair,
        SubsampledGaussianAdd,
        SubsampledGaussianRemove,
        interval_masses,
    )

    def exact_cdfs(pair, t):
        with mp.workdps(80):
            mu = mp.mpf(pair.mu)
            if isinstance(pair, GaussianPair):  # P's and Q's arguments are rounded separately: exact at the float t
                t = mp.mpf(float(t))
                return mp.ncdf((t - mu**2 / 2) / mu), mp.ncdf((t + mu**2 / 2) / mu)
            q = mp.mpf(pair.q)
            x = float(pair._x(np.array([float(t)]))[0])  # both CDFs at one float argument: its error moves the edge
            if not math.isfinite(x):
                one = mp.mpf(isinstance(pair, SubsampledGaussianAdd))
                return one, one
            x = mp.mpf(x)
            if isinstance(pair, SubsampledGaussianRemove):
                return (1 - q) * mp.ncdf(x) + q * mp.ncdf(x - mu), mp.ncdf(x)
            return mp.ncdf(-x), (1 - q) * mp.ncdf(-x) + q * mp.ncdf(mu - x)

    worst, where = 0.0, None
    for mu in (1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 0.5, 2.0):
        pairs = [GaussianPair(mu)] + [
            c(mu, q) for q in (0.5, 1e-2, 1e-4) for c in (SubsampledGaussianRemove, SubsampledGaussianAdd)
        ]
        for pair in pairs:
            lo, hi = pair.loss_range(1e-20, 1000.0)
            h = (hi - lo) / 1500
            i_lo = math.floor(lo / h)
            grid = (i_lo + np.arange(max(math.ceil(hi / h), i_lo + 1) - i_lo + 1)) * h
            pc, ps, qc, qs = pair.cdfs(grid)
            ms, ws = interval_masses(pc, ps), interval_masses(qc, qs)
            for k in range(0, grid.size - 1, 5):
                (ep0, eq0), (ep1, eq1) = exact_cdfs(pair, grid[k]), exact_cdfs(pair, grid[k + 1])
                for f, ex, c, s in ((ms[k], ep1 - ep0, pc, ps), (ws[k], eq1 - eq0, qc, qs)):
                    vv = (c[k], c[k + 1]) if c[k + 1] <= 0.5 else (s[k], s[k + 1])
                    scale = sum(float(v) * (1 + abs(math.log(v))) for v in vv if v > 0)
                    if scale < 1e-30:
                        continue
                    e = float(abs(mp.mpf(float(f)) - ex) / (U * scale))
                    if e > worst:
                        worst, where = e, (mu, type(pair).__name__, getattr(pair, "q", 1.0), k)
    print(f"pld interval masses: worst error {worst:.3f} units (2^-52 sum v(1 + |ln v|)) at {where}")


def noise_variance(large: bool = False) -> None:
    """noise.variance_p_value (and scipy's chi2.cdf) against P[χ²_dof ≤ x] in 60 digits (A&S 6.5.29 with 13.1.2)
    at x = chi2.ppf(p): the worst relative error BELOW exact (unsafe: "too little noise" for noise as claimed)."""
    from scipy import stats as st

    from dpaudit.audit.noise import variance_p_value
    from tests.audit.test_noise import _exact_chi2_cdf  # one oracle, the test's

    worst = {"scipy chi2.cdf": (-math.inf, None), "variance_p_value": (-math.inf, None)}
    dofs = (10**4, 10**5, 10**6, 3 * 10**6, 10**7) + ((10**8,) if large else ())
    points = [(dof, p) for dof in dofs for p in (0.4, 0.05, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-8, 1e-12)]
    # below dof 1e5 (scipy's value raised, no series) scipy's error grows with |ln p|: random points to 1e-300
    rng = np.random.default_rng(1)
    points += [(9714, 5.52e-269), (2790, 4.27e-93)]
    points += [
        (int(10 ** rng.uniform(0, 5)), float(10 ** rng.uniform(-300, -0.3))) for _ in range(300 if large else 60)
    ]
    for dof, p in points:
        x = float(st.chi2.ppf(p, dof))
        ex = _exact_chi2_cdf(x, dof) if x > 0.0 else mp.mpf(0)
        if ex < mp.mpf(2.0**-1022):
            continue  # below the normal range: not a level anyone tests at
        with mp.workdps(60):
            for name, val in (
                ("scipy chi2.cdf", st.chi2.cdf(x, dof)),
                ("variance_p_value", variance_p_value(x, dof, 1.0)),
            ):
                err = float((ex - mp.mpf(float(val))) / ex)
                if err > worst[name][0]:
                    worst[name] = (err, (dof, p))
    # The statistic's own rounding: x = S/σ² at large dof, where F's log-slope ≈ z·√(dof/2) amplifies an ulp of x
    # (σ drawn at random; the exact value is F at the exact S/σ²).
    key = "variance_p_value(S, dof, σ) at the exact S/σ²"
    worst[key] = (-math.inf, None)
    for dof, p in [(3 * 10**7, 3e-4), (10**8, 3e-4), (10**8, 1e-2)][: 3 if large else 2]:
        x0 = float(st.chi2.ppf(p, dof))
        for _ in range(6 if large else 3):
            std = float(rng.uniform(0.5, 3.0))
            S = x0 * std * std
            with mp.workdps(60):
                ex = _exact_chi2_cdf(mp.mpf(S) / mp.mpf(std) ** 2, dof)
                err = float((ex - mp.mpf(variance_p_value(S, dof, std))) / ex)
            if err > worst[key][0]:
                worst[key] = (err, (dof, p))
    for name, (e, at) in worst.items():
        print(f"{name}: worst relative error below exact {e:.3g} at (dof, p)={at}")


def noise_other(large: bool = False) -> None:
    """The noise check's other p-values and its planning ratio against 50-digit mpmath, each where a wrong rounding
    is unsafe: the Student tail (noise._student_two_sided; exact I_{ν/(ν+t²)}(ν/2, ½)), the Fisher χ²_{2K} tail
    (noise._chi2_even_upper_tail; exact Poisson sum), the cross-group Beta(½, (k − 1)/2) tail (noise.cross_group_p_value
    on one pair with Σ z_a² = Σ z_b² = 1; exact I_{1−r²}), all in ulps BELOW exact (> 0 unsafe), and
    noise.resolvable_noise_ratio in ulps ABOVE exact (> 0 unsafe: it would promise a finer resolution). scipy's own
    values are reported beside the shipped ones. Random grids (seed 0): df 2..1e6, K 1..3000, k 2..1e8, p
    1e-300..0.5 log-uniform, plus the points named in benchmarks/RESULTS.md."""
    from scipy import stats as st

    from dpaudit.audit import noise

    rng = np.random.default_rng(0)
    n = 400 if large else 120

    def report(name, worst):
        print(f"{name}: worst {worst[0]:.3g} ulps on the unsafe side at {worst[1]}")

    def tally(worst, err, at):
        return (err, at) if err > worst[0] else worst

    def log_uniform(lo, hi):
        return float(10 ** rng.uniform(math.log10(lo), math.log10(hi)))

    with mp.workdps(50):
        w_sc, w_new = (-math.inf, None), (-math.inf, None)
        pts = [(100, 1e-12), (10**6, 1e-200), (300, 1e-300)]
        pts += [(int(log_uniform(2, 1e6)), log_uniform(1e-300, 0.5)) for _ in range(n)]
        for df, p in pts:
            t = float(st.t.isf(p / 2, df))
            if not 0 < t < math.inf:
                continue
            ex = mp.betainc(mp.mpf(df) / 2, mp.mpf(1) / 2, 0, df / (df + mp.mpf(t) ** 2), regularized=True)
            w_sc = tally(w_sc, float((ex - 2 * mp.mpf(float(st.t.sf(t, df)))) / ex) / U, (df, p))
            w_new = tally(w_new, float((ex - mp.mpf(float(noise._student_two_sided(t, df)))) / ex) / U, (df, p))
        report("scipy 2 t.sf", w_sc)
        report("noise._student_two_sided", w_new)

        w_sc, w_new = (-math.inf, None), (-math.inf, None)
        pts = [(150, 1e-8), (2000, 1e-100), (1, 0.4), (8, 1e-300)]
        pts += [(int(log_uniform(1, 3000)), log_uniform(1e-300, 0.9)) for _ in range(n)]
        for half, p in pts:
            x = float(st.chi2.isf(p, 2 * half))
            y = mp.mpf(x) / 2
            ex = mp.exp(-y) * mp.fsum(y**j / mp.factorial(j) for j in range(half))
            if ex < mp.mpf(2.0**-1022):
                continue  # returned as 2^-1022, above
            w_sc = tally(w_sc, float((ex - mp.mpf(float(st.chi2.sf(x, 2 * half)))) / ex) / U, (2 * half, p))
            w_new = tally(w_new, float((ex - mp.mpf(noise._chi2_even_upper_tail(x, half))) / ex) / U, (2 * half, p))
        report("scipy chi2.sf (even dof)", w_sc)
        report("noise._chi2_even_upper_tail", w_new)

        w_sc, w_new = (-math.inf, None), (-math.inf, None)
        pts = [(100, 1e-12), (1000, 1e-12), (10**5, 1e-3)]
        pts += [(int(log_uniform(2, 1e8)), log_uniform(1e-300, 0.5)) for _ in range(n)]
        for k, p in pts:
            c0 = math.sqrt(float(st.beta.isf(p, 0.5, (k - 1) / 2)))
            if not 0 < c0 < 1:
                continue
            cross = np.zeros((3, 2, 2))
            cross[:, 0, 1] = c0, 1.0, 1.0
            ex = mp.betainc(mp.mpf(k - 1) / 2, mp.mpf(1) / 2, 0, 1 - mp.mpf(c0) ** 2, regularized=True)
            sc = float(st.beta.sf(min(1.0, c0 * c0), 0.5, (k - 1) / 2))
            w_sc = tally(w_sc, float((ex - mp.mpf(sc)) / ex) / U, (k, p))
            got = noise.cross_group_p_value(cross, np.full((2, 2), k))[0]
            w_new = tally(w_new, float((ex - mp.mpf(got)) / ex) / U, (k, p))
        report("scipy beta.sf (r² rounded)", w_sc)
        report("noise.cross_group_p_value", w_new)

    def quantile(level, dof):  # Newton on P(dof/2, x/2) = level from scipy's value
        x, a = mp.mpf(float(st.chi2.ppf(level, dof))), mp.mpf(dof) / 2
        for _ in range(2):
            pdf = mp.exp((a - 1) * mp.log(x / 2) - x / 2 - mp.loggamma(a)) / 2
            x -= (mp.gammainc(a, 0, x / 2, regularized=True) - level) / pdf
        return x

    w_sc, w_new = (-math.inf, None), (-math.inf, None)
    with mp.workdps(60):
        for dof in (1, 2, 10, 100, 1000, 10**4, 10**5) + ((10**6,) if large else ()):
            for alpha in (0.05, 1e-2, 0.05 / 24, 1e-4, 1e-8, 1e-12):
                for power in (0.5, 0.9, 0.99):
                    ex = mp.sqrt(quantile(alpha, dof) / quantile(power, dof))
                    sc = math.sqrt(st.chi2.ppf(alpha, dof) / st.chi2.ppf(power, dof))
                    w_sc = tally(w_sc, float((sc - ex) / ex) / U, (dof, alpha, power))
                    got = noise.resolvable_noise_ratio(dof, alpha, power)
                    w_new = tally(w_new, float((got - ex) / ex) / U, (dof, alpha, power))
    report("scipy √(ppf(α)/ppf(power)) above exact", w_sc)
    report("noise.resolvable_noise_ratio above exact", w_new)


SECTIONS = {
    "cp": lambda large: clopper_pearson_and_epsilon(),
    "pvalue": one_run_p_values,
    "fdp": fdp_recursion,
    "whitebox": whitebox,
    "pld": pld_delta0,
    "noise": noise_variance,
    "noise-other": noise_other,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    ap.add_argument("--large", action="store_true", help="the slow points (m to 1e6, 400 f-DP cases, masses)")
    args = ap.parse_args(argv)
    names = [s for s in args.sections.split(",") if s]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        print(f"error: unknown section(s) {', '.join(unknown)}; valid: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    for name in names:
        t0 = time.perf_counter()
        SECTIONS[name](args.large)
        print(f"  [{name}: {time.perf_counter() - t0:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
