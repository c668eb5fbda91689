"""White-box Dirac gradient canaries for a one-run audit of DP-SGD (Steinke, Nasr & Jagielski 2023,
arXiv:2305.08846, §6 "white-box": m gradient canaries, each included independently with probability
1/2, every intermediate update observed).

Canary k is a "record" whose clipped gradient is C·e_{j_k} on its own coordinate j_k (norm C, so
DP-SGD's analysis covers it like any record: the claim holds for every set of clipped gradients).
An included canary is Poisson-sampled at each step with the same rate q as every record and, when
drawn, added to the clipped sum before the noise. The auditor reads o_{t,k} = (noisy sum)_{j_k} / C
at every step t and scores canary k with the per-step Neyman–Pearson log-likelihood ratio of
N(b, σ²), b ~ Bernoulli(q), against N(0, σ²) (:func:`dpaudit.hooks.core.dirac_scores`),
summed over the steps: higher = more likely included. The mechanism (inclusion bits, per-step Poisson
draws, injection before the noise, observation after it) is :class:`dpaudit.hooks.GradientCanaries`,
the one every white-box canary of dpaudit and of users' own loops shares. The coordinates are chosen before training
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
from dpaudit.hooks import GradientCanaries
from dpaudit.hooks.core import dirac_scores, inclusion_bits
from dpaudit.validation import check_positive_int

WHITEBOX_FILE = "whitebox_canaries"  # arrays saved beside the weights: included, scores, coordinates


def low_energy_coordinates(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, k: int) -> np.ndarray:
    """Flat indices (over the trainable parameters in ``named_parameters`` order) of the ``k``
    coordinates with the smallest per-example gradient energy Σ_i g_ij² over up to 256 records at the
    current parameters (ties broken by index, so the choice is deterministic)."""
    from torch.func import grad, vmap

    from dpaudit.training.clipping import reparametrized_call, tied_paths

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())
    tied = tied_paths(model)  # (not functional_call's tie_weights: see reparametrized_call)

    def loss(p, xi, yi):
        out = reparametrized_call(model, {**p, **buffers}, tied, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, yi.unsqueeze(0))

    n = min(len(X), 256)
    try:
        g = vmap(grad(loss), in_dims=(None, 0, 0))(params, X[:n], y[:n])
        energy = torch.cat([g[name].pow(2).sum(0).reshape(-1) for name in names]).double()
    except (RuntimeError, ValueError, TypeError):
        # What vmap cannot run (data-dependent control flow, dropout in training mode, in-place updates):
        # one example at a time, as the loop clipper does, with the random state left as it was.
        energy = _loop_energy(model, X[:n], y[:n], [p for p in model.parameters() if p.requires_grad])
    energy = energy.cpu().numpy()
    if k > energy.size:
        raise InputError(f"{k} white-box canaries need as many parameters; the model has {energy.size}")
    return np.sort(np.argsort(energy, kind="stable")[:k])


def _loop_energy(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, params: list) -> torch.Tensor:
    """Σ_i g_ij² (flat, float64) by one backward pass per example."""
    total = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64, device=params[0].device)
    with torch.random.fork_rng(devices=[X.device] if X.device.type == "cuda" else []):
        for i in range(len(X)):
            loss = torch.nn.functional.cross_entropy(model(X[i : i + 1]), y[i : i + 1])
            gs = torch.autograd.grad(loss, params, allow_unused=True)
            gs = [torch.zeros_like(p) if g is None else g for p, g in zip(params, gs, strict=True)]
            total += torch.cat([g.reshape(-1) for g in gs]).double().square()
    return total


def canary_hooks(clipper, setting, clip: float, *, seed: int, coordinates, **kw) -> GradientCanaries:
    """The :class:`dpaudit.hooks.GradientCanaries` of a dpaudit trainer: parameters named and ordered as
    the clipper's (the model's trainable ``named_parameters``), sampled at the setting's rate q."""
    names = [n for n, p in clipper.model.named_parameters() if p.requires_grad]
    shapes = {n: tuple(p.shape) for n, p in zip(names, clipper.params, strict=True)}
    return GradientCanaries(
        shapes, count=len(coordinates), sample_rate=setting.sample_rate, clip=clip, seed=seed,
        coordinates=coordinates, **kw,
    )  # fmt: skip


class DiracCanaries:
    """``m`` white-box Dirac gradient canaries (see the module docstring) of one training run: the
    coordinates of :func:`low_energy_coordinates` carried by :class:`dpaudit.hooks.GradientCanaries`;
    attach to a DP trainer with :meth:`dpaudit.training.dpsgd.DPTrainer.fit_with_canary`.

    After training: ``included_`` (bool, m), ``coordinates_`` (flat indices, m) and :meth:`score`
    (float64, m; higher = more likely included).
    """

    def __init__(self, *, m: int, seed: int) -> None:
        self.m = check_positive_int(whitebox_canaries=m)
        self.seed = int(seed)
        self.included_ = inclusion_bits(self.m, self.seed)  # the auditor's fair coins, drawn before anything else
        self.coordinates_: np.ndarray | None = None
        self.hooks_: GradientCanaries | None = None
        self._q = self._sigma = 0.0

    def attach(self, clipper, X: torch.Tensor, y: torch.Tensor, setting, clip: float) -> GradientCanaries:
        if setting.sampling != "poisson":
            raise InputError("white-box canaries need Poisson sampling (--sampling poisson)")
        self.coordinates_ = low_energy_coordinates(clipper.model, X, y, self.m)
        self._q, self._sigma = setting.sample_rate, setting.noise_multiplier
        self.hooks_ = canary_hooks(clipper, setting, clip, seed=self.seed, coordinates=self.coordinates_)
        return self.hooks_

    def score(self) -> np.ndarray:
        if self.hooks_ is None:
            return np.zeros(self.m)
        return dirac_scores(self.hooks_.observations().observations, self._q, self._sigma)

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
