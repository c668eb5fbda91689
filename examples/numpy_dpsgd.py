"""DP-SGD in plain NumPy for multinomial logistic regression, as a dpaudit plug-in trainer.

Audit it (from the repository root)::

    dpaudit audit train --trainer examples.numpy_dpsgd:train --model-spec spec.json \\
        --train-size 200 --runs 40 --claimed-epsilon 1.2717 --delta 1e-5 --fail-on-violation

where ``spec.json`` holds :data:`MODEL_SPEC` and 1.2717 is ``claimed_epsilon(1e-5)``. In Python::

    from dpaudit.workflows import audit_training
    audit_training(load_dataset("digits"), model_spec_from_dict(MODEL_SPEC), trainer=train,
                   claimed_epsilon=claimed_epsilon(1e-5), delta=1e-5, runs=40, train_size=200)

Every trainer here follows dpaudit's plug-in contract (:mod:`dpaudit.plugins`):
``train(X, y, seed, *, reference_size=200) -> {"1.weight": (K, d) array, "1.bias": (K,) array}`` — the
parameter names of dpaudit's ``logreg`` model (``nn.Sequential(nn.Flatten(), nn.Linear(d, K))``).
``reference_size`` is the contract's optional keyword: the one dataset size N the mechanism is defined
for, the same on both neighbours (the audit passes N + 1 to the runs with N and with N + 1 records);
the divisor of step 5 is built from it, never from ``len(X)``.

The algorithm (DP-SGD, Abadi et al. 2016, arXiv:1607.00133, Algorithm 1, with Poisson sampling as in
its privacy analysis and Mironov et al. 2019, arXiv:1908.10530), for T = ``STEPS`` steps:

1. Poisson sampling: each record joins the batch independently with probability q = ``SAMPLE_RATE``.
2. Per-example gradients of the cross-entropy of softmax(W x + b), in closed form: with p = softmax
   and e_y the one-hot label, ∂ℓ/∂W = (p − e_y) xᵀ and ∂ℓ/∂b = p − e_y; the norm of the pair is
   ‖p − e_y‖ · sqrt(‖x‖² + 1) (the Frobenius norm of a rank-one matrix u xᵀ is ‖u‖ ‖x‖).
3. Clipping each to norm ≤ C = ``CLIP`` (factor min(1, C / norm)).
4. The sum of clipped gradients plus Gaussian noise N(0, σ² C² I), σ = ``NOISE_MULTIPLIER``.
5. A step of size ``LR`` on that noisy sum divided by q · ``reference_size`` (the expected batch size
   of the reference dataset; 50 for the default 200): dividing by the actual batch size would leak it,
   and by q · len(X) would make the update depend on n, which add/remove neighbours differ in.

The claim (:func:`claimed_epsilon`) is dpaudit's RDP accounting of exactly this mechanism:
T-fold composition of the Poisson-subsampled Gaussian with rate q and noise multiplier σ
(add/remove neighbours). The model starts at zero (logistic regression is convex), so every run's
randomness is its batches and its noise — both drawn from ``seed``.

Two planted bugs for the audit to catch, with the same claim:

- :func:`train_sigma_over_batch`: the noise std is divided by the batch size (σ C / B on the *sum*:
  the mistake of scaling the noise for an average twice) — B times too little noise;
- :func:`train_without_clipping`: per-example gradients are not clipped, so one record's influence
  is unbounded while the noise is still calibrated to C.
"""

from __future__ import annotations

import numpy as np

from dpaudit.accounting import dpsgd_event, epsilon_for
from dpaudit.seeding import numpy_rng

MODEL_SPEC = {"kind": "logreg", "input_shape": [1, 8, 8], "n_classes": 10}
NOISE_MULTIPLIER = 4.0
SAMPLE_RATE = 0.25
EPOCHS = 5
STEPS = round(EPOCHS / SAMPLE_RATE)  # 20 steps: each record is sampled about EPOCHS times
CLIP = 1.0
LR = 2.0
REFERENCE_SIZE = 200  # the default N the mechanism is defined for (see step 5 in the module docstring)


