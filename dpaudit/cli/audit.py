"""``dpaudit audit``: ε lower bounds from attack scores, and a self-test of the auditor."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dpaudit import numfmt
from dpaudit.cli._common import (
    CACHE_DIR_HELP,
    CHECKPOINT_SEED_HELP,
    DATA,
    DELTA_HELP,
    DP,
    JSON_ONLY,
    RECIPE,
    App,
    JsonFlag,
    deprecated_alias,
    emit,
    given_options,
    json_mode,
    opt,
    options,
    progress,
)
from dpaudit.defaults import DEFAULTS, MAX_SIMULATED_SIZE
from dpaudit.errors import EXIT_VIOLATION, InputError
from dpaudit.plugins import PLUGIN_SCORE_HELP

if TYPE_CHECKING:
    from dpaudit.audit.result import AuditResult

audit_app = App(help="Empirical privacy audits: epsilon lower bounds from scores, verdicts on claims.")

# ---- options shared by the audit commands ---------------------------------------------------------

DeltaOpt = Annotated[float, typer.Option("--delta", help=f"{DELTA_HELP} being tested (epsilon is bounded at it).")]
ConfidenceOpt = Annotated[float, typer.Option("--confidence", help="Confidence level of the lower bound.")]
# The default --design of `audit scores`. The --method help says on which design each method is formal, as
# dpaudit.audit.result.is_formal decides (literal text: the help imports no scipy; a test checks the two agree).
DEFAULT_DESIGN = "membership"
MethodOpt = Annotated[
    str,
    typer.Option(
        "--method",
        help="clopper-pearson (formal only on design multi-run, an estimate on every other design), gdp (assumes "
        "mu-GDP; an estimate on every design), one-run (canaries included w.p. 1/2; formal only on design "
        "canaries, an estimate on every other design) or one-run-fdp (the one-run design against a trade-off "
        "curve; formal only on design canaries, an estimate on every other design, and its epsilon only with "
        f"--tradeoff epsilon-delta). On the default --design {DEFAULT_DESIGN} every method gives an estimate.",
    ),
]
PlanMethodOpt = Annotated[
    str,
    typer.Option(
        "--method",
        help="The audit planned: clopper-pearson or gdp (runs per side of a multi-run design), one-run or "
        "one-run-fdp (canaries).",
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
FAIL_ON_VIOLATION_HELP = (
    "Exit with code 1 on a formal refutation: verdict 'violation' (a formal epsilon lower bound above the claim) or "
    "'curve-refuted' (the claimed trade-off curve refuted)."
)
FailOnViolationOpt = Annotated[bool, typer.Option("--fail-on-violation", help=FAIL_ON_VIOLATION_HELP)]


def describe(result: AuditResult) -> str:
    """Human summary of an audit with a warning line for estimates and too-small designs."""
    lines = [result.summary()]
    if not result.formal:
        lines.append("warning: this is an estimate, not a formal lower bound (see the notes above)")
    if result.verdict == "estimate-exceeds-claim":
        lines.append(
            "warning: the estimate exceeds the claim; not a formal violation (exit 0 unless --fail-on-estimate)"
        )
    if result.design_too_small:
        # as the summary above prints it, beside the one printed claim (numfmt.against): upper(m, 3) read "at most
        # epsilon = 2.01 could be certified" under "claimed epsilon: 2.00995", a design that seemed large enough
        most = numfmt.against(
            result.claimed_epsilon, [result.epsilon_lower_bound], [result.max_certifiable_epsilon], digits=4
        )[2][0]
        lines.append(
            f"warning: the design is too small to refute the claim: at most epsilon = {most} could be certified"
        )
    return "\n".join(lines)


def emit_audit(
    result: AuditResult, *, json_flag: bool, fail_on_violation: bool, fail_on_estimate: bool = False
) -> None:
    """Print an audit result (JSON or human); exit 1 when asked to.

    ``fail_on_violation``: exit 1 on a formal refutation only ("violation" or "curve-refuted"; see
    :data:`dpaudit.audit.result.FORMAL_REFUTATIONS`), exit 2 when the verdict is "inconclusive" (see
    :data:`dpaudit.audit.result.CANNOT_REFUTE`). ``fail_on_estimate`` (opt-in): also exit 1 on
    "estimate-exceeds-claim", an estimate above the claim (evidence, not proof).
    """
    from dpaudit.audit.result import CANNOT_REFUTE, tests_formally

    emit(result.to_dict(), describe(result), json_flag=json_flag)
    _exit_code(
        [result.verdict], fail_on_violation=fail_on_violation, fail_on_estimate=fail_on_estimate,
        cannot_refute=result.verdict in CANNOT_REFUTE, formal=tests_formally(result),
    )  # fmt: skip


# ---- commands -----------------------------------------------------------------------------------


@audit_app.command("scores")
def scores_cmd(
    file: Annotated[
        Path,
        typer.Argument(
            help="CSV with columns member (0/1) and score (higher = member), or NPZ or JSON with those names."
        ),
    ],
    delta: DeltaOpt = 1e-5,
    confidence: ConfidenceOpt = 0.95,
    method: MethodOpt = "clopper-pearson",
    claimed_epsilon: ClaimedOpt = None,
    threshold_selection: SelectionOpt = "holdout",
    seed: SeedOpt = 0,
    design: Annotated[
        str,
        typer.Option(
            "--design",
            help="How the member bits were produced: membership (members/non-members of one model; default), "
            "canaries (canaries of one run, each included w.p. 1/2) or multi-run (one score per independent "
            "run on D or D'). Only multi-run with clopper-pearson and canaries with one-run or one-run-fdp "
            "(--tradeoff epsilon-delta) give a formal epsilon lower bound; everything else is an estimate.",
        ),
    ] = DEFAULT_DESIGN,
    two_sided: Annotated[
        bool,
        typer.Option(
            "--two-sided", help="Score direction unknown: audit both directions at alpha/2 each, report the larger."
        ),
    ] = False,
    tradeoff: Annotated[
        str | None,
        typer.Option(
            "--tradeoff",
            help="one-run-fdp: the hypothesised curves: epsilon-delta (formal epsilon lower bound), gdp (mu-GDP; "
            "epsilon is an estimate) or dpsgd:Q,T (DP-SGD's curves at Poisson rate Q and T steps, the noise "
            "multiplier varied; the refutation of the claimed curve is formal, its epsilon an estimate). "
            "Default: epsilon-delta.",
        ),
    ] = None,
    trust_design: Annotated[
        bool,
        typer.Option(
            "--trust-design",
            help="Audit a file written by `attack mia` (one model's members vs holdout) under --design multi-run "
            "or canaries anyway: you vouch that its scores were produced that way; the result says the design "
            "was declared by you, not checked.",
        ),
    ] = False,
    fail_on_violation: FailOnViolationOpt = False,
    fail_on_estimate: Annotated[
        bool,
        typer.Option(
            "--fail-on-estimate",
            help="Exit with code 1 when an estimate exceeds the claim, as on a formal refutation (opt-in).",
        ),
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Lower-bound epsilon from membership scores and compare it with a claimed epsilon."""
    from dpaudit.workflows.scores import audit_score_file

    result = audit_score_file(
        file,
        trust_design=trust_design,
        method=method,
        delta=delta,
        confidence=confidence,
        claimed_epsilon=claimed_epsilon,
        threshold_selection=threshold_selection,
        seed=seed,
        design=design,
        alternative="two-sided" if two_sided else "greater",
        tradeoff=parse_tradeoff(tradeoff, method),
    )
    emit_audit(result, json_flag=json_output, fail_on_violation=fail_on_violation, fail_on_estimate=fail_on_estimate)


