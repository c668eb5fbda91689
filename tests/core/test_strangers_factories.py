"""A run's model factory named by a stranger's checkpoint.json: loading the run (`inspect`, `audit checkpoint`,
`report`, the attacks) imports the named module and calls the factory with the file's kwargs, so a factory is only
ever the user's own project's code (dpaudit.user_code.load_users_own). Before: `{"kind": "python", "factory":
"subprocess:getoutput", "kwargs": {"cmd": "touch PWNED"}}` ran the shell command on `dpaudit inspect RUN`, and the
user only saw "returned a str; expected a torch.nn.Module" afterwards."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
    for name in [m for m in sys.modules if m.split(".")[0] == "run" or m.startswith("strangers_")]:  # the tests' own
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


@pytest.mark.parametrize("shadowed", [False, True])
def test_a_top_level_module_inside_the_run_is_refused_before_it_is_imported(project, monkeypatch, shadowed):
    """The user inspects a stranger's run from inside its folder (`cd run && dpaudit inspect .`): the run's own
    `payload.py` is then a top-level module of the current directory, which every import looks in first. The check
    must refuse it before anything imports it (a single-part name is a module of its own, checked as each prefix
    of a dotted one is), and must look where the import will: with the current directory first, so that a
    same-named module on PYTHONPATH (`shadowed`: the user's own, allowed) does not pass the check while the run's
    file is what gets imported. Mutation pass 24: the check from the second part on (top-level names unchecked),
    and the current directory inserted at 1 or at the end for the check, both ran the run's payload.py."""
    run, name = project / "run", "strangers_payload_top"
    (run / f"{name}.py").write_text("open('PWNED', 'w')\n\ndef f():\n    open('PWNED', 'w')\n")
    if shadowed:
        (project / "pythonpath").mkdir()
        (project / "pythonpath" / f"{name}.py").write_text("def f():\n    pass\n")
        monkeypatch.syspath_prepend(str(project / "pythonpath"))
    _name_factory(run, f"{name}:f", {})
    monkeypatch.chdir(run)
    with pytest.raises(CheckpointError, match=rf"module '{name}' is .*{name}.py, inside the run being loaded"):
        load_run(".")
    assert not (run / "PWNED").exists() and name not in sys.modules


def test_the_own_code_rule_leaves_sys_path_and_names_a_malformed_or_unlocated_factory(project, monkeypatch):
    """load_users_own called directly: a name that is not 'package.module:function' (or not text) is told the shape
    expected, before any module is looked up ("os.system" without its colon was "module 'os' is ... the standard
    library"; 123 an AttributeError); a module without a spec in sys.modules (the `__main__` of a console script)
    is refused as code without a file, not an UnboundLocalError; sys.path is the caller's afterwards, refused or
    not; a not_from block inside another keeps the outer block's folders; and each kind of folder the rule names is
    told apart (a PYTHONPATH folder is the project; a virtual environment, a system Python's site folders, code
    outside every folder, a zip on sys.path and dpaudit's `attacks` package are not). Mutation pass 24: the
    survivors were the shape check, `spec = None`, sys.path's clean-up, not_from's `+`, the venv,
    site, user-site and attacks entries, the outside-every-folder return, the project folders' filter."""
    import types

    from dpaudit.errors import InputError
    from dpaudit.user_code import load_users_own, not_from

    def load(path):
        return load_users_own(path, "model factory", "'package.module:function'")

    before = list(sys.path)
    for bad in (123, None, "os.system", f"{PROJECT_MODULE}.net", "subprocess:getoutput()"):
        with pytest.raises(InputError, match=r"^expected a model factory as 'package.module:function', got"):
            load(bad)
    assert sys.path == before
    specless = types.ModuleType("strangers_specless")  # __spec__ None: importlib.util.find_spec raises ValueError
    exec("def f():\n    pass\n", specless.__dict__)
    monkeypatch.setitem(sys.modules, "strangers_specless", specless)
    with pytest.raises(InputError, match="defined in module 'strangers_specless', which is built into Python"):
        load("strangers_specless:f")
    assert sys.path == before
    assert load(f"{PROJECT_MODULE}:net")()[1].out_features == 2 and sys.path == before
    with not_from(project), not_from(project / "run"):  # the project folder itself, then an inner folder
        with pytest.raises(InputError, match=rf"{PROJECT_MODULE}.py, inside the run being loaded"):
            load(f"{PROJECT_MODULE}:net")
    assert load(f"{PROJECT_MODULE}:net") is not None  # the blocks ended: their folders are no longer refused
    # a folder on PYTHONPATH outside the current one is the user's project too; inside a virtual environment (one
    # made in the project folder, say) it is installed code, whatever sys.path says
    elsewhere = project.parent / f"{project.name}-pythonpath"
    (elsewhere / "venv").mkdir(parents=True)
    own = f"strangers_{elsewhere.name.replace('-', '_')}"
    (elsewhere / f"{own}.py").write_text("def f():\n    pass\n")
    (elsewhere / "venv" / "strangers_venv.py").write_text("def f():\n    pass\n")
    with monkeypatch.context() as m:
        m.syspath_prepend(str(elsewhere))
        m.syspath_prepend(str(elsewhere / "venv"))
        assert callable(load(f"{own}:f"))
        m.setattr(sys, "prefix", str(elsewhere / "venv"))
        assert sys.prefix != sys.base_prefix
        with pytest.raises(InputError, match=r"strangers_venv.py, in a virtual environment"):
            load("strangers_venv:f")
    # a system Python's other site folders (Debian's dist-packages, `pip install --user`'s user site): installed code
    import site

    for kind in ("dist_packages", "user_site"):
        folder = elsewhere / kind
        folder.mkdir()
        (folder / f"strangers_{kind}.py").write_text("def f():\n    pass\n")
    with monkeypatch.context() as m:
        m.setattr(site, "getsitepackages", lambda: [str(elsewhere / "dist_packages")])
        m.setattr(site, "ENABLE_USER_SITE", True)
        m.setattr(site, "getusersitepackages", lambda: str(elsewhere / "user_site"))
        for kind in ("dist_packages", "user_site"):
            m.syspath_prepend(str(elsewhere / kind))
            with pytest.raises(InputError, match=f"strangers_{kind}.py, in an installed package"):
                load(f"strangers_{kind}:f")
    # code from outside the current directory and sys.path: a module a finder maps elsewhere (an editable install of
    # another package), or a zip archive on sys.path (a zipped standard library is not a folder of the project)
    import importlib.util
    import zipfile

    away = project.parent / f"{project.name}-away"
    away.mkdir()
    (away / "strangers_mapped.py").write_text("def f():\n    pass\n")
    with zipfile.ZipFile(away / "zipped.zip", "w") as z:
        z.writestr("strangers_zipped.py", "def f():\n    pass\n")
    spec = importlib.util.spec_from_file_location("strangers_mapped", away / "strangers_mapped.py")
    mapped = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mapped)
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "strangers_mapped", mapped)
        m.syspath_prepend(str(away / "zipped.zip"))
        for name in ("mapped", "zipped"):
            with pytest.raises(InputError, match=f"strangers_{name}.py, outside the current directory and sys.path"):
                load(f"strangers_{name}:f")
        assert "strangers_zipped" not in sys.modules
    # dpaudit's checkout on PYTHONPATH (a developer's, or an editable install's folder): its `attacks` package is
    # dpaudit itself too, not the user's project (attack functions write files named by their arguments)
    import attacks

    monkeypatch.syspath_prepend(str(Path(attacks.__file__).parent.parent))
    with pytest.raises(InputError, match=r"module 'attacks(\.inversion)?' is .*attacks[/\\].*, in dpaudit itself"):
        load("attacks.inversion:save_grid")


