"""White-box Dirac gradient canaries for a one-run audit of DP-SGD (Steinke, Nasr & Jagielski 2023,
arXiv:2305.08846, §6 "white-box": m gradient canaries, each included independently with probability
1/2, every intermediate update observed).

Canary k is a "record" whose clipped gradient is C·e_{j_k} on its own coordinate j_k (norm C, so
DP-SGD's analysis covers it like any record: the claim holds for every set of clipped gradients).
An included canary is Poisson-sampled at each step with the same rate q as every record and, when
drawn, added to the clipped sum before the noise. The auditor reads o_{t,k} = (noisy sum)_{j_k} / C
at every step t and scores canary k with the per-step Neyman–Pearson log-likelihood ratio of
N(b, σ²), b ~ Bernoulli(q), against N(0, σ²) (as :class:`dpaudit.training.dpsgd.GradientCanary`),
summed over the steps: higher = more likely included. The coordinates are chosen before training
from the data only (never from the inclusion bits): those of smallest per-example gradient energy
at initialisation, where the data's own gradients disturb the reading least.

The scores and inclusion bits feed the one-run audit (:func:`dpaudit.audit.audit_scores` with
``method="one-run", design="canaries"``): formal at the stated confidence for an add/remove claim,
because each canary's presence is one add/remove neighbouring change of the training set.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dpaudit.errors import InputError
from dpaudit.validation import check_positive_int

WHITEBOX_FILE = "whitebox_canaries"  # arrays saved beside the weights: included, scores, coordinates


def low_energy_coordinates(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, k: int) -> np.ndarray:
    """Flat indices (over the trainable parameters in ``named_parameters`` order) of the ``k``
    coordinates with the smallest per-example gradient energy Σ_i g_ij² over up to 256 records at the
    current parameters (ties broken by index, so the choice is deterministic)."""
    from torch.func import functional_call, grad, vmap

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())

    def loss(p, xi, yi):
        out = functional_call(model, {**p, **buffers}, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, yi.unsqueeze(0))

    n = min(len(X), 256)
    g = vmap(grad(loss), in_dims=(None, 0, 0))(params, X[:n], y[:n])
    energy = torch.cat([g[name].pow(2).sum(0).reshape(-1) for name in names]).double().cpu().numpy()
    if k > energy.size:
        raise InputError(f"{k} white-box canaries need as many parameters; the model has {energy.size}")
    return np.sort(np.argsort(energy, kind="stable")[:k])


class DiracCanaries:
    """``m`` white-box Dirac gradient canaries (see the module docstring); attach to a DP trainer with
    :meth:`dpaudit.training.dpsgd.DPTrainer.fit_with_canary`.

    After training: ``included_`` (bool, m), ``coordinates_`` (flat indices, m) and :meth:`score`
    (float64, m; higher = more likely included).
    """

    def __init__(self, *, m: int, seed: int) -> None:
        self.m = check_positive_int(whitebox_canaries=m)
        self.seed = int(seed)
        rng = np.random.default_rng([self.seed, 0xD12AC])
        self.included_ = rng.random(self.m) < 0.5  # the auditor's fair coins, drawn before anything else
        self.coordinates_: np.ndarray | None = None
        self._scores = np.zeros(self.m)
        self._q = self._sigma = 0.0

    def attach(self, clipper, X: torch.Tensor, y: torch.Tensor, setting, clip: float):
        if setting.sampling != "poisson":
            raise InputError("white-box canaries need Poisson sampling (--sampling poisson)")
        self.coordinates_ = low_energy_coordinates(clipper.model, X, y, self.m)
        sizes = [p.numel() for p in clipper.params]
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        which = np.searchsorted(offsets, self.coordinates_, side="right") - 1
        groups = [
            (i, torch.as_tensor(self.coordinates_[which == i] - offsets[i]), np.flatnonzero(which == i))
            for i in range(len(sizes))
            if np.any(which == i)
        ]
        self._q, self._sigma = setting.sample_rate, setting.noise_multiplier
        batch = setting.batch_size
        gen = torch.Generator().manual_seed(self.seed)
        included = torch.as_tensor(self.included_)

        def hook(sums: list[torch.Tensor]) -> None:
            # Poisson sampling of each included canary at rate q, as for every record.
            drawn = (torch.rand(self.m, generator=gen, dtype=torch.float64) < self._q) & included
            for i, flat, members in groups:
                add = drawn[members].to(sums[i].dtype).to(sums[i].device) * clip
                sums[i].view(-1).index_add_(0, flat.to(sums[i].device), add)

        def observe() -> None:
            o = np.empty(self.m)
            for i, flat, members in groups:
                g = clipper.params[i].grad.reshape(-1)[flat.to(clipper.params[i].grad.device)]
                o[members] = g.detach().double().cpu().numpy() * batch / clip
            self._scores += self._step_llr(o)

        return hook, observe

    def _step_llr(self, o: np.ndarray) -> np.ndarray:
        # log(1 − q + q·exp((o − 1/2)/σ²)), the log-likelihood ratio of N(b, σ²), b ~ Bernoulli(q),
        # against N(0, σ²) at one step (Neyman–Pearson); logaddexp keeps it finite for large |o|.
        if self._sigma == 0:
            return o
        z = (o - 0.5) / self._sigma**2
        if self._q >= 1:
            return z
        return np.logaddexp(np.log1p(-self._q), np.log(self._q) + z)

    def score(self) -> np.ndarray:
        return self._scores.copy()

    def arrays(self, scores: np.ndarray) -> dict[str, np.ndarray]:
        """What a run directory stores (safetensors-ready numeric arrays)."""
        if self.coordinates_ is None:
            raise InputError("the white-box canaries were never attached to a training run")
        return {
            "included": self.included_.astype(np.int8),
            "scores": np.asarray(scores, dtype=np.float64),
            "coordinates": self.coordinates_.astype(np.int64),
        }

    def describe(self) -> dict[str, Any]:
        return {"kind": "dirac", "m": self.m, "seed": self.seed, "inclusion_probability": 0.5}