def parse_tradeoff(text: str | None, method: str):
    """--tradeoff: "epsilon-delta" (the default, None), "gdp" or "dpsgd:Q,T" (a
    :class:`~dpaudit.audit.fdp_one_run.TradeoffFamily`); only --method one-run-fdp reads it."""
    if text is None:
        return "epsilon-delta"
    if method != "one-run-fdp":  # it was ignored: the audit the user asked for is not the one that ran
        raise InputError(f"--tradeoff applies to --method one-run-fdp only, not --method {method}")
    if not text.startswith("dpsgd:"):
        return text  # validated by audit_scores
    from dpaudit.audit.fdp_one_run import dpsgd_family
    from dpaudit.validation import check_in_interval, check_positive_int

    try:
        q_text, t_text = text.removeprefix("dpsgd:").split(",")
        q, steps = float(q_text), int(t_text)
    except ValueError:
        raise InputError(f"expected --tradeoff dpsgd:Q,T (e.g. dpsgd:0.01,1000), got {text!r}") from None
    try:  # Q and T are parts of --tradeoff, not options of their own: the message says where they came from
        return dpsgd_family(check_in_interval(0.0, 1.0, hi_open=False, sample_rate=q), check_positive_int(steps=steps))
    except InputError as e:
        raise InputError(f"--tradeoff {text}: {e}") from None


