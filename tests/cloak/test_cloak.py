"""Cloak training, application, checkpoints, the local-DP reading and the CLI."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.errors import CheckpointError, InputError
from dpaudit.training.cloak import (
    CLOAK_FILE,
    CLOAK_TENSORS,
    Cloak,
    apply_cloak,
    load_cloak,
    local_dp_reading,
    parse_lambdas,
    save_cloak,
    train_cloak_sweep,
)
from tests.cloak.conftest import LAMBDAS


def test_smaller_lambda_suppresses_more_and_costs_accuracy(tiny_cloaks):
    """Monotone within noise: suppression falls and cloaked accuracy rises as lambda grows; the clean accuracy is
    the frozen target's, the same for every lambda. 120 test records: accuracy s.e. <= 0.046, so the ends of
    the sweep must differ by more than 0.2 and neighbours may not reverse by more than 0.05."""
    m = [tiny_cloaks[lam].meta["metrics"] for lam in LAMBDAS]
    supp = [x["suppression_ratio"] for x in m]
    acc = [x["cloaked_accuracy"] for x in m]
    assert all(a >= b for a, b in itertools.pairwise(supp))
    assert supp[0] - supp[-1] >= 0.25
    assert all(b >= a - 0.05 for a, b in itertools.pairwise(acc))
    assert acc[-1] - acc[0] > 0.2
    assert len({x["clean_accuracy"] for x in m}) == 1
    for x in m:
        assert x["accuracy_loss"] == pytest.approx(x["clean_accuracy"] - x["cloaked_accuracy"])


def test_apply_cloak_is_clip_plus_gaussian(tiny_cloaks):
    """Per feature, the cloaked values of one record have mean clip(x) + mu and sd sigma: z-tests at n = 4000
    (|z| < 5), and the same test rejects half the noise (sd ratio 0.5, ~30 standard errors off)."""
    c = tiny_cloaks[LAMBDAS[0]]
    x = np.where(np.arange(c.mu.size) % 2 == 0, c.hi + 3.0, c.lo - 1.0).astype(np.float32)  # outside: clipped
    rep = apply_cloak(c, np.repeat(x[None], 4000, 0), seed=1)
    center = np.clip(x, c.lo, c.hi) + c.mu
    z_mean = (rep.mean(0) - center) / (c.sigma / np.sqrt(4000))
    sd = rep.std(0, ddof=1)
    z_sd = (sd / c.sigma - 1) / np.sqrt(1 / (2 * 3999))
    assert np.all(np.abs(z_mean) < 5) and np.all(np.abs(z_sd) < 5)
    half = Cloak(c.mu, c.sigma / 2, c.lo, c.hi, c.meta)
    z_half = (apply_cloak(half, np.repeat(x[None], 4000, 0), seed=1).std(0, ddof=1) / c.sigma - 1) * np.sqrt(7998)
    assert np.all(np.abs(z_half) > 5)
    assert np.array_equal(apply_cloak(c, x[None], seed=3), apply_cloak(c, x[None], seed=3))


def test_local_dp_reading_matches_the_analytic_gaussian(tiny_cloaks):
    """Per feature: the analytic Gaussian mechanism (Balle & Wang 2018, arXiv:1805.06530, Thm. 8) with
    sensitivity = range; composed: one Gaussian with L2 sensitivity sqrt(sum_i range_i^2 / sigma_i^2) at
    sigma 1. Reading the sensitivity as half the range (a planted mistake) under-reports and is caught."""
    from dpaudit.accounting import analytic_gaussian_epsilon

    c = tiny_cloaks[LAMBDAS[1]]
    delta = 1e-5
    ldp = local_dp_reading(c, delta)
    r, s = c.feature_range, c.sigma.astype(np.float64)
    oracle = [analytic_gaussian_epsilon(float(s[i]), delta, sensitivity=float(r[i])) for i in range(len(r))]
    np.testing.assert_allclose(ldp["per_feature_epsilon"], oracle, rtol=1e-4)
    composed = analytic_gaussian_epsilon(1.0, delta, sensitivity=float(np.sqrt(np.sum((r / s) ** 2))))
    assert ldp["composed_epsilon"] == pytest.approx(composed, rel=1e-4)
    assert ldp["formal"] is True and ldp["composed_epsilon"] >= ldp["max_feature_epsilon"]
    wrong = [analytic_gaussian_epsilon(float(s[i]), delta, sensitivity=float(r[i]) / 2) for i in range(len(r))]
    assert not np.allclose(ldp["per_feature_epsilon"], wrong, rtol=1e-2)


def test_constant_features_cost_nothing_and_get_no_noise():
    meta = {"lambda": 1.0, "metrics": {}}
    one = np.ones(3, np.float32)
    c = Cloak(
        mu=0 * one,
        sigma=np.array([1.0, 0.0, 2.0], np.float32),
        lo=0 * one,
        hi=np.array([1, 0, 1], np.float32),
        meta=meta,
    )
    ldp = local_dp_reading(c, 1e-5)
    assert ldp["n_features"] == 2 and ldp["per_feature_epsilon"][1] == 0.0


def test_checkpoint_round_trip_without_pickle(tiny_cloaks, tmp_path):
    c = tiny_cloaks[LAMBDAS[1]]
    out = save_cloak(tmp_path / "c", c)
    assert sorted(p.name for p in out.iterdir()) == sorted([CLOAK_FILE, CLOAK_TENSORS, ".dpaudit-manifest.json"])
    for p in out.iterdir():
        assert not p.read_bytes().startswith(b"\x80")  # no pickle protocol header anywhere
    back = load_cloak(out)
    for k in ("mu", "sigma", "lo", "hi"):
        assert np.array_equal(getattr(back, k), getattr(c, k))
    assert back.meta == json.loads(json.dumps(c.meta))
    x = np.zeros((3, *c.mu.shape), np.float32)
    assert np.array_equal(apply_cloak(back, x, seed=0), apply_cloak(c, x, seed=0))
    with pytest.raises(InputError, match="already exists"):
        save_cloak(out, c)
    (out / CLOAK_TENSORS).write_bytes(b"junk")
    with pytest.raises(CheckpointError):
        load_cloak(out)
    with pytest.raises(CheckpointError, match="not a cloak"):
        load_cloak(tmp_path)


def test_bad_input_is_an_input_error(tiny_target_dir, tmp_path):
    with pytest.raises(InputError, match="--target"):
        train_cloak_sweep(None, [1.0], out=tmp_path / "a")
    with pytest.raises(InputError, match="no such run"):
        train_cloak_sweep(tmp_path / "missing", [1.0], out=tmp_path / "b")
    (tmp_path / "notarun").mkdir()
    with pytest.raises(InputError, match="not a dpaudit run"):
        train_cloak_sweep(tmp_path / "notarun", [1.0], out=tmp_path / "c")
    for bad in (["0"], ["-1"], ["1,x"], ["1,1"], []):
        with pytest.raises(InputError):
            parse_lambdas(bad)
    with pytest.raises(InputError, match="lambda"):
        train_cloak_sweep(tiny_target_dir, [0.0], out=tmp_path / "d")
    assert parse_lambdas(["1,0.5", "2"]) == (1.0, 0.5, 2.0)


def invoke(*args):
    from dpaudit.cli.main import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_sweep_inspect_and_errors(tiny_target_dir, tmp_path):
    out = tmp_path / "sweep"
    r = invoke(
        "--json",
        "train",
        "--algo",
        "cloak",
        "--target",
        tiny_target_dir,
        "--lambda",
        "0.3,100",
        "--epochs",
        "3",
        "--out",
        out,
    )
    assert r.exit_code == 0, r.output
    rows = json.loads((out / "curve.json").read_text())["rows"]
    assert [row["lambda"] for row in rows] == [0.3, 100.0]
    assert (out / "curve.csv").read_text().splitlines()[0].startswith("lambda,suppression_ratio")
    r = invoke("--json", "inspect", out / "lambda_0.3")
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["lambda"] == 0.3 and {"suppression_ratio", "accuracy_loss"} <= set(s)
    assert s["suppression_ratio"] == rows[0]["suppression_ratio"]
    for args in (
        ["--lambda", "0"],
        ["--lambda", "-2"],
        [],
    ):
        r = invoke("train", "--algo", "cloak", "--target", tiny_target_dir, *args, "--out", tmp_path / "x")
        assert r.exit_code == 2 and "Traceback" not in r.output
    r = invoke("train", "--algo", "cloak", "--lambda", "1", "--out", tmp_path / "y")
    assert r.exit_code == 2 and "--target" in r.output
    r = invoke("train", "--algo", "cloak", "--target", tmp_path / "nope", "--lambda", "1", "--out", tmp_path / "z")
    # one line: the "training 1 cloak(s) …" notice came before the refusal of a --target that is no run
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        f"error: --target {tmp_path / 'nope'}: no such run directory"
    ]
    r = invoke("train", "--target", tiny_target_dir, "--lambda", "1", "--out", tmp_path / "w")
    assert r.exit_code == 2 and "--algo cloak" in r.output
    r = invoke("train", "--algo", "cloak", "--target", tiny_target_dir, "--lambda", "1", "--out", out)
    assert r.exit_code == 2 and "exists" in r.output


def test_report_cloak_option(tiny_cloaks, tmp_path):
    from dpaudit.training.cloak import cloak_option

    assert cloak_option("2") == {"lambda": 2.0}
    path = save_cloak(tmp_path / "c", tiny_cloaks[LAMBDAS[1]])
    assert cloak_option(str(path)) == {"cloak": str(path)}
    for bad in ("0", "-1", "inf", "nope", str(tmp_path)):
        with pytest.raises(InputError):
            cloak_option(bad)


def test_a_target_without_a_test_split_is_refused_in_one_line(tmp_path):
    # The cloak's accuracies are measured on the target's test split; a target trained with --split 0.5,0.5,0,0
    # made `train --algo cloak` end in "internal error: ValueError: attempt to get argmax of an empty sequence".
    target = tmp_path / "target"
    data = ["--data", "synthetic:n=40,d=3,classes=2,seed=0,sep=3", "--model", "logreg", "--epochs", "1"]
    assert (
        invoke("--quiet", "train", *data, "--batch-size", "8", "--split", "0.5,0.5,0,0", "--out", target).exit_code == 0
    )
    r = invoke(
        "train", "--algo", "cloak", "--target", target, "--lambda", "1", "--epochs", "1", "--out", tmp_path / "c"
    )
    assert r.exit_code == 2 and "the run's test split is empty" in r.output, r.output
    assert not (tmp_path / "c").exists()


def test_local_dp_reading_uses_the_exact_range_not_its_float32_rounding():
    """The sensitivity of a clipped feature is hi - lo exactly (both float32, so the difference is exact in
    float64). float32(hi - lo) rounds it down here (1.0 - (-2^-24) = 1 + 2^-24, a tie rounded to 1.0), which
    under-reported mu and epsilon; a privacy claim is never rounded down (seed "Cloak: Noisy Representation":
    the release is x + r with r ~ N(mu, sigma^2), here on x clipped to [lo, hi])."""
    lo = np.array([-(2.0**-24)], np.float32)
    hi = np.array([1.0], np.float32)
    assert float(hi[0] - lo[0]) < float(hi[0]) - float(lo[0])  # the float32 rounding this guards against
    c = Cloak(mu=0 * hi, sigma=np.array([0.5], np.float32), lo=lo, hi=hi, meta={"lambda": 1.0, "metrics": {}})
    exact_mu = (float(hi[0]) - float(lo[0])) / 0.5
    assert local_dp_reading(c, 1e-5)["composed_mu"] >= exact_mu


def test_the_decoder_is_fitted_on_the_records_the_cloak_releases_clipped_as_the_victims_are():
    """The cloak releases clip(x, lo, hi) + r (seed "Cloak: Noisy Representation": x + r, on x clipped to the
    training bounds). The leakage decoder was fitted on (release, unclipped aux record) pairs but scored against
    the clipped victims' records: with a cloak of almost no noise (sigma = 1e-3 of a unit range) and records
    uniform on [-1, 2] (a third outside the bounds on each side), the relative error read 0.72 where the release
    gives the clipped record away. Fitted and scored on clipped records, the decoder's error is the noise's
    variance, 1e-6 (relative ~5e-6 against the mean predictor's ~0.2), bounded here by 1e-4; the mean predictor
    is the clipped aux mean. Planted (the aux records left unclipped): 0.72 > 1e-4."""
    from attacks.cloak import cloak_leakage

    rng = np.random.default_rng(0)
    lo, hi = np.zeros(3, np.float32), np.ones(3, np.float32)
    c = Cloak(mu=0 * hi, sigma=np.full(3, 1e-3, np.float32), lo=lo, hi=hi,
              meta={"lambda": 1.0, "metrics": {"suppression_threshold": 1.0}, "config": {"delta": 1e-5}})  # fmt: skip
    X_aux, X_eval = rng.uniform(-1, 2, (400, 3)), rng.uniform(-1, 2, (200, 3))
    rec = cloak_leakage(c, X_aux, X_eval, feature=0).reconstruction
    assert rec["relative_error"] < 1e-4 and rec["mse_cloaked"] < 4e-6, rec
    clipped_aux = np.clip(X_aux.astype(np.float32), 0, 1).astype(np.float64)
    clipped_eval = np.clip(X_eval.astype(np.float32), 0, 1).astype(np.float64)
    baseline = float(np.mean((clipped_eval - clipped_aux.mean(axis=0)) ** 2))
    assert rec["mse_mean_baseline"] == pytest.approx(baseline, rel=1e-12)


def test_cloak_target_loads_the_recorded_run_or_the_given_one_and_refuses_other_weights(
    tiny_cloaks, tiny_target_dir, tmp_path, monkeypatch
):
    """cloak_target (library API; no command calls it): the recorded --target as given (a relative one from the
    folder the cloak was trained in), or ``target`` instead; a run whose weights' sha256 is not the recorded one is
    refused in one line."""
    import dataclasses
    import hashlib
    import shutil
    from pathlib import Path

    from dpaudit.checkpoint import WEIGHTS_FILE
    from dpaudit.training.cloak import cloak_target

    c = tiny_cloaks[LAMBDAS[1]]
    recorded = c.meta["target"]
    assert Path(cloak_target(c).path) == Path(recorded["path"])
    assert hashlib.sha256((tiny_target_dir / WEIGHTS_FILE).read_bytes()).hexdigest() == recorded["weights_sha256"]
    copy = shutil.copytree(tiny_target_dir, tmp_path / "copy")
    assert Path(cloak_target(c, copy).path) == copy  # the given target, not the recorded one
    monkeypatch.chdir(tiny_target_dir.parent)
    relative = dataclasses.replace(c, meta={**c.meta, "target": {**recorded, "path": tiny_target_dir.name}})
    assert Path(cloak_target(relative).path).resolve() == tiny_target_dir.resolve()
    other = dataclasses.replace(c, meta={**c.meta, "target": {**recorded, "weights_sha256": "0" * 64}})
    with pytest.raises(InputError, match=r"not the model this cloak was trained for \(weights hash differs\)"):
        cloak_target(other, copy)
