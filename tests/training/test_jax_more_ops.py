"""Users' models under ``--backend jax`` (thirteenth session): super-resolution (PixelShuffle/PixelUnshuffle),
style transfer (InstanceNorm2d, flip/roll), a causal running mean (cumsum) with a logsumexp head, hand-written
attention (bmm, baddbmm, an HF-style Conv1D's addmm, exact GELU through erf), gather-based pooling (index_select, a
tensor index, gather at max indices, sign) and an audio CNN (InstanceNorm1d). Before (main 74a8441) each was refused
in one line by its first op ("layer ps (PixelShuffle) is not supported", "layer n1 (InstanceNorm2d)", "op x.cumsum",
"op torch.bmm", "op torch.logsumexp", "op x.index_select", "indexing a tensor by a tensor or list", "op torch.erf",
"op torch.flip", "op torch.sign", "layer pu (PixelUnshuffle)", "layer n (InstanceNorm1d)"). The op-table and
gradient cases of the new ops are in test_jax_user_models.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from dpaudit.errors import InputError  # noqa: E402
from dpaudit.training import jax_backend as jb  # noqa: E402

# the comparison (torch loop clipper), its float64 tolerance (a wrong axis, shift or index is O(1)) and the data
from tests.training.test_jax_cnn_ops import BENCH, RTOL, _x, check_logits  # noqa: E402


def _trained(norm: nn.Module) -> None:
    # γ and β away from their initial 1 and 0 (which would hide a dropped or misplaced affine map)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_()


class _SuperResolution(nn.Module):  # ESPCN (Shi et al. 2016): sub-pixel convolution; a space-to-depth stem
    def __init__(self):
        super().__init__()
        self.stem, self.c1 = nn.PixelUnshuffle(2), nn.Conv2d(4, 8, 3, padding=1)
        self.c2, self.ps, self.head = nn.Conv2d(8, 12, 3, padding=1), nn.PixelShuffle(2), nn.Linear(3 * 8 * 8, 2)

    def forward(self, x):
        h = self.ps(self.c2(torch.tanh(self.c1(self.stem(x)))))  # (B, 3, 8, 8)
        return self.head((h + F.pixel_shuffle(F.pixel_unshuffle(h, 4), 4)).flatten(1))


class _StyleTransfer(nn.Module):  # Johnson et al.'s residual block with instance norm; flips and rolls
    def __init__(self):
        super().__init__()
        # no bias before an instance norm: it cancels (its gradient is 0 but rounding, which no relative check reads)
        self.c1, self.n1 = nn.Conv2d(1, 4, 3, bias=False), nn.InstanceNorm2d(4, affine=True)
        self.c2, self.n2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.InstanceNorm2d(4)
        self.head = nn.Linear(4 * 8 * 8, 2)
        _trained(self.n1)

    def forward(self, x):
        h = F.relu(self.n1(self.c1(F.pad(x, (1, 1, 1, 1), mode="reflect"))))
        h = h + self.n2(self.c2(h))
        h = h + torch.flip(h, [-1]) + h.roll(3, -2) + torch.roll(h, (-9, 1), (3, 1))
        return self.head(F.instance_norm(h, weight=self.n1.weight, eps=1e-3).flatten(1))


class _CausalCumsum(nn.Module):  # a causal running mean over 8 steps, a log-sum-exp pooled head
    def __init__(self):
        super().__init__()
        self.inp, self.head = nn.Linear(8, 6), nn.Linear(8, 2)

    def forward(self, x):
        h = torch.tanh(self.inp(x[:, 0]))  # (B, T, 6)
        mean = h.cumsum(1) / torch.arange(1, h.size(1) + 1, dtype=h.dtype).view(1, -1, 1)
        z = torch.cat([mean, torch.cumsum(h * h, dim=-1)], -1)  # (B, T, 12)
        return self.head(torch.logsumexp(z, dim=-1) + z.logsumexp((1, 2), keepdim=True).squeeze(-1))


class _BmmAttention(nn.Module):  # attention written by hand; GPT-2's Conv1D (addmm) MLP with exact GELU via erf
    def __init__(self):
        super().__init__()
        self.qkv, self.head = nn.Linear(8, 24), nn.Linear(64, 2)
        self.rel = nn.Parameter(torch.randn(1, 8, 8) * 0.1)
        self.w_fc, self.b_fc = nn.Parameter(torch.randn(8, 16) * 0.3), nn.Parameter(torch.zeros(16))
        self.w_proj, self.b_proj = nn.Parameter(torch.randn(16, 8) * 0.3), nn.Parameter(torch.zeros(8))

    def forward(self, x):
        h = x[:, 0]  # (B, 8, 8)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        att = torch.baddbmm(self.rel.expand(h.size(0), -1, -1), q, k.transpose(1, 2), alpha=1 / math.sqrt(8))
        h = h + torch.bmm(att.softmax(-1), v)
        flat = h.reshape(-1, 8)
        u = torch.addmm(self.b_fc, flat, self.w_fc)
        u = 0.5 * u * (1.0 + torch.erf(u / math.sqrt(2.0)))
        h = h + torch.addmm(self.b_proj, u, self.w_proj).view(h.shape)
        return self.head(h.bmm(h.mT).flatten(1))


class _GatherPooling(nn.Module):  # fixed channel selections and a gather at each row's maximum; signed roots
    def __init__(self):
        super().__init__()
        self.lin, self.head = nn.Linear(64, 16), nn.Linear(14, 2)
        self.register_buffer("keep", torch.tensor([0, 5, 10, 15, 5]))

    def forward(self, x):
        h = self.lin(x.flatten(1))
        rows = h.view(-1, 4, 4)
        at = rows.max(-1, keepdim=True).indices  # data-dependent indices
        picked = rows.gather(-1, at).squeeze(-1) * rows.gather(1, self.keep[:4].view(1, 1, 4).expand(h.size(0), 1, 4)
                                                                 .div(5, rounding_mode="floor"))[:, 0]  # fmt: skip
        signed = torch.sign(h) * h.abs().sqrt()
        return self.head(torch.cat([h.index_select(1, self.keep), signed[:, self.keep[:3]] * h[:, [1, -1, 1]],
                                    picked, rows[:, torch.tensor([2, 0])][:, :, 1]], 1))  # fmt: skip


class _AudioInstanceNorm(nn.Module):  # a 1-D CNN over 8 mel bands, instance-normalised per example and channel
    def __init__(self):
        super().__init__()
        self.c, self.n = nn.Conv1d(8, 4, 3, padding=1, bias=False), nn.InstanceNorm1d(4, affine=True)  # see above
        self.head = nn.Linear(32, 2)
        _trained(self.n)

    def forward(self, x):
        return self.head(F.relu(self.n(self.c(x[:, 0]))).flatten(1))


def _sequential_espcn():  # a plain Sequential: ghost clipping taps its convolutions and Linear through the shuffles
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.Tanh(), nn.Conv2d(8, 4, 3, padding=1), nn.PixelShuffle(2),
                         nn.PixelUnshuffle(4), nn.Flatten(), nn.Linear(256, 2))  # fmt: skip


def _sequential_instance_norm():  # an InstanceNorm's affine map is not ghost-tapped: the Sequential goes to vmap
    seq = nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.InstanceNorm2d(4, affine=True), nn.ReLU(), nn.Flatten(),
                        nn.Linear(144, 2))  # fmt: skip
    _trained(seq[1])
    return seq


_SLOW = {"style-transfer", "super-resolution", "bmm-attention", "sequential-instance-norm"}  # 9-28 s each here
USERS = {"super-resolution": _SuperResolution, "style-transfer": _StyleTransfer, "causal-cumsum": _CausalCumsum,
         "bmm-attention": _BmmAttention, "gather-pooling": _GatherPooling,
         "audio-instance-norm": _AudioInstanceNorm, "sequential-espcn": _sequential_espcn,
         "sequential-instance-norm": _sequential_instance_norm}  # fmt: skip


@pytest.mark.parametrize("name", list(USERS))
def test_a_users_model_with_the_new_ops_computes_torchs_logits(name):
    """Float64 logits equal torch's; float32 within the logits backstop the trainer checks."""
    check_logits(USERS[name])


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW else n for n in USERS])
def test_a_users_model_with_the_new_ops_clips_as_the_torch_loop_clipper(name):
    """Per-example norms and clipped sums (vmap, and the fx ghost path for its plain Linear/Conv2d modules: the
    instance norms' affine parameters and the bare parameters get theirs by autodiff, per example) against the torch
    loop clipper, float64."""
    torch.manual_seed(0)
    got = BENCH.compare(USERS[name]().double(), *_x())
    assert max(got.values()) < RTOL, got
    # a Sequential of the shuffles between tapped layers is ghost-clipped; an InstanceNorm's affine map is not
    assert ("ghost norms" in got) == (name == "sequential-espcn"), got


