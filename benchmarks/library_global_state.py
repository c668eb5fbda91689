"""What a library call leaves behind in a notebook: global state before and after each public entry point.

    .venv/bin/python benchmarks/library_global_state.py

Trains a tiny logistic regression and an MLP (a few seconds) in a temporary directory, then calls the public
entry points a notebook user reaches for (audits, accountants, ``assert_dp``, loading a run, the membership,
extraction, inversion and attribute attacks, ``audit_checkpoint``, ``audit_training``, ``train_cloak``,
``read_model_spec``, an inversion grid, ``render_html``) with torch set to two threads and a generator of the
user's own. After each call it compares:
torch's thread counts, default dtype, global generator, deterministic/TF32/cuDNN flags, grad mode, anomaly mode;
NumPy's and Python's global generators, NumPy's error and print settings; warnings filters, logging, ``os.environ``,
the working directory; matplotlib's backend; and whether anything went to stdout. One line per call: ``ok`` or what
changed. Exit status 1 when a change is dpaudit's own; the import side effects of third-party packages (scikit-learn
sets ``KMP_DUPLICATE_LIB_OK``/``KMP_INIT_AT_FORK`` and ``sklearn.datasets`` draws from Python's ``random`` at import;
torch sets ``TORCHINDUCTOR_CACHE_DIR`` and a SymPy warnings filter on its first ``torch.func``/fx use) happen once,
before the calls, and are listed apart.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]


def snapshot() -> dict:
    import matplotlib

    return {
        "torch threads": (torch.get_num_threads(), torch.get_num_interop_threads()),
        "torch default dtype": torch.get_default_dtype(),
        "torch generator": torch.get_rng_state().numpy().tobytes(),
        "torch flags": (
            torch.are_deterministic_algorithms_enabled(),
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark,
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision(),
            torch.is_grad_enabled(),
            torch.is_anomaly_enabled(),
        ),
        "numpy generator": np.random.get_state()[1].tobytes(),  # noqa: NPY002 (the legacy global is what is watched)
        "python random": random.getstate(),
        "numpy settings": (tuple(sorted(np.geterr().items())), str(np.get_printoptions())),
        "warnings filters": tuple(warnings.filters),
        "logging": (logging.root.level, tuple(logging.root.handlers)),
        "environment": tuple(sorted(os.environ.items())),
        "working directory": os.getcwd(),
        "matplotlib backend": matplotlib.get_backend(),
    }


def changes(before: dict, after: dict) -> list[str]:
    return [k for k in before if before[k] != after[k]]


def warm_third_party() -> list[str]:
    """Import what the calls import, so that third-party import side effects are not charged to a call."""
    before = snapshot()
    import sklearn.datasets
    import sklearn.linear_model  # noqa: F401
    from torch.func import vmap

    vmap(torch.sin)(torch.zeros(2))
    with torch.random.fork_rng(devices=[]):  # the Linear's initialisation is this script's, not an import's
        torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    return changes(before, snapshot())


def make_runs(root: Path) -> None:
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset("synthetic:n=600,d=10,classes=3,seed=1,sep=0.5")
    mlp = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes, hidden=(32,))
    train_run(ds, mlp, TrainConfig(epochs=5, batch_size=32, lr=0.2), out=root / "mlp")
    logreg = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    train_run(ds, logreg, TrainConfig(epochs=5, batch_size=32, lr=0.2), out=root / "lr")
    spec = {"kind": "python", "factory": "tests.core.byo_models:residual_mlp", "kwargs": {"d": 5, "n_classes": 2},
            "input_shape": [5], "n_classes": 2}  # fmt: skip
    (root / "spec.json").write_text(json.dumps(spec))


def calls(root: Path) -> dict:
    from attacks import extract
    from attacks.attribute import run_attribute
    from attacks.inversion import run_inversion, save_grid
    from attacks.mia import run_mia
    from dpaudit.accounting import compare_accountants, dpsgd_event
    from dpaudit.audit import audit_scores, plan_design
    from dpaudit.checkpoint import load_run
    from dpaudit.models import default_spec, read_model_spec
    from dpaudit.testing import assert_dp
    from dpaudit.training.cloak import CloakConfig, train_cloak
    from dpaudit.training.config import TrainConfig
    from dpaudit.workflows import audit_checkpoint, audit_training

    rng = np.random.default_rng(0)
    member = rng.random(200) < 0.5
    scores = rng.normal(size=200) + 2 * member
    event = dpsgd_event(noise_multiplier=1.0, sample_rate=0.01, steps=100)
    tiny = "synthetic:n=300,d=5,classes=2,seed=1"
    return {
        "audit_scores": lambda: audit_scores(scores, member, claimed_epsilon=1.0),
        "plan_design": lambda: plan_design(2.0, true_epsilon=3.0, simulations=50, max_size=1000),
        "compare_accountants": lambda: compare_accountants(event, 1e-5, "rdp,pld"),
        "assert_dp": lambda: assert_dp(
            lambda d, r: sum(d) + r.laplace(scale=1.0),
            [0, 1, 1],
            [0, 1, 0],
            epsilon=1.0,
            delta=0.0,
            trials=2000,
            direction="greater",
        ),
        "load_run": lambda: load_run(root / "mlp"),
        "read_model_spec": lambda: read_model_spec(root / "spec.json"),
        "run_mia": lambda: run_mia(load_run(root / "mlp"), methods=["loss", "lira"], reference_models=4),
        "extract": lambda: extract(load_run(root / "lr"), budget=200),
        "run_inversion+grid": lambda: save_grid(
            run_inversion(load_run(root / "mlp"), classes=[0]), root / "g.png", force=True
        ),
        "render_html": _render_html,
        "run_attribute": lambda: run_attribute(load_run(root / "mlp"), 0),
        "audit_checkpoint": lambda: audit_checkpoint(root / "mlp", attacks="loss"),
        "train_cloak": lambda: train_cloak(load_run(root / "mlp"), CloakConfig(lam=1.0, epochs=1)),
        "audit_training": lambda: audit_training(
            tiny,
            default_spec("logreg", input_shape=(5,), n_classes=2),
            TrainConfig(epochs=1, batch_size=32),
            runs=2,
            train_size=60,
        ),
    }


def _render_html() -> str:
    from dpaudit.report import load_report, render_html  # imported by the call: its import is part of what it does

    return render_html(load_report(REPO / "reports" / "example" / "report.json"))


def main() -> int:
    import matplotlib

    # the notebook's own backend, pyplot imported (as %matplotlib does it): a library's matplotlib.use() switches it
    matplotlib.use("pdf")
    import matplotlib.pyplot

    sys.path.insert(0, str(REPO))  # tests.core.byo_models, the python spec's factory
    third_party = warm_third_party()
    print(f"third-party import side effects (once, before the calls): {', '.join(third_party) or 'none'}")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["DPAUDIT_CACHE_DIR"] = str(root / "cache")
        make_runs(root)
        for name, call in calls(root).items():
            torch.set_num_threads(2)
            torch.manual_seed(1234)
            before, out = snapshot(), io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    call()
                    error = ""
                except Exception as e:  # a call that fails is reported, with what it left behind
                    error = f" (raised {type(e).__name__}: {str(e)[:80]})"
            changed = changes(before, snapshot()) + (["stdout"] if out.getvalue() else [])
            bad += bool(changed)
            print(f"{name:20s} {', '.join(changed) or 'ok'}{error}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
