"""Shared CLI plumbing: global options, output, error handling, exit codes.

Every command module builds on :class:`App`, whose ``command`` decorator turns a
:class:`~dpaudit.errors.DPAuditError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import math
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.markup import escape as escape_markup
from typer.core import DEFAULT_MARKUP_MODE, TyperCommand, TyperGroup

from dpaudit.data import DATA_HELP
from dpaudit.errors import EXIT_USAGE, CheckpointError, DPAuditError, FileContentError, InputError
from dpaudit.progress import Progress, make_progress, notices
from dpaudit.validation import check_seed

EXIT_INTERNAL = 3
# The reader of stdout went away (`dpaudit ... --help | head -1`): the status of a command killed by SIGPIPE
# (128 + 13), as `yes | head -1` gives; never 0 or 1, so a cut output never reads as success or a violation.
EXIT_STDOUT_CLOSED = 141
# Interrupted by Ctrl-C (SIGINT) or stopped by SIGTERM (a job scheduler's or `timeout`'s stop, `kill PID`):
# 128 + the signal's number, as a shell reports a command killed by it.
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

EXIT_CODES_HELP = (
    "Exit codes (all commands): 0 success; 1 an audit/check found a violation or failed its check; "
    "2 bad usage or bad input; 3 internal error (a bug: rerun with --debug and report it); 130 interrupted (Ctrl-C) "
    "and 143 terminated (SIGTERM), outputs left as they were; 141 (silently) stdout closed early, as by `| head`."
)


@dataclass
class GlobalOptions:
    json: bool = False
    quiet: bool = False
    debug: bool = False
    # A result was written to stdout as JSON: an error after it (a --fail-on-violation gate that fails, exit 2)
    # then goes to stderr only, so stdout stays one JSON document that a CI step can parse.
    json_written: bool = False


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


def _safe(text: str) -> str:
    """A human-readable line as the terminal is to show it: the control and bidirectional control characters
    of names from strangers' runs and files written out (:func:`dpaudit.validation.visible`), so an escape
    sequence in a checkpoint's metadata is printed, not obeyed by the terminal."""
    from dpaudit.validation import visible

    return visible(text, keep_cr=False)


def emit(data: Any, human: str | None = None, *, json_flag: bool = False) -> None:
    """Print the result: ``data`` as JSON in JSON mode, otherwise ``human``. --quiet never hides a result."""
    if json_mode(json_flag):
        typer.echo(dumps(data))  # JSON escapes control characters itself
        STATE.json_written = True
    elif human is not None:
        typer.echo(_safe(human))


def info(message: str, *, json_flag: bool = False) -> None:
    """A human-facing status line on stderr (silent under --quiet/--json)."""
    if not STATE.quiet and not json_mode(json_flag):
        typer.echo(_safe(message), err=True)


def notice(message: str) -> None:
    """A notice on stderr that the user should see before work starts (a cost estimate, a deprecated
    option): shown with --json too (stdout stays machine-readable), silent under --quiet."""
    if not STATE.quiet:
        typer.echo(_safe(message), err=True)


def warn(message: str) -> None:
    """``warning: message`` on stderr, always: a check's finding is part of the result, so neither
    --quiet nor --json hides it (stdout stays machine-readable)."""
    typer.echo(_safe(f"warning: {message}"), err=True)


_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # dpaudit/


