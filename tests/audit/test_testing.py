"""dpaudit.testing: audit_mechanism and assert_dp on users' mechanisms."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.accounting.gdp import gdp_mu_from_epsilon_delta
from dpaudit.audit import max_certifiable_epsilon
from dpaudit.errors import InputError
from dpaudit.testing import assert_dp, audit_mechanism, trials_for_power

EPS, DELTA = 2.0, 1e-5
# Gaussian noise calibrated exactly to (2, 1e-5) for sensitivity 1: σ = 1/μ(ε, δ) (μ-GDP ↔ (ε, δ)).
SIGMA = 1.0 / gdp_mu_from_epsilon_delta(EPS, DELTA)
D, D_PRIME = np.array([1.0, 0.0, 1.0]), np.array([0.0, 0.0, 1.0])  # differ in one record


def gaussian_sum(sigma):
    def mechanism(data, rng):
        return float(np.sum(data)) + rng.normal(0.0, sigma)

    return mechanism


def laplace_sum(scale):
    def mechanism(data, rng):
        return float(np.sum(data)) + rng.laplace(0.0, scale)

    return mechanism


def test_correct_gaussian_mechanism_passes():
    for method in ("clopper-pearson", "gdp"):
        res = assert_dp(gaussian_sum(SIGMA), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=5000, method=method)
        assert res.verdict == "consistent"
        assert res.claimed_epsilon == EPS and res.details["pilot_trials"] == 1000
        # Independent runs: the clopper-pearson bound is formal, the gdp one an estimate.
        assert res.design == "multi-run" and res.formal is (method == "clopper-pearson")


def test_half_the_noise_fails_the_gdp_audit():
    # Half the noise doubles μ: true ε(1e-5) ≈ 4.4 vs the claimed 2. The gdp estimate sees it at 5000
    # trials (its bound is ≈ 3.7 here, with a margin of several standard errors).
    with pytest.raises(AssertionError, match=r"lower bound [0-9.]+ > claimed epsilon 2"):
        assert_dp(gaussian_sum(SIGMA / 2), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=5000, method="gdp")


def test_half_the_noise_fails_the_formal_audit_for_laplace():
    # Laplace with half the scale is exactly 2ε-DP: the formal (Clopper–Pearson) bound refutes ε = 1.
    with pytest.raises(AssertionError, match="claimed epsilon 1"):
        assert_dp(laplace_sum(0.5), D, D_PRIME, epsilon=1.0, delta=0.0, trials=5000)
    assert_dp(laplace_sum(1.0), D, D_PRIME, epsilon=1.0, delta=0.0, trials=5000)


def test_vector_outputs_use_a_learned_projection():
    # The signal sits in one of 5 coordinates with unequal noise; the pilot finds it (Fisher direction).
    scales = np.array([3.0, 0.2, 1.0, 5.0, 1.0])

    def mechanism(data, rng):
        out = rng.normal(0.0, scales)
        out[1] += 0.4 * float(np.sum(data))  # sensitivity 0.4 against noise 0.2: μ = 2
        return out

    res = audit_mechanism(mechanism, D, D_PRIME, epsilon=1.0, delta=DELTA, trials=4000, method="gdp")
    assert res.verdict == "estimate-exceeds-claim"  # gdp is an estimate: never a formal "violation"
    assert res.details["mu_lower_bound"] > 1.7
    # The same projection given in advance skips the pilot: every run is audited.
    w = np.array([0.0, 1.0, 0.0, 0.0, 0.0])
    fixed = audit_mechanism(mechanism, D, D_PRIME, epsilon=1.0, delta=DELTA, trials=4000, method="gdp", direction=w)
    assert fixed.details["pilot_trials"] == 0 and fixed.counts["n_members"] == 4000
    assert fixed.details["mu_lower_bound"] > 1.7


def test_audit_mechanism_is_reproducible():
    a = audit_mechanism(gaussian_sum(1.0), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=200, seed=3)
    b = audit_mechanism(gaussian_sum(1.0), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=200, seed=3)
    assert a == b


def noiseless(data, rng):
    return float(np.sum(data))


def test_a_powerless_test_fails_by_default():
    # A noiseless mechanism is not DP at all, but 100 trials (80 audited per side, 40 evaluated after
    # the holdout split) certify at most ≈ 2.3 < 5 even for this perfect attack: the test could never
    # fail, its power is 0. By default that is an error naming the power and the trials needed.
    never = r"never refute the claim with 100 trials per side, against any leak \(power 0; max certifiable epsilon "
    with pytest.raises(AssertionError, match=never + r"2\.3[0-9]*\). Needed: about [0-9]+ trials per side"):
        assert_dp(noiseless, D, D_PRIME, epsilon=5.0, delta=DELTA, trials=100)
    res = audit_mechanism(noiseless, D, D_PRIME, epsilon=5.0, delta=DELTA, trials=100)
    assert res.verdict == "inconclusive" and res.max_certifiable_epsilon < 5.0
    assert res.max_certifiable_epsilon == pytest.approx(max_certifiable_epsilon(80, 80, delta=DELTA))
    # A CI helper fails rather than passes a test that cannot refute the claim: require_power=False skips
    # only the power check, never the "inconclusive" one.
    need = trials_for_power(5.0, delta=DELTA)
    with pytest.raises(AssertionError, match=rf"^inconclusive: the test cannot refute .*Needed: at least {need} "):
        assert_dp(noiseless, D, D_PRIME, epsilon=5.0, delta=DELTA, trials=100, require_power=False)


@pytest.mark.parametrize("direction", [None, "greater"])
def test_trials_for_power_is_exactly_enough_for_a_perfect_attack(direction):
    # Oracle: the noiseless mechanism is a perfect attack, so with the advised number of trials the
    # claim ε = 5 is refuted ("violation"), and with one trial fewer the test is powerless.
    n = trials_for_power(5.0, delta=DELTA, pilot=direction is None)
    kw = {"epsilon": 5.0, "delta": DELTA, "direction": direction}
    assert audit_mechanism(noiseless, D, D_PRIME, trials=n, **kw).verdict == "violation"
    assert audit_mechanism(noiseless, D, D_PRIME, trials=n - 1, **kw).verdict == "inconclusive"
    with pytest.raises(AssertionError, match=f"at least {n} even for a perfect attack"):
        assert_dp(noiseless, D, D_PRIME, trials=n - 1, **kw)


def test_results_do_not_depend_on_n_jobs():
    # Every run has its own Generator spawned from SeedSequence(seed): parallel = serial, bit for bit.
    a = audit_mechanism(gaussian_sum(1.0), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=200, seed=3)
    b = audit_mechanism(gaussian_sum(1.0), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=200, seed=3, n_jobs=2)
    assert a == b
    c = audit_mechanism(gaussian_sum(1.0), D, D_PRIME, epsilon=EPS, delta=DELTA, trials=200, seed=4)
    assert c != a


def test_direction_less_audits_a_decreasing_mechanism_without_a_pilot():
    def decreasing(data, rng):
        return -float(np.sum(data)) + rng.laplace(0.0, 0.5)  # 2-DP, lower output on `data`

    res = audit_mechanism(decreasing, D, D_PRIME, epsilon=1.0, delta=0.0, trials=3000, direction="less")
    assert res.details["pilot_trials"] == 0 and res.counts["n_members"] == 3000
    assert res.verdict == "violation" and res.formal
    wrong = audit_mechanism(decreasing, D, D_PRIME, epsilon=1.0, delta=0.0, trials=3000, direction="greater")
    assert wrong.epsilon_lower_bound == 0.0  # the wrong direction, fixed in advance, sees nothing


@pytest.mark.parametrize(
    ("mechanism", "kwargs", "message"),
    [
        (lambda d, rng: 0.0, {"direction": "up"}, "direction"),
        (lambda d, rng: 0.0, {"direction": [0.0]}, "not all zero"),
        (lambda d, rng: np.ones(3), {"direction": "greater"}, "projection vector of length 3"),
        (lambda d, rng: np.ones(3), {"direction": [1.0, 2.0]}, "length 2"),
        (lambda d, rng: 0.0, {"n_jobs": 0}, "n_jobs"),
        (lambda d, rng: 0.0, {"seed": -1}, "seed"),
        (lambda d, rng: "x", {}, "float or a 1-D"),
        (lambda d, rng: np.ones((2, 2)), {}, "1-D array"),
        (lambda d, rng: np.nan, {}, r"not finite at trial 0 \(value nan\): .*np.nan_to_num"),
        (lambda d, rng: None, {}, "returned None on data at trial 0"),
        (lambda d, rng: np.ones(int(rng.integers(1, 3))), {}, "changed shape"),
        (lambda d, rng: 0.0, {"trials": 5}, "trials >= 20"),
        (lambda d, rng: 0.0, {"method": "one-run"}, "method"),
        (lambda d, rng: 0.0, {"epsilon": -1.0}, "epsilon"),
    ],
)
def test_bad_mechanisms_and_arguments(mechanism, kwargs, message):
    args = {"epsilon": 1.0, "delta": DELTA, "trials": 100, **kwargs}
    with pytest.raises(InputError, match=message):
        audit_mechanism(mechanism, D, D_PRIME, **args)


def randomized_response(eps):
    """Exactly (ε, 0)-DP: reports whether the data sum is 2 (``D``) or 1 (``D_PRIME``), truthfully w.p. e^ε/(1+e^ε)."""

    def mechanism(data, rng):
        bit = float(np.sum(data)) > 1.5
        return float(bit if rng.random() < np.exp(eps) / (1 + np.exp(eps)) else not bit)

    return mechanism


def test_a_test_without_power_against_twice_the_claim_fails_and_names_the_trials_needed():
    """Issue 27: 60 trials per side (48 audited) can refute ε = 1 with a perfect attack (23 suffice; the old
    check passed it), but catch a 2x error — randomized response at ε = 2, the most detectable leak of
    that size — in only about 40% of runs. assert_dp fails it as powerless and names the trials needed; with that
    many trials it passes the check, and a real 2x error is then caught in about 80% of seeds."""
    laplace_ok = laplace_sum(1.0)  # exactly 1-DP: the claim is true
    assert audit_mechanism(laplace_ok, D, D_PRIME, epsilon=1.0, delta=0.0, trials=60).max_certifiable_epsilon > 1.0
    with pytest.raises(AssertionError, match=r"too little power.*randomized response at epsilon = 2") as err:
        assert_dp(laplace_ok, D, D_PRIME, epsilon=1.0, delta=0.0, trials=60)
    needed = int(__import__("re").search(r"Needed: about ([0-9]+) trials per side", str(err.value)).group(1))
    assert needed > 60
    assert_dp(laplace_ok, D, D_PRIME, epsilon=1.0, delta=0.0, trials=needed)  # powerful now, and the claim holds
    caught = sum(
        audit_mechanism(randomized_response(2.0), D, D_PRIME, epsilon=1.0, delta=0.0, trials=needed, seed=s).verdict
        == "violation"
        for s in range(40)
    )
    # The planned power is 0.8 (+ its own simulation error); 40 seeds: 3 sd below 0.8 is 0.61.
    assert caught >= 24, caught
    res = assert_dp(laplace_ok, D, D_PRIME, epsilon=1.0, delta=0.0, trials=60, require_power=False)
    assert res.verdict == "consistent"


def test_the_power_check_decides_on_the_interval_not_the_point_estimate():
    """116 trials per side (93 audited) against randomized response at twice the claim: the simulated audit
    refutes the claim in 167 of 200 draws, an estimate of 0.83 >= 0.8, but its 95% Clopper-Pearson interval
    starts at 0.77: power 0.8 is not shown (172 of 200 would be), so assert_dp fails and says so, naming the
    estimate and its interval; the trials it names pass by the same rule."""
    from scipy import stats

    laplace_ok = laplace_sum(1.0)  # exactly 1-DP: the claim is true
    with pytest.raises(AssertionError) as err:
        assert_dp(laplace_ok, D, D_PRIME, epsilon=1.0, delta=0.0, trials=116)
    lo, hi = stats.beta.ppf(0.025, 167, 34), stats.beta.ppf(0.975, 168, 33)
    expected = (
        f"estimated probability 0.83 with 116 trials per side (the simulated audit refuted it in 167 of 200 draws; "
        f"95% Clopper-Pearson interval {np.floor(lo * 100) / 100:.2f} to {np.ceil(hi * 100) / 100:.2f}), which does "
        "not show power >= 0.8 (the interval's lower end must reach it: at least 172 of 200 draws"
    )
    assert expected in str(err.value), str(err.value)
    needed = int(__import__("re").search(r"Needed: about ([0-9]+) trials per side", str(err.value)).group(1))
    assert needed > 116
    assert_dp(laplace_ok, D, D_PRIME, epsilon=1.0, delta=0.0, trials=needed)


def test_wide_outputs_learn_the_direction_without_a_d_by_d_covariance():
    """A mechanism returning a noisy gradient (d = 3000 coordinates) with 50 pilot runs per side: the pilot's
    Fisher direction formed the d × d covariance (72 MB here; 80 GB at d = 10⁵, a CI runner killed) and solved
    it in O(d³). Now the Woodbury form, m × m for the m = 100 pilot rows, gives the same direction."""
    import tracemalloc

    from dpaudit.testing import _projection

    rng = np.random.default_rng(0)
    d = 3000
    pilot_in, pilot_out = rng.normal(size=(50, d)), rng.normal(size=(50, d))
    pilot_in[:, 0] += 1.0
    tracemalloc.start()
    w = _projection(pilot_in, pilot_out)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20 * 2**20, f"peak {peak / 2**20:.0f} MiB: a d x d matrix was formed"
    # the same direction as the d × d formula (checked where that is cheap: d = 300 > 100 rows)
    small_in, small_out = pilot_in[:, :300], pilot_out[:, :300]
    cov = 0.5 * (np.cov(small_in, rowvar=False) + np.cov(small_out, rowvar=False))
    direct = np.linalg.solve(cov + 1e-6 * np.trace(cov) / 300 * np.eye(300), small_in.mean(0) - small_out.mean(0))
    woodbury = _projection(small_in, small_out)
    assert abs(direct @ woodbury) / np.linalg.norm(direct) / np.linalg.norm(woodbury) > 1 - 1e-9
    assert w.shape == (d,) and np.all(np.isfinite(w))


def test_a_pilot_with_fewer_runs_than_outputs_is_not_shown_powerful():
    """A noisy 300-coordinate output whose record moves one coordinate, noise scale halved (true ε = 2 against a
    claimed 1): with 200 trials per side the pilot (40 runs per side) cannot estimate a 300 × 300 covariance, the
    learned direction is noise, and the audit saw nothing (ε ≥ 0). assert_dp passed, its power check (which assumes
    the pilot learns the right direction) satisfied. Now it fails naming the rank, and direction= as the fix."""

    def leaky(data, rng):
        out = rng.laplace(0.0, 0.5, 300)
        out[0] += float(data[0])
        return out

    args = (leaky, np.array([1.0]), np.array([0.0]))
    with pytest.raises(AssertionError, match=r"rank at most 78 < 300 .*at least 753 trials per side.*Pass direction="):
        assert_dp(*args, epsilon=1.0, delta=DELTA, trials=200)
    # given the coordinate, the same 200 trials refute the claim (the leak is caught) ...
    with pytest.raises(AssertionError, match=r"^mechanism is not \(1, 1e-05\)-DP"):
        assert_dp(*args, epsilon=1.0, delta=DELTA, trials=200, direction=np.eye(300)[0], require_power=True)
    # ... and pass the true claim, ε = 2, shown powerful against twice it (the check no longer stops them)
    fixed = assert_dp(*args, epsilon=2.0, delta=DELTA, trials=200, direction=np.eye(300)[0], require_power=True)
    assert fixed.details["output_size"] == 300 and fixed.details["pilot_trials"] == 0


def test_a_non_finite_vector_output_is_named_on_one_line():
    """A 50-value output with a nan in it: the error printed the whole array, wrapped over 9 lines of a CI log.
    Now one line: how many values, the first and where."""

    def sometimes_nan(data, rng):
        out = rng.normal(size=50)
        out[[7, 30]] = [np.inf, np.nan] if rng.random() < 0.2 else out[[7, 30]]
        return out

    with pytest.raises(InputError) as e:
        audit_mechanism(sometimes_nan, D, D_PRIME, epsilon=1.0, delta=DELTA, trials=100)
    (line,) = str(e.value).splitlines()
    assert "(2 of 50 values, first inf at index 7)" in line


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"epsilon": 0.0},
            r"epsilon = 0: the default alternative, 2 x epsilon, is 0 too; give alternative_epsilon > 0",
        ),
        ({"epsilon": float("inf")}, r"epsilon = inf claims no privacy, so no test can refute it"),
        ({"epsilon": 1.0, "alternative_epsilon": 0.5}, r"alternative_epsilon > epsilon = 1, got 0.5"),
        ({"epsilon": 1.0, "alternative_epsilon": 1.0}, r"alternative_epsilon > epsilon = 1, got 1$"),  # the boundary
        ({"epsilon": 1.0, "power": 1.5}, r"expected power in \(0, 1\), got 1.5"),  # out of range: refused
        ({"epsilon": -1.0}, r"^expected epsilon >= 0, got -1.0$"),  # (mutant: "alternative_epsilon > -1, got -2")
        ({"epsilon": float("nan")}, r"^expected epsilon to be a number, got NaN$"),
    ],
)
def test_claims_without_a_default_alternative_are_refused_before_the_mechanism_runs(kwargs, message):
    """assert_dp(..., epsilon=0) ran every trial and then said "expected alternative_epsilon > epsilon = 0, got 0"
    (the user gave no alternative_epsilon); epsilon=inf the same with "∞, got inf". Now one line naming what to
    pass, before the (possibly costly) trials."""
    calls = []

    def mechanism(data, rng):
        calls.append(1)
        return rng.laplace()

    with pytest.raises(InputError, match=message):
        assert_dp(mechanism, D, D_PRIME, delta=DELTA, trials=100, **kwargs)
    assert not calls
    if kwargs == {"epsilon": 0.0}:  # (once: the audits below do not depend on the case)
        # an ε = 0 claim with its alternative named is tested as any other
        res = assert_dp(mechanism, D, D_PRIME, epsilon=0.0, delta=DELTA, trials=400, alternative_epsilon=2.0)
        assert res.verdict == "consistent"
        # and, as the refusal says, with require_power=False (no alternative needed; mutant: refused all the same)
        res = assert_dp(mechanism, D, D_PRIME, epsilon=0.0, delta=DELTA, trials=400, require_power=False)
        assert res.verdict == "consistent"


def test_a_mechanism_that_reseeds_itself_is_named_deterministic_in_the_failure():
    """A mechanism drawing its noise after torch.manual_seed(0) / np.random.seed(0) returns the same output in
    every run: a formal violation (that function is deterministic), but the message said only "epsilon lower bound
    3.466 > claimed epsilon 1". Now its first line says the runs never differed and to draw from rng."""

    def reseeded(data, rng):
        return float(np.sum(data)) + np.random.default_rng(0).laplace(0.0, 1.0)  # ignores rng

    with pytest.raises(AssertionError) as e:
        assert_dp(reseeded, D, D_PRIME, epsilon=1.0, delta=DELTA, trials=300)
    first = str(e.value).splitlines()[0]
    assert first.startswith("mechanism is not (1, 1e-05)-DP") and "draw it from its rng argument" in first
    ok = audit_mechanism(laplace_sum(1.0), D, D_PRIME, epsilon=1.0, delta=DELTA, trials=100)
    assert ok.details["deterministic"] is False and not any("deterministic" in n for n in ok.notes)
    # deterministic on one side only (the neighbour's runs differ): not a mechanism whose runs never differ
    half = audit_mechanism(
        lambda d, r: float(np.sum(d)) if np.sum(d) == np.sum(D) else r.laplace(), D, D_PRIME, epsilon=1.0,
        delta=DELTA, trials=20,
    )  # fmt: skip
    assert half.details["deterministic"] is False


