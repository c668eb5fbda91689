"""LiRA on synthetic Gaussian signals: it must recover the Neyman–Pearson optimal ROC."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.stats import norm

from attacks.lira import LiRA, balanced_membership, lira_from_logits, signals_matrix
from attacks.metrics import evaluate
from attacks.rmia import RMIA
from dpaudit.errors import InputError


def hanley_mcneil_se(auc: float, n1: int, n2: int) -> float:
    """Standard error of an empirical AUC (Hanley & McNeil 1982, Radiology 143:29, eq. 2)."""
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    return math.sqrt((auc * (1 - auc) + (n1 - 1) * (q1 - auc**2) + (n2 - 1) * (q2 - auc**2)) / (n1 * n2))


def gaussian_world(n: int, m: int, delta: float, s: float, tau: float, seed: int):
    """Per-record means mu_i ~ N(0, tau^2); OUT signals ~ N(mu_i, s^2), IN ~ N(mu_i + delta, s^2)."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(0, tau, n)
    in_mask = balanced_membership(n, m, seed=rng)
    signals = mu[:, None] + delta * in_mask + rng.normal(0, s, (n, m))
    member = rng.random(n) < 0.5
    target = mu + delta * member + rng.normal(0, s, n)
    return signals, in_mask, target, member


# Known per-record means make x - mu_i ~ N(delta, s^2) (IN) vs N(0, s^2) (OUT): the likelihood ratio
# test is a threshold on x - mu_i, with AUC Phi(delta / (s sqrt 2)) and TPR(f) = Phi(delta/s - z_{1-f}).
# LiRA must estimate mu_i from M/2 models per side; with M = 64 the estimate's noise widens the
# effective variance from 2 s^2 to about 2 s^2 (1 + 1/M), an AUC bias below 0.002 here.
N, M, DELTA, S, TAU = 6000, 64, 1.0, 1.0, 2.0
OPT_AUC = norm.cdf(DELTA / (S * math.sqrt(2)))  # 0.760


@pytest.fixture(scope="module")
def world():
    return gaussian_world(N, M, DELTA, S, TAU, seed=7)


@pytest.mark.parametrize("online", [True, False])
def test_recovers_neyman_pearson_auc(world, online):
    signals, in_mask, target, member = world
    lira = LiRA(online=online, global_variance=True)
    auc = evaluate(lira.fit_score(signals, in_mask, target), member, n_bootstrap=0)["auc"]
    se = hanley_mcneil_se(OPT_AUC, int(member.sum()), int((~member).sum()))  # ~0.0062
    assert abs(auc - OPT_AUC) < 4 * se + 0.002
    # A wrong model fails the same tolerance: ignoring per-record calibration (raw signal, the loss
    # attack's analogue) has AUC Phi(delta / sqrt(2 (s^2 + tau^2))) = 0.62; a world with half the
    # effect has 0.64.
    raw = evaluate(target, member, n_bootstrap=0)["auc"]
    assert abs(raw - norm.cdf(DELTA / math.sqrt(2 * (S**2 + TAU**2)))) < 4 * se
    assert abs(raw - OPT_AUC) > 4 * se + 0.002
    assert abs(norm.cdf(DELTA / 2 / (S * math.sqrt(2))) - OPT_AUC) > 4 * se + 0.002


def test_recovers_optimal_tpr_at_10pct_fpr(world):
    signals, in_mask, target, member = world
    m = evaluate(LiRA(online=True).fit_score(signals, in_mask, target), member, n_bootstrap=0)
    opt = norm.cdf(DELTA / S - norm.ppf(0.9))  # 0.389
    se = math.sqrt(opt * (1 - opt) / member.sum())  # binomial, ~0.009; the threshold's noise adds less
    assert abs(m["tpr_at_fpr"]["0.1"] - opt) < 5 * se


