"""``dpaudit audit scores`` and ``dpaudit audit selftest`` through typer's CliRunner."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.cli.main import app

runner = CliRunner()
KEYS = {
    "epsilon_lower_bound", "method", "confidence", "delta", "claimed_epsilon", "verdict", "max_certifiable_epsilon",
    "counts", "threshold", "threshold_selection", "formal", "notes",
}  # fmt: skip


def _write_csv(path, member, score):
    lines = ["member,score"] + [f"{m},{s}" for m, s in zip(member, score, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def strong_csv(tmp_path):
    rng = np.random.default_rng(0)
    n = 2000
    return _write_csv(tmp_path / "strong.csv", [1] * n + [0] * n, np.r_[rng.normal(3, 1, n), rng.normal(0, 1, n)])


def test_scores_human_output(strong_csv):
    res = runner.invoke(app, ["audit", "scores", str(strong_csv), "--claimed-epsilon", "1"])
    assert res.exit_code == 0, res.output
    assert "epsilon lower bound:" in res.output and "verdict: violation" in res.output
    assert "max certifiable epsilon" in res.output


def test_scores_json_output_and_keys(strong_csv):
    res = runner.invoke(app, ["audit", "scores", str(strong_csv), "--json", "--method", "gdp", "--delta", "1e-4"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert KEYS <= set(d)
    assert d["method"] == "gdp" and d["formal"] is False and d["delta"] == 1e-4 and d["verdict"] is None


def test_global_json_flag_works_too(strong_csv):
    res = runner.invoke(app, ["--json", "audit", "scores", str(strong_csv), "--threshold-selection", "bonferroni"])
    assert res.exit_code == 0 and json.loads(res.output)["threshold_selection"] == "bonferroni"


def test_fail_on_violation_exits_1(strong_csv):
    res = runner.invoke(app, ["audit", "scores", str(strong_csv), "--claimed-epsilon", "1", "--fail-on-violation"])
    assert res.exit_code == 1
    ok = runner.invoke(app, ["audit", "scores", str(strong_csv), "--claimed-epsilon", "9", "--fail-on-violation"])
    assert ok.exit_code == 0 and "inconclusive" in ok.output and "too small" in ok.output


def test_gdp_prints_an_estimate_warning(strong_csv):
    res = runner.invoke(app, ["audit", "scores", str(strong_csv), "--method", "gdp"])
    assert res.exit_code == 0 and "warning: this is an estimate" in res.output


def test_npz_input_and_one_run(tmp_path):
    rng = np.random.default_rng(1)
    member = rng.random(1000) < 0.5
    path = tmp_path / "canaries.npz"
    np.savez(path, member=member, score=rng.normal(size=1000) + 4 * member)
    res = runner.invoke(app, ["audit", "scores", str(path), "--method", "one-run", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["method"] == "one-run" and d["epsilon_lower_bound"] > 1 and d["counts"]["guesses"] > 0


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.csv", None, "no such file"),
        ("nocol.csv", "member,value\n1,0.3\n0,0.1\n", "missing column(s) score"),
        ("text.csv", "member,score\n1,0.3\n0,abc\n1,0.2\n0,0.1\n", "non-numeric score 'abc' in row 2"),
        ("nan.csv", "member,score\n1,0.3\n0,\n1,0.2\n0,0.1\n", "NaN/inf"),
        ("single.csv", "member,score\n1,0.3\n1,0.1\n1,0.2\n", "single class"),
        ("badmember.csv", "member,score\n1,0.3\n2,0.1\n0,0.2\n", "0/1"),
        ("empty.csv", "", "not a readable CSV"),
        ("short.csv", "member,score\n1,0.3\n0,0.1\n", "at least 2"),
        ("bad.npz", "not a zip", "not a readable NPZ"),
    ],
)
def test_bad_files_exit_2_with_one_line(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    res = runner.invoke(app, ["audit", "scores", str(path)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], res.output


def test_npz_missing_array_and_pickled_arrays(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, member=np.array([0, 1]))
    res = runner.invoke(app, ["audit", "scores", str(path)])
    assert res.exit_code == 2 and "missing array(s) score" in res.output
    np.savez(path, member=np.array([0, 1]), score=np.array([object(), object()], dtype=object))
    res = runner.invoke(app, ["audit", "scores", str(path)])
    assert res.exit_code == 2 and "not a readable NPZ" in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--confidence", "1.5"], "confidence"),
        (["--delta", "1"], "delta"),
        (["--method", "magic"], "method"),
        (["--threshold-selection", "peek"], "threshold_selection"),
        (["--claimed-epsilon", "-2"], "claimed_epsilon"),
    ],
)
def test_bad_options_exit_2(strong_csv, args, message):
    res = runner.invoke(app, ["audit", "scores", str(strong_csv), *args])
    assert res.exit_code == 2 and message in res.output


def test_selftest_json_small(monkeypatch):
    # A small run (the full self-test is in test_selftest.py); accounting is stubbed to stay fast.
    from dpaudit.audit import selftest

    monkeypatch.setattr(selftest, "poisson_dpsgd_epsilon", lambda q, s, t, d: 2.0)
    res = runner.invoke(app, ["audit", "selftest", "--seeds", "2", "--trials", "300", "--json"])
    assert res.exit_code in (0, 1), res.output
    d = json.loads(res.output)
    assert {"rows", "mutation_score", "false_alarm_rate", "bugs_planted", "runtime_s"} <= set(d)
    assert d["bugs_planted"] == 5 and len(d["rows"]) == 8


def test_selftest_bad_option():
    res = runner.invoke(app, ["audit", "selftest", "--seeds", "0"])
    assert res.exit_code == 2 and "seeds" in res.output
