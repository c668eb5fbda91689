"""Users' own model factories for tests/core/test_byo.py (imported by dpaudit as ``tests.core.byo_models:NAME``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

NOT_CALLABLE = 3


class ResidualMLP(nn.Module):
    """Not a zoo model: a residual MLP, x -> head(h + f(h)), h = inp(x)."""

    def __init__(self, d: int, n_classes: int, width: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d, width)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
        self.head = nn.Linear(width, n_classes)

    def forward(self, x):
        h = self.inp(x.flatten(1))
        return self.head(h + self.mlp(h))


def residual_mlp(d: int, n_classes: int, width: int = 16) -> nn.Module:
    return ResidualMLP(d, n_classes, width)


def with_dropout(d: int, n_classes: int) -> nn.Module:
    """Randomness in the training forward, from torch's global generator."""
    return nn.Sequential(nn.Flatten(), nn.Linear(d, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, n_classes))


def with_batchnorm(d: int, n_classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, 8), nn.BatchNorm1d(8), nn.Linear(8, n_classes))


class ClampsInForward(nn.Module):
    """Clamps its weight in place in every forward call (training and evaluation alike)."""

    def __init__(self, d: int, n_classes: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, n_classes)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.clamp_(-1.0, 1.0)
        return self.lin(x)


def clamps_in_forward(d: int, n_classes: int) -> nn.Module:
    return ClampsInForward(d, n_classes)


class Overflows(nn.Module):
    """Logits beyond float32 (a scale that overflows to inf): the loss and every gradient are NaN."""

    def __init__(self, d: int, n_classes: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, n_classes)

    def forward(self, x):
        return self.lin(x) * 1e38 * 1e38


def overflows(d: int, n_classes: int) -> nn.Module:
    return Overflows(d, n_classes)


def not_a_module(d: int, n_classes: int):
    return {"weight": [0.0] * d}


def wrong_logits(d: int, n_classes: int) -> nn.Module:
    return nn.Linear(d, n_classes + 1)


def raises(d: int, n_classes: int) -> nn.Module:
    raise RuntimeError("out of coffee")


def softmax_head(d: int, n_classes: int) -> nn.Module:
    """Ends with a softmax: probabilities, not logits."""
    return nn.Sequential(nn.Linear(d, n_classes), nn.Softmax(dim=1))


def log_softmax_head(d: int, n_classes: int) -> nn.Module:
    """Ends with a log-softmax: logits up to a per-row constant, which the softmax cancels."""
    return nn.Sequential(nn.Linear(d, n_classes), nn.LogSoftmax(dim=1))


def one_logit(d: int, n_classes: int) -> nn.Module:
    """A binary classifier with one logit (for BCEWithLogitsLoss)."""
    return nn.Linear(d, 1)


class LogitsAndFeatures(nn.Module):
    def __init__(self, d: int, n_classes: int) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(d, 8), nn.Linear(8, n_classes)

    def forward(self, x):
        h = self.body(x)
        return self.head(h), h


def logits_and_features(d: int, n_classes: int) -> nn.Module:
    return LogitsAndFeatures(d, n_classes)


class BatchCentred(nn.Module):
    """Centres its hidden features on the batch mean: a record's logits depend on the rest of its batch."""

    def __init__(self, d: int, n_classes: int) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(d, 8), nn.Linear(8, n_classes)

    def forward(self, x):
        h = self.body(x).tanh()
        return self.head(h - h.mean(0, keepdim=True))


def batch_centred(d: int, n_classes: int) -> nn.Module:
    return BatchCentred(d, n_classes)


class RandomProjection(nn.Module):
    """A fixed random projection kept as a plain tensor attribute: not in the state dict, drawn anew each build."""

    def __init__(self, d: int, n_classes: int) -> None:
        super().__init__()
        self.proj = torch.randn(d, 8)
        self.head = nn.Linear(8, n_classes)

    def forward(self, x):
        return self.head((x @ self.proj).tanh())


