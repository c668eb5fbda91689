"""``dpaudit demo``: the end-to-end job on embedded data.

Trains a non-private MLP and DP-SGD MLPs at ε = 1 and ε = 8 on the digits data, plus one DP-SGD
MLP with a planted bug (noise divided by the batch size, claim computed for the intended σ, claimed
ε = 2). Every model gets 100 mislabeled canaries (included independently with probability 1/2; a
black-box one-run audit); the DP models also get 1000 white-box Dirac gradient canaries (a
white-box one-run audit that observes every update). Each model is attacked with membership
inference (loss threshold and LiRA), model inversion (MI-FACE) and learning-based extraction; every
claim is audited (estimates from the attacks' scores, formal one-run bounds from the canaries) and
``report.{json,md,html}`` is written. The planted bug's audit reads "violation". A Cloak (learned input
noise) for the non-private model and a DP-ICL model with its membership attack complete the tour.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpaudit.errors import InputError
from dpaudit.fileio import check_output_dir, write_atomic_dir, writer_of
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.config import DPConfig, TrainConfig
from dpaudit.training.dirac import DiracCanaries
from dpaudit.training.dpsgd import DPSGDTrainer
from dpaudit.workflows.checkpoint import DEFAULTS

DATA = "digits"
SPLIT_SEED = 0
CANARIES = 100
# White-box Dirac gradient canaries per DP model: a one-run audit that can certify up to ε ≈ 4.7 at
# δ = 1e-5 at the level each of the checkpoint's four formal canary tests runs at (98.75%, Bonferroni for 95%
# overall: workflows.checkpoint.canary_confidence; 5.1 at 95% alone), enough to refute the planted bug's claimed
# ε = 2, not the correct ε = 8 model's.
WHITEBOX_CANARIES = 1000


@dataclass(frozen=True)
class DemoSettings:
    epochs: int
    dp_epochs: int
    reference_models: int
    attacks: tuple[str, ...]
    extraction_budget: int  # learning-based extraction through the probability API (0: none)
    cloak_lambda: float | None = None  # a Cloak (λ) learned for the non-private model, and what it leaks
    icl: bool = False  # a DP-ICL model (noisy votes of in-context predictors) with its membership attack


# The full demo audits with the workflow's defaults (what `dpaudit audit checkpoint` and `dpaudit report`
# use); --quick trains fewer epochs and fewer reference models.
FULL = DemoSettings(
    epochs=60, dp_epochs=20, reference_models=DEFAULTS.reference_models, attacks=DEFAULTS.attacks,
    extraction_budget=1000, cloak_lambda=2.0, icl=True,
)  # fmt: skip
QUICK = DemoSettings(
    epochs=25, dp_epochs=10, reference_models=4, attacks=DEFAULTS.attacks, extraction_budget=300, cloak_lambda=2.0,
    icl=True,
)  # fmt: skip
DEMO_WRITER = "demo"  # the manifest's writer of a demo output, which a later demo replaces without --force


@dataclass(frozen=True)
class DemoModel:
    """One of the demo's models: its name, training recipe, and whether it carries the planted bug."""

    name: str
    config: TrainConfig
    planted_bug: bool = False

    @property
    def whitebox(self) -> bool:
        return self.config.dp is not None  # white-box Dirac canaries need DP-SGD's clipped sums


class PlantedNoiseBug(DPSGDTrainer):
    """DP-SGD with a realistic planted bug: the noise is divided by the batch size twice (std σC/B on the
    clipped *sum*, which is then divided by B again), while the claim is computed for the intended σ.

    It is never registered as an algorithm; the demo trains it to show that the audit catches it.
    """

    def noise_std(self, setting, clip: float) -> float:
        return setting.noise_multiplier * clip / self.config.batch_size


def demo_models(s: DemoSettings) -> list[DemoModel]:
    """The demo's models (the DP ones calibrate σ to their target ε)."""

    def dp(eps: float, lr: float) -> TrainConfig:
        # Tuned on the holdout split (benchmarks/RESULTS.md, utility table): batch 128, clip 1, tanh MLP.
        return TrainConfig(
            algo="dpsgd",
            epochs=s.dp_epochs,
            batch_size=128,
            lr=lr,
            seed=0,
            dp=DPConfig(clip=1.0, target_epsilon=eps, delta=1e-5),
        )

    return [
        DemoModel("non-private", TrainConfig(algo="sgd", epochs=s.epochs, batch_size=32, lr=0.1, seed=0)),
        DemoModel("dp-sgd-eps8", dp(8.0, lr=1.0)),
        DemoModel("dp-sgd-eps1", dp(1.0, lr=0.25)),
        DemoModel("dp-sgd-eps2-planted-bug", dp(2.0, lr=0.5), planted_bug=True),
    ]


def evaluate(
    run_dir: Path,
    settings: DemoSettings,
    *,
    name: str,
    cache_dir: Path | str | None = None,
    progress: Progress = NULL_PROGRESS,
):
    """The demo's audit of one of its runs: the shared workflow with the demo's attack settings."""
    from dpaudit.workflows import audit_checkpoint

    families: dict[str, dict[str, Any]] = {"inversion": {}}  # MI-FACE on every class (white-box, ~1-3 s)
    if settings.extraction_budget:
        families["extraction"] = {"budget": settings.extraction_budget, "method": "learning"}
    if settings.cloak_lambda is not None and name == "non-private":
        families["cloak"] = {"lambda": settings.cloak_lambda}  # learned input noise for this model, and its leakage
    return audit_checkpoint(
        run_dir,
        attacks=settings.attacks,
        reference_models=settings.reference_models,
        name=name,
        cache_dir=cache_dir,
        families=families,
        progress=progress,
    )


