"""Gradient canaries inside users' loops, from ONE training run each (issue 25's acceptance).

An unchanged Opacus loop with ``canaries.attach(optimizer)``: the correct pipeline is not a violation
over seeds 0, 1, 2; noise σC/√2, a bias without noise and the same noise draw at every step are each a
formal violation (exit 1 under --fail-on-violation). The NumPy, JAX and JAX/optax loops the same way. Seeds fixed:
the verdicts are deterministic. The noise check's sizes: the groups here have 72–2 880 coordinates ×
80 steps, so a noise std below ≈ 0.99·σC is resolved (docs/own-training-loop.md), √2 by far.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.cli.main import app
from dpaudit.errors import InputError

DELTA = 1e-5
runner = CliRunner()


def _audit_cli(directory, ex, *extra):
    args = ["--quiet", "audit", "canaries", str(directory), "--claimed-epsilon", repr(ex.claimed_epsilon(DELTA))]
    args += ["--delta", str(DELTA), "--noise-multiplier", str(ex.NOISE_MULTIPLIER), "--fail-on-violation", "--json"]
    return runner.invoke(app, [*args, *extra])


@pytest.fixture(scope="module")
def opacus_example():
    pytest.importorskip("opacus")
    from examples import opacus_canaries

    return opacus_canaries


@pytest.fixture(scope="module")
def digits_small(opacus_example):
    return opacus_example.digits()


@pytest.mark.peers
@pytest.mark.parametrize(("seed", "mode"), [(0, "hooks"), (1, "hooks"), (2, "hooks"), (0, "ghost")])
def test_opacus_correct_pipeline_is_not_a_violation(opacus_example, digits_small, tmp_path, seed, mode):
    ex = opacus_example
    ex.train(*digits_small, seed, tmp_path / "c", grad_sample_mode=mode)
    res = _audit_cli(tmp_path / "c", ex, "--steps", str(ex.STEPS), "--sample-rate", str(ex.SAMPLE_RATE))
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["verdict"] != "violation" and d["steps"] == ex.STEPS and d["count"] == ex.CANARIES
    assert [a["method"] for a in d["audits"]] == ["one-run", "one-run-fdp"]
    assert all(a["formal"] or a["refutation"] for a in d["audits"])  # the f-DP record refutes curves (issue 27)
    noise = d["noise_check"]
    assert noise["verdict"] == "consistent"
    # The noise Opacus added is σC on every coordinate: each group's estimated ratio within its own 99.9% band.
    for g in noise["groups"]:
        assert abs(g["ratio"] - 1) <= 3.3 / math.sqrt(2 * g["dof"]), g


@pytest.mark.peers
@pytest.mark.parametrize(
    ("bug", "mode"), [("sqrt2", "hooks"), ("bias", "hooks"), ("reuse", "hooks"), ("sqrt2", "ghost")]
)
def test_opacus_planted_bug_is_a_violation_exit_1_from_one_run(opacus_example, digits_small, tmp_path, bug, mode):
    """Opacus' hooks and its fast gradient clipping (grad_sample_mode="ghost", DPOptimizerFastGradientClipping)."""
    ex = opacus_example
    ex.train(*digits_small, 0, tmp_path / "c", bug=bug, grad_sample_mode=mode)
    res = _audit_cli(tmp_path / "c", ex)
    assert res.exit_code == 1, res.output
    d = json.loads(res.stdout)
    noise = d["noise_check"]
    assert d["verdict"] == "violation" and noise["verdict"] == "violation" and noise["formal"]
    ratios = {g["name"]: g["ratio"] for g in noise["groups"]}
    assert set(ratios) == {"0.weight", "0.bias", "3.weight", "3.bias"}  # Opacus' "_module." prefix removed
    if bug == "sqrt2":
        assert all(abs(r - 1 / math.sqrt(2)) < 0.1 for r in ratios.values())
        assert noise["variance_p_value"] < 1e-6
    if bug == "bias":
        assert ratios["0.bias"] == 0 and ratios["3.bias"] == 0 and abs(ratios["3.weight"] - 1) < 0.05
    if bug == "reuse":
        assert noise["independence_p_value"] == 0.0


