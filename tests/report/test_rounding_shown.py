"""Every ε a reader sees is rounded in the safe direction (dpaudit.numfmt), end to end: the report's Markdown and
HTML, the headline, the CLI summaries. A claim rounds up (7.999954 → 7.99996, never 7.99995), a lower bound down
(4.8151 → 4.81, never 4.82), and a line that states an order shows it (never "ε ≥ 8 > claimed 8").

Planted and caught here: a claim printed with ``:g`` (round to nearest) in the report's claim_text, in the headline
or in the CLI summary; the headline's bound rounded to nearest; the headline printing bound and claim without
:func:`dpaudit.numfmt.ordered`.
"""

from __future__ import annotations

import copy
import re
from decimal import Decimal

import pytest

from dpaudit.cli.cloak import human_cloak, human_curve
from dpaudit.cli.train import human_summary
from dpaudit.report.build import build_report
from dpaudit.report.html import render_html
from dpaudit.report.markdown import render_markdown
from dpaudit.workflows.result import headline

CLAIM = 7.999954  # an accounted ε: round to nearest would print 7.99995, under-reporting it
BOUND = 4.8151  # a lower bound: round to nearest would print 4.82, which nothing showed


def _rebuilt(report: dict) -> dict:
    """The fixture with the ε = 8 model's claim set to CLAIM and the non-private model's formal bound to BOUND,
    rebuilt so that every derived line (headline, verdicts) is recomputed from them."""
    models = report["models"]
    eps8, nonprivate = models[2], models[0]
    eps8["claim"]["epsilon"] = CLAIM
    for a in eps8["audits"]:
        a["claimed_epsilon"] = CLAIM
    canaries = next(a for a in nonprivate["audits"] if a["formal"])
    canaries["epsilon_lower_bound"] = BOUND
    return build_report(models, title=report["title"], config=report["run"]["config"])


def test_a_claim_rounds_up_and_a_bound_down_in_markdown_html_and_headline(report):
    rebuilt = _rebuilt(report)
    md, html = render_markdown(rebuilt), render_html(rebuilt)
    eps8, nonprivate = rebuilt["models"][2], rebuilt["models"][0]
    assert "claimed 7.99996 " in eps8["summary"]["headline"]
    assert "| dpsgd-eps8 | 7.99996 (δ = 1e-05)" in md  # the summary table
    assert "ε = 7.99996, δ = 1e-05" in md  # the model's claim details
    assert "| 7.99996 |" in md  # each audit row's claimed ε
    assert "7.99996 (δ = 1e-05)" in html
    assert "7.99995" not in md and "7.99995" not in html
    assert nonprivate["summary"]["headline"].startswith("leaks: ε ≥ 4.81 shown")
    assert "≥ 4.81 \\[black-box, one run\\]" in md and "leaks: ε ≥ 4.81 shown" in html
    assert "4.82" not in md and "4.82" not in html


def test_the_plot_labels_round_in_the_same_directions(report):
    from dpaudit.report._data import tradeoff_layers

    rebuilt = _rebuilt(report)
    layers = tradeoff_layers(rebuilt["models"][2])
    assert layers["claims"][0]["label"] == "claimed ε = 7.99996, δ = 1e-05"
    bounds = tradeoff_layers(rebuilt["models"][0])["formal_bounds"]
    assert any("not (4.81, δ = 1e-05)-DP" in b["label"] for b in bounds), bounds


def _audit(bound: float, claim: float, max_cert: float, verdict: str) -> dict:
    return {
        "source": {"family": "membership", "attack": "canaries", "index": None},
        "method": "one-run",
        "confidence": 0.95,
        "formal": True,
        "epsilon_lower_bound": bound,
        "max_certifiable_epsilon": max_cert,
        "claimed_epsilon": claim,
        "verdict": verdict,
        "threat_model": "black-box, one run",
    }


def _below(shown: Decimal, x: float) -> bool:
    """Printed at or below x: exactly, or x's own short decimal (dpaudit.numfmt's stated exception)."""
    return shown <= Decimal(x) or float(shown) == x


