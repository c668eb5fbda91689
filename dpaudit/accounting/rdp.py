"""Rényi differential privacy (RDP) accountant.

An (alpha, r)-RDP guarantee bounds the Rényi divergence D_alpha(M(D) || M(D')) <= r
(Mironov 2017, arXiv:1702.07476, Def. 4). RDP composes by adding r at every order
(ibid., Prop. 1); the accountant keeps one vector r(alpha) over a fixed grid of orders and converts
to (epsilon, delta) at the end with the improved conversion of Canonne, Kamath & Steinke 2020
(arXiv:2004.00010, Prop. 12) / Balle et al. 2020 (arXiv:1905.09982, Thm. 21).

All values are natural-log units (nats). Numerics: moment sums are accumulated in log space
(logsumexp) because the individual terms overflow float64 already at moderate orders.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from dpaudit.accounting.base import (
    Accountant,
    effective_gaussian_noise_multiplier,
    replace_factor,
    unsupported,
)
from dpaudit.budget import Cost, check_cost
from dpaudit.events import (
    ZCDP,
    EpsilonDelta,
    Event,
    FixedSizeSampled,
    Gaussian,
    GNMax,
    JLGaussian,
    Laplace,
    LNMax,
    PoissonSampled,
    RandomizedResponse,
)
from dpaudit.validation import check_in_interval, check_non_negative

# The grid of dp_accounting's RdpAccountant (fine fractional orders near 1, all integers up to 63,
# powers of two beyond), extended by 2048 and 4096 for very small per-step costs. Extra orders
# can only lower (tighten) the reported epsilon, never raise it.
DEFAULT_ORDERS: tuple[float, ...] = (
    *(1.0 + x / 10.0 for x in range(1, 100)),
    *(float(a) for a in range(11, 64)),
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
)

# CPU seconds of one Poisson-subsampled Gaussian's RDP curve (RdpAccountant's cost estimate): 3-4 ms measured for
# schedules of 100-500 DP-SGD phases (sigma 0.8-2, q 0.004-0.008) on this project's 2-core machine, up to ~50 ms
# when an epsilon query needs the fractional orders near 1 (sigma ~0.5, their series run to 2^14 terms);
# benchmarks/schedule_accounting.py.
RDP_SECONDS_PER_MECHANISM = 0.01

# Orders up to which the sampling-without-replacement bound uses the tighter Theorem 27 of
# Wang, Balle & Kasiviswanathan 2019 (cost grows quadratically with the order).
_WOR_EXACT_MAX_ORDER = 256


# --------------------------------------------------------------------------------------------
# Per-mechanism RDP curves (vectorised over orders)
# --------------------------------------------------------------------------------------------


def _as_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(orders, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError("orders must be a non-empty 1-D sequence")
    if np.any(~(a > 1.0)):
        raise ValueError("every RDP order must be > 1")
    return a


def rdp_gaussian(noise_multiplier: float, orders: Sequence[float], *, sensitivity: float = 1.0) -> np.ndarray:
    """RDP of the Gaussian mechanism: alpha * Delta^2 / (2 sigma^2).

    Formal guarantee (Mironov 2017, arXiv:1702.07476, Prop. 7). ``sensitivity`` Delta is in units
    of the noise-multiplier's reference norm.
    """
    a = _as_orders(orders)
    sigma = check_non_negative(noise_multiplier=noise_multiplier)
    if sigma == 0.0:
        return np.full_like(a, np.inf)
    ratio = sensitivity / sigma  # may overflow to inf for denormal sigma: that is the right answer
    return a * (0.5 * ratio * ratio)


def _lse(x: np.ndarray) -> float:
    # log(sum(exp(x))) without scipy's per-call overhead (this runs once per order and chunk).
    m = float(np.max(x))
    if not math.isfinite(m):
        return m
    return m + math.log(float(np.sum(np.exp(x - m))))


def _log_abs_binom(n: float | np.ndarray, k: np.ndarray) -> np.ndarray:
    # log |C(n, k)| via log|Gamma| (scipy's gammaln returns log|Gamma| for negative arguments too).
    return special.gammaln(n + 1.0) - special.gammaln(k + 1.0) - special.gammaln(n - k + 1.0)


# Unit roundoff of float64 (Higham 2002, "Accuracy and Stability of Numerical Algorithms", Sec. 2.1).
_U = 2.0**-53


def _lse_rounded_up_rows(log_terms: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Row by row: log(sum(exp(log_terms[r]))) plus an upper bound on its float64 error, in nats.

    ``scales[r, i]`` is the sum of the absolute values of the float64 parts that log_terms[r, i] was added
    up from (gammaln's, k log q, ...): each part is within a few ulps and the parts can cancel, so
    the absolute error of log_terms[r, i] is below 16 u scales[r, i], u = 2^-53 (Higham 2002, "Accuracy and
    Stability of Numerical Algorithms", Sec. 2.1 and Eq. (3.4)). Exponentiating turns that into the
    same relative error of the term; the sum of the scaled terms is correctly rounded (``math.fsum``),
    so the error of the log-sum is below 16 u W / S + 4 u with S = sum e^t_i and
    W = sum e^t_i (1 + scales_i) (the 4 u for exp, fsum and the final log). Rounding log A up by it
    keeps the RDP curve an upper bound in float64 too: benchmarks/accounting_fuzz.py found the plain
    log-sum-exp up to 1.7e-7 relative below the exact value at q = 1e-5 (A - 1 ~ 1e-10 was lost in
    the difference of two numbers near 1), and 5e-12 relative below it at fractional orders ~50 where
    gammaln's of ~200 cancel to terms of ~1. Rows whose largest term is not finite return it.
    """
    m = np.max(log_terms, axis=1)
    with np.errstate(invalid="ignore"):
        scaled = np.exp(log_terms - m[:, None])
        weighted = scaled * (1.0 + np.where(np.isfinite(scales), scales, 0.0))
    out = m.astype(np.float64, copy=True)
    # The sums are exact (math.fsum: correctly rounded), so neither the terms' order nor the terms that underflowed
    # to 0 move a bit of them: only the others are read (at a large integer order all but a few terms underflow).
    # NaN terms are kept (they make the row NaN, as they must).
    kept = scaled != 0.0
    ends = np.cumsum(np.count_nonzero(kept, axis=1)).tolist()
    values, weights = scaled[kept].tolist(), weighted[kept].tolist()
    for r in np.flatnonzero(np.isfinite(m)).tolist():
        lo, hi = ends[r - 1] if r else 0, ends[r]
        s = math.fsum(values[lo:hi])
        w = math.fsum(weights[lo:hi])
        out[r] = float(m[r]) + math.log(s) + _U * (16.0 * w / s + 4.0)
    return out


