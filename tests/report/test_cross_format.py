"""One report, three formats and the console, one reading: every ε the Markdown and the HTML print is the JSON's
number rounded in its safe direction (a claim and a max certifiable ε up, a lower bound down), the printed numbers
compare as the verdict says (a violation's bound above the claim, an inconclusive design's max certifiable ε at or
below it), the two formats print the same text for each, the headline and the console line print the row's claim,
verdict words agree, every estimate is labelled one, and neither prints nan or -0. A checker over the hand-made
fixture (violation, consistent, inconclusive) and over the fixture with a claim that needs more than 6 digits
beside its bounds (the headline then printed "claimed 2" under the row's "1.9999954", and so did `dpaudit report`'s
console line)."""

from __future__ import annotations

import html as H
import re
from decimal import Decimal
from typing import Any

from dpaudit.report import _format as F
from dpaudit.report.build import build_report
from dpaudit.report.html import _audits, _summary_table
from dpaudit.report.markdown import render_markdown


def _up(text: str, x: Any) -> bool:
    """``text`` is ``x`` rounded up: at or above it, or its own short decimal (dpaudit.numfmt's stated exception)."""
    return Decimal(text) >= Decimal(float(x)) or float(text) == float(x)


def _down(text: str, x: Any) -> bool:
    return Decimal(text) <= Decimal(float(x)) or float(text) == float(x)


def _md_rows(md: str, header: str) -> list[list[list[str]]]:
    """Every Markdown table whose header starts with ``header``: its rows' cells, unescaped."""
    lines, tables = md.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith(header):
            rows, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([re.sub(r"\\(.)", r"\1", c).strip() for c in lines[j].strip().strip("|").split(" | ")])
                j += 1
            tables.append(rows)
    return tables


def _html_rows(fragment: str) -> list[list[str]]:
    """The body rows of an HTML table, each cell's text (tags dropped, a <br> as a space)."""
    body = fragment.split("<tbody>", 1)[1]
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", body):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", tr)
        rows.append([" ".join(H.unescape(re.sub(r"<[^>]+>", " ", c.replace("<br>", " "))).split()) for c in cells])
    return rows


def _ordered(verdict: str | None, bound: str, claim: str, most: str | None) -> list[str]:
    """What the printed numbers must say for the verdict they sit beside."""
    b, c = Decimal(bound), Decimal(claim)
    wrong = []
    if verdict in ("violation", "estimate-exceeds-claim") and not b > c:
        wrong.append(f"{verdict} but ε ≥ {bound} is not above claimed {claim}")
    if verdict in ("consistent", "inconclusive") and b > c:
        wrong.append(f"{verdict} but ε ≥ {bound} is above claimed {claim}")
    if most not in (None, F.DASH):
        m = Decimal(most)
        if verdict == "inconclusive" and m > c:
            wrong.append(f"inconclusive but max certifiable {most} is above claimed {claim}")
        if verdict == "consistent" and not m > c:
            wrong.append(f"consistent but max certifiable {most} is not above claimed {claim}")
    return wrong


