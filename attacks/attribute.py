"""Attribute inference: recover one hidden (sensitive) feature of a record from the model.

The attacker knows every other feature of the record and its true label, and either
- ``"likelihood"`` (``black_box=False``; needs the model on counterfactual inputs): tries every
  candidate value v of the hidden feature and picks argmax_v p_model(y | x_{-j}, v) * P(v), the
  marginal-prior-weighted maximum-likelihood estimator of Fredrikson et al. 2014 (USENIX Security,
  "Privacy in pharmacogenetics", Sec. 4) -- Yeom et al. 2018 (CSF, "Privacy risk in machine learning",
  Sec. 5) use the same choice by smallest loss; or
- ``"attack-model"`` (``black_box=True``; only the model's output on the real record): a logistic
  regression trained on the aux split maps (other features, the model's probabilities, one-hot label)
  to the hidden value.

Hidden values: a feature with at most ``max_discrete`` distinct aux values is used as it is (its
values are the candidates); a continuous feature is binarised at its aux median (``x > median``), the
candidates then being the aux medians of each side. A one-hot encoded categorical attribute (columns
``color_red``, ``color_green``, ... as pandas' ``get_dummies`` writes them) is hidden as a whole: its
candidates are the categories (which column is 1, or none of them where a category was dropped), each
counterfactual sets the whole group, and the attack model never reads a column of the group (the other
columns of a one-hot group give the hidden one away: an attack on one column alone scored 100% on members
and non-members alike, a leak of the data's encoding, not of the model). The prior baseline predicts the aux
majority value.
Accuracy and advantage (accuracy - baseline accuracy) are reported separately for the target's training
members and its non-members (holdout). The leakage is the member - non-member accuracy gap (Yeom et al. 2018,
Sec. 5: attribute advantage) post-stratified on (true hidden value, label) cells (:func:`poststratified_leakage`),
with a one-sided permutation p-value (:func:`leakage_permutation_test`); it is an estimate, never a DP bound.
It is not the gap of the two advantages: their baselines differ by sampling noise only, which that difference
added (benchmarks/RESULTS.md, "Attribute-inference leakage: the statistic and its uncertainty").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpaudit import numfmt
from dpaudit.errors import InputError
from dpaudit.validation import check_positive_int

# Why a run over token data is refused (also checked before any other attack runs: dpaudit.workflows.checkpoint).
TOKEN_REFUSAL = (
    "attribute inference fills in one feature of a record from a small set of values it can enumerate; a "
    "token position ranges over the whole vocabulary: refused for token data; use `dpaudit attack mia` "
    "(membership) or canaries (`dpaudit train --canaries`) for a model over tokens"
)


class AttributeInference:
    """Infer feature ``feature`` (index into the flattened raw features) of records from a model.

    ``feature`` may also be the columns of a one-hot group (a sequence of indices, each column 0 or 1 with at
    most one 1 per record): the hidden value is then the category, which column is 1 (or none of them).
    ``fit(X_aux, y_aux, predict_proba)`` learns the hidden value's categories (``binarised_``,
    ``threshold_``, ``candidates_``: one row of the hidden columns' values per category), their aux prior
    (``prior_``, ``majority_``) and, black-box, the attack model (``attack_model_``). ``predict(X, y,
    predict_proba)`` returns inferred category indices; ``categories(X)`` the true ones. ``predict_proba``
    maps raw numpy records to class probabilities.
    """

    def __init__(
        self, feature: int | Sequence[int], *, black_box: bool = False, max_discrete: int = 10, seed: int | None = 0
    ) -> None:
        self.feature = feature
        self.black_box = black_box
        self.max_discrete = max_discrete
        self.seed = seed

    def categories(self, X: np.ndarray) -> np.ndarray:
        """The true hidden category index of each record."""
        X = np.asarray(X)  # the hidden columns alone are made float64 (exact from float32), not every feature
        H = np.asarray(X.reshape(len(X), -1)[:, list(self.columns_)], np.float64)
        if self.one_hot_:  # which column is 1; len(columns) where none is (a dropped category)
            return np.where(H.max(axis=1) > 0, np.argmax(H, axis=1), len(self.columns_)).astype(np.int64)
        v = H[:, 0]
        if self.binarised_:
            return (v > self.threshold_).astype(np.int64)
        values = self.candidates_[:, 0]
        idx = np.clip(np.searchsorted(values, v), 0, len(values) - 1)
        return np.where(values[idx] == v, idx, np.argmin(np.abs(v[:, None] - values), axis=1))

    @staticmethod
    def _flat(X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, np.float64)
        return X.reshape(len(X), -1)

    def _features(self, X: np.ndarray, y: np.ndarray, probs: np.ndarray) -> np.ndarray:
        rest = np.delete(self._flat(X), list(self.columns_), axis=1)  # no column of the hidden attribute
        onehot = np.eye(self.n_classes_)[np.asarray(y)]
        return np.hstack([rest, probs, onehot])

    def _columns(self, d: int) -> tuple[int, ...]:
        cols = [self.feature] if isinstance(self.feature, int | np.integer | bool) else self.feature
        try:
            cols = list(cols)
        except TypeError:
            cols = [cols]
        for c in cols:
            if isinstance(c, bool) or not isinstance(c, int | np.integer):
                raise InputError(f"expected feature to be an integer index, got {c!r}")
            if not 0 <= int(c) < d:
                raise InputError(f"feature index {c} is outside the data's features 0..{d - 1}")
        if not cols or len(set(int(c) for c in cols)) != len(cols):
            raise InputError(f"expected one feature index or distinct one-hot columns, got {self.feature!r}")
        return tuple(int(c) for c in cols)

    def fit(self, X_aux: np.ndarray, y_aux: np.ndarray, predict_proba: Callable[[np.ndarray], np.ndarray]):
        from dpaudit.checkpoint import eval_batch_rows

        check_positive_int(max_discrete=self.max_discrete)
        X_aux = np.asarray(X_aux)  # float32 rows stay float32: the hidden columns and the model's blocks go float64
        flat = X_aux.reshape(len(X_aux), -1)
        self.columns_ = self._columns(flat.shape[1])
        self.feature_ = self.columns_[0]
        self.one_hot_ = len(self.columns_) > 1
        H = np.asarray(flat[:, list(self.columns_)], np.float64)
        self.binarised_, self.threshold_ = False, None
        if self.one_hot_:
            if not (np.isin(H, (0.0, 1.0)).all() and (H.sum(axis=1) <= 1).all()):
                raise InputError(
                    f"features {list(self.columns_)} are not a one-hot group (values 0 or 1, at most one 1 per record)"
                )
            self.candidates_ = np.vstack([np.eye(len(self.columns_)), np.zeros((1, len(self.columns_)))])
            if (H.sum(axis=1) == 1).all():  # no record with none of them: no dropped category to guess
                self.candidates_ = self.candidates_[:-1]
        else:
            v = H[:, 0]
            values = np.unique(v)
            self.binarised_ = len(values) > self.max_discrete
            if self.binarised_:
                self.threshold_ = float(np.median(v))
                lo, hi = v[v <= self.threshold_], v[v > self.threshold_]
                if len(hi) == 0:
                    raise InputError(f"feature {self.feature_} cannot be binarised at its median (no value above it)")
                self.candidates_ = np.array([[np.median(lo)], [np.median(hi)]])
            else:
                self.candidates_ = values[:, None]
        cats = self.categories(X_aux)
        counts = np.bincount(cats, minlength=len(self.candidates_))
        self.prior_ = counts / counts.sum()
        self.majority_ = int(np.argmax(counts))
        # A block of eval_batch_rows rows made float64 at a time (the batches as_black_box cuts), not the whole aux
        # split: 307 MB for 12,500 CIFAR-sized records.
        rows = eval_batch_rows(tuple(X_aux.shape[1:]))
        probs = np.concatenate(
            [
                np.asarray(predict_proba(np.asarray(X_aux[s : s + rows], np.float64)))
                for s in range(0, max(len(X_aux), 1), rows)
            ]
        )
        self.n_classes_ = probs.shape[1]
        if self.black_box:
            from sklearn.linear_model import LogisticRegression
            from sklearn.pipeline import make_pipeline
            from sklearn.preprocessing import StandardScaler

            if len(np.unique(cats)) < 2:
                raise InputError(f"feature {self.feature_} takes a single value on the aux split")
            self.attack_model_ = make_pipeline(
                StandardScaler(), LogisticRegression(max_iter=2000, random_state=self.seed)
            ).fit(self._features(X_aux, y_aux, probs), cats)
        return self

    def predict(self, X: np.ndarray, y: np.ndarray, predict_proba: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Inferred hidden category index of each record (the hidden value itself is never read)."""
        if not hasattr(self, "candidates_"):
            raise InputError("AttributeInference is not fitted; call fit first")
        from dpaudit.checkpoint import eval_batch_rows

        X = np.asarray(X)
        y = np.asarray(y)
        if self.black_box:
            X = np.asarray(X, np.float64)
            return self.attack_model_.predict(self._features(X, y, np.asarray(predict_proba(X))))
        scores = np.empty((len(X), len(self.candidates_)))
        with np.errstate(divide="ignore"):
            log_prior = np.log(self.prior_)
        # A block of rows at a time, made float64 there: the counterfactual copies of a whole split in float64
        # held 2 x 430 MB for 17,500 CIFAR-sized members. Blocks of eval_batch_rows, the batches as_black_box
        # cuts any array into, so the model sees the same batches as with the split whole.
        rows = eval_batch_rows(tuple(X.shape[1:]))
        for s in range(0, len(X), rows):
            Xk = np.array(X[s : s + rows], np.float64)  # each candidate overwrites the hidden columns only
            flat, at = Xk.reshape(len(Xk), -1), np.arange(len(Xk))
            for k, value in enumerate(self.candidates_):
                flat[:, list(self.columns_)] = value  # the counterfactual record x_{-j}, v (a whole one-hot group)
                p = np.asarray(predict_proba(Xk))[at, y[s : s + rows]]
                # log p(y | x_{-j}, v) + log P(v) (Fredrikson et al. 2014, Sec. 4); log in float64, clamped at 1e-300
                scores[s : s + rows, k] = np.log(np.maximum(p, 1e-300)) + log_prior[k]
        return np.argmax(scores, axis=1)


