"""Non-negotiables 3 and 7 over every command that writes something, in one table each.

Reproducible: every trainer (``train --algo ...``, both backends) and every command that writes a file
or prints JSON gives the same bytes twice from the same seed (CPU). Between the two runs the global
generators (python ``random``, numpy's legacy global state, torch's default generator) are put in
different states, so a draw that is not derived from the seed shows up as a difference.

Atomic and never overwritten without ``--force``: an existing output is refused (one line, exit code 2,
not a byte, inode or mtime changed); ``--force`` replaces it (a new inode: renamed into place); a
failure at the last moment (the rename into place) leaves the old output, or nothing, and no temporary
or lock file beside it.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from dpaudit.fileio import foreign_files, write_atomic_file
from tests.core.cli_errors import invoke, one_error

DATA = ["--data", "synthetic:n=200,d=6,classes=2"]
DP = ["--noise-multiplier", "1", "--steps", "2"]
BASE_DATA = ["--data", "synthetic:n=400,d=6,classes=2"]  # enough aux records for 4 LiRA reference models

# --------------------------------------------------------------------------- trainers

TRAINERS = {
    "sgd": ["--model", "mlp", "--hidden", "8", "--algo", "sgd", "--epochs", "1"],
    "adam": ["--model", "mlp", "--hidden", "8", "--algo", "adam", "--epochs", "1"],
    "dpsgd": ["--model", "mlp", "--hidden", "8", "--algo", "dpsgd", *DP],
    "dpsgd-shuffle-pld": ["--model", "logreg", "--algo", "dpsgd", *DP, "--sampling", "shuffle", "--accountant", "pld"],
    "dpsgd-canaries": ["--model", "logreg", "--algo", "dpsgd", *DP, "--canaries", "8", "--allow-inconclusive"],
    "dpsgd-whitebox": ["--model", "logreg", "--algo", "dpsgd", *DP, "--whitebox-canaries", "4", "--allow-inconclusive"],
    "dpadam": ["--model", "mlp", "--hidden", "8", "--algo", "dpadam", *DP],
    "dpsgd-jl": ["--model", "mlp", "--hidden", "8", "--algo", "dpsgd-jl", *DP, "--jl-projections", "2"],
    "dpadam-jl": ["--model", "logreg", "--algo", "dpadam-jl", *DP, "--jl-projections", "2"],
    "pate": [
        "--model",
        "logreg",
        "--algo",
        "pate",
        "--teachers",
        "3",
        "--queries",
        "10",
        "--sigma",
        "2",
        "--epochs",
        "1",
    ],
    "dp-icl": ["--algo", "dp-icl", "--teachers", "3", "--queries", "10", "--sigma", "2", "--shots", "2"],
    "outpert": ["--model", "logreg", "--algo", "outpert", "--epsilon", "2"],
    "objpert": ["--model", "logreg", "--algo", "objpert", "--epsilon", "2"],
    "dpagd": ["--model", "logreg", "--algo", "dpagd", "--epsilon", "2", "--steps", "3"],
    "cloak": ["--algo", "cloak", "--target", "{base}", "--lambda", "1", "--epochs", "1"],
    "jax-dpsgd": ["--model", "logreg", "--algo", "dpsgd", "--backend", "jax", *DP],
}


def _scramble_global_generators(seed: int) -> None:
    """Put every global generator in a state of ``seed``'s: a draw from one of them that is not derived
    from the command's --seed then differs between two runs."""
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (the legacy global state is what an unseeded draw reads)
    torch.manual_seed(seed)


