"""Shared fixtures. Tests run on CPU with few threads so timings and results are stable."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(int(os.environ.get("DPAUDIT_TEST_THREADS", "2")))


@pytest.fixture(autouse=True)
def _reset_cli_state():
    """The CLI keeps global options in a module-level object; reset it between tests."""
    from dpaudit.cli._common import STATE

    STATE.json = STATE.quiet = STATE.debug = False
    yield
    STATE.json = STATE.quiet = STATE.debug = False
