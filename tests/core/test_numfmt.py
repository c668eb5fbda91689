"""dpaudit.numfmt: every ε a user reads is rounded in the safe direction, exactly.

Oracles: the exact binary value of each float (``Decimal(x)``) rounded with ROUND_CEILING / ROUND_FLOOR at the
significant digit; Python's ``format(x, ".{d}g")`` for the spelling of short decimals. Planted mistakes each test
catches are named in its docstring.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Context, Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit import numfmt
from dpaudit.numfmt import lower, nearest, ordered, upper

finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)
positive = st.floats(allow_nan=False, allow_infinity=False, min_value=1e-300, max_value=1e300)
digits = st.integers(1, numfmt.MAX_DIGITS)


def _short(x: float, d: int) -> bool:
    """Whether x's shortest round-trip decimal has at most d significant digits (the module's stated exception)."""
    return len(Decimal(repr(x)).normalize().as_tuple().digits) <= d


def _oracle(x: float, d: int, rounding: str) -> Decimal:
    if _short(x, d):
        return Decimal(repr(x))
    return Context(prec=d, rounding=rounding).plus(Decimal(x))


@pytest.mark.parametrize(
    ("x", "d", "up", "down"),
    [
        (7.999954, 6, "7.99996", "7.99995"),  # the accounted ε of the brief: never 7.99995 as a claim
        (4.8151, 3, "4.82", "4.81"),  # a lower bound: never 4.82, which nothing showed
        (8.0, 6, "8", "8"),
        (0.1, 6, "0.1", "0.1"),  # the float nearest 0.1 is the user's 0.1, not 0.100001
        (1e-05, 6, "1e-05", "1e-05"),
        (1.0000000000000002, 6, "1.00001", "1"),  # one ulp above 1 is above 1
        (math.nextafter(1.0, 0.0), 6, "1", "0.999999"),
        (6.9920100000000005, 6, "6.99202", "6.99201"),  # float ceil(x * 1e5) / 1e5 gives 6.99201 < x
        (0.015399999999999999, 3, "0.0154", "0.0153"),  # float floor(x * 1e4) / 1e4 gives 0.0154 > x
        (9.999996, 6, "10", "9.99999"),  # rounding up past a power of ten
        (27070.3, 4, "2.708e+04", "2.707e+04"),  # spelled as format(x, ".4g") spells it
        (-0.123456789, 3, "-0.123", "-0.124"),
    ],
)
def test_directed_rounding_table(x, d, up, down):
    """Planted: rounding to nearest (7.999954 → 7.99995), directions swapped, or float arithmetic
    ``math.ceil(x * 10**k) / 10**k`` (6.9920100000000005 → 6.99201 < x) each fails a row."""
    assert upper(x, d) == up and lower(x, d) == down


def test_specials():
    for f in (upper, lower, nearest):
        assert f(None) == "—" and f(None, missing="?") == "?"
        assert f(math.inf) == "∞" and f(-math.inf) == "−∞" and f(math.nan) == "nan"
        assert f(0.0) == "0" and f(-0.0) == "0" and f(0) == "0"
        assert f("inf") == "∞"  # the report spells infinity "inf"
    with pytest.raises(ValueError, match="digits"):
        upper(1.0, 0)


@settings(max_examples=400, deadline=None)
@given(finite, digits)
def test_upper_is_at_least_x_and_lower_at_most_x_exactly(x, d):
    """As exact decimals: upper(x) ≥ x ≥ lower(x), each the directed rounding of x's exact binary value (or x's
    own short decimal, which reads back as x). Planted: float arithmetic or a swapped direction fails here."""
    up, down = Decimal(upper(x, d)), Decimal(lower(x, d))
    assert up == _oracle(x, d, ROUND_CEILING) and down == _oracle(x, d, ROUND_FLOOR)
    if _short(x, d):
        assert float(upper(x, d)) == x == float(lower(x, d))
    else:
        assert down < Decimal(x) < up
    assert len(up.normalize().as_tuple().digits) <= d and len(down.normalize().as_tuple().digits) <= d


@settings(max_examples=300, deadline=None)
@given(finite, st.integers(1, 15))
def test_nearest_is_round_half_even_of_the_exact_value(x, d):
    assert Decimal(nearest(x, d)) == _oracle(x, d, ROUND_HALF_EVEN)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 999_999), st.integers(-12, 12))
def test_short_decimals_are_shown_as_themselves(mantissa, exponent):
    """A decimal of at most 6 significant digits reads back as itself in both directions (a claim of 0.3 prints
    0.3), spelled as ``:g`` spells it, and printing is idempotent."""
    x = float(Decimal(mantissa).scaleb(exponent))
    assert upper(x) == lower(x, 6) == format(x, "g")
    for d in (3, 6, 10):
        assert upper(float(upper(x, d)), d) == upper(x, d) and lower(float(lower(x, d)), d) == lower(x, d)


@settings(max_examples=300, deadline=None)
@given(finite, finite, digits)
def test_monotone(x, y, d):
    x, y = min(x, y), max(x, y)
    assert Decimal(upper(x, d)) <= Decimal(upper(y, d)) and Decimal(lower(x, d)) <= Decimal(lower(y, d))


def _order(a, b) -> int:
    return (a > b) - (a < b)


def _neighbours():
    """Pairs as close as float64 allows, or agreeing to 6 digits: where rounding alone prints them equal."""
    base = st.sampled_from([8.0, 7.999954, 0.1, 1.0, 4.8151, 1e-5, 123456.7])
    return st.tuples(base, st.integers(-3, 3)).map(lambda t: (t[0], _step(t[0], t[1])))


def _step(x: float, n: int) -> float:
    for _ in range(abs(n)):
        x = math.nextafter(x, math.inf if n > 0 else -math.inf)
    return x


@settings(max_examples=300, deadline=None)
@given(st.one_of(_neighbours(), st.tuples(positive, positive)), st.booleans(), st.integers(1, 6))
def test_ordered_prints_the_order_computed(pair, left_up, left_digits):
    """The printed pair compares as the numbers do (equal numbers may print left below right), each still rounded
    in its own direction. Planted: plain lower()/upper() without the digit search prints 8 > 8 for
    nextafter(8) > 8, and fails here."""
    a, b = pair
    sa, sb = ordered(a, b, left_digits=left_digits, left_up=left_up)
    shown = _order(Decimal(sa), Decimal(sb))
    assert shown == _order(a, b) or (a == b and shown < 0), (a, b, sa, sb)
    assert (Decimal(sa) >= Decimal(a) if left_up else Decimal(sa) <= Decimal(a)) or float(sa) == a
    assert Decimal(sb) >= Decimal(b) or float(sb) == b


@settings(max_examples=150, deadline=None)
@given(_neighbours(), st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=1, max_size=4))
def test_against_prints_every_bound_in_order_with_one_claim(pair, steps):
    """:func:`numfmt.against`: several bounds beside ONE printed claim, each compares with it as computed (an equal
    bound may print below it), each rounded in its own direction. Planted: each bound ordered with the claim on
    its own (the claim printed at the first pair's digits) prints "claimed 2" beside an estimate 1.999996 above
    1.9999954."""
    claim = pair[1]
    xs = [(_step(pair[0], n), up) for n, up in steps]
    c, lows, ups = numfmt.against(claim, [x for x, up in xs if not up], [x for x, up in xs if up])
    assert Decimal(c) >= Decimal(claim) or float(c) == claim
    for (x, up), text in zip([p for p in xs if not p[1]] + [p for p in xs if p[1]], lows + ups, strict=True):
        shown = _order(Decimal(text), Decimal(c))
        assert shown == _order(x, claim) or (x == claim and shown < 0), (x, claim, text, c)
        assert (Decimal(text) >= Decimal(x) if up else Decimal(text) <= Decimal(x)) or float(text) == x
    assert numfmt.against(1.9999954, [0.5, 1.999996]) == ("1.9999954", ["0.5", "1.999996"], [])
    assert numfmt.against(None, [4.8151], [7.999954]) == ("—", ["4.81"], ["8"])  # no claim: each on its own
    # An infinite claim, and missing or non-finite bounds, compare with nothing: each printed on its own, rounded in
    # its direction at the given digits (planted: a claim of ∞ compared as a number raised decimal.InvalidOperation).
    assert numfmt.against(math.inf, [1.2345], [2.5]) == ("∞", ["1.23"], ["2.5"])
    # Each bound at the fewest digits (from 3) that compare right, not more: below, above, and equal to the claim.
    assert numfmt.against(2.0, [1.23456789], [2.3456789]) == ("2", ["1.23"], ["2.35"])
    assert numfmt.against(2.123456789, [2.123456789]) == ("2.12346", ["2.12"], [])
    assert numfmt.against(2.0, [None, math.inf, 1.99999], [None, math.nan, 2.00001]) == (
        "2",
        ["—", "∞", "1.99"],
        ["—", "nan", "2.01"],
    )


def test_ordered_examples():
    """The brief's example, and a line that keeps its digits when rounding already shows the order."""
    assert ordered(8.00001, 8.0) == ("8.00001", "8")
    assert ordered(math.nextafter(8.0, 9.0), 8.0) == ("8.000000000000002", "8")
    assert ordered(4.8151, 8.0) == ("4.81", "8")
    assert ordered(7.999954, 7.999954, left_up=True) == ("7.999954", "7.999954")  # not "8 ≤ 7.99996"
    assert ordered(math.inf, 8.0) == ("∞", "8")


# δ = 1/70000 = 1.4285714285714285e-05: ":g" prints 1.42857e-05, below the δ given; rounded up (1.42858e-05) it is
# above it, which is wrong for a refutation ("not (ε, δ)-DP" holds at every smaller δ, not at a larger one); rounded
# down, wrong for a claim. A δ is an input: printed as given (numfmt.exact), it is never another δ.
ODD_DELTA, ODD_DELTA_UP = 1 / 70000, 1 / 60000


def test_a_delta_is_printed_as_given_never_rounded_to_another_value():
    """Planted mistakes caught: δ printed with ":g" or rounded (up or down) at 6 digits in `account`, an audit's
    summary, the one-run f-DP note, the calibration refusals; δ = 0.09999999 printed as 0.1."""
    import numpy as np

    from dpaudit.accounting import calibrate_noise_multiplier, dpsgd_event
    from dpaudit.audit import audit_scores
    from dpaudit.audit.fdp_one_run import epsilon_delta_family
    from dpaudit.errors import InputError
    from dpaudit.numfmt import exact
    from tests.core.cli_errors import invoke

    odd, odd_up = repr(ODD_DELTA), repr(ODD_DELTA_UP)
    assert exact(ODD_DELTA) == odd == "1.4285714285714285e-05" and exact(1e-5) == "1e-05"
    assert exact(0.09999999) == "0.09999999" and exact(1e-4) == "0.0001" and exact(None) == "—"
    schedule = ["--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10"]
    for accountant in ("rdp", "all"):
        r = invoke("account", "dpsgd", *schedule, "--delta", odd, "--accountant", accountant)
        assert r.exit_code == 0 and f"delta = {odd}," in r.stdout, r.stdout
    r = invoke("account", "dpsgd", *schedule, "--delta", "0.09999999", "--accountant", "rdp")
    assert r.exit_code == 0 and "delta = 0.09999999," in r.stdout, r.stdout  # not "delta = 0.1"
    r = invoke("account", "dpsgd", *schedule, "--delta", "1e-5", "--accountant", "rdp")
    assert "delta = 1e-05," in r.stdout, r.stdout  # what the user typed prints as typed
    scores, member = np.arange(40.0), np.arange(40) % 2 == 0
    claimed = audit_scores(scores, member, claimed_epsilon=1.0, delta=ODD_DELTA).summary()
    assert f"delta {odd})" in claimed, claimed  # the claim's δ
    bound = audit_scores(scores, member, delta=ODD_DELTA_UP).summary()
    assert f"delta {odd_up})" in bound, bound
    assert f"delta = {odd_up})-DP curves refuted" in epsilon_delta_family(ODD_DELTA_UP).note
    with pytest.raises(InputError, match=f"at delta {odd.replace('.', '[.]')} "):
        calibrate_noise_multiplier(
            target_epsilon=1e-3,
            delta=ODD_DELTA,
            make_event=lambda s: dpsgd_event(noise_multiplier=s, sample_rate=1.0, steps=1000),
            max_noise_multiplier=2,
        )


def test_a_p_value_that_underflowed_is_never_printed_as_zero():
    """A p-value computed as 0 underflowed float64 (no test's evidence is infinite): "p < 1e-300", never "p = 0";
    others are estimates rounded to nearest."""
    assert numfmt.p_value(0.0) == "p < 1e-300"
    assert numfmt.p_value(0.0, name="") == "< 1e-300"
    assert numfmt.p_value(0.031249) == "p = 0.0312" and numfmt.p_value(0.031249, name="") == "0.0312"
    assert numfmt.p_value(3.21e-200, 2) == "p = 3.2e-200"  # digits=2 (3 would print 3.21e-200)
    assert numfmt.p_value(None) == numfmt.DASH


def test_the_inverted_scores_note_shows_an_underflowed_p_value_as_a_bound():
    """Wire: 3000 members scored perfectly below 3000 non-members (losses given as scores) give a Mann–Whitney p
    that underflows to 0; the note says p < 1e-300 (it said "p = 0")."""
    import numpy as np

    from dpaudit.workflows.scores import ScoreFile, _inverted_note

    n = 3000
    note = _inverted_note(ScoreFile(None, np.r_[np.ones(n), np.zeros(n)], np.arange(2 * n, dtype=float)))
    assert "Mann–Whitney p < 1e-300)" in note and "p = 0" not in note


@pytest.mark.parametrize("x", [0.123456, 0.57, 0.9999999, 1e-7, 2 / 3, 0.5, 1.0, 3.0000001e-3, 0.1 + 0.2])
@pytest.mark.parametrize("d", [1, 4, 6])
def test_percentages_are_the_short_decimal_times_100_rounded_outward(x, d):
    """percent_down / percent_up (a rate's confidence interval in the report: [down(lo), up(hi)]) against the exact
    oracle: the fraction's shortest decimal times 100, exactly, rounded by Decimal with ROUND_FLOOR / ROUND_CEILING at
    ``d`` significant digits, in fixed notation (percent_nearest: ROUND_HALF_EVEN). A printed interval then contains
    the computed one. Planted: up rounding down (percent_up's interval end read 12.34% for 0.123456), any of the
    three returning the missing-value dash."""
    exact = Decimal(repr(x)).scaleb(2)
    for f, rounding in (
        (numfmt.percent_down, ROUND_FLOOR),
        (numfmt.percent_up, ROUND_CEILING),
        (numfmt.percent_nearest, ROUND_HALF_EVEN),  # a descriptive share: nearest, ties to even
    ):
        text = f(x, d)
        assert text == f"{Context(prec=d, rounding=rounding).plus(exact).normalize():f}%"
    assert Decimal(numfmt.percent_down(x, d)[:-1]) <= exact <= Decimal(numfmt.percent_up(x, d)[:-1])


def test_percentages_examples_and_specials():
    assert (numfmt.percent_down(0.123456, 4), numfmt.percent_up(0.123456, 4)) == ("12.34%", "12.35%")
    assert (numfmt.percent_down(0.9999999), numfmt.percent_up(0.9999999)) == ("99.9999%", "100%")
    assert numfmt.percent_up(1e-7) == "0.00001%" and numfmt.percent_up(0.57) == "57%"  # fixed notation; 0.57 exact
    # percent_nearest (the attribute leakage's left-out share): 1/3 at its default 3 digits; ties to even.
    assert (numfmt.percent_nearest(1 / 3), numfmt.percent_nearest(0.0125, 2), numfmt.percent_nearest(0.0135, 2)) == (
        "33.3%",
        "1.2%",
        "1.4%",
    )
    for f in (numfmt.percent_down, numfmt.percent_up, numfmt.percent_nearest):
        assert (f(None), f(None, missing="n/a"), f(0.0), f(-0.0), f(math.inf), f(math.nan)) == (
            "—",
            "n/a",
            "0%",
            "0%",
            "∞",
            "nan",
        )
