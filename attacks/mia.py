"""Membership inference against a dpaudit checkpoint: one call runs the chosen attacks.

Threat model. Candidates are the target's members and holdout records (the attacker knows the
records, not which are members; ground truth is used only to evaluate the scores). The attacker's
own data is the auxiliary split. Shadow models (Shokri et al.) train on disjoint halves of aux;
reference models (LiRA, RMIA) on random halves of a population (the candidates plus aux records up
to twice the target's training set size), each candidate IN for half of them (Carlini et al. 2022).
All of them reuse the target's training recipe (:func:`dpaudit.training.run.configs_from_meta`),
with a different seed per model, so a DP target gets DP reference models.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attacks.lira import LiRA, balanced_membership
from attacks.reference import Recipe, seeds_for, train_models
from attacks.result import AttackResult, save_score_files
from attacks.rmia import RMIA
from attacks.shadow import ShadowAttack
from attacks.threshold import THRESHOLD_METHODS, log_p_from_margin, logit_margin, loss_score, threshold_scores
from dpaudit.budget import Cost, check_cost
from dpaudit.checkpoint import Run, as_run
from dpaudit.errors import InputError
from dpaudit.fileio import check_output_file
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.validation import check_non_negative, check_positive_int, check_workers, shown

METHODS = (*THRESHOLD_METHODS, "shadow", "lira", "rmia")
AUTO_SHADOW_MODELS = 4
# One bootstrap resample of one attack's scores (attacks.metrics.bootstrap_ci: a ROC and its metrics), a floor for
# dpaudit.budget: ~1e-4 s on a few hundred records on one core, more on more.
BOOTSTRAP_SECONDS = 1e-4
ALL = ("loss", "confidence", "entropy", "modified-entropy", "shadow", "lira", "rmia")


def parse_methods(methods: str | Sequence[str]) -> tuple[str, ...]:
    """Method names from a sequence or a comma-separated string; "all" expands; order kept, no repeats."""
    names = methods.split(",") if isinstance(methods, str) else list(methods)
    out: list[str] = []
    for raw in names:
        name = raw.strip().lower()
        if not name:
            continue
        expanded = ALL if name == "all" else (name,)
        for n in expanded:
            if n not in METHODS:
                raise InputError(f"unknown attack method {n!r}; valid: {', '.join([*METHODS, 'all'])}")
            if n not in out:
                out.append(n)
    if not out:
        raise InputError("no attack method given")
    return tuple(out)


def candidates(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Candidate record ids (sorted, so their order reveals nothing) and their ground-truth membership."""
    ids = np.concatenate([run.splits.members, run.splits.holdout]).astype(np.int64)
    member = np.concatenate([np.ones(len(run.splits.members), bool), np.zeros(len(run.splits.holdout), bool)])
    order = np.argsort(ids, kind="stable")
    return ids[order], member[order]


def duplicated_nonmembers(ds, members: np.ndarray, nonmembers: np.ndarray) -> int:
    """How many non-members are exact copies of a member (same features, same label).

    A user's data may repeat records (a table with duplicate rows); a copy of a member in the holdout is
    scored like the member it repeats but counted as a non-member, so every attack's AUC and TPR are
    understated. Rows are compared by a 128-bit BLAKE2b digest of their bytes and label (two different rows
    collide with probability ~2^-128 per pair), read a block of rows at a time: memory-mapped data stays out
    of memory, and the set holds 16 bytes per member instead of the row (~600 MB for CIFAR-10's members)."""

    def row_keys(idx: np.ndarray):
        for start in range(0, len(idx), 4096):
            part = np.asarray(idx[start : start + 4096], dtype=np.int64)
            rows = np.ascontiguousarray(ds.rows(part).reshape(len(part), -1))
            labels = np.asarray(ds.y[part], dtype=np.int64)
            for row, label in zip(rows, labels, strict=True):
                yield hashlib.blake2b(row.tobytes() + label.tobytes(), digest_size=16).digest()

    seen = set(row_keys(members))
    return sum(key in seen for key in row_keys(nonmembers))


