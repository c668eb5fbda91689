"""DP-SGD / DP-Adam: noise, sampling, determinism, the recorded privacy claim, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from typer.testing import CliRunner

from dpaudit.errors import InputError, UnreachableTargetError
from dpaudit.models import build_model, default_spec
from dpaudit.training import dpsgd
from dpaudit.training.algorithms import get_trainer
from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig
from dpaudit.training.dpsgd import PrivacySetting, poisson_sampler, set_private_gradients

ALPHA = 1e-3  # level of every statistical test (all at fixed seeds, so deterministic)


def _config(algo: str = "dpsgd", *, steps: int = 5, batch_size: int = 16, lr: float = 1.0, seed: int = 0, **dp):
    dp.setdefault("noise_multiplier", 1.0)
    return TrainConfig(algo=algo, steps=steps, batch_size=batch_size, lr=lr, seed=seed, dp=DPConfig(**dp))


def _logreg(d: int = 8, classes: int = 4, seed: int = 0):
    return build_model(default_spec("logreg", input_shape=(d,), n_classes=classes), seed=seed, dtype=torch.float64)


def _data(n: int, d: int = 8, classes: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), torch.randint(0, classes, (n,), generator=g)


def _fit(config: TrainConfig, model, X, y, perf: PerfConfig | None = None):
    return get_trainer(config.algo)(config, perf).fit(model, X, y)


def _weights_bytes(model) -> bytes:
    return b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())


# --- noise ------------------------------------------------------------------------------------


def _chi2_variance_test(z: np.ndarray, std: float) -> bool:
    """Two-sided χ² test of H0: z_i iid N(0, std²) (Σ z²/std² ~ χ²_k); True when H0 is kept."""
    s = float(np.sum((z / std) ** 2))
    k = z.size
    return stats.chi2.ppf(ALPHA / 2, k) < s < stats.chi2.ppf(1 - ALPHA / 2, k)


def _noise_only_update(noise_multiplier: float, *, clip: float, batch_size: int, steps: int) -> np.ndarray:
    """Weight change of DP-SGD on all-zero inputs: the logistic-regression weight gradient is
    (p - onehot) xᵀ = 0, so only the noise moves the weights: Δw = -lr Σ_t noise_t / B."""
    d, classes = 64, 10  # 640 weight coordinates
    model = _logreg(d, classes)
    w0 = model[1].weight.detach().clone()
    X, y = torch.zeros(200, d, dtype=torch.float64), torch.arange(200) % classes
    config = _config(steps=steps, batch_size=batch_size, lr=1.0, clip=clip, noise_multiplier=noise_multiplier, seed=0)
    _fit(config, model, X, y)
    return (model[1].weight.detach() - w0).numpy().ravel()


def test_noise_std_is_sigma_c_over_b_and_half_noise_fails():
    sigma, clip, B, T = 1.3, 0.7, 16, 4
    expected = math.sqrt(T) * sigma * clip / B  # T independent steps of std σC/B each
    assert _chi2_variance_test(_noise_only_update(sigma, clip=clip, batch_size=B, steps=T), expected)
    # The same test has power: half the noise (what dividing by 2B, or σ/2, would give) is rejected.
    assert not _chi2_variance_test(_noise_only_update(sigma / 2, clip=clip, batch_size=B, steps=T), expected)
    # And noise σ instead of σC (a missing clip factor, here C = 0.7) would be rejected too.
    assert not _chi2_variance_test(_noise_only_update(sigma, clip=clip, batch_size=B, steps=T), expected / clip)


def test_empty_batch_is_a_noise_only_step():
    model = _logreg()
    clipper = dpsgd.make_clipper(model, "ghost")
    gen = torch.Generator().manual_seed(0)
    X, y = _data(10)
    set_private_gradients(
        clipper,
        X,
        y,
        torch.empty(0, dtype=torch.int64),
        clip=1.0,
        noise_std=2.0,
        batch_size=4,
        max_physical_batch=None,
        generator=gen,
    )
    n = sum(p.numel() for p in clipper.params)
    flat = torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = torch.cat([p.grad.ravel() for p in clipper.params])
    torch.testing.assert_close(expected, flat * 2.0 / 4, rtol=0, atol=0)


def test_physical_batches_do_not_change_the_result():
    X, y = _data(60)
    out = []
    for chunk in (None, 7):
        model = _logreg()
        _fit(_config(steps=6, batch_size=20, clip=0.3), model, X, y, PerfConfig(max_physical_batch=chunk))
        out.append(torch.cat([p.detach().ravel() for p in model.parameters()]))
    torch.testing.assert_close(out[0], out[1], rtol=1e-12, atol=1e-12)


# --- sampling ---------------------------------------------------------------------------------


def _binomial_gof(sizes: np.ndarray, n: int, q: float) -> float:
    """p-value of a χ² goodness-of-fit test of ``sizes`` against Binomial(n, q), with the tails
    merged so every expected count is at least 5."""
    k = np.arange(n + 1)
    expected = stats.binom.pmf(k, n, q) * len(sizes)
    observed = np.bincount(sizes, minlength=n + 1)[: n + 1].astype(float)
    lo = int(np.argmax(np.cumsum(expected) >= 5))
    hi = n - int(np.argmax(np.cumsum(expected[::-1]) >= 5))
    e = np.concatenate([[expected[: lo + 1].sum()], expected[lo + 1 : hi], [expected[hi:].sum()]])
    o = np.concatenate([[observed[: lo + 1].sum()], observed[lo + 1 : hi], [observed[hi:].sum()]])
    return float(stats.chisquare(o, e).pvalue)


def test_poisson_batch_sizes_are_binomial():
    n, q, draws = 200, 0.05, 4000
    sample = poisson_sampler(n, q, torch.Generator().manual_seed(7))
    batches = [sample() for _ in range(draws)]
    sizes = np.array([len(b) for b in batches])
    assert _binomial_gof(sizes, n, q) > ALPHA
    assert _binomial_gof(sizes, n, 1.1 * q) < ALPHA  # the test can tell a 10% wrong rate
    # Each record is included independently with probability q: inclusion counts ~ Binomial(draws, q).
    counts = np.bincount(torch.cat(batches).numpy(), minlength=n)
    z = (counts - draws * q) / math.sqrt(draws * q * (1 - q))
    assert _chi2_variance_test(z, 1.0)
    assert all(len(torch.unique(b)) == len(b) for b in batches)  # without replacement


class _Spy:
    """Replaces make_clipper in the trainer by one that records the examples of each call."""

    def __init__(self, monkeypatch):
        self.batches: list[torch.Tensor] = []
        real = dpsgd.make_clipper
        spy = self

        class Recording:
            def __init__(self, inner):
                self.inner, self.params = inner, inner.params

            def __call__(self, x, y, clip):
                spy.batches.append(x[:, 0].detach().clone())
                return self.inner(x, y, clip)

        monkeypatch.setattr(dpsgd, "make_clipper", lambda model, method="auto": Recording(real(model, method)))


def test_trainer_batches_are_exactly_the_seeded_poisson_sample(monkeypatch):
    spy = _Spy(monkeypatch)
    n, B, T = 50, 5, 150
    X = torch.arange(n, dtype=torch.float64)[:, None].repeat(1, 8)  # feature 0 = record id
    y = torch.arange(n) % 4
    _fit(_config(steps=T, batch_size=B, seed=11, lr=1e-9), _logreg(), X, y)
    replay = poisson_sampler(n, B / n, torch.Generator().manual_seed(11 + 1))
    seen = [b.long() for b in spy.batches if len(b)]
    expected = [idx for idx in (replay() for _ in range(T)) if len(idx)]
    assert len(seen) == len(expected) and all(torch.equal(a, b) for a, b in zip(seen, expected, strict=True))
    sizes = np.array([len(replay()) for _ in range(3000)])
    assert _binomial_gof(sizes, n, B / n) > ALPHA


def test_shuffle_uses_every_record_once_per_epoch(monkeypatch):
    spy = _Spy(monkeypatch)
    n, B = 23, 5  # 5 steps per epoch, the last with 3 records
    X = torch.arange(n, dtype=torch.float64)[:, None].repeat(1, 8)
    y = torch.arange(n) % 4
    out = _fit(_config(steps=12, batch_size=B, sampling="shuffle", lr=1e-9), _logreg(), X, y)
    sizes = [len(b) for b in spy.batches]
    assert sizes == [5, 5, 5, 5, 3] * 2 + [5, 5]
    for e in range(2):
        epoch = torch.cat(spy.batches[5 * e : 5 * e + 5]).long()
        assert sorted(epoch.tolist()) == list(range(n))
    assert out.privacy["event"]["count"] == 3  # epochs touched: 12 steps at 5 per epoch


# --- determinism --------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["dpsgd", "dpadam"])
def test_same_seed_same_bytes(algo):
    X, y = _data(64)
    runs = []
    for seed in (5, 5, 6):
        model = _logreg(seed=seed)
        _fit(_config(algo, steps=8, batch_size=8, lr=0.1, seed=seed, clip=0.5), model, X, y)
        runs.append(_weights_bytes(model))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_fit_model_is_bit_reproducible_end_to_end(cpu_only):
    from dpaudit.data import load_dataset, make_splits
    from dpaudit.training.run import fit_model

    ds = load_dataset("digits")
    members = make_splits(len(ds), 0).members
    spec = default_spec("mlp", input_shape=ds.feature_shape, n_classes=ds.n_classes)
    config = TrainConfig(algo="dpadam", steps=6, batch_size=32, lr=0.01, dp=DPConfig(noise_multiplier=1.0))
    a, b = (_weights_bytes(fit_model(ds, members, spec, config).model) for _ in range(2))
    assert a == b


def test_secure_noise_is_not_reproducible_and_is_recorded():
    X, y = _data(64)
    runs = []
    for _ in range(2):
        model = _logreg()
        out = _fit(_config(steps=3, batch_size=8, secure_noise=True), model, X, y)
        runs.append(_weights_bytes(model))
    assert runs[0] != runs[1]
    assert out.privacy["secure_noise"] is True


# --- the privacy claim ----------------------------------------------------------------------------

CLAIM_KEYS = {
    "epsilon",
    "delta",
    "accountant",
    "neighbouring",
    "event",
    "noise_multiplier",
    "sample_rate",
    "steps",
    "clip",
    "batch_size",
    "dataset_size",
    "sampling",
    "analysis",
    "secure_noise",
}


@pytest.mark.parametrize("accountant", ["rdp", pytest.param("pld", marks=pytest.mark.slow)])
def test_claim_is_the_accountants_epsilon_for_the_dpsgd_event(accountant):
    from dpaudit.accounting import dpsgd_event, epsilon_for
    from dpaudit.events import event_from_dict

    X, y = _data(100)
    out = _fit(
        _config(steps=30, batch_size=10, noise_multiplier=1.1, delta=1e-5, accountant=accountant), _logreg(), X, y
    )
    claim = out.privacy
    assert set(claim) == CLAIM_KEYS
    json.dumps(claim)  # JSON-ready
    event = dpsgd_event(noise_multiplier=1.1, sample_rate=0.1, steps=30)
    assert claim["event"] == event.to_dict()
    assert claim["epsilon"] == epsilon_for(event, 1e-5, accountant)
    assert claim["epsilon"] == epsilon_for(event_from_dict(claim["event"]), 1e-5, accountant)  # recomputable
    assert (claim["neighbouring"], claim["sampling"], claim["sample_rate"]) == ("add_remove", "poisson", 0.1)
    assert "Poisson" in claim["analysis"]
    assert 0 < claim["epsilon"] < math.inf


def test_shuffle_claim_is_one_gaussian_of_sensitivity_2c_per_epoch():
    from dpaudit.accounting import epsilon_for
    from dpaudit.events import Gaussian, SelfComposed

    X, y = _data(100)
    out = _fit(_config(steps=25, batch_size=10, noise_multiplier=3.0, sampling="shuffle"), _logreg(), X, y)
    claim = out.privacy
    assert claim["neighbouring"] == "replace_one" and "Chua et al. 2024" in claim["analysis"]
    assert claim["event"] == SelfComposed(Gaussian(3.0), 3).to_dict()  # 25 steps = 3 epochs touched
    # Pin the meaning: replace-one on Gaussian(σ) is a Gaussian of sensitivity 2C, i.e. σ/2 under
    # add/remove. (Writing σ/2 in the event too would count the factor 2 twice.)
    assert claim["epsilon"] == pytest.approx(
        epsilon_for(SelfComposed(Gaussian(1.5), 3), 1e-5, "rdp", neighbouring="add_remove"), rel=1e-9
    )


def test_no_noise_means_no_privacy():
    X, y = _data(40)
    out = _fit(_config(steps=2, batch_size=8, noise_multiplier=0.0), _logreg(), X, y)
    assert out.privacy["epsilon"] == math.inf


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_calibrated_noise_meets_the_target(sampling):
    from dpaudit.accounting import epsilon_for

    X, y = _data(100)
    out = _fit(
        _config(steps=20, batch_size=10, noise_multiplier=None, target_epsilon=3.0, sampling=sampling),
        _logreg(),
        X,
        y,
    )
    claim = out.privacy
    assert claim["epsilon"] <= 3.0 and claim["epsilon"] == pytest.approx(3.0, rel=1e-2)
    setting = PrivacySetting(claim["noise_multiplier"], 10, 100, 20, sampling)
    assert epsilon_for(setting.event(), 1e-5, "rdp", neighbouring=setting.neighbouring) == claim["epsilon"]


def test_calibration_is_asked_once_per_question(monkeypatch):
    """dpsgd.calibrate remembers its answers (a reference-model recipe asks the same question once per model):
    the same setting, target, δ and accountant are calibrated once; any one of them changed is a new question."""
    asked = []

    def root_finder(*, target_epsilon, delta, make_event, accountant, neighbouring, **options):
        asked.append((make_event(1.0), target_epsilon, delta, accountant, neighbouring))
        return 1.0 + len(asked)  # a new answer for every question actually asked

    monkeypatch.setattr(dpsgd, "calibrate_noise_multiplier", root_finder)
    setting = PrivacySetting(0.0, 10, 100, 20, "poisson")
    dp = DPConfig(target_epsilon=3.0)
    first = dpsgd.calibrate(setting, dp)
    assert dpsgd.calibrate(setting, DPConfig(target_epsilon=3.0, clip=2.0)) == first and len(asked) == 1
    others = [
        (PrivacySetting(0.0, 10, 100, 21, "poisson"), dp),
        (PrivacySetting(0.0, 10, 100, 20, "shuffle"), DPConfig(target_epsilon=3.0, sampling="shuffle")),
        (setting, DPConfig(target_epsilon=3.5)),
        (setting, DPConfig(target_epsilon=3.0, delta=1e-6)),
        (setting, DPConfig(target_epsilon=3.0, accountant="pld")),
    ]
    answers = [dpsgd.calibrate(s, d) for s, d in others]
    assert len(asked) == 6 and len({first, *answers}) == 6


# --- bad input --------------------------------------------------------------------------------------


def test_bad_inputs_raise_input_error():
    X, y = _data(20)
    with pytest.raises(InputError, match="larger than the training set"):
        _fit(_config(batch_size=21), _logreg(), X, y)
    with pytest.raises(InputError, match="clip > 0"):
        _config(clip=0.0)
    with pytest.raises(InputError, match="noise_multiplier >= 0"):
        _config(noise_multiplier=-1.0)
    with pytest.raises(UnreachableTargetError, match="unreachable for 5 steps"):
        _fit(_config(noise_multiplier=None, target_epsilon=1e-9, sampling="shuffle"), _logreg(), X, y)
    bn = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 4)).double()
    with pytest.raises(InputError, match="BatchNorm"):
        _fit(_config(), bn, X, y)


@pytest.mark.parametrize("algo", ["sgd", "dpsgd", "dpadam"])
def test_training_that_diverges_is_refused(algo):
    """A user's forward that overflows (inf logits: NaN loss and gradients) left every weight NaN: per-sample
    clipping passes a NaN gradient on (‖g‖ = NaN gives a NaN factor), and the NaN model was saved with exit 0,
    its accuracy (argmax of NaN: class 0) and, under DP-SGD, its claim. Now one line, before anything is saved."""
    from dpaudit.data import load_dataset
    from dpaudit.models import PythonSpec
    from dpaudit.training.run import fit_model

    ds = load_dataset("synthetic:n=80,d=4,classes=2,seed=0")
    spec = PythonSpec(input_shape=(4,), n_classes=2, factory="tests.core.byo_models:overflows",
                      kwargs={"d": 4, "n_classes": 2})  # fmt: skip
    dp = DPConfig(noise_multiplier=1.0) if algo != "sgd" else None
    config = TrainConfig(algo=algo, steps=2, batch_size=16, lr=0.1, dp=dp)
    with pytest.raises(
        InputError, match=rf"training diverged: the trained parameter 'lin\.\w+' holds NaN or inf \({algo}"
    ):
        fit_model(ds, np.arange(80), spec, config)


@pytest.mark.parametrize("clipping", ["vmap", "ghost", "loop"])
def test_an_overflowing_per_example_norm_is_refused(clipping):
    """Raw features of 1e20 give finite per-example gradients whose float32 norm overflows (‖g‖² > 3.4e38): the clip
    factor was 1/inf = 0, every example was dropped, and the model (trained on the noise alone) was saved with its
    claim. At 1e15 (no overflow) the same training runs."""
    model = build_model(default_spec("logreg", input_shape=(4,), n_classes=2), seed=0)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 4, generator=g)
    y = (X[:, 0] > 0).long()
    config = _config(steps=2, batch_size=16, lr=0.1)
    perf = PerfConfig(clipping=clipping)
    with pytest.raises(InputError, match=r"a per-example gradient norm overflowed float32"):
        _fit(config, model, X * 1e20, y, perf)
    _fit(config, model, X * 1e15, y, perf)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # torch casts lr and weight decay to the float32 weights' type: exit 3 (internal error) before
        (["--lr", "1e39"], "expected --lr <= 3.403e+38 (the largest float32) in magnitude, got 1e+39"),
        (["--weight-decay", "1e39"], "expected --weight-decay <= 3.403e+38"),
        # a finite but overflowing weight decay: a NaN model saved with exit 0 before
        (["--weight-decay", "1e30"], "training diverged: the trained parameter '1.weight' holds NaN or inf"),
    ],
)
def test_cli_extreme_optimizer_settings_exit_2_and_write_nothing(tmp_path, args, message):
    r = _invoke(*TRAIN, "--algo", "dpsgd", "--noise-multiplier", "1", "--out", tmp_path / "run", *args)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "run").exists()


# --- utility sanity -------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["dpsgd", "dpadam"])
def test_learns_a_separable_problem(algo):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, 8, generator=g, dtype=torch.float64)
    y = (X[:, 0] > 0).long()
    model = _logreg(classes=2)
    lr = 2.0 if algo == "dpsgd" else 0.05
    _fit(_config(algo, steps=60, batch_size=40, lr=lr, noise_multiplier=0.8, clip=1.0), model, X, y)
    assert (model(X).argmax(1) == y).double().mean() > 0.9


# --- CLI ---------------------------------------------------------------------------------------------

runner = CliRunner()
TRAIN = ["train", "--data", "digits", "--model", "logreg", "--steps", "5", "--batch-size", "32"]


def _invoke(*args):
    from dpaudit.cli.main import app

    return runner.invoke(app, [str(a) for a in args])


def test_cli_train_dpsgd_and_inspect(tmp_path):
    out = tmp_path / "run"
    r = _invoke(*TRAIN, "--algo", "dpsgd", "--noise-multiplier", "1.0", "--clip", "0.5", "--out", out, "--json")
    assert r.exit_code == 0, r.output
    assert (out / "checkpoint.json").exists()
    privacy = json.loads((out / "checkpoint.json").read_text())["privacy"]
    assert set(privacy) == CLAIM_KEYS and privacy["clip"] == 0.5
    r = _invoke("--json", "inspect", out)
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["private"] is True and s["algo"] == "dpsgd"
    assert s["epsilon"] == privacy["epsilon"] and s["delta"] == 1e-5 and s["accountant"] == "rdp"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--noise-multiplier", "1", "--clip", "0"], "expected --clip > 0, got 0"),
        (["--noise-multiplier", "-1"], "expected --noise-multiplier >= 0, got -1"),
        (["--noise-multiplier", "1", "--batch-size", "100000"], "larger than the training set"),
        (["--epsilon", "1e-9", "--sampling", "shuffle"], "unreachable for 5 steps"),
        ([], "give exactly one of --noise-multiplier or --epsilon"),
        (["--noise-multiplier", "1", "--sampling", "random"], "unknown --sampling 'random'"),
        (["--noise-multiplier", "1", "--clipping", "fast"], "unknown --clipping 'fast'"),
    ],
)
def test_cli_bad_dp_input_exits_2(tmp_path, args, message):
    r = _invoke(*TRAIN, "--algo", "dpsgd", "--out", tmp_path / "run", *args)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "run").exists()


def test_claim_equals_dpaudit_account(tmp_path):
    from dpaudit.cli.main import COMMAND_MODULES

    if "dpaudit.cli.account" not in COMMAND_MODULES:
        pytest.skip("`dpaudit account` is not registered yet (dpaudit/cli/account.py is being written)")
    out = tmp_path / "run"
    r = _invoke(*TRAIN, "--algo", "dpsgd", "--noise-multiplier", "1.1", "--out", out)
    assert r.exit_code == 0, r.output
    privacy = json.loads((out / "checkpoint.json").read_text())["privacy"]
    r = _invoke(
        "account",
        "dpsgd",
        "--noise-multiplier",
        privacy["noise_multiplier"],
        "--sample-rate",
        privacy["sample_rate"],
        "--steps",
        privacy["steps"],
        "--delta",
        privacy["delta"],
        "--accountant",
        privacy["accountant"],
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["epsilon"] == pytest.approx(privacy["epsilon"], rel=1e-12)
