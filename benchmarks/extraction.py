"""Model extraction on digits: fidelity vs query budget, and equation solving under rounding.

    .venv/bin/python benchmarks/extraction.py                       # budgets 100,1000,10000
    .venv/bin/python benchmarks/extraction.py --budgets 100,1000 --decimals 3,4

Part 1, learning-based extraction of a digits MLP (hidden 128) through a probability API and a
label-only API, for a non-private target (the baseline, trained in the same run) and DP-SGD targets at
ε = 1 and 8; surrogate: the same MLP architecture, queries from the synthetic pool (a Gaussian fitted to
the attacker's aux split), one independent extraction per budget. Fidelity = agreement with the target
on the test split (1 - R_test) and on uniform inputs in the aux feature box (1 - R_unif).

Part 2, equation solving of a digits softmax regression (non-private, and DP at ε = 1, 8) from full,
then rounded probabilities: relative error of the recovered parameter differences and fidelity for
d+1 = 65 queries and multiples of it, and the fewest queries of the grid that reach a relative error
below 1e-2 and 1e-3.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder is sys.path[0], and benchmarks/attacks.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

# DP-SGD settings from benchmarks/RESULTS.md ("DP-SGD utility on digits", mlp column, chosen there on
# holdout accuracy); the non-private MLP uses dpaudit's defaults.
MLP_RECIPES = {
    "non-private": {"epochs": 30, "batch_size": 64, "lr": 0.1},
    "ε=8": {"algo": "dpsgd", "epochs": 60, "batch_size": 256, "lr": 1.0, "epsilon": 8.0},
    "ε=1": {"algo": "dpsgd", "epochs": 20, "batch_size": 128, "lr": 0.25, "epsilon": 1.0},
}
LOGREG_RECIPES = {
    "non-private": {"epochs": 40, "batch_size": 64, "lr": 0.1},
    "ε=8": {"algo": "dpsgd", "epochs": 20, "batch_size": 128, "lr": 2.0, "epsilon": 8.0},
    "ε=1": {"algo": "dpsgd", "epochs": 20, "batch_size": 128, "lr": 1.0, "epsilon": 1.0},
}
D = 64  # digits features


def train(out: Path, kind: str, recipe: dict) -> tuple[Path, float]:
    """Train a digits target (split seed 0, default fractions: 449 aux records); its path and test accuracy."""
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import DPConfig, TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset("digits")
    r = dict(recipe)
    eps = r.pop("epsilon", None)
    dp = DPConfig(target_epsilon=eps) if eps is not None else None
    spec = default_spec(kind, input_shape=ds.feature_shape, n_classes=ds.n_classes)
    meta = train_run(ds, spec, TrainConfig(**r, seed=0, dp=dp), out=out)
    return out, meta["metrics"]["test_accuracy"]


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="100,1000,10000")
    ap.add_argument("--decimals", default="5,4,3,2")
    ap.add_argument("--multiples", default="1,2,8,32,128", help="equation budgets as multiples of d+1")
    ap.add_argument("--skip-learning", action="store_true")
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    decimals = [int(k) for k in args.decimals.split(",")]
    multiples = [int(m) for m in args.multiples.split(",")]

    import torch

    from attacks.extraction import extract
    from dpaudit.checkpoint import load_run
    from dpaudit.errors import InputError

    torch.set_num_threads(1)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} torch thread, python {platform.python_version()}, "
          f"torch {torch.__version__}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        if not args.skip_learning:
            print("\n## Learning-based extraction of a digits MLP (surrogate: MLP, synthetic pool)\n")
            print("| target | test acc | api | queries | fidelity (test) | fidelity (uniform) | surrogate acc | s |")
            print("|---|---|---|---|---|---|---|---|")
            for name, recipe in MLP_RECIPES.items():
                path, acc = train(tmp_path / f"mlp-{name}", "mlp", recipe)
                run = load_run(path)
                ds = run.dataset()
                for api in ("probs", "labels"):
                    for b in budgets:
                        t0 = time.perf_counter()
                        r = extract(run, budget=b, api=api, method="learning", curve_points=1, dataset=ds).result
                        dt = time.perf_counter() - t0
                        cells = [name, pct(acc), api, r.queries, pct(r.fidelity), pct(r.fidelity_uniform),
                                 pct(r.surrogate_accuracy), f"{dt:.1f}"]  # fmt: skip
                        print("| " + " | ".join(map(str, cells)) + " |", flush=True)

        print("\n## Equation solving of a digits softmax regression (d+1 = 65 unknowns per class difference)\n")
        print("| target | api | queries | equations | rel. error | fidelity (test) | fidelity (uniform) |")
        print("|---|---|---|---|---|---|---|")
        runs = {}
        for name, recipe in LOGREG_RECIPES.items():
            path, _ = train(tmp_path / f"logreg-{name}", "logreg", recipe)
            runs[name] = load_run(path)
        needed: dict[str, dict[float, int | None]] = {}
        for name, run in runs.items():
            ds = run.dataset()
            apis = ["probs", *(f"rounded:{k}" for k in decimals)] if name == "non-private" else ["probs"]
            for api in apis:
                needed[f"{name} {api}"] = {1e-2: None, 1e-3: None}
                for m in multiples if api != "probs" else [1]:
                    b = m * (D + 1)
                    try:
                        r = extract(run, budget=b, api=api, method="equations", curve_points=1, dataset=ds).result
                    except InputError:  # too few usable equations at this budget (rounded to 0 or 1)
                        print(f"| {name} | {api} | {b} | too few usable | not solvable | — | — |")
                        continue
                    err = r.parameter_relative_error
                    for tol in (1e-2, 1e-3):
                        if err <= tol and needed[f"{name} {api}"][tol] is None:
                            needed[f"{name} {api}"][tol] = b
                    print(f"| {name} | {api} | {b} | {r.params['n_equations']} | {err:.2e} | "
                          f"{pct(r.fidelity)} | {pct(r.fidelity_uniform)} |", flush=True)  # fmt: skip
        print("\nFewest queries of the grid reaching a relative error ≤ 1e-2 / ≤ 1e-3:")
        for key, need in needed.items():
            show = [str(need[t]) if need[t] is not None else f"> {max(multiples) * (D + 1)}" for t in (1e-2, 1e-3)]
            print(f"  {key:<24} {show[0]:>7} / {show[1]:>7}")


if __name__ == "__main__":
    main()
