"""Attribute-inference leakage: which member - non-member statistic, measured (RESULTS.md, 2026-11-28).

    PYTHONPATH=. .venv/bin/python benchmarks/attribute_leakage.py            # real datasets + synthetic
    PYTHONPATH=. .venv/bin/python benchmarks/attribute_leakage.py --quick    # fewer replicates

Estimators of "how much better the attack does on members than on non-members, beyond what the population
gives", each from the per-record correctness c_i, true hidden value v_i and membership m_i:
  (a) old: (acc_m - base_m) - (acc_nm - base_nm), base = share of the aux majority value in the group;
  (b) plain gap acc_m - acc_nm (Yeom et al. 2018);
  (c) post-stratified gap: sum_v w_v (acc_m|v - acc_nm|v), w_v the pooled frequency of v;
  (d) Mantel-Haenszel-weighted gap: weights n_m,v n_nm,v / n_v (linear regression of c on m and value dummies);
  (e) post-stratified on (v, label) cells (dpaudit's choice), tested by relabelling within the cells.
Real datasets: breast-cancer, wine, digits; logreg and an MLP; several features; likelihood and attack-model.
Null SD: random member/non-member relabellings of the same records (the split is random). Synthetic: a model
that memorises the hidden value of a fraction rho of its members (true leakage known from a 200 000-record
simulation), an exchangeable null (rho = 0) and a shifted null (members' value distribution differs from the
non-members', no memorisation). Power: rejections at 5 % by each estimator's own relabelling test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402

NAMES = ("a old", "b plain", "c post-strat", "d MH", "e strat(v,y)")


def estimators(c, v, y, M, majority):
    """Each estimator for membership masks M (B, N) bool: an array (5, B)."""
    c = np.asarray(c, np.float64)
    M = np.atleast_2d(M).astype(np.float64)
    N = 1.0 - M
    nm, nn = M.sum(1), N.sum(1)
    acc_m, acc_n = M @ c / nm, N @ c / nn
    base = (v == majority).astype(np.float64)
    a = (acc_m - M @ base / nm) - (acc_n - N @ base / nn)
    b = acc_m - acc_n

    def strat(keys):
        H = (keys[:, None] == np.unique(keys)[None, :]).astype(np.float64)
        n_mv, n_nv = M @ H, N @ H
        k_mv, k_nv = M @ (H * c[:, None]), N @ (H * c[:, None])
        ok = (n_mv > 0) & (n_nv > 0)
        gap = np.where(ok, k_mv / np.maximum(n_mv, 1) - k_nv / np.maximum(n_nv, 1), 0.0)
        w_pool = np.where(ok, n_mv + n_nv, 0.0)
        w_mh = np.where(ok, n_mv * n_nv / np.maximum(n_mv + n_nv, 1), 0.0)
        return (gap * w_pool).sum(1) / w_pool.sum(1), (gap * w_mh).sum(1) / w_mh.sum(1), gap, ok

    cc, d, gap, ok = strat(v)
    e, _, gap_vy, ok_vy = strat(v * 1000 + y)
    all_worse = np.all(np.where(ok, gap < 0, True), axis=1) & ok.any(1)
    all_worse_vy = np.all(np.where(ok_vy, gap_vy < 0, True), axis=1) & ok_vy.any(1)
    return np.stack([a, b, cc, d, e]), np.stack([all_worse, all_worse_vy])


def relabel(n, n_m, B, rng):
    M = np.zeros((B, n), bool)
    for b in range(B):
        M[b, rng.permutation(n)[:n_m]] = True
    return M


def within_p(c, v, y, m, B, seed):
    """dpaudit's test: (e) with relabellings within each (value, label) cell."""
    from attacks.attribute import leakage_permutation_test, leakage_strata

    strata = leakage_strata(v[m], y[m], c[m], v[~m], y[~m], c[~m])
    return leakage_permutation_test(strata, permutations=B, seed=seed)["p_value"]


