"""Report figures (matplotlib, Agg): each ``*_figure`` builds a Figure from the report dict only.

Figures are built with the object API (``matplotlib.figure.Figure``), never through pyplot, so
there is no global figure registry to leak into or close, and rendering is thread-safe. No backend is
selected: ``savefig(format="png")`` renders with Agg whatever the backend, and ``matplotlib.use("Agg")``
here switched a notebook's own backend (``%matplotlib inline``) for the rest of its session, so its
``plt.show()`` showed nothing. :func:`png` turns a figure
into deterministic PNG bytes (fixed style, fixed dpi, no "Software"/date metadata).
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Mapping
from typing import Any

import matplotlib
import numpy as np
from matplotlib import style
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedLocator

from dpaudit import numfmt
from dpaudit.report._data import LOW_FPR, as_float, summary_eps, tradeoff_curve, tradeoff_layers
from dpaudit.validation import visible

DPI = 120
VERDICT_COLORS = {
    "violation": "#c62828",
    "estimate-exceeds-claim": "#6a1b9a",
    "curve-refuted": "#ad1457",
    "inconclusive": "#e08600",
    "consistent": "#2e7d32",
    None: "#757575",
}
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
# text.parse_math off: every text on a figure is literal. Names come from strangers' run folders, plug-ins and
# data files; with mathtext on, "$x^$" in a run name stopped the whole report (matplotlib's ValueError) and
# "$\alpha$" printed as α, a name the run does not have. No figure of ours uses mathtext.
_RC = {
    "font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8, "axes.grid": True, "grid.alpha": 0.3,
    "text.parse_math": False,
}  # fmt: skip


@functools.cache
def _glyphs() -> frozenset[int]:
    """The code points the figures' font (DejaVu Sans, shipped with matplotlib: the default style's) can draw."""
    from matplotlib import font_manager, ft2font

    with style.context("default"):
        path = font_manager.findfont(font_manager.FontProperties())
    return frozenset(ft2font.FT2Font(path).get_charmap())


def drawable(text: Any) -> str:
    """A report text as a figure shows it: control and bidirectional control characters written out
    (:func:`dpaudit.validation.visible`), and each character the font has no glyph for as its code point
    (模 → ⟨U+6A21⟩): matplotlib would draw the same empty box for all of them (two run names in Chinese read alike
    on the ε figure) and warn once per character. The Markdown and HTML text around the figure shows the names
    as they are."""
    glyphs = _glyphs()
    return "".join(c if ord(c) in glyphs or c == "\n" else f"⟨U+{ord(c):04X}⟩" for c in visible(text))


NAME_CHARS = 40  # a model name beside a figure's axis; longer ones squeezed the ε figure's axes to nothing


def short_name(name: Any) -> str:
    """A model name as a figure labels a row or point with it (:func:`drawable`), at most :data:`NAME_CHARS`
    characters: longer names keep their start and end (where run names differ) around "…"."""
    text = drawable(name)
    if len(text) <= NAME_CHARS:
        return text
    half = (NAME_CHARS - 1) // 2
    return text[:half] + "…" + text[-(NAME_CHARS - 1 - half) :]


def png(make: Callable[[], Figure | None]) -> bytes | None:
    """PNG bytes of the figure ``make()`` builds (None when it has nothing to show).

    The figure is built and saved under matplotlib's default style plus a few fixed settings, so
    the user's matplotlibrc cannot change the output, and the same report gives the same bytes.
    """
    with style.context("default"), matplotlib.rc_context(_RC):
        fig = make()
        if fig is None:
            return None
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def attack_colors(report: Mapping[str, Any]) -> dict[str, str]:
    """One colour per attack name, stable across all figures of a report (order of first appearance)."""
    names: list[str] = []
    for m in report["models"]:
        for a in m["attacks"].get("membership") or []:
            if a["attack"] not in names:
                names.append(a["attack"])
    return {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(names)}


def roc_figure(model: Mapping[str, Any], colors: Mapping[str, str]) -> Figure | None:
    """ROC curves of the model's membership attacks on log-log axes, with the chance diagonal."""
    attacks = [a for a in model["attacks"].get("membership") or [] if a.get("roc")]
    if not attacks:
        return None
    # The smallest non-zero rate a finite sample can show is 1/n; zeros cannot be drawn on log axes.
    lo = min(min(1.0 / max(1, min(a["n_members"], a["n_nonmembers"])) for a in attacks) / 2, LOW_FPR / 2)
    fig = Figure(figsize=(5.2, 4.4), layout="constrained")
    ax = fig.add_subplot()
    handles = ax.plot([lo, 1], [lo, 1], ls="--", color="#888888", lw=1, label="chance (AUC 0.5)")
    for a in attacks:
        fpr, tpr = np.asarray(a["roc"]["fpr"], dtype=float), np.asarray(a["roc"]["tpr"], dtype=float)
        keep = (fpr > 0) & (tpr > 0)
        label = drawable(f"{a['attack']} (AUC {a['auc']:.3f})")  # the tables' AUC (dpaudit.report._format.num)
        handles += ax.plot(fpr[keep], tpr[keep], color=colors.get(a["attack"]), lw=1.6, label=label)
    ax.axvline(LOW_FPR, color="#555555", lw=0.8, ls=":")
    ax.text(LOW_FPR * 1.1, lo * 1.3, "FPR 0.1%", fontsize=7, color="#555555")
    ax.set(xscale="log", yscale="log", xlim=(lo, 1), ylim=(lo, 1.05))
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title=drawable(f"ROC: {model['name']}"))
    # Handles passed explicitly: matplotlib leaves out of a legend any label that starts with "_", and a plug-in's
    # attack may be named so.
    ax.legend(handles=handles, labels=[h.get_label() for h in handles], loc="lower right")
    return fig


