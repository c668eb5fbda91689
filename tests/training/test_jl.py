"""DP-SGD-JL (dpaudit.training.jl): the JL norm estimator, the clipped sum, the trainer and its claim.

Oracles: exact per-example gradients from VmapClipper (itself tested against a one-example-at-a-time
loop in test_clipping.py), the χ² law of Bu et al. 2021 (arXiv:2102.03013) Prop. 2.1, and the JL
accountant through dpaudit.accounting. Each statistical check is also run on a planted mistake (sum
instead of mean over the projections) to show it bites.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from torch.nn import functional as F

from dpaudit.accounting import dpsgd_event, epsilon_for
from dpaudit.errors import InputError
from dpaudit.models import build_model, default_spec
from dpaudit.training import jl
from dpaudit.training.clipping import LoopClipper, VmapClipper
from dpaudit.training.config import DPConfig, TrainConfig
from dpaudit.training.jl import (
    DPAdamJLTrainer,
    DPSGDJLTrainer,
    JLClipper,
    jl_clipped_sum,
    jl_norm_estimates,
    jl_projection_matrix,
    random_directions,
)

torch.set_num_threads(1)


class FusedLSTMText(nn.Module):
    """Embedding + PyTorch's fused bidirectional nn.LSTM: no forward-mode AD on CPU."""

    def __init__(self, vocab: int = 20) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 4)
        self.lstm = nn.LSTM(4, 5, batch_first=True, bidirectional=True)
        self.head = nn.Linear(10, 2)

    def forward(self, x):
        out, _ = self.lstm(self.emb(x))
        return self.head(out[:, -1])


def zoo(kind: str):
    """(model, x, y) for each model kind (float64 except the fused LSTM), 4 examples."""
    g = torch.Generator().manual_seed(1)
    if kind == "logreg":
        spec, x = default_spec("logreg", input_shape=(6,), n_classes=3), torch.randn(4, 6, generator=g)
    elif kind == "mlp":
        spec, x = default_spec("mlp", input_shape=(6,), n_classes=3, hidden=(8,)), torch.randn(4, 6, generator=g)
    elif kind == "cnn":
        spec = default_spec("cnn", input_shape=(1, 6, 6), n_classes=3, channels=(4,))
        x = torch.randn(4, 1, 6, 6, generator=g)
    elif kind == "rnn":
        spec = default_spec(
            "rnn", input_shape=(5,), n_classes=3, vocab_size=12, bidirectional=True, embed_dim=4, hidden_size=6
        )
        x = torch.randint(0, 12, (4, 5), generator=g)
    else:  # fused nn.LSTM in float32 (oneDNN kernel, no forward AD on CPU): the double-vjp path
        torch.manual_seed(0)
        model = FusedLSTMText()
        return model, torch.randint(0, 20, (4, 6), generator=g), torch.tensor([0, 1, 0, 1])
    model = build_model(spec, seed=0, dtype=torch.float64)
    x = x.double() if x.is_floating_point() else x
    return model, x, torch.tensor([0, 1, 2, 0])


KINDS = ["logreg", "mlp", "cnn", "rnn", "fused-lstm"]


def exact_norms(model, x, y) -> torch.Tensor:
    return LoopClipper(model)(x, y, 1.0).norms  # one example at a time: works for the fused LSTM too


# ------------------------------------------------------------------------------ the estimator's law

K, R = 600, 3  # directions per model; projections per estimate in the M_r test (200 estimates)