@dataclass(frozen=True)
class AttributeResult:
    """Attribute inference on the target's members and non-members.

    ``groups["members"|"nonmembers"]``: ``n``, ``accuracy``, ``baseline_accuracy`` (always predicting the
    aux majority value), ``advantage`` = accuracy - baseline (each group on its own: does the attack beat the
    prior there?). ``strata``: per cell (true hidden value, label), (category index, label, members, members
    guessed right, non-members, non-members guessed right). ``leakage``: the member - non-member accuracy gap
    post-stratified on those cells (:func:`poststratified_leakage`), not the difference of the two advantages;
    ``leakage_test``: its one-sided permutation p-value (:func:`leakage_permutation_test`, seeded with
    ``params["seed"]``). Not a membership-score attack: the score convention of ``attacks/result.py`` does not
    apply.
    """

    feature: int
    feature_name: str | None
    method: str
    binarised: bool
    threshold: float | None
    candidates: tuple[float | str, ...]  # the hidden values; a one-hot group's: its categories by name
    groups: dict[str, dict[str, float]]
    params: dict[str, Any] = field(default_factory=dict)
    columns: tuple[int, ...] = ()  # the hidden columns: (feature,), or every column of its one-hot group
    strata: tuple[tuple[int, ...], ...] = ()  # per (value index, label) cell: (v, y, n_m, right_m, n_nm, right_nm)
    labels: tuple[int | float | str, ...] = ()  # the data's label of each class index (Dataset.label)

    @property
    def leakage(self) -> float:
        return poststratified_leakage(np.array(self.strata, np.int64))

    @property
    def leakage_test(self) -> dict[str, Any]:
        return leakage_permutation_test(np.array(self.strata, np.int64), seed=self.params.get("seed", 0))

    def to_dict(self) -> dict[str, Any]:
        leakage, test, left = self.leakage, self.leakage_test, left_out(np.array(self.strata, np.int64))
        return {
            "attack": "attribute-inference",
            "method": self.method,
            "feature": self.feature,
            "feature_name": self.feature_name,
            "columns": list(self.columns or (self.feature,)),
            "binarised": self.binarised,
            "threshold": self.threshold,
            "candidates": list(self.candidates),
            "members": dict(self.groups["members"]),
            "nonmembers": dict(self.groups["nonmembers"]),
            "strata": [
                {
                    "value": self.candidates[v] if v < len(self.candidates) else v,
                    "label": self.labels[y] if y < len(self.labels) else y,
                    "members": nm,
                    "members_right": km,
                    "nonmembers": nn,
                    "nonmembers_right": kn,
                }
                for v, y, nm, km, nn, kn in self.strata
            ],
            "leakage": leakage,
            "leakage_test": test,
            "left_out": left,
            "note": leakage_reading(leakage, test, left),
            "params": dict(self.params),
        }


