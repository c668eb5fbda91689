"""Bring your own model (a spec of kind ``python``: a factory) and data (NPZ, a directory of .npy files
memory-mapped and streamed batch by batch).

Oracles: a module not in the zoo goes through train -> attack (loss, LiRA with 4 reference models) ->
audit -> report -> inspect with the commands a zoo model uses, and so do its weights trained by a plain
torch loop and imported; streamed training is bit-identical to training on the same rows in memory; the
chunked content hash equals the hash of all bytes at once; resident memory while streaming a
memory-mapped file stays far below the file's size. Every bad input is one line, exit code 2, nothing
written.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch.nn import functional as F

from dpaudit.checkpoint import CHECKPOINT_FILE, load_run
from dpaudit.data import Standardizer, load_dataset
from dpaudit.errors import CheckpointError, InputError
from dpaudit.models import PythonSpec, build_model, model_spec_from_dict
from dpaudit.training.config import DPConfig, TrainConfig
from dpaudit.training.run import fit_model
from tests.core.cli_errors import invoke, one_error

ROOT = Path(__file__).resolve().parents[2]
FACTORY = "tests.core.byo_models:residual_mlp"
D, K = 6, 2


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # factories are imported from the current directory, as with --trainer


def _data(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(np.float32)
    y = (X[:, 0] + 0.5 * X[:, 1] > 0) ^ (rng.random(n) < 0.2)  # 20% label noise: something to memorise
    return X, y.astype(np.int64)


def _spec_file(path: Path, factory: str = FACTORY, **kwargs) -> Path:
    spec = {"kind": "python", "factory": factory, "kwargs": {"d": D, "n_classes": K, **kwargs}}
    path.write_text(json.dumps({**spec, "input_shape": [D], "n_classes": K}))
    return path


@pytest.fixture(scope="module")
def npz(tmp_path_factory) -> Path:
    X, y = _data()
    path = tmp_path_factory.mktemp("byo") / "data.npz"
    np.savez(path, X=X, y=y)
    return path


# --------------------------------------------------------------------------- acceptance: dpaudit-trained


def test_factory_module_trains_dp_and_is_attacked_audited_reported(npz, tmp_path):
    spec = _spec_file(tmp_path / "spec.json")
    run = tmp_path / "run"
    r = invoke(
        "train", "--data", npz, "--model-spec", spec, "--algo", "dpsgd", "--epsilon", 4,
        "--epochs", 2, "--batch-size", 32, "--lr", 0.5, "--out", run,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    meta = json.loads((run / CHECKPOINT_FILE).read_text())
    assert meta["model"]["kind"] == "python" and meta["model"]["factory"] == FACTORY
    assert meta["model"]["kwargs"] == {"d": D, "n_classes": K}
    import hashlib

    source = (ROOT / "tests" / "core" / "byo_models.py").read_bytes()
    assert meta["model"]["source_sha256"] == hashlib.sha256(source).hexdigest()
    assert meta["privacy"]["epsilon"] == pytest.approx(4, rel=1e-3) and meta["privacy"]["epsilon"] <= 4
    loaded = load_run(run)
    assert type(loaded.model).__name__ == "ResidualMLP"

    r = invoke("attack", "mia", run, "--attacks", "loss,lira", "--reference-models", 4, "--min-models", 2, "--json")
    assert r.exit_code == 0, r.output
    attacks = {a["attack"]: a for a in json.loads(r.stdout)["attacks"]}
    assert set(attacks) == {"loss", "lira"}
    # the reference models were built by the same factory: their cached checkpoints say so
    cache = Path(__import__("os").environ["DPAUDIT_CACHE_DIR"]) / "models"
    # (the session's cache also holds other tests' zoo models, which have no factory)
    kinds = {json.loads((p / CHECKPOINT_FILE).read_text())["model"].get("factory") for p in cache.iterdir()}
    assert FACTORY in kinds

    r = invoke("audit", "checkpoint", run, "--attacks", "loss,lira", "--reference-models", 4, "--json")
    assert r.exit_code == 0, r.output
    r = invoke("report", run, "--out", tmp_path / "report", "--attacks", "loss,lira", "--reference-models", 4)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "report" / "report.json").is_file()
    r = invoke("inspect", run, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["model"] == "python"


# --------------------------------------------------------------------------- acceptance: the user's own loop


def test_weights_from_a_plain_torch_loop_import_and_are_attacked(npz, tmp_path):
    X, y = _data()
    members = np.arange(0, len(y), 2)
    torch.manual_seed(0)
    from tests.core.byo_models import residual_mlp

    model = residual_mlp(D, K, width=64)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    Xt, yt = torch.as_tensor(X[members]), torch.as_tensor(y[members])
    for _ in range(400):  # overfit, so the members are visibly members
        opt.zero_grad()
        F.cross_entropy(model(Xt), yt).backward()
        opt.step()
    weights = tmp_path / "weights.safetensors"
    save_file({f"_module.{k}": v.contiguous() for k, v in model.state_dict().items()}, str(weights))  # Opacus-style
    (tmp_path / "members.txt").write_text("\n".join(map(str, members)))
    (tmp_path / "recipe.json").write_text(json.dumps({"algo": "adam", "steps": 50, "lr": 0.02, "batch_size": 64}))
    run = tmp_path / "imported"
    r = invoke(
        "import", weights, "--model-spec", _spec_file(tmp_path / "spec.json", width=64), "--data", npz,
        "--members", tmp_path / "members.txt", "--recipe", tmp_path / "recipe.json", "--out", run, "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["import"]["member_check"]["suspicious"] is False
    loaded = load_run(run)
    own = model(torch.as_tensor(X[:20])).detach().double().numpy()
    np.testing.assert_allclose(loaded.logits(X[:20]), own, rtol=1e-6)
    r = invoke("attack", "mia", run, "--attacks", "loss,lira", "--reference-models", 4, "--min-models", 2, "--json")
    assert r.exit_code == 0, r.output
    auc = {a["attack"]: a["auc"] for a in json.loads(r.stdout)["attacks"]}
    assert auc["loss"] > 0.6  # the overfitted loop leaks
    r = invoke("report", run, "--out", tmp_path / "report", "--attacks", "loss")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("trainer", [None, "tests.core.byo_models:train_residual"])
def test_audit_train_takes_a_factory_spec(npz, tmp_path, trainer):
    args = ["--trainer", trainer, "--claimed-epsilon", 4, "--delta", 1e-5] if trainer else ["--noise-multiplier", 1]
    if trainer is None:
        args += ["--epochs", 1]
    r = invoke(
        "audit", "train", "--data", npz, "--model-spec", _spec_file(tmp_path / "spec.json"), "--runs", 4,
        "--allow-inconclusive", "--json", *args,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["verdict"] == "inconclusive"  # 4 runs per side certify nothing; it ran


def test_other_attacks_load_a_factory_run(trained_run):
    for args in (["extract", "-b", 200], ["attribute", "-f", 0], ["inversion"]):
        r = invoke("attack", args[0], trained_run, *args[1:])
        assert r.exit_code == 0, (args, r.output)


# --------------------------------------------------------------------------- bad input: one line, exit 2


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("tests.core.no_such_module_x:f", "cannot import module 'tests.core.no_such_module_x'"),
        ("tests.core.byo_models:NOT_CALLABLE", "is a int, not callable"),
        ("tests.core.byo_models:missing", "has no attribute 'missing'"),
        ("tests.core.byo_models:not_a_module", "returned a dict; expected a torch.nn.Module"),
        ("tests.core.byo_models:wrong_logits", "gives output [2, 3]; expected logits of shape [2, 2]"),
        ("tests.core.byo_models:raises", "failed: RuntimeError: out of coffee"),
        # before: torch's "mat1 and mat2 must have the same dtype" alone
        ("tests.core.byo_models:float64_mlp", "its parameters are float64 and dpaudit's records float32: return"),
        ("tests.core.byo_models:softmax_head", "its outputs are probabilities"),
        ("tests.core.byo_models:one_logit", "the two logits torch.cat([torch.zeros_like(z), z], dim=1)"),
        ("tests.core.byo_models:logits_and_features", "gives output tuple; expected logits"),
        # DP-SGD fell back to a vmap that clips a different function than the one trained and scored
        ("tests.core.byo_models:batch_centred", "a record's logits depend on the other records of its batch"),
        # a saved run reloaded as another model (56% vs 90% train accuracy on a user's data), attacked silently
        ("tests.core.byo_models:random_projection", "built twice and loaded with the same state dict, the model"),
        ("no colon", "expected a model factory as 'package.module:function'"),
    ],
)
def test_bad_factories_are_one_line(npz, tmp_path, factory, message):
    spec = _spec_file(tmp_path / "spec.json", factory)
    r = invoke("train", "--data", npz, "--model-spec", spec, "--epochs", 1, "--out", tmp_path / "run")
    assert message in one_error(r)
    assert not (tmp_path / "run").exists()
    (tmp_path / "w.safetensors").write_bytes(b"")  # WEIGHTS is checked first (a path that exists), then the spec
    # on the same data: a spec whose input_shape is not the data's is refused as that, before its factory runs
    (tmp_path / "m.txt").write_text("\n".join(map(str, range(10))) + "\n")
    r = invoke("import", tmp_path / "w.safetensors", "--model-spec", spec, "--data", npz, "--members",
               tmp_path / "m.txt", "--out", tmp_path / "imp")  # fmt: skip
    assert message in one_error(r)
    assert not (tmp_path / "imp").exists()


@pytest.mark.parametrize(
    ("extra", "pad", "vocab", "message"),
    [
        ("random", 0, 20, "built twice and loaded with the same state dict, the model"),
        ("centred", 0, 20, "a record's logits depend on the other records of its batch"),
        ("random", 3, 20, "built twice and loaded with the same state dict, the model"),
        ("random", 0, 3, "built twice and loaded with the same state dict, the model"),
    ],
)
def test_build_checks_do_not_skip_a_token_model_that_masks_padding(tmp_path, extra, pad, vocab, message):
    """A token model masking padding id 0 in a softmax gives NaN logits on an all-0 record; the build checks
    probed all-0 and all-1 records and NaN != NaN made both skip themselves: a random tensor outside the state
    dict and a batch mean were accepted, and every later command measured another model than the one trained.
    Padding id 3 makes one of the first two probe records (ids 2 and 3) NaN and the other finite: every logit must
    be finite, not one (mutant: ``isfinite(out).any()`` kept that pair and the random tensor passed again). A
    vocabulary of 3 has no id 3: the next records are tried (mutant: the failing pair kept, the checks skipped)."""
    from dpaudit.models import read_model_spec

    spec = {"kind": "python", "factory": "tests.core.byo_models:pad_masked", "input_shape": [6], "n_classes": 2}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**spec, "kwargs": {"vocab": vocab, "n_classes": 2, "extra": extra, "pad": pad}}))
    with pytest.raises(InputError, match=message):
        read_model_spec(path, tokens=True)


def test_a_transformer_masking_padding_id_0_builds_though_torchs_eval_mode_fails_on_all_padding(tmp_path):
    """nn.Transformer (batch_first, post-norm) with src_key_padding_mask=x == 0, the usual padding id: the build
    probed two all-0 records in eval mode, where torch's encoder takes its nested-tensor fast path and raises on a
    record without an unpadded token; ``train`` refused the model on both backends ("forward on a int64 batch of
    shape [2, 7] failed: RuntimeError: to_padded_tensor: ..."). The trainers run it in training mode (no fast path),
    where the probe's shape is now checked; a forward failing in both modes is still refused with the eval-mode
    error (test_bad_factories_are_one_line)."""
    from dpaudit.models import read_model_spec

    spec = {"kind": "python", "factory": "tests.core.byo_models:padded_transformer", "input_shape": [7],
            "n_classes": 2, "kwargs": {"vocab": 10, "n_classes": 2}}  # fmt: skip
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    model = read_model_spec(path, tokens=True).build()
    assert model.training  # the mode it was built in
    with torch.no_grad(), pytest.raises(RuntimeError, match="to_padded_tensor"):  # torch's own eval-mode failure
        model.eval()(torch.zeros(2, 7, dtype=torch.long))


def test_a_next_token_head_over_the_vocabulary_is_told_how_to_fit_the_renumbered_labels(tmp_path):
    """Next-token data (y: the id following each sequence, 10 of the 30 ids occur) and a head over all 30 ids:
    the refusal said only 'the spec is for ... 30 classes; the data has ... 10', with labels that run up to 29."""
    rng = np.random.default_rng(0)
    X = rng.integers(0, 30, size=(40, 6)).astype(np.int32)
    y = rng.choice(np.arange(2, 30, 3), size=40)
    np.savez(tmp_path / "next.npz", X=X, y=y)
    spec = tmp_path / "spec.json"
    factory = "tests.core.byo_models:tied_lm"
    spec.write_text(json.dumps({"kind": "python", "factory": factory, "input_shape": [6], "n_classes": 30,
                                "kwargs": {"vocab": 30, "n_classes": 30}}))  # fmt: skip
    hint = "the labels are 10 distinct ids from 2 to 29, renumbered 0..9 in sorted order"
    r = invoke("train", "--data", tmp_path / "next.npz", "--model-spec", spec, "--out", tmp_path / "run")
    assert hint in one_error(r) and "logits[:, ids] with ids = np.unique(y), and set n_classes to 10" in r.stderr
    from tests.core.byo_models import tied_lm

    save_file({k: v.clone() for k, v in tied_lm(30, 30).state_dict().items()}, tmp_path / "w.safetensors")
    (tmp_path / "members.txt").write_text("\n".join(map(str, range(20))))
    r = invoke("import", tmp_path / "w.safetensors", "--model-spec", spec, "--data", tmp_path / "next.npz",
               "--members", tmp_path / "members.txt", "--out", tmp_path / "imp")  # fmt: skip
    assert hint in one_error(r)
    np.savez(tmp_path / "ids.npz", X=X, y=y // 10)  # labels 0..2 already: the count alone is the message
    r = invoke("train", "--data", tmp_path / "ids.npz", "--model-spec", spec, "--out", tmp_path / "run")
    assert "the data has [6] and 3" in one_error(r) and "renumbered" not in r.stderr


def test_the_next_token_hint_is_only_for_labels_a_head_over_its_outputs_can_index(tmp_path):
    """The hint "a head over all N ids does not fit them: return logits[:, ids]" is true only when every label is an
    id such a head has, 0 .. N - 1: a label N or a negative one cannot be indexed, and labels 0 .. K-1 already fit
    (mutants: ``c[-1] > N`` and the ``c[0] < 0`` check dropped gave the hint for labels 2, 5, 10 and -1, 2, 5 against
    10 outputs)."""
    for labels, hinted in (([2, 5, 9], True), ([2.0, 5.0, 9.0], True), ([2, 5, 10], False), ([-1, 2, 5], False),
                           ([0, 1, 2], False), (["a", "b", "c"], False)):  # fmt: skip
        np.savez(tmp_path / "d.npz", X=np.zeros((6, 4), np.float32), y=np.array(labels * 2))
        hint = load_dataset(str(tmp_path / "d.npz")).outputs_hint(10)
        assert hint.startswith("; the labels are 3 distinct ids from 2 to 9") if hinted else hint == "", labels


@pytest.mark.parametrize("algo", ["outpert", "dpagd"])
def test_a_convex_learner_on_token_data_names_what_trains_on_tokens(tmp_path, algo):
    """A convex learner with a model over token ids said "use --model logreg", which token data then refuse."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"kind": "python", "factory": "tests.core.byo_models:tied_lm", "input_shape": [6],
                                "n_classes": 2, "kwargs": {"vocab": 30, "n_classes": 2}}))  # fmt: skip
    tokens = "synthetic-tokens:n=60,length=6,vocab=30,classes=2,seed=0"
    for model in (["--model-spec", spec], ["--model", "logreg"]):
        r = invoke("train", "--data", tokens, *model, "--algo", algo, "--epsilon", 1, "--out", tmp_path / "run")
        assert "holds token ids: train a model over tokens with --algo dpsgd, dpadam or dpsgd-jl" in one_error(r)
        assert "use --model logreg" not in r.stderr and not (tmp_path / "run").exists()


