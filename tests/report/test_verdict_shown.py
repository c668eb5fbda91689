"""Issue 29 item 2: the report shows what decided each verdict, in the JSON its plots are drawn from.

The first test runs the demo's own pipeline (its planted-bug model and its DP-ICL model, tiny settings) and
checks the report.json it writes; the others are fast unit tests on hand-made entries, each with the
mistake it guards against planted beside it.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import re

import numpy as np
import pytest

from dpaudit.report import _data as data
from dpaudit.report import plots
from dpaudit.report._format import training_text
from dpaudit.report.build import build_report, load_report, render
from dpaudit.report.markdown import render_markdown

from .conftest import FIXTURE


def _formal_on_plot(model: dict) -> bool:
    """Whether the audit behind the model's verdict (its summary's formal digest) is on its trade-off plot,
    labelled formal and with its verdict."""
    digest = model["summary"]["formal"]
    layers = data.tradeoff_layers(model)
    shown = [x for x in layers["points"] + layers["formal_bounds"] if x["audit_index"] == digest["audit_index"]]
    return any(x["formal"] and x["verdict"] == digest["verdict"] and "formal" in x["label"] for x in shown)


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    """The demo's planted-bug model and its DP-ICL model, through the demo's pipeline on tiny settings."""
    import dpaudit.demo as demo

    settings = demo.DemoSettings(
        epochs=2, dp_epochs=4, reference_models=2, attacks=("loss",), extraction_budget=0, icl=True
    )
    full = {m.name: m for m in demo.demo_models(settings)}
    out = tmp_path_factory.mktemp("demo") / "demo"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo, "QUICK", settings)
        mp.setattr(demo, "demo_models", lambda s: [full["dp-sgd-eps2-planted-bug"]])
        demo.run_demo(out, quick=True)
    return out


@pytest.mark.slow  # the demo's pipeline: DP-SGD with 1000 white-box canaries and a DP-ICL model (~1.5 min)
def test_demo_report_shows_the_formal_audit_behind_each_verdict(demo_report):
    report = load_report(demo_report / "report.json")
    models = {m["name"]: m for m in report["models"]}
    bug = models["dp-sgd-eps2-planted-bug"]
    assert bug["summary"]["verdict"] == "violation"
    assert _formal_on_plot(bug)  # the planted bug's plot carries its formal violation, not estimate boxes only
    (bound,) = [b for b in data.tradeoff_layers(bug)["formal_bounds"] if b["verdict"] == "violation"]
    assert bound["drawn"] and bound["threat_model"] == "white-box, one run" and "VIOLATION" in bound["label"]

    icl = models["dp-icl-eps8"]
    formal = icl["summary"]["formal"]
    assert formal is not None and formal["attack"] == "icl-canaries"  # the row uses the ICL canary audit
    assert "no formal audit" not in icl["summary"]["headline"]
    audit = icl["audits"][formal["audit_index"]]
    assert audit["formal"] and audit["source"]["family"] == "icl"
    private = icl["attacks"]["icl"][0]["settings"][-1]["canary_audit"]
    assert audit["epsilon_lower_bound"] == private["epsilon_lower_bound"]  # the same audit the ICL section shows
    assert "epochs" not in training_text(icl["training"]) and "teachers 40" in training_text(icl["training"])

    # report.json is what the plots are drawn from: rendering the JSON alone gives the written pages.
    files = render(report, ("md", "html"))
    assert files["report.html"] == (demo_report / "report.html").read_text(encoding="utf-8")
    assert files["report.md"] == (demo_report / "report.md").read_text(encoding="utf-8")
    colors = plots.attack_colors(report)
    tradeoff = plots.png(lambda: plots.tradeoff_figure(bug, colors))
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', files["report.html"])
    assert base64.b64encode(tradeoff).decode("ascii") in images


def test_every_formal_audit_is_on_its_models_plot(report):
    for model in report["models"]:
        layers = data.tradeoff_layers(model)
        on_plot = {x["audit_index"] for x in layers["points"] + layers["formal_bounds"] if x["formal"]}
        assert on_plot == {i for i, a in enumerate(model["audits"]) if a["formal"]}, model["name"]
        assert _formal_on_plot(model)


def test_a_plot_without_the_formal_audit_is_caught(report, monkeypatch):
    """Planted: plot data that keeps the estimate boxes and drops the formal audits (what the issue saw)."""
    real = data.tradeoff_layers

    def estimates_only(model):
        layers = real(model)
        return {**layers, "points": [p for p in layers["points"] if not p["formal"]], "formal_bounds": []}

    monkeypatch.setattr(data, "tradeoff_layers", estimates_only)
    assert not any(_formal_on_plot(m) for m in report["models"])


def _icl_entry(report: dict, canary_audit: dict) -> dict:
    """A DP-ICL-like entry: the fixture's ε ≈ 8 model with an ICL section and no canary audit of its own."""
    entry = copy.deepcopy(report["models"][2])
    entry.pop("summary")
    entry["audits"] = [a for a in entry["audits"] if not a["formal"]]
    entry["attacks"]["icl"] = [{"attack": "icl", "settings": [{"epsilon": "inf"}, {"epsilon": 8.0}]}]
    entry["attacks"]["icl"][0]["settings"][1] |= {"setting": "DP-ICL", "canary_audit": canary_audit}
    return entry


