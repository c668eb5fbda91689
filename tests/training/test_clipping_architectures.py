"""Per-example clipping on architectures users bring (issue 24 item 2, issue 26 items 1-2).

Every method, and ``auto``'s choice, against the loop clipper's clipped sum (the oracle), in float64
at ``RTOL = 1e-6``: a residual CNN with GroupNorm, a transformer classifier whose positional
embedding is called on ``torch.arange(T)`` (a layer whose input has no batch dimension), a model
with a tied weight (embedding = output head), a module with a bare ``nn.Parameter`` used in
``forward``, ``nn.MultiheadAttention`` (packed in-projection) in both batch layouts, and attention
built from Linear layers and ``scaled_dot_product_attention``.

``GhostClipper(model, check=False)`` runs the ghost plan without its first-call check (which would
reroute a wrong layer to a vmap and so hide the mistake): these tests are the ones that catch a
wrong ghost rule. The ``describe()`` assertions pin the route each layer takes, so a layer that
silently leaves the ghost path fails too.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dpaudit.errors import InputError
from dpaudit.training import clipping
from dpaudit.training.clipping import GhostClipper, LoopClipper, make_clipper

RTOL = 1e-6  # float64: the methods differ by rounding only (observed ~1e-14)
N = 6


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-300))


class ResidualGroupNormCNN(nn.Module):
    """A small ResNet-style CNN: conv stem, one residual block with GroupNorm, pooled linear head."""

    def __init__(self, width: int = 8, n_classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.gn1 = nn.GroupNorm(2, width)
        self.conv1 = nn.Conv2d(width, width, 3, padding=1)
        self.gn2 = nn.GroupNorm(2, width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.down = nn.Conv2d(width, 2 * width, 1, stride=2)
        self.head = nn.Linear(2 * width, n_classes)

    def forward(self, x):
        h = F.relu(self.gn1(self.stem(x)))
        h = h + self.conv2(F.relu(self.gn2(self.conv1(h))))  # residual connection
        return self.head(self.down(F.relu(h)).mean((2, 3)))


class SelfAttention(nn.Module):
    """Attention from Linear layers and F.scaled_dot_product_attention (no parameters of its own)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(B, T, d))


class ArangeTransformer(nn.Module):
    """A transformer classifier as most code writes it: positions are ``arange(T)`` (no batch dim)."""

    def __init__(self, vocab: int = 11, d: int = 8, T: int = 5, n_classes: int = 3, attention: str = "sdpa") -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(T, d)
        self.ln1 = nn.LayerNorm(d)
        self.attention = attention
        self.attn = SelfAttention(d, 2) if attention == "sdpa" else nn.MultiheadAttention(d, 2, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, n_classes)

    def forward(self, tok):
        h = self.tok(tok) + self.pos(torch.arange(tok.shape[1], device=tok.device))
        a = self.ln1(h)
        h = h + (self.attn(a) if self.attention == "sdpa" else self.attn(a, a, a, need_weights=False)[0])
        h = h + self.mlp(self.ln2(h))
        return self.head(h.mean(1))


class TiedLM(nn.Module):
    """Token classifier whose output head is the embedding matrix (weight tying), as a module
    (``head.weight = emb.weight``) or functionally (``h @ emb.weight.T``)."""

    def __init__(self, vocab: int = 9, d: int = 6, functional: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.functional = functional
        if not functional:
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.emb.weight

    def forward(self, tok):
        h = torch.tanh(self.mix(self.emb(tok))).mean(1)
        return h @ self.emb.weight.T if self.functional else self.head(h)


class BareParameter(nn.Module):
    """A learned positional table, a CLS token and a scale used directly in ``forward``."""

    def __init__(self, d: int = 6, T: int = 4, n_classes: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(5, d)
        self.pos = nn.Parameter(torch.randn(T, d) * 0.5)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.5)
        self.block = ScaledBlock(d)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x):
        h = self.inp(x) + self.pos  # (B, T, d) + (T, d)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], dim=1)
        return self.head(self.block(h)[:, 0])


