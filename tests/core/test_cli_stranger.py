"""A third new-user pass over the CLI: a privacy engineer's own data, checkpoints and numbers at their edges.
Each case was an internal error (exit 3), a wrong option blamed or a silent misreading before."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.core.cli_errors import invoke, one_line_error

SCHEDULE = ["--sample-rate", "0.004", "--steps", "1000", "--delta", "1e-5"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # sigma**2 overflowed in the RDP accountant (OverflowError, exit 3); the float32 noise std in training
        (["account", "dpsgd", "--noise-multiplier", "1e200", *SCHEDULE, "--json"], None),
        (["train", "--model", "logreg", "--algo", "dpsgd", "--noise-multiplier", "1e200", "--out", "never"],
         "error: expected --noise-multiplier × --clip (the noise's standard deviation, 1e+200 × 1) <= 3.403e+38, "
         "the largest float32"),
        # the list of valid values named two of the three threat models
        (["audit", "train", "--threat-model", "foo"],
         "error: unknown --threat-model 'foo'; valid: black-box, white-box, white-box-steps"),
        # a Python class name where the command-line spelling belongs
        (["audit", "scores", "s.csv", "--method", "one-run-fdp", "--design", "canaries", "--tradeoff", "foo"],
         "error: unknown --tradeoff 'foo'; valid: epsilon-delta, gdp, dpsgd:Q,T (DP-SGD's curves; in Python a "
         "TradeoffFamily such as dpsgd_family(Q, T))"),
        # an option documented for one method and silently ignored by the others
        (["audit", "scores", "s.csv", "--tradeoff", "gdp"],
         "error: --tradeoff applies to --method one-run-fdp only, not --method clopper-pearson"),
        (["audit", "plan", "--epsilon", "2", "--method", "one-run", "--tradeoff", "dpsgd:0.1,10"],
         "error: --tradeoff applies to --method one-run-fdp only, not --method one-run"),
    ],
)  # fmt: skip
def test_numbers_at_their_edges(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.csv").write_text("member,score\n" + "".join(f"{i % 2},{i}\n" for i in range(20)))
    if message is None:  # accepted: a finite epsilon, not an internal error
        r = invoke(*args)
        assert r.exit_code == 0 and '"epsilon": 0.0' in r.stdout, r.output
        return
    assert one_line_error(*args) == message
    assert not (tmp_path / "never").exists()


TINY = ["--data", "synthetic:n=120,d=4,classes=2,seed=0", "--model", "logreg", "--epochs", "1", "--batch-size", "16"]


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("stranger") / "dp"
    r = invoke("--quiet", "train", *TINY, "--algo", "dpsgd", "--noise-multiplier", "2", "--out", out)
    assert r.exit_code == 0, r.output
    return out


def _edited(run: Path, tmp_path: Path, **privacy) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    meta = json.loads((copy / "checkpoint.json").read_text())
    meta["privacy"].update(privacy)
    (copy / "checkpoint.json").write_text(json.dumps(meta))  # allow_nan: NaN is written as NaN
    return copy


@pytest.mark.parametrize(
    ("privacy", "message"),
    [
        ({"epsilon": math.nan}, "privacy.epsilon: expected a number >= 0 (or Infinity), got nan"),
        ({"epsilon": -1.0}, "privacy.epsilon: expected a number >= 0 (or Infinity), got -1.0"),
        ({"delta": 2.0}, "privacy.delta: expected a number in [0, 1), got 2.0"),
    ],
)
def test_a_strangers_claim_values_are_refused_naming_the_file(dp_run, tmp_path, privacy, message):
    """inspect printed `ε = nan` / `δ = 2`, and audits refused with `expected --claimed-epsilon >= 0`, an
    option the user never typed."""
    run = _edited(dp_run, tmp_path, **privacy)
    for command in (["inspect", run], ["audit", "checkpoint", run, "--attacks", "none"]):
        assert one_line_error(*command) == f"error: {run / 'checkpoint.json'}: {message}"


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        # a run saved by a training that diverged (dpaudit before it refused one): every loss NaN
        ({"train_loss": math.nan}, "metrics.train_loss: expected a finite number >= 0 or null, got nan (a training "
         "that diverged: retrain it with a lower --lr)"),
        ({"test_accuracy": math.inf}, "metrics.test_accuracy: expected a number in [0, 1] or null, got inf"),
        ({"holdout_accuracy": 1.5}, "metrics.holdout_accuracy: expected a number in [0, 1] or null, got 1.5"),
    ],
)  # fmt: skip
def test_a_runs_metric_values_are_refused_naming_the_file(dp_run, tmp_path, metrics, message):
    """inspect printed `test ∞` (and a NaN loss as "nan" in --json), and report failed with `invalid report:
    report.models[0].utility.train_loss: 'nan' is not of type 'number', 'null'`, blaming its own output."""
    run = _edited(dp_run, tmp_path)
    meta = json.loads((run / "checkpoint.json").read_text())
    meta["metrics"].update(metrics)
    (run / "checkpoint.json").write_text(json.dumps(meta))
    for command in (["inspect", run], ["report", run, "--out", tmp_path / "r", "--attacks", "none"]):
        assert one_line_error(*command) == f"error: {run / 'checkpoint.json'}: {message}"
    assert not (tmp_path / "r").exists()


def test_claim_values_at_their_edges_are_read_or_refused(dp_run, tmp_path):
    # epsilon 0 or infinite and delta 0 (a pure-epsilon claim) are claims; a missing value (null) is no claim; delta
    # 1 and a negative delta are not. Planted: eps > 0 or eps >= 1 required, delta 0 refused, delta 1 or < 0
    # accepted, None compared with a number -> fails.
    from dpaudit.checkpoint import read_meta
    from dpaudit.errors import CheckpointError

    run = _edited(dp_run, tmp_path)
    meta = json.loads((run / "checkpoint.json").read_text())
    for privacy in ({"epsilon": 0.0}, {"epsilon": 0.5}, {"epsilon": math.inf}, {"epsilon": None}, {"delta": 0.0},
                    {"delta": None}):  # fmt: skip
        (run / "checkpoint.json").write_text(json.dumps({**meta, "privacy": {**meta["privacy"], **privacy}}))
        assert read_meta(run)["privacy"] == {**meta["privacy"], **privacy}
    for delta in (1.0, -0.1):
        (run / "checkpoint.json").write_text(json.dumps({**meta, "privacy": {**meta["privacy"], "delta": delta}}))
        with pytest.raises(CheckpointError, match=rf"privacy.delta: expected a number in \[0, 1\), got {delta}$"):
            read_meta(run)


def test_attacks_none_means_the_same_in_report_and_audit_checkpoint(dp_run, tmp_path):
    """`audit checkpoint --attacks none` audits the canaries only; `report --attacks none` was refused as
    "unknown attack method 'none'" (README: --attacks means one thing in both)."""
    from dpaudit.workflows import membership_attacks

    assert membership_attacks(" None ") == () and membership_attacks("loss,all")[:2] == ("loss", "confidence")
    nothing = f"error: {dp_run}: nothing to audit: the run has no canaries and no attack was asked for"
    assert one_line_error("audit", "checkpoint", dp_run, "--attacks", "none") == nothing
    assert one_line_error("report", dp_run, "--attacks", "none", "--out", tmp_path / "r") == nothing


def test_channels_last_images_are_not_read_as_channels(tmp_path):
    """CIFAR stored N x 32 x 32 x 3 trained a cnn on 32 channels of 32 x 3 images, silently."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "hwc.npz", X=rng.integers(0, 256, (40, 8, 8, 3), dtype=np.uint8), y=np.arange(40) % 2)
    assert one_line_error("train", "--model", "cnn", "--data", tmp_path / "hwc.npz", "--out", tmp_path / "r") == (
        "error: cnn reads a record as (channels, height, width), but feature shape [8, 8, 3] looks channels-last "
        "(height, width, channels); store X as N x 3 x 8 x 8, e.g. X.transpose(0, 3, 1, 2)"
    )
    assert not (tmp_path / "r").exists()
    from dpaudit.models import default_spec

    default_spec("cnn", input_shape=(16, 50, 1), n_classes=2)  # a (channels, length, 1) series stays legitimate


