"""JAX ghost clipping (issue 26 item 4): ``ghost_clipped_sum`` (no per-example gradients of the
Linear/Conv2d layers) against the ``vmap(grad)`` per-example oracle ``clipped_sum``."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from dpaudit.models import build_model, default_spec  # noqa: E402
from dpaudit.training import jax_backend as jb  # noqa: E402

CASES = [
    ("logreg", {}),
    ("mlp", {"hidden": (16, 8)}),
    # 8x8 input: the first conv instantiates (2T² = 8192 > p·d = 36), the second (T = 16 after the
    # pooling) takes the ghost norm (512 <= 36·32). The vmap oracle of a CNN compiles for ~30 s on one core.
    pytest.param("cnn", {"channels": (4, 32)}, marks=pytest.mark.slow),
    # both convs instantiated (T = 64, then 16 after pooling; p·d = 9·4, 36·4): per-example gradients by the
    # convolution's own weight gradient, the clipped sum from them (fast: small channels compile quickly)
    ("cnn", {"channels": (4, 4)}),
]


def _case(kind, options, n=9, dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    model = build_model(default_spec(kind, input_shape=(1, 8, 8), n_classes=3, **options), seed=1, dtype=dtype)
    return model, torch.randn(n, 1, 8, 8, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize(("kind", "options"), CASES)
def test_ghost_matches_the_vmap_oracle(kind, options):
    model, x, y = _case(kind, options)
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        _, norms = jb.clipped_sum(apply, params, xj, yj, 1.0)
        clip = float(np.min(norms) + np.max(norms)) / 2
        assert (np.asarray(norms) < clip).any() and (np.asarray(norms) > clip).any()
        mask = jnp.asarray(np.arange(len(x)) != 3)  # one padded slot: weight exactly 0
        ref, ref_norms = jb.clipped_sum(apply, params, xj, yj, clip, mask)
        got, got_norms = jb.ghost_clipped_sum(apply, params, xj, yj, clip, mask)
        np.testing.assert_allclose(np.asarray(got_norms), np.asarray(ref_norms), rtol=1e-10)
        assert set(got) == set(ref)
        for k in ref:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(ref[k]), rtol=1e-9, atol=1e-12, err_msg=k)


@pytest.mark.parametrize(
    ("c_in", "kernel", "stride", "padding", "side"),
    [(1, 3, 1, 1, 8), (3, 3, 2, 1, 9), (2, (3, 2), (2, 1), (0, 1), 7), (4, 5, 3, 2, 11)],
)
def test_patches_by_slicing_equal_jax_patches(c_in, kernel, stride, padding, side):
    """The ghost norms' im2col (strided slices of the padded input) equals JAX's
    conv_general_dilated_patches exactly, values and order, for strides, rectangular kernels, padding."""
    m = torch.nn.Conv2d(c_in, 2, kernel, stride=stride, padding=padding)
    a = jax.random.normal(jax.random.key(0), (3, c_in, side, side))
    ref = jax.lax.conv_general_dilated_patches(
        a, m.kernel_size, m.stride, tuple((p, p) for p in m.padding), dimension_numbers=("NCHW", "OIHW", "NCHW"),
        precision=jb.PRECISION,
    )  # fmt: skip
    got = jb._patches(m, a, ref.shape[2:])
    np.testing.assert_array_equal(np.asarray(got).reshape(ref.shape), np.asarray(ref))


# --- users' own modules (the torch.fx path): fx_ghost_clipped_sum against the vmap oracle -----------------------


class _UserMLP(torch.nn.Module):  # an MLP written as its own module: the fx path, not the zoo's layer list
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 16), torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x.flatten(1))))


class _UserCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(128, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.c2(torch.relu(self.c1(x)))).flatten(1))


class _ConvTwice(torch.nn.Module):
    """The three routes of a Conv2d's per-example norm. One Conv2d called twice (a block reused: its per-example
    gradient the sum over both calls) on 6x6 images, T = 72, 2T² > p·d = 18·2 and p > d: instantiated by the
    convolution's own weight gradient; a 1x1 Conv2d 2 -> 24 (p = 2 <= d: instantiated from its patches, reshaped to
    the kernel's layout); a stride-2 Conv2d at 3x3, T = 9, 2T² = 162 <= 216·12: the ghost Gram of its patches, and
    book-keeping. The instantiated ones' clipped sums are taken from their per-example gradients."""

    def __init__(self):
        super().__init__()
        self.c, self.u = torch.nn.Conv2d(2, 2, 3, padding=1), torch.nn.Conv2d(2, 24, 1)
        self.d, self.head = torch.nn.Conv2d(24, 12, 3, stride=2, padding=1), torch.nn.Linear(108, 3)

    def forward(self, x):
        h = torch.tanh(self.u(torch.tanh(self.c(torch.tanh(self.c(x))))))
        return self.head(torch.tanh(self.d(h)).flatten(1))


