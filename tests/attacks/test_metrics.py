"""Metrics against hand-made score arrays and brute-force oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attacks.metrics import (
    auc_from_roc,
    bootstrap_ci,
    downsample_roc,
    evaluate,
    roc_curve,
    tpr_at_fpr_from_roc,
)
from attacks.result import AttackResult, load_scores, save_scores
from dpaudit.errors import InputError


def mann_whitney(scores, member) -> float:
    """Oracle: P(member score > non-member score) + 1/2 P(tie), over all pairs."""
    s, m = np.asarray(scores, float), np.asarray(member, bool)
    a, b = s[m][:, None], s[~m][None, :]
    return float(((a > b) + 0.5 * (a == b)).mean())


def brute_roc(scores, member) -> set[tuple[float, float]]:
    """Oracle: (FPR, TPR) of "member iff score >= t" for every distinct t, plus (0, 0)."""
    s, m = np.asarray(scores, float), np.asarray(member, bool)
    pts = {(0.0, 0.0)}
    for t in np.unique(s):
        pred = s >= t
        pts.add((float((pred & ~m).sum() / (~m).sum()), float((pred & m).sum() / m.sum())))
    return pts


class TestHandMade:
    def test_perfect(self):
        m = evaluate([4, 3, 2, 1], [1, 1, 0, 0], n_bootstrap=0)
        assert m["auc"] == 1.0 and m["balanced_accuracy"] == 1.0 and m["advantage"] == 1.0
        assert m["tpr_at_fpr"] == {"0.001": 1.0, "0.01": 1.0, "0.1": 1.0}

    def test_inverted(self):
        m = evaluate([4, 3, 2, 1], [0, 0, 1, 1], n_bootstrap=0)
        assert m["auc"] == 0.0
        assert m["balanced_accuracy"] == 0.5  # the best threshold is "nobody is a member"
        assert m["advantage"] == 0.0
        assert m["tpr_at_fpr"] == {"0.001": 0.0, "0.01": 0.0, "0.1": 0.0}

    def test_all_tied_is_one_point(self):
        fpr, tpr, _thr = roc_curve([1.0, 1.0, 1.0, 1.0], [1, 0, 1, 0])
        np.testing.assert_array_equal(fpr, [0, 1])
        np.testing.assert_array_equal(tpr, [0, 1])
        m = evaluate([1.0] * 4, [1, 0, 1, 0], n_bootstrap=0)
        assert m["auc"] == 0.5 and m["advantage"] == 0.0 and m["tpr_at_fpr"]["0.1"] == 0.0

    def test_partial_ties_count_half(self):
        # pairs (member, non-member): (3,2) win, (3,1) win, (2,2) tie, (2,1) win -> 3.5 / 4
        s, mem = [3, 2, 2, 1], [1, 1, 0, 0]
        fpr, tpr, _ = roc_curve(s, mem)
        np.testing.assert_allclose(fpr, [0, 0, 0.5, 1])
        np.testing.assert_allclose(tpr, [0, 0.5, 1, 1])
        assert evaluate(s, mem, n_bootstrap=0)["auc"] == pytest.approx(0.875)

    def test_infinite_ties_group(self):
        fpr, tpr, _ = roc_curve([np.inf, np.inf, 0.0, -np.inf], [1, 0, 1, 0])
        np.testing.assert_allclose(fpr, [0, 0.5, 0.5, 1])
        np.testing.assert_allclose(tpr, [0, 0.5, 1, 1])

    def test_empty_low_fpr_region_reports_zero(self):
        # The highest score is a non-member: no threshold has FPR 0 except (0, 0).
        s = np.r_[100.0, np.arange(10, 0, -1.0), -np.arange(9.0)]
        mem = np.r_[False, np.ones(10, bool), np.zeros(9, bool)]  # 10 non-members
        m = evaluate(s, mem, n_bootstrap=0)
        assert m["tpr_at_fpr"]["0.001"] == 0.0 and m["tpr_at_fpr"]["0.01"] == 0.0
        assert m["tpr_at_fpr"]["0.1"] == 1.0  # one false positive of 10 is allowed at FPR 10%

    def test_fpr_boundary_is_inclusive(self):
        # 100 non-members: FPR exactly 1% (one FP) counts for the 1% target despite floating point.
        s = np.r_[50.0, 49.0, 48.0, np.arange(100.0) - 200]
        mem = np.r_[True, False, True, np.zeros(100, bool)]
        m = evaluate(s, mem, n_bootstrap=0)
        assert m["tpr_at_fpr"]["0.001"] == 0.5
        assert m["tpr_at_fpr"]["0.01"] == 1.0

    def test_tpr_at_fpr_from_roc_matches(self):
        fpr, tpr, _ = roc_curve([5, 4, 3, 2, 1], [1, 0, 1, 0, 1])
        assert tpr_at_fpr_from_roc(fpr, tpr, 0.4, n_out=2) == pytest.approx(1 / 3)
        assert tpr_at_fpr_from_roc(fpr, tpr, 0.5, n_out=2) == pytest.approx(2 / 3)

    @pytest.mark.parametrize(
        ("scores", "member", "match"),
        [
            ([1.0, np.nan], [1, 0], "NaN"),
            ([1.0, 2.0], [1, 1], "both members and non-members"),
            ([1.0, 2.0, 3.0], [1, 0], "entries"),
            ([[1.0, 2.0]], [[1, 0]], "1-D"),
            ([1.0, 2.0], [2, 0], "boolean"),
        ],
    )
    def test_bad_input(self, scores, member, match):
        with pytest.raises(InputError, match=match):
            evaluate(scores, member)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=2, max_size=40))
def test_roc_and_auc_match_brute_force(pairs):
    scores = np.array([p[0] for p in pairs], float)
    member = np.array([p[1] for p in pairs], bool)
    if member.all() or not member.any():
        return
    fpr, tpr, _ = roc_curve(scores, member)
    assert set(zip(fpr.tolist(), tpr.tolist(), strict=True)) == brute_roc(scores, member)
    assert len(fpr) == len(np.unique(scores)) + 1  # tied scores form one point
    assert auc_from_roc(fpr, tpr) == pytest.approx(mann_whitney(scores, member), abs=1e-12)
    m = evaluate(scores, member, n_bootstrap=0)
    assert m["advantage"] == pytest.approx(np.max(tpr - fpr))
    assert m["balanced_accuracy"] == pytest.approx(0.5 + m["advantage"] / 2)
    for key, target in (("0.001", 0.001), ("0.01", 0.01), ("0.1", 0.1)):
        ok = fpr <= target + 1e-12
        assert m["tpr_at_fpr"][key] == pytest.approx(tpr[ok].max())


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-50, 50), min_size=4, max_size=30), st.floats(0.1, 3))
def test_auc_invariant_under_monotone_maps(scores, scale):
    s = np.array(scores, float) / 10  # well-separated values, so exp keeps them distinct in float64
    member = np.arange(len(s)) % 2 == 0
    a = evaluate(s, member, n_bootstrap=0)["auc"]
    assert evaluate(np.exp(scale * s), member, n_bootstrap=0)["auc"] == pytest.approx(a)
    assert evaluate(-s, member, n_bootstrap=0)["auc"] == pytest.approx(1 - a)


class TestBootstrap:
    def test_seeded_and_contains_estimate(self):
        rng = np.random.default_rng(0)
        member = rng.random(400) < 0.5
        s = rng.normal(size=400) + member
        a = bootstrap_ci(s, member, n_bootstrap=200, seed=3)
        assert a == bootstrap_ci(s, member, n_bootstrap=200, seed=3)
        assert a != bootstrap_ci(s, member, n_bootstrap=200, seed=4)
        auc = evaluate(s, member, n_bootstrap=0)["auc"]
        lo, hi = a["auc"]
        assert lo < auc < hi
        # Standard error of the AUC for n=200+200 at AUC ~0.76 is ~0.024 (Hanley & McNeil 1982):
        # a 95% interval is about 4 SE = 0.1 wide. Loose bounds catch a broken resampler.
        assert 0.05 < hi - lo < 0.15
        assert set(a["tpr_at_fpr"]) == {"0.001", "0.01", "0.1"}

    def test_skip(self):
        assert evaluate([2, 1], [1, 0], n_bootstrap=0)["ci"] == {}


def on_polyline(x: float, y: float, xs: np.ndarray, ys: np.ndarray) -> bool:
    for i in range(len(xs) - 1):
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        if x0 <= x <= x1 and y0 <= y <= y1 and abs((x1 - x0) * (y - y0) - (y1 - y0) * (x - x0)) < 1e-12:
            return True
    return False


def test_downsample_roc_keeps_low_fpr_exactly():
    rng = np.random.default_rng(1)
    member = rng.random(20000) < 0.5
    s = rng.normal(size=20000) + member
    fpr, tpr, _ = roc_curve(s, member)
    assert len(fpr) > 10000
    f2, t2 = downsample_roc(fpr, tpr)
    assert len(f2) <= 500
    assert (f2[0], t2[0], f2[-1], t2[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.all(np.diff(f2) >= 0) and np.all(np.diff(t2) >= 0)
    orig = set(zip(fpr.tolist(), tpr.tolist(), strict=True))
    assert set(zip(f2.tolist(), t2.tolist(), strict=True)) <= orig  # only real operating points
    # The low-FPR part of the curve is unchanged: every original point lies on the thinned polyline.
    for x, y in zip(fpr[fpr <= 0.01], tpr[fpr <= 0.01], strict=True):
        assert on_polyline(x, y, f2, t2), (x, y)
    for target in (0.001, 0.01, 0.1):  # every reported TPR@FPR is read off the thinned curve too
        assert t2[f2 <= target].max() == tpr[fpr <= target].max()


def test_downsample_roc_small_curve_is_lossless():
    fpr, tpr, _ = roc_curve([5, 4, 3, 2, 1, 0], [1, 1, 0, 0, 1, 0])
    f2, t2 = downsample_roc(fpr, tpr)
    np.testing.assert_array_equal(f2, [0, 0, 2 / 3, 2 / 3, 1])
    np.testing.assert_array_equal(t2, [0, 2 / 3, 2 / 3, 1, 1])


class TestAttackResult:
    def result(self) -> AttackResult:
        s = np.array([0.9, 0.1, 0.8, 0.3, 0.5])
        member = np.array([True, False, True, False, False])
        return AttackResult.from_scores("loss", s, member, [10, 11, 12, 13, 14], {"n_reference_models": 3})

    def test_to_dict_contract(self):
        d = self.result().to_dict()
        assert list(d) == [
            "attack", "params", "n_members", "n_nonmembers", "auc", "balanced_accuracy", "advantage",
            "tpr_at_fpr", "tpr_at_fpr_resolved", "ci", "roc", "n_reference_models", "n_shadow_models",
        ]  # fmt: skip
        assert d["auc"] == 1.0 and d["n_members"] == 2 and d["n_nonmembers"] == 3
        assert d["n_reference_models"] == 3 and d["n_shadow_models"] == 0
        assert set(d["ci"]) == {"auc", "balanced_accuracy", "advantage", "tpr_at_fpr"}
        assert "roc" not in self.result().to_dict(include_roc=False)
        import json

        json.dumps(d)  # plain JSON types only

    @pytest.mark.parametrize(
        ("n_out", "resolved"),
        [
            (359, [False, True, True]),
            (999, [False, True, True]),
            (1000, [True, True, True]),
            (99, [False] * 2 + [True]),
        ],
    )
    def test_json_says_which_fprs_the_nonmembers_resolve_by_the_tables_rule(self, n_out, resolved):
        # n non-members resolve an FPR of at least 1/n only; the JSON states it per key, by the same rule
        # as the tables' "n/a" (report._format.tpr_cell).
        from dpaudit.report._format import tpr_cell

        rng = np.random.default_rng(0)
        member = np.r_[np.ones(50, bool), np.zeros(n_out, bool)]
        d = AttackResult.from_scores("loss", rng.normal(size=len(member)) + member, member, np.arange(len(member)),
                                     n_bootstrap=0).to_dict(include_roc=False)  # fmt: skip
        assert d["n_nonmembers"] == n_out and list(d["tpr_at_fpr_resolved"]) == list(d["tpr_at_fpr"])
        assert list(d["tpr_at_fpr_resolved"].values()) == resolved
        assert [not tpr_cell(d, k).startswith("n/a") for k in d["tpr_at_fpr"]] == resolved

    def test_arrays_are_frozen_and_validated(self):
        r = self.result()
        assert r.scores.dtype == np.float64 and r.member.dtype == bool and r.record_ids.dtype == np.int64
        with pytest.raises(ValueError):
            r.scores[0] = 1.0
        with pytest.raises(InputError, match="unique"):
            AttackResult.from_scores("x", [1.0, 2.0], [True, False], [3, 3])

    @pytest.mark.parametrize("suffix", [".csv", ".npz"])
    def test_scores_round_trip_and_no_overwrite(self, tmp_path, suffix):
        r = self.result()
        path = tmp_path / f"scores{suffix}"
        r.save_scores(path)
        back = load_scores(path)
        np.testing.assert_array_equal(back["score"], r.scores)  # 17 significant digits round-trip
        np.testing.assert_array_equal(back["member"], r.member)
        np.testing.assert_array_equal(back["record_id"], r.record_ids)
        assert set(back["attack"].tolist()) == {"loss"}
        with pytest.raises(InputError, match="already exists"):
            r.save_scores(path)
        save_scores([r, r], path, force=True)
        assert len(load_scores(path)["score"]) == 10

    def test_bad_suffix(self, tmp_path):
        with pytest.raises(InputError, match=r"csv or \.npz"):
            self.result().save_scores(tmp_path / "scores.txt")


def test_hanley_mcneil_sanity():
    # Gaussian scores: AUC = Phi(d / sqrt(2)); n = 20000 gives SE ~ 0.004.
    rng = np.random.default_rng(2)
    member = rng.random(20000) < 0.5
    s = rng.normal(size=20000) + member
    phi = 0.5 * (1 + math.erf(1 / math.sqrt(2) / math.sqrt(2)))
    assert evaluate(s, member, n_bootstrap=0)["auc"] == pytest.approx(phi, abs=0.016)


def test_downsample_roc_uses_its_budget_and_keeps_the_boundary_point():
    from attacks.metrics import _corners

    # 10,000 non-members exactly, so FPR 0.01 = 100/10,000 is an operating point: "FPR <= keep_below is kept exactly"
    # includes it. Beyond the kept points, the rest is thinned evenly to exactly max_points (not fewer).
    rng = np.random.default_rng(2)
    member = rng.permutation(np.arange(20000) < 10000)
    fpr, tpr, _ = roc_curve(rng.normal(size=20000) + member, member)
    assert np.any(fpr == 0.02)
    for max_points in (600, 450):
        f2, t2 = downsample_roc(fpr, tpr, max_points=max_points, keep_below=0.02)  # 0.02: not a TPR@FPR target
        assert len(f2) == max_points
        kept = set(zip(f2.tolist(), t2.tolist(), strict=True))
        corner = _corners(fpr, tpr)  # points inside straight runs are dropped first, losslessly
        low = corner & (fpr <= 0.02)
        assert set(zip(fpr[low].tolist(), tpr[low].tolist(), strict=True)) <= kept
        assert (0.02, tpr[corner & (fpr == 0.02)].max()) in kept
        assert (0.1, tpr[fpr == 0.1].max()) in kept  # the TPR@FPR 0.1 point, at FPR exactly 0.1
        # Evenly by index: every tenth of the FPR range above keep_below holds some of the thinned points.
        high = f2[f2 > 0.02]
        assert np.all(np.histogram(high, bins=10, range=(0.02, 1.0))[0] > 0)
    # The low region alone over the budget: all of it is kept (the documented exception), nothing else but the end.
    f4, _ = downsample_roc(fpr, tpr, max_points=300, keep_below=0.02)
    assert int((_corners(fpr, tpr) & (fpr <= 0.02)).sum()) > 300 and len(f4) > 300
    # Two tie groups with the same member share: two collinear diagonal steps, one segment (the middle point goes).
    f3, t3 = downsample_roc(*roc_curve([3, 3, 2, 2], [1, 0, 1, 0])[:2])
    np.testing.assert_array_equal(np.c_[f3, t3], [[0, 0], [1, 1]])


def test_nonmembers_needed_and_evaluate_refusals():
    # 1 / (1 / 49) is 49.00000000000001 in floats: 49 non-members give FPR 1/49, not 50.
    from attacks.metrics import nonmembers_needed

    assert [nonmembers_needed(f) for f in (1 / 49, 1 / 98, 0.001, 0.3)] == [49, 98, 1000, 4]
    for member, pattern in (
        (np.zeros(4, bool), "got 0 members and 4 non-members"),
        (np.ones(4, bool), "got 4 members and 0 non-members"),
    ):
        with pytest.raises(InputError, match=pattern):
            evaluate(np.arange(4.0), member, n_bootstrap=0)
    with pytest.raises(InputError, match=r"expected 1-D scores and member arrays, got shapes \(2, 2\) and \(4,\)"):
        evaluate(np.zeros((2, 2)), np.array([True, False, True, False]), n_bootstrap=0)
    with pytest.raises(InputError, match=r"expected 1-D scores and member arrays, got shapes \(4,\) and \(2, 2\)"):
        evaluate(np.zeros(4), np.array([[True, False], [True, False]]), n_bootstrap=0)
    import pandas as pd

    with pytest.raises(InputError, match="index"):
        evaluate(pd.Series([0.1, 0.9, 0.5]), pd.Series([True, False, True], index=[2, 1, 0]), n_bootstrap=0)


@pytest.mark.parametrize("target", [0.29, 0.57])
def test_tpr_at_an_fpr_whose_product_rounds_below_the_count(target):
    # target * 100 is 28.999999999999996 (0.29) and 56.99999999999999 (0.57) in floats; FP = 29 (57) of 100 is still
    # FPR <= target. Non-members score 0..99, 10 members above all, 10 just above the top FP non-members, 10 below.
    k = round(target * 100)
    nonmember = np.arange(100.0)
    member_scores = np.r_[np.full(10, 1000.0), np.full(10, 99.5 - k), np.full(10, -5.0)]
    s = np.r_[member_scores, nonmember]
    member = np.r_[np.ones(30, bool), np.zeros(100, bool)]
    assert list(evaluate(s, member, fpr_targets=(target,), n_bootstrap=0)["tpr_at_fpr"].values()) == [20 / 30]
    fpr, tpr, _ = roc_curve(s, member)
    assert tpr_at_fpr_from_roc(fpr, tpr, target, 100) == 20 / 30


def test_downsample_roc_keeps_the_ends_and_targets_and_thins_the_rest_evenly_to_the_budget():
    # A staircase whose every point is a corner: (0, 0), right, up, right, ... to (1, 1) in steps of 1/20 (41 points;
    # right first: the top score a non-member's, so point 1 is (0.05, 0)). The kept set K by the documented rule:
    # FPR <= keep_below = 0.01 (point 0), the two ends (0 and 40), and the point each TPR@FPR target is read from
    # (FPR <= 0.001 and <= 0.01: point 0; FPR <= 0.1: (0.1, 0.1), point 4). The other 38 points are thinned evenly by
    # index to the budget max_points - |K|.
    from attacks.metrics import _corners

    k = np.arange(41)
    fpr, tpr = ((k + 1) // 2) / 20, (k // 2) / 20
    assert _corners(fpr, tpr).all()
    K = [0, 4, 40]
    rest = np.setdiff1d(k, K)
    for max_points in (3, 2):  # the budget spent by K (2: K alone is over it, and is kept whole): exactly K
        f2, t2 = downsample_roc(fpr, tpr, max_points=max_points)
        np.testing.assert_array_equal(np.c_[f2, t2], np.c_[fpr[K], tpr[K]])
    for budget in (1, 2, 5, 37):
        f2, t2 = downsample_roc(fpr, tpr, max_points=len(K) + budget)
        assert len(f2) == len(K) + budget  # the whole budget is used (1 point too)
        idx = np.flatnonzero(np.isin(fpr + 1j * tpr, f2 + 1j * t2))
        assert len(idx) == len(f2) and set(K) <= set(idx.tolist())
        pos = np.searchsorted(rest, np.setdiff1d(idx, K))  # positions of the thinned points among the rest
        if budget >= 2:  # evenly: from the first to the last of the rest, gaps differing by at most one
            gaps = np.diff(pos)
            assert pos[0] == 0 and pos[-1] == len(rest) - 1 and gaps.max() - gaps.min() <= 1
    # Lists and integers are read as float64 points.
    f5, t5 = downsample_roc([0, 0, 1], [0, 1, 1], max_points=2)
    assert f5.dtype == t5.dtype == np.float64 and f5.tolist() == [0.0, 0.0, 1.0] and t5.tolist() == [0.0, 1.0, 1.0]
