"""Accountants by name (``make_accountant("rdp")``): the table the CLI options, the calibration and the
package's helpers share. Its own module so that :mod:`dpaudit.accounting.calibration` can use it
without importing the package that imports calibration (issue 23).
"""

from __future__ import annotations

from dpaudit.accounting.base import Accountant
from dpaudit.accounting.gdp import GdpAccountant
from dpaudit.accounting.pld import PldAccountant
from dpaudit.accounting.rdp import RdpAccountant
from dpaudit.accounting.zcdp import ZcdpAccountant
from dpaudit.errors import InputError

ACCOUNTANTS: dict[str, type[Accountant]] = {
    "rdp": RdpAccountant,
    "pld": PldAccountant,
    "gdp": GdpAccountant,
    "zcdp": ZcdpAccountant,
}


def make_accountant(name: str, *, neighbouring: str = "add_remove") -> Accountant:
    """A fresh accountant by name: ``"rdp"``, ``"pld"``, ``"gdp"`` (CLT for subsampling: approximate)
    or ``"zcdp"``. Unknown names raise :class:`InputError` listing the valid ones."""
    if name not in ACCOUNTANTS:
        raise InputError(f"unknown accountant {name!r}; valid: {', '.join(ACCOUNTANTS)}")
    return ACCOUNTANTS[name](neighbouring=neighbouring)
