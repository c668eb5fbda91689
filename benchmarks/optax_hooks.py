"""Cost of the optax canary transformations in a jitted JAX DP-SGD step, against the same step without them.

    .venv/bin/python benchmarks/optax_hooks.py [--steps 200] [--rounds 3] [--canaries 300]

The step of ``examples/optax_canaries.py`` (a 1 210-parameter MLP, per-example gradients of 1 000 masked
rows, clip-and-sum, Gaussian noise, SGD), one ``jax.jit`` each: ``plain`` (no canaries) and ``hooks``
(``canaries.optax_inject()`` before the noise, ``canaries.optax_observe()`` after it: two ordered host
callbacks per step, the clipped and the noisy sum copied to the host). Rounds interleave the two, so a
change of machine load hits both alike; the table shows the median ms per step and the ratio to
``plain`` measured in the same run. Times from a loaded machine are not comparable across runs; ratios
and the per-step difference are what to read.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _step_fn(with_canaries: bool, params, X, y, canaries: int):
    import jax
    import optax

    from dpaudit.hooks import GradientCanaries
    from dpaudit.hooks.jax_adapter import pytree_shapes
    from examples.optax_canaries import CLIP, NOISE_MULTIPLIER, SAMPLE_RATE, clip_and_sum, gaussian_noise

    noise = gaussian_noise(NOISE_MULTIPLIER * CLIP, jax.random.key(1))
    if with_canaries:
        c = GradientCanaries(pytree_shapes(params), count=canaries, sample_rate=SAMPLE_RATE, clip=CLIP, seed=0)
        middle = [c.optax_inject(), noise, c.optax_observe()]
    else:
        middle = [noise]
    tx = optax.chain(clip_and_sum(CLIP), *middle, optax.scale(1.0 / (SAMPLE_RATE * len(X))), optax.sgd(0.5))

    def loss(p, x, t, m):
        h = jax.nn.relu(x @ p["h"]["w"] + p["h"]["b"])
        return -m * jax.nn.log_softmax(h @ p["o"]["w"] + p["o"]["b"])[t]

    @jax.jit
    def step(p, s, mask):
        g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0))(p, X, y, mask)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    return step, tx.init(params)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--canaries", type=int, default=300)
    a = ap.parse_args()

    import jax
    import jax.numpy as jnp

    from dpaudit.data import load_dataset

    n = 1000
    ds = load_dataset("digits")
    X = ds.X[:n].reshape(n, -1).astype(np.float32)
    X, y = jnp.asarray((X - X.mean(0)) / (X.std(0) + 1e-6)), jnp.asarray(ds.y[:n])
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"h": {"w": 0.1 * jax.random.normal(k1, (64, 16)), "b": jnp.zeros(16)},
              "o": {"w": 0.1 * jax.random.normal(k2, (16, 10)), "b": jnp.zeros(10)}}  # fmt: skip
    rng = np.random.default_rng(0)
    masks = [jnp.asarray(rng.random(n) < 0.1, dtype=jnp.float32) for _ in range(a.steps)]
    times: dict[str, list[float]] = {"plain": [], "hooks": []}
    for _ in range(a.rounds):
        for name in times:
            step, state = _step_fn(name == "hooks", params, X, y, a.canaries)
            p, state = step(params, state, masks[0])  # compile
            jax.block_until_ready(p)
            t0 = time.perf_counter()
            for m in masks[1:]:
                p, state = step(p, state, m)
            jax.block_until_ready(p)
            jax.effects_barrier()  # every host callback done
            times[name].append((time.perf_counter() - t0) / (a.steps - 1) * 1e3)
    plain, hooks = statistics.median(times["plain"]), statistics.median(times["hooks"])
    print("| step | median ms/step | ratio to plain |")
    print("|---|---|---|")
    print(f"| plain (no canaries) | {plain:.2f} | 1.00 |")
    print(f"| with optax_inject/optax_observe ({a.canaries} canaries) | {hooks:.2f} | {hooks / plain:.2f} |")
    print(f"\nhost-callback overhead: {hooks - plain:.2f} ms per step (JAX {jax.__version__}, {jax.devices()[0]})")


if __name__ == "__main__":
    main()
