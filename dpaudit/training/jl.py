"""DP-SGD-JL and DP-Adam-JL: per-example gradient norms *estimated* with JL projections.

Bu et al., "Fast and Memory Efficient Differentially Private-SGD via JL Projections" (2021,
arXiv:2102.03013), Algorithms 1 (DP-SGD-JL) and 3 (DP-Adam-JL). One step on a batch of B records:

1. draw v_1 … v_r ~ N(0, I_d) (d = number of trainable parameters) from a seeded generator;
2. P_ij = ⟨∇ℓ(θ; x_i), v_j⟩ for the whole batch at once, one forward-mode Jacobian-vector product
   of the vector of per-example losses F(θ) = (ℓ(θ; x_1), …, ℓ(θ; x_B)) per direction
   (``torch.func.jvp`` over a functional call of the model; ibid. §2.1, Alg. 1 "using jvp");
3. M_i = sqrt((1/r) Σ_j P_ij²), the JL estimate of ‖∇ℓ(θ; x_i)‖ (ibid. Prop. 2.1: M_i has the law of
   ‖g_i‖·sqrt(χ²_r / r));
4. w_i = min(1, C / M_i) and one ordinary backward pass of Σ_i w_i ℓ(θ; x_i) (ibid. Alg. 1, L̃);
5. the trainer of :mod:`dpaudit.training.dpsgd` then adds N(0, σ²C²I) and divides by the expected B.

Because w_i is computed from an estimate, ‖w_i g_i‖ = C·‖g_i‖/M_i can exceed C without bound; the
privacy of a step is therefore *not* that of DP-SGD's Gaussian mechanism but
f = T(Z_r, N(Z_r/σ, 1) ‖ Z_r, N(0, 1)), Z_r = 1/sqrt(χ²_r/r) (ibid. Lemma 4.3, Thm 4.1), the
:class:`~dpaudit.events.JLGaussian` event, accounted with PLD. :mod:`dpaudit.workflows.jl_audit`
shows empirically that a claim made with the plain DP-SGD formula is violated at r = 1.

Where a layer has no forward-mode derivative (PyTorch's fused ``nn.LSTM`` on CPU), the products are
computed by the "double-vjp trick" (ibid. §2.1): with u ∈ R^B a dummy cotangent,
G(u) = uᵀ∇_θF is linear in u, and the vjp of G with cotangent v is (∇_θF)·v. The path that ran is
recorded in the checkpoint's claim (``jl.ad_path``) and logged. Attention (``F.scaled_dot_product_attention``,
``nn.MultiheadAttention``) runs on its math kernel throughout a step: the fused kernels have neither
derivative.

Assumptions: the loss of record i depends on record i only (no BatchNorm), and the forward pass is
deterministic in training mode (no dropout): the estimate and the clipped backward pass must see the
same per-example gradient, which two independent dropout masks would not give (refused).
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import jvp, vmap
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel  # torch >= 2.3 (the floor is 2.4)

from dpaudit.errors import InputError
from dpaudit.training.clipping import (
    ClippedGradients,
    Clipper,
    clip_factors,
    hooked_parameters,
    reparametrized_call,
    tied_paths,
)
from dpaudit.training.dpsgd import DPTrainer, noise_generator
from dpaudit.validation import check_positive_int

log = logging.getLogger(__name__)

AD_PATHS = ("auto", "jvp", "double-vjp")
JVP_CHUNK = 32  # directions per vmapped jvp (memory grows with it: one activation copy per direction)
Directions = Sequence[dict[str, torch.Tensor]]


def trainable_names(model: nn.Module) -> list[str]:
    """Names of the trainable parameters, in ``named_parameters`` order (the order of directions)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def random_directions(model: nn.Module, r: int, generator: torch.Generator) -> list[dict[str, torch.Tensor]]:
    """r independent v_j ~ N(0, I_d) over the trainable parameters (Bu et al. 2021, Alg. 1), each a
    dict {name: tensor shaped like the parameter}; one randn call per direction, split into views."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    sizes = [p.numel() for _, p in named]
    p0 = named[0][1]
    out = []
    for _ in range(check_positive_int(jl_projections=r)):
        flat = torch.randn(sum(sizes), generator=generator, device=p0.device, dtype=p0.dtype)
        out.append({n: z.view_as(p) for (n, p), z in zip(named, flat.split(sizes), strict=True)})
    return out


def refuse_nondeterministic(model: nn.Module) -> None:
    """Dropout in training mode draws a fresh mask per forward pass, so the JL estimate would be of a
    different gradient than the one clipped: refused, naming the layer."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0:
            raise InputError(
                f"layer {name or '(root)'} ({type(m).__name__}) is random in training mode; DP-SGD-JL needs the "
                "same forward pass for the norm estimate and the clipped gradient (remove dropout)"
            )


