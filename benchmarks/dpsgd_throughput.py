"""Throughput of one DP-SGD step: our clipping methods and Opacus against non-private SGD.

    .venv/bin/python benchmarks/dpsgd_throughput.py [--threads 2] [--batch 256] [--rounds 7] [--loop]
        [--device cpu|cuda] [--jax]

One step = gathering the batch, forward, backward, (per-example clipping, noise) and an SGD update
on a batch of 256 (what the trainers do per step, data loading aside),
for the zoo's MLP and CNN on digits-shaped input (1x8x8, 10 classes) and its LSTM on token
sequences (length 20, vocabulary 50); ``--models mlp-own,cnn-own``: the same MLP and CNN inside a module with a
forward of its own, as users write theirs (the JAX backend runs them from their torch.fx graph). Every method
runs on its own copy of the same model and batch, in interleaved rounds (so a change of machine load hits all
methods alike); the table shows the median step time over rounds, examples per second, the ratio to non-private
SGD measured in the same run, and the speed-up of our methods over Opacus' default hooks.

With ``--device cuda`` models, batches, batch orders and noise generators live on the GPU (as in the
trainers) and the clock is read only after ``torch.cuda.synchronize()``, so a time covers the
kernels a step launched, not just their launch.

Opacus (an optional peer: ``pip install opacus``) is used through its public PrivacyEngine with
``grad_sample_mode="hooks"`` (per-sample gradients from module hooks) and ``"ghost"`` (its fast
gradient clipping, two backward passes). Our ``ghost`` is ghost norms + book-keeping (one
backward, no parameter gradients); ``ghost-2bw`` is the same norms followed by Li et al.'s second,
re-weighted backward pass, measured here only to justify the choice of book-keeping. ``ours ghost
patches`` / ``grouped`` force the route by which instantiated Conv2d layers get their per-example
gradients (unfolded patches / one grouped convolution, no patches); ``ours ghost`` takes the
device's default. ``ours ghost graphed`` (CUDA only; elsewhere reported unavailable) is ``ours
ghost`` on a fixed device-side batch captured once into a CUDA graph and replayed per step
(benchmarks/cuda_graph_step.py; prepared for the host-bound GPU step, not yet run on a GPU).
``ours poisson`` is the DP trainer's whole step: a Poisson batch (rate 1/4 of four copies of the batch)
drawn on the host, sent to the device, gathered there and clipped; ``ours poisson pad`` / ``nopad``
force its padded physical chunks on / off (the trainer pads on CUDA only). ``host ms`` is the CPU
time the calling thread spends per step (launches and Python; the device sync excluded).

``--memory`` measures each step's peak memory (CUDA: ``max_memory_allocated``; CPU: peak RSS of a fresh
process per row, the first step's one-time work included, or with ``--memory-warm`` steady-state steps
only); ``--tensor-memory`` adds the peak of live tensor storage one step creates, tracked op
by op in process (deterministic on the CPU, where RSS moves with the allocator and page rounding).

``--jax`` adds the JAX backend's jit-compiled steps (non-private, DP-SGD, DP-SGD-JL with one
projection) on the same models and batches, in the same interleaved rounds, and a second table
with their compile time (first call minus steady-state step) and ratios to JAX non-private. On the
CPU it also pins the process to ``--threads`` CPUs, the only way to hold XLA:CPU to that many.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from cuda_graph_step import GraphedDPStep
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from dpaudit.models import build_model, default_spec
from dpaudit.training.clipping import GhostClipper, clip_factors, make_clipper
from dpaudit.training.dpsgd import poisson_sampler, set_private_gradients

SIGMA, CLIP, LR = 1.0, 1.0, 0.1


class CifarGroupNormCNN(nn.Module):
    """A CIFAR-sized residual CNN with GroupNorm (channels w, 2w, 4w: 64-256 at full size)."""

    def __init__(self, w: int, n_classes: int = 10) -> None:
        super().__init__()

        def gn(c: int) -> nn.GroupNorm:
            return nn.GroupNorm(8 if c >= 8 else 1, c)

        self.stem, self.n0 = nn.Conv2d(3, w, 3, padding=1), gn(w)
        self.c1, self.n1 = nn.Conv2d(w, w, 3, padding=1), gn(w)
        self.c2, self.n2 = nn.Conv2d(w, w, 3, padding=1), gn(w)
        self.d1, self.n3 = nn.Conv2d(w, 2 * w, 3, stride=2, padding=1), gn(2 * w)
        self.d2, self.n4 = nn.Conv2d(2 * w, 4 * w, 3, stride=2, padding=1), gn(4 * w)
        self.head = nn.Linear(4 * w, n_classes)

    def forward(self, x):
        h = F.relu(self.n0(self.stem(x)))
        h = F.relu(h + self.n2(self.c2(F.relu(self.n1(self.c1(h))))))  # residual block
        h = F.relu(self.n4(self.d2(F.relu(self.n3(self.d1(h))))))
        return self.head(h.mean((2, 3)))


class Block(nn.Module):
    """Pre-LN transformer block; attention from Linear layers + scaled_dot_product_attention, or
    ``nn.MultiheadAttention`` (packed in-projection) with ``mha=True``."""

    def __init__(self, d: int, heads: int, mha: bool) -> None:
        super().__init__()
        self.heads, self.mha = heads, mha
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        if mha:
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        else:
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, h):
        a = self.ln1(h)
        if self.mha:
            a = self.attn(a, a, a, need_weights=False)[0]
        else:
            B, T, d = a.shape
            q, k, v = self.qkv(a).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, d))
        h = h + a
        return h + self.mlp(self.ln2(h))


class ArangeTransformer(nn.Module):
    """2-layer transformer classifier; the positional embedding is called on torch.arange(T)."""

    def __init__(self, vocab: int, d: int, T: int, n_classes: int = 2, mha: bool = False) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.blocks = nn.Sequential(Block(d, 4, mha), Block(d, 4, mha))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, n_classes)

    def forward(self, tok):
        h = self.tok(tok) + self.pos(torch.arange(tok.shape[1], device=tok.device))
        return self.head(self.ln(self.blocks(h)).mean(1))


class TiedModel(nn.Module):
    """Embedding and output head share one weight (predict a token class from a sequence)."""

    def __init__(self, vocab: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tok):
        return self.head(self.mix(self.emb(tok)).mean(1))


class OwnForward(nn.Module):
    """A zoo model inside a module with a forward of its own, as users write theirs: the same computation, which the
    JAX backend runs from its torch.fx graph (not as the zoo's layer list)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)


# Sizes of the new workloads: "full" as in the issue (GPU), "small" for the 2-core CPU.
SIZES = {
    "full": {"width": 64, "image": 32, "vocab": 1000, "d": 128, "T": 64},
    "small": {"width": 16, "image": 16, "vocab": 200, "d": 64, "T": 32},
}


def workloads(
    batch: int, device: torch.device, size: str = "full"
) -> dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)  # drawn on CPU, then moved: the same data on every device
    image = (1, 8, 8)
    x_img = torch.randn(batch, *image, generator=g)
    y10 = torch.randint(0, 10, (batch,), generator=g)
    tokens = torch.randint(0, 50, (batch, 20), generator=g)
    y2 = torch.randint(0, 2, (batch,), generator=g)
    mnist = (1, 28, 28)  # MNIST-sized workloads (--models mlp-large,cnn-large): enough work for a GPU
    x_big = torch.randn(batch, *mnist, generator=g)
    out = {
        "mlp": (build_model(default_spec("mlp", input_shape=image, n_classes=10), seed=0), x_img, y10),
        "mlp-large": (
            build_model(default_spec("mlp", input_shape=mnist, n_classes=10, hidden=(1024, 1024)), seed=0),
            x_big,
            y10,
        ),
        "cnn-large": (
            build_model(default_spec("cnn", input_shape=mnist, n_classes=10, channels=(32, 64)), seed=0),
            x_big,
            y10,
        ),
        "cnn": (build_model(default_spec("cnn", input_shape=image, n_classes=10), seed=0), x_img, y10),
        "lstm": (
            build_model(default_spec("rnn", input_shape=(20,), n_classes=2, vocab_size=50), seed=0),
            tokens,
            y2,
        ),
    }
    out["mlp-own"] = (OwnForward(copy.deepcopy(out["mlp"][0])), x_img, y10)
    out["cnn-own"] = (OwnForward(copy.deepcopy(out["cnn"][0])), x_img, y10)
    z = SIZES[size]
    torch.manual_seed(0)
    seq = torch.randint(0, z["vocab"], (batch, z["T"]), generator=g)
    out["cifar-gn"] = (
        CifarGroupNormCNN(z["width"]),
        torch.randn(batch, 3, z["image"], z["image"], generator=g),
        y10,
    )
    out["transformer"] = (ArangeTransformer(z["vocab"], z["d"], z["T"]), seq, y2)
    out["transformer-mha"] = (ArangeTransformer(z["vocab"], z["d"], z["T"], mha=True), seq, y2)
    out["tied"] = (TiedModel(z["vocab"], z["d"]), seq, torch.randint(0, z["vocab"], (batch,), generator=g))
    return {k: (m.to(device), x.to(device), y.to(device)) for k, (m, x, y) in out.items()}


