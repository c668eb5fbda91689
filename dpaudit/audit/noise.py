"""The noise check: was the Gaussian noise that DP-SGD claims actually added? (NumPy/SciPy only.)

Gradient-canary hooks (:mod:`dpaudit.hooks`) see the clipped sum before the noise and the noisy sum
after it, so the noise actually added, z_t = noisy_t − clipped_sum_t, is known exactly on every
coordinate. The claim "DP-SGD with noise multiplier σ and clip C" says (Abadi et al. 2016,
arXiv:1607.00133, Alg. 1): z_t ~ N(0, σ²C² I), independently across coordinates and steps. Both
tests below are exact tests of that claim (a test of the claim is a test of the mechanism the ε is
computed for), so a rejection is a formal violation at the stated level:

- variance (:func:`variance_test`), per parameter group g: S_g = Σ_t Σ_{j untouched} z_{t,j}² over
  the n_g = T·(coordinates no canary touches) values. Under the claim S_g/(σC)² ~ χ²_{n_g}
  (mean known to be 0, so n_g degrees of freedom, not n_g − 1); more noise than claimed only makes
  S_g larger (stochastic order), so the lower tail p_g = F_{χ²_{n_g}}(S_g/(σC)²) is a valid p-value
  for "at least σC" (Casella & Berger 2002, §8.3, the χ² test of a normal variance). Groups are
  combined by Bonferroni (α/G each), so a bias left without noise is caught however small it is.
- independence across steps (:func:`independence_test`): K projections p_{t,k} = Σ_{j∈S_k} w_kj z_{t,j}
  on fixed random weights with disjoint supports S_k. Under the claim the p_{t,k} are i.i.d.
  N(0, v_k) across t and independent across k, so t_k = √T·mean_k/sd_k ~ t_{T−1} exactly and the
  two-sided p-values are independent uniforms, combined by Fisher's method (−2 Σ log p_k ~ χ²_{2K};
  Fisher 1932, §21.1). Noise reused at every step makes sd_k ≈ 0 (p_k ≈ 0); any persistent component
  inflates |mean_k|. The test is scale-free, so more noise than claimed never rejects.
- independence across parameter groups (:func:`cross_group_p_value`), per pair of groups (a, b): the
  cosine r between their noise vectors over the positions both record (the first few hundred flat
  positions of each, all steps: k values). Under the claim z_a is N(0, s_a² I_k), spherically symmetric
  and independent of z_b, so r is distributed as the cosine between z_a and a fixed direction:
  r² ~ Beta(1/2, (k − 1)/2) exactly (Muirhead 1982, Thm 1.5.7 with one vector fixed), whatever s_a and
  z_b's law; the two-sided p-value is its upper tail, pairs combined by Bonferroni. One PRNG key used for
  every leaf (the same leading draws on every group: r ≈ 1) gives p ≈ 0; the test is scale-free.

Resolution (:func:`resolvable_noise_ratio`): with n degrees of freedom at level α the variance test
detects, with probability ``power``, a noise standard deviation r·σC for any
r ≤ √(χ²_n⁻¹(α) / χ²_n⁻¹(power)) ≈ 1 − (z_α + z_power)/√(2n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from dpaudit import numfmt
from dpaudit.errors import InputError
from dpaudit.validation import check_in_interval, check_positive


@dataclass(frozen=True)
class GroupVariance:
    """One parameter group's variance test: ``ratio`` = estimated noise std / claimed σC (an estimate),
    ``ratio_upper`` its upper confidence bound at the group's level, ``p_value`` the χ² lower tail."""

    name: str
    dof: int
    ratio: float
    ratio_upper: float
    p_value: float
    resolvable_ratio: float  # the largest true ratio this group detects with probability 1/2 at its level