def refuse_random_forward(model: nn.Module, x: torch.Tensor) -> None:
    """The dynamic twin of :func:`refuse_nondeterministic`: randomness inside a forward pass that is not a
    dropout module (``F.dropout``, ``scaled_dot_product_attention(dropout_p=...)``, noise of the user's own)
    would let the norm estimate and the clipped gradient see different functions (with one direction, the
    jvp re-runs the forward with fresh masks): M_i would then bound another gradient than the one weighted,
    and ‖w_i g_i‖ ≤ C·Z_r, on which the claim rests, would not hold. Two forward passes of one record
    under different seeds must agree to 1e-5 (the random state is left as it was)."""
    one = x[:1]
    with torch.no_grad(), torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
        torch.manual_seed(0)
        a = model(one)
        torch.manual_seed(1)
        b = model(one)
    # Close, not equal: GPU kernels may sum in a run-dependent order (last bits); a dropout mask or a noise draw
    # moves outputs far more than 1e-5 relative.
    if not torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(a.abs().max())):
        raise InputError(
            "the model's forward pass is random in training mode (F.dropout, attention dropout_p, noise); "
            "DP-SGD-JL needs the same forward pass for the norm estimate and the clipped gradient (remove it)"
        )


class _LayerTracker:
    """Forward hooks that remember which leaf module was running when an exception escaped, so that a
    missing derivative can be reported by layer name."""

    def __init__(self, model: nn.Module) -> None:
        self.stack: list[str] = []
        self.culprit: str | None = None
        self._handles = []
        for name, m in model.named_modules():
            if next(m.children(), None) is None:
                self._handles.append(
                    m.register_forward_pre_hook(self._enter(f"{name or '(root)'} ({type(m).__name__})"))
                )
                self._handles.append(m.register_forward_hook(self._leave))

    def _enter(self, label: str):
        def hook(module, args) -> None:
            self.stack.append(label)

        return hook

    def _leave(self, module, args, output) -> None:
        if self.stack:
            self.stack.pop()

    def __enter__(self) -> _LayerTracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and self.stack:
            self.culprit = self.stack[-1]
        for h in self._handles:
            h.remove()


