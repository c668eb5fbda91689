"""`audit plan` on a grid of 29 cases under two source trees: CPU seconds and whether each JSON is byte-identical.

Usage (from the repository root):

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/audit_plan_grid.py BASE_TREE NEW_TREE OUT_DIR [CASE ...]
        [--slow]

BASE_TREE and NEW_TREE are folders holding a ``dpaudit`` package (e.g. ``git archive BASE | tar -x -C /tmp/base``
and ``.``). Each case runs ``python -m dpaudit audit plan ARGS --json`` once per tree, back to back, in a fresh
process (PYTHONPATH = the tree); the CPU seconds are the child's rusage (user + system), since on a shared machine
wall time is mostly other processes'. stdout and stderr of each run are kept under OUT_DIR/{base,new}/CASE.{out,err}
and compared byte for byte; a line per case and a Markdown table at the end are printed. ``--slow`` adds the case
that runs for minutes (one-run at a claim of 8, near that design's ceiling); name cases to run only those.
The cases are the grid of benchmarks/RESULTS.md, "audit plan's simulated audits" (tenth session), plus one-run 2.2.
Results: benchmarks/RESULTS.md, "`audit plan` past the one-run ceiling".
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys

CASES = {
    "rr_e2_default": "--epsilon 2",
    "rr_e2_t3_readme": "--epsilon 2 --true-epsilon 3 --family randomized-response",
    "rr_e0.5": "--epsilon 0.5",
    "rr_e1": "--epsilon 1",
    "rr_e4": "--epsilon 4",
    "rr_e8": "--epsilon 8",
    "rr_e2.01": "--epsilon 2.01",
    "rr_e2_t2.3": "--epsilon 2 --true-epsilon 2.3",
    "rr_e2_t2.05": "--epsilon 2 --true-epsilon 2.05",
    "rr_e2_t2.0000001": "--epsilon 2 --true-epsilon 2.0000001",
    "rr_e1_c99": "--epsilon 1 --confidence 0.99",
    "rr_e4_t5_c99_d1e-3": "--epsilon 4 --true-epsilon 5 --confidence 0.99 --delta 1e-3",
    "gauss_e1_mu2": "--epsilon 1 --mu 2 --family gaussian",
    "gauss_e2_t3_d1e-3": "--epsilon 2 --true-epsilon 3 --family gaussian --delta 1e-3",
    "gauss_e0.5_mu1_d1e-3": "--epsilon 0.5 --mu 1 --family gaussian --delta 1e-3",
    "gdp_e1_mu1.5": "--method gdp --epsilon 1 --mu 1.5",
    "gdp_e2": "--method gdp --epsilon 2",
    "bonf_e2": "--threshold-selection bonferroni --epsilon 2",
    "twosided_e1": "--two-sided --epsilon 1",
    "onerun_e1": "--method one-run --epsilon 1",
    "onerun_e2_t3": "--method one-run --epsilon 2 --true-epsilon 3",
    "onerun_e2_c99_d1e-3": "--method one-run --epsilon 2 --confidence 0.99 --delta 1e-3",
    "onerun_e1_tests2": "--method one-run --epsilon 1 --tests 2",
    "fdp_e2_t6": "--method one-run-fdp --epsilon 2 --true-epsilon 6",
    "fdp_e1_mu2_gauss": "--method one-run-fdp --epsilon 1 --mu 2 --family gaussian",
    "fdp_e1_gdp": "--method one-run-fdp --epsilon 1 --tradeoff gdp",
    "rr_e2_t2.01": "--epsilon 2 --true-epsilon 2.01",
    "onerun_e2_t2.2": "--method one-run --epsilon 2 --true-epsilon 2.2",
}
SLOW = {"onerun_e8": "--method one-run --epsilon 8"}


def run(tree: str, out: str, name: str, args: str) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(
        [sys.executable, "-m", "dpaudit", "audit", "plan", *args.split(), "--json"],
        capture_output=True, text=True, env=env, cwd=tree,
    )  # fmt: skip
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    os.makedirs(out, exist_ok=True)
    for ext, text in (("out", p.stdout), ("err", p.stderr)):
        with open(os.path.join(out, f"{name}.{ext}"), "w") as f:
            f.write(text)
    return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), p.returncode


def same(a: str, b: str, name: str, ext: str) -> bool:
    with open(os.path.join(a, f"{name}.{ext}")) as fa, open(os.path.join(b, f"{name}.{ext}")) as fb:
        return fa.read() == fb.read()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("out")
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--slow", action="store_true")
    args = ap.parse_args()
    cases = {**CASES, **(SLOW if args.slow else {})}
    if args.cases:
        cases = {k: v for k, v in {**CASES, **SLOW}.items() if k in args.cases}
    base_out, new_out = os.path.join(args.out, "base"), os.path.join(args.out, "new")
    rows, total = [], [0.0, 0.0]
    for name, case in cases.items():
        (t0, rc0), (t1, rc1) = run(args.base, base_out, name, case), run(args.new, new_out, name, case)
        total[0], total[1] = total[0] + t0, total[1] + t1
        json_same = same(base_out, new_out, name, "out")
        err_same = same(base_out, new_out, name, "err")
        print(name, f"rc {rc0}/{rc1} cpu {t0:.1f} -> {t1:.1f} json {json_same} stderr {err_same}", flush=True)
        rows.append(f"| `{case}` | {rc0}/{rc1} | {t0:.1f} → {t1:.1f} | {'yes' if json_same else 'NO'} | "
                    f"{'yes' if err_same else 'no'} |")  # fmt: skip
    print("\n| case (`audit plan … --json`) | exit old/new | CPU s old → new | JSON identical | stderr identical |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\ntotal CPU {total[0]:.1f} -> {total[1]:.1f}, {len(rows)} cases")


if __name__ == "__main__":
    main()
