"""The noise check: exact level under the claim, power at the resolution it states, and the planted mistakes.

Level: under the claim (independent N(0, σ²C²) on every coordinate and step) the variance p-value
is uniform, so over N seeds the rejections at level a are Binomial(N, a); tolerances are 5 sd of
that binomial. Planted mistakes caught: degrees of freedom n − 1 instead of n (the mean is known,
not estimated), the pooled count T instead of T·n, σ estimated on the coordinates a canary touches,
reused noise, and a scale-dependent independence test (which would call *more* noise a violation).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dpaudit.audit.noise import independence_p_value, noise_check, resolvable_noise_ratio, variance_p_value
from dpaudit.errors import InputError

N_SIM = 4000


def _binomial_ok(rejections: int, n: int, a: float) -> bool:
    return abs(rejections - n * a) <= 5 * math.sqrt(n * a * (1 - a))


@pytest.mark.parametrize("dof", [1, 3, 40])
def test_variance_p_value_is_exactly_uniform_under_the_claim_and_wrong_dof_is_not(dof):
    rng = np.random.default_rng(dof)
    std = 1.7
    S = (rng.normal(scale=std, size=(N_SIM, dof)) ** 2).sum(axis=1)
    p = np.array([variance_p_value(s, dof, std) for s in S])
    assert stats.kstest(p, "uniform").pvalue > 1e-3
    for a in (0.01, 0.05, 0.2):
        assert _binomial_ok(int((p <= a).sum()), N_SIM, a)
    if dof <= 3:
        # Planted mistake: n − 1 degrees of freedom (as if the mean were estimated). It matters where few
        # values are pooled (a bias of a few coordinates over few steps): the level is then far off.
        wrong = stats.chi2.cdf(S / std**2, dof - 1) if dof > 1 else np.ones(N_SIM)
        assert not _binomial_ok(int((wrong <= 0.05).sum()), N_SIM, 0.05)


def test_noise_check_level_over_2000_seeds_of_a_correct_mechanism():
    """The whole check (variance over 3 groups + independence across steps and across groups) at α = 0.1: at
    most α, at most 5 sd above."""
    rng = np.random.default_rng(0)
    T, counts, K, std, alpha = 20, np.array([30, 5, 1]), 4, 0.8, 0.1
    n = 2000
    rejections = 0
    pair_counts = T * np.minimum.outer(counts, counts)  # each pair compares its common prefix
    for _ in range(n):
        z = [rng.normal(scale=std, size=(T, c)) for c in counts]
        ss = np.stack([(x**2).sum(axis=1) for x in z], axis=1)
        proj = rng.normal(scale=3.0, size=(T, K))
        cross = np.zeros((3, 3, 3))
        for a, b in ((0, 1), (0, 2), (1, 2)):  # the pairs tested (a < b)
            m = min(counts[a], counts[b])
            za, zb = z[a][:, :m], z[b][:, :m]
            cross[:, a, b] = (za * zb).sum(), (za * za).sum(), (zb * zb).sum()
        check = noise_check(ss, counts, proj, noise_std=std, alpha=alpha, cross=cross, cross_counts=pair_counts)
        rejections += check.verdict == "violation"
    assert rejections <= n * alpha + 5 * math.sqrt(n * alpha * (1 - alpha))
    assert rejections >= n * alpha / 4  # Bonferroni costs little here: the check is not vacuous


def test_pooled_count_must_be_steps_times_coordinates():
    """Planted mistake: the degrees of freedom taken as T (steps) instead of T·n (values): with n = 50
    coordinates the sum of squares is ~50 times the claimed count, so σC/√2 would never be flagged."""
    rng = np.random.default_rng(1)
    T, n, std = 30, 50, 1.0
    ss = (rng.normal(scale=std / math.sqrt(2), size=(T, n)) ** 2).sum(axis=1, keepdims=True)
    ok = noise_check(ss, np.array([n]), np.zeros((T, 0)), noise_std=std)
    assert ok.verdict == "violation" and ok.groups[0].ratio == pytest.approx(1 / math.sqrt(2), rel=0.05)
    assert variance_p_value(float(ss.sum()), T, std) > 0.5  # the wrong count sees no deficit at all


@pytest.mark.parametrize("dof", [100, 10_000])
def test_resolution_formula_is_the_power_one_half_point(dof):
    """At r = resolvable_noise_ratio(dof, α) the test rejects with probability 1/2 (simulated, 5 sd)."""
    a = 0.01
    r = resolvable_noise_ratio(dof, a)
    assert r < 1
    rng = np.random.default_rng(dof)
    S = stats.chi2.rvs(dof, size=N_SIM, random_state=rng) * r**2  # noise std r·σC, σC = 1
    rejected = int((stats.chi2.cdf(S, dof) <= a).sum())
    assert _binomial_ok(rejected, N_SIM, 0.5)
    # the normal approximation 1 − (z_α + z_½)/√(2n) quoted in the docs, within 2%
    assert r == pytest.approx(1 - stats.norm.isf(a) / math.sqrt(2 * dof), rel=0.02)


def test_own_training_loop_doc_sizing_table_and_sqrt2_power_are_the_formula():
    """docs/own-training-loop.md, "How to size the design": the table of resolvable ratios at the per-group level
    0.05/3/2/4 and the power against σC/√2 it quotes (it said ≥ 99% at 100 values; the χ² test gives 97.1%)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "own-training-loop.md").read_text()
    a = 0.05 / 3 / 2 / 4
    head = re.search(r"^\| values n·T \|(.*)\|$", doc, re.M).group(1).split("|")
    sizes = [int(float(c.strip().replace(" ", "").replace("10⁴", "1e4").replace("10⁵", "1e5")
                       .replace("10⁶", "1e6").replace("10⁷", "1e7"))) for c in head]  # fmt: skip
    for power, label in ((0.5, "½"), (0.9, "0.9")):
        row = re.search(rf"^\| r \(power {label}\) \|(.*)\|$", doc, re.M).group(1).split("|")
        for n, shown in zip(sizes, row, strict=True):
            digits = len(shown.strip().split(".")[1])
            assert round(resolvable_noise_ratio(n, a, power=power), digits) == float(shown), (n, power)
    m = re.search(
        r"caught with ≥ (\d+)% power by any group with ≥ (\d+) values.*?≥ (\d+)% from (\d+) values", doc, re.S
    )
    assert m, "the sentence on σC/√2 moved: update this test"
    for percent, n in ((m[1], m[2]), (m[3], m[4])):
        power = stats.chi2.cdf(2 * stats.chi2.ppf(a, int(n)), int(n))  # S/(σC)² ≤ c with S ~ (σC)²/2 · χ²_n
        assert power >= int(percent) / 100 > power - 0.01, (percent, n, power)


