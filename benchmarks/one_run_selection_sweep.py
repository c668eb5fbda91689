"""Selection criteria for the one-run holdout audit, compared paired with the shipped one (same data, same halves).

Usage (from the repository root; ~20-60 s per candidate here, the maximin ones ~5-10 min):

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/one_run_selection_sweep.py \\
        [--candidates a0.001,g16,fdp-g16] [--seeds 50] [--m 100 250 1000 4000] [--mu 1 2 3 4 6 20]

Data: benchmarks/one_run_power.py's canaries (N(0, 1) + mu * member, member = fair coins; mu = 20 is a perfect
ranking), the design (keys and half) from seed s, direction "greater". Each candidate is a guess-fraction grid and
a criterion on the selection half, plugged into the shipped `choose_guess_fractions` / `apply_guess_fractions`
(thresholds), so only the choice differs. A candidate chooses once per data set (every criterion is level-free)
and is evaluated at each (alpha, delta) of LEVELS: the (epsilon, delta) bound for the one-run audit, the GDP
parameter mu for the "fdp-" candidates (the f-DP audit with the GDP family; its delta only converts mu to
epsilon). Printed per level and m: each mu's mean bound and its paired difference from the shipped criterion
("main", or "fdp-main") in % of the shipped mean ± se; then every cell losing more than 1 % and every m whose mean
bound is not monotone in mu. RESULTS.md, "one-run holdout selection level", has the numbers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dpaudit.audit import fdp_one_run as f
from dpaudit.audit import one_run as o
from dpaudit.audit.holdout import SELECTION_ALPHA, SELECTION_DELTA, select_then_evaluate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from one_run_power import canaries

LEVELS = [(0.0125, 1e-5), (0.05, 1e-5), (0.01, 1e-5), (0.05, 1e-3), (0.01, 1e-3)]


def grid(extra: np.ndarray) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    """The shipped fractions {0, 2^-j} plus ``extra`` (each ≤ 1/2, so k₊ + k₋ ≤ m), as (f₊, f₋) pairs."""

    def pairs():
        fr = np.unique(np.concatenate(([0.0], 2.0 ** -np.arange(1, 11), extra)))
        fp, fm = (a.ravel() for a in np.meshgrid(fr, fr, indexing="ij"))
        keep = (fp + fm) > 0
        return fp[keep], fm[keep]

    return pairs


def eps_criterion(alpha_of_m: Callable[[int], float], delta: float, extra_errors=lambda errors: 0):
    """The shipped (ε, δ) criterion at a reference (alpha_of_m(m_sel), delta), optionally scoring each pair
    as if it had made ``extra_errors(errors)`` more errors (a pessimistic transfer to the other half)."""

    def criterion(m_a, kp, km, correct):
        c = np.maximum(correct - extra_errors(kp + km - correct), 0)
        return o.best_bound_over_pairs(m_a, kp + km, c, delta, alpha_of_m(m_a), tol=o._SELECTION_TOL,
                                       max_evaluations=o._SELECTION_EVALUATIONS)[1]  # fmt: skip

    return criterion


def gdp_criterion(alpha: float):
    """The shipped f-DP criterion (GDP family, δ-free) at ``alpha``."""

    def criterion(m_a, kp, km, correct):
        return f.largest_refuted(m_a, kp + km, correct, f.gdp_family(), alpha, tol=1e-2)[1]

    return criterion


def maximin_criterion(refs: list[tuple[float, float]]):
    """The pair maximising min over the reference levels of (its bound / the best pair's bound there): every
    distinct (r, v) evaluated at each reference (slow)."""

    def criterion(m_a, kp, km, correct):
        r = kp + km
        pairs = sorted({(int(a), int(b)) for a, b in zip(r, correct, strict=True) if b > 0})
        if not pairs:
            return 0
        tab = np.array([[o.one_run_epsilon_lower_bound(m_a, a, b, d, al, tol=o._SELECTION_TOL) for al, d in refs]
                        for a, b in pairs])  # fmt: skip
        best = tab.max(axis=0)
        eff = tab[:, 0] if np.any(best <= 0) else (tab / best).min(axis=1)
        a, b = pairs[int(np.argmax(eff))]
        return int(np.flatnonzero((r == a) & (correct == b))[0])

    return criterion


SHIPPED = o._fraction_pairs
G16 = grid(np.arange(1, 9) / 16)


def g16_symmetric() -> tuple[np.ndarray, np.ndarray]:
    """The shipped pairs plus the symmetric (j/16, j/16), j = 1..8."""
    fp, fm = SHIPPED()
    j = np.arange(1, 9) / 16
    return np.concatenate((fp, j)), np.concatenate((fm, j))


CANDIDATES = {  # name: (grid, criterion); "fdp-" ones are evaluated with the f-DP audit's GDP family
    "main": (SHIPPED, eps_criterion(lambda m: SELECTION_ALPHA, SELECTION_DELTA)),
    "a0.001": (SHIPPED, eps_criterion(lambda m: 0.001, SELECTION_DELTA)),
    "a0.0025": (SHIPPED, eps_criterion(lambda m: 0.0025, SELECTION_DELTA)),
    "m-prop": (SHIPPED, eps_criterion(lambda m: max(SELECTION_ALPHA, 0.5 * m * SELECTION_DELTA), SELECTION_DELTA)),
    "m-add": (SHIPPED, eps_criterion(lambda m: SELECTION_ALPHA + 0.4 * m * SELECTION_DELTA, SELECTION_DELTA)),
    "pure": (SHIPPED, eps_criterion(lambda m: SELECTION_ALPHA, 0.0)),
    "plus-one-error": (SHIPPED, eps_criterion(lambda m: SELECTION_ALPHA, SELECTION_DELTA, lambda e: 1)),
    "gdp-for-eps": (SHIPPED, gdp_criterion(SELECTION_ALPHA)),
    "maximin": (SHIPPED, maximin_criterion([(SELECTION_ALPHA, SELECTION_DELTA), (0.0025, SELECTION_DELTA)])),
    "g16": (G16, eps_criterion(lambda m: SELECTION_ALPHA, SELECTION_DELTA)),
    "g16-a0.0025": (G16, eps_criterion(lambda m: 0.0025, SELECTION_DELTA)),
    "g16-plus-sqrt-errors": (
        G16,
        eps_criterion(lambda m: SELECTION_ALPHA, SELECTION_DELTA, lambda e: np.ceil(np.sqrt(e + 1)).astype(np.int64)),
    ),
    "g32": (grid(np.arange(1, 17) / 32), eps_criterion(lambda m: SELECTION_ALPHA, SELECTION_DELTA)),
    "g16sym": (g16_symmetric, eps_criterion(lambda m: SELECTION_ALPHA, SELECTION_DELTA)),
    "g16sym-a0.001": (g16_symmetric, eps_criterion(lambda m: 0.001, SELECTION_DELTA)),
    "g16-maximin": (G16, maximin_criterion([(SELECTION_ALPHA, SELECTION_DELTA), (0.0125, SELECTION_DELTA)])),
    "fdp-main": (SHIPPED, gdp_criterion(SELECTION_ALPHA)),
    "fdp-g16": (G16, gdp_criterion(SELECTION_ALPHA)),
    "fdp-g16sym": (g16_symmetric, gdp_criterion(SELECTION_ALPHA)),
}


def choice(m: int, mu: float, seed: int, name: str) -> tuple[int, int, int]:
    """(guesses, correct, m_eval) of candidate ``name`` on one data set."""
    scores, member = canaries(m, mu, seed)
    tiebreak, sel = o.draw_design(m, "holdout", np.random.default_rng(seed))
    keys, half = o.design_on_records(tiebreak, sel, scores, member)
    pairs, criterion = CANDIDATES[name]
    o._fraction_pairs = pairs  # the shipped chooser reads its grid from the module
    try:
        kp, km, v, m_b = select_then_evaluate(half, (scores, member, keys), o.choose_guess_fractions(criterion),
                                              o.apply_guess_fractions)  # fmt: skip
    finally:
        o._fraction_pairs = SHIPPED
    return kp + km, v, m_b


def bounds(name: str, chosen: list[tuple[int, int, int]]) -> dict[tuple[float, float], np.ndarray]:
    out = {}
    for alpha, delta in LEVELS:
        if name.startswith("fdp-"):
            b = [f.largest_refuted(mb, [r], [v], f.gdp_family(), alpha)[0] if r else 0.0 for r, v, mb in chosen]
        else:
            b = [o.one_run_epsilon_lower_bound(mb, r, v, delta, alpha) if r else 0.0 for r, v, mb in chosen]
        out[(alpha, delta)] = np.array(b)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--candidates", default="a0.001,m-prop,g16sym,fdp-g16sym", help=f"comma-separated of {list(CANDIDATES)}"
    )
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--m", type=int, nargs="+", default=[100, 250, 1000, 4000])
    ap.add_argument("--mu", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0, 6.0, 20.0])
    a = ap.parse_args()
    names = a.candidates.split(",")
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        ap.error(f"unknown candidates {unknown}")
    cells = [(m, mu) for m in a.m for mu in a.mu]
    res = {}
    for name in {("fdp-main" if n.startswith("fdp-") else "main") for n in names} | set(names):
        res[name] = {c: bounds(name, [choice(*c, s, name) for s in range(a.seeds)]) for c in cells}
    for name in names:
        ref = res["fdp-main" if name.startswith("fdp-") else "main"]
        print(f"=== {name} (vs {'fdp-main' if name.startswith('fdp-') else 'main'})")
        losses, nonmono = [], []
        for level in LEVELS:
            if name.startswith("fdp-") and level[1] != LEVELS[0][1]:
                continue  # the GDP parameter does not depend on delta
            for m in a.m:
                row = []
                for mu in a.mu:
                    b, b0 = res[name][(m, mu)][level], ref[(m, mu)][level]
                    d, mean0 = b - b0, b0.mean()
                    rel, se = (d.mean() / mean0, d.std(ddof=1) / np.sqrt(len(d)) / mean0) if mean0 > 0 else (0.0, 0.0)
                    row.append(f"{b.mean():.3f} ({100 * rel:+.1f}±{100 * se:.1f}%)")
                    if rel < -0.01:
                        losses.append(f"{level} m {m} mu {mu:g}: {100 * rel:+.1f}±{100 * se:.1f}% ({d.mean():+.3f})")
                means = [res[name][(m, mu)][level].mean() for mu in a.mu]
                if np.any(np.diff(means) < 0):
                    nonmono.append(f"{level} m {m}: {np.round(means, 3).tolist()}")
                print(f"alpha {level[0]:g} delta {level[1]:g} m {m}: " + "  ".join(row))
        print("losses > 1 %:", *losses or ["none"], sep="\n  ")
        print("not monotone in mu:", *nonmono or ["none"], sep="\n  ")


if __name__ == "__main__":
    main()
