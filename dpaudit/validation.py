"""Small keyword validators whose messages write themselves.

check_positive(clip=0.0)  ->  InputError("expected clip > 0, got 0.0")
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

from dpaudit.errors import InputError


def shown(value: Any) -> str:
    """A value as a message shows it: numpy scalars as plain numbers (``2.0``, not ``np.float64(2.0)``)."""
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "shape", None) == ():
        try:
            value = item()
        except Exception:  # a JAX typed PRNG key has shape () and no item(): show it as it prints
            pass
    text = repr(value) if isinstance(value, str) else " ".join(str(value).split())  # one line: arrays print several
    return text if len(text) <= 60 else text[:40] + f"… ({len(text)} characters)"


# C0/C1 control characters (but tab, newline, carriage return) and the bidirectional controls of Unicode TR9
# (marks, embeddings, overrides, isolates). In a name from a stranger's run folder or data file they hide, or reorder
# on screen, what follows them on the line: "x\u202e" before a headline prints its numbers backwards ("21" for 12);
# on a terminal, ESC starts an escape sequence (colours, the window title, OSC 52 clipboard writes).
_INVISIBLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: Any, *, keep_cr: bool = True) -> str:
    """``text`` with every control and bidirectional control character written out (U+202E → ``⟨U+202E⟩``), so a
    report or a terminal shows each name as it is spelled and nothing in one reorders or hides the text around it.
    Every text the Markdown and HTML renderers show goes through this (before their own escaping), and every
    human-readable line the CLI prints (with ``keep_cr=False``: a carriage return would let a name overwrite the
    line it is printed on)."""
    out = _INVISIBLE.sub(lambda m: f"⟨U+{ord(m.group()):04X}⟩", str(text))
    return out if keep_cr else out.replace("\r", "⟨U+000D⟩")


def host_array(x: Any) -> Any:
    """``x`` ready for ``np.asarray``: a torch tensor (or a list/tuple of them: per-record losses) as CPU NumPy
    values, detached from autograd and copied off its device (bfloat16, which NumPy lacks, widened to float32);
    anything else unchanged. Without this NumPy refuses a tensor that requires grad (RuntimeError, torch's own
    advice) and one on a GPU (TypeError), both common for scores computed in a notebook. Duck-typed: the
    audit layers import no torch."""
    if isinstance(x, list | tuple) and any(_is_torch(e) for e in x):
        return [host_array(e) for e in x]
    if not _is_torch(x):
        return x
    x = x.detach().cpu()
    return (x.float() if str(x.dtype) == "torch.bfloat16" else x).numpy()


def check_same_index(**kwargs: Any) -> None:
    """Refuse (one line) pandas objects whose indexes differ: the audit pairs values by position (``np.asarray``
    drops the index), so ``scores`` sorted or filtered apart from ``member`` would silently pair each score with
    another record's membership. Duck-typed (no pandas import); anything without a pandas index passes."""
    indexed = {n: v.index for n, v in kwargs.items() if hasattr(getattr(v, "index", None), "equals")}
    if len(indexed) < 2:
        return
    (n0, i0), *rest = indexed.items()
    for n, i in rest:
        if not i0.equals(i):
            raise InputError(
                f"{n0} and {n} are pandas objects with different indexes; values are paired by position, so align "
                f"them first (e.g. {n}.reindex({n0}.index)) or pass .to_numpy() of each"
            )


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _one(kwargs: dict[str, Any]) -> tuple[str, Any]:
    if len(kwargs) != 1:
        raise TypeError("validators take exactly one keyword argument")
    return next(iter(kwargs.items()))


def _finite(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"expected {name} to be a number, got {shown(value)}") from None
    if math.isnan(v):
        raise InputError(f"expected {name} to be a number, got NaN")
    return v


def check_positive(*, finite: bool = False, **kwargs: Any) -> float:
    """value > 0 (and, with ``finite``, not infinite)."""
    name, value = _one(kwargs)
    v = _finite(name, value)
    if not v > 0:
        raise InputError(f"expected {name} > 0, got {shown(value)}")
    if finite and math.isinf(v):
        raise InputError(f"expected {name} to be finite, got {shown(value)}")
    return v


