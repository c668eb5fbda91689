"""Output and objective perturbation for L2-regularised logistic regression (private convex ERM).

Both learners solve J(w) = (1/N) Σ_i ℓ(s_i ⟨w, x_i⟩) + (λ/2)‖w‖², ℓ(z) = log(1 + e^{−z}), s_i ∈ {−1, +1}
(Chaudhuri, Monteleoni & Sarwate 2011, "Differentially private empirical risk minimization", JMLR 12,
Eq. (2)), exactly (L-BFGS to a tight tolerance, then Newton steps to machine precision), and release
the zoo's ``logreg`` model with the learned weights.

* ``outpert`` — output perturbation (ibid., Alg. 1): w* + η. Under replace-one neighbours the minimiser
  moves by at most 2/(Nλ) in L2 (ibid., Cor. 8, with a 1-Lipschitz loss and ‖x‖ ≤ 1), the solver's point
  by at most Δ = 2/(Nλ) + 2τ/λ (τ: its gradient-norm tolerance, :func:`output_sensitivity`). η has density
  ∝ exp(−ε‖η‖/Δ) — the "norm" mechanism, direction uniform on the sphere and ‖η‖ ~ Gamma(d, Δ/ε) —
  which is ε-DP (pure); ``outpert-gaussian`` adds N(0, σ²I) with σ calibrated for (ε, δ).
* ``objpert`` — objective perturbation (ibid., Alg. 2; Kifer, Smith & Thakurta 2012, COLT): minimise
  J(w) + ⟨b, w⟩/N + (Δ'/2)‖w‖² with ‖b‖ ~ Gamma(d, 2/ε'), uniform direction; ε-DP (ibid., Thm 9) for a
  loss with |ℓ''| ≤ c (logistic: c = 1/4), for the exact minimiser (its proof inverts b ↦ w). The solver's
  point is within τ/(λ + Δ') of it; the theorem does not cover that difference, and the claim says so.

Features. The analyses need ‖x‖ ≤ 1. Each record (flattened, with a constant 1 appended for the
intercept) is divided by √(d + 1) and then projected onto the unit ball: x ↦ x / max(1, ‖x‖). Both steps
are fixed functions of the record alone (the scale depends only on the dimension), so they are
data-independent preprocessing that the claim does not need to cover; a scale fitted on the private
data would not be (fit any scaler on public data: ``train_run`` standardises with the public aux split).
The projection multiplies a record by a positive number, so the released linear model (weights divided
by √(d + 1), no projection at prediction time) predicts the same class for every record.

Classes. Binary data gives one classifier (logits [0, ⟨w, x⟩]). K > 2 classes give K one-vs-rest
classifiers on the same records: pure ε splits as ε/K per classifier (basic composition, Dwork & Roth
2014, Thm 3.16); Gaussian noise is one composed Gaussian (SelfComposed(Gaussian, K)) calibrated as a
whole. Either way the recorded claim covers the whole weight matrix.

Neighbours are replace-one (Chaudhuri et al. 2011, §2: datasets differing in one entry). In the event
convention of :mod:`dpaudit.events` a record's contribution bound is C = Δ/2 = 1/(Nλ) and the accountant
applies the factor 2 for replace-one, so a Gaussian event's noise multiplier is σ/C.
"""

from __future__ import annotations

import functools
import math
import secrets
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from dpaudit import numfmt
from dpaudit.errors import InputError
from dpaudit.events import EpsilonDelta, Gaussian, SelfComposed
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.base import Trainer, TrainOutcome
from dpaudit.validation import check_in_interval, check_positive

LOGISTIC_CURVATURE = 0.25  # sup |ℓ''(z)| of the logistic loss (Chaudhuri et al. 2011, §3.4.1: c = 1/4)
SOLVER_TOL = 1e-10  # gradient norm the Newton steps of :func:`solve_logistic` aim for
# Every minimiser solve_logistic returns has a computed gradient norm ≤ 1e3 · SOLVER_TOL and a bound on that
# computation's float64 error ≤ 1e3 · SOLVER_TOL (its acceptance test): their sum bounds the true gradient norm.
SOLVER_GRADIENT_BOUND = 2e3 * SOLVER_TOL

