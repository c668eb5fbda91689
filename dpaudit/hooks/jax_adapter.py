"""JAX adapters: gradient canaries around the noise step of a JAX DP-SGD loop, on pytrees.

Two ways in, one mechanism (:class:`dpaudit.hooks.GradientCanaries` does all the work on the host):

- **optax** (``optax>=0.2``, ``jax>=0.8``; tested with optax 0.2.8 and JAX 0.10.2, and optax 0.2.0 with
  JAX 0.8.0, on CPU): a pair of gradient transformations around your noise transformation, usable in
  ``optax.chain`` and under ``jax.jit`` (also inside ``jax.lax.scan``)::

      canaries = GradientCanaries(pytree_shapes(params), count=1000, sample_rate=q, clip=C, seed=0)
      tx = optax.chain(
          clip_and_sum(C),            # yours: per-example gradients -> Σ_i clip_C(g_i)
          canaries.optax_inject(),    # + the canaries drawn at this step
          add_gaussian_noise(σ * C),  # yours: + N(0, σ²C²) on every leaf
          canaries.optax_observe(),   # the noisy SUM, before any division by the batch size
          optax.scale(1 / B), optax.sgd(lr),
      )

  Each transformation's state is its step counter (``CanaryStepState``). The canaries' bookkeeping is
  host-side NumPy, reached through ``jax.experimental.io_callback(..., ordered=True)``: an ordered
  effect, so under ``jit`` the calls run once per executed step, in program order, and are never
  removed as dead code. Each step copies the clipped sum and the noisy sum to the host once each
  (the noise summary needs every coordinate); cheap next to per-example gradients for the models an
  audit trains, but a cost on a large model. ``canaries.save()`` / ``observations()`` first wait for
  every dispatched step (``jax.effects_barrier``). Not supported: ``vmap`` over the transformation
  (ordered callbacks cannot be batched) and several devices (``pmap``/sharded updates).
  ``optax.contrib.differentially_private_aggregate`` fuses clipping, the sum, the noise and the
  division by the batch size in one function, so the hooks cannot sit between them: write the chain
  from its parts as above (:func:`optax.per_example_global_norm_clip` gives the clipped sum).
- **plain pytree functions** for a loop without optax (:func:`pytree_hooks`); they convert to NumPy,
  so call them between jitted pieces.

Leaves are named by ``jax.tree_util.keystr`` of their path (:func:`pytree_shapes`). A tree whose names
or shapes differ from the canaries' (canaries designed for another model) is refused with a one-line
:class:`InputError` when the transformation is initialised or traced, and so is a gradient leaf that is not
float32/float64 (an integer leaf's float0 gradient, bfloat16: the canary would not be exactly C; see
:data:`dpaudit.hooks.core.FULL_PRECISION`). Misuse that only the running
loop can show — observe before inject (the chain in the wrong order), a step counter that restarts
(the optimizer state re-initialised mid-run) — raises dpaudit's one-line ``InputError`` before anything
is recorded: directly when the chain runs eagerly; under ``jit`` from inside the callback, which JAX
re-raises as a ``JaxRuntimeError`` whose message ends with that line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from dpaudit.errors import InputError
from dpaudit.hooks.core import JAX_MISSING, check_full_precision_grads


def _jax():
    try:
        import jax
    except ImportError:
        raise InputError("the JAX adapter needs JAX: pip install jax (or dpaudit[jax])") from None
    return jax


def _optax():
    try:
        import optax
    except ImportError:
        raise InputError("the optax adapter needs optax: pip install optax (or dpaudit[jax])") from None
    return optax


def pytree_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """Leaf name (``jax.tree_util.keystr`` of its path) -> shape, in ``tree_flatten`` order. A leaf that is not
    floating point (an integer counter, a boolean mask) has no gradient to carry a canary: refused (one line)."""
    jax = _jax()
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, leaf in leaves:
        dtype = getattr(leaf, "dtype", None) or np.asarray(leaf).dtype
        if not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
            raise InputError(
                f"pytree_shapes: leaf {jax.tree_util.keystr(path)} has dtype {np.dtype(dtype).name}, not floating "
                "point: it has no gradient to carry a canary; give pytree_shapes the trainable (floating-point) "
                "leaves only"
            )
    return {jax.tree_util.keystr(path): tuple(np.shape(leaf)) for path, leaf in leaves}


def _named(tree: Any) -> tuple[dict[str, Any], Any, list[str]]:
    """(leaf name -> leaf, treedef, names in flatten order)."""
    jax = _jax()
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    names = [jax.tree_util.keystr(p) for p, _ in leaves]
    return dict(zip(names, (v for _, v in leaves), strict=True)), treedef, names


def pytree_hooks(canaries) -> tuple[Callable[[int, Any], Any], Callable[[int, Any], None]]:
    """``(inject, observe)`` on pytrees with ``canaries.param_shapes``'s structure, for a loop without optax::

        summed = inject(step, clipped_sum(params, batch))  # Σ_i clip_C(g_i) + the canaries drawn
        noisy = add_noise(summed, key)                       # + N(0, σ²C²) on every leaf
        observe(step, noisy)                                 # before dividing by the batch size

    They read NumPy, so they run outside ``jax.jit`` (jit the clipped sum and the update, not them)."""
    jax = _jax()

    def inject(step: int, summed_clipped_grads: Any) -> Any:
        named, treedef, names = _named(summed_clipped_grads)
        out = canaries.inject(step, named)
        return jax.tree_util.tree_unflatten(treedef, [out[n] for n in names])

    def observe(step: int, noisy_grads: Any) -> None:
        canaries.observe(step, _named(noisy_grads)[0])

    canaries.meta.setdefault("framework", "jax")
    return inject, observe


class CanaryStepState(NamedTuple):
    """The state of :func:`optax_inject` / :func:`optax_observe`: the number of steps they have seen (int32)."""

    step: Any


def _check_tree(canaries, tree: Any, what: str, *, grads: bool = True) -> tuple[Any, list[str]]:
    """(treedef, names) of ``tree``, refused (one line) unless its leaves are the canaries' parameters and shapes,
    and (``grads``: a gradient tree, not the parameters) float32/float64, as the core requires."""
    named, treedef, names = _named(tree)
    canaries._check_names(
        names, f"{what}: the tree's leaves", " (build them with pytree_shapes(params))", missing_hint=JAX_MISSING
    )
    for n in names:
        if tuple(np.shape(named[n])) != canaries.param_shapes[n]:
            raise InputError(
                f"{what}: leaf {n} has shape {tuple(np.shape(named[n]))}, the canaries were designed for "
                f"{canaries.param_shapes[n]}: canaries designed for another model?"
            )
        if grads:  # at trace time under jit: a one-line InputError, not one from inside the host callback
            check_full_precision_grads(what, n, named[n])
    return treedef, names


def _concrete(step: Any, leaves: list[Any]) -> bool:
    """Whether the update runs eagerly (no tracer among its inputs), so the host can be called directly."""
    jax = _jax()
    return not any(isinstance(x, jax.core.Tracer) for x in (step, *leaves))


def _transformation(canaries, what: str, update: Callable[[Any, Any], Any]):
    """An ``optax.GradientTransformation`` with a step counter for state and ``update(step, updates)`` as update."""
    optax = _optax()
    _jax()  # a one-line error when JAX is missing
    import jax.numpy as jnp

    def init_fn(params: Any) -> CanaryStepState:
        _check_tree(canaries, params, f"{what}.init", grads=False)  # bfloat16 parameters may get float32 grads
        return CanaryStepState(step=jnp.zeros([], jnp.int32))

    def update_fn(updates: Any, state: CanaryStepState, params: Any = None):
        del params
        return update(state.step, updates), CanaryStepState(step=state.step + 1)

    canaries.meta.setdefault("framework", "optax")
    canaries._flush = lambda: _barrier(canaries)  # observations() waits for the steps already dispatched
    return optax.GradientTransformation(init_fn, update_fn)


def _refusing(canaries, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)`` from a host callback, remembering a refusal (an :class:`InputError`) it raises."""
    try:
        return call(*args)
    except InputError as e:
        canaries._refused = str(e)
        raise


