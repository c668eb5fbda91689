"""Reference-model training: cache keys, cache reuse, determinism across workers, Dask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attacks.reference import Recipe, model_key, seeds_for, train_models
from dpaudit.checkpoint import load_run
from dpaudit.errors import InputError
from dpaudit.validation import available_cores, check_workers


@pytest.fixture
def recipe(tiny_run):
    return Recipe.from_run(tiny_run)


def train_sets(run, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    pop = np.union1d(run.splits.aux, run.splits.holdout)
    return [np.sort(rng.choice(pop, 100, replace=False)) for _ in range(n)]


def test_model_key(recipe, tiny_run):
    a, b = train_sets(tiny_run, 2)
    k = model_key(recipe, a, 1)
    assert k == model_key(recipe, a[::-1], 1)  # a set: order does not matter
    assert len({k, model_key(recipe, a, 2), model_key(recipe, b, 1)}) == 3


def test_dropout_in_a_users_model_is_seeded_by_the_training_seed():
    """A python model with nn.Dropout: the same seed gave other weights in every process (torch's global
    generator starts at random), so LiRA's reference models differed between --workers 1 and 2. Here two
    processes are two global states; the caller's own global state is left as it was."""
    from dpaudit.data import load_dataset
    from dpaudit.models import PythonSpec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import fit_model

    ds = load_dataset("synthetic:n=120,d=6,classes=3,seed=0")
    spec = PythonSpec(input_shape=(6,), n_classes=3, factory="tests.core.byo_models:with_dropout",
                      kwargs={"d": 6, "n_classes": 3})  # fmt: skip
    config = TrainConfig(algo="adam", steps=20, batch_size=32, lr=0.01, seed=3)
    weights = []
    for process_seed in (1, 2):
        torch.manual_seed(process_seed)
        expected = torch.rand(3)
        torch.manual_seed(process_seed)
        fitted = fit_model(ds, np.arange(100), spec, config)
        assert torch.equal(torch.rand(3), expected)  # training neither read nor moved the caller's generator
        weights.append(torch.cat([p.detach().flatten() for p in fitted.outcome.model.parameters()]))
    assert torch.equal(weights[0], weights[1])


def test_workers_1_and_2_identical_and_cached(recipe, tiny_run, tmp_path, monkeypatch):
    sets, seeds = train_sets(tiny_run, 3), seeds_for(0, "reference", 3)
    one = train_models(recipe, sets, seeds, workers=1, cache_dir=tmp_path / "c1")
    two = train_models(recipe, sets, seeds, workers=2, cache_dir=tmp_path / "c2")
    assert one.shape == (3, len(recipe.dataset), 3) and one.dtype == np.float64
    np.testing.assert_array_equal(one, two)  # bit-identical: one torch thread per job everywhere
    # Every model is an ordinary checkpoint whose logits are what we returned.
    entries = sorted((tmp_path / "c1" / "models").iterdir())
    assert len(entries) == 3
    key = model_key(recipe, sets[0], seeds[0])
    r = load_run(tmp_path / "c1" / "models" / key)
    np.testing.assert_array_equal(np.sort(r.splits.members), sets[0])
    # Exact up to float64 printing on the CPU; with the models trained on a GPU, ``one`` comes from CUDA
    # kernels and the reload runs on the CPU: float32 sums in another order, relative error ~1e-6 (a few
    # ulps of float32, 1.2e-7 each, over sums of up to a few hundred terms).
    gpu = torch.cuda.is_available()
    np.testing.assert_allclose(r.logits(recipe.dataset.X), one[0], rtol=1e-5 if gpu else 1e-7, atol=1e-6 if gpu else 0)
    # A second call trains nothing.
    import dpaudit.training.run as run_mod

    monkeypatch.setattr(run_mod, "train_run", lambda *a, **k: pytest.fail("retrained a cached model"))
    np.testing.assert_array_equal(train_models(recipe, sets, seeds, cache_dir=tmp_path / "c1"), one)


