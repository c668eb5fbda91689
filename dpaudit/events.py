"""Immutable descriptions of privacy mechanisms ("what was done"), with a JSON round trip.

An event says what a mechanism *is*; accountants (``dpaudit.accounting``) say what it *costs*.
The meaning of an event never changes: a new analysis is a new event class.

Conventions shared by every event:

* ``noise_multiplier`` is the noise scale divided by the bound ``C`` on one record's contribution
  to the query (the clipping norm in DP-SGD: L2 for Gaussian noise, L1 for Laplace noise). Under
  add/remove neighbours the query moves by at most ``C``; under replace-one neighbours by at most
  ``2C`` -- the accountant applies that factor, the event does not.
* ``noise_multiplier = 0`` (no noise) is allowed and means the mechanism is not private
  (epsilon = infinity); accountants handle it before any numerics.

Serialise with :meth:`Event.to_dict` (``{"type": "gaussian", "noise_multiplier": 1.1}``) and
read back with :func:`event_from_dict`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from dpaudit.errors import InputError
from dpaudit.validation import (
    check_in_interval,
    check_noise_multiplier,
    check_non_negative,
    check_positive_int,
)

__all__ = [
    "ZCDP",
    "Composed",
    "EpsilonDelta",
    "Event",
    "FixedSizeSampled",
    "GNMax",
    "Gaussian",
    "JLGaussian",
    "LNMax",
    "Laplace",
    "NoOp",
    "NonPrivate",
    "PoissonSampled",
    "RandomizedResponse",
    "SelfComposed",
    "event_from_dict",
]

_REGISTRY: dict[str, type[Event]] = {}


def _check_event(name: str, value: Any) -> Event:
    if not isinstance(value, Event):
        raise InputError(f"expected {name} to be an Event, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Event:
    """Base class of all mechanism events (frozen, hashable, JSON-serialisable)."""

    type_name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.type_name:
            _REGISTRY[cls.type_name] = cls

    def to_dict(self) -> dict[str, Any]:
        """``{"type": <name>, <field>: <value>, ...}``; nested events become nested dicts."""
        out: dict[str, Any] = {"type": self.type_name}
        for f in dataclasses.fields(self):
            out[f.name] = _to_json_value(getattr(self, f.name))
        return out

    @classmethod
    def _from_fields(cls, fields: dict[str, Any]) -> Event:
        return cls(**fields)


def _to_json_value(value: Any) -> Any:
    if isinstance(value, Event):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_to_json_value(v) for v in value]
    return value


def event_from_dict(d: dict[str, Any]) -> Event:
    """Inverse of :meth:`Event.to_dict`; raises :class:`InputError` on unknown types or fields."""
    if not isinstance(d, dict):
        raise InputError(f"expected an event as a JSON object, got {type(d).__name__}")
    if "type" not in d:
        raise InputError("event is missing its 'type' field")
    name = d["type"]
    cls = _REGISTRY.get(name)
    if cls is None:
        raise InputError(f"unknown event type {name!r}; valid: {', '.join(sorted(_REGISTRY))}")
    names = {f.name for f in dataclasses.fields(cls)}
    given = {k: v for k, v in d.items() if k != "type"}
    unknown = sorted(set(given) - names)
    missing = sorted(names - set(given))
    if unknown:
        raise InputError(f"unknown field(s) {', '.join(unknown)} for event type {name!r}")
    if missing:
        raise InputError(f"missing field(s) {', '.join(missing)} for event type {name!r}")
    fields: dict[str, Any] = {}
    for key, value in given.items():
        if key == "event":
            value = event_from_dict(value)
        elif key == "events":
            if not isinstance(value, list | tuple):
                raise InputError(f"expected 'events' to be a list, got {type(value).__name__}")
            value = tuple(event_from_dict(v) for v in value)
        fields[key] = value
    return cls._from_fields(fields)


# --------------------------------------------------------------------------------------------
# Leaf mechanisms
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gaussian(Event):
    """Gaussian noise N(0, (noise_multiplier * C)^2 I) added to a query with per-record bound C (L2)."""

    type_name: ClassVar[str] = "gaussian"
    noise_multiplier: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(noise_multiplier=self.noise_multiplier))


@dataclass(frozen=True)
class Laplace(Event):
    """Laplace noise of scale b = noise_multiplier * C added to a query with per-record bound C (L1)."""

    type_name: ClassVar[str] = "laplace"
    noise_multiplier: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(noise_multiplier=self.noise_multiplier))


@dataclass(frozen=True)
class JLGaussian(Event):
    """One step of DP-SGD-JL before subsampling (Bu et al. 2021, seed paper, Algorithm 2).

    Per-record gradient norms are *estimated* with ``projections`` JL projections and clipped by
    the estimate, then Gaussian noise of scale noise_multiplier * C is added. The sensitivity is
    therefore random: Lemma 4.3 shows the step is f-DP with
    f = T(Z_r, N(Z_r/sigma, 1) || Z_r, N(0, 1)), Z_r = 1/sqrt(chi2_r / r).
    Only add/remove neighbours are covered by that analysis.
    """

    type_name: ClassVar[str] = "jl_gaussian"
    noise_multiplier: float
    projections: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(noise_multiplier=self.noise_multiplier))
        object.__setattr__(self, "projections", check_positive_int(projections=self.projections))


@dataclass(frozen=True)
class ZCDP(Event):
    """A mechanism known only to satisfy rho-zCDP (Bun & Steinke 2016, arXiv:1605.02065, Def. 1.1)."""

    type_name: ClassVar[str] = "zcdp"
    rho: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", check_non_negative(rho=self.rho))


@dataclass(frozen=True)
class EpsilonDelta(Event):
    """A mechanism known only to satisfy (epsilon, delta)-DP (epsilon finite; use NonPrivate for inf)."""

    type_name: ClassVar[str] = "epsilon_delta"
    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        eps = check_non_negative(epsilon=self.epsilon)
        if math.isinf(eps):
            raise InputError("expected epsilon to be finite, got inf (use NonPrivate)")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, delta=self.delta))


@dataclass(frozen=True)
class RandomizedResponse(Event):
    """k-ary randomized response: with probability ``noise_parameter`` output a uniformly random
    bucket out of ``num_buckets``, otherwise the true bucket (same parametrisation as
    dp_accounting's RandomizedResponseDpEvent). Neighbours replace one input (replace-one)."""

    type_name: ClassVar[str] = "randomized_response"
    noise_parameter: float
    num_buckets: int

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "noise_parameter",
            check_in_interval(0.0, 1.0, lo_open=False, hi_open=False, noise_parameter=self.noise_parameter),
        )
        object.__setattr__(self, "num_buckets", check_positive_int(num_buckets=self.num_buckets))


