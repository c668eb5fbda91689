"""Input-space canaries for auditing: records built to be memorised, each included in training
with probability 1/2 so that their inclusion can be guessed from the trained model.

Kinds:
- ``mislabeled``: copies of auxiliary records with a wrong label (the label shifted by a random
  non-zero offset), as in the one-run audit of Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846, §6).
- ``outlier``: points far outside the data (a random direction at three times the largest
  standardised norm of the training data) with random labels.
- ``clipbkd``: ClipBKD (Jagielski, Ullman & Oprea 2020, arXiv:2006.07709, Alg. 2): a point along
  the training data's least-variance principal directions, scaled to the data's typical norm, with
  the least likely (least frequent) label.
- ``crafted``: input-space canaries crafted for the final-model (black-box) threat model from the
  public auxiliary split only (see :func:`craft_canaries`): in the least-variance subspace of the aux
  data at a large norm, so the canary's clipped gradient points where the data's gradients do not and
  its loss stays high (Annamalai & De Cristofaro 2024, arXiv:2405.14106; Yoon, Jeung & No 2024,
  arXiv:2412.01756). ``audit_training(..., init="adversarial")`` also starts every run from one fixed
  model pre-trained on the aux split (:func:`dpaudit.workflows.training.adversarial_init`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.budget import Cost, check_cost
from dpaudit.data import Dataset, Splits
from dpaudit.errors import InputError
from dpaudit.validation import check_choice, check_positive_int

CANARY_KINDS = ("mislabeled", "outlier", "clipbkd", "crafted")
# Norm of a crafted canary (standardised units) as a multiple of the largest aux norm; see craft_canaries.
CRAFTED_NORM_FACTOR = 4.0
CANARY_FILE = "canaries.npz"


@dataclass(frozen=True, eq=False)
class CanarySet:
    """``m`` canary records (raw feature space) and which of them were included in training."""

    kind: str
    X: np.ndarray
    y: np.ndarray
    included: np.ndarray
    seed: int

    def __len__(self) -> int:
        return len(self.y)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "m": len(self),
            "seed": self.seed,
            "n_included": int(self.included.sum()),
            "inclusion_probability": 0.5,
            "file": CANARY_FILE,
        }

    def arrays(self) -> dict[str, np.ndarray]:
        return {"X": self.X, "y": self.y, "included": self.included}

    @classmethod
    def load(cls, path: Path, meta: dict[str, Any]) -> CanarySet:
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls(meta["kind"], z["X"], z["y"], z["included"].astype(bool), int(meta["seed"]))
        except (OSError, KeyError, ValueError) as e:
            raise InputError(f"{path}: cannot read the canaries ({e})") from None


def make_canaries(dataset: Dataset, splits: Splits, *, m: int, kind: str, seed: int = 0) -> CanarySet:
    """Build ``m`` canaries of ``kind`` from the dataset and draw their inclusion (each w.p. 1/2)."""
    m = check_positive_int(canaries=m)
    check_choice(CANARY_KINDS, canary_kind=kind)
    # A canary is a record (float64 features, a label, an inclusion bit), copied a few times while built.
    check_cost(Cost("canaries", m, "canaries", bytes_per_unit=4 * 8 * (math.prod(dataset.feature_shape) + 2)))
    rng = np.random.default_rng([seed, 0xCA4A])
    k = dataset.n_classes
    if dataset.kind == "tokens" and kind != "mislabeled":
        raise InputError(f"canary kind {kind!r} needs real-valued features; use mislabeled for token data")
    if kind == "crafted":
        if len(splits.aux) == 0:
            raise InputError("crafted canaries are built from the public auxiliary split, which is empty")
        X, y = craft_canaries(dataset.X[splits.aux], dataset.y[splits.aux], m=m, n_classes=k, seed=seed)
    elif kind == "mislabeled":
        pool = splits.aux if len(splits.aux) else splits.holdout
        if len(pool) == 0:
            raise InputError("mislabeled canaries need an auxiliary (or holdout) split to copy records from")
        src = rng.choice(pool, size=m, replace=m > len(pool))
        X = dataset.X[src].copy()
        y = (dataset.y[src] + rng.integers(1, k, size=m)) % k
    else:
        train = dataset.X[splits.members].reshape(len(splits.members), -1).astype(np.float64)
        mean, std = train.mean(0), train.std(0)
        std = np.where(std > 1e-12, std, 1.0)
        Z = (train - mean) / std
        norms = np.linalg.norm(Z, axis=1)
        if kind == "outlier":
            d = rng.normal(size=(m, Z.shape[1]))
            d /= np.linalg.norm(d, axis=1, keepdims=True)
            Zc = d * 3.0 * norms.max()
            y = rng.integers(0, k, size=m)
        else:  # clipbkd: least-variance principal directions, data-typical norm, least frequent label
            _, _, Vt = np.linalg.svd(Z - Z.mean(0), full_matrices=False)
            low = Vt[::-1]  # rows from least to most variance
            dirs = low[np.arange(m) % len(low)] * rng.choice([-1.0, 1.0], size=(m, 1))
            Zc = dirs * np.median(norms)
            counts = np.bincount(dataset.y[splits.members], minlength=k)
            y = np.full(m, int(np.argmin(counts)))
        X = (Zc * std + mean).reshape((m, *dataset.feature_shape)).astype(dataset.X.dtype)
    included = rng.random(m) < 0.5  # drawn after the records: no record depends on the inclusion bits
    return CanarySet(kind, np.ascontiguousarray(X), y.astype(np.int64), included, seed)


def craft_canaries(
    X_aux: np.ndarray,
    y_aux: np.ndarray,
    *,
    m: int,
    n_classes: int,
    seed: int = 0,
    norm_factor: float = CRAFTED_NORM_FACTOR,
) -> tuple[np.ndarray, np.ndarray]:
    """``m`` crafted canaries (raw feature space) and their labels, from public records only.

    The audited pipelines standardise with the scaler fitted on the aux split, so the canaries are
    built in that standardised space:

    - direction: the principal directions of least variance of the aux records (ClipBKD's idea,
      Jagielski, Ullman & Oprea 2020, arXiv:2006.07709, Alg. 2, but from public data). For a linear
      layer the per-example gradient of (x, y) is (p(x) − e_y)(x, 1)ᵀ, so a data record's gradient
      has inner product (p_d − e_{y_d})·(p_c − e_{y_c})·(x_d·x_c + 1) with the canary's: ≈ 0 when x_c
      is orthogonal to the data. The canary's gradient points where the data's gradients do not
      (Annamalai & De Cristofaro 2024, arXiv:2405.14106), the input-space analogue of the Dirac
      gradient canary (Nasr et al. 2023, arXiv:2302.07956): only the noise and the canary move
      the logits at x_c.
    - norm: ``norm_factor`` × the largest aux norm. Per step, the clipped canary gradient moves its
      logit margin by ≈ ηC‖x‖/B and the noise by ≈ ησC‖x‖/B (DP-SGD, Abadi et al. 2016,
      arXiv:1607.00133, Alg. 1), so the signal-to-noise ratio does not depend on ‖x‖ as long as the
      gradient is clipped, i.e. ‖p − e_y‖·‖(x, 1)‖ ≥ C. A large norm keeps it clipped (a high-loss,
      large-gradient record, as Yoon, Jeung & No 2024, arXiv:2412.01756, seek) and makes the
      bias, which every record moves, negligible at x_c.
    - label: one the aux data do not support there: the least frequent aux label for one canary;
      for several, labels cycle in increasing aux frequency (canaries with different labels have
      small gradient inner products), and the directions are random unit vectors in the bottom
      k = min(m, d) principal subspace.

    Uses ``X_aux``, ``y_aux`` and ``seed`` only: never the members, the inclusion bits or a model.
    """
    m = check_positive_int(canaries=m)
    shape = np.asarray(X_aux).shape[1:]
    A = np.asarray(X_aux, dtype=np.float64).reshape(len(X_aux), -1)
    mean, std = A.mean(0), A.std(0)
    std = np.where(std > 1e-12, std, 1.0)  # as dpaudit.data.Standardizer: constant features pass through
    Z = (A - mean) / std
    _, _, Vt = np.linalg.svd(Z - Z.mean(0), full_matrices=True)  # full basis: exact null directions too
    low = Vt[::-1]  # rows from least to most variance
    radius = norm_factor * max(float(np.linalg.norm(Z, axis=1).max()), 1.0)
    rng = np.random.default_rng([seed, 0xC4AF])
    by_frequency = np.argsort(np.bincount(np.asarray(y_aux, dtype=np.int64), minlength=n_classes), kind="stable")
    if m == 1:
        dirs = low[:1] * rng.choice([-1.0, 1.0])
    else:
        k = min(m, len(low))
        dirs = rng.normal(size=(m, k)) @ low[:k]
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    y = by_frequency[np.arange(m) % n_classes]
    X = (dirs * radius * std + mean).reshape((m, *shape)).astype(np.asarray(X_aux).dtype)
    return np.ascontiguousarray(X), y.astype(np.int64)


def with_canaries(dataset: Dataset, splits: Splits, canaries: CanarySet) -> tuple[Dataset, np.ndarray, np.ndarray]:
    """The dataset with the canaries appended, the training indices (members plus included
    canaries) and the canaries' indices in the augmented dataset."""
    n = len(dataset)
    X = np.concatenate([dataset.X, canaries.X.astype(dataset.X.dtype)])
    y = np.concatenate([dataset.y, canaries.y])
    aug = Dataset(dataset.name, X, y, dataset.n_classes, dataset.kind, dataset.source, dataset.vocab_size)
    canary_idx = n + np.arange(len(canaries))
    train_idx = np.concatenate([splits.members, canary_idx[canaries.included]])
    return aug, train_idx, canary_idx


