"""The report's data conventions, shared by the builder and the renderers: JSON spelling of numbers,
canonical text, the low-FPR convention and the (ε, δ) trade-off curve the plots draw.

The bottom of the report room: the builder (:mod:`dpaudit.report.build`) and the renderers
(:mod:`~dpaudit.report.markdown`, :mod:`~dpaudit.report.html`, :mod:`~dpaudit.report.plots`) import
it, it imports none of them, so the room has no import circle (issue 23).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpaudit import numfmt

LOW_FPR = 0.001  # the summary's TPR is read at FPR = 0.1 % (Carlini et al. 2022, "MIA from first principles")
# Every ε and δ of the report is printed by dpaudit.numfmt (δ as given): claims rounded up at 6 significant digits,
# lower bounds rounded down at BOUND_DIGITS (a claim is never under-reported; a bound shown is implied by the computed
# one).
BOUND_DIGITS = 3


# --------------------------------------------------------------------------- JSON helpers


def as_float(x: Any) -> float | None:
    """A report number as a float: ``"inf"``/``"-inf"``/``"nan"`` map back to non-finite floats."""
    if x is None:
        return None
    return float(x)


def jsonable(obj: Any) -> Any:
    """A JSON-ready copy: numpy scalars/arrays to Python, non-finite floats to strings, keys to str."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def dumps(report: Mapping[str, Any]) -> str:
    """The canonical text of a report (deterministic: the same report gives the same bytes)."""
    return json.dumps(jsonable(report), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def sha256_json(obj: Any) -> str:
    """SHA-256 of canonical JSON (sorted keys, no whitespace), so equal configs hash equally."""
    text = json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------- statistics


def tradeoff_curve(alpha: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The (ε, δ)-DP trade-off function: the least type-II error (FNR) at type-I error (FPR) α.

    Dong, Roth & Su 2022, "Gaussian Differential Privacy", JRSS-B (arXiv:1905.02383), Prop. 2.5:
        f_{ε,δ}(α) = max{0, 1 − δ − e^ε α, e^{−ε} (1 − δ − α)}.
    A test (FPR, FNR) strictly below this curve contradicts the (ε, δ) claim.
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    if epsilon > 700.0:  # e^ε overflows a float (JL claims reach 1e9): at that ε the curve is 0 for α > 0
        return np.where(alpha > 0, np.maximum(0.0, 1.0 - delta - np.exp(min(epsilon, 700.0)) * alpha), 1.0 - delta)
    return np.maximum.reduce(
        [np.zeros_like(alpha), 1.0 - delta - math.exp(epsilon) * alpha, math.exp(-epsilon) * (1.0 - delta - alpha)]
    )


# --------------------------------------------------------------------------- ε as shown


def shown_against(claim: Any, bounds: Sequence[Any], uppers: Sequence[Any] = ()) -> tuple[str, list[str], list[str]]:
    """A claimed ε (rounded up, :func:`dpaudit.numfmt.upper`), the ε lower bounds shown beside it (``bounds``,
    rounded down at :data:`BOUND_DIGITS`) and the upper bounds (``uppers``, "certifies at most", rounded up at
    BOUND_DIGITS), each with digits enough that it compares with the ONE printed claim as the computed numbers do
    (:func:`dpaudit.numfmt.against`): a row or a plot never reads "ε ≥ 7.99 | claimed 7.99996 | violation" for a
    bound of 7.999957 above a claim of 7.999954, nor "at most 8 | claimed 7.9995 | inconclusive". None →
    ``numfmt.DASH``."""
    return numfmt.against(
        as_float(claim), [as_float(b) for b in bounds], [as_float(m) for m in uppers], digits=BOUND_DIGITS
    )


def summary_eps(model: Mapping[str, Any]) -> tuple[str, str, str]:
    """A model's claimed ε and its summary's formal and estimate lower bounds as every rendering prints them
    (the Markdown and HTML summary rows, the ε figure): :func:`shown_against` the model's claim (∞ without one)."""
    s = model["summary"]
    bounds = [s[kind]["epsilon_lower_bound"] if s[kind] else None for kind in ("formal", "estimate")]
    # The formal audit's max certifiable ε is not in the row, but the headline beside it prints it against the claim
    # (dpaudit.workflows.result.headline): counted here too, the row's claim reads as the headline's.
    most = [s["formal"].get("max_certifiable_epsilon")] if s["formal"] else []
    claim, (formal, estimate), _ = shown_against(
        model["claim"]["epsilon"] if model["claim"] else math.inf, bounds, most
    )
    return claim, formal, estimate


# --------------------------------------------------------------------------- what the plots draw

_VERDICT_WORDS = {"violation": "VIOLATION", "curve-refuted": "claimed curve refuted", None: "no verdict"}


def _verdict_words(v: str | None) -> str:
    return _VERDICT_WORDS.get(v, str(v).replace("-", " "))


def is_per_step(audit: Mapping[str, Any]) -> bool:
    """Whether an audit entry tests one step's claim (its ``claimed_epsilon`` is that step's, not the model's)."""
    return (audit.get("details") or {}).get("per_step_claimed_epsilon") is not None


def _audit_claim(model: Mapping[str, Any], audit: Mapping[str, Any]) -> float | None:
    """The ε an audit is read against: its own claimed ε, else the model's (as its effective verdict is)."""
    e = as_float(audit.get("claimed_epsilon"))
    if e is None and model["claim"] is not None:
        e = as_float(model["claim"]["epsilon"])
    return e


def audits_eps_shown(model: Mapping[str, Any]) -> tuple[dict[float, str], list[str]]:
    """Each claim the model's audits are read against, printed once (claim value → text), and each audit's ε
    lower bound as printed beside it: :func:`shown_against` per claim, so that on one plot every bound compares
    with its claim's one label as the numbers do (a violation never reads "ε ≥ 7.99" beside "claimed ε = 7.99996")."""
    groups: dict[float | None, list[int]] = {}
    for i, a in enumerate(model["audits"]):
        groups.setdefault(_audit_claim(model, a), []).append(i)
    if model["claim"] is not None:
        groups.setdefault(as_float(model["claim"]["epsilon"]), [])
    claims: dict[float, str] = {}
    bounds = [""] * len(model["audits"])
    for c, idx in groups.items():
        text, shown, _ = shown_against(c, [model["audits"][i]["epsilon_lower_bound"] for i in idx])
        if c is not None:
            claims[c] = text
        for i, b in zip(idx, shown, strict=True):
            bounds[i] = b
    return claims, bounds


def claims_to_draw(model: Mapping[str, Any]) -> list[tuple[float, float, str]]:
    """(ε, δ, label) of the model's claim and of any different claim an audit was checked against; each ε as
    :func:`audits_eps_shown` prints it, δ as given (:func:`dpaudit.numfmt.exact`)."""
    shown = audits_eps_shown(model)[0]  # a NaN claim is no dict key (NaN != NaN): printed on its own
    claims: list[tuple[float, float, str]] = []
    if model["claim"] is not None:
        e, d = as_float(model["claim"]["epsilon"]), float(model["claim"]["delta"])
        claims.append((e, d, f"claimed ε = {shown.get(e, numfmt.upper(e))}, δ = {numfmt.exact(d)}"))
    for a in model["audits"]:
        e = as_float(a.get("claimed_epsilon"))
        d = float(a["delta"])
        # A per-step audit (dpaudit.workflows.whitebox.steps_record) checks ONE step's claim, not the model's.
        what = "one step's claim, checked by the per-step audit" if is_per_step(a) else "checked by an audit"
        if e is not None and math.isfinite(e) and all(abs(e - c[0]) > 1e-12 or d != c[1] for c in claims):
            claims.append((e, d, f"ε = {shown.get(e, numfmt.upper(e))}, δ = {numfmt.exact(d)} ({what})"))
    return claims


def tradeoff_layers(model: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """What a model's trade-off plot draws, from its report entry alone (:func:`dpaudit.report.plots.
    tradeoff_figure` draws exactly this, so a test of the data is a test of the plot):

    - ``claims``: the claimed (ε, δ) curves;
    - ``points``: audits with an operating point (FPR, FNR) and its confidence box, formal or estimate;
    - ``formal_bounds``: every formal ε bound without an operating point (one-run audits: the guesses of
      Steinke, Nasr & Jagielski 2023 give no single (FPR, FNR)), drawn as the (ε, δ) curve at the bound,
      which the mechanism's true trade-off curve must go below somewhere (Dong, Roth & Su 2022, Prop. 2.5);
      a bound of 0 shows nothing and is listed (``drawn`` False), not drawn;
    - ``refutations``: every formal test of the claimed curve (one-run f-DP audits against the claim's own
      curve family, or one step's for a per-step audit), listed with what it showed: refuted or not. A test
      that refutes nothing is still the formal audit behind a verdict when no ε bound is (per-step canaries).

    Every formal audit of the model is in ``points`` or ``formal_bounds``, so the audit behind the verdict is
    always on the plot, labelled formal and with its threat model."""
    claims = [{"epsilon": e, "delta": d, "label": label} for e, d, label in claims_to_draw(model)]
    shown = audits_eps_shown(model)[1]
    points, bounds, refutations = [], [], []
    for i, a in enumerate(model["audits"]):
        kind = "formal" if a["formal"] else "estimate"
        threat = a.get("threat_model") or "?"
        lb = as_float(a["epsilon_lower_bound"])
        verdict = a.get("effective_verdict", a.get("verdict"))
        common = {"audit_index": i, "attack": a["source"]["attack"], "method": a["method"], "formal": a["formal"],
                  "threat_model": threat, "verdict": verdict, "epsilon_lower_bound": lb}  # fmt: skip
        if a.get("refutation"):
            curve = "claimed step curve" if is_per_step(a) else "claimed curve"
            result = "refuted" if verdict == "curve-refuted" else f"not refuted ({_verdict_words(verdict)})"
            label = f"formal [{threat}] {a['source']['attack']} / {a['method']}: {curve} {result}"
            refutations.append({**common, "label": label, "statement": a["refutation"].get("statement")})
        if a.get("operating_point"):
            label = (
                f"{kind} [{threat}] {a['source']['attack']} / {a['method']}: ε ≥ {shown[i]} ({_verdict_words(verdict)})"
            )
            points.append({**common, "label": label, "operating_point": a["operating_point"]})
        elif a["formal"]:
            drawn = lb is not None and math.isfinite(lb) and lb > 0
            # δ as given (dpaudit.numfmt.exact): never rounded to another δ.
            delta = numfmt.exact(a["delta"])
            what = f"not ({shown[i]}, δ = {delta})-DP" if drawn else "ε ≥ 0, nothing shown"
            label = f"formal [{threat}] {a['source']['attack']} / {a['method']}: {what} ({_verdict_words(verdict)})"
            bounds.append({**common, "label": label, "delta": float(a["delta"]), "drawn": drawn})
    return {"claims": claims, "points": points, "formal_bounds": bounds, "refutations": refutations}
