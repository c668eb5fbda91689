"""PATE and DP-ICL: teachers on disjoint parts of the private data, a noisy vote, a student on public data.

Algorithm (Papernot et al. 2017, arXiv:1610.05755, Sec. 2; 2018, arXiv:1802.08908, Sec. 3; DP-ICL:
Wu et al. 2024, arXiv:2305.01639, Sec. 3):

1. The members split (private) is permuted with the seed and cut into K disjoint parts.
   ``pate``: part t trains teacher t (any zoo model, non-private; teachers train in parallel with
   joblib, each seeded from (seed, t), so the result does not depend on ``workers``).
   ``dp-icl``: part t is the k exemplars ("shots") of in-context predictor t (:mod:`dpaudit.training.icl`).
2. Q unlabeled queries are drawn (seeded) from the auxiliary split, treated as public; each teacher votes
   its argmax class on each query.
3. The vote histograms are aggregated with noise (:mod:`dpaudit.aggregation`: LNMax, GNMax,
   Confident-GNMax); the answers are saved with the run (``answers.npz``).
4. The student (a zoo model) is trained non-privately on the answered queries with the noisy labels.
   Post-processing: the student's claim is the aggregator's (data-independent; or, asked for, the
   data-dependent one sanitised with smooth sensitivity; raw vote-derived values only when asked for).

Features are standardised with a scaler fitted on the auxiliary (public) split: a scaler fitted on the
members would let one record influence every teacher (and be released with the student).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpaudit.accounting.pate_smooth import SanitiserConfig
from dpaudit.aggregation import (
    CLAIMS,
    AggregatorConfig,
    aggregate,
    calibrate_aggregator,
    check_data_dependent_claim,
    check_sanitiser_applies,
    privacy_record,
    private_diagnostics,
    vote_histogram,
)
from dpaudit.data import DEFAULT_FRACTIONS, Dataset, Splits, Standardizer, fit_preprocessing, make_splits
from dpaudit.errors import InputError
from dpaudit.fileio import check_output_dir
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.seeding import derive_seed
from dpaudit.training.config import PerfConfig, TrainConfig
from dpaudit.validation import (
    check_choice,
    check_claim_delta,
    check_positive,
    check_positive_int,
    check_seed,
    check_workers,
)

ALGOS = ("pate", "dp-icl")
ANSWERS_FILE = "answers.npz"
# Defaults of ``train --algo pate|dp-icl`` (chosen on digits, benchmarks/RESULTS.md "Default recipes"):
# more teachers make the vote gaps larger relative to the answer noise (the data-dependent analysis
# needs consensus, Papernot et al. 2018, Sec. 4), fewer make each teacher better; Q queries cost
# privacy linearly in the data-independent analysis.
DEFAULT_TEACHERS = {"pate": 25, "dp-icl": 20}
DEFAULT_QUERIES = 100
DEFAULT_SHOTS = 10


@dataclass(frozen=True)
class AggregationConfig:
    """The PATE / DP-ICL recipe (privacy-relevant settings; ``workers`` is a performance setting apart).

    ``target_epsilon``: calibrate the aggregator's answer noise (``aggregator.sigma``) to this
    data-independent epsilon at ``delta`` over ``queries`` queries (the given sigma is then replaced).
    ``claim``: ``data-independent`` (default) or ``data-dependent`` (sanitised with smooth sensitivity,
    :func:`dpaudit.aggregation.privacy_record`); ``sanitiser``: its settings (None, or a None field: chosen by the
    public rule :func:`dpaudit.accounting.pate_smooth.choose_sanitiser`; a given one must be fixed before the votes
    are seen).
    """

    algo: str
    teachers: int
    aggregator: AggregatorConfig
    queries: int
    shots: int | None = None
    predictor: str = "knn"
    delta: float = 1e-5
    target_epsilon: float | None = None
    seed: int = 0
    claim: str = "data-independent"
    sanitiser: SanitiserConfig | None = None

    def __post_init__(self) -> None:
        check_choice(ALGOS, algo=self.algo)
        check_choice(CLAIMS, claim=self.claim)
        if self.sanitiser is not None and self.claim != "data-dependent":
            raise InputError("--sanitiser applies to --claim data-dependent")
        check_positive_int(teachers=self.teachers)
        check_positive_int(queries=self.queries)
        if not isinstance(self.aggregator, AggregatorConfig):
            raise InputError("expected aggregator to be an AggregatorConfig")
        self.aggregator.check_teachers(self.teachers)
        if self.claim == "data-dependent":  # refused before any teacher is trained (was: after them all)
            check_data_dependent_claim(self.aggregator)
        if self.aggregator.sample_rate is not None:
            if self.algo != "dp-icl":
                raise InputError("--subsample applies to --algo dp-icl (per-query sampling of exemplars)")
            if self.shots is not None:
                raise InputError("--subsample replaces --shots: each teacher's prompt is a Poisson sample")
        elif self.algo == "dp-icl":
            if self.shots is None:
                raise InputError("--algo dp-icl needs --shots k (exemplars per teacher)")
            check_positive_int(shots=self.shots)
        elif self.shots is not None:
            raise InputError("--shots applies only to --algo dp-icl")
        if self.algo != "dp-icl" and self.predictor != "knn":  # PATE's teachers are trained models, not predictors
            raise InputError("--predictor applies only to --algo dp-icl")
        check_claim_delta(delta=self.delta)  # the rule of every claim's δ (DPConfig's too)
        if self.target_epsilon is not None:
            check_positive(epsilon=self.target_epsilon)
        object.__setattr__(self, "seed", check_seed(seed=self.seed))

    def to_dict(self) -> dict[str, Any]:
        sanitiser = None if self.sanitiser is None else self.sanitiser.to_dict()
        return {**dataclasses.asdict(self), "aggregator": self.aggregator.to_dict(), "sanitiser": sanitiser}


def teacher_parts(n_members: int, config: AggregationConfig) -> list[np.ndarray]:
    """Positions (into the members split) of each teacher's disjoint part."""
    k = config.teachers
    if k > n_members:
        raise InputError(f"more teachers ({k}) than private training records ({n_members})")
    perm = np.random.default_rng(derive_seed(config.seed, stream=1)).permutation(n_members)
    if config.algo == "dp-icl":
        if k * config.shots > n_members:
            raise InputError(
                f"--shots {config.shots} x --teachers {k} = {k * config.shots} exemplars, but the private set "
                f"has {n_members} records (at most --shots {n_members // k} with {k} teachers)"
            )
        return [np.sort(perm[t * config.shots : (t + 1) * config.shots]) for t in range(k)]
    return [np.sort(p) for p in np.array_split(perm, k)]


