"""Audit one checkpoint: a formal one-run audit of its canaries, membership-attack estimates beside it.

- Canaries (``dpaudit train --canaries M``), each included independently with probability 1/2:
  the one-run audit of Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846, Theorem 3.1 and §5) is a
  formal lower bound — for a claim under add/remove neighbours, which is what adding or leaving out
  a canary is. A claim under replace-one neighbours (shuffled batches) does not cover that
  experiment, so the bound is then reported as an estimate, with the reason.
- Membership attacks on the model's own members vs holdout records are *estimates*: the members
  were not drawn independently per trial of one fixed neighbouring pair, which the
  hypothesis-testing bound assumes (Jagielski et al. 2020, arXiv:2006.07709, §3).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit import numfmt
from dpaudit.audit import AuditResult, audit_scores, check_audit_claim, decide_verdict
from dpaudit.audit.one_run import check_inclusion_mixed
from dpaudit.checkpoint import claim_mismatch_note, edited_note
from dpaudit.defaults import DEFAULTS, AuditDefaults  # noqa: F401 (AuditDefaults: re-exported)
from dpaudit.errors import InputError
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.workflows.result import AuditRecord, ModelAudit

NON_PRIVATE_DELTA = 1e-5  # δ at which a model that makes no claim is audited


def relation_note(claim_relation: str | None, experiment: str, algo: str | None = None) -> str | None:
    """Why a design does not test the claim's neighbouring relation, or None when it does.

    ``experiment`` is "add_remove" (a record present or absent) or "replace_one" (one record swapped
    for another, same size). A replace-one claim says nothing about datasets of different sizes, so an
    add/remove experiment cannot refute it; an add/remove claim covers replace-one only at 2ε (group
    privacy), so that direction is converted by the callers, never silently compared. ``algo``: the run's
    algorithm, for the way out the note names (only DP-SGD/DP-Adam have Poisson sampling and `audit train`).
    """
    if claim_relation == "replace_one" and experiment == "add_remove":
        from dpaudit.training.convex import CONVEX_ALGOS

        if algo not in CONVEX_ALGOS:  # DP-SGD's and DP-Adam's shuffled batches, or an imported run's loop
            why, way_out = (
                "shuffled batches",
                "train with --sampling poisson, or audit with `dpaudit audit train`, which swaps the canary for "
                "another record",
            )
        else:  # the convex learners' sensitivity is for a swapped record (Chaudhuri et al. 2011): no Poisson option
            why, way_out = (
                f"--algo {algo}",
                f"--algo {algo} has no add/remove claim, and `dpaudit audit train`, which swaps the canary for "
                "another record, trains sgd, adam, dpsgd and dpadam only: no formal audit of this run yet",
            )
        return (
            f"the claim is for replace-one neighbours ({why}) but the audit adds or removes records; "
            "such a claim does not cover datasets of different sizes, so this bound cannot refute it and is "
            f"reported as an estimate ({way_out})"
        )
    return None


def as_estimate(result: AuditResult, reason: str) -> AuditResult:
    """The same bound relabelled as an estimate (its verdict can then never be "violation")."""
    if not result.formal and reason in result.notes:
        return result
    verdict = decide_verdict(
        result.epsilon_lower_bound, result.claimed_epsilon, result.max_certifiable_epsilon, formal=False
    )
    return dataclasses.replace(result, formal=False, verdict=verdict, notes=(*result.notes, reason))


def _inversion(run, options: Mapping[str, Any], seed: int, progress: Progress) -> dict[str, Any]:
    from attacks.inversion import run_inversion

    classes = options.get("classes")
    result = run_inversion(run, None if classes is None else tuple(classes), seed=seed, progress=progress)
    return result.to_dict(include_inversions=True)


def _attribute(run, options: Mapping[str, Any], seed: int, progress: Progress) -> dict[str, Any]:
    from attacks.attribute import run_attribute

    if options.get("feature") is None:
        raise InputError("attribute inference needs the hidden feature (name or index)")
    return run_attribute(run, options["feature"], black_box=bool(options.get("black_box")), seed=seed).to_dict()


def _extraction(run, options: Mapping[str, Any], seed: int, progress: Progress) -> dict[str, Any]:
    from attacks.extraction import extract

    return extract(run, seed=seed, progress=progress, **dict(options)).result.to_dict()


# Attack families beside membership inference, run on request: name -> runner(run, options, seed, progress)
# returning the attack's JSON-ready result (the report stores it under attacks[name]).
def _cloak(run, options: Mapping[str, Any], seed: int, progress: Progress) -> dict[str, Any]:
    from attacks.cloak import cloak_family

    return cloak_family(run, options, seed=seed, progress=progress)


def _icl(run, options: Mapping[str, Any], seed: int, progress: Progress) -> dict[str, Any]:
    from dpaudit.workflows.icl import run_icl

    return run_icl(run, seed=seed, **dict(options))


def _jl_step(run, options: Mapping[str, Any], seed: int, progress: Progress) -> dict[str, Any]:
    from dpaudit.workflows.jl_audit import jl_step_family

    return jl_step_family(run, options, seed, progress)


FAMILY_RUNNERS = {
    "inversion": _inversion, "attribute": _attribute, "extraction": _extraction, "cloak": _cloak, "icl": _icl,
    "jl-step": _jl_step,
}  # fmt: skip


def check_families_fit(families: Mapping[str, Any], meta: Mapping[str, Any], path: Path | str) -> None:
    """Refuse, before any attack runs, a family the run's data cannot take (``meta``: its checkpoint.json): token
    data refuse inversion, attribute inference and extraction (each attack's own one-line reason)."""
    if (meta.get("data") or {}).get("kind") != "tokens":
        return
    from attacks.attribute import TOKEN_REFUSAL as attribute
    from attacks.extraction import TOKEN_REFUSAL as extraction
    from attacks.inversion import TOKEN_REFUSAL as inversion

    refusals = {"inversion": inversion, "attribute": attribute, "extraction": extraction}
    for family in families:
        if family in refusals:
            raise InputError(f"{path}: {refusals[family]}")


def _icl_audits(result: Mapping[str, Any]) -> list[AuditRecord]:
    from dpaudit.workflows.icl import icl_audit_records

    return icl_audit_records(result)


# Formal audits of the model's own claim that a family's result carries: name -> records(result). They join
# the model's audits, so that its headline (the strongest formal audit) uses them like any other. "jl-step"
# is absent on purpose: it tests one JL step at q = 1 against one-step claims, not the run's (q, T) claim
# (:func:`dpaudit.workflows.jl_audit.jl_step_family`), so its verdicts stay in its own section.
FAMILY_AUDITS = {"icl": _icl_audits}


def claim_tradeoff(privacy: Mapping[str, Any]):
    """The claim's own trade-off curve family for the one-run f-DP audit, or None when the claim is not
    a Poisson-sampled DP-SGD event with exact norms (add/remove neighbours): DP-SGD's curves with the
    claim's q and T, the noise multiplier varied (:func:`dpaudit.audit.fdp_one_run.dpsgd_family`)."""
    from dpaudit.audit.fdp_one_run import dpsgd_family

    needed = ("sample_rate", "steps", "noise_multiplier")
    if privacy.get("sampling") != "poisson" or privacy.get("jl_projections") or privacy.get("jl"):
        return None
    if privacy.get("neighbouring", "add_remove") != "add_remove" or any(privacy.get(k) is None for k in needed):
        return None
    if not _fields_are_the_event(privacy):
        return None
    return dpsgd_family(float(privacy["sample_rate"]), int(privacy["steps"]))


def _fields_are_the_event(privacy: Mapping[str, Any]) -> bool:
    """Whether the claim's (σ, q, T) fields describe its recorded mechanism (``privacy.event``, the one its ε is
    accounted and re-accounted from, :func:`dpaudit.checkpoint.reaccount_claim`): dpaudit writes both from one
    computation, so a file where they differ (T = 1 beside an event of 4 steps) was edited or written by other
    software, and the curve family of its fields is not the claim's; its refutation would then say "the claimed
    DP-SGD curve is refuted" of another mechanism's curve. True when no event is recorded (the fields are the
    whole claim)."""
    from dpaudit.accounting import dpsgd_event
    from dpaudit.errors import DPAuditError
    from dpaudit.events import event_from_dict

    if privacy.get("event") is None:
        return True
    try:
        event = event_from_dict(privacy["event"])
        fields = dpsgd_event(
            noise_multiplier=float(privacy["noise_multiplier"]),
            sample_rate=float(privacy["sample_rate"]),
            steps=int(privacy["steps"]),
        )
    except (DPAuditError, ValueError, TypeError, KeyError):
        return False
    return event == fields


_RETRAIN = "retrain with another canary seed (`dpaudit train --canary-seed`)"


def canary_confidence(confidence: float, curve, canary_sets: int, others: int = 0) -> float:
    """The confidence of each formal canary test of a checkpoint: Bonferroni over all of them.

    Each formal canary set (the black-box canaries, the white-box ones) gets the one-run (ε, δ) audit and, when
    the claim has its own curve (``curve``, :func:`claim_tradeoff`), the one-run f-DP audit against it
    (:func:`one_run_records`); ``others`` are further formal tests joining the model's verdict (the ICL canary
    audit). Any one of them refutes the claim on its own, so each runs at 1 − α/n (union bound: a mechanism
    that meets its claim gets a formal refutation with probability ≤ α = 1 − ``confidence``).
    :func:`audit_checkpoint` audits at this level, and ``dpaudit train --canaries`` checks at it that the
    design can refute the claim (:func:`dpaudit.workflows.training.require_refutable_canaries`)."""
    n_formal = (1 + (curve is not None)) * canary_sets + others
    return 1.0 - (1.0 - confidence) / max(1, n_formal)


def one_run_records(attack, what, scores, included, common, curve, note) -> list[AuditRecord]:
    """One-run audits of canary scores: the (ε, δ) analysis (Steinke, Nasr & Jagielski 2023) and, when
    the claim has its own trade-off curve (:func:`claim_tradeoff`), the f-DP analysis against that curve
    (Mahloujifar, Melis & Chaudhuri 2025), which can certify more from the same guesses. Both formal;
    ``note`` (a neighbouring-relation mismatch) relabels them as estimates."""
    out = []
    analyses = [("one-run", "gdp", f"one-run audit of {what}")]
    if curve is not None:
        analyses.append(
            ("one-run-fdp", curve, f"one-run f-DP audit against the claim's curve ({curve.name}) of {what}")
        )
    for method, tradeoff, description in analyses:
        result = audit_scores(scores, included, method=method, design="canaries", tradeoff=tradeoff, **common)
        if note is not None:
            result = as_estimate(result, note)
        out.append(AuditRecord(attack, description, result))
    return out


def canary_scores(run) -> tuple[np.ndarray, np.ndarray]:
    """Black-box scores of the run's canaries (logit-scaled confidence of the canary label, higher =
    more likely included; Carlini et al. 2022, arXiv:2112.03570, Eq. 4) and their inclusion."""
    from attacks.threshold import logit_margin

    canaries = run.canaries()
    if canaries is None:
        raise InputError(f"{run.path}: the run has no canaries (train with --canaries M)")
    return logit_margin(run.logits(canaries.X), canaries.y), canaries.included


def member_list_note(meta: dict) -> str | None:
    """The caveat of an imported run whose declared members do not look like its training records
    (``checkpoint.json`` ``import.member_check``, see :func:`dpaudit.training.run.member_check`), or None."""
    check = (meta.get("import") or {}).get("member_check") or {}
    return check.get("note") if check.get("suspicious") else None


def membership_attacks(text: str) -> tuple[str, ...]:
    """The ``--attacks`` option of `audit checkpoint` and `report`, one vocabulary: comma-separated membership
    attacks (``all`` expands), or ``none``: no attack, the run's canaries (and other families) only."""
    from attacks.mia import parse_methods

    return () if text.strip().lower() == "none" else parse_methods(text)


def audit_checkpoint(
    path: Path | str,
    *,
    attacks: str | tuple[str, ...] | list[str] = DEFAULTS.attacks,
    estimate_method: str = DEFAULTS.estimate_method,
    delta: float | None = None,
    confidence: float = DEFAULTS.confidence,
    claimed_epsilon: float | None = None,
    reference_models: int = DEFAULTS.reference_models,
    workers: int = 1,
    seed: int = DEFAULTS.seed,
    cache_dir: Path | str | None = None,
    name: str | None = None,
    families: Mapping[str, Mapping[str, Any]] | None = None,
    progress: Progress = NULL_PROGRESS,
) -> ModelAudit:
    """Audit a run directory: canaries (formal, one-run) and membership ``attacks`` (estimates).

    ``claimed_epsilon`` and ``delta`` default to the checkpoint's claim (δ = 1e-5 without one; a
    model without a claim gets bounds but no verdict). ``delta`` is the δ of the claim tested: without
    ``claimed_epsilon``, one below the run's own δ is refused (the run's ε is no claim there).
    ``attacks``: names, or a string in the CLI's ``--attacks`` vocabulary (``"loss,lira"``, ``"all"``,
    ``"none"``: :func:`membership_attacks`); may be empty for a canary-only audit. ``cache_dir``: where
    reference models are cached (None: :func:`dpaudit.cache.default_cache_dir`).
    ``families`` runs other attack families too, e.g. ``{"inversion": {}, "attribute": {"feature": 3}}``
    (see :data:`FAMILY_RUNNERS`); their results are reported, not audited (they bound no ε).
    """
    from dpaudit.checkpoint import as_run

    run = as_run(path)  # a run directory, or a Run already loaded (as the attacks take it)
    path = run.path
    # A string is the --attacks option's text (one vocabulary), not a sequence of one-letter attack names.
    attacks = membership_attacks(attacks) if isinstance(attacks, str) else tuple(attacks)
    canaries = run.meta.get("canaries")
    families = dict(families or {})
    unknown = sorted(set(families) - set(FAMILY_RUNNERS))
    if unknown:
        raise InputError(f"unknown attack family {', '.join(unknown)}; valid: {', '.join(FAMILY_RUNNERS)}")
    check_families_fit(families, run.meta, path)  # before the membership attacks (minutes with LiRA)
    if not attacks and not canaries and not families and not run.meta.get("whitebox_canaries"):
        raise InputError(f"{path}: nothing to audit: the run has no canaries and no attack was asked for")
    privacy = run.privacy or {}
    claimed = claimed_epsilon if claimed_epsilon is not None else privacy.get("epsilon")
    if claimed_epsilon is None and delta is not None and privacy.get("delta") is not None and delta < privacy["delta"]:
        # (ε, δ_c)-DP implies (ε, δ)-DP for δ ≥ δ_c only: at a smaller δ the run's ε is no claim, and testing it
        # there could report a violation of a claim nobody made.
        raise InputError(
            f"the run's claim is at δ = {numfmt.exact(privacy['delta'])}; its ε says nothing at the "
            f"smaller δ = {numfmt.exact(delta)}: give the claim to test as claimed_epsilon with "
            "that delta"
        )
    delta = float(delta if delta is not None else privacy.get("delta", NON_PRIVATE_DELTA))
    check_audit_claim(delta=delta, confidence=confidence, claimed_epsilon=claimed)  # before any model is trained
    common = {"delta": delta, "confidence": confidence, "claimed_epsilon": claimed, "seed": seed}
    records: list[AuditRecord] = []
    curve = claim_tradeoff(privacy) if claimed_epsilon is None else None
    algo = (run.meta.get("training") or {}).get("algo")
    note = relation_note(privacy.get("neighbouring"), "add_remove", algo if isinstance(algo, str) else None)
    note = note if canaries else None
    whitebox = run.whitebox_canaries()
    # Multiplicity: α is split evenly between every formal canary test (Bonferroni, :func:`canary_confidence`; the
    # ICL family's canary audit of a DP-ICL run at its claimed ε is one more). Estimates keep the full confidence.
    icl = "icl" in families and math.isfinite(float(privacy.get("epsilon", math.inf)))
    formal_sets = (bool(canaries) and note is None) + (whitebox is not None)
    canary_common = {**common, "confidence": canary_confidence(confidence, curve, formal_sets, others=icl)}
    if "icl" in families:  # at the model's confidence and claim, not the family's defaults
        families["icl"] = {**families["icl"], "confidence": canary_common["confidence"]}
        if claimed_epsilon is not None:  # the user's claim, not the run's ε, is the one this audit tests
            families["icl"]["claim"] = (float(claimed_epsilon), delta)
    if canaries:
        scores, included = canary_scores(run)
        what = f"{len(scores)} {canaries['kind']} canaries, each included w.p. 1/2 (black-box, logit-scaled confidence)"
        if canaries.get("inserted_by"):  # an imported run: formal if its training added the included ones as declared
            what += f"; inserted by {canaries['inserted_by']}"
        check_inclusion_mixed(included, f"{path}: {canaries['kind']} canaries", _RETRAIN)
        records += one_run_records("canaries", what, scores, included, canary_common, curve, note)
    if whitebox is not None:
        what = (
            f"{len(whitebox[0])} white-box Dirac gradient canaries, each included w.p. 1/2 (every update observed; "
            "Steinke, Nasr & Jagielski 2023)"
        )
        check_inclusion_mixed(whitebox[1], f"{path}: white-box canaries", _RETRAIN)
        records += one_run_records("whitebox-canaries", what, *whitebox, canary_common, curve, None)
    # One load and hash of the data for the membership attacks and every family (each reloaded it: 10.8 s a load
    # at 50,000 CIFAR-sized images); a canary-only audit loads none.
    with run.dataset_held():
        results = []
        if attacks:
            from attacks.mia import run_mia

            heard: list[str] = []  # run_mia's warnings (non-members that copy a member)
            results = run_mia(
                run, list(attacks), reference_models=reference_models, workers=workers, seed=seed, progress=progress,
                cache_dir=cache_dir, warn=heard.append,
            )  # fmt: skip
            # never attack a doubtful member list, a model that learned nothing, or duplicated records, silently
            caveats = tuple(n for n in (member_list_note(run.meta), *run.meta.get("fit_warnings", ()), *heard) if n)
            for i, res in enumerate(results):
                result = audit_scores(res.scores, res.member, method=estimate_method, design="membership", **common)
                if caveats:
                    result = dataclasses.replace(result, notes=(*result.notes, *caveats))
                n_in, n_out = int(res.member.sum()), int((~res.member).sum())
                records.append(
                    AuditRecord(
                        res.name,
                        f"{res.name} attack on the model's {n_in} members vs {n_out} holdout records (estimate)",
                        result,
                        index=i,
                    )
                )
        others = {f: [FAMILY_RUNNERS[f](run, opts, seed, progress)] for f, opts in families.items()}
    mismatch = claim_mismatch_note(run.privacy)  # a tampered claim is tested as recorded, and said so
    edited = edited_note(run.path)  # hand-edited metrics and settings, shown in the report as recorded
    added = tuple(n for n in (mismatch if claimed_epsilon is None else None, edited) if n is not None)
    if added:
        records = [
            dataclasses.replace(r, result=dataclasses.replace(r.result, notes=(*r.result.notes, *added)))
            for r in records
        ]
    for f, (result,) in others.items():
        records += FAMILY_AUDITS.get(f, lambda r: [])(result)
    return ModelAudit(
        path=Path(path),
        families=others,
        name=name or Path(path).resolve().name,
        meta=run.meta,
        attacks=tuple(results),
        audits=tuple(records),
    )
