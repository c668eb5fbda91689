"""The CLI's option groups (dpaudit/cli/_common.py): declared once, shared, defaults changed by name."""

from __future__ import annotations

import inspect

import pytest
import typer
from typer.testing import CliRunner

from dpaudit.cli._common import DATA, OUTPUT, App, given_options, options


def test_options_build_the_signature_typer_reads():
    app = App()
    seen = {}

    @app.command("go")
    @options(DATA, OUTPUT, data="wine")
    def go(ctx: typer.Context, **o) -> None:
        seen.update(o, given=given_options(ctx))

    @app.command("other")
    def other() -> None:  # a second command, so that typer keeps "go" as a subcommand
        pass

    r = CliRunner().invoke(app, ["go", "--label-column", "y", "--json"])
    assert r.exit_code == 0, r.output
    assert seen == {"data": "wine", "label_column": "y", "force": False, "json_output": True,
                    "given": {"label_column", "json_output"}}  # fmt: skip
    params = inspect.signature(go).parameters
    # App adds --quiet to every command (after its name, as before it), last
    assert list(params) == ["ctx", "data", "label_column", "force", "json_output", "_dpaudit_quiet"]
    assert DATA[0].default == "digits"  # the shared group is not changed by one command's default


def test_options_refuse_a_repeated_or_unknown_name():
    with pytest.raises(TypeError, match="repeated"):
        options(DATA, DATA)
    with pytest.raises(TypeError, match="unknown defaults"):
        options(DATA, epochs=3)
