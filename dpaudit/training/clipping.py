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
* ``ghost`` – per-example norms from layer activations ``a`` and output gradients ``g`` captured
  with module hooks, without materialising per-example gradients (Goodfellow 2015,
  arXiv:1510.01799; Rochette et al. 2019, arXiv:1912.06015 for convolutions; ghost norms of
  Li et al. 2021, arXiv:2110.05679 for sequences), then the clipped sum by book-keeping from the
  same ``a`` and ``g`` (Bu et al. 2023, arXiv:2210.00038): one forward and one backward pass that
  skips the parameter gradients. Supported: ``Linear`` (any number of leading dims, any number
  of calls per forward), ``Conv2d`` (groups 1, zero padding), ``Embedding``, ``LayerNorm``,
  ``GroupNorm``. Parameters of other modules fall back to vmap and their norms are combined
  exactly (squared norms add over disjoint parameter sets).
* ``auto``  – ``ghost`` when every trainable parameter belongs to a supported module, else ``vmap``.

Assumptions shared by all methods (checked where possible):

* The loss of example ``i`` depends on example ``i`` only: no BatchNorm or other layer that mixes
  examples (refused by :func:`dpaudit.models.check_no_batchnorm`).
* ``ghost``: each parameter of a supported module is used only through that module's forward and
  the module's output is not modified in place; parameters are not shared between modules (shared
  ones fall back to vmap). The first call checks ghost norms against vmap on a few examples and
  refuses the model if they disagree, so a violated assumption fails loudly instead of clipping
  wrongly.

Numerics: norms are computed in the parameters' dtype, as in Opacus. The methods agree to
rounding (~1e-15 relative in float64, ~1e-6 in float32), so a clipped gradient may exceed C by
that relative amount; the ghost Gram sum Σ(a_t·a_s)(g_t·g_s) is clamped at 0 before the square
root. Everything is device- and dtype-agnostic (float32/float64, CPU/CUDA); nothing leaves the device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F
from torch.nn.grad import conv2d_weight

from dpaudit.errors import InputError
from dpaudit.models import check_no_batchnorm
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


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters that are clipped and noised: ``requires_grad`` ones, each once."""
    return [p for p in model.parameters() if p.requires_grad]


def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """c_i = 1 / max(1, ‖g_i‖/C)  (Abadi et al. 2016, arXiv:1607.00133, Alg. 1, "clip gradient").

    Written as a division by max(1, ·) rather than min(1, C/‖g‖) so that a zero norm needs no
    special case (no 0/0 or C/0).
    """
    return 1.0 / torch.clamp(norms / clip, min=1.0)


def _per_example_loss_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # Σ_i ℓ_i: with reduction="sum" the gradient of the total w.r.t. anything computed from example
    # i alone is the gradient of ℓ_i (examples do not interact), which the ghost method relies on.
    return F.cross_entropy(model(x), y, reduction="sum")


class Clipper(ABC):
    """Computes :class:`ClippedGradients` for batches; built once per model by :func:`make_clipper`."""

    method: str

    def __init__(self, model: nn.Module) -> None:
        check_no_batchnorm(model)
        self.model = model
        self.params = trainable_parameters(model)
        if not self.params:
            raise InputError("the model has no trainable parameters")

    def __call__(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        """Clipped-gradient sum and per-example norms for the batch (x, y) at clipping norm ``clip``."""
        clip = check_positive(clip=clip)
        if x.shape[0] != y.shape[0]:
            raise InputError(f"x has {x.shape[0]} examples but y has {y.shape[0]}")
        if x.shape[0] == 0:
            return ClippedGradients(
                grads=tuple(torch.zeros_like(p) for p in self.params),
                norms=torch.zeros(0, dtype=self.params[0].dtype, device=self.params[0].device),
            )
        return self._compute(x, y, clip)

    @abstractmethod
    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients: ...


# --------------------------------------------------------------------------------------------- loop


class LoopClipper(Clipper):
    """One backward pass per example: slow, obviously correct; the test reference."""

    method = "loop"

    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        sums = [torch.zeros_like(p) for p in self.params]
        norms = []
        for i in range(x.shape[0]):
            loss = _per_example_loss_sum(self.model, x[i : i + 1], y[i : i + 1])
            gs = torch.autograd.grad(loss, self.params, allow_unused=True)
            gs = [torch.zeros_like(p) if g is None else g for p, g in zip(self.params, gs, strict=True)]
            norm = torch.sqrt(sum(g.square().sum() for g in gs))
            c = clip_factors(norm, clip)
            for s, g in zip(sums, gs, strict=True):
                s.add_(g * c)
            norms.append(norm)
        return ClippedGradients(grads=tuple(sums), norms=torch.stack(norms))


# --------------------------------------------------------------------------------------------- vmap


def _per_example_grads(model: nn.Module, names: Sequence[str], x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Per-example gradients (B, *p.shape) of ℓ_i w.r.t. the named parameters, by vmap over grad.

    Every other parameter and buffer enters ``functional_call`` as a constant. ``randomness=
    "different"`` gives each example its own dropout mask, as the loop reference would.
    """
    fixed = {n: p.detach() for n, p in model.named_parameters()}
    diff = {n: fixed.pop(n) for n in names}
    buffers = dict(model.named_buffers())

    def loss_one(d: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, ({**fixed, **d}, buffers), (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0), reduction="sum")

    g = vmap(grad(loss_one), in_dims=(None, 0, 0), randomness="different")(diff, x, y)
    return [g[n] for n in names]


