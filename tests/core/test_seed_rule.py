"""One seed rule (dpaudit.validation.check_seed): every library entry point that takes a seed refuses a bad
one with the same message, naming its parameter; a user's seed is in [0, 2**32 - 1], and the objects that
receive seeds dpaudit derives itself (TrainConfig, GradientCanaries, dpaudit.seeding) take [0, 2**63 - 1]."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.errors import InputError
from dpaudit.validation import MAX_DERIVED_SEED, MAX_SEED, check_seed


def _entry_points():
    from dpaudit.aggregation import AggregatorConfig
    from dpaudit.audit import audit_scores
    from dpaudit.data import make_splits
    from dpaudit.hooks.core import GradientCanaries
    from dpaudit.seeding import derive_seed, numpy_rng
    from dpaudit.testing import audit_mechanism
    from dpaudit.training.config import DPConfig, TrainConfig
    from dpaudit.training.pate import AggregationConfig
    from dpaudit.workflows.whitebox import audit_whitebox_steps

    agg = AggregatorConfig(name="gnmax", sigma=10.0)
    dp = TrainConfig(algo="dpsgd", dp=DPConfig(noise_multiplier=1.0, clip=1.0)).dp
    scores, member = np.arange(20.0), np.arange(20) % 2 == 0
    user = {
        "AggregationConfig": lambda s: AggregationConfig(algo="pate", teachers=5, aggregator=agg, queries=10, seed=s),
        "audit_scores": lambda s: audit_scores(scores, member, seed=s),
        "audit_mechanism": lambda s: audit_mechanism(
            lambda d, rng: 0.0, 0, 1, epsilon=1.0, delta=1e-5, trials=10, seed=s
        ),
        "make_splits": lambda s: make_splits(100, s),
        "audit_whitebox_steps": lambda s: audit_whitebox_steps(None, None, TrainConfig(algo="dpsgd", dp=dp), seed=s),
    }
    derived = {
        "TrainConfig": lambda s: TrainConfig(seed=s),
        "GradientCanaries": lambda s: GradientCanaries({"w": (4,)}, count=4, sample_rate=0.5, clip=1.0, seed=s),
        "numpy_rng": lambda s: numpy_rng(s),
        "derive_seed": lambda s: derive_seed(s),
    }
    return user, derived


def test_every_seed_check_is_the_one_rule():
    user, derived = _entry_points()
    for limits, entries in ((MAX_SEED, user), (MAX_DERIVED_SEED, derived)):
        for name, call in entries.items():
            for bad in (-1, limits + 1, 1.5, True, "3"):
                with pytest.raises(InputError) as e:
                    call(bad)
                shown = repr(bad) if isinstance(bad, str) else str(bad)
                what = "split_seed" if name == "make_splits" else "seed"
                assert str(e.value) == f"expected {what} to be an integer in [0, {limits}], got {shown}", (name, bad)


def test_derived_seeds_are_accepted_where_they_arrive():
    """The seeds dpaudit derives (derive_seed's 63 bits; an audit run's seed * 1_000_003 + 3r + 11) pass."""
    from dpaudit.seeding import derive_seed, numpy_rng
    from dpaudit.training.config import TrainConfig

    big = derive_seed(MAX_SEED)  # 63 bits
    assert big > MAX_SEED
    assert TrainConfig(seed=np.int64(big)).seed == big and type(TrainConfig(seed=np.int64(3)).seed) is int
    assert TrainConfig(seed=MAX_SEED * 1_000_003 + 3 * 99 + 11 + 5).seed > MAX_SEED
    numpy_rng(big, stream=big)
    with pytest.raises(InputError, match=r"expected stream to be an integer in \[0, "):
        numpy_rng(0, stream=-1)


def test_jax_and_numpy_0d_integers_are_seeds_and_a_prng_key_is_refused_in_one_line():
    """A JAX user's ``jnp.int32(3)`` (or NumPy's ``np.array(3)``) was refused as "not an integer, got 3", and a
    typed PRNG key ``jax.random.key(0)`` given as a seed raised NotImplementedError from inside the message."""
    jax = pytest.importorskip("jax")
    from dpaudit.hooks import GradientCanaries

    for seed in (jax.numpy.int32(3), np.array(3)):
        c = GradientCanaries({"w": (10,)}, count=jax.numpy.int32(5), sample_rate=0.5, clip=1.0, seed=seed)
        assert (c.seed, c.count) == (3, 5) and type(c.seed) is int
    for key in (jax.random.key(0), jax.random.PRNGKey(0)):
        with pytest.raises(InputError, match=r"expected seed to be an integer") as err:
            check_seed(seed=key)
        assert "\n" not in str(err.value)
