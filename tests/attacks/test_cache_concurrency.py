"""Reference-model cache entries filled by several dpaudit processes at once (a CI matrix or two shells sharing
one --cache-dir / $DPAUDIT_CACHE_DIR). The interleavings are forced in one process (a hook at the exact
step), never left to timing."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import attacks.reference as ref
from attacks.reference import LOGITS_FILE, Recipe, model_key, seeds_for, train_models, train_one
from dpaudit.cache import entry_problem
from dpaudit.errors import IntegrityWarning


@pytest.fixture
def recipe(tiny_run):
    return Recipe.from_run(tiny_run)


def one_set(run) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.sort(rng.choice(np.union1d(run.splits.aux, run.splits.holdout), 100, replace=False))


def _no_integrity_warning(record) -> None:
    found = [str(w.message) for w in record if issubclass(w.category, IntegrityWarning)]
    assert not found, found


def test_a_process_that_trained_a_key_another_process_saved_first_uses_that_entry(
    recipe, tiny_run, tmp_path, monkeypatch
):
    """Three processes on one cache, same reference model: all three found no entry and trained it; the first to
    finish saved it, and the others failed at their own save with 'models/<key> already exists; use --force to
    overwrite it' (exit 2; 7 of 12 processes in 4 rounds). Forced here: the entry is saved by "the other process"
    while this one trains. The entry, written atomically under the same key, is the same model: it is used."""
    import dpaudit.training.run as run_mod

    idx, seed, cache = one_set(tiny_run), seeds_for(0, "reference", 1)[0], tmp_path / "cache"
    path = cache / "models" / model_key(recipe, idx, seed)
    real_fit, other = run_mod.fit_model, []

    def fit_while_the_other_process_saves(*a, **k):
        fitted = real_fit(*a, **k)
        if not other:  # this process is past train_run's first check: the other one saves the entry now
            other.append(1)
            run_mod.train_run(
                recipe.dataset, recipe.spec, recipe.with_seed(seed), recipe.perf, out=path,
                splits=_splits_of(recipe, idx, seed), preprocessing=recipe.preprocessing,
            )  # fmt: skip
        return fitted

    monkeypatch.setattr(run_mod, "fit_model", fit_while_the_other_process_saves)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        logits = train_one(recipe, idx, seed, str(cache))
    _no_integrity_warning(record)
    assert other, "the other process's save was not forced"
    monkeypatch.setattr(run_mod, "fit_model", real_fit)
    np.testing.assert_array_equal(logits, train_models(recipe, [idx], [seed], cache_dir=tmp_path / "alone")[0])
    np.testing.assert_array_equal(ref._read_cached(path, logits.shape), logits)  # the entry is complete


def _splits_of(recipe, idx, seed):
    from dpaudit.data import Splits

    rest = np.setdiff1d(np.arange(len(recipe.dataset)), np.r_[idx, recipe.test_idx, recipe.aux_idx])
    return Splits(members=idx, holdout=rest, aux=recipe.aux_idx, test=recipe.test_idx, seed=seed, fractions=())


def test_a_reader_meeting_the_logits_mid_write_leaves_the_entry_alone(recipe, tiny_run, tmp_path, monkeypatch):
    """While one process wrote an entry's logits (a temporary file, renamed; then its sha256 beside it), another
    process reading the same entry took the temporary file, or the logits without their sha256 yet, for a changed
    entry: it warned 'untrusted ... recomputing it' (IntegrityWarning) on a healthy entry and deleted it under the
    writer, whose model then had to be trained again. Forced here: the reader runs right before each rename."""
    idx, seed, cache = one_set(tiny_run), seeds_for(0, "reference", 1)[0], tmp_path / "cache"
    first = train_models(recipe, [idx], [seed], cache_dir=cache)[0]
    path = cache / "models" / model_key(recipe, idx, seed)
    for name in (LOGITS_FILE, LOGITS_FILE + ".sha256"):  # the writer is at its logits: the checkpoint is saved
        (path / name).unlink()
    real_replace, seen = os.replace, []

    def replace_with_a_reader_in_between(src, dst, *a, **k):
        if os.path.basename(dst) in (LOGITS_FILE, LOGITS_FILE + ".sha256"):
            seen.append(sorted(os.listdir(path)))
            assert ref._read_cached(path, first.shape) is None  # incomplete: not used, and not discarded
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace_with_a_reader_in_between)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        logits = train_one(recipe, idx, seed, str(cache))
    monkeypatch.setattr(os, "replace", real_replace)
    _no_integrity_warning(record)
    assert len(seen) == 2 and all(any(n.endswith(".dpaudit-tmp") for n in s) for s in seen)
    np.testing.assert_array_equal(logits, first)
    np.testing.assert_array_equal(ref._read_cached(path, first.shape), first)  # written and verified


def test_the_temporary_file_of_a_writer_killed_mid_logits_is_no_integrity_problem(recipe, tiny_run, tmp_path):
    """A process killed (SIGKILL) while writing an entry's logits leaves ``.logits.npy.PID.XXXXXXXX.dpaudit-tmp``
    in it. The next run called the entry untrusted (IntegrityWarning) and trained the model again; the leftover is
    dpaudit's own half-written file: the logits are recomputed from the saved model (no warning, no training)."""
    idx, seed, cache = one_set(tiny_run), seeds_for(0, "reference", 1)[0], tmp_path / "cache"
    first = train_models(recipe, [idx], [seed], cache_dir=cache)[0]
    path = cache / "models" / model_key(recipe, idx, seed)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = path / f".{LOGITS_FILE}.{int(dead.stdout)}.abcd_123.dpaudit-tmp"
    leftover.write_bytes((path / LOGITS_FILE).read_bytes()[:100])
    (path / LOGITS_FILE).unlink()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        again = train_models(recipe, [idx], [seed], cache_dir=cache)[0]
    _no_integrity_warning(record)
    np.testing.assert_array_equal(again, first)
    assert not leftover.exists()  # removed by the next write of the logits