@pytest.mark.peers
def test_opacus_adapter_refusals(opacus_example, tmp_path):
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from dpaudit.hooks import GradientCanaries

    model = torch.nn.Linear(4, 2)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    canaries = GradientCanaries(shapes, count=4, sample_rate=0.5, clip=None, seed=0)
    with pytest.raises(InputError, match="DPOptimizer"):
        canaries.attach(torch.optim.SGD(model.parameters(), lr=0.1))
    data = DataLoader(TensorDataset(torch.zeros(8, 4), torch.zeros(8, dtype=torch.int64)), batch_size=4)
    m, opt, _ = PrivacyEngine().make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data_loader=data,
        noise_multiplier=1.0, max_grad_norm=2.5,
    )  # fmt: skip
    other = GradientCanaries({"w": (3, 4), "b": (3,)}, count=4, sample_rate=0.5, clip=None, seed=0)
    with pytest.raises(InputError, match="another model"):
        other.attach(opt)
    with pytest.raises(InputError, match="another model"):
        GradientCanaries({"w": (2, 4), "b": (2,)}, count=4, sample_rate=0.5, clip=None, seed=0).attach(opt, module=m)
    with pytest.raises(InputError, match="differs from the optimizer's max_grad_norm"):  # a canary must be a record
        GradientCanaries(shapes, count=4, sample_rate=0.5, clip=5.0, seed=0).attach(opt)
    from opacus.optimizers import DPPerLayerOptimizer

    per_layer = DPPerLayerOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0, max_grad_norm=[1.0, 1.0],
        expected_batch_size=4,
    )  # fmt: skip
    with pytest.raises(InputError, match="DPPerLayerOptimizer: per-layer clipping"):
        GradientCanaries(shapes, count=4, sample_rate=0.5, clip=None, seed=0).attach(per_layer)
    assert canaries.attach(opt, module=m) is opt and canaries.clip == 2.5  # clip = max_grad_norm
    with pytest.raises(InputError, match="already"):
        canaries.attach(opt)


@pytest.mark.peers
def test_audit_canaries_bad_input_exit_2(opacus_example, digits_small, tmp_path):
    ex = opacus_example
    X, y = digits_small
    ex.train(X[:300], y[:300], 0, tmp_path / "c")
    for extra, message in [
        (["--steps", str(ex.STEPS + 1)], "observed"),
        (["--sample-rate", "0.2"], "Poisson-sampled at q"),
    ]:
        res = _audit_cli(tmp_path / "c", ex, *extra)
        assert res.exit_code == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.output
        assert message in json.loads(res.stdout)["error"]  # --json: the error as JSON on stdout too
    res = runner.invoke(app, ["audit", "canaries", str(tmp_path), "--claimed-epsilon", "1", "--delta", "1e-5"])
    assert res.exit_code == 2 and "not a gradient-canary directory" in res.output
    with pytest.raises(InputError, match="already exists"):
        ex.train(X[:300], y[:300], 0, tmp_path / "c")  # saved observations are never overwritten silently


def test_numpy_loop_correct_and_sqrt2(tmp_path):
    from dpaudit.workflows.hooks_audit import audit_canaries
    from examples import numpy_canaries as ex

    kw = dict(claimed_epsilon=ex.claimed_epsilon(DELTA), delta=DELTA, noise_multiplier=ex.NOISE_MULTIPLIER)
    ok = audit_canaries(ex.train(0, tmp_path / "ok"), **kw)
    # A claimed q 1e-8 off the canaries' (beyond _close's 1e-9): both printed as they are, not as "q = 0.1" twice.
    off = ex.SAMPLE_RATE * (1 + 1e-8)
    with pytest.raises(InputError, match=rf"q = {off!r}, but .* at q = {ex.SAMPLE_RATE!r}:"):
        audit_canaries(tmp_path / "ok", **kw, sample_rate=off)
    bug = audit_canaries(ex.train(0, tmp_path / "bug", noise_factor=1 / math.sqrt(2)), **kw)
    assert ok.verdict != "violation" and ok.noise.verdict == "consistent"
    assert bug.verdict == "violation" and bug.noise.verdict == "violation"


def test_jax_loop_correct_and_reused_noise(tmp_path):
    pytest.importorskip("jax")
    from dpaudit.workflows.hooks_audit import audit_canaries
    from examples import jax_canaries as ex

    kw = dict(claimed_epsilon=ex.claimed_epsilon(DELTA), delta=DELTA, noise_multiplier=ex.NOISE_MULTIPLIER)
    ok = audit_canaries(ex.train(0, tmp_path / "ok"), **kw)
    # A claimed q 1e-8 off the canaries' (beyond _close's 1e-9): both printed as they are, not as "q = 0.1" twice.
    off = ex.SAMPLE_RATE * (1 + 1e-8)
    with pytest.raises(InputError, match=rf"q = {off!r}, but .* at q = {ex.SAMPLE_RATE!r}:"):
        audit_canaries(tmp_path / "ok", **kw, sample_rate=off)
    bug = audit_canaries(ex.train(0, tmp_path / "bug", reuse_noise=True), **kw)
    assert ok.verdict != "violation"
    assert bug.verdict == "violation" and bug.noise.independence_p_value == 0.0
    assert np.all(np.isfinite(ok.noise.variance_p_value))


