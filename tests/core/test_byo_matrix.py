"""Models and data users bring, with the defaults a newcomer uses (no tuning flags): a transformer over
token ids (``pos(torch.arange(T))``), a tied-weight LM-ish classifier and nn.MultiheadAttention, by
factory (tests/core/byo_models.py), on token ids saved as an integer NPZ / a directory of .npy files.

Oracles: integer 2-D arrays are token ids (int64, never floats; the spec's ``input_dtype`` follows the
data); a DP transformer at epsilon 4 with the default recipe beats chance by far (binomial test);
tied weights survive save -> load as one tensor; a zoo model on token ids, a float module on token ids,
a vocabulary smaller than the data, and the attacks that cannot apply to token ids (MI-FACE gradient
ascent, attribute inference, extraction) are each one line naming why and what to use instead, exit
code 2; a model that learned nothing is said to have learned nothing, at training and beside every
membership estimate made on it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import binom

from dpaudit.checkpoint import CHECKPOINT_FILE, load_run, load_state_into
from dpaudit.data import load_dataset
from dpaudit.errors import CheckpointError, DataError, InputError
from tests.core import byo_models
from tests.core.cli_errors import invoke, one_error

ROOT = Path(__file__).resolve().parents[2]
V, T, K = 20, 8, 2


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # factories are imported from the current directory


def _tokens(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each class draws its tokens from its own Dirichlet(0.3) distribution over the vocabulary."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(V, 0.3), K)
    y = rng.integers(0, K, n)
    return np.stack([rng.choice(V, T, p=probs[c]) for c in y]).astype(np.int64), y


def _spec(path: Path, factory: str, **extra) -> Path:
    kwargs = {"vocab": V, "n_classes": K} if factory == "tied_lm" else {"vocab": V, "length": T, "n_classes": K}
    spec = {"kind": "python", "factory": f"tests.core.byo_models:{factory}", "kwargs": kwargs}
    path.write_text(json.dumps({**spec, "input_shape": [T], "n_classes": K, **extra}))
    return path


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Path:
    X, y = _tokens()
    path = tmp_path_factory.mktemp("tok") / "tok.npz"
    np.savez(path, X=X, y=y)
    return path


def _train(base: Path, data: Path, *args) -> Path:
    import os

    cwd = os.getcwd()
    os.chdir(ROOT)  # a module-scoped fixture runs outside the autouse chdir
    try:
        run = base / "run"
        spec = _spec(base / "spec.json", "transformer")
        r = invoke("train", "--data", data, "--model-spec", spec, *args, "--out", run)
    finally:
        os.chdir(cwd)
    assert r.exit_code == 0, r.output
    return run


@pytest.fixture(scope="module")
def transformer_run(tok, tmp_path_factory) -> Path:
    """A transformer over token ids trained one epoch with canaries (mislabeled, the default kind: they
    fit any record shape) for the formal audit."""
    return _train(tmp_path_factory.mktemp("tf"), tok, "--epochs", 1, "--canaries", 40, "--allow-inconclusive")


# --------------------------------------------------------------------------- token data


def test_integer_arrays_are_token_ids(tmp_path):
    X, y = _tokens(40)
    np.savez(tmp_path / "t.npz", X=X.astype(np.int32), y=y)
    d = tmp_path / "dir"
    d.mkdir()
    np.save(d / "X.npy", X.astype(np.uint16))
    np.save(d / "y.npy", y)
    for source in (tmp_path / "t.npz", d):
        ds = load_dataset(str(source))
        assert ds.kind == "tokens" and ds.X.dtype == np.int64 and ds.vocab_size == int(X.max()) + 1
        np.testing.assert_array_equal(ds.X, X)
    np.savez(tmp_path / "neg.npz", X=X - 1, y=y)
    with pytest.raises(DataError, match=r"token ids, which must be >= 0 \(found -1\).*X.astype\('float32'\)"):
        load_dataset(str(tmp_path / "neg.npz"))
    # a padding id of -1 (a tokenizer's convention) was told only to save the ids as floats
    pad = f"padded with a negative id (-1, -100): give the padding an id of its own, e.g. np.where(X < 0, {X.max()}, X)"
    with pytest.raises(DataError, match=re.escape(pad)):
        load_dataset(str(tmp_path / "neg.npz"))
    np.savez(tmp_path / "f.npz", X=X.astype(np.float32), y=y)  # floats stay numeric features
    assert load_dataset(str(tmp_path / "f.npz")).kind == "tabular"


def test_uint8_matrices_stay_pixels(tmp_path):
    """Flattened 8-bit images (MNIST as (n, 784) uint8) were numeric features before token ids existed and
    still are: a zoo mlp trains on them; only wider integer types are token ids."""
    X, y = _tokens(40)
    np.savez(tmp_path / "px.npz", X=X.astype(np.uint8), y=y)
    ds = load_dataset(str(tmp_path / "px.npz"))
    assert ds.kind == "tabular" and ds.X.dtype == np.uint8 and ds.rows([0]).dtype == np.float32  # read as floats
    np.testing.assert_array_equal(ds.X, X.astype(np.uint8))


@pytest.mark.slow
def test_transformer_over_token_ids_trains_with_dp_by_factory(tok, tmp_path):
    """The newcomer's command: DP-SGD at epsilon 4, every optimisation setting left at its default."""
    run = _train(tmp_path, tok, "--algo", "dpsgd", "--epsilon", 4)
    meta = json.loads((run / CHECKPOINT_FILE).read_text())
    assert meta["model"]["input_dtype"] == "int64"  # inferred from the data, recorded
    assert meta["data"]["kind"] == "tokens" and meta["privacy"]["epsilon"] <= 4
    assert "fit_warnings" not in meta
    loaded = load_run(run)
    assert type(loaded.model).__name__ == "ArangeTransformer"
    y_test = loaded.dataset().y[loaded.splits.test]
    n, chance = len(y_test), np.bincount(y_test).max() / len(y_test)
    correct = round(meta["metrics"]["test_accuracy"] * n)
    assert binom.sf(correct - 1, n, chance) < 1e-3, (correct, n)  # far above always guessing the majority class