class ScaledBlock(nn.Module):
    """A submodule owning a bare parameter and a Linear child."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, d))
        self.lin = nn.Linear(d, d)

    def forward(self, h):
        return torch.tanh(self.lin(h) * self.gain) + h


class ViTBlock(nn.Module):
    """A pre-LN transformer block: attention (nn.MultiheadAttention or hand-written) and an MLP."""

    def __init__(self, d: int, heads: int, attention: str) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attention = attention
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True) if attention == "mha" else SelfAttention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, h):
        a = self.ln1(h)
        h = h + (self.attn(a, a, a, need_weights=False)[0] if self.attention == "mha" else self.attn(a))
        return h + self.mlp(self.ln2(h))


class TinyViT(nn.Module):
    """timm's VisionTransformer in small: a patch-embedding Conv2d, then a cls token and a learned
    (1, N+1, d) position embedding that are bare parameters of the model itself, used as timm does
    (``cat((cls_token.expand(B, -1, -1), x), 1) + pos_embed``), pre-LN blocks, the head on the cls token.
    The hand-written variant has a GroupNorm after the patch embedding."""

    def __init__(self, d: int = 8, size: int = 4, patch: int = 2, depth: int = 2, attention: str = "mha") -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.gn = nn.GroupNorm(2, d) if attention != "mha" else nn.Identity()
        self.cls_token = nn.Parameter(torch.randn(1, 1, d) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, d) * 0.5)
        self.blocks = nn.Sequential(*(ViTBlock(d, 2, attention) for _ in range(depth)))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = self.gn(self.patch(x)).flatten(2).transpose(1, 2)  # (B, N, d)
        h = torch.cat((self.cls_token.expand(h.shape[0], -1, -1), h), dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(h))[:, 0])


class WpeGPT(nn.Module):
    """GPT-style: a bare (T_max, d) position table sliced to the sequence (``wpe[:T]``, T < T_max),
    token embedding tied to the output head (logits of the last position)."""

    def __init__(self, vocab: int = 9, d: int = 8, t_max: int = 7) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.wpe = nn.Parameter(torch.randn(t_max, d) * 0.5)
        self.ln = nn.LayerNorm(d)
        self.attn = SelfAttention(d, 2)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, tok):
        h = self.tok(tok) + self.wpe[: tok.shape[1]]
        h = h + self.attn(self.ln(h))
        return self.head(h[:, -1])


class BareTwice(nn.Module):
    """A bare (d,) offset added in two places (broadcast over the positions), a bare scalar gain, and
    with ``matmul`` a bare (d, d) matrix used in a matmul (no broadcast rule: the vmap over the model)."""

    def __init__(self, d: int = 6, matmul: bool = False) -> None:
        super().__init__()
        self.inp, self.lin, self.head = nn.Linear(5, d), nn.Linear(d, d), nn.Linear(d, 3)
        self.offset = nn.Parameter(torch.randn(d) * 0.5)
        self.gain = nn.Parameter(torch.tensor(1.3))
        self.mix = nn.Parameter(torch.randn(d, d) * 0.5) if matmul else None

    def forward(self, x):
        h = self.inp(x) + self.offset
        if self.mix is not None:
            h = h @ self.mix
        h = self.lin(torch.tanh(h)) * self.gain + self.offset
        return self.head(torch.tanh(h).mean(1))


class SeqFirstMHA(nn.Module):
    """nn.MultiheadAttention in its default (T, B, d) layout, with a key padding mask (batch at dim 0)."""

    def __init__(self, d: int = 8, n_classes: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(4, d)
        self.attn = nn.MultiheadAttention(d, 2)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x):
        h = self.inp(x).transpose(0, 1)  # (T, B, d)
        mask = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool, device=x.device)
        mask[:, -1] = True
        o, _ = self.attn(h, h, h, key_padding_mask=mask)
        return self.head(o.mean(0))


def _case(name: str):
    g = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    if name == "resnet-groupnorm":
        model, x = ResidualGroupNormCNN(), torch.randn(N, 3, 8, 8, generator=g)
    elif name == "transformer-arange":
        model, x = ArangeTransformer(), torch.randint(0, 11, (N, 5), generator=g)
    elif name == "transformer-mha":
        model, x = ArangeTransformer(attention="mha"), torch.randint(0, 11, (N, 5), generator=g)
    elif name == "tied-module":
        model, x = TiedLM(), torch.randint(0, 9, (N, 4), generator=g)
    elif name == "tied-functional":
        model, x = TiedLM(functional=True), torch.randint(0, 9, (N, 4), generator=g)
    elif name == "bare-parameter":
        model, x = BareParameter(), torch.randn(N, 4, 5, generator=g)
    elif name == "mha-seq-first":
        model, x = SeqFirstMHA(), torch.randn(N, 5, 4, generator=g)
    elif name == "vit-mha":
        model, x = TinyViT(), torch.randn(N, 3, 4, 4, generator=g)
    elif name == "vit-handwritten":
        model, x = TinyViT(attention="sdpa"), torch.randn(N, 3, 4, 4, generator=g)
    elif name == "gpt-wpe":
        model, x = WpeGPT(), torch.randint(0, 9, (N, 5), generator=g)
    elif name == "bare-twice":
        model, x = BareTwice(), torch.randn(N, 4, 5, generator=g)
    elif name == "bare-matmul":
        model, x = BareTwice(matmul=True), torch.randn(N, 4, 5, generator=g)
    else:
        raise KeyError(name)
    model = model.double().eval()
    x = x.double() if x.is_floating_point() else x
    n_classes = 9 if name.startswith(("tied", "gpt")) else 3
    return model, x, torch.randint(0, n_classes, (N,), generator=g)


CASES = [
    "resnet-groupnorm",
    "transformer-arange",
    "transformer-mha",
    "tied-module",
    "tied-functional",
    "bare-parameter",
    "mha-seq-first",
    "vit-mha",
    "vit-handwritten",
    "gpt-wpe",
    "bare-twice",
    "bare-matmul",
]


@pytest.fixture(scope="module")
def oracle():
    """Per case: model, batch, a clip norm between the smallest and largest per-example norm, and
    the loop clipper's result (the oracle)."""
    return {name: _with_oracle(*_case(name)) for name in CASES}


