"""Shadow-model attack of Shokri et al. 2017, "Membership Inference Attacks against Machine Learning
Models" (arXiv:1610.05820), on arrays.

K shadow models imitate the target (same architecture and training recipe), each trained on its own
shadow dataset with known membership. Their outputs on records labelled in/out train an attack
classifier (§IV-C/D); applied to the target model's outputs it predicts membership. Training the
shadow models is :mod:`attacks.reference`'s job; this module sees only logits, labels and the in/out
ground truth of the shadow records.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attacks.threshold import check_logits, log_softmax, logit_margin
from dpaudit.errors import InputError
from dpaudit.validation import check_choice, check_positive_int, host_array

CLASSIFIERS = ("logreg", "gb", "mlp")
FEATURES = ("sorted", "sorted+label")


def attack_features(logits: Any, labels: Any, features: str = "sorted+label") -> np.ndarray:
    """Features of the attack classifier, from one model's logits on records with their labels.

    "sorted": the log-probability vector sorted in decreasing order (Salem et al. 2019, ML-Leaks,
    arXiv:1806.01246 §III: sorting makes the attack class-agnostic); "sorted+label" adds the true
    label's log-probability and its logit-scaled confidence phi (Carlini et al. 2022, §IV).
    Log-probabilities (float64) rather than probabilities, so near-1 confidences stay distinct.
    """
    check_choice(FEATURES, features=features)
    z, y = check_logits(logits, labels, labelled=features == "sorted+label")
    lp = log_softmax(z)
    cols = [-np.sort(-lp, axis=1)]
    if features == "sorted+label":
        rows = np.arange(len(z))
        cols += [lp[rows, y][:, None], logit_margin(z, y)[:, None]]
    return np.hstack(cols)


def _make_classifier(kind: str, seed: int):
    if kind == "gb":
        from sklearn.ensemble import HistGradientBoostingClassifier

        return HistGradientBoostingClassifier(max_iter=100, learning_rate=0.1, max_leaf_nodes=15, random_state=seed)
    if kind == "logreg":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(
        StandardScaler(),
        MLPClassifier(hidden_layer_sizes=(64,), alpha=1e-3, max_iter=1000, early_stopping=False, random_state=seed),
    )


def _log_odds(clf, X: np.ndarray) -> np.ndarray:
    """The classifier's log-odds of "member" (continuous, so scores rarely tie)."""
    if hasattr(clf, "decision_function"):
        return np.asarray(clf.decision_function(X), dtype=np.float64)
    p = np.clip(clf.predict_proba(X)[:, 1].astype(np.float64), 1e-15, 1 - 1e-15)
    return np.log(p) - np.log1p(-p)


def _fit(clf, X: np.ndarray, y: np.ndarray, weight: np.ndarray):
    from threadpoolctl import threadpool_limits

    # One OpenMP thread: the data are small, and spinning OpenMP threads on busy cores (e.g. next to
    # reference-model workers) slows gradient boosting down by orders of magnitude.
    with threadpool_limits(limits=1, user_api="openmp"):
        if hasattr(clf, "steps"):  # a pipeline: route the weights to its final estimator
            return clf.fit(X, y, **{f"{clf.steps[-1][0]}__sample_weight": weight})
        return clf.fit(X, y, sample_weight=weight)


def _balanced_weights(member: np.ndarray) -> np.ndarray:
    """Sample weights giving IN and OUT records equal total weight (there are more OUT records)."""
    frac = member.mean()
    return np.where(member, 0.5 / frac, 0.5 / (1.0 - frac))


