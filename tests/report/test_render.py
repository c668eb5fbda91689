"""Markdown and HTML renderings: content, escaping, self-containment, embedded images, determinism."""

from __future__ import annotations

import base64
import io
import re

import pytest
from PIL import Image

from dpaudit.report import build_report
from dpaudit.report.html import render_html
from dpaudit.report.markdown import render_markdown
from dpaudit.report.plots import png, privacy_utility_figure

EVIL = 'x|y <script>alert("1")</script> *b* https://evil.example'


def test_markdown_summary_table(report):
    text = render_markdown(report)
    lines = text.splitlines()
    header = (
        "| model | claimed ε | formal ε lower bound | estimate (not a formal test) "
        "| best attack AUC | TPR@0.1% FPR | verdict |"
    )
    i = lines.index(header)
    assert lines[i + 1] == "|---|---|---|---|---|---|---|"
    assert lines[i + 2] == (
        "| nonprivate-mlp | ∞ (non-private) | ≥ 3.94 \\[black-box, one run\\] (canaries, one-run, 95%) "
        "| ≥ 6.59 \\[black-box, model's members\\] (lira, gdp, 95%) "
        "| 0.875 (lira) | n/a: needs ≥ 1000 non-members (359 here) | leaks: ε ≥ 3.94 shown (black-box, one run) |"
    )
    # The claim prints as the notes print it (one rounding everywhere).
    assert lines[i + 3].startswith("| dpsgd-eps1 | 0.9987 (δ = 1e-05) | ≥ 0 \\[black-box, one run\\] (canaries")
    assert lines[i + 3].endswith("| consistent |")
    assert lines[i + 4].endswith("| inconclusive |")
    assert lines[i + 6].startswith("- nonprivate-mlp: leaks: ε ≥ 3.94 shown (formal, canaries")


def test_markdown_details_show_attacks_audits_and_notes(report):
    text = render_markdown(report)
    for model in report["models"]:
        assert f"### {model['name']}" in text
    assert (
        "| lira | 0.875 [0.855, 0.890] | 81.5% | 0.630 | n/a: needs ≥ 1000 non-members | 41.7% | 70.9% "
        "| 629 / 359 | 8 / 0 |"
    ) in text
    assert (
        "| membership/lira | clopper-pearson | 95% | 2.49 | 1 | 4.44 | (0.556%, 57.5%) | estimate exceeds claim "
        "| estimate (black-box, model's members) |"
    ) in text
    assert (
        "| membership/canaries | one-run | 95% | 3.94 | — | 5.11 | — | no verdict | formal (black-box, one run) |"
    ) in text
    assert "not independent runs" in text  # the audit's notes are kept visible


def test_markdown_is_deterministic_and_escapes_text(report):
    assert render_markdown(report) == render_markdown(report)
    report["models"][0]["name"] = EVIL
    text = render_markdown(report)
    assert "<script>" not in text
    assert r"| x\|y \<script\>alert(" in text


NOTES_WITH_CODE = [
    "design too small; `dpaudit audit plan --epsilon 8 --delta 1e-05` gives the size <needed> for *this* claim",
    "a stranger's `<img src=x onerror=alert(1)>` and *bold* <script>alert(2)</script> [link](javascript:x)",
    "odd ` <b>three</b> `` left",  # unbalanced or blank spans: the whole note stays escaped text
    "a blank `` *pair* `` stays text",
]


def test_markdown_notes_show_commands_as_code_and_every_other_text_escaped(report):
    """A note's `command` renders as a code span (not as escaped backticks), while a stranger's text, inside or
    outside backticks, renders as text: rendered by a CommonMark parser with raw HTML on, as GitHub reads it."""
    from markdown_it import MarkdownIt

    report["models"][0]["audits"][0]["notes"] = NOTES_WITH_CODE
    text = render_markdown(report)
    html = MarkdownIt("commonmark").render(text)
    assert "<code>dpaudit audit plan --epsilon 8 --delta 1e-05</code> gives the size &lt;needed&gt; for *this*" in html
    assert "<code>&lt;img src=x onerror=alert(1)&gt;</code> and *bold* &lt;script&gt;alert(2)&lt;/script&gt;" in html
    assert "odd ` &lt;b&gt;three&lt;/b&gt; `` left" in html and "a blank `` *pair* `` stays text" in html
    for tag in ("<img", "<script", "<b>", "<a ", "<em>this", "<em>bold"):
        assert tag not in html, tag


