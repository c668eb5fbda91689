"""``dpaudit account``: exit codes, JSON keys, human output."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from dpaudit.accounting import analytic_gaussian_epsilon, dpsgd_event, epsilon_for
from dpaudit.cli.main import app

runner = CliRunner()
BASE = ["account", "dpsgd", "--noise-multiplier", "1.1", "--delta", "1e-5"]


def run(*args):
    return runner.invoke(app, list(args))


def test_dpsgd_json_rdp():
    r = run(*BASE, "--sample-rate", "0.01", "--steps", "1000", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert set(data) >= {"epsilon", "delta", "accountant", "noise_multiplier", "sample_rate", "steps"}
    event = dpsgd_event(noise_multiplier=1.1, sample_rate=0.01, steps=1000)
    assert data["epsilon"] == pytest.approx(epsilon_for(event, 1e-5))
    assert data["accountant"] == "rdp" and data["steps"] == 1000


def test_dpsgd_all_and_epochs():
    r = run(*BASE, "--epochs", "60", "--dataset-size", "60000", "--batch-size", "256", "--accountant", "all", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["steps"] == 14063 and data["sample_rate"] == pytest.approx(256 / 60000)
    for name in ("rdp", "pld", "gdp"):
        assert isinstance(data[name]["epsilon"], float)
    assert data["gdp"]["approximate"] is True
    assert data["epsilon"] == pytest.approx(min(data["rdp"]["epsilon"], data["pld"]["epsilon"]))
    assert data["pld"]["epsilon"] < data["rdp"]["epsilon"]


def test_epochs_never_drop_a_step():
    # 3 epochs of N=1000, B=300: 10 steps (ceil(3000/300) = 10 exactly); 0.1 epoch of N=10, B=1: 1 step.
    r = run(*BASE, "--epochs", "3", "--dataset-size", "1000", "--batch-size", "300", "--json")
    assert json.loads(r.stdout)["steps"] == 10
    r = run(*BASE, "--epochs", "0.1", "--dataset-size", "10", "--batch-size", "1", "--json")
    assert json.loads(r.stdout)["steps"] >= 1


@pytest.mark.parametrize(
    ("epochs", "n", "b", "steps"),
    [
        (1.1, 100, 10, 11),  # Fraction(1.1) = 1.1000000000000000888…: ceil gave 12
        (0.1, 1000, 100, 1),  # Fraction(0.1) > 0.1: ceil gave 2
        (2.2, 60000, 600, 220),
        (2.5, 1000, 300, 9),  # 8.33… steps: the partial one counts
        (1.0000001, 100, 10, 11),  # a hair over one epoch is one more step
        (0.3, 1000, 100, 3),
    ],
)
def test_epochs_are_the_decimal_the_user_typed(epochs, n, b, steps):
    from dpaudit.cli.account import _resolve_schedule

    assert _resolve_schedule(None, None, epochs, n, b) == (b / n, steps)


@pytest.mark.parametrize("accountant", ["rdp", "all"])
def test_dpsgd_text_names_the_mechanism_as_given(accountant):
    # sigma 1.0000004 printed as "1" stated its (smaller) epsilon for sigma = 1; q = 0.0012345649 as 0.00123456.
    r = run(
        "account", "dpsgd", "--noise-multiplier", "1.0000004", "--delta", "1e-5", "--sample-rate", "0.0012345649",
        "--steps", "10", "--accountant", accountant,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "noise_multiplier = 1.0000004," in r.stdout and "sample_rate = 0.0012345649," in r.stdout


@pytest.mark.parametrize("command", [["dpsgd", "--noise-multiplier", "1"], ["calibrate", "--epsilon", "8"]])
def test_a_delta_of_at_least_one_over_n_is_warned(command):
    epochs = ["--epochs", "1", "--batch-size", "100", "--json"]  # q = 1, T = 1: a fast calibration
    r = run("account", *command, "--delta", "0.01", "--dataset-size", "100", *epochs)
    assert r.exit_code == 0, r.output
    assert "warning: delta = 0.01 >= 1/N = 1/100" in r.stderr and json.loads(r.stdout)["steps"] == 1
    r = run("account", *command, "--delta", "0.0099", "--dataset-size", "100", *epochs)
    assert r.exit_code == 0 and "warning" not in r.stderr


def test_dpsgd_human_output():
    r = run(*BASE, "--sample-rate", "0.01", "--steps", "100", "--accountant", "all")
    assert r.exit_code == 0, r.output
    assert "rdp" in r.stdout and "pld" in r.stdout and "approximate" in r.stdout


def test_zero_noise_reports_inf():
    r = run(
        "account",
        "dpsgd",
        "--noise-multiplier",
        "0",
        "--delta",
        "1e-5",
        "--sample-rate",
        "0.1",
        "--steps",
        "3",
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["epsilon"] == "inf"
    r = run("account", "dpsgd", "--noise-multiplier", "0", "--delta", "1e-5", "--sample-rate", "0.1", "--steps", "3")
    assert r.exit_code == 0 and "epsilon = ∞" in r.stdout


def test_jl_with_pld_and_all():
    r = run(*BASE, "--sample-rate", "0.01", "--steps", "20", "--jl-projections", "200", "--accountant", "all", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["rdp"]["epsilon"] is None and "pld" in data["rdp"]["error"]
    assert 0 < data["pld"]["epsilon"] < math.inf
    assert data["epsilon"] == data["pld"]["epsilon"]


@pytest.mark.parametrize(
    "args",
    [
        ["account", "dpsgd", "--noise-multiplier", "-1", "--delta", "1e-5", "--sample-rate", "0.1", "--steps", "3"],
        [*BASE, "--sample-rate", "1.5", "--steps", "3"],
        [*BASE, "--sample-rate", "0", "--steps", "3"],
        ["account", "dpsgd", "--noise-multiplier", "1", "--delta", "1", "--sample-rate", "0.1", "--steps", "3"],
        ["account", "dpsgd", "--noise-multiplier", "1", "--delta", "0", "--sample-rate", "0.1", "--steps", "3"],
        [*BASE, "--sample-rate", "0.1", "--steps", "0"],
        [*BASE, "--sample-rate", "0.1", "--steps", "3", "--jl-projections", "0"],
        [*BASE, "--sample-rate", "0.1", "--steps", "3", "--accountant", "moments"],
        [*BASE, "--sample-rate", "0.1"],
        [*BASE, "--sample-rate", "0.1", "--steps", "3", "--epochs", "2"],
        [*BASE, "--sample-rate", "0.1", "--steps", "3", "--jl-projections", "5"],  # rdp cannot do JL
        ["account", "calibrate", "--epsilon", "1e-9", "--delta", "1e-5", "--sample-rate", "1", "--steps", "100000000"],
        ["account", "calibrate", "--epsilon", "0", "--delta", "1e-5", "--sample-rate", "0.1", "--steps", "3"],
    ],
)
def test_bad_input_exits_2_with_one_line(args):
    r = run(*args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()] if r.stderr else []
    assert len(lines) <= 1 or "Usage" in r.output


def test_calibrate_a_too_large_target_names_epsilon():
    r = run("account", "calibrate", "--epsilon", "1e300", "--delta", "1e-5", "--sample-rate", "0.01", "--steps", "100")
    assert r.exit_code == 2
    assert r.stderr.startswith("error: the target epsilon 1e+300 is too large to calibrate")
    assert "expected --epsilon < " in r.stderr
    assert "noise_multiplier" not in r.stderr and "--noise-multiplier" not in r.stderr


def test_calibrate_json():
    r = run(
        "account",
        "calibrate",
        "--epsilon",
        "2",
        "--delta",
        "1e-5",
        "--sample-rate",
        "0.01",
        "--steps",
        "1000",
        "--json",
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["epsilon"] <= 2.0
    event = dpsgd_event(noise_multiplier=data["noise_multiplier"], sample_rate=0.01, steps=1000)
    assert epsilon_for(event, 1e-5) <= 2.0
    r = run("account", "calibrate", "--epsilon", "2", "--delta", "1e-5", "--sample-rate", "0.01", "--steps", "1000")
    assert r.exit_code == 0 and "noise_multiplier" in r.stdout


def test_gdp_without_subsampling_is_formal_and_counts_for_the_best():
    """At q = 1 DP-SGD is a plain Gaussian, exactly (√T/σ)-GDP (Dong, Roth & Su 2022, Cor. 3.3): no CLT,
    so neither the label "approximate" nor its exclusion from the best formal epsilon may apply."""
    r = run(*BASE, "--sample-rate", "1", "--steps", "100", "--accountant", "all", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert "approximate" not in data["gdp"]
    # GDP is exact for the Gaussian, so it is the tightest of the three here.
    assert data["gdp"]["epsilon"] <= data["pld"]["epsilon"] < data["rdp"]["epsilon"]
    assert data["epsilon"] == data["gdp"]["epsilon"]
    r = run(*BASE, "--sample-rate", "1", "--steps", "100", "--accountant", "all")
    assert "approximate" not in r.stdout
    r = run(*BASE, "--sample-rate", "1", "--steps", "100", "--accountant", "gdp", "--json")
    assert "approximate" not in json.loads(r.stdout)
    # Subsampled: the CLT estimate is labelled and never taken as the best formal epsilon, even when smallest.
    r = run(*BASE, "--sample-rate", "0.01", "--steps", "100", "--accountant", "all", "--json")
    data = json.loads(r.stdout)
    assert data["gdp"]["approximate"] is True and data["gdp"]["epsilon"] < data["pld"]["epsilon"]
    assert data["epsilon"] == data["pld"]["epsilon"]
    r = run(*BASE, "--sample-rate", "0.01", "--steps", "100", "--accountant", "gdp", "--json")
    assert json.loads(r.stdout)["approximate"] is True
    for command in ("dpsgd", "calibrate"):  # the help said "gdp (approximate)" for q = 1 too
        assert "exact at sample rate 1" in " ".join(run("account", command, "--help").stdout.replace("│", " ").split())


def test_compare_accountants_records_refusals_and_takes_the_formal_minimum():
    from dpaudit.accounting import compare_accountants

    results, best = compare_accountants(
        dpsgd_event(noise_multiplier=1, sample_rate=0.01, steps=20, jl_projections=50), 1e-5
    )
    assert results["rdp"].epsilon is None and results["rdp"].unsupported
    assert results["gdp"].epsilon is None and "DP-SGD-JL" in results["gdp"].unsupported
    assert best == results["pld"].epsilon and results["pld"].formal
    results, best = compare_accountants(dpsgd_event(noise_multiplier=1, sample_rate=1, steps=5), 1e-5, ("rdp", "gdp"))
    assert set(results) == {"rdp", "gdp"} and best == results["gdp"].epsilon < results["rdp"].epsilon


def test_all_keeps_the_other_accountants_when_pld_is_too_large_for_memory(monkeypatch):
    # sigma 0.3, q = 1, T = 1e6 needed ~25 GiB of PLD grid: the PLD's refusal ended `--accountant all` with exit 2,
    # losing RDP's bound and GDP's exact one. Here 256 MiB of memory refuses the PLD of 10^6 steps the same way.
    from dpaudit import budget

    monkeypatch.setattr(budget, "available_memory", lambda: 256 * 2**20)
    args = ["account", "dpsgd", "--noise-multiplier", "0.3", "--delta", "1e-5", "--sample-rate", "1"]
    r = run(*args, "--steps", "1000000", "--accountant", "all", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["pld"]["epsilon"] is None and "memory" in data["pld"]["error"]
    exact = analytic_gaussian_epsilon(0.3, 1e-5, sensitivity=1000.0)  # q = 1: one Gaussian of mu = sqrt(T)/sigma
    assert data["gdp"]["epsilon"] == pytest.approx(exact, rel=1e-9) and "approximate" not in data["gdp"]
    assert data["epsilon"] == min(data["rdp"]["epsilon"], data["gdp"]["epsilon"])
    r = run(*args, "--steps", "1000000", "--accountant", "all")
    assert r.exit_code == 0 and "pld  epsilon = not computed  (PLD accounting of 1000000 compositions" in r.stdout
    r = run(*args, "--steps", "1000000", "--accountant", "pld")  # asked alone, the refusal is the answer
    assert r.exit_code == 2 and "memory" in r.output
