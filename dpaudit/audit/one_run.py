"""Auditing with one training run (Steinke, Nasr & Jagielski 2023, arXiv:2305.08846).

Set-up: m canaries, each included in the training data independently with probability 1/2. After
one run the auditor ranks the canaries by score (higher = more likely included), guesses "in" for
the top k₊ and "out" for the bottom k₋ and abstains on the rest: r = k₊ + k₋ guesses of which v
are correct. If the mechanism is (ε, δ)-DP, v is stochastically small:

    P[V ≥ v] ≤ P[Binomial(r, q_ε) ≥ v] + 2mδ · max_{i=1..v} (1/i) P[v − i ≤ Binomial(r, q_ε) < v],
    q_ε = e^ε / (1 + e^ε)

(Theorem 3.1 for δ = 0, and its approximate-DP form with the δ term, Section 5 / Appendix,
computed by their Algorithm 2 ``p_value_DP_audit``). The ε lower bound is the largest ε whose
p-value is ≤ α = 1 − confidence. Everything here is computed exactly from binomial tails in log space.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from dpaudit.audit.holdout import SELECTION_ALPHA, SELECTION_DELTA, on_records, select_then_evaluate, split
from dpaudit.audit.stats import clopper_pearson_lower
from dpaudit.defaults import MIN_HOLDOUT_CANARIES
from dpaudit.errors import InputError
from dpaudit.validation import check_in_interval, check_non_negative, shown

# Width of the exact summation window around the binomial mean, in standard deviations; the mass
# outside it is added back as an upper bound, so the window affects tightness only, never validity.
_WINDOW_SD = 12.0
_ROOT_TOL = 1e-7
# Guess-count choice on a holdout selection half: candidates scored at the reference level of
# dpaudit.audit.holdout (not the user's α and δ), each root search to 1e-3 and at most 16 exact
# evaluations — any rule is valid there, this one is cheap.
_SELECTION_TOL = 1e-3
_SELECTION_EVALUATIONS = 16


def _log_binom_pmf(j: np.ndarray, r: int, q: float) -> np.ndarray:
    # log C(r, j) + j log q + (r − j) log(1 − q), via log-gamma (no overflow for any r).
    return (
        special.gammaln(r + 1.0)
        - special.gammaln(j + 1.0)
        - special.gammaln(r - j + 1.0)
        + j * math.log(q)
        + (r - j) * math.log1p(-q)
    )


# Memoised (exact repeats only: a pure function of its arguments). A root search evaluates its bracket's ends again
# (one_run_epsilon_lower_bound's checks, then brentq's), and audit plan's simulated one-run audits repeat whole
# searches: 37 % of the p-values of 10 simulated audits of 20,000 canaries were repeats (benchmarks/RESULTS.md,
# "audit plan's simulated audits").
_MEMO_SIZE = 1 << 16


@functools.lru_cache(maxsize=_MEMO_SIZE)
def _log_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    if v <= 0:
        return 0.0
    q = float(special.expit(epsilon))  # q_ε = e^ε/(1 + e^ε): accuracy of ε-DP randomised response
    # β = P[Binomial(r, q) ≥ v]  (Steinke et al. 2023, Theorem 3.1). bdtrc has full relative precision
    # down to ~1e-308; a β below that is negligible against any α and the δ term, so −inf is harmless.
    with np.errstate(divide="ignore"):
        log_beta = float(np.log(special.bdtrc(v - 1, r, q)))
    if delta <= 0.0:
        return min(0.0, log_beta)
    sd = math.sqrt(max(r * q * (1.0 - q), 1.0))
    lo = int(min(v, max(0, math.floor(r * q - _WINDOW_SD * sd))))
    # S_i = P[v − i ≤ W < v] for i = 1..v−lo, accumulated from the top in log space.
    log_s = np.logaddexp.accumulate(_log_binom_pmf(np.arange(v - 1, lo - 1, -1, dtype=float), r, q))
    # α = max_i S_i / i  (Steinke et al. 2023, Section 5 / Algorithm 2, the δ term)
    log_alpha = float(np.max(log_s - np.log(np.arange(1, len(log_s) + 1)))) if len(log_s) else -math.inf
    if lo > 0:
        # For i > v − lo: S_i/i ≤ S_{v−lo}/(v−lo) + P[W < lo], so adding that mass keeps an upper bound.
        with np.errstate(divide="ignore"):  # a tail that underflows to 0 adds nothing
            log_alpha = float(np.logaddexp(log_alpha, np.log(special.bdtr(lo - 1, r, q))))
    # p = β + 2mδ·α  (Steinke et al. 2023, approximate-DP theorem of Section 5)
    log_p = float(np.logaddexp(log_beta, log_alpha + math.log(2.0 * m * delta)))
    return min(0.0, log_p)


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Exact p-value of observing ≥ v correct out of r guesses under the (ε, δ)-DP null hypothesis.

    Formal guarantee (Steinke, Nasr & Jagielski 2023, arXiv:2305.08846, Theorem 3.1 and its
    approximate-DP form in Section 5): for any (ε, δ)-DP mechanism and m canaries included
    independently with probability 1/2, P[V ≥ v] ≤ this value.

    Args:
        m: number of canaries (each included independently with probability 1/2).
        r: number of guesses (k₊ + k₋), 0 ≤ r ≤ m.
        v: number of correct guesses, 0 ≤ v ≤ r.
        epsilon: ε ≥ 0 of the null hypothesis.
        delta: δ in [0, 1] of the null hypothesis.
    """
    m, r, v = _check_guess_counts(m, r, v)
    epsilon = check_non_negative(epsilon=epsilon)
    delta = check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=delta)
    return math.exp(_log_p_value(m, r, v, epsilon, delta))


