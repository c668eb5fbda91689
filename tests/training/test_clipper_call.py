"""The checks every :class:`~dpaudit.training.clipping.Clipper` runs around ``_compute`` (``__init__``,
``__call__``, ``_clip_factors``): bad batches and bad ``valid`` refused with one line, padding refused
by a method that does not pad, the empty batch, the padding rows' clip factor exactly 0, and the real-row
count of a padded batch read afresh on every call. Each test is one tiny float64 linear model (a few ms);
written to kill the mutants of these methods that the rest of the fast tier let survive."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpaudit.errors import InputError
from dpaudit.models import released_buffers
from dpaudit.training import clipping
from dpaudit.training.clipping import LoopClipper, clip_factors, make_clipper
from dpaudit.training.jl import JLClipper

N = 5


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2)).double()


def _batch(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (n,), generator=g)


def _oracle(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Σ_i c_i g_i and ‖g_i‖ by plain autograd one example at a time, c_i = 1/max(1, ‖g_i‖/C)
    (Abadi et al. 2016, arXiv:1607.00133, Alg. 1)."""
    params = list(model.parameters())
    per = [
        torch.autograd.grad(nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]), params)
        for i in range(len(x))
    ]
    norms = torch.stack([torch.sqrt(sum(g.square().sum() for g in gs)) for gs in per])
    c = clip_factors(norms, clip)
    return [sum(ci * gs[k] for ci, gs in zip(c, per, strict=True)) for k in range(len(params))], norms


def test_a_model_without_trainable_parameters_is_refused():
    model = _model().requires_grad_(False)
    for method in ("loop", "vmap", "ghost", "auto"):
        with pytest.raises(InputError, match=r"^the model has no trainable parameters$"):
            make_clipper(model, method)


@pytest.mark.parametrize("method", ["loop", "vmap", "ghost"])
def test_batch_shapes_and_valid_bounds_are_refused_with_one_line(method):
    model, (x, y) = _model(), _batch()
    clipper = make_clipper(model, method)
    with pytest.raises(InputError, match=rf"^x has {N} examples but y has {N - 1}$"):
        clipper(x, y[:-1], 1.0)
    # y's last axis equal to x's rows, its first not: the count is read from axis 0
    with pytest.raises(InputError, match=rf"^x has {N} examples but y has {N - 1}$"):
        clipper(x, torch.zeros(N - 1, N, dtype=torch.long), 1.0)
    for bad in (-1, N + 1):
        with pytest.raises(InputError, match=rf"^expected valid in \[0, {N}\], got {bad}$"):
            clipper(x, y, 1.0, valid=bad)
    for ok in (0, N):  # the bounds themselves are valid
        assert clipper(x, y, 1.0, valid=ok).norms.shape == (ok,)


def test_a_method_that_does_not_pad_refuses_a_padded_batch():
    # JL clips by estimated norms from one set of directions per call and never masks rows: a padded batch
    # would add the padding rows' clipped gradients to the sum (sensitivity no longer C). valid == n is fine.
    model, (x, y) = _model(), _batch()
    clipper = JLClipper(model, 2, torch.Generator().manual_seed(0))
    assert not clipper.pads
    with pytest.raises(InputError, match=r"^--clipping jl does not take padded batches$"):
        clipper(x, y, 1.0, valid=N - 1)
    assert clipper(x, y, 1.0, valid=N).norms.shape == (N,)


@pytest.mark.parametrize("method", ["loop", "vmap", "ghost", "auto"])
def test_the_empty_batch_is_zeros_shaped_like_the_parameters(method):
    # valid = 0 (an empty Poisson batch, padded or not): the clipped sum is exactly zero, one tensor per
    # trainable parameter (a frozen layer gets none, as in a non-empty batch) in its shape, dtype and
    # device; norms is empty in the parameters' dtype.
    torch.manual_seed(0)
    model, (x, y) = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double(), _batch()
    model[0].requires_grad_(False)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert len(make_clipper(model, method)(x, y, 1.0).grads) == len(trained) == 2
    for out in (make_clipper(model, method)(x[:0], y[:0], 1.0), make_clipper(model, method)(x, y, 1.0, valid=0)):
        assert out.norms.shape == (0,) and out.norms.dtype == torch.float64
        assert len(out.grads) == len(trained)
        for g, p in zip(out.grads, trained, strict=True):
            assert g.shape == p.shape and g.dtype == p.dtype and g.device == p.device and not g.any()


