"""A tiny target checkpoint shared by the attack tests (synthetic data, small MLP, few epochs)."""

from __future__ import annotations

import pytest

TINY_DATA = "synthetic:n=600,d=10,classes=3,seed=1,sep=0.5"


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory):
    """Splits: 210 members, 120 holdout, 150 aux, 120 test; batch 32, so aux fits 2 shadow models."""
    from dpaudit.data import load_dataset
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run

    ds = load_dataset(TINY_DATA)
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes, hidden=(32,))
    out = tmp_path_factory.mktemp("target") / "run"
    train_run(ds, spec, TrainConfig(epochs=15, batch_size=32, lr=0.2, seed=0), out=out)
    return out


@pytest.fixture
def tiny_run(tiny_run_dir):
    from dpaudit.checkpoint import load_run

    return load_run(tiny_run_dir)


@pytest.fixture(autouse=True)
def _cache_outside_home(monkeypatch, tmp_path_factory):
    """Reference models trained without an explicit cache_dir go to a temporary cache, never to the
    user's (``dpaudit.cache.default_cache_dir``)."""
    monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "dpaudit-cache"))
