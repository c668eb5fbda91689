"""``dpaudit train``: train a model (non-private or DP) and save a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpaudit.cli._common import App, ForceFlag, JsonFlag, emit, info, progress
from dpaudit.errors import InputError
from dpaudit.training.config import recipe_help

RECIPE_HELP = recipe_help()


def parse_fractions(text: str) -> tuple[float, ...]:
    try:
        parts = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise InputError(f"expected --split as four fractions members,holdout,aux,test, got {text!r}") from None
    if len(parts) != 4:
        raise InputError(f"expected --split as four fractions members,holdout,aux,test, got {text!r}")
    return parts


def parse_ints(text: str | None, name: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise InputError(f"expected {name} as comma-separated integers, got {text!r}") from None


def human_summary(s: dict, *, imported: bool = False) -> str:
    """The run summary for humans: accuracies as percentages (the JSON keeps fractions)."""
    from dpaudit.report._format import rate

    lines = [
        f"model      {s['model']} on {s['data']} ({s['n_members']} training records), algo {s['algo']}",
        f"accuracy   train {rate(s['train_accuracy'])}   test {rate(s['test_accuracy'])}",
    ]
    if s["private"]:
        how = s["accountant"] or "stated, not accounted"
        lines.append(f"privacy    ε = {s['epsilon']:.4g} at δ = {s['delta']:g} ({how})")
    else:
        lines.append("privacy    no claim (imported weights)" if imported else "privacy    none (non-private training)")
    return "\n".join(lines)


def register(app: App) -> None:
    register_import(app)

    @app.command("train")
    def train(
        out: Annotated[Path, typer.Option("--out", "-o", help="Run directory to write (e.g. runs/NAME).")],
        data: Annotated[
            str,
            typer.Option(
                "--data",
                help="digits | breast-cancer | wine | synthetic:... | synthetic-tokens:... | PATH.csv | PATH.npz",
            ),
        ] = "digits",
        label_column: Annotated[str | None, typer.Option("--label-column", help="Label column of a CSV file.")] = None,
        model: Annotated[str, typer.Option("--model", help="logreg | mlp | cnn | rnn")] = "mlp",
        hidden: Annotated[str | None, typer.Option("--hidden", help="MLP hidden sizes, e.g. 128,64.")] = None,
        activation: Annotated[str | None, typer.Option("--activation", help="tanh | relu | gelu | elu")] = None,
        algo: Annotated[
            str,
            typer.Option(
                "--algo",
                help="sgd | adam | dpsgd | dpadam | dpsgd-jl | dpadam-jl | pate | dp-icl | outpert | objpert | dpagd "
                "| cloak (with --target, --lambda)",
            ),
        ] = "sgd",
        epochs: Annotated[
            int | None, typer.Option("--epochs", help="Passes over the training split (default: per algo/model).")
        ] = None,
        steps: Annotated[int | None, typer.Option("--steps", help="Number of steps (overrides --epochs).")] = None,
        batch_size: Annotated[
            int | None, typer.Option("--batch-size", help="Batch size (expected size for Poisson).")
        ] = None,
        lr: Annotated[float | None, typer.Option("--lr", help=f"Learning rate. {RECIPE_HELP}")] = None,
        momentum: Annotated[float | None, typer.Option("--momentum", help="SGD momentum (default 0).")] = None,
        weight_decay: Annotated[float, typer.Option("--weight-decay")] = 0.0,
        l2: Annotated[
            float | None,
            typer.Option(
                "--l2", help="outpert/objpert/dpagd: λ of the penalty (λ/2)‖w‖² (default 0.01 for outpert/objpert)."
            ),
        ] = None,
        mechanism: Annotated[
            str | None, typer.Option("--mechanism", help="outpert: laplace (norm mechanism, pure ε) | gaussian (ε, δ).")
        ] = None,
        objective: Annotated[str | None, typer.Option("--objective", help="dpagd: logistic | huber (SVM).")] = None,
        seed: Annotated[int, typer.Option("--seed", help="Seed for initialisation and batches.")] = 0,
        split_seed: Annotated[int, typer.Option("--split-seed", help="Seed of the data split.")] = 0,
        split: Annotated[
            str, typer.Option("--split", help="Fractions members,holdout,aux,test.")
        ] = "0.35,0.2,0.25,0.2",
        noise_multiplier: Annotated[float | None, typer.Option("--noise-multiplier", help="DP: noise σ.")] = None,
        epsilon: Annotated[float | None, typer.Option("--epsilon", help="DP: target ε (calibrates σ).")] = None,
        delta: Annotated[float, typer.Option("--delta", help="DP: δ of the claim.")] = 1e-5,
        clip: Annotated[float, typer.Option("--clip", help="DP: per-example clipping norm C.")] = 1.0,
        sampling: Annotated[str, typer.Option("--sampling", help="DP: poisson | shuffle.")] = "poisson",
        accountant: Annotated[
            str | None, typer.Option("--accountant", help="DP: rdp | pld (default: rdp; pld for the -jl algorithms).")
        ] = None,
        jl_projections: Annotated[
            int | None,
            typer.Option(
                "--jl-projections",
                help="DP-SGD-JL: number R of JL projections estimating per-example norms (--algo dpsgd-jl/dpadam-jl; "
                "default 16).",
            ),
        ] = None,
        secure_noise: Annotated[
            bool, typer.Option("--secure-noise", help="DP: cryptographically seeded noise.")
        ] = False,
        clipping: Annotated[str, typer.Option("--clipping", help="auto | ghost | vmap | loop.")] = "auto",
        backend: Annotated[
            str, typer.Option("--backend", help="torch | jax (logreg/mlp/cnn; pip install 'dpaudit[jax]').")
        ] = "torch",
        max_physical_batch: Annotated[int | None, typer.Option("--max-physical-batch")] = None,
        device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "auto",
        canaries: Annotated[
            int | None, typer.Option("--canaries", help="Audit: insert M canaries, each included w.p. 1/2.")
        ] = None,
        canary_kind: Annotated[
            str,
            typer.Option(
                "--canary-kind",
                help="mislabeled | outlier | clipbkd | crafted (from the public aux split, for the final-model "
                "threat model).",
            ),
        ] = "mislabeled",
        canary_seed: Annotated[int, typer.Option("--canary-seed", help="Seed of canaries and inclusion.")] = 0,
        allow_inconclusive: Annotated[
            bool,
            typer.Option(
                "--allow-inconclusive",
                help="Train even when --canaries is too few for their one-run audit to refute the claim "
                "(otherwise refused with exit 2).",
            ),
        ] = False,
        whitebox_canaries: Annotated[
            int | None,
            typer.Option(
                "--whitebox-canaries",
                help="Audit (DP-SGD, Poisson): M white-box Dirac gradient canaries, each included w.p. 1/2, "
                "every update observed; `dpaudit audit checkpoint` audits them (one run, formal).",
            ),
        ] = None,
        teachers: Annotated[int | None, typer.Option("--teachers", help="PATE/DP-ICL: number of teachers K.")] = None,
        aggregator: Annotated[
            str, typer.Option("--aggregator", help="PATE/DP-ICL: lnmax | gnmax | confident-gnmax | argmax.")
        ] = "gnmax",
        queries: Annotated[int | None, typer.Option("--queries", help="PATE/DP-ICL: public queries Q.")] = None,
        sigma: Annotated[
            float | None, typer.Option("--sigma", help="PATE/DP-ICL: answer noise (Laplace b; Gaussian σ, σ2).")
        ] = None,
        sigma1: Annotated[float | None, typer.Option("--sigma1", help="Confident-GNMax: threshold noise σ1.")] = None,
        threshold: Annotated[float | None, typer.Option("--threshold", help="Confident-GNMax: threshold T.")] = None,
        max_answers: Annotated[int | None, typer.Option("--max-answers", help="Confident-GNMax: answer cap.")] = None,
        shots: Annotated[int | None, typer.Option("--shots", help="DP-ICL: exemplars per teacher k.")] = None,
        predictor: Annotated[
            str, typer.Option("--predictor", help="DP-ICL: knn | prototype | PATH (local embedding model).")
        ] = "knn",
        workers: Annotated[int, typer.Option("--workers", help="PATE: teachers trained in parallel.")] = 1,
        claim: Annotated[
            str,
            typer.Option(
                "--claim",
                help="PATE/DP-ICL: data-independent | data-dependent (sanitised with smooth sensitivity, "
                "Papernot et al. 2018; gnmax/confident-gnmax).",
            ),
        ] = "data-independent",
        subsample: Annotated[
            float | None,
            typer.Option(
                "--subsample",
                help="DP-ICL (gnmax): each query's teachers see a fresh Poisson sample of the exemplars at this "
                "rate (accounted with amplification; replaces --shots).",
            ),
        ] = None,
        keep_private_diagnostics: Annotated[
            bool,
            typer.Option(
                "--keep-private-diagnostics",
                help="PATE/DP-ICL: also save values computed from the private votes (not DP) in checkpoint.json.",
            ),
        ] = False,
        target: Annotated[
            Path | None, typer.Option("--target", help="Cloak: the frozen model's run directory.")
        ] = None,
        lambdas: Annotated[
            list[str] | None,
            typer.Option(
                "--lambda", metavar="L[,L2…]", help="Cloak: weight λ of the task loss (> 0); several: a sweep."
            ),
        ] = None,
        force: ForceFlag = False,
        json_output: JsonFlag = False,
    ) -> None:
        """Train a model on a dataset split and save it as a run directory."""
        from dpaudit.data import load_dataset
        from dpaudit.models import default_spec
        from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig, fill_recipe
        from dpaudit.training.dirac import DiracCanaries
        from dpaudit.training.run import summary, train_run

        fractions = parse_fractions(split)
        if algo == "cloak" or target is not None or lambdas:  # learned input noise (dpaudit/training/cloak.py)
            from dpaudit.cli.cloak import train_cloak_command

            opts = dict(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, force=force, json_output=json_output)
            return train_cloak_command(algo, target, lambdas or [], out, **opts)
        if algo in ("pate", "dp-icl"):  # noisy-vote aggregation (dpaudit/training/pate.py)
            if noise_multiplier is not None or jl_projections is not None or whitebox_canaries is not None:
                raise InputError(
                    f"--algo {algo} adds noise to the votes: use --sigma/--sigma1 or --epsilon "
                    "(not --noise-multiplier, --jl-projections or --whitebox-canaries)"
                )
            from dpaudit.training.pate import train_from_options

            opts = dict(teachers=teachers, aggregator=aggregator, queries=queries, sigma=sigma, sigma1=sigma1)
            opts.update(threshold=threshold, max_answers=max_answers, shots=shots, predictor=predictor, epsilon=epsilon)
            opts.update(delta=delta, seed=seed, data=data, label_column=label_column, model=model, algo=algo)
            opts.update(hidden=parse_ints(hidden, "--hidden"))
            opts.update(activation=activation, epochs=epochs, steps=steps, batch_size=batch_size, lr=lr)
            opts.update(momentum=momentum, weight_decay=weight_decay, split_seed=split_seed, fractions=fractions)
            opts.update(claim=claim, keep_private_diagnostics=keep_private_diagnostics, subsample=subsample)
            meta = train_from_options(out, **opts, workers=workers, force=force, progress=progress(json_output))
            s = summary(meta)
            emit({"out": str(out), **s}, human_summary(s) + f"\nsaved      {out}", json_flag=json_output)
            return
        dp_given = noise_multiplier is not None or epsilon is not None
        if l2 is not None:  # convex learners (dpaudit/training/convex.py): λ is the weight decay
            if weight_decay not in (0.0, l2):
                raise InputError("give --l2 or --weight-decay, not both")
            weight_decay = l2
        from dpaudit.training.convex import CONVEX_ALGOS, resolve_algo

        algo = resolve_algo(algo, mechanism, objective)
        r = fill_recipe(algo, model, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, l2=l2)
        epochs, batch_size, lr, momentum = r["epochs"], r["batch_size"], r["lr"], r["momentum"]
        if l2 is None and weight_decay == 0.0:
            weight_decay = r["l2"]
        if algo.endswith("-jl") and jl_projections is None:
            from dpaudit.training.config import DEFAULT_JL_PROJECTIONS

            jl_projections = DEFAULT_JL_PROJECTIONS
        private = algo.startswith("dp") or algo in CONVEX_ALGOS
        if dp_given and not private:
            raise InputError(f"--noise-multiplier/--epsilon need a private algorithm (dpsgd, dpadam), not {algo!r}")
        if jl_projections is not None and not algo.endswith("-jl"):
            raise InputError(f"--jl-projections needs --algo dpsgd-jl or dpadam-jl, not {algo!r}")
        dp = (
            DPConfig(
                clip=clip,
                noise_multiplier=noise_multiplier,
                target_epsilon=epsilon,
                delta=delta,
                sampling=sampling,
                accountant=accountant or ("pld" if jl_projections is not None else "rdp"),
                jl_projections=jl_projections,
                secure_noise=secure_noise,
            )
            if private
            else None
        )
        config = TrainConfig(
            algo=algo,
            epochs=epochs,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            seed=seed,
            dp=dp,
        )
        perf = PerfConfig(device=device, max_physical_batch=max_physical_batch, clipping=clipping, backend=backend)
        if out.exists() and not force:
            raise InputError(f"{out} already exists; use --force to overwrite it")
        ds = load_dataset(data, label_column=label_column)
        spec = default_spec(
            model,
            input_shape=ds.feature_shape,
            n_classes=ds.n_classes,
            vocab_size=ds.vocab_size,
            hidden=parse_ints(hidden, "--hidden"),
            activation=activation,
        )
        info(f"training {model} on {ds.name} ({len(ds)} records) with {algo} …", json_flag=json_output)
        canary_set = None
        if canaries is not None:
            from dpaudit.canaries import make_canaries
            from dpaudit.data import make_splits

            canary_set = make_canaries(
                ds, make_splits(len(ds), split_seed, fractions), m=canaries, kind=canary_kind, seed=canary_seed
            )
            if not allow_inconclusive:
                from dpaudit.workflows.training import require_refutable_canaries

                n_train = len(make_splits(len(ds), split_seed, fractions).members) + int(canary_set.included.sum())
                require_refutable_canaries(config, n_train, canaries)
        meta = train_run(
            ds,
            spec,
            config,
            perf,
            out=out,
            split_seed=split_seed,
            fractions=fractions,
            label_column=label_column,
            force=force,
            progress=progress(json_output),
            canaries=canary_set,
            whitebox=None if whitebox_canaries is None else DiracCanaries(m=whitebox_canaries, seed=canary_seed),
        )
        s = summary(meta)
        emit({"out": str(out), **s}, human_summary(s) + f"\nsaved      {out}", json_flag=json_output)


_IMPORT_DOC = """Make a run directory from foreign weights plus a model spec (no unpickling).

