"""Evaluate one run for a report: attack it, audit each attack's scores, and describe it as a model entry.

This is the computing half of a report (the renderers never call it). Attacks and audits are
imported lazily: they pull in heavier dependencies than rendering needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.report.build import NON_PRIVATE_DELTA, audit_entry, model_entry


def evaluate_run(
    run_path: Path | str,
    *,
    attacks: Sequence[str] = ("loss", "lira"),
    reference_models: int = 8,
    audit_method: str = "gdp",
    delta: float | None = None,
    confidence: float = 0.95,
    workers: int = 1,
    seed: int = 0,
    progress: Progress = NULL_PROGRESS,
    name: str | None = None,
    cache_dir: Path | str | None = None,
) -> dict[str, Any]:
    """Run membership attacks on a run directory and audit each one's scores; return its model entry.

    ``delta`` defaults to the claim's δ (``1e-5`` for a non-private model, whose claimed ε counts
    as ∞). Audits of membership scores on a model trained without canaries are estimates, not
    formal tests: :func:`as_estimate` marks them so and says why. ``cache_dir`` is where reference
    models are cached (the attacks' default when None).
    """
    from attacks.mia import run_mia
    from dpaudit.audit import audit_scores
    from dpaudit.auditing import as_estimate, canary_scores
    from dpaudit.checkpoint import load_run

    run = load_run(run_path)
    claim = run.privacy
    audit_delta = delta if delta is not None else (float(claim["delta"]) if claim else NON_PRIVATE_DELTA)
    claimed_epsilon = float(claim["epsilon"]) if claim else None
    extra = {} if cache_dir is None else {"cache_dir": cache_dir}
    results = run_mia(
        run,
        methods=list(attacks),
        reference_models=reference_models,
        workers=workers,
        seed=seed,
        progress=progress,
        **extra,
    )
    membership = [r.to_dict(include_roc=True) for r in results]
    audits = []
    for i, (r, d) in enumerate(zip(results, membership, strict=True)):
        audit = audit_scores(
            r.scores,
            r.member,
            method=audit_method,
            delta=audit_delta,
            confidence=confidence,
            claimed_epsilon=claimed_epsilon,
            seed=seed,
        ).to_dict()
        audits.append(audit_entry(as_estimate(audit), family="membership", attack=d["attack"], index=i))
    if run.meta.get("canaries"):
        # A formal one-run audit (Steinke, Nasr & Jagielski 2023): canaries included independently w.p. 1/2.
        scores, included = canary_scores(run)
        audit = audit_scores(
            scores,
            included,
            method="one-run",
            delta=audit_delta,
            confidence=confidence,
            claimed_epsilon=claimed_epsilon,
            seed=seed,
        ).to_dict()
        audits.append(audit_entry(audit, family="membership", attack="canaries", index=None))
    return model_entry(
        run.meta,
        name=name or Path(run_path).resolve().name,
        path=str(run_path),
        attacks={"membership": membership},
        audits=audits,
    )
