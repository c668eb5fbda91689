"""A private run's scaler is fitted on the public aux split, as its checkpoint says (issue 27: a scaler
fitted on the members while labelled "aux" went uncaught)."""

from __future__ import annotations

import numpy as np

from dpaudit.data import Standardizer, load_dataset, make_splits
from dpaudit.models import default_spec
from dpaudit.training.config import DPConfig, TrainConfig
from dpaudit.training.run import train_run


def test_dp_run_preprocessing_statistics_equal_the_aux_splits():
    ds = load_dataset("synthetic:n=400,d=6,classes=2,seed=3,sep=1.0")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    config = TrainConfig(algo="dpsgd", epochs=1, batch_size=40, lr=0.5, dp=DPConfig(clip=1.0, noise_multiplier=1.0))
    meta = train_run(ds, spec, config, out=None, split_seed=0)
    pre = meta["preprocessing"]
    assert pre["fitted_on"] == "aux"
    splits = make_splits(len(ds), 0)
    aux, members = Standardizer.fit(ds.X[splits.aux]), Standardizer.fit(ds.X[splits.members])
    np.testing.assert_array_equal(np.asarray(pre["mean"], np.float32).ravel(), aux.mean.ravel())
    np.testing.assert_array_equal(np.asarray(pre["scale"], np.float32).ravel(), aux.scale.ravel())
    assert not np.allclose(aux.mean, members.mean)  # the check can tell the two splits apart
