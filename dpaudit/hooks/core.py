"""Gradient canaries for any DP-SGD loop: the framework-neutral core (NumPy; torch/JAX arrays converted).

The mechanism audited is DP-SGD's step (Abadi et al. 2016, arXiv:1607.00133, Alg. 1):
noisy_sum_t = Σ_{i ∈ batch_t} clip_C(g_i) + N(0, σ²C² I). Two hooks bracket the noise:

- ``inject(t, summed_clipped_grads)`` adds the canaries' clipped gradients to the clipped sum before
  the noise. Canary k is a "record" whose clipped gradient is C·e_{j_k} on its own coordinate j_k
  (norm C, so the claim covers it like any record). Canary k takes part in the run with its secret
  inclusion bit (probability 1/2, drawn before anything else) and, when it does, is Poisson-sampled
  at every step at rate q, as every record is (Steinke, Nasr & Jagielski 2023, arXiv:2305.08846, §6,
  white-box canaries; Nasr et al. 2023, arXiv:2302.07956, §3, Dirac canaries). With
  ``inclusion="step"`` each canary instead gets a fresh coin at every step (the per-step design of
  Nasr et al. 2023, §3).
- ``observe(t, noisy_grads)`` reads the noisy sum after the noise: o_{t,k} = noisy_{j_k} / C per
  canary (the one-run audit's observations), and, because the sum the noise was added to is known
  (it is what ``inject`` returned), the noise actually added, z_t = noisy_t − injected_t. Of z_t it
  keeps a sufficient summary for the noise check (:mod:`dpaudit.audit.noise`): per parameter group,
  Σ z_j² and the count over the coordinates no canary touches (so the summary is independent of the
  inclusion bits), and K projections of z_t on fixed random vectors with disjoint supports (to test
  that the noise is independent across steps), and, for every pair of groups, the inner product of their
  noise over their first :data:`CROSS_PREFIX` flat positions and the sums of squares there (to test that
  the noise is independent across groups: one PRNG key reused for every leaf gives every leaf the same
  leading draws, since ``jax.random.normal(k, (n,))`` is the prefix of ``jax.random.normal(k, (m,))``).

Randomness: every draw comes from ``seed`` through its own numpy stream (inclusion bits, coordinates,
per-step Poisson draws, per-step coins, projections), all fixed before training and independent of
the data and of the noise.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.defaults import MIN_HOLDOUT_CANARIES
from dpaudit.errors import CheckpointError, InputError
from dpaudit.validation import (
    MAX_DERIVED_SEED,
    check_choice,
    check_in_interval,
    check_positive,
    check_positive_int,
    check_seed,
    host_array,
    python_scalar,
    read_json,
)

DESIGN_FILE = "canaries.json"
ARRAYS_FILE = "canaries.safetensors"
FORMAT = "dpaudit-gradient-canaries/1"
INCLUSIONS = ("run", "step")
OPACUS_PREFIX = "_module."
# meta keys: the smallest and largest noise multiplier an adapter saw at a noisy step (a noise schedule: the audit
# refuses a claimed σ above the smallest, as the noise check tests one σ at every step)
SIGMA_MIN, SIGMA_MAX = "implementation_noise_multiplier_min", "implementation_noise_multiplier_max"
PROJECTIONS = 8  # K projections for the independence test (see dpaudit.audit.noise.independence_test)
PROJECTION_SUPPORT = 512  # at most this many coordinates per projection
CROSS_PREFIX = 512  # the leading coordinates of each group compared with every other group's (cross-group test)

# numpy streams of ``seed`` (one per purpose, so changing one use never shifts another's draws)
_INCLUDED, _COINS, _COORDS, _DRAWS, _PROJ = 0xD12AC, 0x57E9, 0xC00D, 0x5A3D, 0x9E0


# Why a gradient mapping lacks some of the canaries' parameters (torch): a tied weight, which state_dict() names twice.
TIED_MISSING = (
    "; a weight shared by two modules (an embedding tied to the output layer) has one gradient, which "
    "named_parameters() lists once and state_dict() twice: build the canaries from "
    "{n: p.shape for n, p in model.named_parameters() if p.requires_grad}"
)
# Why a JAX gradient tree lacks some of the canaries' leaves (the torch hint, a tied weight, does not apply: was
# "a weight shared by two modules ... named_parameters()" for an optax.multi_transform with frozen leaves).
JAX_MISSING = (
    "; a leaf another transformation handles (frozen by optax.multi_transform or optax.masked) is not in the tree "
    "the canaries see: build them from the leaves it holds ({k: s for k, s in pytree_shapes(params).items() if "
    "k in trained})"
)


def canonical_name(name: str) -> str:
    """A parameter's name without Opacus' ``_module.`` prefix(es) (GradSampleModule wraps the model)."""
    while name.startswith(OPACUS_PREFIX):
        name = name[len(OPACUS_PREFIX) :]
    return name


def inclusion_bits(count: int, seed: int) -> np.ndarray:
    """The canaries' secret inclusion bits: fair coins from ``seed``'s own stream (bool, ``count``)."""
    return np.random.default_rng([int(seed), _INCLUDED]).random(int(count)) < 0.5


def dirac_scores(observations, sample_rate: float, noise_multiplier: float) -> np.ndarray:
    """Scores of Dirac gradient canaries from their per-step observations o_{t,k} = (noisy sum)_{j_k}/C
    (shape (T,) or (T, M)): Σ_t log(1 − q + q·exp((o_t − 1/2)/σ²)), the Neyman–Pearson log-likelihood
    ratio of N(b, σ²), b ~ Bernoulli(q), against N(0, σ²) summed over the steps (higher = more likely
    included; Nasr et al. 2023, arXiv:2302.07956, §3). logaddexp keeps it finite for large |o|; σ = 0
    gives Σ_t o_t (the count of draws)."""
    o = np.asarray(observations, dtype=np.float64)
    if noise_multiplier == 0:
        return o.sum(axis=0)
    z = (o - 0.5) / (noise_multiplier * noise_multiplier)  # σ·σ: inf, not OverflowError, for σ > ~1e154
    if sample_rate >= 1:
        return z.sum(axis=0)
    return np.logaddexp(np.log1p(-sample_rate), np.log(sample_rate) + z).sum(axis=0)


def _framework(x: Any) -> str:
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith(("jax", "jaxlib")):
        return "jax"
    return "numpy"


# The dtypes the hooks take: a canary is C added exactly (up to float32 rounding) to the clipped sum. In an
# integer array C is truncated (0.5 -> 0: the canary silently absent); in bfloat16/float16 (8/11 mantissa bits)
# C added to a coordinate of magnitude >= 2^8·C (bf16) rounds to 0 or 2C, so the canary the audit scores as C
# was not what the loop released (2C exceeds the sensitivity the claim covers: a false violation).
FULL_PRECISION = ("float32", "float64")


def dtype_name(x: Any) -> str:
    """The dtype of a torch tensor, NumPy/JAX array or Python number, as NumPy names it ("float32", "bfloat16");
    "float0" for JAX's gradient of an integer leaf."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        return np.asarray(x).dtype.name
    if _framework(x) == "torch":
        return str(dt).removeprefix("torch.")
    return "float0" if "float0" in str(dt) else np.dtype(dt).name


