"""Render a report as Markdown (GitHub-flavoured) for pull-request comments and CI logs.

Reads only the report dict; the same report always gives the same text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dpaudit.report import _format as F
from dpaudit.validation import visible

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#])")


def md(text: Any) -> str:
    """Escape report text for a Markdown table cell or line (no markup, no line breaks, no raw HTML, control and
    bidirectional control characters written out: :func:`dpaudit.validation.visible`)."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(visible(text).split()))


def md_code(text: Any) -> str:
    """:func:`md` for a text whose backtick pairs mark commands (:func:`dpaudit.report._format.code_spans`): those
    become code spans, shown verbatim (no markup inside one is interpreted), and everything else is escaped."""
    flat = " ".join(visible(text).split())
    return "".join(f"`{piece}`" if code else _MD_SPECIAL.sub(r"\\\1", piece) for piece, code in F.code_spans(flat))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _verdict(v: str | None) -> str:
    text = F.VERDICT_TEXT[v]
    return f"**{text.upper()}**" if v == "violation" else text


def summary_table(report: Mapping[str, Any]) -> list[str]:
    header = list(F.SUMMARY_HEADER)
    rows = []
    for m in report["models"]:
        label = md(F.verdict_label(m))
        rows.append([*(md(c) for c in F.summary_cells(m)), f"**{label.upper()}**" if label == "violation" else label])
    lines = _table(header, rows)
    lines += [""] + [f"- {md(m['name'])}: {md(m['summary']['headline'])}" for m in report["models"]]
    return lines


def _membership(attacks: list[Mapping[str, Any]]) -> list[str]:
    keys = F.tpr_keys(attacks)
    header = [
        "attack",
        "AUC [CI]",
        "balanced acc.",
        "advantage",
        *(F.fpr_label(k) for k in keys),
        "members / non-members",
        "ref. / shadow models",
    ]
    rows = []
    for a in attacks:
        ci = (a.get("ci") or {}).get("auc")
        models = f"{a.get('n_reference_models') or 0} / {a.get('n_shadow_models') or 0}"
        rows.append(
            [
                md(a["attack"]),
                f"{F.num(a['auc'])} {F.interval(ci)}" if ci else F.num(a["auc"]),
                F.rate(a["balanced_accuracy"]),
                F.num(a["advantage"]),
                *(F.tpr_cell(a, k) for k in keys),
                f"{a['n_members']} / {a['n_nonmembers']}",
                models,
            ]
        )
    return _table(header, rows)


def _other_family(attacks: list[Mapping[str, Any]]) -> list[str]:
    """Attack families without a dedicated layout yet: one line per attack with its scalar results."""
    lines = []
    for a in attacks:
        scalars = [f"{md(k)} {F.scalar_text(k, v)}" for k, v in F.scalar_results(a)]
        scalars += [f"{md(k)} **{md(v)}**" for k, v in a.items() if k.startswith("verdict") and isinstance(v, str)]
        lines.append(f"- {md(a['attack'])}: " + (", ".join(scalars) or "no scalar results"))
        if isinstance(a.get("note"), str):  # what the result's numbers and verdicts are about (e.g. jl-step's claims)
            lines.append(f"  - note: {md(a['note'])}")
    return lines


def _audits(audits: list[Mapping[str, Any]]) -> list[str]:
    header = [
        "attack",
        "method",
        "confidence",
        "ε lower bound",
        "claimed ε",
        "max certifiable ε",
        "(FPR, FNR)",
        "verdict",
        "kind",
    ]
    rows = []
    for a in audits:
        op = a.get("operating_point")
        verdict = _verdict(a["effective_verdict"])
        if a["verdict"] is None and a["effective_verdict"] is not None:
            verdict += " (vs. model claim)"
        rows.append(
            [
                md(f"{a['source']['family']}/{a['source']['attack']}"),
                md(a["method"]),
                F.percent(a["confidence"]),
                *F.audit_eps(a),
                f"({F.rate(op['fpr'])}, {F.rate(op['fnr'])})" if op else F.DASH,
                verdict,
                md(F.audit_kind(a)),
            ]
        )
    lines = _table(header, rows)
    notes = F.grouped_notes(audits)
    if notes:
        lines += ["", "Notes:"]
        lines += [f"- {md(sources)}: {md_code(note)}" for sources, note in notes]
    return lines


def model_section(m: Mapping[str, Any]) -> list[str]:
    lines = [
        f"### {md(m['name'])}",
        "",
        f"- path: {md(m['path'] or F.DASH)}",
        f"- model: {md(m['model']['kind'])}",
        f"- data: {md(m['data']['spec'])} (sha256 {F.short_hash(m['data']['sha256'])})",
        f"- training: {md(F.training_text(m['training']))}",
        f"- claim: {md(F.claim_details(m['claim']))}",
        "",
        "Utility:",
        "",
        *_table(["split", "accuracy", "loss"], [[md(c) for c in row] for row in F.utility_rows(m)]),
    ]
    for family, attacks in m["attacks"].items():
        if not attacks:
            continue
        lines += ["", f"#### {md(F.FAMILY_TITLES.get(family, family))} attacks", ""]
        lines += _membership(attacks) if family == "membership" else _other_family(attacks)
    lines += ["", "#### Audits", ""]
    lines += _audits(m["audits"]) if m["audits"] else ["No audits."]
    for check in m.get("noise_checks") or []:
        lines += ["", "#### Noise check (formal)", ""]
        lines += [f"- {md(line)}" for line in F.noise_lines(check)] + [""]
        lines += _table(F.NOISE_HEADER, [[md(c) for c in row] for row in F.noise_rows(check)])
    return lines


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: summary table, then per-model details (utility, attacks, audits, notes)."""
    g = report["generated_by"]
    versions = ", ".join(f"{md(k)} {md(v)}" for k, v in g.items() if v)
    lines = [
        f"# {md(report['title'])}",
        "",
        f"_dpaudit leakage report (schema {report['schema_version']}); {versions}; "
        f"config sha256 {F.short_hash(report['run']['config_sha256'])}_",
        "",
        "## Summary",
        "",
        *summary_table(report),
        "",
        "Verdicts come from the strongest *formal* audit (canaries inserted at random, or independent training "
        "runs): **violation**: its lower bound exceeds the claimed ε; consistent: it does not, and the audit was "
        "strong enough to have detected a violation; inconclusive: the audit was too weak to detect one. A model "
        "without a claim gets no verdict, only what was shown. An *estimate* (membership scores of the model's "
        "own members) is not a formal test: above the claim it reads 'estimate exceeds claim', never violation.",
        "",
        "## Models",
    ]
    for m in report["models"]:
        lines += ["", *model_section(m)]
    return "\n".join(lines) + "\n"