def _corrupt(entry) -> None:
    data = bytearray((entry / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (entry / "model.safetensors").write_bytes(bytes(data))


def test_a_corrupt_entry_replaced_by_another_process_meanwhile_is_not_discarded(
    recipe, tiny_run, tmp_path, monkeypatch
):
    """Two processes met the same corrupt entry. The first discarded it, trained the model and saved a new entry;
    the second, which had checked the old entry, then removed the first one's new, healthy entry (with a warning
    about the old one's problem) and trained the model once more. Forced here: the new entry is renamed in between
    the second process's check and its discard. The discard now removes only the entry it checked."""
    import shutil

    import dpaudit.training.run as run_mod

    idx, seed, cache = one_set(tiny_run), seeds_for(0, "reference", 1)[0], tmp_path / "cache"
    first = train_models(recipe, [idx], [seed], cache_dir=cache)[0]
    path = cache / "models" / model_key(recipe, idx, seed)
    healthy = tmp_path / "healthy"
    shutil.copytree(path, healthy)
    _corrupt(path)
    real_problem = ref.entry_problem

    def problem_then_the_other_process_saves(entry, hashed=()):
        found = real_problem(entry, hashed)
        if found and healthy.exists():  # the other process: discards the old entry, saves its new one
            shutil.rmtree(entry)
            os.rename(healthy, entry)
        return found

    monkeypatch.setattr(ref, "entry_problem", problem_then_the_other_process_saves)

    def no_training(*a, **k):
        raise AssertionError("the model was trained again")

    monkeypatch.setattr(run_mod, "train_run", no_training)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        again = train_models(recipe, [idx], [seed], cache_dir=cache)[0]
    np.testing.assert_array_equal(again, first)
    assert ref._read_cached(path, first.shape) is not None
    _no_integrity_warning(record)  # the entry this process reads is healthy; the one it checked is gone


def test_a_reader_whose_entry_another_process_discards_meanwhile_does_not_crash(
    recipe, tiny_run, tmp_path, monkeypatch
):
    """A process checking an entry while another process discarded it (found corrupt) crashed with
    FileNotFoundError (a traceback) when a file it was hashing vanished. A file gone is a file not to trust: the
    model is trained again. Forced here: the entry is removed right before the reader's first hash."""
    import shutil

    from dpaudit import fileio

    idx, seed, cache = one_set(tiny_run), seeds_for(0, "reference", 1)[0], tmp_path / "cache"
    first = train_models(recipe, [idx], [seed], cache_dir=cache)[0]
    path = cache / "models" / model_key(recipe, idx, seed)
    real_hash, removed = fileio.sha256_file, []

    def hash_after_the_other_process_discards(p, *a, **k):
        if not removed and path in Path(p).parents:
            removed.append(1)
            shutil.rmtree(path)
        return real_hash(p, *a, **k)

    monkeypatch.setattr(fileio, "sha256_file", hash_after_the_other_process_discards)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        again = train_models(recipe, [idx], [seed], cache_dir=cache)[0]
    assert removed
    np.testing.assert_array_equal(again, first)
    monkeypatch.setattr(fileio, "sha256_file", real_hash)
    np.testing.assert_array_equal(ref._read_cached(path, first.shape), first)


# --------------------------------------------------------------------------- one training per entry
#
# Two processes missing the same entry both trained it (identical results, the work twice: hours for 64 reference
# models at CIFAR scale). A model missing from the cache is now trained under its entry's work lock
# (fileio.work_lock, beside the entry); a process that finds it held trains the others first, then waits and reads
# the holder's verified entry.

_OTHER_PROCESS = """
import sys, time
from pathlib import Path
import numpy as np
import attacks.reference as ref
import dpaudit.training.run as run_mod
from dpaudit.checkpoint import load_run

run_dir, cache, marks, out = sys.argv[1:]
recipe = ref.Recipe.from_run(load_run(run_dir))
sets = np.load(Path(marks) / "sets.npz", allow_pickle=False)
real_one, real_train = ref.train_one, run_mod.train_run

def one(recipe, idx, seed, cache, **k):  # this process asks for the model: the other one may train it now
    (Path(marks) / f"child.{ref.model_key(recipe, idx, seed)}").touch()
    return real_one(recipe, idx, seed, cache, **k)

def train(*a, out, **k):  # a training: counted, and held until the other process has asked for the same model
    with open(Path(marks) / "trained", "a") as f:
        f.write(Path(out).name + "\\n")
    end = time.monotonic() + 300
    while not (Path(marks) / f"parent.{Path(out).name}").exists():
        assert time.monotonic() < end, "the other process never asked for this model"
        time.sleep(0.02)
    return real_train(*a, out=out, **k)

ref.train_one, run_mod.train_run = one, train
logits = ref.train_models(recipe, [sets["s0"], sets["s1"]], [int(s) for s in sets["seeds"]], cache_dir=cache)
np.save(out, logits, allow_pickle=False)
"""


@pytest.mark.slow  # a second python with torch (about 4 s of CPU); guarded fast by the next test, in one process
def test_two_processes_missing_the_same_entries_train_each_model_once(recipe, tiny_run, tmp_path, monkeypatch):
    """This process and a child process ask one cache for the same two reference models at once; each training is
    held until the other process has asked for the same model, so both miss both entries (forced, not timed).
    Before: 4 trainings (each model twice). Now each model is trained once, by one of them; the other waits and
    reads its entry: the same logits, byte for byte, and nothing left in the cache but the two entries."""
    import time

    import dpaudit.training.run as run_mod

    idx = [one_set(tiny_run), one_set(tiny_run)[::2]]
    seeds, cache, marks = seeds_for(0, "reference", 2), tmp_path / "cache", tmp_path / "marks"
    marks.mkdir()
    np.savez(marks / "sets.npz", s0=idx[0], s1=idx[1], seeds=np.array(seeds))
    keys = sorted(model_key(recipe, i, s) for i, s in zip(idx, seeds, strict=True))
    child = subprocess.Popen(
        [sys.executable, "-c", _OTHER_PROCESS, str(tiny_run.path), str(cache), str(marks), str(tmp_path / "child")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(ref.__file__).parents[1]), *sys.path[1:]])},
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    real_one, real_train = ref.train_one, run_mod.train_run

    def one(recipe, i, s, cache, **k):
        (marks / f"parent.{model_key(recipe, i, s)}").touch()
        return real_one(recipe, i, s, cache, **k)

    def train(*a, out, **k):
        with open(marks / "trained", "a") as f:
            f.write(Path(out).name + "\n")
        while not (marks / f"child.{Path(out).name}").exists():
            assert child.poll() is None, child.stderr.read()
            time.sleep(0.02)
        return real_train(*a, out=out, **k)

    monkeypatch.setattr(ref, "train_one", one)
    monkeypatch.setattr(run_mod, "train_run", train)
    try:
        mine = train_models(recipe, idx, seeds, cache_dir=cache)
    finally:
        assert child.wait(timeout=600) == 0, child.stderr.read()
    assert sorted((marks / "trained").read_text().split()) == keys  # each model trained once, by either process
    theirs = np.load(tmp_path / "child.npy", allow_pickle=False)
    assert mine.tobytes() == theirs.tobytes()
    assert sorted(os.listdir(cache / "models")) == keys  # no lock file or temporary file left


