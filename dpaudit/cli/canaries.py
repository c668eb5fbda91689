"""``dpaudit audit canaries DIR``: the one-run audits and the noise check of a user's own training loop."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpaudit.cli._common import DELTA_HELP, App, ForceFlag, JsonFlag, deprecated_alias, emit, given_options
from dpaudit.cli.audit import ConfidenceOpt, FailOnViolationOpt, SeedOpt, _exit_code, audit_app
from dpaudit.data import DATA_HELP
from dpaudit.errors import InputError


def register(app: App) -> None:
    app.add_typer(canaries_app, name="canaries", help="Canaries for models you train yourself.")

    @audit_app.command("canaries")
    def canaries_cmd(
        directory: Annotated[
            Path, typer.Argument(help="Directory written by dpaudit.hooks.GradientCanaries.save() after training.")
        ],
        claimed_epsilon: Annotated[
            float | None,
            typer.Option("--claimed-epsilon", help="Claimed epsilon at --delta (required; with --run: the run's)."),
        ] = None,
        delta: Annotated[
            float | None, typer.Option("--delta", help=f"{DELTA_HELP} being tested (required; with --run: the run's).")
        ] = None,
        noise_multiplier: Annotated[
            float | None,
            typer.Option(
                "--noise-multiplier",
                help="The claim's sigma: adds the f-DP audit and the noise check (with --run: the run's, if any).",
            ),
        ] = None,
        sample_rate: Annotated[
            float | None,
            typer.Option("--sample-rate", help="The claim's Poisson rate q (checked against the canaries')."),
        ] = None,
        steps: Annotated[
            int | None, typer.Option("--steps", help="The claim's number of steps T (checked against those observed).")
        ] = None,
        confidence: ConfidenceOpt = 0.95,
        seed: SeedOpt = 0,
        fail_on_violation: FailOnViolationOpt = False,
        out: Annotated[
            Path | None,
            typer.Option("--out", "-o", help="Also save the result as JSON, for `dpaudit report FILE.json`."),
        ] = None,
        run: Annotated[
            Path | None,
            typer.Option(
                "--run",
                help="The run (`dpaudit import` of the weights these canaries saw trained, with the same claim): "
                "`dpaudit report RUN FILE.json` then shows the run's attacks and this audit as one model.",
            ),
        ] = None,
        force: ForceFlag = False,
        json_output: JsonFlag = False,
    ) -> None:
        """Formal one-run audits of gradient canaries from your own training loop (Opacus, JAX, NumPy), and a
        formal check of the noise that was actually added. See docs/own-training-loop.md."""
        from dpaudit.workflows.hooks_audit import audit_canaries

        if out is not None:
            from dpaudit.fileio import check_output_file

            check_output_file(out, force=force)  # before the audit, not after
        result = audit_canaries(
            directory, claimed_epsilon=claimed_epsilon, delta=delta, noise_multiplier=noise_multiplier,
            sample_rate=sample_rate, steps=steps, confidence=confidence, seed=seed, run=run,
        )  # fmt: skip
        if out is not None:
            from dpaudit.reporting import save_canary_audit

            save_canary_audit(result, out, force=force)
        from dpaudit.audit.result import CANNOT_REFUTE, tests_formally

        emit(result.to_dict(), result.summary(), json_flag=json_output)
        _exit_code(
            [result.verdict],
            fail_on_violation=fail_on_violation,
            fail_on_estimate=False,
            cannot_refute=result.verdict in CANNOT_REFUTE,
            # the noise check, when it runs, is a formal test; else the one-run records must be
            formal=result.noise is not None or any(tests_formally(a.result) for a in result.audits),
            has_fail_on_estimate=False,
        )


canaries_app = App(help="Canaries for models you train yourself (then `dpaudit import --canaries`).")


@canaries_app.command("make")
def make_cmd(
    ctx: typer.Context,
    data: Annotated[str, typer.Option("--data", help="The records you will train on: " + DATA_HELP)],
    count: Annotated[int, typer.Option("--count", help="Number of canaries M (each included w.p. 1/2).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write (keep canaries.safetensors secret).")],
    kind: Annotated[
        str, typer.Option("--canary-kind", help="mislabeled | outlier | clipbkd | crafted.")
    ] = "mislabeled",
    old_kind: Annotated[
        str | None, typer.Option("--kind", hidden=True, help="Deprecated spelling of --canary-kind.")
    ] = None,
    members: Annotated[
        Path | None, typer.Option("--members", help="Indices into --data of the records you will train on.")
    ] = None,
    label_column: Annotated[str | None, typer.Option("--label-column", help="Label column of a CSV file.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the canaries and of which are included.")] = 0,
    force: ForceFlag = False,
    json_output: JsonFlag = False,
) -> None:
    """Make canaries for your own training: add the records in OUT/insert.npz to your training set, train,
    then `dpaudit import ... --canaries OUT` and `dpaudit audit checkpoint` for the formal one-run audit."""
    from dpaudit.canaries import make_canary_dir

    if old_kind is not None:  # the name `train` and `audit train` use for the same thing is --canary-kind
        deprecated_alias("--kind", "--canary-kind")
        if "kind" in given_options(ctx) and kind != old_kind:
            raise InputError("--kind and --canary-kind differ: give --canary-kind only")
        kind = old_kind
    d = make_canary_dir(
        data, count=count, kind=kind, out=out, seed=seed, members=members, label_column=label_column, force=force
    )
    emit(d, f"{d['m']} {d['kind']} canaries, {d['n_included']} to insert: {d['insert']}", json_flag=json_output)
