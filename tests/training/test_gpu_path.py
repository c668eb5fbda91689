"""The DP-SGD training path on a device without host round trips (issue 26 item 3).

Per step the trainer draws the Poisson batch on the host (a proper Bernoulli(q) per record, the same
batches on every device for a seed), sends the indices to the data's device with one queued copy,
gathers the batch there from the device-resident training set, splits it into physical chunks of
at most ``max_physical_batch`` and adds the chunks' clipped sums. After the first step (which builds
and checks the ghost plan) nothing in a step may read a value back from the device: on a GPU each
``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``, ``.numpy()``/``.cpu()`` or pageable copy
waits for all queued work, which serialises host and device once per call.

On the CPU the same code runs with those reads made to raise (the CPU tests below); on CUDA,
``torch.cuda.set_sync_debug_mode("error")`` makes every synchronising call raise (the CUDA tests,
skipped without a GPU; ``benchmarks/gpu_check.sh`` runs them), and the CUDA run must give the CPU
run's weights (σ = 0, float64) so batches, chunks and sums are the same computation.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext

import pytest
import torch

from dpaudit.models import build_model, default_spec
from dpaudit.training import dpsgd
from dpaudit.training.algorithms import get_trainer
from dpaudit.training.base import host_to_device
from dpaudit.training.clipping import make_clipper
from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig
from tests.training.test_clipping_architectures import ArangeTransformer, ResidualGroupNormCNN, TiedLM

HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "numpy", "cpu")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@contextmanager
def _host_reads_raise():
    """Every Tensor method that reads a value back to the host (a device sync on a GPU) raises."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def refuse(name):
        def method(self, *args, **kwargs):
            raise AssertionError(f"Tensor.{name} called during a training step (a host sync on a GPU)")

        return method

    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, f in saved.items():
            setattr(torch.Tensor, name, f)


@contextmanager
def _cuda_syncs_raise():
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(old)


class _StrictAfterFirstCall:
    """Wraps the trainer's clipper: the first call (plan, probe, first-call check) runs freely, then
    ``strict()`` is entered and stays on for the rest of training (sampling, transfer, gather,
    clipping, noise and the optimizer step of every later step), recording each chunk's size (real
    rows) and physical size (with padding)."""

    def __init__(self, inner, strict):
        self.inner, self.params, self.strict, self.pads = inner, inner.params, strict, inner.pads
        self.sizes: list[int] = []
        self.physical: list[int] = []
        self.ctx = None

    def __call__(self, x, y, clip, *, valid=None):
        self.sizes.append(x.shape[0] if valid is None else valid)
        self.physical.append(x.shape[0])
        out = self.inner(x, y, clip, valid=valid)
        if self.ctx is None:
            self.ctx = self.strict()
            self.ctx.__enter__()
        return out

    def close(self):
        if self.ctx is not None:
            self.ctx.__exit__(None, None, None)

    def describe(self):
        return self.inner.describe()


def _workload(name: str, device: torch.device):
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    n = 40
    if name == "mlp":
        model = build_model(default_spec("mlp", input_shape=(6,), n_classes=3, hidden=(8,)), seed=0)
        x = torch.randn(n, 6, generator=g)
    elif name == "resnet-groupnorm":
        model, x = ResidualGroupNormCNN(width=4), torch.randn(n, 3, 6, 6, generator=g)
    elif name in ("transformer-arange", "transformer-mha"):
        model = ArangeTransformer(attention="sdpa" if name == "transformer-arange" else "mha")
        x = torch.randint(0, 11, (n, 5), generator=g)
    elif name == "tied":
        model, x = TiedLM(), torch.randint(0, 9, (n, 4), generator=g)
    else:
        raise KeyError(name)
    classes = 9 if name == "tied" else 3
    y = torch.randint(0, classes, (n,), generator=g)
    model = model.double()
    x = x.double() if x.is_floating_point() else x
    return model.to(device), x.to(device), y.to(device)


_REAL_MAKE_CLIPPER, _REAL_SET_PRIVATE_GRADIENTS = dpsgd.make_clipper, dpsgd.set_private_gradients