def _check_guess_counts(m, r, v) -> tuple[int, int, int]:
    """(m, r, v) as integers with 0 <= v <= r <= m, else one InputError: counts outside that range are no
    outcome of the one-run game, and a bound computed from them (m below r shrinks the 2mδ term) would
    certify more than the data show."""
    counts = {"m": m, "r": r, "v": v}
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise InputError(f"expected {name} to be an integer count, got {shown(value)}")
    m, r, v = int(m), int(r), int(v)
    if not (0 <= v <= r <= m):
        raise InputError(
            f"need 0 <= v <= r <= m (v correct guesses out of r, among m canaries), got m={m}, r={r}, v={v}"
        )
    return m, r, v


def one_run_pure_epsilon(r, v, alpha):
    """ε lower bound of the pure-DP (δ = 0) one-run test, vectorised.

    P[Binomial(r, q_ε) ≥ v] increases in ε, so the largest ε with p-value ≤ α has q_ε equal to the
    Clopper–Pearson lower bound on the guess accuracy: ε = logit(q_lb) (Steinke et al. 2023,
    Theorem 3.1 with δ = 0). It upper-bounds the δ > 0 bound, whose p-value is larger. Rounded down without
    a margin of its own: q_lb is lowered by ≥ 12 ulps relative (:func:`clopper_pearson_lower`: ≥ 80 for v < r, the
    measured per-trial margin; ≥ 3 (4.5 |ln α|/r + 4) at v = r, the closed form's), which lowers ε by
    ≥ 12·2^-52/(1 − q) = 12 (1 + e^ε)·2^-52 (d logit/dq = 1/(q(1 − q))), while scipy's logit was within
    0.45·(|ε| + 1)·2^-52 of 50-digit mpmath for q in (1/2, 1), below that for every ε ≥ 0 (benchmarks/stats_rounding.py;
    tests/audit/test_stats.py checks the composition, at v = r in the closed forms' test).
    """
    q_lb = clopper_pearson_lower(v, r, alpha)
    with np.errstate(divide="ignore"):
        eps = np.maximum(special.logit(np.maximum(q_lb, 0.5)), 0.0)
    return eps


def one_run_epsilon_lower_bound(m: int, r: int, v: int, delta: float, alpha: float, *, tol: float = _ROOT_TOL) -> float:
    """ε lower bound of the one-run test at level alpha (0 when nothing is rejected).

    Formal guarantee: if the mechanism is (ε*, δ)-DP, the returned value exceeds ε* with probability
    ≤ alpha. Reason: an (ε*, δ)-DP mechanism is (ε', δ)-DP for every ε' ≥ ε*, so
    p̂(ε*; v) = inf_{ε' ≥ ε*} p(ε'; v) also bounds P[V ≥ v] for every v and is a valid p-value;
    any returned ε with p(ε) ≤ alpha and ε > ε* makes p̂(ε*) ≤ alpha. Hence every crossing of the
    p-value with alpha is a valid bound, whether or not the δ term makes p monotone in ε. The crossing
    is found by Brent's method between 0 and the pure-DP bound (where p ≥ β = alpha) and the returned
    point is checked to satisfy p ≤ alpha, with alpha lowered by the float p-value's error bound.
    """
    m, r, v = _check_guess_counts(m, r, v)
    delta = check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=delta)
    alpha = check_in_interval(0.0, 1.0, alpha=alpha)
    return _epsilon_lower_bound(m, r, v, float(delta), float(alpha), float(tol))


