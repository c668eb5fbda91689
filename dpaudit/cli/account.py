"""``dpaudit account``: privacy accounting of DP-SGD from the command line."""

from __future__ import annotations

import csv
import io
import math
import re
import warnings
from pathlib import Path
from typing import Annotated

import typer

from dpaudit import numfmt
from dpaudit.cli._common import DELTA_HELP, App, JsonFlag, emit, warn
from dpaudit.errors import FileContentError, InputError
from dpaudit.validation import (
    MAX_CLAIM_DELTA,
    check_claim_delta,
    check_in_interval,
    check_json_type,
    check_noise_multiplier,
    check_non_negative,
    check_positive,
    check_positive_int,
    read_json,
    read_limited,
)

account_app = App(help="Privacy accounting: epsilon of DP-SGD, noise calibration.")

GDP_HELP = "gdp (exact at sample rate 1; a CLT approximation below it)"
ACCOUNTANT_HELP = f"rdp | pld | {GDP_HELP} | all (every accountant side by side)"


def _resolve_schedule(
    sample_rate: float | None,
    steps: int | None,
    epochs: float | None,
    dataset_size: int | None,
    batch_size: int | None,
) -> tuple[float, int]:
    """(q, T) from --sample-rate/--steps or from --epochs/--dataset-size/--batch-size."""
    by_rate = sample_rate is not None or steps is not None
    by_epochs = epochs is not None or dataset_size is not None or batch_size is not None
    if by_rate and by_epochs:
        raise InputError("give either --sample-rate and --steps, or --epochs, --dataset-size and --batch-size")
    if by_epochs:
        if epochs is None or dataset_size is None or batch_size is None:
            raise InputError("--epochs needs --dataset-size and --batch-size")
        ep = check_positive(finite=True, epochs=epochs)
        n = check_positive_int(dataset_size=dataset_size)
        b = check_positive_int(batch_size=batch_size)
        if b > n:
            raise InputError(f"expected batch_size <= dataset_size, got {b} > {n}")
        # q = B/N and T = ceil(epochs * N / B), as in TF Privacy's compute_dp_sgd_privacy; exact
        # rational arithmetic so that rounding can never drop a step. The epochs are the decimal the user
        # typed (repr: the shortest decimal that reads back as the float, dpaudit.numfmt's convention), not
        # the float's binary value: Fraction(1.1) is 1.100000000000000088…, which made 1.1 epochs of 10 steps
        # 12 steps instead of 11 (and 0.1 epoch of 10 steps 2 instead of 1).
        return b / n, max(1, math.ceil(numfmt.as_typed(ep) * n / b))
    if sample_rate is None or steps is None:
        raise InputError("give --sample-rate and --steps (or --epochs, --dataset-size and --batch-size)")
    q = check_in_interval(0.0, 1.0, hi_open=False, sample_rate=sample_rate)
    return q, check_positive_int(steps=steps)


SCHEDULE_COLUMNS = ("noise_multiplier", "sample_rate", "steps")


def _phase(where: str, sigma, q, steps) -> tuple[float, float, int]:
    """One phase, checked by the rules of the single-phase options (σ must be > 0 here: a phase without noise
    makes the whole run ε = ∞, which a schedule file states by mistake, never on purpose)."""
    try:
        if isinstance(steps, str):  # a CSV cell: an integer literal is read as one, anything else refused as given
            steps = int(steps) if re.fullmatch(r"[+-]?[0-9]{1,20}", steps.strip()) else steps.strip()
        sigma = check_positive(finite=True, noise_multiplier=sigma)
        sigma = check_noise_multiplier(noise_multiplier=sigma)
        q = check_in_interval(0.0, 1.0, hi_open=False, sample_rate=q)
        return sigma, q, check_positive_int(steps=steps)
    except InputError as e:
        raise FileContentError(f"{where}: {e}") from None