def _losses(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # The vector F(θ) of per-example losses (Bu et al. 2021, Alg. 1), cross-entropy as in clipping.py.
    return F.cross_entropy(out, y, reduction="none")


def _projections_jvp(
    model: nn.Module, names: list[str], x: torch.Tensor, y: torch.Tensor, directions: Directions
) -> torch.Tensor:
    """(B, r) matrix P_ij = ⟨∇ℓ_i, v_j⟩ by one forward-mode jvp of F per direction (Alg. 1).

    Refuses parameters with a gradient hook of their own: torch.func's jvp never runs it, while the
    clipped sum's backward pass does (see :func:`resolve_ad_path`)."""
    named = dict(model.named_parameters())
    hooked = hooked_parameters(model, [named[n] for n in names])
    if hooked:
        raise InputError(
            f"DP-SGD-JL's jvp path cannot run the gradient hooks on {', '.join(hooked)} (Tensor.register_hook: "
            "torch.func's jvp skips them, the clipped sum does not); use the double-vjp path"
        )
    fixed = {n: p.detach() for n, p in model.named_parameters()}
    diff = {n: fixed.pop(n) for n in names}
    fixed.update(model.named_buffers())
    tied = tied_paths(model)  # (not functional_call's tie_weights: see reparametrized_call)

    def losses(d: dict[str, torch.Tensor]) -> torch.Tensor:
        return _losses(reparametrized_call(model, {**fixed, **d}, tied, (x,)), y)

    def project(tangents: dict[str, torch.Tensor]) -> torch.Tensor:
        return jvp(losses, (diff,), (tangents,))[1]

    cols = []
    with torch.no_grad():
        # Directions in chunks of JVP_CHUNK through vmap (one batched forward-mode pass per chunk
        # instead of one per direction: far fewer kernel launches for small layers).
        for start in range(0, len(directions), JVP_CHUNK):
            chunk = directions[start : start + JVP_CHUNK]
            if len(chunk) == 1:
                cols.append(project({n: chunk[0][n] for n in names}).unsqueeze(0))
            else:
                stacked = {n: torch.stack([v[n] for v in chunk]) for n in names}
                cols.append(vmap(project, randomness="error")(stacked))
    return torch.cat(cols, 0).T


class _CutGradient(RuntimeError):
    """A parameter's gradient that the double-vjp trick cannot differentiate again (see _projections_double_vjp)."""


def _projections_double_vjp(
    params: list[torch.Tensor], losses: torch.Tensor, names: list[str], directions: Directions, *, check: bool = False
) -> torch.Tensor:
    """(B, r) matrix P by the double-vjp trick (Bu et al. 2021, §2.1): G(u) = uᵀ∇_θF is linear in
    u ∈ R^B, and the vjp of G with cotangent v_j is (∇_θF)·v_j. ``losses`` keeps its graph.

    ``check`` (the probe of :func:`resolve_ad_path`): refuse parameters whose gradient is cut from u. A
    custom autograd.Function whose backward is ``once_differentiable`` (or detaches) gives the parameters
    before it a gradient with no path back to u, so their projections came out 0 without an error: the
    norm estimates left them out (measured: Linear, such an op, Linear; projections off by 1.49 of 5.36),
    so the clip factors computed from them did not bound the contributions by C."""
    u = torch.zeros_like(losses, requires_grad=True)
    g = torch.autograd.grad(losses, params, grad_outputs=u, create_graph=True, allow_unused=True)
    used = [k for k, gk in enumerate(g) if gk is not None and gk.requires_grad]
    if check:
        cut = [names[k] for k, gk in enumerate(g) if gk is not None and not gk.requires_grad]
        cut += [
            names[k]
            for k in used
            if torch.autograd.grad(g[k], u, torch.ones_like(g[k]), retain_graph=True, allow_unused=True)[0] is None
        ]
        if cut:
            raise _CutGradient(
                f"the gradients of {', '.join(cut)} cannot be differentiated again (a custom autograd.Function "
                "whose backward is once_differentiable or detaches?)"
            )
    if not used:  # F does not depend on θ: every projection is 0
        return losses.new_zeros(losses.shape[0], len(directions))
    outs = [g[k] for k in used]
    cols = []
    for start in range(0, len(directions), JVP_CHUNK):
        chunk = directions[start : start + JVP_CHUNK]
        if len(chunk) == 1:
            cols.append(torch.autograd.grad(outs, u, [chunk[0][names[k]] for k in used], retain_graph=True)[0][None])
        else:  # the chunk's vjps in one batched backward pass (vmap over the cotangents)
            stacked = [torch.stack([v[names[k]] for v in chunk]) for k in used]
            cols.append(torch.autograd.grad(outs, u, stacked, retain_graph=True, is_grads_batched=True)[0])
    return torch.cat(cols, 0).T.detach()


def _norm_estimates(P: torch.Tensor) -> torch.Tensor:
    # M_i = sqrt((1/r) Σ_j P_ij²)  (Bu et al. 2021, arXiv:2102.03013, Alg. 1 and Prop. 2.1).
    return P.square().mean(1).sqrt()


def _check_directions(names: list[str], model: nn.Module, directions: Directions) -> None:
    if len(directions) < 1:
        raise InputError("expected at least one JL direction (jl_projections >= 1)")
    shapes = {n: p.shape for n, p in model.named_parameters()}
    for j, v in enumerate(directions):
        if set(v) != set(names):
            raise InputError(f"direction {j} must have exactly the trainable parameters {names}, got {sorted(v)}")
        for n in names:
            if v[n].shape != shapes[n]:
                raise InputError(f"direction {j}[{n!r}] has shape {list(v[n].shape)}, expected {list(shapes[n])}")


def _math_attention(fn):
    """Run ``fn`` with ``F.scaled_dot_product_attention`` (and so ``nn.MultiheadAttention``) on its math
    kernel, which is built from differentiable primitives: the fused kernels (flash, memory-efficient) have
    neither a forward-mode derivative nor a double backward (PyTorch 2.13, CPU), and the JL projections
    need one of them. The math kernel computes the same softmax(QKᵀ/√d)V (Vaswani et al. 2017, Eq. 1); the
    forward, the projections and the clipped backward of a step all run on it, so they see one function."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with sdpa_kernel(SDPBackend.MATH):
            return fn(*args, **kwargs)

    return wrapped


@_math_attention
def _step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    clip: float,
    directions: Directions,
    ad_path: str,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Σ_i min(1, C/M_i) ∇ℓ_i (one tensor per trainable parameter) and the estimates M_i."""
    names = trainable_names(model)
    named = dict(model.named_parameters())
    params = [named[n] for n in names]
    with torch.enable_grad():
        out = model(x)
        losses = _losses(out, y)
        if ad_path == "jvp":
            P = _projections_jvp(model, names, x, y, directions)
        else:
            P = _projections_double_vjp(params, losses, names, directions)
        M = _norm_estimates(P)
        w = clip_factors(M, clip)  # 1/max(1, M_i/C) = min(1, C/M_i), no 0/0 when M_i = 0
        # One backward pass of Σ_i w_i ℓ_i (Bu et al. 2021, Alg. 1: L̃ without the 1/B, which the
        # trainer applies after the noise). w is a constant here, not differentiated.
        grads = torch.autograd.grad((w.detach() * losses).sum(), params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)], M.detach()