def shadow_partition(
    aux: np.ndarray, n_shadow: int, *, n_target_train: int, batch_size: int, seed: int
) -> list[np.ndarray]:
    """Disjoint training sets (IN) of ``n_shadow`` shadow models drawn from the aux split.

    Each shadow model gets an equal share of aux, half of it IN (its training set), the other half
    left OUT (Shokri et al. 2017, §IV-B/C: disjoint shadow training and test sets), with at most as
    many IN records as the target trained on. Each IN set must hold at least one batch (the
    recipe's batch size), so aux must hold 2 * K * batch_size records.
    """
    check_positive_int(shadow_models=n_shadow)
    n_aux = len(aux)
    n_in = min(n_aux // (2 * n_shadow), n_target_train)
    if n_in < max(batch_size, 1):
        need = 2 * n_shadow * batch_size
        k_max = n_aux // (2 * batch_size)
        hint = f"use --shadow-models {k_max} or fewer, or" if k_max >= 1 else "use"
        raise InputError(
            f"the auxiliary split has {n_aux} records but {n_shadow} shadow model(s) need at least {need} "
            f"(each trains on >= batch size {batch_size} records and holds out as many, all disjoint); "
            f"{hint} a larger aux split (dpaudit train --split)"
        )
    perm = np.random.default_rng(seed).permutation(aux)
    return [np.sort(perm[2 * k * n_in : (2 * k + 1) * n_in]) for k in range(n_shadow)]


def fit_shadow_attack(
    logits: np.ndarray,
    shadow_in: list[np.ndarray],
    aux: np.ndarray,
    labels: np.ndarray,
    *,
    classifier: str = "logreg",
    seed: int = 0,
) -> tuple[ShadowAttack, dict]:
    """Fit the Shokri et al. attack classifier on K shadow models' logits ``(K, n_records, k)``.

    Attack training data: for shadow model k, its IN records labelled "in" and every other aux record
    (never in its training set, Shokri et al. §IV-C) labelled "out"; IN and OUT are weighted
    equally. The extra OUT records sharpen the OUT tail the classifier needs at low FPR. With K >= 2
    each record's feature is calibrated by the mean phi of the shadow models that did not train on
    it (Watson et al. 2022, arXiv:2111.08440), excluding k itself.

    Design chosen on 8 development targets (digits MLPs, --hidden 256 --epochs 100, split seeds 1-8;
    not the reported target), K = 3: calibrated features + all-aux OUT records + logistic regression
    gave mean AUC 0.589 and TPR@1%FPR 0.025 (loss threshold: 0.543 / 0.010); without calibration
    0.550 / 0.013; gradient boosting 0.555 / 0.012; per-class classifiers (a few dozen records per
    class) ranked worse still.
    """
    n_models = len(shadow_in)
    in_aux = np.stack([np.isin(aux, idx) for idx in shadow_in], axis=1)  # (n_aux, K): trained on it
    phi = np.stack([logit_margin(lg[aux], labels[aux]) for lg in logits], axis=1)  # (n_aux, K)
    calibrate = n_models >= 2
    parts_logits, parts_labels, parts_member, parts_ref = [], [], [], []
    for k in range(n_models):
        if calibrate:
            others = ~in_aux & (np.arange(n_models) != k)  # models that did not train on the record, not k
            usable = others.any(axis=1)  # a record of another shadow with K = 2 has no such model
            ref = np.where(others, phi, 0.0).sum(axis=1) / np.maximum(others.sum(axis=1), 1)
        else:
            usable, ref = np.ones(len(aux), bool), np.zeros(len(aux))
        parts_logits.append(logits[k][aux[usable]])
        parts_labels.append(labels[aux[usable]])
        parts_member.append(in_aux[usable, k])
        parts_ref.append(ref[usable])
    attack = ShadowAttack(classifier=classifier, seed=seed).fit(
        np.concatenate(parts_logits),
        np.concatenate(parts_labels),
        np.concatenate(parts_member),
        np.concatenate(parts_ref) if calibrate else None,
    )
    params = {
        "classifier": classifier,
        "per_class": attack.per_class,
        "features": attack.features,
        "calibrated": calibrate,
        "shadow_train_size": len(shadow_in[0]),
    }
    return attack, params


def reference_population(candidate_ids: np.ndarray, aux: np.ndarray, n_target_train: int, *, seed: int) -> np.ndarray:
    """Records the LiRA/RMIA reference models draw their training halves from (sorted).

    The candidates plus enough random aux records that the population holds twice the target's
    training set: each reference model then trains on a random half, as many records as the target
    (Carlini et al. 2022, §IV: the target is like one of the models, trained on half the population).
    Reference models trained on more data than the target generalise better and model its IN/OUT
    behaviour worse. When the candidates alone exceed twice the training set, no aux record is added.
    """
    extra = max(0, min(len(aux), 2 * n_target_train - len(candidate_ids)))
    chosen = np.random.default_rng([seed, 2]).choice(aux, size=extra, replace=False)
    return np.union1d(candidate_ids, chosen).astype(np.int64)


def run_mia(
    run: Run,
    methods: str | Sequence[str] = ("loss", "shadow", "lira"),
    *,
    shadow_models: int | None = 4,
    reference_models: int = 16,
    online: bool = True,
    workers: int = 1,
    scheduler: str | None = None,
    seed: int = 0,
    cache_dir: Path | str | None = None,
    min_models: int = 2,
    shadow_classifier: str = "logreg",
    n_bootstrap: int = 200,
    progress: Progress = NULL_PROGRESS,
    warn: Callable[[str], None] = lambda message: None,
) -> list[AttackResult]:
    """Run membership inference attacks on a loaded checkpoint; one :class:`AttackResult` per method.

    ``methods``: any of loss, confidence, entropy, modified-entropy (reference-free thresholds),
    shadow (Shokri et al. with ``shadow_models`` shadow models; None: as many as the aux split fits,
    at most 4), lira (Carlini et al., ``online`` or
    offline, ``reference_models`` reference models; records with fewer than ``min_models`` IN/OUT
    models are refused), rmia (Zarifzadeh et al., sharing LiRA's reference models), or "all".
    Reference training runs on ``workers`` local processes or the Dask ``scheduler`` and is cached
    under ``cache_dir`` (None: :func:`dpaudit.cache.default_cache_dir`). ``seed`` fixes the
    shadow/reference partitions, model seeds and bootstrap. ``warn`` hears of holdout records that copy a
    member (:func:`duplicated_nonmembers`: the metrics then understate the attacks).
    """
    run = as_run(run)
    methods = parse_methods(methods)
    check_non_negative(seed=seed)
    seed = int(seed)
    needs_refs = any(m in ("lira", "rmia") for m in methods)
    _check_options(run, methods, shadow_models, reference_models, min_models)
    workers = check_workers(workers, scheduler=scheduler)
    ds = run.dataset()  # verifies the data hash: the checkpoint must match the data it was trained on
    ids, member = candidates(run)
    copies = duplicated_nonmembers(ds, run.splits.members, run.splits.holdout)
    if copies:
        warn(
            f"{copies} of {len(run.splits.holdout)} non-members (holdout records) are exact copies of a member "
            "(your data repeats records): the attacks score them as the members they copy, so every AUC and TPR "
            "below understates the leakage; remove duplicate records before training to measure it"
        )
    with progress.task("the target's logits", len(ids), brief=True) as advance:  # minutes for CIFAR on a CPU
        target = _Target(ids, ds.y[ids], run.logits(ds.view(ids), advance=advance))  # a batch at a time
    recipe = Recipe.from_run(run, ds) if ("shadow" in methods or needs_refs) else None
    train = functools.partial(
        train_models, workers=workers, scheduler=scheduler, cache_dir=cache_dir, progress=progress
    )
    scored = [(m, threshold_scores(m, target.logits, target.y), {}) for m in methods if m in THRESHOLD_METHODS]
    if "shadow" in methods:
        scored.append(_shadow_attack(run, ds, recipe, target, shadow_models, shadow_classifier, seed, train))
    if needs_refs:
        scored += _reference_attacks(run, recipe, target, methods, reference_models, online, min_models, seed, train)
    order = {m: i for i, m in enumerate(methods)}
    results = [
        AttackResult.from_scores(
            name, scores, member, ids, {"method": name, **params}, n_bootstrap=n_bootstrap, seed=seed
        )
        for name, scores, params in scored
    ]
    return sorted(results, key=lambda r: order[r.name])


@dataclass(frozen=True)
class _Target:
    """The candidates' record ids, labels and the target model's logits on them."""

    ids: np.ndarray
    y: np.ndarray
    logits: np.ndarray


# Which attacks read each option of `attack mia` (and `audit checkpoint`) that not all of them read; one given with
# --attacks naming none of its readers is refused (check_options_read): `--attacks loss --offline`,
# `--reference-models 3`, `--min-models 5`, `--workers 2` ran the loss attack with exit 0, as if honoured.
TRAINING_METHODS = ("shadow", "lira", "rmia")  # the attacks that train models (shadow or reference)
MIA_OPTION_READERS: dict[str, tuple[str, ...]] = {
    "shadow_models": ("shadow",),
    "reference_models": ("lira", "rmia"),
    "online": ("lira", "rmia"),
    "min_models": ("lira",),
    # Not --cache-dir/--no-cache: they say where trained models are kept, and with none trained none is kept anywhere.
    **dict.fromkeys(("workers", "scheduler"), TRAINING_METHODS),
}


def check_options_read(methods: Sequence[str], given: Collection[str]) -> None:
    """Refuse (InputError) an option in ``given`` (the options the user set) that none of ``methods`` reads."""
    for name, readers in MIA_OPTION_READERS.items():
        if name in given and not set(readers) & set(methods):
            flag = "--online/--offline" if name == "online" else "--" + name.replace("_", "-")
            raise InputError(
                f"{flag} does not apply to --attacks {','.join(methods) or 'none'} (it is read by {', '.join(readers)} "
                "only)"
            )


def _check_options(run: Run, methods, shadow_models, reference_models, min_models) -> None:
    """Refuse bad attack options before anything is trained."""
    # Every count is checked whether or not a chosen attack reads it: `--attacks loss --reference-models -1` ran
    # with exit 0 while `report` refused the same -1 (found by benchmarks/cli_fuzz.py).
    if shadow_models is not None:
        check_positive_int(shadow_models=shadow_models)
    check_positive_int(reference_models=reference_models)
    check_positive_int(min_models=min_models)
    if "lira" in methods and reference_models // 2 < min_models:  # fail before training anything
        raise InputError(
            f"{reference_models} reference models give each record {reference_models // 2} IN and as many OUT "
            f"models, fewer than min_models {min_models}; use at least {2 * min_models} reference models"
        )
    if len(run.splits.members) == 0 or len(run.splits.holdout) == 0:
        raise InputError(
            f"{run.path}: attacks need members and holdout records (the split has "
            f"{len(run.splits.members)} members, {len(run.splits.holdout)} holdout)"
        )


def _shadow_attack(run: Run, ds, recipe, target: _Target, shadow_models, classifier, seed, train):
    """Shokri et al.'s shadow-model attack: (name, scores, params)."""
    if shadow_models is None:  # as many as fit (at least 1, so that a too-small aux still says why)
        shadow_models = min(AUTO_SHADOW_MODELS, max(1, len(run.splits.aux) // (2 * recipe.config.batch_size)))
    shadow_in = shadow_partition(
        run.splits.aux,
        shadow_models,
        n_target_train=len(run.splits.members),
        batch_size=recipe.config.batch_size,
        seed=seed,
    )
    logits = train(recipe, shadow_in, seeds_for(seed, "shadow", shadow_models), description="shadow models")
    attack, shadow_params = fit_shadow_attack(logits, shadow_in, run.splits.aux, ds.y, classifier=classifier, seed=seed)
    # The shadow models never saw a candidate, so all of them are OUT references for calibration.
    reference = (
        np.mean([logit_margin(lg[target.ids], target.y) for lg in logits], axis=0) if attack.calibrated_ else None
    )
    scores = attack.score(target.logits, target.y, reference)
    return "shadow", scores, {"n_shadow_models": shadow_models, **shadow_params}


def _reference_attacks(run: Run, recipe, target: _Target, methods, reference_models, online, min_models, seed, train):
    """LiRA and RMIA on one set of reference models: [(name, scores, params)]."""
    ids, y = target.ids, target.y
    population = reference_population(ids, run.splits.aux, len(run.splits.members), seed=seed)
    in_pop = balanced_membership(len(population), reference_models, seed=np.random.default_rng([seed, 1]))
    # Each model's logits on every record become its phi on the candidates as they come (attacks.reference.
    # train_models' reduce): the (M, N, k) logits were held whole, twice, and then copied on the candidates.
    phi = train(
        recipe,
        [population[in_pop[:, j]] for j in range(reference_models)],
        seeds_for(seed, "reference", reference_models),
        description="reference models",
        reduce=lambda logits: logit_margin(logits[ids], y),
    )  # (M, n_candidates)
    rows = np.searchsorted(population, ids)
    in_mask = in_pop[rows]
    common = {"n_reference_models": reference_models, "online": online}
    scored = []
    if "lira" in methods:
        lira = LiRA(online=online, min_models=min_models)
        signals = np.stack(list(phi), axis=1)  # (n_candidates, M): lira.signals_matrix of the models' logits
        scores = lira.fit_score(signals, in_mask, logit_margin(target.logits, y), record_ids=ids)
        params = {
            **common,
            "global_variance": lira.global_variance_,
            "min_models": min_models,
            "signal": "logit-scaled confidence",
        }
        if lira.std_floor_sides_:  # "global_variance": true read as a pooled estimate; there was none
            sides = " and ".join(lira.std_floor_sides_)
            params["std"] = (
                f"no {sides} variance could be estimated (a record needs two {sides} reference models; use more "
                f"reference models): the min_std floor {lira.min_std:g} stands in for it, so the scores' scale means "
                "nothing (their ranking, which the AUC and the audit read, does not depend on it)"
            )
        scored.append(("lira", scores, params))
    if "rmia" in methods:
        ref_lp = np.stack([log_p_from_margin(r) for r in phi], axis=1)  # loss_score of each model, (n, M)
        rmia = RMIA(online=online).fit(ref_lp, in_mask)
        params = {**common, "offline_a": rmia.offline_a, "signal": "log p_y"}
        scored.append(("rmia", rmia.score(loss_score(target.logits, y)), params))
    return scored


def scores_paths(path: Path, methods: tuple[str, ...]) -> dict[str, Path]:
    """Where each attack's scores go: ``path`` itself for one attack; ``NAME.ATTACK.csv`` for several,
    so that every file holds one attack's scores (what ``dpaudit audit scores`` reads)."""
    if len(methods) == 1:
        return {methods[0]: path}
    return {m: path.with_name(f"{path.stem}.{m}{path.suffix}") for m in methods}


def attack_checkpoint(
    checkpoint: Path,
    *,
    attacks: str,
    shadow_models: int | None,
    reference_models: int,
    online: bool,
    min_models: int,
    workers: int,
    scheduler: str | None,
    cache_dir: Path | None,
    no_cache: bool,
    scores_out: Path | None,
    bootstrap: int,
    seed: int,
    force: bool = False,
    progress: Progress = NULL_PROGRESS,
    notify: Callable[[str], None] = lambda message: None,
    warn: Callable[[str], None] = lambda message: None,
    given: Collection[str] = frozenset(),
) -> list[AttackResult]:
    """``dpaudit attack mia``: load the run at ``checkpoint``, run the attacks named in ``attacks`` (comma-separated)
    with :func:`run_mia` and write each attack's per-record scores under ``scores_out`` (see
    :func:`scores_paths`). ``no_cache``: reference models in a temporary directory, deleted afterwards.
    ``warn`` receives the run's ``fit_warnings`` (a model that learned nothing: its AUCs measure little) and
    :func:`run_mia`'s (non-members that copy a member).
    Every option is checked, and every output path refused unless ``force``, before anything is trained; ``given``
    (the options the user set) may not name one no chosen attack reads (:func:`check_options_read`)."""
    from dpaudit.cache import cache_for
    from dpaudit.checkpoint import load_run

    methods = parse_methods(attacks)
    check_workers(workers, scheduler=scheduler)
    if bootstrap != 0 and check_non_negative(bootstrap=bootstrap) != int(bootstrap):  # 0: no confidence intervals
        raise InputError(f"expected bootstrap to be an integer, got {shown(bootstrap)}")
    # Before anything is trained (dpaudit.budget): `--bootstrap 2^63` ran for ever, no estimate, no --yes asked.
    check_cost(Cost("bootstrap", bootstrap * len(methods), "resamples", seconds_per_unit=BOOTSTRAP_SECONDS))
    cache = cache_for(cache_dir, no_cache=no_cache, scheduler=scheduler)
    check_options_read(methods, given)  # after the values' own checks: --workers 99 names the cores
    outputs = scores_paths(scores_out, methods) if scores_out is not None else {}
    for path in outputs.values():
        if path.suffix.lower() not in (".csv", ".npz"):
            raise InputError(f"{path}: unsupported scores file type; use .csv or .npz")
        check_output_file(path, force=force)  # before the work
    run = load_run(checkpoint)
    notify(f"attacking {checkpoint} with {', '.join(methods)} …")
    for message in run.meta.get("fit_warnings", ()):
        warn(message)
    with cache as cache_dir:
        results = run_mia(
            run, methods, shadow_models=shadow_models, reference_models=reference_models, online=online,
            workers=workers, scheduler=scheduler, seed=seed, cache_dir=cache_dir, min_models=min_models,
            n_bootstrap=bootstrap, progress=progress, warn=warn,
        )  # fmt: skip
    by_name = {r.name: r for r in results}
    if outputs:  # one output: all the files or none of them, never a mix of new and old (dpaudit.fileio)
        save_score_files({path: [by_name[name]] for name, path in outputs.items()}, force=force)
    for name, path in outputs.items():
        notify(f"{name} scores written to {path}")
    return results
