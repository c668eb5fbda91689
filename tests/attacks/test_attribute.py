"""Attribute inference (Fredrikson et al. 2014; Yeom et al. 2018): oracles on toy models, breast-cancer table."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
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


def test_a_header_name_wins_over_an_index(tmp_path):
    """In a header 0,2,5 (columns kept from a wider table) feature "2" is the column named 2, not index 2 (named 5)."""
    from attacks.attribute import resolve_feature
    from dpaudit.data import load_dataset

    (tmp_path / "kept.csv").write_text("0,2,5,label\n1,2,3,0\n4,5,6,1\n")
    ds = load_dataset(str(tmp_path / "kept.csv"), label_column="label")
    assert resolve_feature("2", ds) == (1, "2") and resolve_feature("1", ds) == (1, "2")


def _one_hot_csv(path, n=400, seed=0, drop_first=False):
    """x0 decides the label; color (red 50%, green 30%, blue 20%) is one-hot encoded and the label ignores it."""
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(n)
    color = rng.choice(3, size=n, p=[0.5, 0.3, 0.2])
    names = ["color_red", "color_green", "color_blue"][int(drop_first) :]
    cols = [(color == k).astype(int) for k in range(3)][int(drop_first) :]
    rows = [f"{x0[i]:.4f}," + ",".join(str(c[i]) for c in cols) + f",{int(x0[i] > 0)}" for i in range(n)]
    path.write_text(",".join(["x0", *names, "label"]) + "\n" + "\n".join(rows) + "\n")
    return color


def test_one_hot_groups_are_found_by_a_column_or_their_prefix(tmp_path):
    from attacks.attribute import feature_names, one_hot_group, resolve_feature
    from dpaudit.data import load_dataset

    _one_hot_csv(tmp_path / "c.csv")
    ds = load_dataset(str(tmp_path / "c.csv"), label_column="label")
    names = feature_names(ds)
    assert resolve_feature("color", ds) == (1, "color_red")
    assert one_hot_group(3, names, ds.X) == ((1, 2, 3), "color") and one_hot_group(0, names, ds.X) is None
    _one_hot_csv(tmp_path / "d.csv", drop_first=True)  # red dropped: records with neither column are red
    ds = load_dataset(str(tmp_path / "d.csv"), label_column="label")
    assert one_hot_group(1, feature_names(ds), ds.X) == ((1, 2), "color")
    with pytest.raises(InputError, match="unknown feature 'x'"):
        resolve_feature("x", ds)  # a prefix of x0, not of a one-hot group


def test_a_one_hot_column_is_hidden_with_its_group(tmp_path):
    """Hiding color_red alone left color_green and color_blue to the attack model, which then "inferred" the
    colour of every record (100% for members and non-members) from a model that ignores it; the whole group
    is hidden, so nothing beyond the prior is left to find."""
    from dpaudit.checkpoint import load_run
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    _one_hot_csv(tmp_path / "c.csv")
    ds = load_dataset(str(tmp_path / "c.csv"), label_column="label")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=2)
    train_run(
        ds, spec, TrainConfig(epochs=2, batch_size=32, lr=0.1, seed=0), out=tmp_path / "run", label_column="label"
    )
    run = load_run(tmp_path / "run")
    with torch.no_grad():  # a model that ignores the colour: its outputs say nothing about it
        (weight,) = [p for p in run.model.parameters() if p.ndim == 2]
        weight[:, 1:4] = 0.0
    r = run_attribute(run, "color_red", black_box=True).to_dict()
    assert r["feature_name"] == "color" and r["columns"] == [1, 2, 3] and r["candidates"] == ["red", "green", "blue"]
    # The colour is independent of everything the attack model reads: accuracy is that of a guess from the
    # prior (at most the majority's 50% plus sampling noise; 0.65 is > 3 standard errors above it for n >= 80).
    for g in ("members", "nonmembers"):
        assert r[g]["n"] >= 80 and r[g]["accuracy"] < 0.65, r


def test_likelihood_over_a_one_hot_group_sets_the_whole_group():
    """A model whose label is the colour: each counterfactual is a valid one-hot record, so the likelihood
    estimator reads the colour back, the dropped category (no column set) included."""
    rng = np.random.default_rng(3)
    color = rng.choice(3, size=300)
    X = np.column_stack([rng.standard_normal(300), color == 1, color == 2]).astype(float)  # category 0 dropped

    def label_is_the_colour(Z):
        Z = np.asarray(Z)
        k = np.where(Z[:, 1] == 1, 1, np.where(Z[:, 2] == 1, 2, 0))
        return np.where(np.arange(3) == k[:, None], 0.9, 0.05)

    att = AttributeInference((1, 2)).fit(X[:150], color[:150], label_is_the_colour)
    assert att.one_hot_ and att.candidates_.tolist() == [[1, 0], [0, 1], [0, 0]]
    truth = att.categories(X[150:])
    np.testing.assert_array_equal(truth, np.where(color[150:] == 0, 2, color[150:] - 1))
    np.testing.assert_array_equal(att.predict(X[150:], color[150:], label_is_the_colour), truth)
    with pytest.raises(InputError, match="not a one-hot group"):
        AttributeInference((0, 1)).fit(X, color, label_is_the_colour)


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
