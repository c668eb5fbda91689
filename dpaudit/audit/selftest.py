"""Self-test of the auditor: false alarms on correct mechanisms, detection of planted bugs.

Every mechanism is simulated at the level of its released statistic with numpy (vectorised over
trials) and observed by a white-box auditor that scores each run with the log-likelihood ratio of
the *claimed* mechanism (its Neyman–Pearson test; higher = canary present). Each case runs
``trials`` times with the canary and ``trials`` times without, per seed, and is audited with
:func:`dpaudit.audit.audit_scores` against the ε the implementation would report. The runs are
independent trials of the mechanism (``design="multi-run"``), so the clopper-pearson bound is formal.

Correct mechanisms (claimed ε is exact, or an accountant's upper bound) should be flagged in at most
a fraction 1 − confidence of seeds; planted bugs, each with a claimed ε ≤ 2, should be flagged in
≥ 95% of seeds.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special, stats

from dpaudit import numfmt
from dpaudit.accounting.gdp import gdp_epsilon
from dpaudit.audit.bounds import audit_scores
from dpaudit.budget import Cost, check_cost
from dpaudit.errors import InputError
from dpaudit.progress import Progress
from dpaudit.validation import check_in_interval, check_positive_int

Simulator = Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]

# Planted bugs must be caught in at least this fraction of seeds.
REQUIRED_DETECTION = 0.95
# The cost of one trial (a run with and one without the canary) in one audit, for dpaudit.budget: its simulated
# statistics, concatenated scores, labels and the sort of audit_scores (~100 bytes); measured ~8e-6 s of CPU per
# trial (default 6 cases x 50 seeds x 2000 trials, 7.8 s), rounded up to an order of magnitude as budget.py's are.
SECONDS_PER_TRIAL = 1e-5
# And of one audit whatever its trials (the audit's own work, its threshold search and bound): measured 4.4e-4 s
# (8 cases x 1,980 seeds x 1 trial, 6.9 s), rounded up as above.
SECONDS_PER_AUDIT = 1e-3
# A correct mechanism's flagged seeds may reach this quantile of Binomial(seeds, 1 - confidence).
ALLOWANCE_QUANTILE = 0.999
BYTES_PER_TRIAL = 100.0
# Up to this many seeds the allowance is scipy's exact binomial quantile (false_alarm_allowance).
EXACT_SEEDS = 2**40


@functools.cache
def poisson_dpsgd_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    """ε(δ) the PLD accountant reports for Poisson-subsampled Gaussian DP-SGD (sensitivity = clip norm).

    PLD (pessimistic) is the tightest formal upper bound available, so claims are as small as an
    honest implementation could make them: the hardest setting for catching bugs.
    """
    from dpaudit.accounting import dpsgd_event, epsilon_for  # lazy: accounting is a sibling package

    event = dpsgd_event(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps)
    return float(epsilon_for(event, delta, accountant="pld"))


# --------------------------------------------------------------------------------------------------
# Released statistics (scalar model, clip norm C = 1, the other records contribute 0: white box).


def _gaussian(sigma: float) -> Simulator:
    def sim(rng: np.random.Generator, n: int):
        # Gaussian mechanism, sensitivity 1: release f(D) + N(0, σ²); the LLR is monotone in x.
        return rng.normal(1.0, sigma, n), rng.normal(0.0, sigma, n)

    return sim


def _laplace(scale: float) -> Simulator:
    def sim(rng: np.random.Generator, n: int):
        # Laplace mechanism, sensitivity 1: release f(D) + Lap(scale); the LLR is monotone in x.
        return rng.laplace(1.0, scale, n), rng.laplace(0.0, scale, n)

    return sim


def _dpsgd_llr(x: np.ndarray, q: float, sigma: float) -> np.ndarray:
    # Log-likelihood ratio of T Poisson-subsampled Gaussian steps for a canary gradient of norm 1:
    # Σ_t log(1 − q + q·exp((x_t − 1/2)/σ²)) (the mixture density ratio, e.g. Mironov, Talwar & Zhang
    # 2019, arXiv:1908.10530, Section 3), in log space against overflow.
    return np.logaddexp(math.log1p(-q), math.log(q) + (x - 0.5) / sigma**2).sum(axis=1)


def _dpsgd(q: float, sigma: float, steps: int, *, noise_scale: float | None = None, grad: float = 1.0) -> Simulator:
    """Scalar DP-SGD with Poisson sampling: per step, canary·grad·[sampled] + N(0, noise_scale²).

    The released statistic of each step is the noisy sum of clipped gradients (Abadi et al. 2016,
    arXiv:1607.00133, Algorithm 1); the other records contribute 0 here (white-box auditor with a
    gradient canary, as in Nasr et al. 2023, arXiv:2302.07956).

    ``noise_scale`` defaults to σ (noise multiplier × clip norm 1); ``grad`` is the canary's
    contribution after (possibly missing) clipping. The auditor scores with the claimed σ.
    """
    s = sigma if noise_scale is None else noise_scale

    def sim(rng: np.random.Generator, n: int):
        sampled = rng.random((n, steps)) < q
        x_in = grad * sampled + rng.normal(0.0, s, (n, steps))
        x_out = rng.normal(0.0, s, (n, steps))
        return _dpsgd_llr(x_in, q, sigma), _dpsgd_llr(x_out, q, sigma)

    return sim


def _persistent_shuffle(batches: int, epochs: int, sigma: float) -> Simulator:
    """DP-SGD whose data are shuffled once and cut into ``batches`` batches reused every epoch.

    A common shuffling implementation, reported with a Poisson accountant at q = 1/batches. Shuffled
    batches put the canary in exactly one batch per epoch; with persistent shuffling it is the same
    batch position π every epoch, so the epochs add up and the amplification that the Poisson claim
    assumes is lost (Chua et al. 2024, "Scalable DP-SGD: Shuffling vs. Poisson Subsampling",
    arXiv:2411.04205, persistent shuffling; single epoch: Chua et al. 2024, arXiv:2403.17673).
    The per-position sums over epochs
    y_p = Σ_e x_{e,p} ~ N(epochs·[p = π], epochs·σ²) are a sufficient statistic (simulated directly).
    Auditor score: the LLR of "canary at a uniform unknown position", log Σ_p exp((y_p − E/2)/σ²).
    """

    def sim(rng: np.random.Generator, n: int):
        sd = sigma * math.sqrt(epochs)
        y_in = rng.normal(0.0, sd, (n, batches))
        y_in[np.arange(n), rng.integers(0, batches, n)] += epochs
        y_out = rng.normal(0.0, sd, (n, batches))

        def llr(y):
            return special.logsumexp((y - epochs / 2.0) / sigma**2, axis=1)

        return llr(y_in), llr(y_out)

    return sim


# --------------------------------------------------------------------------------------------------
# Cases.


@dataclass(frozen=True)
class SelftestCase:
    """One mechanism: how to simulate it and the ε its implementation claims at δ."""

    name: str
    description: str
    planted_bug: bool
    claimed_epsilon: Callable[[float], float]  # δ -> claimed ε
    simulate: Simulator


def default_cases() -> list[SelftestCase]:
    """Three correct mechanisms and five planted bugs (each bug's claim is ≤ 2 at δ = 1e-5)."""
    q, sigma, steps = 0.1, 2.5, 100  # DP-SGD: 10 epochs of batches of 10% of the data
    e_sigma, e_epoch, e_epochs = 1.5, 10, 50  # (e): 50 epochs of 10 steps run, 1 epoch reported
    k, epochs, s_sigma = 100, 100, 2.5  # (d): 100 batches per epoch, 100 epochs

    def dpsgd_claim(d: float) -> float:
        return poisson_dpsgd_epsilon(q, sigma, steps, d)

    return [
        SelftestCase(
            "gaussian",
            "Gaussian mechanism, sigma = 1 (exact epsilon)",
            False,
            lambda d: gdp_epsilon(1.0, d),
            _gaussian(1.0),
        ),
        SelftestCase(
            "laplace", "Laplace mechanism, scale 1 (epsilon = 1 exactly)", False, lambda d: 1.0, _laplace(1.0)
        ),
        SelftestCase(
            "dpsgd", f"DP-SGD, Poisson q={q}, sigma={sigma}, {steps} steps", False, dpsgd_claim, _dpsgd(q, sigma, steps)
        ),
        SelftestCase(
            "bug-a-noise-over-batch",
            "(a) DP-SGD noise divided by the batch size (100)",
            True,
            dpsgd_claim,
            _dpsgd(q, sigma, steps, noise_scale=sigma / 100),
        ),
        SelftestCase(
            "bug-b-no-clipping",
            "(b) no clipping: canary gradient 50x the clip norm",
            True,
            dpsgd_claim,
            _dpsgd(q, sigma, steps, grad=50.0),
        ),
        SelftestCase(
            "bug-c-laplace-scale",
            "(c) Laplace scale = epsilon (0.5) instead of 1/epsilon",
            True,
            lambda d: 0.5,
            _laplace(0.5),
        ),
        SelftestCase(
            "bug-d-shuffle-as-poisson",
            f"(d) shuffled once ({k} batches, {epochs} epochs), accounted as Poisson q={1 / k:g}",
            True,
            lambda d: poisson_dpsgd_epsilon(1.0 / k, s_sigma, k * epochs, d),
            _persistent_shuffle(k, epochs, s_sigma),
        ),
        SelftestCase(
            "bug-e-steps-underreported",
            f"(e) {e_epochs * e_epoch} steps run, epsilon reported for {e_epoch}",
            True,
            lambda d: poisson_dpsgd_epsilon(q, e_sigma, e_epoch, d),
            _dpsgd(q, e_sigma, e_epochs * e_epoch),
        ),
    ]


# --------------------------------------------------------------------------------------------------
# Running and reporting.


@dataclass(frozen=True)
class SelftestRow:
    name: str
    description: str
    planted_bug: bool
    claimed_epsilon: float
    median_lower_bound: float
    flagged_fraction: float
    expected: str
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SelftestReport:
    rows: tuple[SelftestRow, ...]
    seeds: int
    trials: int
    confidence: float
    delta: float
    method: str
    threshold_selection: str
    runtime_s: float

    @property
    def bugs_planted(self) -> int:
        return sum(r.planted_bug for r in self.rows)

    @property
    def bugs_caught(self) -> int:
        return sum(r.planted_bug and r.passed for r in self.rows)

    @property
    def mutation_score(self) -> float:
        return self.bugs_caught / self.bugs_planted if self.bugs_planted else 1.0

    @property
    def false_alarm_rate(self) -> float:
        """Flagged fraction pooled over all seeds of the correct mechanisms."""
        correct = [r.flagged_fraction for r in self.rows if not r.planted_bug]
        return float(np.mean(correct)) if correct else 0.0

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [r.to_dict() for r in self.rows],
            "seeds": self.seeds,
            "trials": self.trials,
            "confidence": self.confidence,
            "delta": self.delta,
            "method": self.method,
            "threshold_selection": self.threshold_selection,
            "false_alarm_rate": self.false_alarm_rate,
            "bugs_caught": self.bugs_caught,
            "bugs_planted": self.bugs_planted,
            "mutation_score": self.mutation_score,
            "passed": self.passed,
            "runtime_s": self.runtime_s,
        }

    def table(self) -> str:
        head = ("mechanism / bug", "claimed eps", "median lower bound", "flagged", "expected", "ok")
        body = [
            (
                r.description,
                numfmt.upper(r.claimed_epsilon, 4),  # a claim: rounded up (dpaudit.numfmt)
                numfmt.lower(r.median_lower_bound, 4),  # a median of lower bounds: rounded down
                f"{r.flagged_fraction:.0%}",
                r.expected,
                "yes" if r.passed else "NO",
            )
            for r in self.rows
        ]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [head, *body]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines += [
            "",
            f"false-alarm rate on correct mechanisms: {self.false_alarm_rate:.1%} "
            f"(allowed: {1 - self.confidence:.0%}, the confidence budget)",
            f"mutation score: {self.bugs_caught}/{self.bugs_planted} planted bugs caught "
            f"(each flagged in >= {REQUIRED_DETECTION:.0%} of seeds)",
            f"{self.seeds} seeds x {self.trials} trials per side, {self.method} / {self.threshold_selection}, "
            f"confidence {self.confidence:g}, delta {numfmt.exact(self.delta)}; {self.runtime_s:.1f} s",
        ]
        return "\n".join(lines)