def claimed_epsilon(delta: float, accountant: str = "rdp") -> float:
    """The ε the pipeline claims at ``delta``: T = STEPS compositions of the Poisson-subsampled Gaussian
    (q = SAMPLE_RATE, σ = NOISE_MULTIPLIER), accounted by dpaudit (RDP by default, add/remove)."""
    event = dpsgd_event(noise_multiplier=NOISE_MULTIPLIER, sample_rate=SAMPLE_RATE, steps=STEPS)
    return epsilon_for(event, delta, accountant)


def _dpsgd(
    X: np.ndarray, y: np.ndarray, seed: int, *, noise_std: float, clip: float | None, reference_size: int
) -> dict[str, np.ndarray]:
    """DP-SGD as in the module docstring; ``noise_std`` is the noise on the gradient *sum*, ``clip`` None
    skips clipping (a planted bug)."""
    batch_normaliser = SAMPLE_RATE * reference_size  # the expected batch size of the reference dataset
    X = np.asarray(X, dtype=np.float64).reshape(len(X), -1)  # float64: the small noise is not lost to rounding
    y = np.asarray(y, dtype=np.int64)
    n, d = X.shape
    k = MODEL_SPEC["n_classes"]
    sampling, noise = numpy_rng(seed, stream=0), numpy_rng(seed, stream=1)
    W, b = np.zeros((k, d)), np.zeros(k)
    x_scale = np.sqrt((X**2).sum(axis=1) + 1.0)  # sqrt(‖x‖² + 1): the bias is a weight on a constant 1
    for _ in range(STEPS):
        batch = sampling.random(n) < SAMPLE_RATE  # Poisson sampling (step 1)
        Xb, yb = X[batch], y[batch]
        z = Xb @ W.T + b
        p = np.exp(z - z.max(axis=1, keepdims=True))  # softmax, shifted for stability
        p /= p.sum(axis=1, keepdims=True)
        g = p
        g[np.arange(len(yb)), yb] -= 1.0  # p − e_y (step 2)
        if clip is not None:
            norms = np.linalg.norm(g, axis=1) * x_scale[batch]
            g = g * np.minimum(1.0, clip / np.maximum(norms, 1e-12))[:, None]  # step 3
        grad_W = g.T @ Xb + noise.normal(0.0, noise_std, size=W.shape)  # step 4
        grad_b = g.sum(axis=0) + noise.normal(0.0, noise_std, size=b.shape)
        W -= LR * grad_W / batch_normaliser  # step 5
        b -= LR * grad_b / batch_normaliser
    return {"1.weight": W.astype(np.float32), "1.bias": b.astype(np.float32)}


def train(X: np.ndarray, y: np.ndarray, seed: int, *, reference_size: int = REFERENCE_SIZE) -> dict[str, np.ndarray]:
    """Correct DP-SGD: noise N(0, σ² C²) on the sum of clipped per-example gradients."""
    return _dpsgd(X, y, seed, noise_std=NOISE_MULTIPLIER * CLIP, clip=CLIP, reference_size=reference_size)


def train_sigma_over_batch(
    X: np.ndarray, y: np.ndarray, seed: int, *, reference_size: int = REFERENCE_SIZE
) -> dict[str, np.ndarray]:
    """Planted bug: the noise std divided by the (expected) batch size — σ C / B on the sum."""
    batch = SAMPLE_RATE * reference_size
    return _dpsgd(X, y, seed, noise_std=NOISE_MULTIPLIER * CLIP / batch, clip=CLIP, reference_size=reference_size)


def train_without_clipping(
    X: np.ndarray, y: np.ndarray, seed: int, *, reference_size: int = REFERENCE_SIZE
) -> dict[str, np.ndarray]:
    """Planted bug: no per-example clipping (the noise still assumes sensitivity C)."""
    return _dpsgd(X, y, seed, noise_std=NOISE_MULTIPLIER * CLIP, clip=None, reference_size=reference_size)