def _entry_of(recipe, idx, seed, cache) -> Path:
    return cache / "models" / model_key(recipe, idx, seed)


@pytest.mark.parametrize("holder", ["saves the entry", "dies", "saves an untrusted entry"])
def test_a_model_another_process_is_training_is_left_for_later_then_waited_for(
    recipe, tiny_run, tmp_path, monkeypatch, holder
):
    """Another process holds the work lock of the first of two models (held here, on a descriptor of its own, as
    another process would). This one trains the second, says why it waits (one line), then waits for the holder:
    when the holder saved the entry it is read, not trained again; when the holder died, or saved an entry that
    does not match its hashes, it is trained here. Before: both models were trained at once, whatever the holder."""
    import contextlib
    import shutil
    import time

    import dpaudit.training.run as run_mod
    from dpaudit import fileio
    from dpaudit.progress import notices

    idx, seeds, cache = [one_set(tiny_run), one_set(tiny_run)[::2]], seeds_for(0, "reference", 2), tmp_path / "cache"
    alone = train_models(recipe, idx[:1], seeds[:1], cache_dir=tmp_path / "alone")[0]
    first = _entry_of(recipe, idx[0], seeds[0], cache)
    other = contextlib.ExitStack()
    assert other.enter_context(fileio.work_lock(first))  # the other process, training the first model
    trained, said, polls = [], [], []
    real_train = run_mod.train_run

    def train(*a, out, **k):
        trained.append(Path(out).name)
        return real_train(*a, out=out, **k)

    def poll(_s: float) -> None:  # the other process finishes during the first poll
        polls.append(1)
        if holder != "dies":
            shutil.copytree(_entry_of(recipe, idx[0], seeds[0], tmp_path / "alone"), first)
        if holder == "saves an untrusted entry":
            _corrupt(first)
        other.close()

    monkeypatch.setattr(run_mod, "train_run", train)
    monkeypatch.setattr(time, "sleep", poll)
    with notices(said.append), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        logits = train_models(recipe, idx, seeds, cache_dir=cache)
    second = _entry_of(recipe, idx[1], seeds[1], cache).name
    assert trained == ([second] if holder == "saves the entry" else [second, first.name])
    assert polls == [1]
    assert said == [
        f"dpaudit: reference models: 1 is being trained by another dpaudit process (pid {os.getpid()}) on "
        f"{cache.absolute()}; waiting for it instead of training it twice"
    ]
    untrusted = [w for w in record if issubclass(w.category, IntegrityWarning)]
    assert len(untrusted) == (holder == "saves an untrusted entry")
    np.testing.assert_array_equal(logits[0], alone)
    assert sorted(os.listdir(cache / "models")) == sorted([first.name, second])