def _with_oracle(model, x, y):
    """(model, x, y, clip, the loop clipper's result at clip), clip between the smallest and largest
    per-example norm, so that both branches of the clip factor run."""
    norms = LoopClipper(model)(x, y, 1.0).norms
    clip = float(norms.min() + norms.max()) / 2
    assert (norms < clip).any() and (norms > clip).any()
    return model, x, y, clip, LoopClipper(model)(x, y, clip)


def assert_oracle(clipper, case) -> None:
    _, x, y, clip, ref = case
    got = clipper(x, y, clip)
    assert _rel(got.norms, ref.norms) < RTOL
    for g, r in zip(got.grads, ref.grads, strict=True):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert _rel(g, r) < RTOL


@pytest.mark.parametrize("name", [c for c in CASES if c != "tied-functional"])  # hooks cannot see that use
def test_ghost_plan_without_its_check_matches_the_loop(oracle, name):
    model = oracle[name][0]
    assert_oracle(GhostClipper(model, check=False), oracle[name])


@pytest.mark.parametrize("method", ["auto", "ghost", "vmap"])
@pytest.mark.parametrize("name", CASES)
def test_every_method_matches_the_loop(oracle, name, method):
    assert_oracle(make_clipper(oracle[name][0], method), oracle[name])


def _layers(name: str, oracle) -> dict[str, str]:
    model, x, y, clip, _ = oracle[name]
    clipper = make_clipper(model, "auto")
    clipper(x, y, clip)
    desc = clipper.describe()
    assert desc["method"] == "ghost" and desc["requested"] == "auto", desc
    return desc["layers"]


def test_resnet_every_layer_on_the_ghost_path(oracle):
    layers = _layers("resnet-groupnorm", oracle)
    assert set(layers) == {"stem", "gn1", "conv1", "gn2", "conv2", "down", "head"}
    assert not any(v.startswith("vmap") for v in layers.values())
    # 8x8 images, T = 64 positions: 2T² = 8192 > p·d = 72·8 for a 3x3 convolution of 8 channels,
    # so the cost model instantiates; the pooled head is rank one.
    assert layers["conv1"] == "instantiate by grouped convolution (T=64: 2T²=8192 > p·d=576)"  # the CPU default
    assert layers["head"] == "rank-one"
    assert layers["gn1"] == "per-example (small)"


def test_arange_positional_embedding_stays_on_the_ghost_path(oracle):
    layers = _layers("transformer-arange", oracle)
    assert layers["pos"].startswith("ghost-norm") and layers["tok"].startswith("ghost-norm")
    assert layers["attn.qkv"].startswith("ghost-norm (T=5")
    assert not any(v.startswith("vmap") for v in layers.values())


def test_multihead_attention_routes(oracle):
    params = "in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias"
    # The plain self-attention call: per-example gradients by recomputing the attention (no vmap).
    layers = _layers("transformer-mha", oracle)
    assert layers["attn"] == f"per-example by recomputing the attention: {params}", layers
    assert not any(v.startswith("vmap") for v in layers.values())
    # With a key padding mask (and the default need_weights): the same recompute, the mask and the
    # weights through torch's own attention code (_mha_general_per_example); no vmap either.
    layers = _layers("mha-seq-first", oracle)
    assert layers["attn"] == f"per-example by recomputing the attention: {params}", layers
    assert not any(v.startswith("vmap") for v in layers.values())