def random_projection(d: int, n_classes: int) -> nn.Module:
    return RandomProjection(d, n_classes)


def train_residual(X, y, seed: int):
    """A plug-in trainer (dpaudit.plugins' contract) for ``residual_mlp(6, 2)``: plain full-batch Adam."""
    import torch
    from torch.nn import functional as F

    torch.manual_seed(seed)
    model = residual_mlp(X.shape[1], 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    for _ in range(20):
        opt.zero_grad()
        F.cross_entropy(model(Xt), yt).backward()
        opt.step()
    return model.state_dict()


# --------------------------------------------------------------------------- models outside the zoo
# (tests/core/test_byo_matrix.py): as users write them, nothing here knows about dpaudit.


class ArangeTransformer(nn.Module):
    """A one-block transformer classifier over token ids; positions are ``pos(torch.arange(T))``."""

    def __init__(self, vocab: int, length: int, n_classes: int, d: int = 16, mha: bool = False) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(length, d)
        self.ln1 = nn.LayerNorm(d)
        self.mha = mha
        if mha:
            self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        else:
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, n_classes)

    def forward(self, tok):
        import torch
        from torch.nn import functional as F

        B, T = tok.shape
        h = self.tok(tok) + self.pos(torch.arange(T, device=tok.device))
        a = self.ln1(h)
        if self.mha:
            h = h + self.attn(a, a, a, need_weights=False)[0]
        else:
            q, k, v = self.qkv(a).view(B, T, 3, 2, -1).permute(2, 0, 3, 1, 4)
            h = h + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, -1))
        h = h + self.mlp(self.ln2(h))
        return self.head(h.mean(1))


class BatchRowTransformer(ArangeTransformer):
    """:class:`ArangeTransformer` with seq-first positions on batch-first input: ``pos(torch.arange(x.size(0)))``,
    one position per *row of the batch*, broadcast over the sequence (a record's logits depend on its row)."""

    def __init__(self, vocab: int, length: int, n_classes: int, d: int = 16, max_len: int = 512) -> None:
        super().__init__(vocab, length, n_classes, d)
        self.pos = nn.Embedding(max_len, d)

    def forward(self, tok):
        import torch

        h = self.tok(tok) + self.pos(torch.arange(tok.size(0), device=tok.device)).unsqueeze(1)
        a = self.ln1(h)
        B, T, _ = h.shape
        q, k, v = self.qkv(a).view(B, T, 3, 2, -1).permute(2, 0, 3, 1, 4)
        h = h + self.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, -1))
        h = h + self.mlp(self.ln2(h))
        return self.head(h.mean(1))


def batch_row_transformer(vocab: int, length: int, n_classes: int, d: int = 16) -> nn.Module:
    return BatchRowTransformer(vocab, length, n_classes, d)


def transformer(vocab: int, length: int, n_classes: int, d: int = 16) -> nn.Module:
    return ArangeTransformer(vocab, length, n_classes, d)


def mha_transformer(vocab: int, length: int, n_classes: int, d: int = 16) -> nn.Module:
    return ArangeTransformer(vocab, length, n_classes, d, mha=True)


class EncoderTransformer(nn.Module):
    """A transformer classifier as users write it with torch's stack: token + ``pos(arange(T))`` embeddings through
    ``nn.TransformerEncoder`` (``layers`` TransformerEncoderLayers, batch_first, dropout 0, a final LayerNorm), a
    causal mask of ``nn.Transformer.generate_square_subsequent_mask(T)`` (T from the input), mean pooling."""

    def __init__(self, vocab: int, length: int, n_classes: int, d: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(length, d)
        layer = nn.TransformerEncoderLayer(d, 2, dim_feedforward=2 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d))
        self.head = nn.Linear(d, n_classes)

    def forward(self, tok):
        import torch

        T = tok.size(1)
        h = self.tok(tok) + self.pos(torch.arange(T, device=tok.device))
        h = self.encoder(h, mask=nn.Transformer.generate_square_subsequent_mask(T, device=tok.device))
        return self.head(h.mean(1))


