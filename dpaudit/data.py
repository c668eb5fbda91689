"""Datasets, deterministic splits and preprocessing.

Embedded datasets need no download (exactly what each holds: :data:`EMBEDDED_DESCRIPTIONS`):
scikit-learn's bundled ``digits``, ``breast-cancer`` and ``wine``; seeded synthetic data
(``synthetic:n=1000,d=20,classes=2,seed=0``) and synthetic token sequences for RNNs
(``synthetic-tokens:n=1000,length=20,vocab=50,classes=2,seed=0``). User data: a CSV file (with
``label_column``), an NPZ file holding arrays ``X`` and ``y`` (read into memory), or a directory
holding ``X.npy`` and ``y.npy``, whose ``X`` is memory-mapped (read-only) and never copied whole:
training, evaluation and the attacks read it a batch of rows at a time (:meth:`Dataset.rows`).
8- and 16-bit integer (and bool) features, e.g. uint8 pixels, are kept as stored and read as float32 a batch
of rows at a time (:attr:`Dataset.dtype`; exact, float32 holds every such value).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import mmap
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.errors import DataError, InputError
from dpaudit.fileio import check_input_file
from dpaudit.validation import FLOAT32_MAX, check_seed, python_scalar, shown

EMBEDDED = ("digits", "breast-cancer", "wine")
# The built-in token data set's name (synthetic-tokens:...): its int64 X is token ids by construction.
SYNTHETIC_TOKENS = "synthetic-tokens"
SPLIT_NAMES = ("members", "holdout", "aux", "test")
DEFAULT_FRACTIONS = (0.35, 0.2, 0.25, 0.2)

# What each embedded dataset holds, exactly (shown by `dpaudit train --help` and docs/data.md).
EMBEDDED_DESCRIPTIONS = {
    "digits": "scikit-learn's load_digits: 1,797 images, shape 1 x 8 x 8 (channels, height, width), pixel "
    "counts 0..16 divided by 16 so values are in [0, 1] (float32); 10 classes, labels 0-9",
    "breast-cancer": "scikit-learn's load_breast_cancer: 569 records, 30 raw float features (float32, "
    "not scaled); 2 classes (0 malignant, 1 benign)",
    "wine": "scikit-learn's load_wine: 178 records, 13 raw float features (float32, not scaled); 3 classes",
    "synthetic:n=,d=,classes=,seed=,sep=": "n records of d float32 features: Gaussian class centres "
    "N(0, sep^2 I), unit-variance noise around them",
    "synthetic-tokens:n=,length=,vocab=,classes=,seed=": "n int64 token sequences of the given length; "
    "each class draws tokens from its own Dirichlet(0.3) distribution over the vocabulary",
}
# The --data option's help (train, import, audit train): every form, and what each embedded set holds.
DATA_HELP = (
    "PATH.csv (with --label-column) | PATH.npz (arrays X, y; any record shape; read into memory) | DIR holding "
    "X.npy (float, or uint8/8-16-bit integer pixels; memory-mapped, streamed a batch at a time) and y.npy (integer "
    "labels) | "
    + " | ".join(f"{name}: {text}" for name, text in EMBEDDED_DESCRIPTIONS.items())
    + ". Labels are renumbered 0..K-1 in sorted order."
)
# Bytes read from a memory-mapped X between two releases of its pages (see Dataset.rows).
RELEASE_EVERY_BYTES = 64 << 20
# Float64 bytes of one block of rows when a standardisation is fitted (Standardizer._fit_blocks).
FIT_BLOCK_BYTES = 8 << 20


def compact_dtype(dtype: np.dtype) -> bool:
    """Features kept as stored and read as float32 per batch (:attr:`Dataset.dtype`): bool and 8- and 16-bit
    integers (uint8 pixels), every value of which float32 holds exactly, so a batch read as float32 is the
    array the whole X made float32 held (a 150 MiB uint8 CIFAR NPZ was kept as a 600 MiB float32 copy)."""
    dtype = np.dtype(dtype)
    return dtype.kind == "b" or (np.issubdtype(dtype, np.integer) and dtype.itemsize <= 2)


def _fit_block_rows(feature_shape: tuple[int, ...]) -> int:
    return max(1, FIT_BLOCK_BYTES // (8 * max(1, math.prod(feature_shape))))


def row_blocks(dataset: Dataset, idx: np.ndarray, batch: int | None = None) -> Iterator[np.ndarray]:
    """The rows ``idx`` of ``dataset`` (:meth:`Dataset.rows`), ``batch`` at a time (default: about
    :data:`FIT_BLOCK_BYTES` of float64)."""
    idx = np.asarray(idx, dtype=np.int64)
    step = batch or _fit_block_rows(dataset.feature_shape)
    return (dataset.rows(idx[s : s + step]) for s in range(0, len(idx), step))


def streamed_moments(dataset: Dataset, idx: np.ndarray, batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The float64 per-feature mean and population standard deviation (1 where it is below 1e-12: constant
    features pass through) of the rows ``idx``, read a block at a time (:func:`_moments`)."""
    return _moments(lambda: row_blocks(dataset, idx, batch), len(idx), dataset.feature_shape)


