"""Differential fuzzing of per-example clipping on users' modules (issue 26).

    OMP_NUM_THREADS=1 nice python benchmarks/clipping_fuzz.py --n 300 --seed 1
    python benchmarks/clipping_fuzz.py --seed 1 --case 17 -v      # one case, with tracebacks

A seeded generator draws user-style models (``FAMILIES``: Linear on 2-4-d inputs and seq-first /
folded layouts, Conv1d/2d/3d and ConvTranspose2d with stride, dilation, groups, padding modes,
Embedding / EmbeddingBag options and positional embeddings of ``torch.arange``, norm layers,
PReLU, bare and frozen parameters, tied weights, attention, RNNs, custom blocks with kwargs, tuple
and dict outputs) and float64 inputs. For each case ``ghost``, ``auto``, ``vmap`` (and ``loop``,
for crashes only) are called on three batches with the same clipper, as training does: sizes
B1, B2 and a padded call (the last rows padding, ``valid`` < n), with B1 = 1 in some draws (a
first Poisson batch of one example decides the ghost plan and its check). Every call is compared
with a fresh :class:`LoopClipper` on the same batch (the ground truth), at C = the median loop norm:

* agree   – clipped sum within 1e-6 of the loop's (relative to Σ_i min(‖g_i‖, C), the size of its
  terms, which a sum of opposite gradients does not shrink) and norms within 1e-6 of the largest;
* refused – an :class:`~dpaudit.errors.InputError` with a one-line message (a clear refusal);
* crashed – any other exception (a bug: the library promises never to crash on a user's module);
* wrong   – numbers that disagree (a bug; a *privacy* bug when a norm is under-estimated: the clip
  would then let more than C of that example through).

A model the loop refuses (BatchNorm, a sparse embedding) must be refused by every method. The
exit status is 1 if any case crashed or was wrong; each is listed with its reproducer.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from dpaudit.errors import InputError
from dpaudit.training.clipping import LoopClipper, make_clipper

TOL = 1e-6  # float64: the methods differ by rounding only (~1e-15); the acceptance bound
METHODS = ("ghost", "auto", "vmap", "loop")


@dataclass
class Case:
    """One drawn model: ``make_x(B, gen, j)`` draws the inputs of call j (a sequence model may get
    another length on each call, as batches of text do); the labels are in range(n_classes)."""

    family: str
    desc: str
    model: nn.Module
    make_x: Callable[[int, torch.Generator, int], torch.Tensor]
    n_classes: int


# ------------------------------------------------------------------------------- model pieces


def _act(r: random.Random) -> nn.Module:
    return r.choice([nn.Tanh(), nn.ReLU(), nn.GELU(), nn.ReLU(inplace=True), nn.Identity()])


def _pool(h: torch.Tensor) -> torch.Tensor:
    # (B, ..., d) -> (B, d): mean over every middle dimension.
    return h.reshape(h.shape[0], -1, h.shape[-1]).mean(1) if h.dim() > 2 else h


def _floats(*shape: int, lengths: Sequence[int] = ()) -> Callable[[int, torch.Generator, int], torch.Tensor]:
    # ``lengths``: the first dimension of ``shape`` on calls 0, 1, 2, ... (cycled); () keeps it.
    def make(B: int, g: torch.Generator, j: int) -> torch.Tensor:
        dims = (lengths[j % len(lengths)], *shape[1:]) if lengths else shape
        return torch.randn(B, *dims, generator=g, dtype=torch.float64)

    return make


def _tokens(V: int, T: int, lengths: Sequence[int] = ()) -> Callable[[int, torch.Generator, int], torch.Tensor]:
    return lambda B, g, j: torch.randint(0, V, (B, lengths[j % len(lengths)] if lengths else T), generator=g)


def _lengths(r: random.Random, T: int) -> tuple[int, ...]:
    # Half the sequence models see another length on their later calls.
    return (T,) if r.random() < 0.5 else (T, r.choice([2, 3, 5, 6]))


class LinearNet(nn.Module):
    def __init__(self, layout: str, d_in: int, d_h: int, bias: bool, bias2: bool, act: nn.Module, k: int) -> None:
        super().__init__()
        self.layout, self.act = layout, act
        self.fc1 = nn.Linear(d_in, d_h, bias=bias)
        self.fc2 = nn.Linear(d_h, k, bias=bias2)

    def forward(self, x):
        if self.layout == "seq-first":  # (T, B, d) as RNN-era code keeps it
            h = self.fc1(x.transpose(0, 1)).transpose(0, 1)
        elif self.layout == "folded":  # (B·T, d), batch-major
            B, T, d = x.shape
            h = self.fc1(x.reshape(B * T, d)).reshape(B, T, -1)
        elif self.layout == "folded-time-major":  # (T·B, d)
            B, T, d = x.shape
            h = self.fc1(x.transpose(0, 1).reshape(T * B, d)).reshape(T, B, -1).transpose(0, 1)
        else:
            h = self.fc1(x)
        return self.fc2(_pool(self.act(h)))


def _linear(r: random.Random, k: int) -> Case:
    d_in, d_h = r.choice([3, 5]), r.choice([4, 7])
    layout = r.choice(["2d", "3d", "4d", "seq-first", "folded", "folded-time-major", "sequential"])
    bias, bias2 = r.random() < 0.7, r.random() < 0.7
    T1, T2 = r.choice([2, 3, 5]), r.choice([2, 3])
    shape = {"2d": (d_in,), "sequential": (d_in,), "4d": (T1, T2, d_in)}.get(layout, (T1, d_in))
    act = _act(r)
    if layout == "sequential":
        layers = [nn.Linear(d_in, d_h, bias=bias), act, nn.Linear(d_h, d_h, bias=bias2), nn.Tanh()]
        model = nn.Sequential(*layers, nn.Linear(d_h, k))
    else:
        model = LinearNet(layout, d_in, d_h, bias, bias2, act, k)
    lengths = _lengths(r, shape[0]) if len(shape) > 1 else ()
    desc = f"{layout} in={shape} lengths={lengths} d_h={d_h} bias={bias},{bias2} act={act}"
    return Case("linear", desc, model, _floats(*shape, lengths=lengths), k)


class ConvNet(nn.Module):
    def __init__(self, conv: nn.Module, flat: int, k: int, act: nn.Module) -> None:
        super().__init__()
        self.conv, self.act, self.head = conv, act, nn.Linear(flat, k)

    def forward(self, x):
        return self.head(self.act(self.conv(x)).flatten(1))


def _conv(r: random.Random, k: int) -> Case:
    for _ in range(50):
        dim = r.choice([1, 2, 2, 3])
        transpose = dim == 2 and r.random() < 0.2
        size = {1: r.choice([7, 9]), 2: r.choice([5, 6]), 3: 4}[dim]
        c_in = r.choice([1, 2, 4])
        groups = r.choice([1, 1, 2, c_in]) if c_in % 2 == 0 or c_in == 1 else 1
        c_out = groups * r.choice([1, 2]) if groups > 1 else r.choice([2, 3])
        ks = r.choice([1, 2, 3])
        stride, dilation = r.choice([1, 1, 2]), r.choice([1, 1, 2])
        mode = "zeros" if transpose else r.choice(["zeros", "zeros", "reflect", "circular", "replicate"])
        padding: int | str = r.choice([0, 1, 2, "same", "valid"]) if not transpose else r.choice([0, 1])
        if padding == "same":
            stride = 1
        bias = r.random() < 0.6
        if c_in % groups or c_out % groups:
            continue
        if transpose:
            conv = nn.ConvTranspose2d(
                c_in, c_out, ks, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias
            )
        else:
            cls = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dim]
            conv = cls(
                c_in,
                c_out,
                ks,
                stride=stride,
                padding=padding,
                dilation=dilation,
                groups=groups,
                bias=bias,
                padding_mode=mode,
            )
        shape = (c_in, *([size] * dim))
        try:
            with torch.no_grad():
                flat = conv(torch.zeros(1, *shape)).numel()
        except RuntimeError:
            continue
        if flat == 0:
            continue
        act = _act(r)
        opts = f"k={ks},s={stride},d={dilation},g={groups},p={padding!r},{mode},bias={bias}"
        desc = f"{type(conv).__name__}({c_in},{c_out},{opts}) in={shape}"
        return Case("conv", desc, ConvNet(conv, flat, k, act), _floats(*shape), k)
    raise RuntimeError("no valid convolution drawn")


class EmbedNet(nn.Module):
    def __init__(self, emb: nn.Module, d: int, k: int, pos: str | None, T: int, bag: bool) -> None:
        super().__init__()
        self.emb, self.pos_kind, self.bag = emb, pos, bag
        self.pos = nn.Embedding(T, d) if pos else None  # T: the longest sequence
        self.head = nn.Linear(d, k)

    def forward(self, tok):
        h = self.emb(tok)
        if self.bag:
            return self.head(torch.tanh(h))
        T = tok.shape[1]
        if self.pos_kind == "arange":
            h = h + self.pos(torch.arange(T, device=tok.device))
        elif self.pos_kind == "arange[None]":
            h = h + self.pos(torch.arange(T, device=tok.device)[None])
        elif self.pos_kind == "expand":
            h = h + self.pos(torch.arange(T, device=tok.device).expand(tok.shape[0], T))
        return self.head(torch.tanh(h).mean(1))


def _embedding(r: random.Random, k: int) -> Case:
    V, d, T = r.choice([5, 11]), r.choice([3, 4]), r.choice([2, 4, 6])
    lengths = _lengths(r, T)
    Tmax = max(lengths)
    bag = r.random() < 0.2
    if bag:
        mode = r.choice(["sum", "mean", "max"])
        emb = nn.EmbeddingBag(V, d, mode=mode, padding_idx=r.choice([None, 0]))
        desc = f"EmbeddingBag(V={V},d={d},{mode},padding_idx={emb.padding_idx}) T={lengths}"
        return Case("embedding", desc, EmbedNet(emb, d, k, None, Tmax, True), _tokens(V, T, lengths), k)
    opts = {
        "padding_idx": r.choice([None, None, 0]),
        "scale_grad_by_freq": r.random() < 0.2,
        "max_norm": r.choice([None] * 6 + [1.0]),
        "sparse": r.random() < 0.08,
    }
    pos = r.choice([None, "arange", "arange[None]", "expand"])
    emb = nn.Embedding(V, d, **opts)
    desc = f"Embedding(V={V},d={d},{', '.join(f'{a}={b}' for a, b in opts.items() if b)}) T={lengths} pos={pos}"
    return Case("embedding", desc, EmbedNet(emb, d, k, pos, Tmax, False), _tokens(V, T, lengths), k)


class NormNet(nn.Module):
    def __init__(self, pre: nn.Module, norm: nn.Module, post: nn.Module, flat: int, k: int) -> None:
        super().__init__()
        self.pre, self.norm, self.post, self.head = pre, norm, post, nn.Linear(flat, k)

    def forward(self, x):
        return self.head(self.post(self.norm(self.pre(x))).flatten(1))


def _norm(r: random.Random, k: int) -> Case:
    kind = r.choice(["layer", "layer", "group", "rms", "instance", "batch", "prelu", "layer-multi"])
    layout = r.choice(["2d", "3d", "4d"])
    C, d, T, S = r.choice([2, 4]), r.choice([3, 4]), r.choice([2, 3]), r.choice([3, 4])
    if kind == "layer-multi":
        layout = "3d"
    if kind == "instance":
        layout = "4d"  # InstanceNorm2d takes (B, C, H, W)
    if layout == "2d":
        pre, shape, out = nn.Linear(d, C * 2), (d,), (C * 2,)
    elif layout == "3d":
        pre, shape, out = nn.Linear(d, C * 2), (T, d), (T, C * 2)
    else:
        pre, shape, out = nn.Conv2d(1, C * 2, 3, padding=1), (1, S, S), (C * 2, S, S)
    if r.random() < 0.25:  # the norm first, on the raw input (which needs no gradient)
        pre, out = nn.Identity(), shape
    ch = out[0] if layout == "4d" else out[-1]
    affine = r.random() < 0.75
    if kind == "layer":
        norm = nn.LayerNorm(out[-1], elementwise_affine=affine, bias=r.random() < 0.7)
    elif kind == "layer-multi":
        norm = nn.LayerNorm(out, elementwise_affine=affine)
    elif kind == "group":
        ch = out[0]  # GroupNorm normalises (B, C, *): channels at dim 1
        g = r.choice([1, ch]) if ch % 2 else r.choice([1, 2, ch])
        norm = nn.GroupNorm(g, ch, affine=affine)
    elif kind == "rms":
        norm = nn.RMSNorm(out[-1], elementwise_affine=affine)
    elif kind == "instance":
        norm = nn.InstanceNorm2d(out[0], affine=True)
    elif kind == "batch":
        norm = nn.BatchNorm1d(out[0]) if layout != "4d" else nn.BatchNorm2d(out[0])
    else:
        norm = nn.PReLU(r.choice([1, out[0]]))  # PReLU's channels are at dim 1
    flat = math.prod(out)
    desc = f"{norm} layout={layout} in={shape} pre={type(pre).__name__}"
    return Case("norm", desc, NormNet(pre, norm, nn.Tanh(), flat, k), _floats(*shape), k)


class BareParams(nn.Module):
    def __init__(self, d: int, T: int, k: int, kinds: list[str], frozen: str | None) -> None:
        super().__init__()
        self.kinds = kinds
        self.fc = nn.Linear(d, d)
        self.head = nn.Linear(d, k)
        self.scale = nn.Parameter(torch.tensor(1.3))
        self.shift = nn.Parameter(torch.randn(d) * 0.1)
        self.pos = nn.Parameter(torch.randn(1, T, d) * 0.1)
        self.w = nn.Parameter(torch.randn(d, d) * 0.3)
        if frozen == "fc.weight":
            self.fc.weight.requires_grad_(False)
        elif frozen == "fc":
            self.fc.requires_grad_(False)
        elif frozen == "head.bias":
            self.head.bias.requires_grad_(False)
        elif frozen == "shift":
            self.shift.requires_grad_(False)

    def forward(self, x):
        h = x
        if "pos" in self.kinds:
            h = h + self.pos
        h = self.fc(h)
        if "scale" in self.kinds:
            h = h * self.scale
        if "shift" in self.kinds:
            h = h + self.shift
        if "matmul" in self.kinds:
            h = F.linear(torch.tanh(h), self.w)
        return self.head(torch.tanh(h).mean(1))


def _params(r: random.Random, k: int) -> Case:
    d, T = r.choice([3, 4]), r.choice([2, 3])
    kinds = r.sample(["pos", "scale", "shift", "matmul"], r.choice([1, 2, 3]))
    frozen = r.choice([None, None, "fc.weight", "fc", "head.bias", "shift"])
    model = BareParams(d, T, k, kinds, frozen)
    # Unused parameters stay in the model (a user's leftovers): their gradient is 0.
    lengths = () if "pos" in kinds else _lengths(r, T)  # a (1, T, d) parameter fixes T
    desc = f"bare={kinds} frozen={frozen} in=({T},{d}) lengths={lengths}"
    return Case("params", desc, model, _floats(T, d, lengths=lengths), k)


class Tied(nn.Module):
    def __init__(self, kind: str, d: int, V: int, k: int) -> None:
        super().__init__()
        self.kind = kind
        self.fc = nn.Linear(d, d)
        self.emb = nn.Embedding(V, d)
        self.block = nn.Sequential(nn.Linear(d, d), nn.Tanh())
        self.head = nn.Linear(d, k, bias=False)
        if kind == "emb-head":
            self.head.weight = self.emb.weight
        self.blocks = nn.ModuleList([self.block, nn.Linear(d, d), self.block])

    def forward(self, x):
        if self.kind in ("emb-head", "emb-functional"):
            h = torch.tanh(self.fc(self.emb(x))).mean(1)
            return self.head(h) if self.kind == "emb-head" else F.linear(h, self.emb.weight)
        if self.kind == "twice":
            return self.head(self.fc(torch.tanh(self.fc(x))).mean(1))
        if self.kind == "branches":
            a, b = x[:, :1], x[:, 1:]
            return self.head(torch.cat([self.block(a), self.block(b)], 1).mean(1))
        h = x  # "modulelist": the same block at two depths
        for blk in self.blocks:
            h = blk(h)
        return self.head(h.mean(1))


def _tied(r: random.Random, k: int) -> Case:
    kind = r.choice(["emb-head", "emb-functional", "twice", "branches", "modulelist"])
    d, V, T = r.choice([3, 4]), r.choice([5, 7]), r.choice([2, 3])
    lengths = _lengths(r, T)
    if kind.startswith("emb"):
        k = V
        return Case("tied", f"{kind} V={V} d={d} T={lengths}", Tied(kind, d, V, k), _tokens(V, T, lengths), k)
    return Case("tied", f"{kind} d={d} T={lengths}", Tied(kind, d, V, k), _floats(T, d, lengths=lengths), k)


class MHANet(nn.Module):
    def __init__(self, mha: nn.MultiheadAttention, cross: bool, mask: bool, weights: bool, E: int, k: int) -> None:
        super().__init__()
        self.mha, self.cross, self.mask, self.weights = mha, cross, mask, weights
        self.inp = nn.Linear(3, E)
        self.kv = nn.Linear(3, mha.kdim), nn.Linear(3, mha.vdim)
        self.kproj, self.vproj = self.kv
        self.query = nn.Parameter(torch.randn(1, 2, E)) if cross else None
        self.head = nn.Linear(E, k)

    def forward(self, x):  # x: (B, T, 3)
        B = x.shape[0]
        h = self.inp(x)
        q = self.query.expand(B, -1, -1) if self.cross else h
        kk, vv = self.kproj(x), self.vproj(x)
        kpm = None
        if self.mask:  # mask the last position of examples whose first feature is positive
            kpm = torch.zeros(B, x.shape[1], dtype=torch.bool, device=x.device)
            kpm[:, -1] = x[:, 0, 0] > 0
        if not self.mha.batch_first:
            q, kk, vv = q.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1)
        out, w = self.mha(q, kk, vv, key_padding_mask=kpm, need_weights=self.weights)
        if not self.mha.batch_first:
            out = out.transpose(0, 1)
        logits = self.head(out.mean(1))
        # need_weights: the weights enter the loss too (the attention paid to the first key)
        return logits * (1 + w[:, :, 0].sum(1, keepdim=True)) if self.weights else logits


class SDPANet(nn.Module):
    def __init__(self, E: int, heads: int, causal: bool, bias: bool, k: int) -> None:
        super().__init__()
        self.h, self.causal = heads, causal
        self.inp = nn.Linear(3, E)
        self.q, self.k, self.v = (nn.Linear(E, E, bias=bias) for _ in range(3))
        self.o = nn.Linear(E, E)
        self.norm = nn.LayerNorm(E)
        self.head = nn.Linear(E, k)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.inp(x)
        q, k, v = (f(h).view(B, T, self.h, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal).transpose(1, 2).reshape(B, T, -1)
        h = self.norm(h + self.o(a))
        return self.head(h.mean(1))


def _attention(r: random.Random, k: int) -> Case:
    T = r.choice([2, 3, 4])
    lengths = _lengths(r, T)
    if r.random() < 0.3:
        E, heads = r.choice([(4, 1), (4, 2), (6, 3)])
        causal, bias = r.random() < 0.5, r.random() < 0.7
        return Case(
            "attention",
            f"sdpa E={E} h={heads} causal={causal} bias={bias} T={lengths}",
            SDPANet(E, heads, causal, bias, k),
            _floats(T, 3, lengths=lengths),
            k,
        )
    E, heads = r.choice([(4, 1), (4, 2), (6, 2)])
    kdim = r.choice([None, None, 3, 5])
    vdim = kdim if kdim is None else r.choice([kdim, 2])
    opts = {
        "batch_first": r.random() < 0.6,
        "bias": r.random() < 0.8,
        "add_bias_kv": r.random() < 0.2,
        "add_zero_attn": r.random() < 0.15,
        "kdim": kdim,
        "vdim": vdim,
    }
    mha = nn.MultiheadAttention(E, heads, **opts)
    cross, mask, weights = r.random() < 0.3, r.random() < 0.3, r.random() < 0.5
    desc = f"MHA(E={E},h={heads},{opts}) cross={cross} key_padding_mask={mask} need_weights={weights} T={lengths}"
    return Case("attention", desc, MHANet(mha, cross, mask, weights, E, k), _floats(T, 3, lengths=lengths), k)


class RNNNet(nn.Module):
    """A recurrent module on float sequences, read through ``output``, ``h_n`` (an LSTM: and
    ``c_n``) or both; ``h0``: an initial state computed from the example."""

    def __init__(self, rnn: nn.RNNBase, use: str, h0: bool, k: int) -> None:
        super().__init__()
        self.rnn, self.use = rnn, use
        self.lstm = isinstance(rnn, nn.LSTM)
        D, P = 2 if rnn.bidirectional else 1, getattr(rnn, "proj_size", 0) or rnn.hidden_size
        self.sizes = [rnn.num_layers * D * P] + [rnn.num_layers * D * rnn.hidden_size] * self.lstm
        self.init = nn.Linear(rnn.input_size, sum(self.sizes)) if h0 else None
        width = {"output": D * P, "h_n": P + rnn.hidden_size * self.lstm}
        self.head = nn.Linear(width["output"] + width["h_n"] if use == "both" else width[use], k)

    def forward(self, x):
        hx = None
        if self.init is not None:
            s = torch.tanh(self.init(x.mean(1))).split(self.sizes, 1)
            D = 2 if self.rnn.bidirectional else 1
            s = [t.reshape(x.shape[0], self.rnn.num_layers * D, -1).transpose(0, 1) for t in s]
            hx = tuple(s) if self.lstm else s[0]
        seq = x if self.rnn.batch_first else x.transpose(0, 1)
        out, h = self.rnn(seq, hx)
        out = out if self.rnn.batch_first else out.transpose(0, 1)
        feats = [out.mean(1)] if self.use in ("output", "both") else []
        if self.use in ("h_n", "both"):
            feats += [h[0][-1], h[1][-1]] if self.lstm else [h[-1]]  # LSTM: (h_n, c_n)
        return self.head(torch.cat(feats, 1))


def _rnn(r: random.Random, k: int) -> Case:
    cls = r.choice([nn.LSTM, nn.GRU, nn.RNN])
    d, H, T = 3, r.choice([2, 4]), r.choice([2, 4])
    opts = {"batch_first": r.random() < 0.5, "bidirectional": r.random() < 0.3, "num_layers": r.choice([1, 2])}
    opts["bias"] = r.random() < 0.8
    if opts["num_layers"] > 1 and r.random() < 0.3:
        opts["dropout"] = 0.5  # between layers; the cases run in eval mode
    if cls is nn.RNN:
        opts["nonlinearity"] = r.choice(["tanh", "relu"])
    if cls is nn.LSTM and r.random() < 0.3:
        opts["proj_size"] = 1
    use, h0 = r.choice(["output", "h_n", "both"]), r.random() < 0.4
    lengths = _lengths(r, T)
    desc = f"{cls.__name__}(3,{H},{opts}) use={use} h0={h0} T={lengths}"
    return Case("rnn", desc, RNNNet(cls(d, H, **opts), use, h0, k), _floats(T, d, lengths=lengths), k)


class KwBlock(nn.Module):
    def __init__(self, d: int, ret: str) -> None:
        super().__init__()
        self.fc, self.gate, self.ret = nn.Linear(d, d), nn.Linear(d, d), ret

    def forward(self, x, *, scale: float = 1.0, residual: torch.Tensor | None = None):
        h = torch.tanh(self.fc(x)) * scale
        if residual is not None:
            h = h + residual
        g = torch.sigmoid(self.gate(x))
        if self.ret == "tuple":
            return h, g
        if self.ret == "dict":
            return {"h": h, "g": g}
        return h * g


class CustomNet(nn.Module):
    def __init__(self, d: int, k: int, ret: str, call: str, depth: int) -> None:
        super().__init__()
        self.ret, self.call = ret, call
        self.blocks = nn.ModuleList(KwBlock(d, ret) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, k))

    def forward(self, x):
        h = x
        for blk in self.blocks:
            if self.call == "kwarg-input":
                out = blk(x=h, scale=0.5)
            elif self.call == "residual-kwarg":
                out = blk(h, residual=h)
            else:
                out = blk(h)
            if self.ret == "tuple":
                a, g = out
                out = a * g
            elif self.ret == "dict":
                out = out["h"] * out["g"]
            h = h + out  # a residual block
        return self.head(_pool(h))


def _custom(r: random.Random, k: int) -> Case:
    d = r.choice([3, 4])
    ret, call = r.choice(["tensor", "tuple", "dict"]), r.choice(["plain", "kwarg-input", "residual-kwarg"])
    depth = r.choice([1, 2])
    shape = r.choice([(d,), (2, d)])
    lengths = _lengths(r, 2) if len(shape) > 1 else ()
    desc = f"blocks={depth} return={ret} call={call} in={shape} lengths={lengths}"
    return Case("custom", desc, CustomNet(d, k, ret, call, depth), _floats(*shape, lengths=lengths), k)


FAMILIES: dict[str, Callable[[random.Random, int], Case]] = {
    "linear": _linear,
    "conv": _conv,
    "embedding": _embedding,
    "norm": _norm,
    "params": _params,
    "tied": _tied,
    "attention": _attention,
    "rnn": _rnn,
    "custom": _custom,
}


def draw(seed: int, index: int, families: list[str] | None = None) -> Case:
    """Case ``index`` of the run with ``seed``: the family by turns, everything else from the seed."""
    names = families or list(FAMILIES)
    r = random.Random(f"{seed}:{index}")
    torch.manual_seed(r.randrange(2**31))
    case = FAMILIES[names[index % len(names)]](r, r.choice([2, 3]))
    case.model = case.model.double().eval()  # eval: no dropout, so the methods see the same function
    return case


# --------------------------------------------------------------------------------- comparison


@dataclass
class Outcome:
    method: str
    status: str  # agree | refused | crashed | wrong | unjudged
    rel_sum: float = 0.0
    rel_norm: float = 0.0
    under: float = 0.0  # worst (loop - ours) / loop norm, > 0: a norm under-estimate
    detail: str = ""


def _batch(case: Case, B: int, seed: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return case.make_x(B, g, j), torch.randint(0, case.n_classes, (B,), generator=g)


def batches(case: Case, r: random.Random) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(x, y, valid) for three calls: B1 (1 in a quarter of the draws), B2, and a padded call."""
    out = []
    for j, B in enumerate((r.choice([1, 2, 3, 5]), r.choice([2, 4, 6]), r.choice([3, 5]))):
        x, y = _batch(case, B, r.randrange(2**31) + j, j)
        out.append((x, y, B - 1 if j == 2 else B))
    return out


