"""Threshold attacks: closed forms, float64 stability, and the sign convention on a memorising toy."""

from __future__ import annotations

import re

import numpy as np
import pytest

from attacks.lira import logit_scaled_confidence
from attacks.metrics import evaluate
from attacks.threshold import (
    THRESHOLD_METHODS,
    confidence_score,
    entropy_score,
    logit_margin,
    loss_score,
    modified_entropy_score,
    threshold_scores,
)
from dpaudit.errors import InputError


def naive_probs(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture
def moderate():
    rng = np.random.default_rng(0)
    z = rng.normal(scale=3.0, size=(200, 5))
    y = rng.integers(0, 5, 200)
    return z, y


def test_closed_forms_on_moderate_logits(moderate):
    z, y = moderate
    p = naive_probs(z)
    rows = np.arange(len(y))
    py = p[rows, y]
    np.testing.assert_allclose(loss_score(z, y), np.log(py), rtol=1e-12)
    np.testing.assert_allclose(logit_margin(z, y), np.log(py) - np.log1p(-py), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(confidence_score(z, y), np.log(p.max(axis=1)), rtol=1e-12)
    np.testing.assert_allclose(entropy_score(z, y), np.sum(p * np.log(p), axis=1), rtol=1e-10)
    wrong = p * np.log1p(-p)
    wrong[rows, y] = 0.0
    mentr = -(1 - py) * np.log(py) - wrong.sum(axis=1)  # Song & Mittal 2021, Mentr
    np.testing.assert_allclose(modified_entropy_score(z, y), -mentr, rtol=1e-9, atol=1e-14)


def test_phi_is_finite_when_p_rounds_to_one():
    # p_y = 1 - 2e-200-ish: 1 - p_y underflows in float64, log(p / (1 - p)) would be inf.
    z = np.array([[500.0, 40.0, 40.0], [800.0, 0.0, -3.0], [30.0, 0.0, 0.0]])
    y = np.array([0, 0, 0])
    assert naive_probs(z)[0, 0] == 1.0
    phi = logit_scaled_confidence(z, y)
    assert np.all(np.isfinite(phi))
    np.testing.assert_allclose(phi[0], 460.0 - np.log(2.0), rtol=1e-15)  # z_y - logsumexp(40, 40)
    np.testing.assert_allclose(phi[1], 800.0 - np.logaddexp(0.0, -3.0), rtol=1e-15)
    # Scores stay distinct where p_y rounds to 1 but 1 - p_y is representable (margins 40 and 60):
    # more confident -> higher, where softmax-then-log would tie both at exactly 0.
    z = np.array([[60.0, 0.0, 0.0], [40.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    assert naive_probs(z)[1, 0] == 1.0
    for f in (loss_score, confidence_score, modified_entropy_score, entropy_score):
        s = f(z, y)
        assert np.all(np.isfinite(s)) and np.all(s <= 0)
        assert s[0] > s[1] > s[2], f.__name__
    assert loss_score(z, y)[1] == pytest.approx(-2 * np.exp(-40.0), rel=1e-12, abs=0)  # 8.5e-18: abs=0 or blind


def test_phi_monotone_in_wrong_logit():
    z = np.array([[5.0, t, 0.0] for t in np.linspace(-20, 20, 41)])
    phi = logit_margin(z, np.zeros(41, int))
    assert np.all(np.diff(phi) < 0)


def test_bad_input():
    with pytest.raises(InputError, match="labels must lie"):
        loss_score(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(InputError, match="NaN or inf"):
        loss_score(np.array([[np.nan, 0.0]]), np.array([0]))
    with pytest.raises(InputError, match="unknown threshold attack"):
        threshold_scores("nope", np.zeros((2, 3)), np.array([0, 1]))
    shape = r"expected logits of shape \(n_records, n_classes >= 2\), got "
    for z in (np.zeros(3), np.zeros((2, 1)), np.zeros((2, 3, 1))):  # one class has no membership signal to read
        with pytest.raises(InputError, match=shape + re.escape(str(z.shape))):
            confidence_score(z)
    with pytest.raises(InputError, match=r"expected labels of shape \(2,\), got \(3,\)"):
        loss_score(np.zeros((2, 3)), np.array([0, 1, 2]))
    with pytest.raises(InputError, match="labels must be integers, got dtype float64"):
        loss_score(np.zeros((2, 3)), np.array([0.0, 1.0]))
    with pytest.raises(InputError, match=r"labels must lie in \[0, 3\), got range \[-1, 0\]"):
        loss_score(np.zeros((2, 3)), np.array([-1, 0]))
    assert loss_score(np.zeros((2, 3)), np.array([0, 2])).shape == (2,)  # the bounds 0 and k - 1 are labels
    assert loss_score(np.zeros((0, 3)), np.zeros(0, int)).shape == (0,)  # no records: no range to check


@pytest.mark.parametrize("score", [logit_margin, loss_score, modified_entropy_score])
def test_labelled_scores_refuse_no_labels(score):
    # z[rows, None] is a new axis, not a label: without the check, a NumPy broadcasting error (or a wrong shape).
    with pytest.raises(InputError, match=r"expected labels of shape \(2,\), got None"):
        score(np.zeros((2, 3)), None)
    assert confidence_score(np.zeros((2, 3)), None).shape == entropy_score(np.zeros((2, 3)), None).shape == (2,)


@pytest.fixture(scope="module")
def memorising_toy():
    """A small MLP trained to memorise 60 records with random labels; 60 unseen records as non-members."""
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import fit_model

    ds = load_dataset("synthetic:n=120,d=10,classes=3,seed=4,sep=0.2")
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(ds))
    members, holdout = idx[:60], idx[60:]
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=3, hidden=(64,))
    fitted = fit_model(ds, members, spec, TrainConfig(epochs=150, batch_size=20, lr=0.2, seed=0))
    cand = np.r_[members, holdout]
    member = np.r_[np.ones(60, bool), np.zeros(60, bool)]
    return fitted.logits(ds.X[cand]), ds.y[cand], member


@pytest.mark.parametrize("method", THRESHOLD_METHODS)
def test_sign_convention_higher_is_member(memorising_toy, method):
    logits, y, member = memorising_toy
    auc = evaluate(threshold_scores(method, logits, y), member, n_bootstrap=0)["auc"]
    # Observed 0.75-0.82 (seed 0), so "> 0.75" sat on the observed value. What the test separates: the
    # right sign (AUC well above 1/2) from a flipped one (AUC = 1 - that, below 1/2). Under no signal the
    # AUC of 60 + 60 scores has s.e. sqrt((n + m + 1) / (12 n m)) = 0.053 (Hanley & McNeil 1982), so
    # 1/2 + 3 s.e. is passed by chance with probability ~1e-3 and failed by any flipped sign.
    n, m = int(member.sum()), int((~member).sum())
    floor = 0.5 + 3 * np.sqrt((n + m + 1) / (12 * n * m))
    assert auc > floor, f"{method}: AUC {auc:.3f} <= {floor:.3f} (a flipped sign would give {1 - auc:.3f})"
