"""Planning an audit: how many runs (or canaries) a design needs to refute a claim.

Two numbers, in the design's unit — runs per side for the multi-run methods (clopper-pearson, gdp:
runs with the record and as many without), canaries for the one-run methods (one-run, one-run-fdp):

* :func:`plan_design` — the size at which the audit refutes the claim with a stated power (default
  0.8) if the mechanism leaks like a stated hypothesis (a true ε or μ of a gaussian or
  randomized-response family), found by simulating the audit itself (:mod:`dpaudit.audit.power`).
  This is the number to plan with.
* :func:`trials_needed` — the size below which not even a perfect attack could refute the claim:
  the smallest size whose *max certifiable ε* (:func:`dpaudit.audit.max_certifiable_epsilon`, the
  bound of an attack that never errs) exceeds the claim. Below it the verdict is "inconclusive"
  whatever the data say; at it a real attack usually still fails (the perfect-attack number is a
  lower bound, often 3-30x too small).

    >>> from dpaudit.audit import trials_needed
    >>> trials_needed(2.0, delta=1e-5)  # runs with and runs without the record, each
    59
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dpaudit import numfmt
from dpaudit.audit.bounds import max_certifiable_epsilon
from dpaudit.audit.one_run import MIN_HOLDOUT_CANARIES
from dpaudit.audit.power import (
    DEFAULT_ALTERNATIVE_FACTOR,
    DEFAULT_ALTERNATIVE_FAMILY,
    DEFAULT_POWER,
    DEFAULT_SIMULATIONS,
    MAX_SIMULATED_SIZE,
    ONE_RUN_METHODS,
    hypothesised_leak,
    power_interval,
    refutations_needed,
    size_for_power,
)
from dpaudit.audit.result import ALTERNATIVES, METHODS, THRESHOLD_SELECTIONS, is_formal
from dpaudit.budget import Cost, check_cost
from dpaudit.errors import InputError
from dpaudit.validation import check_choice, check_in_interval, check_non_negative, check_positive_int

DEFAULT_MAX_TRIALS = 10**8
# size_advice simulates designs up to this size only (a refusal message must come at once).
ADVICE_MAX_SIMULATED = 5000


def _one_run(method: str) -> bool:
    return method in ONE_RUN_METHODS


def smallest_size(method: str, selection: str) -> int:
    """Smallest runs per side (one-run methods: canaries) that the design accepts."""
    if _one_run(method):
        return MIN_HOLDOUT_CANARIES if selection == "holdout" else 2
    return 2 if selection == "holdout" else 1  # holdout needs ≥ 2 of each class


def _certifiable(
    n: int, method: str, delta: float, confidence: float, selection: str, alternative: str, tradeoff
) -> float:
    """max certifiable ε with n runs per side (one-run methods: n canaries, about half of them included)."""
    n_pos, n_neg = (n - n // 2, n // 2) if _one_run(method) else (n, n)
    return max_certifiable_epsilon(
        n_pos, n_neg, method=method, delta=delta, confidence=confidence, threshold_selection=selection,
        alternative=alternative, tradeoff=tradeoff,
    )  # fmt: skip


# The cost of one simulated audit for dpaudit.budget, an order of magnitude rounded up from this machine (one core,
# clopper-pearson, holdout): 6e-4 s at 10 or 1,000 runs per side, 1.3e-2 s at 100,000 (one-run: 2.8e-3 s at 1,000
# canaries); its scores, labels and sort, ~64 bytes per run.
SECONDS_PER_SIMULATED_AUDIT = 1e-3
SECONDS_PER_SIMULATED_RUN = 2e-7
BYTES_PER_SIMULATED_RUN = 64.0


def trials_needed(
    target_epsilon: float,
    *,
    delta: float = 1e-5,
    confidence: float = 0.95,
    method: str = "clopper-pearson",
    threshold_selection: str = "holdout",
    alternative: str = "greater",
    max_trials: int = DEFAULT_MAX_TRIALS,
    tradeoff="epsilon-delta",
) -> int:
    """Smallest design size whose max certifiable ε exceeds ``target_epsilon``.

    The size is the number of runs *per side* (runs with the record and, as many, runs without it)
    for the threshold methods ("clopper-pearson", "gdp"), and the number of canaries m for "one-run"
    and "one-run-fdp" (the latter against ``tradeoff``, by default the (ε, δ) family as in
    ``dpaudit audit scores``).
    With fewer, even a perfect attack leaves a claim of ``target_epsilon`` "inconclusive"
    (:func:`dpaudit.audit.decide_verdict`).

    It assumes a perfect attack, so it is a **lower bound** on what an audit needs: any real attack
    makes errors and certifies less with the same size.

    Search: doubling from the smallest size the design accepts, then bisection, which returns n with
    max certifiable ε(n − 1) ≤ target < max certifiable ε(n). The max certifiable ε is nondecreasing
    in n for holdout and fixed threshold designs; with Bonferroni selection the grid of anchors grows
    with n and lowers it by up to ~0.2% where an anchor is added, and one-run guess counts are floors of
    fractions of m, so there the answer may exceed the very smallest size by the width of such a dip.

    Raises:
        InputError: when no size up to ``max_trials`` reaches the target. In particular the one-run
            method with δ > 0 has a ceiling: its δ term grows as 2mδ (Steinke, Nasr & Jagielski 2023,
            arXiv:2305.08846, Section 5), so its max certifiable ε peaks at some m and then decreases
            towards a limit; the search stops once it has fallen over two successive doublings and
            reports the peak found.
    """
    target = check_non_negative(target_epsilon=target_epsilon)
    if math.isinf(target):
        raise InputError("expected target_epsilon to be finite: no finite design certifies epsilon = inf")
    delta = check_in_interval(0.0, 1.0, lo_open=False, delta=delta)
    confidence = check_in_interval(0.0, 1.0, confidence=confidence)
    method = check_choice(METHODS, method=method)
    selection = check_choice(THRESHOLD_SELECTIONS, threshold_selection=threshold_selection)
    alternative = check_choice(ALTERNATIVES, alternative=alternative)
    max_trials = check_positive_int(max_trials=max_trials)
    if method in ("gdp", "one-run-fdp") and delta == 0.0:
        raise InputError(f"the {method} method needs delta > 0")
    if _one_run(method) and selection == "fixed":
        raise InputError(f"plan a {method} design with threshold_selection 'holdout' or 'bonferroni'")

    def f(n: int) -> float:
        return _certifiable(n, method, delta, confidence, selection, alternative, tradeoff)

    lo = smallest_size(method, selection)
    if lo > max_trials:
        raise InputError(f"expected max_trials >= {lo} for this design, got {max_trials}")
    v_lo = f(lo)
    if v_lo > target:
        return lo
    # Doubling: f(lo) <= target at every step; stop at the first size above the target.
    history = [(lo, v_lo)]
    hi = lo
    while True:
        if hi >= max_trials:
            best_n, best_v = max(history, key=lambda t: t[1])
            raise InputError(
                f"epsilon = {numfmt.upper(target)} is not certifiable with up to {max_trials} "
                f"{_unit(method)}: at most {numfmt.upper(best_v, 3)} (at {best_n}); lower the confidence or the target "
                "epsilon"
            )
        hi = min(2 * hi, max_trials)
        v_hi = f(hi)
        if v_hi > target:
            break
        history.append((hi, v_hi))
        if _one_run(method) and delta > 0.0 and len(history) >= 3:
            (_, a), (_, b), (_, c) = history[-3:]
            if 0.0 < a and c < b < a:  # past the peak: the δ term 2mδ now dominates
                best_n, best_v = max(history, key=lambda t: t[1])
                raise InputError(
                    f"epsilon = {numfmt.upper(target)} is out of reach of the {method} method at delta = "
                    f"{numfmt.exact(delta)}: "
                    f"its max certifiable epsilon peaks at about {numfmt.upper(best_v, 3)} (near {best_n} canaries) "
                    "and decreases for more canaries (the 2*m*delta term of Steinke et al. 2023); audit independent "
                    "runs instead (clopper-pearson, design multi-run)"
                )
        lo = hi
    # Bisection keeps f(lo) <= target < f(hi).
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if f(mid) > target:
            hi = mid
        else:
            lo = mid
    return hi


def _unit(method: str) -> str:
    return "canaries" if _one_run(method) else "runs per side"


@dataclass(frozen=True)
class DesignPlan:
    """The design size an audit needs against a hypothesised leak (see :func:`plan_design`).

    Attributes:
        target_epsilon: the claimed ε the audit must refute.
        method, threshold_selection, alternative, confidence, delta: the audit's design, as for
            ``audit_scores``; tradeoff: the one-run f-DP family (its name), None for other methods.
        tests: the formal tests that will share the audit's α = 1 − ``confidence`` (Bonferroni), so each is
            planned at ``test_confidence`` = 1 − α/tests (``audit checkpoint`` runs two per canary set on a
            DP-SGD claim: :func:`dpaudit.workflows.checkpoint.canary_confidence`).
        unit: "runs per side" (multi-run methods: runs with the record and as many without) or
            "canaries" (one-run methods: canaries of one run, each included with probability 1/2).
        size: the size for ``power``, by simulation of the audit (JSON key ``runs_per_side`` or
            ``canaries``): the smallest whose power is *shown* to reach ``power`` (power_rule).
        simulated_power: the simulated power at ``size``, from ``simulations`` draws: an estimate, with
            ``simulated_power_interval`` its Clopper-Pearson interval at ``confidence``
            (:func:`dpaudit.audit.power.power_interval`), whose lower end is ≥ ``power``.
        power_rule: the rule that chose ``size``, in words: the interval's lower end reaches ``power``, i.e.
            at least ``refutations_needed`` of the ``simulations`` draws refute the claim
            (:func:`dpaudit.audit.power.refutations_needed`; the point estimate alone never decides).
        leak: the hypothesised leak (family, epsilon, delta, mu).
        perfect_attack_size: the smallest size at which even a perfect attack could refute the claim
            (:func:`trials_needed`), with ``max_certifiable_epsilon`` there: a lower bound on ``size``.
        formal: whether a refutation by this audit is formal (a "violation" or "curve-refuted", exit 1 with
            --fail-on-violation); False for an estimate (method gdp, or one-run-fdp with the gdp family), whose
            "refutation" is the estimate exceeding the claim ("estimate-exceeds-claim", exit 1 only with
            --fail-on-estimate).
        note: what the numbers mean and assume.
    """

    target_epsilon: float
    method: str
    threshold_selection: str
    alternative: str
    confidence: float
    delta: float
    tradeoff: str | None
    tests: int
    test_confidence: float
    unit: str
    size: int
    power: float
    simulated_power: float
    simulations: int
    simulated_power_interval: tuple[float, float]
    refutations_needed: int
    power_rule: str
    leak: dict[str, Any]
    perfect_attack_size: int
    max_certifiable_epsilon: float
    formal: bool
    note: str

    @property
    def key(self) -> str:
        return "canaries" if self.unit == "canaries" else "runs_per_side"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        size, perfect = d.pop("size"), d.pop("perfect_attack_size")
        return {self.key: size, f"perfect_attack_{self.key}": perfect, **d}

    def summary(self) -> str:
        leak = self.leak
        what = (
            f"gaussian leak mu = {leak['mu']:.4g} (true epsilon {numfmt.nearest(leak['epsilon'], 4)} at delta "
            f"{numfmt.exact(leak['delta'])})"
            if leak["family"] == "gaussian"  # a hypothesised leak: a parameter, not a bound (to nearest)
            else f"randomized response at true epsilon = {numfmt.nearest(leak['epsilon'], 4)}"
        )
        lo, hi = self.simulated_power_interval
        design = f"{self.method}, {self.threshold_selection}, {self.alternative}, confidence {self.confidence:g}, "
        if self.tests > 1:
            design += f"each of {self.tests} tests at {self.test_confidence:g} (Bonferroni), "
        # The claim's δ, as given (dpaudit.numfmt.exact).
        design += f"delta {numfmt.exact(self.delta)}" + (f", tradeoff {self.tradeoff}" if self.tradeoff else "")
        # The max certifiable ε beside the claim it is above (numfmt.against): each rounded up on its own, a claim of
        # 1.9999951 and a perfect attack certifying 1.9999952 both read 2.
        claimed, _, (most,) = numfmt.against(self.target_epsilon, [], [self.max_certifiable_epsilon], digits=4)
        return (
            f"{self.size} {self.unit} needed to refute epsilon = {claimed} with power "
            f"{self.power:g} against a {what}: estimated power {self.simulated_power:.0%} (the simulated audit "
            f"refuted it in {round(self.simulated_power * self.simulations)} of {self.simulations} draws; "
            f"{100 * self.test_confidence:.4g}% Clopper-Pearson interval {numfmt.lower(lo, 2)} to "
            f"{numfmt.upper(hi, 2)})\n"
            f"rule: {self.power_rule}\n"
            f"perfect attack: {self.perfect_attack_size} {self.unit} (max certifiable epsilon there "
            f"{most}); a real attack needs more\n"
            f"design: {design}\n"
            f"note: {self.note}"
        )


def plan_design(
    target_epsilon: float,
    *,
    delta: float = 1e-5,
    confidence: float = 0.95,
    method: str = "clopper-pearson",
    threshold_selection: str = "holdout",
    alternative: str = "greater",
    tradeoff="epsilon-delta",
    true_epsilon: float | None = None,
    mu: float | None = None,
    family: str | None = None,
    power: float = DEFAULT_POWER,
    simulations: int = DEFAULT_SIMULATIONS,
    seed: int = 0,
    max_trials: int = DEFAULT_MAX_TRIALS,
    max_size: int = MAX_SIMULATED_SIZE,
    tests: int = 1,
) -> DesignPlan:
    """The size an audit of ``target_epsilon`` needs for ``power`` against a hypothesised leak.

    The leak is ``true_epsilon`` (at ``delta``) or ``mu`` (gaussian family) of ``family``
    (:func:`dpaudit.audit.power.hypothesised_leak`; default "gaussian" with ``mu``, else
    "randomized-response"); with neither, randomized response at twice the claimed ε (the default
    alternative of :func:`dpaudit.testing.assert_dp`: the most detectable leak of that size, see
    :data:`dpaudit.audit.power.DEFAULT_ALTERNATIVE_FAMILY`). The size is found by simulating
    the audit itself (:func:`dpaudit.audit.power.size_for_power`: random inclusion for one-run designs,
    the holdout split, the threshold or guess-count selection), starting from the perfect-attack size
    (:func:`trials_needed`), which is reported beside it.

    ``tests``: the formal tests that will share α = 1 − ``confidence`` on the same data (``audit checkpoint``
    analyses each canary set twice on a DP-SGD claim, by the one-run (ε, δ) and f-DP audits: 2, or 4 with
    white-box canaries too). Each is planned at 1 − α/``tests`` (union bound), the level it will run at, and
    the simulated power's interval is taken at that level too (:func:`size_for_power` reads one confidence).

    ``max_size``: the largest size searched (default :data:`dpaudit.audit.power.MAX_SIMULATED_SIZE`); when no
    size up to it is shown to reach ``power``, an InputError names what the simulation at ``max_size`` showed (or the
    Neyman-Pearson bound there, when that already rules the plan out without simulating).
    """
    tests = check_positive_int(tests=tests)
    smallest = smallest_size(method, threshold_selection)
    if isinstance(max_size, int) and not isinstance(max_size, bool) and max_size < smallest:
        raise InputError(
            f"expected max_size >= {smallest}, got {max_size} (the smallest design {method} with "
            f"{threshold_selection} selection accepts, in {_unit(method)})"
        )
    max_size = check_positive_int(max_size=max_size)
    target = check_non_negative(target_epsilon=target_epsilon)
    if math.isinf(target):
        raise InputError("expected a finite claimed epsilon to plan for, got inf (no audit refutes an infinite claim)")
    if true_epsilon is None and mu is None:
        if target == 0.0:
            raise InputError("a claim of epsilon = 0 needs a stated leak to plan against: give true_epsilon or mu")
        true_epsilon = DEFAULT_ALTERNATIVE_FACTOR * target
    if family is None:
        family = "gaussian" if mu is not None else DEFAULT_ALTERNATIVE_FAMILY
    leak = hypothesised_leak(family=family, epsilon=true_epsilon, mu=mu, delta=delta)
    level = 1.0 - (1.0 - check_in_interval(0.0, 1.0, confidence=confidence)) / tests  # Bonferroni (union bound)
    n0 = trials_needed(
        target, delta=delta, confidence=level, method=method, threshold_selection=threshold_selection,
        alternative=alternative, max_trials=max_trials, tradeoff=tradeoff,
    )  # fmt: skip
    # Every size the search simulates is at least n0, each with `simulations` audits: a floor of its cost, checked
    # before any is drawn (dpaudit.budget). `--simulations 2^63` was an internal IndexError, 1e12 a MemoryError.
    simulations = check_positive_int(simulations=simulations)
    check_cost(
        Cost(
            "audit plan", simulations, "simulated audits", fixed_bytes=BYTES_PER_SIMULATED_RUN * n0,
            seconds_per_unit=SECONDS_PER_SIMULATED_AUDIT + SECONDS_PER_SIMULATED_RUN * n0,
            advice="use fewer simulations",
        )
    )  # fmt: skip
    audit = {
        "method": method, "delta": delta, "confidence": level, "threshold_selection": threshold_selection,
        "alternative": alternative,
    }  # fmt: skip
    if method == "one-run-fdp":
        audit["tradeoff"] = tradeoff
    n, p = size_for_power(
        target, leak, power=power, start=n0, simulations=simulations, seed=seed, max_size=max_size, **audit
    )
    if _one_run(method):
        note = (
            "canaries of one run, each included independently with probability 1/2 (so the simulated inclusion "
            "count varies, as it will); scores drawn from the hypothesised leak, the likelihood-ratio statistic, "
            "so the simulated attack is the strongest against it; a weaker attack needs more"
        )
    else:
        note = (
            "independent runs with the record and as many without; scores drawn from the hypothesised leak, the "
            "likelihood-ratio statistic, so the simulated attack is the strongest against it; a weaker attack "
            "needs more"
        )
    tname = None if not method == "one-run-fdp" else getattr(tradeoff, "name", str(tradeoff))
    # The simulation counts an estimate above the claim as a refutation (power.simulated_power); say when that is
    # all this audit can give (dpaudit.audit.result.is_formal; one-run-fdp's gdp family: an estimate).
    formal = is_formal(method, "canaries" if _one_run(method) else "multi-run") and tname != "gdp"
    if not formal:
        note += (
            f"; {method}{' (gdp family)' if tname == 'gdp' else ''} gives an estimate, not a formal bound: a draw "
            "counts as refuted when the estimate exceeds the claim (verdict estimate-exceeds-claim, exit 1 only with "
            "--fail-on-estimate, never a 'violation'); plan clopper-pearson (runs) or one-run (canaries) for a formal "
            "refutation"
        )
    interval = power_interval(round(p * simulations), simulations, level)
    k = refutations_needed(power, simulations, level)
    rule = (
        f"the smallest size whose power is shown to reach {power:g}: the lower end of its {100 * level:.4g}% "
        f"Clopper-Pearson interval is at least {power:g}, i.e. the simulated audit refuted the claim in at least "
        f"{k} of {simulations} draws (never the estimate alone; seeds fixed)"
    )
    return DesignPlan(
        target_epsilon=float(target), method=method, threshold_selection=threshold_selection,
        alternative=alternative, confidence=float(confidence), delta=float(delta), tradeoff=tname,
        tests=tests, test_confidence=float(level), unit=_unit(method), size=n, power=float(power),
        simulated_power=float(p), simulations=int(simulations),
        simulated_power_interval=interval, refutations_needed=k, power_rule=rule,
        leak=leak.to_dict(), perfect_attack_size=n0,
        max_certifiable_epsilon=float(
            _certifiable(n0, method, float(delta), float(level), threshold_selection, alternative, tradeoff)
        ),
        formal=formal, note=note,
    )  # fmt: skip


@dataclass(frozen=True)
class SizeAdvice:
    """:func:`size_advice`'s phrase, and whether it already points to ``dpaudit audit plan`` (so that a refusal
    adds the pointer only when it does not: it was a string test on the phrase)."""

    text: str
    points_to_plan: bool


def size_advice(
    claimed_epsilon: float, *, method: str, delta: float, confidence: float = 0.95, **plan: Any
) -> SizeAdvice:
    """One phrase naming the size an audit of ``claimed_epsilon`` needs (for refusals and assertion messages):
    the size for 80% power against the default alternative (randomized response at twice the claim) and
    the perfect-attack minimum; ``plan``: further :func:`plan_design` arguments.

    A refusal must answer at once, so the simulation is bounded: 100 draws per size, designs up to
    :data:`ADVICE_MAX_SIMULATED` (above it only the perfect-attack minimum is named, with a pointer to
    ``dpaudit audit plan``: ``points_to_plan``) and at most 32 times the perfect-attack size."""
    unit = _unit(method)
    try:
        n0 = trials_needed(claimed_epsilon, method=method, delta=delta, confidence=confidence)
    except InputError as e:  # out of reach of this method (e.g. the one-run ceiling at delta > 0)
        return SizeAdvice(str(e), points_to_plan=False)
    if n0 > ADVICE_MAX_SIMULATED:
        return SizeAdvice(
            f"at least {n0} {unit} even for a perfect attack, and more for a real one (see `dpaudit audit plan "
            f"--epsilon {numfmt.upper(claimed_epsilon)}` for the size with power)",
            points_to_plan=True,
        )
    try:
        p = plan_design(
            claimed_epsilon, method=method, delta=delta, confidence=confidence, simulations=100, max_size=32 * n0,
            **plan,
        )  # fmt: skip
    except InputError as e:
        return SizeAdvice(f"at least {n0} {unit} even for a perfect attack ({e})", points_to_plan=False)
    return SizeAdvice(
        f"about {p.size} {unit} are needed for {p.power:.0%} power against a leak of "
        f"{numfmt.nearest(p.leak['epsilon'])} "
        f"({p.leak['family']}, simulated), and at least {p.perfect_attack_size} {unit} even for a perfect attack",
        points_to_plan=False,
    )


__all__ = ["DEFAULT_MAX_TRIALS", "DesignPlan", "SizeAdvice", "plan_design", "size_advice", "trials_needed"]
