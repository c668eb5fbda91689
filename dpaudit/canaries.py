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
- ``crafted``: input-space canaries crafted for the final-model (black-box) threat model from the
  public auxiliary split only (see :func:`craft_canaries`): in the least-variance subspace of the aux
  data at a large norm, so the canary's clipped gradient points where the data's gradients do not and
  its loss stays high (Annamalai & De Cristofaro 2024, arXiv:2405.14106; Yoon, Jeung & No 2024,
  arXiv:2412.01756). ``audit_training(..., init="adversarial")`` also starts every run from one fixed
  model pre-trained on the aux split (:func:`dpaudit.workflows.training.adversarial_init`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.data import Dataset, Splits
from dpaudit.errors import InputError
from dpaudit.validation import check_choice, check_positive_int

CANARY_KINDS = ("mislabeled", "outlier", "clipbkd", "crafted")
# Norm of a crafted canary (standardised units) as a multiple of the largest aux norm; see craft_canaries.
CRAFTED_NORM_FACTOR = 4.0
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
    if kind == "crafted":
        if len(splits.aux) == 0:
            raise InputError("crafted canaries are built from the public auxiliary split, which is empty")
        X, y = craft_canaries(dataset.X[splits.aux], dataset.y[splits.aux], m=m, n_classes=k, seed=seed)
    elif kind == "mislabeled":
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
    included = rng.random(m) < 0.5  # drawn after the records: no record depends on the inclusion bits
    return CanarySet(kind, np.ascontiguousarray(X), y.astype(np.int64), included, seed)


def craft_canaries(
    X_aux: np.ndarray,
    y_aux: np.ndarray,
    *,
    m: int,
    n_classes: int,
    seed: int = 0,
    norm_factor: float = CRAFTED_NORM_FACTOR,
) -> tuple[np.ndarray, np.ndarray]:
    """``m`` crafted canaries (raw feature space) and their labels, from public records only.

    The audited pipelines standardise with the scaler fitted on the aux split, so the canaries are
    built in that standardised space:

    - direction: the principal directions of least variance of the aux records (ClipBKD's idea,
      Jagielski, Ullman & Oprea 2020, arXiv:2006.07709, Alg. 2, but from public data). For a linear
      layer the per-example gradient of (x, y) is (p(x) − e_y)(x, 1)ᵀ, so a data record's gradient
      has inner product (p_d − e_{y_d})·(p_c − e_{y_c})·(x_d·x_c + 1) with the canary's: ≈ 0 when x_c
      is orthogonal to the data. The canary's gradient points where the data's gradients do not
      (Annamalai & De Cristofaro 2024, arXiv:2405.14106), the input-space analogue of the Dirac
      gradient canary (Nasr et al. 2023, arXiv:2302.07956): only the noise and the canary move
      the logits at x_c.
    - norm: ``norm_factor`` × the largest aux norm. Per step, the clipped canary gradient moves its
      logit margin by ≈ ηC‖x‖/B and the noise by ≈ ησC‖x‖/B (DP-SGD, Abadi et al. 2016,
      arXiv:1607.00133, Alg. 1), so the signal-to-noise ratio does not depend on ‖x‖ as long as the
      gradient is clipped, i.e. ‖p − e_y‖·‖(x, 1)‖ ≥ C. A large norm keeps it clipped (a high-loss,
      large-gradient record, as Yoon, Jeung & No 2024, arXiv:2412.01756, seek) and makes the
      bias, which every record moves, negligible at x_c.
    - label: one the aux data do not support there: the least frequent aux label for one canary;
      for several, labels cycle in increasing aux frequency (canaries with different labels have
      small gradient inner products), and the directions are random unit vectors in the bottom
      k = min(m, d) principal subspace.

    Uses ``X_aux``, ``y_aux`` and ``seed`` only: never the members, the inclusion bits or a model.
    """
    m = check_positive_int(canaries=m)
    shape = np.asarray(X_aux).shape[1:]
    A = np.asarray(X_aux, dtype=np.float64).reshape(len(X_aux), -1)
    mean, std = A.mean(0), A.std(0)
    std = np.where(std > 1e-12, std, 1.0)  # as dpaudit.data.Standardizer: constant features pass through
    Z = (A - mean) / std
    _, _, Vt = np.linalg.svd(Z - Z.mean(0), full_matrices=True)  # full basis: exact null directions too
    low = Vt[::-1]  # rows from least to most variance
    radius = norm_factor * max(float(np.linalg.norm(Z, axis=1).max()), 1.0)
    rng = np.random.default_rng([seed, 0xC4AF])
    by_frequency = np.argsort(np.bincount(np.asarray(y_aux, dtype=np.int64), minlength=n_classes), kind="stable")
    if m == 1:
        dirs = low[:1] * rng.choice([-1.0, 1.0])
    else:
        k = min(m, len(low))
        dirs = rng.normal(size=(m, k)) @ low[:k]
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    y = by_frequency[np.arange(m) % n_classes]
    X = (dirs * radius * std + mean).reshape((m, *shape)).astype(np.asarray(X_aux).dtype)
    return np.ascontiguousarray(X), y.astype(np.int64)


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
