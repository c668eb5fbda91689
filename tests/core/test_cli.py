import inspect
import json
import subprocess
import sys

import pytest
import typer.main
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
    # the README's list of the stable keys is the keys (it left out epsilon_recomputed and claim_mismatch)
    import re
    from pathlib import Path

    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    listed = re.search(r"`dpaudit inspect RUN --json` keys \(stable\): `([^`]+)`", readme)
    assert listed and [k.strip() for k in listed.group(1).split(",")] == list(s)
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
        (["--data", "nope"], "unknown --data 'nope'; valid: digits"),
        (["--model", "resnet"], "unknown --model 'resnet'; valid: logreg, mlp, cnn, rnn"),
        (["--algo", "rmsprop"], "unknown --algo 'rmsprop'; valid:"),
        (["--epochs", "0"], "expected --epochs >= 1, got 0"),
        (["--epochs", "-3"], "expected --epochs >= 1, got -3"),
        (["--batch-size", "0"], "expected --batch-size >= 1, got 0"),
        (["--lr", "0"], "expected --lr > 0, got 0"),
        (["--lr", "-1"], "expected --lr > 0, got -1"),
        (["--batch-size", "100000"], "batch size 100000 is larger than the training set"),
        (["--model", "cnn", "--data", "wine"], "cnn needs image-shaped input"),
        (["--split", "0.5,0.5"], "four fractions"),
        # an empty part used to be dropped (``,`` trained an MLP with no hidden layer), and 0 and -3 were
        # refused in two different wordings: one message for every malformed --hidden now
        *[
            (
                ["--model", "mlp", "--hidden", h],
                f"expected --hidden as comma-separated integers >= 1 (e.g. 128,64), got {h!r}",
            )
            for h in (",", "8,,4", "", "0", "-3", "x")
        ],
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
        ("a,label\n1,0\n2,0\n", "single class (0); need"),  # not np.int64(0)
        ("a, label\n1,0\n2,0\n", "single class"),  # " label" found: the space after the comma
        ("a,label\n1,cat\n2,cat\n", "single class ('cat'); need"),
        # no header, or another separator: the first line says so rather than listing it as column names
        ("1.5,2,0\n3,4,1\n", "no label column 'label': its first line (1.5, 2, 0) is data, not a header"),
        ("a;label\n1;0\n", "no label column 'label': the file looks semicolon-separated ('a;label')"),
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
        "error: unknown --data 'nope'; valid: digits, breast-cancer, wine, "
        "synthetic:n=..,d=..,classes=.., synthetic-tokens:..., PATH.csv, PATH.npz, DIR (X.npy, y.npy)"
    ]
    import shutil

    script = shutil.which("dpaudit", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert script is not None
    r = subprocess.run(
        [script, "--json", "train", "--out", str(tmp_path / "r2"), "--epochs", "1"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"] == "mlp"


# --- error messages name the CLI's options ------------------------------------------------------------

ACCOUNT = ["account", "dpsgd", "--noise-multiplier", "1", "--delta", "1e-5"]
SCHEDULE = ["--sample-rate", "0.1", "--steps", "3"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*ACCOUNT, "--sample-rate", "1.5", "--steps", "3"], "error: expected --sample-rate in (0, 1], got 1.5"),
        ([*ACCOUNT, *SCHEDULE, "--noise-multiplier", "-1"], "error: expected --noise-multiplier >= 0, got -1.0"),
        (
            [*ACCOUNT, *SCHEDULE, "--delta", "1"],
            "error: expected --delta in (0, 0.1], got 1.0 (a larger delta is no privacy guarantee)",
        ),
        ([*ACCOUNT, *SCHEDULE, "--jl-projections", "0"], "error: expected --jl-projections >= 1, got 0"),
        ([*ACCOUNT, "--epochs", "1", "--dataset-size", "10", "--batch-size", "20"],
         "error: expected --batch-size <= --dataset-size, got 20 > 10"),
        (["account", "calibrate", "--epsilon", "0", "--delta", "1e-5", "--sample-rate", "0.1", "--steps", "3"],
         "error: expected --epsilon > 0, got 0.0"),
        (["train", "--out", "never", "--batch-size", "0"], "error: expected --batch-size >= 1, got 0"),
        (["train", "--out", "never", "--algo", "dpsgd", "--noise-multiplier", "-2"],
         "error: expected --noise-multiplier >= 0, got -2.0"),
        # Prose is left alone: a single-word name only right after "expected".
        (["train", "--out", "never", "--algo", "dpsgd", "--noise-multiplier", "1", "--sampling", "random"],
         "error: unknown --sampling 'random'; valid: poisson, shuffle"),
    ],
)  # fmt: skip
def test_errors_name_options_not_python_arguments(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == [message]
    assert r.stdout == "" and not (tmp_path / "never").exists()


def test_library_messages_keep_python_names():
    from dpaudit.accounting import dpsgd_event
    from dpaudit.errors import InputError
    from dpaudit.validation import check_in_interval

    with pytest.raises(InputError, match=r"^expected sample_rate in \(0, 1\], got 1.5$"):
        check_in_interval(0.0, 1.0, hi_open=False, sample_rate=1.5)
    with pytest.raises(InputError, match=r"expected sample_rate in"):
        dpsgd_event(noise_multiplier=1.0, sample_rate=1.5, steps=3)


def test_with_option_names_rules():
    import click

    from dpaudit.cli._common import with_option_names

    params = [
        click.Option(["--sample-rate"]),
        click.Option(["--delta"]),
        click.Option(["--kind"]),
        click.Option(["--threshold-selection"]),
        click.Option(["--k-plus"]),
        click.Option(["--k-minus"]),
        click.Option(["--secure-noise"], is_flag=True),
        click.Option(["--model-spec"]),
        click.Option(["-c", "--checkpoint"]),
        click.Argument(["run_dir"]),
    ]
    cases = {
        "expected sample_rate in (0, 1], got 1.5": "expected --sample-rate in (0, 1], got 1.5",
        "expected delta in (0, 1), got 1": "expected --delta in (0, 1), got 1",
        "expected checkpoint to exist": "expected --checkpoint to exist",
        "unknown threshold_selection 'x'; valid: a, b": "unknown --threshold-selection 'x'; valid: a, b",
        "unknown kind 'foo'; valid: mislabeled, outlier": "unknown --kind 'foo'; valid: mislabeled, outlier",
        "unknown kind mode 'soft'": None,
        "k_plus/k_minus fix the guess counts; drop threshold_selection='bonferroni'":
            "--k-plus/--k-minus fix the guess counts; drop --threshold-selection bonferroni",
        "k_plus + k_minus must be at least 1": "--k-plus + --k-minus must be at least 1",
        "secure_noise is on": "--secure-noise is on",
        # The alternative to an option written as one, whichever comes first in the command (audit plan said
        # "give --true-epsilon or mu"); not after other words, nor a name of no option.
        "give k_plus or kind": "give --k-plus or --kind",
        "give --k-plus or delta": "give --k-plus or --delta",
        "give the plan or delta": None,
        "give --k-plus or sigma": None,
        # Left alone (None): prose, flags' NAME=value, paths, attributes, calls, longer identifiers,
        # arguments, names of no option of this command, and options already written as such.
        "no sigma reaches epsilon=3 at delta=1e-05": None,
        "secure_noise=True needs a CSPRNG": None,
        "runs/model_spec.json: no such file": None,
        "cache/k_plus/x": None,
        "self.sample_rate, check_sample_rate(), max_sample_rate": None,
        "expected run_dir to exist": None,
        "expected n_classes >= 2, got 1": None,
        "give --sample-rate and --steps": None,
    }  # fmt: skip
    for message, expected in cases.items():
        assert with_option_names(message, params) == (message if expected is None else expected)


def test_an_unknown_choice_names_its_option_and_the_valid_values(tmp_path):
    # check_choice says "unknown kind 'foo'"; the user typed --canary-kind (as every other choice error names it).
    make = ("canaries", "make", "--data", "digits", "--count", "4", "--out", tmp_path / "c")
    r = invoke(*make, "--canary-kind", "foo")
    assert r.exit_code == 2
    assert "unknown --canary-kind 'foo'; valid: mislabeled, outlier, clipbkd, crafted" in r.output


def test_canary_kind_is_one_name_everywhere_and_kind_a_deprecated_alias(tmp_path):
    import typer.main

    command = typer.main.get_command(app)
    flags = {  # the visible spelling of the canary kind in every command that has one
        path: [p.opts for p in command.commands[path[0]].commands[path[1]].params if "kind" in p.name and not p.hidden]
        for path in (("canaries", "make"), ("audit", "train"))
    }
    flags["train"] = [p.opts for p in command.commands["train"].params if "kind" in p.name]
    assert all(opts == [["--canary-kind"]] for opts in flags.values()), flags
    make = ("canaries", "make", "--data", "digits", "--count", "4", "--json")
    new = invoke(*make, "--out", tmp_path / "a", "--canary-kind", "outlier")
    old = invoke(*make, "--out", tmp_path / "b", "--kind", "outlier")
    assert new.exit_code == 0 and json.loads(new.stdout)["kind"] == "outlier", new.output
    assert old.exit_code == 0 and json.loads(old.stdout)["kind"] == "outlier", old.output
    assert "--kind is deprecated; use --canary-kind" in old.stderr
    both = invoke(*make, "--out", tmp_path / "c", "--kind", "outlier", "--canary-kind", "clipbkd")
    assert both.exit_code == 2 and "--kind and --canary-kind differ" in both.output


@pytest.mark.parametrize(
    ("args", "cli"),
    [
        (["train", "--data", "nope"], "error: unknown --data 'nope'; valid: digits"),
        (["train", "--algo", "rmsprop"], "error: unknown --algo 'rmsprop'; valid: adam, dp-icl, "),
        (["audit", "train", "--algo", "sgd", "--data", "nope"], "error: unknown --data 'nope'; valid: digits"),
        (["audit", "train", "--algo", "rmsprop"], "error: unknown --algo 'rmsprop'; valid: adam, "),
    ],
)  # fmt: skip
def test_unknown_data_and_algo_name_the_option_and_refuse_before_any_work(tmp_path, args, cli):
    """The library names its parameter (data, algo); the CLI the option the user typed; and nothing is announced
    or trained first (`audit train --algo rmsprop` used to print "train 200 models" before refusing)."""
    from dpaudit.data import load_dataset
    from dpaudit.errors import InputError
    from dpaudit.training.algorithms import get_trainer

    with pytest.raises(InputError, match=r"^unknown data 'nope'; valid: digits"):
        load_dataset("nope")
    with pytest.raises(InputError, match=r"^unknown algo 'rmsprop'; valid: adam, "):
        get_trainer("rmsprop")
    extra = ["--out", tmp_path / "run"] if args[0] == "train" else ["--epochs", "1", "--runs", "2"]
    r = invoke(*args, *extra)
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines()[0].startswith(cli), r.stderr  # the only line: no progress before it
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["audit", "plan", "--help"],
        ["account", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
        ["--json", "account", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10", "--delta",
         "1e-5"],
    ],
)  # fmt: skip
def test_a_closed_stdout_exits_141_silently(args):
    # `dpaudit ... | head -1`: the reader goes away. Made deterministic by a pipe whose read end is closed
    # before dpaudit writes: every write meets EPIPE. Exit 141 (as a command killed by SIGPIPE), nothing on
    # stderr (no traceback, no "error" line, no "Exception ignored" at the interpreter's last flush).
    import os

    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "dpaudit", *args], stdout=w, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == 141, p.stderr.decode()
    assert p.stderr == b""


