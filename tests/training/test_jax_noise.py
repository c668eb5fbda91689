"""The JAX backend's DP noise (:func:`dpaudit.training.jax_backend.gaussian_noise`): Threefry-2x32
written out round by round, checked bit for bit against Random123's known answers and JAX's own
primitive; the normal transform bit for bit against ``jax.random.normal``; each (step, coordinate)
its own counter; N(0, 1) per coordinate with tolerances from the math; and one compiled step for
every Poisson batch size (padded chunks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.extend.random import threefry2x32_p, threefry_2x32  # noqa: E402

from dpaudit.errors import InputError  # noqa: E402
from dpaudit.models import build_model, default_spec  # noqa: E402
from dpaudit.training import jax_backend as jb  # noqa: E402
from dpaudit.training.config import DPConfig, TrainConfig  # noqa: E402

U32 = np.uint32


def _key(seed: int = 0):
    return jax.random.key(seed, impl="threefry2x32")


# --- the generator: Threefry-2x32-20 ----------------------------------------------------------------

# Random123's known-answer vectors for threefry2x32_20 (kat_vectors: key, counter -> output).
KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize(("key", "counter", "expected"), KAT)
def test_threefry_known_answers(key, counter, expected):
    out = jb._threefry2x32(U32(key[0]), U32(key[1]), jnp.asarray([counter[0]], U32), jnp.asarray([counter[1]], U32))
    assert [int(o[0]) for o in out] == list(expected)


def test_threefry_written_out_equals_jax_primitive():
    """Bit for bit, on random keys and counters: the CPU path (written-out rounds, what the
    ``platform_dependent`` picks here) and the other platforms' path (JAX's primitive)."""
    rng = np.random.default_rng(0)
    k = rng.integers(0, 2**32, size=2, dtype=np.uint64).astype(U32)
    x0, x1 = (jnp.asarray(rng.integers(0, 2**32, size=4096, dtype=np.uint64).astype(U32)) for _ in range(2))
    ours = jax.jit(jb._threefry2x32)(k[0], k[1], x0, x1)
    theirs = threefry2x32_p.bind(jnp.asarray(k[0]), jnp.asarray(k[1]), x0, x1)
    picked = jax.jit(jb._threefry_bits)(k[0], k[1], x0, x1)
    for a, b, c in zip(ours, theirs, picked, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(c), np.asarray(b))


# --- the normal transform and the counters --------------------------------------------------------


@pytest.mark.parametrize("x64", [False, True])
def test_step_zero_single_leaf_is_jax_random_normal(x64):
    """At t = 0 the counters (0, j) are JAX's partitionable numbering: same bits as jax.random.normal."""
    with jax.enable_x64(x64), jax.threefry_partitionable(True):
        dtype = jnp.float64 if x64 else jnp.float32
        for shape in [(7, 13), (1000,), ()]:
            z = jax.jit(lambda k, s=shape: jb.gaussian_noise(k, 0, {"w": jnp.zeros(s, dtype)}))(_key(3))["w"]
            assert z.dtype == dtype and z.shape == shape
            np.testing.assert_array_equal(np.asarray(z), np.asarray(jax.random.normal(_key(3), shape, dtype)))


def test_every_step_and_coordinate_has_its_own_counter():
    """Leaf b continues leaf a's counters; the step is the counter's high word. Oracle: the bits of
    JAX's public threefry_2x32 on the counter (t, j), through the same normal transform."""
    like = {"a": jnp.zeros((3, 5), jnp.float32), "b": jnp.zeros((4,), jnp.float32)}
    key = _key(11)
    for t in (0, 1, 7):
        z = jax.jit(jb.gaussian_noise)(key, t, like)
        flat = np.concatenate([np.ravel(z["a"]), np.ravel(z["b"])])
        kd = jax.random.key_data(key)
        expected = []
        for j in range(19):
            o0, o1 = threefry_2x32(kd, jnp.asarray([t, j], U32))
            expected.append(jb._normal_from_bits(o0, o1, np.dtype(np.float32)))
        np.testing.assert_array_equal(flat, np.asarray(expected))


