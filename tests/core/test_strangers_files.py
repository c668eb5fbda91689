"""Files from strangers and interrupted runs (non-negotiable 3): data files cut short or of the wrong shape, run
folders edited by hand. Every problem is one line with exit code 2; nothing is unpickled."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from dpaudit.data import load_dataset, read_member_indices
from dpaudit.errors import DataError

X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int64)


def _npy(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


@pytest.mark.parametrize(
    ("x", "y", "message"), [(np.float32(3), Y, "X must hold one row"), (X, np.int64(1), "y must hold one row")]
)
def test_a_single_value_for_x_or_y_is_one_line(tmp_path, x, y, message):
    """np.savez(f, X=..., y=3): was an IndexError (exit 3, 'tuple index out of range')."""
    np.savez(tmp_path / "d.npz", X=x, y=y)
    with pytest.raises(DataError, match=f"{message} per record, got a single value"):
        load_dataset(str(tmp_path / "d.npz"))


def test_a_data_file_cut_short_is_not_called_a_pickle(tmp_path):
    """A copy or download interrupted midway: numpy's ValueError was reported as 'object arrays are refused'
    (NPY directory, NPZ member, member list), which sent the user looking for a pickle that is not there."""
    d = tmp_path / "dir"
    d.mkdir()
    (d / "X.npy").write_bytes(_npy(X)[:-100])  # X is memory-mapped: "mmap length is greater than file size"
    np.save(d / "y.npy", Y)
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        z.writestr("X.npy", _npy(X)[:-100])
        z.writestr("y.npy", _npy(Y))
    (tmp_path / "members.npy").write_bytes(_npy(np.arange(20))[:-8])
    for load in (
        lambda: load_dataset(str(d)),
        lambda: load_dataset(str(tmp_path / "short.npz")),
        lambda: read_member_indices(tmp_path / "members.npy", 40),
    ):
        with pytest.raises(DataError, match="truncated or corrupt") as e:
            load()
        assert "pickle" not in str(e.value) and "object arrays" not in str(e.value)
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", np.array(list(Y), dtype=object), allow_pickle=True)  # a real object array: still said so
    with pytest.raises(DataError, match="object arrays are refused"):
        load_dataset(str(d))