@pytest.mark.parametrize("method", ["loop", "vmap", "ghost", "auto"])
def test_padding_rows_get_factor_zero_and_valid_is_read_on_every_call(method):
    # Padding rows are copies of real rows scaled by 1e3 (norms far above C = 0.1: an unmasked one adds
    # ~C each, ≥ 100x the 1e-12 tolerance of float64 rounding). The same clipper is called with a
    # different ``valid`` each time, so a real-row count kept from an earlier call shows too.
    model, (x, y) = _model(), _batch()
    clip = 0.1
    clipper = make_clipper(model, method)
    for valid in (N, 2, 4, 1, N):
        xp = torch.cat([x[:valid], 1e3 * x[: N - valid]])
        yp = torch.cat([y[:valid], y[: N - valid]])
        ref, norms = _oracle(model, x[:valid], y[:valid], clip)
        got = clipper(xp, yp, clip, valid=valid)
        assert got.norms.shape == (valid,)
        assert torch.allclose(got.norms, norms, rtol=1e-12, atol=0)
        for g, r in zip(got.grads, ref, strict=True):
            assert torch.allclose(g, r, rtol=1e-12, atol=1e-15)


def test_the_clip_factor_of_each_padding_row_is_exactly_zero():
    # The factor itself, not only its effect on the sum: rows at and after ``valid`` get 0.0, the rows
    # before it 1/max(1, ‖g‖/C) (also for a norm equal to C, factor 1, and a zero norm).
    clipper = LoopClipper(_model())
    norms = torch.tensor([0.0, 1.0, 4.0, 3.0, 0.5], dtype=torch.float64)
    for valid in (5, 3, 1):
        clipper._valid = valid
        c = clipper._clip_factors(norms.clone(), 1.0)
        expected = torch.tensor([1.0, 1.0, 0.25, 1 / 3, 1.0], dtype=torch.float64)
        expected[valid:] = 0.0
        assert torch.equal(c, expected)


def test_the_buffer_check_and_the_value_copy_run_on_the_first_call_only(monkeypatch):
    # Both are one-off checks of the model (a running statistic learnt from the data; a write through
    # ``.data`` in forward): on every later step they would copy every buffer / every trained parameter
    # (twice the parameters' memory on a GPU) for nothing. The version-counter watch runs on every call.
    calls: list[str] = []

    class Watch(clipping.ParameterWatch):
        def __init__(self, params, *, copy_values):
            calls.append(f"watch copy={copy_values}")
            super().__init__(params, copy_values=copy_values)

        def check(self, model, *args):
            calls.append("check")
            super().check(model, *args)

    def released(model):
        calls.append("buffers")
        return released_buffers(model)

    monkeypatch.setattr(clipping, "ParameterWatch", Watch)
    monkeypatch.setattr(clipping, "released_buffers", released)
    model, (x, y) = _model(), _batch()
    clipper = make_clipper(model, "vmap")
    for _ in range(3):
        clipper(x, y, 1.0)
    assert calls == ["watch copy=True", "buffers", "check"] + ["watch copy=False", "check"] * 2


class _Dropouts(nn.Module):
    """Per-record, but random in training mode: nn.Dropout and F.dropout, and a buffer its forward updates."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.head, self.drop = nn.Linear(4, 6), nn.Linear(6, 2), nn.Dropout(0.5)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls += 1
        return self.head(nn.functional.dropout(self.drop(self.lin(x)), 0.3, self.training))


class _Mixing(nn.Module):
    def __init__(self, random_outside_torch: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        self.lin, self.random, self.drop = nn.Linear(4, 2), random_outside_torch, nn.Dropout(dropout)
        self.rng = __import__("numpy").random.default_rng(0)

    def forward(self, x):
        h = self.lin(self.drop(x))
        if self.random:  # noise torch's seed does not fix: whether the batch mixes cannot be told
            h = h + torch.as_tensor(self.rng.normal(size=h.shape), dtype=h.dtype)
        return h - h.mean(0, keepdim=True) if self.training else h


def test_the_training_mode_mixing_check_refuses_mixing_only():
    """Dropout (module or functional) draws the same masks for row 0 from the same seed: not refused; the
    RNG state, the buffers and the mode are left as they were. Mixing is refused, also with a batch of one
    (row 1 then a copy and a shifted copy of it); randomness outside torch's generator is not tested."""
    from dpaudit.models import check_per_record_in_training

    x = torch.randn(5, 4)
    model = _Dropouts().eval()
    state = torch.random.get_rng_state()
    check_per_record_in_training(model, x)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert float(model.calls) == 0 and not model.training
    for rows, dropout in ((5, 0.0), (1, 0.0), (5, 0.5)):  # with dropout: each pass starts from one random state
        with pytest.raises(InputError, match="depend on the other records of its batch in training mode"):
            check_per_record_in_training(_Mixing(dropout=dropout), x[:rows])
    check_per_record_in_training(_Mixing(random_outside_torch=True), x)
    check_per_record_in_training(_Mixing().eval(), torch.randn(1, 3))  # cannot run: not tested, no error


