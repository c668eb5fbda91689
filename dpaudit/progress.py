"""Progress reporting that library code can use without knowing about terminals.

Library functions take ``progress: Progress | None``; the CLI passes a rich-backed reporter that
is silent under --quiet/--json or when stdout is not a TTY.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator


class Progress:
    """No-op progress reporter (the library default)."""

    @contextlib.contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        yield lambda n=1: None


class RichProgress(Progress):
    """Progress bars with ETA on stderr (rich)."""

    @contextlib.contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
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
            transient=False,
        ) as bar:
            tid = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(tid, n)


def make_progress(*, quiet: bool, json_output: bool) -> Progress:
    if quiet or json_output or not sys.stdout.isatty():
        return Progress()
    return RichProgress()


NULL_PROGRESS = Progress()
