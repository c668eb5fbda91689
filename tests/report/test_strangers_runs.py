"""Reports from strangers' runs and report.json files: names that are markup, one answer in every format, and
one-line refusals of a report.json whose parts the renderers cannot read.

Planted and caught here (each test says which): mathtext left on in the figures (a run folder named "$x^$" stopped
the whole report with matplotlib's ValueError); a ROC legend that drops a "_"-named attack; the summary row printing
its bound without :func:`dpaudit.numfmt.ordered` ("≥ 7.99 | claimed 7.99996 | violation"); the trade-off plot's
labels doing the same; the noise check's upper bound rounded to nearest ("1" for 0.99996, beside a rejection); the
schema's old tpr_at_fpr key pattern and untyped family results (tracebacks from a report.json); the ε figure's axis
overflowing at a finite ε near the float maximum.
"""

from __future__ import annotations

import copy
import html
import re
from decimal import Decimal
from html.parser import HTMLParser

import pytest

from dpaudit.errors import InputError
from dpaudit.report import _data as data
from dpaudit.report.build import build_report, validate_report
from dpaudit.report.html import render_html
from dpaudit.report.markdown import render_markdown
from dpaudit.report.plots import epsilon_figure, png, roc_figure

CLAIM, BOUND = 7.999954, 7.999957  # a formal bound just above the claim: rounding alone prints "7.99 < 7.99996"


def _near_tie(report: dict, formal: bool = True) -> dict:
    """The fixture's ε = 8 model with its formal (one-run) audit a violation by 3e-6 (or, ``formal`` False, its
    strongest estimate above the claim by as much)."""
    m = copy.deepcopy(report["models"][2])
    m["claim"]["epsilon"] = CLAIM
    for a in m["audits"]:
        a["claimed_epsilon"] = CLAIM
    if formal:
        audit = next(a for a in m["audits"] if a["formal"])
        audit.update(epsilon_lower_bound=BOUND, verdict="violation", max_certifiable_epsilon=9.0)
    else:
        audit = next(a for a in m["audits"] if not a["formal"])
        audit.update(epsilon_lower_bound=BOUND, verdict="estimate-exceeds-claim")
    return m


class _Rows(HTMLParser):
    """The text of each row of the page's first table (the summary), cells unescaped."""

    def __init__(self) -> None:
        super().__init__()
        self.tables, self.rows, self.cell = 0, [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables += 1
        elif tag == "tr" and self.tables == 1:
            self.rows.append([])
        elif tag in ("td", "th") and self.tables == 1:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(" ".join(self.cell.split()))
            self.cell = None

    def handle_data(self, text):
        if self.cell is not None:
            self.cell += text


def _md_rows(text: str) -> list[list[str]]:
    """The summary table of a Markdown report, cells unescaped (backslash escapes removed)."""
    lines = text.split("## Summary\n\n", 1)[1].splitlines()
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line)[1:-1]
        rows.append([re.sub(r"\\(.)", r"\1", c).strip() for c in cells])
    return [rows[0], *rows[2:]]  # header, then the models (the |---| line dropped)


def _eps(cell: str, before: str = "≥ ") -> Decimal | None:
    m = re.search(re.escape(before) + r"([0-9.e+-]+)", cell)
    return Decimal(m.group(1)) if m else None


def test_one_answer_in_json_markdown_and_html(report, monkeypatch):
    """Every summary cell reads the same in Markdown and HTML; each ε printed is on the safe side of the JSON's
    number (claim ≥, bound ≤) and the printed bound and claim compare as the verdict says. Planted: the summary
    cell's bound without numfmt.ordered (shows "≥ 7.99" beside "7.99996" and VIOLATION)."""
    monkeypatch.setattr("dpaudit.report.html.plots.png", lambda make: None)  # tables only (figures: below)
    r = build_report([*report["models"], _near_tie(report, formal=False), _near_tie(report)], title="t")
    md_rows, page = _md_rows(render_markdown(r)), _Rows()
    page.feed(render_html(r))
    for row in md_rows:  # Markdown stresses a violation as **VIOLATION**, HTML with a red badge
        row[-1] = row[-1].strip("*").lower()
    assert md_rows == page.rows and len(md_rows) == 1 + len(r["models"])
    for row, m in zip(md_rows[1:], r["models"], strict=True):
        s = m["summary"]
        name, claimed, formal, estimate, auc = row[:5]
        assert name == m["name"]
        if m["claim"] is not None:
            c = Decimal(claimed.split(" ")[0])
            assert c >= Decimal(m["claim"]["epsilon"]) or float(c) == m["claim"]["epsilon"]
        for cell, digest in ((formal, s["formal"]), (estimate, s["estimate"])):
            if digest is None:
                continue
            b = _eps(cell)
            assert b <= Decimal(digest["epsilon_lower_bound"]) or float(b) == digest["epsilon_lower_bound"], cell
            if m["claim"] is not None and digest is s["formal"]:
                assert (b > c) == (digest["verdict"] == "violation"), (cell, claimed, digest["verdict"])
        assert auc.split(" ")[0] == f"{s['best_auc']:.3f}"
        for cell in (formal, estimate):  # the headline under the table prints the same bounds
            if cell != "—":
                assert re.search(re.escape(f"ε ≥ {cell.split(' ')[1]}") + "(?![0-9])", s["headline"]), cell
    assert md_rows[-1][-1] == "violation" and "7.999957" in md_rows[-1][2] and md_rows[-1][1].startswith("7.999954")


