"""Safe outputs: a file or a directory appears complete or not at all, and dpaudit replaces only
what it wrote itself (no torch, no numpy).

Every output directory carries a manifest (``.dpaudit-manifest.json``) of the files dpaudit wrote
there, with their sha256. Replacing a directory (``--force``, or a demo rerunning into its own
output) is refused, with exit code 2 and the names of the files in question, when the directory
holds anything the manifest does not list (a file the user added, or one changed since), when an
input of the command lies inside it, or when it contains the working directory.

A directory is written into a hidden temporary sibling and renamed into place. While that happens a
lock file beside it (``.NAME.dpaudit-lock``, holding the writer's pid, locked with ``flock`` where the OS
has it, so a dead writer's lock is released by the kernel) keeps a second dpaudit process from writing the
same output; the checks are repeated under the lock right before the rename, so an
output created meanwhile (by the user or another run) is never replaced. A forced replacement moves
the old directory aside, renames the new one in, and only then deletes the old one: on a failure or
an interrupt in between the old directory is moved back, and a writer killed outright (SIGKILL)
leaves a hidden sibling that the next write of the same output restores or removes.

The same lock, on ``.NAME.dpaudit-work-lock`` (:func:`work_lock`), is held while what goes into an output is
computed (a cache entry's model trained): a second process needing it waits for the first and reads its result
instead of computing it too.

The OS's own errors (permission denied, read-only file system, disk full, a parent that is a file)
become :class:`~dpaudit.errors.OutputError` (exit code 2) naming the user's path, never a temporary
one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from dpaudit.errors import CheckpointError, InputError, OutputBusyError, OutputError

try:
    import fcntl
except ImportError:  # Windows: the lock is the pid alone
    fcntl = None  # type: ignore[assignment]

MANIFEST = ".dpaudit-manifest.json"
MANIFEST_VERSION = 1
_LOCK = ".dpaudit-lock"
_WORK_LOCK = ".dpaudit-work-lock"
_TMP = ".dpaudit-tmp"
_OLD = ".dpaudit-old"
_SHOWN = 3  # foreign files named in a refusal


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_safetensors(path: Path | str, framework: str = "pt") -> dict:
    """``safetensors.{torch,numpy}.load_file``, also for a path that is not valid UTF-8 (a folder named in
    another encoding: the library takes its path as a Rust string and refuses it, which read as a corrupt
    file); such a path is read as bytes instead of memory-mapped. Raises what the library raises."""
    if framework == "pt":
        from safetensors.torch import load, load_file
    else:
        from safetensors.numpy import load, load_file
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        return load(Path(path).read_bytes())
    return load_file(str(path))


# --------------------------------------------------------------------------- inputs

# What a path that is neither a regular file nor a directory is, by its mode (os.stat, so after links).
_SPECIAL = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _what_is(path: Path) -> str:
    """``"file"`` (a regular file, or a link to one), ``"directory"``, ``"missing"``, or the words saying what else
    ``path`` is ("a named pipe (FIFO)", "a symbolic link loop", ...). Asked of the path's status (``stat``), never by
    opening it: opening a named pipe waits for a writer that may never come, and a device such as /dev/zero or
    /dev/stdin never ends, so every input is asked here before anything reads it."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop"
        if e.errno == errno.ENOENT:
            try:
                return f"a broken symbolic link to {os.readlink(path)}"
            except OSError:
                return "missing"
        if e.errno == errno.ENOTDIR:  # a folder on its path is a file
            return "missing"
        return f"unreadable ({e.strerror or type(e).__name__})"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    return next((words for test, words in _SPECIAL if test(mode)), "a special file")


def _special_kind(path: Path) -> str | None:
    """What ``path`` is when it, or what it links to, is a named pipe, a device or a socket; else None."""
    for stat_of in (os.lstat, os.stat):
        try:
            mode = stat_of(path).st_mode
        except OSError:
            continue
        kind = next((words for test, words in _SPECIAL if test(mode)), None)
        if kind:
            return kind if stat_of is os.lstat else f"a link to {kind}"
    return None


