"""The examples run: Opacus and NumPy DP-SGD pipelines audited as plug-in trainers (a correct pipeline is
not a violation; the same claim with B times too little noise, or without clipping, is), the Opacus unit
test users copy, and the commands of the GitHub Actions workflow.

Sizes from the math: the claim is ε ≈ 1.27 at δ = 1e-5 (σ = 4, q = 0.25, T = 20, RDP), and
``trials_needed(1.27)`` runs per side is the least with which even a perfect attack could refute it;
the audits use more, so a planted bug can be caught. Seeds fixed: the verdicts are deterministic.

``examples/test_opacus_step.py`` is a file users copy; a plain ``pytest`` does not collect it
(``testpaths = ["tests"]``), so its two tests are called from here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.audit.plan import trials_needed
from dpaudit.cli.main import app
from dpaudit.data import Standardizer, load_dataset, make_splits
from dpaudit.models import model_spec_from_dict
from dpaudit.workflows import audit_training
from examples import numpy_dpsgd

ROOT = Path(__file__).resolve().parents[2]
DELTA = 1e-5
OPACUS_RUNS = 50  # per side; trials_needed(1.2717) = 29, and 50 certify up to ε ≈ 1.84
runner = CliRunner()


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _test_accuracy(trainer, ds, seeds=range(3)) -> float:
    """Mean test accuracy of ``trainer`` on 200 aux-standardised members: the private pipeline must learn."""
    from dpaudit.checkpoint import load_state_into, predict_logits
    from dpaudit.models import build_model

    splits = make_splits(len(ds), 0)
    pre = Standardizer.fit(ds.X[splits.aux])
    X, y = pre.transform(ds.X[splits.members[:200]]), ds.y[splits.members[:200]]
    spec = model_spec_from_dict(numpy_dpsgd.MODEL_SPEC)
    accs = []
    for s in seeds:
        model = load_state_into(build_model(spec), trainer(X, y, s), "example")
        accs.append(
            float((predict_logits(model, pre.transform(ds.X[splits.test])).argmax(1) == ds.y[splits.test]).mean())
        )
    return float(np.mean(accs))


# ---- NumPy DP-SGD through the Python API ---------------------------------------------------------------


def test_numpy_dpsgd_correct_vs_sigma_over_batch(digits):
    spec = model_spec_from_dict(numpy_dpsgd.MODEL_SPEC)
    claim = numpy_dpsgd.claimed_epsilon(DELTA)
    runs = 40
    assert trials_needed(claim, delta=DELTA) <= runs, "the design must be able to refute the claim"
    kw = dict(claimed_epsilon=claim, delta=DELTA, runs=runs, train_size=200, seed=0)
    ok = audit_training(digits, spec, trainer=numpy_dpsgd.train, **kw).result
    bug = audit_training(digits, spec, trainer=numpy_dpsgd.train_sigma_over_batch, **kw).result
    assert ok.formal and ok.verdict == "consistent" and ok.epsilon_lower_bound <= claim < ok.max_certifiable_epsilon
    assert not any("reference_size" in n for n in ok.notes)  # it divides by q·reference_size, not q·len(X)
    assert bug.verdict == "violation" and bug.epsilon_lower_bound > claim
    assert _test_accuracy(numpy_dpsgd.train, digits) > 0.3  # private, and still learns (chance: 0.1)


def test_numpy_dpsgd_without_clipping_is_caught_by_an_outlier_canary(digits):
    """Without clipping one record's influence is unbounded; an outlier canary (3x the data's largest
    norm) shows it. The attack separates the runs perfectly (at 400 per side ε ≥ 3.93 of the 3.98 the design can
    certify; at 100, ε ≥ 2.43 of 2.57), so 100 per side, over 3x the trials_needed(1.27) = 29 a perfect attack
    needs, refute the claim with room."""
    spec = model_spec_from_dict(numpy_dpsgd.MODEL_SPEC)
    claim = numpy_dpsgd.claimed_epsilon(DELTA)
    assert trials_needed(claim, delta=DELTA) * 3 <= 100
    kw = dict(claimed_epsilon=claim, delta=DELTA, runs=100, train_size=200, seed=0, canary_kind="outlier")
    bug = audit_training(digits, spec, trainer=numpy_dpsgd.train_without_clipping, **kw).result
    ok = audit_training(digits, spec, trainer=numpy_dpsgd.train, **kw).result
    assert bug.verdict == "violation" and bug.epsilon_lower_bound > claim
    assert ok.verdict == "consistent"


# ---- Opacus through the CLI --------------------------------------------------------------------------------


def _opacus_audit(tmp_path: Path, trainer: str):
    from examples import opacus_pipeline

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(opacus_pipeline.MODEL_SPEC))
    claim = opacus_pipeline.claimed_epsilon(DELTA)
    args = ["--trainer", f"examples.opacus_pipeline:{trainer}", "--model-spec", str(spec), "--train-size", "200"]
    args += ["--runs", str(OPACUS_RUNS), "--claimed-epsilon", repr(claim), "--delta", str(DELTA)]
    res = runner.invoke(app, ["--quiet", "audit", "train", *args, "--fail-on-violation", "--json"])
    return res, claim


@pytest.mark.peers
def test_opacus_pipeline_correct_is_not_a_violation(github_workflow, digits):
    """The correct pipeline's audit is the GitHub workflow's own `dpaudit audit train` command (the same
    options as ``_opacus_audit``: 200 digits, OPACUS_RUNS a side, the claim at DELTA, --fail-on-violation,
    which exited 0): run once, by ``github_workflow``, and read here."""
    from examples import opacus_pipeline

    claim = opacus_pipeline.claimed_epsilon(DELTA)
    audit = next(s for s in github_workflow.scripts if "dpaudit audit train" in s)
    assert f"--runs {OPACUS_RUNS}" in audit and "--train-size 200" in audit and "--fail-on-violation" in audit
    d = json.loads((github_workflow.cwd / "audit.json").read_text())
    assert trials_needed(claim, delta=DELTA) <= OPACUS_RUNS
    assert d["claimed_epsilon"] == pytest.approx(claim) and d["delta"] == DELTA
    assert d["verdict"] == "consistent" and d["formal"] and d["trainer"] == "examples.opacus_pipeline:train"
    assert d["epsilon_lower_bound"] <= claim < d["max_certifiable_epsilon"]
    assert _test_accuracy(opacus_pipeline.train, digits) > 0.3  # private, and still learns (chance: 0.1)


@pytest.mark.peers
def test_opacus_sigma_over_batch_is_a_violation_exit_1(tmp_path):
    pytest.importorskip("opacus")
    res, claim = _opacus_audit(tmp_path, "train_sigma_over_batch")
    assert res.exit_code == 1, res.output
    d = json.loads(res.stdout)
    assert d["verdict"] == "violation" and d["formal"] and d["epsilon_lower_bound"] > claim
    assert d["claimed_epsilon"] == pytest.approx(claim) and d["neighbouring"] == "add_remove"


@pytest.mark.peers
def test_examples_claims_match_dpaudit_account():
    """The pipelines' claims are what `dpaudit account dpsgd` says for their parameters."""
    from examples import opacus_pipeline as op

    for ex in (op, numpy_dpsgd):
        args = ["--noise-multiplier", str(ex.NOISE_MULTIPLIER), "--sample-rate", str(ex.SAMPLE_RATE)]
        res = runner.invoke(app, ["account", "dpsgd", *args, "--steps", str(ex.STEPS), "--delta", str(DELTA), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["epsilon"] == pytest.approx(ex.claimed_epsilon(DELTA), rel=1e-9)


# ---- the copyable Opacus unit test ------------------------------------------------------------------------


@pytest.mark.peers
def test_opacus_step_example_correct_passes():
    pytest.importorskip("opacus")
    from examples import test_opacus_step as ex

    assert ex.TRIALS >= trials_needed(ex.EPSILON, delta=ex.DELTA), "the example must have power"
    ex.test_correct_step_is_private()


@pytest.mark.peers
def test_opacus_step_example_planted_bug_fails():
    pytest.importorskip("opacus")
    from examples import test_opacus_step as ex

    ex.test_step_without_noise_fails()  # asserts internally that assert_dp raises AssertionError


# ---- the GitHub Actions workflow's commands -------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowRun:
    scripts: list[str]  # the workflow's `run:` scripts that ran, in order
    steps: list[dict]
    cwd: Path  # where they ran (audit.json, spec.json); read-only for the tests that share it
    summary: Path


@pytest.fixture(scope="module")
def github_workflow(tmp_path_factory) -> WorkflowRun:
    """Run the workflow's own `run:` scripts (not the install step, not the actions) once, in a scratch
    directory, with this environment's dpaudit and python; each must exit 0."""
    pytest.importorskip("opacus")
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / "examples" / "ci" / "github-audit.yml").read_text())
    steps = workflow["jobs"]["audit"]["steps"]
    scripts = [s["run"] for s in steps if "run" in s and "pip install" not in s["run"]]
    bin_dir = Path(sys.executable).parent
    assert shutil.which("dpaudit", path=str(bin_dir)), "dpaudit must be installed next to this python"
    cwd = tmp_path_factory.mktemp("workflow")
    summary = cwd / "summary.md"
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # the user's kept
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": pythonpath,
           "GITHUB_STEP_SUMMARY": str(summary), "DPAUDIT_TEST_THREADS": "1"}  # fmt: skip
    for script in scripts:
        proc = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{script}\n{proc.stdout}\n{proc.stderr}"
    return WorkflowRun(scripts, steps, cwd, summary)


