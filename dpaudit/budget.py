"""Cost estimates before large work starts: refuse what cannot fit in memory, ask before what takes long.

Every command that trains models, draws canaries or queries a model asks :func:`check_cost` first with
the number of units (runs, reference models, training steps, canaries, queries) and what one unit costs
in memory and time. Work whose memory exceeds :data:`MEMORY_FRACTION` of the machine's available memory
is refused (one line, exit code 2); work estimated above :data:`CONFIRM_SECONDS` (one hour) needs an
explicit go-ahead: ``dpaudit --yes ...`` on the command line, :func:`allow_long_work` in Python. Work
estimated above :data:`BEYOND_SECONDS` (a million years) is refused even then: no machine would finish it.

The time of a training step is an order-of-magnitude estimate, not a benchmark: a forward and backward
pass costs about 6 floating-point operations per parameter and example (Kaplan et al. 2020,
arXiv:2001.08361, §2.1, C ≈ 6N per token), per-example clipping about 3 times that, at
:data:`FLOPS` (a conservative single CPU core). It exists to tell seconds from days before a run starts.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

from dpaudit.errors import BudgetError, InputError
from dpaudit.progress import announce

MEMORY_FRACTION = 0.5  # of the memory available now: what one dpaudit process may plan to use
CONFIRM_SECONDS = 3600.0  # estimated work above one hour needs --yes
NOTICE_SECONDS = 60.0  # estimated work above a minute is announced (one line on stderr) before it starts
FLOPS = 1e9  # floating-point operations per second assumed for a training step (one CPU core, conservative)
# Refused even with --yes: a million years at these estimates is still a year on a machine a million times faster
# than FLOPS (1e15 FLOP/s, about the fastest single accelerator), and far more for work bound by Python's loops.
BEYOND_SECONDS = 1e6 * 365 * 86400
DP_OVERHEAD = 3.0  # per-example gradients and clipping versus a plain step (Opacus-style, order of magnitude)

# The go-ahead lives in the environment so that worker processes (joblib/loky) started after it inherit it.
YES_ENV = "DPAUDIT_YES"


def long_work_allowed() -> bool:
    return os.environ.get(YES_ENV) == "1"


@contextlib.contextmanager
def allow_long_work(allow: bool = True) -> Iterator[None]:
    """Within this block, :func:`check_cost` lets work above :data:`CONFIRM_SECONDS` start (``--yes``)."""
    old = os.environ.get(YES_ENV)
    set_allow_long_work(allow)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(YES_ENV, None)
        else:
            os.environ[YES_ENV] = old


def set_allow_long_work(allow: bool) -> None:
    """``dpaudit --yes``: allow long work for the rest of this process and the workers it starts."""
    if allow:
        os.environ[YES_ENV] = "1"
    else:
        os.environ.pop(YES_ENV, None)


def available_memory() -> int:
    """Bytes of memory available now (Linux ``MemAvailable``; else physical pages; else 4 GiB)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 * 2**30


def _bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            # below 1024 (but in TiB): 3 significant digits, whole where they would print an exponent (999.5..1023:
            # "1000 GiB", not "1e+03 GiB" or "1.02e+03 GiB")
            v = n / size
            text = f"{v:.3g}"
            return f"{text if 'e' not in text or unit == 'TiB' else f'{v:.0f}'} {unit}"
    return f"{n:.0f} B"


def _duration(s: float) -> str:
    if not math.isfinite(s):
        return "forever"
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if s >= size:
            v = f"{s / size:.3g}"
            return f"{v} {unit[:-1] if v == '1' else unit}"  # "1 year", not "1 years"
    return f"{s:.3g} s"


@dataclass(frozen=True)
class Cost:
    """The estimated cost of ``units`` × ``unit`` (e.g. 1e9 × "training runs"): memory held at once
    (``fixed_bytes`` + ``bytes_per_unit`` × units) and time (``seconds_per_unit`` × units). ``advice``: what the
    user can do when the memory is refused (default: "use fewer <unit>")."""

    what: str
    units: float
    unit: str
    bytes_per_unit: float = 0.0
    seconds_per_unit: float = 0.0
    fixed_bytes: float = 0.0
    advice: str | None = None

    @property
    def memory(self) -> float:
        return self.fixed_bytes + self.bytes_per_unit * self.units

    @property
    def seconds(self) -> float:
        return self.seconds_per_unit * self.units