def encoder_transformer(vocab: int, length: int, n_classes: int, d: int = 16, layers: int = 2) -> nn.Module:
    return EncoderTransformer(vocab, length, n_classes, d, layers)


class DecoderLM(nn.Module):
    """A decoder-only classifier as users build it from torch's decoder: token + ``pos(arange(T))`` embeddings through
    ``nn.TransformerDecoder`` (pre-norm GELU TransformerDecoderLayers, batch_first, dropout 0, a final LayerNorm)
    with memory = its own embedding (cross-attention over the record's tokens, token 0 a padding key there), a causal
    ``tgt_mask`` of ``nn.Transformer.generate_square_subsequent_mask(T)``; logits of the last position through the
    token embedding (tied output embedding), its first ``n_classes`` rows."""

    def __init__(self, vocab: int, length: int, n_classes: int, d: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.n_classes = n_classes
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(length, d)
        layer = nn.TransformerDecoderLayer(
            d, 2, dim_feedforward=2 * d, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, layers, norm=nn.LayerNorm(d))

    def forward(self, tok):
        import torch

        T = tok.size(1)
        h = self.tok(tok) + self.pos(torch.arange(T, device=tok.device))
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=tok.device)
        h = self.decoder(h, h, tgt_mask=mask, memory_key_padding_mask=tok == 0)
        return F.linear(h[:, -1], self.tok.weight)[:, : self.n_classes]


def decoder_lm(vocab: int, length: int, n_classes: int, d: int = 16, layers: int = 2) -> nn.Module:
    return DecoderLM(vocab, length, n_classes, d, layers)


