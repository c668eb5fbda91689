"""Users' own models under ``--backend jax``: an ``nn.Sequential`` of supported layers trains the model it is
(the clipped sum and per-example norms equal the torch loop clipper's, float64), and anything else is one
line naming what is not supported, never a traceback or a silently different model
(benchmarks/jax_user_models.py prints the same comparison for more models)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

jax = pytest.importorskip("jax")

from dpaudit.errors import InputError  # noqa: E402
from dpaudit.training import jax_backend as jb  # noqa: E402
from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig  # noqa: E402
from tests.benchmark_modules import import_benchmark  # noqa: E402

BENCH = import_benchmark("jax_user_models")  # one implementation of the comparison for the test and the script

# float64 throughout: the three computations differ by rounding, ~1e-15 relative here (observed);
# a wrong norm or a missing term is O(1).
RTOL = 1e-9


def _data(n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


SEQUENTIALS = {
    # Before: KeyError '1.bias' in the forward (internal error, exit 3).
    "linear-without-bias": lambda: nn.Sequential(
        nn.Flatten(), nn.Linear(64, 16, bias=False), nn.Tanh(), nn.Linear(16, 3)
    ),
    # A Linear over the last axis of (B, 1, 8, 8): T = 8 positions, 2T² = 128 > 8·4, the instantiated branch.
    # Before: the rank-one ghost formula on a 4-D input, a shape error (internal error, exit 3).
    "linear-on-positions-instantiated": lambda: nn.Sequential(
        nn.Linear(8, 4), nn.Tanh(), nn.Flatten(), nn.Linear(32, 3)
    ),
    # A Linear(8, 16) at the same T = 8 positions: 2T² = 128 <= 8·16, the ghost-norm branch; no bias.
    "linear-on-positions-ghost": lambda: nn.Sequential(
        nn.Linear(8, 16, bias=False), nn.Tanh(), nn.Flatten(), nn.Linear(128, 3)
    ),
    # Before: refused ("layer 1 (Sequential) is not supported"). Names as torch's: "block.0.weight".
    "nested-sequentials": lambda: nn.Sequential(
        OrderedDict(flat=nn.Flatten(), block=nn.Sequential(nn.Linear(64, 8), nn.Tanh()), head=nn.Linear(8, 3))
    ),
    # Before: GELU(approximate="tanh") ran as the exact GELU and ELU(alpha=0.5) was refused.
    "gelu-tanh-elu-alpha": lambda: nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 16),
        nn.GELU(approximate="tanh"),
        nn.Linear(16, 8),
        nn.ELU(alpha=0.5),
        nn.Linear(8, 3),
    ),
    "groupnorm-on-features": lambda: nn.Sequential(
        nn.Flatten(), nn.Linear(64, 16), nn.GroupNorm(4, 16), nn.Tanh(), nn.Linear(16, 3)
    ),
    # Before: AvgPool2d(divisor_override=1) (window sums) ran as window means.
    "cnn-no-bias-divisor-override": lambda: nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False),
        nn.GroupNorm(2, 4),
        nn.ReLU(),
        nn.AvgPool2d(2, divisor_override=1),
        nn.Conv2d(4, 8, 3, stride=2, padding=1),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(32, 3),
    ),
    # Before: refused. padding="same" with an even kernel pads one more row/column after than before.
    "cnn-same-and-valid-padding": lambda: nn.Sequential(
        nn.Conv2d(1, 2, 4, padding="same"),
        nn.Tanh(),
        nn.Conv2d(2, 2, 3, padding="valid"),
        nn.Flatten(),
        nn.Linear(72, 3),
    ),
}


# The vmap oracle of a CNN and of the wider MLPs compiles for ~10-20 s on one shared core.
CLIPPED = [
    "nested-sequentials",
    "linear-without-bias",
    "linear-on-positions-instantiated",
    "linear-on-positions-ghost",
    pytest.param("groupnorm-on-features", marks=pytest.mark.slow),
    pytest.param("cnn-no-bias-divisor-override", marks=pytest.mark.slow),
    pytest.param("cnn-same-and-valid-padding", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", sorted(SEQUENTIALS))
def test_a_users_sequential_computes_torchs_logits(name):
    torch.manual_seed(0)
    assert BENCH.compare(SEQUENTIALS[name]().double(), *_data(), clipping=False)["logits"] < RTOL


@pytest.mark.parametrize("name", CLIPPED)
def test_a_users_sequential_clips_as_the_torch_loop_clipper(name):
    """vmap and ghost per-example norms and clipped sums against the torch loop clipper's."""
    torch.manual_seed(0)
    got = BENCH.compare(SEQUENTIALS[name]().double(), *_data())
    assert max(got.values()) < RTOL, got