@contextlib.contextmanager
def dpaudit_warnings_as_cli_warnings() -> Iterator[None]:
    """Inside, a Python ``UserWarning`` raised from dpaudit's own code is printed as the CLI's one line ``warning:
    message`` (:func:`warn`), when Python would show it (its filters: once per place), instead of Python's two lines
    with a file path and a source line (DP-SGD-JL's "16 JL projections for 14 parameters" printed
    "/…/dpaudit/training/jl.py:459: UserWarning: …" and the line ``return JLClipper(…)``). Other warnings (torch's,
    a user's own code) are shown as Python shows them."""
    with warnings.catch_warnings():
        python_show = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, UserWarning) and Path(filename).resolve().is_relative_to(_PACKAGE_DIR):
                warn(str(message))
            else:
                python_show(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """The one-line error and exit ``code``; with --json also ``{"error", "exit_code"}`` on stdout."""
    _report_error(f"error: {message}", code)


# A parameter name as a whole word: not inside a longer identifier, an option (--x-y), a dotted name or
# a path (a/b, a.json), nor a call (f(...)).
_START = r"(?<![\w.\-/\\])"
_END = r"(?![\w\-(/\\])(?!\.\w)"
_NAME_LIST = re.compile(_START + r"([A-Za-z_]\w*(?:/[A-Za-z_]\w*)+)" + _END)
_VALUE = r"""('[^']*'|"[^"]*"|[^\s,;)]+)"""
_QUOTES = "'\""


def with_option_names(message: str, params: Iterable[Any]) -> str:
    """``message`` with the Python names of a command's options written as the options themselves.

    Library messages name parameters as the validators do ("expected sample_rate in (0, 1], got 1.5",
    "unknown threshold_selection 'x'", "drop threshold_selection='bonferroni'", "k_plus/k_minus ...");
    a CLI user typed ``--sample-rate``. Rewritten: every whole-word occurrence of a name with an
    underscore (``NAME='v'`` becomes ``--opt v``; ``a/b`` only when both are such options, else it
    is a path), and a single-word name only right after "expected ", between "unknown " and a quoted
    value, or as the alternative in "give --opt or NAME" (the validators' forms), so that prose such as
    "at delta = 1e-05" stays as it is.
    Arguments and names of other commands are left alone. ``params``: the command's click parameters
    (``ctx.command.params``; read through their public attributes, whichever click typer runs on).
    """
    options: dict[str, Any] = {}
    for p in params:
        if getattr(p, "param_type_name", None) == "option" and p.name and any(o.startswith("--") for o in p.opts):
            options[p.name] = p

    def flag(name: str) -> str:
        return next(o for o in options[name].opts if o.startswith("--"))

    def name_list(m: re.Match[str]) -> str:
        parts = m.group(1).split("/")
        alternatives = all(n in options and "_" in n for n in parts)
        return "/".join(flag(n) for n in parts) if alternatives else m.group(0)

    message = _NAME_LIST.sub(name_list, message)
    for name, opt in options.items():
        key = re.escape(name)
        if "_" in name:
            if not opt.is_flag:  # NAME='v' -> --opt v (a flag's NAME=True is left as written)
                message = re.sub(
                    _START + key + "=" + _VALUE,
                    lambda m, n=name: f"{flag(n)} {m.group(1).strip(_QUOTES)}",
                    message,
                )
            message = re.sub(_START + key + _END + "(?!=)", flag(name), message)
        else:
            # After "expected " (check_in_interval & co.), or check_choice's "unknown kind 'x'" (a quoted value next).
            message = re.sub(r"(?<=\bexpected )" + key + _END + "(?!=)", flag(name), message)
            message = re.sub(r"(?<=\bunknown )" + key + r"(?= ['\"])", flag(name), message)
    for name in options:  # after every other rewrite: the alternative to an option written as one
        if "_" not in name:  # "give --true-epsilon or mu" (audit plan)
            pattern = r"(?<=\bgive )(--[\w-]+ or )" + re.escape(name) + _END + "(?!=)"
            message = re.sub(pattern, lambda m, n=name: m.group(1) + flag(n), message)
    return message


def _error_line(error: DPAuditError, ctx: typer.Context | None) -> str:
    """The first line of a domain error, its parameter names written as the command's options (not for a
    :class:`FileContentError` or a :class:`CheckpointError`, whose names are a file's fields: `train --algo cloak
    --target RUN` has a --data option, but RUN's unknown data spec is no --data the user typed)."""
    # Up to the first newline only: splitlines() also breaks at a carriage return or a form feed, which a name
    # from a stranger's file may hold mid-line (the rest of the line would be lost; the printer writes them out).
    text = str(error).split("\n", 1)[0].rstrip("\r") if str(error) else type(error).__name__
    if ctx is None or isinstance(error, FileContentError | CheckpointError):
        return text
    return with_option_names(text, ctx.command.params)


_CONTEXT = "_dpaudit_context"
_QUIET = "_dpaudit_quiet"
QUIET_HELP = "Hide progress and notices (never results, warnings or errors); before or after the command."
_QUIET_PARAM = inspect.Parameter(
    _QUIET,
    inspect.Parameter.KEYWORD_ONLY,
    default=False,
    annotation=Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)],
)