WEIGHTS is model.safetensors (or a .pt plain state_dict); Opacus' `_module.` and DDP's `module.`
prefixes are removed. SPEC, the members file, claim.json, scaler.json and recipe.json are
documented with examples in docs/model-spec.md.

With --data DATA --members FILE (0-based record indices into DATA, one per line with an optional
header line, or an integer .npy), every other record is a non-member: those are shuffled with
--split-seed and split 40% holdout, 40% aux, 20% test (saved in split.npz), so every attack works
as on a dpaudit run. A member list whose members do not look like training records (their loss not
below the holdout's) gives a warning, and the run's membership estimates carry that note.

Without --data and --members (legacy) the model is assumed to be trained on dpaudit's members split
of digits (--split-seed, --split), with a warning.

The claim (--claim claim.json, or --epsilon/--delta and optionally --noise-multiplier,
--sample-rate, --steps): mechanism parameters are re-accounted with dpaudit's accountant and the
larger of that and a stated epsilon is recorded; (epsilon, delta) alone is recorded as stated by
the user. --recipe lets LiRA and shadow models be trained for the run, with its preprocessing.
"""
# Paragraphs as single lines: the help renderer re-wraps them to the terminal's width.
IMPORT_HELP = "\n\n".join(" ".join(p.split()) for p in _IMPORT_DOC.split("\n\n"))


def _read_json(path: Path, what: str):
    import json

    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: expected a {what} JSON file, got a directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None


def _from_file(parse, *args, **kwargs):
    """``parse(...)`` of a JSON file's content; its errors name the file's fields, which are not this
    command's options, so they are printed as they are (exit code 2) instead of being rewritten."""
    from dpaudit.cli._common import fail
    from dpaudit.errors import DPAuditError

    try:
        return parse(*args, **kwargs)
    except DPAuditError as e:
        fail(str(e).splitlines()[0])


def _warn(message: str) -> None:
    """A warning on stderr: shown even with --json (stdout stays machine-readable), not with --quiet."""
    from dpaudit.cli._common import STATE

    if not STATE.quiet:
        typer.echo(f"warning: {message}", err=True)


def register_import(app: App) -> None:
    @app.command("import", help=IMPORT_HELP)
    def import_weights(
        weights: Annotated[Path, typer.Argument(help="model.safetensors, or a .pt plain state_dict.")],
        model_spec: Annotated[
            Path, typer.Option("--model-spec", help="JSON model spec (docs/model-spec.md; checkpoint.json 'model').")
        ],
        out: Annotated[Path, typer.Option("--out", "-o", help="Run directory to write.")],
        data: Annotated[
            str | None,
            typer.Option(
                "--data",
                help="The records the model saw: PATH.csv (with --label-column) | PATH.npz | digits | ... "
                "(needs --members).",
            ),
        ] = None,
        label_column: Annotated[str | None, typer.Option("--label-column", help="Label column of a CSV file.")] = None,
        members: Annotated[
            Path | None,
            typer.Option(
                "--members",
                help="The training members: 0-based record indices into --data, one per line (a header line "
                "allowed), or an integer .npy.",
            ),
        ] = None,
        claim: Annotated[
            Path | None,
            typer.Option(
                "--claim",
                help="claim.json: epsilon, delta, optionally noise_multiplier, sample_rate, steps, accountant, "
                "neighbouring (not with --epsilon etc.).",
            ),
        ] = None,
        epsilon: Annotated[float | None, typer.Option("--epsilon", help="Claimed ε (>= 0).")] = None,
        delta: Annotated[float | None, typer.Option("--delta", help="Claimed δ in (0, 1).")] = None,
        noise_multiplier: Annotated[
            float | None, typer.Option("--noise-multiplier", help="Claim: DP-SGD noise σ (re-accounted).")
        ] = None,
        sample_rate: Annotated[
            float | None, typer.Option("--sample-rate", help="Claim: sampling rate q = B/N in (0, 1].")
        ] = None,
        steps: Annotated[int | None, typer.Option("--steps", help="Claim: number of DP-SGD steps T.")] = None,
        accountant: Annotated[
            str | None, typer.Option("--accountant", help="Claim: rdp | pld (default rdp; with σ, q, T).")
        ] = None,
        neighbouring: Annotated[
            str | None,
            typer.Option(
                "--neighbouring",
                help="Claim: add_remove (Poisson sampling; default) | replace_one (shuffled fixed-size batches).",
            ),
        ] = None,
        preprocessing: Annotated[
            str | None,
            typer.Option(
                "--preprocessing",
                help="none (features as they are; default with --members) | scaler.json ('mean', 'scale'). "
                "Legacy mode: standardize (default) | identity.",
            ),
        ] = None,
        recipe: Annotated[
            Path | None,
            typer.Option(
                "--recipe", help="recipe.json: how the model was trained (approximately), for LiRA/shadow models."
            ),
        ] = None,
        split_seed: Annotated[
            int, typer.Option("--split-seed", help="Seed of the non-members' holdout/aux/test split.")
        ] = 0,
        split: Annotated[
            str | None,
            typer.Option("--split", help="Legacy mode only: fractions members,holdout,aux,test [0.35,0.2,0.25,0.2]."),
        ] = None,
        force: ForceFlag = False,
        json_output: JsonFlag = False,
    ) -> None:
        from dpaudit.data import DEFAULT_FRACTIONS, load_dataset, read_member_indices, standardizer_from_json
        from dpaudit.models import read_model_spec
        from dpaudit.training.run import StatedClaim, import_run, recipe_from_dict, summary

        if out.exists() and not force:
            raise InputError(f"{out} already exists; use --force to overwrite it")
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
        flags = {
            "--epsilon": epsilon,
            "--delta": delta,
            "--noise-multiplier": noise_multiplier,
            "--sample-rate": sample_rate,
            "--steps": steps,
            "--accountant": accountant,
            "--neighbouring": neighbouring,
        }
        given = [k for k, v in flags.items() if v is not None]
        if claim is not None and given:
            raise InputError(f"--claim and {given[0]} are mutually exclusive (put everything in claim.json)")
        stated = None
        if claim is not None:
            stated = _from_file(StatedClaim.from_dict, _read_json(claim, "claim"), str(claim))
        elif given:
            if delta is None:
                raise InputError(f"{given[0]} needs --delta (the claim's δ)")
            stated = StatedClaim(
                delta=delta,
                epsilon=epsilon,
                noise_multiplier=noise_multiplier,
                sample_rate=sample_rate,
                steps=steps,
                accountant=accountant,
                neighbouring=neighbouring,
            )
        spec = read_model_spec(model_spec)
        config = None
        if recipe is not None:
            delta_default = stated.delta if stated is not None else None
            config = _from_file(recipe_from_dict, _read_json(recipe, "recipe"), str(recipe), delta=delta_default)
        ds = load_dataset(data if data is not None else "digits", label_column=label_column)
        member_idx = read_member_indices(members, len(ds)) if members is not None else None
        pre: object = preprocessing
        if preprocessing is not None and preprocessing not in ("none", "identity", "standardize"):
            path = Path(preprocessing)
            if path.suffix.lower() != ".json" and not path.exists():
                raise InputError(
                    f"unknown --preprocessing {preprocessing!r}; valid: none, a scaler.json path "
                    "(legacy mode: standardize, identity)"
                )
            pre = _from_file(standardizer_from_json, _read_json(path, "scaler"), ds.feature_shape, str(path))
        info(f"importing {weights} ({spec.kind} on {ds.name}, {len(ds)} records) …", json_flag=json_output)
        meta = import_run(
            weights,
            spec,
            ds,
            out=out,
            members=member_idx,
            members_source=str(members) if members is not None else None,
            split_seed=split_seed,
            fractions=parse_fractions(split) if split is not None else DEFAULT_FRACTIONS,
            preprocessing=pre,
            claim=stated,
            recipe=config,
            label_column=label_column,
            force=force,
        )
        for message in meta["import"]["warnings"]:
            _warn(message)
        s = summary(meta)
        check = meta["import"]["member_check"]
        lines = [human_summary(s, imported=True)]
        if meta["privacy"] is not None:
            lines.append(f"claim      {meta['privacy']['source']}")
        if check["holdout_loss"] is not None:
            lines.append(
                f"members    loss {check['train_loss']:.4g} vs holdout {check['holdout_loss']:.4g}"
                + ("  (SUSPICIOUS: see the warning)" if check["suspicious"] else "")
            )
        lines.append(f"saved      {out}")
        data_out = {"out": str(out), **s, "claim": meta["privacy"], "import": meta["import"]}
        emit(data_out, "\n".join(lines), json_flag=json_output)
