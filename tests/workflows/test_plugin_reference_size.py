"""The plug-in contract's ``reference_size`` keyword and the dependence check (issue 25, item 4).

A trainer that sets q = B / len(X), or divides by q · len(X), runs a different mechanism on the two
add/remove neighbours (N and N + 1 records). The contract passes one fixed reference size (N + 1) on both
sides; before an add/remove audit, the trainer is run on the N OUT records with the same seed, told the
mechanism is for N + 1 records and for N (with and without the extra record), and confirmed with
2(N + 1) when the weights coincide. Realistic NumPy DP-SGD trainers (logistic regression, Poisson
sampling, clipping, Gaussian noise): the two len(X) mistakes are reported, the correct one is not — even
when its weights coincide for N and N + 1 by chance (B = 1, T = 4: a draw falls between B/(N+1) and B/N
with probability only about 1 − exp(−T·B/N) ≈ 0.08), which the 2(N + 1) confirmation sorts out.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.data import load_dataset
from dpaudit.models import default_spec
from dpaudit.plugins import reference_size_note
from dpaudit.seeding import numpy_rng
from dpaudit.workflows import audit_training

BATCH = 1.0  # B, the expected batch size
STEPS = 4
SAMPLE_RATE = 0.02  # the fixed q of the trainer that divides by q·len(X)
CALLS: list[tuple[str, int, int]] = []


def _dpsgd(X, y, seed, *, q: float, divisor: float) -> dict[str, np.ndarray]:
    """DP-SGD on multinomial logistic regression: Poisson sampling at q, clip 1, N(0, 1) on the sum, /divisor."""
    X = np.asarray(X, dtype=np.float64).reshape(len(X), -1)
    sampling, noise = numpy_rng(seed, stream=0), numpy_rng(seed, stream=1)
    W, b = np.zeros((10, X.shape[1])), np.zeros(10)
    for _ in range(STEPS):
        batch = sampling.random(len(X)) < q
        z = X[batch] @ W.T + b
        p = np.exp(z - z.max(axis=1, keepdims=True))
        g = p / p.sum(axis=1, keepdims=True)
        g[np.arange(batch.sum()), y[batch]] -= 1.0
        g *= np.minimum(1.0, 1.0 / (np.linalg.norm(g, axis=1) * np.sqrt((X[batch] ** 2).sum(1) + 1)))[:, None]
        W -= (g.T @ X[batch] + noise.normal(size=W.shape)) / divisor
        b -= (g.sum(axis=0) + noise.normal(size=b.shape)) / divisor
    return {"1.weight": W.astype(np.float32), "1.bias": b.astype(np.float32)}


def correct(X, y, seed, *, reference_size):
    """q = B / reference_size and the divisor q · reference_size = B: the same mechanism on both neighbours."""
    CALLS.append(("correct", len(X), reference_size))
    return _dpsgd(X, y, seed, q=BATCH / reference_size, divisor=BATCH)


def q_from_len(X, y, seed, *, reference_size):
    """Planted mistake: q = B / len(X) (takes the keyword, ignores it)."""
    CALLS.append(("q_from_len", len(X), reference_size))
    return _dpsgd(X, y, seed, q=BATCH / len(X), divisor=BATCH)


def divides_by_len(X, y, seed, *, reference_size):
    """Planted mistake: a fixed q, but the update divided by the expected batch size q · len(X)."""
    CALLS.append(("divides_by_len", len(X), reference_size))
    return _dpsgd(X, y, seed, q=SAMPLE_RATE, divisor=SAMPLE_RATE * len(X))


def q_from_len_shuffles_in_place(X, y, seed, *, reference_size):
    """Planted mistake q = B / len(X), in a loop that shuffles its records in place (as hand-written loops do):
    each of the check's calls must get the records as they were, or the orders differ and hide the mistake."""
    CALLS.append(("q_from_len_shuffles_in_place", len(X), reference_size))
    perm = np.random.default_rng(seed).permutation(len(X))
    X[:], y[:] = X[perm], y[perm]
    return _dpsgd(X, y, seed, q=BATCH / len(X), divisor=BATCH)


def no_keyword(X, y, seed):
    return _dpsgd(X, y, seed, q=BATCH / len(X), divisor=BATCH)


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return ds, default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)


@pytest.mark.parametrize("trainer", [q_from_len, divides_by_len, q_from_len_shuffles_in_place])
def test_len_x_trainers_are_reported(digits, trainer):
    ds, spec = digits
    X, y = ds.X[:50].astype(np.float32), ds.y[:50].astype(np.int64)
    CALLS.clear()
    note = reference_size_note(trainer, X, y, 0, spec, 51)
    assert note is not None and "seems to ignore it" in note and "50, 51 and 102" in note
    assert [c[1:] for c in CALLS] == [(50, 51), (50, 50), (50, 102)]  # with the extra record, without, confirmed


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correct_trainer_is_not_reported_even_when_n_and_n_plus_1_coincide(digits, seed):
    ds, spec = digits
    X, y = ds.X[:50].astype(np.float32), ds.y[:50].astype(np.int64)
    CALLS.clear()
    assert reference_size_note(correct, X, y, seed, spec, 51) is None
    if seed == 0:  # this seed's draws coincide for N and N + 1: only the 2(N + 1) run tells the keyword is used
        assert [c[1:] for c in CALLS] == [(50, 51), (50, 50), (50, 102)]
    a = correct(X, y, seed, reference_size=51)
    assert not np.array_equal(a["1.weight"], correct(X, y, seed, reference_size=102)["1.weight"])


def test_audit_notes_say_which_trainers_use_len_x(digits):
    """Through the audit: the OUT records (N = 50) are probed with 51 = the reference size both sides get."""
    ds, spec = digits
    kw = dict(claimed_epsilon=1.0, delta=1e-5, runs=2, train_size=50)
    CALLS.clear()
    bad = audit_training(ds, spec, trainer=divides_by_len, **kw)
    assert any("seems to ignore it" in n for n in bad.result.notes)
    assert sorted(c[1:] for c in CALLS) == [(50, 50), *[(50, 51)] * 6, (50, 102), (51, 51), (51, 51)]  # 3 seed probes
    ok = audit_training(ds, spec, trainer=correct, **kw)
    assert not any("reference_size" in n for n in ok.result.notes)
    plain = audit_training(ds, spec, trainer=no_keyword, **kw)
    assert any("does not take reference_size" in n for n in plain.result.notes)
    CALLS.clear()
    same_size = audit_training(ds, spec, trainer=divides_by_len, neighbouring="replace_one", **kw)
    assert not any("reference_size" in n for n in same_size.result.notes)  # N + 1 records on both sides
    assert (
        sorted(c[1:] for c in CALLS) == [(51, 51)] * 7
    )  # the 3 seed probes, no reference_size probe: len(X) is the same for both neighbours
