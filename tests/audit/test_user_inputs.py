"""Audits of users' own inputs: score files as users write them, inclusion bits a user chose, duplicated rows.

A verdict must mean what it says: "violation" (exit 1 with --fail-on-violation) only from a formal bound whose
assumptions the inputs do not contradict; everything else is an estimate, labelled, or a one-line error (exit 2).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from dpaudit.accounting import dpsgd_event, epsilon_for
from dpaudit.audit import audit_scores
from dpaudit.audit.fdp_one_run import dpsgd_family
from dpaudit.cli.main import app
from dpaudit.hooks import GradientCanaries
from dpaudit.workflows.hooks_audit import audit_canaries

runner = CliRunner()


# ---- inclusion bits that are no fair coins ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "tradeoff"),
    [
        ("one-run", "gdp"),
        ("one-run-fdp", "epsilon-delta"),
        # the claim's own curve (else a formal curve refutation); slow: the family's first use costs ~5 s
        pytest.param("one-run-fdp", "dpsgd", marks=pytest.mark.slow),
    ],
)
def test_unfair_inclusion_is_an_estimate_never_a_violation(method, tradeoff):
    """100 of 1000 canaries included and scores that carry no information (a 0-DP mechanism): the constant
    guess "out" is right 90% of the time, so the one-run bound exceeds a true claim (ε = 1 > 0). The one-run
    theorems assume inclusion w.p. 1/2, which these bits reject (p ~ 1e-161): an estimate, never a violation
    nor a refuted curve. Planted: the rate test dropped (the old code: a formal "violation") -> fails."""
    tradeoff = dpsgd_family(1.0, 1) if tradeoff == "dpsgd" else tradeoff
    rng = np.random.default_rng(1)
    member, scores = np.arange(1000) < 100, rng.random(1000)
    kw = {"method": method, "design": "canaries", "tradeoff": tradeoff, "threshold_selection": "bonferroni"}
    r = audit_scores(scores, member, claimed_epsilon=1.0, **kw)
    assert r.epsilon_lower_bound > 1.0  # the bias the theorem's assumption rules out
    assert not r.formal and r.refutation is None and r.verdict == "estimate-exceeds-claim"
    assert r.notes[0].startswith("estimate: 100 of 1000 canaries are included")
    # Fair coins, same scores: formal again (no signal, so no refutation).
    fair = audit_scores(scores, rng.random(1000) < 0.5, claimed_epsilon=1.0, **kw)
    assert fair.verdict != "estimate-exceeds-claim" and fair.details["inclusion_p_value"] >= 1e-3
    assert fair.formal == (method == "one-run" or tradeoff == "epsilon-delta")


SHAPES = {"w": (60, 10), "b": (10,)}
SIGMA, Q, T, DELTA = 4.0, 0.5, 10, 1e-5


def test_hand_written_loop_with_chosen_inclusion_bits_is_no_violation(tmp_path):
    """A hand-written loop passing ``included=`` with the first 10% of its canaries in, and DP-SGD exactly as
    claimed (σ = 4, ε ≈ 0.6): the old audit read "violation" (exit 1 under --fail-on-violation) from the
    unfair bits alone. Now the records are estimates and the run's verdict says so; never exit 1 (exit 2 under
    --fail-on-violation: with estimates only, that gate could never fail)."""
    count = 500
    c = GradientCanaries(SHAPES, count=count, sample_rate=Q, clip=1.0, seed=0, included=np.arange(count) < 50)
    rng = np.random.default_rng(7)
    for t in range(T):
        g = c.inject(t, {n: np.zeros(s) for n, s in SHAPES.items()})
        c.observe(t, {n: v + SIGMA * rng.normal(size=v.shape) for n, v in g.items()})
    d = c.save(tmp_path / "c")
    claim = float(epsilon_for(dpsgd_event(noise_multiplier=SIGMA, sample_rate=Q, steps=T), DELTA, "pld"))
    r = audit_canaries(d, claimed_epsilon=claim, delta=DELTA)
    (one,) = r.audits
    assert one.result.epsilon_lower_bound > claim and not one.result.formal
    assert r.verdict == "estimate-exceeds-claim" and r.to_dict()["formal"] is False  # the saved result says so
    args = ["audit", "canaries", str(d), "--claimed-epsilon", repr(claim), "--delta", "1e-5", "--fail-on-violation"]
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "verdict: estimate-exceeds-claim" in res.output, res.output
    assert "every result here is an estimate" in res.output and "--fail-on-estimate" not in res.output
    # Every canary included: no audit at all, one line naming the cause (not "member has a single class").
    c = GradientCanaries(SHAPES, count=20, sample_rate=Q, clip=1.0, seed=0, included=np.ones(20, bool))
    c.observe(0, c.inject(0, {n: np.zeros(s) for n, s in SHAPES.items()}))
    res = runner.invoke(app, ["audit", "canaries", str(c.save(tmp_path / "all")), *args[3:]])
    assert res.exit_code == 2 and "20 of 20 canaries are included" in res.output, res.output


def test_the_noise_check_is_the_formal_test_of_a_gate_on_unfair_bits(monkeypatch):
    """Inclusion bits a user chose make the one-run records estimates; with --noise-multiplier the noise check is
    a formal test of the same claim, so `audit canaries --fail-on-violation` gates on it: exit 0 when it passes,
    not 2 with "every result here is an estimate" (mutant: the noise check not counted as formal). Without the
    noise check the same records are an estimate-only gate: exit 2. (The workflow is replaced by its result: the
    wiring of the gate is what is tested; the real run takes 15 s for the claim's curve.)"""
    from types import SimpleNamespace

    import dpaudit.workflows.hooks_audit as hooks_audit

    rng = np.random.default_rng(1)
    kw = {"method": "one-run", "design": "canaries", "threshold_selection": "bonferroni"}
    est = audit_scores(rng.random(1000), np.arange(1000) < 100, claimed_epsilon=1.0, **kw)
    assert not est.formal and est.refutation is None and est.verdict == "estimate-exceeds-claim"
    args = ["audit", "canaries", "d", "--claimed-epsilon", "1", "--delta", "1e-5", "--fail-on-violation"]
    for noise, code in ((SimpleNamespace(verdict="consistent"), 0), (None, 2)):
        result = SimpleNamespace(
            verdict="estimate-exceeds-claim", noise=noise, audits=[SimpleNamespace(result=est)],
            to_dict=lambda: {}, summary=lambda: "verdict: estimate-exceeds-claim",
        )  # fmt: skip
        monkeypatch.setattr(hooks_audit, "audit_canaries", lambda *a, result=result, **k: result)
        res = runner.invoke(app, args)
        assert res.exit_code == code and ("every result here is an estimate" in res.output) == (code == 2), res.output


# ---- score files as users write them ---------------------------------------------------------------------


def _strong(n: int = 200):
    rng = np.random.default_rng(3)
    member = np.r_[np.ones(n, int), np.zeros(n, int)]
    return member, rng.normal(size=2 * n) + 3.0 * member


def test_json_score_files_read_like_csv(tmp_path):
    """A JSON object of two lists and a JSON list of records give the CSV's audit exactly. Planted: the JSON
    branch dropped (the old code: a ``missing column(s)`` error dumping the file) -> fails."""
    member, score = _strong()
    (tmp_path / "s.csv").write_text(
        "member,score\n" + "".join(f"{m},{float(s)!r}\n" for m, s in zip(member, score, strict=True))
    )
    (tmp_path / "o.json").write_text(json.dumps({"member": member.tolist(), "score": score.tolist()}))
    records = [
        {"record_id": i, "member": int(m), "score": float(s)}
        for i, (m, s) in enumerate(zip(member, score, strict=True))
    ]
    (tmp_path / "r.json").write_text(json.dumps(records))
    args = ["--design", "multi-run", "--claimed-epsilon", "1", "--json"]
    out = [runner.invoke(app, ["audit", "scores", str(tmp_path / f), *args]) for f in ("s.csv", "o.json", "r.json")]
    assert [o.exit_code for o in out] == [0, 0, 0], out[1].output
    bounds = {json.loads(o.output)["epsilon_lower_bound"] for o in out}
    assert len(bounds) == 1 and bounds.pop() > 1.0


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("s.npy", None, "a .npy file holds one unnamed array"),
        ("l.json", "[1, 2, 3]", "expected a JSON object"),
        ("k.json", '{"member": [1, 0], "scores": [1, 2]}', "missing key(s) score; found 'member', 'scores'"),
        ("n.json", '{"member": [1, 0], "score": 3}', "'score' must be a list"),
        ("t.json", '{"member": [1, 0, 1, 0], "score": [1, "high", 2, 3]}', "non-numeric score 'high' in row 2"),
        ("b.json", "{not json", "b.json"),
        (
            "dup.csv",
            "attack,record_id,member,score\nloss,7,1,0.5\nloss,8,0,0.1\nloss,7,1,0.5\nloss,9,0,0.2\n",
            "record_id 7 appears 2 times (first in row 1); 1 duplicate row(s)",
        ),
    ],
)
def test_bad_score_files_exit_2_with_one_line(tmp_path, name, content, message):
    """Planted: the .npy, JSON or duplicate-record checks removed -> a UnicodeDecodeError line, a 10 000-character
    line, or a file whose duplicated records count twice (a narrower interval) -> fails."""
    path = tmp_path / name
    if content is None:
        np.save(path, np.c_[np.ones(4), np.arange(4.0)])
    else:
        path.write_text(content)
    res = runner.invoke(app, ["audit", "scores", str(path), "--design", "multi-run", "--trust-design"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert message in lines[0] and len(lines[0]) < 300, lines[0]


# ---- null cases with ties, over many seeds (slow) --------------------------------------------------------

FORMAL = [
    ("clopper-pearson", "multi-run", "holdout", "greater"),
    ("clopper-pearson", "multi-run", "bonferroni", "greater"),
    ("clopper-pearson", "multi-run", "holdout", "two-sided"),
    ("clopper-pearson", "multi-run", "bonferroni", "two-sided"),
    ("one-run", "canaries", "bonferroni", "greater"),
    ("one-run", "canaries", "holdout", "greater"),
    ("one-run", "canaries", "holdout", "two-sided"),
    ("one-run-fdp", "canaries", "bonferroni", "greater"),
]


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["three-values", "rare-ones", "sorted-by-member"])
def test_tied_null_scores_violate_a_true_claim_at_most_alpha(pattern):
    """Members and non-members from one distribution of integer scores (heavy ties; "sorted-by-member": the file
    lists members first, so position-based tie-breaking would guess perfectly), claim ε = 0 (true: the scores
    are independent of membership), confidence 0.9: over 200 seeds the rate of "violation" must stay within
    the 99.9% quantile of Binomial(200, 0.1) (29). Measured: at most 16/200 (one-run holdout)."""
    limit = stats.binom.ppf(0.999, 200, 0.1)
    for method, design, selection, alternative in FORMAL:
        violations = 0
        for seed in range(200):
            rng = np.random.default_rng(seed)
            member = rng.random(200) < 0.5 if design == "canaries" else np.arange(200) < 100
            if pattern == "three-values":
                scores = rng.integers(0, 3, 200).astype(float)
            elif pattern == "rare-ones":
                scores = (rng.random(200) < 0.02).astype(float)
            else:
                scores = rng.integers(0, 2, 200).astype(float)
                order = np.argsort(~member, kind="stable")
                member, scores = member[order], scores[order]
            r = audit_scores(
                scores, member, method=method, design=design, threshold_selection=selection, alternative=alternative,
                claimed_epsilon=0.0, delta=1e-5 if method == "one-run-fdp" else 0.0, confidence=0.9, seed=seed,
                tradeoff="epsilon-delta",
            )  # fmt: skip
            violations += r.verdict == "violation"  # (a seed whose bits fail the 1/2-rate test is an estimate)
        assert violations <= limit, (method, selection, alternative, violations)


# ---- a gate that cannot fail does not pass ---------------------------------------------------------------


def _noisy_canaries(tmp_path):
    """500 canaries through T correctly noised steps (σ = SIGMA), saved: a one-run design that stops near ε 5."""
    c = GradientCanaries(SHAPES, count=500, sample_rate=Q, clip=1.0, seed=0)
    rng = np.random.default_rng(7)
    for t in range(T):
        g = c.inject(t, {n: np.zeros(s) for n, s in SHAPES.items()})
        c.observe(t, {n: v + SIGMA * rng.normal(size=v.shape) for n, v in g.items()})
    return c.save(tmp_path / "c")


def test_fail_on_violation_fails_an_inconclusive_canary_audit(tmp_path):
    """`audit canaries --fail-on-violation` on a claim its design cannot refute (ε = 50: the one-run bound of
    500 canaries stops near 5) used to exit 0, a CI job passing on a test that proves nothing; now exit 2 with
    one error line, and exit 0 without the gate. Planted: the gate's inconclusive rule dropped -> exit 0 -> fails."""
    d = _noisy_canaries(tmp_path)
    args = ["audit", "canaries", str(d), "--claimed-epsilon", "50", "--delta", "1e-5"]
    res = runner.invoke(app, [*args, "--fail-on-violation"])
    assert res.exit_code == 2 and "verdict: inconclusive" in res.output, res.output
    assert res.output.strip().splitlines()[-1].startswith("error: --fail-on-violation: verdict inconclusive")
    assert runner.invoke(app, args).exit_code == 0


def _weak_and_strong_canary_records():
    """Null scores of 400 canaries, their membership, and two formal one-run records of them: against ε = 50
    ("inconclusive": no design of 400 canaries refutes it) and against ε = 1 ("consistent")."""
    from dpaudit.workflows.result import AuditRecord

    rng = np.random.default_rng(0)
    member = rng.random(400) < 0.5
    scores = rng.normal(size=400)
    formal = {"method": "one-run", "design": "canaries"}
    weak = AuditRecord("canaries", "weak", audit_scores(scores, member, claimed_epsilon=50.0, **formal))
    strong = AuditRecord("canaries", "strong", audit_scores(scores, member, claimed_epsilon=1.0, **formal))
    return scores, member, weak, strong


def test_a_model_cannot_refute_only_when_every_formal_test_is_inconclusive():
    """``ModelAudit.cannot_refute`` (what `audit checkpoint --fail-on-violation` fails on): every formal test
    inconclusive; an estimate beside it changes nothing; one formal test that could refute clears it."""
    from pathlib import Path

    from dpaudit.workflows.result import AuditRecord, ModelAudit

    scores, member, weak, strong = _weak_and_strong_canary_records()
    estimate = AuditRecord("loss", "estimate", audit_scores(scores, member, claimed_epsilon=50.0))
    assert weak.result.verdict == "inconclusive" and strong.result.verdict == "consistent"

    def model(*records):
        return ModelAudit(Path("m"), "m", {}, audits=records)

    assert model(weak).cannot_refute and model(weak, estimate).cannot_refute
    assert not model(weak, strong).cannot_refute and not model(estimate).cannot_refute and not model().cannot_refute


def test_audit_checkpoint_gate_fails_when_every_formal_test_is_inconclusive(monkeypatch, tmp_path):
    """`audit checkpoint RUN --fail-on-violation` exits 2 when every formal test of the claim is inconclusive (the
    gate could not fail), and gates as usual when one could refute (mutant: ``cannot_refute`` not passed to the
    gate, so a run whose canaries cannot refute the claim passed, exit 0). The workflow is replaced by its result:
    the gate's wiring is what is tested."""
    import dpaudit.workflows as workflows
    from dpaudit.workflows.result import ModelAudit

    *_, weak, strong = _weak_and_strong_canary_records()
    for records, code in (((weak,), 2), ((weak, strong), 0)):
        audit = ModelAudit(tmp_path, "m", {}, audits=records)
        monkeypatch.setattr(workflows, "audit_checkpoint", lambda *a, audit=audit, **k: audit)
        r = runner.invoke(app, ["audit", "checkpoint", str(tmp_path), "--attacks", "none", "--fail-on-violation"])
        assert r.exit_code == code and ("verdict inconclusive" in r.output) == (code == 2), r.output


def test_a_canary_run_is_formal_only_when_every_record_tests_formally():
    """The saved `audit canaries` result says "formal": true only when every record is a formal bound or a formal
    curve refutation: one estimate among them (inclusion bits that are no fair coins) makes it false (mutant:
    ``any`` for ``all`` labelled the estimate's run formal)."""
    from pathlib import Path

    from dpaudit.workflows.hooks_audit import CanaryRunAudit
    from dpaudit.workflows.result import AuditRecord

    rng = np.random.default_rng(0)
    member = rng.random(400) < 0.5
    scores = rng.normal(size=400)
    one_run = audit_scores(scores, member, claimed_epsilon=1.0, method="one-run", design="canaries")
    formal = AuditRecord("canaries", "formal", one_run)
    estimate = AuditRecord("canaries", "estimate", audit_scores(scores, member, claimed_epsilon=1.0))
    assert formal.result.formal and not estimate.result.formal

    def run(*records):
        return CanaryRunAudit(Path("c"), {}, records, None, "consistent", 10, 400).to_dict()["formal"]

    assert run(formal, formal) is True and run(formal, estimate) is False and run(estimate) is False


# (verdicts, --fail-on-violation, --fail-on-estimate, cannot_refute, formal) -> 0 (pass), 1 (refuted), or the start
# of the one-line refusal (exit 2: a gate that could not fail)
NO_CLAIM, ESTIMATES_ONLY = "--fail-on-violation: no claim was tested", "--fail-on-violation: every result here is"
INCONCLUSIVE, INCONCLUSIVE_E = "--fail-on-violation: verdict inconclusive", "--fail-on-estimate: verdict inconclusive"
EXIT_TABLE = [
    (["violation"], False, False, False, True, 0),  # no gate asked for: never exit 1, never refused
    ([None], False, False, False, True, 0),
    (["inconclusive"], False, False, True, True, 0),
    (["estimate-exceeds-claim"], False, False, False, False, 0),
    (["violation"], True, False, False, True, 1),
    (["curve-refuted"], True, False, False, True, 1),
    (["consistent"], True, False, False, True, 0),
    (["consistent", "estimate-exceeds-claim"], True, False, False, True, 0),  # an estimate is not a violation
    (["inconclusive"], True, False, True, True, INCONCLUSIVE),
    (["violation", "inconclusive"], True, False, True, True, 1),  # a refutation beside an inconclusive test
    (["inconclusive", "consistent"], True, False, True, True, INCONCLUSIVE),  # checkpoint: formal ones inconclusive
    (["consistent"], True, False, False, False, ESTIMATES_ONLY),  # estimates only: could never exit 1
    ([None], True, False, False, True, NO_CLAIM),
    ([None, None], False, True, False, False, "--fail-on-estimate: no claim was tested"),
    ([None, "violation"], True, False, False, True, 1),
    (["estimate-exceeds-claim"], False, True, False, False, 1),
    (["violation"], False, True, False, True, 1),  # the stricter gate fails on the formal refutation too
    (["curve-refuted"], False, True, False, True, 1),
    (["consistent"], False, True, False, False, 0),
    (["consistent"], True, True, False, False, 0),  # estimates only, gated on the estimate: can fail, passes
    (["estimate-exceeds-claim", "consistent"], True, True, False, False, 1),
    (
        ["inconclusive"],
        False,
        True,
        True,
        True,
        INCONCLUSIVE_E,
    ),  # was 0: the stricter gate passed where the other failed
    (["inconclusive"], False, True, False, False, INCONCLUSIVE_E),  # was 0: an estimate that cannot exceed the claim
    (["inconclusive"], True, True, False, False, INCONCLUSIVE_E),  # was 0: estimates only, every one inconclusive
    ([None, "inconclusive"], False, True, True, True, INCONCLUSIVE_E),
    (["inconclusive", "consistent"], False, True, True, True, 0),  # an estimate that could exceed: gate can fail
]


@pytest.mark.parametrize(("verdicts", "on_violation", "on_estimate", "cannot_refute", "formal", "code"), EXIT_TABLE)
def test_exit_code_table(verdicts, on_violation, on_estimate, cannot_refute, formal, code):
    """`_exit_code`, the gate of every audit command, case by case: exit 1 only on a formal refutation (or, opted
    in, an estimate above the claim), exit 2 (InputError) for a gate that could not fail, 0 otherwise.
    `--fail-on-estimate` alone passed (exit 0) an audit whose every verdict was "inconclusive", where
    `--fail-on-violation` exits 2: `audit scores s.csv --design multi-run --claimed-epsilon 50 --fail-on-estimate`."""
    import typer

    from dpaudit.cli.audit import _exit_code
    from dpaudit.errors import InputError

    kwargs = {"fail_on_violation": on_violation, "fail_on_estimate": on_estimate}
    if code == 0:
        assert _exit_code(verdicts, **kwargs, cannot_refute=cannot_refute, formal=formal) is None
    elif code == 1:
        with pytest.raises(typer.Exit) as e:
            _exit_code(verdicts, **kwargs, cannot_refute=cannot_refute, formal=formal)
        assert e.value.exit_code == 1
    else:
        with pytest.raises(InputError, match="fails instead of passing") as e:
            _exit_code(verdicts, **kwargs, cannot_refute=cannot_refute, formal=formal)
        assert str(e.value).startswith(code), str(e.value)


def test_fail_on_estimate_alone_fails_on_an_inconclusive_audit(tmp_path):
    """The CLI end of the table's inconclusive rows: exit 2 with one line naming the flag, JSON one document."""
    rng = np.random.default_rng(0)
    member = rng.random(200) < 0.5
    path = tmp_path / "s.csv"
    scores = rng.normal(size=200)
    path.write_text("member,score\n" + "".join(f"{int(m)},{s}\n" for m, s in zip(member, scores, strict=True)))
    args = ["audit", "scores", str(path), "--design", "multi-run", "--claimed-epsilon", "50", "--fail-on-estimate"]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 2, r.output
    assert json.loads(r.stdout)["verdict"] == "inconclusive"
    assert "--fail-on-estimate: verdict inconclusive" in r.stderr
    assert runner.invoke(app, [*args[:-2], "1", "--fail-on-estimate"]).exit_code == 0  # consistent: passes


def test_a_formal_refutation_of_the_claims_curve_is_a_formal_test_for_the_gate():
    """``tests_formally``: the one-run f-DP audit against the claim's own curve reports an estimated ε
    (``formal`` False) but refutes the curve formally (``refutation``): --fail-on-violation must exit 1 on it,
    not 2 as on estimates only (mutant: ``formal`` alone passed the fast tier)."""
    import dataclasses

    import typer

    from dpaudit.audit.result import tests_formally
    from dpaudit.cli.audit import _exit_code
    from dpaudit.errors import InputError

    rng = np.random.default_rng(1)
    member = rng.random(400) < 0.5
    estimate = audit_scores(rng.normal(size=400), member, claimed_epsilon=1.0)
    assert not estimate.formal and estimate.refutation is None and not tests_formally(estimate)
    curve = dataclasses.replace(estimate, verdict="violation", refutation={"claimed_curve_refuted": True})
    assert tests_formally(curve)
    with pytest.raises(typer.Exit) as e:
        _exit_code(["violation"], fail_on_violation=True, fail_on_estimate=False, formal=tests_formally(curve))
    assert e.value.exit_code == 1
    with pytest.raises(InputError, match="every result here is an estimate"):
        _exit_code(["consistent"], fail_on_violation=True, fail_on_estimate=False, formal=tests_formally(estimate))


def test_canary_run_verdict_is_inconclusive_only_when_no_formal_test_could_refute(tmp_path):
    """audit_canaries' verdict (what `audit canaries --fail-on-violation` gates on): "inconclusive" only when every
    one-run record is (and no noise check ran: that case is `test_hooks_audit.py`'s, 4 s here); a record that could
    refute makes it "consistent". Mutant that survived the fast tier: the rule reduced to `noise is None` (every
    audit without σ "inconclusive", so its gate exited 2 on a consistent formal test)."""
    d = _noisy_canaries(tmp_path)
    weak = audit_canaries(d, claimed_epsilon=50.0, delta=DELTA)
    assert weak.noise is None and [r.result.verdict for r in weak.audits] == ["inconclusive"]
    assert weak.verdict == "inconclusive"
    strong = audit_canaries(d, claimed_epsilon=1.0, delta=DELTA)
    assert strong.noise is None and [r.result.verdict for r in strong.audits] == ["consistent"]
    assert strong.verdict == "consistent"
