"""``dpaudit audit scores``, ``plan`` and ``selftest`` through typer's CliRunner.

JSON is read from ``res.stdout`` (progress lines go to stderr, which ``res.output`` interleaves).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.cli.main import app

runner = CliRunner()
KEYS = {
    "epsilon_lower_bound", "method", "confidence", "delta", "claimed_epsilon", "verdict", "max_certifiable_epsilon",
    "counts", "threshold", "threshold_selection", "formal", "design", "notes",
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
    res = runner.invoke(app, ["audit", "scores", str(strong_csv), "--claimed-epsilon", "1", "--design", "multi-run"])
    assert res.exit_code == 0, res.output
    assert "epsilon lower bound:" in res.output and "verdict: violation" in res.output
    assert "max certifiable epsilon" in res.output and "warning" not in res.output


def test_scores_default_design_reads_as_an_estimate(strong_csv):
    res = runner.invoke(app, ["audit", "scores", str(strong_csv), "--claimed-epsilon", "1"])
    assert res.exit_code == 0, res.output
    assert "ESTIMATE" in res.output and "verdict: estimate-exceeds-claim" in res.output
    assert "estimate exceeds the claim; not a formal violation (exit 0 unless --fail-on-estimate)" in res.output


def test_scores_json_output_and_keys(strong_csv):
    res = runner.invoke(app, ["audit", "scores", str(strong_csv), "--json", "--method", "gdp", "--delta", "1e-4"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert KEYS <= set(d)
    assert d["method"] == "gdp" and d["formal"] is False and d["delta"] == 1e-4 and d["verdict"] is None


def test_global_json_flag_works_too(strong_csv):
    res = runner.invoke(app, ["--json", "audit", "scores", str(strong_csv), "--threshold-selection", "bonferroni"])
    assert res.exit_code == 0 and json.loads(res.stdout)["threshold_selection"] == "bonferroni"


def test_fail_on_violation_exits_1_on_a_formal_violation(strong_csv):
    args = ["audit", "scores", str(strong_csv), "--design", "multi-run", "--fail-on-violation"]
    res = runner.invoke(app, [*args, "--claimed-epsilon", "1"])
    assert res.exit_code == 1 and "verdict: violation" in res.output
    # A claim this design cannot refute: the gate fails (exit 2, one error line after the result), never passes.
    weak = runner.invoke(app, [*args, "--claimed-epsilon", "9"])
    assert weak.exit_code == 2 and "inconclusive" in weak.output and "too small" in weak.output
    assert weak.output.strip().splitlines()[-1].startswith("error: --fail-on-violation: verdict inconclusive")
    assert runner.invoke(app, [*args[:-1], "--claimed-epsilon", "9"]).exit_code == 0  # no gate asked for


def test_scores_without_design_is_never_formal_and_never_exits_1(strong_csv):
    # Means 3 sd apart, claim 0.1: the bound is far above the claim, but the default design
    # ("membership") cannot know how member bits were assigned, so it is an estimate: never exit 1, and under
    # --fail-on-violation alone exit 2 (a gate on estimates only could never fail, so it does not pass).
    args = ["audit", "scores", str(strong_csv), "--claimed-epsilon", "0.1", "--fail-on-violation"]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 2, res.output
    d = json.loads(res.stdout)
    assert d["formal"] is False and d["design"] == "membership" and d["verdict"] == "estimate-exceeds-claim"
    assert d["epsilon_lower_bound"] > 1.0
    # The same with --design canaries and clopper-pearson: scores of one run are not independent trials.
    res = runner.invoke(app, [*args, "--design", "canaries", "--json"])
    assert res.exit_code == 2 and json.loads(res.stdout)["formal"] is False


def test_fail_on_estimate_is_opt_in(strong_csv):
    args = ["audit", "scores", str(strong_csv), "--claimed-epsilon", "1", "--fail-on-estimate"]
    assert runner.invoke(app, args).exit_code == 1
    assert runner.invoke(app, [*args, "--method", "gdp", "--design", "multi-run"]).exit_code == 1
    # A formal violation is stronger evidence than an estimate: --fail-on-estimate alone fails on it too (it exited
    # 0 there, a CI gate set to fail on estimates passing a formal violation).
    res = runner.invoke(app, [*args, "--design", "multi-run", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["verdict"] == "violation", res.output
    # Nor does an estimate below the claim.
    low = ["audit", "scores", str(strong_csv), "--claimed-epsilon", "5", "--fail-on-estimate"]
    assert runner.invoke(app, low).exit_code == 0


def test_two_sided_flag(tmp_path):
    rng = np.random.default_rng(3)
    n = 1000
    path = _write_csv(tmp_path / "reversed.csv", [1] * n + [0] * n, np.r_[rng.normal(-2, 1, n), rng.normal(0, 1, n)])
    one = json.loads(runner.invoke(app, ["audit", "scores", str(path), "--json"]).stdout)
    two = json.loads(runner.invoke(app, ["audit", "scores", str(path), "--two-sided", "--json"]).stdout)
    assert one["epsilon_lower_bound"] == 0.0  # lower = member: the default direction sees nothing
    assert two["epsilon_lower_bound"] > 1.0 and two["details"]["direction"] == "less"
    assert two["details"]["alternative"] == "two-sided"


def test_plan_command(tmp_path):
    from dpaudit.audit import max_certifiable_epsilon, trials_needed

    # 20 simulations (>= 17 show power 0.8 at 95%, tests/audit/test_plan.py): the checks are on sizes and keys.
    res = runner.invoke(app, ["audit", "plan", "--epsilon", "4", "--json", "--simulations", "20"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    n = d["perfect_attack_runs_per_side"]
    assert n == trials_needed(4.0) and d["unit"] == "runs per side" and d["runs_per_side"] >= n
    assert d["leak"]["family"] == "randomized-response" and d["leak"]["epsilon"] == 8.0  # default: 2x the claim
    assert max_certifiable_epsilon(n - 1, n - 1) <= 4.0 < max_certifiable_epsilon(n, n) == d["max_certifiable_epsilon"]
    args = ["audit", "plan", "--epsilon", "2", "--method", "one-run", "--two-sided", "--true-epsilon", "6"]
    human = runner.invoke(app, [*args, "--simulations", "20"])
    assert human.exit_code == 0 and "canaries needed to refute epsilon = 2 with power 0.8" in human.output
    assert "perfect attack" in human.output
    fdp = json.loads(runner.invoke(app, ["audit", "plan", "--epsilon", "2", "--method", "one-run-fdp", "--json",
                                         "--true-epsilon", "6", "--simulations", "20"]).stdout)  # fmt: skip
    assert "canaries" in fdp and fdp["tradeoff"] == "epsilon-delta" and "runs_per_side" not in fdp
    # Unreachable: one line, exit 2.
    bad = runner.invoke(app, ["audit", "plan", "--epsilon", "20", "--method", "one-run"])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "out of reach" in bad.output


def test_plan_max_size_caps_the_search_and_names_the_simulated_power_there():
    """`audit plan --true-epsilon 2.01` against a claim of 2 simulated up to the built-in cap of 10^6 runs per side
    (minutes). --max-size N searches only up to N. Against 2.3 (1,456 runs per side by default) a cap of 1,000 is
    refused in one line naming the simulation at the cap (49 of the first 78 of 200 draws refuted: at most 171, 172
    needed for power 0.8 at 95%; the full 200 draws refute in 136).
    Planted: the option not passed on (the plan answers 1,456, exit 0); the cap not validated (1 is met by the
    Neyman-Pearson refusal, not by the smallest design's); a perfect-attack size above the cap simulated anyway (gdp
    has no Neyman-Pearson refusal: the plan answered 33, above the cap of 20)."""
    base = ["audit", "plan", "--epsilon", "2", "--true-epsilon", "2.3"]
    capped = runner.invoke(app, [*base, "--max-size", "1000"])
    assert capped.exit_code == 2, capped.output
    assert len(capped.output.strip().splitlines()) == 1
    assert "no design up to 1000 runs per side is shown to reach power 0.8" in capped.output
    assert (
        "at 1000 runs per side the simulated audit refuted the claim in 49 of the first 78 of 200 draws, so in at "
        "most 171, 172 needed (the rest were not simulated); allow larger designs (--max-size)"
    ) in capped.output
    for n, smallest, method in (("1", 2, "clopper-pearson"), ("0", 2, "clopper-pearson"), ("3", 4, "one-run")):
        bad = runner.invoke(app, [*base, "--method", method, "--max-size", n])
        assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1, bad.output
        assert f"error: expected --max-size >= {smallest}, got {n} (the smallest design {method}" in bad.output
    perfect = runner.invoke(app, ["audit", "plan", "--epsilon", "8", "--method", "gdp", "--max-size", "20"])
    assert perfect.exit_code == 2 and len(perfect.output.strip().splitlines()) == 1, perfect.output
    assert "no design up to 20 runs per side can refute epsilon = 8: even a perfect attack needs 33" in perfect.output


def test_gdp_prints_an_estimate_warning(strong_csv):
    res = runner.invoke(app, ["audit", "scores", str(strong_csv), "--method", "gdp"])
    assert res.exit_code == 0 and "warning: this is an estimate" in res.output


def test_npz_input_and_one_run(tmp_path):
    rng = np.random.default_rng(1)
    member = rng.random(1000) < 0.5
    path = tmp_path / "canaries.npz"
    np.savez(path, member=member, score=rng.normal(size=1000) + 4 * member)
    res = runner.invoke(app, ["audit", "scores", str(path), "--method", "one-run", "--design", "canaries", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["method"] == "one-run" and d["epsilon_lower_bound"] > 1 and d["counts"]["guesses"] > 0
    assert d["formal"] is True and d["design"] == "canaries"
    # one-run without --design canaries is refused in one line.
    res = runner.invoke(app, ["audit", "scores", str(path), "--method", "one-run"])
    assert res.exit_code == 2 and "needs design='canaries'" in res.output


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.csv", None, "no such file"),
        ("nocol.csv", "member,value\n1,0.3\n0,0.1\n", "missing column(s) score"),
        ("text.csv", "member,score\n1,0.3\n0,abc\n1,0.2\n0,0.1\n", "non-numeric score 'abc' in row 2"),
        (
            "nan.csv",
            "member,score\n1,0.3\n0,\n1,0.2\n0,0.1\n",
            "nan.csv: score must be finite; 1 NaN/inf value(s), the first in row 2",
        ),
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


@pytest.mark.parametrize(
    ("name", "arrays", "message"),
    [
        ("short.npz", {"member": [0, 1, 1], "score": [0.1, 0.2]}, "member and score differ in length (3 vs 2)"),
        ("two.npz", {"member": [1, 0, 2, 0], "score": [0.1, 0.2, 0.3, 0.4]}, "member must be 0/1 (or true/false); "
         "found 2 in row 3"),
        ("ones.npz", {"member": [1, 1, 1], "score": [0.1, 0.2, 0.3]}, "member has a single class (3 members, 0 non-"),
        ("zeros.npz", {"member": [0, 0, 0], "score": [0.1, 0.2, 0.3]}, "member has a single class (0 members, 3 non-"),
    ],
)  # fmt: skip
def test_a_bad_score_file_is_named_with_its_row(tmp_path, name, arrays, message):
    # The file's own check names the file and the row (1-based); audit_scores' checks of the arrays say "0/1" and
    # "single class" too, without either. Planted: any of the file's checks removed -> fails.
    path = tmp_path / name
    np.savez(path, **{k: np.array(v) for k, v in arrays.items()})
    res = runner.invoke(app, ["audit", "scores", str(path)])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {path}: {message}"), res.output


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
        (["--design", "guess"], "unknown --design 'guess'; valid: membership, canaries, multi-run"),
    ],
)
def test_bad_options_exit_2(strong_csv, args, message):
    res = runner.invoke(app, ["audit", "scores", str(strong_csv), *args])
    # The CLI may write a parameter's name as its option (threshold_selection -> --threshold-selection).
    assert res.exit_code == 2 and (message in res.output or message.replace("_", "-") in res.output), res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output


def test_selftest_json_small(monkeypatch):
    # A small run (the full self-test is in test_selftest.py); accounting is stubbed to stay fast.
    from dpaudit.audit import selftest

    monkeypatch.setattr(selftest, "poisson_dpsgd_epsilon", lambda q, s, t, d: 2.0)
    res = runner.invoke(app, ["audit", "selftest", "--seeds", "3", "--trials", "300", "--json"])
    assert res.exit_code in (0, 1), res.output
    d = json.loads(res.stdout)
    assert {"rows", "mutation_score", "false_alarm_rate", "bugs_planted", "runtime_s"} <= set(d)
    assert d["bugs_planted"] == 5 and len(d["rows"]) == 8


def test_selftest_bad_option():
    res = runner.invoke(app, ["audit", "selftest", "--seeds", "0"])
    assert res.exit_code == 2 and "seeds" in res.output


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--seeds", "9223372036854775808", "would take about"),  # scipy's binomial quantile ran for ever, in C
        ("--seeds", "1000000000000", "would take about"),  # started, "about 13874612291 s left"
        ("--trials", "100000000000", "of memory"),  # an internal MemoryError (exit 3) once allocated
    ],
)
def test_selftest_too_large_is_refused_before_it_starts(option, value, expected):
    # Found by benchmarks/cli_fuzz.py: a self-test sized by --seeds/--trials had no cost check (dpaudit.budget).
    res = runner.invoke(app, ["--quiet", "audit", "selftest", option, value])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: self-test: "), res.output
    assert expected in lines[0], res.output


def test_selftest_beyond_any_machine_is_refused_even_with_yes(monkeypatch):
    # Left by the fuzzing pass: with --yes, 2^63 - 1 seeds passed the cost check and hung in scipy's binomial
    # quantile (in C, for ever). 4.9e10 years is beyond budget.BEYOND_SECONDS: refused before anything starts.
    from dpaudit import budget
    from dpaudit.audit import selftest

    monkeypatch.setenv(budget.YES_ENV, "0")  # restored at the end: the CLI's --yes sets it for the process
    monkeypatch.setattr(selftest, "false_alarm_allowance", lambda *a: pytest.fail("started past the cost check"))
    res = runner.invoke(app, ["--quiet", "--yes", "audit", "selftest", "--seeds", str(2**63 - 1)])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: self-test: 7.379e+19 audits would take about 4.91e+10 years"), res.output
    assert "beyond any machine, so refused even with --yes" in lines[0], res.output


def test_selftest_allowance_beyond_exact_seeds_is_an_upper_bound_at_once(monkeypatch):
    # scipy's binom.ppf returns nan from 2^52 seeds (int(nan): an internal ValueError, exit 3, at --yes --seeds
    # 2^56 --trials 1 before the per-audit cost) and does not return at 2^60; above EXACT_SEEDS the allowance is
    # Bernstein's bound: never below the exact quantile (else a correct auditor fails more often than 0.1%).
    from scipy import stats

    from dpaudit.audit import selftest

    for seeds, confidence in ((2**56, 0.95), (2**53, 0.05), (2**63 - 1, 0.95), (2**63 - 1, 1e-10)):
        allowed = selftest.false_alarm_allowance(seeds, confidence)
        assert (1 - confidence) * seeds < allowed < seeds, (seeds, confidence, allowed)
    monkeypatch.setattr(selftest, "EXACT_SEEDS", 0)  # the bound where the exact quantile is known
    for seeds in (1, 7, 50, 10**3, 10**6, 10**9, 2**40):
        for confidence in (1e-9, 0.05, 0.5, 0.95, 0.999, 1 - 1e-9):
            exact = int(stats.binom.ppf(selftest.ALLOWANCE_QUANTILE, seeds, 1 - confidence))
            allowed = selftest.false_alarm_allowance(seeds, confidence)
            assert exact <= allowed <= seeds, (seeds, confidence, exact, allowed)
            assert (allowed >= seeds) == (exact >= seeds), (seeds, confidence)  # exact where seeds_needed reads


@pytest.mark.parametrize(
    ("confidence", "expected"),
    [
        ("5e-324", "error: expected --confidence >= 1.1e-16 (1 - confidence below 1 in floating point), got"),
        ("1e-10", "error: expected --seeds >= 69077547071 at confidence 1e-10, got 3:"),
    ],
)
def test_selftest_at_a_tiny_confidence_is_refused_at_once(confidence, expected):
    # Found by benchmarks/cli_fuzz.py: seeds_needed counted up from 1 seed: for ever at 5e-324 (1 - confidence
    # rounds to 1), 6.9e10 steps at 1e-10; now from its closed form (an exact start, checked on the allowance).
    from dpaudit.audit.selftest import false_alarm_allowance, seeds_needed

    res = runner.invoke(
        app, ["--quiet", "audit", "selftest", "--seeds", "3", "--trials", "20", "--confidence", confidence]
    )
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith(expected), res.output
    for c in (0.1, 0.5, 0.9, 0.95, 0.99, 0.999):  # the fewest: the allowance is below it, not below one fewer
        s = seeds_needed(c)
        assert false_alarm_allowance(s, c) < s and (s == 1 or false_alarm_allowance(s - 1, c) >= s - 1), c


@pytest.mark.parametrize("simulations", ["9223372036854775808", "1000000000000"])
def test_plan_with_too_many_simulations_is_refused_before_it_starts(simulations):
    # Found by benchmarks/cli_fuzz.py: 2^63 was an internal IndexError (exit 3), 1e12 an internal MemoryError.
    res = runner.invoke(
        app, ["--quiet", "audit", "plan", "--epsilon", "1", "--true-epsilon", "3", "--simulations", simulations]
    )
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: audit plan: ") and "simulated audits would take about" in lines[0], res.output


def _option_help(path, name):
    import typer.main

    command = typer.main.get_command(app)
    for part in path:
        command = command.commands[part]
    return next(p.help for p in command.params if p.name == name)


def test_method_help_says_what_the_library_decides_on_the_default_design(strong_csv):
    # The help of --method must not call clopper-pearson formal outright: on the default design
    # (membership) the library labels its bound an estimate, and only on multi-run formal.
    from dpaudit.audit.result import DESIGNS, METHODS, is_formal

    text = _option_help(["audit", "scores"], "method")
    for method in METHODS:  # every method's phrase says what is_formal decides
        said = text.split(f"{method} (", 1)[1].split(")", 1)[0]
        formal = [d for d in DESIGNS if is_formal(method, d)]
        want = f"formal only on design {' or '.join(formal)}, an estimate" if formal else "an estimate on every design"
        assert want in said, (method, said)
    cp = text.split("clopper-pearson (", 1)[1].split(")", 1)[0]
    default = json.loads(runner.invoke(app, ["audit", "scores", str(strong_csv), "--json"]).stdout)
    assert default["method"] == "clopper-pearson" and default["formal"] is False
    assert f"default --design {default['design']} every method gives an estimate" in text
    assert "estimate on every other design" in cp and default["design"] not in cp
    multi = runner.invoke(app, ["audit", "scores", str(strong_csv), "--design", "multi-run", "--json"])
    assert json.loads(multi.stdout)["formal"] is True and "formal only on design multi-run" in cp
    for design in ("canaries", "membership"):  # formal on no other design
        res = runner.invoke(app, ["audit", "scores", str(strong_csv), "--design", design, "--json"])
        assert json.loads(res.stdout)["formal"] is False
    assert "(formal)" not in text and "; formal)" not in _option_help(["audit", "scores"], "tradeoff")


def test_the_membership_estimate_note_names_commands_that_exist():
    """The note on every one-model membership audit (`audit checkpoint`, `report`, `attack mia` scores) told a CLI
    user to "use design='multi-run'", Python spelling that no command there takes. It now names the commands that
    give a formal bound; each command and option it names exists."""
    import re

    import typer.main

    from dpaudit.audit.bounds import _DESIGN_NOTES
    from dpaudit.cli.main import app

    note = _DESIGN_NOTES["membership"]
    snippets = re.findall(r"`([^`]+)`", note)
    assert "dpaudit audit train" in snippets and "design='multi-run'" not in note.split(";")[-1]
    root = typer.main.get_command(app)
    for snippet in snippets:
        words = snippet.removeprefix("dpaudit ").split()
        cmd = root
        while words and not words[0].startswith("-"):
            cmd = cmd.commands[words.pop(0)]
        opts = {o for p in cmd.params for o in p.opts}
        assert not words or words[0] in opts, (snippet, words)


def test_plan_tests_plans_each_test_at_the_checkpoint_audits_bonferroni_level():
    # `audit plan` planned at the full alpha, while `audit checkpoint` tests a DP-SGD run's canaries twice (the
    # one-run (eps, delta) and f-DP analyses) at alpha/2 each: a planned count could then be refused by
    # `train --canaries`. --tests 2 plans at the level canary_confidence gives that audit.
    from dpaudit.audit import max_certifiable_epsilon, trials_needed
    from dpaudit.workflows.checkpoint import canary_confidence

    level = canary_confidence(0.95, curve="dpsgd", canary_sets=1)
    args = ["audit", "plan", "--epsilon", "2", "--method", "one-run", "--true-epsilon", "6", "--simulations", "20"]
    one, two = (json.loads(runner.invoke(app, [*args, "--json", "--tests", t]).stdout) for t in ("1", "2"))
    n1, n2 = one["perfect_attack_canaries"], two["perfect_attack_canaries"]
    assert two["tests"] == 2 and two["test_confidence"] == level == 0.975 and two["confidence"] == 0.95
    assert n1 == trials_needed(2.0, method="one-run") < n2 == trials_needed(2.0, method="one-run", confidence=level)
    assert max_certifiable_epsilon(n2 - n2 // 2, n2 // 2, method="one-run", confidence=level) > 2.0
    assert two["canaries"] >= n2 and one["tests"] == 1 and one["test_confidence"] == 0.95
    human = runner.invoke(app, [*args, "--tests", "2"])
    assert "each of 2 tests at 0.975 (Bonferroni)" in human.output and "97.5% Clopper-Pearson" in human.output
    bad = runner.invoke(app, [*args, "--tests", "0"])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "--tests" in bad.output
