"""Gaussian differential privacy (μ-GDP): conversions to (ε, δ), tradeoff curves, accountant.

Reference: Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022 (arXiv:1905.02383).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
from scipy import optimize, special

from dpaudit.accounting.base import Accountant, effective_gaussian_noise_multiplier, replace_factor, unsupported
from dpaudit.errors import InputError
from dpaudit.events import Event, Gaussian, GNMax, JLGaussian, PoissonSampled
from dpaudit.validation import check_in_interval, check_non_negative, check_positive_int


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of a μ-GDP mechanism, to a few ulps and never below the exact value.

    Dong, Roth & Su 2022, Corollary 2.13:
        δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).
    The two terms nearly cancel when μ is small or ε/μ large (the difference of two floats lost up to 2.6e-8
    relative at μ = 1e-6, covered by a margin as large). Here, with x = ε/μ, h = μ/2 and the Mills ratio
    m(z) = Φ(−z)/φ(z), the identity e^ε φ(x + h) = φ(x − h) gives (:func:`_gdp_delta_nearest`)
        δ(ε) = φ(x − h) [m(x − h) − m(x + h)],
    and the bracket is summed without cancellation. The result is that value rounded up by
    :data:`_GDP_DELTA_RTOL` (it is at most that far above the 50-digit value, never below; tests/accounting/
    test_conversions.py). At ε = 0, δ = Φ(μ/2) − Φ(−μ/2) = erf(μ/(2√2)) (scipy's erf, same margin). A δ below
    the smallest float (e^-2e8 at μ = 1e-4, ε = 2) rounds to 0, which only the inverse at δ = 0 (ε = ∞) could see.
    """
    value, exact = _gdp_delta_value(check_non_negative(mu=mu), epsilon)
    if exact or value == 0.0:
        return value
    return min(1.0, value * (1.0 + _GDP_DELTA_RTOL) + _SMALLEST_SUBNORMAL)


def _gdp_delta_value(mu: float, epsilon: float) -> tuple[float, bool]:
    """δ(ε) of μ-GDP to a few ulps (not rounded either way; :data:`_GDP_DELTA_RTOL` covers it), and whether it is
    exact (μ = 0, μ = ∞, ε = ∞)."""
    if mu == 0.0:
        return 0.0, True
    if math.isinf(mu):
        return 1.0, True
    if math.isinf(epsilon):
        return 0.0, True
    if epsilon == 0.0:
        return float(special.erf(mu / (2.0 * math.sqrt(2.0)))), False
    return _gdp_delta_nearest(mu, epsilon), False


