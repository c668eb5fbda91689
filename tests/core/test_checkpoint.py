import json
import pickle

import numpy as np
import pytest
import torch

from dpaudit.checkpoint import CHECKPOINT_FILE, WEIGHTS_FILE, load_run, load_weights_file
from dpaudit.data import load_dataset
from dpaudit.errors import CheckpointError, InputError
from dpaudit.models import build_model, default_spec, model_spec_from_dict
from dpaudit.training.config import TrainConfig
from dpaudit.training.run import import_run, train_run

CASES = {
    "logreg": "digits",
    "mlp": "digits",
    "cnn": "digits",
    "rnn": "synthetic-tokens:n=120,length=8,vocab=20",
}


def _train(tmp_path, kind="mlp", seed=0, name="run", epochs=2):
    ds = load_dataset(CASES[kind])
    spec = default_spec(kind, input_shape=ds.feature_shape, n_classes=ds.n_classes, vocab_size=ds.vocab_size)
    out = tmp_path / name
    meta = train_run(ds, spec, TrainConfig(epochs=epochs, batch_size=16, seed=seed), out=out)
    return ds, out, meta


def test_cpu_only_pins_auto_to_the_cpu(cpu_only):
    # The bit-for-bit tests below rely on it: on a GPU machine "auto" would otherwise train on CUDA.
    from dpaudit.training.config import resolve_device

    assert resolve_device("auto").type == "cpu"


@pytest.mark.parametrize("kind", list(CASES))
def test_round_trip_predictions_identical(tmp_path, kind, cpu_only):
    ds, out, meta = _train(tmp_path, kind)
    run = load_run(out)
    assert run.meta["model"] == meta["model"]
    assert run.privacy is None
    ds2 = run.dataset()
    # Predictions from the reloaded checkpoint equal those recorded at training time (both on the CPU).
    logits = run.logits(ds2.X[run.splits.test])
    acc = float((logits.argmax(1) == ds2.y[run.splits.test]).mean())
    assert acc == pytest.approx(meta["metrics"]["test_accuracy"], abs=0)
    # And a second load gives bit-identical logits.
    np.testing.assert_array_equal(load_run(out).logits(ds.X[:20]), run.logits(ds.X[:20]))


def test_model_spec_round_trip_and_no_batchnorm():
    spec = default_spec("mlp", input_shape=(4,), n_classes=3, hidden=(8, 8), activation="relu")
    assert model_spec_from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    with pytest.raises(InputError, match="unknown model"):
        model_spec_from_dict({"kind": "resnet"})
    with pytest.raises(InputError, match="image-shaped"):
        default_spec("cnn", input_shape=(4,), n_classes=3)
    from dpaudit.models import check_private_layers

    with pytest.raises(InputError, match=r"BatchNorm.*GroupNorm"):
        check_private_layers(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)))


def test_an_mlp_without_hidden_layers_is_refused_as_the_cli_does_but_a_saved_one_loads():
    # MLPSpec(hidden=()) built the linear model under the name mlp while --hidden "," was refused by the CLI.
    from dpaudit.models import MLPSpec, model_spec_from_checkpoint

    with pytest.raises(InputError, match=r"at least one hidden layer.*logreg"):
        MLPSpec(input_shape=(4,), n_classes=3, hidden=())
    with pytest.raises(InputError, match=r"at least one hidden layer"):
        model_spec_from_dict({"kind": "mlp", "input_shape": [4], "n_classes": 3, "hidden": []})
    with pytest.raises(InputError, match=r"at least one hidden layer"):
        default_spec("mlp", input_shape=(4,), n_classes=3, hidden=())
    # A run saved before the refusal still loads, as the linear model it was trained as.
    old = model_spec_from_checkpoint({"kind": "mlp", "input_shape": [4], "n_classes": 3, "hidden": []})
    assert old.hidden == () and [type(m).__name__ for m in old.build()] == ["Flatten", "Linear"]
    with pytest.raises(InputError, match=r"at least one hidden layer"):  # and the leniency ends with the load
        MLPSpec(input_shape=(4,), n_classes=3, hidden=())


def test_determinism_same_seed_same_bytes(tmp_path):
    _, a, _ = _train(tmp_path, "mlp", seed=7, name="a")
    _, b, _ = _train(tmp_path, "mlp", seed=7, name="b")
    _, c, _ = _train(tmp_path, "mlp", seed=8, name="c")
    assert (a / WEIGHTS_FILE).read_bytes() == (b / WEIGHTS_FILE).read_bytes()
    assert (a / CHECKPOINT_FILE).read_bytes() == (b / CHECKPOINT_FILE).read_bytes()
    assert (a / WEIGHTS_FILE).read_bytes() != (c / WEIGHTS_FILE).read_bytes()


