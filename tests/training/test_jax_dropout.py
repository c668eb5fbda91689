"""Dropout under ``--backend jax``: masks from JAX's PRNG, one key per record and step, a subkey per dropout site,
kept values scaled by 1/(1 − p) as torch's (torch.nn.Dropout); the identity without a key (evaluation, the
pre-training logits checks). Before: every dropout with p > 0 was refused ("the JAX backend draws no dropout
masks"), so ``nn.TransformerEncoderLayer(d, h)`` with its default dropout 0.1 ran on the torch backend only."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from dpaudit.training import jax_backend as jb  # noqa: E402
from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig  # noqa: E402
from tests.core import byo_models as byo  # noqa: E402

# float64: the JAX and torch computations of one function differ by rounding, ~1e-15 relative (observed); a wrong
# scale (1/p for 1/(1 − p)) or a mask at another place is O(1).
RTOL = 1e-9


def _encoder():
    """The newcomer's encoder layer (torch's defaults: post-norm, ReLU), each dropout site with its own p, so that a
    site drawn at the wrong place or with another site's p shows."""
    torch.manual_seed(0)
    model = byo.newcomer_encoder(10, 3, d=8).double()
    enc = model.enc
    enc.self_attn.dropout, enc.dropout1.p, enc.dropout.p, enc.dropout2.p = 0.1, 0.2, 0.3, 0.4
    return model


class _Decoder(nn.Module):
    """Token embeddings through torch's decoder layer (defaults: post-norm, ReLU) with memory = the embeddings,
    six dropout sites: self-attention weights, dropout1, cross-attention weights, dropout2, FF's dropout, dropout3."""

    def __init__(self):
        super().__init__()
        self.tok, self.head = nn.Embedding(10, 8), nn.Linear(8, 3)
        self.dec = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, batch_first=True)
        d = self.dec
        d.self_attn.dropout, d.dropout1.p, d.multihead_attn.dropout, d.dropout2.p = 0.1, 0.2, 0.15, 0.25
        d.dropout.p, d.dropout3.p = 0.3, 0.4

    def forward(self, tok):
        h = self.tok(tok)
        return self.head(self.dec(h, h).mean(1))


def _decoder():
    torch.manual_seed(0)
    return _Decoder().double()


def _tokens(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 10, (n, 7), generator=g), torch.randint(0, 3, (n,), generator=g)


def _mlp(p=0.3):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Dropout(p), nn.Linear(32, 3)).double()


@pytest.mark.parametrize("factory", [pytest.param(_encoder, marks=pytest.mark.slow), _mlp])
def test_without_a_key_the_logits_are_torchs_eval_logits_and_the_logits_check_passes(factory):
    """Evaluation (attacks' logits, the pre-training checks) runs without dropout, as torch's eval mode; with a key
    the forward drops (so the two differ). Plant: dropout also without a key -> the first assertion fails."""
    model = factory()
    x = _tokens()[0] if factory is _encoder else torch.randn(4, 6, dtype=torch.float64)
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        xj = jnp.asarray(x.numpy())
        model.eval()
        with torch.no_grad():
            expected = model(x).numpy()
        np.testing.assert_allclose(np.asarray(apply(params, xj)), expected, rtol=RTOL, atol=1e-12)
        assert np.abs(np.asarray(apply(params, xj, jax.random.key(0))) - expected).max() > 1e-3
        model.train()
        jb.check_same_logits(model, apply, params, x, xj)  # torch in training mode, its dropout off
        jb.check_alone_as_in_batch(apply, params, xj)
    assert F.dropout is torch.nn.functional.dropout and F.dropout.__module__ == "torch.nn.functional"  # restored
    assert model(x).requires_grad and model.training


def _jax_masks(monkeypatch):
    """The keep masks the JAX forward draws (as (p, mask) in draw order), recorded from jax.random.bernoulli."""
    drawn, bernoulli = [], jax.random.bernoulli

    def recording(key, prob, shape):
        keep = bernoulli(key, prob, shape)
        drawn.append((1.0 - prob, np.asarray(keep)))
        return keep

    monkeypatch.setattr(jax.random, "bernoulli", recording)
    return drawn


