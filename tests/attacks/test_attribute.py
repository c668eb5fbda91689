"""Attribute inference (Fredrikson et al. 2014; Yeom et al. 2018): oracles on toy models, breast-cancer table."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attacks.attribute import AttributeInference, run_attribute
from dpaudit.errors import InputError


def label_is_the_hidden_bit(X: np.ndarray) -> np.ndarray:
    """A model whose label is (x_1 > 0) with probability 0.95: the likelihood estimator must read x_1 back."""
    p1 = np.where(np.asarray(X).reshape(len(X), -1)[:, 1] > 0, 0.95, 0.05)
    return np.stack([1 - p1, p1], axis=1)


def test_likelihood_recovers_a_hidden_bit_the_label_reveals():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 3))
    y = (X[:, 1] > 0).astype(int)
    att = AttributeInference(1).fit(X[:200], y[:200], label_is_the_hidden_bit)
    assert att.binarised_ and att.candidates_[0] <= att.threshold_ < att.candidates_[1]
    np.testing.assert_array_equal(att.categories(X[200:]), (X[200:, 1] > att.threshold_).astype(int))
    pred = att.predict(X[200:], y[200:], label_is_the_hidden_bit)
    truth = att.categories(X[200:])
    # every record whose label agrees with its side of the aux median is recovered (exactly: only
    # records between 0 and the aux median are not)
    between = (np.minimum(0, att.threshold_) < X[200:, 1]) & (X[200:, 1] <= np.maximum(0, att.threshold_))
    np.testing.assert_array_equal(pred[~between], truth[~between])
    assert np.mean(pred == truth) >= 0.9


def test_a_model_that_ignores_the_feature_gives_the_prior_majority():
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.standard_normal(300), rng.integers(0, 3, 300) * 1.0])
    X[:, 1] = np.where(rng.random(300) < 0.6, 2.0, X[:, 1])  # value 2 is the majority

    def flat(Z):
        return np.full((len(Z), 2), 0.5)

    att = AttributeInference(1).fit(X, np.zeros(300, int), flat)
    assert not att.binarised_ and list(att.candidates_) == [0.0, 1.0, 2.0] and att.majority_ == 2
    np.testing.assert_array_equal(att.predict(X, np.zeros(300, int), flat), np.full(300, 2))


def test_black_box_attack_model_learns_from_the_outputs():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((600, 3))
    y = (X[:, 1] > 0).astype(int)
    att = AttributeInference(1, black_box=True, seed=0).fit(X[:300], y[:300], label_is_the_hidden_bit)
    pred = att.predict(X[300:], y[300:], label_is_the_hidden_bit)
    assert np.mean(pred == att.categories(X[300:])) >= 0.9


def test_feature_index_is_validated():
    X = np.zeros((10, 3))
    X[:, 0] = np.arange(10)
    with pytest.raises(InputError, match=r"outside the data's features 0\.\.2"):
        AttributeInference(3).fit(X, np.zeros(10, int), label_is_the_hidden_bit)
    with pytest.raises(InputError, match="integer index"):
        AttributeInference("a").fit(X, np.zeros(10, int), label_is_the_hidden_bit)


def test_a_csv_feature_is_found_by_its_header_name(tmp_path):
    """Only the embedded datasets' names were known: `--feature pixel3` on your own CSV said "dataset has no
    feature names; give the feature as an index", though the header names every column."""
    from attacks.attribute import resolve_feature
    from dpaudit.data import load_dataset

    (tmp_path / "my.csv").write_text("age,income,label\n30,1.5,0\n40,2.5,1\n50,0.5,1\n")
    ds = load_dataset(str(tmp_path / "my.csv"), label_column="label")
    assert resolve_feature("Income", ds) == (1, "income")
    with pytest.raises(InputError, match=r"^unknown feature 'label'; valid: age, income$"):
        resolve_feature("label", ds)


# --------------------------------------------------------------------------- breast-cancer


@pytest.fixture(scope="module")
def bc_run_dir(tmp_path_factory):
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset("breast-cancer")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    out = tmp_path_factory.mktemp("bc") / "run"
    train_run(ds, spec, TrainConfig(epochs=15, batch_size=16, lr=0.2, seed=0), out=out)
    return out


def test_breast_cancer_member_nonmember_table(bc_run_dir):
    from dpaudit.checkpoint import load_run

    run = load_run(bc_run_dir)
    for black_box in (False, True):
        r = run_attribute(run, "worst perimeter", black_box=black_box, seed=0)
        d = r.to_dict()
        json.dumps(d)
        assert d["feature"] == 22 and d["binarised"] and len(d["candidates"]) == 2
        assert (d["members"]["n"], d["nonmembers"]["n"]) == (len(run.splits.members), len(run.splits.holdout))
        for g in ("members", "nonmembers"):
            row = d[g]
            assert 0 <= row["accuracy"] <= 1 and 0 <= row["baseline_accuracy"] <= 1
            assert row["advantage"] == pytest.approx(row["accuracy"] - row["baseline_accuracy"])
        assert d["leakage"] == pytest.approx(d["members"]["advantage"] - d["nonmembers"]["advantage"])
        # the hidden bit is well predicted from the label (malignant tumours are large): a wide margin
        assert d["members"]["advantage"] >= 0.15


def cli(*args):
    from dpaudit.cli.main import app

    return CliRunner().invoke(app, list(args))


def test_cli_attribute_json(bc_run_dir):
    res = cli("attack", "attribute", str(bc_run_dir), "--feature", "3", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["feature_name"] == "mean area" and d["method"] == "likelihood"
    assert {"accuracy", "baseline_accuracy", "advantage", "n"} <= set(d["members"])


@pytest.mark.parametrize(
    ("feature", "message"),
    [
        ("30", "outside the data's features 0..29"),
        ("-1", "outside the data's features"),
        ("nope", "unknown --feature 'nope'"),
    ],
)
def test_cli_attribute_bad_feature_exits_2(bc_run_dir, feature, message):
    res = cli("attack", "attribute", str(bc_run_dir), "--feature", feature)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output
