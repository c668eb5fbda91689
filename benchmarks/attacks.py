"""LiRA wall time: 16 reference models on the digits MLP, 1 worker against N workers, in the same run.

    .venv/bin/python benchmarks/attacks.py                 # target: mlp --hidden 256 --epochs 100 --lr 0.1
    .venv/bin/python benchmarks/attacks.py --workers 2 --reference-models 16 --epochs 100

Each timing trains every reference model from scratch (a fresh cache directory per run) and includes
scoring and evaluation. The ratio is time(1 worker) / time(N workers); the ideal is N on N idle cores.
The scores must be identical for both (one torch thread per job), which the script checks.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Run as a script, this file's folder is sys.path[0] and its name would shadow the ``attacks`` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from dpaudit.validation import available_cores

    ap.add_argument("--workers", type=int, default=min(2, available_cores()))
    ap.add_argument("--reference-models", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args()

    from attacks.mia import run_mia
    from dpaudit.checkpoint import load_run
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        ds = load_dataset("digits")
        spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=10, hidden=(args.hidden,))
        config = TrainConfig(epochs=args.epochs, batch_size=64, lr=0.1, seed=0)
        train_run(ds, spec, config, out=tmp_path / "target")
        run = load_run(tmp_path / "target")
        print(
            f"LiRA (online), {args.reference_models} reference models, digits MLP hidden {args.hidden}, "
            f"{args.epochs} epochs; {available_cores()} cores"
        )
        times, scores = {}, {}
        for w in (1, args.workers):
            t0 = time.perf_counter()
            (res,) = run_mia(
                run,
                ["lira"],
                reference_models=args.reference_models,
                workers=w,
                cache_dir=tmp_path / f"cache-{w}",
                n_bootstrap=0,
            )
            times[w] = time.perf_counter() - t0
            scores[w] = res.scores
            print(
                f"workers={w}: {times[w]:7.1f} s   AUC {res.metrics['auc']:.3f}  "
                f"TPR@1%FPR {res.metrics['tpr_at_fpr']['0.01']:.3f}"
            )
        identical = np.array_equal(scores[1], scores[args.workers])
        print(f"speed-up {args.workers} workers / 1 worker: {times[1] / times[args.workers]:.2f}x; "
              f"identical scores: {identical}")  # fmt: skip


if __name__ == "__main__":
    main()