class _Traps(torch.nn.Module):
    """What ghost tapping of a graph can get wrong: token ids through an Embedding and a positional Embedding of
    torch.arange(T) (an input without the batch axis, the same for every example), a Linear applied to a learned
    query (no batch axis either) and broadcast, one Linear applied twice in a loop over (B, T, d) sequences (its
    gradient the sum over both uses and all positions), a bare nn.Parameter added in forward, LayerNorm affine."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(10, 8, padding_idx=0), torch.nn.Embedding(7, 8)
        self.query, self.q = torch.nn.Parameter(torch.randn(2, 8)), torch.nn.Linear(8, 8)
        self.mix, self.ln, self.shift = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Parameter(torch.randn(8))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, tok):
        h = self.tok(tok.long()) + self.pos(torch.arange(tok.shape[1]))
        h = h + self.q(self.query).mean(0)
        for _ in range(2):
            h = torch.tanh(self.mix(h)) + self.shift
        return self.head(self.ln(h).mean(1))


class _Tied(torch.nn.Module):
    """An Embedding reused as the output layer (a Linear module whose weight is the Embedding's)."""

    def __init__(self):
        super().__init__()
        self.emb, self.mix = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 10, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tok):
        return self.out(torch.tanh(self.mix(self.emb(tok.long()))).mean(1))


class _TiedLM(torch.nn.Module):
    """A GPT-style tied LM: token Embedding (padding_idx) whose weight is also the output Linear's (with a bias of its
    own), the head applied at every position (per-position logits, averaged): the Gram of the shared weight has
    Linear-Linear, Embedding-Embedding and cross blocks (2T² = 392 <= 30·16: the ghost Gram, not instantiated)."""

    def __init__(self, vocab=30, d=16):
        super().__init__()
        self.emb, self.mix = torch.nn.Embedding(vocab, d, padding_idx=0), torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, vocab)
        self.head.weight = self.emb.weight

    def forward(self, tok):
        return self.head(torch.tanh(self.mix(self.emb(tok.long())))).mean(1)


class _Attention(torch.nn.Module):
    """nn.MultiheadAttention called as self-attention and as cross-attention (key/value another sequence than the
    query, without biases): its packed in_proj's thirds and out_proj are tapped inside the layer (one graph node)."""

    def __init__(self):
        super().__init__()
        self.tok, self.head = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 3)
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.cross = torch.nn.MultiheadAttention(8, 2, batch_first=True, bias=False)

    def forward(self, tok):
        h = self.tok(tok.long())
        h = h + self.attn(h, h, h, need_weights=False)[0]
        m = torch.tanh(h)
        return self.head((h + self.cross(h, m, m, need_weights=False)[0]).mean(1))


class _SharedLayer(torch.nn.Module):
    """A TransformerEncoder whose two layers are one module object (layers [l, l]): every weight inside read twice in
    one graph node, so its sub-taps' paths name one weight twice: not ghosted (vmap), never one use's norm alone."""

    def __init__(self):
        super().__init__()
        self.tok, self.head = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 3)
        layer = torch.nn.TransformerEncoderLayer(8, 2, 8, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.enc.layers = torch.nn.ModuleList([layer, layer])

    def forward(self, tok):
        return self.head(self.enc(self.tok(tok.long())).mean(1))


def _lm_ids(n=9, vocab=30):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (n, 7), generator=g).double(), torch.randint(0, vocab, (n,), generator=g)


def _images(n=9):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def _small_images(n=9):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 2, 6, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def _ids(n=9, classes=3):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 10, (n, 7), generator=g).double(), torch.randint(0, classes, (n,), generator=g)


def _from_byo(name, *args):
    from tests.core import byo_models as byo

    return lambda: getattr(byo, name)(*args)


