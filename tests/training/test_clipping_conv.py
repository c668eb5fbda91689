"""Per-example Conv2d gradients by the two instantiation routes of ``_Conv2dHandler`` (issue 26, memory).

``patches``: a batched matmul over the unfolded input; ``grouped``: the weight gradient of one
convolution with groups = B·groups (Rochette et al. 2019, arXiv:1912.06015), no patches. Oracles:
per-example autograd (one backward per example) for the per-example gradients, and the loop
clipper's norms and clipped sums, in float64 at ``RTOL = 1e-6`` (observed ~1e-15). Every geometry
nn.Conv2d takes: stride, integer / 'same' / 'valid' padding (incl. the asymmetric 'same' of an even
kernel), dilation, the conv's own groups (depthwise too), bias or none, non-square kernels, padding
modes other than zeros, batch 1 and chunks of examples. ``check=False`` so that a wrong rule is not
rerouted to a vmap by the first-call check (which would hide it).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dpaudit.errors import InputError
from dpaudit.training.clipping import (
    GhostClipper,
    LoopClipper,
    _Conv2dHandler,
    _conv_padded,
    _grouped_conv_weight_grads,
)
from tests.training.test_gpu_path import _cuda_syncs_raise, _host_reads_raise

RTOL = 1e-6  # float64: the routes and the loop differ by rounding only
N = 6

# name -> Conv2d keyword arguments (in_channels 4 unless given, out_channels 6)
GEOMETRIES = {
    "stride2-pad1": {"kernel_size": 3, "stride": 2, "padding": 1},
    "same-odd": {"kernel_size": 3, "padding": "same"},
    "same-even": {"kernel_size": (4, 2), "padding": "same"},  # asymmetric: 1 before, 2 after (rows)
    "same-dilated": {"kernel_size": 3, "padding": "same", "dilation": 2},
    "valid": {"kernel_size": 3, "padding": "valid"},
    "dilation2": {"kernel_size": 3, "padding": 2, "dilation": 2},
    "groups2": {"kernel_size": 3, "padding": 1, "groups": 2},
    "depthwise": {"in_channels": 6, "kernel_size": 3, "padding": 1, "groups": 6},
    "no-bias": {"kernel_size": 3, "padding": 1, "bias": False},
    "non-square": {"kernel_size": (3, 1), "stride": (2, 1), "padding": (1, 0)},
    "reflect": {"kernel_size": 3, "padding": 1, "padding_mode": "reflect"},
    "circular-same": {"kernel_size": 3, "padding": "same", "padding_mode": "circular"},
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-300))


def _conv(name: str) -> nn.Conv2d:
    kw = dict(GEOMETRIES[name])
    return nn.Conv2d(kw.pop("in_channels", 4), 6, **kw).double()


class ConvNet(nn.Module):
    """conv -> tanh -> global mean -> linear head; the convolution is on the instantiate side of the
    cost model (10x10 input: T >= 25 positions, 2T² >= 1250 > p·d <= 216)."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.conv = conv
        self.head = nn.Linear(conv.out_channels, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.conv(x)).mean((2, 3)))


def _batch(conv: nn.Conv2d, n: int = N, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, conv.in_channels, 10, 10, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 3, (n,), generator=g)


def _case(name: str, n: int = N):
    torch.manual_seed(11)
    model = ConvNet(_conv(name)).double()
    x, y = _batch(model.conv, n)
    norms = LoopClipper(model)(x, y, 1.0).norms
    clip = float(norms.median()) if n > 1 else float(norms[0]) / 2
    return model, x, y, clip, LoopClipper(model)(x, y, clip)


def _assert_matches_loop(clipper, x, y, clip, ref) -> None:
    got = clipper(x, y, clip)
    assert _rel(got.norms, ref.norms) < RTOL
    for g, r in zip(got.grads, ref.grads, strict=True):
        assert g.shape == r.shape and _rel(g, r) < RTOL


