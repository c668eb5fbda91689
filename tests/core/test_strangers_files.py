"""Files from strangers and interrupted runs (non-negotiable 3): data files cut short or of the wrong shape, run
folders edited by hand. Every problem is one line with exit code 2; nothing is unpickled."""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np
import pytest

from dpaudit.data import load_dataset, read_member_indices
from dpaudit.errors import DataError, InputError

X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int64)


def _npy(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


@pytest.mark.parametrize(
    ("x", "y", "message"), [(np.float32(3), Y, "X must hold one row"), (X, np.int64(1), "y must hold one row")]
)
def test_a_single_value_for_x_or_y_is_one_line(tmp_path, x, y, message):
    """np.savez(f, X=..., y=3): was an IndexError (exit 3, 'tuple index out of range')."""
    np.savez(tmp_path / "d.npz", X=x, y=y)
    with pytest.raises(DataError, match=f"{message} per record, got a single value"):
        load_dataset(str(tmp_path / "d.npz"))


def test_a_data_file_cut_short_is_not_called_a_pickle(tmp_path):
    """A copy or download interrupted midway: numpy's ValueError was reported as 'object arrays are refused'
    (NPY directory, NPZ member, member list), which sent the user looking for a pickle that is not there."""
    d = tmp_path / "dir"
    d.mkdir()
    (d / "X.npy").write_bytes(_npy(X)[:-100])  # X is memory-mapped: "mmap length is greater than file size"
    np.save(d / "y.npy", Y)
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        z.writestr("X.npy", _npy(X)[:-100])
        z.writestr("y.npy", _npy(Y))
    (tmp_path / "members.npy").write_bytes(_npy(np.arange(20))[:-8])
    for load in (
        lambda: load_dataset(str(d)),
        lambda: load_dataset(str(tmp_path / "short.npz")),
        lambda: read_member_indices(tmp_path / "members.npy", 40),
    ):
        with pytest.raises(DataError, match="truncated or corrupt") as e:
            load()
        assert "pickle" not in str(e.value) and "object arrays" not in str(e.value)
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", np.array(list(Y), dtype=object), allow_pickle=True)  # a real object array: still said so
    with pytest.raises(DataError, match="object arrays are refused"):
        load_dataset(str(d))


def test_weights_or_members_put_in_a_run_by_hand_are_refused(tmp_path):
    """A DP run's model.safetensors replaced by a non-private model's (same spec, same data): every command read
    the run's claim (ε = 2), metrics and members beside the other weights; `dpaudit report` reported the
    non-private model's membership leak under the DP run's name, claim and recorded accuracy. An edited
    split.npz (members and non-members swapped) likewise. Both now refused naming the file; a run copied without
    its manifest is not checked (nothing to compare with)."""
    import shutil

    from dpaudit.checkpoint import SPLIT_FILE, WEIGHTS_FILE, load_run
    from dpaudit.errors import CheckpointError
    from dpaudit.fileio import MANIFEST
    from tests.core.cli_errors import invoke

    args = ["--data", "synthetic:n=200,d=4", "--model", "logreg", "--algo", "sgd", "--epochs", 1, "--batch-size", 32]
    for name, seed in (("dp", 1), ("plain", 2)):  # two models of one spec on one data set (the claim aside)
        r = invoke("--quiet", "train", "--out", tmp_path / name, *args, "--seed", seed)
        assert r.exit_code == 0, r.output
    run = tmp_path / "dp"
    load_run(run)
    shutil.copy(tmp_path / "plain" / WEIGHTS_FILE, run / WEIGHTS_FILE)
    with pytest.raises(CheckpointError, match=f"{WEIGHTS_FILE} changed since the run was written.*dpaudit import"):
        load_run(run)
    r = invoke("audit", "checkpoint", run, "--attacks", "loss")
    assert r.exit_code == 2 and "changed since the run was written" in r.output, r.output
    (run / MANIFEST).unlink()  # no manifest: nothing recorded to compare with
    load_run(run)

    run = tmp_path / "plain"
    with np.load(run / SPLIT_FILE) as z:
        parts = {k: z[k] for k in z.files}
    parts["members"], parts["test"] = parts["test"], parts["members"]
    np.savez(run / SPLIT_FILE, **parts)
    with pytest.raises(CheckpointError, match=f"{SPLIT_FILE} changed since the run was written"):
        load_run(run)


@pytest.mark.parametrize("seed", [None, [], {}])
def test_a_canary_seed_of_the_wrong_type_is_one_line(tmp_path, seed):
    """checkpoint.json's canaries.seed edited to null, [] or {}: `audit checkpoint` stopped with a TypeError
    (exit 3)."""
    from dpaudit.canaries import CanarySet
    from dpaudit.errors import InputError

    np.savez(tmp_path / "canaries.npz", X=X[:4], y=Y[:4], included=np.ones(4, bool))
    assert len(CanarySet.load(tmp_path / "canaries.npz", {"kind": "mislabeled", "seed": 0})) == 4
    with pytest.raises(InputError, match="cannot read the canaries"):
        CanarySet.load(tmp_path / "canaries.npz", {"kind": "mislabeled", "seed": seed})


def test_a_whitebox_canary_count_of_the_wrong_type_is_one_line(tmp_path):
    """checkpoint.json's whitebox_canaries.m edited to [3]: a TypeError (exit 3) in `audit checkpoint`."""
    from dpaudit.checkpoint import Run
    from dpaudit.errors import CheckpointError

    np.savez(tmp_path / "wb.npz", scores=np.zeros(3), included=np.ones(3, bool))
    run = Run(path=tmp_path, meta={"whitebox_canaries": {"file": "wb.npz", "m": 3}}, spec=None, model=None, splits=None)
    assert run.whitebox_canaries()[0].shape == (3,)
    run.meta["whitebox_canaries"]["m"] = [3]
    with pytest.raises(CheckpointError, match=r"whitebox_canaries\.m: expected an integer"):
        run.whitebox_canaries()


# --------------------------------------------------------------------------- inputs that are not regular files

# What each kind of non-regular input is called (dpaudit.fileio.input_problem). Each was "no such file", "missing",
# "not a file" or "not a dpaudit run directory (no checkpoint.json)" before, depending on the reader: a named pipe in
# place of checkpoint.json read as a run without one.
NOT_A_FILE = {
    "fifo": "a named pipe (FIFO), not a regular file",
    "device": "a character device, not a regular file",
    "directory": "a directory, not a regular file",
    "socket": "a socket, not a regular file",
    "dangling": "no such file (a broken symbolic link to ",
    "loop": "a symbolic link loop, not a regular file",
}


def _plant(path, kind: str) -> None:
    """Put a ``kind`` of non-regular file at ``path`` (replacing what is there)."""
    import os
    import shutil
    import socket

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)  # opening it to read waits for a writer that never comes
    elif kind == "device":
        path.symlink_to("/dev/zero")  # reading it never ends
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))  # the socket file stays after it is closed
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")
    else:
        path.symlink_to(path.name)  # a link to itself


