"""The ghost clipper's forward hooks (issue 26, host overhead): registered once per plan instead of per
step, active only inside the clipper's own forward pass, gone when the plan changes or the clipper is
closed or dropped. The model must behave outside the clipper exactly as if it had never been hooked.

A test forward hook registered *after* the clipper's sees what the clipper's hook hands on: the shape
of the positional embedding's output tells whether it was expanded to the batch (only the clipping
forward may do that).
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from torch import nn

from dpaudit.training import clipping
from dpaudit.training.algorithms import get_trainer
from dpaudit.training.clipping import GhostClipper, LoopClipper, make_clipper
from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig

RTOL = 1e-6  # float64: the methods differ by rounding only


class PosModel(nn.Module):
    """Token embedding + positional embedding of ``arange(T)`` (a batch-less output the clipping
    forward expands), an in-place ReLU (outputs handed on as copies) and a Linear head."""

    def __init__(self, vocab: int = 7, d: int = 4, T: int = 3) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.mix = nn.Sequential(nn.Linear(d, d), nn.ReLU(inplace=True))
        self.head = nn.Linear(d, 2)

    def forward(self, tok):
        h = self.tok(tok) + self.pos(torch.arange(tok.shape[1]))
        return self.head(self.mix(h).mean(1))


def _batch(n: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 7, (n, 3), generator=g), torch.randint(0, 2, (n,), generator=g)


def _n_hooks(model: nn.Module) -> int:
    # torch has no public count of a module's forward hooks; _forward_hooks is the registry.
    return sum(len(m._forward_hooks) for m in model.modules())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-300))


def _pos_shapes(model: PosModel) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    model.pos.register_forward_hook(lambda m, a, out: shapes.append(tuple(out.shape)))
    return shapes


def test_hooks_do_nothing_outside_the_clippers_forward():
    torch.manual_seed(0)
    model = PosModel().double()
    untouched = copy.deepcopy(model)
    x, y = _batch()
    clipper = make_clipper(model, "ghost")
    clipper(x, y, 0.5)  # plan, check, one clipping forward: the hooks are installed
    assert _n_hooks(model) > 0
    shapes = _pos_shapes(model)
    clipper(x, y, 0.5)
    assert shapes == [(5, 3, 4)]  # the clipping forward expands the shared output to the batch
    shapes.clear()
    with torch.no_grad():
        out = model(x)
    assert shapes == [(3, 4)]  # the user's forward: not expanded
    assert torch.equal(out, untouched(x))  # and bit for bit the unhooked model's output
    with torch.enable_grad():  # a training-style forward and backward: the model's own gradients
        model(x).sum().backward()
        untouched(x).sum().backward()
    for p, q in zip(model.parameters(), untouched.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    assert shapes == [(3, 4), (3, 4)]


def test_hooks_are_registered_once_not_per_step():
    model = PosModel().double()
    x, y = _batch()
    clipper = make_clipper(model, "ghost")
    clipper(x, y, 0.5)
    n = _n_hooks(model)
    assert n == len(clipper.plan_.units)
    for seed in range(4):
        clipper(*_batch(seed=seed), 0.5)
    assert _n_hooks(model) == n


def test_results_equal_the_loop_over_steps():
    model = PosModel().double()
    clipper = make_clipper(model, "ghost")
    for seed in range(3):  # the same hooks serve every step
        x, y = _batch(seed=seed)
        got, ref = clipper(x, y, 0.3), LoopClipper(model)(x, y, 0.3)
        assert _rel(got.norms, ref.norms) < RTOL
        for g, r in zip(got.grads, ref.grads, strict=True):
            assert _rel(g, r) < RTOL
            assert not g.requires_grad  # the recorded inputs are not detached: no graph may leak out


class OutsideForward(nn.Module):
    """Uses a Linear's weight outside the Linear's forward: the first-call check reroutes it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.lin(x) + nn.functional.linear(x, self.lin.weight))


def test_a_rerouted_plan_leaves_no_stale_hooks():
    model = OutsideForward().double()
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.randint(0, 2, (5,))
    clipper = make_clipper(model, "ghost")
    got = clipper(x, y, 0.5)
    assert any(u.name == "" for u in clipper.plan_.units)  # lin.weight went to a vmap over the model
    assert _n_hooks(model) == len(clipper.plan_.units)  # the checked plan's hooks only
    ref = LoopClipper(model)(x, y, 0.5)
    for g, r in zip(got.grads, ref.grads, strict=True):
        assert _rel(g, r) < RTOL


def test_closed_or_dropped_clippers_leave_no_hooks():
    model = PosModel().double()
    x, y = _batch()
    clipper = make_clipper(model, "ghost")
    clipper(x, y, 0.5)
    clipper.close()
    assert _n_hooks(model) == 0
    clipper(x, y, 0.5)  # still usable: the hooks come back with the next call
    assert _n_hooks(model) == len(clipper.plan_.units)
    auto = make_clipper(model, "auto")
    auto(x, y, 0.5)
    assert _n_hooks(model) == 2 * len(clipper.plan_.units)
    del clipper, auto
    gc.collect()
    assert _n_hooks(model) == 0


def test_a_refused_model_keeps_no_hooks(monkeypatch):
    model = PosModel().double()
    x, y = _batch()

    real = GhostClipper._check

    def disagree(self, plan, x, y):  # after a clipping forward has installed the hooks
        real(self, plan, x, y)
        raise clipping.GhostMismatchError("planted disagreement")

    clipper = GhostClipper(model)
    monkeypatch.setattr(GhostClipper, "_check", disagree)
    with pytest.raises(clipping.GhostMismatchError):
        clipper(x, y, 0.5)
    assert _n_hooks(model) == 0


def test_an_error_inside_the_clipping_forward_leaves_the_hooks_inactive():
    class Variable(PosModel):
        twice = False

        def forward(self, tok):
            h = self.tok(tok) + self.pos(torch.arange(tok.shape[1]))
            h = self.mix(h)
            if self.twice:
                h = self.mix(h)
            return self.head(h.mean(1))

    model = Variable().double()
    x, y = _batch()
    clipper = GhostClipper(model)
    clipper(x, y, 0.5)
    model.twice = True  # mix is now called more often than planned: the clipper refuses mid-forward
    with pytest.raises(clipping.GhostMismatchError):
        clipper(x, y, 0.5)
    shapes = _pos_shapes(model)
    with torch.no_grad():
        model(x)  # the user's forward afterwards: no error, nothing expanded
    assert shapes == [(3, 4)]


@pytest.mark.parametrize("method", ["ghost", "auto"])
def test_the_trainer_removes_its_hooks(monkeypatch, method):
    model = PosModel()
    x, y = _batch(n=16)
    config = TrainConfig(algo="dpsgd", steps=3, batch_size=4, lr=0.1, seed=0, dp=DPConfig(noise_multiplier=1.0))
    trainer = get_trainer("dpsgd")(config, PerfConfig(clipping=method))
    kept = []  # the clipper stays alive (as a caller's reference would keep it): no garbage collection
    make = type(trainer).make_clipper
    monkeypatch.setattr(type(trainer), "make_clipper", lambda self, m: kept.append(make(self, m)) or kept[-1])
    trainer.fit(model, x, y)
    assert kept and _n_hooks(model) == 0  # the returned model carries none of the clipper's hooks
