"""Opacus adapter: gradient canaries inside an unchanged Opacus training loop.

``optimizer = canaries.attach(optimizer)`` on the ``DPOptimizer`` that ``PrivacyEngine.make_private``
returns. Opacus' ``DPOptimizer.pre_step`` runs ``clip_and_accumulate()`` (the clipped per-example
gradients summed into ``p.summed_grad``), then ``add_noise()`` (``p.grad = p.summed_grad + N(0, σ²C²)``),
then ``scale_grad()`` (division by the expected batch size). The adapter wraps the instance's public
``add_noise`` method: before it, the canaries are added to ``p.summed_grad`` in place
(:meth:`GradientCanaries.inject`); after it, ``p.grad`` — the noisy sum, not yet divided — is observed
(:meth:`GradientCanaries.observe`). A step Opacus skips (gradient accumulation, ``signal_skip_step``)
never reaches ``add_noise`` and so is not a step here either; accumulated micro-batches are one
step, as in Opacus' accounting. No private attribute is written: ``params``, ``summed_grad``,
``grad``, ``max_grad_norm`` and ``add_noise`` are the documented interface of ``DPOptimizer``; the
per-example gradients (``grad_sample``) and ghost clipping's per-example norms (each parameter's
``_norm_sample``) are only read, for their dtype.

Tested with Opacus 1.6.0 (``DPOptimizer``, Poisson sampling, one process). Per-layer, adaptive-clip,
distributed and FSDP optimizers (``DPPerLayerOptimizer``, ``AdaClipDPOptimizer``, ``DistributedDPOptimizer``,
...) clip or noise differently and are refused with one line, and so is a step whose per-example gradients are
bfloat16/float16 (a forward under ``torch.autocast``: Opacus clips them by norms in that dtype).
``DPOptimizerFastGradientClipping`` (Opacus' ghost clipping, ``make_private(..., criterion=...,
grad_sample_mode="ghost")``) has the same ``summed_grad``/``add_noise`` interface and is tested too (a correct
loop and σ/√2 noise, ``tests/examples/test_hooks_examples.py``); under autocast it is refused alike (its
per-example norms are then bfloat16).
"""

from __future__ import annotations

import math
from typing import Any

from dpaudit.errors import InputError
from dpaudit.hooks.core import FULL_PRECISION, SIGMA_MAX, SIGMA_MIN, canonical_name

WRAPPED = "_dpaudit_canaries"  # the attribute marking an optimizer that already carries canaries


def _unsupported(optimizer: Any) -> str | None:
    """Why the canaries cannot be carried by this kind of DPOptimizer, or None (by class name along the MRO, so
    subclasses and classes Opacus does not export are covered too)."""
    reasons = {
        "DPPerLayerOptimizer": "per-layer clipping bounds each layer at its own norm, so a canary of norm C on one "
        "coordinate is no record the claim covers",
        "DistributedPerLayerOptimizer": "per-layer clipping across processes",
        "AdaClipDPOptimizer": "the clip norm adapts during training, a canary's is fixed",
        "DistributedDPOptimizer": "several processes add the noise (only one process is covered)",
        "DistributedDPOptimizerFastGradientClipping": "several processes add the noise (only one process is covered)",
        "FSDPOptimizerFastGradientClipping": "sharded parameters (only one process is covered)",
    }
    for cls in type(optimizer).__mro__:
        if cls.__name__ in reasons and cls.__module__.startswith("opacus"):
            return reasons[cls.__name__]
    return None


