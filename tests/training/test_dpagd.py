"""DP-AGD (dpaudit/training/dpagd.py): budget, ledger, NoisyMax and GRADAVG calibration, objectives, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpaudit.errors import InputError
from dpaudit.training.dpagd import (
    DPAGDConfig,
    dpagd,
    dpagd_claim,
    grad_avg,
    gradients,
    initial_budgets,
    losses,
    noisy_argmin,
    rho_from_epsilon,
)


def _data(n, d, seed, margin=0.0):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, d))
    Z /= np.maximum(1.0, np.linalg.norm(Z, axis=1, keepdims=True))
    s = np.where(Z[:, 0] + margin * rng.normal(size=n) > 0, 1.0, -1.0)
    return Z, s


@pytest.mark.parametrize("eps, delta", [(0.1, 1e-5), (1.0, 1e-6), (4.0, 1e-3)])
def test_rho_solves_the_slides_conversion(eps, delta):
    rho = rho_from_epsilon(eps, delta)
    assert rho + 2 * math.sqrt(rho * math.log(1 / delta)) == pytest.approx(eps, rel=1e-12)  # slides Eq. (5)


def test_initial_budgets_match_the_authors_split():
    rho_nmax, rho_ng = initial_budgets(1.0, 1e-5, 50, 2.0)
    eps_split = 1.0 / 100
    assert rho_nmax == pytest.approx(eps_split**2 / 2)
    # Gaussian sigma = C sqrt(2 log(1.25/delta)) / eps_split, rho = C^2 / (2 sigma^2) (independent of C)
    assert rho_ng == pytest.approx(eps_split**2 / (4 * math.log(1.25e5)))


def test_ledger_never_exceeds_the_budget_and_spends_it():
    Z, s = _data(60, 4, 0)
    averaged = 0
    for seed in range(20):
        eps = [0.05, 0.3, 2.0][seed % 3]
        config = DPAGDConfig(
            epsilon=eps, delta=1e-5, splits=[5, 20, 60][seed % 3], objective=["logistic", "huber"][seed % 2]
        )
        result = dpagd(Z, s, config, np.random.default_rng(seed))
        totals = result.ledger.totals()
        spent = totals["spent"]
        assert spent <= config.rho * (1 + 1e-12)
        assert math.fsum(totals["rho"].values()) == pytest.approx(spent, rel=1e-12)
        rho_nmax, _ = initial_budgets(eps, 1e-5, config.splits, 1.0)
        assert totals["count"]["noisy_max"] >= 1 and totals["rho"]["noisy_max"] == pytest.approx(
            totals["count"]["noisy_max"] * rho_nmax
        )
        # the filter stops only when the next iteration (or averaging + step selection) cannot be afforded
        assert result.ledger.remaining < result.rho_ng_final * (1 + config.gamma) + rho_nmax
        averaged += totals["count"]["gradavg"]
    assert averaged > 0  # GRADAVG charges are exercised


def test_noisy_max_scale_is_c_obj_over_sqrt_two_rho_nmax():
    Z, s = _data(40, 3, 1)
    config = DPAGDConfig(epsilon=0.5, delta=1e-5, c_obj=0.7, splits=10)
    result = dpagd(Z, s, config, np.random.default_rng(0))
    rho_nmax, _ = initial_budgets(0.5, 1e-5, 10, 1.0)
    assert len(result.nmax_scales) > 0
    assert np.allclose(result.nmax_scales, 0.7 / math.sqrt(2 * rho_nmax), rtol=1e-12, atol=0)  # slides Alg. 2, line 12


def test_noisy_argmin_has_the_laplace_error_rate():
    # Two candidates 0 and g: the worse one wins iff L1 - L2 > g, L_i ~ Lap(b) i.i.d., with probability
    # (1/2) e^{-g/b} (1 + g/(2b)) (the difference of two Laplace variables).
    b, g, trials = 1.0, 1.5, 20000
    rng = np.random.default_rng(3)
    wrong = np.mean([noisy_argmin(np.array([0.0, g]), b, rng) == 1 for _ in range(trials)])
    expect = 0.5 * math.exp(-g / b) * (1 + g / (2 * b))
    tol = 4 * math.sqrt(expect * (1 - expect) / trials)
    assert abs(wrong - expect) < tol
    half = np.mean([noisy_argmin(np.array([0.0, g]), b / 2, rng) == 1 for _ in range(trials)])  # planted: half noise
    assert abs(half - expect) > tol


def test_gradavg_noise_is_one_gaussian_of_the_new_budget():
    rng = np.random.default_rng(4)
    c, rho_old, rho_new, d = 1.5, 0.01, 0.011, 20000
    g = np.zeros(d)
    noisy = rng.normal(0, c / math.sqrt(2 * rho_old), size=d)
    out = grad_avg(rho_old, rho_new, g, noisy, c, rng)
    target = c**2 / (2 * rho_new)
    assert out.var() == pytest.approx(target, rel=4 * math.sqrt(2 / d))
    naive = 0.5 * (noisy + rng.normal(0, c / math.sqrt(2 * (rho_new - rho_old)), size=d))  # planted: plain mean
    assert abs(naive.var() / target - 1) > 4 * math.sqrt(2 / d)


@pytest.mark.parametrize("objective", ["logistic", "huber"])
def test_gradients_match_finite_differences(objective):
    Z, s = _data(15, 3, 5)
    w = np.array([0.3, -1.2, 2.0])
    G = gradients(w, Z, s, objective, 0.1)
    h = 1e-6
    for j in range(3):
        e = np.eye(3)[j] * h
        numeric = (losses(w + e, Z, s, objective, 0.1) - losses(w - e, Z, s, objective, 0.1))[0] / (2 * h)
        assert np.allclose(G[:, j], numeric, atol=1e-6)
    assert np.all(losses(np.stack([w, -w]), Z, s, objective, 0.1) >= 0)  # NoisyMax's monotonicity needs l >= 0


def test_dpagd_learns_at_a_generous_budget_and_the_claim_is_the_budget():
    Z, s = _data(300, 5, 6, margin=0.1)
    config = DPAGDConfig(epsilon=4.0, delta=1e-5, splits=20)
    result = dpagd(Z, s, config, np.random.default_rng(0))
    assert np.mean(np.sign(Z @ result.w) == s) > 0.85  # labels: sign(x_1) with noise; chance is 0.5
    claim = dpagd_claim(config, result, 300)
    assert claim["event"] == {"type": "zcdp", "rho": config.rho} and claim["neighbouring"] == "add_remove"
    assert claim["epsilon"] <= 4.0  # the tight zCDP conversion is never above Eq. (5)
    assert claim["ledger"]["spent"] <= claim["rho_budget"]


def test_dpagd_releases_float32_precision_like_the_other_convex_learners():
    # The library output was the float64 iterate (its low bits carry the noisy gradients' exact values, Mironov
    # 2012) while outpert/objpert release float32 (convex.release_precision); the claim now says so for DP-AGD too.
    Z, s = _data(60, 4, 2)
    config = DPAGDConfig(epsilon=2.0, delta=1e-5, splits=5)
    w = dpagd(Z, s, config, np.random.default_rng(0)).w
    assert w.dtype == np.float64 and np.any(w != 0.0)
    assert np.array_equal(w, w.astype(np.float32).astype(np.float64))
    assert "rounded to float32" in dpagd_claim(config, None, 60)["analysis"]


def test_trainer_on_digits_3_vs_8():
    from dpaudit.data import load_dataset, make_splits
    from dpaudit.models import default_spec
    from dpaudit.training.config import DPConfig, TrainConfig
    from dpaudit.training.run import fit_model

    torch.set_num_threads(1)
    ds = load_dataset("digits:3,8")
    splits = make_splits(len(ds), 0)
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=2)
    config = TrainConfig(algo="dpagd-huber", steps=20, dp=DPConfig(target_epsilon=2.0, delta=1e-5))
    fitted = fit_model(ds, splits.members, spec, config, preprocessing_idx=splits.aux)
    assert fitted.outcome.privacy["objective"] == "huber" and fitted.outcome.privacy["splits"] == 20
    acc = (fitted.logits(ds.X[splits.test]).argmax(1) == ds.y[splits.test]).mean()
    assert acc > 0.75


def test_bad_input_is_an_input_error():
    Z, s = _data(20, 2, 7)
    # The advice is more splits: "raise --epsilon or lower --steps" (both make it worse) was given before, and
    # an epsilon beyond ~1e154 overflowed (OverflowError, exit 3).
    for epsilon in (0.1, 1e200):
        with pytest.raises(InputError, match=r"too small for one DP-AGD iteration .*; raise --steps \(the splits"):
            dpagd(Z, s, DPAGDConfig(epsilon=epsilon, delta=1e-12, splits=1), np.random.default_rng(0))
    assert dpagd(Z, s, DPAGDConfig(epsilon=0.1, delta=1e-12, splits=4), np.random.default_rng(0)).w is not None
    with pytest.raises(InputError, match="objective"):
        DPAGDConfig(epsilon=1.0, delta=1e-5, objective="hinge")
    with pytest.raises(InputError):
        DPAGDConfig(epsilon=1.0, delta=1e-5, lam=-0.1)
    from dpaudit.models import build_model, default_spec
    from dpaudit.training.algorithms import get_trainer
    from dpaudit.training.config import DPConfig, TrainConfig

    model = build_model(default_spec("logreg", input_shape=(2,), n_classes=3))
    trainer = get_trainer("dpagd")(TrainConfig(algo="dpagd", dp=DPConfig(target_epsilon=1.0)))
    # three classes: one-vs-rest, three runs at rho/3 each (issue 28), the claim their sum
    out = trainer.fit(model, torch.zeros(6, 2), torch.tensor([0, 1, 2, 0, 1, 2]))
    assert out.privacy["classifiers"] == 3 and out.privacy["epsilon"] <= 1.0 * (1 + 1e-12)
    assert out.privacy["rho_per_classifier"] == pytest.approx(out.privacy["rho_budget"] / 3, rel=1e-12)
