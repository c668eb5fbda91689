"""nn.LSTM / nn.GRU / nn.RNN under ghost and auto clipping: per-example gradients by recomputing the
recurrence from the recorded inputs (``_rnn_per_example``), compared with the one-example-at-a-time
loop in float64 (the methods differ by rounding only; RTOL is far above it and far below any mistake).

With the first-call check a wrong rule would be moved to a vmap (ghost then refuses, auto uses the
loop), so every test also asserts the route recorded is the recompute; the batch-of-one, padded and
projection tests also run ``check=False`` (the rule's own numbers, unchecked)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from dpaudit.training.clipping import GhostClipper, LoopClipper, make_clipper

RTOL = 1e-8
V, E, H, T, K = 7, 3, 2, 4, 3
RECOMPUTE = "per-example by recomputing the recurrence"
KINDS = {
    "lstm": (nn.LSTM, {}),
    "gru": (nn.GRU, {}),
    "rnn-tanh": (nn.RNN, {"nonlinearity": "tanh"}),
    "rnn-relu": (nn.RNN, {"nonlinearity": "relu"}),
}


class TextRNN(nn.Module):
    """Embedding -> recurrent module -> linear head on ``output[:, -1]``, ``h_n[-1]`` (and ``c_n[-1]``
    for an LSTM) or both; ``h0``: the initial state computed from the example (so it differs per
    example and its gradient reaches ``init``)."""

    def __init__(self, kind: str, use: str, h0: bool, **opts) -> None:
        super().__init__()
        cls, extra = KINDS[kind]
        self.emb = nn.Embedding(V, E)
        self.rnn = cls(E, H, **extra, **opts)
        self.use, self.lstm = use, cls is nn.LSTM
        L, D = self.rnn.num_layers, 2 if self.rnn.bidirectional else 1
        P = opts.get("proj_size") or H  # the size of h (an LSTM's c keeps H)
        self.sizes = [L * D * P] + [L * D * H] * self.lstm
        self.init = nn.Linear(E, sum(self.sizes)) if h0 else None
        width = {"output": D * P, "h_n": P + H * self.lstm}
        self.head = nn.Linear(width["output"] + width["h_n"] if use == "both" else width[use], K)

    def forward(self, tok):
        x = self.emb(tok)  # (B, T, E)
        B = x.shape[0]
        hx = None
        if self.init is not None:
            s = torch.tanh(self.init(x.mean(1))).split(self.sizes, 1)
            s = [
                t.reshape(B, self.rnn.num_layers * (2 if self.rnn.bidirectional else 1), -1).transpose(0, 1) for t in s
            ]
            hx = tuple(s) if self.lstm else s[0]  # (L·D, B, ·)
        first = self.rnn.batch_first
        out, h = self.rnn(x if first else x.transpose(0, 1), hx)
        out = out if first else out.transpose(0, 1)
        feats = []
        if self.use in ("output", "both"):
            feats.append(out[:, -1])
        if self.use in ("h_n", "both"):
            feats += [h[0][-1], h[1][-1]] if self.lstm else [h[-1]]  # LSTM: (h_n, c_n)
        return self.head(torch.cat(feats, 1))


def _data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n, T), generator=g), torch.randint(0, K, (n,), generator=g)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-300))


def _reference(model, x, y):
    """The loop's result at C = the median loop norm (so some examples are clipped)."""
    clip = float(LoopClipper(model)(x, y, 1.0).norms.median())
    return clip, LoopClipper(model)(x, y, clip)


def assert_agrees(clipper, model, x, y, *, valid: int | None = None, ref=None) -> None:
    """Clipped sum and norms equal the loop's."""
    n = x.shape[0] if valid is None else valid
    clip, want = ref or _reference(model, x[:n], y[:n])
    got = clipper(x, y, clip) if valid is None else clipper(x, y, clip, valid=valid)
    assert _rel(got.norms, want.norms) < RTOL
    for g, w in zip(got.grads, want.grads, strict=True):
        assert _rel(g, w) < RTOL


def _route(clipper) -> str:
    return clipper.describe()["layers"]["rnn"]


CASES = list(itertools.product(KINDS, (1, 2), (False, True), (False, True), (True, False)))


@pytest.mark.parametrize("kind, layers, bidirectional, batch_first, bias", CASES, ids=str)
def test_recurrent_modules_are_recomputed_and_agree_with_the_loop(kind, layers, bidirectional, batch_first, bias):
    i = CASES.index((kind, layers, bidirectional, batch_first, bias))
    use, h0 = ("output", "h_n", "both")[i % 3], i % 2 == 1  # every use with and without h0
    torch.manual_seed(i)
    opts = {"num_layers": layers, "bidirectional": bidirectional, "batch_first": batch_first, "bias": bias}
    model = TextRNN(kind, use, h0, **opts).double()
    batches = [_data(5, seed=i), _data(3, seed=100 + i)]  # a later batch of another size
    refs = [_reference(model, x, y) for x, y in batches]
    # auto on a quarter of the cases (it runs the same ghost code; the other tests use it too)
    # (a wrong rule would be rerouted by the first-call check: the route assertion catches it)
    clippers = [GhostClipper(model)] + [make_clipper(model, "auto")] * (i % 4 == 0)
    for clipper in clippers:
        for (x, y), ref in zip(batches, refs, strict=True):
            assert_agrees(clipper, model, x, y, ref=ref)
        assert _route(clipper).startswith(RECOMPUTE), clipper.describe()
        assert clipper.describe()["method"] == "ghost"  # auto chose ghost, not the loop


