"""Users' own models under ``--backend jax``: is the clipped gradient sum the torch one?

For each model below (float64 weights and data, 9 examples, the clip norm halfway between the smallest and
the largest per-example norm so that both branches of the clip run), prints the largest relative difference
of the per-example norms and of the clipped sum between

* the torch loop clipper (``make_clipper(model, "loop")``: one example at a time, the project's reference),
* the JAX ``vmap(grad)`` path (:func:`dpaudit.training.jax_backend.clipped_sum`),
* the JAX ghost path (:func:`dpaudit.training.jax_backend.ghost_clipped_sum`, what the trainer runs for a plain
  Sequential of ghost-tapped layers; for a model run from its torch.fx graph with Linear, Conv2d or Embedding modules
  :func:`dpaudit.training.jax_backend.fx_ghost_clipped_sum`, "fx ghost"; a graph without them trains by the vmap
  path),

and whether the JAX forward pass gives torch's logits. Agreement means all three below 1e-6 (float64:
observed ~1e-15). Models that ``jax_forward`` refuses are listed with the first line of the refusal.

    PYTHONPATH=$PWD python benchmarks/jax_user_models.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import nn

from dpaudit.errors import InputError
from dpaudit.training import jax_backend as jb
from dpaudit.training.clipping import make_clipper
from tests.core import byo_models as byo

TOL = 1e-6  # relative, float64


def models() -> dict[str, nn.Module]:
    """Small users' models on (1, 8, 8) inputs with 3 classes (built under the caller's seed)."""

    class Residual(nn.Sequential):  # a Sequential whose forward adds a skip connection
        def forward(self, x):
            h = self[0](x)
            return self[3](h + self[2](self[1](h)))

    lin = nn.Linear(64, 64)
    return {
        "nested Sequential blocks": nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(64, 16), nn.Tanh()),
                                                  nn.Sequential(nn.Linear(16, 3))),
        "mlp, Linear without bias": nn.Sequential(nn.Flatten(), nn.Linear(64, 16, bias=False), nn.Tanh(),
                                                  nn.Linear(16, 3)),
        "Linear over the last axis of (B, 1, 8, 8)": nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Flatten(),
                                                                    nn.Linear(32, 3)),
        "GELU(approximate='tanh'), ELU(alpha=0.5)": nn.Sequential(nn.Flatten(), nn.Linear(64, 16),
                                                                  nn.GELU(approximate="tanh"), nn.Linear(16, 8),
                                                                  nn.ELU(alpha=0.5), nn.Linear(8, 3)),
        "GroupNorm on (B, C)": nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.GroupNorm(4, 16), nn.Tanh(),
                                             nn.Linear(16, 3)),
        "CNN: Conv2d without bias, GroupNorm, AvgPool2d(divisor_override=1)": nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.GroupNorm(2, 4), nn.ReLU(),
            nn.AvgPool2d(2, divisor_override=1), nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.Tanh(),
            nn.Flatten(), nn.Linear(32, 3)),
        "CNN with BatchNorm2d": nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 3)),
        "LayerNorm": nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.LayerNorm(16), nn.Linear(16, 3)),
        "Dropout": nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Dropout(0.1), nn.Linear(16, 3)),
        "residual Sequential subclass": Residual(nn.Flatten(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3)),
        "one Linear used twice": nn.Sequential(nn.Flatten(), lin, nn.Tanh(), lin, nn.Linear(64, 3)),
        "LayerNorm(bias=False), LeakyReLU, Identity, Flatten(2)": nn.Sequential(
            nn.Flatten(2), nn.LayerNorm(64, bias=False), nn.LeakyReLU(0.2), nn.Identity(), nn.Flatten(),
            nn.Linear(64, 3)),
        "residual CNN with GroupNorm (own nn.Module)": byo.residual_groupnorm_cnn(1, 3),
        "tied weights (tied_linear)": byo.tied_linear(64, 3),
    }  # fmt: skip


def relative(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def compare(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, clipping: bool = True) -> dict[str, float]:
    """Largest relative differences (max |a − b| / max |b| per array) of the JAX logits, and with ``clipping``
    of the vmap and ghost per-example norms and clipped sums, from torch's (the loop clipper's), float64."""
    names = [n for n, p in model.named_parameters()]
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        out = {"logits": relative(apply(params, xj), model(x).detach().numpy())}
        if not clipping:
            return out
        norms = make_clipper(model, "loop")(x, y, 1.0).norms.numpy()
        clip = float(norms.min() + norms.max()) / 2  # both branches of the clip run (distinct norms)
        loop = make_clipper(model, "loop")(x, y, clip)
        paths = [("vmap", jb.clipped_sum)]
        if getattr(apply, "ghost", False):
            paths.append(("ghost", jb.ghost_clipped_sum))
        if getattr(apply, "ghost_groups", ()):
            paths.append(("fx ghost", jb.fx_ghost_clipped_sum))
        for label, fn in paths:
            got, got_norms = fn(apply, params, xj, yj, clip)
            out[f"{label} norms"] = relative(got_norms, loop.norms.numpy())
            out[f"{label} sum"] = max(relative(got[n], g.numpy()) for n, g in zip(names, loop.grads, strict=True))
    return out


def main() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(9, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (9,), generator=g)
    torch.manual_seed(0)
    for name, model in models().items():
        model = model.double()
        try:
            r = compare(model, x, y)
        except InputError as e:
            print(f"{name}: refused: {str(e).split(':')[0]}")
            continue
        report(name, r)
    tokens = torch.randint(0, 10, (9, 7), generator=g).double()  # token ids as floats, as dpaudit's records
    for sdpa in (True, False):
        report(f"transformer block (sdpa={sdpa})", compare(byo.tiny_transformer(10, 3, sdpa=sdpa).double(), tokens, y))
    report("causal two-head block (mask buffer)", compare(byo.causal_transformer(10, 3).double(), tokens, y))
    encoder = byo.encoder_transformer(10, 7, 3).double()  # nn.TransformerEncoder, 2 layers, causal mask from T
    report("2-layer TransformerEncoder, causal (encoder_transformer)", compare(encoder, tokens.long(), y))


def report(name: str, r: dict[str, float]) -> None:
    verdict = "agree" if max(r.values()) < TOL else "DISAGREE"
    print(f"{name}: {verdict} " + ", ".join(f"{k} {v:.1e}" for k, v in r.items()))


if __name__ == "__main__":
    main()