def input_problem(path: Path | str, directory: bool = False) -> str | None:
    """Why ``path`` cannot be read as an input file (``directory``: an input folder), as the words that follow
    ``"PATH: "`` in a one-line refusal, or None when it can. Nothing is opened (see :func:`_what_is`): a named pipe,
    a device (/dev/zero, /dev/stdin), a socket, a broken link or a link loop is named as what it is, never read,
    and never reported as missing."""
    want = "directory" if directory else "file"
    what = _what_is(Path(path))
    if what == "missing":
        return f"no such {want}"
    if what.startswith("unreadable"):
        return f"cannot be read{what[len('unreadable') :]}"
    if what.startswith("a broken symbolic link"):
        return f"no such {want} ({what})"
    if what == want:
        access = os.R_OK | (os.X_OK if directory else 0)
        return None if os.access(path, access) else "cannot be read (permission denied)"
    other = {"file": "a file", "directory": "a directory"}.get(what, what)
    return f"{other}, not a {'directory' if directory else 'regular file'}"


def check_input_file(path: Path | str, *, error: type[Exception] = InputError) -> Path:
    """``path`` when it is a readable regular file (or a link to one); else one ``error`` line saying what it is
    (:func:`input_problem`), without opening it."""
    problem = input_problem(path)
    if problem:
        raise error(f"{path}: {problem}")
    return Path(path)


def check_weights_file(path: Path | str) -> Path:
    """``path`` as a weights file :func:`dpaudit.checkpoint.load_weights_file` can read, checked on the path
    alone (no torch: ``dpaudit import`` checks its WEIGHTS first, as a user reads the command, before its data):
    an existing regular file, safetensors or a torch state_dict (.pt, .pth, .bin); a pickle is refused
    (unpickling runs arbitrary code)."""
    path = check_input_file(path, error=CheckpointError)
    suffix = path.suffix.lower()
    if suffix in (".pkl", ".pickle", ".joblib"):
        raise CheckpointError(f"{path}: refusing to load a pickle file (it can run arbitrary code); use safetensors")
    if suffix not in (".safetensors", ".pt", ".pth", ".bin"):
        raise CheckpointError(
            f"{path}: unsupported weights file type {suffix!r}; use .safetensors (or a .pt state_dict)"
        )
    return path


# --------------------------------------------------------------------------- environment errors


def output_error(e: OSError, out: Path, tmp: Path | None = None) -> OutputError:
    """``e`` as one line naming ``out`` (a path inside the temporary ``tmp`` is shown inside ``out``)."""
    where = Path(e.filename) if e.filename else out
    if tmp is not None:
        with contextlib.suppress(ValueError):
            where = out / Path(where).relative_to(tmp)
    reason = e.strerror or os.strerror(e.errno or 0) or type(e).__name__
    if e.errno == errno.ENOSPC:
        reason = "no space left on device"
    return OutputError(f"cannot write {out}: {reason} ({where})" if where != out else f"cannot write {out}: {reason}")


# Bytes a temporary sibling's name adds to the output's: ".NAME.PID.XXXXXXXX.dpaudit-tmp" (a pid of up to 10 digits),
# more than a folder's ".NAME.XXXXXXXX.dpaudit-tmp" or a lock's ".NAME.dpaudit-work-lock".
_NAME_ROOM = 1 + 1 + 10 + 1 + 8 + len(_TMP)


