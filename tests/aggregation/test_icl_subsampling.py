"""DP-ICL with per-query Poisson subsampling of the exemplars (Wu et al. 2024, arXiv:2305.01639, Sec. 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpaudit.accounting import epsilon_for
from dpaudit.aggregation import AggregatorConfig, aggregator_event, calibrate_aggregator, data_independent_epsilon
from dpaudit.errors import InputError
from dpaudit.events import Gaussian, PoissonSampled, SelfComposed


def test_subsampled_gnmax_is_the_sampled_gaussian_of_the_histogram():
    cfg = AggregatorConfig("gnmax", sigma=4.0, sample_rate=0.2)
    event = aggregator_event(cfg, 50, 10)
    assert event == SelfComposed(PoissonSampled(0.2, Gaussian(4.0 / math.sqrt(2.0))), 50)
    # q = 1 is the unsampled histogram release: never below GNMax's own data-independent bound
    full = data_independent_epsilon(AggregatorConfig("gnmax", sigma=4.0, sample_rate=1.0), 50, 10, 1e-5)["epsilon"]
    plain = data_independent_epsilon(AggregatorConfig("gnmax", sigma=4.0), 50, 10, 1e-5)["epsilon"]
    assert full == pytest.approx(plain, rel=1e-9)
    # amplification: the same noise costs less at q = 0.2
    assert data_independent_epsilon(cfg, 50, 10, 1e-5)["epsilon"] < 0.5 * plain
    assert epsilon_for(event, 1e-5, "rdp") == data_independent_epsilon(cfg, 50, 10, 1e-5)["epsilon"]


def test_calibration_with_subsampling_needs_less_noise():
    base = AggregatorConfig("gnmax", sigma=1.0)
    sub = AggregatorConfig("gnmax", sigma=1.0, sample_rate=0.2)
    s_full = calibrate_aggregator(base, target_epsilon=2.0, delta=1e-5, n_queries=100, n_classes=10).sigma
    s_sub = calibrate_aggregator(sub, target_epsilon=2.0, delta=1e-5, n_queries=100, n_classes=10).sigma
    assert s_sub < 0.6 * s_full


def test_subsampling_is_refused_where_it_is_not_analysed():
    with pytest.raises(InputError, match="gnmax aggregator"):
        AggregatorConfig("lnmax", sigma=4.0, sample_rate=0.2)
    with pytest.raises(InputError, match="sample_rate"):
        AggregatorConfig("gnmax", sigma=4.0, sample_rate=0.0)


def test_subsampled_dp_icl_run_claims_add_remove_and_answers_well():
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.pate import AggregationConfig, train_aggregation_run

    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    agg = AggregatorConfig("gnmax", sigma=1.0, sample_rate=0.3)
    cfg = AggregationConfig(algo="dp-icl", teachers=20, aggregator=agg, queries=60, target_epsilon=4.0, seed=0)
    meta = train_aggregation_run(ds, spec, cfg, TrainConfig(epochs=20, lr=0.1, seed=0), out=None)
    p = meta["privacy"]
    assert p["neighbouring"] == "add_remove" and 3.99 < p["epsilon"] <= 4.0
    assert p["event"]["type"] == "self_composed" and p["event"]["event"]["type"] == "poisson_sampled"
    assert meta["training"]["aggregation"]["answer_accuracy"] > 0.5  # chance: 0.1
    with pytest.raises(InputError, match="replaces --shots"):
        AggregationConfig(algo="dp-icl", teachers=20, aggregator=agg, queries=60, shots=5)
    with pytest.raises(InputError, match="--algo dp-icl"):
        AggregationConfig(algo="pate", teachers=20, aggregator=agg, queries=60)
    assert np.isfinite(p["epsilon"])


def test_the_icl_attack_refuses_a_subsampled_run_in_one_line(tmp_path):
    # `dpaudit report RUN --icl` on a run trained with --subsample: its recipe has no --shots, and run_icl ended in
    # "internal error: TypeError: int() argument must be ... not 'NoneType'" (exit 3). Now an InputError (exit 2).
    from dpaudit.checkpoint import load_run
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.pate import AggregationConfig, train_aggregation_run
    from dpaudit.workflows.icl import run_icl

    ds = load_dataset("synthetic:n=120,d=3,classes=2,seed=0,sep=3")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    agg = AggregatorConfig("gnmax", sigma=4.0, sample_rate=0.3)
    cfg = AggregationConfig(algo="dp-icl", teachers=4, aggregator=agg, queries=10, seed=0)
    train_aggregation_run(ds, spec, cfg, TrainConfig(epochs=1, batch_size=8, lr=0.1), out=tmp_path / "run")
    with pytest.raises(InputError, match="trained with --subsample"):
        run_icl(load_run(tmp_path / "run"), canaries=4, trials=1)
