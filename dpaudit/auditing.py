"""Audit workflows on models: ε lower bounds from a checkpoint (one run) or from many training runs.

These tie the trainer and the attacks to the score-based bounds of :mod:`dpaudit.audit`:

- :func:`audit_checkpoint`: a checkpoint trained with canaries gets a one-run audit (Steinke,
  Nasr & Jagielski 2023, arXiv:2305.08846) — a formal bound, since each canary was included
  independently with probability 1/2. Without canaries, a membership attack on members vs holdout
  gives an *estimate* only: the members were not drawn independently per trial of one fixed
  neighbouring pair, which the hypothesis-testing bound assumes (Jagielski et al. 2020, §3).
- :func:`audit_training`: the multi-run audit (Jagielski et al. 2020; Nasr et al. 2021, 2023):
  R models trained with the canary and R without, one score per model, a formal bound.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.audit import AuditResult, audit_scores
from dpaudit.errors import InputError
from dpaudit.progress import NULL_PROGRESS, Progress

NO_CANARIES_NOTE = (
    "members are the model's own training split, not canaries inserted at random into independent runs: "
    "the records are not independent trials of the mechanism, so this bound estimates the leakage and is "
    "not a formal DP lower bound (a formal audit needs canaries: dpaudit train --canaries M)"
)


def as_estimate(audit: dict[str, Any]) -> dict[str, Any]:
    """An audit of membership scores on an ordinary model: formal=False, with the reason in its notes."""
    notes = list(audit.get("notes") or [])
    if NO_CANARIES_NOTE not in notes:
        notes.append(NO_CANARIES_NOTE)
    return {**audit, "formal": False, "notes": notes}


def _claim(run, claimed_epsilon: float | None, delta: float | None) -> tuple[float | None, float]:
    privacy = run.privacy or {}
    claimed = claimed_epsilon if claimed_epsilon is not None else privacy.get("epsilon")
    if delta is None:
        delta = privacy.get("delta", 1e-5)
    return claimed, float(delta)


def canary_scores(run) -> tuple[np.ndarray, np.ndarray]:
    """Black-box scores of the run's canaries (logit-scaled confidence of the canary label, higher =
    more likely included; Carlini et al. 2022, arXiv:2112.03570, Eq. 4) and their inclusion."""
    from attacks.threshold import logit_margin

    canaries = run.canaries()
    if canaries is None:
        raise InputError(f"{run.path}: the run has no canaries (train with --canaries M)")
    return logit_margin(run.logits(canaries.X), canaries.y), canaries.included


def audit_checkpoint(
    path: Path | str,
    *,
    method: str | None = None,
    attack: str = "loss",
    delta: float | None = None,
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
    seed: int = 0,
    reference_models: int = 8,
    workers: int = 1,
    progress: Progress = NULL_PROGRESS,
) -> dict[str, Any]:
    """Audit one checkpoint; returns ``{"checkpoint", "source", "attack", "audit": AuditResult dict}``.

    With canaries: one-run audit on the canaries (method "one-run" by default; formal). Without:
    ``attack`` (loss by default, or lira/shadow/...) on members vs holdout, bounded with ``method``
    (clopper-pearson by default) and labelled an estimate.
    """
    from dpaudit.checkpoint import load_run

    run = load_run(path)
    claimed, delta = _claim(run, claimed_epsilon, delta)
    if run.meta.get("canaries"):
        scores, included = canary_scores(run)
        result = audit_scores(
            scores,
            included,
            method=method or "one-run",
            delta=delta,
            confidence=confidence,
            claimed_epsilon=claimed,
            seed=seed,
        )
        source = f"{len(scores)} {run.meta['canaries']['kind']} canaries (black-box, logit-scaled confidence)"
        return {"checkpoint": str(path), "source": source, "attack": "canary", "audit": result.to_dict()}
    if method == "one-run":
        raise InputError(f"{path}: the one-run method needs a run trained with canaries (dpaudit train --canaries M)")
    from attacks.mia import run_mia

    (res,) = run_mia(run, [attack], reference_models=reference_models, workers=workers, seed=seed, progress=progress)
    result = audit_scores(
        res.scores,
        res.member,
        method=method or "clopper-pearson",
        delta=delta,
        confidence=confidence,
        claimed_epsilon=claimed,
        seed=seed,
    )
    source = f"{attack} attack on {int(res.member.sum())} members vs {int((~res.member).sum())} holdout records"
    return {
        "checkpoint": str(path),
        "source": source,
        "attack": attack,
        "audit": as_estimate(result.to_dict()),
        "attack_metrics": res.to_dict(include_roc=False),
    }


def summarize(result: dict[str, Any]) -> str:
    """Human-readable lines for an audit workflow result."""
    a = AuditResult(**{**result["audit"], "notes": tuple(result["audit"]["notes"])})
    return f"source: {result['source']}\n" + a.summary()


__all__ = ["audit_checkpoint", "canary_scores", "summarize"]


def _train_one(args: tuple) -> float:
    """One run of the multi-run audit (module level so joblib can ship it to workers)."""
    import torch

    from attacks.threshold import logit_margin
    from dpaudit.training.run import fit_model

    dataset, train_idx, spec, config, perf, canary_x, canary_y, whitebox = args
    torch.set_num_threads(1)
    if whitebox is not None:
        from dpaudit.training.dpsgd import GradientCanary, fit_with_gradient_canary

        return fit_with_gradient_canary(dataset, train_idx, spec, config, perf, GradientCanary(**whitebox))
    fitted = fit_model(dataset, train_idx, spec, config, perf)
    return float(logit_margin(fitted.logits(canary_x), canary_y)[0])


def audit_training(
    dataset,
    spec,
    config,
    perf=None,
    *,
    runs: int = 100,
    train_size: int | None = None,
    threat_model: str = "black-box",
    canary_kind: str = "clipbkd",
    method: str = "clopper-pearson",
    delta: float | None = None,
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
    split_seed: int = 0,
    seed: int = 0,
    workers: int = 1,
    progress: Progress = NULL_PROGRESS,
) -> dict[str, Any]:
    """Multi-run audit: ``runs`` models trained on D ∪ {canary} and ``runs`` on D, one score each.

    Black-box: the canary is one input record (``canary_kind``, e.g. ClipBKD) and the score is its
    logit-scaled confidence under the final model. White-box (DP trainers only): a Dirac gradient
    canary C·e_j (Nasr et al. 2021, arXiv:2101.04535, §4; Nasr et al. 2023, arXiv:2302.07956) on a
    coordinate j where the data's gradients vanish, Poisson-sampled like a record, observed in every
    noisy update; the score is the per-step likelihood ratio (see ``fit_with_gradient_canary``).
    Runs use distinct seeds (initialisation, batches, noise), so they are independent trials of the
    mechanism on the neighbouring datasets D and D ∪ {canary}: the bound is formal (clopper-pearson).
    """
    from joblib import Parallel, delayed

    from dpaudit.audit.canaries import make_canaries, with_canaries
    from dpaudit.data import make_splits
    from dpaudit.training.config import PerfConfig
    from dpaudit.validation import check_choice, check_positive_int

    runs = check_positive_int(runs=runs)
    check_choice(("black-box", "white-box"), threat_model=threat_model)
    perf = perf or PerfConfig(device="cpu")
    splits = make_splits(len(dataset), split_seed)
    members = splits.members
    if train_size is not None:
        check_positive_int(train_size=train_size)
        if train_size > len(members):
            raise InputError(f"--train-size {train_size} exceeds the members split ({len(members)} records)")
        members = np.sort(np.random.default_rng([seed, 7]).choice(members, size=train_size, replace=False))
    base = dataclasses.replace(splits, members=members)
    if threat_model == "white-box":
        if config.dp is None:
            raise InputError("the white-box gradient canary needs a private trainer (--algo dpsgd or dpadam)")
        data, idx_in, idx_out = dataset, members, members
        canary_x = canary_y = None
        source = "Dirac gradient canary (white-box: every noisy update observed)"
    else:
        canary = make_canaries(dataset, base, m=1, kind=canary_kind, seed=seed)
        canary = dataclasses.replace(canary, included=np.array([True]))
        data, idx_in, _ = with_canaries(dataset, base, canary)
        idx_out = members
        canary_x, canary_y = canary.X, canary.y
        source = f"one {canary_kind} canary (black-box, logit-scaled confidence of the final model)"
    if config.dp is not None and config.dp.target_epsilon is not None:
        # Calibrate σ once, for the larger training set, and run every model with that fixed σ: the
        # mechanism under audit is one algorithm with one noise multiplier on both neighbours.
        from dpaudit.training.dpsgd import claim_for

        sigma = claim_for(config, max(len(idx_in), len(idx_out)))["noise_multiplier"]
        config = dataclasses.replace(
            config, dp=dataclasses.replace(config.dp, noise_multiplier=sigma, target_epsilon=None)
        )
    jobs = []
    for r in range(2 * runs):
        included = r < runs
        cfg = dataclasses.replace(config, seed=seed * 1_000_003 + 3 * r + 11)
        wb = {"included": included, "seed": cfg.seed + 5} if threat_model == "white-box" else None
        jobs.append((data, idx_in if included else idx_out, spec, cfg, perf, canary_x, canary_y, wb))
    with progress.task(f"audit: train {2 * runs} models", 2 * runs) as advance:
        scores = []
        for s in Parallel(n_jobs=workers, return_as="generator")(delayed(_train_one)(j) for j in jobs):
            scores.append(s)
            advance(1)
    scores = np.asarray(scores, dtype=np.float64)
    member = np.arange(2 * runs) < runs
    claim = _recipe_claim(data, idx_in, idx_out, spec, config, perf)
    claimed = claimed_epsilon if claimed_epsilon is not None else (claim or {}).get("epsilon")
    if delta is None:
        delta = (claim or {}).get("delta", 1e-5)
    result = audit_scores(
        scores, member, method=method, delta=delta, confidence=confidence, claimed_epsilon=claimed, seed=seed
    )
    return {
        "source": f"{2 * runs} training runs ({runs} with, {runs} without) — {source}",
        "attack": threat_model,
        "runs": runs,
        "claim": claim,
        "audit": result.to_dict(),
    }


def _recipe_claim(data, idx_in, idx_out, spec, config, perf) -> dict[str, Any] | None:
    """The privacy claim of the recipe (the larger ε of the two dataset sizes), without training."""
    if config.dp is None:
        return None
    from dpaudit.training.dpsgd import claim_for

    claims = [claim_for(config, len(idx)) for idx in (idx_in, idx_out)]
    return max(claims, key=lambda c: c["epsilon"])
