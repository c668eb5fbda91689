"""`dpaudit import` with the user's own data, member list, claim, preprocessing and recipe.

Oracles: the imported model's logits equal the foreign model's own outputs; the recorded claim equals
dpaudit's accountant on the stated mechanism; a member list known to be wrong (the complement of the
training set) is flagged and the right one is not; LiRA runs on an imported run with a recipe.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpaudit.accounting import dpsgd_event, epsilon_for
from dpaudit.checkpoint import CHECKPOINT_FILE, WEIGHTS_FILE, load_run
from dpaudit.cli.main import app
from dpaudit.data import IMPORT_NON_MEMBER_SHARES, Splits, load_dataset, read_member_indices, splits_from_members
from dpaudit.errors import DataError
from dpaudit.events import Gaussian, SelfComposed, event_from_dict
from dpaudit.models import build_model, default_spec
from dpaudit.training.config import TrainConfig
from dpaudit.training.run import StatedClaim, _shuffle_epochs, claim_record, recipe_from_dict, train_run

runner = CliRunner()
DELTA = 1e-5


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def error_lines(r) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("error:")]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _member_file(path: Path, idx) -> Path:
    return _write(path, "record_index\n" + "\n".join(str(int(i)) for i in idx) + "\n")


def _meta(run: Path) -> dict:
    return json.loads((run / CHECKPOINT_FILE).read_text())


# --------------------------------------------------------------------------- a dpaudit-trained "foreign" model


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """A non-private MLP trained (by dpaudit, standing in for any trainer) on records 0..599 of digits,
    with its scaler written as scaler.json and its weights as a foreign safetensors file."""
    tmp = tmp_path_factory.mktemp("foreign")
    ds = load_dataset("digits")
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes, hidden=(64,))
    members = np.arange(600)
    rest = np.arange(600, len(ds))
    splits = Splits(members=members, holdout=rest[:400], aux=rest[400:800], test=rest[800:], seed=0, fractions=())
    meta = train_run(ds, spec, TrainConfig(epochs=10, batch_size=32, lr=0.1, seed=0), out=tmp / "orig", splits=splits)
    pre = meta["preprocessing"]
    scaler = _write(tmp / "scaler.json", json.dumps({"mean": pre["mean"], "scale": pre["scale"]}))
    spec_file = _write(tmp / "spec.json", json.dumps(spec.to_dict()))
    return {
        "dir": tmp,
        "weights": tmp / "orig" / WEIGHTS_FILE,
        "spec": spec_file,
        "scaler": scaler,
        "members": _member_file(tmp / "members.txt", members),
        "wrong": _member_file(tmp / "wrong.txt", np.arange(600, 1200)),  # the records it never saw
        "meta": meta,
        "n": len(ds),
    }


def _import(foreign, out, members, *extra):
    return invoke(
        "import", foreign["weights"], "--model-spec", foreign["spec"], "--data", "digits", "--members", members,
        "--preprocessing", foreign["scaler"], "--out", out, *extra,
    )  # fmt: skip


def test_right_members_not_flagged_and_scaler_used_as_given(foreign, tmp_path):
    out = tmp_path / "right"
    r = _import(foreign, out, foreign["members"])
    assert r.exit_code == 0, r.output
    assert "warning" not in r.stderr
    meta = _meta(out)
    check = meta["import"]["member_check"]
    assert check["suspicious"] is False and check["train_loss"] < check["holdout_loss"]
    # The user's scaler, used as given (nothing refitted): the members' metrics are the original run's.
    assert meta["preprocessing"]["fitted_on"] == "user"
    # Exact on CPU; on a GPU (TF32 matmuls) a record at the decision boundary may flip, so the accuracy
    # may move by one record of the 600 members and the mean loss by a relative 1e-4.
    gpu = torch.cuda.is_available()
    assert meta["metrics"]["train_accuracy"] == pytest.approx(
        foreign["meta"]["metrics"]["train_accuracy"], abs=1 / 600 if gpu else 1e-12
    )
    assert meta["metrics"]["train_loss"] == pytest.approx(
        foreign["meta"]["metrics"]["train_loss"], rel=1e-4 if gpu else 1e-6
    )
    run = load_run(out)
    np.testing.assert_array_equal(run.splits.members, np.arange(600))
    # Non-members split 40/40/20 (rounded down), disjoint, covering every other record.
    rest = foreign["n"] - 600
    sizes = run.meta["split"]["sizes"]
    assert sizes["holdout"] == math.floor(IMPORT_NON_MEMBER_SHARES["holdout"] * rest)
    assert sizes["aux"] == math.floor(IMPORT_NON_MEMBER_SHARES["aux"] * rest)
    parts = np.concatenate([run.splits.holdout, run.splits.aux, run.splits.test])
    np.testing.assert_array_equal(np.sort(parts), np.arange(600, foreign["n"]))
    assert meta["training"]["algo"] == "imported" and meta["privacy"] is None


def test_a_factory_spec_of_another_shape_is_refused_as_that_before_its_forward_runs(tmp_path):
    """`import` with a residual CNN's spec written channels-last ([8, 8, 3]) for N x 3 x 8 x 8 records: the line was
    the factory's forward failing on [2, 8, 8, 3] (torch's "expected input ... to have 3 channels"); now the shapes."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", X=rng.normal(size=(40, 3, 8, 8)).astype(np.float32), y=np.arange(40) % 2)
    spec = {"kind": "python", "factory": "tests.core.byo_models:residual_groupnorm_cnn", "n_classes": 2,
            "kwargs": {"channels": 3, "n_classes": 2}, "input_shape": [8, 8, 3]}  # fmt: skip
    _write(tmp_path / "spec.json", json.dumps(spec))
    weights = tmp_path / "w.safetensors"
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(weights))
    r = invoke("import", weights, "--model-spec", tmp_path / "spec.json", "--data", tmp_path / "d.npz",
               "--members", _member_file(tmp_path / "m.txt", range(20)), "--out", tmp_path / "run")  # fmt: skip
    assert r.exit_code == 2 and error_lines(r) == [
        f"error: {tmp_path / 'spec.json'}: the model spec has input_shape [8, 8, 3] but the data's records have "
        "shape [3, 8, 8]"
    ], r.output


