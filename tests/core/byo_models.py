"""Users' own model factories for tests/core/test_byo.py (imported by dpaudit as ``tests.core.byo_models:NAME``)."""

from __future__ import annotations

from torch import nn

NOT_CALLABLE = 3


class ResidualMLP(nn.Module):
    """Not a zoo model: a residual MLP, x -> head(h + f(h)), h = inp(x)."""

    def __init__(self, d: int, n_classes: int, width: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d, width)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
        self.head = nn.Linear(width, n_classes)

    def forward(self, x):
        h = self.inp(x.flatten(1))
        return self.head(h + self.mlp(h))


def residual_mlp(d: int, n_classes: int, width: int = 16) -> nn.Module:
    return ResidualMLP(d, n_classes, width)


def with_batchnorm(d: int, n_classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, 8), nn.BatchNorm1d(8), nn.Linear(8, n_classes))


def not_a_module(d: int, n_classes: int):
    return {"weight": [0.0] * d}


def wrong_logits(d: int, n_classes: int) -> nn.Module:
    return nn.Linear(d, n_classes + 1)


def raises(d: int, n_classes: int) -> nn.Module:
    raise RuntimeError("out of coffee")


def train_residual(X, y, seed: int):
    """A plug-in trainer (dpaudit.plugins' contract) for ``residual_mlp(6, 2)``: plain full-batch Adam."""
    import torch
    from torch.nn import functional as F

    torch.manual_seed(seed)
    model = residual_mlp(X.shape[1], 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    for _ in range(20):
        opt.zero_grad()
        F.cross_entropy(model(Xt), yt).backward()
        opt.step()
    return model.state_dict()
