"""Contract every accountant must pass, and property tests of monotonicity and sanity."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.accounting import (
    ACCOUNTANTS,
    GdpAccountant,
    PldAccountant,
    RdpAccountant,
    ZcdpAccountant,
    dpsgd_event,
    epsilon_for,
    make_accountant,
)
from dpaudit.errors import InputError, UnsupportedEventError
from dpaudit.events import (
    Composed,
    FixedSizeSampled,
    Gaussian,
    JLGaussian,
    NonPrivate,
    NoOp,
    PoissonSampled,
    SelfComposed,
)
from dpaudit.validation import MIN_NOISE_MULTIPLIER

warnings.filterwarnings("ignore", message="GDP accounting", category=UserWarning)


def _fast(name: str, **kw):
    if name == "pld":
        return PldAccountant(value_discretization_interval=1e-3, **kw)
    return make_accountant(name, **kw)


class AccountantContract:
    """Shared behaviour; subclasses set ``name`` and a supported leaf."""

    name = ""
    leaf = Gaussian(2.0)

    def make(self, **kw):
        return _fast(self.name, **kw)

    def test_empty_ledger_costs_nothing(self):
        acc = self.make()
        assert acc.epsilon(1e-5) == 0.0
        assert acc.delta(0.0) == 0.0
        assert acc.ledger == []

    def test_noop_costs_nothing(self):
        acc = self.make().compose(NoOp(), 10)
        assert acc.epsilon(1e-5) == 0.0
        assert acc.ledger == [(NoOp(), 10)]

    def test_non_private_is_infinite(self):
        acc = self.make().compose(Composed((self.leaf, NonPrivate())))
        assert acc.epsilon(1e-5) == math.inf
        assert acc.delta(100.0) == 1.0

    def test_compose_returns_self_and_records_ledger(self):
        acc = self.make()
        assert acc.compose(self.leaf, 3) is acc
        assert acc.ledger == [(self.leaf, 3)]

    def test_self_composed_equals_repeated_compose(self):
        a = self.make().compose(self.leaf, 2).compose(self.leaf, 3).epsilon(1e-6)
        b = self.make().compose(SelfComposed(self.leaf, 5)).epsilon(1e-6)
        assert a == pytest.approx(b, rel=1e-12)

    def test_composed_order_independent(self):
        other = Gaussian(5.0)
        a = self.make().compose(Composed((self.leaf, other, self.leaf))).epsilon(1e-6)
        b = self.make().compose(Composed((other, self.leaf, self.leaf))).epsilon(1e-6)
        assert a == pytest.approx(b, rel=1e-9)

    def test_round_trip(self):
        acc = self.make().compose(self.leaf, 4)
        for delta in (1e-3, 1e-7):
            eps = acc.epsilon(delta)
            assert 0.0 < eps < math.inf
            assert acc.delta(eps) <= delta * (1 + 1e-9)

    def test_degenerate_delta(self):
        acc = self.make().compose(self.leaf)
        assert acc.epsilon(1.0) == 0.0
        assert acc.epsilon(0.0) == math.inf
        assert acc.delta(math.inf) == 0.0 or self.name == "pld"

    def test_unsupported_is_atomic_and_names_the_subevent(self):
        acc = self.make().compose(self.leaf)
        before = acc.epsilon(1e-5)
        bad = JLGaussian(1.0, 3) if self.name != "pld" else FixedSizeSampled(1, 10, Gaussian(1.0))
        with pytest.raises(UnsupportedEventError, match=r"JLGaussian|FixedSizeSampled"):
            acc.compose(Composed((Gaussian(1.0), bad)))
        assert acc.epsilon(1e-5) == before
        assert len(acc.ledger) == 1

    def test_bad_arguments(self):
        with pytest.raises(InputError, match="neighbouring"):
            self.make(neighbouring="swap")
        acc = self.make()
        with pytest.raises(InputError, match="delta"):
            acc.epsilon(1.5)
        with pytest.raises(InputError, match="epsilon"):
            acc.delta(-1.0)
        with pytest.raises(InputError, match="count"):
            acc.compose(self.leaf, 0)
        with pytest.raises(InputError, match="Event"):
            acc.compose("gaussian")  # type: ignore[arg-type]

    def test_zero_noise_is_infinite_not_an_error(self):
        assert self.make().compose(Gaussian(0.0)).epsilon(1e-5) == math.inf


class TestRdpContract(AccountantContract):
    name = "rdp"


class TestPldContract(AccountantContract):
    name = "pld"


class TestGdpContract(AccountantContract):
    name = "gdp"


class TestZcdpContract(AccountantContract):
    name = "zcdp"


def test_make_accountant_names():
    assert set(ACCOUNTANTS) == {"rdp", "pld", "gdp", "zcdp"}
    assert isinstance(make_accountant("rdp"), RdpAccountant)
    assert isinstance(make_accountant("pld", neighbouring="replace_one"), PldAccountant)
    assert isinstance(make_accountant("gdp"), GdpAccountant)
    assert isinstance(make_accountant("zcdp"), ZcdpAccountant)
    with pytest.raises(InputError, match="valid: rdp, pld, gdp, zcdp"):
        make_accountant("moments")


def test_dpsgd_event_shape():
    assert dpsgd_event(noise_multiplier=1.0, sample_rate=0.1, steps=5) == SelfComposed(
        PoissonSampled(0.1, Gaussian(1.0)), 5
    )
    assert dpsgd_event(noise_multiplier=1.0, sample_rate=0.1, steps=5, jl_projections=3) == SelfComposed(
        PoissonSampled(0.1, JLGaussian(1.0, 3)), 5
    )
    with pytest.raises(InputError):
        dpsgd_event(noise_multiplier=1.0, sample_rate=1.5, steps=5)
    with pytest.raises(InputError):
        dpsgd_event(noise_multiplier=1.0, sample_rate=0.5, steps=0)


# ---------------------------------------------------------------------------------------------
# Properties (hypothesis)
# ---------------------------------------------------------------------------------------------

sigmas = st.floats(0.5, 5.0)
rates = st.floats(1e-3, 0.2)
steps = st.integers(1, 2000)
deltas = st.sampled_from([1e-3, 1e-5, 1e-8])


@settings(max_examples=12, deadline=None)
@given(sigmas, rates, steps, deltas)
def test_rdp_monotone_and_finite(sigma, q, t, delta):
    e = epsilon_for(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=t), delta)
    assert 0.0 <= e < math.inf
    assert e <= epsilon_for(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=t + 50), delta)
    assert e <= epsilon_for(dpsgd_event(noise_multiplier=sigma, sample_rate=min(1.0, 1.5 * q), steps=t), delta)
    assert e >= epsilon_for(dpsgd_event(noise_multiplier=sigma * 1.2, sample_rate=q, steps=t), delta)


@settings(max_examples=8, deadline=None)
@given(st.floats(0.7, 3.0), st.floats(1e-3, 0.1), st.integers(1, 500), deltas)
def test_pld_below_rdp_plus_slack_and_monotone(sigma, q, t, delta):
    event = dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=t)
    pld = PldAccountant(value_discretization_interval=1e-3).compose(event).epsilon(delta)
    rdp = RdpAccountant().compose(event).epsilon(delta)
    assert 0.0 <= pld <= rdp + 1e-3
    more = PldAccountant(value_discretization_interval=1e-3).compose(
        dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=2 * t)
    )
    assert pld <= more.epsilon(delta)


@settings(max_examples=25, deadline=None)
@given(
    st.one_of(st.just(0.0), st.floats(MIN_NOISE_MULTIPLIER, 20.0)),
    st.floats(1e-12, 1.0),
    st.integers(1, 10**6),
    st.sampled_from(["rdp", "gdp", "zcdp"]),
)
def test_never_nan_or_negative(sigma, delta, t, name):
    event = SelfComposed(Gaussian(sigma), t)
    acc = make_accountant(name).compose(event)
    e = acc.epsilon(delta)
    assert not math.isnan(e) and e >= 0.0
    d = acc.delta(e if math.isfinite(e) else 1.0)
    assert not math.isnan(d) and 0.0 <= d <= 1.0
