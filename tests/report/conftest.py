"""Fixtures of the report tests: the hand-made three-model report and its renderings (rendered once)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "report.json"


@pytest.fixture(scope="session")
def _fixture_report() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture
def report(_fixture_report) -> dict:
    """A fresh copy of the fixture report (non-private 'violation', ε=1 'consistent', ε=8 'inconclusive')."""
    return copy.deepcopy(_fixture_report)


@pytest.fixture(scope="session")
def html_text(_fixture_report) -> str:
    from dpaudit.report.html import render_html

    return render_html(_fixture_report)