def _torch_with_masks(monkeypatch, masks):
    """torch's forward with the given keep masks injected at its dropout calls, in order: F.dropout (nn.Dropout)
    as x·m/(1 − p), F.dropout1d/2d/3d (nn.Dropout1d/2d/3d) likewise with the (N, C, 1, …) mask broadcast over a
    channel (its values x·m/(1 − p): test_jax_cnn_ops checks torch's own outputs have this form), and
    F.scaled_dot_product_attention (MultiheadAttention's) as its documented reference
    softmax(q kᵀ/√E) with the mask on the weights, before the product with v."""
    queue = list(masks)

    def dropout(input, p=0.5, training=True, inplace=False):
        q, keep = queue.pop(0)
        assert q == pytest.approx(p) and training
        return input * torch.from_numpy(keep).to(input.dtype) / (1 - p)

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        assert attn_mask is None and not is_causal
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
        return dropout(w, dropout_p) @ v

    for name in ("dropout", "dropout1d", "dropout2d", "dropout3d"):
        monkeypatch.setattr(F, name, dropout)
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    return queue


@pytest.mark.parametrize(
    "factory", [pytest.param(_encoder, marks=pytest.mark.slow), pytest.param(_decoder, marks=pytest.mark.slow), _mlp]
)
def test_a_records_gradient_with_given_masks_is_torchs_with_the_same_masks_injected(monkeypatch, factory):
    """The per-record gradient under a key equals torch's gradient of the same record with the masks JAX drew
    injected into torch's own forward (its dropout calls, in torch's order): the scale 1/(1 − p), the place of every
    site (attention weights after the softmax, after self-attention, inside and after the feed-forward block) and
    its p. Plants: scaling by 1/p (or none) and a site missing or moved -> the gradients differ."""
    model = factory()
    tokens = factory in (_encoder, _decoder)
    x, y = _tokens(2) if tokens else (torch.randn(2, 6, dtype=torch.float64), torch.tensor([0, 2]))
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        keys = jax.random.split(jax.random.key(1), len(x))
        stacked = jb.per_example_grads(apply, params, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()), keys)
        for i in range(len(x)):
            drawn = _jax_masks(monkeypatch)
            xi, yi = jnp.asarray(x[i : i + 1].numpy()), jnp.asarray(y[i : i + 1].numpy())
            got = jax.grad(lambda p, xi=xi, yi=yi, k=keys[i]: jb._per_example_losses(apply(p, xi, k), yi)[0])(params)
            monkeypatch.undo()
            assert len(drawn) == {_encoder: 4, _decoder: 6, _mlp: 1}[factory]
            queue = _torch_with_masks(monkeypatch, drawn)
            model.train()
            model.zero_grad()
            F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
            monkeypatch.undo()
            assert not queue  # torch drew at as many sites as JAX
            for n, q in model.named_parameters():
                np.testing.assert_allclose(np.asarray(got[n]), q.grad.numpy(), rtol=RTOL, atol=1e-12, err_msg=n)
                # the vmapped per-record gradients (the clipper's) are the same function of (θ, x_i, key_i)
                np.testing.assert_allclose(np.asarray(stacked[n][i]), np.asarray(got[n]), rtol=RTOL, atol=1e-12)


@pytest.mark.parametrize("factory", [pytest.param(_encoder, marks=pytest.mark.slow), _mlp])
def test_masks_differ_across_records_and_steps_and_the_clipped_sum_uses_the_clippers_masks(factory):
    """One record repeated: under the trainer's keys (StepProgram.record_keys) every copy and every step gets its
    own masks, so its gradients differ; the weighted pass of clipped_sum sums exactly the per-record gradients whose
    norms it clipped (the same masks). Plants: the same key for every record (rows equal), a key not folded with the
    step, the weighted pass without keys (its sum differs)."""
    model = factory()
    x, y = _tokens(1) if factory is _encoder else (torch.randn(1, 6, dtype=torch.float64), torch.tensor([1]))
    config = TrainConfig(algo="dpsgd", steps=2, batch_size=4, dp=DPConfig(clip=0.05, noise_multiplier=1.0))
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        program = jb.StepProgram(apply, params, config, kind="dp", optimizer="sgd", clip=0.05,
                                 dropout_key=jb._jax_key(0, False))  # fmt: skip
        xs, ys = jnp.asarray(x.repeat(4, 1).numpy()), jnp.asarray(y.repeat(4).numpy())
        idx = jnp.arange(4)
        flat = []
        for t in (0, 1):
            keys = program.record_keys(t, idx)
            g = jb.per_example_grads(apply, params, xs, ys, keys)
            rows = np.concatenate([np.asarray(v).reshape(4, -1) for v in g.values()], axis=1)
            flat.append(rows)
            gaps = [np.abs(rows[i] - rows[j]).max() for i in range(4) for j in range(i + 1, 4)]
            assert min(gaps) > 1e-6  # every pair of copies differs
            norms = np.linalg.norm(rows, axis=1)
            expected = (rows / np.maximum(1.0, norms / 0.05)[:, None]).sum(0)
            s, n = jb.clipped_sum(apply, params, xs, ys, 0.05, None, keys)
            got = np.concatenate([np.asarray(v).reshape(-1) for v in s.values()])
            np.testing.assert_allclose(np.asarray(n), norms, rtol=RTOL)
            np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-12)
        assert np.abs(flat[0] - flat[1]).max(axis=1).min() > 1e-6  # step 1's masks are not step 0's
    # a model without dropout gets no keys (its batched forward, as before)
    plain = nn.Sequential(nn.Linear(6, 3)).double()
    with jax.enable_x64(True):
        p = jb.params_from_torch(plain)
        prog = jb.StepProgram(jb.jax_forward(plain), p, config, kind="dp", optimizer="sgd",
                              dropout_key=jb._jax_key(0, False))  # fmt: skip
        assert prog.record_keys(0, idx) is None