@pytest.fixture
def no_hang():
    """A reader that opens a named pipe or a device blocks for ever: fail the test instead."""
    import signal

    def hung(*_):
        raise AssertionError("the reader blocked on a non-regular file")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _readers():
    from dpaudit.data import load_dataset, read_member_indices
    from dpaudit.fileio import check_weights_file
    from dpaudit.models import read_model_spec
    from dpaudit.validation import read_json
    from dpaudit.workflows.scores import read_score_file

    return {
        "claim.json": read_json,  # claim, recipe, schedule JSON, canary designs: every untrusted JSON
        "model.safetensors": check_weights_file,
        "data.csv": lambda p: load_dataset(str(p), label_column="y"),
        "data.npz": lambda p: load_dataset(str(p)),
        "members.txt": lambda p: read_member_indices(p, 10),
        "scores.npz": read_score_file,
        "spec.json": read_model_spec,
    }


@pytest.mark.parametrize("kind", sorted(NOT_A_FILE))
@pytest.mark.parametrize("name", ["claim.json", "model.safetensors", "data.csv", "data.npz", "members.txt",
                                  "scores.npz", "spec.json"])  # fmt: skip
def test_an_input_that_is_not_a_regular_file_is_said_as_what_it_is(tmp_path, no_hang, name, kind):
    from dpaudit.errors import DPAuditError

    path = tmp_path / name
    _plant(path, kind)
    with pytest.raises(DPAuditError) as e:
        _readers()[name](path)
    if kind == "directory":  # some readers say what they expected instead; --data reads a folder of X.npy and y.npy
        assert str(e.value).startswith(f"{path}: ") and "directory" in str(e.value), str(e.value)
    else:
        assert str(e.value).startswith(f"{path}: {NOT_A_FILE[kind]}"), str(e.value)