def _with_context(f: Callable[..., Any]) -> tuple[inspect.Signature, str, bool]:
    """The signature typer should see for ``f``: ``f``'s, plus ``--quiet`` (every command takes it after its
    name, as the app takes it before) and a keyword-only ``typer.Context`` parameter that typer fills in
    (unless ``f`` takes one already). Also the name of the context parameter, and whether it was added (then
    the command does not receive it)."""
    try:
        sig = inspect.signature(f, eval_str=True)
    except (NameError, TypeError):  # unresolvable annotations: typer would fail on them as well
        sig = inspect.signature(f)
    added = [_QUIET_PARAM]
    # Found by its annotation, not by the type of the object typer passes: that is click's context class,
    # which typer.Context only subclasses (an isinstance check missed it, and `audit train` printed Python names).
    own = next(
        (
            n
            for n, p in sig.parameters.items()
            if isinstance(p.annotation, type) and issubclass(p.annotation, typer.Context)
        ),
        None,
    )
    if own is None:
        added.append(inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
    return sig.replace(parameters=[*sig.parameters.values(), *added]), own or _CONTEXT, own is None


MAX_ERROR_CHARS = 2000  # a pasted 100 kB option value is not echoed back whole


def _report_error(line: str, code: int) -> None:
    """One line on stderr (``line``) and exit ``code``; with --json also ``{"error", "exit_code"}`` on stdout
    (unless stdout itself is what failed: a full disk, a closed pipe; the line on stderr still says so), except
    after a result written as JSON (``STATE.json_written``): stdout then stays that one document."""
    if len(line) > MAX_ERROR_CHARS:
        line = f"{line[: MAX_ERROR_CHARS // 2]}… ({len(line)} characters)"
    if STATE.json and not STATE.json_written:
        try:
            typer.echo(dumps({"error": line.removeprefix("error: "), "exit_code": code}))
        except OSError:
            pass
    typer.echo(_safe(line), err=True)
    raise typer.Exit(code)


def _subcommands_with(ctx: Any, option: str, path: str) -> list[str]:
    """The commands under the group ``ctx`` runs (``path`` its command path; subgroups searched too) that take
    ``option``, as command paths; empty when ``ctx`` runs a command, not a group."""
    group = getattr(ctx, "command", None)
    found: list[str] = []

    def walk(command: Any, where: str) -> None:
        if isinstance(command, TyperGroup):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None:
                    walk(sub, f"{where} {name}")
        elif command is not group and any(option in p.opts for p in command.params):
            found.append(where)

    if isinstance(group, TyperGroup):
        walk(group, path)
    return found


def usage_error_line(error: Exception) -> str:
    """A click usage error (unknown option or command, missing or bad value) as one line, click's suggestion
    kept: "no such option --epoch (did you mean --epochs?); see dpaudit train --help"."""
    ctx = getattr(error, "ctx", None)
    name = getattr(error, "option_name", None)
    possibilities = getattr(error, "possibilities", None)
    if name and possibilities is not None:  # click's NoSuchOption
        owners = _subcommands_with(ctx, name, getattr(ctx, "command_path", ""))
        if owners:  # `dpaudit account --noise-multiplier 1.1`: an option of a subcommand the user left out
            shown = ", ".join(owners[:3]) + (f" and {len(owners) - 3} more" if len(owners) > 3 else "")
            return f"error: {name} is an option of {shown}, not of {ctx.command_path}; see {owners[0]} --help"
        text = f"no such option {name}"
        if possibilities:
            text += f" (did you mean {' or '.join(sorted(possibilities))}?)"
    else:
        message = error.format_message() if hasattr(error, "format_message") else str(error)
        text = re.sub(r"\. Did you mean (.+)\?$", r" (did you mean \1?)", " ".join(message.split())).rstrip(".")
        text = text[:1].lower() + text[1:]
    where = f"; see {ctx.command_path} --help" if ctx is not None and getattr(ctx, "command_path", None) else ""
    return f"error: {text}{where}"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C is, so that the same clean-up runs: a half-written output's
    temporary folder is removed and a forced replacement rolled back (:mod:`dpaudit.fileio`). Without it SIGTERM
    ended the process on the spot and left them for the next write of the same output."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While a command runs, SIGTERM raises :class:`Terminated`, unless someone else (an embedding program)
    installed a handler of their own or this is not the main thread (where no handler can be set)."""
    import signal

    previous = None
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        with contextlib.suppress(ValueError):  # ValueError: not the main thread
            previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def stop_idle_worker_processes() -> None:
    """End the worker processes joblib's loky executor keeps for reuse after a parallel job (``--workers`` > 1).
    Left to the interpreter's exit, loky's atexit hook waited for them to end: 6–10 s after the result was
    printed on a loaded 2-core machine, and Ctrl-C in that wait printed loky's ``KeyboardInterrupt``
    traceback (exit 0). Killed here, as the command ends (its outputs are written or rolled back by then);
    nothing is done when loky was never used (no executor is made)."""
    loky = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(loky, "_executor", None) if loky is not None else None
    if executor is not None:
        executor.shutdown(wait=True, kill_workers=True)


class _StdoutClosed(Exception):
    """stdout's reader went away. Not an OSError, so that click does not turn it into its exit 1."""


def _quiet_exit_on_closed_stdout() -> None:
    """Exit with EXIT_STDOUT_CLOSED, silently: stdout pointed at /dev/null so that the interpreter's final
    flush finds no broken pipe (the recipe of the Python docs, signal module, "Note on SIGPIPE")."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (an in-process runner): nothing to flush
        pass
    sys.exit(EXIT_STDOUT_CLOSED)


def _closed_stdout(e: BaseException) -> bool:
    return isinstance(e, BrokenPipeError) or (isinstance(e, SystemExit) and isinstance(e.__context__, BrokenPipeError))


def unwrap_help(text: str | None) -> str | None:
    """A command's help with each paragraph on one line. Typer (0.28–0.29, rich markup mode) keeps the single
    line breaks of every paragraph after the first, so a docstring wrapped at the source's 120 columns printed
    broken lines in an 80-column terminal ("...A size counts only" / "when the lower end..."). Paragraphs
    (blank-line separated) stay; a paragraph starting with click's ``\\b`` marker keeps its lines."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n")) for p in paragraphs)


class _UnwrappedHelp:
    """Mixin of :class:`Group` and :class:`Command`: their help goes through :func:`unwrap_help`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = unwrap_help(self.help)


class Group(_UnwrappedHelp, TyperGroup):
    """The app's click group: a usage error (a typo'd option or command, a missing argument) is one line on
    stderr with click's suggestion and exit code 2, as a domain error is (not click's multi-line box);
    with --json, ``{"error", "exit_code"}`` on stdout as well."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:  # fmt: skip
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(argv, prog_name, complete_var, False, **extra)
        except _StdoutClosed:
            _quiet_exit_on_closed_stdout()
        except typer.Exit as e:
            code = e.exit_code
        except typer.Abort:
            typer.echo("aborted", err=True)
            code = 1
        except typer.TyperException as e:  # click's ClickException and its usage errors
            if type(e).__name__ == "NoArgsIsHelpError":  # `dpaudit attack`: the help is the answer
                typer.echo(_safe(e.format_message()), err=True)
                sys.exit(EXIT_USAGE)
            STATE.json = STATE.json or "--json" in argv
            try:
                _report_error(usage_error_line(e), getattr(e, "exit_code", EXIT_USAGE))
            except typer.Exit as exit_:
                code = exit_.exit_code
        sys.exit(code if isinstance(code, int) else 0)

    # Help and output are written while click makes a command's context or invokes it; a closed stdout there
    # leaves as _StdoutClosed (each nested group wraps its own; converting twice is harmless). Rich, which
    # writes the help, meets it with SystemExit(1) raised inside its `except BrokenPipeError`
    # (rich.console.Console.on_broken_pipe): recognised by that context.
    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except (BrokenPipeError, SystemExit) as e:
            if _closed_stdout(e):
                raise _StdoutClosed from e
            raise

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (BrokenPipeError, SystemExit) as e:
            if _closed_stdout(e):
                raise _StdoutClosed from e
            raise


