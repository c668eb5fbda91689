"""An unchanged Opacus training loop carrying dpaudit's gradient canaries, audited from ONE run.

The only dpaudit lines in the loop are those marked ``# dpaudit``: build the canaries, attach them to
the optimizer ``make_private`` returned, and save what they saw. Then::

    python -m examples.opacus_canaries --out run-canaries            # the correct pipeline
    dpaudit audit canaries run-canaries --claimed-epsilon 7.16 --delta 1e-5 \\
        --noise-multiplier 1.0 --fail-on-violation

(7.16 is ``claimed_epsilon(1e-5)``: σ = 1, q = 0.1, T = 80.) ``--bug`` plants one of three mistakes
that black-box audits with hundreds of trainings miss (for σC/√2 even a perfect score needs about 10⁶
trainings per side), and that the noise check sees in one run:

- ``sqrt2``: noise σC/√2 (e.g. two micro-batches each noised with σC/2 and summed) under the claim σ;
- ``bias``: the noise added to the weights but not to the biases (a hand-written ``add_noise``);
- ``reuse``: the same noise draw at every step (the noise generator re-seeded before each step).

Model: a small CNN on the 8×8 digits (Conv2d(1, 8, 3) -> ReLU -> Linear(288, 10), 2 970 parameters).
Mechanism: Poisson sampling at q = ``SAMPLE_RATE``, clip C = ``CLIP``, σ = ``NOISE_MULTIPLIER``,
T = ``STEPS``; the claim is dpaudit's RDP accounting of it (add/remove neighbours).
"""

from __future__ import annotations

import argparse
import math
import types
import warnings
from pathlib import Path

import numpy as np

from dpaudit.accounting import dpsgd_event, epsilon_for
from dpaudit.errors import DPAuditError
from dpaudit.fileio import check_output_dir

NOISE_MULTIPLIER = 1.0
SAMPLE_RATE = 0.1
EPOCHS = 8
STEPS = round(EPOCHS / SAMPLE_RATE)  # T = 80
CLIP = 1.0
LR = 0.5
CANARIES = 1000
BUGS = ("sqrt2", "bias", "reuse")


def claimed_epsilon(delta: float) -> float:
    """The pipeline's claim at ``delta`` (RDP accounting of the Poisson-sampled Gaussian, T steps)."""
    event = dpsgd_event(noise_multiplier=NOISE_MULTIPLIER, sample_rate=SAMPLE_RATE, steps=STEPS)
    return float(epsilon_for(event, delta, "rdp"))


def digits(n: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """``n`` standardised digits records, (n, 1, 8, 8) float32 and int64 labels."""
    from dpaudit.data import load_dataset

    ds = load_dataset("digits")
    X = ds.X[:n].astype(np.float32).reshape(n, 1, 8, 8)
    X = (X - X.mean()) / X.std()
    return X, ds.y[:n].astype(np.int64)


def _bias_without_noise(optimizer):
    """The planted bug ``bias``: a hand-written add_noise that forgets the one-dimensional parameters."""
    import torch

    def add_noise(self) -> None:
        for p in self.params:
            noise = torch.zeros_like(p.summed_grad)
            if p.dim() > 1:  # weights only: the bias gets none
                noise = torch.normal(0.0, self.noise_multiplier * self.max_grad_norm, p.summed_grad.shape,
                                     generator=self.generator)  # fmt: skip
            p.grad = (p.summed_grad + noise).view_as(p)

    optimizer.add_noise = types.MethodType(add_noise, optimizer)


def train(
    X: np.ndarray,
    y: np.ndarray,
    seed: int,
    out: Path | str,
    *,
    bug: str | None = None,
    grad_sample_mode: str = "hooks",
    force: bool = False,
) -> Path:
    """Train with Opacus and gradient canaries; write what the canaries saw to ``out``; return ``out``.
    ``grad_sample_mode="ghost"``: Opacus' fast gradient clipping (its loss wrapper runs the second backward pass;
    ``DPOptimizerFastGradientClipping`` has the same ``summed_grad``/``add_noise`` interface the canaries use)."""
    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from dpaudit.hooks import GradientCanaries
    from dpaudit.seeding import seed_torch, torch_generator

    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; valid: {', '.join(BUGS)}")
    torch.set_num_threads(1)
    seed_torch(seed, stream=2)
    data = TensorDataset(torch.as_tensor(X), torch.as_tensor(y))
    loader = DataLoader(data, batch_size=math.ceil(SAMPLE_RATE * len(data)), generator=torch_generator(seed, stream=0))
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    sigma = NOISE_MULTIPLIER / math.sqrt(2) if bug == "sqrt2" else NOISE_MULTIPLIER
    noise_gen = torch_generator(seed, stream=1)
    loss_fn = nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Secure RNG turned off.*")
        warnings.filterwarnings("ignore", message="Full backward hook is firing.*")
        private = PrivacyEngine().make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=sigma, max_grad_norm=CLIP,
            poisson_sampling=True, noise_generator=noise_gen, grad_sample_mode=grad_sample_mode,
            **({"criterion": loss_fn} if grad_sample_mode == "ghost" else {}),
        )  # fmt: skip
        if grad_sample_mode == "ghost":  # the criterion comes back wrapped: its backward clips
            model, optimizer, loss_fn, loader = private
        else:
            model, optimizer, loader = private
        if bug == "bias":
            _bias_without_noise(optimizer)
        # dpaudit: M gradient canaries, Poisson-sampled at the loader's rate, clip = the optimizer's max_grad_norm
        shapes = {n: p.shape for n, p in model.named_parameters()}
        canaries = GradientCanaries(shapes, count=CANARIES, sample_rate=loader.sample_rate, clip=None, seed=seed)
        optimizer = canaries.attach(optimizer)
        model.train()
        for _ in range(EPOCHS):
            for xb, yb in loader:
                if bug == "reuse":
                    noise_gen.manual_seed(seed)  # the planted bug: the same noise draw at every step
                optimizer.zero_grad()
                loss_fn(model(xb), yb).backward()
                optimizer.step()
    return canaries.save(out, force=force)  # dpaudit: design + observations, for `dpaudit audit canaries`


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bug", choices=BUGS)
    parser.add_argument("--grad-sample-mode", choices=("hooks", "ghost"), default="hooks")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out")
    args = parser.parse_args(argv)
    try:
        check_output_dir(args.out, force=args.force)  # before training, not after it
        X, y = digits()
        out = train(X, y, args.seed, args.out, bug=args.bug, grad_sample_mode=args.grad_sample_mode, force=args.force)
    except DPAuditError as e:
        parser.exit(2, f"error: {e}\n")
    print(out)


if __name__ == "__main__":
    main()
