"""Atomic writes: a file or a directory appears complete or not at all (no torch, no numpy).

Nothing existing is overwritten unless ``force``; with ``force`` the old content is replaced only
once the new one is complete, so a failure never leaves a half-written output behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from dpaudit.errors import InputError


def write_atomic_dir(out: Path, write: Callable[[Path], None], *, force: bool) -> Path:
    """Write a directory atomically: fill a temporary sibling, then rename it into place.

    An existing ``out`` is refused unless ``force``; with ``force`` it is replaced only after the
    new content is complete, so a failure never leaves a half-written directory behind.
    """
    out = Path(out)
    if out.exists() and not force:
        raise InputError(f"{out} already exists; use --force to overwrite it")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        if out.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, trash / "old")
            os.replace(tmp, out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def write_atomic_file(path: Path, data: bytes | str, *, force: bool) -> Path:
    path = Path(path)
    if path.exists() and not force:
        raise InputError(f"{path} already exists; use --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