@audit_app.command("selftest")
def selftest_cmd(
    seeds: Annotated[int, typer.Option("--seeds", help="Independent repetitions per mechanism.")] = 50,
    trials: Annotated[int, typer.Option("--trials", help="Runs with and without the canary, per seed.")] = 2000,
    confidence: ConfidenceOpt = 0.95,
    method: Annotated[str, typer.Option("--method", help="clopper-pearson or gdp.")] = "clopper-pearson",
    json_output: JsonFlag = False,
) -> None:
    """Check the auditor: false alarms on correct mechanisms, detection of planted bugs (exit 1 on failure).

    JSON: rows, seeds, trials, confidence, delta, method, threshold_selection, false_alarm_rate, bugs_caught,
    bugs_planted, mutation_score, passed, runtime_s (wall-clock seconds: the one field that differs between two
    runs with the same settings).
    """
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


@audit_app.command("plan")
def plan_cmd(
    target_epsilon: Annotated[  # plan_design's name, so that its messages name --epsilon
        float,
        typer.Option("--epsilon", "--claimed-epsilon", help="The claimed epsilon the audit must be able to refute."),
    ],
    delta: DeltaOpt = 1e-5,
    confidence: ConfidenceOpt = 0.95,
    method: PlanMethodOpt = "clopper-pearson",
    threshold_selection: SelectionOpt = "holdout",
    two_sided: Annotated[
        bool, typer.Option("--two-sided", help="Plan a two-sided audit (alpha/2 per direction).")
    ] = False,
    true_epsilon: Annotated[
        float | None,
        typer.Option("--true-epsilon", help="Hypothesised leak: the mechanism's true epsilon (default: 2x --epsilon)."),
    ] = None,
    mu: Annotated[float | None, typer.Option("--mu", help="Hypothesised leak as mu (gaussian family).")] = None,
    family: Annotated[
        str | None,
        typer.Option(
            "--family",
            help="Leak family: gaussian (mu-GDP scores) or randomized-response (exactly (eps, 0)-DP; the default "
            "without --mu: the most detectable leak of its epsilon).",
        ),
    ] = None,
    power: Annotated[float, typer.Option("--power", help="Probability of refuting the claim to plan for.")] = 0.8,
    simulations: Annotated[int, typer.Option("--simulations", help="Simulated audits per design size.")] = 200,
    tradeoff: Annotated[
        str | None,
        typer.Option(
            "--tradeoff",
            help="one-run-fdp: the trade-off family audited (as for audit scores; default: epsilon-delta).",
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of the simulated audits (their scores, holdout splits, tie-breaking).")
    ] = 0,
    tests: Annotated[
        int,
        typer.Option(
            "--tests",
            help="Formal tests sharing --confidence (Bonferroni: each planned at 1 - alpha/TESTS). `audit checkpoint` "
            "runs 2 per canary set on a DP-SGD claim (one-run and its f-DP analysis): give 2, or 4 with white-box "
            "canaries too.",
        ),
    ] = 1,
    max_size: Annotated[
        int,
        typer.Option(
            "--max-size",
            help="Largest design searched, in runs per side (one-run methods: canaries). No size up to it "
            "reaching --power is an error naming what the simulation at it showed; a smaller cap answers sooner.",
        ),
    ] = MAX_SIMULATED_SIZE,
    json_output: JsonFlag = False,
) -> None:
    """Runs per side (one-run methods: canaries) needed to refute --epsilon with --power, by simulating the audit.

    The simulated audits face a hypothesised leak; the perfect-attack minimum is shown beside. A size counts only
    when the lower end of its power's Clopper-Pearson interval (at --confidence) reaches --power, never on the
    estimate alone."""
    from dpaudit.audit import plan_design

    plan = plan_design(
        target_epsilon, delta=delta, confidence=confidence, method=method, threshold_selection=threshold_selection,
        alternative="two-sided" if two_sided else "greater", true_epsilon=true_epsilon, mu=mu, family=family,
        power=power, simulations=simulations, tradeoff=parse_tradeoff(tradeoff, method), seed=seed, tests=tests,
        max_size=max_size,
    )  # fmt: skip
    emit(plan.to_dict(), plan.summary(), json_flag=json_output)


def _exit_code(
    verdicts,
    *,
    fail_on_violation: bool,
    fail_on_estimate: bool,
    cannot_refute: bool = False,
    formal: bool = True,
    formal_advice: str = (
        "audit a formal design (independent runs: `dpaudit audit train`, `audit scores --design multi-run`; "
        "canaries included w.p. 1/2)"
    ),
    has_fail_on_estimate: bool = True,
) -> None:
    """Exit 1 on a formal refutation (with --fail-on-violation: a formal epsilon bound above the claim, or the
    claimed curve refuted; also with --fail-on-estimate, the stricter gate) or, opted in, on an estimate above the
    claim. With --fail-on-estimate, exit 2 when every verdict is "inconclusive" (neither a formal bound nor an
    estimate could exceed the claim: the stricter gate fails where --fail-on-violation does). With
    --fail-on-violation, exit 2 when
    ``cannot_refute``: the verdict is "inconclusive" (:data:`dpaudit.audit.result.CANNOT_REFUTE`), a gate that
    could not fail; when no claim was tested at all (every verdict None: no --claimed-epsilon, a run without a
    claim); and, without --fail-on-estimate, when not ``formal``: no verdict comes from a formal test
    (:func:`dpaudit.audit.result.tests_formally`), so every one is an estimate and exit 1 was impossible
    (``formal_advice``: how this command gets a formal test; ``has_fail_on_estimate``: whether the command offers
    --fail-on-estimate; both named in that message)."""
    from dpaudit.audit.result import CANNOT_REFUTE, ESTIMATE_REFUTATIONS, FORMAL_REFUTATIONS

    verdicts = set(verdicts)
    if (fail_on_violation or fail_on_estimate) and verdicts <= {None}:  # no claim was tested: nothing can fail
        flag = "--fail-on-violation" if fail_on_violation else "--fail-on-estimate"
        raise InputError(
            f"{flag}: no claim was tested, so the gate fails instead of passing; give --claimed-epsilon (or audit a "
            "run that records a privacy claim)"
        )
    if fail_on_violation and not fail_on_estimate and not formal:
        raise InputError(
            "--fail-on-violation: every result here is an estimate, not a formal test, so this gate could never "
            f"fail and it fails instead of passing; {formal_advice}"
            + (" or add --fail-on-estimate to gate on the estimate" if has_fail_on_estimate else "")
        )
    # Nor may the stricter gate pass where --fail-on-violation fails: every verdict inconclusive, no bound (formal or
    # estimate) could exceed the claim (--fail-on-estimate alone exited 0 there)
    violation_gate = fail_on_violation and cannot_refute and not verdicts & set(FORMAL_REFUTATIONS)
    if violation_gate or (fail_on_estimate and verdicts - {None} <= set(CANNOT_REFUTE)):
        flag = "--fail-on-violation" if violation_gate else "--fail-on-estimate"
        raise InputError(
            f"{flag}: verdict inconclusive: this design cannot refute the claim whatever the mechanism "
            "does, so the gate fails instead of passing; use more runs or canaries (`dpaudit audit plan`)"
        )
    # --fail-on-estimate is the stricter gate: it fails on the weaker evidence, so on the formal refutation too
    # (alone it passed a formal violation: exit 0 on "violation", exit 1 on "estimate-exceeds-claim")
    if ((fail_on_violation or fail_on_estimate) and verdicts & set(FORMAL_REFUTATIONS)) or (
        fail_on_estimate and verdicts & set(ESTIMATE_REFUTATIONS)
    ):
        raise typer.Exit(EXIT_VIOLATION)


FailOnEstimateOpt = Annotated[
    bool,
    typer.Option(
        "--fail-on-estimate",
        help="Exit with code 1 when an estimate (not a formal bound) exceeds the claim, as on a formal refutation.",
    ),
]
# The same two flags as option-group entries (for the commands declared with ``options``).
FAIL_ON_VIOLATION = opt("fail_on_violation", bool, False, help=FAIL_ON_VIOLATION_HELP)
FAIL_ON_ESTIMATE = opt(
    "fail_on_estimate",
    bool,
    False,
    help="Exit with code 1 when an estimate (not a formal bound) exceeds the claim, as on a formal refutation.",
)


@audit_app.command("checkpoint")
def checkpoint_cmd(
    ctx: typer.Context,
    run: Annotated[
        Path, typer.Argument(metavar="RUN", help="Run directory written by `dpaudit train` or `dpaudit import`.")
    ],
    delta: Annotated[
        float | None, typer.Option("--delta", help=f"{DELTA_HELP} being tested (default: the run's claim, else 1e-5).")
    ] = None,
    confidence: ConfidenceOpt = DEFAULTS.confidence,
    attacks: Annotated[
        str,
        typer.Option(
            "--attacks",
            "--attack",
            help="Membership attacks for the estimates, comma-separated (loss, lira, shadow, ...; 'none' for "
            "a canary-only audit).",
        ),
    ] = ",".join(DEFAULTS.attacks),
    estimate_method: Annotated[
        str, typer.Option("--estimate-method", help="clopper-pearson | gdp, for the attacks' estimates.")
    ] = DEFAULTS.estimate_method,
    claimed_epsilon: Annotated[
        float | None, typer.Option("--claimed-epsilon", help="Claimed epsilon (default: the checkpoint's claim).")
    ] = None,
    reference_models: Annotated[
        int, typer.Option("--reference-models", help="For --attacks lira.")
    ] = DEFAULTS.reference_models,
    workers: Annotated[int, typer.Option("--workers", help="Parallel reference-model training.")] = 1,
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir", help=CACHE_DIR_HELP)] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Train reference models in a temporary directory, deleted afterwards.")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help=CHECKPOINT_SEED_HELP)] = DEFAULTS.seed,
    fail_on_violation: FailOnViolationOpt = False,
    fail_on_estimate: FailOnEstimateOpt = False,
    json_output: JsonFlag = False,
) -> None:
    """Audit a checkpoint: a formal one-run audit of its canaries, and membership-attack estimates beside it.

    The same workflow (and defaults) as `dpaudit report` and `dpaudit demo`: one checkpoint, one answer.
    """
    from attacks.mia import check_options_read
    from dpaudit.cache import cache_for
    from dpaudit.validation import check_choice
    from dpaudit.workflows import audit_checkpoint, membership_attacks

    check_choice(("clopper-pearson", "gdp"), estimate_method=estimate_method)
    methods = membership_attacks(attacks)
    check_options_read(methods, given_options(ctx))  # e.g. --reference-models with --attacks loss: refused
    with cache_for(cache_dir, no_cache=no_cache) as cache_dir:
        result = audit_checkpoint(
            run,
            attacks=methods,
            estimate_method=estimate_method,
            delta=delta,
            confidence=confidence,
            claimed_epsilon=claimed_epsilon,
            reference_models=reference_models,
            workers=workers,
            cache_dir=cache_dir,
            seed=seed,
            progress=progress(json_output),
        )
    from dpaudit.audit.result import tests_formally

    emit(result.to_dict(), result.summary(), json_flag=json_output)
    verdicts = [a.result.verdict for a in result.audits]
    advice = {}
    if (
        result.meta.get("training", {}).get("algo") == "imported"
    ):  # trained elsewhere: `dpaudit train --canaries` is no way
        advice["formal_advice"] = (
            f"a run trained elsewhere gets a formal audit from canaries in that training: gradient canaries in your "
            f"own loop (`dpaudit audit canaries DIR --run {run} --fail-on-violation`, docs/own-training-loop.md), or "
            "records from `dpaudit canaries make` added to its training set (`dpaudit import --canaries DIR`);"
        )
    _exit_code(
        verdicts, fail_on_violation=fail_on_violation, fail_on_estimate=fail_on_estimate,
        cannot_refute=result.cannot_refute, formal=any(tests_formally(a.result) for a in result.audits), **advice,
    )  # fmt: skip


