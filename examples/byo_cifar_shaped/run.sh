#!/usr/bin/env bash
# Bring your own model and data, end to end: a residual CNN with GroupNorm (model.py, given to dpaudit
# by factory) on a CIFAR-10-shaped dataset in a directory of .npy files (make_data.py).
#
#   bash examples/byo_cifar_shaped/run.sh            # small: 3,000 records of 3 x 16 x 16, CPU
#   N=50000 SIZE=32 WIDTHS=16,32,64 EPOCHS=10 DEVICE=cuda bash examples/byo_cifar_shaped/run.sh
#
# Run from the repository root (the factory is imported from the current directory, as with
# --trainer). Everything goes to $WORK (default: a fresh temporary directory).
set -euo pipefail

N=${N:-3000}
SIZE=${SIZE:-16}
WIDTHS=${WIDTHS:-8,16}
EPOCHS=${EPOCHS:-2}
BATCH=${BATCH:-128}
DEVICE=${DEVICE:-cpu}
REFS=${REFS:-4}
PYTHON=${PYTHON:-python}
WORK=${WORK:-$(mktemp -d)}
DPAUDIT="$PYTHON -m dpaudit"
export DPAUDIT_CACHE_DIR=${DPAUDIT_CACHE_DIR:-$WORK/cache}

# 1. The data: X.npy (float32, N x 3 x SIZE x SIZE) and y.npy, memory-mapped by dpaudit.
$PYTHON -m examples.byo_cifar_shaped.make_data --n "$N" --size "$SIZE" --out "$WORK/data"

# 2. The model, by factory: spec.json of kind "python" (docs/model-spec.md).
KWARGS="{\"widths\": [$WIDTHS], \"n_classes\": 10}"
cat > "$WORK/spec.json" <<JSON
{"kind": "python", "factory": "examples.byo_cifar_shaped.model:resnet", "kwargs": $KWARGS,
 "input_shape": [3, $SIZE, $SIZE], "n_classes": 10}
JSON

# 3. DP-SGD with dpaudit on that module (per-example clipping picked by --clipping auto).
$DPAUDIT train --data "$WORK/data" --model-spec "$WORK/spec.json" --algo dpsgd --epsilon 4 \
    --epochs "$EPOCHS" --batch-size "$BATCH" --lr 2 --clip 1 --clipping auto --device "$DEVICE" \
    --out "$WORK/dp" --force

# 4. Attack it (loss, and LiRA with reference models trained through the same factory), audit, report.
$DPAUDIT attack mia "$WORK/dp" --attacks loss,lira --reference-models "$REFS" --min-models $((REFS / 2))
$DPAUDIT audit checkpoint "$WORK/dp" --attacks loss,lira --reference-models "$REFS"
$DPAUDIT report "$WORK/dp" --out "$WORK/report_dp" --attacks loss,lira --reference-models "$REFS" --force

# 5. The same module trained by the user's own plain torch loop (no DP), brought in with its members.
$PYTHON -m examples.byo_cifar_shaped.train_plain --data "$WORK/data" --out "$WORK/plain" --kwargs "$KWARGS" \
    --epochs $((EPOCHS + 3)) --device "$DEVICE"
echo "{\"algo\": \"sgd\", \"epochs\": $((EPOCHS + 3)), \"lr\": 0.1, \"batch_size\": 64, \"momentum\": 0.9}" \
    > "$WORK/recipe.json"
$DPAUDIT import "$WORK/plain/weights.safetensors" --model-spec "$WORK/spec.json" --data "$WORK/data" \
    --members "$WORK/plain/members.txt" --recipe "$WORK/recipe.json" --out "$WORK/plain_run" --force
$DPAUDIT attack mia "$WORK/plain_run" --attacks loss,lira --reference-models "$REFS" --min-models $((REFS / 2))
$DPAUDIT report "$WORK/plain_run" --out "$WORK/report_plain" --attacks loss,lira --reference-models "$REFS" --force

echo "done: runs, reports and the reference-model cache are in $WORK"
