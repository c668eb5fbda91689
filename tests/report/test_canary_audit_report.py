"""Gradient-canary audits of a user's own loop (`dpaudit audit canaries DIR --out FILE`) and canaries of an
imported checkpoint appear in a report like any other audit: formal bounds, the noise check, the verdict."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from dpaudit import numfmt
from dpaudit.accounting import dpsgd_event, epsilon_for
from dpaudit.cli.main import app
from dpaudit.report.build import build_report, canary_run_entry

from ..workflows.test_hooks_audit import DELTA, SIGMA, Q, claim, simulate

runner = CliRunner()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two saved audits: the correct mechanism and the σC/√2 bug (one run each, as in test_hooks_audit)."""
    tmp = tmp_path_factory.mktemp("canaries")
    files = {}
    for name, factor in (("correct", 1.0), ("sqrt2-bug", 1 / math.sqrt(2))):
        d = simulate(0, tmp / name, factor=factor)
        out = tmp / f"{name}.json"
        args = ["audit", "canaries", str(d), "--claimed-epsilon", repr(claim()), "--delta", repr(DELTA)]
        r = runner.invoke(app, [*args, "--noise-multiplier", repr(SIGMA), "--out", str(out)])
        assert r.exit_code == 0, r.output
        files[name] = out
    return files


def test_saved_canary_audits_render_in_a_report(saved, tmp_path):
    out = tmp_path / "rep"
    r = runner.invoke(app, ["report", str(saved["correct"]), str(saved["sqrt2-bug"]), "--out", str(out),
                            "--format", "json,md,html"])  # fmt: skip
    assert r.exit_code == 0, r.output
    report = json.loads((out / "report.json").read_text())
    models = {m["name"]: m for m in report["models"]}
    bug, ok = models["sqrt2-bug"], models["correct"]
    saved_bug = json.loads(saved["sqrt2-bug"].read_text())
    assert bug["summary"]["verdict"] == saved_bug["verdict"] == "violation"  # the audit's own verdict
    assert ok["summary"]["verdict"] in ("consistent", "inconclusive")
    (check,) = bug["noise_checks"]
    assert check["verdict"] == "violation" and check["formal"]
    assert {g["name"] for g in check["groups"]} == {"w", "b"}
    # The estimated std / σC of the best-resolved group: sd ≈ r/√(2n) for n values (delta method on χ²_n/n).
    g = max(check["groups"], key=lambda g: g["dof"])
    r = 1 / math.sqrt(2)
    assert abs(g["ratio"] - r) <= 4 * r / math.sqrt(2 * g["dof"]), g
    assert all(a["threat_model"] == "white-box, one run" for a in bug["audits"])
    assert [a["method"] for a in bug["audits"] if a["formal"]] == ["one-run"]  # f-DP: a curve refutation
    assert bug["summary"]["formal"]["attack"] == "gradient-canaries"
    md = (out / "report.md").read_text()
    assert "#### Noise check (formal)" in md and "your own training loop" in md
    assert ok["claim"]["accounting"]["relation"] == "matches"  # the claim is what (σ, q, T) account to
    assert f"claim check: the claimed ε = {numfmt.upper(claim())} matches what (σ = {SIGMA:g}" in md
    assert "the noise check rejects the claimed noise std" in md
    html = (out / "report.html").read_text()
    assert "Noise check (formal)" in html and "noise std / σC (estimate)" in html


def test_a_failed_noise_check_sets_the_verdict(saved):
    """Planted: a summary that ignores the noise check. The √2 bug's ε audits alone need not refute the claim;
    the noise check does, and the headline says so."""
    from dpaudit.report.build import canary_run_entry

    entry = canary_run_entry(json.loads(saved["sqrt2-bug"].read_text()))
    for a in entry["audits"]:  # keep only what the ε audits show, whatever it was
        a["verdict"] = "inconclusive" if a["verdict"] == "violation" else a["verdict"]
    model = build_report([entry], title="t")["models"][0]
    assert model["summary"]["verdict"] == "violation"
    assert model["summary"]["headline"].startswith("violation: the noise check rejects")
    without = build_report([{**entry, "noise_checks": []}], title="t")["models"][0]
    assert without["summary"]["verdict"] != "violation"


