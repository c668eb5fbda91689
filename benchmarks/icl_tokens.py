"""DP-ICL's in-context predictors on token sequences: Euclidean distances between raw token ids (before) against
bags of tokens (after; dpaudit.training.icl), and whether renaming the vocabulary changes the answers.

On synthetic-tokens data (each class draws its tokens from its own Dirichlet(0.3) distribution over the
vocabulary) with the DP-ICL recipe of `dpaudit train --algo dp-icl` (20 teachers of --shots exemplars, 100
public queries from the auxiliary split, GNMax calibrated to ε at δ = 1e-5), prints a Markdown table of
the mean teacher accuracy, the noise-free plurality vote's accuracy and the noisy answers' accuracy (mean of
5 noise seeds) at ε = 1 and 8, each for the raw ids read as coordinates and for bags of tokens, and the share
of queries whose teacher votes change when the vocabulary's ids are permuted. No wall-clock numbers.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/icl_tokens.py
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder is sys.path[0], and benchmarks/attacks.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402

from dpaudit.aggregation import AggregatorConfig, aggregate, calibrate_aggregator, vote_histogram  # noqa: E402
from dpaudit.data import DEFAULT_FRACTIONS, load_dataset, make_splits  # noqa: E402
from dpaudit.training.icl import make_predictor  # noqa: E402
from dpaudit.training.pate import AggregationConfig, icl_votes, query_indices, teacher_parts  # noqa: E402

DELTA = 1e-5


def main() -> None:
    print("| data | predictor | shots | representation | teacher acc. | vote acc. (no noise) | answer acc. ε=8 "
          "| answer acc. ε=1 | votes changed by renaming ids |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for vocab, classes in ((50, 4), (1000, 4)):
        data = f"synthetic-tokens:n=3000,length=20,vocab={vocab},classes={classes},seed=0"
        ds = load_dataset(data)
        splits = make_splits(len(ds), 0, DEFAULT_FRACTIONS)  # as `dpaudit train` splits
        for shots in (4, 16):
            cfg = AggregationConfig(
                algo="dp-icl", teachers=20, shots=shots, queries=100, aggregator=AggregatorConfig("gnmax", sigma=1.0)
            )
            parts, q_idx = teacher_parts(len(splits.members), cfg), query_indices(splits, cfg)
            ex_X, ex_y, q_X, true = ds.X[splits.members], ds.y[splits.members], ds.X[q_idx], ds.y[q_idx]
            rename = np.random.default_rng(1).permutation(ds.vocab_size)  # ids are labels: renamed, the same data
            for name in ("knn", "prototype"):
                for tokens in (False, True):
                    pred = make_predictor(name, ds.n_classes, tokens=tokens)
                    votes = icl_votes(pred, ex_X, ex_y, parts, q_X)
                    renamed = icl_votes(pred, rename[ex_X], ex_y, parts, rename[q_X])
                    hist = vote_histogram(votes, ds.n_classes)
                    acc = []
                    for eps in (8.0, 1.0):
                        agg = calibrate_aggregator(
                            AggregatorConfig("gnmax", sigma=1.0), target_epsilon=eps, delta=DELTA,
                            n_queries=len(q_idx), n_classes=ds.n_classes,
                        )  # fmt: skip
                        acc.append(np.mean([np.mean(aggregate(hist, agg, s) == true) for s in range(5)]))
                    print(f"| vocab {vocab}, {classes} classes | {name} | {shots} | "
                          f"{'bag of tokens' if tokens else 'raw ids (before)'} | {np.mean(votes == true):.3f} | "
                          f"{np.mean(hist.argmax(1) == true):.3f} | {acc[0]:.3f} | {acc[1]:.3f} | "
                          f"{np.mean((votes != renamed).any(0)):.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