def false_alarm_allowance(seeds: int, confidence: float) -> int:
    """Most flagged seeds a correct mechanism may show: the 99.9% quantile of Binomial(seeds, α).

    A correct auditor is flagged with probability ≤ α per seed, so exceeding this count has
    probability ≤ 0.1% for it.

    Above :data:`EXACT_SEEDS` seeds, an upper bound on that quantile (so exceeding it still has probability
    ≤ 0.1%): scipy's quantile returns nan from 2^52 seeds and does not return (in C) at 2^60 (scipy 1.17).
    Whether it is below the number of seeds stays exact there (up to the rounding of α^S), as
    :func:`seeds_needed` reads it.
    """
    alpha = 1.0 - confidence
    if seeds <= EXACT_SEEDS:
        return int(stats.binom.ppf(ALLOWANCE_QUANTILE, seeds, alpha))
    if alpha <= 0.0:
        return 0
    # P(X <= S - 1) = 1 - α^S: the quantile is S itself exactly when that is below q.
    if -math.expm1(seeds * math.log(alpha)) < ALLOWANCE_QUANTILE:
        return seeds
    # Bernstein's inequality for the centred indicators (each <= 1, variance α(1 - α)): P(X - Sα >= sqrt(2vL) +
    # L/3) <= e^-L with v = Sα(1 - α) (Boucheron, Lugosi & Massart 2013, Concentration Inequalities, Theorem 2.10
    # with c = b/3, b = 1, as in Corollary 2.11). With e^-L = 1 - q, X stays below Sα + that with probability
    # >= q, so its floor is at least the quantile. Raised by a relative 1e-12 first, far above the float sum's
    # rounding (a few ulps of 2.2e-16), so that rounding cannot take it below.
    tail = -math.log1p(-ALLOWANCE_QUANTILE)
    bound = seeds * alpha + math.sqrt(2.0 * seeds * alpha * (1.0 - alpha) * tail) + tail / 3.0
    return min(seeds - 1, math.floor(bound * (1.0 + 1e-12)))


