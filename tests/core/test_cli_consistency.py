"""One consistent CLI (issue 29): the target run is RUN everywhere, one attack-set option with one default,
--delta is the claim's δ, --quiet keeps results (before or after the command), errors are one line (JSON
with --json), and the help imports no deep-learning framework."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit import budget
from dpaudit.cli.main import app
from dpaudit.defaults import DEFAULTS
from dpaudit.progress import NOTICES_ENV, announce, notices

runner = CliRunner()
ACCOUNT = ["account", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"]
TINY = ["--data", "synthetic:n=400,d=8,classes=2,seed=0", "--model", "logreg", "--epochs", "1", "--batch-size", "32"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def command(path: list[str]):
    """The click command at ``path`` (e.g. ["attack", "mia"]) of the app."""
    import typer.main

    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def option(path: list[str], name: str):
    return next(p for p in command(path).params if p.name == name)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("consistency") / "run"
    r = invoke("--quiet", "train", *TINY, "--out", out)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def dp_run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("consistency") / "dp"
    r = invoke("--quiet", "train", *TINY, "--algo", "dpsgd", "--epsilon", "4", "--delta", "1e-4", "--out", out)
    assert r.exit_code == 0, r.output
    return out


# ---- help without torch --------------------------------------------------------------------------------

HELP_SCRIPT = """
import sys
from typer.testing import CliRunner
from dpaudit.cli.main import app
for args in ([], ["train"], ["import"], ["attack", "mia"], ["attack", "extract"], ["audit", "train"],
             ["audit", "checkpoint"], ["report"], ["account", "dpsgd"], ["demo"]):
    r = CliRunner().invoke(app, [*args, "--help"])
    assert r.exit_code == 0, (args, r.output)
heavy = sorted(m for m in ("torch", "jax", "sklearn", "scipy", "pandas", "matplotlib") if m in sys.modules)
print(",".join(heavy))
"""


def test_help_imports_no_framework():
    """`dpaudit --help` and every `dpaudit CMD --help` are answered without importing torch, jax, scikit-learn
    (or scipy, pandas, matplotlib): the CLI imports them lazily, in the commands that use them."""
    r = subprocess.run([sys.executable, "-c", HELP_SCRIPT], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported by the help: {r.stdout.strip()}"


BAD_DATA_SCRIPT = """
import sys
from typer.testing import CliRunner
open("w.safetensors", "wb").close()  # import checks its WEIGHTS first: an existing one, so that --data is reached
from dpaudit.cli.main import app
for args in (["train", "--data", "nope.npz", "--out", "o"], ["train", "--data", "nope", "--out", "o"],
             ["audit", "train", "--data", "nope.csv"],
             ["import", "w.safetensors", "--model-spec", "s.json", "--out", "o", "--data", "no/X", "--members", "m"]):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and r.output.startswith("error: "), (args, r.output)
    assert "no such file" in r.output or "unknown --data" in r.output, (args, r.output)