def _binom_scale(n: float | np.ndarray, k: np.ndarray) -> np.ndarray:
    # Sum of |gammaln| parts of _log_abs_binom(n, k) (their rounding is what _lse_rounded_up_rows bounds).
    return np.abs(special.gammaln(n + 1.0)) + np.abs(special.gammaln(k + 1.0)) + np.abs(special.gammaln(n - k + 1.0))


# Work arrays of the series below hold at most this many float64 (8 MB each), whatever the number of rows.
_BATCH_ELEMENTS = 1 << 20


def _log_a_integer_rows(log_q: np.ndarray, log_1mq: np.ndarray, two_s2: np.ndarray, alpha: int) -> np.ndarray:
    """log A_alpha at one integer alpha for many (q, sigma) at once; row r has log_q[r] = log q_r,
    log_1mq[r] = log1p(-q_r), two_s2[r] = 2 sigma_r^2 (computed by the caller in Python floats).

    Mironov, Talwar & Zhang 2019 (arXiv:1908.10530), Sec. 3.1, integer alpha:
      A_alpha = sum_{k=0}^{alpha} C(alpha,k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 sigma^2)).
    Since sum_k C(alpha,k) (1-q)^(alpha-k) q^k = 1 (binomial theorem), A - 1 is the same sum with
    exp(.) replaced by expm1(.), whose k = 0, 1 terms vanish: a sum of positive terms, computed in
    log space without the cancellation of (1 + tiny) - 1, then log A = log1p(A - 1) = logaddexp(0, .).
    Every row is computed elementwise exactly as a row of its own would be (a schedule's phases get the
    bits a single phase gets).
    """
    out = np.zeros(log_q.size)
    if alpha < 2:
        return out
    k = np.arange(2, alpha + 1, dtype=np.float64)
    binom, binom_scale = _log_abs_binom(float(alpha), k), _binom_scale(float(alpha), k)
    kk = k * k - k
    rows = max(1, _BATCH_ELEMENTS // k.size)
    for lo in range(0, log_q.size, rows):
        sl = slice(lo, lo + rows)
        x = kk / two_s2[sl, None]
        with np.errstate(divide="ignore"):
            log_expm1 = x + np.log(-np.expm1(-x))  # log(e^x - 1) for x > 0, without overflow
        parts = (k * log_q[sl, None], (alpha - k) * log_1mq[sl, None], x, log_expm1 - x)
        log_terms = binom + parts[0] + parts[1] + log_expm1
        scales = binom_scale + sum(np.abs(np.nan_to_num(c, posinf=0.0, neginf=0.0)) for c in parts)
        out[sl] = np.logaddexp(0.0, _lse_rounded_up_rows(log_terms, scales)) * (1.0 + 4.0 * _U)
    return out


# Rows of the fractional series summed together: bounds the terms kept for the final rounded sum (at most
# 2 max_terms float64 a row and array: 64 MB at 1 << 14 terms).
_FRACTIONAL_ROWS = 256


def _log_a_fractional_rows(
    q: Sequence[float], sigma: Sequence[float], alpha: Sequence[float], *, max_terms: int = 1 << 14
) -> np.ndarray:
    """Upper bounds on log A_alpha for fractional alpha (Mironov, Talwar & Zhang 2019, Sec. 3.3), one per
    row (q[r], sigma[r], alpha[r]); each row gets the bits it would get alone.

    A_alpha = E_{z~N(0,s^2)}[(1 - q + q exp((2z - 1)/(2 s^2)))^alpha] is split at
    z0 = s^2 log(1/q - 1) + 1/2 and each half expanded in a binomial series (their Eq. for A_alpha
    in Sec. 3.3). Summing |terms| gives an upper bound (as in dp_accounting). The series is cut at
    N terms and the remainder is *added* as a rigorous bound: both term families are
    |C(alpha,i)| times a factor that decreases in i (its log-derivative is -(x + phi(x)/Phi(x))/s < 0,
    the inverse-Mills inequality), and |C(alpha,i)| <= |C(alpha,N)| ((N+1)/(i+1))^(alpha+1) for
    i >= N > alpha, so the tail is at most (t0_N + t1_N) (N+1)^(alpha+1) N^(-alpha) / alpha.
    """
    out = np.empty(len(alpha))
    first: dict[int, list[int]] = {}  # rows by their first chunk's end
    for r, a in enumerate(alpha):
        first.setdefault(int(max(64, 2 * math.ceil(a) + 2)), []).append(r)
    for n0, rows in first.items():
        for lo in range(0, len(rows), _FRACTIONAL_ROWS):
            block = rows[lo : lo + _FRACTIONAL_ROWS]
            out[block] = _fractional_block(
                [q[r] for r in block], [sigma[r] for r in block], [alpha[r] for r in block], n0, max_terms
            )
    return out


def _fractional_block(q: list, sigma: list, alpha: list, n: int, max_terms: int) -> np.ndarray:
    # _log_a_fractional_rows for rows that share the first chunk [0, n). The per-row scalars are Python floats,
    # as a row alone computes them; the arrays are those of every row at once, column vectors against the terms.
    s2 = [s * s for s in sigma]
    log_q, log_1mq = [math.log(v) for v in q], [math.log1p(-v) for v in q]
    z0 = [v * (b - c) + 0.5 for v, b, c in zip(s2, log_1mq, log_q, strict=True)]
    col = {
        name: np.array(v, dtype=np.float64)[:, None]
        for name, v in (
            ("a", alpha),
            ("lq", log_q),
            ("l1q", log_1mq),
            ("two_s2", [2 * v for v in s2]),
            ("sig", sigma),
            ("z0", z0),
        )
    }

    def log_terms(i: np.ndarray, take: np.ndarray, with_scales: bool = False):
        a, lq, l1q, two_s2, sig, z = (col[k][take] for k in ("a", "lq", "l1q", "two_s2", "sig", "z0"))
        j = a - i
        # _log_abs_binom(a, i) and _binom_scale(a, i) from the same three gammaln (the costly part of a term)
        gammas = (special.gammaln(a + 1.0), special.gammaln(i + 1.0), special.gammaln(j + 1.0))
        log_c = gammas[0] - gammas[1] - gammas[2]
        p0 = (i * lq, j * l1q, (i * i - i) / two_s2, special.log_ndtr((z - i) / sig))
        p1 = (j * lq, i * l1q, (j * j - j) / two_s2, special.log_ndtr((j - z) / sig))
        t0, t1 = log_c + sum(p0), log_c + sum(p1)
        if not with_scales:
            return t0, t1
        scale_c = np.abs(gammas[0]) + np.abs(gammas[1]) + np.abs(gammas[2])
        return t0, t1, scale_c + sum(np.abs(c) for c in p0), scale_c + sum(np.abs(c) for c in p1)

    rows = len(alpha)
    out = np.empty(rows)
    chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (rows still summing, their terms, scales)
    partial = np.full(rows, -np.inf)
    active = np.arange(rows)  # ascending, as every array of rows below
    start = 0
    while active.size:
        t0, t1, c0, c1 = log_terms(np.arange(start, n, dtype=np.float64), active, with_scales=True)
        terms, term_scales = np.concatenate([t0, t1], axis=1), np.concatenate([c0, c1], axis=1)
        chunks.append((active, terms, term_scales))
        # log-sum-exp of the chunk, row by row (not rounded up: it only decides where the series stops)
        m = np.max(terms, axis=1)
        with np.errstate(invalid="ignore"):
            sums = np.sum(np.exp(terms - m[:, None]), axis=1)
        lse = np.array([mv if not math.isfinite(mv) else mv + math.log(sv) for mv, sv in zip(m, sums, strict=True)])
        partial[active] = np.logaddexp(partial[active], lse)
        # Remainder bound from the terms at index n (see docstring).
        t0n, t1n = log_terms(np.array([float(n)]), active)
        a_act = [alpha[r] for r in active]
        log_tail = (
            np.logaddexp(t0n[:, 0], t1n[:, 0])
            + np.array([(a + 1) * math.log(n + 1) for a in a_act])
            - np.array([a * math.log(n) for a in a_act])
            - np.array([math.log(a) for a in a_act])
        )
        # Stop when the remainder is negligible next to A - 1 (what the RDP value is made of).
        part = partial[active]
        log_excess = np.array([p + math.log(-math.expm1(-p)) if p > 0 else p for p in part.tolist()])
        smaller = np.where(log_excess < part, log_excess, part)  # Python's min(part, log_excess), NaN included
        done = (log_tail < smaller - 25.0) | (n >= max_terms)
        if done.any():
            # The sum again, rounded up by its float64 error (_lse_rounded_up_rows): A ~ 1 + tiny for small q. A row's
            # terms are those of every chunk so far (the order of the terms moves no bit: max, exp, exact sums).
            finished = active[done]
            at = [np.searchsorted(rows_then, finished) for rows_then, _, _ in chunks]
            total = _lse_rounded_up_rows(
                np.concatenate([t[k] for (_, t, _), k in zip(chunks, at, strict=True)], axis=1),
                np.concatenate([c[k] for (_, _, c), k in zip(chunks, at, strict=True)], axis=1),
            )
            out[finished] = np.logaddexp(total, log_tail[done]) * (1.0 + 4.0 * _U)
        active = active[~done]
        start, n = n, 4 * n
    return out


def rdp_poisson_gaussian(sample_rate: float, noise_multiplier: float, orders: Sequence[float]) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian mechanism (add/remove neighbours).

    Formal guarantee: D_alpha <= log(A_alpha)/(alpha - 1) with A_alpha of Mironov, Talwar & Zhang
    2019 (arXiv:1908.10530), Sec. 3 (they show A_alpha >= B_alpha, so the other direction is
    covered); integer orders exactly (Sec. 3.1), fractional orders by the series of Sec. 3.3.
    One row of :func:`rdp_poisson_gaussian_rows`.
    """
    return rdp_poisson_gaussian_rows([(sample_rate, noise_multiplier)], orders)[0]


def rdp_poisson_gaussian_rows(mechanisms: Sequence[tuple[float, float]], orders: Sequence[float]) -> np.ndarray:
    """:func:`rdp_poisson_gaussian` of many (sample_rate, noise_multiplier) at once: row r is the RDP curve of
    mechanisms[r], bit for bit what that mechanism alone gets. A schedule of hundreds of phases (a noise
    multiplier or batch size changed every epoch) pays the series' numpy calls once per order, not once per
    order and phase (500 phases: see benchmarks/schedule_accounting.py).
    """
    a = _as_orders(orders)
    out = np.empty((len(mechanisms), a.size))
    general: list[tuple[int, float, float]] = []  # (row, q, sigma) that need the series
    for r, (sample_rate, noise_multiplier) in enumerate(mechanisms):
        q = check_in_interval(0.0, 1.0, hi_open=False, sample_rate=sample_rate)
        sigma = check_non_negative(noise_multiplier=noise_multiplier)
        if sigma == 0.0 or not math.isfinite(1.0 / (sigma * sigma)):
            out[r] = np.inf  # no noise, or so little that 1/sigma^2 overflows
        elif math.isinf(sigma):
            out[r] = 0.0
        # Where sigma^2 overflows float64 (sigma > ~1.3e154; Python's sigma**2 raises there), the unsubsampled
        # Gaussian's alpha / (2 sigma^2) bounds the subsampled one: the Renyi divergence is jointly quasi-convex
        # (van Erven & Harremoes 2014, arXiv:1206.2459, Thm. 13), so mixing with probability q cannot increase it.
        elif q == 1.0 or math.isinf(sigma * sigma):
            out[r] = rdp_gaussian(sigma, a)
        else:
            general.append((r, q, sigma))
    if not general:
        return out
    rows = [r for r, _, _ in general]
    qs, sigmas = [q for _, q, _ in general], [s for _, _, s in general]
    block = np.empty((len(general), a.size))
    # Overflow and inf - inf happen only where sigma^2 is subnormal or nearly so, and are handled below: no
    # RuntimeWarning reaches the user for them.
    with np.errstate(over="ignore", invalid="ignore"):
        log_q = np.array([math.log(q) for q in qs])
        log_1mq = np.array([math.log1p(-q) for q in qs])
        two_s2 = np.array([2.0 * s**2 for s in sigmas])
        fractional = []
        for idx, alpha in enumerate(a):
            if math.isinf(alpha):
                block[:, idx] = np.inf
            elif float(alpha).is_integer():
                block[:, idx] = _log_a_integer_rows(log_q, log_1mq, two_s2, int(alpha)) / (alpha - 1.0)
            else:
                fractional.append(idx)
        if fractional:
            tasks = [(g, idx) for g in range(len(general)) for idx in fractional]
            log_a = _log_a_fractional_rows(
                [qs[g] for g, _ in tasks], [sigmas[g] for g, _ in tasks], [float(a[idx]) for _, idx in tasks]
            )
            for (g, idx), value in zip(tasks, log_a, strict=True):
                block[g, idx] = value / (a[idx] - 1.0)
        # Where sigma^2 is subnormal or nearly so (sigma in ~[7.5e-155, 3.5e-153]) the fractional series adds
        # (i^2 - i)/(2 sigma^2) = inf to log Phi(.) = -inf and returned NaN: there, the unsubsampled Gaussian's bound
        # (quasi-convexity, as above; ~1e305 or inf there, and the exact value at least alpha log q/(alpha - 1) + it).
        for g, sigma in enumerate(sigmas):
            block[g] = np.where(np.isnan(block[g]), rdp_gaussian(sigma, a), block[g])
    # A_alpha >= 1 (Jensen), so r >= 0; clamp float noise upward (never downward).
    out[rows] = np.maximum(block, 0.0)
    return out


def rdp_laplace(epsilon: float, orders: Sequence[float]) -> np.ndarray:
    """RDP of the Laplace mechanism with epsilon = Delta / b (sensitivity over scale).

    Formal guarantee, tight (Mironov 2017, arXiv:1702.07476, Prop. 6):
        r(alpha) = eps + log(1 + (alpha-1)/(2 alpha - 1) (exp(-(2 alpha - 1) eps) - 1)) / (alpha - 1),
    written with log1p/expm1 so that small eps and orders near 1 keep their precision.
    """
    a = _as_orders(orders)
    eps = check_non_negative(epsilon=epsilon)
    if math.isinf(eps):
        return np.full_like(a, np.inf)
    return eps + np.log1p((a - 1.0) / (2.0 * a - 1.0) * np.expm1(-(2.0 * a - 1.0) * eps)) / (a - 1.0)


def rdp_pure_dp(epsilon: float, orders: Sequence[float]) -> np.ndarray:
    """Largest RDP of any epsilon-DP mechanism.

    Formal guarantee: an (eps, 0)-DP pair is a post-processing of binary randomized response with
    probabilities (e^eps, 1)/(1 + e^eps) (Dong, Roth & Su 2022, arXiv:1905.02383, Prop. 2.5 with
    Blackwell's theorem, their Thm. 2.10); Rényi divergences obey data processing (van Erven &
    Harremoës 2014, arXiv:1206.2459), so
        D_alpha <= log((e^(alpha eps) + e^((1-alpha) eps)) / (1 + e^eps)) / (alpha - 1),
    which is below both eps and alpha eps^2 / 2 (Bun & Steinke 2016, arXiv:1605.02065).
    """
    a = _as_orders(orders)
    eps = check_non_negative(epsilon=epsilon)
    if math.isinf(eps):
        return np.full_like(a, np.inf)
    if eps == 0.0:
        return np.zeros_like(a)
    out = (np.logaddexp(a * eps, (1.0 - a) * eps) - np.logaddexp(0.0, eps)) / (a - 1.0)
    return np.clip(out, 0.0, eps)


def rdp_randomized_response(noise_parameter: float, num_buckets: int, orders: Sequence[float]) -> np.ndarray:
    """Exact RDP of k-ary randomized response under replace-one neighbours.

    The output distributions are P = (1-p+p/k, p/k, ..., p/k) and Q with the first two entries
    swapped; D_alpha(P||Q) = log(sum P^alpha Q^(1-alpha)) / (alpha - 1) (definition of the Rényi
    divergence, Mironov 2017 Def. 3), evaluated in log space.
    """
    a = _as_orders(orders)
    p = float(noise_parameter)
    k = int(num_buckets)
    if k == 1 or p == 1.0:
        return np.zeros_like(a)
    if p == 0.0:
        return np.full_like(a, np.inf)
    log_hi = math.log1p(-p + p / k)
    log_lo = math.log(p / k)
    terms = [a * log_hi + (1.0 - a) * log_lo, a * log_lo + (1.0 - a) * log_hi]
    if k > 2:
        terms.append(np.full_like(a, math.log((k - 2) * p / k)))
    out = special.logsumexp(np.stack(terms), axis=0) / (a - 1.0)
    return np.maximum(out, 0.0)


@functools.lru_cache(maxsize=64)
def _even_central_moments(c: float, max_even: int) -> tuple[float, ...]:
    """Upper bounds on log E[(X - 1)^m], m = 0, 2, ..., max_even, X = exp(sqrt(2c) Z - c), Z ~ N(0, 1).

    E[X^l] = exp(c l (l - 1)), so E[(X-1)^m] = sum_i (-1)^(m-i) C(m, i) exp(c i (i - 1)): the m-th
    forward difference of l -> exp((l - 1) eps(l)) at 0 for the Gaussian (eps(l) = c l). The
    alternating sum cancels catastrophically in float64, so it is evaluated with mpmath at a
    working precision chosen from the cancellation ratio sum|terms| / result: sum|terms| <= 2^m s_m
    and, for even m, the result is at least max(Var(X)^(m/2), s_m - m s_(m-1)) (Jensen, and
    (x-1)^m >= x^m - m x^(m-1) for x >= 0). With that precision the relative error is below 2^-60;
    the result is rounded up by 2^-50 to stay an upper bound.
    """
    import mpmath

    log_var = math.log(math.expm1(2.0 * c))
    bits = 64
    for m in range(2, max_even + 1, 2):
        log_sm = c * m * (m - 1)
        log_lower = 0.5 * m * log_var
        log_gap = math.log(m) + c * (m - 1) * (m - 2) - log_sm
        if log_gap < -1e-3:
            log_lower = max(log_lower, log_sm + math.log1p(-math.exp(log_gap)))
        need = m + (log_sm - log_lower) / math.log(2.0) + math.log2(m + 2) + 64
        bits = max(bits, int(need) + 8)
    out = []
    with mpmath.workprec(bits):
        s = [mpmath.exp(mpmath.mpf(c) * (i * (i - 1))) for i in range(max_even + 1)]
        for m in range(0, max_even + 1, 2):
            acc = mpmath.mpf(0)
            for i in range(m + 1):
                term = math.comb(m, i) * s[i]
                acc = acc + term if (m - i) % 2 == 0 else acc - term
            out.append(float(mpmath.log(acc)) + 2.0**-50)
    return tuple(out)


def _wor_log_a_integer(q: float, c: float, alpha: int) -> float:
    """log of the bound inside Wang, Balle & Kasiviswanathan 2019 (arXiv:1808.00087), integer alpha.

    Base mechanism with eps(l) = c l (Gaussian). Theorem 9 (general bound, eps(inf) = inf):
        1 + q^2 C(alpha,2) min(4 (e^eps(2) - 1), 2 e^eps(2)) + sum_{j>=3} q^j C(alpha,j) 2 e^((j-1) eps(j)),
    and for alpha <= 256 the strengthened Theorem 27, whose j-th term is additionally capped by
    4 sqrt(E(X-1)^(2 floor(j/2)) E(X-1)^(2 ceil(j/2))) (Cauchy-Schwarz on E|X-1|^j).
    """
    j = np.arange(2, alpha + 1, dtype=np.float64)
    log_binom = _log_abs_binom(float(alpha), j) + j * math.log(q)
    log_generic = math.log(2.0) + c * j * (j - 1.0)  # 2 e^((j-1) eps(j))
    # j = 2 term: min(4 (e^eps(2) - 1), 2 e^eps(2)), eps(2) = 2c.
    log_generic[0] = min(math.log(4.0) + math.log(math.expm1(2.0 * c)), math.log(2.0) + 2.0 * c)
    if alpha <= _WOR_EXACT_MAX_ORDER:
        moments = _even_central_moments(c, 2 * ((alpha + 1) // 2))
        ji = j.astype(int)
        lo = np.array([moments[jj // 2] for jj in ji])
        hi = np.array([moments[(jj + 1) // 2] for jj in ji])
        log_cs = math.log(4.0) + 0.5 * (lo + hi)
        log_generic = np.minimum(log_generic, log_cs)
    return float(np.logaddexp(0.0, _lse(log_binom + log_generic)))


def rdp_sampled_without_replacement_gaussian(
    sample_rate: float, noise_multiplier: float, orders: Sequence[float]
) -> np.ndarray:
    """RDP of the Gaussian mechanism on a fixed-size subsample (without replacement), replace-one.

    Formal guarantee: Wang, Balle & Kasiviswanathan 2019 (arXiv:1808.00087), Theorems 9/27 at
    integer orders. Under replace-one the query moves by 2C, so the base mechanism has
    eps(alpha) = alpha * 2^2 / (2 sigma^2). Fractional orders: (alpha - 1) D_alpha = log E_Q[(P/Q)^alpha]
    is convex in alpha (Hölder's inequality), so linear
    interpolation of (alpha - 1) r(alpha) between neighbouring integers (and alpha = 1, where it is
    0) is an upper bound.
    """
    a = _as_orders(orders)
    q = check_in_interval(0.0, 1.0, hi_open=False, sample_rate=sample_rate)
    sigma = check_non_negative(noise_multiplier=noise_multiplier)
    if sigma == 0.0 or not math.isfinite(1.0 / (sigma * sigma)):
        return np.full_like(a, np.inf)
    if math.isinf(sigma):
        return np.zeros_like(a)
    sens = replace_factor("replace_one")
    if q == 1.0 or math.isinf(sigma * sigma):  # sigma^2 overflows: the unsubsampled bound, as in rdp_poisson_gaussian
        return rdp_gaussian(sigma, a, sensitivity=sens)
    c = sens**2 / (2.0 * sigma**2)

    @functools.cache
    def cgf(alpha: int) -> float:  # (alpha - 1) * r(alpha)
        if alpha == 1:
            return 0.0
        return max(0.0, _wor_log_a_integer(q, c, alpha))

    out = np.empty_like(a)
    for idx, alpha in enumerate(a):
        if math.isinf(alpha):
            out[idx] = np.inf
            continue
        lo, hi = math.floor(alpha), math.ceil(alpha)
        if lo == hi:
            out[idx] = cgf(lo) / (alpha - 1.0)
        else:
            t = alpha - lo
            out[idx] = ((1.0 - t) * cgf(lo) + t * cgf(hi)) / (alpha - 1.0)
    return out


# --------------------------------------------------------------------------------------------
# RDP -> (epsilon, delta)
# --------------------------------------------------------------------------------------------


#: Relative rounding margin of the RDP -> (epsilon, delta) conversions: a handful of float operations, each
#: within an ulp (half an ulp for + - * /, one for libm's log, log1p, expm1; Goldberg 1991, "What every computer
#: scientist should know about floating-point arithmetic"), on terms whose magnitudes the margin multiplies.
_CONVERSION_ULPS = 8.0 * 2.0**-52


def rdp_to_epsilon(orders: Sequence[float], rdp: Sequence[float], delta: float) -> tuple[float, float]:
    """(epsilon, optimal order) from an RDP curve.

    Formal guarantee. For each order, Canonne, Kamath & Steinke 2020 (arXiv:2004.00010, Prop. 12;
    also Balle et al. 2020, arXiv:1905.09982, Thm. 21):
        eps = r + log((alpha - 1)/alpha) - (log delta + log alpha) / (alpha - 1),
    which improves Mironov 2017 Prop. 3 (r + log(1/delta)/(alpha - 1)). Orders below 1.01 are
    skipped (the formula loses precision there). Independently, delta >= sqrt(1 - exp(-r)) implies
    (0, delta)-DP: D_alpha >= KL for alpha >= 1 and TV <= sqrt(1 - exp(-KL)) (Bretagnolle–Huber
    inequality; the same check is in dp_accounting).
    """
    a = _as_orders(orders)
    r = np.asarray(rdp, dtype=np.float64)
    if r.shape != a.shape:
        raise ValueError("orders and rdp must have the same length")
    delta = check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=delta)
    r = np.maximum(r, 0.0)  # numerical noise below 0 is rounded up, never down
    if delta >= 1.0:
        return 0.0, float(a[0])
    if delta == 0.0:
        return (0.0, float(a[0])) if np.all(r == 0.0) else (math.inf, float(a[0]))
    eps = _conversion(a, r, delta)
    with np.errstate(over="ignore", invalid="ignore"):
        kl_ok = (delta**2 + np.expm1(-r)) > 0.0
    eps = np.where(kl_ok, 0.0, eps)
    idx = int(np.argmin(eps))
    return max(0.0, float(eps[idx])), float(a[idx])


def _conversion(a: np.ndarray, r: np.ndarray, delta: float) -> np.ndarray:
    """The epsilon of :func:`rdp_to_epsilon` at each order, before the Bretagnolle–Huber check; r >= 0, 0 < delta
    < 1. Every operation is monotone in r, so at r = 0 it is a lower bound on the value at any r >= 0."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        log_ratio = np.log1p(-1.0 / a)
        shift = (math.log(delta) + np.log(a)) / (a - 1.0)
        eps = r + log_ratio - shift
        # Rounded up, not to nearest (half the results were 1 ulp below the formula's exact value): each term is
        # within a few ulps of its own size, so the sum's error is below _CONVERSION_ULPS times their magnitudes.
        eps = np.where(np.isfinite(eps), eps + _CONVERSION_ULPS * (r + np.abs(log_ratio) + np.abs(shift)), eps)
        eps = np.where(a > 1.01, eps, np.inf)
        return np.where(np.isnan(eps), np.inf, eps)


def rdp_to_delta(orders: Sequence[float], rdp: Sequence[float], epsilon: float) -> tuple[float, float]:
    """(delta, optimal order) from an RDP curve; inverse view of :func:`rdp_to_epsilon`.

    Formal guarantee (Canonne, Kamath & Steinke 2020, arXiv:2004.00010, Prop. 12):
        delta = exp((alpha - 1)(r - eps + log(1 - 1/alpha))) / alpha,
    combined with the Bretagnolle–Huber bound delta <= sqrt(1 - exp(-r)) (valid for every eps >= 0).
    """
    a = _as_orders(orders)
    r = np.maximum(np.asarray(rdp, dtype=np.float64), 0.0)
    if r.shape != a.shape:
        raise ValueError("orders and rdp must have the same length")
    eps = check_non_negative(epsilon=epsilon)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # log sqrt(1 - e^-r) = 0.5 log(-expm1(-r)): log1p(-exp(-r)) lost 1 - e^-r to rounding below r ~ 1e-8 and was
        # log(0) = -inf (delta 0, a claim of pure DP) below r = 1.1e-16 (a Gaussian of sigma 1e9 had delta(0) = 0).
        log_kl = np.where(r > 0.0, 0.5 * np.log(-np.expm1(-r)), -np.inf)
        log_kl = np.where(np.isfinite(log_kl), log_kl + _CONVERSION_ULPS * (np.abs(log_kl) + 1.0), log_kl)
        # The float subtraction r - eps is correctly rounded (half an ulp of |r - eps|, exact when they are within a
        # factor 2: Sterbenz), so the log's absolute error is a few ulps of (a - 1)(|r - eps| + |log(1 - 1/a)|) +
        # log a: up to 1.4e-13 in log delta at delta ~ 1e-228 (delta that much below the formula's exact value, to
        # nearest); rounded up by that bound, and by one more for exp's own rounding (+ 1).
        log_ratio = np.log1p(-1.0 / a)
        log_rdp = (a - 1.0) * (r - eps + log_ratio) - np.log(a)
        margin = _CONVERSION_ULPS * ((a - 1.0) * (np.abs(r - eps) + np.abs(log_ratio)) + np.log(a) + 1.0)
        log_rdp = np.where(np.isfinite(log_rdp), log_rdp + margin, log_rdp)
        log_rdp = np.where(a > 1.01, log_rdp, np.inf)
        log_rdp = np.where(np.isnan(log_rdp), np.inf, log_rdp)
    log_delta = np.minimum(log_kl, log_rdp)
    log_delta = np.where(
        np.isinf(r) | np.isnan(r), np.inf, log_delta
    )  # NaN: no bound at that order (as rdp_to_epsilon)
    idx = int(np.argmin(log_delta))
    return float(min(1.0, math.exp(min(0.0, float(log_delta[idx]))))), float(a[idx])


# --------------------------------------------------------------------------------------------
# Accountant
# --------------------------------------------------------------------------------------------


class RdpAccountant(Accountant):
    """Rényi-DP accountant over a fixed grid of orders (default :data:`DEFAULT_ORDERS`).

    Supported leaves: Gaussian, Laplace, GNMax, LNMax, ZCDP, EpsilonDelta with delta = 0,
    RandomizedResponse (replace-one), PoissonSampled(Gaussian-composition) (add/remove),
    FixedSizeSampled(Gaussian-composition) (replace-one). JLGaussian is not (use the PLD accountant).
    """

    name = "rdp"

    def __init__(self, *, neighbouring: str = "add_remove", orders: Sequence[float] | None = None) -> None:
        super().__init__(neighbouring=neighbouring)
        self.orders = _as_orders(DEFAULT_ORDERS if orders is None else orders)
        self._rdp = np.zeros_like(self.orders)
        self._empty = True
        # Poisson-subsampled Gaussians' fractional orders are computed when a query needs them (_resolve): their
        # series is most of the cost (up to 2^14 terms an order near 1), and an epsilon(delta) query needs only the
        # orders whose conversion could beat the others' epsilon (_epsilon). Until then _rdp is +inf there.
        self._deferrable = np.array([math.isfinite(a) and not float(a).is_integer() for a in self.orders])
        self._curves: list[tuple[np.ndarray, int]] = []  # every leaf's curve and count, in composition order
        self._missing: dict[int, tuple[float, float, np.ndarray]] = {}  # curve index -> (q, sigma, orders not computed)
        self._kl_floor = 0.0  # lower bound on the deferred leaves' RDP at every order (_accumulate)
        self._resolving = threading.Lock()  # queries from two threads (a Dask worker's) resolve one at a time

    @property
    def rdp(self) -> np.ndarray:
        """Accumulated RDP r(alpha) at :attr:`orders` (a copy)."""
        self._resolve(np.ones(self.orders.size, dtype=bool))
        return self._rdp.copy()

    def _leaves(self, events: list[Event]) -> list:
        # The Poisson-subsampled Gaussians of one composition (a schedule's phases) as one batch of series, at the
        # orders computed now; every other leaf as _leaf converts it. The first unsupported leaf raises, as in _leaf.
        reps: list = [None] * len(events)
        sampled: list[tuple[int, float, float]] = []
        for k, event in enumerate(events):
            if isinstance(event, PoissonSampled) and self.neighbouring == "add_remove":
                sampled.append((k, event.sample_rate, self._inner_sigma(event)))
            else:
                reps[k] = self._leaf(event)
        if sampled:
            # Each distinct (q, sigma) is a series per order: announced above a minute, refused above an hour without
            # --yes (dpaudit.budget), before any of it starts.
            check_cost(
                Cost(
                    f"RDP accounting of {len(sampled)} Poisson-subsampled Gaussians (one series per order each)",
                    len(sampled),
                    "mechanisms",
                    bytes_per_unit=8.0 * self.orders.size,
                    seconds_per_unit=RDP_SECONDS_PER_MECHANISM,
                    advice="compose fewer distinct (noise multiplier, sample rate) pairs",
                )
            )
            now = ~self._deferrable
            rows = rdp_poisson_gaussian_rows([(q, sigma) for _, q, sigma in sampled], self.orders[now])
            for (k, q, sigma), row in zip(sampled, rows, strict=True):
                curve = np.full(self.orders.size, np.inf)
                curve[now] = row
                reps[k] = _DeferredCurve(curve, q, sigma) if self._deferrable.any() else curve
        return reps

    def _leaf(self, event: Event) -> np.ndarray:
        o = self.orders
        sens = replace_factor(self.neighbouring)
        if isinstance(event, Gaussian):
            return rdp_gaussian(event.noise_multiplier, o, sensitivity=sens)
        if isinstance(event, Laplace):
            b = event.noise_multiplier
            return rdp_laplace(math.inf if b == 0.0 else sens / b, o)
        if isinstance(event, GNMax):
            # Papernot et al. 2018 (arXiv:1802.08908), Prop. 8: data-independent GNMax is
            # (alpha, alpha / sigma^2)-RDP (one changed vote moves the histogram by sqrt(2)).
            return rdp_gaussian(event.sigma, o, sensitivity=math.sqrt(2.0))
        if isinstance(event, LNMax):
            # Papernot et al. 2017 (arXiv:1610.05755), Sec. 3: Laplace(1/gamma) noisy max
            # is (2 gamma, 0)-DP; here gamma = 1 / noise_scale.
            b = event.noise_scale
            return rdp_pure_dp(math.inf if b == 0.0 else 2.0 / b, o)
        if isinstance(event, ZCDP):
            # Bun & Steinke 2016 (arXiv:1605.02065), Def. 1.1: rho-zCDP is (alpha, rho alpha)-RDP.
            return event.rho * o
        if isinstance(event, EpsilonDelta):
            if event.delta > 0.0:
                raise unsupported(
                    self.name, event, "(epsilon, delta)-DP with delta > 0 has no finite RDP; use the pld accountant"
                )
            return rdp_pure_dp(event.epsilon, o)
        if isinstance(event, RandomizedResponse):
            if self.neighbouring != "replace_one":
                raise unsupported(self.name, event, "randomized response is accounted with neighbouring='replace_one'")
            return rdp_randomized_response(event.noise_parameter, event.num_buckets, o)
        if isinstance(event, JLGaussian):
            raise unsupported(self.name, event, "no RDP analysis of DP-SGD-JL is implemented; use pld")
        if isinstance(event, PoissonSampled):  # under add/remove converted by _leaves, all of a composition at once
            raise unsupported(self.name, event, "Poisson subsampling is accounted with neighbouring='add_remove'")
        if isinstance(event, FixedSizeSampled):
            if self.neighbouring != "replace_one":
                raise unsupported(
                    self.name, event, "sampling without replacement is accounted with neighbouring='replace_one'"
                )
            sigma = self._inner_sigma(event)
            return rdp_sampled_without_replacement_gaussian(event.sample_rate, sigma, o)
        raise unsupported(self.name, event, "no RDP bound for this mechanism")

    def _inner_sigma(self, event: PoissonSampled | FixedSizeSampled) -> float:
        sigma = effective_gaussian_noise_multiplier(event.event)
        if isinstance(sigma, Event):
            hint = "; use pld" if isinstance(sigma, JLGaussian) else ""
            raise unsupported(self.name, sigma, f"only Gaussian mechanisms are supported inside subsampling{hint}")
        return sigma

    def _accumulate(self, rep: np.ndarray | _DeferredCurve, count: int) -> None:
        if isinstance(rep, _DeferredCurve):
            self._missing[len(self._curves)] = (rep.sample_rate, rep.noise_multiplier, self._deferrable.copy())
            # The curve computed later bounds D_alpha(mu || mu_0) from above, mu = (1-q) N(0, s^2) + q N(1, s^2),
            # mu_0 = N(0, s^2) (Mironov, Talwar & Zhang 2019, Sec. 3); D_alpha >= KL for alpha > 1 (van Erven &
            # Harremoes 2014, arXiv:1206.2459, Thm. 3) >= 2 TV^2 (Pinsker's inequality), and TV(mu, mu_0) =
            # q TV(N(1, s^2), N(0, s^2)) = q erf(1 / (2 sqrt(2) s)). _epsilon reads the sum of count * 2 TV^2.
            q, sigma = rep.sample_rate, rep.noise_multiplier
            tv = q if sigma == 0.0 else q * math.erf(1.0 / (2.0 * math.sqrt(2.0) * sigma))
            self._kl_floor += count * 2.0 * tv * tv
            rep = rep.curve
        self._curves.append((rep, count))
        with np.errstate(invalid="ignore"):
            self._rdp = self._rdp + count * rep
        self._rdp = np.where(np.isnan(self._rdp), np.inf, self._rdp)
        self._empty = False

    def _resolve(self, wanted: np.ndarray) -> None:
        """Compute the deferred orders in ``wanted`` of every leaf that lacks them (one batch), and sum the curves
        again there, leaf by leaf in composition order as _accumulate did: the same bits as if computed at once."""
        with self._resolving:
            todo: dict[bytes, list[int]] = {}  # leaves by the orders they still need, as one batch each
            for idx, (_, _, missing) in self._missing.items():
                need = missing & wanted
                if need.any():
                    todo.setdefault(need.tobytes(), []).append(idx)
            if not todo:
                return
            changed = np.zeros(self.orders.size, dtype=bool)
            for key, leaves in todo.items():
                need = np.frombuffer(key, dtype=bool)
                rows = rdp_poisson_gaussian_rows([self._missing[i][:2] for i in leaves], self.orders[need])
                for i, row in zip(leaves, rows, strict=True):
                    self._curves[i][0][need] = row
                    self._missing[i][2][need] = False
                    if not self._missing[i][2].any():
                        del self._missing[i]
                changed |= need
            total = np.zeros(int(changed.sum()))
            for curve, count in self._curves:
                with np.errstate(invalid="ignore"):
                    total = total + count * curve[changed]
                total = np.where(np.isnan(total), np.inf, total)
            self._rdp[changed] = total

    def _is_empty(self) -> bool:
        return self._empty

    def _epsilon(self, delta: float) -> float:
        if self._missing:
            # epsilon is the minimum over orders of _conversion (or 0 by the Bretagnolle-Huber check). An order not
            # computed yet can lower it only if its conversion at r = 0 (a lower bound: _conversion) is below the
            # epsilon of the orders computed, or if the check could pass there: it cannot when r >= the deferred
            # leaves' KL floor gives 1 - e^-r > delta^2 (margins: the floor's and expm1's rounding). Only those orders
            # are computed; the minimum is then the same number as over every order.
            wanted = np.ones(self.orders.size, dtype=bool)
            floor = self._kl_floor * (1.0 - 1e-9)
            if 0.0 < delta and -math.expm1(-floor) > delta * delta * (1.0 + 1e-6):
                known = rdp_to_epsilon(self.orders, self._rdp, delta)[0]
                wanted = _conversion(self.orders, np.zeros(self.orders.size), delta) < known
            self._resolve(wanted)
        return rdp_to_epsilon(self.orders, self._rdp, delta)[0]

    def _delta(self, epsilon: float) -> float:
        self._resolve(np.ones(self.orders.size, dtype=bool))
        return rdp_to_delta(self.orders, self._rdp, epsilon)[0]


@dataclass(frozen=True, eq=False)
class _DeferredCurve:
    """A Poisson-subsampled Gaussian's RDP curve whose fractional orders are not computed yet (+inf there)."""

    curve: np.ndarray
    sample_rate: float
    noise_multiplier: float
