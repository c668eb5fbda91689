"""Progress reporters: the plain one for logs, the CLI's choice of reporter, and the CLI's streams."""

from __future__ import annotations

import io
import json
import re

import pytest
from typer.testing import CliRunner

from dpaudit.cli.main import app
from dpaudit.progress import PlainProgress, Progress, RichProgress, make_progress

runner = CliRunner()
TRAIN = ["train", "--epochs", "1", "--batch-size", "64"]
START = re.compile(r"^dpaudit: train sgd \(\d+ items\) \.\.\.$")
DONE = re.compile(r"^dpaudit: train sgd: done in \d+\.\d s$")


class Clock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_plain_progress_prints_a_start_and_an_end_line():
    out = io.StringIO()
    p = PlainProgress(out, clock=Clock(100.0, 101.0, 112.0, 112.34))  # each advance reads the clock
    with p.task("reference models (3 to train, 1 cached)", 4) as advance:
        advance()
        advance(3)
    assert out.getvalue() == (
        "dpaudit: reference models (3 to train, 1 cached) (4 items) ...\n"
        "dpaudit: reference models (3 to train, 1 cached): done in 12.3 s\n"
    )
    assert "\r" not in out.getvalue()


def test_plain_progress_unknown_total_one_item_and_failure():
    out = io.StringIO()
    p = PlainProgress(out, clock=Clock(0.0, 0.04, 5.0))
    with p.task("self-test", None):
        pass
    with pytest.raises(RuntimeError), p.task("train", 1):
        raise RuntimeError("boom")
    # No "done" line for a stage that failed: the error says what happened.
    assert out.getvalue().splitlines() == [
        "dpaudit: self-test ...",
        "dpaudit: self-test: done in 0.0 s",
        "dpaudit: train (1 item) ...",
    ]


def test_plain_progress_says_how_far_a_long_stage_is_at_most_every_30_s():
    # `audit train --runs 100` in CI printed "train 200 models (200 items) ..." and nothing else for the whole
    # stage (minutes): no count, no time left.
    out = io.StringIO()
    p = PlainProgress(out, clock=Clock(0.0, 10.0, 40.0, 50.0, 80.0, 100.0, 101.0, 102.0))
    with p.task("audit: train 6 models", 6) as advance:
        for _ in range(6):
            advance()
    assert out.getvalue().splitlines() == [
        "dpaudit: audit: train 6 models (6 items) ...",
        "dpaudit: audit: train 6 models: 2/6 after 40 s, about 80 s left",
        "dpaudit: audit: train 6 models: 4/6 after 80 s, about 40 s left",
        "dpaudit: audit: train 6 models: done in 102.0 s",
    ]


def test_a_brief_stage_is_silent_unless_it_lasts():
    """Evaluating a model (after training; the target's logits in `attack mia`) took about 4 minutes for 37,500
    CIFAR images on a CPU without a line. A brief stage says nothing when short, so a small run's lines are
    those they were; past INTERVAL_S it prints its count lines and its done line."""
    out = io.StringIO()
    p = PlainProgress(out, clock=Clock(0.0, 1.0, 2.0, 0.0, 10.0, 31.0, 45.0, 62.0, 70.0, 71.0, 71.5))
    with p.task("evaluate the model", 300, brief=True) as advance:
        advance(100)
        advance(200)
    assert out.getvalue() == ""
    with p.task("evaluate the model", 600, brief=True) as advance:
        for _ in range(5):
            advance(100)
        advance(100)
    assert out.getvalue().splitlines() == [
        "dpaudit: evaluate the model: 200/600 after 31 s, about 62 s left",
        "dpaudit: evaluate the model: 400/600 after 62 s, about 31 s left",
        "dpaudit: evaluate the model: done in 71.5 s",
    ]


def test_cli_evaluation_and_the_targets_logits_report_progress_when_long(tmp_path, monkeypatch):
    """Past INTERVAL_S (here 0 s: every batch is late) the evaluation after training and `attack mia`'s logits of
    the target print how far they are (test_cli_progress_lines_on_stderr_only: at the default, a small run prints
    the two lines it did)."""
    monkeypatch.setattr(PlainProgress, "INTERVAL_S", 0.0)
    monkeypatch.setattr("dpaudit.checkpoint.EVAL_BATCH_ROWS", 256)  # several batches of digits
    run = tmp_path / "run"
    r = runner.invoke(app, [*TRAIN, "--out", str(run)])
    assert r.exit_code == 0, r.output
    evaluation = [ln for ln in r.stderr.splitlines() if ln.startswith("dpaudit: evaluate the model")]
    assert re.fullmatch(r"dpaudit: evaluate the model: \d+/1346 after \d+ s, about \d+ s left", evaluation[0])
    assert re.fullmatch(r"dpaudit: evaluate the model: done in \d+\.\d s", evaluation[-1]), r.stderr
    r = runner.invoke(app, ["attack", "mia", str(run), "--attacks", "loss"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("dpaudit: the target's logits")]
    assert re.fullmatch(r"dpaudit: the target's logits: 256/987 after \d+ s, about \d+ s left", lines[0]), r.stderr
    assert lines[-1].startswith("dpaudit: the target's logits: done in "), r.stderr


class FakeStream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("quiet", "json_output", "stderr_tty", "stdout_tty", "expected"),
    [
        (True, False, True, True, Progress),
        (True, True, False, False, Progress),
        (False, False, True, False, RichProgress),  # bars go to stderr: stdout may be piped
        (False, True, True, True, PlainProgress),  # --json: plain lines on stderr, stdout pure JSON
        (False, False, False, True, PlainProgress),  # stderr to a log file
        (False, False, False, False, PlainProgress),
    ],
)
def test_make_progress_rule(monkeypatch, quiet, json_output, stderr_tty, stdout_tty, expected):
    monkeypatch.setattr("sys.stderr", FakeStream(stderr_tty))
    monkeypatch.setattr("sys.stdout", FakeStream(stdout_tty))
    assert type(make_progress(quiet=quiet, json_output=json_output)) is expected


def test_cli_progress_lines_on_stderr_only(tmp_path):
    r = runner.invoke(app, [*TRAIN, "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("dpaudit: ")]
    assert len(lines) == 2 and START.match(lines[0]) and DONE.match(lines[1]), r.stderr
    assert "dpaudit: " not in r.stdout and "\r" not in r.stderr
    assert r.stdout.splitlines()[0].startswith("model ")


def test_cli_progress_with_json_keeps_stdout_pure_json(tmp_path):
    r = runner.invoke(app, ["--json", *TRAIN, "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["out"] == str(tmp_path / "run")
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and START.match(lines[0]) and DONE.match(lines[1]), r.stderr


def test_cli_quiet_silences_progress(tmp_path):
    r = runner.invoke(app, ["--quiet", *TRAIN, "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    assert "dpaudit: " not in r.stdout
