"""Black-box (final-model) multi-run audits of DP-SGD on digits: today's canaries vs crafted ones.

    .venv/bin/python benchmarks/blackbox_canaries.py                          # ε ∈ {2, 4, 8}, 200 runs a side
    .venv/bin/python benchmarks/blackbox_canaries.py --epsilons 8 --runs 50   # a quick look

For each claimed ε (δ = 1e-5): logistic regression on 200 members, Poisson-sampled DP-SGD (full batch
by default, q = 1), σ calibrated to the claim; the same budget for every design (R models with the
canary, R without, same recipe and seeds): mislabeled and ClipBKD canaries (today), crafted canaries
(dpaudit.canaries.craft_canaries) and crafted canaries with the adversarial initialisation
(dpaudit.workflows.training.adversarial_init). Printed per design: the formal Clopper–Pearson lower
bound and its ratio to the claim, the GDP estimate from the same scores (not formal), the design's max
certifiable ε, and the wall time relative to the first design measured in the same run (absolute times
are not comparable across machines). The table comes from dpaudit.canaries.crafted_row.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

# Run as a script, this file's folder is sys.path[0], and benchmarks/attacks.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]


def main(argv: list[str] | None = None) -> None:
    import torch

    from dpaudit.canaries import crafted_row

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilons", default="2,4,8", help="claimed epsilons, comma-separated")
    p.add_argument("--runs", type=int, default=200, help="models with the canary (and as many without)")
    p.add_argument("--train-size", type=int, default=200)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=None, help="default: full batch (q = 1)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"# {platform.platform()}, torch {torch.__version__}, {args.runs} runs a side, seed {args.seed}")
    header = (
        f"{'claim':>5}  {'design':<26} {'CP bound':>8} {'/claim':>6} {'GDP est.':>8} {'max cert.':>9} "
        f"{'mu_hat (se)':>13} {'/claim mu':>9} {'eps(mu_hat)':>11} {'time':>6}"
    )
    print(header)
    for eps in (float(e) for e in args.epsilons.split(",")):
        row = crafted_row(
            eps, runs=args.runs, train_size=args.train_size, epochs=args.epochs, batch_size=args.batch_size,
            seed=args.seed, workers=args.workers,
        )  # fmt: skip
        base = row["designs"][0]["wall_s"]
        for d in row["designs"]:
            name = f"{d['canary_kind']} + {d['init']} init"
            mu = f"{d['mu_hat']:.2f} ({d['mu_se']:.2f})"
            print(
                f"{eps:5g}  {name:<26} {d['epsilon_lower_bound']:8.3f} {d['ratio']:6.3f} {d['gdp_estimate']:8.3f} "
                f"{d['max_certifiable_epsilon']:9.3f} {mu:>13} {d['mu_hat'] / row['claim_mu']:9.2f} "
                f"{d['mu_epsilon_estimate']:11.2f} {d['wall_s'] / base:5.2f}x"
            )
        exact = "exact, q = 1" if row["claim_mu_exact"] else "CLT approximation"
        print(f"{eps:5g}  claim mu = {row['claim_mu']:.3f} ({exact}); best formal: {row['best']}", flush=True)


if __name__ == "__main__":
    main()
