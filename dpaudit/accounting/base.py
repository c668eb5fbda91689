"""The one accountant interface.

Structural events (:class:`~dpaudit.events.SelfComposed`, :class:`~dpaudit.events.Composed`,
:class:`~dpaudit.events.NoOp`) and :class:`~dpaudit.events.NonPrivate` are handled here, once;
each accountant only turns a *leaf* mechanism into its own representation (``_leaf``) and adds
it ``count`` times (``_accumulate``).

Composition is atomic: every leaf of an event is converted before any is added, so an
unsupported sub-event leaves the accountant unchanged.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

from dpaudit.errors import InputError, UnsupportedEventError
from dpaudit.events import Composed, Event, Gaussian, NonPrivate, NoOp, SelfComposed
from dpaudit.validation import check_choice, check_in_interval, check_non_negative, check_positive_int

NEIGHBOURING = ("add_remove", "replace_one")


def unsupported(accountant: str, event: Event, why: str) -> UnsupportedEventError:
    """The error an accountant raises for a (sub-)event it cannot account for."""
    return UnsupportedEventError(f"{accountant} accountant cannot handle {event!r}: {why}")


def iter_leaves(event: Event, count: int = 1) -> Iterator[tuple[Event, int]]:
    """Flatten structural events into (leaf, count) pairs; NoOp yields nothing."""
    if isinstance(event, NoOp):
        return
    if isinstance(event, SelfComposed):
        yield from iter_leaves(event.event, count * event.count)
    elif isinstance(event, Composed):
        for e in event.events:
            yield from iter_leaves(e, count)
    else:
        yield event, count


def replace_factor(neighbouring: str) -> float:
    """How far one record can move a query, in units of its contribution bound C.

    Add/remove: the record's contribution (norm <= C) appears or disappears, distance <= C.
    Replace-one: one contribution is swapped for another, distance <= 2C (triangle inequality).
    """
    return 2.0 if neighbouring == "replace_one" else 1.0


def effective_gaussian_noise_multiplier(event: Event) -> float | Event:
    """Noise multiplier of a single Gaussian equivalent to a nested composition of Gaussians.

    k Gaussian mechanisms with noise multipliers sigma_i on the same data are, after rescaling
    each output by 1/sigma_i (post-processing, both ways), one Gaussian mechanism with unit noise
    on a query of sensitivity sqrt(sum 1/sigma_i^2); hence sigma_eff = (sum sigma_i^-2)^(-1/2)
    (McMahan et al. 2018, "A general approach to adding differential privacy to iterative training
    procedures", arXiv:1812.06210, Sec. 3).
    Returns the offending sub-event when the structure contains anything but Gaussians.
    """
    if isinstance(event, Gaussian):
        return event.noise_multiplier
    inv_sq = 0.0
    for leaf, count in iter_leaves(event):
        if isinstance(leaf, NonPrivate):
            return 0.0  # dominated by a Gaussian without noise (P, Q mutually singular)
        if not isinstance(leaf, Gaussian):
            return leaf
        if leaf.noise_multiplier == 0.0:
            return 0.0
        inv_sq += count / leaf.noise_multiplier**2
    if inv_sq == 0.0:
        return math.inf
    return inv_sq**-0.5


class Accountant(ABC):
    """Accumulates privacy events and converts them to (epsilon, delta) guarantees.

    ``neighbouring``: ``"add_remove"`` (default; datasets differ by one record added or removed)
    or ``"replace_one"`` (one record replaced; the dataset size is public).
    """

    name: ClassVar[str] = "accountant"

    def __init__(self, *, neighbouring: str = "add_remove") -> None:
        self.neighbouring = check_choice(NEIGHBOURING, neighbouring=neighbouring)
        self._ledger: list[tuple[Event, int]] = []
        self._non_private = False
        #: True once an event was accounted by an approximation (e.g. the GDP CLT for subsampling):
        #: the epsilon is then an estimate, not a formal bound. Decided per event, not per accountant.
        self.approximate = False

    # -- public interface ----------------------------------------------------------------------

    @property
    def ledger(self) -> list[tuple[Event, int]]:
        """Every (event, count) composed so far, in order (a copy)."""
        return list(self._ledger)

    def compose(self, event: Event, count: int = 1) -> Accountant:
        """Account for ``event`` run ``count`` times; returns ``self``.

        Raises :class:`UnsupportedEventError` (naming the sub-event) if a leaf cannot be handled;
        the accountant is then unchanged.
        """
        if not isinstance(event, Event):
            raise InputError(f"expected an Event, got {type(event).__name__}")
        count = check_positive_int(count=count)
        leaves: list[tuple[Event, int]] = []
        non_private = False
        for leaf, c in iter_leaves(event, count):
            if isinstance(leaf, NonPrivate):
                non_private = True
                continue
            leaves.append((leaf, c))
        reps = self._leaves([leaf for leaf, _ in leaves])
        converted = [(rep, c) for rep, (_, c) in zip(reps, leaves, strict=True)]
        for rep, c in converted:
            self._accumulate(rep, c)
        self._non_private = self._non_private or non_private
        self._ledger.append((event, count))
        return self

    def epsilon(self, delta: float) -> float:
        """Smallest epsilon >= 0 this accountant certifies at ``delta`` (may be ``inf``)."""
        delta = check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=delta)
        if self._non_private:
            return math.inf
        if delta >= 1.0 or self._is_empty():
            return 0.0
        eps = float(self._epsilon(delta))
        if math.isnan(eps):  # a bug, never a result
            raise RuntimeError(f"{self.name} accountant produced NaN epsilon")
        return max(0.0, eps)

    def delta(self, epsilon: float) -> float:
        """Smallest delta this accountant certifies at ``epsilon`` (in [0, 1])."""
        epsilon = check_non_negative(epsilon=epsilon)
        if self._non_private:
            return 1.0
        if self._is_empty():
            return 0.0
        d = float(self._delta(epsilon))
        if math.isnan(d):
            raise RuntimeError(f"{self.name} accountant produced NaN delta")
        return min(1.0, max(0.0, d))

    # -- what each accountant implements -------------------------------------------------------

    @abstractmethod
    def _leaf(self, event: Event) -> Any:
        """Representation of one leaf mechanism, or raise :func:`unsupported`."""

    def _leaves(self, events: list[Event]) -> list[Any]:
        """:meth:`_leaf` of every leaf of one composition, in order (raising for the first unsupported one); an
        accountant may convert them together (rdp: the phases of a schedule, one batch of series)."""
        return [self._leaf(e) for e in events]

    @abstractmethod
    def _accumulate(self, rep: Any, count: int) -> None:
        """Add a leaf representation ``count`` times."""

    @abstractmethod
    def _is_empty(self) -> bool:
        """True when nothing with a privacy cost has been composed."""

    @abstractmethod
    def _epsilon(self, delta: float) -> float:
        """epsilon(delta) for 0 <= delta < 1 and a non-empty, private ledger."""

    @abstractmethod
    def _delta(self, epsilon: float) -> float:
        """delta(epsilon) for epsilon >= 0 and a non-empty, private ledger."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(neighbouring={self.neighbouring!r}, events={len(self._ledger)})"