def test_independence_test_is_calibrated_scale_free_and_catches_reuse():
    rng = np.random.default_rng(2)
    p = np.array([independence_p_value(rng.normal(size=(12, 8))) for _ in range(N_SIM)])
    assert stats.kstest(p, "uniform").pvalue > 1e-3
    # scale-free: more noise than claimed (or different scales per projection) changes nothing
    P = rng.normal(size=(50, 8))
    assert independence_p_value(P * np.arange(1, 9) * 100) == pytest.approx(independence_p_value(P), rel=1e-9)
    # the same draw every step: no spread across steps -> p = 0
    reused = np.tile(rng.normal(size=(1, 8)), (50, 1)) + rng.normal(scale=1e-9, size=(50, 8))
    assert independence_p_value(reused) == 0.0
    # the same draw reused for 10 steps at a time (a generator re-seeded per epoch): still caught
    blocks = np.repeat(rng.normal(size=(10, 8)), 10, axis=0)
    assert independence_p_value(blocks) < 1e-3
    assert independence_p_value(P[:2]) is None


def test_independence_needs_a_matrix_of_three_steps_and_a_column():
    """None (no test) for fewer than 3 steps (a t-test on T values has T − 1 ≥ 2 degrees of freedom here), no column,
    or not a matrix; a p-value from 3 steps on. Planted (each passed the other tests): T < 4 or T ≤ 3, the column
    test dropped or K == 1, the matrix test dropped."""
    rng = np.random.default_rng(0)
    assert independence_p_value(rng.normal(size=(2, 4))) is None
    assert independence_p_value(np.zeros((5, 0))) is None
    assert independence_p_value(rng.normal(size=5)) is None
    assert independence_p_value(rng.normal(size=(4, 3, 2))) is None
    assert 0.0 < independence_p_value(rng.normal(size=(3, 1))) <= 1.0
    assert 0.0 < independence_p_value(rng.normal(size=(3, 4))) <= 1.0


def test_canary_coordinates_cannot_mask_a_noise_deficit():
    """Planted mistake: σ estimated on all coordinates, the canaries' included. A loop whose noise is
    σC/√2 except on the canary coordinates (where its own bug puts far more) passes a check that pools
    them and fails ours, which reads only the untouched coordinates."""
    from dpaudit.hooks import GradientCanaries

    shapes = {"w": (40,)}
    c = GradientCanaries(shapes, count=10, sample_rate=0.5, clip=1.0, seed=0)
    rng = np.random.default_rng(3)
    touched = np.zeros(40, bool)
    touched[c.coordinates_] = True
    pooled_ss = 0.0
    for t in range(30):
        g = c.inject(t, {"w": np.zeros(40)})
        z = np.where(touched, 30.0, 1 / math.sqrt(2)) * rng.normal(size=40)
        pooled_ss += float(z @ z)
        c.observe(t, {"w": g["w"] + z})
    obs = c.observations()
    ours = noise_check(obs.noise_ss, obs.noise_count, obs.projections, noise_std=1.0)
    assert ours.verdict == "violation"
    assert variance_p_value(pooled_ss, 30 * 40, 1.0) > 0.5  # the pooled estimate sees no deficit


def test_inputs():
    with pytest.raises(InputError):
        noise_check(np.ones((3, 2)), np.array([1]), np.zeros((3, 0)), noise_std=1.0)
    with pytest.raises(InputError):
        noise_check(np.ones((3, 1)), np.array([1]), np.zeros((3, 0)), noise_std=0.0)
    with pytest.raises(InputError):
        noise_check(-np.ones((3, 1)), np.array([1]), np.zeros((3, 0)), noise_std=1.0)


def test_a_claimed_noise_whose_square_overflows_is_refuted_not_an_overflow_error():
    """`audit canaries --noise-multiplier 1e200` stopped with OverflowError (exit 3) in noise_std**2."""
    assert variance_p_value(100.0, 100, 1e200) == 0.0


def _cross(z: np.ndarray) -> np.ndarray:
    """The cross-group summary (3, G, G) of noise z (G, k) when every pair compares all k positions."""
    sq = (z * z).sum(axis=1)
    return np.stack([z @ z.T, np.repeat(sq[:, None], len(z), axis=1), np.repeat(sq[None, :], len(z), axis=0)])


def test_cross_group_p_value_is_exactly_uniform_under_the_claim_and_zero_for_one_key_on_every_leaf():
    """Independent groups (different stds, one of them not even Gaussian): r² ~ Beta(1/2, (k−1)/2), so the
    p-value is uniform. The same draws on two groups (one PRNG key for every leaf) give p = 0, and a
    correlation of 0.3 between them is found from 400 values."""
    from dpaudit.audit.noise import cross_group_p_value

    rng = np.random.default_rng(7)
    k = 12
    counts = np.full((2, 2), k)
    pairs = (np.stack([rng.normal(scale=0.3, size=k), rng.standard_t(3, size=k) + 1]) for _ in range(N_SIM))
    p = np.array([cross_group_p_value(_cross(z), counts)[0] for z in pairs])
    assert stats.kstest(p, "uniform").pvalue > 1e-3
    for a in (0.01, 0.05, 0.2):
        assert _binomial_ok(int((p <= a).sum()), N_SIM, a)
    z = rng.normal(size=(3, 400))
    z[2] = z[0]  # group 2 has group 0's draws
    assert cross_group_p_value(_cross(z), np.full((3, 3), 400)) == (0.0, "0 / 2")
    z = rng.normal(size=(3, 400))
    z[2, :100] = z[0, :100]  # only the leading quarter shared
    assert cross_group_p_value(_cross(z), np.full((3, 3), 400))[0] < 1e-4
    z = rng.normal(size=(2, 400))
    z[1] = 0.3 * z[0] + math.sqrt(1 - 0.09) * z[1]
    assert cross_group_p_value(_cross(z), np.full((2, 2), 400))[0] < 1e-4
    proj = rng.normal(size=(20, 4))
    ss = np.ones((20, 3)) * 400 / 20
    check = noise_check(ss, np.array([400, 400, 400]), proj, noise_std=1.0, cross=_cross(rng.normal(size=(3, 400))),
                        cross_counts=np.full((3, 3), 400))  # fmt: skip
    assert check.details["alpha_independence"] == check.details["alpha_cross_group"] == pytest.approx(0.05 / 4)


