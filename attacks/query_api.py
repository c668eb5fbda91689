"""A black-box prediction API around a classifier, as a model-extraction attacker sees it.

Threat model (Tramèr et al. 2016, "Stealing Machine Learning Models via Prediction APIs", USENIX
Security, arXiv:1609.02943): the attacker sends feature vectors in the **raw** feature space of
the data (the API applies the model's own preprocessing, which the attacker never sees) and gets back
one answer per vector. It knows the number of classes, the feature shape and dtype, and holds an
auxiliary data set (dpaudit's ``aux`` split), whose per-feature minimum and maximum is the *feature
box* it draws synthetic queries from; it does not know the weights.

Answers, chosen by :class:`ApiMode`:

- ``probs``: class probabilities softmax(z) in float64, full precision;
- ``rounded:K``: the same rounded to K decimals (the rounding countermeasure Tramèr et al. evaluate;
  a probability below 0.5·10^-K reads 0);
- ``labels``: the top-1 class only (int64);
- ``logits``: the raw scores z (float64).

Every feature vector sent is one query and counts against the budget; a batch that would exceed it is
refused whole, before anything is answered (:class:`QueryBudgetExceeded`), so the counter always
equals the number of answers given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import softmax

from dpaudit.errors import InputError
from dpaudit.validation import check_positive_int, host_array

API_KINDS = ("probs", "rounded", "labels", "logits")
MAX_DECIMALS = 15  # float64 holds ~15.9 significant decimal digits: more decimals round nothing


class QueryBudgetExceeded(InputError):
    """A batch of queries would exceed the API's budget; nothing of it was answered."""


@dataclass(frozen=True)
class ApiMode:
    """What the API returns per query: ``kind`` in :data:`API_KINDS`; ``decimals`` only for ``rounded``."""

    kind: str
    decimals: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in API_KINDS:
            raise InputError(f"unknown api mode {self.kind!r}; valid: probs, rounded:K, labels, logits")
        if self.kind == "rounded":
            if isinstance(self.decimals, bool) or not isinstance(self.decimals, int):
                raise InputError(
                    f"api mode rounded needs an integer number of decimals (rounded:K), got {self.decimals!r}"
                )
            if not 0 <= self.decimals <= MAX_DECIMALS:
                raise InputError(
                    f"expected decimals in [0, {MAX_DECIMALS}] for api mode rounded:K, got {self.decimals}"
                )
        elif self.decimals is not None:
            raise InputError(f"api mode {self.kind} takes no decimals (only rounded:K does)")

    @classmethod
    def parse(cls, text: str | ApiMode) -> ApiMode:
        """``"probs"``, ``"rounded:3"``, ``"labels"`` or ``"logits"`` (case-insensitive) as a mode."""
        if isinstance(text, ApiMode):
            return text
        if not isinstance(text, str):
            raise InputError(f"expected an api mode (probs, rounded:K, labels, logits), got {text!r}")
        kind, sep, rest = text.strip().lower().partition(":")
        if kind == "rounded":
            try:
                decimals = int(rest)
            except ValueError:
                raise InputError(f"api mode rounded needs a number of decimals, e.g. rounded:3; got {text!r}") from None
            return cls(kind, decimals)
        if sep:
            raise InputError(f"unknown api mode {text!r}; valid: probs, rounded:K, labels, logits")
        return cls(kind)

    @property
    def returns_scores(self) -> bool:
        """Whether an answer holds a score per class (everything but ``labels``)."""
        return self.kind != "labels"

    def __str__(self) -> str:
        return f"rounded:{self.decimals}" if self.kind == "rounded" else self.kind

    def answer(self, logits: np.ndarray) -> np.ndarray:
        """The answers to queries whose logits are ``logits`` (n, k)."""
        z = np.asarray(logits, dtype=np.float64)
        if self.kind == "logits":
            return z
        if self.kind == "labels":
            return z.argmax(axis=1).astype(np.int64)
        p = softmax(z, axis=1)  # float64, max-shifted: no overflow, small probabilities keep their digits
        if self.kind == "rounded":
            return np.round(p, self.decimals)
        return p