def query_indices(splits: Splits, config: AggregationConfig) -> np.ndarray:
    """The first Q records of the auxiliary (public) split in a seeded random order."""
    if config.queries > len(splits.aux):
        raise InputError(f"--queries {config.queries} exceeds the auxiliary (public) split ({len(splits.aux)} records)")
    perm = np.random.default_rng(derive_seed(config.seed, stream=2)).permutation(len(splits.aux))
    return splits.aux[perm[: config.queries]]


def _teacher_votes(dataset, idx, spec, config: TrainConfig, pre, queries_X: np.ndarray) -> np.ndarray:
    """Train one teacher on ``idx`` and return its argmax votes (module level, for joblib workers)."""
    from dpaudit.models import one_torch_thread
    from dpaudit.training.run import fit_model

    config = dataclasses.replace(config, batch_size=min(config.batch_size, len(idx)))
    with one_torch_thread():  # joblib runs the jobs in the caller's process when workers=1
        fitted = fit_model(dataset, idx, spec, config, PerfConfig(device="cpu"), preprocessing=pre)
        return fitted.logits(queries_X).argmax(1).astype(np.int64)


def pate_votes(dataset, members, parts, spec, teacher: TrainConfig, pre, queries_X, *, workers: int = 1) -> np.ndarray:
    """(K, Q) votes of K teachers trained on ``members[parts[t]]`` (seed (teacher.seed, t))."""
    from joblib import delayed

    from dpaudit.validation import worker_pool

    configs = [dataclasses.replace(teacher, seed=derive_seed(teacher.seed, stream=100 + t)) for t in range(len(parts))]
    jobs = (
        delayed(_teacher_votes)(dataset, members[p], spec, c, pre, queries_X)
        for p, c in zip(parts, configs, strict=True)
    )
    return np.stack(worker_pool(workers)(jobs))


