"""Power of an audit design against a hypothesised leak, by simulating the audit itself.

The perfect-attack size (:func:`dpaudit.audit.trials_needed`) says when a design *could* refute a
claim; it is a lower bound and can be far from what a real audit needs (a real attack errs, and a
one-run design's inclusion is random). Here the question is the one a user plans with: if the
mechanism leaks like a stated hypothesis, how often does this exact audit refute the claim, and how
large must the design be for that to happen with probability ``power``?

The hypothesised leak is a pair of score distributions (runs with / without the record, or included /
excluded canaries), the scores being the likelihood-ratio statistic of the family, so the simulated
attack is the strongest one against that hypothesis:

* ``"gaussian"`` — member scores N(μ, 1), non-member scores N(0, 1): exactly μ-GDP (Dong, Roth & Su
  2022, arXiv:1905.02383, Def. 2.1 and Thm. 2.7), the trade-off of the Gaussian mechanism and,
  asymptotically, of DP-SGD (their Thm. 3.5). Given as μ, or as ε at the audit's δ
  (μ solving ε(δ) of Cor. 2.13 of the same paper).
* ``"randomized-response"`` — one bit, reported truthfully with probability e^ε/(1 + e^ε): exactly
  (ε, 0)-DP (Kairouz, Oh & Viswanath 2015, the extremal (ε, 0) mechanism).

One simulation draws the member bits as the design does — n runs per side for the multi-run methods,
m canaries each included independently with probability 1/2 for the one-run methods — then the
scores, then runs :func:`dpaudit.audit.audit_scores` with the audit's own settings (method, δ,
confidence, threshold or guess-count selection, direction, trade-off family, the holdout split and
its seed); "refuted" means the audit's bound exceeds the claim (verdict "violation",
"curve-refuted" or "estimate-exceeds-claim"). The power estimate is the fraction of ``simulations``
draws refuted (its standard error is at most 0.5/√simulations; 0.028 near 0.8 with 200 draws).

:func:`size_for_power` searches the smallest size whose simulated power reaches the target, deciding
on a conservative rule, never on the point estimate: a size is enough when the lower end of the power's
Clopper-Pearson interval (:func:`power_interval`, at the audit's confidence) reaches the target, i.e.
when at least :func:`refutations_needed` of the draws refute the claim (172 of 200 for power 0.8 at 95%).
It searches from the
perfect-attack size (below it the power is 0), doubling, then narrowing the bracket to within 5% of
the size, alternating bisection with a secant step on Φ⁻¹(power) against √size (the normal
approximation of a test whose statistic's mean grows with √n; it only proposes the next size, the
simulation decides). Every size reuses the same seeds (common random numbers), so the estimated power
curve is smooth in the size and the search is reproducible.

Before simulating, a formal audit's power is bounded without simulation (:func:`power_upper_bound`): it is a
level-α test of the claim, so at most as powerful as the Neyman-Pearson test of a mechanism meeting the claim
against the leak. A leak even that test cannot detect within ``max_size`` is refused at once (a leak a hair
above the claim used to be simulated at every doubling up to the cap, for minutes), and a size where that
test falls short is never simulated (read as power 0) nor returned. With holdout selection the bound is taken on
the evaluation part, the half the audit tests on (:func:`power_upper_bound`).

The one-run (ε, δ) audit also has a ceiling that no attack passes: past some size its δ term (2mδ, Steinke, Nasr &
Jagielski 2023, Section 5), and below some size its binomial term (all guesses right: p >= q_ε^m), keeps every outcome's
bound below the claim (:func:`dpaudit.audit.one_run.certifiable_ceiling`). A size where the ceiling is at most the claim
is not simulated either: every draw would read "not refuted", so its power is exactly 0, the value read; a cap past it
is refused naming the ceiling there (``audit plan --method one-run --epsilon 8`` simulated the 10^6 cap for minutes to
find what its ceiling, 7.989 < 8, already says).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from dpaudit import numfmt
from dpaudit.accounting.gdp import gdp_epsilon, gdp_mu_from_epsilon_delta
from dpaudit.audit.result import ESTIMATE_REFUTATIONS, FORMAL_REFUTATIONS
from dpaudit.defaults import MAX_SIMULATED_SIZE
from dpaudit.errors import InputError
from dpaudit.validation import check_choice, check_in_interval, check_non_negative, check_positive_int

FAMILIES: tuple[str, ...] = ("gaussian", "randomized-response")
ONE_RUN_METHODS: tuple[str, ...] = ("one-run", "one-run-fdp")
# The alternative when none is stated (audit plan, assert_dp's power check, the train refusals): a leak
# of twice the claimed ε by randomized response — the most detectable (ε, 0)-DP mechanism (its trade-off
# curve is the extremal (ε, 0) curve, Kairouz, Oh & Viswanath 2015, Thm. 2.1; every ε-DP mechanism's
# curve lies above it), so a design without power against it has none against any (2ε, 0)-DP leak. A
# gaussian leak of the same ε(δ) at small δ needs far more (hundreds of times, e.g. 41 052 vs 170 runs
# per side for a claim of 2 at δ = 1e-5, simulated): ask for it with family="gaussian".
DEFAULT_ALTERNATIVE_FACTOR = 2.0
DEFAULT_ALTERNATIVE_FAMILY = "randomized-response"
DEFAULT_SIMULATIONS = 200
DEFAULT_POWER = 0.8
# Bisection stops once the bracket is within this fraction of the size (the power estimate's own
# noise makes a finer answer meaningless).
_SIZE_RTOL = 0.05
# A size from which each simulation is announced (one line on stderr; under the CLI, silent with --quiet): 200 audits
# of 10^5 runs per side take about a minute here, and the search near the 10^6 cap several such sizes.
_ANNOUNCE_SIZE = 100_000
# Records from which a simulated draw is passed to the audit in the canonical order: below about 1000 runs per side
# the rearrangement cost as much as the sorts it saves (CPU time, benchmarks/audit_plan_speed.py).
_REARRANGE_RECORDS = 2000
_SEED_SALT = 0x9057  # simulation streams differ from every other use of the same integer seed


@dataclass(frozen=True)
class Leak:
    """A hypothesised mechanism: the score distributions of runs with and without the record.

    Attributes:
        family: "gaussian" (μ-GDP) or "randomized-response" ((ε, 0)-DP).
        epsilon: its ε at ``delta`` (natural log).
        delta: the δ at which ``epsilon`` is stated.
        mu: μ of the gaussian family (None for randomized response).
    """

    family: str
    epsilon: float
    delta: float
    mu: float | None = None

    def sample(self, member: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Scores (higher = member) for the given member bits."""
        if self.family == "gaussian":
            return rng.normal(0.0, 1.0, len(member)) + self.mu * member
        truthful = rng.random(len(member)) < special.expit(self.epsilon)  # e^ε/(1 + e^ε)
        return np.where(truthful, member, ~member).astype(float)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "epsilon": self.epsilon, "delta": self.delta, "mu": self.mu}

    def describe(self) -> str:
        if self.family == "gaussian":
            # A hypothesised leak: a parameter, not a bound, so to nearest (dpaudit.numfmt.nearest).
            eps, delta = numfmt.nearest(self.epsilon, 4), numfmt.exact(self.delta)
            return f"gaussian leak mu = {self.mu:.4g} (epsilon {eps} at delta {delta})"
        return f"randomized response at epsilon = {numfmt.nearest(self.epsilon, 4)} (exactly (epsilon, 0)-DP)"