def test_a_token_run_is_attacked_and_its_canaries_audited(transformer_run):
    r = invoke("attack", "mia", transformer_run, "--attacks", "loss", "--json")
    assert r.exit_code == 0, r.output
    assert 0.0 <= json.loads(r.stdout)["attacks"][0]["auc"] <= 1.0
    r = invoke("audit", "checkpoint", transformer_run, "--attacks", "loss", "--json")
    assert r.exit_code == 0, r.output
    audits = json.loads(r.stdout)["audits"]
    assert audits[0]["source"]["attack"] == "canaries" and "40 mislabeled canaries" in audits[0]["description"]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["inversion"], "token ids are discrete (no gradient to follow)"),
        (["attribute", "-f", 0], "a token position ranges over the whole vocabulary"),
        (["extract", "-b", 50], "token ids are discrete"),
    ],
)
def test_attacks_that_need_real_valued_inputs_refuse_token_runs(transformer_run, args, why):
    line = one_error(invoke("attack", *args[:1], transformer_run, *args[1:]))
    assert why in line and "dpaudit attack mia" in line


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--inversion"], "token ids are discrete (no gradient to follow)"),
        (["--attribute", "0"], "a token position ranges over the whole vocabulary"),
        (["--extraction-budget", "50"], "fits real-valued surrogates"),
    ],
)
def test_report_refuses_a_family_token_runs_cannot_take_before_any_attack(
    transformer_run, tmp_path, monkeypatch, args, why
):
    # The refusal came from the family's own attack, after the report's membership attacks (minutes with LiRA).
    def no_attack(*a, **k):
        raise AssertionError("membership attacks ran before the refusal")

    monkeypatch.setattr("attacks.mia.run_mia", no_attack)
    line = one_error(invoke("report", transformer_run, *args, "--out", tmp_path / "r"))
    assert why in line and str(transformer_run) in line
    assert not (tmp_path / "r").exists()