def _commands(group, path=()):
    ctx = group.make_context("dpaudit", ["--help"], resilient_parsing=True)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        yield from _commands(cmd, (*path, name)) if hasattr(cmd, "list_commands") else [((*path, name), cmd)]


def test_every_usage_line_spells_the_run_argument_RUN():
    # README: "Every command names the run it reads as its first argument, RUN" -- in every usage line and
    # arguments panel, not `{run}` (typer's required argument) in some and `[RUN]` (optional) in others.
    import re

    import typer

    commands = list(_commands(typer.main.get_command(app)))
    # the positional RUN (`audit canaries --run RUN` is an option naming the run its canaries came from)
    with_run = [
        path for path, cmd in commands if any(p.name == "run" and p.param_type_name == "argument" for p in cmd.params)
    ]
    assert len(with_run) >= 6  # inspect, audit checkpoint, attack mia/extract/inversion/attribute
    for path, _cmd in commands:
        r = invoke(*path, "--help")
        assert r.exit_code == 0, (path, r.output)
        usage = next(line for line in r.output.splitlines() if "Usage:" in line).split()
        assert not any("{" in piece for piece in usage), (path, usage)
        if path in with_run:
            assert usage[-1] == "RUN" and "[RUN]" not in usage, (path, usage)
            assert re.search(r"^│[\s*]+RUN\s", r.output, re.M) and not re.search(r"^│[\s*]+run\s", r.output, re.M), path