# The designs compared by :func:`crafted_row`: (canary kind, initialisation), today's first.
BLACKBOX_DESIGNS = (("mislabeled", "random"), ("clipbkd", "random"), ("crafted", "random"), ("crafted", "adversarial"))


def crafted_row(
    claimed_epsilon: float,
    *,
    designs: tuple[tuple[str, str], ...] = BLACKBOX_DESIGNS,
    runs: int = 200,
    delta: float = 1e-5,
    train_size: int = 200,
    epochs: int = 10,
    batch_size: int | None = None,
    lr: float = 1.0,
    seed: int = 0,
    workers: int = 1,
) -> dict[str, Any]:
    """Row (d) of the tightness table: black-box (final-model) multi-run audits of DP-SGD on digits at
    ``claimed_epsilon`` (δ = ``delta``), one per (canary kind, init) design, all at the same budget
    (``runs`` models with the canary and as many without, the same recipe and seeds).

    Recipe: logistic regression on ``train_size`` members, Poisson-sampled DP-SGD with σ calibrated to
    the claim, ``epochs`` epochs; ``batch_size`` None means full batch (q = 1), where the claim is
    exactly μ-GDP with μ = √T/σ (Dong, Roth & Su 2022, arXiv:1905.02383, Cor. 3.3) and a canary whose
    clipped gradient is orthogonal to the data's can reach it from the final model alone.

    Returns plain data: per design the formal Clopper–Pearson lower bound and its ratio to the claim,
    the threshold GDP estimate (not formal), the design's max certifiable ε, the IN/OUT AUC, the score separation
    μ̂ (IN/OUT mean difference over the pooled standard deviation: the μ of a Gaussian shift fitted to
    the scores, with its standard error) and its ε at ``delta`` (an estimate: assumes Gaussian scores),
    and the wall time in seconds (measure it on an idle machine). ``claim_mu``: the claim's μ, exact
    for q = 1 (√T/σ), else the CLT approximation (Bu et al. 2020, arXiv:1911.11607, "mu_CLT"). ``best`` names
    the design with the largest formal bound (ties: the largest μ̂).
    """
    import time

    from dpaudit.accounting.gdp import gdp_epsilon, gdp_mu_poisson_clt
    from dpaudit.audit import audit_scores
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import DPConfig, TrainConfig
    from dpaudit.workflows.training import audit_training

    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    # Full batch: q pinned to 1 on both neighbours (B/N would be 200/201 on the IN side).
    rate = 1.0 if batch_size is None else None
    dp = DPConfig(clip=1.0, target_epsilon=claimed_epsilon, delta=delta, sampling="poisson", sample_rate=rate)
    config = TrainConfig(algo="dpsgd", epochs=epochs, batch_size=batch_size or train_size, lr=lr, seed=seed, dp=dp)
    rows = []
    for kind, init in designs:
        t0 = time.perf_counter()
        d = audit_training(
            ds, spec, config, runs=runs, train_size=train_size, canary_kind=kind, init=init, delta=delta,
            claimed_epsilon=claimed_epsilon, seed=seed, workers=workers,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        gdp = audit_scores(d.scores, d.member, method="gdp", design="multi-run", delta=delta, seed=seed)
        mu, se = score_separation(d.scores, d.member)
        a, b = d.scores[d.member], d.scores[~d.member]
        auc = float((a[:, None] > b[None, :]).mean() + 0.5 * (a[:, None] == b[None, :]).mean())  # Mann–Whitney
        r = d.result
        rows.append({
            "canary_kind": kind,
            "init": init,
            "epsilon_lower_bound": r.epsilon_lower_bound,
            "ratio": r.epsilon_lower_bound / claimed_epsilon,
            "gdp_estimate": gdp.epsilon_lower_bound,
            "max_certifiable_epsilon": r.max_certifiable_epsilon,
            "auc": auc,
            "mu_hat": mu,
            "mu_se": se,
            "mu_epsilon_estimate": gdp_epsilon(max(mu, 0.0), delta),
            "verdict": r.verdict,
            "wall_s": wall,
        })  # fmt: skip
    best = max(rows, key=lambda x: (x["epsilon_lower_bound"], x["mu_hat"]))
    c = d.claim
    q, sigma, steps = c["sample_rate"], c["noise_multiplier"], c["steps"]
    claim_mu = float(np.sqrt(steps) / sigma) if q == 1.0 else gdp_mu_poisson_clt(q, sigma, steps)
    return {
        "row": "(d) black-box crafted canaries",
        "claimed_epsilon": float(claimed_epsilon),
        "delta": float(delta),
        "runs": runs,
        "recipe": {"train_size": train_size, "epochs": epochs, "batch_size": batch_size or train_size, "lr": lr},
        "claim_mu": claim_mu,
        "claim_mu_exact": q == 1.0,
        "designs": rows,
        "best": f"{best['canary_kind']}+{best['init']} init",
    }


def score_separation(scores: np.ndarray, member: np.ndarray) -> tuple[float, float]:
    """μ̂ = (mean IN − mean OUT) / pooled SD and its large-sample standard error
    √((n₁ + n₀)/(n₁n₀) + μ̂²/(2(n₁ + n₀))) (Hedges & Olkin 1985, "Statistical Methods for
    Meta-Analysis", ch. 5, the large-sample variance of the standardised mean difference). For two Gaussian score
    laws with equal variance, μ̂ estimates the μ of the μ-GDP trade-off between them (Dong, Roth &
    Su 2022, arXiv:1905.02383, Def. 2.4: G_μ = T(N(0, 1), N(μ, 1))). An estimate, not a bound."""
    scores, member = np.asarray(scores, dtype=np.float64), np.asarray(member, dtype=bool)
    a, b = scores[member], scores[~member]
    n1, n0 = len(a), len(b)
    pooled = np.sqrt(((n1 - 1) * a.var(ddof=1) + (n0 - 1) * b.var(ddof=1)) / (n1 + n0 - 2))
    diff = float(a.mean() - b.mean())
    if pooled == 0:  # degenerate: constant scores on each side
        return (math.copysign(math.inf, diff) if diff else 0.0), math.inf
    mu = diff / float(pooled)
    se = float(np.sqrt((n1 + n0) / (n1 * n0) + mu * mu / (2 * (n1 + n0))))
    return mu, se