def _read_schedule(path: Path) -> list[tuple[float, float, int]]:
    """The phases of a ``--schedule`` file: ``*.json``, a list of {noise_multiplier, sample_rate, steps}
    objects; anything else, a CSV whose header names those three columns. Every problem is one FileContentError
    (its names are the file's columns, printed as they are, not rewritten as options)."""
    if path.suffix.lower() == ".json":
        rows = check_json_type(read_json(path, error=FileContentError), list, str(path), error=FileContentError)
        phases = []
        for k, row in enumerate(rows, 1):
            where = f"{path}: phase {k}"
            check_json_type(row, dict, where, error=FileContentError)
            missing = [c for c in SCHEDULE_COLUMNS if c not in row]
            extra = sorted(set(row) - set(SCHEDULE_COLUMNS))
            if missing or extra:
                what = f"missing {', '.join(missing)}" if missing else f"unknown key {extra[0][:40]!r}"
                raise FileContentError(f"{where}: {what} (expected keys {', '.join(SCHEDULE_COLUMNS)})")
            sigma, q, steps = (
                check_json_type(row[c], t, f"{where}: {c}", error=FileContentError)
                for c, t in zip(SCHEDULE_COLUMNS, (float, float, int), strict=True)
            )
            phases.append(_phase(where, sigma, q, steps))
    else:
        try:
            text = read_limited(path, error=FileContentError).decode("utf-8-sig")
        except UnicodeDecodeError:
            raise FileContentError(f"{path}: not UTF-8 text") from None
        reader = csv.reader(io.StringIO(text))
        lines = [row for row in reader if any(cell.strip() for cell in row)]
        if not lines:
            expected = f"a header {','.join(SCHEDULE_COLUMNS)} and one row per phase"
            raise FileContentError(f"{path}: empty (expected {expected})")
        header = [c.strip() for c in lines[0]]
        missing = [c for c in SCHEDULE_COLUMNS if c not in header]
        extra = [c for c in header if c not in SCHEDULE_COLUMNS]
        if missing or extra or len(header) != len(SCHEDULE_COLUMNS):
            # all three present and none other, yet not three: a column named twice
            twice = next((c for c in header if header.count(c) > 1), "")
            what = (
                f"missing column {missing[0]}" if missing
                else f"unexpected column {extra[0][:40]!r}" if extra
                else f"column {twice[:40]!r} given twice"
            )  # fmt: skip
            raise FileContentError(f"{path}: {what} (expected the header {','.join(SCHEDULE_COLUMNS)})")
        phases = []
        for k, row in enumerate(lines[1:], 1):
            where = f"{path}: phase {k}"
            if len(row) != len(header):
                raise FileContentError(f"{where}: expected {len(header)} values, got {len(row)}")
            cells = dict(zip(header, (c.strip() for c in row), strict=True))
            phases.append(_phase(where, cells["noise_multiplier"], cells["sample_rate"], cells["steps"]))
    if not phases:
        raise FileContentError(f"{path}: no phases (expected one row or object per phase)")
    return phases


def _warn_large_delta(delta: float, dataset_size: int | None) -> None:
    """A warning when δ >= 1/N (N known from --dataset-size): at such a δ a mechanism that publishes one
    random record outright is (0, δ)-DP, so the claim protects little (Dwork & Roth 2014, "The Algorithmic
    Foundations of DP", §2.3, which asks δ << 1/N). ε is computed all the same: the input is valid."""
    if dataset_size is not None and delta * dataset_size >= 1:
        warn(
            f"delta = {numfmt.exact(delta)} >= 1/N = 1/{dataset_size}: at such a delta a mechanism that publishes a "
            "random record outright meets the claim (Dwork & Roth 2014, §2.3, ask delta << 1/N)"
        )


def _check_common(noise_multiplier: float | None, delta: float, jl_projections: int | None) -> None:
    if noise_multiplier is not None:
        check_non_negative(noise_multiplier=noise_multiplier)
    check_claim_delta(delta=delta)  # the rule of train and calibrate: (0, 0.1]
    if jl_projections is not None:
        check_positive_int(jl_projections=jl_projections)