def feature_names(dataset: Any) -> list[str] | None:
    """Feature names: a CSV's header, the embedded tabular datasets' (scikit-learn's), ``pixel_R_C`` for digits;
    None otherwise."""
    if getattr(dataset, "feature_names", None) is not None:  # your CSV's header (dpaudit.data.Dataset)
        return list(dataset.feature_names)
    if dataset.name in ("breast-cancer", "wine") and dataset.source == dataset.name:
        from sklearn import datasets as skd

        loader = {"breast-cancer": skd.load_breast_cancer, "wine": skd.load_wine}[dataset.name]
        return [str(n) for n in loader().feature_names]
    if dataset.name == "digits" and dataset.source == "digits":
        return [f"pixel_{r}_{c}" for r in range(8) for c in range(8)]
    return None


def resolve_feature(text: str | int, dataset: Any) -> tuple[int, str | None]:
    """A feature given as a name (case-insensitive, ``_`` for spaces) or an index -> (index, name).

    A name wins over an index: in a header ``0,2,5`` the feature ``2`` is the column named 2 (index 1), not
    the column at index 2. The prefix of a one-hot group (``color`` for ``color_red``, ``color_blue``, ...)
    names its first column; :func:`one_hot_group` then hides the whole group."""
    d = int(np.prod(dataset.X.shape[1:]))
    names = feature_names(dataset)
    s = str(text).strip()
    key = s.lower().replace("_", " ")
    match = [i for i, n in enumerate(names or ()) if n.lower().replace("_", " ") == key]
    if not match and names is not None:  # the prefix of a one-hot group, as pandas' get_dummies names them
        first = [i for i, n in enumerate(names) if n.lower().startswith(s.lower() + "_")][:1]
        group = one_hot_group(first[0], names, dataset.X) if first else None
        match = first if group is not None and group[1].lower() == s.lower() else []
    if match:
        j = match[0]
    else:
        try:
            j = int(s)
        except ValueError:
            if names is None:
                raise InputError(
                    f"dataset {dataset.name!r} has no feature names; give the feature as an index"
                ) from None
            more = ", …" if len(names) > 10 else ""
            raise InputError(f"unknown feature {s!r}; valid: {', '.join(names[:10])}{more}") from None
    if not 0 <= j < d:
        raise InputError(f"feature index {j} is outside the data's features 0..{d - 1}")
    return j, (names[j] if names else None)