class Seq2SeqTransformer(nn.Module):
    """``nn.Transformer`` (encoder-decoder, sequence-first as torch's default, post-norm ReLU, dropout 0) as users
    call it on one token sequence: src and tgt the record's embedded tokens, token 0 a padding key of the encoder
    and of the cross-attention, a causal ``tgt_mask`` from the transformer's own generate_square_subsequent_mask;
    mean over positions."""

    def __init__(self, vocab: int, n_classes: int, d: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.transformer = nn.Transformer(d, 2, 1, 1, dim_feedforward=2 * d, dropout=0.0)
        self.head = nn.Linear(d, n_classes)

    def forward(self, tok):
        h = self.tok(tok).transpose(0, 1)  # (T, B, d)
        pad = tok == 0
        mask = self.transformer.generate_square_subsequent_mask(tok.size(1), device=tok.device)
        out = self.transformer(h, h, tgt_mask=mask, src_key_padding_mask=pad, memory_key_padding_mask=pad)
        return self.head(out.mean(0))


def seq2seq_transformer(vocab: int, n_classes: int, d: int = 16) -> nn.Module:
    return Seq2SeqTransformer(vocab, n_classes, d)


class PaddedTransformer(nn.Module):
    """``nn.Transformer`` (batch_first, post-norm, dropout 0) with token 0 as padding (``src_key_padding_mask=x ==
    0``) and a learned query as the decoder's one target position: two all-zero records are all padding, on which
    torch's eval-mode encoder (its nested-tensor fast path) raises."""

    def __init__(self, vocab: int, n_classes: int, d: int = 8) -> None:
        import torch

        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.transformer = nn.Transformer(d, 2, 1, 1, 2 * d, dropout=0.0, batch_first=True)
        self.query = nn.Parameter(torch.randn(1, 1, d))
        self.head = nn.Linear(d, n_classes)

    def forward(self, tok):
        pad = tok == 0
        out = self.transformer(self.tok(tok), self.query.expand(tok.size(0), -1, -1), src_key_padding_mask=pad,
                               memory_key_padding_mask=pad)  # fmt: skip
        return self.head(out[:, 0])


def padded_transformer(vocab: int, n_classes: int) -> nn.Module:
    return PaddedTransformer(vocab, n_classes)


class RandomInForward(nn.Module):
    """Noise drawn in forward (``torch.randn`` of the batch's size, or of a constant size): torch draws a fresh one
    at every call."""

    def __init__(self, vocab: int, n_classes: int, d: int = 8, constant: bool = False) -> None:
        super().__init__()
        self.tok, self.head, self.constant = nn.Embedding(vocab, d), nn.Linear(d, n_classes), constant

    def forward(self, tok):
        import torch

        h = self.tok(tok).mean(1)
        return self.head(h + 1e-6 * (torch.randn(h.size(1)) if self.constant else torch.randn(tok.size(0), h.size(1))))


def random_in_forward(vocab: int, n_classes: int, constant: bool = False) -> nn.Module:
    return RandomInForward(vocab, n_classes, constant=constant)


class UnbatchedAttention(nn.Module):
    """``nn.MultiheadAttention`` given unbatched (2-D) input: each record's mean embedding (B, d), so that the
    attention runs over the batch's records (torch reads (L, E) as one sequence of L = B positions)."""

    def __init__(self, vocab: int, n_classes: int, d: int = 8) -> None:
        super().__init__()
        self.tok, self.attn, self.head = nn.Embedding(vocab, d), nn.MultiheadAttention(d, 2), nn.Linear(d, n_classes)

    def forward(self, tok):
        h = self.tok(tok).mean(1)
        return self.head(self.attn(h, h, h, need_weights=False)[0])


def unbatched_attention(vocab: int, n_classes: int) -> nn.Module:
    return UnbatchedAttention(vocab, n_classes)


class TiedLM(nn.Module):
    """LM-ish classifier: next-token logits through the embedding matrix (tied), restricted to the
    first ``n_classes`` tokens of the vocabulary (the class tokens)."""

    def __init__(self, vocab: int, n_classes: int, d: int = 16) -> None:
        super().__init__()
        self.n_classes = n_classes
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tok):
        import torch

        h = torch.tanh(self.mix(self.emb(tok))).mean(1)
        return self.head(h)[:, : self.n_classes]


def tied_lm(vocab: int, n_classes: int, d: int = 16) -> nn.Module:
    return TiedLM(vocab, n_classes, d)


class BareParameterCNN(nn.Module):
    """An image model with a learned input offset and a per-channel gain: bare ``nn.Parameter``s in forward."""

    def __init__(self, channels: int, size: int, n_classes: int, width: int = 8) -> None:
        super().__init__()
        import torch

        self.offset = nn.Parameter(torch.zeros(channels, size, size))
        self.conv = nn.Conv2d(channels, width, 3, stride=2, padding=1)
        self.norm = nn.GroupNorm(2, width)
        self.gain = nn.Parameter(torch.ones(width))
        self.head = nn.Linear(width, n_classes)

    def forward(self, x):
        h = self.norm(self.conv(x + self.offset)).relu() * self.gain[:, None, None]
        return self.head(h.mean((2, 3)))


def bare_parameter_cnn(channels: int, size: int, n_classes: int, width: int = 8) -> nn.Module:
    return BareParameterCNN(channels, size, n_classes, width)


class TrainBatchCentred(nn.Module):
    """Centres its hidden features on the batch mean in training mode only (a hand-written batch norm):
    eval-mode logits are per record, training-mode ones mix the batch."""

    def __init__(self, d: int, n_classes: int) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(d, 8), nn.Linear(8, n_classes)

    def forward(self, x):
        h = self.body(x).tanh()
        if self.training:
            h = h - h.mean(0, keepdim=True)
        return self.head(h)


def train_batch_centred(d: int, n_classes: int) -> nn.Module:
    return TrainBatchCentred(d, n_classes)


