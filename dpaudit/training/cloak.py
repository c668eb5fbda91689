"""Cloak: a learned per-feature noise distribution in front of a frozen model (inference-time privacy).

Algorithm (Mireshghallah et al., "Shredder"/"Cloak", arXiv:2003.12154; seed
``lecture-dp-in-deep-learning-attacks-cloak-dpicl.txt``, "Cloak: Noisy Representation" and
"Cloak: Loss Function"):

1. The user sends ``x + r`` instead of ``x``, with ``r ~ N(mu, diag(sigma^2))``; ``mu`` and ``sigma``
   (one per input feature) are learned, the target model ``f`` stays frozen.
2. Loss (seed, "Cloak: Loss Function")::

       L = -log( (1/n) sum_i sigma_i^2 ) + lambda * E_{r ~ N(mu, sigma^2), x ~ D}[ CE(f(x + r), y) ]

   the expectation estimated with one reparameterised draw ``r = mu + sigma * eps`` per record
   (Kingma & Welling 2014, arXiv:1312.6114, Sec. 2.4), minimised with Adam on the training split.
3. ``sigma_i = cap_i * sigmoid(rho_i)`` with ``cap_i = sigma_cap * range_i`` (our choice): the loss is
   unbounded below in sigma (a feature the model ignores could take sigma -> infinity), so sigma is
   bounded; ``range_i = hi_i - lo_i`` over the training split. Constant features (range 0) get no noise:
   they carry no information. The privacy term reads sigma in units of each feature's range
   (``sigma_i / range_i``), so features on different scales are suppressed alike.
4. The frozen model is queried on a public post-processing of the release, the per-feature linear
   MMSE (Wiener) estimate ``c_i + k_i (x~_i - mu_i - c_i)``, ``k_i = s_i^2 / (s_i^2 + sigma_i^2)``, with
   ``c_i``, ``s_i`` the feature's mean and standard deviation on the training split (Kay 1993,
   "Fundamentals of Statistical Signal Processing: Estimation Theory", Sec. 12.3, scalar case; our
   choice). It changes no privacy (post-processing) but lets a drowned feature reach the model as its
   mean instead of as loud noise the model was never trained on: without it, a feature the label does
   not depend on could not be suppressed without breaking the model, and no lambda found a useful
   operating point (issue 28: suppression 0.03 at accuracy 0.80 on digits).

A small lambda favours the privacy term (more noise, lower accuracy), a large lambda the task;
:func:`knee` marks the sweep's operating point.

What a cloak claims and what it does not: Cloak states *suppression* (how many features are drowned in
noise), not an epsilon. :func:`local_dp_reading` reads each released feature as a Gaussian mechanism
with sensitivity = the feature's range (inputs are clipped to the training bounds before the noise, so
the sensitivity is exact), which is a formal local-DP guarantee for *one* release of a record; it is
typically enormous, because the features the task needs keep small sigma.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dpaudit.errors import CheckpointError, InputError
from dpaudit.fileio import check_input_file, check_output_dir, load_safetensors, write_atomic_dir
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.validation import check_in_interval, check_positive, check_positive_int, read_json

CLOAK_SCHEMA_VERSION = 1
CLOAK_FILE = "cloak.json"
CLOAK_TENSORS = "cloak.safetensors"
CURVE_JSON = "curve.json"
CURVE_CSV = "curve.csv"
SIGMA_PNG = "sigma.png"
TENSOR_NAMES = ("mu", "sigma", "lo", "hi")
CURVE_COLUMNS = (
    "lambda",
    "suppression_ratio",
    "clean_accuracy",
    "cloaked_accuracy",
    "accuracy_loss",
    "composed_epsilon",
    "median_feature_epsilon",
)


@dataclass(frozen=True)
class CloakConfig:
    """How a cloak is trained and read.

    ``lam``: the weight lambda of the task loss (> 0). ``sigma_cap``: sigma_i <= sigma_cap * range_i.
    ``threshold``: a feature counts as suppressed when sigma_i >= threshold * range_i (default 1: the noise's
    standard deviation is at least the feature's whole span). ``eval_draws``: noise draws per test record
    when measuring cloaked accuracy. ``delta``: delta of the local-DP reading.
    """

    lam: float
    epochs: int = 30
    batch_size: int = 64
    lr: float = 0.1
    seed: int = 0
    sigma_cap: float = 4.0
    threshold: float = 1.0
    init_sigma: float = 0.05  # initial sigma / cap
    eval_draws: int = 5
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if isinstance(self.lam, bool) or not isinstance(self.lam, int | float) or not 0 < self.lam < math.inf:
            raise InputError(f"expected a finite lambda > 0, got {self.lam!r}")
        check_positive_int(epochs=self.epochs)
        check_positive_int(batch_size=self.batch_size)
        check_positive(finite=True, lr=self.lr)
        check_positive(sigma_cap=self.sigma_cap)
        check_positive(threshold=self.threshold)
        check_in_interval(0.0, 1.0, init_sigma=self.init_sigma)
        check_positive_int(eval_draws=self.eval_draws)
        check_in_interval(0.0, 1.0, delta=self.delta)


def parse_lambdas(values: Sequence[str] | str) -> tuple[float, ...]:
    """``--lambda 1 --lambda 0.1`` or ``--lambda 1,0.1`` -> (1.0, 0.1); each must be > 0, no repeats."""
    if isinstance(values, str):
        values = [values]
    out: list[float] = []
    for v in values:
        for part in str(v).split(","):
            if not part.strip():
                continue
            try:
                lam = float(part)
            except ValueError:
                raise InputError(f"expected --lambda as numbers > 0, got {part.strip()!r}") from None
            if not (math.isfinite(lam) and lam > 0):
                raise InputError(f"expected --lambda > 0, got {part.strip()}")
            out.append(lam)
    if not out:
        raise InputError("--algo cloak needs --lambda L (one or more values > 0)")
    if len(set(out)) != len(out):
        raise InputError(f"--lambda values repeat: {', '.join(f'{v:g}' for v in out)}")
    return tuple(out)


# --------------------------------------------------------------------------- the cloak itself


@dataclass(frozen=True, eq=False)
class Cloak:
    """A trained cloak: ``mu``, ``sigma`` and the feature bounds ``lo``, ``hi`` (float32, feature-shaped),
    plus ``meta`` (what ``cloak.json`` holds: lambda, target reference, config, metrics)."""

    mu: np.ndarray
    sigma: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    meta: dict[str, Any]

    @property
    def lam(self) -> float:
        return float(self.meta["lambda"])

    @property
    def feature_range(self) -> np.ndarray:
        """hi_i - lo_i, the sensitivity of feature i after clipping (module docstring): subtracted in float64,
        where the difference of two float32 values is exact; the float32 subtraction rounded it, down for
        some features, and the local-DP reading under-reported epsilon by up to ~6e-8 relative."""
        return self.hi.astype(np.float64) - self.lo.astype(np.float64)

    @property
    def informative(self) -> np.ndarray:
        """Features that vary on the training split (range > 0); constant ones carry no information."""
        return self.feature_range > 0

    def relative_sigma(self) -> np.ndarray:
        """sigma_i / range_i (inf where sigma > 0 on a constant feature, 0 where both are 0)."""
        r = self.feature_range
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(r > 0, self.sigma / np.where(r > 0, r, 1.0), np.where(self.sigma > 0, np.inf, 0.0))


def apply_cloak(cloak: Cloak, X: np.ndarray, *, seed: int | np.random.Generator | None = 0) -> np.ndarray:
    """Cloaked records: ``clip(x, lo, hi) + mu + sigma * eps``, eps ~ N(0, I) (seed, "Cloak: Noisy
    Representation"). Clipping to the training bounds makes each feature's sensitivity exactly its range,
    which :func:`local_dp_reading` relies on. Returns float32 of ``X``'s shape."""
    X = np.asarray(X, np.float32)
    if X.shape[1:] != cloak.mu.shape:
        raise InputError(f"records have feature shape {X.shape[1:]}, the cloak expects {cloak.mu.shape}")
    rng = np.random.default_rng(seed)
    eps = rng.standard_normal(X.shape)
    return (np.clip(X, cloak.lo, cloak.hi) + cloak.mu + cloak.sigma * eps).astype(np.float32)


def cloak_loss(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    mu: torch.Tensor,
    sigma: torch.Tensor,
    noise: torch.Tensor,
    lam: float,
    scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Cloak objective on a batch with a given standard-normal draw ``noise`` (same shape as ``x``).

    Returns (loss, privacy term, task term). Seed "Cloak: Loss Function":
    L = -log((1/n) sum_i sigma_i^2) + lambda * mean_batch CE(f(x + mu + sigma * noise), y).
    ``scale``: the privacy term reads sigma_i / scale_i (per-feature units; module docstring, step 3).
    """
    rel = sigma if scale is None else sigma / scale
    privacy = -torch.log(torch.mean(rel * rel))  # -log((1/n) sum_i sigma_i^2), n = number of features
    r = mu + sigma * noise  # reparameterised r ~ N(mu, sigma^2) (Kingma & Welling 2014, Sec. 2.4)
    task = F.cross_entropy(logits_fn(x + r), y)  # one draw per record: a Monte Carlo estimate of E[CE]
    return privacy + lam * task, privacy, task


def frozen_logits(run: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The target's logits on RAW features as a torch function (its preprocessing applied inside, as
    torch ops so gradients reach the input); the model's parameters are frozen."""
    import copy

    model = copy.deepcopy(run.model).to("cpu").float().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    pre = run.preprocessing
    if hasattr(pre, "mean"):
        mean = torch.as_tensor(np.asarray(pre.mean, np.float32))
        scale = torch.as_tensor(np.asarray(pre.scale, np.float32))
    else:
        mean, scale = torch.zeros(()), torch.ones(())

    def logits(x: torch.Tensor) -> torch.Tensor:
        return model((x - mean) / scale)

    return logits


def weights_sha256(run_path: Path) -> str:
    from dpaudit.checkpoint import WEIGHTS_FILE

    return hashlib.sha256((Path(run_path) / WEIGHTS_FILE).read_bytes()).hexdigest()


def load_target(target: Path | str | None):
    """The frozen target run of a cloak; InputError when missing or not a dpaudit run."""
    from dpaudit.checkpoint import load_run
    from dpaudit.errors import CheckpointError as _CE

    if target is None:
        raise InputError("--algo cloak needs --target RUN (the frozen model's run directory)")
    path = Path(target)
    if not path.exists():
        raise InputError(f"--target {path}: no such run directory")
    if (path / CLOAK_FILE).is_file():
        raise InputError(f"--target {path}: is a cloak checkpoint, not a model run")
    try:
        run = load_run(path)
    except _CE as e:
        raise InputError(f"--target {path}: not a dpaudit run ({str(e).splitlines()[0]})") from None
    if run.dataset().kind == "tokens":
        raise InputError(
            f"--target {path}: Cloak learns Gaussian noise added to real-valued input features, and token ids are "
            "discrete (noise on an id is no token): refused for token data; train the model over tokens with "
            "--algo dpsgd or dpadam for a privacy guarantee"
        )
    return run


def wiener_gain(sigma, scale):
    """k_i = s_i^2 / (s_i^2 + sigma_i^2) (module docstring, step 4); 1 where both are 0 (constant feature)."""
    s2 = scale * scale
    den = s2 + sigma * sigma
    if isinstance(den, torch.Tensor):
        return torch.where(den > 0, s2 / torch.where(den > 0, den, torch.ones_like(den)), torch.ones_like(den))
    return np.where(den > 0, s2 / np.where(den > 0, den, 1.0), 1.0)


def denoise(cloak: Cloak, released: np.ndarray) -> np.ndarray:
    """What the target model is given: the public per-feature Wiener estimate c + k (x~ - mu - c) of a
    release (post-processing; module docstring, step 4). A cloak saved without a denoiser: the release."""
    d = cloak.meta.get("denoiser")
    if d is None:
        return released
    shape = cloak.mu.shape
    c = np.asarray(d["center"], np.float64).reshape(shape)
    k = wiener_gain(cloak.sigma.astype(np.float64), np.asarray(d["scale"], np.float64).reshape(shape))
    return (c + k * (np.asarray(released, np.float64) - cloak.mu - c)).astype(np.float32)


def _fit(run: Any, X: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray, config: CloakConfig, progress):
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    target = frozen_logits(run)
    center = torch.as_tensor(X.mean(axis=0), dtype=torch.float32)
    spread = torch.as_tensor(X.std(axis=0), dtype=torch.float32)
    cap = torch.as_tensor(config.sigma_cap * (hi - lo), dtype=torch.float32)
    feature_range = torch.as_tensor(np.where(hi > lo, hi - lo, 1.0), dtype=torch.float32)
    x_all = torch.as_tensor(X, dtype=torch.float32)
    y_all = torch.as_tensor(y, dtype=torch.long)
    mu = torch.zeros(X.shape[1:], requires_grad=True)
    init = math.log(config.init_sigma / (1.0 - config.init_sigma))  # sigmoid(rho) = init_sigma
    rho = torch.full(X.shape[1:], init, requires_grad=True)
    opt = torch.optim.Adam([mu, rho], lr=config.lr)
    n = len(X)
    history = []
    with progress.task(f"cloak lambda={config.lam:g}", config.epochs) as advance:
        for epoch in range(config.epochs):
            history.append(_epoch(epoch, n, gen, x_all, y_all, cap, mu, rho, opt, target, center, spread,
                                  feature_range, config))  # fmt: skip
            advance(1)
    with torch.no_grad():
        sigma = (cap * torch.sigmoid(rho)).numpy().astype(np.float32)
    return mu.detach().numpy().astype(np.float32), sigma, history


def _epoch(epoch, n, gen, x_all, y_all, cap, mu, rho, opt, target, center, spread, feature_range, config):
    """One pass over the training split in shuffled batches, one fresh noise draw per record."""
    perm = torch.randperm(n, generator=gen)
    tot = [0.0, 0.0, 0.0]
    for s in range(0, n, config.batch_size):
        idx = perm[s : s + config.batch_size]
        xb = x_all[idx]
        noise = torch.randn(xb.shape, generator=gen)
        sigma = cap * torch.sigmoid(rho)  # bounded positive parameterisation (module docstring, step 3)
        gain = wiener_gain(sigma, spread)

        def logits(released, gain=gain):  # the model sees the Wiener estimate of the release (step 4)
            return target(center + gain * (released - mu - center))

        loss, priv, task = cloak_loss(logits, xb, y_all[idx], mu, sigma, noise, config.lam, scale=feature_range)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for i, v in enumerate((loss, priv, task)):
            tot[i] += float(v.detach()) * len(idx)
    return {"epoch": epoch + 1, "loss": tot[0] / n, "privacy_term": tot[1] / n, "task_term": tot[2] / n}


def local_dp_reading(cloak: Cloak, delta: float = 1e-5) -> dict[str, Any]:
    """Each released feature read as a Gaussian mechanism with sensitivity = its range (inputs clipped to
    the training bounds): noise multiplier z_i = sigma_i / range_i, i.e. (1/z_i)-GDP, and all features of
    one record together sqrt(sum_i 1/z_i^2)-GDP (Dong, Roth & Su 2022, Thm. 2.7 and Cor. 3.3), converted
    to (epsilon, delta) exactly (ibid. Cor. 2.13) by :mod:`dpaudit.accounting`'s GDP accountant.

    Formal guarantee: local DP of ONE cloaked release of a record (k releases with fresh noise compose to
    sqrt(k) times the GDP mu). Constant features (range 0) are left out: they carry nothing.
    """
    from dpaudit.accounting import epsilon_for, make_accountant
    from dpaudit.events import Gaussian

    check_in_interval(0.0, 1.0, delta=delta)
    rel = cloak.relative_sigma().ravel()
    informative = cloak.informative.ravel()
    per = np.zeros(rel.shape)  # constant features: epsilon 0
    acc = make_accountant("gdp")
    for i in np.flatnonzero(informative):
        event = Gaussian(float(rel[i]))  # sensitivity = range_i, so noise multiplier = sigma_i / range_i
        per[i] = epsilon_for(event, delta, "gdp")
        acc.compose(event)
    eps_inf = [float(e) for e in per[informative]]
    composed = float(acc.epsilon(delta)) if informative.any() else 0.0
    return {
        "delta": float(delta),
        "formal": True,
        "what": "local DP of one cloaked release of a record: each feature a Gaussian mechanism with "
        "sensitivity = its training range (inputs clipped), composed over features (GDP, exact)",
        "n_features": int(informative.sum()),
        "per_feature_epsilon": [float(e) for e in per],
        "min_feature_epsilon": float(np.min(eps_inf)) if eps_inf else 0.0,
        "median_feature_epsilon": float(np.median(eps_inf)) if eps_inf else 0.0,
        "max_feature_epsilon": float(np.max(eps_inf)) if eps_inf else 0.0,
        "composed_mu": float(acc.mu) if informative.any() else 0.0,
        "composed_epsilon": composed,
    }


def suppression_ratio(cloak: Cloak, threshold: float) -> float:
    """Fraction of the informative features (range > 0) with sigma_i >= threshold * range_i."""
    inf = cloak.informative
    if not inf.any():
        return 0.0
    return float(np.mean(cloak.relative_sigma()[inf] >= threshold))


def cloaked_accuracy(cloak: Cloak, run: Any, X: np.ndarray, y: np.ndarray, *, draws: int, seed: int) -> float:
    """Target accuracy on cloaked ``X``, averaged over ``draws`` independent noise draws."""
    rng = np.random.default_rng(seed)
    accs = [
        float(np.mean(run.logits(denoise(cloak, apply_cloak(cloak, X, seed=rng))).argmax(1) == y)) for _ in range(draws)
    ]
    return float(np.mean(accs))


def evaluate_cloak(cloak: Cloak, run: Any, *, threshold: float, draws: int, delta: float, seed: int) -> dict:
    """Suppression, clean and cloaked accuracy of the target on its test split, and the local-DP reading."""
    ds = run.dataset()
    X, y = np.asarray(ds.X, np.float32), np.asarray(ds.y)
    t = run.splits.test
    clean = float(np.mean(run.logits(X[t]).argmax(1) == y[t]))
    cloaked = cloaked_accuracy(cloak, run, X[t], y[t], draws=draws, seed=seed + 1)
    ldp = local_dp_reading(cloak, delta)
    return {
        "suppression_ratio": suppression_ratio(cloak, threshold),
        "suppression_threshold": float(threshold),
        "clean_accuracy": clean,
        "cloaked_accuracy": cloaked,
        "accuracy_loss": clean - cloaked,
        "n_test": len(t),
        "mean_relative_sigma": float(np.mean(np.minimum(cloak.relative_sigma()[cloak.informative], 1e300))),
        "local_dp": {k: v for k, v in ldp.items() if k != "per_feature_epsilon"},
    }


def train_cloak(run: Any, config: CloakConfig, *, progress: Progress = NULL_PROGRESS) -> Cloak:
    """Learn mu and sigma for the frozen target ``run`` (a loaded run) on its training split; evaluated on
    its test split. Returns the cloak (not saved; see :func:`save_cloak`)."""
    if len(run.splits.test) == 0:  # was: "internal error: ValueError: attempt to get argmax of an empty sequence"
        raise InputError(
            f"--target {run.path}: the run's test split is empty, and a cloak's clean and cloaked accuracy are "
            "measured on it; retrain the target with a test fraction above 0 (--split)"
        )
    ds = run.dataset()
    X, y = np.asarray(ds.X, np.float32), np.asarray(ds.y)
    train = run.splits.members
    lo, hi = X[train].min(axis=0), X[train].max(axis=0)  # the feature bounds (training split)
    if not np.any(hi > lo):
        raise InputError(f"{run.path}: every feature is constant on the training split; nothing to cloak")
    # torch's global generator seeded for the fit (a target whose forward draws from it), then restored: a bare
    # torch.manual_seed here reset a notebook's own generator to the cloak's seed, so its later draws repeated.
    with torch.random.fork_rng(devices=[]):
        mu, sigma, history = _fit(run, X[train], y[train], lo, hi, config, progress)
    meta: dict[str, Any] = {
        "kind": "cloak",
        "schema_version": CLOAK_SCHEMA_VERSION,
        "lambda": float(config.lam),
        "config": asdict(config),
        "target": {
            # As given (like a run's data spec): resolved, the cloak.json of the same command differed with the
            # folder the project lives in (non-negotiable 7); the weights' hash identifies the model.
            "path": str(run.path),
            "weights_sha256": weights_sha256(run.path),
            "data": run.meta["data"]["spec"],
            "data_sha256": run.meta["data"]["sha256"],
            "model": run.meta["model"]["kind"],
        },
        "feature_shape": list(X.shape[1:]),
        "bounds": {
            "from": "members split (min, max per feature)",
            "lo": lo.ravel().tolist(),
            "hi": hi.ravel().tolist(),
        },
        "parameterisation": f"sigma_i = {config.sigma_cap:g} * range_i * sigmoid(rho_i)",
        "denoiser": {
            "what": "the model is given c + k (x~ - mu - c), k = scale^2 / (scale^2 + sigma^2) (Wiener estimate)",
            "from": "members split (mean, standard deviation per feature)",
            "center": X[train].mean(axis=0).ravel().astype(np.float64).tolist(),
            "scale": X[train].std(axis=0).ravel().astype(np.float64).tolist(),
        },
        "history": history,
    }
    cloak = Cloak(mu=mu, sigma=sigma, lo=lo.astype(np.float32), hi=hi.astype(np.float32), meta=meta)
    meta["metrics"] = evaluate_cloak(
        cloak, run, threshold=config.threshold, draws=config.eval_draws, delta=config.delta, seed=config.seed
    )
    return cloak


# --------------------------------------------------------------------------- files


def _write_cloak(directory: Path, cloak: Cloak, figure: Callable[[Cloak], bytes | None] | None) -> None:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(getattr(cloak, k), np.float32) for k in TENSOR_NAMES}, str(directory / CLOAK_TENSORS)
    )
    (directory / CLOAK_FILE).write_text(json.dumps(cloak.meta, indent=2, sort_keys=True) + "\n")
    png = figure(cloak) if figure is not None else None
    if png:
        (directory / SIGMA_PNG).write_bytes(png)


def save_cloak(out: Path | str, cloak: Cloak, *, force: bool = False, figure=None) -> Path:
    """Write a cloak checkpoint directory atomically: ``cloak.safetensors`` (mu, sigma, lo, hi) and
    ``cloak.json``; ``figure(cloak)`` may add ``sigma.png`` (PNG bytes, or None)."""
    return write_atomic_dir(Path(out), lambda tmp: _write_cloak(tmp, cloak, figure), force=force, written_by="cloak")


def load_cloak(path: Path | str) -> Cloak:
    """Read a cloak checkpoint (safetensors + JSON, never pickle), checking names and shapes."""
    from safetensors import SafetensorError

    path = Path(path)
    f = path / CLOAK_FILE
    if f.exists() or f.is_symlink():
        check_input_file(f, error=CheckpointError)  # a pipe or a device in place of cloak.json: said, never read
    else:
        raise CheckpointError(f"{path}: not a cloak checkpoint (no {CLOAK_FILE})")
    meta = read_json(f, error=CheckpointError)  # size, depth and number limits
    if not isinstance(meta, dict) or meta.get("kind") != "cloak":
        raise CheckpointError(
            f"{f}: not a cloak checkpoint (kind {meta.get('kind') if isinstance(meta, dict) else None!r})"
        )
    if meta.get("schema_version") != CLOAK_SCHEMA_VERSION:
        raise CheckpointError(f"{f}: unknown schema_version {meta.get('schema_version')!r}")
    try:
        tensors = load_safetensors(path / CLOAK_TENSORS, "numpy")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path / CLOAK_TENSORS}: missing or corrupt ({e})") from None
    shape = tuple(meta.get("feature_shape", ()))
    for k in TENSOR_NAMES:
        if k not in tensors or tuple(tensors[k].shape) != shape:
            raise CheckpointError(f"{path / CLOAK_TENSORS}: expected tensor {k} of shape {list(shape)}")
    return Cloak(**{k: tensors[k].astype(np.float32) for k in TENSOR_NAMES}, meta=meta)