def real(args):
    from attacks.attribute import attribute_predictions
    from dpaudit.checkpoint import load_run
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    plan = {
        "breast-cancer": ["worst perimeter", "mean texture", "mean area", "worst smoothness"],
        "wine": ["alcohol", "proline", "flavanoids", "hue"],
        "digits": ["pixel_3_4", "pixel_5_2", "pixel_1_6", "pixel_0_2"],
    }
    rng = np.random.default_rng(0)
    rows = []
    tmp = Path(tempfile.mkdtemp())
    for dsname, feats in plan.items():
        ds = load_dataset(dsname)
        for kind, cfg in (
            ("logreg", TrainConfig(epochs=15, batch_size=16, lr=0.2, seed=0)),
            ("mlp", TrainConfig(epochs=args.mlp_epochs, batch_size=16, lr=0.1, seed=0)),
        ):
            spec = default_spec(kind, input_shape=ds.feature_shape, n_classes=ds.n_classes)
            out = tmp / f"{dsname}-{kind}"
            train_run(ds, spec, cfg, out=out)
            run = load_run(out)
            y_all = np.asarray(ds.y)
            for feat in feats:
                for bb in (False, True):
                    att, preds, _ = attribute_predictions(run, feat, black_box=bb, seed=0)
                    (pm, tm), (pn, tn) = preds["members"], preds["nonmembers"]
                    c = np.concatenate([pm == tm, pn == tn])
                    v = np.concatenate([tm, tn])
                    y = np.concatenate([y_all[run.splits.members], y_all[run.splits.holdout]])
                    m = np.zeros(len(c), bool)
                    m[: len(tm)] = True
                    obs, all_worse = estimators(c, v, y, m[None], att.majority_)
                    null, _ = estimators(c, v, y, relabel(len(c), len(tm), args.perms, rng), att.majority_)
                    sd = null.std(1)
                    p_c = within_p(c, v, y, m, 40_000, 0)
                    rows.append((dsname, kind, feat, "attack-model" if bb else "likelihood", len(np.unique(v)),
                                 obs[:, 0], sd, all_worse[:, 0], p_c))  # fmt: skip
                    print(
                        f"| {dsname} | {kind} | {feat} | {rows[-1][3]} | {len(np.unique(v))} | "
                        + " | ".join(f"{o:+.3f} ({s:.3f})" for o, s in zip(obs[:, 0], sd, strict=True))
                        + f" | {p_c:.3g} |",
                        flush=True,
                    )
    sds = np.array([r[6] for r in rows])
    obs = np.array([r[5] for r in rows])
    print("\nmedian null SD per estimator:", dict(zip(NAMES, np.round(np.median(sds, 0), 4).tolist(), strict=True)))
    print("max null SD per estimator:", dict(zip(NAMES, np.round(sds.max(0), 4).tolist(), strict=True)))
    for i in range(4):
        ratio = sds[:, 4] / np.maximum(sds[:, i], 1e-12)
        disagree = int((np.sign(obs[:, i]) * np.sign(obs[:, 4]) < 0).sum())
        print(f"SD(e)/SD({NAMES[i]}): median {np.median(ratio):.3f}, range {ratio.min():.3f}-{ratio.max():.3f}; "
              f"sign disagreements with e: {disagree} of {len(rows)}")  # fmt: skip
    for k, cells in enumerate(("value", "(value, label) cell")):
        print(f"members worse on every {cells} but estimator > 0:",
              {n: int(sum(1 for r in rows if r[7][k] and r[5][i] > 0)) for i, n in enumerate(NAMES)})  # fmt: skip
    print(
        "dpaudit's p < 0.05:", [(r[0], r[1], r[2], r[3], round(float(r[5][4]), 3), r[8]) for r in rows if r[8] < 0.05]
    )


class Memoriser:
    """p(y | z, v): a population model of label and hidden value, and a lookup of memorised members that gives
    their true label probability 0.99 at their own hidden value and 0.05 at any other."""

    def __init__(self, memo_z, memo_v, memo_y):
        self.table = {
            tuple(np.round(z, 9)): (int(vv), int(yy)) for z, vv, yy in zip(memo_z, memo_v, memo_y, strict=True)
        }

    def __call__(self, X):
        X = np.asarray(X, np.float64)
        z, v = X[:, :2], X[:, 2]
        logit = 2.0 * (z[:, 0] + 0.8 * (v == 2) - 0.6 * (v == 0))
        p1 = 1 / (1 + np.exp(-logit))
        for i, zi in enumerate(z):
            hit = self.table.get(tuple(np.round(zi, 9)))
            if hit is not None:
                p1[i] = (0.99 if hit[1] == 1 else 0.01) if v[i] == hit[0] else (0.05 if hit[1] == 1 else 0.95)
        return np.stack([1 - p1, p1], 1)


PRIOR = np.array([0.55, 0.3, 0.15])


def draw(rng, n, prior=PRIOR):
    v = rng.choice(3, size=n, p=prior)
    z = rng.standard_normal((n, 2))
    logit = 2.0 * (z[:, 0] + 0.8 * (v == 2) - 0.6 * (v == 0))
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    return np.column_stack([z, v.astype(float)]), v, y


