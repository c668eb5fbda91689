"""A second new-user pass over the CLI (after issue 29): bad values one line, exit code 2, the option the
user typed named, and refused before any work; no traceback when stdout itself fails; help text intact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpaudit.cli.main import app
from dpaudit.errors import DataError
from tests.core.cli_errors import one_line_error, runner

HUGE_SEED = str(2**64)  # beyond torch.manual_seed's range, and scikit-learn's 2**32 - 1
SCHEDULE = ["--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # infinities where only finite values mean anything (NaN was refused, inf trained or crashed)
        (["account", "dpsgd", "--noise-multiplier", "1", "--dataset-size", "1000", "--batch-size", "10",
          "--epochs", "inf", "--delta", "1e-5"], "error: expected --epochs to be finite, got inf"),
        (["account", "calibrate", "--epsilon", "inf", *SCHEDULE], "error: expected --epsilon to be finite, got inf"),
        (["train", "--model", "logreg", "--lr", "inf"], "error: expected --lr to be finite, got inf"),
        (["train", "--model", "logreg", "--weight-decay", "inf"],
         "error: expected --weight-decay in [0, inf), got inf"),
        (["train", "--algo", "pate", "--model", "logreg", "--teachers", "5", "--queries", "10", "--sigma", "inf"],
         "error: expected --sigma to be finite, got inf"),
        (["attack", "inversion", "nowhere", "--step", "inf"], "error: expected --step to be finite, got inf"),
        (["audit", "plan", "--epsilon", "2", "--mu", "inf"], "error: expected --mu in [0, inf), got inf"),
        (["audit", "plan", "--epsilon", "inf"],
         "error: expected a finite claimed epsilon to plan for, got inf (no audit refutes an infinite claim)"),
        # seeds every library they reach accepts (train crashed in torch.manual_seed, inversion in scikit-learn)
        (["train", "--model", "logreg", "--seed", HUGE_SEED],
         f"error: expected --seed to be an integer in [0, 4294967295], got {HUGE_SEED}"),
        (["attack", "inversion", "nowhere", "--seed", HUGE_SEED],
         f"error: expected --seed to be an integer in [0, 4294967295], got {HUGE_SEED}"),
        (["audit", "scores", "nowhere.csv", "--seed", "-1"],
         "error: expected --seed to be an integer in [0, 4294967295], got -1"),
        # the option the user typed, not the parameter it becomes
        (["train", "--algo", "outpert", "--data", "breast-cancer", "--model", "logreg", "--epsilon", "1", "--l2", "-1"],
         "error: expected --l2 in [0, inf), got -1.0"),
        (["train", "--algo", "dp-icl", "--data", "breast-cancer", "--model", "logreg", "--teachers", "5",
          "--queries", "10", "--epsilon", "3", "--subsample", "2"], "error: expected --subsample in (0, 1], got 2.0"),
        (["canaries", "make", "--data", "digits", "--count", "0", "--out", "never"],
         "error: expected --count >= 1, got 0"),
        (["attack", "mia", "nowhere", "--bootstrap", "-1"], "error: expected --bootstrap >= 0, got -1"),
        (["audit", "plan", "--claimed-epsilon", "-1"], "error: expected --epsilon >= 0, got -1.0"),
        (["audit", "scores", "nowhere.csv", "--method", "one-run-fdp", "--design", "canaries",
          "--tradeoff", "dpsgd:2,10"],
         "error: --tradeoff dpsgd:2,10: expected sample_rate in (0, 1], got 2.0"),
        # a command with its own typer.Context (audit train) named Python parameters
        (["audit", "train", "--epsilon", "2", "--lr", "inf"], "error: expected --lr to be finite, got inf"),
    ],
)  # fmt: skip
def test_bad_values_name_the_option_and_stop_before_work(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    out = ["--out", "never"] if args[0] == "train" else []
    assert one_line_error(*args, *out) == message
    assert not (tmp_path / "never").exists()


def test_audit_options_are_checked_before_models_are_trained(tmp_path, monkeypatch):
    """`audit checkpoint --confidence nan` trained 8 reference models, `audit train --claimed-epsilon -1` all its
    runs, before saying the value was bad."""
    import attacks.mia
    import dpaudit.workflows.training

    def trained(*a, **k):
        raise AssertionError("work started before the options were checked")

    run = tmp_path / "run"
    r = runner.invoke(app, ["--quiet", "train", "--model", "logreg", "--epochs", "1", "--out", str(run)])
    assert r.exit_code == 0, r.output
    monkeypatch.setattr(attacks.mia, "run_mia", trained)
    monkeypatch.setattr(dpaudit.workflows.training, "_train_one", trained)
    for bad, message in [
        (["--confidence", "nan"], "error: expected --confidence to be a number, got NaN"),
        (["--claimed-epsilon", "-3"], "error: expected --claimed-epsilon >= 0, got -3.0"),
        (["--delta", "2"], "error: expected --delta in [0, 1), got 2.0"),
    ]:
        assert one_line_error("audit", "checkpoint", run, "--attacks", "lira", *bad) == message
    line = one_line_error("audit", "train", "--epsilon", "2", "--claimed-epsilon", "-1", "--runs", "2",
                          "--allow-inconclusive", "--epochs", "1")  # fmt: skip
    assert line == "error: expected --claimed-epsilon >= 0, got -1.0"


def test_a_number_on_the_first_line_of_a_member_list_is_no_header(tmp_path):
    """'1.5' was skipped as a header: the member silently dropped."""
    from dpaudit.data import read_member_indices

    (tmp_path / "m.txt").write_text("1.5\n2\n")
    with pytest.raises(DataError, match=r"line 1: expected a record index \(an integer\), got '1.5'"):
        read_member_indices(tmp_path / "m.txt", 10)
    (tmp_path / "h.txt").write_text("index\n3\n2\n")
    assert read_member_indices(tmp_path / "h.txt", 10).tolist() == [2, 3]


def test_scores_file_messages(tmp_path):
    assert one_line_error("audit", "scores", tmp_path) == (
        f"error: {tmp_path}: expected a CSV or NPZ file of scores, got a directory"
    )
    (tmp_path / "s.csv").write_text("member,score\n2,0.5\n0,0.1\n")
    assert one_line_error("audit", "scores", tmp_path / "s.csv") == (  # the file and its row named
        f"error: {tmp_path / 's.csv'}: member must be 0/1 (or true/false); found 2 in row 1"
    )


def test_json_error_when_stdout_fails(monkeypatch):
    """`dpaudit --json ... > /dev/full`: the result's write fails, and so did the JSON error's (a traceback)."""
    import dpaudit.cli._common as common

    stderr = []

    def echo(message=None, *, err=False, **kwargs):
        if not err:
            raise OSError(28, "No space left on device")
        stderr.append(message)

    monkeypatch.setattr(common.typer, "echo", echo)
    r = runner.invoke(app, ["--json", "account", "dpsgd", "--noise-multiplier", "1", *SCHEDULE])
    assert r.exit_code == 2, (r.exception, stderr)
    assert stderr == ["error: No space left on device"]


def test_an_os_error_inside_a_command_is_one_line_naming_the_file(monkeypatch):
    """The environment's errors that no file helper converted (an input that cannot be read: EACCES, EIO) are
    one line with exit code 2 and the file named, not an "internal error" (no test reached this branch)."""
    import dpaudit.cli.account as account

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/data/run/checkpoint.json")

    monkeypatch.setattr(account, "_resolve_schedule", unreadable)
    line = one_line_error("account", "dpsgd", "--noise-multiplier", "1", *SCHEDULE)
    assert line == "error: Permission denied (/data/run/checkpoint.json)"


def test_a_huge_value_is_not_echoed_whole():
    line = one_line_error("account", "dpsgd", "--noise-multiplier", "1", *SCHEDULE, "--accountant", "x" * 100_000)
    assert line.startswith("error: unknown --accountant 'xxx") and len(line) < 2_100
    assert line.endswith("characters)")


def test_attack_mia_table_does_not_show_an_unresolvable_tpr():
    """The report said "n/a: needs ≥ 1000 non-members" where `attack mia` printed TPR@0.1% = 0.159% from 359."""
    from dpaudit.cli.attack import human_table

    class Result:
        def __init__(self, n_nonmembers):
            self.n = n_nonmembers

        def to_dict(self, include_roc):
            return {"attack": "loss", "auc": 0.5, "ci": {}, "balanced_accuracy": 0.5, "advantage": 0.0,
                    "tpr_at_fpr": {"0.001": 0.0159, "0.01": 0.02, "0.1": 0.1}, "n_nonmembers": self.n,
                    "n_reference_models": 0, "n_shadow_models": 0}  # fmt: skip

    small, large = (human_table([Result(n)]).splitlines()[2] for n in (359, 1000))
    assert "n/a: needs ≥ 1000 non-members" in small and "1.59%" not in small
    assert "1.59%" in large and "n/a" not in large


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_the_file_system_refuses_is_refused_before_training(tmp_path):
    """access() lets root "write" into /proc: `train --out /proc/run` trained, then failed at the rename."""
    line = one_line_error("train", "--model", "logreg", "--epochs", "1", "--out", "/proc/dpaudit-test-run")
    # root: "/proc accepts no new file (...)"; anyone else: "/proc is not writable (permission denied)"
    assert line.startswith("error: cannot write /proc/dpaudit-test-run: /proc "), line


def test_seed_range_is_one_rule():
    from dpaudit.validation import MAX_SEED, check_seed

    assert check_seed(seed=MAX_SEED) == MAX_SEED and check_seed(seed=np.int64(3)) == 3
    for bad in (-1, MAX_SEED + 1, 1.5, True):
        with pytest.raises(Exception, match="expected seed to be an integer in"):
            check_seed(seed=bad)


def _folder(path: Path, written_by: str, *files: str) -> Path:
    """A folder as dpaudit's command ``written_by`` leaves it: its files and their manifest."""
    from dpaudit.fileio import write_manifest

    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text("{}")
    write_manifest(path, written_by=written_by)
    return path