# --- what the layer list cannot run: one line naming it, never a different model ------------------


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.head = nn.Linear(64, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.inp(x.flatten(1))
        return self.head(h + torch.tanh(h))


def _mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Tanh(), nn.Linear(8, 3))


def _residual_sequential():
    from tests.core.byo_models import residual_sequential

    return residual_sequential(64, 3)


def _block_twice():
    block = nn.Sequential(nn.Linear(64, 64), nn.Tanh())
    return nn.Sequential(nn.Flatten(), block, block, nn.Linear(64, 3))


def _patched_forward():  # an instance whose forward was replaced: ran as a plain Linear before
    m = _mlp()
    m[1].forward = lambda x: torch.nn.functional.linear(x, 2 * m[1].weight, m[1].bias)
    return m


def _hooked(where):
    def make():
        m = _mlp()
        (m if where == "model" else m[1]).register_forward_hook(lambda mod, inp, out: 2 * out)
        return m

    return make


def _backward_hooked():  # torch's backward runs it (here: gradients through layer 1 doubled); JAX's would not
    m = _mlp()
    m[1].register_full_backward_hook(lambda mod, gin, gout: tuple(None if g is None else 2 * g for g in gin))
    return m


def _parameter_hooked():
    m = _mlp()
    m[3].weight.register_hook(lambda g: 2 * g)
    return m


def _tied_parameter():  # two Linear modules sharing one weight: named_parameters() listed it once
    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))
    m[3].weight = m[1].weight
    return m


def _own_parameter():  # a parameter of the Sequential itself, read by no layer (KeyError before)
    m = _mlp()
    m.register_parameter("shift", nn.Parameter(torch.zeros(64)))
    return m


class _ScaledLinear(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


REFUSED = [
    (_Residual, r"model _Residual is not an nn.Sequential"),
    (_residual_sequential, r"model ResidualSequential has a forward of its own"),
    (lambda: nn.Sequential(_residual_sequential()), r"layer 0 \(ResidualSequential\) has a forward of its own"),
    (_block_twice, r"layer 2.0 is layer 1.0 again"),
    (_patched_forward, r"layer 1 \(Linear\) has a forward of its own"),
    (lambda: nn.Sequential(nn.Flatten(), _ScaledLinear(64, 3)), r"layer 1 \(_ScaledLinear\) has a forward of its own"),
    (_hooked("layer"), r"layer 1 has a forward hook"),
    (_hooked("model"), r"the model has a forward hook"),
    (_backward_hooked, r"layer 1 has a backward hook"),
    (_parameter_hooked, r"parameter 3.weight has a gradient hook"),
    (_tied_parameter, r"parameter 3.weight is 1.weight \(tied weights\)"),
    (_own_parameter, r"parameter shift is read by no layer"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.LayerNorm(8), nn.Linear(8, 3)), r"layer 2 \(LayerNorm\)"),
    (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(72, 3)), r"\(BatchNorm2d\)"),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Dropout(0.1), nn.Linear(8, 3)), r"layer 2 \(Dropout\)"),
]