def test_tied_weights_get_the_norm_of_the_sum_of_their_uses(oracle):
    # T = 4 token positions + 1 head position: 2T² = 50 <= p·d = 9·6, so the norm of the sum of the
    # two uses comes from ghost norms and cross terms (exactness: the oracle tests above).
    layers = _layers("tied-module", oracle)
    how = "ghost-norm over its 2 uses with cross terms (T=5: 2T²=50 <= p·d=54) (tied: emb, head)"
    assert layers["emb.weight"] == how
    assert not any(v.startswith("vmap") for v in layers.values())
    # Used functionally outside the embedding's forward: found by the first-call check and moved to
    # a vmap over the model; the rest stays on the ghost path.
    layers = _layers("tied-functional", oracle)
    assert layers["(model)"] == "vmap over the model: emb.weight" and layers["mix"].startswith("ghost-norm")
    # A vocabulary too small for the ghost side (2T² = 50 > 3·2): each use instantiated and summed.
    torch.manual_seed(2)
    model = TiedLM(vocab=3, d=2).double()
    x, y = torch.randint(0, 3, (N, 4)), torch.randint(0, 3, (N,))
    clipper = GhostClipper(model, check=False)
    assert_oracle(clipper, _with_oracle(model, x, y))
    assert clipper.describe()["layers"]["emb.weight"] == "instantiate, summed over its uses (tied: emb, head)"


class TiedPerPosition(nn.Module):
    """The tied head applied at every position (a language-model head): both uses have T = 4, and
    the positions' logits are weighted differently, so their output gradients differ."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 12)
        self.mix = nn.Linear(12, 12)
        self.head = nn.Linear(12, 11, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("w", torch.linspace(0.5, 2.0, 4).unsqueeze(1))

    def forward(self, tok):
        return (self.head(torch.tanh(self.mix(self.emb(tok)))) * self.w).sum(1)


def test_tied_weight_used_at_every_position():
    torch.manual_seed(6)
    model = TiedPerPosition().double()
    x, y = torch.randint(0, 11, (N, 4)), torch.randint(0, 11, (N,))
    clipper = GhostClipper(model, check=False)
    assert_oracle(clipper, _with_oracle(model, x, y))
    how = "ghost-norm over its 2 uses with cross terms (T=8: 2T²=128 <= p·d=132) (tied: emb, head)"
    assert clipper.describe()["layers"]["emb.weight"] == how


def test_bare_parameters(oracle):
    layers = _layers("bare-parameter", oracle)
    assert "(model)" not in layers  # no vmap over the model left
    assert layers["pos"] == "per-example from its 1 use(s) broadcast against the batch (add)"
    assert layers["cls"] == "per-example from its 1 use(s) broadcast against the batch (expand)"
    assert layers["block"] == "vmap over the module: gain"
    assert layers["inp"].startswith("instantiate") and layers["block.lin"].startswith("instantiate")


class TwoCosts(nn.Module):
    """One sequence, two Linear layers on the cost model's two sides: 2T² = 800 > 3·4 (instantiate)
    and 2T² = 800 <= 32·32 (ghost norm), in the same backward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.narrow = nn.Linear(3, 32)
        self.wide = nn.Linear(32, 32)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.wide(torch.tanh(self.narrow(x)))).mean(1))


def test_mixed_per_layer_choice_in_one_pass():
    torch.manual_seed(3)
    model = TwoCosts().double()
    x, y = torch.randn(N, 20, 3, dtype=torch.float64), torch.randint(0, 3, (N,))
    case = _with_oracle(model, x, y)
    clipper = GhostClipper(model, check=False)
    assert_oracle(clipper, case)
    layers = clipper.describe()["layers"]
    assert layers["narrow"] == "instantiate (T=20: 2T²=800 > p·d=96)"
    assert layers["wide"] == "ghost-norm (T=20: 2T²=800 <= p·d=1024)"
    assert layers["head"] == "rank-one"