def test_member_line_gives_the_rank_test_the_check_decides_on(foreign, tmp_path):
    """The summary's members line shows the check's own numbers (AUC and p of the rank test), not only the means:
    "loss 0.5895 vs holdout 0.691 (member check inconclusive)" read as a contradiction (a few large holdout losses
    lift the mean while a member's loss is lower with probability 0.512, p = 0.163)."""
    from dpaudit import numfmt

    for name, members in (("right", foreign["members"]), ("wrong", foreign["wrong"])):
        out = tmp_path / name
        r = _import(foreign, out, members, "--quiet")
        assert r.exit_code == 0, r.output
        check = _meta(out)["import"]["member_check"]
        line = next(x for x in r.stdout.splitlines() if x.startswith("members "))
        ranks = f"a member's loss is lower with probability {check['auc']:.3f} ({numfmt.p_value(check['p_value'])})"
        assert ranks in line, line


def test_wrong_members_flagged_and_noted_on_estimates(foreign, tmp_path):
    from dpaudit.workflows import audit_checkpoint

    out = tmp_path / "wrong"
    r = _import(foreign, out, foreign["wrong"], "--quiet")
    assert r.exit_code == 0, r.output
    # A check's finding is part of the result: --quiet hides progress, never the warning the
    # summary line ("SUSPICIOUS: see the warning") points to.
    assert "warning: imported member list looks wrong" in r.stderr
    assert "SUSPICIOUS: see the warning" in r.stdout
    check = _meta(out)["import"]["member_check"]
    assert check["suspicious"] is True and check["train_loss"] > check["holdout_loss"]
    assert check["auc"] < 0.5
    audit = audit_checkpoint(out, attacks=("loss",))
    assert [check["note"] in a.result.notes for a in audit.audits] == [True]
    right = tmp_path / "right"
    assert _import(foreign, right, foreign["members"]).exit_code == 0
    audit = audit_checkpoint(right, attacks=("loss",))
    assert not any("member list looks wrong" in n for a in audit.audits for n in a.result.notes)


def test_imported_without_recipe_loss_and_report_work_lira_names_recipe(foreign, tmp_path):
    out = tmp_path / "run"
    assert _import(foreign, out, foreign["members"], "--epsilon", "3", "--delta", "1e-5").exit_code == 0
    r = invoke("audit", "checkpoint", out, "--attacks", "loss", "--json")
    assert r.exit_code == 0, r.output
    r = invoke("report", out, "--out", tmp_path / "rep", "--attacks", "loss", "--format", "json")
    assert r.exit_code == 0, r.output
    model = json.loads((tmp_path / "rep" / "report.json").read_text())["models"][0]
    assert model["claim"]["epsilon"] == 3.0 and model["claim"]["source"] == "stated by the user"
    assert model["claim"]["event"] is None
    r = invoke("audit", "checkpoint", out, "--attacks", "lira", "--reference-models", "4")
    assert r.exit_code == 2 and "--recipe" in r.stderr and "Traceback" not in r.output


def test_legacy_mode_warns_that_members_are_assumed(foreign, tmp_path):
    # The old invocation (no --data, no --members) still works, with a warning.
    r = invoke("import", foreign["weights"], "--model-spec", foreign["spec"], "--out", tmp_path / "legacy")
    assert r.exit_code == 0, r.output
    assert "warning: no member list given: assuming" in r.stderr
    meta = _meta(tmp_path / "legacy")
    assert meta["import"]["members"].startswith("assumed") and meta["preprocessing"]["fitted_on"] == "members"