def _above(shown: Decimal, x: float) -> bool:
    return shown >= Decimal(x) or float(shown) == x


def _pair(text: str, pattern: str) -> tuple[Decimal, Decimal]:
    m = re.search(pattern, text)
    assert m, text
    return Decimal(m.group(1)), Decimal(m.group(2))


@pytest.mark.parametrize(
    ("bound", "claim"),
    [(8.0000004, 8.0000001), (8.00001, 8.0), (7.9999996, 7.9999992), (4.8151, 4.815)],
)
def test_a_violation_headline_shows_the_bound_above_the_claim(bound, claim):
    """Bound and claim agree to 6 digits: rounding alone would print "ε ≥ 8 > claimed 8" (or worse, the bound
    below the claim); the headline adds digits until the printed numbers say what the verdict says."""
    text = headline([_audit(bound, claim, 20.0, "violation")], {"epsilon": claim, "delta": 1e-5}).text
    b, c = _pair(text, r"violation: ε ≥ (\S+) > claimed (\S+) ")
    assert b > c and _below(b, bound) and _above(c, claim), text


@pytest.mark.parametrize(("bound", "claim"), [(7.999954, 7.999954), (7.9999539, 7.999954), (4.8151, 4.8152)])
def test_consistent_and_inconclusive_headlines_keep_their_order(bound, claim):
    text = headline([_audit(bound, claim, 20.0, "consistent")], {"epsilon": claim, "delta": 1e-5}).text
    b, c = _pair(text, r"consistent: ε ≥ (\S+) ≤ claimed (\S+) ")
    assert b <= c and _below(b, bound) and _above(c, claim), text
    # Inconclusive: "certifies at most m ≤ claimed c", both rounded up: m = c must not print as "8 ≤ 7.99996".
    text = headline([_audit(0.5, claim, bound, "inconclusive")], {"epsilon": claim, "delta": 1e-5}).text
    m, c = _pair(text, r"certifies at most (\S+) ≤ claimed (\S+) ")
    assert m <= c and _above(m, bound) and _above(c, claim), text


def test_the_cli_summaries_print_the_claim_rounded_up():
    s = {
        "model": "mlp", "data": "digits", "n_members": 100, "algo": "dpsgd", "train_accuracy": 0.9,
        "test_accuracy": 0.8, "private": True, "accountant": "pld", "epsilon": CLAIM, "delta": 1e-5,
        "claim_mismatch": True, "epsilon_recomputed": 7.9999541,
    }  # fmt: skip
    text = human_summary(s)
    assert "privacy    ε = 7.99996 at δ = 1e-05 (pld)" in text
    # A mismatch line never prints two equal numbers for two different claims (7.99996 vs 7.99996).
    recorded, recomputed = _pair(text, r"records ε = (\S+), but .* re-accounts to ε = (\S+) ")
    assert recorded < recomputed and _above(recorded, CLAIM)
    cloak = {
        "lambda": 1.0, "target": "t", "data": "digits", "suppression_ratio": 0.5, "suppression_threshold": 1.0,
        "clean_accuracy": 0.9, "cloaked_accuracy": 0.8, "accuracy_loss": 0.1, "composed_epsilon": CLAIM,
        "delta": 1e-5, "median_feature_epsilon": 0.5,
    }  # fmt: skip
    assert "local DP   ε = 7.99996 at δ = 1e-05" in human_cloak(cloak)
    # The λ sweep's table (4 digits): 12.34449 printed 12.34 (to nearest), below the formal bound.
    rows = [{**cloak, "lambda": 0.5, "composed_epsilon": 12.34449}, {**cloak, "lambda": 2.0}]
    table = human_curve(rows, at=2.0)
    assert "12.35\n" in table and "12.34" not in table and "8  <- knee" in table


