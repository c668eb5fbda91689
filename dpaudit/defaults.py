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

# The fewest canaries the one-run audit's holdout design takes: half choose the guess counts, half are scored
# (:func:`dpaudit.audit.one_run.draw_design`). Here so that training code can refuse fewer before training.
MIN_HOLDOUT_CANARIES = 4

# Largest design `audit plan` (:func:`dpaudit.audit.power.size_for_power`) simulates by default, in runs per side or
# canaries: beyond it each draw costs too much (`--max-size` lowers it for a faster answer). Here so that the CLI
# declares the option's default without importing scipy.
MAX_SIMULATED_SIZE = 1_000_000
