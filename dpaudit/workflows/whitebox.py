"""Per-step white-box audit of DP-SGD in one training run (Nasr et al. 2023, arXiv:2302.07956).

One run of the recipe with a Dirac gradient canary offered at each step independently with
probability 1/2 (:class:`dpaudit.training.dpsgd.GradientCanary` with ``per_step=True``); the per-step
observations and coins go to :func:`dpaudit.audit.whitebox.audit_steps`: (a) a formal per-step bound
(one-run f-DP test on the T coins against one step's claimed curve) and (b) the composed ε estimate
under the Gaussian per-step assumption. The returned :class:`AuditRecord` carries (a) as its result
(formal, verdict on the per-step claim) and (b) in ``result.details``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from dpaudit import numfmt
from dpaudit.audit.whitebox import StepAudit, audit_steps
from dpaudit.errors import InputError
from dpaudit.workflows.result import AuditRecord


@dataclass(frozen=True)
class WhiteboxStepsAudit:
    """The record (per-step formal result, composed estimate in its details) and the full statistics."""

    record: AuditRecord
    steps: StepAudit
    claim: dict
    observations: np.ndarray
    inserted: np.ndarray


def audit_whitebox_steps(
    dataset,
    spec,
    config,
    perf=None,
    *,
    train_size: int | None = None,
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
    split_seed: int = 0,
    seed: int = 0,
) -> WhiteboxStepsAudit:
    """Train the DP recipe ``config`` once with a per-step Dirac gradient canary and audit every step.

    The claim (ε, δ, σ, q, T) is the recipe's own, computed for the training set; ``claimed_epsilon``
    overrides the ε the composed estimate is compared with. Poisson sampling only (the per-step
    mechanism is then the Poisson-sampled Gaussian whose curve the formal part tests).
    """

    from dpaudit.data import make_splits
    from dpaudit.training.algorithms import fit_with_gradient_canary
    from dpaudit.training.config import PerfConfig
    from dpaudit.training.dpsgd import GradientCanary
    from dpaudit.training.run import check_spec_fits
    from dpaudit.validation import check_positive_int, check_seed
    from dpaudit.workflows.training import _prepare_recipe

    if config is None or config.dp is None:
        raise InputError("the per-step white-box audit needs a private trainer (--algo dpsgd or dpadam)")
    if config.dp.sampling != "poisson":
        raise InputError("the per-step white-box audit needs Poisson sampling (--sampling poisson)")
    check_seed(seed=seed)
    check_spec_fits(spec, dataset)
    perf = perf or PerfConfig(device="cpu")
    splits = make_splits(len(dataset), split_seed)
    members = splits.members
    if train_size is not None:
        check_positive_int(train_size=train_size)
        if train_size > len(members):
            raise InputError(f"--train-size {train_size} exceeds the members split ({len(members)} records)")
        members = np.sort(np.random.default_rng([seed, 7]).choice(members, size=train_size, replace=False))
    pre_idx = splits.aux if len(splits.aux) else members
    config, claim = _prepare_recipe(config, members, members)
    config = dataclasses.replace(config, seed=seed * 1_000_003 + 17)
    canary = GradientCanary(included=True, seed=config.seed + 5, per_step=True)
    fit_with_gradient_canary(dataset, members, spec, config, perf, canary, preprocessing_idx=pre_idx)
    obs = np.asarray(canary.observations, dtype=np.float64)
    ins = np.asarray(canary.inserted, dtype=bool)
    claimed = float(claim["epsilon"]) if claimed_epsilon is None else float(claimed_epsilon)
    stats = audit_steps(
        obs, ins, sample_rate=float(claim["sample_rate"]), noise_multiplier=float(claim["noise_multiplier"]),
        delta=float(claim["delta"]), confidence=confidence, claimed_epsilon=claimed, steps=len(obs),
        seed=seed,
    )  # fmt: skip
    what = (
        f"one training run, {len(obs)} steps; Dirac gradient canary offered at each step with probability 1/2 "
        f"({int(ins.sum())} offered)"
    )
    record = steps_record("white-box-steps", what, stats)
    return WhiteboxStepsAudit(record, stats, claim, obs, ins)


def steps_record(attack: str, what: str, stats: StepAudit) -> AuditRecord:
    """The :class:`AuditRecord` of a per-step audit: (a) the formal per-step result, (b) the composed
    estimate in its details (``what`` says what was observed)."""
    details = {
        **stats.per_step.details,
        "per_step_claimed_epsilon": stats.per_step_claimed_epsilon,
        "composed_epsilon_estimate": stats.composed_epsilon_estimate,
        "composed_epsilon_point": stats.composed_epsilon_point,
        "composed_label": stats.label,
        "composed_claimed_epsilon": stats.claimed_epsilon,
        "composed_verdict": stats.composed_verdict,
        "shift_per_clip": stats.ratio.shift,
        "noise_sd_per_clip": stats.ratio.sigma,
    }
    result = dataclasses.replace(stats.per_step, details=details, notes=(*stats.per_step.notes, *stats.notes))
    est, claim = (  # dpaudit.numfmt: the estimate's ε ≥ rounded down, the claim up, in the order computed
        (numfmt.lower(stats.composed_epsilon_estimate), numfmt.upper(stats.claimed_epsilon))
        if stats.claimed_epsilon is None
        else numfmt.ordered(stats.composed_epsilon_estimate, stats.claimed_epsilon)
    )
    description = (
        f"{what}; per-step one-run f-DP test (formal, vs the one-step claim) and composed estimate "
        f"{est} vs claimed {claim} ({stats.label})"
    )
    return AuditRecord(attack, description, result, family="white-box")
