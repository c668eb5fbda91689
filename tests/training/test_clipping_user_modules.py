"""Per-example clipping on users' own unusual modules (bug hunt 2026-11-27): each method either gives
the clipped sum and norms of the one-example-at-a-time loop (float64) or refuses in one line.

The comparison is :func:`tests.training.test_clipping_fuzz.assert_agrees` (the loop reference at
C = the median loop norm, 1e-6 relative)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dpaudit.errors import InputError
from dpaudit.training.clipping import make_clipper
from tests.training.test_clipping_fuzz import _data, assert_agrees


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()


# ------------------------------------------------------- a gradient hook on a parameter (Tensor.register_hook)


def _hooked(scale: float | None) -> nn.Sequential:
    model = _mlp()
    # A user's gradient scaling (e.g. a smaller learning rate for one layer) or a logging hook (None).
    model[0].bias.register_hook((lambda g: g * scale) if scale is not None else (lambda g: None))
    return model


def test_a_gradient_hook_that_changes_a_gradient_is_run_or_refused():
    # Before: torch.func's grad never runs the hook, so --clipping vmap (and auto, after ghost's check
    # refused) clipped the unhooked model's gradients: norms 3% off, the clipped sum 13% off the loop's.
    x, y = _data((6,), 6)
    with pytest.raises(
        InputError, match=r"^--clipping vmap cannot run the gradient hooks on 0\.bias .*--clipping loop$"
    ):
        make_clipper(_hooked(0.1), "vmap")(x, y, 1.0)
    with pytest.raises(InputError, match=r"gradient hook on 0\.bias .*try --clipping loop$") as e:
        make_clipper(_hooked(0.1), "ghost")(x, y, 1.0)
    assert "\n" not in str(e.value)
    model = _hooked(0.1)
    auto = make_clipper(model, "auto")
    assert_agrees(auto, model, x, y)
    assert auto.describe()["method"] == "loop"


def test_a_logging_gradient_hook_stays_on_the_ghost_path():
    # A hook that returns None changes nothing: ghost's check passes and auto keeps ghost.
    x, y = _data((6,), 6)
    model = _hooked(None)
    auto = make_clipper(model, "auto")
    assert_agrees(auto, model, x, y)
    assert auto.describe()["method"] == "ghost"


# ----------------------------------------------- a weight used outside its layer in training mode only


class TrainingAux(nn.Module):
    """An auxiliary output under ``if self.training`` that reuses the head's weight through F.linear
    (deep supervision, a consistency term): the eval-mode model uses the head as a layer only."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.body, self.head, self.drop = nn.Linear(6, 8), nn.Linear(8, 3), nn.Dropout(dropout)
        self.aux = True

    def forward(self, x):
        h = self.drop(torch.tanh(self.body(x)))
        out = self.head(h)
        if self.training and self.aux:
            out = out + F.linear(2 * h, self.head.weight)
        return out


@pytest.mark.parametrize("method", ["ghost", "auto"])
def test_a_weight_used_outside_its_layer_in_training_only(method):
    # Before: the ghost check ran in eval mode only, where the head is a plain layer; in training every
    # norm left the F.linear use out (example 0 of this batch: 4.46 for the loop's 7.83). The sums stayed
    # consistent with those norms (sensitivity C), but they were the gradients of another model.
    torch.manual_seed(0)
    model = TrainingAux().double().train()
    x, y = _data((6,), 6, seed=3)
    clipper = make_clipper(model, method)
    assert_agrees(clipper, model, x, y)
    assert_agrees(clipper, model, *_data((6,), 5, seed=4))  # a later batch, same plan
    assert "head.weight" in clipper.describe()["layers"]["(model)"]


def test_the_training_check_does_not_move_layers_for_dropout():
    # Dropout in training mode: the reference and the ghost pass draw the same masks (one example, same
    # random state), so no layer is moved off its rule; and the checks run inside forks of the random
    # state, so training draws the same numbers as a clipper without checks.
    from dpaudit.training.clipping import GhostClipper

    torch.manual_seed(0)
    model = TrainingAux(dropout=0.5).double().train()
    model.aux = False
    x, y = _data((6,), 6)
    torch.manual_seed(123)
    GhostClipper(model, check=False)(x, y, 1.0)
    unchecked = torch.rand(3)
    torch.manual_seed(123)
    clipper = make_clipper(model, "ghost")
    clipper(x, y, 1.0)
    assert clipper.describe()["layers"] == {"body": "rank-one", "head": "rank-one"}
    assert torch.equal(torch.rand(3), unchecked)


