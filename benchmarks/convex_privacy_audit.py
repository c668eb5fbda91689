"""Independent check of the privacy claims of the convex learners and DP-AGD.

Two parts, neither importing dpaudit's formula functions (only the mechanisms under test, their ``claim``
and the worst-case neighbour search, which does not affect the soundness of a lower bound):

1. **Formulas.** Every constant re-derived here from the papers and compared with the recorded claim on a
   grid of (n, lambda, epsilon, d, k):
   * output perturbation (Chaudhuri, Monteleoni & Sarwate 2011, JMLR, Alg. 1, Cor. 8): regulariser
     (lambda/2)||w||^2, a 1-Lipschitz loss and ||x|| <= 1 give Delta = 2/(n lambda); noise density
     ~ exp(-eps ||eta|| / Delta); k one-vs-rest classifiers at eps/k each (basic composition);
   * Gaussian output perturbation: the k classifiers' noise is one Gaussian with L2 sensitivity
     sqrt(k) Delta, whose exact delta(eps) is Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2),
     mu = sqrt(k) Delta / sigma (Balle & Wang 2018, Thm 8); the claim must satisfy delta(eps_claim) <= delta;
   * objective perturbation (ibid., Alg. 2, Thm 9; c = 1/4 for the logistic loss): the privacy loss is
     eps' + 2 log(1 + c/(n (lambda + Delta'))) (the Jacobian ratio of a rank-2 change) and must be <= eps/k;
   * DP-AGD (Lee & Kifer 2018, Alg. 2): rho from eps = rho + 2 sqrt(rho log(1/delta)), rho_nmax = eps_s^2/2,
     rho_ng = C^2/(2 sigma^2) with sigma = C sqrt(2 log(1.25/delta))/eps_s, eps_s = eps/(2 splits); the ledger
     of a run summed again here; the recorded (eps, delta) must be implied by rho-zCDP: it cannot be below the
     Gaussian mechanism's exact eps at mu = sqrt(2 rho) (a rho-zCDP mechanism), and is compared with
     Bun & Steinke's rho + 2 sqrt(rho log(1/delta)).
2. **Empirical audits.** For each mechanism a worst-case neighbouring pair, thousands of runs on each side,
   a test statistic (the exact log-likelihood ratio where it is known, else the projection on the direction
   of the change), the threshold chosen on one half of the runs and a two-sided Clopper-Pearson bound on the
   other half: eps_lb = log((TPR_lo - delta) / FPR_hi) at 95% confidence (Jagielski, Ullman & Oprea 2020).
   eps_lb must never exceed the claim.

Run (2 shared cores: nice it): ``nice python benchmarks/convex_privacy_audit.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np
from scipy import stats

from dpaudit.training.convex import ConvexLearner, solve_logistic, unit_ball_features, worst_case_neighbour
from dpaudit.training.dpagd import DPAGDConfig, dpagd, dpagd_claim

C_LOGISTIC = 0.25  # sup l''(z) of log(1 + e^-z) = 1/4 at z = 0


# ----------------------------------------------------------------------------- independent formulas


def my_outpert_scale(n, lam, eps, k):
    return (2.0 / (n * lam)) / (eps / k)


def my_objpert(eps, n, lam, c=C_LOGISTIC):
    a = c / (n * lam)
    eps_p = eps - 2.0 * math.log(1.0 + a)  # (1 + a)^2 = 1 + 2a + a^2
    if eps_p > 0:
        return eps_p, 0.0
    return eps / 2.0, c / (n * (math.exp(eps / 4.0) - 1.0)) - lam


def my_objpert_loss(eps_p, extra, n, lam, c=C_LOGISTIC):
    """Privacy loss of objective perturbation with noise density ~ exp(-(eps'/2)||b||): ||b - b'|| <= 2 gives
    eps'; the Jacobian ratio of the map b -> w (a rank-2 change of the Hessian, eigenvalues of the
    perturbation <= c/n against a (lambda + Delta')-strongly convex Hessian) gives 2 log(1 + c/(n(lam+Delta')))."""
    return eps_p + 2.0 * math.log1p(c / (n * (lam + extra)))


def gauss_delta(eps, mu):
    return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


def gauss_eps(delta, mu):
    """Exact eps(delta) of a Gaussian with sensitivity/sigma = mu (bisection on gauss_delta)."""
    lo, hi = 0.0, 1.0
    while gauss_delta(hi, mu) > delta:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gauss_delta(mid, mu) > delta else (lo, mid)
    return hi


def my_rho(eps, delta):
    # eps = rho + 2 sqrt(rho L): a quadratic in sqrt(rho)
    L = math.log(1.0 / delta)
    return (-math.sqrt(L) + math.sqrt(L + eps)) ** 2


def check_formulas():
    rows, bad = 0, []
    for n, lam, eps, d, k in itertools.product(
        [10, 100, 1000, 100_000], [1e-4, 1e-2, 1.0], [0.05, 1.0, 8.0], [3, 30], [1, 3, 10]
    ):
        rows += 1
        per = eps / k
        c = ConvexLearner("outpert", lam, eps).claim(n, d, k)
        if not (c["epsilon"] >= eps and c["noise_scale"] >= my_outpert_scale(n, lam, eps, k) * (1 - 1e-12)):
            bad.append(("outpert", n, lam, eps, d, k, c["noise_scale"], my_outpert_scale(n, lam, eps, k)))
        c = ConvexLearner("objpert", lam, eps).claim(n, d, k)
        mine = my_objpert(per, n, lam)
        loss = my_objpert_loss(c["epsilon_prime"], c["extra_l2"], n, lam)
        if not (loss <= per * (1 + 1e-12) and np.allclose(mine, (c["epsilon_prime"], c["extra_l2"]), rtol=1e-12)):
            bad.append(("objpert", n, lam, eps, d, k, loss, per))
        if eps <= 8 and n <= 1000 and d == 3:  # the Gaussian calibration is slower: a sub-grid
            for delta in (1e-5, 1e-9):
                c = ConvexLearner("outpert-gaussian", lam, eps, delta).claim(n, d, k)
                mu = math.sqrt(k) * (2.0 / (n * lam)) / c["noise_std"]
                if not gauss_delta(c["epsilon"], mu) <= delta * (1 + 1e-9) or c["epsilon"] > eps * (1 + 1e-9):
                    bad.append(("gauss", n, lam, eps, k, delta, gauss_delta(c["epsilon"], mu)))
    for eps, delta, splits, k in itertools.product([0.1, 1.0, 8.0], [1e-5, 1e-8], [5, 60], [1, 3]):
        rows += 1
        cfg = DPAGDConfig(epsilon=eps, delta=delta, splits=splits)
        c = dpagd_claim(cfg, None, 100, classifiers=k)
        rho = c["event"]["rho"]
        es = eps / (2 * splits) if k == 1 else None
        if k == 1 and not (
            math.isclose(rho, my_rho(eps, delta), rel_tol=1e-12)
            and math.isclose(c["rho_nmax"], es**2 / 2, rel_tol=1e-12)
            and math.isclose(
                c["rho_ng"] if "rho_ng" in c else c["rho_ng_initial"],
                es**2 / (4 * math.log(1.25 / delta)),
                rel_tol=1e-9,
            )
        ):
            bad.append(("dpagd-constants", eps, delta, splits, k))
        if rho < my_rho(eps, delta) * (1 - 1e-9):
            bad.append(("dpagd-rho-below-budget", eps, delta, splits, k, rho, my_rho(eps, delta)))
        eps_g = gauss_eps(delta, math.sqrt(2 * rho))  # a rho-zCDP mechanism with this (eps, delta) exactly
        simple = rho + 2 * math.sqrt(rho * math.log(1 / delta))
        if not (eps_g <= c["epsilon"] * (1 + 1e-9) and c["epsilon"] <= simple * (1 + 1e-9)):
            bad.append(("dpagd-conversion", eps, delta, k, eps_g, c["epsilon"], simple))
    return rows, bad


def check_dpagd_ledger(runs=20):
    """The ledger of real runs, summed here: charges of each kind match the noise used, total <= rho."""
    rng0 = np.random.default_rng(0)
    Z = unit_ball_features(rng0.normal(size=(60, 4)))
    s = np.where(rng0.random(60) < 0.5, 1.0, -1.0)
    bad = []
    for r in range(runs):
        cfg = DPAGDConfig(epsilon=[0.5, 2.0, 8.0][r % 3], delta=1e-5, splits=[5, 20][r % 2], lam=0.01)
        res = dpagd(Z, s, cfg, np.random.default_rng(r))
        spent = math.fsum(x for _, x in res.ledger.charges)
        n_nmax = sum(1 for kind, _ in res.ledger.charges if kind == "noisy_max")
        es = cfg.epsilon / (2 * cfg.splits)
        ok = spent <= my_rho(cfg.epsilon, cfg.delta) * (1 + 1e-12)
        ok &= len(res.nmax_scales) == n_nmax
        ok &= all(math.isclose(sc, 1.0 / es, rel_tol=1e-12) for sc in res.nmax_scales)  # C_obj/sqrt(2 rho_nmax)
        if not ok:
            bad.append((r, spent, my_rho(cfg.epsilon, cfg.delta)))
    return bad


# ----------------------------------------------------------------------------- Clopper-Pearson audit


def cp_bounds(k, n, alpha):
    lo = 0.0 if k == 0 else stats.beta.ppf(alpha / 2, k, n - k + 1)
    hi = 1.0 if k == n else stats.beta.ppf(1 - alpha / 2, k + 1, n - k)
    return lo, hi


def eps_lower_bound(s_in, s_out, delta=0.0, confidence=0.95, seed=0):
    """Threshold (and side) chosen on the first half of each sample, CP bound on the second half.

    Both tests "score >= t says IN" and "score <= t says OUT" (i.e. the reverse direction) are considered on the
    selection half; the winner alone is evaluated, so the 95% confidence holds for the reported number."""
    # Scores rounded to 1e-10 of their range: the audit measures the mathematical mechanism. Unrounded, the
    # low-order bits of a float statistic can separate the two sides beyond what the real-valued densities
    # allow (Mironov 2012: floating-point outputs are not the idealised distribution); see RESULTS.md.
    scale = max(np.max(np.abs(s_in)), np.max(np.abs(s_out)), 1e-300)
    s_in, s_out = np.round(np.asarray(s_in) / scale, 10), np.round(np.asarray(s_out) / scale, 10)
    rng = np.random.default_rng(seed)
    s_in, s_out = rng.permutation(s_in), rng.permutation(s_out)
    h_in, h_out = len(s_in) // 2, len(s_out) // 2
    sel_in, ev_in, sel_out, ev_out = s_in[:h_in], s_in[h_in:], s_out[:h_out], s_out[h_out:]
    best = (-np.inf, None, None)
    grid = np.quantile(np.concatenate([sel_in, sel_out]), np.linspace(0.001, 0.999, 400))
    for sign in (1.0, -1.0):
        a, b = sign * sel_in, sign * sel_out
        for t in sign * grid:
            tpr, fpr = np.mean(a >= t), np.mean(b >= t)
            # a conservative plug-in for selection (the CP bounds at the selection half's size)
            lo, _ = cp_bounds(int(tpr * len(a)), len(a), 0.05)
            _, hi = cp_bounds(int(fpr * len(b)), len(b), 0.05)
            val = math.log(max(lo - delta, 1e-300) / hi)
            if val > best[0]:
                best = (val, sign, t)
    _, sign, t = best
    alpha = 1.0 - confidence
    k_in, k_out = int(np.sum(sign * ev_in >= t)), int(np.sum(sign * ev_out >= t))
    tpr_lo, _ = cp_bounds(k_in, len(ev_in), alpha)
    _, fpr_hi = cp_bounds(k_out, len(ev_out), alpha)
    return max(0.0, math.log(max(tpr_lo - delta, 1e-300) / fpr_hi)) if tpr_lo > delta else 0.0


# ----------------------------------------------------------------------------- the audits


def _pair(n, d, lam, seed):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, d))
    Z /= np.maximum(1.0, np.linalg.norm(Z, axis=1, keepdims=True))
    s = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    Z_in, s_in, u = worst_case_neighbour(Z, s, lam)
    return (Z_in, s_in), (Z, s), u


def audit_outpert(runs, algo="outpert", n=5, d=2, lam=1.0, eps=2.0, delta=0.0, k=1):
    """Output perturbation, replace-one pair; the minimisers are solved once and only the noise is redrawn
    (the mechanism's only randomness). Statistic: the exact log-likelihood ratio (norm mechanism:
    ||w - w_out|| - ||w - w_in||, summed over classifiers; Gaussian: projection on w_in - w_out)."""
    (Z_in, s_in), (Z_out, s_out), _ = _pair(n, d, lam, 3)
    S_in = np.repeat(s_in[:, None], k, axis=1) if k > 1 else s_in[:, None]
    S_out = np.repeat(s_out[:, None], k, axis=1) if k > 1 else s_out[:, None]
    learner = ConvexLearner(algo, lam, eps, delta)
    W_in = np.stack([solve_logistic(Z_in, S_in[:, j], lam) for j in range(k)])
    W_out = np.stack([solve_logistic(Z_out, S_out[:, j], lam) for j in range(k)])
    claim = learner.claim(n, d, k)
    shift = float(np.linalg.norm(W_in - W_out, axis=1).max())

    def stat(W):
        if algo == "outpert":
            return float(np.sum(np.linalg.norm(W - W_out, axis=1) - np.linalg.norm(W - W_in, axis=1)))
        return float(np.sum((W - W_out) * (W_in - W_out)))

    rng = np.random.default_rng(11)
    a = np.array([stat(learner.perturb(W_in, n, rng)) for _ in range(runs)])
    b = np.array([stat(learner.perturb(W_out, n, rng)) for _ in range(runs)])
    return claim["epsilon"], eps_lower_bound(a, b, delta), shift / (2.0 / (n * lam))


def audit_objpert(runs, n=5, d=2, lam=1.0, eps=2.0):
    """Objective perturbation: one exact solve per run. Statistic: projection on the change's direction."""
    (Z_in, s_in), (Z_out, s_out), u = _pair(n, d, lam, 5)
    learner = ConvexLearner("objpert", lam, eps)
    claim = learner.claim(n, d, 1)
    rng = np.random.default_rng(12)
    a = np.array([learner.fit(Z_in, s_in[:, None], rng)[0] @ u for _ in range(runs)])
    b = np.array([learner.fit(Z_out, s_out[:, None], rng)[0] @ u for _ in range(runs)])
    return claim["epsilon"], eps_lower_bound(a, b), claim["epsilon_prime"], claim["extra_l2"]


