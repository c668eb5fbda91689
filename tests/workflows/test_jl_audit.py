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
