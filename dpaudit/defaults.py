"""The audit defaults every entry point uses (CLI, report, demo, ``dpaudit.workflows``), so one checkpoint
gets one answer wherever it is asked. A module of constants: the CLI reads it to declare its options without
importing the workflows (``dpaudit --help`` imports no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AuditDefaults:
    """The defaults every entry point (CLI, report, demo) uses, so one checkpoint gets one answer."""

    attacks: tuple[str, ...] = ("loss", "lira")
    estimate_method: str = "clopper-pearson"
    reference_models: int = 8
    confidence: float = 0.95
    seed: int = 0


DEFAULTS = AuditDefaults()