def test_refuses_overwrite_and_leaves_nothing_half_written(tmp_path):
    _, out, _ = _train(tmp_path)
    before = (out / WEIGHTS_FILE).read_bytes()
    with pytest.raises(InputError, match="already exists; use --force"):
        _train(tmp_path, seed=1)
    assert (out / WEIGHTS_FILE).read_bytes() == before
    # A failure during training leaves no directory (and no temporary directory) behind.
    ds = load_dataset("digits")
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=10)
    with pytest.raises(InputError):
        train_run(ds, spec, TrainConfig(epochs=1, batch_size=10_000), out=tmp_path / "never")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _corrupt(out, what):
    meta = json.loads((out / CHECKPOINT_FILE).read_text())
    if what == "schema":
        meta["schema_version"] = 99
    elif what == "missing":
        del meta["privacy"]
    elif what == "shape":
        meta["model"]["hidden"] = [64]
    (out / CHECKPOINT_FILE).write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("schema", "unknown schema_version 99"),
        ("missing", "missing key.*privacy"),
        ("shape", "do not match the model spec"),
    ],
)
def test_bad_checkpoint_json(tmp_path, what, message):
    _, out, _ = _train(tmp_path)
    _corrupt(out, what)
    with pytest.raises(CheckpointError, match=message):
        load_run(out)


def test_truncated_weights_and_bad_json(tmp_path):
    _, out, _ = _train(tmp_path)
    w = out / WEIGHTS_FILE
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_run(out)
    (out / CHECKPOINT_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_run(out)


def test_data_changed_is_detected(tmp_path):
    csv = tmp_path / "d.csv"
    rng = np.random.default_rng(0)
    rows = "\n".join(f"{a:.3f},{b:.3f},{int(a > 0)}" for a, b in rng.normal(size=(200, 2)))
    csv.write_text("a,b,label\n" + rows + "\n")
    ds = load_dataset(str(csv), label_column="label")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=2)
    train_run(ds, spec, TrainConfig(epochs=1, batch_size=8), out=tmp_path / "r", label_column="label")
    load_run(tmp_path / "r").dataset()
    csv.write_text("a,b,label\n" + rows.replace("0.", "1.", 1) + "\n")
    with pytest.raises(CheckpointError, match="changed since training"):
        load_run(tmp_path / "r").dataset()


def test_a_run_reloads_its_relative_data_from_another_working_directory(tmp_path, monkeypatch):
    """Trained as `cd proj && dpaudit train --data data/d.npz --out runs/r`, audited from elsewhere: the spec
    as typed is not found from there, so the run reads data.from_run (relative to itself); the sha256 still
    decides. Before: "cannot reload the run's data: data/d.npz: no such file" unless the user cd'd back."""
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(120, 3)).astype(np.float32), rng.integers(0, 2, 120)
    np.savez(proj / "data" / "d.npz", X=X, y=y)
    monkeypatch.chdir(proj)
    ds = load_dataset("data/d.npz")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=2)
    train_run(ds, spec, TrainConfig(epochs=1, batch_size=8), out="runs/r")
    d = json.loads((proj / "runs" / "r" / CHECKPOINT_FILE).read_text())["data"]
    assert d["spec"] == "data/d.npz" and d["from_run"] == "../../data/d.npz"
    monkeypatch.chdir(tmp_path)
    assert load_run(proj / "runs" / "r").dataset().sha256 == ds.sha256
    X[0, 0] += 1
    np.savez(proj / "data" / "d.npz", X=X, y=y)
    with pytest.raises(CheckpointError, match="changed since training"):  # found there, but not the same data
        load_run(proj / "runs" / "r").dataset()
    (proj / "data" / "d.npz").unlink()
    with pytest.raises(CheckpointError, match=r"cannot reload the run's data: data/d\.npz: no such file"):
        load_run(proj / "runs" / "r").dataset()
    # Embedded and absolute specs record no location: nothing to resolve.
    _, out, _ = _train(tmp_path, "logreg", name="emb", epochs=1)
    assert "from_run" not in json.loads((out / CHECKPOINT_FILE).read_text())["data"]


def test_pickle_refused_and_weights_only_state_dict(tmp_path):
    model = build_model(default_spec("logreg", input_shape=(3,), n_classes=2), seed=0)
    pkl = tmp_path / "m.pkl"
    pkl.write_bytes(pickle.dumps(model.state_dict()))
    with pytest.raises(CheckpointError, match="refusing to load a pickle"):
        load_weights_file(pkl)
    fake = tmp_path / "run.pt"
    fake.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="refusing a pickle-based file"):
        load_run(fake)
    pt = tmp_path / "m.pt"
    torch.save(model.state_dict(), pt)
    state = load_weights_file(pt)
    assert set(state) == set(model.state_dict())
    # A full pickled module is refused by weights_only=True loading.
    full = tmp_path / "full.pt"
    torch.save(model, full)
    with pytest.raises(CheckpointError, match="loading it would need pickle, which can run arbitrary code"):
        load_weights_file(full)