def test_family_results_round_their_epsilons_by_what_they_are():
    """The generic layout of a family result (JL step audit, cloak, ICL) prints each ε by its key."""
    from dpaudit.report._format import scalar_text

    assert scalar_text("epsilon_lower_bound", BOUND) == "4.815"
    assert scalar_text("members.epsilon_lower_bound", 4.81519) == "4.815"  # nearest would print 4.815 too ...
    assert scalar_text("epsilon_lower_bound", 4.81599) == "4.815"  # ... but not here (4.816)
    for key in ("jl_accountant_claim", "plain_formula_claim", "model_claim", "composed_epsilon", "epsilon"):
        assert scalar_text(key, CLAIM) == "7.99996", key
    assert scalar_text("max_certifiable_epsilon", 2.783308493421825) == "2.784"
    assert scalar_text("auc", 0.666666) == "0.6667"  # not an ε: as before
    # a count is exact: the attribute leakage's 40 000 permutations printed as "4e+04"
    assert scalar_text("leakage_test.permutations", 40_000) == "40000" and scalar_text("members.n", 12_345) == "12345"


def _estimate(bound: float, claim: float, verdict: str) -> dict:
    return {
        **_audit(bound, claim, 20.0, verdict),
        "source": {"family": "membership", "attack": "loss", "index": 0},
        "method": "clopper-pearson",
        "formal": False,
        "threat_model": "black-box, model's members",
    }


def test_one_headline_prints_its_claim_once_for_the_formal_and_the_estimate_bound():
    """The formal part and the estimate part of a headline print their bounds beside ONE claim. Each pair was
    ordered on its own, so a claim of 1.9999954 read "consistent: ε ≥ 0.5 ≤ claimed 2 …; estimate ε ≥ 1.999996 …
    exceeds the claim": a bound printed below the claim it is said to exceed."""
    claim = 1.9999954
    audits = [_audit(0.5, claim, 20.0, "consistent"), _estimate(1.999996, claim, "estimate-exceeds-claim")]
    text = headline(audits, {"epsilon": claim, "delta": 1e-5}).text
    _, c = _pair(text, r"consistent: ε ≥ (\S+) ≤ claimed (\S+) ")
    e = Decimal(re.search(r"estimate ε ≥ (\S+) \(loss, clopper-pearson\) exceeds the claim", text).group(1))
    assert e > c and _above(c, claim) and _below(e, 1.999996), text
    # An estimate just below the claim never prints at or above the claim shown beside it either.
    audits = [_audit(0.5, claim, 20.0, "consistent"), _estimate(1.9999953, claim, "consistent")]
    text = headline(audits, {"epsilon": claim, "delta": 1e-5}).text
    _, c = _pair(text, r"consistent: ε ≥ (\S+) ≤ claimed (\S+) ")
    e = Decimal(re.search(r"estimate ε ≥ (\S+) \(loss", text).group(1))
    assert e < c and "exceeds" not in text, text


