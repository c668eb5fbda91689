"""``dpaudit attack inversion`` (MI-FACE model inversion) and ``dpaudit attack attribute`` (attribute inference).

The command functions live here; :mod:`dpaudit.cli.attack` attaches them to the ``attack`` group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dpaudit.cli._common import (
    CheckpointAlias,
    ForceFlag,
    JsonFlag,
    RunArgument,
    aliased,
    emit,
    info,
    progress,
    target_run,
)
from dpaudit.fileio import check_output_file

GRID_FILE = "inversions.png"


def _num(x: Any, fmt: str = ".3f") -> str:
    return "—" if x is None else format(x, fmt)


def inversion_table(result: Any) -> str:
    """class | f_label | MSE members | MSE non-members | MSE other | SSIM members | nearest | identified | stop."""
    from dpaudit.report._format import rate

    d = result.to_dict(include_inversions=False)
    labels = d["labels"]  # classes by the data's labels (the JSON keeps the indices beside them)

    def label(k: int) -> str:
        return str(k if labels is None else labels[k])

    header = ("class", "confidence", "MSE", "MSE non-mem", "MSE other", "SSIM", "SSIM non-mem", "nearest", "identified",
              "iters", "stop", "queries")  # fmt: skip
    rows = [header]
    for c in d["per_class"]:
        rows.append(
            (
                label(c["class"]),
                _num(c["confidence"]),
                _num(c["mse"], ".4f"),
                _num(c["mse_nonmembers"], ".4f"),
                _num(c["mse_other"], ".4f"),
                _num(c["ssim"]),
                _num(c["ssim_nonmembers"]),
                label(c["nearest_class"]),
                label(c["identified_as"]),
                str(c["iterations"]),
                c["stop_reason"],
                str(c["queries"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    p = d["params"]
    lines.insert(0, f"MI-FACE variant {p['variant']} ({p['restarts']} start(s) per class); cost c = 1 - f_y + AUXTERM")
    lines.append(
        f"identification accuracy {rate(d['identification_accuracy'])} (evaluation classifier trained on aux; "
        f"its test accuracy {rate(d['eval_classifier_accuracy'])}); nearest own class mean "
        f"{rate(d['nearest_mean_accuracy'])}. MSE/SSIM in box units, against the class mean of the target's members."
    )
    return "\n".join(lines)


GridFolder = Annotated[
    Path | None, typer.Option("--out", "-o", help=f"Folder to write the inversions to, as a PNG grid ({GRID_FILE}).")
]
GridFolderAlias = Annotated[Path | None, typer.Option("--out-dir", hidden=True, help="Deprecated spelling of --out.")]


def inversion(
    run: RunArgument = None,
    classes: Annotated[
        str | None,
        typer.Option(
            "--classes",
            help="Labels to invert, comma-separated, as your data holds them (1,2 or cat,dog; default: all).",
        ),
    ] = None,
    black_box: Annotated[
        bool,
        typer.Option("--black-box", help="Estimate gradients from probability queries instead of autograd."),
    ] = False,
    budget: Annotated[
        int | None, typer.Option("--budget", help="Black-box: queries allowed per inverted class (default: no limit).")
    ] = None,
    iterations: Annotated[int, typer.Option("--iterations", help="alpha: maximum gradient steps.")] = 500,
    window: Annotated[
        int, typer.Option("--window", help="beta: stop when the cost has not improved over beta steps.")
    ] = 50,
    threshold: Annotated[float, typer.Option("--threshold", help="gamma: stop once the cost is at most gamma.")] = 0.01,
    step: Annotated[float, typer.Option("--step", help="lambda: gradient step size (raw feature units).")] = 0.1,
    prior: Annotated[str, typer.Option("--prior", help="AUXTERM: none | tv (images) | mean (aux mean).")] = "none",
    prior_weight: Annotated[float, typer.Option("--prior-weight", help="Weight of the AUXTERM prior.")] = 0.0,
    directions: Annotated[
        int, typer.Option("--directions", help="Black-box: random directions per gradient estimate.")
    ] = 20,
    variant: Annotated[
        str,
        typer.Option(
            "--variant",
            help="What is descended: log-softmax (-log f_y; works on confident models) | margin (logit margin) "
            "| mi-face (1 - f_y, the published Algorithm 1). Stopping rule and reported cost: MI-FACE's.",
        ),
    ] = "log-softmax",
    restarts: Annotated[
        int, typer.Option("--restarts", help="Starts per class: x0 = PROCESS(0), then uniform in the aux box.")
    ] = 4,
    out: GridFolder = None,
    out_dir: GridFolderAlias = None,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of the black-box directions and the evaluation classifier.")
    ] = 0,
    force: ForceFlag = False,
    json_output: JsonFlag = False,
    checkpoint: CheckpointAlias = None,
) -> None:
    """Model inversion (MI-FACE, Fredrikson et al. 2015): reconstruct a representative input per class.

    The default descends on -log f_y from several starts (the published cost 1 - f_y has no gradient once a
    confident model's softmax saturates); --variant mi-face runs Algorithm 1 as published.

    JSON: checkpoint, png (or null), attack, params, classes, identification_accuracy, nearest_mean_accuracy,
    eval_classifier_accuracy, mean_mse, mean_ssim, mean_mse_nonmembers, mean_ssim_nonmembers, per_class (a list of
    {class, mse, ssim, mse_nonmembers, ssim_nonmembers, mse_other, nearest_class, identified_as, cost, confidence,
    iterations, best_iteration, stop_reason, queries}), feature_shape, inversions (raw features, flattened).
    """
    from attacks.inversion import MIFace, member_class_means, run_inversion, save_grid
    from dpaudit.checkpoint import load_run

    attack = MIFace(
        iterations=iterations, window=window, threshold=threshold, step=step, prior=prior, prior_weight=prior_weight,
        black_box=black_box, budget=budget, directions=directions, variant=variant, restarts=restarts, seed=seed,
    )  # fmt: skip
    attack.check()  # bad settings fail before the checkpoint is loaded
    out = aliased(out, out_dir, "--out", "--out-dir", "folder")  # every other command writes to --out/-o
    path = target_run(run, checkpoint)
    png = out / GRID_FILE if out is not None else None
    if png is not None:
        check_output_file(png, force=force)
    target = load_run(path)
    which = "every class" if classes is None else f"labels {classes}"
    info(f"inverting {which} of {path} ({'black' if black_box else 'white'}-box) …")
    with target.dataset_held():  # one load and hash of the data for the attack and the grid's class means
        result = run_inversion(target, classes, attack=attack, seed=seed, progress=progress(json_output))
        if png is not None:
            save_grid(result, png, member_means=member_class_means(target), force=force)
            info(f"inversions written to {png} (top: inversions; bottom: members' class means)")
    data = {"checkpoint": str(path), "png": None if png is None else str(png), **result.to_dict()}
    emit(data, inversion_table(result), json_flag=json_output)


def attribute(
    feature: Annotated[
        str,
        typer.Option(
            "--feature",
            "-f",
            help="The hidden feature: name (a CSV header's, or an embedded dataset's) or index (flattened); "
            "a one-hot group by its prefix (color for color_red, color_blue, ...).",
        ),
    ],
    run: RunArgument = None,
    black_box: Annotated[
        bool,
        typer.Option(
            "--black-box",
            help="Attack model on the model's outputs (trained on aux) instead of likelihood over candidate values.",
        ),
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the attack model.")] = 0,
    json_output: JsonFlag = False,
    checkpoint: CheckpointAlias = None,
) -> None:
    """Attribute inference (Fredrikson et al. 2014; Yeom et al. 2018): infer a hidden feature of members and
    non-members and estimate the leakage (not a DP bound).

    The leakage is the member - non-member accuracy gap within (hidden value, label) cells, weighted by the cells'
    pooled frequency, with a one-sided permutation p-value.

    A column of a one-hot group (color_red beside color_blue, ...) or the group's prefix (color) hides the whole
    group: the other columns would give the hidden one away.

    JSON: checkpoint, attack, method, feature, feature_name, columns, binarised, threshold, candidates, members and
    nonmembers ({n, accuracy, baseline_accuracy, advantage}), strata (per value and label: members,
    members_right, nonmembers, nonmembers_right), leakage, leakage_test ({p_value, mc_se, permutations, seed}),
    left_out (the records in cells held by one group only, which the leakage leaves out: {records, members,
    nonmembers, cells, fraction}), note (the leakage in words), params.
    """
    from attacks.attribute import run_attribute
    from dpaudit.checkpoint import load_run
    from dpaudit.report._format import num, rate

    path = target_run(run, checkpoint)
    result = run_attribute(load_run(path), feature, black_box=black_box, seed=seed)
    d = result.to_dict()
    name = f" ({d['feature_name']})" if d["feature_name"] else ""
    hidden = f"binarised at {d['threshold']:.4g}" if d["binarised"] else f"{len(d['candidates'])} values"
    if len(d["columns"]) > 1:  # a one-hot group, hidden as a whole
        hidden = f"one-hot columns {', '.join(map(str, d['columns']))}: {', '.join(map(str, d['candidates']))}"
    lines = [f"attribute inference, {d['method']}: feature {d['feature']}{name}, {hidden}",
             "group        n  accuracy  baseline  advantage"]  # fmt: skip
    for g in ("members", "nonmembers"):
        r = d[g]
        acc, base = rate(r["accuracy"]), rate(r["baseline_accuracy"])
        lines.append(f"{g:<10} {r['n']:>4}  {acc:>8}  {base:>8}  {num(r['advantage']):>9}")  # num: never "-0.000"
    lines.append(d["note"])
    emit({"checkpoint": str(path), **d}, "\n".join(lines), json_flag=json_output)