FLOAT_NOTE = (
    " The analysis is of the real-valued mechanism; the output is rounded to float32 (the released precision) "
    "against floating-point attacks on the noise (Mironov 2012), a mitigation without a formal float guarantee."
)
OUTPERT_ANALYSIS = (
    "Output perturbation (Chaudhuri, Monteleoni & Sarwate 2011, JMLR, Alg. 1): the exact minimiser of the "
    "L2-regularised logistic loss moves by at most 2/(N lambda) when one record is replaced (Cor. 8, features "
    "projected onto the unit ball); the solver's point is within tau/lambda of it (gradient norm <= tau = "
    f"{SOLVER_GRADIENT_BOUND:g}, lambda-strong convexity), so the sensitivity is 2/(N lambda) + 2 tau/lambda; {{noise}}"
    + FLOAT_NOTE
)
OBJPERT_ANALYSIS = (
    "Objective perturbation (Chaudhuri, Monteleoni & Sarwate 2011, JMLR, Alg. 2, Thm 9; Kifer, Smith & "
    "Thakurta 2012): a random linear term <b, w>/N with ||b|| ~ Gamma(d, 2/eps') in the objective; "
    "epsilon-DP under replace-one neighbours for the logistic loss (|l''| <= 1/4, ||x|| <= 1) and the exact "
    f"minimiser. The released point is the solver's (gradient norm <= {SOLVER_GRADIENT_BOUND:g}, so within that "
    "over lambda + Delta' of the exact one); the theorem does not cover that difference." + FLOAT_NOTE
)


# --------------------------------------------------------------------------------------------
# Features, labels and the weights of the released model
# --------------------------------------------------------------------------------------------


def unit_ball_features(X: np.ndarray) -> np.ndarray:
    """Records flattened, a constant 1 appended, divided by √(d+1), projected onto the unit ball.

    A fixed map of each record alone (see the module docstring), so ‖x‖ ≤ 1 holds for every record as
    the sensitivity analyses require (Chaudhuri et al. 2011, §2: ‖x_i‖ ≤ 1).
    """
    X = np.asarray(X, dtype=np.float64).reshape(len(X), -1)
    if not np.all(np.isfinite(X)):
        raise InputError("the features contain NaN or inf: they cannot be scaled to the unit ball")
    Z = np.concatenate([X, np.ones((len(X), 1))], axis=1) / math.sqrt(X.shape[1] + 1)
    norms = np.linalg.norm(Z, axis=1, keepdims=True)
    return Z / np.maximum(1.0, norms)


def linear_weights(W: np.ndarray, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) of ``nn.Linear`` from classifiers W (K × (d+1)) on :func:`unit_ball_features`."""
    W = np.atleast_2d(W) / math.sqrt(n_features + 1)
    return W[:, :n_features], W[:, n_features]


def load_logreg(model: nn.Module, W: np.ndarray, n_classes: int) -> None:
    """Write classifiers into the zoo's logreg model (Flatten, Linear). Binary: logits [0, ⟨w, x⟩]."""
    linear = logreg_linear(model)
    weight, bias = linear_weights(W, linear.in_features)
    if n_classes == 2 and len(weight) == 1:
        weight = np.concatenate([np.zeros_like(weight), weight])
        bias = np.concatenate([np.zeros_like(bias), bias])
    with torch.no_grad():
        linear.weight.copy_(torch.as_tensor(weight, dtype=linear.weight.dtype))
        linear.bias.copy_(torch.as_tensor(bias, dtype=linear.bias.dtype))


