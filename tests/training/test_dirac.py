"""White-box Dirac gradient canaries: the wire from the trainer's updates to the one-run audit.

The planted mistake these tests guard against is the demo's: noise divided by the batch size while
the claim is computed for the intended σ. A one-run audit of 500 white-box canaries must call that
a violation, and must not call the correct trainer one, for several seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpaudit.audit import audit_scores
from dpaudit.checkpoint import load_run
from dpaudit.data import load_dataset, make_splits
from dpaudit.errors import CheckpointError, InputError
from dpaudit.models import build_model, default_spec
from dpaudit.training.config import DPConfig, TrainConfig
from dpaudit.training.dirac import DiracCanaries, _loop_energy, low_energy_coordinates
from dpaudit.training.dpsgd import DPSGDTrainer
from dpaudit.training.run import train_run
from dpaudit.workflows import audit_checkpoint


class NoiseOverB(DPSGDTrainer):
    """The planted bug: noise std σC/B on the sum (so σC/B² on the average), claim for σ."""

    def noise_std(self, setting, clip):
        return setting.noise_multiplier * clip / self.config.batch_size


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return ds, make_splits(len(ds), 0)


def _config(eps: float, seed: int, epochs: int = 4) -> TrainConfig:
    return TrainConfig(
        algo="dpsgd", epochs=epochs, batch_size=128, lr=1.0, seed=seed,
        dp=DPConfig(clip=1.0, target_epsilon=eps, delta=1e-5),
    )  # fmt: skip


def _audit(ds, splits, config, trainer, seed, m=500):
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    wb = DiracCanaries(m=m, seed=seed)
    from dpaudit.training.run import fit_model

    fitted = fit_model(ds, splits.members, spec, config, preprocessing_idx=splits.aux, trainer=trainer, whitebox=wb)
    claim = fitted.outcome.privacy["epsilon"]
    return audit_scores(
        fitted.whitebox_scores, wb.included_, method="one-run", design="canaries", claimed_epsilon=claim, seed=seed
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_noise_bug_is_a_violation_and_the_correct_trainer_is_not(digits, seed):
    ds, splits = digits
    config = _config(2.0, seed)
    bug = _audit(ds, splits, config, NoiseOverB(config), seed)
    ok = _audit(ds, splits, config, None, seed)
    assert bug.formal and ok.formal
    assert bug.verdict == "violation", bug
    assert bug.epsilon_lower_bound > 3.0
    assert ok.verdict != "violation"
    assert ok.epsilon_lower_bound <= 2.0


def test_included_canaries_score_higher_without_noise(digits):
    # σ = 0: o_t is exactly the canary's contribution (1 when drawn) plus the data's (tiny at low-energy
    # coordinates), so a score counts the canary's draws: 0 for every excluded canary.
    ds, splits = digits
    config = TrainConfig(
        algo="dpsgd", epochs=2, batch_size=128, lr=0.5, seed=0, dp=DPConfig(clip=1.0, noise_multiplier=0.0)
    )
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    wb = DiracCanaries(m=100, seed=3)
    from dpaudit.training.run import fit_model

    fitted = fit_model(ds, splits.members, spec, config, preprocessing_idx=splits.aux, whitebox=wb)
    s, inc = fitted.whitebox_scores, wb.included_
    assert inc.sum() > 20 and (~inc).sum() > 20
    steps = config.num_steps(len(splits.members))
    q = 128 / len(splits.members)
    # E[draws of an included canary] = q·steps; its score is ≈ its number of draws (σ = 0 sums o_t).
    assert abs(s[inc].mean() - q * steps) < 0.25 * q * steps
    # Each score is an integer count of draws plus the data's tiny gradient at the coordinate.
    assert np.abs(s - np.round(s)).max() < 0.01
    assert np.all(np.round(s[~inc]) == 0)
    assert np.all(np.round(s[inc]) >= 0)


def test_coordinates_come_from_the_data_not_the_coins(digits):
    ds, splits = digits
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    model = build_model(spec, seed=0)
    X = torch.as_tensor(ds.X[splits.members], dtype=torch.float32)
    y = torch.as_tensor(ds.y[splits.members])
    a = low_energy_coordinates(model, X, y, 50)
    assert len(np.unique(a)) == 50
    assert np.array_equal(a, low_energy_coordinates(model, X, y, 50))
    # Different inclusion seeds draw different coins but cannot move the coordinates (chosen from data).
    assert not np.array_equal(DiracCanaries(m=50, seed=0).included_, DiracCanaries(m=50, seed=1).included_)
    with pytest.raises(InputError, match="parameters"):
        low_energy_coordinates(model, X, y, 10**7)


def test_checkpoint_round_trip_feeds_audit_checkpoint(digits, tmp_path):
    ds, splits = digits
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    config = _config(2.0, 0, epochs=1)
    train_run(ds, spec, config, out=tmp_path / "r", splits=splits, whitebox=DiracCanaries(m=64, seed=5))
    run = load_run(tmp_path / "r")
    scores, included = run.whitebox_canaries()
    assert scores.shape == (64,) and included.dtype == bool
    assert np.array_equal(included, DiracCanaries(m=64, seed=5).included_)
    audit = audit_checkpoint(tmp_path / "r", attacks=())
    record = audit.audits[0]  # the (ε, δ) one-run audit (the f-DP one beside it: see below)
    assert record.attack == "whitebox-canaries" and record.formal and record.result.method == "one-run"
    assert record.result.claimed_epsilon == pytest.approx(run.privacy["epsilon"])
    np.savez(tmp_path / "r" / "whitebox_canaries.npz", scores=scores[:10], included=included[:10])
    with pytest.raises(CheckpointError, match="changed since the run was written"):  # the manifest's sha256
        load_run(tmp_path / "r").whitebox_canaries()
    (tmp_path / "r" / ".dpaudit-manifest.json").unlink()  # a run written before manifests: the shapes are checked
    with pytest.raises(CheckpointError, match="white-box canary"):
        load_run(tmp_path / "r").whitebox_canaries()
    # Coins that all came up "out" (probability 2^(1-m)): one line naming why and what to do, not "member has a
    # single class".
    np.savez(tmp_path / "r" / "whitebox_canaries.npz", scores=scores, included=np.zeros(64, bool))
    with pytest.raises(InputError, match=r"white-box canaries: 0 of 64 canaries are included.*--canary-seed"):
        audit_checkpoint(tmp_path / "r", attacks=())


def test_non_private_and_shuffled_training_are_refused(digits):
    ds, splits = digits
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    from dpaudit.training.run import fit_model

    with pytest.raises(InputError, match="DP-SGD"):
        fit_model(ds, splits.members, spec, TrainConfig(algo="sgd", epochs=1), whitebox=DiracCanaries(m=5, seed=0))
    shuffled = TrainConfig(algo="dpsgd", epochs=1, batch_size=64, dp=DPConfig(noise_multiplier=1.0, sampling="shuffle"))
    with pytest.raises(InputError, match="Poisson"):
        fit_model(ds, splits.members, spec, shuffled, whitebox=DiracCanaries(m=5, seed=0))


def test_checkpoint_audit_adds_the_claims_own_fdp_curve(digits, tmp_path):
    """The wire from a run's claim (q, T) to the one-run f-DP audit: a formal record against DP-SGD's
    curves at the claim's q and T, beside the (ε, δ) one; none for a shuffled claim or a user's own ε."""
    from dpaudit.workflows.checkpoint import claim_tradeoff

    ds, splits = digits
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    config = _config(2.0, 0, epochs=1)
    train_run(ds, spec, config, out=tmp_path / "r", splits=splits, whitebox=DiracCanaries(m=64, seed=5))
    privacy = load_run(tmp_path / "r").privacy
    curve = claim_tradeoff(privacy)
    assert curve.name == f"dpsgd(q={privacy['sample_rate']:.4g}, T={privacy['steps']})"
    assert curve.claim_curve == "DP-SGD" and not curve.formal  # a curve refutation, its epsilon an estimate
    audit = audit_checkpoint(tmp_path / "r", attacks=())
    methods = [(a.attack, a.result.method, a.formal) for a in audit.audits]
    assert methods == [("whitebox-canaries", "one-run", True), ("whitebox-canaries", "one-run-fdp", False)]
    # Either test alone refutes the claim (a violation or a refuted curve): Bonferroni, α/2 each.
    assert [a.result.confidence for a in audit.audits] == pytest.approx([1 - 0.05 / 2] * 2, rel=1e-12)
    assert audit.audits[1].result.refutation["curve"] == "DP-SGD"
    assert curve.name in audit.audits[1].description
    assert claim_tradeoff({**privacy, "sampling": "shuffle"}) is None
    assert claim_tradeoff({**privacy, "jl_projections": 4}) is None
    (alone,) = audit_checkpoint(tmp_path / "r", attacks=(), claimed_epsilon=3.0).audits
    assert alone.result.confidence == 0.95  # one formal test: the full level


def test_cli_tradeoff_option(tmp_path):
    from typer.testing import CliRunner

    from dpaudit.cli.main import app

    rng = np.random.default_rng(0)
    member = rng.random(200) < 0.5
    path = tmp_path / "s.csv"
    path.write_text("member,score\n" + "".join(f"{int(m)},{float(m) * 5 + rng.normal()}\n" for m in member))
    base = ["audit", "scores", str(path), "--design", "canaries", "--method", "one-run-fdp", "--json"]
    ok = CliRunner().invoke(app, [*base, "--tradeoff", "epsilon-delta"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(app, [*base, "--tradeoff", "dpsgd:0.1"])
    assert bad.exit_code == 2 and "dpsgd:Q,T" in bad.output


class DataDependentBranch(torch.nn.Module):
    """A user's model with a Python branch on a tensor value (``.item()``): vmap cannot run it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.h = torch.nn.Linear(6, 8), torch.nn.Linear(8, 2)

    def forward(self, x):
        h = self.a(x)
        if h.abs().max().item() > 1e6:
            h = h / 1e6
        return self.h(torch.tanh(h))