@functools.lru_cache(maxsize=_MEMO_SIZE)  # memoised as _log_p_value: checked arguments, a pure function of them
def _epsilon_lower_bound(m: int, r: int, v: int, delta: float, alpha: float, tol: float) -> float:
    if r <= 0 or v <= 0:
        return 0.0
    hi = float(one_run_pure_epsilon(r, v, alpha))
    # The float log p-value (log-gamma terms of size ln Γ(r + 1), bdtrc) fell up to 0.97·2^-52·(ln Γ(r + 1) + r + 4)
    # below 50-digit mpmath (benchmarks/stats_rounding.py, m up to 1e4, δ 1e-8..1e-3): the crossing is taken at
    # α lowered by 16 times that, so that p ≤ α holds for the exact p-value at the returned ε, not only the float one.
    log_a = math.log(alpha) - 16.0 * 2.0**-52 * (math.lgamma(r + 1.0) + r + 4.0)
    if hi <= 0.0 or _log_p_value(m, r, v, 0.0, delta) > log_a:
        return 0.0
    if delta <= 0.0:
        return hi

    def f(e: float) -> float:
        return _log_p_value(m, r, v, e, delta) - log_a

    # f(0) <= 0 < f(hi) (p(hi) >= β(hi) = alpha): Brent's method finds a crossing in a few evaluations. hi is
    # rounded down (one_run_pure_epsilon), so f(hi) <= 0 can happen when the δ term is negligible: then hi itself
    # has p <= alpha and is a valid bound (see above).
    if f(hi) <= 0.0:
        return hi
    x = float(optimize.brentq(f, 0.0, hi, xtol=0.25 * tol * max(1.0, hi), maxiter=200))
    step = tol * max(1.0, x)
    while x > 0.0 and f(x) > 0.0:  # Brent may land just past the crossing: step back inside it
        x = max(0.0, x - step)
        step *= 2.0
    return x


# The relative margin by which a ceiling's p-value bound must exceed α (its float error, bdtr's, is far smaller).
_CEILING_MARGIN = 1e-6


def outcome_p_value_floor(m: int, epsilon: float, delta: float) -> float:
    """A lower bound, over every outcome (r guesses, v correct, 1 <= v <= r <= m), on the p-value at ε of m canaries
    (:func:`one_run_p_value`, whatever the guesses):

        p(ε; r, v) >= max_j min(1, 2mδ/j) · P[Binomial(m, 1 − q_ε) <= j],   j = 0, 1, 2, ...  (the j = 0 weight 1)

    Proof, from the p-value β + 2mδ·max_i S_i/i of Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846, Section 5 /
    Algorithm 2; W ~ Bin(r, q_ε), F = r − W the wrong guesses, e = r − v): β = P[F <= e] and S_i = P[e < F <= e + i].
    For j <= e, p >= β >= P[F <= j]; j = 0 <= e always: p >= P[F <= 0] = q_ε^r >= q_ε^m, the β of all m guesses right,
    which alone caps what m canaries certify when 2mδ is small (δ = 0 included). For e < j <= r, i = j − e is a term: p
    >= P[F <= e] + (2mδ/j)·P[e < F <= j] >= min(1, 2mδ/j)·P[F <= j]. For j > r, i = v gives p >= min(1, 2mδ/r). F ~
    Bin(r, 1 − q) is stochastically below Bin(m, 1 − q) for r <= m, which gives the bound. :func:`_log_p_value` computes
    at least this p-value (its window adds mass). The bound increases with ε (1 − q_ε falls), so where it exceeds α at
    ε, no outcome of m canaries certifies ε or more at level α: a ceiling of the design that no attack, perfect or not,
    passes. Only the j up to 40 standard deviations above the mean are taken (a max over fewer j is still a lower
    bound)."""
    if m < 1:
        return 0.0
    s = float(special.expit(-epsilon))  # 1 − q_ε, the chance of a wrong guess under the null
    mean, sd = m * s, math.sqrt(m * s * (1.0 - s))
    j = np.arange(0, min(m, math.ceil(mean + 40.0 * sd + 40.0)) + 1, dtype=float)
    weight = np.minimum(1.0, 2.0 * m * delta / np.maximum(j, 1.0))
    weight[0] = 1.0  # j = 0: β itself
    return float(np.max(weight * special.bdtr(j, m, s)))


