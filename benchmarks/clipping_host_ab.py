"""Host (thread CPU) time of one ghost clipping call: another tree's ``clipping.py`` against this one's.

    python benchmarks/clipping_host_ab.py OTHER/dpaudit/training/clipping.py [--batch 2] [--models cnn,cifar-gn]

Both ``GhostClipper`` classes run in one process on copies of the same model and batch, alternated
(15 rounds of 20 calls each), so the machine's load hits both alike; the median thread CPU time per call
is what a GPU step's host would pay (at batch 2 the arithmetic is negligible). Workloads: those of
dpsgd_throughput.py at small size.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import sys
import time

import torch
from dpsgd_throughput import workloads

from dpaudit.training import clipping


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", help="path of the other tree's dpaudit/training/clipping.py")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--models", default="cnn,cifar-gn,transformer,transformer-mha,tied")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("clipping_other", args.other)
    other = importlib.util.module_from_spec(spec)
    sys.modules["clipping_other"] = other  # dataclasses look their module up
    spec.loader.exec_module(other)
    torch.set_num_threads(1)
    for name in args.models.split(","):
        model, x, y = workloads(args.batch, torch.device("cpu"), "small")[name]
        clippers = {"other": other.GhostClipper(copy.deepcopy(model)), "this": clipping.GhostClipper(model)}
        for c in clippers.values():
            for _ in range(5):  # the plan, then warm
                c(x, y, 1.0)
        ms: dict[str, list[float]] = {k: [] for k in clippers}
        for _ in range(args.rounds):
            for k, c in clippers.items():
                t = time.thread_time()
                for _ in range(20):
                    c(x, y, 1.0)
                ms[k].append((time.thread_time() - t) / 20 * 1e3)
        a, b = (statistics.median(ms[k]) for k in ("other", "this"))
        print(f"{name:<16} batch {args.batch}: host ms per call  other {a:.3f}  this {b:.3f}  ({b - a:+.3f})")


if __name__ == "__main__":
    main()
