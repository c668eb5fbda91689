"""Leakage reports: a versioned JSON document (``schema.json``) and its Markdown / HTML renderings.

Computing and rendering are separate: the audit workflows (:mod:`dpaudit.workflows`) attack and
audit runs, :func:`model_entry_from` and :func:`build_report` turn their results into the report
dict, and :func:`render_markdown` and :func:`render_html` read only that dict.
"""

from __future__ import annotations

from typing import Any

from dpaudit.report.build import (
    ATTACK_FAMILIES,
    SCHEMA_VERSION,
    build_report,
    load_report,
    merge_reports,
    model_entry_from,
    validate_report,
    write_report,
)

__all__ = [
    "ATTACK_FAMILIES",
    "SCHEMA_VERSION",
    "build_report",
    "load_report",
    "merge_reports",
    "model_entry_from",
    "render_html",
    "render_markdown",
    "validate_report",
    "write_report",
]

_LAZY = {
    "render_markdown": "dpaudit.report.markdown",
    "render_html": "dpaudit.report.html",  # imports matplotlib
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
