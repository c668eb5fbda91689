"""Write a CIFAR-10-shaped synthetic dataset as ``OUT/X.npy`` (float32, n x 3 x size x size) and
``OUT/y.npy`` (int64 labels 0..9), a block of rows at a time (never the whole array in memory).

Labels: uniform over 10 classes. Images, a fixed rule per class (from ``--seed``): i.i.d. N(0, 1)
pixel noise plus the class's 3 x 4 x 4 texture, tiled over the image at a random shift, with amplitude
``AMPLITUDE``. The class is visible to a convolution anywhere in the image (translation invariant, as
CIFAR-10's classes are), so a CNN learns it; DP-SGD at small epsilon learns it more slowly.

    python -m examples.byo_cifar_shaped.make_data --n 50000 --size 32 --out data/cifar_shaped
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

CLASSES = 10
TILE = 4
AMPLITUDE = 1.0


def textures(seed: int) -> np.ndarray:
    """The fixed class textures, (CLASSES, 3, TILE, TILE), unit variance per texture."""
    t = np.random.default_rng([seed, 1]).standard_normal((CLASSES, 3, TILE, TILE))
    return (t / t.std(axis=(1, 2, 3), keepdims=True)).astype(np.float32)


def images(y: np.ndarray, size: int, T: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    X = rng.standard_normal((len(y), 3, size, size), dtype=np.float32)
    reps = size // TILE
    for i, (label, dy, dx) in enumerate(zip(y, *rng.integers(0, TILE, size=(2, len(y))), strict=True)):
        X[i] += AMPLITUDE * np.roll(np.tile(T[label], (1, reps, reps)), (int(dy), int(dx)), axis=(1, 2))
    return X


def write(out: Path, n: int, size: int, seed: int = 0, block: int = 4096) -> Path:
    if size % TILE:
        raise SystemExit(f"--size must be a multiple of {TILE}")
    out.mkdir(parents=True, exist_ok=True)
    X = np.lib.format.open_memmap(out / "X.npy", mode="w+", dtype=np.float32, shape=(n, 3, size, size))
    y = np.empty(n, dtype=np.int64)
    T = textures(seed)
    rng = np.random.default_rng([seed, 0])
    for s in range(0, n, block):
        labels = rng.integers(0, CLASSES, size=min(block, n - s))
        X[s : s + len(labels)] = images(labels, size, T, rng)
        y[s : s + len(labels)] = labels
    X.flush()
    del X
    np.save(out / "y.npy", y)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=50_000, help="number of records [50000]")
    p.add_argument("--size", type=int, default=32, help="image height and width [32]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="directory to write X.npy and y.npy into")
    a = p.parse_args(argv)
    write(a.out, a.n, a.size, a.seed)
    print(f"wrote {a.out}/X.npy ({a.n} x 3 x {a.size} x {a.size} float32) and {a.out}/y.npy")


if __name__ == "__main__":
    main()
