"""Import a user's own object named ``"package.module:attr"``: the plug-in trainers (``--trainer``) and
the model factories of ``"kind": "python"`` specs share this one loader, and with it one trust rule:
importing runs the named module's code, as running the user's own script would.

A trainer is named on the command line; a model factory is named in a file (a spec, or a run's
``checkpoint.json``, which may come from a stranger), and loading the run imports it and calls it with
the file's kwargs. So a factory must be code of the user's own project (:func:`load_users_own`): a file
under the current directory or a folder on ``sys.path`` (``PYTHONPATH``), outside the standard library,
the installed packages, dpaudit itself and the run being loaded; else ``"subprocess:getoutput"`` with
``{"cmd": ...}`` in a stranger's run would run a shell command on ``dpaudit inspect``.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import os
import re
import site
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
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
    if _inside(os.path.abspath(found), os.path.abspath(cwd)):
        return ""
    return f"; {top!r} was imported from {found}, not from the current directory"


# Folders whose code a file's factory may never name: the run being loaded (a run names its factory, it does not
# bring it). Set by :func:`not_from`.
_NOT_FROM: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("dpaudit_not_from", default=())


@contextlib.contextmanager
def not_from(*folders: str | os.PathLike) -> Iterator[None]:
    """While inside, :func:`load_users_own` refuses code that lies in ``folders`` (e.g. a stranger's run folder
    unpacked in the user's project, holding a ``.py`` file that its ``checkpoint.json`` names)."""
    token = _NOT_FROM.set(_NOT_FROM.get() + tuple(os.path.realpath(f) for f in folders))
    try:
        yield
    finally:
        _NOT_FROM.reset(token)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(os.path.join(folder, ""))


def _library_folders() -> list[tuple[str, str]]:
    """Where Python's own and installed code lives (never the user's project), and dpaudit's own packages: pairs
    (folder, what it is), the most specific first."""
    import dpaudit

    paths = sysconfig.get_paths()
    found = [(str(Path(dpaudit.__file__).parent), "dpaudit itself")]
    attacks = sys.modules.get("attacks")
    if getattr(attacks, "__file__", None):
        found.append((str(Path(attacks.__file__).parent), "dpaudit itself"))
    installed = [paths.get("purelib"), paths.get("platlib")]
    installed += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    installed += [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    found += [(p, "an installed package") for p in installed if p]
    found += [(p, "the standard library") for p in (paths.get("stdlib"), paths.get("platstdlib")) if p]
    if sys.prefix != sys.base_prefix:  # a virtual environment: all of it is installed code, even inside a project
        found.append((sys.prefix, "a virtual environment"))
    return [(os.path.realpath(p), what) for p, what in found]


def _project_folders() -> list[str]:
    """Where the user's own modules are found: the current directory, and the folders on ``sys.path`` (``PYTHONPATH``
    entries, a project's editable install, a notebook's ``sys.path.append``); :func:`_foreign` checks the library
    folders among them first. A zip archive on ``sys.path`` (a zipped standard library) is not a folder of code."""
    return [os.path.realpath(p or ".") for p in (os.getcwd(), *sys.path) if os.path.isdir(p or ".")]


def _foreign(file: str | None) -> str | None:
    """Why ``file`` (a module's source) is not the user's own code, or None when it is."""
    if not file:
        return "is built into Python"
    real = os.path.realpath(file)
    for folder in _NOT_FROM.get():
        if _inside(real, folder):
            return f"is {file}, inside the run being loaded (a run names its factory, it does not bring it)"
    for folder, what in _library_folders():
        if _inside(real, folder):
            return f"is {file}, in {what}"
    if not any(_inside(real, folder) for folder in _project_folders()):
        return f"is {file}, outside the current directory and sys.path"
    return None


def load_users_own(path: str, what: str, form: str) -> Any:
    """:func:`load_object` for a name read from a file: before anything is imported, every module the import
    would run (each package's ``__init__`` on the way, then the module) must be a file of the user's own project
    (see the module docstring), and so must the module that defines the object found (``mymodels:os.system``
    reaches the standard library through the user's ``import os``). Finding a module runs none of its code.
    Raises :class:`InputError` (one line) naming the file that is not."""
    if not isinstance(path, str) or not _PATH.match(path.strip()):
        raise InputError(f"expected a {what} as {form}, got {path!r}")
    module_name = path.strip().partition(":")[0]
    parts = module_name.split(".")
    cwd = os.getcwd()
    sys.path.insert(0, cwd)  # as load_object finds it
    try:
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            try:
                spec = importlib.util.find_spec(name)  # imports the parent packages, already checked
            except (ImportError, ValueError):  # not found: load_object says why, importing nothing new
                spec = None
            if spec is None:
                break
            namespace = spec.origin is None and spec.submodule_search_locations is not None  # no code of its own
            why = None if namespace else _foreign(spec.origin if spec.has_location else None)
            if why:
                raise InputError(f"{what} {path}: module {name!r} {why}; {_OWN_CODE}")
    finally:
        if cwd in sys.path:
            sys.path.remove(cwd)
    obj = load_object(path, what, form)
    if not callable(obj):  # nothing will be called: the caller says what it is
        return obj
    defined_in = getattr(obj, "__module__", None)
    why = _foreign(getattr(sys.modules.get(defined_in or ""), "__file__", None))
    if why:
        raise InputError(f"{what} {path}: it is defined in module {defined_in!r}, which {why}; {_OWN_CODE}")
    return obj


_OWN_CODE = (
    "a factory named in a file (a spec, a run's checkpoint.json) is called with the file's kwargs, so only your "
    "own project's code is (a .py under the current directory or PYTHONPATH: write one there that builds the model)"
)
