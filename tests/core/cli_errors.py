"""The CLI's refusal contract as test helpers: one ``error:`` line, exit code 2, no traceback."""

from __future__ import annotations

from typer.testing import CliRunner

from dpaudit.cli.main import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_error(r) -> str:
    """The single error line of a refused command (exit code 2, no traceback; progress lines aside)."""
    assert r.exit_code == 2, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.output, r.stderr
    return lines[0]


def one_line_error(*args) -> str:
    """Run ``dpaudit --quiet ARGS``: its whole output must be one ``error:`` line, with exit code 2."""
    r = runner.invoke(app, ["--quiet", *[str(a) for a in args]])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]