def test_the_summary_row_prints_the_claim_as_the_headline_does(report):
    """The summary table's claimed ε and the headline under it are one number printed once (the Markdown row, the
    HTML row and the headline list of both). Before, the row ordered the claim against the formal and the estimate
    bound and the headline against the formal bound only: a claim of 1.9999954 read "1.9999954" in the row and
    "claimed 2" in the headline, above an estimate of 1.999996 that "exceeds the claim"."""
    from dpaudit.report.html import _summary_table

    models = report["models"]
    eps1 = models[1]  # the ε = 1 model: a formal consistent audit (max certifiable 5.1) and two estimates
    claim = 1.9999954
    eps1["claim"]["epsilon"] = claim
    for a in eps1["audits"]:
        a["claimed_epsilon"] = claim
        if a["source"]["attack"] == "loss":
            a["epsilon_lower_bound"], a["verdict"] = 1.999996, "estimate-exceeds-claim"
    rebuilt = build_report(models, title=report["title"], config=report["run"]["config"])
    m = rebuilt["models"][1]
    assert m["summary"]["verdict"] == "consistent", m["summary"]["headline"]
    claimed = re.search(r"≤ claimed (\S+) ", m["summary"]["headline"]).group(1)
    row = next(line for line in render_markdown(rebuilt).splitlines() if line.startswith(f"| {m['name']} |"))
    assert row.split(" | ")[1] == f"{claimed} (δ = 1e-05)", row
    assert f"<td>{claimed} (δ = 1e-05)</td>" in _summary_table(rebuilt)  # the HTML row (the page without its plots)
    # The formal audit's max certifiable ε, printed by the headline only, counts in the row's claim digits too.
    for a in m["audits"]:
        if a["formal"]:
            a["max_certifiable_epsilon"], a["epsilon_lower_bound"] = 1.99999541, 0.5
    rebuilt = build_report(rebuilt["models"], title=report["title"], config=report["run"]["config"])
    m = rebuilt["models"][1]
    claimed = re.search(r"≤ claimed (\S+) ", m["summary"]["headline"]).group(1)
    most = re.search(r"could certify up to (\S+)\)", m["summary"]["headline"]).group(1)
    assert Decimal(most) > Decimal(claimed), m["summary"]["headline"]
    row = next(line for line in render_markdown(rebuilt).splitlines() if line.startswith(f"| {m['name']} |"))
    assert row.split(" | ")[1] == f"{claimed} (δ = 1e-05)", row


def test_a_cloaks_local_dp_guarantee_rounds_up_in_the_report():
    """A cloak's per-feature ε and the μ of their composition are its formal local-DP guarantee (dpaudit.training.
    cloak): ``.4g`` printed a max_feature_epsilon of 22544.5016 as 2.254e+04 and a μ of 562.6993 as 562.7 (up by
    luck), 562.6993 at 4 digits to nearest being the same number a μ of 562.7049 also printed."""
    from dpaudit.report._format import scalar_text

    assert scalar_text("local_dp.max_feature_epsilon", 22544.501597790957) == "22544.6"
    assert scalar_text("local_dp.min_feature_epsilon", 0.93247449) == "0.932475"
    assert scalar_text("local_dp.median_feature_epsilon", 1.97104) == "1.97104"
    assert scalar_text("local_dp.composed_mu", 562.69975) == "562.7"
    assert scalar_text("local_dp.composed_mu", 562.699751) == "562.7"
    assert scalar_text("local_dp.composed_mu", 562.70049) == "562.701"
    cloak = {
        "lambda": 1.0, "target": "t", "data": "digits", "suppression_ratio": 0.5, "suppression_threshold": 1.0,
        "clean_accuracy": 0.9, "cloaked_accuracy": 0.8, "accuracy_loss": 0.1, "composed_epsilon": 3.0,
        "delta": 1e-5, "median_feature_epsilon": 1.97149,
    }  # fmt: skip
    assert "(median feature ε = 1.97149)" in human_cloak(cloak)  # as the report prints it (4 digits read 1.971)


def test_a_family_results_rates_read_as_percentages_as_the_cli_and_utility_table_print_them():
    """A family result's accuracies, fidelities and the cloak's suppression ratio and accuracy loss are fractions
    meaning "how often": the report prints them as the CLI (`attack extract`, `attack inversion`, `train --algo
    cloak`) and the utility table do. Before, the same run read "surrogate_accuracy 0.922" in the report's
    extraction line, "92.2%" in its utility table and "accuracy surrogate 92.2%" on the CLI."""
    from dpaudit.cli.extract import human_summary as extraction_summary
    from dpaudit.report._format import rate, scalar_results, scalar_text

    result = {
        "attack": "extraction-equations", "method": "equations", "api": "probs", "budget": 200, "queries": 200,
        "params": {"pool": "synthetic"}, "parameter_relative_error": 1.6e-07, "fidelity": 1.0,
        "fidelity_uniform": 0.99851, "surrogate_accuracy": 0.9220055710306406, "target_accuracy": 0.922, "curve": [],
    }  # fmt: skip
    shown = dict((k, scalar_text(k, v)) for k, v in scalar_results(result))
    assert shown["surrogate_accuracy"] == "92.2%" and shown["fidelity"] == "100%", shown
    assert shown["fidelity_uniform"] == rate(0.99851) and shown["parameter_relative_error"] == "1.6e-07", shown

    class _Result:
        def to_dict(self):
            return result

    cli = extraction_summary(_Result())
    assert f"surrogate {shown['surrogate_accuracy']}" in cli and f"uniform {shown['fidelity_uniform']}" in cli
    for key, value, cli_text in (("suppression_ratio", 0.7627, "76.3%"), ("accuracy_loss", 0.2429, "24.3%")):
        assert scalar_text(key, value) == cli_text, key
    assert scalar_text("attribute.clean_accuracy", 0.9387) == "93.9%"
    assert scalar_text("members.accuracy", 0.5) == "50.0%" and scalar_text("mean_ssim", 0.32623) == "0.3262"


