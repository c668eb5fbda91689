"""Per-example clipping: every method against a one-example-at-a-time autograd oracle."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dpaudit.errors import InputError
from dpaudit.models import build_model, default_spec
from dpaudit.training import clipping
from dpaudit.training.clipping import (
    AutoClipper,
    GhostClipper,
    clip_factors,
    clipped_gradient_sum,
    make_clipper,
)

RTOL = 1e-5  # float64 throughout: the methods differ only by rounding (observed ~1e-15)
METHODS = ("auto", "ghost", "vmap")


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-300))


def _batch(kind: str, n: int = 10, seed: int = 0, **options):
    g = torch.Generator().manual_seed(seed)
    if kind == "rnn":
        spec = default_spec("rnn", input_shape=(9,), n_classes=3, vocab_size=13, **options)
        x = torch.randint(0, 13, (n, 9), generator=g)
    else:
        spec = default_spec(kind, input_shape=(1, 8, 8), n_classes=3, **options)
        x = torch.randn(n, 1, 8, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=g)
    return build_model(spec, seed=seed, dtype=torch.float64), x, y


def per_example_oracle(model, x, y) -> list[list[torch.Tensor]]:
    """Per-example gradients by plain autograd, one example at a time (independent of the library)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(len(x)):
        loss = torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        gs = torch.autograd.grad(loss, params, allow_unused=True)
        out.append([torch.zeros_like(p) if g is None else g for p, g in zip(params, gs, strict=True)])
    return out


def assert_matches_oracle(model, x, y, method: str, per_example=None) -> None:
    """Clipped sum and norms of ``method`` equal Σ_i g_i / max(1, ‖g_i‖/C) from the oracle, with C
    strictly between the smallest and largest per-example norm (some examples clipped, some not)."""
    per_example = per_example or per_example_oracle(model, x, y)
    norms = torch.stack([torch.sqrt(sum(g.square().sum() for g in gs)) for gs in per_example])
    clip = float(norms.min() + norms.max()) / 2
    assert (norms < clip).any() and (norms > clip).any()
    factors = 1.0 / torch.clamp(norms / clip, min=1.0)
    expected = [sum(f * gs[k] for f, gs in zip(factors, per_example, strict=True)) for k in range(len(per_example[0]))]
    got = clipped_gradient_sum(model, x, y, clip, method=method)
    assert _rel_err(got.norms, norms) < RTOL
    assert len(got.grads) == len(expected)
    for g, r in zip(got.grads, expected, strict=True):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert _rel_err(g, r) < RTOL


ZOO = [
    ("logreg", {}),
    ("mlp", {}),
    ("mlp", {"hidden": (16, 8), "activation": "relu"}),
    ("cnn", {}),
    ("rnn", {}),
    ("rnn", {"cell": "gru", "bidirectional": True}),
]


@pytest.fixture(scope="module")
def zoo_cases():
    """Each zoo model with a batch and its oracle per-example gradients, computed once."""
    cases = {}
    for kind, options in ZOO:
        model, x, y = _batch(kind, **options)
        cases[(kind, tuple(sorted(options.items())))] = (model, x, y, per_example_oracle(model, x, y))
    return cases


@pytest.mark.parametrize("method", ("loop", *METHODS))
@pytest.mark.parametrize(("kind", "options"), ZOO)
def test_zoo_matches_oracle(zoo_cases, kind, options, method):
    model, x, y, per_example = zoo_cases[(kind, tuple(sorted(options.items())))]
    assert_matches_oracle(model, x, y, method, per_example)


def chosen(model, x, y, method: str = "auto") -> dict:
    """What ``method`` chose for the model on the batch (x, y): ``describe()`` after one call."""
    clipper = make_clipper(model, method)
    clipper(x, y, 1.0)
    return clipper.describe()


def vmapped(desc: dict) -> list[str]:
    """The layers a ghost plan handed to a vmap."""
    return [k for k, v in desc["layers"].items() if v.startswith("vmap")]


def test_auto_picks_ghost_for_the_whole_zoo():
    for kind in ("logreg", "mlp", "cnn", "rnn"):
        model, x, y = _batch(kind, n=4)
        desc = chosen(model, x, y)
        assert desc["method"] == "ghost" and desc["requested"] == "auto"
        assert not vmapped(desc), desc


