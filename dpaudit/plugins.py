"""Plug-in trainers: users' own training code inside dpaudit's multi-run audit.

The contract (users' CI files depend on it; it does not change)::

    function(X: numpy.ndarray, y: numpy.ndarray, seed: int) -> Mapping[str, array-like]

- ``X``: the training records, preprocessed as dpaudit records them — float32 features standardised
  with the scaler fitted on the public auxiliary split (token ids stay int64), in the dataset's
  feature shape (digits: ``(n, 1, 8, 8)``); in runs with the canary, dpaudit's canary is one of the
  rows, at a random position.
- ``y``: int64 labels in ``0 .. n_classes - 1``.
- ``seed``: a non-negative int (< 2**31), different for every run; *all* the run's randomness
  (initialisation, sampling, noise) must come from it — :mod:`dpaudit.seeding` derives framework
  generators from it. Before an audit's runs the trainer is called on the same records with one seed twice
  and with another: a trainer whose weights do not depend on the seed, or differ for the same seed, is
  named in the audit's notes (:func:`seed_note`).
- ``reference_size`` (optional keyword, passed only when the function accepts it): the dataset size N the
  mechanism is defined for, the same in every run of an audit, IN or OUT. Use it — never ``len(X)`` — for
  the sampling rate (q = B / reference_size) and for any division (by the expected batch size
  q · reference_size). A trainer that divides by ``len(X)`` or sets q = B / len(X) runs a different
  mechanism on the two neighbouring datasets (N vs N + 1 records), so even its "correct" version can
  truly exceed its claim, and an audit then measures the wrong thing. Before an add/remove audit's runs, a
  trainer that takes the keyword is trained on the smaller neighbour's N records with the same seed, told
  the mechanism is for N + 1 records and for N (with and without the extra record); the same weights
  (confirmed with 2(N + 1)) are reported in the audit's notes (the keyword seems ignored), as is a trainer
  without it (it cannot be checked). See :func:`reference_size_note` for what this can and cannot see.
- returns: the state dict of the model that the model spec describes
  (:func:`dpaudit.models.build_model`), as torch tensors or numpy arrays; the wrapper prefixes of
  Opacus (``_module.``) and DDP (``module.``) are accepted.

dpaudit owns the experiment (canary, neighbouring datasets, randomisation, scoring, statistics); the
function owns the training. A trainer is named by ``"package.module:function"`` (importable from the
current directory, as with ``python -m``) or passed as a callable; in worker processes the callable
must be picklable (a top-level function is).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dpaudit.errors import CheckpointError, InputError
from dpaudit.user_code import first_line, load_object

if TYPE_CHECKING:
    import torch

__all__ = [
    "CONTRACT",
    "call_trainer",
    "check_trainer",
    "load_model_spec",
    "load_trainer",
    "trainer_name",
]

CONTRACT = "function(X: numpy.ndarray, y: numpy.ndarray, seed: int) -> Mapping[str, array-like]"
# What `audit train --score` computes on each run (the help of the option; implemented in workflows/training.py).
PLUGIN_SCORE_HELP = (
    "margin: logit-scaled confidence of the canary's label at the canary (Carlini et al. 2022, arXiv:2112.03570); "
    "loss: minus its cross-entropy (Yeom et al. 2018, arXiv:1709.01604); probe: the logit-scaled confidence of "
    "the canary's label at a fixed probe input (all zeros after the public standardisation, the aux mean), which "
    "moves with an un-noised bias however the canary looks; or 'module:function', "
    "function(state_dict, x, y) -> float (x: the preprocessed canary, shape (1, *feature_shape); y: its label)."
)


Trainer = Callable[[np.ndarray, np.ndarray, int], Mapping[str, Any]]


def trainer_name(trainer: str | Callable[..., Any]) -> str:
    """``"module:qualname"`` of a trainer (the path itself for a string)."""
    if isinstance(trainer, str):
        return trainer
    module = getattr(trainer, "__module__", None) or "?"
    return f"{module}:{getattr(trainer, '__qualname__', None) or type(trainer).__name__}"


def load_trainer(path: str) -> Trainer:
    """The callable named by ``"package.module:function"`` (``function`` may be dotted: ``module:Cls.fn``).

    The module is imported with the current directory at the front of ``sys.path`` for the duration of
    the import (as ``python -m`` does), so ``examples.my_pipeline:train`` works from a project's root.
    Raises :class:`InputError` (one line) when the path is malformed, the module does not import (and
    why), the attribute is missing or not callable, or it cannot be called as ``f(X, y, seed)``.
    """
    obj = load_object(path, "trainer", "'package.module:function'")
    check_trainer(obj, path)
    return obj


def check_trainer(fn: Any, name: str | None = None) -> None:
    """Raise :class:`InputError` unless ``fn`` is callable and its signature accepts ``(X, y, seed)``."""
    name = name or trainer_name(fn)
    if not callable(fn):
        raise InputError(f"trainer {name} is a {type(fn).__name__}, not a function; expected {CONTRACT}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have no signature: let the call decide
        return
    try:
        if "reference_size" in sig.parameters:
            sig.bind(None, None, 0, reference_size=0)
        else:
            sig.bind(None, None, 0)
    except TypeError:
        raise InputError(f"trainer {name}{sig} cannot be called as {name}(X, y, seed); expected {CONTRACT}") from None


def accepts_reference_size(fn: Any) -> bool:
    """Whether ``fn`` can be called with the optional keyword ``reference_size`` (see the contract)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "reference_size" for p in params)


