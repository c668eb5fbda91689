"""Number and label formatting shared by the Markdown and HTML renderers (text only, no markup)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from attacks.metrics import nonmembers_needed  # the one low-FPR rule, shared with the attacks' JSON
from dpaudit import numfmt
from dpaudit.report._data import BOUND_DIGITS, as_float, is_per_step, shown_against, summary_eps

DASH = numfmt.DASH

VERDICT_TEXT = {
    "violation": "violation",
    "curve-refuted": "claimed curve refuted",
    "estimate-exceeds-claim": "estimate exceeds claim",
    "inconclusive": "inconclusive",
    "consistent": "consistent",
    None: "no verdict",
}

FAMILY_TITLES = {
    "membership": "Membership inference",
    "inversion": "Model inversion",
    "extraction": "Model extraction",
    "attribute": "Attribute inference",
    "cloak": "Cloak",
    "icl": "In-context learning membership (DP-ICL)",
    "jl-step": "DP-SGD-JL step audit (what JL norm estimates leak; one step at q = 1, not the model's claim)",
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
        "A formal lower bound exceeds the claimed ε: the claim (or its implementation) is wrong, with the "
        "stated confidence. Only formal audits can give this verdict.",
    ),
    (
        "claimed curve refuted",
        "The one-run f-DP audit against the claim's own trade-off curve (DP-SGD's) refuted the claimed curve, "
        "with the stated confidence: the claim, as a curve, is wrong. It is not an ε lower bound (the ε shown "
        "beside it is an estimate: it assumes the mechanism's curve has DP-SGD's shape).",
    ),
    (
        "estimate exceeds claim",
        "An estimate (not a formal test) is above the claimed ε: worth investigating, not proof of a "
        "violation. The summary's verdict never comes from an estimate.",
    ),
    (
        "consistent",
        "The bound stays below the claim although the audit could have certified a bound as large as the "
        "claim: the attack found no contradiction where it could have.",
    ),
    (
        "inconclusive",
        "The bound stays below the claim, but the audit was too weak (too few samples) to certify a bound as "
        "large as the claim, so it could not have detected a violation. A model without a claim gets no "
        "verdict; its headline says what was shown ('leaks: ε ≥ …').",
    ),
    (
        "formal vs estimate",
        "Audits on canaries inserted at random at training time (one-run) and on many independent training "
        "runs (multi-run) are formal hypothesis tests. Audits on membership scores of an ordinary model "
        "(members drawn from the data) are estimates: they assume the members/non-members split behaves "
        "like independent trials of the DP neighbouring relation. The summary's headline is the strongest "
        "formal audit with its own verdict; the strongest estimate sits beside it.",
    ),
    (
        "threat model",
        "What the auditor saw and how many trainings the bound rests on: black-box (the final model's outputs) "
        "or white-box (every noisy update); one run (canaries inserted at random into one training) or many runs "
        "(independent trainings). A white-box bound can be far larger than a black-box one on the same model, so "
        "bounds are compared only under the same threat model, which is printed beside each.",
    ),
    (
        "noise check",
        "Gradient canaries in your own training loop see the clipped sum before the noise and the update after "
        "it, so the noise actually added is known: a χ² test per parameter group (noise std / σC below 1 "
        "rejects the claim) and tests of independence across steps and across parameter groups. A rejection is a "
        "formal violation.",
    ),
    (
        "Trade-off plot",
        "The curve is the best (FPR, FNR) any test can reach against an (ε, δ)-DP mechanism "
        "(Dong, Roth & Su 2022, Prop. 2.5). An audit point with its confidence box entirely below the "
        "curve contradicts the claim. A formal one-run audit has no single (FPR, FNR): it is drawn as the "
        "curve of (ε, δ) at its lower bound, which the mechanism's true curve goes below somewhere.",
    ),
)


def num(x: Any, spec: str = ".3f") -> str:
    """A report number formatted with ``spec``; None → —, ±∞ → ±∞, NaN → nan.

    For unitless numbers (AUC, advantage, ε, δ, losses); fractions that mean "how often" go through
    :func:`rate` or :func:`percent`, so that no bare 0.05 meaning 5% reaches a reader.
    """
    v = as_float(x)
    if v is None:
        return DASH
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    # "z" (PEP 682): a zero, or a number that rounds to zero, prints without a sign. A loss attack's threshold of -0.0
    # (a loss of 0, negated) read "-0" in the HTML audit table where `audit` printed "0", and an advantage of -0.0001
    # read "-0.000".
    return format(v, f"z{spec}" if spec.startswith(".") else spec)


def bound_eps(x: Any) -> str:
    """An ε LOWER bound (formal or estimated, shown after "≥"), rounded down (:func:`dpaudit.numfmt.lower`)."""
    return numfmt.lower(x, BOUND_DIGITS)


def audit_eps(audit: Mapping[str, Any]) -> tuple[str, str, str]:
    """An audit row's ε lower bound (rounded down), the ε it was judged against (rounded up) and the largest ε its
    design could certify (rounded up), with digits enough that each compares with the claim as the computed
    numbers do (:func:`dpaudit.report._data.shown_against`): a violation never reads "7.99 | 7.99995", an
    inconclusive audit never "7.9995 | 8" (claim, then max certifiable). A per-step audit's claim is ONE step's
    claim, and says so."""
    claim, (bound,), (most,) = shown_against(
        audit.get("claimed_epsilon"), [audit["epsilon_lower_bound"]], [audit.get("max_certifiable_epsilon")]
    )
    return bound, (f"{claim} (one step)" if is_per_step(audit) and claim != DASH else claim), most


def rate(x: Any) -> str:
    """A rate in [0, 1] (TPR, FPR, FNR, accuracy) as a percentage with 3 significant digits.

    0.0644 → 6.44%, 0.79 → 79.0%, 0.000123 → 0.0123%, 1 → 100%; None → —. The JSON keeps the fraction.
    """
    return percent(x, digits=3)


def percent(x: Any, digits: int | None = None) -> str:
    """A fraction as a percentage with a % sign, in fixed notation (1e-05% reads badly).

    ``digits`` None: as given, up to 6 significant digits rounded down and no trailing zeros (0.95 → 95%,
    0.999 → 99.9%, 0.9999999 → 99.9999%: :func:`dpaudit.numfmt.percent_down`), for confidence levels;
    ``digits`` n: n significant digits (0.79 → 79.0% for n = 3), for measured rates (see :func:`rate`).
    None → —, ±∞ → ±∞, NaN → nan (no % sign).
    """
    v = as_float(x)
    if v is None or not math.isfinite(v):
        return num(v)
    if digits is None:  # a confidence level: rounded down, never 100% for 0.9999999
        return numfmt.percent_down(v)
    p = 100 * v
    if p == 0:
        return "0%"
    # Decimals for the significant digits, counted on the rounded value so that 99.96 gives 100, not 100.0.
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(p))))
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(round(p, decimals)))))
    return f"{p:.{decimals}f}%"


def rate_interval(ci: Any) -> str:
    """A confidence interval on a rate (an audit's FPR or FNR, Clopper–Pearson) as percentages at 3 significant
    digits, rounded outward (:func:`dpaudit.numfmt.percent_down` and :func:`~dpaudit.numfmt.percent_up`): the printed
    interval contains the computed one. To nearest, [0.0345, 0.12344] printed [3.45%, 12.3%], an upper end below
    the bound computed."""
    if not ci:
        return DASH
    return f"[{numfmt.percent_down(ci[0], 3)}, {numfmt.percent_up(ci[1], 3)}]"


def interval(ci: Any) -> str:
    """A bootstrap interval (an attack's AUC) at 3 significant digits, rounded outward (:func:`dpaudit.numfmt.lower`
    and :func:`~dpaudit.numfmt.upper`) and padded to 3 decimals as :func:`num` prints the point estimate beside it:
    the printed interval contains the computed one. To nearest, [0.53549, 0.60049] printed [0.535, 0.600]."""
    if not ci:
        return DASH

    def padded(text: str) -> str:  # "0.6" -> "0.600"; scientific, ∞ and nan as they are
        whole, _, frac = text.partition(".")
        return f"{whole}.{frac.ljust(3, '0')}" if text[-1].isdigit() and "e" not in text else text

    return f"[{padded(numfmt.lower(ci[0], 3))}, {padded(numfmt.upper(ci[1], 3))}]"


def claim_text(claim: Mapping[str, Any] | None, shown: str | None = None) -> str:
    """A model's claim, '7.99996 (δ = 1e-05)': ε rounded up (:func:`dpaudit.numfmt.upper`), or as ``shown``
    (:func:`dpaudit.report._data.shown_against`), δ as given."""
    if claim is None:
        return "∞ (non-private)"
    return f"{shown or numfmt.upper(claim['epsilon'])} (δ = {numfmt.exact(claim['delta'])})"


def bound_text(digest: Mapping[str, Any] | None, shown: str | None = None) -> str:
    """'≥ 3.41 [white-box, one run] (whitebox-canaries, one-run, 95%)' for a summary's formal or estimate
    digest (its threat model first: bounds under different ones are not comparable); — without one. The bound
    rounded down, or as ``shown`` (:func:`dpaudit.report._data.shown_against`)."""
    if digest is None:
        return DASH
    threat = f"[{digest['threat_model']}] " if digest.get("threat_model") else ""
    return (
        f"≥ {shown or bound_eps(digest['epsilon_lower_bound'])} {threat}({digest['attack']}, {digest['method']}, "
        f"{percent(digest['confidence'])})"
    )


def audit_kind(audit: Mapping[str, Any]) -> str:
    """'formal (white-box, one run)' or 'estimate (black-box, model's members)'; a test of the claimed curve
    (one-run f-DP against the claim's own curve family) is formal as a test, its ε an estimate."""
    kind = "formal" if audit["formal"] else "estimate"
    if audit.get("refutation") and not audit["formal"]:
        kind = "formal curve test, ε an estimate"
    return f"{kind} ({audit['threat_model']})" if audit.get("threat_model") else kind


def tpr_cell(attack: Mapping[str, Any], key: str) -> str:
    """The TPR at FPR ``key`` of a membership attack, or why its sample cannot resolve that FPR."""
    needed = nonmembers_needed(float(key))
    if attack["n_nonmembers"] < needed:
        return f"n/a: needs ≥ {needed} non-members"
    return rate(attack["tpr_at_fpr"].get(key))


def with_attack(value: str, attack: str | None) -> str:
    return value if attack is None or value == DASH else f"{value} ({attack})"


def tpr_keys(attacks: list[Mapping[str, Any]]) -> list[str]:
    """The FPR levels of tpr_at_fpr present in any attack, in increasing order."""
    keys = {k for a in attacks for k in a["tpr_at_fpr"]}
    return sorted(keys, key=float)


def fpr_label(key: str) -> str:
    return f"TPR@{100 * float(key):g}% FPR"


def _labelled(d: Mapping[str, Any], keys: tuple[tuple[str, str], ...]) -> list[str]:
    return [f"{label} {d[key]}" for key, label in keys if d.get(key) is not None]


_SGD_KEYS = (("epochs", "epochs"), ("steps", "steps"), ("batch_size", "batch"), ("lr", "lr"), ("seed", "seed"))
_DP_KEYS = (("noise_multiplier", "σ"), ("clip", "C"), ("sample_rate", "q"), ("sampling", "sampling"))
_CONVEX_ALGOS = ("outpert", "outpert-gaussian", "objpert")  # closed-form learners (dpaudit.training.convex)
_DPAGD_ALGOS = ("dpagd", "dpagd-huber")  # full-batch gradient descent (dpaudit.training.dpagd)


def training_text(training: Mapping[str, Any]) -> str:
    """The training line in the algorithm's own terms: SGD settings for (DP-)SGD; teachers, shots, queries
    and the aggregator's noise for PATE / DP-ICL (whose student is post-processing of the answers); the L2
    coefficient λ for the closed-form convex learners; C, λ and the budget's splits for full-batch DP-AGD (the SGD
    settings it never reads once read "dpagd, epochs 30, batch 64, lr 0.1, …, sampling poisson"); steps and canaries
    for the user's own loop. An
    imported run (``dpaudit import``) says so, and that its recipe, if any, is the attacker's approximation."""
    if training.get("source") is not None:  # dpaudit.training.run.import_run
        imported = f"imported from {training['source']}"
        if training["algo"] == "imported":
            return f"{imported} (trained outside dpaudit; no recipe given)"
        rest = {k: v for k, v in training.items() if k not in ("source", "recipe_source")}
        return f"{imported}; recipe from the {training.get('recipe_source', 'user')}: {training_text(rest)}"
    algo = str(training["algo"])
    agg = training.get("aggregation")
    if isinstance(agg, Mapping):  # PATE / DP-ICL (dpaudit.training.pate): the private step is the aggregator
        recipe = agg.get("recipe") or {}
        aggregator = recipe.get("aggregator") or {}
        parts = [algo, *_labelled(recipe, (("teachers", "teachers"), ("shots", "shots"), ("queries", "queries")))]
        if aggregator.get("name"):
            parts.append(f"aggregator {aggregator['name']}")
        parts += _labelled(aggregator, (("sigma", "σ"), ("sigma1", "σ1"), ("threshold", "T"), ("sample_rate", "q")))
        if agg.get("n_answered") is not None:
            parts.append(f"answered {agg['n_answered']} of {agg.get('n_queries', '?')}")
        student = training.get("student_algo")
        if student and algo == "pate":  # PATE's student is part of the recipe; DP-ICL's only post-processes
            parts.append(f"student {student} ({', '.join(_labelled(training, _SGD_KEYS))})")
        elif student:
            parts.append(f"student {student} trained on the answers (post-processing)")
        return ", ".join(parts)
    if algo in _CONVEX_ALGOS:
        return ", ".join([algo, *_labelled(training, (("weight_decay", "λ (L2)"), ("seed", "seed")))])
    if algo in _DPAGD_ALGOS:  # reads C_grad, λ and --steps (its "splits") only: no epochs, batches, lr or sampling
        dp = _labelled(training.get("dp") or {}, (("clip", "C"),))
        own = _labelled(training, (("weight_decay", "λ (L2)"), ("steps", "splits"), ("seed", "seed")))
        return ", ".join([algo, *dp, *own])
    if algo == "own-loop":  # a saved gradient-canary audit (dpaudit.report.build.canary_run_entry)
        parts = [
            "your own training loop",
            *_labelled(training, (("steps", "steps"), ("gradient_canaries", "canaries"))),
        ]
        return ", ".join(parts + _labelled(training.get("dp") or {}, _DP_KEYS))
    return ", ".join([algo, *_labelled(training, _SGD_KEYS), *_labelled(training.get("dp") or {}, _DP_KEYS)])


NOT_MEASURED = "not measured (own training loop)"  # a saved canary audit: dpaudit never saw the model or data


def utility_rows(model: Mapping[str, Any]) -> list[list[str]]:
    """The utility table's rows (split, accuracy, loss), unescaped. A saved gradient-canary audit of the user's
    own loop has no model or data here, so its utility reads as not measured, not as a missing number."""
    u = model["utility"]
    own = model["training"].get("algo") == "own-loop"
    rows = []
    for split in ("train", "holdout", "test"):
        if f"{split}_accuracy" not in u:
            continue
        acc, loss = u.get(f"{split}_accuracy"), u.get(f"{split}_loss")
        rows.append([
            split,
            NOT_MEASURED if own and acc is None else rate(acc),
            NOT_MEASURED if own and loss is None else num(loss),
        ])  # fmt: skip
    return rows


def claim_details(claim: Mapping[str, Any] | None) -> str:
    if claim is None:
        return "none (non-private training; treated as ε = ∞)"
    parts = [f"ε = {numfmt.upper(claim['epsilon'])}, δ = {numfmt.exact(claim['delta'])}"]
    for key, label in (("accountant", "accountant"), ("neighbouring", "neighbouring")):
        if claim.get(key):
            parts.append(f"{label} {claim[key]}")
    for key, label in (("noise_multiplier", "σ"), ("sample_rate", "q"), ("steps", "steps"), ("clip", "C")):
        if claim.get(key) is not None:
            parts.append(f"{label} {claim[key]}")
    accounting = claim.get("accounting")  # a saved canary audit's claim check (dpaudit.workflows.hooks_audit)
    if isinstance(accounting, Mapping) and accounting.get("statement"):
        parts.append(f"claim check: {accounting['statement']}")
    dd = claim.get("data_dependent")  # PATE / DP-ICL (dpaudit/aggregation.py): beside the claim, never it
    if isinstance(dd, Mapping) and dd.get("epsilon") is not None:
        # Not itself private and not the claim, but no estimate either: ε(δ) of the data-dependent RDP bound
        # (dpaudit.aggregation.data_dependent_epsilon), an upper bound on this dataset's privacy loss, so rounded up
        # (dpaudit.numfmt.upper) as every ε that bounds a loss from above is; to nearest, 2.8544449 printed 2.85444.
        parts.append(f"data-dependent ε = {numfmt.upper(dd['epsilon'])} (not itself private, not the claim)")
    return ", ".join(parts)


def short_hash(h: str | None) -> str:
    return DASH if not h else h[:12]


def code_spans(text: str) -> list[tuple[str, bool]]:
    """``text`` cut at its backticks into ``(segment, is_code)`` pieces: what lies between a pair of backticks is a
    code span (a command a note names, `` `dpaudit audit plan ...` ``), the rest plain text; each renderer escapes
    the plain pieces as any text and shows the code pieces verbatim in its own code markup (Markdown's code span,
    HTML's ``<code>``, both literal: no markup or HTML inside one is interpreted). An odd number of backticks, or a
    blank span (two adjacent backticks would open a Markdown code span of their own), leaves the whole text
    plain."""
    pieces = text.split("`")
    spans = pieces[1::2]
    if len(pieces) % 2 == 0 or any(not s.strip() for s in spans):
        return [(text, False)]
    return [(piece, i % 2 == 1) for i, piece in enumerate(pieces) if piece or i % 2 == 1]


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
    "formal ε lower bound",
    "estimate (not a formal test)",
    "best attack AUC",
    "TPR@0.1% FPR",
    "verdict",
)


