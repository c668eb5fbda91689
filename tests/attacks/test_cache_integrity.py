"""Reference-model cache entries are verified on read (issue 30): a poisoned entry is detected,
reported with an IntegrityWarning and recomputed; a --cache-dir that is a file is exit 2."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from attacks.reference import Recipe, model_key, seeds_for, train_models
from dpaudit.cli.main import app
from dpaudit.errors import InputError, IntegrityWarning


@pytest.fixture
def recipe(tiny_run):
    return Recipe.from_run(tiny_run)


def one_set(run) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.sort(rng.choice(np.union1d(run.splits.aux, run.splits.holdout), 100, replace=False))]


@pytest.mark.parametrize("poison", ["logits", "weights", "hash-only"])
def test_a_poisoned_cache_entry_is_detected_and_recomputed(recipe, tiny_run, tmp_path, poison):
    sets, seeds = one_set(tiny_run), seeds_for(0, "reference", 1)
    first = train_models(recipe, sets, seeds, cache_dir=tmp_path)
    entry = tmp_path / "models" / model_key(recipe, sets[0], seeds[0])
    if poison == "logits":  # what changed LiRA's AUC from 0.54 to 1.0 in the issue
        logits = np.load(entry / "logits.npy")
        np.save(entry / "logits.npy", logits * 100.0)
    elif poison == "weights":
        data = bytearray((entry / "model.safetensors").read_bytes())
        data[-1] ^= 1
        (entry / "model.safetensors").write_bytes(bytes(data))
    else:
        (entry / "logits.npy.sha256").write_text("0" * 64 + "\n")
    with pytest.warns(IntegrityWarning, match="untrusted"):
        again = train_models(recipe, sets, seeds, cache_dir=tmp_path)
    np.testing.assert_array_equal(again, first)  # recomputed: the same model (fixed seed, one thread)


def test_an_intact_entry_is_read_without_a_warning(recipe, tiny_run, tmp_path, recwarn):
    sets, seeds = one_set(tiny_run), seeds_for(0, "reference", 1)
    first = train_models(recipe, sets, seeds, cache_dir=tmp_path)
    np.testing.assert_array_equal(train_models(recipe, sets, seeds, cache_dir=tmp_path), first)
    assert not [w for w in recwarn if issubclass(w.category, IntegrityWarning)]


def test_a_cache_dir_that_is_a_file_is_exit_2(recipe, tiny_run, tiny_run_dir, tmp_path):
    f = tmp_path / "cache"
    f.write_text("not a folder")
    with pytest.raises(InputError, match="is not a directory"):
        train_models(recipe, one_set(tiny_run), seeds_for(0, "reference", 1), cache_dir=f)
    r = CliRunner().invoke(app, ["attack", "mia", str(tiny_run_dir), "--attacks", "lira", "--cache-dir", str(f)])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1] == f"error: --cache-dir {f} is not a directory"
