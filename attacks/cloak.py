"""What a Cloak-ed input still leaks: reconstruction, attribute inference, and a local-DP reading.

The cloak (``dpaudit.training.cloak``, Mireshghallah et al., arXiv:2003.12154) is public: the attacker
knows mu, sigma and the bounds, can cloak records of its own (the target's aux split) and sees the
cloaked release ``x + r`` of a victim's record (the target's test split, never used for fitting).

- Reconstruction: a decoder trained on (cloaked, clean) pairs from the aux split, ``draws`` noise draws
  per record, predicts the clean record (clipped to the cloak's public bounds, what the release starts from;
  aux and victims' records alike) from its cloaked release; a ridge regression whose penalty is
  chosen by generalised cross-validation on the aux pairs only (Golub, Heath & Wahba 1979). Its mean
  squared error on held-out records is compared with a mean predictor (the aux mean: no information) and
  with the same decoder fitted and applied on clean inputs (no cloak). ``relative_error`` = MSE / MSE of
  the mean predictor (1 = nothing recovered). A linear decoder is a lower bound on what leaks.
- Attribute inference: a sensitive attribute the task does not need, ``x_j > median_aux(x_j)`` for a
  chosen feature ``j`` (by default the most suppressed feature whose split is at least 20/80), predicted
  from the whole cloaked record by a logistic regression trained on cloaked aux records. Accuracy against
  the majority baseline and AUC (0.5 = chance), on cloaked and on clean inputs.
- The local-DP reading of :func:`dpaudit.training.cloak.local_dp_reading` (formal, one release).

Not a membership-score attack: the score convention of ``attacks/result.py`` does not apply; the
attribute AUC uses :func:`attacks.metrics.evaluate` with "higher score = attribute 1".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attacks.metrics import evaluate
from dpaudit.errors import InputError
from dpaudit.validation import check_positive_int

MIN_MINORITY = 0.2  # default attribute: its median split must leave at least 20% on each side (aux)


def _flat(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, np.float64)
    return X.reshape(len(X), -1)


def _cloak_draws(cloak, X: np.ndarray, draws: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(cloaked, clean) pairs: each record of ``X`` cloaked ``draws`` times with fresh noise."""
    from dpaudit.training.cloak import apply_cloak

    rep = np.concatenate([X] * draws)
    return _flat(apply_cloak(cloak, rep, seed=rng)), _flat(rep)


class CloakDecoder:
    """Ridge decoder cloaked -> clean, penalty by generalised cross-validation on the training pairs.

    ``fit(released, clean)`` learns ``model_``; ``predict(released)`` returns flat reconstructions.
    """

    def __init__(self, alphas: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3)) -> None:
        self.alphas = alphas

    def fit(self, released: np.ndarray, clean: np.ndarray) -> CloakDecoder:
        from sklearn.linear_model import RidgeCV

        self.model_ = RidgeCV(alphas=self.alphas).fit(_flat(released), _flat(clean))
        return self

    def predict(self, released: np.ndarray) -> np.ndarray:
        if not hasattr(self, "model_"):
            raise InputError("CloakDecoder is not fitted; call fit first")
        return self.model_.predict(_flat(released))


def default_attribute(cloak, X_aux: np.ndarray) -> int:
    """The most suppressed informative feature (largest sigma / range) whose aux median split leaves at
    least MIN_MINORITY of the records on each side; chosen from the cloak and aux data only."""
    Xf = _flat(X_aux)
    rel = cloak.relative_sigma().ravel()
    ok = []
    for j in range(Xf.shape[1]):
        a = Xf[:, j] > np.median(Xf[:, j])
        if cloak.informative.ravel()[j] and MIN_MINORITY <= a.mean() <= 1 - MIN_MINORITY:
            ok.append(j)
    if not ok:
        raise InputError("no feature splits the aux records at its median at least 20/80; give --feature")
    return int(max(ok, key=lambda j: (rel[j], -j)))


