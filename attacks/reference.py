"""Training of reference (LiRA) and shadow (Shokri) models: cached, in parallel, on a cluster.

Every reference model is an ordinary dpaudit run directory (safetensors + JSON + split.npz, trained by
:func:`dpaudit.training.run.train_run` with the target's recipe) plus ``logits.npy``, its float64
logits on every record of the dataset. Both live under ``<cache_dir>/models/<key>/`` where ``key`` is
the sha256 of (data hash, model spec, training config including the seed, training index set, and a
fixed preprocessing if the recipe has one), so a
second attack on the same target, or another target with the same recipe, reuses them. ``cache_dir``
defaults to :func:`dpaudit.cache.default_cache_dir` (``$DPAUDIT_CACHE_DIR``, else the user's cache
directory; never the current directory). Processes sharing a cache train each missing model once: its
trainer holds the entry's work lock (:func:`dpaudit.fileio.work_lock`), and :func:`train_models` trains the models
no one holds first, then waits for the others and reads their entries.

Parallelism: joblib with the loky backend (``workers`` processes), or a Dask cluster through joblib's
dask backend (``scheduler="tcp://host:port"``). Each job trains with one torch thread, so results are
bit-identical whatever the number of workers, and workers do not oversubscribe the cores.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.cache import check_cache_dir, discard_entry, entry_problem, resolve_cache_dir, write_hashed_file
from dpaudit.checkpoint import CHECKPOINT_FILE, Run, load_run
from dpaudit.data import Dataset, Identity, Splits, Standardizer
from dpaudit.errors import InputError
from dpaudit.fileio import wait_for_writer, work_lock, work_lock_holder
from dpaudit.models import ModelSpec, PythonSpec, factory_source_sha256, one_torch_thread
from dpaudit.progress import NULL_PROGRESS, Progress, announce
from dpaudit.training.config import PerfConfig, TrainConfig
from dpaudit.validation import check_workers, worker_pool

LOGITS_FILE = "logits.npy"
CACHE_VERSION = 2  # 2: entries carry a manifest and logits.npy.sha256 (verified on read)
DASK_CONNECT_TIMEOUT_S = 30


@dataclass(frozen=True, eq=False)
class Recipe:
    """How the target was trained, to train reference models alike: its data, model spec, training
    and performance configs (``configs_from_meta``), its test split (only for the reference checkpoints'
    metrics) and its aux split (public data; where a private recipe fits its preprocessing).

    ``preprocessing``: a fixed preprocessing every reference model uses as it is (nothing fitted), or
    None to fit it as ``train_run`` does. Imported runs set it to their recorded preprocessing (the
    user's scaler, or none): their weights expect those features, and dpaudit never fitted anything.
    """

    dataset: Dataset
    spec: ModelSpec
    config: TrainConfig
    perf: PerfConfig
    test_idx: np.ndarray
    aux_idx: np.ndarray
    label_column: str | None = None
    preprocessing: Standardizer | Identity | None = None

    @classmethod
    def from_run(cls, run: Run, dataset: Dataset | None = None) -> Recipe:
        from dpaudit.training.run import configs_from_meta

        config, perf = configs_from_meta(run.meta)
        if perf.device == "cuda":  # performance-only: a GPU-trained target can be attacked on a CPU machine
            import torch

            if not torch.cuda.is_available():
                perf = replace(perf, device="cpu")
        return cls(
            dataset=dataset if dataset is not None else run.dataset(),
            spec=run.spec,
            config=config,
            perf=perf,
            test_idx=run.splits.test,
            aux_idx=run.splits.aux,
            label_column=run.meta["data"].get("label_column"),
            preprocessing=run.preprocessing if run.meta.get("import") else None,
        )

    def with_seed(self, seed: int) -> TrainConfig:
        return replace(self.config, seed=int(seed))


def model_key(recipe: Recipe, train_idx: np.ndarray, seed: int) -> str:
    """Cache key: sha256 of the data hash, model spec, training config (with ``seed``) and the sorted
    training index set (and a fixed preprocessing, or for a private recipe the aux set its preprocessing
    is fitted on; for a python model the sha256 of its factory's source file now).
    Performance settings are left out: they never change what is trained."""
    idx = np.unique(np.asarray(train_idx, dtype=np.int64))
    payload = {
        "cache_version": CACHE_VERSION,
        "data_sha256": recipe.dataset.sha256,
        "model": recipe.spec.to_dict(),
        "training": recipe.with_seed(seed).to_dict(),
        "train_idx_sha256": hashlib.sha256(idx.astype("<i8").tobytes()).hexdigest(),
        "n_train": len(idx),
    }
    if isinstance(recipe.spec, PythonSpec):  # the user's code that builds the models, as it is now: a model cached
        # before the factory's file was edited is another model, not to be mixed with ones the edited code builds
        payload["factory_source_sha256"] = factory_source_sha256(recipe.spec.factory)
    if recipe.preprocessing is not None:  # fixed (an imported run's): part of what is trained
        payload["preprocessing"] = recipe.preprocessing.to_dict()
    elif recipe.config.dp is not None:  # a private recipe standardises on the aux split (see train_run)
        aux = np.unique(np.asarray(recipe.aux_idx, dtype=np.int64))
        payload["preprocessing_idx_sha256"] = hashlib.sha256(aux.astype("<i8").tobytes()).hexdigest()
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _checkpoint_ok(path: Path) -> bool:
    """Whether the cache entry holds its checkpoint (written atomically, so present means complete)."""
    return (path / CHECKPOINT_FILE).is_file()


def _read_cached(path: Path, shape: tuple[int, int]) -> np.ndarray | None:
    """Logits of a complete, intact cache entry, or None (missing or partial entries are redone; an
    entry whose files differ from the sha256 written with them is removed, with an IntegrityWarning).

    The directory name is the cache key, so an entry is found only for the exact same data,
    model, training config, seed and training set.
    """
    try:
        seen = path.stat()  # the entry checked (another process may replace it meanwhile: see discard_entry)
    except OSError:
        return None
    if not _checkpoint_ok(path):
        return None
    problem = entry_problem(path, hashed=(LOGITS_FILE,))
    if problem is not None:
        discard_entry(path, problem, seen)
        return None
    try:
        logits = np.load(path / LOGITS_FILE, allow_pickle=False)
    except (OSError, ValueError):
        return None
    return logits if logits.shape == shape and logits.dtype == np.float64 else None


def _logits_shape(recipe: Recipe) -> tuple[int, int]:
    return (len(recipe.dataset), recipe.spec.n_classes)


# One reference-model training at a time per process (see train_one): torch's global state is shared by threads.
_TORCH_JOBS = threading.Lock()


def release_freed_heap() -> bool:
    """Hand the heap memory that freed objects left behind back to the operating system (glibc's
    ``malloc_trim(0)``; elsewhere nothing: False). Nothing of a reference model outlives it but its logits, yet
    glibc keeps the freed pages of its training and evaluation (torch's and numpy's buffers of many sizes) and
    fragments them: on 20,000 CIFAR-size images with a small CNN the resident set after each of 5 models was
    657-710 MB (peak 1,405 MB); with this call after each model 385-392 MB (the logits, 1.6 MB a model, are the
    growth; peak 1,078 MB, set inside one model's evaluation)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # no C library by that name, or not glibc (musl, macOS, Windows)
        trim = None
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def train_one(
    recipe: Recipe, train_idx: np.ndarray, seed: int, cache_dir: str, *, wait: bool = True
) -> np.ndarray | None:
    """Train one reference model (or reuse the cached one) and return its float64 logits on every record.

    A model missing from the cache is trained under its entry's :func:`~dpaudit.fileio.work_lock`: another process
    (a second CI job on the same cache, a Dask worker) or thread missing the same entry meanwhile does not train it
    too. With ``wait`` it waits for that one and reads its verified entry (trains it if the other died or left an
    untrusted entry); without, it returns None at once (the caller comes back to it later).

    Runs with a single torch thread (restored afterwards) so that the result does not depend on where
    it runs, and parallel workers do not oversubscribe cores. Safe to call in a worker process, and from
    several threads of one process (a Dask worker started with its default ``--nthreads``): the jobs of one
    process train one at a time (:data:`_TORCH_JOBS`), since torch's random generator and thread count are
    global to the process (two jobs at once drew each other's random numbers: 1800 of 3600 logits differed
    from a local run with 2 threads per Dask worker). Start such workers with ``--nthreads 1`` for parallelism.
    """

    path = _entry(cache_dir, recipe, train_idx, seed)
    shape = _logits_shape(recipe)
    cached = _read_cached(path, shape)
    if cached is not None:
        return cached
    # The entry's work lock first, then this process's torch lock: a thread holding _TORCH_JOBS never waits for a
    # work lock (two processes, each with a thread waiting for the other's, would wait forever).
    with work_lock(path, wait=wait) as held:
        if not held:
            return None  # another process or thread trains it now
        with _TORCH_JOBS:
            return _train_one_locked(recipe, train_idx, seed, path, shape)


def _train_one_locked(recipe: Recipe, train_idx: np.ndarray, seed: int, path: Path, shape) -> np.ndarray:
    from dpaudit.training.run import train_run

    cached = _read_cached(path, shape)  # another thread of this process may have trained it meanwhile
    if cached is not None:
        return cached
    with one_torch_thread():
        train_idx = np.unique(np.asarray(train_idx, dtype=np.int64))
        rest = np.setdiff1d(np.arange(len(recipe.dataset)), np.r_[train_idx, recipe.test_idx, recipe.aux_idx])
        splits = Splits(
            members=train_idx,
            holdout=rest,  # records in none of the other sets (only for the checkpoint's holdout metrics)
            # The target's aux split, public to the attacker: a private recipe fits its standardisation
            # there (train_run), so a DP reference model gets exactly the target's preprocessing.
            aux=np.asarray(recipe.aux_idx, np.int64),
            test=np.asarray(recipe.test_idx, np.int64),
            seed=int(seed),
            fractions=(),
        )
        try:
            seen = path.stat()
        except OSError:
            seen = None
        if seen is not None and not _checkpoint_ok(path):
            discard_entry(path, f"no {CHECKPOINT_FILE}", seen)
        trained: list[np.ndarray] = []  # the logits of every record, from train_run's one pass over the data
        if not _checkpoint_ok(path):  # else only the logits file was missing
            try:
                train_run(
                    recipe.dataset,
                    recipe.spec,
                    recipe.with_seed(seed),
                    recipe.perf,
                    out=path,
                    splits=splits,
                    label_column=recipe.label_column,
                    preprocessing=recipe.preprocessing,
                    every_logits=trained.append,
                )
            except InputError:  # another process trained the same key (it saves now, or it saved first: the
                # entry "already exists"): its entry, written atomically under the same key, is this model
                trained.clear()
                wait_for_writer(path)
                if not _checkpoint_ok(path) or entry_problem(path, hashed=(LOGITS_FILE,)) is not None:
                    raise
        # train_run's logits are the saved model's (bit for bit load_run(path).logits of every record)
        logits = trained[0] if trained else load_run(path).logits(recipe.dataset.view())
    buf = io.BytesIO()
    np.save(buf, logits.astype(np.float64, copy=False), allow_pickle=False)
    write_hashed_file(path, LOGITS_FILE, buf.getvalue())
    del buf
    release_freed_heap()  # the model, its data copies and activations are gone; their pages go back too
    return logits


def train_models(
    recipe: Recipe,
    train_sets: Sequence[np.ndarray],
    seeds: Sequence[int],
    *,
    workers: int = 1,
    scheduler: str | None = None,
    cache_dir: Path | str | None = None,
    progress: Progress = NULL_PROGRESS,
    description: str = "reference models",
    reduce: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Train one model per (train set, seed) with the recipe; return logits ``(n_models, n_records, k)``, or with
    ``reduce`` the stacked ``reduce(logits)`` of each model ``(n_models, ...)`` (``(0,)`` for no model).

    ``reduce`` is applied to each model's logits as soon as they are read from the cache or trained, so only its
    outputs are held: LiRA and RMIA read one signal per candidate (64 models' logits on 50,000 records of 100
    classes are 2.6 GB in float64, and were stacked into a second copy; their signals on the 27,500 candidates 14 MB).

    ``workers`` > 1: a local process pool (joblib/loky), at most the number of cores. ``scheduler``:
    the address of a Dask scheduler (``tcp://host:port``); jobs then run on its workers through
    joblib's dask backend, and ``cache_dir`` should be on a filesystem they share (the logits come
    back to the caller either way). ``cache_dir`` None: :func:`dpaudit.cache.default_cache_dir`.
    Cached models are not retrained.
    """
    from joblib import delayed

    if len(train_sets) != len(seeds):
        raise InputError(f"got {len(train_sets)} training sets but {len(seeds)} seeds")
    workers = check_workers(workers, scheduler=scheduler)
    cache = str(check_cache_dir(resolve_cache_dir(cache_dir)).absolute())
    shape = _logits_shape(recipe)
    keep = reduce if reduce is not None else (lambda logits: logits)
    out: list[np.ndarray | None] = [None] * len(seeds)
    todo = []
    for j, (idx, seed) in enumerate(zip(train_sets, seeds, strict=True)):
        cached = _read_cached(_entry(cache, recipe, idx, seed), shape)
        if cached is None:
            todo.append(j)
        else:
            out[j] = keep(cached)
        del cached  # one model's logits at a time
    if todo:  # before the first one: refuse what cannot fit, ask (--yes) before what takes hours
        from dpaudit.budget import check_trainings, model_parameters, training_cost

        n_train = int(np.mean([len(train_sets[j]) for j in todo[:100]]))
        one = training_cost(
            description, model_parameters(recipe.spec), recipe.config.num_steps(max(n_train, 1)),
            recipe.config.batch_size, private=recipe.config.dp is not None,
        )  # fmt: skip
        check_trainings(description, len(todo) / max(1, workers), one)
    with progress.task(f"{description} ({len(todo)} to train, {len(seeds) - len(todo)} cached)", len(seeds)) as adv:
        adv(len(seeds) - len(todo))

        def run(todo: list[int], wait: bool) -> None:
            jobs = (delayed(train_one)(recipe, train_sets[j], int(seeds[j]), cache, wait=wait) for j in todo)
            if not todo:
                results: Any = []
            elif scheduler is not None:
                results = _run_on_dask(scheduler, jobs)
            elif workers == 1 or len(todo) == 1:
                results = (train_one(recipe, train_sets[j], int(seeds[j]), cache, wait=wait) for j in todo)
            else:
                results = worker_pool(min(workers, len(todo)), return_as="generator")(jobs)
            for j, logits in zip(todo, results, strict=True):
                if logits is not None:
                    out[j] = keep(logits)
                    adv(1)
                del logits

        # First the models no other process is training (those it is are left: two CI jobs on one cache share the
        # work instead of one following the other), then, waiting for it, the ones it was training.
        run(todo, wait=False)
        if busy := [j for j in todo if out[j] is None]:
            holders = [work_lock_holder(_entry(cache, recipe, train_sets[j], seeds[j])) for j in busy]
            if held := [p for p in holders if p]:  # those done meanwhile are read at once: no wait to explain
                pids = sorted(set(held))
                by = "other dpaudit processes" if len(pids) > 1 else "another dpaudit process"
                one = len(held) == 1
                announce(  # one line, before the wait: a job that seems stuck says why
                    f"{description}: {len(held)} {'is' if one else 'are'} being trained by {by} (pid "
                    f"{', '.join(map(str, pids))}) on {cache}; waiting for {'it' if one else 'them'} instead of "
                    f"training {'it' if one else 'them'} twice"
                )
            run(busy, wait=True)
    if not out:
        return np.zeros((0, *shape) if reduce is None else (0,))
    return np.stack(out)


def _entry(cache: str, recipe: Recipe, train_idx: np.ndarray, seed: int) -> Path:
    return Path(cache) / "models" / model_key(recipe, train_idx, seed)


def _run_on_dask(scheduler: str, jobs) -> list[np.ndarray]:
    import joblib

    try:
        from distributed import Client
    except ImportError:
        raise InputError("--scheduler needs dask.distributed: pip install 'dask[distributed]'") from None
    try:
        client = Client(scheduler, timeout=DASK_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as e:
        raise InputError(f"cannot reach the Dask scheduler at {scheduler} ({type(e).__name__}: {e})") from None
    try:
        with joblib.parallel_backend("dask"):
            return list(joblib.Parallel(n_jobs=-1)(jobs))
    finally:
        client.close()


def seeds_for(seed: int, role: str, n: int) -> list[int]:
    """Distinct, reproducible training seeds for ``n`` models of one role ("lira", "shadow")."""
    ss = np.random.SeedSequence([int(seed), *role.encode()])
    return [int(s) for s in ss.generate_state(n, dtype=np.uint32) % (2**31 - 1)]
