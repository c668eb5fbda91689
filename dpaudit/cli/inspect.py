"""``dpaudit inspect``: print a checkpoint's summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpaudit.cli._common import App, JsonFlag, emit


def register(app: App) -> None:
    @app.command("inspect")
    def inspect(
        run: Annotated[Path, typer.Argument(help="Run directory written by `dpaudit train`.")],
        json_output: JsonFlag = False,
    ) -> None:
        """Summarise a checkpoint. JSON keys (stable): schema_version, model, data, data_sha256, algo, private,
        epsilon, delta, accountant, train_accuracy, test_accuracy, holdout_accuracy, train_loss, test_loss,
        n_members, seed, versions."""
        from dpaudit.checkpoint import load_run
        from dpaudit.cli.train import human_summary
        from dpaudit.training.run import summary

        r = load_run(run)
        r.dataset()  # verifies the data hash
        s = summary(r.meta)
        imported = r.meta.get("import") is not None or r.meta["training"].get("algo") == "imported"
        emit(s, human_summary(s, imported=imported), json_flag=json_output)