@pytest.mark.parametrize("method", ["ghost", "vmap", "loop", "auto"])
def test_every_clipper_checks_training_mode_mixing_on_its_first_call_over_the_real_rows(method):
    model = _Mixing()
    with pytest.raises(InputError, match="in training mode"):
        make_clipper(model, method)(torch.randn(6, 4), torch.zeros(6, dtype=torch.long), 1.0, valid=6)
    calls = []
    clipper = make_clipper(nn.Linear(4, 2), method)
    real = clipping.check_per_record_in_training
    try:
        clipping.check_per_record_in_training = lambda m, x: calls.append(x.shape[0])
        for _ in range(2):
            clipper(torch.randn(6, 4), torch.zeros(6, dtype=torch.long), 1.0, valid=3)
    finally:
        clipping.check_per_record_in_training = real
    assert calls == [3]  # once, on the valid rows (padding rows are copies of a real row)


class _RowDependent(nn.Module):
    """A record's logits depend on its row in the batch (``kind`` "row": ``+ pos(arange(B))``, a seq-first
    positional embedding on batch-first input; "squeeze": the same with a ``.squeeze()`` that keeps a batch of
    one from being compared alone; "training-row": the same in training mode only, so the check must keep the
    model in training mode while it makes the dropout deterministic) or on the batch size ("size": ``h * B``;
    "training-size": in training mode only; "none": neither, the correct model). ``dropout``: "module"
    (nn.Dropout: it goes to eval mode), "functional" (``F.dropout(h, p, self.training)``), "always"
    (``F.dropout(h, p, True)``, random in eval mode too), "sdpa" / "sdpa-positional" (the dropout_p of
    ``F.scaled_dot_product_attention`` by keyword / by position, in training mode): the functional ones become
    the identity, the model staying in training mode; "frozen": a Dropout left in eval mode by the user, whose
    mode the check must leave as it was."""

    def __init__(self, kind: str = "row", dropout: str = "") -> None:
        super().__init__()
        self.kind, self.dropout = kind, dropout
        self.lin, self.pos, self.head = nn.Linear(4, 6), nn.Embedding(16, 6), nn.Linear(6, 2)
        self.drop = nn.Dropout(0.5 if dropout else 0.0)
        if dropout == "frozen":
            self.drop.eval()

    def forward(self, x):
        h = self.lin(x)
        B = x.shape[0]
        if self.kind in ("size", "training-size"):
            h = h * B if self.kind == "size" or self.training else h
        elif self.kind in ("row", "squeeze") or (self.kind == "training-row" and self.training):
            h = h + self.pos(torch.arange(B))
        if self.dropout in ("functional", "always"):
            h = nn.functional.dropout(h, 0.5, self.training or self.dropout == "always")
        elif self.dropout.startswith("sdpa"):
            p, v = 0.5 if self.training else 0.0, h.unsqueeze(1)
            sdpa = nn.functional.scaled_dot_product_attention
            h = (sdpa(v, v, v, None, p) if self.dropout == "sdpa-positional" else sdpa(v, v, v, dropout_p=p)).squeeze(1)
        else:
            h = self.drop(h)
        out = self.head(h.tanh())
        return out.squeeze() if self.kind == "squeeze" else out


