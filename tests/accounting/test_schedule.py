"""``account dpsgd --schedule``: ε of DP-SGD whose noise multiplier or sample rate changed during training
(:func:`dpaudit.accounting.dpsgd_schedule_event`), against oracles that do not use our accountants."""

from __future__ import annotations

import json
import math

import pytest
from scipy import optimize, stats
from typer.testing import CliRunner

from dpaudit.accounting import PldAccountant, RdpAccountant, dpsgd_event, dpsgd_schedule_event, epsilon_for
from dpaudit.accounting.rdp import DEFAULT_ORDERS
from dpaudit.cli.main import app

runner = CliRunner()
DELTA = 1e-5


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
    return p


def _csv(tmp_path, phases, name="s.csv"):
    rows = "".join(f"{s!r},{q!r},{t}\n" for s, q, t in phases)
    return _write(tmp_path, name, "noise_multiplier,sample_rate,steps\n" + rows)


def _account(path, accountant, *extra):
    r = runner.invoke(
        app, ["account", "dpsgd", "--schedule", str(path), "--delta", "1e-5", "--accountant", accountant, *extra]
    )
    assert r.exit_code == 0, r.output
    return r


def _eps(path, accountant):
    return json.loads(_account(path, accountant, "--json").stdout)["epsilon"]


@pytest.mark.parametrize("accountant", ["rdp", "pld", "gdp"])
def test_identical_phases_equal_one_phase_exactly(tmp_path, accountant):
    """Three phases of (σ, q, 100) are one phase of 300 steps: the same ε to the bit, through the CLI."""
    one_phase = ["--noise-multiplier", "1.1", "--sample-rate", "0.01", "--steps", "300"]
    single = runner.invoke(
        app, ["account", "dpsgd", *one_phase, "--delta", "1e-5", "--accountant", accountant, "--json"]
    )
    assert single.exit_code == 0, single.output
    path = _csv(tmp_path, [(1.1, 0.01, 100)] * 3)
    assert _eps(path, accountant) == json.loads(single.stdout)["epsilon"]


def _gdp_epsilon_closed_form(mu: float, delta: float) -> float:
    """ε at δ of μ-GDP: δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2) (Dong, Roth & Su 2022, JRSS-B, Cor. 2.13),
    solved for ε by bracketing (δ(ε) decreases in ε)."""

    def gap(eps):
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta

    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-14, rtol=1e-14)


def test_full_batch_phases_are_gdp_with_summed_mu(tmp_path):
    """At q = 1 each step is the Gaussian mechanism, exactly (1/σ)-GDP, and composition adds μ²
    (Dong, Roth & Su 2022, Cor. 3.3): μ = sqrt(Σ T_k/σ_k²)."""
    phases = [(1.0, 1.0, 3), (2.0, 1.0, 8), (0.7, 1.0, 1), (4.0, 1.0, 20)]
    mu = math.sqrt(sum(t / s**2 for s, _, t in phases))
    exact = _gdp_epsilon_closed_form(mu, DELTA)
    path = _csv(tmp_path, phases)
    gdp, pld, rdp = (_eps(path, a) for a in ("gdp", "pld", "rdp"))
    assert exact <= gdp <= exact * (1 + 1e-9)  # exact at q = 1, rounded up
    # PLD: pessimistic (never below), on a 1e-4-nat grid with 4 distinct leaves: within 1e-3 nats here
    assert exact <= pld <= exact + 1e-3
    assert rdp >= exact  # an RDP bound is an upper bound; looser (the conversion loses)
    # Planted mistake "steps of phase 1 applied to all" gives μ² = 3(1 + 1/4 + 1/0.49 + 1/16): far off
    assert abs(pld - _gdp_epsilon_closed_form(math.sqrt(3 * (1 + 0.25 + 1 / 0.49 + 1 / 16)), DELTA)) > 0.1


SCHEDULES = [
    [(1.1, 0.01, 500), (0.8, 0.02, 300)],  # a second phase with less noise and larger batches
    [(2.0, 0.004, 1000), (1.5, 0.004, 1000), (1.0, 0.004, 1000)],  # a decaying noise schedule (StepNoise-like)
    [(0.9, 0.05, 50), (2.0, 0.01, 400)],  # private pre-training, then fine-tuning with another σ and q
]


def _dpa_composed(dpa, phases):
    return dpa.ComposedDpEvent(
        [dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(s)), t) for s, q, t in phases]
    )