def one_hot_group(j: int, names: Sequence[str] | None, X: np.ndarray) -> tuple[tuple[int, ...], str] | None:
    """The one-hot group holding column ``j``: (columns, prefix), or None.

    A group is two or more columns named ``PREFIX_VALUE`` (pandas' ``get_dummies``), each 0 or 1, with at most
    one 1 per record (none: a category dropped with ``drop_first``). Of the prefixes of ``j``'s name (split at
    each ``_``), the one whose columns form the largest group; the format is read on every record (the
    attacker knows how the data is encoded, not its values)."""
    if names is None or "_" not in names[j]:
        return None
    Xf = np.asarray(X).reshape(len(X), -1)  # each group's columns are made float64, never the whole X
    best: tuple[tuple[int, ...], str] | None = None
    parts = names[j].split("_")
    for cut in range(1, len(parts)):
        prefix = "_".join(parts[:cut])
        cols = tuple(i for i, n in enumerate(names) if n.startswith(prefix + "_"))
        if len(cols) < 2 or (best is not None and len(cols) <= len(best[0])):
            continue
        H = Xf[:, list(cols)].astype(np.float64)
        if np.isin(H, (0.0, 1.0)).all() and (H.sum(axis=1) <= 1).all():
            best = (cols, prefix)
    return best


def _group(pred: np.ndarray, true: np.ndarray, majority: int) -> dict[str, float]:
    acc = float(np.mean(pred == true)) if len(true) else float("nan")
    base = float(np.mean(true == majority)) if len(true) else float("nan")
    return {"n": len(true), "accuracy": acc, "baseline_accuracy": base, "advantage": acc - base}