FX_CASES = {  # name: (model, data, the modules fx_ghost_clipped_sum taps)
    "mlp": (_UserMLP, _images, {"a", "b"}),
    "conv-twice": (_ConvTwice, _small_images, {"c", "u", "d", "head"}),
    "traps": (_Traps, _ids, {"tok", "pos", "q", "mix", "head"}),
    # emb/out share one weight: one group (8 positions, 2T² > 10·8: the shared gradient instantiated)
    "tied": (_Tied, partial(_ids, classes=10), {"emb", "mix", "out"}),
    "tied-lm": (_TiedLM, _lm_ids, {"emb", "mix", "head"}),
    "attention": (_Attention, _ids, {"tok", "attn", "attn.out_proj", "cross", "cross.out_proj", "head"}),
    "shared-layer": (_SharedLayer, _ids, {"tok", "head"}),
    "arange-transformer": (
        _from_byo("tiny_transformer", 10, 3),
        _ids,
        {"tok", "pos", "qkv", "proj", "mlp.0", "mlp.2", "head"},
    ),
    "cnn": (_UserCNN, _images, {"c1", "c2", "head"}),
    "groupnorm-residual-cnn": (_from_byo("residual_groupnorm_cnn", 1, 3), _images, None),
    "mha": (_from_byo("mha_transformer", 10, 7, 3), _ids, None),
    "encoder-layer": (_from_byo("encoder_transformer", 10, 7, 3), _ids, None),
}
# the vmap oracle compiles for 10-40 s on one shared core
_FX_SLOW = {"arange-transformer", "cnn", "groupnorm-residual-cnn", "mha", "encoder-layer", "shared-layer"}


def _fx_compare(make, data, clip_at=0.5, keys=None):
    torch.manual_seed(0)
    model = make().double()
    x, y = data()
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        assert isinstance(apply, jb.FxModel)
        xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        _, norms = jb.clipped_sum(apply, params, xj, yj, 1.0, None, keys)
        clip = float(np.quantile(np.asarray(norms), clip_at))  # both branches of the clip run
        mask = jnp.asarray(np.arange(len(x)) != 3)  # one padded slot: weight exactly 0
        ref, ref_norms = jb.clipped_sum(apply, params, xj, yj, clip, mask, keys)
        got, got_norms = jb.fx_ghost_clipped_sum(apply, params, xj, yj, clip, mask, keys)
        np.testing.assert_allclose(np.asarray(got_norms), np.asarray(ref_norms), rtol=1e-10)
        assert list(got) == list(ref)
        scale = max(float(jnp.max(jnp.abs(v))) for v in ref.values())  # a gradient that is 0 up to rounding
        for k in ref:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(ref[k]), rtol=1e-9, atol=1e-12 * scale, err_msg=k)
    return model, apply


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _FX_SLOW else n for n in FX_CASES])
def test_fx_ghost_matches_the_vmap_oracle(name):
    """Users' own modules: ghost norms and book-keeping of their Linear, Conv2d and Embedding modules, per-example
    gradients of the rest, equal clipped_sum's vmap(grad) in float64 (rounding ~1e-15; a wrong term is O(1)).
    Planted and caught: a tied weight's cross terms dropped (Gram: tied-lm; instantiated: tied), a tied weight's
    Linear or Embedding use dropped from its norm (tied, tied-lm), a loop's Linear's norms summed
    per use or its second use dropped, an Embedding's norm dropped, the positions summed before the square."""
    make, data, tapped = FX_CASES[name]
    model, apply = _fx_compare(make, data)
    got = {n for n, m in model.named_modules() if any(m is u for g in apply.ghost_groups for u in g.modules)}
    assert got == tapped if tapped is not None else got


def test_a_layer_object_listed_twice_in_a_block_is_not_ghosted():
    """The graph alone (no oracle compile): a TransformerEncoder's layers [l, l] read each weight twice in one node;
    grouping by module object (named_modules' default dedup) would tap one use and take its norm for the weight's.
    Planted and caught: named_modules without remove_duplicate=False in _block_groups."""
    with jax.enable_x64(True):
        apply = jb.jax_forward(_SharedLayer().double())
    assert {g.weight for g in apply.ghost_groups} == {"tok.weight", "head.weight"}


@pytest.mark.slow  # ~60-110 s (torch's encoder layer, vmapped with keys, compiled twice)
def test_fx_ghost_with_dropout_keys_matches_the_vmap_oracle():
    """A model with dropout: each example through the graph alone under its own key, as clipped_sum's."""
    from tests.core import byo_models as byo

    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(9))
    _, apply = _fx_compare(lambda: byo.NewcomerEncoder(10, 3), _ids, keys=keys)
    assert apply.dropout and apply.ghost_groups


