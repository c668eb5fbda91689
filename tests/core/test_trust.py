"""Files checked before they are trusted (issue 30): a run's claim re-accounted from its recorded
mechanism, split indices and canary files validated, stored files checked against the manifest's sha256,
JSON read with limits and types. Every problem is one line with exit code 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.checkpoint import claim_mismatch_note, load_run, reaccount_claim
from dpaudit.cli.main import app
from dpaudit.errors import CheckpointError
from dpaudit.fileio import write_manifest

runner = CliRunner()
DP = ["--algo", "dpsgd", "--epsilon", "2", "--epochs", "1", "--batch-size", "64"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(r):
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trust") / "dp"
    r = invoke("--quiet", "train", "--out", out, *DP)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def run_copy(dp_run, tmp_path):
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(dp_run, dst)
    return dst


def edit_meta(run: Path, edit) -> None:
    f = run / "checkpoint.json"
    meta = json.loads(f.read_text())
    edit(meta)
    f.write_text(json.dumps(meta))


# --------------------------------------------------------------------------- the claim


def test_an_intact_claim_re_accounts_to_itself(dp_run):
    check = reaccount_claim(load_run(dp_run).privacy)
    assert check["match"] and check["accountant"] == "rdp"
    assert check["recomputed"] == pytest.approx(check["recorded"], rel=1e-9)
    assert claim_mismatch_note(load_run(dp_run).privacy) is None


def test_inspect_shows_a_claim_mismatch_with_both_epsilons(dp_run, run_copy):
    intact = json.loads(invoke("--json", "inspect", dp_run).stdout)
    assert intact["claim_mismatch"] is False and intact["epsilon_recomputed"] == pytest.approx(intact["epsilon"])
    human = invoke("inspect", dp_run).output
    assert "MISMATCH" not in human
    # The claim as the report and the audit notes print it (:g, one rounding everywhere), not to 4 digits.
    assert f"privacy    ε = {intact['epsilon']:g} at δ" in human
    true_eps = intact["epsilon"]
    edit_meta(run_copy, lambda m: m["privacy"].update(epsilon=20.0))
    r = invoke("--json", "inspect", run_copy)
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["epsilon"] == 20.0 and s["claim_mismatch"] is True  # the record as it is, beside the recomputed ε
    assert s["epsilon_recomputed"] == pytest.approx(true_eps, rel=1e-9)
    human = invoke("inspect", run_copy).output
    line = next(x for x in human.splitlines() if x.startswith("CLAIM MISMATCH"))
    assert "records ε = 20" in line and f"re-accounts to ε = {true_eps:.6g}" in line


def test_a_tampered_epsilon_is_reported_in_the_audit_and_the_report(run_copy, tmp_path):
    true_eps = load_run(run_copy).privacy["epsilon"]
    edit_meta(run_copy, lambda m: m["privacy"].update(epsilon=20.0))
    from dpaudit.workflows import audit_checkpoint

    audit = audit_checkpoint(run_copy, attacks=("loss",))
    (record,) = audit.audits
    assert record.result.claimed_epsilon == 20.0  # the claim as recorded is what is tested
    note = [n for n in record.result.notes if n.startswith("claim mismatch")]
    assert len(note) == 1 and "ε = 20" in note[0] and f"{true_eps:.6g}" in note[0]
    r = invoke("--quiet", "report", run_copy, "--out", tmp_path / "rep", "--attacks", "loss")
    assert r.exit_code == 0, r.output
    assert "claim mismatch" in (tmp_path / "rep" / "report.md").read_text()
    assert "claim mismatch" in (tmp_path / "rep" / "report.html").read_text()


def test_hand_edited_metrics_are_said_in_every_audit(run_copy):
    """checkpoint.json's train accuracy edited from 30% to 99%: the report's utility table showed 99% as measured,
    beside attacks on a model whose accuracy is 30%. Now every audit says the file was edited (the report shows the
    audits' notes, as the claim mismatch test above checks)."""
    edit_meta(run_copy, lambda m: m["metrics"].update(train_accuracy=0.99))
    from dpaudit.workflows import audit_checkpoint

    (record,) = audit_checkpoint(run_copy, attacks=("loss",)).audits
    assert [n for n in record.result.notes if n.startswith("checkpoint.json changed since dpaudit wrote this run")]
    assert not [n for n in record.result.notes if n.startswith("claim mismatch")]  # the claim is as trained
    write_manifest(run_copy, written_by="run")  # a run written with its manifest: no note
    (record,) = audit_checkpoint(run_copy, attacks=("loss",)).audits
    assert not [n for n in record.result.notes if "changed since" in n]


def test_a_tampered_mechanism_is_reported_too(run_copy):
    edit_meta(run_copy, lambda m: m["privacy"]["event"]["event"]["event"].update(noise_multiplier=10.0))
    check = reaccount_claim(load_run(run_copy).privacy)
    assert not check["match"] and check["recomputed"] < check["recorded"]


@pytest.mark.parametrize(
    ("edit", "same"),
    [
        ({}, True),
        ({"steps": 1}, False),  # the fields say T = 1 beside a recorded event of 4 steps
        ({"sample_rate": 0.01}, False),
        ({"noise_multiplier": 10.0}, False),
        ({"event": {"type": "no such event"}}, False),
        ({"event": None}, True),  # no recorded event: the fields are the whole claim
    ],
)
def test_the_claims_own_curve_is_the_recorded_mechanisms(edit, same):
    """The one-run f-DP audit tests DP-SGD's curves at the claim's q and T, read from the (σ, q, T) fields, while
    the claim's ε is accounted from its recorded event: a stranger's file whose fields differ from its event (T = 1
    beside 4 steps) was tested against the curves of another mechanism, and a refutation there read "the claimed
    DP-SGD curve is refuted ... the claim is one of them". Such a file has no curve of its own: no f-DP audit."""
    from dpaudit.training.algorithms import claim_for
    from dpaudit.training.config import DPConfig, TrainConfig
    from dpaudit.workflows.checkpoint import claim_tradeoff

    claim = claim_for(TrainConfig(algo="dpsgd", epochs=1, batch_size=50, dp=DPConfig(noise_multiplier=1.0)), 200)
    assert claim["steps"] == 4 and claim["event"]["count"] == 4
    curve = claim_tradeoff({**claim, **edit})
    assert (curve is not None) == same
    if same:
        assert curve.name == f"dpsgd(q={claim['sample_rate']:.4g}, T=4)"


# --------------------------------------------------------------------------- splits and canary files


@pytest.mark.parametrize(
    ("plant", "message"),
    [
        ("negative", "negative index"),
        ("float", "integer indices"),
        ("range", "out of range"),
        ("repeat", "repeated index"),
    ],
)
def test_bad_split_indices_are_exit_2(run_copy, plant, message):
    f = run_copy / "split.npz"
    with np.load(f) as z:
        parts = {k: z[k] for k in z.files}
    m = parts["members"].copy()
    if plant == "negative":  # the repro: -1 wraps around to the last record
        m[0] = -1
    elif plant == "range":
        m[0] = 10**6
    elif plant == "repeat":
        m[1] = m[0]
    parts["members"] = m + 0.5 if plant == "float" else m
    np.savez(f, **parts)
    write_manifest(run_copy, written_by="run")  # a stranger's run whose manifest matches: the indices are checked
    with pytest.raises(CheckpointError, match=message):
        load_run(run_copy)
    assert message in one_line_error(invoke("audit", "checkpoint", run_copy, "--attacks", "loss"))


@pytest.mark.parametrize("name", ["/etc/passwd", "../x.npz", "sub/x.npz", "fifo.npz", 7])
def test_canary_files_must_be_regular_files_inside_the_run(run_copy, name):
    if name == "fifo.npz":
        os.mkfifo(run_copy / "fifo.npz")  # reading it would block forever
    edit_meta(run_copy, lambda m: m.update(canaries={"file": name, "kind": "mislabeled", "seed": 0, "m": 10}))
    with pytest.raises(CheckpointError, match=r"inside the run folder|not a regular file"):
        load_run(run_copy).canaries()


def test_a_stored_file_changed_since_it_was_written_is_not_trusted(run_copy):
    np.savez(run_copy / "whitebox.npz", scores=np.zeros(3), included=np.ones(3, bool))
    write_manifest(run_copy, written_by="run")
    edit_meta(run_copy, lambda m: m.update(whitebox_canaries={"file": "whitebox.npz", "m": 3}))
    write_manifest(run_copy, written_by="run")
    scores, _ = load_run(run_copy).whitebox_canaries()
    assert scores.tolist() == [0, 0, 0]
    np.savez(run_copy / "whitebox.npz", scores=np.full(3, 9.0), included=np.ones(3, bool))
    with pytest.raises(CheckpointError, match="changed since the run was written"):
        load_run(run_copy).whitebox_canaries()


# --------------------------------------------------------------------------- JSON limits and types


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update(deep=json.loads("[" * 100 + "]" * 100)), "nested deeper"),
        (lambda m: m["privacy"].update(epsilon=[1]), "privacy.epsilon: expected a number"),
        (lambda m: m.update(privacy=[1, 2]), "privacy: expected an object or null"),
        (lambda m: m["model"].update(n_classes=10.0), "n_classes"),
        (lambda m: m["model"].update(hidden=["big"]), "hidden"),
        # Each was an internal error (exit 3: KeyError, TypeError, ValueError) in inspect, audit or report:
        (lambda m: m["split"].update(seed="x"), "split.seed: expected an integer"),
        (lambda m: m["split"].update(fractions=None), "split.fractions: expected a list"),
        (lambda m: m["split"].update(sizes={}), "split.sizes: missing key members"),
        (lambda m: m["split"]["sizes"].update(members="628"), "split.sizes: expected an integer"),
        (lambda m: m["metrics"].update(train_accuracy="0.9"), "metrics.train_accuracy: expected a number or null"),
        (lambda m: m.update(metrics={}), "metrics: missing key train_accuracy"),
        (lambda m: m["model"].update(kind=[]), "model.kind: expected a string"),
        (lambda m: m.update(training={}), "training: missing key algo"),
        (lambda m: m.update(performance=None), "performance: expected an object"),
        (lambda m: m.update(privacy={}), "privacy: missing key(s) epsilon, delta"),
        (lambda m: m["preprocessing"].update(shape=[10**19]), "preprocessing: expected shape to be a list of sizes"),
        (lambda m: m["preprocessing"].update(mean=m["preprocessing"]["mean"][:-1]), "preprocessing: expected mean"),
        (lambda m: m["preprocessing"].update(scale="x"), "preprocessing: expected scale"),
    ],
)
def test_bad_checkpoint_json_is_one_line(run_copy, edit, message):
    edit_meta(run_copy, edit)
    assert message in one_line_error(invoke("audit", "checkpoint", run_copy, "--attacks", "loss"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100000 + "]" * 100000, "nested deeper"),
        ('{"n": ' + "9" * 5000 + "}", "integer with 5000 digits"),
        ('{"x": 1e400}', "overflows a float"),
        # Python kept the last ε, another reader of the same file may show the first
        ('{"privacy": {"epsilon": 1.0, "delta": 1e-5, "epsilon": 80.0}}', "the key 'epsilon' appears twice"),
    ],
)
def test_json_is_parsed_with_limits(text, message):
    from dpaudit.validation import parse_json

    with pytest.raises(CheckpointError, match=message):
        parse_json(text, "checkpoint.json", error=CheckpointError)