class ChunkedConvs(nn.Module):
    """Two convolutions whose unfolded patches outgrow their inputs (3x3, stride 1): one on the
    instantiate side (T = 36: 2T² > p·d = 27·4), one on the ghost side (T = 4: 2T² <= 36·16)."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Conv2d(3, 4, 3, padding=1)
        self.deep = nn.Conv2d(4, 16, 3, padding=1)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = F.avg_pool2d(torch.tanh(self.wide(x)), 3)  # 6x6 -> 2x2
        return self.head(torch.tanh(self.deep(h)).mean((2, 3)))


def test_convolutions_in_chunks_of_examples_match_the_loop(monkeypatch):
    # Patches are built a chunk of examples at a time (at most the memory of the layer's input);
    # with the chunk floor at 1 both convolutions run one example per chunk, on both cost sides.
    from dpaudit.training.clipping import _Conv2dHandler

    monkeypatch.setattr(_Conv2dHandler, "MIN_CHUNK", 1)
    monkeypatch.setattr(_Conv2dHandler, "CHUNK_ELEMENTS", 0)
    torch.manual_seed(5)
    model = ChunkedConvs().double()
    x, y = torch.randn(N, 3, 6, 6, dtype=torch.float64), torch.randint(0, 3, (N,))
    clipper = GhostClipper(model, check=False, conv_route="patches")
    assert_oracle(clipper, _with_oracle(model, x, y))
    layers = clipper.describe()["layers"]
    assert layers["wide"] == "instantiate by patches (T=36: 2T²=2592 > p·d=108), in chunks of 1 examples"
    assert layers["deep"] == "ghost-norm (T=4: 2T²=32 <= p·d=576), in chunks of 1 examples"


def test_shared_input_counted_once_not_once_per_example():
    """A Linear applied to a batch-less tensor: its per-example gradient is g_i contracted with the
    shared input, and the clipped sum Σ_i c_i g_i aᵀ has each example once. Here every example has
    the same output gradient direction, so the clipped sum is exactly B·min(1, C/‖g‖)·g aᵀ."""

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(3, 4, bias=False)
            self.register_buffer("a", torch.ones(2, 3, dtype=torch.float64))

        def forward(self, x):
            return (x.unsqueeze(1) * self.q(self.a)).sum(1)  # (B, 2, 4) * (2, 4) -> (B, 4)

    model = Shared().double()
    x = torch.ones(5, 4, dtype=torch.float64)
    y = torch.zeros(5, dtype=torch.long)
    ref = LoopClipper(model)(x, y, 0.1)
    got = GhostClipper(model, check=False)(x, y, 0.1)
    assert _rel(got.grads[0], ref.grads[0]) < RTOL and _rel(got.norms, ref.norms) < RTOL
    # Each example is clipped to norm C = 0.1: the sum over 5 identical examples has norm 0.5.
    assert math.isclose(float(got.grads[0].norm()), 0.5, rel_tol=RTOL)


def test_a_wrong_ghost_rule_is_rerouted_by_the_check(monkeypatch, oracle):
    """The first-call check is the safety net: a planted wrong rule (a LayerNorm gradient scaled by
    2) sends that layer to a vmap (still exact), and without the check the result is wrong."""
    from dpaudit.training import clipping

    model, x, y, clip, ref = oracle["transformer-arange"]
    real = clipping._LayerNormHandler.part

    def wrong(module, inputs, grads, names):
        return real(module, inputs, [2 * g for g in grads], names)

    monkeypatch.setattr(clipping._LayerNormHandler, "part", staticmethod(wrong))
    checked = GhostClipper(model)
    assert_oracle(checked, oracle["transformer-arange"])
    assert checked.describe()["layers"]["(model)"].startswith("vmap over the model: ln1.weight")
    unchecked = GhostClipper(model, check=False)(x, y, clip)
    assert _rel(unchecked.norms, ref.norms) > 1e-3


def test_auto_falls_back_to_the_loop_when_vmap_cannot_run():
    class DataDependent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 2)
            self.scale = nn.Parameter(torch.eye(2))  # in a matmul: ghost needs a vmap over the model for it

        def forward(self, x):
            h = self.lin(x) @ self.scale
            return h if float(h.sum()) > -1e9 else -h  # a Python branch on data: vmap cannot trace it

    model = DataDependent().double()
    x, y = torch.randn(N, 3, dtype=torch.float64), torch.randint(0, 2, (N,))
    clipper = make_clipper(model, "auto")
    ref = LoopClipper(model)(x, y, 0.5)
    got = clipper(x, y, 0.5)
    for g, r in zip(got.grads, ref.grads, strict=True):
        assert _rel(g, r) < RTOL
    desc = clipper.describe()
    assert desc["method"] == "loop" and [t.split(":")[0] for t in desc["tried"]] == ["ghost", "vmap"]


def test_auto_switches_to_vmap_when_a_later_batch_changes_the_call_pattern():
    class Variable(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.head = nn.Linear(3, 2)

        def forward(self, x):
            h = x
            for _ in range(1 if x.shape[0] < 5 else 2):  # depends on the batch size only
                h = torch.tanh(self.lin(h))
            return self.head(h)

    model = Variable().double()
    x, y = torch.randn(N, 3, dtype=torch.float64), torch.randint(0, 2, (N,))
    clipper = make_clipper(model, "auto")
    clipper(x[:4], y[:4], 0.5)
    assert clipper.describe()["method"] == "ghost"
    got = clipper(x, y, 0.5)  # 6 examples: lin is called twice, not as planned
    ref = LoopClipper(model)(x, y, 0.5)
    for g, r in zip(got.grads, ref.grads, strict=True):
        assert _rel(g, r) < RTOL
    assert clipper.describe()["method"] == "vmap" and clipper.describe()["tried"][0].startswith("ghost (later")


@pytest.mark.parametrize("method", ["ghost", "vmap", "loop", "auto"])
@pytest.mark.parametrize("name", ["resnet-groupnorm", "transformer-arange", "tied-module"])
def test_padding_rows_add_exactly_nothing(oracle, name, method):
    """A padded physical batch (issue 26, variable Poisson sizes): rows after ``valid`` get clip
    factor 0, so the clipped sum equals the unpadded one to rounding (float64, 1e-12) and their
    norms are not returned. The padding rows here are large (x 1e3 for real features: norms far
    above C, so an unmasked row would dominate the sum) to make a leak visible."""
    model, x, y, clip, ref = oracle[name]
    pad = x[[1, 0, 1]] * 1e3 if x.is_floating_point() else x[[1, 0, 1]].flip(1)
    xp, yp = torch.cat([x, pad]), torch.cat([y, y[[2, 0, 1]]])
    clipper = GhostClipper(model, check=False) if method == "ghost" else make_clipper(model, method)
    got = clipper(xp, yp, clip, valid=N)
    assert got.norms.shape == (N,) and _rel(got.norms, ref.norms) < 1e-12
    for g, r in zip(got.grads, ref.grads, strict=True):
        assert _rel(g, r) < 1e-12
    assert torch.equal(clipper(x, y, clip, valid=0).grads[0], torch.zeros_like(ref.grads[0]))
    with pytest.raises(InputError, match="valid"):
        clipper(x, y, clip, valid=N + 1)


@pytest.mark.parametrize("pool", [0, 1 << 30])
def test_pooled_and_separate_per_example_gradients_agree(monkeypatch, oracle, pool):
    """Small per-example gradients are pooled into one matrix for their norms and clipped sums
    (_PerExample): pooling none (POOL = 0) and everything must both give the loop's result."""
    monkeypatch.setattr(clipping._PerExample, "POOL", pool)
    for name in ("resnet-groupnorm", "transformer-mha", "tied-module"):
        assert_oracle(GhostClipper(oracle[name][0], check=False), oracle[name])