@pytest.mark.parametrize(
    ("make", "path"),
    [
        (lambda: _case("mlp", {"hidden": (8,)})[:2], "ghost_clipped_sum"),
        (lambda: (_Traps(), _ids()[0]), "fx_ghost_clipped_sum"),
    ],
)
def test_the_trainer_uses_ghost_for_dp_steps(monkeypatch, make, path):
    """The zoo's layer list by ghost_clipped_sum, a user's module by fx_ghost_clipped_sum: the clipped sum of vmap."""
    from dpaudit.training.config import TrainConfig

    calls, real = [], getattr(jb, path)
    monkeypatch.setattr(jb, path, lambda *a: calls.append(a) or real(*a))
    torch.manual_seed(0)
    model, x = make()
    model, y = model.double(), torch.randint(0, 3, (len(x),), generator=torch.Generator().manual_seed(2))
    with jax.enable_x64(True):
        apply, params = jb.jax_forward(model), jb.params_from_torch(model)
        prog = jb.StepProgram(apply, params, TrainConfig(), kind="dp", optimizer="sgd", clip=0.3)
        xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        idx, mask = jb._padded(np.arange(len(x)), 16)
        got = prog.chunk(params, xj, yj, jnp.asarray(idx), jnp.asarray(mask), 0)
        ref, _ = jb.clipped_sum(apply, params, xj[idx], yj[idx], 0.3, jnp.asarray(mask))
        for k in ref:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(ref[k]), rtol=1e-9, atol=1e-12)
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("emb_ts", "lin_ts", "padding_idx"),
    [
        ((3,), (), None),  # one Embedding call, Gram form (T² <= rows·cols)
        ((3, 2), (), 0),  # an Embedding called twice, padding ids giving no gradient
        ((3,), (2,), 0),  # tied: the Embedding's weight is also the output Linear's (2T² <= rows·cols)
        ((12,), (), None),  # the per-example gradient instantiated (T² > rows·cols)
        ((10,), (8,), 0),  # tied, instantiated (2T² > rows·cols)
        ((3,), (2, 1), None),  # tied, the output Linear called twice: its positions concatenated
        ((10,), (5, 3), 0),  # the same, instantiated
        ((), (3, 2), None),  # Linear calls only: _linear_sq_norm
    ],
)
def test_a_shared_weights_per_example_norm_is_that_of_its_summed_gradient(emb_ts, lin_ts, padding_idx):
    """_shared_weight_sq_norm against the per-example gradient of the shared (rows, cols) weight written out: each
    Embedding position adds its output gradient g_t to row id_t (none at padding_idx), each Linear position adds
    g_t a_tᵀ, and the norm is that of the sum over every use (the cross terms between uses included), in both the
    Gram form and the instantiated one (Li et al. 2021 §4; Bu et al. 2022). Mutation pass 24 (jaxtied's tied
    Gram): the function was reached only through fx_ghost_clipped_sum's compiled graphs (slow-marked cases)."""
    rows, cols, B = 16, 8, 2  # B differs from every case's count of Embedding positions
    rng = np.random.default_rng(0)
    emb = torch.nn.Embedding(rows, cols, padding_idx=padding_idx)
    lin = torch.nn.Linear(cols, rows, bias=False)
    uses, want = [], np.zeros((B, rows, cols))
    for t in emb_ts:
        ids = rng.integers(0, rows, (B, t))
        ids[:, 0] = 0  # every example has an id 0 (padding, where padding_idx is 0) and repeats among the rest
        g = rng.normal(size=(B, t, cols)).astype(np.float32)
        uses.append((emb, jnp.asarray(ids), jnp.asarray(g)))
        for b in range(B):
            for p in range(t):
                if ids[b, p] != padding_idx:
                    want[b, ids[b, p]] += g[b, p]
    for t in lin_ts:
        a = rng.normal(size=(B, t, cols)).astype(np.float32)
        g = rng.normal(size=(B, t, rows)).astype(np.float32)
        uses.append((lin, jnp.asarray(a), jnp.asarray(g)))
        want += np.einsum("btr,btc->brc", g.astype(np.float64), a.astype(np.float64))
    sq, per = jb._shared_weight_sq_norm(uses, (rows, cols))
    # float32 sums of at most (12 + 8)² products: relative error well below 1e-4
    np.testing.assert_allclose(np.asarray(sq, np.float64), np.square(want).sum((1, 2)), rtol=1e-4)
    T = sum(emb_ts) + sum(lin_ts)
    if emb_ts:  # the instantiated form returns the per-example gradient the clipped sum then weights (jaxperf)
        assert (per is not None) == ((2 if lin_ts else 1) * T * T > rows * cols)
    if per is not None:
        np.testing.assert_allclose(np.asarray(per, np.float64), want, rtol=1e-4, atol=1e-5)