def icl_votes(predictor, ex_X: np.ndarray, ex_y: np.ndarray, parts, queries_X: np.ndarray) -> np.ndarray:
    """(K, Q) votes of K in-context predictors, teacher t prompted with exemplars ``parts[t]`` only."""
    return np.stack([predictor.predict_proba(ex_X[p], ex_y[p], queries_X).argmax(1) for p in parts]).astype(np.int64)


def subsampled_icl_hist(predictor, ex_X, ex_y, queries_X, config: AggregationConfig, n_classes: int) -> np.ndarray:
    """(Q, C) vote histogram of DP-ICL with per-query Poisson subsampling (Wu et al. 2024, Sec. 3).

    Each private record gets a teacher id drawn i.i.d. uniform in [0, K) (data-independent); for every query a
    fresh Poisson sample keeps each record with probability q, and teacher t is prompted with its sampled
    records only. A teacher whose sample is empty abstains (its vote is not counted: adding a record then moves
    one count by 1, within the analysis' sqrt(2))."""
    k, q = config.teachers, config.aggregator.sample_rate
    rng = np.random.default_rng(derive_seed(config.seed, stream=5))
    owner = rng.integers(0, k, size=len(ex_X))
    hist = np.zeros((len(queries_X), n_classes), dtype=np.int64)
    for j in range(len(queries_X)):
        kept = rng.random(len(ex_X)) < q
        for t in range(k):
            p = np.flatnonzero(kept & (owner == t))
            if len(p):
                hist[j, int(predictor.predict_proba(ex_X[p], ex_y[p], queries_X[j : j + 1])[0].argmax())] += 1
    return hist


def public_preprocessing(dataset: Dataset, splits: Splits):
    if len(splits.aux) == 0:
        raise InputError("PATE and DP-ICL need a non-empty auxiliary split (the public query pool): see --split")
    return fit_preprocessing(dataset, splits.aux)


