"""Attacks on trained models (membership inference, extraction, ...): arrays in, results out.

Names are exported lazily (PEP 562): ``from attacks import extract`` imports :mod:`attacks.extraction`
on first use, so importing one submodule (say :mod:`attacks.metrics`) never pulls in torch through
another.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # model extraction (issue 14)
    "ApiMode": "attacks.query_api",
    "FeatureBox": "attacks.query_api",
    "PredictionAPI": "attacks.query_api",
    "QueryBudgetExceeded": "attacks.query_api",
    "EquationSolver": "attacks.extraction",
    "Extraction": "attacks.extraction",
    "ExtractionResult": "attacks.extraction",
    "extract": "attacks.extraction",
    "save_surrogate": "attacks.extraction",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attacks' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