WORKLOADS = ["mlp", "resnet-groupnorm", "transformer-arange", "transformer-mha", "tied"]


def _train(monkeypatch, name, device, strict, *, noise=1.0, algo="dpsgd", pad=None):
    model, X, y = _workload(name, device)
    # The originals, not dpsgd's attributes: a second _train in one test would otherwise wrap the first
    # one's wrapper (monkeypatch restores only at teardown), and the CUDA run's strict context would stay
    # entered through the CPU run (seen on an H200: the sync debug mode left on "error").
    real = _REAL_MAKE_CLIPPER
    if pad is not None:  # force padded chunks on or off (the default: on CUDA only)
        monkeypatch.setattr(
            dpsgd, "set_private_gradients", lambda *a, **kw: _REAL_SET_PRIVATE_GRADIENTS(*a, **{**kw, "pad": pad})
        )
    made: list[_StrictAfterFirstCall] = []

    def make(model, method="auto", **kw):
        made.append(_StrictAfterFirstCall(real(model, method, **kw), strict))
        return made[-1]

    monkeypatch.setattr(dpsgd, "make_clipper", make)
    # Expected batch 8 of 40 records (Poisson sizes vary around it), physical chunks of at most 3.
    config = TrainConfig(algo=algo, steps=6, batch_size=8, lr=0.5, seed=1, dp=DPConfig(noise_multiplier=noise))
    try:
        get_trainer(algo)(config, PerfConfig(max_physical_batch=3, clipping="ghost")).fit(model, X, y)
    finally:
        for clipper in reversed(made):  # every strict context entered, the sync debug mode restored
            clipper.close()
    return model, made[-1]


@pytest.mark.parametrize("pad", [None, True])
@pytest.mark.parametrize("name", WORKLOADS)
def test_a_step_reads_nothing_back_from_the_device(monkeypatch, name, pad):
    _, clipper = _train(monkeypatch, name, torch.device("cpu"), _host_reads_raise, pad=pad)
    assert max(clipper.sizes) == 3 and len(clipper.sizes) > 6  # chunked: several chunks per step
    assert clipper.inner.describe()["method"] == "ghost"
    # Padded: every chunk has the cap's size (padded_size(n, 3) = 3); the CPU default pads nothing.
    assert set(clipper.physical) == ({3} if pad else set(clipper.sizes))


def test_padded_size_bounds_the_shapes():
    for N in (1, 8, 64, 256, 1000, 4096):
        sizes = {dpsgd.padded_size(n, N) for n in range(1, N + 1)}
        assert len(sizes) <= 8 * max(1, math.ceil(math.log2(max(N, 2))) - 5) + 9
    for n in range(1, 5000):
        p = dpsgd.padded_size(n)
        assert n <= p < n + max(8, n / 8) and p % 8 == 0  # never truncates; < 12.5% extra from 64 on
        assert dpsgd.padded_size(n, n) == n  # the cap (a full chunk) is never exceeded
    assert dpsgd.padded_size(0, 5) == 0


@pytest.mark.parametrize("name", ["resnet-groupnorm", "transformer-arange", "tied"])
def test_padded_chunks_give_the_unpadded_sum_with_few_shapes(name):
    """Padding (copies of a real row, clip factor 0) leaves the clipped sum unchanged to float64
    rounding (1e-12) over Poisson batches of varying size, whole and under a physical cap, and the
    physical sizes are the few of padded_size, not one per batch size."""
    model, X, y = _workload(name, torch.device("cpu"))
    X, y = torch.cat([X] * 5), torch.cat([y] * 5)  # 200 records, expected batch 50
    sample = dpsgd.poisson_sampler(len(X), 0.25, torch.Generator().manual_seed(0))
    clipper = _StrictAfterFirstCall(make_clipper(model, "ghost"), nullcontext)
    kw = dict(clip=0.5, noise_std=0.0, batch_size=50, generator=torch.Generator())
    real, physical = set(), set()
    for _ in range(12):
        idx = sample()
        for cap in (None, 16):
            got = []
            for pad in (False, True):
                clipper.sizes, clipper.physical = [], []
                dpsgd.set_private_gradients(clipper, X, y, idx, max_physical_batch=cap, pad=pad, **kw)
                got.append([p.grad.clone() for p in clipper.params])
                assert clipper.sizes == [len(c) for c in idx.split(cap or len(idx))]
                (real if not pad else physical).update(clipper.physical if cap is None else [])
            for a, b in zip(*got, strict=True):
                torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)
    assert len(physical) <= len(real) / 2 and all(p % 8 == 0 for p in physical), (real, physical)


