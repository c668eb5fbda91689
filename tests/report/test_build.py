"""Report building: schema, summaries, verdicts, statistics (oracles: closed forms), merge, load."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from dpaudit.errors import InputError
from dpaudit.report import build_report, load_report, merge_reports, validate_report
from dpaudit.report._data import tradeoff_curve
from dpaudit.report.build import dumps, parse_formats
from dpaudit.workflows.result import clopper_pearson_interval as clopper_pearson
from dpaudit.workflows.result import operating_point

from .conftest import FIXTURE


def test_fixture_is_valid_and_has_the_three_verdicts(report):
    validate_report(report)
    verdicts = {m["name"]: m["summary"]["verdict"] for m in report["models"]}
    assert verdicts == {"nonprivate-mlp": None, "dpsgd-eps1": "consistent", "dpsgd-eps8": "inconclusive"}
    # A model without a claim gets what was shown, not "inconclusive".
    assert report["models"][0]["summary"]["headline"].startswith("leaks: ε ≥")


def test_load_report_accepts_the_file_and_its_directory(report):
    assert load_report(FIXTURE) == report
    assert load_report(FIXTURE.parent) == report


def _same_up_to_float_rounding(got, expected, path="report"):
    if isinstance(expected, float) and isinstance(got, float):
        # rel 4e-12: the Clopper–Pearson limits are widened by 16·(n + 4)·2^-52 relative (dpaudit/audit/stats.py,
        # _CP_ULPS_PER_TRIAL), at most 3.6e-12 at the fixture's <= 1000 trials; the fixture predates that margin.
        assert math.isclose(got, expected, rel_tol=4e-12, abs_tol=1e-15), f"{path}: {got!r} != {expected!r}"
    elif isinstance(expected, dict) and isinstance(got, dict):
        assert got.keys() == expected.keys(), path
        for key in expected:
            _same_up_to_float_rounding(got[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list) and isinstance(got, list):
        assert len(got) == len(expected), path
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            _same_up_to_float_rounding(g, e, f"{path}[{i}]")
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def test_build_is_idempotent(report):
    """Rebuilding a report from its own models changes nothing: merging relies on this."""
    again = build_report(report["models"], title=report["title"], config=report["run"]["config"])
    again["generated_by"] = report["generated_by"]  # versions of this machine, not of the fixture's
    twice = build_report(again["models"], title=again["title"], config=again["run"]["config"])
    twice["generated_by"] = report["generated_by"]
    assert dumps(twice) == dumps(again)  # idempotent, to the bit, with this machine's scipy
    # The committed fixture was built with another scipy: its Clopper-Pearson bounds (beta quantiles)
    # may differ in the last bits (1e-16 between scipy 1.13.0 and 1.17.1), nothing else may.
    _same_up_to_float_rounding(json.loads(dumps(again)), report)


def _set(doc, path, value):
    for key in path[:-1]:
        doc = doc[key]
    if value is _DELETE:
        del doc[path[-1]]
    else:
        doc[path[-1]] = value


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("schema_version",), 1, "report.schema_version: 2 was expected"),
        (("models", 0, "summary", "verdict"), "fine", "report.models[0].summary.verdict: 'fine' is not one of"),
        (("models", 1, "attacks", "membership", 0, "auc"), 1.5, "report.models[1].attacks.membership[0].auc"),
        (("models", 0, "data", "sha256"), "abc", "report.models[0].data.sha256: 'abc' does not match"),
        (("models", 2, "summary"), _DELETE, "report.models[2]: 'summary' is a required property"),
        (("models", 0, "attacks", "inversion"), {"attack": "x"}, "report.models[0].attacks.inversion"),
        (("models", 0, "audits", 0, "epsilon_lower_bound"), "big", "report.models[0].audits[0].epsilon_lower_bound"),
        (("run",), None, "report.run: None is not of type 'object'"),
    ],
)
def test_broken_reports_are_rejected_with_one_clear_line(report, path, value, expected):
    _set(report, path, value)
    with pytest.raises(InputError) as e:
        validate_report(report)
    message = str(e.value)
    assert message.startswith("invalid report: ")
    assert expected in message
    assert "\n" not in message


def test_load_report_rejects_bad_json_and_missing_files(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_report(tmp_path / "nope.json")
    bad = tmp_path / "report.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_report(bad)
    bad.write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(InputError, match=r"report.json: invalid report: .*required property"):
        load_report(bad)


def _entry(report, index=0, **changes):
    m = copy.deepcopy(report["models"][index])
    m.pop("summary")
    m.update(changes)
    return m


def test_summary_headlines_the_strongest_formal_audit_and_keeps_estimates_apart(report):
    m = report["models"][0]
    s = m["summary"]
    assert s["claimed_epsilon"] == "inf"  # non-private: treated as ε = ∞
    assert s["best_auc"] == max(a["auc"] for a in m["attacks"]["membership"])
    # 359 non-members cannot resolve FPR 0.1%: the TPR there is the TPR at zero false positives, not shown.
    assert s["tpr_at_low_fpr"] is None
    assert s["tpr_at_low_fpr_unresolved"] == {"nonmembers_needed": 1000, "nonmembers": 359}
    formal = [a for a in m["audits"] if a["formal"]]
    estimates = [a for a in m["audits"] if not a["formal"]]
    assert formal and estimates
    top_formal = max(formal, key=lambda a: a["epsilon_lower_bound"])
    top_estimate = max(estimates, key=lambda a: a["epsilon_lower_bound"])
    assert top_estimate["epsilon_lower_bound"] > top_formal["epsilon_lower_bound"]  # the estimate is larger...
    assert s["formal"]["epsilon_lower_bound"] == top_formal["epsilon_lower_bound"]  # ...but never the headline
    assert s["estimate"]["epsilon_lower_bound"] == top_estimate["epsilon_lower_bound"]
    assert m["audits"][s["formal"]["audit_index"]] is not None and s["formal"]["attack"] == "canaries"
    # A CP estimate against ε = 1 exceeds it: labelled, and never a violation.
    assert any(a["effective_verdict"] == "estimate-exceeds-claim" for a in estimates)
    assert all(a["effective_verdict"] != "violation" for a in estimates)


def test_an_estimate_above_the_claim_never_sets_the_models_verdict(report):
    entry = _entry(report, 1)  # claims ε ≈ 1; the canary audit (formal) is consistent
    entry["audits"][1] |= {"epsilon_lower_bound": 50.0, "verdict": None}
    out = build_report([entry], title="t")["models"][0]
    assert out["audits"][1]["effective_verdict"] == "estimate-exceeds-claim"
    assert out["summary"]["verdict"] == "consistent"
    assert out["summary"]["estimate_verdict"] == "estimate-exceeds-claim"
    assert "not a formal violation" in out["summary"]["headline"]


def test_model_without_claim_gets_no_verdict_but_what_was_shown(report):
    entry = _entry(report, 0)
    entry["audits"] = [a for a in entry["audits"] if a["claimed_epsilon"] is None]
    for a in entry["audits"]:
        a.pop("effective_verdict")
    out = build_report([entry], title="t")["models"][0]
    assert [a["effective_verdict"] for a in out["audits"]] == [None] * len(entry["audits"])
    assert out["summary"]["verdict"] is None
    assert out["summary"]["headline"].startswith("leaks: ε ≥")


def test_model_without_audits_has_no_verdict(report):
    out = build_report([_entry(report, 1, audits=[])], title="t")["models"][0]
    assert out["summary"]["verdict"] is None
    assert out["summary"]["formal"] is None and out["summary"]["estimate"] is None


def test_non_finite_numbers_are_spelled_as_strings(report):
    entry = _entry(report, 1)
    assert entry["audits"][0]["formal"]
    entry["audits"][0]["epsilon_lower_bound"] = math.inf
    entry["audits"][0]["verdict"] = None
    out = build_report([entry], title="t")
    a = out["models"][0]["audits"][0]
    assert a["epsilon_lower_bound"] == "inf"
    assert a["effective_verdict"] == "violation"
    assert out["models"][0]["summary"]["formal"]["epsilon_lower_bound"] == "inf"
    json.loads(dumps(out))  # strict JSON (allow_nan=False) succeeds


def test_later_attack_families_fit_without_changing_old_keys(report):
    entry = _entry(report, 2)
    entry["attacks"]["inversion"] = [{"attack": "mi-face", "params": {"steps": 100}, "mse": 0.031}]
    entry["attacks"]["membership_v2"] = [{"attack": "future", "score": 1.0}]
    out = build_report([entry], title="t")["models"][0]
    assert list(out["attacks"]) == [
        "membership",
        "inversion",
        "extraction",
        "attribute",
        "cloak",
        "icl",
        "membership_v2",
    ]
    assert out["attacks"]["cloak"] is None


def test_merge_makes_names_unique_and_keeps_both_configs(report):
    merged = merge_reports([report, report], title="both")
    names = [m["name"] for m in merged["models"]]
    assert names[:3] == [m["name"] for m in report["models"]]
    assert names[3:] == [f"{m['name']} #2" for m in report["models"]]
    assert merged["run"]["config"]["merged"] == [report["run"], report["run"]]
    assert merged["run"]["data_sha256"] == report["run"]["data_sha256"]
    with pytest.raises(InputError):
        merge_reports([])


def test_config_hash_is_stable_and_order_free(report):
    models = [_entry(report, 1)]
    a = build_report(models, title="t", config={"seed": 3, "attacks": ["loss"]})
    b = build_report(models, title="t", config={"attacks": ["loss"], "seed": 3})
    c = build_report(models, title="t", config={"attacks": ["lira"], "seed": 3})
    assert a["run"]["config_sha256"] == b["run"]["config_sha256"] != c["run"]["config_sha256"]
    assert a["run"]["seed"] == 3


def test_clopper_pearson_matches_closed_forms():
    # k = 0: hi solves (1 − p)^n = a/2, i.e. hi = 1 − (a/2)^(1/n); k = n mirrors it (Clopper & Pearson 1934).
    lo, hi = clopper_pearson(0, 10, 0.95)
    assert lo == 0.0
    assert hi == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-9)
    lo, hi = clopper_pearson(10, 10, 0.95)
    assert (lo, hi) == (pytest.approx(0.025 ** (1 / 10), rel=1e-9), 1.0)
    lo, hi = clopper_pearson(5, 10, 0.95)  # published: 0.1871, 0.8129 (e.g. R binom.test)
    assert (lo, hi) == (pytest.approx(0.18709, abs=1e-5), pytest.approx(0.81291, abs=1e-5))


def test_operating_point_uses_fpr_and_fnr():
    op = operating_point({"tp": 30, "fn": 70, "fp": 2, "tn": 198}, 0.9)
    assert op["fpr"] == pytest.approx(2 / 200)
    assert op["fnr"] == pytest.approx(70 / 100)
    assert op["fpr_interval"][0] < op["fpr"] < op["fpr_interval"][1]
    assert operating_point({"tp": 0, "fn": 0, "fp": 1, "tn": 1}, 0.9) is None
    assert operating_point(None, 0.9) is None


def test_tradeoff_curve_identities():
    """Dong, Roth & Su 2022 Prop. 2.5: f(0) = 1 − δ; ε = δ = 0 gives 1 − α; f is symmetric (f(f(α)) = α for δ = 0)."""
    alpha = np.linspace(0, 1, 101)
    np.testing.assert_allclose(tradeoff_curve(alpha, 0.0, 0.0), 1 - alpha, atol=1e-15)
    assert tradeoff_curve(np.array([0.0]), 2.0, 1e-3)[0] == pytest.approx(1 - 1e-3)
    f = tradeoff_curve(alpha, 1.3, 0.0)
    np.testing.assert_allclose(tradeoff_curve(f, 1.3, 0.0), alpha, atol=1e-12)
    assert np.all(np.diff(tradeoff_curve(alpha, 0.5, 1e-5)) <= 0)
    np.testing.assert_array_equal(tradeoff_curve(np.array([0.0, 0.1]), math.inf, 0.0), [1.0, 0.0])
    # A huge finite claim (DP-SGD-JL(1) claims ε ≈ 1e9) must not overflow e^ε: the curve is then 0 for α > 0.
    np.testing.assert_array_equal(tradeoff_curve(np.array([0.0, 1e-6, 0.5]), 8.3e8, 1e-5), [1 - 1e-5, 0.0, 0.0])


@pytest.mark.parametrize(
    ("lower_bound", "power", "expected"),
    [(2.0, 5.0, "violation"), (0.5, 5.0, "consistent"), (0.5, 0.9, "inconclusive"), (0.5, None, "inconclusive")],
)
def test_audit_without_verdict_is_judged_against_the_model_claim(report, lower_bound, power, expected):
    """dpsgd-eps1 claims ε ≈ 1: a formal audit that came without a claim gets its verdict from the model's claim."""
    entry = _entry(report, 1)
    entry["audits"] = [
        {**entry["audits"][0], "claimed_epsilon": None, "verdict": None, "epsilon_lower_bound": lower_bound}
        | {"max_certifiable_epsilon": power}
    ]
    out = build_report([entry], title="t")["models"][0]
    assert out["audits"][0]["verdict"] is None  # the audit's own result is kept as it was
    assert out["audits"][0]["effective_verdict"] == out["summary"]["verdict"] == expected


def test_parse_formats():
    assert parse_formats("html, md") == ("md", "html")
    assert parse_formats(["json"]) == ("json",)
    with pytest.raises(InputError, match="unknown report format pdf; valid: json, md, html"):
        parse_formats("json,pdf")
    with pytest.raises(InputError):
        parse_formats("")