# Below this a Gaussian/Laplace noise multiplier makes the privacy loss overflow float64 (1/σ² with
# σ = 1e-300 is a ZeroDivisionError); ε is already ~1e13 at σ = 1e-6 (RDP, q = 0.01, T = 100): such a
# mechanism adds no meaningful noise, and σ = 0 (no noise, ε = ∞) says so exactly.
MIN_NOISE_MULTIPLIER = 1e-6
# A claim's δ above this is no privacy guarantee: with δ >= 1/n a mechanism may publish a random record
# outright (Dwork & Roth 2014, "The Algorithmic Foundations of DP", §2.3, which asks δ << 1/n); at δ = 0.999
# every mechanism is (0, δ)-DP. A loose sanity cap for claims and calibration, not a recommendation.
MAX_CLAIM_DELTA = 0.1


# The largest float32 (np.finfo(np.float32).max): models train and noise is drawn in float32 tensors, so a number
# that reaches them (a learning rate, a weight decay, the noise's σ·C, a feature) must fit; torch refuses a larger
# optimizer hyperparameter mid-training ("value cannot be converted to type float without overflow") and NumPy
# turns a larger float64 feature into inf when it casts the data to float32.
FLOAT32_MAX = 3.4028234663852886e38


def check_float32(**kwargs: Any) -> float:
    """A finite number of magnitude at most :data:`FLOAT32_MAX` (a value torch casts to the model's float32)."""
    name, value = _one(kwargs)
    v = _finite(name, value)
    if not abs(v) <= FLOAT32_MAX:
        raise InputError(f"expected {name} <= {FLOAT32_MAX:.4g} (the largest float32) in magnitude, got {shown(value)}")
    return v


def check_noise_multiplier(**kwargs: Any) -> float:
    """A finite noise multiplier: 0 (no noise) or at least :data:`MIN_NOISE_MULTIPLIER`."""
    name, value = _one(kwargs)
    v = _finite(name, value)
    if v < 0:
        raise InputError(f"expected {name} >= 0, got {shown(value)}")
    if math.isinf(v):
        raise InputError(f"expected {name} to be finite, got {shown(value)}")
    if 0 < v < MIN_NOISE_MULTIPLIER:
        raise InputError(
            f"expected {name} = 0 (no noise) or >= {MIN_NOISE_MULTIPLIER:g}, got {shown(value)} "
            "(a smaller noise protects nothing and overflows the accountants)"
        )
    return v


def check_claim_delta(**kwargs: Any) -> float:
    """δ of a privacy claim (or a calibration target): in (0, :data:`MAX_CLAIM_DELTA`]. The one rule for every
    δ a claim is made or accounted at (train, import, account dpsgd/calibrate); the accountants themselves
    take any δ in (0, 1)."""
    name, value = _one(kwargs)
    v = _finite(name, value)
    if not 0 < v <= MAX_CLAIM_DELTA:
        why = " (a larger delta is no privacy guarantee)" if v > MAX_CLAIM_DELTA else ""
        raise InputError(f"expected {name} in (0, {MAX_CLAIM_DELTA:g}], got {shown(value)}{why}")
    return v


def check_non_negative(**kwargs: Any) -> float:
    name, value = _one(kwargs)
    v = _finite(name, value)
    if v < 0:
        raise InputError(f"expected {name} >= 0, got {shown(value)}")
    return v


def python_scalar(value: Any) -> Any:
    """A 0-d NumPy, JAX or torch array as its Python scalar (``jnp.int32(3)`` -> 3, as ``np.int64(3)`` already
    is an integer); anything else (a JAX typed PRNG key included) unchanged, for the checks to refuse."""
    if getattr(value, "shape", None) == () and not isinstance(value, numbers.Number):
        try:
            return value.item()
        except Exception:
            return value
    return value


