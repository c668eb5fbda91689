"""The typer CLI: one small module per command group, no logic of its own."""
