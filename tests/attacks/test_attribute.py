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
        # the cells' counts are the groups' records and right guesses; the leakage is their post-stratified gap
        for g, n, right in (("members", "members", "members_right"), ("nonmembers", "nonmembers", "nonmembers_right")):
            assert sum(c[n] for c in d["strata"]) == d[g]["n"]
            assert sum(c[right] for c in d["strata"]) == pytest.approx(d[g]["accuracy"] * d[g]["n"])
        used = [c for c in d["strata"] if c["members"] and c["nonmembers"]]
        pooled = sum(c["members"] + c["nonmembers"] for c in used)
        gap = sum(
            (c["members"] + c["nonmembers"])
            / pooled
            * (c["members_right"] / c["members"] - c["nonmembers_right"] / c["nonmembers"])
            for c in used
        )
        assert d["leakage"] == pytest.approx(gap, abs=1e-12)
        assert 0 < d["leakage_test"]["p_value"] <= 1 and d["leakage_test"]["seed"] == 0
        assert d["note"].startswith(f"leakage {d['leakage']:+.3f} (estimate") and "not a DP bound" in d["note"]
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
    assert {"p_value", "mc_se", "permutations", "seed"} == set(d["leakage_test"])
    text = cli("attack", "attribute", str(bc_run_dir), "--feature", "3")
    assert text.exit_code == 0 and d["note"] in " ".join(text.stdout.split()), text.stdout


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


# --------------------------------------------------------------------------- the leakage statistic


def _records(cells):
    """Per-record vectors (true value, label, right, member) from cells (v, y, n_m, right_m, n_nm, right_nm)."""
    v, y, right, member = [], [], [], []
    for cv, cy, nm, km, nn, kn in cells:
        for n, k, m in ((nm, km, True), (nn, kn, False)):
            v += [cv] * n
            y += [cy] * n
            right += [True] * k + [False] * (n - k)
            member += [m] * n
    return np.array(v), np.array(y), np.array(right), np.array(member)


def _strata(v, y, right, member):
    from attacks.attribute import leakage_strata

    return leakage_strata(v[member], y[member], right[member], v[~member], y[~member], right[~member])


def test_leakage_is_the_cell_gap_weighted_by_pooled_frequency():
    """By hand: cell (0, 0) has 4 members (3 right) and 2 non-members (1 right), gap 3/4 - 1/2 = 1/4, pooled
    weight 6/10; cell (1, 0) has 1 member (0 right) and 3 non-members (1 right), gap -1/3, weight 4/10:
    leakage = 0.6 / 4 - 0.4 / 3 = 1/60. The old definition (member - non-member advantage over the majority
    value 0) gives (3/5 - 4/5) - (2/5 - 2/5) = -0.2, the plain gap 3/5 - 2/5 = 0.2, weights from the members
    alone 0.8 / 4 - 0.2 / 3 = 2/15: each a different number."""
    from attacks.attribute import AttributeResult, poststratified_leakage

    v, y, right, member = _records([(0, 0, 4, 3, 2, 1), (1, 0, 1, 0, 3, 1)])
    strata = _strata(v, y, right, member)
    assert strata.tolist() == [[0, 0, 4, 3, 2, 1], [1, 0, 1, 0, 3, 1]]
    assert poststratified_leakage(strata) == pytest.approx(1 / 60, abs=1e-15)
    groups = {
        g: {"n": int(m.sum()), "accuracy": right[m].mean(), "baseline_accuracy": (v[m] == 0).mean()}
        for g, m in (("members", member), ("nonmembers", ~member))
    }
    for row in groups.values():
        row["advantage"] = row["accuracy"] - row["baseline_accuracy"]
    r = AttributeResult(0, None, "likelihood", False, None, (0.0, 1.0), groups, {"seed": 0},
                        strata=tuple(map(tuple, strata.tolist())), labels=("cat",))  # fmt: skip
    d = r.to_dict()
    assert d["leakage"] == pytest.approx(1 / 60, abs=1e-15) and r.leakage == d["leakage"]
    assert d["strata"][1] == {"value": 1.0, "label": "cat", "members": 1, "members_right": 0, "nonmembers": 3,
                              "nonmembers_right": 1}  # fmt: skip
    assert json.loads(json.dumps(d))["leakage_test"]["permutations"] == 40_000