def test_a_folder_from_another_command_is_named_with_what_to_give_instead(tmp_path):
    """A newcomer gives the folder another command wrote where a run goes (the report, the demo's output, the
    cloak they just trained, the canaries they made, the parent `runs/`): the one line said only "not a dpaudit
    run directory (no checkpoint.json)", even for a cloak `dpaudit inspect` had just shown them."""
    report = _folder(tmp_path / "reports" / "r", "report", "report.json", "report.md")
    demo = _folder(tmp_path / "demo", "demo", "report.json")
    cloak = _folder(tmp_path / "cloak", "cloak", "cloak.json", "cloak.safetensors")
    sweep = _folder(tmp_path / "cloaks", "cloak", "curve.json", "curve.csv")
    made = _folder(tmp_path / "canaries", "canaries", "canaries.json", "canaries.safetensors", "insert.npz")
    gradient = _folder(tmp_path / "run-canaries", "dpaudit", "canaries.json", "canaries.safetensors")
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        (runs / name).mkdir(parents=True)
        (runs / name / "checkpoint.json").write_text("{}")
    assert one_line_error("inspect", report).endswith("it is a report from `dpaudit report`: give one of the run "
                                                      "directories it was made from")  # fmt: skip
    assert one_line_error("attack", "mia", demo).endswith(f"its runs are in {demo}/runs/")
    line = one_line_error("audit", "checkpoint", cloak, "--attacks", "loss")
    assert f"not a model: give its --target run (`dpaudit report TARGET --cloak {cloak}`" in line
    assert f"a sweep of cloaks from `dpaudit train --algo cloak` ({sweep}/lambda_*/)" in one_line_error(
        "inspect", sweep
    )
    assert f"`dpaudit import ... --canaries {made}` makes the run" in one_line_error("attack", "extract", made, "-b", 9)
    assert one_line_error("inspect", gradient).endswith(f"audit them with `dpaudit audit canaries {gradient}`")
    assert one_line_error("inspect", runs).endswith(f"the runs in it: {runs / 'a'}, {runs / 'b'}")
    # `dpaudit report` says the same after its own list of what it reads, and names a run's checkpoint.json
    line = one_line_error("report", cloak, "--out", tmp_path / "out")
    assert "a saved canary audit" in line and "not a model: give its --target run" in line
    assert one_line_error("report", runs / "a" / "checkpoint.json", "--out", tmp_path / "out").endswith(
        f"a run's checkpoint.json, not a report; give the run directory {runs / 'a'}"
    )
    # and `audit canaries` given a run
    assert one_line_error("audit", "canaries", runs / "a", "--claimed-epsilon", 1, "--delta", 1e-5).endswith(
        f"it is a dpaudit run: audit it with `dpaudit audit checkpoint {runs / 'a'}`"
    )


def test_a_runs_checkpoint_json_given_as_spec_says_where_the_spec_is(tmp_path):
    """docs/model-spec.md: "a dpaudit model's spec can be copied from" checkpoint.json's "model". A newcomer gives
    the checkpoint.json itself as --model-spec and read only "must be a JSON object with a 'kind'"."""
    from dpaudit.errors import InputError
    from dpaudit.models import read_model_spec

    f = tmp_path / "checkpoint.json"
    f.write_text('{"schema_version": 1, "model": {"kind": "logreg", "input_shape": [4], "n_classes": 2}}')
    with pytest.raises(InputError, match=r"checkpoint.json: .*a run's checkpoint.json, whose spec is its 'model' obj"):
        read_model_spec(f)
