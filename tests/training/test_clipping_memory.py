"""Peak memory of the ghost clipping step (issue 26: ≤ 1.5x non-private peak memory).

What the ghost step must hold beyond non-private SGD is what its clipped sums need (book-keeping:
a layer's inputs and output gradients; instantiation: its per-example gradients B·p; a norm layer:
its small per-example gradients). Everything else a layer's part used, its recorded inputs and
outputs and its output gradient, must go inside the backward pass, once the part is computed
(GhostClipper._norm_parts). These tests catch a regression without timing anything:

* by weak references, that when the backward pass reaches the first layer, the output gradients,
  outputs and inputs of the layers above it whose parts do not keep them are already released;
* by live tensor bytes (every storage an op creates, tracked until it dies: deterministic), that the
  peak of a ghost step stays within the non-private step's peak plus what the parts must keep plus
  one layer's working set, a bound computed from the layer sizes;
* that nothing recorded outlives the clipping call.

The results themselves are pinned against the loop clipper (float64, 1e-6 relative) by
tests/training/test_clipping_architectures.py; here a stack on each side of the cost model and a
GroupNorm CNN are checked the same way, since those are the layers whose release changed.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._pytree import tree_leaves

from dpaudit.training.clipping import GhostClipper, LoopClipper
from tests.benchmark_modules import import_benchmark

RTOL = 1e-6  # float64: the methods differ by rounding only


# The benchmark's tracker (benchmarks/dpsgd_throughput.py --tensor-memory), one implementation.
LiveBytes = import_benchmark("dpsgd_throughput").LiveBytes


class Stack(nn.Module):
    """L Linear(d, d) + tanh layers applied at T positions, mean over positions, linear head."""

    def __init__(self, d: int, L: int, n_classes: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(L))
        self.head = nn.Linear(d, n_classes)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x.mean(1))


class GroupNormCNN(nn.Module):
    """Conv + GroupNorm + ReLU blocks at full resolution (the convolutions on the instantiate side)."""

    def __init__(self, width: int = 4, L: int = 4, n_classes: int = 3) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(3 if i == 0 else width, width, 3, padding=1) for i in range(L))
        self.norms = nn.ModuleList(nn.GroupNorm(2, width) for _ in range(L))
        self.head = nn.Linear(width, n_classes)

    def forward(self, x):
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = F.relu(norm(conv(x)))
        return self.head(x.mean((2, 3)))


class AttentionBlock(nn.Module):
    """nn.MultiheadAttention (packed in-projection; per-example gradients by recomputing the attention)
    between Linear layers, on few positions and a wide embedding: its per-example in-projection
    gradients (B, 3E, E) dwarf the activations, so a transient copy of them shows in the peak."""

    def __init__(self, d: int = 32, n_classes: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x):
        h = self.inp(x)
        return self.head(self.attn(h, h, h, need_weights=False)[0].mean(1))


def _data(model: str, dtype=torch.float64):
    torch.manual_seed(0)
    if model == "attention":
        return AttentionBlock().to(dtype), torch.randn(8, 4, 32, dtype=dtype), torch.randint(0, 3, (8,))
    if model == "instantiate":  # T = 32, d = 8: 2T² = 2048 > p·d = 64, every Linear instantiated
        return Stack(8, 8).to(dtype), torch.randn(8, 32, 8, dtype=dtype), torch.randint(0, 3, (8,))
    if model == "ghost":  # T = 4, d = 32: 2T² = 32 <= p·d = 1024, every Linear by ghost norm + book-keeping
        return Stack(32, 8).to(dtype), torch.randn(8, 4, 32, dtype=dtype), torch.randint(0, 3, (8,))
    return GroupNormCNN().to(dtype), torch.randn(8, 3, 16, 16, dtype=dtype), torch.randint(0, 3, (8,))


def _how(clipper: GhostClipper, name: str) -> str:
    return clipper.describe()["layers"][name]


@pytest.mark.parametrize("model", ["instantiate", "ghost", "groupnorm-cnn", "attention"])
def test_released_early_and_still_equal_to_the_loop(model):
    m, x, y = _data(model)
    ref = LoopClipper(m)(x, y, 1.0)
    for _ in range(2):  # the first call builds and checks the plan; the second is a plain step
        got = GhostClipper(m, check=False)(x, y, 1.0)
        for g, r in zip(got.grads, ref.grads, strict=True):
            assert float((g - r).norm() / r.norm()) < RTOL
        assert float((got.norms - ref.norms).norm() / ref.norms.norm()) < RTOL


def _watch(model: nn.Module, layers: list[nn.Module]):
    """Weak references to each layer's input, output and output gradient in the next forward and
    backward pass, and, when the first layer's output gradient arrives (the backward pass then has
    nothing left above it), which of them are still alive."""
    refs: dict[int, dict[str, weakref.ref]] = {i: {} for i in range(len(layers))}
    alive_then: dict[int, dict[str, bool]] = {}

    def fwd(i):
        def hook(module, args, output):
            refs[i]["input"] = weakref.ref(args[0])
            refs[i]["output"] = weakref.ref(output)

            def on_grad(g):
                refs[i]["grad"] = weakref.ref(g)
                if i == 0:
                    gc.collect()
                    for j in range(1, len(layers)):
                        alive_then[j] = {k: r() is not None for k, r in refs[j].items()}

            output.register_hook(on_grad)

        return hook

    handles = [layer.register_forward_hook(fwd(i)) for i, layer in enumerate(layers)]
    return refs, alive_then, handles


@pytest.mark.parametrize("model", ["instantiate", "groupnorm-cnn"])
def test_a_layer_releases_its_records_and_output_gradient_inside_the_backward_pass(model):
    m, x, y = _data(model)
    clipper = GhostClipper(m)
    clipper(x, y, 1.0)  # the plan (its hooks run first: they were registered before the test's)
    pairs = [] if model == "instantiate" else zip(m.convs, m.norms, strict=True)
    layers = list(m.layers) if model == "instantiate" else [mod for pair in pairs for mod in pair]
    names = [n for n, mod in m.named_modules() if any(mod is layer for layer in layers)]
    _, alive_then, handles = _watch(m, layers)
    try:
        clipper(x, y, 1.0)
    finally:
        for h in handles:
            h.remove()
    assert set(alive_then) == set(range(1, len(layers)))
    for j, alive in alive_then.items():
        # Parts that instantiate (Linear, Conv2d) or take small per-example gradients (GroupNorm) keep
        # neither their inputs nor their output gradients; no layer keeps its output (the rest of the
        # model keeps it only if autograd saved it, which it no longer needs once above the first layer).
        assert "instantiate" in _how(clipper, names[j]) or "per-example (small)" in _how(clipper, names[j])
        assert alive == {"input": False, "output": False, "grad": False}, (names[j], alive)


def test_book_keeping_layers_keep_only_their_inputs_and_output_gradients():
    m, x, y = _data("ghost")
    clipper = GhostClipper(m)
    clipper(x, y, 1.0)
    _, alive_then, handles = _watch(m, list(m.layers))
    try:
        clipper(x, y, 1.0)
    finally:
        for h in handles:
            h.remove()
    for j, alive in alive_then.items():
        assert "ghost-norm" in _how(clipper, f"layers.{j}")
        # a and g are what book-keeping needs for the clipped sum (Bu et al. 2023); the output (a
        # tanh's input, which autograd does not save) is not kept
        assert alive == {"input": True, "output": False, "grad": True}, (j, alive)


def _peak(f) -> int:
    gc.collect()
    with LiveBytes() as t:
        f()
    return t.peak


def _nbytes(out) -> int:  # a module's output: a tensor or a tuple of them (nn.MultiheadAttention)
    return sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("model", ["instantiate", "groupnorm-cnn", "attention"])
def test_peak_bytes_within_non_private_plus_what_the_parts_keep(model):
    """Bound: the non-private step's peak (forward, backward with parameter gradients) + the B·p
    per-example gradients of every parameter (the most the parts keep) + one temporary of that size
    (the squares of the pooled per-example gradients, for their norms) + one layer's working set, taken
    as twice the largest activation (its output gradient and one temporary of that size: the
    recomputed normalisation of a GroupNorm, an instantiation's product). Holding every layer's output
    gradient until the end of the backward pass (or its outputs, or an instantiated layer's inputs, or
    the per-example gradients twice: in the pooled matrix and apart) exceeds it."""
    m, x, y = _data(model)
    B = x.shape[0]
    clipper = GhostClipper(m)
    clipper(x, y, 1.0)

    def non_private():
        for p in m.parameters():
            p.grad = None
        F.cross_entropy(m(x), y, reduction="sum").backward()

    non_private()
    base = _peak(non_private)
    acts: list[int] = []
    layers = [mod for mod in m.modules() if mod is not m and not isinstance(mod, nn.ModuleList)]
    hooks = [mod.register_forward_hook(lambda mod, a, o: acts.append(_nbytes(o))) for mod in layers]
    with torch.no_grad():
        m(x)
    for h in hooks:
        h.remove()
    kept = sum(B * _nbytes(p) for p in clipper.params)  # at most B·p for every parameter
    bound = base + 2 * kept + 2 * max(acts)
    got = _peak(lambda: clipper(x, y, 1.0))
    assert got <= bound, (got, base, kept, max(acts))


def test_nothing_recorded_outlives_the_call():
    m, x, y = _data("groupnorm-cnn")
    clipper = GhostClipper(m)
    clipper(x, y, 1.0)
    refs, _, handles = _watch(m, list(m.convs) + list(m.norms))
    try:
        out = clipper(x, y, 1.0)
    finally:
        for h in handles:
            h.remove()
    gc.collect()
    alive = {(i, k) for i, d in refs.items() for k, r in d.items() if r() is not None}
    assert alive == {(0, "input")}  # the batch x itself, which the test holds
    assert clipper._recorder.calls is None and clipper._recorder.on_grad is None
    assert clipper._recorder.edges == []
    assert all(g.grad_fn is None for g in out.grads)


def test_the_previous_steps_gradients_are_released_before_clipping():
    """Non-private SGD sets its gradients to None before the backward pass; the DP step must not hold
    the previous step's (one more copy of the parameters) through the clipping either."""
    from dpaudit.training.dpsgd import set_private_gradients

    m, x, y = _data("instantiate")
    clipper = GhostClipper(m)
    kw = dict(clip=1.0, noise_std=1.0, batch_size=8, max_physical_batch=None, generator=torch.Generator())
    set_private_gradients(clipper, x, y, torch.arange(8), **kw)
    old = [weakref.ref(p.grad) for p in clipper.params]
    seen: list[bool] = []

    class Watching:
        params, pads = clipper.params, clipper.pads

        def __call__(self, *args, **kwargs):
            gc.collect()
            seen.extend(r() is not None for r in old)
            return clipper(*args, **kwargs)

    set_private_gradients(Watching(), x, y, torch.arange(8), **kw)
    assert seen and not any(seen)
    assert all(p.grad is not None for p in clipper.params)


class UnusedBranch(nn.Module):
    """A layer whose output the loss never reaches: its gradient hook never fires, so its part is
    formed after the backward pass from zero output gradients (zero per-example gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        self.unused(x)  # computed, then dropped
        return self.used(x)


def test_a_layer_the_loss_does_not_reach_gets_zero_gradients():
    torch.manual_seed(0)
    m = UnusedBranch().double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,))
    ref = LoopClipper(m)(x, y, 1.0)
    clipper = GhostClipper(m, check=False)
    for _ in range(2):
        got = clipper(x, y, 1.0)
        assert all(float(g.abs().max()) == 0.0 for g in got.grads[2:])  # unused.weight, unused.bias
        for g, r in zip(got.grads[:2], ref.grads[:2], strict=True):
            assert float((g - r).norm() / r.norm()) < RTOL
        assert float((got.norms - ref.norms).norm() / ref.norms.norm()) < RTOL
