"""Privacy assertions for users' own test suites.

    import numpy as np

    from dpaudit.testing import assert_dp

    def my_mechanism(data, rng):
        return data.sum() + rng.normal(0.0, 5.0)

    def test_my_mechanism_is_private():
        assert_dp(my_mechanism, np.array([1.0, 0.0]), np.array([0.0, 0.0]), epsilon=1.0, delta=1e-5, trials=20_000)

The mechanism is run ``trials`` times on each of two neighbouring datasets, each run with its own
``np.random.Generator`` (spawned from ``np.random.SeedSequence(seed)``, so results do not depend on
``n_jobs``). The runs are independent trials of the mechanism, so the audit is formal
(:func:`dpaudit.audit.audit_scores` with ``design="multi-run"``): its outputs become membership
scores ("member" = a run on ``data``).

What the outcome means:

* a failed assertion with "violation" is evidence, at the chosen confidence, that the claim is false;
* a pass means this test *could* have refuted the claim and did not;
* a test without power fails by default: :func:`assert_dp` simulates its own audit against a stated
  alternative — by default randomized response at twice the claimed ε, the most detectable leak of
  that size (:mod:`dpaudit.audit.power`) — and fails, naming the trials needed, when the audit would
  catch that leak with probability below ``power`` (0.8). A green test then means the test could
  have caught a 2x error of that most detectable kind and did not; a Laplace or Gaussian mechanism with
  half its noise is harder to catch (ε = 1: Laplace in 13 of 20 seeds at the 200 trials this check
  accepts; Gaussian at δ = 1e-5 in 0 of 20 at 2000 trials; benchmarks/RESULTS.md): ask for power
  against your own family (``alternative_family="gaussian"``). ``require_power=False`` lets an
  underpowered test pass.
  That simulation assumes the learned direction is right; a vector output with more coordinates than the pilot
  can estimate (rank 2·pilot − 2 below the output's size) fails the check too: pass ``direction=``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpaudit import numfmt
from dpaudit.audit.bounds import audit_scores
from dpaudit.audit.plan import trials_needed
from dpaudit.audit.power import (
    DEFAULT_ALTERNATIVE_FACTOR,
    DEFAULT_ALTERNATIVE_FAMILY,
    DEFAULT_POWER,
    DEFAULT_SIMULATIONS,
    hypothesised_leak,
    power_interval,
    refutations_needed,
    simulated_power,
    simulations_needed,
    size_for_power,
)
from dpaudit.audit.result import AuditResult
from dpaudit.errors import InputError
from dpaudit.validation import (
    check_choice,
    check_in_interval,
    check_non_negative,
    check_positive_int,
    check_seed,
    host_array,
)

Mechanism = Callable[[Any, np.random.Generator], Any]
Direction = str | Sequence[float] | np.ndarray

PILOT_FRACTION = 0.2
DETERMINISTIC_NOTE = (
    "every run on data returned the same output, and so did every run on neighbour: the mechanism is deterministic "
    "here; if it adds noise, draw it from its rng argument (not np.random/torch after a fixed seed)"
)
_MIN_TRIALS = 20
_MIN_PILOT = 2


def _trial_generators(
    seed: int, trials: int
) -> tuple[list[np.random.Generator], list[np.random.Generator], np.random.Generator]:
    """One independent Generator per run (runs on ``data``, runs on ``neighbour``) and one for the audit.

    Spawned children of ``np.random.SeedSequence(seed)`` (numpy's recommended way to get independent
    streams): the i-th run gets the same stream whichever worker executes it.
    """
    ss_in, ss_out, ss_audit = np.random.SeedSequence(seed).spawn(3)
    gens_in = [np.random.default_rng(s) for s in ss_in.spawn(trials)]
    gens_out = [np.random.default_rng(s) for s in ss_out.spawn(trials)]
    return gens_in, gens_out, np.random.default_rng(ss_audit)


def _run(mechanism: Mechanism, data: Any, gens: list[np.random.Generator], which: str, n_jobs: int) -> np.ndarray:
    if n_jobs == 1:
        outputs = [mechanism(data, g) for g in gens]
    else:
        from joblib import delayed

        from dpaudit.validation import worker_pool

        outputs = worker_pool(n_jobs)(delayed(mechanism)(data, g) for g in gens)
    rows: list[np.ndarray] = []
    for i, out in enumerate(outputs):
        if out is None:
            raise InputError(
                f"the mechanism returned None on {which} at trial {i}: return its output (a float or 1-D array)"
            )
        try:
            x = np.atleast_1d(np.asarray(host_array(out), dtype=float))
        except (TypeError, ValueError):
            raise InputError(
                f"mechanism output on {which} must be a float or a 1-D numeric array, got {out!r}"
            ) from None
        if x.ndim != 1:
            raise InputError(f"mechanism output on {which} must be a float or a 1-D array, got shape {x.shape}")
        if rows and x.shape != rows[0].shape:
            raise InputError(
                f"mechanism output on {which} changed shape from {rows[0].shape} to {x.shape} at trial {i}"
            )
        if not np.all(finite := np.isfinite(x)):
            j = int(np.argmin(finite))  # the first bad value, named on one line (not a wrapped array)
            where = (
                f"value {x[j]}"
                if len(x) == 1
                else f"{int(np.sum(~finite))} of {len(x)} values, first {x[j]} at index {j}"
            )
            raise InputError(
                f"mechanism output on {which} is not finite at trial {i} ({where}): an audit needs finite outputs; "
                "map nan and ±inf to finite values no output takes (np.nan_to_num(x, nan=..., posinf=..., "
                "neginf=...)), so the audit still tells them apart"
            )
        rows.append(x)
    return np.stack(rows)


def _snapshot(x: Any) -> np.ndarray | None:
    """A copy of a dataset's values (a NumPy array, a tensor, a list of numbers), or None when it has none to
    compare (an object array, a custom object): what :func:`_check_unchanged` compares after the runs."""
    try:
        a = np.array(host_array(x), copy=True)
    except (TypeError, ValueError, RuntimeError):
        return None
    return None if a.dtype == object else a


def _check_unchanged(before: np.ndarray | None, x: Any, which: str) -> None:
    """Refuse a mechanism that changed its input in place: the runs then see different datasets and depend on one
    another, so they are not the independent trials the audit's bound assumes (a 1-DP mechanism adding its noise
    with ``data += noise`` read "violation" in 9 of 10 seeds)."""
    if before is None:
        return
    after = np.asarray(host_array(x))
    same = after.shape == before.shape and bool(np.all((after == before) | ((after != after) & (before != before))))
    if not same:
        raise InputError(
            f"the mechanism changed its input {which} in place, so its runs were not independent trials on one "
            f"dataset; work on a copy (e.g. {which} = {which}.copy()) or add the noise out of place"
        )


def _projection(pilot_in: np.ndarray, pilot_out: np.ndarray) -> np.ndarray:
    """Direction of Fisher's linear discriminant, Σ⁻¹(μ_in − μ_out), from the pilot runs.

    For Gaussian outputs with a shared covariance this is the likelihood-ratio direction (Neyman–
    Pearson optimal); for a scalar output it reduces to the sign of the mean difference. A small ridge
    (1e-6 of the mean variance) keeps Σ invertible for degenerate coordinates.

    Σ = AᵀA for the m pilot rows, centred and scaled (A below). With more coordinates than rows (d > m: a noisy
    gradient, an embedding) the same w comes from the m × m system of the Woodbury identity,
    (AᵀA + λI)⁻¹b = (b − Aᵀ(λI + AAᵀ)⁻¹Ab)/λ (Golub & Van Loan, Matrix Computations, 4th ed., §2.1.4), so
    memory and time grow with m·d instead of d² (a d × d Σ of 10⁵ outputs is 80 GB) and d³.
    """
    mu_in, mu_out = pilot_in.mean(axis=0), pilot_out.mean(axis=0)
    diff = mu_in - mu_out
    d = pilot_in.shape[1]
    if d == 1:
        return np.array([1.0 if diff[0] >= 0 else -1.0])
    if d <= len(pilot_in) + len(pilot_out):
        cov = 0.5 * (np.cov(pilot_in, rowvar=False) + np.cov(pilot_out, rowvar=False))
        ridge = 1e-6 * max(float(np.trace(cov)) / d, 1e-300)
        w = np.linalg.solve(cov + ridge * np.eye(d), diff)
    else:  # Σ = ½(np.cov(in) + np.cov(out)) = AᵀA, never formed
        a = np.vstack(
            [
                (pilot_in - mu_in) / math.sqrt(2 * (len(pilot_in) - 1)),
                (pilot_out - mu_out) / math.sqrt(2 * (len(pilot_out) - 1)),
            ]
        )
        ridge = 1e-6 * max(float(np.sum(a * a)) / d, 1e-300)  # trace(AᵀA) = Σ a²
        w = (diff - a.T @ np.linalg.solve(ridge * np.eye(len(a)) + a @ a.T, a @ diff)) / ridge
    if not np.any(w):
        w = np.ones(d)
    return w


def _pilot_split(trials: int, n_pilot: int) -> tuple[slice, slice]:
    """(pilot runs, audited runs) of each side: disjoint, so the statistic is never fit on audited data."""
    return slice(0, n_pilot), slice(n_pilot, trials)


def _n_pilot(trials: int) -> int:
    return max(_MIN_PILOT, round(PILOT_FRACTION * trials))


def _check_direction(direction: Direction | None) -> str | np.ndarray | None:
    if direction is None:
        return None
    if isinstance(direction, str):
        return check_choice(("greater", "less"), direction=direction)
    try:
        w = np.asarray(direction, dtype=float)
    except (TypeError, ValueError):
        raise InputError(
            f"direction must be 'greater', 'less' or a numeric projection vector, got {direction!r}"
        ) from None
    if w.ndim != 1 or len(w) == 0:
        raise InputError(f"a projection direction must be a non-empty 1-D vector, got shape {w.shape}")
    if not np.all(np.isfinite(w)) or not np.any(w):
        raise InputError("a projection direction must be finite and not all zero")
    return w


def _fixed_projection(direction: str | np.ndarray, dim: int) -> np.ndarray:
    if isinstance(direction, str):
        if dim != 1:
            raise InputError(
                f"direction {direction!r} applies to scalar outputs; the mechanism returns {dim} values: "
                f"pass a projection vector of length {dim}"
            )
        return np.array([1.0 if direction == "greater" else -1.0])
    if len(direction) != dim:
        raise InputError(f"the projection direction has length {len(direction)}; the mechanism returns {dim} values")
    return direction


def audit_mechanism(
    mechanism: Mechanism,
    data: Any,
    neighbour: Any,
    *,
    epsilon: float,
    delta: float,
    trials: int,
    confidence: float = 0.95,
    seed: int = 0,
    method: str = "clopper-pearson",
    direction: Direction | None = None,
    n_jobs: int = 1,
) -> AuditResult:
    """Audit ``mechanism``'s claim of (epsilon, delta)-DP on one pair of neighbouring datasets.

    ``mechanism(data, rng) -> float | 1-D array`` is run ``trials`` times on ``data`` and ``trials``
    times on ``neighbour``; every run gets its own ``np.random.Generator`` spawned from
    ``np.random.SeedSequence(seed)``, so the result is the same for every ``n_jobs``.

    The test statistic (higher = run on ``data``) is the outputs' projection on a direction:

    * ``direction=None`` (default): learned on a pilot — the first 20% of the runs on each side
      choose Fisher's discriminant direction (just the sign for scalar outputs); only the other 80%
      are audited.
    * ``direction="greater"`` / ``"less"`` (scalar outputs: larger / smaller output on ``data``) or
      a projection vector (vector outputs): fixed in advance, so no pilot is needed and all runs are
      audited.

    The scores are audited by :func:`dpaudit.audit.audit_scores` with holdout threshold selection and
    ``design="multi-run"`` (the runs are independent trials).

    Args:
        n_jobs: runs executed in parallel with joblib (1: in this process; -1: every core). The
            mechanism must then be picklable by joblib (lambdas and closures are).

    Formal guarantee (method "clopper-pearson"): if the mechanism is (epsilon, delta)-DP, the verdict
    is "violation" with probability ≤ 1 − confidence. Method "gdp" gives a tighter estimate that
    assumes Gaussian trade-offs (verdict "estimate-exceeds-claim" when it exceeds the claim).
    Detecting a violation needs enough trials: the result's ``max_certifiable_epsilon`` is the largest
    ε this many trials could ever refute (see :func:`dpaudit.audit.trials_needed`).
    """
    epsilon = check_non_negative(epsilon=epsilon)
    trials = check_positive_int(trials=trials)
    check_in_interval(0.0, 1.0, confidence=confidence)
    method = check_choice(("clopper-pearson", "gdp"), method=method)
    fixed = _check_direction(direction)
    check_seed(seed=seed)
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int | np.integer) or n_jobs == 0:
        raise InputError(f"expected n_jobs to be a non-zero integer (1: serial, -1: every core), got {n_jobs!r}")
    if trials < _MIN_TRIALS:
        raise InputError(f"expected trials >= {_MIN_TRIALS}, got {trials}")
    gens_in, gens_out, audit_rng = _trial_generators(int(seed), trials)
    before = _snapshot(data), _snapshot(neighbour)
    x_in = _run(mechanism, data, gens_in, "data", int(n_jobs))
    _check_unchanged(before[0], data, "data")
    x_out = _run(mechanism, neighbour, gens_out, "neighbour", int(n_jobs))
    _check_unchanged(before[1], neighbour, "neighbour")
    if x_in.shape[1] != x_out.shape[1]:
        raise InputError(f"mechanism output sizes differ: {x_in.shape[1]} on data, {x_out.shape[1]} on neighbour")
    if fixed is None:
        n_pilot = _n_pilot(trials)
        pilot, audited = _pilot_split(trials, n_pilot)
        w = _projection(x_in[pilot], x_out[pilot])
        note = f"test statistic learned on a pilot of {n_pilot} runs per side; audited on the other {trials - n_pilot}"
    else:
        n_pilot, audited = 0, slice(0, trials)
        w = _fixed_projection(fixed, x_in.shape[1])
        note = f"test statistic fixed in advance (direction given); all {trials} runs per side audited"
    s_in, s_out = x_in[audited] @ w, x_out[audited] @ w
    result = audit_scores(
        np.concatenate([s_in, s_out]),
        np.r_[np.ones(len(s_in), bool), np.zeros(len(s_out), bool)],
        method=method,
        delta=delta,
        confidence=confidence,
        claimed_epsilon=epsilon,
        seed=audit_rng,
        design="multi-run",
    )
    notes = (*result.notes, note)
    # Every run on each side the same output: no randomness reached the outputs (a fixed global seed such as
    # torch.manual_seed(0) inside the mechanism, or noise never added). The verdict stands for this function;
    # the note says why its runs could not differ.
    deterministic = bool(np.all(x_in == x_in[0]) and np.all(x_out == x_out[0]))
    if deterministic:
        notes += (DETERMINISTIC_NOTE,)
    details = {
        **result.details,
        "pilot_trials": n_pilot,
        "output_size": int(x_in.shape[1]),
        "deterministic": deterministic,
    }
    return dataclasses.replace(result, notes=notes, details=details)


def trials_for_power(
    epsilon: float, *, delta: float, confidence: float = 0.95, method: str = "clopper-pearson", pilot: bool = True
) -> int:
    """Trials per side that :func:`audit_mechanism` needs before a perfect attack could refute ``epsilon``.

    :func:`dpaudit.audit.trials_needed` for the audited runs (holdout selection), with the pilot's
    share added back when the direction is learned (``pilot=True``). A lower bound: a real mechanism's
    outputs overlap, so refuting a false claim takes more.
    """
    n_eval = trials_needed(epsilon, delta=delta, confidence=confidence, method=method, threshold_selection="holdout")
    return _with_pilot(n_eval, pilot)


def _with_pilot(n_eval: int, pilot: bool) -> int:
    """Trials per side whose audited share (after the pilot, when there is one) is at least ``n_eval``."""
    if not pilot:
        return max(n_eval, _MIN_TRIALS)
    t = max(_MIN_TRIALS, math.ceil(n_eval / (1.0 - PILOT_FRACTION)) - 2)
    while t - _n_pilot(t) < n_eval:  # a few steps at most: the pilot is a rounded fraction of t
        t += 1
    return t


def _singular_pilot(trials: int, size: int) -> str | None:
    """None when the pilot of ``trials`` per side can estimate the covariance of ``size`` outputs; else why not.

    The pilot's pooled covariance has rank at most 2·n_pilot − 2 (each side's rows, centred on their mean): below
    ``size`` it is singular, and the learned direction (:func:`_projection`) is set by the ridge, not the data —
    for noise in every coordinate, close to a random direction that misses a leak in a few of them."""
    n_pilot = _n_pilot(trials)
    if size == 1 or 2 * n_pilot - 2 >= size:
        return None
    t = max(_MIN_TRIALS, math.ceil((size + 2) / 2 / PILOT_FRACTION) - 2)
    while 2 * _n_pilot(t) - 2 < size:
        t += 1
    return (
        f"the mechanism returns {size} values and the direction is learned from {n_pilot} pilot runs per side, whose "
        f"covariance has rank at most {2 * n_pilot - 2} < {size} (singular: the direction is mostly the ridge's, not "
        f"the data's; at least {t} trials per side for a full-rank pilot)"
    )


def _power_shortfall(
    result: AuditResult, *, epsilon: float, trials: int, pilot: bool, method: str, power: float, leak, seed: int
) -> str | None:
    """None when the audit of ``trials`` per side is shown to refute ``epsilon`` with probability ≥ ``power``
    against ``leak``; else the failure message's core, naming the trials needed.

    The power is an estimate (:func:`dpaudit.audit.power.simulated_power`, on the audited runs with the same
    method, δ, confidence and holdout selection; the pilot is assumed to learn the right direction), and the
    check decides on its Clopper-Pearson interval, as ``dpaudit audit plan`` does: it passes only when the
    interval's lower end reaches ``power`` (:func:`dpaudit.audit.power.refutations_needed`), so an estimate
    whose interval cannot support "powerful enough" fails. Simulations: 200, or more when 200 draws cannot
    show ``power`` at all (:func:`dpaudit.audit.power.simulations_needed`)."""
    n_eval = trials - (_n_pilot(trials) if pilot else 0)
    audit = {"method": method, "delta": result.delta, "confidence": result.confidence}
    sims = max(DEFAULT_SIMULATIONS, simulations_needed(power, result.confidence))
    k_needed = refutations_needed(power, sims, result.confidence)
    can_refute = result.max_certifiable_epsilon > epsilon
    p = simulated_power(n_eval, epsilon, leak, simulations=sims, **audit, seed=seed) if can_refute else 0.0
    refuted = round(p * sims)
    if refuted >= k_needed:
        return None
    lo, hi = power_interval(refuted, sims, result.confidence)
    try:
        n0 = trials_needed(epsilon, delta=result.delta, confidence=result.confidence, method=method)
        start = max(n0, n_eval)
        n, _ = size_for_power(
            epsilon, leak, power=power, start=start, simulations=sims, seed=seed, max_size=64 * start, **audit
        )
        needed = (
            f"about {_with_pilot(n, pilot)} trials per side for {power:.0%} power against this leak (simulated, "
            f"chosen by the same rule; at least {_with_pilot(n0, pilot)} even for a perfect attack)"
        )
    except InputError as e:
        needed = f"no practical number of trials ({e})"
    return (
        f"the test has too little power against ({numfmt.upper(epsilon)}, {numfmt.exact(result.delta)})-DP: "
        + (
            f"against {leak.describe()} it refutes the claim with estimated probability {p:.2f} with {trials} "
            f"trials per side (the simulated audit refuted it in {refuted} of {sims} draws; "
            f"{result.confidence:.0%} Clopper-Pearson interval {numfmt.lower(lo, 2)} to {numfmt.upper(hi, 2)}), "
            f"which does not show power >= {power:g} (the interval's lower end must reach it: at least {k_needed} "
            f"of {sims} draws; "
            if can_refute
            else f"it can never refute the claim with {trials} trials per side, against any leak (power 0; "
        )
        + f"max certifiable epsilon {numfmt.upper(result.max_certifiable_epsilon, 4)}). Needed: {needed}"
    )


def assert_dp(
    mechanism: Mechanism,
    data: Any,
    neighbour: Any,
    *,
    epsilon: float,
    delta: float,
    trials: int,
    confidence: float = 0.95,
    seed: int = 0,
    method: str = "clopper-pearson",
    direction: Direction | None = None,
    n_jobs: int = 1,
    require_power: bool = True,
    power: float = DEFAULT_POWER,
    alternative_epsilon: float | None = None,
    alternative_family: str = DEFAULT_ALTERNATIVE_FAMILY,
) -> AuditResult:
    """Raise AssertionError when the audit refutes the (epsilon, delta)-DP claim; else return the result.

    Same arguments and guarantee as :func:`audit_mechanism`. Fails when the bound exceeds the claim
    (a formal "violation", or with method "gdp" an "estimate-exceeds-claim"); the message states the
    ε lower bound and the claimed ε.

    Always fails, whatever ``require_power``, when the verdict is "inconclusive": the design cannot refute
    the claim at all (its max certifiable ε, that of a perfect attack, is at most ``epsilon``), so passing
    would say nothing; the message names the trials a perfect attack needs (:func:`trials_for_power`).

    ``require_power`` (default True): also fail when the test is not shown to be powerful against the
    alternative ``alternative_epsilon`` (default twice ``epsilon``) of ``alternative_family`` (default
    randomized response, the most detectable leak of that ε; "gaussian" asks for power against a μ-GDP
    leak, which needs far more trials): when this audit, simulated on that leak, refutes the claim in too
    few draws for the lower end of the power's Clopper-Pearson interval (at ``confidence``) to reach
    ``power`` (0.8). Not a perfect attack: the simulated attack is the likelihood-ratio test on the
    alternative's scores, with this audit's own holdout split and threshold selection. The message names
    the estimated power, its interval, and about how many trials per side are shown to reach ``power`` by
    the same rule (:func:`dpaudit.audit.power.size_for_power`, the pilot's share added back).
    ``require_power=False`` skips this check (a design that can refute the claim but may be weak).
    """
    epsilon = check_non_negative(epsilon=epsilon)
    if math.isinf(epsilon):
        raise InputError("epsilon = inf claims no privacy, so no test can refute it: give the finite epsilon you claim")
    if require_power:  # checked before the mechanism runs (its trials may be the expensive part)
        alt = DEFAULT_ALTERNATIVE_FACTOR * epsilon if alternative_epsilon is None else alternative_epsilon
        if alternative_epsilon is None and epsilon == 0:
            raise InputError(
                f"epsilon = 0: the default alternative, {DEFAULT_ALTERNATIVE_FACTOR:g} x epsilon, is 0 too; give "
                "alternative_epsilon > 0 (the smallest leak this test must catch) or require_power=False"
            )
        if not alt > epsilon:
            raise InputError(f"expected alternative_epsilon > epsilon = {numfmt.upper(epsilon)}, got {alt:g}")
        power = check_in_interval(0.0, 1.0, power=power)
    result = audit_mechanism(
        mechanism, data, neighbour, epsilon=epsilon, delta=delta, trials=trials,
        confidence=confidence, seed=seed, method=method, direction=direction, n_jobs=n_jobs,
    )  # fmt: skip
    if result.verdict in ("violation", "estimate-exceeds-claim"):
        kind = "formal lower bound" if result.formal else "estimate"
        bound, claim = numfmt.ordered(result.epsilon_lower_bound, epsilon, left_digits=4)  # the order computed
        # An estimate shows no refutation: its first words never read "mechanism is not ... DP" (a formal verdict).
        what = "is not" if result.formal else "is estimated not to be"
        raise AssertionError(
            f"mechanism {what} ({claim}, {numfmt.exact(delta)})-DP: epsilon lower bound {bound} "
            f"> claimed epsilon {claim} ({kind}, {result.method}, confidence {result.confidence:g})"
            + (f"; {DETERMINISTIC_NOTE}" if result.details["deterministic"] else "")
            + "\n"
            + result.summary()
        )
    if result.verdict == "inconclusive" and not require_power:  # (with require_power the message below says it)
        need = trials_for_power(
            epsilon, delta=result.delta, confidence=result.confidence, method=method, pilot=direction is None
        )
        raise AssertionError(
            f"inconclusive: the test cannot refute ({numfmt.upper(epsilon)}, {numfmt.exact(result.delta)})-DP "
            f"with {trials} trials per side (max certifiable epsilon "
            f"{numfmt.upper(result.max_certifiable_epsilon, 4)}, that of a perfect attack, does not exceed the "
            f"claim), so passing would say nothing. Needed: at least {need} trials per side even for a perfect "
            "attack\n" + result.summary()
        )
    if require_power:
        leak = hypothesised_leak(family=alternative_family, epsilon=alt, delta=result.delta)
        if direction is None and (singular := _singular_pilot(trials, result.details["output_size"])) is not None:
            raise AssertionError(
                f"the test has too little power against ({numfmt.upper(epsilon)}, {numfmt.exact(result.delta)})-DP: "
                f"{singular}, so the power simulated against {leak.describe()} (which assumes the pilot learns the "
                "right direction) says nothing. Pass direction= (a projection vector: the coordinates a record "
                "changes) or more trials, or require_power=False to accept an underpowered test.\n" + result.summary()
            )
        shortfall = _power_shortfall(
            result, epsilon=epsilon, trials=trials, pilot=direction is None, method=method,
            power=power, leak=leak, seed=seed,
        )  # fmt: skip
        if shortfall is not None:
            raise AssertionError(
                f"{shortfall}. Pass require_power=False to accept an underpowered test.\n" + result.summary()
            )
    return result


__all__ = ["assert_dp", "audit_mechanism", "trials_for_power"]
