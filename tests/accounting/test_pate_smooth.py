"""PATE's smooth-sensitivity sanitiser (dpaudit/accounting/pate_smooth.py).

Oracles: the local-sensitivity arrays the authors published for fixed vote histograms (tensorflow/privacy,
research/pate_2018/smooth_sensitivity_test.py, values copied as numbers; our code is written from the paper
and reproduces them), the definition of smooth sensitivity on hand-made arrays, and a statistical check that
the sanitised claim is not below the raw data-dependent RDP (with the margin removed, it is half the time).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpaudit.accounting.pate_smooth import (
    SanitiserConfig,
    gnss_rdp,
    local_sensitivity_gnmax,
    local_sensitivity_threshold,
    rdp_lnmax_data_dependent,
    sanitised_claim,
    smooth_sensitivity,
)
from dpaudit.aggregation import AggregatorConfig, aggregate, data_independent_epsilon, privacy_record
from dpaudit.errors import InputError

# --------------------------------------------------------------------------- the authors' published values


def test_gnmax_local_sensitivity_matches_the_reference_going_right():
    # votes (10, 0, 0), 10 teachers, sigma 0.5, order 1.5: q below q1, the walk narrows the gap
    want = np.array([3.13503646e-17, 1.60178280e-08, 5.90681786e-03] + [5.99981308e00] * 7)
    got = local_sensitivity_gnmax(np.array([10, 0, 0]), 10, 0.5, 1.5)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=0)


def test_gnmax_local_sensitivity_matches_the_reference_going_left():
    # votes (1000, 500, 300, 200, 0), 2000 teachers, sigma 250, order 10: q above q0, the walk widens the gap
    want = np.array([0.0] * 298 + [2.77693450548e-7, 2.10853979548e-6] + [2.73113623988e-6] * 1700)
    got = local_sensitivity_gnmax(np.array([1000, 500, 300, 200, 0]), 2000, 250.0, 10.0)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=0)


THRESHOLD_CASES = [
    # (threshold, expected) for votes max 20 of 30 teachers, sigma1 = 2, order 10
    (16, [0] * 3 + [1.48454129e-04, 1.47826870e-02, 3.94153241e-02, 6.45775697e-02, 9.01543247e-02,
                    1.16054002e-01, 1.42180452e-01, 1.42180452e-01, 1.48454129e-04, 1.47826870e-02,
                    3.94153241e-02, 6.45775697e-02, 9.01543266e-02, 1.16054000e-01, 1.42180452e-01,
                    1.68302106e-01, 1.93127860e-01] + [0] * 10),
    (2, [1.60212079e-01, 2.07021132e-01, 2.07021132e-01, 1.93127860e-01, 1.68302106e-01, 1.42180452e-01,
         1.16054002e-01, 9.01543247e-02, 6.45775697e-02, 3.94153241e-02, 1.47826870e-02, 1.48454129e-04]
        + [0] * 18),
    (50, [1.35750725752e-19, 1.88990500499e-17, 2.05403154065e-15, 1.74298153642e-13, 1.15489723995e-11,
          5.97584949325e-10, 2.41486826748e-08, 7.62150641922e-07, 1.87846248741e-05, 0.000360973025976,
          0.000360973025976, 2.76377015215e-50, 1.00904975276e-53, 2.87254164748e-57, 6.37583360761e-61,
          1.10331620211e-64, 1.48844393335e-68, 1.56535552444e-72, 1.28328011060e-76, 8.20047697109e-81]
         + [0] * 10),
]  # fmt: skip


@pytest.mark.parametrize(("threshold", "want"), THRESHOLD_CASES)
def test_threshold_local_sensitivity_matches_the_reference(threshold, want):
    got = local_sensitivity_threshold(20, 30, threshold, 2.0, 10.0)
    # the reference prints 9 significant digits (and its own symmetric entries differ in the 8th)
    np.testing.assert_allclose(got, np.array(want, dtype=float), rtol=1e-7, atol=0)


# --------------------------------------------------------------------------- definitions


def test_smooth_sensitivity_takes_the_max_within_distance_d():
    ls = np.array([0.0, 5.0, 0.0, 0.0, 1.0])
    # A(d) = max_{d' <= d}: (0, 5, 5, 5, 5); e^{-beta d} A(d) peaks at d = 1
    assert smooth_sensitivity(ls, 0.1) == pytest.approx(5.0 * math.exp(-0.1))
    assert smooth_sensitivity(ls, 0.0) == 5.0
    assert smooth_sensitivity(np.array([1.0, 0.0, 0.0, 9.0]), 1.0) == pytest.approx(max(1.0, 9.0 * math.exp(-3.0)))


def test_gnss_rdp_is_theorem_23_and_refuses_orders_outside_its_range():
    lam, beta, s = 20.0, 0.02, 10.0
    want = lam * math.exp(2 * beta) / s**2 + (-0.5 * math.log(1 - 2 * lam * beta) + beta * lam) / (lam - 1)
    assert gnss_rdp(beta, s, lam) == pytest.approx(want, rel=1e-14)
    with pytest.raises(InputError, match="1/\\(2 beta\\)"):
        gnss_rdp(0.05, s, 10.0)
    for order in (1.0, 0.8):  # Thm. 23 needs lambda > 1 (order 1 divided by zero, 0.8 gave a number)
        with pytest.raises(InputError, match="1 < order"):
            gnss_rdp(0.01, s, order)


def test_threshold_local_sensitivity_is_the_largest_neighbouring_change_at_distance_d():
    """By its definition, for maxima below half the teachers and at the ends (the published arrays are all at a
    maximum of 20 of 30, where max(cur, K - cur) = cur: a walk over d < cur only passed them, and missed the counts
    10..30 around a threshold of 16 for a maximum of 5): at distance d, the largest |RDP(v) - RDP(v +- 1)| over
    v = max n +- d within [0, K], from the threshold check's RDP at each count."""
    from dpaudit.accounting.pate_smooth import rdp_threshold_data_dependent

    order, s1 = 10.0, 2.0
    for mx, k, thr in ((5, 30, 16.0), (2, 12, 4.0), (12, 12, 10.0), (0, 6, 1.0)):
        r = [float(rdp_threshold_data_dependent(v, thr, s1, np.array([order]))[0]) for v in range(k + 1)]
        change = [
            max(abs(r[v] - r[v - 1]) if v > 0 else 0.0, abs(r[v + 1] - r[v]) if v < k else 0.0) for v in range(k + 1)
        ]
        want = [max([change[v] for v in (mx - d, mx + d) if 0 <= v <= k], default=0.0) for d in range(k)]
        got = local_sensitivity_threshold(mx, k, thr, s1, order)
        # compared as the sanitiser uses them, A(d) = max over d' <= d: the arrays stop one distance before the count
        # reaches 0 or K (as the published ones do), whose change is already counted at the count next to it
        np.testing.assert_allclose(np.maximum.accumulate(got), np.maximum.accumulate(want), rtol=1e-12, atol=0)


