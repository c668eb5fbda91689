"""The workflow's result as a report entry: attacks and audits of a real run, and claims wired into audits."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpaudit.cli.main import app
from dpaudit.report import build_report, load_report, model_entry_from
from dpaudit.workflows import audit_checkpoint


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A small non-private logistic regression run (about a second to train)."""
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset("synthetic:n=300,d=8,classes=2,seed=0")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes, vocab_size=ds.vocab_size)
    out = tmp_path_factory.mktemp("runs") / "tiny-logreg"
    train_run(ds, spec, TrainConfig(algo="sgd", epochs=5, batch_size=32, lr=0.1), out=out)
    return out


def test_model_entry_of_a_run_without_claim(run_dir, tmp_path):
    entry = model_entry_from(audit_checkpoint(run_dir, attacks=("loss",), cache_dir=tmp_path / "cache"))
    assert entry["name"] == "tiny-logreg"
    assert entry["claim"] is None
    (attack,) = entry["attacks"]["membership"]
    assert attack["attack"] == "loss" and attack["roc"]["fpr"]
    (a,) = entry["audits"]
    assert a["source"] == {"family": "membership", "attack": "loss", "index": 0}
    assert a["method"] == "clopper-pearson" and a["delta"] == 1e-5 and a["claimed_epsilon"] is None
    assert a["formal"] is False and a["design"] == "membership"
    model = build_report([entry], title="t")["models"][0]
    s = model["summary"]
    assert s["claimed_epsilon"] == "inf"
    assert s["verdict"] is None and s["formal"] is None  # no claim, and no formal audit to headline
    assert s["estimate"]["attack"] == "loss"
    assert s["headline"].startswith("no formal audit")
    assert model["utility"]["test_accuracy"] is not None


def test_checkpoint_audit_uses_the_runs_claim_and_passes_settings(run_dir, tmp_path, monkeypatch):
    """A run that claims (ε, δ) is audited at that δ against that ε, with the settings passed through."""
    import shutil

    import attacks.mia
    import dpaudit.workflows.checkpoint as wf

    dp_run = tmp_path / "claimed"
    shutil.copytree(run_dir, dp_run)
    meta = json.loads((dp_run / "checkpoint.json").read_text())
    meta["privacy"] = {"epsilon": 2.0, "delta": 1e-6, "accountant": "rdp", "event": None}
    (dp_run / "checkpoint.json").write_text(json.dumps(meta))
    seen = {}
    real_run_mia, real_audit = attacks.mia.run_mia, wf.audit_scores

    def run_mia(run, methods, **kwargs):
        seen["mia"] = kwargs
        return real_run_mia(run, ["loss"], **kwargs)

    def audit_scores(scores, member, **kwargs):
        seen["audit"] = kwargs
        return real_audit(scores, member, **kwargs)

    monkeypatch.setattr(attacks.mia, "run_mia", run_mia)
    monkeypatch.setattr(wf, "audit_scores", audit_scores)
    result = audit_checkpoint(
        dp_run,
        attacks=("loss",),
        reference_models=3,
        workers=1,
        seed=7,
        confidence=0.9,
        estimate_method="gdp",
        cache_dir=tmp_path / "cache",
    )
    assert seen["mia"]["reference_models"] == 3 and seen["mia"]["seed"] == 7
    assert seen["mia"]["cache_dir"] == tmp_path / "cache"
    assert seen["audit"]["delta"] == 1e-6 and seen["audit"]["claimed_epsilon"] == 2.0
    assert seen["audit"]["method"] == "gdp" and seen["audit"]["confidence"] == 0.9
    assert seen["audit"]["design"] == "membership"
    entry = model_entry_from(result)
    assert entry["claim"]["epsilon"] == 2.0
    assert entry["audits"][0]["verdict"] in ("consistent", "inconclusive", "estimate-exceeds-claim")


def test_cli_on_a_run_directory(run_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "reports" / "tiny"
    result = CliRunner().invoke(
        app,
        [
            "report", str(run_dir), "--attacks", "loss", "--out", str(out), "--format", "json,md",
            "--cache-dir", str(tmp_path / "cache"),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == f"report written to {out}/ (report.json, report.md)"
    report = load_report(out)
    assert report["run"]["config"]["attacks"] == ["loss"]
    assert [m["name"] for m in report["models"]] == ["tiny-logreg"]


@pytest.mark.slow
def test_checkpoint_audit_with_lira(run_dir, tmp_path):
    entry = model_entry_from(
        audit_checkpoint(run_dir, attacks=("loss", "lira"), reference_models=4, cache_dir=tmp_path / "cache")
    )
    assert [a["attack"] for a in entry["attacks"]["membership"]] == ["loss", "lira"]
    assert [a["source"]["index"] for a in entry["audits"]] == [0, 1]
    assert entry["attacks"]["membership"][1]["n_reference_models"] == 4
    build_report([entry], title="t")


def test_report_carries_inversion_attribute_and_extraction_families(tmp_path):
    """The wire from the other attack families into the report: results under attacks[family], rendered
    in Markdown (scalars) and HTML (a table and the inversion grid)."""
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    run = tmp_path / "digits-logreg"
    train_run(ds, spec, TrainConfig(algo="sgd", epochs=3, batch_size=64, lr=0.1), out=run)
    out = tmp_path / "rep"
    r = CliRunner().invoke(
        app,
        [
            "report", str(run), "--attacks", "loss", "--inversion", "--attribute", "pixel_3_4",
            "--extraction-budget", "65", "--out", str(out),
        ],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    model = load_report(out)["models"][0]
    (inv,) = model["attacks"]["inversion"]
    (attr,) = model["attacks"]["attribute"]
    assert inv["attack"] == "mi-face" and len(inv["inversions"]) == 10 and 0 <= inv["identification_accuracy"] <= 1
    assert attr["feature"] is not None and 0 < attr["leakage_test"]["p_value"] <= 1
    (ext,) = model["attacks"]["extraction"]  # logreg: equation solving from d + 1 = 65 queries
    assert ext["queries"] == 65 and ext["fidelity"] == 1.0
    md = (out / "report.md").read_text()
    assert "#### Model inversion attacks" in md and r"identification\_accuracy" in md
    assert r"members.advantage" in md.replace("\\", "")  # nested results flattened one level
    # the attribute leakage in words: an estimate with its p-value, never a DP bound
    assert "leakage_test.p_value" in md.replace("\\", "") and "not a DP bound" in md
    html = (out / "report.html").read_text()
    assert "Model inversions per class" in html  # the grid figure is embedded
    assert "not a DP bound" in html
    assert ("Extraction fidelity against queries" in html) == (len(ext.get("curve") or []) >= 2)
