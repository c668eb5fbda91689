"""``dpaudit demo``: the end-to-end job on embedded data.

Trains a non-private MLP and DP-SGD MLPs at ε = 1 and ε = 8 on the digits data (each with
mislabeled canaries, included independently with probability 1/2), attacks each model with
membership inference (loss threshold and LiRA), model inversion (MI-FACE) and learning-based
extraction, audits every claim (an estimate from the attacks' scores and a formal one-run bound from
the canaries) and writes ``report.{json,md,html}``.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpaudit.errors import InputError
from dpaudit.fileio import write_atomic_dir
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.config import DPConfig, TrainConfig
from dpaudit.workflows.checkpoint import DEFAULTS

DATA = "digits"
SPLIT_SEED = 0
CANARIES = 100


@dataclass(frozen=True)
class DemoSettings:
    epochs: int
    dp_epochs: int
    reference_models: int
    attacks: tuple[str, ...]
    extraction_budget: int  # learning-based extraction through the probability API (0: none)


# The full demo audits with the workflow's defaults (what `dpaudit audit checkpoint` and `dpaudit report`
# use); --quick trains fewer epochs and fewer reference models.
FULL = DemoSettings(
    epochs=60, dp_epochs=20, reference_models=DEFAULTS.reference_models, attacks=DEFAULTS.attacks,
    extraction_budget=1000,
)  # fmt: skip
QUICK = DemoSettings(epochs=25, dp_epochs=10, reference_models=4, attacks=DEFAULTS.attacks, extraction_budget=300)
MARKER = ".dpaudit-demo"  # written into the demo's output, so a later demo may replace it without --force


def demo_models(s: DemoSettings) -> list[tuple[str, TrainConfig]]:
    """The demo's models: name and training recipe (the DP ones calibrate σ to their target ε)."""

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
        ("non-private", TrainConfig(algo="sgd", epochs=s.epochs, batch_size=32, lr=0.1, seed=0)),
        ("dp-sgd-eps8", dp(8.0, lr=1.0)),
        ("dp-sgd-eps1", dp(1.0, lr=0.25)),
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

    families: dict[str, dict[str, Any]] = {"inversion": {}}  # MI-FACE on every class (white-box, ~1 s)
    if settings.extraction_budget:
        families["extraction"] = {"budget": settings.extraction_budget, "method": "learning"}
    return audit_checkpoint(
        run_dir,
        attacks=settings.attacks,
        reference_models=settings.reference_models,
        name=name,
        cache_dir=cache_dir,
        families=families,
        progress=progress,
    )


def replaces_demo_output(out: Path) -> bool:
    """True when ``out`` holds an earlier demo's output (which a new demo replaces without --force)."""
    return (Path(out) / MARKER).is_file()


def run_demo(
    out: Path, *, quick: bool = False, force: bool = False, progress: Progress = NULL_PROGRESS
) -> dict[str, Any]:
    """Run the demo and write ``out/report.{json,md,html}`` plus ``out/runs/<model>/`` checkpoints.

    An ``out`` holding an earlier demo's output is replaced (atomically, once the new one is
    complete); anything else there is refused unless ``force``. Returns the report (a dict
    following ``dpaudit/report/schema.json``)."""
    from dpaudit.canaries import make_canaries
    from dpaudit.data import load_dataset, make_splits
    from dpaudit.models import default_spec
    from dpaudit.report.build import build_report, model_entry_from, render
    from dpaudit.training.run import train_run

    out = Path(out)
    force = force or replaces_demo_output(out)
    if out.exists() and not force:
        raise InputError(f"{out} already exists and is not a demo output; use --force to overwrite it")
    settings = QUICK if quick else FULL
    ds = load_dataset(DATA)
    splits = make_splits(len(ds), SPLIT_SEED)
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    canaries = make_canaries(ds, splits, m=CANARIES, kind="mislabeled", seed=0)
    entries: list[dict[str, Any]] = []
    result: dict[str, Any] = {}

    def write(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="dpaudit-demo-cache-") as cache:
            for name, config in demo_models(settings):
                run_dir = tmp / "runs" / name
                train_run(ds, spec, config, out=run_dir, splits=splits, canaries=canaries, progress=progress)
                audit = evaluate(run_dir, settings, name=name, cache_dir=cache, progress=progress)
                entries.append(model_entry_from(audit, path=str(out / "runs" / name)))
        config = {
            "demo": "quick" if quick else "full",
            "data": DATA,
            "split_seed": SPLIT_SEED,
            "seed": 0,
            "canaries": CANARIES,
            **settings.__dict__,
        }
        report = build_report(entries, title="dpaudit demo: digits MLP, non-private vs DP-SGD", config=config)
        for fname, text in render(report, ("json", "md", "html")).items():
            (tmp / fname).write_text(text, encoding="utf-8")
        (tmp / MARKER).write_text("written by `dpaudit demo`; a later demo replaces this folder\n")
        tmp.chmod(0o755)
        result["report"] = report

    write_atomic_dir(out, write, force=force)
    return result["report"]
