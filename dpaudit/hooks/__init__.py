"""Gradient canaries and noise checks for anyone's DP-SGD loop (see ``docs/own-training-loop.md``).

- :class:`GradientCanaries` (framework-neutral: NumPy, torch or JAX arrays): ``inject`` before the
  noise, ``observe`` after it, ``save`` for ``dpaudit audit canaries``;
- Opacus: ``canaries.attach(optimizer)`` (:mod:`dpaudit.hooks.opacus_adapter`);
- JAX: ``canaries.optax_inject()`` / ``canaries.optax_observe()`` in an ``optax.chain`` (jit-compatible), or
  :func:`dpaudit.hooks.jax_adapter.pytree_hooks` on gradient pytrees (:mod:`dpaudit.hooks.jax_adapter`).
"""

from dpaudit.hooks.core import CanaryObservations, GradientCanaries, load_observations, save_observations

__all__ = ["CanaryObservations", "GradientCanaries", "load_observations", "save_observations"]
