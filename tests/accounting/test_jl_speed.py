"""The shortcuts of DP-SGD-JL accounting give the numbers of the slow path, bit for bit.

Two shortcuts (benchmarks/jl_accounting_speed.py measures them): PldAccountant remembers the epsilon of a JL ledger
(``JL_EPSILONS``, keyed by every parameter it reads), and calibration skips the slow accountant where the formal
lower bound already exceeds the target. Neither may change a result: a remembered answer must be the one a fresh
accountant gives for exactly those parameters, and the skip must take the decisions the accountant would.
"""

from __future__ import annotations

import math

import pytest

from dpaudit.accounting import PldAccountant, calibrate_noise_multiplier, dpsgd_event, make_accountant
from dpaudit.accounting import pld as pld_module
from dpaudit.accounting.jl import epsilon_lower_bound
from dpaudit.events import Composed, Gaussian, JLGaussian, PoissonSampled, SelfComposed

# Coarse accountant options (few Z_r bins, a wide grid: valid and looser, ~0.3 s a query); each variant below moves
# exactly one thing the answer depends on.
FAST = {"value_discretization_interval": 3e-2, "jl_bins": 5}
SIGMA, R, Q, STEPS, DELTA = 2.0, 16, 0.25, 3, 1e-5


def _ledger(sigma=SIGMA, r=R, q=Q, steps=STEPS):
    return dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps, jl_projections=r)


class _Subclass(PldAccountant):
    """Another accountant class (e.g. a test's planted one) with the same options: its answers are its own."""

    def _jl_epsilon(self, delta, jl):
        return super()._jl_epsilon(delta, jl) + 1.0


# (accountant options, event, delta) differing from the base in one field each.
VARIANTS = {
    "noise_multiplier": (FAST, _ledger(sigma=2.5), DELTA),
    "noise_multiplier_bits": (FAST, _ledger(sigma=math.nextafter(SIGMA, 3.0)), DELTA),
    "projections": (FAST, _ledger(r=8), DELTA),
    "sample_rate": (FAST, _ledger(q=0.2), DELTA),
    "steps": (FAST, _ledger(steps=4), DELTA),
    "delta": (FAST, _ledger(), 1e-6),
    "value_discretization_interval": ({**FAST, "value_discretization_interval": 2e-2}, _ledger(), DELTA),
    "jl_bins": ({**FAST, "jl_bins": 7}, _ledger(), DELTA),
    "tail_mass_truncation": ({**FAST, "tail_mass_truncation": 1e-9}, _ledger(), DELTA),
    "jl_initial_cap": ({**FAST, "jl_initial_cap": 30.0}, _ledger(), DELTA),
    # max_loss and max_bins reach only a ledger's other leaves (a Gaussian beside the JL steps) and the common grid
    "max_loss": ({**FAST, "max_loss": 6.0}, Composed((_ledger(), Gaussian(1.0))), DELTA),
    "max_bins": ({**FAST, "max_bins": 1000}, _ledger(), DELTA),
}


def _epsilon(options, event, delta, cls=PldAccountant):
    return cls(**options).compose(event).epsilon(delta)


@pytest.mark.parametrize("field", list(VARIANTS))
def test_a_remembered_jl_epsilon_is_never_returned_for_other_parameters(field):
    """Plant: any field dropped from PldAccountant._memo_key (an option, the event's noise, r, q or count, delta, or
    a float compared by value instead of bits) makes its variant read the base's answer."""
    options, event, delta = VARIANTS[field]
    fresh = _epsilon(options, event, delta)  # the variant alone (the conftest fixture emptied the memo)
    pld_module.JL_EPSILONS.clear()
    base = _epsilon(FAST, _ledger(), DELTA)
    if field == "max_loss":  # the base for this one has the Gaussian leaf too
        base = _epsilon(FAST, Composed((_ledger(), Gaussian(1.0))), DELTA)
    assert fresh != base  # the variant moves the answer, so a shared key would show
    assert _epsilon(options, event, delta) == fresh


def test_a_remembered_jl_epsilon_is_never_returned_for_another_class():
    mine = _epsilon(FAST, _ledger(), DELTA)
    assert _epsilon(FAST, _ledger(), DELTA, cls=_Subclass) == mine + 1.0


def test_the_same_query_is_answered_from_memory_with_the_same_bits(monkeypatch):
    event = Composed((_ledger(), SelfComposed(PoissonSampled(0.1, JLGaussian(3.0, 4)), 2)))
    first = _epsilon(FAST, event, DELTA)

    def recomputed(self, delta, jl):
        raise AssertionError("asked again")

    monkeypatch.setattr(PldAccountant, "_jl_epsilon", recomputed)
    assert _epsilon(FAST, event, DELTA) == first  # an equal ledger built afresh: the same key


def test_the_memo_keeps_its_bound():
    memo = pld_module._Memo(3)
    for k in range(5):
        memo.put((k,), float(k))
    assert [memo.get((k,)) for k in range(5)] == [None, None, 2.0, 3.0, 4.0]
    memo.put((2,), 2.5)  # stored again: now the most recent, so the next put drops (3,), the least recently stored
    memo.put((5,), 5.0)
    assert [memo.get((k,)) for k in (2, 3, 4, 5)] == [2.5, None, 4.0, 5.0]


