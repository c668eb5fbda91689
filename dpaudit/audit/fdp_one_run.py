"""One-run f-DP audit (Mahloujifar, Melis & Chaudhuri, ICML 2025, "Auditing f-differential privacy in
one run", arXiv:2410.22235).

Same game as :mod:`dpaudit.audit.one_run` (Steinke, Nasr & Jagielski 2023): m canaries, each included
independently with probability 1/2; after one run the auditor makes k guesses (top k₊ "in", bottom
k₋ "out", abstains on the rest) of which v are correct. Instead of testing an (ε, δ) claim, the null
hypothesis is "the mechanism is f-DP with respect to each canary" for a hypothesised trade-off curve
f. Mahloujifar et al. bound P[V ≥ v] under that hypothesis through a recursion over the number of
correct guesses that only uses the curve's *blow-up inverse*

    g(y) = inf{x : 1 − f(x) ≥ y} = f(1 − y)   (for a symmetric f),

the least probability an event can have under one neighbour when it has probability y under the
other. Their numerical procedure (the recursion on (r_i, h_i) of their Section 4 theorem on
f-DP guessing games, with the cap at 1; ``audit_rh_with_cap`` in the paper's code) declares
P[V ≥ v] < τ when, starting from r = τ·v/m and h = τ·(k − v)/m and for i = v − 1, ..., 0,

    h ← max(h, g(r)),   r ← min(1, r + i/(k − i) · Δh),

it ends with r + h > k/m. Rejecting at level τ = α whenever that happens has type-I error ≤ α for
every f-DP mechanism (the event {V ≥ v_obs} for the smallest rejected v). We could only read the
paper's abstract and its code-level description here, not the full text, so the theorem number is
not quoted; the recursion is checked against exact probabilities in tests/audit/test_fdp_one_run.py
(two canaries, no leakage: rejection exactly when α > 1/4) and by the ≥ 200-seed soundness tests.

Families (a one-parameter set of curves, nested: a larger parameter is leakier):

* ``"gdp"`` — μ-GDP, g(y) = Φ(Φ⁻¹(y) − μ) (Dong, Roth & Su 2022, arXiv:1905.02383, Def. 2.4). The
  refutation of μ-GDP is formal; ε(δ) of the refuted μ is an ε lower bound only if the true curve is
  Gaussian (an (ε, 0)-DP randomised response is not μ-GDP for much larger ε(δ)), so it is an estimate.
* ``"epsilon-delta"`` — the (ε, δ)-DP curve at the claim's δ (Dong et al. 2022, Prop. 2.5): a formal
  ε lower bound, the direct analogue of Steinke et al.
* :func:`event_family` / :func:`dpsgd_family` / :func:`sampled_gaussian_step_family` — the claim's
  own curve: the intersection of the (ε, δ(ε)) curves of the PLD accountant (or the exact one-step
  δ(ε)) on a grid of ε (a pessimistic δ(ε) and a finite grid give a curve below the true one, so
  every refutation is still valid), with the noise multiplier as the parameter. What is formal is the
  refutation of *curves*: the claimed curve is refuted when a curve at least as private is (the
  family is nested). The ε of the leakiest refuted curve is NOT an ε lower bound for every mechanism:
  randomised response that is exactly (2, 0)-DP is not f-DP for the one-step Gaussian curve with
  ε(δ) = 2, so refuting that curve says nothing about ε = 2. These families are reported as a
  refutation of the claimed curve (``AuditResult.refutation``, verdict "curve-refuted") with the ε
  labelled an estimate (``claim_curve`` set, ``formal`` False).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from dpaudit import numfmt
from dpaudit.accounting.gdp import gdp_epsilon_lower
from dpaudit.audit import one_run
from dpaudit.audit.holdout import SELECTION_ALPHA, select_then_evaluate
from dpaudit.errors import InputError

BlowupInverse = Callable[[float], float]

# Parameter search: relative tolerance of the bisection on the family parameter, and its cap.
_PARAM_TOL = 1e-3
_MAX_BISECTIONS = 40
# ε grid of an event family's curve: points between 0 and ε(δ = _GRID_DELTA_MIN).
_GRID_POINTS = 64
_GRID_DELTA_MIN = 1e-12
# fdp_rejects' rounding margin on α, in ulps per correct guess (see there).
_RECURSION_ULPS = 4.0


# --------------------------------------------------------------------------------------------------
# The test.


def fdp_rejects(m: int, k: int, v: int, g: BlowupInverse, alpha: float) -> bool:
    """Whether v correct out of k guesses (m canaries) refutes the f-DP curve with blow-up inverse g.

    Formal guarantee (Mahloujifar, Melis & Chaudhuri 2025, arXiv:2410.22235, the f-DP guessing-game
    bound and its numerical recursion with the cap at 1): for every mechanism that is f-DP with
    respect to each canary, with canaries included independently with probability 1/2,
    P[this returns True] ≤ alpha.
    """
    if not (0 <= v <= k <= m):
        raise ValueError(f"need 0 <= v <= k <= m, got m={m}, k={k}, v={v}")
    if v == 0:
        return False
    # Rounding: the float recursion's smallest rejecting α was measured up to 14.8 ulps (relative) BELOW the α at
    # which the recursion in exact arithmetic first rejects (50-digit mpmath, GDP and (ε, δ) curves, m ≤ 1e4,
    # v ≤ 400 near the boundary; the per-step differences h_new − h cancel), at most 0.5·v ulps at each v measured
    # (benchmarks/stats_rounding.py, section ``fdp``). The test runs at α lowered by 4·(v + 4) ulps (≥ 12x that):
    # rejection is monotone in α, so a rejection here is one at α in exact arithmetic.
    alpha = alpha * (1.0 - _RECURSION_ULPS * (v + 4) * 2.0**-52)
    r = alpha * v / m  # mass of "≥ v correct" spread over the correct guesses (their recursion's start)
    h = alpha * (k - v) / m  # ... and over the wrong ones
    for i in range(v - 1, -1, -1):
        h_new = max(h, g(r))  # blow-up constraint of f-DP (Mahloujifar et al. 2025, the recursion on h)
        if h_new == h:
            break  # neither h nor r can change again
        r = min(1.0, r + i / (k - i) * (h_new - h))  # the recursion on r, capped at 1
        h = h_new
    return r + h > k / m  # more mass than k guesses out of m can carry: contradiction


@dataclass(frozen=True)
class TradeoffFamily:
    """A nested one-parameter family of symmetric trade-off curves (larger parameter = leakier).

    ``blowup_inverse(t)`` returns g_t; ``epsilon(t, delta)`` the curve's ε(δ), increasing in t.
    ``formal`` says whether ε(δ) of a refuted parameter is a formal ε lower bound for every mechanism
    (only the (ε, δ) family). ``claim_curve`` names the claim's own curve ("DP-SGD", ...) for the
    families whose refutation is a refutation of the claimed curve (see the module docstring); the
    parameter of those is t = 1 / noise multiplier.
    """

    name: str
    parameter: str
    blowup_inverse: Callable[[float], BlowupInverse]
    epsilon: Callable[[float, float], float]
    t_start: float
    t_max: float
    formal: bool
    note: str
    claim_curve: str | None = None


def _gdp_g(mu: float) -> BlowupInverse:
    # g(y) = 1 − G_μ⁻¹... for symmetric G_μ: g(y) = G_μ(1 − y) = Φ(Φ⁻¹(y) − μ)  (Dong et al. 2022, Def. 2.4)
    return lambda y: float(special.ndtr(special.ndtri(y) - mu)) if y > 0.0 else 0.0


def gdp_family() -> TradeoffFamily:
    # ε of a refuted μ is a lower bound (and of a perfect attack's, the most the design certifies): rounded down.
    return TradeoffFamily(
        name="gdp", parameter="mu", blowup_inverse=_gdp_g, epsilon=gdp_epsilon_lower,
        t_start=1.0, t_max=64.0, formal=False,
        note="estimate: the refutation of mu-GDP is formal, but eps(delta) of the refuted mu is an eps lower bound "
        "only if the true trade-off curve is Gaussian (Mahloujifar et al. 2025, arXiv:2410.22235)",
    )  # fmt: skip


def _eps_delta_g(epsilon: float, delta: float) -> BlowupInverse:
    # f(α) = max{0, 1 − δ − e^ε α, e^−ε (1 − δ − α)} (Dong et al. 2022, Prop. 2.5); g(y) = f(1 − y).
    e = math.exp(min(epsilon, 700.0))
    return lambda y: max(0.0, 1.0 - delta - e * (1.0 - y), (y - delta) / e)


def epsilon_delta_family(delta: float) -> TradeoffFamily:
    return TradeoffFamily(
        name="epsilon-delta", parameter="epsilon", blowup_inverse=lambda eps: _eps_delta_g(eps, delta),
        epsilon=lambda eps, d: eps, t_start=1.0, t_max=100.0, formal=True,
        # δ as given (dpaudit.numfmt.exact).
        note=f"formal: (epsilon, delta = {numfmt.exact(delta)})-DP curves refuted (Mahloujifar "
        "et al. 2025 with Dong et al. 2022, "
        "Prop. 2.5)",
    )  # fmt: skip


def _grid_g(eps: np.ndarray, dlt: np.ndarray) -> BlowupInverse:
    # Intersection of the (ε_i, δ_i)-DP curves: f(α) = max_i f_{ε_i, δ_i}(α) (Dong et al. 2022, Prop. 2.5
    # for each i; a mechanism (ε_i, δ(ε_i))-DP for all i is f-DP with the pointwise max), g(y) = f(1 − y).
    e, inv_e = np.exp(np.minimum(eps, 700.0)), np.exp(-eps)

    def g(y: float) -> float:
        return float(max(0.0, np.max(np.maximum(1.0 - dlt - e * (1.0 - y), (y - dlt) * inv_e))))

    return g


@functools.lru_cache(maxsize=4096)
def _pld_curve(event) -> tuple[np.ndarray, np.ndarray] | None:
    """The PLD accountant's (ε_i, δ(ε_i)) grid of ``event`` for :func:`_grid_g` (None: ε(1e-12) infinite).

    A pure function of the (hashable, immutable) event, cached across families: every audit of the same
    claim (each direction, each claimed ε, each call) bisects over the same noise multipliers, and each
    point is a full PLD composition in two precisions. Only the 2 × 64 numbers are kept, not the PMFs.
    """
    from dpaudit.accounting import make_accountant

    acc = make_accountant("pld").compose(event)
    eps_hi = acc.epsilon(_GRID_DELTA_MIN)
    if not math.isfinite(eps_hi):
        return None
    grid = np.linspace(0.0, eps_hi, _GRID_POINTS)
    dlt = acc.deltas(grid)  # each a valid delta(eps) of the PLD, read off the composed PMFs once
    grid.flags.writeable = dlt.flags.writeable = False  # shared by every caller
    return grid, dlt


def event_family(make_event: Callable[[float], object], name: str = "event", curve: str = "claimed") -> TradeoffFamily:
    """The claim's own curve family: ``make_event(noise_multiplier)`` accounted with the PLD accountant.

    The parameter is t = 1 / noise_multiplier (t = 0: no leakage). Add/remove neighbours.
    """
    from dpaudit.accounting import make_accountant

    @functools.lru_cache(maxsize=16)
    def accountant(t: float):
        return make_accountant("pld").compose(make_event(1.0 / t))

    @functools.lru_cache(maxsize=256)
    def g_of(t: float) -> BlowupInverse:
        if t <= 0.0:
            return lambda y: y
        curve = _pld_curve(make_event(1.0 / t))
        return (lambda y: 0.0) if curve is None else _grid_g(*curve)

    def eps_of(t: float, delta: float) -> float:
        return 0.0 if t <= 0.0 else float(accountant(t).epsilon(delta))

    return TradeoffFamily(
        name=name, parameter="1/noise_multiplier", blowup_inverse=g_of, epsilon=eps_of, t_start=0.5, t_max=1e3,
        formal=False, claim_curve=curve,
        note=f"the claim's own curve family ({name}, PLD accountant, noise multiplier varied): the refutation of "
        "curves is formal; the epsilon of the leakiest refuted curve is an estimate (an epsilon lower bound only "
        "for mechanisms whose trade-off curve has this family's shape)",
    )  # fmt: skip


def dpsgd_family(sample_rate: float, steps: int) -> TradeoffFamily:
    """Curves of DP-SGD with Poisson rate q and T steps, the noise multiplier varied."""
    from dpaudit.accounting import dpsgd_event

    return event_family(
        lambda s: dpsgd_event(noise_multiplier=s, sample_rate=sample_rate, steps=steps),
        name=f"dpsgd(q={sample_rate:.4g}, T={steps})",
        curve="DP-SGD",
    )


def _sampled_gaussian_step_delta(eps: np.ndarray, mu: float, q: float) -> np.ndarray:
    """δ(ε) of one Poisson-sampled Gaussian step (add/remove, max of both directions), exact.

    P = (1 − q)N(0, 1) + qN(μ, 1) vs Q = N(0, 1) (remove) and Q vs P (add). The privacy loss is
    monotone in the output, so the hockey-stick divergence is a difference of Gaussian tails at the
    threshold where the loss equals ε (Balle & Wang 2018, arXiv:1805.06530, Thm. 8 for q = 1;
    Zhu, Dong & Wang 2022, arXiv:2106.08567, §5 for the sampled pair).
    """
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # ε huge: e = inf, δ(ε) = 0
        e = np.exp(eps)
        # remove: L(x) = log(1 − q + q·exp(μx − μ²/2)) > ε  ⇔  x > x_r
        x_r = (np.log((e - (1.0 - q)) / q) + mu * mu / 2.0) / mu
        d_rem = (1.0 - q) * special.ndtr(-x_r) + q * special.ndtr(mu - x_r) - e * special.ndtr(-x_r)
        # add: −L(x) > ε  ⇔  1 − q + q·exp(μx − μ²/2) < e^−ε  ⇔  x < x_a (empty when e^−ε ≤ 1 − q)
        inner = (np.exp(-eps) - (1.0 - q)) / q
        x_a = np.where(inner > 0, (np.log(np.where(inner > 0, inner, 1.0)) + mu * mu / 2.0) / mu, -np.inf)
        d_add = special.ndtr(x_a) - e * ((1.0 - q) * special.ndtr(x_a) + q * special.ndtr(x_a - mu))
    return np.clip(np.maximum(np.nan_to_num(d_rem), np.nan_to_num(d_add)), 0.0, 1.0)


def sampled_gaussian_step_family(sample_rate: float) -> TradeoffFamily:
    """One step of DP-SGD (Poisson rate q, Gaussian noise), parameter t = 1/noise_multiplier.

    The curve is the intersection of the exact (ε, δ(ε)) curves on a grid (a curve below the true
    one: every refutation is valid). Used by the per-step white-box audit.
    """
    q = float(sample_rate)

    @functools.lru_cache(maxsize=512)
    def g_of(t: float) -> BlowupInverse:
        if t <= 0.0:
            return lambda y: y
        grid = np.linspace(0.0, t * t / 2.0 + 8.0 * t + 1.0, 4 * _GRID_POINTS)
        return _grid_g(grid, _sampled_gaussian_step_delta(grid, t, q))

    def eps_of(t: float, delta: float) -> float:
        # ε(δ) of the curve itself: the root of the exact, decreasing δ(ε) (no discretisation).
        def gap(e: float) -> float:
            return float(_sampled_gaussian_step_delta(np.array([e]), t, q)[0]) - delta

        if t <= 0.0 or gap(0.0) <= 0.0:
            return 0.0
        hi = t * t / 2.0 + 8.0 * t + 1.0
        while gap(hi) > 0.0:
            hi *= 2.0
        return float(optimize.brentq(gap, 0.0, hi, xtol=1e-10))

    return TradeoffFamily(
        name=f"dpsgd-step(q={q:.4g})", parameter="1/noise_multiplier", blowup_inverse=g_of, epsilon=eps_of,
        t_start=0.5, t_max=1e3, formal=False, claim_curve="DP-SGD step",
        note="one DP-SGD step's curve (Poisson-sampled Gaussian, noise multiplier varied): the refutation of curves "
        "is formal; the epsilon of one step at the leakiest refuted noise multiplier is an estimate (an epsilon "
        "lower bound only for mechanisms whose trade-off curve has this family's shape)",
    )  # fmt: skip


def resolve_family(tradeoff, delta: float) -> TradeoffFamily:
    if isinstance(tradeoff, TradeoffFamily):
        return tradeoff
    if tradeoff == "gdp":
        return gdp_family()
    if tradeoff == "epsilon-delta":
        if delta <= 0.0:
            raise InputError("tradeoff='epsilon-delta' needs delta > 0")
        return epsilon_delta_family(delta)
    raise InputError(
        f"unknown tradeoff {tradeoff!r}; valid: epsilon-delta, gdp, dpsgd:Q,T (DP-SGD's curves; in Python a "
        "TradeoffFamily such as dpsgd_family(Q, T))"
    )


class _Bracket:
    """The parameters to check, in order, to locate the end t* of the refuted interval [0, t*] (refuting f_t
    refutes every f_s, s ≤ t: the family is nested): doubling from ``family.t_start`` up to ``family.t_max``,
    then bisection to relative width ``tol`` (at most ``_MAX_BISECTIONS`` midpoints). After each check the caller
    records whether t was refuted; ``lo`` is the largest checked t refuted (0.0 before any) and ``hi`` the smallest
    checked t not refuted (None while every check was refuted)."""

    def __init__(self, family: TradeoffFamily, tol: float):
        self.family, self.tol = family, tol
        self.lo, self.hi, self._midpoints = 0.0, None, 0

    def next(self) -> float | None:
        if self.hi is None:  # doubling
            if self.lo >= self.family.t_max:
                return None
            return self.family.t_start if self.lo == 0.0 else min(2.0 * self.lo, self.family.t_max)
        if self._midpoints >= _MAX_BISECTIONS or self.hi - self.lo <= self.tol * max(self.lo, 1e-3):
            return None
        self._midpoints += 1
        return 0.5 * (self.lo + self.hi)

    def record(self, t: float, refuted: bool) -> None:
        if refuted:
            self.lo = t
        else:
            self.hi = t


def largest_refuted(
    m: int, ks, vs, family: TradeoffFamily, alpha: float, *, tol: float = _PARAM_TOL
) -> tuple[float, int]:
    """Largest family parameter refuted by any of the (k, v) pairs at level alpha, and that pair's index.

    Valid for any rule (see :func:`dpaudit.audit.one_run.one_run_epsilon_lower_bound`): a mechanism
    f_t*-DP is f_t-DP for every t ≥ t*, so each rejection at a t ≥ t* is an event of probability ≤ α.
    The returned parameter is always one that was checked to be refuted.
    """
    pairs = sorted({(int(k), int(v)) for k, v in zip(ks, vs, strict=True) if v > 0})

    def first_rejecting(t: float) -> int | None:
        g = family.blowup_inverse(t)
        for k, v in pairs:
            if fdp_rejects(m, k, v, g, alpha):
                return _index_of(ks, vs, k, v)
        return None

    best = first_rejecting(0.0)
    if best is None:
        return 0.0, 0
    bracket = _Bracket(family, tol)
    while (t := bracket.next()) is not None:
        i = first_rejecting(t)
        bracket.record(t, i is not None)
        if i is not None:
            best = i
    return bracket.lo, best


def _index_of(ks, vs, k: int, v: int) -> int:
    return int(np.flatnonzero((np.asarray(ks) == k) & (np.asarray(vs) == v))[0])


# --------------------------------------------------------------------------------------------------
# Designs (same guess-count rules as one_run.py).


@dataclass(frozen=True)
class FdpOutcome:
    parameter: float  # largest refuted family parameter (μ for gdp)
    epsilon: float
    max_parameter: float
    max_certifiable: float
    k_plus: int
    k_minus: int
    guesses: int
    correct: int
    n_eval: int
    alpha_per_test: float
    n_tests: int
    note: str | None
    direction: str = "greater"


def _design_pairs(m: int, selection: str, k_plus, k_minus):
    if selection == "fixed":
        kp, km = k_plus or 0, k_minus or 0
        one_run.check_guess_counts(kp, km, m)
        return np.array([kp]), np.array([km])
    if selection == "bonferroni":
        return one_run.bonferroni_pairs(m)
    return one_run.holdout_perfect_pairs(m)


def max_certifiable(
    m: int, family: TradeoffFamily, delta: float, alpha: float, selection: str, k_plus=None, k_minus=None
):
    """(parameter, ε) a perfect attack (every guess right) would refute under this design."""
    n_eval = m - m // 2 if selection == "holdout" else m
    kp, km = _design_pairs(n_eval, selection, k_plus, k_minus)
    a = alpha / len(kp) if selection == "bonferroni" else alpha
    t, _ = largest_refuted(n_eval, kp + km, kp + km, family, a)
    return t, family.epsilon(t, delta)


def can_refute(
    m: int, family: TradeoffFamily, delta: float, alpha: float, selection: str, epsilon: float, *, tol=_PARAM_TOL
) -> tuple[bool, float]:
    """Whether a perfect attack (every guess right) under this design refutes a curve of ``family`` whose ε at
    ``delta`` exceeds ``epsilon``: the decision ``max_certifiable(...)[1] > epsilon``, reached with as few curves as
    the answer needs (each curve of a DP-SGD family is a PLD composition: at CIFAR scale the full search took minutes
    before training started).

    The refuted parameters form an interval [0, t*] (refuting f_t refutes every f_s, s ≤ t: see
    :func:`largest_refuted`) and ε grows with t, so the search stops at the first refuted t with ε(t) > epsilon
    (True) or the first t not refuted with ε(t) ≤ epsilon (False). Returns the decision and the ε that shows it: a
    refuted curve's ε above ``epsilon`` (True), or an upper bound on the ε the design certifies (False)."""
    n_eval = m - m // 2 if selection == "holdout" else m
    kp, km = _design_pairs(n_eval, selection, None, None)
    a = alpha / len(kp) if selection == "bonferroni" else alpha
    pairs = sorted({int(k) for k in kp + km if k > 0})

    def rejects(t: float) -> bool:
        g = family.blowup_inverse(t)
        return any(fdp_rejects(n_eval, k, k, g, a) for k in pairs)  # a perfect attack: v = k correct

    bracket = _Bracket(family, tol)
    while (t := bracket.next()) is not None:
        refuted = rejects(t)
        bracket.record(t, refuted)
        e = family.epsilon(t, delta)
        if refuted == (e > epsilon):  # refuted above the claim, or not refuted at or below it: decided
            return refuted, e
    # The search ended undecided: every refuted t has ε(t) ≤ epsilon; the design certifies at most ε(hi)
    # (ε(t_max) when even t_max was refuted).
    return False, family.epsilon(bracket.lo if bracket.hi is None else bracket.hi, delta)


