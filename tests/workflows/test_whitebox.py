"""The per-step white-box runner: one DP-SGD run with a per-step Dirac gradient canary on digits."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.data import load_dataset
from dpaudit.errors import InputError
from dpaudit.models import default_spec
from dpaudit.training.config import DPConfig, TrainConfig
from dpaudit.workflows.whitebox import audit_whitebox_steps


def test_per_step_runner_records_coins_and_observations():
    """A correct run: one observation and one coin per step, about half the coins set (binomial, 4 sd),
    the not-inserted steps' spread equals the claimed σ (the canary's coordinate carries only noise:
    χ² 99.9% interval), no formal violation, and the record carries the composed estimate."""
    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=10)
    config = TrainConfig(algo="dpsgd", epochs=4, batch_size=64, lr=0.5, dp=DPConfig(clip=1.0, noise_multiplier=1.0))
    a = audit_whitebox_steps(ds, spec, config, train_size=300, seed=0)
    T = len(a.observations)
    assert T == len(a.inserted) > 10
    assert abs(a.inserted.sum() - T / 2) <= 4 * np.sqrt(T / 4)
    from scipy import stats

    out = a.observations[~a.inserted]
    n = len(out)
    var = out.var(ddof=1)
    assert stats.chi2.ppf(5e-4, n - 1) / (n - 1) <= var <= stats.chi2.ppf(1 - 5e-4, n - 1) / (n - 1)
    r = a.record.result
    # the per-step test refutes curves (formal), its epsilon is an estimate (issue 27)
    assert not r.formal and r.refutation is not None and r.verdict not in ("violation", "curve-refuted")
    assert r.method == "one-run-fdp"
    assert r.details["composed_verdict"] == "consistent" and r.details["composed_epsilon_estimate"] >= 0


def test_per_step_runner_needs_a_private_poisson_recipe():
    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=10)
    with pytest.raises(InputError):
        audit_whitebox_steps(ds, spec, TrainConfig(algo="sgd", epochs=1))


def test_cli_audit_train_white_box_steps():
    """`dpaudit audit train --threat-model white-box-steps`: one run, the per-step record and its statistics."""
    import json

    from typer.testing import CliRunner

    from dpaudit.cli.main import app

    args = ["audit", "train", "--threat-model", "white-box-steps", "--model", "logreg", "--epsilon", "4"]
    args += ["--epochs", "3", "--batch-size", "64", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["formal"] is False and d["refutation"]["curve"] == "DP-SGD step"
    assert d["method"] == "one-run-fdp" and "composed" in d["description"]
    assert "steps" in d
    plugin = ["audit", "train", "--threat-model", "white-box-steps", "--trainer", "os:getcwd"]
    r = CliRunner().invoke(app, [*plugin, "--claimed-epsilon", "1", "--delta", "1e-5"])
    assert r.exit_code == 2 and "own DP-SGD trainer" in r.output, r.output


def _white_box_steps_cli(monkeypatch, per_step, args):
    """`dpaudit audit train ARGS` with the workflow replaced by a white-box-steps result whose per-step test is
    ``per_step`` (the gate's wiring is what the callers test)."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    import dpaudit.workflows.runs as runs
    from dpaudit.cli.main import app

    steps = SimpleNamespace(
        per_step=per_step, verdicts=(per_step.verdict, "consistent"), to_dict=lambda: {}, summary=lambda: "(a) ..."
    )
    result = SimpleNamespace(record=SimpleNamespace(description="one run", result=per_step), steps=steps)
    monkeypatch.setattr(runs, "audit_training_from_options", lambda **kw: result)
    return CliRunner().invoke(app, args)


def test_cli_white_box_steps_gate_fails_when_its_formal_test_is_inconclusive(monkeypatch):
    """`audit train --threat-model white-box-steps --fail-on-violation` read the two verdicts without asking
    whether the formal one (a, per step) could refute anything: an inconclusive per-step test and a consistent
    composed estimate exited 0, a gate that could never fail passing. Now exit 2, as the multi-run path does.
    (The workflow is replaced by its result: the wiring of the gate is what is tested.)"""

    import numpy as np
    from typer.testing import CliRunner

    from dpaudit.audit import audit_scores
    from dpaudit.cli.main import app

    member = np.r_[np.ones(20, bool), np.zeros(20, bool)]
    per_step = audit_scores(np.r_[np.ones(20), np.zeros(20)], member, claimed_epsilon=50.0, design="multi-run")
    assert per_step.verdict == "inconclusive" and per_step.formal
    args = ["audit", "train", "--threat-model", "white-box-steps", "--fail-on-violation"]
    r = _white_box_steps_cli(monkeypatch, per_step, args)
    assert r.exit_code == 2 and "verdict inconclusive" in r.output, r.output
    assert CliRunner().invoke(app, args[:-1]).exit_code == 0


def test_cli_white_box_steps_gate_on_an_estimated_per_step_test_exits_2(monkeypatch):
    """The per-step test (a) is an estimate when the T coins are no fair coins (the inclusion test rejects them);
    (b) is always an estimate. `--fail-on-violation` then has no formal test and could never exit 1: exit 2
    naming it, not 0 (mutant: (a) taken as formal whatever it is, passed the fast tier)."""
    from types import SimpleNamespace

    import numpy as np
    from typer.testing import CliRunner

    import dpaudit.workflows.runs as runs
    from dpaudit.audit import audit_scores
    from dpaudit.cli.main import app

    rng = np.random.default_rng(1)
    kw = {"method": "one-run", "design": "canaries", "threshold_selection": "bonferroni"}
    per_step = audit_scores(rng.random(1000), np.arange(1000) < 100, claimed_epsilon=1.0, **kw)
    assert not per_step.formal and per_step.refutation is None
    args = ["audit", "train", "--threat-model", "white-box-steps", "--fail-on-violation"]
    r = _white_box_steps_cli(monkeypatch, per_step, args)
    assert r.exit_code == 2 and "every result here is an estimate" in r.output, r.output
    # the formal design named is this command's multi-run one, not "`dpaudit audit train`" (the command it is)
    assert "--threat-model white-box or black-box" in r.output and "`dpaudit audit train`" not in r.output, r.output
    # the multi-run design's own estimate (--method gdp) names the formal method (mutant: the advice not passed)
    multi = SimpleNamespace(
        audits=[SimpleNamespace(result=per_step)], audit=SimpleNamespace(description="runs"), result=per_step,
        to_dict=lambda: {},
    )  # fmt: skip
    monkeypatch.setattr(runs, "audit_training_from_options", lambda **kw: multi)
    r = CliRunner().invoke(app, ["audit", "train", "--fail-on-violation"])
    assert r.exit_code == 2 and "use --method clopper-pearson" in r.output, r.output
    assert "`dpaudit audit train`" not in r.output, r.output


def test_steps_record_prints_the_estimate_and_the_claim_in_their_true_order():
    """The record's description states "composed estimate b vs claimed c": b (a lower confidence bound, rounded
    down) and c (rounded up) each at their own digits can print equal when b > c ("2 vs claimed 2" for b =
    2.0000001 > c = 2, a composed verdict of estimate-exceeds-claim); printed with dpaudit.numfmt.ordered they keep
    the numbers' order. Without a claim the claim prints as a dash. Oracle: the decimals, by hand."""
    import dataclasses

    from dpaudit.audit.whitebox import audit_steps
    from dpaudit.workflows.whitebox import steps_record

    rng = np.random.default_rng(0)
    ins = rng.random(400) < 0.5
    stats = audit_steps(rng.normal(size=400) + ins, ins, sample_rate=1.0, noise_multiplier=1.0, claimed_epsilon=2.0)
    close = dataclasses.replace(stats, composed_epsilon_estimate=2.0000001, claimed_epsilon=2.0)
    assert "composed estimate 2.0000001 vs claimed 2 (" in steps_record("x", "what", close).description
    below = dataclasses.replace(stats, composed_epsilon_estimate=1.23456, claimed_epsilon=2.0)
    assert "composed estimate 1.23 vs claimed 2 (" in steps_record("x", "what", below).description
    none = dataclasses.replace(stats, composed_epsilon_estimate=1.23456, claimed_epsilon=None)
    assert "composed estimate 1.23 vs claimed — (" in steps_record("x", "what", none).description


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--algo", "sgd", "--clip", "2"], "error: --clip needs a private algorithm (dpsgd, dpadam), not 'sgd'"),
        (
            [
                "--threat-model",
                "white-box",
                "--canary-kind",
                "clipbkd",
                "--noise-multiplier",
                "1",
                "--allow-inconclusive",
            ],
            "error: --canary-kind is the black-box canary's; the white-box canary is a Dirac gradient",
        ),
        *(
            (
                ["--threat-model", "white-box-steps", "--noise-multiplier", "1", option, value],
                f"error: {option} does not apply to --threat-model white-box-steps (one run, a Dirac canary offered at "
                "each step, audited per step)",
            )
            for option, value in (("--runs", "10"), ("--workers", "2"), ("--method", "gdp"), ("--init", "random"))
        ),
    ],
)
def test_audit_train_refuses_an_option_its_threat_model_or_algorithm_never_reads(args, line):
    """Each was exit 0 with the option ignored: --clip with a non-private recipe, the black-box canary's kind under the
    white-box gradient canary, the multi-run audit's settings under the one-run per-step audit. Planted: each check
    removed (workflows.runs / workflows.training) -> its cases fail."""
    from typer.testing import CliRunner

    from dpaudit.cli.main import app

    base = ["audit", "train", "--data", "synthetic:n=200,d=5,classes=2", "--epochs", "1"]
    r = CliRunner().invoke(app, [*base, *args])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [line], r.output
