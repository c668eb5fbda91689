"""Crafted canaries (dpaudit.canaries.craft_canaries): public data only, the geometry they promise."""

import dataclasses

import numpy as np
import pytest

from dpaudit.canaries import CRAFTED_NORM_FACTOR, craft_canaries, make_canaries
from dpaudit.data import load_dataset, make_splits
from dpaudit.errors import InputError


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return ds, make_splits(len(ds), 0)


def _scrambled_private_data(ds, splits):
    """The same dataset with every non-aux record (members, holdout, test) replaced by noise."""
    rng = np.random.default_rng(1)
    X, y = ds.X.copy(), ds.y.copy()
    private = np.setdiff1d(np.arange(len(ds)), splits.aux)
    X[private] = rng.uniform(0, 16, size=X[private].shape).astype(X.dtype)
    y[private] = rng.integers(0, ds.n_classes, size=len(private))
    return dataclasses.replace(ds, X=X, y=y)


def test_crafted_records_depend_on_public_data_and_seed_only(digits):
    """The records are a function of (aux split, seed): scrambling every private record and drawing other
    inclusion bits changes nothing. The check bites: ClipBKD, which reads the members, does change."""
    ds, splits = digits
    a = make_canaries(ds, splits, m=50, kind="crafted", seed=3)
    b = make_canaries(_scrambled_private_data(ds, splits), splits, m=50, kind="crafted", seed=3)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    X, y = craft_canaries(ds.X[splits.aux], ds.y[splits.aux], m=50, n_classes=ds.n_classes, seed=3)
    np.testing.assert_array_equal(a.X, X)  # no inclusion bits in the crafting function's inputs
    np.testing.assert_array_equal(a.y, y)
    assert 10 < a.included.sum() < 40  # the bits are drawn (each w.p. 1/2), just not used for the records
    c = make_canaries(ds, splits, m=50, kind="clipbkd", seed=3)
    d = make_canaries(_scrambled_private_data(ds, splits), splits, m=50, kind="clipbkd", seed=3)
    assert not np.array_equal(c.X, d.X)


def test_crafted_canary_is_orthogonal_to_the_public_data_at_a_large_norm(digits):
    """In the aux-standardised space the audited pipelines use: the single canary lies along a direction
    in which the aux records do not vary (digits has constant pixels, so the least variance is 0 up to
    rounding), at CRAFTED_NORM_FACTOR × the largest aux norm, with the least frequent aux label. Hence a
    linear model's per-example gradients of the aux records, (p − e_y)(x, 1)ᵀ, have inner product with
    the canary's of at most ‖p_d − e_{y_d}‖·‖p_c − e_{y_c}‖·(|x_d·x_c| + 1) ≤ 2 here (up to float32)."""
    ds, splits = digits
    c = make_canaries(ds, splits, m=1, kind="crafted", seed=0)
    A = ds.X[splits.aux].reshape(len(splits.aux), -1).astype(np.float64)
    mean, std = A.mean(0), A.std(0)
    std = np.where(std > 1e-12, std, 1.0)
    Z = (A - mean) / std
    zc = ((c.X.reshape(1, -1).astype(np.float64) - mean) / std)[0]
    radius = np.linalg.norm(zc)
    assert radius == pytest.approx(CRAFTED_NORM_FACTOR * np.linalg.norm(Z, axis=1).max(), rel=1e-5)
    u = zc / radius
    assert np.abs(Z @ u).max() < 1e-3  # float32 rounding of the raw canary; a data direction gives O(1)
    counts = np.bincount(ds.y[splits.aux], minlength=ds.n_classes)
    assert counts[c.y[0]] == counts.min()
    # The planted alternative: the *most*-variance direction is nothing like orthogonal to the data.
    top = np.linalg.svd(Z - Z.mean(0), full_matrices=False)[2][0]
    assert np.abs(Z @ top).max() > 1.0


def test_several_crafted_canaries_spread_labels_and_directions(digits):
    ds, splits = digits
    c = make_canaries(ds, splits, m=20, kind="crafted", seed=0)
    assert set(c.y.tolist()) == set(range(ds.n_classes))  # labels cycle over the classes
    flat = c.X.reshape(20, -1)
    assert len(np.unique(flat, axis=0)) == 20


def test_crafted_needs_the_public_split(digits):
    ds, splits = digits
    no_aux = dataclasses.replace(splits, aux=np.array([], dtype=np.int64))
    with pytest.raises(InputError, match="public auxiliary split"):
        make_canaries(ds, no_aux, m=5, kind="crafted")


