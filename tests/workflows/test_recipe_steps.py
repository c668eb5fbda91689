"""The multi-run audit trains IN and OUT runs for the same number of steps (issue 27: the old check
compared ``config.steps`` on both sides, None == None when the recipe left it unset, while the runs
trained ceil(epochs·N/B) steps for different N)."""

from __future__ import annotations

import pytest

from dpaudit.data import load_dataset
from dpaudit.models import default_spec
from dpaudit.training.config import DPConfig, TrainConfig
from dpaudit.workflows import audit_training

from .test_workflows import _spy_fits


@pytest.mark.parametrize("private", [True, False])
def test_in_and_out_runs_train_the_same_number_of_steps(private, monkeypatch):
    """101 records with the canary, 100 without, batch 50, one epoch — ⌈N/B⌉ would be 3 and 2 steps; the recipe
    fixes the larger dataset's count for both. (With Poisson the recipe's fixed rate q = B/N_max alone now gives
    both sides ⌈E/q⌉ steps; a non-private recipe's shuffled batches still count ⌈N/B⌉ per epoch of each side's N.)"""
    calls = _spy_fits(monkeypatch)
    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=10)
    dp = DPConfig(clip=1.0, noise_multiplier=1.0)
    config = TrainConfig(
        algo="dpsgd" if private else "sgd", epochs=1, batch_size=50, lr=1.0, dp=dp if private else None
    )
    audit_training(ds, spec, config, runs=2, train_size=100, seed=0)
    (idx_in, _, c_in), _, (idx_out, _, c_out), _ = calls
    assert len(idx_in) == len(idx_out) + 1
    steps_in, steps_out = c_in.num_steps(len(idx_in)), c_out.num_steps(len(idx_out))  # the steps each run trains
    assert steps_in == steps_out == -(-len(idx_in) // 50), (steps_in, steps_out)