def check_positive_int(**kwargs: Any) -> int:
    name, value = _one(kwargs)
    value = python_scalar(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or int(value) != value:
        raise InputError(f"expected {name} to be an integer, got {shown(value)}")
    if value < 1:
        raise InputError(f"expected {name} >= 1, got {shown(value)}")
    return int(value)


def available_cores() -> int:
    """CPU cores this process may use (its affinity mask where the OS has one)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def check_workers(workers: int, *, scheduler: str | None = None) -> int:
    """Validate ``--workers``: a positive integer, at most the local cores (unless a cluster runs the jobs).

    Every local pool (reference models, ``audit train``'s runs, PATE's teachers) starts one process per worker,
    each importing torch: 64 workers on a laptop were 64 processes fighting for 2 cores and their memory."""
    workers = check_positive_int(workers=workers)
    cores = available_cores()
    if scheduler is None and workers > cores:
        raise InputError(f"--workers {workers} > {cores} CPU cores on this machine; use at most {cores}")
    return workers


def worker_pool(n_jobs: int, **kwargs: Any):
    """joblib's ``Parallel`` on loky processes for ``--workers`` (the reference models, ``audit train``'s runs, PATE's
    teachers), whose workers end when the dpaudit process that started them is gone. loky's workers wait for the next
    job up to 300 s (``idle_worker_timeout``): a parent killed outright (SIGKILL, the OOM killer) left them, each with
    torch imported, for five minutes before they and loky's resource tracker ended (its "leaked semlock" warnings
    then printed on the user's terminal long after the command); now they end within a second of the parent
    (:func:`_end_with_parent`). A normal end stops them at once (``dpaudit.cli._common.stop_idle_worker_processes``)."""
    import os

    from joblib import Parallel
    from joblib._parallel_backends import LokyBackend

    try:  # a backend's own parameters (joblib's parallel_config, 1.3); checked on joblib 1.6
        backend: Any = LokyBackend(initializer=_end_with_parent, initargs=(os.getpid(),))
    except TypeError:  # a joblib that takes none: loky's workers as they are
        backend = "loky"
    return Parallel(n_jobs=n_jobs, backend=backend, **kwargs)


def _end_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """In a worker process: end it as soon as its parent ``parent`` is gone (it is then given another parent, so
    ``os.getppid()`` changes; polled by a daemon thread, which costs nothing measurable)."""
    import os
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="dpaudit-end-with-parent", daemon=True).start()


def check_in_interval(lo: float, hi: float, *, lo_open: bool = True, hi_open: bool = True, **kwargs: Any) -> float:
    """Check lo < value < hi (brackets controlled by lo_open/hi_open)."""
    name, value = _one(kwargs)
    v = _finite(name, value)
    ok_lo = v > lo if lo_open else v >= lo
    ok_hi = v < hi if hi_open else v <= hi
    if not (ok_lo and ok_hi):
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise InputError(f"expected {name} in {lb}{lo:g}, {hi:g}{rb}, got {shown(value)}")
    return v


# The one seed rule (every seed dpaudit takes goes through :func:`check_seed`, one message).
# The largest seed every library a seed reaches accepts as is: scikit-learn's ``random_state`` and numpy's
# legacy ``RandomState`` take [0, 2**32 - 1]; torch.manual_seed takes < 2**64 (dpaudit also adds small offsets).
MAX_SEED = 2**32 - 1
# Seeds dpaudit derives itself and passes on: :func:`dpaudit.seeding.derive_seed` (63 bits by default; PATE's
# teacher configs), an audit run's ``seed * 1_000_003 + 3r + 11`` and its canary's ``+ 5``. Only the objects
# that receive such seeds take this wider range (TrainConfig, GradientCanaries, dpaudit.seeding); their seeds
# reach only torch.manual_seed (< 2**64, after offsets <= 5) and numpy's SeedSequence (any size).
MAX_DERIVED_SEED = 2**63 - 1


def check_seed(*, limit: int = MAX_SEED, **kwargs: Any) -> int:
    """A seed: an integer in [0, ``limit``] (default :data:`MAX_SEED`; :data:`MAX_DERIVED_SEED` only where
    dpaudit's own derived seeds arrive)."""
    name, value = _one(kwargs)
    value = python_scalar(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= limit:
        raise InputError(f"expected {name} to be an integer in [0, {limit}], got {shown(value)}")
    return int(value)


def check_choice(choices: list[str] | tuple[str, ...], **kwargs: Any) -> str:
    name, value = _one(kwargs)
    if value not in choices:
        raise InputError(f"unknown {name} {shown(value)}; valid: {', '.join(choices)}")
    return value


# --------------------------------------------------------------------------- untrusted JSON

MAX_JSON_BYTES = 64 * 2**20  # a checkpoint.json/claim.json/spec.json is a few KB; a report a few MB
MAX_JSON_DEPTH = 64  # dpaudit's own files nest at most ~8 deep
MAX_JSON_DIGITS = 40  # an integer literal longer than this is no size, seed or count dpaudit reads


def _int_literal(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_DIGITS:
        raise InputError(f"an integer with {len(text)} digits")
    return int(text)


def _float_literal(text: str) -> float:
    v = float(text)
    if math.isinf(v):
        raise InputError(f"the number {text[:20]} overflows a float")
    return v


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A key given twice: Python's json keeps the last value, other readers (a viewer, jq's --stream, a JSON
    # library in another language) may show the first, so one file would read as two claims.
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise InputError(f"the key {key[:40]!r} appears twice in one object")
    return out


def _depth(obj: Any) -> int:
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(o, dict):
            stack += [(v, d + 1) for v in o.values()]
        elif isinstance(o, list):
            stack += [(v, d + 1) for v in o]
    return deepest


def parse_json(text: str | bytes, source: str, *, error: type[Exception] = InputError) -> Any:
    """Parse JSON from an untrusted file with limits: at most :data:`MAX_JSON_BYTES`, nesting depth
    :data:`MAX_JSON_DEPTH`, integer literals of :data:`MAX_JSON_DIGITS` digits and no float that
    overflows (``Infinity``/``NaN``, which dpaudit writes for unbounded values, are allowed). Any
    problem is one ``error`` line naming ``source``, as is a key given twice in one object."""
    import json

    if len(text) > MAX_JSON_BYTES:
        raise error(f"{source}: JSON larger than {MAX_JSON_BYTES // 2**20} MiB")
    try:
        obj = json.loads(text, parse_int=_int_literal, parse_float=_float_literal, object_pairs_hook=_object)
    except RecursionError:
        raise error(f"{source}: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except InputError as e:
        raise error(f"{source}: not accepted: {e}") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise error(f"{source}: not valid JSON ({e})") from None
    if _depth(obj) > MAX_JSON_DEPTH:
        raise error(f"{source}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return obj


def read_limited(path: Any, *, error: type[Exception] = InputError, kind: str = "") -> bytes:
    """The bytes of an untrusted file of at most :data:`MAX_JSON_BYTES`; a missing, unreadable, special or larger
    file is one ``error`` line (``kind``, e.g. "JSON ", names the file's kind in the size line)."""
    from dpaudit.fileio import check_input_file

    path = check_input_file(path, error=error)  # a pipe or device is named as such, never opened
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise error(f"{path}: {kind}larger than {MAX_JSON_BYTES // 2**20} MiB")
        return path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None


def read_json(path: Any, *, error: type[Exception] = InputError) -> Any:
    """:func:`parse_json` of a file (a missing, unreadable or special file is one ``error`` line)."""
    return parse_json(read_limited(path, error=error, kind="JSON "), str(path), error=error)


_JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number"}


def check_json_type(value: Any, expected: type | tuple[type, ...], where: str, *, error: type[Exception] = InputError):
    """``value`` if it has the JSON type ``expected`` (``int`` excludes bools and floats such as 10.0;
    ``float`` accepts integers; ``type(None)`` allows null), else one ``error`` line naming ``where``."""
    types = expected if isinstance(expected, tuple) else (expected,)
    ok = any(
        (t is int and isinstance(value, int) and not isinstance(value, bool))
        or (t is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (t not in (int, float) and isinstance(value, t))
        for t in types
    )
    if not ok:
        names = " or ".join("null" if t is type(None) else _JSON_TYPES.get(t, t.__name__) for t in types)
        raise error(f"{where}: expected {names}, got {type(value).__name__} {str(value)[:40]}")
    return value


MAX_SIZE = 2**31 - 1  # a layer width, shape or count beyond this is no model a machine can hold


def check_int_fields(obj: Any) -> None:
    """Every field of the dataclass ``obj`` annotated ``int`` or ``tuple[int, ...]`` holds integers (not
    bools, not floats such as 10.0) in ``[0, MAX_SIZE]``: a spec from JSON fails here in one line rather
    than deep inside torch (``hidden: [10**400]`` used to dump a C++ stack)."""
    import dataclasses

    for f in dataclasses.fields(obj):
        kind = str(f.type).replace(" ", "")
        if kind not in ("int", "tuple[int,...]"):
            continue
        value = getattr(obj, f.name)
        items = list(value) if kind != "int" and isinstance(value, list | tuple) else [value]
        if kind != "int" and not isinstance(value, list | tuple):
            raise InputError(f"expected {f.name} to be a list of integers, got {shown(value)}")
        for v in items:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise InputError(f"expected {f.name} to hold integers, got {shown(v)}")
            if not 0 <= v <= MAX_SIZE:
                raise InputError(f"expected {f.name} in [0, {MAX_SIZE}], got {shown(v)}")
