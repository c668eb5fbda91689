"""Writing reports atomically, and the `dpaudit report` command (typer CliRunner)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from dpaudit.cli.main import app
from dpaudit.errors import InputError
from dpaudit.fileio import MANIFEST
from dpaudit.report import build as build_module
from dpaudit.report import load_report, write_report

from .conftest import FIXTURE

runner = CliRunner()


def _listing(path):
    return sorted(p.name for p in path.iterdir() if p.name != MANIFEST)


def test_write_report_writes_the_requested_formats(report, tmp_path):
    out = write_report(report, tmp_path / "r", formats=("md", "json"))
    assert _listing(out) == ["report.json", "report.md"]
    assert (out / MANIFEST).is_file()  # the list of dpaudit's own files there
    assert load_report(out) == report  # JSON round trip
    assert (out / "report.md").read_text(encoding="utf-8").startswith(f"# {report['title']}\n")
    assert oct(out.stat().st_mode & 0o777) == "0o755"
    assert _listing(tmp_path) == ["r"]  # no temporary directories left behind


def test_write_report_refuses_to_overwrite_without_force(report, tmp_path):
    out = write_report(report, tmp_path / "r", formats=("json",))
    before = (out / "report.json").read_bytes()
    report["title"] = "changed"
    with pytest.raises(InputError, match="already exists; use --force"):
        write_report(report, out, formats=("json",))
    assert (out / "report.json").read_bytes() == before
    write_report(report, out, formats=("md",), force=True)
    assert _listing(out) == ["report.md"]  # replaced as a whole, not mixed with the old content
    assert _listing(tmp_path) == ["r"]


def test_write_report_is_atomic_when_rendering_fails(report, tmp_path, monkeypatch):
    out = write_report(report, tmp_path / "r", formats=("json",))
    before = (out / "report.json").read_bytes()

    def broken(_report):
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr("dpaudit.report.markdown.render_markdown", broken)
    with pytest.raises(RuntimeError):
        write_report(report, out, formats=("json", "md"), force=True)
    assert (out / "report.json").read_bytes() == before
    assert _listing(out) == ["report.json"]
    with pytest.raises(RuntimeError):
        write_report(report, tmp_path / "new", formats=("md",))
    assert _listing(tmp_path) == ["r"]


def test_write_report_validates_first(report, tmp_path):
    report["models"][0]["summary"]["verdict"] = "maybe"
    with pytest.raises(InputError, match="invalid report"):
        write_report(report, tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_written_json_is_strict_json(report, tmp_path):
    report["models"][0]["audits"][0]["max_certifiable_epsilon"] = "inf"
    out = write_report(report, tmp_path / "r", formats=("json",))
    text = (out / "report.json").read_text(encoding="utf-8")
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert text == build_module.dumps(report)


# ------------------------------------------------------------------------------------------- CLI


def test_cli_merges_a_report_and_writes_all_formats(tmp_path, report):
    out = tmp_path / "reports" / "demo"
    result = runner.invoke(app, ["report", str(FIXTURE), "--out", str(out)])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last == f"report written to {out}/ (report.json, report.md, report.html)"
    assert "nonprivate-mlp (claimed ε ∞ (non-private)): leaks: ε ≥ 3.94 shown" in result.output
    assert _listing(out) == ["report.html", "report.json", "report.md"]
    written = load_report(out)
    assert [m["name"] for m in written["models"]] == [m["name"] for m in report["models"]]
    assert [m["summary"] for m in written["models"]] == [m["summary"] for m in report["models"]]
    assert written["title"] == report["title"]
    assert written["run"]["config"]["merged"] == [report["run"]]


def test_cli_json_output_and_merging_twice(tmp_path):
    out = tmp_path / "r"
    args = ["report", str(FIXTURE), str(FIXTURE.parent), "--out", str(out), "--format", "json,md"]
    result = runner.invoke(app, [*args, "--json", "--title", "Two copies"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["out"] == str(out)
    assert data["files"] == [str(out / "report.json"), str(out / "report.md")]
    assert len(data["models"]) == 6 and data["models"][3]["name"] == "nonprivate-mlp #2"
    assert load_report(out)["title"] == "Two copies"


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda d: [str(d / "missing")], "no such file or directory"),
        (lambda d: [str(d)], "neither a run directory"),
        (lambda d: [str(d / "bad.json")], "not valid JSON"),
        (lambda d: [str(d / "invalid.json")], "invalid report"),
        (lambda d: [str(FIXTURE), "--format", "pdf"], "unknown report format pdf"),
        (lambda d: [str(FIXTURE), "--confidence", "1.5"], "confidence"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, make_args, message):
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "invalid.json").write_text(json.dumps({"schema_version": 1, "models": []}))
    result = runner.invoke(app, ["report", *make_args(tmp_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not (tmp_path / "out").exists()


def test_cli_refuses_existing_out_dir_without_force(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "keep").write_text("x")
    result = runner.invoke(app, ["report", str(FIXTURE), "--out", str(out), "--format", "json"])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {out} already exists; use --force to overwrite it"
    assert _listing(out) == ["keep"]
    # --force replaces only what dpaudit wrote: a folder holding the user's file is refused (issue 30).
    result = runner.invoke(app, ["report", str(FIXTURE), "--out", str(out), "--format", "json", "--force"])
    assert result.exit_code == 2 and "holds files dpaudit did not write (keep)" in result.output
    assert _listing(out) == ["keep"]
    (out / "keep").unlink()
    result = runner.invoke(app, ["report", str(FIXTURE), "--out", str(out), "--format", "json", "--force"])
    assert result.exit_code == 0, result.output
    assert _listing(out) == ["report.json"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]