class Command(_UnwrappedHelp, TyperCommand):
    """A command whose usage line spells its arguments one way, in capitals: ``dpaudit inspect [OPTIONS] RUN``
    (typer writes a required argument as ``{run}``, an optional one as ``[RUN]``). RUN is written bare in every
    command (README: "every command names the run it reads as its first argument, RUN"), also where only its
    deprecated ``--checkpoint`` alias makes it optional to click; another optional argument is ``[NAME]``."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name != "argument":
                pieces.extend(p.get_usage_pieces(ctx))
                continue
            name = (p.metavar or p.name).upper() + ("..." if p.nargs != 1 else "")
            pieces.append(name if p.required or p.name == "run" else f"[{name}]")
        return pieces


class App(typer.Typer):
    """Typer app whose commands report domain errors as one line with exit code 2."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("pretty_exceptions_enable", False)
        kwargs.setdefault("no_args_is_help", True)
        kwargs.setdefault("add_completion", False)
        kwargs.setdefault("cls", Group)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        kwargs.setdefault("cls", Command)
        decorator = super().command(*args, **kwargs)

        def wrap(f):
            # typer passes the click context to a parameter annotated typer.Context: the error handler
            # reads the command's options from it (typer has no public get_current_context).
            signature, ctx_name, ctx_added = _with_context(f)

            @functools.wraps(f)
            def guarded(*a: Any, **k: Any) -> Any:
                ctx = k.pop(ctx_name, None) if ctx_added else k.get(ctx_name)
                quiet = k.pop(_QUIET, False)  # --quiet after the command's name
                STATE.quiet = STATE.quiet or quiet
                STATE.json = STATE.json or bool(k.get("json_output"))
                try:
                    for name, value in k.items():  # one range for every seed option (see check_seed)
                        if (name == "seed" or name.endswith("_seed")) and value is not None:
                            check_seed(**{name: value})
                    # dpaudit's own UserWarnings (a trainer's, an attack's) as one `warning:` line, in every command
                    with _sigterm_as_interrupt(), notices(notice), dpaudit_warnings_as_cli_warnings():
                        try:
                            return f(*a, **k)
                        finally:
                            stop_idle_worker_processes()
                except typer.Exit:
                    raise
                except BrokenPipeError:  # stdout closed by its reader: not an error (Group exits quietly)
                    raise
                except DPAuditError as e:
                    if STATE.debug:
                        traceback.print_exc()
                    fail(_error_line(e, ctx))
                except OSError as e:  # the environment, not a bug: permissions, disk full, read-only, ...
                    if STATE.debug:
                        traceback.print_exc()
                    where = f" ({e.filename})" if e.filename else ""
                    fail(f"{e.strerror or type(e).__name__}{where}")
                except KeyboardInterrupt as e:
                    terminated = isinstance(e, Terminated)
                    typer.echo("terminated" if terminated else "interrupted", err=True)
                    raise typer.Exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED) from None
                except Exception as e:  # a bug, not bad input: still one line unless --debug
                    if STATE.debug:
                        traceback.print_exc()
                    line = f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)"
                    _report_error(" ".join(line.split()), EXIT_INTERNAL)

            guarded.__signature__ = signature  # type: ignore[attr-defined]
            return decorator(guarded)

        return wrap


