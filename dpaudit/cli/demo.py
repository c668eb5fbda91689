"""``dpaudit demo``: the README's main job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpaudit.cli._common import App, ForceFlag, JsonFlag, emit, info, progress


def register(app: App) -> None:
    @app.command("demo")
    def demo(
        out: Annotated[Path, typer.Option("--out", "-o", help="Report directory.")] = Path("reports/demo"),
        quick: Annotated[bool, typer.Option("--quick", help="Smaller settings (under 2 minutes).")] = False,
        force: ForceFlag = False,
        json_output: JsonFlag = False,
    ) -> None:
        """Train, attack and audit models on the embedded digits data and write a report.

        Run it again and it replaces its own earlier output (any other existing --out needs --force).
        """
        from dpaudit.demo import check_demo_output, run_demo
        from dpaudit.report._format import console_summary

        if check_demo_output(out, force=force) and not force:
            info(f"replacing the earlier demo output in {out}/", json_flag=json_output)
        report = run_demo(out, quick=quick, force=force, progress=progress(json_output))
        summary = "\n".join(console_summary(report))
        written = f"report written to {out}/ (report.html, report.md, report.json)"
        emit(report, f"{summary}\n\n{written}", json_flag=json_output)
