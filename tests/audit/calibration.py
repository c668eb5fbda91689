"""Calibrated soundness checks: allowances from the correct auditor's own exceedance rate.

The slow suite (test_soundness.py) allows a bound to exceed the true ε in up to the 99.9% quantile of
Binomial(SEEDS, α) runs. That is valid for any correct auditor but toothless: on most tight cases a
correct auditor exceeds far less often than α (a union bound over the FPR and FNR confidence bounds,
holdout selection, discreteness), so a planted mistake can multiply the exceedance rate and still
pass. Here each tight case carries the correct auditor's exceedance rate p0, measured once offline on
seeds disjoint from the check's, and allows

    allowance = min( 99.9% quantile of Binomial(seeds, p0⁺),  99.9% quantile of Binomial(seeds, α) )

where p0⁺ is the 99.9% Clopper–Pearson upper bound on p0 from the offline count (padding p0 for its
own estimation error). A correct auditor then fails a check with probability ≤ 1e-3 (if p0 ≤ p0⁺,
which itself fails with probability ≤ 1e-3), and the check never allows more than the α-based one.
The seeds are fixed, so every check is deterministic.

Re-measure p0 after any change to the auditor that may change its exceedance rate (numbers in
``P0``; sizes and timings in the comments there), from the repository root:

    .venv/bin/python -m tests.audit.calibration            # all cases, plus every mutant's rate
    .venv/bin/python -m tests.audit.calibration leak-delta  # one case
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from dpaudit.audit import audit_scores, bounds, clopper_pearson_upper, one_run
from dpaudit.testing import audit_mechanism

from . import mechanisms as mech

FAIL_PROBABILITY = 1e-3  # chance that a correct auditor fails one check (given p0 ≤ p0⁺)
PAD_ALPHA = 1e-3  # p0⁺ = upper confidence bound on p0 at this level
OFFLINE_SEED_OFFSET = 1_000_000  # offline measurements use seeds OFFSET, OFFSET + 1, ...: disjoint from checks


def calibrated_allowance(seeds: int, p0_exceed: int, p0_runs: int, alpha: float) -> int:
    """Most exceedances a correct auditor may show in ``seeds`` runs (see the module docstring)."""
    p0_plus = float(clopper_pearson_upper(p0_exceed, p0_runs, PAD_ALPHA))
    calibrated = int(stats.binom.ppf(1.0 - FAIL_PROBABILITY, seeds, p0_plus))
    alpha_based = int(stats.binom.ppf(1.0 - FAIL_PROBABILITY, seeds, alpha))
    return min(calibrated, alpha_based)


@dataclass(frozen=True)
class TightCase:
    """A correct mechanism with a known ε(δ), an audit configuration, and how many seeds a check runs."""

    name: str
    truth: float  # the true ε at the audited δ
    bound: Callable[[int], float]  # seed -> the auditor's ε lower bound on fresh data drawn with that seed
    seeds: int
    alpha: float  # 1 − confidence of the audit

    def exceedances(self, seeds: range) -> int:
        return sum(self.bound(seed) > self.truth for seed in seeds)

    @property
    def allowance(self) -> int:
        count, runs = P0[self.name]
        return calibrated_allowance(self.seeds, count, runs, self.alpha)


def scores_case(name: str, mechanism: mech.Mechanism, delta: float, n: int, seeds: int, **audit: Any) -> TightCase:
    """``audit_scores`` on n runs per side (one-run: n canaries), design "multi-run" or "canaries"."""
    one = audit.get("method") in ("one-run", "one-run-fdp")
    audit = {"design": "canaries" if one else "multi-run", **audit}

    def bound(seed: int) -> float:
        rng = np.random.default_rng([seed, 20240610])
        scores, member = mechanism.canaries(rng, n) if one else mechanism.scores(rng, n)
        return audit_scores(scores, member, delta=delta, seed=seed, **audit).epsilon_lower_bound

    return TightCase(name, mechanism.true_epsilon(delta), bound, seeds, 1.0 - audit.get("confidence", 0.95))


def regimes_case(name: str, epsilon: float, m: int, seeds: int) -> TightCase:
    """Item 3 of issue 27, the stress of a guess count chosen from the same run: one-run (δ = 0, holdout)
    on a mechanism whose leakage switches between runs. A fair coin, independent of the canaries, picks
    the regime: every canary reported by ε-randomised response, or only a random 10% of them (the rest
    score 0.5, uninformative). Each regime is ε-DP in every canary and the coin is independent of the
    bits, so the mixture is ε-DP; the holdout's chosen guess count swings between most and a tenth of
    the canaries with the run, i.e. it depends on the output. The bound must still exceed ε with
    probability at most α (see dpaudit/audit/holdout.py for the argument)."""

    def bound(seed: int) -> float:
        rng = np.random.default_rng([seed, 20261126])
        member = rng.random(m) < 0.5
        truthful = rng.random(m) < np.exp(epsilon) / (1.0 + np.exp(epsilon))
        scores = np.where(truthful, member, ~member).astype(float)
        if rng.random() < 0.5:
            scores[rng.random(m) >= 0.1] = 0.5
        result = audit_scores(scores, member, method="one-run", design="canaries", delta=0.0, seed=seed)
        return result.epsilon_lower_bound

    return TightCase(name, epsilon, bound, seeds, 0.05)


def null_vector_mechanism(dim: int) -> Callable[[Any, np.random.Generator], np.ndarray]:
    """Outputs N(0, I_dim) whatever the data: (0, 0)-DP, so any positive ε bound is an exceedance."""

    def mechanism(data: Any, rng: np.random.Generator) -> np.ndarray:
        return rng.normal(size=dim)

    return mechanism


def mechanism_case(name: str, dim: int, trials: int, seeds: int) -> TightCase:
    """``audit_mechanism`` (pilot-learned Fisher direction) on the null mechanism with ``dim`` outputs."""

    def bound(seed: int) -> float:
        res = audit_mechanism(
            null_vector_mechanism(dim), np.array([1.0]), np.array([0.0]), epsilon=1.0, delta=1e-5, trials=trials,
            seed=seed,
        )  # fmt: skip
        return res.epsilon_lower_bound

    return TightCase(name, 0.0, bound, seeds, 0.05)


# --------------------------------------------------------------------------------------------------
# The tight cases. Timings are per audit on one core of the development machine.

CASES: dict[str, TightCase] = {
    case.name: case
    for case in [
        # Laplace(b = 0.5) is exactly 2-DP and every threshold t ≥ 1 attains ε = 2 (the likelihood ratio
        # is constant in the tail), so many thresholds tie for the best: the strongest winner's curse for
        # a threshold chosen on the data it is evaluated on. 400 runs per side, holdout; ~1.8 ms.
        scores_case("laplace-holdout", mech.laplace(0.5), 0.0, 400, 1500),
        # (0, δ)-DP leak at δ = 0.2 (true ε = 0): the δ term carries all of the bound. 200 runs per side.
        scores_case("leak-delta", mech.leak(0.2), 0.2, 200, 200),
        # The same leak at δ = 0.7, two-sided, confidence 0.8, 196 runs per side (98 evaluated): the
        # false-negative count alone is random (false positives are impossible), so each direction's
        # exceedance rate is close to its α — here the rate roughly sextuples when α is not split
        # between the directions (exact for this fixed test: 0.0063 at α/2 per direction, 0.0377 at
        # α). A confidence of 0.8 makes that visible in 2000 seeds; ~1.1 ms.
        scores_case("leak-two-sided", mech.leak(0.7), 0.7, 196, 2000, alternative="two-sided", confidence=0.8),
        # One-run on leak canaries at δ = 0.2: the 2mδ term of the p-value rules out every positive
        # bound (true ε = 0); 200 canaries; ~4 ms.
        scores_case("leak-one-run", mech.leak(0.2), 0.2, 200, 100, method="one-run"),
        # audit_mechanism on the null mechanism with 38 outputs and 100 trials: the pilot (20 runs per
        # side, 40 points) fits Fisher's direction in 38 dimensions, nearly as many as its points, so it
        # separates its own runs almost perfectly and those runs must never be audited; ~8-16 ms.
        mechanism_case("null-vector-pilot", 38, 100, 300),
        # Tight cases of the other methods, for the calibrated suite: randomised response canaries
        # (one-run, δ = 0, 1000 canaries, ~2.9 ms) and μ-GDP scores under the gdp method (~2.4 ms).
        scores_case("rr-one-run", mech.randomized_response(1.0), 0.0, 1000, 300, method="one-run"),
        scores_case("gdp-scores", mech.gdp_scores(1.0), 1e-3, 500, 300, method="gdp"),
        # The one-run f-DP audit's holdout path ((ε, δ) family) on ε-randomised-response canaries
        # (ε = 1, 200 canaries, δ = 1e-5); ~70 ms. Choosing the guess counts on the evaluation half
        # exceeds ε in 136/1000 runs; its fast catch is test_fdp_one_run's invariance test.
        scores_case(
            "rr-fdp-holdout",
            mech.randomized_response(1.0),
            1e-5,
            200,
            200,
            method="one-run-fdp",
            tradeoff="epsilon-delta",
        ),
        regimes_case("rr-regimes-one-run", 2.0, 1000, 300),
    ]
}

# p0 = (exceedances, audits) of the correct auditor on seeds OFFLINE_SEED_OFFSET + 0, 1, ... (disjoint
# from the checks' seeds 0, 1, ...), measured once with ``python -m tests.audit.calibration`` (which
# also prints each mutant's rate; all re-measured when the holdout half moved to a canonical order and its
# test to a fixed selection level, dpaudit.audit.holdout; the one-run cases again when the holdout applied its
# choice as score thresholds, one_run.choose_guess_fractions). Resulting allowances (calibrated vs α-based, for
# the check's seeds):
#   laplace-holdout     50/20000 = 0.00250  (p0+ 0.00379)  allowance 14 of 1500 (α-based 102)
#   leak-delta           7/5000  = 0.00140  (p0+ 0.00392)  allowance  5 of  200 (α-based  21)
#   leak-two-sided     129/20000 = 0.00645  (p0+ 0.00840)  allowance 31 of 2000 (α-based 456, α = 0.2)
#   leak-one-run         0/2000  = 0        (p0+ 0.00345)  allowance  3 of  100 (α-based  13)
#   null-vector-pilot    2/4000  = 0.00050  (p0+ 0.00280)  allowance  5 of  300 (α-based  28)
#   rr-one-run         306/10000 = 0.0306   (p0+ 0.0363)   allowance 22 of  300 (α-based  28)
#   gdp-scores          25/10000 = 0.00250  (p0+ 0.00446)  allowance  6 of  300 (α-based  28)
#   rr-fdp-holdout      29/1000  = 0.029    (p0+ 0.0493)   allowance 20 of  200 (α-based  21)
#   rr-regimes-one-run  44/2000  = 0.022    (p0+ 0.0341)   allowance 21 of  300 (α-based  28)
P0: dict[str, tuple[int, int]] = {
    "laplace-holdout": (50, 20_000),
    "leak-delta": (7, 5_000),
    "leak-two-sided": (129, 20_000),
    "leak-one-run": (0, 2_000),
    "null-vector-pilot": (2, 4_000),
    "rr-one-run": (306, 10_000),
    "gdp-scores": (25, 10_000),
    "rr-fdp-holdout": (29, 1_000),
    "rr-regimes-one-run": (44, 2_000),
}
OFFLINE_RUNS = {name: runs for name, (_, runs) in P0.items()}


# --------------------------------------------------------------------------------------------------
# Planted mistakes: each replaces one internal function of the real auditor.


def _choose_on_evaluation_part(select, arrays, choose, evaluate):
    # (a), (e): the test (threshold, guess counts) is chosen on the very part it is evaluated on
    ev = tuple(a[~select] for a in arrays)
    return evaluate(choose(*ev), *ev)


def _drop_delta(fpr_upper, fnr_upper, delta):
    # (b) the hypothesis-testing bound computed as if δ = 0
    return _ORIGINAL["hte"](fpr_upper, fnr_upper, 0.0)


def _drop_delta_one_run(m, r, v, delta, alpha, *, tol=one_run._ROOT_TOL):
    # (b') the one-run bound computed as if δ = 0
    return _ORIGINAL["one_run"](m, r, v, 0.0, alpha, tol=tol)


def _alpha_not_split(alpha, alternative):
    # (c) a two-sided audit runs each direction at the full α
    return alpha


def _pilot_also_audited(trials, n_pilot):
    # (d) the pilot that learned the statistic is audited too
    return slice(0, n_pilot), slice(0, trials)


_ORIGINAL = {
    "hte": bounds.hypothesis_test_epsilon,
    "one_run": one_run.one_run_epsilon_lower_bound,
}


@dataclass(frozen=True)
class Mutant:
    name: str
    case: str  # the tight case that must catch it
    target: Any  # module holding the function
    attribute: str
    replacement: Callable[..., Any]
    description: str = field(default="")


def _mutants() -> list[Mutant]:
    from dpaudit import testing

    return [
        Mutant("a-select-on-eval", "laplace-holdout", bounds, "select_then_evaluate", _choose_on_evaluation_part,
               "threshold chosen on the evaluation half"),
        Mutant("b-drop-delta", "leak-delta", bounds, "hypothesis_test_epsilon", _drop_delta,
               "delta dropped from the hypothesis-testing bound"),
        Mutant("b-drop-delta-one-run", "leak-one-run", one_run, "one_run_epsilon_lower_bound", _drop_delta_one_run,
               "delta dropped from the one-run bound"),
        Mutant("c-alpha-not-split", "leak-two-sided", bounds, "_direction_alpha", _alpha_not_split,
               "alpha not split between the directions of a two-sided audit"),
        Mutant("d-pilot-reused", "null-vector-pilot", testing, "_pilot_split", _pilot_also_audited,
               "pilot runs reused for evaluation in audit_mechanism"),
    ]  # fmt: skip


MUTANTS: dict[str, Mutant] = {m.name: m for m in _mutants()}


@functools.cache
def correct_exceedances(case: str) -> int:
    """Exceedances of the unmutated auditor on a case's check seeds (cached: several tests share it)."""
    c = CASES[case]
    return c.exceedances(range(c.seeds))