def _barrier(canaries) -> None:
    """Wait for every dispatched step (``jax.effects_barrier``). A call the hooks refused has already raised
    its error where the user made it, and recorded nothing; on a GPU the runtime's ordered-effects token
    keeps that error and the barrier would raise it again in ``observations()``/``save()`` (seen on an
    H200), so an error carrying that refusal is not raised twice. Any other error is."""
    try:
        _jax().effects_barrier()
    except Exception as e:
        if canaries._refused is None or canaries._refused not in str(e):
            raise


def _inject(canaries, step: int, named: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:meth:`GradientCanaries.inject` from the chain, refusing first a step already observed: the chain's counter
    went back because its state was not carried from the step before. Besides a state re-initialised mid-run,
    ``optax.MultiSteps`` (optax 0.2.8) runs the wrapped chain at every mini-step and keeps its state only every k-th:
    with the pair inside MultiSteps(k=2) the first mini-step was recorded as step 0 and the second refused as
    "inject(step=0): expected step 1", which did not say why. (``optax.apply_if_finite`` skips the chain on a
    non-finite step, in a ``lax.cond``: no step is recorded for it, and the pair works inside it.)"""
    if 0 <= step < canaries.steps_ and canaries._pending is None:
        raise InputError(
            f"inject(step={step}): expected step {canaries.steps_}: step {step} was already observed, so the chain's "
            "state was not carried from the step before (an optimizer state re-initialised mid-run: restore it with "
            "the model; or the pair inside optax.MultiSteps, which runs it at every mini-step and keeps its state only "
            "every k-th): run the canaries' pair once per noisy step, outside such wrappers "
            "(accumulate the micro-batches' clipped sums yourself, then one chain update)"
        )
    return canaries.inject(step, named)


def optax_inject(canaries):
    """The optax transformation that adds the canaries to the clipped sum (place it right before the noise).

    Its input is Σ_i clip_C(g_i), a tree like the parameters; its output the same plus C at each canary
    drawn at this step (:meth:`GradientCanaries.inject`), same dtypes. jit-compatible (see the module
    docstring)."""
    if canaries.clip is None:
        raise InputError("the canaries' clip norm is not set: give clip=C when building them")
    jax = _jax()
    from jax.experimental import io_callback

    def update(step: Any, updates: Any) -> Any:
        treedef, names = _check_tree(canaries, updates, "optax_inject")
        leaves = jax.tree_util.tree_leaves(updates)
        dtypes = [np.dtype(v.dtype) for v in leaves]

        def host(step: Any, arrays: list[Any]) -> list[np.ndarray]:
            # JAX may hand the callback its own arrays: NumPy here, else every step dispatches eager JAX ops
            out = _refusing(
                canaries, _inject, canaries, int(step), dict(zip(names, map(np.asarray, arrays), strict=True))
            )
            return [np.asarray(out[n], dtype=d) for n, d in zip(names, dtypes, strict=True)]

        if _concrete(step, leaves):  # not traced: call the host directly (errors stay dpaudit's InputError)
            new = [jax.numpy.asarray(a) for a in host(np.asarray(step), [np.asarray(v) for v in leaves])]
        else:
            shapes = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in leaves]
            new = io_callback(host, shapes, step, leaves, ordered=True)
        return jax.tree_util.tree_unflatten(treedef, new)

    return _transformation(canaries, "optax_inject", update)


def optax_observe(canaries):
    """The optax transformation that records the noisy sum (place it right after the noise, before any
    division by the batch size); it passes its input through unchanged (:meth:`GradientCanaries.observe`)."""
    jax = _jax()
    from jax.experimental import io_callback

    def update(step: Any, updates: Any) -> Any:
        _, names = _check_tree(canaries, updates, "optax_observe")

        def host(step: Any, arrays: list[Any]) -> None:
            _refusing(canaries, canaries.observe, int(step), dict(zip(names, map(np.asarray, arrays), strict=True)))

        leaves = jax.tree_util.tree_leaves(updates)
        if _concrete(step, leaves):
            host(np.asarray(step), [np.asarray(v) for v in leaves])
        else:
            io_callback(host, None, step, leaves, ordered=True)
        return updates

    return _transformation(canaries, "optax_observe", update)
