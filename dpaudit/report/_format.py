"""Number and label formatting shared by the Markdown and HTML renderers (text only, no markup)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpaudit.report.build import as_float

DASH = "—"

VERDICT_TEXT = {
    "violation": "violation",
    "inconclusive": "inconclusive",
    "consistent": "consistent",
    None: "no audit",
}

FAMILY_TITLES = {
    "membership": "Membership inference",
    "inversion": "Model inversion",
    "extraction": "Model extraction",
    "attribute": "Attribute inference",
    "cloak": "Cloak",
}

HOW_TO_READ = (
    (
        "Empirical ε lower bound",
        "An attack that tells members from non-members well proves that the training cannot be "
        "(ε, δ)-DP for any ε below the bound (with the stated confidence). It is a lower bound: a weak "
        "attack gives a small bound even for a leaky model, so a small bound is no evidence of privacy.",
    ),
    (
        "violation",
        "The lower bound exceeds the claimed ε: the claim (or its implementation) is wrong, with the "
        "stated confidence when the audit is formal.",
    ),
    (
        "consistent",
        "The bound stays below the claim although the audit could have certified a bound as large as the "
        "claim: the attack found no contradiction where it could have.",
    ),
    (
        "inconclusive",
        "The bound stays below the claim, but the audit was too weak (too few samples) to certify a bound as "
        "large as the claim, so it could not have detected a violation. A model without a claim counts as "
        "ε = ∞ and is always inconclusive.",
    ),
    (
        "formal vs estimate",
        "Audits on canaries inserted at training time are formal hypothesis tests. Audits on membership "
        "scores of an ordinary model (members drawn from the data) are estimates: they assume the "
        "members/non-members split behaves like the DP neighbouring relation.",
    ),
    (
        "Trade-off plot",
        "The curve is the best (FPR, FNR) any test can reach against an (ε, δ)-DP mechanism "
        "(Dong, Roth & Su 2022, Prop. 2.5). An audit point with its confidence box entirely below the "
        "curve is a violation.",
    ),
)


def num(x: Any, spec: str = ".3f") -> str:
    """A report number formatted with ``spec``; None → —, ±∞ → ±∞."""
    v = as_float(x)
    if v is None:
        return DASH
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    return format(v, spec)


def eps(x: Any) -> str:
    return num(x, ".3g")


def rate(x: Any) -> str:
    return num(x, ".3g")


def percent(x: Any) -> str:
    v = as_float(x)
    return DASH if v is None else f"{100 * v:g}%"


def interval(ci: Any, spec: str = ".3f") -> str:
    if not ci:
        return DASH
    return f"[{num(ci[0], spec)}, {num(ci[1], spec)}]"


def claim_text(claim: Mapping[str, Any] | None) -> str:
    if claim is None:
        return "∞ (non-private)"
    return f"{eps(claim['epsilon'])} (δ = {num(claim['delta'], 'g')})"


def bound_text(summary: Mapping[str, Any]) -> str:
    """'≥ 3.41 (gdp, 95%, estimate)' for the summary's largest lower bound."""
    if summary["epsilon_lower_bound"] is None:
        return DASH
    kind = "formal" if summary["epsilon_lower_bound_formal"] else "estimate"
    return (
        f"≥ {eps(summary['epsilon_lower_bound'])} ({summary['epsilon_lower_bound_method']}, "
        f"{percent(summary['epsilon_lower_bound_confidence'])}, {kind})"
    )


def with_attack(value: str, attack: str | None) -> str:
    return value if attack is None or value == DASH else f"{value} ({attack})"


def tpr_keys(attacks: list[Mapping[str, Any]]) -> list[str]:
    """The FPR levels of tpr_at_fpr present in any attack, in increasing order."""
    keys = {k for a in attacks for k in a["tpr_at_fpr"]}
    return sorted(keys, key=float)


def fpr_label(key: str) -> str:
    return f"TPR@{100 * float(key):g}% FPR"


def training_text(training: Mapping[str, Any]) -> str:
    parts = [str(training["algo"])]
    for key, label in (
        ("epochs", "epochs"),
        ("steps", "steps"),
        ("batch_size", "batch"),
        ("lr", "lr"),
        ("seed", "seed"),
    ):
        if training.get(key) is not None:
            parts.append(f"{label} {training[key]}")
    dp = training.get("dp")
    if dp:
        for key, label in (("noise_multiplier", "σ"), ("clip", "C"), ("sampling", "sampling")):
            if dp.get(key) is not None:
                parts.append(f"{label} {dp[key]}")
    return ", ".join(parts)


def claim_details(claim: Mapping[str, Any] | None) -> str:
    if claim is None:
        return "none (non-private training; treated as ε = ∞)"
    parts = [f"ε = {eps(claim['epsilon'])}, δ = {num(claim['delta'], 'g')}"]
    for key, label in (("accountant", "accountant"), ("neighbouring", "neighbouring")):
        if claim.get(key):
            parts.append(f"{label} {claim[key]}")
    for key, label in (("noise_multiplier", "σ"), ("sample_rate", "q"), ("steps", "steps"), ("clip", "C")):
        if claim.get(key) is not None:
            parts.append(f"{label} {claim[key]}")
    return ", ".join(parts)


def short_hash(h: str | None) -> str:
    return DASH if not h else h[:12]


def grouped_notes(audits: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Each distinct audit note once, with the audits ('attack / method') that carry it, in first-seen order."""
    groups: dict[str, list[str]] = {}
    for a in audits:
        source = f"{a['source']['attack']} / {a['method']}"
        for note in a.get("notes") or []:
            sources = groups.setdefault(note, [])
            if source not in sources:
                sources.append(source)
    return [(", ".join(sources), note) for note, sources in groups.items()]


SUMMARY_HEADER = (
    "model",
    "claimed ε",
    "empirical ε lower bound (method, confidence)",
    "best attack AUC",
    "TPR@0.1% FPR",
    "verdict",
)


def summary_cells(model: Mapping[str, Any]) -> list[str]:
    """The summary row's text cells (all but the verdict), unescaped; each renderer escapes them."""
    s = model["summary"]
    return [
        str(model["name"]),
        claim_text(model["claim"]),
        bound_text(s),
        with_attack(num(s["best_auc"]), s["best_auc_attack"]),
        with_attack(rate(s["tpr_at_low_fpr"]), s["tpr_at_low_fpr_attack"]),
    ]
