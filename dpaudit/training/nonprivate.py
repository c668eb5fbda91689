"""Non-private mini-batch SGD and Adam (the utility baseline)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from dpaudit.errors import InputError
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.base import Trainer, TrainOutcome, make_optimizer, trainable_parameters


class NonPrivateTrainer(Trainer):
    optimizer: ClassVar[str]
    streams = True

    def fit(
        self,
        model: nn.Module,
        X: torch.Tensor,
        y: torch.Tensor,
        *,
        progress: Progress = NULL_PROGRESS,
    ) -> TrainOutcome:
        n = X.shape[0]
        B = self.config.batch_size
        if B > n:
            raise InputError(f"batch size {B} is larger than the training set ({n} records)")
        steps = self.config.num_steps(n)
        opt = make_optimizer(self.optimizer, trainable_parameters(model), self.config)
        gen = torch.Generator().manual_seed(self.config.seed + 1)  # batch order, independent of init
        history: list[dict[str, float]] = []
        model.train()
        step = 0
        with progress.task(f"train {self.name}", steps) as advance:
            while step < steps:
                perm = torch.randperm(n, generator=gen).to(X.device)
                total, count = 0.0, 0
                for start in range(0, n, B):
                    if step >= steps:
                        break
                    idx = perm[start : start + B]
                    opt.zero_grad(set_to_none=True)
                    loss = F.cross_entropy(model(X[idx]), y[idx])
                    loss.backward()
                    opt.step()
                    total += float(loss.detach()) * len(idx)
                    count += len(idx)
                    step += 1
                    advance(1)
                history.append({"loss": total / max(count, 1)})
        model.eval()
        return TrainOutcome(model=model, privacy=None, history=history)


class SGDTrainer(NonPrivateTrainer):
    name = "sgd"
    optimizer = "sgd"


class AdamTrainer(NonPrivateTrainer):
    name = "adam"
    optimizer = "adam"