def test_a_python_spec_at_the_record_bound_and_with_a_real_hash_is_taken(project):
    """The two refusals above at their edges, without building anything (PythonSpec only validates): a record of
    exactly MAX_RECORD_VALUES values is taken and one more is refused; a real sha256 (lower-case hex, as
    factory_source_sha256 writes it) is taken. Mutation pass 24: `>` as `>=`, and every recorded hash refused
    (the hex check dropped), survived."""
    from dpaudit.errors import InputError
    from dpaudit.models import MAX_RECORD_VALUES, PythonSpec, factory_source_sha256

    side = 2**13
    assert side * side == MAX_RECORD_VALUES
    kw = {"factory": f"{PROJECT_MODULE}:net", "n_classes": 2}
    assert PythonSpec(input_shape=(side, side), **kw).input_shape == (side, side)
    with pytest.raises(InputError, match=f"holds {MAX_RECORD_VALUES + side} values per record, more than"):
        PythonSpec(input_shape=(side, side + 1), **kw)
    sha = factory_source_sha256(kw["factory"])
    assert PythonSpec(input_shape=(4,), source_sha256=sha, **kw).source_sha256 == sha
    with pytest.warns(UserWarning, match="changed since this spec was recorded"):  # another file's: a warning
        PythonSpec(input_shape=(4,), source_sha256="0123456789abcdef" * 4, **kw)
    with pytest.raises(InputError, match="64 hex digits"):
        PythonSpec(input_shape=(4,), source_sha256=sha[:-1] + "g", **kw)