def test_optax_loop_correct_is_not_a_violation_and_sqrt2_is_exit_1(tmp_path):
    """The jitted JAX/optax loop (canaries.optax_inject()/optax_observe() in an optax.chain), ONE run each.
    Sizes from the math: every parameter group has >= 360 noise values, and at its level (0.05/3 for the
    noise check, /2 for the variance test, /4 groups) the χ² test resolves a noise std up to r·σC with
    probability 0.999 for r above 1/√2 — so σC/√2 is caught in each group with probability >= 0.999."""
    pytest.importorskip("optax")
    from dpaudit.audit.noise import resolvable_noise_ratio
    from examples import optax_canaries as ex

    ok = _audit_cli(ex.train(0, tmp_path / "ok"), ex, "--steps", str(ex.STEPS), "--sample-rate", str(ex.SAMPLE_RATE))
    assert ok.exit_code == 0, ok.output
    d = json.loads(ok.stdout)
    assert d["verdict"] != "violation" and d["noise_check"]["verdict"] == "consistent" and d["steps"] == ex.STEPS
    for g in d["noise_check"]["groups"]:  # the noise the chain added is σC: each ratio within its 99.9% band
        assert abs(g["ratio"] - 1) <= 3.3 / math.sqrt(2 * g["dof"]), g
    bug = _audit_cli(ex.train(0, tmp_path / "bug", bug="sqrt2"), ex)
    assert bug.exit_code == 1, bug.output
    noise = json.loads(bug.stdout)["noise_check"]
    assert noise["verdict"] == "violation" and noise["formal"]
    a_group = noise["details"]["alpha_per_group"]
    assert a_group == pytest.approx(0.05 / 3 / 2 / 4)
    for g in noise["groups"]:
        assert resolvable_noise_ratio(g["dof"], a_group, power=0.999) > 1 / math.sqrt(2), g
        assert abs(g["ratio"] - 1 / math.sqrt(2)) <= 3.3 / math.sqrt(2 * g["dof"]), g
        assert g["p_value"] <= a_group, g


def test_import_with_canaries_gives_a_formal_one_run_audit(tmp_path):
    """make -> insert -> own training -> import --canaries -> audit checkpoint: a formal one-run record; the
    non-private model refutes a claim of ε = 1 (exit 1). Bad input: canaries made for other data, exit 2."""
    from examples import import_with_canaries as ex

    def invoke(args):
        r = runner.invoke(app, args)
        return r.exit_code, r.stdout

    d = ex.run(tmp_path, invoke)
    assert d["exit_code"] == 1
    records = [a for a in d["audits"] if a["source"]["attack"] == "canaries"]
    assert records and all(a["formal"] for a in records) and records[0]["method"] == "one-run"
    assert records[0]["verdict"] == "violation" and records[0]["epsilon_lower_bound"] > 1.0
    assert "imported run" in records[0]["description"]
    # The secret bits are not in the file the trainer gets: insert.npz holds the included canaries only.
    with np.load(tmp_path / "canaries" / "insert.npz", allow_pickle=False) as z:
        assert set(z.files) == {"X", "y"} and 0 < len(z["y"]) < 200
    np.savez(tmp_path / "other.npz", X=np.zeros((30, 5)), y=np.arange(30, dtype=np.int64) % 10)
    (tmp_path / "m.txt").write_text("\n".join(map(str, range(20))) + "\n")
    r = runner.invoke(app, ["import", str(tmp_path / "model.safetensors"), "--model-spec", str(tmp_path / "spec.json"),
                            "--data", str(tmp_path / "other.npz"), "--members", str(tmp_path / "m.txt"),
                            "--canaries", str(tmp_path / "canaries"), "--out", str(tmp_path / "r2")])  # fmt: skip
    assert r.exit_code == 2
    r = runner.invoke(
        app, ["canaries", "make", "--data", "digits", "--count", "5", "--out", str(tmp_path / "canaries")]
    )
    assert r.exit_code == 2 and "already exists" in r.output


@pytest.mark.parametrize("name", ["optax_canaries", "opacus_canaries"])
def test_example_refuses_an_existing_out_before_training_in_one_line(name, tmp_path, capsys):
    """`python -m examples.optax_canaries --out DIR` on an existing DIR trained for the whole run, then died in a
    traceback (exit 1) telling the user to "use --force", an option the example did not have."""
    import importlib

    main = importlib.import_module(f"examples.{name}").main
    (tmp_path / "c").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert (
        exit_.value.code == 2 and err.strip() == f"error: {tmp_path / 'c'} already exists; use --force to overwrite it"
    )
