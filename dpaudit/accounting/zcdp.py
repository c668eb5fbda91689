"""Zero-concentrated differential privacy (rho-zCDP) accountant and conversions.

rho-zCDP: D_alpha(M(D) || M(D')) <= rho * alpha for every alpha > 1 (Bun & Steinke 2016,
arXiv:1605.02065, Def. 1.1). Composition adds rho (ibid., Lemma 1.7; seed slides "Lemma 3.5").
"""

from __future__ import annotations

import math

from scipy import optimize

from dpaudit.accounting.base import Accountant, replace_factor, unsupported
from dpaudit.events import (
    ZCDP,
    EpsilonDelta,
    Event,
    Gaussian,
    GNMax,
    Laplace,
    LNMax,
    PoissonSampled,
    RandomizedResponse,
)
from dpaudit.validation import check_in_interval, check_non_negative


def zcdp_rho_gaussian(noise_multiplier: float, sensitivity: float = 1.0) -> float:
    """rho = Delta^2 / (2 sigma^2) for the Gaussian mechanism.

    Formal guarantee (Bun & Steinke 2016, arXiv:1605.02065, Prop. 1.6; seed slides "Lemma 3.6").
    """
    sigma = check_non_negative(noise_multiplier=noise_multiplier)
    if sigma == 0.0:
        return math.inf
    ratio = sensitivity / sigma  # float multiplication overflows to inf (never raises)
    return 0.5 * ratio * ratio


def zcdp_rho_pure(epsilon: float) -> float:
    """rho = epsilon^2 / 2 for an epsilon-DP mechanism.

    Formal guarantee (Bun & Steinke 2016, arXiv:1605.02065, Prop. 1.4; seed slides "Lemma 3.7").
    """
    eps = check_non_negative(epsilon=epsilon)
    return 0.5 * eps * eps


def zcdp_epsilon_simple(rho: float, delta: float) -> float:
    """epsilon = rho + 2 sqrt(rho log(1/delta)): the textbook zCDP -> (epsilon, delta) conversion.

    Formal guarantee but loose (Bun & Steinke 2016, arXiv:1605.02065, Prop. 1.3; seed slides,
    Eq. (5)). Kept for teaching and comparison; :func:`zcdp_epsilon` is tighter.
    """
    rho = check_non_negative(rho=rho)
    delta = check_in_interval(0.0, 1.0, delta=delta)
    if math.isinf(rho):
        return math.inf
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _eps_at_order(rho: float, delta: float, alpha: float) -> float:
    # Canonne, Kamath & Steinke 2020 (arXiv:2004.00010), Prop. 12 applied to the RDP curve
    # r(alpha) = rho alpha (their Cor. 13):
    #   eps = alpha rho + log((alpha - 1)/alpha) - (log delta + log alpha)/(alpha - 1).
    return alpha * rho + math.log1p(-1.0 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1.0)


def zcdp_epsilon(rho: float, delta: float) -> float:
    """Tight-ish epsilon(delta) for rho-zCDP (Canonne, Kamath & Steinke 2020, arXiv:2004.00010, Cor. 13).

    Formal guarantee: the bound holds at *every* order alpha > 1, so any alpha the optimiser
    returns gives a valid epsilon; the optimiser only affects tightness. The result is never
    larger than :func:`zcdp_epsilon_simple`.
    """
    rho = check_non_negative(rho=rho)
    delta = check_in_interval(0.0, 1.0, delta=delta)
    if rho == 0.0:
        return 0.0
    if math.isinf(rho):
        return math.inf
    # The unconstrained optimum of the simple bound, alpha ~ 1 + sqrt(log(1/delta)/rho), brackets
    # the optimum; search log(alpha - 1) on a wide interval.
    res = optimize.minimize_scalar(
        lambda t: _eps_at_order(rho, delta, 1.0 + math.exp(t)),
        bounds=(-20.0, 20.0),
        method="bounded",
        options={"xatol": 1e-10},
    )
    best = _eps_at_order(rho, delta, 1.0 + math.exp(float(res.x)))
    best = min(best, zcdp_epsilon_simple(rho, delta))
    return max(0.0, best)


