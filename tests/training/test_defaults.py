"""Issue 28: every algorithm runs with only --data, --model and (where it has one) --epsilon.

The registry loop runs each algorithm through the CLI with its defaults (small --epochs where the
algorithm trains by epochs, to stay fast); the slow tier runs the default recipes in full and checks
DP-SGD's accuracy on mlp and cnn, and the DP-SGD-JL algorithms (minutes of PLD calibration)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.errors import UnreachableTargetError
from dpaudit.training.algorithms import TRAINERS, get_trainer
from dpaudit.training.config import DP_RECIPES, NONPRIVATE_RECIPE, default_recipe, fill_recipe

LINEAR_ONLY = {"outpert", "outpert-gaussian", "objpert", "dpagd", "dpagd-huber"}
JL = {"dpsgd-jl", "dpadam-jl"}
NOT_BY_ALGO = {"outpert-gaussian", "dpagd-huber"}  # reached with --mechanism gaussian / --objective huber
FAST_EPOCHS = {"sgd", "adam", "dpsgd", "dpadam", "pate", "dp-icl"}


def registry() -> list[str]:
    get_trainer("sgd")  # registers every trainer
    return [*sorted(set(TRAINERS) - NOT_BY_ALGO - JL), "pate", "dp-icl"]


def train(tmp_path, algo: str, *extra: str) -> dict:
    from dpaudit.cli.main import app

    model = "logreg" if algo in LINEAR_ONLY else "mlp"
    args = ["train", "--algo", algo, "--data", "digits", "--model", model, "--out", str(tmp_path / algo), "--json"]
    if algo not in ("sgd", "adam"):
        args += ["--epsilon", "8"]
    res = CliRunner().invoke(app, [*args, *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_every_registered_algorithm_runs_with_only_data_model_and_epsilon(tmp_path):
    algos = registry()
    assert {"sgd", "dpsgd", "outpert", "objpert", "dpagd", "pate", "dp-icl"} <= set(algos)
    for algo in algos:
        extra = ("--epochs", "3") if algo in FAST_EPOCHS else ()
        out = train(tmp_path, algo, *extra)
        assert out["algo"] == algo
        if algo not in ("sgd", "adam"):
            assert out["private"] and out["epsilon"] <= 8.0 + 1e-9
        assert out["test_accuracy"] > 0.1  # better than chance on ten classes


def test_defaults_fit_a_small_embedded_dataset(tmp_path):
    """`dpaudit train --data wine` (62 training records at the default split) stopped on "batch size 64 is larger
    than the training set"; `--algo pate`/`dp-icl` on the 100 default queries against 44 public records, then DP-ICL
    on 10 shots x 20 teachers against 62. Defaults the user never chose are fitted to the data with a notice; a
    value the user gives is never changed (still refused where it does not fit)."""
    from dpaudit.cli.main import app

    def run(*args):
        return CliRunner().invoke(app, ["train", "--data", "wine", *args, "--out", str(tmp_path / "r"), "--force"])

    for algo in ("dpsgd", "pate", "dp-icl"):  # sgd's default batch is fitted by the same code as dpsgd's
        res = run("--algo", algo, "--epochs", "1", "--epsilon", "8", *(("--teachers", "5") if algo == "pate" else ()))
        assert res.exit_code == 0, (algo, res.output)
        if algo == "dpsgd":
            assert "the default --batch-size 64 is larger than the 62 training records; using 15" in res.stderr
        else:
            assert "the default --queries 100 does not fit the 44 records of the public (aux) split" in res.stderr
        if algo == "dp-icl":
            assert "the default --shots 10 does not fit the 62 private records over 20 teachers; using 3" in res.stderr
    meta = json.loads((tmp_path / "r" / "checkpoint.json").read_text())
    assert meta["training"]["aggregation"]["n_queries"] == 44
    res = run("--batch-size", "64", "--epochs", "1")
    assert res.exit_code == 2 and "batch size 64 is larger than the training set (62 records)" in res.output
    res = run("--algo", "pate", "--queries", "100", "--epsilon", "8", "--epochs", "1")
    assert res.exit_code == 2 and "--queries 100 exceeds the auxiliary (public) split (44 records)" in res.output
    # `audit train` trains the same recipe many times: the same default, fitted the same way
    audit = ["audit", "train", "--data", "wine", "--epsilon", "4", "--runs", "3", "--epochs", "1"]
    res = CliRunner().invoke(app, [*audit, "--allow-inconclusive"])
    assert res.exit_code == 0, res.output
    assert "the default --batch-size 64 is larger than the 62 training records; using 15" in res.stderr
    res = CliRunner().invoke(app, [*audit, "--allow-inconclusive", "--batch-size", "64"])
    assert res.exit_code == 2 and "batch size 64 is larger than the training set (63 records)" in res.output


def test_the_default_batch_is_fitted_only_when_it_exceeds_the_training_records():
    # Mutation testing: fitting at B = N (`<` -> `<=`) cut a default batch of 64 on exactly 64 training records to 16
    # with a notice saying 64 "is larger than the 64 training records"; below 4 records a quarter is at least 1.
    from dpaudit.training.config import TrainConfig
    from dpaudit.workflows.runs import _fit_default_batch

    notes = []
    config = TrainConfig(batch_size=64)
    assert _fit_default_batch(config, 64, notes.append) is config and notes == []
    assert _fit_default_batch(config, 63, notes.append).batch_size == 15
    assert notes == [
        "the default --batch-size 64 is larger than the 63 training records; using 15 (a quarter of them; "
        "give --batch-size to choose)"
    ]
    assert _fit_default_batch(config, 3, notes.append).batch_size == 1


def test_defaults_are_chosen_per_algorithm_and_model_kind():
    assert default_recipe("sgd", "cnn") == NONPRIVATE_RECIPE  # non-private defaults unchanged
    assert default_recipe("dpsgd", "cnn") == DP_RECIPES[("sgd", "cnn")] != default_recipe("dpsgd", "mlp")
    assert default_recipe("dpadam-jl", "mlp") == DP_RECIPES[("adam", "mlp")]
    assert default_recipe("outpert", "logreg").l2 > 0  # the convex learners need lambda > 0
    given = fill_recipe("dpsgd", "cnn", epochs=None, batch_size=32, lr=None, momentum=None, l2=None)
    assert given["batch_size"] == 32 and given["epochs"] == DP_RECIPES[("sgd", "cnn")].epochs


def test_dpagd_on_ten_classes_splits_the_budget_and_claims_its_sum():
    from dpaudit.training.dpagd import DPAGDConfig, dpagd, per_classifier_config

    config = DPAGDConfig(epsilon=8.0, delta=1e-5)
    sub = per_classifier_config(config, 10)
    assert sub.rho == pytest.approx(config.rho / 10, rel=1e-12)
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(200, 5)) / 3
    s = np.where(rng.random(200) < 0.5, 1.0, -1.0)
    results = [dpagd(Z, s, sub, rng) for _ in range(10)]
    assert all(r.ledger.spent <= sub.rho * (1 + 1e-12) for r in results)
    assert math.fsum(r.ledger.spent for r in results) <= config.rho * (1 + 1e-12)


def test_jl_with_one_projection_says_at_once_that_epsilon_4_is_unreachable():
    from dpaudit.training.config import DPConfig
    from dpaudit.training.dpsgd import PrivacySetting, calibrate

    setting = PrivacySetting(0.0, 64, 628, 295, "poisson", None, 1)
    dp = DPConfig(target_epsilon=4.0, accountant="pld", jl_projections=1)
    start = time.process_time()
    with pytest.raises(UnreachableTargetError, match=r"epsilon >= 2\.\d+e\+04 \(a formal lower bound\)"):
        calibrate(setting, dp)
    assert time.process_time() - start < 30  # no PLD evaluation was needed (each takes tens of seconds)


@pytest.mark.slow  # the lower bound against the (slow) PLD accountant
def test_jl_lower_bound_is_below_the_accountant():
    from dpaudit.accounting import dpsgd_event, epsilon_for
    from dpaudit.accounting.jl import epsilon_lower_bound

    for sigma, r in ((1.2, 8), (64.0, 1)):
        event = dpsgd_event(noise_multiplier=sigma, sample_rate=64 / 629, steps=300, jl_projections=r)
        lb = epsilon_lower_bound(sigma, r, 64 / 629, 300, 1e-5)
        assert 0.5 * epsilon_for(event, 1e-5, "pld") <= lb <= epsilon_for(event, 1e-5, "pld")


@pytest.mark.slow  # full default recipes: 30-60 epochs, and the JL calibration
def test_default_recipes_reach_their_accuracy(tmp_path):
    for model in ("mlp", "cnn"):
        out = train(tmp_path / model, "dpsgd", "--model", model)
        assert out["test_accuracy"] >= 0.8, (model, out["test_accuracy"])
    for algo in sorted(JL):
        out = train(tmp_path / algo, algo, "--epochs", "3")
        assert out["private"] and out["epsilon"] <= 8.0 + 1e-9


def test_the_cnn_keeps_a_pooled_grid_and_old_checkpoints_keep_global_pooling():
    """The zoo CNN pools to 2 x 2 before its head (global average pooling capped digits near 0.85 even
    without noise); a checkpoint.json written before the field existed holds no "pool" and was built with
    global average pooling, so it is read back as pool = 1 and its 32-input head still loads."""
    from dpaudit.models import build_model, default_spec, model_spec_from_checkpoint, model_spec_from_dict

    spec = default_spec("cnn", input_shape=(1, 8, 8), n_classes=10)
    assert spec.pool == 2 and build_model(spec)[-1].in_features == 32 * 4
    old = {k: v for k, v in spec.to_dict().items() if k != "pool"}
    legacy = model_spec_from_checkpoint(old)
    assert legacy.pool == 1 and build_model(legacy)[-1].in_features == 32
    assert model_spec_from_dict(old).pool == 2  # a spec file written today means today's default
    assert model_spec_from_checkpoint(spec.to_dict()) == spec