def _fit(algo):
    x, y = torch.randn(24, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3)), torch.arange(24) % 3
    jl = {"jl_projections": 2, "accountant": "pld"} if algo == "dpsgd-jl" else {}
    dp = DPConfig(clip=1.0, noise_multiplier=1.0, **jl) if algo != "sgd" else None
    trainer = jb.JaxTrainer(TrainConfig(algo=algo, steps=2, batch_size=8, dp=dp), PerfConfig(backend="jax"))
    out = trainer.fit(_mlp(), x, y)
    return {n: q.detach().clone() for n, q in out.model.named_parameters()}


@pytest.mark.parametrize("algo", [pytest.param("dpsgd", marks=pytest.mark.slow), "sgd", "dpsgd-jl"])
def test_the_same_seed_gives_the_same_training_and_another_dropout_key_another(monkeypatch, algo):
    """Reproducibility: the dropout keys come from config.seed (seed + 4, :func:`_jax_key`), so the same seed gives
    the same parameters bit for bit; the same run with the dropout key alone changed (batches and noise equal) ends
    elsewhere, so the masks are drawn and used in training (private, DP-SGD-JL's forward-mode norms, and not)."""
    a, b = _fit(algo), _fit(algo)
    assert all(torch.equal(a[n], b[n]) for n in a)
    key = jb._jax_key
    monkeypatch.setattr(jb, "_jax_key", lambda seed, secure: key(seed + 1000 if seed == 4 else seed, secure))
    c = _fit(algo)
    assert max((a[n] - c[n]).abs().max().item() for n in a) > 1e-6


def test_the_mean_over_keys_of_the_training_output_is_the_eval_output():
    """Inverted dropout is unbiased: z(m) = W₂ (m ⊙ h)/(1 − p) + b₂ with m_j ~ Bernoulli(1 − p) i.i.d. has
    E[z] = W₂ h + b₂ (the eval output) and Var[z_k] = Σ_j W₂[k,j]² h_j² p/(1 − p). The mean over K = 4000 keys is
    within 5 standard deviations √(Var/K) of the eval output per coordinate (fixed keys: deterministic; a normal
    deviation over 5 sd has probability 6e-7). Plant: scaling by 1/p -> the mean is (1 − p)/p = 2.3 times too large."""
    p, K = 0.3, 4000
    model = _mlp(p)
    x = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        xj = jnp.asarray(x.numpy())
        outs = jax.vmap(lambda k: apply(params, xj, k))(jax.random.split(jax.random.key(7), K))
        mean, z0, sd = np.asarray(outs.mean(0)), np.asarray(apply(params, xj)), np.asarray(outs.std(0))
    with torch.no_grad():
        h = torch.tanh(model[0](x)).numpy()
    w2 = model[3].weight.detach().numpy()
    var = (h**2) @ (w2.T**2) * p / (1 - p)  # (n, classes)
    assert np.all(np.abs(mean - z0) <= 5 * np.sqrt(var / K))
    assert np.abs(sd - np.sqrt(var)).max() <= 0.1 * np.sqrt(var).max()  # it draws, with torch's variance


