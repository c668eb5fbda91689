"""In-context predictors: teachers of DP-ICL (Wu et al. 2024, arXiv:2305.01639, Sec. 3).

An in-context predictor answers queries from the exemplars in its prompt only, with no training:
``predict_proba(exemplars_X, exemplars_y, queries) -> (n_queries, n_classes) probabilities``.

* :class:`NearestExemplarPredictor` (the embedded default, no download): the score of class c is
  minus the distance from the query to the nearest exemplar of class c, scaled by the median
  exemplar-to-query distance; softmax over the classes present in the prompt (absent classes get 0).
  Like an LLM that copies a matching exemplar, it answers a query equal to an exemplar with that
  exemplar's label, which is what the ICL membership attack (``attacks/icl.py``) exploits.
* :class:`PrototypePredictor`: nearest class mean of the prompt's exemplars (Snell et al. 2017).
* :class:`EmbeddingPredictor`: a local sentence-embedding model directory (optional
  ``sentence-transformers``; never downloads), then nearest-exemplar over the embeddings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from dpaudit.errors import InputError
from dpaudit.validation import check_positive_int

PREDICTORS = ("knn", "prototype")


class InContextPredictor(Protocol):
    n_classes: int

    def predict_proba(self, exemplars_X: np.ndarray, exemplars_y: np.ndarray, queries: np.ndarray) -> np.ndarray: ...


def _softmax_present(scores: np.ndarray, present: np.ndarray) -> np.ndarray:
    s = np.where(present[None, :], scores, -np.inf)
    s = s - s.max(1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(1, keepdims=True)


def _flat(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    return X.reshape(len(X), -1)


def _sq_dist(Q: np.ndarray, E: np.ndarray) -> np.ndarray:
    # ||q - e||^2 = ||q||^2 + ||e||^2 - 2 q.e, clamped at 0 (rounding can make it slightly negative)
    return np.maximum((Q**2).sum(1)[:, None] + (E**2).sum(1)[None, :] - 2.0 * Q @ E.T, 0.0)


class NearestExemplarPredictor:
    """Class score = -(distance to the nearest exemplar of that class) / tau, tau = median distance."""

    def __init__(self, n_classes: int) -> None:
        self.n_classes = check_positive_int(n_classes=n_classes)

    def predict_proba(self, exemplars_X, exemplars_y, queries) -> np.ndarray:
        E, Q = _flat(exemplars_X), _flat(queries)
        y = np.asarray(exemplars_y, dtype=np.int64)
        if len(E) == 0:
            raise InputError("an in-context predictor needs at least one exemplar")
        d = np.sqrt(_sq_dist(Q, E))
        tau = max(float(np.median(d)), 1e-12)
        scores = np.full((len(Q), self.n_classes), -np.inf)
        for c in np.unique(y):
            scores[:, c] = -d[:, y == c].min(1) / tau
        return _softmax_present(scores, np.isin(np.arange(self.n_classes), y))


class PrototypePredictor:
    """Nearest class mean of the prompt's exemplars; softmax of -squared distance / tau (median)."""

    def __init__(self, n_classes: int) -> None:
        self.n_classes = check_positive_int(n_classes=n_classes)

    def predict_proba(self, exemplars_X, exemplars_y, queries) -> np.ndarray:
        E, Q = _flat(exemplars_X), _flat(queries)
        y = np.asarray(exemplars_y, dtype=np.int64)
        if len(E) == 0:
            raise InputError("an in-context predictor needs at least one exemplar")
        present = np.isin(np.arange(self.n_classes), y)
        protos = np.stack([E[y == c].mean(0) if present[c] else np.zeros(E.shape[1]) for c in range(self.n_classes)])
        d = _sq_dist(Q, protos)
        tau = max(float(np.median(d[:, present])), 1e-12)
        return _softmax_present(-d / tau, present)


class EmbeddingPredictor:
    """Nearest-exemplar prediction over sentence embeddings from a local model directory.

    Records are texts (or anything the model's ``encode`` accepts). Needs the optional
    ``sentence-transformers`` package; the directory must exist (nothing is downloaded)."""

    def __init__(self, n_classes: int, model_dir: str | Path) -> None:
        self.n_classes = check_positive_int(n_classes=n_classes)
        path = Path(model_dir)
        if not path.is_dir():
            raise InputError(
                f"{path}: no such model directory (a local sentence-embedding model; nothing is downloaded)"
            )
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise InputError("--predictor PATH needs the optional package sentence-transformers") from None
        self._model = SentenceTransformer(str(path), local_files_only=True)
        self._inner = NearestExemplarPredictor(n_classes)

    def predict_proba(self, exemplars_X, exemplars_y, queries) -> np.ndarray:
        encode = self._model.encode
        return self._inner.predict_proba(encode(list(exemplars_X)), exemplars_y, encode(list(queries)))


def make_predictor(name: str, n_classes: int) -> InContextPredictor:
    """``knn`` (default), ``prototype``, or a path to a local sentence-embedding model directory."""
    if name == "knn":
        return NearestExemplarPredictor(n_classes)
    if name == "prototype":
        return PrototypePredictor(n_classes)
    if "/" in name or Path(name).exists() or name.startswith("."):
        return EmbeddingPredictor(n_classes, name)
    raise InputError(f"unknown predictor {name!r}; valid: {', '.join(PREDICTORS)} or a local model directory")
