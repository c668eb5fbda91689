"""Where a DP-SGD step's time goes: host-bound or device-bound, and which host work dominates.

    python benchmarks/step_profile.py [--device cuda] [--batch 256] [--size full] [--steps 20]
        [--models cifar-gn,transformer,tied] [--methods "non-private,ours ghost"] [--top 12]

Why (issue 26): on the H200 the ghost step measured 1.6-2.2x non-private, with the calling thread's
CPU time ("host ms") at 80-85% of the wall time for every DP row against 40-55% for non-private SGD.
Two readings fit that number. (a) The step is host-bound: Python, the dispatcher and the launches of
a DP step cost more than its kernels take on the GPU, which then idles. (b) The step is device-bound
and the host time is inflated by waiting: when the launch queue is full, ``cudaLaunchKernel`` blocks,
and a spin-wait counts as CPU time. They call for different work (fewer launches / CUDA graphs
against cheaper kernels), so this script measures them apart, with ``torch.profiler`` over
``--steps`` steps after a warm-up:

* ``wall ms``: step time, the device synchronised before and after (as ``dpsgd_throughput.py``);
* ``kernel ms``: the sum of the device time of the kernels the step ran (CUDA only). ``busy`` =
  kernel ms / wall ms; well below 1 means the GPU idles: host-bound;
* ``launches``: kernels per step, and ``launch ms``: CPU time inside the runtime's launch calls
  (``cudaLaunchKernel`` and its kin) per step, with the longest single call. A longest call far above
  the typical ~5-10 us means the launches blocked on a full queue: reading (b);
* ``ops``: ATen ops dispatched per step (each a Python-to-C++ dispatch, and a launch unless a view);
* then, per DP method, the ``--top`` ATen ops and Python-level record scopes by self CPU time, so the
  host cost can be attributed (e.g. ``aten::bmm`` of the ghost norms, ``aten::randn`` of the noise).

On the CPU (no device events) the kernel and launch columns read ``-``: the table still gives wall
ms and ops, which is how the script is tested here (tests/training/test_step_profile.py).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch
from dpsgd_throughput import _sync, makers, workloads
from torch.profiler import ProfilerActivity, profile

# Runtime calls that launch device work; their CPU time is what the host pays per launch.
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync")


def _device_time(event) -> float:
    """Self device time of a profiler event in microseconds (attribute renamed across torch versions)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def _is_kernel(event) -> bool:
    kind = getattr(event, "device_type", None)
    return kind is not None and str(kind).endswith("CUDA")


def profile_step(step, steps: int, device: torch.device) -> dict:
    """Run ``step`` ``steps`` times under the profiler (after 3 warm-up calls); per-step figures."""
    for _ in range(3):
        step()
    _sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    walls = []
    with profile(activities=activities) as prof:
        for _ in range(steps):
            _sync(device)
            t = time.perf_counter()
            step()
            _sync(device)
            walls.append(time.perf_counter() - t)
    events = prof.events()
    kernels = [e for e in events if _is_kernel(e)]
    launches = [e for e in events if e.name in LAUNCH_CALLS]
    aten = [e for e in events if e.name.startswith("aten::") and not _is_kernel(e)]
    # Top-level ATen ops only (an op called from inside another op is counted in its parent).
    top_level = [e for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    out = {
        "wall_ms": statistics.median(walls) * 1e3,
        "ops": len(top_level) / steps,
        "kernel_ms": sum(_device_time(e) for e in kernels) / steps / 1e3 if device.type == "cuda" else None,
        "launches": len(kernels) / steps if device.type == "cuda" else None,
        "launch_ms": sum(e.cpu_time_total for e in launches) / steps / 1e3 if launches else None,
        "launch_max_us": max((e.cpu_time_total for e in launches), default=None),
    }
    table = prof.key_averages()
    out["top"] = sorted(
        ((e.key, e.self_cpu_time_total / steps / 1e3, e.count / steps) for e in table),
        key=lambda r: -r[1],
    )
    return out


def _cell(value, fmt: str) -> str:
    return format(value, fmt) if value is not None else "-".rjust(int(fmt.split(".")[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", choices=("small", "full"), default="full")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="cifar-gn,transformer,tied")
    parser.add_argument("--methods", default="non-private,ours ghost", help="comma-separated; non-private first")
    parser.add_argument("--top", type=int, default=12, help="host-time table rows per DP method (0: none)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    methods = ["non-private"] + [m for m in args.methods.split(",") if m != "non-private"]
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {name}, batch {args.batch}, size {args.size}, {args.steps} profiled steps")
    header = (
        f"{'model':<16} {'method':<14} {'wall ms':>8} {'x':>5} {'kernel ms':>9} {'busy':>5} "
        f"{'launches':>8} {'launch ms':>9} {'max us':>7} {'ops':>6}"
    )
    tops = []
    print(header + "\n" + "-" * len(header))
    for model_name, (model, x, y) in workloads(args.batch, device, args.size).items():
        if model_name not in args.models.split(","):
            continue
        make = makers(x, y, loop=False)
        base = None
        for method in methods:
            try:
                r = profile_step(make[method](copy.deepcopy(model)), args.steps, device)
            except Exception as e:  # a peer or route that cannot run here: say so, keep the other rows
                print(f"{model_name:<16} {method:<14} unavailable ({type(e).__name__}: {str(e)[:80]})")
                continue
            base = r["wall_ms"] if method == "non-private" else base
            busy = r["kernel_ms"] / r["wall_ms"] if r["kernel_ms"] is not None else None
            ratio = r["wall_ms"] / base if base else None
            print(
                f"{model_name:<16} {method:<14} {r['wall_ms']:8.2f} {_cell(ratio, '5.2f')} "
                f"{_cell(r['kernel_ms'], '9.2f')} {_cell(busy, '5.2f')} {_cell(r['launches'], '8.0f')} "
                f"{_cell(r['launch_ms'], '9.2f')} {_cell(r['launch_max_us'], '7.0f')} {r['ops']:6.0f}"
            )
            if method != "non-private" and args.top:
                tops.append((model_name, method, r["top"][: args.top]))
    for model_name, method, rows in tops:
        print(f"\n{model_name} / {method}: self CPU ms per step (calls per step)")
        for key, ms, calls in rows:
            print(f"  {ms:8.3f}  ({calls:5.1f})  {key[:90]}")


if __name__ == "__main__":
    main()