def test_audit_canaries_out_is_not_overwritten_and_bad_files_are_refused(saved, tmp_path):
    before = saved["correct"].read_bytes()
    d = simulate(0, tmp_path / "again")
    args = ["audit", "canaries", str(d), "--claimed-epsilon", "1", "--delta", "1e-5", "--out", str(saved["correct"])]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "already exists" in r.output
    assert saved["correct"].read_bytes() == before
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"kind": "gradient-canary-audit", "canaries": "x"}))
    r = runner.invoke(app, ["report", str(broken), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 2 and "not a complete saved canary audit" in r.output
    assert not (tmp_path / "rep").exists()


def test_an_imported_checkpoint_with_canaries_gets_its_formal_one_run_bound_in_the_report(tmp_path):
    """make -> insert -> own training -> import --canaries -> report: the formal one-run bound is the
    headline, and the report says the run is imported (issue 25, acceptance 3)."""
    from examples import import_with_canaries as ex

    def invoke(args):
        r = runner.invoke(app, args)
        return r.exit_code, r.stdout

    ex.run(tmp_path, invoke)
    out = tmp_path / "rep"
    r = runner.invoke(
        app, ["report", str(tmp_path / "run"), "--attacks", "loss", "--out", str(out), "--format", "json,md"]
    )
    assert r.exit_code == 0, r.output
    (model,) = json.loads((out / "report.json").read_text())["models"]
    formal = model["summary"]["formal"]
    assert formal["attack"] == "canaries" and formal["method"] == "one-run" and formal["verdict"] == "violation"
    assert formal["threat_model"] == "black-box, one run"
    assert "imported run" in model["audits"][formal["audit_index"]]["description"]
    assert model["summary"]["verdict"] == "violation"
    assert "imported from" in (out / "report.md").read_text()


@pytest.fixture(scope="module")
def per_step(tmp_path_factory):
    """Saved audits of canaries with a fresh coin per step (inclusion="step"): the correct mechanism, and one
    with (almost) no noise, whose one-step curve the per-step audit refutes from one run."""
    tmp = tmp_path_factory.mktemp("per-step")
    files = {}
    for name, factor in (("step-correct", 1.0), ("step-leak", 1e-6)):
        d = simulate(0, tmp / name, factor=factor, inclusion="step")
        out = tmp / f"{name}.json"
        args = ["audit", "canaries", str(d), "--claimed-epsilon", repr(claim()), "--delta", repr(DELTA)]
        r = runner.invoke(app, [*args, "--noise-multiplier", repr(SIGMA), "--out", str(out)])
        assert r.exit_code == 0, r.output
        files[name] = out
    rep = tmp / "rep"
    r = runner.invoke(app, ["report", *map(str, files.values()), "--out", str(rep), "--format", "json,md,html"])
    assert r.exit_code == 0, r.output
    return files, rep


def test_per_step_canary_audits_render_with_their_own_verdict(per_step):
    """The per-step record (one-run f-DP against ONE step's curve, formal as a test, its ε an estimate; the
    composed ε an estimate) is the formal audit behind the verdict: the summary, the plot data and the tables
    say what it tested, and the one-step claim is never shown as the model's."""
    from dpaudit.report._data import tradeoff_layers

    files, rep = per_step
    report = json.loads((rep / "report.json").read_text())
    models = {m["name"]: m for m in report["models"]}
    step_claim = float(epsilon_for(dpsgd_event(noise_multiplier=SIGMA, sample_rate=Q, steps=1), DELTA, "pld"))
    for name in files:
        saved = json.loads(files[name].read_text())
        m = models[name]
        (audit,) = m["audits"]
        assert audit["method"] == "one-run-fdp" and audit["refutation"] is not None
        assert audit["claimed_epsilon"] == pytest.approx(step_claim) and step_claim < 0.5 * claim()
        assert m["claim"]["epsilon"] == pytest.approx(claim())  # the model's claim stays the T-step one
        assert m["summary"]["verdict"] == saved["verdict"], name  # the saved audit's own verdict
        assert "no formal audit" not in m["summary"]["headline"]
        layers = tradeoff_layers(m)
        (test,) = layers["refutations"]  # the formal test is on the plot, labelled with what it showed
        assert test["audit_index"] == 0 and test["label"].startswith("formal [white-box, one run]")
        assert "claimed step curve" in test["label"]
        (step,) = [c for c in layers["claims"] if "one step" in c["label"]]
        assert step["epsilon"] == pytest.approx(step_claim)
    ok, leak = models["step-correct"], models["step-leak"]
    assert ok["summary"]["verdict"] == "consistent"
    assert "not refuted (consistent)" in tradeoff_layers(ok)["refutations"][0]["label"]
    assert ok["summary"]["headline"].startswith("no formal ε bound; the claimed DP-SGD step curve is not refuted")
    assert "the noise check finds no less noise" in ok["summary"]["headline"]
    # The composed ε over all steps is an estimate, labelled, against the model's (T-step) claim.
    composed = ok["audits"][0]["details"]["composed_epsilon_estimate"]
    shown = f"estimate ε ≥ {numfmt.lower(composed)} composed over all steps vs claimed {numfmt.upper(claim())}"
    assert shown in ok["summary"]["headline"]
    assert ok["summary"]["estimate_verdict"] == "consistent"
    assert leak["summary"]["verdict"] == "violation" and leak["audits"][0]["verdict"] == "curve-refuted"
    assert tradeoff_layers(leak)["refutations"][0]["label"].endswith("claimed step curve refuted")
    md = (rep / "report.md").read_text()
    assert f"| {numfmt.upper(step_claim)} (one step) |" in md and "formal curve test, ε an estimate" in md
    assert "| train | not measured (own training loop) | not measured (own training loop) |" in md
    html = (rep / "report.html").read_text()
    assert "not measured (own training loop)" in html and f"{numfmt.upper(step_claim)} (one step)" in html

    # Planted: without the noise check the step curve's refutation alone sets the verdict (curve-refuted) ...
    entry = canary_run_entry(json.loads(files["step-leak"].read_text()))
    alone = build_report([{**entry, "noise_checks": []}], title="t")["models"][0]["summary"]
    assert (
        alone["verdict"] == "curve-refuted"
        and "curve refuted: the claimed DP-SGD step curve is refuted" in alone["headline"]
    )
    # ... and a summary blind to formal tests that bound no ε would say what the issue saw: "no formal audit".
    entry = canary_run_entry(json.loads(files["step-correct"].read_text()))
    entry["audits"][0]["refutation"] = None
    blind = build_report([{**entry, "noise_checks": []}], title="t")["models"][0]["summary"]
    assert blind["verdict"] is None and blind["headline"].startswith("no formal audit")


def test_report_help_names_saved_canary_audits():
    r = runner.invoke(app, ["report", "--help"], terminal_width=100)
    assert r.exit_code == 0
    text = " ".join(r.output.replace("│", " ").split())
    assert "saved canary audits (`dpaudit audit canaries DIR --out FILE.json`" in text


def test_an_imported_run_and_its_own_canary_audit_are_one_model(tmp_path, monkeypatch):
    """`dpaudit report runs/mine audit.json` showed an imported run and the gradient-canary audit of its own training
    as two models: one entry per input, nothing saying they were one training, and the run's headline read "no formal
    audit" beside its own formal row. `audit canaries --run RUN` records the run (its path and checkpoint.json's
    sha256) after checking that the run's claim is the one audited; the report then folds the audit into the run's
    entry. Kept apart: an audit naming no run, and one naming a run that has changed since. Plants caught: the fold
    dropped; the sha256 not compared; the claim not compared (an audit of another ε linked)."""
    import numpy as np
    from safetensors.torch import save_file

    from dpaudit.models import build_model, model_spec_from_dict

    from ..workflows.test_hooks_audit import T

    monkeypatch.chdir(tmp_path)  # paths as a user types them, relative to where the commands run
    spec = {"kind": "logreg", "input_shape": [1, 8, 8], "n_classes": 10}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    save_file(dict(build_model(model_spec_from_dict(spec), seed=0).state_dict()), "weights.safetensors")
    np.savetxt("members.txt", np.arange(600), fmt="%d")
    claim_args = ["--noise-multiplier", repr(SIGMA), "--sample-rate", repr(Q), "--steps", str(T)]
    claim_args += ["--delta", repr(DELTA)]
    imp = ["import", "weights.safetensors", "--model-spec", "spec.json", "--data", "digits", "--members", "members.txt"]
    r = runner.invoke(app, [*imp, *claim_args, "--accountant", "pld", "--out", "runs/mine"])
    assert r.exit_code == 0, r.output
    simulate(0, tmp_path / "run-canaries")
    audit = ["audit", "canaries", "run-canaries", "--delta", repr(DELTA), "--noise-multiplier", repr(SIGMA)]
    eps = json.loads((tmp_path / "runs/mine/checkpoint.json").read_text())["privacy"]["epsilon"]
    assert eps == pytest.approx(claim(), rel=1e-9)
    r = runner.invoke(app, ["audit", "canaries", "run-canaries", "--run", "runs/mine", "--out", "linked.json"])
    assert r.exit_code == 0, r.output  # the claim audited: the run's (ε, δ and σ)
    assert json.loads((tmp_path / "linked.json").read_text())["claim"]["noise_multiplier"] == SIGMA
    none = runner.invoke(app, ["audit", "canaries", "run-canaries", "--delta", repr(DELTA)])
    assert none.exit_code == 2 and "give --claimed-epsilon (the claim audited), or --run RUN" in none.output
    r = runner.invoke(app, [*audit, "--claimed-epsilon", repr(eps), "--out", "apart.json"])
    assert r.exit_code == 0, r.output
    bad = runner.invoke(app, [*audit, "--claimed-epsilon", repr(1.5 * eps), "--run", "runs/mine"])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1, bad.output
    assert f"--run runs/mine: the run's claim has epsilon = {numfmt.exact(eps)}, this audit's" in bad.output

    def report(*inputs):
        r = runner.invoke(app, ["report", *inputs, "--attacks", "loss", "--out", "rep", "--force", "--format", "json"])
        assert r.exit_code == 0, r.output
        return json.loads((tmp_path / "rep" / "report.json").read_text())["models"], r.stderr

    forged = {**json.loads((tmp_path / "linked.json").read_text()), "run": {"path": "runs/mine"}}  # a stranger's
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    r = runner.invoke(app, ["report", "runs/mine", "forged.json", "--attacks", "loss", "--out", "rep"])
    assert r.exit_code == 2 and "forged.json: not a complete saved canary audit (KeyError" in r.output, r.output
    models, _ = report("linked.json", "runs/mine")
    (mine,) = models
    assert mine["name"] == "mine" and mine["path"] == "runs/mine"
    assert {a["source"]["attack"] for a in mine["audits"]} == {"loss", "gradient-canaries"}
    assert len(mine["noise_checks"]) == 1 and mine["summary"]["formal"]["attack"] == "gradient-canaries"
    assert "no formal audit" not in mine["summary"]["headline"]
    models, _ = report("runs/mine", "apart.json")
    assert [m["name"] for m in models] == ["mine", "run-canaries"]
    r = runner.invoke(app, [*imp, *claim_args, "--accountant", "pld", "--split-seed", "1", "--out", "runs/mine",
                            "--force"])  # fmt: skip
    assert r.exit_code == 0, r.output
    models, stderr = report("runs/mine", "linked.json")
    assert [m["name"] for m in models] == ["mine", "run-canaries"]
    assert "linked.json: audited the run runs/mine as its checkpoint.json was then; it has changed since" in stderr