def test_a_data_dependent_epsilon_rounds_up():
    """PATE's / DP-ICL's data-dependent ε (shown beside the claim, never as it) is ε(δ) of a data-dependent RDP
    bound: an upper bound on this dataset's privacy loss, not an estimate. To nearest it printed 2.8544449 as
    2.85444, below the bound."""
    from dpaudit.report._format import claim_details

    text = claim_details({"epsilon": 3.0, "delta": 1e-5, "data_dependent": {"epsilon": 2.8544449}})
    assert "data-dependent ε = 2.85445 (not itself private, not the claim)" in text, text


def test_no_negative_zero_is_printed():
    """A loss attack's threshold of -0.0 (a loss of 0, negated) read "-0" in the HTML audit table where `audit`
    printed "0" (AuditResult.summary adds 0.0), and a small negative advantage read "-0.000" in the report's and
    the CLI's membership tables."""
    from dpaudit.report._format import num

    assert num(-0.0, ".4g") == "0" and num(-0.0001) == "0.000" and num(-0.0) == "0.000"
    assert num(-0.02) == "-0.020" and num(-1e-9, ".4g") == "-1e-09"  # a number that is not zero keeps its sign


def test_an_audits_clopper_pearson_intervals_print_outward(report):
    """The HTML audit table's FPR and FNR intervals (Clopper–Pearson, the formal test's own bounds) contain the
    computed intervals: lower ends rounded down, upper ends up. To nearest, an FNR interval [0.0345, 0.12344] read
    [3.45%, 12.3%], its upper end below the bound."""
    from dpaudit.report.html import _audits

    m = copy.deepcopy(report["models"][2])
    a = next(a for a in m["audits"] if a.get("operating_point"))
    a["operating_point"]["fnr_interval"] = [0.0345, 0.12344]
    a["operating_point"]["fpr_interval"] = [0.00123456, 0.5]
    page = _audits(m["audits"])
    assert "[3.45%, 12.4%]" in page and "[0.123%, 50%]" in page, page


def test_an_attacks_auc_interval_prints_outward():
    """The AUC bootstrap interval in the report's Markdown and HTML membership tables and `attack mia`'s table
    contains the computed interval: lower end rounded down, upper end up (3 significant digits, padded to 3
    decimals). To nearest, [0.53549, 0.60049] read [0.535, 0.600], its upper end below the interval's."""
    from dpaudit.cli.attack import human_table
    from dpaudit.report.html import _membership_table
    from dpaudit.report.markdown import _membership

    a = {"attack": "loss", "auc": 0.568, "ci": {"auc": [0.53549, 0.60049]}, "balanced_accuracy": 0.5,
         "advantage": 0.1, "tpr_at_fpr": {"0.1": 0.1}, "n_members": 10, "n_nonmembers": 10,
         "n_reference_models": 0, "n_shadow_models": 0}  # fmt: skip

    class Result:
        def to_dict(self, include_roc):
            return a

    for text in ("\n".join(_membership([a])), _membership_table([a]), human_table([Result()])):
        assert "[0.535, 0.601]" in text, text
