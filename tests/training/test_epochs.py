"""--epochs E means E passes over the data: E·⌈N/B⌉ shuffled steps, ⌈E·N/B⌉ Poisson steps, and the history's
epoch numbers count the same epochs (TrainConfig.num_steps / TrainConfig.epoch_ended)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dpaudit.models import build_model, default_spec
from dpaudit.progress import Progress
from dpaudit.training.algorithms import get_trainer
from dpaudit.training.config import DPConfig, TrainConfig


class _Counting(Progress):
    def __init__(self) -> None:
        self.done = 0

    @contextlib.contextmanager
    def task(self, description, total, *, brief=False):
        def advance(n=1):
            self.done += n

        yield advance


def _fit(config: TrainConfig, n: int):
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(n, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (n,), generator=g)
    model = build_model(default_spec("logreg", input_shape=(8,), n_classes=4), seed=0, dtype=torch.float64)
    progress = _Counting()
    out = get_trainer(config.algo)(config, None).fit(model, X, y, progress=progress)
    return out, progress.done


def _dp(sampling: str, **kw) -> TrainConfig:
    return TrainConfig(algo="dpsgd", dp=DPConfig(noise_multiplier=1.0, sampling=sampling), **kw)


def test_shuffled_epochs_are_full_passes_when_b_does_not_divide_n():
    # The finding: 30 epochs of 140 records at B = 64 ran ceil(30·140/64) = 66 steps, 22 passes of 3 batches.
    assert TrainConfig(epochs=30, batch_size=64).num_steps(140) == 90
    assert _dp("shuffle", epochs=30, batch_size=64).num_steps(140) == 90
    assert _dp("poisson", epochs=30, batch_size=64).num_steps(140) == 66  # 30 expected passes at q = 64/140
    # and the trainers run them: non-private SGD walks 3 full permutations of ⌈10/4⌉ = 3 batches
    out, steps = _fit(TrainConfig(algo="sgd", epochs=3, batch_size=4, lr=0.1), 10)
    assert steps == 9 and len(out.history) == 3
    out, steps = _fit(_dp("shuffle", epochs=3, batch_size=4, lr=0.1), 10)
    assert steps == 9 and out.history == [{"epoch": e, "steps": 3 * e} for e in (1, 2, 3)]
    assert out.privacy["event"]["count"] == 3  # the accountant charges the 3 epochs run


def test_poisson_history_counts_expected_passes():
    # N = 10, B = 4: one expected pass is 2.5 steps; 3 epochs are ⌈7.5⌉ = 8 steps, ending at steps 3, 5, 8
    # (before: labelled by ⌈N/B⌉ = 3 steps, i.e. epochs 1, 2, 3 at steps 3, 6, 8).
    out, steps = _fit(_dp("poisson", epochs=3, batch_size=4, lr=0.1), 10)
    assert steps == 8 and out.history == [{"epoch": 1, "steps": 3}, {"epoch": 2, "steps": 5}, {"epoch": 3, "steps": 8}]
    # --steps that ends inside an epoch: the last entry numbers the epoch it ran in
    c = _dp("poisson", epochs=1, steps=4, batch_size=4)
    assert [c.epoch_ended(s, 10, 4) for s in range(1, 5)] == [None, None, 1, 2]


@pytest.mark.parametrize("sampling", [None, "shuffle", "poisson"])
def test_nothing_changes_when_b_divides_n(sampling):
    kw = {"epochs": 7, "batch_size": 8}
    config = TrainConfig(**kw) if sampling is None else _dp(sampling, **kw)
    n = 48
    steps = config.num_steps(n)
    assert steps == -(-7 * n // 8) == 42  # the former ceil(E·N/B)
    marks = [(s, config.epoch_ended(s, n, steps)) for s in range(1, steps + 1)]
    assert [m for m in marks if m[1] is not None] == [(6 * e, e) for e in range(1, 8)]  # the former labels


def test_a_fixed_poisson_rate_counts_epochs_as_expected_passes_at_that_rate():
    # The finding: DPConfig(sample_rate=q) counted an epoch as N/B steps whatever q was, so 10 epochs at
    # q = 0.01 on 1000 records with B = 64 ran ⌈10·1000/64⌉ = 157 steps (1.57 expected passes), labelled epoch 10.
    c = TrainConfig(algo="dpsgd", epochs=10, batch_size=64, dp=DPConfig(noise_multiplier=1.0, sample_rate=0.01))
    assert c.num_steps(1000) == 1000  # 10 / q
    ends = [(s, e) for s in range(1, 1001) if (e := c.epoch_ended(s, 1000, 1000)) is not None]
    assert ends == [(100 * e, e) for e in range(1, 11)]
    # a rate computed as B/N' (the multi-run audit's n_max) is read as that fraction, not as its binary float
    third = TrainConfig(algo="dpsgd", epochs=3, batch_size=64, dp=DPConfig(noise_multiplier=1.0, sample_rate=64 / 192))
    assert third.num_steps(191) == 9
    assert [third.epoch_ended(s, 191, 9) for s in (3, 6, 9)] == [1, 2, 3]
    # the default q = B/N is unchanged: ⌈E·N/B⌉
    assert _dp("poisson", epochs=30, batch_size=64).num_steps(140) == 66
