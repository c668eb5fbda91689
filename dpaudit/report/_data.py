"""The report's data conventions, shared by the builder and the renderers: JSON spelling of numbers,
canonical text, the low-FPR convention and the (ε, δ) trade-off curve the plots draw.

The bottom of the report room: the builder (:mod:`dpaudit.report.build`) and the renderers
(:mod:`~dpaudit.report.markdown`, :mod:`~dpaudit.report.html`, :mod:`~dpaudit.report.plots`) import
it, it imports none of them, so the room has no import circle (issue 23).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

LOW_FPR = 0.001  # the summary's TPR is read at FPR = 0.1 % (Carlini et al. 2022, "MIA from first principles")


# --------------------------------------------------------------------------- JSON helpers


def as_float(x: Any) -> float | None:
    """A report number as a float: ``"inf"``/``"-inf"``/``"nan"`` map back to non-finite floats."""
    if x is None:
        return None
    return float(x)


def jsonable(obj: Any) -> Any:
    """A JSON-ready copy: numpy scalars/arrays to Python, non-finite floats to strings, keys to str."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def dumps(report: Mapping[str, Any]) -> str:
    """The canonical text of a report (deterministic: the same report gives the same bytes)."""
    return json.dumps(jsonable(report), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def sha256_json(obj: Any) -> str:
    """SHA-256 of canonical JSON (sorted keys, no whitespace), so equal configs hash equally."""
    text = json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------- statistics


def tradeoff_curve(alpha: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The (ε, δ)-DP trade-off function: the least type-II error (FNR) at type-I error (FPR) α.

    Dong, Roth & Su 2022, "Gaussian Differential Privacy", JRSS-B (arXiv:1905.02383), Prop. 2.5:
        f_{ε,δ}(α) = max{0, 1 − δ − e^ε α, e^{−ε} (1 − δ − α)}.
    A test (FPR, FNR) strictly below this curve contradicts the (ε, δ) claim.
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    if epsilon > 700.0:  # e^ε overflows a float (JL claims reach 1e9): at that ε the curve is 0 for α > 0
        return np.where(alpha > 0, np.maximum(0.0, 1.0 - delta - np.exp(min(epsilon, 700.0)) * alpha), 1.0 - delta)
    return np.maximum.reduce(
        [np.zeros_like(alpha), 1.0 - delta - math.exp(epsilon) * alpha, math.exp(-epsilon) * (1.0 - delta - alpha)]
    )