def audit(scores, member, *, family: TradeoffFamily, delta: float, alpha: float, selection: str,
          rng: np.random.Generator, k_plus=None, k_minus=None, directions=("greater",)) -> FdpOutcome:  # fmt: skip
    """One-run f-DP bound for canary scores under a design ("fixed", "bonferroni" or "holdout").

    The designs are those of :func:`dpaudit.audit.one_run.audit` (Bonferroni over the pairs fixed by m;
    holdout: guess fractions chosen on a random half with the GDP family, applied to the other half).
    Each direction is audited at ``alpha``; the caller splits α across directions.
    """
    m = len(scores)
    tiebreak, sel = one_run.draw_design(m, selection, rng)
    t_cert, eps_cert = max_certifiable(m, family, delta, alpha, selection, k_plus, k_minus)
    best: FdpOutcome | None = None
    for d in directions:
        s = scores if d == "greater" else -scores
        keys, half = one_run.design_on_records(tiebreak, sel, s, member)
        out = _audit_direction(s, member, family, delta, alpha, selection, keys, half, k_plus, k_minus,
                               t_cert, eps_cert, d)  # fmt: skip
        if best is None or out.parameter > best.parameter:
            best = out
    if best is None:
        raise InputError("need at least one direction")
    return best


def _audit_direction(scores, member, family, delta, alpha, selection, tiebreak, sel, k_plus, k_minus, t_cert,
                     eps_cert, direction) -> FdpOutcome:  # fmt: skip
    m = len(scores)
    if selection in ("fixed", "bonferroni"):
        kp, km = _design_pairs(m, selection, k_plus, k_minus)
        a = alpha / len(kp) if selection == "bonferroni" else alpha  # union bound over the grid m fixes
        top, bottom = one_run.guess_counts(scores, member, tiebreak)
        t, i = largest_refuted(m, kp + km, top[kp] + bottom[km], family, a)
        note = (
            f"guess counts searched over {len(kp)} (k+, k-) pairs; each test at alpha = {a:.3g} (Bonferroni)"
            if selection == "bonferroni"
            else None
        )
        k_p, k_m = int(kp[i]), int(km[i])
        return FdpOutcome(t, family.epsilon(t, delta), t_cert, eps_cert, k_p, k_m, k_p + k_m,
                          int(top[k_p] + bottom[k_m]), m, a, len(kp), note, direction)  # fmt: skip

    def criterion(m_a, kp_a, km_a, correct) -> int:
        # scored with the (cheap, δ-free) GDP family at the reference α of dpaudit.audit.holdout, not the user's
        # ("Level-free selection"): any rule is valid on the selection part
        return largest_refuted(m_a, kp_a + km_a, correct, gdp_family(), SELECTION_ALPHA, tol=1e-2)[1]

    k_p, k_m, v, m_b = select_then_evaluate(
        sel, (scores, member, tiebreak), one_run.choose_guess_fractions(criterion), one_run.apply_guess_fractions
    )
    t, _ = largest_refuted(m_b, [k_p + k_m], [v], family, alpha) if k_p + k_m > 0 else (0.0, 0)
    note = f"guess thresholds chosen on a random half ({m - m_b} canaries) and applied to the other {m_b}"
    return FdpOutcome(t, family.epsilon(t, delta), t_cert, eps_cert, k_p, k_m, k_p + k_m, v, m_b, alpha, 1, note,
                      direction)  # fmt: skip
