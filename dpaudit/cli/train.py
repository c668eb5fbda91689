"""``dpaudit train``: train a model (non-private or DP) and save a run directory; ``dpaudit import``."""

from __future__ import annotations

from pathlib import Path

import typer

from dpaudit.cli._common import (
    DATA,
    DELTA_HELP,
    DP,
    OUTPUT,
    RECIPE,
    App,
    arg,
    emit,
    given_options,
    info,
    opt,
    options,
    progress,
    warn,
)
from dpaudit.data import DATA_HELP, check_data_spec
from dpaudit.errors import InputError
from dpaudit.training.config import recipe_help


def human_summary(s: dict, *, imported: bool = False) -> str:
    """The run summary for humans: accuracies as percentages (the JSON keeps fractions)."""
    from dpaudit import numfmt
    from dpaudit.report._format import rate

    lines = [
        f"model      {s['model']} on {s['data']} ({s['n_members']} training records), algo {s['algo']}",
        f"accuracy   train {rate(s['train_accuracy'])}   test {rate(s['test_accuracy'])}",
    ]
    if s["private"]:
        how = s["accountant"] or "stated, not accounted"
        # The claim as the report and the audit notes print it (one rounding everywhere, issue 29).
        lines.append(f"privacy    ε = {numfmt.upper(s['epsilon'])} at δ = {numfmt.exact(s['delta'])} ({how})")
        if s.get("claim_mismatch") and s["epsilon_recomputed"] is None:  # inspect: privacy.event does not parse
            lines.append(
                "CLAIM UNVERIFIED: checkpoint.json's recorded mechanism (privacy.event) cannot be read; the file was "
                "edited or written by other software, and audits test the claim as recorded"
            )
        elif s.get("claim_mismatch"):  # inspect: the recorded ε is not what its recorded mechanism gives
            recorded, recomputed = numfmt.ordered(s["epsilon"], s["epsilon_recomputed"], left_up=True, left_digits=6)
            lines.append(
                f"CLAIM MISMATCH: checkpoint.json records ε = {recorded}, but its recorded mechanism "
                f"(privacy.event) re-accounts to ε = {recomputed} ({how}, δ = {numfmt.exact(s['delta'])}); "
                "the file was edited or written by other software, and audits test the claim as recorded"
            )
    else:
        lines.append("privacy    no claim (imported weights)" if imported else "privacy    none (non-private training)")
    return "\n".join(lines)