def test_partial_cache_entry_is_completed(recipe, tiny_run, tmp_path):
    sets, seeds = train_sets(tiny_run, 1), seeds_for(0, "reference", 1)
    first = train_models(recipe, sets, seeds, cache_dir=tmp_path)
    (tmp_path / "models" / model_key(recipe, sets[0], seeds[0]) / "logits.npy").unlink()
    np.testing.assert_array_equal(train_models(recipe, sets, seeds, cache_dir=tmp_path), first)


def test_more_workers_than_cores():
    n = available_cores()
    assert check_workers(n) == n
    with pytest.raises(InputError, match=f"--workers {n + 1} > {n} CPU cores"):
        check_workers(n + 1)
    assert check_workers(n + 1, scheduler="tcp://x:1") == n + 1  # a cluster has its own cores
    with pytest.raises(InputError, match="workers >= 1"):
        check_workers(0)


def test_the_cores_are_those_the_process_may_use(monkeypatch):
    """A process limited to 2 of 64 cores (taskset, a container's cpuset) may start 2 workers, not 64."""
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert available_cores() == 2


def test_seeds_distinct_and_reproducible():
    a = seeds_for(0, "reference", 16)
    assert len(set(a)) == 16 and a == seeds_for(0, "reference", 16)
    assert set(a).isdisjoint(seeds_for(0, "shadow", 16))


def test_dask_cluster_matches_local(recipe, tiny_run, tmp_path):
    distributed = pytest.importorskip("distributed")
    sets, seeds = train_sets(tiny_run, 2), seeds_for(0, "reference", 2)
    local = train_models(recipe, sets, seeds, workers=1, cache_dir=tmp_path / "local")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        remote = train_models(recipe, sets, seeds, scheduler=cluster.scheduler_address, cache_dir=tmp_path / "dask")
    np.testing.assert_array_equal(local, remote)
    assert len(list((tmp_path / "dask" / "models").iterdir())) == 2  # (no wall-clock bound: machines differ)