def summary_cells(model: Mapping[str, Any]) -> list[str]:
    """The summary row's text cells (all but the verdict), unescaped; each renderer escapes them. The claimed ε
    and the bounds beside it print so that they compare as the numbers do (:func:`summary_eps`)."""
    s = model["summary"]
    claimed, formal, estimated = summary_eps(model)
    estimate = bound_text(s["estimate"], estimated)
    if s["estimate_verdict"] == "estimate-exceeds-claim":
        estimate += " — exceeds the claim"
    return [
        str(model["name"]),
        claim_text(model["claim"], claimed),
        bound_text(s["formal"], formal),
        estimate,
        with_attack(num(s["best_auc"]), s["best_auc_attack"]),
        tpr_summary(s),
    ]


def tpr_summary(s: Mapping[str, Any]) -> str:
    """The summary's TPR at the low FPR, or why no attack's sample resolves it."""
    unresolved = s.get("tpr_at_low_fpr_unresolved")
    if s["tpr_at_low_fpr"] is None and unresolved:
        return f"n/a: needs ≥ {unresolved['nonmembers_needed']} non-members ({unresolved['nonmembers']} here)"
    return with_attack(rate(s["tpr_at_low_fpr"]), s["tpr_at_low_fpr_attack"])


def verdict_label(model: Mapping[str, Any]) -> str:
    """The summary's verdict in words; a model without a claim shows what was demonstrated."""
    s = model["summary"]
    if model["claim"] is None:
        f = s["formal"]
        if f is not None and (as_float(f["epsilon_lower_bound"]) or 0.0) > 0:
            threat = f" ({f['threat_model']})" if f.get("threat_model") else ""
            return f"leaks: ε ≥ {bound_eps(f['epsilon_lower_bound'])} shown{threat}"
        return "no claim"
    return VERDICT_TEXT[s["verdict"]]


