"""Shokri et al. shadow attack: the array-level classifier and the shadow partition."""

from __future__ import annotations

import numpy as np
import pytest

from attacks.metrics import evaluate
from attacks.mia import fit_shadow_attack, shadow_partition
from attacks.shadow import CLASSIFIERS, ShadowAttack, attack_features
from dpaudit.errors import InputError


def toy_logits(n: int, seed: int, shift: float = 3.0):
    """Members get a larger margin on their true class, by a class-dependent amount."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    member = rng.random(n) < 0.5
    z = rng.normal(0, 1, (n, 4))
    z[np.arange(n), y] += 1.0 + shift * member * (1 + y / 4)
    return z, y, member


@pytest.mark.parametrize("classifier", CLASSIFIERS)
@pytest.mark.parametrize("per_class", [False, True])
def test_attack_learns_the_toy(classifier, per_class):
    z, y, member = toy_logits(800, 0)
    attack = ShadowAttack(classifier=classifier, per_class=per_class).fit(z, y, member)
    assert (len(attack.per_class_) == 4) == per_class
    zt, yt, mt = toy_logits(600, 1)
    scores = attack.score(zt, yt)
    assert scores.shape == (600,) and np.all(np.isfinite(scores))
    assert evaluate(scores, mt, n_bootstrap=0)["auc"] > 0.85  # higher = member


def test_calibration_reference():
    # Per-record difficulty: some records are easy for every model. The reference signal removes it.
    rng = np.random.default_rng(2)
    n = 2000
    y = rng.integers(0, 3, n)
    ease = rng.normal(0, 3, n)
    member = rng.random(n) < 0.5
    z = rng.normal(0, 0.3, (n, 3))
    z[np.arange(n), y] += ease + 1.0 * member
    ref = ease + rng.normal(0, 0.3, n)  # what models that never saw the record output (phi scale ~ margin)
    half = np.arange(n) < n // 2
    plain = ShadowAttack().fit(z[half], y[half], member[half])
    calib = ShadowAttack().fit(z[half], y[half], member[half], ref[half])
    auc_plain = evaluate(plain.score(z[~half], y[~half]), member[~half], n_bootstrap=0)["auc"]
    auc_calib = evaluate(calib.score(z[~half], y[~half], ref[~half]), member[~half], n_bootstrap=0)["auc"]
    assert auc_calib > auc_plain + 0.1
    with pytest.raises(InputError, match="both fit and score"):
        calib.score(z, y)


def test_features_sorted_and_label():
    z = np.array([[0.0, 2.0, 1.0]])
    f = attack_features(z, np.array([2]))
    assert f.shape == (1, 5)
    assert np.all(np.diff(f[0, :3]) <= 0)  # sorted decreasing log-probabilities
    assert attack_features(z, np.array([2]), "sorted").shape == (1, 3)


def test_bad_input():
    z, y, member = toy_logits(50, 0)
    with pytest.raises(InputError, match="both IN and OUT"):
        ShadowAttack().fit(z, y, np.ones(50, bool))
    with pytest.raises(InputError, match="unknown classifier"):
        ShadowAttack(classifier="svm").fit(z, y, member)
    with pytest.raises(InputError, match="before fit"):
        ShadowAttack().score(z, y)


@pytest.mark.parametrize("features", ["sorted", "sorted+label"])
def test_no_labels_is_one_line(features):
    # Labels None: an AttributeError ('NoneType' has no 'shape') for "sorted", a broadcasting error for
    # "sorted+label", before the check.
    z, _, member = toy_logits(50, 0)
    with pytest.raises(InputError, match=r"expected labels of shape \(50,\), got None"):
        ShadowAttack(features=features).fit(z, None, member)
    if features == "sorted+label":
        with pytest.raises(InputError, match="got None"):
            attack_features(z, None, features)
    else:
        assert attack_features(z, None, features).shape == (50, 4)  # the sorted vector needs no label


class TestPartition:
    def test_disjoint_and_sized(self):
        aux = np.arange(1000, 1450)
        parts = shadow_partition(aux, 3, n_target_train=600, batch_size=64, seed=0)
        assert [len(p) for p in parts] == [75, 75, 75]  # 450 // (2 * 3), half of each share IN
        allin = np.concatenate(parts)
        assert len(np.unique(allin)) == len(allin) and np.isin(allin, aux).all()
        capped = shadow_partition(aux, 1, n_target_train=100, batch_size=64, seed=0)
        assert len(capped[0]) == 100  # never more than the target trained on

    def test_too_small_says_how_many(self):
        with pytest.raises(
            InputError, match=r"449 records but 4 shadow model\(s\) need at least 512.*--shadow-models 3"
        ):
            shadow_partition(np.arange(449), 4, n_target_train=628, batch_size=64, seed=0)
        with pytest.raises(InputError, match="expected shadow_models >= 1"):
            shadow_partition(np.arange(449), 0, n_target_train=628, batch_size=64, seed=0)


def test_fit_shadow_attack_uses_out_records_and_calibration():
    rng = np.random.default_rng(0)
    n_rec, k = 300, 3
    labels = rng.integers(0, k, n_rec)
    aux = np.arange(100, 300)
    shadow_in = shadow_partition(aux, 2, n_target_train=1000, batch_size=10, seed=0)
    logits = rng.normal(0, 1, (2, n_rec, k))
    for j, idx in enumerate(shadow_in):
        logits[j, idx, labels[idx]] += 4.0
    attack, params = fit_shadow_attack(logits, shadow_in, aux, labels)
    assert params["calibrated"] and attack.calibrated_ and params["shadow_train_size"] == 50
    one, p1 = fit_shadow_attack(logits[:1], shadow_in[:1], aux, labels)
    assert not p1["calibrated"] and not one.calibrated_
