"""The result of one membership inference attack: plain arrays and floats, never pickled.

Score convention: ``scores[i]`` is the membership score of dataset record ``record_ids[i]``,
**higher = more likely a member**; ``member[i]`` is the ground truth, used only for evaluation.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attacks.metrics import check_scores, downsample_roc, evaluate, tpr_at_fpr_resolved
from dpaudit.errors import InputError
from dpaudit.fileio import check_input_file, write_atomic_file, write_atomic_files

SCORE_COLUMNS = ("attack", "record_id", "member", "score")


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class AttackResult:
    """Scores of one attack on the candidate records, with their ground truth and metrics.

    ``metrics`` is what :func:`attacks.metrics.evaluate` returns; ``params`` the attack's settings
    (JSON-ready), including ``n_reference_models`` / ``n_shadow_models`` where they apply.
    """

    name: str
    scores: np.ndarray
    member: np.ndarray
    record_ids: np.ndarray
    metrics: dict[str, Any] = field(repr=False)
    params: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        # The arrays summarised (a notebook cell ending in an audit would otherwise print every score: 32 kB for
        # 628 members); the full values stay in .scores, .member and .record_ids.
        n_in = int(self.member.sum())
        auc = self.metrics.get("auc") if isinstance(self.metrics, dict) else None
        return (
            f"AttackResult(name={self.name!r}, n_members={n_in}, n_nonmembers={len(self.member) - n_in}, "
            f"auc={'n/a' if auc is None else format(float(auc), '.4g')}, params={self.params!r})"
        )

    def __post_init__(self) -> None:
        s, m = check_scores(self.scores, self.member)
        ids = np.asarray(self.record_ids)
        if ids.shape != s.shape:
            raise InputError(f"record_ids has shape {ids.shape}, expected {s.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"record_ids must be integers, got dtype {ids.dtype}")
        if len(np.unique(ids)) != len(ids):
            raise InputError("record_ids must be unique")
        object.__setattr__(self, "scores", _frozen(s))
        object.__setattr__(self, "member", _frozen(m))
        object.__setattr__(self, "record_ids", _frozen(ids.astype(np.int64)))

    @classmethod
    def from_scores(
        cls,
        name: str,
        scores: Any,
        member: Any,
        record_ids: Any,
        params: dict[str, Any] | None = None,
        *,
        n_bootstrap: int = 200,
        seed: int = 0,
    ) -> AttackResult:
        """Evaluate ``scores`` against ``member`` (with seeded bootstrap CIs) and wrap the result."""
        metrics = evaluate(scores, member, n_bootstrap=n_bootstrap, seed=seed)
        return cls(name, scores, member, record_ids, metrics, dict(params or {}))

    def to_dict(self, include_roc: bool = True) -> dict[str, Any]:
        """The stable JSON form read by the report and audit layers (ROC thinned to ~500 points)."""
        m = self.metrics
        out: dict[str, Any] = {
            "attack": self.name,
            "params": dict(self.params),
            "n_members": int(m["n_members"]),
            "n_nonmembers": int(m["n_nonmembers"]),
            "auc": float(m["auc"]),
            "balanced_accuracy": float(m["balanced_accuracy"]),
            "advantage": float(m["advantage"]),
            "tpr_at_fpr": {k: float(v) for k, v in m["tpr_at_fpr"].items()},
            # Whether n_nonmembers can resolve each FPR (>= 1/FPR non-members); False: the TPR is the TPR at zero
            # false positives, shown "n/a" in tables and reports.
            "tpr_at_fpr_resolved": tpr_at_fpr_resolved(m["tpr_at_fpr"], m["n_nonmembers"]),
            "ci": m.get("ci", {}),
        }
        if include_roc:
            fpr, tpr = downsample_roc(m["roc"]["fpr"], m["roc"]["tpr"])
            out["roc"] = {"fpr": fpr.tolist(), "tpr": tpr.tolist()}
        out["n_reference_models"] = int(self.params.get("n_reference_models", 0))
        out["n_shadow_models"] = int(self.params.get("n_shadow_models", 0))
        return out

    def save_scores(self, path: Path | str, *, force: bool = False) -> Path:
        """Write this attack's scores (see :func:`save_scores`)."""
        return save_scores([self], path, force=force)


def save_scores(results: list[AttackResult], path: Path | str, *, force: bool = False) -> Path:
    """Write per-record scores atomically as CSV or NPZ (chosen by the suffix), refusing to overwrite
    an existing file unless ``force``.

    CSV columns ``attack,record_id,member,score`` (one row per attack and record, scores with 17
    significant digits so they round-trip); NPZ arrays of the same names (``attack`` a fixed-width
    unicode array, no pickle). Rows are in each result's order, results one after another.
    """
    path = Path(path)
    data = scores_file_content(results, path)
    if path.exists() and not force:
        raise InputError(f"{path} already exists; use --force to overwrite it")
    return write_atomic_file(path, data, force=force)


def save_score_files(files: Mapping[Path, list[AttackResult]], *, force: bool = False) -> list[Path]:
    """Write several scores files (:func:`save_scores`' format) as one output: all or nothing, never a mix of new
    and old files (:func:`dpaudit.fileio.write_atomic_files`)."""
    return write_atomic_files({Path(p): scores_file_content(r, Path(p)) for p, r in files.items()}, force=force)


def scores_file_content(results: list[AttackResult], path: Path) -> bytes | str:
    """The bytes (NPZ) or text (CSV) :func:`save_scores` writes to ``path`` (its suffix chooses)."""
    if not results:
        raise InputError("no attack results to save")
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".npz"):
        raise InputError(f"{path}: unsupported scores file type {path.suffix!r}; use .csv or .npz")
    attack = np.concatenate([np.full(len(r.scores), r.name) for r in results])
    record_id = np.concatenate([r.record_ids for r in results])
    member = np.concatenate([r.member for r in results])
    score = np.concatenate([r.scores for r in results])
    if suffix == ".npz":
        buf = io.BytesIO()
        np.savez(buf, attack=attack.astype(str), record_id=record_id, member=member, score=score)
        data: bytes | str = buf.getvalue()
    else:
        text = io.StringIO()
        w = csv.writer(text, lineterminator="\n")
        w.writerow(SCORE_COLUMNS)
        for a, i, m, s in zip(attack, record_id, member, score, strict=True):
            w.writerow([a, int(i), int(m), repr(float(s))])
        data = text.getvalue()
    return data


def load_scores(path: Path | str) -> dict[str, np.ndarray]:
    """Read a scores file written by :func:`save_scores` into arrays ``attack, record_id, member, score``."""
    path = Path(path)
    check_input_file(path)  # missing, or a pipe or device said as such (never opened)
    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as z:
            missing = [c for c in SCORE_COLUMNS if c not in z.files]
            if missing:
                raise InputError(f"{path}: not a scores file (missing {', '.join(missing)})")
            return {c: z[c] for c in SCORE_COLUMNS}
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and any(c not in rows[0] for c in SCORE_COLUMNS):
        raise InputError(f"{path}: not a scores file (expected columns {', '.join(SCORE_COLUMNS)})")
    return {
        "attack": np.array([r["attack"] for r in rows], dtype=str),
        "record_id": np.array([int(r["record_id"]) for r in rows], dtype=np.int64),
        "member": np.array([r["member"] in ("1", "True", "true") for r in rows], dtype=bool),
        "score": np.array([float(r["score"]) for r in rows], dtype=np.float64),
    }
