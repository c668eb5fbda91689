"""``dpaudit train``: train a model (non-private or DP) and save a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpaudit.cli._common import App, ForceFlag, JsonFlag, emit, info, progress
from dpaudit.errors import InputError


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


def human_summary(s: dict) -> str:
    """The run summary for humans: accuracies as percentages (the JSON keeps fractions)."""
    from dpaudit.report._format import rate

    lines = [
        f"model      {s['model']} on {s['data']} ({s['n_members']} training records), algo {s['algo']}",
        f"accuracy   train {rate(s['train_accuracy'])}   test {rate(s['test_accuracy'])}",
    ]
    if s["private"]:
        lines.append(f"privacy    ε = {s['epsilon']:.4g} at δ = {s['delta']:g} ({s['accountant']})")
    else:
        lines.append("privacy    none (non-private training)")
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
        algo: Annotated[str, typer.Option("--algo", help="sgd | adam | dpsgd | dpadam")] = "sgd",
        epochs: Annotated[int, typer.Option("--epochs", help="Passes over the training split.")] = 30,
        steps: Annotated[int | None, typer.Option("--steps", help="Number of steps (overrides --epochs).")] = None,
        batch_size: Annotated[int, typer.Option("--batch-size", help="Batch size (expected size for Poisson).")] = 64,
        lr: Annotated[float, typer.Option("--lr", help="Learning rate.")] = 0.1,
        momentum: Annotated[float, typer.Option("--momentum", help="SGD momentum.")] = 0.0,
        weight_decay: Annotated[float, typer.Option("--weight-decay")] = 0.0,
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
        accountant: Annotated[str, typer.Option("--accountant", help="DP: rdp | pld.")] = "rdp",
        secure_noise: Annotated[
            bool, typer.Option("--secure-noise", help="DP: cryptographically seeded noise.")
        ] = False,
        clipping: Annotated[str, typer.Option("--clipping", help="auto | ghost | vmap | loop.")] = "auto",
        max_physical_batch: Annotated[int | None, typer.Option("--max-physical-batch")] = None,
        device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "auto",
        canaries: Annotated[
            int | None, typer.Option("--canaries", help="Audit: insert M canaries, each included w.p. 1/2.")
        ] = None,
        canary_kind: Annotated[
            str, typer.Option("--canary-kind", help="mislabeled | outlier | clipbkd")
        ] = "mislabeled",
        canary_seed: Annotated[int, typer.Option("--canary-seed", help="Seed of canaries and inclusion.")] = 0,
        force: ForceFlag = False,
        json_output: JsonFlag = False,
    ) -> None:
        """Train a model on a dataset split and save it as a run directory."""
        from dpaudit.data import load_dataset
        from dpaudit.models import default_spec
        from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig
        from dpaudit.training.run import summary, train_run

        fractions = parse_fractions(split)
        dp_given = noise_multiplier is not None or epsilon is not None
        private = algo.startswith("dp")
        if dp_given and not private:
            raise InputError(f"--noise-multiplier/--epsilon need a private algorithm (dpsgd, dpadam), not {algo!r}")
        dp = (
            DPConfig(
                clip=clip,
                noise_multiplier=noise_multiplier,
                target_epsilon=epsilon,
                delta=delta,
                sampling=sampling,
                accountant=accountant,
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
        perf = PerfConfig(device=device, max_physical_batch=max_physical_batch, clipping=clipping)
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
        )
        s = summary(meta)
        emit({"out": str(out), **s}, human_summary(s) + f"\nsaved      {out}", json_flag=json_output)


def register_import(app: App) -> None:
    @app.command("import")
    def import_weights(
        weights: Annotated[Path, typer.Argument(help="model.safetensors, or a .pt plain state_dict.")],
        model_spec: Annotated[
            Path, typer.Option("--model-spec", help="JSON model spec (see checkpoint.json 'model').")
        ],
        out: Annotated[Path, typer.Option("--out", "-o", help="Run directory to write.")],
        data: Annotated[str, typer.Option("--data", help="Dataset the model was trained on.")] = "digits",
        label_column: Annotated[str | None, typer.Option("--label-column")] = None,
        split_seed: Annotated[int, typer.Option("--split-seed")] = 0,
        split: Annotated[
            str, typer.Option("--split", help="Fractions members,holdout,aux,test.")
        ] = "0.35,0.2,0.25,0.2",
        preprocessing: Annotated[str, typer.Option("--preprocessing", help="standardize | identity")] = "standardize",
        force: ForceFlag = False,
        json_output: JsonFlag = False,
    ) -> None:
        """Make a run directory from foreign weights plus a model spec (no unpickling)."""
        import json

        from dpaudit.data import load_dataset
        from dpaudit.models import model_spec_from_dict
        from dpaudit.training.run import import_run, summary

        try:
            spec_dict = json.loads(model_spec.read_text())
        except FileNotFoundError:
            raise InputError(f"{model_spec}: no such file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{model_spec}: not valid JSON ({e})") from None
        ds = load_dataset(data, label_column=label_column)
        spec = model_spec_from_dict(spec_dict)
        meta = import_run(
            weights,
            spec,
            ds,
            out=out,
            split_seed=split_seed,
            fractions=parse_fractions(split),
            preprocessing=preprocessing,
            label_column=label_column,
            force=force,
        )
        s = summary(meta)
        emit({"out": str(out), **s}, human_summary(s) + f"\nsaved      {out}", json_flag=json_output)