def test_lnmax_data_dependent_rdp_is_below_its_data_independent_bounds_and_vanishes_on_consensus():
    orders = np.array([2.0, 5.0, 20.0])
    eps = 2.0 / 20.0  # Laplace b = 20
    di = np.minimum(0.5 * eps**2 * orders, eps)
    assert np.all(rdp_lnmax_data_dependent(math.log(0.5), eps, orders) <= di + 1e-15)
    small = rdp_lnmax_data_dependent(-50.0, eps, orders)
    assert np.all(small < 1e-3 * di)
    assert np.all(np.diff([rdp_lnmax_data_dependent(lq, eps, orders)[1] for lq in (-50.0, -20.0, -5.0)]) >= 0)


def test_lnmax_data_dependent_rdp_is_the_published_minimum_of_three_bounds():
    """The value, not only its order: min(eps^2 lambda / 2 (Bun & Steinke 2016, Prop. 1.4), eps (pure DP), and,
    where q <= 1/(e^eps + 1) = (e^(2 gamma) - 1)/(e^(4 gamma) - 1) with eps = 2 gamma, Papernot et al. 2017
    (arXiv:1610.05755), Thm. 3: log((1 - q) ((1 - q)/(1 - e^eps q))^(lambda - 1) + q e^(eps (lambda - 1)))
    / (lambda - 1)), written out in 60-digit arithmetic. The old test checked only "below the data-independent
    bounds and small on consensus": Thm. 3's second term without its e^(eps (lambda - 1)) factor, or
    eps^2 lambda / 4, passed it (RDP under-reported)."""

    import mpmath

    orders = np.array([1.5, 2.0, 3.0, 5.0, 8.0, 20.0, 64.0])
    for eps in (0.05, 0.1, 0.5, 1.0, 2.0):
        for lq in (-50.0, -20.0, -8.0, -3.0, -1.5, -1.0, -0.7, -0.3):
            got = rdp_lnmax_data_dependent(lq, eps, orders)
            with mpmath.workdps(60):
                q, e = mpmath.exp(lq), mpmath.mpf(eps)
                for lam, g in zip(orders, got, strict=True):
                    want = min(e**2 * lam / 2, e)
                    if q <= 1 / (mpmath.exp(e) + 1):
                        thm3 = mpmath.log((1 - q) * ((1 - q) / (1 - mpmath.exp(e) * q)) ** (lam - 1)
                                          + q * mpmath.exp(e * (lam - 1))) / (lam - 1)  # fmt: skip
                        want = min(want, thm3)
                    assert g == pytest.approx(float(want), rel=1e-9, abs=0), (eps, lq, lam)
    assert np.array_equal(rdp_lnmax_data_dependent(-math.inf, 0.5, orders), np.zeros(len(orders)))  # certain output


