"""Generic calibration: find the parameter that meets a privacy target, over (accountant, event) factories.

Each function searches a monotone parameter (noise multiplier up = more private; steps or sample
rate up = less private) with bracketing + bisection, and *verifies* the returned value with a
fresh accountant before returning it: epsilon(result) <= target_epsilon always holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dpaudit import numfmt
from dpaudit.accounting.base import Accountant
from dpaudit.accounting.registry import make_accountant
from dpaudit.errors import DPAuditError, InputError, UnreachableTargetError
from dpaudit.events import Event
from dpaudit.validation import (
    MIN_NOISE_MULTIPLIER,
    check_claim_delta,
    check_in_interval,
    check_positive,
    check_positive_int,
)


def _make(accountant: str | Callable[[], Accountant], neighbouring: str) -> Callable[[], Accountant]:
    if callable(accountant):
        return accountant
    make_accountant(accountant, neighbouring=neighbouring)  # validate the name now
    return lambda: make_accountant(accountant, neighbouring=neighbouring)


def _epsilon_of(factory: Callable[[], Accountant], event: Event, delta: float) -> float:
    return factory().compose(event).epsilon(delta)


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    make_event: Callable[[float], Event],
    accountant: str | Callable[[], Accountant] = "rdp",
    neighbouring: str = "add_remove",
    tol: float = 1e-4,
    max_noise_multiplier: float = 1e4,
    lower_bound: Callable[[float], float] | None = None,
) -> float:
    """Smallest noise multiplier sigma (to relative tolerance ``tol``) with epsilon(make_event(sigma)) <= target.

    Formal guarantee: the returned sigma is checked with a fresh accountant before it is returned.
    Assumes epsilon decreases with sigma. Raises :class:`UnreachableTargetError` if even
    ``max_noise_multiplier`` does not reach the target.

    ``lower_bound(sigma)``: a fast function never above epsilon(make_event(sigma)) (e.g.
    :func:`dpaudit.accounting.jl.epsilon_lower_bound`). It is asked first at ``max_noise_multiplier``: a
    target below it is unreachable, said at once with the smallest epsilon any sigma in range could reach
    (at least the bound), instead of after the slow accountant's whole search; it also skips the slow
    evaluations of the bracket and of the bisection where it already exceeds the target (the same decisions,
    so the same sigma; the lower end of the first bracket is such a point whenever the bound moved it).
    """
    target = check_positive(target_epsilon=target_epsilon, finite=True)
    delta = check_claim_delta(delta=delta)
    tol = check_in_interval(0.0, 1.0, tol=tol)
    factory = _make(accountant, neighbouring)

    def eps(sigma: float) -> float:
        return _epsilon_of(factory, make_event(sigma), delta)

    def too_little(sigma: float) -> bool:
        # eps(sigma) > target, decided without the slow accountant where the lower bound already exceeds the target
        # (eps >= lower_bound): the same answer, so the search visits the same sigmas and returns the same one.
        return (lower_bound is not None and lower_bound(sigma) > target) or eps(sigma) > target

    if lower_bound is not None:
        floor = float(lower_bound(max_noise_multiplier))
        if floor > target:
            # The formal lower bound rounded down, the target up, in the order computed (dpaudit.numfmt.ordered).
            shown, goal = numfmt.ordered(floor, target, left_digits=4)
            raise UnreachableTargetError(
                f"target epsilon {goal} at delta {numfmt.exact(delta)} is not reachable with noise_multiplier "
                f"<= {max_noise_multiplier:g}: even that much noise gives epsilon >= {shown} (a formal lower bound)"
            )
    hi = 1.0
    while lower_bound is not None and lower_bound(hi) > target and hi < max_noise_multiplier:
        hi *= 2.0  # certainly too little noise: no slow evaluation needed
    while eps(hi) > target:
        hi *= 2.0
        if hi > max_noise_multiplier:
            raise UnreachableTargetError(
                f"target epsilon {numfmt.upper(target)} at delta {numfmt.exact(delta)} is not reachable with "
                f"noise_multiplier <= {max_noise_multiplier:g}"
            )
    lo = hi / 2.0
    while not too_little(lo):
        if lo <= MIN_NOISE_MULTIPLIER:  # even the least noise an event accepts meets the target
            least = eps(lo)
            raise InputError(
                f"the target epsilon {numfmt.upper(target)} is too large to calibrate: even the least noise accepted "
                f"(a noise multiplier of {MIN_NOISE_MULTIPLIER:g}) gives epsilon {numfmt.upper(least)} at delta "
                f"{numfmt.exact(delta)}, within it, so no smallest noise multiplier meets it (such a target protects "
                "nothing); "
                f"expected epsilon < {numfmt.lower(least)}"
            )
        hi, lo = lo, max(lo / 2.0, MIN_NOISE_MULTIPLIER)
    while (hi - lo) > tol * hi:
        mid = math.sqrt(lo * hi) if hi / lo > 2.0 else 0.5 * (lo + hi)
        if not too_little(mid):
            hi = mid
        else:
            lo = mid
    return _verified(hi, eps, target)


def _verified(value, eps: Callable, target: float):
    achieved = eps(value)
    if not achieved <= target:  # also catches NaN
        raise DPAuditError(f"calibration could not verify epsilon {achieved} <= {target}")  # pragma: no cover
    return value


def calibrate_steps(
    *,
    target_epsilon: float,
    delta: float,
    make_event: Callable[[int], Event],
    accountant: str | Callable[[], Accountant] = "rdp",
    neighbouring: str = "add_remove",
    max_steps: int = 10**7,
) -> int:
    """Largest number of steps T <= max_steps with epsilon(make_event(T)) <= target.

    Formal guarantee (verified). Assumes epsilon increases with T. Raises
    :class:`UnreachableTargetError` when even one step exceeds the target.
    """
    target = check_positive(target_epsilon=target_epsilon, finite=True)
    delta = check_claim_delta(delta=delta)
    max_steps = check_positive_int(max_steps=max_steps)
    factory = _make(accountant, neighbouring)

    def eps(t: int) -> float:
        return _epsilon_of(factory, make_event(t), delta)

    if eps(1) > target:
        raise UnreachableTargetError(
            f"a single step already exceeds epsilon {numfmt.upper(target)} at delta {numfmt.exact(delta)}"
        )
    lo, hi = 1, 2
    while hi <= max_steps and eps(hi) <= target:
        lo, hi = hi, hi * 2
    if hi > max_steps:
        if eps(max_steps) <= target:
            return max_steps
        hi = max_steps
    while hi - lo > 1:  # eps(lo) <= target < eps(hi)
        mid = (lo + hi) // 2
        if eps(mid) <= target:
            lo = mid
        else:
            hi = mid
    return _verified(lo, eps, target)


def calibrate_sample_rate(
    *,
    target_epsilon: float,
    delta: float,
    make_event: Callable[[float], Event],
    accountant: str | Callable[[], Accountant] = "rdp",
    neighbouring: str = "add_remove",
    tol: float = 1e-4,
    min_sample_rate: float = 1e-9,
) -> float:
    """Largest sample rate q in (0, 1] (to relative tolerance ``tol``) with epsilon(make_event(q)) <= target.

    Formal guarantee (verified). Assumes epsilon increases with q. Raises
    :class:`UnreachableTargetError` when even ``min_sample_rate`` exceeds the target.
    """
    target = check_positive(target_epsilon=target_epsilon, finite=True)
    delta = check_claim_delta(delta=delta)
    tol = check_in_interval(0.0, 1.0, tol=tol)
    if not 0.0 < min_sample_rate < 1.0:
        raise InputError(f"expected min_sample_rate in (0, 1), got {min_sample_rate}")
    factory = _make(accountant, neighbouring)

    def eps(q: float) -> float:
        return _epsilon_of(factory, make_event(q), delta)

    if eps(1.0) <= target:
        return 1.0
    if eps(min_sample_rate) > target:
        raise UnreachableTargetError(
            f"target epsilon {numfmt.upper(target)} at delta {numfmt.exact(delta)} is not reachable with "
            f"sample_rate >= {min_sample_rate:g}"
        )
    lo, hi = min_sample_rate, 1.0  # eps(lo) <= target < eps(hi)
    while (hi - lo) > tol * lo:
        mid = math.sqrt(lo * hi) if hi / lo > 2.0 else 0.5 * (lo + hi)
        if eps(mid) <= target:
            lo = mid
        else:
            hi = mid
    return _verified(lo, eps, target)
