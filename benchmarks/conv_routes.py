"""One convolution's per-example clipping work by the two instantiation routes of the ghost clipper.

    python benchmarks/conv_routes.py [--device cpu|cuda] [--threads 1] [--batches 64,256]
        [--channels 64] [--image 32] [--rounds 5]

For a Conv2d(C, C, 3, padding=1) on C x image x image inputs (default: the 64-channel 3x3
convolution on 32x32 of the CIFAR-sized GroupNorm CNN, the layer whose patches dominate its DP
step's memory), float32, per batch size: the time and the peak memory of what
``_Conv2dHandler`` does for the layer on the instantiate side of the cost model — per-example
squared norms of the weight gradients, then the clipped sum Σ_i c_i ∇_W ℓ_i — by

* ``patches``: unfolded patches (B, C·9, T) a chunk of examples at a time and a batched matmul;
* ``grouped``: one convolution weight gradient with groups = B (Rochette et al. 2019,
  arXiv:1912.06015), no patches;

against the baseline measured in the same run: the layer's batch weight gradient (what non-private
SGD's backward computes for it), all in full float32 (TF32 off on a GPU, as the clipper computes).
Time: median over interleaved rounds. Peak memory above the resident input and output gradient:
CPU, peak RSS (VmHWM) of a fresh process per (batch, route); CUDA, ``torch.cuda.max_memory_allocated``.
The two routes' results are compared (relative difference).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
from torch import nn
from torch.nn.grad import conv2d_weight

from dpaudit.training.clipping import _Conv2dHandler, clip_factors, exact_matmuls

ROUTES = ("baseline", "patches", "grouped")


def setup(batch: int, channels: int, image: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    conv = nn.Conv2d(channels, channels, 3, padding=1).to(device)
    x = torch.randn(batch, channels, image, image, generator=g).to(device)
    grad = torch.randn(batch, channels, image, image, generator=g).to(device) / batch
    return conv, x, grad


def work(route: str, conv, x, g):
    """The layer's share of one step by ``route``: (its part, norms, clipped weight sum), or the
    baseline's batch weight gradient. In full float32 (no TF32 on a GPU), as the clipper computes."""
    with torch.no_grad(), exact_matmuls():
        if route == "baseline":
            return conv2d_weight(x, conv.weight.shape, g, conv.stride, conv.padding)
        part = _Conv2dHandler.part(conv, [x], [g], frozenset({"weight"}), route=route)
        norms = part.sq_norm.sqrt()
        return part, norms, part.clipped(clip_factors(norms, 1.0))["weight"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def child(route: str, args) -> None:
    """Peak RSS one call adds above the resident layer, input and output gradient (fresh process)."""
    torch.set_num_threads(args.threads)
    conv, x, g = setup(args.child_batch, args.channels, args.image, torch.device("cpu"))
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
    rss0 = _kib("VmRSS")
    work(route, conv, x, g)
    print(json.dumps({"peak_mib": (_kib("VmHWM") - rss0) / 1024}))


def peak_mib(route: str, batch: int, args, conv, x, g, device: torch.device) -> float:
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        work(route, conv, x, g)
        _sync(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    cmd = [sys.executable, __file__, "--child", route, "--child-batch", str(batch), "--threads", str(args.threads)]
    cmd += ["--channels", str(args.channels), "--image", str(args.image)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["peak_mib"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-batch", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    on = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"torch {torch.__version__}, {on}: Conv2d({args.channels}, {args.channels}, 3, padding=1) on "
        f"{args.image}x{args.image}, float32, median of {args.rounds} interleaved rounds"
    )
    header = f"{'batch':>5} {'route':<9} {'ms':>9} {'x time':>7} {'peak MiB':>9} {'x mem':>7}"
    print(header + "\n" + "-" * len(header))
    for batch in (int(b) for b in args.batches.split(",")):
        conv, x, g = setup(batch, args.channels, args.image, device)
        times: dict[str, list[float]] = {r: [] for r in ROUTES}
        out = {r: work(r, conv, x, g) for r in ROUTES}  # warm-up, and the results compared below
        for _ in range(args.rounds):
            for r in ROUTES:
                _sync(device)
                t = time.perf_counter()
                work(r, conv, x, g)
                _sync(device)
                times[r].append(time.perf_counter() - t)
        (_, n_p, s_p), (_, n_g, s_g) = out["patches"], out["grouped"]
        diff = max(float((n_p - n_g).norm() / n_p.norm()), float((s_p - s_g).norm() / s_p.norm()))
        t0 = statistics.median(times["baseline"])
        m0 = peak_mib("baseline", batch, args, conv, x, g, device)
        for r in ROUTES:
            t = statistics.median(times[r])
            m = m0 if r == "baseline" else peak_mib(r, batch, args, conv, x, g, device)
            print(f"{batch:>5} {r:<9} {t * 1e3:9.1f} {t / t0:7.2f} {m:9.1f} {m / max(m0, 1e-9):7.2f}")
        print(f"{batch:>5} how: patches = {out['patches'][0].how}; grouped = {out['grouped'][0].how}")
        print(f"{batch:>5} routes agree to {diff:.1e} (relative, norms and clipped sum)")


if __name__ == "__main__":
    main()