def certifies_beyond(m: int, epsilon: float, delta: float, alpha: float) -> bool:
    """False when no outcome of m canaries can give an ε lower bound (:func:`one_run_epsilon_lower_bound`, level
    ``alpha``) at or above ``epsilon``: :func:`outcome_p_value_floor` exceeds α there (with a relative margin for its
    float error). True does not mean that some outcome does."""
    return outcome_p_value_floor(m, epsilon, delta) <= alpha * (1.0 + _CEILING_MARGIN)


def certifiable_ceiling(m: int, delta: float, alpha: float) -> float:
    """An ε that no outcome of m canaries reaches at level ``alpha`` (:func:`certifies_beyond` false there): the
    upper end of a bisection of :func:`outcome_p_value_floor`, which increases in ε. Finite for every δ, 0 included
    (all m guesses right give at most logit(α^(1/m)): the floor's j = 0 term); inf only for an α within the margin of
    1 (the floor at ε = 1000 is 1)."""
    if certifies_beyond(m, 1e3, delta, alpha):
        return math.inf
    lo, hi = 0.0, 1e3
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if certifies_beyond(m, mid, delta, alpha):
            lo = mid
        else:
            hi = mid
    return hi


def guess_counts(scores: np.ndarray, member: np.ndarray, tiebreak: np.ndarray):
    """Cumulative correct-guess counts: (correct among the top k for every k, among the bottom k).

    Ranks by score (descending) with ties broken by ``tiebreak`` — random keys independent of the
    inclusion bits; breaking ties by position could leak the inclusion bits through the file order.
    """
    order = np.lexsort((tiebreak, -scores))
    ranked = member[order].astype(np.int64)
    top_in = np.concatenate(([0], np.cumsum(ranked)))  # members among the top k
    bottom_out = np.concatenate(([0], np.cumsum(1 - ranked[::-1])))  # non-members among the bottom k
    return top_in, bottom_out