def _attribute_attack(train_X, train_a, test_X, test_a, seed: int) -> dict[str, float]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if len(np.unique(train_a)) < 2:
        raise InputError("the attribute takes a single value on the aux split")
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))
    model.fit(train_X, train_a)
    p = model.predict_proba(test_X)[:, 1]
    majority = bool(train_a.mean() >= 0.5)
    return {
        "accuracy": float(np.mean((p >= 0.5) == test_a)),
        "baseline_accuracy": float(np.mean(test_a == majority)),
        "auc": float(evaluate(p, test_a, n_bootstrap=0)["auc"]),
    }


@dataclass(frozen=True)
class CloakLeakage:
    """Leakage of one cloak (plain numbers; JSON via :meth:`to_dict`)."""

    lam: float
    metrics: dict[str, Any]
    reconstruction: dict[str, float]
    attribute: dict[str, Any]
    local_dp: dict[str, Any]
    sigma_map: tuple[float, ...]
    feature_shape: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        m = self.metrics
        return {
            "attack": "cloak",
            "lambda": self.lam,
            "suppression_ratio": m["suppression_ratio"],
            "suppression_threshold": m["suppression_threshold"],
            "clean_accuracy": m["clean_accuracy"],
            "cloaked_accuracy": m["cloaked_accuracy"],
            "accuracy_loss": m["accuracy_loss"],
            "reconstruction": dict(self.reconstruction),
            "attribute": dict(self.attribute),
            "local_dp": {k: v for k, v in self.local_dp.items() if k != "per_feature_epsilon"},
            "per_feature_epsilon": list(self.local_dp["per_feature_epsilon"]),
            "sigma_map": list(self.sigma_map),
            "feature_shape": list(self.feature_shape),
            "params": dict(self.params),
        }


def cloak_leakage(
    cloak,
    X_aux: np.ndarray,
    X_eval: np.ndarray,
    *,
    feature: int | None = None,
    draws: int = 5,
    seed: int = 0,
    delta: float | None = None,
    metrics: dict[str, Any] | None = None,
) -> CloakLeakage:
    """Reconstruction and attribute inference from cloaked releases (fit on ``X_aux``, measured on
    ``X_eval``), beside the cloak's local-DP reading. ``metrics``: the cloak's own (default its meta's)."""
    from dpaudit.training.cloak import apply_cloak, local_dp_reading

    draws = check_positive_int(draws=draws)
    rng = np.random.default_rng(seed)
    # The cloak releases clip(x, lo, hi) + r (apply_cloak; seed "Cloak: Noisy Representation": x + r, here on x
    # clipped to the public training bounds), so the clean record it hides is the clipped one, for the aux records
    # the attacker fits on as for the victims' it is scored on: one preprocessing for both. Fitting on unclipped
    # aux records taught the decoder to predict values the release never starts from (relative error 0.72 where
    # the noise is ~0 and a third of each feature lies outside the bounds).
    X_aux = np.clip(np.asarray(X_aux, np.float32), cloak.lo, cloak.hi)
    X_eval = np.clip(np.asarray(X_eval, np.float32), cloak.lo, cloak.hi)
    released_aux, clean_aux = _cloak_draws(cloak, X_aux, draws, rng)
    released_eval = _flat(apply_cloak(cloak, X_eval, seed=rng))
    clean_eval = _flat(X_eval)  # what the cloak starts from
    mean_pred = clean_aux.mean(axis=0)

    def mse(pred: np.ndarray, cols=slice(None)) -> float:
        return float(np.mean((pred[:, cols] - clean_eval[:, cols]) ** 2))

    rec = CloakDecoder().fit(released_aux, clean_aux).predict(released_eval)
    rec_clean = CloakDecoder().fit(_flat(X_aux), _flat(X_aux))
    base = np.broadcast_to(mean_pred, clean_eval.shape)
    threshold = (metrics or cloak.meta["metrics"])["suppression_threshold"]
    supp = np.flatnonzero((cloak.relative_sigma() >= threshold).ravel() & cloak.informative.ravel())
    reconstruction = {
        "mse_cloaked": mse(rec),
        "mse_clean": mse(rec_clean.predict(clean_eval)),
        "mse_mean_baseline": mse(base),
        "relative_error": mse(rec) / max(mse(base), 1e-300),
        "n_suppressed_features": len(supp),
        "suppressed_mse_cloaked": mse(rec, supp) if len(supp) else None,
        "suppressed_mse_mean_baseline": mse(base, supp) if len(supp) else None,
    }
    j = default_attribute(cloak, X_aux) if feature is None else int(feature)
    d = clean_aux.shape[1]
    if not 0 <= j < d:
        raise InputError(f"feature index {j} is outside the data's features 0..{d - 1}")
    median = float(np.median(_flat(X_aux)[:, j]))
    a_aux = clean_aux[:, j] > median
    a_eval = clean_eval[:, j] > median
    attribute = {
        "feature": j,
        "threshold": median,
        "relative_sigma": float(cloak.relative_sigma().ravel()[j]),
        "positive_rate": float(a_eval.mean()),
    }
    on_cloaked = _attribute_attack(released_aux, a_aux, released_eval, a_eval, seed)
    on_clean = _attribute_attack(clean_aux[: len(X_aux)], a_aux[: len(X_aux)], clean_eval, a_eval, seed)
    attribute["baseline_accuracy"] = on_cloaked["baseline_accuracy"]
    attribute |= {f"cloaked_{k}": on_cloaked[k] for k in ("accuracy", "auc")}
    attribute |= {f"clean_{k}": on_clean[k] for k in ("accuracy", "auc")}
    ldp = local_dp_reading(cloak, cloak.meta["config"]["delta"] if delta is None else delta)
    rel = np.minimum(cloak.relative_sigma(), 1e300).ravel()  # JSON-ready (no inf)
    return CloakLeakage(
        lam=cloak.lam,
        metrics=dict(metrics or cloak.meta["metrics"]),
        reconstruction=reconstruction,
        attribute=attribute,
        local_dp=ldp,
        sigma_map=tuple(float(v) for v in rel),
        feature_shape=tuple(int(s) for s in cloak.mu.shape),
        params={"draws": draws, "seed": seed, "decoder": "ridge (GCV)", "attribute_model": "logistic regression"},
    )


