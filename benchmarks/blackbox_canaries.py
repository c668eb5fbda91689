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
are not comparable across machines). The table comes from :func:`crafted_row`
(the experiment driver lives here, not in the library: issue 23).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, this file's folder is sys.path[0], and benchmarks/attacks.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]


# The designs compared by :func:`crafted_row`: (canary kind, initialisation), today's first.
BLACKBOX_DESIGNS = (("mislabeled", "random"), ("clipbkd", "random"), ("crafted", "random"), ("crafted", "adversarial"))


def crafted_row(
    claimed_epsilon: float,
    *,
    designs: tuple[tuple[str, str], ...] = BLACKBOX_DESIGNS,
    runs: int = 200,
    delta: float = 1e-5,
    train_size: int = 200,
    epochs: int = 10,
    batch_size: int | None = None,
    lr: float = 1.0,
    seed: int = 0,
    workers: int = 1,
) -> dict[str, Any]:
    """Row (d) of the tightness table: black-box (final-model) multi-run audits of DP-SGD on digits at
    ``claimed_epsilon`` (δ = ``delta``), one per (canary kind, init) design, all at the same budget
    (``runs`` models with the canary and as many without, the same recipe and seeds).

    Recipe: logistic regression on ``train_size`` members, Poisson-sampled DP-SGD with σ calibrated to
    the claim, ``epochs`` epochs; ``batch_size`` None means full batch (q = 1), where the claim is
    exactly μ-GDP with μ = √T/σ (Dong, Roth & Su 2022, arXiv:1905.02383, Cor. 3.3) and a canary whose
    clipped gradient is orthogonal to the data's can reach it from the final model alone.

    Returns plain data: per design the formal Clopper–Pearson lower bound and its ratio to the claim,
    the threshold GDP estimate (not formal), the design's max certifiable ε, the IN/OUT AUC, the score separation
    μ̂ (IN/OUT mean difference over the pooled standard deviation: the μ of a Gaussian shift fitted to
    the scores, with its standard error) and its ε at ``delta`` (an estimate: assumes Gaussian scores),
    and the wall time in seconds (measure it on an idle machine). ``claim_mu``: the claim's μ, exact
    for q = 1 (√T/σ), else the CLT approximation (Bu et al. 2020, arXiv:1911.11607, "mu_CLT"). ``best`` names
    the design with the largest formal bound (ties: the largest μ̂).
    """
    import time

    from dpaudit.accounting.gdp import gdp_epsilon, gdp_mu_poisson_clt
    from dpaudit.audit import audit_scores
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import DPConfig, TrainConfig
    from dpaudit.workflows.training import audit_training

    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    # Full batch: q pinned to 1 on both neighbours (B/N would be 200/201 on the IN side).
    rate = 1.0 if batch_size is None else None
    dp = DPConfig(clip=1.0, target_epsilon=claimed_epsilon, delta=delta, sampling="poisson", sample_rate=rate)
    config = TrainConfig(algo="dpsgd", epochs=epochs, batch_size=batch_size or train_size, lr=lr, seed=seed, dp=dp)
    rows = []
    for kind, init in designs:
        t0 = time.perf_counter()
        d = audit_training(
            ds, spec, config, runs=runs, train_size=train_size, canary_kind=kind, init=init, delta=delta,
            claimed_epsilon=claimed_epsilon, seed=seed, workers=workers,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        gdp = audit_scores(d.scores, d.member, method="gdp", design="multi-run", delta=delta, seed=seed)
        mu, se = score_separation(d.scores, d.member)
        a, b = d.scores[d.member], d.scores[~d.member]
        auc = float((a[:, None] > b[None, :]).mean() + 0.5 * (a[:, None] == b[None, :]).mean())  # Mann–Whitney
        r = d.result
        rows.append({
            "canary_kind": kind,
            "init": init,
            "epsilon_lower_bound": r.epsilon_lower_bound,
            "ratio": r.epsilon_lower_bound / claimed_epsilon,
            "gdp_estimate": gdp.epsilon_lower_bound,
            "max_certifiable_epsilon": r.max_certifiable_epsilon,
            "auc": auc,
            "mu_hat": mu,
            "mu_se": se,
            "mu_epsilon_estimate": gdp_epsilon(max(mu, 0.0), delta),
            "verdict": r.verdict,
            "wall_s": wall,
        })  # fmt: skip
    best = max(rows, key=lambda x: (x["epsilon_lower_bound"], x["mu_hat"]))
    c = d.claim
    q, sigma, steps = c["sample_rate"], c["noise_multiplier"], c["steps"]
    claim_mu = float(np.sqrt(steps) / sigma) if q == 1.0 else gdp_mu_poisson_clt(q, sigma, steps)
    return {
        "row": "(d) black-box crafted canaries",
        "claimed_epsilon": float(claimed_epsilon),
        "delta": float(delta),
        "runs": runs,
        "recipe": {"train_size": train_size, "epochs": epochs, "batch_size": batch_size or train_size, "lr": lr},
        "claim_mu": claim_mu,
        "claim_mu_exact": q == 1.0,
        "designs": rows,
        "best": f"{best['canary_kind']}+{best['init']} init",
    }


def score_separation(scores: np.ndarray, member: np.ndarray) -> tuple[float, float]:
    """μ̂ = (mean IN − mean OUT) / pooled SD and its large-sample standard error
    √((n₁ + n₀)/(n₁n₀) + μ̂²/(2(n₁ + n₀))) (Hedges & Olkin 1985, "Statistical Methods for
    Meta-Analysis", ch. 5, the large-sample variance of the standardised mean difference). For two Gaussian score
    laws with equal variance, μ̂ estimates the μ of the μ-GDP trade-off between them (Dong, Roth &
    Su 2022, arXiv:1905.02383, Def. 2.4: G_μ = T(N(0, 1), N(μ, 1))). An estimate, not a bound."""
    scores, member = np.asarray(scores, dtype=np.float64), np.asarray(member, dtype=bool)
    a, b = scores[member], scores[~member]
    n1, n0 = len(a), len(b)
    pooled = np.sqrt(((n1 - 1) * a.var(ddof=1) + (n0 - 1) * b.var(ddof=1)) / (n1 + n0 - 2))
    diff = float(a.mean() - b.mean())
    if pooled == 0:  # degenerate: constant scores on each side
        return (math.copysign(math.inf, diff) if diff else 0.0), math.inf
    mu = diff / float(pooled)
    se = float(np.sqrt((n1 + n0) / (n1 * n0) + mu * mu / (2 * (n1 + n0))))
    return mu, se


def main(argv: list[str] | None = None) -> None:
    import torch

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