def check_cost(cost: Cost, *, memory: int | None = None) -> Cost:
    """Refuse ``cost`` when its memory exceeds :data:`MEMORY_FRACTION` of ``memory`` (default: available
    now), when its time exceeds :data:`BEYOND_SECONDS`, or when it exceeds :data:`CONFIRM_SECONDS` without
    :func:`allow_long_work` / ``--yes`` (:class:`~dpaudit.errors.BudgetError`, an InputError: one line, exit
    code 2)."""
    avail = available_memory() if memory is None else memory
    if cost.memory > MEMORY_FRACTION * avail:
        raise BudgetError(
            f"{cost.what}: {cost.units:.4g} {cost.unit} need about {_bytes(cost.memory)} of memory, more than "
            f"{MEMORY_FRACTION:.0%} of the {_bytes(avail)} available; {cost.advice or f'use fewer {cost.unit}'}"
        )
    if cost.seconds > BEYOND_SECONDS:  # even with --yes: started, it would never finish
        raise BudgetError(
            f"{cost.what}: {cost.units:.4g} {cost.unit} would take about {_duration(cost.seconds)} (an estimate: "
            f"{_duration(cost.seconds_per_unit)} each), beyond any machine, so refused even with --yes (above "
            f"{_duration(BEYOND_SECONDS)}); use fewer {cost.unit}"
        )
    if cost.seconds > CONFIRM_SECONDS and not long_work_allowed():
        raise BudgetError(
            f"{cost.what}: {cost.units:.4g} {cost.unit} would take about {_duration(cost.seconds)} "
            f"(an estimate: {_duration(cost.seconds_per_unit)} each); rerun with dpaudit --yes to start it anyway "
            "(in Python: with dpaudit.budget.allow_long_work())"
        )
    if cost.seconds > NOTICE_SECONDS:
        # Said before the work starts, so that nothing long begins without an estimate (the CLI's notice
        # reporter: silent under --quiet, each estimate once per command).
        announce(f"{cost.what}: about {_duration(cost.seconds)} and {_bytes(cost.memory)} of memory (an estimate)")
    return cost


def model_parameters(spec) -> int:
    """Number of parameters of ``spec``'s model, counted on torch's ``meta`` device (nothing allocated)."""
    import torch

    try:
        with torch.device("meta"):
            model = spec.build()
    except (RuntimeError, ValueError, OverflowError, TypeError) as e:
        raise InputError(f"cannot build the model spec ({str(e).splitlines()[0][:200]})") from None
    return int(sum(p.numel() for p in model.parameters()))


def check_model_size(spec, *, bytes_per_parameter: int = 4) -> int:
    """Refuse a model spec whose weights alone cannot fit in memory (before any is allocated); returns
    its number of parameters."""
    n = model_parameters(spec)
    check_cost(Cost("model spec", n, "parameters", bytes_per_unit=bytes_per_parameter))
    return n


def step_seconds(parameters: int, batch_size: int, *, private: bool) -> float:
    """Estimated seconds of one training step (module docstring: 6 FLOPs per parameter and example)."""
    return 6.0 * parameters * batch_size * (DP_OVERHEAD if private else 1.0) / FLOPS


def training_cost(what: str, parameters: int, steps: int, batch_size: int, *, private: bool) -> Cost:
    """One training: ``steps`` steps of ``batch_size`` examples; memory: the per-example gradients of a
    batch when ``private`` (float32), else one gradient, plus weights and optimiser state."""
    per_example = batch_size if private else 1
    return Cost(
        what,
        steps,
        "training steps",
        seconds_per_unit=step_seconds(parameters, batch_size, private=private),
        fixed_bytes=4.0 * parameters * (per_example + 3),
    )


def check_trainings(what: str, runs: float, one: Cost) -> Cost:
    """Refuse ``runs`` trainings each costing ``one`` (memory: one at a time; time: all of them)."""
    return check_cost(Cost(what, runs, "trainings", seconds_per_unit=one.seconds, fixed_bytes=one.memory))
