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

Token sequences (``tokens=True``: a ``kind == "tokens"`` dataset's integer ids) are compared as bags of tokens:
each sequence is its vector of token counts, L2-normalised, so the squared distance of two sequences is
2 - 2 cos(counts) (the fixed count representation of text classification, e.g. Manning, Raghavan & Schütze 2008,
*Introduction to Information Retrieval*, Sec. 6.3; Wu et al. 2024 embed texts with a model, which token ids
give none). Ids are arbitrary labels: Euclidean distances between the ids themselves (17 "near" 18) were
meaningless and renaming the vocabulary changed the answers; a bag of tokens is invariant to renaming, and
computed from integer counts it is exactly so. The representation is fixed (no weights fitted to any data),
so each teacher's vote still depends on its own prompt only and the privacy analysis is unchanged.
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


def _token_counts(X: np.ndarray, vocab: np.ndarray):
    """Sparse (n, len(vocab)) int64 counts of each row's token ids (ids are looked up in the sorted ``vocab``)."""
    from scipy.sparse import csr_matrix

    n, length = X.shape
    cols = np.searchsorted(vocab, X.ravel())
    return csr_matrix((np.ones(n * length, np.int64), (np.repeat(np.arange(n), length), cols)), (n, len(vocab)))


def _token_ids(X: np.ndarray, what: str) -> np.ndarray:
    X = np.asarray(X)
    if not np.issubdtype(X.dtype, np.integer) or X.ndim < 2 or X.size == 0 or X.min() < 0:
        raise InputError(
            f"token data: the in-context predictor needs {what} as non-negative integer token ids (one sequence per "
            f"row), got dtype {X.dtype} with shape {list(X.shape)}"
        )
    return X.reshape(len(X), -1)


def _bag_of_tokens_cosines(exemplars_X, queries) -> tuple[np.ndarray, np.ndarray]:
    """Cosines of the token-count vectors: (queries x exemplars) and (exemplars x exemplars).

    Dot products of integer counts are exact integers, so a renaming of the vocabulary (which only permutes the
    count vectors' coordinates) leaves every cosine bit for bit the same."""
    E, Q = _token_ids(exemplars_X, "exemplars"), _token_ids(queries, "queries")
    vocab = np.unique(np.concatenate([E.ravel(), Q.ravel()]))
    ce, cq = _token_counts(E, vocab), _token_counts(Q, vocab)
    ne = np.sqrt(np.asarray(ce.multiply(ce).sum(1), dtype=np.float64).ravel())
    nq = np.sqrt(np.asarray(cq.multiply(cq).sum(1), dtype=np.float64).ravel())
    qe = np.asarray((cq @ ce.T).toarray(), dtype=np.float64) / (nq[:, None] * ne[None, :])
    ee = np.asarray((ce @ ce.T).toarray(), dtype=np.float64) / (ne[:, None] * ne[None, :])
    return qe, ee


class NearestExemplarPredictor:
    """Class score = -(distance to the nearest exemplar of that class) / tau, tau = median distance.
    ``tokens``: sequences of token ids, compared as L2-normalised bags of tokens (module docstring)."""

    def __init__(self, n_classes: int, *, tokens: bool = False) -> None:
        self.n_classes = check_positive_int(n_classes=n_classes)
        self.tokens = tokens

    def predict_proba(self, exemplars_X, exemplars_y, queries) -> np.ndarray:
        y = np.asarray(exemplars_y, dtype=np.int64)
        if len(exemplars_X) == 0:
            raise InputError("an in-context predictor needs at least one exemplar")
        if self.tokens:  # unit vectors: ||q - e||^2 = 2 - 2 cos(q, e)
            d = np.sqrt(np.maximum(2.0 - 2.0 * _bag_of_tokens_cosines(exemplars_X, queries)[0], 0.0))
        else:
            d = np.sqrt(_sq_dist(_flat(queries), _flat(exemplars_X)))
        tau = max(float(np.median(d)), 1e-12)
        scores = np.full((len(d), self.n_classes), -np.inf)
        for c in np.unique(y):
            scores[:, c] = -d[:, y == c].min(1) / tau
        return _softmax_present(scores, np.isin(np.arange(self.n_classes), y))


class PrototypePredictor:
    """Nearest class mean of the prompt's exemplars; softmax of -squared distance / tau (median).
    ``tokens``: sequences of token ids; the class's mean direction of its L2-normalised bags of tokens."""

    def __init__(self, n_classes: int, *, tokens: bool = False) -> None:
        self.n_classes = check_positive_int(n_classes=n_classes)
        self.tokens = tokens

    def predict_proba(self, exemplars_X, exemplars_y, queries) -> np.ndarray:
        y = np.asarray(exemplars_y, dtype=np.int64)
        if len(exemplars_X) == 0:
            raise InputError("an in-context predictor needs at least one exemplar")
        present = np.isin(np.arange(self.n_classes), y)
        if self.tokens:
            # The class's mean direction: the mean m_c of its unit vectors, normalised (the Rocchio centroid compared
            # by cosine; IIR Sec. 14.2 with cosine similarity, Sec. 6.3). cos(q, m_c) = mean_e cos(q, e) / ||m_c||,
            # ||m_c||^2 = mean_{e,e'} cos(e, e'); squared distance of unit vectors 2 - 2 cos. The raw mean is
            # shorter the more exemplars it averages, so on a sparse vocabulary (cosines near 0) the class with
            # the most exemplars won most queries (4 shots, vocabulary 1000: teacher accuracy 0.285, normalised 0.494;
            # benchmarks/icl_tokens.py).
            qe, ee = _bag_of_tokens_cosines(exemplars_X, queries)
            d = np.zeros((len(qe), self.n_classes))
            for c in np.flatnonzero(present):
                m = y == c
                d[:, c] = np.maximum(2.0 - 2.0 * qe[:, m].mean(1) / np.sqrt(ee[np.ix_(m, m)].mean()), 0.0)
        else:
            E, Q = _flat(exemplars_X), _flat(queries)
            protos = np.stack(
                [E[y == c].mean(0) if present[c] else np.zeros(E.shape[1]) for c in range(self.n_classes)]
            )
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


def make_predictor(name: str, n_classes: int, *, tokens: bool = False) -> InContextPredictor:
    """``knn`` (default), ``prototype``, or a path to a local sentence-embedding model directory.
    ``tokens``: the records are sequences of token ids (knn and prototype compare bags of tokens)."""
    if name == "knn":
        return NearestExemplarPredictor(n_classes, tokens=tokens)
    if name == "prototype":
        return PrototypePredictor(n_classes, tokens=tokens)
    if "/" in name or Path(name).exists() or name.startswith("."):
        if tokens:
            raise InputError(
                f"--predictor {name}: a sentence-embedding model reads texts, not token ids; on token data use "
                "--predictor knn or prototype (they compare the sequences as bags of tokens)"
            )
        return EmbeddingPredictor(n_classes, name)
    raise InputError(f"unknown predictor {name!r}; valid: {', '.join(PREDICTORS)} or a local model directory")