def run_cloak_leakage(
    cloak, run: Any, *, feature: str | int | None = None, draws: int = 5, seed: int = 0
) -> CloakLeakage:
    """:func:`cloak_leakage` against a cloak's target run: fit on its aux split, measure on its test split.
    ``feature`` as an index or a name (``pixel_3_4`` on digits)."""
    from attacks.attribute import resolve_feature
    from dpaudit.checkpoint import as_run

    run = as_run(run)
    ds = run.dataset()
    j = None if feature is None else resolve_feature(feature, ds)[0]
    X = np.asarray(ds.X, np.float32)
    return cloak_leakage(cloak, X[run.splits.aux], X[run.splits.test], feature=j, draws=draws, seed=seed)


DEFAULT_REPORT_LAMBDA = 2.0  # the report's cloak when none is given (digits: a few features suppressed)


def cloak_family(run: Any, options: dict[str, Any], *, seed: int = 0, progress=None) -> dict[str, Any]:
    """The report's "cloak" family for a loaded target run: ``options["cloak"]`` a cloak checkpoint trained
    for this run (its weights' hash is checked), else a cloak trained now with ``options["lambda"]``
    (default 2); ``options["feature"]`` the attribute (default: see :func:`default_attribute`)."""
    from dpaudit.progress import NULL_PROGRESS
    from dpaudit.training.cloak import CloakConfig, load_cloak, train_cloak, weights_sha256

    if options.get("cloak") is not None:
        cloak = load_cloak(options["cloak"])
        if cloak.meta["target"]["weights_sha256"] != weights_sha256(run.path):
            raise InputError(f"{options['cloak']}: this cloak was trained for another model, not {run.path}")
    else:
        lam = float(options.get("lambda", DEFAULT_REPORT_LAMBDA))
        cloak = train_cloak(run, CloakConfig(lam=lam, seed=seed), progress=progress or NULL_PROGRESS)
    return run_cloak_leakage(cloak, run, feature=options.get("feature"), seed=seed).to_dict()