@pytest.mark.parametrize(
    ("kind", "dropout"),
    [
        ("row", ""),
        ("squeeze", ""),
        ("size", ""),
        ("row", "module"),
        ("row", "functional"),
        ("row", "frozen"),
        ("training-row", "module"),
        ("training-row", "functional"),
        ("training-size", "functional"),
        ("size", "always"),
        ("training-size", "sdpa"),
        ("training-size", "sdpa-positional"),
    ],
)
def test_the_training_mode_check_refuses_logits_that_depend_on_the_row_or_the_batch_size(kind, dropout):
    """Replacing records keeps every record's row and the batch size, so a positional embedding of
    ``arange(x.size(0))`` passed; now the records one row down ("squeeze": that alone) and each alone ("size":
    that alone) are compared too, with dropout made deterministic (Dropout modules to eval mode, functional dropout
    the identity) and the rest in training mode ("training-row", "training-size": seen only there; before, F.dropout
    put the whole model in eval mode and "always" left it untested, so those trained under DP-SGD). The random
    state and every module's mode are left as they were; the correct model passes."""
    from dpaudit.models import check_per_record_in_training

    torch.manual_seed(0)
    x = torch.randn(5, 4)
    model = _RowDependent(kind, dropout)
    modes, state = [m.training for m in model.modules()], torch.random.get_rng_state()
    with pytest.raises(InputError, match=r"^the model's output for a record depends on its row in the batch or on"):
        check_per_record_in_training(model, x)
    assert [m.training for m in model.modules()] == modes
    assert torch.equal(torch.random.get_rng_state(), state)
    for rows in (1, 4):  # missing records are shifted or reversed copies of the first
        with pytest.raises(InputError, match="depends on its row in the batch"):
            check_per_record_in_training(_RowDependent(kind, dropout), x[:rows])
    check_per_record_in_training(_RowDependent("none", dropout), x)  # the same dropout, no row dependence


def _encoder(dropout: float) -> nn.Module:
    """torch's TransformerEncoderLayer at its default dropout (random in training mode, also inside attention)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=dropout, batch_first=True)
    return nn.Sequential(nn.Linear(4, 8), layer, nn.Flatten(), nn.Linear(8, 2))


def test_the_row_comparison_accepts_the_users_per_record_models():
    """tests/core/byo_models.py's per-record models in float32 (positions from arange over the sequence, tied
    weights, GroupNorm, a TransformerEncoder, dropout) and an encoder layer at dropout 0.1: not refused, and
    each was compared alone and one row down (8 or more forwards after the 14 of the mixing check)."""
    from dpaudit.models import check_per_record_in_training
    from tests.core import byo_models as byo

    g = torch.Generator().manual_seed(0)
    tok, feats = torch.randint(0, 10, (5, 7), generator=g), torch.randn(5, 6, generator=g)
    img = torch.randn(5, 1, 8, 8, generator=g)
    cases = [
        (byo.transformer(10, 7, 3), tok),
        (byo.mha_transformer(10, 7, 3), tok),
        (byo.encoder_transformer(10, 7, 3), tok),
        (byo.tiny_transformer(10, 3), tok),
        (byo.tiny_transformer(10, 3, sdpa=False), tok),
        (byo.causal_transformer(10, 3), tok),
        (byo.tied_lm(10, 3), tok),
        (byo.pad_masked(10, 3, "random"), tok),
        (byo.residual_mlp(6, 3), feats),
        (byo.with_dropout(6, 3), feats),
        (byo.residual_sequential(6, 3), feats),
        (byo.tied_linear(6, 3), feats),
        (byo.float64_mlp(6, 3), feats.double()),
        (byo.random_projection(6, 3), feats),
        (byo.residual_groupnorm_cnn(1, 3), img),
        (byo.bare_parameter_cnn(1, 8, 3), img),
        (_encoder(0.1), torch.randn(5, 1, 4, generator=g)),
    ]
    for model, x in cases:
        calls: list[int] = []
        model.register_forward_hook(lambda m, args, out, calls=calls: calls.append(args[0].shape[0]))
        check_per_record_in_training(model, x)
        assert calls.count(1) == 4 and len(calls) >= 14 + 1 + 1 + 4, type(model).__name__


class _FloatIdsByRow(nn.Module):
    """Float-coded token ids (x.long() into an embedding of 8) plus an embedding of the batch row: the mixing check's
    shifted copy (ids + 1) leaves the vocabulary, so that check stops untested; the row is still there to see."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos, self.head = nn.Embedding(8, 6), nn.Embedding(16, 6), nn.Linear(6, 2)

    def forward(self, x):
        h = self.tok(x.long()).mean(1) + self.pos(torch.arange(x.shape[0]))
        return self.head(h.tanh())