def test_the_summary_uses_the_icl_canary_audit():
    from dpaudit.audit import audit_scores
    from dpaudit.workflows.checkpoint import FAMILY_AUDITS

    rng = np.random.default_rng(0)
    included = rng.random(400) < 0.5
    scores = np.where(included, rng.normal(3.0, 1.0, 400), rng.normal(0.0, 1.0, 400))
    audit = audit_scores(scores, included, method="one-run", design="canaries", delta=1e-5, claimed_epsilon=0.5)
    assert audit.formal and audit.verdict == "violation"
    report = json.loads(FIXTURE.read_text(encoding="utf-8"))
    entry = _icl_entry(report, audit.to_dict())
    (record,) = FAMILY_AUDITS["icl"](entry["attacks"]["icl"][0])  # the noise-free setting is another mechanism
    assert record.result == audit and record.family == "icl"
    entry["audits"].append(record.to_dict())
    model = build_report([entry], title="t")["models"][0]
    assert model["summary"]["formal"]["attack"] == "icl-canaries" and model["summary"]["verdict"] == "violation"
    # Planted: a summary that ignores the ICL family's audit (the entry before the workflow adds it).
    entry["audits"].pop()
    ignored = build_report([entry], title="t")["models"][0]
    assert ignored["summary"]["formal"] is None  # what the issue saw: "no formal audit" beside a formal one


@pytest.fixture(scope="module")
def tiny_run_dir(tmp_path_factory):
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset("synthetic:n=300,d=5,classes=2,seed=1")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    out = tmp_path_factory.mktemp("run") / "run"
    train_run(ds, spec, TrainConfig(epochs=1, batch_size=32, lr=0.1, seed=0), out=out)
    return out


def test_audit_checkpoint_adds_a_familys_formal_audits_to_the_models(tiny_run_dir, monkeypatch):
    """The workflow, not the renderer, joins the ICL canary audit to the model's audits (so every entry point's
    headline uses it). Planted: dropping that join leaves the headline without a formal audit."""
    from dpaudit.audit import audit_scores
    from dpaudit.workflows import audit_checkpoint
    from dpaudit.workflows.checkpoint import FAMILY_RUNNERS

    rng = np.random.default_rng(1)
    included = rng.random(200) < 0.5
    canary = audit_scores(
        np.where(included, 1.0, 0.0) + rng.normal(0, 0.1, 200), included, method="one-run", design="canaries",
        delta=1e-5, claimed_epsilon=0.5,
    )  # fmt: skip
    settings = [
        {"epsilon": math.inf, "setting": "no noise", "canary_audit": canary.to_dict()},
        {"epsilon": 0.5, "setting": "DP-ICL", "canary_audit": canary.to_dict()},
    ]
    result = {"attack": "icl", "settings": settings}
    monkeypatch.setitem(FAMILY_RUNNERS, "icl", lambda run, opts, seed, progress: result)
    audit = audit_checkpoint(tiny_run_dir, attacks=(), families={"icl": {}})
    head = audit.headline()
    assert [a.attack for a in audit.audits] == ["icl-canaries"]  # the DP-ICL setting only, not the noise-free one
    assert head.formal["attack"] == "icl-canaries" and head.formal["threat_model"] == "black-box, one run"


