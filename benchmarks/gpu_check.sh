#!/usr/bin/env bash
# GPU check (issue 26): the CUDA tests of per-example clipping and the DP-SGD throughput / peak-memory
# benchmark on the workloads, as ONE short script (about 4 minutes on an H100/H200; each step
# has its own limit: 600 s at most in all, pip aside).
#
#   bash benchmarks/gpu_check.sh          # from the repository root, on a machine with a GPU
#   JAX=1 bash benchmarks/gpu_check.sh    # also the JAX backend's rows
#
# Needs python3 with a CUDA build of torch (never installed here: the script stops if torch is
# missing). Missing light dependencies (numpy, scipy, typer, ...) are installed with
# `pip install -e .`; Opacus (the benchmark's peer) is optional: wheels in .whl/ are installed into
# /tmp/site first (no network needed). JAX rows run only with JAX=1 and a JAX that sees the GPU. Everything is also
# written to $OUT/gpu_log.txt ($OUT defaults to /tmp/gpu_check). Each step has its own time limit
# and a failing step does not stop the later ones; the summary lists every step's exit status.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
LOG="$OUT/gpu_log.txt"
: >"$LOG"

if ! python3 -c "import torch" 2>/dev/null; then
    echo "torch is not installed: install a CUDA build of torch first (this script installs nothing that heavy)" | tee -a "$LOG"
    exit 2
fi
if ! python3 -c "import numpy, scipy, typer, rich, safetensors, pytest" 2>/dev/null; then
    python3 -m pip install -q -e . pytest 2>&1 | tail -3 | tee -a "$LOG"  # fails without network: then say so
fi
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        2>&1 | tee -a "$LOG"
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

STATUS=()
step() { # step NAME SECONDS CMD...: run CMD under a time limit, log it, remember its exit status
    local name=$1 limit=$2
    shift 2
    echo | tee -a "$LOG"
    echo "=== $name: $* (limit ${limit}s)" | tee -a "$LOG"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
    STATUS+=("$name: exit $rc, $((SECONDS - t0)) s")
}