def test_a_checkpoints_unknown_data_is_not_named_as_an_option(tmp_path):
    """`train --algo cloak --target RUN` has a --data option, but RUN's recorded data spec is no --data the user
    typed: a CheckpointError's names are the file's, left as written (as a FileContentError's)."""
    from tests.core.cli_errors import one_error

    run = tmp_path / "run"
    assert invoke("--quiet", "train", "--model", "logreg", "--epochs", "1", "--out", run).exit_code == 0
    meta = json.loads((run / "checkpoint.json").read_text())
    meta["data"]["spec"] = "nope"
    (run / "checkpoint.json").write_text(json.dumps(meta))
    line = one_error(invoke("train", "--algo", "cloak", "--target", run, "--lambda", "1", "--out", tmp_path / "c"))
    assert "cannot reload the run's data: unknown data 'nope'; valid: digits" in line, line


@pytest.mark.parametrize(
    ("args", "option", "algo"),
    [
        (["--algo", "sgd", "--clip", "1"], "--clip", "sgd"),  # the default value, typed: still refused
        (["--algo", "adam", "--delta", "1e-6"], "--delta", "adam"),
        (["--algo", "sgd", "--sampling", "shuffle"], "--sampling", "sgd"),
        (["--algo", "sgd", "--accountant", "pld"], "--accountant", "sgd"),
        (["--algo", "sgd", "--secure-noise"], "--secure-noise", "sgd"),
        (["--algo", "sgd", "--teachers", "5"], "--teachers", "sgd"),
        (["--algo", "sgd", "--epsilon", "1"], "--epsilon", "sgd"),
        (["--algo", "outpert", "--epsilon", "1", "--delta", "1e-6"], "--delta", "outpert"),  # pure epsilon
        (["--algo", "outpert", "--epsilon", "1", "--clip", "2"], "--clip", "outpert"),
        (["--algo", "dpagd", "--epsilon", "1", "--sampling", "poisson"], "--sampling", "dpagd"),
        (["--algo", "pate", "--teachers", "5", "--l2", "0.1"], "--l2", "pate"),
        (["--algo", "pate", "--teachers", "5", "--canaries", "4"], "--canaries", "pate"),
        (["--algo", "cloak", "--clip", "2"], "--clip", "cloak"),
        (["--algo", "sgd", "--clipping", "ghost"], "--clipping", "sgd"),  # nothing is clipped
        (["--algo", "dpsgd-jl", "--noise-multiplier", "1", "--clipping", "vmap"], "--clipping", "dpsgd-jl"),
        (["--algo", "sgd", "--autocast", "bf16"], "--autocast", "sgd"),  # no clipper: nothing runs in bf16
        (["--algo", "dpsgd-jl", "--noise-multiplier", "1", "--autocast", "bf16"], "--autocast", "dpsgd-jl"),
        # One case per row of OPTION_READERS (a reader added to a row by mistake passed every case above):
        (["--algo", "dpagd", "--epsilon", "1", "--noise-multiplier", "1"], "--noise-multiplier", "dpagd"),
        (["--algo", "objpert", "--epsilon", "1", "--delta", "1e-6"], "--delta", "objpert"),  # pure epsilon
        (["--algo", "dpagd", "--epsilon", "1", "--accountant", "rdp"], "--accountant", "dpagd"),  # zCDP
        (
            ["--algo", "outpert", "--mechanism", "gaussian", "--epsilon", "1", "--accountant", "pld"],
            "--accountant",
            "outpert-gaussian",
        ),
        (["--algo", "pate", "--teachers", "5", "--secure-noise"], "--secure-noise", "pate"),
        (["--algo", "dpsgd", "--noise-multiplier", "1", "--jl-projections", "4"], "--jl-projections", "dpsgd"),
        (["--algo", "sgd", "--whitebox-canaries", "4"], "--whitebox-canaries", "sgd"),
        (["--algo", "dpsgd", "--noise-multiplier", "1", "--queries", "10"], "--queries", "dpsgd"),
        # The optimiser's settings (FAST gives --epochs and --batch-size): the convex learners solve exactly and
        # DP-AGD reads --steps only; Cloak's Adam has no momentum and runs epochs. Before: silently ignored.
        (["--algo", "outpert", "--epsilon", "1"], "--epochs", "outpert"),
        (["--algo", "objpert", "--epsilon", "1", "--steps", "5"], "--epochs", "objpert"),
        (["--algo", "dpagd", "--epsilon", "1"], "--epochs", "dpagd"),
        (["--algo", "cloak", "--momentum", "0.9"], "--momentum", "cloak"),
        (["--algo", "cloak", "--steps", "5"], "--steps", "cloak"),
        (["--algo", "cloak", "--data", "wine"], "--data", "cloak"),  # the target's data is used (was: silently)
        (["--algo", "cloak", "--split", "0.5,0.5,0,0"], "--split", "cloak"),
        (["--algo", "pate", "--teachers", "5", "--backend", "jax"], "--backend", "pate"),  # was: trained with torch
        (["--algo", "dp-icl", "--teachers", "5", "--device", "cuda"], "--device", "dp-icl"),  # was: on the CPU
        (["--algo", "sgd", "--max-physical-batch", "8"], "--max-physical-batch", "sgd"),  # was: silently ignored
        (["--algo", "outpert", "--max-physical-batch", "8"], "--max-physical-batch", "outpert"),
        # --predictor is DP-ICL's in-context predictor, --workers PATE's parallel teachers: was exit 0, ignored.
        (["--algo", "pate", "--teachers", "5", "--predictor", "prototype"], "--predictor", "pate"),
        (["--algo", "dp-icl", "--teachers", "5", "--workers", "2"], "--workers", "dp-icl"),
        # Adam has no heavy-ball momentum (base.make_optimizer passes none): was exit 0, silently ignored.
        (["--algo", "adam", "--momentum", "0.9"], "--momentum", "adam"),
        (["--algo", "dpadam-jl", "--epsilon", "1", "--momentum", "0.9"], "--momentum", "dpadam-jl"),
    ],
)
def test_an_option_the_algorithm_does_not_read_is_refused(tmp_path, args, option, algo):
    r = invoke("train", "--out", tmp_path / "run", *FAST, *args)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert lines[0].startswith(f"error: {option} does not apply to --algo {algo} ("), lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"algo": "sgd", "noise_multiplier": 1.0}, "--noise-multiplier"),
        ({"algo": "dpsgd", "noise_multiplier": 1.0, "claim": "data-dependent"}, "--claim"),
        ({"algo": "sgd", "keep_private_diagnostics": True}, "--keep-private-diagnostics"),
        # Away from the value meaning "not given" (config.NOT_GIVEN); before: trained without a word.
        ({"algo": "pate", "device": "cuda"}, "--device"),  # PATE's teachers train on the CPU
        ({"algo": "dp-icl", "backend": "jax"}, "--backend"),
        ({"algo": "adam", "max_physical_batch": 8}, "--max-physical-batch"),
        ({"algo": "sgd", "autocast": "bf16"}, "--autocast"),
        ({"algo": "pate", "secure_noise": True}, "--secure-noise"),
    ],
)
def test_a_python_caller_is_refused_an_option_the_algorithm_does_not_read(tmp_path, options, option):
    # train_from_options without `given` (a Python caller, no click): an option away from its default counts as given.
    # Planted: that merge dropped, --claim or --keep-private-diagnostics left out of it -> fails.
    from dpaudit.errors import InputError
    from dpaudit.workflows.runs import train_from_options

    defaults = {p.name: p.default for p in typer.main.get_command(app).commands["train"].params}
    kw = {name: defaults[name] for name in inspect.signature(train_from_options).parameters if name in defaults}
    with pytest.raises(InputError, match=rf"^{option} does not apply to --algo {options['algo']} "):
        train_from_options(**{**kw, "out": tmp_path / "never", **options})
    assert not (tmp_path / "never").exists()