def test_a_mixing_check_left_untested_still_compares_the_rows():
    """A replaced copy the model cannot take (float ids shifted out of the vocabulary) leaves mixing untested, but
    the records' own rows are still compared (check_per_record_in_training: "the rows of the real records still
    are"): a row-dependent model is refused. Planted: the failed copy not read as None (the check aborts) or None
    not caught (the same)."""
    from dpaudit.models import check_per_record_in_training

    torch.manual_seed(0)
    x = torch.tensor([[7.0, 1.0, 2.0], [3.0, 7.0, 0.0], [5.0, 6.0, 7.0], [2.0, 2.0, 7.0], [1.0, 0.0, 4.0]])
    with pytest.raises(InputError, match="depends on its row in the batch"):
        check_per_record_in_training(_FloatIdsByRow().train(), x)


class _Mixup(nn.Module):
    """Mixup of the hidden states with a random permutation of the batch, drawn on every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        h = self.lin(x)
        return 0.5 * (h + h[torch.randperm(x.shape[0])])


def test_mixing_unseen_in_the_first_random_state_is_seen_in_the_second():
    """A random permutation can pair every row with itself: under torch.manual_seed(15) the first state's
    randperm(4) is the identity (no mixing to see) and the second state's (one draw further) is [1, 0, 3, 2];
    check_per_record_in_training reruns a random forward from that second state, so mixup is still refused.
    Planted: the loop stopping after the first state whenever the forward draws."""
    from dpaudit.models import check_per_record_in_training

    torch.manual_seed(15)
    assert torch.randperm(4).tolist() == [0, 1, 2, 3]  # the premise: the first draw mixes nothing
    model, x = _Mixup().train(), torch.randn(4, 4)
    torch.manual_seed(15)  # the check's first state
    with pytest.raises(InputError, match="depend on the other records of its batch"):
        check_per_record_in_training(model, x)


class _NoisyInEveryMode(nn.Module):
    """Per-record, but random in eval mode too: Gaussian noise added to the input on every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x + torch.randn_like(x))


class _TupleInEval(nn.Module):
    """Per-record with dropout; in eval mode its forward returns a tuple (no logits to compare)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.drop = nn.Linear(4, 2), nn.Dropout(0.5)

    def forward(self, x):
        out = self.drop(self.lin(x))
        return out if self.drop.training else (out,)


class _NeedsTwoRows(nn.Module):
    """Per-record, but its forward refuses a batch of one."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        if x.shape[0] < 2:
            raise ValueError("a batch of one")
        return self.lin(x)


