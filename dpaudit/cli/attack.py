"""``dpaudit attack mia``: membership inference attacks against a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dpaudit.cli._common import (
    CACHE_DIR,
    OUTPUT,
    TARGET,
    App,
    deprecated_alias,
    emit,
    given_options,
    info,
    opt,
    options,
    progress,
    target_run,
    warn,
)
from dpaudit.defaults import DEFAULTS

attack_app = App()


def human_table(results: list[Any]) -> str:
    """attack | AUC | balanced acc | advantage | TPR@0.1% | TPR@1% | TPR@10% | #ref models.

    Rates (balanced accuracy, TPR) as percentages, formatted as in the reports (a TPR at an FPR below
    1 / non-members reads "n/a": it would be the TPR at zero false positives); AUC and advantage
    (TPR - FPR) as plain numbers. The JSON output keeps every value a fraction.
    """
    from dpaudit.report._format import interval, num, rate, tpr_cell

    header = ("attack", "AUC", "balanced acc", "advantage", "TPR@0.1%", "TPR@1%", "TPR@10%", "#ref models")
    rows = [header]
    for r in results:
        d = r.to_dict(include_roc=False)
        rows.append(
            (
                d["attack"],
                f"{d['auc']:.3f} {interval(d['ci']['auc'])}" if d["ci"].get("auc") else f"{d['auc']:.3f}",
                rate(d["balanced_accuracy"]),
                num(d["advantage"]),  # as the report's table prints it: never "-0.000"
                *(tpr_cell(d, key) for key in ("0.001", "0.01", "0.1")),  # n/a where the non-members cannot resolve it
                str(d["n_reference_models"] or d["n_shadow_models"] or "-"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


MIA = (
    *TARGET,
    opt(
        "attacks",
        str,
        ",".join(DEFAULTS.attacks),
        help="loss | confidence | entropy | modified-entropy | shadow | lira | rmia | all "
        "(comma-separated for several; the same default as `audit checkpoint` and `report`).",
    ),
    opt("method", str | None, None, "--method", "-m", hidden=True, help="Deprecated spelling of --attacks."),
    opt(
        "shadow_models",
        int | None,
        None,
        help="K shadow models (Shokri et al.) on disjoint parts of aux (default: as many as fit, up to 4).",
    ),
    opt("reference_models", int, DEFAULTS.reference_models, help="M reference models (LiRA/RMIA)."),
    opt("online", bool, True, "--online/--offline", help="LiRA/RMIA with IN and OUT models, or OUT only."),
    opt("min_models", int, 2, help="LiRA: refuse records with fewer IN/OUT reference models."),
    opt("workers", int, 1, help="Local processes training reference models."),
    opt("scheduler", str | None, None, help="Dask scheduler address tcp://host:port (cluster)."),
    *CACHE_DIR,
    opt(
        "scores_out",
        Path | None,
        None,
        help="Per-record scores (columns attack, record_id, member, score) to FILE.csv or FILE.npz; "
        "with several attacks, one file each: FILE.ATTACK.csv.",
    ),
    opt("bootstrap", int, 200, help="Bootstrap replicates for CIs (0: none)."),
    opt("seed", int, 0, help="Seed of partitions, model seeds and bootstrap."),
    opt("roc", bool, False, help="Include ROC curves in the JSON output."),
)


@options(MIA, OUTPUT)
def mia(ctx: typer.Context, **o) -> None:
    """Membership inference: score every member and holdout record of the target run, evaluate.

    JSON: {"checkpoint", "attacks": [{attack, params, n_members, n_nonmembers, auc, balanced_accuracy,
    advantage, tpr_at_fpr, tpr_at_fpr_resolved (False: fewer than 1/FPR non-members, shown n/a), ci,
    n_reference_models, n_shadow_models} ...]} (plus "roc" with --roc).
    """
    from attacks.mia import attack_checkpoint

    json_output, roc = o.pop("json_output"), o.pop("roc")
    run = target_run(o.pop("run"), o.pop("checkpoint"))
    if (method := o.pop("method")) is not None:
        deprecated_alias("--method/-m", "--attacks")
        o["attacks"] = method
    given = given_options(ctx)  # an option no chosen attack reads is refused (attacks.mia.check_options_read)
    results = attack_checkpoint(run, **o, progress=progress(json_output), notify=info, warn=warn, given=given)
    data = {"checkpoint": str(run), "attacks": [r.to_dict(include_roc=roc) for r in results]}
    emit(data, human_table(results), json_flag=json_output)


def register(app: App) -> None:
    app.add_typer(
        attack_app,
        name="attack",
        help="Privacy attacks against a checkpoint: membership inference, extraction, inversion, attribute inference.",
    )
    attack_app.command("mia")(mia)


# ``dpaudit attack extract`` (model extraction): the command's options and body live in dpaudit.cli.extract.
from dpaudit.cli.extract import extract  # noqa: E402

attack_app.command("extract")(extract)

from dpaudit.cli.inversion import attribute, inversion  # noqa: E402

attack_app.command("inversion")(inversion)
attack_app.command("attribute")(attribute)