# --------------------------------------------------------------------------------------------------
# Offline measurement.


def _measure(names: list[str]) -> None:
    for name in names:
        case = CASES[name]
        runs = OFFLINE_RUNS[name]
        t = time.perf_counter()
        count = case.exceedances(range(OFFLINE_SEED_OFFSET, OFFLINE_SEED_OFFSET + runs))
        dt = time.perf_counter() - t
        p0_plus = float(clopper_pearson_upper(count, runs, PAD_ALPHA))
        allowance = calibrated_allowance(case.seeds, count, runs, case.alpha)
        alpha_based = int(stats.binom.ppf(1 - FAIL_PROBABILITY, case.seeds, case.alpha))
        print(
            f"{name}: p0 = {count}/{runs} = {count / runs:.5f} (p0+ = {p0_plus:.5f}); check: {case.seeds} seeds, "
            f"allowance {allowance} (alpha-based {alpha_based}); "
            f"{1000 * dt / runs:.2f} ms/audit",
            flush=True,
        )
        for mutant in MUTANTS.values():
            if mutant.case != name:
                continue
            original = getattr(mutant.target, mutant.attribute)
            setattr(mutant.target, mutant.attribute, mutant.replacement)
            try:
                n_mut = min(runs, 4 * case.seeds)
                mcount = case.exceedances(range(OFFLINE_SEED_OFFSET, OFFLINE_SEED_OFFSET + n_mut))
            finally:
                setattr(mutant.target, mutant.attribute, original)
            rate = mcount / n_mut
            mean, sd = case.seeds * rate, math.sqrt(case.seeds * rate * (1 - rate))
            print(
                f"  mutant {mutant.name}: rate {mcount}/{n_mut} = {rate:.4f}; expected {mean:.1f} ± {sd:.1f} "
                f"exceedances in {case.seeds} seeds = {(mean - allowance) / max(sd, 1e-12):.1f} sd above the allowance",
                flush=True,
            )


if __name__ == "__main__":
    _measure(sys.argv[1:] or list(CASES))
