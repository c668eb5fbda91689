"""The ICL family's workflow: the ICL membership attack (an estimate) and the one-run audit of exemplar
canaries (formal) for a ``dpaudit train --algo dp-icl`` run. The attack module (:mod:`attacks.icl`)
returns scores; the audit and its verdict are decided here (issue 23).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from attacks.icl import icl_canary_scores, icl_membership
from dpaudit.aggregation import AggregatorConfig
from dpaudit.audit import AuditResult, audit_scores
from dpaudit.errors import InputError
from dpaudit.workflows.result import AuditRecord


def icl_canary_audit(
    X: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    *,
    canaries: int,
    shots: int,
    teachers: int = 1,
    epsilon: float = math.inf,
    delta: float = 1e-5,
    confidence: float = 0.95,
    predictor: str = "knn",
    seed: int = 0,
    claim: tuple[float, float] | None = None,
    aggregator: AggregatorConfig | None = None,
    tokens: bool = False,
) -> AuditResult:
    """One-run audit of (DP-)ICL with mislabeled exemplar canaries (formal; Steinke, Nasr & Jagielski
    2023, arXiv:2305.08846, Thm. 3.1), on the scores of :func:`attacks.icl.icl_canary_scores`.

    The claim audited: the aggregator's epsilon over the ``canaries`` queries (none for epsilon = inf), or
    ``claim`` = (claimed ε, its δ) when a user tests another claim on the same mechanism (noise still set by
    ``epsilon`` and ``delta``); adding a canary changes one teacher's prompt, which the one-vote analysis
    covers, so the bound is formal. ``aggregator``: the noisy vote's kind and settings (None: GNMax), its
    answer-step noise calibrated to ``epsilon`` over the canary queries. ``tokens``: X holds token ids."""
    scores, included = icl_canary_scores(
        X, y, n_classes, canaries=canaries, shots=shots, teachers=teachers, epsilon=epsilon, delta=delta,
        predictor=predictor, seed=seed, aggregator=aggregator, tokens=tokens,
    )  # fmt: skip
    claimed, audit_delta = (None if math.isinf(epsilon) else epsilon, delta) if claim is None else claim
    return audit_scores(scores, included, method="one-run", design="canaries", delta=audit_delta,
                        confidence=confidence, claimed_epsilon=claimed, seed=seed)  # fmt: skip


def run_icl(
    run,
    *,
    seed: int = 0,
    canaries: int = 200,
    trials: int = 20,
    confidence: float = 0.95,
    claim: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The ICL family's report entry for a ``dpaudit train --algo dp-icl`` run (JSON-ready); its canary audits at
    ``confidence`` (:func:`dpaudit.workflows.checkpoint.audit_checkpoint` passes its own, shared with the model's
    other formal tests). ``claim`` = (ε, δ): the claim the DP-ICL setting's canary audit tests when a user gives
    one (``audit checkpoint --claimed-epsilon``); None tests the run's own claim.

    With the run's recipe (shots, teachers, predictor, delta) on fresh prompts drawn from its holdout,
    auxiliary and test records (never its private exemplars): the attack's AUC (an estimate) and the
    one-run canary audit (formal) for one non-private prompt (epsilon = inf) and for DP-ICL at the run's
    claimed epsilon. The student checkpoint is post-processing of the answers, so it is not attacked here."""
    from dpaudit.data import Identity, Standardizer

    agg = ((run.meta.get("training") or {}).get("aggregation") or {}).get("recipe")
    if run.meta["training"].get("algo") != "dp-icl" or agg is None:
        raise InputError(f"{run.path}: the ICL attack needs a run trained with --algo dp-icl")
    if agg.get("shots") is None:  # was: "internal error: TypeError: int() argument must be ... not 'NoneType'"
        raise InputError(
            f"{run.path}: the ICL attack and its canary audit simulate fixed prompts of --shots exemplars per teacher; "
            "this run was trained with --subsample (a fresh Poisson sample of exemplars per query), which they do "
            "not simulate"
        )
    ds = run.dataset()
    idx = np.concatenate([run.splits.holdout, run.splits.aux, run.splits.test])
    # Token ids stay ids (the predictors compare bags of tokens): standardising them made them coordinates.
    tokens = ds.kind == "tokens"
    pre = Identity() if tokens else Standardizer.fit(ds.rows(run.splits.aux))
    X = pre.transform(ds.rows(idx))
    y = ds.y[idx]
    privacy = run.privacy or {}
    eps = float(privacy.get("epsilon", math.inf))
    delta = float(agg["delta"])
    shots, teachers, predictor = int(agg["shots"]), int(agg["teachers"]), agg["predictor"]
    per_trial_private = 2 * shots * teachers
    while teachers > 1 and per_trial_private > len(X):  # the public records bound the simulated ensemble
        teachers //= 2
        per_trial_private = 2 * shots * teachers
    # The run's own noisy vote (lnmax, gnmax or confident-gnmax, with its other settings), not GNMax whatever it
    # was: the canary audit joins the model's verdict, so it must audit the kind of mechanism the claim covers.
    template = AggregatorConfig(**agg["aggregator"]) if agg.get("aggregator") else None
    common = {"n_classes": ds.n_classes, "shots": shots, "predictor": predictor, "seed": seed, "tokens": tokens}
    settings = [("one prompt, no noise", 1, math.inf)]
    if math.isfinite(eps):
        kind = {"lnmax": "LNMax", "gnmax": "GNMax", "confident-gnmax": "Confident-GNMax"}.get(
            template.name if template else "gnmax", "GNMax"
        )
        settings.append((f"DP-ICL, {teachers} teachers, {kind}", teachers, eps))
    rows = []
    for label, k, e in settings:
        dp = {"aggregator": template} if math.isfinite(e) else {}
        attack = icl_membership(X, y, teachers=k, epsilon=e, delta=delta, trials=trials, **dp, **common)
        m = min(canaries, len(X) - shots * k)
        tested = claim if math.isfinite(e) else None  # the noise-free prompt is no mechanism any claim covers
        audit = icl_canary_audit(
            X, y, canaries=m, teachers=k, epsilon=e, delta=delta, confidence=confidence, claim=tested, **dp, **common
        )
        rows.append({
            "setting": label, "teachers": k, "epsilon": e, "auc": float(attack.metrics["auc"]),
            "advantage": float(attack.metrics["advantage"]), "n_records": len(attack.scores),
            "canary_epsilon_lower_bound": float(audit.epsilon_lower_bound), "canary_audit": audit.to_dict(),
        })  # fmt: skip
    out: dict[str, Any] = {"attack": "icl", "shots": shots, "predictor": predictor, "settings": rows}
    out["auc_non_private"] = rows[0]["auc"]
    if len(rows) > 1:
        out["auc_private"] = rows[1]["auc"]
        out["canary_epsilon_lower_bound_private"] = rows[1]["canary_epsilon_lower_bound"]
    out["note"] = (
        "AUC: estimate (records drawn per trial, not one fixed neighbouring pair). Canary bound: formal one-run "
        "audit (Steinke, Nasr & Jagielski 2023) of the aggregator's data-independent claim over the canary queries."
    )
    if template is not None and template.name == "confident-gnmax":
        out["note"] += (
            " Confident-GNMax: the run's threshold T and sigma1, sigma1 raised where the threshold step alone over "
            "the simulated queries would cost more than half the run's epsilon (attacks.icl.fit_threshold_step); "
            "sigma2 calibrated to the rest."
        )
    return out


def icl_audit_records(result: Mapping[str, Any]) -> list[AuditRecord]:
    """The model's own formal audits among an ICL result's (:func:`run_icl`): the canary audit of the setting
    at the run's claimed ε (DP-ICL as trained), so that the model's headline uses it like any other audit.
    The noise-free setting is another mechanism (no claim covers it) and stays in the ICL section only."""
    records = []
    for row in result.get("settings") or []:
        if math.isinf(float(row["epsilon"])):
            continue
        d = dict(row["canary_audit"])
        audit = AuditResult(**{**d, "notes": tuple(d.get("notes") or ())})  # the AuditResult run_icl wrote
        what = (
            f"{audit.counts.get('n_eval_canaries', '?')} mislabeled exemplar canaries, each included w.p. 1/2, "
            f"through the run's DP-ICL recipe ({row['setting']}) on fresh public prompts"
        )
        records.append(AuditRecord("icl-canaries", what, audit, family="icl", threat_model="black-box, one run"))
    return records
