"""The Cloak objective (seed "Cloak: Loss Function") against a hand computation on a tiny case."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpaudit.training.cloak import CloakConfig, cloak_loss

# Two features, two classes, the identity as the "model": logits = x + r.
X = [[1.0, 0.0], [0.0, 2.0]]
Y = [0, 1]
MU = [0.5, -0.5]
SIGMA = [1.0, 2.0]
NOISE = [[0.2, -0.1], [-1.0, 0.3]]  # the fixed standard-normal draw
LAM = 0.7


def _hand(privacy_mean=True, square=True, scale_noise=True) -> float:
    """L = -log((1/n) sum_i sigma_i^2) + lambda * (1/B) sum_b CE(x_b + mu + sigma * eps_b, y_b), by hand;
    the flags plant mistakes (a sum instead of the mean, sigma instead of sigma^2, unscaled noise)."""
    s = [v * v if square else v for v in SIGMA]
    privacy = -math.log(sum(s) / (len(s) if privacy_mean else 1))
    ces = []
    for x, y, e in zip(X, Y, NOISE, strict=True):
        z = [x[i] + MU[i] + (SIGMA[i] if scale_noise else 1.0) * e[i] for i in range(2)]
        ces.append(math.log(math.exp(z[0]) + math.exp(z[1])) - z[y])  # CE = logsumexp(z) - z_y
    return privacy + LAM * sum(ces) / len(ces)


def _loss() -> tuple[float, float, float]:
    t = torch.tensor
    loss, priv, task = cloak_loss(lambda v: v, t(X), t(Y), t(MU), t(SIGMA), t(NOISE), LAM)
    return float(loss), float(priv), float(task)


def test_objective_matches_hand_computation():
    # Record 1: z = [1 + 0.5 + 0.2, 0 - 0.5 - 0.2] = [1.7, -0.7]; record 2: z = [0.5 - 1, 2 - 0.5 + 0.6] = [-0.5, 2.1].
    ce1 = math.log(1 + math.exp(-2.4))
    ce2 = math.log(1 + math.exp(-2.6))
    expected = -math.log((1 + 4) / 2) + LAM * (ce1 + ce2) / 2
    loss, priv, task = _loss()
    assert loss == pytest.approx(expected, rel=1e-6)
    assert priv == pytest.approx(-math.log(2.5), rel=1e-6)
    assert task == pytest.approx((ce1 + ce2) / 2, rel=1e-6)
    assert _hand() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("mistake", [{"privacy_mean": False}, {"square": False}, {"scale_noise": False}])
def test_planted_mistakes_are_told_apart(mistake):
    """Each wrong variant of the formula differs from the implementation by far more than the tolerance."""
    assert abs(_hand(**mistake) - _loss()[0]) > 1e-2


def test_gradient_flows_to_mu_and_sigma_only_through_the_formula():
    """d L / d mu_i and d L / d sigma_i by autograd equal the closed forms on the same draw."""
    mu = torch.tensor(MU, requires_grad=True)
    sigma = torch.tensor(SIGMA, requires_grad=True)
    loss, _, _ = cloak_loss(lambda v: v, torch.tensor(X), torch.tensor(Y), mu, sigma, torch.tensor(NOISE), LAM)
    loss.backward()
    z = torch.tensor(X) + torch.tensor(MU) + torch.tensor(SIGMA) * torch.tensor(NOISE)
    g = torch.softmax(z, 1) - torch.eye(2)[torch.tensor(Y)]  # d CE / d z
    s = torch.tensor(SIGMA)
    d_sigma = -2 * s / (s * s).sum() + LAM * (g * torch.tensor(NOISE)).mean(0)  # d/d sigma of -log mean sigma^2
    np.testing.assert_allclose(mu.grad.numpy(), LAM * g.mean(0).numpy(), rtol=1e-5)
    np.testing.assert_allclose(sigma.grad.numpy(), d_sigma.numpy(), rtol=1e-5)


@pytest.mark.parametrize("lam", [0.0, -1.0, float("nan"), float("inf"), True])
def test_lambda_must_be_positive(lam):
    from dpaudit.errors import InputError

    with pytest.raises(InputError):
        CloakConfig(lam=lam)


def test_sigma_is_bounded_and_zero_on_constant_features(tiny_cloaks):
    for c in tiny_cloaks.values():
        cap = c.meta["config"]["sigma_cap"] * c.feature_range
        assert np.all(c.sigma > 0) and np.all(c.sigma <= cap * (1 + 1e-6))