def test_clip_factor_formula():
    norms = torch.tensor([0.0, 0.5, 1.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(clip_factors(norms, 1.0), torch.tensor([1.0, 1.0, 1.0, 0.25], dtype=torch.float64))
    # Each clipped per-example gradient has norm min(‖g‖, C).
    torch.testing.assert_close(norms * clip_factors(norms, 2.0), torch.clamp(norms, max=2.0))


# --- the individual ghost rules, with shapes chosen to reach each branch ----------------------


class SeqLinear(nn.Module):
    """A Linear on (B, T, d) inputs and one called several times per forward (as the RNN cell)."""

    def __init__(self, d_in: int, d_out: int, width: int, calls: int) -> None:
        super().__init__()
        self.seq = nn.Linear(d_in, width)
        self.shared = nn.Linear(width, width)
        self.head = nn.Linear(width, d_out)
        self.calls = calls

    def forward(self, x):
        h = torch.tanh(self.seq(x)).mean(1)
        for _ in range(self.calls):
            h = torch.tanh(self.shared(h))
        return self.head(h)


@pytest.mark.parametrize(
    ("d_in", "T", "width"),
    [(3, 40, 4), (20, 3, 30)],  # 2T² > d_in·d_out: materialised; 2T² < d_in·d_out: ghost Gram
)
def test_linear_sequences_and_repeated_calls(d_in, T, width):
    torch.manual_seed(1)
    model = SeqLinear(d_in, 3, width, calls=3).double()
    x = torch.randn(8, T, d_in, dtype=torch.float64)
    y = torch.randint(0, 3, (8,))
    assert_matches_oracle(model, x, y, "ghost")


class TokenModel(nn.Module):
    def __init__(self, vocab: int, dim: int, padding_idx: int | None, norm: str) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.norm = nn.LayerNorm(dim) if norm == "layer" else nn.GroupNorm(2, dim)
        self.kind = norm
        self.head = nn.Linear(dim, 3)

    def forward(self, tok):
        e = self.emb(tok)  # (B, T, d)
        e = self.norm(e) if self.kind == "layer" else self.norm(e.transpose(1, 2)).transpose(1, 2)
        return self.head(torch.tanh(e).mean(1))


@pytest.mark.parametrize(
    ("vocab", "T", "padding_idx", "norm"),
    [
        (50, 6, None, "layer"),  # T² < V·d: ghost rule over equal tokens
        (3, 30, 0, "group"),  # T² > V·d: materialised rows; padding row gets no gradient
    ],
)
def test_embedding_and_norm_layers(vocab, T, padding_idx, norm):
    torch.manual_seed(2)
    model = TokenModel(vocab, 4, padding_idx, norm).double()
    tok = torch.randint(0, vocab, (8, T))
    y = torch.randint(0, 3, (8,))
    assert_matches_oracle(model, tok, y, "ghost")


class Scaled(nn.Module):
    """A module type without a ghost rule: its parameter falls back to vmap."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x * self.scale


def test_unsupported_parameters_fall_back_to_vmap_with_exact_norms():
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, stride=2, padding=1),
        nn.GroupNorm(2, 4),
        nn.Conv2d(4, 4, (3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 1)),
        nn.Tanh(),
        nn.Flatten(),
        Scaled(48),
        nn.Linear(48, 3),
    ).double()
    x = torch.randn(8, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 3, (8,))
    desc = chosen(model, x, y)
    assert desc["method"] == "ghost" and vmapped(desc) == ["5"]  # a vmap over the Scaled module alone
    assert_matches_oracle(model, x, y, "ghost")
    assert_matches_oracle(model, x, y, "auto")


def test_shared_parameters_fall_back():
    torch.manual_seed(4)
    a, b = nn.Linear(5, 5), nn.Linear(5, 3)
    b.weight = nn.Parameter(a.weight[:3].detach().clone())
    tied, tied2 = nn.Linear(5, 5), nn.Linear(5, 5)
    tied.weight = tied2.weight = a.weight  # the same parameter in three modules
    model = nn.Sequential(a, nn.Tanh(), tied, nn.Tanh(), tied2, nn.Tanh(), b).double()
    x = torch.randn(8, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (8,))
    desc = chosen(model, x, y, "ghost")
    how = "ghost-norm over its 3 uses with cross terms (T=3: 2T²=18 <= p·d=25) (tied: 0, 2, 4)"
    assert desc["layers"]["0.weight"] == how
    assert not vmapped(desc)
    assert_matches_oracle(model, x, y, "ghost")


def test_frozen_parameters_are_left_out():
    model, x, y = _batch("mlp", hidden=(8,))
    model[1].weight.requires_grad_(False)
    out = clipped_gradient_sum(model, x, y, 0.1, method="ghost")
    assert len(out.grads) == 3  # 1.bias, 3.weight, 3.bias
    assert_matches_oracle(model, x, y, "ghost")


class OutsideForward(nn.Module):
    """Uses a Linear's weight without calling the Linear: hooks cannot see it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x) + torch.nn.functional.linear(x, self.lin.weight)


def test_ghost_check_reroutes_what_hooks_cannot_see():
    model = OutsideForward().double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,))
    desc = chosen(model, x, y, "ghost")
    # lin.weight is also used outside lin's forward: the check moves it to a vmap over the model;
    # lin.bias stays on the ghost path.
    assert desc["layers"]["(model)"] == "vmap over the model: lin.weight" and desc["layers"]["lin"] == "bias only"
    for method in ("ghost", "vmap", "auto"):
        assert_matches_oracle(model, x, y, method)


