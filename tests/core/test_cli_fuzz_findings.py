"""Refusals found by the generative CLI fuzzer (benchmarks/cli_fuzz.py): each case below exited 0 with the option
silently ignored or misread, or broke the one-line contract, before its fix."""

from __future__ import annotations

import pytest

from tests.core.cli_errors import one_line_error

TINY = "synthetic:n=60,d=3,classes=2"


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--out", "{out}", "--model", "logreg", "--epochs", "1"],
        ["train", "--out", "{out}", "--algo", "pate", "--teachers", "2"],  # PATE loads the data itself
        ["canaries", "make", "--count", "4", "--out", "{out}"],
        ["audit", "train", "--runs", "4", "--noise-multiplier", "1", "--allow-inconclusive"],
    ],
)
@pytest.mark.parametrize("data", [TINY, "wine"])
def test_a_label_column_for_data_that_is_no_csv_is_refused(tmp_path, command, data):
    # Before: exit 0, the data's own labels used and --label-column y ignored without a word.
    args = [a.replace("{out}", str(tmp_path / "out")) for a in command]
    line = one_line_error(*args, "--data", data, "--label-column", "y")
    expected = f"error: --label-column 'y' applies to a CSV file only, not to the data '{data}' (which holds its labels"
    assert line == expected + " already)", line
    assert not (tmp_path / "out").exists()


def test_check_data_spec_takes_a_label_column_for_a_csv_file_only(tmp_path):
    # The refusal above, by path: a .csv file (any case) takes one; an .npz file, and a folder (X.npy, y.npy) even
    # if named like a CSV, do not. Planted: the suffix or the folder test dropped, the suffix test negated, every
    # label column refused -> fails.
    import numpy as np

    from dpaudit.data import check_data_spec
    from dpaudit.errors import InputError

    csv = tmp_path / "d.CSV"
    csv.write_text("a,y\n1,0\n2,1\n")
    assert check_data_spec(csv, label_column="y") == str(csv)
    npz, folder = tmp_path / "d.npz", tmp_path / "f.csv"
    np.savez(npz, X=np.zeros((2, 1), np.float32), y=np.array([0, 1]))
    folder.mkdir()
    np.save(folder / "X.npy", np.zeros((2, 1), np.float32))
    np.save(folder / "y.npy", np.array([0, 1]))
    for spec in (npz, folder):
        assert check_data_spec(spec) == str(spec)
        with pytest.raises(InputError, match=r"^label_column 'y' applies to a CSV file only"):
            check_data_spec(spec, label_column="y")


def test_import_refuses_a_label_column_for_data_that_is_no_csv(tmp_path):
    from dpaudit.cli.main import app  # noqa: F401  (the CLI is what is tested; nothing trains)

    members = tmp_path / "members.txt"
    members.write_text("".join(f"{i}\n" for i in range(20)))
    spec = tmp_path / "spec.json"
    spec.write_text('{"kind": "logreg", "input_shape": [3], "n_classes": 2}')
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")  # never read: the data's options are refused first
    line = one_line_error(
        "import", weights, "--model-spec", spec, "--out", tmp_path / "out", "--data", TINY, "--members", members,
        "--label-column", "y",
    )  # fmt: skip
    assert line.startswith(f"error: --label-column 'y' applies to a CSV file only, not to the data '{TINY}'"), line
    assert not (tmp_path / "out").exists()


def test_an_empty_model_name_is_refused_not_read_as_the_default(tmp_path):
    # Before: `--model ''` trained the default mlp (`model or "mlp"`), exit 0.
    line = one_line_error("train", "--out", tmp_path / "out", "--data", TINY, "--model", "", "--epochs", "1")
    assert line.startswith("error: unknown --model ''; valid: logreg, mlp"), line
    assert not (tmp_path / "out").exists()


