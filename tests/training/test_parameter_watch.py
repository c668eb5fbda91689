"""A training forward pass that modifies a trainable parameter in place is refused by every clipper.

DP-SGD's analysis covers θ_{t+1} = θ_t − η·(Σ clip(g_i) + noise)/B only (Abadi et al. 2016, Alg. 1): a change
of θ made inside ``forward`` from the batch (``F.embedding(..., max_norm=...)`` renormalises exactly the rows
the batch looks up) is released without noise. ``nn.Embedding(max_norm=...)`` is refused by
``check_private_layers`` before anything runs; the functional form and hand-written in-place edits are only
visible while the model runs: :class:`dpaudit.models.ParameterWatch`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpaudit.errors import InputError
from dpaudit.models import ParameterWatch
from dpaudit.training.clipping import make_clipper

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


class FunctionalMaxNorm(nn.Module):
    """A token model whose embedding is the functional call with max_norm (not an nn.Embedding)."""

    def __init__(self, max_norm: float) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(10, 4))
        self.head = nn.Linear(4, 3)
        self.max_norm = max_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.embedding(x, self.table, max_norm=self.max_norm).mean(1))


class ClampThroughData(nn.Module):
    """Clamps its weight through ``.data`` in forward: no version-counter bump, only the values move."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lin.weight.data.clamp_(-0.1, 0.1)
        return self.lin(x)


class LateEdit(nn.Module):
    """Modifies its bias in place (under no_grad) once ``edit`` is set: after the first call's checks."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.edit = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.edit:
            with torch.no_grad():
                self.lin.bias.mul_(1.0)  # the values stay: only the version counter shows it
        return self.lin(x)


def tokens(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 10, (n, 5), generator=g), torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize("method", ["auto", "loop"])
def test_functional_max_norm_is_refused_even_when_no_row_is_renormalised(method):
    """max_norm = 100 exceeds every row's norm (≈ 2 for 4 N(0, 1) entries): the values do not move, yet the
    renormalisation ran and would shrink a rare token's row once it grows: the version counter says so.
    (ghost and vmap cannot batch ``embedding_renorm_`` and refuse the model on their own.)"""
    torch.manual_seed(0)
    model = FunctionalMaxNorm(max_norm=100.0)
    before = model.table.detach().clone()
    x, y = tokens()
    with pytest.raises(InputError, match=r"^parameter table was modified in place during the training forward"):
        make_clipper(model, method)(x, y, 1.0)
    assert torch.equal(model.table.detach(), before)  # so only the version counter can tell


@pytest.mark.parametrize("method", ["auto", "ghost", "vmap", "loop"])
def test_a_write_through_data_is_caught_by_the_values(method):
    torch.manual_seed(0)
    model = ClampThroughData()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    with pytest.raises(InputError, match=r"^parameter lin\.weight was modified in place"):
        make_clipper(model, method)(x, y, 1.0)


@pytest.mark.parametrize("method", ["ghost", "loop"])
def test_an_edit_after_the_first_call_is_caught_when_it_happens(method):
    torch.manual_seed(0)
    model = LateEdit()
    clipper = make_clipper(model, method)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    clipper(x, y, 1.0)  # the first call: values compared, versions too
    clipper(x, y, 1.0)
    model.edit = True
    with pytest.raises(InputError, match=r"^parameter lin\.bias was modified in place"):
        clipper(x, y, 1.0)


def test_a_model_that_leaves_its_parameters_alone_trains_and_tied_weights_are_not_flagged():
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied: one parameter, reached twice
    model = nn.Sequential(emb, nn.Flatten(), nn.Linear(20, 4), nn.ReLU(), nn.Linear(4, 10))
    x, y = tokens()
    for method in ("auto", "loop"):
        clipper = make_clipper(model, method)
        for _ in range(2):
            clipper(x, y, 1.0)


def test_the_watch_reports_the_first_moved_parameter_by_name():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    params = list(model.parameters())
    watch = ParameterWatch(params, copy_values=False)
    watch.check(model)  # nothing moved
    with torch.no_grad():
        params[2].add_(0.0)
    with pytest.raises(InputError, match=r"^parameter 1\.weight was modified"):
        watch.check(model)


def test_the_dp_trainer_refuses_the_functional_max_norm_model():
    from dpaudit.training.config import DPConfig, TrainConfig
    from dpaudit.training.dpsgd import DPSGDTrainer

    torch.manual_seed(0)
    model = FunctionalMaxNorm(max_norm=100.0)
    x, y = tokens(16)
    config = TrainConfig(algo="dpsgd", steps=2, batch_size=8, dp=DPConfig(noise_multiplier=1.0, clip=1.0))
    with pytest.raises(InputError, match=r"parameter table was modified in place"):
        DPSGDTrainer(config).fit(model, x, y)


class Noisy(nn.Module):
    """Warns on every forward call: a note of the user's own that must still reach them."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import warnings

        warnings.warn("a note from the user's forward", UserWarning, stacklevel=2)
        return self.lin(x)


def test_auto_says_the_warnings_of_the_method_it_chose_only():
    """`--clipping auto` probes ghost, vmap, loop: torch's "no batching rule" note from a vmap probe that then
    fails is not the user's concern (before: it printed above the one-line error); the chosen method's are."""
    import warnings

    torch.manual_seed(0)
    x, y = tokens()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(InputError, match="parameter table was modified in place"):
            make_clipper(FunctionalMaxNorm(max_norm=100.0), "auto")(x, y, 1.0)
    assert not [w for w in said if "batching rule" in str(w.message)], [str(w.message) for w in said]
    with pytest.warns(UserWarning, match="a note from the user's forward"):
        make_clipper(Noisy(), "auto")(torch.randn(6, 4), torch.randint(0, 3, (6,)), 1.0)


def test_a_frozen_parameter_changed_in_forward_is_caught_too():
    """A frozen (requires_grad=False) table renormalised by F.embedding(max_norm) is saved with the model and moves
    with the data just the same: not a trained parameter, still released."""
    torch.manual_seed(0)
    model = FunctionalMaxNorm(max_norm=100.0)
    model.table.requires_grad_(False)  # a frozen embedding, a trainable head
    x, y = tokens()
    with pytest.raises(InputError, match=r"^parameter table was modified in place"):
        make_clipper(model, "loop")(x, y, 1.0)