print(",".join(m for m in ("torch", "jax", "sklearn", "scipy", "pandas") if m in sys.modules))
"""


def test_a_missing_data_file_is_refused_without_importing_torch(tmp_path):
    """`dpaudit train --data nope.npz` imported torch (and the accountants) before saying the file does not exist:
    2.6 s (up to 8 s on a busy machine) for a one-line error. --data's file checks (load_dataset's, no reading)
    now come first in train, import and audit train."""
    r = subprocess.run(
        [sys.executable, "-c", BAD_DATA_SCRIPT], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported before the refusal: {r.stdout.strip()}"


def test_backend_help_names_the_extra():
    """As rendered: rich read "[jax]" in '.[jax]' (and the "[mlp]" default) as style tags and dropped them."""
    r = runner.invoke(app, ["train", "--help"], terminal_width=200)
    text = " ".join(r.output.replace("│", " ").split())
    default = "[default: logreg for --algo outpert, objpert and dpagd, the only model they train; mlp otherwise]"
    assert "pip install '.[jax]'" in text and f"logreg | mlp | cnn | rnn {default}" in text


# ---- errors: one line, JSON with --json ------------------------------------------------------------------


def test_a_typo_is_one_line_with_the_suggestion():
    r = invoke("train", "--epoch", "3")
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        "error: no such option --epoch (did you mean --epochs or --epsilon?); see root train --help"
    ]
    r = invoke("trian")
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        "error: no such command 'trian' (did you mean 'train'?); see root --help"
    ]
    r = invoke("attack", "mia", "--attack", "loss")  # an option of another command
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "--attacks" in r.output


def test_an_option_given_to_a_group_names_the_commands_that_take_it():
    # `dpaudit account --noise-multiplier 1.1 ...` (the subcommand left out) said "no such option", and
    # `dpaudit --epochs 3` suggested --yes.
    r = invoke("account", "--noise-multiplier", "1.1")
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        "error: --noise-multiplier is an option of root account dpsgd, not of root account; "
        "see root account dpsgd --help"
    ]
    r = invoke("--epochs", "3")
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert (
        r.output.startswith("error: --epochs is an option of root train, root audit train, ")
        and "--yes" not in r.output
    )
    r = invoke("account", "--foo")  # nobody's option: as before
    assert r.output.strip() == "error: no such option --foo; see root account --help"


@pytest.mark.parametrize(
    "args",
    [
        ["--json", "train", "--epoch", "3"],  # a usage error, --json before the command
        ["train", "--epoch", "3", "--json"],  # ... and after it
        ["--json", *ACCOUNT[:-1], "2"],  # a domain error (δ out of range)
        [*ACCOUNT[:-1], "2", "--json"],
    ],
)
def test_json_errors_are_json_on_stdout_exit_2(args):
    r = invoke(*args)
    assert r.exit_code == 2
    d = json.loads(r.stdout)
    assert set(d) == {"error", "exit_code"} and d["exit_code"] == 2 and d["error"]
    lines = r.stderr.strip().splitlines()  # the one human line stays on stderr
    assert len(lines) == 1 and lines[0] == f"error: {d['error']}"


def test_without_json_the_error_is_one_line_on_stderr_only():
    r = invoke(*ACCOUNT[:-1], "2")
    assert r.exit_code == 2 and r.stdout == ""
    want = "error: expected --delta in (0, 0.1], got 2.0 (a larger delta is no privacy guarantee)"
    assert r.stderr.strip().splitlines() == [want]


# ---- --quiet: before or after the command, never hides results -------------------------------------------


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_keeps_results(where):
    args = ["--quiet", *ACCOUNT] if where == "before" else [*ACCOUNT, "--quiet"]
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("epsilon = ") and r.stderr == ""


def test_quiet_after_the_command_silences_progress(tmp_path):
    loud = invoke("train", *TINY, "--out", tmp_path / "a")
    assert loud.exit_code == 0 and "dpaudit: " in loud.stderr  # progress lines (not a terminal)
    quiet = invoke("train", *TINY, "--out", tmp_path / "b", "-q")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert quiet.stdout == loud.stdout.replace(str(tmp_path / "a"), str(tmp_path / "b"))  # same result


# ---- cost notices: through the CLI's reporter, once per command, silent with --quiet -----------------------


def test_cost_notices_once_per_command_and_quiet(monkeypatch, tmp_path):
    """Every training announces its estimate (NOTICE_SECONDS = 0 here); a multi-run audit of 4 trainings
    still says each estimate once, and --quiet says none."""
    monkeypatch.setattr(budget, "NOTICE_SECONDS", 0.0)
    args = [
        "audit",
        "train",
        *TINY,
        "--algo",
        "sgd",
        "--train-size",
        "60",
        "--runs",
        "2",
        "--allow-inconclusive",
        "--json",
    ]
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    notices_seen = [line for line in r.stderr.splitlines() if "(an estimate)" in line]
    assert [line.split(":")[1] for line in notices_seen] == [" audit train", " training"], r.stderr
    r = invoke(*args, "--quiet")
    assert r.exit_code == 0 and "(an estimate)" not in r.stderr
    assert json.loads(r.stdout)["runs"] == 2  # the result is still there


def test_announce_dedupes_within_a_block_and_silences_workers(monkeypatch, capsys):
    monkeypatch.delenv(NOTICES_ENV, raising=False)
    said = []
    with notices(said.append):
        announce("x: about 2 minutes")
        announce("x: about 2 minutes")
        announce("y: about 3 minutes")
        import os

        assert os.environ[NOTICES_ENV] == "1"  # inherited by worker processes started in the block
    assert said == ["dpaudit: x: about 2 minutes", "dpaudit: y: about 3 minutes"]
    announce("z")  # no reporter: stderr, as before (library use)
    assert capsys.readouterr().err == "dpaudit: z\n"
    monkeypatch.setenv(NOTICES_ENV, "1")  # a worker whose parent reports notices
    announce("z")
    assert capsys.readouterr().err == ""


# ---- the target run: RUN, and --checkpoint/-c still working, deprecated ------------------------------------


def test_attacks_take_the_run_as_argument(run_dir):
    new = invoke("--json", "attack", "mia", run_dir, "--attacks", "loss", "--bootstrap", "0")
    assert new.exit_code == 0, new.output
    assert "deprecated" not in new.stderr
    old = invoke("--json", "attack", "mia", "-c", run_dir, "--method", "loss", "--bootstrap", "0")
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout) == json.loads(new.stdout)
    assert "--checkpoint/-c is deprecated" in old.stderr and "--method/-m is deprecated; use --attacks" in old.stderr
    assert "deprecated" not in invoke("--quiet", "attack", "mia", "-c", run_dir, "--attacks", "loss").stderr


@pytest.mark.parametrize("sub", [["mia"], ["extract", "--budget", "10"], ["inversion"], ["attribute", "-f", "0"]])
def test_every_attack_names_the_run_the_same_way(sub, run_dir):
    usage = invoke("attack", sub[0], "--help").output
    assert "RUN" in usage and "--checkpoint" not in usage  # the alias is hidden
    r = invoke("attack", *sub)
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        "error: missing argument RUN (the target model's run directory)"
    ]
    r = invoke("attack", *sub, run_dir, "--checkpoint", run_dir)
    assert r.exit_code == 2 and "give the run once" in r.output


def test_run_is_positional_in_every_command_that_reads_one():
    for path in (["attack", "mia"], ["attack", "extract"], ["attack", "inversion"], ["attack", "attribute"],
                 ["audit", "checkpoint"], ["inspect"]):  # fmt: skip
        arguments = [p for p in command(path).params if p.param_type_name == "argument"]
        assert [p.name for p in arguments] == ["run"], path


# ---- one attack set, one default ------------------------------------------------------------------------------


def test_attack_set_has_one_name_and_one_default():
    default = ",".join(DEFAULTS.attacks)
    for path in (["attack", "mia"], ["audit", "checkpoint"], ["report"]):
        assert option(path, "attacks").opts[0] == "--attacks" and option(path, "attacks").default == default, path
        assert option(path, "reference_models").default == DEFAULTS.reference_models, path
    assert option(["attack", "mia"], "method").hidden


# ---- --delta: the δ of the claim --------------------------------------------------------------------------------


def test_audit_train_delta_is_the_claims(tmp_path):
    """One δ: the recipe is accounted at --delta and the audit tests (ε, δ) at it; --train-delta still works."""
    base = ["--quiet", "audit", "train", *TINY, "--algo", "dpsgd", "--epsilon", "4", "--train-size", "60",
            "--runs", "2", "--allow-inconclusive", "--json"]  # fmt: skip
    r = invoke(*base, "--delta", "1e-3")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["delta"] == 1e-3 and d["claim"]["delta"] == 1e-3
    old = invoke(*base, "--train-delta", "1e-3")
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout)["delta"] == 1e-3
    r = invoke(*base, "--train-delta", "1e-3", "--delta", "1e-4")
    assert r.exit_code == 2 and "a claim has one δ" in r.output
    assert not option(["audit", "train"], "delta").hidden and option(["audit", "train"], "train_delta").hidden


def test_audit_checkpoint_refuses_a_delta_below_the_claims(dp_run_dir):
    """(ε, 1e-4)-DP says nothing about (ε, 1e-6): testing the run's ε there could call a violation of a claim
    nobody made. With --claimed-epsilon the user states the claim (ε, δ) to test."""
    r = invoke("audit", "checkpoint", dp_run_dir, "--attacks", "loss", "--delta", "1e-6")
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert "δ = 0.0001" in r.output and "--claimed-epsilon" in r.output
    r = invoke("--json", "audit", "checkpoint", dp_run_dir, "--attacks", "loss", "--delta", "1e-6",
               "--claimed-epsilon", "40")  # fmt: skip
    assert r.exit_code == 0, r.output


def test_delta_help_says_the_same_everywhere():
    paths = (["train"], ["import"], ["account", "dpsgd"], ["account", "calibrate"], ["audit", "scores"],
             ["audit", "plan"], ["audit", "checkpoint"], ["audit", "train"], ["audit", "canaries"])  # fmt: skip
    for path in paths:
        assert "δ of the privacy claim (ε, δ)" in option(path, "delta").help, path


# ---- one option, one help: the same flag says the same thing in every command ------------------------------------


def _all_commands():
    """(path, click command) of every command of the app, groups walked."""
    import typer.main

    stack = [([], typer.main.get_command(app))]
    while stack:
        path, cmd = stack.pop()
        if hasattr(cmd, "commands"):
            stack += [([*path, name], sub) for name, sub in cmd.commands.items()]
        else:
            yield path, cmd


def _helps(name: str) -> dict[tuple[str, ...], str]:
    return {tuple(path): p.help for path, cmd in _all_commands() for p in cmd.params if p.name == name and not p.hidden}


def test_the_same_option_has_the_same_help_everywhere():
    """A newcomer reads --fail-on-violation, --cache-dir, --force, --json and --quiet in one command's help and
    must be able to trust it in the next. `audit train` said "exit 1 when the verdict is 'violation'" while it
    also exits 1 on 'curve-refuted' (its per-step audit), as the other audits' help says; `audit checkpoint` and
    `report` said "(default: user cache)" where `attack mia` names the variables and the path."""
    for name in ("fail_on_violation", "cache_dir", "force", "json_output", "_dpaudit_quiet"):
        helps = _helps(name)
        assert len(helps) >= 2 and len(set(helps.values())) == 1, (name, helps)
    assert len(_helps("fail_on_violation")) == 4  # scores, checkpoint, train, canaries


def test_every_data_option_lists_every_form():
    """`canaries make --data` said "PATH.csv | PATH.npz | digits" although it reads every form `train --data`
    reads (a directory of .npy files, breast-cancer, wine, synthetic:...)."""
    from dpaudit.data import DATA_HELP

    helps = _helps("data")
    assert {"train", "import", "audit", "canaries"} <= {path[0] for path in helps}, helps
    for path, text in helps.items():
        assert text.endswith(DATA_HELP), path


def test_seed_help_says_what_the_seed_seeds():
    """`audit checkpoint` and `report` run one workflow with one seed, so one help; `audit plan`'s seed seeds the
    simulated audits and `audit train`'s the runs themselves, not only "the holdout split and tie-breaking"."""
    helps = _helps("seed")
    assert helps[("audit", "checkpoint")] == helps[("report",)] and "attacks" in helps[("report",)]
    assert "simulated audits" in helps[("audit", "plan")]
    assert "runs" in helps[("audit", "train")]