def _sq_norms(per_example: Sequence[torch.Tensor]) -> torch.Tensor:
    return sum(g.reshape(g.shape[0], -1).square().sum(1) for g in per_example)


def _weighted_sum(c: torch.Tensor, per_example: torch.Tensor) -> torch.Tensor:
    # Σ_i c_i G_i as one matrix-vector product.
    return (c @ per_example.reshape(per_example.shape[0], -1)).reshape(per_example.shape[1:])


class VmapClipper(Clipper):
    """Materialised per-example gradients with ``torch.func`` (works for any functional model)."""

    method = "vmap"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        ids = {id(p) for p in self.params}
        self.names = [n for n, p in model.named_parameters() if id(p) in ids]

    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        per_example = _per_example_grads(self.model, self.names, x, y)
        norms = torch.sqrt(_sq_norms(per_example))
        c = clip_factors(norms, clip)
        return ClippedGradients(grads=tuple(_weighted_sum(c, g) for g in per_example), norms=norms)


# -------------------------------------------------------------------------------------------- ghost


@dataclass
class _LayerPart:
    """One module's contribution: per-example squared norm (B,) and a function c -> clipped sums
    (a dict from the module's parameter name to Σ_i c_i ∇_p ℓ_i)."""

    sq_norm: torch.Tensor
    clipped: Callable[[torch.Tensor], dict[str, torch.Tensor]]