def test_lnmax_q_bound_per_row_wherever_the_top_class_is():
    """Lemma 4's union bound row by row, with the top class in different columns: sum over i != i* of
    (2 + g_i/b)/4 e^(-g_i/b), g_i = n_i* - n_i, capped at 1 - 1/C (a mutant taking argmax over the wrong axis passed the
    one-row tests, whose top class is in column 0)."""
    from dpaudit.accounting.pate_smooth import log_q_lnmax

    hist = np.array([[10.0, 8.0, 1.0], [0.0, 3.0, 12.0], [2.0, 30.0, 2.0], [9.0, 1.0, 0.0]])
    b = 2.0
    for row, got in zip(hist, log_q_lnmax(hist, b), strict=True):
        top = int(np.argmax(row))
        g = [(row[top] - n) / b for i, n in enumerate(row) if i != top]
        want = min(math.fsum((2 + x) / 4 * math.exp(-x) for x in g), 1 - 1 / 3)
        assert got == pytest.approx(math.log(want), rel=1e-13, abs=0)


def test_a_certain_answer_costs_nothing_not_a_negative_rdp():
    """q = 0 (log q = -inf: here Pr[N(0, 2 s^2) >= 1e6] at s = 1e-300 underflows) is an answer that cannot change:
    beta = 0 exactly. A mutant returning -1 there passed every test; per query it would subtract 1 from the claim."""
    from dpaudit.accounting.pate_smooth import _beta_gnmax, log_q_gnmax, per_query_rdp

    hist = np.array([[1e6, 0.0]])
    assert log_q_gnmax(hist, 1e-300)[0] == -math.inf
    assert _beta_gnmax(-math.inf, 2.0, 3.0) == 0.0
    assert per_query_rdp("gnmax", hist, np.ones(1, bool), {"sigma": 1e-300}, 2.0) == 0.0


# --------------------------------------------------------------------------- the sanitised claim


def _consensus(k: int, q: int, agree: float, c: int = 10) -> np.ndarray:
    hist = np.zeros((q, c), np.int64)
    hist[:, 0] = round(k * agree)
    hist[:, 1] = k - hist[:, 0]
    return hist


def test_sanitised_claim_is_below_the_data_independent_one_with_many_agreeing_teachers():
    """The paper's regime (many teachers, large sigma, consensus): the sanitised data-dependent claim, with
    every release charged, is below the data-independent claim."""
    cfg = AggregatorConfig("gnmax", sigma=100.0)
    for agree in (1.0, 0.9):
        hist = _consensus(1000, 1000, agree)
        rec = privacy_record(cfg, hist, aggregate(hist, cfg, 0), delta=1e-5, n_teachers=1000, claim="data-dependent")
        di = data_independent_epsilon(cfg, 1000, 10, 1e-5)["epsilon"]
        assert rec["claim"] == "data-dependent" and rec["data_independent_epsilon"] == di
        assert rec["epsilon"] < 0.7 * di
        assert rec["epsilon"] > rec["sanitised"]["sanitiser_rdp"] + rec["sanitised"]["conversion"]
        assert "data_dependent_rdp" not in rec["sanitised"] and "smooth_sensitivity" not in rec["sanitised"]


def test_sanitised_upper_value_is_not_below_the_raw_rdp_and_the_margin_is_what_ensures_it():
    """With delta = 0.2 the upper value may fall below the raw data-dependent RDP with probability <= 0.1;
    over 200 sanitiser draws (binomial, p <= 0.1) more than 35 misses has probability < 1e-4. Without the
    margin (the paper's bare GNSS value) it misses about half of the time."""
    hist = _consensus(100, 50, 0.8)
    params = {"sigma": 20.0, "sigma1": 0.0, "threshold": 0.0}
    answered = np.ones(len(hist), bool)
    cfg = SanitiserConfig(order=8.0)
    miss = bare = 0
    for seed in range(200):
        s = sanitised_claim("gnmax", hist, answered, n_teachers=100, params=params, delta=0.2, config=cfg,
                            rng=np.random.default_rng(seed))  # fmt: skip
        raw = s["private"]["data_dependent_rdp"]
        miss += s["public"]["upper_rdp"] < raw
        bare += s["public"]["released_rdp"] < raw
    assert miss <= 35
    assert 70 <= bare <= 130  # planted mistake (no margin): ~ Binomial(200, 1/2)