step env 20 bash -c 'nvidia-smi -L; date -u; python3 -c "
import sys, torch
print(\"python\", sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda,
      \"available\", torch.cuda.is_available(), \"device:\", torch.cuda.get_device_name() if torch.cuda.is_available() else \"-\",
      \"bf16:\", torch.cuda.is_bf16_supported() if torch.cuda.is_available() else \"-\")
for mod in (\"opacus\", \"jax\"):
    try:
        m = __import__(mod); print(mod, m.__version__)
    except ImportError as e:
        print(mod, \"missing:\", e)
"'

# The CUDA tests by name, verbosely: they must say PASSED, not SKIPPED. test_gpu_path.py: training
# steps after the first never synchronise with the host (torch.cuda.set_sync_debug_mode("error")),
# and a CUDA run (float64, sigma 0) gives the CPU run's weights: same Poisson batches and chunks.
step tests-cuda 90 python3 -m pytest -v -p no:cacheprovider -W ignore::UserWarning \
    tests/training/test_clipping.py tests/training/test_clipping_precision.py tests/training/test_gpu_path.py \
    tests/training/test_clipping_conv.py tests/training/test_cuda_graph_step.py -k cuda

# Throughput and peak memory at batch 256: the workloads at full size (CIFAR-sized GroupNorm
# CNN 64-256 channels on 3x32x32; 2-layer transformers with the arange positional embedding, T = 64,
# attention from Linear + SDPA and from nn.MultiheadAttention; a tied-weight model), the MNIST-sized
# MLP/CNN, with our ghost (mixed per layer) against non-private SGD and Opacus' hooks; "ours poisson" is
# the DP trainer's whole step (Poisson batch drawn on the host, sent to the GPU, gathered there; on CUDA
# its chunks are padded to a few sizes, dpaudit.training.dpsgd.padded_size), "ours poisson nopad" the
# same without padding (one physical shape per batch size: new cuDNN plans). Both are warmed up over
# 30 steps; "host ms" is the CPU time of the launching thread per step (host-bound when ~ ms/step).
# --markdown prints the same table as Markdown rows for benchmarks/RESULTS.md.
step bench-256 240 python3 benchmarks/dpsgd_throughput.py --device cuda --threads 8 --batch 256 --rounds 3 \
    --target-seconds 0.2 --memory --plan --markdown \
    --models mlp-large,cnn-large,cifar-gn,transformer,transformer-mha,tied \
    --methods "non-private,ours ghost,ours poisson,ours poisson nopad,opacus hooks"

# Host-bound or device-bound? (benchmarks/step_profile.py) The H200's "host ms" at 80-85% of the DP
# step's wall time has two readings: the GPU idles while the host launches (fewer launches would
# help), or the launches block on a full queue and the spin counts as CPU time (cheaper kernels would
# help). The profiler's kernel time per step ("busy" = kernel ms / wall ms) and the longest single
# launch call tell them apart; then the top host costs of the ghost step.
step profile 45 python3 benchmarks/step_profile.py --device cuda --threads 8 --batch 256 --size full --steps 20 \
    --models cifar-gn,transformer,tied --methods "non-private,ours ghost" --top 15

# CUDA graphs (issue 26, host-bound step; benchmarks/cuda_graph_step.py, NOT run on a GPU before this
# script): "ours ghost graphed" = ours ghost on a fixed device-side batch, captured once and replayed per
# step, beside non-private and ours ghost. Its peak-MiB cell is the graph's private pool (reserved at
# capture), not a per-step peak. Own step and limit, so a capture failure costs nothing else.
step bench-graphed 50 python3 benchmarks/dpsgd_throughput.py --device cuda --threads 8 --batch 256 --rounds 3 \
    --target-seconds 0.1 --memory --markdown --models mlp-large,cnn-large,cifar-gn,transformer,tied \
    --methods "non-private,ours ghost,ours ghost graphed"

# The two routes by which instantiated Conv2d layers get their per-example gradients (issue 26, memory;
# benchmarks/RESULTS.md "Per-example conv gradients without patches"): unfolded patches (the CUDA
# default) against one grouped convolution over the examples (no patches; the CPU default), forced per
# row, on the conv workloads, then the 64-channel 3x3 layer of cifar-gn alone (time and peak memory of
# its norms + clipped sum against its batch weight gradient). Decides the CUDA default
# (_Conv2dHandler.DEFAULT_ROUTE). Separate steps with their own limits, so that a slow route cannot
# cost the table above.
step bench-conv-routes 60 python3 benchmarks/dpsgd_throughput.py --device cuda --threads 8 --batch 256 --rounds 3 \
    --target-seconds 0.2 --memory --plan --markdown --models cnn-large,cifar-gn \
    --methods "non-private,ours ghost patches,ours ghost grouped"
step conv-routes-layer 40 python3 benchmarks/conv_routes.py --device cuda --threads 8 --batches 64,256 --rounds 5

# Host cost of one step at batch 256 (issue 26, fourth pass): CPU time of the launching thread and
# torch ops dispatched per step, ours ghost and the trainer's Poisson step against non-private SGD.
step host-256 45 python3 benchmarks/host_overhead.py --device cuda --batch 256 --size full --rounds 3 \
    --target-seconds 0.1 --models cifar-gn,transformer,tied

# JAX rows: only with JAX=1, to keep the check short. The noise tests first: on a GPU the noise takes
# JAX's own Threefry kernel (the written-out rounds are the CPU's), checked bit for bit there.
if [ "${JAX:-0}" = 1 ] && python3 -c "import jax, sys; sys.exit(0 if jax.default_backend() == 'gpu' else 1)" 2>/dev/null; then
    step tests-jax 90 python3 -m pytest -q -p no:cacheprovider tests/training/test_jax_noise.py
    step bench-jax 120 python3 benchmarks/dpsgd_throughput.py --device cuda --threads 8 --batch 256 --rounds 3 \
        --target-seconds 0.2 --jax --models mlp-large,cnn-large --methods "non-private,jax non-private,jax dpsgd"
else
    echo "JAX rows skipped (JAX=1 and a JAX that sees the GPU run them)" | tee -a "$LOG"
fi

echo | tee -a "$LOG"
echo "=== summary" | tee -a "$LOG"
printf '%s\n' "${STATUS[@]}" | tee -a "$LOG"
