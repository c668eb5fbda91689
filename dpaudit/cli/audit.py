"""``dpaudit audit``: ε lower bounds from attack scores, and a self-test of the auditor."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

from dpaudit.cli._common import App, JsonFlag, emit, json_mode, progress
from dpaudit.errors import EXIT_VIOLATION, InputError

if TYPE_CHECKING:
    from dpaudit.audit.result import AuditResult

audit_app = App(help="Empirical privacy audits: epsilon lower bounds from scores, verdicts on claims.")

# ---- options shared by the audit commands ---------------------------------------------------------

DeltaOpt = Annotated[float, typer.Option("--delta", help="delta at which epsilon is bounded.")]
ConfidenceOpt = Annotated[float, typer.Option("--confidence", help="Confidence level of the lower bound.")]
MethodOpt = Annotated[
    str,
    typer.Option(
        "--method",
        help="clopper-pearson (formal), gdp (estimate, assumes mu-GDP) or one-run "
        "(formal; canaries included w.p. 1/2).",
    ),
]
ClaimedOpt = Annotated[
    float | None, typer.Option("--claimed-epsilon", help="Claimed epsilon at --delta; gives a verdict.")
]
SelectionOpt = Annotated[
    str,
    typer.Option(
        "--threshold-selection",
        help="holdout (choose on half, evaluate on the other) or bonferroni (search all data, corrected).",
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the holdout split and tie-breaking.")]
FailOnViolationOpt = Annotated[
    bool, typer.Option("--fail-on-violation", help="Exit with code 1 when the verdict is 'violation'.")
]


def load_scores_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read ``member`` (0/1) and ``score`` columns from a CSV file or arrays from an NPZ file."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if path.suffix.lower() == ".npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                missing = [k for k in ("member", "score") if k not in npz.files]
                if missing:
                    raise InputError(
                        f"{path}: missing array(s) {', '.join(missing)}; found {', '.join(npz.files) or 'none'}"
                    )
                member, score = npz["member"], npz["score"]
        except InputError:
            raise
        except Exception as e:  # not a zip, object arrays (pickles refused), truncated file, ...
            raise InputError(f"{path}: not a readable NPZ file ({type(e).__name__}: {e})") from None
        return _numeric(path, "member", member), _numeric(path, "score", score)
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except Exception as e:
        raise InputError(f"{path}: not a readable CSV file ({type(e).__name__}: {e})") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in ("member", "score") if c not in df.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(df.columns) or 'none'}")
    return _numeric(path, "member", df["member"].to_numpy()), _numeric(path, "score", df["score"].to_numpy())


def _numeric(path: Path, name: str, values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim != 1:
        raise InputError(f"{path}: {name} must be one-dimensional, got shape {values.shape}")
    if values.dtype == bool:
        return values
    try:
        return values.astype(float)
    except (TypeError, ValueError):
        pass
    for i, v in enumerate(values):
        try:
            float(v)
        except (TypeError, ValueError):
            raise InputError(f"{path}: non-numeric {name} {v!r} in row {i + 1}") from None
    raise InputError(f"{path}: {name} is not numeric")


def describe(result: AuditResult) -> str:
    """Human summary of an audit with a warning line for estimates and too-small designs."""
    lines = [result.summary()]
    if not result.formal:
        lines.append("warning: this is an estimate, not a formal lower bound (see the notes above)")
    if result.design_too_small:
        lines.append(
            f"warning: the design is too small to refute the claim: at most epsilon = "
            f"{result.max_certifiable_epsilon:.3g} could be certified"
        )
    return "\n".join(lines)


def emit_audit(result: AuditResult, *, json_flag: bool, fail_on_violation: bool) -> None:
    """Print an audit result (JSON or human) and exit 1 on a violation when asked to."""
    emit(result.to_dict(), describe(result), json_flag=json_flag)
    if fail_on_violation and result.verdict == "violation":
        raise typer.Exit(EXIT_VIOLATION)


# ---- commands -----------------------------------------------------------------------------------


@audit_app.command("scores")
def scores_cmd(
    file: Annotated[Path, typer.Argument(help="CSV with columns member (0/1) and score (higher = member), or NPZ.")],
    delta: DeltaOpt = 1e-5,
    confidence: ConfidenceOpt = 0.95,
    method: MethodOpt = "clopper-pearson",
    claimed_epsilon: ClaimedOpt = None,
    threshold_selection: SelectionOpt = "holdout",
    seed: SeedOpt = 0,
    fail_on_violation: FailOnViolationOpt = False,
    json_output: JsonFlag = False,
) -> None:
    """Lower-bound epsilon from membership scores and compare it with a claimed epsilon."""
    from dpaudit.audit import audit_scores

    member, score = load_scores_file(file)
    result = audit_scores(
        score,
        member,
        method=method,
        delta=delta,
        confidence=confidence,
        claimed_epsilon=claimed_epsilon,
        threshold_selection=threshold_selection,
        seed=seed,
    )
    emit_audit(result, json_flag=json_output, fail_on_violation=fail_on_violation)


@audit_app.command("selftest")
def selftest_cmd(
    seeds: Annotated[int, typer.Option("--seeds", help="Independent repetitions per mechanism.")] = 50,
    trials: Annotated[int, typer.Option("--trials", help="Runs with and without the canary, per seed.")] = 2000,
    confidence: ConfidenceOpt = 0.95,
    method: Annotated[str, typer.Option("--method", help="clopper-pearson or gdp.")] = "clopper-pearson",
    json_output: JsonFlag = False,
) -> None:
    """Check the auditor: false alarms on correct mechanisms, detection of planted bugs (exit 1 on failure)."""
    from dpaudit.audit.selftest import run_selftest
    from dpaudit.validation import check_choice

    check_choice(("clopper-pearson", "gdp"), method=method)
    report = run_selftest(
        seeds=seeds, trials=trials, confidence=confidence, method=method, progress=progress(json_output)
    )
    emit(report.to_dict(), report.table(), json_flag=json_output)
    if not report.passed:
        if not json_mode(json_output):
            typer.echo("self-test FAILED", err=True)
        raise typer.Exit(EXIT_VIOLATION)


def _emit_workflow(result: dict, *, json_flag: bool, fail_on_violation: bool) -> None:
    from dpaudit.audit.result import AuditResult

    audit = AuditResult(**{**result["audit"], "notes": tuple(result["audit"]["notes"])})
    payload = {**result["audit"], **{k: v for k, v in result.items() if k != "audit"}}
    emit(payload, f"source: {result['source']}\n" + describe(audit), json_flag=json_flag)
    if fail_on_violation and audit.verdict == "violation":
        raise typer.Exit(EXIT_VIOLATION)


@audit_app.command("checkpoint")
def checkpoint_cmd(
    run: Annotated[Path, typer.Argument(help="Run directory written by `dpaudit train`.")],
    delta: Annotated[float | None, typer.Option("--delta", help="delta (default: the claim's, else 1e-5).")] = None,
    confidence: ConfidenceOpt = 0.95,
    method: Annotated[
        str | None,
        typer.Option("--method", help="one-run (default with canaries) | clopper-pearson (default) | gdp."),
    ] = None,
    attack: Annotated[
        str, typer.Option("--attack", help="Attack without canaries: loss | lira | shadow | ...")
    ] = "loss",
    claimed_epsilon: Annotated[
        float | None, typer.Option("--claimed-epsilon", help="Claimed epsilon (default: the checkpoint's claim).")
    ] = None,
    reference_models: Annotated[int, typer.Option("--reference-models", help="For --attack lira.")] = 8,
    workers: Annotated[int, typer.Option("--workers", help="Parallel reference-model training.")] = 1,
    seed: SeedOpt = 0,
    fail_on_violation: FailOnViolationOpt = False,
    json_output: JsonFlag = False,
) -> None:
    """Audit a checkpoint: a formal one-run audit of its canaries, or an attack-based estimate without them."""
    from dpaudit.auditing import audit_checkpoint

    result = audit_checkpoint(
        run,
        method=method,
        attack=attack,
        delta=delta,
        confidence=confidence,
        claimed_epsilon=claimed_epsilon,
        reference_models=reference_models,
        workers=workers,
        seed=seed,
        progress=progress(json_output),
    )
    _emit_workflow(result, json_flag=json_output, fail_on_violation=fail_on_violation)


@audit_app.command("train")
def train_cmd(
    runs: Annotated[int, typer.Option("--runs", help="Models trained with the canary (and as many without).")] = 100,
    threat_model: Annotated[str, typer.Option("--threat-model", help="black-box | white-box.")] = "black-box",
    canary_kind: Annotated[
        str, typer.Option("--canary-kind", help="Black-box canary: clipbkd | mislabeled | outlier.")
    ] = "clipbkd",
    data: Annotated[str, typer.Option("--data", help="Dataset (as for dpaudit train).")] = "digits",
    label_column: Annotated[str | None, typer.Option("--label-column")] = None,
    model: Annotated[str, typer.Option("--model", help="logreg | mlp | cnn | rnn")] = "logreg",
    train_size: Annotated[int | None, typer.Option("--train-size", help="Train on a subset of the members.")] = None,
    algo: Annotated[str, typer.Option("--algo", help="sgd | adam | dpsgd | dpadam")] = "dpsgd",
    epochs: Annotated[int, typer.Option("--epochs")] = 5,
    steps: Annotated[int | None, typer.Option("--steps")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 64,
    lr: Annotated[float, typer.Option("--lr")] = 1.0,
    noise_multiplier: Annotated[float | None, typer.Option("--noise-multiplier")] = None,
    epsilon: Annotated[float | None, typer.Option("--epsilon", help="Target epsilon (calibrates sigma).")] = None,
    clip: Annotated[float, typer.Option("--clip")] = 1.0,
    train_delta: Annotated[float, typer.Option("--train-delta", help="delta of the training claim.")] = 1e-5,
    delta: Annotated[float | None, typer.Option("--delta", help="delta of the audit (default: the claim's).")] = None,
    confidence: ConfidenceOpt = 0.95,
    method: Annotated[str, typer.Option("--method", help="clopper-pearson | gdp.")] = "clopper-pearson",
    claimed_epsilon: Annotated[
        float | None, typer.Option("--claimed-epsilon", help="Claimed epsilon (default: the recipe's claim).")
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help="Parallel training processes.")] = 1,
    seed: SeedOpt = 0,
    fail_on_violation: FailOnViolationOpt = False,
    json_output: JsonFlag = False,
) -> None:
    """Multi-run audit: train R models with and R without a canary, bound epsilon from their scores."""
    from dpaudit.auditing import audit_training
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import DPConfig, TrainConfig
    from dpaudit.validation import check_choice

    check_choice(("clopper-pearson", "gdp"), method=method)
    dp = None
    if algo.startswith("dp"):
        dp = DPConfig(clip=clip, noise_multiplier=noise_multiplier, target_epsilon=epsilon, delta=train_delta)
    elif noise_multiplier is not None or epsilon is not None:
        raise InputError(f"--noise-multiplier/--epsilon need a private algorithm (dpsgd, dpadam), not {algo!r}")
    config = TrainConfig(algo=algo, epochs=epochs, steps=steps, batch_size=batch_size, lr=lr, seed=seed, dp=dp)
    ds = load_dataset(data, label_column=label_column)
    spec = default_spec(model, input_shape=ds.feature_shape, n_classes=ds.n_classes, vocab_size=ds.vocab_size)
    result = audit_training(
        ds,
        spec,
        config,
        runs=runs,
        train_size=train_size,
        threat_model=threat_model,
        canary_kind=canary_kind,
        method=method,
        delta=delta,
        confidence=confidence,
        claimed_epsilon=claimed_epsilon,
        seed=seed,
        workers=workers,
        progress=progress(json_output),
    )
    _emit_workflow(result, json_flag=json_output, fail_on_violation=fail_on_violation)


def register(app: App) -> None:
    app.add_typer(audit_app, name="audit", help="Empirical privacy audits: epsilon lower bounds and verdicts.")