def _classify(e: Exception) -> tuple[str, str]:
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, InputError) and "\n" not in str(e):
        return "refused", text
    return "crashed", text


def run_case(
    seed: int, index: int, verbose: bool = False, families: list[str] | None = None
) -> tuple[Case, list[Outcome]]:
    """Every method against the loop on the case's three batches (one clipper per method)."""
    case = draw(seed, index, families)
    r = random.Random(f"{seed}:{index}:batches")
    calls = batches(case, r)
    refs: list = []
    loop_err = None
    for x, y, valid in calls:
        try:
            ref = LoopClipper(case.model)(x[:valid], y[:valid], 1.0)
            norms = ref.norms
            clip = float(norms.median()) if float(norms.max()) > 0 else 1.0
            refs.append((LoopClipper(case.model)(x[:valid], y[:valid], clip), clip))
        except Exception as e:
            loop_err = e
            if verbose:
                traceback.print_exc()
            break
    outcomes = []
    if loop_err is not None:
        status, text = _classify(loop_err)
        outcomes.append(Outcome("loop", status, detail=text))
    for method in METHODS:
        if method == "loop" and loop_err is not None:
            continue
        # A fresh copy of the model per method (same seed, same weights): one method's side effects
        # cannot leak into the next.
        outcomes.append(_run_method(draw(seed, index, families), method, calls, refs, loop_err, verbose))
    return case, outcomes