def train_aggregation_run(
    dataset: Dataset,
    spec,
    config: AggregationConfig,
    student: TrainConfig,
    *,
    out: Path | None,
    workers: int = 1,
    split_seed: int = 0,
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS,
    label_column: str | None = None,
    force: bool = False,
    progress: Progress = NULL_PROGRESS,
    keep_private_diagnostics: bool = False,
) -> dict[str, Any]:
    """Run PATE or DP-ICL end to end and (if ``out``) save the student as a run directory.

    ``student``: how the student (and, for PATE, each teacher) is trained (a non-private algo: sgd, adam).
    Returns the checkpoint metadata; ``training.aggregation`` holds the recipe and label statistics.
    Values computed from the private votes (raw data-dependent epsilon, vote and teacher accuracy) are kept
    out of it unless ``keep_private_diagnostics`` (then under ``private_diagnostics``, labelled).
    """
    from dpaudit.training.run import FittedModel, check_spec_fits, fit_model, learn_warnings, metrics_for, record_run

    if student.dp is not None or student.algo not in ("sgd", "adam"):
        raise InputError(f"the student and teachers train non-privately (sgd or adam), not {student.algo!r}")
    check_workers(workers)  # one process per worker: at most the local cores
    if workers != 1 and config.algo != "pate":  # DP-ICL's predictors answer in this process
        raise InputError(
            f"--workers applies only to --algo pate (its teachers are trained in parallel), not {config.algo}"
        )
    if out is not None:
        check_output_dir(out, force=force, inputs=[dataset.source])
    check_spec_fits(spec, dataset, own_module=False)  # teachers and student from --model only
    splits = make_splits(len(dataset), split_seed, fractions)
    pre = public_preprocessing(dataset, splits)
    subsampled = config.aggregator.sample_rate is not None
    parts = None if subsampled else teacher_parts(len(splits.members), config)
    q_idx = query_indices(splits, config)
    queries_X = dataset.rows(q_idx)
    agg = config.aggregator
    if config.target_epsilon is not None:  # public quantities only: before the votes
        agg = calibrate_aggregator(
            agg, target_epsilon=config.target_epsilon, delta=config.delta, n_queries=len(q_idx),
            n_classes=dataset.n_classes,
        )  # fmt: skip
    if config.claim == "data-dependent":
        check_sanitiser_applies(
            agg, n_queries=len(q_idx), n_classes=dataset.n_classes, n_teachers=config.teachers, delta=config.delta,
            sanitiser=config.sanitiser,
        )  # fmt: skip
    votes = None  # (K, Q) teacher votes; none with per-query subsampling (each query has its own teachers)
    with progress.task(f"{config.algo}: {config.teachers} teachers", 1) as advance:
        if config.algo == "pate":
            votes = pate_votes(dataset, splits.members, parts, spec, student, pre, queries_X, workers=workers)
        else:
            from dpaudit.training.icl import make_predictor

            predictor = make_predictor(config.predictor, dataset.n_classes, tokens=dataset.kind == "tokens")
            ex_X, ex_y = pre.transform(dataset.rows(splits.members)), dataset.y[splits.members]
            if subsampled:
                hist = subsampled_icl_hist(predictor, ex_X, ex_y, pre.transform(queries_X), config, dataset.n_classes)
            else:
                votes = icl_votes(predictor, ex_X, ex_y, parts, pre.transform(queries_X))
        advance(1)
    if votes is not None:
        hist = vote_histogram(votes, dataset.n_classes)
    answers = aggregate(hist, agg, derive_seed(config.seed, stream=3))
    answered = answers >= 0
    if not answered.any():
        raise InputError("the aggregator answered no query; lower --threshold or --sigma1, or ask more --queries")
    true = dataset.y[q_idx]
    student_data = Dataset(
        name=f"{dataset.name} (noisy labels)", X=dataset.X[q_idx[answered]], y=answers[answered],
        n_classes=dataset.n_classes, kind=dataset.kind, source=dataset.source,
    )  # fmt: skip
    student_cfg = dataclasses.replace(student, batch_size=min(student.batch_size, int(answered.sum())))
    fitted = fit_model(student_data, np.arange(len(student_data)), spec, student_cfg, PerfConfig(), preprocessing=pre)
    privacy = privacy_record(
        agg, hist, answers, delta=config.delta, n_teachers=config.teachers, claim=config.claim,
        sanitiser=config.sanitiser, seed=derive_seed(config.seed, stream=4),
    )  # fmt: skip
    if (note := data_dependent_note(privacy, config.target_epsilon)) is not None:
        privacy = {**privacy, "note": note}  # what `dpaudit train` prints, kept with the claim
    stats = {
        "recipe": {**config.to_dict(), "aggregator": agg.to_dict()},
        "n_queries": len(q_idx),
        "n_answered": int(answered.sum()),
        # the answers are the mechanism's output and the queries' labels are public: not a private value
        "answer_accuracy": float(np.mean(answers[answered] == true[answered])),
        "answers_file": ANSWERS_FILE,
    }
    if keep_private_diagnostics:  # computed from the private votes: NOT differentially private
        stats["private_diagnostics"] = {
            **private_diagnostics(
                agg, hist, answers, delta=config.delta, n_teachers=config.teachers, sanitiser=config.sanitiser
            ),
            "vote_accuracy": float(np.mean(hist.argmax(1) == true)),
            "teacher_accuracy": None if votes is None else float(np.mean(votes == true[None, :])),
        }
    training = {**student_cfg.to_dict(), "algo": config.algo, "student_algo": student.algo}
    training.update(steps_run=student_cfg.num_steps(len(student_data)), history=fitted.outcome.history)
    training["aggregation"] = stats
    metrics = metrics_for(FittedModel(fitted.outcome, pre, fitted.device), dataset, splits)
    # The student never sees the members; its accuracy on them (a metric the run records anyway) at chance means
    # the teachers' labels taught it nothing (before: no warning, e.g. 35.7% where the majority class has 94.3%).
    found = learn_warnings(
        dataset, splits, metrics, records="private training records (the teachers' data)", algo=config.algo
    )
    found += answer_warnings(answers[answered], true[answered], agg, config.teachers)
    return record_run(
        out, model=fitted.model, spec=spec, dataset=dataset, splits=splits, label_column=label_column,
        preprocessing={**pre.to_dict(), "fitted_on": "aux"} if isinstance(pre, Standardizer) else pre.to_dict(),
        training=training, performance={**PerfConfig().to_dict(), "workers": workers}, privacy=privacy,
        metrics=metrics, seed=config.seed, extra={"fit_warnings": found} if found else None,
        arrays={ANSWERS_FILE: {"query_idx": q_idx, "answers": answers}}, force=force,
    )  # fmt: skip


