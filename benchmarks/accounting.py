"""Accounting benchmarks: our RDP/PLD accountants against dp_accounting's, measured in the same run.

    .venv/bin/python benchmarks/accounting.py            # timing table (DP-SGD, 1e3/1e4/1e5 steps)

(DP-SGD-JL's ε against the JL dimension, the seed's Figure 8: ``benchmarks/jl_privacy.py``.)

Each timing is the median of ``--repeats`` runs of: fresh accountant, compose
SelfComposed(PoissonSampled(q, Gaussian(sigma)), T), epsilon(delta). The ratio column is
ours / theirs (below 1 means we are faster). dp_accounting is only a peer for comparison.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

from dpaudit.accounting import PldAccountant, RdpAccountant, dpsgd_event


def _median_time(fn: Callable[[], float], repeats: int) -> tuple[float, float]:
    times, value = [], math.nan
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), value


def timing_table(q: float, sigma: float, delta: float, steps_list: list[int], repeats: int) -> None:
    try:
        import dp_accounting as dpa
    except ImportError:  # pragma: no cover
        dpa = None
    print(f"DP-SGD: sample_rate={q:.6g}, noise_multiplier={sigma}, delta={delta:g}; median of {repeats} runs")
    header = f"{'accountant':10s} {'steps':>7s} {'ours (s)':>9s} {'dp_acc (s)':>10s} {'ratio':>6s} "
    header += f"{'eps ours':>12s} {'eps dp_acc':>12s} {'rel diff':>9s}"
    print(header)
    print("-" * len(header))
    for name in ("rdp", "pld"):
        for steps in steps_list:
            event = dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps)

            def ours(event=event, name=name) -> float:
                acc = RdpAccountant() if name == "rdp" else PldAccountant()
                return acc.compose(event).epsilon(delta)

            t_ours, e_ours = _median_time(ours, repeats)
            if dpa is not None:
                dpa_event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)

                def theirs(dpa_event=dpa_event, name=name) -> float:
                    acc = dpa.rdp.RdpAccountant() if name == "rdp" else dpa.pld.PLDAccountant()
                    acc.compose(dpa_event)
                    return acc.get_epsilon(delta)

                t_theirs, e_theirs = _median_time(theirs, repeats)
                ratio = f"{t_ours / t_theirs:6.2f}"
                rel = f"{(e_ours - e_theirs) / e_theirs:+9.1e}"
            else:  # pragma: no cover
                t_theirs, e_theirs, ratio, rel = math.nan, math.nan, "   n/a", "      n/a"
            print(f"{name:10s} {steps:7d} {t_ours:9.3f} {t_theirs:10.3f} {ratio} {e_ours:12.6f} {e_theirs:12.6f} {rel}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    timing_table(256 / 60000, 1.1, 1e-5, [1_000, 10_000, 100_000], args.repeats)


if __name__ == "__main__":
    main()
