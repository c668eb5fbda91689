"""Bit-for-bit comparison of the clipped sums and trained parameters of two source trees.

    PYTHONPATH=TREE_A python benchmarks/clipping_bitwise.py dump A.npz
    PYTHONPATH=TREE_B python benchmarks/clipping_bitwise.py dump B.npz
    python benchmarks/clipping_bitwise.py compare A.npz B.npz

For a change meant to move memory or time but not results (issue 26, memory): every workload of
dpsgd_throughput.py at batch 6 (small sizes), float32 and float64, clippers ``ghost``, ``auto`` and
ghost with the conv ``patches`` route; three calls each (clipped sums and norms recorded) interleaved
with three trainer steps (``set_private_gradients`` with noise σ = 1: a plain batch, a physical cap of
4, a padded chunk) and SGD updates; then the parameters. Arrays go to a NumPy ``.npz`` (no pickle).
"""

from __future__ import annotations

import copy
import sys

import numpy as np
import torch
from dpsgd_throughput import workloads

from dpaudit.training.clipping import GhostClipper, make_clipper
from dpaudit.training.dpsgd import set_private_gradients


def dump(path: str) -> None:
    arrays: dict[str, np.ndarray] = {}
    for dtype in (torch.float32, torch.float64):
        for name, (model, x, y) in workloads(6, torch.device("cpu"), "small").items():
            model = model.to(dtype)
            x = x.to(dtype) if x.is_floating_point() else x
            for method in ("ghost", "auto", "patches"):
                m = copy.deepcopy(model)
                clipper = GhostClipper(m, conv_route="patches") if method == "patches" else make_clipper(m, method)
                opt = torch.optim.SGD(clipper.params, lr=0.1)
                gen = torch.Generator().manual_seed(1)
                tag = f"{name}|{dtype}|{method}"
                for step in range(3):
                    r = clipper(x, y, 1.0)
                    for i, g in enumerate(r.grads):
                        arrays[f"{tag}|s{step}|sum{i}"] = g.detach().numpy().copy()
                    arrays[f"{tag}|s{step}|norms"] = r.norms.detach().numpy().copy()
                    set_private_gradients(
                        clipper,
                        x,
                        y,
                        torch.tensor([0, 2, 3, 5, 1]),
                        clip=1.0,
                        noise_std=1.0,
                        batch_size=6,
                        max_physical_batch=4 if step == 1 else None,
                        generator=gen,
                        pad=step == 2,
                    )
                    opt.step()
                for i, p in enumerate(clipper.params):
                    arrays[f"{tag}|param{i}"] = p.detach().numpy().copy()
    np.savez(path, **arrays)
    print(f"{len(arrays)} arrays -> {path}")


def compare(a_path: str, b_path: str) -> int:
    a, b = np.load(a_path, allow_pickle=False), np.load(b_path, allow_pickle=False)
    if sorted(a.files) != sorted(b.files):
        print("the two dumps hold different arrays")
        return 1
    bad = [k for k in a.files if a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes()]
    print(f"{len(a.files)} arrays compared, {len(bad)} differ bit for bit")
    for k in bad[:20]:
        d = float(np.abs(a[k].astype(np.float64) - b[k]).max())
        print(f"  {k}: max |difference| {d:.3g}, relative {d / max(float(np.abs(a[k]).max()), 1e-300):.3g}")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
