"""The JAX backend against the torch implementation: same weights, batch and clip -> same clipped
sums; same seeds -> same training trajectory (σ = 0); JL projections against dpaudit.training.jl;
masked padding exact; noise added once with the right scale; checkpoints that the rest of dpaudit
reads unchanged."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch
from scipy import stats
from typer.testing import CliRunner

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from dpaudit.models import build_model, default_spec  # noqa: E402
from dpaudit.training import jax_backend as jb  # noqa: E402
from dpaudit.training.algorithms import get_trainer  # noqa: E402
from dpaudit.training.clipping import make_clipper  # noqa: E402
from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig  # noqa: E402

# The acceptance tolerances (observed: ~1e-15 in float64, ~1e-7 in float32).
TOL = {torch.float64: 1e-5, torch.float32: 1e-4}
# The CNN's vmap-of-conv program takes seconds to compile on one core: its cases are slow tests.
KINDS = ("logreg", "mlp", pytest.param("cnn", marks=pytest.mark.slow))
SMALL = {"logreg": {}, "mlp": {"hidden": (16,)}, "cnn": {"channels": (4, 8)}}


def _batch(kind: str, n: int = 12, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    spec = default_spec(kind, input_shape=(1, 8, 8), n_classes=3, **SMALL[kind])
    x = torch.randn(n, 1, 8, 8, generator=g, dtype=dtype)
    y = torch.randint(0, 3, (n,), generator=g)
    return build_model(spec, seed=seed, dtype=dtype), x, y


def _x64(dtype):
    return jax.enable_x64(dtype == torch.float64)


def _close(got: dict, expected: dict, tol: float) -> None:
    assert set(got) == set(expected)
    for k in expected:
        e = expected[k].detach().numpy() if isinstance(expected[k], torch.Tensor) else np.asarray(expected[k])
        np.testing.assert_allclose(np.asarray(got[k]), e, rtol=tol, atol=tol, err_msg=k)


def _torch_vmap_sum(model, x, y, clip):
    out = make_clipper(model, "vmap")(x, y, clip)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return dict(zip(names, out.grads, strict=True)), out.norms


# --- cross-backend equality of the clipped sum ---------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", KINDS)
def test_clipped_sum_matches_torch_vmap(kind, dtype):
    model, x, y = _batch(kind, dtype=dtype)
    with _x64(dtype):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        assert all(v.dtype == jnp.dtype(str(dtype).split(".")[1]) for v in params.values())
        np.testing.assert_allclose(
            np.asarray(apply(params, jnp.asarray(x.numpy()))), model(x).detach().numpy(), rtol=TOL[dtype]
        )
        _, norms = _torch_vmap_sum(model, x, y, 1.0)
        clip = float(norms.min() + norms.max()) / 2  # both branches of the clip run
        assert (norms < clip).any() and (norms > clip).any()
        expected, expected_norms = _torch_vmap_sum(model, x, y, clip)
        got, got_norms = jb.clipped_sum(apply, params, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()), clip)
        _close(got, expected, TOL[dtype])
        np.testing.assert_allclose(np.asarray(got_norms), expected_norms.numpy(), rtol=TOL[dtype])


def test_unsupported_model_is_refused():
    from dpaudit.errors import InputError

    spec = default_spec("rnn", input_shape=(5,), n_classes=2, vocab_size=7)
    with pytest.raises(InputError, match=r"torch.fx cannot trace model RNNClassifier .*logreg, mlp, cnn"):
        jb.jax_forward(build_model(spec, seed=0))
    with pytest.raises(InputError, match=r"layer 1 \(FeatureAlphaDropout\) is not supported"):  # Dropout2d & co run
        jb.jax_forward(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.FeatureAlphaDropout(0.1)))
    # A user's Sequential with one module used twice: named_children() lists it once, so its second use
    # silently vanished from the JAX forward (a different function was trained); then it was refused; now it
    # runs from its torch.fx graph, both uses reading one parameter (tests/training/test_jax_user_models.py
    # checks the clipped sums). A frozen parameter was a KeyError deep inside the step.
    lin = torch.nn.Linear(3, 3)
    twice = torch.nn.Sequential(lin, torch.nn.Tanh(), lin)
    x = torch.randn(4, 3)
    apply = jb.jax_forward(twice)
    assert isinstance(apply, jb.FxModel)
    np.testing.assert_allclose(
        np.asarray(apply(jb.params_from_torch(twice), jnp.asarray(x.numpy()))), twice(x).detach().numpy(), rtol=1e-5
    )
    frozen = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    frozen[0].requires_grad_(False)
    with pytest.raises(InputError, match=r"parameter 0.weight is frozen"):
        jb.jax_forward(frozen)


def test_the_clipped_sum_adds_the_gradients_whose_norms_it_clipped():
    """clipped_sum's sum is Σ_i w_i g_i of the very g_i whose norms set w_i (Abadi et al. 2016, Alg. 1), so every
    record adds at most C. Planted (the twelfth session's finding): the norms from vmap(grad) and the sum from a
    second, batched backward pass -> a function whose gradient differs between the record alone and the batch (here
    by design; under jit an amax over a bilinear upsampling did so by XLA's rounding) adds 3·C per record."""

    def apply(p, x):  # the same function alone and in a batch, but its gradient is 3x in a batch of more than one
        z = x @ p["w"]
        return z if x.shape[0] == 1 else lax.stop_gradient(z) + 3.0 * (z - lax.stop_gradient(z))

    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        params = {"w": jnp.asarray(rng.normal(size=(4, 3)))}
        x, y = jnp.asarray(rng.normal(size=(6, 4)) * 5), jnp.asarray(rng.integers(0, 3, 6))
        clip = 1e-4
        total, norms = jb.clipped_sum(apply, params, x, y, clip)
        g = jb.per_example_grads(apply, params, x, y)["w"]
        assert np.all(np.asarray(norms) > clip)  # every record clipped: each adds exactly C
        expected = (np.asarray(g) * (clip / np.asarray(norms))[:, None, None]).sum(0)
        np.testing.assert_allclose(np.asarray(total["w"]), expected, rtol=1e-12, atol=0)
        assert np.linalg.norm(np.asarray(total["w"])) <= len(x) * clip * (1 + 1e-12)


# --- padding with a mask -------------------------------------------------------------------------


def _padded_inputs(x, y, pad):
    idx, mask = jb._padded(np.arange(len(x)), pad)
    return jnp.asarray(x.numpy())[idx], jnp.asarray(y.numpy())[idx], mask


def test_padded_clipped_sum_equals_unpadded():
    model, x, y = _batch("mlp", n=7)
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        plain, _ = jb.clipped_sum(apply, params, xj, yj, 0.5)
        xp, yp, mask = _padded_inputs(x, y, 16)  # padded slots repeat record 0, masked out
        padded, _ = jb.clipped_sum(apply, params, xp, yp, 0.5, jnp.asarray(mask))
        _close(padded, plain, 1e-12)
        # Planted mistake: the mask ignored -> record 0 counted 9 more times; the same check fails.
        ignored, _ = jb.clipped_sum(apply, params, xp, yp, 0.5)
        with pytest.raises(AssertionError):
            _close(ignored, plain, 1e-5)


def test_batch_larger_than_pad_is_chunked_not_truncated():
    """A Poisson batch above the pad runs as several padded chunks; the step equals one big chunk."""
    model, x, y = _batch("mlp", n=25)
    config = TrainConfig(algo="dpsgd", steps=1, batch_size=10, lr=1.0, dp=DPConfig(clip=0.3, noise_multiplier=0.0))
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        X, Y = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        prog = jb.StepProgram(apply, params, config, kind="dp", optimizer="sgd", clip=0.3, noise_key=jax.random.key(0))
        batch = np.arange(23)
        one, _ = prog.run_step(params, prog.init_state(params), X, Y, batch, 32, 0, 10.0)
        many, _ = prog.run_step(params, prog.init_state(params), X, Y, batch, 8, 0, 10.0)  # 3 chunks
        _close(many, one, 1e-12)
        # Oracle: θ − (Σ_i clip(g_i)) / B with lr = 1, from the torch clipper.
        expected, _ = _torch_vmap_sum(model, x[:23], y[:23], 0.3)
        _close(one, {k: params[k] - expected[k].numpy() / 10.0 for k in params}, 1e-10)
        truncated, _ = prog.run_step(params, prog.init_state(params), X, Y, batch[:8], 8, 0, 10.0)
        with pytest.raises(AssertionError):  # planted mistake: truncating to the pad
            _close(truncated, one, 1e-5)


def test_pad_size_overflows_rarely():
    # P(Binomial(N, q) > pad) at 4 standard deviations: below 1e-4 for realistic (B, N).
    for b, n in ((64, 1000), (256, 60000), (8, 20)):
        q = b / n
        assert stats.binom.sf(jb.pad_size(b, q), n, q) < 1e-4


# --- noise: once per step, N(0, σ²C²) per coordinate ---------------------------------------------


class _PerExampleNoise(jb.StepProgram):
    """Planted mistake: N(0, σ²C²) added to every example's clipped gradient instead of once."""

    def __init__(self, *args, per_example_std: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.per_example_std = per_example_std

    def _chunk(self, params, X, y, idx, mask, t):
        s = super()._chunk(params, X, y, idx, mask, t)
        keys = jax.random.split(jax.random.fold_in(self.noise_key, t), idx.shape[0])

        def noise(k):
            ks = jax.random.split(k, len(s))
            return {
                n: jax.random.normal(kk, v.shape, v.dtype) for (n, v), kk in zip(sorted(s.items()), ks, strict=True)
            }

        z = jax.vmap(noise)(keys)
        m = mask.astype(X.dtype)
        return {n: s[n] + self.per_example_std * jnp.tensordot(m, z[n], axes=1) for n in s}


def _noise_of(program_cls, sigma, clip, b, **kwargs):
    """The noise of one step, read back: θ_noisy − θ_clean = −lr·z/B (lr = 1), so z = B(θ_clean − θ_noisy)."""
    model, x, y = _batch("logreg", n=30)  # d = 195 coordinates
    config = TrainConfig(algo="dpsgd", steps=1, batch_size=b, lr=1.0, dp=DPConfig(clip=clip, noise_multiplier=sigma))
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        X, Y = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        batch = np.arange(b)
        common = dict(kind="dp", optimizer="sgd", clip=clip, noise_key=jax.random.key(5))
        clean = jb.StepProgram(apply, params, config, **common)
        noisy = program_cls(apply, params, config, noise_std=sigma * clip, **common, **kwargs)
        p0, _ = clean.run_step(params, clean.init_state(params), X, Y, batch, 32, 0, float(b))
        p1, _ = noisy.run_step(params, noisy.init_state(params), X, Y, batch, 32, 0, float(b))
        return np.concatenate([np.ravel(b * (np.asarray(p0[k]) - np.asarray(p1[k]))) for k in sorted(params)])


def _chi2_pvalue(z, std):
    # Σ z²/std² ~ χ²_d under N(0, std² I); two-sided p-value.
    s = float(np.sum(np.square(z / std)))
    return 2 * min(stats.chi2.cdf(s, len(z)), stats.chi2.sf(s, len(z)))


def test_noise_is_added_once_with_std_sigma_c():
    sigma, clip, b = 1.3, 0.4, 20
    z = _noise_of(jb.StepProgram, sigma, clip, b)
    assert len(z) == 195 and _chi2_pvalue(z, sigma * clip) > 1e-4
    assert _chi2_pvalue(z, sigma * clip / 2) < 1e-9  # half the noise is detected by the same test
    # Planted mistake: noise per example (B draws, std sqrt(B)·σC in total) fails the same test.
    wrong = _noise_of(_PerExampleNoise, 0.0, clip, b, per_example_std=sigma * clip)
    assert _chi2_pvalue(wrong, sigma * clip) < 1e-9


def test_noise_differs_between_steps_and_seeds():
    model, x, y = _batch("logreg", n=12)
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        config = TrainConfig(algo="dpsgd", steps=1, batch_size=4, lr=1.0, dp=DPConfig(noise_multiplier=1.0))
        X, Y = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())

        progs = [
            jb.StepProgram(
                apply, params, config, kind="dp", optimizer="sgd", noise_std=1.0, noise_key=jax.random.key(s)
            )
            for s in (0, 1)
        ]

        def step(key_seed, t):  # an empty batch: a noise-only step
            prog = progs[key_seed]
            return np.asarray(
                prog.run_step(params, prog.init_state(params), X, Y, np.arange(0), 8, t, 4.0)[0]["1.weight"]
            )

        assert np.array_equal(step(0, 3), step(0, 3))
        assert not np.allclose(step(0, 3), step(0, 4)) and not np.allclose(step(0, 3), step(1, 3))


# --- training: the same trajectory as the torch trainers (same batches; σ = 0 removes the noise) ----


@pytest.mark.parametrize(
    ("kind", "algo"),
    [
        ("logreg", "sgd"),
        ("logreg", "dpsgd"),
        pytest.param("mlp", "adam", marks=pytest.mark.slow),
        pytest.param("mlp", "dpsgd", marks=pytest.mark.slow),
        pytest.param("mlp", "dpadam", marks=pytest.mark.slow),
    ],
)
def test_training_matches_torch_trainer(kind, algo):
    model_t, x, y = _batch(kind, n=40)
    model_j, _, _ = _batch(kind, n=40)
    dp = DPConfig(clip=0.5, noise_multiplier=0.0) if algo.startswith("dp") else None
    momentum = 0.5 if algo in ("sgd", "dpsgd") else 0.0
    config = TrainConfig(algo=algo, steps=6, batch_size=12, lr=0.1, momentum=momentum, weight_decay=0.01, dp=dp)
    torch_out = get_trainer(algo)(config).fit(model_t, x, y)
    jax_out = jb.JaxTrainer(config, PerfConfig(backend="jax")).fit(model_j, x, y)
    for (n, a), b in zip(model_t.named_parameters(), model_j.parameters(), strict=True):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-9, atol=1e-12, err_msg=n)
    assert jax_out.privacy == torch_out.privacy  # the same claim, from the same code
    if dp is not None:  # the same epochs in the history (TrainConfig.epoch_ended)
        assert jax_out.history == torch_out.history
    assert model_j.training is False


@pytest.mark.slow
def test_dp_training_with_noise_differs_only_by_noise():
    """σ > 0: the torch and JAX runs differ (different generators) but each is reproducible."""
    config = TrainConfig(algo="dpsgd", steps=3, batch_size=8, lr=0.1, dp=DPConfig(noise_multiplier=1.0))
    runs = []
    for _ in range(2):
        model, x, y = _batch("logreg", n=30)
        jb.JaxTrainer(config, PerfConfig(backend="jax")).fit(model, x, y)
        runs.append(model[1].weight.detach().clone())
    model_t, x, y = _batch("logreg", n=30)
    get_trainer("dpsgd")(config).fit(model_t, x, y)
    assert torch.equal(runs[0], runs[1]) and not torch.allclose(runs[0], model_t[1].weight)


def test_unsupported_algo_is_refused():
    from dpaudit.errors import InputError

    with pytest.raises(InputError, match="--backend jax supports"):
        jb.JaxTrainer(TrainConfig(algo="nonsense"), PerfConfig(backend="jax"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("algo", ["sgd", "dpsgd"])
def test_low_precision_parameters_are_refused_in_one_line(dtype, algo):
    """Before: float16 failed inside jnp.asarray (ValueError), bfloat16 in .numpy() (TypeError): tracebacks.
    Private: the clipper's reason (norms in that dtype let a clipped gradient exceed C)."""
    from dpaudit.errors import InputError

    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).to(dtype)
    x, y = torch.randn(16, 4).to(dtype), torch.randint(0, 3, (16,))
    dp = DPConfig(noise_multiplier=1.0, clip=1.0) if algo == "dpsgd" else None
    config = TrainConfig(algo=algo, steps=1, batch_size=8, dp=dp)
    want = "clipped gradient exceed C.*with .float" if dp else "--backend jax trains float32 or float64"
    with pytest.raises(InputError, match=want):
        jb.JaxTrainer(config, PerfConfig(backend="jax")).fit(model, x, y)


@pytest.mark.parametrize(
    ("perf", "message"),
    [
        ({"autocast": "bf16"}, "--autocast applies to --backend torch only"),
        ({"clipping": "loop"}, "--clipping loop applies to --backend torch only"),
    ],
)
def test_torch_only_performance_options_are_refused_with_the_jax_backend(perf, message):
    """Before: silently ignored (a user comparing --clipping methods under JAX measured one method twice)."""
    from dpaudit.errors import InputError

    with pytest.raises(InputError, match=message):
        PerfConfig(backend="jax", **perf)
    PerfConfig(backend="jax", clipping="auto")  # the default, typed, is what JAX does


# --- JL projections --------------------------------------------------------------------------------


def _directions(model, r, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {n: torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in model.named_parameters() if p.requires_grad}
        for _ in range(r)
    ]


def _torch_jl(model, x, y, clip, directions):
    """M_i and the JL clipped sum: dpaudit.training.jl when present, else an explicit torch.func oracle."""
    try:
        from dpaudit.training.jl import jl_clipped_sum, jl_norm_estimates

        return jl_norm_estimates(model, x, y, directions), jl_clipped_sum(model, x, y, clip, directions)
    except ImportError:  # pragma: no cover - the fallback oracle for a tree without jl.py
        from torch.func import functional_call, jvp

        params = {n: p.detach() for n, p in model.named_parameters()}

        def losses(p):
            return torch.nn.functional.cross_entropy(functional_call(model, p, (x,)), y, reduction="none")

        proj = torch.stack([jvp(losses, (params,), (v,))[1] for v in directions])
        m = proj.square().mean(0).sqrt()
        w = 1.0 / torch.clamp(m / clip, min=1.0)
        grads = torch.autograd.grad((w * losses(dict(model.named_parameters()))).sum(), list(model.parameters()))
        return m, dict(zip(params, grads, strict=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", KINDS)
def test_jl_matches_torch_given_the_same_directions(kind, dtype):
    model, x, y = _batch(kind, dtype=dtype)
    directions = _directions(model, 3)
    m_torch, _ = _torch_jl(model, x, y, 1.0, directions)
    clip = float(m_torch.min() + m_torch.max()) / 2  # some estimates above C, some below
    m_torch, sum_torch = _torch_jl(model, x, y, clip, directions)
    with _x64(dtype):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        dj = [{n: jnp.asarray(v.numpy()) for n, v in d.items()} for d in directions]
        xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        m_jax = jb.jl_norm_estimates(apply, params, xj, yj, dj)
        np.testing.assert_allclose(np.asarray(m_jax), m_torch.detach().numpy(), rtol=TOL[dtype])
        sum_jax, _ = jb.jl_clipped_sum(apply, params, xj, yj, clip, dj)
        _close(sum_jax, sum_torch, TOL[dtype])
        # Planted mistake: Σ_j instead of the mean over j (M_i too large by sqrt(r)) is caught.
        with pytest.raises(AssertionError):
            np.testing.assert_allclose(np.sqrt(3) * np.asarray(m_jax), m_torch.detach().numpy(), rtol=TOL[dtype])


def test_jl_padding_and_unclipped_limit():
    model, x, y = _batch("mlp", n=7)
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        dj = [{n: jnp.asarray(v.numpy()) for n, v in d.items()} for d in _directions(model, 2)]
        xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        plain, _ = jb.jl_clipped_sum(apply, params, xj, yj, 0.2, dj)
        xp, yp, mask = _padded_inputs(x, y, 12)
        padded, _ = jb.jl_clipped_sum(apply, params, xp, yp, 0.2, dj, jnp.asarray(mask))
        _close(padded, plain, 1e-12)
        # C = ∞: every weight is 1, the plain gradient sum (its oracle: the sum of torch's per-example grads).
        unclipped, _ = jb.jl_clipped_sum(apply, params, xj, yj, math.inf, dj)
        expected, _ = _torch_vmap_sum(model, x, y, math.inf)
        _close(unclipped, expected, 1e-10)


def test_jl_estimates_and_sum_come_from_one_linearization():
    """DP-SGD-JL's privacy (JL projections paper, Lemma 4.3) bounds record i's C g_i / M_i where M_i projects the
    same g_i that is added: jl_clipped_sum takes both from one linearization of the losses. Planted (the former
    version): the estimates from r separately traced jvps and the sum from a further grad -> a model whose gradient
    differs between traces (here by design: x3 after its first trace; under jit XLA may round one gradient into
    different choices, the amax case of clipped_sum) adds 3x the analysed contribution."""
    traces = []

    def apply(p, x):  # the same function on every trace, but its gradient is 3x after the first trace
        traces.append(1)
        z = x @ p["w"]
        return z if len(traces) == 1 else lax.stop_gradient(z) + 3.0 * (z - lax.stop_gradient(z))

    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        params = {"w": jnp.asarray(rng.normal(size=(4, 3)))}
        x, y = jnp.asarray(rng.normal(size=(6, 4))), jnp.asarray(rng.integers(0, 3, 6))
        dirs = [{"w": jnp.asarray(rng.normal(size=(4, 3)))} for _ in range(2)]
        total, m = jb.jl_clipped_sum(apply, params, x, y, 0.05, dirs)
        g = jb.per_example_grads(lambda p, x: x @ p["w"], params, x, y)["w"]  # the model's true gradients
        est = np.sqrt(np.mean([np.square(np.einsum("nij,ij->n", np.asarray(g), np.asarray(v["w"]))) for v in dirs], 0))
        np.testing.assert_allclose(np.asarray(m), est, rtol=1e-12)  # the first trace's gradients: factor 1
        expected = (np.asarray(g) * np.minimum(1.0, 0.05 / est)[:, None, None]).sum(0)
        np.testing.assert_allclose(np.asarray(total["w"]), expected, rtol=1e-12, atol=0)


def test_jl_directions_are_standard_normal_and_shared_by_chunks():
    model, _, _ = _batch("mlp")
    config = TrainConfig(algo="dpsgd", steps=1, batch_size=4, dp=DPConfig(noise_multiplier=1.0))
    with jax.enable_x64(True):
        params = jb.params_from_torch(model)
        prog = jb.StepProgram(
            jb.jax_forward(model),
            params,
            config,
            kind="jl",
            optimizer="sgd",
            jl_projections=3,
            jl_key=jax.random.key(1),
        )
        v = prog._directions(params, 7)
        assert len(v) == 3 and all(set(d) == set(params) for d in v)
        z = np.concatenate([np.ravel(np.asarray(d[k])) for d in v for k in d])
        assert stats.kstest(z, "norm").pvalue > 1e-4
        w = prog._directions(params, 7)  # the same step: the same directions (every chunk of a batch)
        assert all(np.array_equal(np.asarray(d[k]), np.asarray(e[k])) for d, e in zip(v, w, strict=True) for k in d)
        assert not np.allclose(np.asarray(prog._directions(params, 8)[0]["1.weight"]), np.asarray(v[0]["1.weight"]))


def test_jl_training_makes_the_torch_jl_trainers_claim(monkeypatch):
    # The JL mixture's PLD claim takes seconds (r = 16: ~3 s of CPU; r = 2, whose ε is ~10^4 and widens the loss cap
    # again and again, ~9 s); both trainers ask dpsgd.privacy_claim for it, so it is computed once per distinct
    # (setting, dp) they pass. A jax trainer that passed another setting (steps, rate, σ) would get a claim of its
    # own, computed, and the comparison below would see it.
    import copy

    import dpaudit.training.dpsgd as dpsgd

    claims, privacy_claim = {}, dpsgd.privacy_claim

    def claim_once(setting, dp):
        if (setting, dp) not in claims:
            claims[setting, dp] = privacy_claim(setting, dp)
        return copy.deepcopy(claims[setting, dp])

    monkeypatch.setattr(dpsgd, "privacy_claim", claim_once)
    config = TrainConfig(
        algo="dpsgd-jl", steps=3, batch_size=8, dp=DPConfig(noise_multiplier=2.0, jl_projections=16, accountant="pld")
    )
    model_t, x, y = _batch("logreg", n=30)
    model_j, _, _ = _batch("logreg", n=30)
    torch_claim = get_trainer("dpsgd-jl")(config).fit(model_t, x, y).privacy
    jax_claim = jb.JaxTrainer(config, PerfConfig(backend="jax")).fit(model_j, x, y).privacy
    assert jax_claim["jl"] == {"projections": 16, "ad_path": "jax.jvp"}
    assert {k: v for k, v in jax_claim.items() if k != "jl"} == {k: v for k, v in torch_claim.items() if k != "jl"}
    assert jax_claim["event"]["event"]["event"]["type"] == "jl_gaussian"  # the JL event, not the Gaussian
    assert np.isfinite(model_j[1].weight.detach().numpy()).all()


# --- checkpoints and the CLI -------------------------------------------------------------------------

runner = CliRunner()
TRAIN = ["train", "--data", "digits", "--model", "logreg", "--steps", "20", "--batch-size", "32"]


def _invoke(*args):
    from dpaudit.cli.main import app

    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.slow
def test_cli_jax_dp_checkpoint_inspect_and_membership_attack(tmp_path):
    from dpaudit.checkpoint import load_run
    from dpaudit.training.algorithms import claim_for
    from dpaudit.training.run import configs_from_meta

    out = tmp_path / "run"
    args = [*TRAIN, "--algo", "dpsgd", "--noise-multiplier", "1.0", "--clip", "0.5", "--lr", "0.5", "--out", out]
    r = _invoke(*args, "--backend", "jax", "--json")
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "checkpoint.json").read_text())
    assert meta["performance"]["backend"] == "jax"
    n = meta["split"]["sizes"]["members"]
    config, perf = configs_from_meta(meta)
    assert perf.backend == "jax" and meta["privacy"] == claim_for(config, n)  # the torch trainer's claim
    run = load_run(out)  # safetensors, the torch zoo's names and layout
    assert isinstance(run.model, torch.nn.Sequential) and run.model[1].weight.shape == (10, 64)
    assert meta["metrics"]["test_accuracy"] > 0.5  # it learned (10 classes, chance 0.1)
    r = _invoke("--json", "inspect", out)
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["private"] and s["epsilon"] == meta["privacy"]["epsilon"]
    r = _invoke("--json", "attack", "mia", out, "--attacks", "loss")
    assert r.exit_code == 0, r.output
    auc = json.loads(r.stdout)["attacks"][0]["auc"]
    assert 0.0 <= auc <= 1.0


def test_cli_backend_jax_without_jax_exits_2(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` raises ImportError
    monkeypatch.delitem(sys.modules, "dpaudit.training.jax_backend", raising=False)
    r = _invoke(*TRAIN, "--backend", "jax", "--out", tmp_path / "run")
    assert r.exit_code == 2, r.output
    assert "pip install" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("old", ["0.7.2", "0.4.38"])
def test_cli_backend_jax_with_too_old_jax_exits_2_in_one_line(tmp_path, monkeypatch, old):
    """An installed JAX older than JAX_MIN is refused when the backend is selected (0.7.2 would get
    through the import and fail deep inside training: no ``jax.enable_x64`` context manager)."""
    monkeypatch.setattr(jax, "__version__", old)
    monkeypatch.delitem(sys.modules, "dpaudit.training.jax_backend", raising=False)  # re-run its import checks
    r = _invoke(*TRAIN, "--backend", "jax", "--out", tmp_path / "run")
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()  # the progress line "training logreg on digits ...", then the error
    assert lines[-1] == f"error: --backend jax needs JAX >= 0.8.0, found {old}: pip install -U 'dpaudit[jax]'"
    assert "Traceback" not in r.output and sum(line.startswith("error") for line in lines) == 1
    assert not (tmp_path / "run").exists()


def test_jax_version_check_accepts_the_floor_and_later_releases():
    assert jb.release("0.12.0.1") == (0, 12, 0, 1) and jb.release("0.9.0.dev20260101") == (0, 9, 0)
    for version in ("0.8.0", "0.8.1", "0.10.2", "0.12.0.1", "1.0"):
        jb.check_jax_version(version)
    from dpaudit.errors import InputError

    with pytest.raises(InputError, match=r"found 0\.7\.2"):
        jb.check_jax_version("0.7.2")


def test_cli_unknown_backend_exits_2(tmp_path):
    r = _invoke(*TRAIN, "--backend", "tensorflow", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "backend" in r.output


def test_adaptive_average_pooling_matches_torch_for_any_output_size():
    """The zoo CNN pools to 2 x 2 before its head: torch's adaptive windows are equal blocks when the output
    size divides the side (4 -> 2, 14 -> 2); otherwise [⌊i·n/o⌋, ⌈(i + 1)·n/o⌉), overlapping (5 -> 2, 7 -> 3; refused
    before the twelfth session), also a rectangle."""
    from torch import nn

    for side, out in ((4, 2), (14, 2), (6, 3), (5, 1), (5, 2), (7, 3), (3, 5), (7, (2, 4))):
        x = torch.randn(3, 2, side, side, generator=torch.Generator().manual_seed(side), dtype=torch.float64)
        want = nn.AdaptiveAvgPool2d(out)(x).numpy()
        with jax.enable_x64(True):
            got = jb._adaptive_module("p", nn.AdaptiveAvgPool2d(out))(None, jnp.asarray(x.numpy()))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


def test_white_box_canaries_under_the_jax_backend_are_refused_naming_the_backend(tmp_path):
    """Before: "white-box canaries need a DP-SGD trainer with --backend torch, not 'dpsgd'" for --algo dpsgd:
    the algorithm was right, the backend was not."""
    from tests.core.cli_errors import invoke, one_error

    args = ["--data", "synthetic:n=200,d=6,classes=2", "--model", "logreg", "--algo", "dpsgd", "--backend", "jax"]
    args += ["--noise-multiplier", "1", "--steps", "2", "--whitebox-canaries", "4", "--allow-inconclusive"]
    error = one_error(invoke("train", "--out", tmp_path / "run", *args))
    assert "need --backend torch" in error and "not --backend jax" in error and "'dpsgd'" not in error
    assert not (tmp_path / "run").exists()