def tradeoff_figure(model: Mapping[str, Any], colors: Mapping[str, str]) -> Figure | None:
    """The claimed (ε, δ) trade-off curve with what :func:`~dpaudit.report._data.tradeoff_layers` lists: each
    audit's (FPR, FNR) point and confidence box, and each formal bound without one as the (ε, δ) curve at
    the bound (dash-dotted, in its verdict's colour), so the formal audit behind the verdict is always shown.

    A point whose box lies below the claimed curve contradicts the claim (Dong, Roth & Su 2022, Prop. 2.5).
    FPR is on a log axis so that the low-FPR region where strong audits live stays visible.
    """
    layers = tradeoff_layers(model)
    points, bounds, refuted = layers["points"], layers["formal_bounds"], layers["refutations"]
    if not (points or bounds or refuted):
        return None
    claims = [(c["epsilon"], c["delta"], c["label"]) for c in layers["claims"]]
    audits = model["audits"]
    # Left limit: below the smallest resolvable FPR, and far enough left to show each curve's knee
    # (the curve reaches FNR 0.5 near α = 0.5 e^{−ε}).
    curves = claims + [(b["epsilon_lower_bound"], b["delta"], "") for b in bounds if b["drawn"]]
    counts = [audits[p["audit_index"]]["counts"] for p in points]
    lo = min([1.0 / (c["fp"] + c["tn"]) / 3 for c in counts] + [1e-3])
    lo = max(1e-6, min([lo] + [0.1 * math.exp(-min(e, 700.0)) for e, _, _ in curves]))
    n_entries = len(claims) + len(points) + len(bounds) + len(refuted)
    fig = Figure(figsize=(5.6, 4.4 + 0.17 * n_entries), layout="constrained")
    ax = fig.add_subplot()
    alpha = np.geomspace(lo, 1.0, 400)
    for i, (e, d, label) in enumerate(claims):
        ax.plot(
            alpha, tradeoff_curve(alpha, e, d), color="black", lw=1.5, ls="-" if i == 0 else "--", label=drawable(label)
        )
    for b in bounds:  # formal one-run bounds: the mechanism's curve goes below this one somewhere
        color = VERDICT_COLORS.get(b["verdict"], VERDICT_COLORS[None])
        if b["drawn"]:
            curve = tradeoff_curve(alpha, b["epsilon_lower_bound"], b["delta"])
            ax.plot(alpha, curve, color=color, lw=2.0, ls="-.", label=drawable(b["label"]))
        else:  # ε ≥ 0 bounds nothing: listed, not drawn
            ax.plot([], [], ls="none", label=drawable(b["label"]))
    for r in refuted:
        ax.plot([], [], ls="none", label=drawable(r["label"]))
    # Different shapes, hollow but for gdp, so audits of the same scores at the same threshold stay visible.
    markers = {"gdp": ("o", 6), "clopper-pearson": ("s", 10), "one-run": ("^", 9), "one-run-fdp": ("D", 8)}
    for p in points:
        op = p["operating_point"]
        (x0, x1), (y0, y1) = op["fpr_interval"], op["fnr_interval"]
        color = colors.get(p["attack"], "#444444")
        ax.add_patch(
            Rectangle(
                (max(x0, lo), y0), x1 - max(x0, lo), y1 - y0, facecolor=color, alpha=0.15, edgecolor=color, lw=0.8
            )
        )
        marker, size = markers.get(p["method"], ("D", 8))
        ax.plot(
            max(op["fpr"], lo),
            op["fnr"],
            marker=marker,
            ms=size,
            mew=1.6,
            mfc=color if p["method"] == "gdp" else "none",
            color=color,
            ls="none",
            clip_on=False,
            label=drawable(p["label"]),
        )
    ax.set(xscale="log", xlim=(lo, 1.4), ylim=(-0.04, 1.04))  # a little room so points at (1, 0) stay visible
    title = drawable(f"Trade-off: {model['name']}" + (" (no claim: ε = ∞)" if model["claim"] is None else ""))
    ax.set(xlabel="false positive rate (α)", ylabel="false negative rate (β)", title=title)
    legend_title = "[threat model]; dash-dot: formal bound"
    if points:
        conf = points[0]["operating_point"]["confidence"]
        legend_title = f"boxes: {numfmt.percent_down(conf)} Clopper–Pearson per axis; " + legend_title
    fig.legend(loc="outside lower center", title=legend_title, title_fontsize=7)
    return fig


