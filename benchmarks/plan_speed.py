"""Time `audit plan`'s simulated audits on two source trees, and check they give identical numbers.

Usage (from the repository root):

    OMP_NUM_THREADS=1 python benchmarks/plan_speed.py BASE_TREE NEW_TREE [--size 1000000] [--draws 10] [--rounds 3]

BASE_TREE and NEW_TREE are folders holding a ``dpaudit`` package (e.g. ``git archive BASE dpaudit | tar -x -C
/tmp/base`` and ``.``). Each round runs, in a fresh process per tree (alternating, so load on a shared machine
falls on both alike), ``simulated_power`` at SIZE runs per side for DRAWS draws of the default alternative of
`audit plan --epsilon 2 --true-epsilon 2.01` (randomized response, clopper-pearson, holdout), and prints the
seconds per simulated audit (CPU time of the process, and wall). Before timing, both trees audit the same draws in
several designs (randomized response and gaussian, clopper-pearson and gdp, holdout, bonferroni and fixed, one-run,
both directions) and the script stops unless every AuditResult is identical.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
from dpaudit.audit.bounds import audit_scores
from dpaudit.audit.power import _draw, hypothesised_leak, simulated_power

mode, size, draws = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == "outputs":
    out = []
    designs = [
        {"method": "clopper-pearson"}, {"method": "clopper-pearson", "threshold_selection": "bonferroni"},
        {"method": "clopper-pearson", "threshold_selection": "fixed", "threshold": 0.5},
        {"method": "gdp"}, {"method": "clopper-pearson", "alternative": "two-sided"},
        {"method": "one-run"}, {"method": "one-run-fdp", "tradeoff": "epsilon-delta"},
    ]
    for family, eps in (("randomized-response", 2.01), ("randomized-response", 4.0), ("gaussian", 6.0)):
        leak = hypothesised_leak(family=family, epsilon=eps)
        for d in designs:
            one_run = d["method"].startswith("one-run")
            for n in (2, 7, 100, 5000):
                for i in range(3):
                    rng = np.random.default_rng([0, i, 0x9057])
                    scores, member = _draw(leak, n, one_run, rng)
                    if member.all() or not member.any():
                        continue
                    try:
                        r = audit_scores(scores, member, claimed_epsilon=2.0, seed=i,
                                         design="canaries" if one_run else "multi-run", **d).to_dict()
                    except Exception as e:  # the same refusal on both trees
                        r = repr(e)
                    out.append([family, eps, d, n, i, r])
    rr = hypothesised_leak(family="randomized-response", epsilon=2.01)
    out.append(["power", [simulated_power(n, 2.0, rr, simulations=20) for n in (50, 3000, 100_000)]])
    print(json.dumps(out, sort_keys=True, default=str))
else:
    leak = hypothesised_leak(family="randomized-response", epsilon=2.01)
    t0, c0 = time.perf_counter(), time.process_time()
    p = simulated_power(size, 2.0, leak, simulations=draws)
    print(json.dumps({"power": p, "wall": (time.perf_counter() - t0) / draws,
                      "cpu": (time.process_time() - c0) / draws}))
"""


def run(tree: str, *args: str) -> str:
    tree = os.path.abspath(tree)  # run in the tree: `python -c` puts the working directory first on sys.path
    child = f"import dpaudit; assert dpaudit.__file__.startswith({tree!r}), dpaudit.__file__\n{CHILD}"
    env = {**os.environ, "PYTHONPATH": tree}
    r = subprocess.run(
        [sys.executable, "-c", child, *args], env=env, cwd=tree, capture_output=True, text=True, check=True
    )
    return r.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    base_out, new_out = run(a.base, "outputs", "0", "0"), run(a.new, "outputs", "0", "0")
    if base_out != new_out:
        sys.exit("the trees' audit results differ")
    print(f"identical results on {len(json.loads(new_out))} audits and simulated powers")
    for k in range(a.rounds):
        for name, tree in (("base", a.base), ("new", a.new)):
            t = json.loads(run(tree, "time", str(a.size), str(a.draws)))
            print(f"round {k} {name}: {t['cpu']:.3f} s CPU, {t['wall']:.3f} s wall per audit (power {t['power']})")


if __name__ == "__main__":
    main()
