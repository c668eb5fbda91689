"""Train a model on a dataset split and save it as a run directory (checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from dpaudit.canaries import CANARY_FILE, CanarySet, with_canaries
from dpaudit.checkpoint import SCHEMA_VERSION, predict_logits, save_run, versions
from dpaudit.data import (
    DEFAULT_FRACTIONS,
    Dataset,
    Identity,
    Splits,
    Standardizer,
    fit_preprocessing,
    make_splits,
)
from dpaudit.errors import InputError
from dpaudit.models import ModelSpec, build_model
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.base import TrainOutcome, get_trainer
from dpaudit.training.config import PerfConfig, TrainConfig, resolve_device


@dataclass
class FittedModel:
    """A model trained on ``train_idx`` of a dataset, with its preprocessing."""

    outcome: TrainOutcome
    preprocessing: Any
    device: torch.device

    @property
    def model(self) -> torch.nn.Module:
        return self.outcome.model

    def logits(self, X: np.ndarray) -> np.ndarray:
        return predict_logits(self.model, self.preprocessing.transform(X))


def _tensors(dataset: Dataset, idx: np.ndarray, pre, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.as_tensor(np.array(pre.transform(dataset.X[idx])), device=device)
    y = torch.as_tensor(dataset.y[idx], device=device)
    return X, y


def fit_model(
    dataset: Dataset,
    train_idx: np.ndarray,
    spec: ModelSpec,
    config: TrainConfig,
    perf: PerfConfig | None = None,
    *,
    progress: Progress = NULL_PROGRESS,
    preprocessing_idx: np.ndarray | None = None,
    preprocessing: Standardizer | Identity | None = None,
) -> FittedModel:
    """Fit preprocessing on ``train_idx`` (or ``preprocessing_idx``) unless a fixed ``preprocessing``
    is given, build the model from ``config.seed`` and train it.

    This is the one training entry point: target models, shadow and reference models all use it.
    Deterministic on CPU: same inputs and seed give bit-identical weights.
    """
    perf = perf or PerfConfig()
    trainer = get_trainer(config.algo)(config, perf)
    train_idx = np.asarray(train_idx, dtype=np.int64)
    if len(train_idx) == 0:
        raise InputError("the training split is empty")
    if config.batch_size > len(train_idx):
        raise InputError(f"batch size {config.batch_size} is larger than the training set ({len(train_idx)} records)")
    device = resolve_device(perf.device)
    pre = preprocessing
    if pre is None:
        pre = fit_preprocessing(dataset, train_idx if preprocessing_idx is None else preprocessing_idx)
    X, y = _tensors(dataset, train_idx, pre, device)
    model = build_model(spec, seed=config.seed).to(device)
    outcome = trainer.fit(model, X, y, progress=progress)
    return FittedModel(outcome=outcome, preprocessing=pre, device=device)


def evaluate(fitted: FittedModel, dataset: Dataset, idx: np.ndarray) -> dict[str, float]:
    """Accuracy and mean cross-entropy loss on ``idx`` (None for an empty split)."""
    if len(idx) == 0:
        return {"accuracy": None, "loss": None}
    logits = torch.as_tensor(fitted.logits(dataset.X[idx]))
    y = torch.as_tensor(dataset.y[idx])
    return {
        "accuracy": float((logits.argmax(1) == y).double().mean()),
        "loss": float(F.cross_entropy(logits, y)),
    }


def metrics_for(fitted: FittedModel, dataset: Dataset, splits: Splits) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for label, idx in (("train", splits.members), ("holdout", splits.holdout), ("test", splits.test)):
        m = evaluate(fitted, dataset, idx)
        out[f"{label}_accuracy"] = m["accuracy"]
        out[f"{label}_loss"] = m["loss"]
    return out


def train_run(
    dataset: Dataset,
    spec: ModelSpec,
    config: TrainConfig,
    perf: PerfConfig | None = None,
    *,
    out: Path | None,
    split_seed: int = 0,
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS,
    label_column: str | None = None,
    force: bool = False,
    progress: Progress = NULL_PROGRESS,
    splits: Splits | None = None,
    canaries: CanarySet | None = None,
) -> dict[str, Any]:
    """Split, train on the members split (plus the included canaries), evaluate, and (if ``out``)
    save a run directory. Returns the checkpoint metadata (what ``checkpoint.json`` holds).

    Private algorithms fit the standardisation on the auxiliary split, treated as public data: its
    mean and scale are released with the model, and the DP claim covers only the training steps.
    """
    perf = perf or PerfConfig()
    if out is not None and Path(out).exists() and not force:
        raise InputError(f"{out} already exists; use --force to overwrite it")  # fail before training
    splits = splits or make_splits(len(dataset), split_seed, fractions)
    train_data, train_idx = dataset, splits.members
    if canaries is not None:
        train_data, train_idx, _ = with_canaries(dataset, splits, canaries)
    if config.dp is None:
        fitted_on, pre_idx = "members", splits.members
    elif len(splits.aux):
        fitted_on, pre_idx = "aux", splits.aux
    else:
        # No public split: a scaler fitted on members would be released with the model outside the DP
        # claim, so a private run keeps the raw features (fixed, data-independent preprocessing).
        fitted_on, pre_idx = "none", None
    fitted = fit_model(
        train_data, train_idx, spec, config, perf, progress=progress, preprocessing_idx=pre_idx,
        preprocessing=Identity() if fitted_on == "none" else None,
    )  # fmt: skip
    data_meta = dataset.describe()
    if label_column is not None:
        data_meta["label_column"] = label_column
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": spec.to_dict(),
        "data": data_meta,
        "split": {"seed": splits.seed, "fractions": list(splits.fractions), "sizes": splits.sizes()},
        "preprocessing": {**fitted.preprocessing.to_dict(), "fitted_on": fitted_on},
        "training": {
            **config.to_dict(),
            "steps_run": config.num_steps(len(train_idx)),
            "history": fitted.outcome.history,
        },
        "performance": perf.to_dict(),
        "privacy": fitted.outcome.privacy,
        "metrics": metrics_for(fitted, dataset, splits),
        "seed": config.seed,
        "canaries": canaries.describe() if canaries is not None else None,
        "versions": versions(),
    }
    if out is not None:
        arrays = {CANARY_FILE: canaries.arrays()} if canaries is not None else None
        save_run(Path(out), model=fitted.model, meta=meta, splits=splits, force=force, arrays=arrays)
    return meta


def summary(meta: dict[str, Any]) -> dict[str, Any]:
    """The stable, documented summary printed by ``dpaudit inspect --json``."""
    privacy = meta.get("privacy") or {}
    m = meta["metrics"]
    t = meta["training"]
    return {
        "schema_version": meta["schema_version"],
        "model": meta["model"]["kind"],
        "data": meta["data"]["spec"],
        "data_sha256": meta["data"]["sha256"],
        "algo": t["algo"],
        "private": bool(privacy),
        "epsilon": privacy.get("epsilon"),
        "delta": privacy.get("delta"),
        "accountant": privacy.get("accountant"),
        "train_accuracy": m["train_accuracy"],
        "test_accuracy": m["test_accuracy"],
        "holdout_accuracy": m.get("holdout_accuracy"),
        "train_loss": m["train_loss"],
        "test_loss": m["test_loss"],
        "n_members": meta["split"]["sizes"]["members"],
        "seed": meta.get("seed"),
        "versions": meta["versions"],
    }


def configs_from_meta(meta: dict[str, Any]) -> tuple[TrainConfig, PerfConfig]:
    """The training recipe recorded in a checkpoint (to train shadow/reference models alike)."""
    if meta["training"].get("algo") == "imported":
        raise InputError("this run was imported from foreign weights; its training recipe is unknown")
    t = {k: v for k, v in meta["training"].items() if k in TrainConfig.__dataclass_fields__}
    perf = {k: v for k, v in meta.get("performance", {}).items() if k in PerfConfig.__dataclass_fields__}
    return TrainConfig.from_dict(t), PerfConfig(**perf)


def import_run(
    weights: Path,
    spec: ModelSpec,
    dataset: Dataset,
    *,
    out: Path,
    split_seed: int = 0,
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS,
    preprocessing: str = "standardize",
    label_column: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Make a run directory from foreign weights (safetensors, or a plain state_dict loaded with
    ``weights_only=True``) plus a model spec. The model is assumed to have been trained on the members
    split given by ``split_seed``/``fractions``; no privacy claim is recorded."""
    from dpaudit.checkpoint import load_state_into, load_weights_file
    from dpaudit.data import Identity

    if Path(out).exists() and not force:
        raise InputError(f"{out} already exists; use --force to overwrite it")
    if preprocessing not in ("standardize", "identity"):
        raise InputError(f"unknown preprocessing {preprocessing!r}; valid: standardize, identity")
    splits = make_splits(len(dataset), split_seed, fractions)
    model = build_model(spec)
    load_state_into(model, load_weights_file(Path(weights)), str(weights))
    pre = fit_preprocessing(dataset, splits.members) if preprocessing == "standardize" else Identity()
    fitted = FittedModel(outcome=TrainOutcome(model=model, privacy=None), preprocessing=pre, device=torch.device("cpu"))
    data_meta = dataset.describe()
    if label_column is not None:
        data_meta["label_column"] = label_column
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": spec.to_dict(),
        "data": data_meta,
        "split": {"seed": splits.seed, "fractions": list(splits.fractions), "sizes": splits.sizes()},
        "preprocessing": pre.to_dict(),
        "training": {"algo": "imported", "source": str(weights)},
        "canaries": None,
        "privacy": None,
        "metrics": metrics_for(fitted, dataset, splits),
        "seed": None,
        "versions": versions(),
    }
    save_run(Path(out), model=model, meta=meta, splits=splits, force=force)
    return meta
