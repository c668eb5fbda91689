"""Privacy accounting: accountants consume :mod:`dpaudit.events` and report (epsilon, delta).

Pure numpy/scipy (no torch/jax). Convenience API used by the trainers::

    from dpaudit.accounting import calibrate_noise_multiplier, dpsgd_event, epsilon_for

    q, T = 256 / 60000, 14063                           # sample rate, steps
    event = dpsgd_event(noise_multiplier=1.1, sample_rate=q, steps=T)
    epsilon_for(event, delta=1e-5)                      # RDP, add/remove neighbours
    epsilon_for(event, delta=1e-5, accountant="pld")    # tighter
    calibrate_noise_multiplier(target_epsilon=3.0, delta=1e-5,
                               make_event=lambda s: dpsgd_event(noise_multiplier=s, sample_rate=q, steps=T))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpaudit.accounting.analytic_gaussian import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
)
from dpaudit.accounting.base import NEIGHBOURING, Accountant
from dpaudit.accounting.calibration import calibrate_noise_multiplier as _calibrate_noise_multiplier
from dpaudit.accounting.calibration import calibrate_sample_rate, calibrate_steps
from dpaudit.accounting.classic import advanced_composition, amplification_by_subsampling, basic_composition
from dpaudit.accounting.gdp import (
    GdpAccountant,
    epsilon_delta_tradeoff,
    gdp_delta,
    gdp_epsilon,
    gdp_mu_from_epsilon_delta,
    gdp_mu_poisson_clt,
    gdp_tradeoff,
)
from dpaudit.accounting.pld import PldAccountant
from dpaudit.accounting.rdp import RdpAccountant
from dpaudit.accounting.registry import ACCOUNTANTS, make_accountant
from dpaudit.accounting.zcdp import ZcdpAccountant, zcdp_epsilon, zcdp_epsilon_simple
from dpaudit.errors import BudgetError, InputError, UnsupportedEventError
from dpaudit.events import Composed, Event, Gaussian, JLGaussian, PoissonSampled, SelfComposed
from dpaudit.validation import check_in_interval, check_non_negative, check_positive_int

__all__ = [
    "ACCOUNTANTS",
    "NEIGHBOURING",
    "Accountant",
    "AccountedEpsilon",
    "GdpAccountant",
    "PldAccountant",
    "RdpAccountant",
    "ZcdpAccountant",
    "advanced_composition",
    "amplification_by_subsampling",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "analytic_gaussian_sigma",
    "basic_composition",
    "calibrate_noise_multiplier",
    "calibrate_sample_rate",
    "calibrate_steps",
    "compare_accountants",
    "dpsgd_event",
    "dpsgd_schedule_event",
    "epsilon_delta_tradeoff",
    "epsilon_for",
    "epsilon_with_label",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu_from_epsilon_delta",
    "gdp_mu_poisson_clt",
    "gdp_tradeoff",
    "make_accountant",
    "zcdp_epsilon",
    "zcdp_epsilon_simple",
]


def dpsgd_event(*, noise_multiplier: float, sample_rate: float, steps: int, jl_projections: int | None = None) -> Event:
    """DP-SGD with Poisson sampling: SelfComposed(PoissonSampled(q, Gaussian(sigma)), T).

    With ``jl_projections`` = r the inner mechanism is JLGaussian(sigma, r) (DP-SGD-JL; account
    with ``"pld"``). sigma is relative to the clipping norm; sigma = 0 is allowed (epsilon = inf).
    """
    check_non_negative(noise_multiplier=noise_multiplier)
    check_in_interval(0.0, 1.0, hi_open=False, sample_rate=sample_rate)
    steps = check_positive_int(steps=steps)
    inner: Event = (
        Gaussian(noise_multiplier)
        if jl_projections is None
        else JLGaussian(noise_multiplier, check_positive_int(jl_projections=jl_projections))
    )
    return SelfComposed(PoissonSampled(sample_rate, inner), steps)


def dpsgd_schedule_event(phases) -> Event:
    """DP-SGD whose noise multiplier or sample rate changed during training: ``phases`` is a sequence of
    (noise_multiplier, sample_rate, steps), one per phase, each as :func:`dpsgd_event` takes them.

    The phases run on the same data, so the run is their adaptive composition (Composed); composition
    commutes (RDP: Mironov 2017, "Rényi differential privacy", Prop. 1, adds the RDP curves; PLD: Koskela,
    Jälkö & Honkela 2020, "Computing tight differential privacy guarantees using FFT", Sec. 3, convolves the
    privacy-loss distributions; GDP: Dong, Roth & Su 2022, JRSS-B, Cor. 3.3, adds the μ²), so phases with
    the same (σ, q) are one SelfComposed of their summed steps, and the distinct ones are taken in a fixed
    order (σ, then q): ε does not depend on how the phases were listed, bit for bit, and a schedule of
    identical phases is exactly :func:`dpsgd_event` of their total steps. No DP-SGD-JL phases: the PLD's
    per-query JL loss cap was not checked against an oracle for a ledger of several JL mechanisms.
    """
    merged: dict[tuple[float, float], int] = {}
    for k, phase in enumerate(phases):
        if len(phase) != 3:
            raise InputError(f"phase {k + 1}: expected (noise_multiplier, sample_rate, steps), got {len(phase)} values")
        sigma, q, steps = phase
        event = dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps)
        key = (float(sigma), float(q))
        merged[key] = merged.get(key, 0) + event.count
    if not merged:
        raise InputError("expected at least one phase")
    events = [dpsgd_event(noise_multiplier=s, sample_rate=q, steps=t) for (s, q), t in sorted(merged.items())]
    return events[0] if len(events) == 1 else Composed(tuple(events))


def epsilon_for(event: Event, delta: float, accountant: str = "rdp", *, neighbouring: str = "add_remove") -> float:
    """epsilon(delta) of ``event`` with a fresh accountant of the given name (formal for rdp/pld/zcdp;
    :func:`epsilon_with_label` also says whether it is an approximation)."""
    return epsilon_with_label(event, delta, accountant, neighbouring=neighbouring).epsilon


@dataclass(frozen=True)
class AccountedEpsilon:
    """One accountant's epsilon for one event: ``approximate`` when any part of the event was
    accounted by an approximation (the GDP CLT for subsampling), so the value is an estimate, not a
    formal bound; ``epsilon`` is None and ``unsupported`` says why when the accountant refused it (an
    event it cannot handle, or work too large for this machine)."""

    accountant: str
    epsilon: float | None
    approximate: bool = False
    unsupported: str | None = None

    @property
    def formal(self) -> bool:
        return self.epsilon is not None and not self.approximate


def epsilon_with_label(
    event: Event, delta: float, accountant: str = "rdp", *, neighbouring: str = "add_remove"
) -> AccountedEpsilon:
    """:func:`epsilon_for` together with whether the accountant had to approximate."""
    acc = make_accountant(accountant, neighbouring=neighbouring).compose(event)
    return AccountedEpsilon(accountant, acc.epsilon(delta), acc.approximate)


def compare_accountants(
    event: Event,
    delta: float,
    names: str | tuple[str, ...] = ("rdp", "pld", "gdp"),
    *,
    neighbouring: str = "add_remove",
) -> tuple[dict[str, AccountedEpsilon], float]:
    """Every named accountant's epsilon for ``event`` (refusals recorded, not raised: an event the
    accountant cannot handle, or work its cost estimate refuses, such as a PLD grid larger than memory) and
    the smallest formal one: each formal epsilon is a valid upper bound, so their minimum is too
    (``inf`` if none is formal). An approximate epsilon never enters the minimum. ``names`` may also be one
    comma-separated string (``"rdp,pld"``)."""
    if isinstance(names, str):  # a string is names, not a sequence of one-letter accountants
        names = tuple(n.strip() for n in names.split(",") if n.strip())
    results: dict[str, AccountedEpsilon] = {}
    for name in names:
        try:
            results[name] = epsilon_with_label(event, delta, name, neighbouring=neighbouring)
        except (UnsupportedEventError, BudgetError) as e:
            results[name] = AccountedEpsilon(name, None, unsupported=str(e))
    formal = [r.epsilon for r in results.values() if r.formal]
    return results, (min(formal) if formal else math.inf)


def calibrate_noise_multiplier(
    *, target_epsilon, delta, make_event, accountant="rdp", neighbouring="add_remove", **options
) -> float:
    """Smallest noise multiplier with epsilon(make_event(sigma)) <= target_epsilon (verified).

    See :func:`dpaudit.accounting.calibration.calibrate_noise_multiplier` for the tolerance and
    bracket options. Raises :class:`~dpaudit.errors.UnreachableTargetError` if unreachable.
    """
    return _calibrate_noise_multiplier(
        target_epsilon=target_epsilon,
        delta=delta,
        make_event=make_event,
        accountant=accountant,
        neighbouring=neighbouring,
        **options,  # tol, max_noise_multiplier, lower_bound
    )