def console_summary(report: Mapping[str, Any]) -> list[str]:
    """The report's summary as a terminal shows it (``dpaudit report`` and ``dpaudit demo``): one line per model,
    its name, its claim and its headline (a violation's first word in capitals, as the tables show it). Plain
    text: the Markdown table's escapes (``\\[``, ``\\>``) read as noise on a terminal; the CLI's printer writes
    control characters out."""
    lines = []
    for m in report["models"]:
        headline = " ".join(str(m["summary"]["headline"]).split())
        if m["summary"].get("verdict") == "violation" and headline.startswith("violation"):
            headline = "VIOLATION" + headline.removeprefix("violation")
        # the claim as the summary row and the headline print it (summary_eps): upper(claim) alone read "claimed ε 2"
        # before a headline reading "claimed 1.9999954" on the same line
        lines.append(f"{m['name']} (claimed ε {claim_text(m['claim'], summary_eps(m)[0])}): {headline}")
    return lines


def scalar_results(result: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """A result's numbers, nested dicts one level deep as ``group.key`` (e.g. ``members.advantage``)."""

    def is_num(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    out = []
    for k, v in result.items():
        if is_num(v):
            out.append((k, v))
        elif isinstance(v, Mapping) and k != "params":
            out += [(f"{k}.{kk}", vv) for kk, vv in v.items() if is_num(vv)]
    return out


def scalar_text(key: str, value: Any) -> str:
    """One of a family result's numbers (see :func:`scalar_results`) as the report prints it: an ε lower bound
    rounded down, a claimed ε (``*claim*``, ``epsilon``, ``composed_epsilon``) and a guarantee's parameter (a cloak's
    per-feature local-DP ε ``*_feature_epsilon`` and its GDP ``composed_mu``) rounded up at claim precision, a max
    certifiable ε rounded up, δ as given (dpaudit.numfmt); a rate (an accuracy, a fidelity, :data:`_RATE_KEYS`) as a
    percentage (:func:`rate`); an integer (a count) exactly; any other number (an estimate) ``.4g``, to nearest."""
    leaf = key.rpartition(".")[2]
    if "lower_bound" in leaf:
        return numfmt.lower(value, 4)
    if leaf == "delta":  # a parameter, as given (dpaudit.numfmt.exact): never rounded to another δ
        return numfmt.exact(value)
    # A cloak's per-feature ε (each feature a Gaussian mechanism, dpaudit.training.cloak.local_dp) and the μ of their
    # GDP composition are its formal guarantee: ``.4g`` printed a max_feature_epsilon of 22544.5 as 2.254e+04.
    if "claim" in leaf or leaf in ("epsilon", "composed_epsilon", "composed_mu") or leaf.endswith("_feature_epsilon"):
        return numfmt.upper(value)
    if leaf.startswith("max_certifiable"):
        return numfmt.upper(value, 4)
    if leaf.endswith("accuracy") or leaf.startswith("fidelity") or leaf in _RATE_KEYS:
        return rate(value)  # "how often": a percentage, as the utility table and the attack commands print it
    if isinstance(value, int):  # a count (records, permutations) is exact: .4g printed 40000 as "4e+04"
        return str(value)
    return num(value, ".4g")


# A family result's fractions that mean "how often" (besides *accuracy and fidelity*): printed as percentages by
# :func:`rate`, as `dpaudit train --algo cloak` prints them; ``.4g`` showed the cloak's suppression_ratio 0.7627 and
# accuracy_loss 0.2429 beside the CLI's "suppressed 76.3%" and "loss 24.3%", and an extraction's target_accuracy 0.922
# below a utility table reading 92.2%.
_RATE_KEYS = ("accuracy_loss", "suppression_ratio", "positive_rate", "fraction")  # fraction: left_out's (attribute)


NOISE_HEADER = ("parameter group", "noise values", "noise std / σC (estimate)", "upper bound", "p-value", "resolves ≤")


def _ratio_upper(x: Any) -> str:
    """A group's upper confidence bound on noise std / σC, rounded up (:func:`dpaudit.numfmt.upper`) with digits
    enough to compare with 1 as it does (:func:`dpaudit.numfmt.ordered`): the group is rejected exactly when the
    bound is below 1 (the χ² test and its confidence bound are dual), so 0.99996 never prints as "1"."""
    v = as_float(x)
    if v is None or not math.isfinite(v):
        return numfmt.upper(v)
    return numfmt.ordered(v, 1.0, left_digits=4, left_up=True)[0]


def noise_rows(check: Mapping[str, Any]) -> list[list[str]]:
    """One row per parameter group of a noise check (unescaped text): the ratio is an estimate (to nearest), its
    upper bound rounded up (:func:`_ratio_upper`), the ratio the group resolves rounded down (never more power
    than it has)."""
    return [
        [
            str(g["name"]),
            str(g["dof"]),
            num(g["ratio"], ".4g"),
            _ratio_upper(g.get("ratio_upper")),
            numfmt.p_value(g["p_value"], name=""),
            numfmt.lower(g.get("resolvable_ratio"), 4),
        ]
        for g in check["groups"]
    ]


def noise_lines(check: Mapping[str, Any]) -> list[str]:
    """The noise check's verdict and its two tests' p-values, in words (unescaped)."""
    indep, cross = check.get("independence_p_value"), check.get("cross_group_p_value")
    return [
        f"{check['statement']}: {VERDICT_TEXT[check['verdict']]}",
        f"claimed noise std σC = {num(check['noise_std'], '.4g')}; variance test "
        f"{numfmt.p_value(check['variance_p_value'])} (Bonferroni over groups); independence across steps "
        + (numfmt.p_value(indep) if indep is not None else "not tested")
        + (f"; independence across parameter groups {numfmt.p_value(cross)}" if cross is not None else ""),
        *(str(n) for n in check.get("notes") or []),
    ]
