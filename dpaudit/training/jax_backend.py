"""The JAX backend: SGD, DP-SGD and DP-SGD-JL for an ``nn.Sequential`` of the layers in :data:`SUPPORTED`
(the zoo's logreg, mlp and cnn, or a user's own), or any module whose ``torch.fx`` graph calls those layers
and the torch ops of :data:`FX_OPS` (residual nets, transformer blocks, tied weights), compiled with ``jit``.

Imported only for ``PerfConfig.backend == "jax"`` (``dpaudit train --backend jax``); JAX is an
optional extra (``pip install 'dpaudit[jax]'``). The mechanism is the torch trainers' one, so the
privacy claim is computed by the same code (:func:`dpaudit.training.dpsgd.privacy_claim` through
the registered trainer's ``setting_for``), and the backend is a performance setting only:

* The model is the torch module (built from the spec and ``config.seed`` by the caller; anything
  its layer list or fx graph would not compute as torch does is refused in one line, :func:`jax_forward`,
  and its logits are checked against torch's before training, :func:`check_same_logits`).
  Its parameters become a dict ``{torch parameter name: jax array}`` in torch's layout (linear
  weights (out, in), conv kernels OIHW; a tied parameter once, under its first name), the forward pass is
  re-written in ``jax.numpy`` / ``jax.lax`` from the module's layer list or fx graph, and the trained arrays
  are copied back into the same module, so the checkpoint is the torch one (safetensors, same names) and
  loads into the torch model unchanged.
* Per-example gradients by ``vmap(grad(ℓ))`` under ``jit`` (the DP-SGD-in-JAX recipe of the
  seed lecture "private non-convex learning"; Subramani et al. 2021, arXiv:2010.09063), clipped
  to g_i / max(1, ‖g_i‖/C) (Abadi et al. 2016, arXiv:1607.00133, Alg. 1), summed, N(0, σ²C²I)
  added once to the sum, divided by the expected batch size B, then an SGD or Adam step.
* DP-SGD-JL (the JL projections paper, Algorithms 1-2): r directions v_j ~ N(0, I_d) per step,
  P_ij = ⟨∇ℓ_i, v_j⟩ for the whole batch by one forward-mode ``jax.jvp`` of the vector of
  per-example losses per direction, M_i = sqrt(mean_j P_ij²) (E[M_i²] = ‖∇ℓ_i‖²),
  w_i = min(1, C/M_i), one gradient of Σ_i w_i ℓ_i, noise and division as in DP-SGD.
* Batches are drawn by the torch trainers' own samplers (:func:`~dpaudit.training.dpsgd.poisson_sampler`,
  :func:`~dpaudit.training.dpsgd.shuffle_sampler`, the non-private epoch permutation) from the
  same seeds, so the two backends see identical batches; the noise is Threefry-2x32 in counter
  mode under a key from ``config.seed + 2`` (counter (step, coordinate), :func:`gaussian_noise`),
  the JL directions come from ``jax.random`` keys from ``config.seed + 3`` folded with the step, the dropout
  masks from keys from ``config.seed + 4`` folded with the step and the record (:meth:`StepProgram.record_keys`).

Padding and privacy: a Poisson batch has a random size, and ``jit`` compiles one program per
shape. Every batch is therefore cut into chunks of a fixed size P (``PerfConfig.max_physical_batch``,
default :func:`pad_size`), each chunk padded with masked-out slots (weight exactly 0) to P. A batch
larger than P is processed as several chunks whose clipped sums are added, never truncated, and
the noise is added once to the total: the released quantity is exactly Σ_{i∈batch} clip_C(g_i) +
N(0, σ²C²I), whatever P is. P depends only on the public (B, q), never on the data, so it changes
neither the mechanism nor the claim, only the shape of the compiled program (and how often a
second chunk runs). Run time is not covered by the claim, as with the torch trainer.
"""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import math
import operator
import re
import secrets
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial, wraps
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from dpaudit.errors import InputError
from dpaudit.models import rounding_tolerance
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.algorithms import get_trainer
from dpaudit.training.base import Trainer, TrainOutcome, trainable_parameters
from dpaudit.training.clipping import exact_matmuls, hooked_parameters
from dpaudit.training.config import PerfConfig, TrainConfig

JAX_INSTALL = "pip install 'dpaudit[jax]' (or: pip install jax jaxlib)"
# The oldest JAX this backend runs on: 0.8.0 made ``jax.enable_x64`` a top-level context manager
# (``JaxTrainer.fit``); an older JAX would get through the import and fail deep inside training.
# The same version is the jax extra's floor in pyproject.toml (tests/test_dependency_floors.py).
JAX_MIN = (0, 8, 0)


def release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: "0.12.0.1" -> (0, 12, 0, 1), "0.9.0.dev2" -> (0, 9, 0)."""
    return tuple(int(part) for part in re.match(r"\d+(?:\.\d+)*", version).group().split("."))


def check_jax_version(version: str) -> None:
    """Refuse a JAX older than :data:`JAX_MIN` with one line (an :class:`InputError`)."""
    if release(version) < JAX_MIN:
        need = ".".join(map(str, JAX_MIN))
        raise InputError(f"--backend jax needs JAX >= {need}, found {version}: pip install -U 'dpaudit[jax]'")


try:
    import jax

    check_jax_version(jax.__version__)  # before the submodules, which an older JAX may not have
    import jax.extend.random
    import jax.numpy as jnp
    from jax import lax
except ImportError:  # pragma: no cover - exercised only without the extra
    raise InputError(f"--backend jax needs JAX, which is not installed: {JAX_INSTALL}") from None

ALGOS = ("sgd", "adam", "dpsgd", "dpadam", "dpsgd-jl", "dpadam-jl")
# On GPUs JAX's default float32 matmul/conv precision is TF32 (10-bit mantissa): per-example norms
# would be off by ~1e-3 relative, so a "clipped" gradient could exceed C by that much (sensitivity
# under-stated) and the torch/JAX agreement fails. HIGHEST keeps true float32 products everywhere.
PRECISION = lax.Precision.HIGHEST
Params = dict[str, Any]  # {torch parameter name: jax array in torch's layout}
Apply = Callable[[Params, Any], Any]  # (params, x of shape (n, *input_shape)) -> logits (n, classes)


# ------------------------------------------------------------------------------------ the model


def _affine_map(x, w, b):
    # torch.nn.functional.linear: x Wᵀ + b over the last axis of x (any leading axes), W (out, in); full float32
    # precision (see PRECISION); no b for bias=None
    out = jnp.matmul(x, w.T, precision=PRECISION)
    return out if b is None else out + b


def _linear(name: str) -> Callable:
    return lambda p, x: _sub_tap(name, x, _affine_map(x, p[f"{name}.weight"], p.get(f"{name}.bias")))


# While FxModel runs with a tap (fx_ghost_clipped_sum), _SUB_TAP holds [tap, the graph node running]: the linear maps
# inside a node's layer (a MultiheadAttention's in_proj thirds and out_proj, a transformer layer's linear1/linear2)
# pass their input and output to tap("node:path", input, output), path the parameters' module path
_SUB_TAP: contextvars.ContextVar = contextvars.ContextVar("sub_tap", default=None)


@contextmanager
def _sub_taps(state):
    token = _SUB_TAP.set(state)
    try:
        yield
    finally:
        _SUB_TAP.reset(token)


def _sub_tap(path: str, a, out):
    state = _SUB_TAP.get()
    return out if state is None else state[0](f"{state[1]}:{path}", a, out)


def _conv_pads(m: nn.Conv2d) -> tuple[tuple[int, int], ...]:
    """The zero padding (before, after) of each spatial axis as torch applies it, also for
    ``padding="valid"`` and ``"same"`` (an even kernel pads one more after: torch's own
    ``_reversed_padding_repeated_twice``, stored last axis first); Conv1d's one axis, Conv2d's height and width."""
    v = [int(a) for a in m._reversed_padding_repeated_twice]
    return tuple((v[i], v[i + 1]) for i in range(len(v) - 2, -1, -2))


_CONV_AXES = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW")}  # lax's names of torch's layouts


def _conv(name: str, m: nn.Conv1d | nn.Conv2d) -> Callable:
    """nn.Conv1d / nn.Conv2d (cross-correlation, kernel (C_out, C_in/groups, *k)): ``lax.conv_general_dilated`` with
    the stride, dilation (rhs_dilation: kernel taps ``dilation`` apart) and groups (feature_group_count) of torch's
    documentation of Conv1d/Conv2d; padding_mode reflect/replicate/circular pads by F.pad first, as torch's
    ``_conv_forward``. An unbatched input (C, *spatial) runs as a batch of one. Ghost clipping taps a Conv2d only
    without groups, dilation or a padding mode (:func:`_ghostable`); the others' per-example gradients are vmap's."""
    nd = 1 if isinstance(m, nn.Conv1d) else 2
    pad = _conv_pads(m)
    stride, dilation = tuple(int(s) for s in m.stride), tuple(int(d) for d in m.dilation)

    def conv(x, w):
        if m.padding_mode != "zeros":
            x = _f_pad(x, m._reversed_padding_repeated_twice, m.padding_mode)
        return lax.conv_general_dilated(
            x, w, stride, pad if m.padding_mode == "zeros" else [(0, 0)] * nd,
            rhs_dilation=dilation, feature_group_count=m.groups, dimension_numbers=_CONV_AXES[nd], precision=PRECISION,
        )  # fmt: skip

    return _conv_layer(name, nd, conv)


def _conv_layer(name: str, nd: int, conv: Callable) -> Callable:
    """A convolution layer's f(p, x) from ``conv(x, weight)`` on a batched input: an unbatched input (C, *spatial)
    runs as a batch of one, and the bias (one per output channel) is added, as torch's Conv/ConvTranspose."""

    def f(p, x):
        one = x.ndim == nd + 1
        out = conv(x[None] if one else x, p[f"{name}.weight"])
        b = p.get(f"{name}.bias")
        out = out if b is None else out + b.reshape(-1, *(1,) * nd)
        return out[0] if one else out

    return f


def _ghostable(m: nn.Module) -> bool:
    """Ghost clipping (ghost_clipped_sum, fx_ghost_clipped_sum) computes ``m``'s per-example norms: a Conv2d's im2col
    patches (_patches) know neither groups, dilation nor a padding mode; such a Conv2d is left to vmap."""
    return not isinstance(m, nn.Conv2d) or (m.groups == 1 and m.dilation == (1, 1) and m.padding_mode == "zeros")


def _conv_transpose(name: str, m: nn.ConvTranspose1d | nn.ConvTranspose2d) -> Callable:
    """nn.ConvTranspose1d / 2d (the gradient of a convolution with respect to its input; torch's documentation: an
    output of (L − 1)·stride − 2·padding + dilation·(k − 1) + output_padding + 1 per axis): the convolution of the
    input dilated by ``stride`` (lax's lhs_dilation) with the spatially flipped kernel, its in/out channels swapped
    per group (torch's kernel is (C_in, C_out/groups, *k)), padded by dilation·(k − 1) − padding on both sides and
    output_padding more after (Dumoulin & Visin 2016, arXiv:1603.07285, §4.6: the transposed convolution as a direct
    one). forward(input, output_size) is not supported (a module call with two inputs)."""
    nd = 1 if isinstance(m, nn.ConvTranspose1d) else 2
    k, s, p, d = (tuple(int(v) for v in t) for t in (m.kernel_size, m.stride, m.padding, m.dilation))
    pads = [
        (di * (ki - 1) - pi, di * (ki - 1) - pi + int(op))
        for ki, pi, di, op in zip(k, p, d, m.output_padding, strict=True)
    ]
    g = m.groups

    def conv(x, w):  # w (C_in, C_out/g, *k) -> (C_out, C_in/g, *k), flipped
        c_in, c_out_g = w.shape[:2]
        w = w.reshape(g, c_in // g, c_out_g, *k).swapaxes(1, 2).reshape(g * c_out_g, c_in // g, *k)
        w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
        return lax.conv_general_dilated(
            x, w, (1,) * nd, pads, lhs_dilation=s, rhs_dilation=d, feature_group_count=g,
            dimension_numbers=_CONV_AXES[nd], precision=PRECISION,
        )  # fmt: skip

    return _conv_layer(name, nd, conv)


def _standardize(z, axes, eps: float):
    # (z − mean) / √(var + eps) over ``axes``, the biased variance (torch's group_norm and layer_norm kernels)
    mu = z.mean(axes, keepdims=True)
    var = jnp.square(z - mu).mean(axes, keepdims=True)
    return (z - mu) / jnp.sqrt(var + eps)


def _normalize(m: nn.GroupNorm | nn.LayerNorm, x):
    """x̂ of a GroupNorm (Wu & He 2018, arXiv:1803.08494, Eq. 1: per example and group of channels) or a LayerNorm
    (Ba et al. 2016, arXiv:1607.06450, Eq. 4: per example and position, over the last len(normalized_shape) axes)."""
    if isinstance(m, nn.GroupNorm):
        return _standardize(x.reshape(x.shape[0], m.num_groups, -1), -1, m.eps).reshape(x.shape)
    return _standardize(x, tuple(range(x.ndim - len(m.normalized_shape), x.ndim)), m.eps)


def _norm_param_axes(m: nn.GroupNorm | nn.LayerNorm, ndim: int) -> tuple[int, ...]:
    # the axes of x that γ and β are indexed by: the channel axis of a GroupNorm, the normalised ones of a LayerNorm
    return (1,) if isinstance(m, nn.GroupNorm) else tuple(range(ndim - len(m.normalized_shape), ndim))


def _norm_affine(name: str, m: nn.GroupNorm | nn.LayerNorm, p, z):
    # γ ⊙ x̂ + β, broadcast along the parameter axes; affine=False / elementwise_affine=False: x̂; bias=False: no β
    axes = _norm_param_axes(m, z.ndim)
    shape = tuple(z.shape[d] if d in axes else 1 for d in range(z.ndim))
    w, b = p.get(f"{name}.weight"), p.get(f"{name}.bias")
    z = z if w is None else z * w.reshape(shape)
    return z if b is None else z + b.reshape(shape)


def _norm(name: str, m: nn.GroupNorm | nn.LayerNorm) -> Callable:
    return lambda p, x: _norm_affine(name, m, p, _normalize(m, x))


def _instance_standardize(x, weight, bias, eps: float, nd: int):
    # instance normalisation (Ulyanov et al. 2016, arXiv:1607.08022, Eq. 2): each example's channel standardised over
    # its last nd (spatial) axes by its own mean and biased variance (torch's instance_norm: batch_norm of the
    # (1, N·C, ...) reshape in training mode), then γ_c·x̂ + β_c. Per example, so per-example clipping bounds it
    shape = (-1,) + (1,) * nd
    z = _standardize(x, tuple(range(x.ndim - nd, x.ndim)), eps)
    z = z if weight is None else z * weight.reshape(shape)
    return z if bias is None else z + bias.reshape(shape)


_INSTANCE_NORMS = {nn.InstanceNorm1d: 1, nn.InstanceNorm2d: 2, nn.InstanceNorm3d: 3}  # the spatial axes


def _instance_norm(name: str, m: nn.modules.instancenorm._InstanceNorm) -> Callable:
    """nn.InstanceNorm1d/2d/3d with track_running_stats=False (torch's default): the input's statistics in training
    and eval mode alike. With True torch also updates running_mean/running_var from every training batch (in place,
    outside the gradient) and normalises by them in eval mode, which the JAX graph does not (its trained model would
    differ from torch's); private training refuses it earlier (models.check_private_layers: the buffers average the
    batches without noise)."""
    nd = _INSTANCE_NORMS[type(m)]
    if m.track_running_stats:
        raise _unsupported(
            f"layer {name} ({type(m).__name__}) with track_running_stats=True: torch updates its running mean and "
            "variance from each training batch and normalises by them in eval mode, which the JAX backend does not"
        )

    def f(p, x):
        if x.ndim not in (nd + 1, nd + 2):
            raise InputError(f"{type(m).__name__} takes a {nd + 1}-D or {nd + 2}-D input, not {x.ndim}-D")
        if m.affine and x.shape[-nd - 1] != m.num_features:
            raise InputError(f"{type(m).__name__}({m.num_features}) given {x.shape[-nd - 1]} channels (torch raises)")
        return _instance_standardize(x, p.get(f"{name}.weight"), p.get(f"{name}.bias"), m.eps, nd)

    return f


def _f_instance_norm(x, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                     momentum=0.1, eps=1e-5):  # fmt: skip
    # F.instance_norm of a batched (N, C, ...) input by its own statistics (running ones: see _instance_norm)
    if running_mean is not None or running_var is not None or not use_input_stats:
        raise InputError("instance_norm with running statistics is not supported (use_input_stats without them)")
    if x.ndim < 3:
        raise InputError(f"instance_norm takes an (N, C, ...) input of 3 or more axes, not {x.ndim}")
    return _instance_standardize(x, weight, bias, eps, x.ndim - 2)


def _tuple(v, nd: int) -> tuple:
    # torch's _single / _pair: one value for every spatial axis, or one per axis
    return (v,) * nd if isinstance(v, (int, float)) or v is None else tuple(v)


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    # a pooling's output length (torch's pooling_output_shape, aten/src/ATen/native/Pool.h): ⌊ or ⌈(size + 2p −
    # d(k − 1) − 1)/s⌉ + 1, and in ceil mode one less where the last window would start in the right padding
    # ((out − 1)·s ≥ size + p: torch's "ensure that the last pooling starts inside the image")
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    return out - 1 if ceil_mode and (out - 1) * s >= size + p else out


def _pool(x, what: str, nd: int, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, mean=False,
          count_include_pad=True, divisor_override=None):  # fmt: skip
    """Max or average pooling over the last ``nd`` axes of a batched or unbatched input (torch's MaxPool1d/2d,
    AvgPool1d/2d and F.max_pool1d/2d, F.avg_pool1d/2d; a 1-D pool is torch's 2-D kernel on one row): windows of
    ``kernel_size`` every ``stride`` (the kernel by default), taps ``dilation`` apart, ``padding`` on both sides,
    :func:`_pool_out` windows per axis (ceil mode keeps a last window overhanging the right edge).
    Max: padding and overhang are −inf; the gradient goes to a window's FIRST maximum in row-major order (torch's CPU
    kernels keep the first index with val > maxval), read at argmax as for max(dim); a value that is the maximum of
    several windows gets the sum, as torch's max_pool backward.
    Average (torch's cpu_avg_pool, aten/src/ATen/native/cpu/AvgPoolKernel.cpp): the window's sum over the input (zero
    padding adds 0) divided by divisor_override when set, else with count_include_pad by the window's size clipped
    to the padded input (ceil mode's overhang past the padding not counted), else by its number of input values.
    Linear in x: the gradient is each value's share, as torch's backward."""
    if x.ndim not in (nd + 1, nd + 2):
        raise InputError(f"{what} on a {x.ndim}-D input is not supported (a {nd + 2}-D or {nd + 1}-D input runs)")
    k, p, d = _tuple(kernel_size, nd), _tuple(padding, nd), _tuple(dilation, nd)
    s = _tuple(stride, nd) if stride not in (None, ()) and stride != [] else k
    sizes = x.shape[-nd:]
    if any(pi > ((ki - 1) * di + 1) // 2 for ki, pi, di in zip(k, p, d, strict=True)):  # torch raises
        raise InputError(f"{what}: padding {p} is more than half the kernel's extent (torch raises)")
    out = [_pool_out(n, *a, ceil_mode) for n, *a in zip(sizes, k, s, p, d, strict=True)]
    if min(out) < 1:
        raise InputError(f"{what}: the input's {tuple(sizes)} is smaller than the kernel (torch raises)")
    # zero (−inf) padding before, and after as far as the last window reaches (ceil mode's overhang)
    after = [max(pi, (o - 1) * si + di * (ki - 1) + 1 - n - pi)
             for n, o, ki, si, pi, di in zip(sizes, out, k, s, p, d, strict=True)]  # fmt: skip
    pads = [(0, 0)] * (x.ndim - nd) + list(zip(p, after, strict=True))
    xp = jnp.pad(x, pads, constant_values=0.0 if mean else -jnp.inf)
    windows = _window_slices(xp, k, s, out, d)
    if not mean:
        return _first_extreme(jnp.stack(windows, axis=-1))
    total = sum(windows[1:], windows[0])
    if divisor_override:
        return total / divisor_override
    divisor = np.ones(())
    for n, o, ki, si, pi in zip(sizes, out, k, s, p, strict=True):  # a window's size is its axes' lengths' product
        start = np.arange(o) * si - pi
        end = np.minimum(start + ki, n + pi)
        count = end - start if count_include_pad else np.minimum(end, n) - np.maximum(start, 0)
        divisor = np.multiply.outer(divisor, np.maximum(count, 1))  # a window of padding only sums to 0, as torch's
    return total / jnp.asarray(divisor, x.dtype)


def _pool_module(name: str, m: nn.Module) -> Callable:
    # nn.MaxPool1d/2d, nn.AvgPool1d/2d with their options (_pool); return_indices (MaxUnpool's) is not supported
    nd = 1 if isinstance(m, (nn.MaxPool1d, nn.AvgPool1d)) else 2
    what = f"layer {name} ({type(m).__name__})"
    if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)):
        if m.return_indices:
            raise _unsupported(f"{what} has return_indices")
        return lambda p, x: _pool(x, what, nd, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)
    return lambda p, x: _pool(x, what, nd, m.kernel_size, m.stride, m.padding, 1, m.ceil_mode, True,
                              m.count_include_pad, getattr(m, "divisor_override", None))  # fmt: skip


def _f_max_pool(nd: int):
    def f(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        if return_indices:
            raise InputError(f"max_pool{nd}d with return_indices is not supported")
        return _pool(x, f"max_pool{nd}d", nd, kernel_size, stride, padding, dilation, ceil_mode)

    return f


def _f_avg_pool(nd: int):
    def f(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        return _pool(x, f"avg_pool{nd}d", nd, kernel_size, stride, padding, 1, ceil_mode, True, count_include_pad,
                     divisor_override)  # fmt: skip

    return f


def _adaptive_pool(x, what: str, nd: int, output_size, mean: bool):
    """torch's adaptive average / max pooling over the last ``nd`` axes (aten/src/ATen/native/AdaptivePooling.h):
    output i of o along an axis of n reads [⌊i·n/o⌋, ⌈(i + 1)·n/o⌉) (windows may overlap or differ in size); an
    output size None keeps the axis. Average: per axis a (o, n) matrix of 1/length on each window (a window's mean
    is its axes' means in turn); max: each window's FIRST maximum in row-major order, as torch's CPU kernel."""
    if x.ndim not in (nd + 1, nd + 2):
        raise InputError(f"{what} on a {x.ndim}-D input is not supported (a {nd + 2}-D or {nd + 1}-D input runs)")
    sizes = x.shape[-nd:]
    out = [n if o is None else int(o) for n, o in zip(sizes, _tuple(output_size, nd), strict=True)]
    if min(out) < 1:
        raise InputError(f"{what}: output size {tuple(out)} (torch raises)")
    bounds = [[(i * n // o, -(-(i + 1) * n // o)) for i in range(o)] for n, o in zip(sizes, out, strict=True)]
    lead = x.ndim - nd
    if mean:
        for axis, (n, b) in enumerate(zip(sizes, bounds, strict=True), start=lead):
            a = np.zeros((len(b), n))
            for i, (lo, hi) in enumerate(b):
                a[i, lo:hi] = 1.0 / (hi - lo)
            x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(a.T, x.dtype), axes=([axis], [0]), precision=PRECISION),
                             -1, axis)  # fmt: skip
        return x
    rows = []
    for corner in itertools.product(*bounds):
        w = x[(Ellipsis, *(slice(lo, hi) for lo, hi in corner))].reshape(*x.shape[:lead], -1)
        rows.append(_first_extreme(w))
    return jnp.stack(rows, axis=-1).reshape(*x.shape[:lead], *out)


def _adaptive_module(name: str, m: nn.Module) -> Callable:
    # nn.AdaptiveAvgPool1d/2d, nn.AdaptiveMaxPool1d/2d (return_indices not supported)
    nd = 1 if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)) else 2
    mean = isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d))
    what = f"layer {name} ({type(m).__name__})"
    if getattr(m, "return_indices", False):
        raise _unsupported(f"{what} has return_indices")
    return lambda p, x: _adaptive_pool(x, what, nd, m.output_size, mean)


def _f_adaptive(nd: int, mean: bool):
    def f(x, output_size, return_indices=False):
        if return_indices:
            raise InputError(f"adaptive_max_pool{nd}d with return_indices is not supported")
        return _adaptive_pool(x, f"adaptive_{'avg' if mean else 'max'}_pool{nd}d", nd, output_size, mean)

    return f