def _gdp_delta_lower(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP rounded down: never above the exact value (the mirror of :func:`gdp_delta`'s margin)."""
    value, exact = _gdp_delta_value(mu, epsilon)
    return value if exact else max(0.0, value * (1.0 - _GDP_DELTA_RTOL) - _SMALLEST_SUBNORMAL)


# Relative error allowed for _gdp_delta_nearest and scipy's erf, added to the result so that gdp_delta is an upper
# bound: 16 ulps, over five times the largest error measured (2.9 ulps) against 60-digit mpmath at 619 (μ, ε), μ from
# 1e-8 to 50, ε from 1e-12 to 100, δ down to 1e-300 (benchmarks/RESULTS.md, "Bug hunt: the left list's numeric items").
_GDP_DELTA_RTOL = 16 * 2.0**-52
_SMALLEST_SUBNORMAL = 5e-324
_SQRT_HALF_PI = math.sqrt(math.pi / 2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _two_sum(a: float, b: float) -> tuple[float, float]:
    """a + b = s + e exactly (Knuth's TwoSum)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _two_product(a: float, b: float) -> tuple[float, float]:
    """a b = p + e exactly (Dekker's product with Veltkamp's split; |a|, |b| < 1e150)."""
    p = a * b
    c = 134217729.0 * a  # 2^27 + 1
    a_hi = c - (c - a)
    a_lo = a - a_hi
    c = 134217729.0 * b
    b_hi = c - (c - b)
    b_lo = b - b_hi
    return p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def _mills(z: float) -> float:
    """Mills ratio m(z) = Φ(−z)/φ(z) = √(π/2) erfcx(z/√2), to a few ulps (scipy's erfcx)."""
    return _SQRT_HALF_PI * float(special.erfcx(z / math.sqrt(2.0)))


def _mills_difference_series(x: float, h: float) -> float:
    """m(x − h) − m(x + h) for x ≥ 0, h > 0, as a sum of positive terms (no cancellation).

    m(z) = ∫_0^∞ e^(−zt − t²/2) dt, so m(x − h) − m(x + h) = 2 ∫_0^∞ e^(−xt − t²/2) sinh(ht) dt
        = 2 Σ_j h^(2j+1)/(2j+1)! J_(2j+1)(x),   J_k(x) = ∫_0^∞ t^k e^(−xt − t²/2) dt = (−1)^k m^(k)(x) > 0,
    with J_0 = m, J_1 = 1 − x J_0 and J_(k+1) = k J_(k−1) − x J_k (integration by parts). As J_(k+2) ≥ 0,
    J_(k+1) ≤ (k+1) J_k / x, and J_(k+2) ≤ (k+1) J_k: term j+1 is at most h² min(1/(2j+3), 1/x²) times term j,
    which fixes the number of terms (h ≤ 1 or x ≥ 2h: at most ~30). The J_k come from
    that recurrence forward for x ≤ 1 (it loses at most ~3 bits there) and, for x > 1, from the ratios
    J_k/J_(k−1) = k/(x + J_(k+1)/J_k) run backward (all terms positive; the continued fraction of the Mills
    ratio), started far enough out that the start's error has shrunk below 2^-60 (by 1 − x/√k per step).
    """
    inv_x2 = 1.0 / (x * x) if x > 1e-150 else math.inf
    n_terms, bound = 1, 1.0
    while bound > 2.0**-60:
        bound *= h * h * min(1.0 / (2 * n_terms + 1), inv_x2)
        n_terms += 1
    k_max = 2 * n_terms - 1
    j = [0.0] * (k_max + 1)
    j[0] = _mills(x)
    if x <= 1.0:
        j[1] = 1.0 - x * j[0]
        for k in range(1, k_max):
            j[k + 1] = k * j[k - 1] - x * j[k]
    else:
        start = math.ceil((math.sqrt(k_max) + 23.0 / x) ** 2) + 60
        ratio = 0.0
        for k in range(start, k_max, -1):
            ratio = k / (x + ratio)
        ratios = [0.0] * (k_max + 1)
        for k in range(k_max, 0, -1):
            ratio = k / (x + ratio)
            ratios[k] = ratio
        for k in range(1, k_max + 1):
            j[k] = j[k - 1] * ratios[k]
    total, coef = 0.0, h
    for i in range(n_terms):
        k = 2 * i + 1
        if i:
            coef *= h * h / ((k - 1) * k)
        total += coef * j[k]
    return 2.0 * total


def _gdp_delta_nearest(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP for 0 < μ < ∞, 0 < ε < ∞, to a few ulps (see :func:`gdp_delta`; not rounded up).

    x = ε/μ and z = x − h are carried as double-doubles and φ(z) = e^(−z²/2)/√(2π) is evaluated from the exact
    square, so that the rounding of ε/μ is not amplified by z² (up to 1500 at δ ~ 1e-300). Then
      * z ≥ −1: δ = φ(z) D, with D = m(z) − m(z + 2h) from the positive series (:func:`_mills_difference_series`)
        when h ≤ 1 or x ≥ 2h (where the two can nearly cancel), directly otherwise (h > 1 and z < h: the points
        are more than 2 apart and z + 2h > 3z, so m(z + 2h) is well below m(z), m(z) ~ 1/z for large z);
      * z < −1 (h > 1 + x): δ = Φ(−z) − φ(z) m(z + 2h), whose second term is below 0.6 of the first (m(z + 2h) ≤
        m(2) and Φ(−z) ≥ Φ(1)), so the difference loses at most a bit or two.
    """
    h = 0.5 * mu
    x_hi = epsilon / mu
    if x_hi - h > 41.0:  # δ < φ(40)/40 < 1e-349: below the smallest float
        return 0.0
    x_lo = _two_product(x_hi, mu)
    x_lo = ((epsilon - x_lo[0]) - x_lo[1]) / mu  # ε/μ = x_hi + x_lo to ~2^-104
    z_hi, z_err = _two_sum(x_hi, -h)
    z_lo = z_err + x_lo
    z_hi, z_lo = _two_sum(z_hi, z_lo)
    if z_hi > 40.0:
        return 0.0
    if abs(z_hi) > 40.0:  # φ(z) < e^-800: 0 in float64 (and z² might overflow the split below)
        phi = 0.0
    else:
        sq_hi, sq_lo = _two_product(z_hi, z_hi)
        sq_lo += 2.0 * z_hi * z_lo
        phi = _INV_SQRT_2PI * math.exp(-0.5 * sq_hi) * math.exp(-0.5 * sq_lo)  # exp(-sq_hi/2): argument exact
    if z_hi >= -1.0:
        if h <= 1.0 or x_hi >= 2.0 * h:
            diff = _mills_difference_series(x_hi, h)
        else:
            diff = _mills(z_hi) - _mills(x_hi + h)
        return phi * diff
    return float(special.ndtr(-z_hi)) - phi * _mills(x_hi + h)


def _gdp_epsilon_root(delta_at: Callable[[float], float], mu: float, delta: float) -> float | None:
    """Brent's root of delta_at(ε) = delta for μ-GDP's decreasing δ(ε) (evaluated up or down by the caller), or
    None when the bracket overflows float64 (μ > 1.3e154). The caller then steps the root to its safe side."""
    # At ε/μ − μ/2 = 41, δ < φ(40)/40 < 1e-349 rounds to 0 (_gdp_delta_nearest): below every delta > 0.
    hi = mu * (41.5 + 0.5 * mu)
    while delta_at(hi) >= delta and not math.isinf(hi):  # mu > 1e15: 41.5 mu is lost in the rounding of hi
        hi *= 2.0
    if math.isinf(hi):
        return None
    # A relative tolerance only, on a bracket of the root's scale: an absolute 1e-12 (as this once had) returned
    # 9e-13 where the root is 6e-300 (mu = 1e-300, delta = 1e-310).
    return float(optimize.brentq(lambda e: delta_at(e) - delta, 0.0, hi, xtol=5e-324, rtol=1e-14, maxiter=500))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ delta for a μ-GDP mechanism (inverts Corollary 2.13).

    δ(ε) is strictly decreasing in ε, so the root is bracketed and found with Brent's method;
    the result is nudged upward so that gdp_delta(mu, result) <= delta always holds.
    """
    mu = check_non_negative(mu=mu)
    delta = check_in_interval(0.0, 1.0, lo_open=False, delta=delta)
    if mu == 0.0:
        return 0.0
    if math.isinf(mu) or delta == 0.0:
        return math.inf
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    eps = _gdp_epsilon_root(lambda e: gdp_delta(mu, e), mu, delta)
    if eps is None:  # mu > 1.3e154: epsilon >= mu^2/2 - mu sqrt(2 log(1/delta)) is beyond float64 too
        return math.inf
    # Never under-report: step up (by a doubling step, so that a root far below brentq's point is left quickly)
    # until the guarantee provably holds at the returned value.
    step = 1e-14 * eps
    while gdp_delta(mu, eps) > delta:
        eps = float(np.nextafter(eps + step, math.inf))
        step = 2.0 * step + 5e-324
    return float(eps)


def gdp_epsilon_lower(mu: float, delta: float) -> float:
    """ε(δ) of a μ-GDP mechanism rounded DOWN: a value never above the exact ε(δ) (Dong, Roth & Su 2022, Cor. 2.13).

    For empirical lower bounds (an audit's μ lower bound turned into ε, a design's most certifiable ε): there
    :func:`gdp_epsilon`, which rounds up for claims, would report a bound up to ~1e-14 relative above the exact
    value, and a claim between the two would read as exceeded. The caller passes μ rounded down. The returned ε
    has δ(ε) ≥ delta by the lower evaluation :func:`_gdp_delta_lower`, so the exact ε(δ) (δ decreasing in ε) is at
    least ε.
    """
    mu = check_non_negative(mu=mu)
    delta = check_in_interval(0.0, 1.0, lo_open=False, delta=delta)
    if mu == 0.0:
        return 0.0
    if math.isinf(mu) or delta == 0.0:
        return math.inf
    if _gdp_delta_lower(mu, 0.0) < delta:
        return 0.0  # the exact ε(δ) is ≥ 0; nothing larger is certain
    eps = _gdp_epsilon_root(lambda e: _gdp_delta_lower(mu, e), mu, delta)
    if eps is None:  # the root is beyond float64: the largest float is below it
        return float(np.nextafter(math.inf, 0.0))
    step = 1e-14 * eps
    while eps > 0.0 and _gdp_delta_lower(mu, eps) < delta:  # step down until the guarantee provably holds
        eps = max(0.0, float(np.nextafter(eps - step, 0.0)))
        step = 2.0 * step + 5e-324
    return float(eps)


def gdp_mu_from_epsilon_delta(epsilon: float, delta: float) -> float:
    """Smallest μ whose μ-GDP curve gives δ(ε) ≥ delta, i.e. the μ implied by an (ε, δ) point.

    Used by audits to turn an empirical (ε, δ) into μ; δ(ε; μ) increases in μ (Dong, Roth & Su
    2022, Corollary 2.13), so this is a bracketed root.
    """
    epsilon = check_non_negative(epsilon=epsilon)
    delta = check_in_interval(0.0, 1.0, delta=delta)
    if math.isinf(epsilon):
        return math.inf
    # δ(ε; μ) runs from 0 (μ = 0) to 1 (μ = ∞), so both ends are found by doubling and halving, without a
    # fixed cap: a finite ε has a finite μ (about sqrt(2ε) for large ε), and a tiny δ a tiny μ (at ε = 0,
    # δ = 2Φ(μ/2) - 1 ~ μ/sqrt(2π)).
    hi = 1.0
    while gdp_delta(hi, epsilon) < delta:
        hi *= 2.0
    lo = hi
    while lo > 0.0 and gdp_delta(lo, epsilon) >= delta:
        lo /= 2.0
    return float(
        optimize.brentq(lambda m: gdp_delta(m, epsilon) - delta, lo, hi, xtol=max(1e-14 * lo, 1e-300), maxiter=500)
    )


# --------------------------------------------------------------------------------------------
# Tradeoff curves (f-DP), used by plots and audits
# --------------------------------------------------------------------------------------------


def gdp_tradeoff(mu: float, alpha):
    """Type-II error beta = G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu) of the best test at type-I error alpha.

    Dong, Roth & Su 2022, Def. 2.4 (G_mu = T(N(0,1), N(mu,1))). ``alpha`` may be an array; the
    result has its shape. Computed as Phi(-(Phi^-1(alpha) + mu)) with scipy's ndtri/ndtr, which
    is exact at alpha in {0, 1}.
    """
    mu = check_non_negative(mu=mu)
    a = np.asarray(alpha, dtype=np.float64)
    if np.any((a < 0.0) | (a > 1.0) | np.isnan(a)):
        raise InputError("expected alpha in [0, 1]")
    if math.isinf(mu):
        out = np.zeros_like(a)
    else:
        out = special.ndtr(-(special.ndtri(a) + mu))
    return out if out.ndim else float(out)


def epsilon_delta_tradeoff(epsilon: float, delta: float, alpha):
    """Tradeoff curve of (epsilon, delta)-DP: f(alpha) = max{0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha)}.

    Dong, Roth & Su 2022 (arXiv:1905.02383), Prop. 2.5. ``alpha`` may be an array.
    """
    eps = check_non_negative(epsilon=epsilon)
    dlt = check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=delta)
    a = np.asarray(alpha, dtype=np.float64)
    if np.any((a < 0.0) | (a > 1.0) | np.isnan(a)):
        raise InputError("expected alpha in [0, 1]")
    # e^eps alpha as exp(eps + log alpha) beyond eps = 700 (e^eps overflows past 709.78): capping e^eps at e^700
    # (as this once did) put f(1e-310) at 0.999999 for eps = 1000, whose exact value is e^-1000 (1 - 1e-310): a
    # curve above the guarantee's, claiming more privacy.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        grow = math.exp(eps) * a if eps <= 700.0 else np.exp(eps + np.log(np.where(a > 0.0, a, 1.0)))
        first = np.where(a > 0.0, 1.0 - dlt - grow, 1.0 - dlt)
    second = math.exp(-eps) * (1.0 - dlt - a)
    out = np.maximum(0.0, np.maximum(first, second))
    return out if out.ndim else float(out)


def gdp_mu_poisson_clt(sample_rate: float, noise_multiplier: float, steps: int) -> float:
    """Approximate mu of T Poisson-subsampled Gaussian steps by the central limit theorem.

    Approximate (NOT a formal guarantee; can under-report epsilon, badly so for small T or large q):
        mu = q sqrt(T (e^(1/sigma^2) - 1))
    (Bu, Dong, Long & Su 2020, arXiv:1911.11607, Sec. 3 "mu_CLT"; seed paper Prop. B.3 with
    chi^2(G_(1/sigma)) = e^(1/sigma^2) - 1). e^(1/sigma^2) - 1 is computed with expm1.
    """
    q = check_in_interval(0.0, 1.0, hi_open=False, sample_rate=sample_rate)
    sigma = check_non_negative(noise_multiplier=noise_multiplier)
    steps = check_positive_int(steps=steps)
    if sigma == 0.0:
        return math.inf
    inv = 1.0 / sigma
    x = inv * inv
    if x > 700.0:
        return math.inf
    return q * math.sqrt(steps * math.expm1(x))


# --------------------------------------------------------------------------------------------
# Accountant
# --------------------------------------------------------------------------------------------

CLT_WARNING = (
    "GDP accounting of Poisson-subsampled Gaussians uses the central limit theorem (Bu et al. 2020): "
    "it is an approximation and can under-report epsilon; use the rdp or pld accountant for a formal guarantee"
)


class GdpAccountant(Accountant):
    """mu-GDP accountant: composition adds mu^2 (Dong, Roth & Su 2022, Cor. 3.3).

    Formal for Gaussian and GNMax leaves (Gaussian(sigma) is exactly (Delta/sigma)-GDP, ibid.
    Thm. 2.7). Approximate for PoissonSampled(Gaussian) (CLT, emits a ``UserWarning`` each time
    one is composed). JLGaussian is rejected: its chi^2(f) is infinite so the CLT does not apply
    (seed paper, Prop. B.5).
    """

    name = "gdp"

    def __init__(self, *, neighbouring: str = "add_remove") -> None:
        super().__init__(neighbouring=neighbouring)
        self.mu_squared = 0.0
        self._empty = True
        self._roundings = 0  # float operations that rounded into mu_squared (see _mu_up)

    @property
    def mu(self) -> float:
        """Composed mu (sqrt of the sum of squared per-step mu)."""
        return math.sqrt(self.mu_squared)

    def _leaf(self, event: Event) -> tuple[float, bool]:
        sens = replace_factor(self.neighbouring)
        if isinstance(event, Gaussian):
            s = event.noise_multiplier
            return (math.inf if s == 0.0 else (sens / s) * (sens / s)), False
        if isinstance(event, GNMax):
            s = event.sigma
            return (math.inf if s == 0.0 else 2.0 * (1.0 / s) * (1.0 / s)), False
        if isinstance(event, PoissonSampled):
            if self.neighbouring != "add_remove":
                raise unsupported(self.name, event, "Poisson subsampling is accounted with neighbouring='add_remove'")
            if isinstance(event.event, JLGaussian):
                raise unsupported(
                    self.name, event.event, "the GDP central limit theorem does not apply to DP-SGD-JL; use pld"
                )
            sigma = effective_gaussian_noise_multiplier(event.event)
            if isinstance(sigma, Event):
                raise unsupported(self.name, sigma, "only Gaussian mechanisms are supported inside subsampling")
            if event.sample_rate == 1.0:  # no subsampling: exactly (1/sigma)-GDP, no CLT needed
                return (math.inf if sigma == 0.0 else (1.0 / sigma) * (1.0 / sigma)), False
            # Per-step contribution to mu^2 under the CLT: q^2 (e^(1/sigma^2) - 1).
            mu1 = gdp_mu_poisson_clt(event.sample_rate, sigma, 1)
            return mu1 * mu1, True
        if isinstance(event, JLGaussian):
            raise unsupported(
                self.name, event, "DP-SGD-JL is not mu-GDP for any finite mu (seed paper Prop. B.5); use pld"
            )
        raise unsupported(self.name, event, "no GDP bound for this mechanism")

    def _accumulate(self, rep: tuple[float, bool], count: int) -> None:
        mu_sq, approximate = rep
        if approximate:
            warnings.warn(CLT_WARNING, UserWarning, stacklevel=4)
            self.approximate = True
        self.mu_squared = self.mu_squared + count * mu_sq
        self._roundings += 4  # the leaf's (sens/s)^2 (two), count * mu_sq, the sum
        self._empty = False

    def _is_empty(self) -> bool:
        return self._empty

    def _mu_up(self) -> float:
        """mu rounded up: mu_squared carries one rounding (half an ulp, relative) per float operation that built it,
        and delta(eps) grows with mu as steeply as (eps/mu)^2 in relative terms (up to ~1600x at delta ~ 1e-300),
        so the rounding of mu is covered here, not by gdp_delta's margin (which covers its own evaluation)."""
        if self.mu_squared == 0.0 or math.isinf(self.mu_squared):
            return self.mu
        return math.sqrt(self.mu_squared * (1.0 + (self._roundings + 1) * 2.0**-52)) * (1.0 + 2.0**-52)

    def _epsilon(self, delta: float) -> float:
        if delta == 0.0:
            return 0.0 if self.mu_squared == 0.0 else math.inf
        return gdp_epsilon(self._mu_up(), delta)

    def _delta(self, epsilon: float) -> float:
        return gdp_delta(self._mu_up(), epsilon)
