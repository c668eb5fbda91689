"""JAX adapter: gradient canaries around the noise step of a JAX DP-SGD loop, on pytrees.

optax is not a dependency of dpaudit (and is not installed where this was tested), so the adapter is
a pair of plain functions on gradient pytrees rather than an ``optax.GradientTransformation``; wrap
them in one if your loop is built from optax transformations::

    shapes = pytree_shapes(params)
    canaries = GradientCanaries(shapes, count=1000, sample_rate=q, clip=C, seed=0)
    inject, observe = pytree_hooks(canaries)
    ...
    summed = clipped_sum(params, batch)            # Σ_i clip_C(g_i), a pytree like params
    summed = inject(step, summed)                  # + the canaries drawn at this step
    noisy = add_noise(summed, key)                 # + N(0, σ²C²) on every leaf
    observe(step, noisy)                           # before dividing by the batch size
    params = update(params, noisy / B)

The hooks convert the arrays to NumPy, so they run outside ``jax.jit`` (jit the clipped sum and the
update, not the two calls). Leaves are named by ``jax.tree_util.keystr`` of their path. Tested with
JAX 0.10.2 on CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpaudit.errors import InputError


def _jax():
    try:
        import jax
    except ImportError:
        raise InputError("the JAX adapter needs JAX: pip install jax (or dpaudit[jax])") from None
    return jax


def pytree_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """Leaf name (``jax.tree_util.keystr`` of its path) -> shape, in ``tree_flatten`` order."""
    jax = _jax()
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}


def pytree_hooks(canaries) -> tuple[Callable[[int, Any], Any], Callable[[int, Any], None]]:
    """``(inject, observe)`` on pytrees with ``canaries.param_shapes``'s structure (see the module docstring)."""
    jax = _jax()

    def _named(tree: Any) -> tuple[dict[str, Any], Any, list[str]]:
        leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
        names = [jax.tree_util.keystr(p) for p, _ in leaves]
        return dict(zip(names, (v for _, v in leaves), strict=True)), treedef, names

    def inject(step: int, summed_clipped_grads: Any) -> Any:
        named, treedef, names = _named(summed_clipped_grads)
        out = canaries.inject(step, named)
        return jax.tree_util.tree_unflatten(treedef, [out[n] for n in names])

    def observe(step: int, noisy_grads: Any) -> None:
        canaries.observe(step, _named(noisy_grads)[0])

    canaries.meta.setdefault("framework", "jax")
    return inject, observe
