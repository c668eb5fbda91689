"""Entry point of the ``dpaudit`` command."""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from dpaudit import __version__
from dpaudit.cli._common import EXIT_CODES_HELP, QUIET_HELP, STATE, App

app = App(
    help="Train, attack and audit differentially private models.\n\n" + EXIT_CODES_HELP,
)

# Each module defines ``register(app)``. Add a module here only when its commands work.
COMMAND_MODULES = [
    "dpaudit.cli.train",
    "dpaudit.cli.inspect",
    "dpaudit.cli.demo",
    "dpaudit.cli.report",
    "dpaudit.cli.audit",
    "dpaudit.cli.canaries",
    "dpaudit.cli.account",
    "dpaudit.cli.attack",
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dpaudit {__version__}")
        raise typer.Exit(0)


@app.callback()
def _global(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    yes: Annotated[
        bool, typer.Option("--yes", help="Start work estimated to take over an hour (dpaudit.budget) without asking.")
    ] = False,
) -> None:
    STATE.json = json_output
    STATE.quiet = quiet
    STATE.debug = debug
    STATE.json_written = False
    if yes:
        from dpaudit.budget import set_allow_long_work

        set_allow_long_work(True)


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
