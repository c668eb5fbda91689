"""Import a script of ``benchmarks/`` (a directory of scripts, not a package) from a test, so that a test
and its benchmark share one implementation (e.g. the live-bytes tracker, the clipping fuzzer)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def import_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (the directory is on ``sys.path`` only while it imports)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
