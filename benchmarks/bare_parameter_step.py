"""One DP-SGD step on models whose own bare ``nn.Parameter``s are broadcast against the batch (a ViT's
cls token and position embedding, a GPT's ``wpe``): ``ghost`` / ``auto`` clipping (those parameters'
per-example gradients from their broadcast uses), the same ghost plan with them on the vmap over the
whole model (what ghost did before), Opacus 1.6 where it runs, against the non-private step measured
in the same run.

    .venv/bin/python benchmarks/bare_parameter_step.py [--threads 1] [--batch 64] [--rounds 5] [--dim 192]
        [--memory]

Models (timm's layout in small): ``vit``: 3x32x32 images, a 4x4 patch-embedding Conv2d (64 tokens +
cls), ``cls_token`` (1, 1, d) and ``pos_embed`` (1, 65, d) bare parameters of the model, ``--depth``
pre-LN blocks with timm's attention (one qkv Linear, ``F.scaled_dot_product_attention``) and an MLP,
10 classes from the cls token. ``gpt``: tokens of length ``--length`` (128), vocabulary 256, a bare
``wpe`` (T_max=2T, d) sliced to T, the same blocks (causal), the head tied to the token embedding,
the last position's logits. Each method runs on its own copy of the model with the steps of
benchmarks/dpsgd_throughput.py (gather, clip, noise, update), in interleaved rounds; the table shows
the median step time and its ratio to the non-private step. ``--memory`` adds the peak of live tensor
storage of one step (dpsgd_throughput.tensor_peak_mib: deterministic, slow). ``--leftover`` gives both
models parameters their forward pass never uses (an MAE-style ``mask_token`` and a ``pooler`` Linear(d, d)
never called), which ghost gives per-example gradient 0 (the old path: the vmap over the model).
"""

from __future__ import annotations

import argparse
import copy
import warnings
from contextlib import contextmanager

import torch
from dpsgd_throughput import measure, nonprivate_step, opacus_step, ours_step, tensor_peak_mib
from torch import nn
from torch.nn import functional as F

from dpaudit.training import clipping


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(o.transpose(1, 2).reshape(B, T, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, causal)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(
        self, d: int, depth: int, heads: int, patch: int = 4, size: int = 32, n_classes: int = 10, leftover=False
    ) -> None:
        super().__init__()
        if leftover:
            _leftover(self, d)
        self.patch_embed = nn.Conv2d(3, d, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.Sequential(*(Block(d, heads, causal=False) for _ in range(depth)))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class GPT(nn.Module):
    def __init__(self, d: int, depth: int, heads: int, t_max: int, vocab: int = 256, leftover=False) -> None:
        super().__init__()
        if leftover:
            _leftover(self, d)
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Parameter(torch.randn(t_max, d) * 0.02)
        self.blocks = nn.Sequential(*(Block(d, heads, causal=True) for _ in range(depth)))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, tok):
        x = self.wte(tok) + self.wpe[: tok.shape[1]]
        return self.head(self.norm(self.blocks(x))[:, -1])


def _leftover(model: nn.Module, d: int) -> None:
    # Parameters the forward pass never uses (a pretraining head, an MAE's mask token).
    model.mask_token = nn.Parameter(torch.zeros(1, 1, d))
    model.pooler = nn.Linear(d, d)


@contextmanager
def bare_on_the_model_vmap():
    """Plans built inside send every bare parameter to the vmap over the model (the path before)."""
    real = clipping._probe_bare
    clipping._probe_bare = lambda model, x, params: ([], {k: "(benchmark: the old path)" for k in params})
    try:
        yield
    finally:
        clipping._probe_bare = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dim", type=int, default=192)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--models", default="vit,gpt")
    ap.add_argument("--no-opacus", action="store_true")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--leftover", action="store_true", help="add parameters the forward pass never uses")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.models.split(","):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        if name == "vit":
            model = ViT(args.dim, args.depth, args.heads, leftover=args.leftover)
            x = torch.randn(args.batch, 3, 32, 32, generator=g)
            y = torch.randint(0, 10, (args.batch,), generator=g)
        else:
            model = GPT(args.dim, args.depth, args.heads, 2 * args.length, leftover=args.leftover)
            x = torch.randint(0, 256, (args.batch, args.length), generator=g)
            y = torch.randint(0, 256, (args.batch,), generator=g)
        plans: dict = {}
        steps = {
            "non-private": nonprivate_step(copy.deepcopy(model), x, y),
            "ghost": ours_step(copy.deepcopy(model), x, y, "ghost", plans),
            "auto": ours_step(copy.deepcopy(model), x, y, "auto", plans),
        }
        old: dict = {}
        steps["ghost, bare on model vmap"] = ours_step(copy.deepcopy(model), x, y, "ghost", old)
        if not args.no_opacus:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    step = opacus_step(copy.deepcopy(model), x, y, "hooks")
                except Exception as e:  # a peer that cannot run the model is reported, not fatal
                    print(f"  Opacus hooks: cannot run ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
                    step = None
            if step is not None:
                steps["Opacus hooks"] = step
        for n, step in steps.items():  # first calls: plans, checks
            with bare_on_the_model_vmap() if n == "ghost, bare on model vmap" else warnings.catch_warnings():
                warnings.simplefilter("ignore")
                step()
        med = measure(steps, args.rounds, dict.fromkeys(steps, 1), torch.device("cpu"))[0]  # interleaved rounds
        mem = {n: tensor_peak_mib(step) for n, step in steps.items()} if args.memory else {}
        print(
            f"{name}: B={args.batch}, d={args.dim}, depth={args.depth}"
            + (f", T={args.length}" if name == "gpt" else ", 3x32x32 patch 4 (65 tokens)")
            + f", {args.threads} thread(s), median of {args.rounds} rounds"
        )
        desc = plans["ghost"].describe()["layers"]
        print(f"  ghost, bare parameters: { {k: v for k, v in desc.items() if 'broadcast' in v or 'no call' in v} }")
        print(f"  old path: {old['ghost'].describe()['layers'].get('(model)')}")
        for n, t in med.items():
            extra = f"   peak tensors {mem[n]:7.1f} MiB" if mem else ""
            print(f"  {n:26s} {t * 1e3:9.1f} ms   x{t / med['non-private']:5.2f} non-private{extra}")
        print(f"  old / ghost: {med['ghost, bare on model vmap'] / med['ghost']:.2f}")


if __name__ == "__main__":
    main()