def test_every_command_lists_in_one_short_line():
    """`dpaudit --help` and `dpaudit audit --help` list each command by the first paragraph of its help: `inspect`
    listed its 650-character JSON key list there (12 lines of the list), `audit plan` 315 characters."""
    import typer.main

    groups = [([], typer.main.get_command(app))]
    groups += [([name], cmd) for name, cmd in groups[0][1].commands.items() if hasattr(cmd, "commands")]
    for path, group in groups:
        for name, cmd in group.commands.items():
            listed = cmd.short_help or (cmd.help or "").split("\n\n")[0]
            assert 0 < len(listed) <= 250, ([*path, name], len(listed))


def test_audit_canaries_marks_the_claim_it_requires(tmp_path):
    """`audit canaries` refuses to run without --claimed-epsilon and --delta, but its help showed both as optional
    (no [required], unlike every other required option): the newcomer learnt it from the error. With `--run RUN`
    (thirteenth session) they default to the run's claim, so click cannot require them: the help says "required"
    and when not, and the refusal names both ways, before the directory is read."""
    for name in ("claimed_epsilon", "delta"):
        assert "(required; with --run: the run's)" in option(["audit", "canaries"], name).help
    r = invoke("audit", "canaries", tmp_path, "--delta", "1e-5")
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        "error: give --claimed-epsilon (the claim audited), or --run RUN to audit the claim that run records"
    ]


