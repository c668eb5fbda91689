"""A JAX DP-SGD loop carrying dpaudit's gradient canaries on gradient pytrees.

A two-layer MLP on 1 000 standardised digits; per-example gradients by ``jax.vmap(jax.grad(...))``,
clipping to C, Poisson sampling at q, N(0, σ²C²) on every leaf of the clipped sum (jitted); the hooks
of :func:`dpaudit.hooks.jax_adapter.pytree_hooks` run between the jitted pieces (they read NumPy).
``reuse_noise`` plants the bug of a PRNG key that is never split: the same noise at every step.
optax is not needed (and not a dpaudit dependency): the update is plain SGD on the pytree.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpaudit.accounting import dpsgd_event, epsilon_for

NOISE_MULTIPLIER = 1.0
SAMPLE_RATE = 0.1
STEPS = 40
CLIP = 1.0
LR = 0.5
CANARIES = 300


def claimed_epsilon(delta: float) -> float:
    """The loop's claim at ``delta`` (RDP accounting of the Poisson-sampled Gaussian, T steps)."""
    return float(epsilon_for(dpsgd_event(noise_multiplier=NOISE_MULTIPLIER, sample_rate=SAMPLE_RATE, steps=STEPS),
                             delta, "rdp"))  # fmt: skip


def train(seed: int, out: Path | str, *, reuse_noise: bool = False, n: int = 1000) -> Path:
    """Train; write what the canaries saw to ``out``; return ``out``."""
    import jax
    import jax.numpy as jnp

    from dpaudit.data import load_dataset
    from dpaudit.hooks import GradientCanaries
    from dpaudit.hooks.jax_adapter import pytree_hooks, pytree_shapes
    from dpaudit.seeding import jax_key, numpy_rng

    ds = load_dataset("digits")
    X = ds.X[:n].reshape(n, -1).astype(np.float32)
    X = jnp.asarray((X - X.mean(0)) / (X.std(0) + 1e-6))
    y = jnp.asarray(ds.y[:n])
    k1, k2, noise_key = jax.random.split(jax_key(seed), 3)
    params = {"h": {"w": 0.1 * jax.random.normal(k1, (64, 16)), "b": jnp.zeros(16)},
              "o": {"w": 0.1 * jax.random.normal(k2, (16, 10)), "b": jnp.zeros(10)}}  # fmt: skip

    def loss(p, x, t):
        h = jax.nn.relu(x @ p["h"]["w"] + p["h"]["b"])
        return -jax.nn.log_softmax(h @ p["o"]["w"] + p["o"]["b"])[t]

    @jax.jit
    def clipped_sum(p, xb, yb, mask):
        g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(p, xb, yb)
        norms = jnp.sqrt(sum(jnp.sum(v.reshape(len(xb), -1) ** 2, 1) for v in jax.tree_util.tree_leaves(g)))
        f = mask * jnp.minimum(1.0, CLIP / jnp.maximum(norms, 1e-12))
        return jax.tree_util.tree_map(lambda v: jnp.tensordot(f, v, axes=1), g)

    @jax.jit
    def add_noise(s, key):
        leaves, treedef = jax.tree_util.tree_flatten(s)
        keys = jax.random.split(key, len(leaves))
        z = [NOISE_MULTIPLIER * CLIP * jax.random.normal(k, v.shape) for k, v in zip(keys, leaves, strict=True)]
        return jax.tree_util.tree_unflatten(treedef, [v + e for v, e in zip(leaves, z, strict=True)])

    canaries = GradientCanaries(pytree_shapes(params), count=CANARIES, sample_rate=SAMPLE_RATE, clip=CLIP,
                                seed=seed)  # dpaudit  # fmt: skip
    inject, observe = pytree_hooks(canaries)  # dpaudit
    batches = numpy_rng(seed, stream=0)
    for t in range(STEPS):
        mask = jnp.asarray(batches.random(n) < SAMPLE_RATE, dtype=jnp.float32)  # Poisson sampling (masked)
        summed = inject(t, clipped_sum(params, X, y, mask))  # dpaudit: canaries before the noise
        key = noise_key if reuse_noise else jax.random.fold_in(noise_key, t)
        noisy = add_noise(summed, key)
        observe(t, noisy)  # dpaudit: after the noise, before dividing by the batch size
        params = jax.tree_util.tree_map(lambda p, g: p - LR * g / (SAMPLE_RATE * n), params, noisy)
    return canaries.save(out)