def test_low_energy_coordinates_without_vmap_match_and_train():
    # The coordinates were chosen by a vmap over the model only: a model vmap cannot run (here a branch on
    # .item(); also dropout in training mode) crashed white-box canary training that the clipping itself
    # runs (by the loop). The fallback, one example at a time, picks the coordinates vmap picks.
    torch.manual_seed(0)
    model = DataDependentBranch().double()
    X, y = torch.randn(40, 6, dtype=torch.float64), torch.randint(0, 2, (40,))
    X[:, 2] = 0.0  # a constant feature: its first-layer weights have zero gradient energy
    plain = torch.nn.Sequential(model.a, torch.nn.Tanh(), model.h)  # the same function, vmap-able
    expected = low_energy_coordinates(plain, X, y, 8)
    np.testing.assert_array_equal(low_energy_coordinates(model, X, y, 8), expected)
    assert set(expected) == {2 + 6 * i for i in range(8)}  # column 2 of the 8 x 6 weight
    # The energies themselves, against per-example gradients by torch.func on the vmap-able twin.
    from torch.func import functional_call, grad, vmap

    def loss(p, xi, yi):
        return torch.nn.functional.cross_entropy(functional_call(plain, p, (xi[None],)), yi[None])

    g = vmap(grad(loss), in_dims=(None, 0, 0))(dict(plain.named_parameters()), X, y)
    oracle = torch.cat([v.square().sum(0).reshape(-1) for v in g.values()])
    got = _loop_energy(model, X, y, list(model.parameters()))
    torch.testing.assert_close(got, oracle, rtol=1e-12, atol=0.0)
    config = TrainConfig(algo="dpsgd", epochs=1, batch_size=8, lr=0.1, dp=DPConfig(noise_multiplier=1.0))
    _, scores = DPSGDTrainer(config).fit_with_canary(model, X, y, DiracCanaries(m=4, seed=0))
    assert scores.shape == (4,) and np.all(np.isfinite(scores))
