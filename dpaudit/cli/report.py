"""``dpaudit report``: attack and audit runs, merge earlier reports, write report.{json,md,html}."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpaudit.cli._common import App, ForceFlag, JsonFlag, emit, info, progress
from dpaudit.errors import InputError
from dpaudit.fileio import check_output_dir
from dpaudit.workflows.checkpoint import DEFAULTS


def classify_input(path: Path) -> str:
    """'run' for a run directory, 'report' for a report.json (or a directory holding one)."""
    from dpaudit.checkpoint import CHECKPOINT_FILE
    from dpaudit.report.build import REPORT_FILES

    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_dir() and (path / CHECKPOINT_FILE).is_file():
        return "run"
    if (path.is_file() and path.suffix.lower() == ".json") or (
        path.is_dir() and (path / REPORT_FILES["json"]).is_file()
    ):
        return "report"
    raise InputError(f"{path}: neither a run directory (no {CHECKPOINT_FILE}) nor a report.json")


def _parse_list(text: str, name: str) -> tuple[str, ...]:
    items = tuple(p.strip() for p in text.split(",") if p.strip())
    if not items:
        raise InputError(f"expected {name} as a comma-separated list, got {text!r}")
    return items


def register(app: App) -> None:
    @app.command("report")
    def report(
        inputs: Annotated[
            list[Path],
            typer.Argument(help="Run directories (attacked and audited now) and/or report.json files (merged in)."),
        ],
        out: Annotated[Path, typer.Option("--out", "-o", help="Report directory to write (e.g. reports/NAME).")],
        formats: Annotated[str, typer.Option("--format", help="Comma-separated: json, md, html.")] = "json,md,html",
        attacks: Annotated[
            str, typer.Option("--attacks", help="Membership attacks to run on each run (estimates).")
        ] = ",".join(DEFAULTS.attacks),
        reference_models: Annotated[
            int, typer.Option("--reference-models", help="Reference models per run (LiRA).")
        ] = DEFAULTS.reference_models,
        estimate_method: Annotated[
            str,
            typer.Option(
                "--estimate-method", help="clopper-pearson | gdp: bound on the attacks' scores (always an estimate)."
            ),
        ] = DEFAULTS.estimate_method,
        confidence: Annotated[
            float, typer.Option("--confidence", help="Confidence of the lower bounds.")
        ] = DEFAULTS.confidence,
        workers: Annotated[int, typer.Option("--workers", help="Parallel workers for reference models.")] = 1,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the attacks.")] = DEFAULTS.seed,
        cache_dir: Annotated[
            Path | None, typer.Option("--cache-dir", help="Where reference models are cached (default: user cache).")
        ] = None,
        inversion: Annotated[
            bool, typer.Option("--inversion", help="Also run MI-FACE model inversion on every class.")
        ] = False,
        attribute: Annotated[
            str | None,
            typer.Option("--attribute", help="Also run attribute inference of this feature (name or index)."),
        ] = None,
        extraction_budget: Annotated[
            int | None,
            typer.Option(
                "--extraction-budget", help="Also run model extraction with this many queries (full probabilities)."
            ),
        ] = None,
        cloak: Annotated[
            str | None,
            typer.Option(
                "--cloak",
                help="Also measure what a Cloak leaks: a cloak checkpoint trained for the run (`dpaudit train "
                "--algo cloak`), or a λ > 0 to train one per run.",
            ),
        ] = None,
        icl: Annotated[
            bool, typer.Option("--icl", help="Also run the ICL membership attack and canary audit (dp-icl runs).")
        ] = False,
        jl_step: Annotated[
            bool,
            typer.Option(
                "--jl-step",
                help="Also audit one DP-SGD-JL step at the run's σ and r against the plain DP-SGD formula's claim "
                "and the JL accountant's (dpsgd-jl/dpadam-jl runs; the JL claim's PLD takes up to a minute).",
            ),
        ] = False,
        title: Annotated[str | None, typer.Option("--title", help="Report title.")] = None,
        force: ForceFlag = False,
        json_output: JsonFlag = False,
    ) -> None:
        """Attack and audit runs and write a leakage report (report.json, report.md, report.html)."""
        from dpaudit.report import _format as F
        from dpaudit.report.build import (
            REPORT_FILES,
            build_report,
            load_report,
            model_entry_from,
            parse_formats,
            write_report,
        )
        from dpaudit.validation import check_choice, check_in_interval, check_positive_int
        from dpaudit.workflows import audit_checkpoint

        fmts = parse_formats(formats)
        methods = _parse_list(attacks, "--attacks")
        check_positive_int(reference_models=reference_models)
        check_positive_int(workers=workers)
        check_in_interval(0.0, 1.0, confidence=confidence)
        check_choice(("clopper-pearson", "gdp"), estimate_method=estimate_method)
        check_output_dir(out, force=force, inputs=inputs)  # fail before the (slow) attacks
        families: dict[str, dict] = {}
        if inversion:
            families["inversion"] = {}
        if attribute is not None:
            families["attribute"] = {"feature": int(attribute) if attribute.strip().isdigit() else attribute}
        if extraction_budget is not None:
            families["extraction"] = {"budget": check_positive_int(extraction_budget=extraction_budget)}
        if cloak is not None:
            from dpaudit.training.cloak import cloak_option

            families["cloak"] = cloak_option(cloak)
        if icl:
            families["icl"] = {}
        if jl_step:
            families["jl-step"] = {}
        kinds = [(p, classify_input(p)) for p in inputs]
        reports = {p: load_report(p) for p, kind in kinds if kind == "report"}  # validate all before attacking
        config = {
            "attacks": list(methods),
            "reference_models": reference_models,
            "estimate_method": estimate_method,
            "confidence": confidence,
            "seed": seed,
            "inputs": [str(p) for p in inputs],
            "inversion": inversion,
            "attribute": attribute,
            "extraction_budget": extraction_budget,
            "cloak": cloak,
            "icl": icl,
            "jl_step": jl_step,
            "merged": [reports[p]["run"] for p, kind in kinds if kind == "report"],
        }
        models = []
        for p, kind in kinds:
            if kind == "report":
                models += reports[p]["models"]
                continue
            info(f"attacking {p} ({', '.join(methods)}) …")
            audit = audit_checkpoint(
                p,
                attacks=methods,
                reference_models=reference_models,
                estimate_method=estimate_method,
                confidence=confidence,
                workers=workers,
                seed=seed,
                cache_dir=cache_dir,
                families=families,
                progress=progress(json_output),
            )
            models.append(model_entry_from(audit, path=str(p)))
        default_title = reports[kinds[0][0]]["title"] if kinds[0][1] == "report" else "dpaudit leakage report"
        result = build_report(models, title=title or default_title, config=config)
        write_report(result, out, fmts, force=force, inputs=inputs)
        files = [str(out / REPORT_FILES[f]) for f in fmts]
        rows = [{"name": m["name"], **m["summary"]} for m in result["models"]]
        human = "\n".join(
            f"{m['name']} (claimed ε {F.claim_text(m['claim'])}): {m['summary']['headline']}" for m in result["models"]
        )
        emit(
            {"out": str(out), "files": files, "models": rows},
            (human + "\n" if human else "") + f"report written to {out}/ ({', '.join(Path(f).name for f in files)})",
            json_flag=json_output,
        )