def test_a_pair_with_fewer_than_two_common_values_is_not_tested():
    """A pair whose groups share no position without a canary (k = 0: a one-coordinate bias whose coordinate holds a
    canary) or one value (k = 1: r² = 1 whatever the noise) says nothing about dependence: skipped, not p = 0 (which
    would make a correct loop a "violation")."""
    from dpaudit.audit.noise import cross_group_p_value

    rng = np.random.default_rng(2)
    z = rng.normal(size=(3, 40))
    cross = _cross(z)
    cross[:, 0, 2] = 0.0  # groups 0 and 2 compare nothing
    cross[:, 1, 2] = z[1, 0] * z[2, 0], z[1, 0] ** 2, z[2, 0] ** 2  # groups 1 and 2 compare one value
    counts = np.array([[40, 40, 0], [40, 40, 1], [0, 1, 1]])
    assert cross_group_p_value(cross, counts) == cross_group_p_value(cross[:, :2, :2], counts[:2, :2])
    assert cross_group_p_value(cross[:, 1:, 1:], counts[1:, 1:]) is None
    check = noise_check(np.full((20, 2), 400.0), np.array([400, 400]), np.zeros((20, 0)), noise_std=1.0,
                        cross=cross[:, 1:, 1:], cross_counts=counts[1:, 1:])  # fmt: skip
    assert check.cross_group_p_value is None and check.verdict == "consistent"


def test_the_level_is_split_when_only_the_cross_group_test_runs():
    """Two steps (too few for the test across steps, T < 3) and two groups: the variance and the cross-group
    tests share α, α/2 each. Giving the variance test all of α whenever the test across steps is absent would make
    the whole check's level 1.5 α."""
    z = np.random.default_rng(4).normal(size=(2, 30))
    check = noise_check(np.full((2, 2), 15.0), np.array([15, 15]), np.zeros((2, 4)), noise_std=1.0, alpha=0.1,
                        cross=_cross(z), cross_counts=np.full((2, 2), 30))  # fmt: skip
    assert check.independence_p_value is None and check.cross_group_p_value is not None
    assert check.details["alpha_variance"] == pytest.approx(0.05)
    assert check.details["alpha_cross_group"] == pytest.approx(0.05) and check.details["alpha_independence"] is None


@pytest.mark.parametrize(("factor", "verdict"), [(0.9, "violation"), (1.1, "consistent")])
def test_the_cross_group_test_rejects_at_its_level_and_not_above(factor, verdict):
    """A cross-group p-value just below its share of α (α/4 with the test across steps running) is a violation,
    just above is not: the test is neither stricter nor looser than the level the check states."""
    from dpaudit.audit.noise import cross_group_p_value

    T, n, k, alpha = 20, 50, 400, 0.05
    rng = np.random.default_rng(6)
    ss, proj = np.full((T, 2), float(n)), rng.normal(size=(T, 4))
    r2 = stats.beta.isf(factor * alpha / 4, 0.5, (k - 1) / 2)  # r² whose p-value is factor × α/4
    cross = np.zeros((3, 2, 2))
    cross[:, 0, 1] = math.sqrt(r2), 1.0, 1.0
    assert cross_group_p_value(cross, np.full((2, 2), k))[0] == pytest.approx(factor * alpha / 4)
    check = noise_check(ss, np.array([n, n]), proj, noise_std=1.0, alpha=alpha, cross=cross,
                        cross_counts=np.full((2, 2), k))  # fmt: skip
    assert check.variance_p_value > alpha and check.independence_p_value > alpha / 4
    assert check.verdict == verdict


def test_the_cli_summary_prints_a_groups_bounds_as_the_report_does():
    """The noise check's summary (what `dpaudit audit canaries` and `audit train --trainer` print) rounds a group's
    upper bound on noise std / σC up, with digits enough to compare with 1 as it does, and the ratio it resolves
    down, as the report's noise table does (dpaudit.report._format.noise_rows). Before, ``.4g`` printed a rejected
    group's upper bound 0.99996 as "upper bound 1" (the group is rejected exactly when it is below 1) while the
    report printed 0.99996, and a resolvable ratio of 0.77777 as 0.7778 (more power than it has; report 0.7777)."""
    from dpaudit.audit.noise import GroupVariance, NoiseCheck
    from dpaudit.report._format import noise_rows

    group = GroupVariance(name="w", dof=10, ratio=0.5, ratio_upper=0.99996, p_value=0.01, resolvable_ratio=0.77777)
    check = NoiseCheck(noise_std=1.0, alpha=0.05, groups=(group,), variance_p_value=0.01,
                       independence_p_value=None, verdict="violation")  # fmt: skip
    line = next(ln for ln in check.summary().splitlines() if ln.startswith("  w:"))
    (row,) = noise_rows(check.to_dict())
    assert f"upper bound {row[3]})" in line and row[3] == "0.99996", line
    assert line.endswith(f"resolves ratios <= {row[5]}") and row[5] == "0.7777", line


def _exact_chi2_cdf(x: float, dof: int):
    """P[χ²_dof ≤ x] at 60 digits (an mpf): y^a e^−y / Γ(a + 1) · ₁F₁(1; a + 1; y), a = dof/2, y = x/2 (Abramowitz &
    Stegun 6.5.29 with 13.1.2; at dof 1e7 it agrees with 1 − Q(a, y) and Wilson–Hilferty)."""
    import mpmath as mp

    with mp.workdps(60):
        a, y = mp.mpf(dof) / 2, mp.mpf(x) / 2
        return mp.exp(a * mp.log(y) - y - mp.loggamma(a + 1)) * mp.hyp1f1(1, a + 1, y, maxterms=10**8)


