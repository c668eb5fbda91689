"""The multi-run audit: train the claimed pipeline R times with a canary and R times without.

Jagielski, Ullman & Oprea 2020 (arXiv:2006.07709, Alg. 1); Nasr et al. 2021 (arXiv:2101.04535);
Nasr et al. 2023 (arXiv:2302.07956). Each run is an independent trial of the mechanism (fresh
initialisation, batches and noise) on one of two neighbouring datasets, and one score per run is
audited with Clopper–Pearson: a formal lower bound on the ε of *the mechanism that was run*. For
that to be the mechanism the claim covers:

- the two datasets differ in exactly the canary: preprocessing (standardisation) is fitted on the
  public auxiliary split, or — when there is none — on the records common to both datasets, never
  on a dataset that contains the canary;
- both sides run the same number of steps with the same σ (calibrated once);
- the neighbouring relation matches the claim's: add/remove (D ∪ {canary} vs D) for Poisson
  sampling; for shuffled batches, whose claim is for replace-one neighbours, the canary is swapped
  for an ordinary record (D ∪ {canary} vs D ∪ {z}), so both datasets have the same size.

A plug-in trainer (:mod:`dpaudit.plugins`: the user's ``function(X, y, seed) -> state dict``) takes
the place of dpaudit's trainer in each run. dpaudit still owns everything the guarantee rests on:
the neighbouring pair (the relation the user's claim names), the preprocessing (public aux split),
the canary's random position in each IN dataset, each run's seed, the score and the statistics. The
number of steps and the noise are the user's, so the audit tests the user's pipeline as it is.

Adversarial initialisation (``init="adversarial"``; Annamalai & De Cristofaro 2024, arXiv:2405.14106):
every run, IN and OUT, starts from one fixed model pre-trained on the public aux split instead of
a fresh random one. DP-SGD's guarantee holds for every fixed initial model (the accountant composes
the per-step Gaussian mechanisms given the previous iterate; the start θ₀ is a constant of the
mechanism: Abadi et al. 2016, arXiv:1607.00133, Alg. 1 takes θ₀ as an input), so the audited
mechanism is still the claimed one; the fixed start only removes the run-to-run variance that a
random init adds to the canary's score, and the pre-training makes the ordinary records' gradients
small so that the canary's stands out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from dpaudit import numfmt
from dpaudit.audit import audit_scores, check_audit_claim
from dpaudit.audit.plan import smallest_size
from dpaudit.errors import InputError
from dpaudit.plugins import PLUGIN_SCORE_HELP  # noqa: F401 (re-exported)
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.workflows.result import AuditRecord, TrainingAudit


def _train_one(args: tuple) -> float:
    """One run of the multi-run audit (module level so joblib can ship it to workers)."""
    from attacks.threshold import logit_margin
    from dpaudit.models import one_torch_thread
    from dpaudit.training.run import fit_model

    dataset, train_idx, pre, spec, config, perf, canary_x, canary_y, whitebox, init_state = args
    with one_torch_thread():  # joblib runs the jobs in the caller's process when workers=1
        if whitebox is not None:
            from dpaudit.training.algorithms import fit_with_gradient_canary
            from dpaudit.training.dpsgd import GradientCanary

            return fit_with_gradient_canary(
                dataset, train_idx, spec, config, perf, GradientCanary(**whitebox), preprocessing=pre
            )
        fitted = fit_model(dataset, train_idx, spec, config, perf, preprocessing=pre, init_state=init_state)
        return float(logit_margin(fitted.logits(canary_x), canary_y)[0])


# Built-in scores of a trained model on the canary (higher = canary included; fixed before any run).
PLUGIN_SCORES = ("margin", "loss", "probe")


def _score_fns(scores: tuple) -> list:
    from dpaudit.plugins import load_trainer

    out = []
    for s in scores:
        if isinstance(s, str) and s not in PLUGIN_SCORES:
            out.append(load_trainer(s))  # "module:function": imported as trainers are (current directory first)
        else:
            out.append(s)
    return out


def _score_one(score, model, state, canary_x, canary_y) -> float:
    from attacks.threshold import logit_margin, loss_score
    from dpaudit.checkpoint import predict_logits

    if score == "margin":
        return float(logit_margin(predict_logits(model, canary_x), canary_y)[0])
    if score == "loss":
        return float(loss_score(predict_logits(model, canary_x), canary_y)[0])
    if score == "probe":
        return float(logit_margin(predict_logits(model, np.zeros_like(canary_x)), canary_y)[0])
    try:
        value = float(score(state, canary_x, int(canary_y[0])))
    except Exception as e:
        raise InputError(f"score function {getattr(score, '__name__', score)!r} failed: {e}") from e
    if not np.isfinite(value):
        raise InputError(f"score function {getattr(score, '__name__', score)!r} returned {value}")
    return value


def scores_names(scores: tuple) -> list[str]:
    """How the scores are named in descriptions: the built-in name, or "module:function"."""
    from dpaudit.plugins import trainer_name

    return [s if isinstance(s, str) else trainer_name(s) for s in scores]


def _train_plugin_one(args: tuple) -> tuple[float, ...]:
    """One run of a plug-in trainer: train, load the returned state dict into the spec's model, score the canary
    with every score asked for."""
    from dpaudit.models import one_torch_thread
    from dpaudit.plugins import call_trainer, load_trainer

    trainer, name, X, y, run_seed, spec, canary_x, canary_y, scores, reference_size = args
    fn = load_trainer(trainer) if isinstance(trainer, str) else trainer
    with one_torch_thread():  # joblib runs the jobs in the caller's process when workers=1
        model = call_trainer(fn, X, y, run_seed, spec, name=name, reference_size=reference_size)
        state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        return tuple(_score_one(s, model, state, canary_x, canary_y) for s in _score_fns(scores))


def _plugin_jobs(trainer, name, data, idx_in, idx_out, pre, spec, canary_x, canary_y, runs: int, seed: int, scores):
    """The 2R plug-in runs (IN first), built lazily so that only a few copies of X exist at a time.

    Run r's randomness is ``SeedSequence(seed, spawn_key=(0x504C, r))`` spawned in two: one child
    permutes the records (the canary's position is uniform), the other gives the trainer's seed (31
    bits, so every framework accepts it). Spawn keys give independent streams (numpy docs, "Parallel
    random number generation").
    """
    X_in, X_out = pre.transform(data.rows(idx_in)), pre.transform(data.rows(idx_out))
    y_in, y_out = data.y[idx_in].astype(np.int64), data.y[idx_out].astype(np.int64)
    canary_pre = pre.transform(canary_x)
    reference_size = max(len(idx_in), len(idx_out))  # one N for both neighbours (the plug-in contract)
    for r in range(2 * runs):
        X, y = (X_in, y_in) if r < runs else (X_out, y_out)
        perm_ss, seed_ss = np.random.SeedSequence(seed, spawn_key=(0x504C, r)).spawn(2)
        perm = np.random.default_rng(perm_ss).permutation(len(y))
        run_seed = int(seed_ss.generate_state(1, np.uint32)[0] >> 1)
        yield (trainer, name, np.ascontiguousarray(X[perm]), y[perm].copy(), run_seed, spec, canary_pre, canary_y,
               scores, reference_size)  # fmt: skip


def audit_training(
    dataset,
    spec,
    config=None,
    perf=None,
    *,
    runs: int = 100,
    train_size: int | None = None,
    threat_model: str = "black-box",
    canary_kind: str | None = None,
    method: str = "clopper-pearson",
    delta: float | None = None,
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
    split_seed: int = 0,
    seed: int = 0,
    workers: int = 1,
    progress: Progress = NULL_PROGRESS,
    trainer: str | Callable[..., Any] | None = None,
    neighbouring: str | None = None,
    init: str = "random",
    allow_inconclusive: bool = True,
    scores: tuple[str | Callable[..., float], ...] = ("margin",),
) -> TrainingAudit:
    """Multi-run audit of the recipe ``config`` (or of a plug-in ``trainer``): ``runs`` models with the
    canary, ``runs`` without. ``dataset``: a :class:`dpaudit.data.Dataset` or a name as ``--data`` takes it
    (``"digits"``); ``spec``: a model spec or a model name as ``--model`` takes it (``"logreg"``).

    Black-box: the canary is one input record (``canary_kind``; None: ClipBKD, or a mislabeled record for
    token data, which ClipBKD cannot perturb) and the score is its
    logit-scaled confidence under the final model (higher = member; the direction is fixed in
    advance, so the test is one-sided). White-box (DP trainers with Poisson sampling only): a Dirac
    gradient canary C·e_j (Nasr et al. 2021, §4; Nasr et al. 2023) observed in every noisy update;
    the score is the per-step likelihood ratio (see ``dpaudit.training.dpsgd.GradientCanary``).

    Plug-in training (``trainer``: a ``"package.module:function"`` path or a callable, see
    :mod:`dpaudit.plugins` for the contract): the user's function trains each run and returns the
    state dict of ``spec``'s model; ``config`` and ``perf`` are not used. The claim is the user's:
    ``claimed_epsilon`` and ``delta`` are required, and ``neighbouring`` ("add_remove", the default,
    or "replace_one") sets the experiment as the built-in path does. dpaudit builds each run's records
    (preprocessed with the public aux split's scaler, shuffled by a seeded permutation so the canary
    sits at a random position), draws the run's seed, and scores the canary. Black-box only.

    ``neighbouring`` with the built-in trainer: None (default) follows the recipe (add/remove for
    Poisson sampling, replace-one for shuffling); a value that contradicts it is an InputError.

    ``init``: "random" (each run initialised from its own seed) or "adversarial" (black-box with
    dpaudit's trainer: every run starts from :func:`adversarial_init`, one fixed model pre-trained on
    the public aux split; see the module docstring for why the claim still covers it). Pair it with
    ``canary_kind="crafted"`` (:func:`dpaudit.canaries.craft_canaries`).

    ``scores`` (plug-in trainers; see :data:`PLUGIN_SCORE_HELP`): every score is computed on every run and
    audited at confidence 1 − α/k for k scores (Bonferroni), so all k bounds hold at once with probability
    ≥ ``confidence`` and the strongest is reported (the others in ``TrainingAudit.audits``).

    ``allow_inconclusive=False`` (what ``dpaudit audit train`` does unless --allow-inconclusive): refuse,
    before training, a design that cannot refute the claim (:func:`require_refutable`).

    Formal guarantee (method "clopper-pearson"): with probability ≥ ``confidence`` the bound is below
    the true ε of the trained pipeline on this neighbouring pair (see the module docstring for why
    that pipeline is the claimed one). Method "gdp" is an estimate. With a plug-in trainer the
    guarantee also assumes that each run's randomness comes from its ``seed`` alone (runs independent).
    """
    from joblib import delayed

    from dpaudit.canaries import make_canaries, with_canaries
    from dpaudit.data import fit_preprocessing, make_splits
    from dpaudit.training.config import PerfConfig
    from dpaudit.validation import (
        check_choice,
        check_in_interval,
        check_non_negative,
        check_positive_int,
        check_seed,
        check_workers,
        worker_pool,
    )

    # The CLI's vocabulary (--data digits --model logreg, --score probe) means what it means there.
    if isinstance(dataset, str):
        from dpaudit.data import load_dataset

        dataset = load_dataset(dataset)
    if isinstance(spec, str):
        from dpaudit.models import default_spec

        spec = default_spec(
            spec, input_shape=dataset.feature_shape, n_classes=dataset.n_classes, vocab_size=dataset.vocab_size
        )
    runs = check_positive_int(runs=runs)
    check_choice(("clopper-pearson", "gdp"), method=method)
    if runs < (least := smallest_size(method, "holdout")):  # before any run: the holdout threshold selection
        raise InputError(
            f"runs {runs}: a multi-run audit needs at least {least} runs with the canary and {least} without"
        )
    workers = check_workers(workers)  # before any run: joblib's n_jobs 0 was an internal error, 64 processes on 2 cores
    check_choice(("black-box", "white-box"), threat_model=threat_model)
    check_choice(("random", "adversarial"), init=init)
    if init == "adversarial" and (trainer is not None or threat_model != "black-box"):
        raise InputError("init 'adversarial' needs dpaudit's own trainer and the black-box threat model")
    name = None
    scores = (scores,) if isinstance(scores, str) else tuple(scores)  # one name, not its letters
    if not scores:
        raise InputError("expected at least one score")
    if scores != ("margin",) and trainer is None:
        raise InputError("scores other than the canary's margin are for plug-in trainers (--trainer)")
    _score_fns(scores)  # fail here, before any run, on a bad "module:function"
    from dpaudit.training.run import check_spec_fits

    check_spec_fits(spec, dataset)  # e.g. a model over token ids given float features: one line, before any run
    if trainer is not None:
        from dpaudit.plugins import check_trainer, load_trainer, trainer_name

        name = trainer_name(trainer)
        if isinstance(trainer, str):
            load_trainer(trainer)  # fail here, before any run, on a bad path or signature
        else:
            check_trainer(trainer, name)
        if threat_model == "white-box":
            raise InputError(
                "the white-box gradient canary needs dpaudit's own trainer; audit a plug-in trainer black-box"
            )
        if claimed_epsilon is None or delta is None:
            raise InputError("a plug-in trainer needs its claim: claimed_epsilon and delta")
        check_non_negative(claimed_epsilon=claimed_epsilon)
        check_in_interval(0.0, 1.0, lo_open=False, delta=delta)
        check_seed(seed=seed)
        relation = check_choice(("add_remove", "replace_one"), neighbouring=neighbouring or "add_remove")
    else:
        if config is None:
            raise InputError("expected a training config, or a plug-in trainer")
        relation = "add_remove" if config.dp is None or config.dp.sampling == "poisson" else "replace_one"
        if neighbouring is not None and neighbouring != relation:
            raise InputError(
                f"neighbouring {neighbouring!r} does not match the recipe, whose claim is for {relation} neighbours"
            )
    perf = perf or PerfConfig(device="cpu")
    splits = make_splits(len(dataset), split_seed)
    members = splits.members
    rng = np.random.default_rng([seed, 7])
    if train_size is not None:
        check_positive_int(train_size=train_size)
        if train_size > len(members):
            raise InputError(f"--train-size {train_size} exceeds the members split ({len(members)} records)")
        members = np.sort(rng.choice(members, size=train_size, replace=False))
    base = dataclasses.replace(splits, members=members)
    # Preprocessing from public data, or from the records both neighbours share: never from the canary.
    pre_idx = splits.aux if len(splits.aux) else members
    init_state = None
    if trainer is None:
        from dpaudit.budget import check_trainings, model_parameters, training_cost

        # Before the canary is made: the default clipbkd canary took an SVD of the members (2 minutes and 1.8 GB
        # for 7,000 CIFAR images; now a d x d eigendecomposition, 35 s and 240 MB), which a refusal then followed.
        # The IN runs hold the canary too.
        n_in = len(members) + (0 if threat_model == "white-box" else 1)
        one = training_cost(
            "audit train", model_parameters(spec), config.num_steps(n_in), config.batch_size,
            private=config.dp is not None,
        )  # fmt: skip
        check_trainings("audit train", 2 * runs, one)  # before any run: refuse or ask for --yes
    if threat_model == "white-box":
        if canary_kind is not None:  # was ignored without a word
            raise InputError("--canary-kind is the black-box canary's; the white-box canary is a Dirac gradient")
        if config.dp is None:
            raise InputError("the white-box gradient canary needs a private trainer (--algo dpsgd or dpadam)")
        if relation != "add_remove":
            raise InputError("the white-box gradient canary needs Poisson sampling (--sampling poisson)")
        data, idx_in, idx_out = dataset, members, members
        canary_x = canary_y = None
        source = "Dirac gradient canary (white-box: every noisy update observed)"
    else:
        if canary_kind is None:  # ClipBKD needs real-valued features; token ids take a mislabeled record
            canary_kind = "mislabeled" if dataset.kind == "tokens" else "clipbkd"
        canary = make_canaries(dataset, base, m=1, kind=canary_kind, seed=seed)
        canary = dataclasses.replace(canary, included=np.array([True]))
        if init == "adversarial":
            if len(splits.aux) == 0:
                raise InputError("init 'adversarial' pre-trains on the public auxiliary split, which is empty")
            init_state = adversarial_init(dataset, spec, splits.aux, seed=seed)
            if canary_kind == "crafted":
                # Loss-maximising label (Yoon, Jeung & No 2024, arXiv:2412.01756): the class the fixed
                # start finds least likely at the canary, so its clipped gradient stays at norm C for longest.
                # Public inputs only: the init (aux) and the canary (aux).
                canary = dataclasses.replace(
                    canary, y=_least_likely_label(spec, init_state, dataset, pre_idx, canary.X)
                )
        data, idx_in, _ = with_canaries(dataset, base, canary)
        canary_x, canary_y = canary.X, canary.y
        if relation == "replace_one":
            # Same size on both sides: the OUT dataset holds an ordinary record where IN holds the canary.
            pool = np.setdiff1d(splits.holdout, members)
            if len(pool) == 0:
                raise InputError("a replace-one audit needs a holdout record to stand in for the canary")
            filler = int(rng.choice(pool))
            idx_out = np.concatenate([members, [filler]])
            source = f"one {canary_kind} canary swapped for an ordinary record (replace-one; black-box, final model)"
        else:
            idx_out = members
            source = f"one {canary_kind} canary added or not (add/remove; black-box, final model)"
    contract_notes: tuple[str, ...] = ()
    if trainer is not None:
        from dpaudit.plugins import load_trainer, reference_size_note, seed_note

        source += f"; trained by {name}"
        fn = load_trainer(trainer) if isinstance(trainer, str) else trainer
        X_out, y_out = fit_preprocessing(data, pre_idx).transform(data.rows(idx_out)), data.y[idx_out].astype(np.int64)
        reference_size = max(len(idx_in), len(idx_out))
        # The runs' independence rests on the trainer drawing its randomness from seed: checked on two seeds of
        # their own stream (31 bits, as the runs' seeds).
        probe = np.random.SeedSequence(seed, spawn_key=(0x5345,)).generate_state(2, np.uint32) >> 1
        notes = [seed_note(fn, X_out, y_out, (int(probe[0]), int(probe[1])), spec, reference_size, name=name)]
        if relation == "add_remove":  # replace-one neighbours have the same size: len(X) cannot tell them apart
            notes.append(reference_size_note(fn, X_out, y_out, int(seed), spec, reference_size, name=name))
        contract_notes = tuple(n for n in notes if n is not None)
        jobs = _plugin_jobs(
            trainer, name, data, idx_in, idx_out, fit_preprocessing(data, pre_idx), spec, canary_x, canary_y, runs,
            int(seed), scores,
        )  # fmt: skip
        work = _train_plugin_one
        claim: dict[str, Any] | None = {
            "epsilon": float(claimed_epsilon), "delta": float(delta), "neighbouring": relation,
        }  # fmt: skip
    else:
        config, claim = _prepare_recipe(config, idx_in, idx_out)
        if init_state is not None:
            source += "; adversarial init (fixed, pre-trained on the public aux split)"
        # Fitted once: every run's standardisation is this one (the same records), which each run fitted again (0.47 s
        # a run for the 8,000 aux records of 32,000 CIFAR-sized images; 7.8 minutes of `--runs 500`'s 1,000 runs).
        jobs = _recipe_jobs(
            data, idx_in, idx_out, fit_preprocessing(data, pre_idx), spec, config, perf, canary_x, canary_y,
            threat_model, runs, seed, init_state,
        )  # fmt: skip
        work = _train_one
    claimed = claimed_epsilon if claimed_epsilon is not None else (claim or {}).get("epsilon")
    if trainer is None and claim is not None and claimed_epsilon is not None and claimed_epsilon < claim["epsilon"]:
        # The runs are the recipe's mechanism, accounted at the recipe's ε: a bound above a smaller claimed ε refutes
        # that number, not the claim the runs were trained for (say so beside the verdict).
        shown, recipe = numfmt.ordered(claimed_epsilon, claim["epsilon"], left_up=True)
        contract_notes += (
            f"the claimed epsilon {shown} is below the recipe's own claim ({recipe} at delta "
            f"{numfmt.exact(claim['delta'])}, the mechanism these runs trained): a violation refutes {shown}, "
            "not the recipe's claim",
        )
    if delta is None:
        delta = (claim or {}).get("delta", 1e-5)
    check_audit_claim(delta=delta, confidence=confidence, claimed_epsilon=claimed)  # before any run
    if not allow_inconclusive and claimed is not None:
        level = 1.0 - (1.0 - confidence) / len(scores)  # each score's level (Bonferroni, see below)
        require_refutable(claimed, runs, method=method, delta=delta, confidence=level)
    with progress.task(f"audit: train {2 * runs} models", 2 * runs) as advance:
        rows = []
        for s in worker_pool(workers, return_as="generator")(delayed(work)(j) for j in jobs):
            rows.append(s)
            advance(1)
    member = np.arange(2 * runs) < runs
    table = np.asarray(rows, dtype=np.float64).reshape(2 * runs, -1)  # one column per score
    k = table.shape[1]
    level = 1.0 - (1.0 - confidence) / k  # Bonferroni over the k scores: all bounds hold at once w.p. ≥ confidence
    names = scores_names(scores)
    records = []
    for j in range(k):
        result = audit_scores(
            table[:, j], member, method=method, design="multi-run", delta=delta, confidence=level,
            claimed_epsilon=claimed, seed=seed,
        )  # fmt: skip
        if contract_notes:
            result = dataclasses.replace(result, notes=(*result.notes, *contract_notes))
        # Name the score whenever it is not the default margin: a lone --score probe must say what was scored.
        what = f"; score {names[j]} ({j + 1} of {k}, Bonferroni)" if k > 1 else ""
        what = f"; score {names[j]}" if k == 1 and names[j] != "margin" else what
        what = f"{2 * runs} training runs ({runs} with, {runs} without) — {source}{what}"
        records.append(AuditRecord("multi-run", what, result, threat_model=f"{threat_model}, many runs"))
    best = max(range(len(records)), key=lambda j: records[j].result.epsilon_lower_bound)
    return TrainingAudit(
        audit=records[best], threat_model=threat_model, runs=runs, claim=claim, neighbouring=relation,
        scores=table[:, best].copy(), member=member, trainer=name, audits=tuple(records) if k > 1 else (),
    )  # fmt: skip


def _prepare_recipe(config, idx_in, idx_out):
    """The recipe both sides run (the larger dataset's step count, σ calibrated once) and its claim."""
    n_max = max(len(idx_in), len(idx_out))
    if config.batch_size > n_max:  # before it becomes a sampling rate q = B / N above 1
        raise InputError(
            f"batch size {config.batch_size} is larger than the training set ({n_max} records); "
            "give a smaller --batch-size or a larger --train-size"
        )
    # Same mechanism on both sides: the step count of the larger dataset, a fixed Poisson rate (so q does
    # not depend on which neighbour is trained), and σ calibrated once.
    config = dataclasses.replace(config, steps=config.num_steps(n_max))
    if config.dp is not None and config.dp.sampling == "poisson" and config.dp.sample_rate is None:
        config = dataclasses.replace(config, dp=dataclasses.replace(config.dp, sample_rate=config.batch_size / n_max))
    if config.dp is not None and config.dp.target_epsilon is not None:
        from dpaudit.training.algorithms import claim_for

        sigma = claim_for(config, n_max)["noise_multiplier"]
        config = dataclasses.replace(
            config, dp=dataclasses.replace(config.dp, noise_multiplier=sigma, target_epsilon=None)
        )
    return config, _recipe_claim(config, idx_in, idx_out)


def _recipe_jobs(
    data, idx_in, idx_out, pre, spec, config, perf, canary_x, canary_y, threat_model, runs, seed, init_state=None
):
    """The 2R runs of dpaudit's own trainer (IN first), each with its own seed (and the same preprocessing ``pre``,
    fitted on records both neighbours share, and init_state)."""
    jobs = []
    for r in range(2 * runs):
        included = r < runs
        cfg = dataclasses.replace(config, seed=seed * 1_000_003 + 3 * r + 11)
        wb = {"included": included, "seed": cfg.seed + 5} if threat_model == "white-box" else None
        idx = idx_in if included else idx_out
        jobs.append((data, idx, pre, spec, cfg, perf, canary_x, canary_y, wb, init_state))
    return jobs


def _recipe_claim(config, idx_in, idx_out) -> dict[str, Any] | None:
    """The privacy claim of the recipe (the larger ε of the two dataset sizes), without training."""
    if config.dp is None:
        return None
    from dpaudit.training.algorithms import claim_for

    claims = [claim_for(config, len(idx)) for idx in (idx_in, idx_out)]
    return max(claims, key=lambda c: c["epsilon"])


ADVERSARIAL_INIT_EPOCHS = 30


def adversarial_init(dataset, spec, aux_idx: np.ndarray, *, seed: int = 0) -> dict[str, np.ndarray]:
    """A fixed initial model for audit runs: ``spec``'s model pre-trained (non-private SGD, seeded) on
    the public aux split, standardised with the aux scaler as the audited runs are.

    Annamalai & De Cristofaro 2024 (arXiv:2405.14106) start DP-SGD from a model pre-trained on
    data disjoint from the target's, so that the ordinary records' gradients are small and the
    canary's dominates the final model. Uses public data and ``seed`` only; deterministic on CPU (same
    inputs and seed, same weights). Returns a state dict of numpy arrays.
    """
    import torch

    from dpaudit.models import one_torch_thread
    from dpaudit.training.config import PerfConfig, TrainConfig
    from dpaudit.training.run import fit_model

    aux_idx = np.asarray(aux_idx, dtype=np.int64)
    config = TrainConfig(
        algo="sgd", epochs=ADVERSARIAL_INIT_EPOCHS, batch_size=min(32, len(aux_idx)), lr=0.1, seed=seed * 7 + 0xAD
    )
    # float sums depend on the thread count: one thread, the same weights anywhere
    with one_torch_thread(), torch.random.fork_rng(devices=[]):
        fitted = fit_model(dataset, aux_idx, spec, config, PerfConfig(device="cpu"), preprocessing_idx=aux_idx)
    return {k: v.detach().cpu().numpy().copy() for k, v in fitted.model.state_dict().items()}


def _least_likely_label(spec, init_state, dataset, pre_idx, X) -> np.ndarray:
    """For each record of ``X``, the class to which the model in ``init_state`` gives the lowest logit."""
    import torch

    from dpaudit.checkpoint import predict_logits
    from dpaudit.data import fit_preprocessing
    from dpaudit.models import build_model

    model = build_model(spec, seed=0)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in init_state.items()})
    return predict_logits(model, fit_preprocessing(dataset, pre_idx).transform(X)).argmin(1).astype(np.int64)


def require_refutable(
    claimed_epsilon: float,
    size: int,
    *,
    method: str,
    delta: float,
    confidence: float = 0.95,
    flag: str = "--allow-inconclusive",
) -> float:
    """Raise InputError (exit 2 at the CLI) when a design of ``size`` cannot refute ``claimed_epsilon``.

    ``size``: runs per side (methods "clopper-pearson", "gdp"; holdout threshold selection, one-sided,
    as :func:`audit_training` audits) or canaries in one run ("one-run"). The design can refute the claim
    only if its max certifiable ε — the bound of a perfect attack (:func:`dpaudit.audit.max_certifiable_epsilon`)
    — exceeds it; otherwise the verdict is "inconclusive" whatever the models do. The message names the
    size needed for 80% power against a leak of twice the claim (simulated audits,
    :func:`dpaudit.audit.plan.size_advice`) and the perfect-attack minimum. Returns the max certifiable ε.
    """
    from dpaudit.audit import max_certifiable_epsilon
    from dpaudit.audit.plan import size_advice

    n_pos, n_neg = (size - size // 2, size // 2) if method == "one-run" else (size, size)
    best = max_certifiable_epsilon(n_pos, n_neg, method=method, delta=delta, confidence=confidence)
    if best > claimed_epsilon:
        return best
    unit = "canaries" if method == "one-run" else "runs per side"
    need = size_advice(claimed_epsilon, method=method, delta=delta, confidence=confidence)
    most, claim = numfmt.ordered(best, claimed_epsilon, left_up=True)  # both upper bounds, in the order computed
    # The pointer once: size_advice names it itself when the size is beyond its simulations.
    pointer = "" if need.points_to_plan else f" (see `dpaudit audit plan --epsilon {numfmt.upper(claimed_epsilon)}`)"
    raise InputError(
        f"this audit cannot refute epsilon = {claim}: {size} {unit} certify at most {most} even "
        f"with a perfect attack ({method}, confidence {confidence:g}, delta {numfmt.exact(delta)}); {need.text}"
        f"{pointer}; pass {flag} to run it anyway"
    )


def require_refutable_canaries(config, n_train: int, m: int, *, sets: int = 1) -> float | None:
    """``dpaudit train --canaries m`` or ``--whitebox-canaries m``: refuse (InputError) a canary design whose
    one-run audit (Steinke, Nasr & Jagielski 2023, arXiv:2305.08846) cannot refute the recipe's claim for
    ``n_train`` records (members plus included canaries). None when there is no claim to check before training:
    a non-private recipe, or a trainer outside the DP-SGD family (no ``setting_for`` to compute it from).

    Checked at the level ``dpaudit audit checkpoint`` analyses the canaries at (:func:`canary_confidence`:
    Bonferroni over its formal canary tests: the (ε, δ) and f-DP analyses of each of the run's ``sets`` canary
    sets, black-box and white-box): at the full α it accepted designs the checkpoint audit then called
    inconclusive (16 canaries against ε = 3.17: the curve analysis certifies 3.36 at α = 0.05, 2.61 at α/2)."""
    from dpaudit.training.algorithms import claim_for, get_trainer
    from dpaudit.training.dpsgd import DPTrainer

    # Not hasattr(trainer, "setting_for"): the convex learners and DP-AGD define one that refuses (the built-in
    # multi-run audit's), which `train --algo outpert --canaries M` printed as its error.
    if config.dp is None or not issubclass(get_trainer(config.algo), DPTrainer):
        return None

    from dpaudit.workflows.checkpoint import DEFAULTS, canary_confidence, claim_tradeoff

    claim = claim_for(config, n_train)
    curve = claim_tradeoff(claim)
    level = canary_confidence(DEFAULTS.confidence, curve, sets)  # that of `audit checkpoint` (Bonferroni)
    try:
        return require_refutable(claim["epsilon"], m, method="one-run", delta=claim["delta"], confidence=level)
    except InputError as refused:
        # The checkpoint audit also analyses the canaries against the claim's own DP-SGD curve (one-run
        # f-DP, Mahloujifar et al. 2025), which certifies more from the same guesses: accept the design
        # when that analysis can refute the claim.
        from dpaudit.audit.fdp_one_run import can_refute

        if curve is not None:
            # The decision only (max_certifiable's full search composed ~15 PLDs: minutes at CIFAR scale).
            ok, shown = can_refute(m, curve, claim["delta"], 1.0 - level, "holdout", claim["epsilon"])
            if ok:
                return shown
            raise InputError(
                f"{refused} (the one-run f-DP analysis against the claim's own curve, {curve.name}, certifies at "
                f"most {numfmt.upper(shown, 3)} with {m} canaries)"
            ) from None
        raise


def multirun_audit(
    fit,
    pair: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    direction: np.ndarray,
    *,
    runs: int,
    claimed_epsilon: float,
    delta: float,
    seed: int = 0,
    confidence: float = 0.95,
):
    """Run ``fit(Z, s, rng) -> weights`` ``runs`` times on each dataset of ``pair`` (IN first) with fresh
    noise, score each run by ⟨w, direction⟩ (higher = IN; the direction is fixed before the runs) and
    audit the scores with :func:`dpaudit.audit.audit_scores` (Clopper–Pearson, multi-run design: a formal
    lower bound on ε for this neighbouring pair; Jagielski, Ullman & Oprea 2020, arXiv:2006.07709).
    Returns the :class:`~dpaudit.workflows.result.AuditRecord`.

    Used for the convex learners (:mod:`dpaudit.training.convex`, with
    :func:`~dpaudit.training.convex.worst_case_neighbour`), whose fit is a closed-form function of the data."""
    (Z_in, s_in), (Z_out, s_out) = pair
    seeds = np.random.SeedSequence(seed).spawn(2 * runs)
    scores = np.empty(2 * runs)
    for r in range(2 * runs):
        Z, s = (Z_in, s_in) if r < runs else (Z_out, s_out)
        scores[r] = float(np.ravel(fit(Z, s, np.random.default_rng(seeds[r])))[: len(direction)] @ direction)
    member = np.arange(2 * runs) < runs
    result = audit_scores(
        scores, member, method="clopper-pearson", design="multi-run", delta=delta, confidence=confidence,
        claimed_epsilon=claimed_epsilon, seed=seed,
    )  # fmt: skip
    return AuditRecord("multi-run", f"{2 * runs} runs of the learner on a worst-case replace-one pair", result)