def _moments(blocks, n: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Two passes over the row blocks ``blocks()`` in float64 (:func:`sequential_sum`, so bit for bit
    ``X.astype(float64).mean(axis=0)`` / ``.std(axis=0)`` whatever the block size): the mean, then the mean
    squared deviation from it (the two-pass variance, as ``numpy.std`` computes it; no sum-of-squares
    cancellation). The float64 copy of the whole split that took (8 bytes per value, twice over in
    ``std``: 820 MiB to fit 17,500 CIFAR images of 205 MiB) is one block here."""
    if n == 0:
        raise InputError("cannot fit a standardisation on an empty split")
    mean = sequential_sum(blocks(), shape) / n

    def squared_deviation(b: np.ndarray) -> np.ndarray:
        b -= mean
        return np.multiply(b, b, out=b)

    std = np.sqrt(sequential_sum(blocks(), shape, squared_deviation) / n)
    return mean, np.where(std > 1e-12, std, 1.0)  # constant features (e.g. blank pixels) pass through


def sequential_sum(blocks: Iterable[np.ndarray], shape: tuple[int, ...], f=None) -> np.ndarray | None:
    """The float64 sum over axis 0 of the row blocks ``blocks`` (each ``(rows, *shape)``; ``f``, if given,
    applied to each block's float64 copy first), None when there are none. Each block is added as more rows
    of one sequential ``numpy.add.reduce`` over axis 0, the order numpy sums a C-ordered array's
    ``X.sum(axis=0)`` in, so the result is bit for bit that of the whole array made float64 at once, whatever
    the block size, with one block in memory instead of the float64 copy of all of them."""
    acc = None
    for block in blocks:
        b = np.array(block, dtype=np.float64, order="C").reshape(-1, *shape)  # a copy: f may change it in place
        b = b if f is None else f(b)
        acc = np.add.reduce(b if acc is None else np.concatenate([acc[None], b]), axis=0)
    return acc


class MappedFile:
    """The read-only memory map under a dataset's ``X.npy``, and the bookkeeping that keeps the pages
    a reader has touched from piling up in the process's resident memory.

    Pages of a file mapping count in the resident set while mapped, although they are the kernel's
    page cache (reclaimable, shared); ``madvise(MADV_DONTNEED)`` unmaps them from this process (the
    file and the cache are untouched; the next read faults them back in): after every batch of rows
    (:meth:`Dataset.rows`) and every :data:`RELEASE_EVERY_BYTES` of a sequential pass (validation,
    hashing), so resident memory stays at a few batches."""

    def __init__(self, path: Path, mm: mmap.mmap) -> None:
        self.path, self._mm, self._read = path, mm, 0

    def note_read(self, nbytes: int) -> None:
        self._read += int(nbytes)
        if self._read >= RELEASE_EVERY_BYTES:
            self.release()

    def release(self) -> None:
        self._read = 0
        if hasattr(mmap, "MADV_DONTNEED"):  # Linux, macOS; elsewhere the kernel reclaims when it must
            self._mm.madvise(mmap.MADV_DONTNEED)


# :attr:`Dataset.label_warnings`: from this many distinct numeric labels, values other than 0..K-1 or 1..K
# are read as a quantity (an age) more likely than as class ids.
QUANTITY_MIN_CLASSES = 20


@dataclass(frozen=True, eq=False)
class Dataset:
    """Features ``X`` and labels ``y``. ``X`` is the data as stored: float32 in memory (NPZ, CSV, embedded), the
    file's dtype when memory-mapped, 8/16-bit integers or bool as the file holds them (uint8 pixels), int64 token
    ids when ``kind == "tokens"``. Read the features with :meth:`rows` / :meth:`view`, in :attr:`dtype`."""

    name: str
    X: np.ndarray
    y: np.ndarray
    n_classes: int
    kind: str  # "image" | "tabular" | "tokens"
    source: str  # the spec string it was loaded from
    vocab_size: int | None = None
    # A directory dataset: X is a read-only view of this memory map (X.npy), in the file's dtype.
    mapped: MappedFile | None = None
    # A CSV dataset: its feature columns' header names, in file order (checked on import, see
    # check_feature_names); None for data without a header.
    feature_names: tuple[str, ...] | None = None
    # The labels as the data holds them, in sorted order: class i of ``y`` is ``classes[i]`` (what a user's own
    # training loop calls it: 1 and 2, -1 and 1, "cat" and "dog"); None where not known.
    classes: np.ndarray | None = field(default=None, repr=False)
    # Records appended to X (canaries, :func:`dpaudit.canaries.with_canaries`): rows ``len(X)``, ``len(X) + 1``, ...
    # of the data set, in :attr:`dtype`, read by :meth:`rows` (X itself stays as it is: a map, or the array in memory).
    appended: np.ndarray | None = field(default=None, repr=False)

    @property
    def label_warnings(self) -> list[str]:
        """A warning when the labels look like a quantity rather than class names: at least
        :data:`QUANTITY_MIN_CLASSES` distinct numbers that are not the class ids 0..K-1 or 1..K (ages 18..90,
        counts with gaps). dpaudit makes each distinct value a class of its own, so an age becomes a
        70-class problem, silently; class ids of a real many-class problem are consecutive from 0 or 1 and
        pass. A warning, never a refusal (integer ids such as 3, 17, 42, ... name classes too)."""
        c = self.classes
        if c is None or len(c) < QUANTITY_MIN_CLASSES or not np.issubdtype(c.dtype, np.number):
            return []
        k, lo, hi = len(c), c[0], c[-1]
        if np.array_equal(c, np.arange(k)) or np.array_equal(c, np.arange(1, k + 1)):
            return []
        return [
            f"the labels are {k} distinct numbers from {lo:g} to {hi:g}: dpaudit makes each value a class of its own "
            f"(a {k}-class classifier); if the label is a quantity (an age, a count, a score), bin it into classes "
            "first (regression targets are not supported)"
        ]

    def outputs_hint(self, n_outputs: int) -> str:
        """Why a model with ``n_outputs`` outputs does not fit these labels, when its outputs look indexed by the
        labels as stored (a next-token head over a vocabulary of ``n_outputs`` ids, trained on the ids that follow
        each sequence): fewer distinct labels than outputs, all integers in ``0 .. n_outputs - 1``, not already
        ``0 .. K-1``. '' otherwise. Class i is the i-th smallest distinct label (see :func:`_validated`), so the
        model's output i must be that label's logit, not id i's."""
        c = self.classes
        if c is None or not np.issubdtype(c.dtype, np.number) or not len(c) < n_outputs:
            return ""
        if not np.all(c == np.round(c)) or c[0] < 0 or c[-1] >= n_outputs or np.array_equal(c, np.arange(len(c))):
            return ""
        k = len(c)
        return (
            f"; the labels are {k} distinct ids from {c[0]:g} to {c[-1]:g}, renumbered 0..{k - 1} in sorted order, so "
            f"a head over all {n_outputs} ids does not fit them: return the logits of the ids that occur as labels, "
            f"logits[:, ids] with ids = np.unique(y), and set n_classes to {k}"
        )

    @property
    def dtype(self) -> np.dtype:
        """The dtype :meth:`rows` (and :meth:`view`, appended records, the content hash) gives the features in:
        float32 for an ``X`` of 8/16-bit integers or bool (:func:`compact_dtype`, cast a batch at a time), else
        ``X``'s own."""
        compact = self.kind != "tokens" and compact_dtype(self.X.dtype)
        return np.dtype(np.float32) if compact else self.X.dtype

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.X.shape[1:])

    def __len__(self) -> int:
        return int(self.X.shape[0]) + (0 if self.appended is None else len(self.appended))

    @cached_property
    def sha256(self) -> str:
        """Content hash of the arrays (dtype, shape and bytes of X and y), hashed a chunk of rows at a
        time (the same digest as hashing all the bytes at once); computed once per object. X is hashed as
        :attr:`dtype` holds it (uint8 pixels as their float32 values: the digest of the float32 array they were
        once converted to, so runs recorded then still match, and an NPZ and an X.npy of the same images agree)."""
        h = hashlib.sha256()
        for a in (self.X, self.y):
            # Appended rows (:attr:`appended`) are hashed as the rows after X's: the digest of the concatenation.
            shape = (len(self), *self.feature_shape) if a is self.X else a.shape
            dtype = self.dtype if a is self.X else a.dtype
            h.update(f"{dtype.str}{shape}".encode())
            more = [self.appended] if a is self.X and self.appended is not None else []
            for chunk in [*self.chunks(a), *more]:
                # A compact X's chunk is cast a quarter at a time (its float32 bytes are 4 times its own).
                step = max(1, len(chunk) // 4) if chunk.dtype != dtype else max(1, len(chunk))
                for s in range(0, len(chunk), step):
                    h.update(np.ascontiguousarray(chunk[s : s + step], dtype=dtype).tobytes())
        return h.hexdigest()

    def chunks(self, a: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """Consecutive blocks of rows of ``a`` (default ``X``) of about :data:`RELEASE_EVERY_BYTES`."""
        a = self.X if a is None else a
        return _blocks(a, self.mapped if a is self.X else None)

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """A copy of the rows ``idx`` of ``X`` (in that order), in :attr:`dtype` (uint8 pixels as float32). For a
        memory-mapped ``X`` the pages read are released after each call, so streaming the data batch by batch
        keeps resident memory at a few batches (:class:`MappedFile`)."""
        idx = np.asarray(idx, dtype=np.int64)
        if self.appended is not None:
            n = self.X.shape[0]
            out = np.empty((len(idx), *self.feature_shape), dtype=self.dtype)
            own = idx < n
            out[own] = self.X[idx[own]]
            out[~own] = self.appended[idx[~own] - n]
        else:
            out = self.X[idx]
            out = out if out.dtype == self.dtype else out.astype(self.dtype)
        if self.mapped is not None:
            # Scattered rows map far more than their bytes (the kernel maps the pages around each fault),
            # so a batch's pages are released right away; madvise over mostly-unmapped ranges is cheap.
            self.mapped.release()
        return out

    def mean_rows(self, idx: np.ndarray) -> np.ndarray:
        """The float64 mean of the rows ``idx`` of ``X``, read a block of rows at a time (:func:`sequential_sum`:
        bit for bit ``X[idx].astype(float64).mean(axis=0)``, without that copy); NaN where ``idx`` is empty."""
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) == 0:
            return np.full(self.feature_shape, np.nan)
        step = _fit_block_rows(self.feature_shape)
        blocks = (self.rows(idx[s : s + step]) for s in range(0, len(idx), step))
        return sequential_sum(blocks, self.feature_shape) / len(idx)

    def __reduce_ex__(self, protocol):
        # A memory-mapped dataset travels to worker processes as its spec and is mapped again there
        # (no copy of X in the pickle); the worker's load validates it as any load does.
        if self.mapped is not None:
            if self.appended is not None:  # the records appended to the map travel with it, and the labels
                return (_with_appended, (self.source, self.appended, self.y))
            return (load_dataset, (self.source,))
        return super().__reduce_ex__(protocol)

    def view(self, idx: np.ndarray | None = None) -> RowView:
        """The rows ``idx`` (default: all) of ``X`` as a lazy sequence read a slice at a time."""
        return RowView(self, None if idx is None else np.asarray(idx, dtype=np.int64))

    def label(self, k: int) -> int | str:
        """The data's own label of class index ``k`` (``classes[k]``, JSON-ready; ``k`` where not known)."""
        if self.classes is None:
            return int(k)
        v = self.classes[int(k)].item()
        if isinstance(v, float) and v.is_integer():  # a float y array's 2.0 is the label 2 (labels are integers)
            return int(v)
        return v if isinstance(v, int | float | str) else str(v)

    def class_indices(self, labels: str | Sequence[Any] | None, *, option: str = "classes") -> tuple[int, ...]:
        """Class indices of labels given as the data holds them (``"1,2"``, ``"-1"``, ``"dog"``, or a sequence);
        None or blank: every class. A user thinks in the labels of their data (what ``canaries make`` writes
        and their own training reads); an index would silently name another class wherever the labels are not
        0..K-1 (``1`` of labels {1, 2} is the index of 2), so anything but a label is refused, and repeats too."""
        if labels is None or (isinstance(labels, str) and not labels.strip()):
            return tuple(range(self.n_classes))
        labels = python_scalar(labels)  # a 0-d array or tensor: its label
        if isinstance(labels, str):
            parts = labels.split(",")
        else:  # one label alone (``classes=3``) is that label; it was TypeError "'int' object is not iterable"
            parts = list(labels) if isinstance(labels, Iterable) else [labels]
        texts = [t for t in (str(python_scalar(p)).strip() for p in parts) if t]  # np.int64(3), tensor(3): "3"
        known = [str(self.label(k)).strip() for k in range(self.n_classes)]
        numeric = self.classes is None or self.classes.dtype.kind in "iubf"
        out = []
        for t in texts:
            key = t
            if numeric:  # "2", "+2", "2.0" all name the label 2
                try:
                    number = float(t)
                except ValueError:
                    number = math.nan
                if number.is_integer():
                    key = str(int(number))
            if key not in known:
                shown_labels = ", ".join(known[:20]) + (", …" if len(known) > 20 else "")
                raise InputError(
                    f"{option}: {t!r} is not a label of {self.name} (its labels: {shown_labels}); give the labels "
                    "as your data holds them, not class indices"
                )
            out.append(known.index(key))
        if len(set(out)) != len(out):
            raise InputError(f"{option}: labels repeat in {labels!r}")
        if not out:
            raise InputError(f"{option}: no label given in {labels!r}")
        return tuple(out)

    def describe(self) -> dict[str, Any]:
        return {
            "spec": self.source,
            "name": self.name,
            "kind": self.kind,
            "n": len(self),
            "feature_shape": list(self.feature_shape),
            "dtype": str(self.dtype),
            "n_classes": self.n_classes,
            "vocab_size": self.vocab_size,
            "memory_mapped": self.mapped is not None,
            "sha256": self.sha256,
        }


@dataclass(frozen=True, eq=False)
class RowView:
    """Rows ``idx`` (None: all) of a dataset's ``X``, read when sliced (``view[s:e]`` is a copy of those
    rows, via :meth:`Dataset.rows`), so a model can be evaluated on them a batch at a time."""

    dataset: Dataset
    idx: np.ndarray | None

    def __len__(self) -> int:
        return len(self.dataset) if self.idx is None else len(self.idx)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.dataset.feature_shape)

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError("a RowView is read by slices")
        idx = np.arange(len(self))[key] if self.idx is None else self.idx[key]
        return self.dataset.rows(idx)


def _with_appended(source: str, appended: np.ndarray, y: np.ndarray) -> Dataset:
    """A memory-mapped data set loaded again (in a worker process) with its appended records and labels."""
    return dataclasses.replace(load_dataset(source), y=y, appended=appended)


def _blocks(a: np.ndarray, mapped: MappedFile | None = None) -> Iterator[np.ndarray]:
    step = max(1, RELEASE_EVERY_BYTES // max(1, a[:1].nbytes))
    for start in range(0, len(a), step):
        block = a[start : start + step]
        yield block
        if mapped is not None:
            mapped.note_read(block.nbytes)
    if mapped is not None:
        mapped.release()  # the pass's last window too


def _parse_params(text: str, allowed: dict[str, type], spec: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not text:
        return out
    for item in text.split(","):
        if "=" not in item:
            raise InputError(f"bad dataset spec {spec!r}: expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip()
        if key not in allowed:
            raise InputError(f"bad dataset spec {spec!r}: unknown key {key!r}; valid: {', '.join(allowed)}")
        try:
            out[key] = allowed[key](value)
        except ValueError:
            raise InputError(f"bad dataset spec {spec!r}: {key} must be a number, got {value!r}") from None
    return out


def _synthetic(spec: str, params: str) -> Dataset:
    p = {"n": 1000, "d": 20, "classes": 2, "seed": 0, "sep": 1.0}
    p.update(_parse_params(params, {"n": int, "d": int, "classes": int, "seed": int, "sep": float}, spec))
    if p["n"] < 2 or p["d"] < 1 or p["classes"] < 2:
        raise InputError(f"bad dataset spec {spec!r}: need n >= 2, d >= 1, classes >= 2")
    rng = np.random.default_rng(p["seed"])
    # Gaussian class clusters: centres at distance ~sep, isotropic unit noise.
    centres = rng.normal(0.0, p["sep"], size=(p["classes"], p["d"]))
    y = rng.integers(0, p["classes"], size=p["n"])
    X = centres[y] + rng.normal(size=(p["n"], p["d"]))
    return _validated("synthetic", X.astype(np.float32), y, "tabular", spec)


def _synthetic_tokens(spec: str, params: str) -> Dataset:
    p = {"n": 1000, "length": 20, "vocab": 50, "classes": 2, "seed": 0}
    p.update(_parse_params(params, {"n": int, "length": int, "vocab": int, "classes": int, "seed": int}, spec))
    if p["n"] < 2 or p["length"] < 1 or p["vocab"] < 2 or p["classes"] < 2:
        raise InputError(f"bad dataset spec {spec!r}: need n >= 2, length >= 1, vocab >= 2, classes >= 2")
    rng = np.random.default_rng(p["seed"])
    # Each class prefers its own token distribution (a Dirichlet draw), so the task is learnable.
    probs = rng.dirichlet(np.full(p["vocab"], 0.3), size=p["classes"])
    y = rng.integers(0, p["classes"], size=p["n"])
    X = np.stack([rng.choice(p["vocab"], size=p["length"], p=probs[c]) for c in y]).astype(np.int64)
    return _validated(SYNTHETIC_TOKENS, X, y, "tokens", spec, vocab_size=p["vocab"])


def _embedded(name: str) -> Dataset:
    from sklearn import datasets as skd

    if name == "digits":
        b = skd.load_digits()
        X = (b.images / 16.0).astype(np.float32)[:, None, :, :]  # (n, 1, 8, 8), values in [0, 1]
        return _validated(name, X, b.target, "image", name)
    loader = {"breast-cancer": skd.load_breast_cancer, "wine": skd.load_wine}[name]
    b = loader()
    return _validated(name, b.data.astype(np.float32), b.target, "tabular", name)


def _class_subset(ds: Dataset, params: str, spec: str) -> Dataset:
    """``NAME:a,b,...``: the records of an embedded dataset whose original labels are a, b, ... (e.g.
    ``digits:3,8``, a binary task); labels renumbered 0.. in increasing order of the original label."""
    try:
        keep = sorted({int(p) for p in params.split(",") if p.strip()})
    except ValueError:
        raise InputError(f"expected {spec!r} as NAME:LABEL,LABEL,... (e.g. digits:3,8)") from None
    bad = [k for k in keep if not 0 <= k < ds.n_classes]
    if len(keep) < 2 or bad:
        raise InputError(f"{spec!r}: give at least two labels of {ds.name} (0..{ds.n_classes - 1})")
    mask = np.isin(ds.y, keep)
    return _validated(f"{ds.name}:{','.join(map(str, keep))}", ds.X[mask], ds.y[mask], ds.kind, spec)


def _from_csv(path: Path, label_column: str | None, spec: str) -> Dataset:
    import pandas as pd

    if label_column is None:
        raise InputError(f"{path}: CSV data needs --label-column to name the label column")
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the CSV file is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a readable CSV file ({str(e).splitlines()[0]})") from None
    if label_column not in df.columns:
        stripped = [c for c in df.columns if str(c).strip() == label_column.strip()]
        if len(stripped) != 1:  # "a, b, y": pandas keeps the space in " y"
            raise DataError(f"{path}: no label column {label_column!r}{_header_hint(list(df.columns))}")
        label_column = stripped[0]
    if len(df) == 0:
        raise DataError(f"{path}: the dataset is empty")
    features = df.drop(columns=[label_column])
    if features.shape[1] == 0:
        raise DataError(f"{path}: no feature columns besides the label column {label_column!r}")
    _check_no_index_column(path, df.columns, label_column)
    bad = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c].dtype)]
    if bad:
        raise DataError(f"{path}: non-numeric feature column(s): {', '.join(map(str, bad[:5]))}")
    missing = [str(c) for c in features.columns if features[c].isna().any()]
    if missing:  # what to fix, by name (the array check below can only say "NaN")
        first = int(np.flatnonzero(features[missing[0]].isna().to_numpy())[0])
        raise DataError(
            f"{path}: missing values in feature column(s) {', '.join(map(repr, missing[:5]))} (first: data row "
            f"{first + 1}); fill or drop them before auditing"
        )
    _check_no_row_id(path, features)
    labels = df[label_column]
    if labels.isna().any():
        raise DataError(f"{path}: label column {label_column!r} has missing values")
    if pd.api.types.is_numeric_dtype(labels.dtype):  # numbers must be class labels; strings are names of classes
        _check_integer_labels(labels.to_numpy(), f"{path}: label column {label_column!r}")
    ds = _validated(path.stem, features.to_numpy(dtype=np.float64), labels.to_numpy(), "tabular", spec)
    return dataclasses.replace(ds, feature_names=tuple(str(c).strip() for c in features.columns))


# The name pandas gives a column whose header cell is empty, as in the row index that ``DataFrame.to_csv``
# writes by default (header ",a,b,y"); saved again with index=False, the name itself is written.
_UNNAMED_COLUMN = re.compile(r"Unnamed: \d+")


def _check_no_index_column(path: Path, columns: Any, label_column: str) -> None:
    """Refuse a column without a header name: it is almost always the row index of ``to_csv``'s default
    ``index=True``, a feature that names each record (the model would read the row number)."""
    for i, c in enumerate(columns):
        if c != label_column and _UNNAMED_COLUMN.fullmatch(str(c)):
            raise DataError(
                f"{path}: column {i + 1} has no header name ({str(c)!r}), as the row index that pandas' to_csv "
                "writes by default; it would be read as a feature: write the file with to_csv(..., index=False), "
                "or give the column a name"
            )


# Below this many records a column of distinct consecutive integers may be a real feature by chance.
ROW_ID_MIN_RECORDS = 20


def _check_no_row_id(path: Path, features: Any) -> None:
    """Refuse a named feature column holding distinct consecutive integers (``id``, ``PassengerId``: 0..n-1 or
    1..n in any order): a row number, which names each record, so a model could fit every record by it and the
    membership attacks would measure that; as the unnamed index column above, it is almost always a mistake."""
    import pandas as pd

    n = len(features)
    if n < ROW_ID_MIN_RECORDS:
        return
    for c in features.columns:
        v = features[c].to_numpy()
        if not pd.api.types.is_integer_dtype(v.dtype):
            continue
        if int(v.max()) - int(v.min()) == n - 1 and len(np.unique(v)) == n:
            raise DataError(
                f"{path}: feature column {str(c)!r} holds {n} distinct consecutive integers ({int(v.min())}.."
                f"{int(v.max())}): a row id, which names each record, would be read as a feature; drop the column"
            )


def _header_hint(columns: list) -> str:
    # What the first line of a CSV without the asked-for label column says about the file (one line).
    names = [str(c) for c in columns]
    for sep, word in ((";", "semicolon"), ("\t", "tab")):
        if len(names) == 1 and sep in names[0]:
            return f": the file looks {word}-separated ({names[0][:60]!r}); dpaudit reads comma-separated CSV"
    if all(_is_number(n.split(".")[0] if n.count(".") > 1 else n) for n in names):  # pandas dedups "0" as "0.1"
        return (
            f": its first line ({', '.join(names[:5])}{', …' if len(names) > 5 else ''}) is data, not a header; "
            "add a header line naming the columns"
        )
    return f" (columns: {', '.join(names[:20])}{', …' if len(names) > 20 else ''})"


def _from_npz(path: Path, spec: str) -> Dataset:
    import zipfile

    if not zipfile.is_zipfile(path):
        raise DataError(f"{path}: not a readable NPZ file (not a zip archive)")
    try:
        with np.load(path, allow_pickle=False) as z:  # never unpickle data from strangers
            if "X" not in z.files or "y" not in z.files:
                raise DataError(f"{path}: NPZ file must hold arrays 'X' and 'y' (has: {', '.join(z.files)})")
            X, y = z["X"], z["y"]
    except DataError:
        raise
    except ValueError as e:
        raise _numpy_load_error(path, e, "NPZ file") from None
    except Exception as e:
        raise DataError(f"{path}: not a readable NPZ file ({type(e).__name__})") from None
    if not (np.issubdtype(X.dtype, np.number) or X.dtype == bool):
        # ml_dtypes' bfloat16 (what a torch/JAX bfloat16 array becomes in NumPy) is stored as raw 2-byte voids
        hint = "; a bfloat16 array is stored so: save X.astype('float32')" if X.dtype.kind == "V" else ""
        raise DataError(f"{path}: X must be numeric, got dtype {X.dtype}{hint}")
    if np.issubdtype(X.dtype, np.complexfloating):  # the float cast below dropped the imaginary parts silently
        raise DataError(
            f"{path}: X is complex (dtype {X.dtype}); dpaudit reads real features: save X.real, or the real and "
            "imaginary parts as features of their own, np.concatenate([X.real, X.imag], axis=1)"
        )
    _check_integer_labels(y, str(path))
    if _holds_tokens(X):
        return _tokens(path.stem, X, y, spec, str(path))
    kind = "image" if X.ndim == 4 else "tabular"
    # float32 holds 8- and 16-bit integers, bools and float16 exactly: those integers and bools (8-bit images at
    # CIFAR scale: 150 MB in the file) are kept as stored and read as float32 a batch at a time (Dataset.dtype),
    # float16 goes straight to float32, neither through a float64 copy 8 times their size; wider integers keep
    # the float64 step, as before (its rounding decides the bytes that the run's data hash covers).
    exact = X.dtype == bool or X.dtype.itemsize <= 2 or X.dtype == np.float32
    return _validated(path.stem, X if exact else X.astype(np.float64), y, kind, spec)


def _numpy_load_error(path: Path, e: ValueError, what: str) -> DataError:
    """The one line for numpy's ValueError on loading ``path`` with ``allow_pickle=False``: an object array (which
    only pickle could load, refused), or else a file cut short or corrupt (an interrupted copy or download:
    "mmap length is greater than file size", "EOF: reading array data"), which is not said to be a pickle."""
    if "allow_pickle" in str(e):
        return DataError(f"{path}: object arrays are refused in {what} (loading them needs pickle): {e}")
    return DataError(f"{path}: not a readable {what}, truncated or corrupt ({e})")


def _holds_tokens(X: np.ndarray) -> bool:
    """An integer 2-D ``X`` (one sequence of ids per row) is token data, as a tokenizer writes it (int32,
    int64, uint16, ...); numeric features are stored as floats (``X.astype('float32')``), images as 4-D
    arrays. Except uint8 (and bool): 8-bit pixels of flattened images (MNIST as ``(n, 784)`` uint8) and
    binary features stay numeric features, as they always were; no tokenizer's vocabulary fits in 8 bits."""
    return X.ndim == 2 and np.issubdtype(X.dtype, np.integer) and X.dtype != np.uint8


def _tokens(name: str, X: np.ndarray, y: np.ndarray, spec: str, source: str) -> Dataset:
    """Token sequences from a user's file: ids must be >= 0; the vocabulary is 0 .. max id."""
    low = int(X.min()) if X.size else 0
    if low < 0:
        raise DataError(
            f"{source}: an integer X is read as token ids, which must be >= 0 (found {low}); "
            "for numeric features save X as floats, e.g. X.astype('float32'); token ids padded with a negative id "
            f"(-1, -100): give the padding an id of its own, e.g. np.where(X < 0, {int(X.max()) + 1}, X) (the "
            "model's Embedding then needs one more row; a padding mask reads that id)"
        )
    vocab = int(X.max()) + 1 if X.size else 1
    return _validated(name, np.asarray(X), y, "tokens", spec, vocab_size=vocab)


def _check_integer_labels(y: np.ndarray, source: str) -> None:
    """Labels of NPZ/NPY data must be class labels: integers (an integer or bool dtype, or floats with integral
    values) or names of classes (a NumPy string array, as a CSV's string labels are: class i is the i-th name in
    sorted order)."""
    if np.issubdtype(y.dtype, np.integer) or y.dtype == bool or y.dtype.kind == "U":
        return
    if y.dtype.kind == "S":  # bytes: their names would reach the report as b'cat'
        raise DataError(f"{source}: labels are bytes (dtype {y.dtype}); save them as str, y.astype(str)")
    if np.issubdtype(y.dtype, np.floating):
        frac = y[np.isfinite(y) & (y != np.round(y))]
        if len(frac) == 0:
            return
        raise DataError(
            f"{source}: labels must be integers, got dtype {y.dtype} with non-integer values (e.g. {shown(frac[0])}); "
            "dpaudit audits classifiers: regression targets are not supported (bin them into classes first)"
        )
    raise DataError(f"{source}: labels must be integers, got dtype {y.dtype}")


def _from_npy_dir(path: Path, spec: str) -> Dataset:
    """``path/X.npy`` memory-mapped (read-only, never copied whole) and ``path/y.npy`` read into memory."""
    files = {name: path / f"{name}.npy" for name in ("X", "y")}
    missing = [f.name for f in files.values() if not (f.exists() or f.is_symlink())]
    for f in files.values():  # present but a pipe, a device, a folder, a broken link: said, never read
        if f.name not in missing:
            check_input_file(f, error=DataError)
    if missing:
        raise DataError(f"{path}: a data directory must hold X.npy and y.npy (missing: {', '.join(missing)})")
    try:
        header = np.load(files["X"], mmap_mode="r", allow_pickle=False)  # reads the header only
        y = np.load(files["y"], allow_pickle=False)  # never unpickle data from strangers
    except ValueError as e:
        raise _numpy_load_error(path, e, "X.npy/y.npy") from None
    except OSError as e:
        raise DataError(f"{path}: not a readable .npy file ({e})") from None
    if isinstance(header, np.memmap) and _holds_tokens(header):  # token ids: n x T integers, read into memory
        del header
        _check_integer_labels(y, str(files["y"]))
        return _tokens(path.name, np.load(files["X"], allow_pickle=False), y, spec, str(files["X"]))
    if not isinstance(header, np.memmap) or not (
        np.issubdtype(header.dtype, np.floating) or compact_dtype(header.dtype)
    ):
        raise DataError(
            f"{files['X']}: X must be a floating-point array (float16/32/64), 8- or 16-bit integers or bool (e.g. "
            f"uint8 pixels), or 2-D integer token ids, got dtype {header.dtype} with shape {list(header.shape)}; "
            "convert the features first, e.g. X.astype('float32')"
        )
    if header.ndim < 2:
        raise DataError(f"{files['X']}: X must have one row per record, got shape {list(header.shape)}")
    shape, dtype, offset = header.shape, header.dtype, int(header.offset)
    order = "F" if header.flags.f_contiguous and not header.flags.c_contiguous else "C"
    del header
    with open(files["X"], "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # our own map, so its pages can be released
    X = np.ndarray(shape, dtype=dtype, buffer=mm, offset=offset, order=order)
    _check_integer_labels(y, str(files["y"]))
    if y.shape[:1] != X.shape[:1]:
        raise DataError(f"{path}: X.npy has {X.shape[0]} rows but y.npy has {y.shape[0] if y.ndim else 0}")
    kind = "image" if X.ndim == 4 else "tabular"
    mapped = MappedFile(files["X"], mm)
    return _validated(path.name, X, y, kind, spec, mapped=mapped)


def _check_finite_features(X: np.ndarray, spec: str) -> None:
    """Features must be finite, and finite in float32, the dtype models read them in (float64 data is cast to
    float32 on loading, or a batch at a time when memory-mapped): a float64 1e39 became inf there, the scaler's
    mean inf, and training saved a NaN model with exit 0."""
    if not np.all(np.isfinite(X)):
        raise DataError(f"{spec}: features contain NaN or inf")
    if X.dtype.itemsize > 4 and X.size and (big := max(float(X.max()), -float(X.min()))) > FLOAT32_MAX:  # no |X| copy
        raise DataError(
            f"{spec}: features reach {big:.3g} in magnitude, beyond {FLOAT32_MAX:.4g}, the largest float32 (models "
            "compute in float32, where such a value is inf); rescale those columns first, e.g. divide them by a "
            "power of ten"
        )


def _validated(
    name: str,
    X: np.ndarray,
    y: np.ndarray,
    kind: str,
    spec: str,
    vocab_size: int | None = None,
    mapped: MappedFile | None = None,
) -> Dataset:
    for what, a in (("X", X), ("y", y)):  # a 0-d array (np.savez(..., y=3)) has no rows to count
        if a.ndim == 0:
            raise DataError(f"{spec}: {what} must hold one row per record, got a single value ({shown(a)})")
    if X.shape[0] == 0:
        raise DataError(f"{spec}: the dataset is empty")
    if X.shape[0] != y.shape[0]:
        raise DataError(f"{spec}: X has {X.shape[0]} rows but y has {y.shape[0]}")
    if y.ndim != 1:
        hint = ""
        if y.ndim == 2 and y.shape[1] == 1:
            hint = ": one label per record, y.ravel()"
        elif y.ndim == 2 and np.isin(y, (0, 1)).all() and (y.sum(axis=1) == 1).all():  # one-hot rows
            hint = ": it looks one-hot; give the class indices, y.argmax(axis=1)"
        raise DataError(f"{spec}: y must be one-dimensional, got shape {y.shape}{hint}")
    if kind == "tokens" or not np.issubdtype(X.dtype, np.inexact):
        pass  # integers and bools are finite
    else:  # a memory-mapped X: checked a block of rows at a time, kept as it is
        for block in _blocks(X, mapped) if mapped is not None else [X]:
            _check_finite_features(block, spec)
    if np.issubdtype(y.dtype, np.floating) and not np.all(np.isfinite(y)):
        raise DataError(f"{spec}: labels contain NaN or inf")
    if X.ndim == 1:
        X = X[:, None]
    classes, y_idx = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        raise DataError(f"{spec}: labels have a single class ({classes.tolist()[0]!r}); need at least 2")
    if mapped is None:
        # 8/16-bit integers and bools stay as stored (read as float32 per batch: Dataset.dtype); a fresh array of
        # ours is not copied.
        keep = kind != "tokens" and compact_dtype(X.dtype)
        X = X if keep else X.astype(np.int64 if kind == "tokens" else np.float32, copy=False)
        X.setflags(write=False)
    y_idx = y_idx.astype(np.int64)
    y_idx.setflags(write=False)
    if classes.dtype == object:  # a CSV's string labels: a plain string array (object arrays need pickle)
        classes = classes.astype(str)
    classes.setflags(write=False)
    return Dataset(name, X, y_idx, len(classes), kind, spec, vocab_size, mapped, classes=classes)


def spec_path(spec: str) -> Path | None:
    """The file or directory a dataset spec names; None for an embedded or generated dataset."""
    head = spec.partition(":")[0]
    if spec in EMBEDDED or head in EMBEDDED or head in ("synthetic", SYNTHETIC_TOKENS):
        return None
    return Path(spec)


def load_dataset(spec: str, *, label_column: str | None = None) -> Dataset:
    """Load a dataset from a spec: an embedded name, ``synthetic:...``, a CSV/NPZ path, or a directory
    holding ``X.npy`` and ``y.npy`` (``X`` memory-mapped). A :class:`pathlib.Path` (any ``os.PathLike``) is always a
    path, never a name: ``Path("digits")`` is the folder ``./digits``."""
    spec = check_data_spec(spec)
    path = spec_path(spec)
    if path is None:
        head, _, params = spec.partition(":")
        if spec in EMBEDDED:
            return _embedded(spec)
        if head in EMBEDDED:
            return _class_subset(_embedded(head), params, spec)
        if head == "synthetic":
            return _synthetic(spec, params)
        return _synthetic_tokens(spec, params)
    if path.is_dir():
        return _from_npy_dir(path, spec)
    if path.suffix.lower() == ".csv":
        return _from_csv(path, label_column, spec)
    return _from_npz(path, spec)


def check_data_spec(spec: str | os.PathLike, *, label_column: str | None = None) -> str:
    """The spec as :func:`load_dataset` reads it (a path-like made a path string), after the refusals that read
    no data: not a name or path, no such file, not a file, unreadable, an unsupported file type, an unknown name.
    Cheap (a few system calls): the CLI calls it before importing torch, so ``train --data nope`` is refused at
    once (it took seconds).

    ``label_column`` (a user's, as given): refused unless ``spec`` is a CSV file, the one format that reads it
    (``train --data digits --label-column y`` trained on digits' own labels, the option silently ignored). The
    commands call this with it; :func:`load_dataset` does not, so a run recorded with one still loads."""
    checked = _check_data_spec(spec)
    path = spec_path(checked)
    if label_column is not None and (path is None or path.is_dir() or path.suffix.lower() != ".csv"):
        raise InputError(
            f"label_column {label_column!r} applies to a CSV file only, not to the data {checked!r} (which holds its "
            "labels already)"
        )
    return checked


def _check_data_spec(spec: str | os.PathLike) -> str:
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
        spec = spec if spec_path(spec) is not None else os.path.join(".", spec)
    if not isinstance(spec, str) or not spec:
        got = repr(spec) if isinstance(spec, str) else type(spec).__name__
        raise InputError(f"expected a dataset name or path, got {got}")
    path = spec_path(spec)
    if path is None or path.is_dir():
        return spec
    if path.suffix.lower() in (".csv", ".npz") or path.exists():
        check_input_file(path, error=DataError)  # what a pipe or a device is, said without opening it
        if path.suffix.lower() in (".csv", ".npz"):
            return spec
        hint = ""
        if path.suffix.lower() == ".npy":  # one array cannot hold the labels too
            hint = f", or give the directory that holds X.npy and y.npy ({str(path.parent)!r})"
        raise DataError(f"{path}: unsupported data file type {path.suffix!r}; use .csv or .npz{hint}")
    forms = ("synthetic:n=..,d=..,classes=..", "synthetic-tokens:...", "PATH.csv", "PATH.npz", "DIR (X.npy, y.npy)")
    valid = ", ".join([*EMBEDDED, *forms])
    # Named as the workflows' parameter ``data``: the CLI shows it as --data (cli._common.with_option_names).
    raise InputError(f"unknown data {spec!r}; valid: {valid}")


@dataclass(frozen=True)
class Splits:
    """Disjoint index arrays: target train (members), target holdout (non-members), the attacker's
    auxiliary pool (shadow/reference data) and a test split for utility."""

    members: np.ndarray
    holdout: np.ndarray
    aux: np.ndarray
    test: np.ndarray
    seed: int
    fractions: tuple[float, ...] = field(default=DEFAULT_FRACTIONS)

    def as_dict(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in SPLIT_NAMES}

    def sizes(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in SPLIT_NAMES}


def make_splits(n: int, seed: int, fractions: tuple[float, ...] = DEFAULT_FRACTIONS) -> Splits:
    """Deterministic split of ``range(n)`` from ``seed`` into members/holdout/aux/test."""
    if len(fractions) != 4 or any((not math.isfinite(f)) or f < 0 for f in fractions):
        raise InputError(f"expected 4 non-negative split fractions (members,holdout,aux,test), got {fractions}")
    total = float(sum(fractions))
    if not 0 < total <= 1 + 1e-9:
        raise InputError(f"split fractions must sum to at most 1, got {total:g}")
    if fractions[0] <= 0:
        raise InputError("the members split must be non-empty")
    # Named as every caller's parameter (split_seed; the CLI's --split-seed): the one seed rule.
    seed = check_seed(split_seed=seed)
    perm = np.random.default_rng(seed).permutation(n)
    counts = [math.floor(f * n) for f in fractions]
    if counts[0] < 2:
        raise DataError(f"dataset of {n} records is too small: the members split would hold {counts[0]}")
    bounds = np.cumsum([0, *counts])
    parts = [np.sort(perm[bounds[i] : bounds[i + 1]]).astype(np.int64) for i in range(4)]
    return Splits(*parts, seed=seed, fractions=tuple(float(f) for f in fractions))


@dataclass(frozen=True)
class Standardizer:
    """Per-feature standardisation fitted on the training split only (saved with the checkpoint)."""

    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def fit(cls, X: np.ndarray, batch: int | None = None) -> Standardizer:
        """Per-feature mean and population standard deviation of ``X`` (n records), ``batch`` rows at a time
        (default: about :data:`FIT_BLOCK_BYTES` of float64): see :meth:`_fit_blocks`."""
        X = np.asarray(X)
        step = batch or _fit_block_rows(X.shape[1:])
        return cls._fit_blocks(lambda: (X[s : s + step] for s in range(0, len(X), step)), len(X), X.shape[1:])

    @classmethod
    def fit_streamed(cls, dataset: Dataset, idx: np.ndarray, batch: int | None = None) -> Standardizer:
        """:meth:`fit` on ``dataset.X[idx]`` read ``batch`` rows at a time with :meth:`Dataset.rows` (a
        memory-mapped X releases its pages after each), never the whole split at once."""
        mean, scale = streamed_moments(dataset, idx, batch)
        return cls(mean.astype(np.float32), scale.astype(np.float32))

    @classmethod
    def _fit_blocks(cls, blocks, n: int, shape: tuple[int, ...]) -> Standardizer:
        mean, scale = _moments(blocks, n, shape)
        return cls(mean.astype(np.float32), scale.astype(np.float32))

    def transform(self, X: np.ndarray) -> np.ndarray:
        """``(X - mean) / scale`` in float32, as one new array (8-bit pixels are cast exactly on the way):
        the subtraction allocates it, the division is in place."""
        out = np.subtract(np.asarray(X), self.mean, dtype=np.float32)  # asarray: a tensor comes back an array
        out /= self.scale
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "standardize",
            "shape": list(self.mean.shape),
            "mean": self.mean.ravel().tolist(),
            "scale": self.scale.ravel().tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Standardizer:
        """From :meth:`to_dict`'s record (a checkpoint.json's, which may have been edited): InputError, one line,
        for a shape that is not a list of sizes or arrays of another size, type or with NaN."""
        shape = d.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2**31 - 1 for v in shape
        ):
            raise InputError(f"expected shape to be a list of sizes, got {shown(shape)}")
        out = []
        for key in ("mean", "scale"):
            try:
                a = np.asarray(d.get(key))
            except (TypeError, ValueError):  # ragged nesting
                a = np.asarray([None])
            if a.dtype.kind not in "iuf" or a.size != math.prod(shape) or not np.all(np.isfinite(a)):
                raise InputError(f"expected {key} to be {math.prod(shape)} finite numbers (shape {shape})")
            out.append(a.astype(np.float64).reshape(shape))
        if np.any(out[1] <= 0):
            raise InputError("expected scale to be positive everywhere (it divides the features)")
        _check_float32_standardizer(*out, "")
        return cls(*(a.astype(np.float32) for a in out))


@dataclass(frozen=True)
class Identity:
    """No preprocessing (token ids; the raw features of a private run without a public split)."""

    def transform(self, X: np.ndarray) -> np.ndarray:
        """``X`` as it is; 8/16-bit integer or bool features as float32, as :meth:`Dataset.rows` reads them (token
        ids are int64, never compact)."""
        return X.astype(np.float32) if isinstance(X, np.ndarray) and compact_dtype(X.dtype) else X

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "identity"}