def check_full_precision_grads(what: str, name: str, x: Any) -> None:
    """Refuse (one line) a gradient array that is not float32/float64 (see :data:`FULL_PRECISION`)."""
    kind = dtype_name(x)
    if kind not in FULL_PRECISION:
        raise InputError(
            f"{what}: parameter {name!r} has dtype {kind}, not float32 or float64: a canary C added to it is not "
            "exactly C (truncated in an integer dtype, rounded to 0 or 2C in bfloat16/float16), so the audit would "
            "not know what was released; accumulate the clipped sum in float32 and leave non-float parameters out "
            "of param_shapes"
        )


def _check_not_traced(what: str, x: Any) -> None:
    """Refuse (one line) a JAX tracer: the core reads NumPy, so it cannot run inside ``jax.jit``/``vmap``/``scan``."""
    if _framework(x) == "jax":
        import jax

        if isinstance(x, jax.core.Tracer):
            raise InputError(
                f"{what} got a traced JAX array (called inside jax.jit, vmap or scan): the hooks read NumPy, so "
                "call them between jitted pieces, or put canaries.optax_inject()/optax_observe() in the jitted "
                "optax chain"
            )


def _shape(name: Any, shape: Any) -> tuple[int, ...]:
    """A parameter's shape as a tuple of non-negative ints; anything else (the parameter itself, as
    ``dict(model.named_parameters())`` gives it: torch's "only one element tensors can be converted") one line."""
    try:
        if not isinstance(shape, Sequence | np.ndarray) or (hasattr(shape, "dtype") and _framework(shape) != "numpy"):
            raise TypeError  # a tensor or JAX array is a parameter, not its shape (torch.Size is a tuple)
        out = tuple(int(python_scalar(d)) for d in shape)
    except (TypeError, ValueError):
        out = None
    if out is None or any(d < 0 for d in out):
        raise InputError(
            f"param_shapes[{str(name)!r}] must be a shape (p.shape), got {type(shape).__name__}; use "
            "{n: p.shape for n, p in model.named_parameters() if p.requires_grad}"
        )
    return out


def to_numpy(x: Any) -> np.ndarray:
    """A float64 NumPy copy of a torch tensor, JAX array or array-like (the audit's precision). Always a copy: of a
    float64 array or CPU tensor, np.asarray is a view, so inject's record of the sum it returned followed the
    caller's in-place noise (``g += noise``; ``g.add_(noise)``), the noise read as 0 and a correct loop as a
    violation."""
    return np.array(host_array(x), dtype=np.float64, copy=True)


def _add_at(x: Any, flat: np.ndarray, values: np.ndarray) -> Any:
    """``x`` (same framework, dtype, device and shape) with ``values`` added at the flat indices ``flat``."""
    kind = _framework(x)
    if kind == "torch":
        import torch

        out = x.detach().clone()
        if len(flat):
            idx = torch.as_tensor(flat, dtype=torch.int64, device=out.device)
            # The flat index is the row-major (C-order) one that to_numpy's reshape(-1) reads. A tensor that is not
            # contiguous (channels_last, a transpose) has no flat view (view(-1) raised RuntimeError): add on a
            # row-major copy and write it back through the tensor's own strides.
            dense = out.view(-1) if out.is_contiguous() else out.reshape(-1).clone()
            dense.index_add_(0, idx, torch.as_tensor(values, dtype=out.dtype, device=out.device))
            if not out.is_contiguous():
                out.copy_(dense.view(out.shape))
        return out
    if kind == "jax":
        return x.reshape(-1).at[flat].add(values.astype(x.dtype)).reshape(x.shape)
    # order="C": reshape(-1) of a Fortran-ordered copy (np.array keeps the input's order, e.g. a gradient computed
    # as (d.T @ x).T) is itself a copy, so the canaries were added to a temporary and silently lost.
    out = np.array(x, copy=True, order="C")
    out.reshape(-1)[flat] += values.astype(out.dtype)  # the coordinates are distinct: no repeated index
    return out