@pytest.mark.parametrize("kind, use", list(zip(KINDS, ["both", "h_n", "output", "both"], strict=True)))
def test_batch_of_one_and_padded_calls(kind, use):
    torch.manual_seed(3)
    model = TextRNN(kind, use, True, num_layers=2, bidirectional=True).double()
    x, y = _data(4, seed=3)
    for clipper in (GhostClipper(model, check=False), make_clipper(model, "auto")):
        assert_agrees(clipper, model, x[:1], y[:1])  # batch 1 first
        assert_agrees(clipper, model, x, y)
        # padding rows (copies of real rows, as dpsgd pads) add nothing
        assert_agrees(clipper, model, torch.cat([x, x[:2]]), torch.cat([y, y[:2]]), valid=4)
        assert _route(clipper).startswith(RECOMPUTE)


@pytest.mark.parametrize("kind", list(KINDS))
def test_dropout_between_layers_in_training_is_not_recomputed(kind):
    # The recompute cannot reproduce torch's dropout masks: the module goes to a vmap, which cannot run
    # the fused kernels, so ghost refuses and auto falls back to the (exact) loop.
    torch.manual_seed(5)
    model = TextRNN(kind, "both", False, num_layers=2, dropout=0.5, batch_first=True).double()
    x, y = _data(4, seed=5)
    clipper = make_clipper(model, "auto")
    norms = clipper(x, y, 1.0).norms
    described = clipper.describe()
    assert described["method"] == "loop" and described["tried"][0].startswith("ghost"), described
    assert norms.shape == (4,) and bool(torch.isfinite(norms).all())
    model.eval()  # without dropout (evaluation mode) the recompute is exact again
    clipper = make_clipper(model, "auto")
    assert_agrees(clipper, model, x, y)
    assert _route(clipper).startswith(RECOMPUTE)


@pytest.mark.parametrize("use", ["output", "h_n", "both"])
@pytest.mark.parametrize("layers, bidirectional, batch_first", [(1, False, True), (2, True, False)])
def test_lstm_with_projection(use, layers, bidirectional, batch_first):
    # proj_size: h_t = W_hr (o ⊙ tanh(c_t)); weight_hr's per-example gradient from the projected states
    torch.manual_seed(8)
    opts = {"num_layers": layers, "bidirectional": bidirectional, "batch_first": batch_first, "proj_size": 1}
    model = TextRNN("lstm", use, layers == 2, **opts).double()
    x, y = _data(5, seed=8)
    ref = _reference(model, x, y)
    for clipper in (GhostClipper(model), GhostClipper(model, check=False), make_clipper(model, "auto")):
        assert_agrees(clipper, model, x, y, ref=ref)
        assert _route(clipper).startswith(RECOMPUTE) and "weight_hr_l0" in _route(clipper)


class UnbatchedRNN(nn.Module):
    """Each example's sequence fed to the GRU on its own as a 2-D (T, E) input (an unbatched call)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(V, E), nn.GRU(E, H), nn.Linear(H, K)

    def forward(self, tok):
        return self.head(torch.stack([self.rnn(e)[1][-1] for e in self.emb(tok)]))


def test_unbatched_input_is_not_recomputed():
    torch.manual_seed(9)
    model = UnbatchedRNN().double()
    x, y = _data(4, seed=9)
    clipper = make_clipper(model, "auto")
    assert_agrees(clipper, model, x, y)
    assert clipper.describe()["method"] == "loop", clipper.describe()  # the GRU not recomputed: no vmap, the loop


class PackedRNN(nn.Module):
    """A PackedSequence call: each example's length from its tokens (trailing ``0`` ids are padding)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(V, E), nn.LSTM(E, H, batch_first=True), nn.Linear(H, K)

    def forward(self, tok):
        lengths = (T - (tok.flip(1).cumsum(1) == 0).sum(1)).clamp(min=1)
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(tok), lengths, batch_first=True, enforce_sorted=False)
        return self.head(self.rnn(packed)[1][0][-1])


def test_packed_sequence_is_not_recomputed():
    torch.manual_seed(10)
    model = PackedRNN().double()
    x, y = _data(4, seed=10)
    x[0, 2:] = 0  # one shorter sequence
    clipper = make_clipper(model, "auto")
    assert_agrees(clipper, model, x, y)
    described = clipper.describe()
    assert described["method"] == "loop", described  # ghost refuses (a vmap over the module), auto: the loop