def test_dropout_of_p_one_is_zeros_of_p_zero_and_without_a_key_the_input():
    """torch.nn.functional.dropout: p = 1 zeroes every value in training (no 1/(1 − p) scaling; gradient 0, not NaN),
    p = 0 keeps every value unscaled; without a key (evaluation) any p is the identity. Plants: p = 1 as the identity
    or drawn with the 1/(1 − p) = ∞ scale -> the first assertions fail."""
    x = np.random.default_rng(0).normal(size=(3, 4))
    with jax.enable_x64(True):
        xj = jnp.asarray(x)
        with jb._dropout_key(jax.random.key(0)):
            zero = jb._dropout(xj, 1.0)
            grad = jax.grad(lambda v: jb._dropout(v, 1.0).sum())(xj)
            same = jb._dropout(xj, 0.0)
            functional = [np.asarray(jb._f_dropout(xj, 1.0)), np.asarray(jb._f_dropout(xj, 0.5, training=False))]
        np.testing.assert_array_equal(np.asarray(zero), F.dropout(torch.from_numpy(x), 1.0).numpy())
        assert np.all(np.asarray(zero) == 0) and np.all(np.asarray(grad) == 0)
        np.testing.assert_array_equal(np.asarray(same), x)
        # F.dropout in a forward: p = 1 zeroes, training=False (self.training as traced) is the identity
        np.testing.assert_array_equal(functional[0], np.zeros_like(x))
        np.testing.assert_array_equal(functional[1], x)
        np.testing.assert_array_equal(np.asarray(jb._dropout(xj, 0.5)), x)  # no key: the identity
    # A model whose dropouts all have p = 0 draws no mask, so it is no dropout model (batched forward, ghost clipping)
    for p, expected in ((0.0, False), (0.1, True)):
        assert jb._has_dropout(nn.Sequential(nn.Linear(4, 4), nn.Dropout(p))) is expected
        assert jb._has_dropout(nn.Sequential(nn.MultiheadAttention(4, 2, dropout=p))) is expected


def test_the_nth_site_drawn_under_a_key_draws_its_mask_under_fold_in_key_n():
    """The documented key schedule (_DROPOUT_KEY's comment): under a record's key, the n-th site that draws (p = 0
    draws nothing) keeps each value with probability 1 − p under fold_in(key, n), scaled by 1/(1 − p); so two sites
    of one shape draw different masks. Plants: the site counter not advanced (every site the same mask), advanced
    by 2, or a p = 0 site counted -> the masks are other draws."""
    key, x = jax.random.key(3), np.ones(64)
    with jax.enable_x64(True):
        with jb._dropout_key(key):
            outs = [np.asarray(jb._dropout(jnp.asarray(x), p)) for p in (0.0, 0.5, 0.5, 0.25)]
        for n, (out, p) in enumerate(zip(outs[1:], (0.5, 0.5, 0.25), strict=True)):
            keep = np.asarray(jax.random.bernoulli(jax.random.fold_in(key, n), 1.0 - p, x.shape))
            np.testing.assert_array_equal(out, np.where(keep, 1.0 / (1.0 - p), 0.0))
    assert not np.array_equal(outs[1], outs[2]) and np.array_equal(outs[0], x)


@pytest.mark.slow
def test_cli_trains_the_newcomers_encoder_layer_with_default_dropout_and_claims_torchs_epsilon(tmp_path, monkeypatch):
    """``train --backend jax --algo dpsgd --epsilon 3`` and otherwise the newcomer's defaults (--model-spec, --data,
    --out) on token data, the model an nn.TransformerEncoderLayer with torch's default dropout 0.1. Before: exit 2
    ("has dropout = 0.1 ... the JAX backend draws no dropout masks"). Now: exit 0 and the torch trainer's claim."""
    import json
    from pathlib import Path

    from dpaudit.training.algorithms import claim_for
    from dpaudit.training.run import configs_from_meta
    from tests.core.cli_errors import invoke

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", X=rng.integers(0, 10, size=(80, 7)), y=rng.integers(0, 2, 80))
    spec = {"kind": "python", "factory": "tests.core.byo_models:newcomer_encoder", "kwargs": {"vocab": 10,
            "n_classes": 2}, "input_shape": [7], "n_classes": 2}  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    r = invoke("train", "--backend", "jax", "--model-spec", tmp_path / "spec.json", "--data", tmp_path / "d.npz",
               "--algo", "dpsgd", "--epsilon", 3, "--out", tmp_path / "run")  # fmt: skip
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "run" / "checkpoint.json").read_text())
    config, perf = configs_from_meta(meta)
    assert perf.backend == "jax" and config.dp is not None
    assert meta["privacy"] == claim_for(config, meta["split"]["sizes"]["members"])
    assert abs(meta["privacy"]["epsilon"] - 3.0) < 1e-3