def logreg_linear(model: nn.Module) -> nn.Linear:
    """The Linear layer of the zoo's logreg model; other models are refused (the analyses are for it)."""
    layers = list(model.children()) if isinstance(model, nn.Sequential) else []
    if len(layers) != 2 or not isinstance(layers[0], nn.Flatten) or not isinstance(layers[1], nn.Linear):
        raise InputError(
            "the convex learners (outpert, objpert, dpagd) train the zoo's logreg model: use --model logreg"
        )
    if layers[1].bias is None:
        raise InputError("the logreg model needs a bias")
    return layers[1]


def class_signs(y: np.ndarray, n_classes: int) -> np.ndarray:
    """±1 labels of each classifier: one column for binary data, K one-vs-rest columns otherwise."""
    y = np.asarray(y, dtype=np.int64)
    if n_classes == 2:
        return (2.0 * y - 1.0)[:, None]
    return np.where(y[:, None] == np.arange(n_classes)[None, :], 1.0, -1.0)


# --------------------------------------------------------------------------------------------
# Exact L2-regularised logistic regression
# --------------------------------------------------------------------------------------------


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # = 1/(1 + e^{−z}), without overflow


def logistic_objective(w, Z, s, lam, linear=None, extra_l2=0.0):
    """(1/N) Σ log(1 + e^{−s⟨w,x⟩}) + ((λ + extra_l2)/2)‖w‖² + ⟨linear, w⟩/N, and its gradient."""
    n = len(Z)
    m = s * (Z @ w)
    value = float(np.logaddexp(0.0, -m).mean()) + 0.5 * (lam + extra_l2) * float(w @ w)
    grad = -(Z.T @ (s * _sigmoid(-m))) / n + (lam + extra_l2) * w
    if linear is not None:
        value += float(linear @ w) / n
        grad = grad + linear / n
    return value, grad


def solve_logistic(Z, s, lam, *, linear=None, extra_l2=0.0, tol=SOLVER_TOL) -> np.ndarray:
    """The exact minimiser of :func:`logistic_objective` (strongly convex, so unique).

    Damped Newton steps with the exact Hessian (1/N) Zᵀ diag(σ(m)σ(−m)) Z + (λ + extra_l2) I until the
    gradient norm is below ``tol`` (quadratic convergence near the optimum); above 200 features, L-BFGS
    (scipy, tight tolerance) first. The sensitivity bounds hold for the exact minimiser only (Chaudhuri
    et al. 2011, Cor. 8 and Thm 9), so a solve that does not converge raises.
    """
    Z, s = np.asarray(Z, np.float64), np.asarray(s, np.float64)
    reg = lam + extra_l2
    w = np.zeros(Z.shape[1])
    if Z.shape[1] > 200:
        from scipy.optimize import minimize

        res = minimize(
            logistic_objective, w, args=(Z, s, lam, linear, extra_l2), jac=True, method="L-BFGS-B",
            options={"maxiter": 10_000, "gtol": 1e-10, "ftol": 1e-15},
        )  # fmt: skip
        w = res.x
    n, d = Z.shape
    lin = 0.0 if linear is None else float(np.linalg.norm(linear)) / n

    def rounding(w: np.ndarray) -> float:
        # A generous bound on the float64 error of the computed gradient: n summed terms of norm ≤ 1, the margins
        # s⟨w, x⟩ (error ~ d‖w‖ ulp, through σ' ≤ 1/4), reg·w and linear/N. A computed ‖g‖ is trusted only when this
        # is small: it is part of the true-gradient bound 2e3·tol = SOLVER_GRADIENT_BOUND behind the sensitivity.
        return 8 * np.finfo(np.float64).eps * (n + (d + reg) * float(np.linalg.norm(w)) + lin)

    for _ in range(100):
        value, g = logistic_objective(w, Z, s, lam, linear, extra_l2)
        if np.linalg.norm(g) <= tol and rounding(w) <= 1e3 * tol:
            return w
        m = s * (Z @ w)
        H = (Z.T * (_sigmoid(m) * _sigmoid(-m))) @ Z / len(Z) + reg * np.eye(Z.shape[1])
        step = np.linalg.solve(H, g)
        # Backtracking on the objective; where a step's decrease is below the float64 resolution of the objective
        # (|J| ~ 700 with a large objpert term: ulp ~ 1e-13), a step that lowers the gradient norm is taken (a full
        # Newton step near the optimum): comparing values alone stalled at ||g|| ~ 2e-7 and refused the run.
        resolution = 1e-15 + 64 * np.finfo(np.float64).eps * abs(value)
        g_norm, t = np.linalg.norm(g), 1.0
        while t > 1e-10:
            new_value, new_g = logistic_objective(w - t * step, Z, s, lam, linear, extra_l2)
            if new_value <= value + 1e-15 or (new_value <= value + resolution and np.linalg.norm(new_g) < g_norm):
                break
            t *= 0.5
        w = w - t * step
    value, g = logistic_objective(w, Z, s, lam, linear, extra_l2)
    if np.linalg.norm(g) > 1e3 * tol or rounding(w) > 1e3 * tol:  # the acceptance test behind SOLVER_GRADIENT_BOUND
        # Reachable from the CLI: objpert at a tiny ε draws ‖b‖ ~ Gamma(d, 2/ε'), so ‖b‖/N ≫ 1 and the
        # gradient (a difference of terms of that size) cannot be resolved to ``tol`` in float64.
        cause = (
            f"objective perturbation's noise term has norm/N = {np.linalg.norm(linear) / len(Z):.3g}, too large "
            "for float64: raise --epsilon (the noise norm scales as 1/epsilon) or use more records"
            if linear is not None
            else "raise --l2"
        )
        raise InputError(
            f"the exact logistic minimiser could not be computed (gradient norm {np.linalg.norm(g):.3g} after "
            f"100 Newton steps; the privacy proof needs the exact minimiser): {cause}"
        )
    return w