def fit_preprocessing(dataset: Dataset, train_idx: np.ndarray) -> Standardizer | Identity:
    if dataset.kind == "tokens":
        return Identity()
    # A block of rows at a time for every dataset, memory-mapped or not (no copy of the whole training split).
    return Standardizer.fit_streamed(dataset, train_idx)


def preprocessing_from_dict(d: dict[str, Any]) -> Standardizer | Identity:
    kind = d.get("kind")
    if kind == "standardize":
        return Standardizer.from_dict(d)
    if kind == "identity":
        return Identity()
    raise InputError(f"unknown preprocessing kind {kind!r}")


# --------------------------------------------------------------------------- imported models' splits

# Shares of the non-member records (everything not in a user's member list) given to the holdout
# (the attacks' non-member candidates), aux (the attacker's public pool: shadow/reference data) and
# test (utility) splits of an imported run. Documented in `dpaudit import --help` and docs/model-spec.md.
IMPORT_NON_MEMBER_SHARES = {"holdout": 0.4, "aux": 0.4, "test": 0.2}


def check_member_indices(indices: np.ndarray, n: int, source: str) -> np.ndarray:
    """``indices`` as sorted int64 record indices into a dataset of ``n`` records, or a one-line
    :class:`DataError` naming ``source``: empty, out of range, duplicated, or covering every record
    (no non-members left to attack or test with)."""
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise DataError(f"{source}: expected a one-dimensional list of record indices, got shape {list(idx.shape)}")
    if len(idx) == 0:
        raise DataError(f"{source}: the member list is empty")
    if len(idx) == n and n > 2 and np.isin(idx, (0, 1)).all():  # one 0/1 flag per record, not a list of indices
        raise DataError(
            f"{source}: holds one 0/1 value per record ({n}), a membership mask; give the members' record indices "
            "instead, e.g. numpy.flatnonzero(mask)"
        )
    if not np.issubdtype(idx.dtype, np.integer):
        raise DataError(f"{source}: expected integer record indices, got dtype {idx.dtype}")
    idx = idx.astype(np.int64)
    bad = idx[(idx < 0) | (idx >= n)]
    if len(bad):
        shown = ", ".join(map(str, bad[:5].tolist())) + (", …" if len(bad) > 5 else "")
        raise DataError(
            f"{source}: {len(bad)} member index(es) out of range for data of {n} records (valid: 0 to {n - 1}): {shown}"
        )
    uniq, counts = np.unique(idx, return_counts=True)
    dup = uniq[counts > 1]
    if len(dup):
        shown = ", ".join(map(str, dup[:5].tolist())) + (", …" if len(dup) > 5 else "")
        raise DataError(f"{source}: {len(dup)} member index(es) listed more than once: {shown}")
    if len(uniq) == n:
        raise DataError(
            f"{source}: the member list covers all {n} records, so no non-members are left for the holdout, "
            "aux and test splits"
        )
    return uniq