def test_plot_labels_show_the_violation_as_the_table_does(report):
    """The trade-off plot's claim and bound labels compare as the numbers do. Planted: numfmt.lower(lb) in the
    label (prints "not (7.99, δ = 1e-05)-DP" beside "claimed ε = 7.99996")."""
    layers = data.tradeoff_layers(build_report([_near_tie(report)], title="t")["models"][0])
    claim = Decimal(re.search(r"claimed ε = (\S+),", layers["claims"][0]["label"]).group(1))
    (bound,) = [b for b in layers["formal_bounds"] if b["verdict"] == "violation"]
    assert Decimal(re.search(r"not \((\S+), δ", bound["label"]).group(1)) > claim


def test_names_are_drawn_literally_not_as_mathtext(report):
    """A run folder, attack or class name with dollar signs is a name, not TeX. Planted: text.parse_math left on
    (matplotlib raised ValueError on "$x^$" and the whole report failed)."""
    m = copy.deepcopy(report["models"][0])
    m["name"] = "run $x^$ {1}"
    m["attacks"]["membership"][0]["attack"] = "lira $\\frac{1$"
    page = render_html(build_report([m], title="$x^$"))
    assert "run $x^$ {1}" in html.unescape(page)


def test_an_attack_named_with_an_underscore_keeps_its_legend_entry(report):
    """Planted: ax.legend() without handles (matplotlib drops labels that start with "_")."""
    m = copy.deepcopy(report["models"][1])
    m["attacks"]["membership"][0]["attack"] = "_plugin"
    fig = roc_figure(m, {})
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(label.startswith("_plugin (AUC") for label in labels), labels


def test_noise_upper_bound_is_rounded_up_and_compared_with_one():
    """A group is rejected exactly when its upper bound on noise std / σC is below 1. Planted: ".4g" (to nearest)
    printed 0.99996 as "1" beside a rejection."""
    from dpaudit.report._format import noise_rows

    group = {"name": "w", "dof": 10, "ratio": 0.5, "ratio_upper": 0.99996, "p_value": 0.01, "resolvable_ratio": 0.77777}
    (row,) = noise_rows({"groups": [group]})
    assert Decimal(row[3]) < 1 and Decimal(row[3]) >= Decimal("0.99996")
    assert row[5] == "0.7777"  # what it resolves: rounded down, never more power than it has
    (row,) = noise_rows({"groups": [{**group, "ratio_upper": 1.00004}]})
    assert Decimal(row[3]) > 1


def _set(path: str, value):
    """A change of the report: set the value at ``path`` ("models/0/claim/epsilon"; numbers index lists)."""

    def key(node, k):
        return int(k) if isinstance(node, list) else k

    def change(r):
        *parents, last = path.split("/")
        node = r
        for p in parents:
            node = node[key(node, p)]
        node[key(node, last)] = value

    return change


M0 = "models/0"
HOSTILE = {
    "FPR key '..'": _set(f"{M0}/attacks/membership/0/tpr_at_fpr/..", 0.5),
    "FPR key '0'": _set(f"{M0}/attacks/membership/0/tpr_at_fpr/0", 0.5),
    "FPR key 1e-400": _set(f"{M0}/attacks/membership/0/tpr_at_fpr/1e-400", 0.5),
    "ROC of unequal lengths": _set(f"{M0}/attacks/membership/0/roc", {"fpr": [0.1, 0.2], "tpr": [0.5]}),
    "audit details not an object": _set(f"{M0}/audits/0/details", "x"),
    "refutation not an object": _set(f"{M0}/audits/0/refutation", "x"),
    "PATE recipe not an object": _set(f"{M0}/training/aggregation", {"recipe": 5}),
    "data-dependent ε not a number": _set("models/1/claim/data_dependent", {"epsilon": "x"}),
    "inversion of the wrong size": _set(
        f"{M0}/attacks/inversion", [{"attack": "mi-face", "feature_shape": [8, 8], "inversions": [[0.0] * 63]}]
    ),
    "cloak σ map of the wrong size": _set(
        f"{M0}/attacks/cloak", [{"attack": "cloak", "feature_shape": [2, 2], "sigma_map": [1.0, 2.0, 3.0]}]
    ),
    "extraction curve without fidelity": _set(
        f"{M0}/attacks/extraction", [{"attack": "x", "curve": [{"queries": 1, "fidelity": 0.5}, {"queries": 2}]}]
    ),
    "ICL setting ε not a number": _set(
        f"{M0}/attacks/icl",
        [{"attack": "icl", "settings": [{"epsilon": "x", "auc": 0.5, "canary_epsilon_lower_bound": 0}]}],
    ),
    "noise ratio not a number": _set(
        f"{M0}/noise_checks",
        [
            {
                "noise_std": 1,
                "alpha": 0.05,
                "formal": True,
                "verdict": "consistent",
                "variance_p_value": 0.5,
                "statement": "s",
                "groups": [{"name": "g", "dof": 1, "ratio": "x", "p_value": 1}],
            }
        ],
    ),
}