def _flatten(x, start_dim: int, end_dim: int):
    # torch.flatten: axes start_dim..end_dim (negative counted from the end) merged into one, row-major
    s, e = start_dim % max(x.ndim, 1), end_dim % max(x.ndim, 1)
    return x.reshape((*x.shape[:s], math.prod(x.shape[s : e + 1]), *x.shape[e + 1 :])) if x.ndim else x.reshape(1)


# While check_embedding_ids traces the forward: (what, rows, ids) of every embedding lookup, else None.
_ID_READS: list | None = None


def _lookup(w, ids, padding_idx: int | None, what: str):
    """Rows W[ids] (nn.Embedding, F.embedding). torch's embedding backward leaves the padding_idx row's gradient 0;
    an id outside [0, rows) is an IndexError in torch: here NaN (jnp.take would wrap a negative id to a row from
    the end), and :func:`check_embedding_ids` refuses such data before training."""
    i = ids.astype(jnp.int32)
    if _ID_READS is not None:
        _ID_READS.append((what, w.shape[0], i))
    if padding_idx is not None:
        w = w.at[padding_idx].set(lax.stop_gradient(w[padding_idx]))
    i = jnp.where((i < 0) | (i >= w.shape[0]), w.shape[0], i)
    return jnp.take(w, i, axis=0, mode="fill", fill_value=jnp.nan)


def _embedding(name: str, m: nn.Embedding) -> Callable:
    if m.max_norm is not None or m.scale_grad_by_freq or m.sparse:
        raise _unsupported(f"layer {name} (Embedding) has max_norm, scale_grad_by_freq or sparse")
    return lambda p, x: _lookup(p[f"{name}.weight"], x, m.padding_idx, f"layer {name} (Embedding)")


def check_embedding_ids(apply: Apply, params: Params, X, chunk: int = 4096) -> None:
    """Refuse, in one line, training records that give an embedding an id outside its table (torch raises
    IndexError there; the JAX lookup would give NaN logits and NaN parameters). The forward pass is traced once
    with every lookup recording its ids; XLA keeps only what computes them, run on all of ``X`` in chunks (the
    last padded with copies of record 0). Nothing to do for a model without an embedding."""
    reads: list = []

    def ranges(p, x):
        global _ID_READS
        reads.clear()
        _ID_READS = reads
        try:
            apply(p, x)
        finally:
            _ID_READS = None
        return [(jnp.min(i), jnp.max(i)) for _, _, i in reads]

    if not jax.eval_shape(ranges, params, X[:1]):
        return
    run, n = jax.jit(ranges), X.shape[0]
    size = min(n, chunk)
    lo = hi = None
    for start in range(0, n, size):
        part = X[start : start + size]
        if part.shape[0] < size:
            part = jnp.concatenate([part, jnp.broadcast_to(X[:1], (size - part.shape[0], *X.shape[1:]))])
        got = np.array(jax.device_get(run(params, part)), dtype=np.float64).reshape(-1, 2)
        lo = got[:, 0] if lo is None else np.minimum(lo, got[:, 0])
        hi = got[:, 1] if hi is None else np.maximum(hi, got[:, 1])
    for (what, rows, _), a, b in zip(reads, lo, hi, strict=True):
        if a < 0 or b >= rows:
            bad = int(a) if a < 0 else int(b)
            raise InputError(
                f"{what} is given id {bad} by the training data, outside its {rows} rows (ids 0..{rows - 1}; "
                "torch raises IndexError): make the table as large as the data's vocabulary"
            )


def _hardswish(x):
    # torch.nn.Hardswish (Howard et al. 2019, arXiv:1905.02244, Eq. 2): x·relu6(x + 3)/6, i.e. 0 for x ≤ −3, x(x + 3)/6
    # between, x from 3; its gradient as torch's hardswish_backward (aten/src/ATen/native/cpu/Activation.cpp, checked
    # against torch at ±3): 0 for x ≤ −3, x/3 + 1/2 for −3 < x < 3, 1 for x ≥ 3
    return jnp.where(x <= -3, jnp.zeros_like(x), jnp.where(x < 3, x * (x + 3) / 6, x))


def _hardtanh(x, min_val: float = -1.0, max_val: float = 1.0):
    # torch.nn.Hardtanh (ReLU6 = Hardtanh(0, 6)): x clipped to [min_val, max_val]; its gradient 1 strictly inside,
    # 0 at the bounds and outside, as torch's hardtanh_backward (checked against torch at 0 and 6)
    inside = (x > min_val) & (x < max_val)
    return jnp.where(inside, x, jnp.where(x <= min_val, jnp.full_like(x, min_val), jnp.full_like(x, max_val)))


def _leaky_relu(x, negative_slope: float = 0.01):
    # torch.nn.LeakyReLU: x for x > 0, slope·x otherwise; gradient slope at 0, as torch's backward (x > 0 ? 1 : slope)
    return jnp.where(x > 0, x, negative_slope * x)


def _softplus(x, beta: float = 1.0, threshold: float = 20.0):
    # torch.nn.Softplus / F.softplus (torch's documentation: log(1 + exp(βx))/β, "reverts to the linear function when
    # input × β > threshold"), as torch's softplus kernel (aten/src/ATen/native/cpu/Activation.cpp): βx > threshold ?
    # x : log1p(exp(βx))/β, and its softplus_backward: βx > threshold ? g : g·z/(z + 1), z = exp(βx). The exp of the
    # branch not taken is fed 0 (the safe-where trick: no inf or NaN enters the backward of that branch)
    big = x * beta > threshold
    return jnp.where(big, x, jnp.log1p(jnp.exp(jnp.where(big, 0.0, x * beta))) / beta)


def _mish(x):
    # torch.nn.Mish (Misra 2019, arXiv:1908.08681, Eq. 1): x·tanh(softplus(x)), torch's kernel x·tanh(log1p(exp(x)))
    # without softplus's threshold; its gradient tanh(sp) + x·σ(x)·(1 − tanh²(sp)) is this function's derivative
    # (jax.nn.softplus, log(1 + eˣ) computed without overflow, has derivative σ(x))
    return x * jnp.tanh(jax.nn.softplus(x))


# torch's hardsigmoid_backward multiplies by the float literal 1.0f / 6.0f (aten/src/ATen/native/cpu/Activation.cpp,
# `one_sixth(1.0f / 6.0f)`), also in float64: 0.1666666716337204, 5e-9 relative off 1/6 (found by the float64
# per-example gradient check against torch; forward divides by 6 exactly)
_ONE_SIXTH_F32 = float(np.float32(1.0) / np.float32(6.0))


def _hardsigmoid(x):
    # torch.nn.Hardsigmoid: 0 for x ≤ −3, x/6 + 1/2 between, 1 from 3; its gradient torch's hardsigmoid_backward:
    # float32(1/6) strictly inside (−3, 3), 0 at ±3 and outside (the value is x/6 + 1/2, its slope _ONE_SIXTH_F32)
    inner = lax.stop_gradient(x / 6 + 0.5 - _ONE_SIXTH_F32 * x) + _ONE_SIXTH_F32 * x
    return jnp.where((x > -3) & (x < 3), inner, jnp.where(x <= -3, jnp.zeros_like(x), jnp.ones_like(x)))


def _glu(x, dim: int = -1):
    # torch.nn.GLU / F.glu (Dauphin et al. 2017, arXiv:1612.08083, Eq. 1): a ⊗ σ(b), a and b the halves of x along dim
    if x.shape[dim] % 2:
        raise InputError(f"glu halves an axis of odd size {x.shape[dim]} (torch raises)")
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


def _prelu(name: str) -> Callable:
    # torch.nn.PReLU: x for x > 0, a·x otherwise, a (num_parameters,) along the channel axis 1 (one a for all); the
    # gradients x > 0 ? g : a·g and, for a, x > 0 ? 0 : x·g (torch's prelu backward; 0 counts as negative)
    def f(p, x):
        a = p[f"{name}.weight"]
        a = a.reshape(-1, *(1,) * (x.ndim - 2)) if x.ndim >= 2 and a.size > 1 else a.reshape(())
        return jnp.where(x > 0, x, a * x)

    return f


def _activation(m: nn.Module) -> Callable | None:
    """The elementwise function of a torch activation module, with its options; None if not one of these."""
    if type(m) is nn.Tanh:
        return jnp.tanh
    if type(m) is nn.ReLU:
        return jax.nn.relu
    if type(m) is nn.GELU:
        # approximate="none": x Φ(x); "tanh": 0.5 x (1 + tanh(√(2/π)(x + 0.044715 x³))) (Hendrycks & Gimpel 2016,
        # arXiv:1606.08415, §2), which jax.nn.gelu(approximate=True) computes
        return partial(jax.nn.gelu, approximate=m.approximate == "tanh")
    if type(m) is nn.ELU:
        return partial(jax.nn.elu, alpha=m.alpha)  # x for x > 0, α(eˣ − 1) otherwise (torch.nn.ELU)
    if type(m) is nn.LeakyReLU:
        return partial(_leaky_relu, negative_slope=m.negative_slope)
    if type(m) is nn.Sigmoid:
        return jax.nn.sigmoid
    if type(m) is nn.SiLU:
        return jax.nn.silu  # x·σ(x) (Elfwing et al. 2018, arXiv:1702.03118, Eq. 4; Hendrycks & Gimpel's SiLU)
    if type(m) is nn.Hardswish:
        return _hardswish
    if type(m) in (nn.Hardtanh, nn.ReLU6):
        return partial(_hardtanh, min_val=m.min_val, max_val=m.max_val)
    if type(m) is nn.Softplus:
        return partial(_softplus, beta=m.beta, threshold=m.threshold)
    if type(m) is nn.Mish:
        return _mish
    if type(m) is nn.SELU:
        return jax.nn.selu  # λ(x for x > 0, α(eˣ − 1) otherwise), torch's α and λ (Klambauer et al. 2017, Eq. 2)
    if type(m) is nn.CELU:
        return partial(jax.nn.celu, alpha=m.alpha)  # x for x > 0, α(e^(x/α) − 1) otherwise (Barron 2017, Eq. 4)
    if type(m) is nn.Softsign:
        return lambda x: x / (1 + _abs(x))
    if type(m) is nn.LogSigmoid:
        return jax.nn.log_sigmoid  # −softplus(−x), torch's log_sigmoid
    if type(m) is nn.Hardsigmoid:
        return _hardsigmoid
    if type(m) is nn.Tanhshrink:
        return lambda x: x - jnp.tanh(x)
    if type(m) is nn.GLU:
        return partial(_glu, dim=m.dim)
    if type(m) is nn.Softmin:
        if m.dim is None:
            raise InputError("Softmin without dim (torch's deprecated implicit choice) is not supported")
        return lambda x: _softmax(-x, dim=m.dim)
    if type(m) in (nn.Softmax, nn.LogSoftmax):
        if m.dim is None:
            raise InputError(f"{type(m).__name__} without dim (torch's deprecated implicit choice) is not supported")
        return partial(_softmax if type(m) is nn.Softmax else _log_softmax, dim=m.dim)
    if type(m) is nn.Identity or (type(m) is nn.Dropout and m.p == 0):  # Dropout(p=0) keeps every value unscaled
        return lambda x: x
    return None


# Dropout (Srivastava et al. 2014, JMLR 15; torch.nn.Dropout): in training mode each value is kept with probability
# 1 − p and scaled by 1/(1 − p) (inverted dropout: the expectation over the mask is the value itself), else zeroed; in
# evaluation mode the identity. The JAX forward draws the masks from the key of a keyed call (``apply(params, x, key)``,
# the trainer's, one key per record and step: StepProgram.record_keys) and is the identity without one
# (``apply(params, x)``: the logits of the pre-training checks, of the attacks after training), as torch's eval mode.
# While a keyed forward runs, _DROPOUT_KEY holds [key, the number of dropout sites drawn so far]: the n-th site the
# forward reaches (a fixed order: the translation's Python control flow, the same at every call) draws its mask under
# fold_in(key, n), so every site of every record has its own subkey, and a module run twice draws twice, as torch's.
_DROPOUT_KEY: contextvars.ContextVar = contextvars.ContextVar("dropout_key", default=None)


@contextmanager
def _dropout_key(key):
    token = _DROPOUT_KEY.set(None if key is None else [key, 0])
    try:
        yield
    finally:
        _DROPOUT_KEY.reset(token)


def _dropout(x, p: float, channels: bool = False, alpha: bool = False):
    """torch's dropout of ``x`` with probability ``p`` under the current record's key; the identity without one.
    ``channels``: one draw per (record, channel) for all of a channel's values (torch's Dropout1d/2d/3d,
    F.dropout1d/2d/3d: torch's feature dropout, Tompson et al. 2015, arXiv:1411.4280, §3.2). ``alpha``: torch's
    AlphaDropout (below)."""
    state = _DROPOUT_KEY.get()
    if state is None or p == 0:
        return x
    site = state[1]
    state[1] += 1
    if p == 1:  # torch: all zeros (no 1/(1 − p) = ∞ scaling, whose gradient would be 0·∞ = nan here); AlphaDropout too
        return jnp.zeros_like(x)
    shape = x.shape[:2] + (1,) * (x.ndim - 2) if channels else x.shape
    keep = jax.random.bernoulli(jax.random.fold_in(state[0], site), 1.0 - p, shape)
    if alpha:
        # AlphaDropout (Klambauer et al. 2017, arXiv:1706.02515, §"New Dropout Technique"; torch.nn.AlphaDropout): a
        # dropped value is set to SELU's saturation α' = −λα = −1.7580993408473766, then every value mapped by a·x + b,
        # a = ((1 − p)(1 + p α'²))^(−1/2), b = −a α' p (zero mean and unit variance kept), as torch's ATen
        # _dropout_impl: kept a·x + 1.758… a p, dropped 1.758… a (p − 1)
        neg = 1.7580993408473766
        a = 1.0 / math.sqrt((neg * neg * p + 1.0) * (1.0 - p))
        return jnp.where(keep, a * x + neg * a * p, jnp.full_like(x, neg * a * (p - 1.0)))
    return jnp.where(keep, x / (1.0 - p), jnp.zeros_like(x))


# torch's dropout modules: {type: the input's number of axes for a channel-wise draw (None: every value alone), alpha}
_DROPOUTS = {nn.Dropout: (None, False), nn.Dropout1d: (3, False), nn.Dropout2d: (4, False), nn.Dropout3d: (5, False),
             nn.AlphaDropout: (None, True)}  # fmt: skip


def _feature_dropout(name: str, x, p: float, ndim: int | None, alpha: bool = False):
    # Dropout1d/2d/3d take (N, C, L) / (N, C, H, W) / (N, C, D, H, W); torch reads an input with one axis fewer as
    # one record (and warns on a 3-D input to Dropout2d), which the batched graph cannot tell apart: refused
    if ndim is not None and x.ndim != ndim:
        raise InputError(f"{name} on a {x.ndim}-D input is not supported (a batched {ndim}-D input runs)")
    return _dropout(x, p, channels=ndim is not None, alpha=alpha)


def _has_dropout(m: nn.Module) -> bool:
    """``m`` or a module inside it draws dropout masks in training mode (nn.Dropout & co, MultiheadAttention's)."""
    return any(
        (type(d) in _DROPOUTS and d.p > 0) or (isinstance(d, nn.MultiheadAttention) and d.dropout > 0)
        for d in m.modules()
    )


# What jax_forward runs, for the one-line refusal of anything else.
SUPPORTED = (
    "Flatten, Linear, Conv1d/2d, ConvTranspose1d/2d, GroupNorm, LayerNorm, InstanceNorm1d/2d/3d (without running "
    "stats), PixelShuffle, PixelUnshuffle, "
    "Embedding, AvgPool1d/2d, MaxPool1d/2d, AdaptiveAvgPool1d/2d, AdaptiveMaxPool1d/2d, Upsample (nearest, "
    "nearest-exact, linear, bilinear, trilinear), Tanh, ReLU, ReLU6, Hardtanh, LeakyReLU, PReLU, GELU, ELU, CELU, "
    "SELU, Sigmoid, LogSigmoid, Hardsigmoid, SiLU, Mish, Softplus, Softsign, Tanhshrink, GLU, Hardswish, Softmax, "
    "Softmin, LogSoftmax, "
    "Identity, Dropout, Dropout1d/2d/3d, AlphaDropout"
)


class JaxModel:
    """A zoo model's forward pass in JAX: ``model(params, x) -> logits``, with ``layers`` the
    (name, torch module, function) list it runs (what the ghost clipping below taps)."""

    def __init__(self, layers: list[tuple[str, nn.Module, Callable]]) -> None:
        self.layers = layers
        self.dropout = any(_has_dropout(m) for _, m, _ in layers)  # the trainer passes keys (apply(params, x, key))
        # ghost_clipped_sum knows the per-example gradients of the _TAPPED layers only (not an Embedding's), and runs
        # the layers without dropout keys
        self.ghost = not self.dropout and all(
            isinstance(m, _TAPPED) and _ghostable(m) for _, m, _ in layers if _has_parameters(m)
        )

    def __call__(self, params: Params, x, key=None):
        with _dropout_key(key):
            for _, _, f in self.layers:
                x = f(params, x)
        return x


_TAPPED = (nn.Linear, nn.Conv2d, nn.GroupNorm, nn.LayerNorm)  # the parametrised layers ghost clipping taps


def _has_parameters(m: nn.Module) -> bool:
    return next(m.parameters(), None) is not None


def _tapped(m: nn.Module) -> bool:
    return isinstance(m, _TAPPED) and _has_parameters(m)


def _unsupported(what: str) -> InputError:
    return InputError(
        f"{what}: the JAX backend runs an nn.Sequential (the zoo's logreg, mlp, cnn, or your own) of {SUPPORTED}, "
        f"or a model torch.fx traces into those modules and the ops {FX_OPS}; use --backend torch"
    )


def _hook_kind(m: nn.Module) -> str | None:
    # forward (pre-)hooks change what a module returns, backward ones the gradients torch's backward pass
    # computes; the JAX layer list and its gradients would run without them
    if m._forward_hooks or m._forward_pre_hooks:
        return "forward"
    if m._backward_hooks or m._backward_pre_hooks:
        return "backward"
    return None


def _own_forward(m: nn.Module, base: type[nn.Module]) -> bool:
    """``m`` (an instance of ``base``) computes something else than ``base``: a subclass's or the instance's own
    forward."""
    return type(m).forward is not base.forward or "forward" in vars(m)


_LAYERS = (
    nn.Flatten, nn.Linear, nn.Conv1d, nn.Conv2d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.GroupNorm, nn.LayerNorm,
    nn.Embedding, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d, nn.MaxPool1d, nn.MaxPool2d, nn.Upsample, nn.PReLU, nn.InstanceNorm1d, nn.InstanceNorm2d,
    nn.InstanceNorm3d, nn.PixelShuffle, nn.PixelUnshuffle,
)  # fmt: skip


def _own_layer_forward(m: nn.Module) -> bool:
    return any(isinstance(m, base) and _own_forward(m, base) for base in _LAYERS)


def _layer(name: str, m: nn.Module) -> Callable:
    """The JAX function of one module (a child of the Sequential, or a module the fx graph calls); an
    :class:`InputError` for anything else."""
    if _own_layer_forward(m):  # a subclass (or an instance) whose forward computes something else
        raise _unsupported(f"layer {name} ({type(m).__name__}) has a forward of its own")
    if isinstance(m, nn.Flatten):
        return lambda p, x: _flatten(x, m.start_dim, m.end_dim)
    if isinstance(m, nn.Linear):
        return _linear(name)
    if isinstance(m, (nn.GroupNorm, nn.LayerNorm)):
        return _norm(name, m)
    if isinstance(m, nn.Embedding):
        return _embedding(name, m)
    if isinstance(m, (nn.Conv1d, nn.Conv2d)):
        return _conv(name, m)
    if isinstance(m, (nn.ConvTranspose1d, nn.ConvTranspose2d)):
        return _conv_transpose(name, m)
    if isinstance(m, (nn.AvgPool1d, nn.AvgPool2d, nn.MaxPool1d, nn.MaxPool2d)):
        return _pool_module(name, m)
    if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d)):
        return _adaptive_module(name, m)
    if isinstance(m, nn.Upsample):
        return lambda p, x: _interpolate(x, m.size, m.scale_factor, m.mode, m.align_corners, m.recompute_scale_factor)
    if isinstance(m, nn.PReLU):
        return _prelu(name)
    if type(m) in _INSTANCE_NORMS:
        return _instance_norm(name, m)
    if isinstance(m, (nn.PixelShuffle, nn.PixelUnshuffle)):
        shuffle = _pixel_shuffle if isinstance(m, nn.PixelShuffle) else _pixel_unshuffle
        r = m.upscale_factor if isinstance(m, nn.PixelShuffle) else m.downscale_factor
        return lambda p, x: shuffle(x, r)
    if (act := _activation(m)) is not None and "forward" not in vars(m):
        return lambda p, x: act(x)
    if type(m) in _DROPOUTS and "forward" not in vars(m):
        return lambda p, x: _feature_dropout(f"layer {name} ({type(m).__name__})", x, m.p, *_DROPOUTS[type(m)])
    raise _unsupported(f"layer {name} ({type(m).__name__}) is not supported")


def _plain_sequential(m: nn.Module) -> bool:
    """An ``nn.Sequential`` running its layers in order (no forward of its own), and so its nested Sequentials."""
    if not isinstance(m, nn.Sequential) or _own_forward(m, nn.Sequential):
        return False
    return all(_plain_sequential(c) for c in m._modules.values() if isinstance(c, nn.Sequential))


def _flat_layers(seq: nn.Sequential, name: str = "") -> list[tuple[str, nn.Module]]:
    """The layers a plain ``seq`` runs, in order, with torch's names: a nested Sequential's as "block.0", and every
    use of a module used twice (``_modules`` keeps each name; ``named_children()`` lists such a module once)."""
    out = []
    for key, m in seq._modules.items():
        full = f"{name}.{key}" if name else key
        out += _flat_layers(m, full) if isinstance(m, nn.Sequential) else [(full, m)]
    return out


def _layer_list(model: nn.Sequential, modules: list[tuple[str, nn.Module]], owner: dict[int, str]) -> JaxModel:
    layers = [(name, m, _layer(name, m)) for name, m in modules]
    read = {n for name, m, _ in layers for n, _ in m.named_parameters(prefix=name)}
    if unread := next((n for n in owner.values() if n not in read), None):
        raise _unsupported(f"parameter {unread} is read by no layer of the list (the JAX forward would not use it)")
    return JaxModel(layers)


def jax_forward(model: nn.Module) -> JaxModel | FxModel:
    """The forward pass of a user's torch module as a pure JAX function of ``{torch parameter name: array}``:
    a plain ``nn.Sequential`` of :data:`SUPPORTED` layers and nested plain Sequentials of them (the zoo's
    logreg, mlp and cnn, or a user's own) as its layer list (:class:`JaxModel`, which ghost clipping taps);
    any other module (own forward, skip connections, a module used twice, tied weights) as the graph
    ``torch.fx.symbolic_trace`` records (:class:`FxModel`). Anything neither would compute as torch does is an
    :class:`InputError` naming it: another module or op, hooks, frozen parameters, a parameter nothing reads."""
    registry = torch.nn.modules.module
    if any(getattr(registry, f"_global_{k}_hooks") for k in ("forward", "forward_pre", "backward", "backward_pre")):
        raise _unsupported("a global module hook is registered (torch.nn.modules.module.register_module_*_hook)")
    for n, m in model.named_modules():
        if kind := _hook_kind(m):
            raise _unsupported(f"{f'layer {n}' if n else 'the model'} has a {kind} hook")
    if hooked := hooked_parameters(model, list(model.parameters())):
        raise _unsupported(f"parameter {hooked[0]} has a gradient hook (Tensor.register_hook)")
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:  # params_from_torch carries the trained parameters only: a frozen one would be missing
        raise InputError(
            f"parameter {frozen[0]} is frozen (requires_grad=False): the JAX backend trains every parameter; "
            "use --backend torch"
        )
    # {id: the name named_parameters() lists it under}: a tied parameter's second name maps to its first
    owner = {id(p): n for n, p in reversed(list(model.named_parameters(remove_duplicate=False)))}
    if _plain_sequential(model):
        modules = _flat_layers(model)
        shared = len({id(m) for _, m in modules}) < len(modules) or len(owner) < len(
            list(model.named_parameters(remove_duplicate=False))
        )
        # a module used twice or tied weights (one parameter, two uses), a layer subclass with its own forward:
        # the graph below (which traces into the subclass's forward)
        if not shared and not any(_own_layer_forward(m) for _, m in modules):
            return _layer_list(model, modules, owner)
    return _fx_model(model, owner)


# ------------------------------------------------------------------ any other module: its torch.fx graph


