"""README.md's runnable blocks run top to bottom in a fresh directory (issue 29).

A block is runnable when the line before its opening fence is ``<!-- readme-test: run -->`` (or
``<!-- readme-test: run, needs MODULE -->``: skipped where MODULE, e.g. an extra's package, is not
installed). A runnable ``python`` block is a snippet of the user's own pytest suite: the fast test executes
it and calls every ``test_*`` function it defines. The ``bash`` blocks run in order, as one user would type
them, in one scratch directory with this environment's ``dpaudit`` and ``python`` first on PATH and the
clone on PYTHONPATH (README: "from the clone's root"; ``examples.*`` imports from it). A line whose comment
says ``exits 1`` must exit with 1 (a caught bug), every other line with 0.

Sizes. The README shows what a user runs (minutes per multi-run audit); the slow test runs the same
commands with the smaller sizes of :data:`SMALL` (fewer epochs, runs, reference models, queries,
self-test trials), each substitution a flag a user can give too. The fast test checks what needs no
running: every file a line reads was made by an earlier line, no placeholder, no deprecated spelling.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpaudit.training.config import OPTION_READERS

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(
    r"<!-- readme-test: run(?:, needs (?P<needs>[\w.]+))? -->\n```(?P<lang>bash|python)\n(?P<body>.*?)```", re.S
)

# (pattern, replacement) on each logical line of a block, in order: the suite's smaller sizes.
SMALL = (
    (r"--runs \d+", "--runs 2 --allow-inconclusive"),
    (r"--reference-models \d+", "--reference-models 4"),  # LiRA online: >= 2 IN and 2 OUT models a record
    (r"--queries \d+", "--queries 20"),
    (r"--budget 1000", "--budget 200"),
    (r"--extraction-budget \d+", "--extraction-budget 200"),
    (r"--train-size \d+", "--train-size 60"),
    (r"(dpaudit audit selftest)", r"\1 --seeds 3 --trials 400"),  # 3: the fewest selftest accepts
)
# Commands that train with the recipe's epochs unless told: given one epoch in the small run.
TRAINING = re.compile(r"^dpaudit (?:train|audit train) ")
EXITS_1 = re.compile(r"#.*\bexits 1\b")
OUTPUT_OPTIONS = ("--out", "-o", "--out-dir", "--scores-out")
INPUT_SUFFIXES = (".csv", ".txt", ".json", ".safetensors", ".npz", ".npy")


@dataclass(frozen=True)
class Block:
    needs: str | None
    body: str


def blocks(lang: str = "bash") -> list[Block]:
    text = (ROOT / "README.md").read_text()
    return [Block(m["needs"], m["body"]) for m in MARK.finditer(text) if m["lang"] == lang]


def commands(body: str) -> list[str]:
    """The logical lines of a block (backslash continuations joined), a here-document kept with its line."""
    lines, out = body.splitlines(), []
    i = 0
    while i < len(lines):
        line = lines[i]
        while line.endswith("\\"):
            i += 1
            line = line[:-1] + " " + lines[i].strip()
        heredoc = re.search(r"<<'(\w+)'", line)
        if heredoc:
            end = lines.index(heredoc.group(1), i + 1)
            line = "\n".join(lines[i : end + 1])
            i = end
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line)
        i += 1
    return out


def small(line: str) -> str:
    if "\n" in line:  # a here-document: Python, not sizes
        return line
    code = line.partition(" #")[0].rstrip()
    for pattern, replacement in SMALL:
        code = re.sub(pattern, replacement, code)
    # cloak: its own default; PATE: teachers of one epoch agree on too few queries to answer any; --trainer: yours;
    # the convex learners and DP-AGD take no epochs (train refuses the option where no trainer reads it)
    algo = re.search(r"--algo (\S+)", code)
    reads_epochs = algo is None or algo.group(1) in OPTION_READERS["epochs"]
    if (
        TRAINING.match(code)
        and reads_epochs
        and not any(f in code for f in ("--algo cloak", "--algo pate", "--trainer"))
    ):
        code = re.sub(r"--epochs \d+", "--epochs 1", code) if "--epochs" in code else code + " --epochs 1"
    if "--allow-inconclusive" in code:  # a 2-run design is inconclusive, which --fail-on-violation makes exit 2
        code = code.replace(" --fail-on-violation", "")
    if EXITS_1.search(line):  # must exit with 1, not 0 and not 2
        return f'if {code}; then echo "expected exit code 1" >&2; exit 1; else test $? -eq 1; fi'
    return code


def _files_written_by(code: str) -> set[str]:
    """Files a Python here-document or `python -c` line writes (open(..., 'w'), savetxt, copy targets)."""
    found = set()
    for m in re.finditer(r"""(?:open\(|savetxt\(|copy\([^,]+,\s*)["']([^"']+)["'](?:,\s*["']w)?""", code):
        found.add(m.group(1))
    return found


def test_readme_blocks_use_only_files_made_by_earlier_lines():
    """No `runs/x` from nowhere, no literal `...`, no deprecated spelling; the target run is RUN."""
    made: set[str] = set()
    runnable = blocks()
    assert len(runnable) >= 2 and runnable[0].needs is None, "the usage block must be marked runnable"
    for block in runnable:
        for line in commands(block.body):
            if "\n" in line or line.startswith("python -c"):
                made |= _files_written_by(line)
                continue
            tokens = shlex.split(line, comments=True)
            assert "..." not in tokens, line
            for old in ("--checkpoint", "-c", "--train-delta") + (("--method", "-m") if "mia" in tokens else ()):
                assert old not in tokens, f"deprecated {old}: {line}"
            outputs = {tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t in (*OUTPUT_OPTIONS, ">")}  # > FILE too
            if "--scores-out" in tokens and "--attacks" in tokens:  # several attacks: FILE.ATTACK.csv each
                scores = tokens[tokens.index("--scores-out") + 1]
                stem, suffix = os.path.splitext(scores)
                attacks = tokens[tokens.index("--attacks") + 1].split(",")
                outputs |= {f"{stem}.{a}{suffix}" for a in attacks} if len(attacks) > 1 else set()
            for i, t in enumerate(tokens):
                if t in outputs or (i and tokens[i - 1] in OUTPUT_OPTIONS) or t.startswith("-"):
                    continue
                if "/" in t or t.endswith(INPUT_SUFFIXES):
                    path = t.rstrip("/")
                    assert any(path == m or path.startswith(m + "/") for m in made), f"{t} not made before: {line}"
            made |= {o.rstrip("/") for o in outputs}


def test_small_sizes_only_shrink_what_the_readme_shows():
    line = "dpaudit audit train --algo dpsgd --epsilon 2 --runs 500 --threat-model white-box  # minutes"
    assert small(line) == "dpaudit audit train --algo dpsgd --epsilon 2 --runs 2 --allow-inconclusive " \
        "--threat-model white-box --epochs 1"  # fmt: skip
    assert small("dpaudit audit canaries d --fail-on-violation  # exits 1: caught").endswith("test $? -eq 1; fi")
    for pattern, _ in SMALL:  # every substitution still applies to the README (none went stale)
        assert any(re.search(pattern, line) for b in blocks() for line in commands(b.body)), pattern


def test_readme_python_blocks_run():
    """The `assert_dp` example ("In your own pytest suite, audit a mechanism you wrote") runs as written: each
    runnable Python block is executed and every test function it defines passes (about 1.5 s)."""
    ran = []
    for i, block in enumerate(blocks("python")):
        if block.needs and importlib.util.find_spec(block.needs) is None:
            continue
        namespace: dict = {"__name__": f"readme_block_{i}"}
        exec(compile(block.body, f"README.md (python block {i})", "exec"), namespace)
        for name, value in namespace.items():
            if name.startswith("test_") and callable(value):
                value()
                ran.append(name)
    assert ran == ["test_my_mechanism_is_dp"], ran


# Public modules whose docstring shows a complete example a newcomer copies into a notebook or test file (the
# others' examples are sketches around the user's own loop: ``clipped_sum``, ``add_noise``).
DOCSTRING_EXAMPLES = ("dpaudit.testing", "dpaudit.accounting")


def docstring_example(module_name: str) -> str:
    """The first indented block of a module's docstring (its example), dedented."""
    lines = importlib.import_module(module_name).__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    "))
    end = next((i for i in range(start, len(lines)) if lines[i].strip() and not lines[i].startswith("    ")), None)
    return textwrap.dedent("\n".join(lines[start:end]))


@pytest.mark.slow
@pytest.mark.parametrize("module_name", DOCSTRING_EXAMPLES)
def test_library_docstring_examples_run_as_written(module_name):
    """Each example runs in a fresh namespace, its test functions called (``dpaudit.testing``'s used ``np`` without
    importing it: NameError; ``dpaudit.accounting``'s named ``q`` and ``T`` it never defined). About 10 s each:
    the examples' own sizes (20,000 trials; a PLD calibration)."""
    namespace: dict = {"__name__": module_name + "_example"}
    exec(compile(docstring_example(module_name), f"{module_name} docstring", "exec"), namespace)
    tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    for test in tests:
        test()
    assert tests or "epsilon_for" in namespace, module_name


def test_library_doctests_pass():
    """The ``>>>`` examples of the public modules (``trials_needed(2.0, delta=1e-5)`` is 59)."""
    import doctest

    from dpaudit.audit import plan

    result = doctest.testmod(plan)
    assert result.attempted >= 2 and result.failed == 0, result


def test_readme_plan_numbers_are_what_audit_plan_prints():
    """The numbers the README quotes from `dpaudit audit plan --epsilon 2 --true-epsilon 3 --family
    randomized-response` (a line of the usage block, run only in the slow test, which reads no output): runs per
    side, the perfect-attack minimum, and the refutations of 200 draws the size rule needs (about 1.3 s)."""
    from dpaudit.audit import plan_design

    text = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(r"For a claim of 2 and a true randomized-response ε of 3 that is (\d+) runs per side "
                  r"\(perfect attack: (\d+)\).*?at least (\d+) of 200 draws refuted", text)  # fmt: skip
    assert m, "the README's audit plan example moved: update this test"
    plan = plan_design(2.0, true_epsilon=3.0, family="randomized-response").to_dict()
    shown = (plan["runs_per_side"], plan["perfect_attack_runs_per_side"], plan["refutations_needed"])
    assert tuple(int(g) for g in m.groups()) == shown


@pytest.mark.slow
def test_readme_blocks_run_top_to_bottom(tmp_path):
    bin_dir = Path(sys.executable).parent
    assert shutil.which("dpaudit", path=str(bin_dir)), "dpaudit must be installed next to this python"
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # the user's kept
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": pythonpath,
           "DPAUDIT_CACHE_DIR": str(tmp_path / "cache"), "DPAUDIT_TEST_THREADS": "1"}  # fmt: skip
    ran = 0
    for block in blocks():
        if block.needs and importlib.util.find_spec(block.needs) is None:
            continue
        for line in commands(block.body):
            script = small(line)
            proc = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
            assert proc.returncode == 0, f"{script}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            ran += 1
    assert ran >= 40
    assert (tmp_path / "reports" / "compare" / "report.html").is_file()