@pytest.mark.parametrize(
    ("dof", "p"),
    [
        (10**7, 1e-8),
        (10**6, 1e-6),
        (3 * 10**6, 1e-7),
        (10**5, 1e-12),
        (10**4, 1e-3),
        (9714, 5.52e-269),
        (2790, 4.27e-93),
    ],
)
def test_the_variance_p_value_is_not_below_the_exact_chi2_tail(dof, p):
    """P[χ²_dof ≤ x] against 60-digit mpmath (A&S 6.5.29 with 13.1.2). scipy's chi2.cdf was 0.38 % low at dof 1e7,
    p = 1e-8 (1.00385e-8 exact, 1.0000e-8 scipy; 24 % at 1e8) and 1.7e-8 at dof 1e6, p = 1e-6: a noise check there
    declared "too little noise" (p ≤ α) for noise as claimed. Planted: scipy's value (no series) fails the first
    three cases; the series without its rounding margin fails (10**7, 1e-8) (17 ulps low) and (3 * 10**6, 1e-7).
    Below dof 1e5 scipy's error grows with |ln p|: with only its 2^-40 the p-value was 7263 ulps low at (9714,
    5.5e-269) and 2764 at (2790, 4.3e-93); planted (no _tail_up), those two fail."""
    x = float(stats.chi2.ppf(p, dof))
    exact = _exact_chi2_cdf(x, dof)
    got = variance_p_value(x, dof, 1.0)
    assert exact <= got <= exact * (1 + 1e-10)
    assert variance_p_value(0.0, dof, 1.0) == 0.0 and variance_p_value(math.inf, dof, 1.0) == 1.0


@pytest.mark.parametrize(("dof", "level"), [(10**7, 1e-8), (10**6, 1e-6), (10**6, 0.01)])
def test_the_std_upper_bound_uses_a_chi2_quantile_not_above_the_exact_one(dof, level):
    """The noise std's upper confidence bound divides by the χ² quantile at the group's level, which must not be
    above the exact one (the bound would be low). scipy's chi2.ppf inverts its low chi2.cdf: at dof 1e7, level 1e-8
    the exact P[χ² ≤ its quantile] is 1.0038e-8, and 1 + 7.5e-15 of the level at dof 1e6, 0.01. Planted: scipy's
    quantile as it was fails all three."""
    from dpaudit.audit.noise import _chi2_lower_quantile

    exact = _exact_chi2_cdf(_chi2_lower_quantile(level, dof), dof)
    assert level * (1 - 1e-6) < exact <= level


def _exact_t_tail_p(column) -> object:
    """Two-sided one-sample t-test p-value of mean 0 on ``column`` at 50 digits: t = √T·|mean|/sd of the float
    values taken exactly, p = 2·P[t_{T−1} > t] = I_{ν/(ν + t²)}(ν/2, ½), ν = T − 1 (the Student tail as a
    regularized incomplete beta, Abramowitz & Stegun 26.5.27)."""
    import mpmath as mp

    with mp.workdps(50):
        xs = [mp.mpf(float(v)) for v in column]
        T = len(xs)
        m = mp.fsum(xs) / T
        sd = mp.sqrt(mp.fsum((v - m) ** 2 for v in xs) / (T - 1))
        t, nu = mp.sqrt(T) * abs(m) / sd, T - 1
        return mp.betainc(mp.mpf(nu) / 2, mp.mpf(1) / 2, 0, nu / (nu + t * t), regularized=True)


def _exact_chi2_even_sf(x, half_dof: int):
    """P[χ²_{2K} > x] = e^−y Σ_{j<K} y^j / j!, y = x/2 (DLMF 8.4.10), at 50 digits (x an mpf or a float)."""
    import mpmath as mp

    with mp.workdps(50):
        y = mp.mpf(x) / 2
        return mp.exp(-y) * mp.fsum(y**j / mp.factorial(j) for j in range(half_dof))


@pytest.mark.parametrize("seed", [3, 4])
def test_the_independence_p_value_is_not_below_the_exact_one(seed):
    """Fisher's combination of K = 8 t-tests (T = 101 steps, df 100) against 50 digits on the same data: exact
    means and sds, the Student tail as an incomplete beta, the χ²_16 tail as a Poisson sum. The to-nearest code
    (scipy's t.sf and chi2.sf on float statistics, Fisher's sum unlowered) was 193 ulps (seed 3) and 105 ulps (seed
    4) BELOW exact at p ≈ 1e-108 and 2e-98: "not independent across steps" a hair too easy. Planted: the old
    expression fails both. (Each of the new margins alone covers these two; the parts are checked one by one
    below, except |t|'s and Fisher's statistic's own rounding, which stay within the others' margins wherever
    measured.)"""
    import mpmath as mp

    P = np.random.default_rng(seed).normal(size=(101, 8)) + 0.9
    with mp.workdps(50):
        exact = _exact_chi2_even_sf(-2 * mp.fsum(mp.log(_exact_t_tail_p(c)) for c in P.T), 8)
        got = independence_p_value(P)
        assert exact <= got <= exact * (1 + 1e-9)


@pytest.mark.parametrize(("df", "p"), [(100, 1e-12), (10**6, 1e-200), (300, 1e-300)])
def test_the_student_tail_is_not_below_the_exact_one(df, p):
    """2·P[t_df > t] at scipy's own t.isf(p/2) against I_{df/(df + t²)}(df/2, ½) at 50 digits (Abramowitz & Stegun
    26.5.27). scipy's t.sf was 49 ulps low at (100, 1e-12) and 70 at (1e6, 1e-200). Planted: the tail without its
    raise (_tail_up) fails those two."""
    import mpmath as mp

    from dpaudit.audit.noise import _student_two_sided

    t = float(stats.t.isf(p / 2, df))
    with mp.workdps(50):
        exact = mp.betainc(mp.mpf(df) / 2, mp.mpf(1) / 2, 0, df / (df + mp.mpf(t) ** 2), regularized=True)
        got = float(_student_two_sided(t, df))
        assert exact <= got <= exact * (1 + 1e-11)


