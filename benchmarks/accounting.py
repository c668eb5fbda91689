"""Accounting benchmarks: our RDP/PLD accountants against dp_accounting's, measured in the same run.

    .venv/bin/python benchmarks/accounting.py            # timing table (DP-SGD, 1e3/1e4/1e5 steps)
    .venv/bin/python benchmarks/accounting.py --jl       # + DP-SGD-JL privacy vs JL dimension (seed Fig. 8)

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
from dpaudit.events import Gaussian, JLGaussian, PoissonSampled


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


def jl_table(delta: float, interval: float, jl_bins: int) -> None:
    """epsilon of DP-SGD-JL after 1..5 epochs for several JL dimensions r (seed paper, Figure 8 settings)."""
    panels = [(60000, 256, 1.3), (25000, 64, 0.5)]
    dims = [1, 2, 3, 5, 10, 20, 30, 50, 100, 300, 1000, 10000]
    for n, b, sigma in panels:
        q = b / n
        steps_per_epoch = math.ceil(n / b)
        print(f"\nDP-SGD-JL: N={n}, B={b}, sigma={sigma}, delta={delta:g} (PLD, grid {interval:g}, {jl_bins} Z_r bins)")
        print(f"{'r':>8s} " + " ".join(f"{'epoch ' + str(e):>10s}" for e in range(1, 6)) + f" {'time (s)':>9s}")
        rows = [("no JL", Gaussian(sigma))] + [(str(r), JLGaussian(sigma, r)) for r in dims]
        for label, inner in rows:
            t0 = time.perf_counter()
            acc = PldAccountant(value_discretization_interval=interval, jl_bins=jl_bins)
            rem, add = acc.compose(PoissonSampled(q, inner)).privacy_loss_distributions()
            eps = []
            for epoch in range(1, 6):
                steps = epoch * steps_per_epoch
                e = max(
                    rem.self_compose(steps, acc.tail).epsilon(delta), add.self_compose(steps, acc.tail).epsilon(delta)
                )
                eps.append(e)
            cells = " ".join(f"{e:10.4f}" if math.isfinite(e) else f"{'inf':>10s}" for e in eps)
            print(f"{label:>8s} {cells} {time.perf_counter() - t0:9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jl", action="store_true", help="also print the DP-SGD-JL table (slow, minutes)")
    parser.add_argument("--jl-interval", type=float, default=1e-3)
    parser.add_argument("--jl-bins", type=int, default=1000)
    args = parser.parse_args()
    timing_table(256 / 60000, 1.1, 1e-5, [1_000, 10_000, 100_000], args.repeats)
    if args.jl:
        jl_table(1e-5, args.jl_interval, args.jl_bins)


if __name__ == "__main__":
    main()