def reference_size_note(fn: Trainer, X: np.ndarray, y: np.ndarray, seed: int, spec, reference_size: int, *,
                        name: str | None = None) -> str | None:  # fmt: skip
    """Why the trainer may run different mechanisms on the two add/remove neighbours, or None when nothing is seen.

    ``X, y``: the smaller neighbour's records (N = ``len(X)``); ``reference_size``: the N + 1 the audit passes
    on both sides. The question is the issue's: does the trainer's output on the same seed change with and
    without one extra record *in the mechanism's definition*? A trainer without the keyword cannot be asked
    (it may use ``len(X)``). One with it is trained on these N records with the same seed, told the mechanism
    is for N + 1 records (as the audit runs it) and for N: a sampling rate B / reference_size or a divisor
    q · reference_size moves the weights; the same weights bit for bit mean the trainer cannot tell N from
    N + 1, so on the real neighbours (N and N + 1 records) it runs whatever ``len(X)`` makes it run.

    The records themselves are held fixed: adding the record itself would change every trainer's output (its
    gradient, and the random draws shifted by one row), so that comparison cannot separate a correct trainer
    from one using ``len(X)``. A correct trainer's weights can also coincide for N and N + 1 by chance —
    Poisson draws u < B/(N+1) and u < B/N agree unless some u falls between, which with T steps of N draws
    has probability about 1 − exp(−T·B/N) — so coinciding weights are confirmed with 2(N + 1) (q halved,
    which moves any trainer that uses the keyword) before the note is given.

    A detection, not a proof: a trainer that needs neither (fixed q and a fixed divisor) also gives identical
    weights; one that takes q from the keyword but divides by ``len(X)`` is not seen (only ``len(X)``
    changing with the records fixed would show it, and the trainer is never given that)."""
    name = name or trainer_name(fn)
    if not accepts_reference_size(fn):
        return (
            f"trainer {name} does not take reference_size: if it uses len(X) for its sampling rate or divisor, "
            "the two neighbouring datasets run different mechanisms (see dpaudit.plugins)"
        )
    n = len(X)
    if reference_size <= n:
        raise InputError(f"the reference size {reference_size} must exceed the smaller neighbour's {n} records")

    def weights(size: int) -> dict[str, Any]:
        # Each call gets its own copy: a trainer may shuffle or rescale its records in place, and the calls
        # must differ in reference_size alone.
        return call_trainer(fn, X.copy(), y.copy(), seed, spec, name=name, reference_size=size).state_dict()

    def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return all(bool((a[k] == b[k]).all()) for k in a)

    with_extra = weights(reference_size)
    if not same(weights(n), with_extra) or not same(weights(2 * reference_size), with_extra):
        return None
    return (
        f"trainer {name} returned the same weights for reference_size {n}, {reference_size} and "
        f"{2 * reference_size} (the same {n} records and seed): it seems to ignore it and to use len(X) instead, "
        "which makes the two neighbouring datasets (N and N + 1 records) run different mechanisms"
    )


def seed_note(fn: Trainer, X: np.ndarray, y: np.ndarray, seeds: tuple[int, int], spec, reference_size: int | None,
              *, name: str | None = None) -> str | None:  # fmt: skip
    """Whether the trainer's randomness comes from its ``seed``, as the contract says; None when it seems to.

    The trainer is called on the same records (``X, y``) with ``seeds[0]``, again with ``seeds[0]``, and with
    ``seeds[1]``. The same weights bit for bit for two different seeds mean the output does not depend on the
    seed — a seed fixed inside the function, or no noise at all — so every run repeats one draw of the noise.
    The runs are still independent trials of the function as given (which is then deterministic: if the canary
    changes its output it is (ε, δ)-DP for no δ < 1, so a "violation" stands), but not of a pipeline that
    draws fresh noise per run, which is what a claim of DP-SGD describes: the user must hear it. Different
    weights for the same seed (randomness not drawn from seed) leave the runs independent but the audit
    cannot be reproduced. Either is returned as one line for the audit's notes.
    """
    name = name or trainer_name(fn)

    def weights(seed: int) -> dict[str, Any]:  # a copy per call: a trainer may shuffle its records in place
        return call_trainer(fn, X.copy(), y.copy(), seed, spec, name=name, reference_size=reference_size).state_dict()

    def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return all(bool((a[k] == b[k]).all()) for k in a)

    first, again, other = weights(seeds[0]), weights(seeds[0]), weights(seeds[1])
    if same(first, other) and same(again, other):
        return (
            f"trainer {name} returned the same weights for seeds {seeds[0]} and {seeds[1]} on the same records: its "
            "output does not depend on seed (a seed fixed inside it, or no noise), so every run repeats one draw "
            "of its noise; the bound is on this function as given, not on a pipeline that draws fresh noise per run"
        )
    if not same(first, again):
        return (
            f"trainer {name} returned different weights for the same seed {seeds[0]}: some of its randomness is not "
            "drawn from seed, so the runs are independent but this audit cannot be reproduced"
        )
    return None


