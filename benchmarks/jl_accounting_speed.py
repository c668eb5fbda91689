"""DP-SGD-JL accounting: the trainer's sigma search and claim, before/after the two shortcuts, in one run.

What a ``train --algo dpsgd-jl --epsilon E`` run (and each LiRA reference model of one) pays in accounting:
``calibrate_noise_multiplier`` with the JL lower bound and tol 1e-2 (dpaudit.training.dpsgd._calibrate), then the
claim's epsilon at the sigma found. Two paths, same process, same settings:

* before: every query computed (``PldAccountant``'s memo of JL epsilons, ``JL_EPSILONS``, held at size 0) and the
  lower bound consulted only before the first slow query, as the search did until this change (at
  max_noise_multiplier and while doubling the bracket);
* after: the code as it is (the memo; the lower bound also deciding the bracket's lower end and bisection points
  where it exceeds the target).

Printed per setting: sigma and the claim's epsilon of both paths (they must be equal to the bit: the shortcuts take
the same decisions and remember exact answers), the number of JL epsilons computed, the CPU seconds, and the ratio.
``--grid N`` settings (default 50) use coarse accountant options (``COARSE``: ~0.3 s a query, valid and looser);
``--defaults K`` settings (default 1) use the trainer's accountant (``pld`` at its defaults; ~3.5 s a query idle).

Run: OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/jl_accounting_speed.py [--grid 50] [--defaults 1]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

from dpaudit.accounting import PldAccountant, calibrate_noise_multiplier, dpsgd_event
from dpaudit.accounting import pld as pld_module
from dpaudit.accounting.jl import epsilon_lower_bound

COARSE = {"value_discretization_interval": 3e-2, "jl_bins": 5}
DELTA = 1e-5


class _Run:
    """One path of one setting: counts the JL epsilons computed and whether a slow query has started."""

    def __init__(self, options: dict) -> None:
        self.options, self.computed, self.slow_started = options, 0, False

    def accountant(self) -> PldAccountant:
        self.slow_started = True
        return PldAccountant(**self.options)


def _one(setting: tuple, options: dict, before: bool) -> tuple[float, float, int, float]:
    q, steps, r, target = setting
    run = _Run(options)

    def make(s: float):
        return dpsgd_event(noise_multiplier=s, sample_rate=q, steps=steps, jl_projections=r)

    def bound(s: float) -> float:
        # before: the bound was asked only ahead of the first slow query (the unreachable check, the bracket)
        return -math.inf if before and run.slow_started else epsilon_lower_bound(s, r, q, steps, DELTA)

    original = PldAccountant._jl_epsilon

    def counted(self, delta, jl):
        run.computed += 1
        return original(self, delta, jl)

    pld_module.JL_EPSILONS.clear()
    pld_module.JL_EPSILONS.size = 0 if before else 256
    PldAccountant._jl_epsilon = counted
    start = time.process_time()  # CPU seconds of this process: the machine is shared, wall time is not ours
    try:
        sigma = calibrate_noise_multiplier(
            target_epsilon=target, delta=DELTA, make_event=make, accountant=run.accountant, lower_bound=bound, tol=1e-2
        )
        claim = PldAccountant(**options).compose(make(sigma)).epsilon(DELTA)
    finally:
        PldAccountant._jl_epsilon = original
        pld_module.JL_EPSILONS.size = 256
    return sigma, claim, run.computed, time.process_time() - start


def _settings(n: int) -> list[tuple]:
    # (q, steps, r, target epsilon): reference-model-like rates (batch 10 of 35..60 records), few to many steps
    grid = itertools.product((10 / 42, 10 / 38, 0.05, 0.01), (3, 5, 20), (4, 16, 64), (2.0, 4.0, 8.0))
    return list(grid)[:: max(1, 108 // n)][:n] if n else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=50)
    parser.add_argument("--defaults", type=int, default=1)
    args = parser.parse_args()
    rows = [(s, COARSE, "coarse") for s in _settings(args.grid)]
    rows += [(s, {}, "defaults") for s in [(10 / 42, 5, 16, 4.0), (10 / 38, 5, 16, 4.0)][: args.defaults]]
    print(f"{'q':>8} {'T':>3} {'r':>3} {'eps*':>4} {'options':>8} | {'sigma':>10} {'claim':>10} | before: n, s | "
          "after: n, s | ratio")  # fmt: skip
    worst_sigma = worst_eps = 0.0
    total = {True: 0.0, False: 0.0}
    for setting, options, label in rows:
        try:
            old = _one(setting, options, before=True)
        except Exception as e:  # an unreachable target: both paths must refuse it
            print(f"{setting}: {type(e).__name__}")
            continue
        new = _one(setting, options, before=False)
        worst_sigma = max(worst_sigma, abs(new[0] - old[0]))
        worst_eps = max(worst_eps, abs(new[1] - old[1]))
        total[True] += old[3]
        total[False] += new[3]
        q, steps, r, target = setting
        print(
            f"{q:8.4f} {steps:3d} {r:3d} {target:4.1f} {label:>8} | {new[0]:10.6f} {new[1]:10.6f} | "
            f"{old[2]:2d}, {old[3]:6.1f} | {new[2]:2d}, {new[3]:6.1f} | {old[3] / new[3]:4.2f}x"
            + ("" if (old[0], old[1]) == (new[0], new[1]) else f"  DIFFERS: before {old[0]!r} {old[1]!r}")
        )
    print(f"max |sigma after - before| = {worst_sigma:g}, max |claim after - before| = {worst_eps:g}")
    if total[False] > 0:
        print(f"total {total[True]:.1f} CPU s before, {total[False]:.1f} s after: {total[True] / total[False]:.2f}x")


if __name__ == "__main__":
    main()