def test_instance_norm_passes_torchs_gradients_with_a_constant_channel():
    """The gradient of Σ w·instance_norm(x, γ, β) to x, γ and β against torch's backward, float64, one channel of one
    example constant (variance 0: only √eps divides). Normalisation's backward cancels (g − mean g − x̂·mean(g x̂)):
    the two computations round apart by a few eps of the largest entry, so atol 64 eps of it (a wrong axis or eps is
    O(1))."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 5, generator=g, dtype=torch.float64)
    x[1, 0] = 0.7
    w, gamma, beta = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((3, 2, 5), (2,), (2,)))
    xt, gt, bt = (t.clone().requires_grad_() for t in (x, gamma, beta))
    (F.instance_norm(xt, weight=gt, bias=bt, eps=0.1) * w).sum().backward()
    with jax.enable_x64(True):
        got = jax.grad(lambda *v: (jb._f_instance_norm(v[0], weight=v[1], bias=v[2], eps=0.1) * w.numpy()).sum(),
                       argnums=(0, 1, 2))(*(jnp.asarray(t.numpy()) for t in (x, gamma, beta)))  # fmt: skip
    for a, t in zip(got, (xt, gt, bt), strict=True):
        e = t.grad.numpy()
        np.testing.assert_allclose(np.asarray(a), e, rtol=0, atol=64 * np.finfo(np.float64).eps * np.abs(e).max())


def test_a_tensor_index_outside_its_axis_is_nan_under_a_trace_never_a_clamped_neighbour():
    """torch raises IndexError for an index outside the axis; JAX's gathers clamp it to the last entry by default.
    Constant indices are checked (refusal tests below); traced ones (computed from the data) fill NaN, so a wrong
    index shows as NaN logits, never as a neighbour's value. Planted: mode="fill" dropped -> the clamped entry."""
    x = jnp.arange(12.0).reshape(3, 4)
    i = jnp.asarray([1, 4, -1])
    runs = {
        "getitem": lambda v, k: jb._getitem(v, (slice(None), k)),
        "index_select": lambda v, k: jb._index_select(v, 1, k),
        "gather": lambda v, k: jb._gather(v, 1, jnp.broadcast_to(k, (3, 3))),
    }
    for name, f in runs.items():
        got = np.asarray(jax.jit(f)(x, i))
        assert np.array_equal(got[:, 0], [1.0, 5.0, 9.0]) and np.isnan(got[:, 1]).all(), name
        # a negative index counts from the end in x[idx] (as torch's); index_select and gather raise in torch
        assert np.array_equal(got[:, 2], [3.0, 7.0, 11.0]) if name == "getitem" else np.isnan(got[:, 2]).all(), name


