"""``dpaudit report``: attack and audit runs, merge earlier reports, write report.{json,md,html}."""

from __future__ import annotations

from pathlib import Path

import typer

from dpaudit.cli._common import CACHE_DIR, CHECKPOINT_SEED_HELP, OUTPUT, App, arg, emit, info, opt, options, progress
from dpaudit.defaults import DEFAULTS

REPORT_INPUTS = (
    arg(
        "inputs",
        list[Path],
        help="Run directories (attacked and audited now), report.json files (merged in) and/or saved canary audits "
        "(`dpaudit audit canaries DIR --out FILE.json`, shown as audited).",
    ),
    opt("out", Path, ..., "--out", "-o", help="Report directory to write (e.g. reports/NAME)."),
    opt("formats", str, "json,md,html", "--format", help="Comma-separated: json, md, html."),
)
REPORT_ATTACKS = (
    opt("attacks", str, ",".join(DEFAULTS.attacks), help="Membership attacks to run on each run (estimates)."),
    opt("reference_models", int, DEFAULTS.reference_models, help="Reference models per run (LiRA)."),
    opt(
        "estimate_method",
        str,
        DEFAULTS.estimate_method,
        help="clopper-pearson | gdp: bound on the attacks' scores (always an estimate).",
    ),
    opt("confidence", float, DEFAULTS.confidence, help="Confidence of the lower bounds."),
    opt("workers", int, 1, help="Parallel workers for reference models."),
    opt("seed", int, DEFAULTS.seed, help=CHECKPOINT_SEED_HELP),
    *CACHE_DIR,
)
FAMILIES = (
    opt("inversion", bool, False, help="Also run MI-FACE model inversion on every class."),
    opt("attribute", str | None, None, help="Also run attribute inference of this feature (name or index)."),
    opt(
        "extraction_budget",
        int | None,
        None,
        help="Also run model extraction with this many queries (full probabilities).",
    ),
    opt(
        "cloak",
        str | None,
        None,
        help="Also measure what a Cloak leaks: a cloak checkpoint trained for the run (`dpaudit train "
        "--algo cloak`), or a λ > 0 to train one per run.",
    ),
    opt("icl", bool, False, help="Also run the ICL membership attack and canary audit (dp-icl runs)."),
    opt(
        "jl_step",
        bool,
        False,
        help="Also audit one DP-SGD-JL step at the run's σ and r against the plain DP-SGD formula's claim "
        "and the JL accountant's (dpsgd-jl/dpadam-jl runs; the JL claim's PLD takes up to a minute).",
    ),
    opt("title", str | None, None, help="Report title."),
)


@options(REPORT_INPUTS, REPORT_ATTACKS, FAMILIES, OUTPUT)
def report(ctx: typer.Context, **o) -> None:
    """Attack and audit runs and write a leakage report (report.json, report.md, report.html)."""
    from dpaudit.cli._common import given_options
    from dpaudit.report import _format as F
    from dpaudit.reporting import report_from_options

    out, json_output = o["out"], o.pop("json_output")
    result, files = report_from_options(
        o.pop("inputs"), **o, progress=progress(json_output), notify=info, given=given_options(ctx)
    )
    rows = [{"name": m["name"], **m["summary"]} for m in result["models"]]
    human = "\n".join(F.console_summary(result))
    emit(
        {"out": str(out), "files": [str(f) for f in files], "models": rows},
        (human + "\n" if human else "") + f"report written to {out}/ ({', '.join(f.name for f in files)})",
        json_flag=json_output,
    )


def register(app: App) -> None:
    app.command("report")(report)