MODEL = (
    opt(
        "model",
        str | None,
        None,
        help="logreg | mlp | cnn | rnn [default: logreg for --algo outpert, objpert and dpagd, the only model they "
        "train; mlp otherwise]",
    ),
    opt(
        "model_spec",
        Path | None,
        None,
        help='JSON model spec instead of --model: a zoo kind, or your own module {"kind": "python", "factory": '
        '"package.module:function", "kwargs": {...}, "input_shape": [...], "n_classes": K} (docs/model-spec.md; '
        "importing the factory runs its module, as --trainer does).",
    ),
    opt("hidden", str | None, None, help="MLP hidden sizes, e.g. 128,64."),
    opt("activation", str | None, None, help="tanh | relu | gelu | elu"),
)
ALGORITHM = (
    opt(
        "algo",
        str,
        "sgd",
        help="sgd | adam | dpsgd | dpadam | dpsgd-jl | dpadam-jl | pate | dp-icl | outpert | objpert | dpagd "
        "| cloak (with --target, --lambda)",
    ),
    # None: the default of the algorithm and model kind (dpaudit/training/config.py, stated in RECIPE_HELP)
    opt("epochs", int | None, None, help="Passes over the training split (default: per algorithm and model)."),
    RECIPE[1],
    opt("batch_size", int | None, None, help="Batch size (expected size for Poisson; default: per algorithm)."),
    opt("lr", float | None, None, help=f"Learning rate. {recipe_help()}"),
    opt("momentum", float | None, None, help="SGD momentum (default 0, or the algorithm's)."),
    opt(
        "weight_decay",
        float,
        0.0,
        help="Weight decay λ of the SGD/Adam optimizer (torch's weight_decay: λ·w added to the gradient); "
        "outpert/objpert/dpagd take --l2.",
    ),
    opt(
        "l2",
        float | None,
        None,
        help="outpert/objpert/dpagd: λ of the penalty (λ/2)‖w‖² (weight decay; default 0.1 for outpert/objpert).",
    ),
    opt("mechanism", str | None, None, help="outpert: laplace (norm mechanism, pure ε) | gaussian (ε, δ)."),
    opt("objective", str | None, None, help="dpagd: logistic | huber (SVM)."),
)
SPLIT = (
    opt("seed", int, 0, help="Seed for initialisation and batches."),
    opt("split_seed", int, 0, help="Seed of the data split."),
    opt("split", str, "0.35,0.2,0.25,0.2", help="Fractions members,holdout,aux,test."),
)
PRIVACY = (
    *DP[:2],
    opt("delta", float, 1e-5, help=f"DP: {DELTA_HELP}; the run is accounted at it."),
    DP[2],
    opt("sampling", str, "poisson", help="DP: poisson | shuffle."),
    opt("accountant", str | None, None, help="DP: rdp | pld (default: rdp; pld for the -jl algorithms)."),
    opt(
        "jl_projections",
        int | None,
        None,
        help="DP-SGD-JL: number R of JL projections estimating per-example norms (--algo dpsgd-jl/dpadam-jl; "
        "default 16).",
    ),
    opt("secure_noise", bool, False, help="DP: cryptographically seeded noise (and JL directions for the -jl algos)."),
)
PERFORMANCE = (
    opt("clipping", str, "auto", help="auto | ghost | vmap | loop."),
    opt(
        "backend",
        str,
        "torch",
        help="torch | jax (logreg/mlp/cnn, or your own model: an nn.Sequential of Linear, Conv2d, GroupNorm, "
        "LayerNorm, Embedding, pooling and activation layers, or a module torch.fx traces into those and common "
        "torch ops; needs the jax extra: pip install '.[jax]').",
    ),
    opt(
        "max_physical_batch",
        int | None,
        None,
        help="DP-SGD: at most this many examples per forward/backward pass (chunk sums added, the noise added "
        "once; performance only, the claim is unchanged). Default: the whole batch.",
    ),
    opt("device", str, "auto", help="auto | cpu | cuda."),
    opt("autocast", str | None, None, help="DP-SGD: bf16 forward/backward; norms and clipping stay float32."),
)
CANARIES = (
    opt("canaries", int | None, None, help="Audit: insert M canaries, each included w.p. 1/2."),
    opt(
        "canary_kind",
        str,
        "mislabeled",
        help="mislabeled | outlier | clipbkd | crafted (from the public aux split, for the final-model threat model).",
    ),
    opt("canary_seed", int, 0, help="Seed of canaries and inclusion."),
    opt(
        "allow_inconclusive",
        bool,
        False,
        help="Train even when --canaries is too few for their one-run audit to refute the claim "
        "(otherwise refused with exit 2).",
    ),
    opt(
        "whitebox_canaries",
        int | None,
        None,
        help="Audit (DP-SGD, Poisson): M white-box Dirac gradient canaries, each included w.p. 1/2, "
        "every update observed; `dpaudit audit checkpoint` audits them (one run, formal).",
    ),
)
AGGREGATION = (
    opt("teachers", int | None, None, help="PATE/DP-ICL: number of teachers K."),
    opt("aggregator", str, "gnmax", help="PATE/DP-ICL: lnmax | gnmax | confident-gnmax | argmax."),
    opt("queries", int | None, None, help="PATE/DP-ICL: public queries Q."),
    opt("sigma", float | None, None, help="PATE/DP-ICL: answer noise (Laplace b; Gaussian σ, σ2)."),
    opt("sigma1", float | None, None, help="Confident-GNMax: threshold noise σ1."),
    opt("threshold", float | None, None, help="Confident-GNMax: threshold T."),
    opt("max_answers", int | None, None, help="Confident-GNMax: answer cap."),
    opt("shots", int | None, None, help="DP-ICL: exemplars per teacher k."),
    opt("predictor", str, "knn", help="DP-ICL: knn | prototype (token ids: bags of tokens) | PATH (embedding model)."),
    opt("workers", int, 1, help="PATE: teachers trained in parallel."),
    opt(
        "claim",
        str,
        "data-independent",
        help="PATE/DP-ICL: data-independent | data-dependent (sanitised with smooth sensitivity, Papernot et al. "
        "2018; gnmax/confident-gnmax).",
    ),
    opt(
        "sanitiser",
        str | None,
        None,
        help="--claim data-dependent: auto (default: every setting chosen by a public rule, never from the votes) "
        "or key=value pairs order, beta_factor, sigma_s, tau (must be fixed before seeing the data; the rest auto), "
        "prior_top (the rule's prior consensus).",
    ),
    opt(
        "keep_private_diagnostics",
        bool,
        False,
        help="PATE/DP-ICL: also save values computed from the private votes (not DP) in checkpoint.json.",
    ),
    opt(
        "subsample",
        float | None,
        None,
        help="DP-ICL (gnmax): each query's teachers see a fresh Poisson sample of the exemplars at this rate "
        "(accounted with amplification; replaces --shots).",
    ),
)
CLOAK = (
    opt("target", Path | None, None, help="Cloak: the frozen model's run directory."),
    opt(
        "lambdas",
        list[str] | None,
        None,
        "--lambda",
        metavar="L[,L2…]",
        help="Cloak: weight λ of the task loss (> 0); several: a sweep.",
    ),
)
TRAIN_OUT = (opt("out", Path, ..., "--out", "-o", help="Run directory to write (e.g. runs/NAME)."),)