# ---- option groups: declared once, shared by the commands ---------------------------------------------
#
# A command with many options takes them as ``**options`` and declares them with :func:`options`, which
# gives typer the signature built from the groups below. A group is a tuple of keyword parameters; the
# same group (e.g. the data options) means the same flags, types and help in every command that uses it,
# and a command may change a default by name (``options(DATA, RECIPE, epochs=5)``). The command body
# stays a few lines: it passes the options to one library function and prints what it returns.


def opt(name: str, kind: Any, default: Any, *flags: str, help: str | None = None, **extra: Any) -> inspect.Parameter:
    """A keyword option ``name`` of type ``kind`` (flags default to ``--name-with-dashes``)."""
    flags = flags or (f"--{name.replace('_', '-')}",)
    if help is not None and DEFAULT_MARKUP_MODE == "rich":  # rich would read "[jax]" in '.[jax]' as a style tag
        help = escape_markup(help)
    option = typer.Option(*flags, help=help, **extra)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option])


def arg(name: str, kind: Any, *, help: str) -> inspect.Parameter:
    """A required positional argument ``name`` of type ``kind``."""
    argument = typer.Argument(help=help)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[kind, argument])


def options(
    *groups: tuple[inspect.Parameter, ...], **defaults: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the command takes the options of ``groups`` (in order), with ``defaults`` changed by name."""
    params = [p for group in groups for p in group]
    names = [p.name for p in params]
    repeated = sorted({n for n in names if names.count(n) > 1})
    unknown = sorted(set(defaults) - set(names))
    if repeated or unknown:
        raise TypeError(f"option groups: repeated {repeated}, unknown defaults {unknown}")  # a bug, at import
    params = [p.replace(default=defaults[p.name]) if p.name in defaults else p for p in params]

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        # The command's own named parameters (a typer.Context) come first, then the groups' options.
        own = [p for p in inspect.signature(f, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
        f.__signature__ = inspect.Signature([*own, *params])  # type: ignore[attr-defined]
        return f

    return decorate


def given_options(ctx: typer.Context) -> set[str]:
    """Names of the options the user gave on the command line (not left at their defaults)."""
    return {p.name for p in ctx.command.params if ctx.get_parameter_source(p.name).name != "DEFAULT"}


OUTPUT = (
    opt("force", bool, False, "--force", help="Overwrite an existing output."),
    opt("json_output", bool, False, "--json", help="Machine-readable JSON on stdout."),
)
JSON_ONLY = OUTPUT[1:]
DATA = (
    opt(
        "data",
        str,
        "digits",
        help=DATA_HELP,
    ),
    opt("label_column", str | None, None, help="Label column of a CSV file."),
)
RECIPE = (
    opt("epochs", int, 30, help="Passes over the training split."),
    opt("steps", int | None, None, help="Number of steps (overrides --epochs)."),
    opt("batch_size", int, 64, help="Batch size (expected size for Poisson)."),
    opt("lr", float, 0.1, help="Learning rate."),
)
DP = (
    opt("noise_multiplier", float | None, None, help="DP: noise σ."),
    opt("epsilon", float | None, None, help="DP: target ε (calibrates σ)."),
    opt("clip", float, 1.0, help="DP: per-example clipping norm C."),
)
CACHE_DIR_HELP = (
    "Cache of trained shadow/reference models (default: $DPAUDIT_CACHE_DIR, else $XDG_CACHE_HOME/dpaudit, else "
    "~/.cache/dpaudit)."
)
CACHE_DIR = (
    opt("cache_dir", Path | None, None, help=CACHE_DIR_HELP),
    opt("no_cache", bool, False, help="Train shadow/reference models in a temporary directory, deleted afterwards."),
)
# The seed of one checkpoint's audit workflow (dpaudit.workflows), which `audit checkpoint` and `report` share.
CHECKPOINT_SEED_HELP = (
    "Seed of the attacks (reference models, bootstrap) and of the audits (holdout split, tie-breaking)."
)


# ---- the target run: one positional RUN everywhere ---------------------------------------------------------

RUN_HELP = "Run directory of the target model (required; written by `dpaudit train` or `dpaudit import`)."
RunArgument = Annotated[Path | None, typer.Argument(metavar="RUN", help=RUN_HELP, show_default=False)]
CheckpointAlias = Annotated[
    Path | None,
    typer.Option("--checkpoint", "-c", hidden=True, help="Deprecated spelling of RUN (kept for old scripts)."),
]
TARGET = (
    inspect.Parameter("run", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RunArgument),
    inspect.Parameter("checkpoint", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=CheckpointAlias),
)


def target_run(run: Path | None, checkpoint: Path | None) -> Path:
    """The target run, given as RUN (or, deprecated, as --checkpoint/-c: still works, with a notice)."""
    if checkpoint is not None:
        if run is not None:
            raise InputError("give the run once, as RUN (--checkpoint is its deprecated spelling)")
        notice("dpaudit: --checkpoint/-c is deprecated; give the run directory as RUN, the first argument")
        return checkpoint
    if run is None:
        raise InputError("missing argument RUN (the target model's run directory)")
    return run


def deprecated_alias(old: str, new: str) -> None:
    """The one-line notice for a deprecated option spelling that still works."""
    notice(f"dpaudit: {old} is deprecated; use {new}")


def aliased(value: Any, old_value: Any, new: str, old: str, what: str) -> Any:
    """The value of option ``new``, or of its deprecated spelling ``old`` (with the notice); both is one line."""
    if old_value is None:
        return value
    if value is not None:
        raise InputError(f"give the {what} once, as {new} ({old} is its deprecated spelling)")
    deprecated_alias(old, new)
    return old_value


DELTA_HELP = "δ of the privacy claim (ε, δ)"