def read_member_indices(path: Path | str, n: int) -> np.ndarray:
    """The training members of an imported model: 0-based record indices into a dataset of ``n``
    records, from a text file (one integer per line; the first line may be a header; blank lines are
    skipped) or an integer ``.npy`` array (read with ``allow_pickle=False``). Sorted, validated by
    :func:`check_member_indices`."""
    path = check_input_file(path, error=DataError)
    if path.suffix.lower() == ".npy":
        try:
            idx = np.load(path, allow_pickle=False)  # never unpickle a stranger's file
        except ValueError as e:
            raise _numpy_load_error(path, e, ".npy file") from None
        except OSError as e:
            raise DataError(f"{path}: not a readable .npy file ({e})") from None
        if isinstance(idx, np.ndarray) and idx.dtype == bool and idx.shape == (n,):
            idx = idx.astype(np.int8)  # a membership mask: check_member_indices says what to give instead
        if not isinstance(idx, np.ndarray) or not (np.issubdtype(idx.dtype, np.integer)):
            dtype = getattr(idx, "dtype", type(idx).__name__)
            raise DataError(f"{path}: expected an integer array of record indices, got dtype {dtype}")
        return check_member_indices(idx, n, str(path))
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a text file of record indices (use one integer per line, or a .npy)") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    values: list[int] = []
    first = True
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            values.append(int(text))
        except ValueError:
            if first and not _is_number(text):  # a header line (a number such as 1.5 is a bad index, not a header)
                first = False
                continue
            raise DataError(f"{path}: line {number}: expected a record index (an integer), got {text[:40]!r}") from None
        first = False
    return check_member_indices(np.asarray(values, dtype=np.int64), n, str(path))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def splits_from_members(n: int, members: np.ndarray, seed: int) -> Splits:
    """Splits of ``range(n)`` for a model trained on ``members`` (validated record indices).

    Every other record is a non-member; those are shuffled with ``seed`` and cut into holdout, aux
    and test by :data:`IMPORT_NON_MEMBER_SHARES` (40% / 40% / 20%, rounded down; the holdout gets at
    least one record and test the remainder). ``Splits.fractions`` is empty: the members were not
    drawn by dpaudit.
    """
    members = check_member_indices(members, n, "member list")
    rest = np.setdiff1d(np.arange(n, dtype=np.int64), members)
    perm = np.random.default_rng(seed).permutation(rest)
    m = len(rest)
    n_holdout = max(1, math.floor(IMPORT_NON_MEMBER_SHARES["holdout"] * m))
    n_aux = min(math.floor(IMPORT_NON_MEMBER_SHARES["aux"] * m), m - n_holdout)
    parts = (perm[:n_holdout], perm[n_holdout : n_holdout + n_aux], perm[n_holdout + n_aux :])
    holdout, aux, test = (np.sort(p).astype(np.int64) for p in parts)
    return Splits(members=members, holdout=holdout, aux=aux, test=test, seed=int(seed), fractions=())


