"""A hand-written NumPy DP-SGD loop carrying dpaudit's gradient canaries (no framework at all).

Logistic regression on 1 000 standardised digits: Poisson sampling at q, per-example clipping to C,
N(0, σ²C²) on the clipped sum, division by the expected batch size. The three dpaudit lines are
marked ``# dpaudit``; ``noise_factor`` plants a wrong noise scale (1/√2: the σC/√2 bug). Audit with::

    dpaudit audit canaries DIR --claimed-epsilon E --delta 1e-5 --noise-multiplier 1.0
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpaudit.accounting import dpsgd_event, epsilon_for

NOISE_MULTIPLIER = 1.0
SAMPLE_RATE = 0.1
STEPS = 60
CLIP = 1.0
LR = 0.5
CANARIES = 300


def claimed_epsilon(delta: float) -> float:
    """The loop's claim at ``delta`` (RDP accounting of the Poisson-sampled Gaussian, T steps)."""
    return float(epsilon_for(dpsgd_event(noise_multiplier=NOISE_MULTIPLIER, sample_rate=SAMPLE_RATE, steps=STEPS),
                             delta, "rdp"))  # fmt: skip


def train(seed: int, out: Path | str, *, noise_factor: float = 1.0, n: int = 1000) -> Path:
    """Train; write what the canaries saw to ``out``; return ``out``."""
    from dpaudit.data import load_dataset
    from dpaudit.hooks import GradientCanaries
    from dpaudit.seeding import numpy_rng

    ds = load_dataset("digits")
    X = ds.X[:n].reshape(n, -1).astype(np.float64)
    X = (X - X.mean(0)) / (X.std(0) + 1e-8)
    y = ds.y[:n]
    W, b = np.zeros((X.shape[1], 10)), np.zeros(10)
    batches, noise = numpy_rng(seed, stream=0), numpy_rng(seed, stream=1)
    canaries = GradientCanaries({"W": W.shape, "b": b.shape}, count=CANARIES, sample_rate=SAMPLE_RATE,
                                clip=CLIP, seed=seed)  # dpaudit  # fmt: skip
    for t in range(STEPS):
        idx = np.flatnonzero(batches.random(n) < SAMPLE_RATE)  # Poisson sampling at rate q
        logits = X[idx] @ W + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        d = p / p.sum(1, keepdims=True) - np.eye(10)[y[idx]]  # ∂loss/∂logits per example
        norms = np.sqrt((X[idx] ** 2).sum(1) * (d**2).sum(1) + (d**2).sum(1))  # ‖x dᵀ‖_F and ‖d‖ together
        f = np.minimum(1.0, CLIP / np.maximum(norms, 1e-12))[:, None]
        summed = {"W": X[idx].T @ (d * f), "b": (d * f).sum(0)}  # Σ_i clip_C(g_i)
        summed = canaries.inject(t, summed)  # dpaudit
        noisy = {k: v + noise.normal(scale=noise_factor * NOISE_MULTIPLIER * CLIP, size=v.shape)
                 for k, v in summed.items()}  # fmt: skip
        canaries.observe(t, noisy)  # dpaudit
        W -= LR * noisy["W"] / (SAMPLE_RATE * n)
        b -= LR * noisy["b"] / (SAMPLE_RATE * n)
    return canaries.save(out)