def _order(n: int, device: torch.device) -> torch.Tensor:
    # A fixed batch order; the DP trainers draw indices on the host and send them per step.
    return torch.randperm(n, generator=torch.Generator().manual_seed(0)).to(device)


def _noise_gen(device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def nonprivate_step(model, x, y) -> Callable[[], None]:
    """What the non-private trainer does per step: gather the batch, forward, backward, update."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    idx = _order(len(x), x.device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()

    return step


def ours_step(model, x, y, method: str, plans: dict | None = None, conv_route: str | None = None) -> Callable[[], None]:
    clipper = make_clipper(model, method) if conv_route is None else GhostClipper(model, conv_route=conv_route)
    if plans is not None:  # describe() after the first step: the per-layer choice
        plans[method if conv_route is None else f"{method} {conv_route}"] = clipper
    opt = torch.optim.SGD(clipper.params, lr=LR)
    gen = _noise_gen(x.device)
    idx = _order(len(x), torch.device("cpu"))  # host indices, sent to the device per step as the trainer does

    def step() -> None:  # exactly the DP trainer's step: gather, clip, noise once, divide, update
        set_private_gradients(
            clipper,
            x,
            y,
            idx,
            clip=CLIP,
            noise_std=SIGMA * CLIP,
            batch_size=len(x),
            max_physical_batch=None,
            generator=gen,
        )
        opt.step()

    return step


def ours_graphed_step(model, x, y) -> Callable[[], None]:
    """``ours ghost`` on a fixed batch (an index buffer on the device) captured once into a CUDA graph
    and replayed per step (:class:`cuda_graph_step.GraphedDPStep`; CUDA only, NOT YET RUN ON A GPU)."""
    clipper = make_clipper(model, "ghost")
    opt = torch.optim.SGD(clipper.params, lr=LR)
    idx = _order(len(x), x.device)
    return GraphedDPStep(
        clipper, opt, x, y, idx, clip=CLIP, noise_std=SIGMA * CLIP, batch_size=len(x), generator=_noise_gen(x.device)
    )


def ours_poisson_step(model, x, y, pad: bool | None = None) -> Callable[[], None]:
    """The DP trainer's whole step (``dpaudit.training.dpsgd.DPTrainer``, default settings): a Poisson
    batch at rate 1/4 from a training set of 4 copies of the batch (expected size = the batch), drawn
    on the host and sent to the device, gathered there, ghost clipping, no physical batch cap (a cap
    at the expected batch size would split about half the batches in two passes). ``pad``: padded
    physical chunks (:func:`dpaudit.training.dpsgd.padded_size`) forced on or off; None = the
    trainer's default (on CUDA only)."""
    X, Y = x.repeat(4, *([1] * (x.dim() - 1))), y.repeat(4)
    sample = poisson_sampler(len(X), len(x) / len(X), torch.Generator().manual_seed(0))
    clipper = make_clipper(model, "ghost")
    opt = torch.optim.SGD(clipper.params, lr=LR)
    gen = _noise_gen(x.device)

    def step() -> None:
        set_private_gradients(
            clipper,
            X,
            Y,
            sample(),
            clip=CLIP,
            noise_std=SIGMA * CLIP,
            batch_size=len(x),
            max_physical_batch=None,
            generator=gen,
            pad=pad,
        )
        opt.step()

    step.poisson = True  # many warm-up steps: the batch sizes (and shapes) vary per step
    return step


def ghost_second_backward_step(model, x, y) -> Callable[[], None]:
    """Ghost norms, then Σ_i c_i ℓ_i backpropagated again (Li et al. 2021, arXiv:2110.05679, Sec. 4)."""
    clipper = GhostClipper(model)
    idx = _order(len(x), x.device)
    clipper(x[idx], y[idx], CLIP)  # builds and checks the plan
    opt = torch.optim.SGD(clipper.params, lr=LR)
    gen = _noise_gen(x.device)

    def step() -> None:
        xb, yb = x[idx], y[idx]
        norms = clipper._norm_parts(clipper.plan_, xb, yb)[2]
        c = clip_factors(norms, CLIP)
        losses = F.cross_entropy(model(xb), yb, reduction="none")
        grads = torch.autograd.grad((losses * c).sum(), clipper.params)
        for p, g in zip(clipper.params, grads, strict=True):
            p.grad = g.add_(torch.randn(g.shape, generator=gen, device=g.device), alpha=SIGMA * CLIP).div_(len(x))
        opt.step()

    return step


def opacus_step(model, x, y, mode: str) -> Callable[[], None] | None:
    try:
        from opacus import PrivacyEngine
    except ImportError:
        return None
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=len(x))
    engine = PrivacyEngine()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    kwargs = dict(
        module=model,
        optimizer=opt,
        data_loader=loader,
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        poisson_sampling=False,
        grad_sample_mode=mode,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "ghost":
            gsm, dp_opt, criterion, _ = engine.make_private(**kwargs, criterion=nn.CrossEntropyLoss())
        else:
            gsm, dp_opt, _ = engine.make_private(**kwargs)
            criterion = nn.CrossEntropyLoss()

    idx = _order(len(x), x.device)

    def step() -> None:
        dp_opt.zero_grad(set_to_none=True)
        criterion(gsm(x[idx]), y[idx]).backward()
        dp_opt.step()

    return step


class JaxStep:
    """One step of the JAX backend's compiled program (``kind``: ``sgd`` non-private, ``dp`` DP-SGD,
    ``jl`` DP-SGD-JL with r = 1) on the same model, batch and batch order; the batch is one padded
    chunk of exactly B records (mask all ones). JAX dispatches asynchronously, so every call waits
    for its result. ``first_call_s`` is the first call (trace + XLA compile + one step): the compile
    time reported is that minus the steady-state step time."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, kind: str) -> None:
        import jax
        import jax.numpy as jnp

        from dpaudit.training import jax_backend as jb
        from dpaudit.training.config import TrainConfig

        self.jax, self.first_call_s = jax, None
        self.params = jb.params_from_torch(model)
        config = TrainConfig(algo="sgd", lr=LR, batch_size=len(x))
        self.prog = jb.StepProgram(
            jb.jax_forward(model), self.params, config, kind=kind, optimizer="sgd", clip=CLIP,
            noise_std=0.0 if kind == "sgd" else SIGMA * CLIP, jl_projections=1,
            noise_key=jax.random.key(0), jl_key=jax.random.key(1),
        )  # fmt: skip
        self.state = self.prog.init_state(self.params)
        self.X, self.Y = jnp.asarray(x.cpu().numpy()), jnp.asarray(y.cpu().numpy().astype("int32"))
        self.idx = jnp.asarray(_order(len(x), torch.device("cpu")).numpy().astype("int32"))
        self.mask = jnp.ones(len(x), dtype=bool)
        self.t, self.divisor = 0, float(len(x))

    def __call__(self) -> None:
        start = time.perf_counter()
        self.params, self.state = self.prog.step(
            self.params, self.state, self.X, self.Y, self.idx, self.mask, self.prog.zeros, self.t, self.divisor
        )
        self.jax.block_until_ready(self.params)
        self.t += 1
        if self.first_call_s is None:
            self.first_call_s = time.perf_counter() - start


JAX_ROWS = {"jax non-private": "sgd", "jax dpsgd": "dp", "jax jl(1)": "jl"}


def makers(
    x: torch.Tensor, y: torch.Tensor, loop: bool, jax_rows: bool = False, plans: dict | None = None
) -> dict[str, Callable[[nn.Module], Callable[[], None] | None]]:
    out = {
        "non-private": lambda m: nonprivate_step(m, x, y),
        "ours ghost": lambda m: ours_step(m, x, y, "ghost", plans),
        "ours ghost patches": lambda m: ours_step(m, x, y, "ghost", plans, conv_route="patches"),
        "ours ghost grouped": lambda m: ours_step(m, x, y, "ghost", plans, conv_route="grouped"),
        "ours ghost graphed": lambda m: ours_graphed_step(m, x, y),  # CUDA only: raises on the CPU
        "ours poisson": lambda m: ours_poisson_step(m, x, y),
        "ours poisson pad": lambda m: ours_poisson_step(m, x, y, pad=True),
        "ours poisson nopad": lambda m: ours_poisson_step(m, x, y, pad=False),
        "ours ghost-2bw": lambda m: ghost_second_backward_step(m, x, y),
        "ours vmap": lambda m: ours_step(m, x, y, "vmap"),
        "opacus hooks": lambda m: opacus_step(m, x, y, "hooks"),
        "opacus ghost": lambda m: opacus_step(m, x, y, "ghost"),
    }
    if loop:
        out["ours loop"] = lambda m: ours_step(m, x, y, "loop")
    if jax_rows:  # --jax: the JAX backend (dpaudit.training.jax_backend) on the same workloads
        out.update({k: (lambda m, kind=kind: JaxStep(m, x, y, kind)) for k, kind in JAX_ROWS.items()})
    return out


POISSON_WARMUP = 30  # warm-up steps of the Poisson rows: new batch sizes are new shapes (cuDNN plans)


def measure(
    steps: dict[str, Callable[[], None]], rounds: int, per_round: dict[str, int], device: torch.device
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Median wall time per step over the rounds, and median host time per step: the CPU time the
    calling thread spends in the steps (``time.thread_time``, the final device sync excluded), i.e.
    what launching a step costs the host; on a GPU a step with host time above its wall time of
    kernels is host-bound."""
    for f in steps.values():  # warm-up (and the ghost self-check)
        for _ in range(POISSON_WARMUP if getattr(f, "poisson", False) else 2):
            f()
    times: dict[str, list[float]] = {k: [] for k in steps}
    host: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name, f in steps.items():
            n = per_round[name]
            _sync(device)
            t, h, c = time.perf_counter(), time.thread_time(), time.process_time()
            for _ in range(n):
                f()
            h, c = time.thread_time() - h, time.process_time() - c
            _sync(device)
            times[name].append((time.perf_counter() - t) / n)
            host[name].append(h / n)
            cpu[name].append(c / n)
    return tuple({k: statistics.median(v) for k, v in d.items()} for d in (times, host, cpu))


def _proc_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def memory_child(spec: str, args) -> None:
    """One (workload, method) in a fresh process: the peak RSS two steps add above the RSS with the
    model and batch built (the high-water mark reset first through /proc/self/clear_refs). The first
    step includes what is done once (ghost: building and checking the plan). With ``--memory-warm``
    one step runs first and the C allocator returns its free memory to the system (glibc's
    malloc_trim), so the two steps measured are steady-state steps."""
    import json

    name, method = spec.split(":", 1)
    model, x, y = workloads(args.batch, torch.device("cpu"), args.size)[name]
    f = makers(x, y, loop=True)[method](model)
    if f is None:
        print(json.dumps({"peak_mib": None}))
        return
    if args.memory_warm:
        import ctypes
        import gc

        f()
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: freed memory may stay resident and hide a peak
            pass
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
    rss0 = _proc_kib("VmRSS")
    f()
    f()
    print(json.dumps({"peak_mib": (_proc_kib("VmHWM") - rss0) / 1024}))


def cpu_peak_mib(name: str, method: str, args) -> float | None:
    import json
    import subprocess
    import sys

    cmd = [sys.executable, __file__, "--memory-child", f"{name}:{method}", "--batch", str(args.batch)]
    cmd += ["--size", args.size, "--threads", str(args.threads)] + (["--memory-warm"] if args.memory_warm else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])["peak_mib"]
    except (IndexError, ValueError, KeyError):
        return None


