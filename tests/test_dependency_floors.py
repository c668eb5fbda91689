"""The dependency floors in pyproject.toml against the version-gated APIs dpaudit uses.

A floor below the release that introduced an API we call lets a user's older environment satisfy the
install and then fail deep inside a run. :data:`GATED` lists each such API with the release that has
it and where we use it; the floors were also run (benchmarks/RESULTS.md, "Dependency floors
(verified)"). The table cannot discover a newly used API by itself: whoever uses a newer API adds its
row, and these tests then keep the floor and the row together (a floor lowered below a row fails; a
row whose use is gone from the code fails, so the table does not outlive its reasons).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]

# (distribution, the lowest release with it, the API or reason, (file, text that uses it) or None)
GATED = [
    ("torch", "2.4", "torch.OutOfMemoryError (2.3 has only torch._C._OutOfMemoryError)",
     ("dpaudit/training/clipping.py", "except torch.OutOfMemoryError:")),
    ("jax", "0.8.0", "jax.enable_x64 as a context manager", ("dpaudit/training/jax_backend.py", "jax.enable_x64(")),
    ("jaxlib", "0.8.0", "jax 0.8.0 needs jaxlib 0.8.0", None),
    ("typer", "0.28.0", "typer.TyperException (typer's own click)", ("dpaudit/cli/_common.py", "typer.TyperException")),
    ("scikit-learn", "1.7.0", "MLPClassifier.fit(sample_weight=)", ("attacks/shadow.py", "__sample_weight")),
    ("scipy", "1.11.0", "scipy.special.betainccinv", ("dpaudit/audit/stats.py", "betainccinv")),
    ("jsonschema", "4.18.0", "$ref resolution through referencing (4.17.3: RefResolutionError)",
     ("dpaudit/report/build.py", "Draft202012Validator")),
    # The jax extra pulls numpy >= 2.0 into the same environment: compiled dependencies built
    # against numpy 1.x then fail at import ("numpy.dtype size changed", "_ARRAY_API not found").
    ("scipy", "1.13.0", "the first wheels built for numpy 2", None),
    ("scikit-learn", "1.4.2", "the first wheels built for numpy 2", None),
    ("pandas", "2.2.2", "the first wheels built for numpy 2", None),
    ("matplotlib", "3.8.4", "the first wheels built for numpy 2", None),
]  # fmt: skip


def _floors() -> dict[str, Version]:
    """Distribution -> the version after ``>=`` in pyproject.toml (dependencies and every extra)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    floors: dict[str, Version] = {}
    for text in requirements:
        req = Requirement(text)
        lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
        if lows:
            floors[req.name] = max([*lows, floors.get(req.name, lows[0])])
    return floors


def test_every_runtime_dependency_has_a_floor():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = _floors()
    missing = [r for r in [*project["dependencies"], *project["optional-dependencies"]["jax"]]
               if Requirement(r).name not in floors]  # fmt: skip
    assert not missing, f"dependencies without a floor: {missing}"


@pytest.mark.parametrize(("dist", "version", "why", "use"), GATED, ids=[f"{g[0]}>={g[1]}" for g in GATED])
def test_floor_covers_the_api_we_use(dist, version, why, use):
    floors = _floors()
    assert dist in floors, f"{dist} is not declared in pyproject.toml"
    assert floors[dist] >= Version(version), f"{dist}>={floors[dist]} in pyproject.toml, but {why} needs {version}"
    if use is not None:
        path, text = use
        assert text in (ROOT / path).read_text(), f"{path} no longer uses {why!r}: drop or update its row in GATED"


def test_the_jax_backends_refusal_names_the_jax_extras_floor():
    """``jax_backend.JAX_MIN`` (the run-time refusal) equals the jax extra's floor (read without importing JAX)."""
    tree = ast.parse((ROOT / "dpaudit/training/jax_backend.py").read_text())
    assigns = [n for n in tree.body if isinstance(n, ast.Assign)]  # other module-level assignments may unpack tuples
    (value,) = [n.value for n in assigns if any(isinstance(t, ast.Name) and t.id == "JAX_MIN" for t in n.targets)]
    jax_min = Version(".".join(map(str, ast.literal_eval(value))))
    floors = _floors()
    assert floors["jax"] == jax_min and floors["jaxlib"] == jax_min
