"""Per-example gradient clipping: the clipped-gradient sum of DP-SGD behind one interface.

For a batch ``(x_1, y_1) ... (x_B, y_B)``, per-example loss ``ℓ_i`` (cross-entropy) and clipping
norm ``C``, every method returns

    Σ_i  g_i / max(1, ‖g_i‖₂ / C),     g_i = ∇_θ ℓ_i(θ)            (Abadi et al. 2016, arXiv:1607.00133, Alg. 1)

(one tensor per trainable parameter) and the per-example norms ``‖g_i‖₂`` (for diagnostics and
tests). ``‖g_i‖`` is the norm of the *whole* per-example gradient (all trainable parameters
flattened together: "flat" clipping), which is what bounds the sensitivity of the sum by ``C``.

Methods (chosen by name, ``PerfConfig.clipping``):

* ``loop``  – one example at a time; the reference the others are tested against.
* ``vmap``  – ``torch.func.vmap(grad(...))`` over ``functional_call``: materialises per-example
  gradients for any model (the multiple-copies idea of Goodfellow 2015, vectorised).
* ``ghost`` – mixed per-layer clipping in one forward and one backward pass (:class:`GhostClipper`):
  module hooks record each layer's input ``a`` and output gradient ``g`` (the backward pass skips
  the parameter gradients, and forms each layer's part as its ``g`` arrives, releasing what the
  clipped sum does not need); per layer the cost model picks the ghost norm (Goodfellow 2015,
  arXiv:1510.01799; Rochette et al. 2019, arXiv:1912.06015 for convolutions; Li et al. 2021,
  arXiv:2110.05679 for sequences) or instantiating the per-example gradient, whichever is cheaper
  (2T² vs p·d; Bu et al. 2022, arXiv:2205.10683; Bu et al. 2023, arXiv:2210.00038), then the
  clipped sum by book-keeping from the same ``a`` and ``g`` (Bu et al. 2023). Rules: ``Linear``
  (any leading dims, any number of calls), ``Conv2d`` (any stride, padding, padding mode and
  dilation; on the instantiate side its per-example gradients come either from its unfolded
  patches, kh·kw times its input at stride 1, built a chunk of examples at a time and dropped after
  the norms, or from one grouped convolution over the examples, with no patches at all (Rochette et
  al. 2019); groups > 1 takes the latter always), ``Embedding``,
  ``LayerNorm``, ``GroupNorm``. Beyond them:

  - a layer applied to a tensor without the batch dimension (a positional embedding of
    ``torch.arange(T)``, a Linear on a shared query) has its output expanded to the batch (a
    view) in the clipping forward, so its gradient is per example: the per-example gradient is
    the per-example output gradient contracted with the shared input;
  - a weight shared by several layers (tied embedding / output head) gets the norm of the sum of
    its uses' gradients: by the ghost norm over all the uses' positions, cross terms included
    (:func:`_tied_part`), or, when that is dearer (or a use has no factored form), by instantiating
    each use and summing;
  - ``nn.MultiheadAttention`` without dropout (masks, returned weights, kdim/vdim, add_bias_kv and
    add_zero_attn included): per-example gradients by recomputing the attention from its recorded
    inputs (:func:`_mha_per_example`, :func:`_mha_general_per_example`);
  - ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` (tanh, relu; any ``num_layers``, ``bidirectional``,
    ``batch_first``, ``bias``, an LSTM's ``proj_size``, initial state given or not; ``output``,
    ``h_n`` and ``c_n`` may all carry gradient): per-example gradients by recomputing the
    recurrence step by step from the recorded inputs (:func:`_rnn_per_example`). Not covered (a
    vmap over the module, which cannot run torch's fused kernels: ghost refuses, ``auto`` falls
    back to the loop): dropout between layers in training mode, ``PackedSequence`` and unbatched
    inputs;
  - a bare ``nn.Parameter`` of the model itself (a ViT's ``cls_token`` and ``pos_embed``, a GPT's
    ``wpe``) whose every use broadcasts it, or a view of it (``wpe[:T]``), against the batch
    (``P.expand(B, ...)``, ``x + P``, ``x * P``): in the clipping forward a torch-function mode
    replaces it in each such use by its expansion to the batch (a view), whose gradient's rows,
    summed over the broadcast dimensions and mapped back through the view, are its per-example
    gradients (:class:`_BareMode`);
  - any other module that owns parameters without a rule (MHA with dropout in training, a custom
    block with a bare ``nn.Parameter``) gets per-example gradients by a vmap over that module alone, from its
    recorded inputs and output gradients; a bare parameter of the model itself used any other way
    (a matmul), or one used outside its module's forward, by a vmap over the model.

  Squared norms over disjoint parameter sets add, so the combination is exact. (In training
  mode a vmap re-runs its module with fresh dropout masks: the result is still a function of
  example i alone with its norm computed exactly, which is all the clipping bound needs.)
* ``auto``  – decided on the first batch: ``ghost`` when its plan has a layer with a rule and
  passes the first-call check, else ``vmap``, else ``loop``; ``describe()`` says what it chose,
  per layer, and is recorded in the checkpoint (``dpaudit inspect`` prints it).

Assumptions shared by all methods (checked where possible):

* The loss of example ``i`` depends on example ``i`` only: no BatchNorm or other layer that mixes
  examples (refused by :func:`dpaudit.models.check_private_layers`).
* ``ghost``: a probe at batch sizes 2 and 3 finds each layer's batch dimension; the first call
  compares every layer's result on the first few examples with the one-example-at-a-time
  reference and moves a disagreeing parameter (used outside its module's forward, an output
  changed in place) to a vmap over the model; if the norms still disagree the model is refused
  (:class:`GhostMismatchError`), so a violated assumption fails loudly instead of clipping wrongly.

Numerics: norms and clipped sums are computed in the parameters' dtype from the same tensors, with
TF32 off (:func:`exact_matmuls`); under ``autocast`` (bf16 forward/backward) the recorded ``a`` and
``g`` are cast to the parameters' dtype first, so each clipped contribution has norm <= C up to
float32 rounding. The methods agree to rounding (~1e-15 relative in float64, ~1e-6 in float32);
the ghost Gram sum Σ(a_t·a_s)(g_t·g_s) is clamped at 0 before the square root. Everything is
device- and dtype-agnostic (float32/float64, CPU/CUDA); nothing leaves the device.
"""

from __future__ import annotations

import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F
from torch.nn.grad import conv2d_weight

from dpaudit.errors import InputError
from dpaudit.models import (
    ParameterWatch,
    check_buffers_unchanged,
    check_full_precision,
    check_per_record_in_training,
    check_private_layers,
    released_buffers,
)
from dpaudit.training.base import trainable_parameters
from dpaudit.training.config import CLIPPING
from dpaudit.validation import check_choice, check_positive


class GhostMismatchError(InputError):
    """Ghost norms disagree with materialised per-example gradients on the first batch."""


@dataclass(frozen=True)
class ClippedGradients:
    """The result of one clipping call on a batch of ``B`` examples.

    ``grads``: Σ_i min(1, C/‖g_i‖) g_i, one tensor per trainable parameter, in the order of
    :func:`trainable_parameters`. ``norms``: the unclipped per-example norms ‖g_i‖, shape (B,).
    """

    grads: tuple[torch.Tensor, ...]
    norms: torch.Tensor


def hooked_parameters(model: nn.Module, params: Sequence[nn.Parameter]) -> list[str]:
    """The names of those ``params`` that carry a gradient hook of their own (``Tensor.register_hook``).

    Why it matters: a backward pass (the loop, the ghost check's reference) runs such a hook on the
    parameter's gradient, but ``torch.func.grad`` (the vmap method, the ghost method's vmap units)
    differentiates a substituted tensor and never runs it, so its per-example gradients would silently
    be those of the unhooked model. (A hook added by ``register_post_accumulate_grad_hook`` runs only
    when ``.grad`` is accumulated, which no clipping method does: not counted.)"""
    if not any(p._backward_hooks for p in params):  # the common case: one attribute read per parameter
        return []
    ids = {id(p) for p in params if p._backward_hooks}
    return [n for n, p in model.named_parameters() if id(p) in ids]


def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """c_i = 1 / max(1, ‖g_i‖/C)  (Abadi et al. 2016, arXiv:1607.00133, Alg. 1, "clip gradient").

    Written as a division by max(1, ·) rather than min(1, C/‖g‖) so that a zero norm needs no
    special case (no 0/0 or C/0).
    """
    return 1.0 / torch.clamp(norms / clip, min=1.0)


def _per_example_loss_sum(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, autocast: torch.dtype | None = None
) -> torch.Tensor:
    # Σ_i ℓ_i: with reduction="sum" the gradient of the total w.r.t. anything computed from example
    # i alone is the gradient of ℓ_i (examples do not interact), which the ghost method relies on.
    with _autocast(x, autocast):
        logits = model(x)
    return _loss_from_logits(logits, y, autocast)


def _autocast(x: torch.Tensor, dtype: torch.dtype | None):
    """Mixed precision for the forward pass only (``PerfConfig.autocast``); a no-op when None."""
    return torch.autocast(device_type=x.device.type, dtype=dtype) if dtype is not None else nullcontext()


def _loss_from_logits(logits: torch.Tensor, y: torch.Tensor, autocast: torch.dtype | None) -> torch.Tensor:
    # Under autocast the loss is taken in float32 (bf16 logits would round the loss to 3 digits).
    return F.cross_entropy(logits.float() if autocast is not None else logits, y, reduction="sum")


@contextmanager
def exact_matmuls():
    """No TF32 inside: per-example norms and the clipped sum must be computed in full float32.

    Why: DP-SGD's guarantee needs every clipped contribution c_i g_i to have norm <= C. TF32 (the
    default for cuDNN convolutions on Ampere and later GPUs) and bf16 keep 10 and 7 mantissa bits,
    so a norm or a weighted sum computed in them can be off by ~1e-3 relative, i.e. overshoot C
    (as seen in the JAX backend); in float32 the overshoot is ~1e-7 relative, the rounding every
    implementation accepts. The forward and backward passes may use TF32/bf16 freely: only the
    norms and the sums must be computed from the same tensors in full precision.
    """
    if not torch.cuda.is_available():
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


AUTOCAST = {"bf16": torch.bfloat16}