def _killed_holder(entry: Path) -> int:
    """A process that took ``entry``'s work lock and was killed (SIGKILL) holding it: its pid."""
    code = (
        "import os, signal, sys; from dpaudit.fileio import work_lock; held = work_lock(sys.argv[1]); "
        "held.__enter__(); print(os.getpid(), flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(ref.__file__).parents[1]), *sys.path[1:]])}
    done = subprocess.run([sys.executable, "-c", code, str(entry)], capture_output=True, text=True, env=env)
    assert done.returncode == -9, done.stderr
    return int(done.stdout)


@pytest.mark.parametrize("flock", [True, False], ids=["flock", "pid only"])
def test_a_work_lock_a_killed_process_left_does_not_block(recipe, tiny_run, tmp_path, monkeypatch, flock):
    """A process killed outright (SIGKILL, OOM) while training a model leaves its work lock file, with its pid. The
    next process trains the model at once, without waiting: the kernel released the flock, and where there is no
    flock (Windows, a file system without locks) the pid is dead. The lock file goes with the takeover."""
    import time

    from dpaudit import fileio

    idx, seed, cache = one_set(tiny_run), seeds_for(0, "reference", 1)[0], tmp_path / "cache"
    entry = _entry_of(recipe, idx, seed, cache)
    pid = _killed_holder(entry)
    lock = entry.parent / f".{entry.name}.dpaudit-work-lock"
    assert int(lock.read_text()) == pid
    if not flock:
        monkeypatch.setattr(fileio, "fcntl", None)

    def poll(_s: float) -> None:
        raise AssertionError(f"waited for the lock of process {pid}, killed")

    monkeypatch.setattr(time, "sleep", poll)
    logits = train_one(recipe, idx, seed, str(cache))
    np.testing.assert_array_equal(ref._read_cached(entry, logits.shape), logits)
    assert os.listdir(cache / "models") == [entry.name]


def test_work_lock_files_do_not_make_an_entry_untrusted(recipe, tiny_run, tmp_path):
    """An entry read while another process holds its work lock (retraining its logits, say) or after one was killed
    holding it: the lock file lies beside the entry, never in it, so the entry stays trusted (no IntegrityWarning,
    not discarded, not trained again)."""
    from dpaudit import fileio

    idx, seed, cache = one_set(tiny_run), seeds_for(0, "reference", 1)[0], tmp_path / "cache"
    first = train_models(recipe, [idx], [seed], cache_dir=cache)[0]
    entry = _entry_of(recipe, idx, seed, cache)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with fileio.work_lock(entry):
            assert entry_problem(entry, hashed=(LOGITS_FILE,)) is None
            np.testing.assert_array_equal(ref._read_cached(entry, first.shape), first)
        _killed_holder(entry)
        assert entry_problem(entry, hashed=(LOGITS_FILE,)) is None
        np.testing.assert_array_equal(train_models(recipe, [idx], [seed], cache_dir=cache)[0], first)
    _no_integrity_warning(record)


def test_ctrl_c_while_waiting_for_another_process_leaves_its_lock_alone(recipe, tiny_run, tmp_path, monkeypatch):
    """Ctrl-C while waiting for another process's model: KeyboardInterrupt (the CLI's "interrupted", exit 130), and
    the other process's lock stays its own (held, its file in place); nothing of this process is left."""
    import time

    from dpaudit import fileio

    idx, seed, cache = one_set(tiny_run), seeds_for(0, "reference", 1)[0], tmp_path / "cache"
    entry = _entry_of(recipe, idx, seed, cache)
    lock = entry.parent / f".{entry.name}.dpaudit-work-lock"

    def ctrl_c(_s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", ctrl_c)
    with fileio.work_lock(entry):  # the other process
        with pytest.raises(KeyboardInterrupt):
            train_models(recipe, [idx], [seed], cache_dir=cache)
        assert lock.exists() and fileio.work_lock_holder(entry) == os.getpid()
        with fileio.work_lock(entry, wait=False) as held:
            assert not held  # still held
    assert os.listdir(cache / "models") == []


def test_a_work_lock_whose_folder_cannot_be_made_names_the_users_path_not_the_lock(tmp_path):
    """A cache folder that is a file: the entry's folder cannot be made, and the one-line OutputError names the
    user's path and the OS's reason for it (fileio.work_lock's mkdir), not the hidden lock file inside it, whose open
    would fail next ("Not a directory (.../.entry.dpaudit-work-lock)")."""
    from dpaudit import fileio
    from dpaudit.errors import OutputError

    (tmp_path / "cache").write_text("a file, not a folder")
    out = tmp_path / "cache" / "entry"
    with pytest.raises(OutputError) as e, fileio.work_lock(str(out)):  # a str is taken as a Path
        pass
    assert str(e.value) == f"cannot write {out}: {os.strerror(17)} ({tmp_path / 'cache'})"  # EEXIST
    assert "dpaudit-work-lock" not in str(e.value)