def zcdp_delta(rho: float, epsilon: float) -> float:
    """delta(epsilon) for rho-zCDP (Canonne, Kamath & Steinke 2020, arXiv:2004.00010, Cor. 13).

    delta = min over alpha > 1 of exp((alpha - 1)(alpha rho - eps)) (1 - 1/alpha)^alpha / (alpha - 1),
    evaluated in log space. Formal guarantee at every alpha, so the optimiser affects tightness only.
    """
    rho = check_non_negative(rho=rho)
    eps = check_non_negative(epsilon=epsilon)
    if rho == 0.0:
        return 0.0
    if math.isinf(rho):
        return 1.0

    def log_delta(t: float) -> float:
        a = 1.0 + math.exp(t)
        return (a - 1.0) * (a * rho - eps) + a * math.log1p(-1.0 / a) - math.log(a - 1.0)

    res = optimize.minimize_scalar(log_delta, bounds=(-20.0, 20.0), method="bounded", options={"xatol": 1e-10})
    return float(min(1.0, math.exp(min(0.0, log_delta(float(res.x))))))


class ZcdpAccountant(Accountant):
    """rho-zCDP accountant: Gaussian, GNMax, ZCDP, and pure-DP leaves (Laplace, LNMax, randomized
    response, EpsilonDelta with delta = 0). Subsampling is not supported (zCDP is not amplified by
    subsampling in a usable closed form); use the rdp or pld accountants for DP-SGD."""

    name = "zcdp"

    def __init__(self, *, neighbouring: str = "add_remove") -> None:
        super().__init__(neighbouring=neighbouring)
        self.rho = 0.0
        self._empty = True

    def _leaf(self, event: Event) -> float:
        sens = replace_factor(self.neighbouring)
        if isinstance(event, Gaussian):
            return zcdp_rho_gaussian(event.noise_multiplier, sens)
        if isinstance(event, GNMax):
            # One changed teacher vote moves the histogram by sqrt(2) in L2 (Papernot et al. 2018,
            # arXiv:1802.08908, Prop. 8 gives the same as RDP alpha / sigma^2).
            return zcdp_rho_gaussian(event.sigma, math.sqrt(2.0))
        if isinstance(event, ZCDP):
            return event.rho
        if isinstance(event, Laplace):
            b = event.noise_multiplier
            return math.inf if b == 0.0 else zcdp_rho_pure(sens / b)
        if isinstance(event, LNMax):
            b = event.noise_scale
            return math.inf if b == 0.0 else zcdp_rho_pure(2.0 / b)
        if isinstance(event, EpsilonDelta):
            if event.delta > 0.0:
                raise unsupported(self.name, event, "(epsilon, delta)-DP with delta > 0 is not zCDP; use pld")
            return zcdp_rho_pure(event.epsilon)
        if isinstance(event, RandomizedResponse):
            if self.neighbouring != "replace_one":
                raise unsupported(self.name, event, "randomized response is accounted with neighbouring='replace_one'")
            p, k = event.noise_parameter, event.num_buckets
            if k == 1 or p == 1.0:
                return 0.0
            if p == 0.0:
                return math.inf
            return zcdp_rho_pure(math.log(k / p - k + 1.0))  # max privacy loss of k-ary RR
        if isinstance(event, PoissonSampled) and event.sample_rate == 1.0:
            # Sampling rate 1 keeps every record: the inner mechanism on the whole dataset, with its own rho.
            return self._leaf(event.event)
        raise unsupported(self.name, event, "no zCDP bound for this mechanism (subsampling is not supported)")

    def _accumulate(self, rep: float, count: int) -> None:
        self.rho = self.rho + count * rep
        self._empty = False

    def _is_empty(self) -> bool:
        return self._empty

    def _epsilon(self, delta: float) -> float:
        if delta == 0.0:
            return 0.0 if self.rho == 0.0 else math.inf
        return zcdp_epsilon(self.rho, delta)

    def _delta(self, epsilon: float) -> float:
        return zcdp_delta(self.rho, epsilon)
