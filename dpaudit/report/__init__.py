"""Leakage reports: a versioned JSON document (``schema.json``) and its Markdown / HTML renderings.

Computing and rendering are separate: :func:`evaluate_run` and :func:`build_report` produce the
report dict; :func:`render_markdown` and :func:`render_html` read only that dict.
"""

from __future__ import annotations

from typing import Any

from dpaudit.report.build import (
    ATTACK_FAMILIES,
    SCHEMA_VERSION,
    build_report,
    load_report,
    merge_reports,
    validate_report,
    write_report,
)

__all__ = [
    "ATTACK_FAMILIES",
    "SCHEMA_VERSION",
    "build_report",
    "evaluate_run",
    "load_report",
    "merge_reports",
    "render_html",
    "render_markdown",
    "validate_report",
    "write_report",
]

_LAZY = {
    "render_markdown": "dpaudit.report.markdown",
    "render_html": "dpaudit.report.html",  # imports matplotlib
    "evaluate_run": "dpaudit.report.evaluate",  # imports torch and the attacks
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
