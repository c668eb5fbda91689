"""Where dpaudit caches what it can recompute (trained reference and shadow models).

The default follows the XDG base directory convention, never the current directory, so that running
an attack in a source tree leaves nothing behind: ``$DPAUDIT_CACHE_DIR`` if set, else
``$XDG_CACHE_HOME/dpaudit``, else ``~/.cache/dpaudit``. Every cache entry is keyed by a hash of what
produced it (see :func:`attacks.reference.model_key`), so a cache may be moved or deleted, and shared
with people you trust: every entry's files carry the sha256 written with them, verified on each read (a
changed entry is recomputed, with a warning). Entries are created with the user's umask (readable by
others under the usual 022, writable only by their owner). A missing entry is computed under its work lock
(:func:`dpaudit.fileio.work_lock`, a file beside the entry, never in it): processes sharing a cache compute each
entry once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from dpaudit.errors import InputError, IntegrityWarning
from dpaudit.fileio import (
    check_writable_parent,
    foreign_files,
    is_file_tmp_of,
    move_aside,
    sha256_bytes,
    sha256_file,
    write_atomic_file,
)

CACHE_DIR_ENV = "DPAUDIT_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$DPAUDIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/dpaudit``, else ``~/.cache/dpaudit`` (absolute).

    Read from the environment at each call (nothing is created here). Empty variables count as unset,
    and a relative ``$XDG_CACHE_HOME`` is ignored, as the XDG Base Directory specification says.
    """
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "dpaudit"
    return Path.home() / ".cache" / "dpaudit"


def resolve_cache_dir(cache_dir: Path | str | None) -> Path:
    """``cache_dir`` as a path, or :func:`default_cache_dir` when it is None."""
    return default_cache_dir() if cache_dir is None else Path(cache_dir)


def cache_for(
    cache_dir: Path | str | None, *, no_cache: bool = False, scheduler: str | None = None
) -> contextlib.AbstractContextManager[Path | str | None]:
    """The cache a command's reference and shadow models go to, checked now (before any work), entered later:
    ``cache_dir`` (None: :func:`default_cache_dir`), or with ``no_cache`` a temporary directory deleted on exit.
    ``scheduler``: a Dask scheduler's workers do not share this machine's temporary directory."""
    if no_cache and cache_dir is not None:
        raise InputError("give --cache-dir or --no-cache, not both")
    if no_cache and scheduler is not None:
        raise InputError(
            "--no-cache keeps models in a temporary directory of this machine, which Dask workers "
            "do not share; give --cache-dir on a filesystem they share instead"
        )
    if not no_cache:
        return contextlib.nullcontext(cache_dir)
    return _temporary_cache()


@contextlib.contextmanager
def _temporary_cache():
    with tempfile.TemporaryDirectory(prefix="dpaudit-cache-") as d:
        yield Path(d)


def check_cache_dir(cache_dir: Path | str) -> Path:
    """Refuse (one line, exit code 2) a cache directory that is a file or cannot be written, before any work."""
    path = Path(cache_dir)
    if path.exists() and not path.is_dir():
        raise InputError(f"cache_dir {path} is not a directory")
    check_writable_parent(path / "models")
    return path


# --------------------------------------------------------------------------- verified entries
#
# A cache entry is a directory written atomically by dpaudit (its manifest records every file's sha256,
# :mod:`dpaudit.fileio`) plus files added later, each with the sha256 written beside it
# (``NAME.sha256``). Reading an entry checks both: a file changed since it was written (bit rot, an edit,
# a partial copy) makes the entry untrusted, and the caller recomputes it with an IntegrityWarning.
# The hashes live in the entry itself: they catch corruption and an edit of one file, not someone who
# rewrites an entry together with its hashes (share a cache only with people you trust; README "Security").

HASH_SUFFIX = ".sha256"


def write_hashed_file(entry: Path, name: str, data: bytes) -> Path:
    """Write ``entry/name.sha256`` and ``entry/name`` (each atomically; the hash first).

    The hash first: a reader (another process sharing the cache) that comes in between finds the file missing,
    not yet written, and recomputes just it; with the file first it found the file without its hash and
    discarded the whole entry as untrusted (IntegrityWarning), under the writer."""
    entry = Path(entry)
    write_atomic_file(entry / (name + HASH_SUFFIX), sha256_bytes(data) + "\n", force=True)
    write_atomic_file(entry / name, data, force=True)
    return entry / name


def entry_problem(entry: Path, hashed: tuple[str, ...] = ()) -> str | None:
    """Why ``entry`` cannot be trusted (a file changed since it was written, a hashed file without its
    recorded hash or with another one), or None when it is intact. Missing hashed files are not a problem
    (the caller recomputes just them)."""
    entry = Path(entry)
    extra = set(hashed) | {h + HASH_SUFFIX for h in hashed}
    # The temporary file of an atomic write of a hashed file is dpaudit's own: another process writing it now,
    # or one killed while writing it (the next write of that file removes it). Neither makes the entry untrusted.
    changed = [f for f in foreign_files(entry) if f not in extra and not any(is_file_tmp_of(f, h) for h in extra)]
    if changed:
        return f"{', '.join(changed[:3])} changed since it was written"
    for name in hashed:
        f = entry / name
        if not f.exists():
            continue
        try:
            recorded = (entry / (name + HASH_SUFFIX)).read_text().strip()
        except OSError:
            return f"{name} has no recorded sha256"
        try:
            actual = sha256_file(f) if f.is_file() else None
        except OSError:  # removed meanwhile (another process discarding the entry): not to be trusted either
            actual = None
        if actual != recorded:
            return f"{name} does not match its recorded sha256"
    return None


def discard_entry(entry: Path, problem: str, seen: os.stat_result | None = None) -> None:
    """Warn (IntegrityWarning) that a cache entry is untrusted and remove it, so it is recomputed.

    ``seen``: the entry's ``os.stat`` from before it was checked. Another process sharing the cache may have
    discarded the same entry and saved a new one meanwhile (a directory renamed in): that one is not the entry
    found untrusted, and is left in place. The entry is first renamed aside (atomic: only one process moves a
    directory away), then removed; a writer killed meanwhile leaves a temporary sibling the next write removes."""
    entry = Path(entry)
    moved = move_aside(entry)
    if moved is None:  # gone (another process discarded it first), or it cannot be moved: removed where it is
        try:
            same = seen is None or os.path.samestat(seen, entry.stat())
        except OSError:
            return
        if same:
            _warn_untrusted(entry, problem)
            shutil.rmtree(entry, ignore_errors=True)
        return
    try:
        replaced = seen is not None and not os.path.samestat(seen, moved.stat())
    except OSError:
        replaced = False
    if replaced:  # another process's new entry: back in place (unless a third one saved one there meanwhile)
        with contextlib.suppress(OSError):
            os.rename(moved, entry)
    else:
        _warn_untrusted(entry, problem)
    shutil.rmtree(moved.parent, ignore_errors=True)


def _warn_untrusted(entry: Path, problem: str) -> None:
    warnings.warn(f"cache entry {entry} is untrusted ({problem}); recomputing it", IntegrityWarning, stacklevel=4)
