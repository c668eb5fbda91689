"""A run's model factory named by a stranger's checkpoint.json: loading the run (`inspect`, `audit checkpoint`,
`report`, the attacks) imports the named module and calls the factory with the file's kwargs, so a factory is only
ever the user's own project's code (dpaudit.user_code.load_users_own). Before: `{"kind": "python", "factory":
"subprocess:getoutput", "kwargs": {"cmd": "touch PWNED"}}` ran the shell command on `dpaudit inspect RUN`, and the
user only saw "returned a str; expected a torch.nn.Module" afterwards."""

from __future__ import annotations

import json
import sys

import pytest

from dpaudit.checkpoint import CHECKPOINT_FILE, load_run
from dpaudit.errors import CheckpointError
from tests.core.cli_errors import invoke, one_error

PROJECT_MODULE = "strangers_factories_project"  # the user's own module, in the project folder (the current one)
PROJECT_CODE = """import subprocess
from torch import nn


def net(d=4, k=2):
    return nn.Sequential(nn.Flatten(), nn.Linear(d, k))
"""


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("strangers-factories") / "run"
    r = invoke("--quiet", "train", "--data", "synthetic:n=200,d=4", "--model", "logreg", "--algo", "sgd",
               "--epochs", 1, "--batch-size", 32, "--out", out)  # fmt: skip
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def project(saved_run, tmp_path, monkeypatch):
    """A project folder (the current directory) holding the user's own factory module and a copy of a saved run."""
    import shutil

    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{PROJECT_MODULE}.py").write_text(PROJECT_CODE)
    shutil.copytree(saved_run, tmp_path / "run")
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in (PROJECT_MODULE, "run")]:
        del sys.modules[name]


def _name_factory(run, factory, kwargs):
    meta = json.loads((run / CHECKPOINT_FILE).read_text())
    meta["model"] = {"kind": "python", "factory": factory, "kwargs": kwargs, "input_shape": [4], "n_classes": 2}
    (run / CHECKPOINT_FILE).write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        ("subprocess:getoutput", {"cmd": "touch PWNED"}, "module 'subprocess' is .*subprocess.py, in the standard lib"),
        ("builtins:exec", {"source": "open('PWNED', 'w')"}, "module 'builtins' is built into Python"),
        # the user's own module reached the standard library through its `import subprocess`
        (f"{PROJECT_MODULE}:subprocess.getoutput", {"cmd": "touch PWNED"}, "defined in module 'subprocess'"),
        ("torch:save", {"obj": 1, "f": "PWNED"}, "module 'torch' is .*, in an installed package"),
        ("dpaudit.fileio:write_atomic_file", {"path": "PWNED"}, "in dpaudit itself"),
        # a .py brought inside the run's own folder: importing it would already run it
        ("run.payload:f", {}, r"run[/\\]payload.py, inside the run being loaded"),
    ],
)
def test_a_factory_that_is_not_the_users_own_code_is_neither_imported_nor_called(project, factory, kwargs, message):
    (project / "run" / "payload.py").write_text("open('PWNED', 'w')\n\ndef f():\n    open('PWNED', 'w')\n")
    _name_factory(project / "run", factory, kwargs)
    with pytest.raises(CheckpointError, match=f"model factory {factory}: .*{message}.*only your own project's code"):
        load_run(project / "run")
    assert "model factory" in one_error(invoke("inspect", project / "run"))  # one line, exit 2
    assert not (project / "PWNED").exists()


def test_the_users_own_factory_still_loads_the_run(project):
    """The control: the same run named by the user's own factory, in the project folder, loads and is inspected."""
    _name_factory(project / "run", f"{PROJECT_MODULE}:net", {"d": 4, "k": 2})
    assert load_run(project / "run").spec.factory == f"{PROJECT_MODULE}:net"
    r = invoke("inspect", project / "run")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # every build runs the module on two zero records: torch was asked for 8e18 bytes (an internal error, exit 3)
        ({"input_shape": [10**9, 10**9]}, r"holds 1000000000000000000 values per record, more than 67108864"),
        ({"source_sha256": 123}, "expected source_sha256 to be 64 hex digits"),  # was "'int' object is not subscr..."
        ({"source_sha256": "ab"}, "expected source_sha256 to be 64 hex digits"),
    ],
)
def test_a_python_spec_with_a_huge_record_or_a_malformed_hash_is_one_line(project, edit, message):
    meta = json.loads((project / "run" / CHECKPOINT_FILE).read_text())
    meta["model"] = {"kind": "python", "factory": f"{PROJECT_MODULE}:net", "input_shape": [4], "n_classes": 2, **edit}
    (project / "run" / CHECKPOINT_FILE).write_text(json.dumps(meta))
    assert message.split(" ")[0] in one_error(invoke("inspect", project / "run"))
    with pytest.raises(CheckpointError, match=message):
        load_run(project / "run")
