"""`dpaudit audit canaries`: the one-run audits and the noise check of a run's gradient canaries.

The simulated mechanism is DP-SGD exactly as claimed on a model whose data gradients vanish (every
update is canaries + noise), through the hooks: correct, it must not be a violation (over 200 seeds,
at most at the stated α: slow); with σC/√2 it must be one from one run (fast).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.accounting import dpsgd_event, epsilon_for
from dpaudit.cli.main import app
from dpaudit.errors import InputError
from dpaudit.hooks import GradientCanaries
from dpaudit.workflows.hooks_audit import audit_canaries

SHAPES = {"w": (60, 10), "b": (10,)}
SIGMA, Q, T, DELTA = 1.0, 0.5, 10, 1e-5


def claim() -> float:
    return float(epsilon_for(dpsgd_event(noise_multiplier=SIGMA, sample_rate=Q, steps=T), DELTA, "pld"))


def simulate(seed: int, out, *, factor: float = 1.0, count: int = 500, inclusion: str = "run", included=None):
    c = GradientCanaries(
        SHAPES, count=count, sample_rate=Q, clip=1.0, seed=seed, inclusion=inclusion, included=included
    )
    rng = np.random.default_rng([seed, 99])
    for t in range(T):
        g = c.inject(t, {n: np.zeros(s) for n, s in SHAPES.items()})
        c.observe(t, {n: v + factor * SIGMA * rng.normal(size=v.shape) for n, v in g.items()})
    return c.save(out)


def test_correct_is_not_a_violation_and_sqrt2_is(tmp_path):
    ok = audit_canaries(
        simulate(0, tmp_path / "ok", count=300), claimed_epsilon=claim(), delta=DELTA, noise_multiplier=SIGMA
    )
    assert ok.verdict == "consistent" and ok.noise.verdict == "consistent" and ok.to_dict()["formal"] is True
    # Bonferroni over the three formal tests: each at α/3
    assert [a.result.confidence for a in ok.audits] == pytest.approx([1 - 0.05 / 3] * 2)
    assert ok.noise.alpha == pytest.approx(0.05 / 3)
    assert 0.01 < ok.noise.cross_group_p_value <= 1.0  # w and b compared where no canary sits
    bug = audit_canaries(
        simulate(0, tmp_path / "bug", factor=1 / math.sqrt(2)), claimed_epsilon=claim(), delta=DELTA,
        noise_multiplier=SIGMA,
    )  # fmt: skip
    assert bug.verdict == "violation" and bug.noise.verdict == "violation"
    # Without σ there is no curve and no noise check: the (ε, δ) one-run audit alone, at the full level.
    alone = audit_canaries(tmp_path / "ok", claimed_epsilon=claim(), delta=DELTA)
    assert alone.noise is None and [a.result.method for a in alone.audits] == ["one-run"]
    assert alone.audits[0].result.confidence == pytest.approx(0.95)


def test_canaries_all_included_or_all_excluded_are_refused_in_one_line(tmp_path):
    """The one-run audit needs included and excluded canaries: all in (or all out) is refused naming the counts
    and the fix (mutant: the check removed from audit canaries passed the fast tier)."""
    for bits, n_in in ((np.ones(8, bool), 8), (np.zeros(8, bool), 0)):
        d = simulate(2, tmp_path / f"c{n_in}", count=8, included=bits)
        # fair coins give all or none with probability 2^(1 - 8) (mutant: 2^-8, half of it, was not seen)
        with pytest.raises(InputError, match=rf"{n_in} of 8 canaries are included: .*probability 0\.0078\).*seed"):
            audit_canaries(d, claimed_epsilon=1.0, delta=DELTA)
    # 3 canaries with bits given (GradientCanaries refuses fewer than 4 only when it draws them): named with the
    # audit's minimum, not audit_scores' "holdout guess-count selection needs at least 4" (mutant: checked < 2)
    d = simulate(2, tmp_path / "c3", count=3, included=np.array([True, False, True]))
    with pytest.raises(InputError, match=r"c3: 3 gradient canaries: the one-run audit needs at least 4 "):
        audit_canaries(d, claimed_epsilon=1.0, delta=DELTA)


def test_canaries_reveal_a_model_that_is_not_private(tmp_path):
    """(Almost) no noise: the canaries' own audit, without the noise check, refutes a claim of ε = 1."""
    d = simulate(1, tmp_path / "c", factor=1e-6)
    r = audit_canaries(d, claimed_epsilon=1.0, delta=DELTA)
    assert r.noise is None and r.verdict == "violation" and r.audits[0].result.epsilon_lower_bound > 1.0