def test_allow_inconclusive_without_canaries_is_refused(tmp_path):
    # Before: exit 0, the flag ignored (it lifts the refusal of a canary set too small to refute the claim).
    line = one_line_error("train", "--out", tmp_path / "out", "--data", TINY, "--epochs", "1", "--allow-inconclusive")
    assert line == "error: --allow-inconclusive applies only with --canaries or --whitebox-canaries", line
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from tests.core.cli_errors import invoke

    run = tmp_path_factory.mktemp("fuzz") / "run"
    data = "synthetic:n=200,d=5,classes=2,sep=4"  # a model that learns: no "learned next to nothing" warning
    r = invoke("--quiet", "train", "--out", run, "--data", data, "--model", "logreg", "--epochs", "5")
    assert r.exit_code == 0, r.output
    return run


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # Since the unread options are refused as such (attacks.mia.check_options_read), whatever their value.
        (
            ["audit", "checkpoint", "{run}", "--reference-models", "-1"],
            "error: --reference-models does not apply to --attacks loss (it is read by lira, rmia only)",
        ),
        (
            ["attack", "mia", "{run}", "--reference-models", "0"],
            "error: --reference-models does not apply to --attacks ",
        ),
        (["attack", "mia", "{run}", "--shadow-models", "0"], "error: --shadow-models does not apply to --attacks loss"),
        (["attack", "mia", "{run}", "--min-models", "0"], "error: --min-models does not apply to --attacks loss"),
        (["attack", "mia", "{run}", "--offline"], "error: --online/--offline does not apply to --attacks loss (it is"),
        (["attack", "mia", "{run}", "--workers", "2"], "error: --workers does not apply to --attacks loss (it is"),
        (["audit", "checkpoint", "{run}", "--workers", "2"], "error: --workers does not apply to --attacks loss ("),
        # The report recorded "reference_models": 3 in its configuration although no attack read it.
        (["report", "{run}", "--out", "{out}", "--reference-models", "3"], "error: --reference-models does not apply"),
        # And a value no chosen attack reads is still checked where one reads the option.
        (["attack", "mia", "{run}", "--attacks", "lira", "--min-models", "0"], "error: expected --min-models >= 1"),
        (["attack", "extract", "{run}", "--budget", "20", "--surrogate", "nan"], "error: unknown --surrogate 'nan'"),
        (  # a valid surrogate with explicit equations: was exit 0, no surrogate trained
            ["attack", "extract", "{run}", "--budget", "20", "--method", "equations", "--surrogate", "logreg"],
            "error: --surrogate applies to --method learning (or auto's fallback); equations train no surrogate",
        ),
    ],
)
def test_an_invalid_count_or_name_is_refused_when_the_chosen_attack_does_not_read_it(
    tiny_run, tmp_path, args, expected
):
    # Before: exit 0 (--attacks loss reads no reference, shadow or min models; a logistic regression's extraction
    # solves equations and trains no surrogate), while `report --reference-models -1` was refused. A valid value
    # (--offline, --workers 2 with --attacks loss) was exit 0 too, silently ignored; planted: the
    # check_options_read call removed from attack_checkpoint / checkpoint_cmd -> those cases fail.
    reads_attacks = args[0] == "report" or args[1] in ("checkpoint", "mia")
    extra = ["--attacks", "loss"] if reads_attacks and "--attacks" not in args else []
    paths = {"{run}": str(tiny_run), "{out}": str(tmp_path / "report")}
    line = one_line_error(*[paths.get(a, a) for a in args], *extra)
    assert line.startswith(expected), line
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["attack", "mia", "{run}", "--attacks", "loss", "--bootstrap", str(2**63)], "error: bootstrap: 9.223e+18"),
        # resamples per attack: 2e7 for each of two is 4e7 x 1e-4 s, past the hour (2e7 alone is not)
        (
            ["attack", "mia", "{run}", "--attacks", "loss,confidence", "--bootstrap", "20000000"],
            "error: bootstrap: 4e+07 resamples would take about 1.11 hours",
        ),
        (
            ["attack", "inversion", "{run}", "--classes", "0", "--iterations", "5", "--restarts", str(2**63)],
            "error: model inversion: 9.223e+18 starts would take about",
        ),
    ],
)
def test_a_count_that_would_run_for_ever_is_refused_before_it_starts(tiny_run, args, expected):
    # Before: no cost check (dpaudit.budget), the command ran until killed (the fuzzer's 60 s timeout). 2^63 is
    # beyond any machine (over budget.BEYOND_SECONDS), so --yes would not start it either; 4e7 resamples (an hour)
    # ask for --yes. (The two merged as one assertion that every case is beyond any machine: the 4e7 case failed.)
    line = one_line_error(*[str(tiny_run) if a == "{run}" else a for a in args])
    beyond = str(2**63) in args
    assert line.startswith(expected), line
    assert ("beyond any machine, so refused even with --yes" in line) is beyond, line
    assert ("rerun with dpaudit --yes to start it anyway" in line) is not beyond, line


def test_a_too_small_audit_points_to_audit_plan_once():
    # Before: "... (see `dpaudit audit plan --epsilon 6.81675` for the size with power) (see `dpaudit audit plan
    # --epsilon 6.81675`); pass --allow-inconclusive ..." (size_advice names it, and the refusal added it again).
    data = "synthetic:n=200,d=5,classes=2"  # epsilon 6.8: beyond the sizes size_advice simulates
    line = one_line_error("audit", "train", "--runs", "4", "--data", data, "--epochs", "1", "--noise-multiplier", "1")
    assert line.startswith("error: this audit cannot refute epsilon") and line.count("dpaudit audit plan") == 1, line


@pytest.mark.parametrize(
    ("claimed", "size", "method", "names_plan"),
    [
        (6.81675, 4, "clopper-pearson", True),  # beyond size_advice's simulations: it points to `audit plan` itself
        (1.0, 4, "clopper-pearson", False),  # simulated: the refusal adds the pointer
        (30.0, 100, "one-run", False),  # out of reach of the method: the refusal adds it
    ],
)
def test_size_advice_says_whether_it_points_to_audit_plan(claimed, size, method, names_plan):
    # size_advice returns whether its phrase names `dpaudit audit plan` (require_refutable tested the phrase's text);
    # every refusal names it once, whichever branch of size_advice answered.
    from dpaudit.audit.plan import size_advice
    from dpaudit.errors import InputError
    from dpaudit.workflows.training import require_refutable

    advice = size_advice(claimed, method=method, delta=1e-5)
    assert advice.points_to_plan is names_plan and ("dpaudit audit plan" in advice.text) is names_plan, advice
    with pytest.raises(InputError) as refused:
        require_refutable(claimed, size, method=method, delta=1e-5)
    assert str(refused.value).count("dpaudit audit plan") == 1 and advice.text in str(refused.value), refused.value
