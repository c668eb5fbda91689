"""``dpaudit train --algo cloak``: learn Cloak noise for a frozen target run (thin: parse, call, print)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpaudit.cli._common import emit, info, progress
from dpaudit.errors import InputError


def sigma_png(cloak) -> bytes | None:
    """The cloak's sigma map as PNG bytes (the report's plot), or None when matplotlib has nothing to draw."""
    from dpaudit.report import plots

    d = {
        "sigma_map": [float(v) for v in cloak.relative_sigma().ravel()],
        "feature_shape": list(cloak.mu.shape),
        "lambda": cloak.lam,
        "suppression_ratio": cloak.meta["metrics"]["suppression_ratio"],
    }
    return plots.png(lambda: plots.cloak_figure(d))


def human_curve(rows: list[dict[str, Any]], at: float | None) -> str:
    """The λ sweep as a table; the composed ε is each cloak's formal local-DP bound, rounded up
    (dpaudit.numfmt.upper; ``:.4g`` rounded it to nearest, so 7.999954 printed 8 but 12.34449 printed 12.34)."""
    from dpaudit import numfmt

    lines = ["λ          suppressed  clean acc  cloaked acc  composed ε"]
    lines += [
        f"{r['lambda']:<10g} {r['suppression_ratio']:>10.3f} {r['clean_accuracy']:>10.3f} "
        f"{r['cloaked_accuracy']:>12.3f} {numfmt.upper(r['composed_epsilon'], 4):>11}"
        + ("  <- knee" if r["lambda"] == at else "")
        for r in rows
    ]
    return "\n".join(lines)


def human_cloak(s: dict[str, Any]) -> str:
    from dpaudit import numfmt
    from dpaudit.report._format import rate

    return "\n".join(
        [
            f"cloak      λ = {s['lambda']:g} for {s['target']} ({s['data']})",
            f"suppressed {rate(s['suppression_ratio'])} of the features (σ >= {s['suppression_threshold']:g} × range)",
            f"accuracy   clean {rate(s['clean_accuracy'])}   cloaked {rate(s['cloaked_accuracy'])}   "
            f"loss {rate(s['accuracy_loss'])}",
            f"local DP   ε = {numfmt.upper(s['composed_epsilon'])} at δ = {numfmt.exact(s['delta'])} for one release "
            # the median feature's own ε (of a guarantee per feature): rounded up, as the report prints it
            f"(median feature ε = {numfmt.upper(s['median_feature_epsilon'])})",
        ]
    )


def train_cloak_command(
    algo: str,
    target: Path | None,
    lambdas: list[str],
    out: Path,
    *,
    epochs: int | None,
    batch_size: int | None,
    lr: float | None,
    seed: int,
    force: bool,
    json_output: bool,
) -> None:
    from dpaudit.training.cloak import CloakConfig, cloak_summary, curve_row, knee, parse_lambdas, train_cloak_sweep

    if algo != "cloak":
        raise InputError(f"--target/--lambda need --algo cloak, not {algo!r}")
    if target is None:
        raise InputError("--algo cloak needs --target RUN (the frozen model's run directory)")
    lams = parse_lambdas(lambdas)
    given = {"epochs": epochs, "batch_size": batch_size, "lr": lr}  # None: CloakConfig's default
    base = CloakConfig(lam=lams[0], seed=seed, **{k: v for k, v in given.items() if v is not None})
    cloaks = train_cloak_sweep(
        target, lams, out=out, base=base, force=force, figure=sigma_png, progress=progress(json_output),
        notify=lambda line: info(line, json_flag=json_output),
    )  # fmt: skip
    if len(cloaks) == 1:
        s = cloak_summary(cloaks[0])
        emit({"out": str(out), **s}, human_cloak(s) + f"\nsaved      {out}", json_flag=json_output)
        return
    rows = [curve_row(c) for c in cloaks]
    at = knee(rows)
    lines = [human_curve(rows, at), f"saved      {out} (curve.json, curve.csv, lambda_*/)"]
    emit({"out": str(out), "curve": rows, "knee": at}, "\n".join(lines), json_flag=json_output)