class TwiceMHA(nn.Module):
    """One ``nn.MultiheadAttention`` called twice in a forward (weights shared across two layers)."""

    def __init__(self, d: int = 8, n_classes: int = 3) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x):
        h = x + self.attn(x, x, x, need_weights=False)[0]
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.head(h.mean(1))


def test_multihead_attention_called_twice_adds_both_calls():
    torch.manual_seed(0)
    model = TwiceMHA().double()
    x, y = torch.randn(N, 5, 8, dtype=torch.float64), torch.randint(0, 3, (N,))
    clipper = GhostClipper(model, check=False)
    assert_oracle(clipper, _with_oracle(model, x, y))
    assert clipper.describe()["layers"]["attn"].startswith("per-example by recomputing the attention")


# ------------------------------------- bare parameters of the model itself: broadcast uses, not a vmap


def test_vit_and_gpt_bare_parameters_leave_the_vmap_over_the_model(oracle):
    """A ViT's cls token and position embedding, a GPT's sliced ``wpe``, an offset used twice and a
    scalar gain get per-example gradients from their broadcast uses; a matrix in a matmul stays on the
    vmap over the model (and the notes say which way each went: they are recorded in checkpoints)."""
    for name in ("vit-mha", "vit-handwritten"):
        layers = _layers(name, oracle)
        assert "(model)" not in layers
        assert layers["cls_token"] == "per-example from its 1 use(s) broadcast against the batch (expand)"
        assert layers["pos_embed"] == "per-example from its 1 use(s) broadcast against the batch (add)"
    layers = _layers("gpt-wpe", oracle)
    assert "(model)" not in layers and layers["wpe"].endswith("(add)")
    layers = _layers("bare-twice", oracle)
    assert "(model)" not in layers and layers["offset"].startswith("per-example from its 2 use(s)")
    model, x, y, clip, _ = oracle["bare-matmul"]
    clipper = make_clipper(model, "ghost")
    clipper(x, y, clip)
    desc = clipper.describe()
    assert desc["layers"]["(model)"] == "vmap over the model: mix"
    assert (
        "mix: used in matmul (not broadcast against the batch); per-example gradients by vmap over the model"
        in (desc["notes"])
    )
    assert "offset: per-example from its uses broadcast against the batch" in desc["notes"]