def test_inplace_modules_keep_ghost_exact():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 3)).double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,))
    assert not vmapped(chosen(model, x, y, "ghost"))  # outputs handed on as copies: still ghost
    assert_matches_oracle(model, x, y, "ghost")


def test_batchnorm_is_refused_with_a_reason():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    for method in ("auto", "ghost", "vmap", "loop"):
        with pytest.raises(InputError, match=r"BatchNorm.*GroupNorm"):
            make_clipper(model, method)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_parameters_are_refused(dtype):
    # Norms and clip factors in bfloat16 let a clipped gradient exceed C by ~0.5% (measured: 1.0058 C),
    # and the noise would be drawn in it too; mixed precision is autocast, with float32 parameters.
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(dtype)
    for method in ("auto", "ghost", "vmap", "loop"):
        with pytest.raises(InputError, match=r"parameters are (bfloat16|float16).*keep the parameters in float32"):
            make_clipper(model, method)


class RunningMean(nn.Module):
    """A user's input centring by a running mean of the data: a buffer learnt from the batches."""

    def __init__(self, persistent: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.register_buffer("mu", torch.zeros(4), persistent=persistent)

    def forward(self, x):
        if self.training:
            self.mu = 0.9 * self.mu + 0.1 * x.mean(0).detach()
        return self.lin(x - self.mu)


def test_running_statistics_released_without_noise_are_refused(monkeypatch):
    # InstanceNorm normalises per example, but track_running_stats=True saves batch averages with the
    # model, un-noised; so does a user's running mean in the state dict. Refused as BatchNorm is.
    inorm = nn.Sequential(nn.Conv2d(1, 2, 3), nn.InstanceNorm2d(2, track_running_stats=True), nn.Flatten())
    for method in ("auto", "ghost", "vmap", "loop"):
        with pytest.raises(InputError, match=r"1 is InstanceNorm2d with track_running_stats=True"):
            make_clipper(inorm, method)
    make_clipper(nn.Sequential(nn.Conv2d(1, 2, 3), nn.InstanceNorm2d(2), nn.Flatten()), "loop")  # no stats: fine
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 0, 1])
    for method in ("auto", "ghost", "loop"):
        with pytest.raises(InputError, match=r"buffer mu changed with the data in a training forward pass"):
            clipped_gradient_sum(RunningMean(persistent=True), x, y, 1.0, method=method)
        clipped_gradient_sum(RunningMean(persistent=False), x, y, 1.0, method=method)  # not released: fine
        # Spectral normalisation updates its power-iteration buffers from the weights alone (post-processing
        # of DP weights): allowed, and the clipped sum is the one without the check's extra passes.
        sn = nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(4, 3)), nn.Tanh(), nn.Linear(3, 2))
        with torch.no_grad():  # weights moved after the 15 power iterations at creation: u and v move again
            sn[0].parametrizations.weight.original.mul_(torch.linspace(0.5, 2.0, 4))
        twin = copy.deepcopy(sn)
        got = clipped_gradient_sum(sn, x, y, 1.0, method=method)
        for name, b in twin.named_buffers():
            assert not torch.equal(b, dict(sn.named_buffers())[name])  # the power iteration did move them
        with monkeypatch.context() as m:  # the same call without the check: same sums, same buffers after
            m.setattr(clipping, "check_buffers_unchanged", lambda *args: None)
            ref = clipped_gradient_sum(twin, x, y, 1.0, method=method)
        for g, r in zip(got.grads, ref.grads, strict=True):
            assert torch.equal(g, r)
        for (_, b), (_, r) in zip(sn.named_buffers(), twin.named_buffers(), strict=True):
            assert torch.equal(b, r)