@options(TRAIN_OUT, DATA, MODEL, ALGORITHM, SPLIT, PRIVACY, PERFORMANCE, CANARIES, AGGREGATION, CLOAK, OUTPUT)
def train(ctx: typer.Context, **o) -> None:
    """Train a model on a dataset split and save it as a run directory."""
    out, json_output, given = o["out"], o.pop("json_output"), given_options(ctx)
    if o["algo"] == "cloak" or o["target"] is not None or o["lambdas"]:  # learned input noise (training/cloak.py)
        from dpaudit.cli.cloak import train_cloak_command
        from dpaudit.training.config import check_options_read

        check_options_read(o["algo"], given)

        keep = ("epochs", "batch_size", "lr", "seed", "force")
        # A cloak is trained on its --target run's data, members split and frozen model: --data, --model, --split
        # and the like would be ignored (before: silently, e.g. --data mine.csv trained the cloak on the target's).
        unread = (
            sorted(given - {"out", "algo", "target", "lambdas", "json_output", *keep}) if o["algo"] == "cloak" else []
        )
        if unread:
            raise InputError(
                f"--{unread[0].replace('_', '-')} does not apply to --algo cloak (a cloak is trained on its --target "
                "run's data, members split and model)"
            )
        return train_cloak_command(
            o["algo"], o["target"], o["lambdas"] or [], out, **{k: o[k] for k in keep}, json_output=json_output
        )
    check_data_spec(o["data"])  # a missing file refused before torch is imported (seconds)
    from dpaudit.training.run import summary
    from dpaudit.workflows.runs import train_from_options

    del o["target"], o["lambdas"]
    meta = train_from_options(
        **o, given=given, progress=progress(json_output), notify=lambda m: info(m, json_flag=json_output)
    )
    for message in meta.get("fit_warnings", ()):
        warn(message)
    s = summary(meta)
    emit({"out": str(out), **s}, human_summary(s) + f"\nsaved      {out}", json_flag=json_output)


def register(app: App) -> None:
    app.command("train")(train)
    app.command("import", help=IMPORT_HELP)(import_weights)


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


