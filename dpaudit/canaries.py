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

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.budget import Cost, check_cost
from dpaudit.data import Dataset, Splits, row_blocks, streamed_moments
from dpaudit.errors import InputError
from dpaudit.fileio import check_output_dir
from dpaudit.validation import check_choice, check_positive_int, read_json

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
        except (OSError, KeyError, ValueError, TypeError) as e:  # TypeError: a seed of null or [] in checkpoint.json
            raise InputError(f"{path}: cannot read the canaries ({e})") from None


def make_canaries(dataset: Dataset, splits: Splits, *, m: int, kind: str, seed: int = 0) -> CanarySet:
    """Build ``m`` canaries of ``kind`` from the dataset and draw their inclusion (each w.p. 1/2)."""
    m = check_positive_int(canaries=m)
    check_choice(CANARY_KINDS, canary_kind=kind)
    # A canary is a record (float64 features, a label, an inclusion bit), copied a few times while built.
    check_cost(Cost("canaries", m, "canaries", bytes_per_unit=4 * 8 * (math.prod(dataset.feature_shape) + 2)))
    rng = np.random.default_rng([seed, 0xCA4A])
    k = dataset.n_classes
    if dataset.kind == "tokens" and kind != "mislabeled":
        raise InputError(f"canary kind {kind!r} needs real-valued features; use mislabeled for token data")
    if kind == "crafted":
        if len(splits.aux) == 0:
            raise InputError("crafted canaries are built from the public auxiliary split, which is empty")
        X, y = craft_canaries(dataset.rows(splits.aux), dataset.y[splits.aux], m=m, n_classes=k, seed=seed)
    elif kind == "mislabeled":
        pool = splits.aux if len(splits.aux) else splits.holdout
        if len(pool) == 0:
            raise InputError("mislabeled canaries need an auxiliary (or holdout) split to copy records from")
        src = rng.choice(pool, size=m, replace=m > len(pool))
        X = dataset.rows(src)  # a copy, in the features' dtype (uint8 pixels: float32)
        y = (dataset.y[src] + rng.integers(1, k, size=m)) % k
    elif kind == "outlier":
        # The members' mean, scale and largest standardised norm, a block of rows at a time: the float64 copy of the
        # members and its standardised twin (2 x 172 MB for 7,000 CIFAR images) are blocks of 8 MB; the values
        # are bit for bit those of the whole array (data.streamed_moments; each row's norm is its own).
        mean, std = (a.ravel() for a in streamed_moments(dataset, splits.members))
        top = max(
            float(np.linalg.norm((b.reshape(len(b), -1).astype(np.float64) - mean) / std, axis=1).max())
            for b in row_blocks(dataset, splits.members)
        )
        d = rng.normal(size=(m, mean.size))
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        Zc = d * 3.0 * top
        y = rng.integers(0, k, size=m)
        X = (Zc * std + mean).reshape((m, *dataset.feature_shape)).astype(dataset.dtype)
    else:  # clipbkd: least-variance principal directions, data-typical norm, least frequent label
        mean, std = (a.ravel() for a in streamed_moments(dataset, splits.members))  # numpy's mean/std, bit for bit
        rank = min(len(splits.members), mean.size)  # the SVD's right singular vectors: min(n, d) of them
        low, norms = _least_variance_directions(dataset, splits.members, mean, std, min(m, rank))
        dirs = low[np.arange(m) % rank] * rng.choice([-1.0, 1.0], size=(m, 1))
        Zc = dirs * np.median(norms)
        counts = np.bincount(dataset.y[splits.members], minlength=k)
        y = np.full(m, int(np.argmin(counts)))
        X = (Zc * std + mean).reshape((m, *dataset.feature_shape)).astype(dataset.dtype)
    included = rng.random(m) < 0.5  # drawn after the records: no record depends on the inclusion bits
    return CanarySet(kind, np.ascontiguousarray(X), y.astype(np.int64), included, seed)