def check_writable_parent(out: Path) -> None:
    """Refuse (OutputError) an output whose nearest existing ancestor is not a writable directory, or whose name
    leaves no room for its temporary sibling's (a name of 230 bytes was refused by the file system only when the
    temporary file was made, after the work)."""
    out = Path(out)
    anc = out.absolute().parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise OutputError(f"cannot write {out}: {anc} is not a directory")
    try:
        name_max = os.pathconf(anc, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # not told (Windows): the usual 255
        name_max = 255
    size = len(os.fsencode(out.name))
    if size + _NAME_ROOM > name_max:
        raise OutputError(
            f"cannot write {out}: its name is {size} bytes long, and it is written under a temporary name "
            f"{_NAME_ROOM} bytes longer first; use a name of at most {name_max - _NAME_ROOM} bytes"
        )
    if not os.access(anc, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {out}: {anc} is not writable (permission denied)")
    # access() answers for the permission bits only: root is "allowed" into /proc, /sys and other file systems
    # that refuse every new file, and would find out after the training. An unnamed file (O_TMPFILE on Linux;
    # elsewhere created and unlinked at once) asks the file system itself and leaves nothing behind.
    try:
        with tempfile.TemporaryFile(dir=anc):
            pass
    except OSError as e:
        reason = "no space left on device" if e.errno == errno.ENOSPC else e.strerror or type(e).__name__
        raise OutputError(f"cannot write {out}: {anc} accepts no new file ({reason})") from None


# --------------------------------------------------------------------------- manifests


def _files(root: Path) -> list[str]:
    """Every non-directory entry under ``root`` (files, links, pipes...), as sorted relative posix paths.
    Links are listed, never followed."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        links = [d for d in dirnames if (base / d).is_symlink()]
        for name in filenames + links:
            out.append((base / name).relative_to(root).as_posix())
    return sorted(out)


def write_manifest(directory: Path, *, written_by: str) -> None:
    """Record every file now in ``directory`` (with its sha256) as written by dpaudit (``written_by``:
    the command, e.g. ``"train"``)."""
    directory = Path(directory)
    files = {rel: sha256_file(directory / rel) for rel in _files(directory) if rel != MANIFEST}
    data = {"schema_version": MANIFEST_VERSION, "written_by": written_by, "files": files}
    (directory / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_manifest(directory: Path) -> dict | None:
    """The manifest of ``directory`` (``{"written_by": str, "files": {path: sha256}}``), or None when it has
    none or an unreadable one (then nothing there counts as dpaudit's)."""
    f = Path(directory) / MANIFEST
    if not f.is_file() or f.is_symlink():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return None
    return {"written_by": str(data.get("written_by", "")), "files": files}


def writer_of(directory: Path) -> str | None:
    """The command recorded in ``directory``'s manifest (e.g. ``"demo"``), or None."""
    m = read_manifest(directory)
    return m["written_by"] if m else None


def foreign_files(directory: Path) -> list[str]:
    """Files in ``directory`` that dpaudit did not write there: not in its manifest, changed since (other
    sha256), or not regular files. Empty directories do not count."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    recorded = manifest["files"] if manifest else {}
    foreign = []
    for rel in _files(directory):
        if rel == MANIFEST and manifest is not None:
            continue
        p = directory / rel
        if rel not in recorded or p.is_symlink() or not p.is_file() or _sha256_or_none(p) != recorded[rel]:
            foreign.append(rel)
    return foreign


def _sha256_or_none(path: Path) -> str | None:
    """The file's sha256, or None when it cannot be read, e.g. removed meanwhile by another process (a cache
    entry another process discards): a file that is not what was written."""
    try:
        return sha256_file(path)
    except OSError:
        return None


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def check_output_dir(out: Path, *, force: bool, inputs: Iterable[Path | str | None] = ()) -> Path:
    """Refuse, before any work, an output directory dpaudit may not write.

    A missing ``out`` needs a writable ancestor. An existing one needs ``force`` and may then hold
    only the files dpaudit wrote there (its manifest); it may hold neither an input of the command
    (``inputs``) nor the working directory. Raises InputError/OutputError with one line.
    """
    out = Path(out)
    check_writable_parent(out)
    if not (out.exists() or out.is_symlink()):
        return out
    if out.is_symlink() or not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    if not force:
        raise InputError(f"{out} already exists; use --force to overwrite it")
    real = out.resolve()
    if real == Path.cwd().resolve() or real in Path.cwd().resolve().parents:
        raise InputError(f"refusing to replace {out}: it contains the working directory")
    for p in inputs:
        if p is None or str(p) == "":
            continue
        rp = Path(p).resolve()
        if rp == real or real in rp.parents:
            raise InputError(
                f"refusing to replace {out}: it contains {p}, an input of this command; choose another --out"
            )
    foreign = foreign_files(out)
    if foreign:
        raise InputError(
            f"refusing to replace {out}: it holds files dpaudit did not write ({_listing(foreign)}); "
            "move them away or choose another --out"
        )
    return out


# --------------------------------------------------------------------------- lock and leftovers


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


@contextlib.contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold ``.NAME.dpaudit-lock`` beside ``out``, holding the writer's pid. A live holder means another dpaudit
    process writes ``out``: OutputBusyError (exit code 2).

    Where the OS has ``flock`` (Linux, macOS; on NFS the server's lock manager, so across hosts too) the lock
    is the kernel's, on the lock file, released when its holder dies however it dies: a lock file a killed run
    left is taken over atomically (two runs that found it at once took it over both, each removing the other's
    fresh lock as stale, and wrote the output together). Elsewhere: ``O_EXCL`` and the pid (a lock whose pid is
    dead is stale)."""
    out = Path(out)
    lock = _lock_path(out)
    with _holding(lock, _acquire(lock, out), out):
        yield


def _acquire(lock: Path, out: Path) -> int:
    """``lock``'s descriptor, taken (flock, else O_EXCL and the pid); OutputBusyError when a live process holds it."""
    fd = _take_lock(lock, out) if fcntl is not None else None
    return _take_lock_by_pid(lock, out) if fd is None else fd


@contextlib.contextmanager
def _holding(lock: Path, fd: int, out: Path) -> Iterator[None]:
    """Record this process's pid in the taken ``lock``; remove and release it on the way out, however it goes. A
    full disk refuses the pid's few bytes: one line naming ``out`` (it was an OSError without a path)."""
    try:
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as e:
            raise output_error(e, out) from None
        yield
    finally:
        lock.unlink(missing_ok=True)  # before the lock goes: a process that opened this file meanwhile retries
        os.close(fd)


@contextlib.contextmanager
def work_lock(out: Path, *, wait: bool = True, poll_s: float = 0.5) -> Iterator[bool]:
    """Hold ``.NAME.dpaudit-work-lock`` beside ``out`` while what goes into ``out`` is computed (a cache entry: check
    it, train its model, write it), so that a second dpaudit process (another CI job on the same cache, a Dask
    worker, another thread) that needs the same ``out`` does not compute it too. Yields True once held; with
    ``wait`` False, False at once (nothing held) when another process or thread holds it, else it waits (polls every
    ``poll_s``; Ctrl-C ends the wait, nothing held) until the holder is done: the caller then checks ``out`` again,
    and computes it itself only if the holder did not leave a good one (it died, or wrote an untrusted entry).

    The same lock as :func:`output_lock` (flock, released by the kernel when its holder dies however it dies; where
    there is no flock, the pid: a dead holder's lock is taken over), on a file of its own: ``out``'s write, inside
    the work, takes ``output_lock``. The file is removed when released and lies beside ``out``, never in it (a
    cache entry holds only what its manifest and hashes list). One work lock at a time: a process never waits for
    one while it holds another (no two processes can then wait for each other)."""
    import time

    out = Path(out)
    lock = out.parent / f".{out.name}{_WORK_LOCK}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(e, out) from None
    while True:
        try:
            fd = _acquire(lock, out)
            break
        except OutputBusyError:
            if not wait:
                fd = None
                break
        time.sleep(poll_s)
    if fd is None:
        yield False
        return
    with _holding(lock, fd, out):
        yield True


def work_lock_holder(out: Path) -> int:
    """The pid recorded in ``out``'s :func:`work_lock` (0: none, or not known)."""
    out = Path(out)
    return _lock_pid(out.parent / f".{out.name}{_WORK_LOCK}")


def _lock_pid(lock: Path) -> int:
    try:
        return int(lock.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _busy(out: Path, pid: int) -> OutputBusyError:
    return OutputBusyError(
        f"{out} is being written by another dpaudit process (pid {pid}); wait or choose another --out"
        if pid
        else f"{out} is being written by another dpaudit process ({_lock_path(out)}); wait for it"
    )


def _take_lock(lock: Path, out: Path) -> int | None:
    """The lock file's descriptor, locked (flock), or None where the file system has no locks."""
    for _ in range(8):  # another holder may unlink the file between our open and our lock: open it again
        foreign = False
        try:
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        except PermissionError as e:  # another user's lock file (0644): locked as it is, replaced when stale
            try:
                fd, foreign = os.open(lock, os.O_RDONLY), True
            except OSError:
                raise output_error(e, out) from None
        except OSError as e:
            raise output_error(e, out) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(out, _lock_pid(lock)) from None
        except OSError:  # no locks on this file system (ENOLCK, EOPNOTSUPP): the pid alone
            os.close(fd)
            return None
        try:
            st, mine = os.stat(lock), os.fstat(fd)
            current = (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
        except FileNotFoundError:
            current = False
        if not current:  # the holder released it (and removed the file) between our open and our lock
            os.close(fd)
            continue
        pid = _lock_pid(lock)
        if pid and pid != os.getpid() and _pid_alive(pid):  # written by a dpaudit without flock, still at work
            os.close(fd)
            raise _busy(out, pid)
        if foreign:  # a dead holder's, that we cannot write: removed while we hold it, and made anew
            with contextlib.suppress(OSError):
                lock.unlink()
            os.close(fd)
            continue
        return fd  # a lock file left by a dead holder is taken over here, atomically
    raise _busy(out, _lock_pid(lock))


def _take_lock_by_pid(lock: Path, out: Path) -> int:
    for _ in range(2):
        try:
            return os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            pid = _lock_pid(lock)
            if pid and _pid_alive(pid):
                raise _busy(out, pid) from None
            lock.unlink(missing_ok=True)  # stale: its writer died
        except OSError as e:
            raise output_error(e, out) from None
    raise _busy(out, 0)


def _lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}{_LOCK}"


def wait_for_writer(out: Path, *, timeout_s: float = 3600.0, poll_s: float = 0.5) -> None:
    """Wait until no live process holds ``out``'s lock (or ``timeout_s`` passed)."""
    import time

    lock, end = _lock_path(Path(out)), time.monotonic() + timeout_s
    while lock.exists() and time.monotonic() < end:
        held = _lock_held(lock)
        if held is None:  # no flock: the pid alone (which names no process here for a writer on another host)
            pid = _lock_pid(lock)
            held = not pid or _pid_alive(pid)
        if not held:
            return
        time.sleep(poll_s)


def _lock_held(lock: Path) -> bool | None:
    """Whether a process holds ``lock`` (flock; on NFS, one on any host), or None where there is no flock."""
    if fcntl is None:
        return None
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe, released at once
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


def _siblings(out: Path, kind: str) -> list[Path]:
    # mkdtemp(prefix=".NAME.", suffix=KIND) puts 8 random characters in between; nothing else matches.
    pattern = re.compile(r"\." + re.escape(out.name) + r"\.[A-Za-z0-9_]{8}" + re.escape(kind))
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return []
    return [p for p in entries if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]


def recover_leftovers(out: Path) -> None:
    """Under the lock: put back an old output a killed replacement left aside (when ``out`` is gone),
    and remove the temporary directories of killed writers of ``out``."""
    out = Path(out)
    for old in _siblings(out, _OLD):
        if (old / "old").is_dir() and not (out.exists() or out.is_symlink()):
            os.replace(old / "old", out)
        shutil.rmtree(old, ignore_errors=True)
    for tmp in _siblings(out, _TMP):
        shutil.rmtree(tmp, ignore_errors=True)


def move_aside(path: Path) -> Path | None:
    """Rename the directory ``path`` into a new temporary sibling folder (atomic: of several processes moving
    one directory away, one moves it) and return its new path, to be removed with its folder; None when ``path``
    is gone or cannot be moved. A process killed before removing it leaves a sibling that the next atomic
    write of ``path`` removes (:func:`recover_leftovers`)."""
    path = Path(path)
    try:
        aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=_TMP, dir=path.parent))
    except OSError:
        return None
    try:
        os.rename(path, aside / path.name)
    except OSError:
        shutil.rmtree(aside, ignore_errors=True)
        return None
    return aside / path.name


def _umask() -> int:
    """The process umask, read without changing it where Linux tells it (else set and restored)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and moved back on any failure."""
    if not out.exists():
        os.replace(tmp, out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=_OLD, dir=out.parent))
    try:
        # Inside the try: an interrupt (SIGINT, or SIGTERM through the CLI's handler) is raised as soon as a
        # rename returns, and one raised right after the first rename must move the old output back too.
        os.replace(out, aside / "old")
        os.replace(tmp, out)
    except BaseException:
        if not out.exists() and (aside / "old").is_dir():
            os.replace(aside / "old", out)  # roll back: the old output stays in place
        if not (aside / "old").exists() or not tmp.exists():  # the old output back in place, or the new one in
            shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)


