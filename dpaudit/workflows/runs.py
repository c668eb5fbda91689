"""The library side of the commands that make runs from their options: ``dpaudit train`` (every
algorithm), ``dpaudit import`` (foreign weights plus a stated claim) and ``dpaudit audit train`` (the
multi-run audit, which trains its own runs).

The CLI parses the options and calls one function here; the run itself is written by the run layer
(:mod:`dpaudit.training.run`; :mod:`dpaudit.training.pate` for the noisy-vote algorithms). This module
sits in workflows because a run trained with canaries is refused when its one-run audit could not
refute the claim (:func:`dpaudit.workflows.training.require_refutable_canaries`), a decision of the
audit workflows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from dpaudit.errors import DPAuditError, FileContentError, InputError
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.validation import check_float32, check_in_interval


def parse_fractions(text: str) -> tuple[float, ...]:
    try:
        parts = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise InputError(f"expected --split as four fractions members,holdout,aux,test, got {text!r}") from None
    if len(parts) != 4:
        raise InputError(f"expected --split as four fractions members,holdout,aux,test, got {text!r}")
    return parts


def parse_ints(text: str | None, name: str) -> tuple[int, ...] | None:
    """``"128,64"`` -> ``(128, 64)``: one or more positive integers (layer widths), every comma-separated
    part one of them. An empty part (``","``, ``"8,,4"``, ``""``) is refused rather than dropped (``--hidden ,``
    used to train an MLP with no hidden layer), and 0 and -3 get the same message as ``x``."""
    if text is None:
        return None
    bad = InputError(f"expected {name} as comma-separated integers >= 1 (e.g. 128,64), got {text!r}")
    try:
        parts = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise bad from None
    if not parts or min(parts) < 1:
        raise bad
    return parts


def _silent(message: str) -> None:
    """The default ``notify``: status lines (what is being trained or imported) go nowhere."""


def _refuse_existing(out: Path, force: bool, inputs=()) -> None:
    from dpaudit.fileio import check_output_dir

    check_output_dir(out, force=force, inputs=inputs)  # dpaudit's own files only, none of the inputs


def train_from_options(
    out: Path,
    *,
    data: str,
    label_column: str | None,
    model: str | None,
    model_spec: Path | None,
    hidden: str | None,
    activation: str | None,
    algo: str,
    epochs: int | None,
    steps: int | None,
    batch_size: int | None,
    lr: float | None,
    momentum: float | None,
    weight_decay: float,
    l2: float | None,
    mechanism: str | None,
    objective: str | None,
    seed: int,
    split_seed: int,
    split: str,
    noise_multiplier: float | None,
    epsilon: float | None,
    delta: float,
    clip: float,
    sampling: str,
    accountant: str | None,
    jl_projections: int | None,
    secure_noise: bool,
    clipping: str,
    backend: str,
    max_physical_batch: int | None,
    device: str,
    canaries: int | None,
    canary_kind: str,
    canary_seed: int,
    allow_inconclusive: bool,
    whitebox_canaries: int | None,
    teachers: int | None,
    aggregator: str,
    queries: int | None,
    sigma: float | None,
    sigma1: float | None,
    threshold: float | None,
    max_answers: int | None,
    shots: int | None,
    predictor: str,
    workers: int,
    claim: str = "data-independent",
    keep_private_diagnostics: bool = False,
    subsample: float | None = None,
    sanitiser: str | None = None,
    autocast: str | None = None,
    force: bool = False,
    given: Collection[str] = frozenset(),
    progress: Progress = NULL_PROGRESS,
    notify: Callable[[str], None] = _silent,
) -> dict[str, Any]:
    """``dpaudit train`` (every algorithm but cloak, :func:`dpaudit.training.cloak.train_cloak_sweep`):
    build the configs from the command's options, train and save the run; returns its metadata.
    ``model_spec``: a JSON spec file (any kind, ``python`` included) instead of ``model`` (default
    :func:`dpaudit.training.convex.model_for`: logreg for the convex learners, else mlp) with
    ``hidden``/``activation``. ``notify`` receives a status line (the CLI prints it on
    stderr). ``given``: the options the user gave (not left at their defaults); one the algorithm does not
    read is refused (:func:`dpaudit.training.config.check_options_read`)."""
    from dpaudit.training.config import NOT_GIVEN, check_options_read

    # An option away from its default was given, whatever ``given`` says (a Python caller passes none).
    away = {
        "noise_multiplier": noise_multiplier, "epsilon": epsilon, "l2": l2, "jl_projections": jl_projections,
        "whitebox_canaries": whitebox_canaries, "canaries": canaries, "teachers": teachers, "queries": queries,
        "sigma": sigma, "sigma1": sigma1, "threshold": threshold, "max_answers": max_answers, "shots": shots,
        "subsample": subsample, "sanitiser": sanitiser, "mechanism": mechanism, "objective": objective,
        "claim": None if claim == "data-independent" else claim,
        "keep_private_diagnostics": keep_private_diagnostics or None,
        "epochs": epochs, "steps": steps, "batch_size": batch_size, "lr": lr, "momentum": momentum,
    }  # fmt: skip
    # And one away from the value that means "not given" (training.config.NOT_GIVEN): pate's device="cuda" or
    # backend="jax", adam's max_physical_batch trained without a word for a Python caller (the CLI refused them).
    typed = {
        "clip": clip, "sampling": sampling, "accountant": accountant, "autocast": autocast, "clipping": clipping,
        "max_physical_batch": max_physical_batch, "device": device, "backend": backend, "secure_noise": secure_noise,
    }  # fmt: skip
    away |= {name: value for name, value in typed.items() if value not in NOT_GIVEN[name]}
    given = {*given, *(name for name, value in away.items() if value is not None)}
    fractions = parse_fractions(split)
    if model_spec is not None and (model is not None or hidden is not None or activation is not None):
        raise InputError("give --model-spec or --model (with --hidden, --activation), not both")
    from dpaudit.data import check_data_spec

    check_data_spec(data, label_column=label_column)  # every algorithm's data, PATE's and DP-ICL's too
    from dpaudit.training.convex import model_for

    if model_spec is None:  # the algorithm's default (logreg for the convex learners, the only one they train)
        model = model_for(algo, model)
    if algo in ("pate", "dp-icl"):  # noisy-vote aggregation (dpaudit/training/pate.py)
        check_options_read(algo, given)
        if model_spec is not None:
            trains = "its teachers and its student" if algo == "pate" else "its student (its votes: --predictor)"
            raise InputError(f"--algo {algo} trains {trains} from --model; --model-spec is not supported")
        if subsample is not None:  # named as given (it becomes the aggregator's sample_rate)
            check_in_interval(0.0, 1.0, hi_open=False, subsample=subsample)
        from dpaudit.training.pate import train_from_options as train_aggregation

        meta = train_aggregation(
            out, algo=algo, teachers=teachers, aggregator=aggregator, queries=queries, sigma=sigma, sigma1=sigma1,
            threshold=threshold, max_answers=max_answers, shots=shots, predictor=predictor, epsilon=epsilon,
            delta=delta, seed=seed, data=data, label_column=label_column, model=model,
            hidden=parse_ints(hidden, "--hidden"), activation=activation, epochs=epochs, steps=steps,
            batch_size=batch_size, lr=lr, momentum=momentum, weight_decay=weight_decay, split_seed=split_seed,
            fractions=fractions, workers=workers, force=force, progress=progress, claim=claim,
            keep_private_diagnostics=keep_private_diagnostics, subsample=subsample, sanitiser=sanitiser,
            notify=notify,
        )  # fmt: skip
        # The run's record carries the note (pate.data_dependent_note, stored as privacy["note"]): one source.
        if (note := (meta.get("privacy") or {}).get("note")) is not None:
            notify(note)
        return meta
    from dpaudit.data import load_dataset, make_splits
    from dpaudit.models import default_spec
    from dpaudit.training.algorithms import TRAINERS
    from dpaudit.training.config import DEFAULT_JL_PROJECTIONS, DPConfig, PerfConfig, TrainConfig, fill_recipe
    from dpaudit.training.convex import CONVEX_ALGOS, resolve_algo
    from dpaudit.training.dirac import DiracCanaries
    from dpaudit.training.run import train_run
    from dpaudit.validation import check_choice

    if l2 is not None:  # convex learners (dpaudit/training/convex.py): λ is the weight decay
        check_in_interval(0.0, math.inf, lo_open=False, l2=l2)  # named as given, not as the weight decay it sets
        check_float32(l2=l2)
        if weight_decay not in (0.0, l2):
            raise InputError("give --l2 or --weight-decay, not both")
        weight_decay = l2
    # An unknown algorithm is refused before any work (named as the parameter; the CLI shows --algo).
    check_choice(sorted([*TRAINERS, "pate", "dp-icl"]), algo=algo)
    algo = resolve_algo(algo, mechanism, objective)
    check_options_read(algo, given)  # e.g. --clip with --algo sgd: refused, never silently ignored
    _check_canary_counts(canaries=canaries, whitebox_canaries=whitebox_canaries)
    # Defaults per algorithm and model kind (training/config.py: DP recipes, the convex learners' lambda).
    batch_given = batch_size is not None
    r = fill_recipe(
        algo, "mlp" if model is None else model, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, l2=l2
    )
    epochs, batch_size, lr, momentum = r["epochs"], r["batch_size"], r["lr"], r["momentum"]
    if l2 is None and weight_decay == 0.0:
        weight_decay = r["l2"]
    if algo.endswith("-jl") and jl_projections is None:
        jl_projections = DEFAULT_JL_PROJECTIONS
    private = algo.startswith("dp") or algo in CONVEX_ALGOS
    dp = None
    if private:
        dp = DPConfig(
            clip=clip, noise_multiplier=noise_multiplier, target_epsilon=epsilon, delta=delta, sampling=sampling,
            accountant=accountant or ("pld" if jl_projections is not None else "rdp"),
            jl_projections=jl_projections, secure_noise=secure_noise,
        )  # fmt: skip
    config = TrainConfig(
        algo=algo, epochs=epochs, steps=steps, batch_size=batch_size, lr=lr, momentum=momentum,
        weight_decay=weight_decay, seed=seed, dp=dp,
    )  # fmt: skip
    perf = PerfConfig(
        device=device, max_physical_batch=max_physical_batch, clipping=clipping, backend=backend, autocast=autocast
    )
    _refuse_existing(out, force, inputs=[data, model_spec])
    ds = load_dataset(data, label_column=label_column)
    if algo in CONVEX_ALGOS and ds.kind == "tokens":  # "use --model logreg" was the advice, which tokens refuse
        raise InputError(
            f"--algo {algo} trains a logistic regression on numeric features (the zoo's logreg), and {data!r} holds "
            "token ids: train a model over tokens with --algo dpsgd, dpadam or dpsgd-jl (--model rnn or --model-spec "
            "with your own module), or pate/dp-icl with --model rnn"
        )
    if model_spec is not None:
        from dpaudit.plugins import load_model_spec

        spec = load_model_spec(
            model_spec, feature_shape=ds.feature_shape, n_classes=ds.n_classes, tokens=ds.kind == "tokens", dataset=ds
        )
    else:
        spec = default_spec(
            model, input_shape=ds.feature_shape, n_classes=ds.n_classes,
            vocab_size=ds.vocab_size, hidden=parse_ints(hidden, "--hidden"), activation=activation,
        )  # fmt: skip
    splits = make_splits(len(ds), split_seed, fractions)
    if not batch_given and algo not in CONVEX_ALGOS:
        config = _fit_default_batch(config, len(splits.members), notify)
    notify(f"training {spec.kind} on {ds.name} ({len(ds)} records) with {algo} …")
    canary_set, n_train = None, len(splits.members)
    if canaries is not None:
        from dpaudit.canaries import make_canaries

        canary_set = make_canaries(ds, splits, m=canaries, kind=canary_kind, seed=canary_seed)
        n_train += int(canary_set.included.sum())
    if not allow_inconclusive:  # each formal canary set of the checkpoint audit (black-box, white-box) must refute
        from dpaudit.workflows.training import require_refutable_canaries

        sets = (canaries is not None) + (whitebox_canaries is not None)
        if canaries is not None:
            require_refutable_canaries(config, n_train, canaries, sets=sets)
        if whitebox_canaries is not None:  # gradient canaries, no records: the claim is the members'
            try:
                require_refutable_canaries(config, n_train, whitebox_canaries, sets=sets)
            except InputError as refused:
                raise InputError(f"--whitebox-canaries {whitebox_canaries}: {refused}") from None
    return train_run(
        ds, spec, config, perf, out=out, split_seed=split_seed, fractions=fractions, label_column=label_column,
        force=force, progress=progress, canaries=canary_set,
        whitebox=None if whitebox_canaries is None else DiracCanaries(m=whitebox_canaries, seed=canary_seed),
    )  # fmt: skip


def _check_canary_counts(**counts: int | None) -> None:
    """Refuse, before any training, a canary count the checkpoint audit could not analyse: its one-run design
    selects the guess counts on half the canaries and evaluates them on the other half (each half needs 2).
    ``train --canaries 3 --allow-inconclusive`` trained, then ``audit checkpoint`` stopped at "0 members, 3
    non-members" or "needs at least 4 canaries"."""
    from dpaudit.defaults import MIN_HOLDOUT_CANARIES as least
    from dpaudit.validation import check_positive_int

    for name, m in counts.items():
        if m is not None and check_positive_int(**{name: m}) < least:
            raise InputError(
                f"expected {name} >= {least}, got {m}: the checkpoint's one-run audit selects its guess counts on "
                "half the canaries and scores the other half"
            )


