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
        "| model | claimed ε | empirical ε lower bound (method, confidence) "
        "| best attack AUC | TPR@0.1% FPR | verdict |"
    )
    i = lines.index(header)
    assert lines[i + 1] == "|---|---|---|---|---|---|"
    assert lines[i + 2] == (
        "| nonprivate-mlp | ∞ (non-private) | ≥ 6.86 (gdp, 95%, estimate) "
        "| 0.875 (lira) | 0.312 (lira) | **VIOLATION** |"
    )
    assert lines[i + 3].startswith("| dpsgd-eps1 | 0.999 (δ = 1e-05) | ≥ 0 (gdp, 95%, estimate) |")
    assert lines[i + 3].endswith("| consistent |")
    assert lines[i + 4].endswith("| inconclusive |")


def test_markdown_details_show_attacks_audits_and_notes(report):
    text = render_markdown(report)
    for model in report["models"]:
        assert f"### {model['name']}" in text
    assert "| lira | 0.875 [0.855, 0.890] | 0.815 | 0.630 | 0.312 | 0.417 | 0.709 | 629 / 359 | 8 / 0 |" in text
    assert "| membership/lira | clopper-pearson | 95% | 2.25 | 1 | 4.43 | (0.00556, 0.657) | **VIOLATION** |" in text
    assert "inconclusive (vs. model claim)" in text
    assert "not a formal DP lower bound" in text  # the audit's notes are kept visible


def test_markdown_is_deterministic_and_escapes_text(report):
    assert render_markdown(report) == render_markdown(report)
    report["models"][0]["name"] = EVIL
    text = render_markdown(report)
    assert "<script>" not in text
    assert r"| x\|y \<script\>alert(" in text


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
    assert html_text.count('class="badge v-violation"') >= 2  # header badge, summary row, model heading
    assert '<span class="name">dpsgd-eps8:</span> inconclusive' in html_text
    assert "≥ 6.86 (gdp, 95%, estimate)" in html_text
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
    assert "demo-attack: fidelity 0.25" in render_markdown(r)
    if family == "inversion":  # one HTML rendering is enough
        assert "<h4>Model inversion attacks</h4><h4>demo-attack</h4>" in render_html(r)