def cross_masks(sizes: Sequence[int], untouched: Sequence[np.ndarray]) -> np.ndarray:
    """(G, min(CROSS_PREFIX, max size)) 0/1: position i of group g is compared across groups (i < its size and
    no canary there). A pair (a, b) uses the positions set in both."""
    width = min(CROSS_PREFIX, max(sizes, default=0))
    out = np.zeros((len(sizes), width))
    for g, keep in enumerate(untouched):
        m = min(width, len(keep))
        out[g, :m] = keep[:m]
    return out


def untouched_masks(sizes: Sequence[int], coordinates: np.ndarray) -> list[np.ndarray]:
    """Per group (of ``sizes`` flat coordinates, in order), True where no canary's flat coordinate sits."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    c = np.asarray(coordinates, dtype=np.int64)
    out = []
    for g, size in enumerate(sizes):
        keep = np.ones(int(size), dtype=bool)
        keep[c[(c >= offsets[g]) & (c < offsets[g + 1])] - offsets[g]] = False
        out.append(keep)
    return out


def cross_pair_counts(param_shapes: Mapping[str, Sequence[int]], coordinates: np.ndarray) -> np.ndarray:
    """(G, G): how many positions per step the cross-group test compares for each pair of groups (the
    positions :func:`cross_masks` sets in both), from the design alone."""
    sizes = [math.prod(s) for s in param_shapes.values()]
    m = cross_masks(sizes, untouched_masks(sizes, coordinates))
    return (m @ m.T).round().astype(np.int64)


@dataclass(frozen=True)
class CanaryObservations:
    """What a run with gradient canaries leaves for the auditor (plain arrays; see :meth:`GradientCanaries.save`).

    ``observations[t, k]`` = (noisy sum at canary k's coordinate at step t) / C; ``included[k]`` the
    secret bit (``inclusion == "run"``) or ``coins[t, k]`` the per-step coins (``"step"``);
    ``noise_ss[t, g]`` Σ z² over the ``noise_count[g]`` coordinates of group g no canary touches;
    ``projections[t, k]`` the noise projected on K fixed vectors with disjoint supports; ``cross[0, a, b]``
    Σ_t Σ_i z_a,i·z_b,i over the positions i < :data:`CROSS_PREFIX` untouched in both groups,
    ``cross[1, a, b]`` Σ_t Σ_i z_a,i² over the same positions and ``cross[2, a, b]`` Σ_t Σ_i z_b,i² (so
    ``cross[2] = cross[1]ᵀ``); None in files written before it existed (:func:`cross_pair_counts` gives
    how many positions each pair compares per step).
    """

    param_shapes: dict[str, tuple[int, ...]]
    count: int
    sample_rate: float
    clip: float
    seed: int
    inclusion: str
    coordinates: np.ndarray
    included: np.ndarray
    observations: np.ndarray
    coins: np.ndarray | None
    noise_ss: np.ndarray
    noise_count: np.ndarray
    projections: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    cross: np.ndarray | None = None  # (3, G, G) over all steps: Σ z_A·z_B, Σ z_A², Σ z_B² on the pair's prefix

    @property
    def steps(self) -> int:
        return int(self.observations.shape[0])


class GradientCanaries:
    """``count`` white-box gradient canaries for a DP-SGD loop (see the module docstring).

    Args:
        param_shapes: parameter name -> shape, in the order the loop passes gradients (e.g.
            ``{n: p.shape for n, p in model.named_parameters() if p.requires_grad}``). Opacus'
            ``_module.`` prefix is ignored, here and in the gradients' names.
        count: M canaries (distinct coordinates; at most the number of parameters).
        sample_rate: the claimed Poisson rate q; each included canary is drawn at every step with
            probability q, as a record is.
        clip: C, the clipping norm (each canary's clipped gradient is C·e_j). None: set by an adapter
            (Opacus: the optimizer's ``max_grad_norm``).
        seed: all of the canaries' randomness.
        coordinates: flat indices (over the parameters in ``param_shapes`` order) of the canaries, chosen
            before training from anything but the inclusion bits; default: M distinct coordinates drawn
            uniformly from ``seed``. Coordinates where the data's gradients are small make the canary
            easier to see (:func:`dpaudit.training.dirac.low_energy_coordinates` chooses such).
        included: the inclusion bits (bool, M), for an experiment that sets them itself (the multi-run
            white-box audit); default: fair coins from ``seed``.
        inclusion: "run" (one bit per canary for the whole run; the one-run audit) or "step" (a fresh
            coin per canary and step; the per-step audit of :mod:`dpaudit.audit.whitebox`).
        projections: K, the number of noise projections kept per step (0: none).

    Formal guarantee: the one-run audit of the saved observations is a formal lower bound on ε for an
    add/remove claim, because each canary's presence is one add/remove change of the training set
    (Steinke, Nasr & Jagielski 2023, Theorem 3.1); it assumes the canaries are added exactly where
    the loop's records are (the clipped sum before the noise) — the adapters do this.
    """

    def __init__(
        self,
        param_shapes: Mapping[str, Sequence[int]],
        *,
        count: int,
        sample_rate: float,
        clip: float | None,
        seed: int,
        coordinates: Sequence[int] | np.ndarray | None = None,
        included: Sequence[bool] | np.ndarray | None = None,
        inclusion: str = "run",
        projections: int = PROJECTIONS,
    ) -> None:
        if not isinstance(param_shapes, Mapping) or not param_shapes:
            raise InputError("param_shapes must be a non-empty mapping of parameter name -> shape")
        self.param_shapes = {canonical_name(str(n)): _shape(n, s) for n, s in param_shapes.items()}
        if len(self.param_shapes) != len(param_shapes):
            raise InputError("param_shapes names collide once Opacus' '_module.' prefix is removed")
        self.count = check_positive_int(count=count)
        self.sample_rate = check_in_interval(0.0, 1.0, hi_open=False, sample_rate=sample_rate)
        self.clip = None if clip is None else check_positive(clip=clip)
        self.seed = check_seed(limit=MAX_DERIVED_SEED, seed=seed)  # an audit run's canary seed is derived
        self.inclusion = check_choice(INCLUSIONS, inclusion=inclusion)
        if self.inclusion == "run" and included is None and self.count < MIN_HOLDOUT_CANARIES:
            # (the audit refused them after the whole training run)
            raise InputError(
                f"expected count >= {MIN_HOLDOUT_CANARIES}, got {self.count}: the one-run audit selects its guess "
                "counts on half the canaries and scores the other half (hundreds to refute a small ε: "
                "`dpaudit audit plan`)"
            )
        self.n_projections = int(projections)
        if self.n_projections < 0:
            raise InputError(f"expected projections >= 0, got {projections!r}")

        self.names_ = list(self.param_shapes)
        sizes = [math.prod(s) for s in self.param_shapes.values()]
        self.offsets_ = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        total = int(self.offsets_[-1])
        if self.count > total:
            raise InputError(f"{self.count} gradient canaries need as many parameters; the model has {total}")
        # The auditor's fair coins first, from their own stream (as dpaudit's trainer has always drawn them).
        coins = inclusion_bits(self.count, self.seed)
        if included is None:
            self.included_ = coins
        else:
            raw = np.asarray(host_array(included)).reshape(-1)
            if raw.dtype != bool and not np.all(np.isin(raw, (0, 1))):  # bool(2) or bool(0.3) would read "included"
                raise InputError("included must be boolean or 0/1, one inclusion bit per canary")
            self.included_ = raw.astype(bool)
            if self.included_.shape != (self.count,):
                raise InputError(f"included must have {self.count} entries, got {self.included_.size}")
        if coordinates is None:
            chosen = np.random.default_rng([self.seed, _COORDS]).choice(total, size=self.count, replace=False)
            self.coordinates_ = np.sort(chosen).astype(np.int64)
        else:
            c = np.asarray(coordinates, dtype=np.int64).reshape(-1)
            if c.shape != (self.count,) or len(np.unique(c)) != self.count or c.min() < 0 or c.max() >= total:
                raise InputError(f"coordinates must be {self.count} distinct flat indices in [0, {total})")
            self.coordinates_ = c
        which = np.searchsorted(self.offsets_, self.coordinates_, side="right") - 1
        # per group: (flat indices within the group, positions among the canaries)
        self._groups = [
            (self.coordinates_[which == g] - self.offsets_[g], np.flatnonzero(which == g)) for g in range(len(sizes))
        ]
        self._untouched = untouched_masks(sizes, self.coordinates_)
        self._projection_plan(sizes)
        self._cross_mask = cross_masks(sizes, self._untouched)
        self._cross = np.zeros((2, len(sizes), len(sizes)))
        self._draws = np.random.default_rng([self.seed, _DRAWS])
        self._coins = np.random.default_rng([self.seed, _COINS])
        self._pending: tuple[int, list[np.ndarray]] | None = None
        self._obs: list[np.ndarray] = []
        self._step_coins: list[np.ndarray] = []
        self._ss: list[np.ndarray] = []
        self._proj: list[np.ndarray] = []
        self.meta: dict[str, Any] = {}
        self._flush: Callable[[], None] | None = None  # an adapter's wait for steps still in flight (JAX)
        self._refused: str | None = None  # the last refusal raised inside an adapter's callback (JAX)

    @classmethod
    def resume(cls, directory: Path | str) -> GradientCanaries:
        """The canaries of an interrupted run, from what :meth:`save` wrote to ``directory``, ready for its next step.

        Everything a step draws comes from ``seed``'s streams in order, so those are advanced past the saved steps
        (each step draws ``count`` values from each stream it uses) and the observations, noise sums, projections
        and cross-group sums are read back: continued from here, the run records exactly what one uninterrupted run
        would have (same design, same draws at every step). The next ``inject`` must be for step T, the number of
        steps saved (else its one-line refusal): restore the model and optimizer from that same step. Save to a new
        directory, or to this one with ``force=True``. Opacus: ``GradientCanaries.resume(d).attach(optimizer)``.
        """
        obs = load_observations(directory)
        if obs.cross is None and len(obs.param_shapes) > 1:
            raise InputError(
                f"{directory}: saved before the cross-group noise summary existed, so it cannot be continued "
                "(a resumed run would save a summary of its later steps only); audit it as it is"
            )
        out = cls(
            obs.param_shapes, count=obs.count, sample_rate=obs.sample_rate, clip=obs.clip, seed=obs.seed,
            coordinates=obs.coordinates, included=obs.included, inclusion=obs.inclusion,
            projections=obs.projections.shape[1],
        )  # fmt: skip
        if out._proj_index.shape[0] != obs.projections.shape[1]:  # the same K gives the same plan
            raise CheckpointError(f"{directory}: {obs.projections.shape[1]} projections do not fit the design")
        T = obs.steps
        out._draws.random((T, out.count))  # the T steps' Poisson draws, consumed as T calls of random(count) do
        if obs.inclusion == "step":
            out._coins.random((T, out.count))
            out._step_coins = list(obs.coins)
        out._obs, out._ss, out._proj = list(obs.observations), list(obs.noise_ss), list(obs.projections)
        if obs.cross is not None:
            out._cross = np.array(obs.cross[:2], dtype=np.float64)  # cross[2] is cross[1]ᵀ (rebuilt by observations)
        out.meta = dict(obs.meta)
        return out

    # ---- the design ---------------------------------------------------------------------------------------

    def _projection_plan(self, sizes: list[int]) -> None:
        # K disjoint random supports over the untouched coordinates (all groups), Gaussian weights: the K
        # projections of independent per-coordinate noise are then independent of each other whatever the
        # per-group variances (disjoint supports), and i.i.d. across steps when the noise is.
        rng = np.random.default_rng([self.seed, _PROJ])
        free = np.concatenate([np.flatnonzero(k) + self.offsets_[g] for g, k in enumerate(self._untouched)])
        k = min(self.n_projections, len(free))
        per = min(PROJECTION_SUPPORT, len(free) // k) if k else 0
        chosen = rng.permutation(free)[: k * per].reshape(k, per) if k else np.zeros((0, 0), np.int64)
        self._proj_index = chosen
        self._proj_weight = rng.standard_normal(chosen.shape)

    @property
    def steps_(self) -> int:
        """Steps observed so far."""
        return len(self._obs)

    def _check_names(self, names: Any, what: str, hint: str = "", *, missing_hint: str | None = None) -> None:
        """Refuse (one line) names that are not exactly the canaries' parameters. ``missing_hint``: the likely cause
        when names are only missing (default: a tied weight, as torch names it)."""
        if set(names) != set(self.names_):
            missing = sorted(set(self.names_) - set(names))[:3]
            extra = sorted(set(names) - set(self.names_))[:3]
            if missing and not extra:  # a tied weight: state_dict() names it twice, named_parameters() once
                hint += TIED_MISSING if missing_hint is None else missing_hint
            elif extra and not missing:
                # A torch.func/JAX loop differentiates every parameter it is given, frozen ones included (measured:
                # was "unexpected ['0.bias', '0.weight']: canaries designed for another model?" and nothing more).
                hint += (
                    "; gradients of parameters the canaries were not built for, frozen ones? (torch.func.grad and "
                    "jax.grad differentiate every parameter they are given, requires_grad or not): pass only the "
                    "gradients of the parameters in param_shapes"
                )
            raise InputError(
                f"{what} do not match the canaries' parameters (missing {missing}, unexpected {extra}): "
                f"canaries designed for another model?{hint}"
            )

    def _as_list(self, grads: Any, what: str) -> tuple[list[Any], list[str] | None]:
        """The gradients in ``param_shapes`` order (from a name -> array mapping or a sequence), checked."""
        if isinstance(grads, Mapping):
            named = {canonical_name(str(n)): v for n, v in grads.items()}
            jax_tree = any(_framework(v) == "jax" for v in named.values())
            self._check_names(named, f"{what}: the gradients' names", missing_hint=JAX_MISSING if jax_tree else None)
            keys = list(grads)
            order = {canonical_name(str(n)): n for n in keys}
            arrays, names = [named[n] for n in self.names_], [order[n] for n in self.names_]
        else:
            arrays, names = list(grads), None
            if len(arrays) != len(self.names_):
                raise InputError(
                    f"{what}: {len(arrays)} gradient arrays for {len(self.names_)} parameters: "
                    "canaries designed for another model?"
                )
        for n, a in zip(self.names_, arrays, strict=True):
            if a is None:  # (was "has dtype object, not float32 or float64")
                raise InputError(
                    f"{what}: parameter {n!r} has no gradient (None: frozen, or unused in the forward pass): leave "
                    "frozen parameters out of param_shapes, and pass an unused one's clipped sum as zeros"
                )
            _check_not_traced(what, a)
            check_full_precision_grads(what, n, a)
            shape = tuple(int(d) for d in np.shape(a))
            if math.prod(shape) != math.prod(self.param_shapes[n]):
                raise InputError(
                    f"{what}: parameter {n!r} has shape {shape}, the canaries were designed for "
                    f"{self.param_shapes[n]}: canaries designed for another model?"
                )
        return arrays, names

    @staticmethod
    def _as_input_type(grads: Any, arrays: list[Any], names: list[str] | None) -> Any:
        if names is not None:
            # The caller's order, and its dict type (an OrderedDict, a defaultdict: copy.copy keeps the class and its
            # default factory, where dict() returned a plain dict); another Mapping becomes a dict.
            out = copy.copy(grads) if isinstance(grads, dict) else dict(grads)
            out.update(zip(names, arrays, strict=True))
            return out
        return tuple(arrays) if isinstance(grads, tuple) else list(arrays)

    def _check_step(self, step: int, expected: int, what: str) -> int:
        step = python_scalar(step)  # a 0-d torch/NumPy/JAX step counter is its integer
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or int(step) != expected:
            raise InputError(
                f"{what}(step={step!r}): expected step {expected}, an integer (steps are 0, 1, 2, ... in order)"
            )
        return int(step)

    # ---- the hooks ----------------------------------------------------------------------------------------

    def inject(self, step: int, summed_clipped_grads: Any) -> Any:
        """The clipped sum of step ``step`` plus the canaries drawn at this step (C at each drawn canary's
        coordinate), in the caller's format: a name -> array mapping or a sequence in ``param_shapes``
        order; torch tensors, NumPy or JAX arrays (same dtype and device back). Call it on the sum of
        the clipped per-example gradients *before* the noise, then add the noise to what it returns."""
        if self.clip is None:
            raise InputError("the canaries' clip norm is not set: give clip=C (or attach them to an optimizer)")
        if self._pending is not None:
            raise InputError(f"inject(step={step}) again before observe(step={self._pending[0]})")
        step = self._check_step(step, self.steps_, "inject")
        arrays, names = self._as_list(summed_clipped_grads, "inject")
        drawn = self._draws.random(self.count) < self.sample_rate  # Poisson sampling at rate q, as a record
        if self.inclusion == "run":
            offered = self.included_
        else:
            offered = self._coins.random(self.count) < 0.5
            self._step_coins.append(offered)
        add = (drawn & offered).astype(np.float64) * self.clip
        out = [_add_at(a, flat, add[members]) for a, (flat, members) in zip(arrays, self._groups, strict=True)]
        self._pending = (step, [to_numpy(a).reshape(-1) for a in out])
        return self._as_input_type(summed_clipped_grads, out, names)

    def observe(self, step: int, noisy_grads: Any) -> None:
        """Record step ``step``'s noisy sum (clipped sum + canaries + noise, before any division by the
        batch size) in the same format as :meth:`inject`'s input."""
        if self._pending is None:
            done = python_scalar(step)
            if isinstance(done, int | np.integer) and not isinstance(done, bool) and 0 <= done < self.steps_:
                raise InputError(f"observe(step={step}) again: step {step} was already observed (inject, then observe)")
            raise InputError(f"observe(step={step}) before inject(step={step}): inject the canaries first")
        step = self._check_step(step, self._pending[0], "observe")
        arrays, _ = self._as_list(noisy_grads, "observe")
        noisy = [to_numpy(a).reshape(-1) for a in arrays]
        o = np.empty(self.count)
        ss = np.empty(len(noisy))
        for g, (v, pre, (flat, members)) in enumerate(zip(noisy, self._pending[1], self._groups, strict=True)):
            o[members] = v[flat] / self.clip
            z = (v - pre)[self._untouched[g]]  # the noise actually added, where no canary sits
            ss[g] = float(z @ z)
        if len(self.names_) > 1:
            mask = self._cross_mask
            zp = np.zeros(mask.shape)
            for g, (v, pre) in enumerate(zip(noisy, self._pending[1], strict=True)):
                m = min(len(v), mask.shape[1])
                zp[g, :m] = (v[:m] - pre[:m]) * mask[g, :m]
            self._cross[0] += zp @ zp.T  # Σ_i z_a,i z_b,i over positions untouched in both
            self._cross[1] += (zp * zp) @ mask.T  # Σ_i z_a,i² over the positions untouched in a and b
        if len(self._proj_index):
            z_all = np.concatenate(noisy) - np.concatenate(self._pending[1])
            self._proj.append((z_all[self._proj_index] * self._proj_weight).sum(axis=1))
        self._obs.append(o)
        self._ss.append(ss)
        self._pending = None

    # ---- results ------------------------------------------------------------------------------------------

    def observations(self) -> CanaryObservations:
        """The design and everything observed so far, as plain arrays."""
        if self._flush is not None:
            self._flush()
        if self._pending is not None:
            raise InputError(f"step {self._pending[0]} was injected but never observed")
        T, G = self.steps_, len(self.names_)
        return CanaryObservations(
            param_shapes=dict(self.param_shapes),
            count=self.count,
            sample_rate=self.sample_rate,
            clip=float(self.clip) if self.clip is not None else math.nan,
            seed=self.seed,
            inclusion=self.inclusion,
            coordinates=self.coordinates_.copy(),
            included=self.included_.copy(),
            observations=np.array(self._obs, dtype=np.float64).reshape(T, self.count),
            coins=np.array(self._step_coins, dtype=bool).reshape(T, self.count) if self.inclusion == "step" else None,
            noise_ss=np.array(self._ss, dtype=np.float64).reshape(T, G),
            noise_count=np.array([int(k.sum()) for k in self._untouched], dtype=np.int64),
            projections=np.array(self._proj, dtype=np.float64).reshape(T, len(self._proj_index)),
            meta=dict(self.meta),
            cross=np.stack([self._cross[0], self._cross[1], self._cross[1].T]),
        )

    def save(self, directory: Path | str, *, force: bool = False) -> Path:
        """Write the design and the observations to ``directory`` (``canaries.json`` + ``canaries.safetensors``;
        no pickle), atomically; an existing directory is refused unless ``force``."""
        return save_observations(self.observations(), directory, force=force)

    def attach(self, optimizer: Any, *, module: Any = None) -> Any:
        """Carry the canaries through an Opacus ``DPOptimizer`` (see :mod:`dpaudit.hooks.opacus_adapter`)."""
        from dpaudit.hooks.opacus_adapter import attach

        return attach(self, optimizer, module=module)

    def optax_inject(self) -> Any:
        """An ``optax.GradientTransformation`` adding the canaries, for ``optax.chain`` right before the noise
        (see :mod:`dpaudit.hooks.jax_adapter`)."""
        from dpaudit.hooks.jax_adapter import optax_inject

        return optax_inject(self)

    def optax_observe(self) -> Any:
        """An ``optax.GradientTransformation`` recording the noisy sum, for ``optax.chain`` right after the
        noise (see :mod:`dpaudit.hooks.jax_adapter`)."""
        from dpaudit.hooks.jax_adapter import optax_observe

        return optax_observe(self)


def save_observations(obs: CanaryObservations, directory: Path | str, *, force: bool = False) -> Path:
    """Write ``obs`` to ``directory`` atomically (refused if it exists, unless ``force``)."""
    from safetensors.numpy import save_file

    from dpaudit.fileio import write_atomic_dir

    if obs.steps == 0:
        raise InputError("no step was observed: nothing to save")
    design = {
        "format": FORMAT,
        "param_shapes": {n: list(s) for n, s in obs.param_shapes.items()},
        "count": obs.count,
        "sample_rate": obs.sample_rate,
        "clip": obs.clip,
        "seed": obs.seed,
        "inclusion": obs.inclusion,
        "steps": obs.steps,
        "meta": obs.meta,
    }
    arrays = {
        "coordinates": obs.coordinates.astype(np.int64),
        "included": obs.included.astype(np.int8),
        "observations": obs.observations,
        "noise_ss": obs.noise_ss,
        "noise_count": obs.noise_count,
        "projections": obs.projections,
    }
    if obs.coins is not None:
        arrays["coins"] = obs.coins.astype(np.int8)
    if obs.cross is not None:
        arrays["cross"] = obs.cross.astype(np.float64)

    def write(tmp: Path) -> None:
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp / ARRAYS_FILE))
        (tmp / DESIGN_FILE).write_text(json.dumps(design, indent=2) + "\n")

    return write_atomic_dir(Path(directory), write, force=force)