def _fit_default_batch(config: Any, n_train: int, notify: Callable[[str], None]) -> Any:
    """``config`` with a default batch size that fits the training split. `train --data wine` (62 training records
    at the default split) stopped on "batch size 64 is larger than the training set": a default the user never
    chose made the simplest command on an embedded dataset fail. A quarter of the records (q = B/N about 1/4
    under Poisson sampling), with a notice; a --batch-size the user gives is never changed."""
    import dataclasses

    if not 0 < n_train < config.batch_size:
        return config
    smaller = max(1, n_train // 4)
    notify(
        f"the default --batch-size {config.batch_size} is larger than the {n_train} training records; using "
        f"{smaller} (a quarter of them; give --batch-size to choose)"
    )
    return dataclasses.replace(config, batch_size=smaller)


def read_json_file(path: Path, what: str) -> Any:
    from dpaudit.validation import read_json

    if path.is_dir():
        raise InputError(f"{path}: expected a {what} JSON file, got a directory")
    return read_json(path)  # size, depth and number limits


def _from_file(parse, *args, **kwargs):
    """``parse(...)`` of a JSON file's content; its errors name the file's fields, not the command's
    options, so they are raised as :class:`FileContentError` (printed as they are)."""
    try:
        return parse(*args, **kwargs)
    except DPAuditError as e:
        raise FileContentError(str(e).splitlines()[0]) from None


def import_from_options(
    weights: Path,
    *,
    model_spec: Path,
    out: Path,
    data: str | None,
    label_column: str | None,
    members: Path | None,
    claim: Path | None,
    epsilon: float | None,
    delta: float | None,
    noise_multiplier: float | None,
    sample_rate: float | None,
    steps: int | None,
    accountant: str | None,
    neighbouring: str | None,
    preprocessing: str | None,
    recipe: Path | None,
    split_seed: int,
    split: str | None,
    canaries: Path | None = None,
    force: bool = False,
    progress: Progress = NULL_PROGRESS,
    notify: Callable[[str], None] = _silent,
) -> dict[str, Any]:
    """``dpaudit import``: a run directory from foreign weights, a model spec, the members (optional), a
    stated claim and a recipe (optional); returns its metadata (``meta["import"]["warnings"]`` lists what
    the user should hear). ``canaries``: a directory from ``dpaudit canaries make`` whose included records
    the training added (checked against the data), for the formal one-run audit of ``audit checkpoint``."""
    from dpaudit.canaries import read_canary_dir
    from dpaudit.data import (
        DEFAULT_FRACTIONS,
        check_data_spec,
        check_feature_names,
        load_dataset,
        read_member_indices,
        standardizer_from_json,
    )
    from dpaudit.fileio import check_weights_file
    from dpaudit.models import read_model_spec
    from dpaudit.training.run import check_input_shape, import_run, recipe_from_dict

    check_weights_file(weights)  # the first argument first (its file is read last, by import_run)
    _refuse_existing(out, force, inputs=[weights, model_spec, data, members, claim, recipe, canaries])
    if data is not None and members is None:
        raise InputError(
            "--data needs --members FILE, the indices of the records the model was trained on "
            "(without both, the model is assumed to be trained on dpaudit's split of digits)"
        )
    if members is not None and data is None:
        raise InputError("--members needs --data, the records the indices point into")
    if members is not None and split is not None:
        raise InputError(
            "--split applies only without --members; the non-members are split 40% holdout, 40% aux, 20% test"
        )
    stated = _stated_claim(claim, epsilon, delta, noise_multiplier, sample_rate, steps, accountant, neighbouring)
    config = None
    if recipe is not None:
        delta_default = stated.delta if stated is not None else None
        config = _from_file(recipe_from_dict, read_json_file(recipe, "recipe"), str(recipe), delta=delta_default)
    ds = load_dataset(
        check_data_spec(data if data is not None else "digits", label_column=label_column), label_column=label_column
    )
    spec = read_model_spec(
        model_spec, tokens=ds.kind == "tokens", fits=lambda s: check_input_shape(s, ds.feature_shape)
    )
    member_idx = read_member_indices(members, len(ds)) if members is not None else None
    pre: object = preprocessing
    if preprocessing is not None and preprocessing not in ("none", "identity", "standardize"):
        path = Path(preprocessing)
        if path.suffix.lower() != ".json" and not path.exists():
            raise InputError(
                f"unknown --preprocessing {preprocessing!r}; valid: none, a scaler.json path "
                "(legacy mode: standardize, identity)"
            )
        scaler = read_json_file(path, "scaler")
        pre = _from_file(standardizer_from_json, scaler, ds.feature_shape, str(path))
        if isinstance(scaler, dict) and "feature_names" in scaler and ds.feature_names is not None:
            check_feature_names(ds.feature_names, scaler["feature_names"], data=str(data), source=str(path))
    if spec.feature_names is not None and ds.feature_names is not None:
        check_feature_names(ds.feature_names, spec.feature_names, data=str(data), source=str(model_spec))
    notify(f"importing {weights} ({spec.kind} on {ds.name}, {len(ds)} records) …")
    return import_run(
        weights, spec, ds, out=out, members=member_idx, members_source=str(members) if members is not None else None,
        split_seed=split_seed, fractions=parse_fractions(split) if split is not None else DEFAULT_FRACTIONS,
        preprocessing=pre, claim=stated, recipe=config, label_column=label_column, force=force,
        canaries=None if canaries is None else read_canary_dir(canaries, ds), progress=progress,
    )  # fmt: skip


def inspect_summary(run: Any) -> dict[str, Any]:
    """``dpaudit inspect``: a loaded run's summary (:func:`dpaudit.training.run.summary`, after its data hash
    is verified), with its claim re-accounted from the recorded mechanism (``privacy.event``, as every audit
    and report does, :func:`dpaudit.checkpoint.reaccount_claim`): ``epsilon_recomputed`` (None when the claim
    cannot be re-accounted: no claim, a claim stated without a mechanism, or a mechanism that does not parse) and
    ``claim_mismatch`` (True when the recorded ε differs from it, or its mechanism does not parse: the file was
    edited or written by other software). Both ε are shown; the
    recorded one stays ``epsilon``, the claim that audits test."""
    from dpaudit.checkpoint import reaccount_claim
    from dpaudit.training.run import summary

    run.dataset()  # verifies the data hash
    s = summary(run.meta)
    check = reaccount_claim(run.privacy)
    s["epsilon_recomputed"] = None if check is None else check["recomputed"]
    s["claim_mismatch"] = check is not None and not check["match"]
    return s


def _stated_claim(claim, epsilon, delta, noise_multiplier, sample_rate, steps, accountant, neighbouring):
    """The claim of ``dpaudit import``: from claim.json, or from the flags (which need --delta), or None."""
    from dpaudit.training.run import StatedClaim

    flags = {
        "--epsilon": epsilon, "--delta": delta, "--noise-multiplier": noise_multiplier, "--sample-rate": sample_rate,
        "--steps": steps, "--accountant": accountant, "--neighbouring": neighbouring,
    }  # fmt: skip
    given = [k for k, v in flags.items() if v is not None]
    if claim is not None and given:
        raise InputError(f"--claim and {given[0]} are mutually exclusive (put everything in claim.json)")
    if claim is not None:
        return _from_file(StatedClaim.from_dict, read_json_file(claim, "claim"), str(claim))
    if not given:
        return None
    if delta is None:
        raise InputError(f"{given[0]} needs --delta (the claim's δ)")
    return StatedClaim(
        delta=delta, epsilon=epsilon, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps,
        accountant=accountant, neighbouring=neighbouring,
    )  # fmt: skip


# dpaudit-trainer options that a plug-in trainer replaces: refused when given together with ``trainer``.
RECIPE_OPTIONS = ("algo", "epochs", "steps", "batch_size", "lr", "noise_multiplier", "epsilon", "clip")


def audit_training_from_options(
    *,
    runs: int,
    threat_model: str,
    canary_kind: str | None,
    init: str,
    allow_inconclusive: bool,
    data: str,
    label_column: str | None,
    model: str,
    model_spec: Any,
    trainer: str | None,
    neighbouring: str | None,
    train_size: int | None,
    algo: str,
    epochs: int,
    steps: int | None,
    batch_size: int,
    lr: float,
    noise_multiplier: float | None,
    epsilon: float | None,
    clip: float,
    delta: float | None,
    confidence: float,
    method: str,
    claimed_epsilon: float | None,
    workers: int,
    seed: int,
    score: list[str] | None = None,
    given: frozenset[str] | set[str] = frozenset(),
    progress: Progress = NULL_PROGRESS,
):
    """``dpaudit audit train``: the recipe (or the plug-in ``trainer``) from the command's options, then
    the multi-run audit (:func:`dpaudit.workflows.training.audit_training`, a ``TrainingAudit``), or for
    ``threat_model="white-box-steps"`` the per-step white-box audit of one run
    (:func:`dpaudit.workflows.whitebox.audit_whitebox_steps`). ``given``: the options the user gave
    explicitly (recipe options beside ``trainer`` are refused). ``delta``: the δ of the claim (ε, δ), one value
    for both sides: dpaudit's recipe is accounted at it (default 1e-5) and the audit tests (ε, δ); a plug-in
    trainer's claim needs it. ``score``: the scores of a plug-in audit
    (:data:`dpaudit.workflows.training.PLUGIN_SCORES` or "module:function"; default the canary's margin)."""
    from dpaudit.data import check_data_spec, load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.algorithms import get_trainer
    from dpaudit.training.config import DPConfig, TrainConfig
    from dpaudit.validation import check_choice

    check_choice(("clopper-pearson", "gdp"), method=method)
    check_choice(("black-box", "white-box", "white-box-steps"), threat_model=threat_model)  # all three named
    if threat_model == "white-box-steps":  # one run, audited step by step (whitebox.audit_whitebox_steps)
        unread = [n for n in ("runs", "canary_kind", "init", "allow_inconclusive", "method", "workers", "score")
                  if n in given]  # fmt: skip
        if unread:  # were ignored without a word (exit 0)
            raise InputError(
                f"--{unread[0].replace('_', '-')} does not apply to --threat-model white-box-steps (one run, a Dirac "
                "canary offered at each step, audited per step)"
            )
    if model_spec is not None and "model" in given:
        raise InputError("give --model or --model-spec, not both")
    config = None
    if trainer is not None:
        clash = [f"--{n.replace('_', '-')}" for n in RECIPE_OPTIONS if n in given]
        if clash:
            raise InputError(f"{', '.join(clash)} configure dpaudit's trainer, which --trainer replaces: drop them")
        if claimed_epsilon is None or delta is None:
            raise InputError("--trainer needs your pipeline's claim: --claimed-epsilon E --delta D")
    else:
        dp = None
        if algo.startswith("dp"):
            given_delta = {} if delta is None else {"delta": delta}  # None: DPConfig's default
            dp = DPConfig(clip=clip, noise_multiplier=noise_multiplier, target_epsilon=epsilon, **given_delta)
            delta = dp.delta  # the claim's δ: the recipe is accounted at it and the audit tests (ε, δ)
        elif noise_multiplier is not None or epsilon is not None:
            raise InputError(f"--noise-multiplier/--epsilon need a private algorithm (dpsgd, dpadam), not {algo!r}")
        elif "clip" in given:  # nothing is clipped: was ignored without a word
            raise InputError(f"--clip needs a private algorithm (dpsgd, dpadam), not {algo!r}")
        config = TrainConfig(algo=algo, epochs=epochs, steps=steps, batch_size=batch_size, lr=lr, seed=seed, dp=dp)
        get_trainer(algo)  # an unknown --algo is refused before any run
    ds = load_dataset(check_data_spec(data, label_column=label_column), label_column=label_column)
    if model_spec is not None:
        from dpaudit.plugins import load_model_spec

        spec = load_model_spec(
            model_spec, feature_shape=ds.feature_shape, n_classes=ds.n_classes, tokens=ds.kind == "tokens", dataset=ds
        )
    else:
        spec = default_spec(model, input_shape=ds.feature_shape, n_classes=ds.n_classes, vocab_size=ds.vocab_size)
    if config is not None and "batch_size" not in given:  # `audit train --data wine`: 63 records, B 64
        from dpaudit.data import make_splits
        from dpaudit.progress import announce

        n_train = train_size if train_size is not None else len(make_splits(len(ds), 0).members)  # audit_training's
        config = _fit_default_batch(config, n_train, announce)
    if threat_model == "white-box-steps":
        from dpaudit.workflows.whitebox import audit_whitebox_steps

        if trainer is not None:
            raise InputError("the per-step white-box audit needs dpaudit's own DP-SGD trainer, not --trainer")
        return audit_whitebox_steps(
            ds, spec, config, train_size=train_size, confidence=confidence, claimed_epsilon=claimed_epsilon, seed=seed
        )
    from dpaudit.workflows.training import audit_training

    return audit_training(
        ds, spec, config, runs=runs, train_size=train_size, threat_model=threat_model, canary_kind=canary_kind,
        method=method, delta=delta, confidence=confidence, claimed_epsilon=claimed_epsilon, seed=seed,
        workers=workers, progress=progress, trainer=trainer, neighbouring=neighbouring, init=init,
        allow_inconclusive=allow_inconclusive, scores=tuple(score) if score else ("margin",),
    )  # fmt: skip