# Monte Carlo relabellings of the leakage's permutation test: the p-value's own Monte Carlo standard error is
# sqrt(p (1 - p) / B) <= 0.5 / sqrt(B) = 0.0025 at B = 40 000 (binomial count of B independent draws).
LEAKAGE_PERMUTATIONS = 40_000


def leakage_strata(
    true_members: np.ndarray,
    labels_members: np.ndarray,
    correct_members: np.ndarray,
    true_nonmembers: np.ndarray,
    labels_nonmembers: np.ndarray,
    correct_nonmembers: np.ndarray,
) -> np.ndarray:
    """Per cell (true hidden value v, label y), the counts the leakage rests on: rows (v, y, members in the cell,
    those guessed right, non-members in the cell, those guessed right), for every cell seen in either group."""
    tm, tn = np.asarray(true_members, np.int64), np.asarray(true_nonmembers, np.int64)
    ym, yn = np.asarray(labels_members, np.int64), np.asarray(labels_nonmembers, np.int64)
    cm, cn = np.asarray(correct_members, bool), np.asarray(correct_nonmembers, bool)
    cells = sorted(set(zip(tm.tolist(), ym.tolist(), strict=True)) | set(zip(tn.tolist(), yn.tolist(), strict=True)))
    rows = []
    for v, y in cells:
        sm, sn = (tm == v) & (ym == y), (tn == v) & (yn == y)
        rows.append((v, y, sm.sum(), cm[sm].sum(), sn.sum(), cn[sn].sum()))
    return np.array(rows, np.int64).reshape(-1, 6)


def _held_by_both(strata: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the strata as rows, which rows are held by both groups): the cells the leakage can compare."""
    s = np.asarray(strata, np.int64).reshape(-1, 6)
    return s, (s[:, 2] > 0) & (s[:, 4] > 0)


def left_out(strata: np.ndarray) -> dict[str, Any]:
    """The records the leakage does not cover: those in (value, label) cells held by members only or non-members
    only (no gap there; :func:`poststratified_leakage` leaves them out). ``records`` (``members`` +
    ``nonmembers`` of them), in ``cells`` cells, and ``fraction`` of all the records scored (0 when none are)."""
    s, both = _held_by_both(strata)
    members, nonmembers = int(s[~both, 2].sum()), int(s[~both, 4].sum())
    total = int(s[:, 2].sum() + s[:, 4].sum())
    return {
        "records": members + nonmembers,
        "members": members,
        "nonmembers": nonmembers,
        "cells": int(np.count_nonzero(~both)),
        "fraction": (members + nonmembers) / total if total else 0.0,
    }


def _strata_weights(strata: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows used, their weights): the cells held by both groups, weighted by their pooled frequency, ordered by their
    counts rather than by (value, label), so that the sum over cells and the permutation test's per-cell draws do
    not depend on how the values and labels are named (in (value, label) order, renaming the hidden values moved the
    p-value in 97 of 150 random tables, 0.345 -> 0.336 at 2,000 relabellings, and the leakage by an ulp in 48).
    The key is the unordered pair of the groups' (records, right) counts first, so that swapping members and
    non-members keeps each cell's place and negates the leakage exactly; cells with equal counts are
    interchangeable."""
    s, both = _held_by_both(strata)
    used = s[both]

    def key(row: np.ndarray) -> tuple[int, ...]:
        m, nm = (int(row[2]), int(row[3])), (int(row[4]), int(row[5]))
        return (*min(m, nm), *max(m, nm), *m, *nm)

    used = used[sorted(range(len(used)), key=lambda i: key(used[i]))] if len(used) else used
    pooled = (used[:, 2] + used[:, 4]).astype(np.float64)
    return used, pooled / pooled.sum() if len(used) else pooled


def _gap(used: np.ndarray, weights: np.ndarray, right_members: np.ndarray) -> np.ndarray:
    """sum_c w_c (k_m,c / n_m,c - k_nm,c / n_nm,c) for member right-guess counts ``right_members`` (..., cells)."""
    right_all = used[:, 3] + used[:, 5]
    return (right_members / used[:, 2] - (right_all - right_members) / used[:, 4]) @ weights