def bonferroni_pairs(m: int) -> tuple[np.ndarray, np.ndarray]:
    """(k₊, k₋) pairs searched under Bonferroni, fixed by m alone before seeing the data.

    k runs over m/2, m/4, ... ≥ 1 (at most 10 values) in three patterns: (k, 0) "in" guesses only,
    (0, k) "out" guesses only and (k, k) both, with k at most floor(m/2) in the last so that every
    canary can be guessed (m = 2935 rounds m/2 up to 1468: a pair (1468, 1468) would need 2936 canaries,
    and dropping it instead took the all-guess test away from every m ≡ 3 mod 4, cutting the most a perfect
    attack certifies at δ = 1e-5 from 4.73 to 4.07). The grid is kept small on purpose: through the δ term
    (Steinke et al. 2023, Section 5) even a perfect attack is capped at roughly ln(α_test / δ), so
    every extra test costs certifiable ε.
    """
    ks = sorted({max(1, round(m / 2**j)) for j in range(1, 11)})
    ks_arr = np.array(ks, dtype=np.int64)
    both = np.unique(np.minimum(ks_arr, m // 2))
    both = both[both > 0]
    # Every pair fits: round(m/2) <= m for m >= 1, and 2 floor(m/2) <= m.
    return np.concatenate([ks_arr, np.zeros_like(ks_arr), both]), np.concatenate([np.zeros_like(ks_arr), ks_arr, both])


def best_bound_over_pairs(
    m: int,
    r: np.ndarray,
    v: np.ndarray,
    delta: float,
    alpha: float,
    *,
    tol: float = _ROOT_TOL,
    max_evaluations: int | None = None,
) -> tuple[float, int]:
    """max over candidate (r, v) pairs of the one-run bound at level alpha, and the arg-max index.

    The pure-DP bound upper-bounds each δ bound, so distinct pairs are visited in decreasing order of
    it and the search stops once no remaining pair can beat the best found. ``tol`` is the relative
    accuracy of each root search; ``max_evaluations`` caps the exact evaluations (a heuristic for
    choosing a pair on a selection half, where any rule is valid; never for a reported bound).
    """
    r, v = np.asarray(r, np.int64), np.asarray(v, np.int64)
    pure = one_run_pure_epsilon(r, v, alpha)
    best, best_i = 0.0, int(np.argmax(pure)) if len(pure) else 0
    seen: set[tuple[int, int]] = set()
    for i in np.argsort(-pure, kind="stable"):
        if pure[i] <= best or (max_evaluations is not None and len(seen) >= max_evaluations):
            break
        if (int(r[i]), int(v[i])) in seen:
            continue
        seen.add((int(r[i]), int(v[i])))
        e = one_run_epsilon_lower_bound(m, int(r[i]), int(v[i]), delta, alpha, tol=tol)
        if e > best:
            best, best_i = e, int(i)
    return best, best_i


# --------------------------------------------------------------------------------------------------
# Designs: fixed guess counts, a Bonferroni-corrected search, or a holdout choice.


@dataclass(frozen=True)
class OneRunOutcome:
    epsilon: float
    max_certifiable: float
    k_plus: int
    k_minus: int
    guesses: int
    correct: int
    n_eval: int  # canaries the bound was computed on
    alpha_per_test: float
    n_tests: int
    note: str | None
    direction: str = "greater"  # "less": the ranking by negated score won


def check_guess_counts(k_plus: int, k_minus: int, m: int) -> None:
    if k_plus + k_minus < 1:
        raise InputError("k_plus + k_minus must be at least 1")
    if k_plus + k_minus > m:
        raise InputError(f"k_plus + k_minus must be at most the number of canaries ({m}), got {k_plus + k_minus}")


def _fraction_pairs() -> tuple[np.ndarray, np.ndarray]:
    """Guess fractions (f₊, f₋) tried on a holdout selection half: each 0 or 2^-j, j = 1..10."""
    f = np.concatenate(([0.0], 2.0 ** -np.arange(1, 11)))
    fp, fm = (a.ravel() for a in np.meshgrid(f, f, indexing="ij"))
    keep = (fp + fm) > 0
    return fp[keep], fm[keep]


def _fractions_to_counts(fp: np.ndarray, fm: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    return np.floor(fp * m).astype(np.int64), np.floor(fm * m).astype(np.int64)


def max_certifiable(m: int, delta: float, alpha: float, selection: str, k_plus=None, k_minus=None) -> float:
    """The bound of a perfect attack (every guess right) under a design; m canaries in all."""
    if selection == "fixed":
        kp, km = k_plus or 0, k_minus or 0
        check_guess_counts(kp, km, m)
        return one_run_epsilon_lower_bound(m, kp + km, kp + km, delta, alpha)
    if selection == "bonferroni":
        kp, km = bonferroni_pairs(m)
        return best_bound_over_pairs(m, kp + km, kp + km, delta, alpha / len(kp))[0]
    m_eval = m - m // 2  # the holdout split keeps floor(m/2) for selection
    kp, km = holdout_perfect_pairs(m_eval)
    return best_bound_over_pairs(m_eval, kp + km, kp + km, delta, alpha)[0]


def holdout_perfect_pairs(m_eval: int) -> tuple[np.ndarray, np.ndarray]:
    """(k₊, k₋) a perfect attack can reach on a holdout evaluation half of m_eval canaries: the thresholds of
    :func:`choose_guess_fractions` can guess any number of them, all when the selection half's members are exactly
    half of it; the grid's counts on m_eval (all but one when m_eval is odd) and every canary (m_eval, 0)."""
    kp, km = _fractions_to_counts(*_fraction_pairs(), m_eval)
    return np.append(kp, m_eval), np.append(km, 0)


def check_inclusion_mixed(included, source: str, remedy: str) -> None:
    """Refuse canaries whose inclusion bits are all 1 or all 0 (fair coins do that with probability 2^(1−m)):
    the one-run holdout design needs both (audit_scores would say "member has a single class", not why)."""
    n_in, m = int(np.sum(included)), len(included)
    if n_in in (0, m):
        raise InputError(
            f"{source}: {n_in} of {m} canaries are included: the one-run audit needs included and excluded ones, "
            f"each included independently with probability 1/2 (fair coins give all or none with probability "
            f"{2.0 ** (1 - m):.2g}); {remedy}"
        )


def draw_design(m: int, selection: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """The design's randomness, drawn once before any direction is looked at: tie-breaking keys, and for
    "holdout" the selection half (a random half of the canaries, not stratified, so the other half's inclusion
    bits stay i.i.d. fair coins). Both per position of the canonical order: each direction lays them onto the
    canaries with :func:`dpaudit.audit.holdout.on_records`, so the result does not depend on the canaries'
    order (valid as per-position draws are: dpaudit.audit.holdout, "Record order")."""
    tiebreak = rng.random(m)
    if selection != "holdout":
        return tiebreak, None
    if m < MIN_HOLDOUT_CANARIES:
        raise InputError(f"holdout guess-count selection needs at least {MIN_HOLDOUT_CANARIES} canaries, got {m}")
    return tiebreak, split(np.zeros(m, dtype=bool), rng, stratified=False)  # the bits are not looked at


def design_on_records(tiebreak: np.ndarray, sel: np.ndarray | None, scores: np.ndarray, member: np.ndarray):
    """:func:`draw_design`'s keys and split (per canonical position) laid onto the canaries ranked by ``scores``."""
    keys = on_records(tiebreak, scores, member)
    return keys, None if sel is None else on_records(sel, scores, member)


def choose_guess_fractions(criterion: Callable[[int, np.ndarray, np.ndarray, np.ndarray], int]):
    """A chooser for :func:`dpaudit.audit.holdout.select_then_evaluate`, shared by the (ε, δ) and f-DP
    one-run audits: on the selection part (scores, member bits, tie-breaking keys) it picks the guess fractions
    (f₊, f₋) of :func:`_fraction_pairs` whose counts there maximise ``criterion(m_part, k_plus, k_minus, correct)
    -> index`` and returns them as score thresholds: the (score, key) of the selection part's (k₊ + 1)-th canary from
    the top and (k₋ + 1)-th from the bottom (None for a count of 0), which :func:`apply_guess_fractions` compares
    the evaluation part with. Thresholds, not counts: a count floor(f·m_part) on the evaluation half ignores its own
    number of members (a Binomial(m/2, 1/2), sd √m/4), so a perfect attack guessing "in" for the top half there made
    |members − m_part/2| errors; a threshold follows the scores (benchmarks/one_run_power.py). Any rule that reads
    the selection part alone keeps the level (:mod:`dpaudit.audit.holdout`, step 2: the guesses are then a function
    of the output's evaluation scores, the selection part and the independent keys)."""

    def choose(scores: np.ndarray, member: np.ndarray, tiebreak: np.ndarray):
        fp, fm = _fraction_pairs()
        kp, km = _fractions_to_counts(fp, fm, len(scores))
        top, bottom = guess_counts(scores, member, tiebreak)
        i = criterion(len(scores), kp, km, top[kp] + bottom[km])
        order = np.lexsort((tiebreak, -scores))  # guess_counts' ranking: score descending, then key ascending

        def at(k: int, rank: int):  # the ranking's (rank + 1)-th canary, or None for no guesses (k = 0) on that side
            return None if k == 0 else (float(scores[order[rank]]), float(tiebreak[order[rank]]))

        return at(int(kp[i]), int(kp[i])), at(int(km[i]), len(scores) - 1 - int(km[i]))

    return choose


def apply_guess_fractions(thresholds, scores: np.ndarray, member: np.ndarray, tiebreak: np.ndarray):
    """(k₊, k₋, correct, m_part) of :func:`choose_guess_fractions`' thresholds on the evaluation part: "in" for the
    canaries ranked above the top threshold (higher score, or the same score and a smaller key: guess_counts'
    order), "out" for those ranked below the bottom one; a canary that is both (the thresholds cross when
    k₊ + k₋ = m_part on the selection part) is guessed "in"."""
    m_part = len(scores)
    hi, lo = thresholds
    kp = 0 if hi is None else int(np.sum((scores > hi[0]) | ((scores == hi[0]) & (tiebreak < hi[1]))))
    km = 0 if lo is None else int(np.sum((scores < lo[0]) | ((scores == lo[0]) & (tiebreak > lo[1]))))
    km = min(km, m_part - kp)
    top, bottom = guess_counts(scores, member, tiebreak)
    return kp, km, int(top[kp] + bottom[km]), m_part


def audit(
    scores: np.ndarray,
    member: np.ndarray,
    *,
    delta: float,
    alpha: float,
    selection: str,
    rng: np.random.Generator,
    k_plus: int | None = None,
    k_minus: int | None = None,
    directions: tuple[str, ...] = ("greater",),
) -> OneRunOutcome:
    """One-run bound for canary scores under a design ("fixed", "bonferroni" or "holdout").

    fixed: the given (k₊, k₋) at level α. bonferroni: the best of :func:`bonferroni_pairs` with α
    split equally (union bound). holdout: (k₊, k₋) fractions chosen on a random half of the canaries
    (not stratified, so the other half's inclusion bits stay i.i.d. fair coins), turned into score thresholds
    there (:func:`choose_guess_fractions`) and applied to the other half at level α; the theorem applies to that
    half with the first half's bits held fixed.

    ``directions``: "greater" ranks by score (higher = more likely included), "less" by the negated
    score. Each direction is audited at ``alpha`` with the same tie-breaking keys and holdout split, drawn
    on the canonical order (:func:`draw_design`) and laid onto the canaries by its oriented scores,
    and the larger bound is returned; the caller splits α across directions (a two-sided audit
    passes α/2 and both directions).
    """
    m = len(scores)
    tiebreak, sel = draw_design(m, selection, rng)
    mcert = max_certifiable(m, delta, alpha, selection, k_plus, k_minus)
    best: OneRunOutcome | None = None
    for d in directions:
        s = scores if d == "greater" else -scores
        out = _audit_direction(s, member, delta, alpha, selection, *design_on_records(tiebreak, sel, s, member),
                               k_plus, k_minus, mcert, d)  # fmt: skip
        if best is None or out.epsilon > best.epsilon:
            best = out
    if best is None:
        raise InputError("need at least one direction")
    return best


def _audit_direction(scores, member, delta, alpha, selection, tiebreak, sel, k_plus, k_minus, mcert, direction):
    m = len(scores)
    if selection == "fixed":
        kp, km = k_plus or 0, k_minus or 0
        check_guess_counts(kp, km, m)
        top, bottom = guess_counts(scores, member, tiebreak)
        r, v = kp + km, int(top[kp] + bottom[km])
        eps = one_run_epsilon_lower_bound(m, r, v, delta, alpha)
        return OneRunOutcome(eps, mcert, kp, km, r, v, m, alpha, 1, None, direction)
    if selection == "bonferroni":
        kp_grid, km_grid = bonferroni_pairs(m)
        a = alpha / len(kp_grid)  # union bound over the grid, which m alone fixes
        top, bottom = guess_counts(scores, member, tiebreak)
        eps, i = best_bound_over_pairs(m, kp_grid + km_grid, top[kp_grid] + bottom[km_grid], delta, a)
        kp, km = int(kp_grid[i]), int(km_grid[i])
        note = f"guess counts searched over {len(kp_grid)} (k+, k-) pairs; each test at alpha = {a:.3g} (Bonferroni)"
        r, v = kp + km, int(top[kp] + bottom[km])
        return OneRunOutcome(eps, mcert, kp, km, r, v, m, a, len(kp_grid), note, direction)

    def criterion(m_a, kp_a, km_a, correct) -> int:
        return best_bound_over_pairs(
            m_a, kp_a + km_a, correct, SELECTION_DELTA, SELECTION_ALPHA, tol=_SELECTION_TOL,
            max_evaluations=_SELECTION_EVALUATIONS,
        )[1]  # fmt: skip

    kp, km, v, m_b = select_then_evaluate(
        sel, (scores, member, tiebreak), choose_guess_fractions(criterion), apply_guess_fractions
    )
    r = kp + km
    eps = one_run_epsilon_lower_bound(m_b, r, v, delta, alpha)
    note = f"guess thresholds chosen on a random half ({m - m_b} canaries) and applied to the other {m_b}"
    return OneRunOutcome(eps, mcert, kp, km, r, v, m_b, alpha, 1, note, direction)
