"""Throughput of one DP-SGD step: our clipping methods and Opacus against non-private SGD.

    .venv/bin/python benchmarks/dpsgd_throughput.py [--threads 2] [--batch 256] [--rounds 7] [--loop]
        [--device cpu|cuda] [--jax]

One step = gathering the batch, forward, backward, (per-example clipping, noise) and an SGD update
on a batch of 256 (what the trainers do per step, data loading aside),
for the zoo's MLP and CNN on digits-shaped input (1x8x8, 10 classes) and its LSTM on token
sequences (length 20, vocabulary 50). Every method runs on its own copy of the same model and
batch, in interleaved rounds (so a change of machine load hits all methods alike); the table
shows the median step time over rounds, examples per second, the ratio to non-private SGD measured
in the same run, and the speed-up of our methods over Opacus' default hooks.

With ``--device cuda`` models, batches, batch orders and noise generators live on the GPU (as in the
trainers) and the clock is read only after ``torch.cuda.synchronize()``, so a time covers the
kernels a step launched, not just their launch.

Opacus (an optional peer: ``pip install opacus``) is used through its public PrivacyEngine with
``grad_sample_mode="hooks"`` (per-sample gradients from module hooks) and ``"ghost"`` (its fast
gradient clipping, two backward passes). Our ``ghost`` is ghost norms + book-keeping (one
backward, no parameter gradients); ``ghost-2bw`` is the same norms followed by Li et al.'s second,
re-weighted backward pass, measured here only to justify the choice of book-keeping.

``--jax`` adds the JAX backend's jit-compiled steps (non-private, DP-SGD, DP-SGD-JL with one
projection) on the same models and batches, in the same interleaved rounds, and a second table
with their compile time (first call minus steady-state step) and ratios to JAX non-private.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from dpaudit.models import build_model, default_spec
from dpaudit.training.clipping import GhostClipper, clip_factors, make_clipper
from dpaudit.training.dpsgd import set_private_gradients

SIGMA, CLIP, LR = 1.0, 1.0, 0.1


def workloads(batch: int, device: torch.device) -> dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor]]:
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
    return {k: (m.to(device), x.to(device), y.to(device)) for k, (m, x, y) in out.items()}


def _order(n: int, device: torch.device) -> torch.Tensor:
    # The trainers move each batch's indices to the data's device before gathering.
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


def ours_step(model, x, y, method: str) -> Callable[[], None]:
    clipper = make_clipper(model, method)
    opt = torch.optim.SGD(clipper.params, lr=LR)
    gen = _noise_gen(x.device)
    idx = _order(len(x), x.device)

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


def ghost_second_backward_step(model, x, y) -> Callable[[], None]:
    """Ghost norms, then Σ_i c_i ℓ_i backpropagated again (Li et al. 2021, arXiv:2110.05679, Sec. 4)."""
    clipper = GhostClipper(model)
    clipper._checked = True  # the benchmark model is known to be supported
    opt = torch.optim.SGD(clipper.params, lr=LR)
    gen = _noise_gen(x.device)
    idx = _order(len(x), x.device)

    def step() -> None:
        xb, yb = x[idx], y[idx]
        norms = clipper._norm_parts(xb, yb)[2]
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
    x: torch.Tensor, y: torch.Tensor, loop: bool, jax_rows: bool = False
) -> dict[str, Callable[[nn.Module], Callable[[], None] | None]]:
    out = {
        "non-private": lambda m: nonprivate_step(m, x, y),
        "ours ghost": lambda m: ours_step(m, x, y, "ghost"),
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


def measure(
    steps: dict[str, Callable[[], None]], rounds: int, per_round: dict[str, int], device: torch.device
) -> dict[str, float]:
    for f in steps.values():  # warm-up (and the ghost self-check)
        f()
        f()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name, f in steps.items():
            n = per_round[name]
            _sync(device)
            t = time.perf_counter()
            for _ in range(n):
                f()
            _sync(device)
            times[name].append((time.perf_counter() - t) / n)
    return {k: statistics.median(v) for k, v in times.items()}


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
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # Opacus warns about its insecure RNG and full backward hooks
    torch.set_num_threads(args.threads)
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
        f"{'model':<9} {'method':<14} {'ms/step':>9} {'examples/s':>11} {'x non-private':>14} {'vs Opacus hooks':>16}"
    )
    rows, jax_rows = [], []
    for name, (model, x, y) in workloads(args.batch, device).items():
        if name not in args.models.split(","):
            continue
        steps = {}
        for k, make in makers(x, y, args.loop, args.jax).items():
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
        t = measure(steps, args.rounds, per_round, device)
        base = t["non-private"]
        ref = t.get("opacus hooks")
        for k, v in t.items():
            vs = f"{ref / v:.2f}x faster" if ref is not None and k.startswith("ours") else ""
            rows.append(f"{name:<9} {k:<14} {v * 1e3:9.2f} {args.batch / v:11.0f} {v / base:14.2f} {vs:>16}")
        if "jax non-private" in t:  # JAX: compile time apart from steady state, ratios to JAX non-private
            for k in JAX_ROWS:
                if k in t:
                    compile_s = steps[k].first_call_s - t[k]
                    jax_rows.append(
                        f"{name:<9} {k:<16} {compile_s:10.2f} {t[k] * 1e3:9.2f} {t[k] / t['jax non-private']:18.2f}"
                    )
    print(header)
    print("-" * len(header))
    print("\n".join(rows))
    if jax_rows:
        import jax

        jax_header = f"{'model':<9} {'JAX step':<16} {'compile s':>10} {'ms/step':>9} {'x JAX non-private':>18}"
        print(f"\nJAX {jax.__version__} on {jax.devices()[0].platform}: compile time = first call - steady-state step")
        print(jax_header)
        print("-" * len(jax_header))
        print("\n".join(jax_rows))


if __name__ == "__main__":
    main()