def _forwarding_warnings(compute):
    """``compute()``, with the accountants' UserWarnings printed as the CLI's warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compute()
    shown: set[str] = set()  # one line per message: a schedule's phases each warn the same (the GDP CLT)
    for w in caught:
        if issubclass(w.category, UserWarning) and str(w.message) not in shown:
            shown.add(str(w.message))
            warn(str(w.message))
    return out


def _label(result) -> str:
    return f"{result.accountant}, approximate (CLT)" if result.approximate else result.accountant


SampleRate = Annotated[float | None, typer.Option("--sample-rate", help="Poisson sampling rate q in (0, 1].")]
Steps = Annotated[int | None, typer.Option("--steps", help="Number of DP-SGD steps T.")]
Delta = Annotated[
    float, typer.Option("--delta", help=f"{DELTA_HELP}, in (0, {MAX_CLAIM_DELTA:g}]: epsilon is computed at it.")
]
Jl = Annotated[int | None, typer.Option("--jl-projections", help="DP-SGD-JL with r projections (pld only).")]
Epochs = Annotated[float | None, typer.Option("--epochs", help="Epochs (with --dataset-size, --batch-size).")]
DatasetSize = Annotated[int | None, typer.Option("--dataset-size", help="Dataset size N (with --epochs).")]
BatchSize = Annotated[int | None, typer.Option("--batch-size", help="Expected batch size B (with --epochs).")]


@account_app.command("dpsgd")
def dpsgd(
    delta: Delta,
    noise_multiplier: Annotated[
        float | None, typer.Option("--noise-multiplier", help="Noise std / clipping norm.")
    ] = None,
    sample_rate: SampleRate = None,
    steps: Steps = None,
    accountant: Annotated[str, typer.Option("--accountant", help=ACCOUNTANT_HELP)] = "rdp",
    jl_projections: Jl = None,
    epochs: Epochs = None,
    dataset_size: DatasetSize = None,
    batch_size: BatchSize = None,
    schedule: Annotated[
        Path | None,
        typer.Option(
            "--schedule",
            metavar="FILE",
            help="Phases whose noise multiplier or sample rate differ (a noise or batch-size schedule, multi-phase "
            "training): FILE.csv with the header noise_multiplier,sample_rate,steps, or FILE.json, a list of "
            "{noise_multiplier, sample_rate, steps}; instead of --noise-multiplier/--sample-rate/--steps/--epochs.",
        ),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Epsilon of DP-SGD with Poisson sampling (add/remove neighbours) at the given delta."""
    from dpaudit.accounting import dpsgd_event, epsilon_with_label

    _check_common(noise_multiplier, delta, jl_projections)
    valid = ("rdp", "pld", "gdp", "all")
    if accountant not in valid:
        raise InputError(f"unknown accountant {accountant!r}; valid: {', '.join(valid)}")
    if schedule is not None:
        given = (noise_multiplier, sample_rate, steps, epochs, dataset_size, batch_size)
        if any(v is not None for v in given):
            raise InputError(
                "give either --schedule FILE, or --noise-multiplier with --sample-rate and --steps (or --epochs, "
                "--dataset-size and --batch-size)"
            )
        _dpsgd_schedule(_read_schedule(schedule), delta, accountant, jl_projections, json_output)
        return
    if noise_multiplier is None:
        raise InputError("give --noise-multiplier (or --schedule FILE)")
    q, t = _resolve_schedule(sample_rate, steps, epochs, dataset_size, batch_size)
    _warn_large_delta(delta, dataset_size)
    # σ and q are the mechanism's parameters, printed as given (dpaudit.numfmt.exact), as δ is: ε is
    # computed for exactly them, and a rounded σ or q names another mechanism (σ = 1.0000004 printed as 1
    # states the ε of σ = 1.0000004 for σ = 1, whose ε is larger).
    event = dpsgd_event(noise_multiplier=noise_multiplier, sample_rate=q, steps=t, jl_projections=jl_projections)
    data: dict = {
        "accountant": accountant,
        "delta": delta,
        "noise_multiplier": noise_multiplier,
        "sample_rate": q,
        "steps": t,
    }
    if jl_projections is not None:
        data["jl_projections"] = jl_projections
    if accountant != "all":
        r = _forwarding_warnings(lambda: epsilon_with_label(event, delta, accountant))
        data = {"epsilon": r.epsilon, **data}
        if r.approximate:
            data["approximate"] = True
        emit(
            data,
            f"epsilon = {numfmt.upper(r.epsilon)}  ({_label(r)}; delta = {numfmt.exact(delta)}, "
            f"noise_multiplier = {numfmt.exact(noise_multiplier)}, sample_rate = {numfmt.exact(q)}, steps = {t})",
            json_flag=json_output,
        )
        return
    head = (
        f"delta = {numfmt.exact(delta)}, noise_multiplier = {numfmt.exact(noise_multiplier)}, "
        f"sample_rate = {numfmt.exact(q)}, steps = {t}"
    )
    _emit_all_accountants(event, delta, data, [head], json_output)


def _emit_all_accountants(event, delta: float, data: dict, head: list[str], json_output: bool) -> None:
    """``--accountant all``: every accountant's ε (or why not) after ``head``, and the best formal one."""
    from dpaudit.accounting import compare_accountants

    compared, best = _forwarding_warnings(lambda: compare_accountants(event, delta))
    results: dict[str, dict] = {}
    lines = list(head)
    for name, r in compared.items():
        results[name] = {"epsilon": r.epsilon}
        if r.unsupported is not None:
            results[name]["error"] = r.unsupported
        if r.approximate:
            results[name]["approximate"] = True
        value = numfmt.upper(r.epsilon, missing="not computed")
        note = "  (approximate: CLT, can under-report)" if r.approximate else ""
        if r.unsupported is not None:
            note = f"  ({r.unsupported})"
        lines.append(f"  {name:4s} epsilon = {value}{note}")
    lines.append(f"  best formal epsilon = {numfmt.upper(best)}")
    emit({"epsilon": best, **data, **results}, "\n".join(lines), json_flag=json_output)


