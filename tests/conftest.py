"""Shared fixtures. Tests run on CPU with few threads so timings and results are stable."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from hypothesis import settings

# One torch thread per pytest-xdist worker (``-n 2`` already uses both cores; two threads each would oversubscribe).
_THREADS = "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2"
torch.set_num_threads(int(os.environ.get("DPAUDIT_TEST_THREADS", _THREADS)))

# Hypothesis: CI (which sets CI=true) runs a fixed, derandomized set of examples so a red build is
# always reproducible; locally the default profile keeps drawing fresh random examples to find new bugs.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory, monkeypatch):
    """Reference models cached during tests go to a temporary folder, never the user's cache."""
    monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "dpaudit-cache"))


@pytest.fixture
def cpu_only(monkeypatch):
    """Training with device "auto" runs on the CPU in this process, as on a machine without a GPU.

    For tests of exact same-seed reproducibility and of round trips compared bit for bit: those are
    CPU guarantees (one thread per op, fixed reduction order). On CUDA the same seed need not give the
    same bits (cuDNN/TF32 kernels, atomic reductions), and metrics recorded while training on the GPU
    differ in the last bits from the same model evaluated on the CPU after a reload. Worker processes
    (joblib) are not covered: a test with workers > 1 that compares bits must be tolerant on CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(autouse=True)
def _reset_cli_state():
    """The CLI keeps global options in a module-level object; reset it between tests."""
    from dpaudit.cli._common import STATE

    STATE.json = STATE.quiet = STATE.debug = False
    yield
    STATE.json = STATE.quiet = STATE.debug = False


@pytest.fixture(autouse=True)
def _fresh_jl_epsilons():
    """Every test computes its DP-SGD-JL epsilons afresh (dpaudit.accounting.pld.JL_EPSILONS remembers them within a
    process): a test that swaps accounting code (a planted mistake, a mutant) must not read an earlier answer."""
    pld = sys.modules.get("dpaudit.accounting.pld")
    if pld is not None:
        pld.JL_EPSILONS.clear()
