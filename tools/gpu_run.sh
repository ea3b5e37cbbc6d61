#!/usr/bin/env bash
# The prepared device run: one call of the device tool, nothing to install. Its parts' time limits sum
# to at most 300 s (15 + 90 + 100 + 50 + 45 s, 5 min); run it with timeout_s=330 so that a second call
# (a fix, then a rerun) fits in a task's 15 min of device time with a machine start (1-2 min) beside:
#   run(command="bash tools/gpu_run.sh", timeout_s=330)
# 0. nvidia-smi and torch's version (into $OUT/gpu_graphs.log).
# 1. tools/gpu_graphs.py first: decode steps as CUDA graphs (EngineConfig.decode_graphs="cuda", never run
#    on a GPU yet) against eager and the uncaptured static step: equal greedy tokens, tok/s at batch
#    1/16/64/256 (log $OUT/gpu_graphs.log, JSON $OUT/gpu_graphs.json written after each part).
# 2. tools/gpu_check.py: plain greedy on CUDA vs the CPU, EAGLE-3.1 / PR lossless in fp32 and bf16,
#    batch-1 speed interleaved ($OUT/gpu_check.log, JSON $OUT/gpu_check.json after each dtype).
# 3. gambit.bench.cuda_check: logits and greedy output against transformers on CUDA, engine tok/s in bf16.
# 4. tools/gpu_profile.py: where a step's time goes, eager and graphs ($OUT/gpu_profile.txt).
# Each part has its own limit, so one that hangs leaves the others' output; at most 7 files in $OUT
# (a call returns 8). Not here any more (stop 38 measured them; run them as a call of their own):
#   timeout 120 python3 -m gambit.cli bench search --quick --problems 12 --concurrency 6 --capacity 16 \
#       --difficulties hard --no-sensitivity --no-frontier --spec-max-batch 0 --json $OUT/bench_search_gpu.json
#   timeout 80 python3 tools/spec_batch_speed.py 1,8,32 --reps 2
# The target's CPU training history (tools/target_repro_dtype.py) is no longer run here: stop 43 showed
# --isa compatible does not carry across CPU vendors, and this image's torch (2.11+cu130) is not the
# 2.13 the target card was trained with, so a difference could not be pinned on the CPU.
set -u
export PYTHONPATH=services PYTHONUNBUFFERED=1
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
PY=${PY:-python3}
{ timeout 5 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  timeout 10 $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT/gpu_graphs.log"
timeout 90 $PY tools/gpu_graphs.py --json "$OUT/gpu_graphs.json" 2>&1 | tee -a "$OUT/gpu_graphs.log"
graphs=${PIPESTATUS[0]}
timeout 100 $PY tools/gpu_check.py --per 2 --max-tokens 48 --reps 2 --json "$OUT/gpu_check.json" 2>&1 \
    | tee "$OUT/gpu_check.log"
check=${PIPESTATUS[0]}
timeout 50 $PY -m gambit.bench.cuda_check 2>&1 | tee "$OUT/cuda_check.log"
cuda=${PIPESTATUS[0]}
timeout 45 $PY tools/gpu_profile.py --out "$OUT/gpu_profile.txt" > /tmp/gpu_profile.log 2>&1
profile=$?
[ "$profile" = 0 ] || tail -n 40 /tmp/gpu_profile.log | tee "$OUT/gpu_profile_error.log"
grep -A1 "^==" "$OUT/gpu_profile.txt" 2>/dev/null
echo "gpu_graphs exit $graphs, gpu_check exit $check, cuda_check exit $cuda, gpu_profile exit $profile" \
    "(124: its time limit)"
[ "$graphs" = 0 ] && [ "$check" = 0 ] && [ "$cuda" = 0 ]
