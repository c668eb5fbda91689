"""Bring-your-own model and data at CIFAR-10 scale: training throughput, LiRA reference models per hour,
and the resident memory of one epoch on a memory-mapped 50,000 x 3 x 32 x 32 float32 X.npy (600 MB).

    python benchmarks/byo_cifar.py --device cuda                 # full size (50,000 x 3 x 32 x 32), GPU
    python benchmarks/byo_cifar.py --size small --device cpu     # 4,000 x 3 x 16 x 16, CPU
    python benchmarks/byo_cifar.py --size full --measure-rss --device cpu   # + peak RSS of one epoch

The model is the user's own residual CNN with GroupNorm (``examples/byo_cifar_shaped/model.py``,
given by factory: a ``"kind": "python"`` spec), the data a directory ``X.npy``/``y.npy`` written by
``examples/byo_cifar_shaped/make_data.py``. Everything runs through the library calls the CLI makes
(``load_dataset``, ``fit_model``, ``attacks.reference.train_models``), so the numbers include
reading the memory-mapped file a batch at a time and converting it to tensors.

Printed, all measured in this run on this device:

- examples/s of one epoch of non-private SGD (the baseline) and of DP-SGD (Poisson sampling,
  ``--clipping auto``; the clipping method it chose is printed), and their ratio;
- LiRA reference models per hour: 3600 / the wall time of training one reference model with the
  target's recipe (DP-SGD, one epoch, on half of the candidate pool) and computing its logits on
  every record, as ``dpaudit attack mia --attacks lira`` does for each;
- with ``--measure-rss``: in a fresh process, the peak resident set (``VmHWM``) of loading the
  directory and one DP-SGD epoch over all of it, against the peak of the same training on four
  batches held in memory (what the model and a few batches need, measured), both from the same
  starting point; the difference is what the data costs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {"full": (50_000, 32, (16, 32, 64)), "small": (4_000, 16, (8, 16, 32)), "tiny": (1_000, 16, (4, 8))}
BATCH = 256


def spec_dict(size: int, widths) -> dict:
    return {
        "kind": "python",
        "factory": "examples.byo_cifar_shaped.model:resnet",
        "kwargs": {"widths": list(widths), "n_classes": 10},
        "input_shape": [3, size, size],
        "n_classes": 10,
    }


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> None:
    try:  # reset VmHWM to the current RSS (Linux >= 4.0), so the next peak is the next phase's alone
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def rss_child(data: str, size: int, widths, device: str) -> None:
    """Peak resident memory of DP-SGD on the memory-mapped directory against the same training on a
    few batches held in memory (the model's needs plus a few batches, by construction); prints JSON.

    Both phases are measured from the same starting RSS (after imports and building the model), each
    with VmHWM reset first: (1) DP-SGD on ``4 * BATCH`` in-memory records; (2) loading the directory
    (validation) and one DP-SGD epoch over all of it, scaler fitted on it (streamed) included. Phase (1)
    runs as many steps as the epoch (``ceil(n / BATCH)``), so both see the same spread of Poisson batch
    sizes and the same allocator history."""
    import resource

    import numpy as np

    from dpaudit.data import Dataset, load_dataset
    from dpaudit.models import build_model, model_spec_from_dict
    from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig
    from dpaudit.training.run import fit_model

    spec = model_spec_from_dict(spec_dict(size, widths))
    model = build_model(spec)
    config = TrainConfig(algo="dpsgd", epochs=1, batch_size=BATCH, lr=1.0, dp=DPConfig(noise_multiplier=1.0))
    perf = PerfConfig(device=device, clipping="auto")
    rng = np.random.default_rng(0)
    Xm = rng.standard_normal((4 * BATCH, 3, size, size), dtype=np.float32)
    in_memory = Dataset("in-memory", Xm, rng.integers(0, 10, 4 * BATCH), 10, "image", "in-memory")
    n = int(np.load(data + "/X.npy", mmap_mode="r").shape[0])  # the header only
    # As many steps as the epoch, so both phases see the same spread of Poisson batch sizes.
    steps = TrainConfig(**{**config.to_dict(), "dp": config.dp, "steps": config.num_steps(n)})
    before = _status_kb("VmRSS")
    _reset_peak()
    fit_model(in_memory, np.arange(4 * BATCH), spec, steps, perf)
    baseline_peak = _status_kb("VmHWM")
    del in_memory, Xm
    _reset_peak()
    ds = load_dataset(data)
    t = time.perf_counter()
    fit_model(ds, np.arange(n), spec, config, perf)
    seconds = time.perf_counter() - t
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    print(
        json.dumps(
            {
                "n": n,
                "file_bytes": int(ds.X.nbytes),
                "rss_before_kb": before,
                "rss_file_after_kb": _status_kb("RssFile"),
                "baseline_peak_kb": baseline_peak,
                "mapped_peak_kb": _status_kb("VmHWM"),
                "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "param_bytes": params,
                "batch_bytes": BATCH * 3 * size * size * 4,
                "epoch_seconds": seconds,
            }
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="full")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--measure-rss", action="store_true", help="also measure peak RSS of one epoch (fresh process)")
    p.add_argument("--data", type=Path, default=None, help="reuse a directory written by make_data.py")
    p.add_argument("--widths", default=None, help="override the model's widths, e.g. 4,8 (a cheap CPU RSS run)")
    p.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    n, size, widths = SIZES[a.size]
    if a.widths:
        widths = tuple(int(w) for w in a.widths.split(","))
    if a.rss_child:
        return rss_child(str(a.data), size, widths, a.device)

    import numpy as np
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    from attacks.reference import Recipe, train_models
    from dpaudit.data import fit_preprocessing, load_dataset
    from dpaudit.models import model_spec_from_dict
    from dpaudit.training.config import DPConfig, PerfConfig, TrainConfig
    from dpaudit.training.run import fit_model
    from examples.byo_cifar_shaped.make_data import write

    tmp = Path(tempfile.mkdtemp(prefix="byo_cifar_"))
    data = a.data or tmp / "data"
    if a.data is None:
        t = time.perf_counter()
        write(data, n, size)
        print(f"data       {n} x 3 x {size} x {size} float32 written in {time.perf_counter() - t:.1f} s ({data})")
    ds = load_dataset(str(data))
    spec = model_spec_from_dict(spec_dict(size, widths))
    perf = PerfConfig(device=a.device, clipping="auto")
    idx = np.arange(len(ds))
    device = torch.cuda.get_device_name() if a.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device     {device}; model resnet widths {list(widths)}, batch {BATCH}, one epoch over {len(ds)} records")

    t = time.perf_counter()
    pre = fit_preprocessing(ds, idx)  # once, outside the timed epochs (a pass over the file)
    print(f"scaler     fitted on all records, streamed, in {time.perf_counter() - t:.1f} s")
    rates = {}
    for name, config in (
        ("sgd", TrainConfig(algo="sgd", epochs=1, batch_size=BATCH, lr=0.1)),
        ("dpsgd", TrainConfig(algo="dpsgd", epochs=1, batch_size=BATCH, lr=1.0, dp=DPConfig(noise_multiplier=1.0))),
    ):
        warm = TrainConfig(**{**config.to_dict(), "dp": config.dp, "steps": 2})
        fit_model(ds, idx[: 2 * BATCH], spec, warm, perf, preprocessing=pre)
        _sync(a.device)  # warm-up above (allocator, cuDNN autotuning, ghost self-check)
        t = time.perf_counter()
        fitted = fit_model(ds, idx, spec, config, perf, preprocessing=pre)
        _sync(a.device)
        rates[name] = len(idx) / (time.perf_counter() - t)
        if name == "dpsgd":
            used = fitted.outcome.performance.get("clipping_used", {})
            print(f"clipping   --clipping auto chose {used.get('method', '?')}")
    print(f"training   sgd {rates['sgd']:,.0f} examples/s   dpsgd {rates['dpsgd']:,.0f} examples/s   ratio dpsgd/sgd "
          f"{rates['dpsgd'] / rates['sgd']:.2f}")  # fmt: skip

    # One LiRA reference model: the target's recipe (DP-SGD, 1 epoch), trained on half of the candidate
    # pool, then its logits on every record; nothing cached.
    dp = TrainConfig(algo="dpsgd", epochs=1, batch_size=BATCH, lr=1.0, dp=DPConfig(noise_multiplier=1.0))
    rng = np.random.default_rng(0)
    test, aux = np.sort(rng.choice(len(ds), len(ds) // 10, replace=False)), np.array([], dtype=np.int64)
    recipe = Recipe(dataset=ds, spec=spec, config=dp, perf=perf, test_idx=test, aux_idx=aux)
    half = np.sort(rng.choice(np.setdiff1d(idx, test), (len(ds) - len(test)) // 2, replace=False))
    t = time.perf_counter()
    train_models(recipe, [half], [1], cache_dir=tmp / "cache")
    _sync(a.device)
    per_model = time.perf_counter() - t
    print(f"LiRA       one reference model ({len(half)} records, 1 epoch DP-SGD + logits on {len(ds)}) in "
          f"{per_model:.1f} s: {3600 / per_model:,.0f} reference models per hour")  # fmt: skip

    if a.measure_rss:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, __file__, "--rss-child", "--size", a.size, "--device", a.device, "--data", str(data)]
        cmd += ["--widths", ",".join(map(str, widths))]
        out = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
        base = (out["baseline_peak_kb"] - out["rss_before_kb"]) * 1024
        grown = (out["mapped_peak_kb"] - out["rss_before_kb"]) * 1024
        mib = out["file_bytes"] / 2**20
        print(f"memory     X.npy {mib:,.0f} MiB, one DP-SGD epoch over it ({out['epoch_seconds']:.0f} s): "
              f"peak RSS {out['mapped_peak_kb'] / 1024:,.0f} MiB, {grown / 2**20:,.0f} MiB above the process before; "
              f"the same training on {4 * BATCH} records in memory: {base / 2**20:,.0f} MiB above it")  # fmt: skip
        extra = grown - base
        print(f"           data-attributable peak {extra / 2**20:,.0f} MiB = {extra / out['file_bytes']:.3f} "
              f"of the file; a batch is {out['batch_bytes'] / 2**20:.1f} MiB, the parameters "
              f"{out['param_bytes'] / 2**20:.2f} MiB (ru_maxrss {out['ru_maxrss_kb'] / 1024:,.0f} MiB)")  # fmt: skip


if __name__ == "__main__":
    main()