@pytest.mark.parametrize(
    ("op", "message"),
    [(lambda m, h: m.f(h[:, :, None]).flatten(1), r"layer f \(Conv3d\) is not supported"),
     (lambda m, h: F.max_pool3d(h[:, None], 2).flatten(1), r"op torch.nn.functional.max_pool3d .* is not supported"),
     (lambda m, h: m.f(h).flatten(1), r"layer f \(FeatureAlphaDropout\) is not supported"),
     (lambda m, h: m.f(h).flatten(1), r"layer f \(InstanceNorm2d\) with track_running_stats=True: torch "
      r"updates its running mean and variance from each training batch"),
     (lambda m, h: F.instance_norm(h, m.f.running_mean, m.f.running_var).flatten(1),
      r"instance_norm with running statistics is not supported"),
     (lambda m, h: h[h > 0][None], r"indexing a tensor by a boolean mask \(a shape that depends on the data\)"),
     (lambda m, h: h[:, torch.tensor([0, 2])].flatten(1), r"indexing: index 2 is out of range for an axis of size 2"),
     (lambda m, h: h.index_select(1, torch.tensor([-1])).flatten(1), r"index_select: index -1 is out of range"),
     (lambda m, h: h.index_select(1, torch.tensor([[0]])).flatten(1), r"index_select takes a 1-D integer index"),
     (lambda m, h: h.gather(3, torch.tensor([[[[6]]]])).flatten(1), r"gather: index 6 is out of range for an axis "
      r"of size 6"),
     (lambda m, h: (lambda g: (g.__setitem__((slice(None), torch.tensor([0])), 0.0), g)[1])(h.clone()).flatten(1),
      r"x\[index\] = value with a tensor or list index is not supported"),
     (lambda m, h: torch.flip(h, (1, -3)).flatten(1), r"flip names an axis twice in \(1, -3\)|flip names an axis"),
     (lambda m, h: torch.flip(h, (1, 1)).flatten(1), r"flip names an axis twice in \(1, 1\)"),
     (lambda m, h: torch.roll(h, (1, 2)).flatten(1), r"roll without dims takes one shift, not 2"),
     (lambda m, h: torch.roll(h, (1, 2), 1).flatten(1), r"roll with 2 shifts for 1 dims"),
     (lambda m, h: torch.bmm(h, h).flatten(1), r"bmm of shapes \(9, 2, 6, 6\) and \(9, 2, 6, 6\)"),
     (lambda m, h: torch.bmm(h[:1, 0], h[:, 0]).flatten(1), r"bmm of shapes \(1, 6, 6\) and \(9, 6, 6\)"),
     (lambda m, h: F.pixel_shuffle(h, 3).flatten(1), r"pixel_shuffle of shape \(9, 2, 6, 6\) by 3"),
     (lambda m, h: F.pixel_unshuffle(h, 4).flatten(1), r"pixel_unshuffle of shape \(9, 2, 6, 6\) by 4"),
     (lambda m, h: h.logsumexp(()).flatten(1), r"logsumexp over dim=\(\) is not supported"),
     (lambda m, h: torch.cumprod(h, 1).flatten(1), r"op torch.cumprod .* is not supported")],
    ids=["conv3d", "max-pool3d", "feature-alpha-dropout", "running-stats", "f-running-stats", "bool-mask",
         "index-out-of-range", "index-select-negative", "index-select-2d", "gather-out-of-range", "set-tensor-index",
         "flip-same-axis-negative", "flip-twice", "roll-no-dims", "roll-counts", "bmm-4d", "bmm-batches",
         "pixel-shuffle", "pixel-unshuffle", "logsumexp-no-dims", "cumprod"],
)  # fmt: skip
def test_what_the_new_ops_cannot_run_is_one_line(op, message, request):
    """What stays refused (torch raises, or the JAX graph cannot give torch's values or model), one line naming the
    op, before training (exit 2 through the CLI)."""

    modules = {"conv3d": nn.Conv3d(2, 2, 1), "feature-alpha-dropout": nn.FeatureAlphaDropout(0.2)}
    running = nn.InstanceNorm2d(2, track_running_stats=True)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.f = nn.Conv2d(1, 2, 3), modules.get(request.node.callspec.id, running)

        def forward(self, x):
            return op(self, self.c(x))

    with pytest.raises(InputError, match=message) as e:
        model = Net().double()
        apply = jb.jax_forward(model)
        apply(jb.params_from_torch(model), jnp.asarray(_x()[0].numpy()))
    assert "\n" not in str(e.value) and str(e.value).endswith("use --backend torch")


