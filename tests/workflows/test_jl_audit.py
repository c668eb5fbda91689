"""The one-step JL audit (dpaudit.workflows.jl_audit): JL(1) violates a plain-DP-SGD-formula claim
and not the JL accountant's; the same experiment with exact norms violates nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from dpaudit.workflows.jl_audit import JLStepAudit, jl_audits, jl_step_scores

torch.set_num_threads(1)


def test_scores_are_the_trainers_mechanism_and_have_the_predicted_law():
    # jl_step_scores re-runs the first `verify` trials through jl_clipped_sum and raises if the closed
    # form differs; here 64 of them, with and without the canary.
    cfg = JLStepAudit(trials=2000, verify=64)
    scores, member = jl_step_scores(cfg)
    assert member.sum() == 1000
    # Without the canary: o ~ N(0, σ²) exactly (the data have no gradient along u).
    assert stats.kstest(scores[~member] / cfg.noise_multiplier, "norm").pvalue > 1e-3
    # With it, at r = 1 and ‖g_c‖ ≫ C: o − σz ≈ 1/|Z|, so P(o > t) ≈ P(1/|Z| + σ N > t) ≫ the
    # exact-clipping value P(1 + σ N > t); at t = 4σ: exact gives Φ(−3.5) ≈ 2e-4.
    tail = np.mean(scores[member] > 4 * cfg.noise_multiplier)
    assert tail > 0.05


def test_exact_norms_variant_is_dpsgd():
    cfg = JLStepAudit(trials=2000, verify=16, exact_norms=True)
    scores, member = jl_step_scores(cfg)
    # o = min(‖g_c‖, C)·⟨ĝ_c, u⟩/C + σz: shift ≈ 1 (cos(ĝ_c, u) = A/sqrt(A² + 1))
    shift = scores[member].mean() - scores[~member].mean()
    assert abs(shift - 1.0) < 4 * cfg.noise_multiplier * np.sqrt(2 / 1000)


@pytest.mark.slow
def test_jl1_violates_the_plain_claim_but_not_the_jl_claim():
    cfg = JLStepAudit()  # σ = 2, r = 1, 20000 runs
    audits = jl_audits(cfg)
    plain, jl = audits["plain"].result, audits["jl"].result
    assert plain.formal and plain.verdict == "violation"
    assert plain.epsilon_lower_bound > plain.claimed_epsilon
    assert jl.formal and jl.verdict != "violation"
    assert jl.claimed_epsilon >= jl.epsilon_lower_bound
    # Control (the planted-correct variant): the same trials with exact norms do not violate the
    # plain claim, so the violation is JL's unbounded weight, not the audit.
    exact = jl_audits(JLStepAudit(exact_norms=True, verify=4))["plain"].result
    assert exact.verdict != "violation"


def test_jl_step_family_refuses_a_run_without_jl():
    from types import SimpleNamespace

    from dpaudit.errors import InputError
    from dpaudit.workflows.checkpoint import FAMILY_RUNNERS

    run = SimpleNamespace(path="runs/dp", privacy={"noise_multiplier": 1.0, "delta": 1e-5})
    with pytest.raises(InputError, match="DP-SGD-JL run"):
        FAMILY_RUNNERS["jl-step"](run, {}, 0, None)


@pytest.mark.slow
def test_jl_step_family_reports_both_verdicts_for_a_jl1_run():
    """The wire from a JL checkpoint's claim (σ, r) to the report's jl-step section."""
    from types import SimpleNamespace

    from dpaudit.workflows.checkpoint import FAMILY_RUNNERS

    run = SimpleNamespace(path="runs/jl1", privacy={"noise_multiplier": 2.0, "jl_projections": 1, "delta": 1e-5})
    out = FAMILY_RUNNERS["jl-step"](run, {"trials": 8000}, 0, None)
    assert out["params"] == {"noise_multiplier": 2.0, "projections": 1, "trials": 8000}
    assert out["verdict_vs_plain_formula"] == "violation"
    assert out["verdict_vs_jl_accountant"] != "violation"
    assert out["epsilon_lower_bound"] > out["plain_formula_claim"]


def test_jl_step_verdicts_are_not_the_models(tmp_path, monkeypatch):
    """The jl-step audit tests ONE JL step at q = 1 (one-step claims), not the run's claim at (q, T): its section
    says so and its verdicts never reach the model's audits, headline or plot. The audit itself is replaced by
    a formal violation of both one-step claims (its real numbers are the slow tests' above).
    Planted: registering jl-step among FAMILY_AUDITS makes that violation the model's verdict."""
    from types import SimpleNamespace

    from dpaudit.audit import audit_scores
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.report._data import tradeoff_layers
    from dpaudit.report.build import build_report, model_entry_from
    from dpaudit.report.markdown import render_markdown
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run
    from dpaudit.workflows import audit_checkpoint, jl_audit
    from dpaudit.workflows.checkpoint import FAMILY_AUDITS, FAMILY_RUNNERS
    from dpaudit.workflows.result import AuditRecord

    member = np.arange(400) % 2 == 0
    scores = member * 10.0 + np.random.default_rng(0).normal(size=400)

    def fake(cfg):
        claims = {"plain": 0.5, "jl": 0.9}  # one-step claims, both below what these scores show
        out = {}
        for k, e in claims.items():
            res = audit_scores(scores, member, method="clopper-pearson", design="multi-run", claimed_epsilon=e)
            out[k] = AuditRecord("multi-run", f"one step vs {k}", res, family="jl-step")
        return out

    monkeypatch.setattr(jl_audit, "jl_audits", fake)
    privacy = {"noise_multiplier": 2.0, "jl_projections": 1, "delta": 1e-5, "epsilon": 3.0, "sample_rate": 0.01,
               "steps": 500}  # fmt: skip
    result = FAMILY_RUNNERS["jl-step"](SimpleNamespace(path="runs/jl1", privacy=privacy), {"trials": 400}, 0, None)
    assert result["verdict_vs_jl_accountant"] == "violation" and result["enters_model_verdict"] is False
    assert result["model_claim"] == 3.0
    assert "ONE DP-SGD-JL step at q = 1, T = 1" in result["note"]
    assert "not the model's claim (ε = 3 at q = 0.01, T = 500 steps)" in result["note"]

    ds = load_dataset("synthetic:n=300,d=5,classes=2,seed=1")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    train_run(ds, spec, TrainConfig(epochs=1, batch_size=32, lr=0.1, seed=0), out=tmp_path / "run")
    monkeypatch.setitem(FAMILY_RUNNERS, "jl-step", lambda run, opts, seed, progress: result)

    def model():
        audit = audit_checkpoint(tmp_path / "run", attacks=(), families={"jl-step": {}})
        return build_report([model_entry_from(audit)], title="t")

    report = model()
    m = report["models"][0]
    assert m["audits"] == [] and m["summary"]["verdict"] is None and m["summary"]["formal"] is None
    assert tradeoff_layers(m)["formal_bounds"] == [] and tradeoff_layers(m)["points"] == []
    text = render_markdown(report)
    assert "one step at q = 1, not the model's claim" in text and "so these verdicts are not the model's" in text

    def as_records(r):  # the planted mistake: the one-step audits read as the model's
        return [AuditRecord("multi-run", "jl", fake(None)["jl"].result, family="jl-step")]

    monkeypatch.setitem(FAMILY_AUDITS, "jl-step", as_records)
    assert model()["models"][0]["summary"]["verdict"] == "violation"


def test_jl_audits_run_the_given_settings_and_label_each_claim(monkeypatch):
    """jl_audits (only slow tests ran it) with a small design: both records use the given settings (trials,
    confidence, δ: a mutant ignoring them ran the default 20 000 runs at 0.95) and each carries its own claim
    and label (the two labels swapped passed every fast test). The claims' PLD accounting (seconds) is replaced by
    two distinct numbers: what is checked is that each reaches its own record."""
    monkeypatch.setattr(JLStepAudit, "claims", lambda self: {"plain": 1.25, "jl": 2.5})
    cfg = JLStepAudit(trials=300, verify=4, delta=1e-4, confidence=0.9, seed=1)
    audits = jl_audits(cfg)
    plain, jl = audits["plain"], audits["jl"]
    assert (plain.result.claimed_epsilon, jl.result.claimed_epsilon) == (1.25, 2.5)
    for rec in (plain, jl):
        r = rec.result
        assert (r.counts["n_members"], r.counts["n_nonmembers"], r.confidence, r.delta) == (150, 150, 0.9, 1e-4)
        assert "300 runs" in rec.description and rec.family == "jl-step" and r.design == "multi-run"
    assert "claim by the plain DP-SGD formula: ε = 1.25 at δ = 0.0001" in plain.description
    assert "claim by the JL accountant (r = 1): ε = 2.5 at δ = 0.0001" in jl.description
    # No settings: the defaults (the runs themselves replaced: 20 000 of them are the slow tests').
    from dpaudit.workflows import jl_audit

    seen = []
    member = np.arange(20) % 2 == 0
    monkeypatch.setattr(jl_audit, "jl_step_scores", lambda c: seen.append(c) or (member * 1.0, member))
    assert jl_audits()["jl"].result.claimed_epsilon == 2.5 and seen == [JLStepAudit()]