IMPORT = (
    arg("weights", Path, help="model.safetensors, or a .pt plain state_dict."),
    opt(
        "model_spec",
        Path,
        ...,
        help="JSON model spec: a zoo kind or your own module by factory, kind 'python' (docs/model-spec.md; "
        "checkpoint.json 'model').",
    ),
    opt("out", Path, ..., "--out", "-o", help="Run directory to write."),
    opt(
        "data",
        str | None,
        None,
        help="The records the model saw (needs --members): " + DATA_HELP,
    ),
    DATA[1],
    opt(
        "members",
        Path | None,
        None,
        help="The training members: 0-based record indices into --data, one per line (a header line allowed), "
        "or an integer .npy.",
    ),
)
STATED_CLAIM = (
    opt(
        "claim",
        Path | None,
        None,
        help="claim.json: epsilon, delta, optionally noise_multiplier, sample_rate, steps, accountant, "
        "neighbouring (not with --epsilon etc.).",
    ),
    opt("epsilon", float | None, None, help="Claimed ε (>= 0)."),
    opt("delta", float | None, None, help=f"{DELTA_HELP}, in (0, 0.1]."),
    opt("noise_multiplier", float | None, None, help="Claim: DP-SGD noise σ (re-accounted)."),
    opt("sample_rate", float | None, None, help="Claim: sampling rate q = B/N in (0, 1]."),
    opt("steps", int | None, None, help="Claim: number of DP-SGD steps T."),
    opt("accountant", str | None, None, help="Claim: rdp | pld (default rdp; with σ, q, T)."),
    opt(
        "neighbouring",
        str | None,
        None,
        help="Claim: add_remove (Poisson sampling; default) | replace_one (shuffled fixed-size batches).",
    ),
)
IMPORT_EXTRAS = (
    opt(
        "preprocessing",
        str | None,
        None,
        help="none (features as they are; default with --members) | scaler.json ('mean', 'scale'). "
        "Legacy mode: standardize (default) | identity.",
    ),
    opt(
        "recipe",
        Path | None,
        None,
        help="recipe.json: how the model was trained (approximately), for LiRA/shadow models.",
    ),
    opt("split_seed", int, 0, help="Seed of the non-members' holdout/aux/test split."),
    opt("split", str | None, None, help="Legacy mode only: fractions members,holdout,aux,test [0.35,0.2,0.25,0.2]."),
    opt(
        "canaries",
        Path | None,
        None,
        help="Directory from `dpaudit canaries make`: its included canaries were added to the training set; "
        "`audit checkpoint` then gives the formal one-run audit.",
    ),
)


@options(IMPORT, STATED_CLAIM, IMPORT_EXTRAS, OUTPUT)
def import_weights(**o) -> None:
    from dpaudit.fileio import check_weights_file

    check_weights_file(o["weights"])  # WEIGHTS first, as the command reads (it named the data's problem first)
    if o["data"] is not None:
        check_data_spec(o["data"])  # before torch is imported
    from dpaudit import numfmt
    from dpaudit.training.run import summary
    from dpaudit.workflows.runs import import_from_options

    out, json_output = o["out"], o.pop("json_output")
    meta = import_from_options(**o, notify=lambda m: info(m, json_flag=json_output), progress=progress(json_output))
    for message in meta["import"]["warnings"]:
        warn(message)
    s = summary(meta)
    check = meta["import"]["member_check"]
    lines = [human_summary(s, imported=True)]
    if meta["privacy"] is not None:
        lines.append(f"claim      {meta['privacy']['source']}")
    if check["holdout_loss"] is not None:
        # The means alone misled: "loss 0.5895 vs holdout 0.691 (member check inconclusive)" (a few holdout records
        # with a large loss lift its mean) read as a contradiction; the check is the rank test, so its numbers go
        # on the line (member_check: AUC = P(a member's loss is lower), one-sided Mann–Whitney p).
        ranks = (
            f"; a member's loss is lower with probability {check['auc']:.3f} ({numfmt.p_value(check['p_value'])})"
            if check.get("auc") is not None
            else ""
        )
        lines.append(
            f"members    loss {check['train_loss']:.4g} vs holdout {check['holdout_loss']:.4g}{ranks}"
            + ("  (SUSPICIOUS: see the warning)" if check["suspicious"] else "")
            + ("  (member check inconclusive)" if check.get("outcome") == "inconclusive" else "")
        )
    lines.append(f"saved      {out}")
    data_out = {"out": str(out), **s, "claim": meta["privacy"], "import": meta["import"]}
    emit(data_out, "\n".join(lines), json_flag=json_output)