def test_the_records_the_leakage_leaves_out_are_counted_everywhere_it_is_shown():
    """Cells held by members only or non-members only have no gap and were dropped without a word: on digits with
    a many-valued hidden feature that can be many records. The two cells of the test above plus (2, 0) held by 3
    members only and (0, 1) by 2 non-members only: the leakage is still 1/60, and 5 of the 15 records (33.3%: 3
    members, 2 non-members, in 2 cells) are left out, said in the JSON (``left_out``), the note (which the CLI
    and the reports print) and the reports' numbers (the fraction as a percentage). Planted: the field dropped, or
    the note without it -> fail."""
    from attacks.attribute import AttributeResult
    from dpaudit.report import html, markdown

    cells = [(0, 0, 4, 3, 2, 1), (1, 0, 1, 0, 3, 1), (2, 0, 3, 2, 0, 0), (0, 1, 0, 0, 2, 1)]
    strata = _strata(*_records(cells))
    groups = {g: {"n": n, "accuracy": 0.5, "baseline_accuracy": 0.5, "advantage": 0.0} for g, n in
              (("members", 8), ("nonmembers", 7))}  # fmt: skip
    r = AttributeResult(0, None, "likelihood", False, None, (0.0, 1.0, 2.0), groups, {"seed": 0},
                        strata=tuple(map(tuple, strata.tolist())), labels=("cat", "dog"))  # fmt: skip
    d = json.loads(json.dumps(r.to_dict()))
    assert d["leakage"] == pytest.approx(1 / 60, abs=1e-15)
    assert d["left_out"] == {"records": 5, "members": 3, "nonmembers": 2, "cells": 2, "fraction": 5 / 15}
    said = "5 records (33.3%: 3 members, 2 non-members) are in 2 cells held by one group only and are left out"
    assert said in d["note"]
    text = "\n".join(markdown._other_family([d]))
    assert "left\\_out.records 5" in text and "left\\_out.fraction 33.3%" in text and said in text
    assert "33.3%" in html._other_family([d])
    everyone = AttributeResult(0, None, "likelihood", False, None, (0.0, 1.0), groups, {"seed": 0},
                               strata=tuple(map(tuple, cells[:2])), labels=("cat",))  # fmt: skip
    e = everyone.to_dict()
    assert e["left_out"]["records"] == 0 and "left out" not in e["note"]


def test_members_worse_in_every_cell_never_give_a_positive_leakage():
    """Simpson's paradox: members mostly in the easy cell are right 85% of the time against the non-members' 15%,
    yet in each cell members are guessed less often; the leakage is negative (the plain gap would say +0.70).
    Then 2000 random tables with members no better in any cell: never above 0."""
    from attacks.attribute import leakage_permutation_test, leakage_reading, poststratified_leakage

    strata = np.array([(0, 0, 18, 17, 2, 2), (1, 0, 2, 0, 18, 1)])
    leak = poststratified_leakage(strata)
    assert leak == pytest.approx(0.5 * (17 / 18 - 1) + 0.5 * (0 - 1 / 18)) and leak < 0
    test = leakage_permutation_test(strata)
    assert test["p_value"] > 0.5
    assert "not distinguishable from no leakage" in leakage_reading(leak, test)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        k = int(rng.integers(1, 8))
        nm, nn = rng.integers(1, 30, k), rng.integers(1, 30, k)
        kn = rng.binomial(nn, rng.random(k))
        km = np.floor(nm * kn / nn * rng.random(k)).astype(int)  # right_m / n_m <= right_nm / n_nm in every cell
        table = np.column_stack([np.arange(k), np.zeros(k, int), nm, km, nn, kn])
        assert poststratified_leakage(table) <= 0.0