def test_sanitised_claim_is_the_published_arithmetic_of_its_two_draws():
    """The claim recomputed from its parts, each from its source: with the sanitiser's two standard normal draws
    (n1, n2, in that order, from the same seed), z = Phi^-1(1 - delta/4),
    S^ = SS e^(tau n1) e^(beta tau z), U = raw + SS sigma_s n2 + z sigma_s S^, the log-SS release's RDP
    lambda beta^2 / (2 tau^2) (a Gaussian mechanism of sensitivity beta: Mironov 2017, Prop. 7), GNSS's
    lambda e^(2 beta)/sigma_s^2 + (-log(1 - 2 lambda beta)/2 + beta lambda)/(lambda - 1) (Papernot et al. 2018,
    Thm. 23) and the conversion at delta/2 (Canonne, Kamath & Steinke 2020, Prop. 12). The old tests checked only
    that the claim is the sum of the record's own fields: S^ without its e^(beta tau z) margin, the log-SS cost with
    beta instead of beta^2, z at delta/2 instead of delta/4 (each an under-report) passed them. GNMax answers every
    query, so its claim does not depend on the answered mask (a mutant weighting GNMax by it passed too)."""
    from scipy import stats

    hist = _consensus(100, 30, 0.8)
    hist[::3, 0] -= 25  # some contested queries: a smooth sensitivity that is not tiny
    hist[::3, 1] += 25
    lam, bf, sigma_s, tau, delta = 8.0, 0.4, 1.5, 0.5, 1e-5
    beta = bf / lam
    cfg = SanitiserConfig(order=lam, beta_factor=bf, sigma_s=sigma_s, tau=tau)
    for kind, params in (("gnmax", {"sigma": 20.0}), ("confident-gnmax", {"sigma": 20.0, "sigma1": 10.0,
                                                                          "threshold": 60.0})):  # fmt: skip
        answered = np.arange(len(hist)) % 2 == 0
        s = sanitised_claim(kind, hist, answered, n_teachers=100, params=params, delta=delta, config=cfg,
                            rng=np.random.default_rng(7))  # fmt: skip
        pub, raw, ss = s["public"], s["private"]["data_dependent_rdp"], s["private"]["smooth_sensitivity"]
        assert ss > 1e-3
        n1, n2 = np.random.default_rng(7).standard_normal(2)
        z = stats.norm.isf(delta / 4)
        s_hat = ss * math.exp(tau * n1) * math.exp(beta * tau * z)
        upper = raw + ss * sigma_s * n2 + z * sigma_s * s_hat
        gnss = lam * math.exp(2 * beta) / sigma_s**2 + (-0.5 * math.log(1 - 2 * lam * beta) + beta * lam) / (lam - 1)
        conv = math.log(1 - 1 / lam) - (math.log(delta / 2) + math.log(lam)) / (lam - 1)
        want = max(upper, 0.0) + lam * beta**2 / (2 * tau**2) + gnss + conv
        assert pub["released_smooth_sensitivity_bound"] == pytest.approx(s_hat, rel=1e-9)
        assert pub["upper_rdp"] == pytest.approx(upper, rel=1e-9)
        assert pub["epsilon"] == pytest.approx(want, rel=1e-9)
        if kind == "gnmax":
            every = sanitised_claim(kind, hist, np.ones(len(hist), bool), n_teachers=100, params=params, delta=delta,
                                    config=cfg, rng=np.random.default_rng(7))  # fmt: skip
            assert every == s


def test_data_dependent_claim_is_refused_for_lnmax():
    cfg = AggregatorConfig("lnmax", sigma=20.0)
    hist = _consensus(50, 10, 1.0)
    with pytest.raises(InputError, match="gnmax or confident-gnmax"):
        privacy_record(cfg, hist, aggregate(hist, cfg, 0), delta=1e-5, n_teachers=50, claim="data-dependent")


def test_lnmax_q_bound_is_exact_for_two_classes_and_capped_at_one_minus_one_over_c():
    # log_q_lnmax had no test (coverage). With two classes the union bound is one term, the exact tail of the
    # difference of two Laplace(b) variables: Pr[L1 - L2 >= g] = (2 + g/b) / 4 e^(-g/b) (Papernot et al. 2017,
    # Lemma 4); with five classes at gaps 1/b = 1/3 the union bound exceeds 1 and is capped at 1 - 1/5.
    from dpaudit.accounting.pate_smooth import log_q_lnmax, per_query_rdp

    assert log_q_lnmax(np.array([[10.0, 8.0]]), 2.0)[0] == pytest.approx(math.log(3 / 4) - 1.0, rel=1e-14)
    assert log_q_lnmax(np.array([3.0, 2.0, 2.0, 2.0, 2.0]), 3.0)[0] == pytest.approx(math.log(0.8), rel=1e-14)
    # The data-dependent RDP covers gnmax and confident-gnmax only: another kind is refused, never accounted as GNMax.
    with pytest.raises(InputError, match="no data-dependent RDP for lnmax"):
        per_query_rdp("lnmax", np.array([[10.0, 8.0]]), np.ones(1, bool), {"sigma": 2.0}, 3.0)