def test_a_transformer_whose_positions_are_the_batch_rows_is_refused_in_one_line(tmp_path):
    """Seq-first positions on batch-first tokens, ``pos(torch.arange(x.size(0)))``: a record's logits depend on
    its row, so under Poisson sampling one record moves the others' gradients; refused before training, naming
    the row (tests.training.test_clipper_call: the training-mode check of every DP trainer refuses it too; the
    transformer with positions over the sequence trains, tests/core/test_byo_matrix.py)."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"kind": "python", "factory": "tests.core.byo_models:batch_row_transformer",
                                "input_shape": [6], "n_classes": 2,
                                "kwargs": {"vocab": 30, "length": 6, "n_classes": 2}}))  # fmt: skip
    tokens = "synthetic-tokens:n=60,length=6,vocab=30,classes=2,seed=0"
    args = ("--model-spec", spec, "--algo", "dpsgd", "--epsilon", 4, "--out", tmp_path / "r")
    r = invoke("train", "--data", tokens, *args)
    assert "or its row in the batch, as from a positional embedding of torch.arange(x.size(0))" in one_error(r)
    assert not (tmp_path / "r").exists()


def test_batchnorm_is_refused_under_dp_only(npz, tmp_path):
    spec = _spec_file(tmp_path / "spec.json", "tests.core.byo_models:with_batchnorm")
    r = invoke(
        "train", "--data", npz, "--model-spec", spec, "--algo", "dpsgd", "--epsilon", 4, "--epochs", 1,
        "--out", tmp_path / "dp",
    )  # fmt: skip
    assert "is BatchNorm, which mixes examples in a batch" in one_error(r)
    assert not (tmp_path / "dp").exists()
    r = invoke("train", "--data", npz, "--model-spec", spec, "--algo", "sgd", "--epochs", 1, "--out", tmp_path / "sgd")
    assert r.exit_code == 0, r.output  # non-private training makes no per-example claim


@pytest.mark.parametrize(
    ("factory", "trained", "imported"),
    [
        # its forward changes the weights outside the noisy update: one line naming the parameter
        ("clamps_in_forward", "parameter lin.weight was modified in place during the training forward",
         "parameter lin.weight was modified in place during a forward pass of the imported model"),
        # a hand-written batch centring under ``if self.training`` passes the eval-mode build check; under ghost
        # clipping, removing one outlying record moved the clipped sum by 1.04·C (its batch mean moves every other
        # record's gradient); every clipping method refuses it (tests/training/test_clipper_call.py)
        ("train_batch_centred", "depend on the other records of its batch in training mode",
         "depend on the other records of its batch in training mode"),
    ],
)  # fmt: skip
def test_a_forward_dp_cannot_cover_is_refused_under_a_dp_claim_only(npz, tmp_path, factory, trained, imported):
    """Training under DP and an import with a DP claim are refused in one line; non-private training and a
    claimless import go on."""
    spec = _spec_file(tmp_path / "spec.json", f"tests.core.byo_models:{factory}")
    args = ("--data", npz, "--model-spec", spec, "--epochs", 1)
    r = invoke("train", *args, "--algo", "dpsgd", "--epsilon", 4, "--out", tmp_path / "dp")
    assert trained in one_error(r)
    assert not (tmp_path / "dp").exists()
    assert invoke("train", *args, "--algo", "sgd", "--out", tmp_path / "sgd").exit_code == 0
    (tmp_path / "members.txt").write_text("\n".join(map(str, range(200))))
    weights = tmp_path / "sgd" / "model.safetensors"
    base = ("import", weights, "--model-spec", spec, "--data", npz, "--members", tmp_path / "members.txt")
    r = invoke(*base, "--epsilon", 1, "--delta", 1e-5, "--out", tmp_path / "claimed")
    assert imported in one_error(r)
    assert not (tmp_path / "claimed").exists()
    assert invoke(*base, "--out", tmp_path / "plain").exit_code == 0


def test_weights_that_do_not_match_the_module_list_the_differences(npz, tmp_path):
    from tests.core.byo_models import residual_mlp

    state = residual_mlp(D, K, width=8).state_dict()  # other widths
    state["extra.weight"] = torch.zeros(1)
    del state["head.bias"]
    save_file(state, str(tmp_path / "w.safetensors"))
    (tmp_path / "members.txt").write_text("0\n1\n2\n")
    r = invoke(
        "import", tmp_path / "w.safetensors", "--model-spec", _spec_file(tmp_path / "spec.json"), "--data", npz,
        "--members", tmp_path / "members.txt", "--out", tmp_path / "imp",
    )  # fmt: skip
    line = one_error(r)
    assert "missing head.bias" in line and "unexpected extra.weight" in line
    assert "inp.weight has shape [8, 6], expected [16, 6]" in line and "head.weight has shape" in line
    assert not (tmp_path / "imp").exists()


@pytest.fixture(scope="module")
def trained_run(npz, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("run")
    run = tmp / "run"
    r = invoke("train", "--data", npz, "--model-spec", _spec_file(tmp / "spec.json"), "--epochs", 1, "--out", run)
    assert r.exit_code == 0, r.output
    return run


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"factory": "tests.core.no_such_module_y:f"}, "cannot import module 'tests.core.no_such_module_y'"),
        ({"kwargs": {"d": D, "n_classes": K, "width": 4}}, "inp.weight has shape [16, 6], expected [4, 6]"),
    ],
)
def test_a_run_whose_factory_no_longer_fits_refuses_to_load(trained_run, tmp_path, change, message):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    meta = json.loads((run / CHECKPOINT_FILE).read_text())
    meta["model"].update(change)
    (run / CHECKPOINT_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"weights do not match|cannot import"):
        load_run(run)
    r = invoke("inspect", run)
    assert r.exit_code in (0, 2)  # inspect reads the JSON only; attacking needs the model:
    r = invoke("attack", "mia", run, "--attacks", "loss")
    assert message in one_error(r)


def test_a_changed_factory_source_warns_but_loads(trained_run):
    meta = json.loads((trained_run / CHECKPOINT_FILE).read_text())
    with pytest.warns(UserWarning, match="source file of model factory .* changed"):
        model_spec_from_dict({**meta["model"], "source_sha256": "0" * 64})


def test_python_spec_validation():
    with pytest.raises(InputError, match="must be a JSON object"):
        PythonSpec(input_shape=(D,), n_classes=K, factory=FACTORY, kwargs=[1])
    with pytest.raises(InputError, match="JSON-serialisable"):
        PythonSpec(input_shape=(D,), n_classes=K, factory=FACTORY, kwargs={"d": object()})
    spec = PythonSpec(input_shape=(D,), n_classes=K, factory=FACTORY, kwargs={"d": D, "n_classes": K})
    # same seed, same initialisation (the factory runs under the seeded generator)
    a, b = build_model(spec, seed=3).state_dict(), build_model(spec, seed=3).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_probabilities_are_refused_and_log_probabilities_taken():
    """A softmax head's outputs read as logits give a wrong loss (softmax of probabilities) and so wrong
    attack scores, silently; a log-softmax differs from the logits by a per-row constant the softmax cancels."""
    kwargs = {"d": D, "n_classes": K}
    with pytest.raises(InputError, match="its outputs are probabilities"):
        PythonSpec(input_shape=(D,), n_classes=K, factory="tests.core.byo_models:softmax_head", kwargs=kwargs).build()
    spec = PythonSpec(input_shape=(D,), n_classes=K, factory="tests.core.byo_models:log_softmax_head", kwargs=kwargs)
    x = torch.randn(5, D)
    out = build_model(spec, seed=0)(x)
    assert torch.allclose(out.softmax(1).sum(1), torch.ones(5)) and (out < 0).all()


# --------------------------------------------------------------------------- data


def _npy_dir(path: Path, X: np.ndarray, y: np.ndarray) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    np.save(path / "X.npy", X)
    np.save(path / "y.npy", y)
    return path


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"X": np.zeros((4, 2))}, "must hold arrays 'X' and 'y'"),
        ({"X": np.zeros((4, 2)), "y": np.array([0, 1, 0])}, "X has 4 rows but y has 3"),
        ({"X": np.zeros((4, 2)), "y": np.array([0.0, 1.5, 0.0, 1.0])}, "labels must be integers"),
        ({"X": np.zeros((4, 2)), "y": np.array([b"a", b"b", b"a", b"b"])}, "labels are bytes (dtype |S1)"),
        (
            {"X": np.zeros((4, 2)), "y": np.array([[0], [1], [0], [1]])},
            "got shape (4, 1): one label per record, y.ravel()",
        ),
        ({"X": np.zeros((4, 2)), "y": np.eye(2)[[0, 1, 0, 1]]}, "it looks one-hot; give the class indices, y.argmax"),
    ],
)
def test_bad_npz(tmp_path, arrays, message):
    np.savez(tmp_path / "d.npz", **arrays)
    r = invoke("train", "--data", tmp_path / "d.npz", "--epochs", 1, "--out", tmp_path / "run")
    assert message in one_error(r)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("X", "y", "message"),
    [
        (np.zeros((4, 2), np.float32), np.array([0, 1, 0]), "X.npy has 4 rows but y.npy has 3"),
        (np.zeros((4, 2), np.float32), np.array([0.5, 1, 0, 1]), "labels must be integers"),
        (np.zeros((4, 1, 2, 2), np.int32), np.array([0, 1, 0, 1]), "X must be a floating-point array"),
        (np.full((4, 2), np.nan, np.float32), np.array([0, 1, 0, 1]), "features contain NaN or inf"),
        (None, np.array([0, 1, 0, 1]), "must hold X.npy and y.npy (missing: X.npy)"),
    ],
)
def test_bad_npy_dir(tmp_path, X, y, message):
    d = tmp_path / "data"
    d.mkdir()
    np.save(d / "y.npy", y)
    if X is not None:
        np.save(d / "X.npy", X)
    r = invoke("train", "--data", d, "--epochs", 1, "--out", tmp_path / "run")
    assert message in one_error(r)
    assert not (tmp_path / "run").exists()


def test_npy_dir_is_memory_mapped_and_hashed_like_the_same_arrays(tmp_path, monkeypatch):
    import pickle

    import dpaudit.data as data_module

    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(301, 3, 4, 4)).astype(np.float32), rng.integers(0, 3, 301)
    monkeypatch.setattr(data_module, "RELEASE_EVERY_BYTES", 10 * X[0].nbytes + 7)  # 31 chunks, the last partial
    ds = load_dataset(str(_npy_dir(tmp_path / "d", X, y)))
    assert ds.mapped is not None and not ds.X.flags.owndata and not ds.X.flags.writeable
    import hashlib

    whole = hashlib.sha256()  # the oracle: every byte at once
    for a in (X, ds.y):
        whole.update(f"{a.dtype.str}{a.shape}".encode())
        whole.update(a.tobytes())
    assert ds.sha256 == whole.hexdigest()  # chunked digest == all bytes at once
    np.savez(tmp_path / "d.npz", X=X, y=y)
    assert ds.sha256 == load_dataset(str(tmp_path / "d.npz")).sha256  # same arrays in memory, same hash
    assert len(pickle.dumps(ds)) < 1000  # workers map the file again; X is not in the pickle
    assert pickle.loads(pickle.dumps(ds)).sha256 == ds.sha256
    d = ds.describe()
    assert d["feature_shape"] == [3, 4, 4] and d["dtype"] == "float32" and d["memory_mapped"] is True


def test_streamed_training_is_bit_identical_to_in_memory(tmp_path, cpu_only):
    """The trainers read a memory-mapped X a batch at a time (StreamedFeatures); with the same
    preprocessing they must produce exactly the weights of training on the rows held in memory."""
    X, y = _data(300, seed=2)
    mapped = load_dataset(str(_npy_dir(tmp_path / "d", X, y)))
    np.savez(tmp_path / "d.npz", X=X, y=y)
    memory = load_dataset(str(tmp_path / "d.npz"))
    idx = np.arange(0, 300, 3)
    spec = model_spec_from_dict(
        {"kind": "python", "factory": FACTORY, "kwargs": {"d": D, "n_classes": K}, "input_shape": [D], "n_classes": K}
    )
    pre = Standardizer.fit(X[idx])
    for config in (
        TrainConfig(algo="sgd", epochs=2, batch_size=16, lr=0.1),
        TrainConfig(algo="dpsgd", epochs=2, batch_size=16, lr=0.5, dp=DPConfig(noise_multiplier=1.0, clip=0.5)),
    ):
        a = fit_model(mapped, idx, spec, config, preprocessing=pre).model.state_dict()
        b = fit_model(memory, idx, spec, config, preprocessing=pre).model.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), config.algo


def test_canaries_are_appended_beside_a_memory_mapped_x_not_copied_with_it(tmp_path, cpu_only):
    """`train --canaries` on a memory-mapped X.npy concatenated the whole file and the canaries into memory
    (CIFAR's 600 MB X: 3.7 GB peak RSS); training then read that copy. The canaries are now appended beside the
    map (Dataset.appended), streamed with it batch by batch and carried to worker processes; the weights are
    those of training on the concatenation."""
    import pickle

    from dpaudit.canaries import make_canaries, with_canaries
    from dpaudit.data import make_splits

    X, y = _data(300, seed=4)
    mapped = load_dataset(str(_npy_dir(tmp_path / "d", X, y)))
    np.savez(tmp_path / "d.npz", X=X, y=y)
    memory = load_dataset(str(tmp_path / "d.npz"))
    splits = make_splits(300, 0)
    canaries = make_canaries(mapped, splits, m=6, kind="mislabeled", seed=1)
    aug, idx, canary_idx = with_canaries(mapped, splits, canaries)
    assert aug.X is mapped.X and aug.mapped is mapped.mapped and len(aug) == 306  # no copy of the file
    np.testing.assert_array_equal(aug.rows(canary_idx[::-1]), canaries.X[::-1])
    again = pickle.loads(pickle.dumps(aug))  # a worker process's copy: mapped again, canaries and labels kept
    assert again.mapped is not None and np.array_equal(again.rows(canary_idx), canaries.X)
    assert np.array_equal(again.y, aug.y)
    spec = model_spec_from_dict(
        {"kind": "python", "factory": FACTORY, "kwargs": {"d": D, "n_classes": K}, "input_shape": [D], "n_classes": K}
    )
    config = TrainConfig(algo="dpsgd", epochs=1, batch_size=16, lr=0.5, dp=DPConfig(noise_multiplier=1.0, clip=0.5))
    a = fit_model(aug, idx, spec, config, preprocessing_idx=splits.aux).model.state_dict()
    concatenated = _concatenated(memory, canaries)
    b = fit_model(concatenated, idx, spec, config, preprocessing_idx=splits.aux).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert aug.sha256 == concatenated.sha256


def _concatenated(ds, canaries):
    """``ds`` with the canaries concatenated to X in memory: what ``with_canaries`` made of in-memory data before."""
    from dpaudit.data import Dataset

    X = np.concatenate([ds.X, canaries.X.astype(ds.dtype)])
    y = np.concatenate([ds.y, canaries.y])
    return Dataset(ds.name, X, y, ds.n_classes, ds.kind, ds.source, ds.vocab_size)


def test_a_second_canary_set_is_appended_after_the_first(tmp_path):
    """with_canaries on data that already carries appended canaries (a second set) keeps the first set's rows: the
    augmented rows are X, the first set, then the second, as a concatenation of all three (and the second set's
    indices follow the first's). Planted (mutation pass 23): the earlier appended rows dropped -> rows read past the
    end or the wrong records."""
    from dpaudit.canaries import make_canaries, with_canaries
    from dpaudit.data import make_splits

    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 200)
    np.savez(tmp_path / "d.npz", X=(rng.normal(size=(200, 5)) + y[:, None]).astype(np.float32), y=y)
    ds = load_dataset(str(tmp_path / "d.npz"))
    splits = make_splits(200, 0)
    first = make_canaries(ds, splits, m=6, kind="mislabeled", seed=1)
    second = make_canaries(ds, splits, m=4, kind="outlier", seed=2)
    once, _, idx1 = with_canaries(ds, splits, first)
    twice, _, idx2 = with_canaries(once, splits, second)
    assert list(idx1) == list(range(200, 206)) and list(idx2) == list(range(206, 210)) and len(twice) == 210
    whole = _concatenated(_concatenated(ds, first), second)
    assert np.array_equal(twice.rows(np.arange(210)), whole.X) and np.array_equal(twice.y, whole.y)
    assert twice.X is ds.X


@pytest.mark.parametrize("kind", ["images", "tokens"])
def test_canaries_are_appended_beside_an_in_memory_x_not_concatenated_with_it(tmp_path, kind):
    """`train --canaries` and `audit train` on in-memory data (an NPZ) concatenated X and the canaries: a second
    copy of X for the whole training (32,000 CIFAR-sized float32 images: +393 MB, peak RSS 1,331 MB). The canaries
    are now appended beside X (Dataset.appended) for every data set; the rows, the data hash and the DP-SGD weights
    are the concatenation's. numpy reports its buffers to tracemalloc."""
    import tracemalloc

    from dpaudit.canaries import make_canaries, with_canaries
    from dpaudit.data import make_splits
    from dpaudit.models import default_spec

    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, 600)
    if kind == "images":
        X = (rng.normal(size=(600, 3, 8, 8)) + y[:, None, None, None]).astype(np.float32)
    else:
        X = rng.integers(0, 40, size=(600, 12)).astype(np.int64)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    ds = load_dataset(str(tmp_path / "d.npz"))
    splits = make_splits(600, 0)
    canaries = make_canaries(ds, splits, m=20, kind="mislabeled", seed=1)
    tracemalloc.start()
    try:
        aug, idx, _ = with_canaries(ds, splits, canaries)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < ds.X.nbytes / 4  # the canaries and labels (1/30 of X here); a concatenation is X.nbytes more
    assert aug.X is ds.X and len(aug) == 620
    concatenated = _concatenated(ds, canaries)
    assert np.array_equal(aug.rows(idx[::-1]), concatenated.X[idx[::-1]]) and aug.sha256 == concatenated.sha256
    spec = default_spec("logreg" if kind == "images" else "rnn", input_shape=ds.feature_shape, n_classes=2,
                        vocab_size=ds.vocab_size)  # fmt: skip
    config = TrainConfig(algo="dpsgd", epochs=1, batch_size=32, lr=0.5, dp=DPConfig(noise_multiplier=1.0, clip=0.5))
    a = fit_model(aug, idx, spec, config, preprocessing_idx=splits.aux).model.state_dict()
    b = fit_model(concatenated, idx, spec, config, preprocessing_idx=splits.aux).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_streamed_standardizer_matches_in_memory_fit(tmp_path):
    rng = np.random.default_rng(3)
    X = (rng.normal(size=(500, 2, 3, 3)) * 5 + 100).astype(np.float32)
    X[:, 0, 0, 0] = 7.0  # a constant feature passes through (scale 1)
    ds = load_dataset(str(_npy_dir(tmp_path / "d", X, rng.integers(0, 2, 500))))
    idx = rng.choice(500, 300, replace=False)
    a, b = Standardizer.fit_streamed(ds, idx, batch=64), Standardizer.fit(X[idx])
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-6)
    np.testing.assert_allclose(a.scale, b.scale, rtol=1e-5)
    assert a.scale[0, 0, 0] == 1.0


