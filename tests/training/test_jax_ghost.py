"""JAX ghost clipping (issue 26 item 4): ``ghost_clipped_sum`` (no per-example gradients of the
Linear/Conv2d layers) against the ``vmap(grad)`` per-example oracle ``clipped_sum``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from dpaudit.models import build_model, default_spec  # noqa: E402
from dpaudit.training import jax_backend as jb  # noqa: E402

CASES = [
    ("logreg", {}),
    ("mlp", {"hidden": (16, 8)}),
    # 8x8 input: the first conv instantiates (2T² = 8192 > p·d = 36), the second (T = 16 after the
    # pooling) takes the ghost norm (512 <= 36·32). The vmap oracle of a CNN compiles for ~30 s on one core.
    pytest.param("cnn", {"channels": (4, 32)}, marks=pytest.mark.slow),
]


def _case(kind, options, n=9, dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    model = build_model(default_spec(kind, input_shape=(1, 8, 8), n_classes=3, **options), seed=1, dtype=dtype)
    return model, torch.randn(n, 1, 8, 8, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize(("kind", "options"), CASES)
def test_ghost_matches_the_vmap_oracle(kind, options):
    model, x, y = _case(kind, options)
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        _, norms = jb.clipped_sum(apply, params, xj, yj, 1.0)
        clip = float(np.min(norms) + np.max(norms)) / 2
        assert (np.asarray(norms) < clip).any() and (np.asarray(norms) > clip).any()
        mask = jnp.asarray(np.arange(len(x)) != 3)  # one padded slot: weight exactly 0
        ref, ref_norms = jb.clipped_sum(apply, params, xj, yj, clip, mask)
        got, got_norms = jb.ghost_clipped_sum(apply, params, xj, yj, clip, mask)
        np.testing.assert_allclose(np.asarray(got_norms), np.asarray(ref_norms), rtol=1e-10)
        assert set(got) == set(ref)
        for k in ref:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(ref[k]), rtol=1e-9, atol=1e-12, err_msg=k)


def test_the_trainer_uses_ghost_for_dp_steps():
    model, x, y = _case("mlp", {"hidden": (8,)})
    from dpaudit.training.config import TrainConfig

    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        prog = jb.StepProgram(apply, params, TrainConfig(), kind="dp", optimizer="sgd", clip=0.3)
        xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        idx, mask = jb._padded(np.arange(len(x)), 16)
        got = prog.chunk(params, xj, yj, jnp.asarray(idx), jnp.asarray(mask), 0)
        ref, _ = jb.clipped_sum(apply, params, xj[idx], yj[idx], 0.3, jnp.asarray(mask))
        for k in ref:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(ref[k]), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    ("c_in", "kernel", "stride", "padding", "side"),
    [(1, 3, 1, 1, 8), (3, 3, 2, 1, 9), (2, (3, 2), (2, 1), (0, 1), 7), (4, 5, 3, 2, 11)],
)
def test_patches_by_slicing_equal_jax_patches(c_in, kernel, stride, padding, side):
    """The ghost norms' im2col (strided slices of the padded input) equals JAX's
    conv_general_dilated_patches exactly, values and order, for strides, rectangular kernels, padding."""
    m = torch.nn.Conv2d(c_in, 2, kernel, stride=stride, padding=padding)
    a = jax.random.normal(jax.random.key(0), (3, c_in, side, side))
    ref = jax.lax.conv_general_dilated_patches(
        a, m.kernel_size, m.stride, tuple((p, p) for p in m.padding), dimension_numbers=("NCHW", "OIHW", "NCHW"),
        precision=jb.PRECISION,
    )  # fmt: skip
    got = jb._patches(m, a, ref.shape[2:])
    np.testing.assert_array_equal(np.asarray(got).reshape(ref.shape), np.asarray(ref))