def test_conversion_is_the_accounting_layers_and_the_order_ignores_the_answered_count():
    """The claim converts RDP at delta/2 as the data-independent claim does (Canonne, Kamath & Steinke 2020),
    not with Mironov's looser log(1/delta)/(lambda - 1); the order is fixed by public settings (the cap, not
    how many queries the private votes let through)."""
    from dpaudit.accounting.pate_smooth import conversion
    from dpaudit.accounting.rdp import rdp_to_epsilon

    for order in (2.0, 3.0, 8.0, 30.0):
        assert conversion(order, 5e-6) + 1.0 == pytest.approx(rdp_to_epsilon([order], [1.0], 5e-6)[0], rel=1e-12)
        assert conversion(order, 5e-6) < math.log(1 / 5e-6) / (order - 1)
    # 400 queries at sigma 20: were the order fitted to the answered count, 3 answers would give 4, 400 give 3
    hist = _consensus(50, 400, 0.9)
    params = {"sigma": 20.0, "sigma1": 10.0, "threshold": 42.0}
    few, many = np.zeros(400, bool), np.ones(400, bool)
    few[:3] = True

    def order(mask: np.ndarray) -> float:
        rng = np.random.default_rng(0)
        s = sanitised_claim("confident-gnmax", hist, mask, n_teachers=50, params=params, delta=1e-5,
                            config=SanitiserConfig(), rng=rng)  # fmt: skip
        return s["public"]["order"]

    assert order(few) == order(many)
    s = sanitised_claim("gnmax", hist, many, n_teachers=50, params=params, delta=1e-5,
                        config=SanitiserConfig(order=8.0), rng=np.random.default_rng(0))["public"]  # fmt: skip
    assert s["conversion"] == pytest.approx(conversion(8.0, 5e-6), rel=1e-12)
    assert s["epsilon"] == pytest.approx(s["upper_rdp"] + s["sanitiser_rdp"] + s["conversion"], rel=1e-12)


def test_sanitiser_settings_parse_and_bad_ones_are_one_line_errors():
    assert SanitiserConfig.parse("order=3, sigma_s=1.5,beta_factor=0.49,tau=0.5") == SanitiserConfig(
        order=3.0, sigma_s=1.5, beta_factor=0.49, tau=0.5
    )
    for bad, message in (
        ("order3", "key=value"),
        ("sigma=2", "key=value"),
        ("tau=x", "number"),
        ("order=1", "> 1"),
        ("prior_top=0", "prior_top"),
        ("beta_factor=0.5", "beta_factor"),
    ):
        with pytest.raises(InputError, match=message):
            SanitiserConfig.parse(bad)


def test_declined_queries_pay_only_the_threshold_check():
    """Confident-GNMax's data-dependent cost (Papernot et al. 2018, Sec. 4.2): every query pays the noisy
    threshold check, only the answered ones also pay GNMax."""
    from dpaudit.accounting.pate_smooth import per_query_rdp, rdp_threshold_data_dependent

    hist = np.array([[30, 15, 5], [48, 1, 1], [20, 20, 10]])
    params = {"sigma": 5.0, "sigma1": 10.0, "threshold": 42.0}
    threshold = sum(float(rdp_threshold_data_dependent(m, 42.0, 10.0, np.array([3.0]))[0]) for m in hist.max(1))
    none = per_query_rdp("confident-gnmax", hist, np.zeros(3, bool), params, 3.0)
    assert none == pytest.approx(threshold, rel=1e-12) and none > 0
    one = per_query_rdp("confident-gnmax", hist, np.array([False, False, True]), params, 3.0)
    assert one > none + 0.1  # the tied third histogram costs GNMax almost its data-independent 3/25


# --------------------------------------------------------------------------- the public rule (--sanitiser auto)

CONFIDENT = {"sigma": 5.0, "sigma1": 10.0, "threshold": 42.0, "max_answers": None}
SETTINGS = ("order", "beta_factor", "sigma_s", "tau")


def _auto_settings(hist: np.ndarray, answered: np.ndarray, config: SanitiserConfig | None = None) -> dict:
    s = sanitised_claim("confident-gnmax", hist, answered, n_teachers=50, params=CONFIDENT, delta=1e-5,
                        config=config or SanitiserConfig(), rng=np.random.default_rng(0))["public"]  # fmt: skip
    return {k: s[k] for k in (*SETTINGS, "chosen_by_public_rule", "fixed_by_user")}


def test_public_rule_does_not_read_the_votes():
    """The sanitiser's settings chosen by the public rule are identical for two very different vote histograms
    (and answered sets) with the same public settings, so choosing them releases nothing; the same votes with
    another public setting (a cap) change them, so the test would see a rule that ignored its inputs too."""
    rng = np.random.default_rng(1)
    unanimous = _consensus(50, 60, 1.0)
    noisy = np.stack([np.bincount(rng.integers(0, 10, 50), minlength=10) for _ in range(60)])
    a = _auto_settings(unanimous, np.ones(60, bool))
    b = _auto_settings(noisy, np.zeros(60, bool) | (np.arange(60) < 3))
    assert a == b
    assert a["chosen_by_public_rule"] == list(SETTINGS) and a["fixed_by_user"] == []
    capped = sanitised_claim("confident-gnmax", noisy, np.arange(60) < 3, n_teachers=50,
                             params={**CONFIDENT, "max_answers": 2}, delta=1e-5, config=SanitiserConfig(),
                             rng=np.random.default_rng(0))["public"]  # fmt: skip
    assert (capped["sigma_s"], capped["tau"]) != (a["sigma_s"], a["tau"])