@pytest.mark.parametrize(("make", "message"), REFUSED)
def test_what_the_layer_list_cannot_run_is_one_line_naming_it(make, message):
    with pytest.raises(InputError, match=message) as e:
        jb.jax_forward(make())
    text = str(e.value)
    assert "\n" not in text and text.endswith("use --backend torch") and jb.SUPPORTED in text


class _Doubled(nn.Sequential):
    def __call__(self, x):  # not forward: jax_forward's checks pass, the logits check catches it
        return 2 * super().__call__(x)


def _fit(model, algo, n=24):
    x, y = _data(n)
    dp = DPConfig(clip=1.0, noise_multiplier=0.0) if algo == "dpsgd" else None
    config = TrainConfig(algo=algo, steps=1, batch_size=8, dp=dp)
    return jb.JaxTrainer(config, PerfConfig(backend="jax")).fit(model.double(), x, y)


def test_a_model_whose_logits_differ_from_the_layer_lists_is_refused_before_training():
    with pytest.raises(InputError, match=r"gives logits off by [0-9.e-]+ on the first training records") as e:
        _fit(_Doubled(*_mlp()), "sgd")
    assert "use --backend torch" in str(e.value)


def test_batchnorm_refusal_names_the_backend_when_not_private_and_dp_when_private():
    """Non-private torch training takes BatchNorm; the JAX backend cannot run it and says so. Before, its
    refusal spoke of per-example clipping and DP claims for an SGD run. Private: the torch trainers' reason."""
    from dpaudit.training.algorithms import get_trainer

    def bn():
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))

    with pytest.raises(InputError, match=r"layer 2 \(BatchNorm1d\) is not supported.*use --backend torch"):
        _fit(bn(), "sgd")
    with pytest.raises(InputError) as torch_refusal:
        x, y = _data(24)
        config = TrainConfig(algo="dpsgd", steps=1, batch_size=8, dp=DPConfig(noise_multiplier=0.0))
        get_trainer("dpsgd")(config).fit(bn().double(), x, y)
    with pytest.raises(InputError) as jax_refusal:
        _fit(bn(), "dpsgd")
    assert str(jax_refusal.value) == str(torch_refusal.value) and "mixes examples" in str(jax_refusal.value)


def test_cli_refuses_a_sequential_with_a_forward_of_its_own_in_one_line(tmp_path, monkeypatch):
    """Before: ``train --backend jax`` trained the plain layer list (no skip connection) and saved it as the
    user's model, exit 0."""
    import json
    from pathlib import Path

    from tests.core.cli_errors import invoke, one_error

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the factory is imported from the current directory
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", X=rng.normal(size=(60, 4)).astype(np.float32), y=rng.integers(0, 2, 60))
    spec = {"kind": "python", "factory": "tests.core.byo_models:residual_sequential", "kwargs": {"d": 4,
            "n_classes": 2}, "input_shape": [4], "n_classes": 2}  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    r = invoke("train", "--backend", "jax", "--model-spec", tmp_path / "spec.json", "--data", tmp_path / "d.npz",
               "--steps", 1, "--out", tmp_path / "run")  # fmt: skip
    assert "ResidualSequential has a forward of its own" in one_error(r)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("algo", ["sgd", "adam", "dpsgd"])
def test_a_module_without_parameters_is_one_line_on_both_backends(backend, algo):
    """Before: the non-private torch trainer raised torch.optim's ValueError (empty parameter list) and the JAX
    trainer StopIteration, both internal errors (exit 3); private torch training already refused so."""
    from dpaudit.training.run import default_trainer

    x, y = torch.randn(16, 3), torch.randint(0, 3, (16,))
    dp = DPConfig(noise_multiplier=1.0) if algo == "dpsgd" else None
    trainer = default_trainer(TrainConfig(algo=algo, steps=1, batch_size=8, dp=dp), PerfConfig(backend=backend))
    with pytest.raises(InputError, match=r"^the model has no trainable parameters$"):
        trainer.fit(nn.Sequential(nn.Flatten(), nn.Tanh()), x, y)