# --------------------------------------------------------------------------- bad input: exit 2, one line


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    ds = load_dataset("digits")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    from safetensors.torch import save_file

    save_file(build_model(spec, seed=0).state_dict(), str(tmp / "w.safetensors"))
    f = {"dir": tmp, "weights": tmp / "w.safetensors", "spec": _write(tmp / "spec.json", json.dumps(spec.to_dict()))}
    f["members"] = _member_file(tmp / "members.txt", range(0, 1000, 2))
    for name, array in (("float.npy", np.arange(10, dtype=np.float64)), ("object.npy", np.array([1, "a"], object))):
        np.save(tmp / name, array, allow_pickle=True)  # the object array is pickled: what a stranger might send
        f[name] = tmp / name
    texts = {
        "out_of_range.txt": "idx\n0\n5\n1797\n",
        "negative.txt": "-1\n3\n",
        "duplicates.txt": "idx\n1\n2\n2\n",
        "empty.txt": "idx\n",
        "all.txt": "\n".join(map(str, range(1797))),
        "words.txt": "idx\n1\nabc\n",
        "float.txt": "1\n2.5\n",
        "claim_bad_delta.json": '{"epsilon": 1, "delta": 2}',
        "claim_unknown.json": '{"epsilon": 1, "delta": 1e-5, "sigma": 1}',
        "claim_no_delta.json": '{"epsilon": 1}',
        "claim_partial.json": '{"delta": 1e-5, "noise_multiplier": 1.0}',
        "scaler_short.json": '{"mean": [0, 1], "scale": [1, 1]}',
        "scaler_zero.json": json.dumps({"mean": [0.0] * 64, "scale": [0.0] * 64}),
        "recipe_no_lr.json": '{"algo": "sgd", "epochs": 3, "batch_size": 32}',
        "recipe_dp_no_sigma.json": '{"algo": "dpsgd", "epochs": 3, "lr": 1, "batch_size": 32, "clip": 1}',
        "recipe_unknown.json": '{"algo": "rmsprop", "epochs": 3, "lr": 1, "batch_size": 32}',
        "spec_classes.json": json.dumps({**spec.to_dict(), "n_classes": 3}),
        "not_json.json": "{",
    }
    for name, text in texts.items():
        f[name] = _write(tmp / name, text)
    return f


BAD = [
    (["--members", "out_of_range.txt"], "out of range for data of 1797 records"),
    (["--members", "negative.txt"], "out of range"),
    (["--members", "duplicates.txt"], "listed more than once: 2"),
    (["--members", "empty.txt"], "the member list is empty"),
    (["--members", "all.txt"], "covers all 1797 records"),
    (["--members", "words.txt"], "line 3: expected a record index"),
    (["--members", "float.txt"], "line 2: expected a record index"),
    (["--members", "float.npy"], "expected an integer array"),
    (["--members", "object.npy"], "object arrays are refused"),
    (["--members", "missing.txt"], "no such file"),
    (["--epsilon", "1", "--delta", "0"], "expected --delta in (0, 0.1], got 0"),
    (["--epsilon", "1", "--delta", "0.5"], "expected --delta in (0, 0.1], got 0.5 (a larger"),
    (["--epsilon", "-1", "--delta", "1e-5"], "expected --epsilon >= 0, got -1"),
    (["--epsilon", "1"], "--epsilon needs --delta"),
    (["--claim", "claim_bad_delta.json", "--epsilon", "1"], "--claim and --epsilon are mutually exclusive"),
    (["--claim", "claim_bad_delta.json"], "field 'delta': expected in (0, 0.1], got 2"),
    (["--claim", "claim_unknown.json"], "unknown field(s) sigma"),
    (["--claim", "claim_no_delta.json"], "missing 'delta'"),
    (["--claim", "claim_partial.json"], "go together; missing sample_rate, steps"),
    (["--claim", "not_json.json"], "not valid JSON"),
    (["--noise-multiplier", "1", "--delta", "1e-5"], "go together; missing --sample-rate, --steps"),
    (["--noise-multiplier", "0", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5"], "> 0, got 0"),
    (["--noise-multiplier", "1", "--sample-rate", "1.5", "--steps", "10", "--delta", "1e-5"], "in (0, 1]"),
    (
        ["--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5", "--accountant", "gdp"],
        "unknown --accountant 'gdp'; valid: rdp, pld",
    ),
    (["--epsilon", "1", "--delta", "1e-5", "--neighbouring", "swap"], "valid: add_remove, replace_one"),
    (["--preprocessing", "scaler_short.json"], "'mean' has 2 values but the data has 64 features"),
    (["--preprocessing", "scaler_zero.json"], "'scale' must be positive"),
    (["--preprocessing", "standardize"], "would fit a scaler"),
    (["--preprocessing", "zscore"], "unknown --preprocessing 'zscore'"),
    (["--recipe", "recipe_no_lr.json"], "missing lr"),
    (["--recipe", "recipe_dp_no_sigma.json"], "needs noise_multiplier"),
    (["--recipe", "recipe_unknown.json"], "unknown algo 'rmsprop'"),
    (["--model-spec", "spec_classes.json"], "n_classes 3 but the data 'digits' has 10 classes"),
    (["--split", "0.5,0.2,0.2,0.1"], "--split applies only without --members"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[f"{i}-{m[:24]}" for i, (_, m) in enumerate(BAD)])
def test_bad_input_exit_2_one_line(files, tmp_path, args, message):
    args = [str(files["dir"] / a) if a in files or a == "missing.txt" else a for a in args]
    base = {"--model-spec": files["spec"], "--members": files["members"]}
    for key in list(base):
        if key in args:
            base.pop(key)
    base_args = [x for kv in base.items() for x in kv]
    out = tmp_path / "run"
    r = invoke("import", files["weights"], "--data", "digits", "--out", out, *base_args, *args)
    assert r.exit_code == 2, r.output
    lines = error_lines(r)
    assert len(lines) == 1 and r.stderr.strip().splitlines()[-1] == lines[0], r.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in r.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "digits"], "--data needs --members"),
        (["--members", "members.txt"], "--members needs --data"),
    ],
)
def test_data_and_members_go_together(files, tmp_path, args, message):
    args = [str(files["dir"] / a) if a in files else a for a in args]
    r = invoke("import", files["weights"], "--model-spec", files["spec"], "--out", tmp_path / "run", *args)
    assert r.exit_code == 2 and len(error_lines(r)) == 1 and message in error_lines(r)[0], r.output