def _frozen_hint(names: list[str], *, after: bool = False) -> str:
    """One line on parameters the optimizer does not train (frozen: ``requires_grad=False``)."""
    shown = ", ".join(repr(n) for n in names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    if after:
        return (
            f"{shown} (requires_grad switched off after attach()): the canaries follow the parameters they were "
            "attached with, so freeze layers before make_private and attach()"
        )
    return (
        f"{shown}, which the optimizer does not train (requires_grad=False, or left out of its param groups): "
        "give param_shapes the trained parameters only ({n: p.shape for n, p in model.named_parameters() if "
        "p.requires_grad}, less any the optimizer is not given)"
    )


def _low_precision(grad_sample: Any) -> str | None:
    """The dtype of Opacus' per-example gradients (a tensor, or a list of them over accumulated batches) when it is
    not float32/float64, else None."""
    parts = [] if grad_sample is None else grad_sample if isinstance(grad_sample, list | tuple) else [grad_sample]
    return next((k for k in (str(g.dtype).removeprefix("torch.") for g in parts) if k not in FULL_PRECISION), None)


def attach(canaries, optimizer: Any, *, module: Any = None) -> Any:
    """Wrap ``optimizer.add_noise`` so every noisy step carries ``canaries``; returns the optimizer.

    The optimizer's parameters are matched to ``canaries.param_shapes`` by name when ``module`` (the
    model, Opacus' ``GradSampleModule`` or the original) is given, else by position (the order of
    ``named_parameters``, which is the optimizer's unless its parameter groups were reordered); the
    shapes must agree either way. The canaries' clip is the optimizer's ``max_grad_norm``; one set to another value is
    refused (a canary must be exactly a record: above the clip it is not covered by the claim, below it the audit
    and the noise check test less than the claim).
    """
    try:
        from opacus.optimizers import DPOptimizer
    except ImportError:
        raise InputError("the Opacus adapter needs Opacus: pip install opacus (or dpaudit[peers])") from None
    if not isinstance(optimizer, DPOptimizer):
        raise InputError(
            f"attach() needs an Opacus DPOptimizer (from PrivacyEngine.make_private), got {type(optimizer).__name__}"
        )
    unsupported = _unsupported(optimizer)
    if unsupported is not None:
        raise InputError(
            f"attach() does not support Opacus' {type(optimizer).__name__}: {unsupported} (use a plain DPOptimizer, "
            "one process, one clip for the whole model)"
        )
    if getattr(optimizer, WRAPPED, None) is not None:
        raise InputError("this optimizer already carries gradient canaries")
    params = list(optimizer.params)
    if module is not None:
        by_id = {id(p): n for n, p in module.named_parameters()}
        missing = [i for i, p in enumerate(params) if id(p) not in by_id]
        if missing:
            raise InputError("the optimizer updates parameters the module does not have: pass the model it trains")
        names = [by_id[id(p)] for p in params]
        shapes = {n: tuple(p.shape) for n, p in zip(names, params, strict=True)}
        if {canonical_name(n) for n in names} != set(canaries.names_):
            held = {canonical_name(n) for n, _ in module.named_parameters()}
            untrained = sorted(set(canaries.names_) - {canonical_name(n) for n in names})
            if untrained and set(untrained) <= held:  # the module's own, frozen or not given to the optimizer
                raise InputError(f"the canaries include {_frozen_hint(untrained)}")
            raise InputError("the canaries were designed for another model (parameter names differ)")
    else:
        names = None
        shapes = [tuple(p.shape) for p in params]
    expected = [canaries.param_shapes[n] for n in canaries.names_]
    if names is None and shapes != expected:
        # matched by position: param groups in another order than named_parameters() differ here too
        hint = " (matched by position: pass module=model to match by name)"
        if len(shapes) < len(expected):  # e.g. param_shapes from every named parameter, frozen ones included
            hint = (
                f" ({len(expected) - len(shapes)} more parameters than the optimizer trains: if some are frozen, "
                "leave them out of param_shapes ({n: p.shape for n, p in model.named_parameters() if p.requires_grad})"
                ", or pass module=model to match by name)"
            )
        raise InputError(
            f"the canaries were designed for another model: the optimizer's parameter shapes {shapes[:4]} "
            f"differ from {expected[:4]}{hint}"
        )
    if names is not None:
        if any(shapes[n] != canaries.param_shapes[canonical_name(n)] for n in names):
            raise InputError("the canaries were designed for another model (parameter shapes differ)")
    low = next((p for p in params if str(p.dtype).removeprefix("torch.") not in FULL_PRECISION), None)
    if low is not None:  # refused here, before training, not by inject at the first step
        raise InputError(
            f"the model's parameters are {str(low.dtype).removeprefix('torch.')}: Opacus sums the clipped gradients in "
            "the parameters' dtype, where a canary C is not added exactly (rounded to 0 or 2C in bfloat16/float16); "
            "train the model in float32 or float64 to carry gradient canaries"
        )
    if canaries.clip is None:
        canaries.clip = float(optimizer.max_grad_norm)
    elif not math.isclose(canaries.clip, float(optimizer.max_grad_norm), rel_tol=1e-9):
        # A canary of norm above the records' clip is no record the claim covers (the one-run audit could then
        # "refute" a correct claim); below it, the canaries and the noise check (σ·clip) test less than the claim.
        raise InputError(
            f"the canaries' clip {canaries.clip:g} differs from the optimizer's max_grad_norm "
            f"{float(optimizer.max_grad_norm):g}: give clip=None (or the same value) so a canary is exactly a record"
        )
    canaries.meta.setdefault("framework", "opacus")
    canaries.meta.setdefault("implementation_noise_multiplier", float(optimizer.noise_multiplier))
    canaries.meta.setdefault("implementation_max_grad_norm", float(optimizer.max_grad_norm))
    original = optimizer.add_noise

    def _grads(attr: str):
        values = [getattr(p, attr) for p in params]
        return dict(zip(names, values, strict=True)) if names is not None else values

    attached = [id(p) for p in params]

    def add_noise() -> None:
        step = canaries.steps_
        # A parameter frozen after attach (requires_grad switched off: Opacus' ``params`` then leaves it out) keeps a
        # stale summed_grad and gets no noise; reading it anyway scored its zeroed grad minus that stale sum as the
        # noise, and a correct loop read "violation" (measured: estimated std 0.6·σC on the frozen layer).
        trained = {id(p) for p in optimizer.params}
        if any(i not in trained for i in attached):
            named = canaries.names_ if names is None else [canonical_name(n) for n in names]  # names: params' order
            gone = [n for n, i in zip(named, attached, strict=True) if i not in trained]
            raise InputError(f"step {step}: the optimizer no longer trains {_frozen_hint(gone, after=True)}")
        if not math.isclose(canaries.clip, float(optimizer.max_grad_norm), rel_tol=1e-9):
            # A clip schedule (opacus.schedulers.StepGradClip...) moved the records' clip away from the canaries': with
            # max_grad_norm 1 -> 0.24 the noise σ·C_t read as too little for σ·C_0, a correct loop as "violation".
            raise InputError(
                f"step {step}: the optimizer's max_grad_norm is now {float(optimizer.max_grad_norm):g}, the canaries' "
                f"clip {canaries.clip:g} (a clip schedule?): a canary must be exactly a record at every step, so train "
                "with a fixed max_grad_norm to carry gradient canaries"
            )
        # Under torch.autocast Opacus' per-example gradients are bfloat16/float16 and their norms are computed in that
        # dtype (clip_and_accumulate casts them up only after): a clipped contribution exceeded max_grad_norm (measured
        # on CPU, a 10-256-2 MLP, C = 0.1, 4 seeds: 1.0064–1.0096·C in bfloat16, 1.0009–1.0012·C in float16;
        # benchmarks/hook_loops.py --only autocast), while the canaries are exactly C, so the audit read "consistent"
        # of a run whose records the claim's C does not bound.
        # Ghost clipping (DPOptimizerFastGradientClipping) keeps no grad_sample; its per-example norms are each
        # parameter's ``_norm_sample`` (Opacus' GradSampleModuleFastGradientClipping.get_norm_sample stacks them), in
        # bfloat16 under autocast, and its second backward scales a bfloat16 graph: a record's clipped gradient
        # reached 1.0055–1.0101·C (same MLP, C = 0.1, 4 seeds, a record at a time) and was accepted, as above.
        kind = next(
            (
                k
                for p in params
                for k in (_low_precision(getattr(p, a, None)) for a in ("grad_sample", "_norm_sample"))
                if k
            ),
            None,
        )
        if kind is not None:
            raise InputError(
                f"step {step}: Opacus computed the per-example gradients or their norms in {kind} (a forward under "
                f"torch.autocast?) and clips by norms computed in {kind}, so a clipped record can exceed max_grad_norm "
                "(measured: up to 1.0096·C in bfloat16, 1.0101·C with ghost clipping, 1.0012·C in float16) while a "
                "canary is exactly C; run the forward in float32 (no autocast) to carry gradient canaries"
            )
        # A noise schedule (opacus.schedulers.ExponentialNoise...) changes σ between steps: its range is kept, so the
        # audit can refuse a --noise-multiplier above the smallest σ the run used (the noise check tests one σ).
        sigma = float(optimizer.noise_multiplier)
        canaries.meta[SIGMA_MIN] = min(sigma, canaries.meta.get(SIGMA_MIN, sigma))
        canaries.meta[SIGMA_MAX] = max(sigma, canaries.meta.get(SIGMA_MAX, sigma))
        injected = canaries.inject(step, _grads("summed_grad"))
        for i, p in enumerate(params):
            new = injected[names[i]] if names is not None else injected[i]
            p.summed_grad.copy_(new)  # in place: Opacus' bookkeeping flags on the tensor stay as they were
        original()
        canaries.observe(step, _grads("grad"))

    optimizer.add_noise = add_noise
    setattr(optimizer, WRAPPED, canaries)
    return optimizer