def test_a_changed_npy_file_is_detected(tmp_path):
    X, y = _data(200)
    d = _npy_dir(tmp_path / "d", X, y)
    run = tmp_path / "run"
    assert invoke("train", "--data", d, "--model", "logreg", "--epochs", 1, "--out", run).exit_code == 0
    X[5, 0] += 1
    np.save(d / "X.npy", X)
    assert "changed since training" in one_error(invoke("attack", "mia", run, "--attacks", "loss"))


RSS_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np
    import dpaudit.data as data
    from dpaudit.data import load_dataset
    if sys.argv[2] == "never":  # planted mistake: the mapped pages are never released
        data.MappedFile.release = lambda self: None
    def rss():
        fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
        return int(fields["VmRSS"].split()[0]) * 1024
    base = rss()
    ds = load_dataset(sys.argv[1])  # validates X a block at a time
    peak = rss()
    rng = np.random.default_rng(0)
    for _ in range(len(ds) // 64):  # scattered batches, as Poisson sampling reads them
        ds.rows(rng.choice(len(ds), 64, replace=False))
        peak = max(peak, rss())
    print(peak - base, ds.X.nbytes)
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_streaming_a_mapped_file_keeps_resident_memory_small(tmp_path):
    """Loading (validation) a 164 MB X.npy and reading random batches of rows from it grow the resident
    set by far less than the file (pages are released after each batch and every 64 MiB of a pass);
    never releasing them (planted) grows it by nearly the whole file: each scattered row maps the pages
    around it too, which a release every 64 MiB *read* did not account for (a bug this test caught)."""
    d = tmp_path / "d"
    d.mkdir()
    X = np.lib.format.open_memmap(d / "X.npy", mode="w+", dtype=np.float32, shape=(10_000, 4096))
    for s in range(0, 10_000, 1000):
        X[s : s + 1000] = 1.0
    X.flush()
    del X
    np.save(d / "y.npy", np.arange(10_000) % 2)
    environ = __import__("os").environ
    env = {**environ, "PYTHONPATH": __import__("os").pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))}
    grown = {}
    for mode in ("release", "never"):
        out = subprocess.run(
            [sys.executable, "-c", RSS_SCRIPT, str(d), mode], capture_output=True, text=True, env=env, check=True
        ).stdout.split()
        grown[mode], size = int(out[0]), int(out[1])
    assert grown["release"] < 0.6 * size, grown  # 64 MiB + a batch of a 164 MB file
    assert grown["never"] > 0.9 * size, grown  # the planted mistake is visible to this test