def test_a_family_a_later_token_run_refuses_fails_before_the_earlier_runs_attacks(
    transformer_run, tmp_path, monkeypatch
):
    """`report TABULAR TOKENS --inversion` refuses before attacking the tabular run (it spent its membership attacks,
    minutes with LiRA, then stopped on the token run), and the library's audit_checkpoint refuses a family a token
    run cannot take before its own membership attacks (mutants: either check dropped, each passed the other's test:
    a single token run is refused by both)."""
    from dpaudit.models import default_spec
    from dpaudit.training.config import TrainConfig
    from dpaudit.training.run import train_run
    from dpaudit.workflows import audit_checkpoint

    ds = load_dataset("synthetic:n=200,d=4,classes=2,seed=0")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    train_run(ds, spec, TrainConfig(epochs=1, batch_size=32, seed=0), out=tmp_path / "tab")

    def no_attack(*a, **k):
        raise AssertionError("membership attacks ran before the refusal")

    monkeypatch.setattr("attacks.mia.run_mia", no_attack)
    line = one_error(invoke("report", tmp_path / "tab", transformer_run, "--inversion", "--out", tmp_path / "r"))
    assert "token ids are discrete" in line and str(transformer_run) in line and not (tmp_path / "r").exists()
    with pytest.raises(InputError, match="token ids are discrete"):
        audit_checkpoint(transformer_run, attacks=("loss",), families={"inversion": {}})


def test_cloak_refuses_a_token_run(transformer_run, tmp_path):
    line = one_error(
        invoke("train", "--algo", "cloak", "--target", transformer_run, "--lambda", 1, "--out", tmp_path / "c")
    )
    assert "token ids are discrete" in line and "--algo dpsgd" in line


def test_a_zoo_model_on_token_ids_is_one_line(tok, tmp_path):
    line = one_error(invoke("train", "--data", tok, "--epochs", 1, "--out", tmp_path / "run"))  # default: mlp
    assert "a mlp model needs numeric features" in line and "read as token ids" in line
    assert not (tmp_path / "run").exists()


def test_the_integer_file_hint_is_only_for_integer_files(tmp_path):
    """The built-in synthetic-tokens data is token ids by construction: no "an integer 2-D X is read as token ids
    ... save X as floats" advice for it (there is no file to save), only the token models."""
    line = one_error(invoke("train", "--data", "synthetic-tokens:n=40", "--epochs", 1, "--out", tmp_path / "run"))
    assert line == (
        "error: a mlp model needs numeric features, but the data 'synthetic-tokens:n=40' is tokens "
        "(token models: --model rnn or your own module)"
    )


@pytest.mark.parametrize(
    ("algo", "trains"), [("pate", "its teachers and its student"), ("dp-icl", "its student (its votes: --predictor)")]
)
def test_noisy_vote_aggregation_on_token_ids_offers_only_a_model_it_trains(algo, trains, tok, tmp_path):
    """PATE and DP-ICL train from --model only: the token-data hint names --model rnn, not "your own module" (which
    they refuse), and their refusal of --model-spec says what --model trains (DP-ICL's teachers are no models of
    --model: its votes come from --predictor). Planted: the hint's "or your own module" for them, or "trains its
    teachers" for DP-ICL -> fails."""
    args = ("train", "--algo", algo, "--epsilon", 4, "--data", tok, "--out", tmp_path / "run")
    line = one_error(invoke(*args))
    hint = "(an integer 2-D X is read as token ids; token models: --model rnn; numeric features: save X as floats)"
    assert line.endswith(hint)
    line = one_error(invoke(*args, "--model-spec", _spec(tmp_path / "spec.json", "transformer")))
    assert line == f"error: --algo {algo} trains {trains} from --model; --model-spec is not supported"
    assert not (tmp_path / "run").exists()


def test_input_dtype_mismatches_are_one_line(tok, tmp_path):
    spec = _spec(tmp_path / "f.json", "transformer", input_dtype="float32")
    line = one_error(invoke("train", "--data", tok, "--model-spec", spec, "--epochs", 1, "--out", tmp_path / "r"))
    assert 'it runs on int64 token ids: give the spec "input_dtype": "int64"' in line
    spec = _spec(tmp_path / "b.json", "transformer", input_dtype="int8")
    line = one_error(invoke("train", "--data", tok, "--model-spec", spec, "--epochs", 1, "--out", tmp_path / "r"))
    assert "expected input_dtype 'float32' or 'int64' (token ids), got 'int8'" in line
    small = json.loads(_spec(tmp_path / "s.json", "transformer").read_text())
    small["kwargs"]["vocab"] = V // 2  # the user's Embedding is smaller than the data's ids
    (tmp_path / "s.json").write_text(json.dumps(small))
    line = one_error(
        invoke("train", "--data", tok, "--model-spec", tmp_path / "s.json", "--epochs", 1, "--out", tmp_path / "r")
    )
    assert "fails on record" in line and "is its vocabulary smaller?" in line
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- tied weights


