"""The Opacus adapter in loops that differ from the example: frozen layers, bfloat16 models.

Each test is a few Opacus steps of a 2-layer MLP on 40 random records (well under a second).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dpaudit.errors import InputError
from dpaudit.hooks import GradientCanaries

pytestmark = pytest.mark.peers


def _private(frozen: bool = False, dtype: str = "float32"):
    """A PrivacyEngine-wrapped MLP (its first layer frozen before make_private when ``frozen``)."""
    pytest.importorskip("opacus")
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(dt)
    if frozen:
        model[0].requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    data = TensorDataset(torch.randn(40, 6, dtype=dt), torch.randint(0, 2, (40,)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Secure RNG turned off.*")
        return PrivacyEngine().make_private(
            module=model, optimizer=opt, data_loader=DataLoader(data, batch_size=10), noise_multiplier=1.0,
            max_grad_norm=1.0, poisson_sampling=True,
        )  # fmt: skip


def _steps(model, opt, loader, n):
    import torch

    done = 0
    warnings.filterwarnings("ignore", message="Full backward hook is firing.*")  # Opacus' hooks on a first layer
    while done < n:
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            done += 1
            if done == n:
                return


def test_a_layer_frozen_mid_run_is_refused_not_scored_as_noise():
    """Freezing a layer after attach (a fine-tuning schedule) drops it from Opacus' ``params``: it gets no noise
    and keeps a stale summed_grad. The adapter read them anyway, took zeroed grad − stale sum as the noise, and a
    correct loop read "violation" (estimated std 0.6·σC on the frozen layer, 30 steps). Now the step after the
    change is a one-line refusal, and nothing is recorded for it."""
    model, opt, loader = _private()
    shapes = {n: p.shape for n, p in model.named_parameters()}
    canaries = GradientCanaries(shapes, count=6, sample_rate=loader.sample_rate, clip=None, seed=0)
    canaries.attach(opt, module=model)
    _steps(model, opt, loader, 3)
    model._module[0].requires_grad_(False)
    with pytest.raises(InputError, match=r"^step 3: the optimizer no longer trains '0\.weight', '0\.bias' \("):
        _steps(model, opt, loader, 1)
    assert canaries.steps_ == 3 and canaries._pending is None


@pytest.mark.parametrize("by_name", [False, True])
def test_frozen_parameters_in_param_shapes_are_named_as_frozen(by_name):
    """param_shapes from every named parameter, frozen ones included, was refused as "designed for another
    model"; the refusal now says they are frozen and how to leave them out."""
    model, opt, loader = _private(frozen=True)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    canaries = GradientCanaries(shapes, count=4, sample_rate=loader.sample_rate, clip=None, seed=0)
    match = "which the optimizer does not train" if by_name else "2 more parameters than the optimizer trains"
    with pytest.raises(InputError, match=match) as e:
        canaries.attach(opt, module=model if by_name else None)
    assert "if p.requires_grad" in str(e.value) and "\n" not in str(e.value)
    trainable = {n: p.shape for n, p in model.named_parameters() if p.requires_grad}
    ok = GradientCanaries(trainable, count=4, sample_rate=loader.sample_rate, clip=None, seed=0)
    ok.attach(opt, module=model if by_name else None)
    _steps(model, opt, loader, 2)
    assert ok.observations().observations.shape == (2, 4) and np.all(np.isfinite(ok.observations().noise_ss))


def test_a_bfloat16_model_is_refused_at_attach_not_at_the_first_step():
    """Opacus sums the clipped gradients in the parameters' dtype: a bfloat16 model was refused by inject inside
    the first optimizer.step(), with advice an Opacus user cannot follow; now attach() refuses it."""
    model, opt, _ = _private(dtype="bfloat16")
    canaries = GradientCanaries({n: p.shape for n, p in model.named_parameters()}, count=4, sample_rate=0.25,
                                clip=None, seed=0)  # fmt: skip
    with pytest.raises(InputError, match="parameters are bfloat16: Opacus sums the clipped gradients"):
        canaries.attach(opt)
    assert canaries.clip is None  # nothing set by a refused attach


def test_a_clip_schedule_is_refused_at_the_step_it_moves_the_clip():
    """Opacus' clip schedulers (StepGradClip ...) change max_grad_norm between steps; the canaries keep the clip they
    were attached with. Before, the noise σ·C_t was checked against σ·C_0 and a correct loop read "violation"
    (max_grad_norm 1 -> 0.24 over 4 epochs: noise ratio 0.69); now the step after the change is refused."""
    model, opt, loader = _private()
    canaries = GradientCanaries({n: p.shape for n, p in model.named_parameters()}, count=6,
                                sample_rate=loader.sample_rate, clip=None, seed=0)  # fmt: skip
    canaries.attach(opt)
    _steps(model, opt, loader, 2)
    opt.max_grad_norm = 0.7  # what StepGradClip(opt, step_size=1, gamma=0.7).step() does
    with pytest.raises(InputError, match=r"^step 2: the optimizer's max_grad_norm is now 0\.7, the canaries' clip 1 "):
        _steps(model, opt, loader, 1)
    assert canaries.steps_ == 2 and canaries._pending is None