def test_channels_last_images_for_a_factory_spec_say_so(tmp_path):
    """CIFAR saved by numpy/TF as N x H x W x 3 with one's own module's spec [3, H, W]: the mismatch named both
    shapes but not the transpose the zoo cnn's refusal gives; a spec that differs otherwise gets no hint."""
    from dpaudit.errors import InputError
    from dpaudit.plugins import load_model_spec

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"kind": "cnn", "input_shape": [3, 8, 8], "n_classes": 2}))
    with pytest.raises(InputError, match=r"the data has \[8, 8, 3\] and 2; the data looks channels-last: store X as "
                       r"N x 3 x 8 x 8, e\.g\. X\.transpose\(0, 3, 1, 2\)$"):  # fmt: skip
        load_model_spec(spec, feature_shape=(8, 8, 3), n_classes=2)
    with pytest.raises(InputError, match=r"the data has \[8, 3, 8\] and 2$"):
        load_model_spec(spec, feature_shape=(8, 3, 8), n_classes=2)


def test_a_factory_spec_whose_input_shape_is_not_the_datas_names_both_before_its_forward_runs(tmp_path):
    """A residual CNN's spec written channels-last, [8, 8, 3], for N x 3 x 8 x 8 records: the line was the factory's
    forward failing on [2, 8, 8, 3] (torch's "expected input ... to have 3 channels"), not the mismatch; now the
    shapes are compared before the factory's model runs, with the hint for a spec written channels-last."""
    from dpaudit.errors import InputError
    from dpaudit.plugins import load_model_spec

    spec = tmp_path / "spec.json"
    factory = {"kind": "python", "factory": "tests.core.byo_models:residual_groupnorm_cnn", "n_classes": 2}
    spec.write_text(json.dumps({**factory, "kwargs": {"channels": 3, "n_classes": 2}, "input_shape": [8, 8, 3]}))
    with pytest.raises(InputError, match=r"spec\.json: the spec is for input shape \[8, 8, 3\] and 2 classes; the data "
                       r"has \[3, 8, 8\] and 2; the module gets each record as stored, \[3, 8, 8\]: write that as the "
                       r"spec's input_shape$"):  # fmt: skip
        load_model_spec(spec, feature_shape=(3, 8, 8), n_classes=2)
    spec.write_text(json.dumps({**factory, "kwargs": {"channels": 3, "n_classes": 2}, "input_shape": [3, 8, 8]}))
    assert load_model_spec(spec, feature_shape=(3, 8, 8), n_classes=2).input_shape == (3, 8, 8)