def _wrong_reduce(real):
    def mean_not_sum(g, shape):  # planted: the mean over the broadcast copies instead of their sum
        return real(g, shape) * (math.prod(shape) / g[0].numel())

    return mean_not_sum


def _wrong_unview(real):
    def next_rows(p, chain, gv):  # planted: a slice mapped one row down
        out = real(p, chain, gv)
        return out.roll(1, dims=1) if chain else out

    return next_rows


@pytest.mark.parametrize(
    ("name", "params", "target", "plant"),
    [
        ("bare-twice", "offset, gain", "_bare_reduce", _wrong_reduce),
        ("gpt-wpe", "wpe", "_bare_unview", _wrong_unview),
    ],
)
def test_a_wrong_bare_parameter_rule_is_caught_and_rerouted(monkeypatch, oracle, name, params, target, plant):
    """Without the first-call check the planted mistake changes the result (these oracle tests bite);
    with it the parameters go to the vmap over the model, exact, and the notes say why."""
    model, x, y, clip, ref = oracle[name]
    monkeypatch.setattr(clipping, target, plant(getattr(clipping, target)))
    unchecked = GhostClipper(model, check=False)(x, y, clip)
    assert max(_rel(g, r) for g, r in zip(unchecked.grads, ref.grads, strict=True)) > 1e-3
    checked = GhostClipper(model)
    assert_oracle(checked, oracle[name])
    desc = checked.describe()
    assert desc["layers"]["(model)"] == f"vmap over the model: {params}"
    for param in params.split(", "):
        assert any(n.startswith(f"{param}: its per-example gradient disagreed") for n in desc["notes"])


def test_bare_parameter_used_differently_later_is_refused_not_misread():
    """The clipping forward must meet the calls the probe classified: a model that uses its bare
    parameter another way on a later batch (here only for batches of 5) is refused by ghost and
    moved to vmap by auto, never clipped with a stale plan."""

    class Switch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.offset = nn.Parameter(torch.randn(3))

        def forward(self, x):
            h = self.lin(x)
            return h * self.offset if x.shape[0] == 5 else h + self.offset

    model = Switch().double()
    x, y = torch.randn(N, 3, dtype=torch.float64), torch.randint(0, 3, (N,))
    ghost = GhostClipper(model)
    ghost(x, y, 1.0)
    assert ghost.describe()["layers"]["offset"].endswith("(add)")
    with pytest.raises(InputError, match="bare parameters are used differently than in the probe"):
        ghost(x[:5], y[:5], 1.0)
    auto = make_clipper(model, "auto")
    auto(x, y, 1.0)
    got = auto(x[:5], y[:5], 1.0)
    ref = LoopClipper(model)(x[:5], y[:5], 1.0)
    assert auto.describe()["method"] == "vmap" and _rel(got.grads[1], ref.grads[1]) < RTOL


def test_a_use_of_a_bare_parameter_the_probe_cannot_see_is_caught_by_the_check():
    """A use hidden from the torch-function mode (here under ``DisableTorchFunction``) is missing from
    the broadcast path's per-example gradient: the first-call check sends the parameter to the vmap
    over the model (exact), where without the check the result is wrong."""

    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.offset = nn.Parameter(torch.randn(3))

        def forward(self, x):
            h = self.lin(x) + self.offset
            with torch._C.DisableTorchFunction():
                return torch.tanh(h) * self.offset

    torch.manual_seed(0)
    model = Hidden().double()
    x, y = torch.randn(N, 3, dtype=torch.float64), torch.randint(0, 3, (N,))
    case = _with_oracle(model, x, y)
    unchecked = GhostClipper(model, check=False)(x, y, case[3])
    assert _rel(unchecked.grads[2], case[4].grads[2]) > 1e-3
    checked = GhostClipper(model)
    assert_oracle(checked, case)
    assert checked.describe()["layers"]["(model)"] == "vmap over the model: offset"


