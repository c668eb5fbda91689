import json
import re

import numpy as np
import pytest

from dpaudit.data import (
    Standardizer,
    fit_preprocessing,
    load_dataset,
    make_splits,
    preprocessing_from_dict,
    streamed_moments,
)
from dpaudit.errors import DataError, InputError


@pytest.mark.parametrize(
    ("spec", "n", "shape", "classes", "kind"),
    [
        ("digits", 1797, (1, 8, 8), 10, "image"),
        ("breast-cancer", 569, (30,), 2, "tabular"),
        ("wine", 178, (13,), 3, "tabular"),
        ("synthetic:n=300,d=5,classes=3,seed=1", 300, (5,), 3, "tabular"),
        ("synthetic-tokens:n=80,length=12,vocab=30,classes=2", 80, (12,), 2, "tokens"),
    ],
)
def test_embedded_and_synthetic(spec, n, shape, classes, kind):
    ds = load_dataset(spec)
    assert (len(ds), ds.feature_shape, ds.n_classes, ds.kind) == (n, shape, classes, kind)
    assert ds.y.min() == 0 and ds.y.max() == classes - 1
    assert load_dataset(spec).sha256 == ds.sha256  # deterministic content


def test_hash_changes_with_content():
    assert load_dataset("synthetic:seed=1").sha256 != load_dataset("synthetic:seed=2").sha256


def test_csv_and_npz(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,label\n1,2,x\n3,4,y\n5,6,x\n")
    ds = load_dataset(str(csv), label_column="label")
    assert ds.X.shape == (3, 2) and list(ds.y) == [0, 1, 0]
    csv.write_text("a,b,label\n1,2,1.0\n3,4,2\n5,6,-1\n")  # integral floats are class labels
    ds = load_dataset(str(csv), label_column="label")
    assert ds.n_classes == 3 and list(ds.y) == [1, 2, 0]
    npz = tmp_path / "d.npz"
    np.savez(npz, X=np.arange(12.0).reshape(6, 2), y=np.array([0, 1] * 3))
    assert load_dataset(str(npz)).X.shape == (6, 2)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a,b\n1,2\n", "no label column 'label'"),
        ("a,label\nfoo,0\nbar,1\n", "non-numeric feature column"),
        ("a,label\n1,0\nnan,1\n", r"missing values in feature column\(s\) 'a' \(first: data row 2\)"),
        ("a,b,label\n1,2,0\n3,,1\n", r"missing values in feature column\(s\) 'b' \(first: data row 2\)"),
        ("a,label\n1,0\ninf,1\n", "NaN or inf"),
        ("a,label\n1,0\n2,0\n", "single class"),
        ("a,label\n", "empty"),
        ("", "empty"),
        ("a,label\n1,\n2,1\n", "missing values"),
        # regression targets: every distinct value would silently become a class of its own
        ("a,label\n1,0.25\n2,1.5\n3,0.25\n", "regression targets are not supported"),
        # pandas' to_csv(index=True): the row number would be read as a feature
        (",a,label\n0,1,0\n1,2,1\n2,3,0\n", "column 1 has no header name"),
        ("Unnamed: 0,a,label\n0,1,0\n1,2,1\n2,3,0\n", "as the row index that pandas' to_csv writes"),
    ],
)
def test_bad_csv(tmp_path, content, message):
    f = tmp_path / "bad.csv"
    f.write_text(content)
    with pytest.raises(DataError, match=message):
        load_dataset(str(f), label_column="label")


