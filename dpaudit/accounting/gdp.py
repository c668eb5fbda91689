"""Gaussian differential privacy (μ-GDP): conversions to (ε, δ), tradeoff curves, accountant.

Reference: Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022 (arXiv:1905.02383).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import optimize, special

from dpaudit.accounting.base import Accountant, effective_gaussian_noise_multiplier, replace_factor, unsupported
from dpaudit.errors import InputError
from dpaudit.events import Event, Gaussian, GNMax, JLGaussian, PoissonSampled
from dpaudit.validation import check_in_interval, check_non_negative, check_positive_int


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of a μ-GDP mechanism.

    Dong, Roth & Su 2022, Corollary 2.13:
        δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).
    The second term is evaluated in log space (log Φ via scipy's log_ndtr) so that large ε
    does not overflow e^ε. An upper bound on the float64 value, never below it by rounding: the two
    terms nearly cancel when μ is small (δ = e^a − e^b with b − a → 0), where the rounding of a and b
    (a few ulps of each, scipy's log_ndtr) is amplified by (|a| + |b|)/|b − a| in the difference; that
    relative error is added as a margin (it was 2.8e-8 below the 50-digit value at μ = 1e-8, ε = 1e-9,
    and 2.9e-11 at ε = 0, δ = 1e-7, where analytic_gaussian_sigma returned a σ too small by as much).
    At ε = 0, δ = Φ(μ/2) − Φ(−μ/2) = erf(μ/(2√2)) exactly, computed without the difference.
    """
    mu = check_non_negative(mu=mu)
    if mu == 0.0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    if math.isinf(epsilon):
        return 0.0
    if epsilon == 0.0:
        return min(1.0, float(special.erf(mu / (2.0 * math.sqrt(2.0)))) * (1.0 + _ROUNDING_MARGIN))
    a = special.log_ndtr(-epsilon / mu + mu / 2.0)
    b = epsilon + special.log_ndtr(-epsilon / mu - mu / 2.0)
    if b >= a:  # only through rounding; the true difference is >= 0
        return 0.0
    # log(e^a - e^b) = a + log1p(-e^(b - a)); its relative error is that of b - a (amplified cancellation) plus a
    # few ulps of each step.
    amplification = (abs(a) + abs(b)) / (a - b)
    value = math.exp(a + math.log1p(-math.exp(b - a)))
    return float(min(1.0, max(0.0, value * (1.0 + _ROUNDING_MARGIN * (1.0 + amplification)))))


# Relative rounding allowed per float64 step in gdp_delta: 16 ulps (log_ndtr is accurate to a few; exp, log1p and
# the sums add one each), so that the margin is an upper bound on the rounding, with room.
_ROUNDING_MARGIN = 16 * 2.0**-52


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
    hi = max(1.0, mu * mu)
    if math.isinf(hi):  # mu > 1.3e154: epsilon >= mu^2/2 - mu sqrt(2 log(1/delta)) is beyond float64 too
        return math.inf
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    eps = optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12, rtol=1e-14)
    # Never under-report: step up until the guarantee provably holds at the returned value.
    while gdp_delta(mu, eps) > delta:
        eps = float(np.nextafter(eps, math.inf)) + 1e-12 * max(1.0, eps)
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
    with np.errstate(over="ignore", invalid="ignore"):
        first = np.where(a > 0.0, 1.0 - dlt - math.exp(min(eps, 700.0)) * a, 1.0 - dlt)
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
        self._empty = False

    def _is_empty(self) -> bool:
        return self._empty

    def _epsilon(self, delta: float) -> float:
        if delta == 0.0:
            return 0.0 if self.mu_squared == 0.0 else math.inf
        return gdp_epsilon(self.mu, delta)

    def _delta(self, epsilon: float) -> float:
        return gdp_delta(self.mu, epsilon)
