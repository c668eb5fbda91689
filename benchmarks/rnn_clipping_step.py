"""One DP-SGD step on a text classifier built on torch's own ``nn.LSTM`` / ``nn.GRU`` (not the zoo's
Linear-cell RecurrentLayer): ``auto`` clipping (now: ghost, the recurrent module's per-example
gradients by recomputing the recurrence), the one-example loop (what ``auto`` fell back to before),
against the non-private step measured in the same run.

    .venv/bin/python benchmarks/rnn_clipping_step.py [--threads 1] [--batch 64] [--rounds 5]

Model: Embedding(100, 32) -> nn.LSTM(32, 64, batch_first=True) (or nn.GRU) -> Linear on h_n, tokens of
length T = 32. The steps are those of benchmarks/dpsgd_throughput.py (gather, clip, noise, update),
each method on its own copy of the model, in interleaved rounds; the table shows the median step
time and its ratio to the non-private step. Run it on an older tree (PYTHONPATH) to see ``auto``'s
choice there (``describe`` is printed).
"""

from __future__ import annotations

import argparse
import copy

import torch
from dpsgd_throughput import measure, nonprivate_step, ours_step
from torch import nn


class TextRNN(nn.Module):
    def __init__(self, cell: type[nn.RNNBase], vocab: int = 100, emb: int = 32, hidden: int = 64, k: int = 2) -> None:
        super().__init__()
        self.emb, self.rnn, self.head = (
            nn.Embedding(vocab, emb),
            cell(emb, hidden, batch_first=True),
            nn.Linear(hidden, k),
        )

    def forward(self, tok):
        _, h = self.rnn(self.emb(tok))
        h = h[0] if isinstance(h, tuple) else h  # LSTM: (h_n, c_n)
        return self.head(h[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for cell in (nn.LSTM, nn.GRU):
        torch.manual_seed(0)
        model = TextRNN(cell)
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, 100, (args.batch, args.length), generator=g)
        y = torch.randint(0, 2, (args.batch,), generator=g)
        plans: dict = {}
        steps = {
            "non-private": nonprivate_step(copy.deepcopy(model), x, y),
            "auto": ours_step(copy.deepcopy(model), x, y, "auto", plans),
            "loop": ours_step(copy.deepcopy(model), x, y, "loop"),
        }
        med = measure(steps, args.rounds, dict.fromkeys(steps, 1), torch.device("cpu"))[0]  # interleaved rounds
        print(
            f"{cell.__name__}: B={args.batch}, T={args.length}, {args.threads} thread(s), "
            f"median of {args.rounds} rounds"
        )
        print(f"  auto chose: {plans['auto'].describe()}")
        for n, t in med.items():
            print(f"  {n:12s} {t * 1e3:9.1f} ms   x{t / med['non-private']:6.1f} non-private")
        print(f"  loop / auto: {med['loop'] / med['auto']:.1f}")


if __name__ == "__main__":
    main()