@pytest.mark.parametrize(
    "phases",
    [
        *SCHEDULES,
        # eight phases: dp_accounting's PLD of them takes ~15 s on a loaded 2-core machine
        pytest.param([(1.0 + 0.25 * k, 0.01 if k % 2 else 0.02, 60) for k in range(8)], marks=pytest.mark.slow),
    ],
)
def test_schedule_matches_dp_accounting(phases):
    """dp_accounting composes heterogeneous PoissonSampled(Gaussian) phases itself: RDP to 1e-6 (same orders,
    test_peers' tolerance), PLD to 1% on our finest grid (test_peers'), and ours never below dp_accounting's
    optimistic PLD estimate (a lower bound on the true ε up to its discretisation)."""
    dpa = pytest.importorskip("dp_accounting")
    event = dpsgd_schedule_event(phases)
    theirs_rdp = dpa.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    theirs_rdp.compose(_dpa_composed(dpa, phases))
    assert RdpAccountant().compose(event).epsilon(DELTA) == pytest.approx(theirs_rdp.get_epsilon(DELTA), rel=1e-6)
    ours = PldAccountant().compose(event)
    finest = ours._grids(ours.jl_initial_cap)[-1]
    theirs = dpa.pld.PLDAccountant(value_discretization_interval=finest)
    theirs.compose(_dpa_composed(dpa, phases))
    eps = ours.epsilon(DELTA)
    assert eps == pytest.approx(theirs.get_epsilon(DELTA), rel=1e-2)
    optimistic = None
    for s, q, t in phases:
        one = dpa.pld.privacy_loss_distribution.from_gaussian_mechanism(
            s, pessimistic_estimate=False, value_discretization_interval=finest, sampling_prob=q
        ).self_compose(t)
        optimistic = one if optimistic is None else optimistic.compose(one)
    assert eps >= optimistic.get_epsilon_for_delta(DELTA)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_order_of_phases_does_not_change_epsilon(tmp_path, accountant):
    phases = SCHEDULES[0] + [(3.0, 0.001, 200)]
    forward = _eps(_csv(tmp_path, phases, "a.csv"), accountant)
    backward = _eps(_csv(tmp_path, phases[::-1], "b.csv"), accountant)
    assert forward == backward
    # and the composition is more than any one phase (planted: only the last phase composed)
    for s, q, t in phases:
        assert forward > epsilon_for(dpsgd_event(noise_multiplier=s, sample_rate=q, steps=t), DELTA, accountant)


def test_json_file_text_output_and_all(tmp_path):
    phases = SCHEDULES[0]
    path = _write(
        tmp_path,
        "s.json",
        json.dumps([{"noise_multiplier": s, "sample_rate": q, "steps": t} for s, q, t in phases]),
    )
    data = json.loads(_account(path, "all", "--json").stdout)
    assert data["phases"] == [{"noise_multiplier": s, "sample_rate": q, "steps": t} for s, q, t in phases]
    assert data["steps"] == 800 and data["gdp"]["approximate"] is True
    assert data["epsilon"] == min(data["rdp"]["epsilon"], data["pld"]["epsilon"])
    assert data["pld"]["epsilon"] == _eps(_csv(tmp_path, phases), "pld")
    text = _account(path, "rdp").stdout.splitlines()
    assert text[0].startswith("epsilon = ") and "2 phases, 800 steps" in text[0]
    assert text[1:] == [
        "  phase 1: noise_multiplier = 1.1, sample_rate = 0.01, steps = 500",
        "  phase 2: noise_multiplier = 0.8, sample_rate = 0.02, steps = 300",
    ]