@_math_attention
def resolve_ad_path(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ad_path: str = "auto") -> str:
    """The AD path that works for ``model``: ``jvp`` when every layer has a forward-mode derivative
    and no parameter has a gradient hook of its own, else ``double-vjp`` (with a warning when a layer
    has no forward-mode derivative), tried on one example; double-vjp asked for by name is tried there too
    (a gradient it cannot differentiate again gives zeros, not an error). Raises InputError naming the
    layer when neither works."""
    if ad_path not in AD_PATHS:
        raise InputError(f"expected ad_path in {AD_PATHS}, got {ad_path!r}")
    names = trainable_names(model)
    named = dict(model.named_parameters())
    # A parameter's own gradient hook (Tensor.register_hook) runs in the backward passes (the clipped sum,
    # the double-vjp projections) but not in torch.func's jvp: with jvp the norm estimates would be those
    # of the unhooked gradients while the clipped sum has the hooked ones (measured: a hook scaling a
    # weight's gradient by 5 gave estimates at 0.30-0.35 of the norms summed, so contributions above C).
    # (_projections_jvp refuses them when the jvp path is asked for by name.)
    hooked = hooked_parameters(model, [named[n] for n in names])
    if ad_path == "jvp":  # by name: _projections_jvp refuses hooked parameters, and a missing derivative is an error
        return ad_path
    probe = random_directions(model, 1, torch.Generator(device=x.device).manual_seed(0))
    errors = {}
    # double-vjp by name is probed too: a gradient it cannot differentiate again gives no error, only zeros
    for path in ("double-vjp",) if hooked or ad_path == "double-vjp" else ("jvp", "double-vjp"):
        tracker = _LayerTracker(model)
        try:
            with tracker:
                if path == "jvp":
                    _projections_jvp(model, names, x[:1], y[:1], probe)
                else:
                    with torch.enable_grad():
                        losses = _losses(model(x[:1]), y[:1])
                        _projections_double_vjp([named[n] for n in names], losses, names, probe, check=True)
        except _CutGradient as e:
            errors[path] = ("(one between those parameters and the loss)", str(e))
            continue
        except (RuntimeError, NotImplementedError) as e:
            errors[path] = (tracker.culprit or "an operation outside any layer", str(e).splitlines()[0])
            continue
        if path == "double-vjp" and "jvp" in errors:
            layer, why = errors["jvp"]
            warnings.warn(
                f"layer {layer} has no forward-mode derivative ({why}); JL projections use the slower double-vjp trick",
                UserWarning,
                stacklevel=3,
            )
        log.info("DP-SGD-JL projections via %s", path)
        return path
    if "jvp" not in errors:  # jvp ruled out by hooks, or double-vjp asked for by name
        layer, why = errors["double-vjp"]
        reason = (
            f"the gradient hooks on {', '.join(hooked)} rule out the jvp path and" if hooked else "with double-vjp,"
        )
        raise InputError(
            f"DP-SGD-JL cannot differentiate this model: {reason} layer {layer} has no double backward ({why})"
        )
    (l1, w1), (l2, w2) = errors["jvp"], errors["double-vjp"]
    raise InputError(
        f"DP-SGD-JL cannot differentiate this model: layer {l1} has no forward-mode derivative ({w1}) and "
        f"layer {l2} no double backward ({w2})"
    )


