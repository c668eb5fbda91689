"""``dpaudit attack extract``: model extraction through a checkpoint's prediction API.

The command function lives here; :mod:`dpaudit.cli.attack` attaches it to the ``attack`` group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dpaudit.cli._common import CheckpointAlias, ForceFlag, JsonFlag, RunArgument, emit, info, progress, target_run


def _number(x: Any, fmt: str = ".3g") -> str:
    return "—" if x is None else format(x, fmt)


def human_summary(result: Any) -> str:
    """Fidelities and accuracies as percentages (the JSON keeps fractions), the curve as a table."""
    from dpaudit.report._format import rate

    d = result.to_dict()
    lines = [
        f"extraction  {d['method']} via api {d['api']}: {d['queries']} queries (budget {d['budget']}), "
        f"pool {d['params'].get('pool')}",
        f"fidelity    test {rate(d['fidelity'])}   uniform {rate(d['fidelity_uniform'])}   (agreement with the target)",
        f"accuracy    surrogate {rate(d['surrogate_accuracy'])}   target {rate(d['target_accuracy'])}   (test split)",
    ]
    if d["parameter_relative_error"] is not None:
        lines.append(
            f"parameters  relative error {d['parameter_relative_error']:.3g} (each class minus the last class: "
            "softmax parameters are identifiable only up to a shift shared by all classes)"
        )
    if len(d["curve"]) > 1:
        lines.append("curve       queries  fidelity  uniform  rel. error")
        for p in d["curve"]:
            lines.append(
                f"            {p['queries']:>7}  {rate(p['fidelity']):>8}  {rate(p['fidelity_uniform']):>7}  "
                f"{_number(p['parameter_relative_error']):>10}"
            )
    if d["params"].get("fallback"):
        lines.append(f"note        {d['params']['fallback']}")
    if d["params"].get("curve_unsolvable"):
        lines.append(
            f"            not solvable at {', '.join(map(str, d['params']['curve_unsolvable']))} queries (too few "
            "usable equations: rounded probabilities of 0 give none)"
        )
    return "\n".join(lines)


def extract(
    ctx: typer.Context,
    budget: Annotated[int, typer.Option("--budget", "-b", help="Queries the attacker may send (each input is one).")],
    run: RunArgument = None,
    api: Annotated[
        str,
        typer.Option(
            "--api", help="What the API answers: probs | rounded:K (K decimals) | labels (top-1 only) | logits."
        ),
    ] = "probs",
    method: Annotated[
        str,
        typer.Option(
            "--method",
            "-m",
            help="equations (linear models: solve log-probability ratios, exact from d+1 queries) | learning "
            "(train a surrogate on the answers, any model) | auto (equations where they apply: a logreg target, an "
            "api with scores, a budget of at least d+1, no --adaptive; else learning; with rounded:K answers (or "
            "probabilities that underflowed to 0) too few to solve, a surrogate learnt from the same answers).",
        ),
    ] = "auto",
    surrogate: Annotated[
        str, typer.Option("--surrogate", help="Surrogate architecture for --method learning: logreg | mlp | cnn.")
    ] = "mlp",
    pool: Annotated[
        str,
        typer.Option(
            "--pool",
            help="Where queries come from: aux (the attacker's records) | uniform (in the aux feature box) | "
            "synthetic (a Gaussian fitted to aux).",
        ),
    ] = "synthetic",
    adaptive: Annotated[
        bool,
        typer.Option("--adaptive", help="Learning: query in rounds where the current surrogate is least certain."),
    ] = False,
    curve_points: Annotated[
        int,
        typer.Option("--curve-points", help="Points of the fidelity-vs-queries curve (refits on query prefixes)."),
    ] = 4,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Save the extracted model as a run directory (attackable in turn)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the queries and the surrogate's training.")] = 0,
    force: ForceFlag = False,
    json_output: JsonFlag = False,
    checkpoint: CheckpointAlias = None,
) -> None:
    """Model extraction: steal the model of a run through its prediction API under a query budget.

    JSON: checkpoint, out, attack, params, method, api, budget, queries, parameter_relative_error (linear
    models, else null), fidelity (agreement on test inputs), fidelity_uniform, surrogate_accuracy,
    target_accuracy, curve (a list of {queries, fidelity, fidelity_uniform, surrogate_accuracy,
    parameter_relative_error}, and n_equations for equation solving, which leaves out the query counts it
    cannot solve, listed in params.curve_unsolvable).
    """
    from attacks.extraction import extract_checkpoint
    from dpaudit.cli._common import given_options
    from dpaudit.errors import InputError

    if method == "equations" and "surrogate" in given_options(ctx):  # was exit 0, the surrogate never trained
        raise InputError("--surrogate applies to --method learning (or auto's fallback); equations train no surrogate")
    run = target_run(run, checkpoint)
    extraction = extract_checkpoint(
        run, budget=budget, api=api, method=method, surrogate=surrogate, pool=pool, adaptive=adaptive,
        curve_points=curve_points, out=out, seed=seed, force=force, progress=progress(json_output), notify=info,
    )  # fmt: skip
    data = {"checkpoint": str(run), "out": None if out is None else str(out), **extraction.result.to_dict()}
    emit(data, human_summary(extraction.result), json_flag=json_output)