class PairwiseRunningMean(RunningMean):
    """RunningMean whose forward needs two records (a user's pairwise statistic): the check cannot rerun it on one."""

    def forward(self, x):
        if len(x) < 2:
            raise RuntimeError("needs a pair")
        return super().forward(x)


def test_a_moved_buffer_whose_dependence_cannot_be_tested_is_refused():
    # check_buffers_unchanged tells a data-moved buffer from a weights-moved one by rerunning the forward on one
    # record; where that fails, whether the data moved it is unknown, and the buffer is refused (a claim must not
    # be assumed), with the buffers left as the training forward set them. Planted: the fallback says "unchanged".
    from dpaudit.models import check_buffers_unchanged, released_buffers

    model, x = PairwiseRunningMean(persistent=True), torch.randn(4, 4)
    before = released_buffers(model)
    model(x)
    moved = model.mu.clone()
    with pytest.raises(InputError, match=r"buffer mu changed with the data in a training forward pass"):
        check_buffers_unchanged(model, before, x)
    assert torch.equal(model.mu, moved)


@pytest.mark.parametrize("method", ["ghost", "vmap", "loop"])
def test_float32_and_empty_batch(method):
    model = build_model(default_spec("cnn", input_shape=(1, 8, 8), n_classes=3), seed=0)
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 3, (6,))
    out = clipped_gradient_sum(model, x, y, 0.5, method=method)
    assert all(g.dtype == torch.float32 for g in out.grads) and out.norms.dtype == torch.float32
    ref = clipped_gradient_sum(model.double(), x.double(), y, 0.5, method="loop")
    for g, r in zip(out.grads, ref.grads, strict=True):
        assert _rel_err(g.double(), r) < 1e-4
    empty = make_clipper(model, method)(x[:0], y[:0], 0.5)
    assert empty.norms.shape == (0,) and all(not g.any() for g in empty.grads)


def test_auto_decides_once_on_the_first_call():
    model, x, y = _batch("mlp")
    c = make_clipper(model, "auto")
    assert isinstance(c, AutoClipper) and c.chosen_ is None
    c(x, y, 1.0)
    assert isinstance(c.chosen_, GhostClipper) and c.chosen_.plan_ is not None
    plan = c.chosen_.plan_
    c(x, y, 1.0)
    assert c.chosen_.plan_ is plan


def test_bad_clip_and_method():
    model, x, y = _batch("logreg", n=2)
    with pytest.raises(InputError, match="clip > 0"):
        clipped_gradient_sum(model, x, y, 0.0)
    with pytest.raises(InputError, match="unknown clipping"):
        make_clipper(model, "fast")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_cuda_matches_cpu(method):
    model, x, y = _batch("cnn")
    ref = clipped_gradient_sum(model, x, y, 1.0, method="loop")
    got = clipped_gradient_sum(model.cuda(), x.cuda(), y.cuda(), 1.0, method=method)
    for g, r in zip(got.grads, ref.grads, strict=True):
        assert _rel_err(g.cpu(), r) < RTOL


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "dilation"),
    [(3, 1, 1, 1), ((3, 2), (1, 2), (2, 1), (2, 1)), (1, 2, 0, 1), (5, 3, 2, 2)],
)
def test_im2col_equals_unfold(kernel, stride, padding, dilation):
    from dpaudit.training.clipping import _im2col

    conv = nn.Conv2d(3, 4, kernel, stride=stride, padding=padding, dilation=dilation)
    x = torch.randn(5, 3, 11, 9)
    ref = torch.nn.functional.unfold(x, conv.kernel_size, conv.dilation, conv.padding, conv.stride)
    torch.testing.assert_close(_im2col(x, conv), ref, rtol=0, atol=0)


def test_dropout_models_pass_the_ghost_self_check():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 3)).double().train()
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.randint(0, 3, (8,))
    out = clipped_gradient_sum(model, x, y, 1.0, method="ghost")
    assert out.norms.shape == (8,) and model.training
    model.eval()  # deterministic: exact against the oracle
    assert_matches_oracle(model, x, y, "ghost")