def _check_float32_standardizer(mean: np.ndarray, scale: np.ndarray, where: str) -> None:
    """A standardisation's ``mean`` and ``scale`` (float64, finite, scale > 0) must fit float32, where it is applied: a
    mean or scale beyond its largest value became inf there (a scale of 1e39 zeroed its feature silently), a scale below
    its smallest normal value 0 (features inf, blamed on the model's weights). ``where`` prefixes the message."""
    tiny = float(np.finfo(np.float32).tiny)
    size = np.abs(mean)
    if np.any(size > FLOAT32_MAX):
        raise InputError(
            f"{where}'mean' holds {float(size.max()):g}, beyond {FLOAT32_MAX:.4g}, the largest float32 (the "
            "features are standardised in float32)"
        )
    if np.any((scale > FLOAT32_MAX) | (scale < tiny)):
        bad = float(scale.max() if np.any(scale > FLOAT32_MAX) else scale.min())
        raise InputError(
            f"{where}'scale' holds {bad:g}, outside {tiny:.4g} to {FLOAT32_MAX:.4g}, float32's normal range (the "
            "features are standardised in float32)"
        )


def standardizer_from_json(d: Any, feature_shape: tuple[int, ...], source: str) -> Standardizer:
    """A fixed, user-given standardisation ``(x - mean) / scale`` from a JSON object with lists
    ``mean`` and ``scale`` of the feature shape (nested or flattened), or for images (channels, height,
    width) one value per channel (torchvision's ``Normalize``). Nothing is fitted here."""
    if not isinstance(d, dict):
        raise InputError(f"{source}: expected a JSON object with 'mean' and 'scale' lists")
    unknown = sorted(set(d) - {"mean", "scale", "kind", "shape", "feature_names"})  # names: check_feature_names
    if unknown:
        raise InputError(f"{source}: unknown field(s) {', '.join(unknown)}; expected 'mean' and 'scale'")
    if d.get("kind", "standardize") != "standardize":
        raise InputError(f"{source}: unknown preprocessing kind {d.get('kind')!r}; expected 'standardize'")
    size = math.prod(feature_shape)
    out = {}
    for key in ("mean", "scale"):
        if key not in d:
            raise InputError(f"{source}: missing {key!r} (a list of {size} numbers, one per feature)")
        try:
            a = np.asarray(d[key])
        except (TypeError, ValueError):  # ragged nesting
            a = np.asarray([None])
        if a.dtype.kind not in "iuf":
            raise InputError(f"{source}: {key!r} must be a list of numbers")
        a = a.astype(np.float64)
        per_channel = len(feature_shape) == 3 and a.size == feature_shape[0] != size
        if a.size != size and not per_channel:
            channel = f" (or {feature_shape[0]}, one per channel)" if len(feature_shape) == 3 else ""
            raise InputError(
                f"{source}: {key!r} has {a.size} values but the data has {size} features{channel} (shape "
                f"{list(feature_shape)})"
            )
        if not np.all(np.isfinite(a)):
            raise InputError(f"{source}: {key!r} contains NaN or inf")
        # One value per channel of (channels, height, width) images (torchvision's Normalize(mean, std)):
        # broadcast over each channel's pixels.
        out[key] = np.broadcast_to(a.reshape(-1, 1, 1), feature_shape) if per_channel else a.reshape(feature_shape)
    if np.any(out["scale"] <= 0):
        raise InputError(f"{source}: 'scale' must be positive everywhere (it divides the features)")
    _check_float32_standardizer(out["mean"], out["scale"], f"{source}: ")
    return Standardizer(out["mean"].astype(np.float32), out["scale"].astype(np.float32))