@dataclass(frozen=True)
class GNMax(Event):
    """PATE's Gaussian NoisyMax aggregator (Papernot et al. 2018, arXiv:1802.08908), one query:
    argmax of the teachers' vote histogram plus N(0, sigma^2) noise per class. The privacy unit is
    one teacher; accounted data-independently (changing one vote moves the histogram by sqrt(2) in L2)."""

    type_name: ClassVar[str] = "gnmax"
    sigma: float
    n_classes: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", check_non_negative(sigma=self.sigma))
        n = check_positive_int(n_classes=self.n_classes)
        if n < 2:
            raise InputError(f"expected n_classes >= 2, got {n}")
        object.__setattr__(self, "n_classes", n)


@dataclass(frozen=True)
class LNMax(Event):
    """PATE's Laplace NoisyMax aggregator (Papernot et al. 2017, arXiv:1610.05755), one query:
    argmax of the vote histogram plus Laplace noise of scale ``noise_scale`` (= 1/gamma in the
    paper) per class. The privacy unit is one teacher."""

    type_name: ClassVar[str] = "lnmax"
    noise_scale: float
    n_classes: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_scale", check_non_negative(noise_scale=self.noise_scale))
        n = check_positive_int(n_classes=self.n_classes)
        if n < 2:
            raise InputError(f"expected n_classes >= 2, got {n}")
        object.__setattr__(self, "n_classes", n)


@dataclass(frozen=True)
class NonPrivate(Event):
    """A mechanism with no privacy guarantee (epsilon = infinity)."""

    type_name: ClassVar[str] = "non_private"


@dataclass(frozen=True)
class NoOp(Event):
    """A step that does not touch private data (costs nothing)."""

    type_name: ClassVar[str] = "no_op"


# --------------------------------------------------------------------------------------------
# Sampling wrappers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoissonSampled(Event):
    """Run ``event`` on a Poisson subsample: each record is included independently with
    probability ``sample_rate``. Accounted under add/remove neighbours."""

    type_name: ClassVar[str] = "poisson_sampled"
    sample_rate: float
    event: Event

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "sample_rate", check_in_interval(0.0, 1.0, hi_open=False, sample_rate=self.sample_rate)
        )
        _check_event("event", self.event)


@dataclass(frozen=True)
class FixedSizeSampled(Event):
    """Run ``event`` on a uniformly random subset of exactly ``batch_size`` of the
    ``dataset_size`` records (sampling without replacement). Accounted under replace-one
    neighbours (the dataset size is public)."""

    type_name: ClassVar[str] = "fixed_size_sampled"
    batch_size: int
    dataset_size: int
    event: Event

    def __post_init__(self) -> None:
        b = check_positive_int(batch_size=self.batch_size)
        n = check_positive_int(dataset_size=self.dataset_size)
        if b > n:
            raise InputError(f"expected batch_size <= dataset_size, got {b} > {n}")
        object.__setattr__(self, "batch_size", b)
        object.__setattr__(self, "dataset_size", n)
        _check_event("event", self.event)

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.dataset_size


# --------------------------------------------------------------------------------------------
# Structural events
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SelfComposed(Event):
    """``event`` run ``count`` times (adaptively) on the same data."""

    type_name: ClassVar[str] = "self_composed"
    event: Event
    count: int

    def __post_init__(self) -> None:
        _check_event("event", self.event)
        object.__setattr__(self, "count", check_positive_int(count=self.count))


@dataclass(frozen=True)
class Composed(Event):
    """Adaptive composition of ``events`` (in any order) on the same data."""

    type_name: ClassVar[str] = "composed"
    events: tuple[Event, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.events, list | tuple):
            raise InputError(f"expected events to be a list or tuple, got {type(self.events).__name__}")
        events = tuple(self.events)
        for i, e in enumerate(events):
            _check_event(f"events[{i}]", e)
        object.__setattr__(self, "events", events)