def test_per_record_variance_beats_global_when_variances_differ():
    # Records with very different spreads: per-record Gaussians (M >= 64, "auto") model them right.
    rng = np.random.default_rng(3)
    n, m = 4000, 128
    s_i = np.where(rng.random(n) < 0.5, 0.3, 3.0)
    in_mask = balanced_membership(n, m, seed=rng)
    signals = 1.0 * in_mask + rng.normal(0, 1, (n, m)) * s_i[:, None]
    member = rng.random(n) < 0.5
    target = 1.0 * member + rng.normal(0, 1, n) * s_i
    auto = LiRA()
    a_auto = evaluate(auto.fit_score(signals, in_mask, target), member, n_bootstrap=0)
    a_glob = evaluate(LiRA(global_variance=True).fit_score(signals, in_mask, target), member, n_bootstrap=0)
    assert not auto.global_variance_
    assert a_auto["tpr_at_fpr"]["0.01"] > a_glob["tpr_at_fpr"]["0.01"]


def test_auto_variance_rule():
    signals, in_mask, _, _ = gaussian_world(50, 16, 1.0, 1.0, 1.0, seed=0)
    assert LiRA().fit(signals, in_mask).global_variance_  # 16 < 64 models: global (Carlini et al. §VI)
    signals, in_mask, _, _ = gaussian_world(50, 64, 1.0, 1.0, 1.0, seed=0)
    assert not LiRA().fit(signals, in_mask).global_variance_


def test_balanced_membership():
    in_mask = balanced_membership(1000, 16, seed=0)
    assert in_mask.shape == (1000, 16)
    np.testing.assert_array_equal(in_mask.sum(axis=1), 8)
    assert np.all(np.abs(in_mask.sum(axis=0) - 500) < 80)  # each model trains on about half
    odd = balanced_membership(1000, 5, seed=0).sum(axis=1)
    assert set(np.unique(odd)) == {2, 3}
    np.testing.assert_array_equal(balanced_membership(10, 4, seed=1), balanced_membership(10, 4, seed=1))