@pytest.mark.parametrize("change", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_report_json_the_renderers_cannot_read_is_refused_in_one_line(report, change):
    """Each of these passed validation and then stopped the renderer with a traceback (ValueError, KeyError,
    ZeroDivisionError, ...). Planted: the schema before (tpr_at_fpr keys "^[0-9.eE+-]+$", family results untyped)."""
    change(report)
    with pytest.raises(InputError, match=r"^invalid report: report\.models\[[01]\]") as e:
        validate_report(report)
    assert "\n" not in str(e.value)


def test_the_epsilon_figure_draws_an_epsilon_near_the_float_maximum(report):
    """Planted: the axis limit top × 2.6 uncapped (inf: "Axis limits cannot be NaN or Inf")."""
    m = copy.deepcopy(report["models"][1])
    m["claim"]["epsilon"] = 1e308
    fig = epsilon_figure(build_report([m], title="t"))
    assert fig.axes[0].get_xlim()[1] < float("inf")
    assert png(lambda: fig).startswith(b"\x89PNG")


def test_bidi_and_control_characters_in_a_name_are_written_out(report, monkeypatch):
    """A right-to-left override in a run name reversed, on screen, the rest of its line: the headline's numbers
    after it ("21" for 12). Planted: _e / md without dpaudit.report._data.visible."""
    monkeypatch.setattr("dpaudit.report.html.plots.png", lambda make: None)
    m = copy.deepcopy(report["models"][0])
    m["name"] = "run\u202e\x1b[2J\u2066"
    r = build_report([m], title="t\u202e")
    for text in (render_markdown(r), render_html(r)):
        assert not re.search("[\u202e\u2066\x1b]", text)
        assert "run⟨U+202E⟩⟨U+001B⟩" in text and "⟨U+2066⟩" in text


def test_figures_write_out_what_their_font_cannot_draw(report):
    """Two runs named in Chinese were the same row of empty boxes on the ε figure (and matplotlib warned once per
    character). Planted: drawable() returning the text as it is."""
    import warnings

    from dpaudit.report.plots import drawable

    assert drawable("模型 A") == "⟨U+6A21⟩⟨U+578B⟩ A" and drawable("ε ≥ 0.5 → δ") == "ε ≥ 0.5 → δ"
    m = copy.deepcopy(report["models"][1])
    m["name"] = "模型"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Glyph 27169 missing from font(s)" is a UserWarning
        fig = roc_figure(m, {})
        assert png(lambda: fig).startswith(b"\x89PNG")
    assert fig.axes[0].get_title() == "ROC: ⟨U+6A21⟩⟨U+578B⟩"


def test_a_confidence_level_is_never_shown_as_more_certainty_than_it_has():
    """--confidence 0.9999999 printed "100% confidence" (format :g rounds to nearest). Planted: percent() and the
    headline back on 100 * c :g; audit summaries on confidence :g ("confidence 1")."""
    from dpaudit.audit import AuditResult
    from dpaudit.report._format import percent
    from dpaudit.workflows.result import headline

    assert [percent(c) for c in (0.95, 0.57, 0.999, 0.9999999)] == ["95%", "57%", "99.9%", "99.9999%"]
    audit = {
        "source": {"family": "membership", "attack": "canaries", "index": None}, "method": "one-run",
        "confidence": 0.9999999, "formal": True, "epsilon_lower_bound": 2.0, "max_certifiable_epsilon": 3.0,
        "claimed_epsilon": 1.0, "verdict": "violation", "threat_model": "black-box, one run",
    }  # fmt: skip
    assert "99.9999% confidence" in headline([audit], {"epsilon": 1.0, "delta": 1e-5}).text
    result = AuditResult(
        epsilon_lower_bound=2.0, method="one-run", design="canaries", confidence=0.9999999, delta=1e-5,
        claimed_epsilon=1.0, verdict="violation", formal=True, max_certifiable_epsilon=3.0,
        threshold_selection="x", threshold=None, counts=None,
    )  # fmt: skip
    assert "confidence 0.999999," in result.summary()


def test_a_family_results_delta_is_shown_as_given():
    """Planted: δ through numfmt.upper in scalar_text (1/70000 printed as 1.42858e-05, another δ)."""
    from dpaudit.report._format import scalar_text

    assert scalar_text("delta", 1 / 70000) == "1.4285714285714285e-05"
    assert scalar_text("jl_accountant_claim", 7.999954) == "7.99996"


@pytest.mark.parametrize("names", [["a", "a", "a #2"], ["a #2", "a", "a"], ["a", "a", "a"]])
def test_merged_models_get_names_no_other_model_has(report, names):
    """Planted: " #<count>" without looking at the names already taken (two "a" beside an "a #2" gave two "a #2")."""
    models = [copy.deepcopy(report["models"][0]) for _ in names]
    for m, name in zip(models, names, strict=True):
        m["name"] = name
    shown = [m["name"] for m in build_report(models, title="t")["models"]]
    assert len(set(shown)) == len(shown) and shown[0] == names[0], shown


def test_a_long_run_name_does_not_squeeze_the_epsilon_figure(report):
    """A 100-character run folder name left the ε figure's axes no room ("constrained_layout not applied"). Planted:
    the full name as the row label."""
    import warnings

    from dpaudit.report.plots import short_name

    name = "dpsgd_eps8_digits_mlp_lr0.5_clip1_batch64_seed0_" * 2 + "variantB"
    assert short_name(name) == "dpsgd_eps8_digits_m…tch64_seed0_variantB" and len(short_name(name)) == 40
    models = copy.deepcopy(report["models"])
    models[0]["name"] = name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert png(lambda: epsilon_figure(build_report(models, title="t"))).startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("formal", "bound", "verdict"),
    [
        (True, 5.0, "consistent"),
        (True, 0.5, "violation"),
        (False, 5.0, "violation"),
        (True, 5.0, "estimate-exceeds-claim"),
    ],
)
def test_a_verdict_that_contradicts_its_own_numbers_is_refused(report, formal, bound, verdict):
    """A report.json from elsewhere whose audit says "consistent" beside ε ≥ 5 > claimed 1 printed just that.
    Planted: build without dpaudit.workflows.result.check_verdict."""
    m = copy.deepcopy(report["models"][1])
    m["audits"][0].update(formal=formal, epsilon_lower_bound=bound, claimed_epsilon=1.0, verdict=verdict)
    with pytest.raises(InputError, match=r"^model 'dpsgd-eps1': audit .* reads '.*', but its bound .* claimed ε 1: "):
        build_report([m], title="t")
    m["audits"][0]["verdict"] = ("violation" if formal else "estimate-exceeds-claim") if bound > 1 else "consistent"
    build_report([m], title="t")  # the verdict its numbers give is accepted