class _RoundsByBatchSize(nn.Module):
    """Per-record logits of magnitude ``scale`` whose batch of one differs by a rounding-level amount: 1e-6 absolute
    plus 1e-6 relative (about 8 float32 ulps), as other kernel blockings at another batch size can give."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.lin, self.scale = nn.Linear(4, 2), scale

    def forward(self, x):
        h = self.lin(x) * self.scale
        if x.shape[0] == 1:
            h = h + 1e-6 * (1 + h.abs())
        return torch.cat([h, torch.zeros_like(h[:, :1])], 1)


@pytest.mark.parametrize("scale", [1e3, 1e-4])
def test_rounding_across_batch_sizes_is_within_the_row_comparisons_tolerance(scale):
    """The row comparison's tolerance is sqrt(eps) * (1 + max|logit|) (_moves_with_row's docstring: rounding grows
    with the logits, and is eps-level in absolute terms where they are near 0); a per-record model whose batch of
    one differs by ~8 ulps is accepted at logits near 1000 (a difference 1e-3 > sqrt(eps) = 3.5e-4) and near 0
    (1e-6 > sqrt(eps) * 1e-4). Planted: the tolerance without the logits' scale, scaled by the smallest logit
    instead of the largest, divided by it, or without the 1 +, refuses one of them."""
    from dpaudit.models import check_per_record_in_training

    torch.manual_seed(0)
    check_per_record_in_training(_RoundsByBatchSize(scale).train(), torch.randn(5, 4))


def test_a_forward_random_in_eval_mode_too_is_not_compared_across_rows():
    """A forward that still draws random numbers with the whole model in eval mode cannot be compared across rows
    (the noise of row i goes to another record when the batch is rolled or cut), so _moves_with_row leaves it
    untested (its docstring) rather than refusing a per-record model, as is one whose deterministic (eval-mode)
    forward gives no tensor of logits or that cannot take a batch of one (the rolled batch was compared); every
    module's mode is restored. Planted: either early return made True,
    or the first dropped, refuses them."""
    from dpaudit.models import check_per_record_in_training

    torch.manual_seed(0)
    for model in (_NoisyInEveryMode().train(), _TupleInEval().train(), _NeedsTwoRows().train()):
        check_per_record_in_training(model, torch.randn(5, 4))
        assert all(m.training for m in model.modules())


@pytest.mark.parametrize("algo", ["dpsgd", "dpadam", "dpsgd-jl", "dpadam-jl"])
def test_every_per_example_clipping_trainer_refuses_the_batch_row_transformer(algo):
    """The library trainers (DP-SGD, DP-Adam and their JL variants share Clipper.__call__) refuse, before any
    step, a transformer whose positions are ``pos(arange(x.size(0)))`` on batch-first tokens."""
    from dpaudit.training.algorithms import get_trainer
    from dpaudit.training.config import DPConfig, TrainConfig
    from tests.core import byo_models as byo

    torch.manual_seed(0)
    model = byo.batch_row_transformer(10, 7, 2)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randint(0, 10, (16, 7)), torch.randint(0, 2, (16,))
    # r = 64: the JL claim (computed before the first batch) takes ~2 s of CPU; at r = 2 (ε ~ 10^4, the loss cap
    # widened again and again) ~6 s. No step is taken, so r changes nothing else here.
    jl = {"jl_projections": 64, "accountant": "pld"} if algo.endswith("-jl") else {}
    dp = DPConfig(noise_multiplier=1.0, clip=1.0, **jl)
    config = TrainConfig(algo=algo, steps=2, batch_size=8, dp=dp)
    with pytest.raises(InputError, match="depends on its row in the batch"):
        get_trainer(algo)(config).fit(model, x, y)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


def test_the_rounding_tolerance_is_sqrt_eps_times_one_plus_the_largest_logit_for_torch_and_numpy():
    """The one rule the row comparison and the JAX backend's two logit checks share: √eps·(1 + max|z|), from a torch
    tensor or a numpy array alike (2^-26·(1 + 3) in float64); a NaN logit gives a NaN tolerance, which no difference
    is within (a batch std of 0 counts as a change)."""
    import math

    import numpy as np

    from dpaudit.models import rounding_tolerance

    eps = torch.finfo(torch.float64).eps
    assert rounding_tolerance(eps, torch.tensor([-3.0, 1.0], dtype=torch.float64)) == 2.0**-26 * 4
    assert rounding_tolerance(eps, np.array([[0.5], [-3.0]])) == 2.0**-26 * 4
    assert rounding_tolerance(torch.finfo(torch.float32).eps, torch.zeros(2)) == 2.0**-11.5
    assert math.isnan(rounding_tolerance(eps, np.array([1.0, np.nan])))
    assert math.isnan(rounding_tolerance(eps, torch.tensor([1.0, float("nan")])))


def test_no_dropout_mode_makes_every_functional_dropout_the_identity_however_called():
    # models._NoDropout: every dropout is the identity, as in eval mode (PyTorch docs, torch.nn.Dropout: "during
    # evaluation the module simply computes an identity function"), whether called by keyword or with its p and
    # training flag positional (the ATen torch.dropout(input, p, train)); scaled_dot_product_attention runs with
    # dropout_p 0, given positionally or by keyword. Plant: the positional input read from the last argument.
    from dpaudit.models import _NoDropout

    F = torch.nn.functional
    x = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    calls = [lambda: F.dropout(x, 0.5, True), lambda: F.dropout(input=x, p=0.5), lambda: F.dropout2d(x, 0.5, True),
             lambda: torch.dropout(x, 0.5, True), lambda: torch.alpha_dropout(x, 0.5, True),
             lambda: torch.feature_alpha_dropout(x, 0.5, True), lambda: F.alpha_dropout(x, 0.5, True)]  # fmt: skip
    q, k, v = x[0], x[1], x[0] + 1
    plain, causal = F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with _NoDropout():
        for call in calls:
            assert call() is x
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, None, 0.9), plain)
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, dropout_p=0.9), plain)
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, None, dropout_p=0.9), plain)
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, None, 0.9, True), causal)  # is_causal kept
