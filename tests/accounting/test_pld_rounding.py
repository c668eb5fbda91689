"""The PLD's bound on the rounding of its FFT convolutions (``pld_pairs._fft_power``, ``_convolve``) against
exact integer arithmetic, and the charge of that bound to delta (``DiscretePLD.rounding_charge``, ``epsilon``).

Inputs are dyadic (k / 2^bits), so every convolution has an exact rational value: Python integers, no
dpaudit code in the oracle. The bound must hold in the float64-only configuration too (``_LONG`` swapped
for float64, as on platforms whose long double is double), where the count-fold amplification of the
forward transform's error is the largest term: that is the case that checks the bound's factor count.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from dpaudit.accounting import pld_pairs as pp
from dpaudit.accounting.pld_pairs import DiscretePLD

# ---------------------------------------------------------------------------------------------
# Exact oracles (Python integers)
# ---------------------------------------------------------------------------------------------


def _cyclic(x: list[int], y: list[int], length: int) -> list[int]:
    out = [0] * length
    for i, a in enumerate(x):
        if a:
            for j, b in enumerate(y):
                if b:
                    out[(i + j) % length] += a * b
    return out


def exact_cyclic_power(ints: list[int], count: int) -> list[int]:
    """ints^(*count), cyclic of length len(ints), by repeated squaring in exact integers."""
    length = len(ints)
    result, base = None, list(ints)
    while count:
        if count & 1:
            result = list(base) if result is None else _cyclic(result, base, length)
        count >>= 1
        if count:
            base = _cyclic(base, base, length)
    assert result is not None
    return result


def exact_linear(x: list[int], y: list[int]) -> list[int]:
    return _cyclic(x + [0] * (len(y) - 1), y + [0] * (len(x) - 1), len(x) + len(y) - 1)


def l2_error(computed: np.ndarray, exact_ints: list[int], scale_bits: int) -> float:
    """||computed - exact / 2^scale_bits||_2 with the difference taken exactly."""
    den = 2**scale_bits
    sq = sum((Fraction(float(c)) - Fraction(e, den)) ** 2 for c, e in zip(computed, exact_ints, strict=True))
    return math.sqrt(float(sq))


def dyadic_pmf(rng: np.random.Generator, size: int, bits: int, smooth: bool) -> tuple[list[int], np.ndarray]:
    """A PMF-like non-negative vector of k / 2^bits: a discretised bump (smooth) or random with zeros."""
    if smooth:
        t = np.arange(size)
        shape = np.exp(-0.5 * ((t - size / 3) / (size / 12)) ** 2) + 0.02 * rng.random(size)
    else:
        shape = rng.random(size) * (rng.random(size) < 0.7)
    ints = np.floor(shape / shape.sum() * 2**bits).astype(np.int64)
    return [int(k) for k in ints], ints / 2.0**bits


@pytest.fixture(params=["long double", "float64 only"])
def precision(request, monkeypatch):
    if request.param == "float64 only":
        monkeypatch.setattr(pp, "_LONG", np.float64)
        monkeypatch.setattr(pp, "_U_LONG", 2.0**-53)
    return request.param


# ---------------------------------------------------------------------------------------------
# The error bounds themselves
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "count", "smooth"), [(96, 2, False), (120, 7, True), (128, 40, True)])
@pytest.mark.parametrize("long_inverse", [False, True])
def test_fft_power_error_bound_holds_against_exact_integers(precision, size, count, smooth, long_inverse):
    rng = np.random.default_rng(size * 1000 + count)
    bits = 12
    ints, x = dyadic_pmf(rng, size, bits, smooth)
    out, bound = pp._fft_power(x, count, long_inverse)
    err = l2_error(out, exact_cyclic_power(ints, count), bits * count)
    assert err <= bound
    # The bound is a worst case with a safety factor (pld_pairs.FFT_LEVEL_ERROR), not an estimate: measured
    # 3x to 1e4x the actual error here; much looser would cost tightness at small delta.
    assert bound <= 1e5 * max(err, 1e-19)


def test_fft_power_bound_covers_the_worst_forward_error_its_model_allows(monkeypatch):
    # The bound assumes only ||fl(F x) - F x||_2 <= eta ||F x||_2 (pld_pairs._fft_error). Put an error of that
    # size on the forward transform where it hurts most (bin 1 of a nearly concentrated PMF, |S_1| ~ 1): the
    # power amplifies it count times. float64 only, so this term dominates the bound: a bound that charged the
    # input's norm but not the count of compositions (a wrong norm) fails here.
    from scipy import fft as sp_fft

    monkeypatch.setattr(pp, "_LONG", np.float64)
    monkeypatch.setattr(pp, "_U_LONG", 2.0**-53)
    length, count = 128, 40

    class WorstFft:
        irfft = staticmethod(sp_fft.irfft)
        next_fast_len = staticmethod(sp_fft.next_fast_len)

        @staticmethod
        def rfft(x, n=None):
            y = sp_fft.rfft(x, n=n)
            size = n or x.size
            y[1] += 0.99 * pp._fft_error(size, 2.0**-53) * pp._full_norm(y, size) / math.sqrt(2) * y[1] / abs(y[1])
            return y

    monkeypatch.setattr(pp, "sp_fft", WorstFft)
    ints = [1000, 24] + [0] * (length - 2)  # mass 1000/1024 at loss 0, 24/1024 one bin up
    x = np.array(ints) / 1024.0
    out, bound = pp._fft_power(x, count, False)
    err = l2_error(out, exact_cyclic_power(ints, count), 10 * count)
    assert err <= bound
    assert err > 0.1 * bound  # the worst case is nearly reached: the bound is not loose by the count


@pytest.mark.parametrize("long_inverse", [False, True])
def test_bounds_cover_the_worst_inverse_error_their_model_allows(monkeypatch, long_inverse):
    # The inverse transform's own error, at the full size the model allows (eta ||y||_2, spread over every
    # bin: the far tail included), must be covered by both bounds; the measured errors are ~40x smaller, so
    # only such a planted worst case tells whether the inverse term is in the bound at all.
    from scipy import fft as sp_fft

    class WorstInverse:
        rfft = staticmethod(sp_fft.rfft)
        next_fast_len = staticmethod(sp_fft.next_fast_len)

        @staticmethod
        def irfft(spec, n):
            y = sp_fft.irfft(spec, n=n)
            unit = 2.0**-53 if spec.dtype == np.complex128 else pp._U_LONG
            size = 0.99 * pp._fft_error(n, unit) * float(np.linalg.norm(y.astype(np.float64)))
            return y + size / math.sqrt(n)

    monkeypatch.setattr(pp, "sp_fft", WorstInverse)
    rng = np.random.default_rng(21)
    ints, x = dyadic_pmf(rng, 120, 12, smooth=True)
    out, bound = pp._fft_power(x, 7, long_inverse)
    assert l2_error(out, exact_cyclic_power(ints, 7), 12 * 7) <= bound
    ia, a = dyadic_pmf(rng, 100, 20, smooth=True)
    ib, b = dyadic_pmf(rng, 90, 20, smooth=True)
    conv, bound = pp._convolve(a, b, long_inverse)
    assert l2_error(conv, exact_linear(ia, ib), 40) <= bound


@pytest.mark.parametrize(("size_a", "size_b"), [(70, 90), (200, 65), (40, 33), (300, 300)])
@pytest.mark.parametrize("long_inverse", [False, True])
def test_convolve_error_bound_holds_against_exact_integers(precision, size_a, size_b, long_inverse):
    rng = np.random.default_rng(size_a * 7 + size_b)
    ia, a = dyadic_pmf(rng, size_a, 20, smooth=bool(size_a % 2))
    ib, b = dyadic_pmf(rng, size_b, 20, smooth=False)
    conv, bound = pp._convolve(a, b, long_inverse)
    err = l2_error(conv, exact_linear(ia, ib), 40)
    assert err <= bound
    assert bound <= 1e5 * max(err, 1e-19)


def test_fft_level_error_has_a_wide_margin_over_measured_errors():
    # FFT_LEVEL_ERROR (10 u per level of log2 L) against float64 transforms checked in long double, on lengths
    # 2^a 3^b 5^c that next_fast_len returns: the measured worst is ~0.3 u per level.
    from scipy import fft as sp_fft

    rng = np.random.default_rng(11)
    worst = 0.0
    for length in (96, 243, 1000, 3125, 4096, 15625, 46656):
        x = rng.random(length) ** 8
        exact = sp_fft.rfft(x.astype(np.longdouble))
        err = pp._full_norm(sp_fft.rfft(x) - exact, length) / pp._full_norm(exact, length)
        worst = max(worst, err / (math.ceil(math.log2(length)) * 2.0**-53))
    assert worst * 10 < pp.FFT_LEVEL_ERROR


# ---------------------------------------------------------------------------------------------
# The charge to delta
# ---------------------------------------------------------------------------------------------


def _charged_example() -> tuple[DiscretePLD, DiscretePLD]:
    rng = np.random.default_rng(5)
    probs = rng.random(400)
    probs /= probs.sum()
    # The rounding span reaches past the kept PMF on both sides (as after a truncation).
    charged = DiscretePLD(0.01, -100, probs, 1e-9, rounding=1e-7, rounding_span=(-180, 450))
    return charged, DiscretePLD(0.01, -100, probs, 1e-9)


@pytest.mark.parametrize("eps", [0.0, 0.137, 1.0, 2.9951, 3.5, 4.49, 4.6])
def test_rounding_charge_is_cauchy_schwarz_over_every_bin_above_eps(eps):
    charged, plain = _charged_example()
    with mpmath.workdps(30):
        w2 = mpmath.fsum(
            (1 - mpmath.exp(mpmath.mpf(eps) - mpmath.mpf(j) * mpmath.mpf("0.01"))) ** 2
            for j in range(-180, 451)
            if j * 0.01 > eps
        )
        expected = float(mpmath.mpf("1e-7") * mpmath.sqrt(w2))
    assert charged.delta(eps) - plain.delta(eps) == pytest.approx(expected, rel=1e-9, abs=1e-22)
    assert charged.rounding_charge(eps) >= expected


def test_epsilon_meets_the_charged_delta_and_is_minimal():
    charged, plain = _charged_example()
    for delta in (1e-3, 1e-5, 3e-7):
        eps = charged.epsilon(delta)
        assert charged.delta(eps) <= delta
        assert charged.delta(eps * (1 - 1e-9)) > delta  # the smallest such eps, to the search's resolution
        assert eps > plain.epsilon(delta) * (1 + 1e-6)  # the charge is material here (2.8e-5 to 0.8 nats)


def test_rounding_propagates_through_compose_and_truncation():
    a = DiscretePLD(1e-3, -50, np.full(300, 1 / 300), 0.0, rounding=1e-12, rounding_span=(-60, 260))
    b = DiscretePLD(1e-3, 10, np.full(200, 1 / 200), 1e-10, rounding=2e-12, rounding_span=(5, 215))
    c = a.compose(b, tail=1e-3)  # a large tail: truncation moves mass, the rounding span is kept whole
    # Young's inequality: ||e_a * b||_2 <= ||e_a||_2 |b|_1 and so on; at least the propagated parts.
    assert c.rounding >= 1e-12 * 1.0 + 1.0 * 2e-12
    # The span holds every product of the two spans and the two PMFs, e_a * e_b included.
    assert c.rounding_span[0] <= min(-60 + 10, -50 + 5, -60 + 5)
    assert c.rounding_span[1] >= max(260 + 209, 249 + 215, 260 + 215)
    assert c.offset > c.rounding_span[0] and c.top < c.rounding_span[1]


# ---------------------------------------------------------------------------------------------
# End to end: the charged delta curve against the exact composition
# ---------------------------------------------------------------------------------------------


def test_self_composed_delta_is_above_the_exact_composition_in_the_far_tail():
    # A 64-bin dyadic PMF composed 8 times, tails truncated at 1e-40 (so the window holds the far tail where
    # the true mass is far below the FFT's rounding). The exact 8-fold PMF is computed in integers.
    rng = np.random.default_rng(8)
    bits = 30
    ints, x = dyadic_pmf(rng, 100, bits, smooth=True)
    interval, offset = 0.05, -20
    one = DiscretePLD(interval, offset, x, 0.0)
    ours = one.self_compose(8, tail=1e-40)
    exact = exact_cyclic_power(ints + [0] * 700, 8)[: 8 * 99 + 1]
    den = mpmath.mpf(2) ** (bits * 8)
    losses = [(8 * offset + j) * interval for j in range(len(exact))]

    def exact_delta(eps: float) -> mpmath.mpf:
        with mpmath.workdps(40):
            return mpmath.fsum(
                mpmath.mpf(e) / den * (1 - mpmath.exp(mpmath.mpf(eps) - lv))
                for e, lv in zip(exact, losses, strict=True)
                if lv > eps
            )

    plain = DiscretePLD(ours.interval, ours.offset, ours.probs, ours.inf_mass)
    below_without_charge = 0
    for eps in np.linspace(5.0, losses[-1] - 0.5, 25):
        truth = exact_delta(float(eps))
        assert ours.delta(float(eps)) >= truth
        below_without_charge += plain.delta(float(eps)) < truth
    assert below_without_charge > 0  # the case exercises the far-tail under-report the charge removes


# ---- many epsilons at once (the f-DP audits' curves) ---------------------------------------------------------


def _stress_pld(rounding: float) -> DiscretePLD:
    rng = np.random.default_rng(3)
    probs = rng.random(700) ** 6 * 1e-3  # uneven mass, bins near zero too
    return DiscretePLD(1e-3, -50, probs, 1e-13, rounding, (-80, 900))


def _eps_probe(d: DiscretePLD) -> np.ndarray:
    grid = d.losses
    return np.concatenate([[0.0], grid[grid >= 0][::37], grid[grid >= 0][::41] + 0.37 * d.interval,
                           np.linspace(0.0, 1.2, 50), [0.9 * d.interval, 0.95, 5.0]])  # fmt: skip


def _exact_delta(d: DiscretePLD, eps: float) -> tuple[mpmath.mpf, mpmath.mpf]:
    """(delta without the charge, the charge) of ``d`` at eps in 50-digit arithmetic on its float64 entries."""
    with mpmath.workdps(50):
        e = mpmath.mpf(eps)
        main = mpmath.fsum(
            mpmath.mpf(float(p)) * -mpmath.expm1(e - (d.offset + i) * mpmath.mpf(d.interval))
            for i, p in enumerate(d.probs)
            if (d.offset + i) * mpmath.mpf(d.interval) > e
        )
        lo, hi = d.rounding_span
        w2 = mpmath.fsum(
            mpmath.expm1(e - j * mpmath.mpf(d.interval)) ** 2
            for j in range(lo, hi + 1)
            if j * mpmath.mpf(d.interval) > e
        )
        return main + mpmath.mpf(d.inf_mass), mpmath.mpf(d.rounding) * mpmath.sqrt(w2)


@pytest.mark.parametrize("rounding", [0.0, 1e-12, 1e-9])
def test_deltas_bound_the_exact_delta_and_stay_tight(rounding):
    """DiscretePLD.deltas (suffix sums + closed-form charge, each with its rounding bound added) is >= the exact
    (50-digit) delta and charge of the PMF at every eps probed (on, between, below and above the bins and the
    charge's span) and within 1e-6 of them, as the term-by-term delta is. Planted: the charge dropped, the factor
    e^(eps - l_k) dropped, the bin one low kept in the charge, the suffix sums' error term dropped -> fails."""
    d = _stress_pld(rounding)
    eps = _eps_probe(d)[::3]
    got, charges = d.deltas(eps), d._charges(eps)
    for e, g, c in zip(eps, got, charges, strict=True):
        main, charge = _exact_delta(d, float(e))
        assert charge <= c <= charge * (1 + 1e-6) + 1e-300, (e, c, charge)
        assert main + charge <= g <= (main + charge) * (1 + 1e-6), (e, g, main + charge)
        assert g <= d.delta(float(e)) * (1 + 1e-6)


def test_accountant_deltas_equal_its_delta_on_dpsgd_ledgers():
    """PldAccountant.deltas over a 64-point curve grid down to delta 1e-12 (both precisions, both directions) is
    never below delta and within 1e-6 of it; a heterogeneous ledger (compose) the same."""
    from dpaudit.accounting import dpsgd_event, make_accountant
    from dpaudit.events import Gaussian

    for acc in (
        make_accountant("pld").compose(dpsgd_event(noise_multiplier=1.0, sample_rate=0.0356, steps=28)),
        make_accountant("pld")
        .compose(dpsgd_event(noise_multiplier=0.8, sample_rate=0.01, steps=100))
        .compose(Gaussian(noise_multiplier=4.0), 3),
    ):
        grid = np.linspace(0.0, 1.2 * acc.epsilon(1e-12), 64)
        ref = np.array([acc.delta(float(e)) for e in grid])
        got = acc.deltas(grid)
        assert np.all(got >= ref) and np.all(got <= ref * (1.0 + 1e-6) + 1e-300)
        assert ref.min() < 1e-12  # the long-double pass was exercised


# Small coarse PLDs where one bin or one index decides: no finite bins (all mass at +inf), one bin, a span of one
# index, eps below the span, between the two top bins, on and above the top bin, and a total above 1 (the clamp).
_EDGE_PLDS = {
    "no finite bins": DiscretePLD(0.5, 3, np.zeros(0), 0.2, 1e-3, (2, 9)),
    "all at +inf": DiscretePLD(0.5, 3, np.zeros(0), 0.95, 0.1, (2, 9)),
    "one bin": DiscretePLD(0.5, 3, np.array([0.7]), 0.01),
    "one bin, one-index span": DiscretePLD(0.5, 3, np.array([0.7]), 0.0, 1e-3, (3, 3)),
    "two bins": DiscretePLD(0.5, 1, np.array([0.3, 0.6]), 0.0),
    "two bins, span above eps": DiscretePLD(0.5, 4, np.array([0.3, 0.6]), 0.0, 1e-2, (4, 6)),
    "total above 1": DiscretePLD(0.5, 4, np.array([0.5]), 0.9),
}


@pytest.mark.parametrize("name", sorted(_EDGE_PLDS))
def test_deltas_on_edge_case_plds_equal_the_exact_delta(name):
    """DiscretePLD.deltas and _charges on the edge cases above, against the 50-digit delta and charge: never below,
    above by at most rel 1e-9 plus rounding * 1e-6 (the charge adds its own rounding bound, <= 1e-13 here, under
    the square root), exactly 0 where nothing lies above eps (no bin, no +inf mass, no charge), and exactly 1 where
    the exact value is >= 1 (delta is a probability). Planted: the empty-PMF branch taken for one
    bin, its charge dropped or its clamp removed; the clamp removed; the main sum read at eps >= the top bin; the
    charge's span of one index skipped, its last bin (c = 1) skipped, its start not clamped to the span (eps below
    it), the subtracted bin one low as e^x0 - 1 -> fails."""
    d = _EDGE_PLDS[name]
    eps = np.array([0.0, 0.3, 0.5, 0.75, 0.9, 1.0, 1.6, 1.75, 2.0, 2.1, 2.5, 3.0, 4.4, 5.0])
    got, charges = d.deltas(eps), d._charges(eps)
    for e, g, c in zip(eps, got, charges, strict=True):
        main, charge = _exact_delta(d, float(e))
        assert charge <= c <= charge * (1 + 1e-9) + d.rounding * 1e-6, (e, c, charge)
        exact = min(main + charge, mpmath.mpf(1))
        assert exact <= g <= exact * (1 + 1e-9) + d.rounding * 1e-6, (e, g, exact)
        if exact == 0 and d.rounding == 0:
            assert g == 0.0, (e, g)
        if exact == 1:
            assert g == 1.0, (e, g)


def test_accountant_deltas_take_the_larger_direction(monkeypatch):
    """Every supported subsampled ledger's remove direction dominates its add direction, so a deltas that read the
    remove direction only would pass the ledger tests above: with the two directions swapped (as for a mechanism
    whose add direction dominates) deltas still equals delta at every eps; a symmetric ledger (no add direction)
    too. Planted: the add direction dropped; the symmetric case read as asymmetric -> fails."""
    from dpaudit.accounting import dpsgd_event, make_accountant
    from dpaudit.events import Gaussian

    swapped = make_accountant("pld").compose(dpsgd_event(noise_multiplier=1.0, sample_rate=0.5, steps=10))
    composed = swapped._composed
    monkeypatch.setattr(swapped, "_composed", lambda *args: composed(*args)[::-1])
    for acc in (swapped, make_accountant("pld").compose(Gaussian(noise_multiplier=2.0), 3)):
        grid = np.linspace(0.0, 1.2 * acc.epsilon(1e-9), 16)
        ref = np.array([acc.delta(float(e)) for e in grid])
        got = acc.deltas(grid)
        assert np.all(got >= ref) and np.all(got <= ref * (1.0 + 1e-6) + 1e-300), (got, ref)


def test_accountant_deltas_refuse_a_nan(monkeypatch):
    """A NaN delta is a bug, never a result (it compares False with every bound, so an f-DP audit would read its
    curve as never refuted): deltas raises, at one NaN among finite values too. Planted: the check removed, or
    made to fire only when every value is NaN -> fails."""
    from dpaudit.accounting import make_accountant
    from dpaudit.events import Gaussian

    acc = make_accountant("pld").compose(Gaussian(noise_multiplier=2.0), 3)
    real = DiscretePLD.deltas
    monkeypatch.setattr(DiscretePLD, "deltas", lambda self, eps: np.where(eps == 1.0, np.nan, real(self, eps)))
    with pytest.raises(RuntimeError, match="NaN delta"):
        acc.deltas(np.array([0.5, 1.0, 2.0]))