def test_permutation_p_value_matches_the_exact_enumeration():
    """Tiny data: cell (0, 0) 3 members (2 right) and 2 non-members (1 right); cell (1, 1) 2 members (2 right)
    and 2 non-members (0 right). All C(5,3) * C(4,2) = 60 relabellings within the cells, enumerated on the
    records (the statistic recomputed from scratch each time), give the exact p; the Monte Carlo p of 40 000
    seeded hypergeometric draws is within 4 of its standard errors sqrt(p (1 - p) / B) plus the 1/B of its
    (1 + count) / (1 + B) form. Same seed, same p."""
    from itertools import combinations

    from attacks.attribute import leakage_permutation_test, poststratified_leakage

    v, y, right, member = _records([(0, 0, 3, 2, 2, 1), (1, 1, 2, 2, 2, 0)])
    observed = poststratified_leakage(_strata(v, y, right, member))
    cells = [np.flatnonzero((v == a) & (y == b)) for a, b in ((0, 0), (1, 1))]
    stats = []
    for first in combinations(cells[0], 3):
        for second in combinations(cells[1], 2):
            relabelled = np.zeros(len(v), bool)
            relabelled[list(first) + list(second)] = True
            stats.append(poststratified_leakage(_strata(v, y, right, relabelled)))
    assert len(stats) == 60
    exact = np.mean(np.array(stats) >= observed - 1e-12)
    # By hand: T = (25 X_a + 24 X_b - 69) / 54 for member right counts X_a of cell (0, 0), X_b of cell (1, 1);
    # observed (2, 2); T >= 29 / 54 at (2, 2), (3, 2), (3, 1): (6 * 1 + 1 * 1 + 1 * 4) of the 60 relabellings.
    assert exact == pytest.approx(11 / 60)
    test = leakage_permutation_test(_strata(v, y, right, member), seed=3)
    B = test["permutations"]
    assert abs(test["p_value"] - exact) <= 4 * np.sqrt(exact * (1 - exact) / B) + 1 / B
    assert test["mc_se"] == pytest.approx(np.sqrt(test["p_value"] * (1 - test["p_value"]) / B))
    assert leakage_permutation_test(_strata(v, y, right, member), seed=3) == test


def test_leakage_reading_says_estimate_and_when_it_is_not_distinguishable_from_none():
    from attacks.attribute import leakage_reading

    small = leakage_reading(0.2, {"p_value": 0.001, "mc_se": 0.0002, "permutations": 40_000})
    large = leakage_reading(0.2, {"p_value": 0.3, "mc_se": 0.002, "permutations": 40_000})
    assert "beyond chance" in small and "not distinguishable" not in small
    assert "not distinguishable from no leakage" in large
    for text in (small, large):
        assert "estimate" in text and "not a DP bound" in text and "violation" not in text
    assert "not computed" in leakage_reading(float("nan"), {"p_value": None})
    # p < 0.05, strictly: with 19 relabellings the smallest p is (1 + 0) / (1 + 19) = 0.05, never beyond chance
    assert "not distinguishable" in leakage_reading(1.0, {"p_value": 1 / 20, "mc_se": 0.05, "permutations": 19})


def test_an_attack_that_reads_only_value_and_label_has_no_leakage():
    """wine, alcohol, logreg (RESULTS.md): the likelihood guess was right on every record of cells (v 0, label 1)
    and (v 1, label 0), wrong on (v 0, label 0); the members held none of (v 0, label 0), the non-members 9 of 35.
    Stratified on the value alone that read +0.235 ("beyond chance", p 0.01), though a member is guessed exactly
    as often as a non-member with the same value and label. Here: same right rate per cell, composition differs."""
    from attacks.attribute import poststratified_leakage

    cells = [(0, 0, 1, 0, 9, 0), (0, 1, 28, 28, 6, 6), (1, 0, 12, 12, 10, 10), (1, 1, 2, 0, 1, 0)]
    strata = _strata(*_records(cells))  # from the records: the label splits the cells
    assert strata.tolist() == [list(c) for c in cells] and poststratified_leakage(strata) == 0.0
    by_value = [(0, 0, 29, 28, 15, 6), (1, 0, 14, 12, 11, 10)]  # the same records, cells merged over the label
    assert poststratified_leakage(np.array(by_value)) > 0.2