def test_member_file_formats(tmp_path):
    """Header line, blank lines, any order, CRLF; .npy of any integer dtype; results sorted."""
    a = read_member_indices(_write(tmp_path / "m.csv", "index\r\n5\r\n\r\n1\r\n3\r\n"), 10)
    np.save(tmp_path / "m.npy", np.array([5, 1, 3], dtype=np.int32))
    b = read_member_indices(tmp_path / "m.npy", 10)
    np.testing.assert_array_equal(a, [1, 3, 5])
    np.testing.assert_array_equal(b, [1, 3, 5])
    with pytest.raises(DataError, match="line 3"):  # only the first line may be a header
        read_member_indices(_write(tmp_path / "h.txt", "index\n1\nindex\n"), 10)
    mask = np.zeros(10, bool)
    mask[[1, 3, 5]] = True  # a 0/1 flag per record (an "in_train" column), not indices: was read as indices 0 and 1
    np.save(tmp_path / "mask.npy", mask)
    for path in (_write(tmp_path / "mask.txt", "".join(f"{int(v)}\n" for v in mask)), tmp_path / "mask.npy"):
        with pytest.raises(DataError, match=r"one 0/1 value per record \(10\), a membership mask.*flatnonzero"):
            read_member_indices(path, 10)
    s = splits_from_members(10, a, seed=0)
    assert s.sizes() == {"members": 3, "holdout": 2, "aux": 2, "test": 3}
    assert s == s and splits_from_members(10, a, seed=0).holdout.tolist() == s.holdout.tolist()  # seeded


# --------------------------------------------------------------------------- the claim


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("epsilon", True, "field 'epsilon': expected a number or null, got bool True"),  # was read as ε = 1
        ("epsilon", "1", "field 'epsilon': expected a number or null, got str 1"),
        ("noise_multiplier", "1", "field 'noise_multiplier': expected a number or null, got str"),
        ("delta", True, "field 'delta': expected a number, got bool True"),
        ("accountant", 1, "field 'accountant': expected a string or null, got int"),
    ],
)
def test_a_claim_json_field_of_another_json_type_is_refused(field, value, message):
    from dpaudit.errors import InputError

    """A stranger's claim.json with "epsilon": true or "1" (or σ as a string) was taken as the number 1: a claim the
    file never stated, tested and recorded as stated. Now its JSON types are checked (null: the field absent)."""
    d = {"delta": DELTA, "noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 10, field: value}
    with pytest.raises(InputError, match=re.escape(f"claim.json: {message}")):
        StatedClaim.from_dict(d, "claim.json")
    assert StatedClaim.from_dict({"epsilon": 1, "delta": DELTA, "steps": None}, "claim.json").epsilon == 1


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("lr", True, "field 'lr': expected a number or null, got bool True"),  # was lr = 1.0
        ("noise_multiplier", "1", "field 'noise_multiplier': expected a number or null, got str 1"),
        ("clip", True, "field 'clip': expected a number or null, got bool True"),
        ("batch_size", 8.0, "field 'batch_size': expected an integer or null, got float 8.0"),
        ("algo", 1, "field 'algo': expected a string or null, got int 1"),
    ],
)
def test_a_recipe_json_field_of_another_json_type_is_refused(field, value, message):
    """A stranger's recipe.json (how LiRA's reference models are trained) with "lr": true or "noise_multiplier": "1"
    was read as the number 1."""
    from dpaudit.errors import InputError

    d = {"algo": "dpsgd", "epochs": 1, "lr": 1.0, "batch_size": 8, "clip": 1.0, "noise_multiplier": 1.0}
    assert recipe_from_dict(d, "recipe.json").batch_size == 8
    with pytest.raises(InputError, match=re.escape(f"recipe.json: {message}")):
        recipe_from_dict({**d, field: value}, "recipe.json")


