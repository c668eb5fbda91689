"""Accuracy vs epsilon tables for PATE and DP-ICL, and the ICL membership attack's AUC (issue 16).

Prints Markdown tables (no wall-clock numbers):
1. PATE on digits: student test accuracy vs data-independent epsilon (the claim) and the data-dependent
   epsilon (labelled: not private), with the number of answered queries, for LNMax, GNMax and
   Confident-GNMax (the shape of Papernot et al. 2018, Table 2).
2. DP-ICL on digits and breast-cancer: answer and student accuracy for epsilon in {1, 3, 8, inf}.
3. The ICL membership attack's AUC at epsilon = inf (one prompt) and 1 (DP-ICL), with the one-run canary
   audit's formal lower bound beside it.

    .venv/bin/python benchmarks/pate.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

# Run as a script, this file's folder is sys.path[0], and benchmarks/attacks.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dpaudit.aggregation import (  # noqa: E402
    AggregatorConfig,
    aggregate,
    calibrate_aggregator,
    privacy_record,
    private_diagnostics,
    vote_histogram,
)
from dpaudit.data import Dataset, load_dataset, make_splits  # noqa: E402
from dpaudit.models import default_spec  # noqa: E402
from dpaudit.training.config import PerfConfig, TrainConfig  # noqa: E402
from dpaudit.training.icl import make_predictor  # noqa: E402
from dpaudit.training.pate import (  # noqa: E402
    AggregationConfig,
    icl_votes,
    pate_votes,
    public_preprocessing,
    subsampled_icl_hist,
    teacher_parts,
)
from dpaudit.training.run import evaluate, fit_model  # noqa: E402

SPLIT = (0.6, 0.05, 0.25, 0.1)  # members (private), holdout, aux (public queries), test
STUDENT = TrainConfig(algo="sgd", epochs=40, batch_size=32, lr=0.05, momentum=0.9)
DELTA = 1e-5


def _student_accuracy(ds, spec, pre, q_idx, answers, test_idx) -> float:
    ok = answers >= 0
    if not ok.any():
        return math.nan
    student = Dataset(ds.name, ds.X[q_idx[ok]], answers[ok], ds.n_classes, ds.kind, ds.source)
    cfg = dataclasses.replace(STUDENT, batch_size=min(STUDENT.batch_size, int(ok.sum())))
    fitted = fit_model(student, np.arange(int(ok.sum())), spec, cfg, PerfConfig(device="cpu"), preprocessing=pre)
    return evaluate(fitted, ds, test_idx)["accuracy"]


def _row(name, q, ans, rec, diag, sanitised, acc, true):
    ok = ans >= 0
    di = math.inf if rec is None else rec["epsilon"]
    dd = (diag or {}).get("data_dependent_epsilon")
    dd_text = "—" if dd is None else f"{dd:.2f}"
    san_text = "—" if sanitised is None else f"{sanitised:.2f}"
    label_acc = float(np.mean(ans[ok] == true[ok])) if ok.any() else math.nan
    return f"| {name} | {q} | {int(ok.sum())} | {di:.2f} | {dd_text} | {san_text} | {label_acc:.3f} | {acc:.3f} |"


def pate_table(quick: bool) -> None:
    ds = load_dataset("digits")
    splits = make_splits(len(ds), 0, SPLIT)
    pre = public_preprocessing(ds, splits)
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    k = 20 if quick else 50
    agg0 = AggregatorConfig("gnmax", sigma=1.0)
    cfg = AggregationConfig(algo="pate", teachers=k, aggregator=agg0, queries=len(splits.aux), seed=0)
    parts = teacher_parts(len(splits.members), cfg)
    perm = np.random.default_rng(0).permutation(len(splits.aux))
    q_all = splits.aux[perm]
    teacher = dataclasses.replace(STUDENT, epochs=20 if quick else 60)
    votes = pate_votes(ds, splits.members, parts, spec, teacher, pre, ds.X[q_all])
    hist_all = vote_histogram(votes, ds.n_classes)
    true_all = ds.y[q_all]
    print(f"\n### PATE on digits: {k} logreg teachers on {len(splits.members)} private records, public pool "
          f"{len(q_all)}, test {len(splits.test)}, delta = {DELTA:g}")  # fmt: skip
    teacher_acc, vote_acc = np.mean(votes == true_all[None]), np.mean(hist_all.argmax(1) == true_all)
    print(f"(teacher accuracy on the queries {teacher_acc:.3f}, plurality vote {vote_acc:.3f}; both from the "
          "private votes, for the reader only)\n")  # fmt: skip
    print("| aggregator | queries | answered | ε (claim, data-indep.) | ε data-dep. (not private) "
          "| ε sanitised (--claim data-dependent) | label acc. | student test acc. |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    qs = (50, 150) if quick else (50, 100, 200, 400)
    rows = [(f"LNMax b={k / 20:g}", AggregatorConfig("lnmax", sigma=k / 20), q) for q in qs]
    rows += [(f"GNMax σ={k / 10:g}", AggregatorConfig("gnmax", sigma=k / 10), q) for q in qs]
    conf = AggregatorConfig("confident-gnmax", sigma=k / 10, sigma1=k / 5, threshold=0.7 * k)
    rows += [(f"Confident-GNMax T={0.7 * k:g}, σ1={k / 5:g}, σ2={k / 10:g}", conf, q) for q in qs]
    capped = dataclasses.replace(conf, max_answers=qs[-1] * 2 // 5)  # a cap fixed in advance enters the claim
    rows += [(f"Confident-GNMax as above, --max-answers {capped.max_answers}", capped, qs[-1])]
    rows += [("argmax (no noise)", AggregatorConfig("argmax"), qs[-1])]
    for name, agg, q in rows:
        hist, true, q_idx = hist_all[:q], true_all[:q], q_all[:q]
        ans = aggregate(hist, agg, 1)
        rec = privacy_record(agg, hist, ans, delta=DELTA, n_teachers=k)
        diag = private_diagnostics(agg, hist, ans, delta=DELTA, n_teachers=k)  # NOT private: for the reader
        sanitised = None
        if agg.name in ("gnmax", "confident-gnmax"):
            sanitised = privacy_record(agg, hist, ans, delta=DELTA, n_teachers=k, claim="data-dependent")["epsilon"]
        acc = _student_accuracy(ds, spec, pre, q_idx, ans, splits.test)
        print(_row(name, q, ans, rec, diag, sanitised, acc, true))


def icl_table(quick: bool) -> None:
    print(f"\n### DP-ICL (nearest-exemplar in-context predictor), GNMax calibrated to ε at δ = {DELTA:g}\n")
    print("| data | teachers | queries | ε | label acc. | student test acc. |")
    print("|---|---|---|---|---|---|")
    for data, shots, k in (("digits", 10, 40), ("breast-cancer", 4, 40)):
        ds = load_dataset(data)
        splits = make_splits(len(ds), 0, SPLIT)
        pre = public_preprocessing(ds, splits)
        spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
        q = min(100, len(splits.aux))
        cfg = AggregationConfig(
            algo="dp-icl", teachers=k, shots=shots, aggregator=AggregatorConfig("argmax"), queries=q
        )
        parts = teacher_parts(len(splits.members), cfg)
        q_idx = splits.aux[np.random.default_rng(0).permutation(len(splits.aux))[:q]]
        votes = icl_votes(make_predictor("knn", ds.n_classes), pre.transform(ds.X[splits.members]),
                          ds.y[splits.members], parts, pre.transform(ds.X[q_idx]))  # fmt: skip
        hist = vote_histogram(votes, ds.n_classes)
        for eps in (1.0, 3.0, 8.0, math.inf):
            if math.isinf(eps):
                agg = AggregatorConfig("argmax")
            else:
                agg = calibrate_aggregator(AggregatorConfig("gnmax", sigma=1.0), target_epsilon=eps, delta=DELTA,
                                           n_queries=q, n_classes=ds.n_classes)  # fmt: skip
            ans = aggregate(hist, agg, 1)
            acc = _student_accuracy(ds, spec, pre, q_idx, ans, splits.test)
            label_acc = float(np.mean(ans == ds.y[q_idx]))
            print(f"| {data} | fixed {k} × {shots} | {q} | {eps:g} | {label_acc:.3f} | {acc:.3f} |")
        # Per-query Poisson subsampling with the same expected prompt size (q N / K = shots), issue 28.
        rate = min(1.0, shots * k / len(splits.members))
        ex_X, ex_y = pre.transform(ds.X[splits.members]), ds.y[splits.members]
        for eps in (1.0, 3.0, 8.0, math.inf):
            base = AggregatorConfig("gnmax", sigma=1.0, sample_rate=rate)
            sub = AggregationConfig(algo="dp-icl", teachers=k, aggregator=base, queries=q, seed=0)
            hist_s = subsampled_icl_hist(make_predictor("knn", ds.n_classes), ex_X, ex_y, pre.transform(ds.X[q_idx]),
                                         sub, ds.n_classes)  # fmt: skip
            if math.isinf(eps):
                agg = AggregatorConfig("argmax")
            else:
                agg = calibrate_aggregator(base, target_epsilon=eps, delta=DELTA, n_queries=q, n_classes=ds.n_classes)
            ans = aggregate(hist_s, agg, 1)
            acc = _student_accuracy(ds, spec, pre, q_idx, ans, splits.test)
            label_acc = float(np.mean(ans == ds.y[q_idx]))
            print(f"| {data} | Poisson q={rate:.2f}, {k} teachers | {q} | {eps:g} | {label_acc:.3f} | {acc:.3f} |")


def attack_table(quick: bool) -> None:
    from attacks.icl import icl_membership
    from dpaudit.data import Standardizer
    from dpaudit.workflows.icl import icl_canary_audit

    print("\n### ICL membership attack (was this record an exemplar?)\n")
    print("| data | setting | ε | attack AUC (estimate) | canary one-run ε lower bound (formal, 95%) |")
    print("|---|---|---|---|---|")
    for data, shots in (("digits", 20), ("breast-cancer", 4)):
        ds = load_dataset(data)
        X = Standardizer.fit(ds.X).transform(ds.X)
        c = ds.n_classes
        r = icl_membership(X, ds.y, c, shots=shots, trials=20, seed=0)
        a = icl_canary_audit(X, ds.y, c, canaries=200, shots=shots, seed=0)
        print(f"| {data} | one prompt, {shots} shots | ∞ | {r.metrics['auc']:.3f} | {a.epsilon_lower_bound:.2f} |")
        k = 10
        r = icl_membership(X, ds.y, c, shots=shots, teachers=k, epsilon=1.0, trials=5, seed=0)
        a = icl_canary_audit(X, ds.y, c, canaries=200, shots=shots, teachers=k, epsilon=1.0, seed=0)
        print(f"| {data} | DP-ICL {k} × {shots}, GNMax | 1 | {r.metrics['auc']:.3f} | {a.epsilon_lower_bound:.2f} "
              f"({a.verdict}) |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer teachers and rows (a smoke test)")
    parser.add_argument("--only", choices=("pate", "icl", "attack"), help="print one table")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for table in (pate_table, icl_table, attack_table):
        if args.only is None or table.__name__.startswith(args.only):
            table(args.quick)


if __name__ == "__main__":
    main()