# The design's fields and their JSON types (canaries.json from a stranger is checked before use).
_DESIGN_TYPES = {
    "steps": int, "count": int, "sample_rate": float, "clip": float, "seed": int, "inclusion": str,
    "param_shapes": dict,
}  # fmt: skip


def _check_design(design: dict[str, Any], source: Path) -> None:
    """One CheckpointError line for a design field of the wrong type or out of range (a list for the parameter
    shapes, a bool for the sample rate, a seed of 1.5, an unknown inclusion: were internal errors or read as
    another design)."""
    from dpaudit.validation import check_json_type

    for key, kind in _DESIGN_TYPES.items():
        if key not in design:
            raise CheckpointError(f"{source}: missing key {key}")
        check_json_type(design[key], kind, f"{source}: {key}", error=CheckpointError)
    for name, shape in design["param_shapes"].items():
        check_json_type(shape, list, f"{source}: param_shapes.{name}", error=CheckpointError)
        for n in shape:
            check_json_type(n, int, f"{source}: param_shapes.{name}", error=CheckpointError)
            if not 0 <= n <= 2**31 - 1:
                raise CheckpointError(f"{source}: param_shapes.{name}: expected sizes in [0, 2**31 - 1], got {n}")
    check_json_type(design.get("meta"), (dict, type(None)), f"{source}: meta", error=CheckpointError)
    try:
        check_positive_int(count=design["count"])
        check_positive_int(steps=design["steps"])
        check_in_interval(0, 1, hi_open=False, sample_rate=design["sample_rate"])
        check_positive(finite=True, clip=design["clip"])
        check_seed(seed=design["seed"], limit=MAX_DERIVED_SEED)
        check_choice(INCLUSIONS, inclusion=design["inclusion"])
    except InputError as e:
        raise CheckpointError(f"{source}: {e}") from None


