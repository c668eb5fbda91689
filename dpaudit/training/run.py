"""Train a model on a dataset split and save it as a run directory (checkpoint)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from dpaudit import numfmt
from dpaudit.budget import check_cost, check_model_size, training_cost
from dpaudit.canaries import CANARY_FILE, CanarySet, with_canaries
from dpaudit.checkpoint import SCHEMA_VERSION, as_saved, predict_logits, save_run, versions
from dpaudit.data import (
    DEFAULT_FRACTIONS,
    SYNTHETIC_TOKENS,
    Dataset,
    Identity,
    Splits,
    Standardizer,
    fit_preprocessing,
    make_splits,
    preprocessing_from_dict,
)
from dpaudit.errors import CheckpointError, InputError
from dpaudit.fileio import check_output_dir
from dpaudit.models import (
    ModelSpec,
    ParameterWatch,
    build_model,
    check_per_record_in_training,
    check_private_layers,
)
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.algorithms import get_trainer
from dpaudit.training.base import StreamedFeatures, Trainer, TrainOutcome
from dpaudit.training.config import PerfConfig, TrainConfig, resolve_device, settings_read
from dpaudit.training.dirac import WHITEBOX_FILE, DiracCanaries
from dpaudit.user_code import first_line


@dataclass
class FittedModel:
    """A model trained on ``train_idx`` of a dataset, with its preprocessing."""

    outcome: TrainOutcome
    preprocessing: Any
    device: torch.device
    whitebox_scores: np.ndarray | None = None  # scores of white-box Dirac canaries, when trained with them

    @property
    def model(self) -> torch.nn.Module:
        return self.outcome.model

    def logits(self, X: np.ndarray, advance=None) -> np.ndarray:
        """Logits on raw features (an array or a lazy ``dataset.view(idx)``), preprocessed per batch
        (``advance``: a progress task's callback, :func:`~dpaudit.checkpoint.predict_logits`)."""
        return predict_logits(self.model, X, transform=self.preprocessing.transform, advance=advance)


def _tensors(
    dataset: Dataset, idx: np.ndarray, pre, device: torch.device, trainer: Trainer
) -> tuple[torch.Tensor | StreamedFeatures, torch.Tensor]:
    """The training split for ``trainer``: streamed batch by batch from a memory-mapped dataset when
    the trainer can take it (:attr:`Trainer.streams`), one preprocessed tensor otherwise."""
    y = torch.as_tensor(dataset.y[idx], device=device)
    if dataset.mapped is not None and trainer.streams:
        return StreamedFeatures(dataset, idx, pre, device), y
    # In-memory rows as stored: the preprocessing makes 8-bit pixels float32 as it standardises them (exactly), so
    # the split is one float32 array, not float32 rows and then their standardised copy (2 x 215 MB for 17,500
    # CIFAR images).
    raw = dataset.X[idx] if dataset.mapped is None and dataset.appended is None else dataset.rows(idx)
    X = torch.as_tensor(np.asarray(pre.transform(raw)), device=device)  # fresh: no second copy
    if dataset.mapped is not None and X.is_floating_point():
        X = X.float()  # a mapped X keeps the file's float dtype until here
    return X, y


def default_trainer(config: TrainConfig, perf: PerfConfig) -> Trainer:
    """The registered trainer of ``config.algo``, or its JAX twin for ``perf.backend == "jax"``
    (imported only then: JAX is an optional extra; without it this is an InputError naming the
    pip command)."""
    if perf.backend == "jax":
        from dpaudit.training.jax_backend import JaxTrainer

        return JaxTrainer(config, perf)
    return get_trainer(config.algo)(config, perf)


def fit_model(
    dataset: Dataset,
    train_idx: np.ndarray,
    spec: ModelSpec,
    config: TrainConfig,
    perf: PerfConfig | None = None,
    *,
    progress: Progress = NULL_PROGRESS,
    preprocessing_idx: np.ndarray | None = None,
    preprocessing: Standardizer | Identity | None = None,
    trainer: Trainer | None = None,
    whitebox: DiracCanaries | None = None,
    init_state: dict[str, np.ndarray] | None = None,
) -> FittedModel:
    """Fit preprocessing on ``train_idx`` (or ``preprocessing_idx``) unless a fixed ``preprocessing``
    is given, build the model from ``config.seed`` and train it (with ``trainer``, default: the
    registered trainer of ``config.algo``). ``init_state``: a fixed initial state dict used instead of
    the seeded initialisation (e.g. an audit's adversarial init; the same for every run).

    This is the one training entry point: target models, shadow and reference models all use it.
    Deterministic on CPU: same inputs and seed give bit-identical weights.
    """
    perf = perf or PerfConfig()
    trainer = trainer if trainer is not None else default_trainer(config, perf)
    train_idx = np.asarray(train_idx, dtype=np.int64)
    if len(train_idx) == 0:
        raise InputError("the training split is empty")
    if trainer.batched and config.batch_size > len(train_idx):
        raise InputError(f"batch size {config.batch_size} is larger than the training set ({len(train_idx)} records)")
    # The JAX backend places its own arrays (PerfConfig.device); the torch side stays on the CPU.
    device = resolve_device(perf.device) if perf.backend == "torch" else torch.device("cpu")
    pre = preprocessing
    if pre is None:
        pre = fit_preprocessing(dataset, train_idx if preprocessing_idx is None else preprocessing_idx)
    n_params = check_model_size(spec)  # before any tensor is allocated
    steps = config.num_steps(len(train_idx))
    check_cost(training_cost("training", n_params, steps, config.batch_size, private=config.dp is not None))
    X, y = _tensors(dataset, train_idx, pre, device, trainer)
    model = build_model(spec, seed=config.seed)
    if init_state is not None:
        model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in init_state.items()})
    model = model.to(device)
    if whitebox is not None and not hasattr(trainer, "fit_with_canary"):
        if perf.backend != "torch":  # the algorithm was fine: "need a DP-SGD trainer …, not 'dpsgd'" read as nonsense
            raise InputError(
                f"white-box canaries need --backend torch (a DP-SGD trainer), not --backend {perf.backend}"
            )
        raise InputError(f"white-box canaries need a DP-SGD trainer, not {config.algo!r}")
    secure = config.dp is not None and config.dp.secure_noise  # unpredictable from the seed, as asked: left as it is
    with contextlib.nullcontext() if secure else _seeded_global_rng(config.seed, device):
        if whitebox is None:
            outcome, scores = trainer.fit(model, X, y, progress=progress), None
        else:
            outcome, scores = trainer.fit_with_canary(model, X, y, whitebox)
    check_finite_weights(outcome.model, config)
    return FittedModel(outcome=outcome, preprocessing=pre, device=device, whitebox_scores=scores)


def check_finite_weights(model: torch.nn.Module, config: TrainConfig) -> None:
    """One :class:`InputError` line when training left a parameter NaN or infinite (a loss that overflowed: a
    learning rate too large, a model whose forward gives inf or NaN on this data, features too large): such a
    model predicts class 0 everywhere (argmax of NaN), and was saved with its accuracy and, under DP-SGD, its
    claim (per-sample clipping passes a NaN gradient on: ‖g‖ = NaN gives a NaN factor) as if it had trained.
    Buffers are not checked: a causal mask of -inf is a model's own constant."""
    for name, p in model.named_parameters():
        if p.is_floating_point() and not bool(torch.isfinite(p).all()):
            decay = f", weight decay {config.weight_decay:g}" if config.weight_decay else ""
            lower = "--lr or the weight decay" if decay else "--lr"
            raise InputError(
                f"training diverged: the trained parameter {name!r} holds NaN or inf ({config.algo}, lr "
                f"{config.lr:g}{decay}); lower {lower}, or check that the model's outputs and loss stay finite on "
                "this data"
            )