def poststratified_leakage(strata: np.ndarray) -> float:
    """The leakage: per cell c = (true hidden value, label), the member - non-member accuracy gap on the records
    of c, weighted by c's pooled (members + non-members) frequency. Yeom et al. 2018's attribute advantage (CSF,
    "Privacy risk in machine learning", Sec. 5: member - non-member success rate) post-stratified to one
    population of cells (Holt & Smith 1979, JRSS A 142(1); Miratrix, Sekhon & Yu 2013, JRSS B 75(2)): a member
    set that happens to hold more records of an easy cell (a frequent value, a label that gives the value away)
    is not a leak. Under a random split the cell gaps average to the plain gap's expectation (same estimand), with
    less noise (benchmarks/RESULTS.md, "Attribute-inference leakage: the statistic"). A cell held by one group
    only has no gap and is left out (weights renormalised over the others); nan if no cell is held by both. A
    convex combination of the cell gaps: members guessed less often in every cell give leakage <= 0."""
    used, w = _strata_weights(strata)
    return float(_gap(used, w, used[:, 3])) if len(used) else float("nan")


def leakage_permutation_test(
    strata: np.ndarray, *, permutations: int = LEAKAGE_PERMUTATIONS, seed: int | None = 0
) -> dict[str, Any]:
    """One-sided permutation p-value of :func:`poststratified_leakage` (members guessed more often than
    non-members), from the per-cell counts alone (the model is not run again).

    Null: within each (value, label) cell, which records are members is exchangeable (the members/holdout split
    is random and the model has not learnt its members' hidden values). A random relabelling within cell c puts
    X_c ~ Hypergeometric(right_c, wrong_c, n_m,c) right guesses among its members, independently across cells;
    ``permutations`` seeded draws of the statistic. p = (1 + #{T_b >= T}) / (1 + B) (Phipson & Smyth 2010,
    SAGMB 9(1): a Monte Carlo p-value is never 0), ties within scipy.stats.permutation_test's relative tolerance
    100 eps |T|; its Monte Carlo standard error sqrt(p (1 - p) / B). None where the leakage is nan. An estimate
    of how surprising the gap is without a leak, not a DP bound."""
    check_positive_int(permutations=permutations)
    used, w = _strata_weights(strata)
    if not len(used):
        return {"p_value": None, "mc_se": None, "permutations": permutations, "seed": seed}
    observed = _gap(used, w, used[:, 3].astype(np.float64))
    rng = np.random.default_rng(seed)
    right_all = used[:, 3] + used[:, 5]
    draws = np.stack(
        [rng.hypergeometric(r, n_m + n_nm - r, n_m, size=permutations) for r, n_m, n_nm in
         zip(right_all, used[:, 2], used[:, 4], strict=True)],
        axis=1,
    ).astype(np.float64)  # fmt: skip
    null = _gap(used, w, draws)
    tol = 100 * np.finfo(np.float64).eps * abs(observed)
    p = float((1 + np.count_nonzero(null >= observed - tol)) / (1 + permutations))
    return {"p_value": p, "mc_se": float(np.sqrt(p * (1 - p) / permutations)), "permutations": permutations,
            "seed": seed}  # fmt: skip


# The p-value below which the reading says the gap is more than chance (a conventional level, not a DP bound).
LEAKAGE_LEVEL = 0.05


def leakage_reading(leakage: float, test: dict[str, Any], left: dict[str, Any] | None = None) -> str:
    """The leakage in words, for reports and the CLI: an estimate, with whether it is distinguishable from none,
    and (``left``, :func:`left_out`) how many records it leaves out, when any."""
    p = test.get("p_value")
    if p is None or not np.isfinite(leakage):
        return "leakage not computed: no (hidden value, label) cell holds both members and non-members"
    omitted = ""
    if left and left["records"]:
        omitted = (
            f"; {left['records']} records ({numfmt.percent_nearest(left['fraction'])}: {left['members']} members, "
            f"{left['nonmembers']} non-members) are in {left['cells']} cells held by one group only and are left out"
        )
    how = (
        f"one-sided permutation p = {p:.3g} ± {test['mc_se']:.1g} Monte Carlo SE, {test['permutations']} "
        "relabellings within (value, label) cells"
    )
    if p < LEAKAGE_LEVEL:
        said = f"members guessed more often than non-members with the same value and label, beyond chance ({how})"
    else:
        said = f"not distinguishable from no leakage ({how})"
    return (
        f"leakage {leakage:+z.3f} (estimate: member - non-member accuracy gap within (hidden value, label) cells, "
        f"weighted by the cells' pooled frequency): {said}{omitted}; not a DP bound"
    )


