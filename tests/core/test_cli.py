import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dpaudit.cli.main import app

runner = CliRunner()
FAST = ["--epochs", "1", "--batch-size", "32"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_version_and_help():
    r = invoke("--version")
    assert r.exit_code == 0 and r.output.startswith("dpaudit ")
    r = invoke("--help")
    assert r.exit_code == 0
    assert "Exit codes" in r.output and "2 bad usage" in r.output


def test_train_inspect_json_keys(tmp_path):
    out = tmp_path / "run"
    r = invoke("train", "--out", out, *FAST, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["out"] == str(out)
    r = invoke("--json", "inspect", out)
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    for key in ("test_accuracy", "train_accuracy", "epsilon", "delta", "model", "algo", "data_sha256", "private"):
        assert key in s
    assert s["epsilon"] is None and s["delta"] is None and s["private"] is False
    r = invoke("inspect", out)
    assert "accuracy" in r.output and "non-private" in r.output


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "/nope/missing.csv"], "no such file"),
        (["--data", "nope"], "unknown dataset 'nope'; valid: digits"),
        (["--model", "resnet"], "unknown model 'resnet'; valid: logreg, mlp, cnn, rnn"),
        (["--algo", "rmsprop"], "unknown algorithm 'rmsprop'; valid:"),
        (["--epochs", "0"], "expected epochs >= 1, got 0"),
        (["--epochs", "-3"], "expected epochs >= 1, got -3"),
        (["--batch-size", "0"], "expected batch_size >= 1, got 0"),
        (["--lr", "0"], "expected lr > 0, got 0"),
        (["--lr", "-1"], "expected lr > 0, got -1"),
        (["--batch-size", "100000"], "batch size 100000 is larger than the training set"),
        (["--model", "cnn", "--data", "wine"], "cnn needs image-shaped input"),
        (["--split", "0.5,0.5"], "four fractions"),
    ],
)
def test_train_bad_input(tmp_path, args, message):
    r = invoke("train", "--out", tmp_path / "run", *FAST, *args)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a,b\n1,2\n3,4\n", "no label column 'label'"),
        ("a,label\nx,0\ny,1\n", "non-numeric feature column"),
        ("a,label\n1,0\ninf,1\n", "NaN or inf"),
        ("a,label\n1,0\n2,0\n", "single class"),
        ("a,label\n", "empty"),
    ],
)
def test_train_bad_csv(tmp_path, content, message):
    f = _write(tmp_path, "d.csv", content)
    r = invoke("train", "--out", tmp_path / "run", *FAST, "--data", f, "--label-column", "label")
    assert r.exit_code == 2 and message in r.output, r.output


def test_existing_output_needs_force(tmp_path):
    out = tmp_path / "run"
    assert invoke("train", "--out", out, *FAST).exit_code == 0
    r = invoke("train", "--out", out, *FAST)
    assert r.exit_code == 2 and "already exists; use --force" in r.output
    assert invoke("train", "--out", out, *FAST, "--force").exit_code == 0


def test_inspect_bad_checkpoints(tmp_path):
    out = tmp_path / "run"
    assert invoke("train", "--out", out, *FAST).exit_code == 0
    r = invoke("inspect", tmp_path / "missing")
    assert r.exit_code == 2 and "no such run directory" in r.output
    (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes()[:64])
    r = invoke("inspect", out)
    assert r.exit_code == 2 and "corrupt or truncated" in r.output
    pkl = _write(tmp_path, "model.pkl", "x")
    r = invoke("inspect", pkl)
    assert r.exit_code == 2 and "pickle" in r.output


def test_unknown_option_is_usage_error():
    r = invoke("train", "--no-such-option")
    assert r.exit_code == 2


def test_console_script_subprocess(tmp_path):
    """The installed entry point and `python -m dpaudit` behave like the CliRunner."""
    exe = [sys.executable, "-m", "dpaudit"]
    r = subprocess.run([*exe, "--version"], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout.startswith("dpaudit ")
    r = subprocess.run([*exe, "train", "--out", str(tmp_path / "r"), "--data", "nope"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: unknown dataset 'nope'; valid: digits, breast-cancer, wine, "
        "synthetic:n=..,d=..,classes=.., synthetic-tokens:..., PATH.csv, PATH.npz"
    ]
    import shutil

    script = shutil.which("dpaudit", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert script is not None
    r = subprocess.run(
        [script, "--json", "train", "--out", str(tmp_path / "r2"), "--epochs", "1"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"] == "mlp"
