"""Tightness of the audits on DP-SGD (digits, δ = 1e-5): ε lower bound / claimed ε, one run each.

Rows (issue 12):
  (a) one-run (ε, δ) audit, Steinke, Nasr & Jagielski 2023 — m canaries in one run (formal);
  (b) one-run f-DP audit, Mahloujifar, Melis & Chaudhuri 2025, same canaries and scores:
      (b) the claim's own curve family (DP-SGD, noise multiplier varied; formal) and
      (b') the GDP family (estimate: ε of the refuted μ assumes a Gaussian curve);
  (c) per-step white-box audit (Nasr et al. 2023), one run with a per-step Dirac gradient canary:
      (c) composed ε estimate (assumes a Gaussian per-step trade-off) and (c-formal) the formal
      per-step bound over the per-step claim;
  (d) black-box crafted canaries: :func:`blackbox_canaries.crafted_row` (helper "canary12"), with
      ``--crafted`` (multi-run: expensive).

Wall times are printed as multiples of one plain training run of the same recipe measured in the same
process (the machine this was written on was contended; the lead reruns it on an idle one).

    .venv/bin/python benchmarks/audit_tightness.py                      # full: eps 2 4 8, 1000 canaries
    .venv/bin/python benchmarks/audit_tightness.py --tiny               # smoke test (seconds)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

# Run as a script, this folder comes first on sys.path and benchmarks/attacks.py would shadow the
# `attacks` package: drop it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def _sibling(name: str):
    """The module ``benchmarks/NAME.py`` (loaded by path: this folder is off sys.path, see above)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recipe(eps: float, args):
    from dpaudit.training.config import DPConfig, TrainConfig

    dp = DPConfig(clip=1.0, target_epsilon=eps, delta=args.delta, sampling="poisson")
    return TrainConfig(algo="dpsgd", epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed, dp=dp)


def _one_run_rows(ds, spec, eps, args) -> dict:
    """(a) and (b): one training run with m canaries (each included w.p. 1/2), scored black-box."""
    from attacks.threshold import logit_margin
    from dpaudit.audit import audit_scores
    from dpaudit.audit.fdp_one_run import dpsgd_family
    from dpaudit.canaries import make_canaries, with_canaries
    from dpaudit.data import make_splits
    from dpaudit.training.config import PerfConfig
    from dpaudit.training.run import fit_model

    splits = make_splits(len(ds), args.seed)
    canaries = make_canaries(ds, splits, m=args.canaries, kind=args.canary_kind, seed=args.seed)
    data, train_idx, canary_idx = with_canaries(ds, splits, canaries)
    pre_idx = splits.aux if len(splits.aux) else splits.members
    config = _recipe(eps, args)
    t0 = time.perf_counter()
    fitted = fit_model(data, train_idx, spec, config, PerfConfig(device="cpu"), preprocessing_idx=pre_idx)
    t_train = time.perf_counter() - t0
    claim = fitted.outcome.privacy
    scores = logit_margin(fitted.logits(data.X[canary_idx]), data.y[canary_idx])
    member = canaries.included
    kw = dict(design="canaries", delta=args.delta, claimed_epsilon=eps, threshold_selection="bonferroni", seed=0)
    out = {"claim": {k: claim[k] for k in ("epsilon", "noise_multiplier", "sample_rate", "steps")}}
    t0 = time.perf_counter()
    a = audit_scores(scores, member, method="one-run", **kw)
    out["a"] = (a.epsilon_lower_bound, time.perf_counter() - t0 + t_train)
    t0 = time.perf_counter()
    family = dpsgd_family(float(claim["sample_rate"]), int(claim["steps"]))
    b = audit_scores(scores, member, method="one-run-fdp", tradeoff=family, **kw)
    out["b"] = (b.epsilon_lower_bound, time.perf_counter() - t0 + t_train)
    t0 = time.perf_counter()
    g = audit_scores(scores, member, method="one-run-fdp", tradeoff="gdp", **kw)
    out["b_gdp"] = (g.epsilon_lower_bound, time.perf_counter() - t0 + t_train)
    out["max_certifiable"] = {"a": a.max_certifiable_epsilon, "b": b.max_certifiable_epsilon,
                              "b_gdp": g.max_certifiable_epsilon}  # fmt: skip
    out["verdicts"] = {"a": a.verdict, "b": b.verdict, "b_gdp": g.verdict}
    out["correct"] = (b.counts["correct"], b.counts["guesses"])
    return out, t_train