@pytest.mark.parametrize("labels", [(1, 2), (-1, 1), ("cat", "dog")])
def test_records_to_insert_carry_the_labels_as_the_data_holds_them(tmp_path, labels):
    """`canaries make` on data labelled 1/2, -1/1 or cat/dog: insert.npz's labels are the data's own (the user's
    loop appends them to its labels), and every mislabeled canary's label differs from its record's. Written as
    class indices 0/1, the canaries of the records labelled 1 (index 0, mislabeled as index 1) read as label 1
    in a 1/2 loop: their true label, so the audit tested nothing."""
    from dpaudit.canaries import make_canary_dir

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3)).round(3)
    y = np.asarray(labels)[rng.integers(0, 2, size=60)]
    lines = ["a,b,c,label"] + [f"{r[0]},{r[1]},{r[2]},{t}" for r, t in zip(X, y, strict=True)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    make_canary_dir(str(tmp_path / "d.csv"), count=40, kind="mislabeled", out=tmp_path / "c", label_column="label")
    with np.load(tmp_path / "c" / "insert.npz", allow_pickle=False) as z:
        Xi, yi = z["X"], z["y"]
    assert len(yi) > 0 and set(yi.tolist()) <= {*labels}
    for x, label in zip(Xi, yi, strict=True):  # each inserted record copies a data record, with the other label
        (row,) = np.flatnonzero(np.all(np.isclose(X, x, atol=1e-6), axis=1))[:1]
        assert label != y[row]


def test_outlier_canaries_are_built_a_block_of_members_at_a_time(tmp_path, monkeypatch):
    """Outlier canaries made the members float64 and a standardised float64 twin (2 x 172 MB for 7,000 CIFAR
    images; `train --canaries 50 --canary-kind outlier` on 20,000 uint8 images peaked 270 MB above the run
    without). Now the mean, scale and largest norm come a block of rows at a time: the canaries are bit for bit
    those of the old formula over the whole float64 array (the oracle below), with a fraction of the memory."""
    import tracemalloc

    import dpaudit.data as data_module

    rng = np.random.default_rng(4)
    X = rng.integers(0, 256, (900, 3, 8, 8), dtype=np.uint8)
    np.savez(tmp_path / "img.npz", X=X, y=np.arange(900) % 3)
    ds = load_dataset(str(tmp_path / "img.npz"))
    splits = make_splits(len(ds), 0)
    monkeypatch.setattr(data_module, "FIT_BLOCK_BYTES", 64 * 192 * 8 + 5)  # blocks of 64 rows, the last partial
    tracemalloc.start()
    try:
        got = make_canaries(ds, splits, m=7, kind="outlier", seed=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    train = X[splits.members].reshape(len(splits.members), -1).astype(np.float64)  # the old formula, whole
    mean, std = train.mean(0), train.std(0)
    std = np.where(std > 1e-12, std, 1.0)
    top = np.linalg.norm((train - mean) / std, axis=1).max()
    r = np.random.default_rng([2, 0xCA4A])
    d = r.normal(size=(7, train.shape[1]))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    want = (d * 3.0 * top * std + mean).reshape((7, 3, 8, 8)).astype(np.float32)
    assert np.array_equal(got.X, want) and np.array_equal(got.y, r.integers(0, 3, size=7))
    assert peak < train.nbytes  # the old way held train and Z (2 x train.nbytes) at once


def test_clipbkd_canaries_sit_at_the_members_median_norm_in_the_members_standardisation(digits):
    """ClipBKD (Jagielski et al. 2020) standardises the members and puts each canary along a least-variance
    principal direction at the members' median norm. Oracle: numpy's mean and std of the members (1 where a pixel
    is constant): every canary's standardised norm is that median (mutant: the moments of another split, the
    holdout, passed every fast test)."""
    ds, splits = digits
    c = make_canaries(ds, splits, m=6, kind="clipbkd", seed=0)
    train = ds.X[splits.members].reshape(len(splits.members), -1).astype(np.float64)
    mean, std = train.mean(axis=0), train.std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    median = np.median(np.linalg.norm((train - mean) / std, axis=1))
    norms = np.linalg.norm((c.X.reshape(6, -1).astype(np.float64) - mean) / std, axis=1)
    np.testing.assert_allclose(norms, median, rtol=1e-5)  # the float32 records
    assert np.all(c.y == np.argmin(np.bincount(ds.y[splits.members], minlength=ds.n_classes)))