def test_help_says_what_digits_is():
    r = invoke("train", "--help")
    text = " ".join(r.output.replace("│", " ").split())
    assert "divided by 16" in text and "1 x 8 x 8" in text and "memory-mapped" in text


def test_string_labels_in_npz_and_npy_are_class_names_as_in_a_csv(tmp_path):
    """A NumPy string array of labels names the classes, as a CSV's string column does (it was refused as "labels
    must be integers, got dtype <U3" while the same labels in a CSV trained): class i is the i-th name in sorted
    order."""
    from dpaudit.data import load_dataset

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3)).astype(np.float32)
    y = np.where(X[:, 0] > 0, "cat", "dog")
    np.savez(tmp_path / "d.npz", X=X, y=y)
    _npy_dir(tmp_path / "dir", X, y)
    for spec in (tmp_path / "d.npz", tmp_path / "dir"):
        ds = load_dataset(spec)
        assert ds.classes.tolist() == ["cat", "dog"] and ds.n_classes == 2
        np.testing.assert_array_equal(ds.y, (y == "dog").astype(np.int64))


@pytest.mark.parametrize("kind", ["outlier", "crafted", "clipbkd", "mislabeled"])
def test_canaries_of_uint8_images_are_those_of_their_float32_values(tmp_path, kind, cpu_only):
    """uint8 images are kept as uint8 (read as float32 per batch, Dataset.dtype). Canaries are float (an outlier
    pixel is no uint8: cast to the stored dtype, ``astype(X.dtype)``, it wrapped around modulo 256): they must be
    the float32 canaries of the float32 array of the same values, appended beside the uint8 X, and a model trained
    on the augmented set the same weights."""
    from dpaudit.canaries import make_canaries, with_canaries
    from dpaudit.data import fit_preprocessing, make_splits

    rng = np.random.default_rng(0)
    X, y = rng.integers(0, 256, (120, 3, 4, 4), dtype=np.uint8), np.arange(120) % 2
    np.savez(tmp_path / "u8.npz", X=X, y=y)
    np.savez(tmp_path / "f32.npz", X=X.astype(np.float32), y=y)
    u8, f32 = load_dataset(str(tmp_path / "u8.npz")), load_dataset(str(tmp_path / "f32.npz"))
    assert u8.X.dtype == np.uint8
    splits = make_splits(len(u8), 0)
    c8, c32 = (make_canaries(d, splits, m=6, kind=kind, seed=3) for d in (u8, f32))
    assert c8.X.dtype == c32.X.dtype == np.float32 and np.array_equal(c8.X, c32.X)
    (a8, idx, _), (a32, _, _) = (with_canaries(d, splits, c) for d, c in ((u8, c8), (f32, c32)))
    assert a8.X.dtype == np.uint8 and np.array_equal(a8.rows(idx), a32.rows(idx)) and a8.sha256 == a32.sha256
    if kind != "outlier":
        return  # the rows are equal: training on them is, as below, once
    spec = model_spec_from_dict({"kind": "logreg", "input_shape": [3, 4, 4], "n_classes": 2})
    config = TrainConfig(algo="dpsgd", steps=2, batch_size=16, lr=0.5, dp=DPConfig(noise_multiplier=1.0, clip=0.5))
    w = [
        fit_model(a, idx, spec, config, preprocessing=fit_preprocessing(a, splits.aux)).model.state_dict()
        for a in (a8, a32)
    ]
    assert all(torch.equal(w[0][k], w[1][k]) for k in w[0])