def cross_check(report: dict[str, Any]) -> list[str]:
    """Each way the Markdown and HTML renderings of ``report`` disagree with its JSON or with each other."""
    md = render_markdown(report)
    problems = []
    for name, text in (("md", md), ("html", H.unescape(re.sub(r"<[^>]+>", " ", _summary_table(report))))):
        for bad in (r"\bnan\b", r"(?<![\w.])[-−]0(?![\w.])"):
            problems += [f"{name} prints {m.group()!r}" for m in re.finditer(bad, text)]
    (md_rows,) = _md_rows(md, "| model | claimed ε")
    html_rows = _html_rows(_summary_table(report))
    console = "\n".join(F.console_summary(report))  # what `dpaudit report` and `dpaudit demo` print
    for m, row, hrow in zip(report["models"], md_rows, html_rows, strict=True):
        s, who = m["summary"], m["name"]
        if row != hrow:
            problems.append(f"{who}: summary row differs: md {row} vs html {hrow}")
        if F.verdict_label(m) != row[6].strip("*").lower() and row[6] != f"**{F.verdict_label(m).upper()}**":
            problems.append(f"{who}: verdict cell {row[6]!r} vs {F.verdict_label(m)!r}")
        claimed = row[1].split(" (δ")[0]
        if m["claim"] is not None and not _up(claimed, m["claim"]["epsilon"]):
            problems.append(f"{who}: claim {claimed} below {m['claim']['epsilon']}")
        for col, kind in ((2, "formal"), (3, "estimate")):
            if s[kind] is None:
                continue
            bound = re.match(r"≥ (\S+)", row[col]).group(1)
            if not _down(bound, s[kind]["epsilon_lower_bound"]):
                problems.append(f"{who}: {kind} bound {bound} above {s[kind]['epsilon_lower_bound']}")
            if m["claim"] is not None:
                problems += [f"{who} row: {w}" for w in _ordered(s[kind]["verdict"], bound, claimed, None)]
        said = re.search(r"claimed (\S+) ", s["headline"])
        if m["claim"] is not None and said and said.group(1) != claimed:
            problems.append(f"{who}: headline claims {said.group(1)}, row {claimed}")
        if m["claim"] is not None and f"{who} (claimed ε {row[1]}): " not in console:
            problems.append(f"{who}: the console's claim differs from the row's {row[1]!r}: {console}")
        if f"- {who}: {s['headline']}" not in md.replace("\\", ""):
            problems.append(f"{who}: headline missing from the Markdown")
    md_audits = iter(_md_rows(md, "| attack | method | confidence | ε lower bound"))
    for m in (m for m in report["models"] if m["audits"]):
        rows, hrows = next(md_audits), _html_rows(_audits(m["audits"]))
        for a, row, hrow in zip(m["audits"], rows, hrows, strict=True):
            who = f"{m['name']} / {a['source']['attack']} / {a['method']}"
            bound, claim, most = row[3:6]
            if [bound, claim, most] != hrow[2:5]:
                problems.append(f"{who}: md {row[3:6]} vs html {hrow[2:5]}")
            if not _down(bound, a["epsilon_lower_bound"]):
                problems.append(f"{who}: bound {bound} above {a['epsilon_lower_bound']}")
            if a.get("max_certifiable_epsilon") is not None and not _up(most, a["max_certifiable_epsilon"]):
                problems.append(f"{who}: max certifiable {most} below {a['max_certifiable_epsilon']}")
            if a.get("claimed_epsilon") is not None:
                claim = claim.removesuffix(" (one step)")
                if not _up(claim, a["claimed_epsilon"]):
                    problems.append(f"{who}: claim {claim} below {a['claimed_epsilon']}")
                problems += [f"{who}: {w}" for w in _ordered(a["effective_verdict"], bound, claim, most)]
            if not a["formal"] and "estimate" not in row[8]:
                problems.append(f"{who}: an estimate labelled {row[8]!r}")
            said = F.VERDICT_TEXT[a["effective_verdict"]]
            if row[7].strip("*").lower().split(" (vs")[0] != said or not hrow[8].startswith(said):
                problems.append(f"{who}: verdict md {row[7]!r}, html {hrow[8]!r}, JSON {a['effective_verdict']!r}")
    return problems


def test_the_fixture_reads_alike_in_json_markdown_and_html(report):
    assert cross_check(report) == []


def test_a_claim_with_many_digits_reads_alike_everywhere(report):
    """The ε = 1 model's claim set to 1.9999954 with an estimate of 1.999996 above it: the claim needs 8 digits
    beside that estimate. Before, the headline printed "claimed 2" (its formal pair alone) under a row's
    "1.9999954", and "2" above an estimate said to exceed it."""
    models = report["models"]
    claim = 1.9999954
    models[1]["claim"]["epsilon"] = claim
    for a in models[1]["audits"]:
        a["claimed_epsilon"] = claim
        if a["source"]["attack"] == "loss":
            a["epsilon_lower_bound"], a["verdict"] = 1.999996, "estimate-exceeds-claim"
    rebuilt = build_report(models, title=report["title"], config=report["run"]["config"])
    assert cross_check(rebuilt) == []
