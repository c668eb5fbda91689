"""Input-space canaries for auditing: records built to be memorised, each included in training
with probability 1/2 so that their inclusion can be guessed from the trained model.

Kinds:
- ``mislabeled``: copies of auxiliary records with a wrong label (the label shifted by a random
  non-zero offset), as in the one-run audit of Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846, §6).
- ``outlier``: points far outside the data (a random direction at three times the largest
  standardised norm of the training data) with random labels.
- ``clipbkd``: ClipBKD (Jagielski, Ullman & Oprea 2020, arXiv:2006.07709, Alg. 2): a point along
  the training data's least-variance principal directions, scaled to the data's typical norm, with
  the least likely (least frequent) label.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.data import Dataset, Splits
from dpaudit.errors import InputError
from dpaudit.validation import check_choice, check_positive_int

CANARY_KINDS = ("mislabeled", "outlier", "clipbkd")
CANARY_FILE = "canaries.npz"


@dataclass(frozen=True, eq=False)
class CanarySet:
    """``m`` canary records (raw feature space) and which of them were included in training."""

    kind: str
    X: np.ndarray
    y: np.ndarray
    included: np.ndarray
    seed: int

    def __len__(self) -> int:
        return len(self.y)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "m": len(self),
            "seed": self.seed,
            "n_included": int(self.included.sum()),
            "inclusion_probability": 0.5,
            "file": CANARY_FILE,
        }

    def arrays(self) -> dict[str, np.ndarray]:
        return {"X": self.X, "y": self.y, "included": self.included}

    @classmethod
    def load(cls, path: Path, meta: dict[str, Any]) -> CanarySet:
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls(meta["kind"], z["X"], z["y"], z["included"].astype(bool), int(meta["seed"]))
        except (OSError, KeyError, ValueError) as e:
            raise InputError(f"{path}: cannot read the canaries ({e})") from None


def make_canaries(dataset: Dataset, splits: Splits, *, m: int, kind: str, seed: int = 0) -> CanarySet:
    """Build ``m`` canaries of ``kind`` from the dataset and draw their inclusion (each w.p. 1/2)."""
    m = check_positive_int(canaries=m)
    check_choice(CANARY_KINDS, canary_kind=kind)
    rng = np.random.default_rng([seed, 0xCA4A])
    k = dataset.n_classes
    if dataset.kind == "tokens" and kind != "mislabeled":
        raise InputError(f"canary kind {kind!r} needs real-valued features; use mislabeled for token data")
    if kind == "mislabeled":
        pool = splits.aux if len(splits.aux) else splits.holdout
        if len(pool) == 0:
            raise InputError("mislabeled canaries need an auxiliary (or holdout) split to copy records from")
        src = rng.choice(pool, size=m, replace=m > len(pool))
        X = dataset.X[src].copy()
        y = (dataset.y[src] + rng.integers(1, k, size=m)) % k
    else:
        train = dataset.X[splits.members].reshape(len(splits.members), -1).astype(np.float64)
        mean, std = train.mean(0), train.std(0)
        std = np.where(std > 1e-12, std, 1.0)
        Z = (train - mean) / std
        norms = np.linalg.norm(Z, axis=1)
        if kind == "outlier":
            d = rng.normal(size=(m, Z.shape[1]))
            d /= np.linalg.norm(d, axis=1, keepdims=True)
            Zc = d * 3.0 * norms.max()
            y = rng.integers(0, k, size=m)
        else:  # clipbkd: least-variance principal directions, data-typical norm, least frequent label
            _, _, Vt = np.linalg.svd(Z - Z.mean(0), full_matrices=False)
            low = Vt[::-1]  # rows from least to most variance
            dirs = low[np.arange(m) % len(low)] * rng.choice([-1.0, 1.0], size=(m, 1))
            Zc = dirs * np.median(norms)
            counts = np.bincount(dataset.y[splits.members], minlength=k)
            y = np.full(m, int(np.argmin(counts)))
        X = (Zc * std + mean).reshape((m, *dataset.feature_shape)).astype(dataset.X.dtype)
    included = rng.random(m) < 0.5
    return CanarySet(kind, np.ascontiguousarray(X), y.astype(np.int64), included, seed)


def with_canaries(dataset: Dataset, splits: Splits, canaries: CanarySet) -> tuple[Dataset, np.ndarray, np.ndarray]:
    """The dataset with the canaries appended, the training indices (members plus included
    canaries) and the canaries' indices in the augmented dataset."""
    n = len(dataset)
    X = np.concatenate([dataset.X, canaries.X.astype(dataset.X.dtype)])
    y = np.concatenate([dataset.y, canaries.y])
    aug = Dataset(dataset.name, X, y, dataset.n_classes, dataset.kind, dataset.source, dataset.vocab_size)
    canary_idx = n + np.arange(len(canaries))
    train_idx = np.concatenate([splits.members, canary_idx[canaries.included]])
    return aug, train_idx, canary_idx
