"""Host cost of one DP-SGD step: CPU time of the launching thread and dispatched torch ops per step.

    .venv/bin/python benchmarks/host_overhead.py [--batch 2] [--rounds 7] [--size small]
        [--models mlp,cnn,cifar-gn,transformer,transformer-mha,tied] [--device cpu|cuda]

On a GPU the DP step is host-bound (benchmarks/RESULTS.md, issue 26): what a step costs the host
(Python, the dispatcher, kernel launches) decides its wall time. At a tiny batch (default 2) the
arithmetic is negligible on a CPU too, so the CPU time of the calling thread per step
(``time.thread_time``: robust to other jobs on the machine) measures that host cost anywhere.
The steps are those of ``dpsgd_throughput.py`` (``non-private``, ``ours ghost``: the trainer's step
on a fixed batch, ``ours poisson``: its whole Poisson step), run in interleaved rounds; the table
gives the median host ms per step, the extra host ms over non-private SGD of the same run and the
ratio to it, and the number of torch ops dispatched per step (forward, backward, clipping, noise,
update; counted with a ``TorchDispatchMode``, so views count too; on a fresh copy of the step, so
the Poisson row's batch sizes are the same in every run and tree). ``noise draw`` is the host time
of drawing the Gaussian noise for all parameters alone (part of every DP row): on a CPU it is
arithmetic, on a GPU one kernel launch, so it says how much of a CPU row's extra time a GPU would
not pay as host time.
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings

import torch
from dpsgd_throughput import _noise_gen, makers, measure, workloads
from torch.utils._python_dispatch import TorchDispatchMode

from dpaudit.training.dpsgd import _gaussian_like

METHODS = ("non-private", "ours ghost", "ours poisson")


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(step, steps: int = 8) -> float:
    """Torch ops dispatched per call of ``step`` (mean over ``steps`` calls, after one warm-up call)."""
    step()  # builds and checks the ghost plan
    with _CountOps() as count:
        for _ in range(steps):
            step()
    return count.n / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--target-seconds", type=float, default=0.2, help="time per method per round")
    parser.add_argument("--size", choices=("small", "full"), default="small")
    parser.add_argument("--models", default="mlp,cnn,cifar-gn,transformer,transformer-mha,tied")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated; non-private is the baseline")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    device = torch.device(args.device)
    methods = ["non-private"] + [m for m in args.methods.split(",") if m != "non-private"]
    print(f"torch {torch.__version__}, 1 thread, batch {args.batch}, {args.device}, median of {args.rounds} rounds")
    header = f"{'model':<16} {'method':<14} {'host ms':>8} {'extra ms':>9} {'x host':>7} {'ops/step':>9}"
    print(header + "\n" + "-" * len(header))
    for name, (model, x, y) in workloads(args.batch, device, args.size).items():
        if name not in args.models.split(","):
            continue
        make = makers(x, y, loop=False)
        ops = {k: ops_per_step(make[k](copy.deepcopy(model))) for k in methods}
        steps = {k: make[k](copy.deepcopy(model)) for k in methods}
        for f in steps.values():
            f()  # builds and checks the ghost plan
        params, gen = [p for p in model.parameters() if p.requires_grad], _noise_gen(device)
        steps["noise draw"] = lambda params=params, gen=gen: _gaussian_like(params, gen)
        per_round = {}
        for k, f in steps.items():
            t = time.thread_time()
            f()
            per_round[k] = max(1, int(args.target_seconds / max(time.thread_time() - t, 1e-6)))
        host = measure(steps, args.rounds, per_round, device)[1]
        base = host["non-private"]
        for k in methods:
            print(
                f"{name:<16} {k:<14} {host[k] * 1e3:8.3f} {(host[k] - base) * 1e3:9.3f} "
                f"{host[k] / base:7.2f} {ops[k]:9.1f}"
            )
        print(f"{name:<16} {'noise draw':<14} {host['noise draw'] * 1e3:8.3f} {'-':>9} {'-':>7} {'-':>9}")


if __name__ == "__main__":
    main()
