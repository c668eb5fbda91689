"""Scores beyond the canary's margin for plug-in audits (``audit train --score``), with Bonferroni over them.

The planted bug: a trainer whose weights are pure seeded noise (private in effect) but whose bias is the
un-noised count of each label — one more record of the canary's label moves it by exactly one. The margin
at the canary is swamped by the weights' noise and never refutes the claim; the output at the fixed probe
input (zeros: the bias itself) separates IN from OUT perfectly, and so does a user's score reading the bias.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.cli.main import app
from dpaudit.data import load_dataset
from dpaudit.errors import InputError
from dpaudit.models import default_spec
from dpaudit.workflows import audit_training

HERE = "tests.workflows.test_plugin_scores"


def bias_leak_trainer(X, y, seed):
    """Weights: N(0, 100²) from the seed; bias: the label counts, without noise (the planted bug)."""
    W = np.random.default_rng(seed).normal(scale=100.0, size=(10, 64)).astype(np.float32)
    return {"1.weight": W, "1.bias": np.bincount(y, minlength=10).astype(np.float32)}


def bias_score(state, x, y):
    """A user's score: the trained bias of the canary's label (higher = canary included)."""
    return float(state["1.bias"][y])


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return ds, default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)


def test_probe_catches_an_unnoised_bias_the_margin_misses(digits):
    ds, spec = digits
    kw = dict(trainer=bias_leak_trainer, claimed_epsilon=1.0, delta=1e-5, runs=40, train_size=100)
    margin = audit_training(ds, spec, **kw).result
    assert margin.verdict == "consistent"
    both = audit_training(ds, spec, scores=("margin", "probe", f"{HERE}:bias_score"), **kw)
    assert [a.result.confidence for a in both.audits] == pytest.approx([1 - 0.05 / 3] * 3)  # Bonferroni
    verdicts = [a.result.verdict for a in both.audits]
    assert verdicts == ["consistent", "violation", "violation"]
    assert both.result.verdict == "violation" and "score probe" in both.audit.description
    assert both.scores[both.member].min() > both.scores[~both.member].max()  # the probe separates perfectly


def test_loss_score_is_minus_the_cross_entropy_at_the_canary(digits):
    """Oracle: a zero model gives every class probability 1/10, so every run's loss score is log(1/10)."""
    from tests.workflows.test_plugin_trainer import recording_trainer

    ds, spec = digits
    d = audit_training(ds, spec, trainer=recording_trainer, claimed_epsilon=1.0, delta=1e-5, runs=3,
                       train_size=50, scores=("loss",))  # fmt: skip
    np.testing.assert_allclose(d.scores, np.log(0.1), rtol=1e-12)


def test_score_refusals(digits):
    ds, spec = digits
    from dpaudit.training.config import TrainConfig

    with pytest.raises(InputError, match="plug-in"):
        audit_training(ds, spec, TrainConfig(algo="sgd", epochs=1), runs=2, scores=("probe",))
    with pytest.raises(InputError, match=r"package\.module:function"):
        audit_training(ds, spec, trainer=bias_leak_trainer, claimed_epsilon=1, delta=1e-5, scores=("nope",))
    r = CliRunner().invoke(app, ["audit", "train", "--trainer", f"{HERE}:bias_leak_trainer", "--claimed-epsilon", "1",
                                 "--delta", "1e-5", "--score", "no.such_module:f"])  # fmt: skip
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output


def test_cli_several_scores_exit_1_on_any_violation():
    args = ["--quiet", "audit", "train", "--trainer", f"{HERE}:bias_leak_trainer", "--claimed-epsilon", "1"]
    args += ["--delta", "1e-5", "--runs", "40", "--train-size", "100", "--score", "margin", "--score", "probe"]
    r = CliRunner().invoke(app, [*args, "--fail-on-violation", "--json"])
    assert r.exit_code == 1, r.output
    d = json.loads(r.stdout)
    assert [a["verdict"] for a in d["score_audits"]] == ["consistent", "violation"]


def test_cli_vocabulary_in_the_library(digits):
    """``audit_training("digits", "logreg", scores="probe", ...)`` (the CLI's --data, --model, --score) raised
    AttributeError: 'str' object has no attribute 'feature_shape', and a single score name was read as its
    letters; now they mean what the options mean, with the same answer as the objects."""
    ds, spec = digits
    kw = dict(trainer=bias_leak_trainer, claimed_epsilon=1.0, delta=1e-5, runs=40, train_size=100)
    named = audit_training("digits", "logreg", scores="probe", **kw)
    assert named.to_dict() == audit_training(ds, spec, scores=("probe",), **kw).to_dict()
    assert named.result.verdict == "violation" and "score probe" in named.audit.description
