"""Mean one-run holdout bound against Gaussian leaks of growing strength (the power of the guess-count choice).

Usage (from the repository root):

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/one_run_power.py [--seeds 50] [--m 250 1000] [--mu 1 2 3 4 6]

Each audit: m canaries, member = fair coins (seed 1000 + s), scores N(0, 1) + mu * member, `audit(...,
selection="holdout")` at alpha 0.0125 and delta 1e-5 (the one-run settings of reports/example) with the design drawn
from seed s. Prints, per (m, mu), the mean, min and max bound over the seeds, the mean "oracle" bound (the best
grid count test on the evaluation half, chosen by looking at it: not a valid bound, a reference for any
chooser of the grid), how often the chosen test made more than 2 errors on the evaluation half, and the bound of a
perfect attack (max_certifiable).
"""

from __future__ import annotations

import argparse

import numpy as np

from dpaudit.audit import one_run as o

DELTA, ALPHA = 1e-5, 0.0125


def canaries(m: int, mu: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores N(0, 1) + mu * member of m canaries, member = fair coins, from seed 1000 + seed."""
    r = np.random.default_rng(1000 + seed)
    member = r.random(m) < 0.5
    return r.normal(0.0, 1.0, m) + mu * member, member


def one(m: int, mu: float, seed: int) -> tuple[float, float, int]:
    scores, member = canaries(m, mu, seed)
    out = o.audit(scores, member, delta=DELTA, alpha=ALPHA, selection="holdout", rng=np.random.default_rng(seed))
    # The oracle: the same design's evaluation half, the best grid test chosen on it (invalid, a ceiling).
    tiebreak, sel = o.draw_design(m, "holdout", np.random.default_rng(seed))
    keys, sel_r = o.design_on_records(tiebreak, sel, scores, member)
    m_b = int((~sel_r).sum())
    kp, km = o._fractions_to_counts(*o._fraction_pairs(), m_b)
    top, bottom = o.guess_counts(scores[~sel_r], member[~sel_r], keys[~sel_r])
    oracle = o.best_bound_over_pairs(m_b, kp + km, top[kp] + bottom[km], DELTA, ALPHA)[0]
    return out.epsilon, oracle, out.guesses - out.correct


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--m", type=int, nargs="+", default=[250, 1000])
    ap.add_argument("--mu", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0, 6.0])
    a = ap.parse_args()
    for m in a.m:
        print(f"m = {m}: perfect attack {o.max_certifiable(m, DELTA, ALPHA, 'holdout'):.3f}")
        for mu in a.mu:
            res = np.array([one(m, mu, s) for s in range(a.seeds)])
            eps, oracle, errors = res.T
            print(
                f"  mu {mu:g}: mean {eps.mean():.3f} (min {eps.min():.3f}, max {eps.max():.3f}); "
                f"oracle mean {oracle.mean():.3f}; "
                f"> 2 errors on the evaluation half {int((errors > 2).sum())}/{a.seeds}"
            )


if __name__ == "__main__":
    main()
