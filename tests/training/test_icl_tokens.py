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


def test_the_token_prototype_is_the_normalised_mean_of_unit_bags_computed_by_hand():
    """PrototypePredictor(tokens=True) against its definition on dense counts: each sequence's token-count vector
    scaled to unit length, the class prototype the mean of its exemplars' unit vectors scaled to unit length (the
    Rocchio centroid compared by cosine: IIR Sec. 14.2, 6.3), d = ||q - p_c||^2, tau = median of d over the present
    classes, probabilities softmax(-d / tau) over them and 0 for an absent class. Unequal class sizes and lengths of
    the mean, so every factor shows. Planted: the prototype's norm from the raw count dot products, from one side of
    the normalisation only, or multiplied instead of divided."""
    rng = np.random.default_rng(5)
    ex = rng.integers(0, 6, (7, 5))
    y = np.array([0, 0, 0, 0, 0, 2, 2])  # class 1 absent
    q = rng.integers(0, 6, (4, 5))

    def unit(X):
        counts = np.stack([np.bincount(r, minlength=6) for r in X]).astype(float)
        return counts / np.linalg.norm(counts, axis=1, keepdims=True)

    U, Q = unit(ex), unit(q)
    d = np.zeros((4, 3))
    for c in (0, 2):
        p = U[y == c].mean(0)
        d[:, c] = ((Q - p / np.linalg.norm(p)) ** 2).sum(1)
    tau = np.median(d[:, [0, 2]])
    e = np.exp(-d[:, [0, 2]] / tau)
    expected = np.zeros((4, 3))
    expected[:, [0, 2]] = e / e.sum(1, keepdims=True)
    got = make_predictor("prototype", 3, tokens=True).predict_proba(ex, y, q)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)


def test_the_token_nearest_exemplar_scores_are_unit_bag_distances_computed_by_hand():
    """NearestExemplarPredictor(tokens=True) against its definition on dense counts: distances ||q - e|| of the
    unit-length token-count vectors, tau their median over every (query, exemplar) pair, class score the nearest
    exemplar's -distance / tau, softmax over the present classes. Planted: 4 - 2 cos or 2 - cos under the root."""
    rng = np.random.default_rng(6)
    ex, y, q = rng.integers(0, 6, (7, 5)), np.array([0, 0, 0, 0, 0, 2, 2]), rng.integers(0, 6, (4, 5))

    def unit(X):
        counts = np.stack([np.bincount(r, minlength=6) for r in X]).astype(float)
        return counts / np.linalg.norm(counts, axis=1, keepdims=True)

    dist = np.linalg.norm(unit(q)[:, None, :] - unit(ex)[None, :, :], axis=2)
    score = np.stack([-dist[:, y == c].min(1) for c in (0, 2)], 1) / np.median(dist)
    e = np.exp(score - score.max(1, keepdims=True))
    expected = np.zeros((4, 3))
    expected[:, [0, 2]] = e / e.sum(1, keepdims=True)
    got = make_predictor("knn", 3, tokens=True).predict_proba(ex, y, q)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("name", ["knn", "prototype"])
def test_token_ids_as_lists_are_read_and_bad_shapes_are_refused_with_one_line(name):
    """Token ids as nested lists are the same data as the array; one sequence per row of non-negative ids is
    required, so 1-D ids, empty sequences and an id of -1 (among others, not only the smallest) are refused with the
    one-line error, not a traceback (numpy's min of an empty array raises ValueError). Planted: each of those checks
    dropped, the bound moved to -1, the max checked instead of the min."""
    rng = np.random.default_rng(2)
    ex, y, q = rng.integers(0, 9, (6, 4)), np.array([0, 1, 0, 1, 0, 1]), rng.integers(0, 9, (3, 4))
    pred = make_predictor(name, 2, tokens=True)
    np.testing.assert_array_equal(pred.predict_proba(ex.tolist(), y, q.tolist()), pred.predict_proba(ex, y, q))
    negative = q.copy()
    negative[1, 2] = -1
    for bad_ex, bad_q in ((ex[:, 0], q), (ex, q[:, 0]), (ex[:, :0], q), (ex, q[:, :0]), (ex, negative)):
        with pytest.raises(InputError, match=r"non-negative integer token ids \(one sequence per row"):
            pred.predict_proba(bad_ex, y, bad_q)


@pytest.mark.parametrize("tokens", [False, True])
@pytest.mark.parametrize("name", ["knn", "prototype"])
def test_a_prompt_without_exemplars_is_refused_with_one_line(name, tokens):
    """No exemplar, no class score: refused, not a median of an empty distance matrix (NaN probabilities).
    Planted: the check dropped (features: NaN or a numpy error; tokens: the token-id message instead)."""
    with pytest.raises(InputError, match="needs at least one exemplar"):
        make_predictor(name, 2, tokens=tokens).predict_proba(np.zeros((0, 3), np.int64), np.zeros(0), np.ones((2, 3)))


def test_the_feature_prototype_is_the_class_mean_computed_by_hand():
    """PrototypePredictor on features (tokens=False), which no other test ran: squared distances to the present
    classes' exemplar means, tau their median, softmax(-d / tau) over the present classes, 0 for an absent one.
    Planted: the mean's class mask inverted, or the distances not divided by tau."""
    rng = np.random.default_rng(8)
    ex, y, q = rng.normal(size=(7, 3)), np.array([0, 0, 0, 0, 0, 2, 2]), rng.normal(size=(4, 3))
    d = np.stack([((q - ex[y == c].mean(0)) ** 2).sum(1) for c in (0, 2)], 1)
    e = np.exp(-d / np.median(d))
    expected = np.zeros((4, 3))
    expected[:, [0, 2]] = e / e.sum(1, keepdims=True)
    got = make_predictor("prototype", 3).predict_proba(ex, y, q)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["no/such/dir", ".model", "model"])
def test_every_spelling_of_a_model_directory_is_refused_on_token_ids(name, tmp_path, monkeypatch):
    """A sentence-embedding model is named by a path (a slash, a leading dot, or an existing directory): on token
    ids each is refused with the knn/prototype advice; any other name is an unknown predictor. Planted: each of the
    three path tests dropped, or the slash test inverted."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    with pytest.raises(InputError, match="use --predictor knn or prototype"):
        make_predictor(name, 2, tokens=True)
    with pytest.raises(InputError, match="unknown predictor 'bogus'"):
        make_predictor("bogus", 2, tokens=True)


@pytest.mark.parametrize("tokens", [False, True])
@pytest.mark.parametrize("name", ["knn", "prototype"])
def test_a_query_equal_to_the_only_exemplar_gets_its_class_with_probability_one(name, tokens):
    """One exemplar equal to the query: every distance is 0, so the median tau is 0 and its floor keeps -d / tau
    finite; the only present class gets probability 1. Planted: tau without its floor (0 / 0 = NaN)."""
    x = np.array([[1, 2, 2, 3]])
    proba = make_predictor(name, 2, tokens=tokens).predict_proba(x, np.array([1]), x)
    np.testing.assert_array_equal(proba, [[0.0, 1.0]])