# --------------------------------------------------------------------------- writers


def write_atomic_dir(
    out: Path,
    write: Callable[[Path], None],
    *,
    force: bool,
    inputs: Iterable[Path | str | None] = (),
    written_by: str = "dpaudit",
) -> Path:
    """Write a directory atomically: fill a temporary sibling, record its manifest, rename it into place.

    ``out`` must pass :func:`check_output_dir` both before ``write`` runs and again right before the
    rename (under the output's lock); a forced replacement is rolled back on any failure.
    """
    out = Path(out)
    inputs = list(inputs)
    check_output_dir(out, force=force, inputs=inputs)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(e, out) from None
    with output_lock(out):
        recover_leftovers(out)
        check_output_dir(out, force=force, inputs=inputs)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=_TMP, dir=out.parent))
            tmp.chmod(0o777 & ~_umask())  # mkdtemp is owner-only; the output gets an ordinary folder's mode
        except OSError as e:
            raise output_error(e, out) from None
        try:
            try:
                write(tmp)
                write_manifest(tmp, written_by=written_by)
                _ordinary_modes(tmp)
            except OSError as e:
                raise output_error(e, out, tmp) from None
            check_output_dir(out, force=force, inputs=inputs)  # again: it may have appeared meanwhile
            try:
                _swap_in(tmp, out)
            except OSError as e:
                raise output_error(e, out, tmp) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


