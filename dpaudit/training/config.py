"""Frozen training configurations.

Privacy-relevant settings (algorithm, sampling, noise, clipping norm, steps) live in
:class:`TrainConfig` / :class:`DPConfig`; performance settings (device, physical batch size,
per-example clipping implementation) live in :class:`PerfConfig`, so a performance flag can never
change a privacy claim.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from dpaudit.errors import InputError
from dpaudit.validation import (
    MAX_DERIVED_SEED,
    check_choice,
    check_claim_delta,
    check_float32,
    check_in_interval,
    check_noise_multiplier,
    check_positive,
    check_positive_int,
    check_seed,
)

SAMPLING = ("poisson", "shuffle")
CLIPPING = ("auto", "ghost", "vmap", "loop")
BACKENDS = ("torch", "jax")


@dataclass(frozen=True)
class DPConfig:
    """Settings of a differentially private trainer.

    Give either ``noise_multiplier`` or ``target_epsilon`` (the trainer then calibrates the noise
    multiplier with the accounting layer before training).
    """

    clip: float = 1.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    delta: float = 1e-5
    sampling: str = "poisson"
    accountant: str = "rdp"
    secure_noise: bool = False
    # A fixed Poisson sampling rate q (None: batch_size / N). The sampled Gaussian mechanism's
    # add/remove analysis assumes q does not depend on the data; fixing it makes two neighbouring
    # datasets of sizes N and N + 1 run exactly the same mechanism (what the multi-run audit needs).
    sample_rate: float | None = None
    # DP-SGD-JL (Bu et al. 2021, arXiv:2102.03013): the number r of JL projections that estimate the
    # per-example norms; privacy-relevant (the claim is the JLGaussian event's). None: exact norms.
    jl_projections: int | None = None

    def __post_init__(self) -> None:
        check_positive(clip=self.clip, finite=True)
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise InputError("give exactly one of --noise-multiplier or --epsilon for private training")
        if self.noise_multiplier is not None:
            check_noise_multiplier(noise_multiplier=self.noise_multiplier)
        if self.target_epsilon is not None:
            check_positive(epsilon=self.target_epsilon, finite=True)
        check_claim_delta(delta=self.delta)
        check_choice(SAMPLING, sampling=self.sampling)
        check_choice(("rdp", "pld"), accountant=self.accountant)
        if self.sample_rate is not None:
            check_in_interval(0.0, 1.0, hi_open=False, sample_rate=self.sample_rate)
            if self.sampling != "poisson":
                raise InputError("a fixed sample rate applies to Poisson sampling only")
        if self.jl_projections is not None:
            check_positive_int(jl_projections=self.jl_projections)
            if self.sampling != "poisson":
                raise InputError("DP-SGD-JL is analysed for Poisson sampling only (Bu et al. 2021, Lemma 4.3)")
            if self.accountant != "pld":
                raise InputError(
                    "DP-SGD-JL is accounted with PLD only (no RDP bound for its mechanism): use --accountant pld"
                )


@dataclass(frozen=True)
class TrainConfig:
    """What is trained and how (all settings that determine the model and its privacy)."""

    algo: str = "sgd"
    epochs: int = 30
    steps: int | None = None  # when set, overrides epochs
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    seed: int = 0
    dp: DPConfig | None = None

    def __post_init__(self) -> None:
        check_positive_int(epochs=self.epochs)
        if self.steps is not None:
            check_positive_int(steps=self.steps)
        check_positive_int(batch_size=self.batch_size)
        check_positive(finite=True, lr=self.lr)
        check_float32(lr=self.lr)  # torch's optimizers cast it to the float32 weights' type: 1e39 was exit 3
        check_in_interval(0.0, 1.0, lo_open=False, momentum=self.momentum)
        check_in_interval(0.0, math.inf, lo_open=False, weight_decay=self.weight_decay)
        check_float32(weight_decay=self.weight_decay)
        # Derived seeds arrive here (PATE's teachers, audit runs): see MAX_DERIVED_SEED.
        object.__setattr__(self, "seed", check_seed(limit=MAX_DERIVED_SEED, seed=self.seed))

    @property
    def sampling(self) -> str:
        """How batches are drawn: the DP config's sampling; non-private trainers walk shuffled permutations."""
        return "shuffle" if self.dp is None else self.dp.sampling

    def num_steps(self, n_train: int) -> int:
        """Number of (logical) optimisation steps: ``steps``, or ``epochs`` passes over the N records.

        Shuffled batches (non-private trainers, ``--sampling shuffle``): each pass is one permutation cut into
        ⌈N/B⌉ batches, the last one shorter when B does not divide N (PyTorch's ``DataLoader(drop_last=False)``,
        Keras' ``fit``), so E epochs are E·⌈N/B⌉ steps. Poisson sampling at rate q: ⌈E/q⌉ steps, E expected
        passes (TF Privacy's ``compute_dp_sgd_privacy`` convention); q = B/N unless ``dp.sample_rate`` fixes it,
        so ⌈E·N/B⌉ by default. Opacus' E·⌈N/B⌉ steps at q = 1/⌈N/B⌉ is also E expected passes; dpaudit's q is
        B/N, so E passes need E·N/B of its steps. Both agree when B | N.
        """
        if self.steps is not None:
            return self.steps
        if self.sampling == "shuffle":
            return self.epochs * -(-n_train // self.batch_size)
        return math.ceil(self.epochs / self._poisson_rate(n_train))

    def _poisson_rate(self, n_train: int) -> Fraction:
        """The Poisson rate q (expected passes per step) as an exact fraction: B/N, or the fixed
        ``dp.sample_rate`` read as the simplest fraction within 1e-12 of it (a rate typed as 0.01 or
        computed as 64/192 is meant as 1/100 or 1/3, not as its binary float, which would add a step)."""
        rate = None if self.dp is None else self.dp.sample_rate
        if rate is None:
            return Fraction(self.batch_size, n_train)
        return Fraction(rate).limit_denominator(10**12)

    def epoch_ended(self, steps_done: int, n_train: int, total_steps: int) -> int | None:
        """The epoch number of the training history's entry after ``steps_done`` of ``total_steps`` steps on
        ``n_train`` records; None when no entry is due there (one at each epoch's end and one after the last step).

        An epoch is ⌈N/B⌉ shuffled steps, or 1/q Poisson steps (one expected pass at rate q; epoch e ends at
        step ⌈e/q⌉), as :meth:`num_steps` counts them. After the last step, when it ends no epoch (``--steps``),
        the entry numbers the epoch it ran in (⌈·⌉)."""
        B, N, s = self.batch_size, n_train, steps_done
        if self.sampling == "shuffle":
            per_epoch = -(-N // B)
            if s % per_epoch == 0:
                return s // per_epoch
            return -(-s // per_epoch) if s == total_steps else None
        q = self._poisson_rate(N)
        done = math.floor(s * q)  # expected passes completed after s steps, ⌊s·q⌋
        if done > math.floor((s - 1) * q):
            return done
        return math.ceil(s * q) if s == total_steps else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        d = dict(d)
        dp = d.pop("dp", None)
        return cls(**d, dp=DPConfig(**dp) if dp else None)


@dataclass(frozen=True)
class PerfConfig:
    """Performance-only settings: they never change what is computed, only how fast."""

    device: str = "auto"
    max_physical_batch: int | None = None
    clipping: str = "auto"
    # "jax": the same algorithm, batches and claim in jit-compiled JAX (dpaudit.training.jax_backend);
    # only the noise generator differs. max_physical_batch is then the fixed padded chunk size.
    backend: str = "torch"
    # "bf16": the forward/backward passes of DP-SGD under torch.autocast(bfloat16); per-example
    # norms and the clipped sum stay in float32 (dpaudit.training.clipping.exact_matmuls says why).
    autocast: str | None = None

    def __post_init__(self) -> None:
        check_choice(("auto", "cpu", "cuda"), device=self.device)
        if self.autocast is not None:
            check_choice(("bf16",), autocast=self.autocast)
        check_choice(CLIPPING, clipping=self.clipping)
        check_choice(BACKENDS, backend=self.backend)
        if self.backend == "jax":  # jax_backend clips with its own ghost norms, at XLA's float32 PRECISION
            if self.autocast is not None:
                raise InputError("--autocast applies to --backend torch only (the JAX backend computes in float32)")
            if self.clipping != "auto":
                raise InputError(
                    f"--clipping {self.clipping} applies to --backend torch only "
                    "(the JAX backend computes its own per-example norms)"
                )
        if self.max_physical_batch is not None:
            check_positive_int(max_physical_batch=self.max_physical_batch)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- default recipes


@dataclass(frozen=True)
class Recipe:
    """Optimisation defaults of one (algorithm family, model kind): what ``dpaudit train`` uses for any of
    --epochs, --batch-size, --lr, --momentum, --l2 left out."""

    epochs: int
    batch_size: int
    lr: float
    momentum: float = 0.0
    l2: float = 0.0


NONPRIVATE_RECIPE = Recipe(epochs=30, batch_size=64, lr=0.1)
# DP-SGD defaults, measured on digits at epsilon = 8 (benchmarks/RESULTS.md, "Default recipes"): noise
# on the clipped gradient sum is sigma * C / B per step, so DP training wants larger batches and larger
# steps than non-private training (De et al. 2022, arXiv:2204.13650, Sec. 3; Ponomareva et al. 2023,
# "How to DP-fy ML", arXiv:2303.00654, Sec. 5.4). Adam's step is scale-free, hence its small lr.
DP_RECIPES: dict[tuple[str, str], Recipe] = {
    ("sgd", "logreg"): Recipe(epochs=30, batch_size=64, lr=0.5),
    ("sgd", "mlp"): Recipe(epochs=30, batch_size=64, lr=0.1),
    ("sgd", "cnn"): Recipe(epochs=60, batch_size=256, lr=0.25, momentum=0.9),
    ("sgd", "rnn"): Recipe(epochs=30, batch_size=64, lr=0.5),
    ("adam", "logreg"): Recipe(epochs=30, batch_size=64, lr=0.01),
    ("adam", "mlp"): Recipe(epochs=30, batch_size=64, lr=0.005),
    ("adam", "cnn"): Recipe(epochs=60, batch_size=256, lr=0.02),
    ("adam", "rnn"): Recipe(epochs=30, batch_size=64, lr=0.01),
}
# The convex learners (output/objective perturbation) need lambda > 0: their sensitivity is 2/(N lambda)
# (Chaudhuri, Monteleoni & Sarwate 2011, Cor. 8 and Thm. 9). On digits at epsilon 8 (~600 records, ten
# one-vs-rest classifiers) lambda in [0.01, 0.3] gave 0.20-0.35 test accuracy, best at the large end.
CONVEX_L2 = 0.1
PERTURBATION_ALGOS = ("outpert", "outpert-gaussian", "objpert")


# DP-SGD-JL: the number r of JL projections when --jl-projections is not given. The per-step sensitivity
# Z_r = 1/sqrt(chi2_r / r) is heavy-tailed for small r (P(Z_r > z) ~ z^-r, Bu et al. 2021, Prop. B.4), so
# r = 1 cannot reach epsilon 8 on digits with any noise (the calibration says so at once); r = 16 reaches it
# with test accuracy 0.92 on digits (mlp), at the cost of 16 Jacobian-vector products per step.
DEFAULT_JL_PROJECTIONS = 16


# Which algorithms read each `dpaudit train` option that not all of them read (parameter names; the CLI
# shows --name-with-dashes). One given for an algorithm that does not read it is refused
# (:func:`check_options_read`): a user who types --clip 1 with --algo sgd must not believe anything is clipped.
DPSGD_ALGOS = ("dpsgd", "dpadam", "dpsgd-jl", "dpadam-jl")
DPAGD_ALGOS = ("dpagd", "dpagd-huber")
AGGREGATION_ALGOS = ("pate", "dp-icl")
# Every trainer of dpaudit.training.algorithms.TRAINERS (a test checks the two agree).
TRAINER_ALGOS = ("sgd", "adam", *DPSGD_ALGOS, *PERTURBATION_ALGOS, *DPAGD_ALGOS)
SGD_STEP_ALGOS = ("sgd", "adam", *DPSGD_ALGOS)  # the trainers that take minibatch optimiser steps
AGGREGATION_OPTIONS = (
    "teachers", "aggregator", "queries", "sigma", "sigma1", "threshold", "max_answers", "shots", "claim", "sanitiser",
    "keep_private_diagnostics", "subsample",
)  # fmt: skip
OPTION_READERS: dict[str, tuple[str, ...]] = {
    "noise_multiplier": DPSGD_ALGOS,  # the convex learners and DP-AGD are calibrated from --epsilon
    "epsilon": (*DPSGD_ALGOS, *PERTURBATION_ALGOS, *DPAGD_ALGOS, *AGGREGATION_ALGOS),
    "delta": (*DPSGD_ALGOS, "outpert-gaussian", *DPAGD_ALGOS, *AGGREGATION_ALGOS),  # outpert/objpert: pure ε
    "clip": (*DPSGD_ALGOS, *DPAGD_ALGOS),  # DP-AGD's C_grad; the convex learners scale features to the unit ball
    "sampling": DPSGD_ALGOS,
    "accountant": DPSGD_ALGOS,  # DP-AGD is accounted in zCDP, outpert-gaussian with PLD, PATE with its own RDP
    "secure_noise": (*DPSGD_ALGOS, *PERTURBATION_ALGOS, *DPAGD_ALGOS),
    "jl_projections": ("dpsgd-jl", "dpadam-jl"),
    "clipping": ("dpsgd", "dpadam"),  # exact per-example clipping; the -jl trainers estimate norms (JLClipper)
    "autocast": ("dpsgd", "dpadam"),  # the exact clippers' bf16 forward/backward (not JL's jvp, not sgd/adam)
    "max_physical_batch": DPSGD_ALGOS,  # the private step's chunking (dpsgd.set_private_gradients, the JAX DP step)
    "whitebox_canaries": DPSGD_ALGOS,
    "canaries": TRAINER_ALGOS,
    "canary_kind": TRAINER_ALGOS,
    "canary_seed": TRAINER_ALGOS,
    "allow_inconclusive": TRAINER_ALGOS,
    "l2": TRAINER_ALGOS,  # λ of (λ/2)‖w‖²: the weight decay of every registered trainer
    "mechanism": PERTURBATION_ALGOS,
    "objective": DPAGD_ALGOS,
    **dict.fromkeys(AGGREGATION_OPTIONS, AGGREGATION_ALGOS),
    # DP-ICL's in-context predictor; PATE's teachers trained in parallel (DP-ICL's predictors run in-process): each
    # given to the other trained without a word.
    "predictor": ("dp-icl",),
    "workers": ("pate",),
    # The optimiser's settings: read by the trainers that take SGD/Adam steps, by PATE's and DP-ICL's student (and
    # teachers), and by Cloak's Adam (epochs, batch size, lr; not momentum, not steps). The convex learners solve
    # their ERM exactly (no epochs, batches or learning rate), and DP-AGD takes --steps as its "splits" only.
    **dict.fromkeys(("epochs", "batch_size", "lr"), (*SGD_STEP_ALGOS, *AGGREGATION_ALGOS, "cloak")),
    # SGD's heavy-ball momentum (PATE's and DP-ICL's SGD student too); Adam's moments are its own β (base.make_optimizer
    # passes none): --momentum 0.9 with --algo adam, dpadam or dpadam-jl trained without a word.
    "momentum": ("sgd", "dpsgd", "dpsgd-jl", *AGGREGATION_ALGOS),
    "steps": (*SGD_STEP_ALGOS, *DPAGD_ALGOS, *AGGREGATION_ALGOS),
    # Where the minibatch trainers run (the JAX backend has exactly these); PATE's teachers train on the CPU with
    # torch, the convex learners and DP-AGD in numpy: --backend jax / --device cuda were silently ignored there.
    **dict.fromkeys(("backend", "device"), SGD_STEP_ALGOS),
}
# Options read only together with another option (e.g. the kind of canary only when there are canaries).
OPTION_NEEDS: dict[str, tuple[str, ...]] = {
    "canary_kind": ("canaries",),
    "canary_seed": ("canaries", "whitebox_canaries"),
    # The refusal it lifts is of a canary set too small to refute the claim (workflows.runs): without canaries,
    # --allow-inconclusive was silently ignored.
    "allow_inconclusive": ("canaries", "whitebox_canaries"),
}


# TrainConfig / DPConfig fields under the `dpaudit train` option of OPTION_READERS that sets them, where the names
# differ (a fixed Poisson rate is part of the sampling). Fields of no option there (algo, seed) are read by all.
_FIELD_OPTIONS = {"weight_decay": "l2", "target_epsilon": "epsilon", "sample_rate": "sampling"}


def settings_read(config: TrainConfig) -> dict[str, Any]:
    """``config.to_dict()`` without the fields ``config.algo`` never reads (:data:`OPTION_READERS`), for the
    checkpoint's ``training`` record: a DP-AGD run recorded "epochs 30, batch_size 64, lr 0.1, sampling poisson,
    accountant rdp" that its full-batch, zCDP-accounted descent never read, and a reader took them for its recipe.
    Loading fills a dropped field with its default (:meth:`TrainConfig.from_dict`), which the algorithm ignores."""

    def read(name: str) -> bool:
        readers = OPTION_READERS.get(_FIELD_OPTIONS.get(name, name))
        return readers is None or config.algo in readers

    d = {k: v for k, v in config.to_dict().items() if k == "dp" or read(k)}
    if d["dp"] is not None:
        d["dp"] = {k: v for k, v in d["dp"].items() if read(k)}
    return d


def check_options_read(algo: str, given: Collection[str]) -> None:
    """Refuse (InputError) an option in ``given`` (the options the user set) that ``algo`` does not read.

    ``algo`` is the algorithm that runs (``outpert-gaussian`` for ``outpert --mechanism gaussian``)."""

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    for name, readers in OPTION_READERS.items():
        if name in given and algo not in readers:
            raise InputError(
                f"{flag(name)} does not apply to --algo {algo} (it is read by --algo {', '.join(readers)} only)"
            )
    for name, needs in OPTION_NEEDS.items():
        if name in given and not any(need in given for need in needs):
            raise InputError(f"{flag(name)} applies only with {' or '.join(map(flag, needs))}")


# The DPConfig / PerfConfig / TrainConfig fields a registered trainer is refused when it does not read them
# (:func:`check_config_read`), each with its value meaning "not given": the default, or (device) the values that the
# numpy learners honour by running on the CPU. Left out, with their reasons: ``noise_multiplier``/``target_epsilon``
# (DPConfig needs one; the convex learners refuse σ themselves, convex.check_epsilon_only); ``delta`` (always set:
# the pure-ε learners' claim holds at every δ); ``backend`` is listed for train_from_options' Python callers (a
# registered trainer refuses "jax" in Trainer.__init__ first: JaxTrainer runs it);
# ``epochs``, ``batch_size``, ``lr`` (their defaults 30, 64, 0.1 are values, and the recipes give the convex learners
# epochs 1; ``dpaudit train`` and :func:`dpaudit.workflows.runs.train_from_options` refuse them given, and
# :func:`settings_read` leaves them out of the record).
NOT_GIVEN: dict[str, Collection[Any]] = {
    "clip": (1.0,), "sampling": ("poisson",), "sample_rate": (None,), "accountant": ("rdp",),
    "jl_projections": (None,), "autocast": (None,), "clipping": ("auto",), "max_physical_batch": (None,),
    "device": ("auto", "cpu"), "momentum": (0.0,), "steps": (None,), "backend": ("torch",), "secure_noise": (False,),
}  # fmt: skip


def check_config_read(algo: str, config: TrainConfig, perf: PerfConfig) -> None:
    """Refuse (InputError, :func:`check_options_read`'s line) a field of ``config``/``perf`` set away from
    :data:`NOT_GIVEN` that the registered trainer ``algo`` never reads: a library caller's
    ``PerfConfig(autocast="bf16")`` with DP-SGD-JL, ``DPConfig(clip=5)`` with output perturbation or
    ``max_physical_batch`` with plain SGD trained without a word, as if honoured."""
    fields = {**asdict(perf), **config.to_dict()}
    fields.update(fields.pop("dp") or {})
    if algo == "outpert-gaussian" and fields.get("accountant") == "pld":
        fields.pop("accountant")  # its claim is accounted with PLD (convex.ConvexLearner.claim): what was asked
    given = {_FIELD_OPTIONS.get(k, k) for k, v in fields.items() if k in NOT_GIVEN and v not in NOT_GIVEN[k]}
    check_options_read(algo, given)


def default_recipe(algo: str, model_kind: str) -> Recipe:
    """The defaults of ``algo`` on a ``model_kind`` model (see :data:`DP_RECIPES`)."""
    if algo in PERTURBATION_ALGOS:
        return Recipe(epochs=1, batch_size=64, lr=0.1, l2=CONVEX_L2)  # closed-form learners: no SGD settings
    if algo.startswith("dp") and not algo.startswith("dpagd"):
        family = "adam" if algo.startswith("dpadam") else "sgd"
        return DP_RECIPES.get((family, model_kind), DP_RECIPES[(family, "mlp")])
    return NONPRIVATE_RECIPE


def recipe_help() -> str:
    """One line for --help: the defaults per algorithm family and model kind."""
    parts = [
        f"non-private {NONPRIVATE_RECIPE.epochs} ep, B {NONPRIVATE_RECIPE.batch_size}, lr {NONPRIVATE_RECIPE.lr:g}"
    ]
    for fam in ("sgd", "adam"):
        kinds = ", ".join(
            f"{k} {r.epochs}/{r.batch_size}/{r.lr:g}" + (f" momentum {r.momentum:g}" if r.momentum else "")
            for (f, k), r in DP_RECIPES.items()
            if f == fam
        )
        parts.append(f"dp{fam} (epochs/B/lr) {kinds}")
    parts.append(f"outpert/objpert --l2 {CONVEX_L2:g}; -jl --jl-projections {DEFAULT_JL_PROJECTIONS}")
    return "Defaults: " + "; ".join(parts) + "."


def fill_recipe(algo: str, model_kind: str, **given: Any) -> dict[str, Any]:
    """``given`` (epochs, batch_size, lr, momentum, l2: None = not given) with the defaults filled in."""
    r = asdict(default_recipe(algo, model_kind))
    return {k: (r[k] if v is None else v) for k, v in given.items()}


def resolve_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda requested but no CUDA device is available (install a CUDA torch build)")
    return torch.device(name)