@pytest.mark.peers
def test_github_workflow_commands_run(github_workflow):
    """The workflow's commands ran (``github_workflow``): the audit passed and left its JSON and summary."""
    scripts, steps = github_workflow.scripts, github_workflow.steps
    assert any("dpaudit audit train --trainer examples.opacus_pipeline:train" in s for s in scripts)
    assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in steps)
    d = json.loads((github_workflow.cwd / "audit.json").read_text())
    assert d["verdict"] == "consistent" and d["trainer"] == "examples.opacus_pipeline:train"
    assert (github_workflow.cwd / "spec.json").is_file()
    assert "privacy audit: consistent" in github_workflow.summary.read_text()


def _install_step_requirements(tmp_path: Path, env_extra: dict[str, str]) -> list[str]:
    """The arguments the workflow's install step gives `pip install`, run with `pip` and `python` shimmed to record
    them (from the checkout's root, as actions/checkout leaves the job)."""
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / "examples" / "ci" / "github-audit.yml").read_text())
    (step,) = [s for s in workflow["jobs"]["audit"]["steps"] if "pip install" in s.get("run", "")]
    shims = tmp_path / "bin"
    shims.mkdir(exist_ok=True)
    log = tmp_path / "pip.log"
    log.unlink(missing_ok=True)
    for name in ("pip", "python"):
        (shims / name).write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" "--" >> "{log}"\n')
        (shims / name).chmod(0o755)
    env = {**os.environ, **step.get("env", {}), **env_extra, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ROOT, env=env, check=True)
    calls = [c.strip().splitlines() for c in log.read_text().split("\n--\n") if c.strip()]
    return [c[-1] for c in calls if c[:1] == ["install"] and any("dpaudit" in a for a in c)]


def test_github_workflow_installs_dpaudit_from_the_checkout_or_the_url_given(tmp_path):
    """dpaudit is not published on an index: the workflow's install step installs it, with the peers extra, from the
    repository checkout it runs in (or from the URL a user sets), never by its bare name from an index; pip itself
    resolves that requirement to this checkout's dpaudit (a dry run, no download, no install)."""
    from packaging.requirements import Requirement

    (line,) = _install_step_requirements(tmp_path, {})
    req = Requirement(line)
    assert (req.name, req.extras, req.url) == ("dpaudit", {"peers"}, f"file://{ROOT}")
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "--report", str(report), line],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    (item,) = json.loads(report.read_text())["install"]
    assert item["metadata"]["name"] == "dpaudit" and item["requested_extras"] == ["peers"]
    assert item["download_info"]["url"] == f"file://{ROOT}"
    url = "git+https://example.org/you/dpaudit.git@0123456789abcdef0123456789abcdef01234567"
    (line,) = _install_step_requirements(tmp_path, {"DPAUDIT_URL": url})
    assert Requirement(line).url == url