def hypothesised_leak(
    *, family: str = "gaussian", epsilon: float | None = None, mu: float | None = None, delta: float = 1e-5
) -> Leak:
    """The leak to plan against: ``epsilon`` (at ``delta``) or, for the gaussian family, ``mu``."""
    family = check_choice(FAMILIES, family=family)
    delta = check_in_interval(0.0, 1.0, lo_open=False, delta=delta)
    if (epsilon is None) == (mu is None):
        raise InputError("give the hypothesised leak as exactly one of epsilon (true epsilon) and mu")
    if family == "randomized-response":
        if mu is not None:
            raise InputError("the randomized-response family is given by its epsilon, not mu")
        eps = check_non_negative(true_epsilon=epsilon)
        if math.isinf(eps):
            raise InputError("expected a finite true epsilon")
        return Leak(family, float(eps), float(delta))
    if delta == 0.0:
        raise InputError("the gaussian family needs delta > 0 (a mu-GDP mechanism with mu > 0 has epsilon = inf)")
    if mu is not None:
        mu = check_in_interval(0.0, math.inf, lo_open=False, mu=mu)
        return Leak(family, float(gdp_epsilon(mu, delta)), float(delta), float(mu))
    eps = check_non_negative(true_epsilon=epsilon)
    if math.isinf(eps):
        raise InputError("expected a finite true epsilon")
    return Leak(family, float(eps), float(delta), float(gdp_mu_from_epsilon_delta(eps, delta)))


