"""The one-run p-value and bound (Steinke, Nasr & Jagielski 2023) against high-precision oracles."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import special, stats

from dpaudit.audit import (
    audit_scores,
    clopper_pearson_lower,
    max_certifiable_epsilon,
    one_run_epsilon_lower_bound,
    one_run_p_value,
)
from dpaudit.audit.one_run import bonferroni_pairs, guess_counts, one_run_pure_epsilon
from dpaudit.errors import InputError

mpmath = pytest.importorskip("mpmath")


def p_value_mpmath(m, r, v, eps, delta):
    """Steinke et al. 2023, Algorithm 2, written out term by term in 50-digit arithmetic."""
    mp = mpmath.mp
    mp.dps = 50
    q = mp.e ** mp.mpf(eps) / (1 + mp.e ** mp.mpf(eps))

    def pmf(j):
        return mp.binomial(r, j) * q**j * (1 - q) ** (r - j)

    beta = mp.fsum(pmf(j) for j in range(v, r + 1))
    alpha, acc = mp.mpf(0), mp.mpf(0)
    for i in range(1, v + 1):
        acc += pmf(v - i)
        alpha = max(alpha, acc / i)
    return min(mp.mpf(1), beta + 2 * m * mp.mpf(delta) * alpha)


GRID = [
    (m, r, v, eps, delta)
    for (m, r, v) in [(10, 10, 10), (10, 6, 5), (40, 20, 17), (60, 60, 45), (60, 30, 30), (25, 1, 1)]
    for eps in (0.0, 0.5, 2.0, 5.0)
    for delta in (0.0, 1e-5, 1e-3)
]


@pytest.mark.parametrize(("m", "r", "v", "eps", "delta"), GRID)
def test_p_value_matches_mpmath(m, r, v, eps, delta):
    expected = float(p_value_mpmath(m, r, v, eps, delta))
    assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_p_value_large_r_stays_finite_and_matches_mpmath_in_log_space():
    # Tiny tails (1e-200 and below) must not turn into 0 or NaN when δ > 0 keeps them relevant.
    m, r, v, eps, delta = 4000, 2000, 1900, 1.0, 1e-6
    got = one_run_p_value(m, r, v, eps, delta)
    expected = p_value_mpmath(m, r, v, eps, delta)
    assert got > 0 and math.log(got) == pytest.approx(float(mpmath.log(expected)), rel=1e-9)


@pytest.mark.parametrize("m", [1, 5, 20, 60])
@pytest.mark.parametrize("eps", [0.0, 0.7, 2.5])
@pytest.mark.parametrize("delta", [0.0, 1e-4, 0.02])
def test_p_value_dominates_an_extremal_eps_delta_mechanism(m, eps, delta):
    # Brute force on a worst case: per canary, with probability δ reveal the inclusion bit, otherwise
    # ε-randomised response; this is (ε, δ)-DP and guessing every canary is right w.p. c independently.
    q = 1 / (1 + math.exp(-eps))
    c = delta + (1 - delta) * q
    for v in range(m + 1):
        tail = stats.binom.sf(v - 1, m, c)
        assert tail <= one_run_p_value(m, m, v, eps, delta) * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize(("r", "v"), [(10, 10), (100, 80), (1000, 700), (50, 20)])
def test_pure_bound_is_logit_of_clopper_pearson(r, v):
    a = 0.05
    q = clopper_pearson_lower(v, r, a)
    expected = max(0.0, float(special.logit(q))) if q > 0.5 else 0.0
    assert one_run_pure_epsilon(r, v, a) == pytest.approx(expected, abs=1e-12)
    assert one_run_epsilon_lower_bound(1000, r, v, 0.0, a) == pytest.approx(expected, abs=1e-12)
    if expected > 0:  # the p-value at the bound is exactly α
        assert one_run_p_value(1000, r, v, expected, 0.0) == pytest.approx(a, rel=1e-8)


@pytest.mark.parametrize(
    ("m", "r", "v", "delta"), [(1000, 200, 190, 1e-5), (1000, 1000, 990, 1e-5), (100, 50, 45, 1e-3)]
)
def test_bound_is_where_the_p_value_crosses_alpha(m, r, v, delta):
    a = 0.05
    e = one_run_epsilon_lower_bound(m, r, v, delta, a)
    assert e > 0
    assert one_run_p_value(m, r, v, e, delta) <= a
    assert one_run_p_value(m, r, v, e * (1 + 1e-6) + 1e-9, delta) > a
    assert e <= one_run_pure_epsilon(r, v, a)  # the δ term only lowers it


def test_bound_is_zero_without_signal():
    assert one_run_epsilon_lower_bound(100, 100, 50, 1e-5, 0.05) == 0.0
    assert one_run_epsilon_lower_bound(100, 0, 0, 1e-5, 0.05) == 0.0
    assert one_run_epsilon_lower_bound(100, 10, 0, 1e-5, 0.05) == 0.0


def test_guess_counts_by_enumeration():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=30)
    member = rng.random(30) < 0.5
    top_in, bottom_out = guess_counts(scores, member, rng.random(30))
    order = np.argsort(-scores)
    for k in range(31):
        assert top_in[k] == member[order[:k]].sum()
        assert bottom_out[k] == (~member[order[30 - k :]]).sum()


def test_ties_are_broken_independently_of_file_order():
    # Constant scores with the file sorted by inclusion: position-based tie-breaking would "guess"
    # perfectly. Random tie-breaking must give no signal.
    m = 2000
    member = np.r_[np.ones(m // 2, bool), np.zeros(m // 2, bool)]
    res = audit_scores(np.zeros(m), member, method="one-run", design="canaries", threshold_selection="bonferroni")
    assert res.epsilon_lower_bound == 0.0


def test_bonferroni_pairs_are_fixed_by_m_and_fit():
    for m in (1, 2, 3, 10, 1000, 123_457):
        kp, km = bonferroni_pairs(m)
        assert len(kp) == len(km) > 0
        assert np.all(kp + km >= 1) and np.all(kp + km <= m)
        assert len(set(zip(kp.tolist(), km.tolist(), strict=True))) == len(kp)


@pytest.mark.parametrize(
    ("m", "ks", "both"),
    [
        (1, [1], []),  # (1, 1) needs 2 canaries
        (3, [1, 2], [1]),
        (10, [1, 2, 5], [1, 2, 5]),  # 10/4 = 2.5 and 10/8 = 1.25 round to 2 and 1
        (2935, [3, 6, 11, 23, 46, 92, 183, 367, 734, 1468], [3, 6, 11, 23, 46, 92, 183, 367, 734, 1467]),
    ],
)
def test_bonferroni_pairs_are_the_documented_grid(m, ks, both):
    """k over round(m/2), round(m/4), ..., round(m/2^10) (at least 1), in (k, 0), (0, k) and (k, k) with k at most
    floor(m/2) in the last, by hand. The grid's size is α's divisor: a grid of m alone, of m/j or of m/2j (all
    passed the fit test above, which checks only that the pairs fit) change what an audit certifies."""
    kp, km = bonferroni_pairs(m)
    zeros = [0] * len(ks)
    assert kp.tolist() == ks + zeros + both
    assert km.tolist() == zeros + ks + both


def test_exhaustive_small_design_is_valid():
    # Constant scores (no signal) with a fixed tie-break: over all 2^8 equally likely inclusion vectors
    # the bound may be positive for at most a fraction α of them (exact enumeration, no sampling).
    positive = 0
    for bits in itertools.product([False, True], repeat=8):
        member = np.array(bits)
        if member.all() or not member.any():
            continue  # a single class cannot be audited; such a vector gives no bound
        res = audit_scores(
            np.ones(8), member, method="one-run", design="canaries", k_plus=4, k_minus=4, delta=0.0, seed=0
        )
        positive += res.epsilon_lower_bound > 0
    assert positive / 2**8 <= 0.05


def test_the_holdout_selection_takes_four_canaries_and_refuses_three():
    """The fewest canaries the holdout selection takes is 4 (a half chooses the guess counts, a half is scored):
    4 is drawn, 3 is refused in one line (a mutant refusing 4 as well went unseen)."""
    from dpaudit.audit.one_run import MIN_HOLDOUT_CANARIES, draw_design
    from dpaudit.errors import InputError

    rng = np.random.default_rng(0)
    tiebreak, selection = draw_design(MIN_HOLDOUT_CANARIES, "holdout", rng)
    assert MIN_HOLDOUT_CANARIES == 4 and len(tiebreak) == len(selection) == 4
    with pytest.raises(InputError, match="needs at least 4 canaries, got 3"):
        draw_design(3, "holdout", rng)


def test_the_holdout_half_laid_on_the_canonical_order_is_a_uniform_half_whatever_the_data():
    """The holdout half and the tie-breaking keys are drawn per position of a canonical order of the records, which
    their scores and bits decide, and laid onto the records (dpaudit.audit.holdout, "Record order"). That keeps the
    level only if, given the data, the half is still a uniformly random half (and the keys i.i.d. uniform): every
    canary selected with probability k/m and every pair with probability k(k − 1)/(m(m − 1)), k = floor(m/2); per
    class when stratified. Ties included: records equal in score and bit must not share a half. 4,000 seeds on 12
    canaries, a third of them tied; every frequency within 5 binomial standard deviations of its exact value.
    Planted: equal records sharing a half, or a key (a draw seeded by a hash of each record's content); a split
    without the seed (every other canonical position) -> fail."""
    from dpaudit.audit import holdout
    from dpaudit.audit.one_run import design_on_records, draw_design

    scores = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 3.0, 4.0, 5.0, 6.0])
    member = np.array([1, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 0], dtype=bool)
    m, runs = len(scores), 4000

    def within(freq, p):  # 5 binomial standard deviations of `runs` draws
        return np.all(np.abs(freq - p) <= 5.0 * math.sqrt(p * (1.0 - p) / runs))

    halves, strata, keys = np.zeros((runs, m)), np.zeros((runs, m)), np.zeros((runs, m))
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        keys[seed], halves[seed] = design_on_records(*draw_design(m, "holdout", rng), scores, member)
        strata[seed] = holdout.on_records(holdout.split(np.sort(member), rng, stratified=True), scores, member)
    off = ~np.eye(m, dtype=bool)
    k = m // 2
    assert within(halves.mean(0), k / m) and within((halves.T @ halves / runs)[off], k * (k - 1) / (m * (m - 1)))
    for c in (member, ~member):
        n, kc = int(c.sum()), int(c.sum()) // 2
        assert np.all(strata[:, c].sum(1) == kc)
        pairs = strata[:, c].T @ strata[:, c] / runs
        assert within(strata[:, c].mean(0), kc / n)
        assert within(pairs[~np.eye(n, dtype=bool)], kc * (kc - 1) / (n * (n - 1)))
    # keys: each uniform (P[U < 1/2] = 1/2) and no two alike (E[UV] = 1/4, Var(UV) = 1/9 - 1/16 = 7/144)
    assert within((keys < 0.5).mean(0), 0.5)
    assert np.all(np.abs((keys.T @ keys / runs)[off] - 0.25) <= 5.0 * math.sqrt(7.0 / 144.0 / runs))


# Mutation testing, eighth pass: the edges of the p-value and of the root search, each against the
# 50-digit transcription of Steinke et al.'s Algorithm 2 above (p_value_mpmath), not the code's own output.


@pytest.mark.parametrize(
    ("m", "r", "v", "eps", "delta"),
    [(10, 6, 0, 0.5, 1e-3), (10, 0, 0, 0.0, 0.0), (60, 60, 45, 0.0, 0.5), (40, 20, 17, 2.0, 0.3)],
)
def test_p_value_is_a_probability_at_v_zero_and_when_the_delta_term_is_large(m, r, v, eps, delta):
    # v = 0 is always observed (p = 1); 2mδ·α above 1 caps p at 1 (Algorithm 2 returns min(1, ·)).
    expected = float(p_value_mpmath(m, r, v, eps, delta))
    assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(expected, rel=1e-12)
    assert one_run_p_value(m, r, v, eps, delta) <= 1.0


def test_bound_is_zero_when_only_the_pure_dp_test_rejects():
    # 5 of 5 right: the δ = 0 bound is positive, but with 2mδ = 2 the δ term keeps the p-value above α
    # at every ε in [0, pure bound], so nothing is rejected (no crossing to return).
    m, r, v, delta, a = 1000, 5, 5, 1e-3, 0.05
    hi = float(one_run_pure_epsilon(r, v, a))
    assert hi > 0
    assert all(p_value_mpmath(m, r, v, e, delta) > a for e in np.linspace(0.0, hi, 21))
    assert one_run_epsilon_lower_bound(m, r, v, delta, a) == 0.0


@pytest.mark.parametrize(
    ("m", "r", "v", "delta"), [(200, 200, 150, 1e-4), (60, 60, 45, 1e-3), (50, 20, 17, 1e-4), (50, 20, 19, 1e-4)]
)
def test_small_bounds_are_crossings_of_the_exact_p_value(m, r, v, delta):
    # Crossings near or below 1: the root search must bracket from ε = 0, not from ε = 1. At (50, 20, 17) and
    # (50, 20, 19) Brent's root lands just past the crossing (log p − log α ≈ +4e-9 and +2e-9 there), so the
    # step back inside it is what keeps p(ε) ≤ α at 50 digits.
    a = 0.05
    e = one_run_epsilon_lower_bound(m, r, v, delta, a)
    assert 0.0 < e < (1.0 if v < 19 else 1.5)
    assert p_value_mpmath(m, r, v, e, delta) <= a
    assert p_value_mpmath(m, r, v, e * (1 + 1e-6) + 1e-9, delta) > a


@pytest.mark.parametrize(
    ("m", "r", "v", "delta", "a"),
    [(10_000, 2500, 2475, 1e-3, 0.05), (10_000, 2500, 2400, 1e-5, 0.01), (1000, 500, 450, 1e-3, 0.05)],
)
def test_a_bound_found_to_full_precision_has_exact_p_value_at_most_alpha(m, r, v, delta, a):
    # With the root found to 1e-15, the float log p-value at the returned ε sits within rounding of log α; before the
    # margin on α (one_run.py, 16·2^-52·(ln Γ(r + 1) + r + 4)) the exact log p there was above log α by 3.4e-12,
    # 2.9e-12 and 6.9e-14 (the float one falls below the exact one by up to 4e-12 at r = 2500).
    e = one_run_epsilon_lower_bound(m, r, v, delta, a, tol=1e-15)
    assert e > 0 and p_value_mpmath(m, r, v, e, delta) <= a


def test_a_negligible_delta_term_gives_the_rounded_down_pure_bound_without_a_root_search():
    # δ = 1e-30: p(ε) = β(ε) to float precision, and the pure bound (rounded down with the Clopper–Pearson limit)
    # already has p below the margined α, so there is no sign change for Brent's method (which raised before).
    m, r, v, delta, a = 1000, 500, 480, 1e-30, 0.05
    e = one_run_epsilon_lower_bound(m, r, v, delta, a)
    assert e == float(one_run_pure_epsilon(r, v, a)) > 0 and p_value_mpmath(m, r, v, e, delta) <= a


def test_best_bound_over_pairs_is_the_maximum_over_every_pair():
    # The early stop (pure-DP bound ≤ best so far) may skip only pairs that cannot win: the result is the
    # brute-force maximum of the per-pair bound, and the reported index attains it.
    from dpaudit.audit.one_run import best_bound_over_pairs

    rng = np.random.default_rng(3)
    m = 400
    member = rng.random(m) < 0.5
    scores = np.where(member, 1.0, 0.0) * 0.8 + rng.normal(size=m)
    kp, km = bonferroni_pairs(m)
    top, bottom = guess_counts(scores, member, rng.random(m))
    r, v = kp + km, top[kp] + bottom[km]
    a = 0.05 / len(kp)
    each = [one_run_epsilon_lower_bound(m, int(ri), int(vi), 1e-5, a) for ri, vi in zip(r, v, strict=True)]
    assert min(each) == 0.0 < max(each)  # some pairs certify nothing, so the visiting order matters
    best, i = best_bound_over_pairs(m, r, v, 1e-5, a)
    assert best == max(each) and each[i] == best


def test_fixed_guess_counts_are_the_users_and_their_correct_guesses_are_counted_by_hand():
    """A fixed design guesses "in" for the k₊ highest scores and "out" for the k₋ lowest (continuous scores: no
    ties); the correct guesses counted by hand give the bound at level α (Steinke, Nasr & Jagielski 2023, one test).
    Planted (tenth mutation pass): k₊ or k₋ replaced by 0 (or None by 1, so (7, 0) guessed 7 + 1), the correct count
    read from one side only, n_tests reported as 0 or 2 (fixed or holdout) -> fail."""
    rng = np.random.default_rng(8)
    m = 60
    member = rng.random(m) < 0.5
    scores = rng.normal(1.5 * member, 1.0)
    order = np.argsort(-scores)
    for kp, km in ((10, 5), (0, 8), (7, 0)):
        # a count of 0 given as None (left out): the other side alone
        r = audit_scores(scores, member, method="one-run", design="canaries", k_plus=kp or None, k_minus=km or None)
        v = int(member[order[:kp]].sum() + (~member[order[m - km :]]).sum())
        c = r.counts
        assert (c["k_plus"], c["k_minus"], c["guesses"], c["correct"]) == (kp, km, kp + km, v)
        assert r.epsilon_lower_bound == one_run_epsilon_lower_bound(m, kp + km, v, 1e-5, 0.05)
        assert r.details["n_tests"] == 1 and r.details["alpha_per_test"] == 0.05
    h = audit_scores(scores, member, method="one-run", design="canaries", threshold_selection="holdout", seed=0)
    assert h.details["n_tests"] == 1 and h.details["alpha_per_test"] == 0.05  # one test on the evaluation half


def test_bonferroni_audit_is_the_best_pair_with_correct_guesses_counted_by_hand():
    """The Bonferroni design through audit_scores: the bound is the largest over the pairs of bonferroni_pairs(m)
    of the single-test bound at α/K with v counted by hand (top k₊ "in", bottom k₋ "out"), and the counts reported
    are the winning pair's. Planted (tenth mutation pass): v read from one side only, guesses k₊ − k₋ -> fail."""
    rng = np.random.default_rng(9)
    m = 80
    member = rng.random(m) < 0.5
    scores = rng.normal(2.0 * member, 1.0)
    order = np.argsort(-scores)
    kp, km = bonferroni_pairs(m)
    a = 0.05 / len(kp)
    vs = [int(member[order[:p]].sum() + (~member[order[m - q :]]).sum()) for p, q in zip(kp, km, strict=True)]
    bounds = [one_run_epsilon_lower_bound(m, int(p + q), v, 1e-5, a) for p, q, v in zip(kp, km, vs, strict=True)]
    r = audit_scores(scores, member, method="one-run", design="canaries", threshold_selection="bonferroni", seed=0)
    assert r.epsilon_lower_bound == pytest.approx(max(bounds), rel=1e-9) and max(bounds) > 0.5
    c = r.counts
    i = next(j for j in range(len(kp)) if (kp[j], km[j]) == (c["k_plus"], c["k_minus"]))
    assert (c["guesses"], c["correct"]) == (kp[i] + km[i], vs[i]) and bounds[i] == max(bounds)


def test_bonferroni_grid_guesses_every_canary_but_at_most_one_for_every_m():
    # The (k, k) pattern's top pair is capped at floor(m/2): with k = round(m/2) it needed m + 1 canaries for every
    # m ≡ 3 mod 4 (Python rounds 1467.5 up to 1468) and was dropped, so a bigger design certified less: a perfect
    # attack on 2935 canaries reached ε 4.07 against 4.73 on 2934 (δ = 1e-5, 95 %).
    for m in range(2, 300):
        kp, km = bonferroni_pairs(m)
        assert (kp + km).max() >= m - 1, m
    small, big = (max_certifiable_epsilon(m // 2, m - m // 2, method="one-run", threshold_selection="bonferroni")
                  for m in (2934, 2935))  # fmt: skip
    assert big >= 0.999 * small


def test_holdout_guesses_follow_the_selection_thresholds_not_the_evaluation_halfs_size():
    """The holdout applies the chosen guesses to the evaluation half as score thresholds from the selection half,
    not as counts floor(f·m_part): with "in" for the selection half's top half (60 members of 100, scores in
    [10, 11): the threshold is a member's score) and an evaluation half of 40 members (scores in [12, 13)) and 60
    non-members (in [0, 1)), the evaluation half gets "in" for exactly its 40 members and no wrong guess. Counts
    would guess 50 "in", 10 of them wrong: a cause of the one-run bound falling from a leak of μ = 3 to μ = 4
    (benchmarks/one_run_power.py). Ties on the threshold score follow the keys
    as guess_counts ranks them. Planted: counts floor(f·m_part) on the evaluation half fail the first part; ties
    compared without the keys (or the wrong way) fail the second."""
    from dpaudit.audit import one_run

    fp, fm = one_run._fraction_pairs()
    half_in = int(np.flatnonzero((fp == 0.5) & (fm == 0.0))[0])
    choose = one_run.choose_guess_fractions(lambda *_: half_in)
    rng = np.random.default_rng(0)
    sel_member, ev_member = np.arange(100) < 60, np.arange(100) < 40
    thresholds = choose(10.0 * sel_member + rng.random(100), sel_member, rng.random(100))
    kp, km, correct, m_part = one_run.apply_guess_fractions(
        thresholds, 12.0 * ev_member + rng.random(100), ev_member, rng.random(100)
    )
    assert (kp, km, correct, m_part) == (40, 0, 40, 100)
    # Ties: every score equal, so the keys alone rank; the threshold is the selection's 51st smallest key, and the
    # evaluation canaries with a smaller key are "in" (guess_counts ranks ties by ascending key).
    keys_sel, keys_ev = rng.random(100), rng.random(100)
    thresholds = choose(np.zeros(100), sel_member, keys_sel)
    kp, _, correct, _ = one_run.apply_guess_fractions(thresholds, np.zeros(100), ev_member, keys_ev)
    cut = np.sort(keys_sel)[50]
    assert kp == int(np.sum(keys_ev < cut))
    top, _ = guess_counts(np.zeros(100), ev_member, keys_ev)
    assert correct == top[kp]


def test_the_holdout_thresholds_applied_to_their_own_selection_part_give_back_every_chosen_count():
    """choose_guess_fractions turns the chosen counts (k₊, k₋) into the selection part's (k₊ + 1)-th canary from the
    top and (k₋ + 1)-th from the bottom, and apply_guess_fractions guesses "in" above the first and "out" below the
    second (its docstring): on the part they were chosen on, exactly k₊ and k₋ canaries, with guess_counts' correct
    guesses, for every pair of the grid (ties in the scores included: the keys rank them). Planted: the bottom
    threshold one rank off (the k₋-th from the bottom) guesses k₋ - 1 there."""
    from dpaudit.audit import one_run

    rng = np.random.default_rng(7)
    m_part = 37
    scores, member, keys = rng.integers(0, 9, m_part).astype(float), rng.random(m_part) < 0.5, rng.random(m_part)
    kp_grid, km_grid = one_run._fractions_to_counts(*one_run._fraction_pairs(), m_part)
    top, bottom = guess_counts(scores, member, keys)
    for i in range(len(kp_grid)):
        thresholds = one_run.choose_guess_fractions(lambda *_, i=i: i)(scores, member, keys)
        kp, km = int(kp_grid[i]), int(km_grid[i])
        assert one_run.apply_guess_fractions(thresholds, scores, member, keys) == (kp, km, top[kp] + bottom[km], m_part)


@pytest.mark.parametrize("m", [9, 10, 21, 22])
def test_a_perfect_holdout_attack_certifies_every_evaluation_canary_guessed(m):
    """The holdout's thresholds can guess every canary of the evaluation half (m - floor(m/2) of them), so a perfect
    attack's bound is the one-run bound of all of them guessed right (max_certifiable's holdout_perfect_pairs:
    (m_eval, 0) beside the grid, whose counts reach only m_eval - 1 when m_eval is odd); the bound grows with the
    guesses (Steinke, Nasr & Jagielski 2023, Theorem 3.1), so that pair is the best. Planted: (m_eval, -1) for it."""
    from dpaudit.audit import one_run

    m_eval = m - m // 2
    kp, km = one_run.holdout_perfect_pairs(m_eval)
    assert kp.min() >= 0 and km.min() >= 0 and (kp + km).max() == m_eval
    expected = one_run_epsilon_lower_bound(m_eval, m_eval, m_eval, 1e-5, 0.05)
    assert one_run.max_certifiable(m, 1e-5, 0.05, "holdout") == expected


def test_a_canary_between_crossed_holdout_thresholds_is_guessed_in_only():
    """When the chosen counts guess every selection canary (k₊ = k₋ = 5 of 10: fractions (1/2, 1/2)) the top threshold
    (6th from the top, score 4) lies below the bottom one (6th from the bottom, score 5), and an evaluation canary
    scored between them is above the first and below the second: apply_guess_fractions guesses it "in" only (its
    docstring), so no canary is guessed twice and k₊ + k₋ ≤ m_part, as the one-run theorem's r ≤ m needs (Steinke,
    Nasr & Jagielski 2023, Theorem 3.1). Planted: no cap on k₋ counts each such canary "in" and "out"."""
    from dpaudit.audit import one_run

    fp, fm = one_run._fraction_pairs()
    both = int(np.flatnonzero((fp == 0.5) & (fm == 0.5))[0])
    rng = np.random.default_rng(3)
    thresholds = one_run.choose_guess_fractions(lambda *_: both)(np.arange(10.0), np.arange(10) >= 5, rng.random(10))
    ev_member = np.arange(10) < 6
    assert one_run.apply_guess_fractions(thresholds, np.full(10, 4.5), ev_member, rng.random(10)) == (10, 0, 6, 10)


def test_the_memoised_bound_and_p_value_are_the_uncached_functions_values():
    # _log_p_value and _epsilon_lower_bound are memoised (audit plan's simulated one-run audits repeat them): every
    # argument must reach the cache key and the computation. Interleaved calls varying one argument at a time, each
    # made twice (a miss, then a hit), against the undecorated functions. Planted: the public function passing the
    # default tol (or alpha for delta) to the memoised one -> fail.
    from dpaudit.audit import one_run

    base = {"m": 400, "r": 120, "v": 95, "delta": 1e-5, "alpha": 0.05, "tol": 1e-7}
    variants = [base] + [
        {**base, k: x} for k, x in (("m", 800), ("r", 150), ("v", 100), ("delta", 1e-3), ("alpha", 0.01), ("tol", 1e-3))
    ]
    for _ in range(2):
        for c in variants:
            e = one_run_epsilon_lower_bound(c["m"], c["r"], c["v"], c["delta"], c["alpha"], tol=c["tol"])
            ref = one_run._epsilon_lower_bound.__wrapped__(c["m"], c["r"], c["v"], c["delta"], c["alpha"], c["tol"])
            assert e == ref, c
            for eps in (0.0, 0.7, e):
                args = (c["m"], c["r"], c["v"], eps, c["delta"])
                assert one_run._log_p_value(*args) == one_run._log_p_value.__wrapped__(*args), (c, eps)
    keys = ("m", "r", "v", "delta", "alpha")
    values = {one_run_epsilon_lower_bound(*(c[k] for k in keys), tol=c["tol"]) for c in variants}
    assert len(values) == len(variants)  # each argument moves the bound here, so a dropped one shows


def test_the_ceiling_bounds_every_outcome_and_is_reached_by_a_perfect_attack():
    """one_run.certifiable_ceiling: no outcome (r guesses, v correct, 1 <= v <= r <= m) certifies more, and a perfect
    attack comes within 1e-4 of it. Every (r, v) of m = 60 at delta 1e-2 (the best: 60 of 60, 0.8816), and the design's
    perfect attack (max_certifiable_epsilon) at larger m. Plants caught: the floor at delta 1.01x (0.016 below the
    best outcome), at m + 1 (6e-4 below) or m - 1 (above by 3e-3 at m 101), its 2m*delta as m*delta. (A j of 0 would be
    valid: p >= beta >= P[F <= 0].)"""
    from dpaudit.audit import one_run

    m, delta = 60, 1e-2
    best = max(one_run_epsilon_lower_bound(m, r, v, delta, 0.05) for r in range(1, m + 1) for v in range(1, r + 1))
    ceiling = one_run.certifiable_ceiling(m, delta, 0.05)
    assert best <= ceiling <= best + 1e-4, (best, ceiling)
    for m_eval, delta, alpha in ((101, 1e-2, 0.05), (801, 1e-3, 0.05), (801, 1e-4, 0.005)):
        perfect = max_certifiable_epsilon(m_eval, m_eval - 1, method="one-run", delta=delta, confidence=1 - alpha)
        ceiling = one_run.certifiable_ceiling(m_eval, delta, alpha)
        assert perfect <= ceiling <= perfect + 1e-4, (m_eval, delta, perfect, ceiling)
        # The floor on the p-value exceeds alpha just above the ceiling, and the perfect attack's p-value is below
        # it just under the perfect attack's bound (the design's test with all its guesses right).
        assert one_run.outcome_p_value_floor(m_eval, ceiling, delta) > alpha
        assert not one_run.certifies_beyond(m_eval, ceiling, delta, alpha)
        assert one_run.certifies_beyond(m_eval, perfect, delta, alpha)
    # All m guesses right have p-value >= beta = q^m (the floor's j = 0 term), so the ceiling is finite for every
    # delta: logit(alpha^(1/m)) where 2*m*delta is small, pure DP included. It was inf there (the j >= 1 terms only).
    for m, delta in ((100, 0.0), (100, 1e-5), (1000, 1e-5)):
        pure = math.log(0.05 ** (1 / m) / (1 - 0.05 ** (1 / m)))
        all_right = one_run_epsilon_lower_bound(m, m, m, delta, 0.05)
        ceiling = one_run.certifiable_ceiling(m, delta, 0.05)
        assert all_right <= ceiling <= pure * (1 + 1e-6), (m, delta, all_right, ceiling, pure)
        assert not one_run.certifies_beyond(m, pure * (1 + 1e-6), delta, 0.05)
    assert one_run.certifiable_ceiling(100, 0.0, 0.05) - one_run_epsilon_lower_bound(100, 100, 100, 0.0, 0.05) < 1e-6
    # Every outcome of m = 60 at delta 1e-5 (was inf): the best, all 60 right, within 0.01 of the ceiling (its
    # p-value exceeds q^m by at most 2*m*delta = 1.2e-3; d(q^m)/d(eps) = m*s*q^m = 0.147 there: 0.008 in eps).
    best = max(one_run_epsilon_lower_bound(60, r, v, 1e-5, 0.05) for r in range(1, 61) for v in range(1, r + 1))
    assert best <= one_run.certifiable_ceiling(60, 1e-5, 0.05) <= best + 0.01


def test_the_bound_reads_delta_in_its_closed_interval_and_alpha_in_its_open_one():
    # δ = 0 is the pure one-run test: the bound is the largest ε with P[Bin(r, e^ε/(1 + e^ε)) >= v] <= alpha
    # (Steinke et al. 2023, Thm. 3.1 with δ = 0), computed here by scipy's binomial tail; δ = 1 certifies nothing.
    # Outside [0, 1] (δ) and (0, 1) (alpha) the call is refused, not answered.
    eps = one_run_epsilon_lower_bound(1000, 100, 90, 0.0, 0.05)
    tail = [stats.binom.sf(89, 100, math.exp(e) / (1 + math.exp(e))) for e in (eps, eps + 1e-5)]
    assert tail[0] <= 0.05 < tail[1]
    assert one_run_epsilon_lower_bound(1000, 100, 90, 1.0, 0.05) == 0.0
    for delta, alpha, name in ((-1e-9, 0.05, "delta"), (1 + 1e-9, 0.05, "delta"), (1e-5, 1.0, "alpha"),
                               (1e-5, 1.5, "alpha"), (1e-5, -0.5, "alpha")):  # fmt: skip
        with pytest.raises(InputError, match=name):
            one_run_epsilon_lower_bound(1000, 100, 90, delta, alpha)


def test_the_outcome_floor_is_its_max_over_every_j_and_its_margin_relative():
    """one_run.outcome_p_value_floor is max_j w_j P[Bin(m, s) <= j] over every j = 0..m (w_0 = 1, w_j = min(1,
    2m*delta/j)): its cut at mean + 40 sd + 40 leaves out only terms below the max (past the cut P = 1 to float
    precision and w_j falls). Compared with that max over j up to mean + 200 sd at m = 10^7, eps = 9 (mean 1234, sd 35:
    the max near mean + 2.2 sd; a cut at mean + 1.6 sd or less, the sd without m, the mean left out, lowers it by 3 % or
    more; scipy's two binomial CDFs agree to 1.3e-10 there), where the j = 1 term is the max (m 10, eps 2, delta 0.05:
    2m*delta = 1), and at delta 0.5 (every p-value is >= min(1, 2m*delta/r) = 1: the floor is exactly 1, not 1 - s^m nor
    above 1). certifies_beyond allows the floor a relative 1e-6 above alpha (its float error), not 2e-6. Also at m =
    10^6, eps = 1 (mean 268,941, sd 443: a cut without the mean, at 40 sd + 40 = 17,760, finds nothing), without a
    RuntimeWarning (2m*delta/0 at j = 0), and the ceiling is inf only for an alpha within the margin of 1."""
    from dpaudit.audit import one_run

    def brute(m, eps, delta):
        s = special.expit(-eps)
        top = min(m, math.ceil(m * s + 200 * math.sqrt(m * s * (1 - s)) + 200))
        j = np.arange(0, top + 1, dtype=float)
        w = np.where(j == 0, 1.0, np.minimum(1.0, 2 * m * delta / np.maximum(j, 1.0)))
        return float(np.max(w * stats.binom.cdf(j, m, s)))

    cases = ((10**7, 9.0, 1e-5), (10**6, 1.0, 1e-5), (10, 2.0, 0.05), (1000, 1.0, 1e-3), (60, 0.5, 0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning of a 2m*delta/0 (the j = 0 weight is 1, not computed)
        for m, eps, delta in cases:
            assert one_run.outcome_p_value_floor(m, eps, delta) == pytest.approx(brute(m, eps, delta), rel=1e-8)
        assert one_run.outcome_p_value_floor(5, 0.0, 0.5) == 1.0
        assert one_run.outcome_p_value_floor(5, 3.0, 0.5) == 1.0
    # The floor at eps = 1000 is 1: only an alpha within the 1e-6 margin of 1 certifies there (no ceiling).
    assert one_run.certifiable_ceiling(5, 1e-5, 1 - 1e-7) == math.inf

    m, delta, alpha = 101, 1e-2, 0.05
    for excess, certifies in ((5e-7, True), (2e-6, False)):
        lo, hi = 0.0, 5.0  # the floor increases in eps: bisect for floor = alpha * (1 + excess)
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if one_run.outcome_p_value_floor(m, mid, delta) < alpha * (1 + excess) else (lo, mid)
        assert alpha < one_run.outcome_p_value_floor(m, hi, delta) <= alpha * (1 + 1.5 * excess)
        assert one_run.certifies_beyond(m, hi, delta, alpha) is certifies
