"""Render a report as one self-contained HTML page.

No external resources: CSS is inline, figures are base64 PNG data URIs, and a Content-Security-Policy
forbids the page from loading anything else. Every text taken from the report is escaped, its control and
bidirectional control characters written out (:func:`dpaudit.validation.visible`).
Reads only the report dict; the same report gives the same bytes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from dpaudit.report import _format as F
from dpaudit.report import plots
from dpaudit.validation import visible

_CSS = """
:root { --fg: #1d2329; --muted: #5f6b76; --line: #dde3e8; --bg: #ffffff; --panel: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); background: var(--bg); margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 12px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 17px; margin: 28px 0 8px; }
h4 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: var(--muted); font-size: 13px; }
.badges { display: flex; flex-wrap: wrap; gap: 8px; margin: 14px 0 4px; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 999px; font-size: 13px; font-weight: 600;
         color: #fff; white-space: nowrap; }
.badge .name { font-weight: 400; opacity: 0.95; }
.v-violation { background: #c62828; } .v-inconclusive { background: #b86e00; }
.v-consistent { background: #2e7d32; } .v-none { background: #757575; }
.v-estimate-exceeds-claim { background: #6a1b9a; } .v-curve-refuted { background: #ad1457; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 14px; }
th, td { border: 1px solid var(--line); padding: 5px 9px; text-align: left; vertical-align: top; }
th { background: var(--panel); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.figs { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
figure { margin: 8px 0; flex: 1 1 480px; max-width: 100%; }
figure.wide { flex-basis: 100%; }
figure.narrow { flex: 0 1 560px; }
figure img { width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
.explainer { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 10px 16px; }
.explainer dt { font-weight: 600; margin-top: 6px; }
.explainer dd { margin: 0 0 4px 0; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 6px 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; overflow-wrap: anywhere; }
ul.notes { margin: 4px 0; padding-left: 22px; font-size: 14px; }
pre { background: var(--panel); border: 1px solid var(--line); padding: 8px; overflow-x: auto; font-size: 12px; }
code { font-size: 13px; }
section.model + section.model { border-top: 3px solid var(--line); margin-top: 30px; }
"""

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _e(text: Any) -> str:
    return escape(visible(text), quote=True)


def _e_code(text: Any) -> str:
    """:func:`_e` for a text whose backtick pairs mark commands (:func:`dpaudit.report._format.code_spans`), each
    shown in ``<code>``; every piece escaped."""
    return "".join(f"<code>{_e(p)}</code>" if code else _e(p) for p, code in F.code_spans(visible(text)))


def _badge(verdict: str | None, name: str | None = None, label: str | None = None) -> str:
    cls = f"v-{verdict or 'none'}"
    label = _e(F.VERDICT_TEXT[verdict] if label is None else label)
    prefix = f'<span class="name">{_e(name)}:</span> ' if name is not None else ""
    return f'<span class="badge {cls}">{prefix}{label}</span>'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A table whose header and cells are already-escaped HTML; columns in ``numeric`` align right."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _figure(data: bytes | None, alt: str, caption: str, wide: bool = False, narrow: bool = False) -> str:
    if data is None:
        return ""
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    cls = ' class="wide"' if wide else (' class="narrow"' if narrow else "")
    return f'<figure{cls}><img alt="{_e(alt)}" src="{uri}"><figcaption>{_e(caption)}</figcaption></figure>'


def _summary_table(report: Mapping[str, Any]) -> str:
    header = list(F.SUMMARY_HEADER)
    rows = []
    for m in report["models"]:
        rows.append([*(_e(c) for c in F.summary_cells(m)), _model_badge(m)])
    headlines = "".join(
        f"<li><strong>{_e(m['name'])}:</strong> {_e(m['summary']['headline'])}</li>" for m in report["models"]
    )
    return _table([_e(h) for h in header], rows) + f'<ul class="notes">{headlines}</ul>'


def _model_badge(m: Mapping[str, Any], name: str | None = None) -> str:
    return _badge(m["summary"]["verdict"], name, F.verdict_label(m))


def _membership_table(attacks: list[Mapping[str, Any]]) -> str:
    keys = F.tpr_keys(attacks)
    header = ["attack", "AUC", "AUC CI", "balanced acc.", "advantage", *(F.fpr_label(k) for k in keys)]
    header += ["members / non-members", "reference / shadow models", "parameters"]
    rows = []
    for a in attacks:
        params = json.dumps(a.get("params") or {}, sort_keys=True, ensure_ascii=False)
        rows.append(
            [
                _e(a["attack"]),
                _e(F.num(a["auc"])),
                _e(F.interval((a.get("ci") or {}).get("auc"))),
                _e(F.rate(a["balanced_accuracy"])),
                _e(F.num(a["advantage"])),
                *(_e(F.tpr_cell(a, k)) for k in keys),
                _e(f"{a['n_members']} / {a['n_nonmembers']}"),
                _e(f"{a.get('n_reference_models') or 0} / {a.get('n_shadow_models') or 0}"),
                f"<code>{_e(params)}</code>",
            ]
        )
    return _table([_e(h) for h in header], rows, numeric=range(1, 5 + len(keys)))


# Figures of attack families' results, by the result's "attack": (plot, title, caption).
_FAMILY_FIGURES = {
    "cloak": (
        plots.cloak_figure,
        "Cloak noise per feature",
        "σ of the learned noise relative to each feature's range: bright features are drowned in noise, "
        "dark ones are what the model needs (Cloak, seed 'Noisy Representation').",
    ),
    "icl": (
        plots.icl_figure,
        "ICL membership: AUC and canary ε lower bound",
        "Was a record a prompt exemplar? One noise-free prompt against DP-ICL's noisy vote at the run's ε "
        "(AUC: estimate; canary bound: formal one-run audit).",
    ),
}


def _other_family(attacks: list[Mapping[str, Any]]) -> str:
    """Other attack families: a table of each result's scalar numbers, an inversion grid where there is
    one, and the whole result as JSON (collapsed) so nothing is hidden."""
    out = []
    for a in attacks:
        rows = [[_e(k), _e(F.scalar_text(k, v))] for k, v in F.scalar_results(a)]
        out.append(f"<h4>{_e(a.get('attack', '?'))}</h4>")
        if isinstance(a.get("note"), str):  # what the result's numbers and verdicts are about
            out.append(f'<p class="note">{_e(a["note"])}</p>')
        if rows:
            out.append(_table(["result", "value"], rows, numeric=(1,)))
        out.append(
            _figure(
                plots.png(lambda a=a: plots.inversion_figure(a)),
                "Model inversions per class",
                "Each image is the input MI-FACE found for a class; the arrow gives the label an independently "
                "trained evaluation classifier assigns to it.",
                wide=True,
            )
        )
        curve = _figure(
            plots.png(lambda a=a: plots.extraction_figure(a)),
            "Extraction fidelity against queries",
            "Agreement of the extracted model's predictions with the target's, on test inputs and on uniform "
            "inputs in the feature box, as the query budget grows.",
            narrow=True,
        )
        out.append(f'<div class="figs">{curve}</div>' if curve else "")
        if a.get("attack") in _FAMILY_FIGURES:
            make, title, caption = _FAMILY_FIGURES[a["attack"]]
            fig = _figure(plots.png(lambda a=a, make=make: make(a)), title, caption, narrow=True)
            out.append(f'<div class="figs">{fig}</div>' if fig else "")
        details = json.dumps({k: v for k, v in a.items() if k != "inversions"}, indent=2, ensure_ascii=False)
        out.append(f"<details><summary>all results</summary><pre>{_e(details)}</pre></details>")
    return "".join(out)


def _audits(audits: list[Mapping[str, Any]]) -> str:
    if not audits:
        return "<p>No audits.</p>"
    header = ["source", "method", "ε lower bound", "claimed ε", "max certifiable ε", "FPR [CI]", "FNR [CI]"]
    header += ["threshold", "verdict", "kind"]
    rows = []
    for a in audits:
        op = a.get("operating_point")
        verdict = _badge(a["effective_verdict"])
        if a["verdict"] is None and a["effective_verdict"] is not None:
            verdict += "<br><small>vs. model claim</small>"
        rows.append(
            [
                _e(f"{a['source']['family']} / {a['source']['attack']}"),
                _e(f"{a['method']}, {F.percent(a['confidence'])}"),
                *map(_e, F.audit_eps(a)),
                _e(F.rate(op["fpr"])) + f"<br><small>{_e(F.rate_interval(op['fpr_interval']))}</small>"
                if op
                else F.DASH,
                _e(F.rate(op["fnr"])) + f"<br><small>{_e(F.rate_interval(op['fnr_interval']))}</small>"
                if op
                else F.DASH,
                _e(F.num(a.get("threshold"), ".4g"))
                + (f"<br><small>{_e(a['threshold_selection'])}</small>" if a.get("threshold_selection") else ""),
                verdict,
                _e(F.audit_kind(a)) if a["formal"] else f"<strong>{_e(F.audit_kind(a))}</strong>",
            ]
        )
    out = _table([_e(h) for h in header], rows, numeric=range(2, 8))
    notes = F.grouped_notes(audits)
    if notes:
        items = "".join(f"<li><strong>{_e(sources)}:</strong> {_e_code(note)}</li>" for sources, note in notes)
        out += f'<ul class="notes">{items}</ul>'
    return out


def _facts(pairs: Sequence[tuple[str, str]]) -> str:
    return '<dl class="facts">' + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def _model_section(m: Mapping[str, Any], colors: Mapping[str, str]) -> str:
    facts = _facts(
        [
            ("path", f"<code>{_e(m['path'] or F.DASH)}</code>"),
            ("model", _e(m["model"]["kind"])),
            (
                "data",
                f"{_e(m['data']['spec'])} <small>(sha256 <code>{_e(F.short_hash(m['data']['sha256']))}</code>)</small>",
            ),
            ("training", _e(F.training_text(m["training"]))),
            ("claim", _e(F.claim_details(m["claim"]))),
        ]
    )
    utility = _table(["split", "accuracy", "loss"], [[_e(c) for c in row] for row in F.utility_rows(m)], numeric=(1, 2))
    parts = [
        f'<section class="model"><h3>{_e(m["name"])} {_model_badge(m)}</h3>',
        facts,
        "<h4>Utility</h4>",
        utility,
    ]
    for family, attacks in m["attacks"].items():
        if not attacks:
            continue
        parts.append(f"<h4>{_e(F.FAMILY_TITLES.get(family, family))} attacks</h4>")
        parts.append(_membership_table(attacks) if family == "membership" else _other_family(attacks))
    parts += ["<h4>Audits</h4>", _audits(m["audits"])]
    for check in m.get("noise_checks") or []:
        items = "".join(f"<li>{_e(line)}</li>" for line in F.noise_lines(check))
        rows = [[_e(c) for c in row] for row in F.noise_rows(check)]
        parts += [
            f"<h4>Noise check (formal) {_badge(check['verdict'])}</h4>",
            f'<ul class="notes">{items}</ul>',
            _table([_e(h) for h in F.NOISE_HEADER], rows, numeric=range(1, 6)),
        ]
    figs = [
        _figure(
            plots.png(lambda: plots.roc_figure(m, colors)),
            f"ROC curves of the attacks on {m['name']}",
            "ROC curves on log-log axes; the dashed diagonal is random guessing. What matters is the TPR at low FPR.",
        ),
        _figure(
            plots.png(lambda: plots.tradeoff_figure(m, colors)),
            f"Trade-off curve and audit points for {m['name']}",
            "Claimed (ε, δ) trade-off curve (Dong, Roth & Su 2022, Prop. 2.5), each audit's (FPR, FNR) at its "
            "threshold with its Clopper–Pearson box (formal or estimate, as labelled), and each formal one-run bound "
            "as the dash-dotted (ε, δ) curve at the bound, which the mechanism's true curve goes below somewhere. "
            "Square brackets: the threat model.",
        ),
    ]
    if any(figs):
        parts.append('<div class="figs">' + "".join(figs) + "</div>")
    parts.append("</section>")
    return "".join(parts)


def _environment(report: Mapping[str, Any]) -> str:
    run = report["run"]
    versions = [(k, _e(v if v is not None else F.DASH)) for k, v in report["generated_by"].items()]
    hashes = "<br>".join(f"<code>{_e(h)}</code>" for h in run["data_sha256"]) or F.DASH
    config = json.dumps(run["config"], indent=2, sort_keys=True, ensure_ascii=False)
    facts = _facts(
        [
            *versions,
            ("report schema", _e(report["schema_version"])),
            ("seed", _e(run["seed"] if run["seed"] is not None else F.DASH)),
            ("config sha256", f"<code>{_e(run['config_sha256'])}</code>"),
            ("data sha256", hashes),
        ]
    )
    details = f"<details><summary>Evaluation configuration</summary><pre>{_e(config)}</pre></details>"
    return f"<h2>Environment</h2>{facts}{details}"


def _explainer() -> str:
    items = "".join(f"<dt>{_e(t)}</dt><dd>{_e(text)}</dd>" for t, text in F.HOW_TO_READ)
    return f'<h2>How to read this</h2><div class="explainer"><dl>{items}</dl></div>'


def render_html(report: Mapping[str, Any]) -> str:
    """The report as a self-contained HTML page (header with verdict badges, summary, plots, details)."""
    colors = plots.attack_colors(report)
    models = report["models"]
    badges = "".join(_model_badge(m, m["name"]) for m in models)
    g = report["generated_by"]
    overview = [
        _figure(
            plots.png(lambda: plots.epsilon_figure(report)),
            "Claimed ε against the empirical lower bound per model",
            "Diamond: claimed ε (∞ without a claim). Arrow: the strongest formal lower bound (grey: no formal ε "
            "bound, the strongest estimate; a verdict from a formal test that bounds no ε, such as a refuted "
            "claimed curve or the noise check, is in the table), pointing up because the true ε is at least that; "
            "colour = verdict; "
            "a bound of 0 (nothing shown) is a hollow circle. Each bound names its threat model: a white-box bound "
            "and a black-box one are not comparable. Grey bars: the largest ε each audit could have certified.",
        ),
        _figure(
            plots.png(lambda: plots.privacy_utility_figure(report)),
            "Test accuracy against claimed ε",
            "Test (filled) and train (hollow) accuracy against the claimed ε, one point per model (separately "
            "trained models form no frontier); colour = verdict; a cross marks a claim a formal audit refuted, "
            "whose claimed ε is not its privacy. Non-private models at ∞.",
        ),
    ]
    body = [
        f"<header><h1>{_e(report['title'])}</h1>",
        f'<div class="meta">dpaudit {_e(g.get("dpaudit"))} · report schema {_e(report["schema_version"])} · '
        f"config sha256 <code>{_e(F.short_hash(report['run']['config_sha256']))}</code></div>",
        f'<div class="badges">{badges}</div></header>',
        "<h2>Summary</h2>",
        _summary_table(report),
        '<p class="meta">An empirical ε is a lower bound: the model leaks at least this much. '
        "Only a formal bound (canaries inserted at random, or independent training runs) can give a "
        "violation; “estimate” marks bounds from membership scores of the model's own members (not a formal "
        "test), shown beside the formal one.</p>",
        '<div class="figs">' + "".join(overview) + "</div>",
        _explainer(),
        "<h2>Models</h2>",
        *(_model_section(m, colors) for m in models),
        _environment(report),
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(report['title'])}</title><style>{_CSS}</style></head>"
        "<body><main>" + "".join(body) + "</main></body></html>\n"
    )