ICL_NAME = "dp-icl-eps8"


def icl_model(ds, splits, run_dir: Path, *, progress: Progress = NULL_PROGRESS):
    """DP-ICL (Wu et al. 2024): 40 nearest-exemplar in-context predictors, each prompted with 10 disjoint
    private exemplars, their votes on 100 public queries aggregated by GNMax calibrated to ε = 8; a logreg
    student trained on the answers. Audited with the loss attack (an estimate) and the ICL membership
    attack with its exemplar-canary one-run audit (formal; ``dpaudit.workflows.icl.run_icl``)."""
    from dpaudit.aggregation import AggregatorConfig
    from dpaudit.models import default_spec
    from dpaudit.training.pate import AggregationConfig, train_aggregation_run
    from dpaudit.workflows import audit_checkpoint

    config = AggregationConfig(
        algo="dp-icl", teachers=40, shots=10, aggregator=AggregatorConfig("gnmax", sigma=1.0), queries=100,
        target_epsilon=8.0,
    )  # fmt: skip
    student = TrainConfig(algo="sgd", epochs=40, batch_size=32, lr=0.05, momentum=0.9, seed=0)
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    train_aggregation_run(
        ds, spec, config, student, out=run_dir, split_seed=splits.seed, fractions=splits.fractions, progress=progress
    )
    return audit_checkpoint(
        run_dir, attacks=("loss",), name=ICL_NAME, families={"icl": {"canaries": 100, "trials": 10}}, progress=progress
    )


def replaces_demo_output(out: Path) -> bool:
    """True when ``out``'s manifest says an earlier demo wrote it (a new demo replaces it without --force,
    as long as it holds nothing else: :func:`dpaudit.fileio.check_output_dir`)."""
    return writer_of(out) == DEMO_WRITER


def check_demo_output(out: Path, *, force: bool) -> bool:
    """Refuse an ``out`` the demo may not write (before any work); True when it replaces an earlier demo's
    output there."""
    out = Path(out)
    replaces = replaces_demo_output(out)
    if out.exists() and not (force or replaces):
        raise InputError(f"{out} already exists and is not a demo output; use --force to overwrite it")
    check_output_dir(out, force=force or replaces)
    return replaces


def run_demo(
    out: Path, *, quick: bool = False, force: bool = False, progress: Progress = NULL_PROGRESS
) -> dict[str, Any]:
    """Run the demo and write ``out/report.{json,md,html}`` plus ``out/runs/<model>/`` checkpoints.

    An ``out`` holding an earlier demo's output, and nothing else, is replaced (atomically, once the
    new one is complete); any other existing ``out`` is refused unless ``force``, and even then when
    it holds a file dpaudit did not write (:func:`dpaudit.fileio.check_output_dir`). Returns the
    report (a dict following ``dpaudit/report/schema.json``)."""
    from dpaudit.canaries import make_canaries
    from dpaudit.data import load_dataset, make_splits
    from dpaudit.models import default_spec
    from dpaudit.report.build import build_report, model_entry_from, render
    from dpaudit.training.run import train_run

    out = Path(out)
    force = check_demo_output(out, force=force) or force
    settings = QUICK if quick else FULL
    ds = load_dataset(DATA)
    splits = make_splits(len(ds), SPLIT_SEED)
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    canaries = make_canaries(ds, splits, m=CANARIES, kind="mislabeled", seed=0)
    entries: list[dict[str, Any]] = []
    result: dict[str, Any] = {}

    def write(tmp: Path) -> None:
        # The reference models' cache lives in the temporary output (removed below, or with it by the
        # next run after a kill), never in a system folder that a killed demo would leave behind.
        cache = tmp / ".reference-cache"
        try:
            for model in demo_models(settings):
                run_dir = tmp / "runs" / model.name
                train_run(
                    ds, spec, model.config, out=run_dir, splits=splits, canaries=canaries, progress=progress,
                    trainer=PlantedNoiseBug(model.config) if model.planted_bug else None,
                    whitebox=DiracCanaries(m=WHITEBOX_CANARIES, seed=0) if model.whitebox else None,
                )  # fmt: skip
                audit = evaluate(run_dir, settings, name=model.name, cache_dir=cache, progress=progress)
                entries.append(model_entry_from(audit, path=str(out / "runs" / model.name)))
            if settings.icl:
                audit = icl_model(ds, splits, tmp / "runs" / ICL_NAME, progress=progress)
                entries.append(model_entry_from(audit, path=str(out / "runs" / ICL_NAME)))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        config = {
            "demo": "quick" if quick else "full",
            "data": DATA,
            "split_seed": SPLIT_SEED,
            "seed": 0,
            "canaries": CANARIES,
            "whitebox_canaries": WHITEBOX_CANARIES,
            "planted_bug": [m.name for m in demo_models(settings) if m.planted_bug],
            **settings.__dict__,
        }
        report = build_report(entries, title="dpaudit demo: digits MLP, non-private vs DP-SGD", config=config)
        for fname, text in render(report, ("json", "md", "html")).items():
            (tmp / fname).write_text(text, encoding="utf-8")
        tmp.chmod(0o755)
        result["report"] = report

    write_atomic_dir(out, write, force=force, written_by=DEMO_WRITER)
    return result["report"]