def call_trainer(
    fn: Trainer,
    X: np.ndarray,
    y: np.ndarray,
    seed: int,
    spec,
    *,
    name: str | None = None,
    reference_size: int | None = None,
) -> torch.nn.Module:
    """Run ``fn(X, y, seed)`` (with ``reference_size=`` when given and ``fn`` accepts it) and load what it
    returns into ``build_model(spec)`` (eval mode).

    Raises :class:`InputError` naming the trainer when the function raises, returns something that is
    not a mapping, returns names or shapes the spec does not have (listing them, and what was
    expected) or non-finite weights. The error chains the trainer's own exception, so ``--debug``
    shows its traceback.
    """
    from dpaudit.checkpoint import load_state_into
    from dpaudit.models import build_model

    name = name or trainer_name(fn)
    try:
        if reference_size is not None and accepts_reference_size(fn):
            state = fn(X, y, seed, reference_size=int(reference_size))
        else:
            state = fn(X, y, seed)
    except Exception as e:
        raise InputError(f"trainer {name} failed (seed {seed}): {first_line(e)}") from e
    if not isinstance(state, Mapping):
        hint = "; return model.state_dict()" if hasattr(state, "state_dict") else ""
        raise InputError(
            f"trainer {name} returned a {type(state).__name__}; expected a state dict (a mapping of parameter "
            f"names to arrays){hint}"
        )
    model = build_model(spec, seed=0)  # seeded: it draws nothing from torch's global generator
    try:
        load_state_into(model, dict(state), f"trainer {name}")
    except CheckpointError as e:
        expected = ", ".join(f"{k} {list(v.shape)}" for k, v in model.state_dict().items())
        raise InputError(f"{e}; the {spec.kind} spec expects: {expected}") from None
    bad = [k for k, v in model.state_dict().items() if v.is_floating_point() and not bool(v.isfinite().all())]
    if bad:
        raise InputError(f"trainer {name} returned non-finite weights in {', '.join(bad[:5])} (seed {seed})")
    return model.eval()


def load_model_spec(
    path: str | Path, *, feature_shape: tuple[int, ...], n_classes: int, tokens: bool = False, dataset=None
):
    """The model spec in a JSON file (``ModelSpec.to_dict()``'s format), checked against the data's
    feature shape and number of classes; :class:`InputError` (one line, naming the file) otherwise.
    ``tokens``: the data are token ids (see :func:`dpaudit.models.read_model_spec`). ``dataset``: the
    :class:`~dpaudit.data.Dataset` itself, whose labels explain a class count that does not fit."""
    from dpaudit.models import looks_channels_last, read_model_spec

    def fits(spec) -> None:  # before a factory's model is built (read_model_spec names the file)
        if spec.input_shape == tuple(feature_shape) and spec.n_classes == n_classes:
            return
        shape, want = tuple(feature_shape), tuple(spec.input_shape)
        # Images saved channels-last (numpy/TF's N x 32 x 32 x 3) for a module that reads (channels, height, width).
        hint = ""
        if len(want) == 3 and shape == (*want[1:], want[0]):
            hint = f"; the data looks channels-last: store X as N x {want[0]} x {want[1]} x {want[2]}, e.g. "
            hint += "X.transpose(0, 3, 1, 2)"
        elif looks_channels_last(want) and want == (*shape[1:], shape[0]):  # the spec written channels-last
            hint = f"; the module gets each record as stored, {list(shape)}: write that as the spec's input_shape"
        if spec.n_classes != n_classes and dataset is not None:
            hint += dataset.outputs_hint(spec.n_classes)
        raise InputError(
            f"the spec is for input shape {list(spec.input_shape)} and {spec.n_classes} classes; the data "
            f"has {list(feature_shape)} and {n_classes}{hint}"
        )

    return read_model_spec(Path(path), tokens=tokens, fits=fits)