@pytest.mark.parametrize("units", [16.0, 256.0])
@pytest.mark.parametrize("p", [0.9, 0.5, 1e-12, 1e-300, 5e-324])
def test_tail_up_raises_by_its_documented_units(p, units):
    """_tail_up raises p by units (|ln p| + 1) ulps (its docstring; 16 units is 7.8x scipy's worst measured t.sf error
    and 256 covers chi2.cdf), no less (the margin is a bound, so a margin halved still passes the mpmath tests, whose
    cases scipy misses by less) and no more; 0 stays 0; a p-value is at most 1. The rise is read exactly (mpmath):
    1 + units (|ln p| + 1) 2^-52 rounds to within 2^-53 and the product to within half an ulp of p. Planted:
    |ln p| − 1, |ln p| alone, + 0, + 2, 2^-53 or 2^-51 for 2^-52 (all passed the other tests), the two-sided tail's
    cap at 1 dropped or 2 (p = 1 at t = 0 read 1 + 16 ulps)."""
    import mpmath as mp

    from dpaudit.audit.noise import _student_two_sided, _tail_up

    got = float(_tail_up(p, units))
    with mp.workdps(50):
        rise = (mp.mpf(got) - mp.mpf(p)) / mp.mpf(p)
        expected = units * (abs(mp.log(p)) + 1) * mp.mpf(2) ** -52
        # 5e-324 (the least subnormal) has no ulps to spare below: the product rounds to p or to 2p.
        assert got >= p if p < 2.0**-1022 else abs(rise - expected) <= 2.0**-52
    assert float(_tail_up(0.0, units)) == 0.0
    assert float(_student_two_sided(0.0, 10)) == 1.0 and float(_student_two_sided(0.0, 10**6)) == 1.0


@pytest.mark.parametrize(("half_dof", "p"), [(150, 1e-8), (2000, 1e-100), (1, 0.4), (8, 1e-300), (1, 0.7)])
def test_the_fisher_chi2_tail_is_not_below_the_exact_one(half_dof, p):
    """P[χ²_{2K} > x] against the Poisson sum at 50 digits. scipy's chi2.sf was 544 ulps low at dof 300, p 1e-8 and
    3607 ulps at dof 4000, p 1e-100 (its error grows with dof and |ln p|). Planted: scipy's chi2.sf in its place
    fails the first two; the sum without its rounding margin (4·err) fails all four."""
    from dpaudit.audit.noise import _chi2_even_upper_tail

    x = float(stats.chi2.isf(p, 2 * half_dof))
    exact = _exact_chi2_even_sf(x, half_dof)
    got = _chi2_even_upper_tail(x, half_dof)
    assert exact <= got <= exact * (1 + 1e-9)
    assert _chi2_even_upper_tail(0.0, half_dof) == 1.0 and _chi2_even_upper_tail(math.inf, half_dof) == 0.0
    # p ≈ 1 raised above 1 is capped (planted: the cap dropped or 2)
    assert _chi2_even_upper_tail(1e-300, half_dof) == 1.0


@pytest.mark.parametrize("x", [1416.0, 1420.0, 2000.0])
def test_the_fisher_chi2_tail_below_the_normal_range_is_the_smallest_normal(x):
    """P[χ²_2 > x] = e^{-x/2}: at x = 1416 (3.3e-308, between 2^-1022 and 2^-1021) the sum's own value, raised
    within 5 err (1e-11 here) of it; at 1420 (6.0e-309) and 2000 (5e-435, 0 in floats) the smallest normal number
    2^-1022, an upper bound (no subnormal's rounding). Planted: the floor dropped (0 for 5e-435), at 2^-1021
    (2^-1022 for 3.3e-308, below it), returned as -2044 or 2."""
    import mpmath as mp

    from dpaudit.audit.noise import _chi2_even_upper_tail

    exact = mp.exp(-mp.mpf(x) / 2)
    got = _chi2_even_upper_tail(x, 1)
    assert got == (2.0**-1022 if exact < 2.0**-1022 else got) and exact <= got <= max(exact * (1 + 1e-11), 2.0**-1022)


@pytest.mark.parametrize("K", [2, 20])
def test_fishers_statistic_is_lowered_by_twice_its_rounding_bound(monkeypatch, K):
    """−2 Σ ln p_k is computed within (K + 3) ulps (K logs within 4 ulps, a sum of one sign within K − 1: the
    docstring) and lowered by 2 (K + 4) ulps, so the statistic passed to the tail lies in [1 − (3K + 11) u,
    1 − (K + 5) u] times exact (u = 2^-52; the tests of the p-value cannot see this margin, the sum being far more
    accurate than its bound). Planted: the lowering dropped, a raise instead, 2 → 1 or 4, K − 4, K alone, 2 ulps
    alone, K + 4 ulps, 2/(K + 4) (each passed the other tests)."""
    import mpmath as mp

    from dpaudit.audit import noise

    seen = []
    monkeypatch.setattr(noise, "_chi2_even_upper_tail", lambda x, half_dof: seen.append((x, half_dof)) or 0.5)
    u = 2.0**-52
    for seed in range(5):
        p = np.random.default_rng(seed).uniform(1e-6, 1.0, K)
        assert noise._fisher_upper_tail(p) == 0.5
        x, half_dof = seen.pop()
        with mp.workdps(50):
            exact = -2 * mp.fsum(mp.log(mp.mpf(float(v))) for v in p)
            assert half_dof == K and exact * (1 - (3 * K + 11) * u) <= x <= exact * (1 - (K + 5) * u), seed


@pytest.mark.parametrize(("half_dof", "p"), [(150, 1e-8), (2000, 1e-100), (1, 0.7), (8, 1e-300)])
def test_the_fisher_chi2_tail_carries_four_times_its_rounding_bound(half_dof, p):
    """_chi2_even_upper_tail raises ln p by 4 err, err its docstring's first-order bound on the rounding of ln p
    (computed here from the exact terms); with the computed ln p within err of exact, the result lies between
    e^{3 err} and e^{5 err} times exact. The test above cannot see the margin shrink (the sum is far more accurate
    than its bound here). Planted: 2^-53 or 2^-51 for 2^-52, |ln p| dropped or subtracted from err; terms worth
    under a quarter of err (the + 1, ± 3K at these points) leave a margin above 3 err: safe, and unseen."""
    import mpmath as mp

    from dpaudit.audit.noise import _chi2_even_upper_tail

    x = float(stats.chi2.isf(p, 2 * half_dof))
    with mp.workdps(50):
        exact = _exact_chi2_even_sf(x, half_dof)
        y = mp.mpf(x) / 2
        top = min(half_dof - 1, math.floor(y))
        log_fact = mp.log(mp.factorial(top))
        log_top = top * mp.log(y) - y - log_fact
        err = 2.0**-52 * (
            2 * top * abs(mp.log(y)) + y + 2 * log_fact + abs(log_top) + 3 * half_dof + 1 + abs(mp.log(exact))
        )
        got = _chi2_even_upper_tail(x, half_dof)
        assert exact * mp.exp(3 * err) <= got <= exact * mp.exp(5 * err)