def test_unreachable_scheduler(recipe, tiny_run, tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr("attacks.reference.DASK_CONNECT_TIMEOUT_S", 2)
    sets = train_sets(tiny_run, 1)
    with pytest.raises(InputError, match="cannot reach the Dask scheduler"):
        train_models(recipe, sets, [1], scheduler="tcp://127.0.0.1:9", cache_dir=tmp_path)


def test_an_edited_factory_file_trains_new_reference_models(recipe, tmp_path, monkeypatch):
    """A python model's reference models are keyed by its factory's source as it is now: after the user edits the
    file, the models cached from the old code are not mixed with the ones the edited code builds."""
    from dataclasses import replace

    from dpaudit.models import PythonSpec

    monkeypatch.syspath_prepend(str(tmp_path))
    source = tmp_path / "attackhunt_factory.py"
    source.write_text("from torch import nn\n\ndef make():\n    return nn.Sequential(nn.Flatten(), nn.Linear(10, 3))\n")
    spec = PythonSpec(input_shape=(10,), n_classes=3, factory="attackhunt_factory:make")
    python = replace(recipe, spec=spec)
    idx = np.arange(100)
    before = model_key(python, idx, 0)
    assert before == model_key(python, idx, 0)
    source.write_text(source.read_text().replace("nn.Flatten(), ", "nn.Flatten(), nn.Identity(), "))
    assert model_key(python, idx, 0) != before


def test_jobs_in_threads_of_one_process_train_one_at_a_time(recipe, tiny_run, tmp_path, monkeypatch):
    """A Dask worker with several threads runs train_one concurrently in one process, where torch's random
    generator and thread count are shared: two jobs at once drew each other's random numbers (1800 of 3600 logits
    differed from a local run). The trainings of one process are serialised. Planted: the lock dropped -> two
    trainings overlap in the sleep below and this fails."""
    import threading
    import time

    import dpaudit.training.run as run_mod

    real, active, overlap = run_mod.train_run, [0], [0]

    def tracked(*a, **k):
        active[0] += 1
        overlap[0] = max(overlap[0], active[0])
        time.sleep(0.2)  # both threads are inside at once unless the trainings are serialised
        active[0] -= 1
        return real(*a, **k)

    monkeypatch.setattr(run_mod, "train_run", tracked)
    from attacks.reference import train_one

    sets, seeds = train_sets(tiny_run, 2), seeds_for(0, "reference", 2)
    out = [None, None]

    def job(j):
        out[j] = train_one(recipe, sets[j], seeds[j], str(tmp_path / "c"))

    threads = [threading.Thread(target=job, args=(j,)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlap[0] == 1
    np.testing.assert_array_equal(np.stack(out), train_models(recipe, sets, seeds, cache_dir=tmp_path / "seq"))


def test_each_trained_reference_model_hands_its_freed_heap_back(recipe, tiny_run, tmp_path, monkeypatch):
    """RSS crept with the number of LiRA reference models (657-710 MB after each of 5 small CNNs on 20,000
    CIFAR-size images): nothing of a model but its logits stays alive (gc's object count grew by 2 a model), but
    glibc kept (and fragmented) the heap its training freed. Every model trained now ends in release_freed_heap
    (glibc's malloc_trim; 385-392 MB after each); a cached model trains nothing and frees nothing. Where the C
    library is glibc, the call is made."""
    import attacks.reference as ref

    sets, seeds = train_sets(tiny_run, 2), seeds_for(0, "reference", 2)
    calls = []
    monkeypatch.setattr(ref, "release_freed_heap", lambda: calls.append(1))
    first = train_models(recipe, sets, seeds, cache_dir=tmp_path)
    assert len(calls) == 2
    np.testing.assert_array_equal(train_models(recipe, sets, seeds, cache_dir=tmp_path), first)
    assert len(calls) == 2
    monkeypatch.undo()
    import ctypes.util
    import sys

    if sys.platform.startswith("linux") and ctypes.util.find_library("c") == "libc.so.6":
        assert ref.release_freed_heap() is True


def test_release_freed_heap_calls_malloc_trim_0_and_is_false_without_it(monkeypatch):
    """release_freed_heap is glibc's ``malloc_trim(0)`` (0: keep no padding at the top of the heap), and False where
    the C library has no malloc_trim (musl, macOS) or none is found (mutant: the call itself dropped, still True,
    passed every fast test: only the return value was read). A stand-in C library records the call."""
    import ctypes
    import ctypes.util

    import attacks.reference as ref

    calls = []

    class Trim:
        def __call__(self, pad):
            calls.append(pad)
            return 1

    class Glibc:
        malloc_trim = Trim()

    class Musl:
        pass

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libc.so.6")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Glibc())
    assert ref.release_freed_heap() is True and calls == [0]
    assert Glibc.malloc_trim.argtypes == [ctypes.c_size_t] and Glibc.malloc_trim.restype is ctypes.c_int
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Musl())
    assert ref.release_freed_heap() is False and calls == [0]
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert ref.release_freed_heap() is False


def test_train_models_holds_each_models_reduction_not_every_models_logits(recipe, tiny_run, tmp_path, monkeypatch):
    """With ``reduce``, each model's logits (read from the cache, or trained) are reduced as they come: the traced
    peak stays below a quarter of the M models' dense logits (LiRA's reference logits were held whole, then stacked:
    2.6 GB twice for 64 models on 50,000 records of 100 classes), and the result is the stack of the reductions of
    the logits that the call without ``reduce`` returns, in the models' order."""
    import tracemalloc

    import attacks.reference as reference

    n, k, m = 20_000, 10, 16
    sets, seeds = train_sets(tiny_run, m), seeds_for(0, "reference", m)

    def logits_of(idx) -> np.ndarray:  # a model's logits on every record, drawn from its training set
        return np.random.default_rng(int(np.sum(idx))).standard_normal((n, k))

    cached = {
        str(reference._entry(str(tmp_path.absolute()), recipe, s, seed)): s
        for s, seed in zip(sets[::2], seeds[::2], strict=True)
    }
    monkeypatch.setattr(reference, "_logits_shape", lambda recipe: (n, k))
    monkeypatch.setattr(
        reference, "_read_cached", lambda path, shape: logits_of(cached[str(path)]) if str(path) in cached else None
    )
    monkeypatch.setattr(reference, "train_one", lambda recipe, idx, seed, cache, wait=True: logits_of(idx))  # the rest
    dense = train_models(recipe, sets, seeds, cache_dir=tmp_path)
    assert dense.shape == (m, n, k)

    def reduce(logits):
        return logits[::100, 0] - logits[::100, 1]

    tracemalloc.start()
    reduced = train_models(recipe, sets, seeds, cache_dir=tmp_path, reduce=reduce)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_array_equal(reduced, np.stack([reduce(lg) for lg in dense]))
    assert peak < dense.nbytes / 4, (peak, dense.nbytes)
    assert train_models(recipe, [], [], cache_dir=tmp_path, reduce=reduce).shape == (0,)


def _spec_and_config(kind: str):
    from dpaudit.models import PythonSpec, default_spec
    from dpaudit.training.config import DPConfig, TrainConfig

    if kind == "dropout":  # a user's module whose training forward draws (eval mode matters)
        spec = PythonSpec(input_shape=(6,), n_classes=3, factory="tests.core.byo_models:with_dropout",
                          kwargs={"d": 6, "n_classes": 3})  # fmt: skip
        return spec, TrainConfig(algo="adam", steps=20, batch_size=32, lr=0.01, seed=3)
    spec = default_spec(kind, input_shape=(6,), n_classes=3)
    dp = DPConfig(noise_multiplier=1.0) if kind == "mlp" else None
    return spec, TrainConfig(algo="dpsgd" if dp else "sgd", epochs=2, batch_size=32, lr=0.5, seed=1, dp=dp)


@pytest.mark.parametrize("kind", ["logreg", "mlp", "dropout"])
def test_train_runs_every_record_logits_are_the_saved_runs(kind, tmp_path):
    """train_run(every_logits=) hands out the logits of every record from its one evaluation pass: bit for bit what
    the reference-model cache stored before (``load_run(out).logits(dataset.view())``, a second pass), with the
    metrics read from their rows equal to the per-split evaluation's (same weights; logreg, a DP-SGD MLP, a user's
    module with dropout)."""
    from dpaudit.data import load_dataset
    from dpaudit.training.run import train_run

    ds = load_dataset("synthetic:n=300,d=6,classes=3,seed=0")
    spec, config = _spec_and_config(kind)
    got = []
    meta = train_run(ds, spec, config, out=tmp_path / "run", every_logits=got.append)
    (every,) = got
    assert every.dtype == np.float64 and every.shape == (300, 3)
    np.testing.assert_array_equal(every, load_run(tmp_path / "run").logits(ds.view()))
    alone = train_run(ds, spec, config, out=None)["metrics"]
    assert meta["metrics"].keys() == alone.keys()
    for key, value in alone.items():  # float64 logits a few ulps apart at most: losses to 1e-12, accuracies equal
        assert meta["metrics"][key] == pytest.approx(value, rel=1e-12, abs=0), key


def test_a_reference_model_sends_each_record_through_the_model_once(recipe, tiny_run, tmp_path, monkeypatch):
    """A reference model evaluated its members, holdout and test (the cached checkpoint's metrics) and then every
    record again (the cached logits): N + (N - aux) rows. Now train_run's one pass over every record gives both:
    N rows a model, and the same logits as the reloaded model's."""
    import dpaudit.checkpoint as checkpoint
    import dpaudit.training.run as run_module

    rows = []
    original = checkpoint.predict_logits

    def counted(model, X, *a, **k):
        rows.append(len(X))
        return original(model, X, *a, **k)

    monkeypatch.setattr(checkpoint, "predict_logits", counted)
    monkeypatch.setattr(run_module, "predict_logits", counted)
    sets, seeds = train_sets(tiny_run, 2), seeds_for(0, "reference", 2)
    logits = train_models(recipe, sets, seeds, cache_dir=tmp_path)
    n = len(recipe.dataset)
    assert sum(rows) == 2 * n, rows
    for j, (idx, seed) in enumerate(zip(sets, seeds, strict=True)):
        entry = tmp_path / "models" / model_key(recipe, idx, seed)
        np.testing.assert_array_equal(logits[j], load_run(entry).logits(recipe.dataset.view()))