def synthetic_once(rng, rho, n_m, n_n, member_prior=PRIOR, nonmember_prior=PRIOR):
    from attacks.attribute import AttributeInference

    Xa, _, ya = draw(rng, 400)
    Xm, vm, ym = draw(rng, n_m, member_prior)
    Xn, _, yn = draw(rng, n_n, nonmember_prior)
    memo = rng.random(n_m) < rho
    model = Memoriser(Xm[memo, :2], vm[memo], ym[memo])
    att = AttributeInference(2).fit(Xa, ya, model)
    cm = att.predict(Xm, ym, model) == att.categories(Xm)
    cn = att.predict(Xn, yn, model) == att.categories(Xn)
    return (
        np.concatenate([cm, cn]),
        np.concatenate([att.categories(Xm), att.categories(Xn)]),
        np.concatenate([ym, yn]),
        att.majority_,
    )


def truth(rho, rng):
    """The post-stratified estimand sum_v P(v) (P(right | member, v) - P(right | non-member, v)), simulated."""
    from attacks.attribute import AttributeInference

    n = 100_000
    Xa, _, ya = draw(rng, 4000)
    X, v, y = draw(rng, n)
    memo = rng.random(n) < rho
    model = Memoriser(X[memo, :2], v[memo], y[memo])
    att = AttributeInference(2).fit(Xa, ya, model)
    c_mem = att.predict(X, y, model) == att.categories(X)
    c_non = att.predict(X, y, Memoriser(X[:0, :2], v[:0], y[:0])) == att.categories(X)
    return float(sum(PRIOR[k] * (c_mem[v == k].mean() - c_non[v == k].mean()) for k in range(3)))


def synthetic(args):
    rng = np.random.default_rng(1)
    shifted = (np.array([0.7, 0.2, 0.1]), np.array([0.4, 0.35, 0.25]))
    scenarios = [
        ("null, exchangeable", 0.0, PRIOR, PRIOR),
        ("planted rho = 0.1", 0.1, PRIOR, PRIOR),
        ("planted rho = 0.2", 0.2, PRIOR, PRIOR),
        ("null, shifted values", 0.0, *shifted),
        ("planted rho = 0.1, shifted", 0.1, *shifted),
    ]
    print(
        "| scenario | true | "
        + " | ".join(f"{n}: mean (SD), reject@5%" for n in NAMES)
        + " | e within-cell test reject@5% |"
    )
    for label, rho, pm, pn in scenarios:
        t = truth(rho, np.random.default_rng(7)) if rho > 0 else 0.0
        vals, rej, rej_c_within, worse_pos = [], [], [], np.zeros((2, 5), int)
        for _ in range(args.reps):
            c, v, y, maj = synthetic_once(rng, rho, 200, 200, pm, pn)
            m = np.zeros(len(c), bool)
            m[:200] = True
            obs, all_worse = estimators(c, v, y, m[None], maj)
            null, _ = estimators(c, v, y, relabel(len(c), 200, args.test_perms, rng), maj)
            p = (1 + (null >= obs - 1e-12).sum(1)) / (1 + args.test_perms)
            vals.append(obs[:, 0])
            rej.append(p < 0.05)
            rej_c_within.append(within_p(c, v, y, m, 4000, int(rng.integers(2**31))) < 0.05)
            worse_pos += (all_worse[:, :1] & (obs[:, 0] > 0)[None]).astype(int)
        vals, rej = np.array(vals), np.array(rej)
        cells = [f"{vals[:, i].mean():+.4f} ({vals[:, i].std():.4f}), {rej[:, i].mean():.2f}" for i in range(5)]
        print(f"| {label} | {t:+.4f} | " + " | ".join(cells) + f" | {np.mean(rej_c_within):.2f} |", flush=True)
        if worse_pos.any():
            for k, cells in enumerate(("value", "(value, label) cell")):
                print(
                    f"  members worse on every {cells} but estimator > 0:",
                    dict(zip(NAMES, worse_pos[k].tolist(), strict=True)),
                )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--perms", type=int, default=4000, help="relabellings for the null SD (real datasets)")
    ap.add_argument("--reps", type=int, default=200, help="synthetic replicates per scenario")
    ap.add_argument("--test-perms", type=int, default=999, help="relabellings of each replicate's test")
    ap.add_argument("--mlp-epochs", type=int, default=60)
    ap.add_argument("--only", choices=("real", "synthetic"), default=None)
    args = ap.parse_args()
    if args.quick:
        args.perms, args.reps, args.test_perms, args.mlp_epochs = 1000, 50, 499, 30
    if args.only != "synthetic":
        real(args)
    if args.only != "real":
        synthetic(args)


if __name__ == "__main__":
    main()
