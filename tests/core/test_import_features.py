"""`dpaudit import` checks the features (issue 29): header names against the spec's or scaler's
``feature_names``, a warning when the model does not fit its declared training records, and a member
check that says "inconclusive" when its test is not significant.

Oracle: a logistic regression trained (by dpaudit, standing in for any trainer) on breast-cancer's 30
named columns. The same records with the columns reversed or renamed are the user's mistake.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dpaudit.checkpoint import CHECKPOINT_FILE, WEIGHTS_FILE
from dpaudit.cli.main import app
from dpaudit.data import Splits, check_feature_names, load_dataset
from dpaudit.errors import InputError
from dpaudit.models import default_spec, model_spec_from_dict
from dpaudit.training.config import TrainConfig
from dpaudit.training.run import member_check, train_run

runner = CliRunner()
N_MEMBERS = 300


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from sklearn.datasets import load_breast_cancer

    tmp = tmp_path_factory.mktemp("bc")
    bc = load_breast_cancer(as_frame=True)
    df = bc.frame  # 30 named feature columns, then "target"
    csv = tmp / "bc.csv"
    df.to_csv(csv, index=False)
    ds = load_dataset(str(csv), label_column="target")
    names = list(ds.feature_names)
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    rest = np.arange(N_MEMBERS, len(ds))
    splits = Splits(np.arange(N_MEMBERS), rest[:100], rest[100:200], rest[200:], seed=0, fractions=())
    meta = train_run(ds, spec, TrainConfig(epochs=20, batch_size=32, lr=0.1, seed=0), out=tmp / "orig", splits=splits)
    pre = meta["preprocessing"]
    scaler = {"mean": pre["mean"], "scale": pre["scale"]}
    members = tmp / "members.txt"
    members.write_text("record_index\n" + "\n".join(map(str, range(N_MEMBERS))) + "\n")

    def write(name, obj):
        (tmp / name).write_text(json.dumps(obj))
        return tmp / name

    return {
        "tmp": tmp,
        "df": df,
        "names": names,
        "csv": csv,
        "weights": tmp / "orig" / WEIGHTS_FILE,
        "members": members,
        "spec": write("spec.json", spec.to_dict()),
        "named_spec": write("named_spec.json", {**spec.to_dict(), "feature_names": names}),
        "scaler": write("scaler.json", scaler),
        "named_scaler": write("named_scaler.json", {**scaler, "feature_names": names}),
        "meta": meta,
    }


def _csv(model, name: str, frame: pd.DataFrame) -> Path:
    path = model["tmp"] / name
    frame.to_csv(path, index=False)
    return path


def _import(model, data, out, *, spec="spec", scaler="scaler"):
    return invoke(
        "import", model["weights"], "--model-spec", model[spec], "--data", data, "--label-column", "target",
        "--members", model["members"], "--preprocessing", model[scaler], "--out", out,
    )  # fmt: skip


def _reversed(model) -> pd.DataFrame:
    df, names = model["df"], model["names"]
    return df[[*names[::-1], "target"]]  # the same table, its feature columns in reverse order


def test_right_columns_import_without_warnings(model, tmp_path):
    r = _import(model, model["csv"], tmp_path / "ok", spec="named_spec", scaler="named_scaler")
    assert r.exit_code == 0, r.output
    # (A logistic regression on breast-cancer has no generalisation gap, so the member-list check may
    # still speak; the fit checks must not.)
    assert "not above chance" not in r.stderr and "class frequencies" not in r.stderr
    check = json.loads((tmp_path / "ok" / CHECKPOINT_FILE).read_text())["import"]["member_check"]
    assert check["fit_warnings"] == [] and check["train_accuracy"] > 0.9


@pytest.mark.parametrize("names_in", ["named_spec", "named_scaler"])
def test_reversed_columns_are_refused_naming_them(model, tmp_path, names_in):
    data = _csv(model, "reversed.csv", _reversed(model))
    kw = {"spec": "named_spec"} if names_in == "named_spec" else {"scaler": "named_scaler"}
    r = _import(model, data, tmp_path / "rev", **kw)
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1 and "reverse order" in line
    assert repr(model["names"][-1]) in line and repr(model["names"][0]) in line
    assert not (tmp_path / "rev").exists()


def test_renamed_columns_are_refused_naming_them(model, tmp_path):
    renamed = model["df"].rename(columns={"mean radius": "radius", "worst area": "area_worst"})
    r = _import(model, _csv(model, "renamed.csv", renamed), tmp_path / "ren", spec="named_spec")
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1
    assert "not expected: 'radius', 'area_worst'" in line and "absent: 'mean radius', 'worst area'" in line


def test_reversed_and_renamed_without_names_warns_and_the_member_check_is_not_reassuring(model, tmp_path):
    # The issue's file: the data's columns reversed and the header renamed back to the original order, so
    # no name can tell. The model then fits its declared training records no better than chance.
    df, names = model["df"], model["names"]
    swapped = df[[*names[::-1], "target"]].set_axis([*names, "target"], axis=1)
    out = tmp_path / "swapped"
    r = _import(model, _csv(model, "swapped.csv", swapped), out)
    assert r.exit_code == 0, r.output
    assert "warning: the model's accuracy on its declared training records" in r.stderr
    assert "is not above chance" in r.stderr
    check = json.loads((out / CHECKPOINT_FILE).read_text())["import"]["member_check"]
    assert check["outcome"] == "inconclusive" and check["note"].startswith("member check inconclusive")
    assert "look like training records" not in check["note"] and len(check["fit_warnings"]) == 2


def test_check_feature_names_messages():
    check_feature_names(["a", "b", "c"], ["a", "b", "c"], data="d.csv", source="s.json")  # no error
    with pytest.raises(InputError, match=r"column 2 is 'c' where 'b' is expected \(reordered\)"):
        check_feature_names(["a", "c", "b"], ["a", "b", "c"], data="d.csv", source="s.json")
    with pytest.raises(InputError, match=r"not expected: 'x'; expected but absent: 'b', 'c' \(2 columns, 3"):
        check_feature_names(["a", "x"], ["a", "b", "c"], data="d.csv", source="s.json")
    with pytest.raises(InputError, match="must be a list of column names"):
        check_feature_names(["a"], "a", data="d.csv", source="s.json")


def test_spec_feature_names_are_validated_and_not_serialised_when_absent():
    base = {"kind": "logreg", "input_shape": [3], "n_classes": 2}
    assert "feature_names" not in model_spec_from_dict(base).to_dict()
    named = model_spec_from_dict({**base, "feature_names": ["a", "b", "c"]})
    assert named.feature_names == ("a", "b", "c") and named.to_dict()["feature_names"] == ["a", "b", "c"]
    with pytest.raises(InputError, match="3 distinct names"):
        model_spec_from_dict({**base, "feature_names": ["a", "a", "c"]})
    with pytest.raises(InputError, match="list of column names"):
        model_spec_from_dict({**base, "feature_names": [1, 2, 3]})


class _Constant:
    """A stand-in fitted model with fixed per-record logits (only what member_check reads)."""

    def __init__(self, logits):
        self._logits = np.asarray(logits, dtype=np.float32)

    def logits(self, view):
        return self._logits[np.asarray(view.idx)]


def test_member_check_says_inconclusive_when_its_test_is_not_significant():
    from dpaudit.data import _validated

    rng = np.random.default_rng(0)
    n = 400
    y = rng.integers(0, 2, n)
    ds = _validated("toy", rng.normal(size=(n, 2)), y, "tabular", "toy")
    splits = Splits(np.arange(200), np.arange(200, 400), np.array([], int), np.array([], int), seed=0, fractions=())
    # Members' correct-class logits are the holdout's shifted up by 0.01: a gap far too small for 200 against
    # 200 records to show (AUC just above 1/2), so the test is not significant.
    margin = np.tile(rng.normal(2.0, 1.0, n // 2), 2) + np.r_[np.full(n // 2, 0.01), np.zeros(n // 2)]
    logits = np.stack([np.where(y == 0, margin, 0), np.where(y == 1, margin, 0)], axis=1)
    check = member_check(_Constant(logits), ds, splits)
    assert check["p_value"] >= 0.05 and not check["suspicious"]
    assert check["outcome"] == "inconclusive" and check["note"].startswith("member check inconclusive")
    # A gap (members fitted better): significant, and then the members do look like training records.
    logits[:200] *= 3
    check = member_check(_Constant(logits), ds, splits)
    assert check["p_value"] < 0.05 and check["outcome"] == "consistent"
    assert check["note"].startswith("the declared members look like training records")
    assert check["fit_warnings"] == []


def test_a_model_trained_with_its_own_label_order_is_warned_about(model, tmp_path):
    """The user's loop numbered the classes its own way (here: the labels swapped, as "benign" = 0 would be):
    every loss and attack would read the classes swapped; the import says so and names the order that fits."""
    flipped = model["df"].assign(target=1 - model["df"]["target"])
    out = tmp_path / "flipped"
    r = _import(model, _csv(model, "flipped.csv", flipped), out)
    assert r.exit_code == 0, r.output
    assert "match the labels of its 300 declared training records far better in another order" in r.stderr
    assert "reading output 0 as '1', output 1 as '0'" in r.stderr
    check = json.loads((out / CHECKPOINT_FILE).read_text())["import"]["member_check"]
    assert check["train_accuracy"] < 0.1 and check["outcome"] != "consistent"