def test_a_noise_schedule_is_recorded_and_a_noise_multiplier_above_its_smallest_is_refused(tmp_path):
    """Opacus' noise schedulers (ExponentialNoise ...) lower σ between steps. Before, the audit with the run's first
    σ read the later steps' smaller noise as a violation (gamma 0.8, σ 1 -> 0.512 by the 4th epoch: noise ratio
    0.77); the adapter now records the range of σ and the audit refuses a σ above its smallest with one line, and
    runs at it."""
    from dpaudit.workflows.hooks_audit import audit_canaries

    model, opt, loader = _private()
    canaries = GradientCanaries({n: p.shape for n, p in model.named_parameters()}, count=8,
                                sample_rate=loader.sample_rate, clip=None, seed=1)  # fmt: skip
    canaries.attach(opt)
    _steps(model, opt, loader, 2)
    opt.noise_multiplier = 0.5  # what ExponentialNoise(opt, gamma=0.5).step() does
    _steps(model, opt, loader, 2)
    d = canaries.save(tmp_path / "c")
    assert load_meta(d) == {"implementation_noise_multiplier_min": 0.5, "implementation_noise_multiplier_max": 1.0}
    with pytest.raises(InputError, match=r"from 1 down to 0\.5: a noise schedule.*give --noise-multiplier 0\.5 "):
        audit_canaries(d, claimed_epsilon=50.0, delta=1e-5, noise_multiplier=1.0)
    assert audit_canaries(d, claimed_epsilon=50.0, delta=1e-5, noise_multiplier=0.5).noise is not None


def load_meta(directory) -> dict:
    from dpaudit.hooks import load_observations

    meta = load_observations(directory).meta
    return {k: v for k, v in meta.items() if k.endswith(("_min", "_max"))}


def test_per_example_gradients_clipped_in_bfloat16_under_autocast_are_refused():
    """A float32 model whose forward runs under ``torch.autocast("cpu", bfloat16)``: Opacus' per-example gradients
    are bfloat16 and it clips them by bfloat16 norms (a clipped record measured at up to 1.0096·C), while each canary is
    exactly C, so the audit read "consistent" of records the claim's C does not bound. Now the step is refused
    with one line before anything is recorded; the same loop without autocast runs."""
    import torch

    model, opt, loader = _private()
    canaries = GradientCanaries({n: p.shape for n, p in model.named_parameters()}, count=6,
                                sample_rate=loader.sample_rate, clip=None, seed=0)  # fmt: skip
    canaries.attach(opt)
    xb, yb = next(iter(loader))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(xb)
    torch.nn.functional.cross_entropy(out.float(), yb).backward()
    with pytest.raises(
        InputError, match=r"^step 0: Opacus computed the per-example gradients or their norms in bfloat16"
    ) as e:
        opt.step()
    assert "no autocast" in str(e.value) and "\n" not in str(e.value)
    assert canaries.steps_ == 0 and canaries._pending is None
    _steps(model, opt, loader, 1)  # float32 per-example gradients: carried
    assert canaries.steps_ == 1


def _ghost_step(model, opt, criterion, xb, yb, autocast: bool) -> None:
    import torch

    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(xb)
    criterion(out, yb).backward()  # Opacus' two backward passes: the norms, then the clipped sum
    opt.step()


def test_ghost_clipping_under_autocast_is_refused_and_in_float32_carries_canaries_of_exactly_c():
    """Opacus' ghost clipping (``grad_sample_mode="ghost"``) keeps no ``grad_sample``; under autocast its per-example
    norms (each parameter's ``_norm_sample``) are bfloat16 and a record's clipped gradient reached 1.0101·C
    (benchmarks/hook_loops.py --only autocast), yet the step was carried and recorded. Now refused in one line as the
    per-sample path is; in float32 each canary adds exactly C to ``summed_grad`` (its one coordinate) and a
    record's clipped gradient is at most C."""
    pytest.importorskip("opacus")
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    def ghost():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        data = TensorDataset(5 * torch.randn(40, 6), torch.randint(0, 2, (40,)))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Secure RNG turned off.*")
            return PrivacyEngine().make_private(
                module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                data_loader=DataLoader(data, batch_size=10), max_grad_norm=0.1, poisson_sampling=True,
                criterion=torch.nn.CrossEntropyLoss(), grad_sample_mode="ghost",
            )  # fmt: skip

    model, opt, criterion, loader = ghost()
    canaries = GradientCanaries({n: p.shape for n, p in model.named_parameters()}, count=6,
                                sample_rate=loader.sample_rate, clip=None, seed=0)  # fmt: skip
    canaries.attach(opt, module=model)
    xb, yb = next(iter(loader))
    with pytest.raises(
        InputError, match=r"^step 0: Opacus computed the per-example gradients or their norms in bf"
    ) as e:
        _ghost_step(model, opt, criterion, xb, yb, autocast=True)
    assert "no autocast" in str(e.value) and "\n" not in str(e.value)
    assert canaries.steps_ == 0 and canaries._pending is None

    model, opt, criterion, loader = ghost()
    canaries = GradientCanaries({n: p.shape for n, p in model.named_parameters()}, count=6,
                                sample_rate=1.0, clip=None, seed=0)  # fmt: skip
    canaries.attach(opt, module=model)
    added = []
    inject = canaries.inject

    def recording(step, grads):
        out = inject(step, grads)
        added.append(torch.cat([(out[n] - grads[n]).double().flatten() for n in grads]))
        return out

    canaries.inject = recording
    for _ in range(3):
        _ghost_step(model, opt, criterion, xb, yb, autocast=False)
    assert canaries.steps_ == 3
    included = int(canaries.included_.sum())
    for d in added:  # every included canary (q = 1): C at its coordinate, up to float32 rounding of the sum
        nz = d[d.abs() > 1e-3]
        assert included >= 1 and float(nz.sum()) == pytest.approx(included * 0.1, rel=1e-5)
        assert all(float(v / 0.1) == pytest.approx(round(float(v / 0.1)), abs=1e-5) for v in nz)