def cloak_target(cloak: Cloak, target: Path | str | None = None):
    """Load the cloak's target run (its recorded path unless ``target``), checking the weights' hash. The path
    is recorded as ``--target`` was given: a relative one is relative to the directory the cloak was trained in."""
    run = load_target(target if target is not None else cloak.meta["target"]["path"])
    if weights_sha256(run.path) != cloak.meta["target"]["weights_sha256"]:
        raise InputError(f"{run.path}: not the model this cloak was trained for (weights hash differs)")
    return run


def cloak_summary(cloak: Cloak) -> dict[str, Any]:
    """The stable summary printed by ``dpaudit inspect --json`` on a cloak checkpoint."""
    m = cloak.meta["metrics"]
    t = cloak.meta["target"]
    return {
        "kind": "cloak",
        "schema_version": cloak.meta["schema_version"],
        "lambda": cloak.lam,
        "suppression_ratio": m["suppression_ratio"],
        "suppression_threshold": m["suppression_threshold"],
        "accuracy_loss": m["accuracy_loss"],
        "clean_accuracy": m["clean_accuracy"],
        "cloaked_accuracy": m["cloaked_accuracy"],
        "composed_epsilon": m["local_dp"]["composed_epsilon"],
        "median_feature_epsilon": m["local_dp"]["median_feature_epsilon"],
        "delta": m["local_dp"]["delta"],
        "target": t["path"],
        "target_weights_sha256": t["weights_sha256"],
        "data": t["data"],
        "feature_shape": cloak.meta["feature_shape"],
    }