def test_user_fixed_settings_are_kept_and_recorded_and_the_rest_come_from_the_rule():
    hist = _consensus(50, 60, 0.9)
    answered = np.ones(60, bool)
    fixed = _auto_settings(hist, answered, SanitiserConfig.parse("order=3,sigma_s=1.5,beta_factor=0.49,tau=0.5"))
    assert (fixed["order"], fixed["beta_factor"], fixed["sigma_s"], fixed["tau"]) == (3.0, 0.49, 1.5, 0.5)
    assert fixed["fixed_by_user"] == list(SETTINGS) and fixed["chosen_by_public_rule"] == []
    part = _auto_settings(hist, answered, SanitiserConfig(order=3.0))
    assert part["order"] == 3.0 and part["chosen_by_public_rule"] == ["beta_factor", "sigma_s", "tau"]
    assert SanitiserConfig.parse("auto") == SanitiserConfig()


def test_prior_is_the_threshold_consensus_answered_half_the_time_and_capped():
    """Confident-GNMax's prior: every query has T votes on top and K - T on a runner-up, answered with probability
    Pr[N(0, sigma1^2) >= 0] = 1/2 (so 100 expected answers of 200), never more than the cap."""
    from dpaudit.accounting.pate_smooth import GNMAX_PRIOR_TOP, prior_histogram

    hist, w = prior_histogram("confident-gnmax", 200, None, 10, 50, CONFIDENT)
    assert hist.shape == (200, 10) and np.all(hist[:, 0] == 42) and np.all(hist[:, 1] == 8) and hist[:, 2:].sum() == 0
    assert w.sum() == pytest.approx(100.0, rel=1e-12)
    assert prior_histogram("confident-gnmax", 200, 30, 10, 50, CONFIDENT)[1].sum() == pytest.approx(30.0, rel=1e-12)
    gn, w = prior_histogram("gnmax", 5, None, 3, 1000, {"sigma": 100.0})
    assert np.all(gn[:, 0] == round(GNMAX_PRIOR_TOP * 1000)) and w.sum() == 5.0
    assert prior_histogram("gnmax", 5, None, 3, 1000, {"sigma": 100.0}, prior_top=0.95)[0][0, 0] == 950


def test_rule_sigma_s_is_the_minimiser_of_the_expected_claim():
    """sigma_s = (2 b / a)^(1/3) minimises a sigma + b / sigma^2 (the expected margin plus GNSS's lambda e^(2 beta)
    / sigma^2, Thm. 23): nudging it either way by 5% raises the expected claim, and so does nudging tau."""
    from dpaudit.accounting.pate_smooth import _best_sigma_tau, expected_claim

    for ss, order, bf in ((0.4, 3.0, 0.45), (2e-3, 20.0, 0.49), (30.0, 2.0, 0.3)):
        sigma_s, tau = _best_sigma_tau(ss, order, bf, None, None, 1e-5)
        best = expected_claim(1.0, ss, order, bf, sigma_s, tau, 1e-5)
        for f in (0.95, 1.05):
            assert expected_claim(1.0, ss, order, bf, sigma_s * f, tau, 1e-5) > best
            assert expected_claim(1.0, ss, order, bf, sigma_s, tau * f, 1e-5) > best - 1e-9 * best


def test_rule_expected_claim_matches_the_mean_of_sanitised_draws():
    """expected_claim is what the rule minimises: over 200 sanitiser draws the mean claim agrees with it within 4
    standard errors (the claim's spread, ~1.4 here, is its two Gaussian draws times sigma_s SS; fixed seeds)."""
    from dpaudit.accounting.pate_smooth import _ls_sum, expected_claim, per_query_rdp

    hist = _consensus(50, 60, 0.9)
    answered = np.ones(60, bool)
    eps = [sanitised_claim("confident-gnmax", hist, answered, n_teachers=50, params=CONFIDENT, delta=1e-5,
                           config=SanitiserConfig(), rng=np.random.default_rng(s)) for s in range(200)]  # fmt: skip
    p = eps[0]["public"]
    want = expected_claim(eps[0]["private"]["data_dependent_rdp"], eps[0]["private"]["smooth_sensitivity"],
                          p["order"], p["beta_factor"], p["sigma_s"], p["tau"], 1e-5)  # fmt: skip
    claims = np.array([e["public"]["epsilon"] for e in eps])
    assert abs(claims.mean() - want) < 4.0 * claims.std() / math.sqrt(len(claims))
    assert claims.std() > 0.5  # the bound is not vacuous: the draws do spread
    raw = per_query_rdp("confident-gnmax", hist, answered, CONFIDENT, p["order"])
    ls = _ls_sum("confident-gnmax", hist, answered.astype(float), 50, CONFIDENT, p["order"])
    assert eps[0]["private"]["smooth_sensitivity"] == pytest.approx(smooth_sensitivity(ls, p["beta"]), rel=1e-12)
    assert eps[0]["private"]["data_dependent_rdp"] == pytest.approx(raw, rel=1e-12)