def audit_dpagd(runs, eps=4.0, delta=1e-5, splits=3, n=4):
    """DP-AGD, add/remove pair: n records at x = 0 (their clipped gradients and losses do not depend on w
    when lambda = 0, so they carry no signal) with or without the canary (e_1, +1). Statistic: w[0]."""
    d = 2
    Z_out, s_out = np.zeros((n, d)), np.ones(n)
    Z_in, s_in = np.vstack([Z_out, np.eye(d)[:1]]), np.append(s_out, 1.0)
    cfg = DPAGDConfig(epsilon=eps, delta=delta, splits=splits)
    claim = dpagd_claim(cfg, None, n)
    a = np.array([dpagd(Z_in, s_in, cfg, np.random.default_rng(10**6 + r)).w[0] for r in range(runs)])
    b = np.array([dpagd(Z_out, s_out, cfg, np.random.default_rng(2 * 10**6 + r)).w[0] for r in range(runs)])
    return claim["epsilon"], eps_lower_bound(a, b, delta)


def audit_pipeline(runs, algo="outpert", eps=2.0, lam=1.0, k=2):
    """The trainer as ``dpaudit train`` runs it (OutputPerturbationTrainer.fit on raw features far outside the unit
    ball, the intercept appended, the released torch logreg), a replace-one pair in raw feature space, noise from
    the config seed. The released (weight, bias) are mapped back to the classifiers w (times sqrt(d+1)); statistic:
    the exact log-likelihood ratio of the norm mechanism, summed over classifiers."""
    import dataclasses

    import torch

    from dpaudit.models import build_model, default_spec
    from dpaudit.training.algorithms import get_trainer
    from dpaudit.training.config import DPConfig, TrainConfig

    torch.set_num_threads(1)
    X_out = np.array([[300.0], [-250.0], [400.0], [-500.0]], dtype=np.float32)  # |x| >> 1: projected
    y_out = np.array([1, 0, 1, 0]) if k == 2 else np.array([0, 1, 2, 0])
    X_in, y_in = X_out.copy(), y_out.copy()
    X_in[-1], y_in[-1] = 900.0, 0 if k == 2 else 2  # the replaced record: the other side (s x flips)
    spec = default_spec("logreg", input_shape=(1,), n_classes=k)
    base = TrainConfig(algo=algo, weight_decay=lam, dp=DPConfig(target_epsilon=eps))
    S = lambda y: (2.0 * y - 1.0)[:, None] if k == 2 else np.where(y[:, None] == np.arange(k), 1.0, -1.0)  # noqa: E731
    W = {}
    for name, X, y in (("in", X_in, y_in), ("out", X_out, y_out)):
        Z = unit_ball_features(X)
        W[name] = np.stack([solve_logistic(Z, S(y)[:, j], lam) for j in range(S(y).shape[1])])

    def released(X, y, seed):
        model = build_model(spec, seed=0)
        out = get_trainer(algo)(dataclasses.replace(base, seed=seed)).fit(model, torch.as_tensor(X), torch.as_tensor(y))
        lin = model[1]
        Wr = np.concatenate([lin.weight.detach().numpy(), lin.bias.detach().numpy()[:, None]], axis=1) * math.sqrt(2)
        return (Wr[1:] if k == 2 else Wr).astype(np.float64), out.privacy

    def stat(Wr):
        return float(np.sum(np.linalg.norm(Wr - W["out"], axis=1) - np.linalg.norm(Wr - W["in"], axis=1)))

    a, b = [], []
    for r in range(runs):
        Wr, claim = released(X_in, y_in, r)
        a.append(stat(Wr))
        b.append(stat(released(X_out, y_out, runs + r)[0]))
    shift = float(np.linalg.norm(W["in"] - W["out"], axis=1).max() / claim["sensitivity"])
    return claim["epsilon"], eps_lower_bound(np.array(a), np.array(b)), shift


