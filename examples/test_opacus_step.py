"""A privacy unit test of one Opacus DP-SGD step, to copy into your own test suite.

``dpaudit.testing.assert_dp`` runs a mechanism many times on two neighbouring datasets and fails
when the outputs refute the (ε, δ) claim — or when the test has too few trials to ever refute it
(``require_power=True``, the default: a powerless privacy test must not be a green build).

The mechanism here is one noisy step of Opacus' ``DPOptimizer`` (public API: ``GradSampleModule``
+ ``DPOptimizer``) on a one-weight model, started at w = 0 with squared loss (w·x − y)² / 2:

- ``DATA`` holds records (x = 1, y = 0), whose gradient at w = 0 is 0, plus one record (x = 1,
  y = 1), whose gradient is −1: clipped to −C, it is the only signal;
- ``NEIGHBOUR`` is ``DATA`` without that record (add/remove neighbours).

With ``loss_reduction="sum"`` Opacus releases w' = −lr · (Σ clipped gradients + N(0, σ²C²)), so one
step is the Gaussian mechanism with sensitivity C and noise σC: its exact ε(δ) is the analytic
Gaussian's (Balle & Wang 2018, arXiv:1805.06530, Thm. 8), :data:`EPSILON` below. On ``DATA`` the
output is larger (shifted by lr·C), so the direction is known in advance (``direction="greater"``:
no pilot runs, every trial audited).

Trials: :func:`dpaudit.audit.plan.plan_design` gives the number per side with which the audit catches a
leak of twice EPSILON (randomized response, the most detectable leak of that size) 80% of the time, by
simulating the audit — the power ``assert_dp`` requires by default (the perfect-attack minimum,
``trials_needed``, is far too few: such a test would almost never catch a real 2x error). The correct
step passes; the same step with the noise removed — a planted bug — fails with "not (ε, δ)-DP".

Run it with ``pytest examples/test_opacus_step.py`` (needs Opacus; skipped without it). About 2 s.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dpaudit.accounting import analytic_gaussian_epsilon
from dpaudit.audit.plan import plan_design
from dpaudit.seeding import torch_generator
from dpaudit.testing import assert_dp

pytest.importorskip("opacus")

NOISE_MULTIPLIER = 4.0
CLIP = 1.0
DELTA = 1e-5
EPSILON = analytic_gaussian_epsilon(NOISE_MULTIPLIER, DELTA)  # ≈ 0.93: one Gaussian step, sensitivity C
TRIALS = plan_design(EPSILON, delta=DELTA).size  # per side, for 80% power against a leak of 2 * EPSILON

# Records (x, y): nine with zero gradient at w = 0, and the one the neighbour lacks.
DATA = np.array([[1.0, 0.0]] * 9 + [[1.0, 1.0]])
NEIGHBOUR = DATA[:-1]


def opacus_step(records: np.ndarray, rng: np.random.Generator, *, noise_multiplier: float = NOISE_MULTIPLIER) -> float:
    """One DP-SGD step with Opacus from w = 0; returns the new weight (the released output)."""
    import torch
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer
    from torch import nn

    torch.set_num_threads(1)
    linear = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(linear.weight)
    model = GradSampleModule(linear, loss_reduction="sum")  # wraps `linear`: its weight is the one trained
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        noise_multiplier=noise_multiplier,
        max_grad_norm=CLIP,
        expected_batch_size=len(records),  # unused with loss_reduction="sum" (no averaging)
        loss_reduction="sum",
        generator=torch_generator(int(rng.integers(2**31))),  # the trial's own noise stream
    )
    x = torch.as_tensor(records[:, :1], dtype=torch.float32)
    y = torch.as_tensor(records[:, 1:], dtype=torch.float32)
    optimizer.zero_grad()
    with warnings.catch_warnings():  # torch: Opacus' hooks fire although the input needs no gradient (harmless)
        warnings.filterwarnings("ignore", message="Full backward hook is firing.*")
        (0.5 * (model(x) - y) ** 2).sum().backward()
    optimizer.step()  # clip per example, sum, add N(0, σ²C²), step
    return float(linear.weight.detach()[0, 0])


def test_correct_step_is_private():
    result = assert_dp(
        opacus_step, DATA, NEIGHBOUR, epsilon=EPSILON, delta=DELTA, trials=TRIALS, direction="greater", seed=0
    )
    assert result.verdict == "consistent"  # it could have refuted the claim (enough trials) and did not


def noiseless_step(records: np.ndarray, rng: np.random.Generator) -> float:
    """The planted bug: noise_multiplier = 0 (e.g. a config typo)."""
    return opacus_step(records, rng, noise_multiplier=0.0)


def test_step_without_noise_fails():
    with pytest.raises(AssertionError, match=r"not \(.*\)-DP"):
        assert_dp(
            noiseless_step, DATA, NEIGHBOUR, epsilon=EPSILON, delta=DELTA, trials=TRIALS, direction="greater", seed=0
        )