def test_one_vote_bounds_in_log_space_equal_the_erfc_formula():
    # App. C, Prop. 12: bl(q) = (m-1)/2 erfc(1/s + erfcinv(2q/(m-1))), bu(q) = min(1, (m-1)/2 erfc(-1/s + ...)),
    # here straight from scipy's erfc/erfcinv where q is a float64 (the log-space form must agree there).
    from scipy import special

    from dpaudit.accounting.pate_smooth import _log_bl, _log_bu

    for sigma in (2.0, 5.0, 20.0, 40.0):
        for m in (2, 3, 10):
            for logq in np.linspace(-40.0, math.log1p(-1.0 / m), 13):
                inv = special.erfcinv(2.0 * math.exp(logq) / (m - 1))
                bl = (m - 1) / 2.0 * special.erfc(1.0 / sigma + inv)
                bu = min(1.0, (m - 1) / 2.0 * special.erfc(-1.0 / sigma + inv))
                assert math.exp(_log_bl(logq, sigma, m)) == pytest.approx(bl, rel=1e-12, abs=0)
                assert math.exp(_log_bu(logq, sigma, m)) == pytest.approx(bu, rel=1e-12, abs=0)


def test_local_sensitivity_where_q0_is_below_the_smallest_float():
    # sigma 2, order 64: log q0 = -993, so q0 itself underflows to 0 in float64; the old
    # math.log(bl(exp(log q0))) raised "math domain error" (train --algo pate --aggregator confident-gnmax
    # --claim data-dependent --sigma 2 exited 3).
    # The walk itself is refused there (conditions C5-C6 fail at an order far above sigma); the per-histogram
    # bound it is made of still has to be finite.
    from dpaudit.accounting.pate_smooth import _ls_at, conditions_hold, log_q0, log_q_gnmax

    assert log_q0(2.0, 64.0) < math.log(np.finfo(float).tiny) - 200
    ls = [_ls_at(float(log_q_gnmax(np.array([a, 6.0 - a]), 2.0)[0]), 2.0, 2, 64.0) for a in range(7)]
    assert np.all(np.isfinite(ls)) and np.all(np.array(ls) >= 0.0)
    assert conditions_hold(2.0, 2, 64.0) is False


def _brute_two_class(a0: int, k: int, sigma: float, order: float) -> np.ndarray:
    """A(d) by its definition over every two-class histogram (a, k - a) within d changed votes of (a0, k - a0),
    each with the per-histogram bound of Prop. 13 (NRS07, Def. 2.1 / Lemma 2.3)."""
    from dpaudit.accounting.pate_smooth import _ls_at, log_q_gnmax

    ls = [_ls_at(float(log_q_gnmax(np.array([a, k - a], float), sigma)[0]), sigma, 2, order) for a in range(k + 1)]
    return np.array([max(ls[a] for a in range(k + 1) if abs(a - a0) <= d) for d in range(k)])


