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
