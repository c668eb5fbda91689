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