def test_a_canary_option_without_canaries_is_refused_and_the_readers_agree_with_the_registry(tmp_path):
    from dpaudit.errors import InputError
    from dpaudit.training.algorithms import TRAINERS
    from dpaudit.training.config import AGGREGATION_ALGOS, OPTION_READERS, TRAINER_ALGOS, check_options_read

    r = invoke("train", "--out", tmp_path / "run", *FAST, "--canary-kind", "outlier")
    assert r.exit_code == 2 and r.output.strip() == "error: --canary-kind applies only with --canaries", r.output
    # The white-box canaries read --canary-seed too (planted: the seed's needs narrowed to --canaries -> fails).
    check_options_read("dpsgd", {"whitebox_canaries", "canary_seed"})
    with pytest.raises(InputError, match=r"^--canary-seed applies only with --canaries or --whitebox-canaries$"):
        check_options_read("dpsgd", {"canary_seed"})
    assert set(TRAINER_ALGOS) == set(TRAINERS)
    known = {*TRAINERS, *AGGREGATION_ALGOS, "cloak"}
    assert all(set(readers) <= known for readers in OPTION_READERS.values())
    train_params = {p.name for p in typer.main.get_command(app).commands["train"].params}
    assert set(OPTION_READERS) <= train_params  # every name is an option of `dpaudit train`


