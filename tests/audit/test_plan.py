"""trials_needed / plan_design against max_certifiable_epsilon, the quantity they invert."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.audit import DesignPlan, max_certifiable_epsilon, plan_design, trials_needed
from dpaudit.errors import InputError

SETTINGS = [
    # (target ε, keyword arguments)
    (1.0, {}),
    (3.0, {}),
    (6.0, {"delta": 0.0}),
    (3.0, {"threshold_selection": "bonferroni"}),
    (3.0, {"threshold_selection": "fixed"}),
    (4.0, {"method": "gdp"}),
    (3.0, {"alternative": "two-sided", "confidence": 0.99}),
    (3.0, {"method": "one-run", "delta": 0.0}),
    (3.0, {"method": "one-run"}),
    (2.0, {"method": "one-run", "threshold_selection": "bonferroni", "alternative": "two-sided"}),
]


def _certifiable(n, kwargs):
    if kwargs.get("method") == "one-run":  # n canaries, about half included
        return max_certifiable_epsilon(n - n // 2, n // 2, **kwargs)
    return max_certifiable_epsilon(n, n, **kwargs)


@pytest.mark.parametrize(("target", "kwargs"), SETTINGS)
def test_one_fewer_trial_does_not_certify_and_the_answer_does(target, kwargs):
    n = trials_needed(target, **kwargs)
    assert _certifiable(n, kwargs) > target
    assert _certifiable(n - 1, kwargs) <= target
    plan = plan_design(target, **kwargs)
    assert isinstance(plan, DesignPlan) and plan.trials == n
    assert plan.max_certifiable_epsilon == _certifiable(n, kwargs) > target
    assert plan.unit == ("canaries" if kwargs.get("method") == "one-run" else "trials per side")
    assert "perfect attack" in plan.note and "perfect attack" in trials_needed.__doc__
    assert plan.to_dict()["trials"] == n


def test_more_confidence_or_two_sides_cost_trials():
    base = trials_needed(3.0)
    assert trials_needed(3.0, confidence=0.99) > base
    assert trials_needed(3.0, alternative="two-sided") > base
    assert trials_needed(3.0, alternative="two-sided") == trials_needed(3.0, confidence=0.975)
    assert trials_needed(4.0) > base


@pytest.mark.parametrize("selection", ["holdout", "fixed"])
def test_max_certifiable_is_nondecreasing_for_holdout_and_fixed_designs(selection):
    # The monotonicity the bisection relies on (documented in trials_needed).
    v = [max_certifiable_epsilon(n, n, threshold_selection=selection) for n in range(2, 3000)]
    assert np.all(np.diff(v) >= 0)


def test_bonferroni_dips_are_small():
    # The anchor grid grows with n; documented: the dips stay within ~0.2% (checked for n < 3000).
    v = np.array([max_certifiable_epsilon(n, n, threshold_selection="bonferroni") for n in range(2, 3000)])
    rel = -np.diff(v) / np.maximum(v[:-1], 1e-300)
    assert rel.max() <= 0.0025


def test_one_run_with_delta_has_a_ceiling():
    # Through the 2mδ term (Steinke et al. 2023, Section 5) the one-run max certifiable ε peaks and then
    # falls as m grows: at δ = 1e-3 it peaks near 3.6 (about 500 canaries).
    with pytest.raises(InputError, match=r"out of reach of the one-run method at delta = 0.001.*peaks at about 3\.6"):
        trials_needed(4.0, method="one-run", delta=1e-3)
    assert trials_needed(3.0, method="one-run", delta=1e-3) < 512
    assert trials_needed(4.0, method="one-run", delta=0.0) > 0  # δ = 0 has no ceiling


def test_unreachable_within_max_trials():
    with pytest.raises(InputError, match=r"not certifiable with up to 1000 trials per side: at most 4\.91 \(at 1000\)"):
        trials_needed(8.0, max_trials=1000)
    assert trials_needed(4.0, max_trials=10**8) == trials_needed(4.0, max_trials=407)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((-1.0,), {}, "target_epsilon"),
        ((float("inf"),), {}, "finite"),
        ((float("nan"),), {}, "target_epsilon"),
        ((1.0,), {"delta": 1.0}, "delta"),
        ((1.0,), {"confidence": 1.0}, "confidence"),
        ((1.0,), {"method": "magic"}, "method"),
        ((1.0,), {"method": "gdp", "delta": 0.0}, "delta > 0"),
        ((1.0,), {"method": "one-run", "threshold_selection": "fixed"}, "one-run"),
        ((1.0,), {"alternative": "up"}, "alternative"),
        ((1.0,), {"max_trials": 0}, "max_trials"),
        ((1.0,), {"max_trials": 1}, "max_trials >= 2"),
    ],
)
def test_bad_inputs(args, kwargs, message):
    with pytest.raises(InputError, match=message):
        trials_needed(*args, **kwargs)