def _dims(args: tuple) -> tuple:
    # torch's x.view(2, 3) / x.view((2, 3)) and x.permute(1, 0) / x.permute((1, 0))
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def _jdtype(dtype):
    # a torch dtype (or a JAX one, from x.dtype) as JAX's, int64 as JAX's canonical integer (int32 without x64)
    if dtype is None or not isinstance(dtype, torch.dtype):
        return dtype
    known = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64, torch.int32: np.int32,
             torch.bool: np.bool_}  # fmt: skip
    if dtype not in known:
        raise InputError(f"dtype {dtype} is not supported by the JAX backend's graph ops")
    return jax.dtypes.canonicalize_dtype(known[dtype])


def _arange(*args, dtype=None, device=None, layout=None, requires_grad=False, pin_memory=False):
    # torch.arange(end) / (start, end[, step]): int64 for integer arguments, the default float dtype otherwise
    integer = all(isinstance(a, (int, np.integer)) for a in args)
    default = torch.int64 if integer else torch.get_default_dtype()
    return jnp.arange(*args, dtype=_jdtype(dtype or default))


def _chunk(x, chunks: int, dim: int = 0):
    # torch.chunk: pieces of ⌈n/chunks⌉ along dim, the last one shorter (and possibly fewer pieces)
    n = x.shape[dim]
    size = -(-n // chunks)
    return tuple(lax.slice_in_dim(x, i, min(i + size, n), axis=dim) for i in range(0, n, size))


def _split(x, split_size_or_sections, dim: int = 0):
    # torch.split / x.split: an int is each piece's size (the last one shorter), a list the pieces' sizes, which
    # must add up to the axis (torch raises otherwise)
    n = x.shape[dim]
    if isinstance(split_size_or_sections, (tuple, list)):
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise InputError(f"split sizes {sizes} do not add up to the axis's {n} (torch raises)")
    else:
        sizes = [min(split_size_or_sections, n - i) for i in range(0, n, split_size_or_sections)] or [0]
    starts = np.cumsum([0, *sizes])
    return tuple(lax.slice_in_dim(x, int(s), int(s) + k, axis=dim) for s, k in zip(starts, sizes, strict=False))


def _f_pad(x, pad, mode="constant", value=None):
    # F.pad: pad = (before, after) pairs from the LAST axis backwards (torch's documentation of F.pad). Constant mode:
    # a negative amount crops; the value (0 by default) fills the new entries; lax.pad transposes to the slice of the
    # padded region, torch's constant_pad_nd backward. Modes reflect (the edge not repeated: x[1], x[0] | x[0] ...),
    # replicate (the edge repeated) and circular (wrapped) are NumPy's "reflect", "edge" and "wrap"; jnp.pad builds them
    # from slices, so each padded entry's gradient is added to the entry it copies, as torch's backward of
    # reflection_pad / replication_pad / circular pad. torch takes these modes for 1-3 padded axes of an input with
    # one or two more axes (batch, channel), amounts ≥ 0, and reflect's below the axis's size (circular's up to it).
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise InputError(f"F.pad's pad {tuple(pad)} is not (before, after) pairs for at most {x.ndim} axes")
    k = len(pad) // 2
    pairs = [(0, 0)] * (x.ndim - k) + [(pad[i], pad[i + 1]) for i in range(len(pad) - 2, -1, -2)]
    if mode == "constant":
        fill = jnp.asarray(0 if value is None else value, x.dtype)
        return lax.pad(x, fill, [(a, b, 0) for a, b in pairs])
    modes = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        raise InputError(f"F.pad with mode={mode!r} is not supported")
    if not 1 <= k <= 3 or x.ndim not in (k + 1, k + 2):
        raise InputError(f"F.pad mode={mode!r} pads 1-3 axes of an input with one or two more; here {k} of {x.ndim}")
    for n, (a, b) in zip(x.shape, pairs, strict=True):
        if min(a, b) < 0 or (mode == "reflect" and max(a, b) >= n) or (mode == "circular" and max(a, b) > n):
            raise InputError(f"F.pad mode={mode!r} with pad {(a, b)} on an axis of size {n} is not supported")
    return jnp.pad(x, pairs, mode=modes[mode])


_INTERPOLATE = {"nearest": None, "nearest-exact": None, "linear": 1, "bilinear": 2, "trilinear": 3}


def _source_indices(n: int, o: int, mode: str, align_corners: bool, scale, dtype, nd: int):
    """(i0, i1, λ1) of an axis of n values resampled to o (torch's aten/src/ATen/native/UpSample.h; the output j reads
    (1 − λ1)·x[i0] + λ1·x[i1]). Scales as torch's area_pixel_compute_scale / compute_scales_value: 1/scale_factor
    when one was given (and not recomputed), else n/o; align_corners (n − 1)/(o − 1). Nearest: min(⌊j·scale⌋, n − 1),
    scale in float32, and on a 4-D input (torch's 2-D kernel, nearest_idx) j at o = n and j >> 1 at o = 2n whatever
    the scale (the 1-D and 3-D kernels take ⌊j·scale⌋ there too: checked against torch 2.13, e.g. 3 values at
    scale_factor 1.3 give rows 0, 0, 1 on a 3-D input and 0, 1, 2 on a 4-D one); nearest-exact ⌊(j + 0.5)·scale⌋.
    Linear (compute_source_index_and_lambda, in the input's float type): j·scale with align_corners, else
    max(0, (j + 0.5)·scale − 0.5); i0 = min(⌊src⌋, n − 1), i1 = i0 + 1 below the last value, λ1 = clamp(src − i0, 0, 1);
    o = n copies."""
    j = np.arange(o)
    if mode in ("nearest", "nearest-exact"):
        f = np.float32(1.0 / scale) if scale else np.float32(n) / np.float32(o)
        if mode == "nearest-exact":
            i = np.floor(((j + 0.5) * np.float64(f)).astype(np.float32))
        else:
            i = np.floor(j.astype(np.float32) * f)
            i = j if nd == 2 and o == n else j >> 1 if nd == 2 and o == 2 * n else i
        i = np.minimum(i.astype(np.int64), n - 1)
        return i, i, np.zeros(o)
    if o == n:
        return j, j, np.zeros(o)
    t = np.float32 if dtype == np.float32 else np.float64
    if align_corners:
        ratio = t(n - 1) / t(o - 1) if o > 1 else t(0)
        src = ratio * j.astype(t)
    else:
        ratio = t(1.0 / scale) if scale else t(n) / t(o)
        src = np.maximum(ratio * (j.astype(t) + t(0.5)) - t(0.5), t(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n - 1)
    return i0, i0 + (i0 < n - 1), np.clip(src - i0, 0, 1)


def _interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
                 antialias=False):  # fmt: skip
    # F.interpolate / nn.Upsample (torch's documentation of F.interpolate) on (N, C, *spatial): modes nearest,
    # nearest-exact, linear (3-D), bilinear (4-D), trilinear (5-D), one of size or scale_factor (the output
    # ⌊n·scale_factor⌋, as torch's), each axis resampled in turn (:func:`_source_indices`: a linear mode's weights
    # are separable); gathers with constant indices and weights, so the gradient adds each output's weighted share to
    # the values it read, as torch's backward. bicubic, area and antialias are not supported.
    if mode not in _INTERPOLATE or antialias:
        raise InputError(f"interpolate with mode={mode!r}{' and antialias' if antialias else ''} is not supported")
    nd = x.ndim - 2
    if nd < 1 or _INTERPOLATE[mode] not in (None, nd):
        raise InputError(f"interpolate mode={mode!r} on a {x.ndim}-D input is not supported (torch raises)")
    if _INTERPOLATE[mode] is None and align_corners is not None:
        raise InputError("interpolate with align_corners in a nearest mode (torch raises)")
    if (size is None) == (scale_factor is None):
        raise InputError("interpolate takes one of size and scale_factor (torch raises)")
    if recompute_scale_factor and size is not None:
        raise InputError("interpolate with recompute_scale_factor and size (torch raises)")
    n = x.shape[2:]
    if size is not None:
        out, scales = [int(v) for v in _tuple(size, nd)], (None,) * nd
    else:
        scales = tuple(float(v) for v in _tuple(scale_factor, nd))
        out = [math.floor(float(k) * f) for k, f in zip(n, scales, strict=True)]
        scales = (None,) * nd if recompute_scale_factor else scales
    if len(out) != nd or min(out) < 1:
        raise InputError(f"interpolate to {tuple(out)} from {tuple(n)} is not supported (torch raises)")
    for axis, (k, o, f) in enumerate(zip(n, out, scales, strict=True), start=2):
        i0, i1, lam = _source_indices(k, o, mode, bool(align_corners), f, x.dtype, nd)
        if mode == "nearest" and nd != 2 and o in (k, 2 * k) and not np.array_equal(i0, np.arange(o) * k // o):
            # torch's 1-D/3-D nearest backward takes nearest_idx's shortcuts (j at o = n, j >> 1 at o = 2n) where its
            # forward took ⌊j·scale⌋ (torch 2.13: 3 values at scale_factor 1.3 read rows 0, 0, 1, gradient 1, 1, 1):
            # its gradient is no function's gradient, so no JAX forward trains as it does
            raise InputError(
                f"interpolate nearest from {k} to {o} values at scale_factor {f} on a {x.ndim}-D input: torch's "
                "backward reads other values than its forward there; pass size= instead"
            )
        shape = (o,) + (1,) * (x.ndim - 1 - axis)
        lo = jnp.take(x, jnp.asarray(i0), axis=axis)
        if _INTERPOLATE[mode] is None:
            x = lo
        else:
            lam = jnp.asarray(lam.reshape(shape), x.dtype)
            x = (1 - lam) * lo + lam * jnp.take(x, jnp.asarray(i1), axis=axis)
    return x


def _abs(x):
    # |x| with torch's gradient sgn(x), 0 at 0 (abs_backward); JAX's abs passes ±1 there
    return x * jnp.sign(x)


def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    # torch.linalg.vector_norm (and x.norm / torch.norm, which call it for a number p and for "fro"), over dim (all
    # axes when None), with torch's gradients (torch/csrc/autograd/FunctionsManual.cpp norm_backward):
    # - 2: √(Σ x²), gradient x/‖x‖ · g and 0 where ‖x‖ = 0 (`self * (grad / norm).masked_fill_(norm == 0, 0)`); √ at 0
    #   would give NaN, so the sum is replaced by 1 there (the safe-norm jnp.where trick: no NaN enters the backward of
    #   the branch not taken);
    # - 1: Σ |x|, gradient sgn(x) · g (0 at 0);
    # - ±inf: max (min) of |x|, gradient sgn(x) · g split evenly among the entries attaining it
    #   (`self.sgn() * ((grad / mask.sum(dim, true)) * mask)`, mask = |x| == norm), which is reduce_max's JVP.
    if out is not None:  # torch.norm's graph node passes out=None (its __torch_function__ call names every argument)
        raise InputError("out= is not supported")
    if ord not in ("fro", 2, 2.0, 1, 1.0, math.inf, -math.inf):
        raise InputError(f"norm with p = {ord!r} is not supported (p = 1, 2, inf, -inf run)")
    axis = tuple(dim) if isinstance(dim, (tuple, list)) else dim
    x = x if dtype is None else x.astype(_jdtype(dtype))
    if ord in (1, 1.0):
        return jnp.sum(_abs(x), axis=axis, keepdims=keepdim)
    if ord in (math.inf, -math.inf):
        return _even_extreme(_abs(x), axis, keepdim, ord > 0)
    s = jnp.sum(x * x, axis=axis, keepdims=keepdim)
    return jnp.where(s > 0, jnp.sqrt(jnp.where(s > 0, s, 1)), 0)


def _p_norm(x, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    # x.norm / torch.norm: linalg.vector_norm for a number p or "fro" (torch.functional.norm; "nuc" refused)
    return _vector_norm(x, p, dim, keepdim, dtype=dtype, out=out)


def _f_normalize(x, p=2.0, dim=1, eps=1e-12, out=None):
    # F.normalize: x / max(‖x‖_p, eps) over dim (torch.nn.functional.normalize: norm(p, dim, keepdim=True)
    # .clamp_min(eps)), the gradient through _clamp's (1 on the bound, as torch's clamp_min) and the norm's
    return x / _clamp(_vector_norm(x, p, dim, keepdim=True, out=out), eps)


def _var_of(root: bool):
    def f(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
        # torch.var / x.var (torch.std: its square root): Σ (x − mean)² / max(0, N − correction) over dim (all axes
        # when None), N the number of values reduced; correction 1 by default (Bessel's), unbiased=False is 0 (torch's
        # documentation of var; x.var(False) is the legacy unbiased argument). N ≤ correction gives inf or nan, as
        # torch. std's gradient is 0 where std = 0 (torch's std_backward masks it; √ at 0 would give NaN).
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        if unbiased is not None and correction is not None:
            raise InputError("var/std with both unbiased and correction (torch raises)")
        c = correction if correction is not None else (0 if unbiased is False else 1)
        axis = tuple(dim) if isinstance(dim, (tuple, list)) else dim
        n = math.prod(x.shape) if axis is None else math.prod(x.shape[a] for a in np.atleast_1d(axis))
        d = x - jnp.mean(x, axis=axis, keepdims=True)
        v = jnp.sum(d * d, axis=axis, keepdims=keepdim) / max(0, n - c)
        return jnp.where(v > 0, jnp.sqrt(jnp.where(v > 0, v, 1)), 0) if root else v

    return f


_var, _std = _var_of(False), _var_of(True)


def _with_mean(fn):
    def f(x, dim=None, unbiased=None, keepdim=False, *, correction=None):  # torch.var_mean / std_mean: (var, mean)
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        axis = tuple(dim) if isinstance(dim, (tuple, list)) else dim
        return fn(x, dim, unbiased, keepdim, correction=correction), jnp.mean(x, axis=axis, keepdims=keepdim)

    return f


def _first_extreme(v, largest: bool = True):
    """The max (min) over the last axis read at its FIRST argmax (argmin): autodiff sends the gradient to that one
    index (torch's max pooling and max(dim)), an integer computed once, whatever XLA's rounding elsewhere."""
    i = (jnp.argmax if largest else jnp.argmin)(v, axis=-1, keepdims=True)
    return jnp.take_along_axis(v, i, axis=-1)[..., 0]


def _even_extreme(x, axis, keepdims: bool, largest: bool):
    """max (min) of ``x`` over ``axis`` (an int, a tuple, None: all) with torch's amax gradient: split evenly among
    the entries equal to the result (torch's amax documentation; evenly_distribute_backward). Not jnp.max: its JVP
    (lax.reduce_max's: the indicator x == max over its count) is evaluated by XLA, under jit, in several fused
    kernels that each recompute x, and a recomputation rounded otherwise misses the maximum — the per-example
    gradient of an amax over a bilinear upsampling lost 0.75 of its 1 in one kernel and not in another (twelfth
    session, RESULTS.md). Here the value is read at argmax (an integer, computed once), and the tie indicator always
    holds that index, so every computation gives a split that sums to 1 (exact ties, copies of one value, stay ties
    in any rounding)."""
    given = range(x.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
    axes = tuple(a % x.ndim for a in given)
    keep = [a for a in range(x.ndim) if a not in axes]
    moved = jnp.transpose(x, keep + list(axes))
    flat = moved.reshape(*moved.shape[: len(keep)], -1)  # the reduced axes last, as one
    arg = jnp.argmax if largest else jnp.argmin

    @jax.custom_jvp
    def extreme(v):
        return _first_extreme(v, largest)

    @extreme.defjvp
    def _(primals, tangents):
        (v,), (t,) = primals, tangents
        i = arg(v, axis=-1, keepdims=True)
        out = jnp.take_along_axis(v, i, axis=-1)
        ties = (v == out) | (lax.broadcasted_iota(jnp.int32, v.shape, v.ndim - 1) == i)
        share = ties.astype(t.dtype)
        return out[..., 0], (t * share).sum(-1) / share.sum(-1)

    out = extreme(flat)
    return jnp.expand_dims(out, axes) if keepdims else out


def _amax_of(largest: bool):
    def f(x, dim=(), keepdim=False):
        # torch.amax / torch.amin (and x.amax / x.amin): the maximum (minimum) over dim (every axis for dim=()), its
        # gradient split evenly among the maxima of a tie (torch's documentation of amax: "amax/amin evenly
        # distributes gradient between equal values"), as :func:`_even_extreme` computes it
        axis = tuple(dim) if isinstance(dim, (tuple, list)) else dim
        return _even_extreme(x, None if axis == () else axis, keepdim, largest)

    return f


class _MaxDim(tuple):
    # torch.return_types.max / min: (values, indices), read by .values / .indices or as a tuple
    values = property(lambda s: s[0])
    indices = property(lambda s: s[1])
    _fields = ("values", "indices")


def _max_of(largest: bool):
    def f(x, dim=None, keepdim=False):
        # torch.max / x.max (torch.min / x.min alike). max(x): the largest entry, its gradient split evenly among the
        # maxima of a tie (torch's derivatives.yaml: evenly_distribute_backward). max(x, dim): (values, indices), the
        # index of the FIRST maximum (torch's documentation of max) and the gradient to that index only (torch's
        # value_selecting_reduction_backward), not split: the values are read at argmax. max(x, other): the
        # elementwise maximum (torch.maximum's gradient halves at ties, as JAX's).
        if dim is None:
            return _even_extreme(x, None, False, largest)
        if not isinstance(dim, int):  # max(x, other)
            return (jnp.maximum if largest else jnp.minimum)(x, dim)
        i = (jnp.argmax if largest else jnp.argmin)(x, axis=dim, keepdims=True)
        values, i = jnp.take_along_axis(x, i, axis=dim), i.astype(_jdtype(torch.int64))
        return _MaxDim((values, i) if keepdim else (jnp.squeeze(values, dim), jnp.squeeze(i, dim)))

    return f


_amax, _amin = _amax_of(True), _amax_of(False)
_max, _min = _max_of(True), _max_of(False)


def _reduce(fn):
    def f(x, dim=None, keepdim=False, *, dtype=None):  # torch.mean / torch.sum (dim None: all axes)
        axis = tuple(dim) if isinstance(dim, (tuple, list)) else dim
        return fn(x if dtype is None else x.astype(_jdtype(dtype)), axis=axis, keepdims=keepdim)

    return f


def _softmax(x, dim=None, _stacklevel=3, dtype=None):
    # torch.softmax / F.softmax along dim: exp(x − max) / Σ exp(x − max), as torch's kernel
    if dim is None:
        raise InputError("softmax without dim (torch's deprecated implicit choice) is not supported")
    return jax.nn.softmax(x if dtype is None else x.astype(_jdtype(dtype)), axis=dim)


def _log_softmax(x, dim=None, _stacklevel=3, dtype=None):
    # torch.log_softmax / F.log_softmax along dim: x − max − log Σ exp(x − max), as torch's kernel. A model returning
    # it trains as one returning the logits: the cross-entropy's log-softmax of a log-softmax is itself (its
    # logsumexp is log Σ softmax = 0), so the loss and its gradients are the nll_loss of torch's MNIST example.
    if dim is None:
        raise InputError("log_softmax without dim (torch's deprecated implicit choice) is not supported")
    return jax.nn.log_softmax(x if dtype is None else x.astype(_jdtype(dtype)), axis=dim)


def _squeeze(x, dim=None):
    # torch.squeeze / x.squeeze: drops the size-1 axes among dim (all axes when None); an axis of another size stays
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    return jnp.squeeze(x, tuple(d % x.ndim for d in dims if x.shape[d] == 1))


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    # F.layer_norm (Ba et al. 2016, arXiv:1607.06450, Eq. 4), as nn.LayerNorm
    k = len(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else 1
    z = _standardize(x, tuple(range(x.ndim - k, x.ndim)), eps)
    z = z if weight is None else z * weight
    return z if bias is None else z + bias


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    # F.scaled_dot_product_attention's reference semantics (its documentation's Python equivalent):
    # softmax(q kᵀ · scale + mask) v, scale = 1/√E (Vaswani et al. 2017, arXiv:1706.03762, Eq. 1); a boolean
    # mask (or is_causal's lower triangle) keeps the True positions, a float mask is added
    # dropout_p: dropout of the attention weights after the softmax, before the product with v, as the reference
    if enable_gqa:
        raise InputError("scaled_dot_product_attention with enable_gqa is not supported")
    if is_causal and attn_mask is not None:  # torch's CPU kernel applies both, its documentation says it raises
        raise InputError("scaled_dot_product_attention with both attn_mask and is_causal=True is not supported")
    s = jnp.matmul(q, jnp.swapaxes(k, -2, -1), precision=PRECISION) * (
        1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    )
    if is_causal:
        attn_mask = jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), dtype=bool))
    if attn_mask is not None:
        s = jnp.where(attn_mask, s, -jnp.inf) if attn_mask.dtype == bool else s + attn_mask
    return jnp.matmul(_dropout(jax.nn.softmax(s, axis=-1), dropout_p), v, precision=PRECISION)


def _additive(mask, dtype):
    # nn.MultiheadAttention's masks (torch's F._canonical_mask): a boolean True hides the position (-inf added), a
    # float mask is added as it is
    return jnp.where(mask, -jnp.inf, 0.0).astype(dtype) if mask.dtype == bool else mask.astype(dtype)


def _mha(name: str, m: nn.MultiheadAttention) -> Callable:
    """nn.MultiheadAttention's output (its attention weights are not computed: the graph may read output[0] only):
    the in-projections of query, key, value by the thirds of in_proj_weight/in_proj_bias, H heads of E/H features,
    softmax(q kᵀ/√(E/H) + masks) v per head (Vaswani et al. 2017, arXiv:1706.03762, Eq. 1 and §3.2.2), the heads
    concatenated and out_proj; torch's F.multi_head_attention_forward, the attention weights dropped out with p =
    m.dropout after the softmax (:func:`_sdpa`, as torch's training mode). attn_mask (L, S) or (B·H, L, S) and
    key_padding_mask (B, S), boolean (True: hidden) or float (added). is_causal=True as torch 2.x's
    F.multi_head_attention_forward takes the hint: attn_mask required; with no key_padding_mask and
    need_weights=False the lower triangle of F.scaled_dot_product_attention(is_causal=True) replaces attn_mask,
    otherwise attn_mask is applied as given."""
    if _own_forward(m, nn.MultiheadAttention):  # its forward replaced, or a subclass as an encoder layer's self_attn
        raise _unsupported(f"layer {name} (MultiheadAttention) has a forward of its own")
    if m.bias_k is not None or m.add_zero_attn:
        raise _unsupported(f"layer {name} (MultiheadAttention) has add_bias_kv or add_zero_attn")
    if not m._qkv_same_embed_dim:
        raise _unsupported(f"layer {name} (MultiheadAttention) has kdim or vdim other than embed_dim")
    E, H = m.embed_dim, m.num_heads

    def f(p, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True,
          is_causal=False):  # fmt: skip
        if is_causal and attn_mask is None:  # torch raises RuntimeError ("Need attn_mask if specifying the is_causal")
            raise InputError("is_causal=True without attn_mask (torch raises: it needs the mask the hint describes)")
        causal = is_causal and key_padding_mask is None and not need_weights  # torch drops attn_mask for the hint
        attn_mask = None if causal else attn_mask
        if query.ndim != 3:
            raise InputError("unbatched (2-D) input is not supported")
        qkv = [t if m.batch_first else jnp.swapaxes(t, 0, 1) for t in (query, key, value)]  # (B, L or S, E)
        w, b = p[f"{name}.in_proj_weight"], p.get(f"{name}.in_proj_bias")
        q, k, v = (
            _sub_tap(
                f"{name}.in_proj.{i}",
                t,
                _affine_map(t, w[i * E : (i + 1) * E], None if b is None else b[i * E : (i + 1) * E]),
            )
            .reshape(t.shape[0], t.shape[1], H, E // H)
            .transpose(0, 2, 1, 3)  # (B, H, L or S, E/H)
            for i, t in enumerate(qkv)
        )
        B, L, S = q.shape[0], q.shape[2], k.shape[2]
        mask = None
        if attn_mask is not None:
            mask = _additive(attn_mask, q.dtype)
            mask = mask.reshape(B, H, L, S) if mask.ndim == 3 else mask
        if key_padding_mask is not None:
            pad = _additive(key_padding_mask, q.dtype).reshape(B, 1, 1, S)
            mask = pad if mask is None else mask + pad
        o = _sdpa(q, k, v, attn_mask=mask, dropout_p=m.dropout, is_causal=causal).transpose(0, 2, 1, 3).reshape(B, L, E)
        o = _sub_tap(
            f"{name}.out_proj", o, _affine_map(o, p[f"{name}.out_proj.weight"], p.get(f"{name}.out_proj.bias"))
        )
        return (o if m.batch_first else jnp.swapaxes(o, 0, 1)), None

    return f


def _block_parts(name: str, m: nn.Module, base: type[nn.Module]) -> tuple[Callable, list, list]:
    """The feed-forward block linear2(dropout(activation(linear1 x))), the LayerNorms (norm1, norm2[, norm3]) and
    the dropouts after the sub-layers (dropout1, dropout2[, dropout3], each through :func:`_layer`: nn.Dropout,
    Identity) of a torch encoder or decoder layer (torch's _ff_block, _sa_block, _mha_block), after the checks both
    share: torch's forward (not its own), activation relu or gelu (a function or a ReLU/GELU module)."""
    kind = base.__name__
    if _own_forward(m, base):
        raise _unsupported(f"layer {name} ({kind}) has a forward of its own")
    if isinstance(m.activation, nn.Module):
        act = _activation(m.activation)
    else:
        act = {F.relu: jax.nn.relu, F.gelu: partial(jax.nn.gelu, approximate=False)}.get(m.activation)
    if act is None:
        raise _unsupported(f"layer {name} ({kind}) has activation {m.activation} (relu, gelu run)")
    lin1, lin2, drop = _linear(f"{name}.linear1"), _linear(f"{name}.linear2"), _layer(f"{name}.dropout", m.dropout)
    norms = [_norm(f"{name}.{n}", getattr(m, n)) for n in ("norm1", "norm2", "norm3") if hasattr(m, n)]
    drops = [_layer(f"{name}.{n}", getattr(m, n)) for n in ("dropout1", "dropout2", "dropout3") if hasattr(m, n)]
    return lambda p, x: lin2(p, drop(p, act(lin1(p, x)))), norms, drops


def _encoder_layer(name: str, m: nn.TransformerEncoderLayer) -> Callable:
    """nn.TransformerEncoderLayer's training-mode forward (Vaswani et al. 2017, arXiv:1706.03762, §3.1 and §5.4, the
    dropout of each sub-layer's output; norm_first: Xiong et al. 2020, arXiv:2002.04745): x + SA(LN₁ x), then +
    FF(LN₂ x) (norm_first), or LN₁(x + SA(x)), then LN₂(x + FF(x)); SA dropout1 of the self-attention of :func:`_mha`
    (src_mask, src_key_padding_mask), FF dropout2 of linear2(dropout(activation(linear1 x))), activation relu or
    gelu (a function or a ReLU/GELU module); the dropouts in the order torch's forward draws them."""
    ff_block, (norm1, norm2), (drop1, drop2) = _block_parts(name, m, nn.TransformerEncoderLayer)
    attn = _mha(f"{name}.self_attn", m.self_attn)

    def f(p, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        def sa(x):
            return drop1(p, attn(p, x, x, x, src_key_padding_mask, False, src_mask, is_causal=is_causal)[0])

        def ff(p, x):
            return drop2(p, ff_block(p, x))

        if m.norm_first:
            x = src + sa(norm1(p, src))
            return x + ff(p, norm2(p, x))
        x = norm1(p, src + sa(src))
        return norm2(p, x + ff(p, x))

    return f


def _decoder_layer(name: str, m: nn.TransformerDecoderLayer) -> Callable:
    """nn.TransformerDecoderLayer's training-mode forward (Vaswani et al. 2017, arXiv:1706.03762, §3.1, the decoder's
    three sub-layers, each output dropped out: dropout1, dropout2, dropout3 of FF as in the encoder layer;
    norm_first: Xiong et al. 2020, arXiv:2002.04745, Fig. 1), as torch 2.x's
    forward: norm_first: x + SA(LN₁ x), + CA(LN₂ x, memory), + FF(LN₃ x); else LN₁(x + SA(x)), LN₂(x + CA(x,
    memory)), LN₃(x + FF(x)). SA: self_attn on (x, x, x) with tgt_mask, tgt_key_padding_mask, tgt_is_causal; CA:
    multihead_attn on (x, memory, memory) with memory_mask, memory_key_padding_mask, memory_is_causal; both
    need_weights=False (torch's _sa_block, _mha_block), run by :func:`_mha` (its is_causal rule included)."""
    ff_block, (norm1, norm2, norm3), (drop1, drop2, drop3) = _block_parts(name, m, nn.TransformerDecoderLayer)
    self_attn = _mha(f"{name}.self_attn", m.self_attn)
    cross_attn = _mha(f"{name}.multihead_attn", m.multihead_attn)

    def f(p, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
          tgt_is_causal=False, memory_is_causal=False):  # fmt: skip
        def sa(x):
            return drop1(p, self_attn(p, x, x, x, tgt_key_padding_mask, False, tgt_mask, is_causal=tgt_is_causal)[0])

        def ca(x):
            return drop2(p, cross_attn(p, x, memory, memory, memory_key_padding_mask, False, memory_mask,
                                       is_causal=memory_is_causal)[0])  # fmt: skip

        def ff(p, x):
            return drop3(p, ff_block(p, x))

        if m.norm_first:
            x = tgt + sa(norm1(p, tgt))
            x = x + ca(norm2(p, x))
            return x + ff(p, norm3(p, x))
        x = norm1(p, tgt + sa(tgt))
        x = norm2(p, x + ca(x))
        return norm3(p, x + ff(p, x))

    return f


def _stack_parts(name: str, m: nn.Module, base: type[nn.Module], layer: type[nn.Module], translate: Callable):
    """The layers of a torch encoder (decoder) stack, each a TransformerEncoderLayer (TransformerDecoderLayer)
    translation, and its final norm (through :func:`_layer`: LayerNorm runs, anything else is refused) or None."""
    if _own_forward(m, base):
        raise _unsupported(f"layer {name} ({base.__name__}) has a forward of its own")
    layers = []
    for i, one in enumerate(m.layers):
        if not isinstance(one, layer):
            raise _unsupported(f"layer {name}.layers.{i} ({type(one).__name__}) is not a {layer.__name__}")
        layers.append(translate(f"{name}.layers.{i}", one))
    return layers, None if m.norm is None else _layer(f"{name}.norm", m.norm)


def _encoder(name: str, m: nn.TransformerEncoder) -> Callable:
    """nn.TransformerEncoder's training-mode forward: its layers (each a TransformerEncoderLayer run by
    :func:`_encoder_layer`) in turn on the same mask and key padding mask, then its final norm if it has one.
    The fast path (nested tensors; enable_nested_tensor, mask_check) runs in eval mode without gradients only,
    never while either trainer trains. is_causal=None (torch's default) detects a mask equal to
    generate_square_subsequent_mask(seq_len) and passes is_causal=True to the layers, whose attention then applies
    the lower triangle instead of that mask: the same −inf entries and 0 elsewhere (s + 0 = s), so the mask is
    applied as given; an explicit True or False is passed on, as torch's forward."""
    layers, norm = _stack_parts(name, m, nn.TransformerEncoder, nn.TransformerEncoderLayer, _encoder_layer)

    def f(p, src, mask=None, src_key_padding_mask=None, is_causal=None):
        out = src
        for layer in layers:
            out = layer(p, out, mask, src_key_padding_mask, is_causal=bool(is_causal))
        return out if norm is None else norm(p, out)

    return f


def _decoder(name: str, m: nn.TransformerDecoder) -> Callable:
    """nn.TransformerDecoder's forward (torch 2.x): its layers (TransformerDecoderLayer, :func:`_decoder_layer`) in
    turn on the same memory and masks, then its final norm if it has one. tgt_is_causal=None (torch's default)
    detects a tgt_mask equal to generate_square_subsequent_mask(seq_len) (torch's _detect_is_causal_mask) and passes
    tgt_is_causal=True to the layers: applying that mask as given is the same (see :func:`_encoder`); an explicit
    True or False, and memory_is_causal, are passed on."""
    layers, norm = _stack_parts(name, m, nn.TransformerDecoder, nn.TransformerDecoderLayer, _decoder_layer)

    def f(p, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
          tgt_is_causal=None, memory_is_causal=False):  # fmt: skip
        out = tgt
        for layer in layers:
            out = layer(p, out, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                        bool(tgt_is_causal), memory_is_causal)  # fmt: skip
        return out if norm is None else norm(p, out)

    return f


def _transformer(name: str, m: nn.Transformer) -> Callable:
    """nn.Transformer's forward (torch 2.x): memory = encoder(src, src_mask, src_key_padding_mask, src_is_causal),
    then decoder(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
    memory_is_causal) (Vaswani et al. 2017, arXiv:1706.03762, Fig. 1); its encoder and decoder (built in or
    custom) must be an nn.TransformerEncoder and an nn.TransformerDecoder."""
    if _own_forward(m, nn.Transformer):
        raise _unsupported(f"layer {name} (Transformer) has a forward of its own")
    for part, kind in (("encoder", nn.TransformerEncoder), ("decoder", nn.TransformerDecoder)):
        if not isinstance(getattr(m, part), kind):
            got = type(getattr(m, part)).__name__
            raise _unsupported(f"layer {name}.{part} ({got}) is not an nn.{kind.__name__} (a custom_{part})")
    encoder, decoder = _encoder(f"{name}.encoder", m.encoder), _decoder(f"{name}.decoder", m.decoder)

    def f(p, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
          tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
          memory_is_causal=False):  # fmt: skip
        memory = encoder(p, src, src_mask, src_key_padding_mask, src_is_causal)
        return decoder(p, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                       tgt_is_causal, memory_is_causal)  # fmt: skip

    return f


# torch.nn's transformer modules (leaves of the trace) and their translations
_TRANSFORMER_PARTS = {
    nn.TransformerEncoderLayer: _encoder_layer, nn.TransformerEncoder: _encoder,
    nn.TransformerDecoderLayer: _decoder_layer, nn.TransformerDecoder: _decoder, nn.Transformer: _transformer,
}  # fmt: skip


def _getitem(obj, idx):
    # a tuple's item (x.shape[-1], chunk(...)[0]); an array's basic indexing (ints, slices, None, ...), which
    # NumPy/JAX and torch define alike, an integer inside the axis (JAX would clamp what torch refuses); and integer
    # tensors or lists of ints (advanced indexing, NumPy's rules, which torch's follow: the indexed axes broadcast
    # together, their result in place of the first, or first of all where a slice separates them), negatives counted
    # from the end, out of range checked where known (_in_range) and NaN under a trace, never a clamped neighbour.
    # A boolean tensor or list (x[mask]: a data-dependent shape) is refused
    if isinstance(obj, (tuple, list)):
        return obj[idx]
    items = tuple((jnp.asarray(i) if isinstance(i, list) else i) for i in (idx if isinstance(idx, tuple) else (idx,)))
    advanced = [isinstance(i, jax.Array) for i in items]
    if any(a and not jnp.issubdtype(i.dtype, jnp.integer) for a, i in zip(advanced, items, strict=True)):
        raise InputError("indexing a tensor by a boolean mask (a shape that depends on the data) is not supported")
    if not all(a or i is None or i is Ellipsis or isinstance(i, (int, slice)) for a, i in zip(advanced, items,
                                                                                            strict=True)):  # fmt: skip
        raise InputError("indexing a tensor by a tensor or list is not supported")
    axis = 0
    for k, (a, i) in enumerate(zip(advanced, items, strict=True)):
        if i is Ellipsis:  # (by position: items.index would compare a tensor index with == first)
            axis = obj.ndim - sum(j is not None and j is not Ellipsis for j in items[k + 1 :])
        elif a:
            _in_range(i, obj.shape[axis], "indexing", negative=True)
        elif isinstance(i, int) and not -obj.shape[axis] <= i < obj.shape[axis]:
            raise InputError(f"index {i} is out of range for an axis of size {obj.shape[axis]}")
        axis += i is not None and i is not Ellipsis
    return obj.at[items].get(mode="fill", fill_value=_fill(obj)) if any(advanced) else obj[idx]


def _setitem(x, idx, value):
    # x[idx] = value (torch's index_put_ / copy_ into a view): the functional twin x.at[idx].set(value), value cast to
    # x's dtype and broadcast; basic indices as _getitem's, or one boolean mask of x's shape (x[mask] = value, a
    # number or one value per True entry is data-dependent: a number only). The gradient: 0 for the overwritten
    # entries of x, the read entries' gradient (summed over broadcast) for value, as torch's backward of index_put_.
    if isinstance(idx, jax.Array) and idx.dtype == bool:
        if idx.shape != x.shape or getattr(value, "ndim", 0):
            raise InputError("x[mask] = value needs a mask of x's shape and a number")
        return jnp.where(idx, jnp.asarray(value, x.dtype), x)
    if any(isinstance(i, (jax.Array, list)) for i in (idx if isinstance(idx, tuple) else (idx,))):
        raise InputError("x[index] = value with a tensor or list index is not supported")
    _getitem(x, idx)  # the index checks
    return x.at[idx].set(jnp.asarray(value).astype(x.dtype))


def _getattr(obj, name: str):
    # x.shape, x.ndim, x.dtype, x.T, x.mT; x.device is passed on as None (the arrays live on the trainer's device);
    # x.max(dim)'s .values / .indices
    if isinstance(obj, _MaxDim) and name in _MaxDim._fields:
        return getattr(obj, name)
    if name in ("shape", "ndim", "dtype"):
        return tuple(obj.shape) if name == "shape" else getattr(obj, name)
    if name in ("T", "mT"):  # x.T: the axes reversed (torch's, a transpose of a matrix); x.mT: the last two swapped
        return jnp.transpose(obj) if name == "T" else jnp.swapaxes(obj, -1, -2)
    if name == "device":
        return None
    raise InputError(f"attribute {name} of a tensor is not supported")


def _f_relu(x, inplace=False):  # inplace=True is refused when the graph is read (_INPLACE_AT)
    return jax.nn.relu(x)


def _f_leaky_relu(x, negative_slope=0.01, inplace=False):
    return _leaky_relu(x, negative_slope)


def _f_embedding(x, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    # F.embedding: rows of weight; a negative padding_idx counts from the end, as torch's
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise InputError("F.embedding with max_norm, scale_grad_by_freq or sparse is not supported")
    pad = padding_idx % weight.shape[0] if padding_idx is not None else None
    return _lookup(weight, x, pad, "op torch.nn.functional.embedding")


def _f_dropout(x, p=0.5, training=True, inplace=False):
    # F.dropout: the identity for training=False (self.training as traced: the trainer traces in training mode)
    return _dropout(x, p) if training else x


def _f_feature_dropout(ndim: int | None, alpha: bool = False, training: bool = True):
    def f(x, p=0.5, training=training, inplace=False):
        # F.dropout1d/2d/3d (channel-wise) and F.alpha_dropout (whose training defaults to False, as torch's)
        name = f"F.{'alpha_dropout' if alpha else f'dropout{ndim - 2}d'}"
        return _feature_dropout(name, x, p, ndim, alpha) if training else x

    return f


def _where3(condition, x=None, y=None):
    # torch.where(condition, x, y); the one-argument form (the indices of nonzero entries) has a data-dependent shape
    if x is None or y is None:
        raise InputError("torch.where(condition) without x and y is not supported")
    return jnp.where(condition, x, y)


def _filled(value):
    def f(*size, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False, out=None):
        # torch.zeros / torch.ones of a size given as integers or one sequence (x.shape); the default float dtype
        if out is not None:
            raise InputError("out= is not supported")
        return jnp.full(_dims(size), value, _jdtype(dtype or torch.get_default_dtype()))

    return f


def _full(size, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False, out=None):
    # torch.full: without dtype, bool for a bool fill value, int64 for an int, the default float dtype otherwise
    if out is not None:
        raise InputError("out= is not supported")
    if dtype is None:
        dtype = torch.bool if isinstance(fill_value, bool) else torch.int64 if isinstance(fill_value, int) else None
    return jnp.full(_dims((size,)), fill_value, _jdtype(dtype or torch.get_default_dtype()))


def _new_filled(value=None):
    def f(x, *size_and_fill, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
        # x.new_zeros(*size) / x.new_ones(*size) / x.new_full(size, fill_value): x's dtype unless dtype is given
        size, fill = (size_and_fill, value) if value is not None else size_and_fill
        return jnp.full(_dims(size), fill, x.dtype if dtype is None else _jdtype(dtype))

    return f


def _filled_like(value):
    def f(x, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None):
        return jnp.full(x.shape, value, x.dtype if dtype is None else _jdtype(dtype))  # torch.zeros_like / ones_like

    return f


def _clamp(x, min=None, max=None):
    # torch.clamp: max(x, min), then min(·, max) (min > max gives max everywhere, as torch); the gradient 1 where
    # min <= x <= max, 0 elsewhere (torch's clamp backward); jnp.clip would pass half of it at a tie
    x = x if min is None else jnp.where(x < min, jnp.asarray(min).astype(x.dtype), x)
    return x if max is None else jnp.where(x > max, jnp.asarray(max).astype(x.dtype), x)


def _expand(x, *sizes):
    # x.expand(*sizes): a view broadcasting size-1 axes (and new leading ones); -1 keeps an axis as it is
    sizes = _dims(sizes)
    new = len(sizes) - x.ndim
    return jnp.broadcast_to(x, tuple(x.shape[i - new] if s == -1 else s for i, s in enumerate(sizes)))


def _einsum(equation, *operands):
    # torch.einsum(equation, a, b, ...) or (equation, [a, b, ...]), full float32 precision (see PRECISION)
    operands = operands[0] if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else operands
    return jnp.einsum(equation, *operands, precision=PRECISION)


def _to(x, *args, **kwargs):
    # x.to(dtype) / x.to(dtype=...); x.to(x.device) (None here, see _getattr) keeps x as it is
    dtype = kwargs.pop("dtype", None)
    rest = [a for a in args if a is not None]
    if len(rest) == 1 and isinstance(rest[0], (torch.dtype, np.dtype)) and dtype is None:  # np: x.dtype in a graph
        dtype = rest[0]
    elif rest or set(kwargs) - {"non_blocking", "copy", "device"} or kwargs.get("device") is not None:
        raise InputError("x.to with a device or another tensor is not supported (a dtype only)")
    return x if dtype is None else x.astype(_jdtype(dtype))


def _floor_divide(a, b):
    # torch's floor division (torch.div(rounding_mode="floor"), torch.floor_divide, //). Integers: ⌊a/b⌋ as Python's
    # and NumPy's (torch's div_floor_integer). Floats: torch's div_floor_floating (c10/util/generic_math.h, Python's
    # float floor division): a/b when b = 0 (IEEE); else mod = fmod(a, b), div = (a − mod)/b, one less where mod ≠ 0
    # and mod's sign is not b's, then ⌊div⌋, one more where div − ⌊div⌋ > 0.5; ±0 (a/b's sign) where div = 0. Its
    # gradient is 0 for a and b (derivatives.yaml: div with a rounding_mode, floor_divide).
    if not isinstance(a, jax.Array) and not isinstance(b, jax.Array):
        return a // b  # traced sizes: Python's
    a, b = jnp.asarray(a), jnp.asarray(b)
    if not jnp.issubdtype(jnp.result_type(a, b), jnp.floating):
        return jnp.floor_divide(a, b)
    a, b = lax.stop_gradient(a), lax.stop_gradient(b)
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    fl = jnp.floor(div)
    fl = jnp.where(div - fl > 0.5, fl + 1, fl)
    fl = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), fl)
    return jnp.where(b == 0, a / b, fl)


def _div(x, other, *, rounding_mode=None):
    # torch.div / x.div: true division; rounding_mode "floor" (_floor_divide) or "trunc": the quotient rounded toward
    # zero (floats trunc(a/b), torch's div_trunc; integers C's truncating division), gradient 0 (derivatives.yaml)
    if rounding_mode is None:
        return x / other
    if rounding_mode == "floor":
        return _floor_divide(x, other)
    if rounding_mode != "trunc":
        raise InputError(f"div with rounding_mode={rounding_mode!r} is not supported (torch raises)")
    a, b = lax.stop_gradient(jnp.asarray(x)), lax.stop_gradient(jnp.asarray(other))
    if jnp.issubdtype(jnp.result_type(a, b), jnp.floating):
        return jnp.trunc(a / b)
    q = jnp.floor_divide(a, b)
    return jnp.where((q < 0) & (q * b != a), q + 1, q)


def _sign(x):
    # torch.sign: 1 for x > 0, −1 for x < 0, else 0 — also +0 for −0 and 0 for NaN (torch's sign kernel compares,
    # (0 < x) − (x < 0); jnp.sign keeps −0 and NaN); a bool stays itself; its gradient 0 everywhere (derivatives.yaml:
    # sign's is zeros_like(grad)), which comparisons give
    if x.dtype == bool:
        return x
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _axes(dims, what: str, ndim: int) -> tuple[int, ...]:
    # torch's dims argument (an int or a sequence) as a tuple; one axis named twice (1 and −3 of 4 axes too) is an
    # error in torch
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len({d % max(ndim, 1) for d in dims}) != len(dims):
        raise InputError(f"{what} names an axis twice in {dims} (torch raises)")
    return dims


def _flip(x, *dims):
    # torch.flip(x, dims) / x.flip(*dims): the entries in reverse order along each of dims (negative counted from the
    # end, as jnp.flip); the gradient flipped back
    axes = _axes(dims[0] if len(dims) == 1 and not isinstance(dims[0], int) else dims, "flip", x.ndim)
    return jnp.flip(x, axes) if axes else x


def _roll(x, shifts, dims=None):
    # torch.roll: entry i of an axis moves to (i + shift) mod size, shifts of any size and sign (jnp.roll's rule, the
    # same); without dims the flattened x rolled by one shift and reshaped; one shift per axis otherwise
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    if dims is None:
        if len(shifts) != 1:
            raise InputError(f"roll without dims takes one shift, not {len(shifts)} (torch raises)")
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    dims = _axes(dims, "roll", x.ndim)
    if len(dims) != len(shifts):
        raise InputError(f"roll with {len(shifts)} shifts for {len(dims)} dims (torch raises)")
    return jnp.roll(x, shifts, dims)


def _cumsum(x, dim, *, dtype=None, out=None):
    # torch.cumsum / x.cumsum: running sums along dim; integers and bools sum as int64 (torch's promotion), or dtype
    if out is not None:
        raise InputError("out= is not supported")
    if dtype is None and not jnp.issubdtype(x.dtype, jnp.floating):
        dtype = torch.int64
    return jnp.cumsum(x if dtype is None else x.astype(_jdtype(dtype)), axis=dim)


def _logsumexp(x, dim, keepdim=False, *, out=None):
    # torch.logsumexp: log Σ exp over dim (one or several axes), computed as m + log Σ exp(x − m), m the maximum held
    # constant (jax.scipy.special.logsumexp, as torch's kernel); its gradient exp(x − result), softmax (torch's
    # logsumexp_backward; NaN where the result is −∞, in both); integers as the default float dtype (torch's)
    if out is not None:
        raise InputError("out= is not supported")
    axes = _axes(dim, "logsumexp", x.ndim)
    if not axes:
        raise InputError("logsumexp over dim=() is not supported")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(_jdtype(torch.get_default_dtype()))
    return jax.scipy.special.logsumexp(x, axis=axes, keepdims=keepdim)


def _bmm(a, b, *, out=None):
    # torch.bmm: (B, n, m) @ (B, m, p), both 3-D with one batch size (torch raises otherwise; matmul would broadcast)
    if out is not None:
        raise InputError("out= is not supported")
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise InputError(f"bmm of shapes {tuple(a.shape)} and {tuple(b.shape)}: two 3-D batches of matrices that "
                         "multiply (torch raises)")  # fmt: skip
    return _matmul(a, b)


def _add_product(ndim: int):
    def f(x, m1, m2, *, beta=1, alpha=1, out=None):
        # torch.baddbmm (ndim 3) / torch.addmm (2): β·x + α·(m1 @ m2) (torch's documentation); β = 0 drops x, NaN and
        # ∞ too, as torch's (and its gradient to x)
        if out is not None:
            raise InputError("out= is not supported")
        if m1.ndim != ndim or m2.ndim != ndim:
            raise InputError(f"{'baddbmm' if ndim == 3 else 'addmm'} takes {ndim}-D matrices (torch raises)")
        prod = _bmm(m1, m2) if ndim == 3 else _matmul(m1, m2)
        prod = prod if alpha == 1 else alpha * prod
        return prod if beta == 0 else prod + (x if beta == 1 else beta * x)

    return f


def _pixel_shuffle(x, upscale_factor: int):
    # torch.nn.PixelShuffle (Shi et al. 2016, arXiv:1609.05158, Eq. 4, "periodic shuffling"): (*, C·r², H, W) ->
    # (*, C, H·r, W·r), out[..., c, h·r + i, w·r + j] = x[..., c·r² + i·r + j, h, w] (torch's pixel_shuffle: reshape
    # to (*, C, r, r, H, W), permute to (*, C, H, r, W, r))
    r = upscale_factor
    if x.ndim < 3 or x.shape[-3] % (r * r):
        raise InputError(f"pixel_shuffle of shape {tuple(x.shape)} by {r}: channels not divisible by {r * r} "
                         "(torch raises)")  # fmt: skip
    *lead, c, h, w = x.shape
    n = len(lead)
    y = x.reshape(*lead, c // (r * r), r, r, h, w)
    return jnp.transpose(y, (*range(n), n, n + 3, n + 1, n + 4, n + 2)).reshape(*lead, c // (r * r), h * r, w * r)


def _pixel_unshuffle(x, downscale_factor: int):
    # torch.nn.PixelUnshuffle: PixelShuffle's inverse, (*, C, H·r, W·r) -> (*, C·r², H, W)
    r = downscale_factor
    if x.ndim < 3 or x.shape[-1] % r or x.shape[-2] % r:
        raise InputError(f"pixel_unshuffle of shape {tuple(x.shape)} by {r}: height or width not divisible by {r} "
                         "(torch raises)")  # fmt: skip
    *lead, c, h, w = x.shape
    n = len(lead)
    y = x.reshape(*lead, c, h // r, r, w // r, r)
    return jnp.transpose(y, (*range(n), n, n + 2, n + 4, n + 1, n + 3)).reshape(*lead, c * r * r, h // r, w // r)


def _in_range(idx, size: int, what: str, negative: bool):
    # torch raises IndexError for an index outside the axis (index_select and gather also for a negative one; x[idx]
    # counts those from the end): checked where the indices are known (a constant, a buffer); under a trace they are
    # not, and the lookup fills NaN there (never another entry's value)
    if isinstance(idx, jax.core.Tracer):
        return
    i = np.asarray(idx)
    lo = -size if negative else 0
    if i.size and (i.min() < lo or i.max() >= size):
        bad = int(i.min()) if i.min() < lo else int(i.max())
        raise InputError(f"{what}: index {bad} is out of range for an axis of size {size} (torch raises)")


def _fill(x):
    # what a lookup outside the axis gives (see _in_range): NaN for floats, the dtype's default fill otherwise
    return jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else None


def _no_wrap(index, size: int):
    # index_select's and gather's negative indices (torch raises) moved outside the axis: JAX's take would count them
    # from the end
    return jnp.where(index < 0, size, index)


def _index_select(x, dim: int, index, *, out=None):
    # torch.index_select / x.index_select: the entries of x at the 1-D (or 0-D) integer index along dim, in its
    # order and repeats; the gradient scatter-added back (torch's index_select_backward: index_add)
    if out is not None:
        raise InputError("out= is not supported")
    if index.ndim > 1 or not jnp.issubdtype(index.dtype, jnp.integer):
        raise InputError("index_select takes a 1-D integer index (torch raises)")
    _in_range(index, x.shape[dim], "index_select", negative=False)
    return jnp.take(x, _no_wrap(index.reshape(-1), x.shape[dim]), axis=dim, mode="fill", fill_value=_fill(x))


def _gather(x, dim: int, index, *, sparse_grad=False, out=None):
    # torch.gather / x.gather: out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (torch's documentation), index of
    # x's number of axes and no larger than x on the others (x's leading part there is read); the gradient
    # scatter-added (torch's gather_backward: scatter_add)
    if out is not None:
        raise InputError("out= is not supported")
    if index.ndim != x.ndim or not jnp.issubdtype(index.dtype, jnp.integer):
        raise InputError("gather takes an integer index of the input's number of axes (torch raises)")
    dim = dim % x.ndim
    if any(index.shape[d] > x.shape[d] for d in range(x.ndim) if d != dim):
        raise InputError(f"gather index of shape {tuple(index.shape)} is larger than the input {tuple(x.shape)} "
                         f"outside dim {dim} (torch raises)")  # fmt: skip
    _in_range(index, x.shape[dim], "gather", negative=False)
    x = x[tuple(slice(None) if d == dim else slice(0, index.shape[d]) for d in range(x.ndim))]
    return jnp.take_along_axis(x, _no_wrap(index, x.shape[dim]), axis=dim, mode="fill", fill_value=_fill(x))


_matmul = partial(jnp.matmul, precision=PRECISION)
_mean = _reduce(jnp.mean)
_sum = _reduce(jnp.sum)

# torch functions and Python operators the graph may call (call_function), each with its JAX equivalent
# (same values and gradients up to float rounding), taking torch's arguments
_FX_FUNCTIONS: dict[Any, Callable] = {
    operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
    operator.truediv: operator.truediv, operator.neg: operator.neg, operator.pow: operator.pow,
    operator.invert: jnp.invert, operator.and_: operator.and_, operator.or_: operator.or_,  # & | (boolean masks)
    operator.matmul: _matmul, operator.getitem: _getitem, getattr: _getattr,
    operator.eq: operator.eq, operator.ne: operator.ne, operator.lt: operator.lt, operator.le: operator.le,
    operator.gt: operator.gt, operator.ge: operator.ge,
    operator.floordiv: _floor_divide,  # C // n_head of traced sizes; floor division of tensors, as torch's //
    math.sqrt: math.sqrt,  # 1 / math.sqrt(k.size(-1)): a traced size is a Python int in the JAX graph
    torch.add: lambda x, other, alpha=1: x + alpha * other if alpha != 1 else x + other,
    torch.mul: lambda x, other: x * other, torch.matmul: _matmul,
    torch.cat: lambda tensors, dim=0: jnp.concatenate(tensors, axis=dim),
    torch.flatten: lambda x, start_dim=0, end_dim=-1: _flatten(x, start_dim, end_dim),
    torch.transpose: lambda x, dim0, dim1: jnp.swapaxes(x, dim0, dim1),
    torch.arange: _arange, torch.softmax: _softmax, F.softmax: _softmax,
    torch.mean: _mean, torch.sum: _sum, torch.tanh: jnp.tanh, torch.relu: jax.nn.relu,
    F.relu: _f_relu,
    F.gelu: lambda x, approximate="none": jax.nn.gelu(x, approximate=approximate == "tanh"),
    F.leaky_relu: _f_leaky_relu,
    F.linear: lambda x, weight, bias=None: _affine_map(x, weight, bias),
    F.layer_norm: _layer_norm, F.scaled_dot_product_attention: _sdpa,
    torch.sigmoid: jax.nn.sigmoid, torch.exp: jnp.exp, torch.where: _where3,
    torch.clamp: _clamp, torch.stack: lambda tensors, dim=0: jnp.stack(tensors, axis=dim), torch.pow: operator.pow,
    torch.sqrt: jnp.sqrt, torch.rsqrt: lax.rsqrt, torch.einsum: _einsum,
    F.silu: lambda x, inplace=False: jax.nn.silu(x),
    torch.zeros: _filled(0), torch.ones: _filled(1), torch.full: _full,
    torch.triu: lambda x, diagonal=0: jnp.triu(x, diagonal), torch.tril: lambda x, diagonal=0: jnp.tril(x, diagonal),
    torch.zeros_like: _filled_like(0), torch.ones_like: _filled_like(1),
    F.embedding: _f_embedding, F.dropout: _f_dropout,
    torch.split: _split, F.pad: _f_pad, torch.norm: _p_norm, torch.amax: _amax, torch.max: _max, torch.amin: _amin,
    torch.min: _min,
    torch.log_softmax: _log_softmax, F.log_softmax: _log_softmax, F.normalize: _f_normalize,
    torch.linalg.vector_norm: _vector_norm, torch.var: _var, torch.std: _std, torch.var_mean: _with_mean(_var),
    torch.std_mean: _with_mean(_std), torch.chunk: _chunk, torch.squeeze: _squeeze,
    F.hardswish: lambda x, inplace=False: _hardswish(x), F.max_pool2d: _f_max_pool(2), F.avg_pool2d: _f_avg_pool(2),
    F.adaptive_avg_pool2d: _f_adaptive(2, True), F.max_pool1d: _f_max_pool(1), F.avg_pool1d: _f_avg_pool(1),
    F.adaptive_avg_pool1d: _f_adaptive(1, True), F.adaptive_max_pool1d: _f_adaptive(1, False),
    F.adaptive_max_pool2d: _f_adaptive(2, False), F.interpolate: _interpolate,
    F.softplus: _softplus, F.mish: lambda x, inplace=False: _mish(x), F.selu: lambda x, inplace=False: jax.nn.selu(x),
    F.celu: lambda x, alpha=1.0, inplace=False: jax.nn.celu(x, alpha),
    F.elu: lambda x, alpha=1.0, inplace=False: jax.nn.elu(x, alpha), F.softsign: lambda x: x / (1 + _abs(x)),
    F.logsigmoid: jax.nn.log_sigmoid, F.hardsigmoid: lambda x, inplace=False: _hardsigmoid(x),
    F.tanhshrink: lambda x: x - jnp.tanh(x), F.glu: _glu,
    F.softmin: lambda x, dim=None, _stacklevel=3, dtype=None: _softmax(-x, dim, dtype=dtype),
    torch.div: _div, torch.floor_divide: _floor_divide, torch.clone: lambda x, memory_format=None: x,
    F.relu6: lambda x, inplace=False: _hardtanh(x, 0.0, 6.0),
    F.hardtanh: lambda x, min_val=-1.0, max_val=1.0, inplace=False: _hardtanh(x, min_val, max_val),
    torch.abs: _abs, torch.log: jnp.log,
    F.dropout1d: _f_feature_dropout(3), F.dropout2d: _f_feature_dropout(4), F.dropout3d: _f_feature_dropout(5),
    F.alpha_dropout: _f_feature_dropout(None, alpha=True, training=False),
    # thirteenth session: flip, roll, cumsum, sign, erf (exact GELU written out), logsumexp, bmm & co, pixel
    # shuffles, instance norm, tensor indices' twins index_select and gather
    torch.flip: _flip, torch.roll: _roll, torch.cumsum: _cumsum, torch.sign: _sign,
    torch.erf: jax.scipy.special.erf,  # 2/√π ∫₀ˣ e^(−t²) dt; its gradient 2/√π e^(−x²), torch's erf backward
    torch.logsumexp: _logsumexp, torch.bmm: _bmm, torch.baddbmm: _add_product(3), torch.addmm: _add_product(2),
    F.pixel_shuffle: _pixel_shuffle, F.pixel_unshuffle: _pixel_unshuffle, F.instance_norm: _f_instance_norm,
    torch.index_select: _index_select, torch.gather: _gather,
}  # fmt: skip


# In-place ops (x.add_(y), out += identity, nn.ReLU(inplace=True), F.relu(x, inplace=True), `out.relu_()` as a
# statement): torch overwrites the first argument and returns it. The JAX graph is pure: each runs as its functional
# twin, and a later node reading the overwritten tensor under its older node (the name it had before, fx records the
# old node) reads the newest node of that tensor instead (_in_place_reads), which is torch's value. Reading it
# through another tensor sharing its memory (a view taken before, or the tensor a view was taken from), or
# overwriting the model's input, a parameter or a buffer is refused. The twin keeps the first argument's dtype, as
# torch's in-place ops (their result is cast to self's dtype).
def _inplace(fn):
    def f(x, *args, **kwargs):
        out = fn(x, *args, **kwargs)
        return out.astype(x.dtype) if hasattr(x, "dtype") and hasattr(out, "astype") else out  # ints: sizes

    return f


# the position of the inplace argument of the functions that have one
_TORCH_DROPOUTS = (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout)  # torch's, for the checks
_INPLACE_AT = {F.relu: 1, F.leaky_relu: 2, F.silu: 1, F.dropout: 3, F.dropout1d: 3, F.dropout2d: 3, F.dropout3d: 3,
               F.alpha_dropout: 3, F.hardswish: 1, F.relu6: 1, F.hardtanh: 3, F.mish: 1, F.selu: 1, F.celu: 2,
               F.elu: 2, F.hardsigmoid: 1}  # fmt: skip
_IN_PLACE_OPERATORS = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                       operator.itruediv: operator.truediv}  # fmt: skip
for _op, _twin in _IN_PLACE_OPERATORS.items():
    _FX_FUNCTIONS[_op] = _inplace(_twin)
_FX_FUNCTIONS[torch.relu_] = _inplace(jax.nn.relu)  # also F.relu_ (the same function)
_FX_FUNCTIONS[operator.setitem] = _setitem  # x[idx] = value: in place on x (_traced_in_place_operators)

# tensor methods the graph may call (call_method), likewise
_FX_METHODS: dict[str, Callable] = {
    "view": lambda x, *shape: x.reshape(_dims(shape)), "reshape": lambda x, *shape: x.reshape(_dims(shape)),
    "permute": lambda x, *dims: jnp.transpose(x, _dims(dims)),
    "transpose": lambda x, dim0, dim1: jnp.swapaxes(x, dim0, dim1),
    "flatten": lambda x, start_dim=0, end_dim=-1: _flatten(x, start_dim, end_dim),
    "size": lambda x, dim=None: tuple(x.shape) if dim is None else x.shape[dim],
    "mean": _mean, "sum": _sum, "softmax": _softmax, "chunk": _chunk,
    "unsqueeze": lambda x, dim: jnp.expand_dims(x, dim), "contiguous": lambda x: x,
    "clone": lambda x, memory_format=None: x,  # a copy: not a view (_ALIAS_METHODS), so its overwrite is its own
    "masked_fill": lambda x, mask, value: jnp.where(mask, jnp.asarray(value, x.dtype), x),
    "long": lambda x: x.astype(_jdtype(torch.int64)), "relu": jax.nn.relu, "tanh": jnp.tanh,
    "float": lambda x: x.astype(np.float32), "double": lambda x: x.astype(_jdtype(torch.float64)), "to": _to,
    "sigmoid": jax.nn.sigmoid, "exp": jnp.exp,
    "new_zeros": _new_filled(0), "new_ones": _new_filled(1), "new_full": _new_filled(),
    "triu": lambda x, diagonal=0: jnp.triu(x, diagonal), "tril": lambda x, diagonal=0: jnp.tril(x, diagonal),
    "clamp": _clamp, "clamp_min": lambda x, min: _clamp(x, min), "expand": _expand,
    "repeat": lambda x, *sizes: jnp.tile(x, _dims(sizes)),  # torch's x.repeat is NumPy's tile
    "pow": operator.pow, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "type_as": lambda x, other: x.astype(other.dtype),
    "matmul": _matmul, "mul": operator.mul, "add": _FX_FUNCTIONS[torch.add],
    "split": _split, "norm": _p_norm, "amax": _amax, "max": _max, "amin": _amin, "min": _min,
    "sub": operator.sub, "div": _div, "log_softmax": _log_softmax, "var": _var, "std": _std, "squeeze": _squeeze,
    "abs": _abs, "log": jnp.log, "floor_divide": _floor_divide,
    "flip": _flip, "roll": _roll, "cumsum": _cumsum, "sign": _sign, "erf": jax.scipy.special.erf,
    "logsumexp": _logsumexp, "bmm": _bmm, "index_select": _index_select, "gather": _gather,
}  # fmt: skip
# x.add_(y) & co: the functional method in place (see _inplace)
_FX_METHODS |= {
    f"{name}_": _inplace(_FX_METHODS[name])
    for name in ("add", "sub", "mul", "div", "relu", "clamp", "clamp_min", "masked_fill", "sigmoid", "tanh", "exp",
                 "pow", "sqrt", "rsqrt", "tril", "triu")
}  # fmt: skip

# ops refused with their reason rather than "not supported". Random draws: torch draws fresh values at every
# forward call (DP-SGD stays valid with a random forward: the clipped gradient's norm is bounded for every draw), but
# a JAX graph has no generator state: the backend threads a key per step and per record to the dropout sites only
# (_dropout); running a fixed draw (or none) for these would train another model than torch's.
_RANDOM = "draws random numbers at every call in torch; the JAX backend draws none in a model's forward"
_REFUSED_OPS: dict[Any, str] = {
    **dict.fromkeys(
        (torch.randn, torch.rand, torch.randint, torch.randn_like, torch.rand_like, torch.randint_like,
         torch.bernoulli, torch.normal, torch.multinomial, torch.randperm, torch.poisson,
         F.feature_alpha_dropout, F.rrelu),
        _RANDOM,
    ),
    **dict.fromkeys(
        ("normal_", "uniform_", "bernoulli_", "bernoulli", "random_", "exponential_", "geometric_", "cauchy_",
         "log_normal_", "multinomial"),
        _RANDOM,
    ),
    torch.empty: "gives uninitialized memory (its values are whatever the allocator held); use torch.zeros",
    torch.empty_like: "gives uninitialized memory (its values are whatever the allocator held); use torch.zeros_like",
    "new_empty": "gives uninitialized memory (its values are whatever the allocator held); use x.new_zeros",
}  # fmt: skip

FX_OPS = (
    "+ - * / // ** @ ~ & | == != < <= > >= += -= *= /=, indexing, math.sqrt of a size, "
    "torch.add/mul/matmul/cat/flatten/transpose/arange/softmax/log_softmax/mean/sum/var/std/var_mean/std_mean/"
    "tanh/relu/relu_/sigmoid/exp/log/abs/where/zeros/ones/full/zeros_like/ones_like/triu/tril/clamp/stack/pow/sqrt/rsqrt/"
    "div(rounding_mode)/floor_divide/flip/roll/cumsum/sign/erf/logsumexp/bmm/baddbmm/addmm/index_select/gather/"
    "einsum/split/chunk/squeeze/norm(p=1,2,inf)/linalg.vector_norm/amax/amin/max/min "
    "(sizes may be x.size(i), x.shape[i]), "
    "F.relu/relu6/hardtanh/gelu/leaky_relu/silu/hardswish/mish/softplus/selu/celu/elu/softsign/logsigmoid/hardsigmoid/"
    "tanhshrink/glu/softmin/max_pool1d/max_pool2d/avg_pool1d/avg_pool2d/adaptive_avg_pool1d/adaptive_avg_pool2d/"
    "adaptive_max_pool1d/adaptive_max_pool2d/interpolate/linear/softmax/log_softmax/normalize/layer_norm/"
    "instance_norm/pixel_shuffle/pixel_unshuffle/"
    "scaled_dot_product_attention/embedding/dropout/dropout1d/dropout2d/dropout3d/alpha_dropout/"
    "pad(constant, reflect, replicate, circular), "
    "x.view/reshape/permute/transpose/flatten/size/shape/mean/sum/var/std/softmax/log_softmax/chunk/unsqueeze/squeeze/"
    "contiguous/long/float/double/to(dtype)/sigmoid/exp/log/abs/masked_fill/new_zeros/new_ones/new_full/triu/tril/clamp/"
    "clamp_min/expand/repeat/pow/sqrt/rsqrt/type_as/matmul/mul/add/sub/div/floor_divide/clone/split/norm/amax/amin/max/"
    "min(.values, .indices)/flip/roll/cumsum/sign/erf/logsumexp/bmm/index_select/gather, x[integer tensor or list], "
    "x[index] = value, in place (inplace=True, x.add_/sub_/mul_/div_/relu_/clamp_/"
    "masked_fill_/... where no later op reads the overwritten value under another name), "
    "nn.MultiheadAttention (output[0]; no bias_kv or kdim/vdim), "
    "nn.TransformerEncoderLayer, nn.TransformerDecoderLayer (relu or gelu), nn.TransformerEncoder and "
    "nn.TransformerDecoder of them, nn.Transformer"
)


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return f"x.{node.target}"
    t = node.target
    module = (getattr(t, "__module__", None) or "builtins").replace("_operator", "operator")
    return f"{module}.{getattr(t, '__name__', t)}"


def _where(node: torch.fx.Node) -> str:
    # the module whose forward the op is in (fx's nn_module_stack), or the model's own forward
    stack = node.meta.get("nn_module_stack") or {}
    return f"in {next(reversed(stack.values()))[0]}" if stack else "in the model's forward"


class _InPlaceRefusal(InputError):
    """A refusal of :func:`_in_place_reads` found when the graph runs (its message names the ops)."""


class FxModel:
    """A module's ``torch.fx`` graph run in JAX: ``model(params, x) -> logits``. ``steps``: per graph node
    (in order) its name, a description for errors and a function (params, values so far) -> its value."""

    def __init__(
        self, steps: list[tuple[str, str, Callable]], output: Any, dropout: bool = False, ghost: tuple = ()
    ) -> None:
        # dropout: the graph may draw dropout masks (the trainer then passes keys: apply(params, x, key))
        # ghost: the _FxGhost groups fx_ghost_clipped_sum taps (weights of Linear, Conv2d, Embedding modules, tied
        # ones included, read by those modules' calls alone; linear maps inside attention/transformer layers); () when
        # none
        self.steps, self.output, self.dropout, self.ghost_groups = steps, output, dropout, ghost

    def __call__(self, params: Params, x, key=None, tap: Callable | None = None):
        """The logits; ``tap(node name, layer input, layer output) -> output``, when given, is called on the output
        of every node of :attr:`ghost_groups` (what fx_ghost_clipped_sum records and adds its zero taps to), and, as
        ``tap("node:path", input, output)``, on every linear map inside a node's layer (:func:`_sub_tap`)."""
        env: dict[str, Any] = {"": x}
        taps = {n: i for g in self.ghost_groups for n, i in zip(g.nodes, g.inputs, strict=True) if i} if tap else {}
        sub = [tap, ""]
        with _dropout_key(key), _sub_taps(sub if tap else None):
            for name, what, f in self.steps:
                try:
                    sub[1] = name
                    env[name] = f(params, env)
                    if name in taps:
                        env[name] = tap(name, env[taps[name]], env[name])
                except _InPlaceRefusal as e:
                    raise _unsupported(str(e)) from None
                except InputError as e:
                    raise _unsupported(f"{what}: {e}") from None
                except (TypeError, ValueError, IndexError) as e:  # torch arguments JAX cannot take
                    raise _unsupported(f"{what}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        return torch.fx.node.map_arg(self.output, lambda n: env[n.name])


_SIZED = ("zeros", "ones")  # the torch factories of the graph ops taking sizes as separate arguments


@contextmanager
def _traced_sizes():
    """torch.zeros(B, 3) with B a traced size (x.size(0), x.shape[0]): torch's argument parser takes separate sizes
    as ints only and raises TypeError before torch.fx sees the call; while tracing, such a call is made as
    torch.zeros((B, 3)), which torch defines alike and fx records (a node of torch.zeros itself)."""

    def one_tuple(fn):
        @wraps(fn)
        def f(*size, **kwargs):
            if len(size) > 1 and any(isinstance(s, torch.fx.Proxy) for s in size):
                return fn(size, **kwargs)
            return fn(*size, **kwargs)

        return f

    originals = {n: getattr(torch, n) for n in _SIZED}
    try:
        for n, fn in originals.items():
            setattr(torch, n, one_tuple(fn))
        yield
    finally:
        for n, fn in originals.items():
            setattr(torch, n, fn)


@contextmanager
def _traced_in_place_operators():
    """``out += identity`` on a traced tensor: fx's Proxy defines no ``__iadd__``, so Python runs ``out = out +
    identity`` and the graph would not record that torch overwrote ``out`` (which another name may still read). While
    tracing, ``+= -= *= /=`` on a Proxy record operator.iadd & co, which :func:`_in_place_reads` follows; likewise
    ``x[idx] = value`` (fx's Proxy has no ``__setitem__``: "'Proxy' object does not support item assignment")
    records operator.setitem, an in-place op on x."""
    names = {"__iadd__": operator.iadd, "__isub__": operator.isub, "__imul__": operator.imul,
             "__itruediv__": operator.itruediv}  # fmt: skip

    def record(fn):
        return lambda self, other: self.tracer.create_proxy("call_function", fn, (self, other), {})

    def setitem(self, idx, value):
        self.tracer.create_proxy("call_function", operator.setitem, (self, idx, value), {})

    added = [n for n in (*names, "__setitem__") if n not in vars(torch.fx.Proxy)]
    try:
        for n in added:
            setattr(torch.fx.Proxy, n, setitem if n == "__setitem__" else record(names[n]))
        yield
    finally:
        for n in added:
            delattr(torch.fx.Proxy, n)


# ops whose result may be (a view of) their first argument: torch's views (view, reshape, transpose, indexing, ...),
# ops returning the input itself (contiguous, to(its dtype), dropout at p = 0 or in eval mode, nn.Identity), and the
# in-place ops, which return what they overwrote
_ALIAS_METHODS = {"view", "reshape", "permute", "transpose", "flatten", "unsqueeze", "squeeze", "contiguous",
                  "expand", "chunk", "split", "to", "float", "double", "long", "type_as", "view_as", "narrow", "t",
                  "detach", "unbind"}  # fmt: skip
_ALIAS_FUNCTIONS = {operator.getitem, torch.flatten, torch.transpose, torch.split, torch.chunk, torch.reshape,
                    torch.squeeze, torch.unsqueeze, torch.permute, *_TORCH_DROPOUTS}  # fmt: skip
_ALIAS_MODULES = (nn.Identity, nn.Flatten, nn.modules.dropout._DropoutNd)


def _in_place(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``node`` overwrites its first argument in torch (see _inplace)."""
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.startswith("_")
    if node.op == "call_module":
        return getattr(gm.get_submodule(node.target), "inplace", False) is True
    if node.op != "call_function" or not _hashable(node.target):
        return False
    if node.target in _IN_PLACE_OPERATORS or node.target in (torch.relu_, operator.setitem):
        return True
    at = _INPLACE_AT.get(node.target)
    return at is not None and (node.kwargs.get("inplace") is True or (at < len(node.args) and node.args[at] is True))


def _in_place_reads(gm: torch.fx.GraphModule, describe: Callable) -> tuple[dict, dict]:
    """What torch's in-place ops change in the graph's reads: ``(moved, refused)``. ``moved``: {reader: {input:
    (the newest node of the input's tensor, deferred)}}, the inputs a node reads after an in-place op overwrote their
    tensor (an in-place node IS its first argument's tensor: its node is that tensor's newest). ``refused``: {node:
    (why, deferred, the overwritten node)} where the graph cannot give torch's values: a tensor sharing the
    overwritten one's memory (views and ops that may return their input: _ALIAS_*) read afterwards, or the model's
    input, a parameter or a buffer overwritten (torch's change outlives the call). deferred: the overwrite is a
    Proxy's ``+=`` & co, which also record ``n += 1`` on a traced size, an int that nothing overwrites: the run
    applies these only where the overwritten value is a tensor."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    base: dict[torch.fx.Node, torch.fx.Node] = {}  # the node whose memory a node's tensor may share
    tensor: dict[torch.fx.Node, torch.fx.Node] = {}  # the node that made a node's tensor (itself, or what it overwrote)
    newest: dict[torch.fx.Node, torch.fx.Node] = {}
    writes: list[torch.fx.Node] = []
    moved: dict[torch.fx.Node, dict] = {}
    refused: dict[torch.fx.Node, tuple] = {}
    for n in nodes:
        first = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
        in_place = first is not None and _in_place(gm, n)
        for i in n.all_input_nodes:
            for w in writes:
                if base[w] is not base[i] or order[i] >= order[w]:
                    continue
                deferred = w.op == "call_function" and w.target in _IN_PLACE_OPERATORS
                if tensor[w] is tensor[i]:
                    moved.setdefault(n, {})[i] = (newest[tensor[i]], deferred)
                else:
                    why = (
                        f"{describe(w)} overwrites {w.args[0].name} in place, which {describe(n)} reads afterwards "
                        "through another tensor sharing its memory (torch reads the overwritten values there)"
                    )
                    refused.setdefault(n, (why, deferred, w.args[0]))
        aliasing = in_place or (
            (n.op == "call_method" and n.target in _ALIAS_METHODS)
            or (n.op == "call_function" and _hashable(n.target) and n.target in _ALIAS_FUNCTIONS)
            or (n.op == "call_module" and isinstance(gm.get_submodule(n.target), _ALIAS_MODULES))
        )
        base[n] = base[first] if first is not None and aliasing else n
        tensor[n] = tensor[first] if in_place else n
        if in_place:
            deferred = n.op == "call_function" and n.target in _IN_PLACE_OPERATORS
            if base[n].op == "placeholder":
                refused[n] = (f"{describe(n)} overwrites the model's input in place", deferred, first)
            elif base[n].op == "get_attr":
                why = f"{describe(n)} overwrites {base[n].target} in place (torch keeps the change after the call)"
                refused[n] = (why, deferred, first)
            writes.append(n)
            newest[tensor[n]] = n
    return moved, refused


class _RefusedCall(Exception):
    """Raised while tracing by a torch function of :data:`_REFUSED_OPS`: args (its name, the reason)."""


@contextmanager
def _refused_while_tracing():
    """While tracing, the functions and tensor methods of :data:`_REFUSED_OPS` raise :class:`_RefusedCall`, whatever
    their arguments: called on constants (``torch.randn(16)``, ``torch.zeros(4).normal_()``) they would run once, at
    trace time, and fx would keep that one draw (or uninitialized memory) in the graph as a constant tensor, where
    torch draws a fresh one at every call. Called on traced values they are refused by the graph's reading too."""

    def refuse(what, why):
        def f(*args, **kwargs):
            raise _RefusedCall(what, why)

        return f

    homes = ((torch, "torch"), (F, "torch.nn.functional"))
    patched = [
        (home, f.__name__, f"{label}.{f.__name__}", why)
        for f, why in _REFUSED_OPS.items()
        if not isinstance(f, str)
        for home, label in homes
        if getattr(home, f.__name__, None) is f
    ]
    patched += [(torch.Tensor, m, f"x.{m}", why) for m, why in _REFUSED_OPS.items() if isinstance(m, str)]
    # (owner, name, the original, whether the owner itself held it): a Tensor method inherited from TensorBase is
    # deleted again afterwards, not copied into Tensor
    originals = [(owner, name, getattr(owner, name), name in vars(owner)) for owner, name, _, _ in patched]
    try:
        for owner, name, what, why in patched:
            setattr(owner, name, refuse(what, why))
        yield
    finally:
        for owner, name, fn, own in originals:
            if own:
                setattr(owner, name, fn)
            else:
                delattr(owner, name)


def _fx_model(model: nn.Module, owner: dict[int, str]) -> FxModel:
    """Trace ``model`` with a ``torch.fx`` Tracer (``symbolic_trace``'s, buffers proxied too) and map every node
    to JAX: call_module -> :func:`_layer` (its parameters read under their first names, so a tied parameter is
    one array and its gradient the sum of both uses, as torch's), call_function / call_method ->
    :data:`_FX_FUNCTIONS` / :data:`_FX_METHODS`, get_attr -> the parameter (or a constant buffer), one
    placeholder -> the input."""
    tracer = torch.fx.Tracer()
    tracer.proxy_buffer_attributes = True  # a buffer (a causal mask) as a get_attr node, so that it can be sliced
    try:
        with _traced_sizes(), _refused_while_tracing(), _traced_in_place_operators():
            graph = tracer.trace(model)
        gm = torch.fx.GraphModule(tracer.root, graph)
    except _RefusedCall as e:
        what, why = e.args
        raise _unsupported(f"op {what} in the forward of model {type(model).__name__} {why}") from None
    except Exception as e:  # data-dependent control flow, unsupported Python on a traced value, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _unsupported(f"torch.fx cannot trace model {type(model).__name__} ({first})") from None
    steps, read, output = [], set(), None
    # {parameter: the nodes reading it}, {Linear/Conv2d/Embedding module: its (node, input node) calls}
    readers: dict[str, set[str]] = {}
    uses: dict[str, list[tuple[str, str]]] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]

    def describe(node):
        if node.op == "call_module":
            return f"layer {node.target} ({type(gm.get_submodule(node.target)).__name__})"
        return "the output" if node.op == "output" else f"op {_op_name(node)} {_where(node)}"

    moved, refused = _in_place_reads(gm, describe)
    if why := next((w for w, deferred, _ in refused.values() if not deferred), None):
        raise _unsupported(why)

    def value(node):
        def read(env, a):  # a's value, or the newest value of its tensor after an in-place op (_in_place_reads)
            m = moved.get(node, {}).get(a)
            return env[a.name] if m is None or (m[1] and isinstance(env[a.name], (int, float))) else env[m[0].name]

        def args(p, env):
            # a deferred refusal (a Proxy's +=) applies where the overwritten value is a tensor, not a traced size
            if (r := refused.get(node)) and not isinstance(env[r[2].name], (int, float)):
                raise _InPlaceRefusal(r[0])
            return torch.fx.node.map_arg(node.args, partial(read, env)), torch.fx.node.map_arg(
                node.kwargs, partial(read, env)
            )

        return args

    for node in gm.graph.nodes:
        args = value(node)
        if node.op == "placeholder":
            if node is placeholders[0]:
                steps.append((node.name, "the input", lambda p, env: env[""]))
            elif node.args:  # an optional argument of forward, at its default
                steps.append((node.name, f"argument {node.target}", lambda p, env, v=node.args[0]: v))
            else:
                raise _unsupported(f"forward of model {type(model).__name__} takes more than one input")
        elif node.op == "get_attr":
            obj = _fx_attr(gm, node.target)
            if isinstance(obj, nn.Parameter):
                read.add(owner[id(obj)])
                readers.setdefault(owner[id(obj)], set()).add(node.name)
                steps.append((node.name, node.target, lambda p, env, n=owner[id(obj)]: p[n]))
            elif isinstance(obj, torch.Tensor):
                steps.append((node.name, node.target, lambda p, env, c=obj.detach().cpu().numpy(): jnp.asarray(c)))
            else:
                raise _unsupported(f"attribute {node.target} ({type(obj).__name__}) is not a tensor")
        elif node.op == "call_module":
            m = gm.get_submodule(node.target)
            if isinstance(m, nn.MultiheadAttention):  # (output, weights): only output[0] may be read
                f = _mha(node.target, m)
                weights = (u for u in node.users if u.target is not operator.getitem or u.args[1] != 0)
                if any(u.users or u.target is not operator.getitem for u in weights):
                    raise _unsupported(f"layer {node.target} (MultiheadAttention): its attention weights are read")
            elif translate := next((t for k, t in _TRANSFORMER_PARTS.items() if isinstance(m, k)), None):
                f = translate(node.target, m)  # which checks a subclass for a forward of its own
            else:
                one = _layer(node.target, m)

                def f(p, x, one=one):  # a layer of one input
                    return one(p, x)

            names = {n: owner[id(q)] for n, q in m.named_parameters(prefix=node.target, remove_duplicate=False)}
            read.update(names.values())
            for c in names.values():
                readers.setdefault(c, set()).add(node.name)
            if isinstance(m, (nn.MultiheadAttention, *_TRANSFORMER_PARTS)):  # linear maps inside: sub-taps
                uses.setdefault(node.target, []).append((node.name, None))
            if isinstance(m, _GHOSTED) and _ghostable(m) and len(node.args) == 1 and not node.kwargs:
                if isinstance(node.args[0], torch.fx.Node):  # a layer of one traced input: fx_ghost_clipped_sum taps it
                    uses.setdefault(node.target, []).append((node.name, node.args[0].name))

            def run(p, env, f=f, names=names, args=args):
                a, kw = args(p, env)
                return f({n: p[c] for n, c in names.items()}, *a, **kw)

            steps.append((node.name, f"layer {node.target} ({type(m).__name__})", run))
        elif node.op in ("call_function", "call_method"):
            table = _FX_FUNCTIONS if node.op == "call_function" else _FX_METHODS
            fn = table.get(node.target) if node.op == "call_method" or _hashable(node.target) else None
            what = f"op {_op_name(node)} {_where(node)}"
            if why := _REFUSED_OPS.get(node.target if _hashable(node.target) else None):
                raise _unsupported(f"{what} {why}")
            if fn is None:
                raise _unsupported(f"{what} is not supported")

            def call(p, env, fn=fn, args=args):
                a, kw = args(p, env)
                return fn(*a, **kw)

            steps.append((node.name, what, call))
        else:  # output (a tensor: its reads moved by in-place ops are applied, deferred or not)
            if refused.get(node):
                raise _unsupported(refused[node][0])
            output = torch.fx.node.map_arg(node.args[0], lambda a, m=moved.get(node, {}): m[a][0] if a in m else a)
    if unread := next((n for n in owner.values() if n not in read), None):
        raise _unsupported(f"parameter {unread} is read by no op of the traced graph")
    dropout = any(
        (n.op == "call_module" and _has_dropout(gm.get_submodule(n.target)))
        or (n.op == "call_function" and n.target in (*_TORCH_DROPOUTS, F.scaled_dot_product_attention))
        for n in gm.graph.nodes
    )
    return FxModel(steps, output, dropout, _fx_ghost_groups(gm, owner, readers, uses))


def _hashable(target) -> bool:
    try:
        hash(target)
    except TypeError:
        return False
    return True


def _fx_attr(gm: torch.fx.GraphModule, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


@contextmanager
def _torch_dropout_off():
    """torch's dropout as in eval mode (the identity) while the rest of the model stays in training mode: F.dropout
    (nn.Dropout's, a user's forward's, MultiheadAttention's attention weights with need_weights), F.dropout1d/2d/3d and
    F.alpha_dropout (their modules') and the dropout_p of F.scaled_dot_product_attention (MultiheadAttention's fast
    attention, a user's call) patched for the call, as torch.nn.functional's own module globals are what its
    functions call."""
    originals = {f.__name__: f for f in _TORCH_DROPOUTS}
    sdpa = F.scaled_dot_product_attention

    def no_dropout(input, p=0.5, training=True, inplace=False):
        return input

    def sdpa_no_dropout(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs):
        return sdpa(query, key, value, attn_mask, 0.0, *args, **kwargs)

    try:
        for name in originals:
            setattr(F, name, no_dropout)
        F.scaled_dot_product_attention = sdpa_no_dropout
        yield
    finally:
        for name, f in originals.items():
            setattr(F, name, f)
        F.scaled_dot_product_attention = sdpa


def check_same_logits(model: nn.Module, apply: Apply, params: Params, x: torch.Tensor, xj) -> None:
    """Refuse, in one line, a model whose JAX forward pass gives other logits than torch's on the records
    ``x`` (``xj`` the same in JAX), in training mode with dropout off on both sides (``apply`` without a key, torch
    under :func:`_torch_dropout_off`: no mask to compare, the translation of the dropout sites is checked by the
    tests against torch with the same masks): the backstop for anything in a user's module that
    :func:`jax_forward` did not see (a layer's forward replaced in a way no check above knows), which would
    otherwise train another function than the one saved. The two differ by rounding only when the function
    is the same; the tolerance √eps·(1 + max|z|) (3.5e-4 relative in float32) is far above that for the
    forward passes here and far below the O(1) change of a missing or different layer."""
    dtype = next(model.parameters()).dtype
    # no TF32 in torch's pass (cuDNN's default on a GPU: ~1e-3 relative), as JAX's side (PRECISION)
    # training mode, as the torch trainers train (dpsgd.py) and the JAX translations compute: a model handed over in
    # eval mode would otherwise run torch's fast paths (nn.TransformerEncoder's nested tensors: 0 at padded positions)
    was_training = model.training
    try:
        model.train()
        with torch.no_grad(), torch.random.fork_rng(devices=[]), exact_matmuls(), _torch_dropout_off():
            out = model(x.to(dtype) if x.is_floating_point() else x)  # token ids stay ids
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor):  # the python spec's build refuses it too (dpaudit.models), for the CLI
        raise InputError(
            f"the model's forward gives output {type(out).__name__}; expected logits (a tensor of shape "
            f"[batch, n_classes]); return the logits alone (e.g. a wrapper module whose forward returns the "
            f"logits of the {type(out).__name__})"
        )
    expected = out.double().cpu().numpy()
    got = np.asarray(apply(params, xj), dtype=np.float64)
    tol = rounding_tolerance(torch.finfo(dtype).eps, expected)
    if got.shape != expected.shape or not np.abs(got - expected).max() <= tol:
        diff = "of another shape" if got.shape != expected.shape else f"off by {np.abs(got - expected).max():.3g}"
        raise _unsupported(
            f"the JAX forward pass gives logits {diff} on the first training records (tolerance {tol:.2g}): "
            "the model computes something its layer list does not"
        )


def check_alone_as_in_batch(apply: Apply, params: Params, xj) -> None:
    """Refuse, for private training, a graph in which a record's logits differ between the record alone and the record
    in a batch: the clippers compute each norm from the record alone (:func:`per_example_grads`,
    :func:`fx_ghost_clipped_sum`), and DP-SGD-JL the clipped sum from the batch (:func:`jl_clipped_sum`), so that
    sum would hold gradients of another function whose norms were never bounded by C (Abadi et al. 2016,
    arXiv:1607.00133, Alg. 1 clips the gradient it adds). Sizes from ``x.shape[0]`` (``torch.ones(B, T).tril()``: a
    record's row depends on its position) or a statistic over the batch: torch's
    :func:`~dpaudit.models.check_per_record_in_training` (run first) now compares rows and records alone too; this
    one checks the JAX graph itself. Tolerance as :func:`check_same_logits`' (rounding of one function)."""
    out = apply(params, xj)
    together = np.asarray(out, dtype=np.float64)
    alone = np.concatenate([np.asarray(apply(params, xj[i : i + 1]), dtype=np.float64) for i in range(xj.shape[0])])
    tol = rounding_tolerance(np.finfo(out.dtype).eps, together)
    if alone.shape != together.shape or not np.abs(alone - together).max() <= tol:
        raise InputError(
            "a record's logits differ between the record alone and the record in a batch (sizes from x.shape[0] or "
            "x.size(0), or a statistic over the batch dimension?): per-example clipping needs each record's loss to "
            "depend on that record alone (the JAX backend clips norms of records alone and sums the batch's)"
        )


def params_from_torch(model: nn.Module) -> Params:
    """The trainable parameters as JAX arrays, same names, layout and dtype as torch's."""
    return {n: jnp.asarray(p.detach().cpu().numpy()) for n, p in model.named_parameters() if p.requires_grad}


def params_to_torch(model: nn.Module, params: Params) -> None:
    """Copy ``params`` back into the torch module's parameters (in place, no reshaping needed)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in params:
                p.copy_(torch.from_numpy(np.array(params[n])))


# ------------------------------------------------------------------------- gradients and clipping


def _losses(apply: Apply, params: Params, x, y, keys=None):
    # Per-example cross-entropy ℓ_i = logsumexp(z_i) − z_{i,y_i} (torch.nn.functional.cross_entropy). With ``keys``
    # (one dropout key per record, StepProgram.record_keys): each record through the model alone under its own key,
    # the same function of (θ, x_i, key_i) as per_example_grads differentiates, so the weighted pass sums the
    # gradients whose norms were clipped (the same masks).
    if keys is None:
        return _per_example_losses(apply(params, x), y)
    return jax.vmap(lambda xi, yi, ki: _per_example_losses(apply(params, xi[None], ki), yi[None])[0])(x, y, keys)


def per_example_grads(apply: Apply, params: Params, x, y, keys=None) -> Params:
    """∇_θ ℓ_i for every example, stacked on a leading axis: ``vmap(grad(ℓ))`` (one example at a time
    through the model, as a batch of one; under its dropout key ``keys[i]`` when given)."""

    def one(p, xi, yi, ki):
        return _losses(apply, p, xi[None], yi[None], None if ki is None else ki[None])[0]

    return jax.vmap(jax.grad(one), in_axes=(None, 0, 0, None if keys is None else 0))(params, x, y, keys)


def _tree_sq_norms(tree: Params):
    return sum(jnp.square(g).reshape(g.shape[0], -1).sum(1) for g in tree.values())


@partial(jax.jit, static_argnums=0)  # apply (a Python function) is static: one compile per model
def clipped_sum(apply: Apply, params: Params, x, y, clip: float, mask=None, keys=None) -> tuple[Params, Any]:
    """Σ_i m_i g_i / max(1, ‖g_i‖/C) and the per-example norms ‖g_i‖ (Abadi et al. 2016,
    arXiv:1607.00133, Alg. 1, "clip gradient"); ‖g_i‖ is the norm of the whole flattened
    per-example gradient, as :mod:`dpaudit.training.clipping`. ``mask`` (0/1 per example; default
    all 1) zeroes padded slots: their weight is exactly 0, so they add exactly 0 (their gradients
    are those of a real record, hence finite). ``keys``: one dropout key per example (models with dropout).

    One pass: the per-example gradients g_i from ``vmap(grad)``, their norms, and Σ_i w_i g_i from the same g_i
    (stored, B×d). Not the norms from one pass and ∇_θ Σ_i w_i ℓ_i from a second, batched backward (Li et al. 2021,
    arXiv:2110.05679, §4), as this function did: the two are separately compiled computations of the gradient, and
    XLA may compute them differently where the gradient is not continuous. Under jit the gradient of an amax over a
    bilinear upsampling went, per example, to the maximum in one computation and partly nowhere in the other
    (0.75 of 1 lost; twelfth session, RESULTS.md), so a record's clipped contribution to the sum exceeded C (by 0.7 %
    in that model): the sensitivity the accountant assumes (Abadi et al. 2016, Alg. 1: the gradient that is added is
    the one clipped) held only where both computations agreed.
    """
    g = per_example_grads(apply, params, x, y, keys)
    norms, w = _clip_weights(_tree_sq_norms(g), clip, mask)
    return {k: _weighted_sum(w, v) for k, v in g.items()}, norms


def _bdot(a, b):
    # Per example: a (B, i, j), b (B, k, j) -> (B, i, k), in full float32 precision.
    return jnp.einsum("bij,bkj->bik", a, b, precision=PRECISION)


def _conv_only(m: nn.Conv2d, kernel, a):
    return lax.conv_general_dilated(
        a, kernel, tuple(int(v) for v in m.stride), _conv_pads(m),
        dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=PRECISION,
    )  # fmt: skip


def _patches(m: nn.Conv2d, a, out_hw: tuple[int, int]):
    """The convolution's input patches (B, C_in, kh·kw, H_out, W_out): the kh·kw shifted, strided
    slices of the zero-padded input (no dilation, as :func:`_conv` requires), i.e. im2col by copying.
    Same values and order as ``lax.conv_general_dilated_patches``, which XLA:CPU computes as a real
    convolution with a (C_in·kh·kw)-channel identity kernel (for the small CNN's second layer 0.6 ms
    at batch 64, as much as its whole forward pass)."""
    a = jnp.pad(a, ((0, 0), (0, 0), *_conv_pads(m)))
    return jnp.stack(_window_slices(a, m.kernel_size, m.stride, out_hw), axis=2)


def _window_slices(xp, kernel: tuple, stride: tuple, out_hw: tuple, dilation: tuple | None = None) -> list:
    """The shifted, strided slices of an already padded (..., *spatial) array over its last len(kernel) axes, in
    row-major kernel order: slice (i, j) holds at output position (r, c) the value at (r·sh + i·dh, c·sw + j·dw), so
    slice k of output (r, c) is element k of its window (a convolution's patches, :func:`_patches`; pooling's
    windows, :func:`_pool`, whose taps may be ``dilation`` apart)."""
    dilation = dilation or (1,) * len(kernel)
    return [
        xp[
            (
                Ellipsis,
                *(
                    slice(i * d, i * d + s * (o - 1) + 1, s)
                    for i, d, s, o in zip(at, dilation, stride, out_hw, strict=True)
                ),
            )
        ]
        for at in itertools.product(*(range(k) for k in kernel))
    ]


def _positions_sq_norm(a, g, bias: bool):
    """(‖Σ_t g_t a_tᵀ‖² (+ ‖Σ_t g_t‖² for a bias) per example, G) for a layer applied at T positions: a (B, p, T) the
    inputs, g (B, d, T) the output gradients. Ghost norm Σ_{t,s} (a_t·a_s)(g_t·g_s) (Li et al. 2021,
    arXiv:2110.05679, §4) and G = None when 2T² <= p·d, else the (d, p) per-example weight gradients G (B, d, p)
    instantiated (the mixed choice of Bu et al. 2022, arXiv:2205.10683) and returned: the clipped sum is then
    Σ_i w_i G_i (:func:`_weighted_sum`), the very gradients whose norms were clipped, with no book-keeping pass."""
    T = g.shape[2]
    if 2 * T * T <= a.shape[1] * g.shape[1]:
        at, gt = a.transpose(0, 2, 1), g.transpose(0, 2, 1)
        sq, G = (_bdot(at, at) * _bdot(gt, gt)).sum((1, 2)), None
    else:
        G = _bdot(g, a)
        sq = jnp.square(G).sum((1, 2))
    return (sq + jnp.square(g.sum(2)).sum(1) if bias else sq), G


def _linear_sq_norm(pairs: list, bias: bool):
    """Per example ‖Σ_u Σ_t g_ut a_utᵀ‖² (+ ‖Σ_u Σ_t g_ut‖² for a bias), and the instantiated per-example weight
    gradients (B, d_out, d_in) or None (:func:`_positions_sq_norm`): a Linear's per-example weight gradient over
    its uses u (a module called twice: the gradient is the sum over both calls, so the positions are concatenated,
    never the norms added) and positions t. ``pairs``: per use (a, g), a (B, ..., d_in) its inputs, g (B, ..., d_out)
    its output gradients. One position: rank one, ‖g‖²‖a‖² (Goodfellow 2015, arXiv:1510.01799); more:
    :func:`_positions_sq_norm`."""
    B = pairs[0][0].shape[0]
    a = jnp.concatenate([a.reshape(B, -1, a.shape[-1]) for a, _ in pairs], 1)  # (B, T, d_in)
    g = jnp.concatenate([g.reshape(B, -1, g.shape[-1]) for _, g in pairs], 1)  # (B, T, d_out)
    if a.shape[1] == 1:
        return jnp.square(g).sum((1, 2)) * (jnp.square(a).sum((1, 2)) + (1.0 if bias else 0.0)), None
    return _positions_sq_norm(a.transpose(0, 2, 1), g.transpose(0, 2, 1), bias)


def _images(v):
    # (B, *lead, C, H, W) -> (B·L, C, H, W): a convolution's per-example inputs or output gradients as one batch
    return v.reshape(-1, *v.shape[-3:])


def _conv_weight_grad(m: nn.Conv2d, kernel, a, g):
    """The convolution's weight gradient for inputs a (N, C_in, H, W) and output gradients g (N, C_out, H', W'),
    summed over the N images: its vjp in the kernel (linear in the kernel, so any kernel value gives it)."""
    return jax.vjp(lambda k: _conv_only(m, k, a), kernel)[1](g)[0]


def _conv_sq_norm(m: nn.Conv2d, pairs: list, bias: bool):
    """:func:`_linear_sq_norm` of a Conv2d: a Linear map on the T patches of its input (Rochette et al. 2019,
    arXiv:1912.06015); per use (a, g), a (B, *lead, C_in, H, W), g (B, *lead, C_out, H_out, W_out) (a layer called on
    a batch of one inside fx_ghost_clipped_sum's vmap: lead (1,)), its L·T positions concatenated, and the instantiated
    per-example weight gradients (B, *weight) or None. The ghost Gram (2T² <= p·d) and the instantiation of a layer
    with p <= d (its (B, p, T) patches no larger than the output gradients (B, d, T) held anyway) read the copied
    patches (:func:`_patches`); a layer with p > d is instantiated by the convolution's own weight gradient per example
    (:func:`_conv_weight_grad`, vmapped: one grouped convolution, Rochette et al. 2019, §3, as the torch clipper's
    grouped route), summed over the uses, with no patches: their kh·kw copies of the input were the step's largest
    temporaries (cifar-gn, batch 64: XLA's temporary buffer per step 37.6 → 17.4 MiB, back under glibc's 32 MiB mmap
    threshold above which every step's buffer is fresh pages, zeroed by page faults; RESULTS.md)."""
    B = pairs[0][0].shape[0]
    per = [(a.reshape(B, -1, *a.shape[-3:]), g.reshape(B, -1, *g.shape[-3:])) for a, g in pairs]  # (B, L, C, H, W)
    T = sum(g.shape[1] * g.shape[3] * g.shape[4] for _, g in per)
    p, d = m.in_channels * m.kernel_size[0] * m.kernel_size[1], m.out_channels
    shape = (d, m.in_channels, *m.kernel_size)
    if 2 * T * T > p * d and p > d:
        G = sum(jax.vmap(partial(_conv_weight_grad, m, jnp.zeros(shape, per[0][0].dtype)))(a, g) for a, g in per)
        sq = jnp.square(G).reshape(B, -1).sum(1)
        return (sq + jnp.square(sum(g.sum((1, 3, 4)) for _, g in per)).sum(1) if bias else sq), G
    ps, gs = [], []
    for a, g in per:
        L, (c_out, h, w) = a.shape[1], g.shape[2:]
        ps.append(_patches(m, _images(a), (h, w)).reshape(B, L, p, h * w).transpose(0, 2, 1, 3).reshape(B, p, -1))
        gs.append(g.reshape(B, L, c_out, h * w).transpose(0, 2, 1, 3).reshape(B, c_out, -1))
    sq, G = _positions_sq_norm(jnp.concatenate(ps, 2), jnp.concatenate(gs, 2), bias)
    return sq, None if G is None else G.reshape(B, *shape)  # the patches' order (C_in, kh, kw) is the kernel's


def _linear_sums(pairs: list, bias: bool, kept=None) -> dict[str, Any]:
    """Book-keeping (Bu et al. 2023, arXiv:2210.00038, Alg. 1): Σ_i w_i ∇ℓ_i of a Linear from its uses' (a, w ⊙ g):
    Σ_u (w ⊙ g_u)ᵀ a_u over all positions, and Σ w ⊙ g for the bias. ``kept``: the weight's Σ_i w_i G_i when its norms
    instantiated the per-example gradients G (:func:`_positions_sq_norm`), used as it is."""
    out = {"weight": kept if kept is not None else sum(
        jnp.matmul(wg.reshape(-1, wg.shape[-1]).T, a.reshape(-1, a.shape[-1]), precision=PRECISION) for a, wg in pairs
    )}  # fmt: skip
    if bias:
        out["bias"] = sum(wg.reshape(-1, wg.shape[-1]).sum(0) for _, wg in pairs)
    return out


def _conv_sums(m: nn.Conv2d, kernel, pairs: list, bias: bool, kept=None) -> dict[str, Any]:
    """:func:`_linear_sums` of a Conv2d: the convolution's own weight gradient (:func:`_conv_weight_grad`) for the
    cotangents w ⊙ g, or ``kept``."""
    weight = sum(_conv_weight_grad(m, kernel, _images(a), _images(wg)) for a, wg in pairs) if kept is None else kept
    out: dict[str, Any] = {"weight": weight}
    if bias:
        out["bias"] = sum(_images(wg).sum((0, 2, 3)) for _, wg in pairs)
    return out


def _layer_outputs(apply: JaxModel, params: Params, x) -> list:
    outs, h = [], x
    for _, m, f in apply.layers:
        h = f(params, h)
        if _tapped(m):
            outs.append(h)
    return outs


@partial(jax.jit, static_argnums=0)
def ghost_clipped_sum(apply: JaxModel, params: Params, x, y, clip: float, mask=None) -> tuple[Params, Any]:
    """The same result as :func:`clipped_sum` without materialising per-example gradients of the
    Linear and Conv2d layers: ghost norms and book-keeping (Bu et al. 2023, arXiv:2210.00038,
    Alg. 1), as :class:`dpaudit.training.clipping.GhostClipper` does in torch.

    One forward pass taps every parametrised layer: its input a (for GroupNorm, LayerNorm the normalised x̂)
    is kept, and a zero z is added to its output; the gradient of Σ_i ℓ_i w.r.t. the z's is every
    layer's per-example output gradient g (examples do not interact), in one backward pass that
    computes no parameter gradient. Per example: a Linear's gradient g aᵀ on a (B, d_in) input is
    rank one, ‖g aᵀ‖² = ‖g‖²‖a‖² (Goodfellow 2015, arXiv:1510.01799); a Linear on a (B, ..., d_in)
    input is applied at T positions, and a Conv2d is a Linear map on the T patches of its input
    (Rochette et al. 2019, arXiv:1912.06015): both have ‖Σ_t g_t a_tᵀ‖² = Σ_{t,s}(a_t·a_s)(g_t·g_s)
    (Li et al. 2021, arXiv:2110.05679) when 2T² <= p·d, else the (d, p) gradient is instantiated
    (the mixed choice of Bu et al. 2022, arXiv:2205.10683; :func:`_positions_sq_norm`);
    GroupNorm's and LayerNorm's γ, β gradients are small and instantiated. Then with w_i = 1/max(1, ‖g_i‖/C)
    (zero on padded slots), Σ_i w_i ∇ℓ_i per layer: Σ_i w_i G_i where the norm instantiated the per-example
    gradients G, else (w ⊙ g)ᵀ a for a Linear, the convolution's weight gradient (its vjp) for the cotangent w ⊙ g;
    Σ_i w_i g_i for the small ones.
    """

    def forward(zs, p):
        acts, h, z = [], x, iter(zs)
        for name, m, f in apply.layers:
            if _tapped(m) and isinstance(m, (nn.GroupNorm, nn.LayerNorm)):
                xh = _normalize(m, h)
                acts.append(xh)
                h = _norm_affine(name, m, p, xh) + next(z)
            elif _tapped(m):
                acts.append(h)
                h = f(p, h) + next(z)
            else:
                h = f(p, h)
        return jnp.sum(_per_example_losses(h, y)), acts

    shapes = jax.eval_shape(lambda p: _layer_outputs(apply, p, x), params)
    zs = [jnp.zeros(s.shape, s.dtype) for s in shapes]
    gs, acts = jax.grad(forward, has_aux=True)(zs, lax.stop_gradient(params))
    tapped = [(name, m) for name, m, _ in apply.layers if _tapped(m)]
    sq, small, inst = jnp.zeros(x.shape[0], x.dtype), {}, {}
    for (name, m), a, g in zip(tapped, acts, gs, strict=True):
        has_bias = f"{name}.bias" in params
        if isinstance(m, (nn.Linear, nn.Conv2d)):  # a Linear's a (B, ..., d_in): applied at every position t
            lin = isinstance(m, nn.Linear)
            norm = _linear_sq_norm([(a, g)], has_bias) if lin else _conv_sq_norm(m, [(a, g)], has_bias)
            sq, inst[name] = sq + norm[0], norm[1]
        else:  # GroupNorm, LayerNorm: per-example γ, β gradients (B, *their shape), summed over the other axes
            keep = _norm_param_axes(m, g.ndim)
            red = tuple(d for d in range(1, g.ndim) if d not in keep)
            small[name] = {k: v.sum(red) for k, v in (("weight", g * a), ("bias", g)) if f"{name}.{k}" in params}
            sq = sq + sum(jnp.square(v).reshape(v.shape[0], -1).sum(1) for v in small[name].values())
    norms, w = _clip_weights(sq, clip, mask)
    out: Params = {}
    for (name, m), a, g in zip(tapped, acts, gs, strict=True):
        if name in small:
            out.update({f"{name}.{k}": _weighted_sum(w, v) for k, v in small[name].items()})
            continue
        pairs, has_bias = [(a, _weighted(w, g))], f"{name}.bias" in params
        kept = None if inst[name] is None else _weighted_sum(w, inst[name])  # instantiated: Σ_i w_i G_i
        if isinstance(m, nn.Linear):  # book-keeping: Σ_i w_i Σ_t g_it a_itᵀ = (w ⊙ g)ᵀ a over all positions
            sums = _linear_sums(pairs, has_bias, kept)
        else:  # the convolution's own weight gradient for the output gradients w_i g_i
            sums = _conv_sums(m, params[f"{name}.weight"], pairs, has_bias, kept)
        out.update({f"{name}.{k}": v for k, v in sums.items()})
    return {k: out[k] for k in params}, norms


def _weighted(w, g):
    return g * w.reshape((-1,) + (1,) * (g.ndim - 1))


def _weighted_sum(w, g):
    # Σ_i w_i g_i over the leading (example) axis of per-example values g
    return jnp.tensordot(w, g, 1, precision=PRECISION)


def _clip_weights(sq, clip: float, mask):
    """‖g_i‖ from its square (ghost Gram sums may round below 0) and w_i = 1/max(1, ‖g_i‖/C), 0 on padded slots."""
    norms = jnp.sqrt(jnp.maximum(sq, 0.0))
    w = 1.0 / jnp.maximum(norms / clip, 1.0)
    return norms, (w if mask is None else jnp.where(mask, w, 0.0))


_GHOSTED = (nn.Linear, nn.Conv2d, nn.Embedding)  # the layers of a traced graph fx_ghost_clipped_sum taps


class _FxGhost(NamedTuple):
    """A weight of a traced graph and the one-input calls of the Linear, Conv2d or Embedding modules reading it: one
    module, or several Linear/Embedding modules sharing it (tied weights: an Embedding whose weight is also the output
    Linear's), every parameter of those modules read by those calls only. Per call (graph node): its input node, its
    module and its bias's canonical name (None: no bias); the weight's canonical name."""

    modules: tuple[nn.Module, ...]
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    weight: str
    biases: tuple[str | None, ...]
    part: tuple[int, int] | None = None  # rows (lo, hi) of the weight and biases (a MultiheadAttention's in_proj third)


def _fx_ghost_groups(gm, owner: dict[int, str], readers: dict[str, set[str]], uses: dict) -> tuple[_FxGhost, ...]:
    """The weights fx_ghost_clipped_sum taps: the modules sharing a weight (one, or tied Linear/Embedding modules)
    whose parameters only their one-input calls read (a parameter also read in forward (get_attr), by a call with
    keyword arguments or by another module, a Conv2d sharing its weight: per-example gradients by vmap); and the
    linear maps inside MultiheadAttention and transformer-layer calls (:func:`_block_groups`)."""
    calls_of = {t: c for t, c in uses.items() if c[0][1] is not None}
    names = {
        t: {k: owner[id(q)] for k, q in gm.get_submodule(t).named_parameters(remove_duplicate=False)} for t in calls_of
    }
    by_weight: dict[str, list[str]] = {}
    for target, ns in names.items():
        by_weight.setdefault(ns["weight"], []).append(target)
    out = []
    for weight, targets in by_weight.items():
        calls = [(gm.get_submodule(t), n, i, names[t].get("bias")) for t in targets for n, i in uses[t]]
        nodes = {n for _, n, _, _ in calls}
        tied_ok = len(targets) == 1 or all(isinstance(m, (nn.Linear, nn.Embedding)) for m, *_ in calls)
        own = all(len(set(names[t].values())) == len(names[t]) for t in targets)  # no module's weight is its bias
        if tied_ok and own and all(readers[c] <= nodes for t in targets for c in names[t].values()):
            modules, nodes_, inputs, biases = (tuple(v) for v in zip(*calls, strict=True))
            out.append(_FxGhost(modules, nodes_, inputs, weight, biases))
    blocks = {t: [n for n, _ in c] for t, c in uses.items() if c[0][1] is None}
    return (*out, *_block_groups(gm, owner, readers, blocks))


def _block_groups(gm, owner: dict[int, str], readers: dict[str, set[str]], blocks: dict) -> list[_FxGhost]:
    """The linear maps inside the graph's MultiheadAttention and transformer-layer calls (one graph node each,
    ``blocks``: module path -> its nodes), tapped from inside the translation (:func:`_sub_tap`, virtual nodes
    "node:path"): every Linear (an encoder layer's linear1/linear2, an attention's out_proj) and the three row blocks
    of a packed in_proj_weight (q, k, v: disjoint rows, so their squared norms add; each a Linear map of its own
    input, self- or cross-attention alike), where the parameters are read by that module's calls alone and shared with
    no other linear map. A virtual node the translation never reaches drops its weight's groups
    (fx_ghost_clipped_sum)."""
    parts = []  # (module, virtual path, weight, bias, rows, the block's nodes)
    for target, nodes in blocks.items():
        # remove_duplicate=False: a layer object listed twice (layers [l, l]) is two paths holding one weight: vmap
        for path, sub in gm.get_submodule(target).named_modules(prefix=target, remove_duplicate=False):
            if isinstance(sub, nn.Linear):
                b = None if sub.bias is None else owner[id(sub.bias)]
                parts.append((sub, path, owner[id(sub.weight)], b, None, nodes))
            elif isinstance(sub, nn.MultiheadAttention) and sub.in_proj_weight is not None:
                b, E = None if sub.in_proj_bias is None else owner[id(sub.in_proj_bias)], sub.embed_dim
                w = owner[id(sub.in_proj_weight)]
                parts += [(sub, f"{path}.in_proj.{i}", w, b, (i * E, (i + 1) * E), nodes) for i in range(3)]
    holders: dict[str, set[str]] = {}  # canonical parameter -> the module paths holding it
    for _, path, w, b, rows, _ in parts:
        for c in (w, b):
            if c is not None:
                holders.setdefault(c, set()).add(path if rows is None else path.rsplit(".", 2)[0])
    out = []
    for m, path, w, b, rows, nodes in parts:
        own = [c for c in (w, b) if c is not None]
        if w != b and all(len(holders[c]) == 1 and readers[c] <= set(nodes) for c in own):
            virtual = tuple(f"{n}:{path}" for n in nodes)
            out.append(_FxGhost((m,) * len(nodes), virtual, (None,) * len(nodes), w, (b,) * len(nodes), rows))
    return out


def _embedding_ids(m: nn.Embedding, ids):
    # (ids (B, T), 0/1 (B, T): the positions whose row gets a gradient; torch leaves padding_idx's row at 0)
    i = ids.reshape(ids.shape[0], -1).astype(jnp.int32)
    return i, (jnp.ones(i.shape) if m.padding_idx is None else (i != m.padding_idx).astype(jnp.float32))


def _embedding_positions(uses: list):
    """An Embedding weight's uses (m, ids, g) as positions: ids (B, T) and row gradients g (B, T, d), zero at
    padding_idx (the positions torch gives no gradient), the uses' positions concatenated."""
    B = uses[0][1].shape[0]
    ids, keep = (jnp.concatenate(v, 1) for v in zip(*(_embedding_ids(m, a) for m, a, _ in uses), strict=True))
    g = jnp.concatenate([g.reshape(B, -1, g.shape[-1]) for _, _, g in uses], 1)
    return ids, g * keep[..., None].astype(g.dtype)


def _shared_weight_sq_norm(uses: list, shape: tuple[int, int]):
    """Per example ‖Σ_u G_u‖² of a (rows, cols) weight read by Linear and Embedding calls u (one module, a module
    called twice, or tied modules: an Embedding whose weight is also the output Linear's), biases apart. ``uses``:
    per call (module, a, g), a its input, g its output gradient. Every use is a sum of outer products u_p v_pᵀ,
    u ∈ R^rows, v ∈ R^cols: a Linear's position p has u = g_p, v = a_p (Goodfellow 2015, arXiv:1510.01799); an
    Embedding's u = e_{id_p} (one-hot ids as the inputs of a Linear map, Bu et al. 2023, arXiv:2210.00038, §3), v = g_p.
    The gradient of the shared weight is the sum over all uses (never the per-use norms added: the cross terms), so
    all positions are concatenated and ‖Σ_p u_p v_pᵀ‖² = Σ_{p,q}(u_p·u_q)(v_p·v_q) (Li et al. 2021,
    arXiv:2110.05679, §4), with e_i·e_j = [i = j] and g_p·e_{id_q} = g_p[id_q]; the (rows, cols) per-example
    gradient instantiated instead when 2T² > rows·cols (Bu et al. 2022, arXiv:2205.10683) and returned with the norms
    (else None), as :func:`_positions_sq_norm`. One kind of use only: :func:`_linear_sq_norm` (Linear), or its
    Embedding case here (ids only)."""
    lin = [(a, g) for m, a, g in uses if not isinstance(m, nn.Embedding)]  # a Linear, an in_proj third
    emb = [(m, a, g) for m, a, g in uses if isinstance(m, nn.Embedding)]
    if not emb:
        return _linear_sq_norm(lin, False)
    ids, ge = _embedding_positions(emb)  # (B, TE), (B, TE, cols)
    B, (rows, cols) = ids.shape[0], shape
    a = jnp.concatenate([a.reshape(B, -1, cols) for a, _ in lin], 1) if lin else jnp.zeros((B, 0, cols), ge.dtype)
    g = jnp.concatenate([g.reshape(B, -1, rows) for _, g in lin], 1) if lin else jnp.zeros((B, 0, rows), ge.dtype)
    T = ids.shape[1] + a.shape[1]
    if (2 if lin else 1) * T * T <= rows * cols:
        sq = (_bdot(ge, ge) * (ids[:, :, None] == ids[:, None, :])).sum((1, 2))
        if not lin:
            return sq, None
        at_ids = jnp.take_along_axis(g, jnp.broadcast_to(ids[:, None, :], (B, g.shape[1], ids.shape[1])), axis=2)
        return sq + (_bdot(a, a) * _bdot(g, g)).sum((1, 2)) + 2 * (at_ids * _bdot(a, ge)).sum((1, 2)), None
    per = jnp.einsum("btr,btc->brc", g, a, precision=PRECISION).at[jnp.arange(B)[:, None], ids].add(ge)
    return jnp.square(per).sum((1, 2)), per


def _embedding_sums(like, uses: list):
    """Book-keeping of an Embedding weight over its uses (m, ids, w ⊙ g): Σ_i w_i Σ_t e_{id_t} g_tᵀ, the rows w ⊙ g
    added at their ids."""
    out = jnp.zeros_like(like)
    for m, a, wg in uses:
        ids, keep = _embedding_ids(m, a)
        out = out.at[ids.reshape(-1)].add(
            (wg.reshape(*ids.shape, -1) * keep[..., None].astype(wg.dtype)).reshape(-1, wg.shape[-1])
        )
    return out


def _fx_group_sq_norm(gr: _FxGhost, acts: list, gs: list, shape: tuple):
    """Per example squared norm of an :class:`_FxGhost` group's parameters: its weight over all its calls
    (:func:`_conv_sq_norm` for a Conv2d, :func:`_shared_weight_sq_norm`) plus each bias's ‖Σ_{its calls} Σ_t g_t‖²;
    and the weight's instantiated per-example gradients (B, *its shape), or None (ghost Gram, rank one)."""
    if isinstance(gr.modules[0], nn.Conv2d):  # one module (_fx_ghost_groups ties no Conv2d)
        return _conv_sq_norm(gr.modules[0], list(zip(acts, gs, strict=True)), gr.biases[0] is not None)
    sq, G = _shared_weight_sq_norm(list(zip(gr.modules, acts, gs, strict=True)), shape)
    for b in dict.fromkeys(c for c in gr.biases if c is not None):
        g = [g.reshape(g.shape[0], -1, g.shape[-1]).sum(1) for c, g in zip(gr.biases, gs, strict=True) if c == b]
        sq = sq + jnp.square(sum(g)).sum(1)
    return sq, G


def _fx_group_sums(gr: _FxGhost, acts: list, wgs: list, weight, kept=None) -> dict[str, Any]:
    """Book-keeping of an :class:`_FxGhost` group from its calls' inputs and weighted output gradients w ⊙ g: the
    weight's Σ_i w_i ∇ℓ_i summed over its calls (:func:`_conv_sums`, :func:`_linear_sums`, :func:`_embedding_sums`),
    or ``kept`` (Σ_i w_i G_i of the instantiated per-example gradients), each bias's Σ w ⊙ g over the calls
    reading it."""
    m = gr.modules[0]
    if isinstance(m, nn.Conv2d):
        sums = _conv_sums(m, weight, list(zip(acts, wgs, strict=True)), gr.biases[0] is not None, kept)
        return {gr.weight: sums["weight"]} | ({gr.biases[0]: sums["bias"]} if gr.biases[0] is not None else {})
    uses = list(zip(gr.modules, acts, wgs, strict=True))
    lin = [(a, wg) for m, a, wg in uses if not isinstance(m, nn.Embedding)]
    emb = [u for u in uses if isinstance(u[0], nn.Embedding)]
    out = {
        gr.weight: kept
        if kept is not None
        else (_linear_sums(lin, False)["weight"] if lin else 0.0) + (_embedding_sums(weight, emb) if emb else 0.0)
    }
    for b in dict.fromkeys(c for c in gr.biases if c is not None):
        out[b] = sum(wg.reshape(-1, wg.shape[-1]).sum(0) for c, wg in zip(gr.biases, wgs, strict=True) if c == b)
    return out


@partial(jax.jit, static_argnums=0)
def fx_ghost_clipped_sum(apply: FxModel, params: Params, x, y, clip: float, mask=None, keys=None):
    """The same result as :func:`clipped_sum` for a traced graph (:class:`FxModel`), without per-example gradients
    of its :attr:`FxModel.ghost_groups` (Linear, Conv2d, Embedding modules, tied ones included, and the linear maps
    inside MultiheadAttention and transformer-layer calls: in_proj's thirds, out_proj, linear1/linear2): ghost
    norms and book-keeping (Bu et al. 2023, arXiv:2210.00038, Alg. 1) as :func:`ghost_clipped_sum`.

    Every example runs through the graph alone (a batch of one, under its dropout key ``keys[i]`` when given),
    as :func:`per_example_grads` does, vmapped: every call of a tapped module keeps its input a and gets a zero z
    added to its output, and one grad per example w.r.t. (the z's, every other parameter) gives the calls' output
    gradients g and the per-example gradients of the other parameters (LayerNorm/GroupNorm affine, a bare
    nn.Parameter: the sum over their uses, by autodiff). Running
    each example alone makes a call on an input without the batch axis (an Embedding of torch.arange(T)) a call
    of that example's own; a module called twice (a block reused, a loop) has the per-example gradient
    Σ_u Σ_t g_ut a_utᵀ, its uses' positions concatenated before the norm, and so does a weight shared by several
    modules (an Embedding and the output Linear: the cross terms between the uses, :func:`_shared_weight_sq_norm`).
    ‖g_i‖² is the sum of the tapped groups' ghost norms (:func:`_fx_group_sq_norm`) and the
    other parameters' squared norms; Σ_i w_i ∇ℓ_i by book-keeping from the same a, g (no second pass), or, for a
    group whose norms instantiated its per-example gradients G, Σ_i w_i G_i of those very G."""
    groups = apply.ghost_groups
    tapped = {n for gr in groups for n in gr.nodes}

    def run(p, xi, ki, tap):
        return apply(p, xi[None], ki, tap=lambda n, a, out: tap(n, a, out) if n in tapped else out)

    def outputs(xi, ki):  # the tapped calls' per-example output shapes
        outs: dict[str, Any] = {}
        run(params, xi, ki, lambda n, a, out: outs.setdefault(n, []).append(out) or out)
        return outs

    one = (lambda v: None) if keys is None else (lambda v: v[0])
    shapes = {n: v[0] for n, v in jax.eval_shape(outputs, x[0], one(keys)).items() if len(v) == 1}
    # a sub-tap never reached, or reached twice in one node: its weight by vmap
    unseen = {gr.weight for gr in groups if not all(n in shapes for n in gr.nodes)}
    groups = tuple(gr for gr in groups if gr.weight not in unseen)
    tapped = {n for gr in groups for n in gr.nodes}
    ghosted = {c for gr in groups for c in (gr.weight, *gr.biases) if c is not None}
    fixed = lax.stop_gradient({k: v for k, v in params.items() if k in ghosted})
    rest = {k: v for k, v in params.items() if k not in ghosted}

    def loss(zs, pr, xi, yi, ki):
        acts: dict[str, Any] = {}

        def tap(n, a, out):
            acts[n] = a
            return out + zs[n]

        return _per_example_losses(run({**fixed, **pr}, xi, ki, tap), yi[None])[0], acts

    zs = {n: jnp.zeros((x.shape[0], *s.shape), s.dtype) for n, s in shapes.items() if n in tapped}
    per = jax.vmap(jax.grad(loss, argnums=(0, 1), has_aux=True), in_axes=(0, None, 0, 0, None if keys is None else 0))
    (gs, prest), acts = per(zs, rest, x, y, keys)
    sq, inst = _tree_sq_norms(prest) if prest else jnp.zeros(x.shape[0], x.dtype), []
    for gr in groups:
        norm = _fx_group_sq_norm(gr, [acts[n] for n in gr.nodes], [gs[n] for n in gr.nodes], params[gr.weight].shape)
        sq = sq + norm[0]
        inst.append(norm[1])
    norms, w = _clip_weights(sq, clip, mask)
    out = {k: _weighted_sum(w, v) for k, v in prest.items()}
    for gr, G in zip(groups, inst, strict=True):
        kept = None if G is None else _weighted_sum(w, G)
        sums = _fx_group_sums(
            gr, [acts[n] for n in gr.nodes], [_weighted(w, gs[n]) for n in gr.nodes], params[gr.weight], kept
        )
        for k, v in sums.items():  # a part: its rows of the packed weight and bias
            out[k] = v if gr.part is None else out.get(k, jnp.zeros_like(params[k])).at[gr.part[0] : gr.part[1]].set(v)
    return {k: out[k] for k in params}, norms


def _per_example_losses(z, y):
    return jax.nn.logsumexp(z, axis=-1) - jnp.take_along_axis(z, y[:, None], axis=-1)[:, 0]


@partial(jax.jit, static_argnums=0)
def jl_norm_estimates(apply: Apply, params: Params, x, y, directions: list[Params], keys=None):
    """M_i = sqrt((1/r) Σ_j ⟨∇ℓ_i, v_j⟩²) for the r ``directions`` (dicts shaped like ``params``):
    the JL estimate of ‖∇ℓ_i‖ (E[M_i²] = ‖∇ℓ_i‖² for v_j ~ N(0, I); JL projections paper, Alg. 1).
    Each ⟨∇ℓ_i, v_j⟩, for the whole batch at once, is the forward-mode derivative (``jax.jvp``) of
    the vector of per-example losses in direction v_j: no per-example gradient is materialised."""
    f = partial(_losses, apply, x=x, y=y, keys=keys)  # keys: one dropout key per record, as clipped_sum's
    proj = jnp.stack([jax.jvp(lambda p: f(p), (params,), (v,))[1] for v in directions])  # (r, n)
    return jnp.sqrt(jnp.mean(jnp.square(proj), axis=0))


@partial(jax.jit, static_argnums=0)
def jl_clipped_sum(apply: Apply, params: Params, x, y, clip: float, directions: list[Params], mask=None, keys=None):
    """∇_θ Σ_i m_i w_i ℓ_i with w_i = min(1, C/M_i) held fixed, and the estimates M_i of :func:`jl_norm_estimates`;
    the clipped sum of DP-SGD-JL (JL projections paper, Alg. 2).

    One linearization of the per-example losses F(θ) at θ (``jax.linearize``: one forward pass, its residuals kept)
    gives both: the projections ⟨∇ℓ_i, v_j⟩ = (∂F v_j)_i by evaluating it on each direction, and the sum
    Σ_i w_i ∇ℓ_i = (∂F)ᵀ w by transposing it (``jax.linear_transpose``). The privacy analysis (ibid. Lemma 4.3,
    Thm. 4.1: record i adds C g_i / M_i with M_i = ‖g_i‖·sqrt(χ²_r/r), :class:`~dpaudit.events.JLGaussian`) needs the
    g_i that is added to be the one projected: here both are the same linear map ∂F and its transpose, with every
    nonlinear choice of the forward pass (an argmax, a ReLU's side) made once. Before, the estimates came from r
    separately traced jvps and the sum from a further forward and backward pass: up to r + 1 computations of the
    gradient, which XLA may round into different choices (the amax case of :func:`clipped_sum`), and r forward passes
    more."""
    _, lin = jax.linearize(partial(_losses, apply, x=x, y=y, keys=keys), params)
    m = jnp.sqrt(jnp.mean(jnp.square(jnp.stack([lin(v) for v in directions])), axis=0))  # as jl_norm_estimates
    w = lax.stop_gradient(1.0 / jnp.maximum(m / clip, 1.0))
    if mask is not None:
        w = jnp.where(mask, w, 0.0)
    return jax.linear_transpose(lin, params)(w.astype(m.dtype))[0], m


# ------------------------------------------------------------------------------------ optimizers


def _opt_init(name: str, params: Params) -> dict[str, Any]:
    zeros = {k: jnp.zeros_like(v) for k, v in params.items()}
    return {"buf": zeros} if name == "sgd" else {"m": zeros, "v": dict(zeros), "t": jnp.zeros((), jnp.int32)}


def _opt_update(name: str, config: TrainConfig, params: Params, grads: Params, state: dict[str, Any]):
    """torch.optim.SGD / torch.optim.Adam (defaults betas (0.9, 0.999), eps 1e-8), same update
    order, weight decay added to the gradient as torch does (L2, not decoupled)."""
    lr, wd = config.lr, config.weight_decay
    if name == "sgd":
        new_p, new_buf = {}, {}
        for k, p in params.items():
            g = grads[k] + wd * p if wd else grads[k]
            b = config.momentum * state["buf"][k] + g if config.momentum else g  # dampening 0, buf₀ = g₀
            new_buf[k], new_p[k] = b, p - lr * b
        return new_p, {"buf": new_buf}
    b1, b2, eps = 0.9, 0.999, 1e-8  # Kingma & Ba 2015, arXiv:1412.6980, Alg. 1 (torch's form of the step)
    t = state["t"] + 1
    tf = t.astype(next(iter(params.values())).dtype)
    new_p, new_m, new_v = {}, {}, {}
    for k, p in params.items():
        g = grads[k] + wd * p if wd else grads[k]
        m = b1 * state["m"][k] + (1 - b1) * g
        v = b2 * state["v"][k] + (1 - b2) * jnp.square(g)
        denom = jnp.sqrt(v) / jnp.sqrt(1 - b2**tf) + eps
        new_p[k], new_m[k], new_v[k] = p - (lr / (1 - b1**tf)) * m / denom, m, v
    return new_p, {"m": new_m, "v": new_v, "t": t}


# ---------------------------------------------------------------------------------------- noise

_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3",
    SC'11, §3; rotation constants of its Table 4, key-schedule parity 0x1BD11BDA), written out round by
    round: the function of JAX's ``threefry2x32`` primitive, whose CPU lowering runs the 5 groups of 4
    rounds as a ``fori_loop`` over whole arrays (each group writes its arrays back to memory); written
    out, XLA:CPU fuses all 20 rounds into one loop over the counters, ~4x faster. Checked bit for bit
    against the primitive and Random123's known answers (tests/training/test_jax_noise.py)."""
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _THREEFRY_ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = (lax.shift_left(x1, np.uint32(r)) | lax.shift_right_logical(x1, np.uint32(32 - r))) ^ x0
        x0, x1 = x0 + ks[(i + 1) % 3], x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _threefry_bits(k0, k1, hi, lo):
    # The CPU gets the written-out rounds; other platforms keep JAX's lowering (one CUDA kernel on GPUs).
    return lax.platform_dependent(
        k0, k1, hi, lo, cpu=_threefry2x32, default=lambda *a: tuple(jax.extend.random.threefry2x32_p.bind(*a))
    )


def _normal_from_bits(o0, o1, dtype: np.dtype):
    # jax.random.normal's transform, op for op: o0 ^ o1 (32 bits) or o0·2^32 + o1 (64 bits) -> the top
    # nmant bits as the mantissa of a float f in [1, 2) -> u = (f − 1)(1 − lo) + lo, uniform on the
    # grid of [lo, 1), lo = nextafter(−1, 0) -> z = √2 erf⁻¹(u), inverse-CDF sampling
    # (Φ⁻¹((u + 1)/2) = √2 erf⁻¹(u)). The grid truncates |z| below √2 erf⁻¹(1 − 2^−nmant) (5.3 in
    # float32), as JAX's own sampler does.
    nbits, nmant = dtype.itemsize * 8, np.finfo(dtype).nmant
    if nbits == 32:
        bits, uint = o0 ^ o1, np.uint32
    else:  # float64 (JAX's x64 mode, as the trainer enables for float64 models)
        bits, uint = (o0.astype(np.uint64) << np.uint64(32)) | o1.astype(np.uint64), np.uint64
    one = np.array(1.0, dtype).view(uint)  # the exponent bits of 1.0
    f = lax.bitcast_convert_type(lax.shift_right_logical(bits, uint(nbits - nmant)) | one, dtype)
    lo, hi = np.nextafter(dtype.type(-1), dtype.type(0)), dtype.type(1)
    u = lax.max(lo, (f - dtype.type(1)) * (hi - lo) + lo)
    return dtype.type(np.sqrt(2)) * lax.erf_inv(u)


def gaussian_noise(key, t, like: Params) -> Params:
    """Standard normal noise shaped like ``like`` for step ``t``: coordinate j of the flattened
    parameters (leaves in ``like``'s order, each row-major) is √2 erf⁻¹(u) with u from Threefry-2x32
    under ``key`` at the counter (t, j), i.e. counter-mode use of a keyed pseudo-random function
    (Salmon et al. 2011, §2): every (step, coordinate) has its own counter, so the draws are
    independent across coordinates and steps, with no key splitting or folding per step. At t = 0
    a single leaf is bit for bit ``jax.random.normal(key, shape)`` (JAX's partitionable Threefry
    numbering), which the tests check. ``key``: a threefry2x32 key (the trainer makes it so)."""
    if str(jax.random.key_impl(key)) != "threefry2x32":
        raise InputError(f"the DP noise needs a threefry2x32 key, got {jax.random.key_impl(key)}")
    k0, k1 = jax.random.key_data(key)
    hi = jnp.asarray(t).astype(np.uint32)
    out, offset = {}, 0
    for name, v in like.items():
        size = math.prod(v.shape)
        if offset + size > 2**32:
            raise InputError("the model has more than 2^32 parameters: too many for the noise counters")
        lo = (lax.iota(np.uint32, size) + np.uint32(offset)).reshape(v.shape)
        o0, o1 = _threefry_bits(k0, k1, jnp.broadcast_to(hi, v.shape), lo)
        out[name] = _normal_from_bits(o0, o1, np.dtype(v.dtype))
        offset += size
    return out


# ----------------------------------------------------------------------------------- the program


def pad_size(batch_size: int, sample_rate: float) -> int:
    """Default chunk size for Poisson batches: B + 4·sqrt(B(1−q)) + 1, rounded up to a multiple of 8.

    The batch size is Binomial(N, q) with mean B and variance B(1−q), so a batch exceeds this
    (and needs a second chunk) with probability about 3e-5 per step (normal tail at 4 sd). The
    bound is a function of (B, q) only, which are public; it affects run time, never the result.
    """
    p = batch_size + 4.0 * math.sqrt(batch_size * (1.0 - sample_rate)) + 1.0
    return int(math.ceil(p / 8.0) * 8)


class StepProgram:
    """The jit-compiled pieces of one training run; every call has fixed shapes (chunks of ``pad``
    indices plus a 0/1 mask), so nothing recompiles after the first step.

    ``kind``: ``"sgd"`` (non-private: mean loss over the masked batch), ``"dp"`` (DP-SGD) or
    ``"jl"`` (DP-SGD-JL with ``jl_projections`` directions per step).
    """

    def __init__(
        self,
        apply: Apply,
        params: Params,
        config: TrainConfig,
        *,
        kind: str,
        optimizer: str,
        clip: float = 1.0,
        noise_std: float = 0.0,
        jl_projections: int = 1,
        noise_key=None,
        jl_key=None,
        dropout_key=None,
    ) -> None:
        self.apply, self.kind, self.optimizer = apply, kind, optimizer
        self.config, self.clip, self.noise_std = config, clip, noise_std
        self.r, self.noise_key, self.jl_key = jl_projections, noise_key, jl_key
        # keys for the dropout masks only when the model draws some (else the batched forward, as before)
        self.dropout_key = dropout_key if getattr(apply, "dropout", False) else None
        self.zeros = {k: jnp.zeros_like(v) for k, v in params.items()}
        self.chunk = jax.jit(self._chunk)
        self.step = jax.jit(self._step)

    def init_state(self, params: Params) -> dict[str, Any]:
        return _opt_init(self.optimizer, params)

    def _directions(self, params: Params, t) -> list[Params]:
        # v_j ~ N(0, I_d) over all trainable coordinates, fresh each step (fold_in of the step number),
        # the same for every chunk of the step: one set of directions per logical batch.
        keys = jax.random.split(jax.random.fold_in(self.jl_key, t), self.r * len(params))
        it = iter(keys)
        return [{k: jax.random.normal(next(it), v.shape, v.dtype) for k, v in params.items()} for _ in range(self.r)]

    def record_keys(self, t, idx):
        """The dropout keys of step ``t``'s records ``idx`` (dataset indices): fold_in(fold_in(key, t), i), from
        ``config.seed + 4`` (:func:`_jax_key`); None for a model without dropout.

        Privacy (DP-SGD, Abadi et al. 2016, arXiv:1607.00133, Alg. 1 and Thm. 1): the keys depend on the seed, the
        step and the record's index only, never on the data, and Threefry's fold_in gives keys whose draws are
        independent across (step, index) (Salmon et al. 2011, counter-based PRNGs). The indices of one dataset are
        distinct, so every record gets i.i.d. masks at every step whatever its index: the run is distributed as
        the one drawing fresh masks per (step, record), and an added or removed record (which shifts the others'
        indices) changes no other record's mask distribution. In that run, given all masks, record r's clipped
        gradient is a function of record r alone (each record runs through the model alone, :func:`_losses`, with
        its own masks) of norm <= C, so for every fixed draw the steps are the subsampled Gaussian mechanism of
        sensitivity C that the accountant composes, and the claimed (ε, δ) holds; the masks' randomness, independent
        of the data, mixes such mechanisms, which keeps (ε, δ) (the hockey-stick divergence is jointly convex; the
        Rényi divergence quasi-convex). A padded slot reuses a record's key, at weight 0."""
        if self.dropout_key is None:
            return None
        step = jax.random.fold_in(self.dropout_key, t)
        return jax.vmap(lambda i: jax.random.fold_in(step, i))(idx)

    def _chunk(self, params: Params, X, y, idx, mask, t) -> Params:
        """The (clipped) gradient sum over one padded chunk; padded slots have mask 0."""
        xb, yb, keys = X[idx], y[idx], self.record_keys(t, idx)
        if self.kind == "sgd":
            return jax.grad(
                lambda p: jnp.dot(mask.astype(xb.dtype), _losses(self.apply, p, xb, yb, keys), precision=PRECISION)
            )(params)
        if self.kind == "jl":
            directions = self._directions(params, t)
            return jl_clipped_sum(self.apply, params, xb, yb, self.clip, directions, mask, keys)[0]
        # Ghost norms + book-keeping for a layer list of _TAPPED layers, and for the Linear/Conv2d/Embedding modules
        # of a traced graph (its other parameters by vmap(grad)); vmap(grad) for a graph with none.
        if getattr(self.apply, "ghost", False):  # no dropout (JaxModel.ghost): no keys
            return ghost_clipped_sum(self.apply, params, xb, yb, self.clip, mask)[0]
        if getattr(self.apply, "ghost_groups", ()):
            return fx_ghost_clipped_sum(self.apply, params, xb, yb, self.clip, mask, keys)[0]
        return clipped_sum(self.apply, params, xb, yb, self.clip, mask, keys)[0]

    def _step(self, params: Params, state, X, y, idx, mask, extra: Params, t, divisor):
        """One logical step: this chunk's sum plus ``extra`` (the other chunks' sums, zeros for a batch
        that fits one chunk), noise N(0, σ²C²I) once (DP), division, optimizer update."""
        s = self._chunk(params, X, y, idx, mask, t)
        s = {k: s[k] + extra[k] for k in s}
        if self.kind != "sgd" and self.noise_std > 0:
            # Abadi et al. 2016, arXiv:1607.00133, Alg. 1, "add noise": one draw per coordinate per step.
            z = gaussian_noise(self.noise_key, t, s)
            s = {k: v + self.noise_std * z[k] for k, v in s.items()}
        grads = {k: v / divisor.astype(v.dtype) for k, v in s.items()}
        return _opt_update(self.optimizer, self.config, params, grads, state)

    def run_step(self, params: Params, state, X, y, batch: np.ndarray, pad: int, t: int, divisor: float):
        """Apply one step to the batch of record indices ``batch`` (any length, possibly 0): cut into
        chunks of ``pad``, the last one padded with masked slots; all but the last summed first."""
        chunks = [batch[i : i + pad] for i in range(0, len(batch), pad)] or [batch[:0]]
        extra = self.zeros
        for c in chunks[:-1]:  # a batch larger than the pad: several chunks, never truncated
            part = self.chunk(params, X, y, *_padded(c, pad), t)
            extra = {k: extra[k] + part[k] for k in extra}
        return self.step(params, state, X, y, *_padded(chunks[-1], pad), extra, t, np.float64(divisor))


def _padded(idx: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros(pad, dtype=np.int32)
    out[: len(idx)] = idx
    mask = np.zeros(pad, dtype=bool)
    mask[: len(idx)] = True
    return out, mask


def _jax_key(seed: int, secure: bool):
    if secure:  # 64 bits from os.urandom, as the torch trainer's secure noise
        return jax.random.wrap_key_data(
            np.array([secrets.randbits(32), secrets.randbits(32)], dtype=np.uint32), impl="threefry2x32"
        )
    return jax.random.key(seed, impl="threefry2x32")  # gaussian_noise needs threefry2x32, not the default impl


def _jax_device(name: str):
    if name == "cpu":
        return jax.devices("cpu")[0]
    if name == "cuda":
        try:
            return jax.devices("gpu")[0]
        except RuntimeError:
            raise InputError("--device cuda requested but JAX sees no GPU (install jax[cuda12])") from None
    return jax.devices()[0]


# -------------------------------------------------------------------------------------- trainer


class JaxTrainer(Trainer):
    """Any of :data:`ALGOS` with the JAX backend. Same batches (torch samplers, same seeds), same
    claim (the registered torch trainer's ``setting_for`` and :func:`privacy_claim`) as the torch
    trainer of ``config.algo``; only the noise generator differs (:func:`gaussian_noise`, Threefry
    keyed from ``config.seed + 2``)."""

    name = "jax"

    def __init__(self, config: TrainConfig, perf: PerfConfig | None = None) -> None:
        if config.algo not in ALGOS:
            raise InputError(f"--backend jax supports --algo {', '.join(ALGOS)}, not {config.algo!r}")
        self.config, self.perf = config, perf or PerfConfig()
        # Validation, setting, claim: the torch trainer of the same settings (it refuses --backend jax itself).
        self.reference = get_trainer(config.algo)(config, dataclasses.replace(self.perf, backend="torch"))
        self.private = self.reference.private

    def fit(
        self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, progress: Progress = NULL_PROGRESS
    ) -> TrainOutcome:
        trainable_parameters(model)  # none: one line, not next()'s StopIteration below
        dtype = next(model.parameters()).dtype
        with jax.enable_x64(dtype == torch.float64), jax.default_device(_jax_device(self.perf.device)):
            return self._fit(model, X, y, progress)

    def _fit(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, progress: Progress) -> TrainOutcome:
        from dpaudit.models import check_full_precision, check_per_record_in_training, check_private_layers
        from dpaudit.training.dpsgd import poisson_sampler, privacy_claim, shuffle_sampler
        from dpaudit.validation import check_positive

        config, dp = self.config, self.config.dp
        n = X.shape[0]
        if n == 0:
            raise InputError("the training set is empty")
        if config.batch_size > n:
            raise InputError(f"batch size {config.batch_size} is larger than the training set ({n} records)")
        if self.private:  # BatchNorm & co.; a non-private run gets jax_forward's refusal of what it cannot run
            check_private_layers(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        if self.private:
            check_full_precision(trainable, "convert the model with .float() (the JAX backend computes in float32)")
        elif low := next((p.dtype for p in trainable if p.dtype not in (torch.float32, torch.float64)), None):
            raise InputError(
                f"--backend jax trains float32 or float64 parameters, not {str(low).removeprefix('torch.')}; "
                "convert the model with .float()"
            )
        model.train()  # as the torch trainers train: F.dropout(x, p, self.training) is traced with training=True
        apply = jax_forward(model)
        params = params_from_torch(model)
        Xj, yj = jnp.asarray(X.cpu().numpy()), jnp.asarray(y.cpu().numpy().astype(np.int32))
        check_embedding_ids(apply, params, Xj)  # before torch's forward in check_same_logits, which would raise
        check_same_logits(model, apply, params, X[:8], Xj[:8])
        if self.private:  # the torch clippers' check (clipping.py), then the JAX graph's own (batch-size shapes)
            first = X[:5].to(next(model.parameters()).dtype) if X.is_floating_point() else X[:5]
            check_per_record_in_training(model, first)
            check_alone_as_in_batch(apply, params, Xj[:8])
        optimizer = "adam" if config.algo in ("adam", "dpadam", "dpadam-jl") else "sgd"
        batch_gen = torch.Generator().manual_seed(config.seed + 1)  # the torch trainers' batch seed
        history: list[dict[str, float]] = []
        if not self.private:
            program = StepProgram(
                apply, params, config, kind="sgd", optimizer=optimizer, dropout_key=_jax_key(config.seed + 4, False)
            )
            steps, claim, pad = config.num_steps(n), None, config.batch_size
            sample = None
        else:
            clip = check_positive(clip=dp.clip)
            setting = self.reference.setting_for(n)
            claim = privacy_claim(setting, dp)  # the same event and ε as the torch trainer, before training
            jl = getattr(dp, "jl_projections", None) if config.algo.endswith("-jl") else None
            if config.algo.endswith("-jl") and not jl:
                raise InputError(f"--algo {config.algo} needs --jl-projections R (R >= 1)")
            if jl:  # as the torch JL trainer records its AD path: here forward mode, jax.jvp
                claim = {**claim, "jl": {"projections": jl, "ad_path": "jax.jvp"}}
            program = StepProgram(
                apply,
                params,
                config,
                kind="jl" if jl else "dp",
                optimizer=optimizer,
                clip=clip,
                noise_std=setting.noise_multiplier * clip,
                jl_projections=jl or 1,
                noise_key=_jax_key(config.seed + 2, dp.secure_noise),
                jl_key=_jax_key(config.seed + 3, dp.secure_noise),
                dropout_key=_jax_key(config.seed + 4, dp.secure_noise),
            )
            steps = setting.steps
            poisson = dp.sampling == "poisson"
            sample = (
                poisson_sampler(n, setting.sample_rate, batch_gen)
                if poisson
                else shuffle_sampler(n, config.batch_size, batch_gen)
            )
            pad = self.perf.max_physical_batch or (
                pad_size(config.batch_size, setting.sample_rate) if poisson else config.batch_size
            )
        state = program.init_state(params)
        with progress.task(f"train {config.algo} (jax)", steps) as advance:
            if self.private:
                for t in range(steps):
                    batch = sample().numpy()
                    params, state = program.run_step(params, state, Xj, yj, batch, pad, t, config.batch_size)
                    if (epoch := config.epoch_ended(t + 1, n, steps)) is not None:
                        history.append({"epoch": epoch, "steps": t + 1})
                    advance(1)
            else:
                t = 0
                while t < steps:  # the non-private trainer's epochs: a fresh permutation, batches of B
                    perm = torch.randperm(n, generator=batch_gen).numpy()
                    for start in range(0, n, config.batch_size):
                        if t >= steps:
                            break
                        batch = perm[start : start + config.batch_size]
                        # mean loss over the (possibly shorter last) batch, as F.cross_entropy's default
                        params, state = program.run_step(params, state, Xj, yj, batch, pad, t, len(batch))
                        t += 1
                        advance(1)
                    history.append({"steps": t})
        params_to_torch(model, params)
        model.eval()
        return TrainOutcome(model=model, privacy=claim, history=history)