def test_a_mechanism_that_changes_its_input_in_place_is_refused():
    """``data += rng.laplace(...)`` then ``return data.sum()``: each call is 1-DP, but every run saw the data the
    previous run left, so the runs were dependent random walks and the audit read "violation" in 9 of 10 seeds (a
    false violation: its bound assumes independent trials). Now one line naming the input and the fix."""

    def mutating(data, rng):
        data += rng.laplace(0.0, 1.0, size=data.shape)
        return float(data.sum())

    with pytest.raises(InputError, match=r"changed its input data in place.*data = data.copy\(\)"):
        audit_mechanism(mutating, np.array([1.0, 0.0]), np.array([0.0, 0.0]), epsilon=1.0, delta=DELTA, trials=100)

    def appending(data, rng):  # a list grown on the neighbour side only
        if len(data) >= 3:
            data.append(0)
        return float(sum(data)) + rng.laplace()

    with pytest.raises(InputError, match="changed its input neighbour in place"):
        audit_mechanism(appending, [1, 0], [0, 0, 0], epsilon=1.0, delta=DELTA, trials=100)
    # inputs without values to compare (a dict) and unchanged arrays pass as before
    res = audit_mechanism(
        lambda d, r: d["x"] + r.laplace(), {"x": 1.0}, {"x": 0.0}, epsilon=1.0, delta=DELTA, trials=100
    )
    assert res.verdict in ("consistent", "inconclusive")
    # records of different lengths (a list of token lists): numpy refuses them as one array (ValueError), so there
    # is nothing to compare and they pass as before, not a traceback from the snapshot (mutant: the ValueError
    # not caught)
    res = audit_mechanism(
        lambda d, r: len(d) + r.laplace(), [[1.0, 2.0], [3.0]], [[1.0, 2.0]], epsilon=1.0, delta=DELTA, trials=100
    )
    assert res.verdict in ("consistent", "inconclusive")
    # a dataset holding nan (a missing value) left alone is unchanged: nan != nan must not read "changed in place"
    res = audit_mechanism(
        lambda d, r: d[0] + r.laplace(), np.array([1.0, np.nan]), np.array([0.0, np.nan]), epsilon=1.0, delta=DELTA,
        trials=100,
    )  # fmt: skip
    assert res.verdict in ("consistent", "inconclusive")