_FILE_MODE = 0o666  # what open(path, "w") asks for; the umask takes its share


def _ordinary_modes(folder: Path) -> None:
    """Give every file written into ``folder`` the mode ``open(path, "w")`` would have given it: writers
    that go through a temporary file of their own (safetensors' ``save_file``, ``mkstemp``) leave it
    owner-only (0600), so a run's weights were unreadable to the group beside its 0644 JSON."""
    mode = _FILE_MODE & ~_umask()
    for p in folder.rglob("*"):
        if p.is_file() and not p.is_symlink():
            p.chmod(mode)


def check_output_file(path: Path, *, force: bool) -> Path:
    """Refuse, before any work, an output file that exists (unless ``force``), is a directory, is (or links to) a
    named pipe, a device or a socket (whatever ``force``: `--scores-out /dev/stdout --force` run as root replaced
    the system's /dev/stdout link with a regular file), or whose parent cannot be written."""
    path = Path(path)
    check_writable_parent(path)
    if path.is_dir():
        raise InputError(f"{path} is a directory; expected a file path")
    special = _special_kind(path)
    if special:
        raise InputError(f"{path} is {special}, not a file; refusing to replace it (give a file path)")
    if path.exists() and not force:
        raise InputError(f"{path} already exists; use --force to overwrite it")
    return path


