"""Metamorphic sweep of the attack and audit layers: relations that must hold without an oracle.

Run: ``nice python benchmarks/attack_audit_sweep.py [--seed 0] [--scale 1] [--sections a,b,...]`` from the repository
root (PYTHONPATH=. outside the installed package). Prints, per relation, the number of cases checked and of
violations with the first few; exit 1 when any relation is violated. (The holdout design's record order, α and δ
relations were counted only, as "adaptive", until its half was drawn on a canonical order and its test chosen at a
fixed level: dpaudit.audit.holdout.) Sections:

* metrics: ``attacks.metrics.evaluate`` — record order, strictly increasing maps (point metrics and bootstrap CIs),
  negation / class swap (AUC -> 1 - AUC), both (unchanged), k copies, the seed, the global NumPy state.
* threshold: the four reference-free scores and phi — class renaming (bit-exact), record order, a per-record logit
  shift.
* reference (LiRA, RMIA): record (row) order with the IN mask, model (column) order, positive-affine signal units
  and the mirror (LiRA), copies of every model (RMIA).
* attribute: the post-stratified leakage and its permutation p-value — record order, members <-> non-members,
  renaming the hidden values (leakage and p-value), 3 copies, one more right member guess.
* audit: ``dpaudit.audit.audit_scores`` for every method and selection — record order (every design, ties
  included), strictly increasing maps, the global NumPy/torch state, a smaller α and a
  larger δ never raising the bound (every design), one more true positive and
  k copies of the data at a fixed threshold never lowering it.
* onerun: ``one_run_epsilon_lower_bound`` — monotone in v, in one more right/wrong guess, α, δ and m.
* design: ``max_certifiable_epsilon`` non-increasing in confidence and in δ; non-decreasing in the number of canaries
  (one-run Bonferroni, within 1 %: its grid and 2mδ term move a little with m); the verdict monotone in the claim and
  in the bound.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

# Run as a script, this file's folder is sys.path[0], and benchmarks/attacks.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from attacks.attribute import leakage_permutation_test, leakage_strata, poststratified_leakage  # noqa: E402
from attacks.lira import LiRA, balanced_membership  # noqa: E402 (after the sys.path fix above)
from attacks.metrics import evaluate  # noqa: E402 (after the sys.path fix above)
from attacks.rmia import RMIA  # noqa: E402 (after the sys.path fix above)
from attacks.threshold import THRESHOLD_METHODS, logit_margin, threshold_scores  # noqa: E402 (after the sys.path fix above)
from dpaudit.audit import audit_scores, decide_verdict, max_certifiable_epsilon, one_run_epsilon_lower_bound  # noqa: E402 (after the sys.path fix above)

DESIGN = {"clopper-pearson": "multi-run", "gdp": "multi-run", "one-run": "canaries", "one-run-fdp": "canaries"}
checked: dict[str, int] = defaultdict(int)
violations: dict[str, list] = defaultdict(list)


def check(name: str, ok: bool, info=None) -> None:
    checked[name] += 1
    if not ok:
        violations[name].append(info)


POINT = ("auc", "balanced_accuracy", "advantage", "tpr_at_fpr")


def metrics_section(rng: np.random.Generator, n_cases: int) -> None:
    for case in range(n_cases):
        n = int(rng.integers(4, 60))
        m = rng.random(n) < rng.uniform(0.2, 0.8)
        if m.all() or not m.any():
            continue
        s = rng.integers(-3, 4, n).astype(float) if case % 3 == 0 else rng.normal(size=n) + m * rng.uniform(0, 2)
        base = evaluate(s, m, n_bootstrap=20, seed=1)
        p = rng.permutation(n)
        perm = evaluate(s[p], m[p], n_bootstrap=20, seed=1)
        check("metrics: record order (point metrics)", all(perm[k] == base[k] for k in POINT), case)
        check("metrics: record order (bootstrap CI)", perm["ci"] == base["ci"], case)
        for f in (lambda x: np.exp(x / 3), lambda x: 2.5 * x + 1, np.arctan):
            other = evaluate(f(s), m, n_bootstrap=20, seed=1)
            check(
                "metrics: increasing map (point metrics and CI)",
                all(other[k] == base[k] for k in POINT) and other["ci"] == base["ci"],
                case,
            )
        auc = base["auc"]
        check("metrics: negation, AUC -> 1 - AUC", abs(evaluate(-s, m, n_bootstrap=0)["auc"] - (1 - auc)) < 1e-12)
        check("metrics: class swap, AUC -> 1 - AUC", abs(evaluate(s, ~m, n_bootstrap=0)["auc"] - (1 - auc)) < 1e-12)
        both = evaluate(-s, ~m, n_bootstrap=0)
        check("metrics: negation and swap, unchanged", all(abs(both[k] - base[k]) < 1e-12 for k in POINT[:3]))
        k = int(rng.integers(2, 4))
        copies = evaluate(np.tile(s, k), np.tile(m, k), n_bootstrap=0)
        check(
            "metrics: k copies, same AUC/accuracy/advantage", all(abs(copies[q] - base[q]) < 1e-12 for q in POINT[:3])
        )
        twice = [evaluate(s, m, n_bootstrap=20, seed=3)["ci"] for _ in range(2)]
        check("metrics: same seed twice", twice[0] == twice[1])
        np.random.seed(case)  # noqa: NPY002 (the global state an unseeded draw would read)
        check("metrics: global NumPy state", evaluate(s, m, n_bootstrap=20, seed=1)["ci"] == base["ci"], case)


def threshold_section(rng: np.random.Generator, n_cases: int) -> None:
    for case in range(n_cases):
        n, k = int(rng.integers(2, 30)), int(rng.integers(2, 11))
        z = rng.normal(size=(n, k)) * rng.uniform(0.1, 20)
        y = rng.integers(0, k, n)
        names = rng.permutation(k)
        z2 = np.empty_like(z)
        z2[:, names] = z
        rows = rng.permutation(n)
        shift = rng.normal(size=(n, 1)) * 5
        for method in THRESHOLD_METHODS:
            a = threshold_scores(method, z, y)
            renamed = threshold_scores(method, z2, names[y])
            check(f"threshold: class renaming, bit-exact ({method})", np.array_equal(a, renamed), case)
            check(
                f"threshold: record order ({method})",
                np.array_equal(threshold_scores(method, z[rows], y[rows]), a[rows]),
                case,
            )
            check(
                f"threshold: logit shift ({method})",
                np.allclose(threshold_scores(method, z + shift, y), a, 1e-9, 1e-9),
                case,
            )
        check(
            "threshold: class renaming, bit-exact (phi)", np.array_equal(logit_margin(z, y), logit_margin(z2, names[y]))
        )


def reference_section(rng: np.random.Generator, n_cases: int) -> None:
    for case in range(n_cases):
        n, n_models = int(rng.integers(3, 30)), int(rng.choice([4, 6, 8, 70, 80]))
        inm = balanced_membership(n, n_models, seed=case)
        mu = rng.normal(size=(n, 1))
        S = mu + rng.normal(size=(n, n_models)) * rng.uniform(0.3, 2) + inm * rng.uniform(0, 2)
        x = mu[:, 0] + rng.normal(size=n) + (rng.random(n) < 0.5)
        rows, cols = rng.permutation(n), rng.permutation(n_models)
        for online in (True, False):
            for gv in ("auto", True, False):
                kw = {"online": online, "global_variance": gv}
                a = LiRA(**kw).fit_score(S, inm, x)
                b = LiRA(**kw).fit_score(S[rows], inm[rows], x[rows])
                check("lira: record order with the IN mask", np.allclose(b, a[rows], 1e-9, 1e-9), case)
                b = LiRA(**kw).fit_score(S[:, cols], inm[:, cols], x)
                check("lira: model order", np.allclose(b, a, 1e-9, 1e-9), case)
                sl, of = rng.uniform(0.2, 5), rng.normal() * 3
                b = LiRA(**kw).fit_score(sl * S + of, inm, sl * x + of)
                check("lira: positive-affine signal units", np.allclose(b, a, 1e-7, 1e-7), case)
                if online:
                    check(
                        "lira: mirror (-signals, IN<->OUT)",
                        np.allclose(LiRA(**kw).fit_score(-S, ~inm, -x), -a, 1e-9, 1e-9),
                        case,
                    )
        lp, xt = -np.abs(S) - 0.01, -np.abs(x) - 0.01
        for online in (True, False):
            a = RMIA(online=online).fit(lp, inm).score(xt)
            b = RMIA(online=online).fit(lp[rows], inm[rows]).score(xt[rows])
            check("rmia: record order", np.allclose(b, a[rows], 1e-12, 1e-12), case)
            check(
                "rmia: model order",
                np.allclose(RMIA(online=online).fit(lp[:, cols], inm[:, cols]).score(xt), a, 1e-12, 1e-12),
                case,
            )
            check(
                "rmia: copies of every model",
                np.allclose(RMIA(online=online).fit(np.tile(lp, 2), np.tile(inm, 2)).score(xt), a, 1e-12, 1e-12),
                case,
            )


def attribute_section(rng: np.random.Generator, n_cases: int) -> None:
    for _ in range(n_cases):
        nm, nn = int(rng.integers(5, 60)), int(rng.integers(5, 60))
        n_values, n_labels = int(rng.integers(2, 4)), int(rng.integers(2, 4))
        tm, tn = rng.integers(0, n_values, nm), rng.integers(0, n_values, nn)
        ym, yn = rng.integers(0, n_labels, nm), rng.integers(0, n_labels, nn)
        cm, cn = rng.random(nm) < 0.6, rng.random(nn) < 0.5
        strata = leakage_strata(tm, ym, cm, tn, yn, cn)
        leak = poststratified_leakage(strata)
        if np.isnan(leak):
            continue
        p_value = leakage_permutation_test(strata, permutations=2000)["p_value"]
        pm, pn = rng.permutation(nm), rng.permutation(nn)
        check(
            "attribute: record order",
            np.array_equal(leakage_strata(tm[pm], ym[pm], cm[pm], tn[pn], yn[pn], cn[pn]), strata),
        )
        swapped = poststratified_leakage(leakage_strata(tn, yn, cn, tm, ym, cm))
        check("attribute: members <-> non-members negates the leakage", abs(swapped + leak) < 1e-12, (leak, swapped))
        names = rng.permutation(n_values)
        renamed = leakage_strata(names[tm], ym, cm, names[tn], yn, cn)
        check("attribute: value renaming, leakage bit-exact", poststratified_leakage(renamed) == leak)
        p2 = leakage_permutation_test(renamed, permutations=2000)["p_value"]
        check("attribute: value renaming, same p-value", p2 == p_value, (p_value, p2))
        copies = leakage_strata(*(np.tile(a, 3) for a in (tm, ym, cm, tn, yn, cn)))
        check("attribute: 3 copies, same leakage", abs(poststratified_leakage(copies) - leak) < 1e-12)
        wrong = np.flatnonzero(~cm)
        if len(wrong):
            more = cm.copy()
            more[wrong[0]] = True
            check(
                "attribute: one more right member guess never lowers",
                poststratified_leakage(leakage_strata(tm, ym, more, tn, yn, cn)) >= leak - 1e-12,
            )


def _key(r):
    return r.epsilon_lower_bound, r.verdict, r.counts, r.max_certifiable_epsilon


def audit_section(rng: np.random.Generator, n_cases: int) -> None:
    for case in range(n_cases):
        n = int(rng.integers(20, 120))
        for method in DESIGN:
            mem = rng.random(n) < 0.5
            if mem.sum() < 2 or (~mem).sum() < 2:
                continue
            ties = case % 4 == 0
            s = (rng.integers(0, 5, n).astype(float) if ties else rng.normal(size=n)) + mem * rng.uniform(0, 3)
            p = rng.permutation(n)
            for sel in ("holdout", "bonferroni"):
                kw = {
                    "method": method,
                    "design": DESIGN[method],
                    "threshold_selection": sel,
                    "seed": case,
                    "claimed_epsilon": 0.5,
                }
                a = audit_scores(s, mem, **kw)
                check(
                    f"audit: record order ({sel}{', with ties' if ties else ''})",
                    _key(a) == _key(audit_scores(s[p], mem[p], **kw)),
                    (case, method, a.epsilon_lower_bound),
                )
                if not ties:
                    check(
                        "audit: increasing map",
                        _key(a) == _key(audit_scores(np.exp(s / 2) + 7.0, mem, **kw)),
                        (case, method, sel),
                    )
                np.random.seed(case + 1)  # noqa: NPY002 (the global state an unseeded draw would read)
                torch.manual_seed(case + 5)
                check("audit: global NumPy/torch state", _key(a) == _key(audit_scores(s, mem, **kw)), (case, method))
                e = a.epsilon_lower_bound
                b = audit_scores(s, mem, **{**kw, "confidence": 0.99}).epsilon_lower_bound
                check(
                    f"audit: smaller alpha never raises the bound ({sel})",
                    b <= e + 1e-12,
                    (case, method, e, b),
                )
                b = audit_scores(s, mem, **{**kw, "delta": 1e-3}).epsilon_lower_bound
                check(
                    f"audit: larger delta never raises the bound ({sel})",
                    b <= e + 1e-12,
                    (case, method, e, b),
                )
            if method in ("clopper-pearson", "gdp"):
                t = float(np.median(s))
                kw = {"method": method, "design": "multi-run", "threshold": t}
                a = audit_scores(s, mem, **kw)
                check("audit: record order (fixed threshold)", _key(a) == _key(audit_scores(s[p], mem[p], **kw)))
                low = np.flatnonzero(mem & (s < t))
                if len(low):
                    s2 = s.copy()
                    s2[low[0]] = t + 1
                    b = audit_scores(s2, mem, **kw).epsilon_lower_bound
                    check("audit: one more true positive never lowers", b >= a.epsilon_lower_bound, (case, method))
                b = audit_scores(np.tile(s, 2), np.tile(mem, 2), **kw).epsilon_lower_bound
                check("audit: two copies never lower (fixed threshold)", b >= a.epsilon_lower_bound - 1e-12, case)
                for c in (0.99, 0.999):
                    b = audit_scores(s, mem, **{**kw, "confidence": c}).epsilon_lower_bound
                    check("audit: smaller alpha never raises (fixed)", b <= a.epsilon_lower_bound + 1e-12, case)
                if method == "clopper-pearson":
                    b = audit_scores(s, mem, **{**kw, "delta": 1e-3}).epsilon_lower_bound
                    check("audit: larger delta never raises (fixed)", b <= a.epsilon_lower_bound + 1e-12, case)
            else:
                kp, km = int(rng.integers(0, n // 3)), int(rng.integers(1, n // 3))
                sd = s + rng.random(n) * 1e-6
                kw = {"method": method, "design": "canaries", "k_plus": kp, "k_minus": km, "seed": case}
                a = audit_scores(sd, mem, **kw)
                check("audit: record order (fixed guesses)", _key(a) == _key(audit_scores(sd[p], mem[p], **kw)))
                b = audit_scores(sd, mem, **{**kw, "confidence": 0.99}).epsilon_lower_bound
                check("audit: smaller alpha never raises (fixed guesses)", b <= a.epsilon_lower_bound + 1e-9, case)


def onerun_section(rng: np.random.Generator, n_cases: int) -> None:
    for _ in range(n_cases):
        m = int(rng.integers(2, 3000))
        r = int(rng.integers(1, m + 1))
        v = int(rng.integers(0, r + 1))
        d, a = float(10 ** rng.uniform(-8, -2)), float(10 ** rng.uniform(-3, -0.5))
        e = one_run_epsilon_lower_bound(m, r, v, d, a)
        tol = 1e-6 * max(1.0, e)
        info = (m, r, v, d, a, e)
        if v < r:
            check("one-run: one more correct guess", one_run_epsilon_lower_bound(m, r, v + 1, d, a) >= e - tol, info)
        if r < m:
            check("one-run: one more right guess", one_run_epsilon_lower_bound(m, r + 1, v + 1, d, a) >= e - tol, info)
            check("one-run: one more wrong guess", one_run_epsilon_lower_bound(m, r + 1, v, d, a) <= e + tol, info)
        check("one-run: smaller alpha", one_run_epsilon_lower_bound(m, r, v, d, a / 2) <= e + tol, info)
        check("one-run: larger delta", one_run_epsilon_lower_bound(m, r, v, min(0.999, 3 * d), a) <= e + tol, info)
        check("one-run: more canaries", one_run_epsilon_lower_bound(m + 10, r, v, d, a) <= e + tol, info)


def design_section(rng: np.random.Generator, n_cases: int) -> None:
    refuting = ("violation", "estimate-exceeds-claim")
    for _ in range(10 * n_cases):
        eps, most, claim = float(rng.exponential()), float(2 * rng.exponential()), float(rng.exponential())
        for formal in (True, False):
            for curve in (False, True):
                v1 = decide_verdict(eps, claim, most, formal=formal, refutes_curve=curve)
                v2 = decide_verdict(eps, 1.5 * claim + 0.01, most, formal=formal, refutes_curve=curve)
                check(
                    "verdict: a larger claim never turns into a refutation", not (v1 not in refuting and v2 in refuting)
                )
                v3 = decide_verdict(1.2 * eps + 0.01, claim, most, formal=formal, refutes_curve=curve)
                check("verdict: a larger bound never undoes a refutation", not (v1 in refuting and v3 not in refuting))
    for _ in range(n_cases):
        npos, nneg = int(rng.integers(2, 3000)), int(rng.integers(2, 3000))
        for method in ("clopper-pearson", "gdp", "one-run"):
            for sel in ("holdout", "bonferroni"):
                a = max_certifiable_epsilon(npos, nneg, method=method, threshold_selection=sel)
                b = max_certifiable_epsilon(npos, nneg, method=method, threshold_selection=sel, confidence=0.99)
                check("design: max certifiable, smaller alpha", b <= a + 1e-12, (npos, nneg, method, sel))
                b = max_certifiable_epsilon(npos, nneg, method=method, threshold_selection=sel, delta=1e-3)
                check("design: max certifiable, larger delta", b <= a + 1e-12, (npos, nneg, method, sel))
        m = int(rng.integers(4, 5000))
        a, b = (
            max_certifiable_epsilon(k // 2, k - k // 2, method="one-run", threshold_selection="bonferroni")
            for k in (m, m + 1)
        )
        check("design: one more canary, one-run Bonferroni (within 1 %)", b >= 0.99 * a, (m, a, b))


SECTIONS = {
    "metrics": (metrics_section, 200),
    "threshold": (threshold_section, 100),
    "reference": (reference_section, 100),
    "attribute": (attribute_section, 150),
    "audit": (audit_section, 30),
    "onerun": (onerun_section, 400),
    "design": (design_section, 200),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--sections", default=",".join(SECTIONS))
    args = ap.parse_args()
    start = time.perf_counter()
    for name in args.sections.split(","):
        fn, n = SECTIONS[name]
        fn(np.random.default_rng([args.seed, list(SECTIONS).index(name)]), max(1, round(n * args.scale)))
    n_bad = 0
    for name in sorted(checked):
        bad = violations.get(name, [])
        n_bad += bool(bad)
        example = f"  e.g. {bad[:2]}" if bad else ""
        print(f"{'VIOLATED' if bad else 'ok':8s} {name}: {len(bad)} of {checked[name]}{example}")
    print(f"{sum(checked.values())} checks, {n_bad} relations violated, {time.perf_counter() - start:.0f} s")
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