# ------------------------------------------ a buffer assigned in a training forward, beside a vmap unit


class RunningCentre(nn.Module):
    """Input centring by a running mean kept in a non-persistent buffer (not saved, so not released:
    allowed), assigned a new tensor in every training forward, and a bare scale parameter, which
    ghost hands to a vmap over the model."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("mu", torch.zeros(4), persistent=False)

    def forward(self, x):
        if self.training:
            self.mu = 0.9 * self.mu + 0.1 * x.mean(0).detach()
        return self.lin(x - self.mu) * self.scale


@pytest.mark.parametrize("method", ["ghost", "auto"])
def test_a_buffer_assigned_in_forward_does_not_leak_out_of_a_vmap_unit(method):
    # Before: the vmap over the model ran the assignment on a tensor of the vmap and left it in the
    # model; the next call failed with torch's "your tensor may have escaped from inside a function
    # being vmapped" (a traceback; auto does not fall back after its first call).
    torch.manual_seed(0)
    model = RunningCentre().double().train()
    x, y = _data((4,), 4)
    clipper = make_clipper(model, method)
    for _ in range(3):
        clipper(x, y, 1.0)
    assert not torch._C._functorch.is_functorch_wrapped_tensor(model.mu)
    model(x)  # the model still runs
    # The training-mode check restores the buffers between its reference and ghost passes: else the ghost pass
    # centred by the updated mean, disagreed, and moved lin off its rank-one rule onto the vmap (slower).
    assert clipper.describe()["layers"]["lin"] == "rank-one"


# --------------------------------------------- records mixed in training mode: standardisation, mixup, ...


class Mixing(nn.Module):
    """A training-mode forward that mixes the records of its batch (none of it in eval mode): a narrow
    layer standardised over the batch (a hand-written BatchNorm without running statistics), mixup of
    the hidden states, a cumulative sum over the batch, each record paired with the mirrored one."""

    def __init__(self, kind: str, width: int = 6) -> None:
        super().__init__()
        self.lin, self.head, self.kind = nn.Linear(8, width), nn.Linear(width, 3), kind

    def forward(self, x):
        if self.kind == "centred-input":  # per record, so a shifted copy of a record is the same record
            x = x - x.mean(1, keepdim=True)
        h = self.lin(x)
        if self.training:
            if self.kind in ("standardise", "centred-input"):
                h = (h - h.mean(0, keepdim=True)) / (h.std(0, keepdim=True) + 1e-5)
            elif self.kind == "mixup":
                h = 0.7 * h + 0.3 * h[torch.randperm(h.shape[0])]
            elif self.kind == "cumsum":
                h = h.cumsum(0)
            elif self.kind == "mirror":
                h = h + 0.5 * h.flip(0)
            elif self.kind == "pairs":  # consecutive records as two views of one item: an even batch only
                h = h.view(-1, 2, h.shape[1]).mean(1).repeat_interleave(2, 0)
        return self.head(torch.tanh(h))


@pytest.mark.parametrize("rows", [1, 2, 4, 6])
@pytest.mark.parametrize(
    ("kind", "width"), [("standardise", 1), ("standardise", 4), ("mixup", 6), ("cumsum", 6), ("mirror", 6)]
)
def test_records_mixed_in_training_are_refused_whatever_the_first_records(kind, width, rows):
    # Before: the check compared row 0's logits over two batches of two differing in row 1. Over two
    # records a standardised value is ±1/√2, the sign of x_0 - x_1 alone, so a change of row 1 that kept
    # every feature's order went unseen (1-wide layer: 124 of 200 random digit pairs passed, 4-wide: 36),
    # mixup passed when its permutation kept row 0, a cumulative sum always (row 0 depends on itself
    # only); DP training then went on with a sensitivity above C (3.64 C measured, standardisation).
    from dpaudit.models import check_per_record_in_training

    g = torch.Generator().manual_seed(width)
    for seed in range(20):
        torch.manual_seed(seed)
        x = torch.rand(rows, 8, generator=g)
        with pytest.raises(InputError, match="depend on the other records of its batch in training mode"):
            check_per_record_in_training(Mixing(kind, width).train(), x)


@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("kind", ["pairs", "centred-input"])
def test_mixing_that_only_some_variants_or_an_even_batch_show_is_refused(kind, rows):
    # Mutation testing (2026-11-27): pairs of consecutive records (two views of one item) need an even batch,
    # so a check on three records could not run them and passed them untested; a per-record centred input
    # makes the shifted copy of a record the same record, so only the reversed copy (or x's fifth record)
    # shows the batch standardisation; and with exactly four records x has no fifth to offer.
    from dpaudit.models import check_per_record_in_training

    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.rand(rows, 8)
        with pytest.raises(InputError, match="depend on the other records of its batch in training mode"):
            check_per_record_in_training(Mixing(kind, 4).train(), x)


def test_dp_sgd_jl_projects_the_hooked_gradients_it_sums():
    # Before: the jvp path (what auto picks) projected the unhooked gradients, while the clipped sum's
    # backward ran the hook: a hook scaling 0.weight's gradient by 5 gave norm estimates at 0.30-0.35 of
    # the norms summed (r = 4000), so clipped contributions up to ~3 C. Now auto takes double-vjp (whose
    # backward runs the hook) and jvp by name is refused.
    from dpaudit.training.clipping import _loop_per_example, trainable_parameters
    from dpaudit.training.jl import JLClipper, jl_projection_matrix, random_directions, trainable_names

    model = _mlp()
    model[0].weight.register_hook(lambda g: g * 5.0)
    x, y = _data((6,), 6)
    dirs = random_directions(model, 3, torch.Generator().manual_seed(1))
    per = _loop_per_example(model, trainable_parameters(model), x, y)  # the backward runs the hook
    names = trainable_names(model)
    want = torch.stack([sum((g * v[n]).flatten(1).sum(1) for g, n in zip(per, names, strict=True)) for v in dirs], 1)
    got = jl_projection_matrix(model, x, y, dirs)  # ad_path auto
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-12 * float(want.abs().max()))
    with pytest.raises(InputError, match=r"jvp path cannot run the gradient hooks on 0\.weight"):
        JLClipper(model, 4, torch.Generator().manual_seed(1), ad_path="jvp")(x, y, 1.0)


class _CustomTanh(torch.autograd.Function):
    """A user's custom tanh op (no forward-mode rule); its backward is the subclasses'."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.tanh(x)