def _file_tmp_pattern(name: str) -> re.Pattern[str]:
    # write_atomic_file's mkstemp(prefix=".NAME.PID.", suffix=_TMP): 8 random characters in between.
    return re.compile(r"\." + re.escape(name) + r"\.(\d+)\.[A-Za-z0-9_]{8}" + re.escape(_TMP))


def is_file_tmp_of(rel: str, name: str) -> bool:
    """Whether ``rel`` (a name in a folder) is the temporary file of an atomic write of ``name`` beside it:
    one in progress (another process's), or one a killed writer left (removed by the next write of ``name``)."""
    return _file_tmp_pattern(name).fullmatch(rel) is not None


def _remove_dead_writers_files(path: Path) -> None:
    """Remove the temporary siblings (``.NAME.PID.XXXXXXXX.dpaudit-tmp``) that writers of ``path`` killed
    outright (SIGKILL, power loss) left behind: those whose pid is no longer alive and that no process holds
    (a writer holds its file's flock until the rename: on a folder shared over NFS, a writer on another host,
    whose pid names no process here, is at work). A live writer's is kept."""
    pattern = _file_tmp_pattern(path.name)
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return
    for p in entries:
        m = pattern.fullmatch(p.name)
        if m and int(m[1]) != os.getpid() and not p.is_symlink() and p.is_file() and not _pid_alive(int(m[1])):
            _unlink_unless_held(p)


def _unlink_unless_held(p: Path) -> None:
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError:
        return
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while it is removed
            except BlockingIOError:
                return  # a live writer's (on another host)
            except OSError:
                pass  # no locks on this file system: the pid alone
        with contextlib.suppress(OSError):
            p.unlink()
    finally:
        os.close(fd)


def write_atomic_file(path: Path, data: bytes | str, *, force: bool) -> Path:
    """Write a file atomically (a temporary sibling, named with the writer's pid, renamed into place; the
    temporary files of killed writers of the same path are removed first)."""
    return write_atomic_files({Path(path): data}, force=force)[0]