def test_an_in_memory_uint8_split_is_standardised_into_one_float32_array(tmp_path, cpu_only):
    """The training split of in-memory data was read as float32 rows and then standardised into a second float32
    array (2 x 215 MB for 17,500 CIFAR images); uint8 rows now go to the preprocessing as stored, which makes them
    float32 as it standardises them (exactly: Identity, raw features, casts them too). Same weights either way."""
    import tracemalloc

    from dpaudit.data import Identity
    from dpaudit.training.config import PerfConfig
    from dpaudit.training.run import _tensors, default_trainer

    rng = np.random.default_rng(5)
    X, y = rng.integers(0, 256, (1000, 3, 16, 16), dtype=np.uint8), np.arange(1000) % 2
    np.savez(tmp_path / "u8.npz", X=X, y=y)
    np.savez(tmp_path / "f32.npz", X=X.astype(np.float32), y=y)
    u8, f32 = load_dataset(str(tmp_path / "u8.npz")), load_dataset(str(tmp_path / "f32.npz"))
    idx = np.arange(0, 1000, 2)
    spec = model_spec_from_dict({"kind": "logreg", "input_shape": [3, 16, 16], "n_classes": 2})
    config = TrainConfig(algo="dpsgd", steps=2, batch_size=16, lr=0.5, dp=DPConfig(noise_multiplier=1.0, clip=0.5))
    a, b = (fit_model(d, idx, spec, config, preprocessing=Identity()).model.state_dict() for d in (u8, f32))
    assert all(torch.equal(a[k], b[k]) for k in a)  # raw features: Identity casts the uint8 rows
    trainer = default_trainer(config, PerfConfig(device="cpu"))
    pre = Standardizer.fit(X[idx])
    tracemalloc.start()
    try:
        features, _ = _tensors(u8, idx, pre, torch.device("cpu"), trainer)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    split32 = X[idx].astype(np.float32)
    assert features.dtype == torch.float32 and torch.equal(features, torch.as_tensor(pre.transform(split32)))
    assert peak < 1.5 * split32.nbytes  # one float32 array (and the uint8 rows), not two