def test_a_claim_delta_of_zero_or_below_is_refused_as_out_of_range():
    # delta = 0 is no (eps, delta) claim the accountants can meet (they take delta in (0, 1)); only a delta above the
    # cap is told "no privacy guarantee". Planted: 0 <= delta accepted -> fails.
    from dpaudit.errors import InputError
    from dpaudit.validation import check_claim_delta

    for value, shown in ((0.0, "0.0"), (-1e-9, "-1e-09")):
        with pytest.raises(InputError, match=rf"^expected delta in \(0, 0.1\], got {shown}$"):
            check_claim_delta(delta=value)
    assert check_claim_delta(delta=0.1) == 0.1


@pytest.mark.parametrize(
    "args",
    [
        ["account", "dpsgd", "--noise-multiplier", "1", *SCHEDULE],
        ["account", "calibrate", "--epsilon", "1", *SCHEDULE],
        ["train", "--out", "never", *FAST, "--algo", "dpsgd", "--noise-multiplier", "1"],
        ["train", "--out", "never", *FAST, "--algo", "pate", "--teachers", "3", "--sigma", "2"],
    ],
)
def test_one_delta_rule_for_every_claim(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a train that wrongly runs writes its --out here, not into the checkout
    # A claim's δ is in (0, 0.1] everywhere (dpaudit.validation.check_claim_delta): account dpsgd took 0.2 and
    # 0.9999999 (printed "delta = 1"), train --algo pate took 0.5, while calibrate and train --algo dpsgd refused.
    for delta in ("0.2", "0.9999999"):
        r = invoke(*args, "--delta", delta)
        assert r.exit_code == 2, r.output
        want = f"error: expected --delta in (0, 0.1], got {delta} (a larger delta is no privacy guarantee)"
        assert r.output.strip() == want, r.output
    if args[0] == "account":  # the cap itself is a claim's δ, printed as given
        r = invoke(*args, "--delta", "0.1")
        assert r.exit_code == 0 and "delta = 0.1," in r.output, r.output


def test_the_optimiser_and_device_options_are_refused_exactly_where_no_trainer_reads_them():
    """The OPTION_READERS rows for the optimiser's settings, one algorithm family at a time: the CLI case above stops
    at the first unread option (--epochs, given by FAST), so a row that wrongly let --steps or --momentum through for
    a convex learner (silently ignored: the exact solve has no steps) passed it. Planted: "steps" read by objpert."""
    from dpaudit.errors import InputError
    from dpaudit.training.config import DPAGD_ALGOS, PERTURBATION_ALGOS, check_options_read

    options = ("epochs", "batch_size", "lr", "momentum", "steps", "backend", "device")
    reads = {
        **dict.fromkeys(PERTURBATION_ALGOS, ()),
        **dict.fromkeys(DPAGD_ALGOS, ("steps",)),
        "cloak": ("epochs", "batch_size", "lr"),
        "pate": options[:5],
        "dp-icl": options[:5],
        "dpsgd": options,
        "sgd": options,
        "adam": tuple(o for o in options if o != "momentum"),  # Adam's β, not SGD's momentum
        "dpadam": tuple(o for o in options if o != "momentum"),
    }
    for algo, read in reads.items():
        for option in options:
            if option in read:
                check_options_read(algo, {option})
            else:
                with pytest.raises(InputError, match=f"^--{option.replace('_', '-')} does not apply to --algo {algo} "):
                    check_options_read(algo, {option})
    # The privacy options' and --l2's readers, as each mechanism reads them: δ by the (ε, δ) ones (not outpert's or
    # objpert's pure ε), DP-AGD's C_grad as --clip, the CSPRNG of every noise-adding trainer (not PATE's), the
    # weight decay λ of (λ/2)‖w‖² by every registered trainer (not the aggregations or Cloak). Mutation pass 19:
    # each of these rows given its neighbour's readers passed (the refusals above test who does not read).
    rows = {
        "delta": (("dpsgd", "outpert-gaussian", "dpagd", "pate", "dp-icl"), ("outpert", "objpert", "sgd")),
        "clip": (("dpsgd", "dpsgd-jl", "dpagd", "dpagd-huber"), ("outpert", "sgd", "pate")),
        "secure_noise": (("dpsgd", "dpadam-jl", "outpert", "objpert", "dpagd"), ("sgd", "pate")),
        "mechanism": (("outpert", "outpert-gaussian", "objpert"), ("dpagd", "dpsgd")),
        "objective": (("dpagd", "dpagd-huber"), ("dpsgd", "outpert")),  # the CLI's resolve_algo refuses these first
        "l2": (
            ("sgd", "adam", "dpsgd", "dpadam", "dpsgd-jl", "dpadam-jl", "outpert", "objpert", "dpagd"),
            ("pate", "dp-icl", "cloak"),
        ),
    }
    for option, (readers, others) in rows.items():
        for algo in readers:
            check_options_read(algo, {option})
        for algo in others:
            with pytest.raises(InputError, match=f"^--{option.replace('_', '-')} does not apply to --algo {algo} "):
                check_options_read(algo, {option})


def test_a_trainers_python_warning_reaches_the_user_as_one_warning_line(tmp_path, monkeypatch):
    # DP-SGD-JL on a 14-parameter logreg printed Python's form: "/.../dpaudit/training/jl.py:459: UserWarning: 16 JL
    # projections for 14 parameters: ..." and then the source line "return JLClipper(...)". Now one "warning:" line;
    # a warning from outside dpaudit is shown as Python shows it. The training itself is replaced (the warning comes
    # from the real clipper): only the route to the user is under test.
    import warnings

    import torch

    from dpaudit.errors import InputError
    from dpaudit.training.jl import make_jl_clipper
    from dpaudit.workflows import runs

    def fake(out, **kw):
        make_jl_clipper(torch.nn.Linear(6, 2), 16, 0)
        warnings.warn_explicit("a note from elsewhere", UserWarning, "/elsewhere/user_code.py", 7)
        raise InputError("stopped after the clipper")

    monkeypatch.setattr(runs, "train_from_options", fake)
    with pytest.warns(UserWarning, match="a note from elsewhere"):  # Python's own route (pytest records it here)
        r = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "run"), "--algo", "dpsgd-jl"])
    assert r.exit_code == 2 and "error: stopped after the clipper" in r.stderr, r.output
    lines = r.stderr.splitlines()
    assert (
        "warning: 16 JL projections for 14 parameters: more directions than dimensions (allowed; exact per-example "
        "clipping would be cheaper)" in lines
    ), r.stderr
    assert "jl.py" not in r.stderr and "JLClipper(" not in r.stderr
    assert "a note from elsewhere" not in r.stderr


def test_every_command_shows_dpaudits_python_warnings_as_one_warning_line(monkeypatch):
    # The route is the command wrapper (App.command), not `train` alone: `audit train` trains DP-SGD-JL recipes too
    # and printed Python's "/.../jl.py:459: UserWarning: ..." with the source line.
    import torch

    from dpaudit.errors import InputError
    from dpaudit.training.jl import make_jl_clipper
    from dpaudit.workflows import runs

    def fake(**kw):
        make_jl_clipper(torch.nn.Linear(6, 2), 16, 0)
        raise InputError("stopped after the clipper")

    monkeypatch.setattr(runs, "audit_training_from_options", fake)
    r = CliRunner().invoke(app, ["audit", "train", "--algo", "dpsgd-jl"])
    assert r.exit_code == 2 and "error: stopped after the clipper" in r.stderr, r.output
    assert "warning: 16 JL projections for 14 parameters: more directions than dimensions" in r.stderr, r.stderr
    assert "jl.py" not in r.stderr and "JLClipper(" not in r.stderr