@_math_attention
def jl_projection_matrix(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, directions: Directions, *, ad_path: str = "auto"
) -> torch.Tensor:
    """The (B, r) matrix P_ij = ⟨∇ℓ(θ; x_i), v_j⟩ (Bu et al. 2021, arXiv:2102.03013, Alg. 1), by
    forward-mode jvp or, where a layer has none, the double-vjp trick (``ad_path="auto"``).

    ``directions``: r dicts {param_name: tensor shaped like the parameter} over the trainable
    parameters (named_parameters order); ℓ is the cross-entropy of the model's logits.
    """
    names = trainable_names(model)
    _check_directions(names, model, directions)
    path = resolve_ad_path(model, x, y, ad_path)
    if path == "jvp":
        return _projections_jvp(model, names, x, y, directions)
    named = dict(model.named_parameters())
    with torch.enable_grad():
        losses = _losses(model(x), y)
        return _projections_double_vjp([named[n] for n in names], losses, names, directions)


def jl_norm_estimates(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, directions: Directions, *, ad_path: str = "auto"
) -> torch.Tensor:
    """JL estimates M_i = sqrt((1/r) Σ_j ⟨∇ℓ(θ; x_i), v_j⟩²) of the per-example gradient norms, shape (B,).

    With v_j ~ N(0, I_d), M_i ~ ‖g_i‖·sqrt(χ²_r/r) (Bu et al. 2021, arXiv:2102.03013, Prop. 2.1).
    ``directions`` as in :func:`jl_projection_matrix`.
    """
    return _norm_estimates(jl_projection_matrix(model, x, y, directions, ad_path=ad_path))


def jl_clipped_sum(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    clip: float,
    directions: Directions,
    *,
    ad_path: str = "auto",
) -> dict[str, torch.Tensor]:
    """Σ_i min(1, C/M_i) ∇ℓ(θ; x_i) with JL estimates M_i (Bu et al. 2021, Alg. 1, before noise),
    as {param_name: tensor}. ``clip`` may be ``math.inf`` (then exactly the plain gradient sum)."""
    if not clip > 0:
        raise InputError(f"expected clip > 0, got {clip}")
    names = trainable_names(model)
    _check_directions(names, model, directions)
    grads, _ = _step(model, x, y, clip, directions, resolve_ad_path(model, x, y, ad_path))
    return dict(zip(names, grads, strict=True))