@pytest.mark.parametrize(("k", "c0"), [(100, 0.6349294588591078), (1000, 0.22281310253680645)])
def test_the_cross_group_p_value_is_not_below_the_exact_one(k, c0):
    """One pair, Σ z_a·z_b = c0, Σ z_a² = Σ z_b² = 1 (r² = c0² exactly) against I_{1−r²}((k − 1)/2, ½) at 50 digits
    (the Beta(½, (k − 1)/2) upper tail). scipy's beta.sf of the rounded r² was 9.1 ulps (k = 100, p ≈ 1e-12) and 8.3
    ulps (k = 1000) below exact: r²'s rounding amplified by the tail's slope. Planted: the to-nearest line fails
    both (either margin alone, r's for the sums' rounding or the tail's raise, covers these points)."""
    import mpmath as mp

    from dpaudit.audit.noise import cross_group_p_value

    cross = np.zeros((3, 2, 2))
    cross[:, 0, 1] = c0, 1.0, 1.0
    got = cross_group_p_value(cross, np.full((2, 2), k))[0]
    with mp.workdps(50):
        exact = mp.betainc(mp.mpf(k - 1) / 2, mp.mpf(1) / 2, 0, 1 - mp.mpf(c0) ** 2, regularized=True)
        assert exact <= got <= exact * (1 + 1e-9)


@pytest.mark.parametrize(
    ("dof", "alpha", "power"), [(1, 1e-4, 0.9), (1, 0.05, 0.9), (2, 1e-4, 0.9), (10**5, 1e-8, 0.5)]
)
def test_the_resolvable_ratio_is_not_above_the_exact_one(dof, alpha, power):
    """√(χ²_dof⁻¹(α) / χ²_dof⁻¹(power)) against quantiles found by Newton steps on mpmath's regularized incomplete
    gamma (60 digits). A ratio above exact promises that the check resolves a deficit nearer 1 than it does; the
    to-nearest expression was 12.4 ulps above at (1, 1e-4, 0.9), 8.3 at (1, 0.05, 0.9), 1.3 at (2, 1e-4, 0.9).
    Planted: it fails those three."""
    import mpmath as mp

    def quantile(level):
        with mp.workdps(60):
            x, a = mp.mpf(float(stats.chi2.ppf(level, dof))), mp.mpf(dof) / 2
            for _ in range(2):  # Newton on P(a, x/2) = level, from scipy's value (within ~1e-13)
                pdf = mp.exp((a - 1) * mp.log(x / 2) - x / 2 - mp.loggamma(a)) / 2
                x -= (mp.gammainc(a, 0, x / 2, regularized=True) - level) / pdf
            return x

    with mp.workdps(60):
        exact = mp.sqrt(quantile(alpha) / quantile(power))
        got = resolvable_noise_ratio(dof, alpha, power)
        assert exact * (1 - 1e-9) <= got <= exact
        # The power quantile is raised by 2^-40 (chi2.ppf measured within 20 ulps, 0.005 of that), and below dof 1e5
        # the level's lowered by as much (from dof 1e5 at α < 1e-4 it is bisected, near exact): the ratio lies at
        # least 0.9·2^-40 (0.45·2^-40) below exact. Planted: the power quantile's raise dropped.
        assert got <= exact * (1 - (0.9 if dof < 10**5 else 0.45) * 2.0**-40)


@pytest.mark.parametrize("k", [2, 3, 12])
def test_a_nearly_parallel_pair_gets_its_exact_tail_not_zero(k):
    """r² = 1 − 5e-13 from k values: the exact p is I_{5e-13}((k − 1)/2, ½), 4.5e-7 at k = 2, 5e-13 at k = 3. The
    check snapped every r² ≥ 1 − 1e-12 to p = 0 (meant for the same draws summed in two orders), which at k = 2 put
    a pair at p = 0 whose exact p is above a per-pair level of 1e-7 (α/4 over 3·10⁴ pairs): a violation where the
    test does not reject. Now the sums' rounding is charged to r instead: r falls by ≤ 2γ, γ = 2 (k + 8) 2^-52, so
    1 − r² grows by ≤ 4γ (3.9 % of 5e-13 at k = 3) and p (∝ (1 − r²)^((k − 1)/2) here) by at most that power. Planted:
    the snap fails all three."""
    import mpmath as mp

    from dpaudit.audit.noise import cross_group_p_value

    cross = np.zeros((3, 2, 2))
    cross[:, 0, 1] = math.sqrt(1 - 5e-13), 1.0, 1.0
    got = cross_group_p_value(cross, np.full((2, 2), k))[0]
    with mp.workdps(50):
        exact = mp.betainc(mp.mpf(k - 1) / 2, mp.mpf(1) / 2, 0, 1 - mp.mpf(cross[0, 0, 1]) ** 2, regularized=True)
        assert exact <= got <= exact * (1 + 4 * 2 * (k + 8) * 2**-52 / 5e-13) ** ((k - 1) / 2) * (1 + 1e-9)


