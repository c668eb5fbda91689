"""``dpaudit audit canaries DIR``: the one-run audits and the noise check of a user's own training loop."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpaudit.cli._common import App, JsonFlag, emit
from dpaudit.cli.audit import ClaimedOpt, ConfidenceOpt, FailOnViolationOpt, SeedOpt, _exit_code, audit_app


def register(app: App) -> None:
    @audit_app.command("canaries")
    def canaries_cmd(
        directory: Annotated[
            Path, typer.Argument(help="Directory written by dpaudit.hooks.GradientCanaries.save() after training.")
        ],
        claimed_epsilon: ClaimedOpt = None,
        delta: Annotated[float | None, typer.Option("--delta", help="delta of the claim.")] = None,
        noise_multiplier: Annotated[
            float | None,
            typer.Option("--noise-multiplier", help="The claim's sigma: adds the f-DP audit and the noise check."),
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
        json_output: JsonFlag = False,
    ) -> None:
        """Formal one-run audits of gradient canaries from your own training loop (Opacus, JAX, NumPy), and a
        formal check of the noise that was actually added. See docs/own-training-loop.md."""
        from dpaudit.errors import InputError
        from dpaudit.workflows.hooks_audit import audit_canaries

        if claimed_epsilon is None or delta is None:
            raise InputError("audit canaries needs the claim: --claimed-epsilon E --delta D")
        result = audit_canaries(
            directory, claimed_epsilon=claimed_epsilon, delta=delta, noise_multiplier=noise_multiplier,
            sample_rate=sample_rate, steps=steps, confidence=confidence, seed=seed,
        )  # fmt: skip
        emit(result.to_dict(), result.summary(), json_flag=json_output)
        _exit_code([result.verdict], fail_on_violation=fail_on_violation, fail_on_estimate=False)
