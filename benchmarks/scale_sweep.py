"""Wall time and peak RSS of dpaudit's commands on users' data at growing N (time and memory blow-ups).

Makes synthetic data under ``--dir`` (numpy, seed 0): CIFAR-shaped float32 images ``imgN.npz`` (N x 3 x 32 x 32,
10 classes) and int64 token ids ``tokN.npz`` (N x 128, vocabulary 30,000, 2 classes), then runs each command of
:data:`COMMANDS` at each N under ``/usr/bin/time -v`` and prints command, N, exit code, wall seconds and peak RSS
(MB). A tiny model (``logreg``; ``rnn`` for tokens), one epoch and 4 reference models keep the compute small, so
what grows is what the data costs. Compare the peak with the data's bytes (N x 12,288 for images): a peak far
above the torch process's ~400 MB plus a few copies of the data is a copy to find.

    OMP_NUM_THREADS=1 nice python benchmarks/scale_sweep.py --sizes 2000,8000,32000 --dir /tmp/scale
    python benchmarks/scale_sweep.py --sizes 500 --only train,attribute     # a smoke run

Run from the repository root (the commands are ``python -m dpaudit``); each needs the previous ``train``'s run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

# name -> dpaudit arguments ({d}: the data file, {r}: the run folder, {dir}: the scratch folder)
COMMANDS = {
    "train": "train --data {d} --model logreg --epochs 1 --out {r} --force",
    "train-canaries": "train --data {d} --model logreg --algo dpsgd --epsilon 8 --epochs 1 --canaries 200 "
    "--canary-kind mislabeled --allow-inconclusive --out {r}.dp --force",
    "mia": "attack mia {r} --attacks loss,lira --reference-models 4 --no-cache --json",
    "attribute": "attack attribute {r} --feature 5 --json",
    "inversion": "attack inversion {r} --classes 0,1 --iterations 50 --out {r}.inv --force --json",
    "audit-checkpoint": "audit checkpoint {r}.dp --attacks loss --json",
    "report": "report {r} --attacks loss --attribute 5 --inversion --format json --out {r}.rep --force --json",
    "audit-train": "audit train --data {d} --model logreg --algo dpsgd --epsilon 8 --epochs 1 --runs 20 "
    "--canary-kind mislabeled --allow-inconclusive --json",
}


def make_images(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, n)
    means = rng.normal(0, 0.3, (10, 3, 1, 1)).astype(np.float32)
    np.savez(path, X=rng.standard_normal((n, 3, 32, 32), dtype=np.float32) + means[y], y=y)


def make_tokens(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, n)
    X = rng.integers(0, 30000, (n, 128)).astype(np.int64)
    X[y == 1, :8] = rng.integers(0, 100, (int((y == 1).sum()), 8))  # something to learn
    np.savez(path, X=X, y=y)


def timed(args: list[str]) -> tuple[int, float, int]:
    """Exit code, wall seconds and peak RSS (MB) of ``python -m dpaudit --quiet ARGS``."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "dpaudit", "--quiet", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", p.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    h, m, s = (float(g or 0) for g in wall.groups()) if wall else (0.0, 0.0, float("nan"))
    return p.returncode, 3600 * h + 60 * m + s, int(rss.group(1)) // 1024 if rss else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2000,8000,32000", help="record counts N, comma-separated")
    ap.add_argument("--dir", default="/tmp/scale", help="scratch folder for the data and runs")
    ap.add_argument("--only", default=",".join(COMMANDS), help="commands to run, comma-separated")
    ap.add_argument("--tokens", action="store_true", help="token data (rnn) instead of images")
    args = ap.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    print("command\tN\texit\twall_s\tpeak_rss_MB")
    for n in (int(s) for s in args.sizes.split(",")):
        kind = "tok" if args.tokens else "img"
        data = root / f"{kind}{n}.npz"
        if not data.exists():
            (make_tokens if args.tokens else make_images)(data, n)
        run = root / "runs" / f"{kind}{n}"
        for name in args.only.split(","):
            text = COMMANDS[name].format(d=data, r=run, dir=root)
            if args.tokens:
                text = text.replace("--model logreg", "--model rnn")
            code, wall, rss = timed(text.split())
            print(f"{name}\t{n}\t{code}\t{wall:.1f}\t{rss}", flush=True)


if __name__ == "__main__":
    main()
