"""DP-ICL's in-context predictors on token sequences (dpaudit.training.icl): token ids are labels, not coordinates.

The knn and prototype predictors measured Euclidean distances between raw token ids (id 17 "near" id 18): on
synthetic-tokens data (vocabulary 50, 4 classes, 20 teachers of 4 exemplars) the plurality vote was right on 31%
of the queries (chance 25%) and renaming the vocabulary changed every query's votes. They now compare bags of
tokens (L2-normalised counts): 99% and no change (benchmarks/icl_tokens.py). The privacy analysis is the noisy
vote's and is untouched: the representation is fixed, so each teacher still depends on its own prompt only."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpaudit.aggregation import AggregatorConfig, vote_histogram
from dpaudit.data import DEFAULT_FRACTIONS, load_dataset, make_splits
from dpaudit.errors import InputError
from dpaudit.models import default_spec
from dpaudit.training.config import TrainConfig
from dpaudit.training.icl import make_predictor
from dpaudit.training.pate import AggregationConfig, icl_votes, query_indices, teacher_parts, train_aggregation_run

DATA = "synthetic-tokens:n=600,length=20,vocab=50,classes=4,seed=0"


def _prompts(shots=4, teachers=20, queries=100, data=DATA):
    ds = load_dataset(data)
    splits = make_splits(len(ds), 0, DEFAULT_FRACTIONS)
    cfg = AggregationConfig(
        algo="dp-icl", teachers=teachers, shots=shots, queries=queries, aggregator=AggregatorConfig("gnmax", sigma=1.0)
    )
    parts, q_idx = teacher_parts(len(splits.members), cfg), query_indices(splits, cfg)
    return ds, ds.X[splits.members], ds.y[splits.members], parts, ds.X[q_idx], ds.y[q_idx]


@pytest.mark.parametrize("name", ["knn", "prototype"])
def test_renaming_the_vocabulary_changes_no_answer(name):
    """Metamorphic: token ids are arbitrary labels, so a permutation of the vocabulary is the same data and must
    give the same probabilities, bit for bit (integer counts). Planted: the raw ids as Euclidean coordinates (the
    old behaviour, tokens=False) fail it."""
    ds, ex_X, ex_y, parts, q_X, _ = _prompts()
    rename = np.random.default_rng(1).permutation(ds.vocab_size)
    pred = make_predictor(name, ds.n_classes, tokens=True)
    for p in parts[:5]:
        np.testing.assert_array_equal(
            pred.predict_proba(rename[ex_X[p]], ex_y[p], rename[q_X]), pred.predict_proba(ex_X[p], ex_y[p], q_X)
        )


@pytest.mark.parametrize("name", ["knn", "prototype"])
@pytest.mark.parametrize(("vocab", "teacher_floor", "vote_floor"), [(50, 0.55, 0.9), (1000, 0.42, 0.7)])
def test_the_vote_on_token_data_learns_the_task(name, vocab, teacher_floor, vote_floor):
    """20 teachers of 4 exemplars, 100 queries, 4 classes (chance 0.25). Measured on raw ids: teacher accuracy
    0.24-0.28, plurality vote 0.21-0.34; on bags of tokens: teachers 0.64 (vocabulary 50) and 0.49-0.51 (1000),
    votes 1.0 and 0.83-0.86. The floors sit >= 4 binomial SDs below the measured values (teachers: 2,000 votes,
    SD 0.011; votes: 100 queries, SD <= 0.035) and far above chance. Planted: raw ids fail every case; the
    prototype's raw (unnormalised) mean of unit vectors, shorter for a class with more exemplars, fails the
    sparse vocabulary (teachers 0.32, vote 0.58)."""
    ds, ex_X, ex_y, parts, q_X, true = _prompts(data=DATA.replace("vocab=50", f"vocab={vocab}"))
    votes = icl_votes(make_predictor(name, ds.n_classes, tokens=True), ex_X, ex_y, parts, q_X)
    assert np.mean(votes == true) >= teacher_floor
    assert np.mean(vote_histogram(votes, ds.n_classes).argmax(1) == true) >= vote_floor


def test_a_query_equal_to_an_exemplar_gets_its_label():
    """The copying that the ICL membership attack exploits (attacks/icl.py) holds for token sequences too:
    distance 0 to itself, and the nearest exemplar's label has the largest probability."""
    ds, ex_X, ex_y, parts, _, _ = _prompts()
    p = parts[0]
    proba = make_predictor("knn", ds.n_classes, tokens=True).predict_proba(ex_X[p], ex_y[p], ex_X[p])
    assert np.array_equal(proba.argmax(1), ex_y[p])


def test_a_sentence_embedding_model_is_refused_on_token_ids(tmp_path):
    with pytest.raises(InputError, match="use --predictor knn or prototype"):
        make_predictor(str(tmp_path), 4, tokens=True)
    with pytest.raises(InputError, match="non-negative integer token ids"):  # standardised ids are no longer ids
        make_predictor("knn", 4, tokens=True).predict_proba(np.zeros((2, 3)), np.array([0, 1]), np.zeros((1, 3)))


def test_a_dp_icl_run_and_its_icl_audit_on_token_data(tmp_path, monkeypatch):
    """End to end: `train --algo dp-icl` on token data prompts bags of tokens (its noise-free vote, a private
    diagnostic, is right on >= 90% of the queries; raw ids: 25%), and the ICL family's attack on that run keeps
    the ids as ids (it standardised them, then compared the standardised ids as coordinates). Planted: the
    training path or the attack path without ``tokens`` fail it."""
    from dpaudit.checkpoint import load_run
    from dpaudit.workflows.checkpoint import FAMILY_RUNNERS

    ds = load_dataset(DATA)
    spec = default_spec("rnn", input_shape=ds.feature_shape, n_classes=ds.n_classes, vocab_size=ds.vocab_size)
    cfg = AggregationConfig(
        algo="dp-icl", teachers=20, shots=4, queries=100, aggregator=AggregatorConfig("gnmax", sigma=1.0),
        target_epsilon=8.0,
    )  # fmt: skip
    meta = train_aggregation_run(
        ds, spec, cfg, TrainConfig(algo="adam", epochs=1, batch_size=32, lr=0.01), out=tmp_path / "run",
        keep_private_diagnostics=True,
    )  # fmt: skip
    assert meta["training"]["aggregation"]["private_diagnostics"]["vote_accuracy"] >= 0.9
    import attacks.icl

    asked = []
    monkeypatch.setattr(attacks.icl, "make_predictor", lambda *a, **kw: asked.append(kw) or make_predictor(*a, **kw))
    result = FAMILY_RUNNERS["icl"](load_run(tmp_path / "run"), {"canaries": 40, "trials": 5}, 0, None)
    assert asked and all(kw == {"tokens": True} for kw in asked)  # every simulated prompt compares bags of tokens
    # One prompt of 4 exemplars copies them: members answered with certainty, non-members not (AUC 1/2 = chance).
    assert result["auc_non_private"] > 0.75
    assert [r["epsilon"] for r in result["settings"]] == [math.inf, pytest.approx(8.0, rel=1e-3)]
