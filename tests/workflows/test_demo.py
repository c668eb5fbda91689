"""`dpaudit demo` end to end on tiny settings: the report, and README command 1 run twice."""

from __future__ import annotations

import functools
import json

import pytest
from typer.testing import CliRunner

import dpaudit.demo as demo
from dpaudit.cli.main import app
from dpaudit.training.config import DPConfig, TrainConfig

runner = CliRunner()


@pytest.fixture(autouse=True)
def _small_attack_families(monkeypatch):
    """These tests check what the demo wires together and reports (the report's sections, verdicts and
    reruns), not how well MI-FACE, a Cloak or extraction do: those have their own tests
    (tests/attacks/test_inversion.py, tests/cloak/, tests/attacks/test_extraction.py). So MI-FACE runs 5
    iterations from one start (its default: up to 500 from 4, ~60% of a demo test's time), the Cloak trains 1
    epoch (default 30) and extraction's surrogates at least 20 steps (default 1000, for each of the 4 points of
    the fidelity curve); every family still runs on every model and is reported."""
    import attacks.extraction as extraction
    import attacks.inversion as inversion
    import dpaudit.training.cloak as cloak

    class FewStepsMIFace(inversion.MIFace):
        def __init__(self, **kw):
            super().__init__(**{"iterations": 5, "restarts": 1, **kw})

    monkeypatch.setattr(inversion, "MIFace", FewStepsMIFace)
    monkeypatch.setattr(cloak, "CloakConfig", functools.partial(cloak.CloakConfig, epochs=1))
    monkeypatch.setattr(extraction, "SURROGATE_MIN_STEPS", 20)


@pytest.fixture
def tiny_demo(monkeypatch):
    """The demo's pipeline with one small private model and the loss attack only (a few seconds)."""
    monkeypatch.setattr(
        demo,
        "QUICK",
        demo.DemoSettings(epochs=2, dp_epochs=2, reference_models=4, attacks=("loss",), extraction_budget=100),
    )
    monkeypatch.setattr(
        demo,
        "demo_models",
        lambda s: [
            demo.DemoModel(
                "dp",
                TrainConfig(algo="dpsgd", epochs=s.dp_epochs, batch_size=128, lr=1.0, dp=DPConfig(target_epsilon=8.0)),
            )
        ],
    )


def test_demo_runs_twice_and_replaces_its_own_output(tiny_demo, tmp_path, cpu_only):
    out = tmp_path / "reports" / "demo"
    first = runner.invoke(app, ["demo", "--quick", "--out", str(out)])
    assert first.exit_code == 0, first.output
    report = json.loads((out / "report.json").read_text())
    (model,) = report["models"]
    # The headline is the strongest formal audit: the white-box canaries' (the mislabeled ones' beside it).
    assert model["summary"]["formal"]["attack"] == "whitebox-canaries"
    assert {a["source"]["attack"] for a in model["audits"]} >= {"canaries", "whitebox-canaries"}
    assert model["summary"]["estimate"]["attack"] == "loss"
    assert model["attacks"]["inversion"][0]["attack"] == "mi-face"
    assert model["attacks"]["extraction"][0]["queries"] <= 100
    html = (out / "report.html").read_text()
    assert "Model inversions per class" in html and "Extraction fidelity against queries" in html
    second = runner.invoke(app, ["demo", "--quick", "--out", str(out)])
    assert second.exit_code == 0, second.output
    assert f"replacing the earlier demo output in {out}/" in second.output
    assert json.loads((out / "report.json").read_text())["models"] == report["models"]  # reproducible


def test_demo_refuses_a_folder_it_did_not_write(tiny_demo, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    r = runner.invoke(app, ["demo", "--quick", "--out", str(out)])
    assert r.exit_code == 2 and "not a demo output" in r.output
    assert (out / "notes.txt").read_text() == "keep me"


def test_the_demo_catches_its_planted_bug(monkeypatch, tmp_path):
    """The demo's planted-bug model (noise / B, claim for the intended σ) is flagged "violation" by its
    formal white-box audit; the correct model trained the same way is not."""
    monkeypatch.setattr(
        demo,
        "QUICK",
        demo.DemoSettings(epochs=2, dp_epochs=4, reference_models=4, attacks=("loss",), extraction_budget=0),
    )
    full = {m.name: m for m in demo.demo_models(demo.QUICK)}
    bug = full["dp-sgd-eps2-planted-bug"]
    assert bug.planted_bug and bug.config.dp.target_epsilon == 2.0
    correct = demo.DemoModel("correct-eps2", bug.config)
    monkeypatch.setattr(demo, "demo_models", lambda s: [bug, correct])
    out = tmp_path / "demo"
    r = runner.invoke(app, ["demo", "--quick", "--out", str(out)])
    assert r.exit_code == 0, r.output  # the demo reports; only `audit ... --fail-on-violation` fails CI
    report = json.loads((out / "report.json").read_text())
    verdicts = {m["name"]: m["summary"]["verdict"] for m in report["models"]}
    assert verdicts["dp-sgd-eps2-planted-bug"] == "violation", verdicts
    assert verdicts["correct-eps2"] != "violation", verdicts
    assert "dp-sgd-eps2-planted-bug" in report["run"]["config"]["planted_bug"]
    # the terminal's summary (as `dpaudit report` prints it): plain text (no Markdown escapes such as "\>"), one
    # line per model with its claim and headline
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    assert lines["dp-sgd-eps2-planted-bug"].startswith("dp-sgd-eps2-planted-bug (claimed ε 1.9999")
    assert "): VIOLATION: ε ≥ " in lines["dp-sgd-eps2-planted-bug"]
    assert lines["correct-eps2"].endswith("): " + " ".join(models_headline(report, "correct-eps2").split()))
    assert "\\" not in r.stdout


def test_the_demo_shows_a_cloak_and_dp_icl(monkeypatch, tmp_path):
    """The demo's wires to the Cloak family (on the non-private model) and to the DP-ICL entry."""
    monkeypatch.setattr(
        demo,
        "QUICK",
        demo.DemoSettings(
            epochs=2,
            dp_epochs=2,
            reference_models=4,
            attacks=("loss",),
            extraction_budget=0,
            cloak_lambda=2.0,
            icl=True,
        ),
    )
    monkeypatch.setattr(
        demo, "demo_models", lambda s: [demo.DemoModel("non-private", TrainConfig(algo="sgd", epochs=s.epochs))]
    )
    out = tmp_path / "demo"
    r = runner.invoke(app, ["demo", "--quick", "--out", str(out)])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "report.json").read_text())
    models = {m["name"]: m for m in report["models"]}
    assert set(models) == {"non-private", demo.ICL_NAME}
    (cloak,) = models["non-private"]["attacks"]["cloak"]
    assert cloak["lambda"] == 2.0 and 0.0 <= cloak["suppression_ratio"] <= 1.0
    (icl,) = models[demo.ICL_NAME]["attacks"]["icl"]
    assert icl["auc_non_private"] > 0.8  # one noise-free prompt is clearly attackable
    assert models[demo.ICL_NAME]["claim"]["epsilon"] == pytest.approx(8.0, rel=1e-3)


def models_headline(report, name):
    return next(m["summary"]["headline"] for m in report["models"] if m["name"] == name)