def attribute_predictions(
    run: Any, feature: str | int, *, black_box: bool = False, seed: int = 0, dataset: Any = None
) -> tuple[AttributeInference, dict[str, tuple[np.ndarray, np.ndarray]], tuple[int, str | None, Any]]:
    """Fit the attack on a loaded run's aux split and infer the hidden value of its members and holdout:
    (fitted attack, {"members"|"nonmembers": (inferred, true) category indices}, (feature index, its name,
    its one-hot group or None)). ``dataset``: the run's data already loaded (default: ``run.dataset()``).

    Never the whole data set in float64: that copy, 8 bytes a value, held 786 MB beside the 393 MB of 32,000
    CIFAR-sized images (peak RSS 2.5 GB). The likelihood attack reads each split in the data's dtype and makes a
    block of rows float64 at a time; the black-box one reads each split in float64 (:func:`_float_rows`)."""
    from attacks.inversion import as_black_box, raw_probabilities
    from dpaudit.checkpoint import as_run

    run = as_run(run)
    ds = dataset if dataset is not None else run.dataset()
    if ds.kind == "tokens":
        raise InputError(TOKEN_REFUSAL)
    j, name = resolve_feature(feature, ds)
    group = one_hot_group(j, feature_names(ds), ds.X)
    y = np.asarray(ds.y)
    sp = run.splits
    predict_proba = as_black_box(raw_probabilities(run))
    hidden = group[0] if group is not None else j
    # The likelihood attack makes a block of rows float64 at a time itself; the black-box attack model reads every
    # feature of a split in float64.
    rows = _float_rows if black_box else (lambda ds, idx: ds.rows(idx))
    att = AttributeInference(hidden, black_box=black_box, seed=seed).fit(rows(ds, sp.aux), y[sp.aux], predict_proba)
    out = {}
    for g, idx in (("members", sp.members), ("nonmembers", sp.holdout)):
        X = rows(ds, idx)
        out[g] = (att.predict(X, y[idx], predict_proba), att.categories(X))
    return att, out, (j, name, group)


def _float_rows(ds: Any, idx: np.ndarray) -> np.ndarray:
    """The rows ``idx`` of ``ds`` in float64: the values ``np.asarray(ds.X, np.float64)[idx]`` held (rows are
    read as float32 or the file's float dtype, each exact in float64), without that copy of every record."""
    return np.asarray(ds.rows(idx), np.float64)


def run_attribute(run: Any, feature: str | int, *, black_box: bool = False, seed: int = 0) -> AttributeResult:
    """Attribute inference of ``feature`` against a loaded run: fit on aux, evaluate on members and holdout;
    the leakage (:func:`poststratified_leakage`) and its permutation test (seeded with ``seed``)."""
    from dpaudit.checkpoint import as_run

    run = as_run(run)
    ds = run.dataset()  # once: each load reads and hashes the whole file again (it was loaded 3-4 times)
    att, preds, (j, name, group) = attribute_predictions(run, feature, black_box=black_box, seed=seed, dataset=ds)
    groups = {g: _group(pred, true, att.majority_) for g, (pred, true) in preds.items()}
    (pm, tm), (pn, tn) = preds["members"], preds["nonmembers"]
    labels = np.asarray(ds.y)
    strata = leakage_strata(tm, labels[run.splits.members], pm == tm, tn, labels[run.splits.holdout], pn == tn)
    columns = group[0] if group is not None else (j,)
    if group is not None:  # the categories by name: color_red -> "red"; a dropped category -> "(none)"
        names = feature_names(ds)
        candidates: tuple[float | str, ...] = tuple(
            [names[c][len(group[1]) + 1 :] for c in columns] + ["(none)"] * (len(att.candidates_) - len(columns))
        )
    else:
        candidates = tuple(float(c) for c in att.candidates_[:, 0])
    return AttributeResult(
        feature=j,
        feature_name=group[1] if group is not None else name,
        method="attack-model" if black_box else "likelihood",
        binarised=bool(att.binarised_),
        threshold=att.threshold_,
        candidates=candidates,
        groups=groups,
        params={"black_box": bool(black_box), "seed": seed, "max_discrete": att.max_discrete},
        columns=columns,
        strata=tuple(tuple(int(x) for x in row) for row in strata),
        labels=tuple(ds.label(k) for k in range(int(strata[:, 1].max()) + 1 if len(strata) else 0)),
    )