def test_tied_weights_save_and_load_as_one_tensor(tok, tmp_path):
    run = tmp_path / "tied"
    spec = _spec(tmp_path / "spec.json", "tied_lm")
    r = invoke("train", "--data", tok, "--model-spec", spec, "--epochs", 2, "--out", run)
    assert r.exit_code == 0, r.output  # was: safetensors refused the shared tensors, exit code 3
    loaded = load_run(run)
    assert loaded.model.head.weight is loaded.model.emb.weight
    X, _ = _tokens(10, seed=1)
    trained = loaded.model.state_dict()
    # a file holding one name of the tie (safetensors' save_model drops the other) loads the same model
    fresh = byo_models.tied_lm(V, K)
    load_state_into(fresh, {k: v for k, v in trained.items() if k != "head.weight"}, "one-name")
    assert fresh.head.weight is fresh.emb.weight
    with torch.no_grad():
        np.testing.assert_array_equal(fresh(torch.as_tensor(X)).numpy(), loaded.model(torch.as_tensor(X)).numpy())
    bad = {**trained, "head.weight": trained["head.weight"] + 1}
    with pytest.raises(CheckpointError, match=r"emb\.weight and head\.weight are one tied tensor"):
        load_state_into(byo_models.tied_lm(V, K), bad, "differ")


# --------------------------------------------------------------------------- a model that learned nothing


