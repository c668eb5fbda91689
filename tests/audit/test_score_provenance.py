"""``dpaudit audit scores`` checks what a scores file says about its own provenance (issue 29).

A file written by ``attack mia --scores-out`` (columns attack, record_id, member, score) holds one
model's members vs holdout records: not independent runs (``--design multi-run``) nor canaries
included w.p. 1/2 (``--design canaries``), so a formal design on it needs ``--trust-design`` and the
result then says the design was declared by the user.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attacks.result import AttackResult, save_scores
from dpaudit.cli.main import app
from dpaudit.errors import InputError
from dpaudit.workflows.scores import audit_score_file, read_score_file

runner = CliRunner()
N = 400


def _attack(name: str, seed: int = 0) -> AttackResult:
    # Means 3 sd apart: a formal design would read "violation" at claim 1, the mistake these tests guard.
    rng = np.random.default_rng(seed)
    member = np.r_[np.ones(N, bool), np.zeros(N, bool)]
    scores = rng.normal(size=2 * N) + 3.0 * member
    return AttackResult.from_scores(name, scores, member, np.arange(2 * N), n_bootstrap=0)


@pytest.fixture(params=["csv", "npz"])
def mia_file(request, tmp_path):
    """A scores file written by the same function ``attack mia --scores-out`` calls."""
    return save_scores([_attack("lira")], tmp_path / f"s.{request.param}")


def test_attack_mia_files_are_recognised_and_user_files_are_not(mia_file, tmp_path):
    f = read_score_file(mia_file)
    assert f.source == "attack-mia" and f.attack == "lira" and len(f.score) == 2 * N
    own = tmp_path / "own.csv"
    own.write_text("member,score\n1,0.5\n0,0.1\n1,0.7\n0,0.2\n")
    assert read_score_file(own).source is None


@pytest.mark.parametrize(("design", "method"), [("multi-run", "clopper-pearson"), ("canaries", "one-run")])
def test_formal_design_on_an_attack_mia_file_is_refused_with_the_reason(mia_file, design, method):
    args = ["audit", "scores", str(mia_file), "--design", design, "--method", method, "--claimed-epsilon", "1"]
    res = runner.invoke(app, [*args, "--fail-on-violation"])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert len(line.splitlines()) == 1
    assert "written by `dpaudit attack mia`" in line and "one model" in line and "estimate" in line
    assert "--trust-design" in line and "--design membership" in line
    with pytest.raises(InputError, match="members and holdout records of one model"):
        audit_score_file(mia_file, design=design, method=method)


def test_trust_design_audits_it_and_says_the_design_was_declared(mia_file):
    args = ["audit", "scores", str(mia_file), "--design", "multi-run", "--claimed-epsilon", "1", "--trust-design"]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["formal"] is True and d["verdict"] == "violation"  # the user's declaration, taken as given
    assert d["details"]["design_declared_by_user"] is True and d["details"]["score_file_source"] == "attack-mia"
    assert "declared by the user (--trust-design)" in d["notes"][0]
    human = runner.invoke(app, args)
    assert human.exit_code == 0 and "note: design 'multi-run' declared by the user" in human.output


def test_membership_design_on_an_attack_mia_file_stays_an_estimate_without_override(mia_file):
    res = runner.invoke(app, ["audit", "scores", str(mia_file), "--claimed-epsilon", "1", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["formal"] is False and d["verdict"] == "estimate-exceeds-claim"
    assert "design_declared_by_user" not in d["details"]


def test_a_users_own_file_keeps_its_formal_design(tmp_path):
    # No attack/record_id columns: dpaudit cannot know how the bits were drawn and takes --design as given.
    a = _attack("x")
    own = tmp_path / "runs.csv"
    own.write_text(
        "member,score\n" + "".join(f"{int(m)},{float(s)!r}\n" for m, s in zip(a.member, a.scores, strict=True))
    )
    r = audit_score_file(own, design="multi-run", claimed_epsilon=1.0)
    assert r.formal and r.verdict == "violation" and "design_declared_by_user" not in r.details


def test_a_file_with_several_attacks_is_refused(tmp_path):
    path = save_scores([_attack("loss"), _attack("lira", seed=1)], tmp_path / "both.csv")
    res = runner.invoke(app, ["audit", "scores", str(path)])
    assert res.exit_code == 2 and "2 attacks (lira, loss)" in res.output


def test_the_readme_sequence_is_refused():
    """`attack mia --scores-out s.csv` then `audit scores s.csv --design multi-run --fail-on-violation`: a
    bound from one model's membership scores would be called formal and fail a build. (No fixtures, so
    that tests/audit/test_mutations.py can run it under the planted mistake "provenance ignored".)"""
    with tempfile.TemporaryDirectory() as tmp:
        path = save_scores([_attack("lira")], Path(tmp) / "s.csv")
        args = ["audit", "scores", str(path), "--design", "multi-run", "--claimed-epsilon", "1", "--fail-on-violation"]
        res = runner.invoke(app, args)
    assert res.exit_code == 2 and "written by `dpaudit attack mia`" in res.output, res.output


def test_losses_given_as_scores_are_noted(tmp_path):
    """A user's file of losses (lower = member) audits as no leak under higher = member, silently; the result now
    says the members score lower and how to state the direction. The verdict is the one-sided test's, unchanged."""
    a = _attack("x")
    path = tmp_path / "losses.csv"

    def write(scores):
        rows = "".join(f"{int(m)},{float(s)!r}\n" for m, s in zip(a.member, scores, strict=True))
        path.write_text("member,score\n" + rows)

    write(-a.scores)  # members' losses are 3 sd lower
    r = audit_score_file(path, design="multi-run", claimed_epsilon=1.0)
    assert r.verdict == "consistent" and "the members' scores are lower than the non-members'" in r.notes[0]
    assert not any("members' scores are lower" in n for n in audit_score_file(path, alternative="two-sided").notes)
    write(a.scores)
    assert not any("members' scores are lower" in n for n in audit_score_file(path, design="multi-run").notes)
