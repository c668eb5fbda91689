"""The trainer interface and the registry that dispatches on an algorithm name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from dpaudit.errors import InputError
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.config import PerfConfig, TrainConfig, check_config_read, settings_read


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The host tensor ``t`` on ``device`` without making the host wait for the device.

    A copy from ordinary (pageable) host memory to a GPU blocks the host until the device has
    finished the work queued before it, so a per-step copy of batch indices or features would stall
    the training loop every step. Staged through page-locked memory, the copy is queued like a
    kernel (``non_blocking``; torch's pinned-memory allocator keeps the staging buffer alive until
    the copy has run). On the CPU this is ``t`` itself (or ``t.to(device)``)."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


@dataclass
class TrainOutcome:
    """What a trainer returns: the trained model, its privacy claim (None when non-private; a
    JSON-ready dict otherwise, see :func:`privacy_claim`) and a per-epoch history."""

    model: nn.Module
    privacy: dict[str, Any] | None
    history: list[dict[str, float]] = field(default_factory=list)
    # How it was computed (performance only, never part of the claim): e.g. the clipping method
    # ``--clipping auto`` chose and its per-layer plan, recorded under the checkpoint's "performance".
    performance: dict[str, Any] = field(default_factory=dict)


class StreamedFeatures:
    """The preprocessed features of rows ``idx`` of a memory-mapped dataset, as a trainer indexes them:
    ``X[batch]`` (a tensor of row positions, a slice) reads those rows from the file, applies the
    preprocessing and returns a float32 tensor on ``device``; nothing else is held in memory.
    ``X.shape``, ``X.device``, ``len(X)`` as for a tensor."""

    dtype = torch.float32

    def __init__(self, dataset, idx: np.ndarray, preprocessing, device: torch.device) -> None:
        self.dataset, self.idx, self.preprocessing = dataset, np.asarray(idx, dtype=np.int64), preprocessing
        self.device = torch.device(device)
        self.shape = torch.Size((len(self.idx), *dataset.feature_shape))

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, key) -> torch.Tensor:
        if isinstance(key, torch.Tensor):
            key = key.cpu().numpy()  # host indices (the DP trainer passes them; no device round trip)
        rows = self.dataset.rows(self.idx[key])
        x = np.asarray(self.preprocessing.transform(rows), dtype=np.float32)
        return host_to_device(torch.from_numpy(x), self.device)


class Trainer(ABC):
    """One training algorithm. Subclasses set ``name`` and ``private`` and register themselves.

    ``streams``: the trainer reads its training features only as ``X[batch]`` (plus ``X.shape``,
    ``X.device``), so it can be given a :class:`StreamedFeatures` for a memory-mapped dataset;
    the others get the training split as one tensor.
    ``batched``: the trainer takes ``config.num_steps(N)`` minibatch steps of ``config.batch_size`` records;
    the others (the convex learners' exact solve, DP-AGD's full-batch gradients) read none of the epochs, batch
    size or learning rate, so a training set smaller than the batch size is no error for them and no step count
    is recorded as run."""

    name: ClassVar[str]
    private: ClassVar[bool] = False
    streams: ClassVar[bool] = False
    batched: ClassVar[bool] = True

    def __init__(self, config: TrainConfig, perf: PerfConfig | None = None) -> None:
        self.config = config
        self.perf = perf or PerfConfig()
        if self.private and config.dp is None:
            raise InputError(f"algorithm {self.name!r} is private: give --noise-multiplier or --epsilon")
        if not self.private and config.dp is not None:
            raise InputError(f"algorithm {self.name!r} is not private; DP options need --algo dpsgd or dpadam")
        if self.perf.backend != "torch":  # fit_model / run.default_trainer pick JaxTrainer for it
            raise InputError(
                f"{type(self).__name__} trains with torch, not --backend {self.perf.backend}: use "
                "dpaudit.training.jax_backend.JaxTrainer (or fit_model, which picks it)"
            )
        check_config_read(self.name, config, self.perf)  # e.g. autocast with DP-SGD-JL: refused, never ignored

    def recorded_settings(self) -> dict[str, Any]:
        """The settings the checkpoint records under ``training``: the whole config for the minibatch trainers;
        for the others (:attr:`batched` False) only the fields the algorithm reads
        (:func:`dpaudit.training.config.settings_read`), so no unread epochs, batch size or learning rate reads
        as the run's recipe."""
        return self.config.to_dict() if self.batched else settings_read(self.config)

    @abstractmethod
    def fit(
        self,
        model: nn.Module,
        X: torch.Tensor,
        y: torch.Tensor,
        *,
        progress: Progress = NULL_PROGRESS,
    ) -> TrainOutcome:
        """Train ``model`` in place on (X, y) (already preprocessed, on the right device; ``X`` a
        :class:`StreamedFeatures` when ``streams`` and the data is memory-mapped)."""


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters every trainer trains (and the private ones clip and noise): ``requires_grad`` ones, each once.
    None is an InputError: torch.optim's own ValueError, or JAX's StopIteration, was an internal error (exit 3) for a
    user's parameter-free module."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise InputError("the model has no trainable parameters")
    return params


def make_optimizer(name: str, params, config: TrainConfig) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    raise InputError(f"unknown optimizer {name!r}")