# --------------------------------------------------------------------------------------------
# Noise
# --------------------------------------------------------------------------------------------


def output_sensitivity(n: int, lam: float) -> float:
    """Δ = 2/(Nλ) + 2τ/λ: L2 sensitivity of the *computed* minimiser under replace-one neighbours.

    2/(Nλ) bounds the exact minimisers' distance, for a 1-Lipschitz loss, ‖x‖ ≤ 1 and the regulariser
    (λ/2)‖w‖² (Chaudhuri, Monteleoni & Sarwate 2011, Cor. 8). The released point ŵ is the solver's, with
    ‖∇J(ŵ)‖ ≤ τ = :data:`SOLVER_GRADIENT_BOUND`; J is λ-strongly convex, so ⟨∇J(ŵ) − ∇J(w*), ŵ − w*⟩ ≥ λ‖ŵ − w*‖²
    gives ‖ŵ − w*‖ ≤ τ/λ (Nesterov 2004, Introductory Lectures on Convex Optimization, Thm 2.1.9), on each of
    the two datasets. (The added term is 2τN relative to the first: ~1e-3 at N = 2500.)"""
    return 2.0 / (n * lam) + 2.0 * SOLVER_GRADIENT_BOUND / lam


def release_precision(W: np.ndarray) -> np.ndarray:
    """The learners' output rounded to float32, the precision of the released model (as float64 values).

    The analyses are of real-valued mechanisms. In float64, w* + η keeps low-order bits that depend on w*: on a
    d = 1 replace-one pair at ε = 8 (benchmarks/RESULTS.md, "convex learners' ... claims"), the set of outputs
    whose ‖w − w*_out‖ − ‖w − w*_in‖ rounds to one particular float held 15,122 of 100,000 runs on one side
    and 0 of 100,000 on the other (ε ≥ 8.30 at 95 %; Mironov 2012's floating-point attack). Rounding to float32,
    2^29 times coarser, a post-processing, erased that set on both sides. It mitigates the attack without a
    formal floating-point guarantee: a float64 sum within one float64 ulp of a float32 rounding boundary can
    still round by its low bits.
    """
    with np.errstate(over="ignore"):  # inf for |w| > 3.4e38: the trainer refuses non-finite weights with the cause
        return np.asarray(W, dtype=np.float64).astype(np.float32).astype(np.float64)