def load_observations(directory: Path | str) -> CanaryObservations:
    """Read what :func:`save_observations` wrote, checked for consistency (a :class:`CheckpointError` otherwise)."""
    from safetensors import SafetensorError

    from dpaudit.fileio import check_input_file, input_problem, load_safetensors

    d = Path(directory)
    if not (d.is_dir() or d.is_file()):  # missing, a pipe, a device, a broken link: said as such
        raise InputError(f"{d}: {input_problem(d, directory=True) or 'not a directory'}")
    for f in (d / DESIGN_FILE, d / ARRAYS_FILE):
        if f.exists() or f.is_symlink():
            check_input_file(f, error=CheckpointError)  # a pipe or a device in place of a file: never read
    if not (d / DESIGN_FILE).is_file() or not (d / ARRAYS_FILE).is_file():
        from dpaudit.checkpoint import CHECKPOINT_FILE

        line = f"{d}: not a gradient-canary directory (expected {DESIGN_FILE} and {ARRAYS_FILE})"
        if (d / CHECKPOINT_FILE).is_file():  # a run: its canaries (--canaries, --whitebox-canaries) are audited there
            line += f"; it is a dpaudit run: audit it with `dpaudit audit checkpoint {d}`"
        raise InputError(line)
    design = read_json(d / DESIGN_FILE, error=CheckpointError)  # bounded parsing of an untrusted file
    try:
        a = load_safetensors(d / ARRAYS_FILE, "numpy")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{d}: unreadable gradient-canary files ({e})") from None
    if isinstance(design, dict) and design.get("format") == "dpaudit-canaries/1":  # dpaudit.canaries.CANARY_DIR_FORMAT
        raise InputError(
            f"{d}: record canaries from `dpaudit canaries make`, not gradient canaries: register them with "
            "`dpaudit import --canaries` and audit with `dpaudit audit checkpoint`"
        )
    if not isinstance(design, dict) or design.get("format") != FORMAT:
        found = design.get("format") if isinstance(design, dict) else None
        raise CheckpointError(f"{d}: unknown gradient-canary format {found!r} (expected {FORMAT})")
    _check_design(design, d / DESIGN_FILE)
    from dpaudit.checkpoint import check_unchanged

    for name in (DESIGN_FILE, ARRAYS_FILE):  # an edited clip or sample rate changes what the audit tests
        check_unchanged(
            d, name, "the audit would test what was edited, not what was observed", written="they were saved"
        )
    try:
        T, M = int(design["steps"]), int(design["count"])
        shapes = {n: tuple(int(x) for x in s) for n, s in design["param_shapes"].items()}
        obs = CanaryObservations(
            param_shapes=shapes, count=M, sample_rate=float(design["sample_rate"]), clip=float(design["clip"]),
            seed=int(design["seed"]), inclusion=str(design["inclusion"]), coordinates=a["coordinates"],
            included=a["included"].astype(bool), observations=a["observations"],
            coins=a["coins"].astype(bool) if "coins" in a else None, noise_ss=a["noise_ss"],
            noise_count=a["noise_count"], projections=a["projections"], meta=dict(design.get("meta") or {}),
            cross=a.get("cross"),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise CheckpointError(f"{d}: malformed gradient-canary design ({e})") from None
    G = len(shapes)
    expected = {
        "coordinates": (M,), "included": (M,), "observations": (T, M), "noise_ss": (T, G), "noise_count": (G,),
    }  # fmt: skip
    for k, shape in expected.items():
        if tuple(a[k].shape) != shape:
            raise CheckpointError(f"{d}: {k} has shape {tuple(a[k].shape)}, expected {shape}")
    # The design must be one model's: the coordinates inside its parameters, and each group's noise count
    # what those coordinates leave (files from different runs or models do not fit together).
    sizes = np.array([math.prod(s) for s in shapes.values()], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    c = obs.coordinates.astype(np.int64)
    if len(np.unique(c)) != M or (M and (c.min() < 0 or c.max() >= offsets[-1])):
        raise CheckpointError(
            f"{d}: the canaries' coordinates do not fit the {int(offsets[-1])} parameters of the model in "
            f"{DESIGN_FILE}: files from another model?"
        )
    touched = np.bincount(np.searchsorted(offsets, c, side="right") - 1, minlength=G)
    if not np.array_equal(obs.noise_count, sizes - touched):
        raise CheckpointError(
            f"{d}: the noise counts {obs.noise_count.tolist()} do not fit the parameter shapes in {DESIGN_FILE}: "
            "files from another model?"
        )
    if obs.projections.ndim != 2 or obs.projections.shape[0] != T:
        raise CheckpointError(f"{d}: projections have shape {obs.projections.shape}, expected ({T}, K)")
    finite = np.isfinite(obs.observations).all(axis=1) & np.isfinite(obs.noise_ss).all(axis=1)
    finite &= np.isfinite(obs.projections).all(axis=1)
    if not finite.all():  # (was "scores must be finite", or the cross check's "expected ... finite values")
        raise InputError(
            f"{d}: the noisy sums observed at {int((~finite).sum())} of {T} steps hold NaN or inf (the first at step "
            f"{int(np.argmin(finite))}): training diverged or a gradient overflowed, so there is nothing to audit at "
            "those steps; rerun with finite gradients"
        )
    if obs.cross is not None and (obs.cross.shape != (3, G, G) or not np.all(np.isfinite(obs.cross))):
        raise CheckpointError(f"{d}: cross has shape {obs.cross.shape}, expected (3, {G}, {G}) finite values")
    if (obs.inclusion == "step") != (obs.coins is not None) or (obs.coins is not None and obs.coins.shape != (T, M)):
        raise CheckpointError(f"{d}: per-step coins missing or malformed")
    return obs