def _draw(leak: Leak, size: int, one_run: bool, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if one_run:
        member = rng.random(size) < 0.5  # each canary included independently with probability 1/2
    else:
        member = np.r_[np.ones(size, bool), np.zeros(size, bool)]
    return leak.sample(member, rng), member


def power_interval(refuted: int, simulations: int, confidence: float) -> tuple[float, float]:
    """Two-sided confidence interval, at ``confidence``, on the power estimated as ``refuted / simulations``.

    The draws are independent, so ``refuted`` ~ Binomial(simulations, power): the exact interval of
    Clopper & Pearson (1934), Biometrika 26(4), α/2 on each side (dpaudit.audit.stats).
    """
    from dpaudit.audit.stats import clopper_pearson_lower, clopper_pearson_upper

    alpha = (1.0 - check_in_interval(0.0, 1.0, confidence=confidence)) / 2.0
    return float(clopper_pearson_lower(refuted, simulations, alpha)), float(
        clopper_pearson_upper(refuted, simulations, alpha)
    )


def simulations_needed(power: float, confidence: float) -> int:
    """The fewest simulations that can show power ≥ ``power`` at ``confidence`` at all: with all S draws refuted
    the lower end of :func:`power_interval` is ((1 − confidence)/2)^(1/S) (Clopper & Pearson 1934), which must
    reach ``power``: S ≥ log((1 − confidence)/2) / log(power)."""
    from dpaudit.audit.stats import clopper_pearson_lower

    power = check_in_interval(0.0, 1.0, power=power)
    alpha = (1.0 - check_in_interval(0.0, 1.0, confidence=confidence)) / 2.0  # as power_interval
    need = max(1, math.ceil(math.log(alpha) / math.log(power)) - 1)
    while clopper_pearson_lower(need, need, alpha) < power:  # the rounding, checked on the bound itself
        need += 1
    return need


def refutations_needed(power: float, simulations: int, confidence: float) -> int:
    """The fewest of ``simulations`` draws that must refute the claim for the power to be shown ≥ ``power``:
    the smallest k whose :func:`power_interval` at ``confidence`` has its lower end at or above ``power``.

    Raises InputError when even k = ``simulations`` is not enough, naming :func:`simulations_needed`.
    """
    from dpaudit.audit.stats import clopper_pearson_lower

    power = check_in_interval(0.0, 1.0, power=power)
    simulations = check_positive_int(simulations=simulations)
    alpha = (1.0 - check_in_interval(0.0, 1.0, confidence=confidence)) / 2.0  # as power_interval
    lows = np.asarray(clopper_pearson_lower(np.arange(simulations + 1), simulations, alpha))
    (enough,) = np.nonzero(lows >= power)
    if len(enough):
        return int(enough[0])
    need = simulations_needed(power, confidence)
    raise InputError(
        f"expected simulations >= {need} to show power {power:g} at confidence {confidence:g}, got {simulations} "
        f"(even {simulations} of {simulations} draws refuted give a power lower bound of "
        f"{numfmt.lower(float(lows[-1]), 2)})"
    )


def _np_power(n: int, claimed_epsilon: float, leak: Leak, one_run: bool, alpha: float, delta: float) -> float:
    """Power of the most powerful level-``alpha`` test of a mechanism meeting the claim against ``leak`` (see
    :func:`power_upper_bound`), with ``n`` runs per side (``one_run``: n canaries)."""
    from scipy import stats

    if leak.family == "gaussian":
        # Null: the μ0-GDP gaussian mechanism at the claim's (ε, δ) (Dong, Roth & Su 2022, Cor. 2.13). Only
        # members' scores differ between null and leak, N(μ0, 1) against N(μ, 1): the most powerful test
        # (Neyman & Pearson 1933) thresholds their sum, power Φ(√k·(μ − μ0) − z_{1−α}) with k members. One-run:
        # k ~ Bin(m, 1/2) is ancillary, so the best test spends α_k per k; k ≤ m and the concavity of
        # a ↦ Φ(c − z_{1−a}) (Jensen) bound its power by the k = m value.
        mu0 = gdp_mu_from_epsilon_delta(claimed_epsilon, delta) * (1.0 - 1e-9)  # root tolerance, to the safe side
        return float(special.ndtr(math.sqrt(n) * (leak.mu - mu0) - special.ndtri(1.0 - alpha)))
    # Null: randomized response at the claimed ε, (ε, 0)-DP (Kairouz, Oh & Viswanath 2015). Each record's bit
    # is "correct" (= its membership) with probability p = e^ε/(1 + e^ε), independently, so the number correct,
    # T ~ Bin(N, p) with N = 2n records (one-run: m canaries), is sufficient; the most powerful level-α test
    # rejects for T > c and with probability γ at T = c (Neyman & Pearson 1933, randomized).
    big_n = n if one_run else 2 * n
    p0, p1 = special.expit(claimed_epsilon), special.expit(leak.epsilon)
    c = int(stats.binom.isf(alpha, big_n, p0))  # smallest c with P0(T > c) <= α (checked below)
    while stats.binom.sf(c, big_n, p0) > alpha:
        c += 1
    while c > 0 and stats.binom.sf(c - 1, big_n, p0) <= alpha:
        c -= 1
    at_c = stats.binom.pmf(c, big_n, p0)
    gamma = (alpha - stats.binom.sf(c, big_n, p0)) / at_c if at_c > 0 else 0.0
    return float(min(1.0, stats.binom.sf(c, big_n, p1) + gamma * stats.binom.pmf(c, big_n, p1)))


def power_upper_bound(size: int, claimed_epsilon: float, leak: Leak, **audit: Any) -> float | None:
    """An upper bound on the power of the audit (``audit``: as for :func:`simulated_power`) at ``size``, without
    simulating: the power of the most powerful test at level α = 1 − confidence (Neyman & Pearson 1933) of a
    mechanism that meets the claim — of ``leak``'s family, at the claimed ε (δ) — against ``leak``. A formal
    audit refutes a mechanism meeting its claim with probability at most α (:func:`dpaudit.audit.audit_scores`),
    so it is such a test and its power is at most this. The bound is nondecreasing in ``size`` (a test on more
    draws may ignore some), so a bound below the target at one size rules out every smaller size.

    With holdout selection (audit_scores' default) the test reads only the evaluation part, the ``size - size // 2``
    runs per side (canaries) that :func:`dpaudit.audit.holdout.split` leaves: given the selection part it is a
    level-α test on those (dpaudit.audit.holdout, "Why this keeps the level"), whose scores are independent of the
    selection part's here, so its power is at most the most powerful test's on them (and averaging over the
    selection part keeps that). This halves the size the bound allows: against a leak of 2.01 for a claim of 2 it
    ruled out 483,328 runs per side, which the search had simulated (minutes) only to find power 0.5.

    None for an audit that gives an estimate (method gdp; one-run-fdp with any trade-off family but
    "epsilon-delta", whose claim is a curve or whose ε assumes a shape): no level holds for those."""
    from dpaudit.audit.result import is_formal

    method = audit.get("method", "clopper-pearson")
    one_run = method in ONE_RUN_METHODS
    if not is_formal(method, "canaries" if one_run else "multi-run"):
        return None
    if method == "one-run-fdp" and audit.get("tradeoff", "gdp") != "epsilon-delta":  # audit_scores' default: gdp
        return None
    alpha = 1.0 - audit.get("confidence", 0.95)
    size = int(size)
    if audit.get("threshold_selection", "holdout") == "holdout":
        size -= size // 2  # the evaluation part
    return _np_power(size, float(claimed_epsilon), leak, one_run, alpha, audit.get("delta", 1e-5))


def _one_run_ceiling(size: int, claimed_epsilon: float, **audit: Any) -> float | None:
    """For the one-run (ε, δ) audit (``audit``: as for :func:`simulated_power`) of ``size`` canaries, an ε that no
    outcome reaches, perfect attack or not (:func:`dpaudit.audit.one_run.certifiable_ceiling`), when it is at most
    ``claimed_epsilon``: then every simulated draw reads "not refuted" and the simulation's power is exactly 0. None
    otherwise, and for every other method. The bound is on the canaries the audit computes on (holdout: the
    evaluation part, ``size - size // 2``) at the level each of its tests runs at (α/2 per direction when
    two-sided; Bonferroni: α over the guess-count grid), as :func:`dpaudit.audit.audit_scores` does."""
    if audit.get("method", "clopper-pearson") != "one-run":
        return None
    from dpaudit.audit import one_run
    from dpaudit.audit.bounds import _alpha, _direction_alpha

    alpha = _direction_alpha(_alpha(audit.get("confidence", 0.95)), audit.get("alternative", "greater"))
    m, delta = int(size), audit.get("delta", 1e-5)
    selection = audit.get("threshold_selection", "holdout")
    if selection == "holdout":
        m -= m // 2
    elif selection == "bonferroni":
        alpha /= len(one_run.bonferroni_pairs(m)[0])
    if one_run.certifies_beyond(m, float(claimed_epsilon), delta, alpha):
        return None
    return one_run.certifiable_ceiling(m, delta, alpha)


def _leak_needed(claimed_epsilon: float, leak: Leak, size: int, power: float, **audit: Any) -> float:
    """The smallest ε of ``leak``'s family (at its δ) whose :func:`power_upper_bound` at ``size`` reaches
    ``power``: a necessary condition on a plannable leak (bisection; the bound increases with the leak)."""

    def leak_at(eps: float) -> Leak:
        return hypothesised_leak(family=leak.family, epsilon=eps, delta=leak.delta)

    lo, hi = float(claimed_epsilon), max(2.0 * leak.epsilon, leak.epsilon + 1.0)
    while power_upper_bound(size, claimed_epsilon, leak_at(hi), **audit) < power:
        if hi > 1e6:  # no leak of the family is plannable: the bound saturates below power (a few runs); doubling
            return math.inf  # on reached an infinite epsilon, refused as "expected a finite true epsilon"
        lo, hi = hi, 2.0 * hi
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if power_upper_bound(size, claimed_epsilon, leak_at(mid), **audit) >= power:
            hi = mid
        else:
            lo = mid
    return lo  # below it the bound stays under power: every leak of at most lo is out of reach


def simulated_power(
    size: int,
    claimed_epsilon: float,
    leak: Leak,
    *,
    simulations: int = DEFAULT_SIMULATIONS,
    seed: int = 0,
    **audit: Any,
) -> float:
    """Fraction of ``simulations`` draws of ``leak`` on which the audit refutes ``claimed_epsilon``.

    ``size``: runs per side (multi-run methods) or canaries (one-run methods). ``audit``: the keyword
    arguments of :func:`dpaudit.audit.audit_scores` (method, delta, confidence, threshold_selection,
    alternative, tradeoff); the design is "multi-run" or "canaries" by the method. Draw i uses the
    seeds (seed, i) whatever the size (common random numbers).
    """
    size = check_positive_int(size=size)
    simulations = check_positive_int(simulations=simulations)
    return _simulate(size, claimed_epsilon, leak, simulations=simulations, seed=seed, **audit)[0] / simulations


def _simulate(
    size: int, claimed_epsilon: float, leak: Leak, *, simulations: int, seed: int, stop_below: int = 0, **audit: Any
) -> tuple[int, int]:
    """:func:`simulated_power`'s draws, as (refuted, drawn): all ``simulations`` of them, or fewer where the count
    can no longer reach ``stop_below`` (refuted + the draws left < ``stop_below``): the draws done are the first ones
    of the full simulation (common random numbers), so "fewer than ``stop_below`` of ``simulations``" is decided as
    the full simulation decides it."""
    from dpaudit.audit.bounds import audit_scores
    from dpaudit.audit.holdout import in_canonical_order

    one_run = audit.get("method", "clopper-pearson") in ONE_RUN_METHODS
    design = "canaries" if one_run else "multi-run"
    refuted = 0
    for i in range(simulations):
        if refuted + simulations - i < stop_below:
            return refuted, i
        rng = np.random.default_rng([int(seed), i, _SEED_SALT])
        scores, member = _draw(leak, size, one_run, rng)
        if one_run and (member.all() or not member.any()):
            continue  # a one-class draw cannot be audited: counted as not refuted
        # The audit reads the multiset of (score, member) pairs only (dpaudit.audit.holdout, "Record order"): in
        # the canonical order its sorts find the records sorted (the same result, in less time where sorting costs).
        if len(member) >= _REARRANGE_RECORDS:
            scores, member = in_canonical_order(scores, member)
        r = audit_scores(scores, member, claimed_epsilon=claimed_epsilon, design=design, seed=i, **audit)
        refuted += r.verdict in (*FORMAL_REFUTATIONS, *ESTIMATE_REFUTATIONS)
    return refuted, simulations


def _simulated_text(n: int, unit: str, refuted: int, drawn: int, simulations: int, k_needed: int) -> str:
    """What the simulation at size ``n`` showed: ``refuted`` of ``drawn`` draws, all ``simulations`` or the first
    ones where the rest could not reach ``k_needed`` (:func:`_simulate`'s early stop)."""
    if drawn == simulations:
        return (
            f"simulated power at {n} {unit} {refuted / simulations:.2f} (the simulated audit refuted the claim in "
            f"{refuted} of {simulations} draws, {k_needed} needed)"
        )
    return (
        f"at {n} {unit} the simulated audit refuted the claim in {refuted} of the first {drawn} of {simulations} "
        f"draws, so in at most {refuted + simulations - drawn}, {k_needed} needed (the rest were not simulated)"
    )


def _ceiling_refusal(
    claimed: float,
    leak: Leak,
    power: float,
    max_size: int,
    ceiling: float,
    simulated: dict[int, tuple[int, int]],
    simulations: int,
    k_needed: int,
    delta: float,
) -> str:
    """size_for_power's refusal where the one-run audit's ceiling at ``max_size`` is at most the claim: that ceiling,
    and the simulated power at the largest size simulated (``simulated``: size -> (refuted, drawn)), if any."""
    most, claim = numfmt.ordered(ceiling, claimed, left_digits=4, left_up=True)  # "at most 7.989" below "8"
    text = (
        f"no design up to {max_size} canaries is shown to reach power {power:g} against "
        f"{leak.describe()}: at {max_size} canaries no one-run audit certifies epsilon {claim} whatever its guesses "
        f"(at most {most} at delta {numfmt.exact(delta)}: the p-value of Steinke et al. 2023 caps it, its "
        "2*m*delta term or, with all guesses right, its binomial term)"
    )
    if simulated:
        n = max(simulated)
        text += "; " + _simulated_text(n, "canaries", *simulated[n], simulations, k_needed)
    return text + "; lower the claim, or audit independent runs instead (clopper-pearson, design multi-run)"


def size_for_power(
    claimed_epsilon: float,
    leak: Leak,
    *,
    power: float = DEFAULT_POWER,
    start: int = 1,
    simulations: int = DEFAULT_SIMULATIONS,
    seed: int = 0,
    max_size: int = MAX_SIMULATED_SIZE,
    **audit: Any,
) -> tuple[int, float]:
    """Smallest size (runs per side, or canaries) whose simulated power is shown to reach ``power``, and the
    simulated power there (the point estimate).

    The rule is conservative: a size is enough when at least :func:`refutations_needed` of the
    ``simulations`` draws refute the claim, i.e. when the lower end of the power's Clopper-Pearson interval
    at the audit's ``confidence`` (default 0.95) reaches ``power``. ``start``: a size below which the power is
    known to be 0 (the perfect-attack size). Raises InputError when the leak is not above the claim (then a
    sound audit refutes the claim with probability at most α, never with the requested power), when
    ``simulations`` cannot show ``power`` at all, or when ``max_size`` is not enough — at once, without
    simulating, when ``start`` exceeds it or when even the most powerful test has less than ``power`` at ``max_size``
    (:func:`power_upper_bound`; a formal audit only). A size where that bound is below ``power`` is never returned.
    """
    power = check_in_interval(0.0, 1.0, power=power)
    claimed = check_non_negative(claimed_epsilon=claimed_epsilon)
    # Decide on refutation counts (exact integers), never on the point estimate.
    k_needed = refutations_needed(power, simulations, audit.get("confidence", 0.95))
    target = k_needed / simulations  # the smallest estimate whose interval's lower end reaches power
    if leak.epsilon <= claimed:
        shown, claim = numfmt.ordered(leak.epsilon, claimed, left_digits=4, left_up=True)
        raise InputError(
            f"the hypothesised leak (epsilon = {shown}) does not exceed the claim ({claim}): a sound "
            "audit refutes a true claim with probability at most 1 - confidence, whatever the design size"
        )

    # No sound audit can beat the most powerful test: when even it falls short at max_size, refuse at once
    # (the bound is nondecreasing in the size, so no smaller size can do either) instead of simulating ever
    # larger designs.
    unit = "canaries" if audit.get("method", "clopper-pearson") in ONE_RUN_METHODS else "runs per side"
    best = power_upper_bound(max_size, claimed, leak, **audit)
    if best is not None and best < power:
        eps = _leak_needed(claimed, leak, max_size, power, **audit)
        shown, claim = numfmt.ordered(leak.epsilon, claimed, left_digits=4)  # the leak's ε shown above the claim
        at = f" at delta {numfmt.exact(leak.delta)}" if leak.family == "gaussian" else ""
        needed = (
            f"a leak must exceed epsilon {numfmt.lower(eps, 4)} to be plannable within {max_size} {unit} "
            "(necessary, not sufficient: the simulation decides), or lower the power"
            if math.isfinite(eps)
            else f"no {leak.family} leak of any epsilon is plannable within {max_size} {unit}: allow more, or lower "
            "the power"
        )
        raise InputError(
            f"no design up to {max_size} {unit} can refute epsilon = {claim} with power {power:g} against a "
            f"{leak.family} leak of epsilon {shown}{at}: even the most powerful test at level "
            f"{1 - audit.get('confidence', 0.95):.4g} (Neyman-Pearson) has power at most {numfmt.upper(best, 3)} "
            f"there; {needed}"
        )

    # size -> (refuted, drawn). The doubling search reads only whether a size is enough, so there a size's draws
    # stop once the count can no longer reach k_needed (drawn < simulations: never enough); the bracket's secant
    # reads the estimates themselves, so there each size is simulated in full (so every plan found is the one
    # that full simulations at every size give).
    cache: dict[int, tuple[int, int]] = {}

    def p(n: int, *, stop: bool = False) -> float:
        if n not in cache or (not stop and cache[n][1] < simulations):  # common random numbers: simulated once
            if n >= _ANNOUNCE_SIZE:
                from dpaudit.progress import announce

                shown, claim = numfmt.ordered(leak.epsilon, claimed, left_digits=4)
                announce(
                    # No cause is named: a leak close to the claim needs large designs, and so does a claim near
                    # the design's ceiling (one-run at a claim of 8 against 16: the delta term caps the bound).
                    f"simulating {'up to ' if stop else ''}{simulations} audits of {n:,} {unit}"
                    + (f" (stopping after {simulations - k_needed + 1} fail: then it is not enough)" if stop else "")
                    + f": only designs this large can show power {power:g} against a leak of epsilon {shown} for a "
                    f"claim of {claim}; each size can take minutes"
                )
            cache[n] = _simulate(
                n, claimed, leak, simulations=simulations, seed=seed, stop_below=k_needed if stop else 0, **audit
            )
        return cache[n][0] / simulations

    def enough(power_estimate: float) -> bool:
        return round(power_estimate * simulations) >= k_needed

    def possible(n: int) -> bool:
        # A size whose bound is below the power cannot have it, whatever its simulation shows; nor one where the
        # one-run audit's ceiling is at most the claim (its simulated power would be exactly 0).
        if best is not None and power_upper_bound(n, claimed, leak, **audit) < power:
            return False
        return _one_run_ceiling(n, claimed, **audit) is None

    def p_doubling(n: int, *, stop: bool = False) -> float:
        return p(n, stop=stop) if possible(n) else 0.0  # not simulated: read as power 0, "not enough"

    lo, hi = None, max(1, int(start))
    if hi > max_size:  # power 0 below start: no size up to max_size can refute the claim (never simulate past it)
        raise InputError(
            f"no design up to {max_size} {unit} can refute epsilon = {numfmt.upper(claimed)}: even a perfect attack "
            f"needs {hi} {unit}; raise max_size to at least {hi}"
        )
    p_hi = p_doubling(hi, stop=True)
    while not enough(p_hi):
        if hi >= max_size:
            ceiling = _one_run_ceiling(max_size, claimed, **audit)
            if ceiling is not None:  # not simulated there: say why, and what was
                delta = audit.get("delta", 1e-5)
                raise InputError(
                    _ceiling_refusal(claimed, leak, power, max_size, ceiling, cache, simulations, k_needed, delta)
                )
            shown = _simulated_text(max_size, unit, *cache.get(max_size, (0, simulations)), simulations, k_needed)
            raise InputError(
                f"no design up to {max_size} {unit} is shown to reach power {power:g} against {leak.describe()}: "
                f"{shown}; allow larger designs (max_size), lower the power, or plan against a larger leak"
            )
        lo, hi = hi, min(2 * hi, max_size)
        p_hi = p_doubling(hi, stop=True)
    if lo is None:
        return hi, p_hi
    # lo not enough, hi enough: narrow the bracket, secant and bisection steps in turn (the secant aims at
    # the estimate the rule needs, target).
    p_lo = p_doubling(lo) if lo > start else 0.0  # a size the bound rules out was not simulated: power 0 it is
    secant = True
    while hi - lo > max(1, math.ceil(_SIZE_RTOL * hi)):
        mid = (lo + hi) // 2
        if secant:
            z_lo, z_hi = (
                float(special.ndtri(np.clip(x, 0.5 / simulations, 1 - 0.5 / simulations))) for x in (p_lo, p_hi)
            )
            if z_hi > z_lo:
                z_target = float(special.ndtri(min(target, 1 - 0.5 / simulations)))
                root = math.sqrt(lo) + (z_target - z_lo) * (math.sqrt(hi) - math.sqrt(lo)) / (z_hi - z_lo)
                mid = min(hi - 1, max(lo + 1, round(root * root)))
        secant = not secant
        p_mid = p_doubling(mid)  # not simulated where the bound rules the size out (it cannot be enough)
        if enough(p_mid) and possible(mid):
            hi, p_hi = mid, p_mid
        else:
            lo, p_lo = mid, p_mid
    return hi, p_hi


__all__ = [
    "DEFAULT_POWER",
    "DEFAULT_SIMULATIONS",
    "FAMILIES",
    "MAX_SIMULATED_SIZE",
    "Leak",
    "hypothesised_leak",
    "power_interval",
    "power_upper_bound",
    "refutations_needed",
    "simulated_power",
    "simulations_needed",
    "size_for_power",
]
