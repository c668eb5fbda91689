"""PATE's data-dependent privacy analysis and its smooth-sensitivity sanitiser (numpy/scipy only).

Data-dependent RDP (a function of the private vote histograms):

* GNMax: Papernot et al. 2018, "Scalable Private Learning with PATE" (arXiv:1802.08908), Prop. 7
  (q bound), Thm. 6 with Prop. 10 (RDP given q), Prop. 8 (data-independent alpha / sigma^2).
* Confident-GNMax's threshold check: the same Thm. 6 for a sensitivity-1 Gaussian (ibid. Sec. 4.2).
* LNMax: Papernot et al. 2017, "Semi-supervised Knowledge Transfer ..." (arXiv:1610.05755), Lemma 4
  (q bound for Laplace noisy max) and Thm. 3 (RDP of a pure-eps mechanism that is likely to output
  its mode), with the Bun & Steinke 2016 (arXiv:1605.02065, Prop. 1.4) bound eps^2 alpha / 2 and the
  pure-DP bound eps.

Because these values depend on the votes, publishing them leaks; Papernot et al. 2018 (Sec. 4.3 and
App. C) release them through smooth sensitivity (Nissim, Raskhodnikova & Smith 2007):

1. At a fixed Renyi order lambda, the total data-dependent RDP is eps_lambda(D) = sum over queries.
2. Its local sensitivity at distance d (d teachers' votes changed) is bounded per query: GNMax by
   App. C, Alg. 3 (Prop. 13) walked over histograms at distance d (Algs. 4-5); the threshold check by
   the largest change of its RDP when max_j n_j moves by one, within d of the current max.
3. The smooth sensitivity SS_beta(D) = max_d e^(-beta d) A(d), A(d) = sum over queries of the
   per-query bound at distance <= d (NRS07, Def. 2.1 and Lemma 2.3: beta-smooth upper bounds).
4. GNSS: eps_lambda(D) + SS_beta(D) sigma_s N(0, 1) is released; it is (lambda, c(beta, sigma_s,
   lambda))-RDP with c = lambda e^(2 beta) / sigma_s^2 + (-log(1 - 2 lambda beta)/2 + beta lambda)/(lambda - 1)
   for 1 < lambda < 1/(2 beta) (Papernot et al. 2018, App. C, Thm. 23).

The sanitiser's settings (lambda, beta, sigma_s, tau) are chosen by :func:`choose_sanitiser`, a public rule: the
expected claim minimised on a prior vote histogram built from public settings only (never the votes, whose use
would be an unaccounted release); settings a user fixes in advance replace the rule's.

The paper publishes the GNSS value itself; a value drawn around eps_lambda(D) is below it half of the
time. :func:`sanitised_claim` turns it into a claim that is not below eps_lambda(D) except with
probability delta/2 (our addition, stated where it is made): log SS_beta(D) has sensitivity beta
(beta-smoothness, NRS07 Def. 2.1), so it is released with a Gaussian mechanism first, and the GNSS
value is raised by a margin from that released bound. Every release is charged in the claim.

Sources of the reference values in the tests: the authors' code (tensorflow/privacy,
research/pate_2018, ``smooth_sensitivity_test.py``) published local-sensitivity arrays for fixed vote
histograms; this module is written from the paper and reproduces them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from dpaudit.errors import InputError
from dpaudit.validation import check_in_interval, check_positive

__all__ = [
    "SanitiserConfig",
    "choose_sanitiser",
    "expected_claim",
    "gnss_rdp",
    "local_sensitivity_gnmax",
    "local_sensitivity_threshold",
    "log_q_gnmax",
    "log_q_lnmax",
    "prior_histogram",
    "rdp_gnmax_data_dependent",
    "rdp_lnmax_data_dependent",
    "rdp_threshold_data_dependent",
    "sanitised_claim",
    "smooth_sensitivity",
]


# ----------------------------------------------------------------------------- per-query data-dependent RDP


def log1mexp(x: np.ndarray | float) -> np.ndarray:
    """log(1 - e^x) for x <= 0, accurate near 0 and for very negative x (Maechler 2012)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(x > -math.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def _hist(hist: np.ndarray) -> np.ndarray:
    h = np.asarray(hist, dtype=np.float64)
    if h.ndim == 1:
        h = h[None, :]
    if h.ndim != 2 or h.shape[1] < 2:
        raise InputError(f"expected a (queries, classes >= 2) vote histogram, got shape {h.shape}")
    return h


def log_q_gnmax(hist: np.ndarray, sigma: float) -> np.ndarray:
    """Upper bound on log Pr[GNMax(n) != argmax n] per row (Papernot et al. 2018, Prop. 7):
    q <= sum_{i != i*} Pr[n_i + N(0, s^2) >= n_i* + N(0, s^2)] = sum_{i != i*} (1/2) erfc((n_i* - n_i) / (2 s)),
    capped at 1 - 1/C (the paper's footnote: a useful bound must be below that). Log-space (logsf) so that
    consensus histograms give q far below float64's smallest normal number without underflow."""
    h = _hist(hist)
    top = h.argmax(1)
    gap = h[np.arange(len(h)), top][:, None] - h  # n_i* - n_i >= 0
    # Pr[N(0, 2 s^2) >= gap] as a log: the difference of two independent N(0, s^2) has variance 2 s^2.
    logp = stats.norm.logsf(gap, scale=math.sqrt(2.0) * sigma)
    logp[np.arange(len(h)), top] = -np.inf
    logq = special.logsumexp(logp, axis=1)
    return np.minimum(logq, math.log1p(-1.0 / h.shape[1]))


def log_q_lnmax(hist: np.ndarray, b: float) -> np.ndarray:
    """Upper bound on log Pr[LNMax(n) != argmax n] per row with Laplace(b) noise (Papernot et al. 2017,
    Lemma 4): Pr[n_i + Lap(b) >= n_i* + Lap(b)] = (2 + g/b) / 4 e^(-g/b), g = n_i* - n_i; union bound over
    i != i*, capped at 1 - 1/C."""
    h = _hist(hist)
    top = h.argmax(1)
    g = (h[np.arange(len(h)), top][:, None] - h) / b
    logp = np.log(2.0 + g) - math.log(4.0) - g
    logp[np.arange(len(h)), top] = -np.inf
    return np.minimum(special.logsumexp(logp, axis=1), math.log1p(-1.0 / h.shape[1]))


def rdp_gnmax_data_dependent(log_q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """Data-dependent RDP of one GNMax answer at orders ``orders`` given log q (an upper bound on
    Pr[output != i*] at the private dataset), never above the data-independent alpha / sigma^2.

    Papernot et al. 2018 (arXiv:1802.08908), Thm. 6 with Prop. 10: take mu2 = sigma sqrt(log(1/q)),
    mu1 = mu2 + 1, eps_i = mu_i / sigma^2. Where lambda <= mu1, mu2 > 1, q e^{eps2} < 1 and
    q <= e^{(mu2 - 1) eps2} / (mu1/(mu1 - 1) * mu2/(mu2 - 1))^{mu2},
        eps(lambda) <= 1/(lambda - 1) log((1 - q) A^{lambda - 1} + q B^{lambda - 1}),
        A = (1 - q) / (1 - (q e^{eps2})^{(mu2 - 1)/mu2}),  B = e^{eps1} / q^{1/(mu1 - 1)}.
    Everything is evaluated in log space (q may be 1e-300)."""
    orders = np.asarray(orders, dtype=np.float64)
    base = orders / sigma**2  # Prop. 8, data-independent
    logq = min(0.0, float(log_q))
    if math.isinf(logq):  # the output is certain: 0-RDP
        return np.zeros_like(orders)
    mu2 = sigma * math.sqrt(-logq)
    mu1 = mu2 + 1.0
    if mu2 <= 1.0:
        return base
    eps2 = mu2 / sigma**2
    log_cond = (mu2 - 1.0) * eps2 - mu2 * (math.log(mu1 / (mu1 - 1.0)) + math.log(mu2 / (mu2 - 1.0)))
    if not (logq <= log_cond and -logq > eps2):
        return base
    dd = _thm6(logq, sigma, orders)
    return np.where(orders <= mu1, np.minimum(base, dd), base)


def _thm6(logq: float | np.ndarray, sigma: float, orders: np.ndarray) -> np.ndarray:
    """The bound of Thm. 6 with Prop. 10's mu1, mu2 (no validity checks: the callers make them); elementwise in
    ``logq`` and ``orders`` (numpy broadcasting: one log q at many orders, or many at one)."""
    mu2 = sigma * np.sqrt(-np.asarray(logq, dtype=np.float64))
    mu1 = mu2 + 1.0
    eps1, eps2 = mu1 / sigma**2, mu2 / sigma**2
    log1q = log1mexp(logq)
    log_a = log1q - log1mexp((logq + eps2) * (1.0 - 1.0 / mu2))  # log A
    log_b = eps1 - logq / (mu1 - 1.0)  # log B
    lam1 = np.asarray(orders, dtype=np.float64) - 1.0
    return np.logaddexp(log1q + lam1 * log_a, logq + lam1 * log_b) / lam1


def rdp_threshold_data_dependent(max_count: float, threshold: float, sigma1: float, orders: np.ndarray) -> np.ndarray:
    """Data-dependent RDP of Confident-GNMax's threshold check on one query.

    The check releases one bit, 1[max_j n_j + N(0, sigma1^2) >= T]; it is (lambda, lambda / (2 sigma1^2))-RDP
    (sensitivity 1), i.e. the curve of GNMax with sigma = sqrt(2) sigma1, and the less likely of its two
    outcomes has probability q = min(p, 1 - p), p = Pr[N(0, sigma1^2) >= T - max n]; Thm. 6 applies with
    that q (Papernot et al. 2018, Sec. 4.2 and App. B; the authors' pate_2018 analysis does the same)."""
    logp = float(stats.norm.logsf(threshold - max_count, scale=sigma1))
    logq = min(logp, float(log1mexp(logp)))
    return rdp_gnmax_data_dependent(logq, math.sqrt(2.0) * sigma1, orders)


def rdp_lnmax_data_dependent(log_q: float, pure_eps: float, orders: np.ndarray) -> np.ndarray:
    """Data-dependent RDP of one LNMax answer, an eps-DP mechanism (eps = 2/b) whose output differs from
    the mode with probability at most q: the minimum of eps^2 lambda / 2 (Bun & Steinke 2016, Prop. 1.4),
    eps (pure DP) and, when q <= 1/(e^eps + 1), Papernot et al. 2017 (arXiv:1610.05755), Thm. 3:
        (1/(lambda - 1)) log((1 - q) ((1 - q)/(1 - e^eps q))^(lambda - 1) + q e^(eps (lambda - 1)))."""
    orders = np.asarray(orders, dtype=np.float64)
    out = np.minimum(0.5 * pure_eps**2 * orders, pure_eps)
    logq = min(0.0, float(log_q))
    if math.isinf(logq):
        return np.zeros_like(orders)
    if logq <= -math.log1p(math.exp(pure_eps)):
        log1q = float(log1mexp(logq))
        lam1 = orders - 1.0
        t1 = log1q + (log1q - float(log1mexp(pure_eps + logq))) * lam1
        t2 = logq + pure_eps * lam1
        out = np.minimum(out, np.logaddexp(t1, t2) / lam1)
    return out


# ----------------------------------------------------------------------------- GNMax: q0, q1, local sensitivity


def _rdp_di(sigma: float, order: float) -> float:
    return order / sigma**2  # Papernot et al. 2018, Prop. 8


def _valid(logq: float, sigma: float, order: float) -> bool:
    """Thm. 6's conditions at Prop. 10's mu1, mu2, and lambda <= mu1."""
    mu2 = sigma * math.sqrt(-logq)
    mu1 = mu2 + 1.0
    if mu1 < order or mu2 <= 1.0:
        return False
    eps2 = mu2 / sigma**2
    return logq <= (mu2 - 1.0) * eps2 - mu2 * math.log(mu1 / (mu1 - 1.0) * mu2 / (mu2 - 1.0))


@lru_cache(maxsize=256)
def log_q0(sigma: float, order: float) -> float:
    """log q0: below q0 the data-dependent bound of Thm. 6 is used, above it the data-independent one
    (Papernot et al. 2018, App. C: beta(q) is then non-decreasing, condition C5). The root in log q of
    Thm. 6 minus Prop. 8, bracketed below the natural upper bound min(-(1 + 1/s)^2, -((lambda - .99)/s)^2,
    -1/s^2), where Prop. 10's mu1 >= lambda and mu2 > 1 hold."""
    ub = min(-((1.0 + 1.0 / sigma) ** 2), -(((order - 0.99) / sigma) ** 2), -1.0 / sigma**2)

    def diff(logq: float) -> float:
        return float(_thm6(logq, sigma, np.array([order]))[0]) - _rdp_di(sigma, order)

    if diff(ub) < 0:
        return ub
    lb = 2.0 * ub
    while diff(lb) > 0:
        lb *= 1.5
        if lb < -1e6:
            raise InputError(f"no data-dependent regime for GNMax at sigma {sigma:g}, order {order:g}")
    root = float(optimize.brentq(diff, lb, ub, xtol=1e-12))
    if not _valid(root, sigma, order):  # pragma: no cover - the bracket keeps mu1 >= lambda
        raise InputError(f"Thm. 6 does not apply at q0 for sigma {sigma:g}, order {order:g}")
    return root


def _beta_gnmax(logq: float, sigma: float, order: float) -> float:
    """beta(q): Thm. 6 below q0, Prop. 8 above (the function whose sensitivity App. C bounds)."""
    if math.isinf(logq) and logq < 0:
        return 0.0
    if logq >= log_q0(sigma, order):
        return _rdp_di(sigma, order)
    return float(_thm6(logq, sigma, np.array([order]))[0])


def _log_bl(logq: float, sigma: float, m: int) -> float:
    """log of the smallest q at a histogram one vote away (App. C, Prop. 12):
    bl(q) = (m-1)/2 erfc(1/s + erfcinv(2q/(m-1))).

    In log space, through erfc(w) = 2 Phi(-w sqrt 2): with Phi(z) = q/(m-1), erfcinv(2q/(m-1)) = -z/sqrt 2,
    so bl(q) = (m-1) Phi(z - sqrt 2/s), z = ndtri_exp(log q - log(m-1)). q itself can be far below the
    smallest float64 (log q0 = -993 at s = 2, order 64: erfcinv(0) = inf made erfc 0 and its log a
    domain error), so it is never formed."""
    z = float(special.ndtri_exp(logq - math.log(m - 1)))
    return math.log(m - 1) + float(special.log_ndtr(z - math.sqrt(2.0) / sigma))


def _log_bu(logq: float | np.ndarray, sigma: float, m: int) -> float | np.ndarray:
    """log of the largest q at a histogram one vote away (App. C, Prop. 12), capped at 1:
    bu(q) = min(1, (m-1)/2 erfc(-1/s + erfcinv(2q/(m-1)))) = min(1, (m-1) Phi(z + sqrt 2/s)) (as _log_bl).
    Elementwise on an array of log q (a float for a float)."""
    z = special.ndtri_exp(np.asarray(logq, dtype=np.float64) - math.log(m - 1))
    out = np.minimum(0.0, math.log(m - 1) + special.log_ndtr(z + math.sqrt(2.0) / sigma))
    return float(out) if out.ndim == 0 else out


def _beta_grid(logq: np.ndarray, sigma: float, order: float) -> np.ndarray:
    """:func:`_beta_gnmax` on an array of log q (q > 0)."""
    with np.errstate(invalid="ignore"):  # the Thm. 6 branch is computed everywhere and used only below q0
        thm6 = _thm6(logq, sigma, np.array([order]))
    return np.where(logq >= log_q0(sigma, order), _rdp_di(sigma, order), thm6)


#: Points of the grids in log q on which :func:`conditions_hold` checks C5 and C6.
CONDITION_GRID = 4000


@lru_cache(maxsize=512)
def conditions_hold(sigma: float, m: int, order: float) -> bool:
    """Whether conditions C5 and C6 of Papernot et al. 2018 (App. B.4.2) hold at (sigma, m classes, order): C5,
    beta(q) non-decreasing on (0, q0); C6, beta(bu(q)) - beta(q) non-decreasing on (0, q1]. They are what makes the
    local sensitivity of beta largest on [q1, q0] (Prop. 13), so that the walk of :func:`local_sensitivity_gnmax`
    bounds it at every distance; without them a histogram with a smaller q has a larger one (sigma 2, order 5,
    20 teachers: (16, 4) has 0.343, the walk from (12, 8) gave 0.1725 at every distance: the smooth sensitivity
    1.7 times too small). Checked numerically, as the authors do (pate_2018 ``smooth_sensitivity.py``,
    ``check_conditions``: the derivative's minimum by a bounded scalar search): on :data:`CONDITION_GRID` points
    evenly spaced in log q over [8 log q0, log q0] (C5) and [8 log q1, log q1] (C6), as many over [64 log q,
    8 log q] for each, and as many at distances from the top end spaced geometrically from 7 |log q| down to
    1e-9 |log q|, a fall below the running maximum beyond 1e-9 of the function's largest value fails. The points
    near the top end are needed: C6 can fail on a stretch just below q1 narrower than the even step (sigma 46.43,
    order 40, 3 classes: beta(bu(q)) - beta(q) falls by 1.6e-10 over the last 0.0017 of log q below log q1 = -3.04,
    checked in 50-digit arithmetic; the even grid's last step is 0.0053), and a fall spread over fine steps is
    measured against the running maximum, not step by step. They fail for most orders above sigma (see
    benchmarks/RESULTS.md)."""
    lq0 = log_q0(sigma, order)
    lq1 = _log_bl(lq0, sigma, m)

    def grid(top: float) -> np.ndarray:
        near_top = top - abs(top) * np.geomspace(7.0, 1e-9, CONDITION_GRID)
        even = (np.linspace(64.0 * top, 8.0 * top, CONDITION_GRID), np.linspace(8.0 * top, top, CONDITION_GRID))
        return np.unique(np.concatenate([*even, near_top]))  # sorted: increasing log q

    def non_decreasing(f: np.ndarray) -> bool:
        if not np.all(np.isfinite(f)):
            return False
        fall = float(np.max(np.maximum.accumulate(f) - f))
        return fall <= 1e-9 * float(np.abs(f).max())

    q5, q6 = grid(lq0), grid(lq1)
    c5 = non_decreasing(_beta_grid(q5, sigma, order))
    return c5 and non_decreasing(_beta_grid(_log_bu(q6, sigma, m), sigma, order) - _beta_grid(q6, sigma, order))


def _ls_at(logq: float, sigma: float, m: int, order: float) -> float:
    """Local sensitivity of beta at a histogram with bound q (App. C, Alg. 3, Prop. 13): the larger of
    beta(bu(q)) - beta(q) and beta(q) - beta(bl(q)); on [q1, q0], q1 = bl(q0), q is replaced by q1."""
    lq0 = log_q0(sigma, order)
    lq1 = _log_bl(lq0, sigma, m)
    if lq1 <= logq <= lq0:
        logq = lq1
    b = _beta_gnmax(logq, sigma, order)
    up = _beta_gnmax(_log_bu(logq, sigma, m), sigma, order)
    lo = _beta_gnmax(_log_bl(logq, sigma, m), sigma, order)
    return max(up - b, b - lo)


def local_sensitivity_gnmax(votes: np.ndarray, n_teachers: int, sigma: float, order: float) -> np.ndarray:
    """Bounds on the local sensitivity of one GNMax query's beta at distance d = 0 .. K - 1 (App. C,
    Algs. 4-5): histograms d votes away are walked towards q1..q0, the plateau where the sensitivity is
    largest (moving a vote from the top class to the runner-up raises q; the other way lowers it). Past the
    walk every entry is the plateau value. That the plateau is the largest value needs conditions C5 and C6
    (:func:`conditions_hold`): where they fail, refused (InputError)."""
    v = np.sort(np.asarray(votes, dtype=np.float64))[::-1].copy()
    m = len(v)
    if not conditions_hold(float(sigma), m, float(order)):
        raise InputError(
            f"the smooth-sensitivity analysis of GNMax (Papernot et al. 2018, App. B.4.2, conditions C5-C6) does not "
            f"hold at sigma {sigma:g}, {m} classes, Renyi order {order:g}: its local-sensitivity bound would be too "
            "small; use a smaller order (below sigma) or a larger sigma"
        )
    lq0 = log_q0(sigma, order)
    lq1 = _log_bl(lq0, sigma, m)
    plateau = _ls_at(lq1, sigma, m, order)
    out = np.full(n_teachers, plateau)
    logq = float(log_q_gnmax(v, sigma)[0])
    if lq1 <= logq <= lq0:
        return out
    out[0] = _ls_at(logq, sigma, m, order)
    left = logq > lq0  # q above q0: widen the gap (q falls); below q1: narrow it (q rises)
    d = 0
    while d + 1 < n_teachers and ((left and logq > lq0 and v[1] > 0) or (not left and logq < lq1)):
        d += 1
        if left:
            v[0] += 1.0
            v[1] -= 1.0
            v[1:] = np.sort(v[1:])[::-1]
        else:
            v[0] -= 1.0
            v[1] += 1.0
        logq = float(log_q_gnmax(v, sigma)[0])
        out[d] = _ls_at(logq, sigma, m, order)
    return out


def local_sensitivity_threshold(
    max_count: float, n_teachers: int, threshold: float, sigma1: float, order: float
) -> np.ndarray:
    """Bounds on the local sensitivity of the threshold check's RDP at distance d = 0 .. K - 1: its RDP
    depends on max_j n_j only, which one changed teacher moves by at most 1, so at distance d it is the
    largest change between neighbouring counts v, v +- 1 with v = max n +- d (App. C, threshold case)."""
    k = int(n_teachers)
    rdp = np.array(
        [float(rdp_threshold_data_dependent(v, threshold, sigma1, np.array([order]))[0]) for v in range(k + 1)]
    )

    def ls(v: int) -> float:
        down = abs(rdp[v - 1] - rdp[v]) if v > 0 else -math.inf
        up = abs(rdp[v + 1] - rdp[v]) if v < k else -math.inf
        return max(down, up)

    cur = round(float(max_count))
    out = np.zeros(k)
    for d in range(min(k, max(cur, k - cur))):
        a = ls(cur + d) if cur + d <= k else -math.inf
        b = ls(cur - d) if cur - d >= 0 else -math.inf
        out[d] = max(a, b)
    return out


def smooth_sensitivity(ls_at_distance: np.ndarray, beta: float) -> float:
    """SS_beta = max_d e^(-beta d) A(d), A(d) = max_{d' <= d} LS(d') (NRS07, Def. 2.1 / Lemma 2.3)."""
    a = np.maximum.accumulate(np.asarray(ls_at_distance, dtype=np.float64))
    return float(np.max(a * np.exp(-beta * np.arange(len(a))))) if len(a) else 0.0


def gnss_rdp(beta: float, sigma_s: float, order: float) -> float:
    """RDP at ``order`` of releasing f(D) + SS_beta(D) sigma_s N(0, 1) (Papernot et al. 2018, App. C,
    Thm. 23): lambda e^(2 beta)/sigma_s^2 + (-log(1 - 2 lambda beta)/2 + beta lambda)/(lambda - 1),
    for 1 < lambda < 1/(2 beta)."""
    if not 1.0 < order < 1.0 / (2.0 * beta):
        raise InputError(f"GNSS needs 1 < order < 1/(2 beta) = {1 / (2 * beta):g}, got order {order:g}")
    return order * math.exp(2.0 * beta) / sigma_s**2 + (-0.5 * math.log1p(-2.0 * order * beta) + beta * order) / (
        order - 1.0
    )


# ----------------------------------------------------------------------------- the sanitised claim


MECHANISM_SETTINGS = ("order", "beta_factor", "sigma_s", "tau")


@dataclass(frozen=True)
class SanitiserConfig:
    """Public parameters of the sanitiser. Each one is either fixed by the user, which is honest only if it was
    fixed before the votes were seen, or None: chosen by :func:`choose_sanitiser` from public quantities only.

    ``order``: the Renyi order lambda; ``beta_factor``: beta = beta_factor / lambda (in (0, 1/2): GNSS needs
    lambda < 1/(2 beta), Thm. 23); ``sigma_s``: the GNSS noise multiplier; ``tau``: the noise of the released
    log SS (whose sensitivity is beta). ``prior_top``: not a mechanism setting but the public rule's prior, the
    fraction of teachers in each query's top class (None: :func:`prior_histogram`'s default).
    """

    order: float | None = None
    beta_factor: float | None = None
    sigma_s: float | None = None
    tau: float | None = None
    prior_top: float | None = None

    def __post_init__(self) -> None:
        if self.order is not None and not self.order > 1.0:
            raise InputError(f"expected order > 1, got {self.order}")
        if self.beta_factor is not None:
            check_in_interval(0.0, 0.5, beta_factor=self.beta_factor)
            if self.beta_factor >= 0.5:
                raise InputError(
                    f"expected beta_factor < 0.5 (Thm. 23 needs lambda < 1/(2 beta)), got {self.beta_factor}"
                )
        if self.sigma_s is not None:
            check_positive(sigma_s=self.sigma_s)
        if self.tau is not None:
            check_positive(tau=self.tau)
        if self.prior_top is not None and not 0.0 < self.prior_top <= 1.0:
            raise InputError(f"expected prior_top in (0, 1], got {self.prior_top}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def free(self) -> tuple[str, ...]:
        """The mechanism settings left to the public rule."""
        return tuple(k for k in MECHANISM_SETTINGS if getattr(self, k) is None)

    @classmethod
    def parse(cls, text: str) -> SanitiserConfig:
        """``"auto"``: every field from the public rule; ``"order=2,sigma_s=0.75"``: those fields fixed (they must
        have been fixed before the votes were seen), the others from the public rule."""
        if text.strip() == "auto":
            return cls()
        fields = {f: float for f in (*MECHANISM_SETTINGS, "prior_top")}
        given: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in fields:
                keys = ", ".join(fields)
                raise InputError(f"expected the sanitiser as auto or key=value pairs with keys {keys}, got {part!r}")
            try:
                given[key.strip()] = float(value)
            except ValueError:
                raise InputError(f"expected a number for sanitiser {key.strip()}, got {value!r}") from None
        return cls(**given)


ORDER_GRID = tuple(float(x) for x in (1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 64, 80, 100))
BETA_FACTORS = (0.3, 0.35, 0.4, 0.45, 0.49)  # the authors' search range 0.3/lambda .. 0.495/lambda (see below)


def per_query_rdp(kind: str, hist: np.ndarray, answered: np.ndarray, params: dict[str, float], order: float) -> float:
    """Total data-dependent RDP at ``order`` of the answered queries (``kind``: gnmax or confident-gnmax, the
    mechanisms the sanitiser covers: :func:`sanitised_claim` refuses the others); Confident-GNMax also pays its
    threshold check on every query."""
    if kind not in ("gnmax", "confident-gnmax"):  # a mechanism without an analysis here is never accounted as GNMax
        raise InputError(f"no data-dependent RDP for {kind}; expected gnmax or confident-gnmax")
    h = _hist(hist)
    o = np.array([order])
    total = 0.0
    if kind == "confident-gnmax":
        for mx in h.max(1):
            total += float(rdp_threshold_data_dependent(float(mx), params["threshold"], params["sigma1"], o)[0])
    rows = np.flatnonzero(answered) if kind == "confident-gnmax" else np.arange(len(h))
    for lq in log_q_gnmax(h[rows], params["sigma"]):
        total += _beta_gnmax(float(lq), params["sigma"], order)
    return total


def conversion(order: float, delta: float) -> float:
    """epsilon - RDP of the conversion of a (lambda, r)-RDP bound to (epsilon, delta) at one order: Canonne,
    Kamath & Steinke 2020 (arXiv:2004.00010, Prop. 12; Balle et al. 2020, Thm. 21), as the accounting layer's
    :func:`dpaudit.accounting.rdp.rdp_to_epsilon`: log((lambda - 1)/lambda) - (log delta + log lambda)/(lambda - 1),
    below Mironov 2017's log(1/delta)/(lambda - 1) (Prop. 3) by log(lambda)/(lambda - 1) - log(1 - 1/lambda)."""
    return math.log1p(-1.0 / order) - (math.log(delta) + math.log(order)) / (order - 1.0)


def _ls_sum(kind: str, h: np.ndarray, weights: np.ndarray, n_teachers: int, params: dict[str, float],
            order: float) -> np.ndarray:  # fmt: skip
    """A(d) of :func:`smooth_sensitivity`: the sum over queries of each query's local-sensitivity bound at
    distance <= d, the threshold check on every query and GNMax on the rows weighted by ``weights`` (1 for an
    answered query, 0 for a declined one; the public rule's prior uses Pr[answered]). Identical (sorted)
    histograms are computed once, as the bounds depend on nothing else."""
    ls = np.zeros(n_teachers)
    if kind == "confident-gnmax":
        tops, counts = np.unique(h.max(1), return_counts=True)
        for mx, c in zip(tops, counts, strict=True):
            ls += c * np.maximum.accumulate(
                local_sensitivity_threshold(mx, n_teachers, params["threshold"], params["sigma1"], order)
            )
    rows = np.flatnonzero(weights > 0)
    if len(rows):
        hists, inverse = np.unique(-np.sort(-h[rows], axis=1), axis=0, return_inverse=True)
        w = np.bincount(np.ravel(inverse), weights=weights[rows], minlength=len(hists))
        for v, c in zip(hists, w, strict=True):
            ls += c * np.maximum.accumulate(local_sensitivity_gnmax(v, n_teachers, params["sigma"], order))
    return ls


def margin_quantile(delta: float) -> float:
    """z = Phi^-1(1 - delta/4): each of the sanitiser's two Gaussian draws falls below -z with probability delta/4."""
    return float(stats.norm.isf(delta / 4.0))


GNMAX_PRIOR_TOP = 0.8  # plain GNMax has no threshold to anchor the prior: 4 in 5 teachers agree (fixed in advance)


def prior_histogram(
    kind: str,
    n_queries: int,
    max_answers: int | None,
    n_classes: int,
    n_teachers: int,
    params: dict[str, float],
    prior_top: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The public rule's prior of the votes, built from public settings only: every query has the same histogram,
    top count n1 = round(prior_top K) and the other K - n1 votes on one runner-up (for a given top count, the
    histogram nearest a tie, so the largest GNMax sensitivity).

    ``prior_top`` None: Confident-GNMax's threshold, n1 = T (T is the designer's statement of the consensus a
    query needs to be answered); plain GNMax, :data:`GNMAX_PRIOR_TOP`. Confident-GNMax answers a query of the
    prior with Pr[n1 + N(0, sigma1^2) >= T] (1/2 at n1 = T), so GNMax's local sensitivity and RDP are weighted by
    it, as the authors' expected local sensitivity (pate_2018 ICLR2018/smooth_sensitivity_table.py, lines
    201-202: ``ls_cum += ls_step1 + pr_answered * ls_step2``), and the expected answers are capped at the cap.
    Returns (histograms (Q, C), weights (Q,)): the expected number of answered queries is the weights' sum."""
    k = int(n_teachers)
    if prior_top is not None:
        n1 = round(prior_top * k)
    elif kind == "confident-gnmax":
        n1 = math.ceil(params["threshold"])
    else:
        n1 = round(GNMAX_PRIOR_TOP * k)
    n1 = min(k, max(n1, math.ceil((k + 1) / 2)))  # a plurality: at least a bare majority in the prior
    if kind == "confident-gnmax":
        p_answer = float(stats.norm.sf(params["threshold"] - n1, scale=params["sigma1"]))
    else:
        p_answer = 1.0
    hist = np.zeros((n_queries, n_classes))
    hist[:, 0], hist[:, 1] = n1, k - n1
    expected = n_queries * p_answer if max_answers is None else min(n_queries * p_answer, float(max_answers))
    return hist, np.full(n_queries, expected / n_queries)


def expected_claim(raw: float, ss: float, order: float, beta_factor: float, sigma_s: float, tau: float,
                   delta: float) -> float:  # fmt: skip
    """The expected value of :func:`sanitised_claim`'s epsilon over the sanitiser's noise, given the data-dependent
    RDP ``raw`` and smooth sensitivity ``ss``: E[U] = raw + z sigma_s SS e^(beta tau z) E[e^(tau N)] with
    E[e^(tau N)] = e^(tau^2 / 2) (log-normal mean), plus both releases' RDP and the conversion."""
    beta = beta_factor / order
    z = margin_quantile(delta)
    margin = z * sigma_s * ss * math.exp(beta * tau * z + 0.5 * tau**2)
    return (
        raw + margin + gnss_rdp(beta, sigma_s, order) + order * beta**2 / (2.0 * tau**2) + conversion(order, delta / 2)
    )


def _best_sigma_tau(ss: float, order: float, beta_factor: float, sigma_s: float | None, tau: float | None,
                    delta: float) -> tuple[float, float]:  # fmt: skip
    """sigma_s and tau minimising :func:`expected_claim` at fixed order and beta (those given are kept).
    For fixed tau the sigma_s terms are a sigma + b / sigma^2 with a = z SS e^(beta tau z + tau^2/2) and
    b = lambda e^(2 beta) (Thm. 23), minimised at sigma = (2 b / a)^(1/3) (the authors minimise the same form with
    a = 2 SS: pate_2018 ICLR2018/smooth_sensitivity_table.py, line 216,
    ``sigma_ss = ((order * exp(2 beta)) / ss)**(1/3)``);
    tau, a scalar, by bounded search in log tau."""
    beta = beta_factor / order
    z = margin_quantile(delta)
    b = order * math.exp(2.0 * beta)

    def sigma_for(t: float) -> float:
        if sigma_s is not None:
            return sigma_s
        return (2.0 * b / (z * max(ss, 1e-300) * math.exp(beta * t * z + 0.5 * t**2))) ** (1.0 / 3.0)

    if tau is not None:
        return sigma_for(tau), tau

    def cost(log_t: float) -> float:
        t = math.exp(log_t)
        return expected_claim(0.0, ss, order, beta_factor, sigma_for(t), t, delta)

    res = optimize.minimize_scalar(cost, bounds=(math.log(1e-3), math.log(10.0)), method="bounded")
    t = math.exp(float(res.x))
    return sigma_for(t), t


def choose_sanitiser(kind: str, *, n_queries: int, max_answers: int | None, n_classes: int, n_teachers: int,
                     params: dict[str, float], delta: float,
                     fixed: SanitiserConfig | None = None) -> SanitiserConfig:  # fmt: skip
    """The public rule: the sanitiser's free settings (those ``fixed`` leaves None) minimising the expected claim
    (:func:`expected_claim`) on :func:`prior_histogram`'s votes. It takes public quantities only (the number of
    queries, classes and teachers, the cap, the aggregator's sigmas and threshold, delta), never the votes, so
    choosing it releases nothing (the authors' own search over beta and sigma_s runs on the private votes and
    "cannot be released": pate_2018 ICLR2018/smooth_sensitivity_table.py, lines 161-162,
    ``_find_optimal_smooth_sensitivity_parameters``). The order runs over :data:`ORDER_GRID`, beta_factor over
    :data:`BETA_FACTORS` (the authors' range, ibid. line 169: ``betas = np.arange(.3 / order, .495 / order,
    .01 / order)``); sigma_s and tau by
    :func:`_best_sigma_tau`. Pure in its arguments, so cached (repeated claims on one run pay it once)."""
    key = tuple(sorted((k, params.get(k)) for k in ("sigma", "sigma1", "threshold")))
    return _choose(kind, int(n_queries), max_answers, int(n_classes), int(n_teachers), key, float(delta),
                   fixed or SanitiserConfig())  # fmt: skip


@lru_cache(maxsize=64)
def _choose(kind: str, n_queries: int, max_answers: int | None, n_classes: int, n_teachers: int,
            params_key: tuple, delta: float, fixed: SanitiserConfig) -> SanitiserConfig:  # fmt: skip
    params = dict(params_key)
    hist, weights = prior_histogram(kind, n_queries, max_answers, n_classes, n_teachers, params, fixed.prior_top)
    orders = ORDER_GRID if fixed.order is None else (fixed.order,)
    factors = BETA_FACTORS if fixed.beta_factor is None else (fixed.beta_factor,)
    best, best_val = fixed, math.inf
    for order in orders:
        if fixed.order is None and not conditions_hold(float(params["sigma"]), n_classes, order):
            continue  # the analysis does not hold at this order (local_sensitivity_gnmax refuses it)
        raw = _prior_rdp(kind, hist, weights, params, order)
        ls = _ls_sum(kind, hist, weights, n_teachers, params, order)
        for bf in factors:  # bf < 1/2 keeps lambda < 1/(2 beta) = lambda / (2 bf), as Thm. 23 needs
            ss = smooth_sensitivity(ls, bf / order)
            sigma_s, tau = _best_sigma_tau(ss, order, bf, fixed.sigma_s, fixed.tau, delta)
            val = expected_claim(raw, ss, order, bf, sigma_s, tau, delta)
            if val < best_val:
                best_val = val
                best = SanitiserConfig(order=order, beta_factor=bf, sigma_s=sigma_s, tau=tau, prior_top=fixed.prior_top)
    if best.order is None:
        raise InputError(
            f"the smooth-sensitivity analysis of GNMax (Papernot et al. 2018, App. B.4.2, conditions C5-C6) holds at "
            f"none of the Renyi orders {', '.join(f'{o:g}' for o in orders)} at sigma {params['sigma']:g} with "
            f"{n_classes} classes; use a larger sigma"
        )
    return best


def _prior_rdp(kind: str, hist: np.ndarray, weights: np.ndarray, params: dict[str, float], order: float) -> float:
    """The prior's expected data-dependent RDP: the threshold check on every query, GNMax weighted by Pr[answered]."""
    threshold = (
        per_query_rdp(kind, hist, np.zeros(len(hist), bool), params, order) if kind == "confident-gnmax" else 0.0
    )
    gnmax = per_query_rdp("gnmax", hist[:1], np.ones(1, bool), params, order)
    return threshold + float(weights.sum()) * gnmax


def sanitised_claim(kind: str, hist: np.ndarray, answered: np.ndarray, *, n_teachers: int, params: dict[str, float],
                    delta: float, config: SanitiserConfig, rng: np.random.Generator) -> dict[str, Any]:  # fmt: skip
    """A sanitised data-dependent (epsilon, delta) claim for GNMax or Confident-GNMax answers.

    Releases (all charged at the order lambda, composed adaptively in RDP):
      1. log S~ = log SS_beta(D) + N(0, tau^2): sensitivity beta (SS_beta is beta-smooth), so
         (lambda, lambda beta^2 / (2 tau^2))-RDP (Gaussian mechanism, Mironov 2017, Prop. 7);
      2. E~ = eps_lambda(D) + SS_beta(D) sigma_s N(0, 1): GNSS, :func:`gnss_rdp` (Thm. 23).
    With z = Phi^-1(1 - delta/4): S^ = S~ e^(beta tau z) >= SS_beta(D) except with probability delta/4, and
    SS_beta(D) sigma_s N(0, 1) >= -z sigma_s SS_beta(D) except with probability delta/4, so
        U = E~ + z sigma_s S^ >= eps_lambda(D)  except with probability delta/2 (union bound).
    The claim: epsilon = U + (the two releases' RDP) + :func:`conversion` at delta/2 (Canonne, Kamath & Steinke
    2020, Prop. 12, the accounting layer's conversion), delta = delta/2 + delta/2. The settings are ``config``'s
    where given (honest only if fixed before the votes were seen) and otherwise :func:`choose_sanitiser`'s, a rule
    of public quantities (``params["max_answers"]``: the cap, if any); the record says which were which.
    Returns the public record and, apart, the private
    values (raw eps_lambda(D), SS) for ``--keep-private-diagnostics``.
    """
    if kind not in ("gnmax", "confident-gnmax"):
        raise InputError(f"the smooth-sensitivity sanitiser covers gnmax and confident-gnmax, not {kind}")
    delta = check_in_interval(0.0, 1.0, delta=delta)
    h = _hist(hist)
    answered = np.asarray(answered, dtype=bool)
    n_q, m = h.shape
    # the public rule sees the shape (queries and classes: public) and the public settings, never the votes
    rule = choose_sanitiser(kind, n_queries=n_q, max_answers=params.get("max_answers"), n_classes=m,
                            n_teachers=n_teachers, params=params, delta=delta, fixed=config)  # fmt: skip
    order, beta = float(rule.order), rule.beta_factor / rule.order
    raw = per_query_rdp(kind, h, answered, params, order)
    weights = (answered if kind == "confident-gnmax" else np.ones(n_q, bool)).astype(np.float64)
    ls = _ls_sum(kind, h, weights, n_teachers, params, order)
    ss = smooth_sensitivity(ls, beta)
    z = margin_quantile(delta)
    log_s_noisy = math.log(max(ss, 1e-300)) + rule.tau * float(rng.standard_normal())
    s_hat = math.exp(log_s_noisy + beta * rule.tau * z)
    released = raw + ss * rule.sigma_s * float(rng.standard_normal())
    upper = released + z * rule.sigma_s * s_hat
    cost_ss = order * beta**2 / (2.0 * rule.tau**2)
    cost_gnss = gnss_rdp(beta, rule.sigma_s, order)
    conv = conversion(order, delta / 2.0)
    epsilon = max(max(upper, 0.0) + cost_ss + cost_gnss + conv, 0.0)
    public = {
        "epsilon": float(epsilon),
        "delta": float(delta),
        "order": float(order),
        "beta": float(beta),
        "beta_factor": float(rule.beta_factor),
        "sigma_s": float(rule.sigma_s),
        "tau": float(rule.tau),
        "chosen_by_public_rule": list(config.free()),
        "fixed_by_user": [k for k in MECHANISM_SETTINGS if k not in config.free()],
        "public_rule_prior_top": config.prior_top,
        "released_rdp": float(released),
        "released_smooth_sensitivity_bound": float(s_hat),
        "upper_rdp": float(upper),
        "sanitiser_rdp": float(cost_ss + cost_gnss),
        "conversion": float(conv),
    }
    private = {"data_dependent_rdp": float(raw), "smooth_sensitivity": float(ss)}
    return {"public": public, "private": private}