def test_claim_never_under_reported():
    sigma, q, steps = 1.0, 0.1, 100
    accounted = epsilon_for(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps), DELTA, "rdp")
    assert accounted > 7  # so that a stated 1.0 is an under-report
    stated = StatedClaim(delta=DELTA, epsilon=1.0, noise_multiplier=sigma, sample_rate=q, steps=steps)
    claim, warned = claim_record(stated, dataset_size=600)
    assert claim["epsilon"] == accounted and claim["accounted_epsilon"] == accounted and claim["stated_epsilon"] == 1
    assert len(warned) == 1 and "never under-reported" in warned[0]
    # The event is recomputable: anyone re-accounting it gets the recorded ε.
    assert epsilon_for(event_from_dict(claim["event"]), DELTA, claim["accountant"]) == claim["epsilon"]
    # A stated ε above the accountant's is the user's (weaker) claim: the larger is recorded, no warning.
    claim, warned = claim_record(
        StatedClaim(delta=DELTA, epsilon=20.0, noise_multiplier=sigma, sample_rate=q, steps=steps), dataset_size=600
    )
    assert claim["epsilon"] == 20.0 and claim["accounted_epsilon"] == accounted and warned == ()
    # PLD gives its own (tighter) ε for the same event.
    claim, _ = claim_record(
        StatedClaim(delta=DELTA, noise_multiplier=sigma, sample_rate=q, steps=steps, accountant="pld"), dataset_size=600
    )
    assert claim["epsilon"] == epsilon_for(
        dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps), DELTA, "pld"
    )
    assert claim["epsilon"] < accounted


def test_replace_one_claim_is_the_shuffle_analysis():
    claim, _ = claim_record(
        StatedClaim(delta=DELTA, noise_multiplier=2.0, sample_rate=0.1, steps=101, neighbouring="replace_one"),
        dataset_size=1000,
    )
    # 101 steps of 10 per epoch touch 11 epochs: one Gaussian each, sensitivity 2C (replace-one).
    event = SelfComposed(Gaussian(2.0), 11)
    assert claim["event"] == event.to_dict() and claim["sampling"] == "shuffle"
    assert claim["epsilon"] == epsilon_for(event, DELTA, "rdp", neighbouring="replace_one")
    # 1/q in floats: 1/(1/49) = 49.00000000000001; an epoch is still 49 steps, so 99 steps touch 3 epochs.
    assert 1 / (1 / 49) > 49 and _shuffle_epochs(1 / 49, 99) == 3


def test_replace_one_claim_counts_the_epochs_of_a_loop_that_drops_the_last_batch():
    # N = 1000, B = 300 (q = 0.3): fixed-size batches drop the last 100 records, so an epoch is 3 steps and
    # 12 steps touch 4 epochs (⌈1/q⌉ = 4 steps per epoch counted 3: ε 9.01 instead of 10.73 at σ = 2).
    claim, _ = claim_record(
        StatedClaim(delta=DELTA, noise_multiplier=2.0, sample_rate=0.3, steps=12, neighbouring="replace_one"),
        dataset_size=1000,
    )
    assert claim["epochs_touched"] == 4
    assert claim["event"] == SelfComposed(Gaussian(2.0), 4).to_dict()
    # q as the decimal given: 1/0.1 is 10 steps per epoch (not 9 from the float's binary value 0.1000…0555).
    assert _shuffle_epochs(0.1, 100) == 10 and _shuffle_epochs(0.7, 3) == 3


