"""DP-AGD: gradient descent with an adaptive per-iteration privacy budget under zCDP.

Lee & Kifer 2018, "Concentrated differentially private gradient descent with adaptive per-iteration
privacy budget", KDD (seed slides ``slides-dp-agd-zcdp-adaptive-budget.txt``, Algorithm 2):

1. ρ from (ε_tot, δ_tot) by solving ε_tot = ρ + 2√(ρ log(1/δ_tot)) (slides Eq. (5), Lemma 3.8);
2. each iteration: the sum of per-record gradients clipped to C_grad plus N(0, C_grad²/(2ρ_ng) I)
   (ρ_ng-zCDP: Gaussian mechanism, slides Lemma 3.6), normalised;
3. NoisyMax over the candidate steps Φ = {α_max·k/m : k = 0..m} (m = 20) of −Σ_i min(ℓ_i, C_obj)
   with Laplace noise of scale C_obj/√(2ρ_nmax): √(2ρ_nmax)-DP, hence ρ_nmax-zCDP (slides Alg. 1 and
   Lemma 3.7). Every 10 steps α_max ← (1 + η)·max(recent choices), η = 0.1, initial 2;
4. if the chosen step is 0 (not a descent direction): ρ_ng ← (1 + γ)ρ_ng, a fresh gradient with the
   budget difference is averaged with the old one (GRADAVG; the average is exactly a Gaussian with
   budget ρ_ng), and NoisyMax is run again.

The budget is a zCDP privacy filter: every charge goes in a ledger and is made only when the remaining
budget covers it *and* the NoisyMax that must follow, so the ledger never exceeds ρ. The claim is
ρ (the budget), not the realised spend: when to stop depends on the noisy answers, and the filter's
guarantee is for the budget (privacy filters: Rogers, Roth, Ullman & Vadhan 2016, arXiv:1605.08294, for
(ε, δ); under Rényi DP at a fixed order, the Rényi filter of Feldman & Zrnic 2021, arXiv:2008.11193;
zCDP is Rényi DP of order α at αρ for every α > 1, and the stopping rule Σ ρ_i ≤ ρ is the filter's at
every order at once, so the adaptive run is ρ-zCDP).

Neighbours are add/remove-one. Each record's clipped gradient has norm ≤ C_grad, so the gradient sum
moves by ≤ C_grad; each candidate's clipped objective Σ_i min(ℓ_i, C_obj) with ℓ_i ≥ 0 moves by at
most C_obj and all candidates in the same direction (monotone), which is what NoisyMax with
Lap(Δ/ε) needs to be ε-DP (Dwork & Roth 2014, Claim 3.9; not monotone, e.g. under replace-one, it
would need twice the noise). The regulariser (λ/2)‖w‖² is part of each record's loss, so nothing in
the algorithm depends on N.

Objectives: logistic loss, or the Huber hinge of the SVM (Chaudhuri, Monteleoni & Sarwate 2011,
Eq. (7), h = 0.5), on features scaled as in :mod:`dpaudit.training.convex`. More than two classes:
one-vs-rest, K binary runs sharing the budget (ρ/K each; :func:`per_classifier_config`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from dpaudit import numfmt
from dpaudit.errors import InputError
from dpaudit.events import ZCDP
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.base import Trainer, TrainOutcome
from dpaudit.training.convex import (
    FLOAT_NOTE,
    _arrays,
    _sigmoid,
    check_epsilon_only,
    class_signs,
    load_logreg,
    no_builtin_audit,
    noise_rng,
    release_precision,
    unit_ball_features,
)
from dpaudit.validation import check_in_interval, check_non_negative, check_positive, check_positive_int

DPAGD_ANALYSIS = (
    "DP-AGD (Lee & Kifer 2018, KDD, Alg. 2): Gaussian noisy clipped gradient sums (rho_ng-zCDP), NoisyMax "
    "step-size selection with Laplace noise C_obj/sqrt(2 rho_nmax) (rho_nmax-zCDP) and gradient averaging, "
    "composed under zCDP (Bun & Steinke 2016) with a privacy filter at the budget rho (add/remove neighbours); "
    "(epsilon, delta) from rho by the zCDP accountant." + FLOAT_NOTE
)


def rho_from_epsilon(epsilon: float, delta: float) -> float:
    """ρ solving ε = ρ + 2√(ρ log(1/δ)) (slides Eq. (5); Bun & Steinke 2016, Prop. 1.3):
    √ρ = √(log(1/δ) + ε) − √(log(1/δ))."""
    check_positive(epsilon=epsilon)
    check_in_interval(0.0, 1.0, delta=delta)
    L = math.log(1.0 / delta)
    return (math.sqrt(L + epsilon) - math.sqrt(L)) ** 2


def epsilon_from_rho(rho: float, delta: float) -> float:
    """ε = ρ + 2√(ρ log(1/δ)) (slides Eq. (5); Bun & Steinke 2016, Prop. 1.3): the inverse of
    :func:`rho_from_epsilon`."""
    check_positive(rho=rho)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def initial_budgets(epsilon: float, delta: float, splits: int, c_grad: float) -> tuple[float, float]:
    """(ρ_nmax, ρ_ng) of the authors' code (seed slides, ``agd_rho``): ε_nmax = ε_tot/(2·splits);
    ρ_nmax = ε_nmax²/2 (Lemma 3.7); σ = C_grad √(2 log(1.25/δ))/ε_nmax (slides Thm 3.3) and
    ρ_ng = C_grad²/(2σ²) (Lemma 3.6) = ε_nmax²/(4 log(1.25/δ))."""
    eps_split = 0.5 * epsilon / splits
    if math.isinf(eps_split * eps_split):  # ε beyond ~1e154: no budget holds this share (eps_split**2 raised)
        return math.inf, math.inf
    sigma = c_grad * math.sqrt(2.0 * math.log(1.25 / delta)) / eps_split
    return 0.5 * eps_split**2, c_grad**2 / (2.0 * sigma**2)


# --------------------------------------------------------------------------------------------
# Per-record losses and gradients
# --------------------------------------------------------------------------------------------


def losses(w: np.ndarray, Z: np.ndarray, s: np.ndarray, objective: str, lam: float, h: float = 0.5) -> np.ndarray:
    """Per-record loss ℓ(s⟨w, x⟩) + (λ/2)‖w‖² (≥ 0). W may be a stack (K × d) of candidates: K × N."""
    m = s * (np.atleast_2d(w) @ Z.T)
    if objective == "logistic":
        base = np.logaddexp(0.0, -m)
    else:  # Huber hinge (Chaudhuri et al. 2011, Eq. (7))
        base = np.where(m > 1 + h, 0.0, np.where(m < 1 - h, 1.0 - m, (1 + h - m) ** 2 / (4 * h)))
    reg = 0.5 * lam * np.sum(np.atleast_2d(w) ** 2, axis=1, keepdims=True)
    return base + reg


def gradients(w: np.ndarray, Z: np.ndarray, s: np.ndarray, objective: str, lam: float, h: float = 0.5) -> np.ndarray:
    """Per-record gradients (N × d) of :func:`losses`."""
    m = s * (Z @ w)
    if objective == "logistic":
        dm = -_sigmoid(-m)
    else:
        dm = np.where(m > 1 + h, 0.0, np.where(m < 1 - h, -1.0, -(1 + h - m) / (2 * h)))
    return (dm * s)[:, None] * Z + lam * w[None, :]


def clip_rows(G: np.ndarray, c: float) -> np.ndarray:
    """Each row divided by max(1, ‖row‖/c) (slides Alg. 2, line 5)."""
    norms = np.linalg.norm(G, axis=1, keepdims=True)
    return G / np.maximum(1.0, norms / c)


# --------------------------------------------------------------------------------------------
# The algorithm
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DPAGDConfig:
    """Settings of DP-AGD (defaults: the slides and the authors' code)."""

    epsilon: float
    delta: float
    c_grad: float = 1.0
    c_obj: float = 1.0
    lam: float = 0.0
    objective: str = "logistic"
    splits: int = 60
    gamma: float = 0.1
    candidates: int = 20
    eta: float = 0.1
    alpha_max: float = 2.0
    update_every: int = 10

    def __post_init__(self) -> None:
        check_positive(epsilon=self.epsilon)
        check_in_interval(0.0, 1.0, delta=self.delta)
        check_positive(c_grad=self.c_grad)
        check_positive(c_obj=self.c_obj)
        check_non_negative(lam=self.lam)
        if self.objective not in ("logistic", "huber"):
            raise InputError(f"unknown DP-AGD objective {self.objective!r}; valid: logistic, huber")
        check_positive_int(splits=self.splits)
        check_positive(gamma=self.gamma)
        check_positive_int(candidates=self.candidates)
        check_non_negative(eta=self.eta)
        check_positive(alpha_max=self.alpha_max)
        check_positive_int(update_every=self.update_every)

    @property
    def rho(self) -> float:
        return rho_from_epsilon(self.epsilon, self.delta)


@dataclass
class Ledger:
    """Every zCDP charge, in order: (kind, ρ) with kind "gradient", "noisy_max" or "gradavg"."""

    budget: float
    charges: list[tuple[str, float]] = field(default_factory=list)

    @property
    def spent(self) -> float:
        return math.fsum(r for _, r in self.charges)

    @property
    def remaining(self) -> float:
        return self.budget - self.spent

    def can(self, *rhos: float) -> bool:
        return math.fsum(rhos) <= self.remaining

    def charge(self, kind: str, rho: float) -> None:
        if rho > self.remaining:  # never reached: callers check can() first
            raise AssertionError(f"charge {rho} exceeds the remaining budget {self.remaining}")
        self.charges.append((kind, rho))

    def totals(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: 0.0 for k in ("gradient", "noisy_max", "gradavg")}
        counts = dict.fromkeys(out, 0)
        for kind, r in self.charges:
            out[kind] += r
            counts[kind] += 1
        return {"rho": {k: float(v) for k, v in out.items()}, "count": counts, "spent": self.spent}


@dataclass
class AGDResult:
    w: np.ndarray
    ledger: Ledger
    steps: int
    nmax_scales: list[float]
    rho_ng_final: float


def noisy_argmin(values: np.ndarray, scale: float, rng: np.random.Generator) -> int:
    """NOISYMAX(−Ω, Δ, ε) of the slides (Alg. 1): argmax_j (−Ω_j + Lap(Δ/ε)); Laplace noise is symmetric,
    so this is argmin_j (Ω_j + Lap(scale)) with scale = Δ/ε."""
    return int(np.argmin(values + rng.laplace(0.0, scale, size=len(values))))


def grad_avg(
    rho_old: float, rho_new: float, g: np.ndarray, noisy: np.ndarray, c_grad: float, rng: np.random.Generator
) -> np.ndarray:
    """GRADAVG (slides Alg. 2, lines 25–28): a fresh estimate g + N(0, C²/(2(ρ_new − ρ_old)) I), averaged
    with the old one (noise C²/(2ρ_old)) with weights ρ_old/ρ_new and (ρ_new − ρ_old)/ρ_new. The average's
    noise variance is (ρ_old·C²/2 + (ρ_new − ρ_old)·C²/2)/ρ_new² = C²/(2ρ_new): one Gaussian of budget ρ_new,
    at the cost of the difference only (zCDP composition, slides Lemma 3.5)."""
    g2 = g + rng.normal(0.0, c_grad / math.sqrt(2.0 * (rho_new - rho_old)), size=g.shape)
    return (rho_old * noisy + (rho_new - rho_old) * g2) / rho_new


def dpagd(Z: np.ndarray, s: np.ndarray, config: DPAGDConfig, rng: np.random.Generator) -> AGDResult:
    """Algorithm 2 of the slides on features Z (‖x‖ ≤ 1 not needed: gradients and losses are clipped)
    and ±1 labels s. Returns the weights (rounded to float32, the released precision), the ledger and the NoisyMax
    noise scales used."""
    rho_nmax, rho_ng = initial_budgets(config.epsilon, config.delta, config.splits, config.c_grad)
    ledger = Ledger(config.rho)
    if not ledger.can(rho_ng, rho_nmax):
        raise InputError(
            f"the budget rho = {ledger.budget:.3g} (epsilon {numfmt.upper(config.epsilon)}, delta "
            f"{numfmt.exact(config.delta)}) is too small "
            f"for one DP-AGD iteration (rho_ng + rho_nmax = {rho_ng + rho_nmax:.3g}); raise --steps (the splits: "
            "an iteration first spends (epsilon / (2 splits))² / 2, so a larger --epsilon does not help)"
        )
    d = Z.shape[1]
    w = np.zeros(d)
    alpha_max, chosen, steps, scales = config.alpha_max, [], 0, []
    m = config.candidates
    nmax_scale = config.c_obj / math.sqrt(2.0 * rho_nmax)  # slides Alg. 2, line 12
    while ledger.can(rho_ng, rho_nmax):
        g = clip_rows(gradients(w, Z, s, config.objective, config.lam), config.c_grad).sum(0)  # line 5
        noisy = g + rng.normal(0.0, config.c_grad / math.sqrt(2.0 * rho_ng), size=d)  # line 6
        ledger.charge("gradient", rho_ng)  # line 7
        stop = False
        while True:
            direction = noisy / np.linalg.norm(noisy)  # line 8
            phi = alpha_max * np.arange(m + 1) / m
            candidates = w[None, :] - phi[:, None] * direction[None, :]
            omega = np.minimum(losses(candidates, Z, s, config.objective, config.lam), config.c_obj).sum(1)  # line 10
            ledger.charge("noisy_max", rho_nmax)  # line 11
            scales.append(nmax_scale)
            i = noisy_argmin(omega, nmax_scale, rng)  # line 12
            if i > 0:  # lines 13-14
                w = candidates[i]
                chosen.append(phi[i])
                steps += 1
                if steps % config.update_every == 0:  # slides "NoisyMax implementation": r = 10
                    alpha_max = (1.0 + config.eta) * max(chosen)
                    chosen = []
                break
            rho_old, rho_new = rho_ng, (1.0 + config.gamma) * rho_ng  # lines 16-17
            if not ledger.can(rho_new - rho_old, rho_nmax):
                stop = True
                break
            noisy = grad_avg(rho_old, rho_new, g, noisy, config.c_grad, rng)  # line 18
            ledger.charge("gradavg", rho_new - rho_old)  # line 19
            rho_ng = rho_new
            if not ledger.can(rho_nmax):  # cannot select a step for the averaged gradient
                stop = True
                break
        if stop:
            break
    # Released at float32 precision like the other convex learners' outputs (convex.release_precision: the float64
    # iterate's low bits carry the noisy gradients' exact values, Mironov 2012); the checkpoint was float32 already.
    return AGDResult(w=release_precision(w), ledger=ledger, steps=steps, nmax_scales=scales, rho_ng_final=rho_ng)


def per_classifier_config(config: DPAGDConfig, classifiers: int) -> DPAGDConfig:
    """The config of each of ``classifiers`` one-vs-rest DP-AGD runs sharing the budget ρ: each gets
    ρ/K, so the K runs together are ρ-zCDP (zCDP composition, Bun & Steinke 2016, Lemma 1.7; every run
    sees every record, so the budgets add up); expressed as the ε_K whose ρ (slides Eq. (5)) is ρ/K."""
    import dataclasses

    if classifiers == 1:
        return config
    return dataclasses.replace(config, epsilon=epsilon_from_rho(config.rho / classifiers, config.delta))


def dpagd_claim(
    config: DPAGDConfig, result: AGDResult | list[AGDResult] | None, n: int, classifiers: int = 1
) -> dict[str, Any]:
    """The JSON-ready claim: the budget ρ as a ZCDP event, ε at δ by the zCDP accountant, and the ledger.

    ``classifiers`` K > 1: K one-vs-rest runs with :func:`per_classifier_config`; the claim is the sum of
    their budgets (K ρ_K, equal to ρ up to rounding, never below what was run)."""
    from dpaudit.accounting import epsilon_for

    sub = per_classifier_config(config, classifiers)
    event = ZCDP(config.rho if classifiers == 1 else classifiers * sub.rho)
    rho_nmax, rho_ng = initial_budgets(sub.epsilon, sub.delta, sub.splits, sub.c_grad)
    claim = {
        "epsilon": float(epsilon_for(event, config.delta, "zcdp")),
        "delta": config.delta,
        "accountant": "zcdp",
        "neighbouring": "add_remove",
        "event": event.to_dict(),
        "target_epsilon": config.epsilon,
        "rho_budget": config.rho,
        "rho_nmax": rho_nmax,
        "rho_ng_initial": rho_ng,
        "objective": config.objective,
        "clip": config.c_grad,
        "c_obj": config.c_obj,
        "l2": config.lam,
        "splits": config.splits,
        "gamma": config.gamma,
        "dataset_size": int(n),
        "analysis": DPAGD_ANALYSIS,
    }
    if classifiers > 1:
        claim["classifiers"] = classifiers
        claim["rho_per_classifier"] = sub.rho
        claim["analysis"] += (
            f" One-vs-rest: {classifiers} binary classifiers, each run with budget rho/{classifiers}; "
            "their sum is the claim (zCDP composition, Bun & Steinke 2016, Lemma 1.7)."
        )
    if isinstance(result, AGDResult):
        claim["ledger"] = result.ledger.totals()
        claim["steps"] = result.steps
    elif result is not None:
        claim["ledger"] = [r.ledger.totals() for r in result]
        claim["steps"] = [r.steps for r in result]
    return claim


class DPAGDTrainer(Trainer):
    """DP-AGD on the zoo's logreg model (binary labels): ``--epsilon``/``--delta`` the total budget,
    ``--clip`` C_grad, ``--l2`` λ, ``--steps`` the slides' "splits" (default 60)."""

    private = True
    batched = False  # full-batch gradients; its iterations are recorded in the claim ("steps", "ledger")
    objective: ClassVar[str]
    setting_for = no_builtin_audit

    def dpagd_config(self) -> DPAGDConfig:
        eps, delta = check_epsilon_only(self)
        return DPAGDConfig(
            epsilon=eps, delta=delta, c_grad=self.config.dp.clip, lam=float(self.config.weight_decay),
            objective=self.objective, splits=self.config.steps or 60,
        )  # fmt: skip

    def recorded_settings(self) -> dict[str, Any]:
        """The fields DP-AGD reads, with ``steps`` the splits it ran (60 when --steps was not given)."""
        return {**super().recorded_settings(), "steps": self.dpagd_config().splits}

    def fit(
        self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, progress: Progress = NULL_PROGRESS
    ) -> TrainOutcome:
        config = self.dpagd_config()
        X_np, y_np, n_classes = _arrays(model, X, y)
        Z, S = unit_ball_features(X_np), class_signs(y_np, n_classes)  # K > 2 classes: one-vs-rest
        k = S.shape[1]
        sub = per_classifier_config(config, k)
        rng = noise_rng(self.config.seed + 2, self.config.dp.secure_noise)
        with progress.task(f"train {self.name}", k) as advance:
            results = []
            for j in range(k):
                results.append(dpagd(Z, S[:, j], sub, rng))
                advance(1)
        load_logreg(model, np.stack([r.w for r in results]), n_classes)
        model.eval()
        if k == 1:
            claim = dpagd_claim(config, results[0], len(Z))
            return TrainOutcome(
                model=model, privacy=claim, history=[{"steps": results[0].steps, **claim["ledger"]["count"]}]
            )
        claim = dpagd_claim(config, results, len(Z), classifiers=k)
        return TrainOutcome(
            model=model, privacy=claim, history=[{"classifier": j, "steps": r.steps} for j, r in enumerate(results)]
        )


class DPAGDLogisticTrainer(DPAGDTrainer):
    name = "dpagd"
    objective = "logistic"


class DPAGDHuberTrainer(DPAGDTrainer):
    name = "dpagd-huber"
    objective = "huber"