class ShadowAttack:
    """Attack classifier trained on shadow models' outputs (Shokri et al. 2017, §IV).

    Parameters
    ----------
    classifier : "logreg" (standardised logistic regression), "gb" (histogram gradient boosting) or
        "mlp" (scikit-learn). IN and OUT records are weighted to equal total weight.
    per_class : one attack classifier per true label (Shokri et al. §IV-D), for classes with at least
        ``min_class_records`` IN and OUT shadow records; other classes use the single classifier
        trained on all records. Off by default: with a small auxiliary split, per-class classifiers
        see a few dozen records each and rank worse at low FPR than one classifier.
    features : see :func:`attack_features`.
    seed : randomness of the classifiers.

    Calibration (optional): ``reference`` gives, per record, the mean logit-scaled confidence of
    models that never trained on it; the feature phi - reference is the "difficulty calibration"
    of Watson et al. 2022 (arXiv:2111.08440, §3): how much more confident the model is on this
    record than models that did not see it. Give it to both :meth:`fit` and :meth:`score` or to
    neither.

    Learned attributes: ``global_`` (the single classifier), ``per_class_`` (dict label ->
    classifier), ``n_classes_``, ``calibrated_``.
    """

    def __init__(
        self,
        *,
        classifier: str = "logreg",
        per_class: bool = False,
        features: str = "sorted+label",
        min_class_records: int = 10,
        seed: int = 0,
    ) -> None:
        self.classifier = classifier
        self.per_class = per_class
        self.features = features
        self.min_class_records = min_class_records
        self.seed = seed

    def _features(self, logits: Any, labels: Any, reference: Any) -> tuple[np.ndarray, np.ndarray]:
        z, y = check_logits(logits, labels, labelled=True)  # the per-class models and the shape checks read them
        X = attack_features(z, y, self.features)
        if reference is not None:
            ref = np.asarray(host_array(reference), dtype=np.float64)
            if ref.shape != y.shape or not np.all(np.isfinite(ref)):
                raise InputError(f"expected a finite reference signal of shape {y.shape}, got {ref.shape}")
            X = np.hstack([X, (logit_margin(z, y) - ref)[:, None]])
        return X, y

    def fit(self, logits: Any, labels: Any, member: Any, reference: Any = None) -> ShadowAttack:
        """Fit on shadow models' logits on records with known membership (pooled over shadow models)."""
        check_choice(CLASSIFIERS, classifier=self.classifier)
        check_positive_int(min_class_records=self.min_class_records)
        X, y = self._features(logits, labels, reference)
        m = np.asarray(host_array(member))
        if m.shape != y.shape or m.dtype != bool:
            raise InputError(f"expected a boolean member array of shape {y.shape}")
        if m.all() or not m.any():
            raise InputError("the shadow records must include both IN and OUT records")
        self.n_classes_ = np.shape(host_array(logits))[1]
        self.calibrated_ = reference is not None
        w = _balanced_weights(m)
        self.global_ = _fit(_make_classifier(self.classifier, self.seed), X, m, w)
        self.per_class_: dict[int, Any] = {}
        if self.per_class:
            for c in np.unique(y):
                sel = y == c
                if min(m[sel].sum(), (~m[sel]).sum()) >= self.min_class_records:
                    clf = _make_classifier(self.classifier, self.seed)
                    self.per_class_[int(c)] = _fit(clf, X[sel], m[sel], _balanced_weights(m[sel]))
        return self

    def score(self, logits: Any, labels: Any, reference: Any = None) -> np.ndarray:
        """Membership scores (log-odds of "member", higher = member) of the target's outputs."""
        if not hasattr(self, "global_"):
            raise InputError("ShadowAttack.score called before fit")
        if (reference is not None) != self.calibrated_:
            raise InputError("give the reference signal to both fit and score, or to neither")
        X, y = self._features(logits, labels, reference)
        classes = np.shape(host_array(logits))[1]
        if classes != self.n_classes_:
            raise InputError(f"expected logits with {self.n_classes_} classes, got {classes}")
        out = _log_odds(self.global_, X) if len(X) else np.zeros(0)
        for c, clf in self.per_class_.items():
            sel = y == c
            if sel.any():
                out[sel] = _log_odds(clf, X[sel])
        return out