def test_cli_claim_under_reported_is_raised_and_warned(foreign, tmp_path):
    out = tmp_path / "run"
    r = _import(
        foreign, out, foreign["members"],
        "--epsilon", "1", "--delta", "1e-5", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "100",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "warning: the stated ε = 1 is smaller than" in r.stderr
    privacy = _meta(out)["privacy"]
    assert privacy["epsilon"] == epsilon_for(dpsgd_event(noise_multiplier=1, sample_rate=0.1, steps=100), DELTA)


def test_recipe_fields():
    config = recipe_from_dict(
        {"optimizer": "dpadam", "steps": 50, "lr": 0.01, "batch_size": 32, "clip": 0.5, "noise_multiplier": 1.2},
        "r.json",
        delta=1e-6,
    )
    assert (config.algo, config.steps, config.dp.clip, config.dp.noise_multiplier, config.dp.delta) == (
        "dpadam", 50, 0.5, 1.2, 1e-6,
    )  # fmt: skip
    with pytest.raises(Exception, match="apply only to a private recipe"):
        recipe_from_dict({"algo": "sgd", "epochs": 1, "lr": 1, "batch_size": 8, "clip": 1}, "r.json")


# --------------------------------------------------------------------------- Opacus end to end


@pytest.mark.peers
def test_opacus_model_import_audit_report(tmp_path):
    """An Opacus DP-SGD model (Poisson sampling) trained on a member subset of digits: imported with
    its ``_module.``-prefixed state_dict, member list and (σ, q, T); LiRA runs with a recipe; the
    report shows dpaudit's accountant's ε for those parameters."""
    pytest.importorskip("opacus")
    from opacus import PrivacyEngine
    from safetensors.torch import save_file

    ds = load_dataset("digits")
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes, hidden=(64,))
    members = np.sort(np.random.default_rng(0).choice(len(ds), 600, replace=False))
    X = torch.as_tensor(np.array(ds.X[members]))
    y = torch.as_tensor(ds.y[members])
    model = build_model(spec, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=60)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus' notes about secure RNG and hooks
        engine = PrivacyEngine(accountant="rdp")
        model, optimizer, loader = engine.make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
            poisson_sampling=True,
        )  # fmt: skip
        for _ in range(10):
            for xb, yb in loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                optimizer.step()
    [(sigma, q, steps)] = engine.accountant.history
    state = model.state_dict()
    assert all(k.startswith("_module.") for k in state)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp_path / "opacus.safetensors"))
    _member_file(tmp_path / "members.txt", members)
    _write(tmp_path / "spec.json", json.dumps(spec.to_dict()))
    recipe = {"algo": "dpsgd", "epochs": 10, "lr": 1.0, "batch_size": 60, "clip": 1.0, "noise_multiplier": sigma}
    _write(tmp_path / "recipe.json", json.dumps(recipe))

    out = tmp_path / "runs" / "opacus"
    r = invoke(
        "import", tmp_path / "opacus.safetensors", "--model-spec", tmp_path / "spec.json", "--data", "digits",
        "--members", tmp_path / "members.txt", "--noise-multiplier", sigma, "--sample-rate", q, "--steps", steps,
        "--delta", DELTA, "--recipe", tmp_path / "recipe.json", "--out", out,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    accounted = epsilon_for(dpsgd_event(noise_multiplier=sigma, sample_rate=q, steps=steps), DELTA, "rdp")
    meta = _meta(out)
    assert meta["privacy"]["epsilon"] == accounted
    assert meta["privacy"]["epsilon"] == pytest.approx(engine.get_epsilon(DELTA), rel=2e-2)  # Opacus' own RDP
    assert meta["training"]["recipe_source"].startswith("user") and meta["preprocessing"]["fitted_on"] == "none"
    # The imported model is the Opacus model: same outputs on every record.
    run = load_run(out)
    with torch.no_grad():
        theirs = model(torch.as_tensor(np.array(ds.X))).double().numpy()
    np.testing.assert_allclose(run.logits(ds.X), theirs, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(run.splits.members, members)

    cache = tmp_path / "cache"
    r = invoke(
        "audit", "checkpoint", out, "--attacks", "loss,lira", "--reference-models", 4, "--cache-dir", cache, "--json"
    )
    assert r.exit_code == 0, r.output
    # Reference models used the imported run's preprocessing (none), not a scaler fitted by dpaudit.
    ref = [json.loads(p.read_text())["preprocessing"] for p in (cache / "models").glob(f"*/{CHECKPOINT_FILE}")]
    assert len(ref) == 4 and all(p == {"kind": "identity", "fitted_on": "given"} for p in ref)
    r = invoke(
        "report", out, "--out", tmp_path / "report", "--attacks", "loss,lira", "--reference-models", 4,
        "--cache-dir", cache,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    model_entry = json.loads((tmp_path / "report" / "report.json").read_text())["models"][0]
    assert model_entry["claim"]["epsilon"] == accounted
    assert [a["attack"] for a in model_entry["attacks"]["membership"]] == ["loss", "lira"]
    assert model_entry["summary"]["estimate"] is not None
    md = (tmp_path / "report" / "report.md").read_text()
    assert re.search(r"claim: ε = 7\.9\d*, δ = 1e-05, accountant rdp", md), md


# --------------------------------------------------------------------------- docs/model-spec.md


DOC = Path(__file__).resolve().parents[2] / "docs" / "model-spec.md"


def _doc_blocks() -> list[tuple[str, str]]:
    doc = DOC.read_text()
    return re.findall(r"```(json|text)\n(.*?)```", doc, flags=re.S)


def test_model_spec_doc_examples_are_right():
    """Every spec example is what ``default_spec(...).to_dict()`` gives (all fields spelled out) and the
    parameter list after it is ``build_model(spec).state_dict()``'s; every model kind is shown; the
    claim, scaler and recipe examples parse."""
    from dpaudit.data import standardizer_from_json
    from dpaudit.models import MODEL_KINDS, model_spec_from_dict

    blocks = _doc_blocks()
    kinds = []
    for i, (lang, body) in enumerate(blocks):
        if lang != "json":
            continue
        d = json.loads(body)
        if "kind" in d:
            spec = model_spec_from_dict(d)
            # a python spec adds the hash of its factory's source file, which the doc cannot pin
            assert {k: v for k, v in spec.to_dict().items() if k != "source_sha256"} == d
            kinds.append(spec.kind)
            lang_next, params = blocks[i + 1]
            expected = [f"{k} {list(v.shape)}" for k, v in build_model(spec).state_dict().items()]
            assert lang_next == "text" and params.strip().splitlines() == expected
        elif "mean" in d:
            standardizer_from_json(d, (3,), "doc")
        elif "algo" in d:
            recipe_from_dict(d, "doc")
        else:
            claim, warned = claim_record(StatedClaim.from_dict(d, "doc"), dataset_size=1000)
            assert warned == ()
            if "noise_multiplier" in d:  # the doc's number is the accountant's
                assert f"ε = {claim['epsilon']:.2f} at δ = 1e-5" in DOC.read_text()
    assert sorted(kinds) == sorted(MODEL_KINDS)


def test_import_help_points_to_the_docs():
    r = invoke("import", "--help")
    assert r.exit_code == 0 and "docs/model-spec.md" in r.output and "40%" in r.output


def test_a_per_channel_scaler_normalises_each_channel_of_images():
    """torchvision's Normalize(mean, std) for CIFAR-shaped images: one value per channel, applied to every
    pixel of that channel; any other count than C or C*H*W is refused naming both."""
    from dpaudit.data import standardizer_from_json
    from dpaudit.errors import InputError

    mean, std = [0.5, 0.25, 0.125], [2.0, 4.0, 8.0]
    pre = standardizer_from_json({"mean": mean, "scale": std}, (3, 2, 2), "scaler.json")
    x = np.arange(2 * 12, dtype=np.float32).reshape(2, 3, 2, 2)
    expected = (x - np.array(mean, np.float32)[:, None, None]) / np.array(std, np.float32)[:, None, None]
    np.testing.assert_array_equal(pre.transform(x), expected)
    with pytest.raises(InputError, match=r"'mean' has 2 values but the data has 12 features \(or 3, one per channel\)"):
        standardizer_from_json({"mean": [0, 0], "scale": [1, 1]}, (3, 2, 2), "scaler.json")


@pytest.mark.parametrize(
    ("mean", "scale", "message"),
    [
        # scale 1e-46 is 0 in float32: features inf, refused as "the model gives NaN or infinite outputs", blaming
        # the weights, after two NumPy RuntimeWarning lines; 1e39 is inf there: the feature read as 0, silently
        (0.0, 1e-46, "'scale' holds 1e-46, outside 1.175e-38 to 3.403e+38, float32's normal range"),
        (0.0, 1e39, "'scale' holds 1e+39, outside 1.175e-38 to 3.403e+38, float32's normal range"),
        (-1e39, 1.0, "'mean' holds 1e+39, beyond 3.403e+38, the largest float32"),
    ],
)
def test_a_scaler_beyond_float32_is_refused_naming_the_field(mean, scale, message):
    from dpaudit.data import standardizer_from_json
    from dpaudit.errors import InputError

    with pytest.raises(InputError, match=re.escape(f"scaler.json: {message}")):
        standardizer_from_json({"mean": [mean, 0.0], "scale": [scale, 1.0]}, (2,), "scaler.json")
    assert standardizer_from_json({"mean": [3e38, 0], "scale": [2e-38, 3e38]}, (2,), "scaler.json")  # within: read


def test_the_under_reported_claim_warning_names_the_mechanism_as_given():
    # σ = 1.0000004 printed as "σ = 1" (':g') beside the ε of σ = 1.0000004, which is below σ = 1's.
    stated = StatedClaim(delta=DELTA, epsilon=0.1, noise_multiplier=1.0000004, sample_rate=0.0123456789, steps=10)
    _, warned = claim_record(stated, dataset_size=1000)
    assert "σ = 1.0000004, q = 0.0123456789, T = 10" in warned[0]


def test_import_evaluates_each_record_once_with_a_progress_stage(foreign, tmp_path, monkeypatch):
    """`dpaudit import --data` evaluated the members and holdout twice (the member check, then the metrics) and said
    nothing meanwhile: on 20,000 CIFAR-size images 2 x 12,200 records through the model without a line. Now one brief
    "evaluate the model" stage (as after training: silent unless it lasts, here INTERVAL_S = 0) runs each record of
    the members, holdout and test through the model once; the member check and the metrics read its logits."""
    from dpaudit.progress import PlainProgress
    from dpaudit.training.run import FittedModel

    monkeypatch.setattr(PlainProgress, "INTERVAL_S", 0.0)
    monkeypatch.setattr("dpaudit.checkpoint.EVAL_BATCH_ROWS", 256)  # several batches of digits
    rows = []
    logits = FittedModel.logits
    monkeypatch.setattr(
        FittedModel, "logits", lambda self, X, advance=None: rows.append(len(X)) or logits(self, X, advance)
    )
    out = tmp_path / "run"
    r = _import(foreign, out, foreign["members"])
    assert r.exit_code == 0, r.output
    sizes = _meta(out)["split"]["sizes"]
    n = sizes["members"] + sizes["holdout"] + sizes["test"]
    assert sum(rows) == n + 256  # and the first 256 members' finite-output check before
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("dpaudit: evaluate the model")]
    assert re.fullmatch(rf"dpaudit: evaluate the model: \d+/{n} after \d+ s, about \d+ s left", lines[0]), r.stderr
    assert re.fullmatch(r"dpaudit: evaluate the model: done in \d+\.\d s", lines[-1]), r.stderr


def test_metrics_name_each_split_by_its_own_logits_and_an_empty_split_none():
    """The metrics of a run (train, import) come from one evaluation of the members, holdout and test: each split's
    accuracy and loss are its own, those of evaluate() on it, and an empty split's are None (mutants: holdout and
    test swapped in the metrics' table, or an empty split left out of the logits (KeyError), passed the fast tier:
    no test read the metrics' values or had an empty split)."""
    from dpaudit.data import load_dataset, make_splits
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import evaluate, fit_model, metrics_for

    ds = load_dataset("synthetic:n=300,d=4,classes=3,seed=2,sep=0.3")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    for fractions in ((0.4, 0.2, 0.1, 0.3), (0.5, 0.3, 0.2, 0.0)):
        splits = make_splits(len(ds), 0, fractions)
        fitted = fit_model(ds, splits.members, spec, TrainConfig(epochs=2, batch_size=32, seed=0))
        got = metrics_for(fitted, ds, splits)
        for label, idx in (("train", splits.members), ("holdout", splits.holdout), ("test", splits.test)):
            want = evaluate(fitted, ds, idx)
            assert (got[f"{label}_accuracy"], got[f"{label}_loss"]) == (want["accuracy"], want["loss"]), label
        assert (got["test_loss"] is None) == (fractions[3] == 0)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ("missing.safetensors", "no such file"),
        ("w.pkl", "refusing to load a pickle file (it can run arbitrary code); use safetensors"),
        (".", "a directory, not a regular file"),
    ],
)
def test_weights_are_checked_first_as_the_command_reads(tmp_path, monkeypatch, weights, message):
    # Before: `import no-such-file --model-spec ... --data missing.npz --members ...` named the data's problem (and
    # with good data, the spec's and the members'), the WEIGHTS argument's only after all of them were read.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.pkl").write_bytes(b"")
    r = invoke("import", weights, "--model-spec", "nospec.json", "--data", "nodata.npz", "--members", "m.txt",
               "--out", "run")  # fmt: skip
    assert r.exit_code == 2 and error_lines(r) == [f"error: {weights}: {message}"], r.output
    assert not (tmp_path / "run").exists()


def test_a_gate_on_an_imported_runs_estimates_names_the_formal_audits_an_imported_run_can_have(foreign, tmp_path):
    """`audit checkpoint runs/mine --fail-on-violation` on an imported run (estimates only) said "audit a formal
    design (independent runs: `dpaudit audit train`, ...; canaries included w.p. 1/2)" and the attack notes "train
    with canaries (`dpaudit train --canaries M`)": neither is open to weights trained elsewhere. The refusal names
    what is (thirteenth session's newcomer): the gradient canaries of the user's own loop, audited with --run, or
    record canaries registered at import. Planted: the imported run's advice dropped (the generic one printed)."""
    out = tmp_path / "mine"
    assert _import(foreign, out, foreign["members"], "--epsilon", "1", "--delta", "1e-5").exit_code == 0
    r = invoke("audit", "checkpoint", out, "--attacks", "loss", "--fail-on-violation")
    assert r.exit_code == 2, r.output
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert f"gradient canaries in your own loop (`dpaudit audit canaries DIR --run {out} --fail-on-violation`" in line
    assert "`dpaudit import --canaries DIR`" in line and "dpaudit audit train" not in line