def test_cells_held_by_one_group_are_listed_but_carry_no_weight():
    """The same two cells as the by-hand test above (leakage 1/60), plus a cell only members hold, (2, 1), and one
    only non-members hold, (3, 0): both are listed in the strata (every cell seen in either group), neither has a
    gap, so the leakage is still 1/60 (weights renormalised over the two shared cells, 6/10 and 4/10) and the
    permutation test relabels only within the shared cells. With no shared cell there is no leakage (nan) and no
    p-value; a test of 0 relabellings is refused."""
    from attacks.attribute import leakage_permutation_test, poststratified_leakage

    shared = [(0, 0, 4, 3, 2, 1), (1, 0, 1, 0, 3, 1)]
    strata = _strata(*_records([*shared, (2, 1, 5, 5, 0, 0), (3, 0, 0, 0, 7, 0)]))
    assert strata.tolist() == [[0, 0, 4, 3, 2, 1], [1, 0, 1, 0, 3, 1], [2, 1, 5, 5, 0, 0], [3, 0, 0, 0, 7, 0]]
    assert poststratified_leakage(strata) == pytest.approx(1 / 60, abs=1e-15)
    only_shared = _strata(*_records(shared))
    assert leakage_permutation_test(strata, permutations=500) == leakage_permutation_test(only_shared, permutations=500)
    alone = _strata(*_records([(2, 1, 5, 5, 0, 0), (3, 0, 0, 0, 7, 0)]))
    assert np.isnan(poststratified_leakage(alone))
    assert leakage_permutation_test(alone)["p_value"] is None
    with pytest.raises(InputError, match="permutations"):
        leakage_permutation_test(only_shared, permutations=0)


def test_permutation_p_value_counts_the_observed_relabelling_itself():
    """Phipson & Smyth 2010: p = (1 + #{T_b >= T}) / (1 + B). One cell of 10 members all guessed right and 10
    non-members all guessed wrong: the observed gap, 1, is the largest any relabelling gives, and a relabelling
    reaches it with probability 1 / C(20, 10) = 5.4e-6, so none of B = 99 draws does (seeded) and p is 1/100 exactly;
    members all wrong, non-members all right: every relabelling is at least the observed -1, and p is 1."""
    from attacks.attribute import leakage_permutation_test

    best = leakage_permutation_test(np.array([[0, 0, 10, 10, 10, 0]]), permutations=99)
    assert best["p_value"] == 1 / 100 and best["mc_se"] == pytest.approx(np.sqrt(0.01 * 0.99 / 99), rel=1e-12)
    assert leakage_permutation_test(np.array([[0, 0, 10, 0, 10, 10]]), permutations=99)["p_value"] == 1.0