@pytest.mark.parametrize(
    ("sigma", "k", "order", "a0"),
    [(2.0, 20, 2.5, 12), (5.0, 40, 5.0, 30), (10.0, 100, 8.0, 55), (40.0, 250, 30.0, 200), (40.0, 250, 12.0, 130)],
)
def test_where_c5_c6_hold_the_walk_bounds_every_histogram_that_close(sigma, k, order, a0):
    """Where conditions C5-C6 hold, the walk's A(d) equals the brute-force maximum over every two-class histogram
    within d votes (checked on 864 settings, sigma 1-40, 20-250 teachers, benchmarks/RESULTS.md); these are the
    orders nearest sigma that pass, where the plateau is closest to being overtaken."""
    from dpaudit.accounting.pate_smooth import conditions_hold

    assert conditions_hold(sigma, 2, order)
    got = np.maximum.accumulate(local_sensitivity_gnmax(np.array([a0, k - a0], float), k, sigma, order))
    want = _brute_two_class(a0, k, sigma, order)
    assert np.allclose(got, want, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize(
    ("sigma", "k", "order", "a0"), [(2.0, 20, 5.0, 12), (5.0, 40, 8.0, 30), (40.0, 250, 40.0, 200)]
)
def test_where_c5_c6_fail_the_walk_is_refused_not_under_reported(sigma, k, order, a0):
    """Without C6 a histogram with a smaller q has a larger local sensitivity than the plateau the walk fills in
    (from (12, 8) of 20 teachers at sigma 2, order 5 the walk filled 0.1725 from (14, 6) on, while (15, 5) has 0.2583
    and (16, 4) 0.343: SS_beta 1.69 times too small; 2.8 times at 100 teachers, sigma 3, order 8; found by the ninth
    mutation pass's brute force; sigma 40, order 40: 0.9% more): the walk under-reported the smooth sensitivity,
    hence the sanitised epsilon. Now such a setting is refused (the brute force shows what it missed)."""
    from dpaudit.accounting.pate_smooth import _log_bl, _ls_at, conditions_hold, log_q0

    assert not conditions_hold(sigma, 2, order)
    plateau = _ls_at(_log_bl(log_q0(sigma, order), sigma, 2), sigma, 2, order)
    assert _brute_two_class(a0, k, sigma, order).max() > plateau * (1 + 1e-3)
    with pytest.raises(InputError, match="conditions C5-C6"):
        local_sensitivity_gnmax(np.array([a0, k - a0], float), k, sigma, order)


def test_c6_failing_just_below_q1_is_seen_by_the_condition_check():
    """At sigma 46.44, order 40, 3 classes, beta(bu(q)) - beta(q) rises up to ~0.0015 below log q1 and then falls by
    6.5e-11 (1.3e-7 of it; 1.6e-10 at sigma 46.433) to q1, so C6 fails; conditions_hold said True (the even grid's
    last step over [8 log q1, log q1] is 0.0053 wide and the fall was compared step by step), and the walk's plateau
    at q1 was below the local sensitivity of histograms with q just under q1. Oracle: Thm. 6 (Prop. 10's mu1, mu2),
    q0 its crossing with Prop. 8's lambda / sigma^2 and Prop. 12's bl, bu written out in 50-digit mpmath (Papernot
    et al. 2018)."""
    import mpmath as mp

    from dpaudit.accounting.pate_smooth import conditions_hold

    sigma, m, lam = 46.44, 3, 40
    with mp.workdps(50):
        s = mp.mpf(sigma)

        def thm6(lq):
            q, mu2 = mp.e**lq, s * mp.sqrt(-lq)
            mu1 = mu2 + 1
            a = (1 - q) / (1 - (q * mp.e ** (mu2 / s**2)) ** (1 - 1 / mu2))
            b = mp.e ** (mu1 / s**2) / q ** (1 / (mu1 - 1))
            return mp.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1)

        def log_b(lq, sign):  # log bl (sign +1) or log bu (sign -1), Prop. 12
            x = mp.erfinv(1 - 2 * mp.e**lq / (m - 1))  # erfcinv(2q / (m - 1))
            return min(mp.mpf(0), mp.log((m - 1) * mp.erfc(x + sign / s) / 2))

        lq0 = mp.findroot(lambda lq: thm6(lq) - lam / s**2, mp.mpf(-3))
        lq1 = log_b(lq0, +1)

        def c6(lq):  # beta(bu(q)) - beta(q) below q1 (q < q1 < q0: beta(q) is Thm. 6)
            up = log_b(lq, -1)
            return (lam / s**2 if up >= lq0 else thm6(up)) - thm6(lq)

        assert c6(lq1 - mp.mpf("0.0015")) - c6(lq1) > 5e-11  # a fall to q1: C6 fails (the check's tolerance: 5e-13)
    assert conditions_hold(sigma, m, float(lam)) is False
    assert conditions_hold(46.5, m, float(lam)) is True and conditions_hold(46.4, m, float(lam)) is False


def test_the_public_rule_picks_only_orders_where_the_analysis_holds(monkeypatch):
    """At sigma 2 the public rule searched every order of ORDER_GRID (it could choose one where C6 fails, whose
    smooth sensitivity was under-reported); now only 1.5, 2 and 2.5 qualify; a fixed order where C6 fails is
    refused in one line, and so is a grid where no order qualifies."""
    from dpaudit.accounting import pate_smooth
    from dpaudit.accounting.pate_smooth import ORDER_GRID, SanitiserConfig, choose_sanitiser, conditions_hold

    assert [o for o in ORDER_GRID if conditions_hold(2.0, 10, o)] == [1.5, 2.0, 2.5]
    args = {"params": {"sigma": 2.0}, "n_queries": 200, "max_answers": None, "n_classes": 10, "n_teachers": 50}
    assert choose_sanitiser("gnmax", delta=1e-5, **args).order in (1.5, 2.0, 2.5)
    with pytest.raises(InputError, match="conditions C5-C6"):
        choose_sanitiser("gnmax", delta=1e-5, fixed=SanitiserConfig(order=5.0), **args)
    monkeypatch.setattr(pate_smooth, "ORDER_GRID", (5.0, 8.0))
    with pytest.raises(InputError, match="holds at none of the Renyi orders 5, 8 at sigma 2"):
        choose_sanitiser("gnmax", delta=2e-5, **args)  # another delta: not the cached choice