@pytest.mark.parametrize("name", GEOMETRIES)
def test_grouped_per_example_weight_gradients_equal_autograd_per_example(name):
    conv = _conv(name)
    x, _ = _batch(conv)
    out = conv(x)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ref = torch.stack([torch.autograd.grad(conv(x[i : i + 1]), conv.weight, g[i : i + 1])[0] for i in range(N)])
    got = _grouped_conv_weight_grads(conv, x, g)
    assert got.shape == (N, *conv.weight.shape)
    assert _rel(got, ref) < RTOL
    for i in range(N):  # every example on its own (a mix-up of examples keeps the total norm)
        assert _rel(got[i], ref[i]) < RTOL


@pytest.mark.parametrize("name", GEOMETRIES)
def test_conv_padded_reproduces_the_forward(name):
    conv = _conv(name)
    x, _ = _batch(conv)
    xp, padding = _conv_padded(x, conv)
    ref = conv(x)
    got = F.conv2d(xp, conv.weight, conv.bias, conv.stride, padding, conv.dilation, conv.groups)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("route", ["patches", "grouped"])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_both_routes_match_the_loop_clipper(name, route):
    model, x, y, clip, ref = _case(name)
    assert (ref.norms < clip).any() and (ref.norms > clip).any()  # both sides of the clip factor
    clipper = GhostClipper(model, check=False, conv_route=route)
    _assert_matches_loop(clipper, x, y, clip, ref)
    how = clipper.describe()["layers"]["conv"]
    # groups > 1 has the grouped route only (the patch route and ghost norm take groups = 1)
    expected = "grouped convolution" if route == "grouped" or model.conv.groups > 1 else "patches"
    assert how.startswith(f"instantiate by {expected} ("), how


@pytest.mark.parametrize("route", ["patches", "grouped"])
def test_batch_of_one(route):
    model, x, y, clip, ref = _case("stride2-pad1", n=1)
    _assert_matches_loop(GhostClipper(model, check=False, conv_route=route), x, y, clip, ref)


def _budget_for(monkeypatch, conv: nn.Conv2d, chunk: int) -> None:
    # The grouped route's budget allows `chunk` examples' per-example gradients (the real budget is
    # at least the layer's input, more than these small layers' gradients: forced smaller here).
    p = conv.weight.numel()
    monkeypatch.setattr(_Conv2dHandler, "_budget", staticmethod(lambda inputs: chunk * p))


@pytest.mark.parametrize("chunk", [1, 4])  # 6 examples: chunks of 1, and 4 + 2 (a short last chunk)
@pytest.mark.parametrize("name", ["stride2-pad1", "groups2"])
def test_grouped_route_in_chunks_of_examples(monkeypatch, name, chunk):
    # Norms chunk by chunk, the clipped sum by book-keeping (the chunks' gradients are not kept).
    model, x, y, clip, ref = _case(name)
    _budget_for(monkeypatch, model.conv, chunk)
    clipper = GhostClipper(model, check=False, conv_route="grouped")
    _assert_matches_loop(clipper, x, y, clip, ref)
    assert clipper.describe()["layers"]["conv"].endswith(f", in chunks of {chunk} examples")


@pytest.mark.parametrize("chunk", [None, 4])  # 9 rows: 4 + 4 + 1, the last chunk padding only
def test_padding_rows_add_exactly_nothing(monkeypatch, chunk):
    """Rows after ``valid`` (clip factor 0) add exactly nothing: the padded batch gives the unpadded
    result to rounding (1e-12), with padding rows scaled by 1e3 so that a leak would dominate."""
    model, x, y, clip, ref = _case("stride2-pad1")
    if chunk:
        _budget_for(monkeypatch, model.conv, chunk)
    clipper = GhostClipper(model, check=False, conv_route="grouped")
    xp, yp = torch.cat([x, x[[1, 0, 1]] * 1e3]), torch.cat([y, y[[2, 0, 1]]])
    got = clipper(xp, yp, clip, valid=N)
    assert got.norms.shape == (N,) and _rel(got.norms, ref.norms) < 1e-12
    for g, r in zip(got.grads, ref.grads, strict=True):
        assert _rel(g, r) < 1e-12
    assert clipper.describe()["layers"]["conv"].endswith(f", in chunks of {chunk} examples") == bool(chunk)