def seeds_needed(confidence: float) -> int:
    """The fewest seeds whose false-alarm check can fail at all: :func:`false_alarm_allowance` below the
    number of seeds, so that an auditor flagging a correct mechanism on every seed is caught.

    The allowance is below S exactly when P(Binomial(S, α) <= S − 1) = 1 − α^S reaches the quantile q, i.e.
    S >= log(1 − q) / log(α): the search starts just below that (it counted up from 1, for ever at a confidence
    whose α = 1 − confidence rounds to 1, and for 6.9e10 steps at confidence 1e-10)."""
    alpha = 1.0 - confidence
    if alpha >= 1.0:
        raise InputError(
            f"expected confidence >= 1.1e-16 (1 - confidence below 1 in floating point), got {confidence:g}: a "
            "correct mechanism may be flagged in every seed, so no number of seeds lets the false-alarm check fail"
        )
    seeds = max(1, math.floor(math.log1p(-ALLOWANCE_QUANTILE) / math.log(alpha)) - 1) if alpha > 0 else 1
    while false_alarm_allowance(seeds, confidence) >= seeds:  # the rounding, checked on the allowance itself
        seeds += 1
    return seeds


def run_selftest(
    *,
    seeds: int = 50,
    trials: int = 2000,
    confidence: float = 0.95,
    delta: float = 1e-5,
    method: str = "clopper-pearson",
    threshold_selection: str = "bonferroni",
    cases: list[SelftestCase] | None = None,
    progress: Progress | None = None,
) -> SelftestReport:
    """Audit every case ``seeds`` times; report flagged fractions, median bounds and the mutation score.

    Args:
        seeds: independent repetitions per case.
        trials: runs with and runs without the canary, per seed.
        confidence, delta, method, threshold_selection: passed to :func:`audit_scores`.
        cases: mechanisms to audit (default: :func:`default_cases`).
    """
    seeds = check_positive_int(seeds=seeds)
    trials = check_positive_int(trials=trials)
    confidence = check_in_interval(0.0, 1.0, confidence=confidence)
    cases = default_cases() if cases is None else cases
    progress = progress or Progress()
    # Before anything scales with seeds or trials: refuse what cannot fit or no machine would finish (2^63 seeds,
    # even with --yes), ask --yes for what takes over an hour. One audit is held in memory at a time.
    audits = len(cases) * seeds
    check_cost(
        Cost(
            "self-test", audits, "audits", seconds_per_unit=SECONDS_PER_AUDIT + trials * SECONDS_PER_TRIAL,
            fixed_bytes=trials * BYTES_PER_TRIAL, advice="use fewer --trials",
        )
    )  # fmt: skip
    allowance = false_alarm_allowance(seeds, confidence)
    if allowance >= seeds:  # the false-alarm check could not fail: a broken auditor flagging everything would pass
        raise InputError(
            f"expected seeds >= {seeds_needed(confidence)} at confidence {confidence:g}, got {seeds}: a correct "
            f"mechanism may be flagged in {allowance} of {seeds} seeds, so an auditor that flags every mechanism "
            "would pass the self-test"
        )
    start = time.perf_counter()
    rows = []
    with progress.task("self-test", total=len(cases) * seeds) as advance:
        for ci, case in enumerate(cases):
            claimed = float(case.claimed_epsilon(delta))
            bounds, flagged = [], 0
            for seed in range(seeds):
                rng = np.random.default_rng([seed, ci])
                s_in, s_out = case.simulate(rng, trials)
                res = audit_scores(
                    np.concatenate([s_in, s_out]),
                    np.r_[np.ones(len(s_in), bool), np.zeros(len(s_out), bool)],
                    method=method,
                    delta=delta,
                    confidence=confidence,
                    claimed_epsilon=claimed,
                    threshold_selection=threshold_selection,
                    seed=seed,
                    design="multi-run",  # each score is one independent run of the mechanism
                )
                bounds.append(res.epsilon_lower_bound)
                # Flagged: the bound exceeds the claim ("violation" for the formal clopper-pearson bound,
                # "estimate-exceeds-claim" for the gdp estimate).
                flagged += res.verdict in ("violation", "estimate-exceeds-claim")
                advance(1)
            frac = flagged / seeds
            if case.planted_bug:
                expected, ok = f">= {REQUIRED_DETECTION:.0%}", frac >= REQUIRED_DETECTION
            else:
                expected, ok = f"<= {1 - confidence:.0%}", flagged <= allowance
            rows.append(
                SelftestRow(
                    case.name,
                    case.description,
                    case.planted_bug,
                    claimed,
                    float(np.median(bounds)),
                    frac,
                    expected,
                    bool(ok),
                )
            )
    return SelftestReport(
        tuple(rows), seeds, trials, confidence, delta, method, threshold_selection, time.perf_counter() - start
    )