def _factored_linear(
    aT: torch.Tensor,
    gT: torch.Tensor,
    weight_shape: torch.Size | None,
    bias: bool,
    weight_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> _LayerPart:
    """A linear map s_t = W a_t + b applied at T positions per example.

    aT: (B, d_in, T) inputs and gT: (B, d_out, T) gradients of Σ_i ℓ_i w.r.t. the outputs, in
    any strides (a Linear passes transposed views, a convolution the natural layouts of im2col and
    of its output, so nothing is copied). The per-example gradients are ∇_W ℓ_i = Σ_t g_it a_itᵀ
    and ∇_b ℓ_i = Σ_t g_it. ``weight_sum(c)``, when given, computes Σ_i c_i ∇_W ℓ_i in a way
    cheaper for the layer than the generic matmul.
    """
    B, d_in, T = aT.shape
    d_out = gT.shape[1]
    G = None
    gb = (gT[:, :, 0] if T == 1 else gT.sum(2)) if bias else None
    if weight_shape is not None and T == 1:
        # Rank one: ‖g aᵀ‖_F² = ‖g‖² ‖a‖², and with the bias ‖g‖²(‖a‖² + 1) (Goodfellow 2015,
        # arXiv:1510.01799).
        g1, a1 = gT[:, :, 0], aT[:, :, 0]
        g_sq = g1.square().sum(1)
        a_sq = a1.square().sum(1)
        sq = g_sq * (a_sq + 1.0) if bias else g_sq * a_sq
    else:
        sq = gb.square().sum(1) if gb is not None else aT.new_zeros(B)
        if weight_shape is None:
            pass
        elif 2 * T * T <= d_in * d_out:
            # Ghost norm: ‖Σ_t g_t a_tᵀ‖_F² = Σ_{t,s} (a_t·a_s)(g_t·g_s)  (Li et al. 2021,
            # arXiv:2110.05679, Sec. 4); O(T²(d_in+d_out)) per example, the cheaper side when
            # 2T² < d_in·d_out (ibid.; "mixed ghost clipping" of Bu et al. 2022, arXiv:2205.10683,
            # picks the cheaper of the two per layer).
            sq = sq + (torch.bmm(aT.transpose(1, 2), aT) * torch.bmm(gT.transpose(1, 2), gT)).sum((1, 2))
        else:
            # Materialise G_i = Σ_t g_t a_tᵀ (B, d_out, d_in) when that is the cheaper side.
            G = torch.bmm(gT, aT.transpose(1, 2))
            sq = sq + G.square().sum((1, 2))

    def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if weight_shape is not None:
            if G is not None:
                w = _weighted_sum(c, G)
            elif weight_sum is not None:
                w = weight_sum(c)
            else:
                # Book-keeping (BK; Bu et al. 2023, arXiv:2210.00038): Σ_i c_i Σ_t g_it a_itᵀ
                # = (c ⊙ g)ᵀ a over all (i, t): one matmul, no per-example gradients, no 2nd backward.
                # c multiplies whichever factor is smaller.
                ci = c[:, None, None]
                gc, ac = (gT * ci, aT) if d_out <= d_in else (gT, aT * ci)
                w = gc.transpose(0, 1).reshape(d_out, B * T) @ ac.transpose(1, 2).reshape(B * T, d_in)
            out["weight"] = w.reshape(weight_shape)
        if gb is not None:
            out["bias"] = c @ gb
        return out

    return _LayerPart(sq_norm=sq, clipped=clipped)


def _cat_positions(parts: Sequence[torch.Tensor], dim: int = 1) -> torch.Tensor:
    # Several calls of one module in a forward pass are extra positions of the same example
    # (Li et al. 2021 treat the time steps of a sequence this way): concatenate along ``dim``.
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _trainable(module: nn.Module, name: str) -> bool:
    p = getattr(module, name, None)
    return isinstance(p, nn.Parameter) and p.requires_grad


class _Handler(ABC):
    """Ghost-norm support for one module type."""

    @staticmethod
    def supports(module: nn.Module) -> bool:
        return True

    @staticmethod
    @abstractmethod
    def part(module: nn.Module, inputs: list[torch.Tensor], grads: list[torch.Tensor]) -> _LayerPart: ...


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
        if weight:  # book-keeping (Bu et al. 2023): Σ_i c_i g_i a_iᵀ = (c ⊙ g)ᵀ a
            ci = c.unsqueeze(1)
            out["weight"] = (g * ci).T @ a if g.shape[1] <= a.shape[1] else g.T @ (a * ci)
        if bias:
            out["bias"] = c @ g
        return out

    return _LayerPart(sq_norm=sq, clipped=clipped)


class _LinearHandler(_Handler):
    @staticmethod
    def part(module, inputs, grads):
        weight, bias = _trainable(module, "weight"), _trainable(module, "bias")
        if len(inputs) == 1 and inputs[0].dim() == 2:
            return _rank_one_linear(inputs[0], grads[0], weight, bias)
        B = inputs[0].shape[0]
        a = _cat_positions([t.reshape(B, -1, module.in_features) for t in inputs])
        g = _cat_positions([t.reshape(B, -1, module.out_features) for t in grads])
        return _factored_linear(a.transpose(1, 2), g.transpose(1, 2), module.weight.shape if weight else None, bias)


def _im2col(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """The (B, C_in·kh·kw, L) input patches of ``conv`` (L = H'·W' output positions), ordered
    (C_in, kh, kw) as in ``weight.reshape(C_out, -1)``: equal to ``F.unfold``, built from strided
    views with one copy (``F.unfold`` on CPU loops over the batch in a parallel region per example,
    which was up to 20x slower here with 2 threads on a loaded machine, and no faster when idle)."""
    (kh, kw), (dh, dw), (sh, sw), (ph, pw) = conv.kernel_size, conv.dilation, conv.stride, conv.padding
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    win = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)  # (B, C, H', W', eh, ew)
    if dh > 1 or dw > 1:
        win = win[..., ::dh, ::dw]
    B, C = x.shape[:2]
    return win.permute(0, 1, 4, 5, 2, 3).reshape(B, C * kh * kw, -1)


class _Conv2dHandler(_Handler):
    """Conv2d as a Linear map applied at every output position of the unfolded input
    (Rochette et al. 2019, arXiv:1912.06015: per-example gradients of convolutions via unfolding)."""

    @staticmethod
    def supports(module):
        return module.groups == 1 and module.padding_mode == "zeros" and not isinstance(module.padding, str)

    @staticmethod
    def part(module, inputs, grads):
        B = inputs[0].shape[0]
        geometry = (module.stride, module.padding, module.dilation)
        aT = _cat_positions([_im2col(t, module) for t in inputs], dim=2)
        gT = _cat_positions([t.reshape(B, module.out_channels, -1) for t in grads], dim=2)

        def weight_sum(c: torch.Tensor) -> torch.Tensor:
            # Book-keeping through the convolution's own weight-gradient kernel: Σ_i c_i ∇_W ℓ_i is
            # the batch weight gradient for output gradients c_i g_i (book-keeping, Bu et al. 2023).
            return sum(
                conv2d_weight(x, module.weight.shape, g * c.view(-1, 1, 1, 1), *geometry)
                for x, g in zip(inputs, grads, strict=True)
            )

        return _factored_linear(
            aT,
            gT,
            module.weight.shape if _trainable(module, "weight") else None,
            _trainable(module, "bias"),
            weight_sum,
        )


class _EmbeddingHandler(_Handler):
    """Embedding = a Linear map on one-hot inputs a_t = e_{tok_t}, so a_t·a_s = [tok_t = tok_s] and
    the ghost norm of Li et al. 2021 (arXiv:2110.05679, Sec. 4) becomes
    ‖∇_W ℓ_i‖² = Σ_{t,s: tok_t = tok_s} g_t·g_s (row v of ∇_W ℓ_i is Σ_{t: tok_t = v} g_t)."""

    @staticmethod
    def supports(module):
        return module.max_norm is None and not module.scale_grad_by_freq and not module.sparse

    @staticmethod
    def part(module, inputs, grads):
        B = inputs[0].shape[0]
        V, d = module.weight.shape
        tok = _cat_positions([t.reshape(B, -1) for t in inputs])
        g = _cat_positions([t.reshape(B, -1, d) for t in grads])
        if module.padding_idx is not None:  # the padding row receives no gradient (torch semantics)
            g = g * (tok != module.padding_idx).unsqueeze(-1).to(g.dtype)
        T = tok.shape[1]
        if T * T <= V * d:
            same = (tok.unsqueeze(2) == tok.unsqueeze(1)).to(g.dtype)
            sq = (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
            G = None
        else:  # materialise the (B, V, d) per-example gradients when that is smaller
            G = g.new_zeros(B, V, d).scatter_add_(1, tok.unsqueeze(-1).expand(-1, -1, d), g)
            sq = G.square().sum((1, 2))

        def clipped(c):
            if G is not None:
                return {"weight": _weighted_sum(c, G)}
            w = g.new_zeros(V, d).index_add_(0, tok.reshape(-1), (g * c[:, None, None]).reshape(-1, d))
            return {"weight": w}

        return _LayerPart(sq_norm=sq, clipped=clipped)


def _affine_norm_part(module, normalized: list[torch.Tensor], grads: list[torch.Tensor], reduce_dims) -> _LayerPart:
    # y = x̂ ⊙ γ + β elementwise, so ∇_γ ℓ_i = Σ g ⊙ x̂ and ∇_β ℓ_i = Σ g over the positions that
    # share a parameter; the parameters are small, so per-example gradients are materialised
    # (as Opacus does for its norm layers).
    per: dict[str, torch.Tensor] = {}
    if _trainable(module, "weight"):
        per["weight"] = sum((g * xh).sum(reduce_dims(g)) for g, xh in zip(grads, normalized, strict=True))
    if _trainable(module, "bias"):
        per["bias"] = sum(g.sum(reduce_dims(g)) for g in grads)
    sq = _sq_norms(list(per.values()))
    return _LayerPart(sq_norm=sq, clipped=lambda c: {k: _weighted_sum(c, v) for k, v in per.items()})


class _GroupNormHandler(_Handler):
    @staticmethod
    def part(module, inputs, grads):
        xh = [F.group_norm(t, module.num_groups, eps=module.eps) for t in inputs]
        return _affine_norm_part(module, xh, grads, lambda g: tuple(range(2, g.dim())))


class _LayerNormHandler(_Handler):
    @staticmethod
    def part(module, inputs, grads):
        k = len(module.normalized_shape)
        xh = [F.layer_norm(t, module.normalized_shape, eps=module.eps) for t in inputs]
        return _affine_norm_part(module, xh, grads, lambda g: tuple(range(1, g.dim() - k)))


# Exact types: a subclass may use its parameters outside ``forward`` (e.g. the out_proj of
# nn.MultiheadAttention is a Linear subclass whose weight is used functionally), so it falls back.
HANDLERS: dict[type[nn.Module], type[_Handler]] = {
    nn.Linear: _LinearHandler,
    nn.Conv2d: _Conv2dHandler,
    nn.Embedding: _EmbeddingHandler,
    nn.GroupNorm: _GroupNormHandler,
    nn.LayerNorm: _LayerNormHandler,
}


@dataclass(frozen=True)
class GhostPlan:
    """Which modules get ghost norms (with their trainable parameters' names) and which parameters
    fall back to vmap (by qualified name), with the reason for each fallback."""

    modules: tuple[tuple[nn.Module, tuple[str, ...]], ...]
    fallback: tuple[str, ...]
    reasons: tuple[str, ...]


def ghost_plan(model: nn.Module) -> GhostPlan:
    """Split the trainable parameters into ghost-supported modules and vmap fallbacks."""
    owners: dict[int, int] = {}
    for _, m in model.named_modules():
        for _, p in m.named_parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    inplace = [n for n, m in model.named_modules() if getattr(m, "inplace", False)]
    modules, fallback_ids, reasons = [], set(), []
    for mname, m in model.named_modules():
        own = [n for n, p in m.named_parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        handler = HANDLERS.get(type(m))
        why = None
        if handler is None:
            why = f"{type(m).__name__} has no ghost-norm rule"
        elif not handler.supports(m):
            why = f"{type(m).__name__} with these options has no ghost-norm rule"
        elif any(owners[id(getattr(m, n))] > 1 for n in own):
            why = "its parameters are shared with another module"
        elif inplace:
            # An in-place op after a hooked module would overwrite the output whose gradient we read.
            why = f"the model has in-place modules ({', '.join(inplace)})"
        if why is None:
            modules.append((m, tuple(own)))
        else:
            fallback_ids |= {id(getattr(m, n)) for n in own}
            reasons.append(f"{mname or '(root)'}: {why}")
    # Canonical names (model.named_parameters() lists a shared parameter once, under its first name).
    fallback = tuple(n for n, p in model.named_parameters() if id(p) in fallback_ids)
    return GhostPlan(modules=tuple(modules), fallback=fallback, reasons=tuple(reasons))


class GhostClipper(Clipper):
    """Ghost norms + book-keeping clipped sums; unsupported parameters via vmap (norms combined).

    Cost: one forward and one backward pass that computes output gradients only (no parameter
    gradients), plus per supported layer a norm computation and one matmul for the clipped sum.
    """

    method = "ghost"
    SELF_CHECK_EXAMPLES = 4

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.plan = ghost_plan(model)
        self._checked = False
        index = {id(p): k for k, p in enumerate(self.params)}
        named = dict(model.named_parameters())
        self._fallback_index = [index[id(named[n])] for n in self.plan.fallback]
        self._module_index = [[index[id(getattr(m, n))] for n in names] for m, names in self.plan.modules]

    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        if not self._checked:
            self._self_check(x[: self.SELF_CHECK_EXAMPLES], y[: self.SELF_CHECK_EXAMPLES])
            self._checked = True
        return self._clip(x, y, clip)

    def _norm_parts(self, x: torch.Tensor, y: torch.Tensor):
        records: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in self.plan.modules]

        def recorder(store):
            def hook(module, args, kwargs, output):
                if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad:
                    store.append((args[0] if args else kwargs["input"], output))

            return hook

        handles = [
            m.register_forward_hook(recorder(store), with_kwargs=True)
            for (m, _), store in zip(self.plan.modules, records, strict=True)
        ]
        try:
            loss = _per_example_loss_sum(self.model, x, y)
        finally:
            for h in handles:
                h.remove()
        outs = [o for store in records for _, o in store]
        # Gradients w.r.t. the layer outputs only: autograd then skips the parameter-gradient
        # matmuls (book-keeping needs a and g, never ∇θ of the batch; Bu et al. 2023).
        g_outs = list(torch.autograd.grad(loss, outs, allow_unused=True)) if outs else []
        parts: list[_LayerPart | None] = []
        k = 0
        for (m, _), store in zip(self.plan.modules, records, strict=True):
            gs = [
                torch.zeros_like(o) if g is None else g
                for (_, o), g in zip(store, g_outs[k : k + len(store)], strict=True)
            ]
            k += len(store)
            parts.append(HANDLERS[type(m)].part(m, [a.detach() for a, _ in store], gs) if store else None)
        fb = _per_example_grads(self.model, self.plan.fallback, x, y) if self.plan.fallback else []
        sq = None
        for term in [p.sq_norm for p in parts if p is not None] + ([_sq_norms(fb)] if fb else []):
            sq = term if sq is None else sq + term
        if sq is None:  # no supported module was called: every gradient is zero
            sq = torch.zeros(x.shape[0], dtype=self.params[0].dtype, device=self.params[0].device)
        # Σ_{t,s}(a_t·a_s)(g_t·g_s) is ≥ 0 exactly but may round below 0: clamp before the sqrt.
        return parts, fb, torch.clamp(sq, min=0.0).sqrt_()

    def _clip(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        parts, fb, norms = self._norm_parts(x, y)
        c = clip_factors(norms, clip)
        grads: list[torch.Tensor | None] = [None] * len(self.params)
        for (_, names), idx, part in zip(self.plan.modules, self._module_index, parts, strict=True):
            sums = part.clipped(c) if part is not None else {}
            for n, i in zip(names, idx, strict=True):
                grads[i] = sums.get(n)
        for i, g in zip(self._fallback_index, fb, strict=True):
            grads[i] = _weighted_sum(c, g)
        out = tuple(torch.zeros_like(p) if g is None else g for p, g in zip(self.params, grads, strict=True))
        return ClippedGradients(grads=out, norms=norms)

    def _self_check(self, x: torch.Tensor, y: torch.Tensor) -> None:
        # A parameter used outside its module's forward, or an output changed in place, would make
        # the hooks see the wrong thing and clipping silently wrong: compare with vmap once. In eval
        # mode, so that dropout draws cannot make the two differ.
        was_training = self.model.training
        self.model.eval()
        try:
            ghost = self._norm_parts(x, y)[2]
            names = [n for n, p in self.model.named_parameters() if p.requires_grad]
            ref = torch.sqrt(_sq_norms(_per_example_grads(self.model, names, x, y)))
        finally:
            self.model.train(was_training)
        tol = 1e-3 if ref.dtype in (torch.float16, torch.bfloat16, torch.float32) else 1e-8
        if not torch.allclose(ghost, ref, rtol=tol, atol=tol * float(ref.max().clamp(min=1e-30))):
            raise GhostMismatchError(
                "ghost clipping disagrees with per-example gradients for this model (a parameter is used "
                "outside its module's forward, or a layer output is changed in place); use --clipping vmap"
            )


# ---------------------------------------------------------------------------------------- factory


class AutoClipper(GhostClipper):
    """``auto``: ghost clipping, switching to vmap for good if the first-call self-check finds
    that the hooks cannot see how this model uses its parameters."""

    method = "auto"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._vmap: VmapClipper | None = None

    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        if self._vmap is None:
            try:
                return super()._compute(x, y, clip)
            except GhostMismatchError:
                self._vmap = VmapClipper(self.model)
        return self._vmap._compute(x, y, clip)


_CLIPPERS: dict[str, type[Clipper]] = {"loop": LoopClipper, "vmap": VmapClipper, "ghost": GhostClipper}


def resolve_method(model: nn.Module, method: str = "auto") -> str:
    """The concrete method for ``method``: ``auto`` is ``ghost`` when every trainable parameter
    belongs to a module with a ghost-norm rule, else ``vmap``."""
    check_choice(CLIPPING, clipping=method)
    if method != "auto":
        return method
    return "ghost" if not ghost_plan(model).fallback else "vmap"


def make_clipper(model: nn.Module, method: str = "auto") -> Clipper:
    """A :class:`Clipper` for ``model`` by name: ``auto | ghost | vmap | loop``.

    ``auto`` is ghost clipping when every trainable parameter belongs to a supported module (and
    the first call's self-check passes; otherwise it switches to vmap), else vmap.
    Raises :class:`~dpaudit.errors.InputError` for BatchNorm models (BatchNorm mixes examples, so
    per-example clipping no longer bounds one example's influence; use GroupNorm/LayerNorm).
    """
    resolved = resolve_method(model, method)
    if method == "auto" and resolved == "ghost":
        return AutoClipper(model)
    return _CLIPPERS[resolved](model)


def clipped_gradient_sum(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, *, method: str = "auto"
) -> ClippedGradients:
    """One-shot convenience: ``make_clipper(model, method)(x, y, clip)``."""
    return make_clipper(model, method)(x, y, clip)