AUDIT_TRAIN_DESIGN = (
    opt("runs", int, 100, help="Models trained with the canary (and as many without)."),
    opt(
        "threat_model",
        str,
        "black-box",
        help="black-box | white-box (multi-run) | white-box-steps (ONE run, a Dirac canary offered at each step "
        "w.p. 1/2: a formal per-step bound and a composed estimate; Nasr et al. 2023; --runs is not used).",
    ),
    opt(
        "canary_kind",
        str | None,
        None,
        help="Black-box canary: clipbkd | mislabeled | outlier | crafted (built from the public aux split "
        "for the final-model threat model). Default: clipbkd; mislabeled for token data.",
    ),
    opt(
        "init",
        str,
        "random",
        help="random (each run's own seed) | adversarial (every run starts from one fixed model pre-trained "
        "on the public aux split; DP-SGD's claim holds for any fixed start).",
    ),
    opt(
        "allow_inconclusive",
        bool,
        False,
        help="Run even when --runs is too few to refute the claim (otherwise refused with exit 2).",
    ),
)
AUDIT_TRAIN_PIPELINE = (
    *DATA,
    opt("model", str, "logreg", help="logreg | mlp | cnn | rnn"),
    opt(
        "model_spec",
        Path | None,
        None,
        help='JSON model spec, as dpaudit.models.ModelSpec.to_dict() writes it ({"kind": "logreg", "input_shape": '
        '[1, 8, 8], "n_classes": 10}), or your own module {"kind": "python", "factory": "pkg.mod:fn", ...} '
        "(docs/model-spec.md); default: --model's default spec for the data.",
    ),
    opt(
        "trainer",
        str | None,
        None,
        help="Your own training function, 'package.module:function' (imported from the current directory too): "
        "function(X, y, seed) -> state dict of the --model-spec model. Needs --claimed-epsilon and --delta; "
        "dpaudit's trainer options (--algo, --lr, ...) do not apply. Its module is imported and run: "
        "give only your own code.",
    ),
    opt(
        "neighbouring",
        str | None,
        None,
        help="With --trainer: the neighbouring relation of your claim, add_remove (default; canary added or not) "
        "or replace_one (canary swapped for a record). dpaudit's own trainer follows its sampling.",
    ),
    opt(
        "score",
        list[str] | None,
        None,
        help="With --trainer; repeatable (Bonferroni over the scores; default margin). " + PLUGIN_SCORE_HELP,
    ),
    opt("train_size", int | None, None, help="Train on a subset of the members."),
    opt("algo", str, "dpsgd", help="sgd | adam | dpsgd | dpadam"),
    *RECIPE,
    *DP,
    opt(
        "delta",
        float | None,
        None,
        help=f"{DELTA_HELP}: dpaudit's recipe is accounted at it and the audit tests (ε, δ) (default 1e-5); "
        "with --trainer, your pipeline's δ (required).",
    ),
    opt("train_delta", float | None, None, hidden=True, help="Deprecated spelling of --delta."),
)
AUDIT_TRAIN_AUDIT = (
    opt("confidence", float, 0.95, help="Confidence level of the lower bound."),
    opt(
        "method",
        str,
        "clopper-pearson",
        help="clopper-pearson (a formal bound on the independent runs) | gdp (an estimate: assumes mu-GDP).",
    ),
    opt("claimed_epsilon", float | None, None, help="Claimed epsilon (default: the recipe's claim)."),
    opt("workers", int, 1, help="Parallel training processes."),
    opt(
        "seed",
        int,
        0,
        help="Seed of the runs (each training's seed, the canary, --init adversarial's model) and of the audit "
        "(holdout split, tie-breaking).",
    ),
    FAIL_ON_VIOLATION,
    FAIL_ON_ESTIMATE,
)