class TestGuard:
    def setup_method(self):
        self.signals = np.random.default_rng(0).normal(size=(5, 4))
        self.in_mask = np.array([[1, 1, 0, 0]] * 5, bool)
        self.in_mask[3] = [1, 0, 0, 0]  # record 3: one IN model

    def test_refuses_naming_records(self):
        with pytest.raises(InputError, match=r"1 record\(s\) have fewer than 2 IN reference models.*103 \(1\)"):
            LiRA(min_models=2).fit(self.signals, self.in_mask, record_ids=np.arange(100, 105))

    def test_warns_loudly(self):
        with pytest.warns(RuntimeWarning, match="fewer than 2 IN"):
            scores = LiRA(on_insufficient="warn").fit_score(self.signals, self.in_mask, np.zeros(5))
        assert np.all(np.isfinite(scores))

    def test_zero_models_always_refused(self):
        self.in_mask[2] = False
        with pytest.raises(InputError, match="IN reference models"):
            LiRA(on_insufficient="warn", min_models=1).fit(self.signals, self.in_mask)

    def test_a_zero_among_few_is_refused_even_when_warning(self):
        self.in_mask[2] = False  # record 2: no IN model, record 3: one; warn covers the one, never the zero
        with pytest.raises(InputError, match=r"2 record\(s\) have fewer than 2 IN reference models.*2 \(0\), 3 \(1\)"):
            LiRA(on_insufficient="warn", min_models=2).fit(self.signals, self.in_mask)

    @pytest.mark.parametrize(("n_low", "tail"), [(8, r"7 \(1\)\); train"), (9, r"7 \(1\) and 1 more\); train")])
    def test_the_message_names_eight_records_then_counts_the_rest(self, n_low, tail):
        in_mask = np.array([[1, 1, 0, 0]] * 12, bool)
        in_mask[:n_low, 1] = False
        msg = rf"{n_low} record\(s\) have fewer than 2 IN reference models \(record id \(count\): 0 \(1\), 1 \(1\), "
        with pytest.raises(InputError, match=msg + r"2 \(1\), 3 \(1\), 4 \(1\), 5 \(1\), 6 \(1\), " + tail):
            LiRA(min_models=2).fit(np.zeros((12, 4)), in_mask)

    def test_offline_needs_only_out(self):
        self.in_mask[2] = False
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            LiRA(online=False, min_models=2).fit(self.signals, self.in_mask)
        self.in_mask[1] = True  # no OUT model
        with pytest.raises(InputError, match="OUT reference models"):
            LiRA(online=False).fit(self.signals, self.in_mask)

    def test_shapes(self):
        with pytest.raises(InputError, match="IN matrix has shape"):
            LiRA().fit(self.signals, self.in_mask[:, :3])
        with pytest.raises(InputError, match="boolean"):
            LiRA().fit(self.signals, self.in_mask.astype(int))
        with pytest.raises(InputError, match="target signals"):
            LiRA(min_models=1).fit(self.signals, self.in_mask).score(np.zeros(4))
        with pytest.raises(InputError, match=r"expected a signals matrix of shape \(n_records, n_models\), got \(5,\)"):
            LiRA().fit(self.signals[:, 0], self.in_mask[:, 0])
        for bad in (np.nan, np.inf):
            signals = self.signals.copy()
            signals[4, 3] = bad
            with pytest.raises(InputError, match="signals contain NaN or inf"):
                LiRA(min_models=1).fit(signals, self.in_mask)
        with pytest.raises(InputError, match="n_models"):
            balanced_membership(10, 0)

    def test_options_and_order_of_calls(self):
        for kw, pattern in (
            ({"min_models": 0}, "min_models"),
            ({"on_insufficient": "ignore"}, "on_insufficient"),
            ({"min_std": 0.0}, "min_std"),
            ({"global_variance": "yes"}, "expected global_variance True, False or 'auto', got 'yes'"),
        ):
            with pytest.raises(InputError, match=pattern):
                LiRA(**kw).fit(self.signals, self.in_mask)
        with pytest.raises(InputError, match=r"LiRA\.score called before fit"):
            LiRA().score(np.zeros(5))
        lira = LiRA(min_models=1).fit(self.signals, self.in_mask)
        np.testing.assert_array_equal(lira.n_in_, self.in_mask.sum(axis=1))  # documented learned counts
        np.testing.assert_array_equal(lira.n_out_, (~self.in_mask).sum(axis=1))
        with pytest.raises(InputError, match="target signals contain NaN or inf"):
            lira.score(np.array([0.0, 0.0, np.nan, 0.0, 0.0]))
        with pytest.raises(InputError, match=r"expected stacked logits of shape \(n_models, n_records, n_classes\)"):
            signals_matrix(np.zeros((4, 3)), np.zeros(4, int))


def _loop_lira(signals, in_mask, target, *, online, global_variance, min_std=1e-6):
    """LiRA written out record by record from Carlini et al. 2022 (Alg. 1; offline §IV-D): the mean and
    unbiased variance of each record's IN and OUT signals (a single model: the pooled within-record
    variance, which global variance uses for every record); offline: the log-odds of Phi(t)."""
    n = len(signals)
    ins = [signals[i, in_mask[i]] for i in range(n)]
    outs = [signals[i, ~in_mask[i]] for i in range(n)]

    def pooled(groups):
        dof = sum(len(g) - 1 for g in groups)
        return math.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / dof) if dof else min_std

    p_in, p_out = pooled(ins), pooled(outs)
    scores = []
    for i in range(n):
        sd_out = p_out if global_variance or len(outs[i]) < 2 else outs[i].std(ddof=1)
        sd_out = max(sd_out, min_std)
        if not online:
            t = (target[i] - outs[i].mean()) / sd_out
            scores.append(math.log(norm.cdf(t)) - math.log(norm.sf(t)))
            continue
        sd_in = max(p_in if global_variance or len(ins[i]) < 2 else ins[i].std(ddof=1), min_std)
        scores.append(norm.logpdf(target[i], ins[i].mean(), sd_in) - norm.logpdf(target[i], outs[i].mean(), sd_out))
    return np.array(scores)


