"""A JAX/optax DP-SGD loop carrying dpaudit's gradient canaries as two optax transformations, jitted.

A two-layer MLP on 1 000 standardised digits. The whole step is one ``jax.jit``: per-example gradients
(``jax.vmap(jax.grad(...))``) of a Poisson-sampled batch (a mask at rate q: unsampled rows have zero
gradient), then the optax chain

    clip_and_sum(C) -> canaries.optax_inject() -> gaussian_noise(σC) -> canaries.optax_observe()
    -> scale(1 / (q·N)) -> sgd(lr)

The two dpaudit lines are marked ``# dpaudit``. ``bug="sqrt2"`` plants noise σC/√2 (as when two
micro-batches are each given σC/2: variances add, (σC/2)²·2 = (σC/√2)²). Run and audit with::

    python -m examples.optax_canaries --out DIR [--bug sqrt2]
    dpaudit audit canaries DIR --claimed-epsilon E --delta 1e-5 --noise-multiplier 1.0 --fail-on-violation
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from dpaudit.accounting import dpsgd_event, epsilon_for
from dpaudit.errors import DPAuditError
from dpaudit.fileio import check_output_dir

NOISE_MULTIPLIER = 1.0
SAMPLE_RATE = 0.1
STEPS = 40
CLIP = 1.0
LR = 0.5
CANARIES = 300
BUGS = ("sqrt2",)


def claimed_epsilon(delta: float) -> float:
    """The loop's claim at ``delta`` (RDP accounting of the Poisson-sampled Gaussian, T steps)."""
    return float(epsilon_for(dpsgd_event(noise_multiplier=NOISE_MULTIPLIER, sample_rate=SAMPLE_RATE, steps=STEPS),
                             delta, "rdp"))  # fmt: skip


def clip_and_sum(clip: float):
    """optax: per-example gradients (leading batch axis) -> the sum of the per-example gradients clipped to
    global norm ``clip`` (optax's ``per_example_global_norm_clip``; a zero row stays zero)."""
    import jax
    import optax

    def f(per_example, params):
        del params
        leaves, treedef = jax.tree_util.tree_flatten(per_example)
        return jax.tree_util.tree_unflatten(treedef, optax.per_example_global_norm_clip(leaves, clip)[0])

    return optax.stateless(f)


class NoiseState(NamedTuple):
    count: Any  # steps so far (int32): the noise key of step t is fold_in(key, t)


def gaussian_noise(std: float, key):
    """optax: + N(0, std²) on every leaf, a fresh key per step (``fold_in`` of the step count)."""
    import jax
    import jax.numpy as jnp
    import optax

    def init(params):
        del params
        return NoiseState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params=None):
        del params
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        keys = jax.random.split(jax.random.fold_in(key, state.count), len(leaves))
        noisy = [v + std * jax.random.normal(k, v.shape, v.dtype) for v, k in zip(leaves, keys, strict=True)]
        return jax.tree_util.tree_unflatten(treedef, noisy), NoiseState(count=state.count + 1)

    return optax.GradientTransformation(init, update)


def train(seed: int, out: Path | str, *, bug: str | None = None, n: int = 1000, force: bool = False) -> Path:
    """Train; write what the canaries saw to ``out`` (an existing one only with ``force``); return ``out``."""
    import jax
    import jax.numpy as jnp
    import optax

    from dpaudit.data import load_dataset
    from dpaudit.hooks import GradientCanaries
    from dpaudit.hooks.jax_adapter import pytree_shapes
    from dpaudit.seeding import jax_key, numpy_rng

    if bug not in (None, *BUGS):
        raise ValueError(f"bug must be one of {BUGS}, got {bug!r}")
    ds = load_dataset("digits")
    X = ds.X[:n].reshape(n, -1).astype(np.float32)
    X = jnp.asarray((X - X.mean(0)) / (X.std(0) + 1e-6))
    y = jnp.asarray(ds.y[:n])
    k1, k2, noise_key = jax.random.split(jax_key(seed), 3)
    params = {"h": {"w": 0.1 * jax.random.normal(k1, (64, 16)), "b": jnp.zeros(16)},
              "o": {"w": 0.1 * jax.random.normal(k2, (16, 10)), "b": jnp.zeros(10)}}  # fmt: skip

    def loss(p, x, t, m):
        h = jax.nn.relu(x @ p["h"]["w"] + p["h"]["b"])
        return -m * jax.nn.log_softmax(h @ p["o"]["w"] + p["o"]["b"])[t]  # m = 0: not in the batch

    noise_std = NOISE_MULTIPLIER * CLIP / (math.sqrt(2.0) if bug == "sqrt2" else 1.0)
    canaries = GradientCanaries(pytree_shapes(params), count=CANARIES, sample_rate=SAMPLE_RATE, clip=CLIP,
                                seed=seed)  # dpaudit  # fmt: skip
    tx = optax.chain(
        clip_and_sum(CLIP),
        canaries.optax_inject(),  # dpaudit: the canaries join the clipped sum, before the noise
        gaussian_noise(noise_std, noise_key),
        canaries.optax_observe(),  # dpaudit: the noisy sum, before dividing by the batch size
        optax.scale(1.0 / (SAMPLE_RATE * n)),
        optax.sgd(LR),
    )
    state = tx.init(params)

    @jax.jit
    def step(p, s, mask):
        g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0))(p, X, y, mask)
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s

    batches = numpy_rng(seed, stream=0)
    for _ in range(STEPS):
        mask = jnp.asarray(batches.random(n) < SAMPLE_RATE, dtype=jnp.float32)  # Poisson sampling at rate q
        params, state = step(params, state, mask)
    return canaries.save(out, force=force)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bug", choices=BUGS)
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out")
    args = parser.parse_args(argv)
    try:
        check_output_dir(args.out, force=args.force)  # before training, not after it
        out = train(args.seed, args.out, bug=args.bug, force=args.force)
    except DPAuditError as e:
        parser.exit(2, f"error: {e}\n")
    print(out, f"(claimed epsilon at delta 1e-5: {claimed_epsilon(1e-5):.6g})")


if __name__ == "__main__":
    main()