def test_exact_keys_tell_apart_what_equality_does_not():
    exact = pld_module._exact
    assert exact(0.0) != exact(-0.0) and exact(1) != exact(1.0) and exact(True) != exact(1)
    assert exact(Gaussian(1.0)) != exact(JLGaussian(1.0, 1))  # class, not only the fields
    assert exact(Gaussian(1.0)) == exact(Gaussian(1.0))
    # recursively: inside tuples (the options, the ledger) too, where == compares values
    assert exact((1, "x")) != exact((1.0, "x")) and exact((0.0, "x")) != exact((-0.0, "x"))
    assert exact("add_remove") != exact("replace_one") and exact(2**53) != exact(2**53 + 1)  # counts beyond floats
    assert exact([0.5, 2]) == exact((0.5, 2))  # a list is its tuple
    with pytest.raises(TypeError, match="no exact key for object"):
        exact(object())


# -- calibration: the lower bound's skip takes the accountant's own decisions ---------------------------------


class _Counting:
    """An accountant factory that counts the slow accountant's queries."""

    def __init__(self, name="gdp", **options):
        self.name, self.options, self.calls = name, options, 0

    def __call__(self):
        self.calls += 1
        return PldAccountant(**self.options) if self.name == "pld" else make_accountant(self.name)


# 60 settings (T Gaussian steps, target epsilon, delta): the GDP accountant is exact for them (Dong, Roth & Su 2022,
# Cor. 3.3) and answers in microseconds, so the grid can be large; epsilon decreases in sigma, as calibration assumes.
GRID = [(t, e, d) for t in (1, 3, 10, 100, 1000) for e in (0.1, 0.5, 2.0, 8.0) for d in (1e-3, 1e-5, 1e-9)]


@pytest.mark.parametrize(("fraction"), [0.999, 0.8, 0.3])
def test_calibration_with_a_lower_bound_returns_the_sigma_it_returns_without(fraction):
    """Any valid lower bound (here a fraction of the accountant's own epsilon) leaves sigma unchanged to the bit while
    saving slow queries. Plants: the skip deciding on a bound that is not above the target (``> target * 0.99``),
    or the bisection's skip taken the wrong way round, move sigma; the skip removed saves nothing."""
    saved = 0
    for steps, target, delta in GRID:
        asked = []

        def make(s, steps=steps, asked=asked):
            asked.append(s)
            return SelfComposed(Gaussian(s), steps)

        def bound(s, steps=steps, delta=delta):
            return fraction * make_accountant("gdp").compose(SelfComposed(Gaussian(s), steps)).epsilon(delta)

        plain, skipping = _Counting(), _Counting()
        common = {"target_epsilon": target, "delta": delta, "make_event": make, "tol": 1e-6}
        expected = calibrate_noise_multiplier(accountant=plain, **common)
        asked.clear()
        got = calibrate_noise_multiplier(accountant=skipping, lower_bound=bound, **common)
        assert got == expected, (steps, target, delta)
        assert not [s for s in asked if bound(s) > target]  # never asked where the bound decides
        saved += plain.calls - skipping.calls
    assert saved >= len(GRID) // 2  # the first bracket's lower end, wherever the bound moved the bracket


def test_jl_calibration_and_claim_need_fewer_slow_queries_and_give_the_same_sigma():
    """The JL path as the trainer runs it (dpaudit.training.dpsgd._calibrate: the JL lower bound, tol 1e-2) against the
    bare search: the same sigma; the verification and the claim's epsilon come from memory."""
    q, steps, target, r = 0.25, 3, 4.0, 16
    asked = []

    def make(s):
        asked.append(s)
        return dpsgd_event(noise_multiplier=s, sample_rate=q, steps=steps, jl_projections=r)

    def bound(s):
        return epsilon_lower_bound(s, r, q, steps, DELTA)

    pld_module.JL_EPSILONS.size = 0  # the reference: every query computed afresh
    try:
        expected = calibrate_noise_multiplier(
            target_epsilon=target, delta=DELTA, make_event=make, accountant=_Counting("pld", **FAST), tol=1e-2
        )
    finally:
        pld_module.JL_EPSILONS.size = 256
    computed = []
    original = PldAccountant._jl_epsilon

    def counted(self, delta, jl):
        computed.append(delta)
        return original(self, delta, jl)

    asked.clear()
    PldAccountant._jl_epsilon = counted
    try:
        got = calibrate_noise_multiplier(
            target_epsilon=target, delta=DELTA, make_event=make, accountant=_Counting("pld", **FAST),
            lower_bound=bound, tol=1e-2,
        )  # fmt: skip
        claim = PldAccountant(**FAST).compose(make(got)).epsilon(DELTA)
    finally:
        PldAccountant._jl_epsilon = original
    assert got == expected
    assert claim <= target
    assert bound(1.0) > target  # so the first bracket's lower end is one the bound decides
    assert not [s for s in asked if bound(s) > target]
    assert len(computed) == len(set(asked)) < len(asked)  # each sigma once: the verification and claim remembered