def test_an_npy_data_folder_with_a_pipe_for_x_is_said_as_such(tmp_path, no_hang):
    d = tmp_path / "npy"
    d.mkdir()
    np.save(d / "y.npy", Y)
    _plant(d / "X.npy", "fifo")
    with pytest.raises(DataError, match=r"X\.npy: a named pipe \(FIFO\), not a regular file"):
        load_dataset(str(d))


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    from tests.core.cli_errors import invoke

    out = tmp_path_factory.mktemp("nonregular") / "run"
    args = ["--data", "synthetic:n=200,d=4", "--model", "logreg", "--algo", "sgd", "--epochs", 1, "--batch-size", 32]
    r = invoke("--quiet", "train", "--out", out, *args)
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("kind", ["fifo", "device", "dangling"])
@pytest.mark.parametrize("name", ["checkpoint.json", "split.npz", "model.safetensors"])
def test_a_run_file_that_is_not_a_regular_file_is_not_called_missing(small_run, tmp_path, no_hang, name, kind):
    """A named pipe in place of checkpoint.json was "not a dpaudit run directory (no checkpoint.json)", and one in
    place of split.npz "missing split.npz": the file is there, and is something else."""
    import shutil

    from tests.core.cli_errors import one_line_error

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    _plant(run / name, kind)
    line = one_line_error(
        "inspect" if name != "split.npz" else "audit", *(["checkpoint"] if name == "split.npz" else []), run
    )
    assert f"{run / name}: {NOT_A_FILE[kind]}" in line, line


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("fifo", "a named pipe (FIFO), not a"),
        ("device", "a character device, not a"),
        ("socket", "a socket, not a"),
        ("loop", "a symbolic link loop, not a"),
    ],
)
def test_a_run_folder_that_is_a_pipe_or_a_device_is_said_as_such(tmp_path, no_hang, kind, words):
    from tests.core.cli_errors import one_line_error

    run = tmp_path / "run"
    _plant(run, kind)
    assert f"{words} " in one_line_error("inspect", run)
    assert f"{words} run directory or a JSON file" in one_line_error("report", run, "--out", tmp_path / "r")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_the_library_readers_of_reports_and_scores_name_a_pipe_as_one(tmp_path):
    """load_report and load_scores (library calls, below the CLI's own check): a named pipe in place of report.json or
    a scores file is said to be one, never "no such report/scores file", and never opened (it would wait for a
    writer)."""
    from attacks.result import load_scores
    from dpaudit.report.build import load_report

    os.mkfifo(tmp_path / "report.json")
    os.mkfifo(tmp_path / "scores.npz")
    for read, arg in ((load_report, tmp_path), (load_scores, tmp_path / "scores.npz")):
        with pytest.raises(InputError, match=r"a named pipe \(FIFO\), not a regular file"):
            read(arg)
    with pytest.raises(InputError, match="no such file"):
        load_scores(tmp_path / "missing.npz")