class _OnceDifferentiable(_CustomTanh):
    """A user's custom op whose backward cannot itself be differentiated."""

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (1 - torch.tanh(x) ** 2)


class _Detaching(_CustomTanh):
    """A user's custom op whose backward detaches its answer: the gradients before it have no graph at all."""

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (g * (1 - torch.tanh(x) ** 2)).detach()


class _Custom(nn.Module):
    def __init__(self, op=_OnceDifferentiable):
        super().__init__()
        self.op = op

    def forward(self, x):
        return self.op.apply(x)


def test_dp_sgd_jl_refuses_gradients_the_double_vjp_trick_cannot_differentiate_again():
    # Found by mutation testing: a custom op whose backward is once_differentiable cuts the gradients of the
    # parameters before it from the double-vjp trick's cotangent u, so their projections came out 0 with no error
    # (auto, after jvp failed on the op; or double-vjp by name): norm estimates without them (projections off by
    # 1.49 of 5.36 here), so per-example contributions above C. Now refused in one line, hooks or not.
    from dpaudit.training.jl import JLClipper, resolve_ad_path

    # (a backward that detaches gives those gradients no graph at all: refused as well)
    for op, hooked in ((_OnceDifferentiable, False), (_OnceDifferentiable, True), (_Detaching, False)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), _Custom(op), nn.Linear(8, 3)).double()
        if hooked:
            model[0].weight.register_hook(lambda g: g * 2.0)
        x, y = _data((6,), 4)
        cut = r"no double backward \(the gradients of 0\.weight, 0\.bias cannot be differentiated again"
        with pytest.raises(
            InputError, match=("gradient hooks on 0\\.weight rule out the jvp path.*" if hooked else "") + cut
        ):
            resolve_ad_path(model, x, y)
        with pytest.raises(InputError, match=cut):
            JLClipper(model, 4, torch.Generator().manual_seed(1), ad_path="double-vjp")(x, y, 1.0)
    model = _mlp()  # a model the trick differentiates: double-vjp by name still runs
    assert resolve_ad_path(model, *_data((6,), 4), "double-vjp") == "double-vjp"
