#!/usr/bin/env bash
# GPU check: the CUDA tests of the training layer and the DP-SGD throughput benchmark on CUDA.
#
#   bash benchmarks/gpu_check.sh          # from the repository root, on a machine with a GPU
#
# Needs python3 with torch (CUDA build), numpy, scipy, typer, rich, pytest, hypothesis.
# Opacus (the benchmark's peer) is optional: if wheels are in .whl/ they are installed into
# /tmp/site first (no network needed). Everything is also written to $OUT/gpu_log.txt
# ($OUT defaults to /tmp/gpu_check). Each step has its own time limit and a failing step does
# not stop the later ones; the summary at the end lists every step's exit status.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
LOG="$OUT/gpu_log.txt"
: >"$LOG"

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

step env 30 bash -c 'nvidia-smi -L; date -u; python3 -c "
import sys, torch
print(\"python\", sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda,
      \"available\", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else \"-\")
try:
    import opacus; print(\"opacus\", opacus.__version__)
except ImportError as e:
    print(\"opacus missing:\", e)
"'

step tests 180 python3 -m pytest -q -p no:cacheprovider -rsf tests/training/test_clipping.py tests/training/test_dpsgd.py -m "not slow"
# The CUDA-only tests, by name, verbosely: they must say PASSED, not SKIPPED.
step tests-cuda 60 python3 -m pytest -v -p no:cacheprovider tests/training/test_clipping.py -k test_cuda_matches_cpu

step bench-256 150 python3 benchmarks/dpsgd_throughput.py --device cuda --threads 8 --batch 256 --rounds 5
step bench-1024 100 python3 benchmarks/dpsgd_throughput.py --device cuda --threads 8 --batch 1024 --rounds 5 --models mlp,cnn

# One small end-to-end training on the GPU, DP-SGD against non-private SGD (wall time includes start-up).
rm -rf /tmp/gpu_check_dp /tmp/gpu_check_sgd
step train-dpsgd 75 bash -c 'time python3 -m dpaudit train --algo dpsgd --epsilon 8 --data digits --model cnn --epochs 5 --device cuda --out /tmp/gpu_check_dp'
step train-sgd 60 bash -c 'time python3 -m dpaudit train --algo sgd --data digits --model cnn --epochs 5 --device cuda --out /tmp/gpu_check_sgd'

# For scale only: the same benchmark on this machine's CPU (8 threads), short.
step bench-cpu 60 python3 benchmarks/dpsgd_throughput.py --device cpu --threads 8 --batch 256 --rounds 3 --target-seconds 0.1 --models mlp,cnn

echo | tee -a "$LOG"
echo "=== summary" | tee -a "$LOG"
printf '%s\n' "${STATUS[@]}" | tee -a "$LOG"