@pytest.mark.parametrize("form", ["csv", "npz", "npy-dir"])
def test_features_beyond_float32_are_refused(tmp_path, form):
    """Float64 features above float32's largest value (3.4e38) are finite as read but inf in float32, the dtype models
    compute in: the scaler's mean became inf and training saved a NaN model with exit 0 (CSV and NPZ, cast on
    loading; a memory-mapped X.npy, cast a batch at a time). Refused on loading, naming the magnitude."""
    X = np.array([[1.0, 2.0], [3.0, -1e39], [5.0, 6.0], [7.0, 8.0]])
    y = np.array([0, 1, 0, 1])
    if form == "csv":
        path = tmp_path / "d.csv"
        path.write_text("a,b,label\n" + "".join(f"{a!r},{b!r},{c}\n" for (a, b), c in zip(X.tolist(), y, strict=True)))
    elif form == "npz":
        path = tmp_path / "d.npz"
        np.savez(path, X=X, y=y)
    else:
        path = tmp_path / "d"
        path.mkdir()
        np.save(path / "X.npy", X)
        np.save(path / "y.npy", y)
    with pytest.raises(DataError, match=r"features reach 1e\+39 in magnitude, beyond 3\.403e\+38, the largest float32"):
        load_dataset(str(path), label_column="label" if form == "csv" else None)
    X[1, 1] = -3.4e38  # within float32: read as it is
    if form == "csv":
        path.write_text("a,b,label\n" + "".join(f"{a!r},{b!r},{c}\n" for (a, b), c in zip(X.tolist(), y, strict=True)))
    elif form == "npz":
        np.savez(path, X=X, y=y)
    else:
        np.save(path / "X.npy", X)
    ds = load_dataset(str(path), label_column="label" if form == "csv" else None)
    assert np.all(np.isfinite(ds.rows(np.arange(4))))


def test_complex_features_are_refused_not_cast_to_their_real_parts(tmp_path):
    """A complex64 X trained silently on X.real (NumPy's cast drops the imaginary parts with a ComplexWarning)."""
    path = tmp_path / "d.npz"
    np.savez(path, X=np.array([[1 + 2j], [3 - 1j], [0.5j], [2]], np.complex64), y=np.array([0, 1, 0, 1]))
    with pytest.raises(DataError, match=r"X is complex \(dtype complex64\); dpaudit reads real features"):
        load_dataset(str(path))
    np.savez(path, X=np.zeros((4, 2), "V2"), y=np.array([0, 1, 0, 1]))  # how ml_dtypes' bfloat16 is stored
    with pytest.raises(DataError, match=r"got dtype \|V2; a bfloat16 array is stored so: save X.astype\('float32'\)"):
        load_dataset(str(path))


def test_a_label_close_to_an_integer_is_shown_with_its_digits(tmp_path):
    """A label 1.0000001 was refused as "non-integer values (e.g. 1)": the message showed an integer."""
    path = tmp_path / "d.npz"
    np.savez(path, X=np.zeros((4, 2)), y=np.array([0.0, 1.0000001, 0.0, 1.0000001]))
    with pytest.raises(DataError, match=r"non-integer values \(e\.g\. 1\.0000001\)"):
        load_dataset(str(path))


def test_a_named_row_id_column_is_refused_and_near_misses_are_features(tmp_path):
    """A Kaggle-style `PassengerId` (1..n, shuffled) names each record: refused, naming the column. A column
    that misses being a row id by one value (a repeat, a gap) or is float, or a file below 20 rows, is read."""
    rng = np.random.default_rng(0)
    n = 40
    ids = rng.permutation(n) + 1
    y = np.arange(n) % 2

    def rows(col):
        return "PassengerId,a,label\n" + "".join(f"{i},{a},{c}\n" for i, a, c in zip(col, ids * 0.5, y, strict=True))

    f = tmp_path / "ids.csv"
    f.write_text(rows(ids))
    with pytest.raises(
        DataError, match=r"feature column 'PassengerId' holds 40 distinct consecutive integers \(1\.\.40\)"
    ):
        load_dataset(str(f), label_column="label")
    for near in (np.where(ids == 40, 1, ids), np.where(ids == 40, 41, ids), ids + 0.5):  # a repeat; a gap; floats
        f.write_text(rows(near))
        assert load_dataset(str(f), label_column="label").X.shape == (n, 2)
    small = "PassengerId,a,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(19))
    f.write_text(small)
    assert load_dataset(str(f), label_column="label").X.shape == (19, 2)


def test_a_single_npy_file_points_to_its_directory(tmp_path):
    np.save(tmp_path / "X.npy", np.zeros((4, 2), np.float32))
    with pytest.raises(DataError, match=r"use .csv or .npz, or give the directory that holds X.npy and y.npy"):
        load_dataset(str(tmp_path / "X.npy"))