def test_attribute_inference_reads_each_split_as_float64_and_the_data_once(tmp_path, monkeypatch):
    """`attack attribute` made the whole X float64 (8 bytes a value: 786 MB beside 32,000 CIFAR-sized images of
    393 MB, peak RSS 2.5 GB) and loaded and hashed the run's data four times. Now each attacked split (aux,
    members, holdout) is made float64 when it is attacked, and the data is loaded once; the result is the same.
    Here the three splits hold 30% of a memory-mapped X (a small fraction, so that the old whole-X copy, twice
    X's float32 bytes, stands out of what the attack itself holds: the split in float64, its counterfactual
    copy and the model's two preprocessing temporaries, 4 x 0.1 x 2 = 0.8 X.nbytes). numpy reports its buffers
    to tracemalloc."""
    import tracemalloc

    from dpaudit import data
    from dpaudit.checkpoint import Run, as_run
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    rng = np.random.default_rng(0)
    y = np.arange(4000) % 2
    X = (rng.normal(size=(4000, 1, 8, 8)) + y[:, None, None, None]).astype(np.float32)
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "X.npy", X)
    np.save(tmp_path / "d" / "y.npy", y)
    ds = load_dataset(str(tmp_path / "d"))
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=2)
    split = (0.1, 0.1, 0.1, 0.7)
    train_run(ds, spec, TrainConfig(epochs=1, batch_size=64, lr=0.1), out=tmp_path / "run", fractions=split)
    run = as_run(tmp_path / "run")
    expected = run_attribute(run, "5").to_dict()
    # The old formula as the oracle: the attack on the splits' rows of the whole X made float64.
    from attacks.attribute import attribute_predictions
    from attacks.inversion import as_black_box, raw_probabilities

    whole, proba = np.asarray(ds.X, np.float64), as_black_box(raw_probabilities(run))
    sp = run.splits
    att = AttributeInference(5).fit(whole[sp.aux], ds.y[sp.aux], proba)
    _, preds, _ = attribute_predictions(run, "5")
    for g, idx in (("members", sp.members), ("nonmembers", sp.holdout)):
        assert np.array_equal(preds[g][0], att.predict(whole[idx], ds.y[idx], proba))
        assert np.array_equal(preds[g][1], att.categories(whole[idx]))
    loads = []
    original = Run.dataset
    monkeypatch.setattr(Run, "dataset", lambda self: loads.append(1) or original(self))
    monkeypatch.setattr(data, "RELEASE_EVERY_BYTES", 1 << 14)  # the data hash's chunks (run.dataset())
    tracemalloc.start()
    try:
        result = run_attribute(run, "5")  # its to_dict() adds the permutation test's draws, whatever the data's size
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(loads) == 1
    assert peak < X.nbytes  # the old route: 2 X.nbytes for X as float64, then the splits' copies
    assert result.to_dict() == expected