def estimator_stats(model, x, y, estimates) -> dict[str, float]:
    """E[M_r²]/‖g‖² (z-score) and the KS p-value of M_r/‖g‖ against sqrt(χ²_r/r), per example.

    ``estimates(P)``: the (B, groups) estimates from a (B, groups, r) projection block.
    """
    norms = exact_norms(model, x, y)
    dirs = random_directions(model, K, torch.Generator().manual_seed(7))
    P = jl_projection_matrix(model, x, y, dirs)  # (B, K)
    M = estimates(P.reshape(P.shape[0], K // R, R))  # (B, K/R)
    rho = (M / norms[:, None]).numpy()
    # E[M_r²] = ‖g‖² (Prop. 2.1); the mean of K/R values of χ²_r/r has sd sqrt(2/r / (K/R)).
    z = (np.mean(rho**2, axis=1) - 1.0) / math.sqrt(2.0 / R / (K // R))
    # M_r/‖g‖ ~ sqrt(χ²_r/r): P(ρ ≤ t) = F_{χ²_r}(r t²).
    ks = [stats.kstest(row, lambda t: stats.chi2.cdf(R * np.square(t), R)).pvalue for row in rho]
    return {"max_abs_z": float(np.max(np.abs(z))), "min_ks_p": float(min(ks))}


def good_estimates(P):
    return jl._norm_estimates(P.reshape(-1, P.shape[-1])).reshape(P.shape[:2])


def wrong_estimates(P):  # planted mistake: sum over the projections instead of the mean
    return P.square().sum(-1).sqrt()


# 4 examples x 5 models = 20 examples: Bonferroni at a 1% family error for the KS p-values, and
# |z| < 4 for the means (two-sided 6e-5 each).
KS_ALPHA, Z_MAX = 0.01 / 20, 4.0


@pytest.mark.parametrize("kind", KINDS)
def test_estimator_law_on_real_gradients(kind):
    model, x, y = zoo(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = estimator_stats(model, x, y, good_estimates)
    assert s["max_abs_z"] < Z_MAX
    assert s["min_ks_p"] > KS_ALPHA


def test_estimator_law_catches_sum_instead_of_mean():
    model, x, y = zoo("mlp")
    s = estimator_stats(model, x, y, wrong_estimates)
    assert s["max_abs_z"] > Z_MAX and s["min_ks_p"] < KS_ALPHA


def test_norm_estimates_are_the_root_mean_square_of_projections():
    model, x, y = zoo("mlp")
    dirs = random_directions(model, 5, torch.Generator().manual_seed(3))
    P = jl_projection_matrix(model, x, y, dirs)
    torch.testing.assert_close(jl_norm_estimates(model, x, y, dirs), P.square().mean(1).sqrt(), rtol=1e-12, atol=0)
    # and each P_ij = ⟨g_i, v_j⟩ against materialised per-example gradients
    from dpaudit.training.clipping import _per_example_grads

    names = jl.trainable_names(model)
    G = _per_example_grads(model, names, x, y)
    ref = torch.stack([sum((g * v[n]).flatten(1).sum(1) for g, n in zip(G, names, strict=True)) for v in dirs], 1)
    torch.testing.assert_close(P, ref, rtol=1e-10, atol=1e-12)


def test_jvp_and_double_vjp_agree():
    model, x, y = zoo("rnn")
    dirs = random_directions(model, 3, torch.Generator().manual_seed(4))
    a = jl_projection_matrix(model, x, y, dirs, ad_path="jvp")
    b = jl_projection_matrix(model, x, y, dirs, ad_path="double-vjp")
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------ the clipped sum


def jl_error_bound(norms: torch.Tensor, clip: float, r: int, tail: float) -> tuple[float, float, float]:
    """(lo, hi, bound): M_i/‖g_i‖ ∈ [lo, hi] except with probability ``tail`` per example (χ²_r
    quantiles, Prop. 2.1), and then ‖JL sum − exact sum‖ ≤ Σ_i ‖g_i‖·|min(1, C/(ρ‖g_i‖)) − min(1, C/‖g_i‖)|
    maximised over ρ ∈ {lo, hi} (the weight is monotone in ρ)."""
    lo = math.sqrt(stats.chi2.ppf(tail / 2, r) / r)
    hi = math.sqrt(stats.chi2.isf(tail / 2, r) / r)
    g = norms.numpy()
    exact = np.minimum(1.0, clip / g)
    dev = np.maximum(*(np.abs(np.minimum(1.0, clip / (rho * g)) - exact) for rho in (lo, hi)))
    return lo, hi, float(np.sum(g * dev))


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_large_r_agrees_with_exact_clipping_within_the_chi2_error(kind):
    model, x, y = zoo(kind)
    norms = exact_norms(model, x, y)
    clip = float(norms.median())  # between the smallest and largest norm: both branches run
    r = 2000
    dirs = random_directions(model, r, torch.Generator().manual_seed(5))
    lo, hi, bound = jl_error_bound(norms, clip, r, tail=1e-6)
    M = jl_norm_estimates(model, x, y, dirs)
    assert torch.all(M / norms > lo) and torch.all(M / norms < hi)
    got = jl_clipped_sum(model, x, y, clip, dirs)
    exact = VmapClipper(model)(x, y, clip).grads
    err = math.sqrt(sum(float((got[n] - e).square().sum()) for n, e in zip(got, exact, strict=True)))
    assert err <= bound
    # Not vacuous: at r = 2000 the bound is a few % of the size of the clipped contributions.
    assert bound < 0.1 * float(torch.clamp(norms, max=clip).sum())
    # Planted mistake: weights from the sum over projections (ρ ≈ sqrt(r)) break the same bound.
    w_wrong = 1.0 / torch.clamp(M * math.sqrt(r) / clip, min=1.0)
    w_exact = 1.0 / torch.clamp(norms / clip, min=1.0)
    assert float(((w_wrong - w_exact).abs() * norms).sum()) > bound


@pytest.mark.parametrize("kind", KINDS)
def test_infinite_clip_is_the_plain_gradient_sum(kind):
    model, x, y = zoo(kind)
    dirs = random_directions(model, 1, torch.Generator().manual_seed(6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = jl_clipped_sum(model, x, y, math.inf, dirs)
    named = dict(model.named_parameters())
    ref = torch.autograd.grad(F.cross_entropy(model(x), y, reduction="sum"), [named[n] for n in got])
    for (n, g), e in zip(got.items(), ref, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-14, msg=n)


def test_directions_are_checked():
    model, x, y = zoo("logreg")
    with pytest.raises(InputError, match="at least one"):
        jl_norm_estimates(model, x, y, [])
    bad = {n: torch.zeros(3) for n in jl.trainable_names(model)}
    with pytest.raises(InputError, match="shape"):
        jl_norm_estimates(model, x, y, [bad])


# ------------------------------------------------------------------------------ AD paths, bad input


def test_fused_lstm_falls_back_to_double_vjp_with_a_warning():
    model, x, y = zoo("fused-lstm")
    with pytest.warns(UserWarning, match=r"lstm \(LSTM\).*double-vjp"):
        assert jl.resolve_ad_path(model, x, y) == "double-vjp"


class _NoHigherDerivative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * 2

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        return g * 2


class Opaque(nn.Module):
    def forward(self, a):
        return _NoHigherDerivative.apply(a)


def test_model_without_forward_ad_or_double_backward_is_refused_by_layer_name():
    model = nn.Sequential(nn.Linear(3, 2), Opaque()).double()
    x, y = torch.randn(2, 3, dtype=torch.float64), torch.tensor([0, 1])
    dirs = random_directions(model, 1, torch.Generator().manual_seed(0))
    with pytest.raises(InputError, match=r"layer 1 \(Opaque\)"):
        jl_norm_estimates(model, x, y, dirs)


def test_bad_projection_counts():
    with pytest.raises(InputError, match="jl_projections"):
        DPConfig(noise_multiplier=1.0, jl_projections=0, accountant="pld")
    with pytest.raises(InputError, match="pld"):
        DPConfig(noise_multiplier=1.0, jl_projections=2, accountant="rdp")
    with pytest.raises(InputError, match="Poisson"):
        DPConfig(noise_multiplier=1.0, jl_projections=2, accountant="pld", sampling="shuffle")
    model, _, _ = zoo("logreg")  # 21 parameters
    with pytest.warns(UserWarning, match="more directions than dimensions"):
        JLClipper(model, 50, torch.Generator())


def test_dropout_is_refused():
    model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.Linear(4, 2))
    with pytest.raises(InputError, match=r"layer 1 \(Dropout\)"):
        JLClipper(model, 1, torch.Generator())


class FunctionalDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.h = nn.Linear(3, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.h(F.dropout(torch.tanh(self.a(x)), 0.5, training=self.training))


@pytest.mark.parametrize("r", [1, 3])
@pytest.mark.parametrize("ad_path", ["auto", "jvp", "double-vjp"])
def test_random_forward_without_a_dropout_module_is_refused(r, ad_path):
    # F.dropout is no Dropout module: with one direction the jvp re-ran the forward with fresh masks, so the
    # norm estimate bounded another gradient than the one clipped (the claim's C·Z_r bound void), accepted
    # silently; with more it was vmap's RuntimeError. The same module in eval mode is deterministic: fine.
    model = FunctionalDropout()
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 0, 1, 0, 1])
    state = torch.random.get_rng_state()
    with pytest.raises(InputError, match=r"forward pass is random in training mode"):
        JLClipper(model, r, torch.Generator().manual_seed(0), ad_path=ad_path)(x, y, 1.0)
    assert torch.equal(torch.random.get_rng_state(), state)  # the check draws on a forked generator
    JLClipper(model.eval(), r, torch.Generator().manual_seed(0), ad_path=ad_path)(x, y, 1.0)


# ------------------------------------------------------------------------------ the trainer


def tiny_data(n=40, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    return X, (X[:, 0] > 0).long()


def config(algo="dpsgd-jl", r=2, **dp):
    dp = {"noise_multiplier": 1.0, "jl_projections": r, "accountant": "pld", **dp}
    return TrainConfig(algo=algo, steps=3, batch_size=8, lr=0.1, seed=3, dp=DPConfig(**dp))


@pytest.fixture
def recorded_accounting(monkeypatch):
    """The trainer's ε computation replaced by a recorder (a PLD JL evaluation takes 5-50 s on this
    machine); the real number is checked once, in the slow test below."""
    from dpaudit.training import dpsgd

    seen = []

    def fake(event, delta, accountant="rdp", *, neighbouring="add_remove"):
        seen.append((event, delta, accountant, neighbouring))
        return 42.0

    monkeypatch.setattr(dpsgd, "epsilon_for", fake)
    return seen


def mlp():
    return build_model(default_spec("mlp", input_shape=(5,), n_classes=2, hidden=(4,)), seed=0)


def test_trainer_end_to_end_claim_is_the_jl_event(recorded_accounting):
    X, y = tiny_data()
    out = DPSGDJLTrainer(config()).fit(mlp(), X, y)
    claim = out.privacy
    event = dpsgd_event(noise_multiplier=1.0, sample_rate=8 / 40, steps=3, jl_projections=2)
    assert claim["event"] == event.to_dict()
    assert recorded_accounting == [(event, 1e-5, "pld", "add_remove")]  # the JL event, never the plain one
    assert claim["epsilon"] == 42.0
    assert claim["jl"] == {"projections": 2, "ad_path": "jvp"} and claim["jl_projections"] == 2
    assert "Lemma 4.3" in claim["analysis"]
    # bit-reproducible from the seed, and the parameters moved
    again = DPSGDJLTrainer(config()).fit(mlp(), X, y)
    for a, b, c in zip(out.model.parameters(), again.model.parameters(), mlp().parameters(), strict=True):
        assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.slow
def test_trainer_claim_epsilon_is_the_jl_accountants():
    X, y = tiny_data()
    claim = DPSGDJLTrainer(config(r=16)).fit(mlp(), X, y).privacy
    event = dpsgd_event(noise_multiplier=1.0, sample_rate=8 / 40, steps=3, jl_projections=16)
    assert claim["epsilon"] == pytest.approx(epsilon_for(event, 1e-5, "pld"), rel=1e-12)
    plain = epsilon_for(dpsgd_event(noise_multiplier=1.0, sample_rate=8 / 40, steps=3), 1e-5, "pld")
    assert claim["epsilon"] > plain  # the plain formula would under-report


def test_dpadam_jl_and_the_jl_flag_pairing(recorded_accounting):
    X, y = tiny_data()
    model = build_model(default_spec("logreg", input_shape=(5,), n_classes=2), seed=0)
    assert DPAdamJLTrainer(config("dpadam-jl", r=1)).fit(model, X, y).privacy["jl"]["projections"] == 1
    from dpaudit.training.algorithms import get_trainer

    with pytest.raises(InputError, match="needs --jl-projections"):
        get_trainer("dpsgd-jl")(config(jl_projections=None, accountant="rdp")).fit(model, X, y)
    with pytest.raises(InputError, match=r"^--jl-projections does not apply to --algo dpsgd "):
        get_trainer("dpsgd")(config()).fit(model, X, y)


def test_trainer_step_is_the_clipped_sum_plus_noise():
    """One step at q = 1 with zero noise: the update is −lr·(JL clipped sum)/B for the directions
    the trainer drew (seed + 3), i.e. the trainer uses jl_clipped_sum's mechanism, not exact norms."""
    X, y = tiny_data(n=8)
    spec = default_spec("logreg", input_shape=(5,), n_classes=2)
    model = build_model(spec, seed=0, dtype=torch.float64)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = TrainConfig(
        algo="dpsgd-jl", steps=1, batch_size=8, lr=1.0, seed=3,
        dp=DPConfig(noise_multiplier=0.0, jl_projections=1, accountant="pld", sample_rate=1.0, clip=0.05),
    )  # fmt: skip
    DPSGDJLTrainer(cfg).fit(model, X.double(), y)
    ref_model = build_model(spec, seed=0, dtype=torch.float64)
    dirs = random_directions(ref_model, 1, torch.Generator().manual_seed(3 + 3))
    ref = jl_clipped_sum(ref_model, X.double(), y, 0.05, dirs)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), start[n] - ref[n] / 8, rtol=1e-12, atol=1e-14)


def test_epsilon_target_calibrates_sigma_for_the_jl_event(monkeypatch):
    """--epsilon calibrates σ through the accounting layer's root finder with the JL event (the root
    finder itself is tested in tests/accounting; a real JL calibration takes minutes here)."""
    from dpaudit.training import dpsgd

    seen = {}

    def fake(*, target_epsilon, delta, make_event, accountant, neighbouring, **options):
        seen.update(event=make_event(1.5), accountant=accountant, target=target_epsilon, options=options)
        return 3.0

    monkeypatch.setattr(dpsgd, "calibrate_noise_multiplier", fake)
    setting = DPSGDJLTrainer(config(r=8, noise_multiplier=None, target_epsilon=8.0)).setting_for(40)
    assert seen["event"] == dpsgd_event(noise_multiplier=1.5, sample_rate=0.2, steps=3, jl_projections=8)
    assert seen["accountant"] == "pld" and seen["target"] == 8.0
    # issue 28: the fast formal lower bound lets an unreachable target be refused at once
    from dpaudit.accounting.jl import epsilon_lower_bound

    assert seen["options"]["lower_bound"](1.5) == epsilon_lower_bound(1.5, 8, 0.2, 3, 1e-5)
    assert setting.noise_multiplier == 3.0 and setting.event() == dpsgd_event(
        noise_multiplier=3.0, sample_rate=0.2, steps=3, jl_projections=8
    )


def test_checkpoint_records_the_double_vjp_path(recorded_accounting):
    model, x, y = zoo("fused-lstm")
    X, Y = x.repeat(5, 1), y.repeat(5)  # 20 records
    with pytest.warns(UserWarning, match="double-vjp"):
        claim = DPSGDJLTrainer(config(r=1)).fit(model, X, Y).privacy
    assert claim["jl"] == {"projections": 1, "ad_path": "double-vjp"}


@pytest.mark.parametrize("factory", ["mha_transformer", "transformer"])
def test_attention_models_get_jl_norms(factory):
    """nn.MultiheadAttention and F.scaled_dot_product_attention: their fused kernels have neither a forward-mode
    derivative nor a double backward, so the projections run on the math kernel (was: refused, exit 2). Oracle:
    M_i / ||g_i|| = sqrt(chi2_r / r) (Bu et al. 2021, Prop. 2.1), sd ~ 1/sqrt(2r) = 0.016 at r = 2000: 8% is
    5 sd."""
    from tests.core import byo_models

    torch.manual_seed(0)
    model = getattr(byo_models, factory)(11, 5, 3).double()
    x, y = torch.randint(0, 11, (6, 5)), torch.randint(0, 3, (6,))
    dirs = [
        {k: v.double() for k, v in d.items()}
        for d in jl.random_directions(model, 2000, torch.Generator().manual_seed(1))
    ]
    ratio = jl.jl_norm_estimates(model, x, y, dirs) / LoopClipper(model)(x, y, 1e9).norms
    np.testing.assert_allclose(ratio.numpy(), 1.0, atol=0.08)


@pytest.mark.parametrize("ad_path", ["jvp", "double-vjp"])
@pytest.mark.parametrize("factory", ["tied_lm", "tied_linear"])
def test_tied_weights_are_projected_with_both_uses(factory, ad_path):
    """A weight used twice (an embedding tied to the output head over int64 token ids; two Linear maps sharing one
    weight): P_ij must be <g_i, v_j> for the true per-record gradient, both uses summed (Bu et al. 2021, Alg. 1).
    Oracle: one ordinary backward pass per record (autograd sums a tied weight's uses). float64: equal to 1e-10.
    Planted: the jvp path's tied_paths dropped (each use its own leaf) -> projections off."""
    from tests.core import byo_models

    torch.manual_seed(0)
    if factory == "tied_lm":
        model, x = byo_models.tied_lm(11, 3).double(), torch.randint(0, 11, (5, 4))
    else:
        model, x = byo_models.tied_linear(6, 3).double(), torch.randn(5, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (5,))
    dirs = [
        {k: v.double() for k, v in d.items()} for d in jl.random_directions(model, 7, torch.Generator().manual_seed(1))
    ]
    named = dict(model.named_parameters())
    exact = torch.zeros(5, 7, dtype=torch.float64)
    for i in range(5):
        grads = torch.autograd.grad(F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]), list(named.values()))
        g = dict(zip(named, grads, strict=True))
        exact[i] = torch.stack([sum((g[n] * v[n]).sum() for n in named) for v in dirs])
    P = jl.jl_projection_matrix(model, x, y, dirs, ad_path=ad_path)
    torch.testing.assert_close(P, exact, rtol=1e-10, atol=1e-10)


def test_secure_noise_makes_the_directions_unpredictable_too():
    """Under --secure-noise the JL directions are not drawn from the (recorded) seed either: the seed paper's
    Lemma 4.3 takes the law of ‖g_0‖/M_0 over v_1 … v_r drawn independently of the neighbouring pair, which a
    record chosen knowing the seed's directions is not. Zero noise, so only the directions can differ: two runs
    with the same seed took the same directions (identical weights) before the fix."""
    X, y = tiny_data(n=8)
    spec = default_spec("logreg", input_shape=(5,), n_classes=2)

    def run(secure):
        model = build_model(spec, seed=0, dtype=torch.float64)
        cfg = TrainConfig(
            algo="dpsgd-jl", steps=1, batch_size=8, lr=1.0, seed=3,
            dp=DPConfig(noise_multiplier=0.0, jl_projections=1, accountant="pld", sample_rate=1.0, clip=0.05,
                        secure_noise=secure),
        )  # fmt: skip
        DPSGDJLTrainer(cfg).fit(model, X.double(), y)
        return torch.cat([p.detach().ravel() for p in model.parameters()])

    assert torch.equal(run(False), run(False))  # reproducible from the seed without --secure-noise
    assert not torch.equal(run(True), run(True))