class LiveBytes(TorchDispatchMode):
    """Peak bytes of live tensor storage over the ops run inside (forward, backward and the clipper's
    own ops; autograd's backward runs on this thread on the CPU). A storage counts from the op that
    created it until it is freed. Also used by tests/training/test_clipping_memory.py."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key = st.data_ptr()
                if key not in self.live or self.live[key][0].expired():
                    self.live[key] = (StorageWeakRef(st), st.nbytes())
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


def tensor_peak_mib(f: Callable[[], None]) -> float:
    """Peak bytes of live tensor storage one step creates (``--tensor-memory``): every storage an op
    dispatched in the step returns (forward, backward, the clipper's and optimizer's own ops) counts
    from its creation until it is freed. Deterministic (no allocator caching, page rounding or other
    processes in it, unlike RSS), the CPU's analogue of ``torch.cuda.max_memory_allocated``; slow
    (Python per op), so only for memory."""
    gc.collect()
    with LiveBytes() as tracker:
        f()
    return tracker.peak / 2**20


def gpu_peak_mib(f: Callable[[], None], device: torch.device) -> float:
    """Peak CUDA memory one step allocates above what is resident before it (models, batches). A CUDA
    graph's replay allocates nothing: its row reports the memory its private pool reserved at capture."""
    if hasattr(f, "pool_mib"):
        return f.pool_mib
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    f()
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def _limit_cpus(n: int) -> None:
    """Run this process (JAX's rows included) on ``n`` of the CPUs it may use. XLA:CPU has no thread-count
    flag: it splits large loops into as many parallel tasks as the process has CPUs (read once, when
    JAX's CPU client starts, so this must run before the first JAX call), and ``--threads`` would
    otherwise cap torch only."""
    import os

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:n])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--target-seconds", type=float, default=0.3, help="time per method per round")
    parser.add_argument("--loop", action="store_true", help="also time the one-example-at-a-time loop")
    parser.add_argument("--models", default="mlp,cnn,lstm")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--jax", action="store_true", help="add JAX rows (non-private, DP-SGD, JL(1)); JAX picks its own device"
    )
    parser.add_argument("--size", choices=tuple(SIZES), default="full", help="size of cifar-gn/transformer*/tied")
    parser.add_argument("--methods", default=None, help="comma-separated subset of the methods (default: all)")
    parser.add_argument(
        "--memory", action="store_true", help="peak memory per method (CUDA: in process; CPU: one process each)"
    )
    parser.add_argument(
        "--memory-warm",
        action="store_true",
        help="CPU --memory: measure steady-state steps (one step and malloc_trim first; no plan building)",
    )
    parser.add_argument(
        "--tensor-memory",
        action="store_true",
        help="peak live tensor bytes one step creates, in process (deterministic; slow: Python per op)",
    )
    parser.add_argument("--plan", action="store_true", help="print ours ghost's per-layer choice per workload")
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown (RESULTS.md)")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        torch.set_num_threads(args.threads)
        warnings.filterwarnings("ignore")
        return memory_child(args.memory_child, args)
    warnings.filterwarnings("ignore")  # Opacus warns about its insecure RNG and full backward hooks
    torch.set_num_threads(args.threads)
    if args.jax and args.device == "cpu":
        _limit_cpus(args.threads)
    device = torch.device(args.device)
    on = ""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device")
        on = f", on {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
        f"median of {args.rounds} interleaved rounds{on}"
    )
    header = (
        f"{'model':<15} {'method':<18} {'ms/step':>9} {'host ms':>8} {'examples/s':>11} {'x non-private':>14} "
        f"{'vs Opacus hooks':>16}"
    )
    if args.memory:
        header += f" {'peak MiB':>9} {'x mem':>6}"
    if args.tensor_memory:
        header += f" {'tensor MiB':>10} {'x tensor':>8}"
    rows, jax_rows, plan_lines, md_rows = [], [], [], []
    wanted = set(args.methods.split(",")) if args.methods else None
    for name, (model, x, y) in workloads(args.batch, device, args.size).items():
        if name not in args.models.split(","):
            continue
        steps, plans = {}, {}
        for k, make in makers(x, y, args.loop, args.jax, plans).items():
            if wanted is not None and k not in wanted:
                continue
            try:
                f = make(copy.deepcopy(model))
                if f is not None:
                    f()  # a peer may refuse the model only when it runs
                    steps[k] = f
            except Exception as e:  # reported, not fatal
                print(f"{name}: {k} unavailable ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
        # Calibrate the number of steps per round so every method runs about target-seconds.
        per_round = {}
        for k, f in steps.items():
            _sync(device)
            t = time.perf_counter()
            f()
            _sync(device)
            per_round[k] = max(1, int(args.target_seconds / max(time.perf_counter() - t, 1e-6)))
        t, host, cpu = measure(steps, args.rounds, per_round, device)
        mem: dict[str, float | None] = {}
        if args.memory:
            for k, f in steps.items():
                mem[k] = gpu_peak_mib(f, device) if device.type == "cuda" else cpu_peak_mib(name, k, args)
        tmem = {k: tensor_peak_mib(f) for k, f in steps.items()} if args.tensor_memory else {}
        base = t.get("non-private")  # absent when --methods leaves it out: no ratio column then
        ref = t.get("opacus hooks")
        for k, v in t.items():
            vs = f"{ref / v:.2f}x faster" if ref is not None and k.startswith("ours") else ""
            row = f"{name:<15} {k:<18} {v * 1e3:9.2f} {host[k] * 1e3:8.2f} {args.batch / v:11.0f}"
            row += f" {v / base:14.2f} {vs:>16}" if base else f" {'-':>14} {vs:>16}"
            if args.memory:
                m, m0 = mem.get(k), mem.get("non-private")
                row += f" {m:9.1f}" if m is not None else f" {'-':>9}"
                row += f" {m / m0:6.2f}" if m is not None and m0 else f" {'-':>6}"
            if args.tensor_memory:
                m, m0 = tmem[k], tmem.get("non-private")
                row += f" {m:10.1f}" + (f" {m / m0:8.2f}" if m0 else f" {'-':>8}")
            rows.append(row)
            cells = [
                name,
                k,
                f"{v * 1e3:.2f}",
                f"{host[k] * 1e3:.2f}",
                f"{v / base:.2f}" if base else "-",
                vs.replace("x faster", "× faster"),
            ]
            if args.memory:
                m, m0 = mem.get(k), mem.get("non-private")
                cells += [f"{m:.1f}" if m is not None else "-", f"{m / m0:.2f}" if m is not None and m0 else "-"]
            if args.tensor_memory:
                m, m0 = tmem[k], tmem.get("non-private")
                cells += [f"{m:.1f}", f"{m / m0:.2f}" if m0 else "-"]
            md_rows.append("| " + " | ".join(cells) + " |")
        if args.plan:
            from dpaudit.training.clipping import clipping_text

            for key, clipper in plans.items():  # ours ghost, and each forced conv route that ran
                if key.startswith("ghost"):
                    plan_lines.append(f"{name} (ours {key}): " + clipping_text(clipper.describe()))
        if "jax non-private" in t:  # JAX: compile time apart from steady state, ratios to JAX non-private
            for k in JAX_ROWS:
                if k in t:
                    compile_s = steps[k].first_call_s - t[k]
                    jax_rows.append(
                        f"{name:<9} {k:<16} {compile_s:10.2f} {t[k] * 1e3:9.2f} {t[k] / t['jax non-private']:18.2f}"
                        f" {cpu[k] * 1e3:10.2f} {cpu[k] / cpu['jax non-private']:8.2f}"
                    )
    print(header)
    print("-" * len(header))
    print("\n".join(rows))
    if args.memory:
        print(
            "peak MiB: memory one step adds above the resident model and batch "
            + ("(torch.cuda.max_memory_allocated)" if device.type == "cuda" else "(peak RSS of a fresh process, VmHWM)")
        )
    if args.tensor_memory:
        print("tensor MiB: peak live tensor storage one step creates (in process, every dispatched op tracked)")
    if args.markdown:
        cols = ["workload", "method", "ms/step", "host ms/step", "× non-private", "vs Opacus hooks"]
        cols += ["peak MiB", "× memory"] if args.memory else []
        cols += ["tensor MiB", "× tensor"] if args.tensor_memory else []
        print(f"\nMarkdown ({on.lstrip(', ') or 'CPU'}, batch {args.batch}):")
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        print("\n".join(md_rows))
    if plan_lines:
        print("\nper-layer choice of ours ghost (cost model: ghost norm when 2T² <= p·d):")
        print("\n".join(plan_lines))
    if jax_rows:
        import jax

        jax_header = f"{'model':<9} {'JAX step':<16} {'compile s':>10} {'ms/step':>9} {'x JAX non-private':>18}"
        jax_header += f" {'CPU ms':>10} {'x (CPU)':>8}"
        print(f"\nJAX {jax.__version__} on {jax.devices()[0].platform}: compile time = first call - steady-state step")
        print("CPU ms: process CPU time per step, all threads (XLA runs off the calling thread); robust to other jobs")
        print(jax_header)
        print("-" * len(jax_header))
        print("\n".join(jax_rows))


if __name__ == "__main__":
    main()