def test_noise_differs_between_leaves_steps_and_keys_and_repeats_exactly():
    like = {"a": jnp.zeros((64,)), "b": jnp.zeros((64,))}
    noise = jax.jit(jb.gaussian_noise)
    z = noise(_key(0), 4, like)
    np.testing.assert_array_equal(np.asarray(noise(_key(0), 4, like)["a"]), np.asarray(z["a"]))
    for other in (z["b"], noise(_key(0), 5, like)["a"], noise(_key(1), 4, like)["a"]):
        assert not np.any(np.asarray(other) == np.asarray(z["a"]))


def test_noise_is_standard_normal_per_coordinate():
    """n = 2^18 draws over two leaves and two steps. Tolerances from the math: mean(z²) has sd √(2/n)
    (0.0028), mean(z) sd 1/√n; 6 sd bounds fail with probability ~2e-9 under N(0, 1). A σ/√2 bug gives
    mean(z²) = 0.5, 180 sd away; the KS test against N(0, 1) (p-value above 1e-4) checks the shape."""
    like = {"w": jnp.zeros((256, 256), jnp.float32), "b": jnp.zeros((2**16,), jnp.float32)}
    noise = jax.jit(jb.gaussian_noise)
    z = np.concatenate([np.ravel(np.asarray(v)) for t in (0, 1) for v in noise(_key(2), t, like).values()])
    n = z.size
    assert n == 2**18
    assert abs(np.mean(z)) < 6 / np.sqrt(n)
    assert abs(np.mean(z.astype(np.float64) ** 2) - 1) < 6 * np.sqrt(2 / n)
    assert stats.kstest(z, "norm").pvalue > 1e-4
    # The same checks catch the σ/√2 mistake and a uniform in place of the normal transform.
    half = z / np.sqrt(2)
    assert abs(np.mean(half.astype(np.float64) ** 2) - 1) > 6 * np.sqrt(2 / n)
    assert stats.kstest(half, "norm").pvalue < 1e-9
    consecutive = np.corrcoef(z[: n // 2], z[n // 2 :])[0, 1]  # step 0 against step 1
    assert abs(consecutive) < 6 / np.sqrt(n // 2)


def test_a_non_threefry_key_is_refused_and_trainer_keys_are_threefry():
    with pytest.raises(InputError, match="threefry2x32"):
        jb.gaussian_noise(jax.random.key(0, impl="rbg"), 0, {"w": jnp.zeros(3)})
    for secure in (False, True):
        assert str(jax.random.key_impl(jb._jax_key(0, secure))) == "threefry2x32"


# --- one compiled program for every Poisson batch size ---------------------------------------------


class _CountingProgram(jb.StepProgram):
    traces = 0

    def _step(self, *args):
        type(self).traces += 1  # runs only when jit traces (a new shape), not on a cached call
        return super()._step(*args)


def test_poisson_batch_sizes_share_one_compiled_step_and_padding_adds_nothing():
    spec = default_spec("mlp", input_shape=(1, 4, 4), n_classes=3, hidden=(8,))
    model = build_model(spec, seed=0, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 1, 4, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (40,), generator=g)
    config = TrainConfig(algo="dpsgd", steps=1, batch_size=10, lr=1.0, dp=DPConfig(clip=0.5, noise_multiplier=0.0))
    with jax.enable_x64(True):
        X, Y = jnp.asarray(x.numpy()), jnp.asarray(y.numpy().astype(np.int32))
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        prog = _CountingProgram(apply, params, config, kind="dp", optimizer="sgd", clip=0.5, noise_key=_key(0))
        state = prog.init_state(params)
        for t, size in enumerate((3, 10, 16, 0, 7)):  # Poisson-like sizes, all within the pad of 16
            batch = np.arange(size)
            got, _ = prog.run_step(params, state, X, Y, batch, 16, t, 10.0)
            # Padded slots add exactly nothing: the step equals θ − (unpadded clipped sum)/B.
            s, _ = jb.ghost_clipped_sum(apply, params, X[batch], Y[batch], 0.5) if size else (prog.zeros, None)
            for k in params:
                np.testing.assert_allclose(
                    np.asarray(got[k]), np.asarray(params[k] - s[k] / 10.0), rtol=1e-12, atol=1e-14
                )
    assert _CountingProgram.traces == 1