def _dpsgd_schedule(
    phases: list[tuple[float, float, int]], delta: float, accountant: str, jl_projections: int | None, json_output: bool
) -> None:
    """``account dpsgd --schedule``: ε of the composition of the phases (dpaudit.accounting.dpsgd_schedule_event)."""
    from dpaudit.accounting import dpsgd_schedule_event, epsilon_with_label

    if jl_projections is not None:
        raise InputError("--jl-projections is not supported with --schedule (give one phase's options instead)")
    event = dpsgd_schedule_event(phases)
    total = sum(t for _, _, t in phases)
    data: dict = {
        "accountant": accountant,
        "delta": delta,
        "phases": [{"noise_multiplier": s, "sample_rate": q, "steps": t} for s, q, t in phases],
        "steps": total,
    }
    # σ and q printed as given (dpaudit.numfmt.exact), as for one phase: ε is computed for exactly them.
    listing = [
        f"  phase {k}: noise_multiplier = {numfmt.exact(s)}, sample_rate = {numfmt.exact(q)}, steps = {t}"
        for k, (s, q, t) in enumerate(phases, 1)
    ]
    what = f"delta = {numfmt.exact(delta)}, {len(phases)} phase{'s' * (len(phases) != 1)}, {total} steps"
    if accountant != "all":
        r = _forwarding_warnings(lambda: epsilon_with_label(event, delta, accountant))
        data = {"epsilon": r.epsilon, **data}
        if r.approximate:
            data["approximate"] = True
        head = f"epsilon = {numfmt.upper(r.epsilon)}  ({_label(r)}; {what})"
        emit(data, "\n".join([head, *listing]), json_flag=json_output)
        return
    _emit_all_accountants(event, delta, data, [what, *listing], json_output)


@account_app.command("calibrate")
def calibrate(
    epsilon: Annotated[float, typer.Option("--epsilon", help="Target epsilon > 0.")],
    delta: Delta,
    sample_rate: SampleRate = None,
    steps: Steps = None,
    accountant: Annotated[str, typer.Option("--accountant", help=f"rdp | pld | {GDP_HELP}")] = "rdp",
    jl_projections: Jl = None,
    epochs: Epochs = None,
    dataset_size: DatasetSize = None,
    batch_size: BatchSize = None,
    json_output: JsonFlag = False,
) -> None:
    """Smallest noise multiplier whose DP-SGD epsilon is at most the target (verified)."""
    from dpaudit.accounting import calibrate_noise_multiplier, dpsgd_event, epsilon_with_label

    _check_common(None, delta, jl_projections)
    target = check_positive(finite=True, epsilon=epsilon)
    valid = ("rdp", "pld", "gdp")
    if accountant not in valid:
        raise InputError(f"unknown accountant {accountant!r}; valid: {', '.join(valid)}")
    q, t = _resolve_schedule(sample_rate, steps, epochs, dataset_size, batch_size)
    _warn_large_delta(delta, dataset_size)

    def make_event(sigma: float):
        return dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=t, jl_projections=jl_projections)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sigma = calibrate_noise_multiplier(
            target_epsilon=target, delta=delta, make_event=make_event, accountant=accountant
        )
    result = _forwarding_warnings(lambda: epsilon_with_label(make_event(sigma), delta, accountant))
    achieved = result.epsilon
    data = {
        "noise_multiplier": sigma,
        "epsilon": achieved,
        "target_epsilon": target,
        "delta": delta,
        "accountant": accountant,
        "sample_rate": q,
        "steps": t,
    }
    if result.approximate:
        data["approximate"] = True
    # Rounded up (dpaudit.numfmt): more noise than calibrated never costs privacy, and ε ≤ target shows as such.
    achieved_shown, target_shown = numfmt.ordered(achieved, target, left_up=True, left_digits=6)
    emit(
        data,
        f"noise_multiplier = {numfmt.upper(sigma)}  (epsilon = {achieved_shown} <= {target_shown} at delta = "
        f"{numfmt.exact(delta)}, "
        f"{_label(result)}, sample_rate = {numfmt.exact(q)}, steps = {t})",
        json_flag=json_output,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(account_app, name="account", help="Privacy accounting: epsilon of DP-SGD, noise calibration.")
