"""Outputs that cannot destroy data (issue 30): dpaudit replaces only what its manifest says it wrote,
refuses a folder holding anything else or an input of the command, locks an output while writing it,
rolls a forced replacement back, and turns the OS's errors into one line with exit code 2."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit import fileio
from dpaudit.cli.main import app
from dpaudit.errors import InputError, OutputError
from dpaudit.fileio import MANIFEST, check_output_dir, foreign_files, write_atomic_dir

runner = CliRunner()
FAST = ["--epochs", "1", "--batch-size", "64"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(r, code=2):
    lines = r.output.strip().splitlines()
    assert r.exit_code == code, r.output
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


def writer(files: dict[str, str]):
    def write(tmp: Path) -> None:
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)

    return write


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".dpaudit-" in p.name)


# --------------------------------------------------------------------------- manifest and --force


def test_manifest_lists_what_dpaudit_wrote_and_force_replaces_only_that(tmp_path):
    out = tmp_path / "out"
    write_atomic_dir(out, writer({"a.txt": "1", "sub/b.txt": "2"}), force=False)
    manifest = json.loads((out / MANIFEST).read_text())
    assert sorted(manifest["files"]) == ["a.txt", "sub/b.txt"]
    assert foreign_files(out) == []
    write_atomic_dir(out, writer({"c.txt": "3"}), force=True)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "c.txt"]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("plant", ["added", "changed", "no-manifest"])
def test_force_refuses_a_folder_with_foreign_files_and_names_them(tmp_path, plant):
    out = tmp_path / "out"
    write_atomic_dir(out, writer({"report.md": "ours"}), force=False)
    if plant == "added":
        (out / "NOTES.md").write_text("mine")
        name = "NOTES.md"
    elif plant == "changed":
        (out / "report.md").write_text("edited by the user")
        name = "report.md"
    else:
        (out / MANIFEST).unlink()
        name = "report.md"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(InputError, match=f"holds files dpaudit did not write \\({name}"):
        write_atomic_dir(out, writer({"x": "y"}), force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_train_force_into_the_working_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "thesis.tex").write_text("years of work")
    line = one_line_error(invoke("train", "--out", tmp_path, *FAST, "--force"))
    assert "working directory" in line
    assert (tmp_path / "thesis.tex").read_text() == "years of work"
    # An ancestor of the working directory as well, even an empty one.
    (tmp_path / "empty" / "inner").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "empty" / "inner")
    assert "working directory" in one_line_error(invoke("train", "--out", tmp_path / "empty", *FAST, "--force"))


def test_report_force_over_the_folder_of_its_input_is_refused(tmp_path):
    runs = tmp_path / "runs"
    assert invoke("train", "--out", runs / "mlp", *FAST).exit_code == 0
    files = sorted(p.relative_to(runs) for p in runs.rglob("*"))
    line = one_line_error(invoke("report", runs / "mlp", "--out", runs, "--force", "--attacks", "loss"))
    assert "an input of this command" in line
    assert sorted(p.relative_to(runs) for p in runs.rglob("*")) == files
    # The run itself as --out: also an input.
    assert "an input" in one_line_error(
        invoke("report", runs / "mlp", "--out", runs / "mlp", "--force", "--attacks", "loss")
    )


def test_train_force_replaces_its_own_run(tmp_path):
    out = tmp_path / "run"
    assert invoke("train", "--out", out, *FAST).exit_code == 0
    assert (out / MANIFEST).is_file()
    assert invoke("train", "--out", out, *FAST, "--force").exit_code == 0
    (out / "mine.txt").write_text("keep")
    assert "mine.txt" in one_line_error(invoke("train", "--out", out, *FAST, "--force"))
    assert (out / "mine.txt").read_text() == "keep"


# --------------------------------------------------------------------------- the demo's rerun


def fake_demo_output(out: Path) -> None:
    write_atomic_dir(
        out, writer({"report.json": "{}", "runs/dp/checkpoint.json": "{}"}), force=False, written_by="demo"
    )


def test_demo_rerun_refuses_a_user_file_in_its_output(tmp_path):
    out = tmp_path / "d"
    fake_demo_output(out)
    (out / "NOTES.md").write_text("mine")
    line = one_line_error(invoke("demo", "--quick", "--out", out))
    assert "NOTES.md" in line
    assert (out / "NOTES.md").read_text() == "mine" and (out / "report.json").is_file()


def test_demo_rerun_refuses_a_run_trained_into_its_output(tmp_path):
    out = tmp_path / "d"
    fake_demo_output(out)
    write_atomic_dir(out / "runs" / "mine", writer({"checkpoint.json": "{}"}), force=False)
    line = one_line_error(invoke("demo", "--quick", "--out", out))
    assert "runs/mine/checkpoint.json" in line
    assert (out / "runs" / "mine" / "checkpoint.json").is_file()


@pytest.mark.parametrize("marker", [".dpaudit-demo", MANIFEST])
def test_a_copied_marker_does_not_make_a_folder_deletable(tmp_path, marker):
    demo_out = tmp_path / "d"
    fake_demo_output(demo_out)
    (demo_out / ".dpaudit-demo").write_text("an old demo's marker")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("a,b\n1,2\n")
    shutil.copy(demo_out / marker, mine / marker)
    r = invoke("demo", "--quick", "--out", mine)
    assert r.exit_code == 2, r.output
    assert (mine / "data.csv").read_text() == "a,b\n1,2\n"


# --------------------------------------------------------------------------- final check, lock, rollback


def test_an_output_created_during_the_work_is_not_replaced(tmp_path):
    out = tmp_path / "out"

    def slow_write(tmp: Path) -> None:
        (tmp / "report.md").write_text("new")
        out.mkdir()  # the user creates the folder while dpaudit works
        (out / "mine.txt").write_text("keep")

    with pytest.raises(InputError, match="already exists"):
        write_atomic_dir(out, slow_write, force=False)
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    assert leftovers(tmp_path) == []


def test_a_second_writer_of_the_same_output_is_refused_while_the_first_works(tmp_path):
    out = tmp_path / "out"
    seen = {}

    def write(tmp: Path) -> None:
        try:
            write_atomic_dir(out, writer({"b": "2"}), force=False)
        except InputError as e:
            seen["error"] = str(e)
        (tmp / "a").write_text("1")

    write_atomic_dir(out, write, force=False)
    assert "being written by another dpaudit process" in seen["error"]
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "a"]
    assert leftovers(tmp_path) == []


def test_a_stale_lock_of_a_dead_writer_is_taken_over(tmp_path):
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".out.dpaudit-lock").write_text(dead.stdout)
    write_atomic_dir(out, writer({"a": "1"}), force=False)
    assert (out / "a").read_text() == "1" and leftovers(tmp_path) == []


def test_two_writers_taking_over_one_stale_lock_do_not_both_hold_it(tmp_path, monkeypatch):
    """Two CI jobs started together on an output whose lock a killed run left: both read the dead pid; the first
    removed the stale lock and made its own, then the second removed that one (believing it still the stale one)
    and made its own, and both wrote the output at once (each cleared the other's temporary folder as a killed
    writer's leftover). Forced here: the second job's takeover runs inside the first's check of the dead pid.
    The lock is now held by the kernel (flock), released when its holder dies, so the second job is refused."""
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".out.dpaudit-lock").write_text(dead.stdout)
    real_alive, second, holders = fileio._pid_alive, [], []

    def alive(pid: int) -> bool:
        if pid == int(dead.stdout) and not second:  # the first job checks the dead pid; the second one starts now
            second.append(fileio.output_lock(out))
            try:
                second[0].__enter__()
                holders.append("second")
            except InputError:
                second[0] = None
        return real_alive(pid)

    monkeypatch.setattr(fileio, "_pid_alive", alive)
    try:
        with fileio.output_lock(out):
            holders.append("first")
    except InputError as e:
        assert "being written by another dpaudit process" in str(e)
    finally:
        if second and second[0] is not None:
            second[0].__exit__(None, None, None)
    assert len(holders) == 1, holders  # one of them writes, the other is refused (exit 2)
    assert not (tmp_path / ".out.dpaudit-lock").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="no flock: the lock is the pid alone")
def test_a_lock_held_by_a_writer_on_another_host_is_not_taken_for_stale(tmp_path):
    """A cache or output folder on NFS shared by two CI runners: the writer on the other runner records its pid,
    which names no process here. The lock was taken for a dead writer's and taken over (two writers of one output,
    each removing the other's temporary folder). The lock is the file system's now: held, it is refused."""
    import fcntl

    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = tmp_path / ".out.dpaudit-lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other host's writer, at work
        os.write(fd, dead.stdout.encode())
        with pytest.raises(InputError, match=f"being written by another dpaudit process \\(pid {int(dead.stdout)}\\)"):
            write_atomic_dir(out, writer({"a": "1"}), force=False)
        assert lock.exists() and not out.exists()
    finally:
        os.close(fd)
    write_atomic_dir(out, writer({"a": "1"}), force=False)  # released: written
    assert (out / "a").read_text() == "1" and leftovers(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="no flock: the lock is the pid alone")
def test_waiting_for_a_writer_on_another_host_waits_until_it_is_done(tmp_path, monkeypatch):
    """Two CI runners training the same reference model into one cache on NFS: the one that found the entry being
    saved waits for the writer (fileio.wait_for_writer) and uses its entry. The writer's pid names no process on
    this host, so the wait returned at once and the run failed with 'being written by another dpaudit process'.
    It now waits while the lock is held (the poll's sleep, here, releases it)."""
    import fcntl
    import time

    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    fd = os.open(tmp_path / ".out.dpaudit-lock", os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other host's writer, at work
    os.write(fd, dead.stdout.encode())
    polls = []

    def poll(_s: float) -> None:  # the other host's writer finishes during the first poll
        polls.append(1)
        (tmp_path / ".out.dpaudit-lock").unlink()
        os.close(fd)

    monkeypatch.setattr(time, "sleep", poll)
    fileio.wait_for_writer(out, timeout_s=3600.0)
    assert polls == [1]


@pytest.mark.skipif(sys.platform == "win32", reason="no flock: the pid alone")
def test_the_temporary_file_of_a_writer_on_another_host_is_not_removed_as_a_dead_writers(tmp_path):
    """Two CI runners writing the same file on NFS (a cache entry's logits): each write first removes the temporary
    files of dead writers, told by their pid, and the pid of the other host's writer names no process here: its
    file was removed under it and its rename failed ('cannot write ...: No such file or directory', exit 2). A
    writer holds its temporary file's flock until the rename: a held file is a live writer's, and kept."""
    import fcntl

    from dpaudit.fileio import write_atomic_file

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    theirs = tmp_path / f".logits.npy.{int(dead.stdout)}.abcd_123.dpaudit-tmp"
    with open(theirs, "wb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other host's writer, at work
        write_atomic_file(tmp_path / "logits.npy", b"mine", force=True)
        assert theirs.exists()
    write_atomic_file(tmp_path / "logits.npy", b"mine", force=True)  # released without a rename: a dead one's
    assert not theirs.exists() and (tmp_path / "logits.npy").read_bytes() == b"mine"


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, OSError])
def test_an_interrupted_forced_replacement_leaves_the_old_output_in_place(tmp_path, monkeypatch, interrupt):
    out = tmp_path / "out"
    write_atomic_dir(out, writer({"old.txt": "old"}), force=False)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # between moving the old output aside and moving the new one in
            raise interrupt()
        return real_replace(src, dst)

    monkeypatch.setattr(fileio.os, "replace", replace)
    with pytest.raises((KeyboardInterrupt, OutputError)):
        write_atomic_dir(out, writer({"new.txt": "new"}), force=True)
    assert len(calls) >= 2
    assert (out / "old.txt").read_text() == "old" and not (out / "new.txt").exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("after", [1, 2])
def test_an_interrupt_just_after_a_rename_leaves_one_complete_output_and_no_aside(tmp_path, monkeypatch, after):
    """SIGINT (or SIGTERM, which the CLI raises the same way) lands as soon as a rename returns. Right after the
    old output was moved aside, the first rename was outside the rollback: the run folder was gone (exit 130,
    'interrupted'; `dpaudit report RUN` said 'no such run directory') until the next write of the same output."""
    out = tmp_path / "out"
    write_atomic_dir(out, writer({"old.txt": "old"}), force=False)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append((src, dst))
        real_replace(src, dst)
        if len(calls) == after:
            raise KeyboardInterrupt

    monkeypatch.setattr(fileio.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        write_atomic_dir(out, writer({"new.txt": "new"}), force=True)
    kept = "old.txt" if after == 1 else "new.txt"  # after the second rename the new output is complete and in place
    assert sorted(p.name for p in out.iterdir()) == sorted([kept, fileio.MANIFEST])
    assert leftovers(tmp_path) == []


def test_a_killed_replacement_is_restored_and_temporary_folders_removed_by_the_next_run(tmp_path):
    out = tmp_path / "out"
    write_atomic_dir(out, writer({"old.txt": "old"}), force=False)
    # What SIGKILL between the two renames leaves: the old output aside, the new one half-written.
    aside = Path(tempfile.mkdtemp(prefix=".out.", suffix=".dpaudit-old", dir=tmp_path))
    os.replace(out, aside / "old")
    Path(tempfile.mkdtemp(prefix=".out.", suffix=".dpaudit-tmp", dir=tmp_path))
    (tmp_path / ".outx.12345678.dpaudit-tmp").mkdir()  # another output's: left alone
    with pytest.raises(InputError, match="already exists"):
        write_atomic_dir(out, writer({"new.txt": "new"}), force=False)
    assert (out / "old.txt").read_text() == "old"
    assert leftovers(tmp_path) == [".outx.12345678.dpaudit-tmp"]


# --------------------------------------------------------------------------- environment errors


def test_disk_full_is_one_line_naming_the_users_path(tmp_path, monkeypatch):
    import safetensors.torch

    def full(state, filename, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    out = tmp_path / "run"
    line = one_line_error(invoke("--quiet", "train", "--out", out, *FAST))
    assert f"cannot write {out}: no space left on device ({out}/model.safetensors)" in line
    assert "dpaudit-tmp" not in line and not out.exists() and leftovers(tmp_path) == []


def test_read_only_and_unwritable_outputs_are_refused_before_the_work(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio.os, "access", lambda p, mode: False)  # tests run as root: simulate
    trained = []
    monkeypatch.setattr("dpaudit.training.run.fit_model", lambda *a, **k: trained.append(1))
    line = one_line_error(invoke("train", "--out", tmp_path / "run", *FAST))
    assert "is not writable" in line and trained == []


def test_read_only_file_system_at_the_final_write_is_exit_2(tmp_path, monkeypatch):
    def rofs(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(fileio.tempfile, "mkdtemp", rofs)
    with pytest.raises(OutputError, match=f"cannot write {tmp_path / 'out'}: Read-only file system"):
        write_atomic_dir(tmp_path / "out", writer({"a": "1"}), force=False)


def test_check_writable_parent_asks_for_write_and_search_and_names_the_file_systems_reason(tmp_path, monkeypatch):
    """The nearest existing ancestor must be enterable (X) and writable (W); then the file system itself is asked (an
    unnamed file), and its refusal is named: ENOSPC as "no space left on device", else the OS's words, else the
    error's type. Planted: access() asked for W or X alone, the unnamed file not made, ENOSPC's test negated, the
    reason `strerror and type` -> fails."""
    import re

    out = tmp_path / "a" / "b" / "run"  # nearest existing ancestor: tmp_path
    fileio.check_writable_parent(out)
    fileio.check_writable_parent(str(out))  # a str path, as Path
    real_access = fileio.os.access
    for denied in (os.W_OK, os.X_OK):  # tests run as root: simulate a folder without write, then without search
        monkeypatch.setattr(fileio.os, "access", lambda p, mode, denied=denied: not mode & denied)
        with pytest.raises(OutputError, match=re.escape(f"cannot write {out}: {tmp_path} is not writable")):
            fileio.check_writable_parent(out)
    monkeypatch.setattr(fileio.os, "access", real_access)
    for error, reason in (
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
        (OSError(errno.EROFS, "Read-only file system"), "Read-only file system"),
        (OSError(), "OSError"),
    ):

        def refuse(*a, error=error, **k):
            raise error

        monkeypatch.setattr(fileio.tempfile, "TemporaryFile", refuse)
        with pytest.raises(OutputError) as e:
            fileio.check_writable_parent(out)
        assert str(e.value) == f"cannot write {out}: {tmp_path} accepts no new file ({reason})"
    monkeypatch.undo()
    if Path("/proc/self").is_dir():  # a real file system that refuses every new file (root passes access())
        with pytest.raises(OutputError, match=r"^cannot write /proc/dpaudit-x: /proc (accepts no new|is not writable)"):
            fileio.check_writable_parent(Path("/proc/dpaudit-x"))
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind


def test_a_parent_that_is_a_file_is_exit_2(tmp_path):
    (tmp_path / "file").write_text("x")
    line = one_line_error(invoke("train", "--out", tmp_path / "file" / "run", *FAST))
    assert "is not a directory" in line
    with pytest.raises(InputError, match="exists and is not a directory"):
        check_output_dir(tmp_path / "file", force=True)


def test_outputs_get_an_ordinary_folders_mode(tmp_path):
    old = os.umask(0o022)
    try:
        out = write_atomic_dir(tmp_path / "out", writer({"a": "1"}), force=False)
    finally:
        os.umask(old)
    assert oct(out.stat().st_mode & 0o777) == "0o755"  # a shared cache entry is readable, not writable, by others


def test_files_get_an_ordinary_files_mode(tmp_path):
    # safetensors' save_file and mkstemp create owner-only (0600) files; a run's weights and a report must
    # read like the JSON beside them (0666 less the umask), not locked to their writer.
    from safetensors.numpy import save_file

    def write(tmp: Path) -> None:
        save_file({"w": np.zeros(2, dtype="float32")}, str(tmp / "model.safetensors"))
        (tmp / "sub").mkdir()
        fd, _ = tempfile.mkstemp(dir=tmp / "sub")
        os.close(fd)

    old = os.umask(0o022)
    try:
        out = write_atomic_dir(tmp_path / "out", write, force=False)
        single = fileio.write_atomic_file(tmp_path / "report.md", "# r\n", force=False)
    finally:
        os.umask(old)
    files = [p for p in out.rglob("*") if p.is_file()] + [single]
    assert len(files) == 4  # weights, mkstemp file, manifest, report
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o644"}


def test_sigterm_while_writing_rolls_back_as_ctrl_c_does(tmp_path, monkeypatch):
    """SIGTERM (a scheduler's or `timeout`'s stop) ended the process on the spot: a forced replacement stopped
    between its renames left the output gone (moved aside) and a half-written temporary folder and a lock beside
    it, until the next write of the same output. Now it is raised as Ctrl-C is: exit 143, the old output in
    place, nothing left beside it, and the handler put back after the command."""
    import signal

    out = write_atomic_dir(tmp_path / "canaries", writer({"old.txt": "old"}), force=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_replace, calls = os.replace, []

    def replace(src, dst):  # SIGTERM lands right after the old output was moved aside
        calls.append(dst)
        real_replace(src, dst)
        if len(calls) == 1:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # the old code: the signal would end pytest
                raise AssertionError("SIGTERM is not handled while dpaudit writes an output")
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(fileio.os, "replace", replace)
    r = invoke("canaries", "make", "--data", "synthetic:n=60,d=3", "--count", 4, "--out", out, "--force")
    assert r.exit_code == 143 and r.output.strip() == "terminated", r.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_handler_of_the_embedding_program_is_kept_while_a_command_runs(tmp_path, monkeypatch):
    """The CLI raises SIGTERM as Ctrl-C only where nobody else handles it: a program that runs dpaudit's app
    in-process with a SIGTERM handler of its own keeps that handler during the command and after it."""
    import signal

    def own(signum, frame):  # the embedding program's handler
        pass

    seen, real_replace = [], os.replace

    def replace(src, dst):
        seen.append(signal.getsignal(signal.SIGTERM))
        return real_replace(src, dst)

    previous = signal.signal(signal.SIGTERM, own)
    try:
        monkeypatch.setattr(fileio.os, "replace", replace)
        r = invoke("canaries", "make", "--data", "synthetic:n=60,d=3", "--count", 4, "--out", tmp_path / "c")
        assert r.exit_code == 0, r.output
        assert seen and all(h is own for h in seen)
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_failed_replacement_beside_a_foreign_output_keeps_the_old_output_aside(tmp_path, monkeypatch):
    """When moving the new output in fails and something else already sits at the output's path (another
    program wrote there between the renames), the old output cannot be moved back: it stays in its aside
    folder, never deleted with the temporary one."""
    out = tmp_path / "out"
    write_atomic_dir(out, writer({"old.txt": "old"}), force=False)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the new output's rename: a foreign folder appeared at the output's path
            Path(dst).mkdir()
            (Path(dst) / "theirs.txt").write_text("theirs")
            raise OSError(errno.ENOTEMPTY, "Directory not empty")
        return real_replace(src, dst)

    monkeypatch.setattr(fileio.os, "replace", replace)
    with pytest.raises((OSError, OutputError)):
        write_atomic_dir(out, writer({"new.txt": "new"}), force=True)
    assert (out / "theirs.txt").read_text() == "theirs"
    kept = [p for p in tmp_path.glob(".out.*.dpaudit-old") if (p / "old" / "old.txt").is_file()]
    assert len(kept) == 1 and (kept[0] / "old" / "old.txt").read_text() == "old"


def test_a_command_run_outside_the_main_thread_runs(tmp_path):
    """No SIGTERM handler can be set outside the main thread (signal.signal raises ValueError): a program that runs
    dpaudit's app from a worker thread still gets its command run, without the handler."""
    import signal
    import threading

    results = []
    args = ["canaries", "make", "--data", "synthetic:n=60,d=3", "--count", 4, "--out", tmp_path / "c"]
    thread = threading.Thread(target=lambda: results.append(invoke(*args)))
    thread.start()
    thread.join()
    assert results[0].exit_code == 0, results[0].output
    assert (tmp_path / "c").is_dir() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_symlink_at_the_output_path_is_refused_dangling_or_to_a_folder(tmp_path):
    """check_output_dir: a link at ``out`` (to a folder, or dangling: ``exists()`` follows it and says False) is never
    written through or replaced, with or without --force; a str path is taken as a Path (and returned as one), as
    check_output_file takes one."""
    from dpaudit.fileio import check_output_file

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    for name in ("link", "dangling"):
        for force in (False, True):
            with pytest.raises(InputError, match="exists and is not a directory"):
                check_output_dir(tmp_path / name, force=force)
    assert check_output_dir(str(tmp_path / "new"), force=False) == tmp_path / "new"
    assert check_output_dir(str(real), force=True) == real  # an empty folder: nothing foreign in it
    assert check_output_file(str(tmp_path / "f.json"), force=False) == tmp_path / "f.json"


def test_check_output_file_refuses_an_existing_file_without_force_a_folder_and_a_file_parent(tmp_path):
    """check_output_file, before any work: an existing file needs --force (then it is the caller's to replace), a
    folder at the path is refused either way, and a parent that is a file is an OutputError (exit code 2)."""
    from dpaudit.fileio import check_output_file

    f = tmp_path / "out.json"
    f.write_text("{}")
    with pytest.raises(InputError, match=r"out\.json already exists; use --force to overwrite it"):
        check_output_file(f, force=False)
    assert check_output_file(f, force=True) == f and f.read_text() == "{}"  # nothing written yet
    for force in (False, True):
        with pytest.raises(InputError, match="is a directory; expected a file path"):
            check_output_file(tmp_path, force=force)
        with pytest.raises(OutputError, match="is not a directory"):
            check_output_file(f / "x.json", force=force)


def test_load_safetensors_reads_the_same_tensors_under_a_utf8_and_a_non_utf8_folder(tmp_path):
    """fileio.load_safetensors: memory-mapped from an ordinary path, read as bytes from a folder whose name is not
    valid UTF-8 (the library refuses such a path as a Rust string); the same tensors either way, numpy or torch."""
    import torch
    from safetensors.numpy import save

    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1.5, -2.0])}
    data = save(arrays)
    for folder in (tmp_path / "plain", Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9"))):
        folder.mkdir()
        (folder / "x.safetensors").write_bytes(data)
        got = fileio.load_safetensors(folder / "x.safetensors", "numpy")
        assert sorted(got) == ["b", "w"] and all(np.array_equal(got[k], arrays[k]) for k in arrays)
        pt = fileio.load_safetensors(folder / "x.safetensors")
        assert all(torch.equal(pt[k], torch.from_numpy(arrays[k])) for k in arrays)


def test_a_manifest_that_is_a_link_unreadable_or_malformed_is_no_manifest(tmp_path):
    """read_manifest: only a regular file holding {"files": {path: sha256 string}} is dpaudit's record. A manifest that
    is a link (a user could point it at any record), not JSON, or without such a "files" map is None, so every file
    there, the manifest included, counts as foreign and --force refuses the folder."""
    from dpaudit.fileio import read_manifest, write_manifest

    d = tmp_path / "out"
    d.mkdir()
    (d / "a.txt").write_text("x")
    write_manifest(d, written_by="test")
    assert read_manifest(d)["files"].keys() == {"a.txt"} and foreign_files(d) == []
    real = shutil.move(d / MANIFEST, tmp_path / "elsewhere.json")
    (d / MANIFEST).symlink_to(real)
    assert read_manifest(d) is None and foreign_files(d) == [MANIFEST, "a.txt"]
    for text in ("{", '{"files": ["a.txt"]}', '{"files": {"a.txt": 1}}', "[]"):
        (d / MANIFEST).unlink()
        (d / MANIFEST).write_text(text)
        assert read_manifest(d) is None and foreign_files(d) == [MANIFEST, "a.txt"], text


def test_a_command_ends_the_worker_processes_it_started():
    """joblib's loky executor keeps its worker processes after a parallel job (``--workers 2``: PATE's teachers,
    reference models, audit runs); the interpreter's exit then waited for them, 6–10 s after the result was
    printed, and Ctrl-C in that wait printed loky's KeyboardInterrupt traceback with exit 0. A command now ends
    them before it returns."""
    from joblib import Parallel, delayed
    from joblib.externals.loky import reusable_executor

    from dpaudit.cli._common import App

    small = App()

    @small.command()
    def work() -> None:
        assert Parallel(n_jobs=2, backend="loky")(delayed(abs)(-i) for i in range(2)) == [0, 1]

    @small.command()
    def other() -> None:  # two commands: `work` stays a subcommand
        pass

    r = CliRunner().invoke(small, ["work"])
    assert r.exit_code == 0, r.output
    executor = reusable_executor._executor
    workers = list((getattr(executor, "_processes", None) or {}).values())
    assert not any(p.is_alive() for p in workers)


# --------------------------------------------------------------------------- several files as one output


def _set(tmp_path: Path) -> dict[Path, bytes]:
    return {tmp_path / f"s.{name}.npz": name.encode() for name in ("loss", "lira", "rmia")}


@pytest.mark.parametrize(
    ("failure", "at"),
    [(OSError, 1), (OSError, 2), (OSError, 3), (KeyboardInterrupt, 2), ("interrupt after", 1), ("interrupt after", 2)],
)
def test_a_set_of_files_is_replaced_all_or_nothing(tmp_path, monkeypatch, failure, at):
    """`attack mia --attacks A,B --scores-out F --force` wrote F.A and F.B one after another: an interrupt or a full
    disk between them left A's new scores beside B's old ones. Now every failure puts every file back."""
    from dpaudit.fileio import write_atomic_files

    old = {p: b"old " + data for p, data in _set(tmp_path).items()}
    write_atomic_files(old, force=False)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) == at and failure != "interrupt after":  # before the at-th rename
            raise failure(errno.ENOSPC, "No space left on device") if failure is OSError else failure()
        real_replace(src, dst)
        if len(calls) == at and failure == "interrupt after":  # as soon as the at-th rename returns
            raise KeyboardInterrupt

    monkeypatch.setattr(fileio.os, "replace", replace)
    with pytest.raises((KeyboardInterrupt, OutputError)) as e:
        write_atomic_files(_set(tmp_path), force=True)
    if failure is OSError:
        assert str(e.value).startswith(f"cannot write {tmp_path}/s.") and "no space left on device" in str(e.value)
    assert {p: p.read_bytes() for p in old} == old  # every file as it was: no mix of new and old
    assert leftovers(tmp_path) == []


def test_a_set_of_files_fails_whole_when_a_temporary_file_cannot_be_written(tmp_path, monkeypatch):
    from dpaudit.fileio import write_atomic_files

    real_mkstemp, calls = tempfile.mkstemp, []

    def mkstemp(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(fileio.tempfile, "mkstemp", mkstemp)
    with pytest.raises(OutputError, match="no space left on device"):
        write_atomic_files(_set(tmp_path), force=False)
    assert list(tmp_path.iterdir()) == []  # the first file's temporary removed, nothing written


def test_a_second_writer_of_the_same_set_of_files_is_refused(tmp_path):
    """Two `attack mia --scores-out F --force` at once: each file was atomic, the set not; a set could hold one
    process's A and the other's B. The second writer is refused while the first holds the set."""
    from dpaudit.errors import OutputBusyError
    from dpaudit.fileio import output_lock, write_atomic_files

    files = _set(tmp_path / "new folder ü")  # made as the files are written (the locks lie in it)
    write_atomic_files(files, force=False)
    assert {p: p.read_bytes() for p in files} == files and leftovers(tmp_path / "new folder ü") == []
    with output_lock(sorted(files)[1]), pytest.raises(OutputBusyError, match="being written by another"):
        write_atomic_files({p: b"theirs" for p in files}, force=True)
    assert {p: p.read_bytes() for p in files} == files and leftovers(tmp_path / "new folder ü") == []


def test_an_interrupt_as_a_single_files_rename_returns_keeps_the_new_file(tmp_path, monkeypatch):
    from dpaudit.fileio import write_atomic_file

    out = write_atomic_file(tmp_path / "s.npz", b"old", force=False)
    real_replace = os.replace

    def replace(src, dst):
        real_replace(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(fileio.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        write_atomic_file(out, b"new", force=True)
    assert out.read_bytes() == b"new" and leftovers(tmp_path) == []


def test_a_worker_process_ends_when_the_process_that_started_it_is_gone():
    """loky's workers of a `--workers 2` command SIGKILLed (or OOM-killed) waited 300 s for the next job, torch
    imported, and loky's semaphores and /dev/shm folders stayed until then. A worker now watches its parent: here
    one is told its parent is a process that is not its parent (as after the real one died), and ends."""
    code = "import time; from dpaudit.validation import _end_with_parent; _end_with_parent(-1, 0.05); time.sleep(600)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", code], env=env, timeout=60, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    code = "from dpaudit.validation import _end_with_parent; import os, time; _end_with_parent(os.getppid(), 0.05)"
    r = subprocess.run([sys.executable, "-c", code + "; time.sleep(0.5)"], env=env, timeout=60)
    assert r.returncode == 0  # a worker whose parent lives works on
    from dpaudit.validation import _end_with_parent, worker_pool

    backend = worker_pool(2)._backend  # every --workers pool starts its workers so
    assert backend.backend_kwargs == {"initializer": _end_with_parent, "initargs": (os.getpid(),)}


@pytest.mark.parametrize("size", [223, 250, 300])
def test_an_output_name_without_room_for_its_temporary_name_is_refused_before_the_work(tmp_path, size):
    """`attack mia --scores-out` with a 250-byte file name (the file system takes 255) attacked, then failed making
    `.NAME.PID.XXXXXXXX.dpaudit-tmp` ("File name too long", naming the temporary file). Now refused first."""
    from dpaudit.fileio import check_output_file, write_atomic_file

    out = tmp_path / ("n" * (size - 4) + ".npz")
    with pytest.raises(OutputError, match=rf"its name is {size} bytes long.*at most 222 bytes"):
        check_output_file(out, force=False)
    with pytest.raises(OutputError, match="at most 222 bytes"):
        check_output_dir(out, force=False)
    ok = tmp_path / ("é" * 109 + ".npz")  # 222 bytes in UTF-8
    assert write_atomic_file(ok, b"x", force=False).read_bytes() == b"x" and leftovers(tmp_path) == []


def test_a_full_disk_when_the_lock_is_taken_is_one_line_naming_the_output(tmp_path, monkeypatch):
    """On a full file system (a 64 KiB tmpfs) `train --force` and `attack mia --attacks A,B --scores-out` printed
    "error: No space left on device" with no path: the writer's pid in the lock file was an uncaught OSError."""
    out = tmp_path / "out"
    write_atomic_dir(out, writer({"old.txt": "old"}), force=False)

    def write(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio.os, "write", write)
    with pytest.raises(OutputError, match=rf"^cannot write {out}: no space left on device$"):
        write_atomic_dir(out, writer({"new.txt": "new"}), force=True)
    monkeypatch.undo()
    assert (out / "old.txt").read_text() == "old" and leftovers(tmp_path) == []


def test_an_output_file_that_is_a_pipe_or_a_device_is_never_replaced(tmp_path):
    """Run as root, `attack mia --scores-out /dev/stdout --force` (a user piping the scores) would have replaced
    the system's /dev/stdout link by a regular file; a named pipe at the path was replaced by a file too."""
    from dpaudit.fileio import check_output_file

    os.mkfifo(tmp_path / "pipe.csv")
    (tmp_path / "null.csv").symlink_to("/dev/null")
    for name, kind in (("pipe.csv", "a named pipe"), ("null.csv", "a link to a character device")):
        for force in (False, True):
            with pytest.raises(InputError, match=rf"is {kind}.*refusing to replace it"):
                check_output_file(tmp_path / name, force=force)
    (tmp_path / "file.csv").write_text("old")
    (tmp_path / "link.csv").symlink_to(tmp_path / "file.csv")
    assert check_output_file(tmp_path / "link.csv", force=True) == tmp_path / "link.csv"  # as before