HEADER = "noise_multiplier,sample_rate,steps\n"


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("s.csv", "", "empty"),
        ("s.csv", HEADER, "no phases"),
        ("s.csv", "noise_multiplier,steps\n1,10\n", "missing column sample_rate"),
        ("s.csv", "noise_multiplier,sample_rate,steps,lr\n1,0.1,10,3\n", "unexpected column 'lr'"),
        ("s.csv", "noise_multiplier,noise_multiplier,steps\n1,1,10\n", "missing column sample_rate"),
        ("s.csv", "noise_multiplier,sample_rate,steps,steps\n1,0.1,10,10\n", "column 'steps' given twice"),
        ("s.csv", HEADER + "0,0.1,10\n", "phase 1: expected noise_multiplier > 0"),
        ("s.csv", HEADER + "1,0.1,10\n-1,0.1,10\n", "phase 2: expected noise_multiplier > 0"),
        ("s.csv", HEADER + "nan,0.1,10\n", "phase 1: expected noise_multiplier to be a number"),
        ("s.csv", HEADER + "1e-9,0.1,10\n", "phase 1: expected noise_multiplier = 0 (no noise) or >="),
        ("s.csv", HEADER + "1,0,10\n", "phase 1: expected sample_rate in (0, 1]"),
        ("s.csv", HEADER + "1,1.5,10\n", "phase 1: expected sample_rate in (0, 1]"),
        ("s.csv", HEADER + "1,0.1,2.5\n", "phase 1: expected steps to be an integer"),
        ("s.csv", HEADER + "1,0.1,0\n", "phase 1: expected steps >= 1"),
        ("s.csv", HEADER + "1,0.1\n", "phase 1: expected 3 values, got 2"),
        ("s.json", "[]", "no phases"),
        ("s.json", "{}", "expected a list"),
        ("s.json", '[{"noise_multiplier": 1, "steps": 3}]', "missing sample_rate"),
        (
            "s.json",
            '[{"noise_multiplier": 1, "sample_rate": 0.1, "steps": 3}, {"noise_multiplier": 1, "steps": 3}]',
            "s.json: phase 2: missing sample_rate",
        ),
        ("s.json", '[{"noise_multiplier": 1, "sample_rate": 0.1, "steps": 3.5}]', "steps: expected an integer"),
        ("s.json", '[{"noise_multiplier": "1", "sample_rate": 0.1, "steps": 3}]', "noise_multiplier: expected a"),
        ("s.json", '[{"noise_multiplier": 1, "sample_rate": 0.1, "steps": -3}]', "expected steps >= 1"),
        ("s.json", "[", "not valid JSON"),
        ("s.json", "[3]", "s.json: phase 1: expected an object, got int 3"),
        ("s.json", '[{"noise_multiplier": 1, "sample_rate": 0.1, "steps": 3, "lr": 1}]', "phase 1: unknown key 'lr'"),
        ("s.csv", b"noise_multiplier,sample_rate,steps\n1,0.1,\xff\n", "s.csv: not UTF-8 text"),
    ],
)
def test_bad_schedule_is_one_line_exit_2(tmp_path, name, text, expected):
    path = _write(tmp_path, name, text)
    r = runner.invoke(app, ["account", "dpsgd", "--schedule", str(path), "--delta", "1e-5"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0], r.stderr


@pytest.mark.parametrize(
    "extra",
    [
        ["--noise-multiplier", "1"],
        ["--sample-rate", "0.1"],
        ["--steps", "10"],
        ["--epochs", "2"],
        ["--dataset-size", "100"],
        ["--batch-size", "10"],
        ["--jl-projections", "5", "--accountant", "pld"],
    ],
)
def test_schedule_mixed_with_single_phase_options_is_one_line_exit_2(tmp_path, extra):
    path = _csv(tmp_path, SCHEDULES[0])
    r = runner.invoke(app, ["account", "dpsgd", "--schedule", str(path), "--delta", "1e-5", *extra])
    assert r.exit_code == 2, r.output
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


def test_missing_file_and_missing_noise_multiplier_are_one_line_exit_2(tmp_path):
    r = runner.invoke(app, ["account", "dpsgd", "--schedule", str(tmp_path / "none.csv"), "--delta", "1e-5"])
    assert r.exit_code == 2 and "no such file" in r.stderr
    r = runner.invoke(app, ["account", "dpsgd", "--delta", "1e-5", "--sample-rate", "0.1", "--steps", "3"])
    assert r.exit_code == 2 and "--noise-multiplier" in r.stderr


def test_the_schedule_event_is_the_documented_composition():
    # dpsgd_schedule_event's docstring: phases with the same (σ, q) are one SelfComposed of their summed steps, the
    # distinct ones composed in the order (σ, then q) whatever the listing order, and a schedule of one (σ, q) is
    # exactly dpsgd_event of the total steps (not a Composed of one event).
    from dpaudit.errors import InputError
    from dpaudit.events import Composed

    one = dpsgd_event(noise_multiplier=1.0, sample_rate=0.1, steps=15)
    assert dpsgd_schedule_event([(1.0, 0.1, 10), (1.0, 0.1, 5)]) == one
    assert dpsgd_schedule_event([(1, 0.1, 15)]) == one
    phases = [(2.0, 0.1, 5), (1.0, 0.2, 3), (1.0, 0.1, 4), (2.0, 0.1, 1)]
    want = Composed(tuple(dpsgd_event(noise_multiplier=s, sample_rate=q, steps=t) for s, q, t in
                          ((1.0, 0.1, 4), (1.0, 0.2, 3), (2.0, 0.1, 6))))  # fmt: skip
    assert dpsgd_schedule_event(phases) == want == dpsgd_schedule_event(phases[::-1])
    for bad, message in (([(1.0, 0.1)], "phase 1: expected .*got 2 values"), ([], "at least one phase"),
                         ([(1.0, 0.1, 3), (1.0, 0.1, 3, 4)], "phase 2: expected .*got 4 values")):  # fmt: skip
        with pytest.raises(InputError, match=message):
            dpsgd_schedule_event(bad)


def test_gdp_of_a_subsampled_schedule_is_marked_approximate_and_of_full_batches_not(tmp_path):
    # GDP of Poisson-subsampled steps is the central limit theorem's approximation (Dong, Roth & Su 2022, Thm. 3.5),
    # not a bound: the JSON says so ("approximate": true), as for one phase; at q = 1 it is exact (Cor. 3.3).
    # The CLI's warning says so once (each phase's accounting warns it).
    sub = json.loads(_account(_csv(tmp_path, SCHEDULES[0], "a.csv"), "gdp", "--json").stdout)
    full = json.loads(_account(_csv(tmp_path, [(1.0, 1.0, 3), (2.0, 1.0, 8)], "b.csv"), "gdp", "--json").stdout)
    assert sub["approximate"] is True and "approximate" not in full
    assert sub["phases"][0] == {"noise_multiplier": 1.1, "sample_rate": 0.01, "steps": 500}
    warned = _account(_csv(tmp_path, SCHEDULES[0], "a.csv"), "gdp").stderr.splitlines()
    assert len(warned) == 1 and "central limit theorem" in warned[0] and "can under-report epsilon" in warned[0]


def test_a_schedule_that_is_a_folder_or_too_large_is_one_line_exit_2(tmp_path, monkeypatch):
    # validation.read_limited: a folder is not a regular file; a file above MAX_JSON_BYTES (here lowered to 200 bytes,
    # read at the call) is refused before it is read, CSV and JSON alike, the JSON one naming its kind; a file of
    # exactly MAX_JSON_BYTES is read.
    import dpaudit.validation
    from dpaudit.errors import FileContentError

    cap = 200
    monkeypatch.setattr(dpaudit.validation, "MAX_JSON_BYTES", cap)
    (tmp_path / "d.csv").mkdir()
    cases = [(tmp_path / "d.csv", "d.csv: a directory, not a regular file")]
    for name, kind in (("big.csv", ""), ("big.json", "JSON ")):
        big = tmp_path / name
        big.write_bytes(b" " * (cap + 1))
        cases.append((big, f"{name}: {kind}larger than {cap // 2**20} MiB"))
    for path, expected in cases:
        r = runner.invoke(app, ["account", "dpsgd", "--schedule", str(path), "--delta", "1e-5"])
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].endswith(expected), r.stderr
    at_cap = tmp_path / "cap.csv"
    at_cap.write_bytes((HEADER + "1,0.1,10\n").encode().ljust(cap, b"\n"))
    assert _account(at_cap, "rdp").exit_code == 0
    assert dpaudit.validation.read_limited(str(at_cap)) == at_cap.read_bytes()  # a str path too

    def unreadable(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(at_cap), "read_bytes", unreadable)
    with pytest.raises(FileContentError, match=r"cap.csv: cannot read \(Permission denied\)$"):
        dpaudit.validation.read_limited(at_cap, error=FileContentError)


def test_forwarded_warnings_are_the_user_warnings_each_once_on_every_call(capsys):
    # account's _forwarding_warnings: a UserWarning of the computation is printed once however often it was raised
    # (a schedule's phases each raise GDP's), on every call; other categories (a numpy RuntimeWarning, a
    # DeprecationWarning from a library) are not the user's business and are not printed.
    import warnings

    from dpaudit.cli.account import _forwarding_warnings

    def compute():
        for _ in range(3):
            warnings.warn("the same caveat", stacklevel=1)
        warnings.warn("library internals", DeprecationWarning, stacklevel=1)
        warnings.warn("overflow", RuntimeWarning, stacklevel=1)
        return 7

    for _ in range(2):
        assert _forwarding_warnings(compute) == 7
        assert capsys.readouterr().err.splitlines() == ["warning: the same caveat"]