def test_import_foreign_weights(tmp_path):
    ds, out, meta = _train(tmp_path)
    spec = model_spec_from_dict(meta["model"])
    imported = import_run(out / WEIGHTS_FILE, spec, ds, out=tmp_path / "imp")
    # Float32 losses re-evaluated on another device (a run trained on CUDA) differ in the last digits
    # (seen on an H200: 0.29945976 vs 0.29945975); a wrong import differs by far more.
    assert imported["metrics"] == pytest.approx(meta["metrics"], rel=1e-6)
    bad_spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=10, hidden=(7,))
    with pytest.raises(CheckpointError, match="do not match the model spec"):
        import_run(out / WEIGHTS_FILE, bad_spec, ds, out=tmp_path / "imp2")


@pytest.mark.peers
def test_opacus_grad_sample_module_state_dict_loads(tmp_path):
    """The real state_dict of an Opacus-wrapped model (GradSampleModule: every key under ``_module.``),
    and of a DDP-style wrapper (``module.``), saved to safetensors, loads into the bare model."""
    opacus = pytest.importorskip("opacus")
    from safetensors.torch import save_file

    from dpaudit.checkpoint import load_state_into

    spec = default_spec("cnn", input_shape=(1, 8, 8), n_classes=3)
    model = build_model(spec, seed=3)
    wrapped = opacus.GradSampleModule(model)
    state = wrapped.state_dict()
    assert state and all(k.startswith("_module.") for k in state)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "opacus.safetensors"))
    save_file({f"module.{k}": v.contiguous() for k, v in state.items()}, str(tmp_path / "ddp.safetensors"))
    x = torch.randn(5, 1, 8, 8)
    for name in ("opacus.safetensors", "ddp.safetensors"):
        fresh = build_model(spec, seed=4)
        load_state_into(fresh, load_weights_file(tmp_path / name), name)
        torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


class _Holder(torch.nn.Module):
    """A user's module keeping every layer under a child named ``module`` (its names all start ``module.``)."""

    def __init__(self) -> None:
        super().__init__()
        self.module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))

    def forward(self, x):
        return 2 * self.module(x)


@pytest.mark.parametrize("make", [_Holder, lambda: torch.compile(_Holder())], ids=["child-named-module", "compiled"])
def test_a_model_whose_own_names_carry_a_wrapper_prefix_reloads(make, tmp_path):
    """The weights saved from a model whose every name carries a wrapper prefix (``torch.compile``'s
    ``_orig_mod.``, a child named ``module``) load back into it: the prefix was stripped from the file's
    names only, so every run trained from such a factory was written and could not be read again."""
    from safetensors.torch import save_file

    from dpaudit.checkpoint import load_state_into

    torch.manual_seed(0)
    trained, fresh = make(), make()
    state = trained.state_dict()
    assert all(k.startswith(("module.", "_orig_mod.")) for k in state)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
    load_state_into(fresh, load_weights_file(tmp_path / "w.safetensors"), "w")
    for k, v in state.items():
        torch.testing.assert_close(fresh.state_dict()[k], v, rtol=0, atol=0)
    with pytest.raises(CheckpointError, match=r"missing 2\.bias"):  # a real mismatch is still named
        load_state_into(fresh, {k: v for k, v in state.items() if not k.endswith("2.bias")}, "w")