def curve_row(cloak: Cloak) -> dict[str, float]:
    m = cloak.meta["metrics"]
    ldp = m["local_dp"]
    vals = (cloak.lam, m["suppression_ratio"], m["clean_accuracy"], m["cloaked_accuracy"], m["accuracy_loss"])
    return dict(zip(CURVE_COLUMNS, (*vals, ldp["composed_epsilon"], ldp["median_feature_epsilon"]), strict=True))


def knee(rows: Sequence[dict[str, float]]) -> float | None:
    """The lambda at the knee of the trade-off curve (suppression against accuracy loss): the point farthest
    above the chord between the curve's two ends, both axes scaled to [0, 1] ("Kneedle", Satopaa, Albrecht,
    Irwin & Raghavan 2011, ICDCS workshops, Sec. III, difference curve). None with fewer than three rows."""
    if len(rows) < 3:
        return None
    pts = sorted(rows, key=lambda r: (r["accuracy_loss"], r["suppression_ratio"]))
    x = np.array([r["accuracy_loss"] for r in pts], np.float64)
    y = np.array([r["suppression_ratio"] for r in pts], np.float64)
    xs = (x - x[0]) / (x[-1] - x[0]) if x[-1] > x[0] else np.zeros_like(x)
    ys = (y - y.min()) / (y.max() - y.min()) if y.max() > y.min() else np.zeros_like(y)
    chord = ys[0] + (ys[-1] - ys[0]) * xs
    return float(pts[int(np.argmax(ys - chord))]["lambda"])