def test_padded_training_is_reproducible_and_equals_the_unpadded_run(monkeypatch):
    runs = [_train(monkeypatch, "resnet-groupnorm", torch.device("cpu"), nullcontext, pad=p)[0] for p in (True, True)]
    for a, b in zip(*[m.parameters() for m in runs], strict=True):
        assert torch.equal(a, b)  # same seed, same checkpoint
    flat = [
        _train(monkeypatch, "resnet-groupnorm", torch.device("cpu"), nullcontext, pad=p, noise=0.0)[0]
        for p in (False, True)
    ]
    for a, b in zip(*[m.parameters() for m in flat], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_every_strict_context_is_closed_when_a_test_trains_twice(monkeypatch):
    # Two trainings in one test (CUDA then CPU): each strict context entered is left again, so the
    # CUDA sync debug mode cannot stay on "error" for the test's own reads or the next test.
    depth = []

    @contextmanager
    def counting():
        depth.append(+1)
        yield
        depth.append(-1)

    for _ in range(2):
        _train(monkeypatch, "mlp", torch.device("cpu"), counting)
    assert depth.count(+1) == 2 and sum(depth) == 0, depth


def test_the_strict_mode_bites(monkeypatch):
    # A planted host read in the clipping (what a per-step `.item()` would be) fails the step.
    real = dpsgd.set_private_gradients

    def leaky(clipper, X, y, idx, **kw):
        real(clipper, X, y, idx, **kw)
        float(clipper.params[0].grad.norm())

    monkeypatch.setattr(dpsgd, "set_private_gradients", leaky)
    with pytest.raises(AssertionError, match=r"Tensor\.__float__ called during a training step"):
        _train(monkeypatch, "mlp", torch.device("cpu"), _host_reads_raise)


def test_host_to_device_on_the_cpu_is_the_tensor_itself():
    idx = torch.arange(5)
    assert host_to_device(idx, torch.device("cpu")) is idx


@needs_cuda
def test_cuda_host_to_device_copies_without_changing_values():
    idx = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    out = host_to_device(idx, torch.device("cuda"))
    assert out.device.type == "cuda" and torch.equal(out.cpu(), idx)
    assert host_to_device(out, torch.device("cuda")) is out  # already there: no copy


@needs_cuda
@pytest.mark.parametrize("name", WORKLOADS)
def test_cuda_training_steps_never_sync_and_match_the_cpu_run(monkeypatch, name):
    cuda_model, cuda_clipper = _train(monkeypatch, name, torch.device("cuda"), _cuda_syncs_raise, noise=0.0)
    cpu_model, cpu_clipper = _train(monkeypatch, name, torch.device("cpu"), _host_reads_raise, noise=0.0)
    assert cuda_clipper.sizes == cpu_clipper.sizes  # the same Poisson batches, the same chunks
    assert set(cuda_clipper.physical) == {3}  # padded on CUDA by default: one physical size under the cap
    for a, b in zip(cuda_model.parameters(), cpu_model.parameters(), strict=True):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-9, atol=1e-12)


@needs_cuda
@pytest.mark.parametrize("algo", ["dpsgd", "dpadam"])
def test_cuda_noisy_steps_never_sync(monkeypatch, algo):
    # With noise (the device's own generator) and both optimizers.
    _train(monkeypatch, "transformer-arange", torch.device("cuda"), _cuda_syncs_raise, algo=algo)