def test_cli_json_and_bad_input(tmp_path):
    simulate(0, tmp_path / "c")
    base = ["audit", "canaries", str(tmp_path / "c"), "--claimed-epsilon", str(claim()), "--delta", str(DELTA)]
    r = CliRunner().invoke(app, [*base, "--noise-multiplier", str(SIGMA), "--steps", str(T), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["verdict"] == "consistent" and d["noise_check"]["verdict"] == "consistent" and d["steps"] == T
    for extra, msg in [(["--steps", "11"], "observed 10"), (["--sample-rate", "0.25"], "q = 0.5"),
                       (["--noise-multiplier", "0"], "--noise-multiplier")]:  # fmt: skip
        r = CliRunner().invoke(app, [*base, *extra])
        assert r.exit_code == 2 and msg in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = CliRunner().invoke(app, ["audit", "canaries", str(tmp_path / "c")])
    assert r.exit_code == 2 and "--claimed-epsilon" in r.output
    simulate(0, tmp_path / "s", inclusion="step")
    with pytest.raises(InputError, match=r"per-step canaries .*give --noise-multiplier"):
        audit_canaries(tmp_path / "s", claimed_epsilon=1.0, delta=DELTA)
    (tmp_path / "c" / "canaries.json").write_text("{")
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 2 and "not valid JSON" in r.output and len(r.output.strip().splitlines()) == 1


def test_per_step_canaries_get_the_per_step_audit_and_the_noise_check(tmp_path):
    """inclusion="step" (a fresh coin per canary and step): each of the T·M coins is one canary of the one-run
    f-DP game against ONE step's curve (formal), beside the noise check, Bonferroni α/2 each. Correct: not a
    violation; no noise to speak of: the per-step curve is refuted from one run; σC/√2: the noise check."""
    kw = dict(claimed_epsilon=claim(), delta=DELTA, noise_multiplier=SIGMA)
    ok = audit_canaries(simulate(0, tmp_path / "ok", inclusion="step"), **kw)
    (rec,) = ok.audits
    assert rec.result.method == "one-run-fdp" and rec.attack == "gradient-canaries" and rec.family == "white-box"
    assert rec.result.confidence == pytest.approx(1 - 0.05 / 2 / 2)  # audit_steps halves its share for (a), (b)
    assert ok.noise.alpha == pytest.approx(0.05 / 2)
    assert ok.verdict == "consistent" and rec.result.verdict == "consistent"
    step_claim = float(epsilon_for(dpsgd_event(noise_multiplier=SIGMA, sample_rate=Q, steps=1), DELTA, "pld"))
    assert rec.result.details["per_step_claimed_epsilon"] == pytest.approx(step_claim)
    assert rec.result.details["composed_epsilon_estimate"] <= claim()  # the estimate, from a correct run
    leak = audit_canaries(simulate(0, tmp_path / "leak", inclusion="step", factor=1e-6), **kw)
    assert leak.audits[0].result.verdict == "curve-refuted" and leak.verdict == "violation"
    bug = audit_canaries(simulate(0, tmp_path / "bug", inclusion="step", factor=1 / math.sqrt(2)), **kw)
    assert bug.verdict == "violation" and bug.noise.verdict == "violation"


@pytest.mark.slow
def test_soundness_200_seeds_of_a_correct_mechanism(tmp_path, monkeypatch):
    """200 correct runs: 'violation' (any of the three formal tests) is a false alarm of probability at most
    α = 0.05, so the count is at most Binomial(200, 0.05)'s 99.9% quantile (21).

    A violation depends only on the lower bounds (audit.result.decide_verdict), never on the largest ε the
    design could certify, so that search (most of an audit's time) is replaced by +inf here."""
    from scipy import stats

    from dpaudit.audit import fdp_one_run, one_run

    monkeypatch.setattr(fdp_one_run, "max_certifiable", lambda *a, **k: (math.inf, math.inf))
    monkeypatch.setattr(one_run, "max_certifiable", lambda *a, **k: math.inf)

    n = 200
    alarms = sum(
        audit_canaries(simulate(s, tmp_path / str(s), count=200), claimed_epsilon=claim(), delta=DELTA,
                       noise_multiplier=SIGMA, seed=s).verdict == "violation"
        for s in range(n)
    )  # fmt: skip
    assert alarms <= stats.binom.ppf(0.999, n, 0.05)


def test_the_claim_is_checked_against_what_sigma_q_t_account_to(tmp_path):
    """With σ given, the claimed ε is compared with the PLD ε of (σ, q, T) (what DP-SGD claims for them): below
    it (by more than CLAIM_RTOL) is reported as unsupported, far above it is noted, and either way the audits
    test the claim as given and the verdict is the formal tests' alone."""
    from dpaudit.workflows.hooks_audit import CLAIM_RTOL, FAR_ABOVE

    d = simulate(0, tmp_path / "c")
    accounted = claim()
    kw = dict(delta=DELTA, noise_multiplier=SIGMA, sample_rate=Q, steps=T)
    same = audit_canaries(d, claimed_epsilon=accounted, **kw)
    assert same.accounting["relation"] == "matches" and same.accounting["epsilon"] == pytest.approx(accounted)
    assert same.claim["accounting"] == same.accounting and "claim check: " in same.summary()

    low = 0.97 * accounted  # 3% below: unsupported by the accountant, yet no formal test of 500 canaries refutes it
    assert low < (1 - CLAIM_RTOL) * accounted
    below = audit_canaries(d, claimed_epsilon=low, **kw)
    assert below.accounting["relation"] == "below" and "does not support this claim" in below.accounting["statement"]
    assert "Not a violation by itself" in below.accounting["statement"]
    assert all(a.result.claimed_epsilon == low for a in below.audits)  # the claim as given
    assert below.verdict == "consistent"  # unsupported is not refuted: the formal tests decide
    rounded = audit_canaries(d, claimed_epsilon=(1 - CLAIM_RTOL / 2) * accounted, **kw)
    assert rounded.accounting["relation"] == "matches"  # within the accountants' tolerance

    far = audit_canaries(d, claimed_epsilon=1.01 * FAR_ABOVE * accounted, **kw)
    assert far.accounting["relation"] == "far-above" and "weaker claim" in far.accounting["statement"]
    above = audit_canaries(d, claimed_epsilon=0.99 * FAR_ABOVE * accounted, **kw).accounting
    assert above["relation"] == "above" and "is above what" in above["statement"]  # never "matches" at 1.49x
    upper = audit_canaries(d, claimed_epsilon=(1 + CLAIM_RTOL / 2) * accounted, **kw)
    assert upper.accounting["relation"] == "matches"  # a rounded-up claim within the tolerance
    r = CliRunner().invoke(app, ["audit", "canaries", str(d), "--claimed-epsilon", str(low), "--delta", str(DELTA),
                                 "--noise-multiplier", str(SIGMA), "--json"])  # fmt: skip
    assert r.exit_code == 0 and json.loads(r.stdout)["claim"]["accounting"]["relation"] == "below"
    assert audit_canaries(d, claimed_epsilon=low, delta=DELTA).accounting is None  # no σ: no mechanism to account


def test_a_claim_of_epsilon_zero_is_audited_as_in_every_other_audit(tmp_path):
    """`audit scores` and `audit checkpoint` take ε = 0 (a claim of perfect privacy); `audit canaries` refused it.
    Canaries through σ = 1 refute it formally."""
    r = audit_canaries(simulate(0, tmp_path / "ok"), claimed_epsilon=0.0, delta=DELTA)
    assert r.claim["epsilon"] == 0.0 and r.verdict == "violation"
    with pytest.raises(InputError, match="claimed_epsilon"):
        audit_canaries(tmp_path / "ok", claimed_epsilon=-1.0, delta=DELTA)


def test_one_noise_draw_for_every_parameter_group_is_a_violation():
    """A loop that draws every leaf's noise from the same seed each step (JAX: one key for every leaf, as
    in ``tree_map(lambda g: g + σC·normal(key, g.shape), grads)``): every group gets the same leading
    draws, so w's first 10 noisy coordinates minus b's are the clipped sums' difference, unnoised. The
    variance and the independence across steps are as claimed; before, the check said "consistent".
    (The noise check as audit_canaries runs it, without the one-run audits' PLD curves; that it is wired
    there is asserted in test_correct_is_not_a_violation_and_sqrt2_is.)"""
    from dpaudit.audit.noise import noise_check
    from dpaudit.hooks.core import cross_pair_counts

    c = GradientCanaries(SHAPES, count=50, sample_rate=Q, clip=1.0, seed=0)
    for t in range(T):
        g = c.inject(t, {n: np.zeros(s) for n, s in SHAPES.items()})
        c.observe(t, {n: v + SIGMA * np.random.default_rng([5, t]).normal(size=v.shape) for n, v in g.items()})
    obs = c.observations()
    check = noise_check(
        obs.noise_ss, obs.noise_count, obs.projections, noise_std=SIGMA, names=list(SHAPES), cross=obs.cross,
        cross_counts=T * cross_pair_counts(obs.param_shapes, obs.coordinates),
    )  # fmt: skip
    assert check.variance_p_value > 0.01 and check.independence_p_value > 0.01
    assert check.verdict == "violation" and check.cross_group_p_value == 0.0
    assert any("across parameter groups (w and b" in n for n in check.notes), check.notes


def test_a_float32_sample_rate_is_named_in_the_mismatch_message(tmp_path):
    """Canaries built with q = np.float32(0.1) (a JAX user's jnp value) sample at 0.10000000149…; auditing with
    --sample-rate 0.1 was refused with "the claim says q = 0.1, but the canaries were Poisson-sampled at q = 0.1"."""
    c = GradientCanaries(SHAPES, count=5, sample_rate=np.float32(0.1), clip=1.0, seed=0)
    g = c.inject(0, {n: np.zeros(s) for n, s in SHAPES.items()})
    c.observe(0, g)
    with pytest.raises(
        InputError, match=r"q = 0\.1, .* at q = 0\.10000000149011612 \(the claim's q rounded to float32"
    ):
        audit_canaries(c.save(tmp_path / "c"), claimed_epsilon=1.0, delta=DELTA, sample_rate=0.1)


def test_a_partial_dependence_across_groups_is_tested_on_every_steps_values(tmp_path, monkeypatch):
    """b's noise shares half its variance with w's leading draws at every step (ρ = 0.5): over T = 10 steps the
    cross-group test compares T × 9 values per pair and finds it (p ≈ 3e-5); counted as one step's 9 values, the
    same r² would give p ≈ 0.22, "consistent". The variance and the independence across steps are as
    claimed, so the cross-group test alone refutes the claim."""
    from dpaudit.audit.noise import cross_group_p_value
    from dpaudit.hooks.core import cross_pair_counts

    c = GradientCanaries(SHAPES, count=20, sample_rate=Q, clip=1.0, seed=0)
    rng = np.random.default_rng([0, 99])
    for t in range(T):
        g = c.inject(t, {n: np.zeros(s) for n, s in SHAPES.items()})
        zw = rng.normal(size=SHAPES["w"])
        zb = 0.5 * zw.reshape(-1)[:10] + math.sqrt(0.75) * rng.normal(size=10)
        c.observe(t, {"w": g["w"] + SIGMA * zw, "b": g["b"] + SIGMA * zb})
    obs = c.observations()
    monkeypatch.setattr("dpaudit.workflows.checkpoint.claim_tradeoff", lambda claim: None)  # the noise check only
    per_step = cross_pair_counts(obs.param_shapes, obs.coordinates)
    r = audit_canaries(c.save(tmp_path / "c"), claimed_epsilon=claim(), delta=DELTA, noise_multiplier=SIGMA)
    assert r.noise.cross_group_p_value == pytest.approx(cross_group_p_value(obs.cross, T * per_step)[0], rel=1e-12)
    assert cross_group_p_value(obs.cross, per_step)[0] > 0.05  # what one step's count would have said
    assert r.noise.variance_p_value > 0.05 and r.noise.independence_p_value > 0.05
    assert r.noise.verdict == "violation" and r.verdict == "violation"
    assert any("across parameter groups (w and b" in n for n in r.noise.notes), r.noise.notes


def test_a_float32_claim_sample_rate_is_named_in_the_mismatch_message(tmp_path):
    """The other way round: canaries built with q = 0.1, audited with sample_rate=np.float32(0.1) (a q computed in
    torch or NumPy float32) was refused without saying why the two q's differ."""
    c = GradientCanaries(SHAPES, count=5, sample_rate=0.1, clip=1.0, seed=0)
    c.observe(0, c.inject(0, {n: np.zeros(s) for n, s in SHAPES.items()}))
    with pytest.raises(InputError, match=r"at q = 0\.1 \(this q is the canaries' q rounded to float32"):
        audit_canaries(c.save(tmp_path / "c"), claimed_epsilon=1.0, delta=DELTA, sample_rate=np.float32(0.1))


def test_a_constant_sigma_below_the_claim_is_audited_not_refused_as_a_noise_schedule(tmp_path, monkeypatch):
    """The noise-schedule refusal is for a σ that changed during training (smallest < largest). A loop that used one
    σ below the claimed one is what the noise check is there to find: refused as a "schedule" (a mutant reading
    smallest <= largest as a schedule survived), the buggy loop left with exit 2, not a violation. A claimed σ equal
    to the smallest up to float rounding is taken too. The audit is stopped just past the refusals (it is slow)."""
    from dpaudit.hooks.core import SIGMA_MAX, SIGMA_MIN
    from dpaudit.workflows import hooks_audit

    class Past(Exception):
        pass

    def past(*args, **kwargs):  # the claim's accounting: the first step after the refusals
        raise Past

    monkeypatch.setattr(hooks_audit, "claim_accounting", past)
    for i, (lo, hi, sigma) in enumerate([(0.5, 0.5, SIGMA), (0.3, 1.0, 0.1 * 3)]):
        c = GradientCanaries(SHAPES, count=8, sample_rate=Q, clip=1.0, seed=0)
        for t in range(2):
            g = c.inject(t, {n: np.zeros(s) for n, s in SHAPES.items()})
            c.observe(t, {n: v + lo for n, v in g.items()})
        c.meta.update({SIGMA_MIN: lo, SIGMA_MAX: hi})
        with pytest.raises(Past):
            audit_canaries(c.save(tmp_path / str(i)), claimed_epsilon=1.0, delta=DELTA, noise_multiplier=sigma)