def lambda_dirname(lam: float) -> str:
    return f"lambda_{lam:g}"


def train_cloak_sweep(
    target: Path | str | None,
    lambdas: Sequence[float],
    *,
    out: Path | str,
    base: CloakConfig | None = None,
    force: bool = False,
    figure: Callable[[Cloak], bytes | None] | None = None,
    progress: Progress = NULL_PROGRESS,
    notify: Callable[[str], None] | None = None,
) -> list[Cloak]:
    """Train one cloak per lambda for the frozen ``target`` run and save them atomically.

    ``notify`` receives the "training …" line once the output folder and the target are checked (before, the
    CLI printed it ahead of refusing a --target that is no run).

    One lambda: ``out`` is the cloak checkpoint. Several: ``out/lambda_<L>/`` each, with the
    privacy/utility curve beside them in ``out/curve.json`` and ``out/curve.csv`` (one row per lambda).
    """
    import dataclasses

    lambdas = parse_lambdas([repr(v) if isinstance(v, float) else str(v) for v in lambdas])
    out = Path(out)
    check_output_dir(out, force=force, inputs=[target])  # fail before training
    run = load_target(target)
    if notify is not None:
        notify(f"training {len(lambdas)} cloak(s) for {target} …")
    base = base or CloakConfig(lam=lambdas[0])
    cloaks = [train_cloak(run, dataclasses.replace(base, lam=float(lam)), progress=progress) for lam in lambdas]
    if len(cloaks) == 1:
        save_cloak(out, cloaks[0], force=force, figure=figure)
        return cloaks
    rows = [curve_row(c) for c in cloaks]

    def write(tmp: Path) -> None:
        for c in cloaks:
            _write_cloak(tmp / lambda_dirname(c.lam), c, figure)
        curve = {"target": cloaks[0].meta["target"], "columns": list(CURVE_COLUMNS), "rows": rows, "knee": knee(rows)}
        (tmp / CURVE_JSON).write_text(json.dumps(curve, indent=2) + "\n")
        text = io.StringIO()
        w = csv.writer(text, lineterminator="\n")
        w.writerow(CURVE_COLUMNS)
        for r in rows:
            w.writerow([repr(float(r[k])) for k in CURVE_COLUMNS])
        (tmp / CURVE_CSV).write_text(text.getvalue())

    write_atomic_dir(out, write, force=force, inputs=[target], written_by="cloak")
    return cloaks


__all__ = [
    "Cloak",
    "CloakConfig",
    "apply_cloak",
    "cloak_loss",
    "cloak_option",
    "cloak_summary",
    "cloak_target",
    "denoise",
    "load_cloak",
    "local_dp_reading",
    "parse_lambdas",
    "save_cloak",
    "train_cloak",
    "train_cloak_sweep",
]


def cloak_option(text: str) -> dict[str, Any]:
    """``--cloak PATH|LAMBDA``: an existing cloak checkpoint -> {"cloak": path}; a number > 0 -> {"lambda": L}."""
    path = Path(text)
    if path.exists():
        if not (path / CLOAK_FILE).is_file():
            raise InputError(f"--cloak {text}: not a cloak checkpoint (no {CLOAK_FILE})")
        return {"cloak": str(path)}
    try:
        lam = float(text)
    except ValueError:
        raise InputError(f"--cloak {text}: no such cloak checkpoint, and not a λ > 0") from None
    return {"lambda": CloakConfig(lam=lam).lam}