class TwiceAndTied(nn.Module):
    """One Conv2d called twice (its per-example gradient is the sum over both calls) and a weight
    tied between two Conv2d modules (instantiated per use and summed: ``per_example``)."""

    def __init__(self) -> None:
        super().__init__()
        self.twice = nn.Conv2d(3, 3, 3, padding=1)
        self.a = nn.Conv2d(3, 4, 3, padding="same", bias=False)
        self.b = nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False)
        self.b.weight = self.a.weight
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.twice(torch.tanh(self.twice(x))))
        return self.head(torch.cat([self.a(h).mean((2, 3)), torch.tanh(self.b(h)).mean((2, 3))], 1))


@pytest.mark.parametrize("route", ["patches", "grouped"])
def test_repeated_calls_and_tied_weights(route):
    torch.manual_seed(2)
    model = TwiceAndTied().double()
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(N, 3, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (N,), generator=g)
    clip = float(LoopClipper(model)(x, y, 1.0).norms.median())
    clipper = GhostClipper(model, check=False, conv_route=route)
    _assert_matches_loop(clipper, x, y, clip, LoopClipper(model)(x, y, clip))
    layers = clipper.describe()["layers"]
    assert layers["twice"].startswith("instantiate by " + ("grouped" if route == "grouped" else "patches"))
    assert layers["a.weight"].startswith("instantiate, summed over its uses")


def test_cpu_default_route_and_unknown_route():
    model, x, y, clip, ref = _case("no-bias")
    clipper = GhostClipper(model, check=False)
    _assert_matches_loop(clipper, x, y, clip, ref)
    assert clipper.describe()["layers"]["conv"].startswith("instantiate by grouped convolution")
    with pytest.raises(InputError, match="conv_route"):
        GhostClipper(model, conv_route="im2col")


@pytest.mark.parametrize("route", ["patches", "grouped"])
def test_no_host_reads_after_the_first_call(route):
    # A call after the first (the plan's probes) reads nothing back to the host: a sync on a GPU.
    model, x, y, clip, ref = _case("groups2" if route == "grouped" else "stride2-pad1")
    clipper = GhostClipper(model, check=False, conv_route=route)
    clipper(x, y, clip)
    with _host_reads_raise():
        got = clipper(x, y, clip)
    assert _rel(got.norms, ref.norms) < RTOL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("route", ["patches", "grouped"])
def test_cuda_routes_match_the_cpu_loop(route):
    # cuDNN's grouped weight gradient (groups = B·groups) against the CPU loop, float64; after the
    # first call, no call synchronises with the host.
    for name in ("stride2-pad1", "same-even", "groups2", "reflect"):
        model, x, y, clip, ref = _case(name)
        clipper = GhostClipper(model.cuda(), check=False, conv_route=route)
        xc, yc = x.cuda(), y.cuda()
        clipper(xc, yc, clip)
        with _cuda_syncs_raise():
            got = clipper(xc, yc, clip)
        assert _rel(got.norms.cpu(), ref.norms) < RTOL
        for g, r in zip(got.grads, ref.grads, strict=True):
            assert _rel(g.cpu(), r) < RTOL


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel_size": (4, 2), "padding": "same"},
        {"kernel_size": 3, "padding": 1, "padding_mode": "reflect"},
        {"kernel_size": 3, "padding": "same", "padding_mode": "circular", "bias": False},
    ],
)
def test_ghost_side_with_string_padding_and_padding_modes(kw):
    # 8 -> 16 channels on 4x4: T = 16, 2T² = 512 <= p·d (>= 16·72): ghost norm over the patches of
    # the explicitly padded input, clipped sum by book-keeping on it (no instantiation, either route).
    torch.manual_seed(6)
    model = ConvNet(nn.Conv2d(8, 16, **kw).double()).double()
    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(N, 8, 4, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (N,), generator=g)
    clip = float(LoopClipper(model)(x, y, 1.0).norms.median())
    clipper = GhostClipper(model, check=False)
    _assert_matches_loop(clipper, x, y, clip, LoopClipper(model)(x, y, clip))
    assert clipper.describe()["layers"]["conv"].startswith("ghost-norm (T=16"), clipper.describe()