class PadMaskedPooling(nn.Module):
    """Attention pooling over positions with padding id 0 masked out (``masked_fill(-inf)`` then a softmax, as
    most hand-written attention does): an all-padding record gives NaN logits. ``extra``: ``"random"`` keeps a
    random projection as a plain attribute (outside the state dict), ``"centred"`` centres on the batch mean.
    ``pad``: the id masked (0 for BERT's tokenizer; 2 or 3 where a vocabulary puts its padding there)."""

    def __init__(self, vocab: int, n_classes: int, extra: str, d: int = 8, pad: int = 0) -> None:
        super().__init__()
        self.extra, self.pad = extra, pad
        self.emb = nn.Embedding(vocab, d)
        self.score = nn.Linear(d, 1)
        self.proj = torch.randn(d, d) if extra == "random" else None
        self.head = nn.Linear(d, n_classes)

    def forward(self, tok):
        h = self.emb(tok)
        weights = self.score(h).squeeze(-1).masked_fill(tok == self.pad, float("-inf")).softmax(-1)
        z = (weights.unsqueeze(-1) * h).sum(1)
        z = z @ self.proj if self.extra == "random" else z - z.mean(0, keepdim=True)
        return self.head(z)


def pad_masked(vocab: int, n_classes: int, extra: str, pad: int = 0) -> nn.Module:
    return PadMaskedPooling(vocab, n_classes, extra, pad=pad)


class ResidualSequential(nn.Sequential):
    """An ``nn.Sequential`` whose own forward adds a skip connection: x -> head(h + f(h)), h = flatten(x)."""

    def forward(self, x):
        h = self[0](x)
        return self[3](h + self[2](self[1](h)))


def residual_sequential(d: int, n_classes: int) -> nn.Module:
    return ResidualSequential(nn.Flatten(), nn.Linear(d, d), nn.Tanh(), nn.Linear(d, n_classes))


def float64_mlp(d: int, n_classes: int) -> nn.Module:
    """A factory that returns its model in float64 (dpaudit's records are float32)."""
    return residual_mlp(d, n_classes).double()


class ResidualGroupNormCNN(nn.Module):
    """A residual conv net: stem conv, a block conv -> GroupNorm -> ReLU -> conv -> GroupNorm(affine=False) added
    to its input, global average pooling, a linear head (traced by torch.fx under ``--backend jax``)."""

    def __init__(self, channels: int, n_classes: int, width: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(channels, width, 3, padding=1)
        self.conv1, self.norm1 = nn.Conv2d(width, width, 3, padding=1), nn.GroupNorm(2, width)
        self.conv2, self.norm2 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.GroupNorm(2, width, affine=False)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = h + self.norm2(self.conv2(torch.relu(self.norm1(self.conv1(h)))))
        return self.head(h.mean((2, 3)))


def residual_groupnorm_cnn(channels: int, n_classes: int, width: int = 4) -> nn.Module:
    return ResidualGroupNormCNN(channels, n_classes, width)


class TinyTransformer(nn.Module):
    """One pre-norm transformer block on token ids given as floats (B, T): token embedding plus a learned
    positional embedding of ``torch.arange(T)``, single-head attention (``sdpa``: F.scaled_dot_product_attention,
    else q kᵀ/√d -> softmax -> · v by hand), an MLP with GELU, mean pooling over positions, a linear head."""

    def __init__(self, vocab: int, n_classes: int, max_len: int = 16, d: int = 8, sdpa: bool = True) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head, self.sdpa = nn.Linear(d, n_classes), sdpa

    def forward(self, x):
        t = x.long()
        h = self.tok(t) + self.pos(torch.arange(t.size(1), device=x.device))
        q, k, v = self.qkv(self.ln1(h)).chunk(3, dim=-1)
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v)
        else:
            a = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v
        h = h + self.proj(a)
        h = h + self.mlp(self.ln2(h))
        return self.head(h.mean(1))