def _tree(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _twice(tmp_path: Path, monkeypatch, args: list[str], out: str | None) -> tuple[list, list]:
    """Run ``dpaudit ARGS`` in two fresh folders (``out`` relative to each), the global generators put in
    different states; each run's (stdout, written bytes)."""
    results = []
    for i in (1, 2):
        cwd = tmp_path / f"run{i}"
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        _scramble_global_generators(i)
        r = invoke(*args)
        assert r.exit_code in (0, 1), r.output
        results.append((r.stdout, _tree(cwd / out) if out else {}))
    return results[0], results[1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A small non-private MLP (the cloak's target and the attacks' victim) and its member scores."""
    tmp = tmp_path_factory.mktemp("inputs")
    base = tmp / "base"
    r = invoke("--quiet", "train", "--out", base, *BASE_DATA, "--model", "mlp", "--hidden", "8", "--epochs", "2")
    assert r.exit_code == 0, r.output
    scores = tmp / "scores.csv"
    r = invoke("--quiet", "attack", "mia", base, "--attacks", "loss", "--bootstrap", "0", "--scores-out", scores)
    assert r.exit_code == 0, r.output
    members = tmp / "members.txt"
    with np.load(base / "split.npz") as z:
        members.write_text("\n".join(str(i) for i in z["members"]) + "\n")
    spec = tmp / "spec.json"
    spec.write_text(json.dumps(json.loads((base / "checkpoint.json").read_text())["model"]))
    canaries = tmp / "gradient-canaries"
    _gradient_canaries(canaries)
    return {"base": base, "scores": scores, "members": members, "spec": spec, "canaries": canaries, "tmp": tmp}


def _gradient_canaries(directory: Path) -> None:
    """Gradient canaries observed over 3 noisy steps of a hand-written loop (dpaudit.hooks)."""
    from dpaudit.hooks import GradientCanaries

    shapes = {"fc.weight": (4, 3), "fc.bias": (3,)}
    c = GradientCanaries(shapes, count=6, sample_rate=0.5, clip=1.0, seed=0)
    rng = np.random.default_rng(0)
    for t in range(3):
        grads = c.inject(t, {n: np.zeros(s) for n, s in shapes.items()})
        c.observe(t, {n: g + rng.normal(size=g.shape) for n, g in grads.items()})
    c.save(directory)


def _fill(args: list[str], inputs: dict) -> list[str]:
    return [a.format(**{k: str(v) for k, v in inputs.items()}) for a in args]


# The -jl algorithms are accounted with PLD only, ~10 s per run on this machine.
SLOW_TRAINERS = {"dpsgd-jl", "dpadam-jl"}


@pytest.mark.parametrize(
    "algo", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW_TRAINERS else a for a in TRAINERS]
)
def test_every_trainer_gives_the_same_checkpoint_from_the_same_seed(algo, inputs, tmp_path, monkeypatch, cpu_only):
    if algo.startswith("jax"):
        pytest.importorskip("jax")
    data = [] if algo == "cloak" else DATA  # a cloak reads its target's data (--data refused)
    args = ["--json", "train", "--out", "run", *data, *_fill(TRAINERS[algo], inputs), "--seed", "3"]
    (out1, files1), (out2, files2) = _twice(tmp_path, monkeypatch, args, "run")
    assert "model.safetensors" in files1 or any(k.endswith(".safetensors") for k in files1)
    assert sorted(files1) == sorted(files2)
    assert [k for k in files1 if files1[k] != files2[k]] == []  # every file, bit for bit (manifest included)
    assert out1 == out2


# --------------------------------------------------------------------------- commands that write or print JSON

# name -> (args, output written relative to the working folder, or None: stdout only)
COMMANDS = {
    "attack mia": (
        [
            "--json",
            "attack",
            "mia",
            "{base}",
            "--attacks",
            "loss,lira",
            "--reference-models",
            "4",
            "--min-models",
            "1",
            "--bootstrap",
            "5",
            "--scores-out",
            "s.npz",
            "--roc",
        ],
        None,
    ),
    "attack mia csv": (
        ["attack", "mia", "{base}", "--attacks", "loss", "--bootstrap", "0", "--scores-out", "s.csv"],
        "s.csv",
    ),
    "attack inversion": (
        ["--json", "attack", "inversion", "{base}", "--iterations", "5", "--restarts", "1", "--out", "png"],
        "png",
    ),
    "attack inversion black-box": (
        [
            "--json",
            "attack",
            "inversion",
            "{base}",
            "--black-box",
            "--iterations",
            "3",
            "--restarts",
            "1",
            "--directions",
            "2",
        ],
        None,
    ),
    "attack attribute": (["--json", "attack", "attribute", "{base}", "--feature", "0"], None),
    "attack attribute black-box": (["--json", "attack", "attribute", "{base}", "--feature", "1", "--black-box"], None),
    "attack extract": (
        [
            "--json",
            "attack",
            "extract",
            "{base}",
            "--budget",
            "40",
            "--method",
            "learning",
            "--surrogate",
            "logreg",
            "--curve-points",
            "2",
            "--out",
            "ex",
        ],
        "ex",
    ),
    "audit scores": (["--json", "audit", "scores", "{scores}", "--claimed-epsilon", "1"], None),
    "audit plan": (["--json", "audit", "plan", "--epsilon", "2", "--simulations", "20"], None),
    "audit canaries": (
        ["--json", "audit", "canaries", "{canaries}", "--claimed-epsilon", "1", "--delta", "1e-5", "--out", "c.json"],
        "c.json",
    ),
    "account dpsgd": (
        [
            "--json",
            "account",
            "dpsgd",
            "--noise-multiplier",
            "1",
            "--delta",
            "1e-5",
            "--sample-rate",
            "0.01",
            "--steps",
            "50",
            "--accountant",
            "all",
        ],
        None,
    ),
    "inspect": (["--json", "inspect", "{base}"], None),
    "canaries make": (["--json", "canaries", "make", "--data", "digits", "--count", "4", "--out", "cm"], "cm"),
    "import": (
        [
            "--json",
            "import",
            "{base}/model.safetensors",
            "--model-spec",
            "{spec}",
            *BASE_DATA,
            "--members",
            "{members}",
            "--out",
            "imp",
        ],
        "imp",
    ),
    "report": (["--quiet", "report", "{base}", "--out", "rep", "--attacks", "loss", "--format", "json,md,html"], "rep"),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_gives_the_same_bytes_from_the_same_seed(name, inputs, tmp_path, monkeypatch, cpu_only):
    args, out = COMMANDS[name]
    (out1, files1), (out2, files2) = _twice(tmp_path, monkeypatch, _fill(args, inputs), out)
    assert out1 == out2
    assert sorted(files1) == sorted(files2)
    assert [k for k in files1 if files1[k] != files2[k]] == []


def test_a_cloak_is_the_same_wherever_the_project_folder_lies(inputs, tmp_path, monkeypatch, cpu_only):
    """The same command (``--target runs/mlp``, relative) in two project folders writes the same cloak: its
    cloak.json recorded the target's resolved absolute path, so the checkpoint depended on where it was trained."""
    trees = []
    for project in (tmp_path / "a", tmp_path / "b" / "deeper"):
        shutil.copytree(inputs["base"], project / "runs" / "mlp")
        monkeypatch.chdir(project)
        args = ["--target", "runs/mlp", "--lambda", "1", "--epochs", "1", "--out", "cl"]
        r = invoke("--quiet", "train", "--algo", "cloak", *args)
        assert r.exit_code == 0, r.output
        trees.append(_tree(project / "cl"))
    assert json.loads(trees[0]["cloak.json"])["target"]["path"] == "runs/mlp"  # as given, like a run's data spec
    assert [k for k in trees[0] if trees[0][k] != trees[1].get(k)] == []


# --------------------------------------------------------------------------- --force and atomic replacement

# name -> (args writing OUT, the output: "dir" for a directory OUT, else a file path relative to OUT's parent)
WRITERS = {
    "train": (["train", "--out", "{out}", *DATA, "--model", "logreg", "--algo", "dpsgd", *DP], "dir"),
    "train cloak": (
        [
            "train",
            "--out",
            "{out}",
            "--algo",
            "cloak",
            "--target",
            "{base}",
            "--lambda",
            "1",
            "--epochs",
            "1",
        ],
        "dir",
    ),
    "train cloak sweep": (
        [
            "train",
            "--out",
            "{out}",
            "--algo",
            "cloak",
            "--target",
            "{base}",
            "--lambda",
            "0.5,2",
            "--epochs",
            "1",
        ],
        "dir",
    ),
    "import": (
        [
            "import",
            "{base}/model.safetensors",
            "--model-spec",
            "{spec}",
            *BASE_DATA,
            "--members",
            "{members}",
            "--out",
            "{out}",
        ],
        "dir",
    ),
    "canaries make": (["canaries", "make", "--data", "digits", "--count", "4", "--out", "{out}"], "dir"),
    "attack extract": (
        [
            "attack",
            "extract",
            "{base}",
            "--budget",
            "20",
            "--method",
            "learning",
            "--surrogate",
            "logreg",
            "--curve-points",
            "1",
            "--out",
            "{out}",
        ],
        "dir",
    ),
    "report": (["report", "{base}", "--out", "{out}", "--attacks", "loss", "--format", "json,md"], "dir"),
    "attack mia --scores-out": (
        ["attack", "mia", "{base}", "--attacks", "loss", "--bootstrap", "0", "--scores-out", "{out}.csv"],
        "out.csv",
    ),
    "attack inversion --out": (
        ["attack", "inversion", "{base}", "--iterations", "2", "--restarts", "1", "--out", "{out}"],
        "out/inversions.png",
    ),
    "audit canaries --out": (
        ["audit", "canaries", "{canaries}", "--claimed-epsilon", "1", "--delta", "1e-5", "--out", "{out}.json"],
        "out.json",
    ),
}


def _writer(name: str, inputs: dict, tmp_path: Path) -> tuple[list[str], Path]:
    args, kind = WRITERS[name]
    out = tmp_path / "out"
    target = out if kind == "dir" else tmp_path / kind
    return ["--quiet", *_fill(args, {**inputs, "out": out})], target


def _snapshot(path: Path) -> dict:
    """Every file under ``path`` (or ``path`` itself) with its bytes, inode and mtime, and ``path``'s inode."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    snap = {"": path.stat().st_ino}
    for p in files:
        st = p.stat()
        snap[p.relative_to(path).as_posix() if p != path else "."] = (p.read_bytes(), st.st_ino, st.st_mtime_ns)
    return snap


def _leftovers(folder: Path) -> list[str]:
    """Temporary, aside and lock entries of dpaudit's writers (``.NAME.*.dpaudit-tmp`` and the like)."""
    return sorted(p.name for p in folder.iterdir() if ".dpaudit-" in p.name and p.name != ".dpaudit-manifest.json")


@pytest.fixture
def failing_rename(monkeypatch):
    """``os.replace`` fails (EIO) when it would move the new output onto ``target``: the last step of an
    atomic write (moving an old output back, the roll-back, still works). A writer that writes ``target``
    in place never calls it, and so changes ``target`` instead."""
    real = os.replace
    state = {"target": None}

    def replace(src, dst, *a, **k):
        rollback = ".dpaudit-old" in os.fspath(src)
        if state["target"] is not None and not rollback and Path(dst).absolute() == state["target"].absolute():
            raise OSError(errno.EIO, "input/output error (planted)", os.fspath(dst))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    return state


@pytest.mark.parametrize("name", list(WRITERS))
def test_every_writer_refuses_without_force_replaces_with_it_and_is_atomic(
    name, inputs, tmp_path, failing_rename, cpu_only
):
    args, target = _writer(name, inputs, tmp_path)
    parent = target.parent

    # A failure at the rename into place with nothing there before leaves nothing (and no temporary file).
    failing_rename["target"] = target
    r = invoke(*args)
    assert "planted" in one_error(r) and str(target.name) in one_error(r)
    assert not target.exists() and _leftovers(parent) == []
    failing_rename["target"] = None

    r = invoke(*args)
    assert r.exit_code == 0, r.output
    assert target.exists() and _leftovers(parent) == []
    before = _snapshot(target)

    # (a) Refused without --force: one line, exit code 2, the output untouched.
    assert "--force" in one_error(invoke(*args))
    assert _snapshot(target) == before and _leftovers(parent) == []

    # (c) A failure at the rename into place under --force: the old output stays, as it was.
    failing_rename["target"] = target
    r = invoke(*args, "--force")
    assert "planted" in one_error(r)
    assert _snapshot(target) == before and _leftovers(parent) == []
    failing_rename["target"] = None

    # (b) --force replaces it: renamed into place (a new inode), complete (its manifest holds every file).
    r = invoke(*args, "--force")
    assert r.exit_code == 0, r.output
    assert target.stat().st_ino != before[""] and _leftovers(parent) == []
    if target.is_dir():
        assert foreign_files(target) == []
    _assert_no_pickle(target)


PICKLE_PROTOCOLS = {bytes([0x80, p]) for p in range(2, 6)}


def _assert_no_pickle(path: Path) -> None:
    """No file under ``path`` is (or, zipped, holds) a pickle; every .npz loads with ``allow_pickle=False``."""
    for p in [path] if path.is_file() else sorted(path.rglob("*")):
        if not p.is_file():
            continue
        head = p.read_bytes()[:2]
        assert head not in PICKLE_PROTOCOLS, f"{p} is a pickle"
        if zipfile.is_zipfile(p):
            names = zipfile.ZipFile(p).namelist()
            assert not any(n.endswith(".pkl") for n in names), f"{p} holds a pickle (torch.save?): {names}"
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                for k in z.files:
                    z[k]  # object arrays (pickled) raise here


# The process-wide sources a single in-process run cannot vary: str hashes (set iteration order) and the
# thread count. Two fresh interpreters with PYTHONHASHSEED 1 and 2 train, attack and report the same bytes.


@pytest.mark.slow  # two interpreters, 10-30 s
def test_fresh_processes_with_other_hash_seeds_write_the_same_run_and_report(tmp_path):
    train = ["train", "--out", "run", *DATA, "--model", "logreg", "--algo", "dpsgd", *DP, "--canaries", "8",
             "--allow-inconclusive"]  # fmt: skip
    report = ["report", "run", "--out", "rep", "--attacks", "loss", "--format", "json,md"]
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from dpaudit.cli.main import app\n"
        f"for args in ({train!r}, {report!r}):\n"
        "    r = CliRunner().invoke(app, ['--quiet', *args])\n"
        "    assert r.exit_code == 0, r.output\n"
    )
    trees = []
    for seed in ("1", "2"):
        cwd = tmp_path / seed
        cwd.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(Path(__file__).parents[2])}
        done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        trees.append({**_tree(cwd / "run"), **{"rep/" + k: v for k, v in _tree(cwd / "rep").items()}})
    assert sorted(trees[0]) == sorted(trees[1])
    assert [k for k in trees[0] if trees[0][k] != trees[1][k]] == []


