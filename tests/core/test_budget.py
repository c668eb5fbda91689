"""Impossible work refused early (issue 30): a cost estimate before anything large starts, refusing what
cannot fit in memory and asking for --yes above an hour; each case answers at once (exit code 2 and one
line) without training anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpaudit import budget
from dpaudit.budget import Cost, allow_long_work, check_cost
from dpaudit.cli.main import app
from dpaudit.errors import InputError

runner = CliRunner()
GiB = 2**30
AVAILABLE_MEMORY = budget.available_memory  # the real one (the fixture below replaces it)


def invoke(*args):
    return runner.invoke(app, ["--quiet", *[str(a) for a in args]])


def one_line_error(r):
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


@pytest.fixture(autouse=True)
def eight_gib(monkeypatch):
    """A fixed machine (8 GiB available), and no training at all: every case must be refused before it."""
    monkeypatch.setattr(budget, "available_memory", lambda: 8 * GiB)
    # setenv first, so that the teardown removes the variable again: a test's `dpaudit --yes` sets it for the rest of
    # the process (delenv of an absent variable records nothing), and every later test in the same worker then ran
    # with long work allowed (`attack mia --bootstrap 2^63` in test_cli_fuzz_findings ran 278 s and failed).
    monkeypatch.setenv(budget.YES_ENV, "0")
    monkeypatch.delenv(budget.YES_ENV)

    def no_training(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr("dpaudit.training.run._tensors", no_training)


def test_check_cost_refuses_memory_and_asks_before_long_work():
    check_cost(Cost("x", 10, "units", bytes_per_unit=GiB / 10, seconds_per_unit=1.0))
    with pytest.raises(InputError, match="need about 5 GiB of memory, more than 50% of the 8 GiB available"):
        check_cost(Cost("x", 5, "units", bytes_per_unit=GiB))
    long = Cost("x", 2, "units", seconds_per_unit=3000.0)
    with pytest.raises(InputError, match=r"would take about 1\.67 hours .* rerun with dpaudit --yes") as refused:
        check_cost(long)
    assert "in Python: with dpaudit.budget.allow_long_work()" in str(refused.value)  # a notebook has no --yes
    with allow_long_work():
        check_cost(long)
    with pytest.raises(InputError):  # the go-ahead ends with its block
        check_cost(long)


def test_the_documented_environment_variable_allows_long_work_and_only_its_value_1(monkeypatch):
    """README: `DPAUDIT_YES=1` in the environment allows long work like --yes (worker processes inherit --yes that
    way; a CI job can export it). Planted: long_work_allowed reading any value, or a different name -> fails."""
    long = Cost("x", 2, "units", seconds_per_unit=3000.0)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert f"`{budget.YES_ENV}=1`" in readme
    for value in ("0", "yes", ""):
        monkeypatch.setenv(budget.YES_ENV, value)
        with pytest.raises(InputError, match="rerun with dpaudit --yes"):
            check_cost(long)
    monkeypatch.setenv(budget.YES_ENV, "1")
    check_cost(long)


def test_sizes_and_durations_are_printed_in_the_largest_unit_they_reach():
    # Each unit from its first value (2^40 bytes is 1 TiB; 365 days 1 year), 3 significant digits; below a KiB bytes,
    # below a minute seconds, a non-finite duration "forever". Planted: any unit's size changed -> fails.
    from dpaudit.budget import _bytes, _duration

    sizes = [1.5 * 2**40, 2**40, 5 * 2**30, 2**30, 3 * 2**20, 2**20, 1.5 * 2**10, 2**10, 1023, 0]
    assert [_bytes(n) for n in sizes] == [
        "1.5 TiB", "1 TiB", "5 GiB", "1 GiB", "3 MiB", "1 MiB", "1.5 KiB", "1 KiB", "1023 B", "0 B",
    ]  # fmt: skip
    seconds = [2 * 365 * 86400, 3 * 86400, 7200, 90, 59.5, 0.25, float("inf")]
    expected = ["2 years", "3 days", "2 hours", "1.5 minutes", "59.5 s", "0.25 s", "forever"]
    assert [_duration(t) for t in seconds] == expected
    firsts = [365 * 86400, 86400, 3600, 60]  # one of each unit, singular
    assert [_duration(t) for t in firsts] == ["1 year", "1 day", "1 hour", "1 minute"]
    # Just below a unit: the smaller one's 1000..1023 whole, not "1.02e+03 GiB"; beyond the largest, exponents.
    assert [_bytes(2**40 - 2**20), _bytes(2**30 - 1), _bytes(1000 * 2**20), _bytes(2e6 * 2**40)] == [
        "1024 GiB", "1024 MiB", "1000 MiB", "2e+06 TiB",
    ]  # fmt: skip
    # 999.5..999.99 of a unit round to 1000 at 3 digits (mutation pass 19: "1e+03 GiB" there; the cap at 999 passed)
    assert [_bytes(999.6 * 2**30), _bytes(999.4 * 2**30), _bytes(999.5 * 2**20)] == ["1000 GiB", "999 GiB", "1000 MiB"]
    assert [_duration(t - 1).split()[1] for t in firsts] == ["days", "hours", "minutes", "s"]  # a second before


def test_check_cost_limits_are_inclusive_and_count_every_term():
    # At exactly half the memory (4 GiB of 8) and exactly an hour the work starts; the fixed bytes (a model's weights
    # beside its per-unit memory) count; check_cost returns the cost; a private step costs DP_OVERHEAD (3) plain ones;
    # a spec that cannot be built is one line. Planted: `>=` for either limit, fixed_bytes dropped, no return, no
    # DP overhead, any term of a training's memory changed, the build's refusal dropped -> fails.
    from dpaudit.budget import model_parameters, step_seconds

    edge = Cost("x", 4, "units", bytes_per_unit=GiB, seconds_per_unit=budget.CONFIRM_SECONDS / 4)
    assert check_cost(edge) is edge
    with pytest.raises(InputError, match="need about 5 GiB of memory"):
        check_cost(Cost("x", 1, "units", bytes_per_unit=GiB, fixed_bytes=4 * GiB))
    assert (step_seconds(10**6, 100, private=False), step_seconds(10**6, 100, private=True)) == (0.6, 1.8)
    # One training's memory: 4 bytes per parameter for the weights, 3 optimiser/gradient copies, and a batch of
    # per-example gradients when private (one gradient otherwise).
    private, plain = (budget.training_cost("t", 1000, 10, 64, private=p) for p in (True, False))
    assert (private.memory, plain.memory, private.units, private.seconds) == (4000 * 67, 4000 * 4, 10, 10 * 64 * 18e-6)

    class Unbuildable:
        def build(self):
            raise ValueError("hidden size -1\nmore")

    with pytest.raises(InputError, match=r"^cannot build the model spec \(hidden size -1\)$"):
        model_parameters(Unbuildable())


def test_a_go_ahead_block_restores_the_go_ahead_it_found():
    # `dpaudit --yes` earlier in the process (the variable set), then `with allow_long_work(False)`: refused inside,
    # allowed again after. Planted: the block not restoring a set variable, set_allow_long_work(False) not clearing
    # it -> fails.
    budget.set_allow_long_work(True)
    with allow_long_work(False):
        assert not budget.long_work_allowed()
    assert budget.long_work_allowed()


def test_available_memory_reads_memavailable_then_free_pages_then_assumes_4_gib(monkeypatch):
    # /proc/meminfo's MemAvailable (kB); without that line or file, free pages x page size; without those, 4 GiB.
    # Planted: the file not read, its line test negated (MemTotal read), kB not x 1024 -> fails.
    import io

    meminfo = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    500 kB\n"
    monkeypatch.setattr(budget, "open", lambda path: io.StringIO(meminfo), raising=False)
    monkeypatch.setattr(budget.os, "sysconf", {"SC_AVPHYS_PAGES": 7, "SC_PAGE_SIZE": 4096}.__getitem__)
    assert AVAILABLE_MEMORY() == 500 * 1024
    meminfo = "MemTotal:       1000 kB\nMemFree:         100 kB\n"  # a kernel before 3.14: no MemAvailable
    assert AVAILABLE_MEMORY() == 7 * 4096

    def unreadable(path):
        raise OSError(f"cannot open {path}")

    def unknown(name):
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(budget, "open", unreadable, raising=False)
    assert AVAILABLE_MEMORY() == 7 * 4096
    monkeypatch.setattr(budget.os, "sysconf", unknown)
    assert AVAILABLE_MEMORY() == 4 * GiB


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--epochs", 10**9], "training steps would take about"),
        (["train", "--steps", 10**12], "training steps would take about"),
        (["train", "--hidden", "40000,40000"], "parameters need about"),
        (["train", "--canaries", 10**7], "canaries need about"),
        (
            ["audit", "train", "--runs", 10**9, "--algo", "sgd", "--epochs", "1"],
            "audit train: 2e\\+09 trainings would take",
        ),
    ],
)
def test_exhaustion_cases_are_refused_before_any_work(tmp_path, args, message):
    out = ["--out", tmp_path / "run"] if args[0] == "train" else []
    line = one_line_error(invoke(*args, *out))
    assert __import__("re").search(message, line), line
    assert not (tmp_path / "run").exists()


def test_yes_lets_long_work_start(tmp_path):
    r = runner.invoke(app, ["--yes", "train", "--epochs", str(10**9), "--out", str(tmp_path / "run")])
    assert "training started" in r.output  # past the check: the fixture's stand-in for training ran


def test_many_reference_models_ask_for_yes():
    from dpaudit.budget import check_trainings, training_cost

    one = training_cost("reference models", 10**6, 10**4, 64, private=False)
    with pytest.raises(InputError, match="reference models: 1e\\+04 trainings would take"):
        check_trainings("reference models", 10_000, one)


def test_a_huge_spec_beside_small_weights_is_refused_before_it_is_built(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import save_file

    save_file({"0.weight": torch.zeros(3, 3)}, str(tmp_path / "w.safetensors"))
    spec = {"kind": "mlp", "input_shape": [64], "n_classes": 10, "hidden": [40000, 40000]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    monkeypatch.setattr("dpaudit.models.MLPSpec.build", lambda self: pytest.fail("built the model"))
    monkeypatch.setattr(budget, "model_parameters", lambda spec: 1_602_970_410)
    line = one_line_error(
        invoke("import", tmp_path / "w.safetensors", "--model-spec", tmp_path / "spec.json", "--out", tmp_path / "r")
    )
    assert "weights do not match the model spec: they hold 9 values, the spec 1602970410 parameters" in line


@pytest.mark.parametrize(
    ("hidden", "message"),
    [
        ([10**400], "an integer with 401 digits"),  # the JSON reader's limit
        ([2**40], "expected hidden in \\[0, 2147483647\\]"),  # the spec's
        ([10.5], "expected hidden to hold integers"),
    ],
)
def test_absurd_spec_values_are_one_line(tmp_path, hidden, message):
    from dpaudit.models import read_model_spec

    (tmp_path / "spec.json").write_text(
        '{"kind": "mlp", "input_shape": [64], "n_classes": 10, "hidden": [' + str(hidden[0]) + "]}"
    )
    with pytest.raises(InputError, match=message):
        read_model_spec(tmp_path / "spec.json")


def test_a_pld_window_that_cannot_fit_is_refused_before_the_fft(monkeypatch):
    from dpaudit.accounting import dpsgd_event, epsilon_for

    monkeypatch.setattr(budget, "available_memory", lambda: 256 * 2**20)  # 256 MiB: 10^8 steps need ~1 GiB
    # The way out a user has: another accountant (it said "use fewer grid points", which nobody can choose).
    with pytest.raises(InputError, match=r"PLD accounting of 100000000 compositions: .* grid points need about .*; "
                       r"use the rdp accountant \(or fewer steps\)$"):  # fmt: skip
        epsilon_for(dpsgd_event(noise_multiplier=1.0, sample_rate=0.01, steps=10**8), 1e-5, "pld")
    assert epsilon_for(dpsgd_event(noise_multiplier=1.0, sample_rate=0.01, steps=100), 1e-5, "pld") > 0


def test_long_work_is_announced_with_its_estimate_before_it_starts(capsys):
    from dpaudit.budget import NOTICE_SECONDS, Cost, check_cost

    check_cost(Cost("short work", 10, "steps", 8.0, NOTICE_SECONDS / 20))
    check_cost(Cost("a minute's work", 1, "steps", 8.0, NOTICE_SECONDS))  # announced above a minute only
    assert capsys.readouterr().err == ""
    check_cost(Cost("PLD accounting of 10000000 compositions", 1.27e8, "grid points", 48.0, 2e-6), memory=2**40)
    err = capsys.readouterr().err
    assert err.startswith("dpaudit: PLD accounting of 10000000 compositions: about ") and "(an estimate)" in err


def test_audit_train_is_refused_for_time_before_its_canary_is_made(monkeypatch):
    """`audit train --data cifar.npz --epsilon 4` spent 2 minutes and 1.8 GB making its default clipbkd canary (an
    SVD of 7,000 CIFAR members) and then refused: "200 trainings would take about 1.08 hours". The cost of the runs
    is checked first now."""
    import dpaudit.canaries

    def made(*args, **kwargs):
        raise AssertionError("the canary was made before the refusal")

    monkeypatch.setattr(dpaudit.canaries, "make_canaries", made)
    line = one_line_error(invoke("audit", "train", "--runs", 10**6, "--algo", "sgd", "--epochs", "1"))
    assert "audit train: 2e+06 trainings would take" in line, line


def test_work_beyond_any_machine_is_refused_even_with_yes():
    beyond = Cost("x", 2, "units", seconds_per_unit=budget.BEYOND_SECONDS)
    with allow_long_work(), pytest.raises(InputError, match=r"beyond any machine, so refused even with --yes"):
        check_cost(beyond)
    with allow_long_work():  # just below: --yes starts it
        check_cost(Cost("x", 1, "units", seconds_per_unit=budget.BEYOND_SECONDS))


def test_a_model_whose_forward_reads_values_is_counted_on_the_meta_device():
    """nn.TransformerEncoder given a mask detects a causal one with ``bool((mask == causal).all())``, which cannot run
    on the meta device: model_parameters' build refused it ("cannot build the model spec (... Tensor.item() cannot be
    called on meta tensors)"), so `dpaudit train` refused users' transformers on both backends. The build's logits
    check is skipped on meta only (a real build still runs it)."""
    from dpaudit.budget import model_parameters
    from dpaudit.models import PythonSpec
    from tests.core import byo_models as byo

    kwargs = {"vocab": 10, "length": 7, "n_classes": 2}
    spec = PythonSpec(factory="tests.core.byo_models:encoder_transformer", kwargs=kwargs, input_shape=(7,),
                      n_classes=2, input_dtype="int64")  # fmt: skip
    assert model_parameters(spec) == sum(p.numel() for p in byo.encoder_transformer(**kwargs).parameters())
    bad = PythonSpec(factory="tests.core.byo_models:encoder_transformer", kwargs=kwargs, input_shape=(7,),
                     n_classes=3, input_dtype="int64")  # fmt: skip
    with pytest.raises(InputError, match=r"gives output \[2, 2\]; expected logits of shape \[2, 3\]"):
        bad.build()  # off the meta device the check runs