def _slots(model: nn.Module) -> dict[str, int]:
    return {n: id(p) for n, p in model.named_parameters(remove_duplicate=False)}


def _run_method(case: Case, method: str, calls, refs, loop_err, verbose: bool) -> Outcome:
    worst = Outcome(method, "agree")
    clipper = None
    before = _slots(case.model)
    try:
        clipper = make_clipper(case.model, method)
        for (x, y, valid), ref in zip(calls, refs or [None] * len(calls), strict=True):
            clip = ref[1] if ref is not None else 1.0
            got = clipper(x, y, clip, valid=valid) if valid < x.shape[0] else clipper(x, y, clip)
            if ref is None:
                continue
            want = ref[0]
            rel_sum = math.sqrt(sum(float((a - b).square().sum()) for a, b in zip(got.grads, want.grads, strict=True)))
            # Relative to Σ_i ‖c_i g_i‖ = Σ_i min(‖g_i‖, C), the size of the terms (>= ‖Σ_i c_i g_i‖): two
            # examples with opposite gradients cancel in the sum, and rounding does not cancel with them.
            rel_sum /= max(float(want.norms.clamp(max=clip).sum()), 1e-300)
            scale = max(float(want.norms.max()), 1e-300)
            rel_norm = float((got.norms - want.norms).abs().max()) / scale
            pos = want.norms > 0
            under = float(((want.norms - got.norms)[pos] / want.norms[pos]).max()) if bool(pos.any()) else 0.0
            worst.rel_sum, worst.rel_norm = max(worst.rel_sum, rel_sum), max(worst.rel_norm, rel_norm)
            worst.under = max(worst.under, under)
    except Exception as e:
        if verbose:
            traceback.print_exc()
        worst.status, worst.detail = _classify(e)
        return worst
    finally:
        if clipper is not None:
            clipper.close()
    changed = sorted(n for n, i in _slots(case.model).items() if before.get(n) != i)
    if changed:  # the clipper left the model with other tensors than its parameters
        worst.status, worst.detail = "wrong", f"the model's {', '.join(changed)} replaced by another tensor"
        return worst
    if loop_err is not None:
        # The loop refused (or crashed on) the model; a method that returns numbers cannot be judged.
        worst.status = "unjudged"
        worst.detail = f"loop: {type(loop_err).__name__}"
    elif worst.rel_sum > TOL or worst.rel_norm > TOL:
        worst.status = "wrong"
        where = clipper.describe() if clipper is not None else {}
        worst.detail = f"rel. sum error {worst.rel_sum:.2e}, norm error {worst.rel_norm:.2e}; {where}"
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300, help="number of cases")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--case", type=int, default=None, help="run only this case index (a reproducer)")
    ap.add_argument("--families", default=None, help="comma-separated subset of " + ",".join(FAMILIES))
    ap.add_argument("--budget", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*batching rule.*")  # vmap's slow-path notices
    families = args.families.split(",") if args.families else None
    indices = [args.case] if args.case is not None else range(args.n)
    t0 = time.perf_counter()
    table: dict[tuple[str, str], dict] = {}
    bugs: list[str] = []
    done = 0
    for i in indices:
        if args.budget is not None and time.perf_counter() - t0 > args.budget:
            break
        case, outcomes = run_case(args.seed, i, args.verbose, families)
        done += 1
        for o in outcomes:
            row = table.setdefault(
                (case.family, o.method),
                {"n": 0, "agree": 0, "refused": 0, "crashed": 0, "wrong": 0, "unjudged": 0, "err": 0.0, "under": 0.0},
            )
            row["n"] += 1
            row[o.status] += 1
            row["err"] = max(row["err"], o.rel_sum, o.rel_norm)
            row["under"] = max(row["under"], o.under)
            if args.verbose or o.status in ("crashed", "wrong"):
                line = f"seed={args.seed} case={i} [{case.family}] {case.desc} | {o.method}: {o.status}"
                if o.detail:
                    line += f" ({o.detail[:300]})"
                if o.status in ("crashed", "wrong"):
                    bugs.append(line)
                if args.verbose:
                    print(line)
    header = (
        f"{'family':<10} {'method':<6} {'n':>4} {'agree':>5} {'refused':>7} {'crashed':>7} {'wrong':>5} "
        f"{'unjudged':>8} {'worst rel.err':>13} {'worst under':>11}"
    )
    print(f"clipping fuzz: seed {args.seed}, {done} cases, {time.perf_counter() - t0:.0f} s")
    print(header)
    for (fam, method), row in sorted(
        table.items(), key=lambda kv: (list(FAMILIES).index(kv[0][0]), METHODS.index(kv[0][1]))
    ):
        print(
            f"{fam:<10} {method:<6} {row['n']:>4} {row['agree']:>5} {row['refused']:>7} {row['crashed']:>7} "
            f"{row['wrong']:>5} {row['unjudged']:>8} {row['err']:>13.1e} {row['under']:>11.1e}"
        )
    if bugs:
        print(f"\n{len(bugs)} crashed or wrong (reproduce: python benchmarks/clipping_fuzz.py --seed S --case I -v):")
        for b in bugs:
            print("  " + b)
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
