"""One DP-SGD epoch of a user's traced model (not an ``nn.Sequential``) on the torch and the JAX backend.

The model is the test factory ``tests.core.byo_models:tiny_transformer`` (token + ``arange`` positional embedding,
LayerNorm, F.scaled_dot_product_attention, GELU MLP, mean pooling; 10 tokens, T = 16) or with ``--model cnn``
``residual_groupnorm_cnn`` (1x16x16 inputs), or with ``--model encoder`` ``encoder_transformer`` (token +
positional embeddings through a 2-layer ``nn.TransformerEncoder``, d = 16, 2 heads, causal mask, final LayerNorm;
T = 16); float32, N = 2048 records, Poisson batches of expected size 64 (q = 1/32), σ = 1, C = 1, 32 steps per
epoch. The JAX backend runs the model from its torch.fx graph and clips by ``vmap(grad)``; the torch backend by
its default clipper (``--clipping auto``). After a warm-up run, each backend trains a fresh model for 1 and for 3
epochs: the first time includes what a run pays once (JAX: tracing and compiling), half the difference is one
epoch after that. Prints seconds; no numbers are asserted anywhere.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/jax_fx_epoch.py [--model cnn|encoder]
"""

from __future__ import annotations

import argparse
import time

import torch

from dpaudit.training.algorithms import get_trainer
from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig
from dpaudit.training.jax_backend import JaxTrainer
from tests.core import byo_models as byo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("transformer", "cnn", "encoder"), default="transformer")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    n, steps = 2048, 32
    if args.model in ("transformer", "encoder"):
        x = torch.randint(0, 10, (n, 16), generator=g)

        def make():
            return byo.tiny_transformer(10, 2) if args.model == "transformer" else byo.encoder_transformer(10, 16, 2)
    else:
        x = torch.randn(n, 1, 16, 16, generator=g)

        def make():
            return byo.residual_groupnorm_cnn(1, 2)

    y = torch.randint(0, 2, (n,), generator=g)
    for label in ("torch", "jax"):
        seconds = {}
        for epochs in (0, 1, 3):  # 0: a one-epoch warm-up run (imports, JAX's backend start), not reported
            dp = DPConfig(clip=1.0, noise_multiplier=1.0)
            config = TrainConfig(algo="dpsgd", steps=steps * max(epochs, 1), batch_size=64, lr=0.1, dp=dp)
            trainer = JaxTrainer(config, PerfConfig(backend="jax")) if label == "jax" else get_trainer("dpsgd")(config)
            torch.manual_seed(0)
            t0 = time.perf_counter()
            trainer.fit(make(), x, y)
            seconds[epochs] = time.perf_counter() - t0
        per_epoch = (seconds[3] - seconds[1]) / 2  # without what every run pays once (JAX: tracing, compiling)
        print(f"{args.model} {label}: 1 epoch {seconds[1]:.2f} s, 3 epochs {seconds[3]:.2f} s, {per_epoch:.2f} s/epoch")


if __name__ == "__main__":
    main()