def check_feature_names(found: Sequence[str], expected: Any, *, data: str, source: str) -> None:
    """The data's feature columns ``found`` must be ``expected`` (a model spec's or scaler's
    ``feature_names``: the features in the order the model reads them), or one :class:`InputError` line
    naming the columns: a model reads features by position, so reordered or renamed columns give a model
    that runs and means nothing."""
    if not isinstance(expected, list | tuple) or not all(isinstance(n, str) for n in expected):
        raise InputError(f"{source}: 'feature_names' must be a list of column names")
    found, expected = tuple(found), tuple(expected)
    if found == expected:
        return
    head = f"{data}: the feature columns do not match {source}'s feature_names"
    if sorted(found) == sorted(expected):
        if found == expected[::-1]:
            raise InputError(f"{head}: they are in reverse order ({found[0]!r} first, {expected[0]!r} expected)")
        i = next(i for i, (a, b) in enumerate(zip(found, expected, strict=True)) if a != b)
        raise InputError(f"{head}: column {i + 1} is {found[i]!r} where {expected[i]!r} is expected (reordered)")
    extra = [c for c in found if c not in expected]
    missing = [c for c in expected if c not in found]
    raise InputError(
        f"{head}: not expected: {_names(extra)}; expected but absent: {_names(missing)}"
        + (f" ({len(found)} columns, {len(expected)} expected)" if len(found) != len(expected) else "")
    )


def _names(names: list[str], at_most: int = 5) -> str:
    shown_names = ", ".join(repr(n) for n in names[:at_most])
    return (shown_names + f" and {len(names) - at_most} more" if len(names) > at_most else shown_names) or "none"