def norm_mechanism_noise(d: int, scale: float, rng: np.random.Generator) -> np.ndarray:
    """A draw with density ∝ exp(−‖η‖/scale) on R^d: direction uniform on the sphere (a normalised
    Gaussian), norm ~ Gamma(d, scale) (Chaudhuri et al. 2011, Alg. 1: the density ∝ e^{−β‖b‖} has
    ‖b‖ ~ Gamma(d, 1/β) by the polar change of variables, area element ∝ r^{d−1}).
    """
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    return direction * rng.gamma(d, scale)


def gaussian_outpert_sigma(epsilon: float, delta: float, n_classifiers: int, contribution: float) -> float:
    """σ of the Gaussian noise on each of K classifiers: the smallest whose composed event
    SelfComposed(Gaussian(σ/C), K) meets (ε, δ) under replace-one neighbours (calibrated with the
    accounting layer, PLD accountant, verified to meet the target)."""
    return _gaussian_multiplier(float(epsilon), float(delta), int(n_classifiers)) * contribution


@functools.lru_cache(maxsize=256)
def _gaussian_multiplier(epsilon: float, delta: float, n_classifiers: int) -> float:
    from dpaudit.accounting import calibrate_noise_multiplier

    return float(
        calibrate_noise_multiplier(
            target_epsilon=epsilon,
            delta=delta,
            make_event=lambda m: SelfComposed(Gaussian(m), n_classifiers),
            accountant="pld",
            neighbouring="replace_one",
        )
    )


def objpert_parameters(epsilon: float, n: int, lam: float, c: float = LOGISTIC_CURVATURE) -> tuple[float, float]:
    """(ε', Δ') of objective perturbation (Chaudhuri, Monteleoni & Sarwate 2011, Alg. 2, steps 1–2):

    ε' = ε − log(1 + 2c/(Nλ) + c²/(N²λ²)); if ε' > 0 then Δ' = 0, else Δ' = c/(N(e^{ε/4} − 1)) − λ and
    ε' = ε/2. The noise b has density ∝ exp(−(ε'/2)‖b‖), i.e. ‖b‖ ~ Gamma(d, 2/ε').
    """
    eps_p = epsilon - math.log1p(2.0 * c / (n * lam) + c * c / (n * lam) ** 2)
    if eps_p > 0:
        return eps_p, 0.0
    return epsilon / 2.0, c / (n * math.expm1(epsilon / 4.0)) - lam