def tiny_transformer(vocab: int, n_classes: int, max_len: int = 16, sdpa: bool = True) -> nn.Module:
    return TinyTransformer(vocab, n_classes, max_len, sdpa=sdpa)


class TiedLinear(nn.Module):
    """Two Linear maps sharing one weight (tied weights): head(tanh(B(tanh(A x)))), B.weight is A.weight."""

    def __init__(self, d: int, n_classes: int) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, n_classes)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x.flatten(1))))))


def tied_linear(d: int, n_classes: int) -> nn.Module:
    return TiedLinear(d, n_classes)


class CausalTransformer(nn.Module):
    """A two-head causal attention block on token ids (B, T), written as users write it: a learned positional
    ``nn.Parameter`` sliced to T, a causal mask buffer (``register_buffer``) sliced and applied with
    ``masked_fill``, heads by ``reshape``/``view``/``transpose``/``permute``, and the same attention again by
    ``F.scaled_dot_product_attention(is_causal=True)``; the mean over positions plus the last position's features
    to a linear head."""

    def __init__(self, vocab: int, n_classes: int, max_len: int = 16, d: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(0.1 * torch.randn(max_len, d))
        self.ln, self.qkv, self.heads = nn.LayerNorm(d), nn.Linear(d, 3 * d), heads
        self.head = nn.Linear(2 * d, n_classes)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len)).bool())

    def forward(self, x):
        B, T = x.shape[0], x.size(1)
        h = self.tok(x.long()) + self.pos[:T]
        q, k, v = self.qkv(self.ln(h)).chunk(3, -1)
        q = q.reshape(B, T, self.heads, -1).transpose(1, 2)
        k = k.reshape(B, T, self.heads, -1).permute(0, 2, 1, 3)
        v = v.reshape(B, T, self.heads, -1).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / k.size(-1) ** 0.5)
        att = att.masked_fill(~self.causal[:T, :T], float("-inf")).softmax(dim=-1)
        a = (att @ v).transpose(1, 2).reshape(B, T, -1)
        b = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, -1)
        z = torch.cat([a, b], dim=-1)
        return self.head(z.mean(1) + z[:, -1])  # the last position sees every token, the others only the earlier


def causal_transformer(vocab: int, n_classes: int, max_len: int = 16) -> nn.Module:
    return CausalTransformer(vocab, n_classes, max_len)


class NewcomerEncoder(nn.Module):
    """The transformer a newcomer writes: token embeddings through one ``nn.TransformerEncoderLayer(d, 2,
    batch_first=True)`` with torch's defaults (dropout 0.1 after attention, in the feed-forward block and on the
    attention weights; ReLU; post-norm), mean over positions, a linear head."""

    def __init__(self, vocab: int, n_classes: int, d: int = 16) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.enc = nn.TransformerEncoderLayer(d, 2, dim_feedforward=2 * d, batch_first=True)
        self.head = nn.Linear(d, n_classes)

    def forward(self, tok):
        return self.head(self.enc(self.tok(tok)).mean(1))


def newcomer_encoder(vocab: int, n_classes: int, d: int = 16) -> nn.Module:
    return NewcomerEncoder(vocab, n_classes, d)