@dataclass(frozen=True)
class NoiseCheck:
    """The noise check's two formal tests and their verdict (``alpha`` is the level of the check as a whole)."""

    noise_std: float
    alpha: float
    groups: tuple[GroupVariance, ...]
    variance_p_value: float  # min over groups × G (Bonferroni), capped at 1
    independence_p_value: float | None  # None: fewer than 3 steps or no projection
    verdict: str
    notes: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    cross_group_p_value: float | None = None  # None: one group, or no cross-group summary recorded

    @property
    def formal(self) -> bool:
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            "noise_std": self.noise_std,
            "alpha": self.alpha,
            "confidence": 1.0 - self.alpha,
            "formal": True,
            "verdict": self.verdict,
            "variance_p_value": self.variance_p_value,
            "independence_p_value": self.independence_p_value,
            "cross_group_p_value": self.cross_group_p_value,
            "groups": [g.__dict__ for g in self.groups],
            "notes": list(self.notes),
            "details": self.details,
        }

    def summary(self) -> str:
        lines = [
            f"noise check (formal, level {self.alpha:.3g}): verdict {self.verdict}; claimed noise std sigma*C = "
            f"{self.noise_std:.4g}",
            f"  variance test {numfmt.p_value(self.variance_p_value)} (Bonferroni over {len(self.groups)} groups); "
            + (
                f"independence across steps {numfmt.p_value(self.independence_p_value)}"
                if self.independence_p_value is not None
                else "independence across steps: not tested"
            )
            + (
                f"; independence across groups {numfmt.p_value(self.cross_group_p_value)}"
                if self.cross_group_p_value is not None
                else ""
            ),
        ]
        for g in self.groups:
            # As the report's noise table prints them (dpaudit.report._format.noise_rows): the upper bound rounded
            # up with digits enough to compare with 1 as it does (a group is rejected exactly when it is below 1;
            # ``.4g`` printed a rejected group's 0.99996 as "upper bound 1"), the resolvable ratio rounded down.
            upper = g.ratio_upper
            if math.isfinite(upper):
                upper = numfmt.ordered(upper, 1.0, left_digits=4, left_up=True)[0]
            else:
                upper = numfmt.upper(upper)
            lines.append(
                f"  {g.name}: noise std / claimed = {g.ratio:.4g} (estimate; upper bound {upper}), "
                f"{numfmt.p_value(g.p_value)}, {g.dof} values, resolves ratios <= {numfmt.lower(g.resolvable_ratio, 4)}"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def resolvable_noise_ratio(dof: int, alpha: float, power: float = 0.5) -> float:
    """The largest ratio r = (true noise std)/(claimed σC) that the χ² lower-tail test with ``dof``
    degrees of freedom at level ``alpha`` rejects with probability ``power``: reject when
    S/(σC)² ≤ c = χ²_dof⁻¹(α); S/(rσC)² ~ χ²_dof, so P(reject) = F(c/r²) = power gives
    r = √(c / χ²_dof⁻¹(power)).

    Rounded down: a planning number must not promise that the check resolves a deficit smaller than it does (a
    ratio nearer 1). c is :func:`_chi2_lower_quantile` (not above the exact quantile, and the critical value the
    test itself uses: it rejects where :func:`variance_p_value`, never below the exact tail, is ≤ α); the quantile
    at ``power`` is scipy's raised by 2^-40 (chi2.ppf measured within 20 ulps, see _SCIPY_REL_ERROR); the quotient
    and the square root (≤ 1.5 ulps) by 2^-50."""
    upper = float(stats.chi2.ppf(power, dof)) * (1.0 + _SCIPY_REL_ERROR)
    return math.sqrt(_chi2_lower_quantile(alpha, dof) / upper) * (1.0 - 2.0**-50)


def variance_p_value(sum_squares: float, dof: int, noise_std: float) -> float:
    """Lower-tail p-value of "the noise std is at least ``noise_std``": F_{χ²_dof}(S / noise_std²).

    Assumes (the claim) ``dof`` independent N(0, s²) values with s ≥ noise_std and known mean 0, so
    S/s² ~ χ²_dof exactly — ``dof`` is the number of values, not one less (no mean is estimated)."""
    if dof <= 0:
        raise InputError(f"the variance test needs at least one value, got {dof}")
    # Raised by 4 ulps: σ² and the quotient round (≤ 1 ulp together), and F's log-slope x·f(x)/F(x) ≈ z·√(dof/2) turns
    # an ulp of x into ~2.5e4 ulps of p at dof 1e8 (to nearest, p was 1.3e4 ulps below exact at dof 1e8, p 3e-4;
    # benchmarks/stats_rounding.py, ``noise``). A larger x only raises p, the safe side.
    x = sum_squares / (noise_std * noise_std) * (1.0 + 4.0 * 2.0**-52)  # inf, not OverflowError, for a huge std
    p = float(stats.chi2.cdf(x, dof))
    if dof >= _SERIES_DOF and x < dof and p < _SCIPY_ACCURATE_ABOVE:
        return _chi2_lower_tail(x, dof)
    return min(1.0, float(_tail_up(p, _CDF_ULPS_PER_LOG)) * (1.0 + _SCIPY_REL_ERROR))


# scipy's chi2.cdf (its incomplete gamma) against 60-digit mpmath (benchmarks/RESULTS.md): BELOW the exact value by
# up to 24 % at dof 1e8 and p ≤ 1e-6 (0.8 % at 1e7, 8.4e-5 at 3e6, 1.7e-8 at 1e6), which reads as "too little noise"
# where the noise is as claimed; within 3e-14 relative (135 ulps) at p ≥ 1e-5 for dof up to 1e8 and at every p for
# dof ≤ 3e5 (43 ulps worst, dof 1e4) for p ≥ 1e-12. Below p = 1e-4 from dof 1e5 the tail is summed here
# (_chi2_lower_tail); elsewhere scipy's value is raised by 2^-40 (4096 ulps, 30x its measured error at p ≥ 1e-12) and
# by 256 |ln p| + 256 ulps (_tail_up): below dof 1e5 scipy's error grows with |ln p|, up to 32.6 (|ln p| + 1) ulps
# (1.1e4 ulps low at dof 9714, p 5.5e-269; 1466 at dof 591, p 8.4e-20; benchmarks/stats_rounding.py, ``noise``),
# which the 2^-40 alone left up to 7263 ulps below exact. The two together are ≥ 7.3x every error measured.
_SERIES_DOF = 100_000
_SCIPY_ACCURATE_ABOVE = 1e-4
_SCIPY_REL_ERROR = 2.0**-40
_CDF_ULPS_PER_LOG = 256.0


def _chi2_lower_quantile(level: float, dof: int) -> float:
    """A lower bound on the χ²_dof quantile at ``level`` (P[χ² ≤ x] = level), for the upper confidence bound on the
    noise std, consistent with :func:`variance_p_value`: that bound is below 1 exactly when the p-value is below the
    level. scipy's chi2.ppf inverts its chi2.cdf, which is low where the p-value sums the tail itself (see
    _SCIPY_ACCURATE_ABOVE), so its quantile is HIGH there (the std's bound too low): there the largest x found with
    variance_p_value(x) < level is taken (bisection, 60 steps from scipy's value). Elsewhere scipy's quantile lowered
    by 2^-40 relative (chi2.ppf measured up to 20 ulps high, df 1, level 1e-15)."""
    x = float(stats.chi2.ppf(level, dof))
    if not (dof >= _SERIES_DOF and level < _SCIPY_ACCURATE_ABOVE and 0.0 < x < dof):
        return x * (1.0 - _SCIPY_REL_ERROR)
    lo, hi = x, x
    while variance_p_value(lo, dof, 1.0) >= level:  # our P is ≥ scipy's, so P(x) ≥ level: step down
        hi, lo = lo, lo - max(lo, 1.0) * 1e-3
        if lo <= 0.0:
            return 0.0  # no positive x has P below the level: the bound is infinite
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if variance_p_value(mid, dof, 1.0) < level else (lo, mid)
    return lo


def _chi2_lower_tail(x: float, dof: int) -> float:
    """P[χ²_dof ≤ x] for x < dof, rounded up: P(a, y) = y^a e^−y / Γ(a + 1) · ₁F₁(1; a + 1; y), a = dof/2, y = x/2
    (Abramowitz & Stegun 6.5.29 with 13.1.2). The prefactor's exponent a ln y − y − ln Γ(a + 1) cancels to a few
    units out of ~a ln a; it is written −a (u − ln(1 + u)) − ½ ln(2πa) − 1/(12a) + 1/(360a³) with u = y/a − 1
    (Stirling's series, the next term below 1e-27 at a ≥ 5e4), u − ln(1 + u) by its Taylor series for |u| < 0.1.
    The series' terms t_k = Π_{j ≤ k} y/(a + j) decrease (y < a); it is summed until a term is below 2^-60 of the
    sum, and the rest bounded by the geometric tail t_K r/(1 − r), r = y/(a + K + 1). Rounding: the exponent's
    absolute error grows with its size, the sum's relative error with the K terms: measured against 60-digit mpmath
    (dof 1e5..1e8, p 1e-100..0.4) at most 542 ulps below (dof 1e5, p 1e-100, exponent −230) and 18 ulps elsewhere;
    the result is raised by 16 (|exponent| + 64) + 4 K ulps (≥ 8.7x at every point measured)."""
    if x <= 0.0:
        return 0.0  # P[χ² ≤ 0] = 0 exactly
    a, y = dof / 2.0, x / 2.0
    u = (x - dof) / dof  # in (−1, 0)
    if abs(u) < 0.1:  # u − ln(1 + u) = Σ_{k ≥ 2} (−u)^k / k
        g = sum((-u) ** k / k for k in range(2, 40))
    else:
        g = u - math.log1p(u)
    log_pref = -a * g - 0.5 * math.log(2.0 * math.pi * a) - 1.0 / (12.0 * a) + 1.0 / (360.0 * a**3)
    if log_pref < -745.0:
        return 2.0**-1074  # below the smallest subnormal: the smallest positive p, never 0
    # Terms in log space: ln t_k = Σ_{j ≤ k} ln(y/(a + j)). t_k ≤ r1^k (r1 = y/(a + 1)) and ≤ e^(−k(k − 1)/(2(a + k))):
    # past min(60 ln 2 / −ln r1, 12 √a) terms both are below 2^-60; the tail bound below holds whatever the count.
    r1 = y / (a + 1.0)
    n_terms = int(min(60.0 * math.log(2.0) / -math.log(r1), 12.0 * math.sqrt(a))) + 2
    k = np.arange(1, n_terms + 1, dtype=np.float64)
    log_terms = np.cumsum(np.log(y / (a + k)))
    terms = np.exp(log_terms)
    r = y / (a + n_terms + 1.0)
    total = 1.0 + float(terms.sum()) + float(terms[-1]) * r / (1.0 - r)
    margin = (16.0 * (abs(log_pref) + 64.0) + 4.0 * n_terms) * 2.0**-52
    return min(1.0, math.exp(log_pref) * total * (1.0 + margin))


def independence_p_value(projections: np.ndarray) -> float | None:
    """Fisher's combination of K two-sided one-sample t-tests of mean 0 on the columns of
    ``projections`` (T × K); None when T < 3 or K = 0. A column with no spread at all (sd = 0: the
    same noise at every step, or none) has p = 0. Rounded up (a p-value too small makes "not independent", a
    violation, too easy): see :func:`_t_test_p_values` and :func:`_fisher_upper_tail`."""
    P = np.asarray(projections, dtype=np.float64)
    if P.ndim != 2 or P.shape[0] < 3 or P.shape[1] == 0:
        return None
    p = _t_test_p_values(P)
    return 0.0 if np.any(p <= 0.0) else _fisher_upper_tail(p)


def _t_test_p_values(P: np.ndarray) -> np.ndarray:
    """The two-sided p-values 2·P[t_{T−1} > |t_k|] of the columns of P (T × K, T ≥ 3), t_k = √T·mean_k/sd_k ~ t_{T−1}
    under i.i.d. normal columns (Student 1908), rounded up: |t| lowered by its mean's and sd's rounding, the tail
    by :func:`_student_two_sided`."""
    T = P.shape[0]
    mean, sd = P.mean(axis=0), P.std(axis=0, ddof=1)
    # A spread at the float-rounding level of the values is no spread: noise reused exactly, up to rounding.
    tiny = sd <= 1e-6 * np.maximum(np.abs(P).max(axis=0), np.finfo(float).tiny)
    # numpy's pairwise sums carry a relative error of about (log2 T + 4) 2^-52 of their terms' magnitudes (Higham
    # 2002, §4.2; the white-box audit's g): the mean is off by g·mean|P|, the sd by g of itself (its deviations from
    # a rounded mean only add to Σ(x − m)², raising sd); √T·|mean|/sd is lowered by both, 8 of those units.
    g = 8.0 * (math.log2(T) + 4.0) * 2.0**-52
    with np.errstate(divide="ignore", invalid="ignore"):
        t = math.sqrt(T) * (np.abs(mean) * (1.0 - 2.0 * g) - g * np.abs(P).mean(axis=0)) / np.where(tiny, 1.0, sd)
    return _student_two_sided(np.where(tiny, np.inf, np.maximum(t, 0.0)), T - 1)


def _student_two_sided(t, df: int):
    """2·P[t_df > t] for t ≥ 0, rounded up: scipy's t.sf raised by :func:`_tail_up`."""
    return np.minimum(1.0, _tail_up(2.0 * stats.t.sf(t, df)))


def _tail_up(p, units: float = 16.0):
    """A tail probability from scipy raised by ``units`` (|ln p| + 1) ulps; 0 stays 0. Against 50-digit mpmath
    (benchmarks/stats_rounding.py, ``noise-other``) scipy's t.sf was up to 2.05 (|ln p| + 1) ulps below exact (864
    ulps at df 2640, p 4e-273; 49 at df 100, p 1e-12; df 2..1e7, p 1e-300..0.5): the error of an exponential of a
    log-scale quantity; beta.sf(x, ½, b) at most 0.46 ulps: 16 units (the default) is 7.8x the worst. chi2.cdf takes
    256 (:data:`_CDF_ULPS_PER_LOG`)."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # p = 0: ln 0 = −inf, 0·inf, both discarded
        return np.where(p > 0.0, p * (1.0 + units * (np.abs(np.log(p)) + 1.0) * 2.0**-52), p)


def _fisher_upper_tail(p: np.ndarray) -> float:
    """Fisher's combination of K independent p-values (all > 0), rounded up: −2 Σ ln p_k ~ χ²_{2K} under the null
    (Fisher 1932, §21.1). The K logs (≤ 4 ulps each, numpy's SIMD log) and their sum (≤ (K − 1) ulps of Σ|ln p_k|,
    the sum itself: the terms have one sign) are charged by lowering the statistic 2 (K + 4) ulps; its tail is
    :func:`_chi2_even_upper_tail`."""
    K = len(p)
    fisher = float(-2.0 * np.log(p).sum()) * (1.0 - 2.0 * (K + 4.0) * 2.0**-52)
    return _chi2_even_upper_tail(fisher, K)


def _chi2_even_upper_tail(x: float, half_dof: int) -> float:
    """P[χ²_{2K} > x], K = ``half_dof``, rounded up: Q(K, y) = e^−y Σ_{j<K} y^j / j!, y = x/2 (the χ² survival
    function is the regularized upper incomplete gamma Q(ν/2, x/2), and for integer K this is DLMF 8.4.10). scipy's
    chi2.sf was measured up to 3607 ulps below exact (dof 4000, p 1e-100; 544 ulps at dof 300, p 1e-8), growing
    with dof and |ln p|, so the sum is taken here, in log space around its largest term j* = min(K − 1, ⌊y⌋):
    ln t_j* = j* ln y − y − Σ_{i ≤ j*} ln i, the others by the ratios t_{j−1}/t_j = j/y and t_{j+1}/t_j = y/(j + 1).
    Rounding, first order in u = 2^-52: ln t_j* is off by at most u (2 j* |ln y| + |y| + 2 Σ ln i + |ln t_j*|)
    absolute (each log within an ulp, each product and sum one rounding), the ratios' products by 2K u and the sum
    by K u relative, ln and exp of the result by u (1 + |ln p|): p is raised by 4 times the total, and a result
    below the smallest normal number is returned as that number (an upper bound; no subnormal's rounding)."""
    if x <= 0.0:
        return 1.0
    if not math.isfinite(x):
        return 0.0
    y = x / 2.0
    top = min(half_dof - 1, math.floor(y))
    log_y = math.log(y)
    log_fact = math.fsum(math.log(i) for i in range(2, top + 1))
    log_top = top * log_y - y - log_fact
    ratios = np.concatenate([np.arange(top, 0, -1) / y, y / np.arange(top + 1, half_dof)])  # down, then up
    down = np.cumprod(ratios[:top])
    up = np.cumprod(ratios[top:])
    log_p = log_top + math.log(1.0 + float(down.sum()) + float(up.sum()))
    err = 2.0**-52 * (2.0 * top * abs(log_y) + y + 2.0 * log_fact + abs(log_top) + 3.0 * half_dof + 1.0 + abs(log_p))
    log_p += 4.0 * err
    if log_p < math.log(2.0**-1022):
        return 2.0**-1022
    return min(1.0, math.exp(log_p))


def cross_group_p_value(cross, counts) -> tuple[float, str] | None:
    """Bonferroni-combined p-value of "the noise of every pair of groups is independent" and the worst pair
    ("a / b"), from ``cross`` (3, G, G): Σ z_a·z_b, Σ z_a², Σ z_b² over each pair's compared positions, all
    steps, and ``counts`` (G, G): how many values k each pair compared (see the module docstring; pairs with
    k < 2 are skipped). None when no pair is tested. A pair whose vectors are parallel (r² = 1: the same
    draws) has p ≈ 0 (exactly 0 from a few tens of values on: the tail underflows)."""
    c = np.asarray(cross, dtype=np.float64)
    k = np.asarray(counts, dtype=np.int64)
    G = k.shape[0]
    a, b = np.triu_indices(G, 1)
    keep = k[a, b] >= 2
    a, b = a[keep], b[keep]
    if not len(a):
        return None
    n = k[a, b].astype(np.float64)
    denom = c[1, a, b] * c[2, a, b]
    none = ~(denom > 0.0)  # no noise at all on one side: no spread, p = 0 (as for parallel vectors)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.minimum(1.0, np.abs(c[0, a, b]) / np.sqrt(np.where(none, 1.0, denom)))
    # Rounded up (a p-value too small makes "not independent", a violation, too easy). |r| is lowered by the sums'
    # rounding: each of the three is a sum of at most k + 1 rounded products (a dot product per step, accumulated
    # over the steps: Higham 2002, §3.1, error ≤ (k + 1)u Σ|terms|) and Σ|z_a z_b| ≤ √(Σz_a² Σz_b²) (Cauchy–Schwarz),
    # so with γ = 2 (k + 8) u (twice that, plus r's own few roundings) |r_exact| ≥ |r|(1 − γ) − γ. Snapping r² ≥
    # 1 − 1e-12 to p = 0, as before, put the exact p of a pair at up to 6.4e-7 (k = 2) at 0. The tail, scipy's
    # beta.sf, is raised by :func:`_tail_up`.
    gamma = 2.0 * (n + 8.0) * 2.0**-52
    r_low = np.maximum(r * (1.0 - gamma) - gamma, 0.0)
    ps = np.where(none, 0.0, _tail_up(stats.beta.sf(r_low * r_low, 0.5, (n - 1.0) / 2.0)))
    worst = int(np.argmin(ps))
    return min(1.0, float(ps[worst]) * len(ps)), f"{a[worst]} / {b[worst]}"


def noise_check(
    noise_ss,
    noise_count,
    projections,
    *,
    noise_std: float,
    alpha: float = 0.05,
    names: list[str] | None = None,
    cross=None,
    cross_counts=None,
) -> NoiseCheck:
    """Test the noise the hooks saw against the claimed std σC (see the module docstring).

    Args:
        noise_ss: (T, G) Σ z² per step and group over the coordinates no canary touches.
        noise_count: (G,) how many such coordinates each group has (per step).
        projections: (T, K) projections of the noise on fixed vectors with disjoint supports.
        noise_std: σC, the claimed std of the noise on the clipped sum.
        alpha: the level of the whole check; α/2 for the variance test (Bonferroni over groups inside)
            and α/2 for independence, split evenly between the tests across steps and across groups that
            run (all of α to the variance test when neither runs).
        cross, cross_counts: the cross-group summary (3, G, G) and the values per pair (G, G), all steps
            (:func:`cross_group_p_value`); None: that test is not run.
    """
    ss = np.asarray(noise_ss, dtype=np.float64)
    counts = np.asarray(noise_count, dtype=np.int64)
    if ss.ndim != 2 or counts.shape != (ss.shape[1],):
        raise InputError(f"noise_ss must be (T, G) and noise_count (G,), got {ss.shape} and {counts.shape}")
    if not np.all(np.isfinite(ss)) or np.any(ss < 0):
        raise InputError("noise sums of squares must be finite and non-negative")
    std = check_positive(noise_std=noise_std)
    alpha = check_in_interval(0.0, 1.0, alpha=alpha)
    T = ss.shape[0]
    p_indep = independence_p_value(projections)
    crossed = None if cross is None or cross_counts is None else cross_group_p_value(cross, cross_counts)
    p_cross = None if crossed is None else crossed[0]
    n_indep = (p_indep is not None) + (p_cross is not None)
    a_var = alpha / 2.0 if n_indep else alpha
    a_ind = alpha / 2.0 / n_indep if n_indep else None  # Bonferroni between the two independence tests
    live = [g for g in range(ss.shape[1]) if counts[g] > 0]
    if not live or T == 0:
        raise InputError("the noise check needs at least one step and one coordinate without a canary")
    a_group = a_var / len(live)  # Bonferroni over the groups
    names = names or [f"group {g}" for g in range(ss.shape[1])]
    groups = []
    for g in live:
        dof = int(T * counts[g])
        S = float(ss[:, g].sum())
        # numpy's pairwise sum of T non-negative terms is within (log2 T + 4) 2^-52 of exact, relative (Higham 2002,
        # §4.2), and each step's Σz² (the hooks' float64 z @ z over counts[g] coordinates) within (counts[g] + 1) 2^-52
        # (Higham 2002, §3.1; a BLAS dot lost 154 ulps of a 1e4-term sum in the test). Both the p-value and the std's
        # upper bound grow with S, so both take S raised by 8 of the first units and 2 of the second.
        S_up = S * (1.0 + (8.0 * (math.log2(T) + 4.0) + 2.0 * (float(counts[g]) + 1.0)) * 2.0**-52)
        p = variance_p_value(S_up, dof, std)
        ratio = math.sqrt(S / dof) / std  # the estimate, to nearest
        # χ² upper confidence bound on s at level a_group; the quotient, the root and the division by σC (≤ 1.5 ulps)
        # raised by 4 ulps.
        upper = math.sqrt(S_up / _chi2_lower_quantile(a_group, dof)) / std * (1.0 + 4.0 * 2.0**-52)
        groups.append(GroupVariance(names[g], dof, ratio, upper, p, resolvable_noise_ratio(dof, a_group)))
    p_var = min(1.0, min(g.p_value for g in groups) * len(groups))
    steps_dependent = p_indep is not None and p_indep <= a_ind
    groups_dependent = p_cross is not None and p_cross <= a_ind
    violation = p_var <= a_var or steps_dependent or groups_dependent
    notes = [
        "assumes, as the claim does, independent Gaussian noise N(0, sigma^2 C^2) on every coordinate of the "
        "clipped sum at every step; a rejection refutes that claim (formal at the stated level)",
    ]
    if p_indep is None:
        notes.append("independence across steps not tested (fewer than 3 steps, or no projection recorded)")
    bad = [g.name for g in groups if g.p_value <= a_group]
    if bad:
        notes.append(f"too little noise in: {', '.join(bad)}")
    if steps_dependent:
        notes.append(
            "the noise is not independent across steps (the same draw reused, or a persistent component: anything "
            "added between inject and observe, e.g. weight decay, is read as noise)"
        )
    if groups_dependent:
        a, b = (names[int(i)] for i in crossed[1].split(" / "))
        notes.append(
            f"the noise is not independent across parameter groups ({a} and {b}: the same draws on both, e.g. one "
            "PRNG key for every leaf)"
        )
    details = {"steps": T, "alpha_variance": a_var, "alpha_per_group": a_group,
               "alpha_independence": a_ind if p_indep is not None else None,
               "alpha_cross_group": a_ind if p_cross is not None else None}  # fmt: skip
    verdict = "violation" if violation else "consistent"
    return NoiseCheck(std, alpha, tuple(groups), p_var, p_indep, verdict, tuple(notes), details, p_cross)
