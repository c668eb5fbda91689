"""The house's shape, computed from the source with ``ast`` (docs/architecture.md).

Imports run one way: events -> accounting -> audit (NumPy/SciPy only); data/models -> checkpoint ->
training -> attacks -> workflows -> report -> cli. Every import counts, the lazy ones inside functions
too (a lazy import is still an arrow: it only hides it from ``python -c "import x"``). A failure names
the importing module, the imported one and the line.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dpaudit", "attacks")

# Floors, lowest first: a module may import from its own floor or below, never above. A room is a package
# (or a top-level module of dpaudit); the longest matching prefix gives a module its room.
FLOORS: tuple[tuple[str, ...], ...] = (
    (
        "dpaudit",
        "dpaudit.errors",
        "dpaudit.defaults",
        "dpaudit.validation",
        "dpaudit.fileio",
        "dpaudit.seeding",
        "dpaudit.progress",
        "dpaudit.user_code",
        "dpaudit.numfmt",
        "dpaudit.budget",
    ),
    ("dpaudit.events",),
    ("dpaudit.accounting",),
    ("dpaudit.audit", "dpaudit.testing"),
    ("dpaudit.data", "dpaudit.models", "dpaudit.canaries", "dpaudit.cache"),
    ("dpaudit.checkpoint",),
    ("dpaudit.training", "dpaudit.aggregation", "dpaudit.plugins", "dpaudit.hooks"),
    ("attacks",),
    ("dpaudit.workflows",),
    ("dpaudit.report",),
    ("dpaudit.demo", "dpaudit.reporting"),
    ("dpaudit.cli", "dpaudit.__main__"),
)
ROOMS = {room: floor for floor, rooms in enumerate(FLOORS) for room in rooms}
# Rooms that must stay free of the deep-learning frameworks (STYLE.md).
NUMPY_ONLY = ("dpaudit.events", "dpaudit.accounting", "dpaudit.audit")


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} imports {self.target} (line {self.line})"


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mods: dict[str, Path] | None = None) -> list[Import]:
    """Every import of a module of ours by a module of ours (``from p import m`` counts as p.m when m is a
    module), with its line."""
    mods = modules() if mods is None else mods
    found = []
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, path, node)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in mods:  # an attribute of a module: the module
                    name = name.rpartition(".")[0]
                if name and name != module:
                    found.append(Import(module, name, node.lineno))
    return found


def room(module: str) -> str:
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in ROOMS:
            return ".".join(parts[:k])
    raise KeyError(module)


def cycles(edges: list[Import]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on_stack.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
    return found


@pytest.fixture(scope="module")
def edges() -> list[Import]:
    return imports()


def test_every_module_has_a_room(edges):
    """Every top-level module or package of dpaudit is a room of its own (the root ``dpaudit`` on floor 0 would
    otherwise place anything new there silently: `budget` and `hooks` were missing from the docs' table)."""
    unplaced = [m for m in modules() if not any(m == r or m.startswith(r + ".") for r in ROOMS)]
    unplaced += [m for m in modules() if m.count(".") == 1 and m.startswith("dpaudit.") and m not in ROOMS]
    assert not unplaced, f"add these modules to a floor in FLOORS (and docs/architecture.md): {unplaced}"


def test_docs_table_is_floors():
    """docs/architecture.md's table names each floor's rooms exactly as FLOORS places them."""
    rows = re.findall(r"^\| (\d+) \| (.*?) \|", (ROOT / "docs" / "architecture.md").read_text(), re.M)
    shown = {int(f): {n.rstrip("/") for n in re.findall(r"`([^`]+)`", rooms)} for f, rooms in rows}
    placed = {
        f: {r.removeprefix("dpaudit.") for r in rooms if r not in ("dpaudit", "dpaudit.__main__")}
        for f, rooms in enumerate(FLOORS)
    }
    assert shown == placed


def test_no_upward_arrow(edges):
    upward = [e for e in edges if ROOMS[room(e.target)] > ROOMS[room(e.source)]]
    assert not upward, "imports from a higher floor:\n" + "\n".join(map(str, upward))


def test_no_circle_between_rooms(edges):
    """A circle inside one room (a package's ``__init__`` re-exporting what its modules import back) is
    the package's own business; one that crosses rooms ties the floors together."""
    crossing = [c for c in cycles(edges) if len({room(m) for m in c}) > 1]
    detail = [str(e) for e in edges if any(e.source in c and e.target in c for c in crossing)]
    assert not crossing, f"import circles across rooms: {crossing}\n" + "\n".join(detail)


def test_no_circle_in_accounting_or_training(edges):
    """The accounting and training rooms have no inner circle either (issue 23)."""
    inner = [c for c in cycles(edges) if room(c[0]) in ("dpaudit.accounting", "dpaudit.training")]
    assert not inner, inner


def test_report_renders_only(edges):
    """The report renders the result objects it is given: it decides nothing, so it imports neither the
    audit (bounds, verdicts) nor the training room."""
    wrong = [
        e
        for e in edges
        if room(e.source) == "dpaudit.report" and room(e.target) in ("dpaudit.audit", "dpaudit.training")
    ]
    assert not wrong, "\n".join(map(str, wrong))


def test_numpy_only_rooms_import_no_framework():
    heavy = ("torch", "jax", "opacus", "flax", "optax")
    wrong = []
    for module, path in modules().items():
        if room(module) not in NUMPY_ONLY:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            wrong += [f"{module} imports {n} (line {node.lineno})" for n in names if n.split(".")[0] in heavy]
    assert not wrong, "\n".join(wrong)


def long_functions(path: Path, limit: int = 80) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Functions (nested ones too) of the file at ``path`` longer than ``limit`` lines, decorators excluded."""
    return [
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > limit
    ]


def test_cli_functions_are_short():
    """The CLI parses, calls one library function and prints: no function in dpaudit/cli/ over 80 lines."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for path in sorted((ROOT / "dpaudit" / "cli").glob("*.py"))
        for node in long_functions(path)
    ]
    assert not long, "\n".join(long)


def test_the_checks_bite(tmp_path):
    """Planted: an upward arrow, a cross-room circle and a long CLI function are each found, by name."""
    (tmp_path / "dpaudit" / "audit").mkdir(parents=True)
    (tmp_path / "dpaudit" / "__init__.py").write_text("")
    (tmp_path / "dpaudit" / "audit" / "__init__.py").write_text("from dpaudit.events import X\n")
    (tmp_path / "dpaudit" / "events.py").write_text("from dpaudit.audit import Y\n")
    mods = {
        "dpaudit": tmp_path / "dpaudit" / "__init__.py",
        "dpaudit.audit": tmp_path / "dpaudit" / "audit" / "__init__.py",
        "dpaudit.events": tmp_path / "dpaudit" / "events.py",
    }
    found = imports(mods)
    up = [e for e in found if ROOMS[room(e.target)] > ROOMS[room(e.source)]]
    assert [str(e) for e in up] == ["dpaudit.events imports dpaudit.audit (line 1)"]
    assert cycles(found) == [["dpaudit.audit", "dpaudit.events"]]
    long_cli = tmp_path / "cli.py"
    long_cli.write_text("def command():\n" + "    x = 1\n" * 80)
    assert [n.name for n in long_functions(long_cli)] == ["command"]
