"""Progress reporting that library code can use without knowing about terminals.

Library functions take ``progress: Progress | None`` and use only ``progress.task(description,
total)``. The CLI picks the reporter (:func:`make_progress`): silent under --quiet; rich bars on
stderr when stderr is a terminal (and not --json); otherwise plain lines on stderr, one when a stage
starts, one when it ends and, for a stage of known size, one at most every 30 s saying how far it is and
about how long is left, so that CI logs show what runs and for how long while stdout stays clean (pure
JSON under --json).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

PREFIX = "dpaudit: "


class Progress:
    """No-op progress reporter (the library default).

    ``task(description, total, brief=True)``: a stage that is short on small data and long on large (evaluating a
    model on every record: about 4 minutes for 37,500 CIFAR images on a CPU). The plain reporter says nothing of
    it unless it runs past :attr:`PlainProgress.INTERVAL_S`, so a small run's lines stay as they are; bars show it
    while it runs and remove it when done."""

    @contextlib.contextmanager
    def task(self, description: str, total: int | None, *, brief: bool = False) -> Iterator[Callable[[int], None]]:
        yield lambda n=1: None


class PlainProgress(Progress):
    """One line on stderr when a stage starts and one when it ends; no bars, no carriage returns. In between,
    a stage of known size prints "k/total after t s, about r s left" at most every :attr:`INTERVAL_S` seconds.

    ``stream``: where the lines go (default: ``sys.stderr`` as it is when a stage starts, so that
    redirections made later, e.g. by a test runner, are honoured). A stage that raises prints no
    "done" line: the error says what happened. A ``brief`` stage prints no start line: its first line is the
    first "k/total" one, after :attr:`INTERVAL_S`, and its "done" line follows only if that was printed.
    """

    INTERVAL_S = 30.0  # least time between two "k/total" lines of one stage

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.stream = stream
        self.clock = clock

    def _line(self, text: str) -> None:
        print(PREFIX + text, file=self.stream or sys.stderr, flush=True)

    @contextlib.contextmanager
    def task(self, description: str, total: int | None, *, brief: bool = False) -> Iterator[Callable[[int], None]]:
        size = "" if total is None else f" ({total} item{'' if total == 1 else 's'})"
        if not brief:
            self._line(f"{description}{size} ...")
        start = self.clock()
        state = {"done": 0, "last": start, "said": not brief}

        def advance(n: int = 1) -> None:
            # A stage with a known size (e.g. the 2R trainings of `audit train`) prints how far it is at most
            # every INTERVAL_S seconds: a CI log would otherwise stay silent for the whole stage.
            if total is None:
                return
            state["done"] += n
            now = self.clock()
            if now - state["last"] < self.INTERVAL_S or not 0 < state["done"] < total:
                return
            state["last"], state["said"] = now, True
            elapsed = now - start
            left = elapsed / state["done"] * (total - state["done"])  # the mean time per item so far
            self._line(f"{description}: {state['done']}/{total} after {elapsed:.0f} s, about {left:.0f} s left")

        yield advance
        if state["said"]:
            self._line(f"{description}: done in {self.clock() - start:.1f} s")


class RichProgress(Progress):
    """Progress bars with ETA on stderr (rich)."""

    @contextlib.contextmanager
    def task(self, description: str, total: int | None, *, brief: bool = False) -> Iterator[Callable[[int], None]]:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import (
            Progress as _RP,
        )

        with _RP(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=brief,  # a brief stage's bar goes when it is done
        ) as bar:
            tid = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(tid, n)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def make_progress(*, quiet: bool, json_output: bool) -> Progress:
    """The CLI's reporter: silent under ``quiet``; bars when stderr (where they go) is a terminal and
    the output is not JSON; otherwise plain start/end lines on stderr (stdout is never touched)."""
    if quiet:
        return Progress()
    if not json_output and _isatty(sys.stderr):
        return RichProgress()
    return PlainProgress()


NULL_PROGRESS = Progress()


# ---- notices: one line before long work starts (dpaudit.budget's estimates) ------------------------------
#
# Library code calls :func:`announce`; whoever runs it decides where the line goes. The CLI wraps each command
# in :func:`notices` with its reporter (silent under --quiet), and each distinct notice is then said once per
# command, not once per training of a multi-run audit. Worker processes started inside the block inherit
# ``NOTICES_ENV`` and stay silent: their parent has announced the work as a whole before starting them.

NOTICES_ENV = "DPAUDIT_NOTICES_BY_PARENT"
_reporter: list[Callable[[str], None]] = []
_said: list[set[str]] = []


def announce(message: str) -> None:
    """Say ``message`` (one line) through the active :func:`notices` reporter, once per block; without one,
    on stderr with the progress prefix (silent in a worker process whose parent reports notices)."""
    if _reporter:
        if message not in _said[-1]:
            _said[-1].add(message)
            _reporter[-1](PREFIX + message)
    elif os.environ.get(NOTICES_ENV) != "1":
        print(PREFIX + message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def notices(reporter: Callable[[str], None]) -> Iterator[None]:
    """Within this block, :func:`announce` goes to ``reporter``, each distinct message once."""
    old = os.environ.get(NOTICES_ENV)
    os.environ[NOTICES_ENV] = "1"
    _reporter.append(reporter)
    _said.append(set())
    try:
        yield
    finally:
        _reporter.pop()
        _said.pop()
        if old is None:
            os.environ.pop(NOTICES_ENV, None)
        else:
            os.environ[NOTICES_ENV] = old