def test_every_option_has_a_help():
    """`train --max-physical-batch` and `train --weight-decay` were listed with no help at all (what they cap or
    decay, and for which algorithms, only in the README)."""
    bare = [(path, p.opts) for path, cmd in _all_commands() for p in cmd.params if not p.hidden and not p.help]
    assert bare == []


def test_help_paragraphs_wrap_to_the_terminal():
    """Typer keeps the single line breaks of a help's later paragraphs, so docstrings wrapped at the source's
    120 columns printed broken lines at 80 (`audit plan --help`: "...A size counts only" / "when the lower end
    ..."). Every command's and group's help has one line per paragraph, and the rendered help at 80 columns
    reads the paragraph as one run of text."""
    import typer.main

    stack = [([], typer.main.get_command(app))]
    seen = 0
    while stack:
        path, cmd = stack.pop()
        stack += [([*path, name], sub) for name, sub in getattr(cmd, "commands", {}).items()]
        for paragraph in (cmd.help or "").split("\n\n"):
            assert paragraph.startswith("\b") or "\n" not in paragraph, (path, paragraph)
        seen += 1
    assert seen > 20
    lines = [
        " ".join(line.split())
        for line in runner.invoke(app, ["audit", "plan", "--help"], terminal_width=80).output.splitlines()
    ]
    assert any("A size counts only when" in line for line in lines), lines


