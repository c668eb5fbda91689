"""Objective perturbation in its Δ′ > 0 branch against its noise law (issue 27: dropping Δ′ went uncaught).

Chaudhuri, Monteleoni & Sarwate 2011 (JMLR 12), Alg. 2: when ε′ = ε − log(1 + 2c/(Nλ) + c²/(N²λ²)) ≤ 0,
the learner adds Δ′ = c/(N(e^{ε/4} − 1)) − λ to the regulariser and uses ε′ = ε/2; it minimises
J(w) + ⟨b, w⟩/N + (Δ′/2)‖w‖² with ‖b‖ ~ Gamma(d, 2/ε′). At the exact minimiser the gradient vanishes, so
b = −N(∇L(w) + (λ + Δ′)w) with L the mean logistic loss: recovered from each released w, the noise must
have the Gamma(d, 2/ε′) norm law. The oracle below writes Δ′ and ε′ from the paper, not from the code.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

N, D, LAM, EPS, C = 20, 3, 0.01, 1.0, 0.25
FITS = 300


def _oracle():
    eps_p = EPS - math.log1p(2 * C / (N * LAM) + C * C / (N * LAM) ** 2)
    assert eps_p <= 0  # the Δ′ > 0 branch
    return EPS / 2, C / (N * math.expm1(EPS / 4)) - LAM


def test_objpert_delta_prime_branch_noise_has_its_gamma_law():
    from dpaudit.training.convex import ConvexLearner

    eps_p, delta_p = _oracle()
    assert delta_p > 0
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(N, D))
    Z /= np.maximum(1.0, np.linalg.norm(Z, axis=1, keepdims=True))
    s = np.where(Z[:, 0] > 0, 1.0, -1.0)
    learner = ConvexLearner("objpert", LAM, EPS)
    norms = []
    for seed in range(FITS):
        w = learner.fit(Z, s[:, None], np.random.default_rng(seed))[0]
        m = s * (Z @ w)
        grad_loss = -(Z.T @ (s / (1.0 + np.exp(m)))) / N
        b = -N * (grad_loss + (LAM + delta_p) * w)
        norms.append(np.linalg.norm(b))
    # ‖b‖ ~ Gamma(d, 2/ε′); dropping Δ′ (or using ε′ = ε) moves the recovered norms far off this law.
    p = stats.kstest(norms, stats.gamma(D, scale=2.0 / eps_p).cdf).pvalue
    assert p > 1e-3, p