@pytest.mark.parametrize(("shape", "refused"), [((28, 28, 1), True), ((32, 32, 4), True), ((8, 8, 16), False)])
def test_channels_last_covers_grey_and_rgba_and_only_those_widths(shape, refused):
    # MNIST stored N x 28 x 28 x 1 and RGBA N x 32 x 32 x 4 are channels-last as CIFAR's 3 is; 8 channels of 8 x 16
    # images are square in (C, H) only by chance. Planted: width 1 or 4 dropped, the width not checked -> fails.
    from dpaudit.errors import InputError
    from dpaudit.models import default_spec

    if refused:
        with pytest.raises(InputError, match=rf"looks channels-last .* store X as N x {shape[2]} x {shape[0]} x "):
            default_spec("cnn", input_shape=shape, n_classes=2)
    else:
        default_spec("cnn", input_shape=shape, n_classes=2)


def test_a_mechanism_that_does_not_parse_is_said_not_skipped(dp_run, tmp_path):
    """An edited privacy.event (a negative sampling rate) was skipped in silence: claim_mismatch false, no note,
    though every audit promises the recorded claim is re-accounted from it."""
    from dpaudit.checkpoint import claim_mismatch_note

    run = _edited(dp_run, tmp_path)
    meta = json.loads((run / "checkpoint.json").read_text())
    meta["privacy"]["event"]["event"]["sample_rate"] = -0.5
    (run / "checkpoint.json").write_text(json.dumps(meta))
    r = invoke("inspect", run, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["claim_mismatch"] is True and json.loads(r.stdout)["epsilon_recomputed"] is None
    assert "CLAIM UNVERIFIED" in invoke("inspect", run).stdout
    assert claim_mismatch_note(meta["privacy"]).startswith(
        "claim unverified: checkpoint.json's recorded mechanism (privacy.event) cannot be read (expected sample_rate"
    )
    assert claim_mismatch_note(json.loads((dp_run / "checkpoint.json").read_text())["privacy"]) is None


def test_escape_sequences_in_a_strangers_names_are_printed_not_obeyed(dp_run, tmp_path, capsys):
    """A run folder (or anything in a stranger's files that a message repeats) named with ESC, a carriage return
    or a right-to-left override: the terminal would run the escape sequence (colours, the window title, OSC 52
    clipboard writes), let the name overwrite its own line, or print the line's numbers backwards. Every human
    line of the CLI (results, warnings, notices, errors) writes them out as ⟨U+001B⟩ etc.; --json escapes them
    itself. Planted: any of those printers without dpaudit.validation.visible -> fails."""
    from dpaudit.cli import _common

    name = "run\x1b]52;c;ZWNobyBwd25lZA==\x07\r\u202eevil"
    odd = tmp_path / name
    shutil.copytree(dp_run, odd)
    shown = "run⟨U+001B⟩]52;c;ZWNobyBwd25lZA==⟨U+0007⟩⟨U+000D⟩⟨U+202E⟩evil"
    r = invoke("inspect", odd / "missing")  # an error line naming the path
    assert r.exit_code == 2 and shown in r.stderr and "\x1b" not in r.output, r.output
    _common.emit({"name": name}, f"result {name}")
    _common.info(f"info {name}")
    _common.notice(f"notice {name}")
    _common.warn(f"warn {name}")
    out, err = capsys.readouterr()
    assert out == f"result {shown}\n" and err == f"info {shown}\nnotice {shown}\nwarning: warn {shown}\n"
    _common.emit({"name": name}, f"result {name}", json_flag=True)
    assert "\x1b" not in capsys.readouterr().out