def _least_variance_directions(
    dataset: Dataset, idx: np.ndarray, mean: np.ndarray, std: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` right singular vectors of least singular value of Zc, the rows ``idx`` standardised (``(x − mean) /
    std``) and centred, least first, each signed so that its largest entry is positive; and the rows' norms ‖z‖.

    ClipBKD's direction (Jagielski, Ullman & Oprea 2020, arXiv:2006.07709, Alg. 2) was ``np.linalg.svd(Zc)`` of the
    whole float64 matrix: for 7,000 CIFAR members (n × d = 7,000 × 3,072) 2 minutes and 1.5 GB (the members, Z, Zc,
    U and LAPACK's copies, 172 MB each). With n > d it is now the eigenvectors of least eigenvalue of the d × d
    scatter matrix C = Zcᵀ Zc, the same vectors (Zc = U S Vᵀ gives C = V S² Vᵀ; Golub & Van Loan, Matrix
    Computations, 4th ed., §8.6.1), summed over blocks of rows (:func:`dpaudit.data.row_blocks`) as Σ z zᵀ − n μ μᵀ
    (μ the mean of the z, which is 0 up to rounding: the rows are standardised by their own mean), and only the k
    wanted ones computed (``scipy.linalg.eigh(subset_by_index=…)``): one d × d matrix (75 MB) instead of
    several n × d ones. Precision: eigh is backward stable on C (an error of order ε‖C‖ = ε σ_max²), so every
    returned v has vᵀ C v within ε σ_max² of the least eigenvalue, i.e. the members vary along it as little as
    along the exact direction up to float64 rounding of the largest variance, which is all the canary asks; v itself
    is within O(ε σ_max² / gap) of the SVD's where its eigenvalue is separated by ``gap`` (Davis–Kahan; Golub &
    Van Loan, Thm 8.1.12), which for standardised pixels (σ_max² ≈ 10⁷, gaps ≫ 10⁻⁸) is far below float32, the
    canary's dtype. Where the least eigenvalues are (nearly) tied, as for constant pixels, any vector of their
    span is as good, and each method picks one. With n ≤ d, Zc (n × d) is no larger than C, and its SVD is
    taken as before. The sign (the SVD's and eigh's are arbitrary: LAPACK's choice) is fixed by the largest entry,
    so the canary does not depend on the LAPACK build (ClipBKD then draws a random sign)."""
    d, n = mean.size, len(idx)

    def standardised(b: np.ndarray) -> np.ndarray:
        return (b.reshape(len(b), -1).astype(np.float64) - mean) / std  # the old formula's Z, row for row

    if n <= d:
        Z = np.concatenate([standardised(b) for b in row_blocks(dataset, idx)])
        norms = np.linalg.norm(Z, axis=1)
        low = np.linalg.svd(Z - Z.mean(0), full_matrices=False)[2][::-1][:k]  # rows from least to most variance
    else:
        from scipy.linalg import eigh

        S, total, norms = np.zeros((d, d)), np.zeros(d), []
        for b in row_blocks(dataset, idx):
            Z = standardised(b)
            S += Z.T @ Z
            total += Z.sum(axis=0)
            norms.append(np.linalg.norm(Z, axis=1))  # each row's norm is its own: bit for bit the whole array's
        mu = total / n
        S -= n * np.outer(mu, mu)  # Σ (z − μ)(z − μ)ᵀ = Σ z zᵀ − n μ μᵀ
        low = eigh(S, subset_by_index=[0, k - 1])[1].T  # ascending eigenvalues: least variance first
        norms = np.concatenate(norms)
    top = np.abs(low).argmax(axis=1)
    low = low * np.sign(low[np.arange(len(low)), top])[:, None]
    return low, norms


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
    y = np.concatenate([dataset.y, canaries.y])
    # X stays as it is, the canaries appended beside it (Dataset.appended, in the features' dtype: float32 for uint8
    # pixels, whose canaries are float), read with X's rows by Dataset.rows. A concatenation copied the whole X: a
    # memory-mapped file read into memory (CIFAR's 600 MB X.npy: 3.7 GB peak RSS for `train --canaries 50`), and
    # an in-memory X held twice (32,000 CIFAR-sized float32 images: +393 MB for `train --canaries 200` and for
    # `audit train`, whose runs all read the augmented data).
    appended = np.ascontiguousarray(canaries.X.astype(dataset.dtype))
    if dataset.appended is not None:
        appended = np.concatenate([dataset.appended, appended])
    aug = dataclasses.replace(dataset, y=y, appended=appended)
    canary_idx = n + np.arange(len(canaries))
    train_idx = np.concatenate([splits.members, canary_idx[canaries.included]])
    return aug, train_idx, canary_idx


# ---- canaries for a model trained outside dpaudit (dpaudit canaries make -> dpaudit import --canaries) ----

CANARY_DIR_FORMAT = "dpaudit-canaries/1"
CANARY_DESIGN_FILE = "canaries.json"  # the design (kind, count, seed, data it was made for)
CANARY_SECRET_FILE = "canaries.safetensors"  # every canary and its secret inclusion bit: keep it from the trainer
CANARY_INSERT_FILE = "insert.npz"  # the records to add to the training set: the included canaries only


def make_import_canaries(
    dataset: Dataset, *, count: int, kind: str, seed: int = 0, members: np.ndarray | None = None
) -> CanarySet:
    """Canaries for a model you train yourself: :func:`make_canaries` on ``dataset`` with ``members`` (default:
    every record) as the training set; mislabeled canaries copy records that are not members, or members when
    there are none (a mislabeled copy is another record, so its inclusion is still one add/remove change)."""
    n = len(dataset)
    mem = np.arange(n, dtype=np.int64) if members is None else np.sort(np.asarray(members, dtype=np.int64))
    rest = np.setdiff1d(np.arange(n, dtype=np.int64), mem)
    empty = np.zeros(0, np.int64)
    splits = Splits(
        members=mem, holdout=empty, aux=rest if len(rest) else mem, test=empty, seed=int(seed), fractions=()
    )
    return make_canaries(dataset, splits, m=count, kind=kind, seed=seed)


def write_canary_dir(canaries: CanarySet, dataset: Dataset, out: Path, *, force: bool = False) -> Path:
    """Write ``out``: the design (JSON), all canaries with their secret bits (safetensors) and the records to
    insert (``insert.npz``: the included canaries, in raw feature space, with labels as the data holds them:
    ``dataset.classes``, e.g. 1 and 2 or "cat" and "dog", which the user's own training reads; class indices
    0..K-1 would be other classes there, so a mislabeled canary could land on its record's true label).
    Atomic; no pickle."""
    from safetensors.numpy import save_file

    from dpaudit.fileio import write_atomic_dir

    design = {
        "format": CANARY_DIR_FORMAT, **canaries.describe(), "file": CANARY_SECRET_FILE, "data": dataset.describe(),
        "feature_shape": list(dataset.feature_shape), "n_classes": int(dataset.n_classes),
    }  # fmt: skip
    inc = canaries.included

    def write(tmp: Path) -> None:
        save_file(
            {"X": np.ascontiguousarray(canaries.X), "y": canaries.y.astype(np.int64), "included": inc.astype(np.int8)},
            str(tmp / CANARY_SECRET_FILE),
        )
        y = canaries.y[inc].astype(np.int64)
        np.savez(tmp / CANARY_INSERT_FILE, X=canaries.X[inc], y=y if dataset.classes is None else dataset.classes[y])
        (tmp / CANARY_DESIGN_FILE).write_text(json.dumps(design, indent=2) + "\n")

    return write_atomic_dir(Path(out), write, force=force, written_by="canaries")


def read_canary_dir(path: Path, dataset: Dataset) -> CanarySet:
    """The canaries ``dpaudit canaries make`` wrote to ``path``, checked against the data they are declared for."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(path)
    if not (path / CANARY_DESIGN_FILE).is_file() or not (path / CANARY_SECRET_FILE).is_file():
        raise InputError(f"{path}: not a canary directory from `dpaudit canaries make`")
    design = read_json(path / CANARY_DESIGN_FILE)  # bounded parsing of an untrusted file
    if isinstance(design, dict) and design.get("format") == "dpaudit-gradient-canaries/1":  # dpaudit.hooks.core.FORMAT
        raise InputError(
            f"{path}: gradient canaries from dpaudit.hooks (a training loop's observations), not records to insert: "
            "audit them with `dpaudit audit canaries`"
        )
    try:
        a = load_file(str(path / CANARY_SECRET_FILE))
        cs = CanarySet(design["kind"], a["X"], a["y"].astype(np.int64), a["included"].astype(bool), int(design["seed"]))
    except (OSError, json.JSONDecodeError, SafetensorError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"{path}: unreadable canary directory ({e})") from None
    if design.get("format") != CANARY_DIR_FORMAT or len(cs.y) != design.get("m") or len(cs.included) != len(cs.y):
        raise InputError(f"{path}: malformed canary directory")
    try:  # an edited canaries.json: a shape or a class count that is no integer is malformed, not a crash
        shape = tuple(int(d) for d in design.get("feature_shape", ()))
        n_classes = int(design.get("n_classes", -1))
    except (TypeError, ValueError):
        raise InputError(f"{path}: malformed canary directory (feature_shape or n_classes is not an integer)") from None
    if shape != tuple(dataset.feature_shape) or tuple(cs.X.shape[1:]) != shape:
        raise InputError(
            f"{path}: the canaries were made for features of shape {shape}, the data has {tuple(dataset.feature_shape)}"
        )
    if n_classes != dataset.n_classes or (len(cs.y) and cs.y.max() >= dataset.n_classes):
        raise InputError(
            f"{path}: the canaries were made for {design.get('n_classes')} classes, not {dataset.n_classes}"
        )
    return cs


def make_canary_dir(
    data: str,
    *,
    count: int,
    kind: str,
    out: Path,
    seed: int = 0,
    members: Path | None = None,
    label_column: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """``dpaudit canaries make``: canaries for the data ``data`` (a dataset spec, as ``dpaudit import --data``),
    written to ``out``; returns the design. ``members``: the indices of the records you will train on."""
    from dpaudit.data import check_data_spec, load_dataset, read_member_indices

    check_positive_int(count=count)  # checked as named here, not as the canaries/canary_kind they become below
    check_choice(CANARY_KINDS, kind=kind)
    check_output_dir(out, force=force, inputs=[data, members])
    ds = load_dataset(check_data_spec(data, label_column=label_column), label_column=label_column)
    member_idx = read_member_indices(members, len(ds)) if members is not None else None
    cs = make_import_canaries(ds, count=count, kind=kind, seed=seed, members=member_idx)
    write_canary_dir(cs, ds, Path(out), force=force)
    return {**cs.describe(), "out": str(out), "insert": str(Path(out) / CANARY_INSERT_FILE)}