def check_autocast(name: str | None, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``--autocast NAME`` on ``device``; refuses a device without it."""
    if name is None:
        return None
    check_choice(tuple(AUTOCAST), autocast=name)
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise InputError(f"--autocast {name}: this CUDA device has no bfloat16 support (needs compute capability 8.0+)")
    return AUTOCAST[name]


class Clipper(ABC):
    """Computes :class:`ClippedGradients` for batches; built once per model by :func:`make_clipper`."""

    method: str
    # True: the method honours ``valid`` (rows after the first ``valid`` are padding whose clip factor
    # is exactly 0, see :meth:`_clip_factors`); a method that does not (JL) is never given padding.
    pads = False

    def __init__(self, model: nn.Module, *, autocast: torch.dtype | None = None) -> None:
        check_private_layers(model)
        self.model = model
        self.autocast = autocast  # mixed precision for forward/backward; norms and sums in float32
        self.params = trainable_parameters(model)
        check_full_precision(self.params)
        self._watched = list(model.parameters())  # trainable and frozen: ParameterWatch on every call
        self._valid = 0  # real rows of the batch being clipped (set per call)
        self._buffers_checked = False  # the first call checks that no released buffer learns from the data
        self._norm_overflow: torch.Tensor | None = None  # any real row's norm inf so far (on the device)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, clip: float, *, valid: int | None = None) -> ClippedGradients:
        """Clipped-gradient sum and per-example norms for the batch (x, y) at clipping norm ``clip``.

        ``valid``: only the first ``valid`` rows are examples; the others are padding (copies of a
        real row, so their gradients are finite), which gets clip factor exactly 0 and adds exactly
        0 to every sum (a padded physical batch: a few fixed shapes instead of one per Poisson batch
        size). ``norms`` then has the ``valid`` real rows only."""
        clip = check_positive(clip=clip)
        n = x.shape[0]
        if n != y.shape[0]:
            raise InputError(f"x has {n} examples but y has {y.shape[0]}")
        valid = n if valid is None else int(valid)
        if not 0 <= valid <= n:
            raise InputError(f"expected valid in [0, {n}], got {valid}")
        if valid < n and not self.pads:
            raise InputError(f"--clipping {self.method} does not take padded batches")
        if valid == 0:
            return ClippedGradients(
                grads=tuple(torch.zeros_like(p) for p in self.params),
                norms=torch.zeros(0, dtype=self.params[0].dtype, device=self.params[0].device),
            )
        self._valid = valid
        watch = ParameterWatch(self._watched, copy_values=not self._buffers_checked)
        if self._buffers_checked:
            out = self._compute(x, y, clip)
        else:  # batch mixing in training mode; a running statistic in the state dict released without noise
            check_per_record_in_training(self.model, x[:valid])
            before = released_buffers(self.model)
            out = self._compute(x, y, clip)
            check_buffers_unchanged(self.model, before, x)
            self._buffers_checked = True
        watch.check(self.model)
        inf = torch.isinf(out.norms[:valid]).any()  # queued on the device: no host read per step
        self._norm_overflow = inf if self._norm_overflow is None else self._norm_overflow | inf
        return out if out.norms.shape[0] == valid else ClippedGradients(out.grads, out.norms[:valid])

    def check_norms_finite(self) -> None:
        """One :class:`InputError` line when a per-example gradient norm of any call so far was infinite.

        A float32 norm overflows once ‖g‖ > ~1.8e19 (its square passes 3.4e38) while every coordinate of g is
        finite: the clip factor 1 / max(1, ‖g‖/C) is then 1/inf = 0 instead of C/‖g‖, so the example adds
        nothing to the sum. DP-SGD on raw features of 1e20 (a private run without an aux split keeps them raw)
        trained on the noise alone, every example dropped, and was saved with its accuracy and claim, exit 0.
        The claim still holds (each contribution has norm 0 <= C); the model means nothing."""
        if self._norm_overflow is not None and bool(self._norm_overflow):
            raise InputError(
                "a per-example gradient norm overflowed float32 (a norm above ~1.8e19 is inf there): clipping "
                "scaled those examples' gradients by 0, so they did not move the model; standardise the features "
                "(a private run without an aux split keeps them raw), or lower --lr"
            )

    def _clip_factors(self, norms: torch.Tensor, clip: float) -> torch.Tensor:
        """:func:`clip_factors` of the rows, with every padding row's factor set to exactly 0.

        Why the clipped sum is then exactly the unpadded one: Σ_i c_i g_i over the padded batch is the
        real rows' terms plus 0·g_j for each padding row j, and 0·g_j = 0 for finite g_j (a padding
        row is a copy of a real row, so its gradient is finite whenever theirs are). The real rows'
        own g_i are unchanged by the padding because the loss is Σ_i ℓ_i and ℓ_i depends on row i
        only (no layer mixes examples: BatchNorm is refused, GroupNorm/LayerNorm normalise within an
        example, and the ghost check compares every layer with the one-example reference; vmap runs
        each example as a batch of one and the loop skips padding rows), so the output gradient of row
        i is ∂ℓ_i/∂out_i whatever the other rows are. Only the summation order (rounding) can differ,
        and, with dropout, which random masks the real rows draw (still independent of the data).
        The norms of padding rows are computed but never returned."""
        c = clip_factors(norms, clip)
        if self._valid < norms.shape[0]:
            c[self._valid :] = 0.0  # a slice fill: no host read
        return c

    @abstractmethod
    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients: ...

    def close(self) -> None:
        """Release what the clipper installed on the model (the ghost method's forward hooks); the
        trainers call it when training ends. A no-op for methods that install nothing."""
        return None

    def describe(self) -> dict[str, Any]:
        """What computed the clipped sums (JSON-ready; recorded in the checkpoint's ``performance``)."""
        return {"method": self.method}


# --------------------------------------------------------------------------------------------- loop


class LoopClipper(Clipper):
    """One backward pass per example: slow, obviously correct; the test reference."""

    method = "loop"
    pads = True  # padding rows are simply skipped

    def __init__(self, model: nn.Module, *, autocast: torch.dtype | None = None) -> None:
        super().__init__(model, autocast=autocast)
        self._ran = False

    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        if not self._ran:  # a model that fails on one example: one line, as vmap and ghost say it
            with _refusing("loop", "the model fails on a batch of one example"):
                out = self._sums(x, y, clip)
            self._ran = True
            return out
        return self._sums(x, y, clip)

    def _sums(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        sums = [torch.zeros_like(p) for p in self.params]
        norms = []
        for i in range(self._valid):
            loss = _per_example_loss_sum(self.model, x[i : i + 1], y[i : i + 1], self.autocast)
            gs = torch.autograd.grad(loss, self.params, allow_unused=True)
            gs = [torch.zeros_like(p) if g is None else g for p, g in zip(self.params, gs, strict=True)]
            with exact_matmuls():
                norm = torch.sqrt(sum(g.square().sum() for g in gs))
                c = clip_factors(norm, clip)
                for s, g in zip(sums, gs, strict=True):
                    s.add_(g * c)
            norms.append(norm)
        return ClippedGradients(grads=tuple(sums), norms=torch.stack(norms))


# --------------------------------------------------------------------------------------------- vmap


def tied_paths(module: nn.Module) -> dict[str, tuple[str, ...]]:
    """For each parameter or buffer path of ``module`` whose tensor is also held at another
    (submodule, attribute) slot (tied weights: ``head.weight = emb.weight``), those other paths;
    a submodule registered under several names (the same block in a ``ModuleList`` twice) is one
    slot, named once. What :func:`reparametrized_call` needs to replace a tensor everywhere."""
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    slots: dict[tuple[int, str], str] = {}  # (id(owner), attribute) -> its first path
    by_tensor: dict[int, list[str]] = {}
    for path, t in named:
        owner, _, attr = path.rpartition(".")
        slot = (id(module.get_submodule(owner)), attr)
        if slot not in slots:
            slots[slot] = path
            by_tensor.setdefault(id(t), []).append(path)
        else:
            by_tensor.setdefault(id(t), [])
    out: dict[str, tuple[str, ...]] = {}
    for path, t in named:
        paths = by_tensor[id(t)]
        if len(paths) > 1:
            owner, _, attr = path.rpartition(".")
            own = slots[(id(module.get_submodule(owner)), attr)]
            out[path] = tuple(p for p in paths if p != own)
    return out


def reparametrized_call(
    module: nn.Module, tensors: dict[str, torch.Tensor], tied: dict[str, tuple[str, ...]], args: tuple, kwargs=None
):
    """``module(*args, **kwargs)`` with the named parameters/buffers replaced by ``tensors`` (and
    each one's tied copies, ``tied`` = :func:`tied_paths`), as ``torch.func.functional_call``.

    Why not ``functional_call(..., tie_weights=True)`` itself: with a submodule registered under two
    names (torch 2.13) it swaps the same slot twice and restores it to the *replacement*, leaving
    the user's model with plain tensors in place of its parameters (found by
    benchmarks/clipping_fuzz.py). Here every slot is named once and nothing is untied by torch."""
    full = dict(tensors)
    for n, t in tensors.items():
        for alias in tied.get(n, ()):
            full[alias] = t
    return functional_call(module, full, args, kwargs, tie_weights=False)


def _per_example_grads(
    model: nn.Module,
    names: Sequence[str],
    x: torch.Tensor,
    y: torch.Tensor,
    autocast: torch.dtype | None = None,
    tied: dict[str, tuple[str, ...]] | None = None,
) -> list[torch.Tensor]:
    """Per-example gradients (B, *p.shape) of ℓ_i w.r.t. the named parameters, by vmap over grad.

    Every other parameter and buffer enters the call as a constant. ``randomness=
    "different"`` gives each example its own dropout mask, as the loop reference would.
    ``tied``: :func:`tied_paths` of the model (computed here when not given).
    """
    fixed = {n: p.detach() for n, p in model.named_parameters()}
    diff = {n: fixed.pop(n) for n in names}
    fixed.update(model.named_buffers())
    tied = tied_paths(model) if tied is None else tied

    def loss_one(d: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        with _autocast(xi, autocast):
            out = reparametrized_call(model, {**fixed, **d}, tied, (xi.unsqueeze(0),))
        return _loss_from_logits(out, yi.unsqueeze(0), autocast)

    g = vmap(grad(loss_one), in_dims=(None, 0, 0), randomness="different")(diff, x, y)
    return [g[n] for n in names]


def _total(terms) -> torch.Tensor:
    # Σ of tensors without the 0 + t0 that builtin sum() starts with (one more kernel launch each time).
    it = iter(terms)
    out = next(it)
    for t in it:
        out = out + t
    return out


def _sq_norms(per_example: Sequence[torch.Tensor]) -> torch.Tensor:
    return _total(g.reshape(g.shape[0], -1).square().sum(1) for g in per_example)


def _weighted_sum(c: torch.Tensor, per_example: torch.Tensor) -> torch.Tensor:
    # Σ_i c_i G_i as one matrix-vector product.
    return (c @ per_example.reshape(per_example.shape[0], -1)).reshape(per_example.shape[1:])


class VmapClipper(Clipper):
    """Materialised per-example gradients with ``torch.func`` (works for any functional model)."""

    method = "vmap"
    pads = True

    def __init__(self, model: nn.Module, *, autocast: torch.dtype | None = None) -> None:
        super().__init__(model, autocast=autocast)
        ids = {id(p) for p in self.params}
        self.names = [n for n, p in model.named_parameters() if id(p) in ids]
        self._tied = tied_paths(model)
        self._ran = False

    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        hooked = hooked_parameters(self.model, self.params)
        if hooked:  # torch.func would skip them: refuse rather than clip another model's gradients
            raise GhostMismatchError(
                f"--clipping vmap cannot run the gradient hooks on {', '.join(hooked)} (Tensor.register_hook: "
                "torch.func's gradients skip them); try --clipping loop"
            )
        if not self._ran:  # an operation vmap cannot batch: one line naming the way out
            with _refusing("vmap", "try --clipping loop"):
                per_example = _per_example_grads(self.model, self.names, x, y, self.autocast, self._tied)
            self._ran = True
        else:
            per_example = _per_example_grads(self.model, self.names, x, y, self.autocast, self._tied)
        with exact_matmuls():
            norms = torch.sqrt(_sq_norms(per_example))
            c = self._clip_factors(norms, clip)
            return ClippedGradients(grads=tuple(_weighted_sum(c, g) for g in per_example), norms=norms)


# -------------------------------------------------------------------------------------------- ghost


@dataclass
class _LayerPart:
    """One layer's contribution for the parameters it handles without per-example gradients:
    per-example squared norm (B,), a function c -> clipped sums (parameter name -> Σ_i c_i ∇_p ℓ_i)
    and the per-layer method the cost model chose (recorded by :meth:`GhostClipper.describe`).

    ``small``: per-example gradients (B, *p.shape) of small parameters of the layer (biases over
    positions, norm-layer affines), left out of ``sq_norm`` and ``clipped``: the clipper pools them
    with every other layer's (:class:`_PerExample`), one kernel for all their norms and one for all
    their clipped sums instead of a few per parameter (per-op launch cost dominates such layers)."""

    sq_norm: torch.Tensor | None
    clipped: Callable[[torch.Tensor], dict[str, torch.Tensor]]
    how: str
    small: dict[str, torch.Tensor] = field(default_factory=dict)


class _PerExample:
    """Per-example gradients (B, *p.shape) by parameter index, with their squared norms and clipped
    sums. Those of at most ``POOL`` elements per example are concatenated into one (B, Σp) matrix M:
    ‖·‖² over disjoint parameter sets add, so Σ_k ‖G_k,i‖² = ‖M_i‖² (one kernel), and
    Σ_i c_i G_k,i is the slice of cᵀM (one matrix-vector product) for every k at once."""

    # Larger ones (instantiated or vmap'd weights) are not copied into M: the copy would add their
    # memory again for nothing (their norm and sum are one or two kernels each anyway).
    POOL = 4096

    def __init__(self, grads: dict[int, torch.Tensor], B: int) -> None:
        self.B = B
        self.pooled = [k for k, G in grads.items() if G.numel() <= self.POOL * B]
        flat = [G if G.dim() == 2 else G.reshape(B, -1) for G in (grads[k] for k in self.pooled)]
        self.M = (torch.cat(flat, dim=1) if len(flat) > 1 else flat[0]) if flat else None
        self.sizes = [f.shape[1] for f in flat]
        self.shapes = {k: grads[k].shape[1:] for k in self.pooled}
        # Only the unpooled gradients are kept apart: the pooled ones live in M (a copy when several
        # are concatenated; their originals go with the caller's dict, not held twice).
        self.grads = {k: G for k, G in grads.items() if k not in self.shapes}

    def all(self) -> dict[int, torch.Tensor]:
        """Every per-example gradient (B, *p.shape) by parameter index (the pooled ones from M)."""
        out = dict(self.grads)
        if self.M is not None:
            cols = self.M.split(self.sizes, dim=1) if len(self.sizes) > 1 else [self.M]
            out.update({k: v.reshape(self.B, *self.shapes[k]) for k, v in zip(self.pooled, cols, strict=True)})
        return out

    def sq_norms(self) -> list[torch.Tensor]:
        out = [self.M.square().sum(1)] if self.M is not None else []
        return out + [_sq_norms([G]) for G in self.grads.values()]

    def clipped(self, c: torch.Tensor) -> dict[int, torch.Tensor]:
        out = {k: _weighted_sum(c, G) for k, G in self.grads.items()}
        if self.M is not None:
            sums = c @ self.M
            for k, v in zip(self.pooled, sums.split(self.sizes) if len(self.sizes) > 1 else [sums], strict=True):
                shape = self.shapes[k]
                out[k] = v if v.shape == shape else v.view(shape)
        return out


def _ghost_is_cheaper(T: int, d_in: int, d_out: int) -> bool:
    """The layerwise choice of mixed ghost clipping / hybrid book-keeping: ghost norm when
    2T² < p·d (Bu et al. 2022, arXiv:2205.10683, Sec. 4 "mixed ghost clipping"; Bu et al. 2023,
    arXiv:2210.00038, Sec. 3.3 "hybrid BK"). Time: the ghost norm costs O(B·T²·(d_in + d_out)),
    instantiation O(B·T·d_in·d_out); memory: B·2T² for the two Gram matrices against B·d_in·d_out
    for the per-example gradients; both comparisons reduce to 2T² vs d_in·d_out up to constants."""
    return 2 * T * T <= d_in * d_out


def _factored_linear(
    a: torch.Tensor | Callable[[int, int], torch.Tensor],
    g: torch.Tensor,
    weight_shape: torch.Size | None,
    bias: bool,
    weight_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    chunk: int | None = None,
) -> _LayerPart:
    """A linear map s_t = W a_t + b applied at T positions per example.

    a: (B, T, d_in) inputs and g: (B, T, d_out) gradients of Σ_i ℓ_i w.r.t. the outputs, in any
    strides (a convolution passes transposed views of its (B, d, T) patches and output gradients,
    so nothing is copied). The per-example gradients are ∇_W ℓ_i = Σ_t g_it a_itᵀ and
    ∇_b ℓ_i = Σ_t g_it. ``weight_sum(c)``, when given, computes Σ_i c_i ∇_W ℓ_i in a way cheaper
    for the layer than the generic matmul.

    ``a`` may instead be a function (lo, hi) -> the (hi - lo, T, d_in) inputs of examples lo..hi-1,
    called ``chunk`` examples at a time (a convolution's unfolded patches, up to kh·kw times the
    size of its input: built per chunk and dropped, they never all exist at once); then
    ``weight_sum`` is required, since the clipped sum must not need them again.
    """
    lazy = callable(a)
    B, T, d_out = g.shape
    d_in = (weight_shape.numel() // d_out if weight_shape is not None else 0) if lazy else a.shape[2]
    step = chunk or B

    def inputs(lo: int, hi: int) -> torch.Tensor:
        return a(lo, hi) if lazy else a if (lo, hi) == (0, B) else a[lo:hi]

    G = None
    gb = (g[:, 0] if T == 1 else g.sum(1)) if bias else None
    sq = None
    if weight_shape is None:
        how = "bias only"
    elif T == 1:
        # Rank one: ‖g aᵀ‖_F² = ‖g‖² ‖a‖² (Goodfellow 2015, arXiv:1510.01799); the bias is pooled.
        how = "rank-one"
        sq = g[:, 0].square().sum(1) * inputs(0, B)[:, 0].square().sum(1)
    else:
        ghost = _ghost_is_cheaper(T, d_in, d_out)
        if ghost:
            # Ghost norm: ‖Σ_t g_t a_tᵀ‖_F² = Σ_{t,s} (a_t·a_s)(g_t·g_s)  (Li et al. 2021,
            # arXiv:2110.05679, Sec. 4).
            how = f"ghost-norm (T={T}: 2T²={2 * T * T} <= p·d={d_in * d_out})"
        else:
            # Instantiate G_i = Σ_t g_t a_tᵀ (B, d_out, d_in) when that is the cheaper side.
            how = f"instantiate (T={T}: 2T²={2 * T * T} > p·d={d_in * d_out})"
            G = g.new_empty(B, d_out, d_in)
        terms = []
        for lo in range(0, B, step):
            hi = min(B, lo + step)
            whole = (lo, hi) == (0, B)  # no slicing ops for the usual single chunk
            x, gx = inputs(lo, hi), g if whole else g[lo:hi]
            if ghost:
                terms.append((torch.bmm(x, x.mT) * torch.bmm(gx, gx.mT)).sum((1, 2)))
            else:
                terms.append(torch.bmm(gx.mT, x, out=G if whole else G[lo:hi]).square().sum((1, 2)))
        sq = _cat_positions(terms, dim=0)
        if step < B:
            how += f", in chunks of {step} examples"

    # The clipped sum's closure holds only what it reads: with G instantiated, neither a nor g (nor
    # ``weight_sum``, which holds a convolution's inputs and output gradients) is kept alive.
    if G is not None:

        def weight(c: torch.Tensor) -> torch.Tensor:
            return _weighted_sum(c, G)

    elif weight_sum is not None:
        weight = weight_sum
    else:

        def weight(c: torch.Tensor) -> torch.Tensor:
            # Book-keeping (BK; Bu et al. 2023, arXiv:2210.00038, Alg. 1): Σ_i c_i Σ_t g_it a_itᵀ
            # = (c ⊙ g)ᵀ a over all (i, t): one matmul, no per-example gradients, no 2nd backward.
            # c multiplies whichever factor is smaller.
            ci = c.view(-1, 1, 1)
            gc, ac = (g * ci, a) if d_out <= d_in else (g, a * ci)
            return gc.reshape(B * T, d_out).T @ ac.reshape(B * T, d_in)

    def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
        if weight_shape is None:
            return {}
        w = weight(c)
        return {"weight": w if w.shape == weight_shape else w.reshape(weight_shape)}

    # The bias's per-example gradient Σ_t g_it is small: pooled by the clipper (see _LayerPart).
    return _LayerPart(sq_norm=sq, clipped=clipped, how=how, small={"bias": gb} if gb is not None else {})


def _cat_positions(parts: Sequence[torch.Tensor], dim: int = 1) -> torch.Tensor:
    # Several calls of one module in a forward pass are extra positions of the same example
    # (Li et al. 2021 treat the time steps of a sequence this way): concatenate along ``dim``.
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


class _Handler(ABC):
    """Ghost-norm support for one module type. ``inputs`` and ``grads`` are the module's first input
    and the gradient of Σ_i ℓ_i w.r.t. its output, one entry per call, batch first (B, ...); an input
    shared by the batch arrives expanded to (B, ...) (a view). ``names``: the trainable parameters
    handled here (a parameter shared with another module goes through :meth:`factors` or
    :meth:`per_example`, see :func:`_tied_part`)."""

    batch_first_only = False  # True: the module needs its batch at dim 0 (Conv2d, GroupNorm)
    # Instantiation routes the handler offers: then ``part`` and ``per_example`` take ``route``
    # (one of them, or None for the handler's default on the inputs' device).
    routes: tuple[str, ...] = ()

    @staticmethod
    def supports(module: nn.Module) -> bool:
        return True

    @staticmethod
    @abstractmethod
    def part(module, inputs: list[torch.Tensor], grads: list[torch.Tensor], names: frozenset[str]) -> _LayerPart: ...

    @staticmethod
    @abstractmethod
    def per_example(module, inputs: list[torch.Tensor], grads: list[torch.Tensor], name: str) -> torch.Tensor:
        """The per-example gradients (B, *p.shape) of the parameter ``name`` through this module."""

    @staticmethod
    def factors(module, inputs: list[torch.Tensor], grads: list[torch.Tensor], name: str) -> _Factors | None:
        """The per-example gradient of the 2-d parameter ``name`` through this module as a sum of
        outer products over positions (:class:`_Factors`), or None when the rule has no such form."""
        return None


@dataclass(frozen=True)
class _Factors:
    """∇_W ℓ_i = Σ_t left_it right_itᵀ for a weight W of shape (rows, cols): ``left`` (B, T, rows),
    or (B, T) token indices standing for the one-hot rows e_tok (an embedding), and ``right``
    (B, T, cols). A Linear gives (output gradients, inputs), an embedding (tokens, output gradients)."""

    left: torch.Tensor
    right: torch.Tensor


def _left_gram(u: _Factors, v: _Factors) -> torch.Tensor:
    # (B, T_u, T_v) of left_ut · left_vs; a one-hot row e_tok against a dense row L_s is L_s[tok].
    # Token factors come first (_tied_part sorts the uses), so v has tokens only if u has.
    lu, lv = u.left, v.left
    if lu.dim() == 2 and lv.dim() == 2:
        return lu.unsqueeze(2) == lv.unsqueeze(1)  # bool: multiplies as exact 0/1, no cast op
    if lu.dim() == 2:
        return lv.transpose(1, 2).gather(1, lu.unsqueeze(2).expand(-1, -1, lv.shape[1]))
    return torch.bmm(lu, lv.transpose(1, 2))


def _tied_part(uses: list[_Factors], shape: torch.Size) -> _LayerPart | None:
    """A weight used by several layers (tied embedding and output head): the norm of the *sum* of
    its uses' per-example gradients without instantiating them, or None when instantiation is
    cheaper. The uses are one linear map applied at the positions of all uses together, so the
    ghost norm of the concatenated positions (Li et al. 2021, arXiv:2110.05679, Sec. 4) is
    ‖Σ_u Σ_t l_ut r_utᵀ‖² = Σ_{u,v} Σ_{t,s} (l_ut·l_vs)(r_ut·r_vs): the uses' own ghost norms plus
    twice the cross terms u < v. Chosen by the same rule as one layer (2T² <= p·d with T the
    positions of all uses); the clipped sum is the uses' book-keeping sums added (Bu et al. 2023)."""
    rows, cols = shape[0], shape[1:].numel()
    uses = sorted(uses, key=lambda f: f.left.dim())  # token factors first (see _left_gram)
    T = sum(f.right.shape[1] for f in uses)
    if not _ghost_is_cheaper(T, rows, cols):
        return None
    sq = None
    for i, u in enumerate(uses):
        for j in range(i, len(uses)):
            v = uses[j]
            term = (_left_gram(u, v) * torch.bmm(u.right, v.right.transpose(1, 2))).sum((1, 2))
            term = term if i == j else 2 * term
            sq = term if sq is None else sq + term

    def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
        w = uses[0].right.new_zeros(rows, cols)
        for f in uses:
            rc = (f.right * c.view(-1, 1, 1)).reshape(-1, cols)
            if f.left.dim() == 2:  # Σ_i c_i Σ_t e_tok r_tᵀ: rows tok accumulate c_i r_t
                w.index_add_(0, f.left.reshape(-1), rc)
            else:
                w += f.left.reshape(-1, rows).T @ rc
        return {"": w.reshape(shape)}

    how = f"ghost-norm over its {len(uses)} uses with cross terms (T={T}: 2T²={2 * T * T} <= p·d={rows * cols})"
    return _LayerPart(sq_norm=sq, clipped=clipped, how=how)


def _rank_one_linear(a: torch.Tensor, g: torch.Tensor, weight: bool, bias: bool) -> _LayerPart:
    """A Linear called once on (B, d_in) inputs: the per-example gradient g_i a_iᵀ is rank one, so
    ‖g_i a_iᵀ‖_F² = ‖g_i‖² ‖a_i‖², and with the bias ‖g_i‖²(‖a_i‖² + 1) (Goodfellow 2015,
    arXiv:1510.01799). The special case of :func:`_factored_linear` with T = 1, written
    with as few tensor operations as possible because MLP steps are dominated by per-op overhead."""
    g_sq = g.square().sum(1)
    if weight:
        a_sq = a.square().sum(1)
        sq = g_sq * (a_sq + 1.0) if bias else g_sq * a_sq
    else:
        sq = g_sq

    def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if weight:  # book-keeping (Bu et al. 2023, arXiv:2210.00038): Σ_i c_i g_i a_iᵀ = (c ⊙ g)ᵀ a
            ci = c.unsqueeze(1)
            out["weight"] = (g * ci).T @ a if g.shape[1] <= a.shape[1] else g.T @ (a * ci)
        if bias:
            out["bias"] = c @ g
        return out

    return _LayerPart(sq_norm=sq, clipped=clipped, how="rank-one" if weight else "bias only")


def _positions(ts: list[torch.Tensor], B: int, d: int) -> torch.Tensor:
    # (B, T, d) positions of one module's calls; a 3-d tensor is already that (no reshape op).
    return _cat_positions([t if t.dim() == 3 else t.reshape(B, -1, d) for t in ts])


def _linear_positions(module, inputs, grads) -> tuple[torch.Tensor, torch.Tensor]:
    B = inputs[0].shape[0]
    return _positions(inputs, B, module.in_features), _positions(grads, B, module.out_features)


class _LinearHandler(_Handler):
    @staticmethod
    def part(module, inputs, grads, names):
        weight, bias = "weight" in names, "bias" in names
        if len(inputs) == 1 and inputs[0].dim() == 2:
            return _rank_one_linear(inputs[0], grads[0], weight, bias)
        a, g = _linear_positions(module, inputs, grads)
        return _factored_linear(a, g, module.weight.shape if weight else None, bias)

    @staticmethod
    def per_example(module, inputs, grads, name):
        a, g = _linear_positions(module, inputs, grads)
        return torch.bmm(g.transpose(1, 2), a) if name == "weight" else g.sum(1)

    @staticmethod
    def factors(module, inputs, grads, name):
        if name != "weight":
            return None
        a, g = _linear_positions(module, inputs, grads)
        return _Factors(left=g, right=a)


def _conv_padded(x: torch.Tensor, conv: nn.Conv2d) -> tuple[torch.Tensor, tuple[int, int]]:
    """``x`` padded the way ``conv``'s forward pads it, and the symmetric zero padding left to the
    convolution kernels: ``padding_mode`` other than zeros and asymmetric ``padding='same'`` are
    applied here (F.pad), so every rule below sees integer zero padding. 'same' splits the total
    dilation·(k - 1) as nn.Conv2d does: total // 2 before, the rest after."""
    pad: list[int] = []  # F.pad order: (left, right, top, bottom)
    for i in (1, 0):
        k, d, p = conv.kernel_size[i], conv.dilation[i], conv.padding
        if p == "valid":
            pad += [0, 0]
        elif p == "same":
            total = d * (k - 1)
            pad += [total // 2, total - total // 2]
        else:
            pad += [p[i], p[i]]
    if conv.padding_mode != "zeros":
        return F.pad(x, pad, mode=conv.padding_mode), (0, 0)
    if pad[0] == pad[1] and pad[2] == pad[3]:
        return x, (pad[2], pad[0])
    return F.pad(x, pad), (0, 0)


def _im2col(x: torch.Tensor, conv: nn.Conv2d, padding: tuple[int, int] | None = None) -> torch.Tensor:
    """The (B, C_in·kh·kw, L) input patches of ``conv`` (L = H'·W' output positions), ordered
    (C_in, kh, kw) as in ``weight.reshape(C_out, -1)``: equal to ``F.unfold``, built from strided
    views with one copy (``F.unfold`` on CPU loops over the batch in a parallel region per example,
    which was up to 20x slower here with 2 threads on a loaded machine, and no faster when idle).
    ``padding``: zero padding to apply (default ``conv.padding``; :func:`_conv_padded` gives it)."""
    (kh, kw), (dh, dw), (sh, sw) = conv.kernel_size, conv.dilation, conv.stride
    ph, pw = conv.padding if padding is None else padding
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    win = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)  # (B, C, H', W', eh, ew)
    if dh > 1 or dw > 1:
        win = win[..., ::dh, ::dw]
    B, C = x.shape[:2]
    return win.permute(0, 1, 4, 5, 2, 3).reshape(B, C * kh * kw, -1)


def _grouped_conv_weight_grads(conv: nn.Conv2d, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The per-example weight gradients (B, *weight.shape) of ``conv`` for inputs ``x`` (B, C_in, H,
    W) and output gradients ``g`` (B, C_out, H', W'), without patches: they are the weight gradient of
    one convolution with groups = B·groups over the examples stacked as channels, input (1, B·C_in,
    H, W), output gradient (1, B·C_out, H', W'), weight (B·C_out, C_in/groups, kh, kw) (Rochette et
    al. 2019, arXiv:1912.06015, Sec. 3). Memory: the B·p result plus the backend's workspace (cuDNN
    and oneDNN run it as an implicit GEMM; no (B, T, C_in·k²) patches)."""
    x, padding = _conv_padded(x, conv)
    B = x.shape[0]
    shape = (B * conv.out_channels, *conv.weight.shape[1:])
    G = conv2d_weight(
        x.reshape(1, B * x.shape[1], *x.shape[2:]),
        shape,
        g.reshape(1, B * g.shape[1], *g.shape[2:]),
        conv.stride,
        padding,
        conv.dilation,
        B * conv.groups,
    )
    return G.view(B, *conv.weight.shape)


CONV_ROUTES = ("patches", "grouped")


class _Conv2dHandler(_Handler):
    """Conv2d as a Linear map applied at every output position of the unfolded input (Rochette et
    al. 2019, arXiv:1912.06015: per-example gradients of convolutions via unfolding). A layer on the
    instantiate side of the cost model gets its per-example weight gradients by one of two routes:
    ``patches`` (a batched matmul over the unfolded patches, built a chunk of examples at a time) or
    ``grouped`` (:func:`_grouped_conv_weight_grads`: no patches at all); ``groups > 1`` always takes
    ``grouped`` (the patch route and the ghost norm are written for groups = 1)."""

    batch_first_only = True
    routes = CONV_ROUTES

    MIN_CHUNK = 32  # examples: smaller batched matmuls would cost more launches than they save memory
    # Patches of one chunk may also take up to this many elements (256 MiB in float32) when that is
    # more than the layer's input: chunks of 32 examples cost an H200 ~30% of the DP step on
    # cifar-gn against unchunked patches (benchmarks/RESULTS.md, issue 26, second session).
    # The grouped route stores the B·p per-example gradients when they fit the same budget, else it
    # computes their norms a chunk of examples at a time and the clipped sum by book-keeping.
    CHUNK_ELEMENTS = 64 * 2**20
    # Route by device type when the clipper names none (benchmarks/RESULTS.md, "Per-example conv
    # gradients without patches (issue 26, memory)"): on this CPU the grouped route was faster;
    # on CUDA the patch route stays until a GPU run measures the grouped one (benchmarks/gpu_check.sh).
    DEFAULT_ROUTE = MappingProxyType({"cpu": "grouped"})

    @staticmethod
    def _route(module, inputs, route: str | None) -> str:
        if module.groups > 1:
            return "grouped"
        return route or _Conv2dHandler.DEFAULT_ROUTE.get(inputs[0].device.type, "patches")

    @staticmethod
    def _budget(inputs) -> int:
        # (sizes from shapes: indexing a tensor for its size would be one more dispatched op per layer)
        return max(sum(t.numel() for t in inputs), _Conv2dHandler.CHUNK_ELEMENTS)

    @staticmethod
    def _patches(module, inputs, lo: int, hi: int) -> torch.Tensor:
        whole = (lo, hi) == (0, inputs[0].shape[0])  # no slicing ops for the usual single chunk
        padded = [_conv_padded(t if whole else t[lo:hi], module) for t in inputs]
        return _cat_positions([_im2col(x, module, padding) for x, padding in padded], dim=2)

    @staticmethod
    def _weight_grads(module, inputs, grads, lo: int, hi: int) -> torch.Tensor:
        # Grouped route, examples lo..hi-1; several calls of the layer add their gradients.
        whole = (lo, hi) == (0, inputs[0].shape[0])
        return _total(
            _grouped_conv_weight_grads(module, x if whole else x[lo:hi], g if whole else g[lo:hi])
            for x, g in zip(inputs, grads, strict=True)
        )

    @staticmethod
    def _weight_sum(module, inputs, grads, c: torch.Tensor) -> torch.Tensor:
        # Book-keeping through the convolution's own weight-gradient kernel: Σ_i c_i ∇_W ℓ_i is
        # the batch weight gradient for output gradients c_i g_i (book-keeping, Bu et al. 2023).
        out = []
        for x, g in zip(inputs, grads, strict=True):
            xp, padding = _conv_padded(x, module)
            gc = g * c.view(-1, 1, 1, 1)
            out.append(
                conv2d_weight(
                    xp.contiguous(), module.weight.shape, gc, module.stride, padding, module.dilation, module.groups
                )
            )
        return _total(out)

    @staticmethod
    def part(module, inputs, grads, names, route: str | None = None):
        B = inputs[0].shape[0]
        gT = _cat_positions([t.reshape(B, module.out_channels, -1) for t in grads], dim=2)
        T, d_out = gT.shape[2], module.weight.shape[0]
        d_in = module.weight.numel() // d_out
        route = _Conv2dHandler._route(module, inputs, route)
        if (
            "weight" in names
            and route == "grouped"
            and (module.groups > 1 or (T > 1 and not _ghost_is_cheaper(T, d_in, d_out)))
        ):
            return _Conv2dHandler._grouped_part(module, inputs, grads, gT, "bias" in names)
        # The patches of a chunk of examples take at most the memory of the layer's input (kh·kw
        # times less than all patches at once for a stride-1 convolution) or CHUNK_ELEMENTS,
        # whichever is larger, and chunks have at least MIN_CHUNK examples.
        chunk = max(_Conv2dHandler.MIN_CHUNK, _Conv2dHandler._budget(inputs) // (d_in * T))
        part = _factored_linear(  # positions-major views of the (B, d, T) patches and gradients
            lambda lo, hi: _Conv2dHandler._patches(module, inputs, lo, hi).mT,
            gT.mT,
            module.weight.shape if "weight" in names else None,
            "bias" in names,
            lambda c: _Conv2dHandler._weight_sum(module, inputs, grads, c),
            chunk=min(chunk, B),
        )
        if part.how.startswith("instantiate"):
            part.how = "instantiate by patches" + part.how.removeprefix("instantiate")
        return part

    @staticmethod
    def _grouped_part(module, inputs, grads, gT: torch.Tensor, bias: bool) -> _LayerPart:
        """Instantiation by the grouped route: all B·p per-example gradients at once when they fit
        the chunk budget (the clipped sum is then their weighted sum), else their norms a chunk of
        examples at a time and the clipped sum by book-keeping (one more weight-gradient kernel)."""
        B, T = gT.shape[0], gT.shape[2]
        p = module.weight.numel()
        chunk = max(1, _Conv2dHandler._budget(inputs) // p)
        how = "instantiate by grouped convolution " + (
            f"(groups={module.groups}: the ghost norm takes groups=1 only)"
            if module.groups > 1
            else f"(T={T}: 2T²={2 * T * T} > p·d={p})"
        )
        G = None
        if chunk >= B:
            G = _Conv2dHandler._weight_grads(module, inputs, grads, 0, B)
            sq = _sq_norms([G])
        else:
            how += f", in chunks of {chunk} examples"
            sq = torch.cat(
                [
                    _sq_norms([_Conv2dHandler._weight_grads(module, inputs, grads, lo, min(B, lo + chunk))])
                    for lo in range(0, B, chunk)
                ]
            )

        # Only what the clipped sum reads is held: G, or (chunked) the inputs and output gradients.
        if G is not None:

            def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
                return {"weight": _weighted_sum(c, G)}

        else:

            def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
                return {"weight": _Conv2dHandler._weight_sum(module, inputs, grads, c)}

        return _LayerPart(sq_norm=sq, clipped=clipped, how=how, small={"bias": gT.sum(2)} if bias else {})

    @staticmethod
    def per_example(module, inputs, grads, name, route: str | None = None):
        B = inputs[0].shape[0]
        gT = _cat_positions([t.reshape(B, module.out_channels, -1) for t in grads], dim=2)
        if name == "bias":
            return gT.sum(2)
        if _Conv2dHandler._route(module, inputs, route) == "grouped":
            return _Conv2dHandler._weight_grads(module, inputs, grads, 0, B)
        aT = _Conv2dHandler._patches(module, inputs, 0, B)
        return torch.bmm(gT, aT.transpose(1, 2)).reshape(B, *module.weight.shape)


class _EmbeddingHandler(_Handler):
    """Embedding = a Linear map on one-hot inputs a_t = e_{tok_t}, so a_t·a_s = [tok_t = tok_s] and
    the ghost norm of Li et al. 2021 (arXiv:2110.05679, Sec. 4) becomes
    ‖∇_W ℓ_i‖² = Σ_{t,s: tok_t = tok_s} g_t·g_s (row v of ∇_W ℓ_i is Σ_{t: tok_t = v} g_t).

    Every option of ``nn.Embedding`` is exact here, because the rule reads the output gradients only:
    ``sparse`` changes only the format of the batch gradient autograd would form (never formed here);
    ``scale_grad_by_freq`` divides each position's gradient by its token's count in the call's input,
    which for the reference's call is example i's own tokens. (``max_norm``, an in-place renormalisation
    of the rows a batch looks up, is refused under DP: :func:`dpaudit.models.check_private_layers`.)"""

    @staticmethod
    def _positions(module, inputs, grads):
        B = inputs[0].shape[0]
        d = module.weight.shape[1]
        toks = [t if t.dim() == 2 else t.reshape(B, -1) for t in inputs]
        if module.scale_grad_by_freq:  # counts per example and per call (see the class docstring)
            grads = [
                g.reshape(B, -1, d) / (t.unsqueeze(2) == t.unsqueeze(1)).sum(2, keepdim=True).to(g.dtype)
                for t, g in zip(toks, grads, strict=True)
            ]
        tok, g = _cat_positions(toks), _positions(grads, B, d)
        if module.padding_idx is not None:  # the padding row receives no gradient (torch semantics)
            g = g * (tok != module.padding_idx).unsqueeze(-1).to(g.dtype)
        return tok, g

    @staticmethod
    def _scatter(module, tok, g):
        B, (V, d) = tok.shape[0], module.weight.shape
        return g.new_zeros(B, V, d).scatter_add_(1, tok.unsqueeze(-1).expand(-1, -1, d), g)

    @staticmethod
    def part(module, inputs, grads, names):
        V, d = module.weight.shape
        tok, g = _EmbeddingHandler._positions(module, inputs, grads)
        T = tok.shape[1]
        if T * T <= V * d:  # the same cost rule as _ghost_is_cheaper with one-hot inputs (d_in = V)
            how = f"ghost-norm (T={T}: T²={T * T} <= V·d={V * d})"
            same = tok.unsqueeze(2) == tok.unsqueeze(1)  # bool: multiplies as exact 0/1, no cast op
            sq = (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
            G = None
        else:  # materialise the (B, V, d) per-example gradients when that is smaller
            how = f"instantiate (T={T}: T²={T * T} > V·d={V * d})"
            G = _EmbeddingHandler._scatter(module, tok, g)
            sq = G.square().sum((1, 2))

        if G is not None:  # the closure holds only what it reads (G, or the tokens and g)

            def clipped(c):
                return {"weight": _weighted_sum(c, G)}

        else:

            def clipped(c):
                w = g.new_zeros(V, d).index_add_(0, tok.reshape(-1), (g * c.view(-1, 1, 1)).reshape(-1, d))
                return {"weight": w}

        return _LayerPart(sq_norm=sq, clipped=clipped, how=how)

    @staticmethod
    def per_example(module, inputs, grads, name):
        return _EmbeddingHandler._scatter(module, *_EmbeddingHandler._positions(module, inputs, grads))

    @staticmethod
    def factors(module, inputs, grads, name):
        tok, g = _EmbeddingHandler._positions(module, inputs, grads)
        return _Factors(left=tok.long(), right=g)  # gather needs int64 (nn.Embedding also takes int32)


def _affine_norm_per_example(normalized, grads, name, reduce_dims) -> torch.Tensor:
    # y = x̂ ⊙ γ + β elementwise, so ∇_γ ℓ_i = Σ g ⊙ x̂ and ∇_β ℓ_i = Σ g over the positions that
    # share a parameter; the parameters are small, so per-example gradients are materialised
    # (as Opacus does for its norm layers).
    if name == "weight":
        return _total(_sum_over(g * xh, reduce_dims(g)) for g, xh in zip(grads, normalized, strict=True))
    return _total(_sum_over(g, reduce_dims(g)) for g in grads)


def _sum_over(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    # No positions share the parameter (LayerNorm on (B, d), GroupNorm on (B, C)): t itself, since
    # torch's t.sum(()) would sum over *every* dimension, the batch included.
    return t.sum(dims) if dims else t


def _affine_norm_part(normalized, grads, names, reduce_dims) -> _LayerPart:
    per = {n: _affine_norm_per_example(normalized, grads, n, reduce_dims) for n in sorted(names)}
    return _LayerPart(sq_norm=None, clipped=lambda c: {}, how="per-example (small)", small=per)


def _group_dims(g):
    return tuple(range(2, g.dim()))


class _GroupNormHandler(_Handler):
    batch_first_only = True

    @staticmethod
    def _normalized(module, inputs):
        return [F.group_norm(t, module.num_groups, eps=module.eps) for t in inputs]

    @staticmethod
    def part(module, inputs, grads, names):
        return _affine_norm_part(_GroupNormHandler._normalized(module, inputs), grads, names, _group_dims)

    @staticmethod
    def per_example(module, inputs, grads, name):
        xh = _GroupNormHandler._normalized(module, inputs)
        return _affine_norm_per_example(xh, grads, name, _group_dims)


class _LayerNormHandler(_Handler):
    @staticmethod
    def _normalized(module, inputs):
        return [F.layer_norm(t, module.normalized_shape, eps=module.eps) for t in inputs]

    @staticmethod
    def _dims(module):
        k = len(module.normalized_shape)
        return lambda g: tuple(range(1, g.dim() - k))

    @staticmethod
    def part(module, inputs, grads, names):
        xh = _LayerNormHandler._normalized(module, inputs)
        return _affine_norm_part(xh, grads, names, _LayerNormHandler._dims(module))

    @staticmethod
    def per_example(module, inputs, grads, name):
        xh = _LayerNormHandler._normalized(module, inputs)
        return _affine_norm_per_example(xh, grads, name, _LayerNormHandler._dims(module))


# Exact types: a subclass may use its parameters outside ``forward`` (e.g. the out_proj of
# nn.MultiheadAttention is a Linear subclass whose weight is used functionally); such modules get
# per-example gradients from a vmap over the module (or its caller) instead.
HANDLERS: dict[type[nn.Module], type[_Handler]] = {
    nn.Linear: _LinearHandler,
    nn.Conv2d: _Conv2dHandler,
    nn.Embedding: _EmbeddingHandler,
    nn.GroupNorm: _GroupNormHandler,
    nn.LayerNorm: _LayerNormHandler,
}

# ----------------------------------------------------------------- where is the batch: the probe

FOLDED = -1  # the batch is folded into dim 0 with other positions, (B·k, ...), batch-major
ABSENT = -2  # an output that is not a tensor (e.g. the attention weights nn.MultiheadAttention may skip)


class _NoBatchDim(Exception):
    pass


def _batch_dim(s2: tuple[int, ...], s3: tuple[int, ...]) -> int | None:
    """The batch dimension of a tensor seen with batch sizes 2 and 3: None when its shape does not
    change (shared by the batch), the one dimension that goes 2 -> 3, or FOLDED for (2k,...) -> (3k,...)."""
    if s2 == s3:
        return None
    if len(s2) == len(s3):
        diff = [d for d in range(len(s2)) if s2[d] != s3[d]]
        if len(diff) == 1:
            d = diff[0]
            if (s2[d], s3[d]) == (2, 3):
                return d
            if d == 0 and s2[0] % 2 == 0 and 3 * s2[0] == 2 * s3[0]:
                return FOLDED
    raise _NoBatchDim(f"cannot locate the batch dimension (shapes {list(s2)} and {list(s3)} at batch sizes 2, 3)")


def _flat_inputs(args: tuple, kwargs: dict) -> list[tuple[int | str, torch.Tensor]]:
    out: list[tuple[int | str, torch.Tensor]] = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    return out + [(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]


def _flat_outputs(output) -> list[torch.Tensor | None]:
    """The output's tensors in order, nested plain tuples flattened (``nn.LSTM`` returns ``(output,
    (h_n, c_n))``); None for each other entry (a ``PackedSequence`` or other named tuple included)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [
            t
            for o in output
            for t in (_flat_outputs(o) if type(o) in (tuple, list) else [o if isinstance(o, torch.Tensor) else None])
        ]
    raise _NoBatchDim(f"its output is a {type(output).__name__}, not a tensor or a tuple of tensors")


def _rebuild_output(output, new: list[torch.Tensor | None]):
    """``output`` with its tensors (in :func:`_flat_outputs` order) replaced by those of ``new`` that are not None."""
    if isinstance(output, torch.Tensor):
        return new[0]
    rest = iter(new)

    def rebuild(o, top: bool = False):
        if top or type(o) in (tuple, list):  # as _flat_outputs descends
            return type(o)(rebuild(v) for v in o)
        n = next(rest)
        return n if n is not None else o

    out = rebuild(output, top=True)
    if next(rest, rest) is not rest:
        raise ValueError("more replacement tensors than outputs")
    return out


@dataclass(frozen=True)
class _Layout:
    """One call of a module: the batch dimension of each tensor input and output (None: shared by
    the batch; FOLDED), and how a shared output is given a batch dimension in the clipping forward
    ("prepend": (B, *s); "replace": s[0] = 1 becomes B) so its gradient is per example."""

    ins: tuple[int | None, ...]
    outs: tuple[int | None, ...]
    expand: tuple[str | None, ...] = ()


def _expand(t: torch.Tensor, mode: str | None, B: int) -> torch.Tensor:
    # A view: the per-example copies of a shared tensor cost no memory.
    if mode == "prepend":
        return t.expand(B, *t.shape)
    return t.expand(B, *t.shape[1:])


def _probe(model: nn.Module, x: torch.Tensor) -> dict[nn.Module, list]:
    """The tensor shapes every module sees at batch sizes 2 and 3 (the first example repeated),
    without gradients: per module, per call, (input shapes, output shapes or the exception text)."""
    seen: dict[int, list[list]] = {}
    modules = {id(m): m for _, m in model.named_modules()}

    def hook(module, args, kwargs, output):
        try:
            outs = tuple(None if o is None else tuple(o.shape) for o in _flat_outputs(output))
        except _NoBatchDim as e:
            outs = str(e)
        seen[id(module)][-1].append((tuple(tuple(t.shape) for _, t in _flat_inputs(args, kwargs)), outs))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in modules.values()]
    try:
        for n in (2, 3):
            for v in seen.values():
                v.append([])
            for k in modules:
                seen.setdefault(k, [[]] if n == 2 else [[], []])
            with torch.no_grad():
                model(x[:1].repeat(n, *([1] * (x.dim() - 1))))
    finally:
        for h in handles:
            h.remove()
    return {modules[k]: v for k, v in seen.items()}


def _layouts(calls: list) -> list[_Layout]:
    """Per call, the batch dimensions of a module's tensors from its probe record (raises _NoBatchDim)."""
    at2, at3 = calls
    if len(at2) != len(at3):
        raise _NoBatchDim(f"it is called {len(at2)} times at batch size 2 but {len(at3)} at batch size 3")
    out = []
    for (in2, o2), (in3, o3) in zip(at2, at3, strict=True):
        for o in (o2, o3):
            if isinstance(o, str):
                raise _NoBatchDim(o)
        if len(in2) != len(in3) or len(o2) != len(o3):
            raise _NoBatchDim("its inputs differ between batch sizes")
        ins = tuple(_batch_dim(a, b) for a, b in zip(in2, in3, strict=True))
        outs = tuple(ABSENT if a is None else _batch_dim(a, b) for a, b in zip(o2, o3, strict=True))
        if all(d in (None, ABSENT) for d in outs) and any(d is not None for d in ins):
            raise _NoBatchDim("its output does not depend on the batch size")
        # A shared output gets "prepend" first; _verify_expansion may switch it to "replace".
        out.append(_Layout(ins=ins, outs=outs, expand=tuple("prepend" if d is None else None for d in outs)))
    return out


def _specific_layout_ok(handler: type[_Handler], layouts: list[_Layout]) -> bool:
    for lay in layouts:
        if len(lay.ins) != 1 or len(lay.outs) != 1:
            return False
        (i,), (o,) = lay.ins, lay.outs
        if handler.batch_first_only and (i not in (0, None) or o not in (0, None)):
            return False
        if (i is None) != (o is None):
            return False
    return True


def _generic_layout_ok(layouts: list[_Layout]) -> bool:
    return all(FOLDED not in lay.ins and FOLDED not in lay.outs for lay in layouts)


def _batch_first(t: torch.Tensor, bdim: int | None, mode: str | None, B: int) -> torch.Tensor:
    """A recorded tensor with its batch at dim 0: moved there, expanded from a shared tensor, or a
    folded (B·k, ...) reshaped to (B, k, ...)."""
    if bdim is None:
        return _expand(t, mode, B)
    if bdim == FOLDED:
        return t.reshape(B, -1, *t.shape[1:])
    return t if bdim == 0 else t.movedim(bdim, 0)


# ------------------------------------------------ bare parameters of the model itself: their uses
#
# A parameter of the model itself (a ViT's ``cls_token`` and ``pos_embed``, a GPT's ``wpe``) belongs
# to no module whose calls the hooks can see: without this it went to a vmap over the whole model
# (1.2-1.8x the step time and 1.7x the peak tensor memory of this path on a ViT and a GPT at T=128
# on a CPU: benchmarks/bare_parameter_step.py, benchmarks/RESULTS.md). Its common uses broadcast it
# against a batched tensor: ``P.expand(B, ...)``, ``x + P``, ``x * P[:T]``. A ``TorchFunctionMode``
# (active in the clipping forward only) sees every torch call that takes P or a view of it. When
# such a call broadcasts the (view of the) parameter ``v`` against the batch, ``v`` is replaced by
# its expansion ``V = v.expand(out_shape)`` (a view: no copy; the call's result is unchanged) and
# V's gradient is read by a tensor hook: row i of ∂(Σ_j ℓ_j)/∂V is ∂ℓ_i/∂V_i because examples do not
# interact, and ``v`` is broadcast to row i, so ∂ℓ_i/∂v is that row summed over the dimensions ``v``
# was broadcast along (the chain rule of broadcasting, :func:`_bare_reduce`); a view ``v = f(P)`` (a
# slice ``wpe[:T]``) maps back into P's shape by the vector-Jacobian product of f (zero outside the
# slice, :func:`_bare_unview`). A parameter with any other use (a matmul, a batch-free result, a
# call the probe sees differently at batch sizes 2 and 3) keeps the vmap over the model. The
# first-call check compares the result with the one-example reference like every other rule.

_BARE_VIEWS = frozenset(
    {"__getitem__", "view", "reshape", "unsqueeze", "squeeze", "transpose", "permute", "flatten", "narrow", "t"}
    | {"contiguous", "expand", "expand_as"}
)
_BARE_EXPANDS = frozenset({"expand", "expand_as"})
# Elementwise, broadcasting, out of place (an in-place op on a batched tensor is left to the vmap).
_BARE_BROADCASTS = frozenset({"add", "sub", "mul", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__"})


@dataclass(frozen=True)
class _BareCall:
    """A torch call that takes a tracked tensor (a bare parameter or a view of one): its function's
    name, where the tracked tensors are (argument position or keyword; "nested" inside a list) and
    which parameters they come from, and what the probe made of it (``kind``: "ignore" (no tensor
    out: ``.shape``), "view", "expand", "broadcast", else "other")."""

    name: str
    where: tuple[int | str, ...]
    params: tuple[int, ...]
    kind: str = "other"


class _BareMode(torch.overrides.TorchFunctionMode):
    """Tracks the bare parameters ``params`` (index -> tensor) and their views through a forward pass.

    ``calls=None`` (the probe): records every call that takes a tracked tensor, with its shapes, in
    ``seen``. Else (the clipping forward): ``calls`` is the probe's classified sequence of calls on
    these parameters; each call must match it; broadcast uses are expanded to the batch ``B`` and,
    with ``hook``, their expansions' gradients are collected in ``grads`` (reduced to the views'
    per-example gradients) and their gradient edges in ``edges`` (what the backward pass must reach)."""

    def __init__(
        self,
        params: dict[int, torch.Tensor],
        calls: list[_BareCall] | None = None,
        B: int = 0,
        dtype: torch.dtype | None = None,
        hook: bool = False,
    ) -> None:
        super().__init__()
        self.tracked: dict[int, tuple[torch.Tensor, int, tuple]] = {id(p): (p, k, ()) for k, p in params.items()}
        self.calls, self.B, self.i, self.dtype, self.hook = calls, B, 0, dtype, hook
        self.seen: list[tuple[_BareCall, Any, list[torch.Size], bool]] = []
        # Per hooked use, as its gradient arrives: (parameter, view chain, per-example gradients of the view)
        self.grads: list[tuple[int, tuple, torch.Tensor]] = []
        self.edges: list = []

    def _hits(self, args, kwargs) -> list[tuple[int | str, torch.Tensor]]:
        tracked, hits = self.tracked, []
        for where, a in [*enumerate(args), *kwargs.items()]:
            if isinstance(a, torch.Tensor):
                if id(a) in tracked:
                    hits.append((where, a))
            elif isinstance(a, (list, tuple)):
                hits += [("nested", b) for b in a if isinstance(b, torch.Tensor) and id(b) in tracked]
        return hits

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        hits = self._hits(args, kwargs)
        if not hits:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", repr(func))
        call = _BareCall(name, tuple(w for w, _ in hits), tuple(self.tracked[id(t)][1] for _, t in hits))
        if self.calls is None:  # the probe
            out = func(*args, **kwargs)
            followed = False
            if name in _BARE_VIEWS and call.where == (0,) and isinstance(out, torch.Tensor):
                v = hits[0][1]
                # An expand along a new leading dimension (the batch, if the probe confirms it) is a use,
                # not a view: its result is batched and not followed further.
                if name not in _BARE_EXPANDS or (out.dim() == v.dim() and out.shape[0] == v.shape[0]):
                    self._track(out, v, func, args, kwargs)
                    followed = True
            self.seen.append((call, _bare_out(out), [t.shape for _, t in hits], followed))
            return out
        expect = self.calls[self.i] if self.i < len(self.calls) else None
        self.i += 1
        if expect is None or (expect.name, expect.where, expect.params) != (call.name, call.where, call.params):
            raise GhostMismatchError(
                f"the model's bare parameters are used differently than in the probe ({name} at call {self.i})"
            )
        if expect.kind in ("ignore", "view"):
            out = func(*args, **kwargs)
            if expect.kind == "view":
                self._track(out, hits[0][1], func, args, kwargs)
            return out
        if expect.kind == "expand":
            out = func(*args, **kwargs)
            self._use(out, hits[0][1])
            return out
        # broadcast: every tracked operand replaced by its expansion to the result's shape
        shape = _broadcast_shape([a.shape for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)])
        args, kwargs = list(args), dict(kwargs)
        for where, t in hits:
            big = t.expand(shape)
            self._use(big, t)
            if isinstance(where, int):
                args[where] = big
            else:
                kwargs[where] = big
        return func(*args, **kwargs)

    def _track(self, out: torch.Tensor, v: torch.Tensor, func, args, kwargs) -> None:
        _, k, chain = self.tracked[id(v)]
        self.tracked[id(out)] = (out, k, (*chain, (func, tuple(args[1:]), kwargs)))

    def _use(self, big: torch.Tensor, v: torch.Tensor) -> None:
        if big.dim() == 0 or big.shape[0] != self.B:
            raise GhostMismatchError(
                f"a bare parameter's use has no batch of {self.B} at dim 0 (shape {list(big.shape)})"
            )
        if self.hook and big.requires_grad:
            _, k, chain = self.tracked[id(v)]
            big.register_hook(partial(self._grad, k, chain, v.shape))
            self.edges.append(get_gradient_edge(big))

    def _grad(self, k: int, chain: tuple, shape: torch.Size, g: torch.Tensor) -> None:
        # Reduced at once (the expansion's gradient is as large as the activation it was added to).
        with torch.no_grad():
            self.grads.append((k, chain, _bare_reduce(_full(g, self.dtype), shape)))


def _broadcast_shape(shapes: list[torch.Size]) -> tuple[int, ...]:
    """The shape tensors of ``shapes`` broadcast to (right-aligned; a 1 yields to the other size).
    Not ``torch.broadcast_shapes``: its first call imports sympy (1.5 s)."""
    n = max(len(s) for s in shapes)
    return tuple(
        next((s[i - n + len(s)] for s in shapes if i - n + len(s) >= 0 and s[i - n + len(s)] != 1), 1) for i in range(n)
    )


def _bare_out(out) -> tuple[int, ...] | str | None:
    # A call's result for the probe: its shape, None when no tensor comes out, "tensors" for several.
    if isinstance(out, torch.Tensor):
        return tuple(out.shape)
    if isinstance(out, (list, tuple)) and any(isinstance(o, torch.Tensor) for o in out):
        return "tensors"
    return None


def _bare_kind(call: _BareCall, o2, o3, shapes: list[torch.Size], followed: bool) -> str:
    """What the probe's call is, from its results at batch sizes 2 and 3 (``o2``, ``o3``), the
    shapes of its tracked operands (the same at both: they carry no batch) and whether the probe
    followed its result as a view."""
    if o2 is None and o3 is None:
        return "ignore"
    if isinstance(o2, str) or isinstance(o3, str) or o2 is None or o3 is None:
        return "other"
    if o2 == o3:  # batch-free: only a view of a parameter may be followed further
        return "view" if followed else "other"
    if len(o2) != len(o3) or not o2 or (o2[0], o3[0]) != (2, 3) or o2[1:] != o3[1:]:
        return "other"
    # The batch at dim 0, where every tracked operand has size 1 or no dimension: broadcast along it.
    if any((len(s) == len(o2) and s[0] != 1) or len(s) > len(o2) for s in shapes):
        return "other"
    if call.name in _BARE_EXPANDS and call.where == (0,):
        return "expand"
    if call.name in _BARE_BROADCASTS and "nested" not in call.where:
        return "broadcast"
    return "other"


def _probe_bare(
    model: nn.Module, x: torch.Tensor, params: dict[int, torch.Tensor]
) -> tuple[list[_BareCall], dict[int, str]]:
    """The calls that take the bare parameters ``params`` (index -> tensor), classified, and per
    parameter why it cannot take the broadcast path (absent: it can).

    A model in training mode is probed in evaluation mode too (the first-call check runs it there):
    a parameter used differently in the two (a use under ``if self.training``) is not followed."""
    seen, training = [], model.training
    try:
        for n, in_training in [(2, training), (3, training)] + ([(2, False)] if training else []):
            model.train(in_training)
            mode = _BareMode(params)
            with torch.no_grad(), mode:
                model(x[:1].repeat(n, *([1] * (x.dim() - 1))))
            seen.append(mode.seen)
    finally:
        model.train(training)
    why: dict[int, str] = {}
    if _bare_seen(seen[0], set(params)) != _bare_seen(seen[1], set(params)):
        return [], {k: "its uses differ between batch sizes 2 and 3" for k in params}
    for k in params:
        if len(seen) == 3 and _bare_seen(seen[0], {k}) != _bare_seen(seen[2], {k}):
            why[k] = "used differently in training and in evaluation mode"
    calls = []
    for (call, o2, shapes, followed), (_, o3, _, _) in zip(seen[0], seen[1], strict=True):
        kind = _bare_kind(call, o2, o3, shapes, followed)
        calls.append(_BareCall(call.name, call.where, call.params, kind))
        for k in call.params:
            if kind == "other":
                why.setdefault(k, f"used in {call.name} (not broadcast against the batch)")
    for k in params:
        used = any(k in c.params for c, *_ in (s for probe in seen for s in probe))
        # A parameter no call takes in any probe (a leftover head, an MAE's mask token) has per-example
        # gradient 0 without a vmap; the first-call checks compare that 0 with the reference too.
        if k not in why and used and not any(k in c.params and c.kind in ("expand", "broadcast") for c in calls):
            why[k] = "no use broadcast against the batch"
    ok = set(params) - set(why)
    if len(seen) == 3 and _bare_seen(seen[0], ok) != _bare_seen(seen[2], ok):  # the same uses in another order
        why.update((k, "its uses come in another order in evaluation mode") for k in ok)
    return calls, why


UNUSED = "used by no call of the forward pass: per-example gradient 0"


def _unused(bare: Iterable[int], calls: list[_BareCall]) -> set[int]:
    """The bare parameters no call takes (their per-example gradients are 0)."""
    return {k for k in bare if not any(k in c.params for c in calls)}


def _bare_seen(seen: list, params: set[int]) -> list:
    """A probe's calls as a forward that tracks only ``params`` meets them (and which it follows)."""
    return [(c, f) for c, f in zip(_bare_calls([c for c, *_ in seen], params), _followed(seen, params), strict=True)]


def _followed(seen: list, params: set[int]) -> list[bool]:
    return [f for c, _, _, f in seen if any(k in params for k in c.params)]


def _bare_calls(calls: list[_BareCall], bare: set[int]) -> list[_BareCall]:
    """The probe's calls as the clipping forward sees them when only the parameters ``bare`` are
    tracked: calls on the others' tensors only are not seen, and a call's other operands are plain."""
    out = []
    for c in calls:
        keep = [i for i, k in enumerate(c.params) if k in bare]
        if keep:
            out.append(_BareCall(c.name, tuple(c.where[i] for i in keep), tuple(c.params[i] for i in keep), c.kind))
    return out


def _bare_reduce(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Per-example gradients (B, *shape) of a tensor of ``shape`` broadcast to g's (B, ...) (dim 0 the
    batch, where ``shape`` has size 1 or no dimension): each row of g summed over the dimensions the
    tensor was broadcast along (the gradient of a broadcast is the sum over its copies)."""
    B, rest = g.shape[0], g.shape[1:]
    s = shape[1:] if len(shape) == g.dim() else shape
    return g.sum_to_size(B, *([1] * (len(rest) - len(s))), *s).reshape(B, *shape)


def _bare_unview(p: torch.Tensor, chain: tuple, gv: torch.Tensor) -> torch.Tensor:
    """Per-example gradients (B, *p.shape) of ``p`` from those (B, ...) of its view ``v = f(p)``
    (``chain``: the calls of f): vmap over the examples of the vector-Jacobian product of f, which
    is linear (a slice ``wpe[:T]`` maps into rows 0..T-1, zero elsewhere)."""
    if not chain:
        return gv

    def f(t: torch.Tensor) -> torch.Tensor:
        for func, args, kwargs in chain:
            t = func(t, *args, **kwargs)
        return t

    _, back = torch.func.vjp(f, p.detach())
    return vmap(back)(gv)[0]


# ------------------------------------------------------------------------------ the ghost plan


@dataclass
class _Unit:
    """A module whose calls are recorded: ``handler`` gives ghost norms / instantiation for the
    parameters ``names`` (relative to the module); ``handler=None`` computes their per-example
    gradients by a vmap over the module alone (with the recorded inputs and output gradients)."""

    name: str
    module: nn.Module
    handler: type[_Handler] | None
    names: list[str]
    layouts: list[_Layout]
    tied: dict[str, tuple[str, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # For the vmap over the module (:func:`reparametrized_call`); only units without a rule use it.
        self.tied = tied_paths(self.module) if self.handler is None else {}

    @property
    def how(self) -> str:
        return "vmap over the module" if self.name else "vmap over the model"


@dataclass
class GhostPlan:
    """How each trainable parameter gets its per-example norm and clipped sum.

    ``units``: the recorded modules; ``uses``: parameter index -> [(unit index, name in unit)];
    a parameter with one use in a unit with a handler gets ghost norm / book-keeping; a parameter
    used by several units with handlers (tied) the ghost norm of the sum of its uses or their
    per-example gradients summed (:func:`_tied_part`); every other parameter per-example gradients.
    ``notes``: why a module was routed where it was. ``bare``: parameters of the model itself whose
    per-example gradients come from their uses broadcast against the batch (index -> name, see
    :class:`_BareMode`), and ``bare_calls`` the calls on them that the clipping forward expects.
    """

    units: list[_Unit]
    uses: dict[int, list[tuple[int, str]]]
    notes: list[str]
    root_layouts: list[_Layout]
    bare: dict[int, str] = field(default_factory=dict)
    bare_calls: list[_BareCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.index = {(u, n): k for k, us in self.uses.items() for u, n in us}
        single = [us[0] for us in self.uses.values() if len(us) == 1]
        self._ghost = [frozenset(n for v, n in single if v == u) for u in range(len(self.units))]

    def ghost_names(self, u: int) -> frozenset[str]:
        return self._ghost[u]

    def unused(self) -> set[int]:
        """Bare parameters that no call of the forward pass takes: per-example gradient 0."""
        return _unused(self.bare, self.bare_calls)


def _qualified(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def build_ghost_plan(model: nn.Module, x: torch.Tensor, params: list[nn.Parameter]) -> GhostPlan:
    """The plan for ``model`` on inputs like ``x`` (only the first example is used, at batch sizes
    2 and 3, to find where each module's batch dimension is).

    Modules with a ghost-norm rule (exact types in HANDLERS, batch dimension found) get it; a module
    with trainable parameters of another type gets per-example gradients by a vmap over that module
    alone; a module never called, or whose batch dimension cannot be found, hands its parameters to
    the nearest recorded ancestor (at worst the model, i.e. plain vmap for those parameters). Of the
    parameters headed for the model's vmap, those every use broadcasts against the batch, or that no
    call of the forward pass takes (per-example gradient 0), leave it (:func:`_bare_parameters`).
    """
    probe = _probe(model, x)
    index = {id(p): k for k, p in enumerate(params)}
    named = dict(model.named_modules())
    notes: list[str] = []
    specific: dict[str, _Unit] = {}
    generic: dict[str, list[str]] = {}  # module name -> qualified parameter names
    layouts: dict[str, list[_Layout]] = {}

    def layouts_of(name: str) -> list[_Layout] | None:
        if name not in layouts:
            try:
                layouts[name] = _layouts(probe[named[name]])
            except _NoBatchDim as e:
                notes.append(f"{name or '(model)'}: {e}")
                layouts[name] = None
        return layouts[name]

    root_layouts = layouts_of("")
    if not root_layouts or root_layouts[0].outs[0] != 0:
        raise GhostMismatchError("the model's logits have no batch dimension at dim 0")

    def owner(name: str) -> str:
        # The nearest ancestor (or the module itself) that was called with a batch we can locate.
        while True:
            lay = layouts_of(name)
            if lay and _generic_layout_ok(lay):
                return name
            if not name:
                raise GhostMismatchError("the model's own output has no batch dimension")
            name = name.rsplit(".", 1)[0] if "." in name else ""

    for mname, m in named.items():
        own = [n for n, p in m.named_parameters(recurse=False) if id(p) in index]
        if not own:
            continue
        handler = HANDLERS.get(type(m))
        lay = layouts_of(mname)
        if lay == []:  # never called: its parameters are used by an ancestor's forward
            notes.append(f"{mname}: not called as a module; its parameters go with its caller")
        if handler is not None and handler.supports(m) and lay and _specific_layout_ok(handler, lay):
            specific[mname] = _Unit(mname, m, handler, own, lay)
            continue
        if handler is not None and lay:
            notes.append(f"{mname}: {type(m).__name__} with these options or input layout has no ghost-norm rule")
        target = owner(mname) if lay else owner(mname.rsplit(".", 1)[0] if "." in mname else "")
        generic.setdefault(target, []).extend(_qualified(mname, n) for n in own)
        if target != mname and lay:
            notes.append(f"{mname}: parameters handled by vmap over {target or '(model)'}")

    bare, bare_calls = _bare_parameters(model, x, params, index, generic, notes)
    units = list(specific.values())
    for target, qnames in generic.items():
        cut = len(target) + 1 if target else 0
        units.append(_Unit(target, named[target], None, [q[cut:] for q in qnames], layouts[target]))
    uses: dict[int, list[tuple[int, str]]] = {}
    for u, unit in enumerate(units):
        for n in unit.names:
            p = unit.module.get_parameter(n)
            uses.setdefault(index[id(p)], []).append((u, n))
    return GhostPlan(units=units, uses=uses, notes=notes, root_layouts=root_layouts, bare=bare, bare_calls=bare_calls)


def _bare_parameters(
    model: nn.Module, x: torch.Tensor, params: list[nn.Parameter], index: dict[int, int], generic, notes: list[str]
) -> tuple[dict[int, str], list[_BareCall]]:
    """Of the parameters headed for the vmap over the model (``generic[""]``), those whose every use
    broadcasts them against the batch (:class:`_BareMode`) leave it (removed from ``generic``):
    their index -> name, and the calls the clipping forward expects. ``notes`` says which way each went."""
    names = generic.get("", [])
    if not names:
        return {}, []
    cand = {index[id(model.get_parameter(n))]: n for n in names}
    calls, why = _probe_bare(model, x, {k: params[k] for k in cand})
    bare = {k: n for k, n in cand.items() if k not in why}
    unused = _unused(bare, calls)
    for k, n in cand.items():
        how = "per-example from its uses broadcast against the batch" if k in bare else why[k]
        how = UNUSED if k in unused else how
        notes.append(f"{n}: {how}" + ("" if k in bare else "; per-example gradients by vmap over the model"))
    generic[""] = [n for n in names if index[id(model.get_parameter(n))] not in bare]
    if not generic[""]:
        del generic[""]
    return bare, _bare_calls(calls, set(bare))


def _reroute(plan: GhostPlan, model: nn.Module, params: list[nn.Parameter], bad: set[int], why: str) -> GhostPlan:
    """Move the parameters ``bad`` (indices) from their units to a vmap over the whole model."""
    if not bad:
        return plan
    qual = {id(p): n for n, p in model.named_parameters()}
    index = {id(p): k for k, p in enumerate(params)}
    units = []
    for unit in plan.units:
        keep = [n for n in unit.names if index[id(unit.module.get_parameter(n))] not in bad]
        if keep and unit.name != "":
            units.append(_Unit(unit.name, unit.module, unit.handler, keep, unit.layouts))
    root = next((u for u in plan.units if u.name == "" and u.handler is None), None)
    root_names = [n for n in (root.names if root else []) if index[id(model.get_parameter(n))] not in bad]
    root_names += [qual[id(params[k])] for k in sorted(bad)]
    units.append(_Unit("", model, None, root_names, plan.root_layouts))
    index = {id(p): k for k, p in enumerate(params)}
    uses: dict[int, list[tuple[int, str]]] = {}
    for u, unit in enumerate(units):
        for n in unit.names:
            uses.setdefault(index[id(unit.module.get_parameter(n))], []).append((u, n))
    notes = plan.notes + [
        f"{qual[id(params[k])]}: {why}; per-example gradients by vmap over the model" for k in sorted(bad)
    ]
    bare = {k: n for k, n in plan.bare.items() if k not in bad}
    return GhostPlan(
        units=units,
        uses=uses,
        notes=notes,
        root_layouts=plan.root_layouts,
        bare=bare,
        bare_calls=_bare_calls(plan.bare_calls, set(bare)),
    )


class _Out(NamedTuple):  # a NamedTuple: built per recorded output and step, cheaper than a dataclass
    """What a recorded output tensor leaves behind: enough for a zero gradient when the loss does not
    use it. The tensor itself is not kept (one that autograd does not save, e.g. a GroupNorm output
    before a ReLU, is freed during the forward pass as without the clipper)."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool


def _zeros(o: _Out) -> torch.Tensor:
    # The gradient of an output the loss does not use.
    return torch.zeros(o.shape, dtype=o.dtype, device=o.device)


@dataclass
class _Record:
    """One recorded call: its tensor inputs, its arguments (to replay it under vmap) and its outputs
    whose gradients are read (a shared output already expanded to the batch), as :class:`_Out`. The
    inputs of a unit without a rule are detached (a vmap replays the module on them); the single
    input of a unit with a rule is not: everything computed from it runs under ``no_grad``."""

    inputs: list[tuple[int | str, torch.Tensor]]
    args: tuple
    kwargs: dict
    outs: list[_Out | None]


class _Recorder:
    """The plan's forward hooks, registered once per plan (not per step: registering and removing a
    hook per unit and step was host time on every step) and active only inside :meth:`recording`,
    i.e. during the clipper's own forward pass. Anywhere else (the user's forward calls, the probe,
    the first-call check's reference, a vmap over a module) a hook returns at once: no recording,
    no expansion, the module's output unchanged. :meth:`close` removes the hooks (the clipper calls
    it when its plan changes, when it is closed or garbage-collected)."""

    def __init__(self, plan: GhostPlan, clone: bool, params: Sequence[nn.Parameter] = ()) -> None:
        self.plan, self.clone = plan, clone
        self.bare_params = {k: params[k] for k in plan.bare}
        self.bare: _BareMode | None = None  # the last recording's (see _BareMode), until it is taken
        self.calls: list[list[_Record]] | None = None  # per unit, this forward's calls; None: inactive
        self.B = 0
        # Inside recording(on_grad=f): f(u, k, j, grad) is hooked on output j of call k of unit u
        # (fired by the backward pass once that gradient is complete), and ``edges`` collects the
        # outputs' gradient edges, what the backward pass is asked to reach (see GhostClipper).
        self.on_grad: Callable[[int, int, int, torch.Tensor], None] | None = None
        self.edges: list = []
        self.counts = [len(unit.layouts) for unit in plan.units]
        self._handles = [
            unit.module.register_forward_hook(self._hook(u, unit), with_kwargs=True)
            for u, unit in enumerate(plan.units)
        ]

    @contextmanager
    def recording(self, B: int, on_grad: Callable[[int, int, int, torch.Tensor], None] | None = None):
        """Inside: shared outputs are expanded to the batch ``B`` and every call of a unit is recorded
        in ``self.calls`` (yielded); with ``on_grad``, its outputs' gradients go to it (see __init__)."""
        self.calls, self.B, self.on_grad, self.edges = [[] for _ in self.plan.units], B, on_grad, []
        self.bare = None
        if self.bare_params:
            dtype = next(iter(self.bare_params.values())).dtype
            self.bare = _BareMode(self.bare_params, self.plan.bare_calls, B, dtype, hook=on_grad is not None)
        try:
            with self.bare if self.bare is not None else nullcontext():
                yield self.calls
            if self.bare is not None:
                if self.bare.i != len(self.plan.bare_calls):
                    raise GhostMismatchError("the model's bare parameters are used fewer times than in the probe")
                self.edges += self.bare.edges
        finally:
            self.calls = self.on_grad = None

    def _outs(self, u: int, k: int, outs: list[torch.Tensor | None]) -> list[_Out | None]:
        # Hook the outputs that need a gradient; keep only their shapes (see _Out).
        on_grad, meta = self.on_grad, []
        for j, o in enumerate(outs):
            if o is None:
                meta.append(None)
                continue
            if on_grad is not None and o.requires_grad:
                o.register_hook(partial(on_grad, u, k, j))
                # Never a leaf's (AccumulateGrad) edge: an output that needs a gradient is computed
                # from the parameters, or a parameter without the batch dimension, expanded (a view).
                self.edges.append(get_gradient_edge(o))
            meta.append(_Out(o.shape, o.dtype, o.device, o.requires_grad))
        return meta

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _hook(self, u: int, unit: _Unit):
        name = unit.name or "(model)"
        # A unit with a rule whose outputs are never expanded nor cloned records its one input and
        # its output as they are (the common case, so the fewest Python steps per call).
        plain = unit.handler is not None and not self.clone and not any(e for lay in unit.layouts for e in lay.expand)

        def hook(module, args, kwargs, output):
            calls = self.calls
            if calls is None:
                return None  # not the clipping forward: the module behaves as if unhooked
            mine = calls[u]
            k = len(mine)
            if k >= len(unit.layouts):
                raise GhostMismatchError(f"{name} is called more often than in the probe")
            if plain:
                ins = [(0, args[0])] if args and isinstance(args[0], torch.Tensor) else _flat_inputs(args, kwargs)
                outs = [output] if isinstance(output, torch.Tensor) else _flat_outputs(output)
                mine.append(_Record(ins, args, kwargs, self._outs(u, k, outs)))
                return None
            outs = _flat_outputs(output)
            B = self.B
            new = [
                o if o is None or e is None else _expand(o, e, B)
                for o, e in zip(outs, unit.layouts[k].expand, strict=True)
            ]
            back = [o.clone() if o is not None and self.clone else o for o in new]
            ins = _flat_inputs(args, kwargs)
            recorded = [(i, t.detach()) for i, t in ins] if unit.handler is None else ins
            mine.append(_Record(recorded, args, kwargs, self._outs(u, k, new)))
            return _rebuild_output(output, back) if any(a is not b for a, b in zip(back, outs, strict=True)) else None

        return hook


def _local_per_example(
    unit: _Unit, records: list[_Record], grads: list[list[torch.Tensor | None]], B: int
) -> dict[str, torch.Tensor]:
    """Per-example gradients (B, *p.shape) of the unit's parameters: for every recorded call, a
    vmap over the examples of the gradient of <module(inputs_i), ∂(Σ_j ℓ_j)/∂output_i> (a
    vector-Jacobian product; the output gradient of example i is ∂ℓ_i/∂output_i because examples do
    not interact), summed over the calls. Only the module is re-run, not the model, unless the unit is
    the model itself (then this is the ``vmap`` method for these parameters)."""
    m = unit.module
    diff = {n: m.get_parameter(n).detach() for n in unit.names}
    # The buffers go through the call too, as constants, so that the call puts them back after it: a
    # training forward that assigns a new tensor to a buffer (a user's running mean) would otherwise
    # leave a tensor of the vmap in the model (torch then fails on any later use of it).
    buffers = dict(m.named_buffers())
    total: dict[str, torch.Tensor] = {}
    for rec, gs, lay in zip(records, grads, unit.layouts, strict=True):
        keys = [k for k, _ in rec.inputs]
        sel = [
            (j, _batch_first(g, 0 if lay.outs[j] is None else lay.outs[j], None, B))
            for j, g in enumerate(gs)
            if g is not None
        ]
        if not sel:
            continue

        def vjp(d, ts, gl, rec=rec, lay=lay, keys=keys, sel=sel):
            args, kwargs = list(rec.args), dict(rec.kwargs)
            for key, t, bd in zip(keys, ts, lay.ins, strict=True):
                t = t if bd is None else t.unsqueeze(bd)  # the example as a batch of one
                if isinstance(key, int):
                    args[key] = t
                else:
                    kwargs[key] = t
            out = _flat_outputs(reparametrized_call(m, {**buffers, **d}, unit.tied, tuple(args), kwargs))
            return sum((out[j].reshape(g.shape) * g).sum() for (j, _), g in zip(sel, gl, strict=True))

        per = vmap(grad(vjp), in_dims=(None, list(lay.ins), [0] * len(sel)), randomness="different")(
            diff, [t for _, t in rec.inputs], [g for _, g in sel]
        )
        for n, v in per.items():
            total[n] = v if n not in total else total[n] + v
    return {n: total.get(n, diff[n].new_zeros(B, *diff[n].shape)) for n in unit.names}


def _full(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    # A recorded activation or output gradient in the parameters' precision (bf16 under autocast).
    return t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != dtype else t


@contextmanager
def _refusing(method: str, hint: str):
    """A model ``--clipping METHOD`` cannot run (an error from the model's own code under it): one
    line naming the method tried and the way out, instead of a traceback. Out-of-memory passes."""
    try:
        yield
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise GhostMismatchError(f"--clipping {method} cannot run this model ({_first_line(e)}); {hint}") from e


_MHA_NAMES = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}


def _add_into(out: dict[str, torch.Tensor], n: str, v: torch.Tensor) -> None:
    """out[n] += v, the first time without a ``0 + v`` op (a per-example rule called several times adds)."""
    out[n] = v if n not in out else out[n] + v


def _mha_per_example(
    unit: _Unit, records: list[_Record], grads: list[list[torch.Tensor | None]], B: int
) -> dict[str, torch.Tensor] | None:
    """Per-example gradients of an ``nn.MultiheadAttention`` without vmap, or None when its call
    is not the plain case (packed in-projection, no masks, no attention weights returned, no
    dropout, no bias_k/bias_v or zero attention).

    The attention is recomputed from the recorded (batch-first) query, key and value: with the
    projections P = x W_pᵀ + b_p (p = q, k, v; the row blocks of ``in_proj_weight``) as leaves,
    one batched backward of softmax(QKᵀ/√d_h)V (Vaswani et al. 2017, arXiv:1706.03762, Eq. 1, per
    head) from the output gradient through ``out_proj`` gives every example's ∂ℓ_i/∂P (examples do
    not interact); the per-example weight gradients are then Σ_t (∂ℓ_i/∂P_t) x_tᵀ per block, and
    Σ_t g_t A_tᵀ for ``out_proj`` (A: the concatenated heads). The first-call check compares the
    result with the one-example-at-a-time reference like every other rule.
    """
    m = unit.module
    if type(m) is not nn.MultiheadAttention or (m.dropout > 0 and m.training):
        return None
    if set(unit.names) != _MHA_NAMES or m.in_proj_weight is None or m.bias_k is not None or m.add_zero_attn:
        return _mha_general_per_example(unit, records, grads, B)
    E, h = m.embed_dim, m.num_heads
    W, bias = m.in_proj_weight.detach(), m.in_proj_bias.detach()
    Wo = m.out_proj.weight.detach()
    Wp, bp = W.split(E), bias.split(E)  # the q, k, v blocks
    out: dict[str, torch.Tensor] = {}

    add = partial(_add_into, out)

    for rec, gs, lay in zip(records, grads, unit.layouts, strict=True):
        keys = [k for k, _ in rec.inputs]
        if keys != [0, 1, 2] or rec.kwargs.get("need_weights", True) or rec.args[3:] or rec.kwargs.get("is_causal"):
            return _mha_general_per_example(unit, records, grads, B)  # masks, attention weights
        if rec.kwargs.get("attn_mask") is not None or len(gs) < 1 or gs[0] is None:
            return _mha_general_per_example(unit, records, grads, B)
        if None in lay.ins or FOLDED in lay.ins or lay.outs[0] in (None, FOLDED):
            return None
        # (B, L|S, E) inputs and the (B, L, E) output gradient (no op when already batch first)
        xs = [t if d == 0 else t.movedim(d, 0) for (_, t), d in zip(rec.inputs, lay.ins, strict=True)]
        g = gs[0] if lay.outs[0] == 0 else gs[0].movedim(lay.outs[0], 0)
        with torch.enable_grad():
            P = [F.linear(x, Wp[i], bp[i]).detach().requires_grad_() for i, x in enumerate(xs)]
            q, k, v = (p.reshape(B, p.shape[1], h, E // h).transpose(1, 2) for p in P)
            A = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, -1, E)
            dP = torch.autograd.grad(A, P, g @ Wo)
        # Each block's product is written into its rows of the (B, 3E, E) result: one block's
        # temporary at a time instead of all three blocks and their concatenation.
        G = g.new_empty(B, 3 * E, E)
        for i, (d, x) in enumerate(zip(dP, xs, strict=True)):
            torch.bmm(d.transpose(1, 2), x, out=G[:, i * E : (i + 1) * E])
        add("in_proj_weight", G)
        add("in_proj_bias", torch.cat([d.sum(1) for d in dP], dim=1))
        add("out_proj.weight", torch.bmm(g.transpose(1, 2), A.detach()))
        add("out_proj.bias", g.sum(1))
    return out


# nn.MultiheadAttention.forward's arguments in order (a call may pass any of them by position)
_MHA_ARGS = (
    "query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights", "is_causal",
)  # fmt: skip


def _mha_general_per_example(
    unit: _Unit, records: list[_Record], grads: list[list[torch.Tensor | None]], B: int
) -> dict[str, torch.Tensor] | None:
    """:func:`_mha_per_example` for every other call of an ``nn.MultiheadAttention`` without dropout:
    masks (``key_padding_mask``, ``attn_mask``, ``is_causal``), attention weights returned (their
    gradient included), separate q/k/v projections (``kdim``/``vdim``), no biases, ``add_bias_kv``,
    ``add_zero_attn``. None when a query, key or value is shared by the batch or folded into it.

    Same idea, with torch's own attention code for what follows the in-projection: the projections
    P_q, P_k, P_v (and, for ``add_bias_kv``, one copy of bias_k and bias_v per example, appended as
    the last key and value position as torch does) are leaves, and ``F.multi_head_attention_forward``
    runs on them with identity in- and out-projections (multiplying by 1 and adding 0 is exact), so
    the masks, the zero attention and the returned weights are handled exactly as in the module.
    One batched backward from the output gradient (through ``out_proj``) and the weights' gradient
    gives every example's ∂ℓ_i/∂P (examples do not interact), then Σ_t (∂ℓ_i/∂P_t) x_tᵀ per
    projection and Σ_t g_t A_tᵀ for ``out_proj`` as in the plain case."""
    m = unit.module
    E, h = m.embed_dim, m.num_heads
    packed = m.in_proj_weight is not None
    Ws = m.in_proj_weight.detach().split(E) if packed else (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
    Ws = [w.detach() for w in Ws]
    bs = m.in_proj_bias.detach().split(E) if m.in_proj_bias is not None else (None, None, None)
    Wo = m.out_proj.weight.detach()
    eye = torch.eye(E, dtype=Wo.dtype, device=Wo.device)
    out: dict[str, torch.Tensor] = {}

    add = partial(_add_into, out)

    for rec, gs, lay in zip(records, grads, unit.layouts, strict=True):
        call = dict(zip(_MHA_ARGS, rec.args, strict=False))
        if set(call) & set(rec.kwargs):
            return None
        call.update(rec.kwargs)
        dims = {k: d for (k, _), d in zip(rec.inputs, lay.ins, strict=True)}
        pos = {_MHA_ARGS[k] if isinstance(k, int) else k: k for k, _ in rec.inputs}
        if set(pos) - set(_MHA_ARGS) or any(n not in pos for n in _MHA_ARGS[:3]):
            return None
        tensors = dict(rec.inputs)
        xs = []
        for n in _MHA_ARGS[:3]:
            t, d = tensors[pos[n]], dims[pos[n]]
            if d is None or d == FOLDED or t.dim() != 3:
                return None
            xs.append(t if d == 0 else t.movedim(d, 0))  # (B, L|S, ·)
        masks = {n: tensors[pos[n]] if n in pos else call.get(n) for n in ("key_padding_mask", "attn_mask")}
        g0 = gs[0]
        if g0 is None or lay.outs[0] in (None, FOLDED):
            return None
        g0 = g0 if lay.outs[0] == 0 else g0.movedim(lay.outs[0], 0)
        gw = gs[1] if len(gs) > 1 else None
        if gw is not None and lay.outs[1] in (None, FOLDED):
            return None
        gw = gw if gw is None or lay.outs[1] == 0 else gw.movedim(lay.outs[1], 0)
        need = bool(call.get("need_weights", True))
        with torch.enable_grad():
            P = [F.linear(x, w, b).detach().requires_grad_() for x, w, b in zip(xs, Ws, bs, strict=True)]
            leaves = list(P)
            k, v = P[1], P[2]
            kpm, am = masks["key_padding_mask"], masks["attn_mask"]
            if m.bias_k is not None:  # torch appends them as the last key/value position (and pads the masks)
                bk = m.bias_k.detach().reshape(1, 1, E).expand(B, 1, E).clone().requires_grad_()
                bv = m.bias_v.detach().reshape(1, 1, E).expand(B, 1, E).clone().requires_grad_()
                leaves += [bk, bv]
                k, v = torch.cat([k, bk], 1), torch.cat([v, bv], 1)
                kpm = F.pad(kpm, (0, 1)) if kpm is not None else None
                am = F.pad(am, (0, 1)) if am is not None else None
            A, weights = F.multi_head_attention_forward(
                P[0].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), E, h,
                None, None, None, None, m.add_zero_attn, 0.0, eye, None,
                training=False, key_padding_mask=kpm, need_weights=need, attn_mask=am,
                use_separate_proj_weight=True, q_proj_weight=eye, k_proj_weight=eye, v_proj_weight=eye,
                average_attn_weights=bool(call.get("average_attn_weights", True)),
                is_causal=bool(call.get("is_causal", False)),
            )  # fmt: skip
            A = A.transpose(0, 1)  # (B, L, E): the heads before out_proj
            outs, gos = [A], [g0 @ Wo]
            if gw is not None and weights is not None:
                outs.append(weights)
                gos.append(gw)
            d = torch.autograd.grad(outs, leaves, gos, allow_unused=True)
        d = [torch.zeros_like(t) if dt is None else dt for t, dt in zip(leaves, d, strict=True)]
        dq, dk, dv = d[:3]
        Gs = [torch.bmm(dp.transpose(1, 2), x) for dp, x in zip((dq, dk, dv), xs, strict=True)]
        if packed:
            add("in_proj_weight", torch.cat(Gs, dim=1))
        else:
            for n, G in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), Gs, strict=True):
                add(n, G)
        if m.in_proj_bias is not None:
            add("in_proj_bias", torch.cat([dp.sum(1) for dp in (dq, dk, dv)], dim=1))
        if m.bias_k is not None:
            add("bias_k", d[3].reshape(B, *m.bias_k.shape))
            add("bias_v", d[4].reshape(B, *m.bias_v.shape))
        add("out_proj.weight", torch.bmm(g0.transpose(1, 2), A.detach()))
        if m.out_proj.bias is not None:
            add("out_proj.bias", g0.sum(1))
    return {n: out[n] for n in unit.names} if all(n in out for n in unit.names) else None


# the nn.RNNBase modes _rnn_step computes (equations: https://pytorch.org/docs/stable/generated/torch.nn.LSTM.html,
# .../torch.nn.GRU.html, .../torch.nn.RNN.html)
_RNN_MODES = frozenset({"LSTM", "GRU", "RNN_TANH", "RNN_RELU"})


def _rnn_step(
    mode: str, u: torch.Tensor, v: torch.Tensor, h: torch.Tensor, c: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step of torch's recurrences from u = W_ih x_t + b_ih and v = W_hh h_{t-1} + b_hh (all
    gate blocks stacked, in torch's order): (h_t, c_t); c is None except for the LSTM."""
    if mode == "LSTM":
        # torch.nn.LSTM docs: i, f, g, o = σ, σ, tanh, σ of W_i· x_t + b_i· + W_h· h_{t-1} + b_h·;
        # c_t = f ⊙ c_{t-1} + i ⊙ g;  h_t = o ⊙ tanh(c_t)
        i, f, g, o = (u + v).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    if mode == "GRU":
        # torch.nn.GRU docs: r = σ(W_ir x_t + b_ir + W_hr h + b_hr), z likewise,
        # n = tanh(W_in x_t + b_in + r ⊙ (W_hn h + b_hn)), h_t = (1 − z) ⊙ n + z ⊙ h_{t-1}
        # (b_hn sits inside r ⊙ (...), so its gradient is not b_in's)
        ur, uz, un = u.chunk(3, -1)
        vr, vz, vn = v.chunk(3, -1)
        r, z = torch.sigmoid(ur + vr), torch.sigmoid(uz + vz)
        n = torch.tanh(un + r * vn)
        return (1 - z) * n + z * h, None
    # torch.nn.RNN docs: h_t = act(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh), act = tanh or relu
    return (torch.tanh(u + v) if mode == "RNN_TANH" else torch.relu(u + v)), None


def _rnn_per_example(
    unit: _Unit, records: list[_Record], grads: list[list[torch.Tensor | None]], B: int
) -> dict[str, torch.Tensor] | None:
    """Per-example gradients of an ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` (tanh / relu) without vmap
    (which cannot batch torch's fused recurrent kernels): any ``num_layers``, ``bidirectional``,
    ``batch_first``, ``bias``, an LSTM's ``proj_size``, with or without an initial state ``h0`` /
    ``(h0, c0)``. None (the module then goes to a vmap, i.e. ghost refuses it and ``auto`` falls
    back) for dropout between layers in training mode (its masks cannot be reproduced), a
    ``PackedSequence`` or unbatched (2-D) input, or a batch not where the module expects it.

    The recurrence is recomputed from the recorded input and initial state with the module's own
    (detached) weights, step by step as torch documents it (:func:`_rnn_step`); per layer and
    direction the input projections U = X W_ihᵀ + b_ih of all steps (one tensor) and the hidden
    projections V_t = h_{t-1} W_hhᵀ + b_hh of each step are the tensors differentiated for. One
    batched backward from the recorded gradients of ``output``, ``h_n`` (and ``c_n``) gives every
    example's ∂ℓ_i/∂U and ∂ℓ_i/∂V_t (examples do not interact); then per example
    ∂ℓ_i/∂W_ih = Σ_t (∂ℓ_i/∂U_t) x_tᵀ, ∂ℓ_i/∂W_hh = Σ_t (∂ℓ_i/∂V_t) h_{t-1}ᵀ (each one bmm over
    time), and the biases Σ_t of the same. With ``proj_size`` the projected states h_t = W_hr m_t
    (m_t = o ⊙ tanh(c_t)) are differentiated for too: ∂ℓ_i/∂W_hr = Σ_t (∂ℓ_i/∂h_t) m_tᵀ. The
    first-call check compares the result with the one-example-at-a-time reference like every other
    rule."""
    m = unit.module
    if type(m) not in (nn.LSTM, nn.GRU, nn.RNN) or m.mode not in _RNN_MODES:
        return None
    if m.dropout > 0 and m.training and m.num_layers > 1:  # torch drops out between layers only
        return None
    mode, L, D, H = m.mode, m.num_layers, 2 if m.bidirectional else 1, m.hidden_size
    P = getattr(m, "proj_size", 0)  # LSTM only; h_t and h_n have P features instead of H
    sizes = (P or H, H)  # of h (and c)
    lstm = mode == "LSTM"
    bdim = 0 if m.batch_first else 1
    weights = {n: p.detach() for n, p in m.named_parameters(recurse=False)}
    if not set(unit.names) <= set(weights):
        return None
    dtype = next(iter(weights.values())).dtype
    out: dict[str, torch.Tensor] = {}

    add = partial(_add_into, out)

    for rec, gs, lay in zip(records, grads, unit.layouts, strict=True):
        call = dict(zip(("input", "hx"), rec.args, strict=False))
        if set(call) & set(rec.kwargs) or len(rec.args) > 2:
            return None
        call.update(rec.kwargs)
        x, hx = call.get("input"), call.get("hx")
        if set(call) - {"input", "hx"} or not isinstance(x, torch.Tensor) or x.dim() != 3:
            return None  # PackedSequence, unbatched input, unknown arguments
        if lay.ins[:1] != (bdim,) or x.shape[bdim] != B:
            return None
        # the outputs: output (batch at bdim), h_n (and c_n), (L·D, B, P or H (, H))
        n_out = 3 if lstm else 2
        if len(gs) != n_out or lay.outs[0] != bdim or any(d != 1 for d in lay.outs[1:]):
            return None
        states = (hx if isinstance(hx, tuple) else (hx,)) if hx is not None else ()
        if len(states) not in (0, n_out - 1) or any(
            s.shape != (L * D, B, n) for s, n in zip(states, sizes, strict=False)
        ):
            return None
        states = [_full(s.detach(), dtype) for s in states]
        if not states:
            states = [x.new_zeros(L * D, B, n, dtype=dtype) for n in sizes[: n_out - 1]]
        # leaves that need a gradient, so that every V_t (from h0 at t = 0) is differentiable
        states = [s.detach().requires_grad_() for s in states]
        g_out = gs[0] if gs[0] is None or bdim == 0 else gs[0].movedim(bdim, 0)
        seq = _full(x.detach(), dtype)
        seq = seq if bdim == 0 else seq.movedim(bdim, 0)  # (B, T, ·)
        T = seq.shape[1]
        # per layer and direction: (suffix, its input X, U, [V_t], [h_{t-1}], [h_t], [m_t]) in step
        # order (the last two with proj_size only)
        saved = []
        with torch.enable_grad():
            finals: list[list[torch.Tensor]] = [[] for _ in states]
            for layer in range(L):
                outs = []
                for d in range(D):
                    sfx = f"_l{layer}" + ("_reverse" if d else "")
                    b_ih, b_hh = weights.get("bias_ih" + sfx), weights.get("bias_hh" + sfx)
                    W_hh = weights["weight_hh" + sfx]
                    U = F.linear(seq, weights["weight_ih" + sfx], b_ih)  # (B, T, G·H), all steps
                    U = U if layer else U.requires_grad_()  # layer 0: a leaf (x needs no gradient)
                    # per-step views by one unbind (its backward stacks the steps' gradients once;
                    # indexing U[:, t] would zero-fill a whole (B, T, G·H) gradient per step)
                    u_steps = U.unbind(1)
                    h = states[0][layer * D + d]
                    c = states[1][layer * D + d] if lstm else None
                    Vs, prev, hs, Rs, Ms = [], [], [None] * T, [], []
                    # the reverse direction reads the sequence from its last step to its first
                    for t in range(T - 1, -1, -1) if d else range(T):
                        v = F.linear(h, W_hh, b_hh)
                        Vs.append(v)
                        prev.append(h)
                        h, c = _rnn_step(mode, u_steps[t], v, h, c)
                        if P:  # torch.nn.LSTM docs (proj_size > 0): h_t = W_hr h_t
                            Ms.append(h)
                            h = F.linear(h, weights["weight_hr" + sfx])
                            Rs.append(h)
                        hs[t] = h
                    outs.append(torch.stack(hs, 1))
                    finals[0].append(h)
                    if lstm:
                        finals[1].append(c)
                    saved.append((sfx, seq, U, Vs, prev, Rs, Ms))
                seq = torch.cat(outs, -1) if D > 1 else outs[0]
            ys = [seq] + [torch.stack(f) for f in finals]  # output (B, T, D·H), h_n (, c_n)
            gos = [g_out, *gs[1:]]
            pairs = [(y, g) for y, g in zip(ys, gos, strict=True) if g is not None]
            if not pairs:
                continue
            wrt = [s[2] for s in saved] + [v for s in saved for v in s[3] + s[5]]
            dw = torch.autograd.grad([y for y, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
        dw = [torch.zeros_like(w) if g is None else g for w, g in zip(wrt, dw, strict=True)]
        dU, dV = dw[: len(saved)], iter(dw[len(saved) :])
        for (sfx, X, _, Vs, prev, Rs, Ms), du in zip(saved, dU, strict=True):
            dv = torch.stack([next(dV) for _ in Vs], 1)  # (B, T, G·H), step order as ``prev``
            if P:
                dr = torch.stack([next(dV) for _ in Rs], 1)  # (B, T, P)
                add("weight_hr" + sfx, torch.bmm(dr.transpose(1, 2), torch.stack(Ms, 1).detach()))
            add("weight_ih" + sfx, torch.bmm(du.transpose(1, 2), X.detach()))
            add("weight_hh" + sfx, torch.bmm(dv.transpose(1, 2), torch.stack(prev, 1).detach()))
            if m.bias:
                add("bias_ih" + sfx, du.sum(1))
                add("bias_hh" + sfx, dv.sum(1))
    zeros = {n: w.new_zeros(B, *w.shape) for n, w in weights.items() if n not in out}
    return {n: out[n] if n in out else zeros[n] for n in unit.names}


# Modules whose per-example gradients are recomputed from their recorded inputs (a vmap over them is
# the fallback when the function returns None): exact type -> (function, what describe() says).
_RECOMPUTED: dict[type[nn.Module], tuple[Callable[..., dict[str, torch.Tensor] | None], str]] = {
    nn.MultiheadAttention: (_mha_per_example, "per-example by recomputing the attention"),
    nn.LSTM: (_rnn_per_example, "per-example by recomputing the recurrence"),
    nn.GRU: (_rnn_per_example, "per-example by recomputing the recurrence"),
    nn.RNN: (_rnn_per_example, "per-example by recomputing the recurrence"),
}


def _loop_per_example(model: nn.Module, params: list[nn.Parameter], x: torch.Tensor, y: torch.Tensor):
    """Per-example gradients (B, *p.shape) by one backward pass per example: the reference."""
    rows = []
    for i in range(x.shape[0]):
        gs = torch.autograd.grad(_per_example_loss_sum(model, x[i : i + 1], y[i : i + 1]), params, allow_unused=True)
        # (an nn.Embedding(sparse=True) gives a sparse gradient: compared densely)
        rows.append([torch.zeros_like(p) if g is None else g.to_dense() for p, g in zip(params, gs, strict=True)])
    return [torch.stack([r[k] for r in rows]) for k in range(len(params))]


def _close(got: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> bool:
    # Rounding only: ~1e-15 relative in float64; float32 (and TF32 matmuls on GPUs) ~1e-4.
    # ``floor``: an absolute tolerance from the whole gradient's scale (see GhostClipper._check).
    tol = 1e-8 if ref.dtype == torch.float64 else 1e-3
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    atol = max(tol * max(scale, 1e-30), floor)
    return got.shape == ref.shape and bool(torch.allclose(got, ref, rtol=tol, atol=atol))


# Rounding of a parameter's gradient is relative to the whole gradient, not to the parameter's own:
# a parameter whose gradient is exactly 0 in exact arithmetic (a bias before a norm layer that
# removes it, a key bias under softmax) comes out as ±eps·‖g‖ in both methods, which a relative
# comparison calls a disagreement (found by benchmarks/clipping_fuzz.py). The per-parameter checks
# therefore accept errors up to this many machine epsilons of the total gradient norm.
ROUNDING_EPS = 64


class GhostClipper(Clipper):
    """Ghost norms + book-keeping clipped sums, per layer mixed with per-example instantiation.

    One forward pass with module hooks records each layer's input and hooks (a view of) its output;
    one backward pass computes the gradients w.r.t. those outputs only (no parameter gradients), and
    each layer's part is formed inside it as soon as its output gradient is complete, keeping only
    what its clipped sum needs (see :meth:`_norm_parts`: peak memory). Per layer, the cost model
    (:func:`_ghost_is_cheaper`) picks ghost norm or instantiation (Bu et al. 2023, arXiv:2210.00038,
    "hybrid BK"), parameters shared between layers (tied weights)
    get the ghost norm of the sum of their uses (or are instantiated per use and summed, by the same
    cost rule), modules without a rule get per-example gradients by a vmap
    over the module alone, and the squared norms of the disjoint parameter sets are added (exact).

    The plan (``plan_``) is built on the first call: a probe at batch sizes 2 and 3 locates each
    layer's batch dimension (a layer applied to a tensor without one, e.g. a positional embedding
    of ``torch.arange(T)``, has its output expanded to the batch in the clipping forward, a view, so
    that its output gradient is per example), and with ``check=True`` the layer results on the first
    few examples are compared with the one-example-at-a-time reference: a parameter whose result
    disagrees (used outside its module's forward, an output changed in place) is moved to a vmap
    over the model, and if the norms still disagree the model is refused (GhostMismatchError).
    """

    method = "ghost"
    pads = True
    CHECK_EXAMPLES = 4

    def __init__(
        self,
        model: nn.Module,
        *,
        check: bool = True,
        autocast: torch.dtype | None = None,
        conv_route: str | None = None,
    ) -> None:
        super().__init__(model, autocast=autocast)
        self.check = check
        # How instantiated Conv2d layers get their per-example gradients ("patches" | "grouped",
        # see _Conv2dHandler); None: the default for the device. Performance only: same results.
        self.conv_route = None if conv_route is None else check_choice(CONV_ROUTES, conv_route=conv_route)
        self.plan_: GhostPlan | None = None
        self._check_pending = False  # the plan was checked on one example only (see _plan)
        self._how: dict[int, str] = {}
        self._how_tied: dict[int, str] = {}  # parameter index -> how a weight shared by layers was handled
        # An in-place module after a hooked one would overwrite the output whose gradient we read:
        # hand the rest of the model a copy instead.
        self._clone = any(getattr(m, "inplace", False) for m in model.modules())
        self._recorder: _Recorder | None = None  # the hooks of the plan last run (see _recorder_for)
        self._release: weakref.finalize | None = None

    def close(self) -> None:
        """Remove the clipper's forward hooks from the model (also done when the clipper is
        garbage-collected; the hooks do nothing outside the clipper's own forward pass anyway)."""
        if self._release is not None:
            self._release()  # calls the recorder's close once
        self._recorder = self._release = None

    def _recorder_for(self, plan: GhostPlan) -> _Recorder:
        # Hooks are registered once per plan; a rerouted plan replaces them (no stale hooks left).
        if self._recorder is None or self._recorder.plan is not plan:
            self.close()
            self._recorder = _Recorder(plan, self._clone, self.params)
            # The hooks hold the recorder, never the clipper: a dropped clipper is collected and
            # its hooks removed by this finaliser.
            self._release = weakref.finalize(self, self._recorder.close)
        return self._recorder

    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        if self.plan_ is None:
            self.plan_ = self._make_plan(x, y)
        elif self._check_pending and self._valid >= 2:
            self.plan_ = self._make_plan(x, y, self.plan_)
        return self._clip(self.plan_, x, y, clip)

    # -- the plan

    def _make_plan(self, x: torch.Tensor, y: torch.Tensor, plan: GhostPlan | None = None) -> GhostPlan:
        # vmap skips parameters' own gradient hooks (see hooked_parameters): then only the loop is left
        hint = "try --clipping loop" if hooked_parameters(self.model, self.params) else "try --clipping vmap or loop"
        try:
            with _refusing("ghost", hint):
                return self._plan(x, y, plan)
        except BaseException:
            self.close()  # a refused model keeps no hooks
            raise

    def _plan(self, x: torch.Tensor, y: torch.Tensor, plan: GhostPlan | None = None) -> GhostPlan:
        """A new plan for batches like ``x`` checked on its first real rows; or, given ``plan`` (built
        on a batch of one example), that plan checked on this batch's.

        Why the check waits for two examples: it compares each layer's per-example gradients with the
        one-example reference, and with one example a rule that assigns positions to the wrong example
        (a Linear on a time-major (T·B, d) fold, seen by the probe as batch-major (B·T, d)) is right by
        accident; on later batches it under-estimated norms by up to 27% (found by
        benchmarks/clipping_fuzz.py). The first batch of Poisson sampling may have one example."""
        fresh = plan is None
        if fresh:
            plan = build_ghost_plan(self.model, x, self.params)
        was_training, autocast = self.model.training, self.autocast
        # No dropout and full precision: the checks compare deterministic functions to rounding.
        self.model.eval()
        self.autocast = None
        try:
            if fresh:
                plan = self._verify_expansion(plan, x)
            if self.check:
                plan = self._check(plan, x[: self.CHECK_EXAMPLES], y[: self.CHECK_EXAMPLES])
                # Padding rows are copies of a real row: a rule that swaps whole examples is right on
                # them by accident, so such a plan is checked again on two real examples.
                self._check_pending = self._valid < 2
                if fresh and was_training:
                    self.model.train()
                    plan = self._check_training(plan, x[:1], y[:1])
        finally:
            self.model.train(was_training)
            self.autocast = autocast
        return plan

    def _verify_expansion(self, plan: GhostPlan, x: torch.Tensor) -> GhostPlan:
        """A shared output expanded to (B, ...) must leave the model's output unchanged (it does when
        the model broadcasts it against batched tensors); try (B, *s), then s[0] = 1 -> B, else reroute."""
        bad: set[int] = set()
        inputs = [x[:1].repeat(n, *([1] * (x.dim() - 1))) for n in (2, 3)]
        with torch.no_grad():
            ref = [self.model(xs) for xs in inputs]
            for u, unit in enumerate(plan.units):
                if not any(e for lay in unit.layouts for e in lay.expand):
                    continue
                for mode in ("prepend", "replace"):
                    lays = [_Layout(lay.ins, lay.outs, tuple(e and mode for e in lay.expand)) for lay in unit.layouts]
                    trial = GhostPlan([_Unit(unit.name, unit.module, unit.handler, unit.names, lays)], {}, [], [])
                    recorder = _Recorder(trial, self._clone)
                    try:
                        ok = all(_close(self._forward(recorder, xs)[0], r) for xs, r in zip(inputs, ref, strict=True))
                    except (RuntimeError, IndexError, ValueError):
                        ok = False
                    finally:
                        recorder.close()
                    if ok:
                        unit.layouts = lays
                        break
                else:
                    bad |= {plan.index[(u, n)] for n in unit.names}
        return _reroute(plan, self.model, self.params, bad, "expanding its batch-less output changes the model")

    def _check(self, plan: GhostPlan, x: torch.Tensor, y: torch.Tensor) -> GhostPlan:
        ref = _loop_per_example(self.model, self.params, x, y)
        ref_norms = torch.sqrt(_sq_norms(ref))
        # Absolute floors (ROUNDING_EPS): for a batch sum, Σ_i ‖g_i‖; for a squared norm, max_i ‖g_i‖².
        eps = ROUNDING_EPS * torch.finfo(ref_norms.dtype).eps
        floor, floor_sq = eps * float(ref_norms.sum()), eps * float(ref_norms.max()) ** 2
        for attempt in range(2):
            parts, pe, norms = self._norm_parts(plan, x, y)
            bad: set[int] = set()
            for part, idx in parts:
                with torch.no_grad():  # the recorded inputs are not detached
                    sums = part.clipped(torch.ones_like(norms))
                # The batch sums localise the culprit; a norm mismatch alone blames the whole layer.
                wrong = {idx[n] for n in sums if not _close(sums[n], ref[idx[n]].sum(0), floor)}
                if not wrong and not _close(part.sq_norm, _sq_norms([ref[k] for k in idx.values()]), floor_sq):
                    wrong = set(idx.values())
                bad |= wrong
            bad |= {k for k, G in pe.all().items() if not _close(G, ref[k], floor)}
            bad |= {k for k in plan.unused() if not _close(torch.zeros_like(ref[k]), ref[k], floor)}
            if not bad and _close(norms, ref_norms):
                return plan
            if attempt == 0:
                why = "its per-example gradient disagreed with the reference (used outside its module's forward?)"
                plan = _reroute(plan, self.model, self.params, bad, why)
        qual = {id(p): n for n, p in self.model.named_parameters()}
        names = ", ".join(qual[id(self.params[k])] for k in sorted(bad)) or "(the norms)"
        hooked = set(hooked_parameters(self.model, [self.params[k] for k in bad]))
        if hooked:  # the reference ran the hook, the per-layer rules and the vmap units cannot
            raise GhostMismatchError(
                f"ghost clipping disagrees with per-example gradients for {names}: the gradient hook on "
                f"{', '.join(sorted(hooked))} (Tensor.register_hook) changes its gradient, which only a backward "
                "pass per example runs"
            )
        raise GhostMismatchError(
            f"ghost clipping disagrees with per-example gradients for {names} (a parameter used outside its "
            "module's forward, or a layer output changed in place); use --clipping vmap or loop"
        )

    def _check_training(self, plan: GhostPlan, x: torch.Tensor, y: torch.Tensor) -> GhostPlan:
        """The per-layer rules against the reference once more, in training mode, on one example (``x``
        has one row), the reference pass and the ghost pass each from the same random state (same
        shapes: Dropout draws the same masks); buffers and the random state are restored after.

        Why: :meth:`_check` runs in eval mode, so a parameter used outside its module's forward only in
        training (an auxiliary output under ``if self.training`` that reuses a layer's weight through
        ``F.linear``) passed it, and every training step then clipped norms that left that use out
        (measured: norm 4.46 for the loop's 7.83). Compared: the parameters whose every use is in a unit
        with a rule (their gradients come from the recorded activations and output gradients of this
        very pass); vmap units and recomputed modules draw their own dropout masks. A parameter that
        disagrees goes to the vmap over the model, as in :meth:`_check`."""
        handled = {k for k, us in plan.uses.items() if all(plan.units[u].handler is not None for u, _ in us)}
        handled |= set(plan.bare)  # from this very pass's output gradients too
        if not handled:
            return plan
        # Each buffer's slot, tensor and value: a training pass may update a buffer in place (spectral
        # normalisation's power iteration) or assign a new tensor to it (a user's running mean).
        slots = [
            (m, n, b, b.detach().clone()) for m in self.model.modules() for n, b in m._buffers.items() if b is not None
        ]
        devices = [x.device] if x.device.type == "cuda" else []

        def restore() -> None:
            with torch.no_grad():
                for m, n, b, value in slots:
                    m._buffers[n] = b
                    b.copy_(value)

        try:
            with torch.random.fork_rng(devices=devices):
                ref = _loop_per_example(self.model, self.params, x, y)
            restore()
            with torch.random.fork_rng(devices=devices):
                parts, pe, norms = self._norm_parts(plan, x, y)
        finally:
            restore()
        eps = ROUNDING_EPS * torch.finfo(norms.dtype).eps
        floor = eps * float(torch.sqrt(_sq_norms(ref)).sum())
        got: dict[int, torch.Tensor] = {}
        with torch.no_grad():  # one example: its clipped sum at factor 1 is its gradient
            ones = torch.ones_like(norms)
            for part, idx in parts:
                got.update((idx[n], v) for n, v in part.clipped(ones).items())
            got.update(pe.clipped(ones))
        for k in plan.unused():
            got.setdefault(k, torch.zeros_like(ref[k][0]))
        bad = {k for k in handled if k in got and not _close(got[k], ref[k][0], floor)}
        why = "its training-mode gradient disagreed with the reference (used outside its module's forward in training?)"
        return _reroute(plan, self.model, self.params, bad, why)

    # -- one clipping pass

    def _forward(
        self, recorder: _Recorder, x: torch.Tensor, on_grad: Callable[[int, int, int, torch.Tensor], None] | None = None
    ) -> tuple[torch.Tensor, list[list[_Record]]]:
        """model(x) with the recorder's hooks active: shared outputs expanded to the batch, calls recorded."""
        with recorder.recording(x.shape[0], on_grad) as calls, _autocast(x, self.autocast):
            out = self.model(x)
        return out, calls

    def _norm_parts(self, plan: GhostPlan, x: torch.Tensor, y: torch.Tensor):
        """The per-example norms and what the clipped sums need, from one forward and one backward pass.

        Memory: each unit with a rule is handled inside the backward pass, as soon as its output
        gradients are complete (a tensor hook per recorded output), and keeps only what its clipped
        sum needs (book-keeping: its inputs and output gradients; instantiation: the per-example
        gradients; a norm layer: its small per-example gradients); its records and output gradients
        are released there, before the backward pass reaches the layers below. The backward pass is
        asked for the outputs' gradient edges (``torch.autograd.backward(inputs=edges)``): nothing is
        accumulated or kept for them (asking ``autograd.grad`` for the outputs themselves would hold
        every layer's output gradient until the pass ends), and autograd still skips the
        parameter-gradient matmuls (book-keeping needs a and g, never ∇θ of the batch; Bu et al.
        2023). Units without a rule (a vmap over the module), and the uses of tied weights, are
        handled after the pass, as before. Results are assembled in the plan's unit order, so every
        sum is formed in the same order as when all units were handled after the pass."""
        B = x.shape[0]
        recorder = self._recorder_for(plan)
        n_units = len(plan.units)
        got: list[dict[tuple[int, int], torch.Tensor] | None] = [{} for _ in range(n_units)]
        missing = [0] * n_units
        # per unit: (per-example gradients to add by parameter index, its part, its tied-weight uses)
        done: list[tuple[list, tuple[_LayerPart, dict[str, int]] | None, list] | None] = [None] * n_units
        store: list[list[_Record] | None] = []
        dtype = self.params[0].dtype

        def unit_grads(u: int) -> list[list[torch.Tensor | None]]:
            # The gradient of each recorded output (zeros when the loss does not use it), in the
            # parameters' precision; the unit's received gradients are released from ``got``.
            g, got[u] = got[u], None
            return [
                [
                    None if o is None else _full(g[(k, j)] if (k, j) in g else _zeros(o), dtype)
                    for j, o in enumerate(r.outs)
                ]
                for k, r in enumerate(store[u])
            ]

        def process(u: int) -> None:
            unit = plan.units[u]
            grads, recs = unit_grads(u), store[u]
            store[u] = None  # the records go with this call: parts keep what they need
            adds: list[tuple[int, torch.Tensor]] = []
            entry, uses = None, []
            # Everything from here on in full precision (see exact_matmuls), from the same a and g,
            # and without autograd recording (the recorded inputs are not detached).
            with exact_matmuls(), torch.no_grad():
                if unit.handler is None:
                    recs = [
                        _Record([(k, _full(t, dtype)) for k, t in r.inputs], r.args, r.kwargs, r.outs) for r in recs
                    ]
                    rule = _RECOMPUTED.get(type(unit.module))
                    fast = rule[0](unit, recs, grads, B) if rule is not None else None
                    self._how[u] = rule[1] if fast is not None else unit.how
                    per = fast or _local_per_example(unit, recs, grads, B)
                    adds = [(plan.index[(u, n)], g) for n, g in per.items()]
                    done[u] = (adds, None, [])
                    return
                ins = [
                    _batch_first(_full(r.inputs[0][1], dtype), lay.ins[0], lay.expand[0], B)
                    for r, lay in zip(recs, unit.layouts, strict=True)
                ]
                gs = [
                    _batch_first(g[0], 0 if lay.outs[0] is None else lay.outs[0], None, B)
                    for g, lay in zip(grads, unit.layouts, strict=True)
                ]
                del recs, grads
                ghost = plan.ghost_names(u)
                if ghost:
                    part = unit.handler.part(unit.module, ins, gs, ghost, **self._options(unit.handler))
                    adds = [(plan.index[(u, n)], G) for n, G in part.small.items()]
                    if part.sq_norm is not None:
                        entry = (part, {n: plan.index[(u, n)] for n in ghost if n not in part.small})
                    self._how[u] = part.how
                else:
                    self._how[u] = "tied weight only"
                uses = [(plan.index[(u, n)], (unit, ins, gs, n)) for n in unit.names if n not in ghost]
            done[u] = (adds, entry, uses)

        def on_grad(u: int, k: int, j: int, g: torch.Tensor) -> None:
            # Called by the backward pass with the complete gradient of output j of call k of unit u.
            got[u][(k, j)] = g
            missing[u] -= 1
            if missing[u] == 0 and plan.units[u].handler is not None:
                process(u)

        logits, calls = self._forward(recorder, x, on_grad)
        store.extend(calls)
        edges, recorder.edges = recorder.edges, []
        bare, recorder.bare = recorder.bare, None
        if [len(recs) for recs in store] != recorder.counts:
            raise GhostMismatchError("the modules are called a different number of times than in the probe")
        for u, recs in enumerate(store):
            missing[u] = sum(o is not None and o.requires_grad for r in recs for o in r.outs)
        loss = _loss_from_logits(logits, y, self.autocast)
        del logits, calls
        if edges:
            torch.autograd.backward(loss, inputs=edges)
        del loss
        for u in range(n_units):  # units without a rule, and outputs the loss did not reach
            if done[u] is None:
                process(u)
        parts: list[tuple[_LayerPart, dict[str, int]]] = []
        pe: dict[int, torch.Tensor] = {}
        shared: dict[int, list[tuple[_Unit, list[torch.Tensor], list[torch.Tensor], str]]] = {}
        while done:  # in unit order (the order of every sum below); no loop variable keeps a tensor
            adds, entry, uses = done.pop(0)
            while adds:
                k, g = adds.pop(0)
                pe[k] = g if k not in pe else pe[k] + g
            if entry is not None:
                parts.append(entry)
            for k, use in uses:
                shared.setdefault(k, []).append(use)
        g = entry = uses = None
        with exact_matmuls(), torch.no_grad():
            # Bare parameters of the model: each use's per-example gradients mapped into the parameter.
            while bare is not None and bare.grads:
                k, chain, gv = bare.grads.pop(0)
                g = _bare_unview(self.params[k], chain, gv)
                pe[k] = g if k not in pe else pe[k] + g
            bare = g = None
            for k, uses in shared.items():
                # A tied weight: ghost norm with cross terms when every use has a factored form
                # (and no use went through a vmap), else its uses' per-example gradients summed.
                fs = [unit.handler.factors(unit.module, ins, gs, n) for unit, ins, gs, n in uses]
                part = None if k in pe or None in fs else _tied_part(fs, self.params[k].shape)
                self._how_tied[k] = part.how if part is not None else "instantiate, summed over its uses"
                if part is not None:
                    parts.append((part, {"": k}))
                    continue
                for unit, ins, gs, n in uses:
                    g = unit.handler.per_example(unit.module, ins, gs, n, **self._options(unit.handler))
                    pe[k] = g if k not in pe else pe[k] + g
            shared = uses = fs = g = ins = gs = None  # tied uses not kept by a part go now
            pooled = _PerExample(pe, B)
            pe = None  # the pooled originals: M holds their values
            terms = [p.sq_norm for p, _ in parts] + pooled.sq_norms()  # one sum over all layers
            if not terms:
                sq = torch.zeros(B, dtype=self.params[0].dtype, device=self.params[0].device)
            else:
                sq = sum(terms[1:], terms[0]) if len(terms) <= 2 else torch.stack(terms).sum(0)
        # Σ_{t,s}(a_t·a_s)(g_t·g_s) is ≥ 0 exactly but may round below 0: clamp before the sqrt.
        return parts, pooled, torch.clamp(sq, min=0.0).sqrt_()

    def _options(self, handler: type[_Handler]) -> dict[str, Any]:
        return {"route": self.conv_route} if handler.routes else {}

    def _clip(self, plan: GhostPlan, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        parts, pe, norms = self._norm_parts(plan, x, y)
        c = self._clip_factors(norms, clip)
        grads: list[torch.Tensor | None] = [None] * len(self.params)
        with exact_matmuls(), torch.no_grad():  # the recorded inputs are not detached
            # Each holder of per-example gradients, inputs and output gradients is released once
            # its sums are formed, before the next one's temporaries (the sums are independent).
            for k, v in pe.clipped(c).items():
                grads[k] = v
            del pe
            while parts:
                part, idx = parts.pop()
                for n, v in part.clipped(c).items():
                    grads[idx[n]] = v
                del part
        out = tuple(torch.zeros_like(p) if g is None else g for p, g in zip(self.params, grads, strict=True))
        return ClippedGradients(grads=out, norms=norms)

    def describe(self) -> dict[str, Any]:
        """The method, and per layer what was chosen on the last call (JSON-ready)."""
        if self.plan_ is None:
            return {"method": self.method, "layers": {}}
        qual = {id(p): n for n, p in self.model.named_parameters()}
        layers: dict[str, str] = {}
        for u, unit in enumerate(self.plan_.units):
            label = unit.name or "(model)"
            if unit.handler is None:
                layers[label] = f"{self._how.get(u, unit.how)}: {', '.join(unit.names)}"
            else:
                layers[label] = self._how.get(u, "not called yet")
        for k, us in self.plan_.uses.items():
            if len(us) > 1:
                users = ", ".join(self.plan_.units[u].name or "(model)" for u, _ in us)
                how = self._how_tied.get(k, "not called yet")
                layers[qual[id(self.params[k])]] = f"{how} (tied: {users})"
        unused = self.plan_.unused()
        for k, n in self.plan_.bare.items():
            uses = [c.name for c in self.plan_.bare_calls if k in c.params and c.kind in ("expand", "broadcast")]
            if k in unused:
                layers[n] = UNUSED
            else:
                layers[n] = f"per-example from its {len(uses)} use(s) broadcast against the batch ({', '.join(uses)})"
        return {"method": self.method, "layers": layers, "notes": list(self.plan_.notes)}


# ---------------------------------------------------------------------------------------- factory


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


class AutoClipper(Clipper):
    """``auto``: on the first call, ghost (mixed per layer) if its plan has at least one layer with
    a ghost-norm rule and passes its check, else vmap, else the loop; the choice and the reasons are
    kept (``describe``). A model on which even the loop fails is refused with the reasons."""

    method = "auto"
    pads = True  # every method it may choose pads

    def __init__(self, model: nn.Module, *, autocast: torch.dtype | None = None) -> None:
        super().__init__(model, autocast=autocast)
        self.chosen_: Clipper | None = None
        self.tried_: list[str] = []

    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        if self.chosen_ is not None:
            self.chosen_._valid = self._valid
            try:
                return self.chosen_._compute(x, y, clip)
            except GhostMismatchError as e:  # a module called a different number of times than planned
                self.tried_.append(f"ghost (later batch): {_first_line(e)}")
                self.chosen_.close()
                self.chosen_ = VmapClipper(self.model, autocast=self.autocast)
                self.chosen_._valid = self._valid
                return self.chosen_._compute(x, y, clip)
        for cls in (GhostClipper, VmapClipper, LoopClipper):
            impl = cls(self.model, autocast=self.autocast)
            impl._valid = self._valid
            # A probe's warnings (torch's "no batching rule" note from a vmap that then fails) are said only
            # if the method is chosen: a user never runs the others.
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                try:
                    if isinstance(impl, GhostClipper):
                        impl.plan_ = impl._make_plan(x, y)
                        if not any(u.handler is not None for u in impl.plan_.units):
                            self.tried_.append("ghost: no layer has a ghost-norm rule")
                            impl.close()
                            continue
                    out = impl._compute(x, y, clip)
                except torch.OutOfMemoryError:
                    raise
                except (InputError, RuntimeError, ValueError, TypeError, IndexError) as e:
                    self.tried_.append(f"{cls.method}: {_first_line(e)}")
                    impl.close()
                    continue
            for w in said:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            self.chosen_ = impl
            return out
        raise InputError(
            "no per-example clipping method runs on this model (tried --clipping ghost, vmap, loop): "
            + "; ".join(self.tried_)
        )

    def close(self) -> None:
        if self.chosen_ is not None:
            self.chosen_.close()

    def describe(self) -> dict[str, Any]:
        inner = self.chosen_.describe() if self.chosen_ is not None else {"method": None}
        return {**inner, "requested": "auto", "tried": list(self.tried_)}


_CLIPPERS: dict[str, type[Clipper]] = {
    "auto": AutoClipper,
    "loop": LoopClipper,
    "vmap": VmapClipper,
    "ghost": GhostClipper,
}


def make_clipper(model: nn.Module, method: str = "auto", *, autocast: torch.dtype | None = None) -> Clipper:
    """A :class:`Clipper` for ``model`` by name: ``auto | ghost | vmap | loop``.

    ``auto`` decides on the first batch (ghost, mixed per layer, where it is exact; else vmap;
    else the loop) and says what it chose in ``describe()``. Raises
    :class:`~dpaudit.errors.InputError` for BatchNorm models (BatchNorm mixes examples, so
    per-example clipping no longer bounds one example's influence; use GroupNorm/LayerNorm).
    """
    check_choice(CLIPPING, clipping=method)
    return _CLIPPERS[method](model, autocast=autocast)


def clipped_gradient_sum(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, *, method: str = "auto"
) -> ClippedGradients:
    """One-shot convenience: ``make_clipper(model, method)(x, y, clip)``."""
    return make_clipper(model, method)(x, y, clip)


def clipping_text(described: dict[str, Any]) -> str:
    """A human-readable rendering of :meth:`Clipper.describe` (for ``dpaudit inspect``)."""
    requested = f" (--clipping {described['requested']})" if described.get("requested") else ""
    lines = [f"clipping   {described.get('method')}{requested}"]
    lines += [f"  {name}: {how}" for name, how in described.get("layers", {}).items()]
    lines += [f"  tried {t}" for t in described.get("tried", [])]
    return "\n".join(lines)
