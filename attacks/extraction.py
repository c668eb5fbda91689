"""Model extraction: recover a classifier's parameters or behaviour from its prediction API.

Two attacks (Tramèr et al. 2016, "Stealing Machine Learning Models via Prediction APIs", USENIX
Security, arXiv:1609.02943), both through :class:`attacks.query_api.PredictionAPI`, which counts every
query against a budget; the attacker knows the feature box of its auxiliary data and the number of
classes, never the weights.

**Equation solving** (§4.1) for linear models. A softmax regression p = softmax(Wx + b) gives, for
every pair of classes k, a, the linear equation

    ln(p_k / p_a) = (w_k - w_a)·x + (b_k - b_a)                       (Tramèr et al. 2016, §4.1)

and for two classes this is the binary logit ln(f(x) / (1 - f(x))) = w·x + b (§4.1, binary LR). Only the
differences to a reference class are identifiable: adding one vector (v, c) to every class's (w_k, b_k)
leaves every probability unchanged, so results are the parameters minus the reference class's (the
last class), and errors are measured on these differences. With full probabilities (or logits) the
K-1 log-ratio systems against the reference class share one design matrix [x, 1], so d+1 linearly
independent queries solve them all exactly. With rounded probabilities a probability that rounds to
0 gives no equation, so each query contributes the log-ratios of its non-zero classes against its
most probable one, and all classes are solved jointly by weighted least squares over more queries.

dpaudit's ``logreg`` is a linear layer over *standardised* features; standardisation is affine, so
the model is linear in the raw features the API takes, and the attack recovers that composed map
(:func:`composed_linear_parameters` gives the true one for comparison).

**Learning-based extraction** for any model (Tramèr et al.'s "retraining" attacks; Orekondy et al. 2019,
Knockoff Nets, arXiv:1812.02766; Correia-Silva et al. 2018, Copycat CNN, arXiv:1806.05476): query a
pool of inputs (the attacker's aux records, uniform points in the feature box, or synthetic points),
and train a surrogate of a zoo architecture on the answers: soft labels (cross-entropy against the
returned probabilities, i.e. KL up to a constant) or hard labels. Optionally adaptive: in rounds,
query the pool points where the current surrogate's top-two margin is smallest (uncertainty
sampling; Tramèr et al.'s "adaptive retraining", Chandrasekaran et al. 2020, arXiv:1811.02054).

**Metrics** (Tramèr et al.'s R_test and R_unif): fidelity = 1 - R_test, the share of test inputs on which surrogate and
target predict the same class, and 1 - R_unif on inputs uniform in the feature box; the surrogate's
test accuracy; the relative error of the recovered parameter differences (linear models); queries
used; fidelity against queries (the attack refitted on prefixes of its own query sequence).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.query_api import ApiMode, FeatureBox, PredictionAPI
from dpaudit.budget import Cost, check_cost
from dpaudit.checkpoint import as_run
from dpaudit.data import Dataset, Identity, Standardizer
from dpaudit.errors import InputError
from dpaudit.fileio import check_output_dir
from dpaudit.models import LogRegSpec, ModelSpec, build_model, default_spec, one_torch_thread
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.validation import check_choice, check_non_negative, check_positive_int, host_array

METHODS = ("auto", "equations", "learning")
POOLS = ("aux", "uniform", "synthetic")
SURROGATES = ("logreg", "mlp", "cnn")
# Why a run over token data is refused (also checked before any other attack runs: dpaudit.workflows.checkpoint).
TOKEN_REFUSAL = (
    "extraction synthesises real-valued queries and fits real-valued surrogates, and token ids are "
    "discrete: refused for token data (an rnn or a python model over token ids); use "
    "`dpaudit attack mia` (membership) or canaries (`dpaudit train --canaries`)"
)
LINEAR_KINDS = ("logreg",)

N_UNIFORM = 10_000  # uniform evaluation inputs for 1 - R_unif (Tramèr et al. 2016); not attacker queries
ADAPTIVE_ROUNDS = 4  # the budget is spent in this many equal rounds; round 1 draws at random
CANDIDATES_PER_QUERY = 10  # adaptive rounds pick from this many fresh pool points per query spent
SYNTHETIC_SHRINKAGE = 0.1  # weight of the uniform box's covariance in the synthetic pool's Gaussian

# Surrogate training (Adam on soft or hard labels through dpaudit's trainer): common defaults set
# a priori, not tuned; each surrogate sees at least SURROGATE_MIN_STEPS batches, so that small budgets
# are fitted too (on 100 queries: 640 epochs, harmless for soft labels that carry the target's answers).
SURROGATE_LR = 3e-3
SURROGATE_BATCH = 64
SURROGATE_EPOCHS = 30
SURROGATE_MIN_STEPS = 1_000


# --------------------------------------------------------------------------- what the attacker knows


@dataclass(frozen=True, eq=False)
class AttackerKnowledge:
    """The attacker's side information: its auxiliary records (raw features) and their feature box."""

    aux_X: np.ndarray
    box: FeatureBox

    @classmethod
    def from_records(cls, aux_X: Any) -> AttackerKnowledge:
        X = np.asarray(aux_X)
        if X.ndim < 2 or len(X) == 0:
            raise InputError("extraction needs the attacker's auxiliary records (the aux split is empty)")
        return cls(X, FeatureBox.of(X))


