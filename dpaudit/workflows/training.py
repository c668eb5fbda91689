"""The multi-run audit: train the claimed pipeline R times with a canary and R times without.

Jagielski, Ullman & Oprea 2020 (arXiv:2006.07709, Alg. 1); Nasr et al. 2021 (arXiv:2101.04535);
Nasr et al. 2023 (arXiv:2302.07956). Each run is an independent trial of the mechanism (fresh
initialisation, batches and noise) on one of two neighbouring datasets, and one score per run is
audited with Clopper–Pearson: a formal lower bound on the ε of *the mechanism that was run*. For
that to be the mechanism the claim covers:

- the two datasets differ in exactly the canary: preprocessing (standardisation) is fitted on the
  public auxiliary split, or — when there is none — on the records common to both datasets, never
  on a dataset that contains the canary;
- both sides run the same number of steps with the same σ (calibrated once);
- the neighbouring relation matches the claim's: add/remove (D ∪ {canary} vs D) for Poisson
  sampling; for shuffled batches, whose claim is for replace-one neighbours, the canary is swapped
  for an ordinary record (D ∪ {canary} vs D ∪ {z}), so both datasets have the same size.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dpaudit.audit import audit_scores
from dpaudit.errors import InputError
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.workflows.result import AuditRecord, TrainingAudit


def _train_one(args: tuple) -> float:
    """One run of the multi-run audit (module level so joblib can ship it to workers)."""
    import torch

    from attacks.threshold import logit_margin
    from dpaudit.training.run import fit_model

    dataset, train_idx, pre_idx, spec, config, perf, canary_x, canary_y, whitebox = args
    torch.set_num_threads(1)
    if whitebox is not None:
        from dpaudit.training.dpsgd import GradientCanary, fit_with_gradient_canary

        return fit_with_gradient_canary(
            dataset, train_idx, spec, config, perf, GradientCanary(**whitebox), preprocessing_idx=pre_idx
        )
    fitted = fit_model(dataset, train_idx, spec, config, perf, preprocessing_idx=pre_idx)
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
) -> TrainingAudit:
    """Multi-run audit of the recipe ``config``: ``runs`` models with the canary, ``runs`` without.

    Black-box: the canary is one input record (``canary_kind``, e.g. ClipBKD) and the score is its
    logit-scaled confidence under the final model (higher = member; the direction is fixed in
    advance, so the test is one-sided). White-box (DP trainers with Poisson sampling only): a Dirac
    gradient canary C·e_j (Nasr et al. 2021, §4; Nasr et al. 2023) observed in every noisy update;
    the score is the per-step likelihood ratio (see ``dpaudit.training.dpsgd.GradientCanary``).

    Formal guarantee (method "clopper-pearson"): with probability ≥ ``confidence`` the bound is below
    the true ε of the trained pipeline on this neighbouring pair (see the module docstring for why
    that pipeline is the claimed one). Method "gdp" is an estimate.
    """
    from joblib import Parallel, delayed

    from dpaudit.canaries import make_canaries, with_canaries
    from dpaudit.data import make_splits
    from dpaudit.training.config import PerfConfig
    from dpaudit.validation import check_choice, check_positive_int

    runs = check_positive_int(runs=runs)
    check_choice(("black-box", "white-box"), threat_model=threat_model)
    check_choice(("clopper-pearson", "gdp"), method=method)
    perf = perf or PerfConfig(device="cpu")
    splits = make_splits(len(dataset), split_seed)
    members = splits.members
    rng = np.random.default_rng([seed, 7])
    if train_size is not None:
        check_positive_int(train_size=train_size)
        if train_size > len(members):
            raise InputError(f"--train-size {train_size} exceeds the members split ({len(members)} records)")
        members = np.sort(rng.choice(members, size=train_size, replace=False))
    base = dataclasses.replace(splits, members=members)
    # Preprocessing from public data, or from the records both neighbours share: never from the canary.
    pre_idx = splits.aux if len(splits.aux) else members
    relation = "add_remove" if config.dp is None or config.dp.sampling == "poisson" else "replace_one"
    if threat_model == "white-box":
        if config.dp is None:
            raise InputError("the white-box gradient canary needs a private trainer (--algo dpsgd or dpadam)")
        if relation != "add_remove":
            raise InputError("the white-box gradient canary needs Poisson sampling (--sampling poisson)")
        data, idx_in, idx_out = dataset, members, members
        canary_x = canary_y = None
        source = "Dirac gradient canary (white-box: every noisy update observed)"
    else:
        canary = make_canaries(dataset, base, m=1, kind=canary_kind, seed=seed)
        canary = dataclasses.replace(canary, included=np.array([True]))
        data, idx_in, _ = with_canaries(dataset, base, canary)
        canary_x, canary_y = canary.X, canary.y
        if relation == "replace_one":
            # Same size on both sides: the OUT dataset holds an ordinary record where IN holds the canary.
            pool = np.setdiff1d(splits.holdout, members)
            if len(pool) == 0:
                raise InputError("a replace-one audit needs a holdout record to stand in for the canary")
            filler = int(rng.choice(pool))
            idx_out = np.concatenate([members, [filler]])
            source = f"one {canary_kind} canary swapped for an ordinary record (replace-one; black-box, final model)"
        else:
            idx_out = members
            source = f"one {canary_kind} canary added or not (add/remove; black-box, final model)"
    n_max = max(len(idx_in), len(idx_out))
    # Same mechanism on both sides: the step count of the larger dataset, and σ calibrated once.
    config = dataclasses.replace(config, steps=config.num_steps(n_max))
    if config.dp is not None and config.dp.target_epsilon is not None:
        from dpaudit.training.dpsgd import claim_for

        sigma = claim_for(config, n_max)["noise_multiplier"]
        config = dataclasses.replace(
            config, dp=dataclasses.replace(config.dp, noise_multiplier=sigma, target_epsilon=None)
        )
    jobs = []
    for r in range(2 * runs):
        included = r < runs
        cfg = dataclasses.replace(config, seed=seed * 1_000_003 + 3 * r + 11)
        wb = {"included": included, "seed": cfg.seed + 5} if threat_model == "white-box" else None
        jobs.append((data, idx_in if included else idx_out, pre_idx, spec, cfg, perf, canary_x, canary_y, wb))
    with progress.task(f"audit: train {2 * runs} models", 2 * runs) as advance:
        scores = []
        for s in Parallel(n_jobs=workers, return_as="generator")(delayed(_train_one)(j) for j in jobs):
            scores.append(s)
            advance(1)
    scores = np.asarray(scores, dtype=np.float64)
    member = np.arange(2 * runs) < runs
    claim = _recipe_claim(config, idx_in, idx_out)
    claimed = claimed_epsilon if claimed_epsilon is not None else (claim or {}).get("epsilon")
    if delta is None:
        delta = (claim or {}).get("delta", 1e-5)
    result = audit_scores(
        scores, member, method=method, design="multi-run", delta=delta, confidence=confidence,
        claimed_epsilon=claimed, seed=seed,
    )  # fmt: skip
    record = AuditRecord("multi-run", f"{2 * runs} training runs ({runs} with, {runs} without) — {source}", result)
    return TrainingAudit(
        audit=record, threat_model=threat_model, runs=runs, claim=claim, neighbouring=relation, scores=scores,
        member=member,
    )  # fmt: skip


def _recipe_claim(config, idx_in, idx_out) -> dict[str, Any] | None:
    """The privacy claim of the recipe (the larger ε of the two dataset sizes), without training."""
    if config.dp is None:
        return None
    from dpaudit.training.dpsgd import claim_for

    claims = [claim_for(config, len(idx)) for idx in (idx_in, idx_out)]
    return max(claims, key=lambda c: c["epsilon"])
