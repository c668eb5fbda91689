"""Where dpaudit caches what it can recompute (trained reference and shadow models).

The default follows the XDG base directory convention, never the current directory, so that running
an attack in a source tree leaves nothing behind: ``$DPAUDIT_CACHE_DIR`` if set, else
``$XDG_CACHE_HOME/dpaudit``, else ``~/.cache/dpaudit``. Every cache entry is keyed by a hash of what
produced it (see :func:`attacks.reference.model_key`), so a cache may be shared, moved or deleted.
"""

from __future__ import annotations

import os
from pathlib import Path

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
