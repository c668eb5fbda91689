"""Model inversion: MI-FACE (Fredrikson, Jha & Ristenpart 2015, CCS, Algorithm 1) with quality metrics.

The attacker works in the model's RAW feature space (what ``run.dataset().X`` holds); the target applies
its own preprocessing (``run.preprocessing``) inside the model function, exactly as in deployment.
``x_0 = PROCESS(0)``: the all-zero input of Algorithm 1, line 3, projected into the attacker's feature box
(for digits, values in [0, 1], this is the blank image itself).

Stopping rule (Algorithm 1, lines 6-9), read literally with one precision: the non-improvement test
``c(x_i) >= max(c(x_{i-1}), ..., c(x_{i-beta}))`` is only applied once those beta earlier costs exist
(``i >= beta``). The pseudo-code leaves ``c(x_{i-beta})`` for ``i < beta`` undefined; reading it as "the
costs that exist" would stop at ``i = 1`` whenever the first step does not help, which is what happens for
a class the model gives almost no probability (a flat cost). The threshold test ``c(x_i) <= gamma`` applies
from the first step. The returned input is the argmin over all iterates ``x_0 .. x_last`` (line 10), not
the last one.

PROCESS clips to the feature box of the auxiliary split; the optional denoise/sharpen step of the paper
is not implemented. AUXTERM is ``prior_weight`` times a prior in box units (each feature divided by its
aux range): ``"tv"`` the (smoothed) anisotropic total variation of image-shaped data, ``"mean"`` the mean
squared distance to the aux mean, or ``"none"``.

Metrics (per class): MSE and SSIM (Wang et al. 2004) between the inversion and the mean of the target's
training members of that class, and of its non-members (holdout split) for contrast, all in box units;
identification accuracy: a logistic regression trained on the aux split only classifies the inversions.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpaudit.budget import Cost, check_cost
from dpaudit.checkpoint import as_run, eval_batch_rows
from dpaudit.errors import InputError
from dpaudit.models import channels_last_message, looks_channels_last
from dpaudit.progress import Progress
from dpaudit.validation import (
    check_choice,
    check_in_interval,
    check_positive,
    check_positive_int,
    host_array,
    python_scalar,
)

PRIORS = ("none", "tv", "mean")
# One gradient step of one start (a forward and backward pass through a small model on one input), an order of
# magnitude for dpaudit.budget.
STEP_SECONDS = 1e-4
# Why a run over token data is refused (also checked before any other attack runs: dpaudit.workflows.checkpoint).
TOKEN_REFUSAL = (
    "model inversion (MI-FACE) climbs the gradient of a class's confidence with respect to the input, and "
    "token ids are discrete (no gradient to follow): refused for token data; use `dpaudit attack mia` "
    "(membership) or canaries (`dpaudit train --canaries`) for a model over tokens"
)
# What is descended on (the MI-FACE cost c(x) = 1 - f_y(x) + AUXTERM(x) is always the one reported and the
# one the threshold gamma tests):
# - "mi-face": c itself (Fredrikson et al. 2015, Algorithm 1, line 5). On a confident model f_y(x_0) is
#   ~1e-9 and its gradient f_y (1 - f_y) grad log f_y vanishes with it: the attack never starts.
# - "log-softmax" (default): -log f_y(x) + AUXTERM(x), the cross-entropy of the target class, whose
#   gradient -grad logit_y + sum_j f_j grad logit_j does not vanish when f_y does (the standard remedy,
#   e.g. Zhang et al. 2020, "The Secret Revealer", arXiv:1911.07135, Eq. 3 identity loss).
# - "margin": max_{j != y} logit_j - logit_y + AUXTERM(x) (Carlini & Wagner 2017, arXiv:1608.04644, f_6).
VARIANTS = ("log-softmax", "margin", "mi-face")


# --------------------------------------------------------------------------- the algorithm


@dataclass(frozen=True, eq=False)
class MIFaceTrace:
    """One run of Algorithm 1: the argmin iterate, its MI-FACE cost c, the descended objective of every
    iterate and why it stopped (``objective`` and ``costs`` are c itself for the seed's variant)."""

    x: np.ndarray
    cost: float  # c(x) = 1 - f_y(x) + AUXTERM(x) at the returned x (MI-FACE's terms)
    costs: np.ndarray  # d(x_0), d(x_1), ..., d(x_last): the descended objective
    best_iteration: int
    stop_reason: str
    objective: float | None = None  # d at the returned x (None: d = c)

    @property
    def n_iterations(self) -> int:
        return len(self.costs) - 1


def mi_face(
    cost: Callable[[np.ndarray], float],
    gradient: Callable[[np.ndarray], np.ndarray],
    x0: np.ndarray,
    *,
    iterations: int,
    window: int,
    threshold: float,
    step: float,
    process: Callable[[np.ndarray], np.ndarray] = lambda x: x,
    can_step: Callable[[], bool] = lambda: True,
) -> MIFaceTrace:
    """MI-FACE, Fredrikson et al. 2015, Algorithm 1, on any cost: alpha = ``iterations``,
    beta = ``window``, gamma = ``threshold``, lambda = ``step``.

    ``cost(x)`` returns c(x), or a pair (d(x), c(x)): then ``gradient`` is d's, the no-improvement window
    and the argmin (lines 6 and 10) read d, and the threshold (line 8) reads c, MI-FACE's own cost, so that
    gamma keeps its meaning. ``can_step()`` is asked before each step (a query budget: False stops with
    ``"budget"``). See the module docstring for the reading of the window at ``i < beta``.
    """

    def costs(X: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        v = cost(X[0])
        d, c = (v[0], v[1]) if isinstance(v, tuple) else (v, v)
        return np.array([float(d)]), np.array([float(c)])

    (trace,) = mi_face_rows(
        costs, lambda X, rows: np.asarray(gradient(X[0]))[None], np.asarray(x0, dtype=np.float64)[None],
        iterations=iterations, window=window, threshold=threshold, step=step,
        process=lambda X: np.asarray(process(X[0]))[None], can_step=can_step,
    )  # fmt: skip
    return trace


def mi_face_rows(
    cost: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    gradient: Callable[[np.ndarray, np.ndarray], np.ndarray],
    X0: np.ndarray,
    *,
    iterations: int,
    window: int,
    threshold: float,
    step: float,
    process: Callable[[np.ndarray], np.ndarray] = lambda X: X,
    can_step: Callable[[], bool] = lambda: True,
) -> list[MIFaceTrace]:
    """Algorithm 1 (see :func:`mi_face`) run from every row of ``X0`` at once, each row on its own.

    ``cost(X, rows)`` returns the arrays (d, c) at the iterates ``X`` of the still running starts ``rows``
    (indices into ``X0``), ``gradient(X, rows)`` d's gradients there, ``process`` maps a stack of iterates.
    A row stops by its own rule (lines 6 and 8) and is then no longer evaluated; ``can_step()`` stops all.
    One model call per iteration serves every running start (a white-box cost can return d's gradient
    with its value, for the next step).
    """
    check_positive_int(iterations=iterations)
    check_positive_int(window=window)
    check_positive(finite=True, step=step)
    X = np.array(X0, dtype=np.float64)
    n = len(X)
    active = np.arange(n)
    d, c = cost(X, active)
    costs = [[float(v)] for v in d]
    best_x, best_d, best_c = X.copy(), np.array(d, np.float64), np.array(c, np.float64)
    best_i = [0] * n
    reason = ["max-iterations"] * n
    for i in range(1, iterations + 1):
        if not len(active):
            break
        if not can_step():
            for r in active:
                reason[r] = "budget"
            break
        X[active] = process(X[active] - step * gradient(X[active], active))  # Algorithm 1, line 5
        d, c = cost(X[active], active)
        running = []
        for j, r in enumerate(active):
            dj, cj = float(d[j]), float(c[j])
            costs[r].append(dj)
            if dj < best_d[r]:
                best_x[r], best_d[r], best_c[r], best_i[r] = X[r], dj, cj, i
            if i >= window and dj >= max(costs[r][i - window : i]):  # line 6, once beta earlier costs exist
                reason[r] = "no-improvement"
            elif cj <= threshold:  # line 8, in MI-FACE's cost
                reason[r] = "threshold"
            else:
                running.append(r)
        active = np.array(running, dtype=int)
    return [
        MIFaceTrace(best_x[r].copy(), float(best_c[r]), np.array(costs[r]), best_i[r], reason[r], float(best_d[r]))
        for r in range(n)
    ]


# --------------------------------------------------------------------------- the model as the attacker sees it


def raw_probabilities(run: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """Softmax probabilities of a loaded run on RAW features (float64 torch in, float64 out).

    The run's preprocessing is applied inside, as a torch expression so autograd goes through it. A
    float64 copy of the model: small probability changes are not rounded into flat stretches, which the
    stopping rule would read as no improvement. A module that does not run in float64 (your own
    ``nn.Module`` whose forward casts its input, ``x.float()``, then meets float64 weights) is run as saved,
    the standardised input cast to its parameters' dtype and the probabilities returned in float64: before,
    ``dpaudit attack inversion`` and ``attack attribute`` (and the report's) stopped on such a model with
    "internal error: RuntimeError: mat1 and mat2 must have the same dtype".
    """
    pre = run.preprocessing
    model = copy.deepcopy(run.model).to("cpu").double().eval()
    try:
        with torch.no_grad():
            model(torch.zeros((2, *run.spec.input_shape), dtype=torch.float64))
    except RuntimeError:  # a forward that casts its input itself: keep the model's own dtype
        model = copy.deepcopy(run.model).to("cpu").eval()
    dtype = next(model.parameters()).dtype
    for p in model.parameters():
        p.requires_grad_(False)
    if hasattr(pre, "mean"):
        mean = torch.as_tensor(np.asarray(pre.mean, np.float64))
        scale = torch.as_tensor(np.asarray(pre.scale, np.float64))
    else:
        mean, scale = torch.zeros(()), torch.ones(())

    def probs(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(model(((x - mean) / scale).to(dtype)).to(torch.float64), dim=-1)

    return probs


class QueryCounter:
    """A black-box oracle: numpy inputs in, probabilities out; ``queries`` counts the records asked."""

    def __init__(self, predict_proba: Callable[[np.ndarray], np.ndarray]) -> None:
        self.predict_proba = predict_proba
        self.queries = 0

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        self.queries += len(X)
        return np.asarray(self.predict_proba(X), dtype=np.float64)


def as_black_box(probs: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[np.ndarray], np.ndarray]:
    """A torch probability function as a numpy-only prediction API (no gradients leave it).

    Evaluated :func:`~dpaudit.checkpoint.eval_batch_rows` rows at a time, each batch made float64 on its own:
    a fixed number set by the record shape, never by N, so a record's probabilities do not depend on how many
    records are asked at once beyond the batch (``attack attribute`` sent each split whole: at 50,000
    CIFAR-sized images its float64 copies and ``(x - mean) / scale`` temporaries peaked at 2.5 GB). Splits of
    at most that many rows (2,048 tabular records, 341 CIFAR images) are one call, as before. BLAS may pick
    another kernel for another row count: measured with torch's MKL, a linear model's probabilities on
    batches of >= 2 rows are the whole call's byte for byte, a one-row batch and an MLP's hidden layer differ
    by <= 6.4e-15 in a logit (benchmarks/RESULTS.md, twelfth session)."""

    def predict_proba(X: np.ndarray) -> np.ndarray:
        X = np.asarray(X)
        rows = eval_batch_rows(tuple(X.shape[1:]))
        with torch.no_grad():  # range(0, 1): an empty X is still one call, its (0, k) shape from the model
            out = [
                probs(torch.as_tensor(np.asarray(X[s : s + rows], np.float64))).numpy()
                for s in range(0, max(len(X), 1), rows)
            ]
        return out[0] if len(out) == 1 else np.concatenate(out)

    return predict_proba


# --------------------------------------------------------------------------- the estimator


class MIFace:
    """MI-FACE model inversion (Fredrikson et al. 2015, Algorithm 1), white- or black-box.

    ``fit(X_aux)`` learns the attacker's feature box (``lower_``, ``upper_``: PROCESS clips to it) and
    the aux mean (``mean_``, for the ``"mean"`` prior). ``invert(model, label)`` runs the algorithm:

    - white-box: ``model`` maps a float64 torch batch of raw inputs to probabilities; the gradient of
      ``c`` is autograd on the input.
    - black-box (``black_box=True``): ``model`` maps a numpy batch to probabilities (wrap it in
      :class:`QueryCounter` to count). The gradient of the descended objective is the antithetic Gaussian
      two-point estimate ``(1/n) sum_k [f(x + mu u_k) - f(x - mu u_k)] / (2 mu) u_k`` with
      ``u_k ~ N(0, I)`` (Nesterov & Spokoiny 2017, "Random gradient-free minimization of convex
      functions", Found. Comput. Math., Gaussian smoothing); AUXTERM is the attacker's own and is
      differentiated exactly. Each step asks ``2 * directions + 1`` queries (the estimate, then
      ``c(x_i)``), plus one for ``c(x_0)``; ``budget`` (per inversion) stops it before a step that would
      exceed it.

    ``variant`` picks what is descended (:data:`VARIANTS`; ``"mi-face"`` is the seed's Algorithm 1 as
    published); the stopping rule, gamma and the reported cost are MI-FACE's in every variant.
    ``restarts`` R: Algorithm 1 is run from x_0 = PROCESS(0) and from R - 1 starts drawn uniformly in the
    aux box (seeded); the run with the smallest MI-FACE cost is returned (black-box: the budget is shared,
    the starts run one after another; white-box: all starts run at once, one model call per iteration), and
    every start's trace is kept in ``traces_``.
    """

    def __init__(
        self,
        *,
        iterations: int = 500,
        window: int = 50,
        threshold: float = 0.01,
        step: float = 0.1,
        prior: str = "none",
        prior_weight: float = 0.0,
        black_box: bool = False,
        budget: int | None = None,
        directions: int = 20,
        smoothing: float = 0.01,
        variant: str = "log-softmax",
        restarts: int = 4,
        seed: int | np.random.Generator | None = 0,
    ) -> None:
        self.iterations = iterations
        self.window = window
        self.threshold = threshold
        self.step = step
        self.prior = prior
        self.prior_weight = prior_weight
        self.black_box = black_box
        self.budget = budget
        self.directions = directions
        self.smoothing = smoothing
        self.variant = variant
        self.restarts = restarts
        self.seed = seed

    def check(self) -> None:
        """Validate the settings (named errors); fit calls it."""
        check_positive_int(iterations=self.iterations)
        check_positive_int(window=self.window)
        check_positive(finite=True, step=self.step)
        check_choice(PRIORS, prior=self.prior)
        check_choice(VARIANTS, variant=self.variant)
        check_positive_int(restarts=self.restarts)
        # Per class (dpaudit.budget; a ceiling: a start may stop early): `--restarts 2^63` ran for ever, no --yes.
        check_cost(Cost("model inversion", self.restarts, "starts", seconds_per_unit=self.iterations * STEP_SECONDS))
        check_in_interval(0.0, math.inf, lo_open=False, prior_weight=self.prior_weight)
        check_in_interval(-math.inf, math.inf, threshold=self.threshold)
        if self.threshold >= 1 and (self.prior == "none" or self.prior_weight == 0):
            # Without AUXTERM the cost 1 - f_y is at most 1, so gamma >= 1 stops every start after one step
            # (Algorithm 1, line 8): the "inversion" would be x_0 moved once, whatever the model.
            raise InputError(
                f"expected threshold < 1, got {self.threshold:g}: the cost 1 - f_y is at most 1, so every input "
                "meets it and the attack would stop after one step (gamma is a cost, e.g. 0.01 for f_y >= 0.99)"
            )
        if self.black_box:
            if self.budget is not None:
                check_positive_int(budget=self.budget)
            check_positive_int(directions=self.directions)
            check_positive(smoothing=self.smoothing)
        elif self.budget is not None:
            raise InputError("a query budget applies to the black-box attack only; add black_box")

    def fit(self, X_aux: np.ndarray) -> MIFace:
        """Learn the feature box and mean of the attacker's auxiliary data (raw features)."""
        self.check()
        X = np.asarray(X_aux, dtype=np.float64)
        if X.ndim < 2 or len(X) == 0:
            raise InputError(f"expected a non-empty batch of aux records, got shape {X.shape}")
        self.lower_ = X.min(axis=0)
        self.upper_ = X.max(axis=0)
        width = self.upper_ - self.lower_
        self.width_ = np.where(width > 1e-12, width, 1.0)  # constant features: box units = raw units
        self.mean_ = X.mean(axis=0)
        if self.prior == "tv" and X.ndim < 3:
            raise InputError("prior 'tv' needs image-shaped data (height x width); use 'mean' or 'none'")
        if self.prior == "tv" and looks_channels_last(X.shape[1:]):  # TV would difference along width and channels
            raise InputError(channels_last_message("prior 'tv'", X.shape[1:]) + "; or use prior 'mean' or 'none'")
        return self

    def process(self, x: np.ndarray) -> np.ndarray:
        """PROCESS: clip to the aux feature box."""
        return np.clip(x, self.lower_, self.upper_)

    def _aux_terms(self, X: torch.Tensor) -> torch.Tensor:
        """AUXTERM of each row of a stack of inputs (float64, shape (n,))."""
        if self.prior == "none" or self.prior_weight == 0:
            return torch.zeros(len(X), dtype=torch.float64)
        z = (X - torch.as_tensor(self.lower_)) / torch.as_tensor(self.width_)  # box units
        if self.prior == "mean":
            m = (torch.as_tensor(self.mean_) - torch.as_tensor(self.lower_)) / torch.as_tensor(self.width_)
            return self.prior_weight * ((z - m) ** 2).flatten(1).mean(1)
        dh = z[..., 1:, :] - z[..., :-1, :]
        dw = z[..., :, 1:] - z[..., :, :-1]
        # Anisotropic total variation (Rudin, Osher & Fatemi 1992), sqrt(d^2 + 1e-8) so it is differentiable at 0.
        return self.prior_weight * (
            torch.sqrt(dh**2 + 1e-8).flatten(1).mean(1) + torch.sqrt(dw**2 + 1e-8).flatten(1).mean(1)
        )

    def _aux_term(self, x: torch.Tensor) -> torch.Tensor:
        return self._aux_terms(x[None])[0]

    def aux_term(self, x: np.ndarray) -> float:
        return float(self._aux_term(torch.as_tensor(x, dtype=torch.float64)))

    def _objectives(self, P: torch.Tensor, label: int) -> torch.Tensor:
        """The descended objective d without AUXTERM, from each row of probabilities (float64, shape (n,))."""
        if self.variant == "mi-face":
            return 1.0 - P[:, label]
        # log-probabilities differ from the logits by a constant, so the margin is a logit margin; the clamp
        # only guards log(0) (a probability below 1e-300 in float64)
        logp = torch.log(P.clamp_min(1e-300))
        if self.variant == "log-softmax":
            return -logp[:, label]
        others = torch.cat([logp[:, :label], logp[:, label + 1 :]], dim=1)
        return others.max(dim=1).values - logp[:, label]

    def starts(self) -> list[np.ndarray]:
        """x_0 = PROCESS(0) (Algorithm 1, line 3), then ``restarts - 1`` uniform draws in the aux box."""
        rng = np.random.default_rng(derive_start_seed(self.seed))
        x0 = self.process(np.zeros_like(self.lower_))
        return [x0] + [rng.uniform(self.lower_, self.upper_) for _ in range(self.restarts - 1)]

    def invert(self, model: Callable[..., Any], label: int) -> MIFaceTrace:
        """Run Algorithm 1 for class ``label`` against ``model`` from each start (see the class docstring)
        and return the trace with the smallest MI-FACE cost."""
        if not hasattr(self, "lower_"):
            raise InputError("MIFace is not fitted; call fit(X_aux) first")
        label = python_scalar(label)
        if isinstance(label, bool) or not isinstance(label, numbers.Integral) or label < 0:
            raise InputError(f"expected label to be a class index (an integer >= 0), got {label!r}")
        label = int(label)
        kw = dict(iterations=self.iterations, window=self.window, threshold=self.threshold, step=self.step)
        if not self.black_box:
            grads: dict[str, np.ndarray] = {}

            def cost(X: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                # One forward and backward for every running start: d's gradient is kept for the next step
                # (rows are independent: the model is in eval mode, so d.sum()'s gradient is each row's).
                t = torch.as_tensor(X).clone().requires_grad_(True)
                p = _white_box_probabilities(model, t, label)
                a = self._aux_terms(t)
                d = self._objectives(p, label) + a
                (g,) = torch.autograd.grad(d.sum(), t)
                grads["rows"], grads["g"] = rows, g.numpy()
                with torch.no_grad():
                    return d.numpy(force=True), (1.0 - p[:, label] + a).numpy(force=True)

            def gradient(X: np.ndarray, rows: np.ndarray) -> np.ndarray:
                return grads["g"][np.searchsorted(grads["rows"], rows)]  # rows only ever shrink

            self.traces_ = mi_face_rows(cost, gradient, np.stack(self.starts()), process=self.process, **kw)
            return min(self.traces_, key=lambda t: (t.cost, t.objective))

        rng = np.random.default_rng(self.seed)
        used = 0
        n, mu = int(self.directions), float(self.smoothing)

        def ask(X: np.ndarray) -> np.ndarray:
            nonlocal used
            used += len(X)
            # host_array: a torch model's output (it may require grad) read as its values, not torch's RuntimeError
            return _checked_label(np.asarray(host_array(model(X)), dtype=np.float64), label)

        def objective(P: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return self._objectives(torch.as_tensor(P), label).numpy()

        def cost(x: np.ndarray) -> tuple[float, float]:
            p = ask(x[None])
            a = self.aux_term(x)
            return float(objective(p)[0] + a), float(1.0 - p[0, label] + a)

        def gradient(x: np.ndarray) -> np.ndarray:
            u = rng.standard_normal((n, *x.shape))
            f = objective(ask(np.concatenate([x + mu * u, x - mu * u])))
            coef = (f[:n] - f[n:]) / (2 * mu)  # dd/du_k, antithetic two-point estimate
            g = np.tensordot(coef, u, axes=1) / n
            t = torch.as_tensor(x).clone().requires_grad_(True)
            a = self._aux_term(t)
            if a.requires_grad:
                g = g + torch.autograd.grad(a, t)[0].numpy()
            return g

        def can_step() -> bool:
            return self.budget is None or used + 2 * n + 1 <= self.budget

        traces = []
        for x0 in self.starts():
            if traces and self.budget is not None and used + 1 > self.budget:
                break  # no query left for c(x_0) of another start
            traces.append(mi_face(cost, gradient, x0, process=self.process, can_step=can_step, **kw))
        self.queries_, self.traces_ = used, traces
        return min(traces, key=lambda t: (t.cost, t.objective))


def _checked_label(P: Any, label: int) -> Any:
    """``P``, the model's (n, classes) probabilities, once ``label`` is one of its classes (else one line, not
    IndexError from deep inside the objective)."""
    if P.ndim != 2 or not label < P.shape[1]:
        shape = tuple(P.shape)
        raise InputError(f"expected the model to return (n, classes) probabilities with class {label}, got {shape}")
    return P


def _white_box_probabilities(model: Callable[..., Any], t: torch.Tensor, label: int) -> torch.Tensor:
    """The white-box ``model``'s probabilities on the float64 batch ``t``, as float64. A torch module whose
    parameters are of another floating dtype (a float32 model, as torch trains it) gets ``t`` cast to that dtype
    (autograd differentiates through the cast; the result is widened back, so the objective's log stays in
    float64): it raised torch's "mat1 and mat2 must have the same dtype" before."""
    params = model.parameters() if isinstance(model, torch.nn.Module) else iter(())
    dtype = next((q.dtype for q in params if q.is_floating_point()), torch.float64)
    return _checked_label(model(t.to(dtype)).to(torch.float64), label)


def derive_start_seed(seed: int | np.random.Generator | None) -> int | np.random.Generator | None:
    """The random starts' stream: apart from the black-box directions' (same seed, another stream)."""
    if isinstance(seed, int):
        from dpaudit.seeding import derive_seed

        return derive_seed(seed, stream=7)
    return seed


# --------------------------------------------------------------------------- metrics


def ssim(a: np.ndarray, b: np.ndarray, *, data_range: float = 1.0, win_size: int = 7) -> float:
    """Mean structural similarity (Wang, Bovik, Sheikh & Simoncelli 2004, IEEE TIP 13(4), eq. 13 per
    window, averaged as MSSIM, eq. 17) with K1 = 0.01, K2 = 0.03 (ibid.) and uniform square windows of
    side ``min(win_size, height, width)`` at every valid position; population (1/N) statistics.

    2-D inputs (or ``(..., H, W)`` with leading axes of size 1) are images; anything else is compared as
    one window over all its values.
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise InputError(f"ssim needs equal shapes, got {a.shape} and {b.shape}")
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    img = a.squeeze().ndim == 2

    def windows(x: np.ndarray) -> np.ndarray:
        if not img:
            return x.reshape(1, -1)
        x = x.squeeze()
        k = min(win_size, *x.shape)
        w = np.lib.stride_tricks.sliding_window_view(x, (k, k))
        return w.reshape(-1, k * k)

    wa, wb = windows(a), windows(b)
    ma, mb = wa.mean(axis=1), wb.mean(axis=1)
    va, vb = wa.var(axis=1), wb.var(axis=1)
    cov = ((wa - ma[:, None]) * (wb - mb[:, None])).mean(axis=1)
    s = ((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma**2 + mb**2 + c1) * (va + vb + c2))  # eq. 13
    return float(s.mean())  # eq. 17


# --------------------------------------------------------------------------- results and the run-level attack


@dataclass(frozen=True, eq=False)
class InversionResult:
    """MI-FACE against one model: per-class inversions (raw features), their costs and quality metrics.

    Not a membership attack: no membership scores, so the score convention of ``attacks/result.py``
    does not apply. ``per_class[k]`` holds ``mse``/``ssim`` (to the mean of the target's training members
    of class k), ``mse_nonmembers``/``ssim_nonmembers`` (to the holdout's class mean), ``mse_other`` (mean
    MSE to the member means of the other classes), ``nearest_class`` (the class whose member mean is
    closest), ``identified_as`` (the evaluation classifier's label), cost, iterations, stop reason and
    queries. MSE and SSIM in box units (each feature divided by its aux range; SSIM data range 1).
    """

    classes: tuple[int, ...]
    inversions: np.ndarray
    per_class: tuple[dict[str, Any], ...]
    identification_accuracy: float
    nearest_mean_accuracy: float
    eval_classifier_accuracy: float
    params: dict[str, Any] = field(default_factory=dict)
    labels: tuple[int | str, ...] | None = None  # the data's label of each class index (None: the indices)

    def __post_init__(self) -> None:
        inv = np.array(self.inversions, dtype=np.float64, copy=True)
        inv.setflags(write=False)
        object.__setattr__(self, "inversions", inv)

    def to_dict(self, include_inversions: bool = True) -> dict[str, Any]:
        def mean(key: str) -> float | None:  # over the classes that have the value (None: a split lacks the class)
            values = [c[key] for c in self.per_class if c[key] is not None]
            return float(np.mean(values)) if values else None

        out: dict[str, Any] = {
            "attack": "mi-face",
            "params": dict(self.params),
            "classes": list(self.classes),
            # label of each class index (what "class", "nearest_class" and "identified_as" index into)
            "labels": None if self.labels is None else list(self.labels),
            "identification_accuracy": float(self.identification_accuracy),
            "nearest_mean_accuracy": float(self.nearest_mean_accuracy),
            "eval_classifier_accuracy": float(self.eval_classifier_accuracy),
            "mean_mse": mean("mse"),
            "mean_ssim": mean("ssim"),
            "mean_mse_nonmembers": mean("mse_nonmembers"),
            "mean_ssim_nonmembers": mean("ssim_nonmembers"),
            "per_class": [dict(c) for c in self.per_class],
        }
        if include_inversions:
            out["feature_shape"] = list(self.inversions.shape[1:])
            out["inversions"] = self.inversions.reshape(len(self.inversions), -1).tolist()
        return out


def parse_classes(labels: str | Sequence[Any] | None, dataset: Any) -> tuple[int, ...]:
    """The class indices of ``labels``, given as the data holds them (``"1,2"``, ``"dog"``; None: every class),
    through :meth:`dpaudit.data.Dataset.class_indices` (class indices are refused where they are not the labels)."""
    return dataset.class_indices(labels, option="--classes")


def _class_means(ds: Any, idx: np.ndarray, n_classes: int) -> np.ndarray:
    """Per class, the float64 mean of the raw rows ``idx`` of ``ds`` of that class (NaN for a class without
    any), read a block of rows at a time (:meth:`dpaudit.data.Dataset.mean_rows`)."""
    y = np.asarray(ds.y)[idx]
    means = np.full((n_classes, *ds.feature_shape), np.nan)
    for k in range(n_classes):
        if np.any(y == k):
            means[k] = ds.mean_rows(idx[y == k])
    return means


def _accuracy_in_blocks(clf: Any, ds: Any, idx: np.ndarray, block: int = 4096) -> float:
    """``clf.score`` (accuracy) on the rows ``idx`` of ``ds`` as float64, a block of rows at a time: the same
    count of correct predictions over the same number of rows."""
    correct = 0
    for s in range(0, len(idx), block):
        part = idx[s : s + block]
        X = ds.rows(part).astype(np.float64).reshape(len(part), -1)
        correct += int(np.sum(clf.predict(X) == np.asarray(ds.y)[part]))
    return correct / len(idx)


def eval_classifier(X_aux: np.ndarray, y_aux: np.ndarray, seed: int = 0):
    """The identification oracle: standardise + logistic regression, trained on the aux split only."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))
    return clf.fit(X_aux.reshape(len(X_aux), -1), y_aux)


def _invert_one(attack, target, k, clf, members, nonmembers, box) -> dict[str, Any]:
    before = getattr(target, "queries", 0)
    trace = attack.invert(target, k)
    x = trace.x
    finite = [bool(np.all(np.isfinite(m))) for m in members]
    mse_all = np.array(
        [np.mean((box(x) - box(m)) ** 2) if ok else np.inf for m, ok in zip(members, finite, strict=True)]
    )
    has_nm = bool(np.all(np.isfinite(nonmembers[k])))
    others = [v for i, v in enumerate(mse_all) if i != k and np.isfinite(v)]
    return {  # None where the members (or the holdout) hold no record of class k: nothing to compare with
        "class": k,
        "mse": float(mse_all[k]) if finite[k] else None,
        "ssim": ssim(box(x), box(members[k])) if finite[k] else None,
        "mse_nonmembers": float(np.mean((box(x) - box(nonmembers[k])) ** 2)) if has_nm else None,
        "ssim_nonmembers": ssim(box(x), box(nonmembers[k])) if has_nm else None,
        "mse_other": float(np.mean(others)) if others else None,
        "nearest_class": int(np.argmin(mse_all)),
        "identified_as": int(clf.predict(x.reshape(1, -1))[0]),
        "cost": float(trace.cost),
        "confidence": float(1.0 - trace.cost + attack.aux_term(x)),  # f_label at the argmin
        "objective": float(trace.cost if trace.objective is None else trace.objective),
        "iterations": int(trace.n_iterations),
        "best_iteration": int(trace.best_iteration),
        "stop_reason": trace.stop_reason,
        "queries": int(getattr(target, "queries", 0) - before),
        "x": x,
    }


def run_inversion(
    run: Any,
    classes: str | Sequence[Any] | None = None,
    *,
    attack: MIFace | None = None,
    seed: int = 0,
    progress: Any = None,
) -> InversionResult:
    """Invert every class in ``classes`` of a loaded run (default: all) and score the inversions.

    ``classes``: labels as the run's data holds them (``"1,2"``, ``["cat"]``; :func:`parse_classes`), never
    class indices; the result names each class by its index (``class``) and its label (``label``)."""
    run = as_run(run)
    attack = attack if attack is not None else MIFace(seed=seed)
    n_classes = int(run.spec.n_classes)
    ds = run.dataset()
    classes = parse_classes(classes, ds)
    if ds.kind == "tokens":
        raise InputError(TOKEN_REFUSAL)
    y = np.asarray(ds.y)
    sp = run.splits
    present = np.unique(y[sp.aux])
    if len(present) < 2:  # scikit-learn's "needs samples of at least 2 classes" reached the user as an internal error
        held = f"a single class ({ds.label(present[0])})" if len(present) else "no record"
        raise InputError(
            f"the aux split holds {held}: the identification classifier that scores the inversions is trained "
            "there and needs at least 2 classes"
        )
    # The aux split in float64 (the attacker's data), the other splits a block of rows at a time: never the whole
    # X as float64 (a memory-mapped CIFAR X.npy of 600 MB read whole into 1.2 GB: a 2.9 GB peak before).
    X_aux = ds.rows(sp.aux).astype(np.float64)
    attack.fit(X_aux)
    probs = raw_probabilities(run)
    target: Callable[..., Any] = probs
    if attack.black_box:
        target = QueryCounter(as_black_box(probs))
    clf = eval_classifier(X_aux, y[sp.aux], seed=seed)
    del X_aux
    eval_acc = _accuracy_in_blocks(clf, ds, sp.test) if len(sp.test) else float("nan")

    def box(x: np.ndarray) -> np.ndarray:
        return (x - attack.lower_) / attack.width_

    members = _class_means(ds, sp.members, n_classes)
    nonmembers = _class_means(ds, sp.holdout, n_classes)
    inversions, per_class = [], []
    with (progress or Progress()).task("MI-FACE inversion", len(classes)) as advance:
        for k in classes:
            per_class.append(
                {**_invert_one(attack, target, int(k), clf, members, nonmembers, box), "label": ds.label(k)}
            )
            inversions.append(per_class[-1].pop("x"))
            advance(1)
    ident = float(np.mean([c["identified_as"] == c["class"] for c in per_class]))
    nearest = float(np.mean([c["nearest_class"] == c["class"] for c in per_class]))
    params = {
        "iterations": attack.iterations,
        "window": attack.window,
        "threshold": attack.threshold,
        "step": attack.step,
        "prior": attack.prior,
        "prior_weight": attack.prior_weight,
        "black_box": bool(attack.black_box),
        "budget": attack.budget,
        "directions": attack.directions if attack.black_box else None,
        "variant": attack.variant,
        "restarts": attack.restarts,
        "start": "x0 = PROCESS(0) in raw feature space, then restarts - 1 uniform draws in the aux box",
        "seed": seed,
    }
    labels = tuple(ds.label(k) for k in range(n_classes))
    return InversionResult(classes, np.stack(inversions), tuple(per_class), ident, nearest, eval_acc, params, labels)


def save_grid(result: InversionResult, path: Any, *, member_means: np.ndarray | None = None, force: bool) -> Path:
    """A PNG grid of the inversions (one column per class; image-shaped features only, else a bar-code
    row per class); ``member_means`` adds a second row with the target members' class means.

    Written atomically (:func:`dpaudit.fileio.write_atomic_file`; an existing file needs ``force``). The
    bytes depend on the result only: matplotlib's default style (not the user's matplotlibrc), fixed dpi,
    no "Software" metadata."""
    import io

    from matplotlib import style  # no matplotlib.use(): the caller's backend stays (dpaudit.report.plots says why)
    from matplotlib.figure import Figure

    from dpaudit.fileio import write_atomic_file

    inv = result.inversions
    rows = 1 if member_means is None else 2
    n = len(result.classes)

    def image(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x).squeeze()
        return x if x.ndim == 2 else x.reshape(1, -1)

    with style.context("default"):
        fig = Figure(figsize=(1.2 * n, 1.3 * rows))  # object API: no pyplot registry to leak figures into
        axes = fig.subplots(rows, n, squeeze=False)
        for j, k in enumerate(result.classes):
            axes[0, j].imshow(image(inv[j]), cmap="gray_r", aspect="auto")
            axes[0, j].set_title(str(k if result.labels is None else result.labels[k]), fontsize=8)
            if member_means is not None:
                axes[1, j].imshow(image(member_means[k]), cmap="gray_r", aspect="auto")
            for r in range(rows):
                axes[r, j].axis("off")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return write_atomic_file(Path(path), buf.getvalue(), force=force)


def member_class_means(run: Any) -> np.ndarray:
    """The mean of the target's training members per class (raw features), for the grid's second row."""
    return _class_means(run.dataset(), run.splits.members, int(run.spec.n_classes))
