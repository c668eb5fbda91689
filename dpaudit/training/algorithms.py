"""The trainer registry: every algorithm name and its :class:`~dpaudit.training.base.Trainer`, and the
functions that pick a trainer by name.

The registry is a table written here, not filled by the trainer modules importing a registry back (which
tied base.py and every trainer into one import circle, issue 23): a new trainer is a new module and one
line in :data:`TRAINERS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpaudit.errors import InputError
from dpaudit.training.base import Trainer
from dpaudit.training.convex import (
    GaussianOutputPerturbationTrainer,
    ObjectivePerturbationTrainer,
    OutputPerturbationTrainer,
)
from dpaudit.training.dpagd import DPAGDHuberTrainer, DPAGDLogisticTrainer
from dpaudit.training.dpsgd import DPAdamTrainer, DPSGDTrainer, DPTrainer, GradientCanary, privacy_claim
from dpaudit.training.jl import DPAdamJLTrainer, DPSGDJLTrainer
from dpaudit.training.nonprivate import AdamTrainer, SGDTrainer
from dpaudit.validation import check_choice

TRAINERS: dict[str, type[Trainer]] = {
    cls.name: cls
    for cls in (
        SGDTrainer,
        AdamTrainer,
        DPSGDTrainer,
        DPAdamTrainer,
        DPSGDJLTrainer,
        DPAdamJLTrainer,
        OutputPerturbationTrainer,
        GaussianOutputPerturbationTrainer,
        ObjectivePerturbationTrainer,
        DPAGDLogisticTrainer,
        DPAGDHuberTrainer,
    )
}


def get_trainer(algo: str) -> type[Trainer]:
    # Named as the parameter (TrainConfig.algo): the CLI shows it as --algo (cli._common.with_option_names).
    return TRAINERS[check_choice(sorted(TRAINERS), algo=algo)]


def fit_with_gradient_canary(
    dataset, train_idx, spec, config, perf, canary: GradientCanary, *, preprocessing_idx=None, preprocessing=None
) -> float:
    """Train the recipe on ``train_idx`` with a white-box gradient canary; return the canary's score.

    The standardisation is ``preprocessing`` when given, else fitted on ``preprocessing_idx`` (default:
    ``train_idx``)."""
    import numpy as np

    from dpaudit.data import fit_preprocessing
    from dpaudit.models import build_model
    from dpaudit.training.config import resolve_device

    trainer = get_trainer(config.algo)(config, perf)
    if not isinstance(trainer, DPTrainer):
        raise InputError("the white-box gradient canary needs a private trainer (--algo dpsgd or dpadam)")
    device = resolve_device(perf.device)
    pre = preprocessing
    if pre is None:
        pre = fit_preprocessing(dataset, train_idx if preprocessing_idx is None else preprocessing_idx)
    X = torch.as_tensor(np.array(pre.transform(dataset.rows(train_idx))), device=device)
    y = torch.as_tensor(dataset.y[train_idx], device=device)
    model = build_model(spec, seed=config.seed).to(device)
    return trainer.fit_with_canary(model, X, y, canary)[1]


def claim_for(config, n: int) -> dict[str, Any]:
    """The privacy claim of training ``config`` on ``n`` records, without training."""

    trainer = get_trainer(config.algo)(config)
    return privacy_claim(trainer.setting_for(n), config.dp)


@dataclass(frozen=True)
class ConvexPluginTrainer:
    """A learner of this module (or DP-AGD) as a plug-in trainer for
    :func:`dpaudit.workflows.training.audit_training` (``trainer=``): ``(X, y, seed) -> state dict`` of
    the zoo's logreg with ``n_classes`` outputs. ``config`` is the :class:`TrainConfig` (algo outpert,
    outpert-gaussian, objpert, dpagd or dpagd-huber); the run's seed replaces ``config.seed``. Picklable,
    so the audit may run it in worker processes. Pass the claim (ε, δ and ``neighbouring``: replace_one
    for outpert/objpert, add_remove for DP-AGD) to the audit."""

    config: Any
    n_classes: int = 2

    def __call__(self, X: np.ndarray, y: np.ndarray, seed: int) -> dict[str, torch.Tensor]:
        import dataclasses

        from dpaudit.models import build_model, default_spec

        config = dataclasses.replace(self.config, seed=int(seed))
        model = build_model(default_spec("logreg", input_shape=tuple(X.shape[1:]), n_classes=self.n_classes))
        trainer = get_trainer(config.algo)(config)
        trainer.fit(model, torch.as_tensor(np.asarray(X, np.float32)), torch.as_tensor(np.asarray(y, np.int64)))
        return model.state_dict()
