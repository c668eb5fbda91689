"""A complete Opacus DP-SGD pipeline, audited by dpaudit as a plug-in trainer.

Audit it in CI (from the repository root; see ``examples/ci/github-audit.yml``)::

    python -c "import json, examples.opacus_pipeline as p; json.dump(p.MODEL_SPEC, open('spec.json', 'w'))"
    dpaudit audit train --trainer examples.opacus_pipeline:train --model-spec spec.json \\
        --train-size 200 --runs 50 --claimed-epsilon 1.2717 --delta 1e-5 --fail-on-violation

(1.2717 is ``claimed_epsilon(1e-5)``.) The audit trains the pipeline 50 times on the training set plus
dpaudit's canary and 50 times without it, scores the canary under each final model and bounds ε with
Clopper–Pearson: a formal lower bound. 50 runs per side can certify at most ε ≈ 1.84 (``dpaudit audit
plan --epsilon 1.2717`` says at least 29 are needed to refute this claim at all). The correct
pipeline comes out "consistent" (for a correct claim, "violation" is a false alarm of probability at
most 5%); :func:`train_sigma_over_batch` — the same claim, but B times too little noise — comes out
"violation" (exit 1 with ``--fail-on-violation``).

The pipeline follows dpaudit's plug-in contract (:mod:`dpaudit.plugins`):
``train(X, y, seed) -> state_dict`` of the model ``MODEL_SPEC`` describes (dpaudit's ``logreg``:
``nn.Sequential(nn.Flatten(), nn.Linear(64, 10))``; Opacus' ``_module.`` prefix is accepted). It uses
Opacus' public API only — ``PrivacyEngine.make_private`` with ``poisson_sampling=True``:

- Poisson sampling at rate q = ``SAMPLE_RATE``: Opacus sets q = 1 / len(data_loader), so the loader's
  batch size is chosen to make that exactly q (checked);
- per-example gradients clipped to ``CLIP``, Gaussian noise of std σ·C (σ = ``NOISE_MULTIPLIER``) on
  their sum, divided by the expected batch size (Opacus' DPOptimizer);
- T = ``EPOCHS`` / q steps (each epoch is len(data_loader) = 1/q Poisson batches).

It does not take the contract's ``reference_size`` keyword: Opacus derives q (1 / len(data_loader)) and
the expected batch size (int(q · len(dataset))) from the dataset it is given, and the loader's batch size
is chosen so that both are the same for the audit's N = 200 and N + 1 = 201 records (q is checked at
run time), so both neighbours run one mechanism. The audit's notes say the keyword is absent.

The claim (:func:`claimed_epsilon`) is dpaudit's RDP accounting of that mechanism: the T-fold
composition of the Poisson-subsampled Gaussian (Abadi et al. 2016, arXiv:1607.00133; Mironov et al.
2019, arXiv:1908.10530), add/remove neighbours — the relation dpaudit's audit uses by default.

Randomness: everything comes from ``seed`` through :mod:`dpaudit.seeding` (one generator for the
batches, one for the noise); the model starts at zero (logistic regression is convex), so no
initialisation noise blurs the audit. CPU, one thread: about 0.1 s per run.

Note: Opacus (≤ 1.6) installs a top-level package named ``examples`` into site-packages. dpaudit's
``--trainer`` imports with the current directory first, so this package wins when you run from the
repository root; in your own scripts, run from there too (``python -m ...``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from dpaudit.accounting import dpsgd_event, epsilon_for

MODEL_SPEC = {"kind": "logreg", "input_shape": [1, 8, 8], "n_classes": 10}
NOISE_MULTIPLIER = 4.0
SAMPLE_RATE = 0.25  # Poisson rate q; Opacus' expected batch size is int(q * n) (50 for n = 200 or 201)
EPOCHS = 5
STEPS = round(EPOCHS / SAMPLE_RATE)  # T = 20
CLIP = 1.0
LR = 2.0


def claimed_epsilon(delta: float, accountant: str = "rdp") -> float:
    """The ε the pipeline claims at ``delta`` (dpaudit's accountant, RDP by default; add/remove)."""
    event = dpsgd_event(noise_multiplier=NOISE_MULTIPLIER, sample_rate=SAMPLE_RATE, steps=STEPS)
    return epsilon_for(event, delta, accountant)


def _train(X: np.ndarray, y: np.ndarray, seed: int, *, noise_multiplier: float) -> dict:
    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from dpaudit.seeding import torch_generator

    torch.set_num_threads(1)
    data = TensorDataset(torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.int64))
    # batch size ceil(q n): then len(loader) = 1/q for any n ≥ 12 here, and Opacus samples at rate q.
    loader = DataLoader(data, batch_size=math.ceil(SAMPLE_RATE * len(data)), generator=torch_generator(seed, stream=0))
    model = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(MODEL_SPEC["input_shape"]), MODEL_SPEC["n_classes"]))
    nn.init.zeros_(model[1].weight)
    nn.init.zeros_(model[1].bias)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with warnings.catch_warnings():
        # Opacus warns that its secure RNG is off (seeded noise is the point here), and torch that Opacus'
        # per-example-gradient hooks fire on a first layer whose input needs no gradient: both harmless.
        warnings.filterwarnings("ignore", message="Secure RNG turned off.*")
        warnings.filterwarnings("ignore", message="Full backward hook is firing.*")
        engine = PrivacyEngine()
        model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=CLIP,
            poisson_sampling=True,
            noise_generator=torch_generator(seed, stream=1),
        )
        if not math.isclose(loader.sample_rate, SAMPLE_RATE):
            raise ValueError(f"Opacus samples at rate {loader.sample_rate}, but the claim is for {SAMPLE_RATE}")
        loss_fn = nn.CrossEntropyLoss()
        model.train()
        for _ in range(EPOCHS):
            for xb, yb in loader:  # 1/q Poisson batches per epoch (an empty one still takes a noisy step)
                optimizer.zero_grad()
                loss_fn(model(xb), yb).backward()
                optimizer.step()  # clip, sum, add noise, divide by the expected batch size, step
    return {k: v.detach().clone() for k, v in model.state_dict().items()}  # keys "_module.1.weight", ...


def train(X: np.ndarray, y: np.ndarray, seed: int) -> dict:
    """DP-SGD with Opacus: σ = NOISE_MULTIPLIER, C = CLIP, q = SAMPLE_RATE, T = STEPS (what the claim says)."""
    return _train(X, y, seed, noise_multiplier=NOISE_MULTIPLIER)


def train_sigma_over_batch(X: np.ndarray, y: np.ndarray, seed: int) -> dict:
    """The classic bug: the noise multiplier divided by the expected batch size ("the noise is on the
    average, so scale it by 1/B") — Opacus already averages, so the noise is B times too small. Claims
    the same ε."""
    batch = int(SAMPLE_RATE * len(y))
    return _train(X, y, seed, noise_multiplier=NOISE_MULTIPLIER / batch)