class JLClipper(Clipper):
    """The clipped sum of DP-SGD-JL behind the :class:`~dpaudit.training.clipping.Clipper` interface.

    Each call draws r fresh directions from ``generator`` (one call per logical step unless the
    trainer splits the batch into physical chunks; then each chunk gets its own directions, which
    Lemma 4.3 of Bu et al. 2021 covers as well: each record's M_i comes from r directions drawn independently
    of it, and the other chunks' sums are post-processing given the directions).
    ``norms`` of the result are the estimates M_i, not the exact norms. ``ad_path_`` is the AD path
    resolved on the first call.
    """

    method = "jl"

    def __init__(
        self, model: nn.Module, projections: int, generator: torch.Generator, *, ad_path: str = "auto"
    ) -> None:
        super().__init__(model)
        refuse_nondeterministic(model)
        self.projections = check_positive_int(jl_projections=projections)
        d = sum(p.numel() for p in self.params)
        if self.projections > d:
            warnings.warn(
                f"{self.projections} JL projections for {d} parameters: more directions than dimensions "
                "(allowed; exact per-example clipping would be cheaper)",
                UserWarning,
                stacklevel=2,
            )
        if ad_path not in AD_PATHS:
            raise InputError(f"expected ad_path in {AD_PATHS}, got {ad_path!r}")
        self.generator = generator
        self._requested = ad_path
        self.ad_path_: str | None = None  # resolved (double-vjp probed) on the first batch
        self._forward_checked = False  # refuse_random_forward on the first batch

    def _compute(self, x: torch.Tensor, y: torch.Tensor, clip: float) -> ClippedGradients:
        if not self._forward_checked:
            refuse_random_forward(self.model, x)
            self._forward_checked = True
        if self.ad_path_ is None:
            self.ad_path_ = resolve_ad_path(self.model, x, y, self._requested)
        directions = random_directions(self.model, self.projections, self.generator)
        grads, M = _step(self.model, x, y, clip, directions, self.ad_path_)
        return ClippedGradients(grads=tuple(grads), norms=M)


def make_jl_clipper(model: nn.Module, projections: int, seed: int, *, secure: bool = False) -> JLClipper:
    """A JLClipper whose directions come from a CPU/CUDA generator seeded with ``seed``, or, when ``secure``,
    from 64 bits of ``secrets`` (:func:`dpaudit.training.dpsgd.noise_generator`, as the noise)."""
    device = next(p for p in model.parameters() if p.requires_grad).device
    return JLClipper(model, projections, noise_generator(device, seed, secure))


class _JLTrainer(DPTrainer):
    """DP-SGD-JL: :class:`~dpaudit.training.dpsgd.DPTrainer` (sampling, noise, claim) with the
    :class:`JLClipper`. Directions are drawn from ``config.seed + 3``, or unpredictably under ``secure_noise``
    like the noise: the analysis needs them independent of the neighbouring pair, not only of the data (Bu et
    al. 2021, seed paper, proof of Lemma 4.3: ‖g_0‖/M_0 has the law of Z_r over the draw of v_1 … v_r; a
    record chosen knowing the v_j can put its gradient where they barely project, M_0 ≈ 0, weight C/M_0
    unbounded). The JAX backend draws them from a secure key as well."""

    jl = True

    def make_clipper(self, model: nn.Module) -> Clipper:
        dp = self.config.dp
        return make_jl_clipper(model, dp.jl_projections, self.config.seed + 3, secure=dp.secure_noise)


class DPSGDJLTrainer(_JLTrainer):
    """DP-SGD-JL (Bu et al. 2021, arXiv:2102.03013, Alg. 1)."""

    name = "dpsgd-jl"
    optimizer = "sgd"


class DPAdamJLTrainer(_JLTrainer):
    """DP-Adam-JL (Bu et al. 2021, Alg. 3): Adam (β = 0.9, 0.999, ε = 1e-8, torch's bias-corrected
    form) on the privatised gradient, post-processing of DP-SGD-JL's noisy gradient, same claim."""

    name = "dpadam-jl"
    optimizer = "adam"


__all__ = [
    "AD_PATHS",
    "DPAdamJLTrainer",
    "DPSGDJLTrainer",
    "JLClipper",
    "jl_clipped_sum",
    "jl_norm_estimates",
    "jl_projection_matrix",
    "make_jl_clipper",
    "random_directions",
    "resolve_ad_path",
    "trainable_names",
]