def _headline_bound(summary: Mapping[str, Any]) -> tuple[float | None, bool, str | None]:
    """The formal headline bound, else the strongest estimate (drawn grey); whether it is formal; its threat
    model."""
    for kind in ("formal", "estimate"):
        if summary[kind] is not None:
            d = summary[kind]
            return as_float(d["epsilon_lower_bound"]), kind == "formal", d.get("threat_model")
    return None, False, None


def epsilon_figure(report: Mapping[str, Any]) -> Figure | None:
    """Claimed ε (diamond) against the largest empirical lower bound (arrow from the bound upward), per model.

    The bound says "ε is at least this much", hence an arrow towards +∞; the claim violates it when
    the diamond sits left of the arrow's start. Each bound is labelled with its threat model: bounds under
    different threat models (white-box vs black-box, one run vs many) are not comparable. A bound of 0 shows
    nothing and gets a hollow tick, not an arrow. Thin bars mark the largest ε each audit could have
    certified (its power). The ε axis is linear up to 1 and logarithmic above (symlog), so ε = 0.5 and
    ε = 30 both stay readable; ∞ sits one step right of the largest finite value. The legend lists only
    what is drawn.
    """
    models = report["models"]
    if not models:
        return None
    finite = []
    for m in models:
        finite += [as_float(m["summary"]["claimed_epsilon"]), _headline_bound(m["summary"])[0]]
        finite += [as_float(a.get("max_certifiable_epsilon")) for a in m["audits"]]
        finite += [as_float(a.get("claimed_epsilon")) for a in m["audits"]]
    # Capped where the symlog axis still computes without overflow (1e308 x 2.6 is no float): a larger finite ε
    # (a stranger's report) sits at the right edge, its number printed beside it.
    top = min(1e100, max([2.0, *(v for v in finite if v is not None and math.isfinite(v))]))
    x_inf, xmax = top * 1.8, top * 2.6
    place = lambda v: x_inf if math.isinf(v) else min(v, xmax)  # noqa: E731
    fig = Figure(figsize=(6.6, 1.9 + 0.6 * len(models)), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xscale("symlog", linthresh=1.0, linscale=0.8)
    drawn: set[str] = set()
    for row, m in enumerate(models):
        y = len(models) - 1 - row
        s = m["summary"]
        lb, formal, threat = _headline_bound(s)
        color = VERDICT_COLORS.get(s["verdict"], VERDICT_COLORS[None]) if formal else "#9e9e9e"
        if lb is not None and lb > 0:
            ax.annotate(
                "", xy=(xmax, y), xytext=(place(lb), y), arrowprops={"arrowstyle": "-|>", "color": color, "lw": 2.2}
            )
            ax.plot([place(lb)] * 2, [y - 0.18, y + 0.18], color=color, lw=2.2)
            drawn.add("formal" if formal else "estimate")
        elif lb is not None:  # ε ≥ 0: nothing shown, so no arrow
            ax.plot(0, y, marker="o", ms=7, mfc="white", mec=color, ls="none", clip_on=False)
            drawn.add("zero")
        claim_shown, *bounds = summary_eps(m)  # as the summary table prints them
        if lb is not None:
            what = ("formal" if formal else "estimate") + (f", {threat}" if threat else "")
            text = f"ε ≥ {bounds[0 if formal else 1]} ({what})" if lb > 0 else f"ε ≥ 0: nothing shown ({what})"
            ax.annotate(
                drawable(text), (place(lb), y), xytext=(3, 6), textcoords="offset points", fontsize=7, color=color
            )
        for a in m["audits"]:
            cert = as_float(a.get("max_certifiable_epsilon"))
            if cert is not None:
                ax.plot([place(cert)] * 2, [y - 0.12, y + 0.12], color="#9e9e9e", lw=1)
                drawn.add("cert")
            claimed = as_float(a.get("claimed_epsilon"))
            if claimed is not None and m["claim"] is None:
                ax.plot(place(claimed), y, marker="D", ms=7, mfc="white", mec="black", ls="none")
                drawn.add("tested")
        x_claim = place(as_float(s["claimed_epsilon"]))
        ax.plot(x_claim, y, marker="D", ms=8, color="black", ls="none")
        ax.annotate(claim_shown, (x_claim, y), xytext=(0, -13), textcoords="offset points", fontsize=7, ha="center")
    ticks = [t for t in (0, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= top * 1.2]
    ax.set_xticks([*ticks, x_inf], [f"{t:g}" for t in ticks] + ["∞"])
    ax.xaxis.set_minor_locator(FixedLocator([]))
    ax.set_yticks(range(len(models)), [short_name(m["name"]) for m in reversed(models)])
    ax.set(
        xlim=(0, xmax), ylim=(-0.7, len(models) - 0.3), xlabel="ε",
        title="Claimed ε vs empirical lower bound (each under its own threat model)",
    )  # fmt: skip
    ax.grid(axis="y", visible=False)
    entries = {
        "formal": Line2D(
            [], [], color="#555555", lw=2.2, marker=">", label="formal lower bound (ε ≥ …), verdict colour"
        ),
        "estimate": Line2D([], [], color="#9e9e9e", lw=2.2, marker=">", label="estimate (no formal ε bound)"),
        "zero": Line2D([], [], marker="o", mfc="white", mec="#555555", ls="none", label="bound ε ≥ 0 (nothing shown)"),
        "tested": Line2D([], [], marker="D", mfc="white", mec="black", ls="none", label="ε tested by an audit"),
        "cert": Line2D([], [], color="#9e9e9e", lw=1, marker="|", ls="none", ms=10, label="largest certifiable ε"),
    }
    handles = [Line2D([], [], marker="D", color="black", ls="none", label="claimed ε")]
    handles += [h for key, h in entries.items() if key in drawn]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
    return fig


def privacy_utility_figure(report: Mapping[str, Any]) -> Figure | None:
    """Test accuracy against claimed ε, one point per model, coloured by its verdict (log ε axis; non-private
    models at "∞", right). Models are not joined: separately trained models form no frontier. A model whose
    claim a formal audit refuted (violation, claimed curve refuted) is marked with a cross and "claim
    refuted": its claimed ε is not its privacy. The legend lists only what is drawn."""
    points = []
    for m in report["models"]:
        acc = m["utility"].get("test_accuracy")
        if acc is not None:
            points.append(
                (
                    as_float(m["summary"]["claimed_epsilon"]),
                    float(acc),
                    m["name"],
                    m["utility"].get("train_accuracy"),
                    m["summary"]["verdict"],
                )
            )
    if not points:
        return None
    finite = [p[0] for p in points if math.isfinite(p[0]) and p[0] > 0]
    lo, hi = (min(finite), max(finite)) if finite else (1.0, 1.0)
    x_inf = hi * 4
    xs = [x_inf if math.isinf(e) else max(e, lo / 4) for e, *_ in points]
    fig = Figure(figsize=(6.2, 4.0), layout="constrained")
    ax = fig.add_subplot()
    drawn: set[str] = set()
    for x, (_, acc, name, train, verdict) in zip(xs, points, strict=True):
        color = VERDICT_COLORS.get(verdict, VERDICT_COLORS[None])
        refuted = verdict in ("violation", "curve-refuted")
        if train is not None:
            ax.plot([x, x], [acc, train], color="#b0bec5", lw=1, zorder=1)
            ax.plot(x, train, marker="o", mfc="white", mec=color, ls="none", zorder=2)
            drawn.add("train")
        ax.plot(x, acc, marker="X" if refuted else "o", ms=9 if refuted else 6, color=color, ls="none", zorder=3)
        drawn.add("refuted" if refuted else "test")
        right = x == max(xs)  # the right-most label goes left of its point so it stays inside the axes
        ax.annotate(
            short_name(name) + (" (claim refuted)" if refuted else ""),
            (x, acc),
            xytext=(-7 if right else 7, 0),
            textcoords="offset points",
            fontsize=7,
            ha="right" if right else "left",
            va="center",
            color=VERDICT_COLORS["violation"] if refuted else "black",
        )
    ax.set_xscale("log")
    ax.set_xlim(lo / 2.5, x_inf * 2)
    ticks = [t for t in ax.get_xticks() if lo / 2.5 <= t <= hi * 1.5]
    ax.set_xticks([*ticks, x_inf], [f"{t:g}" for t in ticks] + ["∞\n(non-private)"])
    ax.minorticks_off()
    ax.margins(y=0.1)
    ax.set(xlabel="claimed ε (δ as claimed)", ylabel="accuracy", title="Privacy–utility (one point per model)")
    entries = {
        "test": Line2D([], [], marker="o", color="#555555", ls="none", label="test accuracy (colour: verdict)"),
        "refuted": Line2D(
            [], [], marker="X", ms=9, color=VERDICT_COLORS["violation"], ls="none", label="test accuracy, claim refuted"
        ),
        "train": Line2D([], [], marker="o", mfc="white", mec="#555555", ls="none", label="train accuracy"),
    }
    handles = [h for key, h in entries.items() if key in drawn]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    return fig


def inversion_figure(result: Mapping[str, Any]) -> Figure | None:
    """MI-FACE inversions (one per attacked class) as a row of images, each titled with its class and
    what the independent evaluation classifier read; None unless the features are image-shaped."""
    shape = result.get("feature_shape") or []
    images = result.get("inversions")
    if not images or len(shape) not in (2, 3) or (len(shape) == 3 and shape[0] != 1):
        return None
    h, w = shape[-2], shape[-1]
    per_class = result.get("per_class") or []
    labels = result.get("labels")  # the data's label of each class index (None: the indices are the labels)

    def label(k: Any) -> Any:
        return labels[k] if labels is not None and isinstance(k, int) and 0 <= k < len(labels) else k

    n = len(images)
    fig = Figure(figsize=(1.1 * n + 0.4, 1.6), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    for i, (ax, img) in enumerate(zip(axes, images, strict=True)):
        ax.imshow(np.asarray(img, dtype=float).reshape(h, w), cmap="gray_r", interpolation="nearest")
        c = per_class[i] if i < len(per_class) else {}
        ax.set_title(drawable(f"{label(c.get('class', i))} → {label(c.get('identified_as', '?'))}"), fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
    fig.suptitle("MI-FACE inversions (class → evaluation classifier's label)", fontsize=9)
    return fig


def extraction_figure(result: Mapping[str, Any]) -> Figure | None:
    """Fidelity of the extracted model against the number of queries (test inputs and uniform inputs in
    the feature box), from the extraction's ``curve``; None without at least two points."""
    curve = result.get("curve") or []
    if len(curve) < 2:
        return None
    q = [c["queries"] for c in curve]
    fig = Figure(figsize=(4.6, 2.8), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(q, [c["fidelity"] for c in curve], marker="o", label="test inputs")
    if all(c.get("fidelity_uniform") is not None for c in curve):
        ax.plot(q, [c["fidelity_uniform"] for c in curve], marker="s", ls="--", label="uniform in the feature box")
    ax.set(
        xscale="log", ylim=(0, 1.02), xlabel="queries", ylabel="fidelity (agreement with the target)",
        title=drawable(f"Extraction ({result.get('method', '?')}, api {result.get('api', '?')})"),
    )  # fmt: skip
    ax.set_xticks(q, [f"{x:g}" for x in q])  # the budgets measured, not powers of ten
    ax.xaxis.set_minor_locator(FixedLocator([]))
    ax.legend(loc="lower right")
    return fig


def cloak_figure(result: Mapping[str, Any]) -> Figure | None:
    """A cloak's sigma / feature range per input feature (seed "Cloak: Noisy Representation": a larger
    sigma means a less important feature): a heatmap for image-shaped features, bars otherwise."""
    sigma = result.get("sigma_map")
    if not sigma:
        return None
    shape = result.get("feature_shape") or [len(sigma)]
    rel = np.asarray(sigma, dtype=float)
    lam, supp = result.get("lambda", float("nan")), result.get("suppression_ratio", 0.0)
    title = f"Cloak σ / range (λ = {lam:g}, suppressed {supp:.0%})"
    if len(shape) in (2, 3) and (len(shape) == 2 or shape[0] == 1):
        fig = Figure(figsize=(3.6, 3.0), layout="constrained")
        ax = fig.add_subplot()
        im = ax.imshow(rel.reshape(shape[-2], shape[-1]), cmap="viridis", vmin=0, interpolation="nearest")
        fig.colorbar(im, ax=ax, label="σ / feature range")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
    else:
        fig = Figure(figsize=(4.6, 2.6), layout="constrained")
        ax = fig.add_subplot()
        ax.bar(np.arange(len(rel)), rel)
        ax.set(xlabel="feature", ylabel="σ / feature range")
    ax.set_title(title, fontsize=9)
    return fig


def icl_figure(result: Mapping[str, Any]) -> Figure | None:
    """The ICL membership attack's AUC and the canary one-run ε lower bound per setting (one noise-free
    prompt, DP-ICL at the run's ε), from ``dpaudit.workflows.icl.run_icl``; None without settings."""
    rows = result.get("settings") or []
    if not rows or any(r.get(k) is None for r in rows for k in ("auc", "canary_epsilon_lower_bound")):
        return None  # nothing, or a partial result: its numbers are in the result's JSON below the figure
    eps = [float(r["epsilon"]) for r in rows]  # the report spells infinity "inf"
    labels = [f"ε = {numfmt.upper(e)}" for e in eps]  # each setting's claimed ε, rounded up
    fig = Figure(figsize=(4.6, 2.8), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    x = np.arange(len(rows))
    ax.bar(x, [float(r["auc"]) for r in rows])
    ax.axhline(0.5, color="grey", ls="--", lw=1)
    ax.set(xticks=x, ylim=(0, 1.02), ylabel="attack AUC (estimate)")
    ax.set_xticklabels(labels)
    ax2.bar(x, [float(r["canary_epsilon_lower_bound"]) for r in rows], color="tab:orange")
    # the claim each bound is compared with (a bound above it would be a violation): the one its canary audit
    # tested, which is a user's --claimed-epsilon rather than the run's ε when one was given
    tested = [(r.get("canary_audit") or {}).get("claimed_epsilon", e) for r, e in zip(rows, eps, strict=True)]
    finite = [(i, float(c)) for i, c in enumerate(tested) if c is not None and np.isfinite(float(c))]
    if finite:
        ax2.scatter(*zip(*finite, strict=True), marker="_", s=400, color="black")
        for i, e in finite:
            ax2.annotate("claimed ε", (i, e), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7)
    ax2.set(xticks=x, ylabel="canary ε lower bound (formal)")
    ax2.set_xticklabels(labels)
    fig.suptitle(drawable(f"ICL membership ({result.get('shots', '?')} shots)"), fontsize=9)
    return fig