def test_bounds_name_their_threat_model_and_are_not_compared_bare(report):
    text = render_markdown(report)
    assert "leaks: ε ≥ 3.94 shown (black-box, one run)" in text
    for model in report["models"]:
        for kind in ("formal", "estimate"):
            if model["summary"][kind] is not None:
                assert model["summary"][kind]["threat_model"]
    white = copy.deepcopy(report["models"][0])
    white.pop("summary")
    i = white["audits"].index(next(a for a in white["audits"] if a["formal"]))
    white["audits"][i] = {
        **white["audits"][i],
        "source": {**white["audits"][i]["source"], "attack": "whitebox-canaries"},
    }
    white["audits"][i].pop("threat_model")
    model = build_report([white], title="t")["models"][0]
    assert model["summary"]["formal"]["threat_model"] == "white-box, one run"
    assert "white-box, one run" in model["summary"]["headline"]


def test_tpr_at_an_unresolvable_fpr_is_not_a_number(report):
    report = build_report(report["models"], title="t")  # the summary as the builder makes it now
    m = report["models"][0]
    assert all(a["n_nonmembers"] == 359 for a in m["attacks"]["membership"])
    assert m["summary"]["tpr_at_low_fpr"] is None  # TPR at 0 false positives, not at 0.1% FPR
    assert "n/a: needs ≥ 1000 non-members (359 here)" in render_markdown(report)
    entry = copy.deepcopy(m)
    entry.pop("summary")
    for a in entry["attacks"]["membership"]:
        a["n_nonmembers"] = 1000
    resolved = build_report([entry], title="t")["models"][0]["summary"]
    assert resolved["tpr_at_low_fpr"] == max(a["tpr_at_fpr"]["0.001"] for a in entry["attacks"]["membership"])


def test_privacy_utility_joins_no_models_and_marks_refuted_claims(report):
    report["models"][1]["summary"]["verdict"] = "violation"
    fig = plots.privacy_utility_figure(report)
    ax = fig.axes[0]
    assert all(len(line.get_xdata()) <= 2 for line in ax.get_lines())  # no line through several models
    assert any("claim refuted" in t.get_text() for t in ax.texts)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "test accuracy, claim refuted" in labels


def test_zero_bounds_are_not_arrows_and_the_legend_lists_only_what_is_drawn(report):
    fig = plots.epsilon_figure(report)
    ax = fig.axes[0]
    arrows = [a for a in ax.texts if getattr(a, "arrow_patch", None) is not None]
    n_zero = sum(
        1 for m in report["models"] if float((m["summary"]["formal"] or {}).get("epsilon_lower_bound", 1)) == 0
    )
    assert n_zero >= 1  # the fixture's ε = 1 model shows ε ≥ 0
    assert len(arrows) == len(report["models"]) - n_zero
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "bound ε ≥ 0 (nothing shown)" in labels
    assert "ε tested by an audit" in labels  # the non-private model's lira audit was run against ε = 1
    for a in report["models"][0]["audits"]:
        a["claimed_epsilon"] = None
    labels = [t.get_text() for t in plots.epsilon_figure(report).legends[0].get_texts()]
    assert "ε tested by an audit" not in labels  # a marker that never appears has no legend entry


def test_one_rounding_of_the_claim(report):
    text = render_markdown(report)
    claim = report["models"][2]["claim"]["epsilon"]
    assert f"{claim:g}" == "7.9912" and "claimed 7.9912" in text  # the notes' spelling ...
    assert "| dpsgd-eps8 | 7.9912 (δ = 1e-05)" in text  # ... is the table's and the headline's
    assert not re.search(r"dpsgd-eps8 \| 7\.99 \(", text) and "claimed 7.99 " not in text