def test_html_notes_show_commands_as_code_and_every_other_text_escaped(report):
    model = report["models"][0]
    model["audits"][0]["notes"] = NOTES_WITH_CODE
    page = render_html(build_report([model], title="t"))
    assert "<code>dpaudit audit plan --epsilon 8 --delta 1e-05</code> gives the size &lt;needed&gt;" in page
    assert "<code>&lt;img src=x onerror=alert(1)&gt;</code>" in page
    assert "odd ` &lt;b&gt;three&lt;/b&gt; `` left" in page and "a blank `` *pair* `` stays text" in page
    assert "<img src=x" not in page and "<b>three" not in page


def test_html_is_self_contained(html_text):
    lowered = html_text.lower()
    for needle in ("http://", "https://", "//cdn", 'src="http', "src='http", "url(", "@import", "<script", "<link"):
        assert needle not in lowered, needle
    assert re.findall(r'\ssrc="([^"]*)"', html_text)  # there are images ...
    assert all(src.startswith("data:image/png;base64,") for src in re.findall(r'\ssrc="([^"]*)"', html_text))
    assert all(h.startswith("#") for h in re.findall(r'\shref="([^"]*)"', html_text))  # ... and no links out
    assert "Content-Security-Policy" in html_text


def test_every_embedded_image_decodes_as_png(html_text, report):
    sources = re.findall(r'src="data:image/png;base64,([^"]+)"', html_text)
    assert len(sources) == 2 + 2 * len(report["models"])  # ε and privacy-utility; ROC and trade-off per model
    for data in sources:
        image = Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
        image.load()
        assert image.format == "PNG"
        assert image.size[0] >= 400 and image.size[1] >= 300


def test_html_shows_summary_badges_explainer_and_environment(html_text, report):
    assert html_text.count('class="badge v-consistent"') >= 3  # header badge, summary row, model heading
    assert '<span class="name">dpsgd-eps8:</span> inconclusive' in html_text
    assert '<span class="name">nonprivate-mlp:</span> leaks: ε ≥ 3.94 shown' in html_text
    assert (
        "≥ 6.59 [black-box, model&#x27;s members] (lira, gdp, 95%)" in html_text
        and "estimate (not a formal test)" in html_text
    )
    assert 'class="badge v-estimate-exceeds-claim"' in html_text
    assert "How to read this" in html_text and "lower bound" in html_text
    assert report["generated_by"]["numpy"] in html_text
    assert report["run"]["config_sha256"] in html_text


def test_html_escapes_report_text(report):
    model = report["models"][0]
    model["name"] = EVIL
    model["audits"][0]["notes"] = ["<img src=x onerror=alert(1)>"]
    model["attacks"]["membership"][0]["attack"] = "</td><script>"
    page = render_html(build_report([model], title="<b>title</b>"))
    assert "<td><script>" not in page
    assert "<script>alert" not in page
    assert "<img src=x" not in page
    assert "&lt;script&gt;alert(&quot;1&quot;)&lt;/script&gt;" in page
    assert "<title>&lt;b&gt;title&lt;/b&gt;</title>" in page


def test_html_is_deterministic(html_text, _fixture_report):
    assert render_html(_fixture_report) == html_text


def test_png_bytes_are_deterministic_and_carry_no_software_tag(report):
    a = png(lambda: privacy_utility_figure(report))
    assert a == png(lambda: privacy_utility_figure(report))
    assert a.startswith(b"\x89PNG") and b"matplotlib" not in a.lower()


def test_renderers_cope_with_minimal_models(report):
    """No attacks, no audits, no claim: tables say so and the plots that have nothing to show are left out."""
    m = report["models"][0]
    bare = {k: m[k] for k in ("name", "path", "model", "data", "training", "utility")}
    bare |= {"claim": None, "attacks": {"membership": None}, "audits": []}
    r = build_report([bare], title="bare")
    assert "No audits." in render_markdown(r)
    page = render_html(r)
    assert "No audits." in page
    assert page.count("data:image/png;base64,") == 2  # only the report-level figures


@pytest.mark.parametrize("family", ["inversion", "cloak"])
def test_later_families_are_rendered_generically(report, family):
    m = dict(report["models"][1])
    m["attacks"] = {**m["attacks"], family: [{"attack": "demo-attack", "fidelity": 0.25}]}
    r = build_report([m], title="t")
    assert "demo-attack: fidelity 25.0%" in render_markdown(r)  # a rate, as a percentage (_format.scalar_text)
    if family == "inversion":  # one HTML rendering is enough
        assert "<h4>Model inversion attacks</h4><h4>demo-attack</h4>" in render_html(r)
