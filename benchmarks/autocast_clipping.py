"""How far a record's clipped gradient can exceed C under ``--autocast bf16`` in dpaudit's own DP-SGD clippers.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/autocast_clipping.py

For each model (an MLP, a conv net with GroupNorm and a residual block, a small transformer with
``nn.TransformerEncoderLayer``, a tiny ViT) and each exact method (loop, vmap, ghost, auto), a batch of B = 16
records is clipped at C = 1e-3 (far below every norm, so every record is clipped) with and without
``autocast=torch.bfloat16``. Each record's clipped gradient *as it enters the float32 sum* is isolated by
running the same batch with every other record's clip factor set to 0 (the batch's own norms and factors, the
batch's own per-example gradients; Σ_j c_j g_j with c_j = 0 for j ≠ i is c_i g_i exactly, since 0·g_j = 0 and x + 0
= x in floating point), and its norm is computed in float64. Printed: max over records and seeds of ‖c_i g_i‖/C − 1.
(Opacus under autocast reached 1.0064–1.0096·C: benchmarks/hook_loops.py --only autocast.) About 1 minute.
"""

from __future__ import annotations

import torch
from torch import nn

from dpaudit.training.clipping import Clipper, make_clipper

B, C = 16, 1e-3


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))

    def forward(self, x):
        return self.net(x)


class SmallTransformer(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 32, T: int = 12) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.block = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = self.emb(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        return self.head(self.block(h).mean(1))


def _inner(clipper: Clipper) -> Clipper:
    return getattr(clipper, "chosen_", None) or clipper


def clipped_one_by_one(clipper: Clipper, x, y) -> list[float]:
    """‖c_i g_i‖/C (float64) for every record i of the batch, each from the clipper's own batched computation."""
    clipper(x, y, C)  # the first call: auto's choice, the per-record checks
    impl = _inner(clipper)
    if impl.method == "loop":  # one record at a time: its clipped gradient is the batch-of-one sum
        out = []
        for i in range(len(x)):
            g = impl(x[i : i + 1], y[i : i + 1], C).grads
            out.append(float(torch.sqrt(sum(t.double().square().sum() for t in g))) / C)
        return out
    factors = impl._clip_factors
    out = []
    for i in range(len(x)):

        def only_i(norms, clip, i=i):
            c = factors(norms, clip)
            keep = torch.zeros_like(c)
            keep[i] = 1
            return c * keep

        impl._clip_factors = only_i
        try:
            g = impl._compute(x, y, C).grads
        finally:
            del impl._clip_factors
        out.append(float(torch.sqrt(sum(t.double().square().sum() for t in g))) / C)
    return out


def cases(seed: int):
    from tests.training.test_clipping_architectures import ResidualGroupNormCNN, TinyViT

    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    yield "MLP", MLP(), torch.randn(B, 20, generator=g) * 3
    yield "GroupNorm CNN", ResidualGroupNormCNN(), torch.randn(B, 3, 8, 8, generator=g)
    yield "transformer", SmallTransformer(), torch.randint(0, 50, (B, 12), generator=g)
    yield "tiny ViT", TinyViT(), torch.randn(B, 3, 4, 4, generator=g)


def main() -> None:
    torch.set_num_threads(1)
    rows: dict[tuple[str, str, str], float] = {}
    for seed in range(3):
        for name, model, x in cases(seed):
            y = torch.randint(0, 3, (B,), generator=torch.Generator().manual_seed(seed + 100))
            for method in ("loop", "vmap", "ghost", "auto"):
                for prec, ac in (("float32", None), ("bf16", torch.bfloat16)):
                    worst = max(clipped_one_by_one(make_clipper(model, method, autocast=ac), x, y))
                    key = (name, method, prec)
                    rows[key] = max(rows.get(key, -1.0), worst - 1)
    print("| model | method | float32: max ‖c_i g_i‖/C − 1 | bf16 autocast: max ‖c_i g_i‖/C − 1 |")
    print("|---|---|---|---|")
    for name, method, prec in rows:
        if prec == "float32":
            print(f"| {name} | {method} | {rows[name, method, 'float32']:.2e} | {rows[name, method, 'bf16']:.2e} |")


if __name__ == "__main__":
    main()
