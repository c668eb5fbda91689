"""``dpaudit inspect``: print a checkpoint's summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpaudit.cli._common import App, JsonFlag, emit


def register(app: App) -> None:
    @app.command("inspect")
    def inspect(
        run: Annotated[
            Path, typer.Argument(metavar="RUN", help="Run directory written by `dpaudit train` or `dpaudit import`.")
        ],
        json_output: JsonFlag = False,
    ) -> None:
        """Summarise a run directory (written by `dpaudit train` or `dpaudit import`) or a cloak.

        JSON keys (stable): schema_version, model, data, data_sha256, algo, private,
        epsilon, delta, accountant, train_accuracy, test_accuracy, holdout_accuracy, train_loss, test_loss,
        n_members, seed, versions, epsilon_recomputed (ε re-accounted from the recorded mechanism, or null),
        claim_mismatch (true when the recorded ε differs from it, or privacy.event does not parse). A cloak
        checkpoint (`dpaudit train --algo cloak`): kind, lambda, suppression_ratio, suppression_threshold,
        accuracy_loss, clean_accuracy, cloaked_accuracy, composed_epsilon, median_feature_epsilon, delta, target,
        target_weights_sha256, data, feature_shape."""
        from dpaudit.training.cloak import CLOAK_FILE

        if (run / CLOAK_FILE).is_file():
            from dpaudit.cli.cloak import human_cloak
            from dpaudit.training.cloak import cloak_summary, load_cloak

            s = cloak_summary(load_cloak(run))
            return emit(s, human_cloak(s), json_flag=json_output)
        from dpaudit.checkpoint import load_run
        from dpaudit.cli.train import human_summary
        from dpaudit.training.clipping import clipping_text
        from dpaudit.workflows.runs import inspect_summary

        r = load_run(run)
        s = inspect_summary(r)
        imported = r.meta.get("import") is not None or r.meta["training"].get("algo") == "imported"
        text = human_summary(s, imported=imported)
        jl = (r.meta.get("privacy") or {}).get("jl")
        if jl:  # DP-SGD-JL: which AD path estimated the norms (the claim is the JL event's)
            text += f"\njl         {jl['projections']} projection(s), per-example norms by {jl['ad_path']}"
        if s.get("clipping"):  # which per-example clipping ran, per layer (performance only)
            text += "\n" + clipping_text(r.meta["performance"]["clipping_used"])
        emit(s, text, json_flag=json_output)