def _whitebox_row(ds, spec, eps, args) -> dict:
    """(c): one run with a per-step Dirac gradient canary."""
    from dpaudit.workflows.whitebox import audit_whitebox_steps

    t0 = time.perf_counter()
    w = audit_whitebox_steps(ds, spec, _recipe(eps, args), seed=args.seed, claimed_epsilon=None)
    st = w.steps
    return {
        "c": (st.composed_epsilon_estimate, time.perf_counter() - t0),
        "c_point": st.composed_epsilon_point,
        "c_formal_step": (st.per_step.epsilon_lower_bound, st.per_step_claimed_epsilon),
        "c_claim": w.claim["epsilon"],
        "c_steps": st.steps,
        "c_verdicts": {"per_step": st.per_step.verdict, "composed": st.composed_verdict},
    }


def crafted_rows(eps: float, args) -> dict:
    """(d): black-box crafted canaries from :func:`blackbox_canaries.crafted_row` (helper canary12),
    the experiment driver beside this script."""
    crafted_row = _sibling("blackbox_canaries").crafted_row
    t0 = time.perf_counter()
    row = crafted_row(eps, delta=args.delta, runs=args.crafted_runs, seed=args.seed, workers=args.workers)
    row["wall_s"] = time.perf_counter() - t0
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilons", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    p.add_argument("--canaries", type=int, default=1000)
    p.add_argument("--canary-kind", default="mislabeled")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--crafted", action="store_true", help="also row (d) (multi-run, expensive)")
    p.add_argument("--crafted-runs", type=int, default=200)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--tiny", action="store_true", help="smoke test: eps 8, 100 canaries, 2 epochs")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.tiny:
        args.epsilons, args.canaries, args.epochs = [8.0], 100, 2
    torch.set_num_threads(1)
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec

    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    rows = []
    for eps in args.epsilons:
        one, t_train = _one_run_rows(ds, spec, eps, args)
        wb = _whitebox_row(ds, spec, eps, args)
        d = crafted_rows(eps, args) if args.crafted else None
        rows.append({"claimed_epsilon": eps, **one, **wb, "d": d, "t_train": t_train})
    if args.json:
        print(json.dumps(rows, indent=1, default=float))
        return
    print(
        f"DP-SGD logreg on digits, delta={args.delta:g}, {args.canaries} {args.canary_kind} canaries, "
        f"{args.epochs} epochs, batch {args.batch_size}; wall time in multiples of one plain training run"
    )
    print(f"{'claim':>6} {'row':<34} {'eps_lb':>8} {'/claim':>7} {'wall x':>7}  note")
    for r in rows:
        e, tt = r["claimed_epsilon"], max(r["t_train"], 1e-9)
        mc, vd = r["max_certifiable"], r["verdicts"]
        lines = [
            ("(a) one-run (eps,delta)", r["a"], f"max cert {mc['a']:.3g}; {vd['a']}"),
            ("(b) one-run f-DP, claim's curve", r["b"], f"max cert {mc['b']:.3g}; {vd['b']}"),
            ("(b') one-run f-DP, GDP [estimate]", r["b_gdp"], f"max cert {r['max_certifiable']['b_gdp']:.3g}"),
            ("(c) white-box per step [estimate]", r["c"],
             f"T={r['c_steps']}, point {r['c_point']:.3g}; per-step formal {r['c_formal_step'][0]:.3g}"
             f"/{r['c_formal_step'][1]:.3g}; {r['c_verdicts']}"),
        ]  # fmt: skip
        for name, (lb, wall), note in lines:
            print(f"{e:>6g} {name:<34} {lb:>8.3f} {lb / e:>7.2f} {wall / tt:>7.1f}  {note}")
        if r["d"] is not None:
            best = r["d"].get("best")
            print(f"{e:>6g} {'(d) black-box crafted (multi-run)':<34} {json.dumps(best, default=float)[:60]}")
        print(f"{'':>6} canaries: {r['correct'][0]} of {r['correct'][1]} guesses correct; claim {r['claim']}")


if __name__ == "__main__":
    main()
