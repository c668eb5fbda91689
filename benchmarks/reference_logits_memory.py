"""Peak memory of LiRA + RMIA's reference-model signals at users' scale: M reference models x N records x k classes.

Trains a tiny target (``logreg``, 1 epoch) on synthetic tabular data of N records and k classes (numpy, seed 0,
32 features: the data is small on purpose, so what shows is the reference models' logits), then runs
``run_mia(run, ["lira", "rmia"], reference_models=M)`` in a fresh process whose reference-model cache is stood in
for: ``attacks.reference._read_cached`` returns float64 logits of shape (N, k) drawn from the entry's key (the same
for every tree), so no model is trained and every model is read "from the cache", as a second audit of a run would.
Prints the peak RSS (``ru_maxrss``), the wall seconds and a sha256 of the LiRA and RMIA scores (equal digests: the
same scores bit for bit).

    OMP_NUM_THREADS=1 nice python benchmarks/reference_logits_memory.py --n 50000 --classes 10,100 --models 64
    python benchmarks/reference_logits_memory.py --tree /tmp/before    # another source tree (e.g. `git archive`)

Run from the repository root; ``--tree`` is put first on PYTHONPATH of the measured process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

CHILD = r"""
import hashlib, json, resource, sys, time
import numpy as np
import attacks.reference as reference
from attacks.mia import run_mia
from dpaudit.checkpoint import load_run

run_dir, models, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def stand_in(path, shape):  # a cached entry's logits, drawn from its key (the entry directory's name)
    rng = np.random.default_rng(int(path.name[:15], 16))
    return rng.standard_normal(shape)

reference._read_cached = stand_in
run = load_run(run_dir)
start = time.perf_counter()
res = run_mia(run, ["lira", "rmia"], reference_models=models, cache_dir=cache, n_bootstrap=0)
wall = time.perf_counter() - start
digest = hashlib.sha256(b"".join(np.asarray(r.scores, np.float64).tobytes() for r in res)).hexdigest()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"peak_mb": round(peak), "wall_s": round(wall, 1), "scores_sha256": digest[:16]}))
"""


def make_data(path: Path, n: int, classes: int) -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, classes, n)
    centres = rng.normal(0, 1, (classes, 32)).astype(np.float32)
    np.savez(path, X=rng.standard_normal((n, 32), dtype=np.float32) + centres[y], y=y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--classes", default="10,100")
    ap.add_argument("--models", type=int, default=64)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/reference_logits_memory"))
    ap.add_argument("--tree", type=Path, default=Path.cwd(), help="source tree measured (default: this one)")
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(a.tree.resolve())}
    for k in (int(c) for c in a.classes.split(",")):
        data, run = a.dir / f"tab{a.n}_{k}.npz", a.dir / f"run{a.n}_{k}"
        if not data.exists():
            make_data(data, a.n, k)
        if not run.exists():  # the target, trained once by this tree (its checkpoint reads alike in every tree)
            train = ["train", "--data", str(data), "--model", "logreg", "--epochs", "1", "--out", str(run)]
            subprocess.run([sys.executable, "-m", "dpaudit", "--quiet", *train], check=True, env=env)
        cache = a.dir / "cache"
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(run), str(a.models), str(cache)],
            check=True, capture_output=True, text=True, env=env, cwd=a.dir,
        )  # fmt: skip
        got = json.loads(out.stdout.strip().splitlines()[-1])
        dense = a.models * a.n * k * 8 / 2**20
        print(f"M={a.models} N={a.n} k={k}: dense logits {dense:,.0f} MB; {got}", flush=True)


if __name__ == "__main__":
    main()