def test_bad_npz(tmp_path):
    f = tmp_path / "obj.npz"
    np.savez(f, X=np.array([{"a": 1}, {"b": 2}], dtype=object), y=np.array([0, 1]))
    with pytest.raises(DataError, match="pickle"):
        load_dataset(str(f))
    g = tmp_path / "noy.npz"
    np.savez(g, X=np.zeros((3, 2)))
    with pytest.raises(DataError, match="'X' and 'y'"):
        load_dataset(str(g))
    h = tmp_path / "junk.npz"
    h.write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable NPZ"):
        load_dataset(str(h))


def test_unknown_and_missing():
    with pytest.raises(InputError, match="unknown data 'nope'; valid: digits"):
        load_dataset("nope")
    with pytest.raises(DataError, match="no such file"):
        load_dataset("/nonexistent/x.csv")


def test_csv_needs_label_column(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="needs --label-column"):
        load_dataset(str(f))


def test_splits_deterministic_and_disjoint():
    a, b = make_splits(1000, seed=3), make_splits(1000, seed=3)
    for x, y in zip(a.as_dict().values(), b.as_dict().values(), strict=True):
        np.testing.assert_array_equal(x, y)
    allidx = np.concatenate(list(a.as_dict().values()))
    assert len(np.unique(allidx)) == len(allidx) <= 1000
    assert not np.array_equal(a.members, make_splits(1000, seed=4).members)


def test_standardizer_fitted_on_train_only_and_round_trip():
    ds = load_dataset("wine")
    sp = make_splits(len(ds), 0)
    pre = fit_preprocessing(ds, sp.members)
    Z = pre.transform(ds.X[sp.members])
    np.testing.assert_allclose(Z.mean(0), 0, atol=1e-5)
    again = preprocessing_from_dict(pre.to_dict())
    assert isinstance(again, Standardizer)
    np.testing.assert_array_equal(again.transform(ds.X), pre.transform(ds.X))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # an edited checkpoint.json's preprocessing: 0 or 1e-46 (0 in float32) made every feature inf, 1e39 inf
        ("scale", 0.0, "expected scale to be positive everywhere"),
        ("scale", 1e-46, "'scale' holds 1e-46, outside 1.175e-38 to 3.403e+38, float32's normal range"),
        ("mean", -1e39, "'mean' holds 1e+39, beyond 3.403e+38, the largest float32"),
    ],
)
def test_a_recorded_standardisation_beyond_float32_is_refused(field, value, message):
    d = {"kind": "standardize", "shape": [2], "mean": [0.0, 1.0], "scale": [1.0, 2.0]}
    preprocessing_from_dict(d)
    with pytest.raises(InputError, match=re.escape(message)):
        preprocessing_from_dict({**d, field: [value, 1.0]})


