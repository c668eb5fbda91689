"""The trainer interface and the registry that dispatches on an algorithm name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from dpaudit.errors import InputError
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.config import PerfConfig, TrainConfig


@dataclass
class TrainOutcome:
    """What a trainer returns: the trained model, its privacy claim (None when non-private; a
    JSON-ready dict otherwise, see :func:`privacy_claim`) and a per-epoch history."""

    model: nn.Module
    privacy: dict[str, Any] | None
    history: list[dict[str, float]] = field(default_factory=list)


class Trainer(ABC):
    """One training algorithm. Subclasses set ``name`` and ``private`` and register themselves."""

    name: ClassVar[str]
    private: ClassVar[bool] = False

    def __init__(self, config: TrainConfig, perf: PerfConfig | None = None) -> None:
        self.config = config
        self.perf = perf or PerfConfig()
        if self.private and config.dp is None:
            raise InputError(f"algorithm {self.name!r} is private: give --noise-multiplier or --epsilon")
        if not self.private and config.dp is not None:
            raise InputError(f"algorithm {self.name!r} is not private; DP options need --algo dpsgd or dpadam")

    @abstractmethod
    def fit(
        self,
        model: nn.Module,
        X: torch.Tensor,
        y: torch.Tensor,
        *,
        progress: Progress = NULL_PROGRESS,
    ) -> TrainOutcome:
        """Train ``model`` in place on (X, y) (already preprocessed, on the right device)."""


def make_optimizer(name: str, params, config: TrainConfig) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    raise InputError(f"unknown optimizer {name!r}")