def data_dependent_note(privacy: dict[str, Any], asked: float | None) -> str | None:
    """Why a run's data-dependent claim is above the --epsilon asked for (DP-ICL, 5 teachers, 20 queries, --epsilon 1
    --claim data-dependent: ε = 2.65 with no word): --epsilon calibrates σ for the data-independent bound, and the
    sanitised data-dependent analysis charges its own releases too. `dpaudit train` prints it and the run's claim
    records it (``privacy["note"]``). None when there is nothing to say."""
    from dpaudit import numfmt

    claimed, independent = privacy.get("epsilon"), privacy.get("data_independent_epsilon")
    if asked is None or privacy.get("claim") != "data-dependent" or claimed is None or claimed <= asked:
        return None
    # upper(claimed) >= claimed > asked, printed as given: the printed pair keeps the order
    return (
        f"the data-dependent claim ε = {numfmt.upper(claimed)} is above the --epsilon {numfmt.exact(asked)} asked "
        "for: --epsilon calibrates "
        "the noise for the data-independent bound"
        + ("" if independent is None else f" (ε = {numfmt.upper(independent)} here)")
        + ", and the sanitised data-dependent analysis also charges its own releases; choose --claim "
        "data-independent before training for that bound"
    )


def answer_warnings(answers: np.ndarray, true: np.ndarray, agg: AggregatorConfig, n_teachers: int) -> list[str]:
    """A warning when the aggregator's answers agree with the queries' own labels no more often than chance (the
    test of the learn warnings, :func:`dpaudit.training.run.chance_test`): the student then learns from noise, and
    the generic "train longer" advice misleads. `train --algo pate --epsilon 2` on digits (25 teachers, 100
    queries) calibrated σ = 30.4 against votes of at most 25 and answered 16% right (chance 14%). The queries and
    their labels are public and the answers are the mechanism's output: no private value is used."""
    from dpaudit import numfmt
    from dpaudit.training.run import MEMBER_CHECK_ALPHA, chance_test

    n, correct = len(answers), int(np.sum(answers == true))
    if n == 0:
        return []
    chance, p = chance_test(true, correct)
    if p < MEMBER_CHECK_ALPHA:
        return []
    if agg.name == "argmax":
        cause = "the teachers' plurality is no better than chance (no noise is added: the teachers learned too little)"
    else:
        scale = "Laplace b" if agg.name == "lnmax" else "σ"
        cause = (
            f"the answer noise ({scale} = {numfmt.nearest(agg.sigma)} against the votes of {n_teachers} teachers) "
            "drowns the vote: ask fewer --queries, or use a larger --epsilon or more --teachers"
        )
    return [
        f"the aggregator's {n} answers agree with the queries' labels {correct / n:.1%} of the time ({correct} of "
        f"{n}), not above chance ({chance:.1%} by always answering the most frequent class; one-sided binomial "
        f"p = {p:.3g}): {cause}; the student learns from noise"
    ]