def test_the_black_box_api_evaluates_a_fixed_number_of_rows_at_a_time():
    """`attack attribute` sent each split through the model in one call (``as_black_box``): the whole split in
    float64 and the preprocessing's ``(x - mean) / scale`` temporaries at once (2.5 GB peak at 50,000 CIFAR-sized
    images). Now :func:`eval_batch_rows` rows at a time, a number set by the record shape only, so a record's
    probabilities are those of its batch whatever N is, and within rounding of the whole call (BLAS may pick
    another kernel for another row count: <= 6.4e-15 in a logit measured, far below 1e-12)."""
    import tracemalloc

    from attacks.inversion import as_black_box
    from dpaudit.checkpoint import eval_batch_rows

    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    calls = []

    def probs(x):
        calls.append(len(x))
        return torch.softmax(lin((x - 0.5) / 2.0), dim=-1)

    proba = as_black_box(probs)
    X = np.random.default_rng(0).normal(size=(20_000, 64)).astype(np.float32)
    rows = eval_batch_rows((64,))
    tracemalloc.start()
    try:
        p = proba(X)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert calls == [rows] * (len(X) // rows) + [len(X) % rows]
    assert peak < X.nbytes / 2  # the whole call: X in float64, 2 X.nbytes (its torch temporaries untraced)
    assert np.array_equal(p[rows : 2 * rows], proba(X[rows : 2 * rows]))  # a batch's records, asked alone
    with torch.no_grad():
        whole = probs(torch.as_tensor(X, dtype=torch.float64)).numpy()
    assert p.shape == whole.shape and np.abs(p - whole).max() < 1e-12
    calls.clear()
    assert proba(X[:0]).shape == (0, 3) and calls == [0]  # an empty X: one call, the model's own shape


def test_the_black_box_batches_are_set_by_the_whole_record_shape_and_joined_whatever_their_count():
    """The test above's records are 2-D rows, where the 2,048-row cap sets the batch. For images the 4 MiB of float32
    records sets it: 341 rows of 3 x 32 x 32 (a record shape read from the second axis on, 32 x 32, gave 1,024).
    A split of 342 records is two batches, joined; a list of records is taken as np.asarray takes it (as before
    the batches). Mutation pass 24: X.shape[2:], two batches returned as the first alone, and np.asarray(X)
    dropped survived the test above."""
    from attacks.inversion import as_black_box
    from dpaudit.checkpoint import EVAL_BATCH_BYTES, eval_batch_rows

    torch.manual_seed(0)
    lin = torch.nn.Linear(3 * 32 * 32, 4).double()
    calls = []

    def probs(x):
        calls.append(tuple(x.shape))
        return torch.softmax(lin(x.reshape(len(x), -1)), dim=-1)

    proba = as_black_box(probs)
    rows = eval_batch_rows((3, 32, 32))
    assert rows == EVAL_BATCH_BYTES // (4 * 3 * 32 * 32) == 341
    X = np.random.default_rng(0).normal(size=(rows + 1, 3, 32, 32)).astype(np.float32)
    p = proba(X)
    assert calls == [(rows, 3, 32, 32), (1, 3, 32, 32)] and p.shape == (rows + 1, 4)
    with torch.no_grad():
        whole = probs(torch.as_tensor(X, dtype=torch.float64)).numpy()
    assert np.abs(p - whole).max() < 1e-12  # BLAS's kernel for another row count: <= 6.4e-15 in a logit measured
    assert np.abs(proba(X[:5].tolist()) - p[:5]).max() < 1e-12


def test_the_likelihood_attack_makes_a_block_of_rows_float64_at_a_time():
    """`AttributeInference.predict` made the whole split float64 and a counterfactual copy of it (2 x 430 MB for
    17,500 CIFAR-sized members, beside the float32 rows), `fit` the aux split (307 MB for 12,500). Now a block of
    :func:`eval_batch_rows` rows at a time,
    the same batches the model saw; the guesses are argmax_v log p(y | x_{-j}, v) + log P(v) on the whole split."""
    import tracemalloc

    from attacks.inversion import as_black_box

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 2).double()

    def probs(x):
        return torch.softmax(lin(x), dim=-1)

    proba = as_black_box(probs)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, 64)).astype(np.float32)
    y = rng.integers(0, 2, len(X))
    AttributeInference(5).fit(X[:100], y[:100], proba)  # its lazy imports, before the trace
    tracemalloc.start()
    try:
        att = AttributeInference(5).fit(X, y, proba)  # feature 5 is continuous: binarised, 2 values
        fit_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        guess = att.predict(X, y, proba)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert fit_peak < X.nbytes / 2  # the aux split made float64 whole for the model: 2 X.nbytes
    assert peak < X.nbytes / 2  # the whole split's float64 copy and its counterfactual: 4 X.nbytes
    same = AttributeInference(5).fit(X.astype(np.float64), y, proba)  # the old float64 rows: the same attack
    assert (same.threshold_, same.prior_.tolist()) == (att.threshold_, att.prior_.tolist())
    assert np.array_equal(same.candidates_, att.candidates_)
    scores = []
    for v, prior in zip(att.candidates_[:, 0], att.prior_, strict=True):
        Xv = X.astype(np.float64)
        Xv[:, 5] = v
        with torch.no_grad():
            p = probs(torch.as_tensor(Xv)).numpy()[np.arange(len(X)), y]
        scores.append(np.log(np.maximum(p, 1e-300)) + np.log(prior))
    assert np.array_equal(guess, np.argmax(np.stack(scores, axis=1), axis=1))
    assert np.array_equal(att.categories(X), att.categories(X.astype(np.float64)))