def test_a_training_loop_checkpoint_names_the_key_to_save(tmp_path):
    """PyTorch's tutorial checkpoint ({"epoch", "model_state_dict", "optimizer_state_dict", ...}) is refused in
    one line that names the key holding the weights; a dict of tensors loads."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    torch.save({"epoch": 3, "model_state_dict": model.state_dict(), "optimizer_state_dict": opt.state_dict()},
               tmp_path / "ckpt.pt")  # fmt: skip
    with pytest.raises(
        CheckpointError,
        match=r"a training checkpoint \(keys epoch, model_state_dict, .*checkpoint\['model_state_dict'\]",
    ):
        load_weights_file(tmp_path / "ckpt.pt")
    torch.save(model.state_dict(), tmp_path / "w.pt")
    assert set(load_weights_file(tmp_path / "w.pt")) == {"weight", "bias"}


def test_a_relative_data_path_that_no_longer_resolves_says_where_to_run_from(tmp_path, monkeypatch):
    """A run records --data as given (and where the data lies from the run folder); with the run folder moved and
    another working directory, neither names the data (a directory of .npy files then reads as an unknown data
    name): the error says the path is relative to where it was trained."""
    (tmp_path / "project" / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "project" / "data" / "X.npy", rng.normal(size=(40, 3)).astype(np.float32))
    np.save(tmp_path / "project" / "data" / "y.npy", np.arange(40) % 2)
    monkeypatch.chdir(tmp_path / "project")
    ds = load_dataset("data")
    spec = default_spec("logreg", input_shape=ds.feature_shape, n_classes=2)
    train_run(ds, spec, TrainConfig(epochs=1, batch_size=8), out=tmp_path / "run")
    assert load_run(tmp_path / "run").dataset().sha256 == ds.sha256
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").rename(tmp_path / "elsewhere" / "run")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="recorded --data 'data' as given, relative to the directory it was"):
        load_run(tmp_path / "elsewhere" / "run").dataset()


def test_dense_kernels_in_the_jax_layout_are_named_as_such():
    """A Flax/Keras dense kernel is (in, out): saved as a torch weight untransposed, or under its own name, the
    one-line error says to transpose it (a square one would load silently: the hint says so too)."""
    from dpaudit.checkpoint import load_state_into

    model = torch.nn.Linear(5, 3)
    kernel, bias = model.weight.detach().T.contiguous(), model.bias.detach()
    for state in ({"weight": kernel, "bias": bias}, {"Dense_0/kernel": kernel, "Dense_0/bias": bias}):
        with pytest.raises(CheckpointError, match=r"dense kernel is \(in, out\) and torch's Linear weight \(out, in\)"):
            load_state_into(torch.nn.Linear(5, 3), state, "flax.safetensors")


def test_a_run_in_a_folder_named_in_another_encoding_loads(tmp_path):
    """A folder whose name is not valid UTF-8 (a Latin-1 name on Linux): safetensors takes its path as a Rust
    string and refused it, which read as "corrupt or truncated safetensors file"; the weights now load."""
    import os

    name = os.fsdecode(b"r\xe9sultats")  # 'résultats' in Latin-1: a surrogate escape in Python
    _, out, _ = _train(tmp_path, "logreg", name=name, epochs=1)
    run = load_run(out)
    assert set(load_weights_file(out / WEIGHTS_FILE)) == set(run.model.state_dict())


def test_evaluation_batches_of_images_hold_a_few_megabytes():
    """Logits were computed 2,048 records at a time whatever their size: CIFAR-shaped images (3 x 32 x 32) put
    25 MB of input and +591 MB of a residual CNN's activations in memory at once on a laptop. Now about 4 MiB of
    input per batch (341 images); small records (tabular, digits, token ids) keep 2,048 rows, and every row is
    still evaluated once, in order."""
    from torch import nn

    from dpaudit.checkpoint import predict_logits

    class Rows:  # a lazily read data set (as a RowView): only the rows asked for exist
        def __init__(self, n, shape):
            self.n, self.shape = n, (n, *shape)

        def __len__(self):
            return self.n

        def __getitem__(self, key):
            idx = np.arange(self.n)[key]
            return np.broadcast_to(
                idx.astype(np.float32).reshape(-1, *[1] * (len(self.shape) - 1)), (len(idx), *self.shape[1:])
            )

    class First(nn.Module):  # logits: each record's first value, and the batch sizes it was given
        def __init__(self):
            super().__init__()
            self.w, self.sizes = nn.Parameter(torch.zeros(1)), []

        def forward(self, x):
            self.sizes.append(len(x))
            return x.reshape(len(x), -1)[:, :1] + self.w

    for shape, rows in (((3, 32, 32), 341), ((64,), 2048), ((1, 8, 8), 2048)):
        model = First()
        logits = predict_logits(model, Rows(5000, shape))
        assert max(model.sizes) == rows, shape  # 341 x 12 KiB = 4 MiB of images
        assert np.array_equal(logits[:, 0], np.arange(5000))
    model = First()  # a record above 4 MiB (a 3 x 1024 x 1024 image): one row a batch, never 0 rows
    assert (
        np.array_equal(predict_logits(model, Rows(3, (3, 1024, 1024)))[:, 0], np.arange(3)) and model.sizes == [1] * 3
    )


def test_check_weights_file_takes_a_string_and_refuses_an_unknown_type(tmp_path):
    """fileio.check_weights_file (no torch; dpaudit import's first check) on a str path as on a Path, and a file of
    another type refused by name. Planted: Path(path) dropped (a str has no .exists), the type test dropped (a
    .txt file passed), both passed the CLI tests, which give a Path and a .pkl, a folder or a missing file."""
    from dpaudit.fileio import check_weights_file

    (tmp_path / "w.txt").write_text("weights")
    (tmp_path / "w.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"w\.txt: unsupported weights file type '\.txt'; use \.safetensors"):
        check_weights_file(str(tmp_path / "w.txt"))
    with pytest.raises(CheckpointError, match="no such file"):
        check_weights_file(str(tmp_path / "none.safetensors"))
    assert check_weights_file(str(tmp_path / "w.safetensors")) == tmp_path / "w.safetensors"