def train_from_options(
    out: Path,
    *,
    algo: str,
    teachers: int | None,
    aggregator: str,
    queries: int | None,
    sigma: float | None,
    sigma1: float | None,
    threshold: float | None,
    max_answers: int | None,
    shots: int | None,
    predictor: str,
    epsilon: float | None,
    delta: float,
    seed: int,
    data: str,
    label_column: str | None,
    model: str,
    hidden: tuple[int, ...] | None,
    activation: str | None,
    epochs: int | None,
    steps: int | None,
    batch_size: int | None,
    lr: float | None,
    momentum: float | None,
    weight_decay: float,
    split_seed: int,
    fractions: tuple[float, ...],
    workers: int = 1,
    force: bool = False,
    progress: Progress = NULL_PROGRESS,
    claim: str = "data-independent",
    keep_private_diagnostics: bool = False,
    subsample: float | None = None,
    sanitiser: str | None = None,
    notify: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``dpaudit train --algo pate|dp-icl``: build the configs from the command's options and run.

    The student (and each PATE teacher) is trained with SGD at ``lr``/``momentum``. With ``epsilon`` the
    answer noise is calibrated (``sigma`` may then be omitted; for lnmax/gnmax it is ignored)."""
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import fill_recipe

    teachers = DEFAULT_TEACHERS[algo] if teachers is None and algo in DEFAULT_TEACHERS else teachers
    queries_given = queries is not None
    queries = DEFAULT_QUERIES if queries is None else queries
    shots_given = shots is not None
    if algo == "dp-icl" and shots is None and subsample is None:
        shots = DEFAULT_SHOTS
    if epsilon is None and sigma is None and aggregator != "argmax":
        raise InputError(f"--algo {algo} needs --epsilon (calibrates the vote noise) or --sigma")
    if epsilon is not None and sigma is None and aggregator != "argmax":
        sigma = 1.0  # placeholder, replaced by the calibration
    r = fill_recipe("sgd", model, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum)
    epochs, batch_size, lr, momentum = r["epochs"], r["batch_size"], r["lr"], r["momentum"]
    agg = AggregatorConfig(
        aggregator, sigma=sigma, sigma1=sigma1, threshold=threshold, max_answers=max_answers, sample_rate=subsample
    )
    config = AggregationConfig(
        algo=algo, teachers=teachers, aggregator=agg, queries=queries, shots=shots, predictor=predictor, delta=delta,
        target_epsilon=epsilon, seed=seed, claim=claim,
        sanitiser=None if sanitiser is None else SanitiserConfig.parse(sanitiser),
    )  # fmt: skip
    student = TrainConfig(
        algo="sgd", epochs=epochs, steps=steps, batch_size=batch_size, lr=lr, momentum=momentum,
        weight_decay=weight_decay, seed=seed,
    )  # fmt: skip
    check_output_dir(out, force=force, inputs=[data])
    ds = load_dataset(data, label_column=label_column)
    # Defaults the user never chose that the data cannot meet are fitted to it, with a notice (`train --algo dp-icl
    # --data wine` stopped on 100 queries against 44 public records, then on 10 shots x 20 teachers against 62).
    splits = make_splits(len(ds), split_seed, fractions)
    fitted = {}
    if not queries_given and 0 < len(splits.aux) < queries:
        fitted["queries"] = (queries, len(splits.aux), f"the {len(splits.aux)} records of the public (aux) split")
    n_private = len(splits.members)
    if not shots_given and shots is not None and teachers <= n_private < shots * teachers:
        fitted["shots"] = (shots, n_private // teachers, f"the {n_private} private records over {teachers} teachers")
    for name, (default, value, what) in fitted.items():
        if notify is not None:
            notify(f"the default --{name} {default} does not fit {what}; using {value} (give --{name} to choose)")
    config = dataclasses.replace(config, **{name: value for name, (_, value, _) in fitted.items()})
    spec = default_spec(
        model, input_shape=ds.feature_shape, n_classes=ds.n_classes, vocab_size=ds.vocab_size,
        hidden=hidden, activation=activation,
    )  # fmt: skip
    return train_aggregation_run(
        ds, spec, config, student, out=out, workers=workers, split_seed=split_seed, fractions=fractions,
        label_column=label_column, force=force, progress=progress, keep_private_diagnostics=keep_private_diagnostics,
    )  # fmt: skip