class PredictionAPI:
    """Black-box access to a classifier under a query budget.

    ``logits_fn`` maps raw features (n, *feature_shape) to logits (n, n_classes); ``budget`` is the
    number of feature vectors that may be sent (None: unlimited). Inputs are cast to ``input_dtype``
    (the data's dtype) before the model sees them, as a deployed service parses its requests; an
    attacker that wants exact equations sends values representable in that dtype.
    """

    def __init__(
        self,
        logits_fn: Callable[[np.ndarray], np.ndarray],
        *,
        mode: str | ApiMode,
        n_classes: int,
        feature_shape: tuple[int, ...],
        budget: int | None = None,
        input_dtype: Any = np.float32,
    ) -> None:
        self._logits_fn = logits_fn
        self.mode = ApiMode.parse(mode)
        self.n_classes = check_positive_int(n_classes=n_classes)
        self.feature_shape = tuple(int(s) for s in feature_shape)
        self.budget = None if budget is None else check_positive_int(budget=budget)
        self.input_dtype = np.dtype(input_dtype)
        self._used = 0

    @classmethod
    def from_run(cls, run: Any, mode: str | ApiMode, *, budget: int | None = None) -> PredictionAPI:
        """The API of a loaded checkpoint (:class:`dpaudit.checkpoint.Run`): raw features in, its
        preprocessing and model applied behind the interface."""
        shape = tuple(run.spec.input_shape)
        dtype = np.int64 if run.meta["data"].get("kind") == "tokens" else np.float32
        return cls(run.logits, mode=mode, n_classes=run.spec.n_classes, feature_shape=shape, budget=budget,
                   input_dtype=dtype)  # fmt: skip

    @property
    def queries_used(self) -> int:
        """Feature vectors answered so far."""
        return self._used

    @property
    def remaining(self) -> int | None:
        """Queries left in the budget (None: unlimited)."""
        return None if self.budget is None else self.budget - self._used

    def query(self, X: Any) -> np.ndarray:
        """Answer a batch of queries ``X`` (n, *feature_shape) in raw feature space.

        Raises :class:`QueryBudgetExceeded` (answering nothing) if ``n`` exceeds the remaining budget.
        """
        X = np.asarray(host_array(X))  # a torch batch (even one that requires grad) reads as its values
        if X.shape[1:] != self.feature_shape or X.ndim != len(self.feature_shape) + 1:
            raise InputError(f"expected queries of shape (n, {', '.join(map(str, self.feature_shape))}), got {X.shape}")
        n = int(X.shape[0])
        if self.budget is not None and self._used + n > self.budget:
            raise QueryBudgetExceeded(
                f"query budget exceeded: {n} queries asked, {self.budget - self._used} of {self.budget} left"
            )
        if n == 0:
            return self.mode.answer(np.zeros((0, self.n_classes)))
        if not np.all(np.isfinite(X)):
            raise InputError("queries contain NaN or inf")
        # host_array: a torch model's forward (``lambda X: model(torch.as_tensor(X))``) returns a tensor that requires
        # grad, which NumPy refused with torch's RuntimeError
        logits = np.asarray(host_array(self._logits_fn(X.astype(self.input_dtype, copy=False))), dtype=np.float64)
        if logits.shape != (n, self.n_classes):
            raise InputError(f"the model answered logits of shape {logits.shape}, expected ({n}, {self.n_classes})")
        self._used += n
        return self.mode.answer(logits)


@dataclass(frozen=True, eq=False)
class FeatureBox:
    """Per-feature bounds [lower, upper] of raw features (arrays of the feature shape), float64."""

    lower: np.ndarray
    upper: np.ndarray

    def __post_init__(self) -> None:
        lo = np.array(self.lower, dtype=np.float64)
        hi = np.array(self.upper, dtype=np.float64)
        if lo.shape != hi.shape:
            raise InputError(f"feature box bounds have shapes {lo.shape} and {hi.shape}")
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise InputError("feature box bounds must be finite")
        if np.any(hi < lo):
            raise InputError("feature box has upper < lower")
        lo.setflags(write=False)
        hi.setflags(write=False)
        object.__setattr__(self, "lower", lo)
        object.__setattr__(self, "upper", hi)

    @classmethod
    def of(cls, X: Any) -> FeatureBox:
        """The box spanned by the records ``X`` (n, *feature_shape): per-feature min and max."""
        X = np.asarray(host_array(X), dtype=np.float64)
        if X.ndim < 2 or X.shape[0] == 0:
            raise InputError("the feature box needs at least one record")
        return cls(X.min(axis=0), X.max(axis=0))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.lower.shape)

    @property
    def width(self) -> np.ndarray:
        return self.upper - self.lower

    def widened(self) -> FeatureBox:
        """The box with every degenerate side (a feature constant in the records: lower == upper)
        opened to [lower, lower + 1]: the API accepts any input, and such a feature's weight can be
        recovered only from queries that vary it."""
        return FeatureBox(self.lower, np.where(self.upper > self.lower, self.upper, self.lower + 1.0))

    def sample(self, n: int, rng: np.random.Generator, dtype: Any = np.float32) -> np.ndarray:
        """``n`` points uniform in the box (independent features), cast to ``dtype``."""
        u = rng.random((n, *self.shape))
        return self.clip(self.lower + u * self.width, dtype)

    def clip(self, X: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
        """``X`` clipped into the box after the cast to ``dtype`` (so rounding cannot leave it)."""
        X = np.asarray(X, dtype=np.float64).astype(dtype)
        return np.clip(X, self.lower.astype(dtype), self.upper.astype(dtype))