# --------------------------------------------------------------------------------------------
# Learners on arrays (used by the trainers, the tests and the direct audits)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvexLearner:
    """One private convex learner on ±1 labels, as a function of (Z, S, rng): fit → weights (K × d).

    ``algo``: "outpert" (norm mechanism), "outpert-gaussian" or "objpert"; ``epsilon`` (and ``delta``
    for the Gaussian) is the whole claim over the K = S.shape[1] classifiers.
    The mechanism's two ingredients are methods, :meth:`sensitivity` and :meth:`norm_noise`, so that a
    test or an audit plants a mistake by subclassing (the 1/(Nλ) sensitivity, a Gamma(1, ·) norm).
    """

    algo: str
    lam: float
    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        if self.algo not in ("outpert", "outpert-gaussian", "objpert"):
            raise InputError(f"unknown convex learner {self.algo!r}")
        if not self.lam > 0:
            raise InputError(
                f"expected the L2 coefficient lambda > 0 (--l2), got {self.lam}: the sensitivity is 2/(N lambda)"
            )
        check_positive(epsilon=self.epsilon)
        if self.algo == "outpert-gaussian":
            check_in_interval(0.0, 1.0, delta=self.delta)

    def fit(self, Z: np.ndarray, S: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n, d = Z.shape
        k = S.shape[1]
        W = np.empty((k, d))
        if self.algo == "objpert":
            eps_p, extra = objpert_parameters(self.epsilon / k, n, self.lam)
            for j in range(k):
                b = self.norm_noise(d, 2.0 / eps_p, rng)
                W[j] = solve_logistic(Z, S[:, j], self.lam, linear=b, extra_l2=extra)
            return release_precision(W)
        for j in range(k):
            W[j] = solve_logistic(Z, S[:, j], self.lam)
        return self.perturb(W, n, rng)

    def sensitivity(self, n: int) -> float:
        """Δ of the minimiser over ``n`` records (:func:`output_sensitivity`)."""
        return output_sensitivity(n, self.lam)

    def norm_noise(self, d: int, scale: float, rng: np.random.Generator) -> np.ndarray:
        """One draw of the norm mechanism's noise (:func:`norm_mechanism_noise`)."""
        return norm_mechanism_noise(d, scale, rng)

    def perturb(self, W: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """Output perturbation of the exact minimisers W (K × d) of N records: the mechanism's only
        randomness, so a multi-run audit may solve once per dataset and call this per run."""
        if self.algo == "objpert":
            raise InputError("objpert perturbs the objective, not the output")
        k, d = W.shape
        delta_w = self.sensitivity(n)
        if self.algo == "outpert":
            scale = delta_w / (self.epsilon / k)
            return release_precision(W + np.stack([self.norm_noise(d, scale, rng) for _ in range(k)]))
        sigma = gaussian_outpert_sigma(self.epsilon, self.delta, k, delta_w / 2.0)
        return release_precision(W + sigma * rng.standard_normal((k, d)))

    def claim(self, n: int, d: int, k: int) -> dict[str, Any]:
        """The JSON-ready claim of training on N records in d features (after scaling) with K classifiers."""
        base = {
            "neighbouring": "replace_one",
            "dataset_size": int(n),
            "l2": self.lam,
            "classifiers": int(k),
            "features_scaled": "x -> [x, 1]/sqrt(d+1), projected onto the unit ball (data-independent)",
        }
        if self.algo == "outpert-gaussian":
            from dpaudit.accounting import epsilon_for

            contribution = output_sensitivity(n, self.lam) / 2.0
            sigma = gaussian_outpert_sigma(self.epsilon, self.delta, k, contribution)
            event = SelfComposed(Gaussian(sigma / contribution), k)
            eps = float(epsilon_for(event, self.delta, "pld", neighbouring="replace_one"))
            noise = f"Gaussian noise sigma = {sigma:.6g} per coordinate, the {k} classifier(s) composed."
            return {
                **base, "epsilon": eps, "delta": self.delta, "accountant": "pld", "event": event.to_dict(),
                "mechanism": "gaussian", "sensitivity": 2.0 * contribution, "noise_std": sigma,
                "analysis": OUTPERT_ANALYSIS.format(noise=noise),
            }  # fmt: skip
        per = self.epsilon / k
        event = EpsilonDelta(per, 0.0) if k == 1 else SelfComposed(EpsilonDelta(per, 0.0), k)
        out = {
            **base, "epsilon": self.epsilon, "delta": 0.0, "accountant": "pure-dp (basic composition)",
            "event": event.to_dict(),
        }  # fmt: skip
        if self.algo == "outpert":
            sens = output_sensitivity(n, self.lam)
            noise = (
                f"noise density proportional to exp(-eps ||eta|| / Delta) (norm ~ Gamma(d, Delta/eps), uniform "
                f"direction), epsilon-DP with eps = {numfmt.upper(per)} per classifier, {k} composed."
            )
            return {
                **out, "mechanism": "norm (laplace-type)", "sensitivity": sens,
                "noise_scale": sens / per, "analysis": OUTPERT_ANALYSIS.format(noise=noise),
            }  # fmt: skip
        eps_p, extra = objpert_parameters(per, n, self.lam)
        return {
            **out,
            "mechanism": "objective",
            "epsilon_prime": eps_p,
            "extra_l2": extra,
            "analysis": OBJPERT_ANALYSIS,
        }


def noise_rng(seed: int, secure: bool) -> np.random.Generator:
    """The generator of the privacy noise: seeded (reproducible) or, when ``secure``, from 128 bits of
    ``secrets``. numpy's PCG64 is not a cryptographic generator and floating-point attacks on noise
    sampling (Mironov 2012) are not addressed."""
    return np.random.default_rng(secrets.randbits(128) if secure else [int(seed), 0x434F4E56])


# --------------------------------------------------------------------------------------------
# Trainers
# --------------------------------------------------------------------------------------------


def _arrays(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, np.ndarray, int]:
    linear = logreg_linear(model)
    n_classes = linear.out_features
    X_np = X.detach().cpu().numpy().reshape(len(X), -1)
    y_np = y.detach().cpu().numpy().astype(np.int64)
    if X_np.shape[1] != linear.in_features:
        raise InputError(f"the logreg model takes {linear.in_features} features, the data has {X_np.shape[1]}")
    if len(y_np) == 0:
        raise InputError("the training set is empty")
    if y_np.min() < 0 or y_np.max() >= n_classes:
        raise InputError(f"labels must be in 0..{n_classes - 1}")
    return X_np, y_np, n_classes


def check_epsilon_only(trainer: Trainer) -> tuple[float, float]:
    """(ε, δ) of a convex trainer's config: ``--epsilon`` is the claim; ``--noise-multiplier`` is refused."""
    dp = trainer.config.dp
    if dp.target_epsilon is None:
        raise InputError(f"--algo {trainer.name} is calibrated from --epsilon (not --noise-multiplier)")
    return float(dp.target_epsilon), float(dp.delta)


def no_builtin_audit(trainer: Trainer, n: int):
    """The built-in multi-run audit recipe path is DP-SGD's (it asks for ``setting_for``): refused with a
    pointer to the plug-in path, instead of an internal error."""
    raise InputError(
        f"the built-in multi-run audit trains DP-SGD recipes; audit --algo {trainer.name} with the plug-in path "
        "(dpaudit.training.algorithms.ConvexPluginTrainer as audit_training's trainer=, with its claim and "
        "neighbouring)"
    )


class ConvexTrainer(Trainer):
    """A trainer for :class:`ConvexLearner`: λ is ``config.weight_decay`` (``--l2``), ε and δ come from
    ``config.dp`` (``--epsilon``, ``--delta``); noise from ``config.seed`` (or ``secure_noise``)."""

    private = True
    batched = False  # one exact solve on all N records
    learner: ClassVar[str]
    setting_for = no_builtin_audit

    def make_learner(self) -> ConvexLearner:
        eps, delta = check_epsilon_only(self)
        return ConvexLearner(self.learner, float(self.config.weight_decay), eps, delta)

    def fit(
        self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, progress: Progress = NULL_PROGRESS
    ) -> TrainOutcome:
        learner = self.make_learner()
        X_np, y_np, n_classes = _arrays(model, X, y)
        Z, S = unit_ball_features(X_np), class_signs(y_np, n_classes)
        claim = learner.claim(len(Z), Z.shape[1], S.shape[1])
        with progress.task(f"train {self.name}", 1) as advance:
            W = learner.fit(Z, S, noise_rng(self.config.seed + 2, self.config.dp.secure_noise))
            advance(1)
        load_logreg(model, W, n_classes)
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):  # --l2 1e-300 saved inf weights
            raise InputError(
                f"--l2 {learner.lam:g} is too small: the weights are not finite (the minimiser's sensitivity "
                f"2/(N lambda) is {learner.sensitivity(len(Z)):.3g}); raise --l2"
            )
        model.eval()
        return TrainOutcome(model=model, privacy=claim, history=[{"classifiers": S.shape[1]}])


class OutputPerturbationTrainer(ConvexTrainer):
    name = "outpert"
    learner = "outpert"


class GaussianOutputPerturbationTrainer(ConvexTrainer):
    name = "outpert-gaussian"
    learner = "outpert-gaussian"


class ObjectivePerturbationTrainer(ConvexTrainer):
    name = "objpert"
    learner = "objpert"


MECHANISMS = ("laplace", "gaussian")
OBJECTIVES = ("logistic", "huber")


def resolve_algo(algo: str, mechanism: str | None, objective: str | None) -> str:
    """The registered trainer for ``--algo`` with ``--mechanism`` / ``--objective`` (CLI helper)."""
    if mechanism is not None:
        if mechanism not in MECHANISMS:
            raise InputError(f"unknown --mechanism {mechanism!r}; valid: {', '.join(MECHANISMS)}")
        if algo not in ("outpert", "objpert"):
            raise InputError(f"--mechanism applies to --algo outpert or objpert, not {algo!r}")
        if algo == "objpert" and mechanism == "gaussian":
            raise InputError("objpert is implemented with its pure-epsilon (laplace-type) noise only")
        if mechanism == "gaussian":
            return "outpert-gaussian"
    if objective is not None:
        if objective not in OBJECTIVES:
            raise InputError(f"unknown --objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
        if algo != "dpagd":
            raise InputError(f"--objective applies to --algo dpagd, not {algo!r}")
        if objective == "huber":
            return "dpagd-huber"
    return algo


CONVEX_ALGOS = ("outpert", "outpert-gaussian", "objpert", "dpagd", "dpagd-huber")


def model_for(algo: str, model: str | None) -> str:
    """The zoo model ``--algo`` trains for ``--model`` (None: not given): the convex learners train logreg only
    (their analyses are for it, :func:`logreg_linear`), so that is their default and any other kind is refused;
    every other algorithm defaults to mlp. ``train --algo dpagd`` without ``--model logreg`` was refused while
    --help showed the default [mlp]."""
    if algo not in CONVEX_ALGOS:
        return "mlp" if model is None else model
    if model not in (None, "logreg"):
        raise InputError(
            f"--algo {algo} trains the zoo's logreg model only (its analysis is for it), not --model {model}: "
            "drop --model (logreg is its default)"
        )
    return "logreg"


# --------------------------------------------------------------------------------------------
# Direct multi-run audit of a learner on a worst-case neighbouring pair
# --------------------------------------------------------------------------------------------


def worst_case_neighbour(Z: np.ndarray, s: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Z', s', u): Z with its last record replaced by the candidate that moves the non-private minimiser
    most (candidates: ±e_j with either label, and the last record with its label flipped), and the unit
    direction u of w*(Z) − w*(Z'). Chosen from the data alone, before any private run."""
    base = solve_logistic(Z, s, lam)
    best = (-1.0, None, None, None)
    d = Z.shape[1]
    candidates = [(sign * np.eye(d)[j], lab) for j in range(d) for sign in (1.0, -1.0) for lab in (1.0, -1.0)]
    candidates.append((Z[-1], -s[-1]))
    for x, lab in candidates:
        Z2, s2 = Z.copy(), s.copy()
        Z2[-1], s2[-1] = x / max(1.0, np.linalg.norm(x)), lab
        diff = base - solve_logistic(Z2, s2, lam)
        if np.linalg.norm(diff) > best[0]:
            best = (float(np.linalg.norm(diff)), Z2, s2, diff)
    return best[1], best[2], best[3] / best[0]
