#!/usr/bin/env bash
# The prepared device run (one call of the device tool, ~6-8 min on an H200; nothing to install):
#   run(command="bash tools/gpu_run.sh", timeout_s=600)
# 1. tools/gpu_check.py: plain greedy on CUDA vs the CPU, EAGLE-3.1 / PR lossless in fp32 and bf16,
#    batch-1 speed interleaved (JSON: $OUT/gpu_check.json).
# 2. gambit bench search, hard problems, no batch cap (trees at every batch size, as a GPU wants):
#    tournament overhead share, Gambit + PR against Gambit (JSON: $OUT/bench_search_gpu.json).
# Logs of both in $OUT. Each part has its own time limit, so one that hangs leaves the other's output.
set -u
export PYTHONPATH=services PYTHONUNBUFFERED=1
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/gpu.txt"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"
timeout 300 $PY tools/gpu_check.py --reps 2 --json "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.log"
check=${PIPESTATUS[0]}
timeout 240 $PY -m gambit.cli bench search --quick --problems 12 --concurrency 6 --capacity 16 \
    --difficulties hard --no-sensitivity --no-frontier --spec-max-batch 0 \
    --json "$OUT/bench_search_gpu.json" --plots /tmp/gpu_plots 2>&1 | grep -v "^bench search" | tee "$OUT/bench_search_gpu.log"
search=${PIPESTATUS[0]}
echo "gpu_check exit $check, bench search exit $search"
[ "$check" = 0 ] && [ "$search" = 0 ]