def write_atomic_files(files: Mapping[Path, bytes | str], *, force: bool) -> list[Path]:
    """Write several files as one output (``attack mia --attacks A,B --scores-out F``: ``F.A.npz`` and ``F.B.npz``):
    each atomically as :func:`write_atomic_file` does, and the set all or nothing. Every file's content is written
    to its temporary sibling first, and only then are they renamed into place, one after another; an existing file
    is hard-linked aside first (copied where the file system has no links), so a failure or an interrupt (Ctrl-C,
    SIGTERM through the CLI) at any point puts every file back as it was: never a mix of new and old files.
    Several files are written under :func:`output_lock` of each (taken in sorted order), so a second dpaudit process
    writing the same set is refused (OutputBusyError), never interleaved with this one.

    What no process can undo: a writer killed outright (SIGKILL, power loss) between two renames of its
    microseconds-long rename phase leaves the files renamed so far new and the others old, the old content of those
    renamed beside them as dead writers' temporary files (``.NAME.PID.XXXXXXXX.dpaudit-tmp``), which the next write
    of the same paths removes."""
    paths = [Path(p) for p in files]
    for path in paths:
        check_output_file(path, force=force)
    with contextlib.ExitStack() as held:
        if len(paths) > 1:
            for path in paths:  # the locks lie beside the files
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise output_error(e, path) from None
            for path in sorted(paths):
                held.enter_context(output_lock(path))
            for path in paths:  # again under the locks: another process may have written one meanwhile
                check_output_file(path, force=force)
        temps: dict[Path, Path] = {}
        backups: dict[Path, Path] = {}
        try:
            for path, data in zip(paths, files.values(), strict=True):
                temps[path] = _write_temporary(path, data, held)
            if len(paths) > 1:
                for path in paths:
                    if path.exists():
                        backups[path] = _keep_aside(path)
            _rename_all(temps, backups)
        finally:
            for tmp in (*temps.values(), *backups.values()):
                tmp.unlink(missing_ok=True)
    return paths


def _write_temporary(path: Path, data: bytes | str, held: contextlib.ExitStack) -> Path:
    """``data`` in a new temporary sibling of ``path`` (the temporary files of killed writers of ``path`` removed
    first), flushed, with an ordinary file's mode; flock-held (where the OS has it) until ``held`` closes, so that it
    reads as a live writer's (:func:`_remove_dead_writers_files`)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_writers_files(path)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=_TMP, dir=path.parent)
    except OSError as e:
        raise output_error(e, path) from None
    tmp = Path(name)
    try:
        f = os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    try:
        with f:
            if fcntl is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.enter_context(os.fdopen(os.dup(f.fileno()), "rb"))  # the lock lives as long as this copy
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
        os.chmod(tmp, _FILE_MODE & ~_umask())  # mkstemp is owner-only: give the file an ordinary file's mode
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise output_error(e, path, tmp) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _keep_aside(path: Path) -> Path:
    """A copy of the existing ``path`` beside it under a temporary name of this writer (a hard link where the file
    system has them), to put back should the set's renames fail."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{_TMP}"
        try:
            os.link(path, tmp)
            return tmp
        except FileExistsError:
            continue
        except OSError as e:  # no hard links here (some network and FUSE file systems): a copy
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
                raise output_error(e, path) from None
            try:
                shutil.copyfile(path, tmp)
            except OSError as e2:
                tmp.unlink(missing_ok=True)
                raise output_error(e2, path) from None
            return tmp
    raise OutputError(f"cannot write {path}: no free temporary name beside it")


def _rename_all(temps: dict[Path, Path], backups: dict[Path, Path]) -> None:
    """Rename each temporary file onto its path; on any failure or interrupt, put back what was renamed so far (its
    old content from ``backups``, or nothing where there was none) and raise (an OSError as OutputError)."""
    done: list[Path] = []
    try:
        for path, tmp in temps.items():
            done.append(path)  # before the rename: an interrupt raised as it returns is rolled back too
            os.replace(tmp, path)
    except BaseException as e:
        for path in reversed(done if len(temps) > 1 else ()):  # one file: its rename is all or nothing already
            if temps[path].exists():  # not renamed
                continue
            if path in backups:
                os.replace(backups[path], path)
            else:
                path.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise output_error(e, done[-1], temps[done[-1]]) from None
        raise