def test_the_attack_sends_each_record_once_per_block_in_the_black_box_apis_batches():
    """AttributeInference.fit and predict cut a split into blocks of eval_batch_rows of the whole record shape, the
    batches as_black_box cuts (1,024 records of 2 x 16 x 32: its 4 MiB of float32, not the 2,048-row cap), and
    ask the model for each record once per block in fit (the black-box attack model reads every aux record's
    probabilities) and once per candidate value in predict. The likelihood guesses are argmax_v log p(y | x_{-j},
    v) + log P(v) (Fredrikson et al. 2014, Sec. 4), computed here on the whole split at once. Mutation pass 24:
    fit's blocks from the record shape's second axis on, fit asking for the first block only or for X[s:rows],
    predict's blocks from shape[0:] or shape[2:], np.asarray of a list of records dropped, and the column named
    in the single-value refusal (feature_) dropped or the group's last survived (the tests
    above have one block, or a likelihood fit that reads only the class count from its probabilities)."""
    from attacks.inversion import as_black_box
    from dpaudit.checkpoint import EVAL_BATCH_ROWS, eval_batch_rows

    torch.manual_seed(0)
    calls = []

    def api(d):
        lin = torch.nn.Linear(d, 2).double()

        def probs(x):
            calls.append(len(x))
            return torch.softmax(lin(x.reshape(len(x), -1)), dim=-1)

        return probs, as_black_box(probs)

    rng = np.random.default_rng(0)
    # the likelihood attack on images: the record's bytes set the block
    probs, inner = api(2 * 16 * 32)
    asked = []  # the blocks the attack gives the API (made float64 one at a time), beside the model's calls

    def proba(X):
        asked.append(len(X))
        return inner(X)

    n, rows = 1030, eval_batch_rows((2, 16, 32))
    assert rows == 1024
    X = rng.normal(size=(n, 2, 16, 32)).astype(np.float32)
    X[:, 0, 0, 5] = rng.integers(0, 2, n)  # the hidden feature, flat index 5: values 0 and 1
    y = rng.integers(0, 2, n)
    att = AttributeInference(5).fit(X, y, proba)
    assert calls == asked == [rows, n - rows] and list(att.candidates_) == [0.0, 1.0]
    calls.clear(), asked.clear()
    guess = att.predict(X, y, proba)
    assert calls == asked == [rows, rows, n - rows, n - rows]
    scores = []
    for v, prior in zip(att.candidates_, att.prior_, strict=True):
        Xv = X.astype(np.float64)
        Xv[:, 0, 0, 5] = v
        with torch.no_grad():
            p = probs(torch.as_tensor(Xv)).numpy()[np.arange(n), y]
        scores.append(np.log(np.maximum(p, 1e-300)) + np.log(prior))
    assert np.array_equal(guess, np.argmax(np.stack(scores, axis=1), axis=1))
    # the black-box attack on tabular rows: the 2,048-row cap sets the block; every aux record's probabilities
    _, proba = api(8)
    n = EVAL_BATCH_ROWS + 2
    X = rng.normal(size=(n, 8)).astype(np.float32)
    X[:, 5] = rng.integers(0, 2, n)
    y = rng.integers(0, 2, n)
    calls.clear()
    att = AttributeInference(5, black_box=True).fit(X, y, proba)
    assert calls == [EVAL_BATCH_ROWS, 2]
    calls.clear()
    assert att.predict(X, y, proba).shape == (n,) and calls == [EVAL_BATCH_ROWS, 2]
    # a hidden attribute with one value on the aux split has nothing to learn: named by its (first) column
    X[:, 5], X[:, 6] = 1.0, 0.0
    for feature in (5, (5, 6)):
        with pytest.raises(InputError, match="feature 5 takes a single value on the aux split"):
            AttributeInference(feature, black_box=True).fit(X, y, proba)
    X[:, 5] = rng.integers(0, 2, n)
    # lists of records, as np.asarray takes them (the attack read them so before its blocks)
    few = AttributeInference(5).fit(X[:50].tolist(), y[:50].tolist(), proba)
    assert np.array_equal(few.predict(X[:50].tolist(), y[:50].tolist(), proba), few.predict(X[:50], y[:50], proba))
    assert np.array_equal(few.categories(X[:50].tolist()), few.categories(X[:50]))