def test_8bit_images_are_kept_as_uint8_and_read_as_float32_per_batch(tmp_path):
    """uint8 images (CIFAR as an NPZ: 150 MiB) were held as float32 (600 MiB): now X stays the file's uint8 and
    every read of rows gives float32, the values the whole X made float32 held (float32 holds 8-bit integers
    exactly); the data hash is the float32 array's, as before (runs recorded then still match). numpy reports
    its buffers to tracemalloc: the load costs the uint8 array, not 4 times it."""
    import tracemalloc

    X = np.random.default_rng(0).integers(0, 256, size=(1000, 3, 16, 16), dtype=np.uint8)
    np.savez(tmp_path / "img.npz", X=X, y=np.arange(1000) % 10)
    np.savez(tmp_path / "img32.npz", X=X.astype(np.float32), y=np.arange(1000) % 10)
    np.savez(tmp_path / "img64.npz", X=X.astype(np.float64), y=np.arange(1000) % 10)
    tracemalloc.start()
    try:
        ds = load_dataset(str(tmp_path / "img.npz"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ds.X.dtype == np.uint8 and ds.X.nbytes == X.nbytes and np.array_equal(ds.X, X)
    assert peak < 2.5 * X.nbytes  # the file's uint8 (read once) + small; float32 added 4 bytes a pixel
    old = X.astype(np.float32)
    idx = np.array([999, 0, 17, 17, 500])
    assert ds.dtype == np.float32 and ds.describe()["dtype"] == "float32"
    for got, want in ((ds.rows(idx), old[idx]), (ds.view(idx)[1:4], old[idx][1:4])):
        assert got.dtype == np.float32 and np.array_equal(got, want)
    assert (
        ds.sha256
        == load_dataset(str(tmp_path / "img32.npz")).sha256
        == load_dataset(str(tmp_path / "img64.npz")).sha256
    )
    f32 = load_dataset(str(tmp_path / "img32.npz"))
    pre, pre32 = fit_preprocessing(ds, np.arange(600)), fit_preprocessing(f32, np.arange(600))
    assert np.array_equal(pre.mean, pre32.mean) and np.array_equal(pre.scale, pre32.scale)
    assert np.array_equal(pre.transform(ds.rows(idx)), pre32.transform(f32.X[idx]))


def test_a_constant_feature_is_passed_through_not_divided_by_its_zero_spread(tmp_path):
    """A blank pixel (the same value in every row) has standard deviation 0: its scale is 1, so standardising it
    gives 0, not nan (0/0) in every row (mutant: the 1 dropped from data._moments passed the fast tier)."""
    X = np.random.default_rng(5).integers(0, 256, size=(60, 1, 2, 2), dtype=np.uint8)
    X[:, 0, 1, 1] = 255
    np.savez(tmp_path / "c.npz", X=X, y=np.arange(60) % 2)
    ds = load_dataset(str(tmp_path / "c.npz"))
    pre = fit_preprocessing(ds, np.arange(50))
    assert pre.scale[0, 1, 1] == 1.0 and np.all(pre.scale[0].ravel()[:3] > 1.0)
    z = pre.transform(ds.rows(np.arange(60)))
    assert np.all(np.isfinite(z)) and np.all(z[:, 0, 1, 1] == 0.0)
    # an empty split has no moments: one line, not a TypeError from None / 0 (mutant: the n == 0 check dropped)
    with pytest.raises(InputError, match=r"^cannot fit a standardisation on an empty split$"):
        streamed_moments(ds, np.array([], dtype=np.int64))


def test_8bit_image_npy_directory_is_mapped_as_uint8(tmp_path):
    """A folder whose X.npy is uint8 was refused ("X must be a floating-point array"; convert to float32, 4 times
    the file): now it is memory-mapped as uint8 like any X.npy and read as float32 a batch at a time, the same
    rows and data hash as the NPZ of the same arrays."""
    X = np.random.default_rng(1).integers(0, 256, size=(300, 3, 8, 8), dtype=np.uint8)
    y = np.arange(300) % 3
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "X.npy", X)
    np.save(tmp_path / "d" / "y.npy", y)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    ds, npz = load_dataset(str(tmp_path / "d")), load_dataset(str(tmp_path / "d.npz"))
    assert ds.mapped is not None and ds.X.dtype == np.uint8 and ds.dtype == np.float32
    idx = np.array([5, 299, 0])
    assert ds.rows(idx).dtype == np.float32 and np.array_equal(ds.rows(idx), X[idx].astype(np.float32))
    assert ds.sha256 == npz.sha256
    # bool features (binary masks) too, as the refusal below says (mutant: bool dropped from compact_dtype, so
    # such a folder was refused "X must be ... or bool")
    (tmp_path / "b").mkdir()
    np.save(tmp_path / "b" / "X.npy", X > 127)
    np.save(tmp_path / "b" / "y.npy", y)
    masks = load_dataset(str(tmp_path / "b"))
    assert masks.mapped is not None and masks.X.dtype == bool and masks.dtype == np.float32
    assert np.array_equal(masks.rows(idx), (X[idx] > 127).astype(np.float32))
    # a float16 X.npy is read in the file's own dtype, as before uint8 was kept (its data hash, recorded in runs,
    # is the float16 array's; mutant: every 16-bit number made compact, so float16 rows came back float32)
    (tmp_path / "h").mkdir()
    np.save(tmp_path / "h" / "X.npy", X.astype(np.float16))
    np.save(tmp_path / "h" / "y.npy", y)
    half = load_dataset(str(tmp_path / "h"))
    assert half.dtype == np.float16 and half.rows(idx).dtype == np.float16
    # 32-bit integers are not kept and read as float32 (2**24 + 1 is no float32): that image X.npy is refused
    # (a 2-D one holds token ids)
    (tmp_path / "w").mkdir()
    np.save(tmp_path / "w" / "X.npy", np.full((300, 1, 2, 2), 2**24 + 1, dtype=np.int32))
    np.save(tmp_path / "w" / "y.npy", y)
    with pytest.raises(DataError, match=r"8- or 16-bit integers or bool .*got dtype int32"):
        load_dataset(str(tmp_path / "w"))


def test_standardizer_fits_and_transforms_without_copies_of_the_split(tmp_path, monkeypatch):
    """Fitting the scaler on an in-memory (NPZ) training split copied the split (float32) and then made it
    float64 twice over in ``X.std`` (820 MiB to fit 17,500 CIFAR images of 205 MiB); the transform made three
    float32 arrays of the split's size where one is the answer. Now a block of rows at a time, and one array;
    the mean and scale are bit for bit the float64 ``mean``/``std`` of the whole split, whatever the block."""
    import tracemalloc

    from dpaudit import data

    rng = np.random.default_rng(0)
    X = (rng.normal(size=(1200, 3, 16, 16)) * 20 + 100).astype(np.float32)
    np.savez(tmp_path / "img.npz", X=X, y=np.arange(1200) % 10)
    ds, idx = load_dataset(str(tmp_path / "img.npz")), np.arange(0, 1200, 2)  # the split: 600 rows, 1.8 MB
    split_bytes = X[idx].nbytes
    monkeypatch.setattr(data, "FIT_BLOCK_BYTES", 1 << 18, raising=False)  # 256 KiB blocks
    tracemalloc.start()
    try:
        pre = fit_preprocessing(ds, idx)
        fit_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        out = pre.transform(ds.X[idx])  # the rows' copy (X[idx]) counts too
        transform_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert fit_peak < split_bytes / 2  # the old fit: 1 + 2 + 2 times the split
    assert transform_peak < 2.2 * split_bytes  # the rows' copy and the answer; the old transform: 3 times
    X64 = X[idx].astype(np.float64)
    assert np.array_equal(pre.mean, X64.mean(axis=0).astype(np.float32))
    assert np.array_equal(pre.scale, X64.std(axis=0).astype(np.float32))
    assert np.array_equal(out, ((X[idx] - pre.mean) / pre.scale).astype(np.float32))
    for batch in (1, 7, 600):  # any block gives the same bits, and a caller's float64 array is left as it was
        kept = X64.copy()
        again = Standardizer.fit(kept, batch=batch)
        assert np.array_equal(again.mean, pre.mean) and np.array_equal(again.scale, pre.scale)
        assert np.array_equal(kept, X64)
        # the float64 sums themselves, of values whose sums round (float32 pixels sum exactly in float64)
        Y = rng.normal(size=(600, 5))
        blocks = (Y[s : s + batch] for s in range(0, len(Y), batch))
        assert np.array_equal(data.sequential_sum(blocks, (5,)), Y.sum(axis=0))
    assert again.transform(X64[:3]).dtype == np.float32  # float32 out of a float64 input, as a model takes
    # the streamed fit reads the dataset's rows in blocks of the size asked for (mutant: ``batch`` ignored, so the
    # loop above would prove nothing for it), with the same bits
    assert [len(b) for b in data.row_blocks(ds, idx[:15], batch=7)] == [7, 7, 1]
    streamed = Standardizer.fit_streamed(ds, idx, batch=7)
    assert np.array_equal(streamed.mean, pre.mean) and np.array_equal(streamed.scale, pre.scale)
    assert data._fit_block_rows((1 << 16,)) == 1  # a record above the (patched) block size: one row, never 0


def _labelled(tmp_path, labels):
    """A CSV dataset ``d`` of four records whose label column holds ``labels`` twice (numbers or strings)."""
    return load_dataset(str(_labelled_csv(tmp_path / "d.csv", labels * 2)), label_column="label")


@pytest.mark.parametrize(
    ("labels", "given", "indices"),
    [
        ([1, 2], "2", (1,)),  # index 1 is the label 2: "2" means the label, not an index out of range
        ([1, 2], "2.0, 1", (1, 0)),
        ([-1, 1], "-1", (0,)),
        (["cat", "dog"], " dog", (1,)),
        (["cat", "dog"], ["dog", "cat"], (1, 0)),
        ([1, 2], None, (0, 1)),
    ],
)
def test_class_indices_take_the_datas_labels(tmp_path, labels, given, indices):
    ds = _labelled(tmp_path, labels)
    assert ds.class_indices(given) == indices
    assert [ds.label(k) for k in range(2)] == labels


def test_float_labels_are_named_as_the_integers_they_hold(tmp_path):
    """An NPZ whose y is a float array (1.0, 2.0: what numpy code often saves) has the labels 1 and 2."""
    np.savez(tmp_path / "f.npz", X=np.zeros((4, 2), np.float32), y=np.array([1.0, 2.0, 1.0, 2.0]))
    ds = load_dataset(str(tmp_path / "f.npz"))
    assert ds.class_indices("2") == (1,) and ds.class_indices("1.0") == (0,) and ds.label(1) == 2


@pytest.mark.parametrize(
    ("labels", "given", "message"),
    [
        ([1, 2], "0", r"'0' is not a label of d \(its labels: 1, 2\); give the labels as your data holds them"),
        ([-1, 1], "0", "'0' is not a label"),
        (["cat", "dog"], "1", r"'1' is not a label of d \(its labels: cat, dog\)"),
        ([1, 2], "1,1", "labels repeat"),
        ([1, 2], "one", "'one' is not a label"),
    ],
)
def test_class_indices_refuse_indices_and_unknown_labels(tmp_path, labels, given, message):
    with pytest.raises(InputError, match=message):
        _labelled(tmp_path, labels).class_indices(given)


def _labelled_csv(path, labels):
    rng = np.random.default_rng(0)
    rows = [f"{a:.3f},{b:.3f},{y}" for (a, b), y in zip(rng.normal(size=(len(labels), 2)), labels, strict=True)]
    path.write_text("a,b,label\n" + "\n".join(rows) + "\n")
    return path


def test_labels_that_look_like_a_quantity_warn_at_train_and_import(tmp_path):
    """Ages 18..90 became a 70-class classifier without a word; class ids 0..K-1 or 1..K, strings, and fewer
    than QUANTITY_MIN_CLASSES values do not warn. The warning reaches `train`'s output and an import's."""
    from dpaudit.data import QUANTITY_MIN_CLASSES
    from tests.core.cli_errors import invoke

    rng = np.random.default_rng(1)
    ages = _labelled_csv(tmp_path / "ages.csv", rng.integers(18, 91, size=300))
    k = QUANTITY_MIN_CLASSES
    quiet = {
        "ids0": np.arange(300) % k,
        "ids1": np.arange(300) % k + 1,
        "few": np.arange(300) % (k - 1) + 50,  # 19 values from 50: not enough to read as a quantity
        "names": np.array([f"c{i}" for i in np.arange(300) % (k + 5)]),
    }
    warned = load_dataset(str(ages), label_column="label").label_warnings
    assert len(warned) == 1 and "from 18 to 90" in warned[0] and "bin it into classes" in warned[0]
    for name, labels in quiet.items():
        assert (
            load_dataset(str(_labelled_csv(tmp_path / f"{name}.csv", labels)), label_column="label").label_warnings
            == []
        )
    r = invoke("train", "--data", ages, "--label-column", "label", "--epochs", 1, "--out", tmp_path / "run")
    assert r.exit_code == 0 and "distinct numbers from 18 to 90" in r.stderr, r.output
    spec = json.loads((tmp_path / "run" / "checkpoint.json").read_text())["model"]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "members.txt").write_text("\n".join(map(str, range(150))))
    r = invoke(
        "import", tmp_path / "run" / "model.safetensors", "--model-spec", tmp_path / "spec.json", "--data", ages,
        "--label-column", "label", "--members", tmp_path / "members.txt", "--out", tmp_path / "imported",
    )  # fmt: skip
    assert r.exit_code == 0 and "distinct numbers from 18 to 90" in r.stderr, r.output


def test_data_doc_names_every_key_checkpoint_json_records():
    """docs/data.md, "What the checkpoint records about the data": it left out `from_run` and `vocab_size` and
    said `dtype` is X's as stored, while uint8 pixels record "float32" (the dtype rows are read in)."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    paragraph = doc.split("## What the checkpoint records about the data", 1)[1]
    recorded = set(load_dataset("digits").describe()) | {"from_run"}  # from_run: added by save for a relative path
    assert not [k for k in sorted(recorded) if f"`{k}`" not in paragraph]
    assert "`float32` for an `X` stored as 8- or 16-bit integers" in " ".join(paragraph.split())
