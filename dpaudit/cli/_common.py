"""Shared CLI plumbing: global options, output, error handling, exit codes.

Every command module builds on :class:`App`, whose ``command`` decorator turns a
:class:`~dpaudit.errors.DPAuditError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import traceback
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import typer

from dpaudit.errors import EXIT_USAGE, DPAuditError
from dpaudit.progress import Progress, make_progress

EXIT_INTERNAL = 3

EXIT_CODES_HELP = (
    "Exit codes (all commands): 0 success; 1 an audit/check found a violation or failed its check; "
    "2 bad usage or bad input; 3 internal error (a bug: rerun with --debug and report it)."
)


@dataclass
class GlobalOptions:
    json: bool = False
    quiet: bool = False
    debug: bool = False


STATE = GlobalOptions()

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
ForceFlag = Annotated[bool, typer.Option("--force", help="Overwrite an existing output.")]


def json_mode(flag: bool = False) -> bool:
    return STATE.json or flag


def progress(flag_json: bool = False) -> Progress:
    return make_progress(quiet=STATE.quiet, json_output=json_mode(flag_json))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        # JSON has no infinity; we spell it as a string so parsers never choke.
        return "inf" if obj > 0 else ("-inf" if obj < 0 else "nan")
    return obj


def dumps(data: Any) -> str:
    return json.dumps(_jsonable(data), indent=2, sort_keys=False)


def emit(data: Any, human: str | None = None, *, json_flag: bool = False) -> None:
    """Print ``data`` as JSON in JSON mode, otherwise ``human`` (unless --quiet)."""
    if json_mode(json_flag):
        typer.echo(dumps(data))
    elif not STATE.quiet and human is not None:
        typer.echo(human)


def info(message: str, *, json_flag: bool = False) -> None:
    """A human-facing status line on stderr (silent under --quiet/--json)."""
    if not STATE.quiet and not json_mode(json_flag):
        typer.echo(message, err=True)


def fail(message: str, code: int = EXIT_USAGE) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


class App(typer.Typer):
    """Typer app whose commands report domain errors as one line with exit code 2."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("pretty_exceptions_enable", False)
        kwargs.setdefault("no_args_is_help", True)
        kwargs.setdefault("add_completion", False)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        decorator = super().command(*args, **kwargs)

        def wrap(f):
            @functools.wraps(f)
            def guarded(*a: Any, **k: Any) -> Any:
                try:
                    return f(*a, **k)
                except typer.Exit:
                    raise
                except DPAuditError as e:
                    if STATE.debug:
                        traceback.print_exc()
                    fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
                except KeyboardInterrupt:
                    typer.echo("interrupted", err=True)
                    raise typer.Exit(130) from None
                except Exception as e:  # a bug, not bad input: still one line unless --debug
                    if STATE.debug:
                        traceback.print_exc()
                    else:
                        print(
                            f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
                            file=sys.stderr,
                        )
                    raise typer.Exit(EXIT_INTERNAL) from None

            return decorator(guarded)

        return wrap