@pytest.mark.parametrize("online", [True, False])
@pytest.mark.parametrize("global_variance", [True, False])
def test_matches_a_loop_over_records_on_a_square_matrix(online, global_variance):
    """Rows are records, columns models: on a square IN matrix (6 records, 6 models) a transposed mask would
    pass every shape check, so compare with the record-by-record loop. Records are IN for 1 to 5 models (one
    IN model: the per-record variance falls back to the pooled one)."""
    rng = np.random.default_rng(18)  # a record with two close OUT signals: t = 32.7 offline
    in_mask = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 1, 1, 1, 0, 0],
            [1, 0, 1, 1, 1, 0],
            [1, 1, 1, 1, 0, 1],
            [0, 0, 0, 1, 1, 0],
        ],
        bool,
    )  # IN counts 1, 2, 3, 4, 5, 2 per record; per model (the transpose's rows) 4, 3, 3, 5, 3, 1
    signals = rng.normal(0, 1, (6, 6)) + 3.0 * in_mask + rng.normal(0, 2, (6, 1))
    target = rng.normal(1.5, 2, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # records with one IN model
        got = LiRA(online=online, global_variance=global_variance, min_models=1, on_insufficient="warn").fit_score(
            signals, in_mask, target
        )
    want = _loop_lira(signals, in_mask, target, online=online, global_variance=global_variance)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_pooled_variance_from_one_degree_of_freedom_is_used():
    # Only record 3 has two IN models: the pooled IN std has one degree of freedom, |a - b| / sqrt 2 of that pair,
    # and every record takes it under global variance (Carlini et al. 2022, §VI; a NaN here would fall to min_std).
    in_mask = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], bool)
    signals = np.random.default_rng(3).normal(0, 1, (5, 4)) + 2.0 * in_mask
    target = np.array([0.5, 1.0, 1.5, 2.0, -0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # records with one IN model
        lira = LiRA(global_variance=True, min_models=1, on_insufficient="warn").fit(signals, in_mask)
    a, b = signals[3, in_mask[3]]
    np.testing.assert_allclose(lira.std_in_, abs(a - b) / math.sqrt(2), rtol=1e-13)
    want = _loop_lira(signals, in_mask, target, online=True, global_variance=True)
    np.testing.assert_allclose(lira.score(target), want, rtol=1e-12)
    # Offline, a record with no IN model adds no degree of freedom (not -1) to the pooled IN std it still reports.
    in_mask[0] = False
    off = LiRA(online=False, global_variance=True, min_models=1).fit(signals, in_mask)
    np.testing.assert_allclose(off.std_in_, abs(a - b) / math.sqrt(2), rtol=1e-13)


def test_offline_scores_keep_ranking_far_above_the_out_gaussian():
    """The offline Lambda = Phi(t) is strictly increasing in t = (phi - mu_out) / s_out; its log rounds to 0
    for t >= 38, where the old score tied every record (with 2 reference models, one OUT each, the std is
    the 1e-6 floor and half the records were there). Scores are the log-odds log Phi(t) - log Phi(-t)."""
    in_mask = np.array([[True, False, False, False]] * 8)
    signals = np.array([[5.0, -1.0, 0.0, 1.0]] * 8)  # OUT mean 0, std 1
    t = np.array([-80.0, -40.0, -5.0, 0.5, 5.0, 40.0, 60.0, 80.0])
    scores = LiRA(online=False, global_variance=False, min_models=1).fit_score(signals, in_mask, t)
    assert np.all(np.diff(scores) > 0), scores
    moderate = np.abs(t) <= 5  # scipy's cdf and sf are accurate there: an independent formula
    np.testing.assert_allclose(scores[moderate], np.log(norm.cdf(t[moderate]) / norm.sf(t[moderate])), rtol=1e-12)


def test_constant_signals_do_not_divide_by_zero():
    in_mask = balanced_membership(10, 4, seed=0)
    scores = LiRA().fit_score(np.zeros((10, 4)), in_mask, np.zeros(10))
    assert np.all(np.isfinite(scores))


def test_from_logits_end_to_end():
    # Reference logits where IN models are more confident on the true class.
    rng = np.random.default_rng(1)
    n, m = 400, 8
    y = rng.integers(0, 3, n)
    in_mask = balanced_membership(n, m, seed=rng)
    base = rng.normal(0, 1, (m, n, 3))
    base[np.arange(m)[:, None], np.arange(n)[None, :], y[None, :]] += 2.0 + 3.0 * in_mask.T
    member = rng.random(n) < 0.5
    target = rng.normal(0, 1, (n, 3))
    target[np.arange(n), y] += 2.0 + 3.0 * member
    assert signals_matrix(base, y).shape == (n, m)
    scores = lira_from_logits(target, base, y, in_mask)
    assert evaluate(scores, member, n_bootstrap=0)["auc"] > 0.9
    with pytest.raises(InputError, match=r"expected labels of shape \(400,\), got None"):
        lira_from_logits(target, base, None, in_mask)  # was a NumPy broadcasting error


def test_rmia_ranks_like_its_pairwise_score():
    rng = np.random.default_rng(2)
    n, m = 300, 8
    in_mask = balanced_membership(n, m, seed=rng)
    mu = rng.normal(-1, 0.5, n)
    sig = np.minimum(mu[:, None] + 0.8 * in_mask + rng.normal(0, 0.2, (n, m)), 0)
    member = rng.random(n) < 0.5
    target = np.minimum(mu + 0.8 * member + rng.normal(0, 0.2, n), 0)
    rmia = RMIA().fit(sig, in_mask)
    s = rmia.score(target)
    assert evaluate(s, member, n_bootstrap=0)["auc"] > 0.8
    pair = rmia.pairwise_score(target, sig, in_mask, target)
    assert np.all((pair >= 0) & (pair <= 1))
    order = np.argsort(s)
    assert np.all(np.diff(pair[order]) >= 0)  # monotone in the likelihood ratio (same ranking up to ties)
    off = RMIA(online=False).fit(sig, in_mask).score(target)
    assert evaluate(off, member, n_bootstrap=0)["auc"] > 0.7


def test_the_sides_whose_std_is_the_floor_are_named():
    # One OUT (and one IN) model per record: no variance to estimate, the min_std floor stands in (std_floor_sides_);
    # offline reads the OUT side only. Two of each: a pooled estimate, no side named.
    rng = np.random.default_rng(0)
    one = np.zeros((50, 2), bool)
    one[np.arange(50), rng.integers(0, 2, 50)] = True
    signals = rng.normal(size=(50, 2)) + one
    lira = LiRA(online=True, min_models=1).fit(signals, one)
    assert lira.std_floor_sides_ == ("IN", "OUT") and np.all(lira.std_out_ == 1e-6)
    assert LiRA(online=False, min_models=1).fit(signals, one).std_floor_sides_ == ("OUT",)
    two = np.c_[one, ~one]
    assert LiRA(online=True).fit(np.c_[signals, signals[:, ::-1]], two).std_floor_sides_ == ()


def test_rmia_marginal_and_scores_are_the_papers_formulas_recomputed_by_hand():
    # Zarifzadeh et al. 2024: Pr(x) = the mean of Pr(x | theta') over all reference models (online), or over the
    # OUT models corrected by §4 (offline): ((1 + a) Pr_OUT(x) + (1 - a)) / 2; the score is log(Pr(x | theta) / Pr(x))
    # and the pairwise score (eq. 3) the share of population z with LR(x, z) = (p_x / Pr(x)) / (p_z / Pr(z)) >= gamma.
    # Recomputed here in plain probabilities on a hand-made matrix (the other RMIA tests read rankings only).
    p = np.array([[0.2, 0.4, 0.9], [0.5, 0.1, 0.3], [0.7, 0.6, 0.05]])
    m = np.array([[True, False, False], [False, True, True], [True, False, True]])
    px_target = np.array([0.6, 0.05, 0.3])
    s, x = np.log(p), np.log(px_target)
    online = RMIA().fit(s, m)
    np.testing.assert_allclose(online.log_px_, np.log(p.mean(axis=1)), rtol=1e-13)
    np.testing.assert_allclose(online.score(x), np.log(px_target / p.mean(axis=1)), rtol=1e-13)
    p_out = np.array([(0.4 + 0.9) / 2, 0.5, 0.6])
    for a in (0.0, 0.3, 1.0):
        off = RMIA(online=False, offline_a=a).fit(s, m)
        np.testing.assert_allclose(off.log_px_, np.log(((1 + a) * p_out + (1 - a)) / 2), rtol=1e-13)
        np.testing.assert_allclose(off.score(x), np.log(px_target / (((1 + a) * p_out + (1 - a)) / 2)), rtol=1e-13)
    # Pairwise: population z = three other records; gamma = 1.5 (ln 1.5 away from every ratio's gap here).
    pz = np.array([[0.3, 0.3, 0.3], [0.9, 0.8, 0.7], [0.1, 0.2, 0.4]])
    mz = np.array([[True, False, True], [False, True, False], [True, True, False]])
    z_target = np.array([0.5, 0.75, 0.12])
    got = {}
    for gamma in (1.0, 1.5):
        rm = RMIA(gamma=gamma).fit(s, m)
        lr_x = px_target / p.mean(axis=1)
        lr_z = z_target / pz.mean(axis=1)
        want = np.array([np.mean(lx / lr_z >= gamma) for lx in lr_x])
        got[gamma] = rm.pairwise_score(x, np.log(pz), mz, np.log(z_target))
        np.testing.assert_array_equal(got[gamma], want)
    assert not np.array_equal(got[1.0], got[1.5])  # gamma matters on this data
    # A record with no OUT model has no offline Pr(x); a target of the wrong length is refused.
    with pytest.raises(InputError, match=r"RMIA: 1 record\(s\) have no usable reference model"):
        RMIA(online=False).fit(s, np.array([[True, True, True], [False, True, True], [True, False, True]]))
    RMIA().fit(s, np.ones_like(m))  # online uses every model, IN or OUT
    with pytest.raises(InputError, match=r"expected 3 target signals, got shape \(2,\)"):
        online.score(x[:2])


def test_rmia_refuses_bad_signals_masks_and_options_in_one_line():
    s = np.log(np.full((3, 2), 0.5))
    m = np.array([[True, False], [False, True], [True, False]])
    shape = r"expected signals \(n_records, n_models\) with a boolean IN matrix of the same shape"
    for sig, mask in ((s[:, 0], m[:, 0]), (s, m[:2]), (s, m.astype(int))):
        with pytest.raises(InputError, match=shape):
            RMIA().fit(sig, mask)
    for bad in (np.nan, -np.inf, 0.1):  # a log-probability is finite and <= 0; exactly 0 (p = 1) is one
        t = s.copy()
        t[1, 1] = bad
        with pytest.raises(InputError, match=r"RMIA signals must be finite log-probabilities \(<= 0\)"):
            RMIA().fit(t, m)
    assert RMIA().fit(np.zeros((3, 2)), m).n_models_ == 2
    with pytest.raises(InputError, match=r"RMIA\.score called before fit"):
        RMIA().score(s[:, 0])
    for kw in ({"offline_a": 1.1}, {"offline_a": -0.1}, {"gamma": 0.0}):
        with pytest.raises(InputError):
            RMIA(**kw).fit(s, m)
