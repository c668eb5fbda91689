"""Events: validation, immutability, JSON round trip."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.errors import InputError
from dpaudit.events import (
    ZCDP,
    Composed,
    EpsilonDelta,
    Event,
    FixedSizeSampled,
    Gaussian,
    GNMax,
    JLGaussian,
    Laplace,
    LNMax,
    NonPrivate,
    NoOp,
    PoissonSampled,
    RandomizedResponse,
    SelfComposed,
    event_from_dict,
)
from dpaudit.validation import MIN_NOISE_MULTIPLIER

# A noise multiplier is 0 (no noise) or at least MIN_NOISE_MULTIPLIER (below it the accountants overflow).
noise = st.one_of(st.just(0.0), st.floats(MIN_NOISE_MULTIPLIER, 50.0))
leaves = st.one_of(
    noise.map(Gaussian),
    noise.map(Laplace),
    st.builds(JLGaussian, st.one_of(st.just(0.0), st.floats(MIN_NOISE_MULTIPLIER, 10.0)), st.integers(1, 1000)),
    st.floats(0.0, 5.0).map(ZCDP),
    st.builds(EpsilonDelta, st.floats(0.0, 20.0), st.floats(0.0, 1.0)),
    st.builds(RandomizedResponse, st.floats(0.0, 1.0), st.integers(1, 100)),
    st.builds(GNMax, st.floats(0.0, 100.0), st.integers(2, 1000)),
    st.builds(LNMax, st.floats(0.0, 100.0), st.integers(2, 1000)),
    st.just(NonPrivate()),
    st.just(NoOp()),
)


def _extend(children):
    return st.one_of(
        st.builds(PoissonSampled, st.floats(1e-6, 1.0), children),
        st.builds(SelfComposed, children, st.integers(1, 10**6)),
        st.lists(children, max_size=4).map(lambda xs: Composed(tuple(xs))),
        st.builds(
            lambda b, extra, e: FixedSizeSampled(b, b + extra, e), st.integers(1, 1000), st.integers(0, 10**5), children
        ),
    )


events = st.recursive(leaves, _extend, max_leaves=8)


@settings(max_examples=100, deadline=None)
@given(events)
def test_json_round_trip(event):
    d = event.to_dict()
    text = json.dumps(d)  # plain JSON, no custom encoder needed
    back = event_from_dict(json.loads(text))
    assert back == event
    assert hash(back) == hash(event)
    assert back.to_dict() == d


def test_to_dict_shape():
    e = SelfComposed(PoissonSampled(0.01, Gaussian(1.1)), 100)
    assert e.to_dict() == {
        "type": "self_composed",
        "event": {
            "type": "poisson_sampled",
            "sample_rate": 0.01,
            "event": {"type": "gaussian", "noise_multiplier": 1.1},
        },
        "count": 100,
    }
    assert Composed((NoOp(), NonPrivate())).to_dict() == {
        "type": "composed",
        "events": [{"type": "no_op"}, {"type": "non_private"}],
    }


def test_events_are_frozen():
    e = Gaussian(1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.noise_multiplier = 2.0  # type: ignore[misc]


def test_composed_accepts_list_and_stores_tuple():
    c = Composed([Gaussian(1.0), Laplace(2.0)])  # type: ignore[arg-type]
    assert isinstance(c.events, tuple)
    assert c == Composed((Gaussian(1.0), Laplace(2.0)))


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: Gaussian(-1.0), "expected noise_multiplier >= 0, got -1.0"),
        (lambda: Gaussian(1e-300), "expected noise_multiplier = 0 (no noise) or >= 1e-06, got 1e-300"),
        (lambda: Gaussian(float("inf")), "expected noise_multiplier to be finite, got inf"),
        (lambda: Gaussian(float("nan")), "noise_multiplier"),
        (lambda: PoissonSampled(1.5, Gaussian(1.0)), "expected sample_rate in (0, 1], got 1.5"),
        (lambda: PoissonSampled(0.0, Gaussian(1.0)), "sample_rate"),
        (lambda: PoissonSampled(0.5, "gaussian"), "expected event to be an Event"),
        (lambda: SelfComposed(Gaussian(1.0), 0), "expected count >= 1"),
        (lambda: SelfComposed(Gaussian(1.0), 2.5), "expected count to be an integer"),
        (lambda: FixedSizeSampled(11, 10, Gaussian(1.0)), "batch_size <= dataset_size"),
        (lambda: JLGaussian(1.0, 0), "expected projections >= 1"),
        (lambda: EpsilonDelta(float("inf"), 0.0), "finite"),
        (lambda: EpsilonDelta(1.0, 1.5), "delta"),
        (lambda: RandomizedResponse(1.5, 2), "noise_parameter"),
        (lambda: GNMax(1.0, 1), "n_classes >= 2"),
        (lambda: ZCDP(-0.1), "rho"),
        (lambda: Composed((Gaussian(1.0), 3)), "events[1]"),
    ],
)
def test_validation(factory, message):
    with pytest.raises(
        InputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    ):
        factory()


@pytest.mark.parametrize(
    ("d", "message"),
    [
        ({"type": "gausian", "noise_multiplier": 1.0}, "unknown event type 'gausian'"),
        ({"noise_multiplier": 1.0}, "missing its 'type'"),
        ({"type": "gaussian"}, "missing field"),
        ({"type": "gaussian", "noise_multiplier": 1.0, "sigma": 2}, "unknown field"),
        ({"type": "gaussian", "noise_multiplier": -1.0}, "noise_multiplier >= 0"),
        ({"type": "composed", "events": 3}, "list"),
        ([1, 2], "JSON object"),
    ],
)
def test_from_dict_errors(d, message):
    with pytest.raises(InputError, match=message):
        event_from_dict(d)


def test_every_event_type_is_registered():
    names = {cls.type_name for cls in Event.__subclasses__()}
    assert names == {
        "gaussian",
        "laplace",
        "jl_gaussian",
        "zcdp",
        "epsilon_delta",
        "randomized_response",
        "gnmax",
        "lnmax",
        "non_private",
        "no_op",
        "poisson_sampled",
        "fixed_size_sampled",
        "self_composed",
        "composed",
    }
