"""The auditor's self-test: power against planted bugs, false alarms on correct mechanisms."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from dpaudit.audit.selftest import (
    REQUIRED_DETECTION,
    SelftestCase,
    default_cases,
    false_alarm_allowance,
    poisson_dpsgd_epsilon,
    run_selftest,
)


def test_false_alarm_allowance_is_the_binomial_quantile():
    assert false_alarm_allowance(200, 0.95) == 21
    assert false_alarm_allowance(50, 0.95) == int(stats.binom.ppf(0.999, 50, 0.05))
    assert stats.binom.sf(false_alarm_allowance(50, 0.95), 50, 0.05) <= 1e-3


@pytest.mark.parametrize(
    ("seeds", "confidence"),
    [(2**40 + 1, 0.95), (2**41 + 7, 0.5), (3 * 2**45, 0.99), (2**52, 1 - 1e-9), (2**62, 1e-9), (2**63 - 1, 0.95)],
)
def test_the_allowance_above_exact_seeds_is_bernsteins_bound(seeds, confidence):
    """Above EXACT_SEEDS: floor((Sα + √(2 Sα(1 − α) L) + L/3)(1 + 1e-12)), L = ln(1/(1 − q)) (Bernstein's
    inequality, Boucheron, Lugosi & Massart 2013, Thm 2.10), by hand at 50 digits; the test of the CLI checks only
    that it lies between the exact quantile and S. A larger allowance lets a buggy auditor pass the self-test, a
    smaller one fails a correct one more often than 0.1%. Planted (each passed the other tests): every term of
    the bound changed (Sα, the variance's α or 1 − α, 2 for 4, L/3 as L, 3 or L/6), ceil, the 1e-12 raise
    dropped or halved or doubled, S − 1 alone. At S = 2^40 the exact quantile (≤ EXACT_SEEDS, not <); at
    confidence 1 (α = 0) no false alarm is allowed."""
    import mpmath as mp

    from dpaudit.audit import selftest

    with mp.workdps(50):
        alpha = mp.mpf(1.0 - confidence)  # the float α the code forms, exactly
        tail = -mp.log(1 - mp.mpf(selftest.ALLOWANCE_QUANTILE))
        bound = (seeds * alpha + mp.sqrt(2 * seeds * alpha * (1 - alpha) * tail) + tail / 3) * (1 + mp.mpf(1e-12))
        frac = bound - mp.floor(bound)
        allowed = false_alarm_allowance(seeds, confidence)
        if bound < 2**53:  # every integer is a float: the floor exactly
            assert 1e-3 < frac < 1 - 1e-3, frac  # a case the float sum cannot round across an integer
            assert allowed == min(seeds - 1, int(mp.floor(bound)))
        else:  # the float sum's rounding, a few ulps (2^-50 relative), far below the 1e-12 raise
            assert abs(allowed - bound) <= bound * 2.0**-50 and allowed < seeds
    assert false_alarm_allowance(2**40, 0.95) == int(stats.binom.ppf(selftest.ALLOWANCE_QUANTILE, 2**40, 0.05))
    assert false_alarm_allowance(2**41, 1.0) == 0


def test_the_self_test_counts_its_trials_memory_before_it_starts(monkeypatch):
    """One audit's scores are held at a time: BYTES_PER_TRIAL (100) bytes per trial. With 1.5e8 bytes available
    (7.5e7 usable), 10^6 trials (1e8 bytes) are refused before anything starts and 10^5 pass the check. Planted:
    the memory as trials alone (1e6 bytes, 100 times too little) started the run (8 cases x 1 seed)."""
    from dpaudit import budget
    from dpaudit.audit import selftest
    from dpaudit.errors import InputError

    monkeypatch.setattr(budget, "available_memory", lambda: 150_000_000)
    monkeypatch.setattr(selftest, "false_alarm_allowance", lambda *a: pytest.fail("started past the cost check"))
    with pytest.raises(InputError, match=r"self-test: 8 audits need about 95\.4 MiB of memory"):
        run_selftest(seeds=1, trials=10**6)

    class Started(Exception):
        pass

    def started(*args):
        raise Started

    monkeypatch.setattr(selftest, "false_alarm_allowance", started)
    with pytest.raises(Started):
        run_selftest(seeds=1, trials=10**5)


def test_planted_bugs_claim_at_most_two():
    # The brief's bar: every bug is caught at a claimed ε ≤ 2 (δ = 1e-5).
    for case in default_cases():
        if case.planted_bug:
            assert case.claimed_epsilon(1e-5) <= 2.0, case.name


def test_claims_come_from_the_accountant():
    # DP-SGD claims are the PLD accountant's; more steps or less noise must cost more ε.
    assert poisson_dpsgd_epsilon(0.1, 2.5, 100, 1e-5) < poisson_dpsgd_epsilon(0.1, 2.5, 200, 1e-5)
    assert poisson_dpsgd_epsilon(0.1, 2.5, 100, 1e-5) < poisson_dpsgd_epsilon(0.1, 2.0, 100, 1e-5)


def test_report_table_and_dict_on_tiny_cases():
    cases = [
        SelftestCase("null", "identical outputs", False, lambda d: 1.0,
                     lambda rng, n: (rng.normal(size=n), rng.normal(size=n))),
        SelftestCase("leak", "outputs reveal the bit", True, lambda d: 0.5,
                     lambda rng, n: (rng.normal(10, 1, n), rng.normal(0, 1, n))),
    ]  # fmt: skip
    rep = run_selftest(seeds=3, trials=300, cases=cases)
    assert [r.passed for r in rep.rows] == [True, True]
    assert rep.mutation_score == 1.0 and rep.false_alarm_rate == 0.0 and rep.passed
    table = rep.table()
    assert "identical outputs" in table and "mutation score: 1/1" in table
    d = rep.to_dict()
    assert d["rows"][1]["flagged_fraction"] == 1.0 and d["bugs_caught"] == 1


@pytest.mark.slow
def test_default_selftest_catches_every_planted_bug():
    rep = run_selftest()  # the defaults of `dpaudit audit selftest`
    for row in rep.rows:
        if row.planted_bug:
            assert row.flagged_fraction >= REQUIRED_DETECTION, row
            assert row.median_lower_bound > row.claimed_epsilon
        else:
            assert row.flagged_fraction * rep.seeds <= false_alarm_allowance(rep.seeds, rep.confidence), row
    assert rep.mutation_score == 1.0 and rep.passed
    assert rep.runtime_s < 120  # ~20 s on 2 cores; the brief's budget is ~1 minute


@pytest.mark.slow
def test_correct_mechanism_false_alarms_stay_within_the_confidence_budget_over_200_seeds():
    # The correct cases alone, with enough seeds to measure a false-alarm rate against α = 5%.
    cases = [c for c in default_cases() if not c.planted_bug]
    rep = run_selftest(seeds=200, trials=1000, cases=cases)
    allowed = false_alarm_allowance(200, 0.95)
    for row in rep.rows:
        assert round(row.flagged_fraction * 200) <= allowed, row
    assert np.isfinite(rep.false_alarm_rate)


def test_too_few_seeds_are_refused_since_an_auditor_flagging_everything_would_pass(monkeypatch):
    # With 1 or 2 seeds at confidence 0.95 the allowance (the 99.9% binomial quantile) is every seed: an
    # auditor whose bound exceeds every claim passed with "false-alarm rate 100%" and exit 0.
    from dpaudit.audit import selftest
    from dpaudit.errors import InputError

    assert selftest.seeds_needed(0.95) == 3 and false_alarm_allowance(3, 0.95) < 3
    real = selftest.audit_scores

    def broken(*args, **kwargs):  # a planted mistake in the bound: every audit says "violation"
        r = real(*args, **kwargs)
        return dataclasses.replace(r, epsilon_lower_bound=99.0, verdict="violation")

    monkeypatch.setattr(selftest, "audit_scores", broken)
    cases = [
        SelftestCase("null", "identical outputs", False, lambda d: 1.0,
                     lambda rng, n: (rng.normal(size=n), rng.normal(size=n))),
    ]  # fmt: skip
    for seeds in (1, 2):
        with pytest.raises(InputError, match="expected seeds >= 3"):
            run_selftest(seeds=seeds, trials=50, cases=cases)
    assert not run_selftest(seeds=3, trials=50, cases=cases).passed
