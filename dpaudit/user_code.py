"""Import a user's own object named ``"package.module:attr"``: the plug-in trainers (``--trainer``) and
the model factories of ``"kind": "python"`` specs share this one loader, and with it one trust rule:
importing runs the named module's code, as running the user's own script would.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

from dpaudit.errors import InputError

_IDENT = r"[A-Za-z_]\w*"
_PATH = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")


def first_line(e: BaseException) -> str:
    text = str(e).strip().split("\n", 1)[0].rstrip("\r")  # not splitlines(): a name may hold a mid-line \r
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def load_object(path: str, what: str, form: str) -> Any:
    """The object named by ``"package.module:attr"`` (``attr`` may be dotted), imported with the current
    directory at the front of ``sys.path`` (as ``python -m`` does). ``what`` names it in the one-line
    :class:`InputError` raised when the path is malformed (``form``: the expected shape), the module
    does not import (and why) or the attribute is missing. Importing runs the module's code: the user's
    own, trusted as a script they run (``--trainer``, a model spec's ``factory``)."""
    if not isinstance(path, str) or not _PATH.match(path.strip()):
        raise InputError(f"expected a {what} as {form}, got {path!r}")
    module_name, _, attr = path.strip().partition(":")
    cwd = os.getcwd()
    # At the front even when already on sys.path further back: the project's package must win over an
    # installed one of the same name. Only this entry is removed afterwards (the first occurrence).
    sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any failure of the user's module: missing, syntax error, error at import
        why = first_line(e) + _shadowed(module_name, e, cwd)
        raise InputError(f"{what} {path}: cannot import module {module_name!r} ({why})") from e
    finally:
        if cwd in sys.path:
            sys.path.remove(cwd)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{what} {path}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _shadowed(module_name: str, error: Exception, cwd: str) -> str:
    """A hint when the top-level package was found outside the current directory: another distribution
    may use its name (Opacus <= 1.6 installs a package called ``examples`` into site-packages)."""
    top = module_name.split(".")[0]
    found = getattr(sys.modules.get(top), "__file__", None)
    if not isinstance(error, ModuleNotFoundError) or top == module_name or not found:
        return ""
    if os.path.abspath(found).startswith(os.path.join(os.path.abspath(cwd), "")):
        return ""
    return f"; {top!r} was imported from {found}, not from the current directory"