def test_a_model_that_learned_nothing_says_so(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 6)).astype(np.float32)
    np.savez(tmp_path / "noise.npz", X=X, y=rng.integers(0, 2, 300))  # labels independent of the features
    spec = {"kind": "python", "factory": "tests.core.byo_models:residual_mlp", "kwargs": {"d": 6, "n_classes": 2}}
    (tmp_path / "spec.json").write_text(json.dumps({**spec, "input_shape": [6], "n_classes": 2}))
    run = tmp_path / "run"
    r = invoke(
        "train", "--data", tmp_path / "noise.npz", "--model-spec", tmp_path / "spec.json", "--algo", "dpsgd",
        "--epsilon", 0.5, "--epochs", 2, "--out", run,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "warning: the model's accuracy on its training records" in r.stderr and "learned next to nothing" in r.stderr
    meta = json.loads((run / CHECKPOINT_FILE).read_text())
    assert meta["fit_warnings"]
    r = invoke("attack", "mia", run, "--attacks", "loss", "--quiet")
    assert r.exit_code == 0 and "learned next to nothing" in r.stderr, r.output  # a warning, even with --quiet
    r = invoke("audit", "checkpoint", run, "--attacks", "loss", "--json")
    assert r.exit_code == 0, r.output
    (loss,) = json.loads(r.stdout)["audits"]
    assert any("learned next to nothing" in n for n in loss["notes"])


def test_the_constant_predictions_loss_on_one_class_reads_0_not_minus_0():
    # Members all of one class (3 of 10 records): their entropy is -0.0, printed "is above -0".
    # Planted: no max -> fails.
    from dpaudit.training.run import _fit_warnings

    (loss,) = [w for w in _fit_warnings(np.array([1, 1, 1]), 1.0, 0.0134) if "mean loss" in w]
    assert "is above 0, the loss of predicting" in loss, loss


def test_a_large_loss_at_an_accuracy_above_chance_is_not_read_as_learning_nothing():
    # DP-SGD at --lr 1e30: 89.5% training accuracy, mean loss 3.8e28 (a few confidently wrong records) was warned
    # "the model learned next to nothing ... train with a larger learning rate". Planted: the old wording -> fails.
    from dpaudit.training.run import _LEARN_QUESTION, _fit_warnings

    y = np.array([0, 1] * 50)
    (loss,) = _fit_warnings(y, 0.9, 3.8e28, question=_LEARN_QUESTION)
    assert "learned next to nothing" not in loss and "although its accuracy there (90.0%) is above chance" in loss
    assert "(overconfident logits: a learning rate too large?)" in loss  # the guess where the algorithm has one
    (chance, loss) = _fit_warnings(y, 0.5, 3.8e28, question=_LEARN_QUESTION)  # at chance: both, as before
    assert "learned next to nothing" in chance and "learned next to nothing" in loss


def test_the_overconfidence_warning_guesses_a_learning_rate_only_where_the_algorithm_has_one():
    """learn_warnings' loss warning (accuracy above chance, mean loss above the constant prediction's) asks "a
    learning rate too large?" for the algorithms that take SGD/Adam steps (the minibatch trainers, PATE's and
    DP-ICL's student, Cloak's Adam) and for an unknown algorithm (None, the general advice); the convex learners
    and DP-AGD have no learning rate. Planted (mutation pass 19): the guess only for None, or never for None
    (the DP-AGD CLI test and _fit_warnings' default covered neither)."""
    from types import SimpleNamespace

    from dpaudit.training.run import learn_warnings

    y = np.array([0, 1] * 50)
    data, splits = SimpleNamespace(label_warnings=[], y=y), SimpleNamespace(members=np.arange(100))
    metrics = {"train_accuracy": 0.9, "train_loss": 3.8e28}
    for algo in (None, "sgd", "dpsgd", "dpadam-jl", "pate", "dp-icl", "cloak", "outpert", "objpert", "dpagd"):
        (loss,) = [w for w in learn_warnings(data, splits, metrics, algo=algo) if "mean loss" in w]
        guess = algo not in ("outpert", "objpert", "dpagd")
        assert ("(overconfident logits: a learning rate too large?)" in loss) == guess, (algo, loss)
        assert "(overconfident logits)" in loss or guess, (algo, loss)


def test_audit_train_on_token_ids_takes_a_canary_that_fits_them(tok, tmp_path):
    """ClipBKD (the default canary) perturbs real-valued features; on token ids the default is a mislabeled record."""
    spec = _spec(tmp_path / "spec.json", "transformer")
    r = invoke(
        "audit", "train", "--data", tok, "--model-spec", spec, "--runs", 2, "--train-size", 80, "--noise-multiplier", 1,
        "--epochs", 1, "--allow-inconclusive", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "one mislabeled canary added or not" in json.loads(r.stdout)["description"]


@pytest.mark.slow
def test_bare_parameter_cnn_on_a_memory_mapped_image_directory(tmp_path):
    """A module adding bare nn.Parameters in forward (an input offset, a channel gain) on CIFAR-shaped records
    (3 x 32 x 32) memory-mapped from X.npy: DP-SGD with the defaults, attacked by loss and LiRA, reported."""
    rng = np.random.default_rng(0)
    n = 300
    y = rng.integers(0, 2, n)
    grating = np.sin(np.arange(32) * 0.8)[None, :, None] * np.ones((3, 32, 32))
    X = rng.normal(size=(n, 3, 32, 32)) + 2.0 * np.where(y == 1, 1.0, -1.0)[:, None, None, None] * grating
    d = tmp_path / "data"
    d.mkdir()
    np.save(d / "X.npy", X.astype(np.float32))
    np.save(d / "y.npy", y)
    spec = {"kind": "python", "factory": "tests.core.byo_models:bare_parameter_cnn"}
    spec |= {"kwargs": {"channels": 3, "size": 32, "n_classes": 2}, "input_shape": [3, 32, 32], "n_classes": 2}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run = tmp_path / "run"
    r = invoke("train", "--data", d, "--model-spec", tmp_path / "spec.json", "--algo", "dpsgd", "--epsilon", 4,
               "--out", run)  # fmt: skip
    assert r.exit_code == 0, r.output
    meta = json.loads((run / CHECKPOINT_FILE).read_text())
    assert meta["data"]["memory_mapped"] is True and meta["privacy"]["epsilon"] <= 4
    r = invoke("attack", "mia", run, "--attacks", "loss,lira", "--reference-models", 2, "--min-models", 1, "--json")
    assert r.exit_code == 0, r.output
    r = invoke("report", run, "--out", tmp_path / "report", "--attacks", "loss")
    assert r.exit_code == 0, r.output


def test_audit_train_with_a_default_batch_above_the_train_size_says_so(tok, tmp_path):
    spec = _spec(tmp_path / "spec.json", "transformer")
    args = ["--runs", 2, "--train-size", 40, "--noise-multiplier", 1]
    # A batch the user gives is refused: was "expected sample_rate in (0, 1], got 1.56", an option never given
    line = one_error(invoke("audit", "train", "--data", tok, "--model-spec", spec, *args, "--batch-size", 64))
    assert "batch size 64 is larger than the training set (41 records)" in line
    # The default one is fitted to the 40 records with a notice (then the 2-run design is refused as too small)
    r = invoke("audit", "train", "--data", tok, "--model-spec", spec, *args)
    assert "the default --batch-size 64 is larger than the 40 training records; using 10" in r.stderr, r.output
    assert "batch size 64" not in one_error(r)


def test_the_learned_nothing_advice_names_every_option_the_algorithm_reads_in_one_sentence():
    # The other half of the test below: every option among --epochs, --steps, --lr, --epsilon that `dpaudit train`
    # reads for the algorithm (OPTION_READERS) is named, and the sentence reads right with one tip (an algorithm that
    # reads none: "more data" alone) and with several; None gives the general advice. Planted: "a larger --lr"
    # dropped, the one-tip branch at len 0 or tips[1], the `algo is None` shortcut dropped -> fails.
    import re

    from dpaudit.training.config import AGGREGATION_ALGOS, OPTION_READERS, TRAINER_ALGOS
    from dpaudit.training.run import _LEARN_QUESTION, learn_question

    for algo in (*TRAINER_ALGOS, *AGGREGATION_ALGOS, "cloak"):
        named = re.findall(r"--([a-z][a-z-]*)", learn_question(algo))
        assert named == [o for o in ("epochs", "steps", "lr", "epsilon") if algo in OPTION_READERS[o]], (algo, named)
    start = "the model learned next to nothing, so membership attacks on it measure little ("
    assert learn_question("dpsgd") == start + (
        "train longer (--epochs, --steps), a larger --lr, more data or a larger --epsilon, or check the data)"
    )
    assert learn_question("objpert") == start + "more data or a larger --epsilon, or check the data)"
    assert learn_question("none-such") == start + "more data, or check the data)"
    assert learn_question(None) == _LEARN_QUESTION


def test_the_learned_nothing_advice_names_only_options_the_algorithm_reads(tmp_path):
    # DP-AGD (full-batch, no learning rate) was told "train longer, with a larger learning rate"; a non-private run
    # "a larger epsilon". Every --option the advice names is one `dpaudit train` reads for that algorithm
    # (OPTION_READERS: the table that refuses unread options), and the train workflow passes its algorithm.
    # Planted: learn_warnings called without algo (the general advice) -> the DP-AGD run's warning names
    # "learning rate" -> fails; learn_question ignoring OPTION_READERS -> the loop fails.
    import re

    from dpaudit.training.config import AGGREGATION_ALGOS, OPTION_READERS, TRAINER_ALGOS
    from dpaudit.training.run import learn_question

    for algo in (*TRAINER_ALGOS, *AGGREGATION_ALGOS, "cloak"):
        named = re.findall(r"--([a-z][a-z-]*)", learn_question(algo))
        assert named and all(algo in OPTION_READERS[o.replace("-", "_")] for o in named), (algo, named)
    assert "--lr" not in learn_question("dpagd") and "--epsilon" not in learn_question("sgd")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "noise.npz", X=rng.normal(size=(300, 6)).astype(np.float32), y=rng.integers(0, 2, 300))
    r = invoke(
        "train", "--data", tmp_path / "noise.npz", "--algo", "dpagd", "--model", "logreg", "--epsilon", 0.1,
        "--out", tmp_path / "r",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "learned next to nothing" in r.stderr and "(train longer (--steps), more data or a larger --epsilon" in (
        r.stderr
    ), r.stderr
    assert "learning rate" not in r.stderr and "--lr" not in r.stderr, r.stderr