def test_an_inconclusive_audit_row_shows_its_power_below_the_claim(report):
    """Claimed 7.9995, the design certifies at most 7.9991 (inconclusive): the row read "7.9995 | 8". Planted: the
    max certifiable ε at 3 digits, rounded up, without looking at the claim."""
    from dpaudit.report._format import audit_eps

    m = copy.deepcopy(report["models"][2])
    audit = next(a for a in m["audits"] if a["formal"])
    audit.update(
        claimed_epsilon=7.9995, epsilon_lower_bound=1.2, max_certifiable_epsilon=7.9991, verdict="inconclusive"
    )
    assert audit_eps(audit) == ("1.2", "7.9995", "7.9991")
    assert "| 1.2 | 7.9995 | 7.9991 |" in render_markdown(build_report([m], title="t"))


def test_a_verdict_no_rule_gives_is_refused_naming_the_file_and_the_entry(report, tmp_path):
    """A hand-edited report.json whose formal audit reads "curve-refuted" but refutes no curve passed check_verdict
    (it had no rule for it) and the headline printed it under the "inconclusive" text. Planted: check_verdict
    without its rule for verdicts it cannot decide."""
    import json

    from dpaudit.report.build import load_report

    m = report["models"][1]
    audit = next(a for a in m["audits"] if a["formal"] and not a.get("refutation"))
    audit["verdict"] = "curve-refuted"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    with pytest.raises(InputError) as e:
        load_report(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: model {m['name']!r}: audit ")
    assert f"/ {audit['method']} reads 'curve-refuted', which refutes no curve (no refutation)" in msg
    with pytest.raises(InputError, match="refutes no curve"):
        build_report([m], title="t")