@audit_app.command("train")
@options(AUDIT_TRAIN_DESIGN, AUDIT_TRAIN_PIPELINE, AUDIT_TRAIN_AUDIT, JSON_ONLY, epochs=5, lr=1.0)
def train_cmd(ctx: typer.Context, **o) -> None:
    """Multi-run audit: train R models with and R without a canary, bound epsilon from their scores.

    Every run trains the claimed pipeline (preprocessing from public data, same steps and sigma on both
    sides, the claim's neighbouring relation), so the Clopper-Pearson bound is formal. With --trainer,
    your function trains each run (dpaudit still owns the canary, the seeds, the scores and the bound).
    """
    from dpaudit.data import check_data_spec

    check_data_spec(o["data"])  # a missing file refused before torch is imported (seconds)
    from dpaudit.audit.result import CANNOT_REFUTE, tests_formally  # (dpaudit.audit imports scipy: after the check)
    from dpaudit.workflows.runs import audit_training_from_options

    json_output = o.pop("json_output")
    exits = {"fail_on_violation": o.pop("fail_on_violation"), "fail_on_estimate": o.pop("fail_on_estimate")}
    if (train_delta := o.pop("train_delta")) is not None:
        deprecated_alias("--train-delta", "--delta (one δ: the claim's, accounted and audited)")
        if o["delta"] not in (None, train_delta):
            raise InputError("--train-delta and --delta differ: a claim has one δ; give --delta only")
        o["delta"] = train_delta
    result = audit_training_from_options(**o, given=given_options(ctx), progress=progress(json_output))
    if o["threat_model"] == "white-box-steps":
        record = result.record
        emit(
            {"description": record.description, **record.result.to_dict(), "steps": result.steps.to_dict()},
            f"source: {record.description}\n{describe(record.result)}\n{result.steps.summary()}",
            json_flag=json_output,
        )
        # (a), the per-step test, is the formal one: inconclusive, the gate could not fail (exit 2, as below); an
        # estimate (coins the inclusion test rejects): the formal design is this command's multi-run one
        per_step = result.steps.per_step
        return _exit_code(
            result.steps.verdicts, **exits, cannot_refute=per_step.verdict in CANNOT_REFUTE,
            formal=tests_formally(per_step),
            formal_advice="use the multi-run design (--threat-model white-box or black-box: a formal bound on the "
            "independent runs)",
        )  # fmt: skip
    emit(result.to_dict(), f"source: {result.audit.description}\n" + describe(result.result), json_flag=json_output)
    audits = [a.result for a in result.audits or (result.audit,)]
    verdicts = [r.verdict for r in audits]
    # As `audit scores` and `audit checkpoint`: a gate whose every bound was inconclusive (a design run with
    # --allow-inconclusive), or whose every result is an estimate (--method gdp), could not fail, so
    # --fail-on-violation exits 2 instead of passing.
    _exit_code(
        verdicts, **exits, cannot_refute=all(v in CANNOT_REFUTE for v in verdicts),
        formal=any(tests_formally(r) for r in audits),
        formal_advice="use --method clopper-pearson (the default: a formal bound on the independent runs)",
    )  # fmt: skip


def register(app: App) -> None:
    app.add_typer(audit_app, name="audit", help="Empirical privacy audits: epsilon lower bounds and verdicts.")
