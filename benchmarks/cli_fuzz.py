"""Generative fuzzing of the whole ``dpaudit`` CLI against its error contract.

The contract (README, ``dpaudit --help``): bad input is one ``error:`` line on stderr and exit code 2, never a
traceback; exit 1 only for a violation verdict; exit 3, a traceback or a hang is a bug; nothing is written when a
command fails, and nothing is overwritten without ``--force``.

The command tree is read from the typer app (``typer.main.get_command``): every command, its options, their
types and defaults. Each command has a small valid invocation on tiny data (``BASES``); the cases are that
invocation alone, then each option in turn set to boundary values of its type (numbers: 0, -1, 1, 2^63, 1e308,
1e309, nan, ±inf, -0, 5e-324, "", text; paths: missing, a folder where a file is expected, a file where a folder
is expected, "", an existing output without --force), then pairs of options that interact (``PAIRS``: exclusive
spellings, options of one algorithm given to another). Every case runs in-process (typer's CliRunner, with a
per-case alarm as the timeout) in a fresh scratch folder; with ``--subprocess`` each runs as
``python -m dpaudit`` instead (slower, the real process; confirm findings there).

A case is classified:
  bug      exit 3, a traceback, a timeout, an exit code outside {0, 1, 2}, or output written by a failed command
  suspect  exit 2 with other than exactly one ``error:`` line (under --quiet), or exit 0 accepting a non-finite,
           negative or empty value (read the listing: some are legitimate, e.g. --seed 0, --claimed-epsilon inf)
  ok       everything else

Run (from the repository root; a few minutes on one core with the default ``--max-cases``):

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/cli_fuzz.py [--only "audit plan"] [--max-cases 400]
        [--timeout 60] [--subprocess] [--out /tmp/cli_fuzz.jsonl] [--show ok|suspect|bug]

Exit status: 1 when a case is classified ``bug``, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this folder comes first on sys.path, and its attacks.py would shadow the `attacks` package.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

TINY = "synthetic:n=200,d=5,classes=2"
INT_VALUES = ["0", "-1", "1", "9223372036854775808", "1e308", "nan", "", "x"]
FLOAT_VALUES = ["0", "-1", "1", "1e308", "1e309", "nan", "inf", "-inf", "", "-0", "5e-324", "x"]
STR_VALUES = ["", " ", "no-such-value", "0", "-1", "nan", "a,,b"]
# Placeholders filled per case: {new} a fresh output path, the others made once by make_fixtures.
BASES: dict[str, list[str]] = {
    "train": ["--out", "{new}", "--data", TINY, "--model", "logreg", "--epochs", "1"],
    "import": ["{weights}", "--model-spec", "{spec}", "--out", "{new}", "--data", TINY, "--members", "{members}"],
    "inspect": ["{run}"],
    "demo": ["--out", "{new}", "--quick"],
    "report": ["{run}", "--out", "{new}", "--attacks", "loss", "--format", "json"],
    "audit scores": ["{scores}"],
    "audit selftest": ["--seeds", "2", "--trials", "20"],
    "audit plan": ["--epsilon", "1", "--true-epsilon", "3", "--simulations", "10"],
    "audit checkpoint": ["{run}", "--attacks", "loss"],
    "audit train": ["--runs", "4", "--data", TINY, "--epochs", "1", "--noise-multiplier", "1", "--allow-inconclusive"],
    "audit canaries": ["{canaries}", "--claimed-epsilon", "1", "--delta", "1e-5"],
    "canaries make": ["--data", TINY, "--count", "4", "--out", "{new}"],
    "account dpsgd": ["--noise-multiplier", "1", "--delta", "1e-5", "--sample-rate", "0.01", "--steps", "100"],
    "account calibrate": ["--epsilon", "1", "--delta", "1e-5", "--sample-rate", "0.01", "--steps", "100"],
    "attack extract": ["{run}", "--budget", "20", "--curve-points", "1"],
    "attack inversion": ["{run}", "--classes", "0", "--iterations", "5", "--restarts", "1"],
    "attack attribute": ["{run}", "--feature", "0"],
    "attack mia": ["{run}", "--attacks", "loss", "--bootstrap", "10"],
}
# The valid invocation is slow (demo trains several models): only its refusals are fuzzed.
SKIP_VALID = {"demo"}
# Options whose value names something to write.
OUTPUT_OPTIONS = {"--out", "--scores-out", "--out-dir"}
# Algorithm-specific options of `train`, a valid value each: given with every other --algo they must be refused.
ALGO_OPTIONS = {
    "--noise-multiplier": "1",
    "--epsilon": "2",
    "--clip": "0.5",
    "--accountant": "rdp",
    "--jl-projections": "2",
    "--secure-noise": None,
    "--clipping": "vmap",
    "--max-physical-batch": "8",
    "--momentum": "0.5",
    "--l2": "0.01",
    "--mechanism": "laplace",
    "--objective": "logistic",
    "--teachers": "2",
    "--aggregator": "lnmax",
    "--queries": "2",
    "--sigma": "1",
    "--sigma1": "1",
    "--threshold": "1",
    "--max-answers": "2",
    "--shots": "2",
    "--predictor": "knn",
    "--claim": "data-dependent",
    "--sanitiser": "none",
    "--keep-private-diagnostics": None,
    "--subsample": "0.5",
    "--target": "{run}",
    "--lambda": "1",
    "--canaries": "2",
    "--whitebox-canaries": "2",
    "--sampling": "shuffle",
}
ALGOS = "sgd adam dpsgd dpadam dpsgd-jl dpadam-jl pate dp-icl outpert objpert dpagd cloak".split()
# Pairs given together by hand, one "command: options" a line (split on whitespace): exclusive spellings and
# options that only mean something with another.
PAIRS = """
train: --epochs 1 --steps 2
train: --model logreg --model-spec {spec}
train: --algo dpsgd --noise-multiplier 1 --epsilon 2
train: --hidden 4 --model logreg
train: --activation relu --model logreg
train: --label-column y
train: --canary-kind outlier
train: --canary-seed 3
train: --allow-inconclusive
train: --split-seed 3 --split 0.5,0.5,0,0
train: --workers 2
train: --autocast bf16
train: --backend jax --algo sgd
import: --epsilon 1
import: --noise-multiplier 1
import: --members {file}
import: --data digits
import: --claim {file} --epsilon 1 --delta 1e-5
import: --label-column y
import: --split 0.5,0.5,0,0
audit scores: --tradeoff gdp
audit scores: --two-sided --design canaries --method one-run
audit scores: --fail-on-violation
audit scores: --fail-on-estimate
audit scores: --trust-design
audit scores: --method gdp --threshold-selection bonferroni
audit plan: --mu 1
audit plan: --family gdp
audit plan: --tradeoff gdp
audit plan: --tests 3 --method gdp
audit checkpoint: --fail-on-violation --fail-on-estimate
audit checkpoint: --no-cache --cache-dir {dir}
audit checkpoint: --reference-models 1 --attacks loss
audit train: --epochs 1 --steps 2
audit train: --epsilon 2
audit train: --algo sgd
audit train: --trainer os:getcwd
audit train: --threat-model white-box --canary-kind dirac
audit train: --train-delta 1e-5 --delta 1e-5
audit train: --model logreg --model-spec {spec}
audit train: --score loss --score loss
audit canaries: --sample-rate 0.5
audit canaries: --steps 4
canaries make: --kind outlier --canary-kind mislabeled
canaries make: --label-column y
account dpsgd: --epochs 1
account dpsgd: --dataset-size 100 --batch-size 10
account dpsgd: --jl-projections 2
account dpsgd: --accountant pld --jl-projections 2
account calibrate: --epochs 1
account calibrate: --dataset-size 100 --batch-size 10
account calibrate: --jl-projections 2
attack extract: --surrogate logreg
attack extract: --adaptive
attack extract: --method equations --api labels
attack extract: --checkpoint {run}
attack inversion: --black-box
attack inversion: --budget 10
attack inversion: --prior-weight 1
attack inversion: --out {new} --out-dir {new2}
attack inversion: --directions 3
attack attribute: --black-box
attack mia: --shadow-models 2
attack mia: --method x
attack mia: --online
attack mia: --min-models 3
attack mia: --scheduler fifo
attack mia: --roc
report: --inversion
report: --icl
report: --jl-step
report: --cloak 1
""".strip().splitlines()


def command_tree():
    """(command path, [click parameters]) for every leaf command of the app."""
    import typer

    from dpaudit.cli.main import app

    out = []

    def walk(cmd, path):
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(None):
                walk(cmd.get_command(None, name), [*path, name])
        else:
            out.append((" ".join(path), cmd.params))

    walk(typer.main.get_command(app), [])
    return out


def make_fixtures(root: Path) -> dict[str, str]:
    """A tiny run, a scores file, a canaries folder, a model spec and other paths the cases name."""
    import numpy as np

    from dpaudit.hooks import GradientCanaries

    fx = {"root": str(root), "missing": str(root / "no-such-file"), "dir": str(root / "a-folder")}
    Path(fx["dir"]).mkdir(parents=True, exist_ok=True)
    fx["file"] = str(root / "a-file.txt")
    Path(fx["file"]).write_text("x\n")
    run = root / "run"
    if not (run / "checkpoint.json").exists():
        cmd = ["train", "--out", str(run), "--data", TINY, "--model", "logreg", "--epochs", "1"]
        _run_subprocess(cmd, root, 300)
    fx["run"] = str(run)
    fx["weights"] = str(run / "model.safetensors")
    fx["spec"] = str(root / "spec.json")
    meta = json.loads((run / "checkpoint.json").read_text())
    Path(fx["spec"]).write_text(json.dumps(meta["model"]))
    rng = np.random.default_rng(0)
    member = rng.integers(0, 2, 200)
    fx["scores"] = str(root / "scores.csv")
    Path(fx["scores"]).write_text(
        "member,score\n" + "".join(f"{m},{s:.6f}\n" for m, s in zip(member, member + rng.normal(size=200), strict=True))
    )
    fx["members"] = str(root / "members.txt")
    Path(fx["members"]).write_text("".join(f"{i}\n" for i in range(100)))
    canaries = root / "canaries"
    if not canaries.exists():
        shapes = {"fc.weight": (4, 3), "fc.bias": (4,)}
        c = GradientCanaries(shapes, count=8, sample_rate=0.5, clip=1.0, seed=0)
        for t in range(4):
            g = {n: np.zeros(s) for n, s in shapes.items()}
            z = {n: rng.normal(size=s) for n, s in shapes.items()}
            c.observe(t, {n: v + z[n] for n, v in c.inject(t, g).items()})
        c.save(canaries)
    fx["canaries"] = str(canaries)
    return fx


def generate(tree, fx: dict[str, str], rng: random.Random) -> list[tuple[str, str, list[str]]]:
    """(command, case label, argv after the command) for every case."""
    cases = []
    for path, params in tree:
        base = BASES.get(path)
        if base is None:
            continue
        if path not in SKIP_VALID:
            cases.append((path, "valid", list(base)))
        for p in params:
            if p.name in ("_dpaudit_quiet", "json_output", "quiet") or getattr(p, "hidden", False):
                continue
            ann = str(getattr(p.type_descriptor, "annotation", ""))
            if p.param_type_name == "argument":
                values = [fx["missing"], fx["dir"] if "Path" in ann else "", fx["file"], ""]
                target = next((i for i, a in enumerate(base) if a.startswith("{")), None)
                for v in values:
                    argv = list(base)
                    if target is None or (path in ("report",) and False):
                        argv = [v, *argv]
                    else:
                        argv[target] = v
                    cases.append((path, f"{p.name}={v!r}", argv))
                continue
            flag = next((o for o in p.opts if o.startswith("--")), p.opts[0])
            if getattr(p, "is_flag", False):
                if flag not in base and path not in SKIP_VALID:  # a flag alone is a valid run
                    cases.append((path, flag, [*base, flag]))
                continue
            if "Path" in ann:
                values = [fx["missing"], fx["dir"], fx["file"], "", fx["missing"] + "/sub"]
                if flag in OUTPUT_OPTIONS:
                    values = [fx["dir"], fx["file"], "", fx["file"] + "/sub", fx["run"]]
            elif "float" in ann:
                values = FLOAT_VALUES
            elif "int" in ann:
                values = INT_VALUES
            else:
                values = STR_VALUES
            for v in values:
                cases.append((path, f"{flag}={v!r}", _with(base, flag, v)))
    for line in PAIRS:
        path, _, options = line.partition(":")
        extra = options.split()
        cases.append((path, "pair " + " ".join(extra), _merge(BASES[path], extra)))
    for flag, value in ALGO_OPTIONS.items():
        for algo in ALGOS:
            extra = ["--algo", algo, flag] + ([] if value is None else [value])
            cases.append(("train", "algo " + " ".join(extra), _merge(BASES["train"], extra)))
    return cases


def _with(base: list[str], flag: str, value: str) -> list[str]:
    argv = list(base)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


def _merge(base: list[str], extra: list[str]) -> list[str]:
    argv = list(base)
    i = 0
    while i < len(extra):
        flag = extra[i]
        takes = i + 1 < len(extra) and not extra[i + 1].startswith("--")
        if takes and flag in argv and flag not in ("--score",):
            argv[argv.index(flag) + 1] = extra[i + 1]
        else:
            argv += extra[i : i + 1 + takes]
        i += 1 + takes
    return argv


def _fill(argv: list[str], fx: dict[str, str], scratch: Path) -> list[str]:
    names = {**fx, "new": str(scratch / "out"), "new2": str(scratch / "out2")}
    return [a.format(**names) if "{" in a else a for a in argv]


def _run_subprocess(argv, cwd, timeout):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.monotonic()
    try:  # subprocess.run kills (SIGKILL) on its timeout: a process stuck in C code ignores SIGTERM's handler
        p = subprocess.run(
            [sys.executable, "-m", "dpaudit", "--quiet", *argv],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        return p.returncode, p.stdout, p.stderr, time.monotonic() - started
    except subprocess.TimeoutExpired:
        return None, "", "", time.monotonic() - started


def _invoke(argv, cwd):
    """One case in the worker process (CliRunner: in-process, dpaudit imported once)."""
    from typer.testing import CliRunner

    from dpaudit.cli.main import app

    os.chdir(cwd)
    started = time.monotonic()
    r = CliRunner().invoke(app, ["--quiet", *argv])
    return r.exit_code, r.stdout, r.stderr, time.monotonic() - started


class _Worker:
    """A forked worker process running the cases in turn; killed (SIGKILL) and replaced on a timeout, so a case
    stuck in C code (where no Python signal handler runs) cannot stop the sweep."""

    def __init__(self):
        self.pool = multiprocessing.get_context("fork").Pool(1)

    def __call__(self, argv, cwd, timeout):
        started = time.monotonic()
        try:
            return self.pool.apply_async(_invoke, (argv, str(cwd))).get(timeout)
        except multiprocessing.TimeoutError:
            for proc in self.pool._pool:
                os.kill(proc.pid, signal.SIGKILL)
            self.pool.terminate()
            self.__init__()
            return None, "", "", time.monotonic() - started


ODD = ("nan", "inf", "-inf", "-1", "", " ", "-0", "1e309", "5e-324")


def classify(label: str, rc, stdout: str, stderr: str, wrote: bool) -> tuple[str, str]:
    text = stdout + stderr
    if rc is None:
        return "bug", "timeout"
    if "Traceback (most recent call last)" in text:
        return "bug", "traceback"
    if rc == 3:
        return "bug", "exit 3: " + (stderr.strip().splitlines() or [""])[-1][:200]
    if rc not in (0, 1, 2):
        return "bug", f"exit {rc}"
    if rc != 0 and wrote:
        return "bug", f"exit {rc} but the output was written"
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
    if rc == 2:
        errors = [ln for ln in lines if ln.startswith("error:")]
        if len(errors) != 1 or len(lines) != 1:
            return "suspect", f"{len(lines)} stderr lines, {len(errors)} error lines: {' | '.join(lines)[:200]}"
        return "ok", errors[0][:200]
    value = label.split("=", 1)[1] if "=" in label else None
    if rc == 0 and value is not None and value.strip("'\"") in ODD:
        return "suspect", f"exit 0 with {label}"
    return "ok", f"exit {rc}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="a command path such as 'audit plan' (repeatable)")
    parser.add_argument("--max-cases", type=int, default=400, help="sample this many cases (0: all)")
    parser.add_argument("--timeout", type=int, default=60)
    parser.add_argument("--subprocess", action="store_true", help="run each case as python -m dpaudit")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "dpaudit-cli-fuzz")
    parser.add_argument("--out", type=Path, help="write one JSON line per case here")
    parser.add_argument("--show", default="suspect,bug", help="outcomes to list (comma-separated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--match", help="only cases whose label contains this text")
    args = parser.parse_args()
    os.environ.setdefault("DPAUDIT_CACHE_DIR", str(args.workdir / "cache"))
    fx = make_fixtures(args.workdir / "fixtures")
    cases = generate(command_tree(), fx, random.Random(args.seed))
    if args.only:
        cases = [c for c in cases if c[0] in args.only]
    if args.match:
        cases = [c for c in cases if args.match in c[1]]
    if args.max_cases and len(cases) > args.max_cases:
        cases = random.Random(args.seed).sample(cases, args.max_cases)
    run = _run_subprocess if args.subprocess else _Worker()
    counts: dict[str, int] = {}
    sink = args.out.open("w") if args.out else contextlib.nullcontext()
    with sink as f:
        for path, label, argv in cases:
            scratch = Path(tempfile.mkdtemp(prefix="case", dir=args.workdir))
            filled = _fill(argv, fx, scratch)
            rc, out, err, seconds = run([*path.split(), *filled], scratch, args.timeout)
            wrote = any((scratch / n).exists() for n in ("out", "out2"))
            outcome, why = classify(label, rc, out, err, wrote)
            counts[outcome] = counts.get(outcome, 0) + 1
            record = {"command": path, "case": label, "argv": filled, "rc": rc, "outcome": outcome, "why": why,
                      "seconds": round(seconds, 2)}  # fmt: skip
            if f:
                f.write(json.dumps(record) + "\n")
                f.flush()
            if outcome in args.show.split(","):
                print(f"[{outcome}] dpaudit {path} {' '.join(filled)}  -> {why}", flush=True)
    print(f"{len(cases)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 1 if counts.get("bug") else 0


if __name__ == "__main__":
    sys.exit(main())
