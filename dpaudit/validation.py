"""Small keyword validators whose messages write themselves.

check_positive(clip=0.0)  ->  InputError("expected clip > 0, got 0.0")
"""

from __future__ import annotations

import math
from typing import Any

from dpaudit.errors import InputError


def _one(kwargs: dict[str, Any]) -> tuple[str, Any]:
    if len(kwargs) != 1:
        raise TypeError("validators take exactly one keyword argument")
    return next(iter(kwargs.items()))


def _finite(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"expected {name} to be a number, got {value!r}") from None
    if math.isnan(v):
        raise InputError(f"expected {name} to be a number, got NaN")
    return v


def check_positive(**kwargs: Any) -> float:
    name, value = _one(kwargs)
    v = _finite(name, value)
    if not v > 0:
        raise InputError(f"expected {name} > 0, got {value}")
    return v


def check_non_negative(**kwargs: Any) -> float:
    name, value = _one(kwargs)
    v = _finite(name, value)
    if v < 0:
        raise InputError(f"expected {name} >= 0, got {value}")
    return v


def check_positive_int(**kwargs: Any) -> int:
    name, value = _one(kwargs)
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise InputError(f"expected {name} to be an integer, got {value!r}")
    if value < 1:
        raise InputError(f"expected {name} >= 1, got {value}")
    return int(value)


def check_in_interval(lo: float, hi: float, *, lo_open: bool = True, hi_open: bool = True, **kwargs: Any) -> float:
    """Check lo < value < hi (brackets controlled by lo_open/hi_open)."""
    name, value = _one(kwargs)
    v = _finite(name, value)
    ok_lo = v > lo if lo_open else v >= lo
    ok_hi = v < hi if hi_open else v <= hi
    if not (ok_lo and ok_hi):
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise InputError(f"expected {name} in {lb}{lo:g}, {hi:g}{rb}, got {value}")
    return v


def check_choice(choices: list[str] | tuple[str, ...], **kwargs: Any) -> str:
    name, value = _one(kwargs)
    if value not in choices:
        raise InputError(f"unknown {name} {value!r}; valid: {', '.join(choices)}")
    return value