# --------------------------------------------------------------------------- loaders never unpickle


class _Payload:
    """Unpickling this touches ``marker``: the proof that a loader ran a file's pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize(
    ("algo", "npz", "command"),
    [
        ("dpsgd-canaries", "split.npz", ["inspect", "{run}"]),
        ("dpsgd-canaries", "canaries.npz", ["audit", "checkpoint", "{run}", "--attacks", "none"]),
        ("dpsgd-whitebox", "whitebox_canaries.npz", ["audit", "checkpoint", "{run}", "--attacks", "none"]),
    ],
)
def test_a_run_whose_arrays_hold_a_pickle_is_refused_without_unpickling(algo, npz, command, tmp_path, inputs):
    """A stranger's run folder (manifest rewritten to match) with an object array in one of its .npz files:
    one line, exit code 2, and the pickle never runs."""
    from dpaudit.fileio import write_manifest

    run = tmp_path / "run"
    assert invoke("--quiet", "train", "--out", run, *DATA, *_fill(TRAINERS[algo], inputs)).exit_code == 0
    marker = tmp_path / "pwned"
    with np.load(run / npz, allow_pickle=False) as z:
        arrays = dict.fromkeys(z.files)
    arrays = {k: np.array([_Payload(marker)], dtype=object) for k in arrays}  # whichever array is read first
    np.savez(run / npz, **arrays)
    write_manifest(run, written_by="run")
    one_error(invoke("--quiet", *[a.format(run=run) for a in command]))
    assert not marker.exists()


def test_a_killed_file_writer_leaves_a_temporary_file_that_the_next_write_removes(tmp_path):
    """SIGKILL between writing the temporary file and renaming it: nothing at the output, and the next write
    of the same path removes the dead writer's temporary file (a live writer's, and other outputs', stay)."""
    out = tmp_path / "scores.csv"
    code = (
        "import os, signal, sys\n"
        "from dpaudit import fileio\n"
        "os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "fileio.write_atomic_file(sys.argv[1], 'half', force=False)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    killed = subprocess.Popen([sys.executable, "-c", code, str(out)], env=env, stderr=subprocess.PIPE)
    assert killed.wait() == -9, killed.stderr.read()
    assert not out.exists() and len(_leftovers(tmp_path)) == 1
    live = tmp_path / f".scores.csv.{os.getppid()}.abcdefgh.dpaudit-tmp"  # a writer still running
    other = tmp_path / f".other.csv.{killed.pid}.abcdefgh.dpaudit-tmp"  # another output's (its writer is dead too)
    live.write_text("x")
    other.write_text("x")
    write_atomic_file(out, "whole", force=False)
    assert out.read_text() == "whole"
    assert _leftovers(tmp_path) == sorted([live.name, other.name])
