"""``dpaudit attack mia``: membership inference attacks against a checkpoint."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from dpaudit.cli._common import App, ForceFlag, JsonFlag, emit, info, progress
from dpaudit.fileio import check_output_file

attack_app = App()


def human_table(results: list[Any]) -> str:
    """attack | AUC | balanced acc | advantage | TPR@0.1% | TPR@1% | TPR@10% | #ref models.

    Rates (balanced accuracy, TPR) as percentages, formatted as in the reports; AUC and advantage
    (TPR - FPR) as plain numbers. The JSON output keeps every value a fraction.
    """
    from dpaudit.report._format import rate

    header = ("attack", "AUC", "balanced acc", "advantage", "TPR@0.1%", "TPR@1%", "TPR@10%", "#ref models")
    rows = [header]
    for r in results:
        d = r.to_dict(include_roc=False)
        lo, hi = d["ci"].get("auc", [float("nan")] * 2)
        t = d["tpr_at_fpr"]
        rows.append(
            (
                d["attack"],
                f"{d['auc']:.3f} [{lo:.3f}, {hi:.3f}]" if d["ci"] else f"{d['auc']:.3f}",
                rate(d["balanced_accuracy"]),
                f"{d['advantage']:.3f}",
                rate(t["0.001"]),
                rate(t["0.01"]),
                rate(t["0.1"]),
                str(d["n_reference_models"] or d["n_shadow_models"] or "-"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def scores_paths(path: Path, methods: tuple[str, ...]) -> dict[str, Path]:
    """Where each attack's scores go: ``path`` itself for one attack; ``NAME.ATTACK.csv`` for several,
    so that every file holds one attack's scores (what ``dpaudit audit scores`` reads)."""
    if len(methods) == 1:
        return {methods[0]: path}
    return {m: path.with_name(f"{path.stem}.{m}{path.suffix}") for m in methods}


def register(app: App) -> None:
    app.add_typer(
        attack_app,
        name="attack",
        help="Privacy attacks against a checkpoint: membership inference, extraction, inversion, attribute inference.",
    )

    @attack_app.command("mia")
    def mia(
        checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help="Run directory of the target model.")],
        method: Annotated[
            str,
            typer.Option(
                "--method",
                "-m",
                help="loss | confidence | entropy | modified-entropy | shadow | lira | rmia | all "
                "(comma-separated for several).",
            ),
        ] = "loss,shadow,lira",
        shadow_models: Annotated[
            int | None,
            typer.Option(
                "--shadow-models",
                help="K shadow models (Shokri et al.) on disjoint parts of aux (default: as many as fit, up to 4).",
            ),
        ] = None,
        reference_models: Annotated[
            int, typer.Option("--reference-models", help="M reference models (LiRA/RMIA).")
        ] = 16,
        online: Annotated[
            bool, typer.Option("--online/--offline", help="LiRA/RMIA with IN and OUT models, or OUT only.")
        ] = True,
        min_models: Annotated[
            int, typer.Option("--min-models", help="LiRA: refuse records with fewer IN/OUT reference models.")
        ] = 2,
        workers: Annotated[int, typer.Option("--workers", help="Local processes training reference models.")] = 1,
        scheduler: Annotated[
            str | None,
            typer.Option(
                "--scheduler",
                help="Dask scheduler address tcp://host:port (cluster). Dask exchanges pickles: "
                "connect only to your own.",
            ),
        ] = None,
        cache_dir: Annotated[
            Path | None,
            typer.Option(
                "--cache-dir",
                help="Cache of trained shadow/reference models (default: $DPAUDIT_CACHE_DIR, else "
                "$XDG_CACHE_HOME/dpaudit, else ~/.cache/dpaudit).",
            ),
        ] = None,
        no_cache: Annotated[
            bool,
            typer.Option(
                "--no-cache", help="Train shadow/reference models in a temporary directory, deleted afterwards."
            ),
        ] = False,
        scores_out: Annotated[
            Path | None,
            typer.Option(
                "--scores-out",
                help="Per-record scores (columns attack, record_id, member, score) to FILE.csv or FILE.npz; "
                "with several attacks, one file each: FILE.ATTACK.csv.",
            ),
        ] = None,
        bootstrap: Annotated[int, typer.Option("--bootstrap", help="Bootstrap replicates for CIs (0: none).")] = 200,
        seed: Annotated[int, typer.Option("--seed", help="Seed of partitions, model seeds and bootstrap.")] = 0,
        roc: Annotated[bool, typer.Option("--roc", help="Include ROC curves in the JSON output.")] = False,
        force: ForceFlag = False,
        json_output: JsonFlag = False,
    ) -> None:
        """Membership inference: score every member and holdout record of the target, evaluate.

        JSON: {"checkpoint", "attacks": [{attack, params, n_members, n_nonmembers, auc, balanced_accuracy,
        advantage, tpr_at_fpr, ci, n_reference_models, n_shadow_models} ...]} (plus "roc" with --roc).
        """
        from attacks.mia import parse_methods, run_mia
        from attacks.reference import check_workers
        from dpaudit.checkpoint import load_run
        from dpaudit.errors import InputError

        methods = parse_methods(method)
        check_workers(workers, scheduler=scheduler)
        if no_cache and cache_dir is not None:
            raise InputError("give --cache-dir or --no-cache, not both")
        if no_cache and scheduler is not None:
            raise InputError(
                "--no-cache keeps models in a temporary directory of this machine, which Dask workers "
                "do not share; give --cache-dir on a filesystem they share instead"
            )
        outputs = scores_paths(scores_out, methods) if scores_out is not None else {}
        for path in outputs.values():
            if path.suffix.lower() not in (".csv", ".npz"):
                raise InputError(f"{path}: unsupported scores file type; use .csv or .npz")
            check_output_file(path, force=force)  # before the work
        run = load_run(checkpoint)
        info(f"attacking {checkpoint} with {', '.join(methods)} …")
        with contextlib.ExitStack() as stack:
            if no_cache:
                cache_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dpaudit-cache-")))
            results = run_mia(
                run,
                methods,
                shadow_models=shadow_models,
                reference_models=reference_models,
                online=online,
                workers=workers,
                scheduler=scheduler,
                seed=seed,
                cache_dir=cache_dir,
                min_models=min_models,
                n_bootstrap=bootstrap,
                progress=progress(json_output),
            )
        for r in results:
            if r.name in outputs:
                r.save_scores(outputs[r.name], force=force)
                info(f"{r.name} scores written to {outputs[r.name]}")
        data = {"checkpoint": str(checkpoint), "attacks": [r.to_dict(include_roc=roc) for r in results]}
        emit(data, human_table(results), json_flag=json_output)


# ``dpaudit attack extract`` (model extraction): the command's options and body live in dpaudit.cli.extract.
from dpaudit.cli.extract import extract  # noqa: E402

attack_app.command("extract")(extract)

from dpaudit.cli.inversion import attribute, inversion  # noqa: E402

attack_app.command("inversion")(inversion)
attack_app.command("attribute")(attribute)
