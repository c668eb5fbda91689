"""``dpaudit demo``: the end-to-end job on embedded data (train → evaluate → report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpaudit.checkpoint import write_atomic_dir
from dpaudit.data import load_dataset
from dpaudit.errors import InputError
from dpaudit.models import default_spec
from dpaudit.progress import NULL_PROGRESS, Progress
from dpaudit.training.config import TrainConfig
from dpaudit.training.run import summary, train_run


def run_demo(
    out: Path, *, quick: bool = False, force: bool = False, progress: Progress = NULL_PROGRESS
) -> dict[str, Any]:
    out = Path(out)
    if out.exists() and not force:
        raise InputError(f"{out} already exists; use --force to overwrite it")
    ds = load_dataset("digits")
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    config = TrainConfig(algo="sgd", epochs=10 if quick else 40, batch_size=64, lr=0.1, seed=0)

    def write(tmp: Path) -> None:
        meta = train_run(ds, spec, config, out=tmp / "runs" / "nonprivate", progress=progress)
        s = summary(meta)
        (tmp / "report.json").write_text(json.dumps({"models": [s]}, indent=2) + "\n")

    write_atomic_dir(out, write, force=force)
    return json.loads((out / "report.json").read_text())