class ModeDependent(nn.Module):
    """Bare parameters used differently in training: ``extra`` only in training (``visible``), or
    ``offset`` a second time in training hidden from the torch-function mode (``hidden``), or
    ``shift`` expanded to (T, d) before it meets the batch (``expanded``), or ``extra`` and ``shift``
    used in another order in evaluation mode (``order``)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(3, 3)
        self.offset, self.extra, self.shift = (nn.Parameter(torch.randn(3)) for _ in range(3))

    def forward(self, x):
        h = self.lin(x) + self.offset
        if self.kind == "expanded":
            h = h + self.shift.expand(x.shape[1], -1)
        if self.training and self.kind == "visible":
            h = h * self.extra
        if self.training and self.kind == "hidden":
            with torch._C.DisableTorchFunction():
                h = h * self.offset
        if self.kind == "order":  # the same uses, in another order in evaluation mode
            h = (h * self.extra + self.shift) if self.training else (h + self.shift) * self.extra
        return torch.tanh(h).mean(1)


@pytest.mark.parametrize(
    ("kind", "vmapped", "note"),
    [
        ("visible", "extra", "extra: used differently in training and in evaluation mode"),
        ("hidden", "offset", "offset: its training-mode gradient disagreed"),
        ("expanded", "shift", "shift: used in expand (not broadcast against the batch)"),
        ("order", "extra", "extra: its uses come in another order in evaluation mode"),
    ],
)
def test_bare_parameters_used_differently_in_training_or_expanded_first(kind, vmapped, note):
    """The first call checks in evaluation mode, then once in training mode: a use only in training
    is seen by the probe in both modes (before: the check's forward met fewer calls than the probe's
    and ghost refused the model), a hidden one by the training-mode check; an expand that adds a
    dimension other than the batch is not followed (before: a call the probe had not seen, refused).
    Each such parameter takes the vmap over the model, exact; the others keep the broadcast path."""
    torch.manual_seed(0)
    model = ModeDependent(kind).double().train()
    x, y = torch.randn(N, 4, 3, dtype=torch.float64), torch.randint(0, 3, (N,))
    clipper = GhostClipper(model)
    assert_oracle(clipper, _with_oracle(model, x, y))
    desc = clipper.describe()
    assert vmapped in desc["layers"]["(model)"].removeprefix("vmap over the model: ").split(", "), desc
    assert any(n.startswith(note) for n in desc["notes"]), desc["notes"]
    if kind not in ("hidden", "order"):  # order: the three parameters' calls interleave differently
        assert desc["layers"]["offset"].endswith("(add)")


class Leftover(nn.Module):
    """Parameters the forward pass never uses (a head left from pretraining, an MAE's mask token),
    or uses hidden from the torch-function mode (``hidden``: in evaluation mode too, ``training``:
    only in training)."""

    def __init__(self, hidden: str = "") -> None:
        super().__init__()
        self.hidden = hidden
        self.lin = nn.Linear(3, 4)
        self.head = nn.Linear(4, 3)
        self.pooler = nn.Linear(4, 4)  # never called
        self.mask_token = nn.Parameter(torch.randn(4))

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        if self.hidden == "eval" or (self.hidden == "training" and self.training):
            with torch._C.DisableTorchFunction():
                h = h + self.mask_token
        return self.head(h)


def test_parameters_no_call_uses_get_zero_without_a_vmap_over_the_model():
    """Before: an unused parameter of the model itself, or of a module never called, took a vmap over
    the whole model (its per-example gradients are 0). Now it gets 0 directly, exact against the loop,
    and every layer stays on its rule."""
    torch.manual_seed(0)
    model = Leftover().double().train()
    x, y = torch.randn(N, 3, dtype=torch.float64), torch.randint(0, 3, (N,))
    clipper = GhostClipper(model)
    case = _with_oracle(model, x, y)
    assert_oracle(clipper, case)
    layers = clipper.describe()["layers"]
    assert "(model)" not in layers, layers
    for n in ("pooler.weight", "pooler.bias", "mask_token"):
        assert layers[n].startswith("used by no call of the forward pass"), layers
    got = clipper(x, y, case[3])
    names = [n for n, _ in model.named_parameters()]
    for n in ("pooler.weight", "pooler.bias", "mask_token"):  # exactly 0, not None
        assert got.grads[names.index(n)].abs().max() == 0.0


@pytest.mark.parametrize("hidden", ["eval", "training"])
def test_a_hidden_use_of_a_parameter_taken_as_unused_is_caught_by_the_checks(hidden):
    """A use the torch-function mode cannot see makes the probe call the parameter unused; the
    evaluation-mode check (``eval``) or the training-mode check (``training``) compares its 0 with the
    reference and sends it to the vmap over the model, exact; without the checks the result is wrong."""
    torch.manual_seed(0)
    model = Leftover(hidden).double().train()
    x, y = torch.randn(N, 3, dtype=torch.float64), torch.randint(0, 3, (N,))
    case = _with_oracle(model, x, y)
    k = [n for n, _ in model.named_parameters()].index("mask_token")
    unchecked = GhostClipper(model, check=False)(x, y, case[3])
    assert _rel(unchecked.grads[k], case[4].grads[k]) > 1e-3
    checked = GhostClipper(model)
    assert_oracle(checked, case)
    assert checked.describe()["layers"]["(model)"] == "vmap over the model: mask_token"