def test_a_gate_on_estimates_only_fails_instead_of_passing_and_json_stays_one_document(tmp_path):
    """`audit scores s.csv --claimed-epsilon 1 --fail-on-violation` on the default design (membership: an estimate)
    exited 0 whatever the scores said, even with the estimate above the claim: a CI gate that could never exit 1
    passed. Now exit 2 with one line (never 1: nothing formal was refuted); --fail-on-estimate keeps the opt-in gate.
    With --json an inconclusive or estimate-only gate wrote the result and then an error object: two JSON documents
    on stdout, which `json.load` refuses; now stdout is the result alone, the error line on stderr."""
    rng = np.random.default_rng(0)  # members' scores N(0.5, 1), non-members' N(0, 1): a 0.29 estimate
    scores = tmp_path / "s.csv"
    scores.write_text("member,score\n" + "".join(f"{i < 200:d},{rng.normal(0.5 * (i < 200), 1)}\n" for i in range(400)))
    for claim, verdict in (("2", "consistent"), ("0.1", "estimate-exceeds-claim")):
        args = ("audit", "scores", scores, "--claimed-epsilon", claim, "--fail-on-violation")
        r = invoke(*args, "--json")
        assert r.exit_code == 2, r.output
        assert json.loads(r.stdout)["verdict"] == verdict and json.loads(r.stdout)["formal"] is False
        (line,) = r.stderr.strip().splitlines()
        assert (
            line.startswith("error: --fail-on-violation: every result here is an estimate")
            and "--fail-on-estimate" in line
        )
        assert invoke(*args, "--fail-on-estimate").exit_code == (1 if verdict == "estimate-exceeds-claim" else 0)
        assert invoke(*args[:-1]).exit_code == 0  # no gate asked for
    # the formal design still gates: violation exits 1, an inconclusive claim exits 2 with one JSON document
    formal = ("audit", "scores", scores, "--design", "multi-run", "--fail-on-violation", "--json")
    assert invoke(*formal, "--claimed-epsilon", "0.1").exit_code == 1
    r = invoke(*formal, "--claimed-epsilon", "9")
    assert r.exit_code == 2 and json.loads(r.stdout)["verdict"] == "inconclusive", r.output


def test_a_gate_without_a_claim_fails_instead_of_passing(tmp_path, run_dir):
    """`audit scores s.csv --fail-on-violation` without --claimed-epsilon (a CI job that forgot the claim), or
    `audit checkpoint RUN --fail-on-violation` on a run without a claim, tested nothing and exited 0: a gate that
    could never fail passed (the rule dpaudit.audit.result.CANNOT_REFUTE states for inconclusive verdicts)."""
    scores = tmp_path / "s.csv"
    scores.write_text("member,score\n" + "".join(f"{i % 2},{(i % 2) + i / 100}\n" for i in range(40)))
    for flag in ("--fail-on-violation", "--fail-on-estimate"):
        r = invoke("audit", "scores", scores, flag)
        assert r.exit_code == 2, r.output
        assert r.stderr.strip().splitlines() == [
            f"error: {flag}: no claim was tested, so the gate fails instead of passing; give --claimed-epsilon (or "
            "audit a run that records a privacy claim)"
        ]
    r = invoke("audit", "scores", scores, "--fail-on-violation", "--claimed-epsilon", "0.1", "--design", "multi-run")
    assert r.exit_code == 1, r.output  # with a claim, the gate gates
    r = invoke("--quiet", "audit", "checkpoint", run_dir, "--attacks", "loss", "--fail-on-violation")
    assert r.exit_code == 2 and "no claim was tested" in r.stderr
