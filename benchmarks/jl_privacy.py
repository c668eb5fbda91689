"""DP-SGD-JL privacy vs JL dimension r: the seed paper's Figure 8, recomputed without truncating Z_r.

Seed paper (Bu et al. 2021, arXiv:2102.03013), Appendix C / Figure 8: epsilon of DP-SGD-JL after
1..5 epochs (delta = 1e-5) for N=60000, B=256, sigma=1.3 (panel 1) and N=25000, B=64, sigma=0.5
(panel 2), accounted by Thm. 4.1 (f = T(Z_r, N(Z_r/sigma,1) || Z_r, N(0,1)), Poisson rate B/N).
The paper reports epsilon "not monotone in r"; this script prints

1. the epsilon table from dpaudit's PLD accountant (finite for every r, an upper bound);
2. the one-step trade-off crossing check: beta_r(alpha) = E_Z[Phi(Phi^-1(1-alpha) - Z_r/sigma)]
   (Lemma 4.1 parametrisation) on an alpha grid, for consecutive r: no crossing means the
   one-step mechanisms are ordered, hence epsilon is monotone in r for every T and q
   (composition and subsampling preserve the order of trade-off functions);
3. the tail law delta_single(eps) ~ K_r eps^(-r/2), K_r = (r/(4 sigma^2))^(r/2) / Gamma(r/2+1),
   against the accountant's single-step delta (the polynomial tail that a truncated Z_r misses).

Usage: python benchmarks/jl_privacy.py [--epochs 5] [--panels 1,2] [--dims 1,2,3,4,...]
       [--jl-bins 400] [--interval 1e-4]. Times are rough seconds per epsilon query on this machine.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import special

from dpaudit.accounting import PldAccountant, dpsgd_event
from dpaudit.accounting.jl import single_step_tail_constant, z_r_cdf
from dpaudit.events import JLGaussian

PANELS = {1: (60000, 256, 1.3), 2: (25000, 64, 0.5)}
DIMS = [1, 2, 3, 4, 5, 8, 10, 16, 20, 50, 100]


def epsilon_table(panel: int, dims: list[int], epochs: int, delta: float, jl_bins: int, interval: float) -> None:
    n, b, sigma = PANELS[panel]
    q, per_epoch = b / n, math.ceil(n / b)
    print(f"\nPanel {panel}: N={n}, B={b}, sigma={sigma}, q={q:.5f}, delta={delta:g} (PLD, {jl_bins} Z_r bins/e-fold)")
    print(f"{'r':>6s} " + " ".join(f"{'epoch ' + str(e):>12s}" for e in range(1, epochs + 1)) + f" {'s/query':>8s}")
    for r in [*dims, None]:
        cells, t0 = [], time.perf_counter()
        for e in range(1, epochs + 1):
            event = dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=e * per_epoch, jl_projections=r)
            acc = PldAccountant(jl_bins=jl_bins, value_discretization_interval=interval)
            cells.append(acc.compose(event).epsilon(delta))
        per_query = (time.perf_counter() - t0) / epochs
        label = "no JL" if r is None else str(r)
        print(f"{label:>6s} " + " ".join(f"{c:12.6g}" for c in cells) + f" {per_query:8.1f}", flush=True)


def _tradeoff(sigma: float, r: int, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Lemma 4.1 / 4.3: alpha(t) = E[Phi(-t/mu - mu/2)], beta(t) = E[Phi(t/mu - mu/2)], mu = Z_r/sigma;
    # Z_r on 40000 geometric bins over z in [e^-6, e^20] with exact chi^2 masses (geometric midpoints).
    edges = np.exp(np.linspace(-6.0, 20.0, 40001))
    mass = np.diff(z_r_cdf(r, edges))
    mu = np.sqrt(edges[1:] * edges[:-1]) / sigma
    alpha = special.ndtr(-t[:, None] / mu - mu / 2) @ mass
    beta = special.ndtr(t[:, None] / mu - mu / 2) @ mass
    return alpha, beta


def tradeoff_crossings(sigma: float, dims: list[int]) -> None:
    """Is beta_(r') >= beta_r at every alpha for r' > r (r' more private)? Reports the worst gap."""
    t = np.concatenate([-np.geomspace(50.0, 1e-3, 200), np.geomspace(1e-3, 1e4, 400)])
    print(f"\nOne-step trade-off curves, sigma={sigma}: min over alpha in [1e-10, 0.99] of beta_(r') - beta_r")
    prev = None
    for r in dims:
        alpha, beta = _tradeoff(sigma, r, t)
        if prev is not None:
            pa, pb = prev[1], prev[2]
            ok = (pa > 1e-10) & (pa < 0.99)
            # beta_r as a function of alpha (alpha decreases in t): interpolate on log alpha.
            cur_at = np.interp(np.log(pa[ok][::-1]), np.log(np.maximum(alpha, 1e-300)[::-1]), beta[::-1])[::-1]
            d = cur_at - pb[ok]
            verdict = "no crossing" if np.all(d >= -1e-9) else "CROSSING"
            print(f"  r={prev[0]:>4d} -> {r:>4d}: min diff {d.min():+.3e} ({verdict})", flush=True)
        prev = (r, alpha, beta)


def tail_law(sigma: float, dims: list[int]) -> None:
    print(f"\nTail law of one unsubsampled step, sigma={sigma}: delta(eps) / (K_r eps^(-r/2))")
    eps_grid = [1e2, 1e3, 1e4]
    print(f"{'r':>4s} {'K_r':>12s} " + " ".join(f"{'eps=' + format(e, 'g'):>12s}" for e in eps_grid))
    for r in dims:
        k = single_step_tail_constant(sigma, r)
        acc = PldAccountant(jl_bins=100, value_discretization_interval=1e-3).compose(JLGaussian(sigma, r))
        ratios = [acc.delta(e) / (k * e ** (-r / 2)) for e in eps_grid]
        print(f"{r:>4d} {k:12.4e} " + " ".join(f"{x:12.4f}" for x in ratios), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--panels", default="1,2")
    parser.add_argument("--dims", default=",".join(map(str, DIMS)))
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--jl-bins", type=int, default=400)
    parser.add_argument("--interval", type=float, default=1e-4)
    parser.add_argument("--skip-table", action="store_true")
    args = parser.parse_args()
    dims = [int(x) for x in args.dims.split(",")]
    panels = [int(x) for x in args.panels.split(",")]
    if not args.skip_table:
        for p in panels:
            epsilon_table(p, dims, args.epochs, args.delta, args.jl_bins, args.interval)
    for p in panels:
        tradeoff_crossings(PANELS[p][2], dims)
    tail_law(PANELS[panels[0]][2], [1, 2, 3, 4])


if __name__ == "__main__":
    main()
