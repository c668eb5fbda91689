"""Schedules of many phases (a noise multiplier or sample rate changed every epoch): the batched RDP series
(:func:`dpaudit.accounting.rdp.rdp_poisson_gaussian_rows`), the RDP accountant's deferred fractional orders, the PLD
accountant's composition of many PMFs and both accountants' cost estimates, against oracles that do not share their
code: each mechanism's curve alone, closed forms (Gaussian RDP α/(2σ²) per step, GDP's μ² adding) and dp_accounting."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.accounting import (
    GdpAccountant,
    PldAccountant,
    RdpAccountant,
    dpsgd_event,
    dpsgd_schedule_event,
    epsilon_for,
)
from dpaudit.accounting import rdp as rdp_module
from dpaudit.accounting.rdp import (
    DEFAULT_ORDERS,
    rdp_poisson_gaussian,
    rdp_poisson_gaussian_rows,
    rdp_to_epsilon,
)
from dpaudit.cli.main import app
from dpaudit.events import Composed, Gaussian, Laplace, PoissonSampled, SelfComposed
from tests.accounting.test_schedule import _csv, _dpa_composed, _gdp_epsilon_closed_form

runner = CliRunner()
DELTA = 1e-5
ORDERS = np.array(DEFAULT_ORDERS)

# Ten phases: two pairs share sigma with different q, two share q with different sigma (a key of sigma alone, or of
# q alone, merges them), and sigma from 0.7 to 3 (fractional orders near 1 are needed at the small ones).
PHASES = [
    (0.7, 0.02, 40),
    (0.9, 0.01, 300),
    (0.9, 0.02, 100),
    (1.1, 0.01, 200),
    (1.3, 0.005, 500),
    (1.3, 0.01, 250),
    (1.6, 0.005, 700),
    (2.0, 0.004, 1000),
    (2.5, 0.004, 1200),
    (3.0, 0.002, 2000),
]


def test_rdp_rows_are_each_mechanism_alone_bit_for_bit(monkeypatch):
    # Blocks of 2 rows and 64 elements (the defaults hold thousands) so that every row crosses block boundaries: no
    # row may read another's terms or stop rule; the special rows (no noise, infinite noise, q = 1, sigma^2 overflow
    # and subnormal) sit between the series rows.
    monkeypatch.setattr(rdp_module, "_FRACTIONAL_ROWS", 2)
    monkeypatch.setattr(rdp_module, "_BATCH_ELEMENTS", 64)
    mechs = [(q, s) for s, q, _ in PHASES[:5]] + [(0.3, 0.0), (0.1, math.inf), (1.0, 2.0), (0.2, 2e154)]
    mechs += [(0.01, 1e-153), (1e-5, 0.5), (0.5, 0.8)]
    orders = [1.05, 1.5, 2.0, 2.5, 7.0, 10.5, 64.0, 256.0, 50.5, math.inf]
    rows = rdp_poisson_gaussian_rows(mechs, orders)
    monkeypatch.undo()
    for row, (q, s) in zip(rows, mechs, strict=True):
        np.testing.assert_array_equal(row, rdp_poisson_gaussian(q, s, orders))
    assert rows.shape == (len(mechs), len(orders)) and np.all(rows >= 0.0)


def _phase_curves_epsilon(phases, delta):
    """epsilon of the sum over phases of steps x the phase's own curve (one rdp_poisson_gaussian call each; Mironov
    2017, Prop. 1: RDP adds under composition), by the documented conversion."""
    total = sum(t * _curve(q, s) for s, q, t in phases)
    return rdp_to_epsilon(DEFAULT_ORDERS, total, delta)[0]


_CURVES: dict = {}


def _curve(q, s):
    if (q, s) not in _CURVES:
        _CURVES[q, s] = rdp_poisson_gaussian(q, s, DEFAULT_ORDERS)
    return _CURVES[q, s]


def test_rdp_of_a_schedule_is_the_sum_of_its_phases_curves():
    # Fails if phases of one sigma (or one q) are merged, or one is dropped: each moves epsilon by far more than the
    # summation order's last bits (rel 1e-12).
    for delta in (1e-5, 1e-9, 0.05):
        eps = epsilon_for(dpsgd_schedule_event(PHASES), delta, "rdp")
        assert eps == pytest.approx(_phase_curves_epsilon(PHASES, delta), rel=1e-12, abs=0.0)
        for k in range(len(PHASES)):
            assert eps > _phase_curves_epsilon(PHASES[:k] + PHASES[k + 1 :], delta)


def test_rdp_without_subsampling_is_the_gaussian_closed_form():
    # q = 1: each step is the Gaussian mechanism, RDP alpha / (2 sigma^2) (Mironov 2017, Prop. 7), summed over steps.
    phases = [(0.8 + 0.3 * k, 1.0, 3 + k) for k in range(9)]
    closed = ORDERS * sum(t / (2.0 * s * s) for s, _, t in phases)
    acc = RdpAccountant().compose(dpsgd_schedule_event(phases))
    np.testing.assert_allclose(acc.rdp, closed, rtol=1e-13)
    assert acc.epsilon(DELTA) == pytest.approx(rdp_to_epsilon(DEFAULT_ORDERS, closed, DELTA)[0], rel=1e-12)


@pytest.mark.parametrize(
    ("event", "delta"),
    [
        (dpsgd_schedule_event(PHASES), 1e-5),
        (dpsgd_schedule_event(PHASES), 1e-12),
        (dpsgd_schedule_event(PHASES[:3]), 0.09),  # epsilon ~ 8: the best order is fractional (about 2.5)
        # delta 0.3: epsilon 0 from a fractional order's conversion; the integer orders alone give 0.028
        (dpsgd_event(noise_multiplier=1.984489586954484, sample_rate=1.0, steps=1), 0.3),
        # delta 0.9: epsilon 0 from the Bretagnolle-Huber check at orders 1.1-1.2 alone; the integer orders give 1.59
        (dpsgd_event(noise_multiplier=0.59, sample_rate=1.0, steps=1), 0.9),
        # delta 1e-5: epsilon 0 from that check at order 1.1 (r 8.9e-11 < delta^2), whose conversion is ~112; the
        # integer orders give 1.44: only the KL floor (RdpAccountant._epsilon) keeps order 1.1
        (dpsgd_event(noise_multiplier=0.5, sample_rate=1e-6, steps=3), 1e-5),
        (Composed((Gaussian(30.0), dpsgd_schedule_event(PHASES[4:]), SelfComposed(Laplace(40.0), 3))), 1e-6),
        (SelfComposed(PoissonSampled(1e-4, Gaussian(1e4)), 10), 0.5),
    ],
)
def test_deferred_orders_give_the_epsilon_of_every_order(event, delta):
    # RdpAccountant computes a subsampled Gaussian's fractional orders only where the query needs them; epsilon must be
    # the same number as the minimum over every order of the full curve (the rdp property computes them all).
    full = RdpAccountant().compose(event).rdp
    acc = RdpAccountant().compose(event)
    eps = acc.epsilon(delta)
    assert eps == rdp_to_epsilon(DEFAULT_ORDERS, full, delta)[0]
    assert acc.epsilon(delta / 2) == rdp_to_epsilon(DEFAULT_ORDERS, full, delta / 2)[0]  # a second query, more orders
    np.testing.assert_array_equal(acc.rdp, full)  # and what was deferred is then computed as at once
    assert acc.delta(eps + 0.5) == RdpAccountant().compose(event).delta(eps + 0.5)


def test_rdp_schedule_matches_dp_accounting():
    dpa = pytest.importorskip("dp_accounting")
    theirs = dpa.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    theirs.compose(_dpa_composed(dpa, PHASES))
    for delta in (1e-5, 1e-8):
        ours = epsilon_for(dpsgd_schedule_event(PHASES), delta, "rdp")
        assert ours == pytest.approx(theirs.get_epsilon(delta), rel=1e-6)  # test_peers' tolerance (same orders)


def test_many_full_batch_phases_pld_and_gdp_are_the_gdp_closed_form():
    # q = 1: (1/sigma)-GDP per step, mu^2 adds (Dong, Roth & Su 2022, Cor. 3.3). Seven distinct phases composed:
    # dropping any one is > 0.05 off.
    phases = [(0.9 + 0.4 * k, 1.0, 2 + k) for k in range(7)]
    mu = math.sqrt(sum(t / s**2 for s, _, t in phases))
    exact = _gdp_epsilon_closed_form(mu, DELTA)
    event = dpsgd_schedule_event(phases)
    pld = PldAccountant().compose(event).epsilon(DELTA)
    # Pessimistic discretisation: never below; 7 leaves on a 1e-4-nat grid, each moved by < 1 step: within 1e-3 nats
    assert exact <= pld <= exact + 1e-3
    assert exact <= GdpAccountant().compose(event).epsilon(DELTA) <= exact * (1 + 1e-9)


@pytest.mark.parametrize("accountant", ["rdp", "pld", "gdp"])
def test_order_split_and_steps_properties(accountant):
    # Composition commutes (RDP adds curves, PLD convolves, GDP adds mu^2): any order of the phases as a Composed gives
    # the same epsilon up to the last bits of the sums; a phase split into two equal halves is the same event's count
    # (bit for bit); one more step never lowers epsilon.
    import warnings

    phases = [(0.9 + 0.2 * k, 0.02 if k % 3 else 0.01, 50 + 10 * k) for k in range(7)]
    events = [dpsgd_event(noise_multiplier=s, sample_rate=q, steps=t) for s, q, t in phases]

    def eps(event):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # GDP's CLT caveat
            return epsilon_for(event, DELTA, accountant)

    base = eps(Composed(tuple(events)))
    shuffled = events[:]
    random.Random(3).shuffle(shuffled)
    assert eps(Composed(tuple(shuffled))) == pytest.approx(base, rel=1e-9 if accountant == "pld" else 1e-12)
    s, q, t = phases[2]
    halves = (dpsgd_event(noise_multiplier=s, sample_rate=q, steps=t // 2),) * 2
    split = Composed((*events[:2], *halves, *events[3:]))
    assert t % 2 == 0
    if accountant == "gdp":  # GDP charges each addition's rounding to mu (GdpAccountant._mu_up): one more here
        assert eps(split) == pytest.approx(base, rel=1e-14)
    else:
        assert eps(split) == base
    more = Composed((*events[:2], dpsgd_event(noise_multiplier=s, sample_rate=q, steps=t + 1), *events[3:]))
    assert eps(more) >= base


def test_cost_estimates_refuse_before_any_work_and_announce_long_work(tmp_path, monkeypatch):
    # The estimates (dpaudit.budget): above an hour refused without --yes, one line, exit 2, before any series or
    # discretisation (the per-unit costs are raised here to make three phases an hour's work); above a minute, one
    # line on stderr saying what is slow and why, then the result.
    import dpaudit.accounting.pld as pld_module

    path = _csv(tmp_path, PHASES[:3])
    monkeypatch.setattr(rdp_module, "RDP_SECONDS_PER_MECHANISM", 3600.0)
    monkeypatch.setattr(pld_module, "PLD_SECONDS_PER_POINT", 1.0)
    for accountant, what in (("rdp", "RDP accounting of 3 Poisson-subsampled Gaussians"),
                             ("pld", "PLD accounting of 3 distinct mechanisms (6 loss distributions")):  # fmt: skip
        r = runner.invoke(
            app, ["account", "dpsgd", "--schedule", str(path), "--delta", "1e-5", "--accountant", accountant]
        )
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and what in lines[0] and "--yes" in lines[0], r.stderr
    monkeypatch.setattr(rdp_module, "RDP_SECONDS_PER_MECHANISM", 30.0)
    r = runner.invoke(app, ["account", "dpsgd", "--schedule", str(path), "--delta", "1e-5", "--json"])
    assert r.exit_code == 0, r.output
    assert "RDP accounting of 3 Poisson-subsampled Gaussians" in r.stderr and "about 1.5 minutes" in r.stderr
    assert json.loads(r.stdout)["epsilon"] == epsilon_for(dpsgd_schedule_event(PHASES[:3]), DELTA, "rdp")
