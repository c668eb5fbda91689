"""A tiny frozen target for the Cloak tests: 4 informative features (class centres) beside 4 pure-noise
features, a logistic regression, and cloaks for three lambdas trained once per session."""

from __future__ import annotations

import numpy as np
import pytest

N_INFORMATIVE = 4
NOISE_FEATURE = 6  # independent of everything else: suppressing it must hide it
LAMBDAS = (0.3, 3.0, 100.0)
EPOCHS = 15


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory):
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    rng = np.random.default_rng(0)
    n = 600
    y = rng.integers(0, 3, n)
    centres = 2.0 * np.eye(3, N_INFORMATIVE)
    X = np.hstack([centres[y] + rng.normal(size=(n, N_INFORMATIVE)), rng.normal(size=(n, 4))]).astype(np.float32)
    base = tmp_path_factory.mktemp("cloak-target")
    data = base / "tiny.npz"
    np.savez(data, X=X, y=y)
    ds = load_dataset(str(data))
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=3)
    out = base / "run"
    train_run(ds, spec, TrainConfig(epochs=20, batch_size=32, lr=0.2, seed=0), out=out)
    return out


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir):
    from dpaudit.training.cloak import load_target

    return load_target(tiny_target_dir)


@pytest.fixture(scope="session")
def tiny_cloaks(tiny_target):
    """lambda -> cloak (small lambda = more noise)."""
    from dpaudit.training.cloak import CloakConfig, train_cloak

    return {lam: train_cloak(tiny_target, CloakConfig(lam=lam, epochs=EPOCHS)) for lam in LAMBDAS}
