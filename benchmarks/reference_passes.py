"""Rows a reference model sends through the model, and the seconds of training M of them, on a user's run.

Runs ``attacks.reference.train_models`` for ``--models`` LiRA reference models of the run ``--run`` (drawn as
``run_mia`` draws them: the candidates plus aux, each model on a random half) into a fresh cache, in a fresh process
with ``--tree`` first on PYTHONPATH, and prints the rows that went through ``predict_logits`` (every evaluation pass:
the checkpoint's metrics and the cached logits), the wall seconds, the peak RSS and a sha256 of the logits (equal
digests: the same logits bit for bit). Train the run first, e.g. on ``benchmarks/scale_sweep.py``'s images:

    python -m dpaudit train --data /tmp/scale/img50000.npz --model logreg --epochs 1 --out /tmp/scale/r0
    OMP_NUM_THREADS=1 nice python benchmarks/reference_passes.py --run /tmp/scale/r0 --models 4
    python benchmarks/reference_passes.py --run /tmp/scale/r0 --tree /tmp/before   # another tree (`git archive`)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import hashlib, json, resource, sys, time
import numpy as np
import dpaudit.checkpoint as checkpoint
import dpaudit.training.run as run_module
from attacks.lira import balanced_membership
from attacks.mia import candidates, reference_population
from attacks.reference import Recipe, seeds_for, train_models

run_dir, models, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
original = checkpoint.predict_logits

def counted(model, X, *a, **k):
    rows.append(len(X))
    return original(model, X, *a, **k)

checkpoint.predict_logits = counted
run_module.predict_logits = counted
run = checkpoint.load_run(run_dir)
recipe = Recipe.from_run(run)
ids, _ = candidates(run)
population = reference_population(ids, run.splits.aux, len(run.splits.members), seed=0)
in_pop = balanced_membership(len(population), models, seed=np.random.default_rng([0, 1]))
sets = [population[in_pop[:, j]] for j in range(models)]
start = time.perf_counter()
logits = train_models(recipe, sets, seeds_for(0, "reference", models), cache_dir=cache)
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out = {"rows_evaluated": sum(rows), "passes": len(rows), "records": len(recipe.dataset), "wall_s": round(wall, 1),
       "peak_mb": round(peak), "logits_sha256": hashlib.sha256(np.ascontiguousarray(logits).tobytes()).hexdigest()[:16]}
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a run directory (dpaudit train --out)")
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--tree", type=Path, default=Path.cwd(), help="source tree measured (default: this one)")
    a = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(a.tree.resolve())}
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(a.run.resolve()), str(a.models), cache],
            check=True, capture_output=True, text=True, env=env, cwd=cache,  # not this tree's cwd: sys.path[0]
        )  # fmt: skip
    print(f"{a.tree}: {json.loads(out.stdout.strip().splitlines()[-1])}")


if __name__ == "__main__":
    main()