@contextlib.contextmanager
def _seeded_global_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Training with torch's global random generator seeded from ``seed`` (a stream of its own, derived by
    SeedSequence, apart from the init's and the batch order's), restored afterwards.

    The trainers draw batches and noise from their own generators, but a model's randomness in its training
    forward (``nn.Dropout`` in a user's module, stochastic depth, ``torch.randn`` noise) reads the global
    generator, whose start is random per process in torch 2.x: the same seed gave another model on every run,
    and LiRA's reference models differed between --workers 1 and 2 (a residual CNN with dropout on digits:
    logits 44-268 apart, every LiRA score different)."""
    state = int(np.random.SeedSequence([int(seed), 0x5EED]).generate_state(1, np.uint64)[0])
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(state)
        yield


def evaluate(fitted: FittedModel, dataset: Dataset, idx: np.ndarray, advance=None) -> dict[str, float]:
    """Accuracy and mean cross-entropy loss on ``idx`` (None for an empty split)."""
    if len(idx) == 0:
        return {"accuracy": None, "loss": None}
    return _accuracy_and_loss(torch.as_tensor(fitted.logits(dataset.view(idx), advance=advance)), dataset.y[idx])


def _accuracy_and_loss(logits: torch.Tensor, y: np.ndarray) -> dict[str, float]:
    y = torch.as_tensor(y)
    return {
        "accuracy": float((logits.argmax(1) == y).double().mean()),
        "loss": float(F.cross_entropy(logits, y)),
    }


_METRIC_SPLITS = (("train", "members"), ("holdout", "holdout"), ("test", "test"))


def split_logits(
    fitted: FittedModel,
    dataset: Dataset,
    splits: Splits,
    progress: Progress = NULL_PROGRESS,
    every: np.ndarray | None = None,
) -> dict[str, torch.Tensor | None]:
    """The logits on the members, holdout and test splits (None for an empty one), one brief progress stage
    (silent in the plain reporter unless it lasts; 37,500 CIFAR images took about 4 minutes on a CPU, without a
    line). ``every``: the logits of every record of ``dataset`` (:func:`saved_logits`), whose rows are taken
    instead."""
    parts = [(key, getattr(splits, key)) for _, key in _METRIC_SPLITS]
    if every is not None:
        return {key: torch.as_tensor(every[idx]) if len(idx) else None for key, idx in parts}
    with progress.task("evaluate the model", sum(len(idx) for _, idx in parts), brief=True) as advance:
        return {
            key: torch.as_tensor(fitted.logits(dataset.view(idx), advance=advance)) if len(idx) else None
            for key, idx in parts
        }


def saved_logits(
    fitted: FittedModel, spec: ModelSpec, dataset: Dataset, progress: Progress = NULL_PROGRESS
) -> np.ndarray:
    """Float64 logits of every record of ``dataset`` as the run saved from ``fitted`` computes them: bit for bit
    ``load_run(out).logits(dataset.view())`` (:func:`~dpaudit.checkpoint.as_saved`, the recorded preprocessing), a
    batch at a time, one brief progress stage."""
    model = as_saved(fitted.model, spec)
    pre = preprocessing_from_dict(fitted.preprocessing.to_dict())  # as checkpoint.json records it
    with progress.task("evaluate the model", len(dataset), brief=True) as advance:
        return predict_logits(model, dataset.view(), transform=pre.transform, advance=advance)


def metrics_for(
    fitted: FittedModel,
    dataset: Dataset,
    splits: Splits,
    progress: Progress = NULL_PROGRESS,
    logits: dict[str, torch.Tensor | None] | None = None,
) -> dict[str, float | None]:
    """Accuracy and loss on the members, holdout and test splits, from ``logits`` (:func:`split_logits`, computed
    here if not given)."""
    logits = split_logits(fitted, dataset, splits, progress) if logits is None else logits
    out: dict[str, float | None] = {}
    for label, key in _METRIC_SPLITS:
        z = logits[key]
        m = {"accuracy": None, "loss": None} if z is None else _accuracy_and_loss(z, dataset.y[getattr(splits, key)])
        out[f"{label}_accuracy"] = m["accuracy"]
        out[f"{label}_loss"] = m["loss"]
    return out


def train_run(
    dataset: Dataset,
    spec: ModelSpec,
    config: TrainConfig,
    perf: PerfConfig | None = None,
    *,
    out: Path | None,
    split_seed: int = 0,
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS,
    label_column: str | None = None,
    force: bool = False,
    progress: Progress = NULL_PROGRESS,
    splits: Splits | None = None,
    canaries: CanarySet | None = None,
    preprocessing: Standardizer | Identity | None = None,
    trainer: Trainer | None = None,
    whitebox: DiracCanaries | None = None,
    every_logits: Callable[[np.ndarray], None] | None = None,
) -> dict[str, Any]:
    """Split, train on the members split (plus the included canaries), evaluate, and (if ``out``)
    save a run directory. Returns the checkpoint metadata (what ``checkpoint.json`` holds).

    ``every_logits``: given, it receives the float64 logits of every record of ``dataset`` as the saved run computes
    them (:func:`saved_logits`: bit for bit ``load_run(out).logits(dataset.view())``), and the metrics are read from
    their rows, so the data goes through the model once (reference and shadow models keep every record's logits;
    they evaluated the members, holdout and test and then every record). Those metrics are the saved model's on the
    CPU, not the trained one's: equal up to the last bits of a logit (a GPU, or a batch of other rows).

    Private algorithms fit the standardisation on the auxiliary split, treated as public data: its
    mean and scale are released with the model, and the DP claim covers only the training steps.
    A fixed ``preprocessing`` (e.g. an imported target's, for its reference models) is used as given,
    nothing fitted (``fitted_on: "given"``).
    """
    perf = perf or PerfConfig()
    if out is not None:
        check_output_dir(out, force=force, inputs=[dataset.source])  # fail before training
    check_spec_fits(spec, dataset)
    trainer = trainer if trainer is not None else default_trainer(config, perf)
    splits = splits or make_splits(len(dataset), split_seed, fractions)
    train_data, train_idx = dataset, splits.members
    if canaries is not None:
        train_data, train_idx, _ = with_canaries(dataset, splits, canaries)
    if preprocessing is not None:
        fitted_on, pre_idx = "given", None
    elif config.dp is None:
        fitted_on, pre_idx = "members", splits.members
    elif len(splits.aux):
        fitted_on, pre_idx = "aux", splits.aux
    else:
        # No public split: a scaler fitted on members would be released with the model outside the DP
        # claim, so a private run keeps the raw features (fixed, data-independent preprocessing).
        fitted_on, pre_idx = "none", None
    fitted = fit_model(
        train_data, train_idx, spec, config, perf, progress=progress, preprocessing_idx=pre_idx,
        preprocessing=preprocessing if preprocessing is not None else (Identity() if fitted_on == "none" else None),
        trainer=trainer, whitebox=whitebox,
    )  # fmt: skip
    arrays = {CANARY_FILE: canaries.arrays()} if canaries is not None else {}
    wb_meta = None
    if whitebox is not None:
        wb_meta = {**whitebox.describe(), "file": f"{WHITEBOX_FILE}.npz"}
        if out is not None:
            arrays[f"{WHITEBOX_FILE}.npz"] = whitebox.arrays(fitted.whitebox_scores)
    every = saved_logits(fitted, spec, dataset, progress) if every_logits is not None else None
    metrics = metrics_for(fitted, dataset, splits, logits=split_logits(fitted, dataset, splits, progress, every))
    if every_logits is not None:
        every_logits(every)
    found = learn_warnings(dataset, splits, metrics, algo=config.algo)
    learned = {"fit_warnings": found} if found else {}
    steps_run = config.num_steps(len(train_idx)) if trainer.batched else None  # None: no minibatch steps
    return record_run(
        out, model=fitted.model, spec=spec, dataset=dataset, splits=splits, label_column=label_column,
        preprocessing={**fitted.preprocessing.to_dict(), "fitted_on": fitted_on},
        training={**trainer.recorded_settings(), "steps_run": steps_run, "history": fitted.outcome.history},
        performance={**perf.to_dict(), **fitted.outcome.performance},
        privacy=fitted.outcome.privacy, metrics=metrics,
        seed=config.seed, canaries=canaries.describe() if canaries is not None else None,
        extra={"whitebox_canaries": wb_meta, **learned},
        arrays=arrays, force=force,
    )  # fmt: skip


def record_run(
    out: Path | None,
    *,
    model: torch.nn.Module,
    spec: ModelSpec,
    dataset: Dataset,
    splits: Splits,
    preprocessing: dict[str, Any],
    training: dict[str, Any],
    performance: dict[str, Any],
    privacy: dict[str, Any] | None,
    metrics: dict[str, float | None],
    seed: int,
    label_column: str | None = None,
    canaries: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    arrays: dict[str, dict[str, np.ndarray]] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """The one way a trained model becomes a run, whatever the algorithm: the checkpoint metadata
    (what ``checkpoint.json`` holds: model spec, data, split, preprocessing, training, performance,
    privacy claim, metrics, seed, canaries, versions, plus an algorithm's ``extra`` fields) and, if
    ``out``, the run directory written atomically with the weights, the split and ``arrays``
    (:func:`dpaudit.checkpoint.save_run`). Returns the metadata."""
    data_meta = dataset.describe()
    if label_column is not None:
        data_meta["label_column"] = label_column
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": spec.to_dict(),
        "data": data_meta,
        "split": {"seed": splits.seed, "fractions": list(splits.fractions), "sizes": splits.sizes()},
        "preprocessing": preprocessing,
        "training": training,
        "performance": performance,
        "privacy": privacy,
        "metrics": metrics,
        "seed": seed,
        "canaries": canaries,
        **(extra or {}),
        "versions": versions(),
    }
    if out is not None:
        save_run(Path(out), model=model, meta=meta, splits=splits, force=force, arrays=arrays)
    return meta


def summary(meta: dict[str, Any]) -> dict[str, Any]:
    """The stable, documented summary printed by ``dpaudit inspect --json``."""
    privacy = meta.get("privacy") or {}
    m = meta["metrics"]
    t = meta["training"]
    return {
        "schema_version": meta["schema_version"],
        "model": meta["model"]["kind"],
        "data": meta["data"]["spec"],
        "data_sha256": meta["data"]["sha256"],
        "algo": t["algo"],
        "private": bool(privacy),
        "epsilon": privacy.get("epsilon"),
        "delta": privacy.get("delta"),
        "accountant": privacy.get("accountant"),
        "train_accuracy": m["train_accuracy"],
        "test_accuracy": m["test_accuracy"],
        "holdout_accuracy": m.get("holdout_accuracy"),
        "train_loss": m["train_loss"],
        "test_loss": m["test_loss"],
        "n_members": meta["split"]["sizes"]["members"],
        "seed": meta.get("seed"),
        "versions": meta["versions"],
        # DP-SGD-JL only: the AD path that computed the JL projections ("jvp" or "double-vjp")
        **({"jl_ad_path": privacy["jl"].get("ad_path")} if isinstance(privacy.get("jl"), dict) else {}),
        # DP-SGD: the per-example clipping method that ran (what --clipping auto chose)
        **({"clipping": used.get("method")} if (used := meta.get("performance", {}).get("clipping_used")) else {}),
    }


def configs_from_meta(meta: dict[str, Any]) -> tuple[TrainConfig, PerfConfig]:
    """The training recipe recorded in a checkpoint (to train shadow/reference models alike)."""
    if meta["training"].get("algo") == "imported":
        raise InputError(
            "this run was imported from foreign weights without a training recipe, so no shadow or reference "
            "models can be trained for it; re-import it with --recipe recipe.json (see docs/model-spec.md), "
            "or use reference-free attacks such as --attacks loss"
        )
    if meta["training"].get("algo") == "extracted":
        raise InputError(
            "this run is a surrogate made by `dpaudit attack extract`: it has no training recipe of its own, so "
            "no shadow or reference models can be trained for it; use reference-free attacks such as --attacks loss"
        )
    if meta["training"].get("algo") in ("pate", "dp-icl"):
        raise InputError(
            f"this run was trained with {meta['training']['algo']} (noisy teacher votes): reference or shadow models "
            "would have to rerun the whole teacher ensemble, which is not implemented; use reference-free attacks "
            "such as --attacks loss (and `dpaudit report --icl` for a dp-icl run)"
        )
    t = {k: v for k, v in meta["training"].items() if k in TrainConfig.__dataclass_fields__}
    perf = {k: v for k, v in meta.get("performance", {}).items() if k in PerfConfig.__dataclass_fields__}
    # A setting the algorithm never read is dropped to its default (settings_read), which it ignores: an adam run
    # recorded with --momentum 0.9, or an sgd run with --max-physical-batch 8, before they were refused
    # (check_config_read), still trains its reference models, as the run itself trained.
    config = TrainConfig.from_dict(settings_read(TrainConfig.from_dict(t)))
    return config, PerfConfig(**{k: v for k, v in perf.items() if _reads(config.algo, k)})


# --------------------------------------------------------------------------- imported models

STATED_SOURCE = "stated by the user"
RECIPE_SOURCE = "user (the attacker's approximation of the target's training)"
CLAIM_FIELDS = ("epsilon", "delta", "noise_multiplier", "sample_rate", "steps", "accountant", "neighbouring")
MECHANISM_FIELDS = ("noise_multiplier", "sample_rate", "steps")
IMPORT_ACCOUNTANTS = ("rdp", "pld")
NEIGHBOURING = ("add_remove", "replace_one")


def _json_field(source: str | None, name: str, check, value):
    """``check(name=value)``; for a JSON file the message names the file and its field, not an option."""
    try:
        return check(**{name: value})
    except InputError as e:
        if source is None:
            raise
        raise InputError(f"{source}: field {name!r}: {str(e).replace(f'expected {name} ', 'expected ')}") from None


def _finite_non_negative(**kwargs: Any) -> float:
    from dpaudit.validation import check_non_negative

    v = check_non_negative(**kwargs)
    if math.isinf(v):
        name, value = next(iter(kwargs.items()))
        raise InputError(f"expected {name} to be finite, got {value}")
    return v


@dataclass(frozen=True)
class StatedClaim:
    """A privacy claim made for imported weights: (ε, δ) as stated, and/or the DP-SGD mechanism
    parameters (noise multiplier σ, sampling rate q = B/N, steps T) that dpaudit re-accounts.

    ``neighbouring`` ``add_remove`` (default) reads the parameters as Poisson-sampled DP-SGD;
    ``replace_one`` as shuffled fixed-size batches (each record in one batch per epoch), accounted
    without amplification by subsampling as dpaudit's own trainer does (:data:`SHUFFLE_ANALYSIS`).
    ``source`` names the JSON file the claim came from (for messages), or None for CLI options.
    """

    delta: float
    epsilon: float | None = None
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    steps: int | None = None
    accountant: str | None = None
    neighbouring: str | None = None
    source: str | None = None

    def __post_init__(self) -> None:
        from dpaudit.validation import (
            check_choice,
            check_claim_delta,
            check_in_interval,
            check_positive,
            check_positive_int,
        )

        src = self.source
        _json_field(src, "delta", check_claim_delta, self.delta)
        if self.epsilon is not None:
            _json_field(src, "epsilon", _finite_non_negative, self.epsilon)
        given = [f for f in MECHANISM_FIELDS if getattr(self, f) is not None]
        # Field names of claim.json, or the options they came from on the command line.
        at = f"{src}: " if src else ""
        name = (lambda f: f) if src else (lambda f: "--" + f.replace("_", "-"))
        mechanism = f"{name('noise_multiplier')}, {name('sample_rate')} and {name('steps')}"
        if given and len(given) != len(MECHANISM_FIELDS):
            missing = [name(f) for f in MECHANISM_FIELDS if f not in given]
            raise InputError(f"{at}the mechanism parameters {mechanism} go together; missing {', '.join(missing)}")
        if not given and self.epsilon is None:
            raise InputError(f"{at}a claim needs {name('epsilon')}, or the mechanism parameters {mechanism}")
        if self.accountant is not None and not given:
            raise InputError(f"{at}{name('accountant')} applies only to a re-accounted claim (with {mechanism})")
        if given:
            # sigma = 0 is no mechanism at all (epsilon = infinity): import without a claim instead.
            _json_field(src, "noise_multiplier", check_positive, self.noise_multiplier)
            in_unit = lambda **k: check_in_interval(0.0, 1.0, hi_open=False, **k)  # noqa: E731
            _json_field(src, "sample_rate", in_unit, self.sample_rate)
            _json_field(src, "steps", check_positive_int, self.steps)
        if self.accountant is not None:
            _json_field(src, "accountant", lambda **k: check_choice(IMPORT_ACCOUNTANTS, **k), self.accountant)
        if self.neighbouring is not None:
            _json_field(src, "neighbouring", lambda **k: check_choice(NEIGHBOURING, **k), self.neighbouring)

    @property
    def has_mechanism(self) -> bool:
        return self.noise_multiplier is not None

    @classmethod
    def from_dict(cls, d: Any, source: str) -> StatedClaim:
        """A claim from ``claim.json``: ``epsilon``, ``delta`` and optionally ``noise_multiplier``,
        ``sample_rate``, ``steps``, ``accountant`` (rdp | pld), ``neighbouring`` (add_remove | replace_one)."""
        if not isinstance(d, dict):
            raise InputError(f"{source}: expected a JSON object with 'epsilon' and 'delta'")
        unknown = sorted(set(d) - set(CLAIM_FIELDS))
        if unknown:
            raise InputError(f"{source}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(CLAIM_FIELDS)}")
        if "delta" not in d:
            raise InputError(f"{source}: missing 'delta'")
        from dpaudit.validation import check_json_type

        # JSON types first: a stranger's "epsilon": true or "1" was read as the number 1 (float(True)), a claim the
        # file never stated. null is an absent field (the options' None).
        for k in CLAIM_FIELDS:
            expected = {"steps": int, "accountant": str, "neighbouring": str}.get(k, float)
            check_json_type(d.get(k), expected if k == "delta" else (expected, type(None)), f"{source}: field {k!r}")
        return cls(**{k: d.get(k) for k in CLAIM_FIELDS}, source=source)


def _shuffle_epochs(sample_rate: float, steps: int) -> int:
    """Epochs touched by ``steps`` shuffled batches of B = qN records, counted with the shortest epoch the
    stated q allows: ⌊N/B⌋ = ⌊1/q⌋ steps.

    An imported run's loop is not dpaudit's: "fixed-size batches" drop the short last batch of each
    permutation (PyTorch's ``DataLoader(drop_last=True)``, TF's ``drop_remainder``), so an epoch is ⌊N/B⌋
    steps; a loop that keeps it has ⌈N/B⌉. Fewer steps per epoch can only count more epochs, so ⌊1/q⌋ never
    under-reports ε for either loop (⌈1/q⌉ did for the first: N = 1000, B = 300, T = 12 touches 4 epochs,
    3 were counted). q is taken as the decimal the user gave (its ``repr``, dpaudit.numfmt's convention):
    1/0.1 is exactly 10 steps, not the 9.99… of the float's binary value.
    """
    steps_per_epoch = max(1, math.floor(1 / numfmt.as_typed(sample_rate)))
    return -(-steps // steps_per_epoch)


def claim_record(stated: StatedClaim, *, dataset_size: int) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The JSON-ready claim of an imported run and the warnings it raises.

    With only (ε, δ): recorded as given, ``source: "stated by the user"``, no event. With mechanism
    parameters: the event (as :func:`dpaudit.training.dpsgd.privacy_claim` builds it) is re-accounted
    with dpaudit's accountant; the recorded ε is the larger of that and any stated ε, so a claim is
    never under-reported; a stated ε below the accountant's gives a warning.
    """
    from dpaudit.accounting import dpsgd_event, epsilon_for
    from dpaudit.events import Gaussian, SelfComposed
    from dpaudit.training.dpsgd import POISSON_ANALYSIS, SHUFFLE_ANALYSIS

    if not stated.has_mechanism:
        claim = {
            "epsilon": float(stated.epsilon),
            "delta": float(stated.delta),
            "accountant": None,
            "neighbouring": stated.neighbouring,
            "event": None,
            "source": STATED_SOURCE,
        }
        return claim, ()
    sigma, q, steps = float(stated.noise_multiplier), float(stated.sample_rate), int(stated.steps)
    neighbouring = stated.neighbouring or "add_remove"
    accountant = stated.accountant or "rdp"
    extra: dict[str, Any] = {}
    if neighbouring == "add_remove":
        # Abadi et al. 2016 (arXiv:1607.00133), Alg. 1 with Poisson sampling at rate q, T steps:
        # SelfComposed(PoissonSampled(q, Gaussian(σ)), T), as dpsgd.PrivacySetting.event builds it.
        event = dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps)
        sampling, analysis = "poisson", POISSON_ANALYSIS
    else:
        # Shuffled batches, no amplification: one Gaussian per epoch (sensitivity 2C, applied by the
        # accountant for replace_one), composed over the epochs touched (dpsgd.PrivacySetting.event).
        epochs = _shuffle_epochs(q, steps)
        event, sampling, analysis = SelfComposed(Gaussian(sigma), epochs), "shuffle", SHUFFLE_ANALYSIS
        extra["epochs_touched"] = epochs
    accounted = float(epsilon_for(event, stated.delta, accountant, neighbouring=neighbouring))
    warnings: list[str] = []
    epsilon = accounted
    source = f"re-accounted by dpaudit ({accountant}) from the mechanism parameters stated by the user"
    if stated.epsilon is not None:
        if accounted > stated.epsilon * (1 + 1e-9):
            # Both upper bounds on ε, rounded up and printed in the order computed (dpaudit.numfmt.ordered).
            shown, acc = numfmt.ordered(stated.epsilon, accounted, left_up=True)
            warnings.append(
                f"the stated ε = {shown} is smaller than dpaudit's {accountant} accountant gives for "
                f"σ = {numfmt.exact(sigma)}, q = {numfmt.exact(q)}, T = {steps} at δ = {numfmt.exact(stated.delta)} "
                f"(ε = {acc}); "
                f"recording ε = {acc}: a claim is never under-reported"
            )
        elif stated.epsilon > accounted:
            epsilon = float(stated.epsilon)
            source = (
                f"stated by the user (larger than the ε = {numfmt.upper(accounted)} dpaudit's {accountant} accountant "
                "gives for the stated mechanism parameters; the larger is recorded)"
            )
    claim = {
        "epsilon": epsilon,
        "delta": float(stated.delta),
        "accountant": accountant,
        "neighbouring": neighbouring,
        "event": event.to_dict(),
        "noise_multiplier": sigma,
        "sample_rate": q,
        "steps": steps,
        "sampling": sampling,
        **extra,
        "dataset_size": int(dataset_size),
        "analysis": analysis,
        "accounted_epsilon": accounted,
        "stated_epsilon": None if stated.epsilon is None else float(stated.epsilon),
        "source": source,
    }
    return claim, tuple(warnings)


RECIPE_FIELDS = (
    "algo", "optimizer", "epochs", "steps", "lr", "batch_size", "momentum", "weight_decay", "seed",
    "clip", "noise_multiplier", "sampling", "sample_rate", "accountant", "delta",
)  # fmt: skip
DP_FIELDS = ("clip", "noise_multiplier", "sampling", "sample_rate", "accountant", "delta")
RECIPE_TEXT_FIELDS = ("algo", "optimizer", "sampling", "accountant")
RECIPE_INT_FIELDS = ("epochs", "steps", "batch_size", "seed")  # the rest are numbers


def recipe_from_dict(d: Any, source: str, *, delta: float | None = None) -> TrainConfig:
    """The attacker's approximation of how imported weights were trained (``recipe.json``), as a
    :class:`TrainConfig` to train shadow/reference models alike.

    Fields: ``algo`` (or ``optimizer``): sgd | adam | dpsgd | dpadam; ``epochs`` or ``steps``; ``lr``;
    ``batch_size``; optional ``momentum`` (sgd, dpsgd), ``weight_decay``, ``seed``; for dpsgd/dpadam ``clip`` and
    ``noise_multiplier`` (optional ``sampling`` poisson | shuffle, ``sample_rate`` (a fixed Poisson
    rate instead of batch_size / N), ``accountant``, ``delta``; δ
    defaults to the claim's, else 1e-5: it only labels the reference models' own claims).
    """
    from dpaudit.training.config import DPConfig

    if not isinstance(d, dict):
        raise InputError(f"{source}: expected a JSON object (algo, epochs or steps, lr, batch_size, ...)")
    unknown = sorted(set(d) - set(RECIPE_FIELDS))
    if unknown:
        raise InputError(f"{source}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(RECIPE_FIELDS)}")
    from dpaudit.validation import check_json_type

    # JSON types first ("lr": true was read as 1.0, "noise_multiplier": "1" as 1, "batch_size": 8.0 kept a float);
    # null stays what each field's own check makes of an absent value.
    for k, v in d.items():
        expected = str if k in RECIPE_TEXT_FIELDS else int if k in RECIPE_INT_FIELDS else float
        check_json_type(v, (expected, type(None)), f"{source}: field {k!r}")
    if "algo" in d and "optimizer" in d:
        raise InputError(f"{source}: give 'algo' or 'optimizer', not both")
    algo = d.get("algo", d.get("optimizer"))
    missing = [k for k in ("lr", "batch_size") if k not in d]
    if algo is None:
        missing.insert(0, "algo")
    if "epochs" not in d and "steps" not in d:
        missing.append("epochs or steps")
    if missing:
        raise InputError(f"{source}: missing {', '.join(missing)}")
    if "epochs" in d and "steps" in d:
        raise InputError(f"{source}: give 'epochs' or 'steps', not both")
    private = isinstance(algo, str) and algo.startswith("dp")
    dp = None
    if private:
        lacking = [k for k in ("clip", "noise_multiplier") if k not in d]
        if lacking:
            raise InputError(f"{source}: a private recipe ({algo}) needs {' and '.join(lacking)}")
        dp_args = {k: d[k] for k in DP_FIELDS if k in d}
        dp_args.setdefault("delta", delta if delta is not None else 1e-5)
        try:
            dp = DPConfig(**dp_args)
        except InputError as e:
            raise InputError(f"{source}: {e}") from None
    else:
        stray = [k for k in DP_FIELDS if k in d]
        if stray:
            raise InputError(
                f"{source}: {', '.join(stray)} apply only to a private recipe (dpsgd, dpadam), not {algo!r}"
            )
    args = {k: d[k] for k in ("epochs", "steps", "lr", "batch_size", "momentum", "weight_decay", "seed") if k in d}
    if "steps" in args:
        args["epochs"] = 1  # unused when steps is set
    try:
        config = TrainConfig(algo=algo, dp=dp, **args)
        get_trainer(config.algo)(config)  # and a field it never reads (momentum with adam) refused here, not later
    except (InputError, TypeError) as e:
        raise InputError(f"{source}: {e}") from None
    return config


def check_spec_fits(spec: ModelSpec, dataset: Dataset, *, own_module: bool = True) -> None:
    """The model spec must accept the data's records and have one output per class. ``own_module``: the
    algorithm takes a user's own module (``--model-spec``), so the token-data hint may offer it (PATE and
    DP-ICL do not: they train from ``--model`` only)."""
    shape = dataset.feature_shape
    if spec.n_classes != dataset.n_classes:
        raise InputError(
            f"the model spec has n_classes {spec.n_classes} but the data {dataset.source!r} has {dataset.n_classes} "
            f"classes (class i is the i-th smallest distinct label){dataset.outputs_hint(spec.n_classes)}"
        )
    takes_tokens = spec.kind == "rnn" or getattr(spec, "input_dtype", None) == "int64"
    if takes_tokens != (dataset.kind == "tokens"):
        if takes_tokens:
            need = "token sequences (an integer X of ids, or synthetic-tokens:...)"
        elif spec.kind == "python":
            need = 'float input (its spec says "input_dtype": "float32"; "int64" for a model over token ids)'
        else:
            need = "numeric features"
        hint = ""
        if dataset.kind == "tokens":
            models = "--model rnn or your own module" if own_module else "--model rnn"
            hint = f" (token models: {models})"
            if dataset.name != SYNTHETIC_TOKENS:  # a user's file: its integer X was read as token ids
                hint = (
                    f" (an integer 2-D X is read as token ids; token models: {models}; "
                    "numeric features: save X as floats)"
                )
        raise InputError(f"a {spec.kind} model needs {need}, but the data {dataset.source!r} is {dataset.kind}{hint}")
    check_input_shape(spec, shape)
    if spec.kind == "rnn" and int(dataset.X.max()) >= spec.vocab_size:
        raise InputError(
            f"the data has token ids up to {int(dataset.X.max())} but the model spec has vocab_size {spec.vocab_size}"
        )
    if spec.kind == "python" and dataset.kind == "tokens":
        _check_runs_on_ids(spec, dataset)


def check_input_shape(spec: ModelSpec, shape: tuple[int, ...]) -> None:
    """The spec's input_shape must be the records' ``shape`` (logreg and mlp flatten their input, so for them only the
    size must agree). Also run by ``dpaudit import`` before a factory's model is built and run
    (:func:`dpaudit.models.read_model_spec`'s ``fits``), where a mismatch read as the factory's forward failing."""
    flat = spec.kind in ("logreg", "mlp")
    if tuple(spec.input_shape) != tuple(shape) and not (flat and math.prod(spec.input_shape) == math.prod(shape)):
        raise InputError(
            f"the model spec has input_shape {list(spec.input_shape)} but the data's records have shape {list(shape)}"
        )


def _check_runs_on_ids(spec: ModelSpec, dataset: Dataset) -> None:
    """A user's module over token ids must take the data's largest id (its Embedding's size is the
    user's choice, unknown to the spec): a forward pass on the record holding it, before any training."""
    row = int(np.argmax(dataset.X.max(axis=1)))
    model = spec.build().eval()
    try:
        with torch.no_grad():
            model(torch.as_tensor(np.array(dataset.X[row : row + 1], dtype=np.int64)))
    except Exception as e:  # the user's code: any failure is one line
        raise InputError(
            f"model factory {spec.factory} fails on record {row} of {dataset.source!r} (token ids up to "
            f"{int(dataset.X.max())}; is its vocabulary smaller?): {first_line(e)}"
        ) from e


# Level of the member check's tests (the Mann–Whitney test of the member list, the binomial test of the
# members' accuracy against chance): below it a test is significant, at or above it inconclusive.
MEMBER_CHECK_ALPHA = 0.05


def member_check(
    fitted: FittedModel, dataset: Dataset, splits: Splits, logits: dict[str, torch.Tensor | None] | None = None
) -> dict[str, Any]:
    """Do the declared members look like the model's training records, and does the model fit them at all?

    A trained model has lower loss on its training records than on unseen ones (the generalisation gap
    the loss attack uses, Yeom et al. 2018, arXiv:1709.01604). Recorded: mean loss and accuracy on the
    declared members and on the holdout records, the probability that a member's loss is below a holdout
    record's (the loss attack's AUC, U / (n_members n_holdout) with U the Mann–Whitney statistic, Hanley &
    McNeil 1982) and the one-sided Mann–Whitney p-value for "members' losses are smaller" (Mann & Whitney
    1947). ``outcome``: "suspicious" when the members' mean loss is not below the holdout's or the AUC is at
    most 1/2 (``suspicious`` True); "inconclusive" when the test is not significant at
    :data:`MEMBER_CHECK_ALPHA` (the members are not told apart from the holdout records: no evidence either
    way) or the model does not fit its members at all (``fit_warnings``; its losses then rank records by
    something other than training); else "consistent". A wrong member list is detectable only where the
    model has a gap: a strongly private model may have none, and is then flagged or inconclusive (the note
    says so).

    ``fit_warnings``: the model does not fit its declared training records at all — its accuracy on them is
    not significantly above chance (the most frequent class's share; one-sided binomial test) or its mean
    loss is above a constant prediction's. Either points at features that are not what the model was trained
    on (columns reordered or renamed) or weights that do not belong to this data.

    ``logits``: those of :func:`split_logits` (the members' and holdout's are read), computed here if not given.
    """
    from scipy.stats import mannwhitneyu

    if len(splits.members) == 0 or len(splits.holdout) == 0:
        keys = ("train_loss", "holdout_loss", "train_accuracy", "holdout_accuracy", "auc", "p_value")
        note = "no holdout records to compare the members with: the member list cannot be checked"
        return {**dict.fromkeys(keys), "suspicious": False, "outcome": "inconclusive", "note": note,
                "fit_warnings": []}  # fmt: skip
    # Each split's logits once: the losses, the accuracy and the label-order check all read them.
    if logits is None:
        logits = {k: torch.as_tensor(fitted.logits(dataset.view(getattr(splits, k)))) for k in ("members", "holdout")}
    logits = {k: logits[k] for k in ("members", "holdout")}
    labels = {k: torch.as_tensor(dataset.y[getattr(splits, k)]) for k in logits}
    member_loss, holdout_loss = (F.cross_entropy(logits[k], labels[k], reduction="none").numpy() for k in logits)
    u = mannwhitneyu(member_loss, holdout_loss, alternative="less")
    # U counts pairs with member loss > holdout loss (ties 1/2), so P(member < holdout) = 1 - U / (n m).
    auc = 1.0 - float(u.statistic) / (len(member_loss) * len(holdout_loss))
    predicted = {k: logits[k].argmax(1) for k in logits}
    train_acc, hold_acc = (float((predicted[k] == labels[k]).double().mean()) for k in logits)
    train_loss, hold_loss, p_value = float(member_loss.mean()), float(holdout_loss.mean()), float(u.pvalue)
    suspicious = bool(train_loss >= hold_loss or auc <= 0.5)
    fit_warnings = _fit_warnings(dataset.y[splits.members], train_acc, train_loss)
    fit_warnings += _label_order_warning(
        dataset.y[splits.members], predicted["members"].numpy(), dataset.n_classes, dataset.classes
    )
    stats = (
        f"mean loss {train_loss:.4g} on the {len(member_loss)} declared members vs {hold_loss:.4g} on the "
        f"{len(holdout_loss)} holdout records; a member's loss is lower with probability {auc:.3f} "
        f"(one-sided Mann–Whitney {numfmt.p_value(p_value)})"
    )
    if suspicious:
        outcome = "suspicious"
        note = (
            f"imported member list looks wrong: {stats}. The member list may not be the records this model was "
            "trained on (or the model shows no generalisation gap at all, as a strongly private one may); "
            "membership estimates compare the declared members with the holdout records and mean nothing if "
            "the member list is wrong"
        )
    elif fit_warnings:
        outcome = "inconclusive"
        note = (
            f"member check inconclusive: the model does not fit its declared training records (see the warnings), "
            f"so its losses say nothing about which records it was trained on: {stats}"
        )
    elif p_value >= MEMBER_CHECK_ALPHA:
        outcome = "inconclusive"
        note = (
            f"member check inconclusive: {stats}, not significant at {MEMBER_CHECK_ALPHA:g}: the declared members "
            "cannot be told from the holdout records (a model with no generalisation gap, as a strongly private "
            "one, gives no evidence either way)"
        )
    else:
        outcome = "consistent"
        note = f"the declared members look like training records: {stats}"
    return {
        "train_loss": train_loss,
        "holdout_loss": hold_loss,
        "train_accuracy": train_acc,
        "holdout_accuracy": hold_acc,
        "auc": auc,
        "p_value": p_value,
        "suspicious": suspicious,
        "outcome": outcome,
        "note": note,
        "fit_warnings": fit_warnings,
    }


_FIT_QUESTION = (
    "are the feature columns the ones it was trained on, in the same order and scale (or did it learn next to "
    "nothing, as a very strongly private model may)?"
)


# A model dpaudit trained that fits its own training records no better than a constant (checkpoint.json
# "fit_warnings"): membership attacks and audits on it say little about what the training leaks.
_LEARN_QUESTION = (
    "the model learned next to nothing, so membership attacks on it measure little (train longer, with a larger "
    "learning rate, more data or a larger epsilon, or check the data)"
)


def _reads(algo: str, option: str) -> bool:
    """Whether `dpaudit train --algo ALGO` reads ``option`` (:data:`dpaudit.training.config.OPTION_READERS`)."""
    from dpaudit.training.config import OPTION_READERS

    return algo in OPTION_READERS.get(option, ())


_OVERCONFIDENT = "overconfident logits: a learning rate too large?"


def learn_question(algo: str | None) -> str:
    """:data:`_LEARN_QUESTION` naming only the `dpaudit train` options ``algo`` reads
    (:data:`dpaudit.training.config.OPTION_READERS`): DP-AGD was told to raise a learning rate it never reads, and a
    non-private run to raise an epsilon it has none of. ``algo`` None: the general advice."""
    if algo is None:
        return _LEARN_QUESTION
    longer = [f"--{o}" for o in ("epochs", "steps") if _reads(algo, o)]
    tips = [f"train longer ({', '.join(longer)})"] if longer else []
    tips += ["a larger --lr"] * _reads(algo, "lr") + ["more data"] + ["a larger --epsilon"] * _reads(algo, "epsilon")
    advice = tips[0] if len(tips) == 1 else f"{', '.join(tips[:-1])} or {tips[-1]}"
    return (
        f"the model learned next to nothing, so membership attacks on it measure little ({advice}, or check the data)"
    )


def learn_warnings(
    dataset: Dataset,
    splits: Splits,
    metrics: dict[str, float | None],
    records: str = "training records",
    algo: str | None = None,
) -> list[str]:
    """What ``dpaudit train`` warns about a trained run (every algorithm): the dataset's label warnings (an age
    read as 70 classes: every attack then measures that classifier) and, from its ``metrics``, a model at chance
    on the members split (attacks on it measure noise; :func:`_fit_warnings`)."""
    found = list(dataset.label_warnings)
    if len(splits.members):
        found += _fit_warnings(
            dataset.y[splits.members],
            metrics["train_accuracy"],
            metrics["train_loss"],
            question=learn_question(algo),
            records=records,
            # the learning-rate guess only for an algorithm that has one (DP-AGD's and the convex learners' runs
            # were asked "a learning rate too large?")
            overconfident=_OVERCONFIDENT if algo is None or _reads(algo, "lr") else "overconfident logits",
        )
    return found


def chance_test(y: np.ndarray, correct: int) -> tuple[float, float]:
    """(chance, p): chance is the accuracy of always predicting the most frequent of the labels ``y``; p the
    one-sided exact binomial test of H0 "accuracy <= chance" for ``correct`` right of ``len(y)``,
    p = P(Bin(n, chance) >= correct)."""
    from scipy.stats import binom

    chance = float(np.bincount(y).max() / len(y))
    return chance, float(binom.sf(correct - 1, len(y), chance))


def _fit_warnings(
    y: np.ndarray,
    accuracy: float,
    loss: float,
    question: str = _FIT_QUESTION,
    records: str = "declared training records",
    overconfident: str = _OVERCONFIDENT,
) -> list[str]:
    """Warnings when a model does not fit the records it was (declared to be) trained on (see member_check).
    ``overconfident``: what the loss warning at an accuracy above chance suggests as the cause."""
    n = len(y)
    freq = np.bincount(y) / n
    correct = round(accuracy * n)
    chance, p = chance_test(y, correct)
    out = []
    if p >= MEMBER_CHECK_ALPHA:
        out.append(
            f"the model's accuracy on its {records}, {accuracy:.1%} ({correct} of {n}), is not above "
            f"chance ({chance:.1%} by always predicting the most frequent class; one-sided binomial p = {p:.3g}): "
            f"{question}"
        )
    # Cross-entropy of the constant prediction of the members' class frequencies on the members is their
    # entropy H = -sum f log f (Cover & Thomas, Elements of Information Theory, eq. 2.1); a model trained
    # to minimise cross-entropy on these records does better unless its inputs carry nothing it learned.
    # max(0, .): H >= 0, and one class gives -0.0, which printed "is above -0"
    constant = max(0.0, float(-(freq[freq > 0] * np.log(freq[freq > 0])).sum()))
    if loss > constant and p >= MEMBER_CHECK_ALPHA:
        out.append(
            f"the model's mean loss on its {records}, {loss:.4g}, is above {constant:.3g}, the loss "
            f"of predicting the class frequencies without looking at the features: {question}"
        )
    elif loss > constant:
        # Accuracy above chance: the model did learn; a few confidently wrong records carry the mean (a DP-SGD run at
        # --lr 1e30 read "learned next to nothing ... train with a larger learning rate" at 89.5% accuracy, mean
        # loss 3.8e28).
        out.append(
            f"the model's mean loss on its {records}, {loss:.4g}, is above {constant:.3g}, the loss of predicting "
            f"the class frequencies, although its accuracy there ({accuracy:.1%}) is above chance: a few confidently "
            f"wrong predictions carry the mean ({overconfident}), and loss-based membership scores on this model are "
            "ruled by them"
        )
    return out


def _label_order_warning(y: np.ndarray, predicted: np.ndarray, n_classes: int, classes: np.ndarray | None) -> list[str]:
    """A warning when the model's outputs match the labels far better in another order than dpaudit's (output
    i is the i-th smallest label): a model trained with its own label numbering ("dog" = 0, "cat" = 1, or
    SVHN's 10 for the digit 0), which every loss and attack would otherwise read with the classes swapped.

    The best order is the assignment of outputs to classes with the most agreements on these records
    (``scipy.optimize.linear_sum_assignment``, Kuhn 1955) — chosen on the records it is measured on, so
    optimistic — and is reported only when it gains at least :data:`LABEL_ORDER_GAIN` accuracy and is
    significantly above chance (the same binomial test as :func:`_fit_warnings`). A warning, never a verdict."""
    from scipy.optimize import linear_sum_assignment
    from scipy.stats import binom

    n = len(y)
    if n == 0:
        return []
    agree = np.zeros((n_classes, n_classes))
    np.add.at(agree, (np.asarray(predicted), np.asarray(y)), 1)  # agree[o, c]: output o on a record of class c
    outputs, labels = linear_sum_assignment(-agree)
    best, as_read = float(agree[outputs, labels].sum()), float(np.trace(agree))
    chance = float((np.bincount(y, minlength=n_classes) / n).max())
    if (best - as_read) / n < LABEL_ORDER_GAIN or binom.sf(best - 1, n, chance) >= MEMBER_CHECK_ALPHA:
        return []
    names = [str(c) for c in (classes if classes is not None else range(n_classes))]
    moved = [f"output {o} as {names[c]!r}" for o, c in zip(outputs, labels, strict=True) if o != c]
    shown = ", ".join(moved[:4]) + (", …" if len(moved) > 4 else "")
    return [
        f"the model's outputs match the labels of its {n} declared training records far better in another order: "
        f"{as_read / n:.1%} accuracy with output i read as the i-th smallest label ({', '.join(names[:6])}"
        f"{', …' if len(names) > 6 else ''}), {best / n:.1%} reading {shown}; dpaudit reads output i as the i-th "
        "smallest label, so relabel the data to follow the model's outputs (every loss and attack reads the "
        "classes as dpaudit numbers them)"
    ]


# Accuracy gained by the best order of the classes (see _label_order_warning) before it is reported.
LABEL_ORDER_GAIN = 0.25


def _sha256_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _resolve_preprocessing(preprocessing, dataset: Dataset, splits: Splits, legacy: bool):
    """(preprocessing, fitted_on) of an import: a fixed object as given; "none"/"identity": raw features;
    "standardize" (only when the members are assumed to be dpaudit's split): fitted on those members."""
    if isinstance(preprocessing, Standardizer):
        if dataset.kind == "tokens":
            raise InputError("token data takes no scaler; use --preprocessing none")
        return preprocessing, "user"
    if isinstance(preprocessing, Identity):
        return preprocessing, "none"
    name = preprocessing if preprocessing is not None else ("standardize" if legacy else "none")
    if name in ("none", "identity"):
        return Identity(), "none"
    if name == "standardize":
        if not legacy:
            raise InputError(
                "--preprocessing standardize would fit a scaler on your data behind your back; give the scaler your "
                "model was trained with (scaler.json with 'mean' and 'scale'), or none"
            )
        return fit_preprocessing(dataset, splits.members), "members" if dataset.kind != "tokens" else "none"
    raise InputError(f"unknown preprocessing {name!r}; valid: none, a scaler.json path (standardize, identity: legacy)")


def import_run(
    weights: Path,
    spec: ModelSpec,
    dataset: Dataset,
    *,
    out: Path,
    members: np.ndarray | None = None,
    members_source: str | None = None,
    split_seed: int = 0,
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS,
    preprocessing: Standardizer | Identity | str | None = None,
    claim: StatedClaim | None = None,
    recipe: TrainConfig | None = None,
    label_column: str | None = None,
    force: bool = False,
    canaries: CanarySet | None = None,
    progress: Progress = NULL_PROGRESS,
) -> dict[str, Any]:
    """Make a run directory from foreign weights (safetensors, or a plain state_dict loaded with
    ``weights_only=True``; Opacus ``_module.`` / DDP ``module.`` prefixes are removed) plus a model spec.

    ``members``: indices into ``dataset`` of the records the weights were trained on; the other records
    are split into holdout/aux/test by :func:`dpaudit.data.splits_from_members` with ``split_seed``.
    Without ``members`` (legacy) the model is *assumed* trained on dpaudit's members split given by
    ``split_seed``/``fractions``, with a warning. ``preprocessing``: a fixed :class:`Standardizer`
    (the user's scaler), :class:`Identity`/"none" (features as they are; the default with members), or
    "standardize" (legacy only: fitted on the assumed members). ``claim``: recorded by
    :func:`claim_record` (None: no claim). ``recipe``: the attacker's approximation of the training, so
    that LiRA/shadow models can be trained (with this run's preprocessing, see
    :meth:`attacks.reference.Recipe.from_run`). Warnings are returned in ``meta["import"]["warnings"]``.
    ``canaries``: the records of ``dpaudit canaries make`` whose included ones the user's training added to
    its training set (each with probability 1/2); ``audit checkpoint`` then gives the formal one-run audit.
    ``progress``: the evaluation of the model on the members, holdout and test is one brief stage.
    """
    from dpaudit.checkpoint import check_weights_fit_spec, load_state_into, load_weights_file

    check_output_dir(out, force=force, inputs=[dataset.source])
    check_spec_fits(spec, dataset)
    warnings: list[str] = []
    legacy = members is None
    if legacy:
        splits = make_splits(len(dataset), split_seed, fractions)
        warnings.append(
            f"no member list given: assuming the model was trained on dpaudit's members split of {dataset.source!r} "
            f"(split seed {split_seed}, fractions {','.join(f'{f:g}' for f in fractions)}); if it was trained on "
            "another split, the attacks compare the wrong records (give --data and --members)"
        )
        split_meta = {"seed": splits.seed, "fractions": list(splits.fractions), "sizes": splits.sizes()}
        members_meta: dict[str, Any] = {"members": "assumed: dpaudit's split"}
    else:
        from dpaudit.data import IMPORT_NON_MEMBER_SHARES, splits_from_members

        splits = splits_from_members(len(dataset), members, split_seed)
        split_meta = {
            "seed": splits.seed,
            "fractions": [],
            "sizes": splits.sizes(),
            "members": "user",
            "non_member_shares": dict(IMPORT_NON_MEMBER_SHARES),
        }
        members_meta = {
            "members": "user",
            "members_file": members_source,
            "members_sha256": index_set_sha256(splits.members),
        }
    pre, fitted_on = _resolve_preprocessing(preprocessing, dataset, splits, legacy)
    state = load_weights_file(Path(weights))
    check_weights_fit_spec(spec, state, str(weights))  # before the model is built: a huge spec fails here
    model = build_model(spec, seed=0)  # seeded: importing draws nothing from torch's global generator
    if claim is not None:  # a DP claim for a model that mixes the examples of a batch cannot hold
        check_private_layers(model)
    load_state_into(model, state, str(weights))
    model.eval()
    fitted = FittedModel(outcome=TrainOutcome(model=model, privacy=None), preprocessing=pre, device=torch.device("cpu"))
    # A claim also needs a forward that leaves the weights alone (F.embedding's max_norm renormalises rows in
    # place in eval mode too): seen on this first evaluation, as the clippers see it during training.
    watch = ParameterWatch(list(model.parameters()), copy_values=True) if claim is not None else None
    if not np.all(np.isfinite(fitted.logits(dataset.view(splits.members[:256])))):
        raise CheckpointError(f"{weights}: the model gives NaN or infinite outputs on the data")
    if watch is not None:
        watch.check(model, during="a forward pass of the imported model (its training ran the same forward)")
        first = torch.as_tensor(np.array(pre.transform(dataset.rows(splits.members[:4]))))
        check_per_record_in_training(model, first.float() if first.is_floating_point() else first)
    # One evaluation of the members, holdout and test, for the member check and the metrics alike (each evaluated
    # the members and holdout: 2 x 12,200 CIFAR images through the model, without a progress line).
    logits = split_logits(fitted, dataset, splits, progress)
    check = member_check(fitted, dataset, splits, logits)
    if check["suspicious"]:
        warnings.append(check["note"])
    warnings.extend(dataset.label_warnings)
    warnings.extend(check["fit_warnings"])
    privacy = None
    if claim is not None:
        privacy, claim_warnings = claim_record(claim, dataset_size=len(splits.members))
        warnings.extend(claim_warnings)
    if recipe is not None:
        training: dict[str, Any] = {**recipe.to_dict(), "recipe_source": RECIPE_SOURCE, "source": str(weights)}
    else:
        training = {"algo": "imported", "source": str(weights)}
    data_meta = dataset.describe()
    if label_column is not None:
        data_meta["label_column"] = label_column
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": spec.to_dict(),
        "data": data_meta,
        "split": split_meta,
        "preprocessing": {**pre.to_dict(), "fitted_on": fitted_on},
        "training": training,
        "canaries": None
        if canaries is None
        else {**canaries.describe(), "inserted_by": "the imported run's own training"},
        "privacy": privacy,
        "metrics": metrics_for(fitted, dataset, splits, logits=logits),
        "seed": None,
        "import": {
            "weights": str(weights),
            "weights_sha256": _sha256_file(Path(weights)),
            **members_meta,
            "member_check": check,
            "warnings": warnings,
        },
        "versions": versions(),
    }
    if recipe is not None:
        meta["performance"] = PerfConfig().to_dict()
    arrays = None if canaries is None else {CANARY_FILE: canaries.arrays()}
    save_run(Path(out), model=model, meta=meta, splits=splits, force=force, arrays=arrays)
    return meta


def index_set_sha256(indices: np.ndarray) -> str:
    """sha256 of a sorted index set (little-endian int64), to identify a member list."""
    import hashlib

    return hashlib.sha256(np.unique(np.asarray(indices, np.int64)).astype("<i8").tobytes()).hexdigest()
