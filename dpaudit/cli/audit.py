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


def register(app: App) -> None:
    app.add_typer(audit_app, name="audit", help="Empirical privacy audits: epsilon lower bounds and verdicts.")