@pytest.mark.parametrize(
    ("training", "shown", "hidden"),
    [
        (
            {"algo": "dp-icl", "epochs": 40, "batch_size": 32, "lr": 0.05, "student_algo": "sgd",
             "aggregation": {"n_answered": 100, "n_queries": 100, "recipe": {"teachers": 40, "shots": 10,
                             "queries": 100, "aggregator": {"name": "gnmax", "sigma": 9.02}}}},
            ["teachers 40", "shots 10", "gnmax", "σ 9.02", "post-processing"],
            ["epochs", "lr 0.05", "batch 32"],
        ),
        (
            {"algo": "pate", "epochs": 5, "batch_size": 32, "lr": 0.1, "student_algo": "sgd",
             "aggregation": {"recipe": {"teachers": 20, "queries": 50, "aggregator": {"name": "lnmax", "sigma": 20}}}},
            ["teachers 20", "queries 50", "lnmax", "σ 20", "student sgd (epochs 5"],
            [],
        ),
        ({"algo": "objpert", "epochs": 1, "batch_size": 64, "lr": 0.1, "weight_decay": 0.1, "seed": 0},
         ["objpert", "λ (L2) 0.1"], ["epochs", "lr", "batch"]),
        # DP-AGD is full-batch gradient descent: it reads C, λ and --steps (its splits), not the SGD settings its
        # run records; the report read "dpagd, epochs 30, batch 64, lr 0.1, seed 0, C 1.0, sampling poisson".
        ({"algo": "dpagd", "epochs": 30, "batch_size": 64, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0,
          "seed": 0, "steps": 40, "dp": {"clip": 1.0, "sampling": "poisson", "noise_multiplier": None}},
         ["dpagd", "C 1.0", "λ (L2) 0.0", "splits 40", "seed 0"], ["epochs", "lr", "batch", "sampling"]),
    ],
)  # fmt: skip
def test_training_lines_speak_the_algorithms_terms(training, shown, hidden):
    text = training_text(training)
    assert all(s in text for s in shown), text
    assert not any(h in text for h in hidden), text


def test_formal_bounds_are_drawn_even_without_an_operating_point(report):
    model = copy.deepcopy(report["models"][0])
    formal = [i for i, a in enumerate(model["audits"]) if a["formal"]]
    assert formal and all(model["audits"][i].get("operating_point") is None for i in formal)  # one-run: no (FPR, FNR)
    bounds = data.tradeoff_layers(model)["formal_bounds"]
    assert {b["audit_index"] for b in bounds} == set(formal)
    assert all(b["drawn"] == (b["epsilon_lower_bound"] > 0) for b in bounds)
    assert math.isfinite(bounds[0]["epsilon_lower_bound"])
    assert plots.tradeoff_figure(model, plots.attack_colors(report)) is not None


def test_the_epsilon_figure_never_says_no_formal_audit_beside_a_formal_curve_refutation(report):
    """A model whose verdict comes from a formal test that bounds no ε (a refuted claimed curve) has only an estimate
    to draw on the ε figure: its legend read "estimate (no formal audit)" under a headline and badge saying the
    claimed curve was formally refuted. It now says what is missing: a formal ε bound."""
    m = copy.deepcopy(report["models"][1])
    for a in m["audits"]:
        if a["formal"]:
            a.update(formal=False, verdict="curve-refuted", refutation={"statement": "the claimed curve is refuted"})
        else:
            a["epsilon_lower_bound"] = 0.5
    rebuilt = build_report([m], title="t", config=report["run"]["config"])
    assert rebuilt["models"][0]["summary"]["verdict"] == "curve-refuted"
    legend = [t.get_text() for t in plots.epsilon_figure(rebuilt).legends[0].get_texts()]
    assert "estimate (no formal ε bound)" in legend and not any("no formal audit" in t for t in legend), legend