def audit_float(runs, eps=8.0):
    """Floating point (Mironov 2012): on the d = 1 pair, the unrounded statistic |w - w_out| - |w - w_in|. The value
    most frequent around w_in relative to around w_out is chosen on one set of runs; its frequency on each side is
    counted on fresh runs (a pre-chosen event: one Clopper-Pearson bound). For float64 w* + eta (what the learner
    returned before) and for the learner's output now (rounded to float32)."""
    n, lam = 5, 1.0
    (Z_in, s_in), (Z_out, s_out), _ = _pair(n, 1, lam, 3)
    w_in, w_out = solve_logistic(Z_in, s_in, lam)[0], solve_logistic(Z_out, s_out, lam)[0]
    learner = ConvexLearner("outpert", lam, eps)
    scale = learner.sensitivity(n) / eps
    out = {}
    for name, draw in (
        ("float64 w* + eta", lambda c, rng: c + learner.norm_noise(1, scale, rng)[0]),
        ("released (perturb)", lambda c, rng: learner.perturb(np.array([[c]]), n, rng)[0, 0]),
    ):

        def stats_(centre, seed, draw=draw):
            rng = np.random.default_rng(seed)
            w = np.array([draw(centre, rng) for _ in range(runs)])
            return np.abs(w - w_out) - np.abs(w - w_in)

        sel_in, sel_out = stats_(w_in, 0), stats_(w_out, 3)  # selection runs
        vals, counts = np.unique(sel_in, return_counts=True)
        ratio = [(c + 1) / (np.sum(sel_out == v) + 1) for v, c in zip(vals, counts, strict=True)]
        target = vals[int(np.argmax(ratio))]
        k_in, k_out = int(np.sum(stats_(w_in, 1) == target)), int(np.sum(stats_(w_out, 2) == target))
        lo, _ = cp_bounds(k_in, runs, 0.05)
        _, hi = cp_bounds(k_out, runs, 0.05)
        out[name] = (k_in, k_out, math.log(lo / hi) if lo > 0 else 0.0)
    return out, eps * abs(w_in - w_out) / learner.sensitivity(n)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=20000, help="runs per side (outpert: x10)")
    p.add_argument(
        "--only", default="formulas,outpert,float,pipeline,objpert,dpagd", help="comma-separated parts to run"
    )
    args = p.parse_args()
    parts = set(args.only.split(","))
    t0 = time.time()
    if "formulas" in parts:
        rows, bad = check_formulas()
        print(f"formulas: {rows} grid points, {len(bad)} disagreements {bad[:5]}", flush=True)
        bad = check_dpagd_ledger()
        print(f"dpagd ledger: {len(bad)} runs over budget or with other noise than claimed {bad[:5]}")
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    R = args.runs
    if "outpert" in parts:
        for kw in ({"eps": 2.0}, {"eps": 1.0, "k": 3}, {"eps": 4.0, "d": 1}):
            claim, lb, shift = audit_outpert(10 * R, **kw)
            print(f"outpert {kw}: claim {claim:.4g}, CP lower bound {lb:.4g} (pair moves w* by {shift:.3f} Delta)")
        for kw in ({"eps": 2.0, "delta": 1e-5}, {"eps": 1.0, "delta": 1e-3, "k": 3}):
            claim, lb, shift = audit_outpert(10 * R, algo="outpert-gaussian", **kw)
            print(f"outpert-gaussian {kw}: claim {claim:.4g}, CP lower bound {lb:.4g} (shift {shift:.3f} Delta)")
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    if "float" in parts:
        res, pair_max = audit_float(5 * R)
        for name, (k_in, k_out, lb) in res.items():
            print(
                f"float, outpert d = 1 eps 8 ({name}): pre-chosen value hit {k_in}/{5 * R} around w_in, "
                f"{k_out}/{5 * R} around w_out: eps >= {lb:.3f} (real-valued pair max {pair_max:.3f})"
            )
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    if "pipeline" in parts:
        for kw in ({"eps": 2.0}, {"eps": 2.0, "k": 3}):
            claim, lb, shift = audit_pipeline(R // 4, **kw)
            print(f"outpert pipeline {kw}: claim {claim:.4g}, CP lower bound {lb:.4g} (shift {shift:.3f} Delta)")
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    if "objpert" in parts:
        for kw in ({"eps": 2.0}, {"eps": 0.3, "lam": 0.01}):
            claim, lb, eps_p, extra = audit_objpert(R, **kw)
            print(f"objpert {kw}: claim {claim:.4g}, CP lower bound {lb:.4g} (eps' {eps_p:.3g}, Delta' {extra:.3g})")
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    if "dpagd" in parts:
        for kw in ({"eps": 20.0, "splits": 4}, {"eps": 4.0, "splits": 3}):
            claim, lb = audit_dpagd(R // 4, **kw)
            print(f"dpagd {kw}: claim {claim:.4g} at delta 1e-5, CP lower bound {lb:.4g}", flush=True)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