class QueryPool:
    """Where queries come from: ``aux`` (the attacker's records, each queried at most once),
    ``uniform`` (independent uniform features in the box) or ``synthetic`` (a Gaussian with the aux
    records' mean and covariance shrunk by :data:`SYNTHETIC_SHRINKAGE` toward the uniform box's
    diagonal covariance, clipped to the widened box; cf. the synthetic queries of Papernot et al.
    2017, arXiv:1602.02697, here without Jacobian augmentation). Draws are seeded and reproducible."""

    def __init__(self, kind: str, knowledge: AttackerKnowledge, *, rng: np.random.Generator, dtype: Any) -> None:
        self.kind = check_choice(POOLS, pool=kind)
        self.knowledge = knowledge
        self.rng = rng
        self.dtype = np.dtype(dtype)
        self._unused = np.ones(len(knowledge.aux_X), dtype=bool)
        self._gauss: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def capacity(self) -> int | None:
        """How many distinct queries the pool can give (None: unlimited)."""
        return len(self.knowledge.aux_X) if self.kind == "aux" else None

    def _fresh(self, n: int) -> np.ndarray:
        box = self.knowledge.box
        if self.kind == "uniform":
            return box.sample(n, self.rng, self.dtype)
        if self._gauss is None:
            X = self.knowledge.aux_X.reshape(len(self.knowledge.aux_X), -1).astype(np.float64)
            width = box.widened().width.ravel()
            # Shrunk toward the covariance of the uniform distribution on the (widened) box, so that every
            # feature varies, also one constant or nearly constant in aux: otherwise a linear model's
            # weight on it is (nearly) unidentifiable from these queries.
            cov = (1 - SYNTHETIC_SHRINKAGE) * np.cov(X, rowvar=False).reshape(X.shape[1], X.shape[1])
            cov += SYNTHETIC_SHRINKAGE * np.diag(width**2 / 12.0)
            # Square root by eigendecomposition; negative eigenvalues (rounding) clipped to 0.
            evals, evecs = np.linalg.eigh(cov)
            self._gauss = (X.mean(axis=0), evecs * np.sqrt(np.clip(evals, 0.0, None)))
        mean, root = self._gauss
        Z = self.rng.standard_normal((n, len(mean)))
        return box.widened().clip((mean + Z @ root.T).reshape(n, *box.shape), self.dtype)

    def draw(self, n: int) -> np.ndarray:
        """``n`` new query points, at random, in random order: every prefix of a draw is itself a
        uniform sample of the pool, as the fidelity-vs-queries curve (refits on prefixes) assumes."""
        if self.kind != "aux":
            return self._fresh(n)
        idx = np.flatnonzero(self._unused)
        if n > len(idx):
            raise InputError(f"the aux pool has {len(idx)} unqueried records left, {n} asked")
        # Not sorted: aux records in index order follow the user's file, often sorted by label, and a
        # sorted draw's first n/8 records held a few classes only (curve point at 50 of 400 queries on
        # label-sorted digits: fidelity 31% where an attack that spends 50 queries reaches 82%).
        return self.take(self.rng.choice(idx, size=n, replace=False))

    def candidates(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Points an adaptive round may choose from: every unqueried aux record, or ``n`` fresh draws.
        Returns them with their aux indices (None for fresh draws)."""
        if self.kind != "aux":
            return self._fresh(n), None
        idx = np.flatnonzero(self._unused)
        return self.knowledge.aux_X[idx].astype(self.dtype), idx

    def take(self, aux_idx: np.ndarray) -> np.ndarray:
        """Mark aux records as queried and return them."""
        self._unused[aux_idx] = False
        return self.knowledge.aux_X[aux_idx].astype(self.dtype)


def axis_design(box: FeatureBox, dtype: Any = np.float32) -> np.ndarray:
    """d+1 queries for an exactly determined linear system: the box's lower corner and, for each
    feature j, that corner moved to the upper bound along j (degenerate sides widened, see
    :meth:`FeatureBox.widened`).

    Why not d+1 random points (Tramèr et al. use random queries): the target computes in float32, so
    its logits carry relative errors ~1e-7, amplified by the condition number of the design [x, 1].
    On the digits box (softmax, 10 epochs, split seed 0), d+1 = 65 uniform points had condition number
    ~5e3 and left a relative error of 5e-6 in the recovered parameters; this design, condition number
    ~2e2, leaves 9e-8 (the box's centre instead of its corner: 6e-7).
    """
    wide = box.widened()
    d = wide.lower.size
    X = np.repeat(wide.lower.reshape(1, d), d + 1, axis=0)
    X[np.arange(1, d + 1), np.arange(d)] = wide.upper.ravel()
    return wide.clip(X.reshape(d + 1, *box.shape), dtype)


# --------------------------------------------------------------------------- equation solving


def _flat(X: np.ndarray) -> np.ndarray:
    return np.asarray(X, dtype=np.float64).reshape(len(X), -1)


class EquationSolver:
    """Equation-solving extraction of a softmax (or binary logistic) regression from API answers
    (Tramèr et al. 2016, §4.1). sklearn-like: ``fit(X, answers)`` then ``decision_function(X)``.

    ``mode``: the API mode the answers come from (probs, rounded:K or logits; labels carry no
    equations). Learned: ``coef_`` (k, d) and ``intercept_`` (k,) in raw feature space with the
    reference class (the last) at zero, i.e. every class's parameters minus the reference class's;
    ``n_equations_`` used. Solved in float64.

    Full probabilities or logits: y_ik = ln(p_ik / p_iK) (or z_ik - z_iK) = (w_k - w_K)·x_i + (b_k - b_K)
    (§4.1), K-1 right-hand sides of one least-squares system [x_i, 1] (LAPACK gelsd), exact with
    d+1 linearly independent queries. Rounded probabilities: for each query, the log-ratios of its
    classes with a non-zero answer against its most probable class a_i, weighted by
    1/sqrt(1/p_k² + 1/p_a²) (the inverse delta-method standard deviation of ln p_k - ln p_a when each
    p carries the same rounding error), all (K-1)(d+1) unknowns solved jointly by weighted least
    squares (normal equations). Where t classes tie for the top, each is an anchor with weight 1/t, so
    relabelling the classes permutes the result and changes nothing else.
    """

    def __init__(self, mode: str | ApiMode = "probs") -> None:
        self.mode = mode

    def fit(self, X: Any, answers: Any) -> EquationSolver:
        mode = ApiMode.parse(self.mode)
        if not mode.returns_scores:
            raise InputError("equation solving needs scores per class (api probs, rounded:K or logits), not labels")
        Xf = _flat(np.asarray(host_array(X)))
        A = np.asarray(host_array(answers), dtype=np.float64)
        n, d = Xf.shape
        if A.ndim != 2 or A.shape[0] != n or A.shape[1] < 2:
            raise InputError(f"expected answers of shape ({n}, n_classes >= 2), got {A.shape}")
        k = A.shape[1]
        if n < d + 1:
            raise InputError(f"equation solving needs at least d+1 = {d + 1} queries, got {n}")
        design = np.hstack([Xf, np.ones((n, 1))])
        if mode.kind == "logits":
            theta = self._solve_shared(design, A[:, :-1] - A[:, -1:], d)
            self.n_equations_ = n * (k - 1)
        elif mode.kind == "probs" and np.all(A > 0):
            with np.errstate(divide="ignore"):
                L = np.log(A)
            theta = self._solve_shared(design, L[:, :-1] - L[:, -1:], d)
            self.n_equations_ = n * (k - 1)
        else:  # rounded, or a probability that underflowed to 0
            theta = self._solve_joint(design, A, weighted=mode.kind == "rounded")
        self.coef_ = np.vstack([theta[:, :d], np.zeros((1, d))])
        self.intercept_ = np.append(theta[:, d], 0.0)
        return self

    def _solve_shared(self, design: np.ndarray, Y: np.ndarray, d: int) -> np.ndarray:
        """All K-1 systems at once: one factorisation of the design matrix, K-1 right-hand sides."""
        if not np.all(np.isfinite(Y)):
            raise InputError("answers contain NaN or inf")
        theta, _, rank, _ = np.linalg.lstsq(design, Y, rcond=None)
        if rank < d + 1:
            raise InputError(
                f"the queries span {rank} of the d+1 = {d + 1} dimensions; need linearly independent queries"
            )
        return theta.T  # (K-1, d+1)

    def _solve_joint(self, design: np.ndarray, P: np.ndarray, *, weighted: bool) -> np.ndarray:
        d1 = design.shape[1]
        k = P.shape[1]
        ref = k - 1
        if np.any(P < 0) or not np.all(np.isfinite(P)):
            raise InputError("probabilities must be finite and non-negative")
        # Anchors: every class tied at a query's top probability (rounded answers tie often: 6% of queries at
        # rounded:1 on a 4-class model). The old argmax took the first tied class, so the solution depended on the
        # classes' order (relabelling them moved fidelity from 0.9950 to 0.9965: tests/attacks). Each tied
        # anchor's equations count 1/t (t tied anchors: weights scaled by 1/sqrt(t)), i.e. the normal equations
        # are the mean of those of every choice of anchor: symmetric in the classes, and as before without a tie.
        top = P > 0
        qa, an_a = np.nonzero(top & (P == P.max(axis=1, keepdims=True)))
        n_anchors = np.bincount(qa, minlength=len(P))
        pairs = top[qa]
        pairs[np.arange(len(qa)), an_a] = False
        row, cls = np.nonzero(pairs)
        qi, an = qa[row], an_a[row]
        pk, pa = P[qi, cls], P[qi, an]
        rhs = np.log(pk) - np.log(pa)
        # Rounding error of each p is the same, so sd(ln p) ∝ 1/p (delta method): weight by the inverse
        # standard deviation of the difference. Full-precision answers need no weights.
        w = 1.0 / np.sqrt(1.0 / pk**2 + 1.0 / pa**2) if weighted else np.ones_like(rhs)
        w = w / np.sqrt(n_anchors[qi])
        # Distinct equations: a query with m non-zero answers gives m - 1 independent log-ratios whatever its
        # anchor; a class's parameters are constrained by the queries where it is non-zero beside another class.
        nonzero = top.sum(axis=1)
        n_eq = int(np.maximum(nonzero - 1, 0).sum())
        n_unknown = (k - 1) * d1
        per_class = (top & (nonzero >= 2)[:, None]).sum(axis=0)
        short = [c for c in range(k) if c != ref and per_class[c] < d1]
        if n_eq < n_unknown or short:
            which = f"class {short[0]} appears in only {per_class[short[0]]} of them (< d+1 = {d1})" if short else ""
            raise InputError(
                f"the answers give {n_eq} usable equations for {n_unknown} unknowns (a probability rounded to 0 "
                f"gives none){'; ' + which if which else ''}: raise the budget, or query nearer the data "
                "(pool aux or synthetic)"
            )
        # Normal equations, accumulated per ordered class pair (k, a): each equation's row is
        # (e_k - e_a) ⊗ w x̃, so the Gram matrix gains G = Σ w² x̃ x̃ᵀ in blocks (k,k) and (a,a) and -G in
        # (k,a) and (a,k); the reference class's blocks are dropped (its parameters are fixed at 0, the
        # identifiable gauge). Normal equations square the condition number (~1e8 at worst here), which
        # costs far less accuracy than the rounding noise that makes this path necessary.
        gram = np.zeros((k, d1, k, d1))
        target = np.zeros((k, d1))
        pair = cls * k + an
        for p in np.unique(pair):
            m = pair == p
            c, a = divmod(int(p), k)
            Xw = design[qi[m]] * w[m, None]
            G = Xw.T @ Xw
            g = Xw.T @ (w[m] * rhs[m])
            gram[c, :, c] += G
            gram[a, :, a] += G
            gram[c, :, a] -= G
            gram[a, :, c] -= G
            target[c] += g
            target[a] -= g
        keep_cls = np.arange(k) != ref
        gram = gram[keep_cls][:, :, keep_cls].reshape(n_unknown, n_unknown)
        sol, _, rank, _ = np.linalg.lstsq(gram, target[keep_cls].ravel(), rcond=None)
        if rank < n_unknown:
            raise InputError(
                f"the {n_eq} usable equations determine {rank} of the {n_unknown} unknowns (a feature the queries "
                "never vary, as aux records keep features constant in the data, or probabilities rounded to 0 "
                "leave parameters undetermined): raise the budget, or use pool synthetic"
            )
        self.n_equations_ = n_eq
        return sol.reshape(k - 1, d1)

    def decision_function(self, X: Any) -> np.ndarray:
        """Logits (float64) of the extracted model on raw features (the reference class's are 0)."""
        return _flat(np.asarray(host_array(X))) @ self.coef_.T + self.intercept_

    def predict(self, X: Any) -> np.ndarray:
        return self.decision_function(X).argmax(axis=1)


def composed_linear_parameters(run: Any) -> tuple[np.ndarray, np.ndarray]:
    """The true raw-space parameters (W, b) of a ``logreg`` checkpoint, float64: its linear layer
    composed with its preprocessing. Standardisation x' = (x - μ)/s gives
    W x' + b = (W / s) x + (b - W (μ / s)). Evaluation only (white-box): the attacker never calls it."""
    return _composed(run.spec, run.model, run.preprocessing)


def _composed(spec: ModelSpec, model: nn.Module, pre: Any) -> tuple[np.ndarray, np.ndarray]:
    if spec.kind not in LINEAR_KINDS:
        raise InputError(f"parameters are compared for linear models (logreg) only, not {spec.kind}")
    linear = next(m for m in model.modules() if isinstance(m, nn.Linear))
    W = linear.weight.detach().cpu().double().numpy()
    b = linear.bias.detach().cpu().double().numpy()
    if isinstance(pre, Identity):
        return W, b
    if isinstance(pre, Standardizer):
        mu = pre.mean.astype(np.float64).ravel()
        s = pre.scale.astype(np.float64).ravel()
        return W / s, b - W @ (mu / s)
    raise InputError(f"unknown preprocessing {type(pre).__name__}: cannot compose it with the linear layer")


def parameter_relative_error(coef: Any, intercept: Any, true_coef: Any, true_intercept: Any) -> float:
    """||D̂ - D||_F / ||D||_F for D = [w_k - w_K, b_k - b_K] over the classes k < K (K the last).

    Softmax parameters are identifiable only up to one (v, c) added to every class, so this compares
    what the model's function determines: each class's parameters minus the reference class's.
    """

    def differences(W: Any, b: Any) -> np.ndarray:
        T = np.hstack([np.asarray(W, np.float64), np.asarray(b, np.float64)[:, None]])
        return T[:-1] - T[-1]

    D_hat, D = differences(coef, intercept), differences(true_coef, true_intercept)
    if D_hat.shape != D.shape:
        raise InputError(f"parameter shapes differ: {D_hat.shape} vs {D.shape}")
    return float(np.linalg.norm(D_hat - D) / np.linalg.norm(D))


# --------------------------------------------------------------------------- surrogates


@dataclass(frozen=True, eq=False)
class Surrogate:
    """An extracted model: zoo spec, torch module and the attacker's own preprocessing of raw features."""

    spec: ModelSpec
    model: nn.Module
    preprocessing: Standardizer | Identity
    history: list[dict[str, float]] = field(default_factory=list)

    def logits(self, X: Any) -> np.ndarray:
        from dpaudit.checkpoint import predict_logits

        return predict_logits(self.model, self.preprocessing.transform(np.asarray(X)))

    def linear_parameters(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Raw-space (W, b) when the surrogate is linear, else None."""
        if self.spec.kind not in LINEAR_KINDS:
            return None
        return _composed(self.spec, self.model, self.preprocessing)

    @classmethod
    def from_linear(cls, coef: np.ndarray, intercept: np.ndarray, input_shape: tuple[int, ...]) -> Surrogate:
        """A float64 ``logreg`` module holding raw-space parameters (no preprocessing)."""
        spec = LogRegSpec(input_shape=input_shape, n_classes=len(intercept))
        model = build_model(spec, seed=0, dtype=torch.float64)
        linear = next(m for m in model.modules() if isinstance(m, nn.Linear))
        with torch.no_grad():
            linear.weight.copy_(torch.as_tensor(coef, dtype=torch.float64))
            linear.bias.copy_(torch.as_tensor(intercept, dtype=torch.float64))
        model.eval()
        return cls(spec, model, Identity())


def soft_targets(answers: np.ndarray, mode: ApiMode) -> np.ndarray:
    """Training targets from API answers: class probabilities (n, k), float32; labels stay (n,) int64.

    Logits become softmax probabilities; rounded probabilities are clipped at 0 and renormalised (they
    need not sum to 1 after rounding); a rounded row of zeros (impossible for K ≤ 10^decimals) falls
    back to uniform.
    """
    if mode.kind == "labels":
        return np.asarray(answers, dtype=np.int64)
    A = np.asarray(answers, dtype=np.float64)
    if mode.kind == "logits":
        A = ApiMode("probs").answer(A)
    A = np.clip(A, 0.0, None)
    s = A.sum(axis=1, keepdims=True)
    A = np.where(s > 0, A / np.where(s > 0, s, 1.0), 1.0 / A.shape[1])
    return A.astype(np.float32)


def train_surrogate(
    X: np.ndarray, targets: np.ndarray, spec: ModelSpec, preprocessing: Standardizer | Identity, *, seed: int
) -> Surrogate:
    """Train a fresh ``spec`` model (initialised from ``seed``) on raw queries ``X`` and ``targets``
    (probabilities (n, k) for soft labels, or labels (n,)) with dpaudit's non-private Adam trainer, on
    one torch thread.

    The trainer's loss is ``F.cross_entropy(logits, y)``, which takes class-probability targets as well
    as class indices (torch >= 1.10), so soft labels need no loop of their own: the loss is
    -Σ_k p_k log q_k, the KL divergence to the target's answers up to the answers' entropy (Hinton et
    al. 2015, arXiv:1503.02531; Orekondy et al. 2019). Deterministic on CPU for a given seed.
    """
    from dpaudit.training.algorithms import get_trainer
    from dpaudit.training.config import PerfConfig, TrainConfig

    n = len(X)
    if n == 0:
        raise InputError("no queries to train the surrogate on")
    batch = min(SURROGATE_BATCH, n)
    steps = max(SURROGATE_MIN_STEPS, math.ceil(SURROGATE_EPOCHS * n / batch))
    config = TrainConfig(algo="adam", steps=steps, batch_size=batch, lr=SURROGATE_LR, seed=seed)
    model = build_model(spec, seed=seed)
    Xt = torch.as_tensor(np.array(preprocessing.transform(X)))
    y = torch.as_tensor(np.asarray(targets))
    with one_torch_thread():
        outcome = get_trainer("adam")(config, PerfConfig(device="cpu")).fit(model, Xt, y)
    return Surrogate(spec, outcome.model, preprocessing, outcome.history)


def _margin(logits: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 probability of the surrogate: small = uncertain."""
    p = ApiMode("probs").answer(logits)
    top2 = np.sort(p, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ExtractionResult:
    """The outcome of one extraction: plain numbers, JSON-ready through :meth:`to_dict` (the report
    reads it under ``attacks["extraction"]``).

    ``fidelity`` = 1 - R_test (argmax agreement with the target on the test split; None if empty),
    ``fidelity_uniform`` = 1 - R_unif (on :data:`N_UNIFORM` inputs uniform in the aux feature box),
    ``surrogate_accuracy`` / ``target_accuracy`` on the test split, ``parameter_relative_error`` of the
    parameter differences when target and surrogate are both linear (else None), ``queries`` the API's
    counter. ``curve``: one dict per point (queries, fidelity, fidelity_uniform, parameter_relative_error),
    the same attack refitted on the first ``queries`` of its query sequence.
    """

    method: str
    api: str
    budget: int
    queries: int
    fidelity: float | None
    fidelity_uniform: float
    surrogate_accuracy: float | None
    target_accuracy: float | None
    parameter_relative_error: float | None
    curve: tuple[dict[str, Any], ...] = ()
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"extraction-{self.method}"

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form (``attack`` and ``params`` as every attack entry of the report)."""
        return {
            "attack": self.name,
            "params": dict(self.params),
            "method": self.method,
            "api": self.api,
            "budget": self.budget,
            "queries": self.queries,
            "parameter_relative_error": self.parameter_relative_error,
            "fidelity": self.fidelity,
            "fidelity_uniform": self.fidelity_uniform,
            "surrogate_accuracy": self.surrogate_accuracy,
            "target_accuracy": self.target_accuracy,
            "curve": [dict(p) for p in self.curve],
        }


@dataclass(frozen=True, eq=False)
class Extraction:
    """An extraction's result and the extracted model."""

    result: ExtractionResult
    surrogate: Surrogate


class _Evaluator:
    """The evaluator's white-box view (never the attacker's): target predictions on the test split and
    on uniform inputs, computed once, against which every surrogate is scored."""

    def __init__(self, run: Any, dataset: Dataset, box: FeatureBox, *, seed: int) -> None:
        self.X_test = dataset.rows(run.splits.test)
        self.y_test = dataset.y[run.splits.test]
        self.X_unif = box.sample(N_UNIFORM, np.random.default_rng([seed, 1]), dataset.dtype)
        self.target_test = run.logits(self.X_test).argmax(axis=1) if len(self.X_test) else None
        self.target_unif = run.logits(self.X_unif).argmax(axis=1)
        self.true_params = composed_linear_parameters(run) if run.spec.kind in LINEAR_KINDS else None

    def target_accuracy(self) -> float | None:
        return None if self.target_test is None else float(np.mean(self.target_test == self.y_test))

    def score(self, surrogate: Surrogate, queries: int, params: tuple[np.ndarray, np.ndarray] | None) -> dict:
        fid = acc = None
        if self.target_test is not None:
            pred = surrogate.logits(self.X_test).argmax(axis=1)
            fid = float(np.mean(pred == self.target_test))
            acc = float(np.mean(pred == self.y_test))
        err = None
        if params is not None and self.true_params is not None:
            err = parameter_relative_error(*params, *self.true_params)
        unif = float(np.mean(surrogate.logits(self.X_unif).argmax(axis=1) == self.target_unif))
        return {
            "queries": queries,
            "fidelity": fid,
            "fidelity_uniform": unif,
            "surrogate_accuracy": acc,
            "parameter_relative_error": err,
        }


# --------------------------------------------------------------------------- the attacks


def minimum_budget(method: str, *, d: int, n_classes: int, adaptive: bool = False) -> int:
    """The fewest queries a method can work with: d+1 for equation solving (one system over d features
    plus the bias, shared by all K-1 log-ratios); for learning, one query per class (fewer cannot show
    the surrogate every class), and two per round when adaptive."""
    if method == "equations":
        return d + 1
    return max(n_classes, 2 * ADAPTIVE_ROUNDS if adaptive else 2)


def _minimum_text(method: str, minimum: int, adaptive: bool = False) -> str:
    if method == "equations":
        return f"equation solving: {minimum} queries (d+1 per system: d features plus the bias)"
    why = "one per class" + (", two per adaptive round" if adaptive else "")
    return f"learning-based extraction: {minimum} queries ({why})"


def _equation_point(
    evaluator: _Evaluator, solver: EquationSolver, queries: int, shape: tuple[int, ...]
) -> tuple[Surrogate, dict[str, Any]]:
    """The model a fitted equation solver gives, and its curve point (scored, with its equations)."""
    model = Surrogate.from_linear(solver.coef_, solver.intercept_, shape)
    point = evaluator.score(model, queries, (solver.coef_, solver.intercept_))
    return model, {**point, "n_equations": solver.n_equations_}


def _prefixes(budget: int, minimum: int, points: int) -> list[int]:
    """Query counts of the curve: budget / 2^j for j = points-1 .. 0, those >= minimum (always budget)."""
    sizes = {budget}
    # Past j = budget's bit length every budget >> j is 0: stop there (`--curve-points 2^63` looped for ever).
    for j in range(1, min(points, budget.bit_length() + 1)):
        n = budget >> j
        if n >= minimum:
            sizes.add(n)
    return sorted(sizes)


def _surrogate_curve(evaluator, X, A, mode, spec, pre, sizes, curve, seed) -> Surrogate | None:
    """Append to ``curve`` the point of a ``spec`` surrogate trained on the first n queries and answers, for each n in
    ``sizes``; the last surrogate (None without sizes)."""
    s = None
    for n in sizes:
        s = train_surrogate(X[:n], soft_targets(A[:n], mode), spec, pre, seed=seed)
        curve.append(evaluator.score(s, n, s.linear_parameters()))
    return s


def equation_attack(
    api: PredictionAPI, knowledge: AttackerKnowledge, *, budget: int, pool: str = "synthetic", seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Spend ``budget`` queries for equation solving: the d+1 queries of :func:`axis_design`, then
    ``budget - d - 1`` points from ``pool``. Returns the queries and the answers (solve them with
    :class:`EquationSolver`)."""
    d = math.prod(api.feature_shape)
    minimum = d + 1
    if budget < minimum:
        raise InputError(f"budget {budget} is below the minimum of {_minimum_text('equations', minimum)}")
    X = axis_design(knowledge.box, api.input_dtype)
    if budget > minimum:
        # Uniform queries span the widened box, so that features constant in the aux data vary as well.
        wide = AttackerKnowledge(knowledge.aux_X, knowledge.box.widened())
        source = QueryPool(pool, wide, rng=np.random.default_rng([seed, 0]), dtype=api.input_dtype)
        if source.capacity is not None and budget - minimum > source.capacity:
            raise InputError(
                f"the aux pool holds {source.capacity} records, fewer than the {budget - minimum} queries "
                f"beyond the first d+1; lower budget or use pool uniform or synthetic"
            )
        X = np.concatenate([X, source.draw(budget - minimum)])
    return X, api.query(X)


def learning_attack(
    api: PredictionAPI,
    knowledge: AttackerKnowledge,
    spec: ModelSpec,
    *,
    budget: int,
    pool: str = "synthetic",
    adaptive: bool = False,
    seed: int = 0,
    on_round: Any = None,
) -> tuple[Surrogate, np.ndarray, np.ndarray]:
    """Spend ``budget`` queries from ``pool`` and train a ``spec`` surrogate on the answers.

    Adaptive: :data:`ADAPTIVE_ROUNDS` rounds of equal size; the first draws at random, each later one
    queries the candidates (every unqueried aux record, or ``CANDIDATES_PER_QUERY`` fresh pool points
    per query) on which the surrogate trained so far has the smallest top-two margin. ``on_round``
    (surrogate, n_queries) is called after each round's training. Returns the final surrogate, the
    queries in the order they were sent, and the answers.
    """
    minimum = minimum_budget("learning", d=0, n_classes=api.n_classes, adaptive=adaptive)
    if budget < minimum:
        raise InputError(f"budget {budget} is below the minimum of {_minimum_text('learning', minimum, adaptive)}")
    source = QueryPool(pool, knowledge, rng=np.random.default_rng([seed, 0]), dtype=api.input_dtype)
    if source.capacity is not None and budget > source.capacity:
        raise InputError(
            f"the aux pool holds {source.capacity} records, fewer than budget {budget} (each record is "
            "queried once); lower budget or use pool synthetic or uniform"
        )
    pre = Standardizer.fit(knowledge.aux_X)  # the attacker's own scaling, from its own records
    mode = api.mode
    rounds = ADAPTIVE_ROUNDS if adaptive else 1
    sizes = [budget // rounds + (1 if r < budget % rounds else 0) for r in range(rounds)]
    Xs: list[np.ndarray] = []
    As: list[np.ndarray] = []
    surrogate: Surrogate | None = None
    for r, size in enumerate(sizes):
        if r == 0:
            Xr = source.draw(size)
        else:
            assert surrogate is not None
            cand, ids = source.candidates(CANDIDATES_PER_QUERY * size)
            pick = np.argsort(_margin(surrogate.logits(cand)), kind="stable")[:size]
            Xr = source.take(ids[pick]) if ids is not None else cand[pick]
        Xs.append(Xr)
        As.append(api.query(Xr))
        X, A = np.concatenate(Xs), np.concatenate(As)
        surrogate = train_surrogate(X, soft_targets(A, mode), spec, pre, seed=seed)
        if on_round is not None:
            on_round(surrogate, len(X))
    assert surrogate is not None
    return surrogate, np.concatenate(Xs), np.concatenate(As)


def surrogate_spec(kind: str, *, input_shape: tuple[int, ...], n_classes: int) -> ModelSpec:
    """The zoo spec of a surrogate (dpaudit defaults: mlp one hidden layer of 128 tanh units)."""
    check_choice(SURROGATES, surrogate=kind)
    return default_spec(kind, input_shape=input_shape, n_classes=n_classes)


def resolve_method(method: str, run: Any, mode: ApiMode, budget: int | None = None) -> str:
    """``auto`` is equation solving for a linear target behind an API with scores when the ``budget``
    (None: unknown) reaches its d+1 queries, else learning. Equation solving on a non-linear target, or
    behind a labels-only API, is refused."""
    check_choice(METHODS, method=method)
    linear = run.spec.kind in LINEAR_KINDS
    if method == "auto":
        # Below d+1 queries equations cannot be solved, and learning still can: auto picked equations there
        # and refused (`dpaudit report --extraction-budget 50` on a digits logreg (d+1 = 65) stopped the report).
        enough = budget is None or budget >= minimum_budget("equations", d=math.prod(run.spec.input_shape), n_classes=0)
        return "equations" if linear and mode.returns_scores and enough else "learning"
    if method == "equations":
        if not linear:
            raise InputError(
                f"equation solving needs a linear model (logreg), the target is {run.spec.kind}: its "
                "log-probability ratios are not linear in the features; use --method learning"
            )
        if not mode.returns_scores:
            raise InputError(
                "equation solving needs scores per class (api probs, rounded:K or logits); with api labels "
                "use --method learning"
            )
    return method


def extract(
    run: Any,
    *,
    budget: int,
    api: str | ApiMode = "probs",
    method: str = "auto",
    surrogate: str = "mlp",
    pool: str | None = None,
    adaptive: bool = False,
    seed: int = 0,
    curve_points: int = 4,
    dataset: Dataset | None = None,
    progress: Progress = NULL_PROGRESS,
) -> Extraction:
    """Extract the model of a loaded checkpoint (:class:`dpaudit.checkpoint.Run`) through its
    prediction API with at most ``budget`` queries, and evaluate the extracted model.

    ``api``: probs | rounded:K | labels | logits (:class:`attacks.query_api.ApiMode`). ``method``:
    equations (linear targets: exact from d+1 queries with full probabilities), learning (any target:
    a ``surrogate`` of kind logreg | mlp | cnn trained on the answers) or auto (equations when they
    apply: a logreg target, an API with scores, a budget of at least d+1; else learning, and learning
    when ``adaptive``; rounded answers, or probabilities that underflowed to 0, that leave the equations unsolvable:
    a ``surrogate`` trained on the same queries and answers, no further query, ``params["fallback"]`` saying why).
    ``pool``: where queries come from (aux | uniform | synthetic, the default: with rounded answers, uniform points in
    the box are so confidently classified that their probabilities round to 0 and 1 and give almost no
    equations). ``adaptive``: uncertainty-
    sampling rounds (learning only). ``curve_points``: points of the fidelity-vs-queries curve, the
    attack refitted on the first budget/2^j of its queries (0 or 1: the final point only). The
    attacker sees only the API and the aux split; the test split and uniform inputs evaluate.
    """
    run = as_run(run)
    mode = ApiMode.parse(api)
    budget = check_positive_int(budget=budget)
    # Each query holds a record and the API's answer (float64), kept for the surrogate's training.
    width = math.prod(run.spec.input_shape) + int(run.spec.n_classes)
    check_cost(Cost("extraction", budget, "queries", bytes_per_unit=4 * 8 * width))
    check_non_negative(seed=seed)
    seed = int(seed)
    if isinstance(curve_points, bool) or not isinstance(curve_points, int) or curve_points < 0:
        raise InputError(f"expected curve_points to be a non-negative integer, got {curve_points!r}")
    if run.meta["data"].get("kind") == "tokens":
        raise InputError(TOKEN_REFUSAL)
    chose = method == "auto" and not adaptive  # auto's equations may fall back to learning (below)
    method = resolve_method("learning" if adaptive and method == "auto" else method, run, mode, budget)
    pool = pool if pool is not None else "synthetic"
    check_choice(POOLS, pool=pool)
    check_choice(SURROGATES, surrogate=surrogate)  # also when equations need none: `--surrogate nan` ran, exit 0
    if adaptive and method != "learning":
        raise InputError("adaptive querying is for learning-based extraction (use --method learning)")
    shape = tuple(run.spec.input_shape)
    d = math.prod(shape)
    n_classes = run.spec.n_classes
    minimum = minimum_budget(method, d=d, n_classes=n_classes, adaptive=adaptive)
    if budget < minimum:
        raise InputError(f"budget {budget} is below the minimum of {_minimum_text(method, minimum, adaptive)}")
    spec = None
    if method == "learning":
        spec = surrogate_spec(surrogate, input_shape=shape, n_classes=n_classes)
    ds = dataset if dataset is not None else run.dataset()
    knowledge = AttackerKnowledge.from_records(ds.rows(run.splits.aux))
    target_api = PredictionAPI.from_run(run, mode, budget=budget)
    evaluator = _Evaluator(run, ds, knowledge.box, seed=seed)
    curve: list[dict[str, Any]] = []
    settings: dict[str, Any] = {"method": method, "api": str(mode), "pool": pool, "seed": seed}
    with progress.task(f"extraction ({method}, api {mode})", None):
        if method == "equations":
            X, A = equation_attack(target_api, knowledge, budget=budget, pool=pool, seed=seed)
            try:
                solver = EquationSolver(mode).fit(X, A)  # the attack itself: its refusal is the user's to see
            except InputError as e:
                # Rounded answers: a probability rounded to 0 gives no equation, so d+1 queries (auto's minimum)
                # rarely suffice; auto refused where learning works (`--api rounded:2 --budget 65` on a digits logreg:
                # "416 usable equations for 585 unknowns"). Auto then learns from the answers already bought. Full
                # probabilities that underflowed to 0 likewise (a digits logreg trained at --lr 1000: "642 usable
                # equations for 585 unknowns", too few for one class, at 1000 queries: the report stopped).
                underflowed = mode.kind == "probs" and bool(np.all(np.isfinite(A))) and bool(np.any(A == 0))
                if not (chose and (mode.kind == "rounded" or underflowed)):
                    raise
                method, spec = "learning", surrogate_spec(surrogate, input_shape=shape, n_classes=n_classes)
                settings |= {"method": method, "surrogate": spec.to_dict(), "adaptive": False,
                             "fallback": f"auto: equations unsolvable ({e}); surrogate trained on the "
                             "same queries (axis design, then pool)"}  # fmt: skip
                pre = Standardizer.fit(knowledge.aux_X)  # the attacker's own scaling, as learning_attack's
                least = minimum_budget("learning", d=d, n_classes=n_classes)
                model = _surrogate_curve(
                    evaluator, X, A, mode, spec, pre, _prefixes(budget, least, max(curve_points, 1)), curve, seed
                )
            else:
                unsolvable: list[int] = []
                *fewer, _ = _prefixes(budget, minimum, max(curve_points, 1))
                for n in fewer:
                    try:  # with rounded answers a prefix can be short of usable equations where the budget is not
                        solver_n = EquationSolver(mode).fit(X[:n], A[:n])
                    except InputError:  # a curve point missing, not the attack failing (it did abort the attack)
                        unsolvable.append(n)
                        continue
                    curve.append(_equation_point(evaluator, solver_n, n, shape)[1])
                model, point = _equation_point(evaluator, solver, budget, shape)
                curve.append(point)
                settings |= {"surrogate": model.spec.to_dict(), "n_equations": solver.n_equations_,
                             "design": "axis (d+1), then pool"}  # fmt: skip
                if unsolvable:
                    settings["curve_unsolvable"] = unsolvable
            final = curve[-1]
        else:
            assert spec is not None
            settings |= {"surrogate": spec.to_dict(), "adaptive": adaptive}
            if adaptive:
                settings["rounds"] = ADAPTIVE_ROUNDS

                def on_round(s: Surrogate, n: int) -> None:
                    curve.append(evaluator.score(s, n, s.linear_parameters()))

                model, X, A = learning_attack(target_api, knowledge, spec, budget=budget, pool=pool,
                                              adaptive=True, seed=seed, on_round=on_round)  # fmt: skip
            else:
                model, X, A = learning_attack(target_api, knowledge, spec, budget=budget, pool=pool, seed=seed)
                fewer = _prefixes(budget, minimum, max(curve_points, 1))[:-1]
                _surrogate_curve(evaluator, X, A, mode, spec, model.preprocessing, fewer, curve, seed)
                curve.append(evaluator.score(model, budget, model.linear_parameters()))
            final = curve[-1]
    if target_api.queries_used != len(X):  # the counter is the ground truth of what was spent
        raise AssertionError(f"query accounting: API counted {target_api.queries_used}, attack sent {len(X)}")
    result = ExtractionResult(
        method=method,
        api=str(mode),
        budget=budget,
        queries=target_api.queries_used,
        fidelity=final["fidelity"],
        fidelity_uniform=final["fidelity_uniform"],
        surrogate_accuracy=final["surrogate_accuracy"],
        target_accuracy=evaluator.target_accuracy(),
        parameter_relative_error=final["parameter_relative_error"],
        curve=tuple(curve),
        params={**settings, "n_test": len(evaluator.X_test), "n_uniform": N_UNIFORM},
    )
    return Extraction(result, model)


def save_surrogate(
    out: Path | str, run: Any, extraction: Extraction, *, dataset: Dataset | None = None, force: bool = False
) -> Path:
    """Save the extracted model as an ordinary run directory (safetensors + JSON + split.npz) with the
    target's data description and splits, so that it can be attacked in turn (e.g. ``dpaudit attack
    mia``). ``training.algo`` is ``"extracted"`` and ``training.extraction`` records the settings and
    results. No privacy claim is recorded for the surrogate itself; ``target_privacy`` keeps the
    target's (by post-processing it also covers the surrogate, which is a function of the target's
    answers and of public aux data only)."""
    from dpaudit.checkpoint import SCHEMA_VERSION, save_run, versions
    from dpaudit.training.base import TrainOutcome
    from dpaudit.training.run import FittedModel, metrics_for

    out = Path(out)
    check_output_dir(out, force=force, inputs=[run.path])
    ds = dataset if dataset is not None else run.dataset()
    s = extraction.surrogate
    fitted = FittedModel(TrainOutcome(model=s.model, privacy=None), s.preprocessing, torch.device("cpu"))
    pre = {**s.preprocessing.to_dict(), "fitted_on": "none" if isinstance(s.preprocessing, Identity) else "aux"}
    r = extraction.result
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": s.spec.to_dict(),
        "data": run.meta["data"],
        "split": run.meta["split"],
        "preprocessing": pre,
        "training": {
            "algo": "extracted",
            "extraction": {
                **r.to_dict(),
                "target": str(run.path),
                "target_model": run.spec.to_dict(),
                "target_privacy": run.privacy,
            },
            "history": s.history,
        },
        "privacy": None,
        "metrics": metrics_for(fitted, ds, run.splits),
        "seed": r.params.get("seed"),
        "canaries": None,
        "versions": versions(),
    }
    return save_run(out, model=s.model, meta=meta, splits=run.splits, force=force, inputs=[run.path])


def extract_checkpoint(
    checkpoint: Path,
    *,
    budget: int,
    api: str = "probs",
    method: str = "auto",
    surrogate: str = "mlp",
    pool: str = "synthetic",
    adaptive: bool = False,
    curve_points: int = 4,
    out: Path | None = None,
    seed: int = 0,
    force: bool = False,
    progress: Progress = NULL_PROGRESS,
    notify: Callable[[str], None] = lambda message: None,
):
    """``dpaudit attack extract``: load the run at ``checkpoint``, extract its model through the API mode
    ``api`` (parsed, like ``out`` refused unless ``force``, before any work) with :func:`extract`, and
    save the surrogate as a run directory at ``out`` when given. Returns the extraction."""
    from dpaudit.checkpoint import load_run

    mode = ApiMode.parse(api)  # bad modes fail before the checkpoint is loaded
    if out is not None:
        check_output_dir(out, force=force, inputs=[checkpoint])  # before the work
    run = load_run(checkpoint)
    dataset = run.dataset()
    notify(f"extracting {checkpoint} through api {mode} with at most {budget} queries …")
    extraction = extract(
        run, budget=budget, api=mode, method=method, surrogate=surrogate, pool=pool, adaptive=adaptive, seed=seed,
        curve_points=curve_points, dataset=dataset, progress=progress,
    )  # fmt: skip
    if out is not None:
        save_surrogate(out, run, extraction, dataset=dataset, force=force)
        notify(f"extracted model written to {out}")
    return extraction
