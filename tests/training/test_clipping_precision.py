"""Mixed precision and bad input for per-example clipping (issue 26 item 3).

Under ``--autocast bf16`` the forward and backward passes run in bfloat16, but each example's
clipped contribution must still have norm <= C up to float32 rounding (the norms and the sums are
computed in float32 from the same tensors): that is the guarantee, checked one example at a time.
"""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from dpaudit.errors import InputError
from dpaudit.training.clipping import check_autocast, make_clipper
from dpaudit.training.config import PerfConfig
from tests.training.test_clipping_architectures import ArangeTransformer, ResidualGroupNormCNN, TinyViT


def _cases():
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    yield ResidualGroupNormCNN(), torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
    yield ArangeTransformer(), torch.randint(0, 11, (4, 5), generator=g), torch.randint(0, 3, (4,), generator=g)
    # bare cls token and position embedding of the model itself: their per-example gradients from their uses
    yield TinyViT(), torch.randn(4, 3, 4, 4, generator=g), torch.randint(0, 3, (4,), generator=g)


@pytest.mark.parametrize("method", ["auto", "ghost", "vmap", "loop"])
def test_bf16_autocast_contributions_never_exceed_the_clip_norm(method):
    for model, x, y in _cases():
        clipper = make_clipper(model, method, autocast=torch.bfloat16)
        full = make_clipper(model, method)
        for i in range(len(x)):
            out = clipper(x[i : i + 1], y[i : i + 1], 1e-3)  # C far below every norm: all clipped
            assert out.norms.dtype == torch.float32 and all(g.dtype == torch.float32 for g in out.grads)
            norm = torch.sqrt(sum(g.double().square().sum() for g in out.grads))
            assert float(norm) <= 1e-3 * (1 + 1e-5)
            # bf16 changes the gradient itself (≈ 3 significant digits), not its clipping
            ref = full(x[i : i + 1], y[i : i + 1], 1e-3)
            cos = sum((a.double() * b.double()).sum() for a, b in zip(out.grads, ref.grads, strict=True)) / 1e-6
            assert float(cos) > 0.9


def test_autocast_refusals(monkeypatch):
    assert check_autocast(None, torch.device("cpu")) is None
    assert check_autocast("bf16", torch.device("cpu")) is torch.bfloat16
    with pytest.raises(InputError, match="autocast"):
        check_autocast("fp8", torch.device("cpu"))
    with pytest.raises(InputError, match="autocast"):
        PerfConfig(autocast="fp16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(InputError, match="no bfloat16 support"):
        check_autocast("bf16", torch.device("cuda"))


def test_cli_bad_performance_options_exit_2(tmp_path):
    from dpaudit.cli.main import app

    runner = CliRunner()
    base = ["train", "--algo", "dpsgd", "--noise-multiplier", "1", "--data", "digits", "--model", "logreg"]
    for extra in (["--max-physical-batch", "0"], ["--autocast", "fp16"]):
        r = runner.invoke(app, [*base, *extra, "--out", str(tmp_path / "run")])
        assert r.exit_code == 2, r.output
        assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
        assert not (tmp_path / "run").exists()


def test_a_model_no_method_can_run_is_refused_with_what_was_tried():
    class Broken(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x):
            if x.shape[0] == 1:  # fails one example at a time (and under vmap)
                raise RuntimeError("cannot run on a single example")
            return self.lin(x)

    clipper = make_clipper(Broken(), "auto")
    with pytest.raises(InputError, match=r"tried --clipping ghost, vmap, loop\).*cannot run"):
        clipper(torch.randn(4, 3), torch.randint(0, 2, (4,)), 1.0)


@pytest.fixture
def no_tf32():
    # Exact float32 everywhere (the forward/backward too) so that CUDA can be compared with the
    # float64 CPU reference at float32 rounding.
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["auto", "ghost"])
def test_cuda_architectures_match_the_cpu_loop(method, no_tf32):
    for model, x, y in _cases():
        ref = make_clipper(model.double(), "loop")(x.double() if x.is_floating_point() else x, y, 0.05)
        model = model.float().cuda()
        got = make_clipper(model, method)(x.cuda(), y.cuda(), 0.05)
        for g, r in zip(got.grads, ref.grads, strict=True):
            assert float((g.double().cpu() - r).norm() / r.norm().clamp(min=1e-30)) < 1e-4


@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()), reason="needs a CUDA device with bf16"
)
def test_cuda_bf16_contributions_never_exceed_the_clip_norm():
    for model, x, y in _cases():
        model = model.cuda()
        clipper = make_clipper(model, "ghost", autocast=torch.bfloat16)
        for i in range(len(x)):
            out = clipper(x[i : i + 1].cuda(), y[i : i + 1].cuda(), 1e-3)
            norm = torch.sqrt(sum(g.double().square().sum() for g in out.grads))
            assert float(norm) <= 1e-3 * (1 + 1e-5)


def test_a_pinned_method_that_cannot_run_the_model_is_one_line():
    class ItemBranch(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)
            self.gain = torch.nn.Parameter(torch.eye(2))

        def forward(self, x):
            h = self.lin(x) @ self.gain  # a matmul: ghost needs a vmap over the model for `gain`
            return h if float(h.sum()) > -1e9 else -h  # .item() on data: vmap cannot trace it

    x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
    for method in ("vmap", "ghost"):
        with pytest.raises(InputError, match=rf"--clipping {method} cannot run this model .*try --clipping"):
            make_clipper(ItemBranch(), method)(x, y, 1.0)
