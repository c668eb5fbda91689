"""Noisy-vote aggregation (PATE / DP-ICL): mechanism audits, closed forms, data-dependent soundness."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy.stats import norm

from dpaudit.aggregation import (
    AggregatorConfig,
    aggregate,
    aggregator_event,
    calibrate_aggregator,
    data_dependent_epsilon,
    data_independent_epsilon,
    log_q_gnmax,
    privacy_record,
    private_diagnostics,
    rdp_gnmax_data_dependent,
    rdp_threshold_data_dependent,
    vote_histogram,
)
from dpaudit.audit import audit_scores
from dpaudit.errors import InputError
from dpaudit.events import event_from_dict

ORDERS = np.array([1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0])


# --- two-histogram audits: output frequencies respect the claim, half the noise does not -------------


def _two_histogram_audit(config_run, config_claim, h_in, h_out, delta, n=400_000, seed=0):
    """Run the aggregator n times on each of two histograms that differ in one teacher's vote and bound
    epsilon from the event "output = class 1" (fixed in advance: no selection) with Clopper-Pearson."""
    hist = np.array([h_in] * n + [h_out] * n)
    answers = aggregate(hist, config_run, seed)
    scores = (answers == 1).astype(np.float64)
    member = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    claim = data_independent_epsilon(config_claim, 1, len(h_in), delta)["epsilon"]
    return audit_scores(
        scores, member, method="clopper-pearson", design="multi-run", delta=delta, claimed_epsilon=claim,
        threshold=0.5, threshold_selection="fixed",
    )  # fmt: skip


def test_gnmax_two_histogram_audit_respects_claim_and_half_sigma_violates():
    # Two classes: output 1 iff n1 + Z1 > n0 + Z0, Z1 - Z0 ~ N(0, 2 sigma^2); moving one vote shifts the gap
    # by 2. Gaps 3 (h_in) vs 5 (h_out), sigma = 2, delta = 0.01: the event's true ratio gives log((0.144 -
    # 0.01) / 0.0386) = 1.24 < claim 1.76; with sigma = 1 the same event gives ~3.5, far above (n = 4e5
    # per side puts the Clopper-Pearson bounds within a few percent).
    right = AggregatorConfig("gnmax", sigma=2.0)
    result = _two_histogram_audit(right, right, [5, 2], [6, 1], delta=0.01)
    assert result.formal and result.verdict == "consistent"
    assert 0.9 < result.epsilon_lower_bound < result.claimed_epsilon
    planted = AggregatorConfig("gnmax", sigma=1.0)  # half the noise, same claim
    bad = _two_histogram_audit(planted, right, [5, 2], [6, 1], delta=0.01)
    assert bad.verdict == "violation" and bad.epsilon_lower_bound > 1.5 * bad.claimed_epsilon


def test_lnmax_two_histogram_audit_respects_pure_claim_and_half_scale_violates():
    # LNMax is (2/b, 0)-DP per query (Papernot et al. 2017); the difference of two Laplace(b) has tail
    # (1/4)(2 + g/b) e^{-g/b}, so gaps 2 vs 4 give log ratio 0.71 at b = 2 (claim 1) and 1.6 at b = 1.
    right = AggregatorConfig("lnmax", sigma=2.0)
    result = _two_histogram_audit(right, right, [4, 2], [5, 1], delta=1e-5)
    assert result.claimed_epsilon == pytest.approx(1.0)
    assert result.verdict == "consistent" and 0.5 < result.epsilon_lower_bound < 1.0
    bad = _two_histogram_audit(AggregatorConfig("lnmax", sigma=1.0), right, [4, 2], [5, 1], delta=1e-5)
    assert bad.verdict == "violation"


# --- closed forms ------------------------------------------------------------------------------------


def test_data_independent_claims_match_closed_forms():
    from dpaudit.accounting.rdp import DEFAULT_ORDERS, rdp_to_epsilon

    o = np.asarray(DEFAULT_ORDERS)
    # GNMax: alpha / sigma^2 per query (Papernot et al. 2018, Prop. 8), Q queries compose additively.
    got = data_independent_epsilon(AggregatorConfig("gnmax", sigma=40.0), 300, 10, 1e-5)["epsilon"]
    assert got == pytest.approx(rdp_to_epsilon(o, 300 * o / 40.0**2, 1e-5)[0], rel=1e-9)
    # Confident-GNMax: Q threshold checks alpha / (2 sigma1^2) + A answers alpha / sigma2^2.
    c = AggregatorConfig("confident-gnmax", sigma=40.0, sigma1=150.0, threshold=200.0, max_answers=50)
    got = data_independent_epsilon(c, 300, 10, 1e-5)["epsilon"]
    curve = 300 * o / (2 * 150.0**2) + 50 * o / 40.0**2
    assert got == pytest.approx(rdp_to_epsilon(o, curve, 1e-5)[0], rel=1e-9)
    # LNMax: the smaller of basic composition Q * 2 / b and the RDP route.
    few = data_independent_epsilon(AggregatorConfig("lnmax", sigma=20.0), 3, 10, 1e-5)
    assert few["epsilon"] == pytest.approx(0.3) and few["accountant"].startswith("pure-dp")
    many = data_independent_epsilon(AggregatorConfig("lnmax", sigma=20.0), 1000, 10, 1e-5)
    assert many["epsilon"] < many["pure_dp_epsilon"] == pytest.approx(100.0)


def test_event_round_trip_and_calibration_meets_target():
    c = AggregatorConfig("confident-gnmax", sigma=40.0, sigma1=150.0, threshold=200.0)
    e = aggregator_event(c, 100, 10)
    assert event_from_dict(e.to_dict()) == e
    g = calibrate_aggregator(
        AggregatorConfig("gnmax", sigma=1.0), target_epsilon=2.0, delta=1e-5, n_queries=500, n_classes=10
    )
    eps = data_independent_epsilon(g, 500, 10, 1e-5)["epsilon"]
    assert eps <= 2.0 and eps > 1.99
    assert data_independent_epsilon(
        AggregatorConfig("gnmax", sigma=g.sigma * 0.999), 500, 10, 1e-5
    )["epsilon"] > 2.0  # fmt: skip


def test_log_q_gnmax_closed_form_and_monte_carlo():
    sigma = 3.0
    h = np.array([[10, 7, 0], [10, 4, 3], [2, 1, 0]])
    # Prop. 7: q <= sum_{i != i*} (1/2) erfc((n_i* - n_i) / (2 sigma)).
    expect = [sum(0.5 * math.erfc((r.max() - x) / (2 * sigma)) for j, x in enumerate(r) if j != r.argmax()) for r in h]
    assert np.exp(log_q_gnmax(h, sigma)) == pytest.approx(np.minimum(expect, 2 / 3), rel=1e-12)
    # The bound is above the true Pr[GNMax != argmax] (union bound): check against 2e5 runs.
    n = 200_000
    for row, lq in zip(h, log_q_gnmax(h, sigma), strict=True):
        miss = np.mean(aggregate(np.repeat(row[None], n, 0), AggregatorConfig("gnmax", sigma=sigma), 1) != row.argmax())
        assert miss <= math.exp(lq) + 4 * math.sqrt(miss * (1 - miss) / n)


def _theorem6_mpmath(q, sigma, lam):
    """Papernot et al. 2018, Thm. 6 with Prop. 10, evaluated directly in 50-digit arithmetic."""
    mpmath.mp.dps = 50
    q, s, lam = mpmath.mpf(q), mpmath.mpf(sigma), mpmath.mpf(lam)
    mu2 = s * mpmath.sqrt(mpmath.log(1 / q))
    mu1 = mu2 + 1
    e1, e2 = mu1 / s**2, mu2 / s**2
    a = (1 - q) / (1 - (q * mpmath.exp(e2)) ** ((mu2 - 1) / mu2))
    b = mpmath.exp(e1) / q ** (1 / (mu1 - 1))
    return float(mpmath.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1))


@pytest.mark.parametrize(("q", "sigma", "lam"), [(1e-6, 10.0, 5.0), (1e-12, 20.0, 8.0), (1e-30, 40.0, 32.0)])
def test_data_dependent_rdp_matches_theorem6_in_mpmath(q, sigma, lam):
    got = rdp_gnmax_data_dependent(math.log(q), sigma, np.array([lam]))[0]
    want = _theorem6_mpmath(q, sigma, lam)
    assert got == pytest.approx(
        min(want, lam / sigma**2), rel=1e-9, abs=0
    )  # values 6e-12 and 1e-26: abs=0 or it is blind
    assert got < lam / sigma**2  # in these cases the data-dependent bound is the smaller one


def test_data_dependent_rdp_uses_theorem6_exactly_where_its_conditions_hold():
    """Thm. 6 holds only where Prop. 10's mu2 > 1, q e^eps2 < 1, q <= e^((mu2-1) eps2) / (mu1/(mu1-1) mu2/(mu2-1))^mu2
    and lambda <= mu1 (Papernot et al. 2018, arXiv:1802.08908); elsewhere the data-independent lambda/sigma^2
    (Prop. 8) is the bound. The conditions, written out here in 50-digit arithmetic, decide which value is expected
    on a grid crossing every boundary: the old tests sat deep inside the valid region, so a check with a term of the
    third condition dropped, or without it (Thm. 6 applied where it does not hold), passed them."""
    with mpmath.workdps(50):
        for sigma in (0.5, 1.0, 2.0, 5.0, 20.0):
            for lq in (-0.05, -0.3, -0.6, -0.9, -1.0, -1.5, -3.0, -4.0, -5.0, -8.0, -12.0, -20.0, -35.0, -60.0):
                q, s = mpmath.exp(lq), mpmath.mpf(sigma)
                mu2 = s * mpmath.sqrt(-mpmath.mpf(lq))
                mu1, e2 = mu2 + 1, mu2 / s**2
                valid = bool(mu2 > 1 and q * mpmath.exp(e2) < 1)
                valid = valid and bool(q <= mpmath.exp((mu2 - 1) * e2) / (mu1 / (mu1 - 1) * mu2 / (mu2 - 1)) ** mu2)
                got = rdp_gnmax_data_dependent(lq, sigma, ORDERS)
                for lam, g in zip(ORDERS, got, strict=True):
                    want = lam / sigma**2
                    if valid and lam <= mu1:
                        want = min(want, _theorem6_mpmath(float(q), sigma, lam))
                    assert g == pytest.approx(want, rel=1e-9, abs=0), (sigma, lq, lam, valid)


def _binary_renyi(p, p2, lam):
    """D_lam(Bern(p) || Bern(p2)), exact (log-sum-exp in float64)."""
    t = np.array([lam * math.log(p) + (1 - lam) * math.log(p2), lam * math.log1p(-p) + (1 - lam) * math.log1p(-p2)])
    return float(np.logaddexp(*t) / (lam - 1))


@pytest.mark.parametrize("gap", [4, 8, 12])
def test_data_dependent_rdp_upper_bounds_exact_divergence(gap):
    # Two classes: the output is Bern(p), p = Pr[N(0, 2 sigma^2) > gap]; the neighbour moves one vote
    # (gap -> gap - 2). The exact Renyi divergence must lie below the data-dependent bound at every order.
    sigma = 2.0
    lq = float(log_q_gnmax(np.array([[gap + 2, 2]]), sigma)[0])
    p = math.exp(lq)
    p2 = norm.sf((gap - 2) / (math.sqrt(2) * sigma))
    bound = rdp_gnmax_data_dependent(lq, sigma, ORDERS)
    exact = np.array([_binary_renyi(p, p2, a) for a in ORDERS])
    assert np.all(exact <= bound + 1e-12)
    # Planted mistake: q under-estimated 1e4-fold (e.g. a union bound dropped) gives a "bound" below truth.
    wrong = rdp_gnmax_data_dependent(lq - math.log(1e4), sigma, ORDERS)
    assert np.any(exact > wrong)


def test_data_dependent_below_data_independent_on_consensus():
    rng = np.random.default_rng(0)
    k, q, c = 250, 200, 10
    hist = np.zeros((q, c), np.int64)
    hist[:, 0] = k - 5
    hist[np.arange(q), rng.integers(1, c, q)] += 5  # strong consensus: 245 vs 5
    for cfg in (AggregatorConfig("gnmax", sigma=40.0),
                AggregatorConfig("confident-gnmax", sigma=40.0, sigma1=150.0, threshold=200.0)):  # fmt: skip
        answers = aggregate(hist, cfg, 0)
        dd = data_dependent_epsilon(hist, answers, cfg, 1e-5)
        di = data_independent_epsilon(cfg, q, c, 1e-5)["epsilon"]
        assert dd < 0.5 * di
        rec = privacy_record(cfg, hist, answers, delta=1e-5, n_teachers=k)
        assert rec["epsilon"] == di and rec["claim"] == "data-independent"
        assert "data_dependent" not in rec and "sanitised" not in rec  # nothing from the votes in the claim
        diag = private_diagnostics(cfg, hist, answers, delta=1e-5, n_teachers=k)
        assert diag["private"] is False and "NOT differentially private" in diag["note"]
        assert diag["data_dependent_epsilon"] == pytest.approx(dd)
    # No consensus (uniform votes): the data-dependent bound falls back to the data-independent one.
    flat = np.full((q, c), k // c)
    g = AggregatorConfig("gnmax", sigma=40.0)
    assert data_dependent_epsilon(flat, aggregate(flat, g, 0), g, 1e-5) == pytest.approx(
        data_independent_epsilon(g, q, c, 1e-5)["epsilon"], rel=1e-9
    )


def test_threshold_data_dependent_bounds_exact_divergence():
    sigma1, t = 10.0, 50.0
    for m in (100.0, 55.0, 10.0):  # far above, near and far below the threshold
        p = norm.sf((t - m) / sigma1)
        bound = rdp_threshold_data_dependent(m, t, sigma1, ORDERS)
        assert np.all(bound <= ORDERS / (2 * sigma1**2) + 1e-15)
        for m2 in (m - 1.0, m + 1.0):
            exact = np.array([_binary_renyi(p, norm.sf((t - m2) / sigma1), a) for a in ORDERS])
            assert np.all(exact <= bound + 1e-12)


# --- mechanics, determinism, bad input ---------------------------------------------------------------


def test_vote_histogram_and_aggregate_determinism():
    votes = np.array([[0, 1, 2], [0, 1, 1], [0, 2, 1]])
    h = vote_histogram(votes, 3)
    assert h.tolist() == [[3, 0, 0], [0, 2, 1], [0, 2, 1]]
    cfg = AggregatorConfig("confident-gnmax", sigma=1.0, sigma1=1.0, threshold=2.5, max_answers=1)
    a, b = aggregate(h, cfg, 7), aggregate(h, cfg, 7)
    assert np.array_equal(a, b) and np.sum(a >= 0) <= 1
    assert aggregate(h, AggregatorConfig("argmax"), 0).tolist() == [0, 1, 1]
    assert privacy_record(AggregatorConfig("argmax"), h, a, delta=1e-5, n_teachers=3) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "gnmax", "sigma": 0.0}, "sigma > 0"),
        ({"name": "lnmax", "sigma": -1.0}, "sigma > 0"),
        ({"name": "gnmax"}, "needs --sigma"),
        ({"name": "confident-gnmax", "sigma": 1.0, "sigma1": 1.0}, "--threshold"),
        ({"name": "confident-gnmax", "sigma": 1.0, "sigma1": 1.0, "threshold": -1.0}, "threshold >= 0"),
        ({"name": "gnmax", "sigma": 1.0, "threshold": 3.0}, "only to confident-gnmax"),
        ({"name": "argmax", "sigma": 1.0}, "no noise"),
        ({"name": "rnm", "sigma": 1.0}, "aggregator"),
    ],
)
def test_bad_aggregator_config(kwargs, message):
    with pytest.raises(InputError, match=message):
        AggregatorConfig(**kwargs)


def test_threshold_above_teacher_count_is_rejected():
    from dpaudit.training.pate import AggregationConfig

    agg = AggregatorConfig("confident-gnmax", sigma=1.0, sigma1=1.0, threshold=30.0)
    with pytest.raises(InputError, match=r"threshold in \[0, 20\]"):
        AggregationConfig(algo="pate", teachers=20, aggregator=agg, queries=10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "argmax", "sigma": 1.0}, "the argmax aggregator adds no noise; give no --sigma"),
        ({"name": "gnmax"}, "the gnmax aggregator needs --sigma"),
        ({"name": "lnmax", "sigma": 0.0}, "sigma"),
        ({"name": "gnmax", "sigma": math.inf}, "sigma"),
        ({"name": "confident-gnmax", "sigma": 1.0, "threshold": 5.0}, "confident-gnmax needs --sigma1 and --threshold"),
        ({"name": "confident-gnmax", "sigma": 1.0, "sigma1": 2.0}, "confident-gnmax needs --sigma1 and --threshold"),
        ({"name": "confident-gnmax", "sigma": 1.0, "sigma1": 0.0, "threshold": 5.0}, "sigma1"),
        ({"name": "confident-gnmax", "sigma": 1.0, "sigma1": math.inf, "threshold": 5.0}, "sigma1"),
        ({"name": "confident-gnmax", "sigma": 1.0, "sigma1": 2.0, "threshold": -1.0}, "threshold"),
        ({"name": "gnmax", "sigma": 1.0, "sigma1": 2.0}, "apply only to confident-gnmax"),
        ({"name": "gnmax", "sigma": 1.0, "threshold": 2.0}, "apply only to confident-gnmax"),
        ({"name": "gnmax", "sigma": 1.0, "max_answers": 3}, "apply only to confident-gnmax"),
        ({"name": "confident-gnmax", "sigma": 1.0, "sigma1": 2.0, "threshold": 5.0, "max_answers": 0}, "max_answers"),
        ({"name": "lnmax", "sigma": 1.0, "sample_rate": 0.5}, "--subsample applies to the gnmax aggregator, not lnmax"),
        ({"name": "gnmax", "sigma": 1.0, "sample_rate": 0.0}, "sample_rate"),
        ({"name": "gnmax", "sigma": 1.0, "sample_rate": 1.5}, "sample_rate"),
    ],
)
def test_aggregator_settings_outside_their_mechanism_are_refused(kwargs, message):
    # Every setting is privacy-relevant: one the accounting does not read (a sigma1 on plain GNMax, a subsample rate
    # on LNMax) would be a claim about a mechanism that did not run.
    with pytest.raises(InputError, match=message):
        AggregatorConfig(**kwargs)


def test_aggregator_settings_at_their_bounds_are_accepted():
    AggregatorConfig("confident-gnmax", sigma=1.0, sigma1=2.0, threshold=0.0, max_answers=1)
    AggregatorConfig("gnmax", sigma=1.0, sample_rate=1.0)  # q = 1: no subsampling
    AggregatorConfig("argmax")
    config = AggregatorConfig("confident-gnmax", sigma=1.0, sigma1=2.0, threshold=10.0)
    config.check_teachers(10)  # T = K: every teacher must agree
    with pytest.raises(InputError, match=r"expected threshold in \[0, 9\] \(the number of teachers\), got 10"):
        config.check_teachers(9)
    AggregatorConfig("gnmax", sigma=1.0).check_teachers(1)  # no threshold: nothing to check


def test_privacy_record_counts_answers_and_names_the_neighbouring_relation():
    # answers: -1 = not answered (Confident-GNMax's threshold), any class >= 0 (class 0 too) = answered.
    from dpaudit.aggregation import NEIGHBOURING_NOTE, SUBSAMPLED_NOTE

    hist = vote_histogram(np.array([[0, 1, 1], [0, 2, 0], [0, 2, 1]]), 3)
    answers = np.array([0, -1, 1])
    rec = privacy_record(AggregatorConfig("gnmax", sigma=2.0), hist, answers, delta=1e-5, n_teachers=3)
    assert (rec["n_answered"], rec["n_queries"], rec["n_teachers"]) == (2, 3, 3)
    assert rec["neighbouring"] == "replace_one" and rec["analysis"].endswith(NEIGHBOURING_NOTE)
    sub = privacy_record(AggregatorConfig("gnmax", sigma=2.0, sample_rate=0.1), hist, answers, delta=1e-5, n_teachers=3)
    assert sub["neighbouring"] == "add_remove" and sub["analysis"].endswith(SUBSAMPLED_NOTE)
    assert sub["analysis"].startswith("data-independent (formal): ")
    with pytest.raises(InputError, match="claim"):
        privacy_record(AggregatorConfig("gnmax", sigma=2.0), hist, answers, delta=1e-5, n_teachers=3, claim="both")
    # LNMax records its pure-DP epsilon beside the (epsilon, delta) one.
    lnmax = AggregatorConfig("lnmax", sigma=2.0)
    want = data_independent_epsilon(lnmax, 3, 3, 1e-5)["pure_dp_epsilon"]
    assert privacy_record(lnmax, hist, answers, delta=1e-5, n_teachers=3)["pure_dp_epsilon"] == want


def test_a_data_dependent_record_uses_the_sanitiser_asked_for():
    # The user's sanitiser settings reach the sanitiser and the record (not the defaults); the analysis names the
    # neighbouring relation.
    from dpaudit.accounting.pate_smooth import SanitiserConfig
    from dpaudit.aggregation import NEIGHBOURING_NOTE, SANITISED_NOTE

    config = AggregatorConfig("gnmax", sigma=40.0)
    hist = np.tile([90, 5, 5], (20, 1))
    answers = aggregate(hist, config, 0)
    asked = SanitiserConfig(order=7.0)
    rec = privacy_record(config, hist, answers, delta=1e-5, n_teachers=100, claim="data-dependent", sanitiser=asked)
    assert rec["sanitiser"]["order"] == 7.0 and rec["sanitised"]["order"] == 7.0
    assert rec["analysis"].startswith(SANITISED_NOTE) and rec["analysis"].endswith(NEIGHBOURING_NOTE)


def test_confident_gnmax_gate_cap_and_argmax_follow_the_algorithm():
    # Papernot et al. 2018, Alg. 1, with sigma1 and sigma2 tiny (1e-9) so the outcome is the noiseless one: answer
    # (argmax_j n_j) when max_j n_j + N(0, sigma1^2) >= T, else -1; after max_answers answers, -1 (sequential).
    hist = np.array([[0, 9, 1], [4, 3, 3], [2, 0, 8], [10, 0, 0], [1, 6, 3]])
    cfg = AggregatorConfig("confident-gnmax", sigma=1e-9, sigma1=1e-9, threshold=4.5)
    np.testing.assert_array_equal(aggregate(hist, cfg, 0), [1, -1, 2, 0, 1])  # max 4 < T: declined
    capped = AggregatorConfig("confident-gnmax", sigma=1e-9, sigma1=1e-9, threshold=4.5, max_answers=3)
    np.testing.assert_array_equal(aggregate(hist, capped, 0), [1, -1, 2, 0, -1])  # class 0 counts as an answer
    np.testing.assert_array_equal(aggregate(hist, AggregatorConfig("argmax"), 0), [1, 0, 2, 0, 1])
    # The noise is there: max_j n_j = T passes the check with probability 1/2, and a two-way tie goes either way
    # with probability 1/2 each; 4,000 rows, each share within 0.04 of 1/2 (over 5 standard errors).
    tied = np.tile([5, 5, 0], (4000, 1))
    noisy = aggregate(tied, AggregatorConfig("confident-gnmax", sigma=1.0, sigma1=1.0, threshold=5.0), 0)
    assert abs(np.mean(noisy >= 0) - 0.5) < 0.04 and abs(np.mean(noisy[noisy >= 0] == 1) - 0.5) < 0.04


def test_aggregator_events_are_the_mechanisms_that_ran():
    from dpaudit.events import GNMax, LNMax, NonPrivate, PoissonSampled, SelfComposed

    assert aggregator_event(AggregatorConfig("argmax"), 3, 4) == NonPrivate()
    assert aggregator_event(AggregatorConfig("lnmax", sigma=2.0), 3, 4) == SelfComposed(LNMax(2.0, 4), 3)
    assert aggregator_event(AggregatorConfig("gnmax", sigma=2.0), 3, 4) == SelfComposed(GNMax(2.0, 4), 3)
    # Subsampled GNMax: one record moves one teacher's vote, the histogram by sqrt(2) in L2 (Papernot et al. 2018,
    # Prop. 8), so a Gaussian of noise multiplier sigma / sqrt(2) per query, Poisson-sampled at q.
    sub = aggregator_event(AggregatorConfig("gnmax", sigma=3.0, sample_rate=0.1), 3, 4)
    assert isinstance(sub, SelfComposed) and sub.count == 3 and isinstance(sub.event, PoissonSampled)
    assert sub.event.sample_rate == 0.1 and sub.event.event.noise_multiplier == pytest.approx(3.0 / math.sqrt(2.0))
    # argmax: no claim (inf, no accountant); delta outside (0, 1) refused.
    none = data_independent_epsilon(AggregatorConfig("argmax"), 3, 4, 1e-5)
    assert none["epsilon"] == math.inf and none["accountant"] is None
    for delta in (0.0, 1.0, 1.5):
        with pytest.raises(InputError, match="delta"):
            data_independent_epsilon(AggregatorConfig("gnmax", sigma=3.0), 3, 4, delta)
    # Confident-GNMax: every query pays the check; at most max_answers (and at most n_queries) pay an answer.
    for cap, paid in ((None, 3), (2, 2), (10, 3)):
        cfg = AggregatorConfig("confident-gnmax", sigma=2.0, sigma1=5.0, threshold=1.0, max_answers=cap)
        check, answer = aggregator_event(cfg, 3, 4).events
        assert (check.count, check.event.noise_multiplier, answer.count) == (3, 5.0, paid)
    with pytest.raises(InputError, match="n_queries"):
        aggregator_event(AggregatorConfig("gnmax", sigma=2.0), 0, 4)


def test_data_dependent_rdp_sums_the_per_query_curves_it_should():
    # RDP composes by summing at each order (Mironov 2017, Prop. 1). LNMax: every query, Papernot et al. 2017 Thm. 3
    # with pure eps = 2/b (b = sigma); GNMax: every query; Confident-GNMax: every query pays the threshold check,
    # only the answered ones (answer >= 0, class 0 included) pay GNMax (Papernot et al. 2018, Alg. 1).
    from dpaudit.accounting.pate_smooth import (
        log_q_gnmax,
        log_q_lnmax,
        rdp_gnmax_data_dependent,
        rdp_lnmax_data_dependent,
        rdp_threshold_data_dependent,
    )
    from dpaudit.aggregation import data_dependent_rdp

    hist = np.array([[40.0, 5, 5], [30, 15, 5], [20, 20, 10], [45, 3, 2]])
    answers = np.array([0, -1, 1, 0])
    lnmax = AggregatorConfig("lnmax", sigma=3.0)
    want = sum(rdp_lnmax_data_dependent(float(lq), 2.0 / 3.0, ORDERS) for lq in log_q_lnmax(hist, 3.0))
    np.testing.assert_allclose(data_dependent_rdp(hist, answers, lnmax, ORDERS), want, rtol=1e-13)
    gn = AggregatorConfig("gnmax", sigma=4.0)
    want = sum(rdp_gnmax_data_dependent(float(lq), 4.0, ORDERS) for lq in log_q_gnmax(hist, 4.0))
    np.testing.assert_allclose(data_dependent_rdp(hist, answers, gn, ORDERS), want, rtol=1e-13)
    conf = AggregatorConfig("confident-gnmax", sigma=4.0, sigma1=10.0, threshold=25.0)
    check = sum(rdp_threshold_data_dependent(float(m), 25.0, 10.0, ORDERS) for m in hist.max(1))
    answer = sum(rdp_gnmax_data_dependent(float(lq), 4.0, ORDERS) for lq in log_q_gnmax(hist[[0, 2, 3]], 4.0))
    np.testing.assert_allclose(data_dependent_rdp(hist, answers, conf, ORDERS), check + answer, rtol=1e-13)
    none = data_dependent_rdp(hist, np.full(4, -1), conf, ORDERS)  # nothing answered: the checks only
    np.testing.assert_allclose(none, check, rtol=1e-13)
    with pytest.raises(InputError, match="covers lnmax, gnmax and confident-gnmax, not argmax"):
        data_dependent_rdp(hist, answers, AggregatorConfig("argmax"), ORDERS)


def test_vote_histogram_counts_by_hand_and_bad_votes_or_histograms_are_refused():
    votes = np.array([[0, 1, 2, 2], [1, 1, 0, 2]])  # 2 teachers x 4 queries
    np.testing.assert_array_equal(vote_histogram(votes, 3), [[1, 1, 0], [0, 2, 0], [1, 0, 1], [0, 0, 2]])
    for bad, pattern in (
        (np.array([0, 1, 2]), "expected votes as a 2-D integer array"),
        (votes.astype(float), "expected votes as a 2-D integer array"),
        (votes - 1, r"expected votes in \[0, 3\), got values in \[-1, 1\]"),
        (votes + 1, r"expected votes in \[0, 3\), got values in \[1, 3\]"),
    ):
        with pytest.raises(InputError, match=pattern):
            vote_histogram(bad, 3)
    assert vote_histogram(np.zeros((3, 0), int), 3).shape == (0, 3)  # no queries
    gn = AggregatorConfig("gnmax", sigma=1.0)
    for hist in (np.array([1.0, 2.0]), np.array([[3.0], [2.0]]), np.zeros((2, 3, 1))):
        with pytest.raises(InputError, match=r"expected a \(queries, classes >= 2\) vote histogram"):
            aggregate(hist, gn, 0)
    for hist in (np.array([[1.0, -1.0]]), np.array([[1.0, np.nan]]), np.array([[1.0, np.inf]])):
        with pytest.raises(InputError, match="vote counts must be finite and non-negative"):
            aggregate(hist, gn, 0)


def test_private_diagnostics_are_the_capped_raw_epsilon_and_the_sanitisers_hidden_values():
    # private_diagnostics (NOT private, for the experimenter): the raw data-dependent epsilon capped at the
    # data-independent one (Papernot et al. 2018: the data-dependent bound is never used above the data-independent
    # one), for GNMax/Confident-GNMax also the raw RDP and smooth sensitivity the sanitiser hid, at its order.
    from dpaudit.accounting.pate_smooth import SanitiserConfig, per_query_rdp
    from dpaudit.aggregation import DATA_DEPENDENT_NOTE

    q, c, k = 6, 3, 30
    flat = np.full((q, c), k // c)  # no consensus at all: the data-dependent bound gains nothing
    answers = np.array([0, -1, 1, 2, -1, 0])  # -1: not answered; class 0 is an answer
    argmax = AggregatorConfig("argmax")
    assert private_diagnostics(argmax, flat, answers, delta=1e-5, n_teachers=k) == {
        "private": False, "note": DATA_DEPENDENT_NOTE,
    }  # fmt: skip
    # LNMax (b = 5) on flat votes: the raw data-dependent epsilon is above the data-independent one for 6 queries
    # (2.4005 vs 2.3998), so the diagnostic is the latter exactly; for 3 queries (the classes) it would be 1.2.
    lnmax = AggregatorConfig("lnmax", sigma=5.0)
    di = data_independent_epsilon(lnmax, q, c, 1e-5)["epsilon"]
    assert (
        data_dependent_epsilon(flat, answers, lnmax, 1e-5) > di > data_independent_epsilon(lnmax, c, c, 1e-5)["epsilon"]
    )
    diag = private_diagnostics(lnmax, flat, answers, delta=1e-5, n_teachers=k)
    assert diag == {"private": False, "note": DATA_DEPENDENT_NOTE, "data_dependent_epsilon": di}  # no sanitiser keys
    # Confident-GNMax: the raw RDP is the threshold checks of all 6 queries plus GNMax on the 4 answered ones (class 0
    # included, -1 not), at the order of the sanitiser asked for (12, not the public rule's).
    cfg = AggregatorConfig("confident-gnmax", sigma=40.0, sigma1=150.0, threshold=5.0)
    params = {"sigma": 40.0, "sigma1": 150.0, "threshold": 5.0, "max_answers": None}
    answered = np.array([True, False, True, True, False, True])
    for sanitiser, order in ((SanitiserConfig(order=12.0), 12.0), (None, None)):
        diag = private_diagnostics(cfg, flat, answers, delta=1e-5, n_teachers=k, sanitiser=sanitiser)
        order = order or diag["order"]
        assert diag["order"] == order and diag["smooth_sensitivity"] > 0
        assert diag["data_dependent_rdp"] == per_query_rdp("confident-gnmax", flat, answered, params, order)
        assert diag["data_dependent_rdp"] != per_query_rdp("confident-gnmax", flat, answers > 0, params, order)
    assert order != 12.0  # the default is the public rule's
    gn = private_diagnostics(AggregatorConfig("gnmax", sigma=40.0), flat, answers, delta=1e-5, n_teachers=k)
    assert set(gn) == {"private", "note", "data_dependent_epsilon", "data_dependent_rdp", "smooth_sensitivity", "order"}