class _AcrossRecords(nn.Module):  # the new ops along the batch axis: each record's logits read other records
    def __init__(self, how):
        super().__init__()
        self.lin, self.head, self.how = nn.Linear(64, 8), nn.Linear(8, 2), how

    def forward(self, x):
        return self.head(self.how(torch.tanh(self.lin(x.flatten(1)))))


@pytest.mark.parametrize(
    "how",
    [lambda h: h.cumsum(0), lambda h: h + h.flip(0), lambda h: h.roll(1, 0), lambda h: h[torch.tensor([1, 0])].sum(0)
     + h, lambda h: h + torch.logsumexp(h, 0)],
    ids=["cumsum", "flip", "roll", "index", "logsumexp"],
)  # fmt: skip
def test_the_new_ops_across_records_are_refused_for_private_training(how):
    """Along the batch axis these ops mix records (a record's clipped gradient no longer bounds its influence): the
    pre-training checks refuse them for DP training (torch's check_per_record_in_training, the graph's own
    check_alone_as_in_batch), as they refuse a batch mean; without a claim they train."""
    from tests.training.test_jax_user_models import _fit

    with pytest.raises(InputError, match=r"depend on the other records of its batch|differ between the record alone"):
        _fit(_AcrossRecords(how), "dpsgd")
    # (a record alone: the index 1 is outside its batch of one, refused as torch would)
    alone = r"^a record's logits differ between the record alone|index 1 is out of range for an axis of size 1"
    with jax.enable_x64(True), pytest.raises(InputError, match=alone):
        model = _AcrossRecords(how).double()
        xj = jnp.asarray(_x(8)[0].numpy())
        jb.check_alone_as_in_batch(jb.jax_forward(model), jb.params_from_torch(model), xj)
