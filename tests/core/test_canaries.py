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


def _traced_canaries(tmp_path, monkeypatch, X, y, **kw):
    """``make_canaries(**kw)`` on ``X, y`` (an NPZ in ``tmp_path``) at the default split, the members read in blocks
    of 64 rows (the last partial), and the traced peak of the call: (dataset, splits, canaries, peak)."""
    import tracemalloc

    import scipy.linalg  # noqa: F401  (imported before tracing: its import is not the canaries' memory)

    import dpaudit.data as data_module

    np.savez(tmp_path / "img.npz", X=X, y=y)
    ds = load_dataset(str(tmp_path / "img.npz"))
    splits = make_splits(len(ds), 0)
    monkeypatch.setattr(data_module, "FIT_BLOCK_BYTES", 64 * X[0].size * 8 + 5)
    tracemalloc.start()
    try:
        got = make_canaries(ds, splits, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return ds, splits, got, peak


def test_outlier_canaries_are_built_a_block_of_members_at_a_time(tmp_path, monkeypatch):
    """Outlier canaries made the members float64 and a standardised float64 twin (2 x 172 MB for 7,000 CIFAR
    images; `train --canaries 50 --canary-kind outlier` on 20,000 uint8 images peaked 270 MB above the run
    without). Now the mean, scale and largest norm come a block of rows at a time: the canaries are bit for bit
    those of the old formula over the whole float64 array (the oracle below), with a fraction of the memory."""
    X = np.random.default_rng(4).integers(0, 256, (900, 3, 8, 8), dtype=np.uint8)
    _, splits, got, peak = _traced_canaries(tmp_path, monkeypatch, X, np.arange(900) % 3, m=7, kind="outlier", seed=2)
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


@pytest.mark.parametrize("n", [3000, 60])
def test_clipbkd_canaries_are_the_least_variance_directions_without_an_n_by_d_copy(tmp_path, monkeypatch, n):
    """ClipBKD's direction was the SVD of the members' whole standardised float64 matrix (7,000 CIFAR images: 2
    minutes and 1.5 GB). With more members than features it is now the eigenvectors of least eigenvalue of the d × d
    scatter matrix, summed a block of rows at a time: the canaries equal the old formula's (the oracle below, the
    whole array's SVD with the sign fixed by the largest entry) to float32 rounding, and the traced peak stays under
    one float64 copy of the members. The data have distinct feature variances (gaps ~0.4 at the bottom, largest
    ~10⁴ × n), so eigh's direction error, O(ε λ_max / gap) ≈ 1e-10, is far below float32's 6e-8. With fewer members
    (21) than features the SVD of the n × d matrix is taken as before."""
    rng = np.random.default_rng(5)
    q, _ = np.linalg.qr(rng.normal(size=(48, 48)))
    X = ((rng.normal(size=(n, 48)) * np.linspace(1.0, 20.0, 48)) @ q).reshape(n, 3, 4, 4) + 40.0
    y = np.arange(n) % 3
    ds, splits, got, peak = _traced_canaries(
        tmp_path, monkeypatch, X.astype(np.float32), y, m=4, kind="clipbkd", seed=2
    )
    train = ds.X[splits.members].reshape(len(splits.members), -1).astype(np.float64)  # the old formula, whole
    mean, std = train.mean(0), train.std(0)
    Z = (train - mean) / std
    low = np.linalg.svd(Z - Z.mean(0), full_matrices=False)[2][::-1]
    low *= np.sign(low[np.arange(len(low)), np.abs(low).argmax(axis=1)])[:, None]
    r = np.random.default_rng([2, 0xCA4A])
    dirs = low[np.arange(4) % len(low)] * r.choice([-1.0, 1.0], size=(4, 1))
    want = (dirs * np.median(np.linalg.norm(Z, axis=1)) * std + mean).reshape((4, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(got.X, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    counts = np.bincount(ds.y[splits.members], minlength=3)
    assert np.all(got.y == np.argmin(counts)) and np.array_equal(got.included, r.random(4) < 0.5)
    if len(train) > 48:
        assert peak < train.nbytes  # the old way held the members, Z, Zc and the SVD's U (4 x train.nbytes) at once


@pytest.mark.parametrize("n", [3000, 60])
def test_more_clipbkd_canaries_than_directions_cycle_through_them(tmp_path, n):
    """ClipBKD has min(n, d) directions (the SVD's right singular vectors of the n x d members, or the d x d scatter
    matrix's eigenvectors): canary j takes direction j mod min(n, d), so with more canaries than that the directions
    repeat (up to ClipBKD's random sign) and the first min(n, d) are orthonormal. 21 members (n = 60) or 48 features
    (n = 3000) against 25 and 50 canaries (mutants: the count of directions max(n, d), or all m asked of eigh,
    passed every fast test: only m <= min(n, d) was tested; they raised IndexError and 'subset_by_index' errors)."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(n, 48)) * np.linspace(1.0, 20.0, 48) + 40.0
    np.savez(tmp_path / "x.npz", X=X.astype(np.float32), y=np.arange(n) % 3)
    ds = load_dataset(str(tmp_path / "x.npz"))
    splits = make_splits(len(ds), 0)
    rank = min(len(splits.members), 48)
    m = rank + 2
    c = make_canaries(ds, splits, m=m, kind="clipbkd", seed=1)
    train = ds.X[splits.members].astype(np.float64)
    mean, std = train.mean(0), train.std(0)
    dirs = (c.X.astype(np.float64) - mean) / std
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    np.testing.assert_allclose(dirs[:rank] @ dirs[:rank].T, np.eye(rank), atol=1e-4)  # float32 records
    np.testing.assert_allclose(np.abs(np.sum(dirs[rank:] * dirs[: m - rank], axis=1)), 1.0, atol=1e-4)


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


@pytest.mark.parametrize(
    "edit", [{"feature_shape": ["x"]}, {"feature_shape": 5}, {"n_classes": "abc"}, {"n_classes": None}]
)
def test_an_edited_canary_design_is_a_one_line_refusal(tmp_path, edit):
    """`dpaudit import --canaries DIR` with a canaries.json whose feature_shape or n_classes is no integer ended in
    "internal error: ValueError: invalid literal for int()" (exit 3): parsed outside the checked block."""
    import json

    from dpaudit.canaries import make_canary_dir, read_canary_dir

    make_canary_dir("digits", count=4, kind="mislabeled", out=tmp_path / "c")
    design = json.loads((tmp_path / "c" / "canaries.json").read_text())
    (tmp_path / "c" / "canaries.json").write_text(json.dumps({**design, **edit}))
    with pytest.raises(InputError, match="malformed canary directory"):
        read_canary_dir(tmp_path / "c", load_dataset("digits"))