def test_the_variance_p_value_charges_the_rounding_of_its_statistic():
    """At dof 1e8 the χ² cdf's log-slope x·f(x)/F(x) ≈ z·√(dof/2) is ~2.5e4 at p 3e-4: an ulp lost in the statistic
    is 2.5e4 ulps of p, beyond the 2^-40 + 256·(|ln p| + 1) ulps that cover scipy's own error. (a) S/σ² rounded down
    0.76 ulps: variance_p_value was 1.3e4 ulps below F(S/σ²) in 60 digits. (b) The groups' sum over T = 128 steps
    (numpy's pairwise sum: one step of 2^30 and 127 of 0.49 of its ulp, 15 of which its accumulator drops) 7.2 ulps
    below the exact sum: noise_check's p-value was 8.3e4 ulps below F(exact S/σ²). (c) One step's Σz² as the hooks
    compute it, a float64 z @ z over 1e4 coordinates (one of 2^15, the rest with squares of 0.49 of its square's ulp):
    154 ulps below Σz² (this machine's BLAS), the p-value (dof 1e4) 2.4e4 ulps below exact. Planted: x without its
    4-ulp raise fails (a); S without its raise fails (b) and (c); without the per-step dot's term, (c) (the term for
    the sum over steps alone is masked by the dot's term here, 2·781251 ulps at (b))."""
    import mpmath as mp

    dof = 10**8
    S, std = 50739218.50975601, 0.7124875489479955
    with mp.workdps(60):
        exact = _exact_chi2_cdf(mp.mpf(S) / mp.mpf(std) ** 2, dof)
        assert exact <= variance_p_value(S, dof, std) <= exact * (1 + 1e-9)
    T = 128
    col = np.full(T, 0.49 * 2.0**-22)
    col[0] = 2.0**30
    with mp.workdps(60):
        exact_sum = mp.fsum(mp.mpf(float(v)) for v in col)
        std = math.sqrt(float(exact_sum) / stats.chi2.ppf(3e-4, dof))  # p ≈ 3e-4
        check = noise_check(col[:, None], np.array([dof // T]), np.zeros((T, 0)), noise_std=std, alpha=0.05)
        exact = _exact_chi2_cdf(exact_sum / mp.mpf(std) ** 2, dof)
        # S raised by (8 (7 + 4) + 2 (781250 + 1)) ulps = 3.5e-10, times the log-slope ~2.5e4: p by ~9e-6
        assert exact <= check.groups[0].p_value <= exact * (1 + 3e-5)
    n = 10**4
    z = np.full(n, math.sqrt(0.49 * 2.0**-22))
    z[0] = 2.0**15
    with mp.workdps(60):
        exact_sum = mp.fsum(mp.mpf(float(v)) ** 2 for v in z)
        std = math.sqrt(float(exact_sum) / stats.chi2.ppf(3e-4, n))
        check = noise_check(np.array([[float(z @ z)]]), np.array([n]), np.zeros((1, 0)), noise_std=std, alpha=0.05)
        exact = _exact_chi2_cdf(exact_sum / mp.mpf(std) ** 2, n)
        assert exact <= check.groups[0].p_value <= exact * (1 + 1e-8)


def test_the_variance_p_value_raises_its_statistic_4_ulps_and_scipys_tail_by_its_units(monkeypatch):
    """variance_p_value's two documented margins, read at scipy's call (scipy replaced by a recorder answering
    0.25): x = S/σ² raised by 4 ulps (σ² and the quotient, ≤ 1 ulp together), and scipy's cdf raised by 256
    (|ln p| + 1) ulps (_tail_up) and then by 2^-40. The mpmath tests cannot see either shrink (scipy's error is
    smaller at their points). Planted: 1, 2 or 8 ulps for 4, 2^-53 or 2^-51 for 2^-52, the 2^-40 dropped."""
    import types

    import mpmath as mp

    from dpaudit.audit import noise

    seen = []

    def cdf(x, dof):
        seen.append((x, dof))
        return 0.25

    monkeypatch.setattr(noise, "stats", types.SimpleNamespace(chi2=types.SimpleNamespace(cdf=cdf)))
    got = variance_p_value(1000.0, 1000, 1.0)
    assert seen == [(1000.0 * (1.0 + 4.0 * 2.0**-52), 1000)]
    u = 2.0**-52
    with mp.workdps(50):
        expected = mp.mpf(0.25) * (1 + 256 * (mp.log(4) + 1) * u) * (1 + mp.mpf(2) ** -40)
        assert abs(got / expected - 1) <= 4 * u


def test_noise_check_raises_each_groups_sum_by_both_documented_terms(monkeypatch):
    """noise_check hands variance_p_value S raised by (8 (log2 T + 4) + 2 (counts + 1)) ulps: the pairwise sum over
    T steps and each step's dot product (Higham 2002, §4.2 and §3.1). At T = 1024 steps of one coordinate the first
    term (112 ulps) dominates, which the test above masks with its dot term (2·781251 ulps). Planted: the sum's
    term dropped, 8/(log2 T + 4), 8 alone, log2 T + 4 alone, 16 for 8 (each passed the other tests)."""
    import mpmath as mp

    from dpaudit.audit import noise

    seen, levels = [], []
    real, real_quantile = noise.variance_p_value, noise._chi2_lower_quantile
    monkeypatch.setattr(noise, "variance_p_value", lambda S, dof, std: seen.append(S) or real(S, dof, std))
    monkeypatch.setattr(noise, "_chi2_lower_quantile", lambda a, d: levels.append(real_quantile(a, d)) or levels[-1])
    T = 1024
    col = np.random.default_rng(0).normal(size=T) ** 2
    check = noise_check(col[:, None], np.array([1]), np.zeros((T, 0)), noise_std=0.5, alpha=0.05)
    u = 2.0**-52
    with mp.workdps(50):
        expected = mp.mpf(float(col.sum())) * (1 + (8 * (math.log2(T) + 4) + 2 * (1 + 1)) * u)
        assert len(seen) == 1 and abs(seen[0] / expected - 1) <= 2 * u
        # The estimate to nearest, from S itself; the upper bound from S raised, raised 4 ulps for its own roundings
        # (the quotient, the root, the division: ≤ 1.5). Planted: the estimate's division as a product, S for S_up
        # or no raise in the bound (each passed the other tests).
        assert check.groups[0].ratio == math.sqrt(float(col.sum()) / T) / 0.5
        bound = mp.sqrt(mp.mpf(seen[0]) / mp.mpf(levels[0])) / mp.mpf(0.5)
        assert bound * (1 + 2.5 * u) <= check.groups[0].ratio_upper <= bound * (1 + 5.5 * u)


def test_the_t_statistics_are_lowered_by_their_mean_and_sd_rounding(monkeypatch):
    """_t_test_p_values lowers √T·|mean|/sd by g = 8 (log2 T + 4) 2^-52 units (numpy's pairwise sums, Higham 2002,
    §4.2): √T (|mean| (1 − 2g) − g·mean|P|)/sd, read at the Student tail's call against that expression in 50
    digits from numpy's mean and sd (within 4 ulps: the code's own roundings). Planted: g as one ulp (the mpmath
    test of the p-value passed: numpy's sums are far more accurate than their bound there)."""
    import mpmath as mp

    from dpaudit.audit import noise

    seen = []
    monkeypatch.setattr(noise, "_student_two_sided", lambda t, df: seen.append((np.asarray(t), df)) or np.full(2, 0.5))
    T = 64
    P = np.random.default_rng(1).normal(loc=[0.3, -0.2], size=(T, 2))
    noise._t_test_p_values(P)
    ((t, df),) = seen
    g = 8 * (math.log2(T) + 4) * 2.0**-52
    mean, sd, mabs = P.mean(axis=0), P.std(axis=0, ddof=1), np.abs(P).mean(axis=0)
    assert df == T - 1
    with mp.workdps(50):
        for k in range(2):
            expected = mp.sqrt(T) * (abs(mp.mpf(mean[k])) * (1 - 2 * g) - g * mp.mpf(mabs[k])) / mp.mpf(sd[k])
            assert abs(t[k] / expected - 1) <= 4 * 2.0**-52


@pytest.mark.parametrize("scale", [2.0**-30, -1.0, 1.0, -(2.0**30)])
def test_a_spread_at_most_a_millionth_of_the_columns_largest_value_is_no_spread(scale):
    """_t_test_p_values' no-spread rule: a column whose sd is at most 1e-6 of its largest |value| is noise reused up
    to rounding, p = 0 (and so the independence p-value 0), whatever the column's scale or sign. The columns
    [M, M + 1, M − 1]·s have exact means and sd = |s| (integers; s a power of two, exact), max |P| = (M + 1)|s|:
    at M + 1 = 1.25e6 (sd/max 0.8e-6) and at exactly 1e6 (1e-6 · 1e6 = 1.0 in floating point: the rule's ≤) no
    spread; at M + 1 = 8e5 (1.25e-6) Student's test runs: for T = 3 (2 df) P[|t_2| > t] = 1 − t/√(2 + t²)
    = 2/(√(2 + t²)(√(2 + t²) + t)) (the t_2 distribution function in closed form), t = √3·M exactly (sd 1), and
    Fisher's combination of one p is p itself (P[χ²_2 > −2 ln p] = p): the result lies at or above that, within
    its documented margins (< 1e-9 relative here), never 0. Planted (9 survivors of pass 18): the threshold 2e-6
    or 5e-7, ≤ as <, 1e-6 / max (a division), 1e-6 alone (no max), its floor the smallest normal alone, max |P| as
    min |P|, |P| as P."""

    def column(top):
        return np.array([[top - 1.0], [top], [top - 2.0]]) * scale

    assert independence_p_value(column(1.25e6)) == 0.0
    assert 1e-6 * 1e6 == 1.0
    assert independence_p_value(column(1e6)) == 0.0
    t = math.sqrt(3.0) * (8e5 - 1.0)
    exact = 2.0 / (math.sqrt(2.0 + t * t) * (math.sqrt(2.0 + t * t) + t))
    got = independence_p_value(column(8e5))
    assert exact <= got <= exact * (1.0 + 1e-9)


def test_the_cross_group_p_value_is_bonferronis_over_the_pairs_and_zero_without_noise():
    """Three groups, three pairs tested: the smallest pair's p-value times 3 (Bonferroni), each pair's as it is alone;
    a pair with no noise on one side (Σ z_b² = 0) has p = 0. Planted: the product by the number of pairs dropped or
    a division, the no-noise p as 1 (each passed the other tests, whose cases test one pair)."""
    from dpaudit.audit.noise import cross_group_p_value

    k = np.full((3, 3), 50)
    cross = np.zeros((3, 3, 3))
    cross[1], cross[2] = 50.0, 50.0
    cross[0, 0, 1], cross[0, 0, 2], cross[0, 1, 2] = 12.0, 3.0, -5.0
    alone = []
    for a, b in ((0, 1), (0, 2), (1, 2)):
        one = np.zeros((3, 2, 2))
        one[:, 0, 1] = cross[:, a, b]
        alone.append(cross_group_p_value(one, np.full((2, 2), 50))[0])
    p, pair = cross_group_p_value(cross, k)
    assert pair == "0 / 1" and p == min(1.0, min(alone) * 3) and min(alone) < 0.1
    cross[2, 1, 2] = 0.0
    assert cross_group_p_value(cross, k) == (0.0, "1 / 2")


def test_the_cross_group_correlation_is_lowered_by_its_documented_rounding_margin(monkeypatch):
    # cross_group_p_value passes beta.sf r_low², r_low = |r|(1 − γ) − γ, γ = 2 (k + 8) 2^-52, clamped at 0 (noise.py,
    # the sums' rounding, Higham 2002 §3.1). The mpmath tests cannot see this margin shrink (scipy errs far less
    # there): 15 mutants of the two lines survived mutation pass 18. Two counts pin the slope and the intercept, a
    # tiny r the clamp. Planted: γ's 2 or 8 changed, (1 − γ) or − γ dropped, no clamp -> fails.
    from dpaudit.audit import noise

    seen = []
    real_sf = noise.stats.beta.sf
    monkeypatch.setattr(noise.stats.beta, "sf", lambda x, a, b: seen.append(float(np.ravel(x)[0])) or real_sf(x, a, b))
    for r, k in ((0.6, 1000), (0.6, 10**9), (0.25, 3), (1e-300, 50)):
        cross = np.zeros((3, 2, 2))
        cross[0, 0, 1], cross[1, 0, 1], cross[2, 0, 1] = r, 1.0, 1.0
        seen.clear()
        noise.cross_group_p_value(cross, np.full((2, 2), k))
        g = 2.0 * (k + 8.0) * 2.0**-52
        assert seen == [max(r * (1.0 - g) - g, 0.0) ** 2], (r, k, seen)