def test_the_pilot_rank_check_matches_the_rank_of_the_pilots_covariance():
    """:func:`_singular_pilot` calls the pilot singular exactly when its pooled covariance (each side's rows centred
    on their mean) has rank below the output's size: at rank equal to the size the pilot is full rank and must pass
    (the trials the message asks for must be enough). Oracle: numpy's rank of random pilots of that shape."""
    import re

    from dpaudit.testing import _n_pilot, _singular_pilot

    rng = np.random.default_rng(3)
    for trials in (20, 30, 60, 100):
        n = _n_pilot(trials)
        for size in range(2 * n - 4, 2 * n + 1):
            rows = [rng.normal(size=(n, size)) for _ in range(2)]
            rank = np.linalg.matrix_rank(np.vstack([r - r.mean(axis=0) for r in rows]))
            assert (_singular_pilot(trials, size) is None) == (rank == size), (trials, size, rank)
            # and the trials it asks for are the fewest that give a full-rank pilot
            if (why := _singular_pilot(trials, size)) is not None:
                least = int(re.search(r"at least (\d+) trials per side", why).group(1))
                assert _singular_pilot(least, size) is None and _singular_pilot(least - 1, size) is not None


def test_a_failure_names_an_estimate_as_an_estimate_and_a_formal_bound_as_formal():
    """assert_dp's first line says which it is: "(estimate, gdp, ..." for the gdp method (an estimate is never
    shown as a formal bound) and "(formal lower bound, clopper-pearson, ..." for the formal one. The existing
    failure tests matched only the numbers, so the label swapped survived them. An estimate's message began
    "mechanism is not (0.5, 1e-05)-DP", a formal verdict's words; it now says it is estimated."""
    kw = {"epsilon": 0.5, "delta": DELTA, "trials": 200, "require_power": False, "direction": "greater"}
    for method, kind, what in (
        ("gdp", "estimate", "is estimated not to be"),
        ("clopper-pearson", "formal lower bound", "is not"),
    ):
        with pytest.raises(AssertionError) as e:
            assert_dp(laplace_sum(0.1), D, D_PRIME, method=method, **kw)
        first = str(e.value).splitlines()[0]
        # an estimate's first words never state a refutation ("mechanism is not ...-DP" read as formal)
        assert first.startswith(f"mechanism {what} (0.5, 1e-05)-DP: epsilon lower bound "), first
        assert f"> claimed epsilon 0.5 ({kind}, {method}, confidence 0.95)" in first, first
