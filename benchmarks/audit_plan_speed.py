"""Cost of ``audit plan``'s simulated audits: the records as drawn against the canonical order, and the one-run memo.

``audit plan`` (:func:`dpaudit.audit.power.size_for_power`) spends its time in :func:`simulated_power`, which runs
:func:`dpaudit.audit.audit_scores` on each simulated draw. It passes the draw in the canonical order of the records
(:func:`dpaudit.audit.holdout.in_canonical_order`), where the audit's sorts find the records sorted; the audit reads
only the multiset of (score, member) pairs, so the result is the same. This script times both arrangements on the
same draws, in the same run, and checks that every audit's result (``AuditResult.to_dict()``) is equal.

It then times :func:`dpaudit.audit.power.simulated_power` of the one-run method with the memo of the one-run
p-values and bounds (:mod:`dpaudit.audit.one_run`) switched off (the undecorated functions) and on (emptied first),
and checks that the simulated powers are equal. Times are CPU seconds (``time.process_time``): this machine is shared.

Run (from the repository root):

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 10 python benchmarks/audit_plan_speed.py [--sizes 10000 200000 1000000]
        [--draws 3]

Prints, per method, leak and size: CPU seconds per audit as drawn, in canonical order (with the rearrangement), and
the ratio; then the memo's off/on seconds and ratio per size.
Results: benchmarks/RESULTS.md, "audit plan's simulated audits".
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import numpy as np

from dpaudit.audit import one_run
from dpaudit.audit.bounds import audit_scores
from dpaudit.audit.holdout import in_canonical_order
from dpaudit.audit.power import _SEED_SALT, ONE_RUN_METHODS, _draw, hypothesised_leak, simulated_power

CASES = (  # (method, family, claimed ε, leak ε, extra audit settings)
    ("clopper-pearson", "randomized-response", 2.0, 2.01, {}),
    ("clopper-pearson", "gaussian", 2.0, 3.0, {}),
    ("clopper-pearson", "randomized-response", 2.0, 2.01, {"alternative": "two-sided"}),
    ("gdp", "gaussian", 1.0, 2.0, {}),
    ("one-run", "randomized-response", 2.0, 2.1, {}),
    ("one-run-fdp", "randomized-response", 2.0, 6.0, {"tradeoff": "epsilon-delta"}),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 200_000, 1_000_000])
    ap.add_argument("--draws", type=int, default=3)
    args = ap.parse_args()
    print(f"{'method':16s} {'leak':28s} {'size':>9s} {'as drawn s':>11s} {'canonical s':>12s} {'ratio':>6s}")
    for method, family, claimed, true_eps, extra in CASES:
        leak = hypothesised_leak(family=family, epsilon=true_eps)
        one_run = method in ONE_RUN_METHODS
        design = "canaries" if one_run else "multi-run"
        for size in args.sizes:
            t_drawn = t_canon = 0.0
            for i in range(args.draws):
                scores, member = _draw(leak, size, one_run, np.random.default_rng([0, i, _SEED_SALT]))
                kw = {"claimed_epsilon": claimed, "design": design, "seed": i, "method": method, **extra}
                _clear_memo()  # each audit starts cold: the second would otherwise find the first's p-values
                t0 = time.process_time()
                r_drawn = audit_scores(scores, member, **kw)
                t1 = time.process_time()
                _clear_memo()
                t1b = time.process_time()
                r_canon = audit_scores(*in_canonical_order(scores, member), **kw)
                t2 = time.process_time() - (t1b - t1)
                t_drawn, t_canon = t_drawn + t1 - t0, t_canon + t2 - t1
                if r_drawn.to_dict() != r_canon.to_dict():
                    raise SystemExit(f"{method} {family} size {size} draw {i}: the results differ")
            d = args.draws
            print(
                f"{method:16s} {family + ' ' + str(true_eps):28s} {size:9d} {t_drawn / d:11.3f} {t_canon / d:12.3f} "
                f"{t_drawn / t_canon:6.2f}",
                flush=True,
            )
    memo(args.sizes, 4 * args.draws)


def _clear_memo() -> None:
    one_run._log_p_value.cache_clear()
    one_run._epsilon_lower_bound.cache_clear()


def memo(sizes: list[int], draws: int) -> None:
    leak = hypothesised_leak(family="randomized-response", epsilon=2.2)
    print(f"{'one-run memo':16s} {'leak':28s} {'size':>9s} {'off s':>11s} {'on s':>12s} {'ratio':>6s}")
    for size in sizes:
        kw = {"simulations": draws, "method": "one-run"}
        off = {name: getattr(one_run, name).__wrapped__ for name in ("_log_p_value", "_epsilon_lower_bound")}
        t0 = time.process_time()
        with mock.patch.multiple(one_run, **off):
            p_off = simulated_power(size, 2.0, leak, **kw)
        t1 = time.process_time()
        _clear_memo()
        p_on = simulated_power(size, 2.0, leak, **kw)
        t2 = time.process_time()
        if p_off != p_on:
            raise SystemExit(f"one-run memo, size {size}: simulated power {p_off} without the memo, {p_on} with it")
        print(f"{'one-run':16s} {'randomized-response 2.2':28s} {size:9d} {t1 - t0:11.3f} {t2 - t1:12.3f} "
              f"{(t1 - t0) / (t2 - t1):6.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