class GPTBlock(nn.Module):
    """A nanoGPT-style block as users copy it: ``c_attn(x).split(n_embd, dim=2)`` (or ``chunk(3, dim=-1)``), heads by
    ``view(B, T, nh, hs).transpose(1, 2)``, a registered ``torch.tril`` buffer applied by
    ``masked_fill(bias[:, :, :T, :T] == 0, -inf)`` then ``F.softmax`` (or ``F.scaled_dot_product_attention(
    is_causal=True)``), ``transpose(1, 2).contiguous().view(B, T, C)``, an MLP with ``nn.GELU(approximate="tanh")``;
    LayerNorm(bias=False), or RMSNorm by hand (``x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``)."""

    def __init__(self, d: int, heads: int, max_len: int, sdpa: bool, rms: bool) -> None:
        super().__init__()
        self.n_embd, self.n_head, self.sdpa, self.rms = d, heads, sdpa, rms
        self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.gelu, self.mlp_proj = nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))

    def norm(self, ln, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * ln.weight if self.rms else ln(x)

    def forward(self, x):
        B, T, C = x.size()
        h = self.norm(self.ln_1, x)
        if self.sdpa:
            q, k, v = self.c_attn(h).chunk(3, dim=-1)
        else:
            q, k, v = self.c_attn(h).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(self.gelu(self.c_fc(self.norm(self.ln_2, x))))


class GPTClassifier(nn.Module):
    """A classifier head over a GPT-style stack on token ids (B, T), as users write it from nanoGPT: token and
    ``torch.arange(T)`` position embeddings, :class:`GPTBlock` layers, a final LayerNorm(bias=False), a tied
    ``lm_head.weight = wte.weight``, and per ``pool``: "mean" (``x.mean(1)`` and the LM logits' ``amax`` over
    positions), "max" (``x.max(dim=1).values`` and the last position), "shift" (a token shift by ``F.pad`` of the
    previous position's features, ``torch.cat``, unit rows by ``x / x.norm(dim=-1, keepdim=True)``)."""

    def __init__(self, vocab: int, n_classes: int, pool: str = "mean", sdpa: bool = False, rms: bool = False,
                 d: int = 8, heads: int = 2, layers: int = 2, max_len: int = 16) -> None:  # fmt: skip
        super().__init__()
        self.pool = pool
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.h = nn.ModuleList(GPTBlock(d, heads, max_len, sdpa, rms) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.head = nn.Linear(d + (vocab if pool == "mean" else d), n_classes)

    def forward(self, idx):
        idx = idx.long()
        _, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        if self.pool == "shift":  # each position also sees the previous one's features (RWKV's token shift)
            x = torch.cat([x, F.pad(x, (0, 0, 1, -1))], dim=-1)[..., : x.size(-1)] + F.pad(x, (0, 0, 1, -1))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if self.pool == "mean":
            return self.head(torch.cat([x.mean(1), self.lm_head(x).amax(1)], dim=-1))
        if self.pool == "max":
            return self.head(torch.cat([x.max(dim=1).values, x[:, -1, :]], dim=-1))
        u = x / (x.norm(dim=-1, keepdim=True) + 1e-6)
        return self.head(torch.cat([u.mean(1), x[:, -1]], dim=-1))


def gpt_classifier(vocab: int, n_classes: int, pool: str = "mean", sdpa: bool = False, rms: bool = False) -> nn.Module:
    return GPTClassifier(vocab, n_classes, pool, sdpa, rms)


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock as users copy it (torchvision/models/resnet.py), with GroupNorm for BatchNorm:
    ``nn.ReLU(inplace=True)`` run twice and ``out += identity``."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.GroupNorm(2, planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.GroupNorm(2, planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.GroupNorm(2, planes))  # fmt: skip

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class BasicBlockResNet(nn.Module):
    """A small torchvision-style ResNet: conv stem, GroupNorm, ReLU(inplace=True), MaxPool2d(3, 2, 1), two stages of
    BasicBlocks (the second downsampling), AdaptiveAvgPool2d((1, 1)), torch.flatten, fc."""

    def __init__(self, channels: int, n_classes: int, width: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1, bias=False)
        self.bn1 = nn.GroupNorm(2, width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(width, width))
        self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, stride=2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2 * width, n_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def basic_block_resnet(channels: int, n_classes: int, width: int = 4) -> nn.Module:
    return BasicBlockResNet(channels, n_classes, width)


class MnistExampleNet(nn.Module):
    """The classic PyTorch MNIST example's Net (pytorch/examples mnist/main.py), narrower for small images:
    conv, ReLU, conv, ReLU, F.max_pool2d(x, 2), Dropout2d (the example's older version; nn.Dropout since), flatten,
    fc, ReLU, Dropout, fc, F.log_softmax (trained there with F.nll_loss)."""

    def __init__(self, side: int, n_classes: int, dropout2d: bool = True) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 4, 3, 1), nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25) if dropout2d else nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(8 * ((side - 4) // 2) ** 2, 16), nn.Linear(16, n_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def mnist_example(side: int, n_classes: int, dropout2d: bool = True) -> nn.Module:
    return MnistExampleNet(side, n_classes, dropout2d)


class UNetClassifier(nn.Module):
    """A small UNet-style encoder/decoder as users write segmentation backbones (Ronneberger et al. 2015,
    arXiv:1505.04597: convolutions, max pooling down, up by ``nn.Upsample(bilinear, align_corners=True)`` and by
    ``nn.ConvTranspose2d(2, stride=2)``, skip connections by ``torch.cat``), with a pooled linear head; Mish and
    Softplus activations. ``side`` must be divisible by 4."""

    def __init__(self, channels: int, n_classes: int, width: int = 4):
        super().__init__()
        w = width
        self.enc1, self.enc2 = nn.Conv2d(channels, w, 3, padding=1), nn.Conv2d(w, 2 * w, 3, padding=1)
        self.mid = nn.Conv2d(2 * w, 2 * w, 3, padding=1)
        self.pool, self.act = nn.MaxPool2d(2), nn.Mish()
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.dec1 = nn.Conv2d(4 * w, w, 3, padding=1)
        self.up2 = nn.ConvTranspose2d(w, w, 2, stride=2)
        self.dec2 = nn.Conv2d(2 * w, w, 3, padding=1)
        self.head = nn.Linear(w, n_classes)

    def forward(self, x):
        a = self.act(self.enc1(x))
        b = self.act(self.enc2(self.pool(a)))
        c = self.act(self.mid(self.pool(b)))
        d = F.softplus(self.dec1(torch.cat([self.up1(c), b], dim=1)), beta=2.0)
        e = self.act(self.dec2(torch.cat([self.up2(d), a], dim=1)))
        return self.head(F.adaptive_avg_pool2d(e, 1).flatten(1))


def unet_classifier(channels: int, n_classes: int) -> nn.Module:
    return UNetClassifier(channels, n_classes)


class SuperResolutionStyle(nn.Module):
    """A super-resolution / style-transfer backbone as users write them: a space-to-depth stem (``nn.PixelUnshuffle``),
    convolutions with instance normalisation (``nn.InstanceNorm2d(affine=True)``, Ulyanov et al. 2016,
    arXiv:1607.08022), sub-pixel upsampling (``nn.PixelShuffle``, Shi et al. 2016, arXiv:1609.05158), a flipped copy
    added, exact GELU written with ``torch.erf``, and a log-sum-exp pooled head. ``side`` must be even."""

    def __init__(self, channels: int, n_classes: int, width: int = 4):
        super().__init__()
        self.stem = nn.PixelUnshuffle(2)
        self.c1 = nn.Conv2d(4 * channels, width, 3, padding=1, bias=False)  # no bias before instance norm
        self.n1 = nn.InstanceNorm2d(width, affine=True)
        self.c2, self.ps = nn.Conv2d(width, 4 * width, 3, padding=1), nn.PixelShuffle(2)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x):
        h = self.n1(self.c1(self.stem(x)))
        h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
        h = self.ps(self.c2(h))
        h = h + torch.flip(h, [-1])
        return self.head(torch.logsumexp(h.flatten(2), dim=-1))


def super_resolution_style(channels: int, n_classes: int) -> nn.Module:
    return SuperResolutionStyle(channels, n_classes)
